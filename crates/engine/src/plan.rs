//! Write planning for parity stripes: which chunks to read, over which bytes, before the
//! writes. Pure functions of the stripe's shape, what is being written and which members are
//! unavailable.
//!
//! The three ways to write part of a stripe, with k data and m parity chunks, t of the data
//! chunks touched:
//! - full-stripe: every data chunk is overwritten over the range: no reads, parity from the
//!   new data alone;
//! - read-modify-write (RMW): read the old touched data and the old parity, apply the delta:
//!   t + m reads;
//! - reconstruct-write (RCW): read the data chunks not fully overwritten and compute parity
//!   afresh: k - (fully covered) reads.
//!
//! The planner picks the feasible way with the fewest reads (ties go to RCW, which does not
//! depend on the old parity being right). With members unavailable: RMW needs every touched
//! data chunk readable; if a data chunk whose old contents are needed is unavailable, the
//! stripe is written "degraded": read every available chunk, reconstruct the missing old
//! data, then recompute parity. Parity chunks on unavailable members are simply not written.
//!
//! Chunk indices: `0..k` are data positions, `k + r` is parity row r; sets of chunk indices are
//! bitmasks (at most 64 members).

use flashraid_layout::PARITY_CHUNKS_MAX;

/// A byte range within a chunk: `lo..hi`, non-empty, 4 KiB-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRange {
    pub lo: u32,
    pub hi: u32,
}

impl ChunkRange {
    pub fn new(lo: u32, hi: u32) -> Self {
        assert!(lo < hi, "empty chunk range {lo}..{hi}");
        Self { lo, hi }
    }

    /// Bytes in the range; never zero (`new` refuses empty ranges).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u32 {
        self.hi - self.lo
    }

    pub fn union(self, other: ChunkRange) -> ChunkRange {
        ChunkRange { lo: self.lo.min(other.lo), hi: self.hi.max(other.hi) }
    }

    pub fn contains(&self, other: ChunkRange) -> bool {
        self.lo <= other.lo && other.hi <= self.hi
    }

    pub fn overlaps(&self, other: ChunkRange) -> bool {
        self.lo < other.hi && other.lo < self.hi
    }

    /// `usize` offsets of `inner` relative to the start of `self`.
    pub fn relative(&self, inner: ChunkRange) -> std::ops::Range<usize> {
        assert!(self.contains(inner));
        let lo = usize::try_from(inner.lo - self.lo).expect("u32 fits usize");
        lo..lo + usize::try_from(inner.len()).expect("u32 fits usize")
    }
}

/// Which way a stripe is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    FullStripe,
    ReadModifyWrite,
    ReconstructWrite,
    /// Reconstruct missing old data first (an unavailable member holds data we need).
    Degraded,
    /// Every parity row is on a member out of service: nothing to keep consistent, so the
    /// new data is written as it is, with no reads and no parity.
    DataOnly,
}

/// Bitmask of chunk indices.
pub type ChunkSet = u64;

pub fn has(set: ChunkSet, chunk: usize) -> bool {
    set & (1u64 << chunk) != 0
}

pub fn bit(chunk: usize) -> ChunkSet {
    1u64 << chunk
}

/// Bytes of one unit of a chunk (`Units`): a 4 KiB block, the array's own block size.
pub const UNIT_BYTES: u32 = 4096;
/// Words of a `Units` set: one bit per unit of the largest chunk.
const UNIT_WORDS: usize = (flashraid_layout::CHUNK_BYTES_MAX / UNIT_BYTES) as usize / 64;

/// A set of 4 KiB units of one chunk (bit `u`: bytes `u * UNIT_BYTES..`), for the few places
/// that act on less than a chunk after an error (resync's probe of a chunk that failed to
/// read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Units([u64; UNIT_WORDS]);

impl Units {
    /// The first `count` units.
    pub fn first(count: usize) -> Units {
        let mut set = Units::default();
        for u in 0..count {
            set.insert(u);
        }
        set
    }

    pub fn insert(&mut self, unit: usize) {
        self.0[unit / 64] |= 1u64 << (unit % 64);
    }

    pub fn contains(&self, unit: usize) -> bool {
        self.0[unit / 64] >> (unit % 64) & 1 == 1
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// The bytes of `range` that lie in units of the set, as ranges, lowest first (runs of
    /// units clipped to `range`).
    pub fn pieces(&self, range: ChunkRange) -> impl Iterator<Item = ChunkRange> + '_ {
        self.runs().filter_map(move |(first, count)| {
            let at = |unit: usize| u32::try_from(unit).expect("fits") * UNIT_BYTES;
            let lo = at(first).max(range.lo);
            let hi = at(first + count).min(range.hi);
            (lo < hi).then(|| ChunkRange::new(lo, hi))
        })
    }

    /// The units in both sets.
    pub fn intersection(&self, other: &Units) -> Units {
        Units(std::array::from_fn(|w| self.0[w] & other.0[w]))
    }

    /// Whether any unit of the set holds bytes of `range`.
    pub fn touches(&self, range: ChunkRange) -> bool {
        self.pieces(range).next().is_some()
    }

    /// Runs of neighbouring units, as (first unit, count), lowest first.
    pub fn runs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let units = UNIT_WORDS * 64;
        let mut at = 0;
        std::iter::from_fn(move || {
            while at < units && !self.contains(at) {
                at += 1;
            }
            if at == units {
                return None;
            }
            let first = at;
            while at < units && self.contains(at) {
                at += 1;
            }
            Some((first, at - first))
        })
    }
}

/// The plan for one stripe write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePlan {
    pub kind: WriteKind,
    /// The union of the touched ranges: parity is computed and written over it.
    pub range: ChunkRange,
    /// Chunks to read: data chunks over their touched range (RMW) or over `range`, parity
    /// over `range`.
    pub reads: ChunkSet,
    /// Data chunks to reconstruct over `range` from the reads (degraded only).
    pub reconstruct: ChunkSet,
}

impl WritePlan {
    pub fn read_count(&self) -> u32 {
        self.reads.count_ones()
    }
}

/// Too many members are unavailable for this stripe to be written consistently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unwritable;

/// Plan a write of `touched` (per data position: the range written, if any) into a stripe of
/// `touched.len()` data and `parity` parity chunks. Chunks in `unavailable` cannot be read
/// (their member is gone, or returned a read error in this operation); of those, the ones in
/// `gone` cannot be written either. `recompute` forbids RMW (the stripe's parity is not
/// trusted, e.g. a region being resynced).
///
/// A parity chunk that cannot be read but can be written rules out RMW: RMW derives new parity
/// from the old, so that row would be written wrong. RCW recomputes it, which also repairs it.
pub fn plan_write(
    touched: &[Option<ChunkRange>],
    parity: usize,
    unavailable: ChunkSet,
    gone: ChunkSet,
    recompute: bool,
) -> Result<WritePlan, Unwritable> {
    assert_eq!(gone & !unavailable, 0, "a chunk that cannot be written cannot be read either");
    let k = touched.len();
    assert!((1..=PARITY_CHUNKS_MAX).contains(&parity) && k + parity <= 64);
    let range =
        touched.iter().flatten().copied().reduce(ChunkRange::union).expect("something is written");
    let parity_set: ChunkSet = (k..k + parity).fold(0, |s, c| s | bit(c));
    let touched_set: ChunkSet = (0..k).filter(|&i| touched[i].is_some()).fold(0, |s, i| s | bit(i));
    if parity_set & !gone == 0 {
        // No parity row can be written. Reads for parity would be wasted, and worse, a read
        // error on an untouched chunk would fail the write (found by review). A touched
        // chunk that cannot be written is lost.
        if touched_set & gone != 0 {
            return Err(Unwritable);
        }
        return Ok(WritePlan { kind: WriteKind::DataOnly, range, reads: 0, reconstruct: 0 });
    }
    if unavailable.count_ones() as usize > parity {
        return Err(Unwritable);
    }
    let covers = |i: usize| touched[i] == Some(range);
    let needs_old: ChunkSet = (0..k).filter(|&i| !covers(i)).fold(0, |s, i| s | bit(i));
    let missing_old = needs_old & unavailable;
    let all_chunks: ChunkSet = if k + parity == 64 { u64::MAX } else { (1u64 << (k + parity)) - 1 };
    if missing_old != 0 {
        return Ok(WritePlan {
            kind: WriteKind::Degraded,
            range,
            reads: all_chunks & !unavailable,
            reconstruct: missing_old,
        });
    }
    let rcw_reads = needs_old;
    if rcw_reads == 0 {
        return Ok(WritePlan { kind: WriteKind::FullStripe, range, reads: 0, reconstruct: 0 });
    }
    let rmw_reads = touched_set | (parity_set & !unavailable);
    let unreadable_parity_to_write = parity_set & unavailable & !gone;
    let rmw_feasible =
        !recompute && touched_set & unavailable == 0 && unreadable_parity_to_write == 0;
    if rmw_feasible && rmw_reads.count_ones() < rcw_reads.count_ones() {
        return Ok(WritePlan {
            kind: WriteKind::ReadModifyWrite,
            range,
            reads: rmw_reads,
            reconstruct: 0,
        });
    }
    Ok(WritePlan { kind: WriteKind::ReconstructWrite, range, reads: rcw_reads, reconstruct: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(lo_kib: u32, hi_kib: u32) -> Option<ChunkRange> {
        Some(ChunkRange::new(lo_kib * 1024, hi_kib * 1024))
    }

    #[test]
    fn full_stripe_needs_no_reads() {
        let touched = vec![r(0, 16); 6];
        let plan = plan_write(&touched, 2, 0, 0, false).unwrap();
        assert_eq!(plan.kind, WriteKind::FullStripe);
        assert_eq!(plan.reads, 0);
        // Also when every chunk is written over the same sub-range.
        let touched = vec![r(4, 8); 6];
        assert_eq!(plan_write(&touched, 2, 0, 0, false).unwrap().kind, WriteKind::FullStripe);
    }

    #[test]
    fn every_parity_row_gone_writes_data_only_with_no_reads() {
        // 2+1 with the parity member gone and the other data chunk unreadable: data only.
        let touched = vec![r(0, 4), None];
        let plan = plan_write(&touched, 1, bit(1) | bit(2), bit(2), false).unwrap();
        assert_eq!((plan.kind, plan.reads), (WriteKind::DataOnly, 0));
        // 4+2 with P and Q gone: data only; a touched chunk gone too: unwritable.
        let touched = vec![r(0, 16), r(0, 16), r(0, 16), None];
        let gone = bit(4) | bit(5);
        let plan = plan_write(&touched, 2, gone | bit(3), gone, false).unwrap();
        assert_eq!((plan.kind, plan.reads), (WriteKind::DataOnly, 0));
        assert_eq!(plan_write(&touched, 2, gone | bit(0), gone | bit(0), false), Err(Unwritable));
        // One row left: planned as before.
        let plan = plan_write(&touched, 2, bit(4), bit(4), false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
    }

    #[test]
    fn small_write_on_a_wide_stripe_is_rmw() {
        // 10+2, one 4 KiB write: RMW reads 1 + 2 = 3, RCW would read 9.
        let mut touched = vec![None; 10];
        touched[3] = r(4, 8);
        let plan = plan_write(&touched, 2, 0, 0, false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReadModifyWrite);
        assert_eq!(plan.reads, bit(3) | bit(10) | bit(11));
    }

    #[test]
    fn mostly_full_write_is_rcw() {
        // 6+2 with 5 chunks written: RCW reads 1, RMW would read 7.
        let mut touched = vec![r(0, 16); 6];
        touched[5] = None;
        let plan = plan_write(&touched, 2, 0, 0, false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(plan.reads, bit(5));
    }

    #[test]
    fn recompute_forbids_rmw() {
        let mut touched = vec![None; 10];
        touched[3] = r(0, 4);
        let plan = plan_write(&touched, 2, 0, 0, true).unwrap();
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(plan.read_count(), 9);
    }

    #[test]
    fn unavailable_touched_chunk_forces_rcw() {
        // The touched chunk's member is gone: its old data cannot be read for RMW, but it is
        // fully overwritten, so RCW over the others works without reconstruction.
        let mut touched = vec![None; 4];
        touched[1] = r(0, 16);
        let plan = plan_write(&touched, 2, bit(1), bit(1), false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(plan.reads, bit(0) | bit(2) | bit(3));
    }

    #[test]
    fn unavailable_untouched_chunk_needs_reconstruction() {
        let mut touched = vec![None; 4];
        touched[1] = r(0, 4);
        // Data chunk 2 is gone and not written: parity needs its old contents.
        let plan = plan_write(&touched, 2, bit(2), bit(2), false).unwrap();
        assert_eq!(plan.kind, WriteKind::Degraded);
        assert_eq!(plan.reconstruct, bit(2));
        assert_eq!(plan.reads, 0b111011);
        // A gone parity chunk is just not written: RMW still works.
        let plan = plan_write(&touched, 2, bit(5), bit(5), false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReadModifyWrite);
        assert_eq!(plan.reads, bit(1) | bit(4));
    }

    #[test]
    fn an_unreadable_but_writable_parity_chunk_rules_out_rmw() {
        // Parity read failed (a bad sector) but its member is alive: RMW would write garbage
        // parity; RCW recomputes (and so repairs) it.
        let mut touched = vec![None; 4];
        touched[0] = r(0, 16);
        let plan = plan_write(&touched, 1, bit(4), 0, false).unwrap();
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(plan.reads, bit(1) | bit(2) | bit(3));
        // When its member is gone instead, there is no parity to keep: data only, no reads.
        let plan = plan_write(&touched, 1, bit(4), bit(4), false).unwrap();
        assert_eq!((plan.kind, plan.reads), (WriteKind::DataOnly, 0));
    }

    #[test]
    fn beyond_tolerance_is_unwritable() {
        let touched = vec![r(0, 4), None, None, None];
        assert_eq!(
            plan_write(&touched, 2, bit(1) | bit(2) | bit(3), bit(1) | bit(2) | bit(3), false),
            Err(Unwritable)
        );
    }

    /// The chosen plan never reads more than the other feasible plan and never reads an
    /// unavailable chunk.
    #[test]
    fn plans_are_minimal_and_feasible_exhaustively() {
        let k = 5;
        let m = 2;
        let ranges = [None, r(0, 4), r(4, 8), r(0, 8)];
        let mut cases = 0;
        for pattern in 0..4usize.pow(k as u32) {
            let touched: Vec<Option<ChunkRange>> =
                (0..k).map(|i| ranges[(pattern / 4usize.pow(i as u32)) % 4]).collect();
            if touched.iter().all(|t| t.is_none()) {
                continue;
            }
            // Every chunk is readable, errored (unreadable but writable), or gone.
            for states in 0..3usize.pow((k + m) as u32) {
                let state = |c: usize| (states / 3usize.pow(c as u32)) % 3;
                let unavailable: ChunkSet =
                    (0..k + m).filter(|&c| state(c) > 0).fold(0, |s, c| s | bit(c));
                let gone: ChunkSet =
                    (0..k + m).filter(|&c| state(c) == 2).fold(0, |s, c| s | bit(c));
                let Ok(plan) = plan_write(&touched, m, unavailable, gone, false) else {
                    assert!(unavailable.count_ones() > m as u32);
                    continue;
                };
                cases += 1;
                assert_eq!(plan.reads & unavailable, 0, "reads an unavailable chunk");
                if plan.kind == WriteKind::ReadModifyWrite {
                    let rcw = (0..k).filter(|&i| touched[i] != Some(plan.range)).count();
                    assert!(plan.read_count() < rcw as u32);
                    let parity: ChunkSet = (k..k + m).fold(0, |s, c| s | bit(c));
                    assert_eq!(parity & !gone & !plan.reads, 0, "RMW would write unread parity");
                }
            }
        }
        assert!(cases > 10_000);
    }
}

#[cfg(test)]
mod unit_tests {
    use super::{ChunkRange, Units};

    #[test]
    fn units_are_sets_with_runs() {
        let mut u = Units::default();
        assert!(u.is_empty());
        for x in [0, 1, 2, 63, 64, 200, 255] {
            u.insert(x);
        }
        assert!(u.contains(64) && !u.contains(65) && !u.is_empty());
        assert_eq!(u.runs().collect::<Vec<_>>(), vec![(0, 3), (63, 2), (200, 1), (255, 1)]);
        assert_eq!(Units::first(256).runs().collect::<Vec<_>>(), vec![(0, 256)]);
        assert_eq!(Units::first(4).runs().collect::<Vec<_>>(), vec![(0, 4)]);
    }

    #[test]
    fn pieces_are_the_runs_clipped_to_a_range() {
        let mut u = Units::default();
        for x in [1, 2, 5] {
            u.insert(x);
        }
        let k = |lo: u32, hi: u32| ChunkRange::new(lo * 4096, hi * 4096);
        assert_eq!(u.pieces(k(0, 8)).collect::<Vec<_>>(), vec![k(1, 3), k(5, 6)]);
        assert_eq!(u.pieces(k(2, 5)).collect::<Vec<_>>(), vec![k(2, 3)]);
        let inside = ChunkRange::new(4096 + 512, 8192 - 512);
        assert_eq!(u.pieces(inside).collect::<Vec<_>>(), vec![inside]);
        assert!(u.touches(k(0, 2)) && !u.touches(k(3, 5)) && !u.touches(k(6, 64)));
        assert!(!Units::default().touches(k(0, 64)));
    }
}
