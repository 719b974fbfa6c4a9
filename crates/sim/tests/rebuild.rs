//! Hot spares and rebuild under power loss. A member fails; a hot spare takes its role and is
//! rebuilt at a limited rate while reads and flushed writes go on; power is cut at a random
//! moment of the rebuild (sometimes twice). After reassembly the rebuild resumes from the
//! cursor the superblocks recorded (never from a point whose chunks were not durable),
//! finishes, and then:
//! - every block holds the data last written (all writes were flushed before the cut);
//! - the rebuilt member's chunks are right: with other members failed up to the level's
//!   tolerance, reads that reconstruct from it still return the model's data.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more
//! (`FLASHRAID_SEED_FROM=f`: from seed f).

use flashraid_control::Init;
use flashraid_engine::{RequestError, ShardEvent};
use flashraid_format::assembly::DirtyDegraded;
use flashraid_format::superblock::CURSOR_NONE;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

fn options(seed: u64, level: Level, members: usize, rng: &mut StdRng) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.spares = 1;
    o.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    o.shards = rng.random_range(1..=3);
    o.member_bytes = 4 << 20;
    o.init = Init::Zero;
    o.config.rebuild_stripes_max = rng.random_range(1..=4);
    // About 2 MB/s of simulated time: a rebuild of ~3 MiB spans ~150k steps of 10 us.
    o.config.rebuild_rate_bytes_per_s = 2 << 20;
    o
}

fn write_random(array: &mut SimArray, model: &mut [u8], rng: &mut StdRng, count: usize) {
    let size = model.len() as u64;
    for _ in 0..count {
        let blocks = rng.random_range(1..=16u64).min(size / BLOCK);
        let start = rng.random_range(0..=(size / BLOCK - blocks)) * BLOCK;
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        array.write(start, &data).unwrap();
        model[start as usize..(start + blocks * BLOCK) as usize].copy_from_slice(&data);
    }
    array.flush().unwrap();
}

fn check_all(array: &mut SimArray, model: &[u8], what: &str) {
    array.check_model(model, what);
}

fn run(level: Level, members: usize, seed: u64) {
    eprintln!("rebuild {level} x{members} seed {seed} (replay with FLASHRAID_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let opts = options(seed, level, members, &mut rng);
    let mut array = SimArray::create(opts.clone()).unwrap();
    let mut model = vec![0u8; array.array_bytes() as usize];
    write_random(&mut array, &mut model, &mut rng, 200);
    let failed = rng.random_range(0..members);
    array.fail_member(failed);
    array.run_steps(10);
    assert!(array.is_rebuilding(), "the spare did not take over role {failed}");
    let cuts = rng.random_range(1..=2);
    let mut cursors = vec![];
    for cut in 0..cuts {
        // Load during the rebuild: reads everywhere, flushed writes.
        for _ in 0..rng.random_range(1..20) {
            let steps = rng.random_range(100..4000);
            array.run_steps(steps);
            if rng.random_bool(0.5) {
                write_random(&mut array, &mut model, &mut rng, 4);
            } else {
                let at = rng.random_range(0..model.len() as u64 / BLOCK - 8) * BLOCK;
                let got = array.read(at, 8 * BLOCK).unwrap();
                assert!(
                    got == model[at as usize..(at + 8 * BLOCK) as usize],
                    "read during rebuild"
                );
            }
        }
        // Let the bitmap clear (no write in flight at the cut): the array then starts again
        // without --force even though it is degraded.
        array.run_steps(1000);
        if !array.is_rebuilding() {
            break;
        }
        let devices = present(array.crash());
        let mut again = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse)
            .unwrap_or_else(|e| panic!("seed {seed}: reassembly after cut {cut}: {e}"));
        let cursor = again.metadata().superblock().rebuild_cursor_stripes;
        assert!(again.is_rebuilding(), "seed {seed}: rebuild not resumed after the cut");
        assert_ne!(cursor, CURSOR_NONE);
        cursors.push(cursor);
        again.run_steps(10);
        check_all(&mut again, &model, &format!("seed {seed}: after cut {cut}"));
        array = again;
    }
    array.run_until_rebuilt();
    assert!(array.role_in_service(failed), "seed {seed}: role {failed} not back in service");
    check_all(&mut array, &model, &format!("seed {seed}: after the rebuild"));
    let (tally, stopped) = array.scrub(false);
    assert_eq!((tally.mismatches, stopped), (0, None), "seed {seed}: scrub after the rebuild");
    // Lean on the rebuilt member.
    array.fail_all_but(failed);
    check_all(&mut array, &model, &format!("seed {seed}: relying on the rebuilt member"));
    eprintln!("  cursors recorded at the cuts: {cursors:?}");
}

/// The devices still there (the failed member was pulled).
fn present(devices: Vec<SimMember>) -> Vec<SimMember> {
    devices.into_iter().filter(|d| !d.state().gone).collect()
}

fn seeds() -> Vec<u64> {
    flashraid_sim::seeds(3)
}

#[test]
fn power_loss_during_rebuild_resumes_from_the_durable_cursor() {
    flashraid_sim::for_each_redundant_level(run);
}

#[test]
fn a_rebuild_that_was_cut_resumes_past_zero() {
    // At least one seed must record a cursor above zero before a cut, or the resume path
    // (start_rebuild from a recorded stripe) would go untested.
    let mut resumed_above_zero = false;
    for seed in 1..=6 {
        let mut rng = StdRng::seed_from_u64(seed);
        let opts = options(seed, Level::Raid6, 6, &mut rng);
        let mut array = SimArray::create(opts.clone()).unwrap();
        let mut model = vec![0u8; array.array_bytes() as usize];
        write_random(&mut array, &mut model, &mut rng, 100);
        array.fail_member(2);
        array.run_steps(rng.random_range(20_000..80_000));
        if !array.is_rebuilding() {
            continue;
        }
        let devices = present(array.crash());
        let mut again = SimArray::assemble(devices, opts, DirtyDegraded::Refuse).unwrap();
        let cursor = again.metadata().superblock().rebuild_cursor_stripes;
        resumed_above_zero |= cursor > 0 && cursor != CURSOR_NONE;
        again.run_until_rebuilt();
        check_all(&mut again, &model, &format!("seed {seed}"));
    }
    assert!(resumed_above_zero, "no cut happened after a recorded cursor");
}

/// A crash with writes in flight leaves dirty regions; at restart a member fails before
/// resync vouched for them, and the spare is rebuilt over stripes whose parity may disagree
/// with their data. RAID 6 checks each such stripe against its second parity row before
/// writing the replacement's chunk, and stops (rather than guess) where a torn write makes
/// it disagree; RAID 5 cannot check and stops at the first such data chunk. Either way no
/// read ever returns data that was not written: every 4 KiB block reads as its last flushed
/// value, as one of the unflushed writes to it, or fails.
fn rebuild_over_untrusted_stripes(level: Level, members: usize, seed: u64) -> (u64, bool) {
    let Cut { array: mut again, model, in_flight, mut rng } =
        cut_with_writes_in_flight(level, members, 1, seed);
    // Unflushed writes in flight at the cut: each 4 KiB block may end up old or new.
    let mut allowed: Vec<Vec<Vec<u8>>> =
        model.chunks(BLOCK as usize).map(|b| vec![b.to_vec()]).collect();
    for (start, data) in &in_flight {
        for (i, b) in data.chunks(BLOCK as usize).enumerate() {
            allowed[(start / BLOCK) as usize + i].push(b.to_vec());
        }
    }
    // A member fails before resync can vouch for the dirty regions (resync stops: degraded).
    again.fail_member(rng.random_range(0..members));
    let mut steps = 0;
    let stalled = loop {
        again.step();
        steps += 1;
        let stalled = again
            .events
            .iter()
            .any(|e| matches!(e, flashraid_engine::ShardEvent::RebuildStalled { .. }));
        if stalled || !again.is_rebuilding() {
            break stalled;
        }
        assert!(steps < 2_000_000, "seed {seed}: rebuild neither finished nor stalled");
    };
    again.run_until_idle();
    for (b, values) in allowed.iter().enumerate() {
        if let Ok(got) = again.read(b as u64 * BLOCK, BLOCK) {
            assert!(
                values.contains(&got),
                "{level} seed {seed}: block {b} reads data never written (stalled {stalled})"
            );
        }
    }
    (again.counters().rebuild_untrusted_stripes, stalled)
}

/// How a trusted rebuild over regions an unclean shutdown left dirty is set up.
#[derive(Clone, Copy)]
struct TrustCase {
    level: Level,
    members: usize,
    /// Roles lost after the restart (a spare for each).
    lost: usize,
    /// Steps of resync before the first loss (found by review: a loss after resync began
    /// left it blocked for good, so the array never stopped clean).
    resync_steps: u64,
    /// Bad sectors on another member in the stripes being written at the cut, read by the
    /// rebuild (found by review: a re-plan after such a read error kept the verified path's
    /// state and the engine panicked).
    bad_sectors: bool,
    /// Trust given before the losses, not after a stall.
    trust_first: bool,
}

/// Found by review: after an unclean shutdown of a degraded RAID 5 (or members lost before
/// resync vouched for the dirty regions), the rebuild stalled for good at the first stripe
/// it could not verify, the event said "too many members unreadable", and the array could
/// never get its redundancy back. It now says why (`StallCause::Unverifiable`); with the
/// operator's `--trust-parity` it writes its reconstruction and finishes, resync then makes
/// the dirty regions consistent so the array stops clean, and every block outside the
/// stripes that had writes in flight at the cut reads as written (inside them the write hole
/// may have spoilt the rebuilt chunk, which is what the operator accepted).
/// An array written, then cut with writes in flight, and assembled again (dirty).
struct Cut {
    array: SimArray,
    /// What was written before the cut.
    model: Vec<u8>,
    /// The writes in flight at it (offset, data): their stripes' parity may disagree with
    /// their data.
    in_flight: Vec<(u64, Vec<u8>)>,
    rng: StdRng,
}

fn cut_with_writes_in_flight(level: Level, members: usize, spares: usize, seed: u64) -> Cut {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opts = options(seed, level, members, &mut rng);
    opts.config.rebuild_rate_bytes_per_s = 0;
    opts.spares = spares;
    let mut array = SimArray::create(opts.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_random(&mut array, &mut model, &mut rng, 150);
    array.run_until_idle();
    let mut in_flight = vec![];
    for _ in 0..12 {
        let blocks = rng.random_range(1..=8u64);
        let start = rng.random_range(0..size / BLOCK - blocks) * BLOCK;
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        let op = flashraid_engine::ArrayOp::Write {
            offset: flashraid_layout::ArrayOffset(start),
            len_bytes: blocks * BLOCK,
            durability: flashraid_engine::Durability::Cached,
        };
        array.submit(op, Some(&data)).unwrap();
        in_flight.push((start, data));
    }
    array.run_steps(rng.random_range(0..6));
    let devices = array.crash();
    let again = SimArray::assemble(devices, opts, DirtyDegraded::Refuse).unwrap();
    Cut { array: again, model, in_flight, rng }
}

/// The first `RebuildStalled` event from `from` on, stepping until one comes or the rebuild
/// ends: its stripe and cause.
fn next_stall(
    array: &mut SimArray,
    from: usize,
    what: &str,
) -> Option<(flashraid_layout::StripeIndex, flashraid_engine::StallCause)> {
    let mut steps = 0u64;
    loop {
        let stall = array.events[from..].iter().find_map(|e| match e {
            ShardEvent::RebuildStalled { stripe, cause, .. } => Some((*stripe, *cause)),
            _ => None,
        });
        if stall.is_some() || (steps > 10 && !array.is_rebuilding()) {
            return stall;
        }
        array.step();
        steps += 1;
        assert!(steps < 2_000_000, "{what}: rebuild neither finished nor stalled");
    }
}

fn trusted_rebuild(case: TrustCase, seed: u64) {
    let TrustCase { level, members, lost, resync_steps, bad_sectors, trust_first } = case;
    let what = format!("{level} lost {lost} resync {resync_steps} bad {bad_sectors} seed {seed}");
    let Cut { array: mut again, model, in_flight, mut rng } =
        cut_with_writes_in_flight(level, members, lost, seed);
    let g = again.geometry();
    let size = again.array_bytes();
    // The stripes the writes in flight touch: the write hole may spoil them.
    let stripe_bytes = g.stripe_data_bytes();
    let hole_stripes: std::collections::BTreeSet<u64> = in_flight
        .iter()
        .flat_map(|(start, data)| {
            start / stripe_bytes..=(start + data.len() as u64 - 1) / stripe_bytes
        })
        .collect();
    again.run_steps(resync_steps);
    let first = rng.random_range(0..members);
    if bad_sectors {
        let other = again.role_device((first + lost) % members).unwrap();
        let data_offset = again.metadata().superblock().data_offset_bytes;
        for &s in &hole_stripes {
            let at = data_offset + g.member_offset(flashraid_layout::StripeIndex(s), 0).0;
            other.state().bad_ranges.push((at, u64::from(g.chunk_bytes())));
        }
    }
    if trust_first {
        again.set_rebuild_trust_parity(true);
    }
    for i in 0..lost {
        again.fail_member((first + i) % members);
    }
    if !trust_first {
        // Lost before resync vouched for the dirty regions, with no parity row left to check
        // with: the rebuild stalls, saying why.
        let cause = next_stall(&mut again, 0, &what).map(|(_, cause)| cause);
        assert_eq!(cause, Some(flashraid_engine::StallCause::Unverifiable), "{what}");
        again.set_rebuild_trust_parity(true);
    }
    // The spares take over on the next steps; one rebuild at a time, each role's after the
    // one before.
    again.run_steps(10);
    while again.is_rebuilding() {
        again.run_until_rebuilt();
        again.run_until_idle();
    }
    for b in 0..size / BLOCK {
        if hole_stripes.contains(&(b * BLOCK / stripe_bytes)) {
            continue;
        }
        let at = (b * BLOCK) as usize;
        let got = again.read(b * BLOCK, BLOCK).unwrap_or_else(|e| {
            panic!("{what}: block {b} outside the write hole unreadable: {e:?}")
        });
        assert!(got == model[at..at + BLOCK as usize], "{what}: block {b} reads wrong");
    }
    if !trust_first {
        assert!(again.counters().rebuild_unverified_stripes > 0, "{what}: none counted");
    }
    assert!(!again.is_rebuilding(), "{what}: the rebuild did not finish");
    let (_, clean) = again.shutdown_with_state().unwrap();
    // (The bad sectors here are in the stripes written at the cut, whose parity may disagree
    // with their data: resync cannot vouch for a chunk it cannot read there and stops, and
    // that region stays dirty; a known limit, see resync_bad_sectors.rs.)
    assert!(
        clean || bad_sectors,
        "{what}: resync did not finish after the rebuild: the array stopped dirty"
    );
}

#[test]
fn trusting_parity_lets_a_rebuild_over_dirty_degraded_regions_finish() {
    let base = TrustCase {
        level: Level::Raid5,
        members: 5,
        lost: 1,
        resync_steps: 0,
        bad_sectors: false,
        trust_first: false,
    };
    let cases = [
        base,
        TrustCase { resync_steps: 3, ..base },
        TrustCase { level: Level::Raid6, members: 6, lost: 2, ..base },
        TrustCase { level: Level::Raid7_3, members: 7, lost: 3, resync_steps: 2, ..base },
        // One role out of RAID 6 / 7.3 leaves a row to check with; the stripes that fail the
        // check are written trusted; bad sectors on another member make rounds re-plan.
        TrustCase { level: Level::Raid6, members: 6, bad_sectors: true, trust_first: true, ..base },
        TrustCase {
            level: Level::Raid7_3,
            members: 7,
            bad_sectors: true,
            trust_first: true,
            ..base
        },
    ];
    for seed in seeds() {
        for (i, &case) in cases.iter().enumerate() {
            trusted_rebuild(case, seed * 100 + 50 + i as u64);
        }
    }
}

/// Trust given, the retry stalls at the same stripe for another reason (a bad sector on a
/// second member of RAID 5): that is said anew, with its cause (found by review: no event
/// came, as the stripe had been reported, and status kept advising `--trust-parity`).
#[test]
fn a_stall_at_the_same_stripe_for_another_cause_is_said_anew() {
    for seed in seeds() {
        let what = format!("seed {seed}");
        let Cut { mut array, mut rng, .. } = cut_with_writes_in_flight(Level::Raid5, 5, 1, seed);
        let first = rng.random_range(0..5);
        array.fail_member(first);
        let (stripe, cause) = next_stall(&mut array, 0, &what).expect("a stall");
        assert_eq!(cause, flashraid_engine::StallCause::Unverifiable, "{what}");
        let g = array.geometry();
        let data_offset = array.metadata().superblock().data_offset_bytes;
        let at = data_offset + g.member_offset(stripe, 0).0;
        let other = array.role_device((first + 1) % 5).unwrap();
        other.state().bad_ranges.push((at, u64::from(g.chunk_bytes())));
        let before = array.events.len();
        array.set_rebuild_trust_parity(true);
        let again = next_stall(&mut array, before, &what);
        assert_eq!(again, Some((stripe, flashraid_engine::StallCause::Unreadable)), "{what}");
    }
}

/// Found by review: RAID 7.3 cut with writes in flight, then two roles lost before resync
/// vouched for the dirty regions. Rebuilding the first role with the second still out
/// leaves one parity row the reconstruction does not need, so each stripe is checked with
/// it: a stall for `Unverifiable` may come only at a stripe the writes in flight touched
/// (where the check can fail), never at a consistent one (the rebuild stalled at the first
/// untrusted stripe whatever it held). Past such stalls (trusted there), both roles are
/// rebuilt and every block outside the written stripes reads back, also with a third role
/// out, relying on the rebuilt ones.
#[test]
fn a_raid73_rebuild_with_another_role_out_checks_with_the_row_left() {
    let mut checked = 0;
    for seed in seeds() {
        let what = format!("seed {seed}");
        let Cut { array: mut again, model, in_flight, mut rng } =
            cut_with_writes_in_flight(Level::Raid7_3, 7, 2, seed * 100 + 73);
        let g = again.geometry();
        let stripe_bytes = g.stripe_data_bytes();
        let hole: std::collections::BTreeSet<u64> = in_flight
            .iter()
            .flat_map(|(start, data)| {
                start / stripe_bytes..=(start + data.len() as u64 - 1) / stripe_bytes
            })
            .collect();
        let first = rng.random_range(0..7);
        again.fail_member(first);
        again.fail_member((first + 1) % 7);
        let mut from = 0;
        while let Some((stripe, cause)) = next_stall(&mut again, from, &what) {
            assert!(
                cause == flashraid_engine::StallCause::Unverifiable && hole.contains(&stripe.0),
                "{what}: stalled at stripe {} ({cause:?}), not one written at the cut {hole:?}",
                stripe.0
            );
            // The write hole: the operator's choice; trusted from here on.
            from = again.events.len();
            again.set_rebuild_trust_parity(true);
        }
        again.run_steps(10);
        while again.is_rebuilding() {
            again.run_until_rebuilt();
            again.run_until_idle();
        }
        checked += again.counters().rebuild_untrusted_stripes;
        // Resync, waiting while roles were out, vouches for the dirty regions now.
        for _ in 0..100_000 {
            if !again.resync_pending() {
                break;
            }
            again.run_steps(100);
        }
        assert!(!again.resync_pending(), "{what}: resync did not finish");
        again.fail_member((first + 2) % 7);
        again.run_until_idle();
        for b in 0..again.array_bytes() / BLOCK {
            if hole.contains(&(b * BLOCK / stripe_bytes)) {
                continue;
            }
            let at = (b * BLOCK) as usize;
            let got = again.read(b * BLOCK, BLOCK).unwrap();
            assert!(got == model[at..at + BLOCK as usize], "{what}: block {b} reads wrong");
        }
    }
    assert!(checked > 0, "no untrusted stripe was checked and rebuilt: the test tests nothing");
}

#[test]
fn a_rebuild_over_stripes_resync_has_not_vouched_for_never_invents_data() {
    let mut verified = 0;
    for seed in seeds() {
        let (v, _) = rebuild_over_untrusted_stripes(Level::Raid6, 6, seed * 100 + 61);
        verified += v;
        rebuild_over_untrusted_stripes(Level::Raid5, 5, seed * 100 + 51);
        rebuild_over_untrusted_stripes(Level::Raid7_3, 7, seed * 100 + 71);
    }
    assert!(verified > 0, "no untrusted stripe was verified and rebuilt: the test tests nothing");
}

/// A rebuild that meets a stripe it cannot reconstruct (the failed member's chunk, plus bad
/// sectors on as many other members as the level survives) stops there and says so, and
/// never writes a guess: the event names the member and the stripe, the shard's status
/// holds it, the durable cursor stays at or below it, the role stays rebuilding, and the
/// lost chunks read as errors while every other stripe reads back right. Its retries stall
/// at the same stripe again without a new event. Rewriting the stripe heals the bad sectors;
/// the next retry gets past it and the rebuild finishes, with no restart, and the data is
/// right even when the array leans on the rebuilt member.
fn rebuild_stalls_at_a_lost_stripe(level: Level, members: usize, seed: u64) {
    eprintln!("rebuild stall {level} x{members} seed {seed} (replay with FLASHRAID_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opts = options(seed, level, members, &mut rng);
    opts.config.rebuild_rate_bytes_per_s = 0;
    // Retries every 5000 steps of 10 us.
    opts.config.rebuild_stall_retry_us = 50_000;
    let mut array = SimArray::create(opts.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    write_random(&mut array, &mut model, &mut rng, 150);
    let g = array.geometry();
    let stripe = rng.random_range(1..g.stripes() - 1);
    let stripe_bytes = g.stripe_data_bytes();
    let failed = rng.random_range(0..members);
    // Bad sectors on the chunk of `stripe` of as many other members as the level survives:
    // with `failed` gone too, that stripe is one erasure past what its redundancy can fill.
    let bad_roles: Vec<usize> = if level == Level::Raid10 {
        vec![failed ^ 1]
    } else {
        (1..members).map(|i| (failed + i) % members).take(g.tolerance()).collect()
    };
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let bad_at = data_offset + g.member_offset(flashraid_layout::StripeIndex(stripe), 0).0;
    for &role in &bad_roles {
        let device = array.role_device(role).unwrap();
        device.state().bad_ranges.push((bad_at, u64::from(g.chunk_bytes())));
    }
    array.fail_member(failed);
    array.run_steps(10);
    assert!(array.is_rebuilding(), "seed {seed}: the spare did not take over role {failed}");
    let mut steps = 0u64;
    while !array.events.iter().any(|e| matches!(e, ShardEvent::RebuildStalled { .. })) {
        assert!(array.is_rebuilding(), "seed {seed}: the rebuild finished over a lost stripe");
        array.step();
        steps += 1;
        assert!(steps < 2_000_000, "seed {seed}: the rebuild never stalled");
    }
    // Let every other shard finish what it can, and the stalled one retry a few times.
    array.run_steps(20_000);
    let stalls: Vec<_> = array
        .events
        .iter()
        .filter_map(|e| match e {
            ShardEvent::RebuildStalled { member, stripe, .. } => Some((member.get(), stripe.0)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stalls,
        vec![(failed, stripe)],
        "seed {seed}: the stall names the member and stripe"
    );
    let statuses = array.rebuild_statuses();
    assert!(
        statuses
            .iter()
            .flatten()
            .any(|s| s.stalled_at == Some(flashraid_layout::StripeIndex(stripe))),
        "seed {seed}: no shard's status says where the rebuild stalled: {statuses:?}"
    );
    assert!(array.is_rebuilding(), "seed {seed}: the role left rebuilding with a stripe missing");
    let cursor = array.metadata().superblock().rebuild_cursor_stripes;
    assert!(
        cursor <= stripe,
        "seed {seed}: durable cursor {cursor} passed the lost stripe {stripe}"
    );
    // The lost stripe reads as an error, never as invented data; the others read right.
    let lost = array.read(stripe * stripe_bytes, stripe_bytes);
    assert_eq!(lost.err(), Some(RequestError::Unreadable), "seed {seed}: the lost stripe read");
    let before = array.read(0, stripe * stripe_bytes).unwrap();
    assert!(before == model[..(stripe * stripe_bytes) as usize], "seed {seed}: below the stall");
    let after = array.read((stripe + 1) * stripe_bytes, size - (stripe + 1) * stripe_bytes);
    assert!(
        after.unwrap() == model[((stripe + 1) * stripe_bytes) as usize..],
        "seed {seed}: above the stall"
    );
    // The operator's way out: write the stripe anew (its bad sectors are rewritten); the
    // next retry gets past it, with no restart.
    let mut fresh = vec![0u8; stripe_bytes as usize];
    rng.fill(fresh.as_mut_slice());
    array.write(stripe * stripe_bytes, &fresh).unwrap();
    array.flush().unwrap();
    model[(stripe * stripe_bytes) as usize..((stripe + 1) * stripe_bytes) as usize]
        .copy_from_slice(&fresh);
    let mut again = array;
    again.run_until_rebuilt();
    assert!(again.role_in_service(failed), "seed {seed}: role {failed} not back in service");
    check_all(&mut again, &model, &format!("seed {seed}: after the resumed rebuild"));
    let (tally, stopped) = again.scrub(false);
    assert_eq!((tally.mismatches, stopped), (0, None), "seed {seed}: scrub after the rebuild");
    again.fail_all_but(failed);
    check_all(&mut again, &model, &format!("seed {seed}: relying on the rebuilt member"));
}

#[test]
fn a_rebuild_stalls_at_a_stripe_it_cannot_reconstruct_and_resumes_once_it_can() {
    flashraid_sim::for_each_redundant_level(rebuild_stalls_at_a_lost_stripe);
}
