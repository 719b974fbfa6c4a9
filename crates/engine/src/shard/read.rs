//! Reads: straight from the member holding the data; when it is unavailable or fails, from
//! redundancy (another mirror copy, or reconstruction from the stripe's other chunks), after
//! which the bad range is rewritten from the recovered data.
//!
//! A member read that fails is first read again in 4 KiB units (`UNIT_BYTES`), each into the
//! request's own buffer (`read_probe`). Only the units that fail again are recovered from
//! redundancy, returned recovered and rewritten: the units that read are returned as read and
//! never written. (Recovering the whole range instead would return, and write back, a
//! reconstruction of readable blocks, which differs from them when another chunk of the stripe
//! is silently wrong; found in review, and it was a documented limit before.) A chunk whose
//! member is out of service has no units to read: all of it is recovered, unwritten.
//!
//! Reconstruction covers only the bytes the operation's reads want (the union of their
//! segments of the missing chunks). Its sources come from the requests' own buffers where a
//! read already holds them, else from scratch; a missing chunk one request wants over the
//! whole rebuilt range is rebuilt straight into that request's buffer, else in scratch and
//! copied to every request wanting it. The decode's slices of requests' buffers are cut as
//! disjoint pieces (`Ascending`), so a source and a target in one buffer never alias; like
//! every buffer access here, only with no member IO in flight (asserted).

use super::{Op, Phase, REPLANS_MAX, Shard, UnitDest, usize_of};
use crate::io::{Durability, MemberIoKind};
use crate::plan::{ChunkRange, ChunkSet, Units, bit, has};
use crate::request::{RequestError, ShardOp};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, Level, MEMBERS_MAX, PARITY_CHUNKS_MAX, Role, StripeIndex};
use flashraid_parity::Stores;

impl Shard {
    pub(super) fn is_mirror(&self) -> bool {
        matches!(self.geometry.level(), Level::Raid1 | Level::Raid10)
    }

    /// The data position a chunk index stands for, if it holds data.
    pub(super) fn data_position(&self, op: &Op, chunk: usize) -> Option<usize> {
        if self.is_mirror() {
            let member = flashraid_layout::MemberIndex(u16::try_from(chunk).expect("fits"));
            match self.geometry.role(op.stripe, member) {
                Role::Data { index, .. } => Some(index),
                Role::Parity { .. } => None,
            }
        } else {
            (chunk < self.geometry.data_chunks()).then_some(chunk)
        }
    }

    pub(super) fn begin_read(&mut self, op_slot: usize) -> bool {
        let mirror = self.is_mirror();
        // Copies of a stripe an unclean shutdown left dirty may differ until resync makes
        // them equal to the reference copy: read that one, so a later resync never changes
        // what was read.
        let reference_only = mirror && {
            let stripe = self.ops[op_slot].as_ref().expect("live").stripe;
            self.stripe_needs_resync(stripe)
        };
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Reading;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        for part_index in 0..op.parts.len() {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                let chunk = match (mirror, reference_only) {
                    (true, true) => self.reference_copy(stripe, i),
                    (true, false) => self.pick_copy(stripe, i, 0),
                    (false, _) => Some(i),
                };
                let readable = chunk.filter(|&c| {
                    let op = self.ops[op_slot].as_ref().expect("live");
                    self.usable(stripe, op.chunk_member[c])
                });
                let Some(c) = readable else {
                    let op = self.ops[op_slot].as_mut().expect("live");
                    op.parts[part_index].as_mut().expect("part").rebuild |= bit(i);
                    continue;
                };
                let kind = MemberIoKind::Read {
                    offset_bytes: self.member_offset(stripe, s.location.offset_in_chunk_bytes),
                    ptr: self.request_ptr(part.request, s.range_offset_bytes),
                    len_bytes: s.len_bytes,
                };
                self.issue(op_slot, c, part_index, kind);
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
        true
    }

    /// For mirrors: the chunk index (= member) of a usable copy of data position `i`, avoiding
    /// members in `avoid`, starting at a copy that rotates by stripe to spread reads.
    pub(super) fn pick_copy(
        &self,
        stripe: StripeIndex,
        i: usize,
        avoid: ChunkSet,
    ) -> Option<usize> {
        let copies = self.geometry.copies();
        let start = usize::try_from(stripe.0 % copies as u64).expect("fits");
        (0..copies).map(|c| (start + c) % copies).find_map(|copy| {
            let member = self.geometry.data_member(stripe, i, copy).get();
            let member16 = u16::try_from(member).expect("fits");
            let usable = self.usable(stripe, member16) && !has(avoid, member);
            usable.then_some(member)
        })
    }

    /// The range a read request covers (read operations hold reads only).
    fn read_range(&self, request: usize) -> (ArrayOffset, u32) {
        match self.requests[request].as_ref().expect("live").op {
            ShardOp::Read { offset, len_bytes } => (offset, len_bytes),
            _ => unreachable!("read operations hold reads only"),
        }
    }

    /// For mirrors: the copy resync treats as the truth for data position `i`, the lowest
    /// available member holding it (see `resync_after_reads`).
    pub(super) fn reference_copy(&self, stripe: StripeIndex, i: usize) -> Option<usize> {
        (0..self.geometry.copies())
            .map(|copy| self.geometry.data_member(stripe, i, copy).get())
            .filter(|&member| self.usable(stripe, u16::try_from(member).expect("fits")))
            .min()
    }

    /// A read IO failed (the error is already counted and `errored` updated).
    pub(super) fn read_io_failed(&mut self, op_slot: usize, part: usize, chunk: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        if op.phase != Phase::Reading {
            // Rebuild sources and mirror re-reads: handled when the round completes.
            return;
        }
        if let Some(i) = self.data_position(op, chunk) {
            let op = self.ops[op_slot].as_mut().expect("live");
            op.parts[part].as_mut().expect("part").rebuild |= bit(i);
        }
    }

    /// A mirror re-read of a whole segment succeeded (re-reads in units are settled when
    /// their round completes: `read_after_unit_rereads`).
    pub(super) fn read_io_recovered(&mut self, op_slot: usize, part: usize, chunk: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        if !self.is_mirror() || self.is_unit_reread(op, chunk) {
            return;
        }
        let i = self.data_position(op, chunk).expect("mirror chunks hold data");
        let op = self.ops[op_slot].as_mut().expect("live");
        let p = op.parts[part].as_mut().expect("part");
        p.rebuild &= !bit(i);
        p.recovered |= bit(i);
    }

    /// Whether a mirror re-read of `chunk` in this op goes unit by unit (its completion
    /// tokens carry the unit, a failed unit goes into `op.units[chunk]`): once a copy of its
    /// data position was read again in units, every other copy tried is read so too.
    pub(super) fn is_unit_reread(&self, op: &Op, chunk: usize) -> bool {
        op.phase == Phase::Rebuilding && self.is_mirror() && has(op.probed, chunk)
    }

    /// Mirrors, a round of re-reads in units done: a part has a data position once every
    /// unit it wants that failed on the copies tried so far came from one of them.
    fn read_after_unit_rereads(&mut self, op_slot: usize) {
        for part_index in 0..super::OP_REQUESTS_MAX {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let (offset, len_bytes) = self.read_range(part.request);
            let mut done: ChunkSet = 0;
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                let op = self.ops[op_slot].as_ref().expect("live");
                if !has(part.rebuild & !part.lost, i) || !self.position_probed(op, i) {
                    continue;
                }
                let lo = s.location.offset_in_chunk_bytes;
                if !self.units_to_recover(op, i).touches(ChunkRange::new(lo, lo + s.len_bytes)) {
                    done |= bit(i);
                }
            }
            let p =
                self.ops[op_slot].as_mut().expect("live").parts[part_index].as_mut().expect("part");
            p.rebuild &= !done;
            p.recovered |= done;
        }
    }

    /// The chunk indices holding data position `i` of `stripe`: its copies' members on
    /// mirrors, else `i` itself.
    fn chunks_of(&self, stripe: StripeIndex, i: usize) -> ChunkSet {
        if !self.is_mirror() {
            return bit(i);
        }
        (0..self.geometry.copies())
            .map(|copy| self.geometry.data_member(stripe, i, copy).get())
            .fold(0, |set, member| set | bit(member))
    }

    /// Whether a chunk holding data position `i` was read again in units (`read_probe`).
    fn position_probed(&self, op: &Op, i: usize) -> bool {
        self.chunks_of(op.stripe, i) & op.probed != 0
    }

    /// The units of data position `i` to recover: those that failed on every chunk holding
    /// it that was read again in units (one on parity levels; on mirrors, every copy read
    /// so far), or every unit where none was (out of service).
    fn units_to_recover(&self, op: &Op, i: usize) -> Units {
        let probed = self.chunks_of(op.stripe, i) & op.probed;
        (0..MEMBERS_MAX)
            .filter(|&c| has(probed, c))
            .fold(Units::first(self.units_per_chunk()), |left, c| left.intersection(&op.units[c]))
    }

    /// After a first read round with errors: read every failed segment again, 4 KiB unit by
    /// unit, into the requests' buffers (the completion tokens carry the unit as their part;
    /// a unit that fails again goes into `op.units`, and is not counted as a second error).
    /// False if no chunk that failed is still in service (nothing to read again).
    ///
    /// In any round (found by review: only the first round's failures were, so a mirror copy
    /// tried after the first had left service, or a reconstruction source, failing once
    /// failed or rewrote whole ranges): the first round's reads, a mirror copy read whole in
    /// a later round (into the requests' buffers too), and a parity source of a rebuild
    /// round (into its scratch, over the rebuilt range). The op comes back in
    /// `Phase::Probing` and returns to the phase it left (`probe_from`).
    fn read_probe(&mut self, op_slot: usize) -> bool {
        let op = self.ops[op_slot].as_ref().expect("live");
        let stripe = op.stripe;
        let failed = (0..MEMBERS_MAX)
            .filter(|&c| has(op.errored, c) && Self::probe_again(op, c))
            .filter(|&c| self.usable(stripe, op.chunk_member[c]))
            .fold(0, |set, c| set | bit(c));
        if failed == 0 {
            return false;
        }
        let mirror = self.is_mirror();
        let op = self.ops[op_slot].as_mut().expect("live");
        let sources_range = if op.phase == Phase::Rebuilding && !mirror {
            Some(op.rebuild_range.expect("a rebuild round has its range"))
        } else {
            None
        };
        op.probe_from = op.phase;
        op.probed |= failed;
        op.errored &= !failed;
        op.phase = Phase::Probing;
        op.serial = op.serial.wrapping_add(1);
        for c in (0..MEMBERS_MAX).filter(|&c| has(failed, c)) {
            op.units[c] = Units::default();
        }
        for part_index in 0..op.parts.len() {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                // The chunk this round read for position `i`, if it failed (one per round).
                let read = self.chunks_of(stripe, i) & failed;
                if read == 0 || !has(part.rebuild, i) {
                    continue;
                }
                // Requests are 4 KiB aligned (the router refuses others): whole units.
                let lo = s.location.offset_in_chunk_bytes;
                let dest = UnitDest::Request { slot: part.request, at: s.range_offset_bytes };
                let c = read.trailing_zeros() as usize;
                self.issue_unit_reads(op_slot, c, ChunkRange::new(lo, lo + s.len_bytes), dest);
            }
        }
        if let Some(range) = sources_range {
            // Sources read into scratch this round (targets are not read; a source taken
            // from a request's buffer was not read either).
            for c in (0..MEMBERS_MAX).filter(|&c| has(failed, c)) {
                let op = self.ops[op_slot].as_ref().expect("live");
                assert!(op.touched[c].is_none(), "a failed source was read into scratch");
                self.issue_unit_reads(op_slot, c, range, UnitDest::Scratch { at: 0 });
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
        true
    }

    /// Whether chunk `c`, whose read failed, is read again in units: not yet, or only with
    /// every unit read then (a transient error earlier; found by review: a chunk read in
    /// full by an earlier probe that failed once more in a later round was erased whole).
    pub(super) fn probe_again(op: &Op, c: usize) -> bool {
        !has(op.probed, c) || op.units[c].is_empty()
    }

    /// The units are read again: a chunk with units that failed (or whose member left
    /// service meanwhile: all of it) is erased for the rebuild; a part whose segment of it
    /// read in full has its data and wants nothing more. The op returns to the phase it was
    /// probed from.
    fn read_after_probe(&mut self, op_slot: usize) {
        self.settle_probes(op_slot);
        for part_index in 0..super::OP_REQUESTS_MAX {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let (offset, len_bytes) = self.read_range(part.request);
            let mut read_in_full: ChunkSet = 0;
            // Mirrors: positions now whole with a copy that failed some of it: recovered
            // from the others, so that copy is repaired (found by review: a probe in a
            // later round settled a position another copy gave, and its failed copy was
            // never rewritten).
            let mut recovered: ChunkSet = 0;
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                let op = self.ops[op_slot].as_ref().expect("live");
                let lo = s.location.offset_in_chunk_bytes;
                let segment = ChunkRange::new(lo, lo + s.len_bytes);
                if has(part.rebuild, i)
                    && self.position_probed(op, i)
                    && !self.units_to_recover(op, i).touches(segment)
                {
                    read_in_full |= bit(i);
                    if self.is_mirror() && self.chunks_of(op.stripe, i) & op.errored != 0 {
                        recovered |= bit(i);
                    }
                }
            }
            let op = self.ops[op_slot].as_mut().expect("live");
            let p = op.parts[part_index].as_mut().expect("part");
            p.rebuild &= !read_in_full;
            p.recovered |= recovered;
        }
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = op.probe_from;
    }

    /// Data positions still to be rebuilt, with the union of their ranges (of a chunk read
    /// again in units, the units that failed).
    fn read_rebuild_needs(&self, op: &Op) -> (ChunkSet, Option<ChunkRange>) {
        let mut targets = 0;
        let mut range: Option<ChunkRange> = None;
        for part in op.parts.iter().flatten() {
            let wanted = part.rebuild & !part.lost;
            if wanted == 0 {
                continue;
            }
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                if has(wanted, i) {
                    targets |= bit(i);
                    let lo = s.location.offset_in_chunk_bytes;
                    let segment = ChunkRange::new(lo, lo + s.len_bytes);
                    let units = self.units_to_recover(op, i);
                    for r in units.pieces(segment) {
                        range = Some(range.map_or(r, |x| x.union(r)));
                    }
                }
            }
        }
        (targets, range)
    }

    /// Every IO of a read round completed.
    pub(super) fn read_after_io(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let read_round = matches!(op.phase, Phase::Reading | Phase::Rebuilding);
        if read_round && op.errored != 0 && self.read_probe(op_slot) {
            return;
        }
        if self.ops[op_slot].as_ref().expect("live").phase == Phase::Probing {
            self.read_after_probe(op_slot);
        }
        let op = self.ops[op_slot].as_ref().expect("live");
        if op.phase == Phase::Rebuilding && self.is_mirror() {
            self.read_after_unit_rereads(op_slot);
        }
        let op = self.ops[op_slot].as_ref().expect("live");
        if op.phase == Phase::Rebuilding && !self.is_mirror() {
            if op.errored & !op.rebuild_erased == 0 {
                self.read_reconstruct(op_slot);
                return;
            }
            // A source failed too: plan again with it erased.
            self.release_scratch(op_slot);
            let op = self.ops[op_slot].as_mut().expect("live");
            op.replans += 1;
        }
        let op = self.ops[op_slot].as_ref().expect("live");
        let (targets, range) = self.read_rebuild_needs(op);
        if targets == 0 {
            self.read_repair(op_slot);
            return;
        }
        match self.geometry.level() {
            Level::Raid1 | Level::Raid10 => self.read_other_copies(op_slot),
            Level::Raid0 => self.lose(op_slot, targets, RequestError::Media),
            _ => self.read_start_rebuild(op_slot, targets, range.expect("targets have a range")),
        }
    }

    /// Give up on `targets` for every part: those requests fail with `error`.
    fn lose(&mut self, op_slot: usize, targets: ChunkSet, error: RequestError) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.lost_error = error;
        for part in op.parts.iter_mut().flatten() {
            part.lost |= part.rebuild & targets;
        }
        self.read_repair(op_slot);
    }

    /// Mirrors: read what a part still wants from another copy, straight into the request's
    /// buffer: the whole segment, or where a copy was read again in units, one read per unit
    /// that failed on every copy tried so far (the copy now tried is then read in units too,
    /// so that a unit it fails goes on to the next copy alone, and its units that read are
    /// kept: found by review, whole runs of units lost a unit another copy held, and took a
    /// third copy's bytes over the second's readable ones).
    fn read_other_copies(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Rebuilding;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        let errored = op.errored;
        // Per data position, the units still to read, taken before this round's copies
        // join `probed` (their sets start empty).
        let mut left = [None::<Units>; MEMBERS_MAX];
        let op = self.ops[op_slot].as_ref().expect("live");
        for part in op.parts.iter().flatten() {
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                if has(part.rebuild & !part.lost, i) && self.position_probed(op, i) {
                    left[i] = Some(self.units_to_recover(op, i));
                }
            }
        }
        for part_index in 0..op.parts.len() {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            let wanted = part.rebuild & !part.lost;
            if wanted == 0 {
                continue;
            }
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                if !has(wanted, i) {
                    continue;
                }
                match (self.pick_copy(stripe, i, errored), left[i]) {
                    (Some(member), None) => {
                        let kind = MemberIoKind::Read {
                            offset_bytes: self
                                .member_offset(stripe, s.location.offset_in_chunk_bytes),
                            ptr: self.request_ptr(part.request, s.range_offset_bytes),
                            len_bytes: s.len_bytes,
                        };
                        self.issue(op_slot, member, part_index, kind);
                    }
                    (Some(member), Some(units)) => {
                        let op = self.ops[op_slot].as_mut().expect("live");
                        if !has(op.probed, member) {
                            op.probed |= bit(member);
                            op.units[member] = Units::default();
                        }
                        let lo = s.location.offset_in_chunk_bytes;
                        for piece in units.pieces(ChunkRange::new(lo, lo + s.len_bytes)) {
                            let at = s.range_offset_bytes + u64::from(piece.lo - lo);
                            let dest = UnitDest::Request { slot: part.request, at };
                            self.issue_unit_reads(op_slot, member, piece, dest);
                        }
                    }
                    (None, _) => {
                        let op = self.ops[op_slot].as_mut().expect("live");
                        op.lost_error = RequestError::Unreadable;
                        op.parts[part_index].as_mut().expect("part").lost |= bit(i);
                    }
                }
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// Chunk indices (data and parity) whose members cannot be read for this operation.
    pub(super) fn unreadable_chunks(&self, op: &Op) -> ChunkSet {
        let n = self.geometry.data_chunks() + self.geometry.parity_chunks();
        (0..n)
            .filter(|&c| !self.usable(op.stripe, op.chunk_member[c]))
            .fold(op.errored, |s, c| s | bit(c))
    }

    fn read_start_rebuild(&mut self, op_slot: usize, targets: ChunkSet, range: ChunkRange) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let erased = self.unreadable_chunks(op);
        let m = self.geometry.parity_chunks();
        let untrusted = self.stripe_untrusted(op.stripe);
        if erased.count_ones() as usize > m || op.replans > REPLANS_MAX || untrusted {
            // Beyond redundancy, or parity not trusted after an unclean shutdown: refuse
            // rather than reconstruct something that may be wrong.
            self.lose(op_slot, targets, RequestError::Unreadable);
            return;
        }
        let len = range.len();
        let mut needs = [(0usize, 0u32); MEMBERS_MAX + PARITY_CHUNKS_MAX];
        let mut count = 0;
        let mut sources = [0usize; MEMBERS_MAX];
        let source_count;
        let mut target_list = [0usize; PARITY_CHUNKS_MAX];
        let target_count;
        {
            let plan = self.plan_for(erased, targets);
            source_count = plan.sources().len();
            sources[..source_count].copy_from_slice(plan.sources());
            target_count = plan.targets().len();
            target_list[..target_count].copy_from_slice(plan.targets());
        }
        // Sources the requests already read are taken from the requests' buffers (no second
        // read, no copy), and targets are rebuilt straight into the buffer of the request
        // that asked for them (no copy afterwards); the rest go to scratch.
        self.place_in_requests(op_slot, &sources[..source_count], targets, range);
        let op = self.ops[op_slot].as_ref().expect("live");
        for &c in sources[..source_count].iter().chain(&target_list[..target_count]) {
            if op.touched[c].is_none() {
                needs[count] = (c, len);
                count += 1;
            }
        }
        if !self.take_scratch(op_slot, &needs[..count]) {
            // No buffers now: park; the round restarts when buffers come back.
            self.park_starved(op_slot);
            return;
        }
        self.counters.degraded_reads += 1;
        let op = self.ops[op_slot].as_mut().expect("live");
        let in_place = target_list[..target_count].iter().filter(|&&c| op.touched[c].is_some());
        self.counters.degraded_reads_in_place += u64::try_from(in_place.count()).expect("fits");
        op.phase = Phase::Rebuilding;
        op.serial = op.serial.wrapping_add(1);
        op.rebuild_erased = erased;
        op.rebuild_targets = targets;
        op.rebuild_range = Some(range);
        let stripe = op.stripe;
        for &c in &sources[..source_count] {
            let op = self.ops[op_slot].as_ref().expect("live");
            if op.touched[c].is_some() {
                continue;
            }
            let kind = MemberIoKind::Read {
                offset_bytes: self.member_offset(stripe, range.lo),
                ptr: Self::scratch_ptr(op, c, 0),
                len_bytes: len,
            };
            self.issue(op_slot, c, 0, kind);
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.advance(op_slot);
        }
    }

    /// Which chunks of a degraded read live in the requests' buffers, set in `op.touched` (a
    /// read op's `touched` slots are free for this; sources and targets are distinct
    /// chunks): each data source whose `range` a part already read with no error, and each
    /// target that exactly one part wants, over the whole of `range` (that part's segment of
    /// it then is `range`, since `range` is the union of the wanted segments), unless that
    /// target was read again in units and some unit of `range` read (the readable units in
    /// the buffer must stay as read). Every other chunk is `None`: it goes to scratch.
    fn place_in_requests(
        &mut self,
        op_slot: usize,
        sources: &[usize],
        targets: ChunkSet,
        range: ChunkRange,
    ) {
        let Shard { ops, requests, geometry, .. } = self;
        let op = ops[op_slot].as_mut().expect("live");
        let k = geometry.data_chunks();
        op.touched[..k].fill(None);
        let mut wanted_twice: ChunkSet = 0;
        let mut wanted: ChunkSet = 0;
        for part in op.parts.iter().flatten() {
            let ShardOp::Read { offset, len_bytes } =
                requests[part.request].as_ref().expect("live").op
            else {
                unreachable!("read operations hold reads only")
            };
            let part_wants = part.rebuild & !part.lost & targets;
            wanted_twice |= wanted & part_wants;
            wanted |= part_wants;
            for s in geometry.segments(offset, u64::from(len_bytes)) {
                let c = s.location.data_index;
                let lo = s.location.offset_in_chunk_bytes;
                let covers = lo <= range.lo && range.hi <= lo + s.len_bytes;
                let clean = !has(part.rebuild | part.lost | op.errored, c);
                let source = clean && sources.contains(&c);
                let all_bad = !has(op.probed, c) || op.units[c].pieces(range).next() == Some(range);
                let target = has(part_wants, c) && all_bad;
                if c < k && covers && (source || target) && op.touched[c].is_none() {
                    let at = usize::try_from(s.range_offset_bytes).expect("fits")
                        + usize_of(range.lo - lo);
                    op.touched[c] =
                        Some(super::Touch { range, request: part.request, buf_offset: at });
                }
            }
        }
        // A target two parts want is rebuilt once, in scratch, and copied to both.
        for c in (0..k).filter(|&c| has(wanted_twice, c)) {
            op.touched[c] = None;
        }
    }

    /// Sources are in: reconstruct the targets (in place where `op.touched` says so, else
    /// in scratch) and copy the scratch ones into the requests that asked for them.
    fn read_reconstruct(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        let (erased, rebuild_targets) = (op.rebuild_erased, op.rebuild_targets);
        let range = op.rebuild_range.expect("rebuild range");
        let codec = self.codec.expect("parity level");
        let len = usize::try_from(range.len()).expect("fits");
        self.plan_for(erased, rebuild_targets);
        {
            let Shard { ops, plans, requests, .. } = &mut *self;
            let plan = plans.get(&(erased, rebuild_targets)).expect("just planned");
            let op = ops[op_slot].as_mut().expect("live");
            assert_eq!(op.pending, 0, "buffers touched with IO in flight");
            let Op { scratch, scratch_held, touched, .. } = &mut **op;
            let (mut sources, mut targets) =
                split_scratch_slots(scratch, *scratch_held, plan.sources(), plan.targets(), 0..len);
            cut_request_places(
                requests,
                touched,
                plan.sources(),
                plan.targets(),
                len,
                &mut sources,
                &mut targets,
            );
            let count = plan.targets().len();
            codec
                .reconstruct_from(
                    plan,
                    &sources[..plan.sources().len()],
                    &mut targets[..count],
                    Stores::Cached,
                )
                .expect("plan, counts and lengths are consistent");
        }
        // Copy the ranges rebuilt in scratch into the requests that asked for them.
        let all_units = Units::first(self.units_per_chunk());
        let Shard { ops, requests, geometry, .. } = self;
        let op = ops[op_slot].as_mut().expect("live");
        for part in op.parts.iter_mut().flatten() {
            let wanted = part.rebuild & !part.lost & op.rebuild_targets;
            if wanted == 0 {
                continue;
            }
            let request = requests[part.request].as_mut().expect("live");
            let ShardOp::Read { offset, len_bytes } = request.op else { unreachable!() };
            let dst = request.buf.as_mut().expect("read buffer").as_mut_slice();
            for s in geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                if !has(wanted, i) {
                    continue;
                }
                if let Some(home) = op.touched[i] {
                    // Rebuilt in place: this part is the one that wanted it.
                    assert_eq!(home.request, part.request, "an in-place target has one reader");
                    continue;
                }
                // Of a chunk read again in units, only the units that failed: the others
                // are in the buffer as read.
                let lo = s.location.offset_in_chunk_bytes;
                // Within the rebuilt range only (a target whose member left service during a
                // later probe has every unit marked, past the range rebuilt: found by review,
                // a panic).
                let units = if has(op.probed, i) { op.units[i] } else { all_units };
                let seg_lo = lo.max(range.lo);
                let seg_hi = (lo + s.len_bytes).min(range.hi);
                if seg_lo >= seg_hi {
                    continue;
                }
                for piece in units.pieces(ChunkRange::new(seg_lo, seg_hi)) {
                    let from = range.relative(piece);
                    let at = usize::try_from(s.range_offset_bytes).expect("fits")
                        + usize_of(piece.lo - lo);
                    let rebuilt = op.scratch[i].as_ref().expect("rebuilt target").as_slice();
                    dst[at..at + from.len()].copy_from_slice(&rebuilt[from]);
                }
            }
            part.rebuild &= !wanted;
            part.recovered |= wanted;
        }
        self.read_repair(op_slot);
    }

    /// Rewrite recovered data onto members that returned read errors, then finish.
    fn read_repair(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_mut().expect("live");
        op.phase = Phase::Repairing;
        op.serial = op.serial.wrapping_add(1);
        let stripe = op.stripe;
        let errored = op.errored;
        if self.is_read_only() {
            // Served from redundancy; the bad range stays as it is (nothing is written).
        } else if self.is_mirror() {
            self.repair_mirror_copies(op_slot, stripe, errored);
        } else if let Some(range) = self.ops[op_slot].as_ref().expect("live").rebuild_range {
            let op = self.ops[op_slot].as_ref().expect("live");
            let targets = op.rebuild_targets;
            let recovered = op.parts.iter().flatten().fold(0, |s, p| s | p.recovered);
            for c in 0..self.geometry.data_chunks() {
                let op = self.ops[op_slot].as_ref().expect("live");
                let member = op.chunk_member[c];
                if !has(targets & recovered & errored, c) || !self.usable(stripe, member) {
                    continue;
                }
                if has(op.probed, c) && op.touched[c].is_none() {
                    // Only the units that failed when read again (rebuilt in scratch; in
                    // place, every unit of the range failed).
                    let units = op.units[c];
                    for piece in units.pieces(range) {
                        let op = self.ops[op_slot].as_ref().expect("live");
                        let kind = MemberIoKind::Write {
                            offset_bytes: self.member_offset(stripe, piece.lo),
                            ptr: Self::scratch_ptr(op, c, usize_of(piece.lo - range.lo)),
                            len_bytes: piece.len(),
                            durability: Durability::Cached,
                        };
                        self.issue(op_slot, c, 0, kind);
                    }
                    continue;
                }
                // The recovered range is where it was rebuilt: a request's buffer or
                // scratch (`read_reconstruct`).
                let ptr = match op.touched[c] {
                    Some(home) => {
                        let at = u64::try_from(home.buf_offset).expect("fits");
                        self.request_ptr(home.request, at)
                    }
                    None => Self::scratch_ptr(op, c, 0),
                };
                let kind = MemberIoKind::Write {
                    offset_bytes: self.member_offset(stripe, range.lo),
                    ptr,
                    len_bytes: range.len(),
                    durability: Durability::Cached,
                };
                self.issue(op_slot, c, 0, kind);
            }
        }
        if self.ops[op_slot].as_ref().expect("live").pending == 0 {
            self.finish_op(op_slot);
        }
    }

    fn repair_mirror_copies(&mut self, op_slot: usize, stripe: StripeIndex, errored: ChunkSet) {
        for part_index in 0..super::OP_REQUESTS_MAX {
            let Some(part) = self.ops[op_slot].as_ref().expect("live").parts[part_index] else {
                continue;
            };
            if part.recovered == 0 {
                continue;
            }
            let (offset, len_bytes) = self.read_range(part.request);
            for s in self.geometry.segments(offset, u64::from(len_bytes)) {
                let i = s.location.data_index;
                if !has(part.recovered, i) {
                    continue;
                }
                // Each copy that failed takes what it failed: the units it failed when read
                // in units, all of which another copy gave (the part is recovered), or the
                // whole segment.
                let lo = s.location.offset_in_chunk_bytes;
                for copy in 0..self.geometry.copies() {
                    let member = self.geometry.data_member(stripe, i, copy).get();
                    let usable = self.usable(stripe, u16::try_from(member).expect("fits"));
                    if !has(errored, member) || !usable {
                        continue;
                    }
                    let op = self.ops[op_slot].as_ref().expect("live");
                    let units = if has(op.probed, member) {
                        op.units[member]
                    } else {
                        Units::first(self.units_per_chunk())
                    };
                    for piece in units.pieces(ChunkRange::new(lo, lo + s.len_bytes)) {
                        let at = s.range_offset_bytes + u64::from(piece.lo - lo);
                        let kind = MemberIoKind::Write {
                            offset_bytes: self.member_offset(stripe, piece.lo),
                            ptr: self.request_ptr(part.request, at),
                            len_bytes: piece.len(),
                            durability: Durability::Cached,
                        };
                        self.issue(op_slot, member, part_index, kind);
                    }
                }
            }
        }
    }
}

impl Shard {
    /// Reconstruct `targets` from the other chunks of an operation, all in its scratch
    /// buffers (each `len` bytes from the start): the plan for `erased` picks the sources.
    pub(super) fn reconstruct_in_scratch(
        &mut self,
        op_slot: usize,
        erased: ChunkSet,
        targets: ChunkSet,
        len: usize,
    ) {
        self.reconstruct_range_in_scratch(op_slot, erased, targets, 0, len);
    }

    /// `reconstruct_in_scratch` of bytes `offset..offset + len` of each chunk only (resync
    /// rebuilds only the units of a chunk that failed to read).
    pub(super) fn reconstruct_range_in_scratch(
        &mut self,
        op_slot: usize,
        erased: ChunkSet,
        targets: ChunkSet,
        offset: usize,
        len: usize,
    ) {
        let codec = self.codec.expect("parity level");
        self.plan_for(erased, targets);
        let Shard { ops, plans, .. } = &mut *self;
        let plan = plans.get(&(erased, targets)).expect("just planned");
        let op = ops[op_slot].as_mut().expect("live");
        assert_eq!(op.pending, 0, "scratch contents touched with IO in flight");
        let (sources, mut outs) = split_scratch_slots(
            &mut op.scratch,
            op.scratch_held,
            plan.sources(),
            plan.targets(),
            offset..offset + len,
        );
        let count = plan.targets().len();
        codec
            .reconstruct_from(
                plan,
                &sources[..plan.sources().len()],
                &mut outs[..count],
                Stores::Cached,
            )
            .expect("plan, counts and lengths are consistent");
    }

    /// Parity recomputed from an operation's data chunks (scratch `0..k`) into its extra
    /// scratch slots (`MEMBERS_MAX + r`), as resync, scrub and a verified rebuild need.
    pub(super) fn encode_parity_in_scratch(&mut self, op_slot: usize) {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let codec = self.codec.expect("parity level");
        let op = self.ops[op_slot].as_mut().expect("live");
        assert_eq!(op.pending, 0, "scratch contents touched with IO in flight");
        let (head, extra) = op.scratch.split_at_mut(MEMBERS_MAX);
        let mut data: [&[u8]; MEMBERS_MAX] = [&[]; MEMBERS_MAX];
        for i in 0..k {
            data[i] = head[i].as_ref().expect("data").as_slice();
        }
        let mut outs: [&mut [u8]; 3] = [&mut [], &mut [], &mut []];
        for (r, slot) in extra.iter_mut().take(m).enumerate() {
            outs[r] = slot.as_mut().expect("recomputed parity").as_mut_slice();
        }
        codec.encode(&data[..k], &mut outs[..m], Stores::Cached).expect("shapes");
    }
}

/// Split an operation's scratch buffers into reconstruction sources (shared) and targets
/// (unique), in plan order, each cut to `len` bytes. Sources and targets are distinct chunks.
pub(super) fn split_scratch<'a>(
    op: &'a mut Op,
    sources: &[usize],
    targets: &[usize],
    len: usize,
) -> ([&'a [u8]; MEMBERS_MAX], [&'a mut [u8]; PARITY_CHUNKS_MAX]) {
    assert_eq!(op.pending, 0, "scratch contents touched with IO in flight");
    split_scratch_slots(&mut op.scratch, op.scratch_held, sources, targets, 0..len)
}

/// `split_scratch` over the slots `held` names, each cut to `range` (a chunk of the plan
/// without scratch stays an empty slice, for the caller to fill).
fn split_scratch_slots<'a>(
    scratch: &'a mut [Option<IoBuf>],
    held: u128,
    sources: &[usize],
    targets: &[usize],
    range: std::ops::Range<usize>,
) -> ([&'a [u8]; MEMBERS_MAX], [&'a mut [u8]; PARITY_CHUNKS_MAX]) {
    let mut source_refs: [&[u8]; MEMBERS_MAX] = [&[]; MEMBERS_MAX];
    let mut target_refs: [&mut [u8]; PARITY_CHUNKS_MAX] = [&mut [], &mut [], &mut []];
    // Only the held slots (a few), not all OP_SCRATCH_MAX of them.
    let mut slots = Ascending::new(scratch);
    for chunk in super::held_slots(held) {
        let buf = slots.take(chunk, 1)[0].as_mut().expect("a held scratch slot has its buffer");
        if let Some(t) = targets.iter().position(|&x| x == chunk) {
            target_refs[t] = &mut buf.as_mut_slice()[range.clone()];
        } else if let Some(s) = sources.iter().position(|&x| x == chunk) {
            source_refs[s] = &buf.as_slice()[range.clone()];
        }
    }
    (source_refs, target_refs)
}

/// Fill in the reconstruction sources and targets that live in requests' buffers
/// (`places[chunk]`, see `Shard::place_in_requests`): `len` bytes each, cut from those
/// buffers as disjoint slices (one request's buffer may hold several sources and a target).
fn cut_request_places<'a>(
    requests: &'a mut [Option<super::Request>],
    places: &[Option<super::Touch>; MEMBERS_MAX],
    sources: &[usize],
    targets: &[usize],
    len: usize,
    source_refs: &mut [&'a [u8]; MEMBERS_MAX],
    target_refs: &mut [&'a mut [u8]; PARITY_CHUNKS_MAX],
) {
    // (request, offset in its buffer, plan position: sources first, then targets), in
    // ascending order so that each buffer, and each piece of it, is cut off once.
    let mut cuts = [(0usize, 0usize, 0usize); MEMBERS_MAX + PARITY_CHUNKS_MAX];
    let mut count = 0;
    for (position, &chunk) in sources.iter().chain(targets).enumerate() {
        if let Some(place) = places[chunk] {
            cuts[count] = (place.request, place.buf_offset, position);
            count += 1;
        }
    }
    let cuts = &mut cuts[..count];
    cuts.sort_unstable();
    let mut requests = Ascending::new(requests);
    let mut buffer = Ascending::new(&mut []);
    let mut buffer_of = None;
    for &(request, offset, position) in cuts.iter() {
        if buffer_of != Some(request) {
            let r = requests.take(request, 1)[0].as_mut().expect("live request");
            buffer = Ascending::new(r.buf.as_mut().expect("read buffer").as_mut_slice());
            buffer_of = Some(request);
        }
        // Places are distinct segments of one request's range: they never overlap.
        let piece = buffer.take(offset, len);
        match position.checked_sub(sources.len()) {
            None => source_refs[position] = piece,
            Some(t) => target_refs[t] = piece,
        }
    }
}

/// Hands out disjoint `&mut` pieces of a slice, in ascending order, each borrowed for as
/// long as the slice is (what `split_at_mut` does, one piece at a time).
struct Ascending<'a, T> {
    rest: &'a mut [T],
    /// Index in the whole slice of `rest[0]`.
    rest_at: usize,
}

impl<'a, T> Ascending<'a, T> {
    fn new(items: &'a mut [T]) -> Self {
        Self { rest: items, rest_at: 0 }
    }

    /// `items[at..at + len]`; `at` must not fall before the end of the last piece taken.
    fn take(&mut self, at: usize, len: usize) -> &'a mut [T] {
        assert!(at >= self.rest_at, "pieces taken out of order or overlapping");
        let (_, tail) = std::mem::take(&mut self.rest).split_at_mut(at - self.rest_at);
        let (piece, tail) = tail.split_at_mut(len);
        self.rest = tail;
        self.rest_at = at + len;
        piece
    }
}
