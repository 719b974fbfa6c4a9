//! `flashraid create`, `inspect` and `assemble`: making arrays and looking at members.

use anyhow::{Context, Result, bail};
use clap::Args;
use flashraid_control::{Init, Overwrite};
use flashraid_format::assembly::{AssemblyRequest, DirtyDegraded, StaleMembers, StrictDevices};
use flashraid_format::layout::member_data_capacity;
use flashraid_format::superblock::{MemberState, Superblock};
use flashraid_layout::{Geometry, Level};
use flashraid_runtime::{CreateSpec, MemberDevice, create, inspect};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 10, 5, 6 or 7.3.
    #[arg(long, short = 'l')]
    level: Level,
    /// Array name: 1 to 64 bytes of UTF-8, no '/' or NUL, not '.' or '..', not starting with
    /// '-' (it names the control socket NAME.control and the NBD export).
    #[arg(long, short = 'n', default_value = "flashraid")]
    name: String,
    /// Chunk size in KiB: a power of two from 4 to 1024.
    #[arg(long, default_value_t = 16)]
    chunk_kib: u64,
    /// Hot spare (repeatable).
    #[arg(long = "spare", value_name = "PATH")]
    spares: Vec<PathBuf>,
    /// Create member files that do not exist, of this size (e.g. 1G, 512M).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Overwrite devices that hold a filesystem, a partition table or another array.
    #[arg(long)]
    force: bool,
    /// How parity becomes consistent: zero (now), background, or assume-clean. Default: zero
    /// when every member discards to zeroes, background otherwise.
    #[arg(long)]
    init: Option<String>,
    #[command(flatten)]
    tunables: TunableArgs,
    /// Members, in role order.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

/// The tunables stored with an array: set at `create`, given to `serve` (which stores them),
/// or changed live with `flashraid tune`. Each is optional: unset keeps what the array
/// stores, else the default.
#[derive(Args, Debug, Clone, Default)]
pub struct TunableArgs {
    /// Rebuild rate limit, bytes written to the replacement per second for the whole array
    /// (e.g. 500M; 0: none, the default). Stored and kept to in whole MiB/s, rounded up.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub rebuild_rate: Option<u64>,
    /// Rebuild rate limit while clients use the array (a request in the last 2 ms), like
    /// md's speed_limit_min (default 200M; 0: no separate limit): the rebuild runs at
    /// --rebuild-rate when idle and steps down to this under load. Whole MiB/s, rounded up.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub rebuild_busy_rate: Option<u64>,
    /// Background initialisation and resync (after an unclean shutdown) rate limit, bytes of
    /// each member swept per second (e.g. 100M; 0: none, the default). Lower keeps client
    /// latency down; the array is exposed to a member failure longer. Whole MiB/s, rounded
    /// up.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub resync_rate: Option<u64>,
    /// Scrub rate limit, bytes read per second (e.g. 500M; 0: none, the default). Whole
    /// MiB/s, rounded up.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub scrub_rate: Option<u64>,
    /// A check scrub every this many hours while served, counted from the start (0: only
    /// when asked with `flashraid scrub`, the default).
    #[arg(long, value_name = "HOURS")]
    pub scrub_every_hours: Option<u32>,
    /// How long a partial-stripe write on a parity level waits for neighbouring writes that
    /// would fill its stripe (then written as one full stripe, with no reads), in
    /// microseconds (0: never, the default). Helps sequential writers whose requests do not
    /// line up with stripes; adds up to this much latency to small random writes. At most
    /// 100000 (0.1 s).
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub merge_window_us: Option<u32>,
    /// Reactor threads: the cores the array's IO runs on (default: one per CPU, at most 64).
    /// Applies at the next start.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub shards: Option<u32>,
    /// Member IOs in flight per reactor, its io_uring's size (default 1024; a power of two
    /// from 16 to 4096). Applies at the next start.
    #[arg(long, value_parser = parse_queue_depth)]
    pub queue_depth: Option<u32>,
    /// A member with IO outstanding and none of it completing for this long is failed as
    /// stalled and its stripes served from redundancy (where the array survives without
    /// it; else the stall is waited out and said in an event), in milliseconds (default
    /// 60000, twice the kernel's NVMe and SCSI command timeout; 0: never; else 1000 to
    /// 3600000). Lower it to drop a member that has become far slower than its peers
    /// sooner; IO it already holds still waits for it.
    #[arg(long, value_name = "MS", value_parser = parse_member_timeout_ms)]
    pub member_timeout_ms: Option<u32>,
}

impl TunableArgs {
    pub fn to_tunables(&self) -> flashraid_format::superblock::Tunables {
        flashraid_format::superblock::Tunables {
            rebuild_rate_mib_per_s: self.rebuild_rate.map(mib_per_s),
            scrub_rate_mib_per_s: self.scrub_rate.map(mib_per_s),
            merge_window_us: self.merge_window_us,
            scrub_interval_hours: self.scrub_every_hours,
            rebuild_busy_rate_mib_per_s: self.rebuild_busy_rate.map(mib_per_s),
            resync_rate_mib_per_s: self.resync_rate.map(mib_per_s),
            shards: self.shards,
            queue_depth: self.queue_depth,
            member_timeout_ms: self.member_timeout_ms,
        }
    }
}

/// The stored tunables as `inspect --json` and `status --json` show them (null: not set).
pub fn tunables_json(t: &flashraid_format::superblock::Tunables) -> serde_json::Value {
    serde_json::json!({
        "rebuild_rate_mib_per_s": t.rebuild_rate_mib_per_s,
        "rebuild_busy_rate_mib_per_s": t.rebuild_busy_rate_mib_per_s,
        "resync_rate_mib_per_s": t.resync_rate_mib_per_s,
        "scrub_rate_mib_per_s": t.scrub_rate_mib_per_s,
        "scrub_interval_hours": t.scrub_interval_hours,
        "merge_window_us": t.merge_window_us,
        "shards": t.shards,
        "queue_depth": t.queue_depth,
        "member_timeout_ms": t.member_timeout_ms,
    })
}

/// `--member-timeout-ms`: 0 (never), or 1000 to 3600000.
fn parse_member_timeout_ms(text: &str) -> Result<u32, String> {
    let ms: u32 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of ms"))?;
    if ms == 0 || (1000..=3_600_000).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("{ms} ms: give 0 (never) or 1000 to 3600000 (1 s to an hour)"))
    }
}

/// Parse sizes like 4096, 64K, 512M, 2G, 1T (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) =
        text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let value: u64 =
        digits.parse().map_err(|_| format!("{text:?} is not a size like 512M or 2G"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => return Err(format!("unknown size unit {other:?} (use K, M, G or T)")),
    };
    value
        .checked_shl(shift)
        .filter(|v| v >> shift == value)
        .ok_or_else(|| format!("{text} is too large"))
}

/// Bytes per second to the MiB/s the superblock stores (rounded up, so a limit never becomes
/// "no limit"); the server puts a rate set live in force the same way.
pub fn mib_per_s(bytes: u64) -> u32 {
    flashraid_runtime::rate_mib_per_s(bytes)
}

/// A rate limit given in bytes per second, as the array stores it and keeps to: "no limit"
/// (0), else whole MiB/s (found by a misuse test: `--resync-rate 1` said "1 B/s" while
/// 1 MiB/s was stored). `none` says what 0 means for this rate.
pub fn stored_rate_text(bytes_per_s: u64, none: &str) -> String {
    match mib_per_s(bytes_per_s) {
        0 => none.to_string(),
        mib => format!("{mib} MiB/s"),
    }
}

pub fn run_create(args: CreateArgs) -> Result<()> {
    let init = match args.init.as_deref() {
        None => None,
        Some("zero") => Some(Init::Zero),
        Some("background") => Some(Init::Background),
        Some("assume-clean") => Some(Init::AssumeClean),
        Some(other) => bail!("unknown --init {other:?}: use zero, background or assume-clean"),
    };
    let spec = CreateSpec {
        name: args.name.clone(),
        level: args.level,
        chunk_bytes: args.chunk_kib << 10,
        members: args.members.clone(),
        spares: args.spares.clone(),
        create_files_bytes: args.size,
        overwrite: if args.force { Overwrite::Force } else { Overwrite::Refuse },
        init,
        bitmap_region_bytes: None,
        // Bitmap shard sections to write now; every start writes as many as it runs.
        shards: args.tunables.shards.unwrap_or(2),
        tunables: args.tunables.to_tunables(),
    };
    let made = create(&spec).context("create failed; nothing was written to the devices named")?;
    let g = made.geometry;
    println!(
        "created {} array {:?} ({}): {} members, {} KiB chunks, {} usable",
        g.level(),
        args.name,
        made.uuid,
        g.member_count(),
        g.chunk_bytes() >> 10,
        human(g.array_bytes())
    );
    for path in &made.created_files {
        println!("  created member file {}", path.display());
    }
    if let Some(notice) = shrink_notice(&args.members, &made.member_sizes_bytes, g) {
        eprint!("{notice}");
    }
    println!("  {}", init_line(made.init, g.level()));
    Ok(())
}

/// What `create` did to make the members consistent, in the level's words (a misuse test
/// found "parity" said of RAID 1 arrays).
pub(crate) fn init_line(init: Init, level: Level) -> String {
    let redundancy = match level {
        Level::Raid0 => None,
        Level::Raid1 | Level::Raid10 => Some("mirror copies"),
        _ => Some("parity"),
    };
    match (init, redundancy) {
        (Init::Zero, Some(r)) => format!("members zeroed: {r} consistent, the array is clean"),
        (Init::Zero, None) => "members zeroed: the array is clean".into(),
        (Init::Background, Some(r)) => {
            let is = if r == "parity" { "is" } else { "are" };
            format!("{r} {is} made consistent in the background when the array starts")
        }
        (Init::Background, None) => "nothing to make consistent (no redundancy)".into(),
        (Init::AssumeClean, _) => "members assumed consistent (--init assume-clean)".into(),
    }
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[arg(required = true)]
    devices: Vec<PathBuf>,
}

pub fn run_inspect(args: InspectArgs) -> Result<()> {
    let mut reports = vec![];
    // Devices with no valid superblock copy: the command fails once all are shown, as
    // `mdadm --examine` does, so scripts can tell (found by review: it exited 0).
    let mut without = vec![];
    for path in &args.devices {
        let (name, copies) =
            inspect(path).with_context(|| format!("cannot inspect {}", path.display()))?;
        if copies.iter().all(|c| c.is_err()) {
            without.push(path.display().to_string());
        }
        if args.json {
            reports.push(inspect_json(&name, &copies));
        } else {
            println!("{name}:");
            for (i, copy) in copies.iter().enumerate() {
                match copy {
                    Ok(sb) => print_superblock(i, sb),
                    Err(e) => println!("  copy {i}: not valid: {e}"),
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    if !without.is_empty() {
        bail!("no valid flashraid superblock on {}", without.join(", "));
    }
    Ok(())
}

fn state_name(state: MemberState) -> &'static str {
    match state {
        MemberState::Empty => "empty",
        MemberState::Active => "active",
        MemberState::Failed => "failed",
        MemberState::Spare => "spare",
        MemberState::Rebuilding => "rebuilding",
    }
}

fn print_superblock(copy: usize, sb: &Superblock) {
    let g = sb.geometry();
    println!(
        "  copy {copy}: array {:?} {} ({}), event {}, {:?}",
        sb.array_name,
        sb.array_uuid,
        g.level(),
        sb.event,
        sb.state
    );
    println!(
        "    {} members, chunk {} KiB, data at {} KiB, {} per member, array {}",
        g.member_count(),
        g.chunk_bytes() >> 10,
        sb.data_offset_bytes >> 10,
        human(sb.member_data_bytes),
        human(g.array_bytes())
    );
    println!(
        "    this device: slot {} ({}), member {}",
        sb.this_role,
        if sb.is_spare() { "spare" } else { "role" },
        sb.this_uuid
    );
    println!(
        "    bitmap: {} regions of {}, {} shard sections",
        sb.member_data_bytes.div_ceil(sb.bitmap_region_bytes),
        human(sb.bitmap_region_bytes),
        sb.bitmap_shards
    );
    match sb.missed_map_since_event {
        0 => println!("    missed-write map: not kept (a returning member is rebuilt in full)"),
        e => println!("    missed-write map: kept since event {e}"),
    }
    if sb.rebuild_role != flashraid_format::superblock::ROLE_NONE {
        let partial = if sb.members[usize::from(sb.rebuild_role)].partial_rebuild {
            " (partial: a re-added member, only the regions it missed)"
        } else {
            ""
        };
        println!(
            "    rebuilding slot {}{partial}: stripes below {} are rebuilt",
            sb.rebuild_role, sb.rebuild_cursor_stripes
        );
    }
    let t = sb.tunables;
    let show = |v: Option<u32>, unit: &str| v.map_or("-".to_string(), |v| format!("{v}{unit}"));
    println!(
        "    tunables: rebuild rate {} (busy {}), resync rate {}, scrub rate {}, merge window {}, \
         scrub every {}, shards {}, queue depth {}, member timeout {}",
        show(t.rebuild_rate_mib_per_s, " MiB/s"),
        show(t.rebuild_busy_rate_mib_per_s, " MiB/s"),
        show(t.resync_rate_mib_per_s, " MiB/s"),
        show(t.scrub_rate_mib_per_s, " MiB/s"),
        show(t.merge_window_us, " us"),
        show(t.scrub_interval_hours, " h"),
        show(t.shards, ""),
        show(t.queue_depth, ""),
        show(t.member_timeout_ms, " ms"),
    );
    for (i, m) in sb.members.iter().chain(&sb.spares).enumerate() {
        let failed = if m.state == MemberState::Failed {
            let sync = if m.in_sync_when_failed { " (in sync: can be re-added)" } else { "" };
            format!(" at event {}{sync}", m.failed_at_event)
        } else if let Some(role) = m.replacing {
            format!(" (replacing member {role}: its copy starts over at the next start)")
        } else {
            String::new()
        };
        println!(
            "    slot {i:>2}: {} {}{failed}, {} errors corrected",
            m.uuid,
            state_name(m.state),
            m.errors_corrected
        );
    }
}

fn inspect_json(name: &str, copies: &[Result<Superblock, String>; 2]) -> serde_json::Value {
    let copy = |c: &Result<Superblock, String>| match c {
        Ok(sb) => serde_json::json!({
            "valid": true,
            "array_name": sb.array_name,
            "array_uuid": sb.array_uuid.to_string(),
            "level": sb.level.name(),
            "event": sb.event,
            "state": format!("{:?}", sb.state).to_lowercase(),
            "member_count": sb.member_count,
            "chunk_bytes": sb.chunk_bytes,
            "member_data_bytes": sb.member_data_bytes,
            "array_bytes": sb.geometry().array_bytes(),
            "this_slot": sb.this_role,
            "this_uuid": sb.this_uuid.to_string(),
            "rebuild_slot": (sb.rebuild_role != flashraid_format::superblock::ROLE_NONE)
                .then_some(sb.rebuild_role),
            "rebuild_cursor_stripes": (sb.rebuild_role != flashraid_format::superblock::ROLE_NONE)
                .then_some(sb.rebuild_cursor_stripes),
            "missed_map_since_event": (sb.missed_map_since_event != 0)
                .then_some(sb.missed_map_since_event),
            "tunables": tunables_json(&sb.tunables),
            "slots": sb.members.iter().chain(&sb.spares).map(|m| serde_json::json!({
                "uuid": m.uuid.to_string(),
                "state": state_name(m.state),
                "failed_at_event": m.failed_at_event,
                "in_sync_when_failed": m.in_sync_when_failed,
                "partial_rebuild": m.partial_rebuild,
                "replacing_role": m.replacing,
                "errors_corrected": m.errors_corrected,
            })).collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({ "valid": false, "error": e }),
    };
    serde_json::json!({ "device": name, "copies": [copy(&copies[0]), copy(&copies[1])] })
}

#[derive(Args, Debug)]
pub struct AssembleArgs {
    /// Only the array with this name.
    #[arg(long)]
    name: Option<String>,
    /// Accept a dirty, degraded array (see the refusal message for what that risks).
    #[arg(long)]
    force: bool,
    #[arg(required = true)]
    devices: Vec<PathBuf>,
}

/// Show how the devices would assemble, without writing anything. (Starting and serving the
/// array is `flashraid serve`, issue 4.)
pub fn run_assemble(args: AssembleArgs) -> Result<()> {
    let mut devices = vec![];
    for path in &args.devices {
        let device = flashraid_uring::Device::open(path, flashraid_uring::Access::ReadOnly)
            .with_context(|| format!("cannot open {}", path.display()))?;
        devices.push(MemberDevice::Device(device));
    }
    let refs: Vec<&dyn flashraid_control::MetaDevice> =
        devices.iter().map(|d| d as &dyn flashraid_control::MetaDevice).collect();
    let request = AssemblyRequest {
        array_uuid: None,
        array_name: args.name,
        strict: StrictDevices::Strict,
        dirty_degraded: if args.force { DirtyDegraded::Force } else { DirtyDegraded::Refuse },
        stale: if args.force { StaleMembers::UseIfNeeded } else { StaleMembers::LeaveOut },
    };
    let prepared = flashraid_control::prepare(&refs, &request)
        .context("these devices do not form an array that can start")?;
    let a = &prepared.assembled;
    let sb = &a.superblock;
    println!("array {:?} {} ({}), event {}", sb.array_name, sb.array_uuid, sb.level, sb.event);
    for (role, device) in a.roles.iter().enumerate() {
        let holder = match device {
            Some(d) => args.devices[*d].display().to_string(),
            None if a.failed_roles.contains(&role) => "failed".to_string(),
            None => "missing".to_string(),
        };
        println!("  role {role:>2}: {holder}");
    }
    for &spare in &a.spares {
        println!("  spare  : {}", args.devices[spare].display());
    }
    for (device, why) in &a.left_out {
        println!("  left out: {device}: {why}");
    }
    for device in &a.behind {
        println!("  {device}: superblock behind the newest event (rewritten at start)");
    }
    for device in &a.failed_used {
        println!(
            "  {device}: failed past what the level survives, brought back because of --force \
             (its chunks are as of its failure; the regions being written then and those the \
             missed-write map names are resynced)"
        );
    }
    for device in &a.stale_used {
        println!(
            "  {device}: a stale copy, used because of --force (its chunks are old; every \
             region is resynced at start)"
        );
    }
    // Not marked clean with no region dirty: a stop while failed (or a cut with no write
    // in flight) leaves nothing to resync (found by review: "0 bitmap regions to resync").
    let resync = a.dirty && !prepared.dirty_regions.is_empty();
    if resync {
        println!(
            "  not shut down cleanly: {} bitmap regions to resync at start",
            prepared.dirty_regions.len()
        );
    } else if a.dirty {
        println!(
            "  not marked clean when it stopped, but no bitmap region is dirty: nothing to resync"
        );
    }
    println!(
        "  {} and can start{}",
        if a.is_degraded() { "degraded" } else { "complete" },
        if resync { " (after resync of the dirty regions)" } else { "" }
    );
    Ok(())
}

/// What larger members lose to the smallest, said when the sizes differ by more than a
/// chunk (an operator who mixed a 1 TB and a 2 TB device by mistake learns it at create,
/// as md's "largest drive exceeds size" warning does; a difference within a chunk is only
/// rounding). Each member's data area beyond what the array uses is named in bytes.
fn shrink_notice(members: &[PathBuf], sizes_bytes: &[u64], g: Geometry) -> Option<String> {
    assert_eq!(members.len(), sizes_bytes.len(), "one size per member");
    let smallest = (0..sizes_bytes.len()).min_by_key(|&i| sizes_bytes[i])?;
    let size_bytes_min = sizes_bytes[smallest];
    let size_bytes_max = sizes_bytes.iter().copied().max()?;
    if size_bytes_max - size_bytes_min <= u64::from(g.chunk_bytes()) {
        return None;
    }
    let mut notice = format!(
        "notice: members differ in size; each gives the array only {} of data area, what \
         the smallest, {} ({}), holds. Unused of each larger member:\n",
        human(g.member_data_bytes()),
        members[smallest].display(),
        human(size_bytes_min)
    );
    for (path, &size_bytes) in members.iter().zip(sizes_bytes) {
        if size_bytes == size_bytes_min {
            continue;
        }
        let capacity_bytes = member_data_capacity(size_bytes).expect("a member of the array");
        let unused_bytes = capacity_bytes - g.member_data_bytes();
        notice += &format!(
            "  {}: {unused_bytes} bytes ({}) of {}\n",
            path.display(),
            human(unused_bytes),
            human(size_bytes)
        );
    }
    Some(notice)
}

pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// `--queue-depth`: a power of two the ring takes.
fn parse_queue_depth(text: &str) -> Result<u32, String> {
    let depth: u32 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if !flashraid_runtime::queue_depth_valid(depth) {
        return Err(format!(
            "{depth}: a queue depth is a power of two from {} to {}",
            flashraid_runtime::QUEUE_DEPTH_MIN,
            flashraid_runtime::QUEUE_DEPTH_MAX
        ));
    }
    Ok(depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by review: `inspect` of a device with no superblock exited 0, so a script could
    /// not tell; it now fails, after showing every device, in text and JSON alike.
    #[test]
    fn inspect_fails_for_a_device_without_a_superblock() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk");
        std::fs::write(&junk, vec![0x5au8; 1 << 20]).unwrap();
        for json in [false, true] {
            let e = run_inspect(InspectArgs { json, devices: vec![junk.clone()] }).unwrap_err();
            assert!(e.to_string().contains("no valid flashraid superblock"), "{e}");
        }
    }

    /// Found by a misuse test: 32768 (the old documented maximum) and 1000 were accepted and
    /// stored, and every later start failed.
    #[test]
    fn a_queue_depth_must_be_one_the_ring_takes() {
        assert_eq!(parse_queue_depth("1024"), Ok(1024));
        assert_eq!(parse_queue_depth("4096"), Ok(4096));
        for bad in ["8", "1000", "8192", "32768", "lots"] {
            assert!(parse_queue_depth(bad).is_err(), "{bad}");
        }
        assert!(parse_queue_depth("1000").unwrap_err().contains("power of two from 16 to 4096"));
    }

    /// Found by a misuse test: `create` shrank every member to the smallest in silence.
    #[test]
    fn create_names_the_smallest_member_and_what_each_larger_one_leaves_unused() {
        let chunk_bytes: u32 = 64 << 10;
        let mib: u64 = 1 << 20;
        let geometry = |size_bytes_min: u64| {
            let member_data_bytes = member_data_capacity(size_bytes_min).unwrap();
            Geometry::new(Level::Raid5, 3, chunk_bytes.into(), member_data_bytes).unwrap()
        };
        let members: Vec<PathBuf> = ["m0", "m1", "m2"].iter().map(PathBuf::from).collect();
        let sizes = [64 * mib, 48 * mib, 64 * mib + 4096];
        let g = geometry(48 * mib);
        let notice = shrink_notice(&members, &sizes, g).expect("a notice");
        assert!(notice.contains("the smallest, m1 (48.0 MiB)"), "{notice}");
        let unused = |size_bytes| member_data_capacity(size_bytes).unwrap() - g.member_data_bytes();
        assert!(notice.contains(&format!("m0: {} bytes", unused(64 * mib))), "{notice}");
        assert!(notice.contains(&format!("m2: {} bytes", unused(64 * mib + 4096))), "{notice}");
        assert!(!notice.contains("m1:"), "{notice}");
        // Within a chunk of each other: rounding, not worth a word.
        let sizes = [48 * mib + u64::from(chunk_bytes), 48 * mib, 48 * mib];
        assert_eq!(shrink_notice(&members, &sizes, g), None);
    }

    /// Found by a misuse test: `--resync-rate 1` said "1 B/s" while 1 MiB/s was stored.
    #[test]
    fn a_rate_is_said_as_stored_in_whole_mib_per_s() {
        assert_eq!(stored_rate_text(1, "no limit"), "1 MiB/s");
        assert_eq!(stored_rate_text(1 << 20, "no limit"), "1 MiB/s");
        assert_eq!(stored_rate_text((1 << 20) + 1, "no limit"), "2 MiB/s");
        assert_eq!(stored_rate_text(500 << 20, "no limit"), "500 MiB/s");
        assert_eq!(stored_rate_text(1 << 30, "no limit"), "1024 MiB/s");
        assert_eq!(stored_rate_text(0, "no separate limit"), "no separate limit");
        // What is said is what the array stores and keeps to.
        for bytes in [1, 4095, 1 << 20, (7 << 20) + 3] {
            let stored = flashraid_runtime::stored_rate_bytes_per_s(bytes);
            assert_eq!(stored_rate_text(bytes, ""), format!("{} MiB/s", stored >> 20));
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
