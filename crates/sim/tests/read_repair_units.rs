//! A client read over a bad sector, with another chunk of the stripe silently wrong (a lost
//! write): the member read that failed is read again in 4 KiB units, so only the unit that
//! cannot be read comes from redundancy and is rewritten; the readable blocks beside it are
//! returned as read and never written. (Before, the whole range the failed IO covered was
//! rebuilt from the first parity rows, or read from another mirror copy, returned, and
//! written back: with a wrong parity row or a stale copy, readable, correct blocks came back
//! wrong and were rewritten wrong. Each test here failed against that.)
//!
//! Then the same in every later round of an operation: a mirror copy tried after the first
//! one left service, a reconstruction source, a write's re-planned reads are each read
//! again in 4 KiB units too, so a unit readable anywhere is returned, and only units that
//! fail everywhere are recovered and rewritten. (Found by a third review, 2026-11-25: only
//! an operation's first round was read again in units; each g1-g6 test failed before the
//! fix, g3_control and g7 are controls.)

use flashraid_control::Init;
use flashraid_layout::{Level, Location, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

const UNIT: u64 = 4096;

fn setup(seed: u64, level: Level, n: usize, chunk: u64) -> (SimArray, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, n);
    o.member_bytes = 4 << 20;
    o.chunk_bytes = chunk;
    o.shards = 1;
    o.init = Init::Zero;
    o.config.member_read_errors_max = 1_000_000;
    let mut array = SimArray::create(o).unwrap();
    let model = array.fill_random(&mut rng);
    array.run_until_idle();
    (array, model)
}

fn bad_ranges(array: &SimArray, member: usize) -> Vec<(u64, u64)> {
    array.role_device(member).unwrap().state().bad_ranges.clone()
}

/// Parity levels, 16 KiB and 256 KiB chunks: the first parity row (the one a single missing
/// chunk is rebuilt from) silently wrong in unit 1 of a stripe, a bad sector in unit 0 of
/// data chunk 0. A read of that whole data chunk returns the model; the data member keeps
/// its readable units byte for byte; its bad unit is rewritten with the right data.
#[test]
fn parity_read_over_a_bad_sector_keeps_the_readable_blocks_beside_it() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid7_3, 7)] {
        for chunk in [16u64 << 10, 256 << 10] {
            let what = format!("{level} chunk {chunk}");
            let (mut array, model) = setup(7, level, n, chunk);
            let g = array.geometry();
            let stripe = 5u64;
            let at = array.chunk_offset(stripe);
            let parity = g.parity_member(StripeIndex(stripe), 0).get();
            let member = array.data_role(stripe, 0);
            array.flip_member_bytes(parity, at + UNIT + 100, 16);
            let readable_before = array.member_bytes(member, at + UNIT, chunk - UNIT);
            array.role_device(member).unwrap().state().bad_ranges.push((at, UNIT));
            let off = off_of(&array, stripe, 0, 0);
            let got = array.read(off, chunk).unwrap();
            let want = &model[off as usize..(off + chunk) as usize];
            let wrong = (0..chunk as usize).filter(|&b| got[b] != want[b]).count();
            assert_eq!(wrong, 0, "{what}: the read returned {wrong} wrong bytes");
            array.run_until_idle();
            assert!(
                array.member_bytes(member, at + UNIT, chunk - UNIT) == readable_before,
                "{what}: the readable blocks beside the bad sector were rewritten"
            );
            assert!(
                array.member_bytes(member, at, UNIT) == want[..UNIT as usize],
                "{what}: the bad unit was not rewritten with its data"
            );
            assert!(bad_ranges(&array, member).is_empty(), "{what}: the bad sector stays");
            assert!(array.counters().errors_corrected >= 1, "{what}: no correction counted");
        }
    }
}

/// Mirrors (RAID 1 x2, RAID 10): the copy a read goes to has a bad sector in unit 0 of a
/// chunk; the other copy is stale (silently wrong) in unit 2. The read returns the model (the
/// readable units come from the copy read), and the copy read keeps its readable units; only
/// its bad unit takes the other copy's bytes, which are right there.
#[test]
fn mirror_read_over_a_bad_sector_keeps_the_readable_blocks_of_the_copy_read() {
    for (level, n) in [(Level::Raid1, 2), (Level::Raid10, 4)] {
        let chunk = 16u64 << 10;
        let what = format!("{level}");
        let (mut array, model) = setup(8, level, n, chunk);
        let g = array.geometry();
        let stripe = 6u64;
        let at = array.chunk_offset(stripe);
        let copies = g.copies();
        // The copy a healthy read of this stripe goes to first (reads rotate by stripe).
        let first = g.data_member(StripeIndex(stripe), 0, (stripe % copies as u64) as usize).get();
        let other = (0..copies)
            .map(|c| g.data_member(StripeIndex(stripe), 0, c).get())
            .find(|&m| m != first)
            .unwrap();
        array.flip_member_bytes(other, at + 2 * UNIT + 50, 16);
        let first_before = array.member_bytes(first, at + UNIT, chunk - UNIT);
        array.role_device(first).unwrap().state().bad_ranges.push((at, UNIT));
        let off = off_of(&array, stripe, 0, 0);
        let got = array.read(off, chunk).unwrap();
        let want = &model[off as usize..(off + chunk) as usize];
        let wrong = (0..chunk as usize).filter(|&b| got[b] != want[b]).count();
        assert_eq!(wrong, 0, "{what}: the read returned {wrong} wrong bytes");
        array.run_until_idle();
        assert!(
            array.member_bytes(first, at + UNIT, chunk - UNIT) == first_before,
            "{what}: the readable blocks of the copy read were overwritten by the other copy"
        );
        assert!(array.member_bytes(first, at, UNIT) == want[..UNIT as usize], "{what}: not healed");
        assert!(bad_ranges(&array, first).is_empty(), "{what}: the bad sector stays");
    }
}

/// A read error that does not happen again (a transient fault): the units read again all
/// read, the read returns the model, and nothing is rebuilt or written.
#[test]
fn a_transient_read_error_is_read_again_and_nothing_is_rewritten() {
    for (level, n) in [(Level::Raid6, 6), (Level::Raid1, 2)] {
        let chunk = 64u64 << 10;
        let what = format!("{level}");
        let (mut array, model) = setup(9, level, n, chunk);
        let g = array.geometry();
        let stripe = 3u64;
        let off = off_of(&array, stripe, 0, 0);
        let writes_before: Vec<u64> =
            (0..n).map(|m| array.role_device(m).unwrap().state().writes).collect();
        let member = if level == Level::Raid1 {
            g.data_member(StripeIndex(stripe), 0, (stripe % 2) as usize).get()
        } else {
            array.data_role(stripe, 0)
        };
        array.role_device(member).unwrap().state().transient_read_errors = 1;
        let got = array.read(off, chunk).unwrap();
        assert!(got == model[off as usize..(off + chunk) as usize], "{what}: wrong data");
        array.run_until_idle();
        let writes_after: Vec<u64> =
            (0..n).map(|m| array.role_device(m).unwrap().state().writes).collect();
        assert_eq!(writes_before, writes_after, "{what}: a transient error rewrote something");
        assert_eq!(array.counters().degraded_reads, 0, "{what}: rebuilt from redundancy");
    }
}

/// RAID 1 with three copies. Copy A (read first) has bad units 1 and 3 of a chunk, copy B
/// (the next one tried) a bad unit 1, copy C a bad unit 3. Every unit is readable on some
/// copy (unit 1 on C, unit 3 on B), so the read succeeds with the model. (Found by review:
/// B was read in runs of units, so its failed run sent unit 3 on to C too, which failed it.)
#[test]
fn raid1_x3_units_bad_on_two_other_copies_in_different_units_are_still_read() {
    let chunk = 16u64 << 10;
    let (mut array, model) = setup(11, Level::Raid1, 3, chunk);
    let g = array.geometry();
    let stripe = 6u64;
    let at = array.chunk_offset(stripe);
    let copies = g.copies();
    let start = (stripe % copies as u64) as usize;
    let order: Vec<usize> = (0..copies)
        .map(|c| g.data_member(StripeIndex(stripe), 0, (start + c) % copies).get())
        .collect();
    let (a, b, c) = (order[0], order[1], order[2]);
    array
        .role_device(a)
        .unwrap()
        .state()
        .bad_ranges
        .extend([(at + UNIT, UNIT), (at + 3 * UNIT, UNIT)]);
    array.role_device(b).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
    array.role_device(c).unwrap().state().bad_ranges.push((at + 3 * UNIT, UNIT));
    let off = off_of(&array, stripe, 0, 0);
    let got = array.read(off, chunk);
    let want = &model[off as usize..(off + chunk) as usize];
    match got {
        Ok(got) => assert!(got == want, "wrong data"),
        Err(e) => {
            panic!("read failed ({e:?}) though every unit reads on some copy (A={a} B={b} C={c})")
        }
    }
}

/// RAID 1 with three copies: copy A bad in units 1 and 2 (one run), copy B bad in unit 1
/// only, copy C stale (silently wrong) in unit 2. Unit 2 reads on B: B's readable unit is
/// replaced by C's neither in the reply nor on B. (Found by review: both were.)
#[test]
fn raid1_x3_a_readable_unit_of_the_second_copy_is_kept() {
    let chunk = 16u64 << 10;
    let (mut array, model) = setup(12, Level::Raid1, 3, chunk);
    let g = array.geometry();
    let stripe = 6u64;
    let at = array.chunk_offset(stripe);
    let copies = g.copies();
    let start = (stripe % copies as u64) as usize;
    let order: Vec<usize> = (0..copies)
        .map(|c| g.data_member(StripeIndex(stripe), 0, (start + c) % copies).get())
        .collect();
    let (a, b, c) = (order[0], order[1], order[2]);
    {
        let d = array.role_device(c).unwrap();
        let mut s = d.state();
        for x in 0..16 {
            s.current[(at + 2 * UNIT + 50) as usize + x] ^= 0x5a;
            s.durable[(at + 2 * UNIT + 50) as usize + x] ^= 0x5a;
        }
    }
    let b_unit2 = array.role_device(b).unwrap().state().current
        [(at + 2 * UNIT) as usize..(at + 3 * UNIT) as usize]
        .to_vec();
    array.role_device(a).unwrap().state().bad_ranges.push((at + UNIT, 2 * UNIT));
    array.role_device(b).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
    let off = off_of(&array, stripe, 0, 0);
    let got = array.read(off, chunk).unwrap();
    array.run_until_idle();
    let want = &model[off as usize..(off + chunk) as usize];
    let wrong = (0..chunk as usize).filter(|&x| got[x] != want[x]).count();
    let b_after = array.role_device(b).unwrap().state().current
        [(at + 2 * UNIT) as usize..(at + 3 * UNIT) as usize]
        .to_vec();
    assert!(
        b_after == b_unit2,
        "copy B's readable unit 2 was rewritten with copy C's (stale) bytes"
    );
    assert_eq!(wrong, 0, "the read returned {wrong} wrong bytes (C's stale unit instead of B's)");
}

/// A write that reads a chunk it does not touch (reconstruct-write) meets a bad sector in
/// one unit of it; the first parity row is silently wrong in another unit. The chunk's
/// readable units hold client data that survive the write unchanged: the failed read is
/// read again in units, and of the chunk rebuilt for the write only the unit that failed is
/// written back. (Found by review: the whole range was, from the wrong parity row.)
#[test]
fn a_write_over_a_bad_sector_of_an_untouched_chunk_keeps_its_readable_blocks() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6)] {
        let chunk = 16u64 << 10;
        let what = format!("{level}");
        let (mut array, mut model) = setup(13, level, n, chunk);
        let g = array.geometry();
        let k = g.data_chunks();
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let parity = g.parity_member(StripeIndex(stripe), 0).get();
        let c = array.data_role(stripe, k - 1);
        {
            let d = array.role_device(parity).unwrap();
            let mut s = d.state();
            for x in 0..16 {
                s.current[(at + 2 * UNIT + 50) as usize + x] ^= 0x5a;
                s.durable[(at + 2 * UNIT + 50) as usize + x] ^= 0x5a;
            }
        }
        let c_readable = array.role_device(c).unwrap().state().current
            [(at + UNIT) as usize..(at + chunk) as usize]
            .to_vec();
        array.role_device(c).unwrap().state().bad_ranges.push((at, UNIT));
        let off = off_of(&array, stripe, 0, 0);
        // Every data chunk but the last, whole: reconstruct-write reads the last one.
        let len = (k as u64 - 1) * chunk;
        let data = vec![0xabu8; len as usize];
        array.write(off, &data).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        array.run_until_idle();
        let c_after = array.role_device(c).unwrap().state().current
            [(at + UNIT) as usize..(at + chunk) as usize]
            .to_vec();
        let changed = (0..c_after.len()).filter(|&x| c_after[x] != c_readable[x]).count();
        let coff = off + len;
        let got = array.read(coff, chunk).unwrap();
        let want = &model[coff as usize..(coff + chunk) as usize];
        let wrong = (0..chunk as usize).filter(|&x| got[x] != want[x]).count();
        assert!(
            changed == 0 && wrong == 0,
            "{what}: the write rewrote {changed} readable bytes of the untouched chunk beside \
             its bad sector; a read of it now returns {wrong} wrong bytes"
        );
    }
}

fn off_of(array: &SimArray, stripe: u64, i: usize, in_chunk: u32) -> u64 {
    array
        .geometry()
        .array_offset(Location {
            stripe: StripeIndex(stripe),
            data_index: i,
            offset_in_chunk_bytes: in_chunk,
        })
        .0
}

fn order(array: &SimArray, stripe: u64) -> Vec<usize> {
    let g = array.geometry();
    let copies = g.copies();
    let start = (stripe % copies as u64) as usize;
    (0..copies).map(|c| g.data_member(StripeIndex(stripe), 0, (start + c) % copies).get()).collect()
}

/// RAID 1 x3: the copy read first vanishes (Gone) under the read; copy B has a bad unit 1,
/// copy C a bad unit 3. Every unit is readable on a copy in service, so the read
/// succeeds.
#[test]
fn g1_raid1_x3_first_copy_gone_then_units_bad_on_both_others() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, model) = setup(seed, Level::Raid1, 3, chunk);
        let stripe = 6u64;
        let at = array.chunk_offset(stripe);
        let o = order(&array, stripe);
        let (a, b, c) = (o[0], o[1], o[2]);
        array.role_device(b).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
        array.role_device(c).unwrap().state().bad_ranges.push((at + 3 * UNIT, UNIT));
        array.role_device(a).unwrap().state().gone = true;
        let off = off_of(&array, stripe, 0, 0);
        let got = array.read(off, chunk);
        let want = &model[off as usize..(off + chunk) as usize];
        match got {
            Ok(got) => assert!(got == want, "seed {seed}: wrong data"),
            Err(e) => panic!(
                "seed {seed}: read failed ({e:?}) though unit 1 reads on C and unit 3 on B (A={a} gone)"
            ),
        }
    }
}

/// RAID 1 x3: copy A vanishes under the read; copy B has a bad unit 1; copy C is stale in
/// unit 2. B's readable unit 2 is neither replaced in the reply nor rewritten on B.
#[test]
fn g2_raid1_x3_first_copy_gone_second_copy_readable_units_kept() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, model) = setup(seed, Level::Raid1, 3, chunk);
        let stripe = 6u64;
        let at = array.chunk_offset(stripe);
        let o = order(&array, stripe);
        let (a, b, c) = (o[0], o[1], o[2]);
        array.flip_member_bytes(c, at + 2 * UNIT + 50, 16);
        let b_before = array.member_bytes(b, at, chunk);
        array.role_device(b).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
        array.role_device(a).unwrap().state().gone = true;
        let off = off_of(&array, stripe, 0, 0);
        let got = array.read(off, chunk).unwrap();
        array.run_until_idle();
        let want = &model[off as usize..(off + chunk) as usize];
        let wrong = (0..chunk as usize).filter(|&x| got[x] != want[x]).count();
        let b_after = array.member_bytes(b, at, chunk);
        let changed = (0..chunk as usize)
            .filter(|&x| !(UNIT as usize..2 * UNIT as usize).contains(&x))
            .filter(|&x| b_after[x] != b_before[x])
            .count();
        assert!(
            wrong == 0 && changed == 0,
            "seed {seed}: reply has {wrong} wrong bytes; copy B had {changed} readable bytes \
             rewritten (with C's stale unit)"
        );
    }
}

/// RAID 5 x5 (4+1): a 4 KiB write to data chunk 0 (read-modify-write) whose old data has a
/// bad sector. The re-plan (reconstruct-write) reads chunk 1, which fails once (transient).
/// Nothing is actually unreadable beyond the unit the write overwrites: the write
/// succeeds.
#[test]
fn g3_raid5_rmw_bad_old_data_then_transient_on_replan_read_fails_the_write() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, mut model) = setup(seed, Level::Raid5, 5, chunk);
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let d0 = array.data_role(stripe, 0);
        let d1 = array.data_role(stripe, 1);
        array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(d1).unwrap().state().transient_read_errors = 1;
        let off = off_of(&array, stripe, 0, 0);
        let data = vec![0x3cu8; UNIT as usize];
        let r = array.write(off, &data);
        assert!(
            r.is_ok(),
            "seed {seed}: the write failed ({r:?}): a transient error on its re-plan's read"
        );
        model[off as usize..(off + UNIT) as usize].copy_from_slice(&data);
        array.run_until_idle();
        array.check_model(&model, "after");
    }
}

/// RAID 6 x7 (5+2): as g3; the re-plan's read of data chunk 1 fails once (transient), and
/// P is silently wrong in that range. Chunk 1 is readable, so it is not rewritten.
#[test]
fn g4_raid6_transient_on_replan_read_rewrites_a_readable_chunk() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, mut model) = setup(seed, Level::Raid6, 7, chunk);
        let g = array.geometry();
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let d0 = array.data_role(stripe, 0);
        let d1 = array.data_role(stripe, 1);
        let p = g.parity_member(StripeIndex(stripe), 0).get();
        let q = g.parity_member(StripeIndex(stripe), 1).get();
        let _ = q;
        array.flip_member_bytes(p, at + 100, 8);
        let d1_before = array.member_bytes(d1, at, chunk);
        let writes_before = array.role_device(d1).unwrap().state().writes;
        array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(d1).unwrap().state().transient_read_errors = 1;
        let off = off_of(&array, stripe, 0, 0);
        let data = vec![0x3cu8; UNIT as usize];
        let r = array.write(off, &data);
        array.run_until_idle();
        let writes_after = array.role_device(d1).unwrap().state().writes;
        let d1_after = array.member_bytes(d1, at, chunk);
        let changed = (0..chunk as usize).filter(|&x| d1_after[x] != d1_before[x]).count();
        assert!(r.is_ok(), "seed {seed}: write failed {r:?}");
        model[off as usize..(off + UNIT) as usize].copy_from_slice(&data);
        assert!(
            writes_after == writes_before && changed == 0,
            "seed {seed}: readable chunk 1 (transient error only) written {} times, {changed} bytes changed",
            writes_after - writes_before
        );
    }
}

/// Control for g3: the same write without the transient error succeeds.
#[test]
fn g3_control_without_the_transient_the_write_succeeds() {
    let chunk = 16u64 << 10;
    let (mut array, mut model) = setup(1, Level::Raid5, 5, chunk);
    let stripe = 5u64;
    let at = array.chunk_offset(stripe);
    let d0 = array.data_role(stripe, 0);
    array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
    let off = off_of(&array, stripe, 0, 0);
    let data = vec![0x3cu8; UNIT as usize];
    array.write(off, &data).unwrap();
    model[off as usize..(off + UNIT) as usize].copy_from_slice(&data);
    array.run_until_idle();
    array.check_model(&model, "after");
}

/// RAID 1 x3 with `member_read_errors_max` 0: copy A's first read error fails it (the
/// array survives), so it is not read again in units; B bad in unit 1, C bad in unit 3.
#[test]
fn g1b_raid1_x3_first_copy_failed_for_read_errors_then_units_bad_on_both_others() {
    let chunk = 16u64 << 10;
    let seed = 1u64;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, Level::Raid1, 3);
    o.member_bytes = 4 << 20;
    o.chunk_bytes = chunk;
    o.shards = 1;
    o.init = Init::Zero;
    o.config.member_read_errors_max = 1;
    let mut array = SimArray::create(o).unwrap();
    let model = array.fill_random(&mut rng);
    array.run_until_idle();
    // A's first error (stripe 9, read from A first too): counted, repaired, A kept.
    let warm = 9u64;
    let ord = order(&array, warm);
    let a9 = ord[0];
    let at9 = array.chunk_offset(warm);
    array.role_device(a9).unwrap().state().bad_ranges.push((at9, UNIT));
    let off9 = off_of(&array, warm, 0, 0);
    assert!(array.read(off9, chunk).unwrap() == model[off9 as usize..(off9 + chunk) as usize]);
    array.run_until_idle();
    assert!(array.member_failures().is_empty());
    let stripe = 6u64;
    let at = array.chunk_offset(stripe);
    let ord = order(&array, stripe);
    let (a, b, c) = (ord[0], ord[1], ord[2]);
    assert_eq!(a, a9);
    array.role_device(a).unwrap().state().bad_ranges.push((at + 2 * UNIT, UNIT));
    array.role_device(b).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
    array.role_device(c).unwrap().state().bad_ranges.push((at + 3 * UNIT, UNIT));
    let off = off_of(&array, stripe, 0, 0);
    let got = array.read(off, chunk);
    let want = &model[off as usize..(off + chunk) as usize];
    match got {
        Ok(got) => assert!(got == want, "wrong data"),
        Err(e) => panic!(
            "read failed ({e:?}) though every unit reads on some copy in service (A={a} failed: {:?})",
            array.member_failures()
        ),
    }
}

/// RAID 6 x7 (5+2): an 8 KiB write to data chunk 0 (read-modify-write), old data bad in
/// unit 0; the re-plan (reconstruct-write) reads data chunk 1, bad in unit 1 only; P is
/// silently wrong in unit 0. Chunk 1's unit 0 is readable: it keeps its bytes.
#[test]
fn g6_raid6_second_bad_chunk_on_replan_is_rebuilt_whole_over_readable_units() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, mut model) = setup(seed, Level::Raid6, 7, chunk);
        let g = array.geometry();
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let d0 = array.data_role(stripe, 0);
        let d1 = array.data_role(stripe, 1);
        let p = g.parity_member(StripeIndex(stripe), 0).get();
        array.flip_member_bytes(p, at + 100, 8);
        let d1_unit0 = array.member_bytes(d1, at, UNIT);
        array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(d1).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
        let off = off_of(&array, stripe, 0, 0);
        let data = vec![0x3cu8; 2 * UNIT as usize];
        array.write(off, &data).unwrap();
        model[off as usize..(off + 2 * UNIT) as usize].copy_from_slice(&data);
        array.run_until_idle();
        let after = array.member_bytes(d1, at, UNIT);
        let changed = (0..UNIT as usize).filter(|&x| after[x] != d1_unit0[x]).count();
        let off1 = off_of(&array, stripe, 1, 0);
        let got = array.read(off1, UNIT).unwrap();
        let wrong = (0..UNIT as usize).filter(|&x| got[x] != model[off1 as usize + x]).count();
        assert!(
            changed == 0 && wrong == 0,
            "seed {seed}: chunk 1's readable unit 0 rewritten ({changed} bytes changed); a read \
             of it returns {wrong} wrong bytes"
        );
    }
}

/// RAID 5 x4: a read of data chunk 0 with a bad unit; the reconstruction's source read of
/// another data chunk fails once (transient). Every byte is readable on retry.
#[test]
fn g5_raid5_read_transient_on_a_reconstruction_source() {
    for seed in [1u64, 2, 3] {
        let chunk = 16u64 << 10;
        let (mut array, model) = setup(seed, Level::Raid5, 4, chunk);
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let d0 = array.data_role(stripe, 0);
        let d1 = array.data_role(stripe, 1);
        array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(d1).unwrap().state().transient_read_errors = 1;
        let off = off_of(&array, stripe, 0, 0);
        let got = array.read(off, chunk);
        match got {
            Ok(got) => assert!(got == model[off as usize..(off + chunk) as usize], "wrong"),
            Err(e) => panic!("seed {seed}: read failed ({e:?}) after one transient source error"),
        }
    }
}

use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::ArrayOffset;
use rand::Rng;

/// A request in flight: its ticket, its (offset, length), and the data of a write.
type InFlight = (flashraid_sim::Ticket, (u64, u64), Option<Vec<u8>>);

/// Random concurrent reads/writes (FUA too) with small scratch, one member per stripe with
/// persistent bad units (no other fault): every request succeeds, reads return the model,
/// and scrub finds no mismatch (`FLASHRAID_SEEDS` seeds, 4 by default).
fn stress(level: Level, n: usize, seed: u64, chunk: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, n);
    o.member_bytes = if chunk >= 1 << 20 { 24 << 20 } else { 4 << 20 };
    o.chunk_bytes = chunk;
    o.shards = rng.random_range(1..=2);
    o.init = Init::Zero;
    o.delay_steps_max = rng.random_range(1..=20);
    o.config.member_read_errors_max = 1_000_000;
    o.config.scratch_bytes = (rng.random_range(1..=4) * chunk as usize).max(64 << 10) * (n + 3);
    o.config.stripes_active_max = rng.random_range(2..=8);
    let mut a = SimArray::create(o).unwrap();
    a.run_until_idle();
    let g = a.geometry();
    let (size, sb) = (a.array_bytes(), g.stripe_data_bytes());
    let stripes = size / sb;
    let mut model = vec![0u8; size as usize];
    // Fill.
    let mut d = vec![0u8; size as usize];
    rng.fill(d.as_mut_slice());
    a.write(0, &d).unwrap();
    model.copy_from_slice(&d);
    a.run_until_idle();
    let mut bad_member: Vec<Option<usize>> = vec![None; stripes as usize];
    let mut fl: Vec<InFlight> = vec![];
    let mut issued = 0;
    let total = 400;
    while issued < total || !fl.is_empty() {
        fl.retain(|(t, r, want)| {
            let Some(res) = a.take_result(*t) else { return true };
            match (want, res) {
                (Some(w), Ok(Some(gd))) => {
                    let first = gd.iter().zip(w.iter()).position(|(x, y)| x != y);
                    assert!(
                        first.is_none(),
                        "{level} seed {seed} chunk {chunk}: read {r:?} wrong at +{first:?}"
                    )
                }
                (_, Ok(_)) => {}
                (_, Err(e)) => panic!("{level} seed {seed} chunk {chunk}: {r:?} failed: {e}"),
            }
            false
        });
        if issued < total && fl.len() < 24 {
            issued += 1;
            // New bad units now and then.
            if rng.random_ratio(1, 4) {
                let st = rng.random_range(0..stripes);
                let m = *bad_member[st as usize].get_or_insert_with(|| rng.random_range(0..n));
                let at = a.chunk_offset(st);
                let u = rng.random_range(0..chunk / UNIT);
                let units = rng.random_range(1..=2.min(chunk / UNIT - u));
                a.role_device(m).unwrap().state().bad_ranges.push((at + u * UNIT, units * UNIT));
            }
            let max = if rng.random_bool(0.2) { 2 * sb / UNIT } else { 8 };
            let blocks = rng.random_range(1..=max);
            let s = rng.random_range(0..=(size / UNIT - blocks)) * UNIT;
            let e = s + blocks * UNIT;
            if fl.iter().all(|(_, r, _)| !(r.0 < e && s < r.1)) {
                let dur = if rng.random_ratio(1, 5) { Durability::Fua } else { Durability::Cached };
                let (off, len) = (ArrayOffset(s), e - s);
                let (op, data, want) = if rng.random_bool(0.5) {
                    let mut d = vec![0u8; len as usize];
                    rng.fill(d.as_mut_slice());
                    model[s as usize..e as usize].copy_from_slice(&d);
                    (ArrayOp::Write { offset: off, len_bytes: len, durability: dur }, Some(d), None)
                } else {
                    (
                        ArrayOp::Read { offset: off, len_bytes: len },
                        None,
                        Some(model[s as usize..e as usize].to_vec()),
                    )
                };
                let t = a.submit(op, data.as_deref()).unwrap();
                fl.push((t, (s, e), want));
            }
        }
        a.step();
    }
    a.run_until_idle();
    a.check_model(&model, &format!("{level} seed {seed} chunk {chunk}"));
    if level != Level::Raid0 {
        let (t, _) = a.scrub(false);
        assert_eq!(t.mismatches, 0, "{level} seed {seed} chunk {chunk}: scrub {t:?}");
    }
}

#[test]
fn g7_stress() {
    for seed in flashraid_sim::seeds(4) {
        for (level, n) in [
            (Level::Raid5, 4),
            (Level::Raid6, 6),
            (Level::Raid7_3, 7),
            (Level::Raid1, 2),
            (Level::Raid1, 3),
            (Level::Raid10, 4),
        ] {
            for chunk in [16u64 << 10, 64 << 10] {
                stress(level, n, seed, chunk);
            }
        }
    }
}
