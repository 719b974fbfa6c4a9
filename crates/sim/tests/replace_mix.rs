//! Replaces and re-adds among failures and power cuts, randomized: a second member failing
//! during a replace's copy or its partial rebuild, and a random mix of writes (some in
//! flight at a cut), failures within the tolerance, re-adds, replaces (never while resync
//! is pending: the runtime refuses them then), scrubs and power cuts; every block reads as
//! written (or, for writes in flight at a cut, as old or new) after every step. From a
//! review; they passed when written, and are kept as regression tests.
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn write_some(array: &mut SimArray, model: &mut [u8], rng: &mut StdRng, count: usize) {
    use rand::Rng;
    let size = model.len() as u64;
    for _ in 0..count {
        let blocks = rng.random_range(1..=8u64);
        let start = rng.random_range(0..=(size / 4096 - blocks)) * 4096;
        let mut data = vec![0u8; (blocks * 4096) as usize];
        rng.fill(data.as_mut_slice());
        array.write(start, &data).unwrap();
        model[start as usize..(start + blocks * 4096) as usize].copy_from_slice(&data);
        if rng.random_bool(0.1) {
            array.flush().unwrap();
            array.run_steps(300);
        }
    }
    array.flush().unwrap();
}

/// A second member fails during the copy (copy given up, the copied-to spare takes the failed
/// role in full), or during the partial rebuild after the copy; data stays right.
fn second_failure(level: Level, members: usize, seed: u64) {
    use rand::Rng;
    eprintln!("second failure {level} x{members} seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, members);
    o.spares = 1;
    o.member_bytes = 8 << 20;
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.config.rebuild_rate_bytes_per_s = 4 << 20;
    let mut array = SimArray::create(o.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_some(&mut array, &mut model, &mut rng, 100);
    array.run_steps(1000);
    let role = rng.random_range(0..members);
    let other = (role + rng.random_range(1..members)) % members;
    array.start_replace(role, members);
    let during_copy = rng.random_bool(0.5);
    let mut failed = false;
    while array.is_copying() {
        write_some(&mut array, &mut model, &mut rng, 3);
        array.run_steps(rng.random_range(1..60));
        if during_copy && !failed && rng.random_bool(0.2) && array.is_copying() {
            array.fail_member(other);
            failed = true;
        }
    }
    if !failed
        && level != Level::Raid5
        && level != Level::Raid1
        && !(level == Level::Raid10 && other == role ^ 1)
    {
        // During the partial rebuild (one more out than the copy left).
        write_some(&mut array, &mut model, &mut rng, 5);
        if array.is_rebuilding() {
            array.fail_member(other);
            failed = true;
        }
    }
    array.check_model(&model, &format!("seed {seed}: before the rebuild ends"));
    array.run_until_rebuilt();
    write_some(&mut array, &mut model, &mut rng, 20);
    array.check_model(&model, &format!("seed {seed}: after (failed {failed})"));
    let (tally, stopped) = array.scrub(false);
    if stopped.is_none() {
        assert_eq!(tally.mismatches, 0, "seed {seed}: scrub mismatches");
    }
}

#[test]
fn a_second_failure_during_a_replace_loses_nothing() {
    for seed in 0..12 {
        second_failure(Level::Raid6, 5, seed);
        second_failure(Level::Raid7_3, 6, seed);
        second_failure(Level::Raid5, 4, seed);
        second_failure(Level::Raid10, 4, seed);
    }
}

/// Power cut now; reassemble from the devices the array lists plus the failed members'
/// own devices still out (`away`, renumbered).
fn cut(
    array: SimArray,
    away: &mut Vec<(usize, usize)>,
    o: &SimOptions,
    seed: u64,
    round: usize,
) -> SimArray {
    let listed: Vec<bool> = (0..array.devices.len())
        .map(|d| {
            array.metadata().lists(d)
                || away
                    .iter()
                    .any(|&(dev, role)| dev == d && array.metadata().role_device(role).is_none())
        })
        .collect();
    let devices = array.crash();
    let mut keep = vec![];
    let mut map = vec![None; devices.len()];
    for (d, device) in devices.into_iter().enumerate() {
        if listed[d] {
            device.state().gone = false;
            map[d] = Some(keep.len());
            keep.push(device);
        }
    }
    *away = away.iter().filter_map(|&(d, r)| map[d].map(|n| (n, r))).collect();
    SimArray::assemble(keep, o.clone(), DirtyDegraded::Refuse)
        .unwrap_or_else(|e| panic!("seed {seed} round {round}: reassembly: {e}"))
}

/// Random mix: writes (some in flight), member failures within the tolerance, re-adds of
/// the failed members, replaces, and power cuts taken with the bitmap clean (so every start
/// is allowed); after each step every block reads as written.
fn mix(level: Level, members: usize, seed: u64) {
    use rand::Rng;
    eprintln!("mix {level} x{members} seed {seed} (FLASHRAID_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, members);
    o.spares = 2;
    o.member_bytes = 8 << 20;
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.config.rebuild_stripes_max = rng.random_range(1..=4);
    o.config.rebuild_rate_bytes_per_s = 0;
    let mut array = SimArray::create(o.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_some(&mut array, &mut model, &mut rng, 60);
    // Devices of failed roles that may come back: (device, role).
    let mut away: Vec<(usize, usize)> = vec![];
    for round in 0..40 {
        let what = [0, 1, 1, 2, 2, 2, 3, 4, 5, 5, 6][rng.random_range(0..11)];
        let resyncing = array.resync_pending();
        let tolerance = array.geometry().tolerance();
        let missing = array.metadata().missing_roles();
        let rebuilding = array.is_rebuilding();
        let out = missing.len() + usize::from(rebuilding);
        match what {
            0 if out < tolerance && !array.is_copying() && !resyncing => {
                let role = rng.random_range(0..members);
                let raid10_pair_out = level == Level::Raid10
                    && (missing.contains(&(role ^ 1))
                        || array
                            .metadata()
                            .rebuild_in_progress()
                            .is_some_and(|(r, _)| r.get() == role ^ 1));
                if let Some(device) = array.metadata().role_device(role)
                    && !raid10_pair_out
                    && array.metadata().rebuild_in_progress().is_none_or(|(r, _)| r.get() != role)
                {
                    eprintln!("  round {round}: fail role {role}");
                    array.fail_member(role);
                    away.push((device, role));
                }
            }
            1 if !away.is_empty() && !rebuilding && !array.is_copying() => {
                let (device, role) = away.remove(rng.random_range(0..away.len()));
                match array.re_add(device) {
                    Ok(r) => eprintln!("  round {round}: re-add role {role}: {r:?}"),
                    Err(e) => eprintln!("  round {round}: re-add role {role} refused: {e}"),
                }
            }
            2 if missing.is_empty()
                && !resyncing
                && !rebuilding
                && !array.is_copying()
                && !array.metadata().spare_devices().is_empty() =>
            {
                let role = rng.random_range(0..members);
                let spare = array.metadata().spare_devices()[0];
                eprintln!("  round {round}: replace role {role} by device {spare}");
                array.start_replace(role, spare);
            }
            3 => {
                // Power cut with everything flushed and the bits cleared.
                array.flush().unwrap();
                array.run_steps(1000);
                eprintln!("  round {round}: power cut (rebuilding {})", array.is_rebuilding());
                array = cut(array, &mut away, &o, seed, round);
                // Devices left out at the start (failed roles) are not held by the sim.
                for &(d, _) in &away {
                    array.devices[d].state().gone = true;
                }
            }
            5 if missing.is_empty() && !rebuilding && !array.is_copying() => {
                // Power cut with writes in flight, every member in service: afterwards each
                // 4 KiB block of those writes holds the old or the new bytes.
                array.flush().unwrap();
                let mut inflight = vec![];
                for _ in 0..rng.random_range(1..6) {
                    let blocks = rng.random_range(1..=16u64);
                    let start = rng.random_range(0..=(size / 4096 - blocks)) * 4096;
                    if inflight.iter().any(|&(s, l, _): &(u64, u64, Vec<u8>)| {
                        start < s + l && s < start + blocks * 4096
                    }) {
                        continue;
                    }
                    let mut data = vec![0u8; (blocks * 4096) as usize];
                    rng.fill(data.as_mut_slice());
                    let op = flashraid_engine::ArrayOp::Write {
                        offset: flashraid_layout::ArrayOffset(start),
                        len_bytes: blocks * 4096,
                        durability: flashraid_engine::Durability::Cached,
                    };
                    array.submit(op, Some(&data)).unwrap();
                    inflight.push((start, blocks * 4096, data));
                }
                array.run_steps(rng.random_range(0..20));
                eprintln!("  round {round}: dirty power cut");
                array = cut(array, &mut away, &o, seed, round);
                for &(d, _) in &away {
                    array.devices[d].state().gone = true;
                }
                for (start, len, data) in inflight {
                    let got = array.read(start, len).unwrap();
                    for b in 0..(len / 4096) as usize {
                        let r = b * 4096..(b + 1) * 4096;
                        let m = start as usize + b * 4096;
                        let old = &model[m..m + 4096];
                        assert!(
                            got[r.clone()] == *old || got[r.clone()] == data[r.clone()],
                            "seed {seed} round {round}: block at {m} neither old nor new"
                        );
                        model[m..m + 4096].copy_from_slice(&got[r]);
                    }
                }
            }
            6 if !rebuilding && !resyncing && missing.is_empty() => {
                let (tally, stopped) = array.scrub(true);
                eprintln!("  round {round}: scrub (copying {})", array.is_copying());
                assert_eq!(tally.mismatches, 0, "seed {seed} round {round}: scrub {stopped:?}");
            }
            _ => {
                eprintln!("  round {round}: nothing");
            }
        }
        let n = rng.random_range(1..10);
        write_some(&mut array, &mut model, &mut rng, n);
        array.run_steps(rng.random_range(0..3000));
        array.check_model(&model, &format!("seed {seed} round {round}"));
    }
    array.run_until_rebuilt();
    while array.is_copying() {
        array.run_steps(100);
    }
    array.run_until_rebuilt();
    array.check_model(&model, &format!("seed {seed}: at the end"));
}

#[test]
fn a_random_mix_of_failures_re_adds_replaces_and_cuts_loses_nothing() {
    for seed in flashraid_sim::seeds(6) {
        mix(Level::Raid5, 4, seed);
        mix(Level::Raid6, 5, seed);
        mix(Level::Raid7_3, 6, seed);
        mix(Level::Raid1, 3, seed);
        mix(Level::Raid10, 4, seed);
    }
}
