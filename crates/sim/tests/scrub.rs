//! Scrub over the real engine: silent corruption (bytes changed on a member with no error) is
//! found by a check, left alone by it, and repaired by a repair scrub; on RAID 6 and 7.3 the
//! corrupted chunk is located from the syndromes and only it is rewritten, so the data comes
//! back even when the corruption hit a data chunk. Read errors (bad sectors) are rewritten
//! from redundancy by any scrub.
//!
//! Degraded (RAID 6 with one member out, 7.3 with one or two): a scrub still checks every
//! stripe with the redundancy left, rewrites bad sectors (the data reads back right), and
//! counts silent corruption without repairing it. A bad sector in a stripe whose other
//! chunks disagree is not rewritten from them (healthy or degraded), and stripes an unclean
//! stop left to resync are passed over and counted, never called checked.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more
//! (`FLASHRAID_SEED_FROM=f`: from seed f).

use flashraid_control::Init;
use flashraid_layout::{Level, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn setup(level: Level, members: usize, seed: u64) -> (SimArray, Vec<u8>, StdRng) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, members);
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.member_bytes = 3 << 20;
    o.init = Init::Zero;
    let mut array = SimArray::create(o).unwrap();
    let mut model = vec![0u8; array.array_bytes() as usize];
    rng.fill(model.as_mut_slice());
    for (i, piece) in model.chunks(256 << 10).enumerate() {
        array.write((i as u64) << 18, piece).unwrap();
    }
    array.flush().unwrap();
    array.run_until_idle();
    (array, model, rng)
}

/// Flip bytes of the chunk `member` holds in `stripe`, silently (current and durable).
/// Returns the member offset of the first byte flipped.
fn corrupt(array: &SimArray, stripe: u64, member: usize, rng: &mut StdRng) -> u64 {
    let g = array.geometry();
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let at = data_offset + g.member_offset(StripeIndex(stripe), 0).0;
    let device = array.role_device(member).unwrap();
    let mut state = device.state();
    let offset = (at + rng.random_range(0..u64::from(g.chunk_bytes()) - 64)) as usize;
    for b in 0..rng.random_range(1..64) {
        state.current[offset + b] ^= 0xa5;
        state.durable[offset + b] ^= 0xa5;
    }
    offset as u64
}

fn read_all(array: &mut SimArray, model: &[u8]) -> bool {
    array.read(0, model.len() as u64).unwrap() == model
}

fn run(level: Level, members: usize, seed: u64) {
    eprintln!("scrub {level} x{members} seed {seed} (replay with FLASHRAID_SEED={seed})");
    let (mut array, model, mut rng) = setup(level, members, seed);
    let g = array.geometry();
    let (clean, stopped) = array.scrub(false);
    assert_eq!(stopped, None);
    assert_eq!(clean.stripes_checked, g.stripes(), "{clean:?}");
    assert_eq!(clean.mismatches, 0, "a fresh array has mismatches: {clean:?}");
    // Corrupt one chunk in each of several stripes.
    let mut stripes: Vec<u64> = (0..g.stripes()).collect();
    let count = stripes.len();
    for i in 0..count {
        stripes.swap(i, rng.random_range(i..count));
    }
    stripes.truncate(5);
    for &s in &stripes {
        let member = match level {
            // RAID 5 cannot tell which chunk is wrong: repair trusts the data, so only a
            // corrupted parity chunk is something repair can fix.
            Level::Raid5 => g.parity_member(StripeIndex(s), 0).get(),
            // Two copies cannot outvote each other: the lowest member is the reference.
            Level::Raid10 => {
                let m = rng.random_range(0..members);
                m | 1
            }
            _ => rng.random_range(0..members),
        };
        corrupt(&array, s, member, &mut rng);
    }
    let expected = stripes.len() as u64;
    let (check, _) = array.scrub(false);
    assert_eq!(check.mismatches, expected, "{level} seed {seed}: {check:?}");
    assert_eq!(check.repaired, 0);
    if g.parity_chunks() >= 2 {
        assert_eq!(check.located, expected, "{level} seed {seed}: not all located: {check:?}");
    }
    let (again, _) = array.scrub(false);
    assert_eq!(again.mismatches, expected, "a check must not change anything");
    let (repair, _) = array.scrub(true);
    assert_eq!(repair.repaired, expected, "{level} seed {seed}: {repair:?}");
    let (after, _) = array.scrub(false);
    assert_eq!(after.mismatches, 0, "{level} seed {seed}: left after repair: {after:?}");
    assert!(read_all(&mut array, &model), "{level} seed {seed}: data wrong after repair");
    // A bad sector: any scrub rewrites it from redundancy.
    let member = rng.random_range(0..members);
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let at = data_offset + g.member_offset(StripeIndex(stripes[0]), 0).0;
    array.role_device(member).unwrap().state().bad_ranges.push((at, 4096));
    let (errors, _) = array.scrub(false);
    assert!(errors.read_errors_repaired >= 1, "{level} seed {seed}: {errors:?}");
    assert!(array.role_device(member).unwrap().state().bad_ranges.is_empty(), "not rewritten");
    // Lean on everything: fail members up to the tolerance, the data must still be there.
    let mut failed = 0;
    for r in 0..members {
        if failed == g.tolerance() {
            break;
        }
        if level == Level::Raid10 && r % 2 == 1 {
            continue;
        }
        array.fail_member(r);
        failed += 1;
    }
    assert!(read_all(&mut array, &model), "{level} seed {seed}: reconstruction after repair");
    let (degraded, stopped) = array.scrub(false);
    if g.tolerance() > 0 && failed > 0 {
        assert!(stopped.is_some(), "a degraded scrub must say it cannot check: {degraded:?}");
    }
}

/// Whether the chunk `member` holds in `stripe` differs from what the model says it should
/// (data chunks only; parity chunks are never compared here and count as not differing).
fn chunk_differs(array: &SimArray, stripe: u64, member: usize, model: &[u8]) -> bool {
    let g = array.geometry();
    let chunk = u64::from(g.chunk_bytes());
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let at = (data_offset + g.member_offset(StripeIndex(stripe), 0).0) as usize;
    let device = array.role_device(member).unwrap();
    let stored = device.state().durable[at..at + chunk as usize].to_vec();
    (0..g.data_chunks()).any(|i| {
        g.data_member(StripeIndex(stripe), i, 0).get() == member && {
            let start = (stripe * g.stripe_data_bytes() + i as u64 * chunk) as usize;
            stored != model[start..start + chunk as usize]
        }
    })
}

/// A degraded scrub on `level` with `out` members failed first.
fn run_degraded(level: Level, members: usize, out: usize, seed: u64) {
    eprintln!("degraded scrub {level} x{members} ({out} out) seed {seed} (FLASHRAID_SEED={seed})");
    let (mut array, model, mut rng) = setup(level, members, seed);
    let g = array.geometry();
    let mut roles: Vec<usize> = (0..members).collect();
    for i in 0..members {
        roles.swap(i, rng.random_range(i..members));
    }
    let (failed, in_service) = roles.split_at(out);
    for &r in failed {
        array.fail_member(r);
    }
    let (clean, stopped) = array.scrub(false);
    assert_eq!(stopped, None, "{level} seed {seed}: {out} out of {} parity", g.parity_chunks());
    assert_eq!(clean.stripes_checked, g.stripes(), "{clean:?}");
    assert_eq!((clean.mismatches, clean.unreadable), (0, 0), "{level} seed {seed}: {clean:?}");
    // Bad sectors on members in service, one in each of several stripes (with the members
    // out, one more erasure is what the redundancy left can fill): any scrub rewrites them,
    // and the data reads back right.
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let chunk_at = |stripe: u64| data_offset + g.member_offset(StripeIndex(stripe), 0).0;
    let mut stripes: Vec<u64> = (0..g.stripes()).collect();
    let count = stripes.len();
    for i in 0..count {
        stripes.swap(i, rng.random_range(i..count));
    }
    for &stripe in &stripes[..4] {
        let member = in_service[rng.random_range(0..in_service.len())];
        array.role_device(member).unwrap().state().bad_ranges.push((chunk_at(stripe), 4096));
    }
    let (errors, stopped) = array.scrub(false);
    assert_eq!(stopped, None);
    assert!(errors.read_errors_repaired >= 1, "{level} seed {seed}: {errors:?}");
    assert_eq!(
        errors.mismatches, 0,
        "{level} seed {seed}: a rewritten chunk mismatched: {errors:?}"
    );
    for &r in in_service {
        let left = array.role_device(r).unwrap().state().bad_ranges.clone();
        assert!(left.is_empty(), "{level} seed {seed}: not rewritten on {r}: {left:?} {errors:?}");
    }
    assert!(read_all(&mut array, &model), "{level} seed {seed}: data after the degraded scrub");
    // Silent corruption of one chunk in service, in distinct stripes: counted by a check
    // and by a repair scrub alike, never repaired (and nothing else is written).
    let (mut corrupted, mut corrupted_at) = (vec![], vec![]);
    for &stripe in &stripes[4..7] {
        corrupted.push(in_service[rng.random_range(0..in_service.len())]);
        let at = corrupt(&array, stripe, *corrupted.last().unwrap(), &mut rng);
        corrupted_at.push(at & !4095);
    }
    // The check after the repair scrub still finds all three: nothing was rewritten.
    for repair in [false, true, false] {
        let (found, stopped) = array.scrub(repair);
        assert_eq!(stopped, None);
        assert_eq!(found.mismatches, 3, "{level} seed {seed} repair {repair}: {found:?}");
        assert_eq!((found.repaired, found.located), (0, 0), "{level} seed {seed}: {found:?}");
    }
    // A bad sector in a corrupted stripe, in the 4 KiB unit the corruption is in, with a
    // parity row left to check the rebuilt unit: what the other chunks say cannot be
    // trusted there, so it is counted, not rewritten (found in review: it was rebuilt from
    // the corrupted chunk and written, two silent errors where there had been one
    // detectable). With no row left (as many erasures as parity chunks) the rewrite cannot
    // be checked: reads of it would reconstruct the same.
    if out + 1 < g.parity_chunks() {
        let other = *in_service.iter().find(|&&r| r != corrupted[0]).unwrap();
        let bad = corrupted_at[0]; // in stripes[4], the first corrupted
        array.role_device(other).unwrap().state().bad_ranges.push((bad, 4096));
        let (found, _) = array.scrub(true);
        assert_eq!(found.mismatches, 3, "{level} seed {seed}: {found:?}");
        assert_eq!(found.read_errors_repaired, 0, "{level} seed {seed}: {found:?}");
        let left = array.role_device(other).unwrap().state().bad_ranges.clone();
        assert_eq!(left, vec![(bad, 4096)], "{level} seed {seed}: rewritten");
    }
    // One more member out: as many out as parity chunks, and the scrub says it cannot check.
    if out + 1 == g.parity_chunks() {
        array.fail_member(in_service[0]);
        let (_, stopped) = array.scrub(false);
        assert!(
            stopped.is_some_and(|w| w.contains("nothing is left to check with")),
            "{stopped:?}"
        );
    }
}

#[test]
fn a_degraded_scrub_rewrites_bad_sectors_and_counts_corruption() {
    for seed in flashraid_sim::seeds(3) {
        run_degraded(Level::Raid6, 6, 1, seed * 100 + 6);
        run_degraded(Level::Raid7_3, 7, 1, seed * 100 + 7);
        run_degraded(Level::Raid7_3, 8, 2, seed * 100 + 8);
    }
}

#[test]
fn a_healthy_scrub_does_not_rewrite_a_bad_sector_from_a_corrupted_stripe() {
    for seed in flashraid_sim::seeds(3) {
        for (level, members) in [(Level::Raid6, 6), (Level::Raid7_3, 7)] {
            let seed = seed * 100 + members as u64;
            let (mut array, model, mut rng) = setup(level, members, seed);
            let g = array.geometry();
            let stripe = rng.random_range(0..g.stripes());
            let data_offset = array.metadata().superblock().data_offset_bytes;
            let at = data_offset + g.member_offset(StripeIndex(stripe), 0).0;
            let corrupted = g.data_member(StripeIndex(stripe), 0, 0).get();
            let unit = corrupt(&array, stripe, corrupted, &mut rng) & !4095;
            assert!(chunk_differs(&array, stripe, corrupted, &model));
            let bad = (corrupted + 1) % members;
            array.role_device(bad).unwrap().state().bad_ranges.push((unit, 4096));
            let (found, _) = array.scrub(false);
            assert_eq!(found.mismatches, 1, "{level} seed {seed}: {found:?}");
            assert_eq!(found.read_errors_repaired, 0, "{level} seed {seed}: {found:?}");
            let left = array.role_device(bad).unwrap().state().bad_ranges.clone();
            assert_eq!(left, vec![(unit, 4096)], "{level} seed {seed}: rewritten from bad data");
            // In another unit of the same chunk, the bad sector is rebuilt and checked by
            // the rows there, which agree: it is rewritten, and the mismatch still counted.
            let chunk = u64::from(g.chunk_bytes());
            if chunk > 4096 {
                array.role_device(bad).unwrap().state().bad_ranges.clear();
                // The unit before (the flipped bytes start in `unit` and run forward).
                let elsewhere = at + (unit - at + chunk - 4096) % chunk;
                array.role_device(bad).unwrap().state().bad_ranges.push((elsewhere, 4096));
                let (found, _) = array.scrub(false);
                assert_eq!(found.mismatches, 1, "{level} seed {seed}: {found:?}");
                assert_eq!(found.read_errors_repaired, 1, "{level} seed {seed}: {found:?}");
                let left = array.role_device(bad).unwrap().state().bad_ranges.clone();
                assert!(left.is_empty(), "{level} seed {seed}: not rewritten: {left:?}");
            }
        }
    }
}

/// After an unclean stop, a member fails before resync ran: resync waits for it, and the
/// scrub passes over the stripes it would judge wrongly, counting them.
#[test]
fn a_degraded_scrub_passes_over_stripes_left_to_resync() {
    for seed in flashraid_sim::seeds(3) {
        let seed = seed * 100 + 6;
        let (mut array, _, _) = setup(Level::Raid6, 6, seed);
        let options = array.options().clone();
        array.write(0, &vec![0x5a; 256 << 10]).unwrap();
        array.flush().unwrap();
        let devices = array.crash();
        let mut again =
            SimArray::assemble(devices, options, flashraid_format::assembly::DirtyDegraded::Refuse)
                .unwrap();
        again.fail_member(2);
        let (found, stopped) = again.scrub(false);
        assert_eq!(stopped, None, "seed {seed}");
        assert!(found.untrusted > 0, "seed {seed}: nothing passed over: {found:?}");
        assert_eq!(found.stripes_checked, found.stripes_total, "seed {seed}: {found:?}");
    }
}

#[test]
fn scrub_finds_and_repairs_silent_corruption_and_bad_sectors() {
    flashraid_sim::for_each_redundant_level(run);
}
