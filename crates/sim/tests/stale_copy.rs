//! A stale copy of a member: an image of one member taken while the array was stopped, put
//! back in place of the member after the array ran again (a disk swapped for an older one,
//! a VM disk rolled back alone). Its superblock still says "active", so before the update
//! count assembly used it as current and reads of its chunks returned old data.
//!
//! Checks, on every level:
//! - after a session that wrote (ended cleanly, or by a power cut right after its writes
//!   were flushed), the copy is left out (said why) and every read returns the new data;
//!   where the level survives nothing (RAID 0) assembly is refused and names `--force`;
//! - a power cut after any metadata write of a start leaves no member judged stale, and the
//!   data is intact; with the copy put back after such a cut (the session wrote nothing),
//!   the array starts and reads the old data, whether or not the copy is used.
//!
//! Seeds: printed; `FLASHRAID_SEED=n` replays, `FLASHRAID_SEEDS=n` runs more.

use flashraid_control::{MetaDevice, prepare, start};
use flashraid_engine::ArrayAccess;
use flashraid_format::assembly::{
    AssemblyError, AssemblyRequest, DirtyDegraded, StaleMembers, StrictDevices,
};
use flashraid_format::layout::{SUPERBLOCK_COPY0_OFFSET_BYTES, superblock_copy1_offset};
use flashraid_layout::Level;
use flashraid_parity::Kernel;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::Cell;

const LEVELS: [(Level, usize); 6] = [
    (Level::Raid0, 3),
    (Level::Raid1, 2),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 5),
    (Level::Raid7_3, 6),
];

fn options(seed: u64, level: Level, members: usize) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.member_bytes = 3 << 20;
    o.shards = 1 + (seed % 2) as u32;
    o
}

fn request(stale: StaleMembers) -> AssemblyRequest {
    AssemblyRequest {
        array_uuid: None,
        array_name: None,
        strict: StrictDevices::Strict,
        dirty_degraded: DirtyDegraded::Refuse,
        stale,
    }
}

fn read_all(array: &mut SimArray) -> Vec<u8> {
    let len = array.array_bytes();
    let mut out = vec![];
    let mut at = 0;
    while at < len {
        let piece = (256 << 10).min(len - at);
        out.extend(array.read(at, piece).unwrap());
        at += piece;
    }
    out
}

/// A power cut after the `budget`-th metadata write (or superblock write, with
/// `superblocks_only`): later writes and syncs never happen.
struct CutAfter<'a> {
    device: &'a SimMember,
    budget: &'a Cell<u64>,
    superblocks_only: bool,
}

impl CutAfter<'_> {
    /// Whether the write at `offset` happens (and counts it).
    fn spend(&self, offset_bytes: u64) -> bool {
        let left = self.budget.get();
        let superblock = offset_bytes == SUPERBLOCK_COPY0_OFFSET_BYTES
            || Some(offset_bytes) == superblock_copy1_offset(self.device.size_bytes());
        if left > 0 && (superblock || !self.superblocks_only) {
            self.budget.set(left - 1);
        }
        left > 0
    }
}

impl MetaDevice for CutAfter<'_> {
    fn name(&self) -> String {
        self.device.name()
    }
    fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), String> {
        self.device.read_at(buf, offset_bytes)
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), String> {
        if self.spend(offset_bytes) { self.device.write_at(buf, offset_bytes) } else { Ok(()) }
    }
    fn sync(&self) -> Result<(), String> {
        if self.budget.get() > 0 { self.device.sync() } else { Ok(()) }
    }
    fn zeroes_after_discard(&self) -> bool {
        self.device.zeroes_after_discard()
    }
    fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), String> {
        if self.spend(offset_bytes) {
            self.device.zero_range(offset_bytes, len_bytes)
        } else {
            Ok(())
        }
    }
}

/// Start the array on `devices` with power cut after `budget` metadata writes, then lose
/// what was not durable. Returns the writes left unspent (0: the cut came inside the start).
fn start_cut(devices: &[SimMember], o: &SimOptions, budget: u64, rng: &mut StdRng) -> u64 {
    start_cut_counting(devices, o, budget, false, rng)
}

/// `start_cut`, counting superblock writes only when `superblocks_only`.
fn start_cut_counting(
    devices: &[SimMember],
    o: &SimOptions,
    budget: u64,
    superblocks_only: bool,
    rng: &mut StdRng,
) -> u64 {
    let cell = Cell::new(budget);
    let cut: Vec<CutAfter> =
        devices.iter().map(|device| CutAfter { device, budget: &cell, superblocks_only }).collect();
    let refs: Vec<&dyn MetaDevice> = cut.iter().map(|c| c as &dyn MetaDevice).collect();
    let prepared = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap();
    start(&refs, &prepared, o.shards, o.config, Kernel::best(), ArrayAccess::ReadWrite).unwrap();
    for device in devices {
        device.state().power_loss(rng);
    }
    cell.get()
}

fn images(devices: &[SimMember]) -> Vec<SimMember> {
    devices.iter().map(SimMember::image).collect()
}

#[test]
fn a_stale_copy_put_back_is_left_out_and_never_read() {
    for seed in flashraid_sim::seeds(2) {
        for (level, members) in LEVELS {
            for crash in [false, true] {
                eprintln!("stale copy {level} x{members} seed {seed} crash {crash}");
                let mut rng = StdRng::seed_from_u64(seed * 1000 + members as u64);
                let o = options(seed, level, members);
                let mut array = SimArray::create(o.clone()).unwrap();
                let old = array.fill_random(&mut rng);
                let mut devices = array.shutdown().unwrap();
                let role = rng.random_range(0..members);
                let copy = devices[role].image();
                // A session that writes, and ends cleanly or by a power cut after its
                // flush (the case a one-pass start could not tell from a lagging member).
                let mut array =
                    SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
                let new = array.fill_random(&mut rng);
                assert_ne!(old, new);
                devices = if crash {
                    // Idle past the bitmap's clearing delay first: with regions still
                    // marked, a degraded start is refused for the write hole instead.
                    array.run_steps(1000);
                    array.crash()
                } else {
                    array.shutdown().unwrap()
                };
                devices[role] = copy;
                let name = devices[role].name();
                let refs: Vec<&dyn MetaDevice> =
                    devices.iter().map(|d| d as &dyn MetaDevice).collect();
                if level == Level::Raid0 {
                    let e = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap_err();
                    let text = e.to_string();
                    assert!(
                        matches!(
                            e,
                            flashraid_control::ControlError::Assembly(
                                AssemblyError::StaleMembersNeeded { .. }
                            )
                        ),
                        "{text}"
                    );
                    assert!(text.contains(&name) && text.contains("--force"), "{text}");
                    // Forced, the copy is used, said so, and the array resynced.
                    let p = prepare(&refs, &request(StaleMembers::UseIfNeeded)).unwrap();
                    assert_eq!(p.assembled.stale_used, vec![name.clone()]);
                    continue;
                }
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap();
                let a = &prepared.assembled;
                assert_eq!(a.roles[role], None, "{level}: the stale copy holds its role");
                let (left, why) = &a.left_out[0];
                assert!(left == &name && why.contains("stale copy"), "{why}");
                let mut array =
                    SimArray::assemble(devices, o.clone(), DirtyDegraded::Force).unwrap();
                assert!(read_all(&mut array) == new, "{level} seed {seed}: old data read back");
            }
        }
    }
}

/// A copy of a member taken while the array runs (a `cp` or snapshot of a member file, its
/// writes flushed), the array written on and stopped clean, and the copy put back: a clean
/// stop marks the end of its session in two metadata passes (like a start), so the copy is
/// two passes short of it and left out, and every read returns the new data. Checked to fail
/// with the one-pass clean stop: the copy was used and old data read back.
#[test]
fn a_copy_taken_while_the_array_runs_is_left_out_after_a_clean_stop() {
    for seed in flashraid_sim::seeds(2) {
        for (level, members) in LEVELS {
            eprintln!("running copy {level} x{members} seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed * 1000 + 31 + members as u64);
            let o = options(seed, level, members);
            let mut array = SimArray::create(o.clone()).unwrap();
            let old = array.fill_random(&mut rng);
            array.run_steps(rng.random_range(0..2000));
            let role = rng.random_range(0..members);
            let copy = array.role_device(role).unwrap().image();
            let new = array.fill_random(&mut rng);
            assert_ne!(old, new);
            let mut devices = array.shutdown().unwrap();
            devices[role] = copy;
            let name = devices[role].name();
            let refs: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
            if level == Level::Raid0 {
                let e = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap_err();
                let text = e.to_string();
                assert!(text.contains(&name) && text.contains("--force"), "{level}: {text}");
                continue;
            }
            let prepared = prepare(&refs, &request(StaleMembers::LeaveOut))
                .unwrap_or_else(|e| panic!("{level} seed {seed}: {e}"));
            let a = &prepared.assembled;
            assert_eq!(a.roles[role], None, "{level} seed {seed}: the running copy holds its role");
            let (left, why) = &a.left_out[0];
            assert!(left == &name && why.contains("stale copy"), "{why}");
            let mut array = SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
            assert!(read_all(&mut array) == new, "{level} seed {seed}: old data read back");
        }
    }
}

/// A power cut after any superblock write of a clean stop's two passes: no member is judged
/// stale and the data is intact. With a copy taken while the array ran put back: once the
/// second pass has reached a member other than the copy's, the copy is left out; a cut inside the first pass
/// leaves it indistinguishable from a member that missed that pass (the limit in
/// docs/safety.md), and the test does not ask.
#[test]
fn a_power_cut_anywhere_in_a_clean_stop_leaves_no_member_stale() {
    for seed in flashraid_sim::seeds(1) {
        for (level, members) in LEVELS {
            eprintln!("cut stop {level} x{members} seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed * 1000 + 57 + members as u64);
            let o = options(seed, level, members);
            let role = rng.random_range(0..members);
            // The same session each time: created, written, a copy of one member taken
            // while it runs, written again; then a stop cut after `budget` superblock writes.
            let session = |rng: &mut StdRng| {
                let mut array = SimArray::create(o.clone()).unwrap();
                array.fill_random(rng);
                let copy = array.role_device(role).unwrap().image();
                let data = array.fill_random(rng);
                (array, copy, data)
            };
            let stop_cut = |array: SimArray, budget: u64, rng: &mut StdRng| {
                let cell = Cell::new(budget);
                let (devices, clean) = array
                    .shutdown_marking_with(|metadata, devices| {
                        let cut: Vec<CutAfter> = devices
                            .iter()
                            .map(|device| CutAfter {
                                device,
                                budget: &cell,
                                superblocks_only: true,
                            })
                            .collect();
                        let refs: Vec<&dyn MetaDevice> =
                            cut.iter().map(|c| c as &dyn MetaDevice).collect();
                        metadata.mark_clean(&refs)
                    })
                    .unwrap();
                assert!(clean);
                for device in &devices {
                    device.state().power_loss(rng);
                }
                (devices, budget - cell.get())
            };
            let (array, _, _) = session(&mut StdRng::seed_from_u64(seed));
            let (_, spent) = stop_cut(array, u64::MAX, &mut rng);
            // Two passes of two copies on every member.
            assert_eq!(spent, 4 * members as u64, "{level}: superblock writes of a clean stop");
            for budget in 0..=spent {
                let (array, copy, data) = session(&mut StdRng::seed_from_u64(seed));
                let (devices, _) = stop_cut(array, budget, &mut rng);
                let refs: Vec<&dyn MetaDevice> =
                    devices.iter().map(|d| d as &dyn MetaDevice).collect();
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut))
                    .unwrap_or_else(|e| panic!("{level}: stop cut after {budget}: {e}"));
                let a = &prepared.assembled;
                assert!(
                    a.left_out.is_empty() && a.roles.iter().all(Option::is_some),
                    "{level}: stop cut after {budget} of {spent} writes: {:?}",
                    a.left_out
                );
                let mut with_copy: Vec<SimMember> = images(&devices);
                with_copy[role] = copy;
                let mut array =
                    SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
                assert!(
                    read_all(&mut array) == data,
                    "{level}: stop cut after {budget}: data lost"
                );
                // Two writes of the second pass land, durably, on two devices (each
                // device's first copy comes first; the cut write's sync never happens), so
                // one that is not the copy's holds the new session.
                if level == Level::Raid0 || budget < 2 * members as u64 + 3 {
                    continue;
                }
                let refs: Vec<&dyn MetaDevice> =
                    with_copy.iter().map(|d| d as &dyn MetaDevice).collect();
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap();
                assert_eq!(
                    prepared.assembled.roles[role], None,
                    "{level}: stop cut after {budget}: the running copy holds its role"
                );
                let mut array =
                    SimArray::assemble(with_copy, o.clone(), DirtyDegraded::Refuse).unwrap();
                assert!(read_all(&mut array) == data, "{level}: copy after a cut stop: old data");
            }
        }
    }
}

#[test]
fn a_power_cut_anywhere_in_a_start_leaves_no_member_stale() {
    for seed in flashraid_sim::seeds(1) {
        for ((level, members), clean) in LEVELS.into_iter().flat_map(|l| [(l, true), (l, false)]) {
            eprintln!("cut start {level} x{members} seed {seed} clean {clean}");
            let mut rng = StdRng::seed_from_u64(seed * 1000 + 7 + members as u64);
            let o = options(seed, level, members);
            let mut array = SimArray::create(o.clone()).unwrap();
            let data = array.fill_random(&mut rng);
            // Left dirty (a power cut after the flush) or clean.
            let devices = if clean { array.shutdown().unwrap() } else { array.crash() };
            // The metadata writes of one start.
            let spent = u64::MAX - start_cut(&images(&devices), &o, u64::MAX, &mut rng);
            let role = rng.random_range(0..members);
            for budget in 0..spent {
                let cut = images(&devices);
                assert_eq!(start_cut(&cut, &o, budget, &mut rng), 0);
                let refs: Vec<&dyn MetaDevice> = cut.iter().map(|d| d as &dyn MetaDevice).collect();
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut))
                    .unwrap_or_else(|e| panic!("{level}: cut after {budget} of {spent}: {e}"));
                let a = &prepared.assembled;
                assert!(
                    a.left_out.is_empty() && a.roles.iter().all(Option::is_some),
                    "{level}: cut after {budget} of {spent} writes: {:?}",
                    a.left_out
                );
                // Every few cuts, the whole data is read back; and, on a redundant level
                // shut down cleanly, with the pre-start image of one member put back (this
                // session wrote nothing, so whether it is used or left out, the data is the
                // same; after a dirty stop a copy left out makes a start that is refused
                // for the write hole).
                if budget % 16 != 0 && budget + 1 != spent {
                    continue;
                }
                let mut array = SimArray::assemble(cut, o.clone(), DirtyDegraded::Refuse).unwrap();
                assert!(read_all(&mut array) == data, "{level}: cut after {budget}: data lost");
                if level == Level::Raid0 || !clean {
                    continue;
                }
                let mut cut = images(&devices);
                start_cut(&cut, &o, budget, &mut rng);
                cut[role] = devices[role].image();
                let mut array = SimArray::assemble(cut, o.clone(), DirtyDegraded::Refuse)
                    .unwrap_or_else(|e| panic!("{level}: copy after a cut at {budget}: {e}"));
                assert!(read_all(&mut array) == data, "{level}: copy after a cut: data lost");
            }
        }
    }
}

/// Members failed one after another past what the level survives (a flaky backplane, or an
/// operator's `fail --force`): the array fails and takes no more writes, and after a stop
/// no plain start can bring it back. Forced, the member that failed last, whose chunks are
/// the array's as of its failure, is brought back, and every byte reads as written.
#[test]
fn an_array_failed_past_its_tolerance_starts_again_when_forced() {
    for seed in flashraid_sim::seeds(1) {
        for (level, members) in flashraid_sim::REDUNDANT_LEVELS {
            eprintln!("failed past tolerance {level} x{members} seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed * 1000 + 13 + members as u64);
            let o = options(seed, level, members);
            let mut array = SimArray::create(o.clone()).unwrap();
            let mut data = array.fill_random(&mut rng);
            let tolerance = array.geometry().tolerance();
            // Fail members within the tolerance, writing after each failure.
            for role in 0..tolerance {
                array.fail_member(role);
                let at = rng.random_range(0..data.len() / 4096 - 16) * 4096;
                array.write_random(&mut data, at, 16 * 4096, &mut rng);
            }
            array.flush().unwrap();
            array.run_steps(1000);
            // One more: past the tolerance. The array fails and refuses writes.
            array.fail_member(tolerance);
            assert!(array.write(0, &[0u8; 4096]).is_err(), "{level}: a failed array took a write");
            let devices =
                if rng.random_bool(0.5) { array.crash() } else { array.shutdown().unwrap() };
            for device in &devices {
                device.state().gone = false;
            }
            let last = devices[tolerance].name();
            let refs: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
            if members == tolerance + 1 {
                // A mirror with every copy failed: no member was left to record the last
                // failure, so its superblock still says active and a plain start uses it.
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap();
                assert_eq!(prepared.assembled.roles[tolerance], Some(tolerance), "{level}");
                let mut array =
                    SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
                assert!(read_all(&mut array) == data, "{level} seed {seed}: data differs");
                continue;
            }
            let e = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap_err().to_string();
            assert!(
                e.contains("--force brings back")
                    && e.contains(&format!("{last} (role {tolerance}")),
                "{level}: {e}"
            );
            let mut forced = request(StaleMembers::UseIfNeeded);
            forced.dirty_degraded = DirtyDegraded::Force;
            let prepared = prepare(&refs, &forced).unwrap();
            assert_eq!(prepared.assembled.failed_used, vec![last.clone()], "{level}");
            assert_eq!(prepared.assembled.failed_roles, (0..tolerance).collect::<Vec<_>>());
            let mut array = SimArray::assemble_forced(devices, o.clone()).unwrap();
            // Reads that would reconstruct from chunks in regions written while degraded
            // are refused; every other read returns what was written.
            let (good, refused) = array.reads_never_wrong(&data, &format!("{level}"));
            assert!(good > refused, "{level} seed {seed}: {refused} refused, {good} read");
        }
    }
}

/// A failed member's device given back (`spare add`) while the array is failed past its
/// tolerance: the re-add is refused, and nothing is written to any device (found by review:
/// re-added, the last member to fail was named Rebuilding, its rebuild stalled, and a forced
/// start then brought back a member that failed earlier in its place and rebuilt it from
/// that member's stale chunks: reads returned data nobody wrote). The forced start then
/// brings the array back, degraded and serving, every read as written or refused.
#[test]
fn a_member_given_back_past_the_tolerance_is_kept_for_the_forced_start() {
    for seed in flashraid_sim::seeds(1) {
        for (level, members) in flashraid_sim::REDUNDANT_LEVELS {
            for given_back in ["first", "last"] {
                eprintln!("given back past tolerance {level} x{members} {given_back} seed {seed}");
                let mut rng = StdRng::seed_from_u64(seed * 1000 + 17 + members as u64);
                let o = options(seed, level, members);
                let mut array = SimArray::create(o.clone()).unwrap();
                let mut data = array.fill_random(&mut rng);
                let tolerance = array.geometry().tolerance();
                // Devices are created in role order: role r is device r.
                let held: Vec<SimMember> =
                    (0..members).map(|r| array.role_device(r).unwrap()).collect();
                // Fail members within the tolerance, writing after each failure, so the
                // member failed first misses writes the last one has.
                for role in 0..tolerance {
                    array.fail_member(role);
                    let at = rng.random_range(0..data.len() / 4096 - 16) * 4096;
                    array.write_random(&mut data, at, 16 * 4096, &mut rng);
                }
                array.flush().unwrap();
                array.run_steps(1000);
                array.fail_member(tolerance);
                assert!(array.metadata().past_tolerance(), "{level}");
                let images = |held: &[SimMember]| -> Vec<(Vec<u8>, Vec<u8>)> {
                    held.iter()
                        .map(|d| {
                            let state = d.state();
                            (state.current.clone(), state.durable.clone())
                        })
                        .collect()
                };
                let before = images(&held);
                let event = array.metadata().superblock().event;
                let role = if given_back == "first" { 0 } else { tolerance };
                let refused = array.re_add(role).unwrap_err();
                assert!(
                    refused.contains("failed past its tolerance") && refused.contains("--force"),
                    "{level}: {refused}"
                );
                array.run_steps(1000);
                assert!(images(&held) == before, "{level}: a refused re-add wrote to a device");
                assert_eq!(array.metadata().superblock().event, event, "{level}");
                assert!(!array.is_rebuilding(), "{level}");
                let devices =
                    if rng.random_bool(0.5) { array.crash() } else { array.shutdown().unwrap() };
                for device in &devices {
                    device.state().gone = false;
                }
                let mut array = SimArray::assemble_forced(devices, o.clone())
                    .unwrap_or_else(|e| panic!("{level} {given_back}: forced start: {e}"));
                assert!(!array.metadata().past_tolerance(), "{level}: still failed");
                let what = format!("{level} {given_back} seed {seed}");
                let (good, refused) = array.reads_never_wrong(&data, &what);
                assert!(good > refused, "{what}: {refused} refused, {good} read");
                // Serving: writes are taken (reads of regions still untrusted may be refused).
                let piece: Vec<u8> = (0..64 << 10).map(|_| rng.random()).collect();
                array.write(0, &piece).unwrap();
                data[..piece.len()].copy_from_slice(&piece);
                array.reads_never_wrong(&data, &format!("{what}, after a write"));
            }
        }
    }
}

/// Starts cut short one after another (power flapping at boot): a member can end several
/// passes ahead of the rest, none of which is a stale copy, since no start that was cut
/// wrote anything (found by review: two cuts after a start's first superblock write failed
/// every other member of a RAID 5).
#[test]
fn starts_cut_short_one_after_another_leave_no_member_stale() {
    for (level, members) in LEVELS {
        eprintln!("two cut starts {level} x{members}");
        let mut rng = StdRng::seed_from_u64(members as u64 * 31);
        let mut o = options(1, level, members);
        o.member_bytes = 2 << 20;
        let mut array = SimArray::create(o.clone()).unwrap();
        let data = array.fill_random(&mut rng);
        let devices = array.shutdown().unwrap();
        // Superblock writes in one start: two passes, two copies each, every member.
        let per_start = 4 * members as u64;
        for first in (0..per_start).step_by(3) {
            for second in 0..per_start {
                let cut = images(&devices);
                start_cut_counting(&cut, &o, first, true, &mut rng);
                start_cut_counting(&cut, &o, second, true, &mut rng);
                let refs: Vec<&dyn MetaDevice> = cut.iter().map(|d| d as &dyn MetaDevice).collect();
                let prepared = prepare(&refs, &request(StaleMembers::LeaveOut))
                    .unwrap_or_else(|e| panic!("{level}: cuts after {first}, {second}: {e}"));
                let a = &prepared.assembled;
                assert!(
                    a.left_out.is_empty() && a.roles.iter().all(Option::is_some),
                    "{level}: cuts after {first} and {second} superblock writes: {:?}",
                    a.left_out
                );
            }
        }
        let cut = images(&devices);
        start_cut_counting(&cut, &o, 1, true, &mut rng);
        start_cut_counting(&cut, &o, 1, true, &mut rng);
        let mut array = SimArray::assemble(cut, o, DirtyDegraded::Refuse).unwrap();
        assert!(read_all(&mut array) == data, "{level}: data lost");
    }
}

/// A member failed in one session and re-added in a later one: its own superblock is
/// sessions old. A cut during the pass that gives it its role back must not leave the role
/// named for it while that old superblock calls it a stale copy (found by review): the
/// device joining is written first in its pass.
#[test]
fn a_cut_while_re_adding_a_member_never_makes_it_a_stale_copy() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid1, 2)] {
        eprintln!("re-add cut {level} x{members}");
        let mut rng = StdRng::seed_from_u64(members as u64 * 37);
        let o = options(1, level, members);
        let mut array = SimArray::create(o.clone()).unwrap();
        array.fill_random(&mut rng);
        let role = members - 1;
        array.fail_member(role);
        array.fill_random(&mut rng);
        let devices = array.shutdown().unwrap();
        devices[role].state().gone = false;
        for budget in 0..4 * members as u64 {
            let cut = images(&devices);
            let cell = Cell::new(u64::MAX);
            let wrapped: Vec<CutAfter> = cut
                .iter()
                .map(|device| CutAfter { device, budget: &cell, superblocks_only: true })
                .collect();
            let refs: Vec<&dyn MetaDevice> = wrapped.iter().map(|c| c as &dyn MetaDevice).collect();
            // A later session: the failed member's device is present, left out as failed.
            let prepared = prepare(&refs, &request(StaleMembers::LeaveOut)).unwrap();
            assert_eq!(prepared.assembled.failed_roles, vec![role]);
            let (mut metadata, _) =
                start(&refs, &prepared, o.shards, o.config, Kernel::best(), ArrayAccess::ReadWrite)
                    .unwrap();
            cell.set(budget);
            metadata.re_add(&refs, role).unwrap();
            for device in &cut {
                device.state().power_loss(&mut rng);
            }
            let refs: Vec<&dyn MetaDevice> = cut.iter().map(|d| d as &dyn MetaDevice).collect();
            let a = prepare(&refs, &request(StaleMembers::LeaveOut))
                .unwrap_or_else(|e| panic!("{level}: re-add cut after {budget}: {e}"))
                .assembled;
            assert!(
                !a.left_out.iter().any(|(_, why)| why.contains("stale copy")),
                "{level}: re-add cut after {budget}: {:?}",
                a.left_out
            );
            assert!(a.roles[role] == Some(role) || a.failed_roles == vec![role], "{level}: {a:?}");
        }
    }
}

/// Found by review: the write that fails the array (its parity reached the member failing
/// last only in part) is released, and its region's bit moves into the missed-write map.
/// Forced, that member comes back with the stripe's parity old; reconstructing a member
/// failed before it from that stripe returned data nobody wrote. The map's regions are now
/// untrusted too: such reads are refused, never wrong.
#[test]
fn the_write_that_failed_the_array_is_not_lost_track_of() {
    use flashraid_layout::{MemberIndex, Role, StripeIndex};
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        eprintln!("write failing the array {level} x{members}");
        let mut rng = StdRng::seed_from_u64(members as u64 * 13);
        let mut o = options(1, level, members);
        o.shards = 1;
        let mut array = SimArray::create(o.clone()).unwrap();
        let mut data = array.fill_random(&mut rng);
        let g = array.geometry();
        let tolerance = g.tolerance();
        for role in 0..tolerance {
            array.fail_member(role);
        }
        array.run_steps(1000);
        // A stripe where role 0 holds data, the last role to fail holds parity, and some
        // data chunk lives on a member still in service.
        let last = tolerance;
        let (stripe, index) = (0..g.stripes())
            .find_map(|s| {
                let s = StripeIndex(s);
                let fits = matches!(g.role(s, MemberIndex(0)), Role::Data { .. })
                    && matches!(g.role(s, MemberIndex(last as u16)), Role::Parity { .. });
                let i = (0..g.data_chunks()).find(|&i| g.data_member(s, i, 0).get() > last)?;
                fits.then_some((s.0, i))
            })
            .unwrap();
        let offset = stripe * g.stripe_data_bytes() + index as u64 * u64::from(g.chunk_bytes());
        let device = array.role_device(last).unwrap();
        device.state().writes_fail = true;
        let piece: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        assert!(array.write(offset, &piece).is_err(), "{level}: the failing write succeeded");
        device.state().writes_fail = false;
        array.run_steps(5000);
        let devices = array.shutdown().unwrap();
        for d in &devices {
            d.state().gone = false;
        }
        let mut array = SimArray::assemble_forced(devices, o.clone()).unwrap();
        // The failed write's block may read as either; every other block as written.
        let at = usize::try_from(offset).unwrap();
        let block_i = at / 4096;
        if let Ok(got) = array.read(offset, 4096) {
            assert!(
                got == data[at..at + 4096] || got == piece,
                "{level}: the failed write's block"
            );
        }
        data[at..at + 4096].copy_from_slice(&array.read(offset, 4096).unwrap_or(piece.clone()));
        let (good, _) = array.reads_never_wrong(&data, &format!("{level} (block {block_i})"));
        assert!(good > 0);
    }
}

/// Found by review: an old image of the member whose failure failed the array (taken before
/// the last session), put back, was brought back as holding the data as of the failure. A
/// member is brought back only with the superblock it had at its failure, within the
/// missed-write map's span.
#[test]
fn an_old_image_of_a_failed_member_is_not_brought_back() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        eprintln!("old image of a failed member {level} x{members}");
        let mut rng = StdRng::seed_from_u64(members as u64 * 7);
        let o = options(1, level, members);
        let mut array = SimArray::create(o.clone()).unwrap();
        array.fill_random(&mut rng);
        let tolerance = array.geometry().tolerance();
        let devices = array.shutdown().unwrap();
        let last = tolerance;
        let image = devices[last].image();
        let mut array = SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
        let new = array.fill_random(&mut rng);
        for role in 0..tolerance {
            array.fail_member(role);
        }
        array.run_steps(1000);
        array.fail_member(last);
        let mut devices = array.shutdown().unwrap();
        for d in &devices {
            d.state().gone = false;
        }
        devices[last] = image;
        match SimArray::assemble_forced(devices, o.clone()) {
            Ok(mut array) => {
                array.reads_never_wrong(&new, &format!("{level}"));
            }
            Err(e) => assert!(e.to_string().contains("cannot start"), "{level}: {e}"),
        }
    }
}

/// Found by review: a forced start cut short left the member it brought back named active
/// by the newest superblocks while its own, sessions old, called it a stale copy. Devices a
/// forced start brings in are written first in its first pass.
#[test]
fn a_cut_forced_start_never_makes_the_member_brought_back_stale() {
    let (level, members) = (Level::Raid5, 4);
    let mut rng = StdRng::seed_from_u64(5);
    let o = options(1, level, members);
    let mut array = SimArray::create(o.clone()).unwrap();
    array.fill_random(&mut rng);
    array.fail_member(2); // session 1: role 2 fails, within the tolerance
    array.run_steps(1000);
    let devices = array.shutdown().unwrap();
    devices[2].state().gone = false;
    // Session 2: role 2's device present but failed; role 3 fails: the array fails.
    let mut array = SimArray::assemble(devices, o.clone(), DirtyDegraded::Refuse).unwrap();
    array.fill_random(&mut rng);
    array.run_steps(1000);
    array.fail_member(3);
    let devices = array.shutdown().unwrap();
    for d in &devices {
        d.state().gone = false;
    }
    // Role 3's device is dead: not given.
    let devices: Vec<SimMember> = devices.into_iter().take(3).collect();
    let mut forced = request(StaleMembers::UseIfNeeded);
    forced.dirty_degraded = DirtyDegraded::Force;
    for budget in 0..4 * 3 {
        let cut = images(&devices);
        let cell = Cell::new(budget);
        let wrapped: Vec<CutAfter> = cut
            .iter()
            .map(|device| CutAfter { device, budget: &cell, superblocks_only: true })
            .collect();
        let refs: Vec<&dyn MetaDevice> = wrapped.iter().map(|c| c as &dyn MetaDevice).collect();
        let p = prepare(&refs, &forced).unwrap();
        assert_eq!(p.assembled.failed_used.len(), 1);
        start(&refs, &p, o.shards, o.config, Kernel::best(), ArrayAccess::ReadWrite).unwrap();
        for d in &cut {
            d.state().power_loss(&mut rng);
        }
        let refs: Vec<&dyn MetaDevice> = cut.iter().map(|d| d as &dyn MetaDevice).collect();
        let mut next = forced.clone();
        next.stale = StaleMembers::LeaveOut;
        if let Err(e) = prepare(&refs, &next) {
            assert!(!e.to_string().contains("stale copy"), "cut after {budget}: {e}");
        }
    }
}
