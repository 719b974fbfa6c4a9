//! Member read errors met after the first round of an operation: a mirror copy tried
//! after the first one left service, a reconstruction source, a write's re-planned reads.
//! Each is read again in 4 KiB units too, so a unit readable anywhere is returned, and
//! only units that fail everywhere are recovered and rewritten. (Found by review,
//! 2026-11-25: only an operation's first round was read again in units; each g1-g6 test
//! failed before the fix, g3_control and g7 are controls.)

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
