//! Scrub: read every stripe of the shard, check that parity (or every mirror copy) agrees with
//! the data, report what does not, and repair on request.
//!
//! Owns the shard's scrub cursor and its tallies. A scrub operation holds its stripe like any
//! other operation, so a write can never slip between its reads and its repair.
//!
//! What is repaired:
//! - a chunk that fails to read is read again in 4 KiB units, and only the units that fail
//!   again are reconstructed from the others and rewritten (a read error is repaired whether
//!   or not the scrub repairs mismatches), unless the stripe's other parity rows disagree
//!   there (below); the readable rest of the chunk is never written (found by review: whole-
//!   chunk rewrites turned a stale parity row into wrong data beside one bad sector);
//! - a mismatch on RAID 6 and 7.3: the one chunk whose replacement makes the stripe
//!   consistent again is located from the syndromes (trying each chunk as the erased one) and
//!   only it is rewritten; if no single chunk explains it, parity is recomputed from the data
//!   and the stripe counted as not located;
//! - a mismatch on RAID 5: it cannot be located (any one chunk could explain it): parity is
//!   recomputed from the data, as md does;
//! - mirrors, unit by unit (4 KiB): the value most readable copies hold wins (ties: the
//!   lowest member); a copy's unreadable unit is rewritten only where most readable copies
//!   agree on it (found by review: whole-chunk votes copied a corrupted copy over a bad
//!   sector, and let one copy outvote two that were right at every byte).
//!
//! Read-only (`ArrayAccess::ReadOnly`, `serve --read-only`): only a check runs, and it writes
//! nothing. A chunk that fails to read is still reconstructed, so the stripe is checked
//! with it, but it is not rewritten: it is counted in `read_errors_left` (reported, as a
//! read of it is served from redundancy and left as it is); no mismatch is repaired; no
//! bitmap bit is set, since no stripe is written. The scrub's cursor lives in memory only,
//! on every array. `scrub_after_reads` asserts that a read-only shard rewrites nothing.
//!
//! A unit rebuilt for a read error is written only if the parity rows the rebuild did not
//! erase agree with it there (when fewer chunks are erased at that unit than there are
//! parity rows): one rebuilt from a source that is itself silently wrong would be wrong too.
//! If they disagree the stripe counts as a mismatch and that unit is not written. With as
//! many chunks erased as parity rows the rewrite cannot be checked (it writes what a read
//! would reconstruct). In a stripe with read errors the other units are checked too and a
//! mismatch there counted, but only the units that failed to read are written: a repair
//! scrub after it repairs the mismatch.
//!
//! Degraded (parity levels with fewer members out of service than parity chunks: RAID 6 with
//! one, 7.3 with one or two): the missing chunks are computed from the others and parity
//! recomputed from the data is compared with every parity chunk read, at least one of which
//! the computation did not use, so a single bad chunk still shows (the code is MDS: e
//! erasures leave m - e rows to detect with). Read errors are rewritten as when healthy (and
//! checked as above), which matters most now: a latent bad sector is what turns the coming
//! rebuild into data loss. Mismatches are counted and never repaired: with a member's chunk
//! itself computed from the stripe, which chunk is wrong cannot be told reliably, and
//! rewriting parity to follow data computed from a bad chunk would bless the damage.
//! Stripes an unclean stop left to resync (resync waits while a member is out) are passed
//! over and counted as `untrusted`.
//!
//! Limits: a scrub stops, saying why, when a member is being rebuilt, when a mirror level
//! has a member out of service (its copies cannot all be compared), and when as many
//! members are out as the level has parity chunks (nothing is left to check with). Locating
//! allocates temporary buffers, once per mismatched stripe: a fault path, bounded by the
//! stripe size.

use super::pace::Pace;
use super::{Health, OpKind, Shard, ShardEvent, ShutdownState, StripeEntry};
use crate::plan::{ChunkSet, UNIT_BYTES, Units, bit, has};
use flashraid_layout::{MEMBERS_MAX, StripeIndex};
use flashraid_parity::Stores;

/// A scrub as one shard runs it.
#[derive(Clone, Debug)]
pub(super) struct ScrubState {
    repair: bool,
    next: u64,
    in_flight: usize,
    pace: Pace,
    tally: ScrubTally,
    stopped: Option<&'static str>,
    done_announced: bool,
}

impl ScrubState {
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }
}

/// What a scrub found and did (per shard; the array sums them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubTally {
    pub stripes_checked: u64,
    pub stripes_total: u64,
    /// Stripes whose parity or copies disagreed with the data.
    pub mismatches: u64,
    /// Mismatched stripes where one chunk was found to be the wrong one.
    pub located: u64,
    /// Stripes rewritten to agree (mismatches repaired, in repair mode).
    pub repaired: u64,
    /// Chunks that failed to read and were rewritten from redundancy.
    pub read_errors_repaired: u64,
    /// Chunks that failed to read and were left as they are: the array is served read-only,
    /// so nothing is rewritten (their stripes were still checked with them reconstructed),
    /// or the parity rows left to check their reconstruction disagree (the stripe is counted
    /// as a mismatch too).
    pub read_errors_left: u64,
    /// Stripes that could not be checked (more chunks unreadable than redundancy).
    pub unreadable: u64,
    /// Stripes passed over: written when the array stopped uncleanly and not resynced yet
    /// (resync waits while a member is out), so neither data nor parity can judge the other.
    pub untrusted: u64,
}

impl ScrubTally {
    /// Add another shard's tally (an array's is the sum over its shards).
    pub fn add(&mut self, other: &ScrubTally) {
        let ScrubTally {
            stripes_checked,
            stripes_total,
            mismatches,
            located,
            repaired,
            read_errors_repaired,
            read_errors_left,
            unreadable,
            untrusted,
        } = other;
        // Destructured, so a new field cannot be left out of the sum.
        self.stripes_checked += stripes_checked;
        self.stripes_total += stripes_total;
        self.mismatches += mismatches;
        self.located += located;
        self.repaired += repaired;
        self.read_errors_repaired += read_errors_repaired;
        self.read_errors_left += read_errors_left;
        self.unreadable += unreadable;
        self.untrusted += untrusted;
    }
}

/// A shard's scrub, for status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubStatus {
    pub repair: bool,
    pub tally: ScrubTally,
    pub running: bool,
    /// Why it stopped early, if it did.
    pub stopped: Option<&'static str>,
}

impl Shard {
    /// Start a scrub of every stripe this shard owns (`repair`: rewrite what disagrees). A
    /// scrub already running is restarted. A read-only shard runs checks only, which write
    /// nothing there (see the module).
    pub fn start_scrub(&mut self, repair: bool, rate_bytes_per_s: u64) {
        assert!(!(repair && self.is_read_only()), "a read-only array is never repaired");
        let owned = self.ownership.owned_below(self.shard_index, self.geometry.stripes());
        self.scrub_generation = self.scrub_generation.wrapping_add(1);
        self.scrub = Some(ScrubState {
            repair,
            next: self.own_stripe_from(0),
            in_flight: 0,
            pace: Pace::new(rate_bytes_per_s, self.now_us),
            tally: ScrubTally { stripes_total: owned, ..ScrubTally::default() },
            stopped: None,
            done_announced: false,
        });
        self.schedule_scrub();
    }

    /// Stop the scrub (it reports what it found so far).
    pub fn stop_scrub(&mut self) {
        if let Some(s) = self.scrub.as_mut()
            && s.stopped.is_none()
            && !s.done_announced
        {
            s.stopped = Some("stopped by the operator");
        }
        self.announce_scrub();
    }

    pub fn set_scrub_rate(&mut self, bytes_per_s: u64) {
        if let Some(s) = self.scrub.as_mut() {
            s.pace.set_rate(bytes_per_s);
        }
    }

    pub fn scrub_status(&self) -> Option<ScrubStatus> {
        self.scrub.as_ref().map(|s| ScrubStatus {
            repair: s.repair,
            tally: s.tally,
            running: s.stopped.is_none() && !s.done_announced,
            stopped: s.stopped,
        })
    }

    pub(super) fn refill_scrub_budget(&mut self) {
        let (now, chunk) = (self.now_us, u64::from(self.geometry.chunk_bytes()));
        if let Some(s) = self.scrub.as_mut() {
            s.pace.refill(now, chunk * self.geometry.member_count() as u64);
        }
    }

    /// Bytes one scrub operation reads.
    fn scrub_stripe_bytes(&self) -> u64 {
        u64::from(self.geometry.chunk_bytes()) * self.geometry.member_count() as u64
    }

    pub(super) fn schedule_scrub(&mut self) {
        if self.scrub.is_none() || self.shutdown != ShutdownState::Running {
            return;
        }
        if let Some(why) = self.scrub_impossible() {
            let s = self.scrub.as_mut().expect("checked");
            if s.stopped.is_none() && !s.done_announced {
                s.stopped = Some(why);
            }
        }
        let stripes = self.geometry.stripes();
        let bytes = self.scrub_stripe_bytes();
        loop {
            let Some(s) = self.scrub.as_ref() else { return };
            if s.stopped.is_some()
                || s.in_flight >= self.config.scrub_stripes_max
                || s.next >= stripes
                || self.free_ops.is_empty()
            {
                break;
            }
            let stripe = StripeIndex(s.next);
            if self.stripes.get(stripe).is_some() {
                // Busy: try again when it is idle (the next tick or finished operation).
                break;
            }
            let s = self.scrub.as_mut().expect("checked");
            if !s.pace.take(bytes) {
                break;
            }
            s.next = self.ownership.next_owned(self.shard_index, s.next);
            s.in_flight += 1;
            self.stripes.insert(stripe, StripeEntry::default()).expect("sized for every op slot");
            let op_slot = self.free_ops.pop().expect("checked");
            let op = self.new_op(stripe, OpKind::Scrub);
            self.stripes.get_mut(stripe).expect("present").op = Some(op_slot);
            self.ops[op_slot] = Some(op);
            self.begin(op_slot);
        }
        self.announce_scrub();
    }

    /// Why a scrub cannot go on with the members as they are (see the module's limits).
    fn scrub_impossible(&self) -> Option<&'static str> {
        let out = self.members.iter().filter(|m| m.health != Health::Active).count();
        let rebuilding = self.members.iter().any(|m| m.health == Health::Rebuilding);
        if rebuilding && self.is_parity_level() {
            Some("a member is being rebuilt: parity cannot be checked against it")
        } else if rebuilding {
            Some("a member is being rebuilt: the mirror copies cannot be compared with it")
        } else if !self.is_parity_level() && out > 0 {
            Some("a member is not in service: its copies cannot all be compared")
        } else if out >= self.geometry.parity_chunks().max(1) {
            Some(
                "as many members are out of service as the level has parity: nothing is left to check with",
            )
        } else {
            None
        }
    }

    fn announce_scrub(&mut self) {
        let stripes = self.geometry.stripes();
        let Some(s) = self.scrub.as_mut() else { return };
        let finished = s.in_flight == 0 && (s.next >= stripes || s.stopped.is_some());
        if finished && !s.done_announced {
            s.done_announced = true;
            self.events.push_back(ShardEvent::ScrubDone { tally: s.tally, stopped: s.stopped });
        }
    }

    /// A scrub operation finished (from `finish_op`).
    pub(super) fn scrub_op_done(&mut self, generation: u32) {
        if generation != self.scrub_generation {
            return;
        }
        if let Some(s) = self.scrub.as_mut() {
            s.in_flight -= 1;
            s.tally.stripes_checked += 1;
        }
        self.announce_scrub();
    }

    fn tally(&mut self, f: impl FnOnce(&mut ScrubTally)) {
        if let Some(s) = self.scrub.as_mut() {
            f(&mut s.tally);
        }
    }

    fn scrub_repairs(&self) -> bool {
        self.scrub.as_ref().is_some_and(|s| s.repair)
    }

    /// Every chunk is read (or failed to): decide what to rewrite. The chunks to rewrite get
    /// their correct contents in their own scratch buffers, and `op.units` says which 4 KiB
    /// units of each to write.
    ///
    /// A chunk that failed to read is first read again in 4 KiB units (`UNIT_BYTES`, as
    /// resync does), so that only the units that cannot be read are rebuilt and rewritten:
    /// the readable rest of the chunk is the member's and is never written over with what
    /// the others say (found by review: a check scrub rewrote whole chunks around one bad
    /// sector, turning a stale parity row into wrong data, and on mirrors copying a
    /// corrupted copy over a good one's readable bytes).
    pub(super) fn scrub_after_reads(&mut self, op_slot: usize) {
        let op = self.ops[op_slot].as_ref().expect("live");
        if self.stripe_needs_resync(op.stripe) {
            // Resync has not vouched for it yet: its parity may disagree with its data for
            // a reason resync settles (data wins). Judging it here could pick the wrong side.
            // Counted, so a report never calls it checked.
            self.tally(|t| t.untrusted += 1);
            self.finish_op(op_slot);
            return;
        }
        let units = usize::try_from(self.geometry.chunk_bytes() / UNIT_BYTES).expect("fits");
        // Chunks whose member is not in service (`absent`: out since before the scrub, or
        // since it started), and those that failed to read.
        let absent = self.absent_chunks_all(op);
        let failed = op.errored & !absent;
        if failed != 0 && op.probed == 0 && units > 1 {
            self.probe_units(op_slot, failed, units);
            return;
        }
        // Per chunk index, the units not read.
        let all_units = Units::first(units);
        let mut bad = [Units::default(); MEMBERS_MAX];
        for (c, b) in bad.iter_mut().enumerate() {
            if has(absent | op.errored, c) {
                *b = all_units;
            } else if has(op.probed, c) {
                *b = op.units[c];
            }
        }
        let rewrite = if self.is_parity_level() {
            self.scrub_parity(op_slot, &bad, absent, units)
        } else {
            self.scrub_mirror(op_slot, &bad, absent, units)
        };
        // Read-only, nothing is ever rewritten: not a read error, not a mismatch (and so no
        // bitmap bit is set either). `poll_io` asserts it again for every member IO.
        assert!(rewrite == 0 || !self.is_read_only(), "a read-only scrub would rewrite");
        assert!(rewrite & absent == 0, "a scrub would write a member out of service");
        let op = self.ops[op_slot].as_mut().expect("live");
        op.repaired = rewrite;
        if rewrite == 0 {
            self.finish_op(op_slot);
            return;
        }
        if self.bitmap_ready(op_slot) {
            self.scrub_issue(op_slot);
        }
    }

    /// Parity levels. `bad`: per chunk, the units not read (every unit of an `absent`
    /// chunk, whose member is out of service and is never written).
    fn scrub_parity(
        &mut self,
        op_slot: usize,
        bad: &[Units; MEMBERS_MAX],
        absent: ChunkSet,
        units: usize,
    ) -> ChunkSet {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let len = usize::try_from(self.geometry.chunk_bytes()).expect("fits");
        let read_errors: ChunkSet = (0..k + m)
            .filter(|&c| !bad[c].is_empty() && !has(absent, c))
            .fold(0, |s, c| s | bit(c));
        if read_errors != 0 {
            return self.scrub_parity_read_errors(op_slot, bad, read_errors, units);
        }
        if absent.count_ones() as usize > m {
            self.tally(|t| t.unreadable += 1);
            return 0;
        }
        if absent != 0 {
            self.scrub_degraded(op_slot, absent, len);
            return 0;
        }
        // Recompute parity from the data and compare (the computed rows stay in scratch).
        if !self.parity_rows_disagree(op_slot, 0) {
            return 0;
        }
        self.tally(|t| t.mismatches += 1);
        let located = if m >= 2 { self.locate_bad_chunk(op_slot) } else { None };
        if located.is_some() {
            self.tally(|t| t.located += 1);
        }
        if !self.scrub_repairs() {
            return 0;
        }
        self.tally(|t| t.repaired += 1);
        let op = self.ops[op_slot].as_mut().expect("live");
        let (head, extra) = op.scratch.split_at_mut(MEMBERS_MAX);
        let rewrite = match located {
            Some((chunk, contents)) => {
                head[chunk].as_mut().expect("chunk").as_mut_slice().copy_from_slice(&contents);
                bit(chunk)
            }
            None => {
                // Not located: parity follows the data.
                let mut rewrite = 0;
                for r in 0..m {
                    let computed = extra[r].as_ref().expect("computed").as_slice();
                    let stored = head[k + r].as_mut().expect("parity").as_mut_slice();
                    if stored != computed {
                        stored.copy_from_slice(computed);
                        rewrite |= bit(k + r);
                    }
                }
                rewrite
            }
        };
        for c in (0..k + m).filter(|&c| has(rewrite, c)) {
            op.units[c] = Units::first(units);
        }
        rewrite
    }

    /// Parity levels, a stripe with units that failed to read (`read_errors`: the chunks
    /// with such units), unit by unit. The units not read (`bad`, every unit of the `absent`
    /// chunks included) are rebuilt from as many parity rows as are missing there, and
    /// parity is computed from the data so rebuilt. Where a row is left over it must agree:
    /// a unit rebuilt from a source that is itself silently wrong would be wrong too (found
    /// in review: it turned one detectable error into two silent ones), so a unit whose
    /// check fails is counted as a mismatch and not written. With as many units missing as
    /// rows the rewrite cannot be checked, and it writes what a read would reconstruct; with
    /// more the unit is unreadable and left alone. The units read everywhere are checked
    /// the same way, and a mismatch there is counted; it is repaired by a later repair scrub
    /// (this one writes only units that failed to read). Only the units decided are written.
    fn scrub_parity_read_errors(
        &mut self,
        op_slot: usize,
        bad: &[Units; MEMBERS_MAX],
        read_errors: ChunkSet,
        units: usize,
    ) -> ChunkSet {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let unit = usize::try_from(UNIT_BYTES).expect("fits");
        let data: ChunkSet = (0..k).fold(0, |s, i| s | bit(i));
        let erased_at =
            |u: usize| (0..k + m).filter(|&c| bad[c].contains(u)).fold(0, |s, c| s | bit(c));
        let (mut unreadable, mut mismatch) = (false, false);
        // First every data unit that can be rebuilt, so that parity is computed from whole
        // data; runs of units with the same chunks missing are rebuilt in one call.
        let mut u = 0;
        while u < units {
            let erased = erased_at(u);
            let mut end = u + 1;
            while end < units && erased_at(end) == erased {
                end += 1;
            }
            if erased.count_ones() as usize > m {
                unreadable |= erased & read_errors != 0;
            } else if erased & data != 0 {
                let (at, len) = (u * unit, (end - u) * unit);
                self.reconstruct_range_in_scratch(op_slot, erased, erased & data, at, len);
            }
            u = end;
        }
        self.encode_parity_in_scratch(op_slot);
        let op = self.ops[op_slot].as_mut().expect("live");
        let (head, extra) = op.scratch.split_at_mut(MEMBERS_MAX);
        let mut decided = [Units::default(); MEMBERS_MAX];
        for u in 0..units {
            let erased = erased_at(u);
            if erased.count_ones() as usize > m {
                continue;
            }
            let range = u * unit..(u + 1) * unit;
            // Rows the rebuild used agree by construction; the others check it.
            let disagrees = (0..m).filter(|&r| !has(erased, k + r)).any(|r| {
                head[k + r].as_ref().expect("parity").as_slice()[range.clone()]
                    != extra[r].as_ref().expect("computed").as_slice()[range.clone()]
            });
            if disagrees {
                mismatch = true;
                continue;
            }
            for c in (0..k + m).filter(|&c| has(erased & read_errors, c)) {
                if c >= k {
                    let computed = &extra[c - k].as_ref().expect("computed").as_slice();
                    head[c].as_mut().expect("parity").as_mut_slice()[range.clone()]
                        .copy_from_slice(&computed[range.clone()]);
                }
                decided[c].insert(u);
            }
        }
        let rewrite = self.settle_units(op_slot, read_errors, units, bad, &decided);
        self.tally(|t| {
            t.mismatches += u64::from(mismatch);
            t.unreadable += u64::from(unreadable);
        });
        rewrite
    }

    /// The chunks `candidates` (members in service) with their units decided: each chunk
    /// with units decided is to be rewritten, those units only (`op.units`; never on a
    /// read-only array); read errors are counted by chunk, repaired when every unit of it
    /// that failed is decided, else left.
    fn settle_units(
        &mut self,
        op_slot: usize,
        candidates: ChunkSet,
        units: usize,
        bad: &[Units; MEMBERS_MAX],
        decided: &[Units; MEMBERS_MAX],
    ) -> ChunkSet {
        let read_only = self.is_read_only();
        let (mut repaired, mut left) = (0u64, 0u64);
        let mut rewrite: ChunkSet = 0;
        let op = self.ops[op_slot].as_mut().expect("live");
        for c in (0..MEMBERS_MAX).filter(|&c| has(candidates, c)) {
            if !bad[c].is_empty() {
                let all = (0..units).all(|u| !bad[c].contains(u) || decided[c].contains(u));
                if all && !read_only {
                    repaired += 1;
                } else {
                    left += 1;
                }
            }
            if !read_only && !decided[c].is_empty() {
                rewrite |= bit(c);
                op.units[c] = decided[c];
            }
        }
        self.tally(|t| {
            t.read_errors_repaired += repaired;
            t.read_errors_left += left;
        });
        self.counters.errors_corrected += repaired;
        rewrite
    }

    /// A stripe with `absent` chunks (fewer than the parity chunks) and no read error: the
    /// absent chunks are computed, parity is recomputed from the data, and every parity chunk
    /// present is compared. A mismatch is counted, not repaired (see the module).
    fn scrub_degraded(&mut self, op_slot: usize, absent: ChunkSet, len: usize) {
        let m = self.geometry.parity_chunks();
        if absent.count_ones() as usize >= m {
            // Nothing left to check with (a member went out during the scrub, which stops
            // at its next step and says why): not checked.
            self.tally(|t| t.unreadable += 1);
            return;
        }
        self.reconstruct_in_scratch(op_slot, absent, absent, len);
        if self.parity_rows_disagree(op_slot, absent) {
            self.tally(|t| t.mismatches += 1);
        }
    }

    /// Parity recomputed from the data chunks in scratch (some of them computed) disagrees
    /// with a parity chunk that was read and is not in `erased`.
    pub(super) fn parity_rows_disagree(&mut self, op_slot: usize, erased: ChunkSet) -> bool {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        self.encode_parity_in_scratch(op_slot);
        let op = self.ops[op_slot].as_ref().expect("live");
        let (head, extra) = op.scratch.split_at(MEMBERS_MAX);
        (0..m).filter(|&r| !has(erased, k + r)).any(|r| {
            head[k + r].as_ref().expect("parity").as_slice()
                != extra[r].as_ref().expect("computed").as_slice()
        })
    }

    /// The one chunk whose replacement by what the others say makes the stripe consistent,
    /// with that replacement; `None` when no single chunk (or more than one) does.
    fn locate_bad_chunk(&mut self, op_slot: usize) -> Option<(usize, Vec<u8>)> {
        let k = self.geometry.data_chunks();
        let m = self.geometry.parity_chunks();
        let codec = self.codec.expect("parity level");
        let len = usize::try_from(self.geometry.chunk_bytes()).expect("fits");
        let mut found: Option<(usize, Vec<u8>)> = None;
        for candidate in 0..k + m {
            self.plan_for(bit(candidate), bit(candidate));
            let plan = self.plans.get(&(bit(candidate), bit(candidate))).expect("just planned");
            let op = self.ops[op_slot].as_ref().expect("live");
            let chunk = |c: usize| &op.scratch[c].as_ref().expect("read").as_slice()[..len];
            let sources: Vec<&[u8]> = plan.sources().iter().map(|&c| chunk(c)).collect();
            let mut rebuilt = vec![0u8; len];
            codec
                .reconstruct_from(plan, &sources, &mut [&mut rebuilt[..]], Stores::Cached)
                .expect("shapes");
            // The stripe with the candidate replaced: consistent?
            let data: Vec<&[u8]> =
                (0..k).map(|i| if i == candidate { &rebuilt[..] } else { chunk(i) }).collect();
            let mut parity: Vec<Vec<u8>> = vec![vec![0u8; len]; m];
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            codec.encode(&data, &mut outs, Stores::Cached).expect("shapes");
            let consistent = (0..m).all(|r| {
                let stored = if k + r == candidate { &rebuilt[..] } else { chunk(k + r) };
                parity[r] == stored
            });
            if consistent {
                if found.is_some() {
                    return None;
                }
                found = Some((candidate, rebuilt));
            }
        }
        found
    }

    /// Mirrors, unit by unit (4 KiB): each data position's readable copies are compared;
    /// the value most of them hold wins (ties: the lowest member). A copy that differs is a
    /// mismatch, rewritten in repair mode. A unit a copy cannot read is rewritten (never on a
    /// read-only array) only when most readable copies agree on it: where they disagree,
    /// which one to copy is not known (found by review: a corrupted copy was copied over a
    /// good copy's bad sector, and whole-chunk votes let a copy wrong in one place outvote
    /// two copies right at every byte). A unit no copy can read is left alone.
    /// `bad`: per member, the units not read (every unit of an `absent` copy, on a member
    /// out of service, never written).
    fn scrub_mirror(
        &mut self,
        op_slot: usize,
        bad: &[Units; MEMBERS_MAX],
        absent: ChunkSet,
        units: usize,
    ) -> ChunkSet {
        let n = self.geometry.member_count();
        let unit = usize::try_from(UNIT_BYTES).expect("fits");
        let read_only = self.is_read_only();
        let repairs = self.scrub_repairs();
        let (mut mismatch, mut unreadable) = (false, false);
        let mut decided = [Units::default(); MEMBERS_MAX];
        let members = |set: ChunkSet| (0..n).filter(move |&o| has(set, o));
        for c in 0..n {
            let op = self.ops[op_slot].as_ref().expect("live");
            let Some(i) = self.data_position(op, c) else { continue };
            // The copies of data position `i`, as member bitmasks (no allocation per stripe).
            let copies: ChunkSet =
                (0..n).filter(|&o| self.data_position(op, o) == Some(i)).fold(0, |s, o| s | bit(o));
            if c != copies.trailing_zeros() as usize {
                continue; // each data position once, from its first copy
            }
            let op = self.ops[op_slot].as_mut().expect("live");
            for u in 0..units {
                let range = u * unit..(u + 1) * unit;
                let readable =
                    members(copies).filter(|&o| !bad[o].contains(u)).fold(0, |s, o| s | bit(o));
                if readable == 0 {
                    unreadable = true;
                    continue;
                }
                let buf =
                    |o: usize| &op.scratch[o].as_ref().expect("read").as_slice()[range.clone()];
                let votes = |a: usize| members(readable).filter(|&b| buf(b) == buf(a)).count();
                let winner = members(readable)
                    .max_by_key(|&a| (votes(a), usize::MAX - a))
                    .expect("readable");
                let majority = 2 * votes(winner) > readable.count_ones() as usize;
                let mut mine: ChunkSet = 0;
                for o in members(copies & !absent) {
                    if bad[o].contains(u) {
                        if majority && !read_only {
                            mine |= bit(o);
                        }
                    } else if buf(o) != buf(winner) {
                        mismatch = true;
                        if repairs {
                            mine |= bit(o);
                        }
                    }
                }
                // The rewritten copies take the winner's bytes.
                let source = op.scratch[winner].take().expect("read");
                for o in members(mine) {
                    op.scratch[o].as_mut().expect("read").as_mut_slice()[range.clone()]
                        .copy_from_slice(&source.as_slice()[range.clone()]);
                    decided[o].insert(u);
                }
                op.scratch[winner] = Some(source);
            }
        }
        let in_service = (0..n).filter(|&o| !has(absent, o)).fold(0, |s, o| s | bit(o));
        let rewrite = self.settle_units(op_slot, in_service, units, bad, &decided);
        self.tally(|t| {
            t.mismatches += u64::from(mismatch);
            t.unreadable += u64::from(unreadable);
            t.repaired += u64::from(mismatch && repairs);
        });
        rewrite
    }

    /// Write the units of the chunks `scrub_after_reads` corrected (`op.units`), from
    /// their own scratch buffers.
    pub(super) fn scrub_issue(&mut self, op_slot: usize) {
        let rewrite = self.ops[op_slot].as_ref().expect("live").repaired;
        let source: [usize; MEMBERS_MAX] = std::array::from_fn(|c| c);
        self.issue_unit_rewrites(op_slot, rewrite, &source, UNIT_BYTES);
    }
}
