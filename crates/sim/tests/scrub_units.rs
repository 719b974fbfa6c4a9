//! Scrub and reads over bad sectors and silent corruption, in 4 KiB units: a scrub rewrites
//! only the units that cannot be read, and only with contents it can vouch for; mirrors vote
//! unit by unit; two corrupted chunks of a 7.3 stripe are never "located"; degraded scrubs
//! write nothing for corruption; a scrub racing with writes keeps every write. (From a
//! review: the first four tests failed against whole-chunk rewrites and votes.)

use flashraid_control::Init;
use flashraid_engine::ArrayOp;
use flashraid_layout::{ArrayOffset, Level, Location, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn setup_with(mut o: SimOptions, seed: u64) -> (SimArray, Vec<u8>, StdRng) {
    let mut rng = StdRng::seed_from_u64(seed);
    o.init = Init::Zero;
    let mut array = SimArray::create(o).unwrap();
    let model = array.fill_random(&mut rng);
    array.run_until_idle();
    (array, model, rng)
}

/// RAID 1 with three copies. Member 2 has a bad sector in the first 4 KiB of a chunk; member
/// 0 has silent corruption in the last 4 KiB of the same chunk; member 1 is intact. Every
/// byte of the chunk is held right by at least two readable copies. A *check* scrub rewrites
/// only member 2's unreadable unit, from the copies that agree there; its readable, correct
/// last 4 KiB keep their bytes. (Whole-chunk decisions rewrote member 2's chunk from member
/// 0, the tie-break winner, so one corrupted copy became two, and a repair scrub then lost
/// the data from every copy.)
#[test]
fn raid1_x3_check_scrub_does_not_spread_one_corrupted_copy_over_a_bad_sector_copy() {
    let mut o = SimOptions::new(3, Level::Raid1, 3);
    o.member_bytes = 2 << 20;
    o.chunk_bytes = 16 << 10;
    o.shards = 1;
    let (mut array, model, _) = setup_with(o, 3);
    let g = array.geometry();
    let chunk = u64::from(g.chunk_bytes());
    let stripe = 7u64;
    let at = array.chunk_offset(stripe);
    let tail = at + chunk - 4096;
    let good_tail = array.member_bytes(1, tail, 4096);
    assert!(good_tail == array.member_bytes(2, tail, 4096));
    array.flip_member_bytes(0, tail + 100, 8);
    array.role_device(2).unwrap().state().bad_ranges.push((at, 4096));
    let (t, _) = array.scrub(false);
    eprintln!("check: {t:?}");
    assert!(
        array.member_bytes(2, tail, 4096) == good_tail,
        "a check scrub overwrote member 2's readable, correct bytes with member 0's corruption"
    );
    let (t, _) = array.scrub(true);
    eprintln!("repair: {t:?}");
    let off = stripe * chunk + chunk - 4096;
    let got = array.read(off, 4096).unwrap();
    assert!(got == model[off as usize..off as usize + 4096], "data lost after repair");
}

/// RAID 1 with three copies, two of them silently corrupted in different places (member 0
/// in the first 4 KiB of a chunk, member 1 in the last 4 KiB), member 2 intact. Every byte
/// has a two-copy majority holding the right value, and the vote, unit by unit, keeps it.
/// (With a vote over whole chunks all three differed, the tie went to the lowest member,
/// and a repair scrub copied member 0's corruption over the two copies that were right.)
#[test]
fn raid1_x3_repair_does_not_overwrite_a_per_byte_majority() {
    let mut o = SimOptions::new(4, Level::Raid1, 3);
    o.member_bytes = 2 << 20;
    o.chunk_bytes = 16 << 10;
    o.shards = 1;
    let (mut array, model, _) = setup_with(o, 4);
    let g = array.geometry();
    let chunk = u64::from(g.chunk_bytes());
    let stripe = 9u64;
    let at = array.chunk_offset(stripe);
    array.flip_member_bytes(0, at + 10, 8);
    array.flip_member_bytes(1, at + chunk - 100, 8);
    let (t, _) = array.scrub(true);
    eprintln!("repair: {t:?}");
    let off = stripe * chunk;
    let got = array.read(off, chunk).unwrap();
    assert!(
        got == model[off as usize..(off + chunk) as usize],
        "repair wrote a minority copy's corruption over bytes two copies held right"
    );
}

/// RAID 5, a stripe whose parity chunk was silently corrupted (a lost write), and a bad
/// 4 KiB sector at the start of one of its data chunks. Before the scrub, the rest of that
/// data chunk reads right (straight from its member), and still does after a check scrub,
/// which rewrites only the unreadable 4 KiB. (A whole-chunk rewrite from the reconstruction,
/// which uses the bad parity, overwrote the readable, correct 12 KiB beside it.)
#[test]
fn raid5_check_scrub_rewrites_only_the_unreadable_sector_not_the_readable_rest() {
    let mut o = SimOptions::new(5, Level::Raid5, 4);
    o.member_bytes = 2 << 20;
    o.chunk_bytes = 16 << 10;
    o.shards = 1;
    let (mut array, model, _) = setup_with(o, 5);
    let g = array.geometry();
    let chunk = u64::from(g.chunk_bytes());
    let stripe = 6u64;
    let at = array.chunk_offset(stripe);
    let parity = g.parity_member(StripeIndex(stripe), 0).get();
    let member = array.data_role(stripe, 0);
    array.flip_member_bytes(parity, at + chunk - 2000, 16);
    array.role_device(member).unwrap().state().bad_ranges.push((at, 4096));
    let off = g
        .array_offset(Location {
            stripe: StripeIndex(stripe),
            data_index: 0,
            offset_in_chunk_bytes: 0,
        })
        .0;
    let rest = off + 4096..off + chunk;
    let before = array.read(rest.start, rest.end - rest.start).unwrap();
    assert!(before == model[rest.start as usize..rest.end as usize], "reads right before");
    let (t, _) = array.scrub(false);
    eprintln!("check: {t:?}");
    let after = array.read(rest.start, rest.end - rest.start).unwrap();
    assert!(
        after == model[rest.start as usize..rest.end as usize],
        "a check scrub overwrote readable, correct data beside a bad sector"
    );
}

fn opts(seed: u64, level: Level, n: usize, chunk: u64) -> SimOptions {
    let mut o = SimOptions::new(seed, level, n);
    o.chunk_bytes = chunk;
    o.member_bytes = if chunk >= 256 << 10 { 8 << 20 } else { 2 << 20 };
    o.shards = 1 + (seed % 2) as u32;
    o
}

/// Data area of every member, as stored now.
fn snapshot(array: &SimArray) -> Vec<Vec<u8>> {
    let n = array.geometry().member_count();
    (0..n)
        .map(|m| array.role_device(m).map(|d| d.state().current.clone()).unwrap_or_default())
        .collect()
}

/// Members of a parity-level stripe: data chunk i's member at [i], parity r's at [k + r].
fn stripe_members(array: &SimArray, stripe: u64) -> Vec<usize> {
    let g = array.geometry();
    let k = g.data_chunks();
    let mut v: Vec<usize> = (0..k).map(|i| array.data_role(stripe, i)).collect();
    for r in 0..g.parity_chunks() {
        v.push(g.parity_member(StripeIndex(stripe), r).get());
    }
    v
}

/// RAID 7.3 with two chunks of one stripe silently corrupted (data+data, data+parity,
/// parity+parity), 4 KiB and 1 MiB chunks: nothing can locate two, so a repair must never
/// change a data chunk (parity follows the data, as documented), and a single corrupted
/// chunk per stripe (data or parity) is located and repaired exactly.
#[test]
fn raid73_two_corrupted_chunks_are_not_located_and_data_is_never_rewritten() {
    for chunk in [4u64 << 10, 256 << 10] {
        for (pair, seed) in
            [((0usize, 1usize), 1u64), ((2, 4), 2), ((3, 5), 3), ((4, 6), 4), ((0, 6), 5)]
        {
            let what = format!("7.3 chunk {chunk} pair {pair:?}");
            let (mut array, model, _) = setup_with(opts(seed, Level::Raid7_3, 7, chunk), seed);
            let stripe = 1u64;
            let members = stripe_members(&array, stripe);
            let at = array.chunk_offset(stripe);
            array.flip_member_bytes(members[pair.0], at + 7, 5);
            array.flip_member_bytes(members[pair.1], at + chunk / 2, 9);
            // A single corrupted chunk in another stripe, for contrast.
            let single = stripe_members(&array, 2)[(seed as usize) % 7];
            array.flip_member_bytes(single, array.chunk_offset(2) + 33, 3);
            let before = snapshot(&array);
            let (t, _) = array.scrub(true);
            eprintln!("{what}: {t:?}");
            assert_eq!((t.mismatches, t.located, t.repaired), (2, 1, 2), "{what}: {t:?}");
            let after = snapshot(&array);
            let k = array.geometry().data_chunks();
            for (i, &m) in members.iter().enumerate().take(k) {
                let r = at as usize..(at + chunk) as usize;
                assert!(after[m][r.clone()] == before[m][r], "{what}: data chunk {i} rewritten");
            }
            // Stripe 2 is right again.
            let sb = array.geometry().stripe_data_bytes();
            let got = array.read(2 * sb, sb).unwrap();
            assert!(
                got == model[(2 * sb) as usize..(3 * sb) as usize],
                "{what}: single not repaired"
            );
            let (t, _) = array.scrub(false);
            assert_eq!(t.mismatches, 0, "{what}: {t:?}");
        }
    }
}

/// Corruption plus a failed member on RAID 6 and 7.3: a degraded scrub counts the mismatch
/// and writes nothing, check or repair; reads of other stripes stay right.
#[test]
fn degraded_scrub_with_corruption_writes_nothing() {
    for (level, n, out) in
        [(Level::Raid6, 6, 1usize), (Level::Raid7_3, 7, 1), (Level::Raid7_3, 7, 2)]
    {
        for chunk in [4u64 << 10, 256 << 10] {
            for victim in 0..3usize {
                let what = format!("{level} out {out} chunk {chunk} victim {victim}");
                let (mut array, _model, _) = setup_with(opts(7, level, n, chunk), 7);
                let stripe = 3u64;
                let members = stripe_members(&array, stripe);
                // Fail members that are not the victim, pick data (0), data (1) or parity.
                let target = match victim {
                    0 => members[0],
                    1 => members[1],
                    _ => members[n - 1],
                };
                let mut failed = 0;
                for m in 0..n {
                    if failed == out {
                        break;
                    }
                    if m != target {
                        array.fail_member(m);
                        failed += 1;
                    }
                }
                array.run_until_idle();
                array.flip_member_bytes(target, array.chunk_offset(stripe) + 100, 4);
                let before = snapshot(&array);
                for repair in [false, true] {
                    let (t, stopped) = array.scrub(repair);
                    assert_eq!(stopped, None, "{what}");
                    assert_eq!(t.mismatches, 1, "{what} repair {repair}: {t:?}");
                    let after = snapshot(&array);
                    for m in 0..n {
                        if before[m].is_empty() {
                            continue;
                        }
                        let d = array.metadata().superblock().data_offset_bytes as usize;
                        if after[m][d..] != before[m][d..] {
                            let first = d + after[m][d..]
                                .iter()
                                .zip(&before[m][d..])
                                .position(|(a, b)| a != b)
                                .unwrap();
                            panic!(
                                "{what} repair {repair}: member {m} data written at {first} (stripe chunk at {})",
                                array.chunk_offset(stripe)
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Scrub racing with writes to the same stripes: writes are queued (long IO delays) when a
/// repair scrub starts; every write must land, the data must equal the model, and a check
/// afterwards finds nothing.
#[test]
fn scrub_racing_with_writes_keeps_every_write() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Raid7_3, 7),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        for seed in 0..8u64 {
            let what = format!("{level} seed {seed}");
            let mut o = opts(seed, level, n, if seed % 2 == 0 { 4096 } else { 16384 });
            o.delay_steps_max = 20;
            if seed >= 2 {
                o.config.merge_window_us = 200;
            }
            let (mut array, mut model, mut rng) = setup_with(o, seed);
            let g = array.geometry();
            let size = array.array_bytes();
            let mut tickets = vec![];
            for _ in 0..40 {
                let at = rng.random_range(0..size / 4096 - 8) * 4096;
                let len = 4096 * rng.random_range(1..=8u64);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                model[at as usize..(at + len) as usize].copy_from_slice(&data);
                tickets.push(
                    array
                        .submit(
                            ArrayOp::Write {
                                offset: ArrayOffset(at),
                                len_bytes: len,
                                durability: flashraid_engine::Durability::Cached,
                            },
                            Some(&data),
                        )
                        .unwrap(),
                );
            }
            let (t, _) = array.scrub(true);
            for tk in tickets {
                array.wait(tk).unwrap();
            }
            assert_eq!(t.mismatches, 0, "{what}: {t:?}");
            array.run_until_idle();
            assert!(array.read(0, size).unwrap() == model, "{what}: data differs");
            let (t, _) = array.scrub(false);
            assert_eq!(t.mismatches, 0, "{what}: {t:?} {:?}", g.level());
        }
    }
}

/// Reads (partial chunks, whole chunks, across chunks) with bad sectors on several members
/// of one stripe, at 4 KiB and 256 KiB chunks: within the level's redundancy the read
/// returns the model and every member's data afterwards equals what it held (the rewrite
/// puts back exactly the right bytes, and only heals); beyond it the read fails and nothing
/// is written.
#[test]
fn reads_with_bad_sectors_on_several_members_of_a_stripe() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Raid7_3, 7),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        for chunk in [4096u64, 256 << 10] {
            for seed in 0..3u64 {
                let what = format!("{level} chunk {chunk} seed {seed}");
                let mut o = opts(seed, level, n, chunk);
                o.config.member_read_errors_max = 1_000_000;
                o.delay_steps_max = 1 + seed * 10;
                let (mut array, model, mut rng) = setup_with(o, seed);
                let g = array.geometry();
                let sb = g.stripe_data_bytes();
                let stripes = array.array_bytes() / sb;
                let d = array.metadata().superblock().data_offset_bytes as usize;
                for round in 0..30 {
                    let stripe = rng.random_range(0..stripes);
                    let at = array.chunk_offset(stripe);
                    let bad_count = rng.random_range(1..=g.tolerance() + 1);
                    let mut bad_members: Vec<usize> = (0..n).collect();
                    for i in 0..n {
                        bad_members.swap(i, rng.random_range(i..n));
                    }
                    bad_members.truncate(bad_count);
                    let before = snapshot(&array);
                    for &m in &bad_members {
                        let blocks = chunk / 4096;
                        let b = rng.random_range(0..blocks);
                        let l = rng.random_range(1..=(blocks - b).min(3));
                        array
                            .role_device(m)
                            .unwrap()
                            .state()
                            .bad_ranges
                            .push((at + b * 4096, l * 4096));
                    }
                    let o = stripe * sb + rng.random_range(0..sb / 4096) * 4096;
                    let l = (4096 * rng.random_range(1..=2 * chunk / 4096))
                        .min(array.array_bytes() - o);
                    let r = array.read(o, l);
                    array.run_until_idle();
                    match r {
                        Ok(got) => assert!(
                            got == model[o as usize..(o + l) as usize],
                            "{what} round {round}: wrong data"
                        ),
                        Err(e) => assert!(
                            bad_count > g.tolerance(),
                            "{what} round {round}: {e} with {bad_count} bad"
                        ),
                    }
                    let after = snapshot(&array);
                    for m in 0..n {
                        assert!(
                            after[m][d..] == before[m][d..],
                            "{what} round {round}: member {m} data changed"
                        );
                    }
                    for m in 0..n {
                        array.role_device(m).unwrap().state().bad_ranges.clear();
                    }
                }
                let evs = array.member_failures();
                assert!(evs.is_empty(), "{what}: {evs:?}");
            }
        }
    }
}

/// A scrub of stripes with bad sectors on several members: within redundancy all are
/// rewritten with the right bytes; beyond it the stripe counts as unreadable and nothing
/// is written.
#[test]
fn scrub_with_bad_sectors_on_several_members_of_a_stripe() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Raid7_3, 7),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        for chunk in [4096u64, 256 << 10] {
            for bad_count in 1..=4usize {
                let what = format!("{level} chunk {chunk} bad {bad_count}");
                let mut o = opts(bad_count as u64, level, n, chunk);
                o.config.member_read_errors_max = 1_000_000;
                let (mut array, model, _) = setup_with(o, 9);
                let g = array.geometry();
                let stripe = 2u64;
                let at = array.chunk_offset(stripe);
                let before = snapshot(&array);
                for m in 0..bad_count.min(n) {
                    array
                        .role_device(m)
                        .unwrap()
                        .state()
                        .bad_ranges
                        .push((at + 4096 * (m as u64 % (chunk / 4096)), 4096));
                }
                let (t, _) = array.scrub(false);
                let after = snapshot(&array);
                let d = array.metadata().superblock().data_offset_bytes as usize;
                let mirror = matches!(level, Level::Raid1 | Level::Raid10);
                let recoverable = if mirror {
                    // RAID 10 x4: members 0,1 mirror each other, 2,3 too.
                    if level == Level::Raid1 { bad_count < n } else { bad_count == 1 }
                } else {
                    bad_count <= g.tolerance()
                };
                // At chunks of more than one unit the bad sectors lie in distinct 4 KiB
                // units, each missing on one member only: every one is rebuilt.
                let recoverable = recoverable || chunk > 4096;
                for m in 0..n {
                    assert!(
                        after[m][d..] == before[m][d..],
                        "{what}: member {m} data differs after scrub {t:?}"
                    );
                }
                let left: usize =
                    (0..n).map(|m| array.role_device(m).unwrap().state().bad_ranges.len()).sum();
                if recoverable {
                    assert_eq!(left, 0, "{what}: {t:?}");
                } else {
                    assert!(left > 0 && t.unreadable == 1, "{what}: {t:?}");
                }
                for m in 0..n {
                    array.role_device(m).unwrap().state().bad_ranges.clear();
                }
                let sb = g.stripe_data_bytes();
                assert!(array.read(0, 4 * sb).unwrap() == model[..(4 * sb) as usize], "{what}");
            }
        }
    }
}

/// A mirror position no copy can read is left alone, and counted as unreadable, not in
/// `read_errors_repaired` (which said the bad sectors were repaired while nothing was
/// written).
#[test]
fn mirror_scrub_does_not_count_unrepaired_read_errors_as_repaired() {
    let mut o = SimOptions::new(6, Level::Raid1, 2);
    o.member_bytes = 2 << 20;
    o.shards = 1;
    let (mut array, _model, _) = setup_with(o, 6);
    let at = array.chunk_offset(4);
    for m in 0..2 {
        array.role_device(m).unwrap().state().bad_ranges.push((at, 4096));
    }
    let before = array.counters().errors_corrected;
    let (t, _) = array.scrub(false);
    let left: usize = (0..2).map(|m| array.role_device(m).unwrap().state().bad_ranges.len()).sum();
    assert_eq!(left, 2, "nothing can be rewritten");
    assert_eq!(t.unreadable, 1, "{t:?}");
    assert_eq!(
        (t.read_errors_repaired, array.counters().errors_corrected - before),
        (0, 0),
        "read errors reported repaired while none was: {t:?}"
    );
}

/// Writes (partial chunks, RMW and reconstruct-write shapes) into stripes with bad sectors
/// on up to the tolerance's members: the data reads back and parity stays consistent (a
/// check scrub, after the bad ranges are cleared, finds nothing).
#[test]
fn writes_over_bad_sectors_on_several_members_keep_parity_right() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid5, 6),
        (Level::Raid6, 6),
        (Level::Raid7_3, 7),
        (Level::Raid7_3, 8),
    ] {
        for chunk in [4096u64, 16384, 256 << 10] {
            for seed in 0..2u64 {
                let what = format!("{level} x{n} chunk {chunk} seed {seed}");
                let mut o = opts(seed, level, n, chunk);
                o.config.member_read_errors_max = 1_000_000;
                o.delay_steps_max = 1 + seed * 15;
                let (mut array, mut model, mut rng) = setup_with(o, seed + 40);
                let g = array.geometry();
                let sb = g.stripe_data_bytes();
                let stripes = array.array_bytes() / sb;
                for round in 0..25 {
                    let stripe = rng.random_range(0..stripes);
                    let at = array.chunk_offset(stripe);
                    let bad_count = rng.random_range(1..=g.tolerance());
                    let mut ms: Vec<usize> = (0..n).collect();
                    for i in 0..n {
                        ms.swap(i, rng.random_range(i..n));
                    }
                    for &m in &ms[..bad_count] {
                        let blocks = chunk / 4096;
                        let b = rng.random_range(0..blocks);
                        let l = rng.random_range(1..=(blocks - b).min(2));
                        array
                            .role_device(m)
                            .unwrap()
                            .state()
                            .bad_ranges
                            .push((at + b * 4096, l * 4096));
                    }
                    let o = stripe * sb + rng.random_range(0..sb / 4096) * 4096;
                    let l =
                        (4096 * rng.random_range(1..=chunk / 4096 + 1)).min(stripe * sb + sb - o);
                    let data: Vec<u8> = (0..l).map(|_| rng.random()).collect();
                    match array.write(o, &data) {
                        Ok(()) => model[o as usize..(o + l) as usize].copy_from_slice(&data),
                        Err(e) => panic!("{what} round {round}: write failed: {e}"),
                    }
                    array.run_until_idle();
                    for m in 0..n {
                        array.role_device(m).unwrap().state().bad_ranges.clear();
                    }
                    let got = array.read(stripe * sb, sb).unwrap();
                    assert!(
                        got == model[(stripe * sb) as usize..((stripe + 1) * sb) as usize],
                        "{what} round {round}: data"
                    );
                }
                let (t, _) = array.scrub(false);
                assert_eq!(
                    t.mismatches, 0,
                    "{what}: parity inconsistent after writes over bad sectors: {t:?}"
                );
                let evs = array.member_failures();
                assert!(evs.is_empty(), "{what}: {evs:?}");
            }
        }
    }
}
