//! Writes: mirrors and raid0 write the data where it lives; parity levels plan the stripe
//! (full-stripe, read-modify-write, reconstruct-write or degraded, see `plan.rs`), read what
//! the plan needs, compute parity, wait for the write-intent bitmap, then write data and
//! parity together.

use super::{Op, Phase, REPLANS_MAX, Shard, UnitDest, usize_of};
use crate::io::MemberIoKind;
use crate::plan::{ChunkRange, ChunkSet, Units, WriteKind, bit, has, plan_write};
use crate::request::RequestError;
use flashraid_layout::{Level, MEMBERS_MAX, PARITY_CHUNKS_MAX};
use flashraid_parity::Stores;

impl Shard {
    pub(super) fn begin_write(&mut self, op_slot: usize) -> bool {
        match self.geometry.level() {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => {
                self.plain_write(op_slot);
                true
            }
            _ => self.parity_write_plan(op_slot),
        }
    }

    // ------------------------------------------------------------------------------------
    // raid0, raid1, raid10: no reads, write every available copy.

    fn plain_write(&mut self, op_slot: usize) {
        let redundant = self.geometry.tolerance() > 0;
        if redundant && !self.bitmap_ready(op_slot) {
            return;
        }
        self.plain_write_issue(op_slot);
    }

    fn plain_write_issue(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Writing;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        let durability = op.durability;
        let failing = self.failing_mask();
        for part_index in 0..super::OP_REQUESTS_MAX {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let crate::request::ShardOp::Write { offset, len_bytes, .. } =
                self.requests[part.request].as_ref().expect("live").op
            else {
                unreachable!("write operations hold writes only")
            };
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                let mut written = false;
                for copy in 0..self.geometry.copies() {
                    let member = self.geometry.data_member(stripe, i, copy);
                    let chunk = if self.is_mirror() { member.get() } else { i };
                    if !self.usable(stripe, member.0) {
                        let op = self.ops[op_slot].as_mut().expect("live");
                        op.needs_failed |= failing & (1u64 << member.0);
                        continue;
                    }
                    let kind = MemberIoKind::Write {
                        offset_bytes: self.member_offset(stripe, s.location.offset_in_chunk_bytes),
                        ptr: self.request_ptr(part.request, s.range_offset_bytes).cast_const(),
                        len_bytes: s.len_bytes,
                        durability,
                    };
                    self.issue(op_slot, chunk, part_index, kind);
                    written = true;
                }
                if !written {
                    self.ops[op_slot].as_mut().expect("live").result =
                        Err(RequestError::ArrayFailed);
                }
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    // ------------------------------------------------------------------------------------
    // Parity levels.

    fn touched(op: &Op, k: usize) -> [Option<ChunkRange>; MEMBERS_MAX] {
        let mut touched = [None; MEMBERS_MAX];
        for (i, t) in op.touched.iter().take(k).enumerate() {
            touched[i] = t.map(|t| t.range);
        }
        touched
    }

    /// Plan, take scratch and issue the plan's reads. False when starved of buffers.
    fn parity_write_plan(&mut self, op_slot: usize) -> bool {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let op = self.ops[op_slot].as_ref().expect("live");
        let touched = Self::touched(op, k);
        let unavailable = self.unreadable_chunks(op);
        let gone = self.gone_chunks(op);
        let recompute = self.stripe_needs_resync(op.stripe);
        let plan = match plan_write(&touched[..k], m, unavailable, gone, recompute) {
            Ok(plan) if plan.kind == WriteKind::DataOnly && self.array_failed() => {
                // Every parity row out because the array failed past its tolerance (a write
                // queued before and planned after): nothing is written, as before data-only
                // plans, so the member whose failure failed the array missed no write (a
                // forced start may bring it back).
                self.fail_write(op_slot, RequestError::ArrayFailed);
                return true;
            }
            Ok(plan) if self.stripe_untrusted(op.stripe) && plan.kind == WriteKind::Degraded => {
                // Old data would come from parity not trusted since an unclean shutdown.
                self.fail_write(op_slot, RequestError::Unreadable);
                return true;
            }
            Ok(plan) => plan,
            Err(_) => {
                // Too many chunks unavailable to keep parity right. If members are gone that is
                // the array failing; if some only returned read errors, the data is unreadable.
                let error = if self.array_failed() {
                    RequestError::ArrayFailed
                } else {
                    RequestError::Unreadable
                };
                self.fail_write(op_slot, error);
                return true;
            }
        };
        // Scratch: every chunk read or rebuilt, and every parity row (computed even when its
        // member is gone, because the parity code updates all rows together).
        let parity_set: ChunkSet = (k..k + m).fold(0, |s, c| s | bit(c));
        let computed = if plan.kind == WriteKind::DataOnly { 0 } else { parity_set };
        let wanted = plan.reads | plan.reconstruct | computed;
        let len = plan.range.len();
        let mut needs = [(0usize, 0u32); MEMBERS_MAX + PARITY_CHUNKS_MAX];
        let mut count = 0;
        for c in (0..k + m).filter(|&c| has(wanted, c)) {
            needs[count] = (c, len);
            count += 1;
        }
        if !self.take_scratch(op_slot, &needs[..count]) {
            return false;
        }
        match plan.kind {
            WriteKind::FullStripe => self.counters.full_stripe_writes += 1,
            WriteKind::ReadModifyWrite => self.counters.rmw_writes += 1,
            WriteKind::ReconstructWrite => self.counters.rcw_writes += 1,
            WriteKind::Degraded | WriteKind::DataOnly => self.counters.degraded_writes += 1,
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.plan = Some(plan);
        op.phase = Phase::Reading;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        for c in (0..k + m).filter(|&c| has(plan.reads, c)) {
            let op = self.ops[op_slot].as_ref().expect("live");
            // RMW reads old data over its touched range only, placed at its position in the
            // stripe range; everything else reads the whole stripe range.
            let read_range = match (plan.kind, op.touched.get(c).copied().flatten()) {
                (WriteKind::ReadModifyWrite, Some(t)) if c < k => t.range,
                _ => plan.range,
            };
            let at = plan.range.relative(read_range).start;
            let kind = MemberIoKind::Read {
                offset_bytes: self.member_offset(stripe, read_range.lo),
                ptr: Self::scratch_ptr(op, c, at),
                len_bytes: read_range.len(),
            };
            self.issue(op_slot, c, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
        true
    }

    fn fail_write(&mut self, op_slot: usize, error: RequestError) {
        self.ops[op_slot].as_mut().expect("live").result = Err(error);
        self.finish_op(op_slot);
    }

    /// Called when a starved re-plan may retry.
    pub(super) fn write_replan(&mut self, op_slot: usize) {
        if !self.parity_write_plan(op_slot) {
            self.park_starved(op_slot);
        }
    }

    /// The plan's reads completed: re-plan around failed reads, or compute parity.
    ///
    /// A read that failed is first read again in 4 KiB units into its scratch
    /// (`write_probe`): if every unit reads, the write goes on as planned; else the write is
    /// planned again with that chunk unavailable, and of an untouched data chunk rebuilt so,
    /// only the units that failed are written back (found by review: the whole range was,
    /// so a wrong parity row elsewhere in it overwrote readable, correct blocks).
    pub(super) fn write_after_reads(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let plan = op.plan.expect("planned");
        // Every failed read, in every plan (found by review: only the first plan's were,
        // so a transient error in a re-plan's read failed the write or rewrote a whole
        // range).
        if op.phase == Phase::Reading && op.errored & plan.reads != 0 && self.write_probe(op_slot) {
            return;
        }
        if self.ops[op_slot].as_ref().expect("live").phase == Phase::Probing {
            // A chunk with a unit that failed again (or whose member left service
            // meanwhile) is unavailable for the write's plan.
            self.settle_probes(op_slot);
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        if op.errored & plan.reads != 0 {
            op.replans += 1;
            if op.replans > REPLANS_MAX {
                self.fail_write(op_slot, RequestError::ArrayFailed);
                return;
            }
            self.release_scratch(op_slot);
            self.write_replan(op_slot);
            return;
        }
        if plan.kind == WriteKind::Degraded {
            self.write_reconstruct_old(op_slot);
        }
        self.write_compute_parity(op_slot);
        if self.bitmap_ready(op_slot) {
            self.write_issue(op_slot);
        }
    }

    /// Read every failed read of the plan again, unit by unit, into the same place in its
    /// scratch (the completion tokens carry the unit). False if no chunk that failed is
    /// still in service.
    fn write_probe(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_ref().expect("live");
        let plan = op.plan.expect("planned");
        let stripe = op.stripe;
        let failed = (0..MEMBERS_MAX)
            .filter(|&c| has(op.errored & plan.reads, c) && Self::probe_again(op, c))
            .filter(|&c| self.usable(stripe, op.chunk_member[c]))
            .fold(0, |set, c| set | bit(c));
        if failed == 0 {
            return false;
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.probed |= failed;
        op.errored &= !failed;
        op.phase = Phase::Probing;
        op.serial = op.serial.wrapping_add(1);
        for c in (0..MEMBERS_MAX).filter(|&c| has(failed, c)) {
            op.units[c] = Units::default();
        }
        for c in (0..MEMBERS_MAX).filter(|&c| has(failed, c)) {
            let op = self.ops[op_slot].as_ref().expect("live");
            // As the plan read it (`parity_write_plan`).
            let read_range = match (plan.kind, op.touched.get(c).copied().flatten()) {
                (WriteKind::ReadModifyWrite, Some(t)) if c < self.geometry.data_chunks() => t.range,
                _ => plan.range,
            };
            let at = usize_of(read_range.lo - plan.range.lo);
            self.issue_unit_reads(op_slot, c, read_range, UnitDest::Scratch { at });
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
        true
    }

    /// Degraded write: rebuild the old contents of unavailable data chunks over the range.
    fn write_reconstruct_old(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let plan = op.plan.expect("planned");
        // Erased = what the plan did not read, fixed when it was made: a member failing since
        // (its reads already succeeded) must not grow the pattern past the parity count.
        let chunks = self.geometry.data_chunks() + self.geometry.parity_chunks();
        let all_chunks: ChunkSet = if chunks == 64 { u64::MAX } else { (1u64 << chunks) - 1 };
        let erased = all_chunks & !plan.reads;
        let targets = plan.reconstruct;
        let len = usize::try_from(plan.range.len()).expect("fits");
        let codec = self.codec.expect("parity level");
        self.plan_for(erased, targets);
        let Shard { ops, plans, .. } = &mut *self;
        let rebuild = plans.get(&(erased, targets)).expect("just planned");
        let op = ops[op_slot].as_mut().expect("live");
        let (sources, mut outs) =
            super::read::split_scratch(op, rebuild.sources(), rebuild.targets(), len);
        let count = rebuild.targets().len();
        codec
            .reconstruct_from(
                rebuild,
                &sources[..rebuild.sources().len()],
                &mut outs[..count],
                Stores::Cached,
            )
            .expect("plan, counts and lengths are consistent");
        op.rebuild_erased = erased;
        op.rebuild_targets = targets;
        op.rebuild_range = Some(plan.range);
    }

    /// Compute the new parity over the plan's range into the parity scratch buffers.
    fn write_compute_parity(&mut self, op_slot: usize) {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let codec = self.codec.expect("parity level");
        let Shard { ops, requests, .. } = &mut *self;
        let op = ops[op_slot].as_mut().expect("live");
        assert_eq!(op.pending, 0, "buffers touched with IO in flight");
        let plan = op.plan.expect("planned");
        if plan.kind == WriteKind::DataOnly {
            return; // no parity row to write, none computed (no scratch was taken for one)
        }
        let range = plan.range;
        let len = usize::try_from(range.len()).expect("fits");
        let (data_scratch, parity_scratch) = op.scratch.split_at_mut(k);
        let mut parity: [&mut [u8]; PARITY_CHUNKS_MAX] = [&mut [], &mut [], &mut []];
        for (r, slot) in parity_scratch.iter_mut().take(m).enumerate() {
            parity[r] = &mut slot.as_mut().expect("parity scratch").as_mut_slice()[..len];
        }
        // The new data of a touched chunk, from its request's buffer.
        let touches = op.touched;
        let new_data = |i: usize| -> Option<(ChunkRange, &[u8])> {
            let t = touches[i]?;
            let buf =
                requests[t.request].as_ref().expect("live").buf.as_ref().expect("write buffer");
            let len = usize::try_from(t.range.len()).expect("fits");
            Some((t.range, &buf.as_slice()[t.buf_offset..t.buf_offset + len]))
        };
        if plan.kind == WriteKind::ReadModifyWrite {
            for i in 0..k {
                let Some((touched, new)) = new_data(i) else { continue };
                let rel = range.relative(touched);
                let old = &data_scratch[i].as_ref().expect("old data").as_slice()[rel.clone()];
                let mut rows: [&mut [u8]; PARITY_CHUNKS_MAX] = [&mut [], &mut [], &mut []];
                for (r, p) in parity.iter_mut().take(m).enumerate() {
                    rows[r] = &mut p[rel.clone()];
                }
                codec.update(i, old, new, &mut rows[..m]).expect("consistent shapes");
            }
            return;
        }
        // Full, reconstruct-write and degraded: assemble every data chunk over the range,
        // overlaying new data on old where a chunk is only partly written, then encode.
        for i in 0..k {
            if let (Some((touched, new)), Some(old)) = (new_data(i), data_scratch[i].as_mut()) {
                let rel = range.relative(touched);
                old.as_mut_slice()[rel].copy_from_slice(new);
            }
        }
        let mut sources: [&[u8]; MEMBERS_MAX] = [&[]; MEMBERS_MAX];
        for i in 0..k {
            sources[i] = match (&data_scratch[i], new_data(i)) {
                (Some(old), _) => &old.as_slice()[..len],
                (None, Some((touched, new))) => {
                    assert_eq!(touched, range, "a chunk without scratch is fully overwritten");
                    new
                }
                (None, None) => unreachable!("every data chunk is read, rebuilt or written"),
            };
        }
        codec.encode(&sources[..k], &mut parity[..m], Stores::Cached).expect("consistent shapes");
    }

    /// Bitmap is durable: write the new data, any repaired chunks and the parity.
    pub(super) fn write_issue(&mut self, op_slot: usize) {
        if !self.is_parity_level() {
            self.plain_write_issue(op_slot);
            return;
        }
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let failing = self.failing_mask();
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Writing;
        op.serial = op.serial.wrapping_add(1);
        let plan = op.plan.expect("planned");
        let stripe = op.stripe;
        let durability = op.durability;
        for c in 0..k + m {
            let op = self.ops[op_slot].as_ref().expect("live");
            let member = op.chunk_member[c];
            let touched = if c < k { op.touched[c] } else { None };
            // Data rebuilt because its member failed a read: rewrite it (repair).
            let repair = c < k && touched.is_none() && has(op.rebuild_targets & op.errored, c);
            let is_parity = c >= k;
            if touched.is_none() && !repair && !is_parity {
                continue;
            }
            if !self.usable(stripe, member) {
                let op = self.ops[op_slot].as_mut().expect("live");
                op.needs_failed |= failing & (1u64 << member);
                continue;
            }
            if repair && has(op.probed, c) {
                // Only the units that failed again: the others read, and keep their bytes.
                let units = op.units[c];
                for piece in units.pieces(plan.range) {
                    let op = self.ops[op_slot].as_ref().expect("live");
                    let in_scratch = usize::try_from(piece.lo - plan.range.lo).expect("fits");
                    let kind = MemberIoKind::Write {
                        offset_bytes: self.member_offset(stripe, piece.lo),
                        ptr: Self::scratch_ptr(op, c, in_scratch).cast_const(),
                        len_bytes: piece.len(),
                        durability,
                    };
                    self.issue(op_slot, c, 0, kind);
                }
                continue;
            }
            // RMW derives parity from the old parity it read: a row it did not read must not
            // be written (the planner rules this out; this is the check).
            let rmw = plan.kind == WriteKind::ReadModifyWrite;
            assert!(!(rmw && is_parity && !has(plan.reads, c)), "RMW writing parity it never read");
            let (range, ptr) = match touched {
                Some(t) => {
                    let at = u64::try_from(t.buf_offset).expect("fits");
                    (t.range, self.request_ptr(t.request, at).cast_const())
                }
                None => (plan.range, Self::scratch_ptr(op, c, 0).cast_const()),
            };
            let kind = MemberIoKind::Write {
                offset_bytes: self.member_offset(stripe, range.lo),
                ptr,
                len_bytes: range.len(),
                durability,
            };
            self.issue(op_slot, c, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// Chunk indices whose members are out of service (not written).
    fn gone_chunks(&self, op: &Op) -> ChunkSet {
        let n = self.geometry.data_chunks() + self.geometry.parity_chunks();
        (0..n).filter(|&c| !self.usable(op.stripe, op.chunk_member[c])).fold(0, |s, c| s | bit(c))
    }

    pub(super) fn is_parity_level(&self) -> bool {
        self.geometry.parity_chunks() > 0
    }
}
