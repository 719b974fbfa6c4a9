//! `replace` by copying: a member is copied to a hot spare step by step while reads and
//! writes go on (some flushed, some still in flight as the copy passes them), every region
//! written meanwhile recorded in the missed-write map; then the member is failed and the
//! spare takes the role with a partial rebuild of those regions. Then:
//! - fewer stripes are rebuilt than a full rebuild would (the copy did the rest);
//! - every block reads as the model says, also with other members failed up to the level's
//!   tolerance so that reads depend on the replacement;
//! - power loss during the copy leaves the array whole (the spare stays a spare), and power
//!   loss during the partial rebuild resumes it, still partial.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more
//! (`FLASHRAID_SEED_FROM=f`: from seed f).

use flashraid_control::Init;
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

fn options(seed: u64, level: Level, members: usize, rng: &mut StdRng) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.spares = 1;
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.member_bytes = 8 << 20;
    o.init = Init::Zero;
    o.config.rebuild_stripes_max = rng.random_range(1..=4);
    o.config.rebuild_rate_bytes_per_s = 4 << 20;
    o
}

fn check_all(array: &mut SimArray, model: &[u8], what: &str) {
    array.check_model(model, what);
}

/// Random writes inside `[0, limit)`, waited for only every few, so some are in flight while
/// the harness steps (and the copy passes them).
fn write_some(array: &mut SimArray, model: &mut [u8], rng: &mut StdRng, count: usize, limit: u64) {
    let mut tickets = vec![];
    for _ in 0..count {
        let blocks = rng.random_range(1..=8u64);
        let start = rng.random_range(0..=(limit / BLOCK - blocks)) * BLOCK;
        // Disjoint from the writes still in flight, so the model's order is the array's.
        if tickets.iter().any(|&(s, b, _)| start < s + b * BLOCK && s < start + blocks * BLOCK) {
            continue;
        }
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        let op = flashraid_engine::ArrayOp::Write {
            offset: flashraid_layout::ArrayOffset(start),
            len_bytes: blocks * BLOCK,
            durability: flashraid_engine::Durability::Cached,
        };
        tickets.push((start, blocks, array.submit(op, Some(&data)).unwrap()));
        model[start as usize..(start + blocks * BLOCK) as usize].copy_from_slice(&data);
        array.run_steps(rng.random_range(0..3));
    }
    for (_, _, ticket) in tickets {
        array.wait(ticket).unwrap();
    }
}

fn run(level: Level, members: usize, seed: u64) {
    eprintln!("replace {level} x{members} seed {seed} (replay with FLASHRAID_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let opts = options(seed, level, members, &mut rng);
    let mut array = SimArray::create(opts.clone()).unwrap();
    let size = array.array_bytes();
    let stripes = array.geometry().stripes();
    let mut model = vec![0u8; size as usize];
    write_some(&mut array, &mut model, &mut rng, 150, size);
    array.flush().unwrap();
    // Let the bits of the fill clear, so the partial rebuild shows what the copy saved.
    array.run_steps(1000);
    let role = rng.random_range(0..members);
    let mut spare = members; // the created spare's device index
    let old = array.metadata().role_device(role).expect("role held");
    array.start_replace(role, spare);
    let mut cut_during_copy = false;
    // Writes in the first quarter while the copy runs, with reads checked now and then.
    while array.is_copying() {
        write_some(&mut array, &mut model, &mut rng, 4, size / 4);
        if rng.random_bool(0.3) {
            array.flush().unwrap();
        }
        if rng.random_bool(0.1) {
            let at = rng.random_range(0..size / BLOCK - 8) * BLOCK;
            let got = array.read(at, 8 * BLOCK).unwrap();
            assert!(got == model[at as usize..(at + 8 * BLOCK) as usize], "read during the copy");
        }
        array.run_steps(rng.random_range(1..40));
        if rng.random_bool(0.25) {
            // Idle past the clearing delay (2 ms = 200 steps): the bits of regions the copy
            // already passed clear, and only the missed-write map still names them.
            array.flush().unwrap();
            array.run_steps(300);
        }
        if !cut_during_copy && array.is_copying() && rng.random_bool(0.08) {
            // Power loss during the copy: everything written was waited for and (below)
            // flushed; the spare is still a spare and the replace starts again.
            array.flush().unwrap();
            if !array.is_copying() {
                continue;
            }
            cut_during_copy = true;
            eprintln!("  power loss during the copy");
            let devices = array.crash();
            array = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
                .unwrap_or_else(|e| panic!("seed {seed}: reassembly during the copy: {e}"));
            check_all(&mut array, &model, &format!("seed {seed}: after a cut during the copy"));
            array.run_steps(1000);
            array.start_replace(role, spare);
        }
    }
    array.flush().unwrap();
    assert!(array.is_rebuilding(), "seed {seed}: the copied spare did not take the role");
    assert!(array.metadata().rebuild_is_partial(), "seed {seed}: the rebuild is not partial");
    if rng.random_bool(0.5) {
        array.run_steps(rng.random_range(10..2000));
        if array.is_rebuilding() {
            eprintln!("  power loss during the partial rebuild");
            array.run_steps(1000);
            // The replaced member is out of the array: it is not assembled again.
            let mut devices = array.crash();
            devices.remove(old);
            if spare > old {
                spare -= 1;
            }
            array = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
                .unwrap_or_else(|e| panic!("seed {seed}: reassembly during the rebuild: {e}"));
        }
    }
    let before = array.counters().rebuild_stripes;
    array.run_until_rebuilt();
    assert!(array.role_in_service(role), "seed {seed}: role {role} not back in service");
    assert_eq!(array.metadata().role_device(role), Some(spare), "seed {seed}: not the spare");
    let rebuilt = array.counters().rebuild_stripes - before;
    eprintln!("  {rebuilt} of {stripes} stripes rebuilt after the copy");
    assert!(rebuilt < stripes * 3 / 4, "seed {seed}: {rebuilt} of {stripes}: not partial");
    check_all(&mut array, &model, &format!("seed {seed}: after the replace"));
    let (tally, stopped) = array.scrub(false);
    assert_eq!((tally.mismatches, stopped), (0, None), "seed {seed}: scrub after the replace");
    // Lean on the replacement.
    array.fail_all_but(role);
    check_all(&mut array, &model, &format!("seed {seed}: relying on the replacement"));
}

#[test]
fn replace_copies_the_member_and_rebuilds_only_what_changed_meanwhile() {
    flashraid_sim::for_each_redundant_level(run);
}
