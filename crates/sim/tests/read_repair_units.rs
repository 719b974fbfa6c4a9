//! A client read over a bad sector, with another chunk of the stripe silently wrong (a lost
//! write): the member read that failed is read again in 4 KiB units, so only the unit that
//! cannot be read comes from redundancy and is rewritten; the readable blocks beside it are
//! returned as read and never written. (Before, the whole range the failed IO covered was
//! rebuilt from the first parity rows, or read from another mirror copy, returned, and
//! written back: with a wrong parity row or a stale copy, readable, correct blocks came back
//! wrong and were rewritten wrong. Each test here failed against that.)

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
            let off = g
                .array_offset(Location {
                    stripe: StripeIndex(stripe),
                    data_index: 0,
                    offset_in_chunk_bytes: 0,
                })
                .0;
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
        let off = g
            .array_offset(Location {
                stripe: StripeIndex(stripe),
                data_index: 0,
                offset_in_chunk_bytes: 0,
            })
            .0;
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
        let off = g
            .array_offset(Location {
                stripe: StripeIndex(stripe),
                data_index: 0,
                offset_in_chunk_bytes: 0,
            })
            .0;
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
    let off = g
        .array_offset(Location {
            stripe: StripeIndex(stripe),
            data_index: 0,
            offset_in_chunk_bytes: 0,
        })
        .0;
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
    let off = g
        .array_offset(Location {
            stripe: StripeIndex(stripe),
            data_index: 0,
            offset_in_chunk_bytes: 0,
        })
        .0;
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
        let off = g
            .array_offset(Location {
                stripe: StripeIndex(stripe),
                data_index: 0,
                offset_in_chunk_bytes: 0,
            })
            .0;
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
