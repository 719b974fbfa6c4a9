//! Every parity row of many stripes out of service (RAID 5 with one member out, RAID 6 with
//! two, 7.3 with three): writes there go data-only. Then the members come back one by one
//! (re-add: partial rebuild from the missed-write map), with writes and power cuts between;
//! a check scrub finds nothing, and every failure set within tolerance reads the model.
//! (From a review of data-only writes; it passed when written.)
use flashraid_control::Init;
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const B: u64 = 4096;

fn write_random(a: &mut SimArray, model: &mut [u8], rng: &mut StdRng, count: usize, lim: u64) {
    for _ in 0..count {
        let blocks = rng.random_range(1..=16u64).min(lim / B);
        let start = rng.random_range(0..=(lim / B - blocks)) * B;
        let mut data = vec![0u8; (blocks * B) as usize];
        rng.fill(data.as_mut_slice());
        a.write(start, &data).unwrap();
        model[start as usize..(start + blocks * B) as usize].copy_from_slice(&data);
        if rng.random_bool(0.1) {
            a.flush().unwrap();
            a.run_steps(rng.random_range(100..600));
        }
    }
    a.flush().unwrap();
}

fn run(level: Level, n: usize, seed: u64) {
    eprintln!("{level} x{n} seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut o = SimOptions::new(seed, level, n);
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=2);
    o.member_bytes = 4 << 20;
    o.init = Init::Zero;
    o.config.rebuild_stripes_max = rng.random_range(1..=3);
    o.config.rebuild_rate_bytes_per_s = 4 << 20;
    let mut a = SimArray::create(o.clone()).unwrap();
    let size = a.array_bytes();
    let tol = a.geometry().tolerance();
    let mut model = vec![0u8; size as usize];
    write_random(&mut a, &mut model, &mut rng, 60, size);
    a.run_steps(1000);
    let mut out: Vec<usize> = vec![];
    while out.len() < tol {
        let r = rng.random_range(0..n);
        if !out.contains(&r) {
            out.push(r);
        }
    }
    let mut devs: Vec<usize> = out.iter().map(|&r| a.metadata().role_device(r).unwrap()).collect();
    for &r in &out {
        a.fail_member(r);
        write_random(&mut a, &mut model, &mut rng, 30, size);
    }
    a.run_steps(1000);
    if rng.random_bool(0.5) {
        eprintln!("  power cut with {out:?} out");
        let mut devices: Vec<SimMember> = a.crash();
        let mut order: Vec<usize> = (0..devs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(devs[i]));
        let mut pulled = vec![None; devs.len()];
        for i in order {
            pulled[i] = Some(devices.remove(devs[i]));
        }
        a = SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse)
            .unwrap_or_else(|e| panic!("seed {seed}: reassembly: {e}"));
        for (i, p) in pulled.into_iter().enumerate() {
            devs[i] = a.add_device(p.unwrap());
        }
    }
    for (i, &r) in out.iter().enumerate() {
        a.re_add(devs[i]).unwrap_or_else(|e| panic!("seed {seed}: re-add {r}: {e}"));
        write_random(&mut a, &mut model, &mut rng, 10, size);
        a.run_until_rebuilt();
        assert!(a.role_in_service(r));
        a.check_model(&model, &format!("seed {seed}: after re-adding {r}"));
        write_random(&mut a, &mut model, &mut rng, 10, size);
    }
    let (tally, stopped) = a.scrub(false);
    assert_eq!((tally.mismatches, stopped), (0, None), "{level} seed {seed}: scrub");
    let roles: Vec<usize> = (0..n).map(|r| a.metadata().role_device(r).unwrap()).collect();
    let (devices, clean) = a.shutdown_with_state().unwrap();
    assert!(clean);
    // every failure set of size tol
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    for _ in 0..tol {
        sets = sets
            .iter()
            .flat_map(|s| {
                (0..n).filter(move |&r| s.last().is_none_or(|&l| r > l)).map(move |r| {
                    let mut t = s.clone();
                    t.push(r);
                    t
                })
            })
            .collect();
    }
    for set in sets {
        let imgs = (0..n).filter(|r| !set.contains(r)).map(|r| devices[roles[r]].image()).collect();
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
fn parity_rows_all_out_then_re_added() {
    for seed in flashraid_sim::seeds(6) {
        run(Level::Raid6, 6, seed);
        run(Level::Raid7_3, 7, seed + 1000);
        run(Level::Raid5, 4, seed + 2000);
    }
}
