//! Write path under faults: concurrent partial/full/FUA writes, zeroes and trims with a merge
//! window, read errors under RMW/RCW, members failing (operator, vanishing, failing writes),
//! a hot spare rebuilding meanwhile. After a clean stop, every further failure set within the
//! tolerance (reassembled from images) must read the model: parity agrees with data.
use flashraid_control::Init;
use flashraid_engine::{ArrayOp, Durability};
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::{ArrayOffset, Level};
use flashraid_sim::{SimArray, SimOptions, Ticket};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const B: u64 = 4096;

/// A request in flight: its ticket, its range (offset, length) and, for a write, its data.
type InFlight = (Ticket, (u64, u64), Option<Vec<u8>>);

fn run(level: Level, n: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, n);
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    (o.member_bytes, o.init, o.spares) = (3 << 20, Init::Zero, rng.random_range(0..=1));
    o.shards = rng.random_range(1..=2);
    o.delay_steps_max = if rng.random_bool(0.3) { rng.random_range(10..=60) } else { 3 };
    o.config.merge_window_us = if rng.random_bool(0.6) { rng.random_range(10..=300) } else { 0 };
    o.config.scratch_bytes = rng.random_range(1..=8) << 14; // starvation and re-plans
    o.config.stripes_active_max = rng.random_range(2..=6);
    o.config.rebuild_stripes_max = 1;
    o.config.rebuild_busy_stripes_max = 1;
    let mut a = SimArray::create(o.clone()).unwrap();
    for d in &a.devices {
        d.state().zeroing_unsupported = rng.random_ratio(1, 4);
        d.state().zeroes_after_discard = !rng.random_ratio(1, 3);
    }
    let (size, sb, tol) =
        (a.array_bytes(), a.geometry().stripe_data_bytes(), a.geometry().tolerance());
    let mut model = vec![0u8; size as usize];
    let mut fl: Vec<InFlight> = vec![];
    let mut issued = 0;
    while issued < 500 || !fl.is_empty() {
        fl.retain(|(t, r, want)| {
            let Some(res) = a.take_result(*t) else { return true };
            match (want, res) {
                (Some(w), Ok(Some(g))) => assert!(&g == w, "{level} seed {seed}: read {r:?} wrong"),
                (_, Ok(_)) => {}
                (_, Err(e)) => panic!("{level} seed {seed}: {r:?} failed: {e}"),
            }
            false
        });
        if issued < 500 && fl.len() < 32 {
            issued += 1;
            let max = if rng.random_bool(0.2) { 3 * sb / B } else { 6 };
            let blocks = rng.random_range(1..=max);
            let s = rng.random_range(0..=(size / B - blocks)) * B;
            let e = s + blocks * B;
            if fl.iter().all(|(_, r, _)| !(r.0 < e && s < r.1)) {
                let dur = if rng.random_ratio(1, 5) { Durability::Fua } else { Durability::Cached };
                let (off, len) = (ArrayOffset(s), e - s);
                let (op, data, want) = match rng.random_range(0..100) {
                    0..55 => {
                        let mut d = vec![0u8; len as usize];
                        rng.fill(d.as_mut_slice());
                        model[s as usize..e as usize].copy_from_slice(&d);
                        (
                            ArrayOp::Write { offset: off, len_bytes: len, durability: dur },
                            Some(d),
                            None,
                        )
                    }
                    55..80 => (
                        ArrayOp::Read { offset: off, len_bytes: len },
                        None,
                        Some(model[s as usize..e as usize].to_vec()),
                    ),
                    80..85 => (ArrayOp::Flush, None, None),
                    85..92 => {
                        let (f, l) = (s.div_ceil(sb) * sb, e / sb * sb);
                        if f < l {
                            model[f as usize..l as usize].fill(0)
                        }
                        (
                            ArrayOp::Discard { offset: off, len_bytes: len, durability: dur },
                            None,
                            None,
                        )
                    }
                    _ => {
                        model[s as usize..e as usize].fill(0);
                        (
                            ArrayOp::WriteZeroes { offset: off, len_bytes: len, durability: dur },
                            None,
                            None,
                        )
                    }
                };
                let r = if matches!(op, ArrayOp::Flush) { (0, 0) } else { (s, e) };
                fl.push((a.submit(op, data.as_deref()).unwrap(), r, want));
            }
        }
        // Faults: failed/vanished/write-failing members plus members with bad ranges < tolerance.
        let out = (0..n)
            .filter(|&r| {
                !a.role_in_service(r)
                    || a.role_device(r).is_some_and(|d| d.state().gone || d.state().writes_fail)
            })
            .count();
        let bad = (0..n)
            .filter(|&r| a.role_device(r).is_some_and(|d| !d.state().bad_ranges.is_empty()))
            .count();
        let role = rng.random_range(0..n);
        let ok = level != Level::Raid10 || a.role_in_service(role ^ 1);
        if out + bad < tol
            && ok
            && rng.random_ratio(1, 120)
            && a.role_in_service(role)
            && let Some(d) = a.role_device(role).filter(|d| {
                d.state().bad_ranges.is_empty() && !d.state().gone && !d.state().writes_fail
            })
        {
            match rng.random_range(0..3) {
                0 => a.fail_member(role),
                1 => d.state().gone = true,
                _ => d.state().writes_fail = true,
            }
        } else if out + bad < tol
            && ok
            && rng.random_ratio(1, 60)
            && a.role_in_service(role)
            && let Some(d) = a.role_device(role)
        {
            let mut st = d.state();
            if st.bad_ranges.is_empty() && !st.gone && !st.writes_fail {
                let at = rng.random_range((1 << 20) / B..(st.size_bytes() / B - 8)) * B;
                st.bad_ranges.push((at, B * rng.random_range(1..=4)));
            }
        }
        for _ in 0..rng.random_range(0..4) {
            a.step();
        }
    }
    a.run_until_idle();
    for d in &a.devices {
        let mut st = d.state();
        (st.bad_ranges, st.writes_fail) = (vec![], false);
    }
    assert!(a.read(0, size).unwrap() == model, "{level} seed {seed}: final read differs");
    a.run_until_rebuilt();
    let roles: Vec<Option<usize>> = (0..n)
        .map(|r| if a.role_in_service(r) { a.metadata().role_device(r) } else { None })
        .collect();
    let (devices, clean) = a.shutdown_with_state().unwrap();
    assert!(clean);
    let budget = tol.saturating_sub(roles.iter().filter(|d| d.is_none()).count());
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for _ in 0..budget {
        sets = sets
            .iter()
            .flat_map(|s| {
                (0..n).filter(|&r| roles[r].is_some() && s.last().is_none_or(|&l| r > l)).map(
                    move |r| {
                        let mut t = s.clone();
                        t.push(r);
                        t
                    },
                )
            })
            .collect();
    }
    for set in sets {
        if level == Level::Raid10
            && set.iter().any(|&r| set.contains(&(r ^ 1)) || roles[r ^ 1].is_none())
        {
            continue;
        }
        let imgs = (0..n)
            .filter(|r| !set.contains(r))
            .filter_map(|r| roles[r])
            .map(|d| devices[d].image())
            .collect();
        let mut o2 = o.clone();
        o2.spares = 0;
        let mut b = SimArray::assemble(imgs, o2, DirtyDegraded::Refuse).unwrap();
        assert!(
            b.read(0, size).unwrap() == model,
            "{level} seed {seed}: wrong with roles {set:?} out"
        );
    }
}

#[test]
fn writes_under_faults_keep_parity_consistent() {
    for seed in flashraid_sim::seeds(4) {
        for (level, n) in [
            (Level::Raid5, 4),
            (Level::Raid6, 6),
            (Level::Raid7_3, 7),
            (Level::Raid1, 3),
            (Level::Raid10, 4),
        ] {
            run(level, n, seed * 10 + n as u64);
        }
    }
}
