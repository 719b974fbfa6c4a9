//! Forced starts of arrays failed past their tolerance: what they resync and distrust. A
//! member whose failure took the array past its tolerance missed no write (writes were
//! refused from then on) but those in flight, which the write-intent bitmap keeps; the
//! missed-write map, which names every region written since the first failure, is distrusted
//! only when a member brought back failed while the array still served writes (found by
//! review: distrusting it always left a resumed rebuild or a later re-add stalled for good).
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn options(seed: u64, level: Level, members: usize) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.member_bytes = 3 << 20;
    o.shards = 1 + (seed % 2) as u32;
    o
}

/// Stop `array` (failed past its tolerance) and start it with --force from its devices,
/// all present again, less `leave_out` (a device not given to the start).
fn forced_restart(
    array: SimArray,
    o: &SimOptions,
    leave_out: Option<usize>,
    what: &str,
) -> SimArray {
    let mut devices = array.shutdown().unwrap();
    for d in &devices {
        d.state().gone = false;
    }
    if let Some(i) = leave_out {
        devices.remove(i);
    }
    SimArray::assemble_forced(devices, o.clone()).unwrap_or_else(|e| panic!("{what}: forced: {e}"))
}

/// Past the tolerance, refused; forced start; the members still out are then given back
/// and must re-add and rebuild, after which every block reads.
#[test]
fn members_still_out_after_a_forced_start_re_add_and_every_block_reads() {
    let mut failures = vec![];
    for seed in [1u64, 2] {
        for (level, members) in flashraid_sim::REDUNDANT_LEVELS {
            let what = format!("{level} x{members} seed {seed}");
            eprintln!("{what}");
            let mut rng = StdRng::seed_from_u64(seed * 1000 + 17 + members as u64);
            let o = options(seed, level, members);
            let mut array = SimArray::create(o.clone()).unwrap();
            let mut data = array.fill_random(&mut rng);
            // Let the fill's write-intent bits clear first: only the small writes below
            // are in the missed-write map.
            array.run_until_idle();
            array.run_steps(5000);
            let tolerance = array.geometry().tolerance();
            let _held: Vec<SimMember> =
                (0..members).map(|r| array.role_device(r).unwrap()).collect();
            for role in 0..tolerance {
                array.fail_member(role);
                let at = rng.random_range(0..data.len() / 4096 - 16) * 4096;
                array.write_random(&mut data, at, 16 * 4096, &mut rng);
            }
            array.flush().unwrap();
            array.run_steps(1000);
            eprintln!("  missed regions before the last failure: {}", array.missed_regions_set());
            array.fail_member(tolerance);
            assert!(array.metadata().past_tolerance());
            for r in 0..=tolerance {
                assert!(array.re_add(r).is_err());
            }
            let mut array = forced_restart(array, &o, None, &what);
            let (g, r) = array.reads_never_wrong(&data, &format!("{what} forced"));
            eprintln!(
                "  after forced start: {g} good {r} refused; missing {:?}",
                array.metadata().missing_roles()
            );
            for role in array.metadata().missing_roles() {
                let got = array.re_add(role);
                eprintln!("  re-add {role}: {got:?}");
                got.unwrap_or_else(|e| panic!("{what}: re-add {role} after forced start: {e}"));
                let mut steps = 0;
                while array.is_rebuilding() && steps < 200_000 {
                    array.step();
                    steps += 1;
                }
                if array.is_rebuilding() {
                    failures.push(format!(
                        "{what}: re-add of {role} never finishes its rebuild: {:?}",
                        array.rebuild_statuses()
                    ));
                    break;
                }
            }
            if array.is_rebuilding() {
                continue;
            }
            array.run_until_idle();
            let (g, r) = array.reads_never_wrong(&data, &format!("{what} all back"));
            eprintln!("  all back: {g} good {r} refused");
            if r != 0 {
                failures.push(format!("{what}: {r} reads refused with every member back"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The headline sequence with writes going on: a hot spare is rebuilding member 0 while the
/// array keeps taking writes, member 1 fails (past the tolerance), the array is stopped and
/// started with --force: member 1 comes back and the rebuild resumes. It must finish, and
/// every block must read as written (no write was in flight at member 1's failure).
#[test]
fn a_rebuild_resumed_after_a_forced_start_finishes_and_every_block_reads() {
    let mut failures = vec![];
    for (level, members) in
        [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid7_3, 7), (Level::Raid1, 3)]
    {
        let what = format!("{level} x{members}");
        let mut rng = StdRng::seed_from_u64(7 + members as u64);
        let mut o = options(1, level, members);
        o.spares = 1;
        o.config.rebuild_rate_bytes_per_s = 1 << 20;
        let mut array = SimArray::create(o.clone()).unwrap();
        let mut data = array.fill_random(&mut rng);
        array.run_until_idle();
        array.run_steps(5000);
        let tolerance = array.geometry().tolerance();
        for role in 0..tolerance {
            array.fail_member(role);
            array.run_steps(20);
            // A write near the end of the array: above the rebuild's cursor.
            let at = data.len() - 64 * 4096 * (role + 1);
            array.write_random(&mut data, at, 16 * 4096, &mut rng);
        }
        array.flush().unwrap();
        array.run_steps(2000);
        assert!(array.is_rebuilding(), "{what}: rebuild already done");
        array.fail_member(tolerance);
        assert!(array.metadata().past_tolerance(), "{what}");
        // Member 0's old device: no longer listed (the spare holds its role); not given.
        let mut array = forced_restart(array, &o, Some(0), &what);
        let (g, r) = array.reads_never_wrong(&data, &format!("{what} forced"));
        eprintln!(
            "{what}: after the forced start {g} good, {r} refused; rebuilding {}",
            array.is_rebuilding()
        );
        let mut steps = 0;
        while array.is_rebuilding() && steps < 300_000 {
            array.step();
            steps += 1;
        }
        if array.is_rebuilding() {
            failures.push(format!(
                "{what}: the resumed rebuild never finishes: {:?}",
                array.rebuild_statuses()
            ));
            continue;
        }
        let (g, r) = array.reads_never_wrong(&data, &format!("{what} rebuilt"));
        eprintln!("{what}: rebuilt: {g} good, {r} refused");
        if r != 0 {
            failures.push(format!("{what}: {r} refused after the rebuild"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The member whose failure failed the array is not there, so the forced start brings back
/// one that failed while the array still served writes: it missed the writes made after its
/// failure, which the missed-write map names, and those regions are distrusted. A read that
/// would reconstruct from its chunks there is refused, never wrong (a read of its own chunk
/// returns what it holds, as with md, and is not checked).
#[test]
fn a_member_failed_earlier_brought_back_has_the_regions_it_missed_distrusted() {
    use flashraid_layout::{ArrayOffset, MemberIndex};
    for (level, members) in
        [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid7_3, 6), (Level::Raid5, 5)]
    {
        let what = format!("{level} x{members}");
        let mut rng = StdRng::seed_from_u64(29 + members as u64);
        let o = options(1, level, members);
        let mut array = SimArray::create(o.clone()).unwrap();
        let mut data = array.fill_random(&mut rng);
        array.run_until_idle();
        array.run_steps(5000);
        let g = array.geometry();
        let tolerance = g.tolerance();
        for role in 0..tolerance {
            array.fail_member(role);
            for _ in 0..8 {
                let at = rng.random_range(0..data.len() / 4096 - 16) * 4096;
                array.write_random(&mut data, at, 16 * 4096, &mut rng);
            }
        }
        array.flush().unwrap();
        array.run_until_idle();
        array.run_steps(5000);
        array.fail_member(tolerance);
        assert!(array.metadata().past_tolerance(), "{what}");
        // Device `r` holds role `r` (no spares): the member failed last is not given.
        let mut array = forced_restart(array, &o, Some(tolerance), &what);
        let revived = tolerance - 1;
        assert_eq!(
            array.metadata().missing_roles().len(),
            tolerance,
            "{what}: one member brought back"
        );
        let (mut good, mut refused) = (0, 0);
        for (i, block) in data.chunks(4096).enumerate() {
            let offset = i as u64 * 4096;
            let at = g.locate(ArrayOffset(offset)).unwrap();
            if g.data_member(at.stripe, at.data_index, 0) == MemberIndex(revived as u16) {
                continue;
            }
            match array.read(offset, 4096) {
                Ok(got) => {
                    assert!(got == block, "{what}: block {i} reads wrong");
                    good += 1;
                }
                Err(_) => refused += 1,
            }
        }
        eprintln!("{what}: {good} good, {refused} refused");
        assert!(good > 0 && refused > 0, "{what}");
    }
}
