//! Everything that is not a read or a write of data: flushes, zeroing whole stripes, the
//! write-intent bitmap's IO, time, background resync after an unclean shutdown, and the
//! clean shutdown sequence.

use super::{FailReason, Health, ORIGIN_BITMAP, ORIGIN_FLUSH, ORIGIN_INTERNAL_FLUSH, OpKind};
use super::{Phase, Shard, ShardEvent, ShutdownState, StripeEntry};
use crate::io::{Durability, IoError, MemberIo, MemberIoKind};
use crate::plan::{ChunkSet, bit, has};
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
        let now = self.now_us;
        let request = self.requests[slot].as_mut().expect("live");
        request.pending = u32::try_from(members.len()).expect("fits");
        request.issued_us = now;
        self.bitmap.flush_issued(now);
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
        if !request.member_errors {
            // Every write released before the flush was issued is durable on every member
            // still in service: their bitmap regions may be cleared.
            let issued = request.issued_us;
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
        let now = self.now_us;
        let members: Vec<u16> = (0..self.geometry.member_count())
            .map(|m| u16::try_from(m).expect("fits"))
            .filter(|&m| self.available(m))
            .collect();
        if members.is_empty() {
            return;
        }
        self.bitmap.flush_issued(now);
        self.internal_flush_issued_us = now;
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
            if !std::mem::take(&mut self.internal_flush_errors) {
                self.bitmap.flush_completed(self.internal_flush_issued_us);
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
                    let clean = self.bitmap.is_clear() && self.failing_mask() == 0;
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

    /// Zero with FUA: discard and write-zeroes carry no FUA, so flush every member written.
    /// True when IO was issued.
    pub(super) fn zero_flush_for_fua(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.durability != Durability::Fua || op.fua_flushed {
            return false;
        }
        op.fua_flushed = true;
        op.serial = op.serial.wrapping_add(1);
        let errored = op.errored;
        for member in 0..self.geometry.member_count() {
            let m = u16::try_from(member).expect("fits");
            if self.available(m) && !has(errored, member) {
                self.issue(op_slot, member, 0, MemberIoKind::Flush);
            }
        }
        self.ops[op_slot].as_ref().expect("live").pending > 0
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
    /// A chunk that failed to read (a bad sector) is rewritten too, which heals it: an
    /// unreadable parity row or mirror copy from what the data says; an unreadable data chunk
    /// only where the stripe proves consistent without it: rebuilt from as many parity rows
    /// as chunks are unreadable, and checked against at least one row more (RAID 6 with one
    /// unreadable chunk, 7.3 with two). A stripe that cannot be checked so (RAID 5, or every
    /// row needed to rebuild), or that disagrees with itself (a write was in flight at the
    /// crash), stops resync there: its unreadable data is not known.
    pub(super) fn resync_after_reads(&mut self, op_slot: usize) {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let n = self.geometry.member_count();
        let len = usize::try_from(self.geometry.chunk_bytes()).expect("fits");
        let op = self.ops[op_slot].as_ref().expect("live");
        let unreadable = self.unreadable_chunks_all(op);
        let mut rewrite: ChunkSet = 0;
        if self.is_parity_level() {
            let data_unreadable = (0..k).filter(|&i| has(unreadable, i)).fold(0, |s, i| s | bit(i));
            let checkable = (unreadable.count_ones() as usize) < m;
            let consistent = data_unreadable == 0
                || (checkable && {
                    self.reconstruct_in_scratch(op_slot, unreadable, unreadable, len);
                    !self.parity_rows_disagree(op_slot, unreadable)
                });
            if consistent {
                // (Rebuilt chunks are in their own scratch slots, parity from the data in
                // the extra ones; `parity_rows_disagree` already encoded it.)
                if data_unreadable == 0 {
                    self.encode_parity_in_scratch(op_slot);
                }
                let op = self.ops[op_slot].as_ref().expect("live");
                let (head, extra) = op.scratch.split_at(MEMBERS_MAX);
                for r in 0..m {
                    let stored = head[k + r].as_ref().expect("parity").as_slice();
                    let computed = extra[r].as_ref().expect("computed").as_slice();
                    if has(unreadable, k + r) || stored != computed {
                        rewrite |= bit(k + r);
                    }
                }
                rewrite |= data_unreadable;
            } else {
                // Parity cannot be checked without the data: stop resync here and keep this
                // stripe and everything after it untrusted.
                let stripe = self.ops[op_slot].as_ref().expect("live").stripe;
                let index = self.resync_regions.binary_search(&self.region_of(stripe)).unwrap_or(0);
                if self.resync_blocked.is_none_or(|(i, s)| (index, stripe.0) < (i, s)) {
                    self.resync_blocked = Some((index, stripe.0));
                }
            }
        } else {
            // Mirrors: the first readable copy of each data position is the reference; every
            // other copy that differs from it or could not be read takes its contents.
            let op = self.ops[op_slot].as_ref().expect("live");
            for c in 0..n {
                let Some(i) = self.data_position(op, c) else { continue };
                let reference =
                    (0..n).find(|&o| self.data_position(op, o) == Some(i) && !has(unreadable, o));
                if let Some(reference) = reference {
                    let differs = op.scratch[c].as_ref().map(|b| b.as_slice())
                        != op.scratch[reference].as_ref().map(|b| b.as_slice());
                    if c != reference && (has(unreadable, c) || differs) {
                        rewrite |= bit(c);
                    }
                }
            }
        }
        let healed = u64::from((rewrite & unreadable).count_ones());
        self.counters.errors_corrected += healed;
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

    /// Writes for a resync: recomputed parity, a data chunk rebuilt in its own scratch slot,
    /// or the reference mirror copy.
    pub(super) fn resync_issue(&mut self, op_slot: usize) {
        let k = self.geometry.data_chunks();
        let n = self.geometry.member_count();
        let parity = self.is_parity_level();
        let op = self.ops[op_slot].as_ref().expect("live");
        let rewrite = op.repaired;
        // Mirrors: each rewritten copy from its reference copy: a copy neither rewritten nor
        // unreadable (found in review: with three or more copies, the first copy not
        // rewritten could be one that failed to read, and its buffer was written over the
        // others).
        let mut source = [0usize; MEMBERS_MAX];
        for c in (0..MEMBERS_MAX).filter(|&c| has(rewrite, c)) {
            source[c] = if !parity {
                let i = self.data_position(op, c).expect("mirror data");
                (0..n)
                    .find(|&o| {
                        self.data_position(op, o) == Some(i)
                            && !has(rewrite, o)
                            && !has(op.errored, o)
                    })
                    .expect("reference copy")
            } else if c < k {
                c
            } else {
                MEMBERS_MAX + (c - k)
            };
        }
        self.issue_chunk_rewrites(op_slot, rewrite, &source);
    }

    /// Write whole chunks `rewrite` of an operation's stripe, chunk `c` from scratch buffer
    /// `source[c]`. A member that left service since the reads is skipped (the op then waits
    /// for its failure to be durable).
    pub(super) fn issue_chunk_rewrites(
        &mut self,
        op_slot: usize,
        rewrite: ChunkSet,
        source: &[usize; MEMBERS_MAX],
    ) {
        let chunk = self.geometry.chunk_bytes();
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
            let op = self.ops[op_slot].as_ref().expect("live");
            let kind = MemberIoKind::Write {
                offset_bytes: self.member_offset(stripe, 0),
                ptr: Self::scratch_ptr(op, source[c], 0).cast_const(),
                len_bytes: chunk,
                durability: Durability::Cached,
            };
            self.issue(op_slot, c, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// Like `unreadable_chunks`, over every chunk index of the level (mirrors: every member).
    pub(super) fn unreadable_chunks_all(&self, op: &super::Op) -> ChunkSet {
        op.errored | self.absent_chunks_all(op)
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
