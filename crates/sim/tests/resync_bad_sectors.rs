//! Resync over bad sectors. An unclean shutdown leaves regions to resync; some of their
//! chunks then fail to read (latent bad sectors, found by resync's reads). docs/safety.md,
//! hazards table: "Resync meets a chunk it cannot read".
//!
//! What resync must do with a chunk it cannot read:
//! - a mirror copy: rewrite it from the reference copy (the lowest readable one), which heals
//!   the sector; never from another copy that failed to read (found in review: with three
//!   copies, the first copy not rewritten could be the unreadable one, and its buffer, holding
//!   whatever the failed read left, was written over a good copy);
//! - a parity chunk: rewrite it from the data;
//! - a data chunk: rebuild it from parity and rewrite it only where the stripe proves
//!   consistent, checked against a parity row the rebuild did not use (RAID 6 with one such
//!   chunk, 7.3 with two); on RAID 5, or where the stripe disagrees with itself (a write was
//!   in flight at the crash), resync stops there and the region stays dirty.
//!
//! Two modes per seed: bad sectors only in stripes no write was in flight to ("quiet": every
//! level but RAID 5 must finish resync, heal every one and stop clean), and bad sectors on
//! the stripes that had writes in flight too (mirrors must still finish and stop clean). In
//! both, no read ever returns data that was not written, before or after the array is
//! reassembled and loses members down to its tolerance.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more.

use flashraid_engine::{ArrayOp, Durability};
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::{ArrayOffset, Level, Location, MemberIndex, Role, StripeIndex};
use flashraid_sim::{SimArray, SimOptions, pattern};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

const BLOCK: u64 = 4096;
/// The bitmap region size `SimArray::create` uses (member bytes per region).
const REGION_BYTES: u64 = 1 << 20;
/// Bad chunks placed in quiet stripes: well under the member read-error limit (32), so no
/// member is failed for them.
const QUIET_BAD_MAX: usize = 6;
/// Stripes with writes in flight given bad chunks (mirrors: one per data position).
const HOLE_BAD_STRIPES_MAX: usize = 8;

fn run(level: Level, members: usize, seed: u64, holes_too: bool) {
    let what = format!("{level} x{members} holes_too {holes_too} seed {seed}");
    eprintln!("resync over bad sectors: {what} (replay with FLASHRAID_SEED)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opts = SimOptions::new(seed, level, members);
    opts.chunk_bytes = if rng.random_bool(0.5) { 4096 } else { 16384 };
    opts.shards = rng.random_range(1..=3);
    opts.member_bytes = 4 << 20;
    let mut array = SimArray::create(opts.clone()).unwrap();
    let size = array.array_bytes();
    let mut model = vec![0u8; size as usize];
    for _ in 0..150 {
        let blocks = rng.random_range(1..=16u64);
        let start = rng.random_range(0..size / BLOCK - blocks) * BLOCK;
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        array.write(start, &data).unwrap();
        model[start as usize..(start + blocks * BLOCK) as usize].copy_from_slice(&data);
    }
    array.flush().unwrap();
    array.run_until_idle();
    // Writes in flight at the cut: their 4 KiB blocks may end up old or new (and their
    // stripes' parity or copies may disagree).
    let mut allowed: Vec<Vec<Vec<u8>>> =
        model.chunks(BLOCK as usize).map(|b| vec![b.to_vec()]).collect();
    let g = array.geometry();
    let stripe_bytes = g.stripe_data_bytes();
    let mut holes = BTreeSet::new();
    for _ in 0..12 {
        let blocks = rng.random_range(1..=8u64);
        let start = rng.random_range(0..size / BLOCK - blocks) * BLOCK;
        let mut data = vec![0u8; (blocks * BLOCK) as usize];
        rng.fill(data.as_mut_slice());
        let op = ArrayOp::Write {
            offset: ArrayOffset(start),
            len_bytes: blocks * BLOCK,
            durability: Durability::Cached,
        };
        array.submit(op, Some(&data)).unwrap();
        for (i, b) in data.chunks(BLOCK as usize).enumerate() {
            allowed[(start / BLOCK) as usize + i].push(b.to_vec());
        }
        holes.extend(start / stripe_bytes..=(start + blocks * BLOCK - 1) / stripe_bytes);
    }
    array.run_steps(rng.random_range(2..8));
    let devices = array.crash();
    let mut again = SimArray::assemble(devices, opts.clone(), DirtyDegraded::Refuse).unwrap();
    assert!(again.is_resyncing(), "{what}: nothing to resync");

    // Bad chunks: in quiet stripes of the dirty regions, on random roles; and with
    // `holes_too`, on the reference copy (mirrors) or a random role of the hole stripes.
    let chunk = u64::from(g.chunk_bytes());
    let region_of = |s: u64| s * chunk / REGION_BYTES;
    let dirty: BTreeSet<u64> = holes.iter().map(|&s| region_of(s)).collect();
    let mut quiet: Vec<u64> =
        (0..g.stripes()).filter(|s| dirty.contains(&region_of(*s)) && !holes.contains(s)).collect();
    let mut chosen = vec![];
    while chosen.len() < QUIET_BAD_MAX && !quiet.is_empty() {
        let s = quiet.swap_remove(rng.random_range(0..quiet.len()));
        chosen.push((s, rng.random_range(0..members)));
    }
    if holes_too {
        for &s in holes.iter().take(HOLE_BAD_STRIPES_MAX) {
            if g.tolerance() > 0 && g.parity_chunks() == 0 {
                // Mirrors: each data position's reference copy (its lowest member).
                for m in 0..members {
                    let Role::Data { index, .. } = g.role(StripeIndex(s), MemberIndex(m as u16))
                    else {
                        continue;
                    };
                    let lowest = (0..members)
                        .find(|&o| {
                            matches!(g.role(StripeIndex(s), MemberIndex(o as u16)),
                                Role::Data { index: i, .. } if i == index)
                        })
                        .unwrap();
                    if lowest == m {
                        chosen.push((s, m));
                    }
                }
            } else {
                chosen.push((s, rng.random_range(0..members)));
            }
        }
    }
    let data_offset = again.metadata().superblock().data_offset_bytes;
    let mut bad = vec![];
    for &(s, role) in &chosen {
        let at = data_offset + g.member_offset(StripeIndex(s), 0).0;
        again.role_device(role).unwrap().state().bad_ranges.push((at, chunk));
        bad.push((role, at));
    }
    again.run_until_idle();
    assert!(!again.is_resyncing(), "{what}: resync still running");

    let mirror = g.parity_chunks() == 0;
    let must_heal = mirror || (!holes_too && g.parity_chunks() >= 2);
    let still_bad: Vec<(usize, u64)> = bad
        .iter()
        .copied()
        .filter(|&(role, at)| {
            let device = again.role_device(role).unwrap();
            let state = device.state();
            state.bad_ranges.iter().any(|&(b, len)| b < at + chunk && at < b + len)
        })
        .collect();
    if must_heal {
        assert!(still_bad.is_empty(), "{what}: resync left bad chunks {still_bad:?} of {bad:?}");
    }
    check_reads(&mut again, &allowed, &holes, stripe_bytes, &what, "after resync");
    let (devices, clean) = again.shutdown_with_state().unwrap();
    if must_heal {
        assert!(clean, "{what}: resync did not finish: the array stopped dirty");
    }
    // Reassembled, then down to the level's tolerance: what the remaining members say.
    let mut last = SimArray::assemble(devices, opts, DirtyDegraded::Refuse).unwrap();
    last.run_until_idle();
    let keep = if level == Level::Raid1 { members - 1 } else { rng.random_range(0..members) };
    last.fail_all_but(keep);
    check_reads(&mut last, &allowed, &holes, stripe_bytes, &what, &format!("kept {keep} alone"));
}

/// Every block reads as one of its allowed values, or fails. A block outside the stripes that
/// had writes in flight fails only where resync could not vouch for its stripe (RAID 5, or a
/// stripe with writes in flight and a bad sector on parity levels).
fn check_reads(
    array: &mut SimArray,
    allowed: &[Vec<Vec<u8>>],
    holes: &BTreeSet<u64>,
    stripe_bytes: u64,
    what: &str,
    when: &str,
) {
    for (b, values) in allowed.iter().enumerate() {
        let at = b as u64 * BLOCK;
        match array.read(at, BLOCK) {
            Ok(got) => assert!(
                values.contains(&got),
                "{what}: {when}: block {b} (stripe {}, hole {}) reads data never written",
                at / stripe_bytes,
                holes.contains(&(at / stripe_bytes)),
            ),
            Err(e) => assert!(
                array.geometry().level() == Level::Raid5 || array.geometry().parity_chunks() > 0,
                "{what}: {when}: block {b} unreadable on a mirror: {e:?}"
            ),
        }
    }
}

#[test]
fn resync_heals_bad_sectors_in_quiet_stripes() {
    flashraid_sim::for_each_redundant_level(|level, members, seed| {
        run(level, members, seed, false)
    });
}

#[test]
fn resync_over_bad_sectors_where_writes_were_in_flight_never_invents_data() {
    flashraid_sim::for_each_redundant_level(|level, members, seed| run(level, members, seed, true));
}

// ----------------------------------------------------------------------------------------
// Found by review of the first version (2026-11-25), which took a chunk with a bad sector
// anywhere in it as wholly unreadable and rewrote all of it: bytes of that chunk that could
// be read, and were read by a client before resync reached the stripe, then changed with no
// write in between. Resync now reads such a chunk again unit by unit and treats only the
// units that fail as unreadable. Each case fails against that version.

/// Chunk size of the read-before-resync cases: two 4 KiB units.
const CHUNK: u64 = 8192;
/// An even stripe near the end of bitmap region 0 (resync walks the region from its start).
const TARGET: u64 = REGION_BYTES / CHUNK - 2;

/// OLD durable over data position 0 of `TARGET`, NEW written over it (cached) and then lost
/// at power loss from the member holding that chunk's first copy only (kept everywhere
/// else: parity rows, other copies). After reassembly a bad sector appears in the chunk's
/// *second* block on that member. A read of the chunk's *first* block before resync reaches
/// the stripe must read the same after resync.
fn read_before_resync_stays(level: Level, members: usize) {
    let name = format!("{level} x{members}");
    let mut options = SimOptions::new(1, level, members);
    options.chunk_bytes = CHUNK;
    options.shards = 1;
    options.config.bitmap_clear_delay_us = 60_000_000;
    options.config.resync_stripes_max = 1;
    let mut array = SimArray::create(options.clone()).unwrap();
    let g = array.geometry();
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let at = g.array_offset(Location {
        stripe: StripeIndex(TARGET),
        data_index: 0,
        offset_in_chunk_bytes: 0,
    });
    let old = pattern(1, CHUNK as usize);
    let new = pattern(2, CHUNK as usize);
    array.write(at.0, &old).unwrap();
    array.flush().unwrap();
    array.write(at.0, &new).unwrap();

    // Power loss: NEW lost from the member holding copy 0 of data position 0 (for mirrors,
    // the reference copy: the lowest member), kept on every other member.
    let lost_on = g.data_member(StripeIndex(TARGET), 0, 0).get();
    let lo = data_offset + g.member_offset(StripeIndex(TARGET), 0).0;
    let hi = lo + CHUNK;
    for role in 0..members {
        let device = array.role_device(role).unwrap();
        let mut state = device.state();
        if role == lost_on {
            state.unflushed.retain(|&(o, l)| !(o < hi && lo < o + l));
        }
        state.flush().unwrap();
    }
    let devices = array.crash();
    let mut again = SimArray::assemble(devices, options, DirtyDegraded::Refuse).unwrap();
    assert!(again.is_resyncing(), "{name}: nothing to resync");
    {
        let device = again.role_device(lost_on).unwrap();
        let state = device.state();
        assert_eq!(&state.current[lo as usize..hi as usize], &old[..], "{name}: setup");
    }
    // A latent bad sector in the chunk's second block.
    again.role_device(lost_on).unwrap().state().bad_ranges.push((lo + BLOCK, BLOCK));

    // Before resync reaches the stripe: the first block, which is readable.
    let ticket =
        again.submit(ArrayOp::Read { offset: ArrayOffset(at.0), len_bytes: BLOCK }, None).unwrap();
    let before = again.wait(ticket).unwrap().expect("data");
    assert!(again.is_resyncing(), "{name}: resync finished before the first read");
    let what = |b: &[u8]| {
        if b == &old[..BLOCK as usize] {
            "OLD"
        } else if b == &new[..BLOCK as usize] {
            "NEW"
        } else {
            "neither"
        }
    };
    again.run_until_idle();
    assert!(!again.is_resyncing(), "{name}: resync did not finish");
    let after = again.read(at.0, BLOCK).unwrap();
    assert!(
        before == after,
        "{name}: block read {} before resync reads {} after it, with no write in between \
         (errors_corrected {})",
        what(&before),
        what(&after),
        again.counters().errors_corrected
    );
}

#[test]
fn raid1_resync_heal_keeps_what_was_read_from_the_reference_copy() {
    read_before_resync_stays(Level::Raid1, 2);
}

#[test]
fn raid10_resync_heal_keeps_what_was_read_from_the_reference_copy() {
    read_before_resync_stays(Level::Raid10, 4);
}

#[test]
fn raid6_resync_heal_keeps_the_readable_part_of_a_data_chunk() {
    read_before_resync_stays(Level::Raid6, 4);
}

#[test]
fn raid73_resync_heal_keeps_the_readable_part_of_a_data_chunk() {
    read_before_resync_stays(Level::Raid7_3, 5);
}

/// RAID 1 x3: the bad sector covers the whole chunk of the reference copy (member 0); a
/// read before resync fails there and is served from `pick_copy` (rotating: member 2 for a
/// stripe = 2 mod 3), and read repair rewrites only the range read on member 0. The first
/// version of resync then still could not read member 0's chunk and took member 1 as
/// reference, overwriting the block that was read (from member 2) with member 1's bytes;
/// now the repaired unit of member 0 reads, and is the reference there.
#[test]
fn raid1_x3_a_read_served_from_a_fallback_copy_stays_after_resync() {
    let members = 3;
    let stripe = REGION_BYTES / CHUNK - 3; // 125: = 2 mod 3
    assert_eq!(stripe % 3, 2);
    let mut options = SimOptions::new(1, Level::Raid1, members);
    options.chunk_bytes = CHUNK;
    options.shards = 1;
    options.config.bitmap_clear_delay_us = 60_000_000;
    options.config.resync_stripes_max = 1;
    let mut array = SimArray::create(options.clone()).unwrap();
    let g = array.geometry();
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let at = g.array_offset(Location {
        stripe: StripeIndex(stripe),
        data_index: 0,
        offset_in_chunk_bytes: 0,
    });
    let old = pattern(3, CHUNK as usize);
    let new = pattern(4, CHUNK as usize);
    array.write(at.0, &old).unwrap();
    array.flush().unwrap();
    array.write(at.0, &new).unwrap();
    // NEW survives on member 2 only.
    let lo = data_offset + g.member_offset(StripeIndex(stripe), 0).0;
    let hi = lo + CHUNK;
    for role in 0..members {
        let device = array.role_device(role).unwrap();
        let mut state = device.state();
        if role != 2 {
            state.unflushed.retain(|&(o, l)| !(o < hi && lo < o + l));
        }
        state.flush().unwrap();
    }
    let devices = array.crash();
    let mut again = SimArray::assemble(devices, options, DirtyDegraded::Refuse).unwrap();
    assert!(again.is_resyncing());
    again.role_device(0).unwrap().state().bad_ranges.push((lo, CHUNK));
    let ticket =
        again.submit(ArrayOp::Read { offset: ArrayOffset(at.0), len_bytes: BLOCK }, None).unwrap();
    let before = again.wait(ticket).unwrap().expect("data");
    assert!(again.is_resyncing());
    again.run_until_idle();
    assert!(!again.is_resyncing());
    let after = again.read(at.0, BLOCK).unwrap();
    let what = |b: &[u8]| {
        if b == &old[..BLOCK as usize] {
            "OLD"
        } else if b == &new[..BLOCK as usize] {
            "NEW"
        } else {
            "neither"
        }
    };
    assert!(before == after, "read {} before resync, {} after", what(&before), what(&after));
}
