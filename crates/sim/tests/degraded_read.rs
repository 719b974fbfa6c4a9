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
/// request's buffer, the bad range is rewritten from there, with the right bytes.
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
        device.state().bad_ranges.push((chunk_at_member + BLOCK, BLOCK));
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
