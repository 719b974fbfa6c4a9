//! Read errors in later rounds of an operation, after a chunk was read again in units (found
//! by a fourth review, 2026-11-25; h1-h4 failed before their fixes, the controls and h5
//! passed): a probe in a later round settling a mirror position another copy gave (its
//! failed copy was never rewritten), a target whose member left service during a source's
//! probe (a panic), and a chunk read in full by an earlier probe failing once more later
//! (erased whole, failing the read or write). `h_stress` runs random concurrent IO with bad
//! units and transient errors at every level (`FLASHRAID_SEEDS`; `H_ERRMAX` sets
//! `member_read_errors_max`, `H_SMALL` the smallest scratch, `H_MIRROR` mirrors only,
//! `H_NOGONE` no member leaving, `H_CATCH` goes on past a panic and names the case).

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

/// Copies of data position `i` of `stripe`, in the order reads try them.
fn order(array: &SimArray, stripe: u64, i: usize) -> Vec<usize> {
    let g = array.geometry();
    let copies = g.copies();
    let start = (stripe % copies as u64) as usize;
    (0..copies).map(|c| g.data_member(StripeIndex(stripe), i, (start + c) % copies).get()).collect()
}

/// RAID 10 x4: one read of both data positions of a stripe. Position 0: first copy A0 has a
/// bad unit 0 (probed in round 1, B0 re-read in units in round 2, fine). Position 1: first
/// copy A1 goes away under the read, so round 2 reads B1 whole; B1 fails once (transient),
/// and is probed in round 2. The read succeeds; A0's bad unit is rewritten (it was
/// recovered from B0).
#[test]
fn h1_raid10_probe_in_round2_skips_repair_of_round1_copy() {
    for seed in [1u64, 2] {
        let chunk = 16u64 << 10;
        let (mut array, model) = setup(seed, Level::Raid10, 4, chunk);
        let stripe = 6u64;
        let at = array.chunk_offset(stripe);
        let o0 = order(&array, stripe, 0);
        let o1 = order(&array, stripe, 1);
        eprintln!("seed {seed}: pos0 {o0:?} pos1 {o1:?}");
        let (a0, a1, b1) = (o0[0], o1[0], o1[1]);
        array.role_device(a0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(a1).unwrap().state().gone = true;
        array.role_device(b1).unwrap().state().transient_read_errors = 1;
        let corrected_before = array.counters().errors_corrected;
        let off = off_of(&array, stripe, 0, 0);
        let len = 2 * chunk;
        let got = array.read(off, len).expect("read");
        assert!(got == model[off as usize..(off + len) as usize], "seed {seed}: wrong data");
        array.run_until_idle();
        let bad = array.role_device(a0).unwrap().state().bad_ranges.clone();
        let corrected = array.counters().errors_corrected - corrected_before;
        assert!(
            bad.is_empty() && corrected >= 1,
            "seed {seed}: A0 (member {a0}) bad unit not rewritten: bad_ranges {bad:?}, errors_corrected +{corrected}"
        );
    }
}

/// Control for h1: without B1's transient error, A0's bad unit is rewritten.
#[test]
fn h1_control_without_round2_probe_repairs() {
    let seed = 1u64;
    let chunk = 16u64 << 10;
    let (mut array, model) = setup(seed, Level::Raid10, 4, chunk);
    let stripe = 6u64;
    let at = array.chunk_offset(stripe);
    let (a0, a1) = (order(&array, stripe, 0)[0], order(&array, stripe, 1)[0]);
    array.role_device(a0).unwrap().state().bad_ranges.push((at, UNIT));
    array.role_device(a1).unwrap().state().gone = true;
    let off = off_of(&array, stripe, 0, 0);
    let got = array.read(off, 2 * chunk).expect("read");
    assert!(got == model[off as usize..(off + 2 * chunk) as usize]);
    array.run_until_idle();
    assert!(array.role_device(a0).unwrap().state().bad_ranges.is_empty());
    assert!(array.counters().errors_corrected >= 1);
}

use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::ArrayOffset;
use rand::Rng;

type InFlight = (flashraid_sim::Ticket, (u64, u64), Option<Vec<u8>>, bool);

/// Random concurrent reads/writes with small scratch; bad units on up to `tolerance`
/// members per stripe and random transient read errors on any member. No panic, and no
/// successful read returns a byte other than the model's (bytes of stripes a failed write
/// touched are not checked).
fn stress(level: Level, n: usize, seed: u64, chunk: u64, gone: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, n);
    o.member_bytes = 4 << 20;
    o.chunk_bytes = chunk;
    o.shards = 1;
    o.init = Init::Zero;
    o.delay_steps_max = rng.random_range(1..=20);
    o.config.member_read_errors_max = 1_000_000;
    o.config.scratch_bytes = (rng.random_range(1..=3) * chunk as usize).max(64 << 10) * (n + 3);
    if let Ok(v) = std::env::var("H_ERRMAX") {
        o.config.member_read_errors_max = v.parse().unwrap();
    }
    if std::env::var("H_SMALL").is_ok() {
        o.config.scratch_bytes = chunk as usize * (n + 3);
    }
    o.config.stripes_active_max = rng.random_range(2..=8);
    let mut a = SimArray::create(o).unwrap();
    a.run_until_idle();
    let g = a.geometry();
    let tol = g.tolerance();
    let (size, sb) = (a.array_bytes(), g.stripe_data_bytes());
    let stripes = size / sb;
    let mut d = vec![0u8; size as usize];
    rng.fill(d.as_mut_slice());
    a.write(0, &d).unwrap();
    let mut model = d;
    let mut known = vec![true; (size / UNIT) as usize];
    a.run_until_idle();
    let mut bad_members: Vec<Vec<usize>> = vec![vec![]; stripes as usize];
    let mut fl: Vec<InFlight> = vec![];
    let mut issued = 0;
    let total = 500;
    let what = format!("{level} n{n} seed {seed} chunk {chunk} gone {gone}");
    let mut gone_done = false;
    while issued < total || !fl.is_empty() {
        let mut newly_unknown = vec![];
        fl.retain(|(t, r, want, _)| {
            let Some(res) = a.take_result(*t) else { return true };
            match (want, res) {
                (Some(w), Ok(Some(gd))) => {
                    for x in 0..gd.len() {
                        let u = ((r.0 + x as u64) / UNIT) as usize;
                        if known[u] && gd[x] != w[x] {
                            panic!("{what}: read {r:?} wrong at +{x}");
                        }
                    }
                }
                (None, Err(_)) => newly_unknown.push(*r),
                _ => {}
            }
            false
        });
        for r in newly_unknown {
            let s0 = r.0 / sb * sb;
            let e0 = r.1.div_ceil(sb) * sb;
            for u in s0 / UNIT..e0 / UNIT {
                known[u as usize] = false;
            }
        }
        if gone && !gone_done && issued == total / 2 {
            gone_done = true;
            let m = rng.random_range(0..n);
            if let Some(dev) = a.role_device(m) {
                dev.state().gone = true;
            }
        }
        if issued < total && fl.len() < 24 {
            issued += 1;
            if rng.random_ratio(1, 3) {
                let st = rng.random_range(0..stripes);
                let bm = &mut bad_members[st as usize];
                let m = if bm.len() < tol.max(1) && rng.random_bool(0.5) || bm.is_empty() {
                    let m = rng.random_range(0..n);
                    if !bm.contains(&m) {
                        bm.push(m);
                    }
                    m
                } else {
                    bm[rng.random_range(0..bm.len())]
                };
                let at = a.chunk_offset(st);
                let u = rng.random_range(0..chunk / UNIT);
                let units = rng.random_range(1..=2.min(chunk / UNIT - u));
                if let Some(dev) = a.role_device(m) {
                    dev.state().bad_ranges.push((at + u * UNIT, units * UNIT));
                }
            }
            if rng.random_ratio(1, 4) {
                let m = rng.random_range(0..n);
                let k = rng.random_range(1..=2);
                if let Some(dev) = a.role_device(m) {
                    dev.state().transient_read_errors += k;
                }
            }
            let max = if rng.random_bool(0.2) { 2 * sb / UNIT } else { 8 };
            let blocks = rng.random_range(1..=max);
            let s = rng.random_range(0..=(size / UNIT - blocks)) * UNIT;
            let e = s + blocks * UNIT;
            if fl.iter().all(|(_, r, _, _)| !(r.0 < e && s < r.1)) {
                let dur = if rng.random_ratio(1, 5) { Durability::Fua } else { Durability::Cached };
                let (off, len) = (ArrayOffset(s), e - s);
                let (op, data, want) = if rng.random_bool(0.5) {
                    let mut d = vec![0u8; len as usize];
                    rng.fill(d.as_mut_slice());
                    model[s as usize..e as usize].copy_from_slice(&d);
                    for u in s / UNIT..e / UNIT {
                        known[u as usize] = true;
                    }
                    (ArrayOp::Write { offset: off, len_bytes: len, durability: dur }, Some(d), None)
                } else {
                    (
                        ArrayOp::Read { offset: off, len_bytes: len },
                        None,
                        Some(model[s as usize..e as usize].to_vec()),
                    )
                };
                let t = a.submit(op, data.as_deref()).unwrap();
                fl.push((t, (s, e), want, false));
            }
        }
        a.step();
    }
    a.run_until_idle();
    eprintln!("{what}: failures {:?}", a.member_failures());
}

#[test]
fn h_stress() {
    for seed in flashraid_sim::seeds(3) {
        for (level, n) in [
            (Level::Raid5, 4),
            (Level::Raid6, 6),
            (Level::Raid7_3, 7),
            (Level::Raid1, 2),
            (Level::Raid1, 3),
            (Level::Raid10, 4),
        ] {
            for chunk in [16u64 << 10, 64 << 10] {
                for gone in [false, true] {
                    if std::env::var("H_MIRROR").is_ok()
                        && !matches!(level, Level::Raid1 | Level::Raid10)
                    {
                        continue;
                    }
                    if gone && std::env::var("H_NOGONE").is_ok() {
                        continue;
                    }
                    if std::env::var("H_CATCH").is_ok() {
                        let r = std::panic::catch_unwind(|| stress(level, n, seed, chunk, gone));
                        if r.is_err() {
                            eprintln!("PANIC {level} n{n} seed {seed} chunk {chunk} gone {gone}");
                        }
                    } else {
                        stress(level, n, seed, chunk, gone);
                    }
                }
            }
        }
    }
}

/// RAID 5 x4: a read of data chunk 0, bad in unit 0 (probed in round 1: rebuild range = unit
/// 0). The rebuild round's source read of data chunk 1 fails once (transient) and is
/// probed; while it is, chunk 0's member is failed (out of service). The probe's return
/// (`read_after_probe`) widens chunk 0's failed units to the whole chunk, past the
/// rebuild range already read: the read still succeeds (or fails cleanly), no panic.
#[test]
fn h2_raid5_target_member_fails_during_source_probe() {
    let chunk = 16u64 << 10;
    for k in 0..8u64 {
        let seed = 1u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut o = SimOptions::new(seed, Level::Raid5, 4);
        o.member_bytes = 4 << 20;
        o.chunk_bytes = chunk;
        o.shards = 1;
        o.init = Init::Zero;
        o.delay_steps_max = 2;
        o.config.member_read_errors_max = 1_000_000;
        let mut array = SimArray::create(o).unwrap();
        let model = array.fill_random(&mut rng);
        array.run_until_idle();
        let stripe = 5u64;
        let at = array.chunk_offset(stripe);
        let d0 = array.data_role(stripe, 0);
        let d1 = array.data_role(stripe, 1);
        array.role_device(d0).unwrap().state().bad_ranges.push((at, UNIT));
        array.role_device(d0).unwrap().state().bad_ranges.push((at + 2 * UNIT, UNIT));
        array.role_device(d1).unwrap().state().transient_read_errors = 1;
        let off = off_of(&array, stripe, 0, 0);
        let t = array
            .submit(
                flashraid_engine::ArrayOp::Read {
                    offset: flashraid_layout::ArrayOffset(off),
                    len_bytes: chunk,
                },
                None,
            )
            .unwrap();
        let d1_reads0 = array.role_device(d1).unwrap().state().reads;
        let mut steps = 0;
        // Step until d1 has been read twice more (the source read and its first probe unit
        // issued/completed), then k more steps.
        while array.role_device(d1).unwrap().state().reads < d1_reads0 + 1 && steps < 1000 {
            array.step();
            steps += 1;
        }
        array.run_steps(k);
        if array.is_done(t) {
            eprintln!("k {k}: done before fail");
            continue;
        }
        eprintln!("k {k}: d1 reads {}", array.role_device(d1).unwrap().state().reads - d1_reads0);
        array.fail_member(d0);
        let r = array.wait(t);
        match r {
            Ok(got) => assert!(
                got.as_deref() == Some(&model[off as usize..(off + chunk) as usize]),
                "k {k}: wrong"
            ),
            Err(e) => eprintln!("k {k}: read failed {e:?}"),
        }
        eprintln!("k {k}: ok, failures {:?}", array.member_failures());
    }
}

/// RAID 5 x5 (4+1): an 8 KiB write over data chunk 0's last unit and data chunk 1's first
/// (plan range = the whole chunk). Plan 1 (read-modify-write) reads chunk 0 (fails once,
/// transient: probed, every unit reads) and P (bad in unit 1: probed, unavailable). Plan 2
/// (reconstruct-write, P not read) reads chunk 0 again over the whole range, and it fails
/// once more (transient). Nothing needed is unreadable: the write succeeds.
/// `first_transient` false is the control: chunk 0 not probed in plan 1.
fn h3_run(first_transient: bool) -> Result<(), flashraid_engine::RequestError> {
    let seed = 1u64;
    let chunk = 16u64 << 10;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, Level::Raid5, 5);
    o.member_bytes = 4 << 20;
    o.chunk_bytes = chunk;
    o.shards = 1;
    o.init = Init::Zero;
    o.delay_steps_max = 2;
    o.config.member_read_errors_max = 1_000_000;
    let mut array = SimArray::create(o).unwrap();
    let mut model = array.fill_random(&mut rng);
    array.run_until_idle();
    let g = array.geometry();
    let stripe = 5u64;
    let at = array.chunk_offset(stripe);
    let d0 = array.data_role(stripe, 0);
    let p = g.parity_member(StripeIndex(stripe), 0).get();
    array.role_device(p).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
    if first_transient {
        array.role_device(d0).unwrap().state().transient_read_errors = 1;
    }
    let off = off_of(&array, stripe, 0, 3 * UNIT as u32);
    let data = vec![0x5au8; 2 * UNIT as usize];
    let reads0 = array.role_device(d0).unwrap().state().reads;
    let t = array
        .submit(
            flashraid_engine::ArrayOp::Write {
                offset: flashraid_layout::ArrayOffset(off),
                len_bytes: 2 * UNIT,
                durability: flashraid_engine::Durability::Cached,
            },
            Some(&data),
        )
        .unwrap();
    // Plan 1 read chunk 0 once successfully (its probe, or its plain read): the next read
    // of chunk 0 is plan 2's. Make it fail once.
    let mut steps = 0;
    while array.role_device(d0).unwrap().state().reads < reads0 + 1 {
        array.step();
        steps += 1;
        assert!(steps < 10_000);
    }
    array.role_device(d0).unwrap().state().transient_read_errors = 1;
    let r = array.wait(t).map(|_| ());
    if r.is_ok() {
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        array.run_until_idle();
        array.check_model(&model, "h3 after");
    }
    eprintln!(
        "h3 first_transient {first_transient}: {r:?}, counters {:?}",
        array.counters().rmw_writes
    );
    r
}

#[test]
fn h3_raid5_write_chunk_probed_in_plan1_fails_again_in_plan2() {
    let r = h3_run(true);
    assert!(
        r.is_ok(),
        "the write failed ({r:?}): chunk 0, probed in plan 1, failed once in plan 2"
    );
}

#[test]
fn h3_control_chunk_not_probed_in_plan1() {
    let r = h3_run(false);
    assert!(r.is_ok(), "control: {r:?}");
}

/// RAID 5 x4: a read of data chunk 0's last unit and data chunk 1's first. Chunk 1's unit 0
/// is bad (rebuild range = unit 0). Round 1: chunk 0 fails once (transient: probed, reads).
/// Round 2 reads chunk 0's unit 0 into scratch as a source, and it fails once more
/// (transient). Every byte needed is readable: the read succeeds. `first_transient`
/// false is the control (chunk 0 not probed in round 1).
fn h4_run(first_transient: bool) -> Result<(), flashraid_engine::RequestError> {
    let seed = 1u64;
    let chunk = 16u64 << 10;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, Level::Raid5, 4);
    o.member_bytes = 4 << 20;
    o.chunk_bytes = chunk;
    o.shards = 1;
    o.init = Init::Zero;
    o.delay_steps_max = 2;
    o.config.member_read_errors_max = 1_000_000;
    let mut array = SimArray::create(o).unwrap();
    let model = array.fill_random(&mut rng);
    array.run_until_idle();
    let stripe = 5u64;
    let at = array.chunk_offset(stripe);
    let d0 = array.data_role(stripe, 0);
    let d1 = array.data_role(stripe, 1);
    array.role_device(d1).unwrap().state().bad_ranges.push((at, UNIT));
    if first_transient {
        array.role_device(d0).unwrap().state().transient_read_errors = 1;
    }
    let off = off_of(&array, stripe, 0, 3 * UNIT as u32);
    let reads0 = array.role_device(d0).unwrap().state().reads;
    let t = array
        .submit(
            flashraid_engine::ArrayOp::Read {
                offset: flashraid_layout::ArrayOffset(off),
                len_bytes: 2 * UNIT,
            },
            None,
        )
        .unwrap();
    let mut steps = 0;
    while array.role_device(d0).unwrap().state().reads < reads0 + 1 {
        array.step();
        steps += 1;
        assert!(steps < 10_000);
    }
    array.role_device(d0).unwrap().state().transient_read_errors = 1;
    let r = array.wait(t);
    eprintln!("h4 first_transient {first_transient}: ok={}", r.is_ok());
    let got = r?;
    assert!(got.as_deref() == Some(&model[off as usize..(off + 2 * UNIT) as usize]), "wrong data");
    Ok(())
}

#[test]
fn h4_raid5_read_source_probed_in_round1_fails_again_in_round2() {
    let r = h4_run(true);
    assert!(
        r.is_ok(),
        "the read failed ({r:?}): chunk 0, probed in round 1, failed once as a source in round 2"
    );
}

#[test]
fn h4_control_source_not_probed_in_round1() {
    let r = h4_run(false);
    assert!(r.is_ok(), "control: {r:?}");
}

/// RAID 7.3 x7 (4+3): a read of data chunk 0 (bad unit 1); in the rebuild round two or
/// three sources fail at once (transient or bad in unit 1). Within redundancy: the read
/// returns the model and chunk 0's bad unit is rewritten, its other units untouched.
#[test]
fn h5_raid73_several_sources_fail_in_one_round() {
    for case in 0..4 {
        for seed in [1u64, 2] {
            let chunk = 16u64 << 10;
            let (mut array, model) = setup(seed, Level::Raid7_3, 7, chunk);
            let g = array.geometry();
            let stripe = 5u64;
            let at = array.chunk_offset(stripe);
            let d = |i| array.data_role(stripe, i);
            let p = |r| g.parity_member(StripeIndex(stripe), r).get();
            let (d0, d1, d2, d3) = (d(0), d(1), d(2), d(3));
            array.role_device(d0).unwrap().state().bad_ranges.push((at + UNIT, UNIT));
            let bad = |a: &SimArray, m: usize| {
                a.role_device(m).unwrap().state().bad_ranges.push((at + UNIT, UNIT))
            };
            let tr = |a: &SimArray, m: usize| {
                a.role_device(m).unwrap().state().transient_read_errors = 1
            };
            match case {
                0 => {
                    tr(&array, d1);
                    bad(&array, d2);
                }
                1 => {
                    bad(&array, d1);
                    bad(&array, d2);
                }
                2 => {
                    tr(&array, d1);
                    tr(&array, d2);
                    tr(&array, p(0));
                }
                _ => {
                    bad(&array, d1);
                    tr(&array, d2);
                    bad(&array, d3);
                }
            }
            let before = array.member_bytes(d0, at, chunk);
            let off = off_of(&array, stripe, 0, 0);
            let got = array.read(off, chunk);
            let want = &model[off as usize..(off + chunk) as usize];
            match got {
                Ok(got) => assert!(got == want, "case {case} seed {seed}: wrong data"),
                Err(e) => panic!("case {case} seed {seed}: read failed {e:?}"),
            }
            array.run_until_idle();
            let after = array.member_bytes(d0, at, chunk);
            assert!(after == want, "case {case} seed {seed}: d0 not repaired right");
            let u = UNIT as usize;
            assert!(after[..u] == before[..u] && after[2 * u..] == before[2 * u..]);
        }
    }
}
