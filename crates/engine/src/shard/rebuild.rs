//! Rebuild: reconstructing a replacement member's chunks, stripe by stripe, while the array
//! serves IO.
//!
//! Owns the shard's rebuild cursor. A member being rebuilt (`Health::Rebuilding`) is in
//! service for the stripes the rebuild has passed and missing for the others, so reads and
//! writes are right on both sides of the cursor: below it the member is read and written like
//! any other; above it reads reconstruct and writes leave it out (the rebuild will compute its
//! chunk from the others when it gets there). A rebuild operation holds its stripe like any
//! other operation, so no write can slip between its reads and its write.
//!
//! Invariants:
//! - `rebuilt(s)` is true exactly for the stripes whose rebuild operation finished with its
//!   write completed: every owned stripe below `low_water`, plus the finished ones of the
//!   window above it (`done_ahead`). Operations finish out of order; the window is 64 owned
//!   stripes, and no rebuild starts beyond it.
//! - `low_water` never moves back, and is reported (`RebuildProgress`) only after the writes
//!   below it completed; the runtime flushes the member before recording it durably, so a
//!   restart resumes at or below the last durable cursor and never trusts an unwritten chunk.
//!
//! Rate and priority: a token bucket in bytes written to the replacement, refilled by `tick`
//! (the operator's limit); within it, a shard keeps `rebuild_stripes_max` operations in
//! flight when idle and `rebuild_busy_stripes_max` while foreground requests are in flight,
//! so that a busy array's requests do not queue behind a burst of rebuild work.
//!
//! A partial rebuild (a member that failed while in sync and came back) reconstructs only
//! the stripes of the regions its start-time snapshot of the missed-write map names; in every
//! other region the member is current, so it is read and written there like any other from
//! the start. The snapshot never shrinks while the rebuild runs, and after a restart the map
//! on disk (a superset) takes its place.
//!
//! Limits: one member rebuilt at a time per array. A stripe that cannot be reconstructed
//! (more members unreadable than the level survives) stalls the rebuild there; the stripes
//! from it on stay missing on the replacement, and status says so (one event per stripe).
//! Every `ShardConfig::rebuild_stall_retry_us`, once nothing of the rebuild is in flight, it
//! tries again from its low-water mark (passing over the stripes of its window already
//! done): a read error that does not repeat, or bad sectors rewritten since, let it go on.

use super::pace::Pace;
use super::{
    OpKind, Phase, REPLANS_MAX, Shard, ShardEvent, ShutdownState, StallCause, StripeEntry,
};
use crate::io::{Durability, MemberIoKind};
use crate::plan::{ChunkSet, bit, has};
use crate::request::RequestError;
use flashraid_layout::{MEMBERS_MAX, MemberIndex, PARITY_CHUNKS_MAX, StripeIndex};

/// A foreground request this recently makes the array busy for the rebuild's pace.
const REBUILD_BUSY_WINDOW_US: u64 = 2_000;
/// Owned stripes a rebuild may run ahead of its low-water mark (bits of `done_ahead`).
const REBUILD_WINDOW_STRIPES: u64 = 64;
/// Owned stripes between two `RebuildProgress` events, at most (small arrays report every
/// 1/32 of their stripes, so a cursor is recorded on them too).
const REBUILD_REPORT_STRIPES: u64 = 1024;
/// Reports over a whole rebuild, at least (where the array has that many stripes).
const REBUILD_REPORTS_MIN: u64 = 32;
// `done_ahead` is a u64 bitmap of the window.
const _: () = assert!(REBUILD_WINDOW_STRIPES <= 64);

/// The rebuild of one member, as one shard runs it.
#[derive(Clone, Debug)]
pub(super) struct RebuildState {
    member: u16,
    /// Every owned stripe below this is rebuilt.
    low_water: u64,
    /// Bit `i`: the `i`-th owned stripe from `low_water` (`low_water` itself is bit 0) is
    /// rebuilt.
    done_ahead: u64,
    /// Next owned stripe to start.
    next: u64,
    in_flight: usize,
    /// A stripe the rebuild waits for (busy with another operation); it starts as soon as
    /// that operation finishes.
    waiting: Option<StripeIndex>,
    /// Where reconstruction failed: nothing is started until `retry_at_us`.
    stalled: Option<StripeIndex>,
    retry_at_us: u64,
    /// The last stripe a `RebuildStalled` event named (a retry that stalls there again says
    /// nothing new).
    stall_reported: Option<StripeIndex>,
    /// Why the operation that gave up last did (read by `rebuild_op_done`).
    lost_cause: StallCause,
    done_announced: bool,
    last_report: u64,
    pace: Pace,
    /// The busy-time limit, taken from as well while the array is busy.
    busy_pace: Pace,
    /// A partial rebuild: per region, whether the member may have missed writes there (only
    /// those regions are rebuilt; the member is current in the others).
    missed: Option<Vec<bool>>,
}

/// How a rebuild operation ended, for its counters.
#[derive(Clone, Copy, Debug)]
pub(super) struct RebuildDone {
    /// Its chunk is on the replacement.
    pub(super) rebuilt: bool,
    /// Its stripe was left untrusted by an unclean shutdown.
    pub(super) untrusted: bool,
    /// Its chunk was written unchecked (the operator trusted parity).
    pub(super) unverified: bool,
}

impl RebuildState {
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }
}

/// A shard's rebuild, for status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebuildStatus {
    pub member: MemberIndex,
    /// Every stripe of this shard below this is rebuilt.
    pub done_below: StripeIndex,
    /// Stripes of this shard, and how many of them are rebuilt.
    pub stripes_total: u64,
    pub stripes_done: u64,
    pub stalled_at: Option<StripeIndex>,
}

impl Shard {
    /// Start (or resume) rebuilding `member` onto the device that now holds its role: every
    /// stripe from `from` on is reconstructed; those below it are trusted as they are (a
    /// durable cursor recorded them). The member serves the stripes below `from` at once.
    /// `zeroes_after_discard` describes the replacement device. `partial`: the device is the
    /// role's own member come back, current except where the missed-write map says writes
    /// went on without it; only those regions are rebuilt.
    pub fn start_rebuild(
        &mut self,
        member: MemberIndex,
        from: StripeIndex,
        zeroes_after_discard: bool,
        partial: bool,
    ) {
        let m = member.get();
        assert!(!self.is_read_only(), "a read-only array is never rebuilt");
        assert!(self.geometry.tolerance() > 0, "a level without redundancy cannot rebuild");
        assert!(self.rebuild.is_none(), "one rebuild at a time");
        assert!(
            matches!(self.members[m].health, super::Health::Failed),
            "a rebuild replaces a durably failed member"
        );
        let first = self.own_stripe_from(from.0.min(self.geometry.stripes()));
        // A device takes the role over: IO still outstanding on the one before (a stalled
        // member's) is counted apart, and its completions, errors included, are not this
        // device's. After EPOCHS takeovers an epoch comes round again; IO of that age still
        // outstanding would then be counted as the new device's.
        self.member_epoch[m] = (self.member_epoch[m] + 1) % super::EPOCHS as u8;
        self.member_progress_us[m] = self.now_us;
        self.member_stall_reported_us[m] = None;
        self.members[m].health = super::Health::Rebuilding;
        self.members[m].zeroes_after_discard = zeroes_after_discard;
        self.zero_unsupported[m] = false;
        self.read_errors[m] = 0;
        self.bad_stripes_seen[m] = [None; super::BAD_STRIPES_SEEN_MAX];
        self.rebuild_generation = self.rebuild_generation.wrapping_add(1);
        self.rebuild = Some(RebuildState {
            member: member.0,
            low_water: first,
            done_ahead: 0,
            next: first,
            in_flight: 0,
            waiting: None,
            stalled: None,
            retry_at_us: 0,
            stall_reported: None,
            lost_cause: StallCause::Unreadable,
            done_announced: false,
            last_report: first,
            pace: Pace::new(self.rebuild_rate_bytes_per_s, self.now_us),
            busy_pace: Pace::new(self.rebuild_busy_rate_bytes_per_s, self.now_us),
            missed: partial.then(|| self.partial_rebuild_regions()),
        });
        self.health_changed();
        // The new member's maps were written from the others' disks; what this shard holds
        // only in memory reaches it with the next images.
        self.bitmap.rewrite_all();
        self.kick_bitmap();
        self.schedule_rebuild();
    }

    /// The regions a partial rebuild reconstructs: those the missed-write map and the
    /// write-intent bitmap name, and those of every stripe with an operation running. An
    /// operation planned while the member was out (a write that left it out, reading the
    /// parity rows it could) must find it out of service until it finishes: the member turning
    /// usable under it would have it write a row it never read (found by the re-add
    /// simulation, seed 506).
    fn partial_rebuild_regions(&self) -> Vec<bool> {
        let mut regions = self.bitmap.missed_snapshot();
        for op in self.ops.iter().flatten() {
            regions[usize::try_from(self.region_of(op.stripe)).expect("fits")] = true;
        }
        regions
    }

    /// The rebuilt member is recorded in service durably: it is an ordinary member again.
    /// If this shard failed the member meanwhile (its failure is on its way to the metadata
    /// owner), nothing changes here: the failure wins.
    pub fn finish_rebuild(&mut self, member: MemberIndex) {
        let m = member.get();
        let Some(r) = self.rebuild.as_ref().filter(|r| usize::from(r.member) == m) else {
            return;
        };
        assert!(
            r.low_water >= self.geometry.stripes(),
            "finish_rebuild before this shard rebuilt every stripe"
        );
        self.members[m].health = super::Health::Active;
        self.rebuild = None;
        self.resume_blocked_resync();
        self.health_changed();
    }

    /// Change this shard's share of the rebuild rate (bytes per second; 0: no limit).
    pub fn set_rebuild_rate(&mut self, bytes_per_s: u64) {
        self.rebuild_rate_bytes_per_s = bytes_per_s;
        if let Some(r) = self.rebuild.as_mut() {
            r.pace.set_rate(bytes_per_s);
        }
        self.schedule_rebuild();
    }

    /// Let the rebuild write its reconstruction of stripes it cannot verify after an unclean
    /// shutdown (the operator's choice, like md's `start_dirty_degraded`: the rebuilt chunk
    /// of a stripe that was being written at the crash is wrong), or not (it stalls there).
    /// A rebuild stalled at such a stripe tries again at once.
    pub fn set_rebuild_trust_parity(&mut self, on: bool) {
        self.rebuild_trust_parity = on;
        if let Some(r) = self.rebuild.as_mut() {
            if on {
                r.retry_at_us = self.now_us;
            }
            // A stall at the same stripe after this is news (its cause may differ; found by
            // review: status kept advising --trust-parity with it already on).
            r.stall_reported = None;
        }
        self.schedule_rebuild();
    }

    /// Change this shard's share of the busy-time rebuild rate (0: no separate limit).
    pub fn set_rebuild_busy_rate(&mut self, bytes_per_s: u64) {
        self.rebuild_busy_rate_bytes_per_s = bytes_per_s;
        if let Some(r) = self.rebuild.as_mut() {
            r.busy_pace.set_rate(bytes_per_s);
        }
        self.schedule_rebuild();
    }

    pub fn rebuild_status(&self) -> Option<RebuildStatus> {
        let r = self.rebuild.as_ref()?;
        let owned_below = |s: u64| self.ownership.owned_below(self.shard_index, s);
        let stripes = self.geometry.stripes();
        let ahead = u64::from(r.done_ahead.count_ones());
        Some(RebuildStatus {
            member: MemberIndex(r.member),
            done_below: StripeIndex(r.low_water.min(stripes)),
            stripes_total: owned_below(stripes),
            stripes_done: owned_below(r.low_water.min(stripes)) + ahead,
            // Every stall is reported when it is set, and shows until the low-water mark
            // passes it (also while a retry runs).
            stalled_at: r.stall_reported.filter(|s| s.0 >= r.low_water),
        })
    }

    /// IO queued for `member` and not yet handed to the driver fails as `Gone`: the member
    /// is failed and its role is about to be given to another device, which must never
    /// receive IO meant for the old one (a read would return the new device's contents).
    pub fn cancel_queued_io(&mut self, member: MemberIndex) {
        assert!(
            matches!(self.members[member.get()].health, super::Health::Failed),
            "only a failed member's IO is cancelled"
        );
        let mut cancelled = Vec::new();
        self.ios.retain(|io| {
            let keep = io.member != member;
            if !keep {
                cancelled.push(io.token);
            }
            keep
        });
        // Never polled (no epoch in the token): not among the outstanding, and the role's
        // device is the one they were for.
        for token in cancelled {
            self.dispatch_completion(crate::io::MemberCompletion {
                token,
                result: Err(crate::io::IoError::Gone),
            });
        }
    }

    pub(super) fn rebuild_member(&self) -> Option<u16> {
        self.rebuild.as_ref().map(|r| r.member)
    }

    /// Whether `stripe`'s chunk on the member being rebuilt is current.
    pub(super) fn rebuilt(&self, stripe: StripeIndex) -> bool {
        let Some(r) = &self.rebuild else { return false };
        if stripe.0 < r.low_water {
            return true;
        }
        if let Some(missed) = &r.missed
            && !missed[usize::try_from(self.region_of(stripe)).expect("fits")]
        {
            return true;
        }
        let ahead = self.owned_between(r.low_water, stripe.0);
        ahead < REBUILD_WINDOW_STRIPES && r.done_ahead & (1 << ahead) != 0
    }

    /// Refill the rate budget (from `tick`).
    pub(super) fn refill_rebuild_budget(&mut self) {
        let (now, chunk) = (self.now_us, u64::from(self.geometry.chunk_bytes()));
        if let Some(r) = self.rebuild.as_mut() {
            r.pace.refill(now, chunk);
            r.busy_pace.refill(now, chunk);
        }
    }

    /// Start rebuild operations while the window, the rate and the op slots allow.
    pub(super) fn schedule_rebuild(&mut self) {
        if self.shutdown != ShutdownState::Running {
            return;
        }
        let stripes = self.geometry.stripes();
        let chunk = u64::from(self.geometry.chunk_bytes());
        // Foreground requests in flight: the rebuild steps back to its busy share; requests
        // in the last moments: to its busy rate.
        let busy = self.free_requests.len() < self.requests.len();
        let recently_busy =
            busy || self.now_us.saturating_sub(self.last_foreground_us) < REBUILD_BUSY_WINDOW_US;
        let in_flight_max = if busy {
            self.config.rebuild_busy_stripes_max
        } else {
            self.config.rebuild_stripes_max
        };
        let now = self.now_us;
        if let Some(r) = self.rebuild.as_mut()
            && r.stalled.is_some()
            && r.in_flight == 0
            && r.waiting.is_none()
            && now >= r.retry_at_us
        {
            // Try again from the low-water mark: every stripe not done in the window (the
            // one that stalled, and any other that failed behind it) is started again.
            r.stalled = None;
            r.next = r.low_water;
        }
        loop {
            let Some(r) = self.rebuild.as_ref() else { return };
            if r.stalled.is_some()
                || r.waiting.is_some()
                || r.in_flight >= in_flight_max
                || r.next >= stripes
                || self.owned_between(r.low_water, r.next) >= REBUILD_WINDOW_STRIPES
                || self.free_ops.is_empty()
            {
                break;
            }
            let stripe = StripeIndex(r.next);
            if r.done_ahead != 0 {
                // After a retry restarted below them: stripes of the window already done.
                let ahead = self.ownership.owned_between(self.shard_index, r.low_water, r.next);
                if r.done_ahead & (1 << ahead) != 0 {
                    let r = self.rebuild.as_mut().expect("checked");
                    r.next = self.ownership.next_owned(self.shard_index, r.next);
                    continue;
                }
            }
            if self.skip_current_stripe(stripe) {
                continue;
            }
            let r = self.rebuild.as_mut().expect("checked");
            if (recently_busy && !r.busy_pace.can_take(chunk)) || !r.pace.take(chunk) {
                break;
            }
            if recently_busy {
                r.busy_pace.take(chunk);
            }
            r.next = self.ownership.next_owned(self.shard_index, r.next);
            r.in_flight += 1;
            if self.stripes.get(stripe).is_some() {
                // Busy: it goes next, before the requests queued behind that operation.
                self.rebuild.as_mut().expect("checked").waiting = Some(stripe);
                break;
            }
            self.stripes.insert(stripe, StripeEntry::default()).expect("sized for every op slot");
            self.start_rebuild_op(stripe);
        }
        self.announce_rebuild();
    }

    /// A partial rebuild passes over `stripe` (next to start) if its region holds nothing
    /// missed: with nothing in flight below it, straight to the next region's first owned
    /// stripe; otherwise it is marked done in the window. True when it passed over.
    fn skip_current_stripe(&mut self, stripe: StripeIndex) -> bool {
        // A full rebuild (no map) or a missed region passes over nothing: found before the
        // divisions below, since a rebuild held back by its rate comes here every turn.
        let Some(missed) = self.rebuild.as_ref().and_then(|r| r.missed.as_ref()) else {
            return false;
        };
        let region = self.region_of(stripe);
        if missed[usize::try_from(region).expect("fits")] {
            return false;
        }
        let per_region = self.stripes_per_region();
        let stripes = self.geometry.stripes();
        let next_region_stripe = (u64::from(region) + 1) * per_region;
        let next_owned = self.own_stripe_from(next_region_stripe.min(stripes));
        let (ownership, shard) = (self.ownership, self.shard_index);
        let r = self.rebuild.as_mut().expect("checked above");
        if r.next == r.low_water && r.done_ahead == 0 {
            // Nothing started below: the window is empty.
            r.low_water =
                next_owned.max(ownership.next_owned(shard, r.next)).min(stripes.max(r.next));
            r.next = r.low_water;
        } else {
            let ahead = ownership.owned_between(shard, r.low_water, stripe.0);
            r.done_ahead |= 1 << ahead;
            r.next = ownership.next_owned(shard, r.next);
            while r.done_ahead & 1 != 0 {
                r.done_ahead >>= 1;
                r.low_water = ownership.next_owned(shard, r.low_water);
            }
            r.next = r.next.max(r.low_water);
        }
        true
    }

    /// If the rebuild waits for `stripe` (whose operation just finished), start it there.
    pub(super) fn start_waiting_rebuild(&mut self, stripe: StripeIndex) -> bool {
        let running = self.shutdown == ShutdownState::Running;
        let Some(r) = self.rebuild.as_mut() else { return false };
        if r.waiting != Some(stripe) || self.free_ops.is_empty() || !running {
            return false;
        }
        r.waiting = None;
        self.start_rebuild_op(stripe);
        true
    }

    fn start_rebuild_op(&mut self, stripe: StripeIndex) {
        let op_slot = self.free_ops.pop().expect("checked by the caller");
        let op = self.new_op(stripe, OpKind::Rebuild);
        self.stripes.get_mut(stripe).expect("present").op = Some(op_slot);
        self.ops[op_slot] = Some(op);
        self.begin(op_slot);
    }

    fn announce_rebuild(&mut self) {
        let stripes = self.geometry.stripes();
        let every = self.rebuild_report_every();
        let generation = self.rebuild_generation;
        let Some(r) = self.rebuild.as_mut() else { return };
        let member = MemberIndex(r.member);
        if r.low_water >= stripes && !r.done_announced {
            r.done_announced = true;
            self.events.push_back(ShardEvent::RebuildDone { member, generation });
        } else if r.low_water >= r.last_report + every {
            r.last_report = r.low_water;
            let done_below = StripeIndex(r.low_water);
            self.events.push_back(ShardEvent::RebuildProgress { member, generation, done_below });
        }
    }

    /// Stripes (array numbering) between two progress reports.
    /// (An array-wide distance: this shard's stripes are spread over the whole array, one
    /// in `shard_count` on average, so the cursor moves about that many per owned stripe.)
    fn rebuild_report_every(&self) -> u64 {
        let count = u64::from(self.ownership.shard_count());
        let owned = self.ownership.owned_below(self.shard_index, self.geometry.stripes());
        (owned / REBUILD_REPORTS_MIN).clamp(1, REBUILD_REPORT_STRIPES) * count
    }

    /// The chunk index of `member` in an operation's stripe.
    fn rebuild_target(&self, op_slot: usize, member: u16) -> usize {
        let op = self.ops[op_slot].as_ref().expect("live");
        let chunks = if self.is_parity_level() {
            self.geometry.data_chunks() + self.geometry.parity_chunks()
        } else {
            self.geometry.member_count()
        };
        (0..chunks).find(|&c| op.chunk_member[c] == member).expect("every member holds a chunk")
    }

    /// Read what reconstructs the target chunk: `k` other chunks (parity levels) or another
    /// copy (mirrors). False when scratch buffers are short (the op is parked).
    pub(super) fn begin_rebuild(&mut self, op_slot: usize) -> bool {
        let generation = self.ops[op_slot].as_ref().expect("live").rebuild_generation;
        let current = self.rebuild.as_ref().filter(|_| generation == self.rebuild_generation);
        let Some(member) = current.map(|r| r.member) else {
            // The rebuild was given up (its member failed) before this op started.
            self.ops[op_slot].as_mut().expect("live").result = Err(RequestError::ArrayFailed);
            self.finish_op(op_slot);
            return true;
        };
        let chunk = self.geometry.chunk_bytes();
        let target = self.rebuild_target(op_slot, member);
        // A re-plan (a source failed) starts over: what an earlier round decided about
        // checking the stripe no longer holds (found by review: a verified round re-planned
        // without a check kept `rebuild_verify` and read scratch it never took, a panic).
        let op = self.ops[op_slot].as_mut().expect("live");
        op.rebuild_verify = false;
        op.rebuild_unverified = false;
        let op = self.ops[op_slot].as_ref().expect("live");
        let stripe = op.stripe;
        // Mirrors read the reference copy wherever resync has not made the copies equal
        // (background init included); parity levels check or refuse only where a write may
        // have been in flight at a crash (`stripe_untrusted`).
        let untrusted = if self.is_parity_level() {
            self.stripe_untrusted(stripe)
        } else {
            self.stripe_needs_resync(stripe)
        };
        let mut sources = [0usize; MEMBERS_MAX];
        let source_count;
        let erased;
        if self.is_parity_level() {
            erased = self.unreadable_chunks(op) | bit(target);
            if erased.count_ones() as usize > self.geometry.parity_chunks()
                || op.replans > REPLANS_MAX
            {
                self.rebuild_lost(op_slot);
                return true;
            }
            // Verified (`rebuild_verify`) where a parity row is left over once every missing
            // chunk is rebuilt (RAID 6 with the target alone missing, 7.3 with one more:
            // found by review, 7.3 stalled there), where every data chunk is readable (a
            // parity target is what resync would write), and where only the target is
            // missing (RAID 5 cannot check a data target, and says so there).
            let m = self.geometry.parity_chunks();
            let data_whole = erased & ((1 << self.geometry.data_chunks()) - 1) == 0;
            if untrusted
                && (erased == bit(target) || data_whole || (erased.count_ones() as usize) < m)
            {
                return self.begin_rebuild_verified(op_slot, target, erased);
            }
            if untrusted {
                // As many chunks missing as parity rows: nothing left to check the
                // reconstruction with.
                if !self.rebuild_trust_parity {
                    self.rebuild_lost_unverifiable(op_slot);
                    return true;
                }
                self.ops[op_slot].as_mut().expect("live").rebuild_unverified = true;
            }
            let plan = self.plan_for(erased, bit(target));
            source_count = plan.sources().len();
            sources[..source_count].copy_from_slice(plan.sources());
        } else {
            // Mirrors: another copy of the same data (the reference copy where resync has
            // not made the copies equal yet, as reads do).
            let i = self.data_position(op, target).expect("mirror chunks hold data");
            let errored = op.errored;
            let source = if untrusted {
                self.reference_copy(stripe, i).filter(|&c| !has(errored, c))
            } else {
                self.pick_copy(stripe, i, errored)
            };
            let Some(source) = source.filter(|_| op.replans <= REPLANS_MAX) else {
                self.rebuild_lost(op_slot);
                return true;
            };
            // Errors of earlier rounds, so that only a new one re-plans.
            erased = errored;
            sources[0] = source;
            source_count = 1;
        }
        let mut needs = [(0usize, 0u32); MEMBERS_MAX + PARITY_CHUNKS_MAX];
        for (n, &c) in needs.iter_mut().zip(&sources[..source_count]) {
            *n = (c, chunk);
        }
        needs[source_count] = (target, chunk);
        let mirror = !self.is_parity_level();
        // Mirrors read straight into the target's buffer.
        let count = if mirror { 1 } else { source_count + 1 };
        if mirror {
            needs[0] = (target, chunk);
        }
        if !self.take_scratch(op_slot, &needs[..count]) {
            return false;
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Reading;
        op.serial = op.serial.wrapping_add(1);
        op.rebuild_erased = erased;
        op.rebuild_targets = bit(target);
        for &c in &sources[..source_count] {
            let op = self.ops[op_slot].as_ref().expect("live");
            let into = if mirror { target } else { c };
            let kind = MemberIoKind::Read {
                offset_bytes: self.member_offset(stripe, 0),
                ptr: Self::scratch_ptr(op, into, 0),
                len_bytes: chunk,
            };
            self.issue(op_slot, c, 0, kind);
        }
        true
    }

    /// A stripe an unclean shutdown left untrusted (its parity may disagree with its data):
    /// reconstructing from parity could invent data. Read every chunk still there; the
    /// target is written only if the stripe proves consistent (see `rebuild_verify`).
    fn begin_rebuild_verified(&mut self, op_slot: usize, target: usize, erased: ChunkSet) -> bool {
        assert!(has(erased, target), "the target is missing");
        let op = self.ops[op_slot].as_mut().expect("live");
        op.rebuild_erased = erased;
        op.rebuild_targets = bit(target);
        op.rebuild_verify = true;
        // Resync's reads: every available chunk, with room for recomputed parity.
        self.begin_resync(op_slot)
    }

    /// Untrusted stripe, every available chunk read. The missing data chunks (the target's
    /// and any other's) are rebuilt from as many parity rows, parity is recomputed from the
    /// data, and the target is kept only if every parity row not missing then agrees (a row
    /// the rebuild did not use checks it). A parity target with no other chunk missing is
    /// what resync would write: parity from the data, nothing to check. With nothing left to
    /// check with (RAID 5, a data target) the rebuild stops there rather than guess, unless
    /// the operator trusts parity.
    fn rebuild_verify(&mut self, op_slot: usize) -> bool {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let len = usize::try_from(self.geometry.chunk_bytes()).expect("fits");
        let op = self.ops[op_slot].as_ref().expect("live");
        let target = op.rebuild_targets.trailing_zeros() as usize;
        let erased = op.rebuild_erased;
        let data_erased = erased & ((1 << k) - 1);
        let spare_row = (erased.count_ones() as usize) < m;
        if data_erased != 0 {
            if !spare_row && !self.rebuild_trust_parity {
                return false;
            }
            self.reconstruct_in_scratch(op_slot, erased, data_erased, len);
            if !spare_row {
                // Nothing to check it with (every row left agrees by construction); written
                // because the operator allowed it.
                self.ops[op_slot].as_mut().expect("live").rebuild_unverified = true;
            }
        }
        // Parity from the data (the rebuilt chunks included) into the extra slots.
        self.encode_parity_in_scratch(op_slot);
        let op = self.ops[op_slot].as_mut().expect("live");
        let (head, extra) = op.scratch.split_at_mut(MEMBERS_MAX);
        let agrees = (0..m).filter(|&r| !has(erased, k + r)).all(|r| {
            head[k + r].as_ref().expect("parity").as_slice()
                == extra[r].as_ref().expect("computed").as_slice()
        });
        if target >= k {
            let computed = extra[target - k].as_ref().expect("computed").as_slice();
            head[target].as_mut().expect("target").as_mut_slice().copy_from_slice(computed);
            if data_erased == 0 {
                return true;
            }
        }
        if !agrees && self.rebuild_trust_parity {
            // The stripe disagrees with itself (a write in flight at the crash); the
            // reconstruction is written because the operator allowed it.
            op.rebuild_unverified = true;
            return true;
        }
        agrees
    }

    /// Sources are in: reconstruct the target chunk and write it to the replacement.
    pub(super) fn rebuild_after_reads(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let targets: ChunkSet = op.rebuild_targets;
        let target = targets.trailing_zeros() as usize;
        if op.errored & !op.rebuild_erased & !targets != 0 {
            // A source failed: plan again with it erased.
            self.release_scratch(op_slot);
            let op = self.ops[op_slot].as_mut().expect("live");
            op.replans += 1;
            if !self.begin_rebuild(op_slot) {
                self.park_starved(op_slot);
            }
            return;
        }
        let generation = self.ops[op_slot].as_ref().expect("live").rebuild_generation;
        let current = self.rebuild.as_ref().filter(|_| generation == self.rebuild_generation);
        let Some(member) = current.map(|r| r.member) else {
            // Its member failed while the sources were read (and maybe another took over).
            self.ops[op_slot].as_mut().expect("live").result = Err(RequestError::ArrayFailed);
            self.finish_op(op_slot);
            return;
        };
        if self.ops[op_slot].as_ref().expect("live").rebuild_verify {
            if !self.rebuild_verify(op_slot) {
                self.rebuild_lost_unverifiable(op_slot);
                return;
            }
        } else if self.is_parity_level() {
            let erased = self.ops[op_slot].as_ref().expect("live").rebuild_erased;
            let len = usize::try_from(self.geometry.chunk_bytes()).expect("fits");
            self.reconstruct_in_scratch(op_slot, erased, targets, len);
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Writing;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        debug_assert_eq!(op.chunk_member[target], member);
        let op = self.ops[op_slot].as_ref().expect("live");
        let kind = MemberIoKind::Write {
            offset_bytes: self.member_offset(stripe, 0),
            ptr: Self::scratch_ptr(op, target, 0).cast_const(),
            len_bytes: self.geometry.chunk_bytes(),
            durability: Durability::Cached,
        };
        self.issue(op_slot, target, 0, kind);
    }

    /// The stripe cannot be reconstructed reliably after an unclean shutdown: the rebuild
    /// stalls here, saying so.
    fn rebuild_lost_unverifiable(&mut self, op_slot: usize) {
        if let Some(r) = self.rebuild.as_mut() {
            r.lost_cause = StallCause::Unverifiable;
        }
        self.rebuild_lost(op_slot);
    }

    /// The stripe cannot be reconstructed: the rebuild stalls here.
    fn rebuild_lost(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.result = Err(RequestError::Unreadable);
        self.finish_op(op_slot);
    }

    /// A rebuild operation finished (from `finish_op`). Its stripe counts as rebuilt (and as
    /// untrusted or unverified, from how it was reconstructed) only here, once its chunk is on
    /// the replacement: counted when the write was issued, a write that then failed counted
    /// a stripe never rebuilt (found by review).
    pub(super) fn rebuild_op_done(
        &mut self,
        stripe: StripeIndex,
        generation: u32,
        done: RebuildDone,
    ) {
        let (ownership, shard) = (self.ownership, self.shard_index);
        if generation != self.rebuild_generation {
            return;
        }
        let RebuildDone { rebuilt, untrusted, unverified } = done;
        self.counters.rebuild_stripes += u64::from(rebuilt);
        self.counters.rebuild_untrusted_stripes += u64::from(rebuilt && untrusted);
        self.counters.rebuild_unverified_stripes += u64::from(rebuilt && unverified);
        let Some(r) = self.rebuild.as_mut() else { return };
        r.in_flight -= 1;
        let cause = std::mem::replace(&mut r.lost_cause, StallCause::Unreadable);
        if !rebuilt {
            if r.stalled.is_none_or(|s| stripe < s) {
                r.stalled = Some(stripe);
                r.retry_at_us = self.now_us + self.config.rebuild_stall_retry_us;
                if r.stall_reported != Some(stripe) {
                    r.stall_reported = Some(stripe);
                    let member = MemberIndex(r.member);
                    self.events.push_back(ShardEvent::RebuildStalled { member, stripe, cause });
                }
            }
            return;
        }
        let ahead = ownership.owned_between(shard, r.low_water, stripe.0);
        assert!(ahead < REBUILD_WINDOW_STRIPES, "rebuild finished outside its window");
        r.done_ahead |= 1 << ahead;
        while r.done_ahead & 1 != 0 {
            r.done_ahead >>= 1;
            r.low_water = ownership.next_owned(shard, r.low_water);
        }
        // After a retry restarted at the low-water mark, stripes of the window done before it
        // may now lie below: the next one to start is never below the mark (found in review:
        // `owned_between(low_water, next)` underflowed).
        r.next = r.next.max(r.low_water);
        if r.low_water >= self.geometry.stripes() {
            r.low_water = self.geometry.stripes().max(r.low_water);
        }
        self.announce_rebuild();
    }
}
