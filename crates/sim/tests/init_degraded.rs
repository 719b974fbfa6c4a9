//! A member failing while background init runs on a parity level (found by review,
//! 2026-11-25; the first three tests failed before the fix): init had marked every region
//! dirty exactly as a crash does, so reads there that needed reconstruction were refused,
//! degraded writes were refused, and a spare's rebuild stalled for good (init waited for the
//! rebuild, the rebuild for init). The superblock's `init_state` now says when the dirty
//! regions are init's only, with no crash since; reconstruction is trusted there (writes
//! there recompute parity over their range). After a crash in the session it is unknown
//! again, and the array behaves as after any crash.

use flashraid_control::Init;
use flashraid_engine::ShardEvent;
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::Level;
use flashraid_sim::{SimArray, SimOptions, pattern};

/// A new RAID 6 made with background init (every region dirty, resync sweeping slowly),
/// written and flushed, then one member fails before init got to the written stripes. RAID 6
/// survives two failures: the acknowledged, flushed data must still read back, and writes
/// must still be taken.
#[test]
fn background_init_raid6_one_failure_keeps_acknowledged_data_readable() {
    for level in [Level::Raid6, Level::Raid5] {
        let mut options = SimOptions::new(11, level, 6);
        options.init = Init::Background;
        options.member_bytes = 8 << 20;
        options.shards = 1;
        // Slow init: it has not reached the far end of the array when the member fails.
        options.config.resync_rate_bytes_per_s = 64 << 10;
        let mut array = SimArray::create(options).unwrap();
        let size = array.array_bytes();
        let at = size / 2;
        let data = pattern(7, 256 << 10);
        array.write(at, &data).unwrap();
        array.flush().unwrap();
        array.run_steps(100);
        assert!(array.is_resyncing(), "init still running");
        // The member holding the first data chunk of the written range fails.
        let stripe = at / array.geometry().stripe_data_bytes();
        let role = array.data_role(stripe, 0);
        array.fail_member(role);
        array.run_steps(100);
        let got = array.read(at, data.len() as u64);
        let write = array.write(at, &pattern(8, 256 << 10));
        assert!(
            got.as_ref().is_ok_and(|g| *g == data) && write.is_ok(),
            "{level}: one member failed during background init: flushed data read back {:?}, \
             a new write {:?}",
            got.map(|_| "data"),
            write
        );
    }
}

/// A hot spare takes over a member that fails while background init runs. The members hold
/// zeroes (so every stripe is in fact consistent) and a little data written during init:
/// the array must heal (the rebuild finishes, init finishes) without the operator.
#[test]
fn a_spare_taking_over_during_background_init_finishes_its_rebuild() {
    spare_during_init(Level::Raid5, false);
}

/// The same on RAID 6, whose members hold garbage (what background init is for: members not
/// zeroed). One role out of two that RAID 6 survives.
#[test]
fn a_spare_taking_over_during_background_init_finishes_its_rebuild_raid6_garbage() {
    spare_during_init(Level::Raid6, true);
}

fn spare_during_init(level: Level, garbage: bool) {
    {
        let mut options = SimOptions::new(12, level, 5);
        options.init = Init::Background;
        options.spares = 1;
        options.member_bytes = 4 << 20;
        options.shards = 1;
        options.config.resync_rate_bytes_per_s = 64 << 10;
        let mut array = SimArray::create(options.clone()).unwrap();
        if garbage {
            let sb = array.metadata().superblock().clone();
            let lo = sb.data_offset_bytes as usize;
            let hi = lo + sb.member_data_bytes as usize;
            for (i, d) in array.devices.iter().enumerate() {
                let g = pattern(100 + i as u64, hi - lo);
                let mut s = d.state();
                s.current[lo..hi].copy_from_slice(&g);
                s.durable[lo..hi].copy_from_slice(&g);
            }
        }
        let size = array.array_bytes();
        let data = pattern(9, 64 << 10);
        array.write(size / 2, &data).unwrap();
        array.flush().unwrap();
        array.run_steps(100);
        assert!(array.is_resyncing());
        array.fail_member(1);
        array.run_steps(10);
        assert!(array.is_rebuilding(), "the spare took over");
        let mut steps = 0u64;
        while array.is_rebuilding() && steps < 3_000_000 {
            array.step();
            steps += 1;
        }
        let stalls: Vec<String> = array
            .events
            .iter()
            .filter(|e| matches!(e, ShardEvent::RebuildStalled { .. }))
            .map(|e| format!("{e:?}"))
            .take(3)
            .collect();
        assert!(
            !array.is_rebuilding(),
            "{level}: rebuild onto the spare never finished in {steps} steps (30 s simulated); \
             stalls: {stalls:?}"
        );
        assert_eq!(array.read(size / 2, data.len() as u64).unwrap(), data);
        // Healed: init goes on once every role is in service (here after a clean stop and a
        // start at full speed), and a scrub then finds nothing.
        let mut devices = array.shutdown_during_background_work().unwrap();
        devices.retain(|d| !d.state().gone);
        options.config.resync_rate_bytes_per_s = 0;
        let mut array = SimArray::assemble(devices, options, DirtyDegraded::Refuse).unwrap();
        array.run_until_idle();
        assert!(!array.is_resyncing(), "{level}: init did not finish after the rebuild");
        let (tally, stopped) = array.scrub(false);
        assert_eq!((tally.mismatches, stopped), (0, None), "{level}: {tally:?}");
        assert_eq!(array.read(size / 2, data.len() as u64).unwrap(), data);
    }
}

/// Background init stopped clean halfway (`init_state` says the dirty regions are init's
/// only): the array starts again without a member, unforced, and what was written reads back
/// through reconstruction. Stopped by a crash instead, nothing says that no write was in
/// flight: a degraded start is refused unless forced, as after any crash.
#[test]
fn a_clean_stop_during_background_init_keeps_a_degraded_start_possible() {
    for crash in [false, true] {
        for level in [Level::Raid5, Level::Raid6] {
            let what = format!("{level} crash {crash}");
            let mut options = SimOptions::new(14, level, 5);
            options.init = Init::Background;
            options.member_bytes = 4 << 20;
            options.shards = 1;
            options.config.resync_rate_bytes_per_s = 64 << 10;
            let mut array = SimArray::create(options.clone()).unwrap();
            let size = array.array_bytes();
            let at = size / 2;
            let data = pattern(21, 128 << 10);
            array.write(at, &data).unwrap();
            array.flush().unwrap();
            array.run_steps(100);
            assert!(array.is_resyncing(), "{what}: init still running");
            let stripe = at / array.geometry().stripe_data_bytes();
            let role = array.data_role(stripe, 0);
            let mut devices = if crash {
                array.crash()
            } else {
                array.shutdown_during_background_work().unwrap()
            };
            devices.remove(role);
            let started =
                SimArray::assemble(devices.clone(), options.clone(), DirtyDegraded::Refuse);
            if crash {
                assert!(started.is_err(), "{what}: a degraded start after a crash in init");
                let mut array = SimArray::assemble_forced(devices, options).unwrap();
                // Forced: reconstruction in the regions init has not reached is refused.
                assert!(
                    array.read(at, data.len() as u64).is_err(),
                    "{what}: trusted after a crash"
                );
                continue;
            }
            let mut array = started.unwrap_or_else(|e| panic!("{what}: refused: {e}"));
            assert_eq!(array.read(at, data.len() as u64).unwrap(), data, "{what}");
            let more = pattern(22, 64 << 10);
            array.write(at, &more).unwrap();
            assert_eq!(array.read(at, more.len() as u64).unwrap(), more, "{what}");
        }
    }
}

/// Control: mirrors keep acknowledged data readable after a failure during background init,
/// and a spare's rebuild finishes.
#[test]
fn mirrors_during_background_init_keep_data_and_heal() {
    for (level, n) in [(Level::Raid1, 3), (Level::Raid10, 4)] {
        let mut options = SimOptions::new(13, level, n);
        options.init = Init::Background;
        options.spares = 1;
        options.member_bytes = 4 << 20;
        options.shards = 2;
        options.config.resync_rate_bytes_per_s = 64 << 10;
        let mut array = SimArray::create(options).unwrap();
        let size = array.array_bytes();
        let data = pattern(9, 64 << 10);
        array.write(size / 2, &data).unwrap();
        array.flush().unwrap();
        array.fail_member(0);
        assert_eq!(array.read(size / 2, data.len() as u64).unwrap(), data);
        array.run_until_rebuilt();
        array.run_steps(1000);
        assert_eq!(array.read(size / 2, data.len() as u64).unwrap(), data);
    }
}
