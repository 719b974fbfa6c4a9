//! flashraid's control plane: creating arrays, assembling them from what is on their
//! members, and keeping the superblocks true while they run.
//!
//! Owns: the metadata IO (superblock copies, bitmap blocks) and its ordering, the check that
//! refuses to overwrite a device holding someone else's data, and the hand-over from assembly
//! to the engine (one `ShardSetup` per shard).
//!
//! Device access goes through [`MetaDevice`], a small synchronous trait: the io_uring
//! runtime's devices and the simulator's members both implement it, so this logic is tested
//! in simulation, including power loss between its writes.
//!
//! Write ordering (why a crash at any point is safe):
//! - a superblock update writes copy 0 on every member, syncs, then copy 1 on every member,
//!   and syncs; a torn copy fails its checksum and the other copy (old or new) is used;
//! - the array is marked dirty (and its bitmap blocks written) before the engine starts, in
//!   two superblock passes (so a stale copy of a member is two passes behind; see
//!   `flashraid_format::assembly`), and marked clean only after every shard has flushed its
//!   writes and cleared its bitmap.
//!
//! A read-only start (`ArrayAccess::ReadOnly`) writes nothing: no bitmap, no superblock pass,
//! and every later update is refused with `ControlError::ReadOnly` before it writes.

#![forbid(unsafe_code)]

mod signatures;

pub use signatures::{Signature, detect_signature};

use flashraid_engine::{ArrayAccess, BitmapSetup, Health, MemberSetup, ShardConfig, ShardSetup};
use flashraid_format::assembly::{
    Assembled, AssemblyError, AssemblyRequest, Candidate, DirtyDegraded, assemble,
};
use flashraid_format::bitmap::{
    BITMAP_BLOCK_BYTES, BitmapBlock, BitmapKind, MISSED_MAP_OFFSET_BYTES, SHARDS_MAX,
};
use flashraid_format::layout::{SUPERBLOCK_COPY0_OFFSET_BYTES, superblock_copy1_offset};
use flashraid_format::superblock::{
    ArrayState, CURSOR_NONE, INIT_PENDING_NO_CRASH, INIT_UNKNOWN, MemberState, ROLE_NONE,
    SUPERBLOCK_BYTES, Superblock,
};
use flashraid_format::{NewArray, NewArrayError, Uuid, new_array};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{Geometry, MemberIndex, StripeIndex};

/// Synchronous access to one device for metadata. Buffers passed in are 4 KiB-aligned
/// (`IoBuf` slices) and offsets and lengths are multiples of 4 KiB.
pub trait MetaDevice {
    /// A name for messages (the path).
    fn name(&self) -> String;
    fn size_bytes(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), String>;
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), String>;
    fn sync(&self) -> Result<(), String>;
    /// The device reads zeroes after a discard.
    fn zeroes_after_discard(&self) -> bool;
    /// Make `[offset, offset + len)` read as zeroes (discard where that zeroes, else write).
    fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), String>;
}

/// Why a control operation failed. Each names the device and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error(
        "{device} holds {what}; refusing to overwrite it (pass --force if you are sure its \
         contents can be destroyed)"
    )]
    HoldsData { device: String, what: String },
    #[error("{device}: {error}")]
    Io { device: String, error: String },
    #[error(transparent)]
    NewArray(#[from] NewArrayError),
    #[error(transparent)]
    Assembly(#[from] AssemblyError),
    #[error("the same device is named twice: {device}")]
    DuplicateDevice { device: String },
    /// A device given to `spare add` (or `replace`) that the array lists already.
    #[error("{device} is already {what}: nothing to add")]
    AlreadyListed { device: String, what: String },
    #[error("no member could record the metadata update: the array has failed")]
    NoMetadataQuorum,
    /// A metadata update asked of an array started read-only (`ArrayAccess::ReadOnly`).
    #[error(
        "the array is served read-only: nothing is written to its members (stop it and start \
         it without --read-only to change it)"
    )]
    ReadOnly,
    #[error("{0}")]
    Invalid(String),
}

/// Whether `create` may overwrite devices that hold recognisable data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overwrite {
    Refuse,
    /// The operator passed `--force`.
    Force,
}

/// How a new array's parity becomes consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Zero every member's data area now (instant where members discard to zeroes).
    Zero,
    /// Mark every region dirty: parity is made consistent by background resync while the
    /// array serves IO (reads that need reconstruction wait for their stripe's turn).
    Background,
    /// The operator guarantees the members are already consistent (e.g. all zeroes).
    AssumeClean,
}

/// Overwrite both superblock copies of `device` with zeroes, and sync: a spare taken out of
/// its array no longer claims it, so `create` and `spare add` take it without `--force`.
/// Only for a device this array's metadata has just stopped listing (nothing else of it
/// holds data).
pub fn erase_superblocks(device: &dyn MetaDevice) -> Result<(), ControlError> {
    let io = |error: String| ControlError::Io { device: device.name(), error };
    let zeroes = IoBuf::new(SUPERBLOCK_BYTES);
    let copy1 = superblock_copy1_offset(device.size_bytes())
        .ok_or_else(|| io("too small to hold a superblock".into()))?;
    for offset in [SUPERBLOCK_COPY0_OFFSET_BYTES, copy1] {
        device.write_at(zeroes.as_slice(), offset).map_err(io)?;
    }
    device.sync().map_err(io)
}

/// Read one device's two superblock copies.
pub fn read_candidate(device: &dyn MetaDevice) -> Candidate {
    let mut buf = IoBuf::new(SUPERBLOCK_BYTES);
    let mut read = |offset: Option<u64>| -> Result<Superblock, flashraid_format::FormatError> {
        let offset = offset.ok_or(flashraid_format::FormatError::Truncated { len_bytes: 0 })?;
        device
            .read_at(buf.as_mut_slice(), offset)
            .map_err(|_| flashraid_format::FormatError::Invalid { what: "unreadable" })?;
        Superblock::decode(buf.as_slice())
    };
    let copy0 = read(Some(SUPERBLOCK_COPY0_OFFSET_BYTES));
    let mut copy1 = read(superblock_copy1_offset(device.size_bytes()));
    if copy1.is_err() {
        // The device may have grown since the superblock was written: copy 1 then sits at the
        // end the superblock recorded.
        if let Ok(sb) = &copy0
            && sb.member_size_bytes != device.size_bytes()
        {
            copy1 = read(superblock_copy1_offset(sb.member_size_bytes));
        }
    }
    Candidate { name: device.name(), copies: [copy0, copy1] }
}

/// Refuse devices that hold something recognisable, unless forced.
fn check_devices(devices: &[&dyn MetaDevice], overwrite: Overwrite) -> Result<(), ControlError> {
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].iter().any(|e| e.name() == d.name()) {
            return Err(ControlError::DuplicateDevice { device: d.name() });
        }
    }
    if overwrite == Overwrite::Force {
        return Ok(());
    }
    for d in devices {
        if let Some(signature) = detect_signature(*d) {
            return Err(ControlError::HoldsData { device: d.name(), what: signature.to_string() });
        }
    }
    Ok(())
}

/// Why a device that names this array as its own (a former member; `candidate` is what
/// `read_candidate` found on it) may have been reused since it left: its first superblock
/// copy no longer decodes (a filesystem, a partition table or a volume written over its
/// head; the reason names it when its signature is known). Such a device is neither taken
/// back with a partial rebuild nor made a spare without `--force` (found by review: a
/// failed member's device formatted with ext4 elsewhere, its copy 1 at the end still
/// intact, was taken back, and its filesystem's blocks served as the array's).
fn reused_since_it_left(device: &dyn MetaDevice, candidate: &Candidate) -> Option<String> {
    if candidate.copies[0].is_ok() {
        return None;
    }
    Some(match detect_signature(device) {
        Some(Signature::Flashraid { .. }) | None => "its first superblock copy is damaged or \
                                                     overwritten (the device may have been \
                                                     reused since it left the array)"
            .to_string(),
        Some(other) => format!("it holds {other} now"),
    })
}

fn io_error(device: &dyn MetaDevice) -> impl Fn(String) -> ControlError + '_ {
    move |error| ControlError::Io { device: device.name(), error }
}

/// Write one superblock's two copies to its device, copy 0 then copy 1, syncing after each.
fn write_superblock(device: &dyn MetaDevice, sb: &Superblock) -> Result<(), ControlError> {
    let mut buf = IoBuf::new(SUPERBLOCK_BYTES);
    buf.as_mut_slice().copy_from_slice(&sb.encode());
    let copy1 = superblock_copy1_offset(sb.member_size_bytes)
        .ok_or_else(|| ControlError::Invalid(format!("{}: too small", device.name())))?;
    device.write_at(buf.as_slice(), SUPERBLOCK_COPY0_OFFSET_BYTES).map_err(io_error(device))?;
    device.sync().map_err(io_error(device))?;
    device.write_at(buf.as_slice(), copy1).map_err(io_error(device))?;
    device.sync().map_err(io_error(device))
}

/// What `create` made.
#[derive(Clone, Debug)]
pub struct Created {
    pub geometry: Geometry,
    pub superblocks: Vec<Superblock>,
}

/// Create an array on `members` (role order) and `spares`: check them, write zeroed bitmap
/// areas and superblocks, and initialise parity as `init` says.
pub fn create(
    new: &NewArray,
    members: &[&dyn MetaDevice],
    spares: &[&dyn MetaDevice],
    overwrite: Overwrite,
    init: Init,
) -> Result<Created, ControlError> {
    let all: Vec<&dyn MetaDevice> = members.iter().chain(spares).copied().collect();
    check_devices(&all, overwrite)?;
    let mut new = new.clone();
    new.member_sizes_bytes = members.iter().map(|d| d.size_bytes()).collect();
    new.spare_sizes_bytes = spares.iter().map(|d| d.size_bytes()).collect();
    let (geometry, mut superblocks) = new_array(&new)?;
    // Bitmap: every shard block zeroed, or (background init) every region set.
    let region_count = geometry.member_data_bytes().div_ceil(superblocks[0].bitmap_region_bytes);
    let region_count = u32::try_from(region_count).expect("validated by new_array");
    let dirty: Vec<u32> =
        if init == Init::Background { (0..region_count).collect() } else { vec![] };
    for (device, sb) in all.iter().zip(&superblocks) {
        write_bitmap_area(*device, sb, &dirty, sb.bitmap_shards)?;
        write_map_area(*device, sb, BitmapKind::Missed, &[], sb.bitmap_shards)?;
    }
    // Every role in service and a blank missed-write map on every member: the map is kept
    // from the first event on.
    for sb in &mut superblocks {
        sb.missed_map_since_event = sb.event;
    }
    if init == Init::Zero {
        for (device, sb) in all.iter().zip(&superblocks) {
            device
                .zero_range(sb.data_offset_bytes, sb.member_data_bytes)
                .map_err(io_error(*device))?;
            device.sync().map_err(io_error(*device))?;
        }
    }
    // Zeroed or assumed clean: consistent from the start, so the array is clean; background
    // init leaves it dirty with every region marked.
    let state = if init == Init::Background { ArrayState::Dirty } else { ArrayState::Clean };
    for sb in &mut superblocks {
        sb.state = state;
        if init == Init::Background {
            // Every region is marked, and nothing was ever written: no write in flight.
            sb.init_state = INIT_PENDING_NO_CRASH;
        }
    }
    for (device, sb) in all.iter().zip(&superblocks) {
        write_superblock(*device, sb)?;
    }
    Ok(Created { geometry, superblocks })
}

/// Write every shard block of the bitmap area: shards `0..shards` with `dirty` set, the rest
/// cleared.
fn write_bitmap_area(
    device: &dyn MetaDevice,
    sb: &Superblock,
    dirty: &[u32],
    shards: u32,
) -> Result<(), ControlError> {
    write_map_area(device, sb, BitmapKind::WriteIntent, dirty, shards)
}

/// Bitmap regions of the array's data area (the superblock's rules keep the count within
/// one bitmap block).
fn region_count(sb: &Superblock) -> u32 {
    u32::try_from(sb.member_data_bytes.div_ceil(sb.bitmap_region_bytes)).expect("validated")
}

/// Where a map's area starts on every member.
fn map_offset(sb: &Superblock, kind: BitmapKind) -> u64 {
    match kind {
        BitmapKind::WriteIntent => sb.bitmap_offset_bytes,
        BitmapKind::Missed => MISSED_MAP_OFFSET_BYTES,
    }
}

/// Write every shard block of one map's area: shards `0..shards` with `set` set, the rest
/// cleared.
fn write_map_area(
    device: &dyn MetaDevice,
    sb: &Superblock,
    kind: BitmapKind,
    set: &[u32],
    shards: u32,
) -> Result<(), ControlError> {
    let region_count = region_count(sb);
    let mut buf = IoBuf::new(BITMAP_BLOCK_BYTES);
    let shard_count = u16::try_from(shards).expect("at most 64");
    for shard in 0..SHARDS_MAX {
        let offset = map_offset(sb, kind) + u64::from(shard) * BITMAP_BLOCK_BYTES as u64;
        if shard < shards {
            let mut block = BitmapBlock::new_kind(
                kind,
                sb.array_uuid,
                u16::try_from(shard).expect("fits"),
                shard_count,
                sb.bitmap_region_bytes,
                region_count,
            );
            for &r in set {
                block.set(r, true);
            }
            buf.as_mut_slice().copy_from_slice(&block.encode());
        } else {
            buf.as_mut_slice().fill(0);
        }
        device.write_at(buf.as_slice(), offset).map_err(io_error(device))?;
    }
    device.sync().map_err(io_error(device))
}

/// The union of the regions set in every shard block of every present member. A block that
/// cannot be read or decoded makes every region dirty: a full resync costs time, never data.
fn dirty_regions(devices: &[&dyn MetaDevice], assembled: &Assembled) -> Vec<u32> {
    map_regions(devices, assembled, BitmapKind::WriteIntent)
}

fn map_regions(devices: &[&dyn MetaDevice], assembled: &Assembled, kind: BitmapKind) -> Vec<u32> {
    let holders = assembled.roles.iter().flatten().copied();
    union_of_maps(devices, holders, &assembled.superblock, kind)
}

/// The union of one map's set regions over the shard blocks of `holders`; a block that cannot
/// be read or decoded (or, for the missed-write map, an array that keeps none) sets every
/// region.
fn union_of_maps(
    devices: &[&dyn MetaDevice],
    holders: impl Iterator<Item = usize>,
    sb: &Superblock,
    kind: BitmapKind,
) -> Vec<u32> {
    let region_count = region_count(sb);
    let mut dirty = vec![false; usize::try_from(region_count).expect("fits")];
    let mut everything = kind == BitmapKind::Missed && sb.missed_map_since_event == 0;
    let mut buf = IoBuf::new(BITMAP_BLOCK_BYTES);
    for device_index in holders {
        let device = devices[device_index];
        for shard in 0..sb.bitmap_shards {
            let offset = map_offset(sb, kind) + u64::from(shard) * BITMAP_BLOCK_BYTES as u64;
            let block = device
                .read_at(buf.as_mut_slice(), offset)
                .ok()
                .and_then(|_| BitmapBlock::decode(buf.as_slice(), sb.array_uuid).ok());
            // A block that names another region count than the array has (it passed its checksum,
            // so written by a broken or foreign writer) is not trusted either (found by
            // review: it indexed past the map).
            match block {
                Some(block)
                    if block.region_bytes == sb.bitmap_region_bytes
                        && block.kind == kind
                        && block.region_count == region_count =>
                {
                    for r in block.set_regions() {
                        dirty[usize::try_from(r).expect("fits")] = true;
                    }
                }
                _ => everything = true,
            }
        }
    }
    (0..region_count).filter(|&r| everything || dirty[usize::try_from(r).expect("fits")]).collect()
}

/// An array ready to start: the assembly decision plus what the engine needs.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub assembled: Assembled,
    /// Regions to resync (empty when the array was shut down cleanly).
    pub dirty_regions: Vec<u32>,
    /// Regions some role out of service may have missed (empty when every role is in
    /// service): the missed-write map, and the dirty regions (writes in flight at a crash).
    pub missed_regions: Vec<u32>,
    /// The dirty regions are only those background init has not reached, with no crash
    /// since the array was created or last stopped clean (`init_state`), and nothing was
    /// forced in: what was written there is consistent over what was written (writes there
    /// recompute parity over their range), so reconstruction there is trusted.
    pub dirty_init_only: bool,
}

/// Read every device, decide the assembly, and collect the dirty regions if it was not shut
/// down cleanly.
pub fn prepare(
    devices: &[&dyn MetaDevice],
    request: &AssemblyRequest,
) -> Result<Prepared, ControlError> {
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].iter().any(|e| e.name() == d.name()) {
            return Err(ControlError::DuplicateDevice { device: d.name() });
        }
    }
    let candidates: Vec<Candidate> = devices.iter().map(|d| read_candidate(*d)).collect();
    // The pure decision refuses every dirty, degraded array; with the bitmap at hand the
    // refusal is needed only when some region was being written at the crash (a clean
    // bitmap means no stripe can have parity that disagrees with its data).
    let lenient = AssemblyRequest { dirty_degraded: DirtyDegraded::Force, ..request.clone() };
    let assembled = assemble(&candidates, &lenient)?;
    let dirty_init_only = assembled.superblock.init_state == INIT_PENDING_NO_CRASH
        && assembled.stale_used.is_empty()
        && assembled.failed_used.is_empty();
    // A device smaller than the data area its superblock records (a truncated member file, a
    // member copied onto a smaller disk) is refused before anything is written (found by
    // review: start panicked encoding its superblock, after writing parts of the array's
    // metadata).
    let needed = assembled.superblock.member_data_bytes;
    for &d in assembled.roles.iter().flatten().chain(&assembled.spares) {
        let size = devices[d].size_bytes();
        if flashraid_format::layout::member_data_capacity(size).is_none_or(|c| c < needed) {
            return Err(ControlError::Invalid(format!(
                "{} is {size} bytes, too small for this array's data area ({needed} bytes after \
                 the metadata): it shrank, or is a copy on a smaller device. Nothing was \
                 written; start without it (degraded, where the level allows) or give the \
                 device it was",
                devices[d].name()
            )));
        }
    }
    let dirty_regions = if !assembled.stale_used.is_empty() {
        // Stale copies used by force: their chunks disagree with parity wherever the array
        // was written since they were taken, and nothing says where.
        let sb = &assembled.superblock;
        (0..region_count(sb)).collect()
    } else if assembled.dirty {
        let mut dirty = dirty_regions(devices, &assembled);
        if assembled.revived_missed_writes {
            // A member failed past the tolerance, brought back by force, that the array had
            // survived: it missed what was written after its failure, which the missed-write
            // map names. One whose failure failed the array missed nothing but the writes in
            // flight then, whose regions the engine keeps in the write-intent bitmap (it
            // releases no bit while failed; found by review: distrusting the whole map left
            // a resumed rebuild stalled for good wherever the array was written after the
            // first failure).
            dirty.extend(map_regions(devices, &assembled, BitmapKind::Missed));
            dirty.sort_unstable();
            dirty.dedup();
        }
        dirty
    } else {
        vec![]
    };
    let sb = &assembled.superblock;
    let unavailable: Vec<usize> = (0..assembled.roles.len())
        .filter(|&r| assembled.roles[r].is_none() || sb.members[r].state == MemberState::Rebuilding)
        .collect();
    // Background init with no crash since: nothing was in flight, so nothing disagrees.
    if request.dirty_degraded == DirtyDegraded::Refuse
        && !dirty_init_only
        && !dirty_regions.is_empty()
        && !unavailable.is_empty()
        && assembled.geometry.tolerance() > 0
    {
        return Err(AssemblyError::DirtyDegraded {
            array: if sb.array_name.is_empty() {
                sb.array_uuid.to_string()
            } else {
                sb.array_name.clone()
            },
            roles: unavailable.clone(),
            disagreement: flashraid_format::assembly::dirty_disagreement(
                assembled.geometry.level(),
            )
            .to_string(),
        }
        .into());
    }
    let missed_regions = if unavailable.is_empty() {
        vec![]
    } else {
        // The missed-write map over every present member (an array that keeps none, or a
        // block that cannot be read, names every region), and what was being written.
        let mut missed = map_regions(devices, &assembled, BitmapKind::Missed);
        missed.extend(&dirty_regions);
        missed.sort_unstable();
        missed.dedup();
        missed
    };
    Ok(Prepared { assembled, dirty_regions, missed_regions, dirty_init_only })
}

/// Why a device cannot take its role back with a partial rebuild (`Metadata::re_add_check`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReAddRefusal {
    /// Not a member of this array at all (no superblock of it).
    #[error("it is not a member of this array")]
    NotAMember,
    /// It could be re-added, but a rebuild is running (one at a time).
    #[error("can take role {} back once the running rebuild ends", .0.get())]
    Busy(MemberIndex),
    /// It was this array's, but its chunks cannot be trusted as of its failure.
    #[error("{0}")]
    Refused(String),
    /// The device of a failed role, while the array is failed past its tolerance
    /// (`Metadata::failed_past_tolerance` says how): nothing in service could rebuild what
    /// it missed, and it may hold what a forced start brings back, so it is left as it is
    /// (neither re-added nor made a spare).
    #[error(
        "{0}: nothing in service could rebuild what it missed, and its device may hold the \
         array's data as of its failure. Nothing was changed. Stop the array and start it \
         with --force: that brings back the devices of failed members (the last to fail \
         first); a member still out after that can then be added again"
    )]
    PastTolerance(String),
}

/// The running array's metadata: the newest superblock and which device holds each role.
#[derive(Debug)]
pub struct Metadata {
    template: Superblock,
    /// Candidate index per role (`None` when missing or failed).
    roles: Vec<Option<usize>>,
    spares: Vec<usize>,
    /// Member size per device index, recorded in that device's superblock.
    sizes: Vec<u64>,
    /// Roles failed because their device failed a metadata write, not yet handed to the
    /// engine (`take_unapplied_failures`).
    unapplied_failures: Vec<MemberIndex>,
    /// Devices taking a role in the pass being written (`give_role`, and devices a forced
    /// start brings back): written first, so a cut before them leaves no superblock naming
    /// them in the role while their own superblock, perhaps sessions old, would call them
    /// stale copies.
    joining: Vec<usize>,
    /// Read-only: every update is refused with `ControlError::ReadOnly` before it writes,
    /// and the superblock stays as the start found it (failures are kept in memory only).
    access: ArrayAccess,
    /// This session began with `Prepared::dirty_init_only`: its clean stop records that the
    /// regions left are still init's only (`INIT_PENDING_NO_CRASH`).
    init_only_session: bool,
}

impl Metadata {
    pub fn superblock(&self) -> &Superblock {
        &self.template
    }

    pub fn role_device(&self, role: usize) -> Option<usize> {
        self.roles[role]
    }

    /// Roles no device holds in service (failed, or missing since the start).
    pub fn missing_roles(&self) -> Vec<usize> {
        (0..self.roles.len()).filter(|&r| self.roles[r].is_none()).collect()
    }

    /// Whether device `device` (a candidate index) holds a role or is a hot spare.
    pub fn lists(&self, device: usize) -> bool {
        self.roles.contains(&Some(device)) || self.spares.contains(&device)
    }

    /// Devices (candidate indexes) present as hot spares.
    pub fn spare_devices(&self) -> &[usize] {
        &self.spares
    }

    /// Devices holding roles or spares, with the slot each holds.
    fn holders(&self) -> Vec<(usize, usize)> {
        let roles = self.roles.iter().enumerate().filter_map(|(r, d)| d.map(|d| (d, r)));
        let spares =
            self.spares.iter().enumerate().map(|(i, &d)| (d, self.template.members.len() + i));
        roles.chain(spares).collect()
    }

    /// Write the current template to every holder: copy 0 everywhere, sync, copy 1
    /// everywhere, sync. A device that fails the write fails its role (recorded in the next
    /// round). Returns the roles that failed while writing.
    fn write_all(&mut self, devices: &[&dyn MetaDevice]) -> Result<Vec<usize>, ControlError> {
        self.check_writable()?;
        let mut newly_failed = vec![];
        loop {
            // One pass: it reaches every holder (or fails it) before the next pass starts,
            // which is what lets assembly call a device two passes behind stale.
            self.template.update_count += 1;
            let mut holders = self.holders();
            holders.sort_by_key(|&(device, _)| !self.joining.contains(&device));
            let mut failed_now = vec![];
            for copy in 0..2 {
                for &(device, slot) in &holders {
                    if failed_now.contains(&device) {
                        continue;
                    }
                    let mut sb = self.template.clone();
                    sb.this_role = u16::try_from(slot).expect("fits");
                    sb.this_uuid = sb.slot(slot).uuid;
                    sb.member_size_bytes = self.sizes[device];
                    let d = devices[device];
                    let mut buf = IoBuf::new(SUPERBLOCK_BYTES);
                    buf.as_mut_slice().copy_from_slice(&sb.encode());
                    let offset = if copy == 0 {
                        SUPERBLOCK_COPY0_OFFSET_BYTES
                    } else {
                        superblock_copy1_offset(sb.member_size_bytes).expect("validated size")
                    };
                    if d.write_at(buf.as_slice(), offset).and_then(|_| d.sync()).is_err() {
                        failed_now.push(device);
                    }
                }
            }
            let failed_roles: Vec<usize> = holders
                .iter()
                .filter(|(d, slot)| failed_now.contains(d) && *slot < self.template.members.len())
                .map(|&(_, slot)| slot)
                .collect();
            // A spare that failed the write is dropped from the table (both lists, which
            // stay index-aligned), and the table is written again without it.
            let mut spare_dropped = false;
            for i in (0..self.spares.len()).rev() {
                if failed_now.contains(&self.spares[i]) {
                    self.spares.remove(i);
                    self.template.spares.remove(i);
                    spare_dropped = true;
                }
            }
            if failed_roles.is_empty() && !spare_dropped {
                if self.holders().is_empty() {
                    return Err(ControlError::NoMetadataQuorum);
                }
                return Ok(newly_failed);
            }
            if spare_dropped {
                self.template.event += 1;
            }
            for &role in &failed_roles {
                self.mark_failed(role);
                newly_failed.push(role);
                // The engine must hear of it too: the caller drains these.
                self.unapplied_failures.push(MemberIndex(u16::try_from(role).expect("fits")));
            }
            if self.holders().is_empty() {
                return Err(ControlError::NoMetadataQuorum);
            }
        }
    }

    /// Refuse any update of a read-only array (every public update calls this before its
    /// first write, and `write_all` again).
    fn check_writable(&self) -> Result<(), ControlError> {
        match self.access {
            ArrayAccess::ReadWrite => Ok(()),
            ArrayAccess::ReadOnly => Err(ControlError::ReadOnly),
        }
    }

    /// Whether updates are refused (the array was started read-only).
    pub fn is_read_only(&self) -> bool {
        self.access == ArrayAccess::ReadOnly
    }

    /// Record members as failed in memory only, on a read-only array (nothing may be
    /// written): the engine stops using them, and the next start finds the superblocks as
    /// they were. Returns the roles newly out of service.
    pub fn fail_members_in_memory(&mut self, roles: &[MemberIndex]) -> Vec<MemberIndex> {
        assert!(self.is_read_only(), "a writable array records failures durably");
        let newly: Vec<MemberIndex> =
            roles.iter().copied().filter(|r| self.roles[r.get()].is_some()).collect();
        for role in &newly {
            self.mark_failed(role.get());
        }
        newly
    }

    fn mark_failed(&mut self, role: usize) {
        self.template.event += 1;
        if usize::from(self.template.rebuild_role) == role {
            // The replacement failed: its partial rebuild is worth nothing now.
            self.template.rebuild_role = ROLE_NONE;
            self.template.rebuild_cursor_stripes = CURSOR_NONE;
        }
        let entry = &mut self.template.members[role];
        if entry.state != MemberState::Failed {
            // Only a member that was whole can later be re-added from the missed-write map.
            entry.in_sync_when_failed = entry.state == MemberState::Active;
            entry.partial_rebuild = false;
            entry.state = MemberState::Failed;
            entry.failed_at_event = self.template.event;
            entry.failed_session_update_count = self.template.session_update_count;
        }
        self.roles[role] = None;
        // A replace of this role keeps its record: whoever gives the copy up (the controller,
        // or the next start's `resume_replace`) clears it and says why.
    }

    /// No spare replaces `role` any more (in the template; written with the next update).
    fn clear_replacing_of(&mut self, role: usize) {
        for spare in &mut self.template.spares {
            if spare.replacing.map(usize::from) == Some(role) {
                spare.replacing = None;
            }
        }
    }

    /// A device joining (a spare, a member re-added) must hold no slot already and not be
    /// named twice.
    fn check_newcomer(
        &self,
        devices: &[&dyn MetaDevice],
        device: usize,
    ) -> Result<(), ControlError> {
        let d = devices[device];
        let holders = self.holders();
        let holds = self.lists(device);
        // Among the devices in the array: one the caller holds that the array no longer
        // lists may carry the same name (a file recreated at a failed member's path) and
        // is let go once the new one is in.
        if let Some(what) = self.listed_as(device) {
            return Err(ControlError::AlreadyListed { device: d.name(), what });
        }
        let named_twice =
            holders.iter().any(|&(h, _)| h != device && devices[h].name() == d.name());
        if holds || named_twice {
            return Err(ControlError::DuplicateDevice { device: d.name() });
        }
        Ok(())
    }

    /// What device `device` is in the array, if it is listed ("an active member of this
    /// array, of role 2", ...). Said in full: a misuse test got "named twice" for an active
    /// member given to `spare add`.
    pub fn listed_as(&self, device: usize) -> Option<String> {
        if let Some(role) = self.roles.iter().position(|&d| d == Some(device)) {
            return Some(match self.template.members[role].state {
                MemberState::Active => format!("an active member of this array, of role {role}"),
                _ => format!("this array's member of role {role}, being rebuilt"),
            });
        }
        self.spares.contains(&device).then(|| "a hot spare of this array".to_string())
    }

    /// A device about to hold a role (a spare taking over, a member re-added) gets the maps
    /// the members in service hold on disk (their union), not blank ones: should it later be
    /// the only one of them left, its maps must still name what the others' did. (The
    /// engine rewrites both maps to every member once the rebuild starts, which covers what
    /// was not on disk yet.)
    fn write_maps_for_newcomer(
        &self,
        devices: &[&dyn MetaDevice],
        device: usize,
    ) -> Result<(), ControlError> {
        let holders: Vec<usize> = self.roles.iter().flatten().copied().collect();
        let sb = &self.template;
        let shards = sb.bitmap_shards;
        for kind in [BitmapKind::WriteIntent, BitmapKind::Missed] {
            let set = union_of_maps(devices, holders.iter().copied(), sb, kind);
            write_map_area(devices[device], sb, kind, &set, shards)?;
        }
        Ok(())
    }

    /// Whether every role is held and active: the missed-write map can be emptied, and is
    /// kept from this event on.
    pub fn all_in_service(&self) -> bool {
        self.roles.iter().all(Option::is_some)
            && self.template.members.iter().all(|m| m.state == MemberState::Active)
    }

    /// Record members as failed, durably. Returns every role failed by this update (more
    /// than asked if a device failed the metadata write itself).
    pub fn fail_members(
        &mut self,
        devices: &[&dyn MetaDevice],
        roles: &[MemberIndex],
    ) -> Result<Vec<MemberIndex>, ControlError> {
        self.check_writable()?;
        for role in roles {
            self.mark_failed(role.get());
        }
        self.write_all(devices)?;
        let mut all: Vec<MemberIndex> = roles.to_vec();
        all.extend(self.take_unapplied_failures());
        Ok(all)
    }

    /// Devices the metadata knows (indexes below this are taken).
    pub fn known_devices(&self) -> usize {
        self.sizes.len()
    }

    /// Record the size of `device`, about to hold a slot: the next index, or a known one
    /// (the same device again, or a new device in the place of one the caller let go of,
    /// whose recorded size is not this device's). Superblocks carry it, and copy 1's place
    /// follows from it.
    fn note_size(&mut self, devices: &[&dyn MetaDevice], device: usize) {
        let size = devices[device].size_bytes();
        if device == self.sizes.len() {
            self.sizes.push(size);
        } else {
            self.sizes[device] = size;
        }
    }

    /// Roles a metadata write failed since the last call: the engine must apply them
    /// (`Shard::apply_failed`) like any other failure.
    pub fn take_unapplied_failures(&mut self) -> Vec<MemberIndex> {
        std::mem::take(&mut self.unapplied_failures)
    }

    /// Add repaired-error counts to the member table (written with the next update).
    pub fn note_errors_corrected(&mut self, role: MemberIndex, count: u32) {
        let entry = &mut self.template.members[role.get()];
        entry.errors_corrected = entry.errors_corrected.saturating_add(count);
    }

    /// Add device `device` (a known index or the next one, not part of the array) as a hot spare
    /// with identity `uuid`: refused if it holds recognisable data or is a failed role's own
    /// device while the array is failed past its tolerance (unless `overwrite`), is too
    /// small for a member's data area, or the member table is full. Its bitmap area is
    /// written blank, then every superblock (it is listed everywhere before it is used).
    pub fn add_spare(
        &mut self,
        devices: &[&dyn MetaDevice],
        device: usize,
        uuid: flashraid_format::Uuid,
        overwrite: Overwrite,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        assert!(device <= self.sizes.len(), "a known device or the next one");
        let d = devices[device];
        self.check_newcomer(devices, device)?;
        // A former member of this array (failed, or replaced) comes back as a spare without
        // --force: its contents are this array's own, stale. One still in service under
        // another name is refused.
        let candidate = read_candidate(d);
        let former = match candidate.copies.iter().flatten().max_by_key(|sb| sb.event) {
            Some(sb) if sb.array_uuid == self.template.array_uuid => {
                let in_service = self.holders().iter().any(|&(_, slot)| {
                    let entry = self.template.slot(slot);
                    entry.uuid == sb.this_uuid && entry.state != MemberState::Failed
                });
                if in_service {
                    return Err(ControlError::Invalid(format!(
                        "{} is a member of this array in service (the same device under \
                         another name?)",
                        d.name()
                    )));
                }
                self.check_forced_start_copy(d, sb, overwrite)?;
                if let Some(why) = reused_since_it_left(d, &candidate)
                    && overwrite == Overwrite::Refuse
                {
                    return Err(ControlError::HoldsData {
                        device: d.name(),
                        what: format!("what may no longer be this array's ({why})"),
                    });
                }
                true
            }
            _ => false,
        };
        if !former {
            check_devices(&[d], overwrite)?;
        }
        let needed = self.template.member_data_bytes;
        let capacity = flashraid_format::layout::member_data_capacity(d.size_bytes());
        if capacity.is_none_or(|c| c < needed) {
            return Err(ControlError::Invalid(format!(
                "{} is too small: a member of this array needs {needed} bytes of data area \
                 (the members are {} bytes each)",
                d.name(),
                self.holders().iter().map(|&(h, _)| self.sizes[h]).min().unwrap_or(0)
            )));
        }
        if self.template.members.len() + self.template.spares.len() >= flashraid_layout::MEMBERS_MAX
        {
            return Err(ControlError::Invalid(
                "the member table is full (64 members and spares)".into(),
            ));
        }
        if self.template.spares.iter().chain(&self.template.members).any(|e| e.uuid == uuid) {
            return Err(ControlError::Invalid("identity collision; try again".into()));
        }
        write_bitmap_area(d, &self.template, &[], self.template.bitmap_shards)?;
        let shards = self.template.bitmap_shards;
        write_map_area(d, &self.template, BitmapKind::Missed, &[], shards)?;
        self.note_size(devices, device);
        self.template.spares.push(flashraid_format::superblock::MemberEntry {
            uuid,
            state: MemberState::Spare,
            ..flashraid_format::superblock::MemberEntry::EMPTY
        });
        self.spares.push(device);
        self.template.event += 1;
        self.write_all(devices).map(|_| ())
    }

    /// A failed role's own device (`own`, its newest superblock), given to `add_spare` while
    /// the array is failed past its tolerance: made a spare, it would get a new identity and
    /// lose what a forced start brings back (the last member to fail holds the array's data
    /// as of its failure), so it needs `--force`, as a device holding other data does.
    fn check_forced_start_copy(
        &self,
        d: &dyn MetaDevice,
        own: &Superblock,
        overwrite: Overwrite,
    ) -> Result<(), ControlError> {
        let Some(role) = self
            .template
            .members
            .iter()
            .position(|m| m.uuid == own.this_uuid && m.state == MemberState::Failed)
        else {
            return Ok(());
        };
        match self.failed_past_tolerance() {
            Some(why) if overwrite == Overwrite::Refuse => Err(ControlError::Invalid(format!(
                "{} is the device of failed member {role}, and {why}: made a spare, it would \
                 lose the data a forced start brings back. Nothing was changed. Stop the \
                 array and start it with --force (which brings back the devices of failed \
                 members, the last to fail first), or pass --force to make it a spare anyway",
                d.name()
            ))),
            _ => Ok(()),
        }
    }

    /// Take hot spare `device` out of the array: it leaves the member table (and any record
    /// of a `replace` copying to it goes with its entry), and every other holder's
    /// superblocks say so. The device's own superblocks are left as they were (the caller
    /// erases them, `erase_superblocks`): should that fail or a crash come first, assembly
    /// leaves a spare the newest table does not list out, never reads it.
    pub fn remove_spare(
        &mut self,
        devices: &[&dyn MetaDevice],
        device: usize,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        let Some(at) = self.spares.iter().position(|&d| d == device) else {
            return Err(ControlError::Invalid(format!(
                "{} is not a hot spare of this array",
                devices[device].name()
            )));
        };
        // Both lists lose the same position: the i-th spare device stays the i-th entry.
        self.spares.remove(at);
        self.template.spares.remove(at);
        self.template.event += 1;
        self.write_all(devices).map(|_| ())
    }

    /// Store new tunables in every superblock.
    pub fn set_tunables(
        &mut self,
        devices: &[&dyn MetaDevice],
        tunables: flashraid_format::superblock::Tunables,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        self.template.tunables = tunables;
        self.template.event += 1;
        self.write_all(devices).map(|_| ())
    }

    /// The `replace` recorded as in progress: the role being replaced and the spare device
    /// it is being copied to.
    pub fn replacing(&self) -> Option<(MemberIndex, usize)> {
        self.template
            .spares
            .iter()
            .zip(&self.spares)
            .find_map(|(entry, &device)| entry.replacing.map(|role| (MemberIndex(role), device)))
    }

    /// Record (`Some(role)`) or clear (`None`) in every superblock that spare `device` is
    /// replacing `role`, so that a restart during the copy starts it over. Any other record
    /// is cleared (one replace at a time). Clearing for a device that is no longer a spare,
    /// or a record already as asked, writes nothing.
    pub fn set_replacing(
        &mut self,
        devices: &[&dyn MetaDevice],
        device: usize,
        role: Option<MemberIndex>,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        let Some(at) = self.spares.iter().position(|&d| d == device) else {
            return match role {
                None => Ok(()),
                Some(_) => Err(ControlError::Invalid("the new device is not a spare".into())),
            };
        };
        let wanted = role.map(MemberIndex::get).map(|r| u16::try_from(r).expect("fits"));
        let unchanged = self
            .template
            .spares
            .iter()
            .enumerate()
            .all(|(i, e)| e.replacing == if i == at { wanted } else { None });
        if unchanged {
            return Ok(());
        }
        for (i, entry) in self.template.spares.iter_mut().enumerate() {
            entry.replacing = if i == at { wanted } else { None };
        }
        self.template.event += 1;
        self.write_all(devices).map(|_| ())
    }

    /// The rebuild in progress, if any: the role and the stripe it resumes from.
    pub fn rebuild_in_progress(&self) -> Option<(MemberIndex, StripeIndex)> {
        let role = self.template.rebuild_role;
        (role != ROLE_NONE && self.roles[usize::from(role)].is_some()).then(|| {
            let cursor = self.template.rebuild_cursor_stripes;
            (MemberIndex(role), StripeIndex(if cursor == CURSOR_NONE { 0 } else { cursor }))
        })
    }

    /// A failed role a hot spare could replace now: none while a rebuild runs (one at a
    /// time), none without a spare or on a level with no redundancy, and none while the
    /// array is failed past its tolerance (`spare_held_back`).
    pub fn spare_wanted(&self) -> Option<MemberIndex> {
        if self.template.rebuild_role != ROLE_NONE
            || self.spares.is_empty()
            || self.template.geometry().tolerance() == 0
            || self.past_tolerance()
        {
            return None;
        }
        let role = (0..self.roles.len()).find(|&r| self.roles[r].is_none())?;
        Some(MemberIndex(u16::try_from(role).expect("fits")))
    }

    /// The roles out of service when a hot spare would take one but the array is failed past
    /// its tolerance: the members in service cannot reconstruct a failed role, so a rebuild
    /// onto the spare would stall at its first stripe and the spare, holding a role, would
    /// no longer be a spare to give to an array brought back with `--force`. `None` when no
    /// spare is held back for that reason.
    pub fn spare_held_back(&self) -> Option<Vec<usize>> {
        let held = self.template.rebuild_role == ROLE_NONE
            && !self.spares.is_empty()
            && self.template.geometry().tolerance() > 0
            && self.past_tolerance();
        held.then(|| self.missing_roles())
    }

    /// Whether the roles out of service (a role being rebuilt counted as out: it holds only
    /// part of its data) are more than the level survives.
    pub fn past_tolerance(&self) -> bool {
        !self.template.geometry().survives(&self.unavailable_roles(None))
    }

    /// While the array is failed past its tolerance, says so for an operator: "the array is
    /// failed past its tolerance: members [0, 1] are out of service (...), more than raid5
    /// x4 survives". `None` while it survives.
    pub fn failed_past_tolerance(&self) -> Option<String> {
        let unavailable = self.unavailable_roles(None);
        let geometry = self.template.geometry();
        if geometry.survives(&unavailable) {
            return None;
        }
        let out: Vec<usize> = (0..unavailable.len()).filter(|&r| unavailable[r]).collect();
        let rebuilding = match self.rebuild_in_progress() {
            Some((role, _)) => format!(", member {} being rebuilt counted as out", role.get()),
            None => String::new(),
        };
        Some(format!(
            "the array is failed past its tolerance: members {out:?} are out of service{}, \
             more than {} x{} survives",
            rebuilding,
            geometry.level(),
            geometry.member_count()
        ))
    }

    /// Per role, whether it is out of service: no device holds it, it is being rebuilt (it
    /// holds only part of its data), or it is `also` (a role about to be failed).
    pub fn unavailable_roles(&self, also: Option<usize>) -> Vec<bool> {
        let rebuilding = self.rebuild_in_progress().map(|(r, _)| r.get());
        (0..self.roles.len())
            .map(|r| self.roles[r].is_none() || rebuilding == Some(r) || also == Some(r))
            .collect()
    }

    /// Give the failed `role` to a hot spare (`preferred` if it is one, else the first; never
    /// `busy`, a device something else may still be writing): the spare's device takes the role as
    /// `Rebuilding` from stripe 0, durably (`give_role`). Returns the device index now
    /// holding the role. The engine must have applied the role's failure before (its stale
    /// chunks are never read again) and starts the rebuild after this returns.
    ///
    /// `partial`: the spare already holds the role's chunks (copied from the member it
    /// replaces while the missed-write map recorded every region written meanwhile), so
    /// only the regions the map names are rebuilt.
    pub fn take_spare(
        &mut self,
        devices: &[&dyn MetaDevice],
        role: MemberIndex,
        preferred: Option<usize>,
        partial: bool,
        busy: Option<usize>,
    ) -> Result<usize, ControlError> {
        self.check_writable()?;
        let r = role.get();
        if self.roles[r].is_some() || self.template.members[r].state != MemberState::Failed {
            return Err(ControlError::Invalid(format!("role {r} is not failed")));
        }
        if self.template.rebuild_role != ROLE_NONE {
            return Err(ControlError::Invalid("a rebuild is already running".into()));
        }
        if self.spares.is_empty() {
            return Err(ControlError::Invalid("no hot spare".into()));
        }
        if self.past_tolerance() {
            return Err(ControlError::Invalid(format!(
                "members {:?} are out of service, more than {} survives: nothing is left to \
                 rebuild role {r} from",
                self.missing_roles(),
                self.template.geometry().level()
            )));
        }
        // The spare `replace` named, else the first; never `busy`.
        let free = |&d: &usize| Some(d) != busy;
        let pick = preferred.filter(free).and_then(|d| self.spares.iter().position(|&s| s == d));
        let Some(pick) = pick.or_else(|| self.spares.iter().position(free)) else {
            return Err(ControlError::Invalid(
                "the only hot spare is still being written by a replace's copy that was given \
                 up; it takes over once that copy has stopped"
                    .into(),
            ));
        };
        let device = self.spares.remove(pick);
        // Only the device that was copied can skip what it holds.
        let partial = partial && preferred == Some(device);
        let mut entry = self.template.spares.remove(pick);
        entry.state = MemberState::Rebuilding;
        entry.partial_rebuild = partial;
        // The taker is a role now, no spare's replace target (`give_role` clears any other
        // spare's record of the role).
        entry.replacing = None;
        entry.failed_at_event = 0;
        entry.errors_corrected = 0;
        self.give_role(devices, role, device, entry, "taking over")?;
        Ok(device)
    }

    /// `device` takes the failed `role` as `entry` (state Rebuilding), rebuilt from stripe 0,
    /// durably: its map areas first (valid, so assembly can read them, and holding what the
    /// members in service hold: should it later be the last of them, they must still say
    /// it), then every superblock. An error if the device itself failed the write: the role
    /// is failed again, and the engine must not start a rebuild onto it.
    fn give_role(
        &mut self,
        devices: &[&dyn MetaDevice],
        role: MemberIndex,
        device: usize,
        entry: flashraid_format::superblock::MemberEntry,
        doing: &str,
    ) -> Result<(), ControlError> {
        assert_eq!(entry.state, MemberState::Rebuilding);
        assert_eq!(entry.replacing, None, "a role's entry replaces nothing");
        let r = role.get();
        // The role is taken (by a spare, or by its own member re-added): no spare replaces it
        // any more; the copy's target, if another device took the role, stays a plain spare.
        self.clear_replacing_of(r);
        self.write_maps_for_newcomer(devices, device)?;
        self.note_size(devices, device);
        self.template.members[r] = entry;
        self.template.rebuild_role = role.0;
        self.template.rebuild_cursor_stripes = 0;
        self.template.event += 1;
        self.roles[r] = Some(device);
        self.joining = vec![device];
        let written = self.write_all(devices);
        self.joining.clear();
        written?;
        if self.roles[r].is_none() {
            return Err(ControlError::Invalid(format!(
                "{} failed while {doing} role {r}",
                devices[device].name()
            )));
        }
        Ok(())
    }

    /// Record rebuild progress: every stripe below `cursor` is rebuilt. The replacement is
    /// synced first, so the recorded cursor never covers chunks still in a volatile cache.
    pub fn record_rebuild_progress(
        &mut self,
        devices: &[&dyn MetaDevice],
        cursor: StripeIndex,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        let role = self.template.rebuild_role;
        if role == ROLE_NONE || cursor.0 <= self.template.rebuild_cursor_stripes {
            return Ok(());
        }
        let Some(device) = self.roles[usize::from(role)] else { return Ok(()) };
        devices[device].sync().map_err(io_error(devices[device]))?;
        self.template.rebuild_cursor_stripes = cursor.0;
        self.template.event += 1;
        self.write_all(devices).map(|_| ())
    }

    /// The rebuild finished on every shard: the replacement becomes an active member
    /// (synced first). Returns the role.
    pub fn finish_rebuild(
        &mut self,
        devices: &[&dyn MetaDevice],
    ) -> Result<MemberIndex, ControlError> {
        self.check_writable()?;
        let role = self.template.rebuild_role;
        if role == ROLE_NONE {
            return Err(ControlError::Invalid("no rebuild is running".into()));
        }
        let Some(device) = self.roles[usize::from(role)] else {
            return Err(ControlError::Invalid("the rebuilt role has no device".into()));
        };
        devices[device].sync().map_err(io_error(devices[device]))?;
        let entry = &mut self.template.members[usize::from(role)];
        entry.state = MemberState::Active;
        entry.partial_rebuild = false;
        self.template.rebuild_role = ROLE_NONE;
        self.template.rebuild_cursor_stripes = CURSOR_NONE;
        self.template.event += 1;
        if self.all_in_service() {
            // The map may still name old regions (the engine empties it after this); a
            // superset never loses anything.
            self.template.missed_map_since_event = self.template.event;
        }
        self.write_all(devices)?;
        Ok(MemberIndex(role))
    }

    /// Whether the rebuild in progress is a partial one (a re-added member).
    pub fn rebuild_is_partial(&self) -> bool {
        let role = self.template.rebuild_role;
        role != ROLE_NONE && self.template.members[usize::from(role)].partial_rebuild
    }

    /// Whether device `device` (the last of `devices` or one already known) is this array's
    /// own member of a failed role that can come back with only the regions it missed
    /// rebuilt. Returns the role, or why not (the caller then adds it as a spare and rebuilds
    /// it in full).
    pub fn re_add_check(
        &self,
        devices: &[&dyn MetaDevice],
        device: usize,
    ) -> Result<MemberIndex, ReAddRefusal> {
        use ReAddRefusal::{NotAMember, Refused};
        let d = devices[device];
        let candidate = read_candidate(d);
        let Some(own) = candidate.copies.iter().flatten().max_by_key(|sb| sb.event).cloned() else {
            return Err(NotAMember);
        };
        let sb = &self.template;
        if own.array_uuid != sb.array_uuid {
            return Err(NotAMember);
        }
        if let Some(why) = reused_since_it_left(d, &candidate) {
            return Err(Refused(why));
        }
        let Some(role) = sb.members.iter().position(|m| m.uuid == own.this_uuid) else {
            return Err(Refused(
                "its member identity holds no role (a former spare, or its role was taken \
                 over by another device)"
                    .into(),
            ));
        };
        let entry = &sb.members[role];
        if entry.state != MemberState::Failed || self.roles[role].is_some() {
            return Err(Refused(format!("its role {role} is not failed")));
        }
        // Before any other refusal, which would make it a spare: a re-add would stall (a
        // role being rebuilt counts as out, so taking it back never brings the array within
        // its tolerance), and its superblock would then call it Rebuilding, so a forced start
        // would bring back an earlier failed member in its place and rebuild it from that
        // member's stale chunks. Level 0 included: a forced start brings its members back.
        if let Some(why) = self.failed_past_tolerance() {
            return Err(ReAddRefusal::PastTolerance(why));
        }
        if sb.geometry().tolerance() == 0 {
            return Err(Refused("the level has no redundancy to rebuild from".into()));
        }
        if !entry.in_sync_when_failed {
            return Err(Refused(format!(
                "role {role} was not in sync when it failed (it was being rebuilt, or the \
                 array is older than the missed-write map)"
            )));
        }
        if sb.missed_map_since_event == 0 || sb.missed_map_since_event > entry.failed_at_event {
            return Err(Refused("the missed-write map does not cover its absence".into()));
        }
        if usize::from(own.this_role) != role
            || own.members[role].state != MemberState::Active
            || own.event < sb.missed_map_since_event
            || own.event >= entry.failed_at_event
        {
            return Err(Refused(format!(
                "its superblock (event {}) is not the one it had when it failed at event {}: \
                 its contents cannot be trusted",
                own.event, entry.failed_at_event
            )));
        }
        let capacity = flashraid_format::layout::member_data_capacity(d.size_bytes());
        if capacity.is_none_or(|c| c < sb.member_data_bytes) {
            return Err(Refused("it is smaller than a member's data area".into()));
        }
        if sb.rebuild_role != ROLE_NONE {
            return Err(ReAddRefusal::Busy(MemberIndex(u16::try_from(role).expect("fits"))));
        }
        Ok(MemberIndex(u16::try_from(role).expect("fits")))
    }

    /// Re-add device `device` to its failed role (see `re_add_check`): it takes the role back
    /// as `Rebuilding` with a partial rebuild from stripe 0, durably. Its map areas are
    /// written first with what the members in service hold. The engine then starts a
    /// partial rebuild (`Shard::start_rebuild` with `partial`).
    pub fn re_add(
        &mut self,
        devices: &[&dyn MetaDevice],
        device: usize,
    ) -> Result<MemberIndex, ControlError> {
        self.check_writable()?;
        assert!(device <= self.sizes.len(), "a known device or the next one");
        let role = self
            .re_add_check(devices, device)
            .map_err(|why| ControlError::Invalid(why.to_string()))?;
        self.check_newcomer(devices, device)?;
        let mut entry = self.template.members[role.get()];
        entry.state = MemberState::Rebuilding;
        entry.partial_rebuild = true;
        entry.in_sync_when_failed = false;
        entry.failed_at_event = 0;
        self.give_role(devices, role, device, entry, "taking back")?;
        Ok(role)
    }

    /// Mark the array clean (every shard has flushed and cleared its bitmap), in two passes,
    /// the second recording its own count as the session's (`session_update_count`), as a
    /// start does: the session's data writes are all done before the first, so every member
    /// that was in service through the session has had it and is at most one pass short of
    /// that count, whatever is cut, while a copy of a member taken while the array ran
    /// (before this stop: a `cp` or snapshot of a member file, put back later) is two or more
    /// short, and assembly leaves it out rather than read its old chunks.
    pub fn mark_clean(&mut self, devices: &[&dyn MetaDevice]) -> Result<(), ControlError> {
        self.mark_stopped(devices, ArrayState::Clean)
    }

    /// A clean stop of a session that began with only background init's regions dirty
    /// (`Prepared::dirty_init_only`) whose shards all stopped with every write durable and
    /// only init's regions left (`Shard::stopped_with_only_init_left`): the array stays
    /// dirty (init goes on at the next start) and records that those regions are init's
    /// only (`INIT_PENDING_NO_CRASH`), in the two passes of `mark_clean`. Refused for any
    /// other session: what it left dirty may hold writes in flight at a crash.
    pub fn mark_stopped_in_init(
        &mut self,
        devices: &[&dyn MetaDevice],
    ) -> Result<(), ControlError> {
        if !self.init_only_session {
            return Err(ControlError::Invalid(
                "this session did not begin with only background init's regions dirty".into(),
            ));
        }
        self.mark_stopped(devices, ArrayState::Dirty)
    }

    fn mark_stopped(
        &mut self,
        devices: &[&dyn MetaDevice],
        state: ArrayState,
    ) -> Result<(), ControlError> {
        self.check_writable()?;
        self.template.state = state;
        if self.init_only_session {
            // The regions still marked (none when clean) are init's: no write was in
            // flight there, every write's bit was cleared once durable.
            self.template.init_state = INIT_PENDING_NO_CRASH;
        }
        self.template.event += 1;
        self.write_all(devices)?;
        self.template.event += 1;
        // The next pass's count (write_all counts it).
        self.template.session_update_count = self.template.update_count + 1;
        self.write_all(devices).map(|_| ())
    }
}

/// Start an assembled array: mark it dirty and write every shard's bitmap block (the dirty
/// regions, if any, in every block) on every present member, then build one `ShardSetup` per
/// shard.
///
/// Read-only (`ArrayAccess::ReadOnly`): nothing is written. The superblocks and bitmap
/// blocks stay as found; roles without a device are failed in memory only; the shards get
/// the dirty regions as untrusted (never resynced) and refuse every write.
pub fn start(
    devices: &[&dyn MetaDevice],
    prepared: &Prepared,
    shards: u32,
    config: ShardConfig,
    kernel: flashraid_parity::Kernel,
    access: ArrayAccess,
) -> Result<(Metadata, Vec<ShardSetup>), ControlError> {
    if shards == 0 || shards > SHARDS_MAX {
        return Err(ControlError::Invalid(format!("shards must be 1 to {SHARDS_MAX}")));
    }
    let a = &prepared.assembled;
    let mut template = a.superblock.clone();
    if access == ArrayAccess::ReadWrite {
        // Read-only, the event stays the one on the members (`status` shows what is there).
        template.event += 1;
    }
    template.state = ArrayState::Dirty;
    template.bitmap_shards = shards;
    // Until a clean stop says otherwise: a crash in this session may leave writes in
    // flight in any dirty region.
    template.init_state = INIT_UNKNOWN;
    let sizes: Vec<u64> = devices.iter().map(|d| d.size_bytes()).collect();
    let mut metadata = Metadata {
        template,
        roles: a.roles.clone(),
        spares: a.spares.clone(),
        sizes,
        unapplied_failures: vec![],
        // Devices forced in (a stale copy, a member failed past the tolerance) go first in
        // the start's first pass (found by review: a cut start left one named active while
        // its own superblock called it stale).
        joining: (0..devices.len())
            .filter(|&d| {
                let name = devices[d].name();
                a.failed_used.contains(&name) || a.stale_used.contains(&name)
            })
            .collect(),
        access,
        init_only_session: prepared.dirty_init_only && access == ArrayAccess::ReadWrite,
    };
    // A role the table calls in service but no device holds is failed now, durably, before
    // the first write skips it: if its device came back later it would hold stale chunks
    // that a table still calling it Active (or Rebuilding) would let assembly use.
    for role in 0..metadata.roles.len() {
        let state = metadata.template.members[role].state;
        if metadata.roles[role].is_none()
            && matches!(state, MemberState::Active | MemberState::Rebuilding)
        {
            metadata.mark_failed(role);
        }
        // A replacement the table does not name as the one being rebuilt (a damaged or
        // hand-edited table): nothing says which of its chunks are current.
        if metadata.roles[role].is_some()
            && state == MemberState::Rebuilding
            && usize::from(metadata.template.rebuild_role) != role
        {
            metadata.mark_failed(role);
        }
    }
    // Every role in service: nothing is missed, and the map is kept from this event on.
    // Otherwise the map carries what assembly found (the map and the dirty regions).
    let missed = if metadata.all_in_service() {
        metadata.template.missed_map_since_event = metadata.template.event;
        vec![]
    } else {
        prepared.missed_regions.clone()
    };
    if access == ArrayAccess::ReadWrite {
        write_start_metadata(devices, &mut metadata, prepared, &missed, shards)?;
    }
    let geometry = a.geometry;
    // A role being rebuilt starts as failed; the caller resumes its rebuild
    // (`Metadata::rebuild_in_progress`) with `Shard::start_rebuild`.
    let rebuilding = metadata.rebuild_in_progress().map(|(role, _)| role.get());
    let members: Vec<MemberSetup> = (0..geometry.member_count())
        .map(|role| MemberSetup {
            health: if metadata.roles[role].is_some() && rebuilding != Some(role) {
                Health::Active
            } else {
                Health::Failed
            },
            zeroes_after_discard: metadata.roles[role]
                .is_some_and(|d| devices[d].zeroes_after_discard()),
        })
        .collect();
    let setups = (0..shards)
        .map(|shard_index| ShardSetup {
            geometry,
            shard_index,
            shard_count: shards,
            config,
            kernel,
            data_offset_bytes: metadata.template.data_offset_bytes,
            members: members.clone(),
            bitmap: BitmapSetup {
                array_uuid: metadata.template.array_uuid,
                area_offset_bytes: metadata.template.bitmap_offset_bytes,
                region_bytes: metadata.template.bitmap_region_bytes,
                dirty_regions: prepared.dirty_regions.clone(),
                dirty_init_only: prepared.dirty_init_only,
                missed_area_offset_bytes: MISSED_MAP_OFFSET_BYTES,
                missed_regions: missed.clone(),
            },
            access,
        })
        .collect();
    Ok((metadata, setups))
}

/// The writes of a read-write start, before any data write: every holder's bitmap blocks,
/// then two superblock passes.
fn write_start_metadata(
    devices: &[&dyn MetaDevice],
    metadata: &mut Metadata,
    prepared: &Prepared,
    missed: &[u32],
    shards: u32,
) -> Result<(), ControlError> {
    // Bitmap first (so a crash after the dirty superblock finds it), then superblocks.
    for &(device, _) in &metadata.holders() {
        write_bitmap_area(devices[device], &metadata.template, &prepared.dirty_regions, shards)?;
        write_map_area(devices[device], &metadata.template, BitmapKind::Missed, missed, shards)?;
    }
    // Two passes before any write of this session, the second recording its own count as
    // the session's: every member in service has had the first pass, so it is at most one
    // pass short of the session's count, while a device that was not here for the first (a
    // stale copy of a member, put back while the array was stopped) is two or more short,
    // and assembly leaves it out. Starts cut short (any number of them, one after another)
    // record no new session and wrote nothing.
    metadata.write_all(devices)?;
    metadata.joining.clear();
    metadata.template.event += 1;
    // This session's writes begin after the next pass (write_all counts it).
    metadata.template.session_update_count = metadata.template.update_count + 1;
    metadata.write_all(devices)?;
    Ok(())
}

/// The UUID of a new array or member from 16 random bytes (the caller draws them).
pub fn uuid_from(random: [u8; 16]) -> Uuid {
    Uuid::from_random_bytes(random)
}
