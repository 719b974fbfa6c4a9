//! A member that left and comes back (`spare add` of the array's own failed member, like
//! mdadm's `--re-add`): it takes its role back and only the regions the missed-write map
//! names are rebuilt. Writes go on while it is away, confined to part of the array, with a
//! pause now and then so the write-intent bits clear into the missed-write map (the path
//! that must not lose a region) and sometimes a re-add right after writes (their bits are
//! still in the write-intent bitmap). Then:
//! - the rebuild reconstructs fewer stripes than a full one would;
//! - with the other members failed up to the level's tolerance, every read that now needs the
//!   re-added member returns the model's data (so nothing it missed was left stale);
//! - power loss during the partial rebuild resumes it, still partial, from the durable cursor;
//! - the map is emptied once every role is back, and a second failure and re-add work again.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more
//! (`FLASHRAID_SEED_FROM=f`: from seed f).

use flashraid_control::Init;
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

fn options(seed: u64, level: Level, members: usize, rng: &mut StdRng) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.member_bytes = 8 << 20;
    o.init = Init::Zero;
    o.config.rebuild_stripes_max = rng.random_range(1..=4);
    o.config.rebuild_rate_bytes_per_s = 4 << 20;
    o
}

/// Random flushed writes inside `[0, limit)` of the array.
fn write_random(
    array: &mut SimArray,
    model: &mut [u8],
    rng: &mut StdRng,
    count: usize,
    limit: u64,
) {
    for _ in 0..count {
        let blocks = rng.random_range(1..=16u64).min(limit / BLOCK);
        let start = rng.random_range(0..=(limit / BLOCK - blocks)) * BLOCK;
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        array.write(start, &data).unwrap();
        model[start as usize..(start + blocks * BLOCK) as usize].copy_from_slice(&data);
        if rng.random_bool(0.1) {
            // Idle long enough (clear delay 2 ms = 200 steps) for write-intent bits to clear.
            array.flush().unwrap();
            array.run_steps(rng.random_range(100..600));
        }
    }
    array.flush().unwrap();
}

fn check_all(array: &mut SimArray, model: &[u8], what: &str) {
    array.check_model(model, what);
}

/// The device index holding `role` now.
fn device_of(array: &SimArray, role: usize) -> usize {
    array.metadata().role_device(role).expect("role held")
}

fn rebuild_stripes(array: &SimArray) -> u64 {
    array.counters().rebuild_stripes
}

fn run(level: Level, members: usize, seed: u64) {
    eprintln!("re-add {level} x{members} seed {seed} (replay with FLASHRAID_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let opts = options(seed, level, members, &mut rng);
    let mut array = SimArray::create(opts.clone()).unwrap();
    let size = array.array_bytes();
    let stripes = array.geometry().stripes();
    let mut model = vec![0u8; size as usize];
    write_random(&mut array, &mut model, &mut rng, 100, size);
    array.run_steps(1000);

    // Round 1: a member leaves, writes go on in the first quarter, it comes back.
    let away = rng.random_range(0..members);
    let mut device = device_of(&array, away);
    array.fail_member(away);
    write_random(&mut array, &mut model, &mut rng, 60, size / 4);
    if rng.random_bool(0.5) {
        array.run_steps(1000);
    }
    if rng.random_bool(0.5) {
        // Power loss while it is away: the map comes back from the members' disks.
        eprintln!("  power loss while it is away");
        array.run_steps(1000);
        let mut devices: Vec<SimMember> = array.crash();
        let pulled = devices.remove(device);
        array = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
            .unwrap_or_else(|e| panic!("seed {seed}: reassembly while degraded: {e}"));
        assert!(array.missed_regions_set() > 0, "seed {seed}: the map did not survive");
        device = array.add_device(pulled);
    }
    let before = rebuild_stripes(&array);
    // Now and then, writes in flight across the re-add (planned while the member was out,
    // issued after): a few disjoint 16 KiB pieces anywhere in the array.
    let mut tickets = vec![];
    let slots = size / (4 * BLOCK);
    let in_flight = if rng.random_bool(0.5) { rng.random_range(1..=3) } else { 0 };
    let mut chosen: Vec<u64> = (0..in_flight).map(|_| rng.random_range(0..slots)).collect();
    chosen.sort_unstable();
    chosen.dedup();
    for slot in chosen {
        let at = slot * 4 * BLOCK;
        let mut data = vec![0u8; (4 * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        let op = flashraid_engine::ArrayOp::Write {
            offset: flashraid_layout::ArrayOffset(at),
            len_bytes: 4 * BLOCK,
            durability: flashraid_engine::Durability::Cached,
        };
        tickets.push(array.submit(op, Some(&data)).unwrap());
        model[at as usize..(at + 4 * BLOCK) as usize].copy_from_slice(&data);
    }
    array.run_steps(rng.random_range(0..4));
    let role = array.re_add(device).unwrap_or_else(|e| panic!("seed {seed}: re-add: {e}"));
    assert_eq!(role.get(), away);
    for ticket in tickets {
        array
            .wait(ticket)
            .unwrap_or_else(|e| panic!("seed {seed}: a write across the re-add: {e:?}"));
    }
    array.flush().unwrap();
    // Power loss during the partial rebuild, now and then: it resumes, still partial.
    if rng.random_bool(0.5) {
        array.run_steps(rng.random_range(10..3000));
        if array.is_rebuilding() {
            array.run_steps(1000);
            eprintln!("  power loss during the partial rebuild");
            let devices: Vec<SimMember> = array.crash();
            array = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
                .unwrap_or_else(|e| panic!("seed {seed}: reassembly during the re-add: {e}"));
            if array.is_rebuilding() {
                assert!(
                    array.metadata().rebuild_is_partial(),
                    "seed {seed}: the resumed rebuild is not partial"
                );
            }
        }
    }
    // Reads and writes during the partial rebuild, on both sides of its cursor.
    write_random(&mut array, &mut model, &mut rng, 10, size);
    array.run_until_rebuilt();
    assert!(array.role_in_service(away), "seed {seed}: role {away} not back in service");
    let rebuilt = rebuild_stripes(&array).saturating_sub(before);
    eprintln!("  {rebuilt} of {stripes} stripes rebuilt");
    // The writes in flight across the re-add may add up to three regions.
    let bound = if in_flight == 0 { stripes * 3 / 4 } else { stripes };
    assert!(
        rebuilt < bound,
        "seed {seed}: {rebuilt} of {stripes} stripes rebuilt: not a partial rebuild"
    );
    check_all(&mut array, &model, &format!("seed {seed}: after the re-add"));
    let (tally, stopped) = array.scrub(false);
    assert_eq!((tally.mismatches, stopped), (0, None), "seed {seed}: scrub after the re-add");
    array.run_steps(1000);
    assert_eq!(array.missed_regions_set(), 0, "seed {seed}: the map was not emptied");

    // Round 2: another member leaves and comes back, the same way.
    let second = (away + 1 + rng.random_range(0..members - 1)) % members;
    let device = device_of(&array, second);
    array.fail_member(second);
    write_random(&mut array, &mut model, &mut rng, 40, size / 4);
    array.re_add(device).unwrap_or_else(|e| panic!("seed {seed}: second re-add: {e}"));
    array.run_until_rebuilt();
    check_all(&mut array, &model, &format!("seed {seed}: after the second re-add"));

    // Lean on the member that came back first: what it missed must have been rebuilt.
    array.fail_all_but(away);
    check_all(&mut array, &model, &format!("seed {seed}: relying on the re-added member"));
}

/// Seeds that once failed, run every time.
#[test]
fn regressions() {
    // An RMW planned while the member was out, issued after the re-add: the member turned
    // usable under it and it wrote a parity row it never read (write.rs assertion).
    run(Level::Raid6, 6, 506);
}

#[test]
fn a_returning_member_gets_only_what_it_missed() {
    flashraid_sim::for_each_redundant_level(run);
}

/// A member that failed while it was being rebuilt holds chunks that were never written: it
/// cannot be re-added, only rebuilt in full.
#[test]
fn a_member_that_failed_during_its_rebuild_is_not_re_added() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut opts = options(7, Level::Raid6, 6, &mut rng);
    opts.config.rebuild_rate_bytes_per_s = 1 << 20;
    let mut array = SimArray::create(opts).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_random(&mut array, &mut model, &mut rng, 50, size);
    let device = device_of(&array, 2);
    array.fail_member(2);
    write_random(&mut array, &mut model, &mut rng, 20, size);
    array.re_add(device).unwrap();
    array.run_steps(50);
    assert!(array.is_rebuilding());
    array.fail_member(2);
    let refused = array.re_add(device).unwrap_err();
    assert!(refused.contains("not in sync"), "{refused}");
    check_all(&mut array, &model, "after the refusal");
}

fn plain_options(seed: u64, level: Level, members: usize) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.chunk_bytes = 4096;
    o.shards = 1;
    o.member_bytes = 8 << 20;
    o.init = Init::Zero;
    o.config.rebuild_rate_bytes_per_s = 0;
    o
}

/// Review finding: a member that rejoined got blank maps, so when it was the only holder left
/// at a restart, the map was lost and a later re-add rebuilt nothing. RAID 1 x3: X leaves,
/// writes; Y fails and is re-added; A fails; restart with Y alone; X re-added must still get
/// what it missed.
#[test]
fn the_map_survives_when_only_a_member_that_rejoined_is_left() {
    let o = plain_options(1, Level::Raid1, 3);
    let mut rng = StdRng::seed_from_u64(1);
    let mut array = SimArray::create(o.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_random(&mut array, &mut model, &mut rng, 50, size);
    array.run_steps(2000);
    let (a, x, y) = (device_of(&array, 0), device_of(&array, 1), device_of(&array, 2));
    array.fail_member(1);
    write_random(&mut array, &mut model, &mut rng, 40, size / 4);
    array.run_steps(2000);
    assert!(array.missed_regions_set() > 0);
    array.fail_member(2);
    array.run_until_idle();
    array.re_add(y).unwrap();
    array.run_until_rebuilt();
    array.fail_member(0);
    array.run_until_idle();
    let mut devices = array.crash();
    assert!(a < x && x < y);
    let x_device = devices.remove(x);
    devices.remove(a);
    let mut array = SimArray::assemble(devices, o, DirtyDegraded::Refuse).unwrap();
    assert!(array.missed_regions_set() > 0, "the map was lost at the restart");
    let x = array.add_device(x_device);
    array.re_add(x).unwrap();
    array.run_until_rebuilt();
    // Y fails: every read now comes from X.
    array.fail_member(1 + 1);
    array.run_until_idle();
    check_all(&mut array, &model, "relying on the member re-added after the restart");
}

/// Review finding: re-adding a member of a RAID 0 array recorded a rebuild the engine then
/// refused with a panic. A level with no redundancy has nothing to rebuild from: with a
/// member out it is failed past its tolerance, and the member is kept for a forced start.
#[test]
fn a_raid0_member_is_not_re_added() {
    let mut array = SimArray::create(plain_options(3, Level::Raid0, 2)).unwrap();
    let x = device_of(&array, 1);
    array.fail_member(1);
    array.run_until_idle();
    let refused = array.re_add(x).unwrap_err();
    assert!(refused.contains("failed past its tolerance"), "{refused}");
}
