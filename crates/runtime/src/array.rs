//! The embedded API: create an array, open (assemble and start) it, talk to it through
//! sessions, query its status, fail a member, shut it down cleanly.
//!
//! Threads: one reactor per shard (the data path) and one controller (metadata: member
//! failures, status, shutdown). The controller holds the only lock-free-path exception: it
//! does synchronous superblock writes, which happen on member failure and shutdown only.

use crate::ArrayError;
use crate::device::MemberDevice;
use crate::driver::UringDriver;
use crate::memory::{MemDriver, MemMember};
use crate::reactor::{
    AddedDevice, Backend, Control, Doorbell, Reactor, ShardJob, ShardStatus, ToReactor, member_ring,
};
use crate::session::{ReactorLink, Session};
use flashraid_control::{Init, MetaDevice, Metadata, Overwrite, ReAddRefusal};
use flashraid_engine::{
    ArrayAccess, Health, Router, Shard, ShardConfig, ShardCounters, ShardEvent, StallCause,
};
use flashraid_format::assembly::{AssemblyRequest, DirtyDegraded, StaleMembers, StrictDevices};
use flashraid_format::superblock::{Superblock, Tunables};
use flashraid_format::{NewArray, Uuid};
use flashraid_iobuf::BufPool;
use flashraid_layout::{Geometry, Level, MemberIndex, StripeIndex};
use flashraid_parity::Kernel;
use flashraid_uring::{Access, Device, Waker};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How to create an array.
#[derive(Clone, Debug)]
pub struct CreateSpec {
    pub name: String,
    pub level: Level,
    pub chunk_bytes: u64,
    pub members: Vec<PathBuf>,
    pub spares: Vec<PathBuf>,
    /// Create member files that do not exist yet, of this size.
    pub create_files_bytes: Option<u64>,
    pub overwrite: Overwrite,
    /// `None`: zero the members if they all discard to zeroes (instant), else initialise in
    /// the background.
    pub init: Option<Init>,
    pub bitmap_region_bytes: Option<u64>,
    /// Shard sections the bitmap is prepared for (the cores the array will use).
    pub shards: u32,
    /// Tunables stored with the array (rates, merge window, scrub schedule).
    pub tunables: flashraid_format::superblock::Tunables,
}

impl CreateSpec {
    /// An array on in-memory members (`create_in_memory`), initialised by zeroing, with the
    /// default bitmap: what tests, fuzzing and `serve --memory` need.
    pub fn in_memory(name: &str, level: Level, chunk_bytes: u64, shards: u32) -> CreateSpec {
        CreateSpec {
            name: name.to_string(),
            level,
            chunk_bytes,
            members: vec![],
            spares: vec![],
            create_files_bytes: None,
            overwrite: Overwrite::Refuse,
            init: None,
            bitmap_region_bytes: None,
            shards,
            tunables: flashraid_format::superblock::Tunables::default(),
        }
    }
}

/// What `create` made.
#[derive(Clone, Debug)]
pub struct CreatedArray {
    pub uuid: Uuid,
    pub geometry: Geometry,
    pub init: Init,
    pub created_files: Vec<PathBuf>,
    /// Each member's size as opened, in role order: every member gives the array only as
    /// much as the smallest, which the caller may want to say.
    pub member_sizes_bytes: Vec<u64>,
}

/// Bounds of the `queue_depth` tunable (a reactor's io_uring entries: a power of two, at most
/// the ring's own maximum; found by a misuse test: 32768 and 1000 were accepted and stored,
/// and every later start failed).
pub const QUEUE_DEPTH_MIN: u32 = 16;
pub const QUEUE_DEPTH_MAX: u32 = flashraid_uring::RING_ENTRIES_MAX;

/// A rate limit as the superblock stores it: whole MiB/s, rounded up so a limit never becomes
/// "no limit" (0 stays 0: none). A rate set while running takes effect as stored
/// (`stored_rate_bytes_per_s`), so the rate in force is the one the next start uses.
pub fn rate_mib_per_s(bytes_per_s: u64) -> u32 {
    u32::try_from(bytes_per_s.div_ceil(1 << 20)).unwrap_or(u32::MAX)
}

/// `bytes_per_s` as stored and put in force: rounded up to whole MiB/s.
pub fn stored_rate_bytes_per_s(bytes_per_s: u64) -> u64 {
    u64::from(rate_mib_per_s(bytes_per_s)) << 20
}

/// Whether `depth` is a queue depth the array can start with.
pub fn queue_depth_valid(depth: u32) -> bool {
    (QUEUE_DEPTH_MIN..=QUEUE_DEPTH_MAX).contains(&depth) && depth.is_power_of_two()
}

/// The queue depth a start uses for a stored one: within the bounds, rounded down to a power
/// of two (a value stored before the bounds were right still starts).
fn usable_queue_depth(stored: u32) -> u32 {
    let depth = stored.clamp(QUEUE_DEPTH_MIN, QUEUE_DEPTH_MAX);
    1 << (u32::BITS - 1 - depth.leading_zeros())
}

/// A tunable changed while the array runs (`Array::tune`); rates in bytes per second for
/// the whole array (stored rounded up to MiB/s), 0 meaning no limit. The rebuild's rates
/// have their own calls (`Array::set_rebuild_rate`), which also reach a running copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunable {
    /// Background initialisation and resync: bytes of each member swept per second.
    ResyncRate(u64),
    /// Scrub: bytes read per second, also for a scrub already running.
    ScrubRate(u64),
    /// A check scrub every this many hours, counted from now (0: only on request).
    ScrubEveryHours(u32),
    /// Merge window for partial-stripe writes, microseconds (0: none).
    MergeWindowUs(u32),
    /// Reactor threads: stored, used from the next start.
    Shards(u32),
    /// Member IOs in flight per reactor: stored, used from the next start.
    QueueDepth(u32),
    /// A member with IO outstanding and none of it completing for this long is failed as
    /// stalled, milliseconds (0: never).
    MemberTimeoutMs(u32),
}

/// How to open an array.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Reactor threads (shards); `None`: one per CPU.
    pub shards: Option<u32>,
    pub config: ShardConfig,
    pub kernel: Kernel,
    /// Entries of each reactor's io_uring (a `queue_depth` tunable, given or stored with the
    /// array, goes before this).
    pub ring_entries: u32,
    pub dirty_degraded: DirtyDegraded,
    /// Whether stale copies of members, and members failed past the tolerance, may be used
    /// when the array cannot start without them (`--force`). Such an array starts degraded
    /// and resyncs, so it also needs `dirty_degraded: Force` (as `--force` sets both).
    pub stale_members: StaleMembers,
    /// Buffer memory of each session, in bytes.
    pub session_buffer_bytes: usize,
    /// Only this array name (when the devices could hold several).
    pub name: Option<String>,
    /// Start a check scrub this often (counted from the start; `None`: only on request).
    pub scrub_interval: Option<std::time::Duration>,
    /// Scrub rate limit, bytes read per second for the whole array (0: none).
    pub scrub_rate_bytes_per_s: u64,
    /// A shell command run on every event (see `EventRecord`), like mdadm's PROGRAM.
    pub event_command: Option<String>,
    /// Tunables given by the operator now: they override and replace what the array stores
    /// (`None` fields: the stored value, else the defaults above, apply). Not stored when
    /// the array is read-only: they apply to this run only.
    pub tunables: Tunables,
    /// `ReadOnly`: nothing is written to any member, like `mdadm --assemble --readonly`
    /// (devices are opened read-only; the start writes no superblock or bitmap; writes,
    /// discards and zeroes are refused; no resync, rebuild, spare takeover, replace or repair
    /// scrub runs (a check scrub does, rewriting nothing); a range that fails to read is
    /// served from redundancy and not rewritten; a member that fails is failed in memory
    /// only; commands that would write are refused; the stop marks nothing). The assembly rules are those of a read-write start: a dirty, degraded
    /// array still needs `dirty_degraded: Force`.
    pub access: ArrayAccess,
}

impl OpenOptions {
    pub fn recommended() -> Self {
        Self {
            shards: None,
            config: ShardConfig::recommended(),
            kernel: Kernel::best(),
            ring_entries: 1024,
            dirty_degraded: DirtyDegraded::Refuse,
            stale_members: StaleMembers::LeaveOut,
            session_buffer_bytes: 32 << 20,
            name: None,
            scrub_interval: None,
            scrub_rate_bytes_per_s: 0,
            event_command: None,
            tunables: Tunables::default(),
            access: ArrayAccess::ReadWrite,
        }
    }
}

/// A member as reported by `status`.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    pub role: usize,
    pub path: Option<String>,
    pub health: Health,
}

/// The array's state.
#[derive(Clone, Debug)]
pub struct ArrayStatus {
    pub name: String,
    pub uuid: Uuid,
    pub level: Level,
    pub members: Vec<MemberStatus>,
    /// Hot spares present (their device names); the first takes over a failed role.
    pub spares: Vec<String>,
    /// Devices the server holds open that the array no longer lists (failed members, and
    /// former spares left out at the start): `remove_spare` lets go of them.
    pub held_unlisted: Vec<String>,
    /// The rebuild of a replacement, if one runs.
    pub rebuild: Option<RebuildProgress>,
    /// The scrub running, or the last one that ran.
    pub scrub: Option<ScrubProgress>,
    /// The last events, oldest first (at most `EVENTS_KEPT`).
    pub events: Vec<EventRecord>,
    /// The tunables the array stores.
    pub tunables: Tunables,
    pub chunk_bytes: u32,
    pub array_bytes: u64,
    pub degraded: bool,
    pub failed: bool,
    pub resyncing: bool,
    pub bitmap_regions_set: usize,
    /// Merged member reads that failed and were read again part by part (see
    /// `runtime::driver`): errors a second read did not repeat are not otherwise seen.
    pub member_reads_retried: u64,
    /// Member IOs that carried several of the engine's IOs (neighbouring chunks merged).
    pub member_ios_merged: u64,
    pub counters: ShardCounters,
    pub shards: usize,
    /// Member IOs in flight per reactor, at most (its io_uring's entries; in-memory members
    /// have no ring and no such bound).
    pub queue_depth: u32,
    /// The member timeout in force, milliseconds (0: never): a member with IO outstanding
    /// and none of it completing for this long is failed as stalled where the array
    /// survives that (else the stall is waited out).
    pub member_timeout_ms: u64,
    pub event: u64,
    /// Started read-only: nothing is written to any member (`OpenOptions::access`).
    pub read_only: bool,
}

/// A rebuild as `status` reports it.
#[derive(Clone, Debug)]
pub struct RebuildProgress {
    pub role: usize,
    pub path: Option<String>,
    pub stripes_done: u64,
    pub stripes_total: u64,
    /// Bytes written to the replacement per second since the rebuild (re)started.
    pub rate_bytes_per_s: u64,
    /// Seconds left at that rate (`None` before there is a rate).
    pub eta_s: Option<u64>,
    /// The configured limit, bytes per second (0: none).
    pub rate_limit_bytes_per_s: u64,
    /// Where it stopped, if a stripe could not be reconstructed.
    pub stalled_at_stripe: Option<u64>,
    /// Why (for that stripe), when it stalled.
    pub stall_cause: Option<StallCause>,
    /// The operator let the rebuild write reconstructions it cannot verify after an unclean
    /// shutdown (`Array::set_rebuild_trust_parity`); until the server stops.
    pub trust_parity: bool,
    /// A re-added member, or a replacement that was copied: only the regions it missed are
    /// rebuilt, the others are passed over (and count as done, in the percentage and the
    /// rate).
    pub partial: bool,
    /// A `replace` copying the old member to the new device (`path`), before its partial
    /// rebuild: stripes here are the copy's progress in chunks.
    pub copying: bool,
}

impl RebuildProgress {
    pub fn percent(&self) -> f64 {
        if self.stripes_total == 0 {
            return 100.0;
        }
        self.stripes_done as f64 * 100.0 / self.stripes_total as f64
    }
}

/// A scrub as `status` reports it: summed over the shards.
#[derive(Clone, Debug)]
pub struct ScrubProgress {
    pub repair: bool,
    pub running: bool,
    pub tally: flashraid_engine::ScrubTally,
    /// Why it stopped before the end, if it did.
    pub stopped: Option<String>,
    pub seconds: f64,
}

/// Whether a device added as a spare that is this array's own failed member may take its
/// role back with a partial rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReAdd {
    /// Re-add it when the metadata allows (failed while in sync, the missed-write map covers
    /// its absence); otherwise it becomes a spare.
    IfPossible,
    /// Always a spare: a takeover rebuilds it in full.
    Never,
}

/// Whether `Array::fail_member_with` fails a member the array cannot survive without, or
/// the device a role is being rebuilt onto.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailGuard {
    /// Refuse, with nothing changed, a failure that would take the array past its level's
    /// tolerance (roles already out of service and a role being rebuilt count as
    /// unavailable): a slip of the operator's fingers must not fail the whole array. Also
    /// refuse to fail a role being rebuilt: its device is the spare (or re-added member)
    /// that took it over since it failed, most likely not the device the operator means
    /// (`fail ROLE` given twice).
    Refuse,
    /// The operator passed `--force`: fail it all the same.
    Force,
}

/// A device to add as a hot spare.
pub(crate) enum NewSpare {
    Path(PathBuf),
    Memory(Arc<MemMember>),
}

impl NewSpare {
    /// The name its device goes by (`MetaDevice::name`): how a device already held is found.
    fn name(&self) -> String {
        match self {
            NewSpare::Path(p) => p.display().to_string(),
            NewSpare::Memory(m) => m.name().to_string(),
        }
    }
}

pub(crate) enum ToController {
    /// From shard `.0`.
    #[allow(dead_code)]
    Event(u32, ShardEvent),
    FailMember(usize, FailGuard, Sender<Result<(), ArrayError>>),
    /// Whether the rebuild may write reconstructions it cannot verify (see
    /// `Array::set_rebuild_trust_parity`).
    TrustParity(bool, Sender<Result<(), ArrayError>>),
    /// The rebuild's rate limit (`busy`: the one while the array is busy).
    SetRebuildRate {
        bytes_per_s: u64,
        busy: bool,
        reply: Sender<Result<(), ArrayError>>,
    },
    /// Change a tunable live and store it (`Array::tune`).
    Tune(Tunable, Sender<Result<(), ArrayError>>),
    /// A device to add as a hot spare, and whether it may be overwritten.
    AddSpare(NewSpare, Overwrite, ReAdd, Sender<Result<(), ArrayError>>),
    /// Replace a member: the device is added as a spare (or is one), the member is copied to
    /// it, then failed, and that spare (not another) takes the role (`Array::replace`).
    Replace(ReplaceOld, NewSpare, Overwrite, Sender<Result<(), ArrayError>>),
    /// Give up the running `replace`'s copy (`Array::cancel_replace`).
    CancelReplace(Sender<Result<(), ArrayError>>),
    /// Take a hot spare (by its device name) out of the array (`Array::remove_spare`).
    RemoveSpare(String, Sender<Result<(), ArrayError>>),
    /// From the thread erasing a removed spare's superblocks (device index, the thread, the
    /// outcome). The thread names the erase: the device index may belong to a later one.
    SpareErased(usize, std::thread::ThreadId, EraseOutcome),
    /// Start (`Some(repair)`) or stop (`None`) a scrub.
    Scrub(Option<bool>, Sender<Result<(), ArrayError>>),
    Status(Sender<ArrayStatus>),
    Shutdown(Sender<Result<Stopped, ArrayError>>),
    Stop,
    /// From the copier of the `replace` with this generation.
    Copy(u32, crate::copier::CopyReport),
}

/// What keeps a level's redundancy, for messages: "parity", or "the mirror copies" (a misuse
/// test found "parity" in messages about RAID 1 arrays).
fn redundancy_word(level: Level) -> &'static str {
    match level {
        Level::Raid1 | Level::Raid10 => "the mirror copies",
        _ => "parity",
    }
}

/// How a clean shutdown ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every write is durable and the array is marked clean: the next start needs no resync.
    Clean,
    /// Something could not be made clean (resync had not finished, or a member failed and no
    /// flush could prove the rest durable): the array stays dirty and the next start resyncs
    /// the regions left in the bitmap. No acknowledged data is lost either way.
    Dirty,
    /// The array ran read-only: nothing was written, and its members are as the start found
    /// them (clean or dirty).
    Untouched,
}

/// A running array. See the module documentation.
#[derive(Debug)]
pub struct Array {
    controller: Sender<ToController>,
    reactors: Arc<Vec<ReactorLink>>,
    router: Router,
    geometry: Geometry,
    next_session: AtomicU32,
    /// Session ids given back by dropped sessions (at most `SESSIONS_MAX`); taken before new
    /// ones, so a long-running server never runs out. Not on the data path.
    free_sessions: Arc<Mutex<Vec<u32>>>,
    session_buffer_bytes: usize,
    piece_bytes_max: u64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn random_uuid() -> Result<Uuid, ArrayError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| ArrayError::Other(format!("cannot read /dev/urandom: {e}")))?;
    Ok(Uuid::from_random_bytes(bytes))
}

fn open_or_create(
    path: &Path,
    size: Option<u64>,
    created: &mut Vec<PathBuf>,
) -> Result<MemberDevice, ArrayError> {
    match (path.exists(), size) {
        (false, Some(size)) => {
            let device =
                Device::create_file(path, size).map_err(|e| ArrayError::Device(e.to_string()))?;
            created.push(path.to_path_buf());
            Ok(MemberDevice::Device(device))
        }
        _ => {
            let device = Device::open(path, Access::ReadWrite)
                .map_err(|e| ArrayError::Device(e.to_string()))?;
            Ok(MemberDevice::Device(device))
        }
    }
}

/// Create an array: check and prepare the members, write the metadata. Does not start it.
pub fn create(spec: &CreateSpec) -> Result<CreatedArray, ArrayError> {
    let mut created = vec![];
    let result = create_inner(spec, &mut created);
    if result.is_err() {
        // Leave nothing behind that we made.
        for path in &created {
            let _ = std::fs::remove_file(path);
        }
    }
    result.map(|(uuid, geometry, init, member_sizes_bytes)| CreatedArray {
        uuid,
        geometry,
        init,
        created_files: created,
        member_sizes_bytes,
    })
}

fn create_inner(
    spec: &CreateSpec,
    created: &mut Vec<PathBuf>,
) -> Result<(Uuid, Geometry, Init, Vec<u64>), ArrayError> {
    let members: Vec<MemberDevice> = spec
        .members
        .iter()
        .map(|p| open_or_create(p, spec.create_files_bytes, created))
        .collect::<Result<_, _>>()?;
    let spares: Vec<MemberDevice> = spec
        .spares
        .iter()
        .map(|p| open_or_create(p, spec.create_files_bytes, created))
        .collect::<Result<_, _>>()?;
    let init = spec.init.unwrap_or_else(|| {
        if members.iter().chain(&spares).all(|d| d.zeroes_after_discard()) {
            Init::Zero
        } else {
            Init::Background
        }
    });
    let uuid = random_uuid()?;
    let new = NewArray {
        array_uuid: uuid,
        array_name: spec.name.clone(),
        created_at_unix_seconds: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        level: spec.level,
        chunk_bytes: spec.chunk_bytes,
        member_uuids: (0..members.len()).map(|_| random_uuid()).collect::<Result<_, _>>()?,
        member_sizes_bytes: vec![],
        spare_uuids: (0..spares.len()).map(|_| random_uuid()).collect::<Result<_, _>>()?,
        spare_sizes_bytes: vec![],
        bitmap_region_bytes: spec.bitmap_region_bytes,
        shards: spec.shards,
        member_data_bytes_max: None,
        tunables: spec.tunables,
    };
    let member_refs: Vec<&dyn MetaDevice> = members.iter().map(|d| d as &dyn MetaDevice).collect();
    let spare_refs: Vec<&dyn MetaDevice> = spares.iter().map(|d| d as &dyn MetaDevice).collect();
    let made = flashraid_control::create(&new, &member_refs, &spare_refs, spec.overwrite, init)?;
    let member_sizes_bytes = member_refs.iter().map(|d| d.size_bytes()).collect();
    Ok((uuid, made.geometry, init, member_sizes_bytes))
}

/// Read one device's superblocks (for `flashraid inspect`).
pub fn inspect(path: &Path) -> Result<(String, [Result<Superblock, String>; 2]), ArrayError> {
    let device =
        Device::open(path, Access::ReadOnly).map_err(|e| ArrayError::Device(e.to_string()))?;
    let member = MemberDevice::Device(device);
    let candidate = flashraid_control::read_candidate(&member);
    let [a, b] = candidate.copies;
    Ok((candidate.name, [a.map_err(|e| e.to_string()), b.map_err(|e| e.to_string())]))
}

fn cpu_count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
}

/// Create an array on in-memory members (the engine measured alone, and tests).
pub fn create_in_memory(
    spec: &CreateSpec,
    members: &[Arc<MemMember>],
) -> Result<CreatedArray, ArrayError> {
    create_in_memory_with_spares(spec, members, &[])
}

/// `create_in_memory`, with hot spares.
pub fn create_in_memory_with_spares(
    spec: &CreateSpec,
    members: &[Arc<MemMember>],
    spares: &[Arc<MemMember>],
) -> Result<CreatedArray, ArrayError> {
    let devices: Vec<MemberDevice> =
        members.iter().map(|m| MemberDevice::Memory(m.clone())).collect();
    let spare_devices: Vec<MemberDevice> =
        spares.iter().map(|m| MemberDevice::Memory(m.clone())).collect();
    let refs: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let spare_refs: Vec<&dyn MetaDevice> =
        spare_devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let uuid = random_uuid()?;
    let new = NewArray {
        array_uuid: uuid,
        array_name: spec.name.clone(),
        created_at_unix_seconds: 0,
        level: spec.level,
        chunk_bytes: spec.chunk_bytes,
        member_uuids: (0..devices.len()).map(|_| random_uuid()).collect::<Result<_, _>>()?,
        member_sizes_bytes: vec![],
        spare_uuids: (0..spares.len()).map(|_| random_uuid()).collect::<Result<_, _>>()?,
        spare_sizes_bytes: vec![],
        bitmap_region_bytes: spec.bitmap_region_bytes,
        shards: spec.shards,
        member_data_bytes_max: None,
        tunables: spec.tunables,
    };
    let init = spec.init.unwrap_or(Init::Zero);
    let made = flashraid_control::create(&new, &refs, &spare_refs, spec.overwrite, init)?;
    Ok(CreatedArray {
        uuid,
        geometry: made.geometry,
        init,
        created_files: vec![],
        member_sizes_bytes: refs.iter().map(|d| d.size_bytes()).collect(),
    })
}

/// Refuse a device named twice (the same path, a link to it, another node of the same block
/// device) at once, before anything is opened. Found by review: the second open waited out
/// the lock held by the first (`LOCK_WAIT`, 5 s) and then said the device was in use.
/// Paths that cannot be looked at are left for the open to report.
fn refuse_named_twice(paths: &[PathBuf]) -> Result<(), ArrayError> {
    let keys: Vec<_> =
        paths.iter().map(|p| std::fs::metadata(p).ok().map(|m| file_identity(&m))).collect();
    for (i, k) in keys.iter().enumerate() {
        if let Some(k) = k
            && let Some(j) = keys[..i].iter().position(|other| other.as_ref() == Some(k))
        {
            return Err(ArrayError::Other(format!(
                "the same device is named twice: {} and {}",
                paths[j].display(),
                paths[i].display()
            )));
        }
    }
    Ok(())
}

impl Array {
    /// Assemble the array on `paths` and start it.
    pub fn open(paths: &[PathBuf], options: &OpenOptions) -> Result<Array, ArrayError> {
        // Read-only: the kernel refuses writes too (and a device set read-only with
        // `blockdev --setro` can be served), and the members are held against writers (a
        // read-write server of the same members would change them under our reads).
        let open = |p: &PathBuf| match options.access {
            ArrayAccess::ReadWrite => Device::open(p, Access::ReadWrite),
            ArrayAccess::ReadOnly => Device::open_read_only_held(p),
        };
        refuse_named_twice(paths)?;
        let devices: Vec<MemberDevice> = paths
            .iter()
            .map(|p| open(p).map(MemberDevice::Device))
            .collect::<Result<_, _>>()
            .map_err(|e| ArrayError::Device(e.to_string()))?;
        Self::start(devices, options)
    }

    /// Assemble the array on in-memory members and start it.
    pub fn open_in_memory(
        members: &[Arc<MemMember>],
        options: &OpenOptions,
    ) -> Result<Array, ArrayError> {
        let devices = members.iter().map(|m| MemberDevice::Memory(m.clone())).collect();
        Self::start(devices, options)
    }

    fn start(devices: Vec<MemberDevice>, options: &OpenOptions) -> Result<Array, ArrayError> {
        let memory = devices.iter().all(|d| matches!(d, MemberDevice::Memory(_)));
        if !memory && devices.iter().any(|d| matches!(d, MemberDevice::Memory(_))) {
            return Err(ArrayError::Other(
                "members are either all in memory or all devices".into(),
            ));
        }
        let refs: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let request = AssemblyRequest {
            array_uuid: None,
            array_name: options.name.clone(),
            strict: StrictDevices::Strict,
            dirty_degraded: options.dirty_degraded,
            stale: options.stale_members,
        };
        let prepared = flashraid_control::prepare(&refs, &request)?;
        // Tunables: what the operator gave now, else what the array stores, else the
        // options' defaults. What was given now is stored (below, once started). Reactor
        // threads: given now, else the caller's `shards`, else stored, else one per CPU.
        let stored = prepared.assembled.superblock.tunables;
        let given = options.tunables;
        let tunables = given.or(stored);
        let shards = given
            .shards
            .or(options.shards)
            .or(stored.shards)
            .unwrap_or_else(cpu_count)
            .clamp(1, flashraid_format::bitmap::SHARDS_MAX);
        let mut options = options.clone();
        if let Some(depth) = tunables.queue_depth {
            options.ring_entries = usable_queue_depth(depth);
        }
        if let Some(mib) = tunables.resync_rate_mib_per_s {
            options.config.resync_rate_bytes_per_s = u64::from(mib) << 20;
        }
        if let Some(mib) = tunables.rebuild_rate_mib_per_s {
            options.config.rebuild_rate_bytes_per_s = u64::from(mib) << 20;
        }
        if let Some(mib) = tunables.rebuild_busy_rate_mib_per_s {
            options.config.rebuild_busy_rate_bytes_per_s = u64::from(mib) << 20;
        }
        if let Some(mib) = tunables.scrub_rate_mib_per_s {
            options.scrub_rate_bytes_per_s = u64::from(mib) << 20;
        }
        if let Some(us) = tunables.merge_window_us {
            options.config.merge_window_us = u64::from(us);
        }
        if let Some(ms) = tunables.member_timeout_ms {
            options.config.member_io_timeout_us = u64::from(ms) * 1000;
        }
        if let Some(hours) = tunables.scrub_interval_hours {
            options.scrub_interval =
                (hours > 0).then(|| std::time::Duration::from_secs(u64::from(hours) * 3600));
        }
        let options = &options;
        let (mut metadata, setups) = flashraid_control::start(
            &refs,
            &prepared,
            shards,
            options.config,
            options.kernel,
            options.access,
        )?;
        if tunables != stored && options.access == ArrayAccess::ReadWrite {
            metadata.set_tunables(&refs, tunables)?;
        }
        let geometry = prepared.assembled.geometry;
        // Registered files: role order; missing roles get a placeholder never addressed.
        let placeholder =
            std::fs::File::open("/dev/null").map_err(|e| ArrayError::Other(e.to_string()))?;
        let role_devices: Vec<Option<&MemberDevice>> = (0..geometry.member_count())
            .map(|role| metadata.role_device(role).map(|d| &devices[d]))
            .collect();
        // Hot spares are registered after the roles: one that takes a role over is mapped
        // to it in every reactor (`Control::StartRebuild`).
        let spare_devices: Vec<&MemberDevice> =
            metadata.spare_devices().iter().map(|&d| &devices[d]).collect();
        let fds: Vec<i32> = role_devices
            .iter()
            .map(|d| match d {
                Some(MemberDevice::Device(device)) => device.raw_fd(),
                _ => std::os::fd::AsRawFd::as_raw_fd(&placeholder),
            })
            .chain(spare_devices.iter().map(|d| match d {
                MemberDevice::Device(device) => device.raw_fd(),
                MemberDevice::Memory(_) | MemberDevice::Released(_) => {
                    std::os::fd::AsRawFd::as_raw_fd(&placeholder)
                }
            }))
            // Free slots for spares added while running (`Array::add_spare`), up to the
            // member table's size.
            .chain(std::iter::repeat(std::os::fd::AsRawFd::as_raw_fd(&placeholder)))
            .take(flashraid_layout::MEMBERS_MAX)
            .collect();
        let mem_members: Vec<Option<Arc<MemMember>>> = role_devices
            .iter()
            .map(|d| match d {
                Some(MemberDevice::Memory(m)) => Some(m.clone()),
                _ => None,
            })
            .collect();
        let mem_spares: Vec<Arc<MemMember>> = spare_devices
            .iter()
            .filter_map(|d| match d {
                MemberDevice::Memory(m) => Some(m.clone()),
                MemberDevice::Device(_) | MemberDevice::Released(_) => None,
            })
            .collect();
        // Device index -> registered index.
        let mut registered: Vec<Option<usize>> = vec![None; devices.len()];
        for role in 0..geometry.member_count() {
            if let Some(d) = metadata.role_device(role) {
                registered[d] = Some(role);
            }
        }
        for (i, &d) in metadata.spare_devices().iter().enumerate() {
            registered[d] = Some(geometry.member_count() + i);
        }
        let (controller_tx, controller_rx) = mpsc::channel();
        let mut links = vec![];
        let mut threads = vec![];
        for setup in setups {
            let shard_index = setup.shard_index;
            // Validate here so a bad setup is an error, not a dead thread.
            Shard::new(setup.clone()).map_err(|e| ArrayError::Other(e.to_string()))?;
            let backend = if memory {
                Backend::Memory(MemDriver::new(
                    mem_members.clone(),
                    mem_spares.clone(),
                    options.ring_entries as usize,
                ))
            } else {
                let ring = member_ring(&fds, options.ring_entries)
                    .map_err(|e| ArrayError::Other(e.to_string()))?;
                Backend::Uring(UringDriver::new(ring))
            };
            let waker = Waker::new().map_err(|e| ArrayError::Other(e.to_string()))?;
            let (tx, rx) = mpsc::sync_channel(options.config.requests_max * 2);
            let events = controller_tx.clone();
            let bell = Arc::new(Doorbell::new(waker));
            links.push(ReactorLink { tx, bell: bell.clone() });
            // The shard is built on its own thread: it owns raw buffer pointers that must
            // never cross threads while IO is in flight, so it is never sent anywhere.
            let thread = std::thread::Builder::new()
                .name(format!("flashraid-shard-{shard_index}"))
                .spawn(move || {
                    let shard = Shard::new(setup).expect("validated above");
                    let reactor =
                        Reactor { shard, driver: backend, bell, inbox: rx, events, shard_index };
                    reactor.run();
                })
                .map_err(|e| ArrayError::Other(e.to_string()))?;
            threads.push(thread);
        }
        let reactors = Arc::new(links);
        let stripe = geometry.stripe_data_bytes();
        let piece_bytes_max = stripe.clamp(u64::from(geometry.chunk_bytes()), 4 << 20);
        let run_bytes = options.config.stripe_run_member_bytes;
        let router = Router::new(geometry, shards, run_bytes, piece_bytes_max);
        let array = Array {
            controller: controller_tx,
            reactors: reactors.clone(),
            router,
            geometry,
            next_session: AtomicU32::new(1),
            free_sessions: Arc::new(Mutex::new(Vec::new())),
            session_buffer_bytes: options.session_buffer_bytes,
            piece_bytes_max,
            threads: Mutex::new(threads),
        };
        let next_slot = geometry.member_count() + metadata.spare_devices().len();
        let metadata_read_only = metadata.is_read_only();
        // A read-only array runs no scheduled scrub: a check there writes nothing, but a
        // read-only start (a recovery, a look at members kept as evidence) should not start
        // reading every member unasked. The operator's `scrub` (a check) still runs.
        let scrub_interval = options.scrub_interval.filter(|_| !metadata_read_only);
        let mut controller = Controller {
            next_slot,
            free_slots: Vec::new(),
            role_slots: (0..geometry.member_count()).collect(),
            detached_slots: Vec::new(),
            preferred_spare: None,
            takeover_partial: None,
            replace_deferred: false,
            copy: None,
            stopping_copier: None,
            erasing: Vec::new(),
            copy_generation: 0,
            to_self: array.controller.clone(),
            inbox: controller_rx,
            metadata,
            devices,
            reactors,
            placeholder,
            registered,
            rebuild: None,
            rebuild_generation: 0,
            rebuild_rate_bytes_per_s: options.config.rebuild_rate_bytes_per_s,
            rebuild_trust_parity: false,
            rebuild_stall_retry: retry_interval_text(options.config.rebuild_stall_retry_us),
            shard_count: shards,
            scrub: None,
            events: EventLog::new(options.event_command.clone()),
            scrub_rate_bytes_per_s: options.scrub_rate_bytes_per_s,
            ring_entries: options.ring_entries,
            member_timeout_us: options.config.member_io_timeout_us,
            stall_noted: vec![None; geometry.member_count()],
            spare_held_noted: None,
            role_epoch: vec![0; geometry.member_count()],
            scrub_interval,
            next_scrub_at: scrub_interval.map(|i| std::time::Instant::now() + i),
        };
        // What assembly did not use is said where the operator looks (the log, the event
        // command): a stale copy left out is why the array runs degraded.
        for (device, why) in &prepared.assembled.left_out {
            let message = format!("{device} was left out at the start: {why}");
            controller.events.record(&controller.metadata, "member-left-out", &message);
        }
        for device in &prepared.assembled.stale_used {
            let message = format!(
                "{device} is a stale copy of its member, used because the array could not \
                 start without it (--force): its chunks are old and every region is resynced"
            );
            controller.events.record(&controller.metadata, "stale-member-used", &message);
        }
        for device in &prepared.assembled.failed_used {
            let message = format!(
                "{device}, failed past what the level survives, is back in its role because \
                 the array could not start without it (--force): its chunks are as of its \
                 failure; the regions being written then and those written while a member \
                 was out (the missed-write map) are resynced"
            );
            controller.events.record(&controller.metadata, "failed-member-used", &message);
        }
        if metadata_read_only {
            controller.events.record(
                &controller.metadata,
                "read-only",
                "started read-only: nothing is written to any member (no resync, rebuild, spare \
                 takeover, replace or repair runs; a check scrub rewrites nothing; a member that \
                 fails is failed until the stop only; writes and commands that change the array \
                 are refused)",
            );
        } else {
            controller.resume_or_start_rebuild();
            controller.resume_replace();
            controller.apply_metadata_failures();
        }
        let thread = std::thread::Builder::new()
            .name("flashraid-control".to_string())
            .spawn(move || controller.run())
            .map_err(|e| ArrayError::Other(e.to_string()))?;
        array.threads.lock().expect("not poisoned").push(thread);
        Ok(array)
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_bytes()
    }

    /// A new session: a client's own buffers and reply channel.
    pub fn session(&self) -> Result<Session, ArrayError> {
        self.new_session(None)
    }

    /// A session for an event loop that waits with `poll(2)`: its `notify_fd` becomes
    /// readable when replies arrive while it sleeps (see `Session::prepare_to_sleep`).
    pub fn session_with_bell(&self) -> Result<Session, ArrayError> {
        let waker = Waker::new().map_err(|e| ArrayError::Other(e.to_string()))?;
        self.new_session(Some(Arc::new(Doorbell::new(waker))))
    }

    /// A session for a job that will run on reactor `index % shards` ([`Array::start_job`])
    /// and may say `JobStatus::Waiting`: replies from the other shards ring that reactor's
    /// doorbell, so a reactor asleep on its jobs' descriptors wakes for them.
    pub fn job_session(&self, index: usize) -> Result<Session, ArrayError> {
        let bell = self.reactors[index % self.reactors.len()].bell.clone();
        self.new_session(Some(bell))
    }

    fn new_session(&self, bell: Option<Arc<Doorbell>>) -> Result<Session, ArrayError> {
        let reused = self.free_sessions.lock().expect("not poisoned").pop();
        let id = match reused {
            Some(id) => id,
            None => {
                let id = self.next_session.fetch_add(1, Ordering::Relaxed);
                if usize::try_from(id).expect("fits") >= crate::reactor::SESSIONS_MAX {
                    self.next_session.fetch_sub(1, Ordering::Relaxed);
                    return Err(ArrayError::Other(format!(
                        "{} sessions are open: the most an array serves",
                        crate::reactor::SESSIONS_MAX - 1
                    )));
                }
                id
            }
        };
        let give_back = |e: ArrayError| {
            self.free_sessions.lock().expect("not poisoned").push(id);
            e
        };
        let pool =
            session_pool(self.session_buffer_bytes, self.piece_bytes_max).map_err(give_back)?;
        let (tx, rx) = mpsc::channel();
        for link in self.reactors.iter() {
            link.tx
                .send(ToReactor::Session { id, replies: tx.clone(), bell: bell.clone() })
                .map_err(|_| give_back(ArrayError::Stopped))?;
            link.bell.ring();
        }
        Ok(Session::new(
            id,
            self.router,
            self.reactors.clone(),
            rx,
            pool,
            bell,
            self.free_sessions.clone(),
        ))
    }

    /// Run `jobs` inside the reactor threads (job `i` on shard `i % shards`), each once per
    /// turn until it returns [`JobStatus::Finished`]; returns when all have. This is the
    /// "poller" mode: a client with no thread of its own, so no hand-off between its thread
    /// and a reactor's. A job must never block (use `Session::poll(false, ..)`); while one
    /// of a shard's jobs says `JobStatus::Running` its reactor polls instead of sleeping, so
    /// the cores it runs on stay busy. At most `SHARD_JOBS_MAX` jobs per shard.
    pub fn run_on_shards(&self, jobs: Vec<ShardJob>) -> Result<(), ArrayError> {
        let mut done = Vec::with_capacity(jobs.len());
        for (index, job) in jobs.into_iter().enumerate() {
            done.push(self.start_job(index, job)?);
        }
        let mut first_error = None;
        for rx in done {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(ArrayError::Other(e));
                }
                // The reactor stopped before the job finished.
                Err(_) => {
                    first_error.get_or_insert(ArrayError::Stopped);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Start `job` inside reactor `index % shards` and return at once; the receiver hears
    /// when it finished (or why not: no room on the shard, or it panicked and was dropped;
    /// a reactor that stopped first drops the sender). See
    /// [`Array::run_on_shards`] for what a job must and must not do.
    pub fn start_job(
        &self,
        index: usize,
        job: ShardJob,
    ) -> Result<mpsc::Receiver<Result<(), String>>, ArrayError> {
        let link = &self.reactors[index % self.reactors.len()];
        let (tx, rx) = mpsc::channel();
        link.tx
            .send(ToReactor::Control(Control::RunJob(job, tx)))
            .map_err(|_| ArrayError::Stopped)?;
        link.bell.ring();
        Ok(rx)
    }

    pub fn status(&self) -> Result<ArrayStatus, ArrayError> {
        let (tx, rx) = mpsc::channel();
        self.controller.send(ToController::Status(tx)).map_err(|_| ArrayError::Stopped)?;
        rx.recv().map_err(|_| ArrayError::Stopped)
    }

    /// Limit the rebuild rate (bytes written to the replacement per second, for the whole
    /// array; 0: no limit). Takes effect at once, also for a rebuild already running.
    pub fn set_rebuild_rate(&self, bytes_per_s: u64) -> Result<(), ArrayError> {
        self.send_rebuild_rate(bytes_per_s, false)
    }

    /// Limit the rebuild while the array is busy (a foreground request in the last 2 ms),
    /// like md's speed_limit_min; 0: no separate limit. Stored with the array.
    pub fn set_rebuild_busy_rate(&self, bytes_per_s: u64) -> Result<(), ArrayError> {
        self.send_rebuild_rate(bytes_per_s, true)
    }

    /// Let the rebuild write its reconstruction of stripes it cannot verify, in regions an
    /// unclean shutdown left dirty while the array was degraded (on RAID 5 every such
    /// stripe; on RAID 6 and 7.3 those with no second parity row left, or that fail the
    /// check), instead of stalling there: like md's `start_dirty_degraded`, a stripe that was
    /// being written at the shutdown gets a wrong chunk on the replacement (the write hole),
    /// and the rest get their redundancy back. Counted in `rebuild_unverified_stripes`; in
    /// force until the server stops (not stored).
    pub fn set_rebuild_trust_parity(&self, on: bool) -> Result<(), ArrayError> {
        self.ask_controller(|reply| ToController::TrustParity(on, reply))
    }

    fn send_rebuild_rate(&self, bytes_per_s: u64, busy: bool) -> Result<(), ArrayError> {
        self.ask_controller(|reply| ToController::SetRebuildRate { bytes_per_s, busy, reply })
    }

    /// Change a tunable now (where it can change while running) and store it with the array.
    pub fn tune(&self, tunable: Tunable) -> Result<(), ArrayError> {
        let valid = match tunable {
            Tunable::Shards(n) => (1..=flashraid_format::bitmap::SHARDS_MAX).contains(&n),
            Tunable::QueueDepth(n) => queue_depth_valid(n),
            Tunable::MergeWindowUs(us) => us <= flashraid_engine::MERGE_WINDOW_US_MAX,
            Tunable::MemberTimeoutMs(ms) => {
                let us = u64::from(ms) * 1000;
                ms == 0
                    || (flashraid_engine::MEMBER_IO_TIMEOUT_US_MIN
                        ..=flashraid_engine::MEMBER_IO_TIMEOUT_US_MAX)
                        .contains(&us)
            }
            _ => true,
        };
        if !valid {
            let why = match tunable {
                Tunable::QueueDepth(_) => format!(
                    " (a queue depth is a power of two from {QUEUE_DEPTH_MIN} to {QUEUE_DEPTH_MAX})"
                ),
                _ => String::new(),
            };
            return Err(ArrayError::Other(format!("{tunable:?} is out of range{why}")));
        }
        self.ask_controller(|reply| ToController::Tune(tunable, reply))
    }

    /// Send the controller a command and wait for its answer.
    fn ask_controller(
        &self,
        command: impl FnOnce(Sender<Result<(), ArrayError>>) -> ToController,
    ) -> Result<(), ArrayError> {
        let (tx, rx) = mpsc::channel();
        self.controller.send(command(tx)).map_err(|_| ArrayError::Stopped)?;
        rx.recv().map_err(|_| ArrayError::Stopped)?
    }

    fn check_role(&self, role: usize) -> Result<(), ArrayError> {
        if role >= self.geometry.member_count() {
            return Err(ArrayError::Other(format!(
                "no member {role}: the array has {}",
                self.geometry.member_count()
            )));
        }
        Ok(())
    }

    /// Add a hot spare while running (like `mdadm --add`): `path` is checked (no data of
    /// someone else's unless `overwrite`, large enough), listed in every superblock, and
    /// opened by every reactor. A failed role takes it over at once. A member of this array
    /// that failed while in sync and comes back takes its own role back instead, and only
    /// the regions written while it was away are rebuilt (like `mdadm --re-add`; see
    /// `add_spare_with` to rebuild it in full).
    pub fn add_spare(&self, path: &Path, overwrite: Overwrite) -> Result<(), ArrayError> {
        self.add_spare_with(path, overwrite, ReAdd::IfPossible)
    }

    /// `add_spare`, saying whether a returning member may be re-added to its role.
    pub fn add_spare_with(
        &self,
        path: &Path,
        overwrite: Overwrite,
        re_add: ReAdd,
    ) -> Result<(), ArrayError> {
        self.add_new_spare(NewSpare::Path(path.to_path_buf()), overwrite, re_add)
    }

    /// Replace member `role` with a new device while the array keeps its redundancy: the
    /// device is added as a hot spare and the member's data area is copied to it in the
    /// background (at the rebuild rate), with every region written meanwhile recorded in
    /// the missed-write map; then the member is failed, the new device takes its role, and
    /// only the recorded regions are rebuilt. Refused while a rebuild or another replace
    /// runs, while a role is already failed (a spare would take that one first), and on a
    /// level without redundancy. If a member fails during the copy the copy is given up and
    /// the new device is an ordinary spare (rebuilt in full if it takes a role); if the old
    /// member cannot be read, it is failed at once and the new device rebuilt in full. A
    /// device already listed as a spare can be named (to start a given-up copy again).
    /// In-memory members are not copied (nothing serves overlapping reads and writes
    /// there): the member is failed and the new device rebuilt, as before copies existed.
    pub fn replace(
        &self,
        role: usize,
        path: &Path,
        overwrite: Overwrite,
    ) -> Result<(), ArrayError> {
        self.send_replace(role, NewSpare::Path(path.to_path_buf()), overwrite)
    }

    /// `replace` for an array on in-memory members.
    pub fn replace_in_memory(&self, role: usize, member: Arc<MemMember>) -> Result<(), ArrayError> {
        self.send_replace(role, NewSpare::Memory(member), Overwrite::Refuse)
    }

    /// `replace` of the member `old` names: the name a role's device is held under (as
    /// `status` lists members; made absolute against the server's own directory, where it
    /// opened it, so a relative name given to `serve` matches the CLI's absolute one), else
    /// the device the file `old` leads to (by identity, so a symlink or another name of the
    /// same file works). Looked up by the controller with the replace itself, so a takeover
    /// in between cannot make it replace another device.
    pub fn replace_named(
        &self,
        old: &str,
        path: &Path,
        overwrite: Overwrite,
    ) -> Result<(), ArrayError> {
        let spare = NewSpare::Path(path.to_path_buf());
        let old = ReplaceOld::Named(old.to_string());
        self.ask_controller(|tx| ToController::Replace(old, spare, overwrite, tx))
    }

    fn send_replace(
        &self,
        role: usize,
        spare: NewSpare,
        overwrite: Overwrite,
    ) -> Result<(), ArrayError> {
        self.check_role(role)?;
        let old = ReplaceOld::Role(role);
        self.ask_controller(|tx| ToController::Replace(old, spare, overwrite, tx))
    }

    /// Give up the running `replace` while it copies (also one resumed at a start): the
    /// copier stops, the member being replaced stays in service and the new device stays a
    /// hot spare (`remove_spare` takes it out). Refused when no copy runs; once the copy is
    /// done, the new device holds the role and its rebuild must finish.
    pub fn cancel_replace(&self) -> Result<(), ArrayError> {
        self.ask_controller(ToController::CancelReplace)
    }

    /// Take hot spare `name` (its path, or an in-memory member's name, as `status` lists
    /// spares) out of the array, like `mdadm --remove` of a spare: it leaves every
    /// superblock's member table, then its own superblocks are erased (on a thread; waited
    /// for up to 2 s), so it no longer claims the array and takes no `--force` to reuse (its
    /// data area is not wiped). Refused for a device that is not one of this array's spares
    /// (matched by the name the server holds it under, or by the identity of the file the
    /// given name leads to), and for the target of a
    /// running `replace` (cancel that first). Once erased, the server closes the device
    /// (every reactor's ring too), so a block device is free for other use; an erase that
    /// outlasts the wait closes it when it ends. A failed member the array no longer uses
    /// (`mdadm --remove` of a faulty device) is closed the same way with its superblocks
    /// kept, so `add_spare` takes it back as the stale member it is.
    pub fn remove_spare(&self, name: &str) -> Result<(), ArrayError> {
        let name = name.to_string();
        self.ask_controller(|tx| ToController::RemoveSpare(name, tx))
    }

    /// `add_spare` for an array on in-memory members.
    pub fn add_spare_in_memory(&self, member: Arc<MemMember>) -> Result<(), ArrayError> {
        self.add_new_spare(NewSpare::Memory(member), Overwrite::Refuse, ReAdd::IfPossible)
    }

    /// `add_spare_with` for an array on in-memory members.
    pub fn add_spare_in_memory_with(
        &self,
        member: Arc<MemMember>,
        re_add: ReAdd,
    ) -> Result<(), ArrayError> {
        self.add_new_spare(NewSpare::Memory(member), Overwrite::Refuse, re_add)
    }

    fn add_new_spare(
        &self,
        spare: NewSpare,
        overwrite: Overwrite,
        re_add: ReAdd,
    ) -> Result<(), ArrayError> {
        self.ask_controller(|tx| ToController::AddSpare(spare, overwrite, re_add, tx))
    }

    /// Start a scrub of the whole array (`repair`: rewrite what disagrees); one already
    /// running is restarted. Refused while a member is out of service. On an array served
    /// read-only only a check runs (a repair is refused with `ControlError::ReadOnly`), and
    /// it writes nothing: read errors it meets are reported (`read_errors_left`), not
    /// rewritten.
    pub fn start_scrub(&self, repair: bool) -> Result<(), ArrayError> {
        self.ask_controller(|tx| ToController::Scrub(Some(repair), tx))
    }

    /// Stop a running scrub (status keeps what it found).
    pub fn stop_scrub(&self) -> Result<(), ArrayError> {
        self.ask_controller(|tx| ToController::Scrub(None, tx))
    }

    /// Fail a member now (like `mdadm --fail`), durably. Refused, with nothing changed, when
    /// the array would not survive without it, and for a role being rebuilt (the device
    /// that took it over would be failed); `fail_member_with` and `FailGuard::Force` fail it
    /// all the same.
    pub fn fail_member(&self, role: usize) -> Result<(), ArrayError> {
        self.fail_member_with(role, FailGuard::Refuse)
    }

    /// `fail_member`, saying whether a failure past the level's tolerance is refused. A
    /// member failed as asked is `Ok` even when no member is left to record it (the last
    /// one, forced): `status` then says the array has failed.
    pub fn fail_member_with(&self, role: usize, guard: FailGuard) -> Result<(), ArrayError> {
        self.check_role(role)?;
        self.ask_controller(|tx| ToController::FailMember(role, guard, tx))
    }

    /// Finish what is in flight, flush, clear the bitmaps, mark the array clean if every
    /// shard ended clean, stop the threads. Callers should have no requests in flight (new
    /// ones are refused with `ShuttingDown`).
    pub fn shutdown(self) -> Result<Stopped, ArrayError> {
        self.shutdown_in_place()
    }

    /// `shutdown` of an array other threads still hold (the control socket of a server that
    /// stops one array of several, whose other commands may still reach it): once it
    /// returns, every call answers `ArrayError::Stopped` (a second shutdown too) and
    /// dropping the last handle does nothing more. The caller makes sure no client uses
    /// it any more, as for `shutdown`.
    pub fn shutdown_in_place(&self) -> Result<Stopped, ArrayError> {
        let (tx, rx) = mpsc::channel();
        self.controller.send(ToController::Shutdown(tx)).map_err(|_| ArrayError::Stopped)?;
        let result = rx.recv().map_err(|_| ArrayError::Stopped)?;
        self.join();
        result
    }

    fn join(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().expect("not poisoned"));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for Array {
    /// Without `shutdown` the array stops as after a crash: dirty, resynced at the next open.
    fn drop(&mut self) {
        let _ = self.controller.send(ToController::Stop);
        self.join();
    }
}

fn session_pool(budget_bytes: usize, piece_bytes_max: u64) -> Result<BufPool, ArrayError> {
    let max = usize::try_from(piece_bytes_max).expect("fits");
    let mut classes = vec![];
    let mut size = 4096usize;
    while size < max {
        classes.push(size);
        size *= 2;
    }
    classes.push(max.next_multiple_of(4096));
    // Half the budget for the largest class (whole pieces of big requests), the rest shared.
    let largest = *classes.last().expect("at least one class");
    let share = budget_bytes / 2 / classes.len().max(1);
    let spec: Vec<(usize, usize)> = classes
        .iter()
        .map(|&b| {
            let bytes = if b == largest { budget_bytes / 2 } else { share };
            (b, (bytes / b).max(2))
        })
        .collect();
    BufPool::new(&spec).map_err(|e| ArrayError::Other(format!("session buffers: {e:?}")))
}

struct Controller {
    inbox: Receiver<ToController>,
    metadata: Metadata,
    devices: Vec<MemberDevice>,
    reactors: Arc<Vec<ReactorLink>>,
    /// /dev/null, opened at the start: the registered file of ring slots that hold no
    /// device (missing roles, free slots, slots released while running).
    placeholder: std::fs::File,
    /// Per device: its registered index in the reactors' drivers (roles, then spares).
    registered: Vec<Option<usize>>,
    /// The next registration slot never used (for a spare added while running).
    next_slot: usize,
    /// Registration slots after the roles' that a released device left (`release_slot`):
    /// taken before `next_slot`, so a server that adds and removes spares for ever does
    /// not run out. At most `MEMBERS_MAX` entries (each slot once).
    free_slots: Vec<usize>,
    /// The ring slot each role's IO goes to in every reactor (`Control::StartRebuild` moves
    /// it; role `r` starts at slot `r`). A failed role keeps its mapping until a spare takes
    /// it over, and IO queued for it before it failed (not yet submitted) still goes there.
    role_slots: Vec<usize>,
    /// Released slots some failed role still maps to: not handed out (the next device would
    /// get that IO) until `begin_rebuild` moves the last such role off them.
    detached_slots: Vec<usize>,
    /// The spare `replace` added: the next takeover uses it rather than the first spare.
    preferred_spare: Option<usize>,
    /// The role whose copy is done: the next takeover of exactly that role by
    /// `preferred_spare` is partial.
    takeover_partial: Option<MemberIndex>,
    /// A replace recorded in the superblocks waits for resync to finish before its copy
    /// starts over (`resume_replace`); said once in the event log.
    replace_deferred: bool,
    /// A `replace` copying the old member to the new device.
    copy: Option<RunningCopy>,
    /// A copier told to stop that has not said it stopped: it may still write its device
    /// (a step in progress on a slow device), which stays out of service until it has.
    stopping_copier: Option<Copier>,
    /// Removed spares whose superblocks are still being erased (the device did not answer
    /// within `ERASE_WAIT`): not to be added again until their thread reports. At most one
    /// per device slot.
    erasing: Vec<(usize, std::thread::JoinHandle<()>)>,
    /// `replace`s started (each copier's reports carry its generation).
    copy_generation: u32,
    /// The controller's own inbox, for the copier threads to report into.
    to_self: Sender<ToController>,
    rebuild: Option<RunningRebuild>,
    /// `StartRebuild`s sent (each shard counts them too: `ShardEvent` generations).
    rebuild_generation: u32,
    rebuild_rate_bytes_per_s: u64,
    /// `Array::set_rebuild_trust_parity`, as last told to the shards.
    rebuild_trust_parity: bool,
    /// `ShardConfig::rebuild_stall_retry_us` as the stall's message says it ("10 s").
    rebuild_stall_retry: String,
    shard_count: u32,
    scrub: Option<RunningScrub>,
    events: EventLog,
    scrub_rate_bytes_per_s: u64,
    /// Entries of each reactor's io_uring, as started.
    ring_entries: u32,
    /// The member timeout in force (`ShardConfig::member_io_timeout_us`; 0: never).
    member_timeout_us: u64,
    /// Per role: when a stall that could not be failed was last said in an event.
    stall_noted: Vec<Option<std::time::Instant>>,
    /// The roles out of service when the event saying that no hot spare takes a role (the
    /// array is failed past its tolerance) was last recorded: said once per such state, not
    /// at every look for a spare.
    spare_held_noted: Option<Vec<usize>>,
    /// Per role: the epoch of the device holding it, counted as every shard counts it (one
    /// per `StartRebuild`, mod `EPOCHS`): failure and stall reports naming another are about
    /// a device the role has left.
    role_epoch: Vec<u8>,
    scrub_interval: Option<std::time::Duration>,
    next_scrub_at: Option<std::time::Instant>,
}

/// The controller's view of the current (or last) scrub.
struct RunningScrub {
    repair: bool,
    /// Members out of service when it started (a degraded scrub counts mismatches and does
    /// not repair them).
    out_at_start: usize,
    started: std::time::Instant,
    finished: Option<std::time::Instant>,
    /// Shards that reported the end, with what they found.
    done: Vec<Option<(flashraid_engine::ScrubTally, Option<&'static str>)>>,
}

/// The controller's view of a rebuild.
struct RunningRebuild {
    role: MemberIndex,
    started: std::time::Instant,
    /// Stripe the rebuild (re)started from.
    from: u64,
    /// Per shard: its reported low-water stripe, and whether it reported the end.
    done_below: Vec<u64>,
    shard_done: Vec<bool>,
    /// Which `StartRebuild` this is (the shards count them the same way).
    generation: u32,
    last_recorded: std::time::Instant,
    /// Per shard: the stripe its rebuild stalled at, until its progress passes it (a retry),
    /// and why.
    stalled_at: Vec<Option<(u64, StallCause)>>,
}

/// A `replace` copying the old member's data area to the new device on a copier thread
/// (`copier`), while the array keeps its redundancy (every shard records the regions written
/// meanwhile in the missed-write map).
struct RunningCopy {
    role: MemberIndex,
    /// Device index of the replacement (a listed spare).
    new: usize,
    /// Bytes of the data area copied (as the copier last reported), of `total_bytes`.
    done_bytes: u64,
    total_bytes: u64,
    started: std::time::Instant,
    copier: Copier,
    /// Dropping it tells the copier to stop.
    commands: Sender<crate::copier::CopyCommand>,
}

/// A copier thread: which copy it runs (reports carry it), the device it writes, its handle.
struct Copier {
    generation: u32,
    new: usize,
    thread: std::thread::JoinHandle<()>,
}

/// Why a rebuild stalls at a stripe it cannot verify, and the way on (events and status).
pub const UNVERIFIABLE_STALL: &str = "it lies in a region an unclean shutdown left dirty \
     while the array was degraded, so its parity may disagree with its data and the \
     reconstruction cannot be checked (RAID 5 has no second parity row; RAID 6 and 7.3 have \
     none left, or the check failed). Reads that need it are refused rather than guessed. \
     `flashraid rebuild --trust-parity` lets the rebuild write its reconstruction anyway, as \
     md does after a forced start: a stripe that was being written at that shutdown then \
     gets a wrong chunk on the replacement, and every other stripe its redundancy back";

/// Why `replace` is refused while stripes an unclean shutdown left dirty are not all
/// resynced: when its copy ends, the old member leaves service, and those stripes would then
/// be degraded and untrusted (found by review: flushed data became unreadable, and on
/// mirrors a range read other bytes with no write in between).
const RESYNC_PENDING_REPLACE: &str = "stripes an unclean shutdown left dirty are not all \
    resynced yet (resync is running, or stopped: see `status` and its events); replace once \
    it is done: until then the old member's chunks are needed as they are";

/// How long `spare remove` waits for the erase of the spare's superblocks before it answers
/// (a device that does not answer holds its own thread, not the controller).
const ERASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often rebuild progress is recorded in the superblocks, at most.
const REBUILD_RECORD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// A stall the array would not survive failing is said in an event at most this often per
/// member (the shards report it once a member timeout while it lasts).
const STALL_NOTE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// A clean shutdown in progress: the shards' acknowledgements still awaited.
struct PendingShutdown {
    reply: Sender<Result<Stopped, ArrayError>>,
    acks: Vec<Option<Receiver<(bool, bool)>>>,
    clean: bool,
    /// Every shard stopped clean or with only background init's regions left.
    in_init: bool,
}

/// How often the controller looks at the shards' shutdown acknowledgements.
const SHUTDOWN_POLL: std::time::Duration = std::time::Duration::from_millis(1);

impl Controller {
    /// Serve events and commands until stopped. A shutdown is a state of this loop, not a
    /// blocking call: while the shards drain and flush, member failures they report must
    /// still be recorded (their flushes wait for exactly that).
    fn run(mut self) {
        self.serve();
        // A copier still writing its new device must be done before the array counts as
        // stopped: a later start must find that device as this one left it.
        let copiers = [self.copy.take().map(|c| c.copier), self.stopping_copier.take()];
        for copier in copiers.into_iter().flatten() {
            if !copier.thread.is_finished() {
                eprintln!(
                    "flashraid: waiting for the copy to {} to stop (a device has not answered \
                     its IO yet)",
                    self.devices[copier.new].name()
                );
            }
            let _ = copier.thread.join();
        }
        // Likewise an erase still writing a removed spare.
        for (device, thread) in std::mem::take(&mut self.erasing) {
            if !thread.is_finished() {
                eprintln!(
                    "flashraid: waiting for the erase of {} to end (the device has not answered \
                     its IO yet)",
                    self.devices[device].name()
                );
            }
            let _ = thread.join();
        }
    }

    fn serve(&mut self) {
        let mut shutdown: Option<PendingShutdown> = None;
        loop {
            let message = if shutdown.is_some() {
                match self.inbox.recv_timeout(SHUTDOWN_POLL) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else if let Some(at) = self.next_scrub_at {
                match self
                    .inbox
                    .recv_timeout(at.saturating_duration_since(std::time::Instant::now()))
                {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match self.inbox.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return,
                }
            };
            if let (Some(at), None) = (self.next_scrub_at, &shutdown)
                && std::time::Instant::now() >= at
            {
                self.next_scrub_at = self.scrub_interval.map(|i| at + i);
                match self.start_scrub(false) {
                    Ok(()) => self.events.record(
                        &self.metadata,
                        "scrub-started",
                        "scheduled scrub (check) started",
                    ),
                    Err(e) => self.events.record(
                        &self.metadata,
                        "scrub-not-started",
                        &format!("scheduled scrub not started: {e}"),
                    ),
                }
            }
            let message = match message {
                Some(command) if self.metadata.is_read_only() => self.refuse_writing(command),
                message => message,
            };
            match message {
                None => {}
                Some(ToController::Event(
                    _shard,
                    ShardEvent::MemberFailed { member, epoch, .. },
                )) if epoch != self.role_epoch[member.get()] => {
                    // About a device the role has left: another shard reported the same
                    // failure first and a spare took over. The spare did nothing wrong.
                }
                Some(ToController::Event(_shard, ShardEvent::MemberFailed { member, .. }))
                    if self.metadata.role_device(member.get()).is_none() =>
                {
                    // Another shard reported this failure first, it is recorded, and no
                    // spare took the role over (found by review: each shard's report made
                    // its own member-failed event and hook run).
                }
                Some(ToController::Event(
                    _shard,
                    ShardEvent::MemberFailed { member, reason, .. },
                )) => {
                    self.events.record(
                        &self.metadata,
                        "member-failed",
                        &format!("member {} failed ({reason})", member.get()),
                    );
                    self.abandon_copy_for(member);
                    let _ = self.fail(&[member]);
                }
                Some(ToController::Event(_shard, ShardEvent::MemberStalled { member, epoch }))
                    if epoch != self.role_epoch[member.get()] =>
                {
                    // About a device the role has left, as for failures above.
                }
                Some(ToController::Event(_shard, ShardEvent::MemberStalled { member, .. })) => {
                    self.member_stalled(member);
                }
                Some(ToController::Event(
                    shard,
                    ShardEvent::RebuildProgress { done_below, generation, .. },
                )) => {
                    self.rebuild_progress(shard, generation, done_below.0, false);
                }
                Some(ToController::Event(shard, ShardEvent::RebuildDone { generation, .. })) => {
                    self.rebuild_progress(shard, generation, u64::MAX, true);
                }
                Some(ToController::Event(
                    shard,
                    ShardEvent::RebuildStalled { member, stripe, cause },
                )) if self.metadata.past_tolerance() => {
                    // Not a stripe that cannot be read: nothing is left to reconstruct from.
                    let why = self.metadata.failed_past_tolerance().unwrap_or_default();
                    let cursor = self.metadata.rebuild_in_progress().map_or(0, |(_, c)| c.0);
                    self.events.record(
                        &self.metadata,
                        "rebuild-stalled",
                        &format!(
                            "rebuild of member {} stalled at stripe {}: {why}, so nothing is \
                             left to rebuild it from. Stop the array and start it with --force \
                             (which brings back the devices of failed members): the rebuild \
                             then resumes from its recorded cursor, stripe {cursor}",
                            member.get(),
                            stripe.0,
                        ),
                    );
                    self.note_rebuild_stall(shard, stripe, cause);
                }
                Some(ToController::Event(
                    shard,
                    ShardEvent::RebuildStalled { member, stripe, cause: StallCause::Unreadable },
                )) => {
                    self.events.record(
                        &self.metadata,
                        "rebuild-stalled",
                        &format!(
                            "rebuild of member {} stalled at stripe {}: more members are \
                             unreadable there than the level survives, so its data there is \
                             lost unless a member reads again. The rebuild tries again every \
                             {}: a member that reads again, or the stripe written anew, lets \
                             it go on",
                            member.get(),
                            stripe.0,
                            self.rebuild_stall_retry
                        ),
                    );
                    self.note_rebuild_stall(shard, stripe, StallCause::Unreadable);
                }
                Some(ToController::Event(
                    shard,
                    ShardEvent::RebuildStalled { member, stripe, cause: StallCause::Unverifiable },
                )) => {
                    let message = format!(
                        "rebuild of member {} stalled at stripe {}: {}",
                        member.get(),
                        stripe.0,
                        UNVERIFIABLE_STALL
                    );
                    self.events.record(&self.metadata, "rebuild-stalled", &message);
                    self.note_rebuild_stall(shard, stripe, StallCause::Unverifiable);
                }
                Some(ToController::TrustParity(on, reply)) => {
                    self.rebuild_trust_parity = on;
                    if on && let Some(r) = &mut self.rebuild {
                        // Those stalls are over: the shards retry at once. One that stalls
                        // again says so anew (found by review: status showed the old stall,
                        // and `rebuild --trust-parity --wait` gave up on it, for seconds
                        // until the next progress report).
                        for at in &mut r.stalled_at {
                            if at.is_some_and(|(_, cause)| cause == StallCause::Unverifiable) {
                                *at = None;
                            }
                        }
                    }
                    self.broadcast(|| Control::SetRebuildTrustParity(on));
                    let message = if on {
                        "the rebuild may now write reconstructions it cannot verify in regions \
                         left dirty by an unclean shutdown (until the server stops); a stripe \
                         that was being written at that shutdown gets a wrong chunk on the \
                         replacement, and status counts such stripes (rebuild_unverified_stripes)"
                    } else {
                        "the rebuild stalls again at stripes it cannot verify"
                    };
                    self.events.record(&self.metadata, "rebuild-trust-parity", message);
                    let _ = reply.send(Ok(()));
                }
                Some(ToController::Event(shard, ShardEvent::ScrubDone { tally, stopped })) => {
                    self.scrub_done(shard, tally, stopped);
                }
                Some(ToController::Scrub(request, reply)) => {
                    let result = match request {
                        Some(repair) => self.start_scrub(repair).inspect(|()| {
                            let what = if repair { "repair" } else { "check" };
                            let message = format!("scrub ({what}) started");
                            self.events.record(&self.metadata, "scrub-started", &message);
                        }),
                        None => {
                            self.broadcast(|| Control::StopScrub);
                            Ok(())
                        }
                    };
                    let _ = reply.send(result);
                }
                Some(ToController::Replace(old, spare, overwrite, reply)) => {
                    let result = if shutdown.is_some() {
                        Err(ArrayError::Other("the array is shutting down".into()))
                    } else {
                        self.role_to_replace(&old).and_then(|r| self.replace(r, spare, overwrite))
                    };
                    let _ = reply.send(result);
                }
                Some(ToController::CancelReplace(reply)) => {
                    let result = if shutdown.is_some() {
                        // The copy is paused for the stop with its record kept: it starts
                        // over at the next start, where it can be cancelled.
                        Err(ArrayError::Other(
                            "the array is shutting down: its replace starts its copy over at \
                             the next start; cancel it then"
                                .into(),
                        ))
                    } else {
                        self.cancel_replace()
                    };
                    let _ = reply.send(result);
                }
                Some(ToController::RemoveSpare(name, reply)) => {
                    let _ = reply.send(self.remove_spare(&name));
                }
                Some(ToController::SpareErased(device, thread, result)) => {
                    self.spare_erased_late(device, thread, result);
                }
                Some(ToController::AddSpare(spare, overwrite, re_add, reply)) => {
                    let result = self.add_spare(spare, overwrite, re_add).map(|_| ());
                    if let Err(e) = &result {
                        self.events.record(
                            &self.metadata,
                            "spare-not-added",
                            &format!("spare not added: {e}"),
                        );
                    }
                    let _ = reply.send(result);
                }
                Some(ToController::SetRebuildRate { bytes_per_s, busy, reply }) => {
                    // In force as stored (whole MiB/s), so a restart changes nothing.
                    let rate = stored_rate_bytes_per_s(bytes_per_s);
                    let share = rate.div_ceil(u64::from(self.shard_count));
                    let mib = Some(rate_mib_per_s(rate));
                    // Stored with the array: the next start uses it too.
                    let mut tunables = self.metadata.superblock().tunables;
                    if busy {
                        self.broadcast(|| Control::SetRebuildBusyRate(share));
                        tunables.rebuild_busy_rate_mib_per_s = mib;
                    } else {
                        self.rebuild_rate_bytes_per_s = rate;
                        self.broadcast(|| Control::SetRebuildRate(share));
                        tunables.rebuild_rate_mib_per_s = mib;
                        // A running copy takes the new pace from its next step.
                        if let Some(c) = &self.copy {
                            let _ = c.commands.send(crate::copier::CopyCommand::Rate(rate));
                        }
                    }
                    let _ = reply.send(self.store_tunables(tunables));
                }
                Some(ToController::Tune(tunable, reply)) => {
                    let _ = reply.send(self.tune(tunable));
                }
                Some(ToController::Event(_, ShardEvent::ErrorCorrected { member })) => {
                    self.metadata.note_errors_corrected(member, 1);
                }
                Some(ToController::Event(_, ShardEvent::ResyncDone))
                    if self.replace_deferred && shutdown.is_none() =>
                {
                    // One shard's resync is done; a replace waiting for all of them goes on.
                    self.resume_replace();
                }
                Some(ToController::Event(_, ShardEvent::ResyncDone)) => {}
                Some(ToController::FailMember(role, guard, reply)) => {
                    let _ = reply.send(self.fail_by_operator(role, guard));
                }
                Some(ToController::Status(reply)) => {
                    let _ = reply.send(self.status());
                }
                Some(ToController::Shutdown(reply)) => {
                    if shutdown.is_some() {
                        let _ = reply.send(Err(ArrayError::Other("already shutting down".into())));
                        continue;
                    }
                    self.pause_copy_for_stop();
                    let mut acks = vec![];
                    for link in self.reactors.iter() {
                        let (tx, rx) = mpsc::channel();
                        let _ = link.tx.send(ToReactor::Control(Control::CleanShutdown(tx)));
                        link.bell.ring();
                        acks.push(Some(rx));
                    }
                    shutdown = Some(PendingShutdown { reply, acks, clean: true, in_init: true });
                }
                Some(ToController::Stop) => {
                    self.stop_reactors();
                    return;
                }
                Some(ToController::Copy(generation, report)) => {
                    self.copy_report(generation, report)
                }
            }
            // Failures a metadata write left (for example clearing a replace's record).
            self.apply_metadata_failures();
            if let Some(pending) = &mut shutdown {
                let mut lost = false;
                for slot in &mut pending.acks {
                    let Some(rx) = slot else { continue };
                    match rx.try_recv() {
                        Ok((clean, init_left)) => {
                            pending.clean &= clean;
                            pending.in_init &= clean || init_left;
                            *slot = None;
                        }
                        Err(mpsc::TryRecvError::Empty) => {}
                        Err(mpsc::TryRecvError::Disconnected) => lost = true,
                    }
                }
                if lost || pending.acks.iter().all(Option::is_none) {
                    let pending = shutdown.take().expect("set");
                    let result = if lost {
                        Err(ArrayError::Stopped)
                    } else if self.metadata.is_read_only() {
                        Ok(Stopped::Untouched)
                    } else if pending.clean {
                        let refs: Vec<&dyn MetaDevice> =
                            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
                        self.metadata.mark_clean(&refs).map(|()| Stopped::Clean).map_err(Into::into)
                    } else if pending.in_init {
                        // Background init stopped halfway and nothing else is left: record
                        // that the regions left are init's, so the next start trusts
                        // reconstruction there as this session did.
                        let refs: Vec<&dyn MetaDevice> =
                            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
                        self.metadata
                            .mark_stopped_in_init(&refs)
                            .map(|()| Stopped::Dirty)
                            .map_err(Into::into)
                    } else {
                        Ok(Stopped::Dirty)
                    };
                    self.stop_reactors();
                    let _ = pending.reply.send(result);
                    return;
                }
            }
        }
    }

    /// On a read-only array, answer every command that would write to a member (or start
    /// work that does) with `ControlError::ReadOnly`; pass the others on. A check scrub
    /// passes: on a read-only array it writes nothing (engine `scrub`: no read error is
    /// rewritten, no mismatch repaired, no bitmap bit set; its cursor is never stored).
    fn refuse_writing(&mut self, command: ToController) -> Option<ToController> {
        let refused = || Err(ArrayError::from(flashraid_control::ControlError::ReadOnly));
        match command {
            ToController::FailMember(_, _, reply)
            | ToController::SetRebuildRate { reply, .. }
            | ToController::TrustParity(_, reply)
            | ToController::Tune(_, reply)
            | ToController::AddSpare(_, _, _, reply)
            | ToController::Replace(_, _, _, reply)
            | ToController::CancelReplace(reply)
            | ToController::RemoveSpare(_, reply)
            | ToController::Scrub(Some(true), reply) => {
                let _ = reply.send(refused());
                None
            }
            other => Some(other),
        }
    }

    /// Apply a tunable to the running array (`Array::tune`) and store it.
    fn tune(&mut self, tunable: Tunable) -> Result<(), ArrayError> {
        let shards = u64::from(self.shard_count);
        let mib = |bytes: u64| Some(rate_mib_per_s(bytes));
        let mut tunables = self.metadata.superblock().tunables;
        // Rates are in force as stored (whole MiB/s), so a restart changes nothing.
        match tunable {
            Tunable::ResyncRate(rate) => {
                let rate = stored_rate_bytes_per_s(rate);
                self.broadcast(|| Control::SetResyncRate(rate.div_ceil(shards)));
                tunables.resync_rate_mib_per_s = mib(rate);
            }
            Tunable::ScrubRate(rate) => {
                let rate = stored_rate_bytes_per_s(rate);
                self.scrub_rate_bytes_per_s = rate;
                self.broadcast(|| Control::SetScrubRate(rate.div_ceil(shards)));
                tunables.scrub_rate_mib_per_s = mib(rate);
            }
            Tunable::ScrubEveryHours(hours) => {
                self.scrub_interval =
                    (hours > 0).then(|| std::time::Duration::from_secs(u64::from(hours) * 3600));
                self.next_scrub_at = self.scrub_interval.map(|i| std::time::Instant::now() + i);
                tunables.scrub_interval_hours = Some(hours);
            }
            Tunable::MergeWindowUs(us) => {
                self.broadcast(|| Control::SetMergeWindow(u64::from(us)));
                tunables.merge_window_us = Some(us);
            }
            Tunable::MemberTimeoutMs(ms) => {
                self.member_timeout_us = u64::from(ms) * 1000;
                self.broadcast(|| Control::SetMemberTimeout(u64::from(ms) * 1000));
                tunables.member_timeout_ms = Some(ms);
            }
            Tunable::Shards(n) => tunables.shards = Some(n),
            Tunable::QueueDepth(n) => tunables.queue_depth = Some(n),
        }
        self.store_tunables(tunables)
    }

    /// Write `tunables` to the superblocks (a member failing that write is failed).
    fn store_tunables(&mut self, tunables: Tunables) -> Result<(), ArrayError> {
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let stored = self.metadata.set_tunables(&refs, tunables);
        self.apply_metadata_failures();
        stored.map_err(ArrayError::from)
    }

    fn broadcast(&self, control: impl Fn() -> Control) {
        for link in self.reactors.iter() {
            let _ = link.tx.send(ToReactor::Control(control()));
            link.bell.ring();
        }
    }

    /// Send every reactor the control `ask` makes around a reply channel, then wait for
    /// every answer (`None`: that reactor has stopped). All are waited for even when one
    /// fails, so whatever the control lends (a descriptor to duplicate) outlives its use.
    fn ask_every_reactor<T>(&self, ask: impl Fn(Sender<T>) -> Control) -> Vec<Option<T>> {
        let waits: Vec<Receiver<T>> = self
            .reactors
            .iter()
            .map(|link| {
                let (tx, rx) = mpsc::channel();
                let _ = link.tx.send(ToReactor::Control(ask(tx)));
                link.bell.ring();
                rx
            })
            .collect();
        waits.into_iter().map(|rx| rx.recv().ok()).collect()
    }

    /// A shard reports `member` stalled (IO outstanding, none completed for the member
    /// timeout). Failed if the array survives without it, judged on the metadata, which has
    /// every shard's failures in the order they came (a shard alone cannot: another's may be
    /// on its way); else waited out, with an event at most once a minute, since a failure
    /// past the level's tolerance could not be undone when the member answers.
    fn member_stalled(&mut self, member: MemberIndex) {
        let role = member.get();
        let missing = self.metadata.missing_roles();
        if missing.contains(&role) {
            return; // already out of service (failed since, or by another shard's report)
        }
        // A role being rebuilt holds only part of its data: counted as out.
        let geometry = self.metadata.superblock().geometry();
        let unavailable = self.metadata.unavailable_roles(Some(role));
        let ms = self.member_timeout_us / 1000;
        if geometry.survives(&unavailable) {
            self.events.record(
                &self.metadata,
                "member-failed",
                &format!(
                    "member {role} failed (its IO stalled: none of it completed for {ms} ms, \
                     the member timeout); IO it holds still waits for it"
                ),
            );
            self.abandon_copy_for(member);
            let _ = self.fail(&[member]);
            return;
        }
        let noted = &mut self.stall_noted[role];
        if noted.is_none_or(|at| at.elapsed() >= STALL_NOTE_INTERVAL) {
            *noted = Some(std::time::Instant::now());
            self.events.record(
                &self.metadata,
                "member-stalled",
                &format!(
                    "member {role} has completed none of its IO for {ms} ms, but is not \
                     failed: the array would not survive without it; requests waiting for it \
                     wait until it answers"
                ),
            );
        }
    }

    /// `fail ROLE` from the operator (`Array::fail_member_with`): refused past the level's
    /// tolerance unless forced, judged as `member_stalled` judges a stall.
    fn fail_by_operator(&mut self, role: usize, guard: FailGuard) -> Result<(), ArrayError> {
        let member = MemberIndex(u16::try_from(role).expect("fits"));
        let geometry = self.metadata.superblock().geometry();
        let missing = self.metadata.missing_roles();
        // A role being rebuilt holds only part of its data: counted as out.
        let rebuilding = self.metadata.rebuild_in_progress().map(|(r, _)| r.get());
        let unavailable = self.metadata.unavailable_roles(Some(role));
        // `fail ROLE` given twice: the second would fail the spare that took the role over
        // after the first, and stop its rebuild. The operator names a role, not a device,
        // so that is refused unless forced.
        if rebuilding == Some(role) && guard == FailGuard::Refuse {
            let device = self.metadata.role_device(role).map(|d| self.devices[d].name());
            let device = device.unwrap_or_else(|| "its new device".into());
            return Err(ArrayError::Other(format!(
                "role {role} is being rebuilt onto {device} (it took the role over after the \
                 role's member failed): failing role {role} now would fail {device} and stop \
                 its rebuild. Nothing was changed; pass --force to fail that device"
            )));
        }
        // Failing a role already out of service changes nothing the array survives.
        let in_service = !missing.contains(&role);
        if in_service && !geometry.survives(&unavailable) && guard == FailGuard::Refuse {
            let out: Vec<usize> = (0..unavailable.len()).filter(|&r| unavailable[r]).collect();
            let rebuilt = match rebuilding {
                Some(r) if r != role => {
                    format!(" (member {r} is being rebuilt: it holds only part of its data)")
                }
                _ => String::new(),
            };
            return Err(ArrayError::Other(format!(
                "refusing to fail member {role}: {} x{} does not survive members {out:?} out \
                 of service{rebuilt}; the array would fail (writes refused, reads of lost \
                 data errors). Nothing was changed; pass --force to fail it anyway",
                geometry.level(),
                geometry.member_count()
            )));
        }
        let message = format!("member {role} failed (by the operator)");
        self.events.record(&self.metadata, "member-failed", &message);
        self.abandon_copy_for(member);
        match self.fail(&[member]) {
            // The member is failed, as asked; no member is left in service to record it
            // (`fail` has said the array failed).
            Err(ArrayError::Control(flashraid_control::ControlError::NoMetadataQuorum)) => Ok(()),
            result => result,
        }
    }

    fn fail(&mut self, members: &[MemberIndex]) -> Result<(), ArrayError> {
        if self.metadata.is_read_only() {
            // Nothing may be written: the shards stop using the member until the stop, and
            // the next start finds the superblocks as they were (and judges the member then).
            let failed = self.metadata.fail_members_in_memory(members);
            self.apply_failed(&failed);
            let message = format!(
                "members {:?} are out of service until the stop; not recorded on the members \
                 (the array is served read-only)",
                self.metadata.missing_roles()
            );
            self.events.record(&self.metadata, "degraded", &message);
            return Ok(());
        }
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let result = self.metadata.fail_members(&refs, members);
        let all: &[MemberIndex] = match &result {
            Ok(all) => all,
            Err(_) => members,
        };
        self.apply_failed(all);
        if result.is_ok() {
            self.take_spare_if_wanted();
        }
        let missing = self.metadata.missing_roles();
        // A role being rebuilt counts as out (found by review: a failure during a rebuild
        // that took the array past its tolerance said nothing but the rebuild's stall).
        if let Some(why) = self.metadata.failed_past_tolerance() {
            let message = format!(
                "FAILED: {why}: writes are refused and reads of lost data return errors; \
                 nothing is written to the remaining members. To bring it back, stop it and \
                 start it with --force (which brings back the devices of failed members, \
                 the last to fail first){}",
                self.rebuild_kept_for_forced_start()
            );
            self.events.record(&self.metadata, "array-failed", &message);
        } else if !missing.is_empty()
            && self.rebuild.is_none()
            && self
                .stopping_copier
                .as_ref()
                .is_some_and(|c| self.metadata.spare_devices().contains(&c.new))
        {
            let message = format!(
                "degraded: members {missing:?} out of service; the hot spare takes over once a \
                 given-up replace's copy to it has stopped"
            );
            self.events.record(&self.metadata, "degraded", &message);
        } else if !missing.is_empty() && self.rebuild.is_none() {
            let message = format!(
                "degraded: members {missing:?} out of service and no hot spare to take over \
                 (add one with flashraid spare add)"
            );
            self.events.record(&self.metadata, "degraded", &message);
        }
        result.map(|_| ()).map_err(ArrayError::from)
    }

    /// Every reactor registers a device in a free ring slot (one a released device left,
    /// else the next never used); the slot. Should a reactor refuse it, the slot is
    /// released again, so no ring keeps the device.
    fn register_device(&mut self, added: AddedDevice) -> Result<usize, ArrayError> {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if self.next_slot < flashraid_layout::MEMBERS_MAX => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => {
                return Err(ArrayError::Other(
                    "no free device slot (64 members and spares)".into(),
                ));
            }
        };
        let registered = self.register_in_every_reactor(slot, added);
        if registered.is_err() {
            // Some reactors may hold it: none must (a block device would stay claimed).
            let _ = self.release_slot(slot);
        }
        registered.map(|()| slot)
    }

    fn register_in_every_reactor(
        &mut self,
        slot: usize,
        added: AddedDevice,
    ) -> Result<(), ArrayError> {
        let answers =
            self.ask_every_reactor(|done| Control::AddDevice { slot, device: added.clone(), done });
        answers
            .into_iter()
            .map(|answer| match answer {
                None => Err(ArrayError::Stopped),
                Some(r) => {
                    r.map_err(|e| ArrayError::Other(format!("a reactor cannot use the spare: {e}")))
                }
            })
            .find(Result::is_err)
            .unwrap_or(Ok(()))
    }

    /// Every reactor lets go of the device in ring slot `slot` (its duplicate descriptor is
    /// replaced by one of /dev/null); the slot is then free for the next device added,
    /// unless it is one of the roles' first slots, which hold the devices present at the
    /// start and are never handed out again (slots for devices added while running are
    /// given after them), or a failed role still maps to it (`detached_slots`). On an error
    /// the slot is left as it is, never reused.
    fn release_slot(&mut self, slot: usize) -> Result<(), String> {
        let placeholder = std::os::fd::AsRawFd::as_raw_fd(&self.placeholder);
        let answers =
            self.ask_every_reactor(|done| Control::ReleaseDevice { slot, placeholder, done });
        let outcome = answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err("a reactor has stopped".into())))
            .find(Result::is_err)
            .unwrap_or(Ok(()));
        if outcome.is_ok() && slot >= self.role_slots.len() {
            assert!(
                !self.free_slots.contains(&slot) && !self.detached_slots.contains(&slot),
                "slot {slot} released twice"
            );
            if self.role_slots.contains(&slot) {
                self.detached_slots.push(slot);
            } else {
                self.free_slots.push(slot);
            }
        }
        outcome
    }

    /// Let go of device `index` (a spare removed and erased): every ring drops it, and the
    /// server closes it, so a block device is no longer claimed (`O_EXCL`) and can be used
    /// elsewhere. Its entry keeps its name (`MemberDevice::Released`) until a device added
    /// later takes the index. Returns what could not be done, for the event's message.
    fn release_device(&mut self, index: usize) -> Option<String> {
        assert!(!self.metadata.lists(index), "device {index} is released while the array lists it");
        let problem = match self.registered[index] {
            Some(slot) => self.release_slot(slot).err(),
            None => None,
        };
        // Either way the entry leaves its slot: after a failed release the rings may disagree
        // about what the slot holds, so it is never used again (not on the free lists), and
        // the device, if added again, is registered afresh.
        self.registered[index] = None;
        if problem.is_none() {
            // Dropping the `Device` closes the server's own descriptor.
            self.devices[index] = MemberDevice::Released(self.devices[index].name());
        }
        problem
    }

    fn add_spare(
        &mut self,
        spare: NewSpare,
        overwrite: Overwrite,
        re_add: ReAdd,
    ) -> Result<usize, ArrayError> {
        // A device this server already holds open (a member that failed): it is registered
        // already, so it only needs listing again.
        let name = spare.name();
        // (`names_device` names no released device.)
        if let Some(index) = self.devices.iter().position(|d| names_device(d, &name)) {
            if self.erasing.iter().any(|&(d, _)| d == index) {
                return Err(ArrayError::Other(format!(
                    "{name} was removed and its superblocks are still being erased (the device \
                     has not answered): add it once the erase has ended"
                )));
            }
            if self.registered[index].is_none() {
                // Held open but left out at the start (a former spare of this array, absent
                // when it last started): the reactors learn of it now.
                let added = match &self.devices[index] {
                    MemberDevice::Device(d) => AddedDevice::Fd(d.raw_fd()),
                    MemberDevice::Memory(m) => AddedDevice::Memory(m.clone()),
                    MemberDevice::Released(_) => unreachable!("released devices are not held"),
                };
                self.registered[index] = Some(self.register_device(added)?);
            }
            return self.list_spare(index, overwrite, re_add, Listing::Again).map(|()| index);
        }
        let memory = self.devices.iter().any(|d| matches!(d, MemberDevice::Memory(_)));
        let (device, added) = match spare {
            NewSpare::Path(_) if memory => {
                return Err(ArrayError::Other("an in-memory array takes no device files".into()));
            }
            NewSpare::Memory(_) if !memory => {
                return Err(ArrayError::Other("a device array takes no in-memory spare".into()));
            }
            NewSpare::Path(path) => {
                let device = Device::open(&path, Access::ReadWrite)
                    .map_err(|e| ArrayError::Device(e.to_string()))?;
                let fd = device.raw_fd();
                (MemberDevice::Device(device), AddedDevice::Fd(fd))
            }
            NewSpare::Memory(m) => (MemberDevice::Memory(m.clone()), AddedDevice::Memory(m)),
        };
        let name = device.name();
        let stale = self.stale_names(&device);
        // Every reactor registers it first (nothing is written yet): a spare the metadata
        // lists is then always one every reactor can address.
        let slot = self.register_device(added)?;
        // The index a released device left (one of the same name first), else a new one:
        // the device table stays within the slots' bound however often spares come and go.
        let reused = self
            .devices
            .iter()
            .position(|d| d.is_released() && d.name() == name)
            .or_else(|| self.devices.iter().position(MemberDevice::is_released));
        let index = match reused {
            Some(index) => {
                self.devices[index] = device;
                self.registered[index] = Some(slot);
                index
            }
            None => {
                self.devices.push(device);
                self.registered.push(Some(slot));
                self.devices.len() - 1
            }
        };
        let added = self.list_spare(index, overwrite, re_add, Listing::New);
        if !self.metadata.lists(index) {
            // Refused (it holds data, is too small...), or dropped because its own
            // superblock write failed: the server lets go of it at once, or a block device
            // would stay claimed until the server stops.
            if let Some(problem) = self.release_device(index) {
                eprintln!(
                    "flashraid: {name} is not in the array but could not be let go: {problem}"
                );
            }
            if index + 1 == self.devices.len() && self.metadata.known_devices() <= index {
                // Never counted by the metadata: the table shrinks back (even if a ring
                // could not let go, the next device must take the index the metadata
                // expects).
                self.devices.pop();
                self.registered.pop();
            }
        }
        if added.is_ok() {
            self.let_go_of_stale_names(&stale, &name);
        }
        added.map(|()| index)
    }

    /// Devices the server holds under a name that now leads to `device`, just opened and
    /// about to be added (a disk swapped at a by-path name, a file recreated, a symlink
    /// retargeted), and that the array no longer lists: not the devices those names mean
    /// any more.
    fn stale_names(&self, device: &MemberDevice) -> Vec<usize> {
        let new_name = device.name();
        (0..self.devices.len())
            .filter(|&d| {
                let held = self.devices[d].name();
                self.held_unlisted(d) && (held == new_name || names_device(device, &held))
            })
            .collect()
    }

    /// Once the device their names now lead to is in the array, let go of `stale` devices
    /// (`stale_names`). Nothing is let go if the add fails: the old device of a file
    /// recreated at its path exists nowhere else. One a replace's copy may still use stays
    /// held (`status` lists it; `spare remove` by its name lets go of it later, before a
    /// spare of the same name); one being erased is let go when its erase ends.
    fn let_go_of_stale_names(&mut self, stale: &[usize], new_name: &str) {
        for &d in stale {
            let old_name = self.devices[d].name();
            if self.metadata.lists(d) || self.erasing.iter().any(|&(e, _)| e == d) {
                continue;
            }
            if self.copy.is_some() || self.stopping_copier.is_some() {
                let message = format!(
                    "{old_name} now leads to {new_name}; the old device the server holds under \
                     that name stays held while a replace's copy runs (`spare remove \
                     {old_name}` lets go of it then)"
                );
                self.events.record(&self.metadata, "member-kept", &message);
                continue;
            }
            let message = match self.release_device(d) {
                None => format!(
                    "{old_name} now leads to {new_name}: the old device the server held under \
                     that name, no longer in the array, is let go; the server has closed it"
                ),
                Some(problem) => format!(
                    "{old_name} now leads to {new_name}; the old device the server holds under \
                     that name could not be let go ({problem})"
                ),
            };
            self.events.record(&self.metadata, "member-released", &message);
        }
    }

    /// List device `index` (registered in every reactor, not in the array) as a hot spare,
    /// or re-add it as the member it was. A device the array does not list afterwards (its
    /// own superblock write failed as it was listed, or as it took a role over) is an
    /// error.
    fn list_spare(
        &mut self,
        index: usize,
        overwrite: Overwrite,
        re_add: ReAdd,
        how: Listing,
    ) -> Result<(), ArrayError> {
        // Before a re-add is tried, whose refusal would say it "becomes a spare".
        if let Some(what) = self.metadata.listed_as(index) {
            let device = self.devices[index].name();
            return Err(flashraid_control::ControlError::AlreadyListed { device, what }.into());
        }
        if self.try_re_add(index, re_add)? {
            return Ok(());
        }
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let uuid = random_uuid()?;
        let listed = self.metadata.add_spare(&refs, index, uuid, overwrite);
        self.apply_metadata_failures();
        listed?;
        let name = self.devices[index].name();
        if self.metadata.lists(index) {
            let message = match how {
                Listing::New => format!("hot spare {name} added"),
                Listing::Again => format!("{name} is a hot spare again"),
            };
            self.events.record(&self.metadata, "spare-added", &message);
            self.take_spare_if_wanted();
        }
        if !self.metadata.lists(index) {
            return Err(ArrayError::Other(format!(
                "{name} is not in the array after all: a write to it failed as it was listed"
            )));
        }
        Ok(())
    }

    /// Whether the server holds device `index` (not released) though the array no longer
    /// lists it: a failed member, a former spare left out at the start, an old device a
    /// name no longer leads to.
    fn held_unlisted(&self, index: usize) -> bool {
        !self.devices[index].is_released() && !self.metadata.lists(index)
    }

    /// The role `old` names (`Array::replace_named`): a role's device held under that name
    /// first, else one the named file is.
    fn role_to_replace(&self, old: &ReplaceOld) -> Result<usize, ArrayError> {
        let name = match old {
            ReplaceOld::Role(role) => return Ok(*role),
            ReplaceOld::Named(name) => name,
        };
        let roles = 0..self.metadata.superblock().geometry().member_count();
        let held = |r: &usize| self.metadata.role_device(*r).map(|d| &self.devices[d]);
        let by_name = roles.clone().find(|r| held(r).is_some_and(|d| same_name(&d.name(), name)));
        let by_identity = || roles.clone().find(|r| held(r).is_some_and(|d| names_device(d, name)));
        by_name.or_else(by_identity).ok_or_else(|| {
            ArrayError::Other(format!(
                "{name} is not a member of this array in service (`status` lists the members)"
            ))
        })
    }

    fn replace(
        &mut self,
        role: usize,
        spare: NewSpare,
        overwrite: Overwrite,
    ) -> Result<(), ArrayError> {
        if self.rebuild.is_some() {
            return Err(ArrayError::Other("a rebuild is running; replace once it is done".into()));
        }
        if self.copy.is_some() {
            return Err(ArrayError::Other("a replace is running; one at a time".into()));
        }
        if self.resync_pending() {
            return Err(ArrayError::Other(RESYNC_PENDING_REPLACE.into()));
        }
        if let Some(c) = &self.stopping_copier {
            return Err(ArrayError::Other(format!(
                "the last replace's copy to {} has not stopped yet (a device has not answered \
                 its IO): try again once it has",
                self.devices[c.new].name()
            )));
        }
        let missing = self.metadata.missing_roles();
        if let Some(why) = self.metadata.failed_past_tolerance() {
            // Found by review: the advice below (add a spare) cannot help a failed array.
            return Err(ArrayError::Other(format!(
                "the array has failed ({why}), so nothing can be copied or rebuilt. Stop it \
                 and start it with --force, which brings back the devices of failed members"
            )));
        }
        if !missing.is_empty() {
            return Err(ArrayError::Other(format!(
                "members {missing:?} are failed: add a spare for them first (a new spare \
                 would take their role, not member {role}'s)"
            )));
        }
        if self.metadata.superblock().geometry().tolerance() == 0 {
            return Err(ArrayError::Other(format!(
                "{} has no redundancy: failing member {role} to swap it would fail the array",
                self.metadata.superblock().level
            )));
        }
        let old = self.metadata.role_device(role).expect("no role is missing");
        let name = spare.name();
        // A device already listed as a spare (a replace given up, or a restart during the
        // copy) is used as it is; anything else is added as a spare first.
        let listed = self
            .metadata
            .spare_devices()
            .iter()
            .copied()
            .find(|&d| names_device(&self.devices[d], &name));
        let new = match listed {
            Some(index) => index,
            None => Some(self.add_spare(spare, overwrite, ReAdd::Never)?)
                .filter(|d| self.metadata.spare_devices().contains(d))
                .ok_or_else(|| {
                    ArrayError::Other("the new device is not a spare of this array".into())
                })?,
        };
        if matches!(self.devices[old], MemberDevice::Memory(_)) {
            // In-memory members cannot be read while the reactors write them (no device
            // serves overlapping accesses there): rebuild instead, as before copies.
            let message = format!(
                "member {role} is being replaced by {name} (in-memory members are not copied: \
                 it is rebuilt from the others)"
            );
            self.events.record(&self.metadata, "member-failed", &message);
            self.preferred_spare = Some(new);
            let result = self.fail(&[MemberIndex(u16::try_from(role).expect("fits"))]);
            self.preferred_spare = None;
            return result;
        }
        // Recorded first: a stop during the copy starts it over at the next start.
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let role_index = MemberIndex(u16::try_from(role).expect("fits"));
        let recorded = self.metadata.set_replacing(&refs, new, Some(role_index));
        self.apply_metadata_failures();
        recorded?;
        if self.metadata.role_device(role).is_none()
            || !self.metadata.spare_devices().contains(&new)
        {
            self.clear_replacing(new);
            return Err(ArrayError::Other("a device failed while the replace was recorded".into()));
        }
        // Every shard records what is written from now on, before the first byte is copied.
        let acks = self.ask_every_reactor(|done| Control::CopyRecording(true, done));
        if acks.iter().any(Option::is_none) {
            // A reactor is gone: the others must not record for good.
            self.broadcast_copy_recording(false);
            self.clear_replacing(new);
            return Err(ArrayError::Stopped);
        }
        let (MemberDevice::Device(old_device), MemberDevice::Device(new_device)) =
            (&self.devices[old], &self.devices[new])
        else {
            unreachable!("in-memory members are rebuilt above, and spares match the members");
        };
        let handles = old_device.try_clone().and_then(|o| Ok((o, new_device.try_clone()?)));
        let (old_handle, new_handle) = match handles {
            Ok(h) => h,
            Err(e) => {
                self.broadcast_copy_recording(false);
                self.clear_replacing(new);
                return Err(ArrayError::Other(format!("the copy cannot open its devices: {e}")));
            }
        };
        self.copy_generation = self.copy_generation.wrapping_add(1);
        let total_bytes = self.metadata.superblock().member_data_bytes;
        let job = crate::copier::CopyJob {
            generation: self.copy_generation,
            old: old_handle,
            new: new_handle,
            data_offset_bytes: self.metadata.superblock().data_offset_bytes,
            total_bytes,
            rate_bytes_per_s: self.rebuild_rate_bytes_per_s,
            report: self.to_self.clone(),
        };
        let (commands, thread) = match crate::copier::spawn(job) {
            Ok(started) => started,
            Err(e) => {
                self.broadcast_copy_recording(false);
                self.clear_replacing(new);
                return Err(ArrayError::Other(format!("the copy thread did not start: {e}")));
            }
        };
        self.copy = Some(RunningCopy {
            role: MemberIndex(u16::try_from(role).expect("fits")),
            new,
            done_bytes: 0,
            total_bytes,
            started: std::time::Instant::now(),
            copier: Copier { generation: self.copy_generation, new, thread },
            commands,
        });
        let message = format!(
            "member {role} is being replaced by {}: copying its data while the array keeps \
             its redundancy",
            self.devices[new].name()
        );
        self.events.record(&self.metadata, "replace-started", &message);
        Ok(())
    }

    /// A copier's report. Progress and the end of the running copy; the end of a copier
    /// told to stop frees its device (a spare may be wanted).
    fn copy_report(&mut self, generation: u32, report: crate::copier::CopyReport) {
        use crate::copier::{CopyReport, CopySide};
        if self.stopping_copier.as_ref().is_some_and(|c| c.generation == generation) {
            if report.is_final() {
                let c = self.stopping_copier.take().expect("checked");
                let _ = c.thread.join();
                self.take_spare_if_wanted();
            }
            return;
        }
        let Some(running) = self.copy.as_mut().filter(|c| c.copier.generation == generation) else {
            return; // a copier already joined: nothing of it is left
        };
        if let CopyReport::Progress { done_bytes } = report {
            running.done_bytes = done_bytes;
            return;
        }
        let c = self.copy.take().expect("checked");
        let _ = c.copier.thread.join(); // it sent its final report: it is ending
        match report {
            CopyReport::Done => self.finish_copy(c.role, c.new, c.started),
            CopyReport::Failed { side: CopySide::ReadOld, error } => {
                // The old member has a bad range: reconstruction will have to do.
                let why = format!("reading the old member failed ({error})");
                self.copy_given_up(c.role, c.new, &why);
                let message = format!("member {} failed (it could not be copied)", c.role.get());
                self.events.record(&self.metadata, "member-failed", &message);
                self.preferred_spare = Some(c.new);
                let _ = self.fail(&[c.role]);
                self.preferred_spare = None;
            }
            CopyReport::Failed { side, error } => {
                let what = if side == CopySide::SyncNew { "syncing" } else { "writing" };
                let why = format!("{what} the new device failed ({error})");
                self.copy_given_up(c.role, c.new, &why);
            }
            // Only a copier told to stop stops (and then it is `stopping_copier`).
            CopyReport::Stopped | CopyReport::Progress { .. } => {
                self.copy_given_up(c.role, c.new, "its copier stopped");
            }
        }
    }

    /// The copy is complete and the new device synced (by the copier): fail the old member
    /// and give the new device its role with a partial rebuild of the regions written since
    /// the copy began.
    fn finish_copy(&mut self, role: MemberIndex, new: usize, started: std::time::Instant) {
        if !self.metadata.spare_devices().contains(&new) {
            // It failed a metadata write meanwhile and was dropped from the spares.
            self.copy_given_up(role, new, "the new device is no longer a spare of this array");
            return;
        }
        let message = format!(
            "member {} is replaced (copied to {} in {:.1?}; failed by the operator)",
            role.get(),
            self.devices[new].name(),
            started.elapsed()
        );
        self.events.record(&self.metadata, "member-failed", &message);
        self.preferred_spare = Some(new);
        self.takeover_partial = Some(role);
        let _ = self.fail(&[role]);
        self.preferred_spare = None;
        self.takeover_partial = None;
        // The shards that started the partial rebuild keep recording (the role is out of
        // service until it ends); those that did not (the takeover failed) stop.
        self.broadcast_copy_recording(false);
    }

    /// The array stops during a copy: the copier is told to stop, and the superblocks keep
    /// the replace recorded, so the next start copies again from the beginning.
    fn pause_copy_for_stop(&mut self) {
        let Some((role, new)) = self.stop_copier() else { return };
        self.broadcast_copy_recording(false);
        let message = format!(
            "the replace of member {} by {} stops with the array: its copy starts over at the \
             next start",
            role.get(),
            self.devices[new].name()
        );
        self.events.record(&self.metadata, "replace-paused", &message);
    }

    /// The operator gives up the running copy (`Array::cancel_replace`).
    fn cancel_replace(&mut self) -> Result<(), ArrayError> {
        if self.copy.is_some() {
            self.abandon_copy("cancelled by the operator");
            return Ok(());
        }
        if let Some((role, device)) = self.metadata.replacing().filter(|_| self.replace_deferred) {
            // Waiting for resync (which may have stopped for good at a stripe it cannot
            // vouch for): given up like a running one (found by review: it could not be).
            self.replace_deferred = false;
            self.clear_replacing(device);
            let message = format!(
                "the replace of member {} by {}, waiting for resync, is cancelled by the \
                 operator: it stays a hot spare",
                role.get(),
                self.devices[device].name()
            );
            self.events.record(&self.metadata, "replace-abandoned", &message);
            return Ok(());
        }
        if let Some(r) = self.rebuild.as_ref().filter(|_| self.metadata.rebuild_is_partial()) {
            // A finished copy's takeover and a re-added member look alike from here.
            return Err(ArrayError::Other(format!(
                "no replace is copying: a partial rebuild of member {} runs (a replace whose \
                 copy is done, or a member re-added); it cannot be cancelled",
                r.role.get()
            )));
        }
        Err(ArrayError::Other("no replace is running".into()))
    }

    /// Take hot spare `name` out of the array (`Array::remove_spare`).
    fn remove_spare(&mut self, name: &str) -> Result<(), ArrayError> {
        let spares = self.metadata.spare_devices();
        // The spares and the devices held but no longer listed: by the name the server holds
        // one under first (as status lists it, even if it now leads to another file), then
        // by the identity of the file the given name leads to.
        let candidates: Vec<usize> = (0..self.devices.len())
            .filter(|&d| spares.contains(&d) || self.held_unlisted(d))
            .collect();
        // Two may carry the name (an old device kept while a copy ran, and the new one
        // added under its name): the one no longer listed is meant, as the name no longer
        // leads to it.
        let by_name = |unlisted: bool| {
            candidates.iter().copied().find(|&d| {
                spares.contains(&d) != unlisted && same_name(&self.devices[d].name(), name)
            })
        };
        let found = by_name(true)
            .or_else(|| by_name(false))
            .or_else(|| candidates.iter().copied().find(|&d| names_device(&self.devices[d], name)));
        let Some(device) = found.filter(|d| spares.contains(d)) else {
            if let Some(device) = found {
                return self.release_former_member(device);
            }
            let listed: Vec<String> = spares.iter().map(|&d| self.devices[d].name()).collect();
            let listed = if listed.is_empty() { "none".to_string() } else { listed.join(", ") };
            return Err(ArrayError::Other(format!(
                "{name} is not a hot spare of this array (its spares: {listed})"
            )));
        };
        if self.copy.as_ref().is_some_and(|c| c.new == device) {
            return Err(ArrayError::Other(format!(
                "a replace is copying to {name}: cancel it first (`flashraid replace --cancel`)"
            )));
        }
        if self.stopping_copier.as_ref().is_some_and(|c| c.new == device) {
            return Err(ArrayError::Other(format!(
                "the copy of a replace given up is still writing {name} (a device has not \
                 answered its IO): try again once it has stopped"
            )));
        }
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let removed = self.metadata.remove_spare(&refs, device);
        self.apply_metadata_failures();
        removed?;
        let name = self.devices[device].name();
        let message = match self.spawn_erase(device) {
            Err(e) => {
                let released = self.released_message(device);
                format!(
                    "hot spare {name} removed; its superblocks could not be erased ({e}): \
                     {ERASE_FAILED_ADVICE}; {released}"
                )
            }
            Ok((quick_rx, thread)) => match quick_rx.recv_timeout(ERASE_WAIT) {
                Ok(result) => {
                    let _ = thread.join(); // it has only its inbox message left to send
                    let released = self.released_message(device);
                    format!("{}; {released}", erased_message(&name, &result))
                }
                Err(_) => {
                    self.erasing.push((device, thread));
                    format!(
                        "hot spare {name} removed; erasing its superblocks is still waiting for \
                         the device (an event says when it ends)"
                    )
                }
            },
        };
        self.events.record(&self.metadata, "spare-removed", &message);
        Ok(())
    }

    /// `spare remove` of a failed member no longer in the array (`mdadm --remove` of a
    /// faulty device): the server lets go of it, so a block device can be pulled or used
    /// elsewhere. Its superblocks are kept: it is this array's, stale, and `spare add`
    /// takes it back (re-added with only what it missed where the map allows).
    fn release_former_member(&mut self, device: usize) -> Result<(), ArrayError> {
        let name = self.devices[device].name();
        if self.erasing.iter().any(|&(d, _)| d == device) {
            return Err(ArrayError::Other(format!(
                "{name} was removed and its superblocks are still being erased (the device \
                 has not answered): the server lets go of it once the erase has ended"
            )));
        }
        if self.copy.is_some() || self.stopping_copier.is_some() {
            // A copier reads the old member through a descriptor of its own.
            return Err(ArrayError::Other(format!(
                "a replace's copy is running or stopping: let go of {name} once it has ended"
            )));
        }
        let message = match self.release_device(device) {
            None => format!(
                "{name}, no longer in the array, is let go; its superblocks are kept (`spare \
                 add` takes it back); the server has closed it"
            ),
            Some(problem) => format!(
                "{name}, no longer in the array, could not be let go ({problem}): the server \
                 holds it until it stops"
            ),
        };
        self.events.record(&self.metadata, "member-released", &message);
        Ok(())
    }

    /// Start erasing removed spare `device`'s superblocks on a thread of its own: a spare
    /// removed because it stopped answering must not hold the controller (status, failures,
    /// flushes) with it. The thread sends its outcome on the returned channel (the controller
    /// waits there up to `ERASE_WAIT`) and to the controller's inbox (`SpareErased`, for an
    /// erase that outlasts the wait).
    fn spawn_erase(
        &self,
        device: usize,
    ) -> Result<(Receiver<EraseOutcome>, std::thread::JoinHandle<()>), String> {
        let handle = match &self.devices[device] {
            MemberDevice::Device(d) => {
                MemberDevice::Device(d.try_clone().map_err(|e| e.to_string())?)
            }
            MemberDevice::Memory(m) => MemberDevice::Memory(m.clone()),
            MemberDevice::Released(_) => {
                unreachable!("a removed spare is released after its erase")
            }
        };
        let (quick, quick_rx) = mpsc::channel();
        let inbox = self.to_self.clone();
        let thread = std::thread::Builder::new()
            .name("flashraid-erase".into())
            .spawn(move || {
                let result =
                    flashraid_control::erase_superblocks(&handle).map_err(|e| e.to_string());
                let _ = quick.send(result.clone());
                let thread = std::thread::current().id();
                let _ = inbox.send(ToController::SpareErased(device, thread, result));
            })
            .map_err(|e| e.to_string())?;
        Ok((quick_rx, thread))
    }

    /// The erase of a removed spare that outlasted `ERASE_WAIT` ended (an erase that ended
    /// within it was reported already: its message is ignored here, and matches no entry
    /// of `erasing` even if a later erase of a device at the same index waits there).
    fn spare_erased_late(
        &mut self,
        device: usize,
        thread: std::thread::ThreadId,
        result: EraseOutcome,
    ) {
        let ours = |&(d, ref t): &(usize, std::thread::JoinHandle<()>)| {
            d == device && t.thread().id() == thread
        };
        let Some(at) = self.erasing.iter().position(ours) else { return };
        let (_, thread) = self.erasing.swap_remove(at);
        let _ = thread.join();
        let name = self.devices[device].name();
        let released = self.released_message(device);
        let message = format!("{}; {released}", erased_message(&name, &result));
        self.events.record(&self.metadata, "spare-erased", &message);
    }

    /// Release removed spare `device` (`release_device`) and say how that went.
    fn released_message(&mut self, device: usize) -> String {
        match self.release_device(device) {
            None => "the server has closed it".to_string(),
            Some(problem) => {
                format!("the server could not let go of it ({problem}) and holds it until it stops")
            }
        }
    }

    /// Give up a running copy: its copier is told to stop (until it says it has, its device
    /// is kept out of service) and the new device stays a hot spare.
    fn abandon_copy(&mut self, why: &str) {
        if let Some((role, new)) = self.stop_copier() {
            self.copy_given_up(role, new, why);
        }
    }

    /// Tell the running copy's copier to stop (dropping its command channel) and keep it as
    /// `stopping_copier` until its final report; the role and the new device it copied.
    fn stop_copier(&mut self) -> Option<(MemberIndex, usize)> {
        let c = self.copy.take()?;
        drop(c.commands);
        self.stopping_copier = Some(c.copier);
        Some((c.role, c.new))
    }

    fn copy_given_up(&mut self, role: MemberIndex, new: usize, why: &str) {
        self.clear_replacing(new);
        let message = format!(
            "the replace of member {} is given up ({why}): {} stays a hot spare",
            role.get(),
            self.devices[new].name()
        );
        self.events.record(&self.metadata, "replace-abandoned", &message);
        self.broadcast_copy_recording(false);
    }

    /// A member failed during a copy: give the copy up. If it is the member being replaced,
    /// its replacement is the preferred spare to take over (rebuilt in full): at once if its
    /// copier has stopped, else another free spare takes the role, or, with none, the
    /// replacement does once its copier has stopped.
    fn abandon_copy_for(&mut self, failed: MemberIndex) {
        let Some(c) = self.copy.as_ref() else { return };
        let (role, new) = (c.role, c.new);
        self.abandon_copy(&format!("member {} failed during the copy", failed.get()));
        if role == failed {
            self.preferred_spare = Some(new);
        }
    }

    fn broadcast_copy_recording(&self, on: bool) {
        for link in self.reactors.iter() {
            let (tx, _rx) = mpsc::channel();
            let _ = link.tx.send(ToReactor::Control(Control::CopyRecording(on, tx)));
            link.bell.ring();
        }
    }

    fn start_scrub(&mut self, repair: bool) -> Result<(), ArrayError> {
        // (`refuse_writing` answers an operator's repair first; this covers every caller.)
        if repair && self.metadata.is_read_only() {
            return Err(flashraid_control::ControlError::ReadOnly.into());
        }
        if self.rebuild.is_some() {
            let what = redundancy_word(self.metadata.superblock().level);
            return Err(ArrayError::Other(format!(
                "a rebuild is running: scrub once it is done ({what} cannot be checked \
                 against a member being rebuilt)"
            )));
        }
        if self.shard_statuses().iter().any(|s| s.resyncing) {
            return Err(ArrayError::Other(
                "resync after an unclean shutdown is still running: scrub once it is done".into(),
            ));
        }
        // Degraded parity arrays are checked with the redundancy left (the engine's scrub
        // computes the missing chunks); mirrors, and arrays with no redundancy left, are not.
        let out = self.metadata.missing_roles().len();
        let geometry = self.metadata.superblock().geometry();
        let parity = geometry.parity_chunks();
        let mirrors = matches!(geometry.level(), Level::Raid1 | Level::Raid10);
        if out > 0 && mirrors {
            return Err(ArrayError::Other(format!(
                "the array is degraded ({out} member(s) out of service): mirror levels are \
                 scrubbed with every member in service; replace the failed member first"
            )));
        }
        if out > 0 && out >= parity {
            return Err(ArrayError::Other(format!(
                "the array is degraded ({out} member(s) out of service) and has no redundancy \
                 left to check parity with; replace the failed member first"
            )));
        }
        let share = self.scrub_rate_bytes_per_s.div_ceil(u64::from(self.shard_count));
        self.broadcast(|| Control::StartScrub { repair, rate_bytes_per_s: share });
        self.scrub = Some(RunningScrub {
            repair,
            out_at_start: out,
            started: std::time::Instant::now(),
            finished: None,
            done: vec![None; self.reactors.len()],
        });
        Ok(())
    }

    fn scrub_done(
        &mut self,
        shard: u32,
        tally: flashraid_engine::ScrubTally,
        stopped: Option<&'static str>,
    ) {
        let Some(s) = &mut self.scrub else { return };
        s.done[usize::try_from(shard).expect("fits")] = Some((tally, stopped));
        if s.done.iter().all(Option::is_some) && s.finished.is_none() {
            s.finished = Some(std::time::Instant::now());
            let mut total = flashraid_engine::ScrubTally::default();
            for (t, _) in s.done.iter().flatten() {
                total.add(t);
            }
            let why = s.done.iter().flatten().find_map(|(_, w)| *w);
            // Degraded at the start, or since (a member failed while it ran: the stripes after
            // that were checked degraded).
            let out_now = self.metadata.missing_roles().len();
            let what = match (s.repair, s.out_at_start.max(out_now)) {
                (true, 0) => "repair",
                (false, 0) => "check",
                // Read errors are rewritten; mismatches are only counted (engine `scrub`).
                (true, _) => "repair, degraded: mismatches counted, not repaired",
                (false, _) => "check, degraded",
            };
            let ended = why.map_or("finished".to_string(), |w| format!("stopped early ({w})"));
            self.events.record(
                &self.metadata,
                "scrub-finished",
                &format!(
                    "scrub ({what}) {ended}: {} stripes checked, {} mismatched ({} located), \
                     {} repaired, {} read errors rewritten{}, {} unreadable{}",
                    total.stripes_checked - total.untrusted,
                    total.mismatches,
                    total.located,
                    total.repaired,
                    total.read_errors_repaired,
                    if total.read_errors_left > 0 {
                        format!(
                            ", {} read errors left as they are (served read-only, or in a \
                             stripe whose parity disagrees)",
                            total.read_errors_left
                        )
                    } else {
                        String::new()
                    },
                    total.unreadable,
                    if total.untrusted > 0 {
                        format!(
                            ", {} passed over (written at an unclean stop, not resynced while \
                             a member is out)",
                            total.untrusted
                        )
                    } else {
                        String::new()
                    }
                ),
            );
        }
    }

    fn scrub_status(&self, shards: &[ShardStatus]) -> Option<ScrubProgress> {
        let s = self.scrub.as_ref()?;
        let mut tally = flashraid_engine::ScrubTally::default();
        let mut stopped = None;
        // Finished shards report through their events; running ones through status.
        for (i, status) in shards.iter().enumerate() {
            match (s.done.get(i).copied().flatten(), status.scrub) {
                (Some((t, why)), _) => {
                    tally.add(&t);
                    stopped = stopped.or(why);
                }
                (None, Some(live)) => tally.add(&live.tally),
                (None, None) => {}
            }
        }
        let end = s.finished.unwrap_or_else(std::time::Instant::now);
        Some(ScrubProgress {
            repair: s.repair,
            running: s.finished.is_none(),
            tally,
            stopped: stopped.map(str::to_string),
            seconds: end.duration_since(s.started).as_secs_f64(),
        })
    }

    /// Device `index` (registered) as its own failed role come back, if `re_add` allows and
    /// the metadata says it can: it takes the role back and a partial rebuild starts. False
    /// when it is not re-added (the caller adds it as a spare; the event log says why when
    /// it is a former member that could not be); an error when it could be but a rebuild is
    /// running (made a spare, it would lose that for good), and while the array is failed
    /// past its tolerance (nothing could rebuild it, and a forced start may need it as it is).
    fn try_re_add(&mut self, index: usize, re_add: ReAdd) -> Result<bool, ArrayError> {
        if re_add == ReAdd::Never {
            return Ok(false);
        }
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let name = self.devices[index].name();
        let role = match self.metadata.re_add_check(&refs, index) {
            Ok(role) => role,
            Err(ReAddRefusal::NotAMember) => return Ok(false),
            Err(why @ ReAddRefusal::Busy(_)) => {
                // Not silently a spare: it would get a new identity and a full rebuild.
                return Err(ArrayError::Other(format!(
                    "{name} is a member of this array that {why}: add it again then, or now \
                     with --full-rebuild to rebuild it in full"
                )));
            }
            Err(why @ ReAddRefusal::PastTolerance(_)) => {
                // Not a spare either: a new identity would lose what a forced start needs.
                return Err(ArrayError::Other(format!(
                    "{name} is this array's failed member, not re-added: {why} (`spare add \
                     --full-rebuild --force` makes it a spare anyway, its contents lost)"
                )));
            }
            Err(ReAddRefusal::Refused(why)) => {
                self.events.record(
                    &self.metadata,
                    "re-add-refused",
                    &format!("{name} is not re-added ({why}): it becomes a spare"),
                );
                return Ok(false);
            }
        };
        let taken = self.metadata.re_add(&refs, index);
        self.apply_metadata_failures();
        match taken {
            Ok(_) => {
                let zeroes_after_discard = self.devices[index].zeroes_after_discard();
                self.events.record(
                    &self.metadata,
                    "member-re-added",
                    &format!(
                        "{name} takes member {} back; only the regions written while it was \
                         away are rebuilt",
                        role.get()
                    ),
                );
                self.begin_rebuild(role, index, StripeIndex(0), zeroes_after_discard, true);
                Ok(true)
            }
            Err(e) => {
                self.events.record(
                    &self.metadata,
                    "re-add-failed",
                    &format!("{name} could not take member {} back: {e}", role.get()),
                );
                Ok(false)
            }
        }
    }

    /// At start: resume a rebuild the superblocks record, or give a failed role a spare.
    fn resume_or_start_rebuild(&mut self) {
        // Tunables were stored at open, after the shards were set up.
        self.apply_metadata_failures();
        if let Some((role, from)) = self.metadata.rebuild_in_progress() {
            let device = self.metadata.role_device(role.get()).expect("a rebuild has a device");
            let zeroes_after_discard = self.devices[device].zeroes_after_discard();
            self.events.record(
                &self.metadata,
                "rebuild-resumed",
                &format!("resuming the rebuild of member {} at stripe {}", role.get(), from.0),
            );
            let partial = self.metadata.rebuild_is_partial();
            self.begin_rebuild(role, device, from, zeroes_after_discard, partial);
        } else {
            self.take_spare_if_wanted();
        }
    }

    /// A `replace` a stop interrupted (recorded in the superblocks): its copy starts over
    /// (what was copied before is not trusted: writes since were not recorded), or, when it
    /// no longer can, the record is cleared and the event log says why.
    fn resume_replace(&mut self) {
        let Some((role, device)) = self.metadata.replacing() else { return };
        if self.copy.is_some() {
            return;
        }
        let name = self.devices[device].name();
        if self.resync_pending() && self.metadata.role_device(role.get()).is_some() {
            // Found by review: the copy resumed at once, and its swap took the old member
            // out while resync still needed it; it waits for resync instead, and
            // `ResyncDone` brings it back here.
            if !self.replace_deferred {
                self.replace_deferred = true;
                let message = format!(
                    "the replace of member {} by {name} was interrupted by a stop; it starts over \
                     once resync after the unclean shutdown is done",
                    role.get()
                );
                self.events.record(&self.metadata, "replace-deferred", &message);
            }
            return;
        }
        self.replace_deferred = false;
        let why_not = if self.metadata.role_device(role.get()).is_none() {
            Some("the member it replaced is out of service".to_string())
        } else if matches!(self.devices[device], MemberDevice::Memory(_)) {
            Some("in-memory members are not copied".to_string())
        } else {
            let message = format!(
                "the replace of member {} by {name} was interrupted by a stop: its copy starts \
                 over",
                role.get()
            );
            self.events.record(&self.metadata, "replace-resumed", &message);
            let path = NewSpare::Path(std::path::PathBuf::from(&name));
            self.replace(role.get(), path, Overwrite::Refuse).err().map(|e| e.to_string())
        };
        if let Some(why) = why_not {
            self.clear_replacing(device);
            let message = format!(
                "the interrupted replace of member {} by {name} is given up ({why}): it stays \
                 a hot spare",
                role.get()
            );
            self.events.record(&self.metadata, "replace-abandoned", &message);
        }
    }

    /// The superblocks no longer say `device` is replacing a member. Members the write
    /// fails are left for the caller's next `apply_metadata_failures` (this runs inside it).
    fn clear_replacing(&mut self, device: usize) {
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        if let Err(e) = self.metadata.set_replacing(&refs, device, None) {
            let message = format!("the end of a replace could not be recorded: {e}");
            self.events.record(&self.metadata, "metadata-write-failed", &message);
        }
    }

    /// Members a metadata write failed (their device refused the superblock) are failed in
    /// the engine too, like any failure; a rebuild onto one of them is abandoned.
    fn apply_metadata_failures(&mut self) {
        if self.tell_shards_of_failures() {
            // A spare takes over, as after any failure (a takeover in progress holds the
            // rebuild slot, so this never starts a second one).
            self.take_spare_if_wanted();
        }
    }

    /// Tell the shards of every failure the metadata recorded that they have not been told
    /// of, batch after batch (giving up a copy writes superblocks, which can fail more
    /// members), and never take a spare meanwhile: a spare must not be given a role the
    /// shards still count as in service. True if there was any.
    fn tell_shards_of_failures(&mut self) -> bool {
        let mut any = false;
        loop {
            let failed = self.metadata.take_unapplied_failures();
            if failed.is_empty() {
                return any;
            }
            any = true;
            for &m in &failed {
                self.abandon_copy_for(m);
            }
            for m in &failed {
                let message = format!("member {} failed (its superblock write failed)", m.get());
                self.events.record(&self.metadata, "member-failed", &message);
            }
            self.apply_failed(&failed);
        }
    }

    /// Tell every shard that `failed` (durably recorded) are out of service; a rebuild onto
    /// one of them is abandoned.
    fn apply_failed(&mut self, failed: &[MemberIndex]) {
        self.broadcast(|| Control::ApplyFailed(failed.to_vec()));
        if self.rebuild.as_ref().is_some_and(|r| failed.contains(&r.role)) {
            self.events.record(
                &self.metadata,
                "rebuild-abandoned",
                "the member being rebuilt failed: its rebuild is abandoned",
            );
            self.rebuild = None;
        }
    }

    /// A shard's rebuild stalled at `stripe`. Its newest stall replaces its last: within one
    /// attempt they only go down, and after a retry got past one, the next is a new stall.
    fn note_rebuild_stall(&mut self, shard: u32, stripe: StripeIndex, cause: StallCause) {
        if let Some(r) = &mut self.rebuild
            && let Some(at) = r.stalled_at.get_mut(shard as usize)
        {
            *at = Some((stripe.0, cause));
        }
    }

    /// For a message about an array failed past its tolerance: what becomes of a running
    /// rebuild ("" when none runs). Its recorded cursor is kept, so a forced start, which
    /// brings the last failed member back, resumes it from there.
    fn rebuild_kept_for_forced_start(&self) -> String {
        match self.metadata.rebuild_in_progress() {
            Some((role, from)) => format!(
                "; the rebuild of member {} stops where nothing is left to reconstruct from \
                 and resumes after the forced start from its recorded cursor, stripe {}",
                role.get(),
                from.0
            ),
            None => String::new(),
        }
    }

    /// A failed role and a hot spare: the spare takes the role, durably, and is rebuilt.
    fn take_spare_if_wanted(&mut self) {
        // The shards first learn of every failure recorded so far (see above).
        self.tell_shards_of_failures();
        self.note_spare_held_back();
        let Some(role) = self.metadata.spare_wanted() else { return };
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        let preferred = self.preferred_spare.take();
        // Partial only for the role that was copied: a metadata write can fail another role
        // in the same update, and a lower role is taken first.
        let partial = self.takeover_partial.take() == Some(role);
        // A device a copier may still write is no spare to take (this runs again when the
        // copier has stopped).
        let busy = self.copy.as_ref().map(|c| c.new);
        let busy = busy.or(self.stopping_copier.as_ref().map(|c| c.new));
        let taken = self.metadata.take_spare(&refs, role, preferred, partial, busy);
        self.apply_metadata_failures();
        match taken {
            Ok(device) => {
                let zeroes_after_discard = self.devices[device].zeroes_after_discard();
                let partial = self.metadata.rebuild_is_partial();
                let what = if partial {
                    "rebuilding only the regions written while it was copied"
                } else {
                    "rebuilding"
                };
                self.events.record(
                    &self.metadata,
                    "spare-takeover",
                    &format!(
                        "hot spare {} takes over member {}; {what}",
                        self.devices[device].name(),
                        role.get()
                    ),
                );
                self.begin_rebuild(role, device, StripeIndex(0), zeroes_after_discard, partial);
            }
            Err(e) => self.events.record(
                &self.metadata,
                "spare-takeover-failed",
                &format!("hot spare could not take over: {e}"),
            ),
        }
    }

    /// Say once, while it lasts, that the hot spares stay spares because the array is failed
    /// past its tolerance: a rebuild onto one would have nothing to reconstruct from.
    fn note_spare_held_back(&mut self) {
        let held = self.metadata.spare_held_back();
        if held.is_some() && held != self.spare_held_noted {
            let missing = held.clone().unwrap_or_default();
            let geometry = self.metadata.superblock().geometry();
            let message = format!(
                "no hot spare takes over: members {missing:?} are out of service, more than {} \
                 x{} survives, so no failed role can be rebuilt; the spares stay spares",
                geometry.level(),
                geometry.member_count()
            );
            self.events.record(&self.metadata, "spare-held", &message);
        }
        self.spare_held_noted = held;
    }

    fn begin_rebuild(
        &mut self,
        role: MemberIndex,
        device: usize,
        from: StripeIndex,
        zeroes_after_discard: bool,
        partial: bool,
    ) {
        let registered = self.registered[device].expect("role and spare devices are registered");
        let left = std::mem::replace(&mut self.role_slots[role.get()], registered);
        if !self.role_slots.contains(&left)
            && let Some(at) = self.detached_slots.iter().position(|&s| s == left)
        {
            // The last role mapped to a released slot moved off it: it can be handed out.
            self.free_slots.push(self.detached_slots.swap_remove(at));
        }
        self.rebuild_generation = self.rebuild_generation.wrapping_add(1);
        // Every shard's `start_rebuild` bumps the role's epoch the same way.
        let epoch = &mut self.role_epoch[role.get()];
        *epoch = (*epoch + 1) % flashraid_engine::EPOCHS as u8;
        self.broadcast(|| Control::StartRebuild {
            role,
            device: registered,
            from,
            zeroes_after_discard,
            partial,
        });
        let now = std::time::Instant::now();
        self.rebuild = Some(RunningRebuild {
            role,
            started: now,
            from: from.0,
            done_below: vec![from.0; self.reactors.len()],
            shard_done: vec![false; self.reactors.len()],
            generation: self.rebuild_generation,
            last_recorded: now,
            stalled_at: vec![None; self.reactors.len()],
        });
    }

    /// A shard reported rebuild progress (`done`: it finished). Records the cursor now and
    /// then, and the end once every shard is done.
    fn rebuild_progress(&mut self, shard: u32, generation: u32, done_below: u64, done: bool) {
        let stripes = self.metadata.superblock().geometry().stripes();
        // Events of an abandoned rebuild (its member failed; the shards may still report it
        // until they apply the failure) must not move the next one's cursor.
        let Some(r) = self.rebuild.as_mut().filter(|r| r.generation == generation) else {
            return;
        };
        let s = usize::try_from(shard).expect("fits");
        r.done_below[s] = r.done_below[s].max(done_below.min(stripes));
        if let Some((stripe, _)) = r.stalled_at[s].filter(|&(stalled, _)| r.done_below[s] > stalled)
        {
            r.stalled_at[s] = None;
            let role = r.role.get();
            self.events.record(
                &self.metadata,
                "rebuild-resumed",
                &format!("rebuild of member {role} got past stripe {stripe}, where it stalled"),
            );
        }
        let Some(r) = self.rebuild.as_mut().filter(|r| r.generation == generation) else {
            return;
        };
        if done {
            r.shard_done[s] = true;
        }
        let refs: Vec<&dyn MetaDevice> =
            self.devices.iter().map(|d| d as &dyn MetaDevice).collect();
        if r.shard_done.iter().all(|&d| d) {
            let role = r.role;
            let elapsed = r.started.elapsed();
            let finished = self.metadata.finish_rebuild(&refs);
            self.rebuild = None;
            self.apply_metadata_failures();
            match finished {
                Ok(_) if self.metadata.role_device(role.get()).is_some() => {
                    self.broadcast(|| Control::FinishRebuild(role));
                    if self.metadata.all_in_service() {
                        // Nothing is missed any more (shards that saw a newer failure keep
                        // their map).
                        self.broadcast(|| Control::ClearMissed);
                    }
                    self.events.record(
                        &self.metadata,
                        "rebuild-finished",
                        &format!("rebuild of member {} finished in {elapsed:.1?}", role.get()),
                    );
                }
                Ok(_) => {}
                Err(e) => self.events.record(
                    &self.metadata,
                    "metadata-error",
                    &format!("recording the rebuilt member: {e}"),
                ),
            }
            self.take_spare_if_wanted();
            return;
        }
        if r.last_recorded.elapsed() >= REBUILD_RECORD_INTERVAL {
            r.last_recorded = std::time::Instant::now();
            let cursor = r.done_below.iter().copied().min().unwrap_or(0);
            let recorded = self.metadata.record_rebuild_progress(&refs, StripeIndex(cursor));
            if let Err(e) = recorded {
                self.events.record(
                    &self.metadata,
                    "metadata-error",
                    &format!("recording rebuild progress: {e}"),
                );
            }
            self.apply_metadata_failures();
            if self.rebuild.is_none() {
                self.take_spare_if_wanted();
            }
        }
    }

    /// Some shard still has stripes to resync (`Shard::resync_pending`).
    fn resync_pending(&self) -> bool {
        self.shard_statuses().iter().any(|s| s.resync_pending)
    }

    fn shard_statuses(&self) -> Vec<ShardStatus> {
        let mut out = vec![];
        for link in self.reactors.iter() {
            let (tx, rx) = mpsc::channel();
            if link.tx.send(ToReactor::Control(Control::Status(tx))).is_ok() {
                link.bell.ring();
                if let Ok(status) = rx.recv() {
                    out.push(status);
                }
            }
        }
        out
    }

    fn status(&self) -> ArrayStatus {
        let sb = self.metadata.superblock();
        let shards = self.shard_statuses();
        let geometry = sb.geometry();
        let n = geometry.member_count();
        let health: Vec<Health> = (0..n)
            .map(|m| {
                let states = shards.iter().map(|s| s.health[m]);
                // The worst view of any shard.
                states
                    .max_by_key(|h| match h {
                        Health::Active => 0,
                        Health::Rebuilding => 1,
                        Health::Failing => 2,
                        Health::Failed => 3,
                    })
                    .unwrap_or(Health::Failed)
            })
            .collect();
        let mut counters = ShardCounters::default();
        for s in &shards {
            counters.add(&s.counters);
        }
        let unavailable: Vec<bool> = health.iter().map(|h| *h != Health::Active).collect();
        ArrayStatus {
            name: sb.array_name.clone(),
            uuid: sb.array_uuid,
            level: sb.level,
            members: (0..n)
                .map(|role| MemberStatus {
                    role,
                    path: self.metadata.role_device(role).map(|d| self.devices[d].name()),
                    health: health[role],
                })
                .collect(),
            spares: self.metadata.spare_devices().iter().map(|&d| self.devices[d].name()).collect(),
            held_unlisted: (0..self.devices.len())
                .filter(|&d| self.held_unlisted(d) && !self.erasing.iter().any(|&(e, _)| e == d))
                .map(|d| self.devices[d].name())
                .collect(),
            chunk_bytes: sb.chunk_bytes,
            array_bytes: geometry.array_bytes(),
            degraded: unavailable.iter().any(|&u| u),
            failed: !geometry.survives(&unavailable),
            resyncing: shards.iter().any(|s| s.resyncing),
            rebuild: self.rebuild_status(&shards, geometry),
            scrub: self.scrub_status(&shards),
            events: self.events.recent.iter().cloned().collect(),
            tunables: sb.tunables,
            bitmap_regions_set: shards.iter().map(|s| s.bitmap_regions_set).sum(),
            member_reads_retried: shards.iter().map(|s| s.member_reads_retried).sum(),
            member_ios_merged: shards.iter().map(|s| s.member_ios_merged).sum(),
            counters,
            shards: shards.len(),
            queue_depth: self.ring_entries,
            member_timeout_ms: self.member_timeout_us / 1000,
            event: sb.event,
            read_only: self.metadata.is_read_only(),
        }
    }

    fn rebuild_status(
        &self,
        shards: &[ShardStatus],
        geometry: Geometry,
    ) -> Option<RebuildProgress> {
        if let Some(c) = &self.copy {
            let chunk = u64::from(geometry.chunk_bytes());
            let seconds = c.started.elapsed().as_secs_f64();
            let rate = if seconds > 0.0 { (c.done_bytes as f64 / seconds) as u64 } else { 0 };
            return Some(RebuildProgress {
                role: c.role.get(),
                path: Some(self.devices[c.new].name()),
                stripes_done: c.done_bytes / chunk,
                stripes_total: c.total_bytes / chunk,
                rate_bytes_per_s: rate,
                eta_s: (rate > 0).then(|| (c.total_bytes - c.done_bytes) / rate),
                rate_limit_bytes_per_s: self.rebuild_rate_bytes_per_s,
                stalled_at_stripe: None,
                stall_cause: None,
                trust_parity: self.rebuild_trust_parity,
                partial: false,
                copying: true,
            });
        }
        let r = self.rebuild.as_ref()?;
        let (mut done, mut total) = (0u64, 0u64);
        for s in shards.iter().filter_map(|s| s.rebuild.as_ref()) {
            done += s.stripes_done;
            total += s.stripes_total;
        }
        if total == 0 {
            // Shards done and not yet told the member is active again.
            total = geometry.stripes();
            done = total;
        }
        // Stripes done since this (re)start, each one chunk written to the replacement.
        let resumed_from = r.from.min(geometry.stripes());
        let fresh = done.saturating_sub(resumed_from);
        let seconds = r.started.elapsed().as_secs_f64();
        let rate = if seconds > 0.0 {
            (fresh as f64 * f64::from(geometry.chunk_bytes()) / seconds) as u64
        } else {
            0
        };
        let left = total.saturating_sub(done) * u64::from(geometry.chunk_bytes());
        // The lowest stripe any shard stalled at, and why.
        let stall = r.stalled_at.iter().flatten().min_by_key(|(stripe, _)| *stripe).copied();
        Some(RebuildProgress {
            role: r.role.get(),
            path: self.metadata.role_device(r.role.get()).map(|d| self.devices[d].name()),
            stripes_done: done,
            stripes_total: total,
            rate_bytes_per_s: rate,
            // A stalled rebuild has no time left to tell (found by review: the ETA went on
            // counting from the rate before the stall).
            eta_s: (rate > 0 && stall.is_none()).then(|| left / rate),
            rate_limit_bytes_per_s: self.rebuild_rate_bytes_per_s,
            stalled_at_stripe: stall.map(|(stripe, _)| stripe),
            stall_cause: stall.map(|(_, cause)| cause),
            trust_parity: self.rebuild_trust_parity,
            partial: self.metadata.rebuild_is_partial(),
            copying: false,
        })
    }

    fn stop_reactors(&self) {
        self.broadcast(|| Control::Stop);
    }
}

/// One thing that happened to the array, for `status` and the operator's hook.
#[derive(Clone, Debug)]
pub struct EventRecord {
    pub unix_seconds: u64,
    /// A stable name for scripts: `member-failed`, `spare-takeover`, `rebuild-finished`,
    /// `scrub-finished`, ...
    pub kind: &'static str,
    pub message: String,
}

/// A retry interval as an event message says it: seconds, or milliseconds below one (a
/// 0.1 s interval once read "every 0 s").
fn retry_interval_text(us: u64) -> String {
    match us {
        _ if us.is_multiple_of(1_000_000) => format!("{} s", us / 1_000_000),
        1_000_000.. => format!("{:.1} s", us as f64 / 1e6),
        _ => format!("{} ms", us.div_ceil(1000)),
    }
}

/// A device listed as a spare by `Controller::list_spare`: new to the server, or one it
/// held already (a failed member, a former spare), which its event says.
#[derive(Clone, Copy)]
enum Listing {
    New,
    Again,
}

/// The member a `replace` is for: a role, or a name the operator gave for its device.
pub(crate) enum ReplaceOld {
    Role(usize),
    Named(String),
}

/// How the erase of a removed spare's superblocks ended.
type EraseOutcome = Result<(), String>;

/// What to do about a removed spare whose superblocks were not erased.
const ERASE_FAILED_ADVICE: &str = "assembly leaves it out all the same; `create` and `spare \
     add` on another array will want --force for it";

fn erased_message(name: &str, result: &EraseOutcome) -> String {
    match result {
        Ok(()) => format!("hot spare {name} removed; its superblocks are erased"),
        Err(e) => format!(
            "hot spare {name} removed; erasing its superblocks failed ({e}): {ERASE_FAILED_ADVICE}"
        ),
    }
}

/// Whether `given` (a name the operator gave) names the device the server holds: the file
/// its descriptor has open, by identity (a relative path or a symlink given to `serve`, the
/// canonical path from the CLI), not whatever the server's own name for it points to now (a
/// symlink or a by-path name retargeted after a disk swap names another device). The same
/// string when the given name cannot be looked up (a vanished device), and for in-memory
/// members.
fn names_device(device: &MemberDevice, given: &str) -> bool {
    match device {
        MemberDevice::Device(d) => {
            let held = std::fs::metadata(format!("/proc/self/fd/{}", d.raw_fd()));
            match (held, std::fs::metadata(given)) {
                (Ok(held), Ok(named)) => file_identity(&held) == file_identity(&named),
                _ => device.name() == given,
            }
        }
        MemberDevice::Memory(m) => m.name() == given,
        MemberDevice::Released(_) => false,
    }
}

/// Whether two names are the same name: the same string, or the same absolute path once
/// each is made absolute (the server's against its own directory, where it opened it; the
/// CLI sends absolute paths), with no symlink resolved.
fn same_name(held: &str, given: &str) -> bool {
    held == given
        || matches!(
            (std::path::absolute(held), std::path::absolute(given)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// What makes a file itself: the device number for block devices (any node of it), else
/// the filesystem and inode.
fn file_identity(metadata: &std::fs::Metadata) -> (bool, u64, u64) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if metadata.file_type().is_block_device() {
        (true, metadata.rdev(), 0)
    } else {
        (false, metadata.dev(), metadata.ino())
    }
}

/// Events kept for `status`, at most.
pub const EVENTS_KEPT: usize = 64;
/// Events waiting for the operator's hook, at most. Hooks run one at a time, in the order
/// of the events; past this (a hook that hangs), an event's run is dropped and standard
/// error says so. (Found by review: with at most 4 hooks running at once and the rest
/// skipped, a slow alerting hook missed member failures.)
const HOOK_QUEUE_MAX: usize = 256;

/// How long one run of the operator's hook may take before it is killed (its shell; what the
/// shell started in the background is its own).
const HOOK_RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How often the hook thread looks whether a run ended.
const HOOK_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// One run of the operator's hook.
struct HookRun {
    kind: &'static str,
    array: String,
    message: String,
}

/// The array's event log: each event goes to standard error, to the last `EVENTS_KEPT`
/// kept for `status`, and to the operator's command if one is set (like mdadm's PROGRAM):
/// run by `sh -c` with FLASHRAID_EVENT, FLASHRAID_ARRAY and FLASHRAID_MESSAGE set, on a
/// thread of its own, one event after another, never waited for on the controller's thread.
/// Runs still queued when the server exits are not made.
struct EventLog {
    recent: std::collections::VecDeque<EventRecord>,
    /// The hook thread's inbox (`None`: no hook).
    hooks: Option<std::sync::mpsc::SyncSender<HookRun>>,
}

impl EventLog {
    fn new(hook: Option<String>) -> Self {
        Self::with_run_timeout(hook, HOOK_RUN_TIMEOUT)
    }

    fn with_run_timeout(hook: Option<String>, timeout: std::time::Duration) -> Self {
        let hooks = hook.and_then(|hook| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<HookRun>(HOOK_QUEUE_MAX);
            let runner = move || {
                for run in rx {
                    let array = &run.array;
                    let child = std::process::Command::new("sh")
                        .arg("-c")
                        .arg(&hook)
                        .env("FLASHRAID_EVENT", run.kind)
                        .env("FLASHRAID_ARRAY", array)
                        .env("FLASHRAID_MESSAGE", &run.message)
                        .stdin(std::process::Stdio::null())
                        .spawn();
                    let mut child = match child {
                        Ok(child) => child,
                        Err(e) => {
                            eprintln!(
                                "flashraid: array {array}: event hook {hook:?} could not run: {e}"
                            );
                            continue;
                        }
                    };
                    // A hook that hangs must not hold every later event back (found by
                    // review): it is killed after `timeout`.
                    let deadline = std::time::Instant::now() + timeout;
                    while matches!(child.try_wait(), Ok(None)) {
                        if std::time::Instant::now() >= deadline {
                            let _ = child.kill();
                            eprintln!(
                                "flashraid: array {array}: event hook for {} killed after {} s",
                                run.kind,
                                timeout.as_secs_f64()
                            );
                            break;
                        }
                        std::thread::sleep(HOOK_POLL);
                    }
                    let _ = child.wait();
                }
            };
            match std::thread::Builder::new().name("flashraid-hook".into()).spawn(runner) {
                Ok(_) => Some(tx),
                Err(e) => {
                    eprintln!("flashraid: the event hook's thread could not start ({e}): no hook");
                    None
                }
            }
        });
        Self { recent: std::collections::VecDeque::with_capacity(EVENTS_KEPT), hooks }
    }

    fn record(&mut self, metadata: &Metadata, kind: &'static str, message: &str) {
        let array = metadata.superblock().array_name.clone();
        self.record_named(array, kind, message);
    }

    fn record_named(&mut self, array: String, kind: &'static str, message: &str) {
        eprintln!("flashraid: array {array}: {message}");
        let unix_seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.recent.len() == EVENTS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(EventRecord { unix_seconds, kind, message: message.to_string() });
        let Some(hooks) = &self.hooks else { return };
        let run = HookRun { kind, array, message: message.to_string() };
        if let Err(e) = hooks.try_send(run) {
            let (array, why) = match e {
                std::sync::mpsc::TrySendError::Full(r) => {
                    (r.array, format!("{HOOK_QUEUE_MAX} events already wait for it"))
                }
                std::sync::mpsc::TrySendError::Disconnected(r) => {
                    (r.array, "its thread has ended".to_string())
                }
            };
            eprintln!("flashraid: array {array}: event hook not run for {kind}: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event reaches the hook, in order, even while a slow hook runs (found by review:
    /// a fifth event while four hooks ran was skipped).
    #[test]
    fn every_event_reaches_a_slow_hook_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("events");
        let hook = format!("sleep 0.05; echo \"$FLASHRAID_EVENT\" >> {}", out.display());
        let mut log = EventLog::new(Some(hook));
        let kinds: Vec<&'static str> = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"].into();
        for &kind in &kinds {
            log.record_named("t".into(), kind, "an event");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let got = std::fs::read_to_string(&out).unwrap_or_default();
            let lines: Vec<&str> = got.lines().collect();
            if lines.len() == kinds.len() {
                assert_eq!(lines, kinds, "events out of order");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "hooks ran for {lines:?} only");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A hook that hangs is killed after its timeout, and the events after it still run.
    #[test]
    fn a_hanging_hook_is_killed_and_later_events_run() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("events");
        let hook = format!(
            "if [ \"$FLASHRAID_EVENT\" = hang ]; then exec sleep 3600; fi; echo \"$FLASHRAID_EVENT\" >> {}",
            out.display()
        );
        let mut log = EventLog::with_run_timeout(Some(hook), std::time::Duration::from_millis(300));
        log.record_named("t".into(), "hang", "an event");
        log.record_named("t".into(), "after", "an event");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::fs::read_to_string(&out).unwrap_or_default() != "after\n" {
            assert!(std::time::Instant::now() < deadline, "the event after a hung hook never ran");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn queue_depths_are_powers_of_two_the_ring_takes_and_stored_ones_still_start() {
        assert!(queue_depth_valid(16) && queue_depth_valid(1024) && queue_depth_valid(4096));
        for bad in [8, 1000, 8192, 32768] {
            assert!(!queue_depth_valid(bad), "{bad}");
        }
        assert_eq!(usable_queue_depth(1000), 512);
        assert_eq!(usable_queue_depth(32768), 4096);
        assert_eq!(usable_queue_depth(1), 16);
        assert_eq!(usable_queue_depth(1024), 1024);
        assert!(flashraid_uring::Ring::new(usable_queue_depth(32768)).is_ok());
    }

    #[test]
    fn retry_intervals_read_as_the_operator_set_them() {
        assert_eq!(retry_interval_text(10_000_000), "10 s");
        assert_eq!(retry_interval_text(1_500_000), "1.5 s");
        assert_eq!(retry_interval_text(100_000), "100 ms");
        assert_eq!(retry_interval_text(1), "1 ms");
    }

    #[test]
    fn a_device_is_named_by_the_file_its_descriptor_holds() {
        let dir = std::env::temp_dir().join(format!("flashraid-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (file, other, link) = (dir.join("spare"), dir.join("other"), dir.join("link"));
        for f in [&file, &other] {
            std::fs::File::create(f).unwrap().set_len(1 << 20).unwrap();
        }
        std::os::unix::fs::symlink(&file, &link).unwrap();
        // Opened through the symlink, as `serve` may have been given it.
        let held = MemberDevice::Device(Device::open(&link, Access::ReadWrite).unwrap());
        let name = |p: &std::path::Path| p.to_str().unwrap().to_string();
        assert!(names_device(&held, &name(&link)));
        assert!(names_device(&held, &name(&file)), "the file the link resolves to");
        assert!(!names_device(&held, &name(&other)));
        // The link retargeted: its name now names another file, not the one held.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(!names_device(&held, &name(&link)), "a retargeted name matched the held file");
        assert!(names_device(&held, &name(&file)));
        // Names as names: the same string, or the same absolute path, no link resolved.
        assert!(same_name(&name(&link), &name(&link)));
        let cwd = std::env::current_dir().unwrap();
        assert!(same_name("relative-name", cwd.join("relative-name").to_str().unwrap()));
        assert!(!same_name(&name(&link), &name(&file)), "a link is its own name");
        // A name that no longer exists matches as a string only.
        std::fs::remove_file(&link).unwrap();
        assert!(names_device(&held, &name(&link)));
        let memory = MemberDevice::Memory(MemMember::new("mem3", 1 << 20));
        assert!(names_device(&memory, "mem3") && !names_device(&memory, "mem4"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
