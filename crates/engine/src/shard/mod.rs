//! One shard of an array: the deterministic state machine that turns requests for the stripes
//! it owns into member IOs, and member completions into replies.
//!
//! Owns: the requests accepted and not yet replied to; the stripe operations, one at a time
//! per stripe (a stripe's requests queue behind its running operation, and queued writes to
//! other chunks of the stripe merge into the next operation); scratch buffers; the member
//! health this shard acts on; the shard's write-intent bitmap block; background resync of
//! regions left dirty by an unclean shutdown.
//!
//! It does no IO, reads no clock and starts no threads: IO goes out through `poll_io` and
//! comes back through `complete_io`, time comes in through `tick`. The same code runs under
//! io_uring and in the simulator.
//!
//! Invariants (asserted in release builds):
//! - A stripe has at most one operation running; requests of different stripes never wait
//!   for each other.
//! - The engine touches the contents of a buffer only while the operation owning it has no
//!   member IO in flight (see `io.rs` for the memory contract).
//! - No member write is issued before the bitmap image marking its region is durable.
//! - A write that skipped a member (or lost its write to it) is acknowledged only after the
//!   metadata that marks the member failed is durable, so that member's stale chunks are
//!   never read again.
//! - A read-only shard (`ArrayAccess::ReadOnly`) polls no member write (asserted in
//!   `poll_io`): writes and zeroes are refused, resync never starts, bad ranges are not
//!   rewritten, the bitmap is left alone.
//! - Every queue and pool is bounded by `ShardConfig`; the only allocations after start are
//!   reconstruction plans, once per erasure pattern.
//!
//! Fault model: member IO errors. A read error is served from redundancy and the bad range is
//! rewritten; a member whose reads keep failing, or whose write fails, is failed. A member
//! with IO outstanding that completes none of it for the member timeout is reported stalled
//! (the metadata owner decides whether to fail it; its outstanding IO keeps its buffers and
//! its requests until it answers). Beyond the
//! level's tolerance, reads of lost data return `Unreadable` and writes `ArrayFailed`; wrong
//! data is never returned.

use crate::EngineError;
use crate::bitmap::{Acquired, WriteIntent};
use crate::config::{ArrayAccess, ShardConfig};
use crate::io::{Durability, IoError, IoToken, MemberCompletion, MemberIo, MemberIoKind};
use crate::owner::Ownership;
use crate::plan::{ChunkRange, ChunkSet, UNIT_BYTES, Units, WritePlan, bit, has};
use crate::request::{
    Rejected, RequestError, RequestId, ShardOp, ShardReply, ShardRequest, ZeroHow,
};
use crate::table::StripeTable;
use flashraid_format::Uuid;
use flashraid_format::bitmap::{BitmapBlock, BitmapKind};
use flashraid_iobuf::{BufPool, IoBuf};
use flashraid_layout::{
    ArrayOffset, BLOCK_BYTES, Geometry, Level, MEMBERS_MAX, MemberIndex, PARITY_CHUNKS_MAX,
    StripeIndex,
};
use flashraid_parity::{Codec, Kernel, ReconstructPlan};
use std::collections::{BTreeMap, VecDeque};

/// Requests merged into one stripe operation, at most.
const OP_REQUESTS_MAX: usize = 16;
/// Scratch buffers one operation can hold: one per chunk, plus the recomputed parity rows of
/// a resync.
const OP_SCRATCH_MAX: usize = MEMBERS_MAX + PARITY_CHUNKS_MAX;
// `Op::scratch_held` is a u128 mask of these slots.
const _: () = assert!(OP_SCRATCH_MAX <= 128);
/// Reconstruction plans kept (patterns of up to three erasures); the cache is emptied when
/// full rather than grown.
const PLAN_CACHE_MAX: usize = 1024;
/// The stripes of a member's last read errors remembered, so a repeated read of one is not
/// counted as a new read error (`Shard::note_read_error`): as many as a stalled rebuild's
/// window retries at once (found by review: 16 let its retries count again).
const BAD_STRIPES_SEEN_MAX: usize = 64;
/// Times an operation re-plans after member errors before giving up on a read.
const REPLANS_MAX: u32 = PARITY_CHUNKS_MAX as u32 + 1;

// Token layout: origin in the top 4 bits, then per-origin fields.
const ORIGIN_SHIFT: u32 = 60;
/// Bits 56-59 of a member IO's token: the epoch of the device holding its member's role when
/// the IO was polled (`member_epoch`), so a completion from a device the role has since left
/// is told apart from one of the device holding it now.
const EPOCH_SHIFT: u32 = 56;
/// Epochs a role's device counter goes through before it comes round again.
pub const EPOCHS: usize = 16;
const ORIGIN_OP: u64 = 1;
const ORIGIN_FLUSH: u64 = 2;
const ORIGIN_BITMAP: u64 = 3;
const ORIGIN_INTERNAL_FLUSH: u64 = 4;
/// A member flush of a group of FUA zeroes (`background::zero_flush_for_fua`); the token's
/// chunk field holds the member.
const ORIGIN_FUA_FLUSH: u64 = 5;

/// A member's health as this shard acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// In service.
    Active,
    /// Failed here; the metadata saying so is not durable yet. Not read or written.
    Failing,
    /// Failed, durably.
    Failed,
    /// A replacement being rebuilt: in service for the stripes the rebuild has passed
    /// (`Shard::usable`), treated as missing for the others.
    Rebuilding,
}

/// A member as the shard starts with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberSetup {
    pub health: Health,
    /// The member reads zeroes after a discard (so discard can replace writing zeroes).
    pub zeroes_after_discard: bool,
}

/// The write-intent bitmap as the shard starts with it.
#[derive(Clone, Debug)]
pub struct BitmapSetup {
    pub array_uuid: Uuid,
    /// Absolute offset of the bitmap area on every member.
    pub area_offset_bytes: u64,
    pub region_bytes: u64,
    /// Regions an unclean shutdown left dirty: marked on disk already, resynced in the
    /// background.
    pub dirty_regions: Vec<u32>,
    /// `dirty_regions` are only those background init has not reached, with no crash
    /// since (the superblock's `init_state`): reconstruction there is trusted.
    pub dirty_init_only: bool,
    /// Absolute offset of the missed-write map area on every member.
    pub missed_area_offset_bytes: u64,
    /// Regions the missed-write map names (written by the runtime before the shard starts).
    pub missed_regions: Vec<u32>,
}

/// Everything a shard needs to start.
#[derive(Clone, Debug)]
pub struct ShardSetup {
    pub geometry: Geometry,
    pub shard_index: u32,
    pub shard_count: u32,
    pub config: ShardConfig,
    pub kernel: Kernel,
    /// Absolute offset of the data area on every member.
    pub data_offset_bytes: u64,
    /// Per role slot.
    pub members: Vec<MemberSetup>,
    pub bitmap: BitmapSetup,
    /// Whether the members may be written (see `ArrayAccess`).
    pub access: ArrayAccess,
}

/// Something the runtime must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardEvent {
    /// The shard stopped using a member. The metadata owner must record it durably and then
    /// call `apply_failed` on every shard. `epoch` counts the `start_rebuild`s of the role
    /// (mod 16), as the metadata owner can: a report about a device the role has since left
    /// (another shard reported it first and a spare took over) names an older epoch.
    MemberFailed { member: MemberIndex, reason: FailReason, epoch: u8 },
    /// A read error on a member was repaired by rewriting the range from redundancy.
    ErrorCorrected { member: MemberIndex },
    /// Resync of this shard's part of the dirty regions finished.
    ResyncDone,
    /// Rebuild passed another checkpoint: every stripe of this shard below `done_below` is
    /// rebuilt (its writes completed; not yet flushed).
    /// `generation` counts `start_rebuild` calls (the same on every shard, which all get the
    /// same sequence): the metadata owner ignores events of an abandoned rebuild.
    RebuildProgress { member: MemberIndex, generation: u32, done_below: StripeIndex },
    /// Every stripe of this shard is rebuilt.
    RebuildDone { member: MemberIndex, generation: u32 },
    /// Rebuild cannot go on: a stripe could not be reconstructed (`cause` says why). The
    /// stripes from `stripe` on stay unrebuilt.
    RebuildStalled { member: MemberIndex, stripe: StripeIndex, cause: StallCause },
    /// This shard's scrub finished (or stopped early, saying why).
    ScrubDone { tally: ScrubTally, stopped: Option<&'static str> },
    /// The device holding `member`'s role has IO outstanding and completed none of it for
    /// the member timeout. A report, not a failure: whether the array can do without the
    /// member is the metadata owner's to judge (it sees every shard's failures); it fails
    /// the member through the metadata, or waits the stall out. Repeated at most once a
    /// timeout while the stall lasts.
    MemberStalled { member: MemberIndex, epoch: u8 },
}

/// Why a rebuild stalled at a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallCause {
    /// More members unreadable there (failed, missing or with bad sectors) than the level
    /// survives.
    Unreadable,
    /// The stripe lies in a region an unclean shutdown left dirty, and the array was
    /// degraded before resync vouched for it: its parity may disagree with its data, and no
    /// second parity row is left to check the reconstruction (RAID 5, or RAID 6 with two
    /// roles out), or the check failed. `Shard::set_rebuild_trust_parity` lets the rebuild
    /// write its reconstruction anyway.
    Unverifiable,
}

/// Why a member was failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    WriteError,
    /// More read errors than `member_read_errors_max`.
    ReadErrors,
    /// The device is gone.
    Gone,
    /// A flush failed.
    FlushError,
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailReason::WriteError => "a write failed",
            FailReason::ReadErrors => "too many read errors",
            FailReason::Gone => "the device is gone",
            FailReason::FlushError => "a flush failed",
        })
    }
}

/// Counters for status and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardCounters {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    pub rcw_writes: u64,
    pub degraded_writes: u64,
    pub degraded_reads: u64,
    /// Chunks degraded reads rebuilt straight into the reading request's buffer (the rest
    /// are rebuilt in scratch and copied: a chunk two merged reads both want, or one whose
    /// reader covers only part of the range rebuilt with another chunk). Counted per
    /// reconstruction round, like `degraded_reads`: a read re-planned after a source's read
    /// error counts again.
    pub degraded_reads_in_place: u64,
    pub errors_corrected: u64,
    pub member_reads: u64,
    pub member_writes: u64,
    pub bitmap_writes: u64,
    pub resync_stripes: u64,
    pub resync_repairs: u64,
    pub rebuild_stripes: u64,
    /// Stripes rebuilt in regions an unclean shutdown left untrusted: verified against a
    /// second parity row, or parity recomputed from the data.
    pub rebuild_untrusted_stripes: u64,
    /// Of those, stripes rebuilt from parity that could not be checked, because the
    /// operator allowed it (`set_rebuild_trust_parity`): their rebuilt chunk is wrong where
    /// a write was in flight at the unclean shutdown (the write hole).
    pub rebuild_unverified_stripes: u64,
    pub rejected_busy: u64,
    /// Stripes whose partial writes waited for the merge window, and how many of them were
    /// filled by neighbours before it ended (the rest started when it did).
    pub merge_waits: u64,
    pub merge_filled: u64,
}

impl ShardCounters {
    /// Add another shard's counters (an array's totals are the sum over its shards).
    pub fn add(&mut self, c: &ShardCounters) {
        let ShardCounters {
            reads,
            writes,
            read_bytes,
            write_bytes,
            flushes,
            full_stripe_writes,
            rmw_writes,
            rcw_writes,
            degraded_writes,
            degraded_reads,
            degraded_reads_in_place,
            errors_corrected,
            member_reads,
            member_writes,
            bitmap_writes,
            resync_stripes,
            resync_repairs,
            rebuild_stripes,
            rebuild_untrusted_stripes,
            rebuild_unverified_stripes,
            rejected_busy,
            merge_waits,
            merge_filled,
        } = c;
        // Destructured, so a new counter cannot be left out of the sum.
        self.reads += reads;
        self.writes += writes;
        self.read_bytes += read_bytes;
        self.write_bytes += write_bytes;
        self.flushes += flushes;
        self.full_stripe_writes += full_stripe_writes;
        self.rmw_writes += rmw_writes;
        self.rcw_writes += rcw_writes;
        self.degraded_writes += degraded_writes;
        self.degraded_reads += degraded_reads;
        self.degraded_reads_in_place += degraded_reads_in_place;
        self.errors_corrected += errors_corrected;
        self.member_reads += member_reads;
        self.member_writes += member_writes;
        self.bitmap_writes += bitmap_writes;
        self.resync_stripes += resync_stripes;
        self.resync_repairs += resync_repairs;
        self.rebuild_stripes += rebuild_stripes;
        self.rebuild_untrusted_stripes += rebuild_untrusted_stripes;
        self.rebuild_unverified_stripes += rebuild_unverified_stripes;
        self.rejected_busy += rejected_busy;
        self.merge_waits += merge_waits;
        self.merge_filled += merge_filled;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Read,
    Write,
    Resync,
    Rebuild,
    Scrub,
    Zero { how: ZeroHow },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for scratch buffers.
    Starved,
    Reading,
    /// Resync: chunks whose read failed are read again in 4 KiB units (`UNIT_BYTES`), to
    /// tell the units that cannot be read from those that can.
    Probing,
    Rebuilding,
    WaitBitmap,
    /// A FUA zero whose writes are done, waiting for the member flushes of its group.
    WaitFlush,
    Writing,
    Repairing,
    WaitMetadata,
}

/// One request's piece of a stripe operation.
#[derive(Clone, Copy, Debug)]
struct Part {
    request: usize,
    /// Chunks of this request whose data must come from reconstruction (reads).
    rebuild: ChunkSet,
    /// Chunks of this request that could not be read at all.
    lost: ChunkSet,
    /// Chunks re-read from another mirror copy after an error (to repair the bad copy).
    recovered: ChunkSet,
}

#[derive(Debug)]
struct Op {
    stripe: StripeIndex,
    kind: OpKind,
    parts: [Option<Part>; OP_REQUESTS_MAX],
    phase: Phase,
    /// Member IOs in flight.
    pending: u32,
    /// Bumped at every phase that issues IO; tokens carry it.
    serial: u16,
    /// Member of each chunk index (data `0..k`, parity `k..k+m`, or copies for mirrors).
    chunk_member: [u16; MEMBERS_MAX],
    /// Per data position: the range written, the request holding the new data and where in
    /// its buffer that data starts.
    touched: [Option<Touch>; MEMBERS_MAX],
    plan: Option<WritePlan>,
    /// Chunks whose member failed an IO during this operation.
    errored: ChunkSet,
    /// Rebuild in progress (reads and degraded writes): the chunks treated as erased, the
    /// chunks being rebuilt and the byte range.
    rebuild_erased: ChunkSet,
    rebuild_targets: ChunkSet,
    rebuild_range: Option<ChunkRange>,
    /// The error a part gets for data it could not read.
    lost_error: RequestError,
    scratch: [Option<IoBuf>; OP_SCRATCH_MAX],
    /// Which `scratch` slots hold a buffer (bit = slot).
    scratch_held: u128,
    scratch_base: [usize; OP_SCRATCH_MAX],
    /// Members this operation skipped or lost that are not durably failed yet.
    needs_failed: u64,
    durability: Durability,
    result: Result<(), RequestError>,
    bitmap_target: Option<u64>,
    region: u32,
    replans: u32,
    /// Resync: parity rows that disagreed and were rewritten.
    repaired: ChunkSet,
    /// Where to pick up when scratch buffers become free again.
    resume: Resume,
    /// Zero: members (chunk index = member) that refused the zeroing command and get zeroes
    /// written instead.
    zero_fallback: ChunkSet,
    /// Zero: the fallback writes were issued.
    zero_fallback_issued: bool,
    /// Zero with FUA: the member flush that makes it durable was issued.
    fua_flushed: bool,
    /// Rebuild and scrub: the rebuild or scrub this operation belongs to (an operation of an
    /// abandoned one must not count for the next).
    rebuild_generation: u32,
    /// Rebuild of a stripe resync has not vouched for: every chunk is read and the target
    /// written only if the stripe proves consistent.
    rebuild_verify: bool,
    /// Rebuild: this stripe's reconstruction cannot be checked (or failed its check) and is
    /// written because the operator allowed it; counted when it is.
    rebuild_unverified: bool,
    /// Resync, scrub, reads and writes: the chunks whose read failed and were read again
    /// unit by unit.
    probed: ChunkSet,
    /// Reads: the phase a probe (`read_probe`) returns to.
    probe_from: Phase,
    /// Resync, scrub and reads: per chunk index, the 4 KiB units that failed to read while
    /// probing; once resync or scrub has decided, the units to rewrite.
    units: [Units; MEMBERS_MAX],
}

/// The slot indexes set in a `scratch_held` mask, lowest first.
fn held_slots(mut mask: u128) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let index = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            index
        })
    })
}

impl Op {
    /// An operation with nothing in it, for a new box (`Shard::new_op` fills it in).
    fn blank() -> Op {
        Op {
            stripe: StripeIndex(0),
            kind: OpKind::Read,
            parts: [None; OP_REQUESTS_MAX],
            phase: Phase::Starved,
            pending: 0,
            serial: 0,
            chunk_member: [u16::MAX; MEMBERS_MAX],
            touched: [None; MEMBERS_MAX],
            plan: None,
            errored: 0,
            rebuild_erased: 0,
            rebuild_targets: 0,
            rebuild_range: None,
            lost_error: RequestError::Unreadable,
            scratch: std::array::from_fn(|_| None),
            scratch_held: 0,
            scratch_base: [0; OP_SCRATCH_MAX],
            needs_failed: 0,
            durability: Durability::Cached,
            result: Ok(()),
            bitmap_target: None,
            region: 0,
            replans: 0,
            repaired: 0,
            resume: Resume::Begin,
            zero_fallback: 0,
            zero_fallback_issued: false,
            fua_flushed: false,
            rebuild_generation: 0,
            rebuild_verify: false,
            rebuild_unverified: false,
            probed: 0,
            probe_from: Phase::Reading,
            units: [Units::default(); MEMBERS_MAX],
        }
    }
}

/// What a starved operation does when buffers free up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resume {
    /// Start from the beginning (nothing issued yet).
    Begin,
    /// Restart the read rebuild round.
    ReadRebuild,
    /// Re-plan a write after read errors.
    WriteReplan,
}

/// Where `issue_unit_reads` puts what it reads: a request's buffer, or the op's scratch
/// slot of the chunk read, at the byte for the range's first unit.
#[derive(Clone, Copy, Debug)]
enum UnitDest {
    Request { slot: usize, at: u64 },
    Scratch { at: usize },
}

/// One data chunk's part of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Touch {
    range: ChunkRange,
    request: usize,
    buf_offset: usize,
}

/// What the merge window makes of an idle stripe's queue (`Shard::merge_verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Merge {
    /// Partial-stripe writes that neighbours could still fill: wait.
    Wait,
    /// Writes that fill every data chunk: start (a full-stripe write).
    Full,
    /// Anything else: start.
    Start,
}

/// Per-stripe entry: the running operation and the queue of requests behind it.
#[derive(Clone, Copy, Debug, Default)]
struct StripeEntry {
    op: Option<usize>,
    queue_head: Option<usize>,
    queue_tail: Option<usize>,
    /// Nonzero: the queued writes wait until this time for neighbours that would fill the
    /// stripe (the merge window); `merge_waiting` then holds `(stripe, merge_until_us)`
    /// and `op` is `None`.
    merge_until_us: u64,
}

#[derive(Debug)]
struct Request {
    id: RequestId,
    op: ShardOp,
    buf: Option<IoBuf>,
    /// Address of byte 0 of `buf`, taken once when the request arrived (before any IO).
    base: usize,
    next_in_stripe: Option<usize>,
    /// Flush: member flushes in flight; the bitmap's mark when it was issued
    /// (`WriteIntent::flush_issued`); whether a member's flush failed (its writes may not be
    /// durable).
    pending: u32,
    flush_issued_at: u64,
    member_errors: bool,
}

/// The shard. See the module documentation.
#[derive(Debug)]
pub struct Shard {
    geometry: Geometry,
    codec: Option<Codec>,
    shard_index: u32,
    /// Which stripes are this shard's (runs of neighbours, see `crate::owner`).
    ownership: Ownership,
    config: ShardConfig,
    data_offset_bytes: u64,
    bitmap_offset_bytes: u64,
    /// This shard's block of the missed-write map.
    missed_offset_bytes: u64,
    members: Vec<MemberSetup>,
    read_errors: Vec<u32>,
    /// Per member, the stripes of its last `BAD_STRIPES_SEEN_MAX` read errors that nothing
    /// has written since (packed at the front, newest first; `None`: empty). A bad range
    /// that is not rewritten (a read-only array; no redundancy left to rebuild it from, on a
    /// degraded array or under a stalled rebuild that retries) fails again at every read,
    /// and a client retrying (a copy tool) or a rebuild's retries would count each read as a
    /// new error and fail a member that has one bad sector (found by review, first
    /// read-only, then degraded: on a degraded RAID 5 that failed the array). A repeat of a
    /// stripe in the ring is not counted again; a write to the member's chunk there takes
    /// the stripe out (`issue`), so a range that still fails after its repair counts again.
    bad_stripes_seen: Vec<[Option<StripeIndex>; BAD_STRIPES_SEEN_MAX]>,
    /// Per member: the epoch of the device holding its role (bumped when a device takes the
    /// role over, `start_rebuild`), stamped into each IO's token by `poll_io` and carried by
    /// failure and stall reports.
    member_epoch: Vec<u8>,
    /// Per member and epoch (`member * EPOCHS + epoch`): IOs the driver accepted
    /// (`io_submitted`) and not yet completed. IO held back for a full ring is not counted:
    /// a member cannot stall on IO it was never given.
    member_ios_outstanding: Vec<u32>,
    /// Per member, for its current epoch: when an IO last completed (or, if none was
    /// outstanding, when the first of these was accepted). A member with IO outstanding and
    /// no completion for `member_io_timeout_us` is reported stalled
    /// (`check_stalled_members`).
    member_progress_us: Vec<u64>,
    /// Per member: when its stall was last reported (`None`: not stalled since its last
    /// progress).
    member_stall_reported_us: Vec<Option<u64>>,
    /// Set while a completion from a device that no longer holds its member's role is
    /// handled: its errors say nothing about the device holding the role now.
    completing_stale: bool,
    requests: Vec<Option<Request>>,
    free_requests: Vec<usize>,
    /// Running operations by slot. Boxed: an `Op` is several KiB (per-member arrays sized
    /// for `MEMBERS_MAX`), and moving it by value into and out of its slot cost more memory
    /// traffic than a 4 KiB read's data (a profile put 6% of the 4k random read CPU there).
    ops: Vec<Option<Box<Op>>>,
    free_ops: Vec<usize>,
    /// Boxes of finished operations, reused by `new_op` (never more than the op slots).
    spare_ops: Vec<Box<Op>>,
    stripes: StripeTable<StripeEntry>,
    starved: VecDeque<usize>,
    waiting_bitmap: Vec<usize>,
    waiting_metadata: Vec<usize>,
    pool: BufPool,
    plans: BTreeMap<(u64, u64), ReconstructPlan>,
    bitmap: WriteIntent,
    bitmap_pending: u32,
    internal_flush_pending: u32,
    /// The bitmap's mark for the internal flush in flight (`WriteIntent::flush_issued`).
    internal_flush_issued_at: u64,
    /// A member flush of the internal flush in flight failed.
    internal_flush_errors: bool,
    /// FUA zeroes whose writes are done, waiting for the next group of member flushes (one
    /// flush per member serves every zero that finished its writes before it was issued,
    /// instead of a flush per member per stripe). At most one entry per op slot.
    fua_waiting: Vec<usize>,
    /// The zeroes the group of member flushes in flight serves (empty with none in flight;
    /// taken out while the group finishes, see `fua_group_active`).
    fua_group: Vec<usize>,
    /// A group of FUA flushes is in flight (or finishing): the next waits.
    fua_group_active: bool,
    /// Members whose flush of the group is still awaited (bit = member). A member durably
    /// failed meanwhile is written off (`apply_failed`): a flush it holds may never come back.
    fua_group_members: u64,
    /// Members the group's zeroes must see durably failed before they complete: those
    /// failing when the group started (their zeroes may sit unflushed in their caches), and
    /// those whose flush of the group failed (bit = member).
    fua_group_failed: u64,
    resync_regions: Vec<u32>,
    /// Every region in `resync_regions` is one background init has not reached, with no
    /// crash since (`BitmapSetup::dirty_init_only`): a parity stripe there holds no write
    /// that was in flight at a crash, and every write there recomputed parity over its range
    /// (`recompute`), so reconstruction is trusted there (`stripe_untrusted`); only resync
    /// (init) itself still has to run.
    resync_init_only: bool,
    /// The shutdown ended with only init's regions left (`stopped_with_only_init_left`).
    stopped_in_init: bool,
    resync_region_index: usize,
    resync_next_stripe: u64,
    resync_in_flight: usize,
    resync_announced: bool,
    /// Resync stopped at (region list index, stripe): from there on stripes stay untrusted.
    resync_blocked: Option<(usize, u64)>,
    /// The resync's rate limit (this shard's share), in chunk bytes per stripe resynced.
    resync_pace: pace::Pace,
    /// A stripe with queued requests found no free op slot (see `retry_waiting_stripes`).
    stripes_waiting_for_op: bool,
    /// Stripes whose partial writes wait for the merge window, by deadline (the window is
    /// one value, so the front is the earliest; after a live change an entry may wait
    /// behind a later one, at most the old window). An entry whose stripe started early
    /// stays until its deadline and is then skipped. At most `requests_max` entries: when
    /// full, a partial write starts at once.
    merge_waiting: VecDeque<(StripeIndex, u64)>,
    /// When `tick` last scanned the bitmap for regions to clear.
    last_bitmap_scan_us: u64,
    /// The rebuild of a replacement member, if one runs.
    rebuild: Option<rebuild::RebuildState>,
    /// Bumped by every `start_rebuild`.
    rebuild_generation: u32,
    scrub: Option<scrub::ScrubState>,
    /// Bumped by every `start_scrub`.
    scrub_generation: u32,
    /// Rebuild rate for this shard (its share of the array's), bytes per second; 0: no limit.
    rebuild_rate_bytes_per_s: u64,
    /// The rebuild writes its reconstruction of stripes it cannot verify after an unclean
    /// shutdown (`set_rebuild_trust_parity`); off: it stalls there.
    rebuild_trust_parity: bool,
    /// The same while foreground requests came in the last `REBUILD_BUSY_WINDOW_US`.
    rebuild_busy_rate_bytes_per_s: u64,
    /// When the last foreground request arrived (the shard's clock).
    last_foreground_us: u64,
    /// A member is being copied to its replacement (`set_copy_recording`): the missed-write
    /// map records as if a role were out of service.
    copy_recording: bool,
    ios: VecDeque<MemberIo>,
    replies: VecDeque<ShardReply>,
    events: VecDeque<ShardEvent>,
    /// Flushes whose member flushes completed, waiting for failing members to be durably
    /// failed before they may succeed.
    waiting_flushes: Vec<usize>,
    /// Zeroes for members that cannot zero by command; never written.
    zeroes: IoBuf,
    /// Members that refused a zeroing command: zeroes are written to them instead.
    zero_unsupported: Vec<bool>,
    now_us: u64,
    shutdown: ShutdownState,
    counters: ShardCounters,
    /// Read-only: no member write is ever polled (asserted in `poll_io`).
    access: ArrayAccess,
}

/// Where a clean shutdown stands (see `begin_shutdown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownState {
    Running,
    /// No new requests; waiting for every operation (and resync op) in flight to finish.
    Draining,
    /// A flush of every available member is in flight.
    Flushing,
    /// The image clearing every flushed, trusted region is being written.
    Clearing,
    /// Finished. `clean`: the bitmap is clear on every available member and no member is
    /// failing, so the array may be marked clean; otherwise it must stay dirty.
    Done {
        clean: bool,
    },
}

fn usize_of(value: u32) -> usize {
    usize::try_from(value).expect("u32 fits usize")
}

impl Shard {
    pub fn new(setup: ShardSetup) -> Result<Self, EngineError> {
        setup.config.validate()?;
        let g = setup.geometry;
        let n = g.member_count();
        if setup.members.len() != n {
            return Err(EngineError::Setup("one member entry per role"));
        }
        if setup.members.iter().any(|m| m.health == Health::Rebuilding) {
            return Err(EngineError::Setup("rebuilds start with start_rebuild"));
        }
        if setup.shard_count == 0 || setup.shard_index >= setup.shard_count {
            return Err(EngineError::Setup("shard index outside the shard count"));
        }
        let codec = match g.parity_chunks() {
            0 => None,
            m => Some(Codec::with_kernel(g.data_chunks(), m, setup.kernel)?),
        };
        let pool = scratch_pool(&g, setup.config.scratch_bytes)?;
        let region_count = g.member_data_bytes().div_ceil(setup.bitmap.region_bytes);
        let region_count =
            u32::try_from(region_count).map_err(|_| EngineError::Setup("regions"))?;
        if setup
            .bitmap
            .dirty_regions
            .iter()
            .chain(&setup.bitmap.missed_regions)
            .any(|&r| r >= region_count)
        {
            return Err(EngineError::Setup("dirty or missed region outside the bitmap"));
        }
        let shard_u16 =
            u16::try_from(setup.shard_index).map_err(|_| EngineError::Setup("shard index"))?;
        let count_u16 =
            u16::try_from(setup.shard_count).map_err(|_| EngineError::Setup("shard count"))?;
        let block_of = |kind, set: &[u32]| {
            let b = &setup.bitmap;
            let mut block = BitmapBlock::new_kind(
                kind,
                b.array_uuid,
                shard_u16,
                count_u16,
                b.region_bytes,
                region_count,
            );
            for &r in set {
                block.set(r, true);
            }
            block
        };
        let bitmap = WriteIntent::new(
            block_of(BitmapKind::WriteIntent, &setup.bitmap.dirty_regions),
            block_of(BitmapKind::Missed, &setup.bitmap.missed_regions),
            setup.config.bitmap_clear_delay_us,
        );
        let requests_max = setup.config.requests_max;
        let ops_max = setup.config.stripes_active_max
            + setup.config.resync_stripes_max
            + setup.config.rebuild_stripes_max
            + setup.config.scrub_stripes_max;
        let mut resync_regions = setup.bitmap.dirty_regions.clone();
        resync_regions.sort_unstable();
        resync_regions.dedup();
        let mut requests = Vec::with_capacity(requests_max);
        requests.resize_with(requests_max, || None);
        let mut ops = Vec::with_capacity(ops_max);
        ops.resize_with(ops_max, || None);
        let mut shard = Self {
            geometry: g,
            codec,
            shard_index: setup.shard_index,
            ownership: Ownership::for_geometry(
                &g,
                setup.shard_count,
                setup.config.stripe_run_member_bytes,
            ),
            config: setup.config,
            data_offset_bytes: setup.data_offset_bytes,
            bitmap_offset_bytes: setup.bitmap.area_offset_bytes
                + u64::from(setup.shard_index)
                    * flashraid_format::bitmap::BITMAP_BLOCK_BYTES as u64,
            missed_offset_bytes: setup.bitmap.missed_area_offset_bytes
                + u64::from(setup.shard_index)
                    * flashraid_format::bitmap::BITMAP_BLOCK_BYTES as u64,
            members: setup.members,
            read_errors: vec![0; n],
            bad_stripes_seen: vec![[None; BAD_STRIPES_SEEN_MAX]; n],
            member_epoch: vec![0; n],
            member_ios_outstanding: vec![0; n * EPOCHS],
            member_progress_us: vec![0; n],
            member_stall_reported_us: vec![None; n],
            completing_stale: false,
            requests,
            free_requests: (0..requests_max).rev().collect(),
            ops,
            free_ops: (0..ops_max).rev().collect(),
            spare_ops: Vec::with_capacity(ops_max),
            // A stripe is in the table while it has an operation or a queued request.
            stripes: StripeTable::new(ops_max + requests_max),
            starved: VecDeque::with_capacity(ops_max),
            waiting_bitmap: Vec::with_capacity(ops_max),
            waiting_metadata: Vec::with_capacity(ops_max),
            pool,
            plans: BTreeMap::new(),
            bitmap,
            bitmap_pending: 0,
            internal_flush_pending: 0,
            internal_flush_issued_at: 0,
            internal_flush_errors: false,
            fua_waiting: Vec::with_capacity(ops_max),
            fua_group: Vec::with_capacity(ops_max),
            fua_group_active: false,
            fua_group_members: 0,
            fua_group_failed: 0,
            resync_init_only: setup.bitmap.dirty_init_only,
            stopped_in_init: false,
            resync_regions,
            resync_region_index: 0,
            resync_next_stripe: 0,
            resync_in_flight: 0,
            resync_announced: false,
            resync_blocked: None,
            resync_pace: pace::Pace::new(
                setup.config.resync_rate_bytes_per_s.div_ceil(u64::from(setup.shard_count)),
                0,
            ),
            stripes_waiting_for_op: false,
            merge_waiting: VecDeque::with_capacity(requests_max),
            last_bitmap_scan_us: 0,
            rebuild: None,
            rebuild_generation: 0,
            scrub: None,
            scrub_generation: 0,
            rebuild_trust_parity: false,
            rebuild_rate_bytes_per_s: setup
                .config
                .rebuild_rate_bytes_per_s
                .div_ceil(u64::from(setup.shard_count)),
            rebuild_busy_rate_bytes_per_s: setup
                .config
                .rebuild_busy_rate_bytes_per_s
                .div_ceil(u64::from(setup.shard_count)),
            last_foreground_us: 0,
            copy_recording: false,
            ios: VecDeque::with_capacity(ops_max * (n + 4)),
            replies: VecDeque::with_capacity(requests_max),
            events: VecDeque::with_capacity(4 * n + 4),
            waiting_flushes: Vec::with_capacity(requests_max),
            zeroes: IoBuf::new(usize_of(g.chunk_bytes())),
            zero_unsupported: vec![false; n],
            now_us: 0,
            shutdown: ShutdownState::Running,
            counters: ShardCounters::default(),
            access: setup.access,
        };
        shard.resync_next_stripe = shard.first_stripe_of_resync_region();
        shard.health_changed();
        Ok(shard)
    }

    /// Whether this shard writes nothing to its members (see `ArrayAccess`).
    pub fn is_read_only(&self) -> bool {
        self.access == ArrayAccess::ReadOnly
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn counters(&self) -> ShardCounters {
        self.counters
    }

    pub fn member_health(&self, member: MemberIndex) -> Health {
        self.members[member.get()].health
    }

    /// Whether this shard owns `stripe` (runs of stripes are dealt round-robin to shards).
    pub fn owns(&self, stripe: StripeIndex) -> bool {
        self.ownership.shard_of(stripe.0) == self.shard_index
    }

    /// This shard's next stripe after `stripe`.
    pub(super) fn next_owned(&self, stripe: u64) -> u64 {
        self.ownership.next_owned(self.shard_index, stripe)
    }

    /// How many of this shard's stripes lie in `from..to` (`from <= to`).
    pub(super) fn owned_between(&self, from: u64, to: u64) -> u64 {
        self.ownership.owned_between(self.shard_index, from, to)
    }

    /// Nothing in flight, queued or pending: safe to stop.
    pub fn is_idle(&self) -> bool {
        self.free_requests.len() == self.requests.len()
            && self.free_ops.len() == self.ops.len()
            && self.ios.is_empty()
            && self.bitmap_pending == 0
            && self.internal_flush_pending == 0
            && !self.bitmap.image_in_flight()
    }

    /// A one-line summary of what is in flight, for diagnosing hangs in tests.
    pub fn describe(&self) -> String {
        let phases: Vec<String> = self
            .ops
            .iter()
            .flatten()
            .map(|op| format!("{:?}@{}:{:?}/{}", op.kind, op.stripe.0, op.phase, op.pending))
            .collect();
        format!(
            "stripes {} requests {} ops [{}] starved {} wait-bitmap {} wait-metadata {} ios {} bitmap-pending {} health {:?} rebuild {:?}",
            self.stripes.len(),
            self.requests.len() - self.free_requests.len(),
            phases.join(" "),
            self.starved.len(),
            self.waiting_bitmap.len(),
            self.waiting_metadata.len(),
            self.ios.len(),
            self.bitmap_pending,
            self.members.iter().map(|m| m.health).collect::<Vec<_>>(),
            self.rebuild,
        )
    }

    /// Background resync is making progress: stripes to do and nothing stopping it. A resync
    /// stalled by a degraded array (or by a stripe whose data could not be read) is not
    /// resyncing, though its remaining stripes stay untrusted (`stripe_needs_resync`).
    pub fn is_resyncing(&self) -> bool {
        self.resync_in_flight > 0
            || (self.resync_region_index < self.resync_regions.len() && !self.resync_stalled())
    }

    /// Stripes an unclean shutdown left dirty are not all resynced yet: resync is running,
    /// or stopped (a member out, a stripe it could not vouch for), and those stripes are
    /// still untrusted. A member taken out of service now would leave them degraded and
    /// unverifiable, so the runtime does not swap a replaced member out until it is false.
    pub fn resync_pending(&self) -> bool {
        self.resync_in_flight > 0 || self.resync_region_index < self.resync_regions.len()
    }

    /// Background work (rebuild, scrub, resync) has operations in flight.
    pub fn background_busy(&self) -> bool {
        self.resync_in_flight > 0
            || self.rebuild.as_ref().is_some_and(|r| r.in_flight() > 0)
            || self.scrub.as_ref().is_some_and(|s| s.in_flight() > 0)
    }

    /// Regions set in the bitmap (status).
    pub fn bitmap_regions_set(&self) -> usize {
        self.bitmap.set_regions()
    }

    /// Regions set in the missed-write map (status).
    pub fn missed_regions_set(&self) -> usize {
        self.bitmap.missed_regions()
    }

    /// Every role is recorded in service again: empty the missed-write map (ignored if this
    /// shard has a role out of service: a failure it saw first keeps the map).
    pub fn clear_missed(&mut self) {
        if self.bitmap.clear_missed() {
            self.kick_bitmap();
        }
    }

    /// The next member IO for the driver. Tell the shard when the driver accepts it
    /// (`io_submitted`); complete it with `complete_io` if it was accepted, else with
    /// `complete_unsubmitted_io`.
    pub fn poll_io(&mut self) -> Option<MemberIo> {
        // FUA zeroes that finished their writes since the last poll share one group of
        // member flushes.
        self.start_fua_flush_group();
        let mut io = self.ios.pop_front()?;
        // The one door every member IO leaves by: a read-only array writes nothing, whatever
        // path (a repair, the bitmap, a resync) would have asked for it.
        assert!(
            self.access == ArrayAccess::ReadWrite
                || matches!(io.kind, MemberIoKind::Read { .. } | MemberIoKind::Flush),
            "a read-only shard polled a member write: {:?}",
            io.kind
        );
        let epoch = u64::from(self.member_epoch[io.member.get()]);
        assert_eq!(io.token.0 >> EPOCH_SHIFT & 0xf, 0, "a token polled twice");
        io.token.0 |= epoch << EPOCH_SHIFT;
        Some(io)
    }

    /// The driver accepted a polled IO: from now on it counts as outstanding on its member.
    pub fn io_submitted(&mut self, member: MemberIndex, token: IoToken) {
        let m = member.get();
        let epoch = Self::epoch_of(token);
        let outstanding = &mut self.member_ios_outstanding[m * EPOCHS + epoch];
        if *outstanding == 0 && epoch == usize::from(self.member_epoch[m]) {
            self.member_progress_us[m] = self.now_us;
        }
        *outstanding += 1;
    }

    fn epoch_of(token: IoToken) -> usize {
        usize::try_from(token.0 >> EPOCH_SHIFT & 0xf).expect("fits")
    }

    /// IOs the driver accepted for the device now holding `member`'s role, not completed.
    pub fn member_ios_outstanding(&self, member: MemberIndex) -> u32 {
        let m = member.get();
        self.member_ios_outstanding[m * EPOCHS + usize::from(self.member_epoch[m])]
    }

    /// Change how long a member may leave its IO uncompleted before it is reported stalled
    /// (microseconds; 0: never).
    pub fn set_member_io_timeout_us(&mut self, us: u64) {
        self.config.member_io_timeout_us = us;
    }

    /// Report every member in service that has IO outstanding and completed none of it for
    /// the member timeout (`ShardEvent::MemberStalled`), again at most once a timeout while
    /// it lasts. The shard does not fail it: it sees only its own failures, and a stall
    /// failed past the level's tolerance would fail an array that may resume when the member
    /// answers. What the member has outstanding stays outstanding (a hung device keeps its
    /// buffers until it answers).
    pub(super) fn check_stalled_members(&mut self) {
        let timeout = self.config.member_io_timeout_us;
        if timeout == 0 {
            return;
        }
        for m in 0..self.members.len() {
            let member = MemberIndex(u16::try_from(m).expect("fits"));
            let stalled = self.member_ios_outstanding(member) > 0
                && self.now_us.saturating_sub(self.member_progress_us[m]) >= timeout
                && matches!(self.members[m].health, Health::Active | Health::Rebuilding);
            let due = self.member_stall_reported_us[m]
                .is_none_or(|at| self.now_us.saturating_sub(at) >= timeout);
            if stalled && due {
                self.member_stall_reported_us[m] = Some(self.now_us);
                let epoch = self.member_epoch[m];
                self.events.push_back(ShardEvent::MemberStalled { member, epoch });
            }
        }
    }

    /// Time the shard did not see (the process paused or starved for `gap_us`) is no
    /// evidence that a member stalled: every member's progress clock moves on by it.
    pub(super) fn note_clock_gap(&mut self, gap_us: u64) {
        let timeout = self.config.member_io_timeout_us;
        if timeout > 0 && gap_us >= timeout / 2 {
            for p in &mut self.member_progress_us {
                *p = p.saturating_add(gap_us);
            }
        }
    }

    pub fn poll_reply(&mut self) -> Option<ShardReply> {
        self.replies.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<ShardEvent> {
        self.events.pop_front()
    }

    // ----------------------------------------------------------------------------------
    // Intake

    /// Accept a request. Requests that are invalid are answered (with an error reply), not
    /// refused; only a full request table refuses, handing the request back.
    pub fn submit(&mut self, request: ShardRequest) -> Result<(), Rejected> {
        let Some(slot) = self.free_requests.pop() else {
            self.counters.rejected_busy += 1;
            return Err(Rejected::Busy(request));
        };
        let ShardRequest { id, op, mut buf } = request;
        self.last_foreground_us = self.now_us;
        let base = buf.as_mut().map_or(0, |b| b.as_mut_ptr() as usize);
        self.requests[slot] = Some(Request {
            id,
            op,
            buf,
            base,
            next_in_stripe: None,
            pending: 0,
            flush_issued_at: 0,
            member_errors: false,
        });
        if self.shutdown != ShutdownState::Running {
            self.finish_request(slot, Err(RequestError::ShuttingDown));
            return Ok(());
        }
        if let Err(e) = self.validate(slot) {
            self.finish_request(slot, Err(e));
            return Ok(());
        }
        match op {
            ShardOp::Flush => self.start_flush(slot),
            ShardOp::Read { offset, .. } | ShardOp::Write { offset, .. } => {
                let stripe = self.geometry.locate(offset).expect("validated").stripe;
                self.enqueue(stripe, slot);
            }
            ShardOp::Zero { stripe, .. } => self.enqueue(stripe, slot),
        }
        Ok(())
    }

    fn validate(&self, slot: usize) -> Result<(), RequestError> {
        let request = self.requests[slot].as_ref().expect("just stored");
        let g = &self.geometry;
        let (offset, len) = match request.op {
            ShardOp::Read { offset, len_bytes } | ShardOp::Write { offset, len_bytes, .. } => {
                (offset, len_bytes)
            }
            ShardOp::Flush => return Ok(()),
            ShardOp::Zero { stripe, .. } => {
                if stripe.0 >= g.stripes() || !self.owns(stripe) {
                    return Err(RequestError::OutOfRange);
                }
                if self.is_read_only() {
                    return Err(RequestError::ReadOnly);
                }
                // As a write (found by review: a zero on a failed array was answered Ok).
                if self.array_failed() {
                    return Err(RequestError::ArrayFailed);
                }
                return Ok(());
            }
        };
        if len == 0 || offset.0 % BLOCK_BYTES != 0 || u64::from(len) % BLOCK_BYTES != 0 {
            return Err(RequestError::OutOfRange);
        }
        let end = offset.0.checked_add(u64::from(len)).ok_or(RequestError::OutOfRange)?;
        if end > g.array_bytes() {
            return Err(RequestError::OutOfRange);
        }
        let first = g.locate(offset).expect("inside").stripe;
        let last = g.locate(ArrayOffset(end - 1)).expect("inside").stripe;
        if first != last {
            return Err(RequestError::Malformed("a shard request must stay within one stripe"));
        }
        if !self.owns(first) {
            return Err(RequestError::Malformed("stripe belongs to another shard"));
        }
        let buf_len = request.buf.as_ref().map_or(0, |b| b.capacity_bytes());
        if buf_len < usize_of(len) {
            return Err(RequestError::Malformed("buffer smaller than the request"));
        }
        if matches!(request.op, ShardOp::Write { .. }) && self.array_failed() {
            return Err(RequestError::ArrayFailed);
        }
        if matches!(request.op, ShardOp::Write { .. }) && self.is_read_only() {
            return Err(RequestError::ReadOnly);
        }
        Ok(())
    }

    /// Put a request behind its stripe's queue, starting an operation if the stripe is idle.
    fn enqueue(&mut self, stripe: StripeIndex, slot: usize) {
        if self.stripes.get(stripe).is_none()
            && self.stripes.insert(stripe, StripeEntry::default()).is_err()
        {
            // The table holds a stripe per op slot plus one per request slot, so it cannot
            // be full while this request holds a request slot.
            panic!("stripe table full with a free request slot: limits misconfigured");
        }
        let entry = self.stripes.get_mut(stripe).expect("present");
        match entry.queue_tail {
            Some(tail) => {
                self.requests[tail].as_mut().expect("queued").next_in_stripe = Some(slot);
                entry.queue_tail = Some(slot);
            }
            None => {
                entry.queue_head = Some(slot);
                entry.queue_tail = Some(slot);
            }
        }
        let entry = *self.stripes.get(stripe).expect("present");
        if entry.op.is_some() {
            return;
        }
        let verdict = self.merge_verdict(stripe);
        if entry.merge_until_us != 0 && verdict == Merge::Full {
            self.counters.merge_filled += 1;
        }
        if verdict == Merge::Wait {
            if entry.merge_until_us != 0 {
                return; // waiting already: the new write joined without filling the stripe
            }
            // A window opens only for a queue this request starts: an idle stripe with older
            // requests queued was turned away for want of an op slot, and they are due now
            // (found in review).
            if entry.queue_head == Some(slot) && self.merge_waiting.len() < self.requests.len() {
                // Never 0 (that means "not waiting"): the window is at least 1 us.
                let until = self.now_us + self.config.merge_window_us;
                self.stripes.get_mut(stripe).expect("present").merge_until_us = until;
                self.merge_waiting.push_back((stripe, until));
                self.counters.merge_waits += 1;
                return;
            }
        }
        self.start_next_op(stripe);
    }

    /// Whether an idle stripe's queue waits for the merge window (`Wait`): a parity level, a
    /// window set, and a queue of cached writes that one operation would take together
    /// (each on data chunks no earlier one touches) and that do not yet fill every data
    /// chunk. Anything else (a read, a zero, a FUA write, a write that could not join the
    /// same operation, a full stripe) starts now: waiting would only add latency.
    fn merge_verdict(&self, stripe: StripeIndex) -> Merge {
        let g = &self.geometry;
        if self.config.merge_window_us == 0
            || g.parity_chunks() == 0
            || self.shutdown != ShutdownState::Running
        {
            return Merge::Start;
        }
        let entry = self.stripes.get(stripe).expect("present");
        let chunk = g.chunk_bytes();
        let (mut touched, mut full) = (0u64, 0u64);
        let mut cursor = entry.queue_head;
        let mut taken = 0;
        while let Some(slot) = cursor {
            let request = self.requests[slot].as_ref().expect("queued");
            let ShardOp::Write { offset, len_bytes, durability: Durability::Cached } = request.op
            else {
                return Merge::Start;
            };
            if taken == OP_REQUESTS_MAX {
                return Merge::Start;
            }
            for segment in g.segments(offset, u64::from(len_bytes)) {
                let bit = 1u64 << segment.location.data_index;
                if touched & bit != 0 {
                    return Merge::Start;
                }
                touched |= bit;
                if segment.location.offset_in_chunk_bytes == 0 && segment.len_bytes == chunk {
                    full |= bit;
                }
            }
            taken += 1;
            cursor = request.next_in_stripe;
        }
        // Data chunks are fewer than 64 (`MEMBERS_MAX` members, one parity at least).
        if full == (1u64 << g.data_chunks()) - 1 { Merge::Full } else { Merge::Wait }
    }

    /// Start the stripes whose merge window ended (all of them when `all`).
    pub(super) fn start_merge_waiting(&mut self, all: bool) {
        while let Some(&(stripe, until)) = self.merge_waiting.front() {
            if !all && until > self.now_us {
                break;
            }
            self.merge_waiting.pop_front();
            let waiting = self
                .stripes
                .get(stripe)
                .is_some_and(|e| e.merge_until_us == until && e.op.is_none());
            if waiting {
                self.start_next_op(stripe);
            }
        }
    }

    /// Change the merge window (microseconds; 0: none). Stripes waiting keep their
    /// deadlines; with no window they start now.
    pub fn set_merge_window_us(&mut self, us: u64) {
        self.config.merge_window_us = us;
        if us == 0 {
            self.start_merge_waiting(true);
        }
    }

    /// When the earliest merge window ends (the reactor sleeps no longer than that).
    pub fn next_deadline_us(&self) -> Option<u64> {
        self.merge_waiting.front().map(|&(_, until)| until)
    }

    /// Start the next operation on an idle stripe from the front of its queue.
    fn start_next_op(&mut self, stripe: StripeIndex) {
        // Whatever happens next, the stripe no longer waits for its merge window (its entry
        // in `merge_waiting`, if any, is skipped when it comes up).
        self.stripes.get_mut(stripe).expect("present").merge_until_us = 0;
        let entry = *self.stripes.get(stripe).expect("present");
        assert!(entry.op.is_none());
        let Some(head) = entry.queue_head else {
            self.stripes.remove(stripe);
            return;
        };
        let Some(op_slot) = self.free_ops.pop() else {
            // Every op slot is busy; this stripe is retried when one frees (see finish_op).
            self.stripes_waiting_for_op = true;
            return;
        };
        let head_op = self.requests[head].as_ref().expect("queued").op;
        let kind = match head_op {
            ShardOp::Read { .. } => OpKind::Read,
            ShardOp::Write { .. } => OpKind::Write,
            ShardOp::Zero { how, .. } => OpKind::Zero { how },
            ShardOp::Flush => unreachable!("flushes are not queued on stripes"),
        };
        let mut op = self.new_op(stripe, kind);
        // Take a run of compatible requests: reads with reads; writes to chunks not yet
        // touched by this operation; a zero alone.
        let mut taken = 0;
        let mut cursor = Some(head);
        while let Some(slot) = cursor {
            if taken == OP_REQUESTS_MAX || !self.compatible(&op, slot, taken) {
                break;
            }
            let request = self.requests[slot].as_mut().expect("queued");
            cursor = request.next_in_stripe.take();
            if let ShardOp::Write { durability: Durability::Fua, .. } = request.op {
                op.durability = Durability::Fua;
            }
            if let ShardOp::Zero { durability: Durability::Fua, .. } = request.op {
                op.durability = Durability::Fua;
            }
            self.mark_touched(&mut op, slot);
            op.parts[taken] = Some(Part { request: slot, rebuild: 0, lost: 0, recovered: 0 });
            taken += 1;
        }
        let entry = self.stripes.get_mut(stripe).expect("present");
        entry.queue_head = cursor;
        if cursor.is_none() {
            entry.queue_tail = None;
        }
        entry.op = Some(op_slot);
        self.ops[op_slot] = Some(op);
        self.begin(op_slot);
    }

    fn compatible(&self, op: &Op, slot: usize, taken: usize) -> bool {
        let request = self.requests[slot].as_ref().expect("queued");
        match (op.kind, request.op) {
            (OpKind::Read, ShardOp::Read { .. }) => true,
            (OpKind::Write, ShardOp::Write { offset, len_bytes, .. }) => {
                // Disjoint data chunks only: each chunk's new data then has one source.
                self.geometry
                    .segments(offset, u64::from(len_bytes))
                    .all(|s| op.touched[s.location.data_index].is_none())
            }
            (OpKind::Zero { .. }, ShardOp::Zero { .. }) => taken == 0,
            _ => false,
        }
    }

    fn mark_touched(&self, op: &mut Op, slot: usize) {
        let request = self.requests[slot].as_ref().expect("queued");
        if let ShardOp::Write { offset, len_bytes, .. } = request.op {
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let lo = s.location.offset_in_chunk_bytes;
                op.touched[s.location.data_index] = Some(Touch {
                    range: ChunkRange::new(lo, lo + s.len_bytes),
                    request: slot,
                    buf_offset: usize::try_from(s.range_offset_bytes).expect("fits"),
                });
            }
        }
    }

    /// An operation on `stripe`, in a reused box when one is spare (no allocation once warm).
    fn new_op(&mut self, stripe: StripeIndex, kind: OpKind) -> Box<Op> {
        let region_bytes = self.bitmap_region_bytes();
        let rebuild_generation =
            if kind == OpKind::Scrub { self.scrub_generation } else { self.rebuild_generation };
        let mut boxed = self.spare_ops.pop().unwrap_or_else(|| Box::new(Op::blank()));
        // Every field is named (no `..`), so a field added later must be reset here too.
        let Op {
            stripe: op_stripe,
            kind: op_kind,
            parts,
            phase,
            pending,
            serial,
            chunk_member,
            touched,
            plan,
            errored,
            rebuild_erased,
            rebuild_targets,
            rebuild_range,
            lost_error,
            scratch: _, // empty where `scratch_held` says so (asserted below)
            scratch_held,
            scratch_base: _, // read only where `scratch` holds a buffer, set when it is taken
            needs_failed,
            durability,
            result,
            bitmap_target,
            region,
            replans,
            repaired,
            resume,
            zero_fallback,
            zero_fallback_issued,
            fua_flushed,
            rebuild_generation: op_generation,
            rebuild_verify,
            rebuild_unverified,
            probed,
            probe_from: _, // set by each probe before it is read
            units: _,      // set for each chunk before it is read (probing, deciding)
        } = &mut *boxed;
        assert_eq!(*scratch_held, 0, "a spare op still holds scratch");
        let g = &self.geometry;
        let members = g.member_count();
        chunk_member.fill(u16::MAX);
        match g.level() {
            Level::Raid1 | Level::Raid10 => {
                // Chunk index = member: each member holds (data index, copy).
                for (m, slot) in chunk_member.iter_mut().enumerate().take(members) {
                    *slot = u16::try_from(m).expect("members fit u16");
                }
            }
            _ => {
                let k = g.data_chunks();
                for i in 0..k {
                    chunk_member[i] = g.data_member(stripe, i, 0).0;
                }
                for r in 0..g.parity_chunks() {
                    chunk_member[k + r] = g.parity_member(stripe, r).0;
                }
            }
        }
        // Positions past the member count are never set, so they are still `None`.
        touched[..members].fill(None);
        *op_stripe = stripe;
        *op_kind = kind;
        *parts = [None; OP_REQUESTS_MAX];
        *phase = Phase::Starved;
        *pending = 0;
        *serial = 0;
        *plan = None;
        *errored = 0;
        *rebuild_erased = 0;
        *rebuild_targets = 0;
        *rebuild_range = None;
        *lost_error = RequestError::Unreadable;
        *needs_failed = 0;
        *durability = Durability::Cached;
        *result = Ok(());
        *bitmap_target = None;
        *region = u32::try_from(stripe.0 * u64::from(g.chunk_bytes()) / region_bytes)
            .expect("regions fit u32");
        *replans = 0;
        *repaired = 0;
        *resume = Resume::Begin;
        *zero_fallback = 0;
        *zero_fallback_issued = false;
        *fua_flushed = false;
        *op_generation = rebuild_generation;
        *rebuild_verify = false;
        *rebuild_unverified = false;
        *probed = 0;
        boxed
    }

    fn bitmap_region_bytes(&self) -> u64 {
        let regions = u64::from(self.bitmap.region_count());
        self.geometry.member_data_bytes().div_ceil(regions).next_power_of_two()
    }

    // ----------------------------------------------------------------------------------
    // Health

    /// The member takes member-wide IO (flushes, bitmap images): it is in service for at
    /// least part of the array.
    fn available(&self, member: u16) -> bool {
        matches!(self.members[usize::from(member)].health, Health::Active | Health::Rebuilding)
    }

    /// The member holds current chunks of `stripe` and may be read and written there.
    fn usable(&self, stripe: StripeIndex, member: u16) -> bool {
        match self.members[usize::from(member)].health {
            Health::Active => true,
            Health::Rebuilding => self.rebuilt(stripe),
            Health::Failing | Health::Failed => false,
        }
    }

    /// A member's health changed: the missed-write map records while any role is out of
    /// service.
    fn health_changed(&mut self) {
        let recording =
            self.copy_recording || self.members.iter().any(|m| m.health != Health::Active);
        self.bitmap.set_recording(recording);
    }

    /// A member is copied to its replacement outside the engine (`replace`): from now on,
    /// until this is turned off, every region written is recorded in the missed-write map,
    /// so the regions that changed behind the copy can be rebuilt when the replacement
    /// takes the role (a partial rebuild). Turn it off only after that rebuild started
    /// (the member's health then keeps the map recording).
    pub fn set_copy_recording(&mut self, on: bool) {
        self.copy_recording = on;
        self.health_changed();
    }

    /// Whether more members are unavailable than every stripe survives.
    pub fn array_failed(&self) -> bool {
        // On every write's path: a fixed array, no allocation.
        let mut failed = [false; flashraid_layout::MEMBERS_MAX];
        for (f, m) in failed.iter_mut().zip(&self.members) {
            *f = m.health != Health::Active;
        }
        !self.geometry.survives(&failed[..self.members.len()])
    }

    fn fail_member(&mut self, member: u16, reason: FailReason) {
        if self.completing_stale {
            // From a device the role has left: the device holding it now did nothing wrong.
            return;
        }
        let m = usize::from(member);
        if matches!(self.members[m].health, Health::Active | Health::Rebuilding) {
            if self.members[m].health == Health::Rebuilding {
                self.rebuild = None;
            }
            self.members[m].health = Health::Failing;
            self.health_changed();
            let epoch = self.member_epoch[m];
            self.events.push_back(ShardEvent::MemberFailed {
                member: MemberIndex(member),
                reason,
                epoch,
            });
        }
    }

    /// The metadata marking these members failed is durable: stop waiting for it.
    pub fn apply_failed(&mut self, failed: &[MemberIndex]) {
        for member in failed {
            self.members[member.get()].health = Health::Failed;
            if self.rebuild_member() == Some(member.0) {
                self.rebuild = None;
            }
        }
        self.health_changed();
        self.write_off_fua_flushes(failed);
        let waiting = std::mem::take(&mut self.waiting_metadata);
        for op_slot in waiting {
            self.advance(op_slot);
        }
        let flushes = std::mem::take(&mut self.waiting_flushes);
        for slot in flushes {
            self.finish_flush(slot);
        }
    }

    fn note_read_error(&mut self, member: u16, stripe: StripeIndex, error: IoError) {
        if self.completing_stale {
            return;
        }
        if error == IoError::Gone {
            self.fail_member(member, FailReason::Gone);
            return;
        }
        let m = usize::from(member);
        // The same bad range read again, not written since, is the same error; a new
        // stripe takes the oldest entry's place.
        let seen = &mut self.bad_stripes_seen[m];
        if seen.contains(&Some(stripe)) {
            return;
        }
        seen.rotate_right(1);
        seen[0] = Some(stripe);
        self.read_errors[m] += 1;
        if self.read_errors[m] > self.config.member_read_errors_max && !self.failing_fails(m) {
            self.fail_member(member, FailReason::ReadErrors);
        }
    }

    /// Whether failing member `m` too would leave a stripe with more members out than the
    /// level survives, or stripes resync has not vouched for yet (never reconstructed, so
    /// they need every member: found by review, a RAID 5 whose resync stopped at a bad
    /// sector lost its readable blocks when reads of other bad sectors failed the member).
    /// A member is never failed for read errors then: the array would stop serving
    /// everything, or those stripes, for the sake of the ranges it cannot read, which then
    /// fail alone (md keeps the last member that can serve a RAID 1 the same way). Judged
    /// from this shard's view; two shards failing two members at once can still pass the
    /// tolerance.
    fn failing_fails(&self, m: usize) -> bool {
        if self.resync_pending() {
            return true;
        }
        let mut out = [false; flashraid_layout::MEMBERS_MAX];
        for (o, (i, member)) in out.iter_mut().zip(self.members.iter().enumerate()) {
            *o = i == m || member.health != Health::Active;
        }
        !self.geometry.survives(&out[..self.members.len()])
    }

    /// Members (as a bitmask) not durably failed but not in service.
    fn failing_mask(&self) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.health == Health::Failing)
            .fold(0, |mask, (i, _)| mask | (1u64 << i))
    }

    // ----------------------------------------------------------------------------------
    // Scratch

    /// Take scratch buffers for `(scratch index, bytes)` pairs, all or nothing.
    fn take_scratch(&mut self, op_slot: usize, needs: &[(usize, u32)]) -> bool {
        // Straight into the op's slots (all or nothing: what this call took goes back if the
        // pool runs dry), and `scratch_held` says which slots hold a buffer, so neither this
        // nor `release_scratch` walks all OP_SCRATCH_MAX slots of every operation.
        let op = self.ops[op_slot].as_mut().expect("live op");
        let pool = &mut self.pool;
        let mut taken_now: u128 = 0;
        for &(index, bytes) in needs {
            assert!(op.scratch[index].is_none(), "scratch slot {index} taken twice");
            match pool.take(usize_of(bytes)) {
                Some(mut buf) => {
                    op.scratch_base[index] = buf.as_mut_ptr() as usize;
                    op.scratch[index] = Some(buf);
                    taken_now |= 1 << index;
                }
                None => {
                    for index in held_slots(taken_now) {
                        pool.give(op.scratch[index].take().expect("taken just now"));
                    }
                    return false;
                }
            }
        }
        op.scratch_held |= taken_now;
        true
    }

    fn release_scratch(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live op");
        assert_eq!(op.pending, 0, "scratch released with IO in flight");
        let pool = &mut self.pool;
        for index in held_slots(std::mem::take(&mut op.scratch_held)) {
            // A slot may be empty for a moment only inside one step (scrub swaps buffers).
            pool.give(op.scratch[index].take().expect("a held scratch slot has its buffer"));
        }
    }

    // ----------------------------------------------------------------------------------
    // IO issue helpers

    /// Bits: origin 60-63, epoch 56-59 (set at `poll_io`), slot 32-55, serial 16-31, part
    /// 8-15 (a request of the op, or a resync probe's 4 KiB unit of a chunk of up to 1 MiB),
    /// chunk 0-7.
    fn token(origin: u64, slot: usize, serial: u16, chunk: usize, part: usize) -> IoToken {
        assert!(slot < 1 << 24 && chunk < 256 && part < 256);
        let slot = u64::try_from(slot).expect("fits");
        let chunk = u64::try_from(chunk).expect("fits");
        let part = u64::try_from(part).expect("fits");
        IoToken(
            (origin << ORIGIN_SHIFT)
                | (slot << 32)
                | (u64::from(serial) << 16)
                | (part << 8)
                | chunk,
        )
    }

    fn decode_token(token: IoToken) -> (u64, usize, u16, usize, usize) {
        let t = token.0;
        let origin = t >> ORIGIN_SHIFT;
        let slot = usize::try_from((t >> 32) & 0xff_ffff).expect("fits");
        let serial = u16::try_from((t >> 16) & 0xffff).expect("fits");
        let part = usize::try_from((t >> 8) & 0xff).expect("fits");
        let chunk = usize::try_from(t & 0xff).expect("fits");
        (origin, slot, serial, part, chunk)
    }

    fn member_offset(&self, stripe: StripeIndex, lo: u32) -> u64 {
        self.data_offset_bytes + self.geometry.member_offset(stripe, lo).0
    }

    /// Read `range` of `chunk` again one 4 KiB unit per IO (each token's part carries the
    /// unit, so a failed one lands in `op.units[chunk]`), into `dest` from the byte that
    /// holds `range.lo` on: the probes after a failed read, and mirror re-reads in units.
    fn issue_unit_reads(
        &mut self,
        op_slot: usize,
        chunk: usize,
        range: ChunkRange,
        dest: UnitDest,
    ) {
        let stripe = self.ops[op_slot].as_ref().expect("live op").stripe;
        let mut at = range.lo;
        while at < range.hi {
            let past = at - range.lo;
            let ptr = match dest {
                UnitDest::Request { slot, at: base } => {
                    self.request_ptr(slot, base + u64::from(past))
                }
                UnitDest::Scratch { at: base } => {
                    let op = self.ops[op_slot].as_ref().expect("live op");
                    Self::scratch_ptr(op, chunk, base + usize_of(past))
                }
            };
            let kind = MemberIoKind::Read {
                offset_bytes: self.member_offset(stripe, at),
                ptr,
                len_bytes: UNIT_BYTES,
            };
            self.issue(op_slot, chunk, usize_of(at / UNIT_BYTES), kind);
            at += UNIT_BYTES;
        }
    }

    /// After a probe: a probed chunk whose member left service meanwhile has every unit
    /// failed, and one with a failed unit counts as errored (reads, writes).
    fn settle_probes(&mut self, op_slot: usize) {
        let all_units = Units::first(self.units_per_chunk());
        let op = self.ops[op_slot].as_ref().expect("live op");
        let (stripe, probed) = (op.stripe, op.probed);
        for c in (0..MEMBERS_MAX).filter(|&c| has(probed, c)) {
            let member = self.ops[op_slot].as_ref().expect("live op").chunk_member[c];
            let gone = !self.usable(stripe, member);
            let op = self.ops[op_slot].as_mut().expect("live op");
            if gone {
                op.units[c] = all_units;
            }
            if !op.units[c].is_empty() {
                op.errored |= bit(c);
            }
        }
    }

    fn units_per_chunk(&self) -> usize {
        usize::try_from(self.geometry.chunk_bytes() / UNIT_BYTES).expect("fits")
    }

    /// Queue a member IO for an operation.
    fn issue(&mut self, op_slot: usize, chunk: usize, part: usize, kind: MemberIoKind) {
        let op = self.ops[op_slot].as_mut().expect("live op");
        let member = op.chunk_member[chunk];
        op.pending += 1;
        let token = Self::token(ORIGIN_OP, op_slot, op.serial, chunk, part);
        match kind {
            MemberIoKind::Read { .. } => self.counters.member_reads += 1,
            MemberIoKind::Write { .. } => self.counters.member_writes += 1,
            _ => {}
        }
        if !matches!(kind, MemberIoKind::Read { .. } | MemberIoKind::Flush) {
            let stripe = op.stripe;
            self.forget_bad_stripe(usize::from(member), stripe);
        }
        self.ios.push_back(MemberIo { token, member: MemberIndex(member), kind });
    }

    /// Something writes `member`'s chunk of `stripe`: a read error there afterwards is news
    /// again (see `bad_stripes_seen`).
    fn forget_bad_stripe(&mut self, member: usize, stripe: StripeIndex) {
        let seen = &mut self.bad_stripes_seen[member];
        if seen[0].is_none() {
            return; // empty, as it nearly always is: one load per write
        }
        if let Some(i) = seen.iter().position(|s| *s == Some(stripe)) {
            seen[i..].rotate_left(1);
            *seen.last_mut().expect("a fixed ring") = None;
        }
    }

    /// Pointer `offset` bytes into scratch buffer `index` of an op.
    fn scratch_ptr(op: &Op, index: usize, offset: usize) -> *mut u8 {
        assert!(op.scratch[index].as_ref().is_some_and(|b| offset <= b.capacity_bytes()));
        (op.scratch_base[index] + offset) as *mut u8
    }

    fn request_ptr(&self, slot: usize, offset: u64) -> *mut u8 {
        let request = self.requests[slot].as_ref().expect("live request");
        let offset = usize::try_from(offset).expect("fits");
        assert!(request.buf.as_ref().is_some_and(|b| offset <= b.capacity_bytes()));
        (request.base + offset) as *mut u8
    }

    // ----------------------------------------------------------------------------------
    // Completion intake

    /// The completion of an IO the driver accepted (`io_submitted`).
    pub fn complete_io(&mut self, completion: MemberCompletion) {
        let member = self.member_of(completion.token);
        let epoch = Self::epoch_of(completion.token);
        let outstanding = &mut self.member_ios_outstanding[member * EPOCHS + epoch];
        assert!(*outstanding > 0, "a completion for no outstanding IO");
        *outstanding -= 1;
        let current = epoch == usize::from(self.member_epoch[member]);
        if current {
            self.member_progress_us[member] = self.now_us;
            self.member_stall_reported_us[member] = None;
        }
        self.dispatch_completion_from(completion, !current);
    }

    /// The completion of an IO polled but never accepted by the driver (failed while held
    /// back for a full ring): not among the outstanding.
    pub fn complete_unsubmitted_io(&mut self, completion: MemberCompletion) {
        let member = self.member_of(completion.token);
        let stale = Self::epoch_of(completion.token) != usize::from(self.member_epoch[member]);
        self.dispatch_completion_from(completion, stale);
    }

    /// Handle a completion; `stale`: from a device its member's role has left, whose errors
    /// fail nothing (`completing_stale`).
    fn dispatch_completion_from(&mut self, completion: MemberCompletion, stale: bool) {
        self.completing_stale = stale;
        self.dispatch_completion(completion);
        self.completing_stale = false;
    }

    /// The member an IO went to (flush and bitmap tokens carry it where an operation's
    /// carry its chunk).
    fn member_of(&self, token: IoToken) -> usize {
        let (origin, slot, _, _, chunk) = Self::decode_token(token);
        match origin {
            ORIGIN_OP => usize::from(
                self.ops[slot].as_ref().expect("completion for a live op").chunk_member[chunk],
            ),
            _ => chunk,
        }
    }

    /// The completion of an IO, whether or not it was handed to the driver (`complete_io`
    /// counts those that were).
    fn dispatch_completion(&mut self, completion: MemberCompletion) {
        let (origin, slot, serial, part, chunk) = Self::decode_token(completion.token);
        match origin {
            ORIGIN_OP => self.complete_op_io(slot, serial, part, chunk, completion.result),
            ORIGIN_FLUSH => self.complete_flush_io(slot, chunk, completion.result),
            ORIGIN_BITMAP => self.complete_bitmap_io(chunk, completion.result),
            ORIGIN_INTERNAL_FLUSH => self.complete_internal_flush(chunk, completion.result),
            ORIGIN_FUA_FLUSH => self.complete_fua_flush(chunk, completion.result),
            _ => panic!("completion with a token this shard never issued: {:?}", completion.token),
        }
    }

    fn complete_op_io(
        &mut self,
        op_slot: usize,
        serial: u16,
        part: usize,
        chunk: usize,
        result: Result<(), IoError>,
    ) {
        let op = self.ops[op_slot].as_mut().expect("completion for a live op");
        assert_eq!(op.serial, serial, "completion from an earlier phase");
        assert!(op.pending > 0, "more completions than IOs");
        op.pending -= 1;
        let member = op.chunk_member[chunk];
        let phase = op.phase;
        let kind = op.kind;
        match result {
            Err(error) => {
                // A mirror copy read unit by unit after another failed (`read_other_copies`):
                // the token's part is the unit, and the error is counted once per copy.
                let unit_reread =
                    self.is_unit_reread(self.ops[op_slot].as_ref().expect("live"), chunk);
                let op = self.ops[op_slot].as_mut().expect("live");
                let repeated = unit_reread && has(op.errored, chunk);
                if phase == Phase::Probing || unit_reread {
                    // The unit, not the chunk: the rest of the chunk may still be read.
                    op.units[chunk].insert(part);
                }
                if phase != Phase::Probing {
                    op.errored |= bit(chunk);
                }
                match phase {
                    // The chunk's failed read was counted; its units failing again are that
                    // same error, found more precisely (a member gone is still news).
                    Phase::Probing if error != IoError::Gone => {}
                    Phase::Rebuilding if repeated && error != IoError::Gone => {}
                    Phase::Reading | Phase::Rebuilding | Phase::Probing => {
                        let stripe = op.stripe;
                        self.note_read_error(member, stripe, error);
                        if kind == OpKind::Read {
                            self.read_io_failed(op_slot, part, chunk);
                        }
                    }
                    Phase::Writing
                        if error == IoError::Unsupported
                            && matches!(kind, OpKind::Zero { .. })
                            && !op.zero_fallback_issued
                            && !op.fua_flushed =>
                    {
                        // The member cannot zero by command (e.g. no ZERO_RANGE on this
                        // file system): not a fault; zeroes are written instead.
                        op.errored &= !bit(chunk);
                        op.zero_fallback |= bit(chunk);
                        self.zero_unsupported[usize::from(member)] = true;
                    }
                    Phase::Writing | Phase::Repairing => {
                        let reason = if error == IoError::Gone {
                            FailReason::Gone
                        } else {
                            FailReason::WriteError
                        };
                        self.fail_member(member, reason);
                        let op = self.ops[op_slot].as_mut().expect("live");
                        op.needs_failed |= 1u64 << member;
                    }
                    _ => panic!("IO completion in phase {phase:?}"),
                }
            }
            Ok(()) => {
                if kind == OpKind::Read && phase == Phase::Rebuilding {
                    self.read_io_recovered(op_slot, part, chunk);
                }
                if phase == Phase::Repairing {
                    self.counters.errors_corrected += 1;
                    self.events
                        .push_back(ShardEvent::ErrorCorrected { member: MemberIndex(member) });
                }
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    // ----------------------------------------------------------------------------------
    // Operation state machine

    /// Start an operation: take scratch and issue its first IOs.
    fn begin(&mut self, op_slot: usize) {
        let kind = self.ops[op_slot].as_ref().expect("live").kind;
        let started = match kind {
            OpKind::Read => self.begin_read(op_slot),
            OpKind::Write => self.begin_write(op_slot),
            OpKind::Resync => self.begin_resync(op_slot),
            OpKind::Rebuild => self.begin_rebuild(op_slot),
            OpKind::Scrub => self.begin_resync(op_slot),
            OpKind::Zero { .. } => self.begin_zero(op_slot),
        };
        if !started {
            let op = self.ops[op_slot].as_mut().expect("live");
            op.phase = Phase::Starved;
            op.resume = Resume::Begin;
            self.starved.push_back(op_slot);
        }
    }

    /// Move an operation on after its IOs completed (or its wait ended).
    fn advance(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live op");
        if op.pending > 0 {
            return;
        }
        match (op.kind, op.phase) {
            (OpKind::Read, Phase::Reading | Phase::Rebuilding | Phase::Probing) => {
                self.read_after_io(op_slot)
            }
            (OpKind::Read, Phase::Repairing) => self.finish_op(op_slot),
            (OpKind::Write, Phase::Reading | Phase::Rebuilding | Phase::Probing) => {
                self.write_after_reads(op_slot)
            }
            (OpKind::Write, Phase::WaitBitmap) => self.write_issue(op_slot),
            (
                OpKind::Write
                | OpKind::Zero { .. }
                | OpKind::Resync
                | OpKind::Rebuild
                | OpKind::Scrub,
                Phase::Writing,
            ) => self.after_writes(op_slot),
            (OpKind::Scrub, Phase::Reading | Phase::Probing) => self.scrub_after_reads(op_slot),
            (OpKind::Scrub, Phase::WaitBitmap) => self.scrub_issue(op_slot),
            (OpKind::Rebuild, Phase::Reading) => self.rebuild_after_reads(op_slot),
            (OpKind::Resync, Phase::Reading | Phase::Probing) => self.resync_after_reads(op_slot),
            (OpKind::Zero { .. }, Phase::WaitBitmap) => self.zero_issue(op_slot),
            (OpKind::Resync, Phase::WaitBitmap) => self.resync_issue(op_slot),
            (_, Phase::WaitMetadata) => self.after_writes(op_slot),
            (kind, phase) => panic!("no transition for {kind:?} in {phase:?}"),
        }
    }

    /// Finish: reply to every request of the operation, free it, start the next one queued
    /// on the stripe, and give starved operations another chance.
    fn finish_op(&mut self, op_slot: usize) {
        self.release_scratch(op_slot);
        let op = self.ops[op_slot].take().expect("live op");
        assert_eq!(op.pending, 0);
        for part in op.parts.iter().flatten() {
            let result = if part.lost != 0 { Err(op.lost_error) } else { op.result };
            let result = match (op.kind, result) {
                (OpKind::Read, Ok(())) => Ok(()),
                (_, r) => r,
            };
            self.finish_request(part.request, result);
        }
        self.free_ops.push(op_slot);
        let (stripe, kind, generation) = (op.stripe, op.kind, op.rebuild_generation);
        let rebuilt = rebuild::RebuildDone {
            rebuilt: op.result.is_ok() && op.errored & op.rebuild_targets == 0,
            // Verified against a second parity row (or parity recomputed), or written
            // unchecked because the operator allowed it.
            untrusted: op.rebuild_verify || op.rebuild_unverified,
            unverified: op.rebuild_unverified,
        };
        if kind == OpKind::Resync {
            self.resync_in_flight -= 1;
            self.counters.resync_stripes += 1;
        }
        // Its box goes back before the next operation starts, which may take it warm. Boxes
        // live in op slots or here, so there are never more than slots (no growth).
        assert!(self.spare_ops.len() < self.ops.len(), "more op boxes than op slots");
        self.spare_ops.push(op);
        let entry = self.stripes.get_mut(stripe).expect("stripe of a live op");
        entry.op = None;
        if kind == OpKind::Scrub {
            self.scrub_op_done(generation);
        }
        if kind == OpKind::Rebuild {
            self.rebuild_op_done(stripe, generation, rebuilt);
        }
        // A rebuild waiting for this stripe goes before the requests queued on it, so that a
        // busy stripe cannot hold the rebuild back for ever.
        if !self.start_waiting_rebuild(stripe) {
            self.start_next_op(stripe);
        }
        self.schedule_rebuild();
        self.schedule_scrub();
        self.retry_starved();
        self.retry_waiting_stripes();
    }

    fn retry_starved(&mut self) {
        for _ in 0..self.starved.len() {
            let Some(op_slot) = self.starved.pop_front() else { break };
            match self.ops[op_slot].as_ref().expect("starved op is live").resume {
                Resume::Begin => self.begin(op_slot),
                Resume::ReadRebuild => self.read_after_io(op_slot),
                Resume::WriteReplan => self.write_replan(op_slot),
            }
        }
    }

    /// An operation in the middle of its work could not get scratch buffers: wait for some.
    fn park_starved(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        assert_eq!(op.pending, 0, "parking an op with IO in flight");
        op.resume = match op.kind {
            OpKind::Read => Resume::ReadRebuild,
            OpKind::Write => Resume::WriteReplan,
            _ => Resume::Begin,
        };
        op.phase = Phase::Starved;
        self.starved.push_back(op_slot);
    }

    /// The reconstruction plan for an erasure pattern, built once and kept.
    fn plan_for(&mut self, erased: ChunkSet, targets: ChunkSet) -> &ReconstructPlan {
        if !self.plans.contains_key(&(erased, targets)) {
            if self.plans.len() >= PLAN_CACHE_MAX {
                self.plans.clear();
            }
            let chunks = |set: ChunkSet| (0..64).filter(|&c| has(set, c)).collect::<Vec<usize>>();
            let plan = self
                .codec
                .expect("parity level")
                .plan_reconstruct(&chunks(erased), &chunks(targets))
                .expect("erasures within the parity count and targets among them");
            self.plans.insert((erased, targets), plan);
        }
        self.plans.get(&(erased, targets)).expect("present")
    }

    /// Stripes whose queue could not start for lack of op slots.
    fn retry_waiting_stripes(&mut self) {
        // Scanning the stripe table is the slow path: only when a stripe was turned away.
        if self.free_ops.is_empty() || !self.stripes_waiting_for_op {
            return;
        }
        self.stripes_waiting_for_op = false;
        let idle: Vec<StripeIndex> = self
            .stripes
            .keys()
            .filter(|&s| {
                let e = self.stripes.get(s).expect("key");
                // A stripe in its merge window starts when the window ends (`tick`).
                e.op.is_none() && e.queue_head.is_some() && e.merge_until_us == 0
            })
            .collect();
        for stripe in idle {
            if self.free_ops.is_empty() {
                // Stripes are left waiting: look again when the next slot frees.
                self.stripes_waiting_for_op = true;
                break;
            }
            if self.stripes.get(stripe).is_some_and(|e| e.op.is_none()) {
                self.start_next_op(stripe);
            }
        }
    }

    fn finish_request(&mut self, slot: usize, result: Result<(), RequestError>) {
        let request = self.requests[slot].take().expect("live request");
        match (request.op, result) {
            (ShardOp::Read { len_bytes, .. }, Ok(())) => {
                self.counters.reads += 1;
                self.counters.read_bytes += u64::from(len_bytes);
            }
            (ShardOp::Write { len_bytes, .. }, Ok(())) => {
                self.counters.writes += 1;
                self.counters.write_bytes += u64::from(len_bytes);
            }
            (ShardOp::Flush, Ok(())) => self.counters.flushes += 1,
            _ => {}
        }
        self.replies.push_back(ShardReply { id: request.id, result, buf: request.buf });
        self.free_requests.push(slot);
    }

    /// After the writes of a write, resync or zero: release the bitmap region, wait for the
    /// metadata of any member this operation skipped, then finish.
    fn after_writes(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        if op.phase == Phase::Writing && matches!(op.kind, OpKind::Zero { .. }) {
            // Zeroes still to write where the zeroing command was refused, then the FUA
            // flush; each is another round of the Writing phase.
            if self.zero_write_fallback(op_slot) || self.zero_flush_for_fua(op_slot) {
                return;
            }
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.phase == Phase::Writing {
            op.phase = Phase::WaitMetadata;
        }
        let still_failing = op.needs_failed & self.failing_mask();
        if still_failing != 0 {
            self.waiting_metadata.push(op_slot);
            return;
        }
        // Only now may the region be cleared. A write that skipped a failing member leaves
        // that member's chunk stale; until the failure is durable, a crash brings the member
        // back in service, and only the region's bit makes the next start resync the stripe
        // (released when the writes completed, the bit was cleared meanwhile and the stripe
        // kept parity that disagreed with the returning member: found by the power-loss
        // simulation, RAID 6 seed 1479).
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.bitmap_target.take().is_some() {
            let region = op.region;
            self.bitmap.release(region, self.now_us);
        }
        let kind = self.ops[op_slot].as_ref().expect("live").kind;
        if self.array_failed() && matches!(kind, OpKind::Write | OpKind::Zero { .. }) {
            self.ops[op_slot].as_mut().expect("live").result = Err(RequestError::ArrayFailed);
        }
        self.finish_op(op_slot);
    }

    /// Take the bitmap region for an operation's writes; true when it may write now.
    fn bitmap_ready(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.bitmap_target.is_none() {
            let region = op.region;
            let target = match self.bitmap.acquire(region) {
                Acquired::Ready => 0,
                Acquired::Wait { target } => target,
            };
            let op = self.ops[op_slot].as_mut().expect("live");
            op.bitmap_target = Some(target);
        }
        let target = self.ops[op_slot].as_ref().expect("live").bitmap_target.expect("set");
        if self.bitmap.is_durable(target) {
            return true;
        }
        self.ops[op_slot].as_mut().expect("live").phase = Phase::WaitBitmap;
        self.waiting_bitmap.push(op_slot);
        self.kick_bitmap();
        false
    }
}

/// Build the scratch pool: classes from 4 KiB up to the chunk size, the budget shared among
/// them, with enough chunk-sized buffers for the largest operation.
fn scratch_pool(g: &Geometry, budget_bytes: usize) -> Result<BufPool, EngineError> {
    let chunk = usize_of(g.chunk_bytes());
    let mut classes = vec![];
    let mut size = usize::try_from(BLOCK_BYTES).expect("4096");
    while size <= chunk {
        classes.push(size);
        size *= 2;
    }
    let share = budget_bytes / classes.len();
    let op_need = g.member_count() + PARITY_CHUNKS_MAX;
    let spec: Vec<(usize, usize)> = classes
        .iter()
        .map(|&bytes| {
            let count = share / bytes;
            (bytes, if bytes == chunk { count.max(op_need) } else { count })
        })
        .collect();
    BufPool::new(&spec).map_err(|_| EngineError::Setup("scratch pool"))
}

mod background;
mod pace;
mod read;
mod rebuild;
mod scrub;
mod write;

pub use rebuild::RebuildStatus;
pub use scrub::{ScrubStatus, ScrubTally};
