//! Background init over members holding garbage, with random concurrent IO while it
//! runs (writes, reads, trims, write-zeroes, flushes). The array's content before a write
//! is whatever the data chunks (reference copy on mirrors) held: a read must return that or
//! the last write, and must never change without a write; at the end, after init, a scrub
//! finds nothing, and reads relying on reconstruction equal the model.

use flashraid_control::Init;
use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::{ArrayOffset, Level, Location, StripeIndex};
use flashraid_sim::{SimArray, SimOptions, Ticket};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

struct Inflight {
    ticket: Ticket,
    range: (u64, u64),
    read: Option<Vec<u8>>,
}

fn run(level: Level, members: usize, seed: u64, ops: usize) {
    eprintln!("init model {level} x{members} seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut options = SimOptions::new(seed, level, members);
    options.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    options.shards = rng.random_range(1..=3);
    options.member_bytes = 3 << 20;
    options.init = Init::Background;
    options.config.resync_rate_bytes_per_s = rng.random_range(1..=8) << 20;
    options.config.resync_stripes_max = rng.random_range(1..=4);
    options.config.stripe_run_member_bytes = options.chunk_bytes * rng.random_range(1..=3);
    let mut array = SimArray::create(options).unwrap();
    // Garbage on every member's data area, as a new array over used disks has.
    let sb = array.metadata().superblock().clone();
    let (lo, hi) =
        (sb.data_offset_bytes as usize, (sb.data_offset_bytes + sb.member_data_bytes) as usize);
    for d in &array.devices {
        let mut s = d.state();
        let mut g = vec![0u8; hi - lo];
        rng.fill(g.as_mut_slice());
        s.current[lo..hi].copy_from_slice(&g);
        s.durable[lo..hi].copy_from_slice(&g);
    }
    let g = array.geometry();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    let chunk = u64::from(g.chunk_bytes());
    for c in 0..size / chunk {
        let at = c * chunk;
        let loc = g.locate(ArrayOffset(at)).unwrap();
        let Location { stripe, data_index, .. } = loc;
        let member = g.data_member(stripe, data_index, 0).get();
        let off = lo + g.member_offset(StripeIndex(stripe.0), 0).0 as usize;
        let s = array.devices[member].state();
        model[at as usize..(at + chunk) as usize]
            .copy_from_slice(&s.current[off..off + chunk as usize]);
    }
    let stripe_bytes = g.stripe_data_bytes();
    let mut inflight: Vec<Inflight> = vec![];
    let mut issued = 0;
    while issued < ops || !inflight.is_empty() {
        let mut i = 0;
        while i < inflight.len() {
            if !array.is_done(inflight[i].ticket) {
                i += 1;
                continue;
            }
            let done = inflight.swap_remove(i);
            let result = array.take_result(done.ticket).unwrap();
            match (done.read, result) {
                (Some(want), Ok(Some(got))) => {
                    if got != want {
                        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                        panic!(
                            "{level} seed {seed}: read at {} differs at array byte {}",
                            done.range.0,
                            done.range.0 + first as u64
                        );
                    }
                }
                (_, Ok(_)) => {}
                (_, Err(e)) => panic!("{level} seed {seed}: request {:?} failed: {e}", done.range),
            }
        }
        if issued < ops && inflight.len() < 16 {
            issued += 1;
            let max = if rng.random_bool(0.2) { 3 * stripe_bytes / BLOCK } else { 8 };
            let blocks = rng.random_range(1..=max.min(size / BLOCK));
            let start = rng.random_range(0..=(size / BLOCK - blocks)) * BLOCK;
            let end = start + blocks * BLOCK;
            if inflight.iter().any(|f| f.range.0 < end && start < f.range.1) {
                continue;
            }
            let durability =
                if rng.random_ratio(1, 10) { Durability::Fua } else { Durability::Cached };
            let (op, data, read) = match rng.random_range(0..100) {
                0..=44 => {
                    let mut data = vec![0u8; (end - start) as usize];
                    rng.fill(data.as_mut_slice());
                    model[start as usize..end as usize].copy_from_slice(&data);
                    (
                        ArrayOp::Write {
                            offset: ArrayOffset(start),
                            len_bytes: end - start,
                            durability,
                        },
                        Some(data),
                        None,
                    )
                }
                45..=84 => (
                    ArrayOp::Read { offset: ArrayOffset(start), len_bytes: end - start },
                    None,
                    Some(model[start as usize..end as usize].to_vec()),
                ),
                85..=89 => (ArrayOp::Flush, None, None),
                90..=94 => {
                    let first = start.div_ceil(stripe_bytes) * stripe_bytes;
                    let last = end / stripe_bytes * stripe_bytes;
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
                        None,
                    )
                }
            };
            let range = if matches!(op, ArrayOp::Flush) { (0, 0) } else { (start, end) };
            let ticket = array.submit(op, data.as_deref()).unwrap();
            inflight.push(Inflight { ticket, range, read });
        }
        for _ in 0..rng.random_range(0..4) {
            array.step();
        }
    }
    array.run_until_idle();
    array.check_model(&model, &format!("{level} seed {seed}: after init"));
    let (tally, stopped) = array.scrub(false);
    assert_eq!(
        (tally.mismatches, tally.unreadable, stopped),
        (0, 0, None),
        "{level} seed {seed}: scrub {tally:?}"
    );
    array.fail_all_but(0);
    array.check_model(&model, &format!("{level} seed {seed}: degraded after init"));
}

#[test]
fn background_init_model() {
    for (level, n) in [
        (Level::Raid1, 3),
        (Level::Raid10, 6),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid7_3, 8),
    ] {
        for seed in flashraid_sim::seeds(3) {
            run(level, n, seed, 600);
        }
    }
}
