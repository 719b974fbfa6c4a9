//! Degraded reads rebuild a missing chunk straight into the reading request's buffer when one
//! request wants it over the whole rebuilt range, and in scratch (then copied) otherwise: two
//! merged reads that want the same chunk, or two targets whose segments differ. Both ways,
//! over sub-ranges and offsets within a chunk, with one, two and three members missing, must
//! return exactly the bytes written (the harness poisons every read buffer first, so a byte
//! the engine put in the wrong place or never wrote shows), and a read error on a member in
//! service is rewritten from wherever the chunk was rebuilt.

use flashraid_engine::ArrayOp;
use flashraid_format::layout::DATA_OFFSET_BYTES;
use flashraid_layout::{ArrayOffset, Level, Location, MemberIndex, Role, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

/// Levels with the roles failed in them: every count up to each level's tolerance.
fn cases() -> Vec<(Level, usize, Vec<usize>)> {
    vec![
        (Level::Raid5, 4, vec![1]),
        (Level::Raid6, 6, vec![0]),
        (Level::Raid6, 6, vec![2, 5]),
        (Level::Raid7_3, 7, vec![3]),
        (Level::Raid7_3, 7, vec![1, 4]),
        (Level::Raid7_3, 7, vec![0, 2, 6]),
    ]
}

/// Submit `reads` all at once (so that those on one stripe queue and merge into one
/// operation), then check each against `model`.
fn read_batch(array: &mut SimArray, model: &[u8], reads: &[(u64, u64)], what: &str) {
    let tickets: Vec<_> = reads
        .iter()
        .map(|&(offset, len_bytes)| {
            let op = ArrayOp::Read { offset: ArrayOffset(offset), len_bytes };
            array.submit(op, None).unwrap()
        })
        .collect();
    for (&ticket, &(offset, len)) in tickets.iter().zip(reads) {
        let got = array.wait(ticket).unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
        let want = &model[offset as usize..(offset + len) as usize];
        if got.as_deref() != Some(want) {
            let got = got.unwrap_or_default();
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!("{what}: read {offset}+{len} (batch {reads:?}) differs from byte {first}");
        }
    }
}

/// Reads of every shape around each stripe's chunks: within a chunk at an offset, a whole
/// chunk, across chunk and stripe boundaries; alone and in merged batches.
fn read_shapes(array: &mut SimArray, model: &[u8], rng: &mut StdRng, what: &str) {
    let g = array.geometry();
    let chunk = u64::from(g.chunk_bytes());
    let stripe_bytes = g.stripe_data_bytes();
    let size = array.array_bytes();
    let stripes = size / stripe_bytes;
    for stripe in [0, 1, stripes / 2, stripes - 2] {
        let base = stripe * stripe_bytes;
        for c in 0..g.data_chunks() as u64 {
            let at = base + c * chunk;
            // 4 KiB at each offset in the chunk, the whole chunk, and a piece that crosses
            // into the next chunk.
            for block in 0..chunk / BLOCK {
                read_batch(array, model, &[(at + block * BLOCK, BLOCK)], what);
            }
            read_batch(array, model, &[(at, chunk)], what);
            read_batch(array, model, &[(at + chunk - BLOCK, 2 * BLOCK)], what);
            // Merged: the same chunk read whole, then in two halves, then overlapping.
            let half = chunk / 2;
            let batch = [(at, chunk), (at, half), (at + half, half), (at + BLOCK, 2 * BLOCK)];
            read_batch(array, model, &batch, what);
        }
        read_batch(array, model, &[(base, stripe_bytes), (base + BLOCK, stripe_bytes)], what);
    }
    for _ in 0..200 {
        let window = rng.random_range(0..stripes - 2) * stripe_bytes;
        let count = rng.random_range(1..=6);
        let reads: Vec<(u64, u64)> = (0..count)
            .map(|_| {
                let offset = window + rng.random_range(0..2 * stripe_bytes / BLOCK) * BLOCK;
                let len = BLOCK * rng.random_range(1..=3 * chunk / BLOCK);
                (offset, len.min(size - offset))
            })
            .collect();
        read_batch(array, model, &reads, what);
    }
}

#[test]
fn degraded_reads_of_every_shape_return_what_was_written() {
    for seed in flashraid_sim::seeds(2) {
        for (level, n, failed) in cases() {
            let what = format!("seed {seed} {level} x{n} without {failed:?}");
            let mut options = SimOptions::new(seed, level, n);
            options.member_bytes = 3 << 20;
            let mut array = SimArray::create(options).unwrap();
            let mut rng = StdRng::seed_from_u64(seed);
            let model = array.fill_random(&mut rng);
            for &role in &failed {
                array.fail_member(role);
            }
            let before = array.counters();
            read_shapes(&mut array, &model, &mut rng, &what);
            let c = array.counters();
            let (reads, in_place) = (
                c.degraded_reads - before.degraded_reads,
                c.degraded_reads_in_place - before.degraded_reads_in_place,
            );
            eprintln!("{what}: {reads} degraded reads, {in_place} targets rebuilt in place");
            assert!(in_place > 0, "{what}: nothing was rebuilt in the request's buffer");
            if failed.len() == 1 {
                // One target per degraded read: those not rebuilt in place went to scratch.
                assert!(in_place < reads, "{what}: nothing was rebuilt in scratch");
            }
        }
    }
}

/// A read error on a member in service makes its chunk one more target; rebuilt in the
/// request's buffer, the bad range is rewritten from there, with the right bytes. (Every
/// 4 KiB unit of the chunk is bad: a chunk with readable units is rebuilt in scratch, so
/// that the units read stay as read; `read_repair_units.rs`.)
#[test]
fn a_read_error_is_rewritten_from_a_chunk_rebuilt_in_place() {
    for (level, n, failed) in [(Level::Raid6, 6, vec![0]), (Level::Raid7_3, 7, vec![0, 4])] {
        let what = format!("{level} x{n} without {failed:?}");
        let mut options = SimOptions::new(11, level, n);
        options.member_bytes = 3 << 20;
        let mut array = SimArray::create(options).unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let model = array.fill_random(&mut rng);
        for &role in &failed {
            array.fail_member(role);
        }
        let g = array.geometry();
        let chunk = u64::from(g.chunk_bytes());
        let stripe = StripeIndex(3);
        // A data chunk of the stripe on a member in service, not the first (so the read
        // below starts in the chunk before it, and the chunk is not at its buffer's start).
        let (member, c) = (0..n)
            .filter(|m| !failed.contains(m))
            .find_map(|m| match g.role(stripe, MemberIndex(m as u16)) {
                Role::Data { index, .. } if index > 0 => Some((m, index)),
                _ => None,
            })
            .unwrap();
        let chunk_at_member = DATA_OFFSET_BYTES + g.member_offset(stripe, 0).0;
        let device = array.role_device(member).unwrap();
        device.state().bad_ranges.push((chunk_at_member, chunk));
        let at = g.array_offset(Location { stripe, data_index: c, offset_in_chunk_bytes: 0 }).0;
        let before = array.counters();
        read_batch(&mut array, &model, &[(at - BLOCK, BLOCK + chunk)], &what);
        array.run_until_idle();
        let after = array.counters();
        assert_eq!(after.degraded_reads_in_place, before.degraded_reads_in_place + 1, "{what}");
        assert!(after.errors_corrected > before.errors_corrected, "{what}: not rewritten");
        let state = device.state();
        assert!(state.bad_ranges.is_empty(), "{what}: the bad range is still there");
        let on_member = &state.current[chunk_at_member as usize..][..chunk as usize];
        let want = &model[at as usize..][..chunk as usize];
        assert!(on_member == want, "{what}: the rewritten chunk differs from what was written");
    }
}

/// Found useful by the review of the in-place rebuild: batches of 1-6 random reads that
/// merge, with fresh bad sectors on members in service (within the tolerance left), on every
/// parity level with members missing, long and short IO delays (a buffer reused too early
/// shows), one and two shards: every byte returned matches the model, and after going idle
/// every member's data area is byte-identical to before (each read-error rewrite put back
/// exactly what was there).
#[test]
fn merged_degraded_reads_with_bad_sectors_return_and_rewrite_right_bytes() {
    let cases: Vec<(Level, usize, Vec<usize>)> = vec![
        (Level::Raid5, 4, vec![]),
        (Level::Raid5, 5, vec![2]),
        (Level::Raid6, 6, vec![]),
        (Level::Raid6, 6, vec![1]),
        (Level::Raid6, 5, vec![0, 3]),
        (Level::Raid7_3, 7, vec![3]),
        (Level::Raid7_3, 7, vec![1, 4]),
        (Level::Raid7_3, 8, vec![]),
    ];
    let mut total_in_place = 0;
    let mut total_corrected = 0;
    for seed in 0..3u64 {
        for (level, n, failed) in cases.clone() {
            let what = format!("seed {seed} {level} x{n} without {failed:?}");
            let mut options = SimOptions::new(seed, level, n);
            options.member_bytes = 2 << 20;
            options.shards = 1 + (seed % 2) as u32;
            options.delay_steps_max = if seed % 3 == 0 { 25 } else { 3 };
            let mut array = SimArray::create(options).unwrap();
            let mut rng = StdRng::seed_from_u64(seed * 31 + n as u64);
            let mut model = array.fill_random(&mut rng);
            array.flush().unwrap();
            for &role in &failed {
                array.fail_member(role);
            }
            let g = array.geometry();
            let chunk = u64::from(g.chunk_bytes());
            let stripe_bytes = g.stripe_data_bytes();
            let size = array.array_bytes();
            let stripes = size / stripe_bytes;
            let alive: Vec<usize> = (0..n).filter(|m| !failed.contains(m)).collect();
            let mut snapshot: Vec<Vec<u8>> = alive
                .iter()
                .map(|&m| array.role_device(m).unwrap().state().current.clone())
                .collect();
            let before = array.counters();
            for round in 0..60 {
                // A few bad sectors on members in service, in a window of stripes.
                let window = rng.random_range(0..stripes - 2);
                let spare_tolerance = match level {
                    Level::Raid5 => 1,
                    Level::Raid6 => 2,
                    _ => 3,
                } - failed.len();
                for &m in &alive {
                    array.role_device(m).unwrap().state().bad_ranges.clear();
                }
                if rng.random_bool(0.3) {
                    let o = window * stripe_bytes
                        + rng.random_range(0..2 * stripe_bytes / BLOCK) * BLOCK;
                    let l = (BLOCK * rng.random_range(1..=2 * chunk / BLOCK)).min(size - o);
                    let data: Vec<u8> = (0..l).map(|_| rng.random()).collect();
                    array.write(o, &data).unwrap();
                    model[o as usize..(o + l) as usize].copy_from_slice(&data);
                    array.run_until_idle();
                    snapshot = alive
                        .iter()
                        .map(|&m| array.role_device(m).unwrap().state().current.clone())
                        .collect();
                }
                let mut used: Vec<usize> = vec![];
                for _ in 0..spare_tolerance {
                    if !rng.random_bool(0.7) {
                        continue;
                    }
                    let m = alive[rng.random_range(0..alive.len())];
                    if used.contains(&m) {
                        continue;
                    }
                    used.push(m);
                    let st = window + rng.random_range(0..2);
                    let at =
                        DATA_OFFSET_BYTES + st * chunk + rng.random_range(0..chunk / BLOCK) * BLOCK;
                    let len = BLOCK * rng.random_range(1..=2);
                    array.role_device(m).unwrap().state().bad_ranges.push((at, len));
                }
                let count = rng.random_range(1..=6);
                let reads: Vec<(u64, u64)> = (0..count)
                    .map(|_| {
                        let offset = window * stripe_bytes
                            + rng.random_range(0..2 * stripe_bytes / BLOCK) * BLOCK;
                        let len = BLOCK * rng.random_range(1..=3 * chunk / BLOCK);
                        (offset, len.min(size - offset))
                    })
                    .collect();
                let tickets: Vec<_> = reads
                    .iter()
                    .map(|&(o, l)| {
                        array
                            .submit(ArrayOp::Read { offset: ArrayOffset(o), len_bytes: l }, None)
                            .unwrap()
                    })
                    .collect();
                for (&t, &(o, l)) in tickets.iter().zip(&reads) {
                    match array.wait(t) {
                        Ok(got) => {
                            let want = &model[o as usize..(o + l) as usize];
                            assert!(
                                got.as_deref() == Some(want),
                                "{what} round {round}: read {o}+{l} of {reads:?} wrong"
                            );
                        }
                        Err(e) => panic!("{what} round {round}: read {o}+{l} of {reads:?}: {e}"),
                    }
                }
                array.run_until_idle();
                // Rewrites put back exactly what was there.
                for (i, &m) in alive.iter().enumerate() {
                    let dev = array.role_device(m).unwrap();
                    let st = dev.state();
                    let d = DATA_OFFSET_BYTES as usize;
                    if st.current[d..] != snapshot[i][d..] {
                        let first = d + st.current[d..]
                            .iter()
                            .zip(&snapshot[i][d..])
                            .position(|(a, b)| a != b)
                            .unwrap();
                        panic!(
                            "{what} round {round}: member {m} changed at byte {first} (reads {reads:?})"
                        );
                    }
                }
            }
            let c = array.counters();
            total_in_place += c.degraded_reads_in_place - before.degraded_reads_in_place;
            total_corrected += c.errors_corrected - before.errors_corrected;
        }
    }
    assert!(total_in_place > 0 && total_corrected > 0);
}
