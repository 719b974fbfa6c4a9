//! Rebuild and re-add under a mix of writes, trims and write-zeroes straddling the cursor,
//! power cuts mid-rebuild, and a second failure after the cut (written by a review,
//! 2026-11-25, which ran it at several hundred seeds and found no bug).

use flashraid_control::Init;
use flashraid_engine::{ArrayOp, Durability};
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::{ArrayOffset, Level};
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

fn options(seed: u64, level: Level, members: usize, rng: &mut StdRng) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.spares = 2;
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.member_bytes = 4 << 20;
    o.init = Init::Zero;
    o.config.rebuild_stripes_max = rng.random_range(1..=4);
    o.config.rebuild_rate_bytes_per_s = 2 << 20;
    o.config.stripe_run_member_bytes = o.chunk_bytes * rng.random_range(1..=3);
    o
}

/// Random writes, trims and write-zeroes (flushed at the end); the model follows.
fn load(array: &mut SimArray, model: &mut [u8], rng: &mut StdRng, count: usize) {
    let size = model.len() as u64;
    let stripe = array.geometry().stripe_data_bytes();
    for _ in 0..count {
        let max = if rng.random_bool(0.3) { 3 * stripe / BLOCK } else { 16 };
        let blocks = rng.random_range(1..=max).min(size / BLOCK);
        let start = rng.random_range(0..=(size / BLOCK - blocks)) * BLOCK;
        let end = start + blocks * BLOCK;
        let durability = if rng.random_bool(0.2) { Durability::Fua } else { Durability::Cached };
        let (op, data) = match rng.random_range(0..10) {
            0..=5 => {
                let mut data = vec![0u8; (end - start) as usize];
                rng.fill(data.as_mut_slice());
                model[start as usize..end as usize].copy_from_slice(&data);
                let op = ArrayOp::Write {
                    offset: ArrayOffset(start),
                    len_bytes: end - start,
                    durability,
                };
                (op, Some(data))
            }
            6..=7 => {
                let first = start.div_ceil(stripe) * stripe;
                let last = end / stripe * stripe;
                if first < last {
                    model[first as usize..last as usize].fill(0);
                }
                (
                    ArrayOp::Discard {
                        offset: ArrayOffset(start),
                        len_bytes: end - start,
                        durability,
                    },
                    None,
                )
            }
            _ => {
                model[start as usize..end as usize].fill(0);
                (
                    ArrayOp::WriteZeroes {
                        offset: ArrayOffset(start),
                        len_bytes: end - start,
                        durability,
                    },
                    None,
                )
            }
        };
        let t = array.submit(op, data.as_deref()).unwrap();
        array.wait(t).unwrap_or_else(|e| panic!("{op:?}: {e:?}"));
    }
    array.flush().unwrap();
}

fn present(devices: Vec<SimMember>) -> Vec<SimMember> {
    devices.into_iter().filter(|d| !d.state().gone).collect()
}

/// A role whose failure now keeps the array within tolerance, other than `not`.
fn second_victim(array: &SimArray, level: Level, rng: &mut StdRng, not: &[usize]) -> Option<usize> {
    let n = array.geometry().member_count();
    let out: Vec<usize> = (0..n).filter(|&r| !array.role_in_service(r)).collect();
    if out.len() + 1 > array.geometry().tolerance() {
        return None;
    }
    let c: Vec<usize> = (0..n)
        .filter(|r| !out.contains(r) && !not.contains(r))
        .filter(|&r| level != Level::Raid10 || !out.contains(&(r ^ 1)))
        .collect();
    (!c.is_empty()).then(|| c[rng.random_range(0..c.len())])
}

fn run(level: Level, members: usize, seed: u64, re_add: bool) {
    eprintln!("mix {level} x{members} seed {seed} re_add {re_add}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opts = options(seed, level, members, &mut rng);
    if re_add {
        opts.spares = 0;
    }
    let mut array = SimArray::create(opts.clone()).unwrap();
    let mut model = vec![0u8; array.array_bytes() as usize];
    load(&mut array, &mut model, &mut rng, 120);
    let first = rng.random_range(0..members);
    let mut away: Vec<SimMember> = vec![];
    let first_device = array.metadata().role_device(first).unwrap();
    array.fail_member(first);
    if re_add {
        away.push(array.devices[first_device].clone());
        load(&mut array, &mut model, &mut rng, 30);
        if rng.random_bool(0.5) {
            array.run_steps(rng.random_range(100..1000));
        }
        array.re_add(first_device).unwrap_or_else(|e| panic!("seed {seed}: re-add: {e}"));
        away.clear();
    }
    array.run_steps(10);
    let cuts = rng.random_range(0..=2u32);
    let mut second_failed = false;
    for cut in 0..cuts {
        for _ in 0..rng.random_range(1..10) {
            array.run_steps(rng.random_range(100..3000));
            let count = rng.random_range(1..6);
            load(&mut array, &mut model, &mut rng, count);
            let at = rng.random_range(0..model.len() as u64 / BLOCK - 8) * BLOCK;
            let got = array.read(at, 8 * BLOCK).unwrap();
            assert!(
                got == model[at as usize..(at + 8 * BLOCK) as usize],
                "seed {seed}: read during rebuild at {at}"
            );
        }
        array.run_steps(1000);
        if !array.is_rebuilding() {
            break;
        }
        let devices = present(array.crash());
        let again = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
            .unwrap_or_else(|e| panic!("seed {seed}: reassembly after cut {cut}: {e}"));
        array = again;
        array.run_steps(10);
        array.check_model(&model, &format!("seed {seed}: after cut {cut}"));
        if !second_failed && rng.random_bool(0.6) {
            let rebuilding = array.metadata().rebuild_in_progress().map(|(r, _)| r.get());
            let not: Vec<usize> = rebuilding.into_iter().collect();
            let victim = if !re_add && rebuilding.is_some() && rng.random_bool(0.4) {
                rebuilding
            } else {
                second_victim(&array, level, &mut rng, &not)
            };
            if let Some(v) = victim {
                eprintln!("  second failure: role {v} (rebuilding {rebuilding:?})");
                let d = array.role_device(v).unwrap();
                array.fail_member(v);
                if re_add {
                    away.push(d);
                }
                second_failed = true;
                load(&mut array, &mut model, &mut rng, 5);
                array.check_model(&model, &format!("seed {seed}: after second failure"));
            }
        }
    }
    array.run_until_rebuilt();
    for m in away {
        let d = match array.devices.iter().position(|x| std::rc::Rc::ptr_eq(&x.0, &m.0)) {
            Some(d) => d,
            None => array.add_device(m),
        };
        match array.re_add(d) {
            Ok(_) => array.run_until_rebuilt(),
            Err(e) => eprintln!("  second re-add refused: {e}"),
        }
    }
    array.run_until_idle();
    array.check_model(&model, &format!("seed {seed}: after rebuilds"));
    let n = array.geometry().member_count();
    if (0..n).all(|r| array.role_in_service(r)) {
        let (tally, stopped) = array.scrub(false);
        assert_eq!(
            (tally.mismatches, tally.unreadable, stopped),
            (0, 0, None),
            "seed {seed}: scrub {tally:?}"
        );
        array.fail_all_but(first);
        array.check_model(&model, &format!("seed {seed}: relying on role {first}"));
    }
}

fn levels() -> Vec<(Level, usize)> {
    vec![
        (Level::Raid1, 3),
        (Level::Raid10, 6),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid7_3, 8),
    ]
}

#[test]
fn mix_rebuild() {
    for (level, n) in levels() {
        for seed in flashraid_sim::seeds(3) {
            run(level, n, seed, false);
        }
    }
}

#[test]
fn mix_re_add() {
    for (level, n) in levels() {
        for seed in flashraid_sim::seeds(3) {
            run(level, n, seed, true);
        }
    }
}
