//! Everything that is not a read or a write of data: flushes, zeroing whole stripes (and
//! the groups of member flushes FUA zeroes share), the write-intent bitmap's IO, time,
//! background resync after an unclean shutdown (reading a chunk that failed to read again
//! in 4 KiB units, to rewrite only those that cannot be read), and the clean shutdown
//! sequence.
//!
//! Limits: the FUA flush groups hold at most one entry per op slot (`fua_waiting`,
//! `fua_group`, allocated at start); a resync probe queues up to 256 reads per chunk of
//! 1 MiB, beyond the IO queue's usual depth (a fault path: the queue grows once).

use super::{FailReason, Health, ORIGIN_BITMAP, ORIGIN_FLUSH, ORIGIN_INTERNAL_FLUSH, OpKind};
use super::{Phase, Shard, ShardEvent, ShutdownState, StripeEntry, UnitDest};
use crate::io::{Durability, IoError, MemberIo, MemberIoKind};
use crate::plan::{ChunkRange, ChunkSet, UNIT_BYTES, Units, bit, has};
use crate::request::{RequestError, ZeroHow};
use flashraid_layout::{MEMBERS_MAX, MemberIndex, StripeIndex};

/// How often `tick` looks for bitmap regions to clear.
const BITMAP_SCAN_INTERVAL_US: u64 = 1000;

impl Shard {
    // ------------------------------------------------------------------------------------
    // Time

    /// Advance the shard's clock (microseconds, monotonic) and do what is due: lazy bitmap
    /// clearing (with the member flush it needs first) and background resync.
    pub fn tick(&mut self, now_us: u64) {
        self.note_clock_gap(now_us.saturating_sub(self.now_us));
        self.now_us = self.now_us.max(now_us);
        let now = self.now_us;
        if !self.merge_waiting.is_empty() {
            self.start_merge_waiting(false);
        }
        // Scanning every region costs O(regions): at most once per millisecond (the clearing
        // delay is seconds, so this loses nothing).
        if now.saturating_sub(self.last_bitmap_scan_us) >= BITMAP_SCAN_INTERVAL_US {
            self.last_bitmap_scan_us = now;
            self.check_stalled_members();
            // Read-only: the bitmap stays as the start found it (its dirty regions are never
            // resynced), and nothing was written that a flush would make durable.
            if !self.is_read_only() {
                if self.internal_flush_pending == 0 && self.bitmap.wants_flush(now) {
                    self.start_internal_flush();
                }
                // Failed past its tolerance, no bit is released: writes are refused, and a
                // write in flight at the failure (it may have reached only some members)
                // keeps its region in the write-intent bitmap, which a forced start
                // resyncs, rather than moving it into the missed-write map, which a forced
                // start that brings back the member failed last does not distrust.
                if !self.array_failed() {
                    let untrusted = &self.resync_regions[self.untrusted_from()..];
                    self.bitmap.clear_idle(now, &|r| untrusted.binary_search(&r).is_ok());
                }
                self.kick_bitmap();
            }
        }
        if self.resync_region_index < self.resync_regions.len() || !self.resync_announced {
            self.resync_pace.refill(now, u64::from(self.geometry.chunk_bytes()));
            self.schedule_resync();
        }
        if self.rebuild.is_some() {
            self.refill_rebuild_budget();
            self.schedule_rebuild();
        }
        if self.scrub.is_some() {
            self.refill_scrub_budget();
            self.schedule_scrub();
        }
        self.advance_shutdown();
    }

    /// Index in `resync_regions` (sorted) where the regions resync has not vouched for yet
    /// begin: the earliest of the region being resynced, any resync operation still in
    /// flight and the point where resync stopped. Their bits must stay set, so that a crash
    /// resyncs them again.
    fn untrusted_from(&self) -> usize {
        let mut from = self.resync_region_index;
        if let Some((blocked, _)) = self.resync_blocked {
            from = from.min(blocked);
        }
        if self.resync_in_flight > 0 {
            for op in self.ops.iter().flatten().filter(|op| op.kind == OpKind::Resync) {
                if let Ok(i) = self.resync_regions.binary_search(&self.region_of(op.stripe)) {
                    from = from.min(i);
                }
            }
        }
        from.min(self.resync_regions.len())
    }

    // ------------------------------------------------------------------------------------
    // Flush

    pub(super) fn start_flush(&mut self, slot: usize) {
        let members: Vec<u16> = (0..self.geometry.member_count())
            .map(|m| u16::try_from(m).expect("fits"))
            .filter(|&m| self.available(m))
            .collect();
        if members.is_empty() {
            self.finish_request(slot, Err(RequestError::ArrayFailed));
            return;
        }
        let issued = self.bitmap.flush_issued();
        let request = self.requests[slot].as_mut().expect("live");
        request.pending = u32::try_from(members.len()).expect("fits");
        request.flush_issued_at = issued;
        for m in members {
            let token = Self::token(ORIGIN_FLUSH, slot, 0, usize::from(m), 0);
            self.ios.push_back(MemberIo {
                token,
                member: MemberIndex(m),
                kind: MemberIoKind::Flush,
            });
        }
    }

    pub(super) fn complete_flush_io(
        &mut self,
        slot: usize,
        member: usize,
        result: Result<(), IoError>,
    ) {
        if result.is_err() {
            self.fail_member(u16::try_from(member).expect("fits"), FailReason::FlushError);
        }
        let request = self.requests[slot].as_mut().expect("flush in flight");
        request.member_errors |= result.is_err();
        request.pending -= 1;
        if request.pending > 0 {
            return;
        }
        let issued = request.flush_issued_at;
        if request.member_errors {
            self.bitmap.flush_failed(issued);
        } else {
            // Every write released before the flush was issued is durable on every member
            // still in service: their bitmap regions may be cleared.
            self.bitmap.flush_completed(issued);
        }
        self.finish_flush(slot);
    }

    /// A flush whose member flushes are done succeeds only once no member is failing: a
    /// member that failed (during this flush or before it) may hold acknowledged writes that
    /// never became durable, and only its durable failure makes the array stop counting on
    /// them. Until then the flush waits (`apply_failed` retries it).
    pub(super) fn finish_flush(&mut self, slot: usize) {
        if self.failing_mask() != 0 {
            self.waiting_flushes.push(slot);
            return;
        }
        let result = if self.array_failed() { Err(RequestError::ArrayFailed) } else { Ok(()) };
        self.finish_request(slot, result);
    }

    fn start_internal_flush(&mut self) {
        let members: Vec<u16> = (0..self.geometry.member_count())
            .map(|m| u16::try_from(m).expect("fits"))
            .filter(|&m| self.available(m))
            .collect();
        if members.is_empty() {
            return;
        }
        self.internal_flush_issued_at = self.bitmap.flush_issued();
        self.internal_flush_pending = u32::try_from(members.len()).expect("fits");
        for m in members {
            let token = Self::token(ORIGIN_INTERNAL_FLUSH, 0, 0, usize::from(m), 0);
            self.ios.push_back(MemberIo {
                token,
                member: MemberIndex(m),
                kind: MemberIoKind::Flush,
            });
        }
    }

    pub(super) fn complete_internal_flush(&mut self, member: usize, result: Result<(), IoError>) {
        if result.is_err() {
            self.fail_member(u16::try_from(member).expect("fits"), FailReason::FlushError);
        }
        self.internal_flush_errors |= result.is_err();
        self.internal_flush_pending -= 1;
        if self.internal_flush_pending == 0 {
            // A failed member flush proves nothing durable: the regions wait for the next
            // flush, which no longer includes that member.
            if std::mem::take(&mut self.internal_flush_errors) {
                self.bitmap.flush_failed(self.internal_flush_issued_at);
            } else {
                self.bitmap.flush_completed(self.internal_flush_issued_at);
            }
            self.tick(self.now_us);
        }
    }

    // ------------------------------------------------------------------------------------
    // Bitmap IO

    /// Write the next bitmap image if one is due and none is in flight.
    pub(super) fn kick_bitmap(&mut self) {
        let members: Vec<u16> = (0..self.geometry.member_count())
            .map(|m| u16::try_from(m).expect("fits"))
            .filter(|&m| self.available(m))
            .collect();
        if members.is_empty() {
            // No member to carry the image: writes waiting for it can never go.
            if self.bitmap_pending == 0 {
                for op_slot in std::mem::take(&mut self.waiting_bitmap) {
                    let op = self.ops[op_slot].as_mut().expect("waiting op");
                    op.result = Err(RequestError::ArrayFailed);
                    if op.bitmap_target.take().is_some() {
                        let region = op.region;
                        self.bitmap.release(region, self.now_us);
                    }
                    self.finish_op(op_slot);
                }
            }
            return;
        }
        let (intent_offset, missed_offset) = (self.bitmap_offset_bytes, self.missed_offset_bytes);
        let Some((kind, buf)) = self.bitmap.start_image() else { return };
        let offset = match kind {
            crate::bitmap::ImageKind::WriteIntent => intent_offset,
            crate::bitmap::ImageKind::Missed => missed_offset,
        };
        let len = u32::try_from(buf.capacity_bytes()).expect("4 KiB");
        let ptr = buf.as_mut_ptr().cast_const();
        self.bitmap_pending = u32::try_from(members.len()).expect("fits");
        self.counters.bitmap_writes += 1;
        for m in members {
            let token = Self::token(ORIGIN_BITMAP, 0, 0, usize::from(m), 0);
            let kind = MemberIoKind::Write {
                offset_bytes: offset,
                ptr,
                len_bytes: len,
                durability: Durability::Fua,
            };
            self.ios.push_back(MemberIo { token, member: MemberIndex(m), kind });
        }
    }

    pub(super) fn complete_bitmap_io(&mut self, member: usize, result: Result<(), IoError>) {
        if let Err(error) = result {
            let reason =
                if error == IoError::Gone { FailReason::Gone } else { FailReason::WriteError };
            self.fail_member(u16::try_from(member).expect("fits"), reason);
        }
        self.bitmap_pending -= 1;
        if self.bitmap_pending > 0 {
            return;
        }
        self.bitmap.image_written();
        let waiting = std::mem::take(&mut self.waiting_bitmap);
        for op_slot in waiting {
            let target =
                self.ops[op_slot].as_ref().expect("waiting op").bitmap_target.expect("set");
            if self.bitmap.is_durable(target) {
                self.advance(op_slot);
            } else {
                self.waiting_bitmap.push(op_slot);
            }
        }
        self.kick_bitmap();
    }

    /// Start a clean shutdown: refuse new requests, stop starting resync work, and then, as
    /// `tick` drives it (see `ShutdownState`): let everything in flight finish, flush every
    /// member, clear every flushed region resync does not still need, and write that image.
    /// The runtime marks the array clean only if every shard ends `Done { clean: true }`.
    pub fn begin_shutdown(&mut self) {
        if self.shutdown == ShutdownState::Running {
            self.shutdown = ShutdownState::Draining;
        }
        // Writes waiting for neighbours start now: nothing more will join them.
        self.start_merge_waiting(true);
        self.advance_shutdown();
    }

    pub fn shutdown_state(&self) -> ShutdownState {
        self.shutdown
    }

    /// Ended `Done { clean: false }` only because background init has regions left (with
    /// no crash since, `resync_init_only`): every write is durable and its bit cleared, the
    /// bits left are init's. The runtime records that (`Metadata::mark_stopped_in_init`), so
    /// the next start trusts reconstruction there as this session did.
    pub fn stopped_with_only_init_left(&self) -> bool {
        self.stopped_in_init
    }

    fn advance_shutdown(&mut self) {
        loop {
            match self.shutdown {
                ShutdownState::Running | ShutdownState::Done { .. } => return,
                ShutdownState::Draining => {
                    if !self.is_idle() {
                        return;
                    }
                    if self.is_read_only() {
                        // Nothing was written: nothing to flush, and the bitmap stays as the
                        // start found it (never clean: the array is not marked clean either).
                        self.shutdown = ShutdownState::Done { clean: false };
                        return;
                    }
                    self.start_internal_flush();
                    if self.internal_flush_pending == 0 {
                        // No member left to flush.
                        self.shutdown = ShutdownState::Done { clean: false };
                        return;
                    }
                    self.shutdown = ShutdownState::Flushing;
                }
                ShutdownState::Flushing => {
                    // Wait for the flush, and for any member failed meanwhile to be durably
                    // failed (only then does its missing data stop mattering).
                    if self.internal_flush_pending > 0 || self.failing_mask() != 0 {
                        return;
                    }
                    // Failed past its tolerance: the bits stay, as while running (`tick`).
                    if !self.array_failed() {
                        let untrusted = &self.resync_regions[self.untrusted_from()..];
                        self.bitmap.clear_flushed(&|r| untrusted.binary_search(&r).is_ok());
                    }
                    self.kick_bitmap();
                    self.shutdown = ShutdownState::Clearing;
                }
                ShutdownState::Clearing => {
                    if self.bitmap.image_in_flight() {
                        return;
                    }
                    if self.bitmap.has_changes() {
                        self.kick_bitmap();
                        if self.bitmap.image_in_flight() {
                            return;
                        }
                        // No member to write the image to.
                        self.shutdown = ShutdownState::Done { clean: false };
                        return;
                    }
                    let failing = self.failing_mask() != 0;
                    let clean = self.bitmap.is_clear() && !failing;
                    // Flushed, and every bit left is a region resync has not vouched for
                    // (`clear_flushed` above kept only those): with init's only, that is
                    // still all they are.
                    self.stopped_in_init =
                        !clean && !failing && self.resync_init_only && !self.array_failed();
                    self.shutdown = ShutdownState::Done { clean };
                }
            }
        }
    }

    // ------------------------------------------------------------------------------------
    // Zeroing whole stripes

    pub(super) fn begin_zero(&mut self, op_slot: usize) -> bool {
        if self.bitmap_ready(op_slot) {
            self.zero_issue(op_slot);
        }
        true
    }

    pub(super) fn zero_issue(&mut self, op_slot: usize) {
        let failing = self.failing_mask();
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Writing;
        op.serial = op.serial.wrapping_add(1);
        let OpKind::Zero { how } = op.kind else { unreachable!("zero ops only") };
        let stripe = op.stripe;
        let offset = self.member_offset(stripe, 0);
        let len = u64::from(self.geometry.chunk_bytes());
        for member in 0..self.geometry.member_count() {
            let m = u16::try_from(member).expect("fits");
            if !self.usable(stripe, m) {
                self.ops[op_slot].as_mut().expect("live").needs_failed |= failing & (1u64 << m);
                continue;
            }
            let discard = how == ZeroHow::Discard && self.members[member].zeroes_after_discard;
            let kind = if self.zero_unsupported[member] && !discard {
                MemberIoKind::Write {
                    offset_bytes: offset,
                    ptr: self.zeroes.as_slice().as_ptr(),
                    len_bytes: self.geometry.chunk_bytes(),
                    durability: Durability::Cached,
                }
            } else if discard {
                MemberIoKind::Discard { offset_bytes: offset, len_bytes: len }
            } else {
                MemberIoKind::WriteZeroes { offset_bytes: offset, len_bytes: len }
            };
            // Chunk index = member here: zeroing does not care about roles.
            let op = self.ops[op_slot].as_mut().expect("live");
            op.chunk_member[member] = m;
            self.issue(op_slot, member, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// Zero: write zeroes to the members that refused the zeroing command. True when IO was
    /// issued (the Writing phase goes on).
    pub(super) fn zero_write_fallback(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_mut().expect("live");
        let fallback = std::mem::take(&mut op.zero_fallback);
        if fallback == 0 {
            return false;
        }
        op.zero_fallback_issued = true;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        let offset = self.member_offset(stripe, 0);
        for member in (0..self.geometry.member_count()).filter(|&m| has(fallback, m)) {
            let m = u16::try_from(member).expect("fits");
            if !self.usable(stripe, m) {
                continue;
            }
            let kind = MemberIoKind::Write {
                offset_bytes: offset,
                ptr: self.zeroes.as_slice().as_ptr(),
                len_bytes: self.geometry.chunk_bytes(),
                durability: Durability::Cached,
            };
            self.issue(op_slot, member, 0, kind);
        }
        self.ops[op_slot].as_ref().expect("live").pending > 0
    }

    /// Zero with FUA: discard and write-zeroes carry no FUA, so the members are flushed
    /// before it completes. The zero joins the next group of member flushes (one per
    /// member, issued when the driver next polls for IO, so every zero whose writes complete
    /// in one batch of completions joins it, and not before the group in flight, if any, is
    /// done: that one was issued before these writes completed and covers nothing of them).
    /// A long FUA trim is many stripe zeroes finishing close together: they share flushes
    /// instead of each flushing every member (docs/PERFORMANCE.md, "FUA zeroes share member
    /// flushes in the engine"). True when the zero now waits.
    pub(super) fn zero_flush_for_fua(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.durability != Durability::Fua || op.fua_flushed {
            return false;
        }
        op.fua_flushed = true;
        op.phase = Phase::WaitFlush;
        assert!(self.fua_waiting.len() < self.ops.len(), "a zero waits for FUA flushes twice");
        self.fua_waiting.push(op_slot);
        true
    }

    /// Issue a group of member flushes for the FUA zeroes waiting, unless one is in flight
    /// (from `poll_io`).
    pub(super) fn start_fua_flush_group(&mut self) {
        if self.fua_group_active || self.fua_waiting.is_empty() {
            return;
        }
        self.fua_group_active = true;
        // Both lists keep their capacity: no allocation here.
        std::mem::swap(&mut self.fua_waiting, &mut self.fua_group);
        // A member failing now is not flushed, and may hold these zeroes unflushed: they
        // wait for its failure to be durable (found by review: they completed without).
        self.fua_group_failed = self.failing_mask();
        self.fua_group_members = 0;
        for member in 0..self.geometry.member_count() {
            let m = u16::try_from(member).expect("fits");
            if !self.available(m) {
                continue;
            }
            self.fua_group_members |= 1u64 << member;
            let token = Self::token(super::ORIGIN_FUA_FLUSH, 0, 0, member, 0);
            self.ios.push_back(MemberIo {
                token,
                member: MemberIndex(m),
                kind: MemberIoKind::Flush,
            });
        }
        if self.fua_group_members == 0 {
            // No member left to flush (the array has failed): the zeroes go on to say so.
            self.finish_fua_flush_group();
        }
    }

    pub(super) fn complete_fua_flush(&mut self, member: usize, result: Result<(), IoError>) {
        let bit = 1u64 << member;
        if self.completing_stale || !self.fua_group_active || self.fua_group_members & bit == 0 {
            // From a device the role has left, or a flush written off when its member was
            // durably failed: it no longer counts.
            return;
        }
        if let Err(error) = result {
            // As a zero's own write error: the member fails, and the zeroes wait for that
            // to be durable before they complete.
            let reason =
                if error == IoError::Gone { FailReason::Gone } else { FailReason::FlushError };
            self.fail_member(u16::try_from(member).expect("fits"), reason);
            self.fua_group_failed |= bit;
        }
        self.fua_group_members &= !bit;
        if self.fua_group_members == 0 {
            self.finish_fua_flush_group();
        }
    }

    /// Members durably failed: the group's flushes they hold are not waited for any more (a
    /// stalled member's flush may never come back, and nothing on it is relied on now;
    /// found by review: one hung flush held every later FUA zero of the shard).
    pub(super) fn write_off_fua_flushes(&mut self, failed: &[MemberIndex]) {
        if !self.fua_group_active || self.fua_group_members == 0 {
            return;
        }
        for m in failed {
            self.fua_group_members &= !(1u64 << m.get());
        }
        if self.fua_group_members == 0 {
            self.finish_fua_flush_group();
        }
    }

    /// The group's flushes are done: its zeroes go on (`after_writes`); the next group starts
    /// at the next `poll_io`.
    fn finish_fua_flush_group(&mut self) {
        // Taken out while the zeroes go on (one may finish and start another zero, which
        // waits: `fua_group_active` holds the next group back until this one is through).
        let mut group = std::mem::take(&mut self.fua_group);
        let failed = self.fua_group_failed;
        for &op_slot in &group {
            let op = self.ops[op_slot].as_mut().expect("a waiting zero is live");
            assert_eq!(op.phase, Phase::WaitFlush);
            op.phase = Phase::Writing;
            op.needs_failed |= failed;
            self.advance(op_slot);
        }
        group.clear();
        self.fua_group = group;
        self.fua_group_active = false;
    }

    // ------------------------------------------------------------------------------------
    // Resync after an unclean shutdown

    /// Whether `stripe` lies in a dirty region this shard has not resynced yet: its parity
    /// (or mirror copies) may disagree with its data.
    pub(super) fn stripe_needs_resync(&self, stripe: StripeIndex) -> bool {
        let region = self.region_of(stripe);
        if let Some((blocked_index, blocked_stripe)) = self.resync_blocked
            && let Ok(p) = self.resync_regions.binary_search(&region)
            && (p > blocked_index || (p == blocked_index && stripe.0 >= blocked_stripe))
        {
            return true;
        }
        if self.resync_region_index >= self.resync_regions.len() {
            return false;
        }
        match self.resync_regions.binary_search(&region) {
            Err(_) => false,
            Ok(p) if p < self.resync_region_index => false,
            Ok(p) if p == self.resync_region_index => stripe.0 >= self.resync_next_stripe,
            Ok(_) => true,
        }
    }

    /// Whether a parity stripe's reconstruction cannot be trusted: resync has not vouched
    /// for it, and it may hold a write that was in flight at a crash (never where every
    /// region left is one background init has not reached, with no crash since:
    /// `resync_init_only`; found by review: a member failing during background init made
    /// every acknowledged write in the stripes init had not reached unreadable, refused
    /// writes there, and stalled the spare's rebuild for good). Writes there still
    /// recompute parity (`stripe_needs_resync`), which is what keeps this true.
    pub(super) fn stripe_untrusted(&self, stripe: StripeIndex) -> bool {
        !self.resync_init_only && self.stripe_needs_resync(stripe)
    }

    pub(super) fn region_of(&self, stripe: StripeIndex) -> u32 {
        let bytes = stripe.0 * u64::from(self.geometry.chunk_bytes());
        u32::try_from(bytes / self.bitmap_region_bytes()).expect("regions fit u32")
    }

    pub(super) fn stripes_per_region(&self) -> u64 {
        (self.bitmap_region_bytes() / u64::from(self.geometry.chunk_bytes())).max(1)
    }

    /// First stripe this shard owns at or after `stripe`.
    pub(super) fn own_stripe_from(&self, stripe: u64) -> u64 {
        self.ownership.first_owned_from(self.shard_index, stripe)
    }

    pub(super) fn first_stripe_of_resync_region(&self) -> u64 {
        match self.resync_regions.get(self.resync_region_index) {
            Some(&region) => self.own_stripe_from(u64::from(region) * self.stripes_per_region()),
            None => 0,
        }
    }

    /// Set this shard's share of the resync rate limit (bytes of each member per second;
    /// 0: no limit). Takes effect at once.
    pub fn set_resync_rate(&mut self, bytes_per_s: u64) {
        self.resync_pace.set_rate(bytes_per_s);
    }

    /// Every member is in service again (a rebuild finished): resync stopped at a stripe whose
    /// data it could not read goes on from there (found by review: it never did, so the
    /// regions stayed untrusted and the array never stopped clean).
    pub(super) fn resume_blocked_resync(&mut self) {
        if !self.members.iter().all(|m| m.health == Health::Active) {
            return;
        }
        let Some((index, stripe)) = self.resync_blocked.take() else { return };
        if (index, stripe) < (self.resync_region_index, self.resync_next_stripe) {
            self.resync_region_index = index;
            self.resync_next_stripe = stripe;
        }
        self.schedule_resync();
    }

    /// Resync cannot go on: a stripe's data could not be read, or the array is degraded (so
    /// parity can no longer be checked against all the data).
    pub(super) fn resync_stalled(&self) -> bool {
        // Read-only: resync would write parity; its regions stay untrusted instead.
        self.resync_blocked.is_some()
            || self.is_read_only()
            || (self.geometry.tolerance() > 0
                && self.members.iter().any(|m| m.health != Health::Active))
    }

    /// Start resync operations while there is room and work.
    fn schedule_resync(&mut self) {
        let tolerance_left = self.members.iter().all(|m| m.health == Health::Active);
        if self.resync_blocked.is_some()
            || self.shutdown != ShutdownState::Running
            || self.is_read_only()
        {
            return;
        }
        while self.resync_in_flight < self.config.resync_stripes_max
            && self.resync_region_index < self.resync_regions.len()
        {
            if !tolerance_left && self.geometry.tolerance() > 0 {
                // Degraded: parity cannot be checked against all data any more. Stop; the
                // remaining stripes stay untrusted (reconstructed reads of them are refused).
                return;
            }
            let region = self.resync_regions[self.resync_region_index];
            let end = (u64::from(region) + 1) * self.stripes_per_region();
            let end = end.min(self.geometry.stripes());
            let stripe = self.resync_next_stripe;
            if stripe >= end {
                self.resync_region_index += 1;
                self.resync_next_stripe = self.first_stripe_of_resync_region();
                continue;
            }
            if self.stripes.get(StripeIndex(stripe)).is_some() || self.free_ops.is_empty() {
                // Busy stripe or no op slot: try again on a later tick.
                return;
            }
            if !self.resync_pace.take(u64::from(self.geometry.chunk_bytes())) {
                return; // over the rate limit: the next tick refills
            }
            let Some(op_slot) = self.free_ops.pop() else { return };
            let op = self.new_op(StripeIndex(stripe), OpKind::Resync);
            let entry = StripeEntry { op: Some(op_slot), ..StripeEntry::default() };
            self.stripes.insert(StripeIndex(stripe), entry).expect("sized for every op slot");
            self.ops[op_slot] = Some(op);
            self.resync_in_flight += 1;
            self.resync_next_stripe = self.next_owned(stripe);
            self.begin(op_slot);
        }
        let finished = self.resync_region_index >= self.resync_regions.len()
            && self.resync_in_flight == 0
            && self.resync_blocked.is_none();
        if !self.resync_announced && finished && !self.resync_regions.is_empty() {
            self.resync_announced = true;
            self.events.push_back(ShardEvent::ResyncDone);
        }
    }

    pub(super) fn begin_resync(&mut self, op_slot: usize) -> bool {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let chunk = self.geometry.chunk_bytes();
        let n = self.geometry.member_count();
        // Parity levels read every chunk and recompute parity into extra slots
        // (MEMBERS_MAX + r); mirrors read every copy.
        let chunks = if self.is_parity_level() { k + m } else { n };
        let mut needs = [(0usize, 0u32); MEMBERS_MAX + 3];
        let mut count = 0;
        for c in 0..chunks {
            needs[count] = (c, chunk);
            count += 1;
        }
        if self.is_parity_level() {
            for r in 0..m {
                needs[count] = (MEMBERS_MAX + r, chunk);
                count += 1;
            }
        }
        if !self.take_scratch(op_slot, &needs[..count]) {
            return false;
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Reading;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        for c in 0..chunks {
            let op = self.ops[op_slot].as_ref().expect("live");
            if !self.usable(stripe, op.chunk_member[c]) {
                continue;
            }
            let kind = MemberIoKind::Read {
                offset_bytes: self.member_offset(stripe, 0),
                ptr: Self::scratch_ptr(op, c, 0),
                len_bytes: chunk,
            };
            self.issue(op_slot, c, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
        true
    }

    /// Compare what was read and decide what to rewrite.
    ///
    /// A chunk that failed to read is first read again in 4 KiB units (`UNIT_BYTES`), so
    /// that only the units that cannot be read count as unreadable: the rest of the chunk
    /// may have been read by a client before resync came, and must not change now (found in
    /// review: rewriting whole chunks did change it, and so did units larger than a block).
    /// Then, unit by unit:
    /// - mirrors: the reference copy is the one reads of an untrusted stripe use (the
    ///   lowest member in service), or where it cannot be read, the lowest copy that can;
    ///   every other copy that differs from it or cannot be read takes its bytes (which
    ///   heals a bad sector); a unit no copy can read is left alone;
    /// - parity levels: where a data chunk's unit cannot be read, it is rebuilt from as many
    ///   parity rows as units are missing there and kept only if a parity row the rebuild
    ///   did not use agrees (RAID 6 with one such unit, 7.3 with two); then parity rows that
    ///   disagree with the data or could not be read are rewritten. A unit that cannot be
    ///   checked so (RAID 5; every row needed to rebuild it), or that disagrees with itself
    ///   (a write was in flight at the crash), stops resync at this stripe: its unreadable
    ///   data is not known.
    pub(super) fn resync_after_reads(&mut self, op_slot: usize) {
        let unit = usize::try_from(UNIT_BYTES).expect("fits");
        let units = usize::try_from(self.geometry.chunk_bytes()).expect("fits") / unit;
        let op = self.ops[op_slot].as_ref().expect("live");
        let absent = self.absent_chunks_all(op);
        let failed = op.errored & !absent;
        if failed != 0 && op.probed == 0 && units > 1 {
            self.probe_units(op_slot, failed, units);
            return;
        }
        let all_units = Units::first(units);
        let chunks = if self.is_parity_level() {
            self.geometry.data_chunks() + self.geometry.parity_chunks()
        } else {
            self.geometry.member_count()
        };
        // Per chunk index, the units that cannot be read.
        let mut bad = [Units::default(); MEMBERS_MAX];
        let op = self.ops[op_slot].as_ref().expect("live");
        for (c, b) in bad.iter_mut().enumerate().take(chunks) {
            if has(absent | op.errored, c) {
                *b = all_units;
            } else if has(op.probed, c) {
                *b = op.units[c];
            }
        }
        let decided = if self.is_parity_level() {
            self.resync_decide_parity(op_slot, &bad, units, all_units)
        } else {
            Some(self.resync_decide_mirror(op_slot, &bad, units))
        };
        let Some(rewrite) = decided else {
            // Stop resync here and keep this stripe and everything after it untrusted.
            let stripe = self.ops[op_slot].as_ref().expect("live").stripe;
            let index = self.resync_regions.binary_search(&self.region_of(stripe)).unwrap_or(0);
            if self.resync_blocked.is_none_or(|(i, s)| (index, stripe.0) < (i, s)) {
                self.resync_blocked = Some((index, stripe.0));
            }
            self.finish_op(op_slot);
            return;
        };
        // Counted for what is written to members in service (a member out of service is
        // skipped when the writes are issued).
        let healed =
            (0..chunks).filter(|&c| has(rewrite & !absent, c) && !bad[c].is_empty()).count();
        self.counters.errors_corrected += u64::try_from(healed).expect("fits");
        self.counters.resync_repairs += u64::from(rewrite & !absent != 0);
        let op = self.ops[op_slot].as_mut().expect("live");
        op.repaired = rewrite;
        if rewrite == 0 {
            self.finish_op(op_slot);
            return;
        }
        if self.bitmap_ready(op_slot) {
            self.resync_issue(op_slot);
        }
    }

    /// Read the chunks `failed` again, unit by unit, into their scratch buffers. (Up to 256
    /// reads per chunk of 1 MiB: a fault path, beyond the IO queue's usual depth, which
    /// then grows once.)
    pub(super) fn probe_units(&mut self, op_slot: usize, failed: ChunkSet, units: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.probed = failed;
        op.errored &= !failed;
        op.phase = Phase::Probing;
        op.serial = op.serial.wrapping_add(1);
        let whole = ChunkRange::new(0, u32::try_from(units).expect("fits") * UNIT_BYTES);
        for c in (0..MEMBERS_MAX).filter(|&c| has(failed, c)) {
            self.ops[op_slot].as_mut().expect("live").units[c] = Units::default();
            self.issue_unit_reads(op_slot, c, whole, UnitDest::Scratch { at: 0 });
        }
    }

    /// Parity levels: rebuild the data units that cannot be read where the stripe vouches
    /// for them, and say which chunks to rewrite (setting `units` for each); `None`: the
    /// stripe cannot be vouched for (see `resync_after_reads`).
    fn resync_decide_parity(
        &mut self,
        op_slot: usize,
        bad: &[Units; MEMBERS_MAX],
        units: usize,
        all_units: Units,
    ) -> Option<ChunkSet> {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let unit = usize::try_from(UNIT_BYTES).expect("fits");
        let data: ChunkSet = (0..k).fold(0, |s, i| s | bit(i));
        let mut rebuilt_units = Units::default();
        if (0..k).any(|i| !bad[i].is_empty()) {
            for u in 0..units {
                let erased = (0..k + m).filter(|&c| bad[c].contains(u)).fold(0, |s, c| s | bit(c));
                if erased & data == 0 {
                    continue;
                }
                if erased.count_ones() as usize >= m {
                    return None; // no parity row left to check the rebuilt unit with
                }
                self.reconstruct_range_in_scratch(op_slot, erased, erased & data, u * unit, unit);
                rebuilt_units.insert(u);
            }
        }
        // Parity from the data, now whole (rebuilt units included), in the extra slots.
        self.encode_parity_in_scratch(op_slot);
        let op = self.ops[op_slot].as_mut().expect("live");
        let (head, extra) = op.scratch.split_at(MEMBERS_MAX);
        let stored = |r: usize| head[k + r].as_ref().expect("parity").as_slice();
        let computed = |r: usize| extra[r].as_ref().expect("computed").as_slice();
        for (first, count) in rebuilt_units.runs() {
            for u in first..first + count {
                let range = u * unit..(u + 1) * unit;
                // Rows the rebuild used agree by construction; the others check it.
                let disagrees = (0..m)
                    .filter(|&r| !bad[k + r].contains(u))
                    .any(|r| stored(r)[range.clone()] != computed(r)[range.clone()]);
                if disagrees {
                    return None;
                }
            }
        }
        let mut rewrite: ChunkSet = 0;
        for r in 0..m {
            if !bad[k + r].is_empty() || stored(r) != computed(r) {
                rewrite |= bit(k + r);
                op.units[k + r] = all_units;
            }
        }
        for i in (0..k).filter(|&i| !bad[i].is_empty()) {
            rewrite |= bit(i);
            op.units[i] = bad[i];
        }
        Some(rewrite)
    }

    /// Mirrors: make every copy's units equal to the reference's (see `resync_after_reads`),
    /// in their scratch buffers; says which copies to rewrite (setting `units` for each).
    fn resync_decide_mirror(
        &mut self,
        op_slot: usize,
        bad: &[Units; MEMBERS_MAX],
        units: usize,
    ) -> ChunkSet {
        let n = self.geometry.member_count();
        let unit = usize::try_from(UNIT_BYTES).expect("fits");
        let stripe = self.ops[op_slot].as_ref().expect("live").stripe;
        let mut rewrite: ChunkSet = 0;
        let mut changed = [Units::default(); MEMBERS_MAX];
        for i in 0..self.geometry.data_chunks() {
            let op = self.ops[op_slot].as_ref().expect("live");
            let copies: ChunkSet =
                (0..n).filter(|&o| self.data_position(op, o) == Some(i)).fold(0, |s, o| s | bit(o));
            let Some(reference) = self.reference_copy(stripe, i) else { continue };
            let op = self.ops[op_slot].as_mut().expect("live");
            for u in 0..units {
                let readable = |c: usize| has(copies, c) && !bad[c].contains(u);
                let from = if readable(reference) {
                    Some(reference)
                } else {
                    (0..n).find(|&c| readable(c))
                };
                let Some(from) = from else { continue }; // no copy can read it: left alone
                let range = u * unit..(u + 1) * unit;
                let source = op.scratch[from].take().expect("read");
                for o in (0..n).filter(|&o| has(copies, o) && o != from) {
                    let copy = op.scratch[o].as_mut().expect("read").as_mut_slice();
                    if !readable(o) || copy[range.clone()] != source.as_slice()[range.clone()] {
                        copy[range.clone()].copy_from_slice(&source.as_slice()[range.clone()]);
                        changed[o].insert(u);
                        rewrite |= bit(o);
                    }
                }
                op.scratch[from] = Some(source);
            }
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        for o in (0..n).filter(|&o| has(rewrite, o)) {
            op.units[o] = changed[o];
        }
        rewrite
    }

    /// Writes for a resync: each chunk decided, from its own scratch buffer (a copy's
    /// units made equal to the reference's, a data chunk's rebuilt units), parity rows from
    /// the recomputed parity; only the units decided, so a unit no copy could read is never
    /// written over with what a failed read left.
    pub(super) fn resync_issue(&mut self, op_slot: usize) {
        let k = self.geometry.data_chunks();
        let parity = self.is_parity_level();
        let rewrite = self.ops[op_slot].as_ref().expect("live").repaired;
        let source: [usize; MEMBERS_MAX] =
            std::array::from_fn(|c| if parity && c >= k { MEMBERS_MAX + (c - k) } else { c });
        self.issue_unit_rewrites(op_slot, rewrite, &source, UNIT_BYTES);
    }

    /// Write the units `op.units[c]` (`unit_bytes` each) of each chunk `c` of `rewrite`,
    /// from scratch buffer `source[c]`, one write per run of neighbouring units. A member
    /// that left service since the reads is skipped (the op then waits for its failure to
    /// be durable).
    pub(super) fn issue_unit_rewrites(
        &mut self,
        op_slot: usize,
        rewrite: ChunkSet,
        source: &[usize; MEMBERS_MAX],
        unit_bytes: u32,
    ) {
        let failing = self.failing_mask();
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Writing;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        for c in (0..MEMBERS_MAX).filter(|&c| has(rewrite, c)) {
            let op = self.ops[op_slot].as_ref().expect("live");
            let member = op.chunk_member[c];
            if !self.usable(stripe, member) {
                let op = self.ops[op_slot].as_mut().expect("live");
                op.needs_failed |= failing & (1u64 << member);
                continue;
            }
            let units = op.units[c];
            for (first, count) in units.runs() {
                let at = u32::try_from(first).expect("fits") * unit_bytes;
                let op = self.ops[op_slot].as_ref().expect("live");
                let kind = MemberIoKind::Write {
                    offset_bytes: self.member_offset(stripe, at),
                    ptr: Self::scratch_ptr(op, source[c], at as usize).cast_const(),
                    len_bytes: u32::try_from(count).expect("fits") * unit_bytes,
                    durability: Durability::Cached,
                };
                self.issue(op_slot, c, first, kind);
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// The chunk indexes of the level (mirrors: every member) whose member is not in service
    /// for `op`'s stripe: never read, never written.
    pub(super) fn absent_chunks_all(&self, op: &super::Op) -> ChunkSet {
        let chunks = if self.is_parity_level() {
            self.geometry.data_chunks() + self.geometry.parity_chunks()
        } else {
            self.geometry.member_count()
        };
        (0..chunks)
            .filter(|&c| !self.usable(op.stripe, op.chunk_member[c]))
            .fold(0, |s, c| s | bit(c))
    }
}
