//! Metadata and assembly under bad input (found by a review, 2026-11-25; each test failed
//! before its fix): an old image of a failed member given to a forced start, a member that
//! shrank, a former member's device reused elsewhere, a checksummed bitmap block with the
//! wrong region count, and F2FS and bcache signatures.

use flashraid_control::{MetaDevice, prepare, start};
use flashraid_engine::ArrayAccess;
use flashraid_format::assembly::{AssemblyRequest, DirtyDegraded, StaleMembers, StrictDevices};
use flashraid_layout::{ArrayOffset, Level, MemberIndex};
use flashraid_parity::Kernel;
use flashraid_sim::{SimArray, SimMember, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn options(seed: u64, level: Level, members: usize) -> SimOptions {
    let mut o = SimOptions::new(seed, level, members);
    o.member_bytes = 3 << 20;
    o.shards = 1;
    o
}

fn request(stale: StaleMembers, dirty: DirtyDegraded) -> AssemblyRequest {
    AssemblyRequest {
        array_uuid: None,
        array_name: None,
        strict: StrictDevices::Strict,
        dirty_degraded: dirty,
        stale,
    }
}

/// A forced start of an array failed past its tolerance brings back the device of the member
/// that failed last. Given both that device and an old image of it (taken while the array
/// was stopped, before the session in which it later failed), the device is brought back,
/// not the image: the image did not see the start of the session the member failed in
/// (`failed_session_update_count`), and of two devices claiming one failed role the newer
/// superblock wins. (Before, the device named first was taken, and reads returned the
/// image's old chunks.) Given the image alone, the start is refused.
fn image_of_failed_member_case(give_current: bool) {
    let level = Level::Raid5;
    let o = options(3, level, 3);
    let mut rng = StdRng::seed_from_u64(99);
    let mut array = SimArray::create(o.clone()).unwrap();
    let mut data = array.fill_random(&mut rng);
    array.run_until_idle();
    let devices = array.shutdown().unwrap();
    // An image of member 0 taken while the array is stopped (a VM disk snapshot).
    let image0 = devices[0].image();
    image0.state().name = "image-of-sim0".into();
    // Session 2 starts without member 2 (degraded, clean: allowed) and writes.
    let (d0, d1, _d2) = (devices[0].clone(), devices[1].clone(), devices[2].clone());
    let mut array =
        SimArray::assemble(vec![d0.clone(), d1.clone()], o.clone(), DirtyDegraded::Refuse).unwrap();
    for _ in 0..16 {
        let at = rng.random_range(0..data.len() / 4096 - 16) * 4096;
        array.write_random(&mut data, at, 16 * 4096, &mut rng);
    }
    array.flush().unwrap();
    array.run_until_idle();
    array.run_steps(5000);
    // Member 0 fails: the array is failed past its tolerance.
    array.fail_member(0);
    assert!(array.metadata().past_tolerance());
    let devices = array.shutdown().unwrap();
    for d in &devices {
        d.state().gone = false;
    }
    // The operator starts it with --force, giving every device found, the image among them.
    let given = if give_current {
        vec![image0.clone(), d0.clone(), d1.clone()]
    } else {
        vec![image0.clone(), d1.clone()]
    };
    let all: Vec<&dyn MetaDevice> = given.iter().map(|d| d as &dyn MetaDevice).collect();
    let prepared = prepare(&all, &request(StaleMembers::UseIfNeeded, DirtyDegraded::Force));
    match &prepared {
        Ok(p) => eprintln!(
            "roles {:?}, failed_used {:?}, stale_used {:?}, left out {:?}",
            p.assembled.roles,
            p.assembled.failed_used,
            p.assembled.stale_used,
            p.assembled.left_out
        ),
        Err(e) => eprintln!("refused: {e}"),
    }
    if !give_current && prepared.is_err() {
        // Refused: the image alone is not the member as of its failure.
        return;
    }
    let image_used = prepared.as_ref().is_ok_and(|p| p.assembled.roles[0] == Some(0));
    let presented_as_failed_member =
        prepared.as_ref().is_ok_and(|p| p.assembled.failed_used.contains(&image0.name()));
    // And the data: start it forced and read every block. Role 0's own chunks (read as the
    // device holds them) and role 2's (reconstructed from roles 0 and 1) are counted apart.
    let mut array = SimArray::assemble_forced(given, o.clone()).unwrap();
    let g = array.geometry();
    let (mut wrong_own, mut wrong_reconstructed) = (0, 0);
    for (i, block) in data.chunks(4096).enumerate() {
        let offset = i as u64 * 4096;
        let at = g.locate(ArrayOffset(offset)).unwrap();
        let role = g.data_member(at.stripe, at.data_index, 0);
        if let Ok(got) = array.read(offset, 4096)
            && got != block
        {
            if role == MemberIndex(0) {
                wrong_own += 1;
            } else if role == MemberIndex(2) {
                wrong_reconstructed += 1;
            }
        }
    }
    eprintln!(
        "image used: {image_used}; wrong reads of role 0's chunks: {wrong_own}; wrong \
         reconstructed reads of role 2's chunks: {wrong_reconstructed}"
    );
    if give_current {
        assert!(
            !image_used && wrong_own == 0 && wrong_reconstructed == 0,
            "role 0 brought back from the old image although its current device sim0 was \
             given: {wrong_own} blocks of role 0 and {wrong_reconstructed} reconstructed blocks \
             of role 2 read wrong"
        );
    } else {
        // Forced use of a stale copy may return its old chunks, but the image must not be
        // passed off as the member as of its failure (only the write-intent bitmap
        // distrusted): reconstructions from it must be refused, not wrong.
        assert!(
            !presented_as_failed_member && wrong_reconstructed == 0,
            "an image from before the last session brought back as the member failed last \
             (failed_used: {presented_as_failed_member}): {wrong_reconstructed} reconstructed \
             reads of role 2 return wrong data instead of being refused"
        );
    }
}

#[test]
fn forced_start_brings_back_an_old_image_instead_of_the_failed_members_current_device() {
    image_of_failed_member_case(true);
}

/// The same image given alone (the current device lost): it is not brought back as "the
/// member failed last, its chunks as of its failure" (before, it was, with only the
/// write-intent bitmap distrusted, and reconstructed reads came back wrong).
#[test]
fn forced_start_treats_an_old_image_of_a_failed_member_as_current_as_of_its_failure() {
    image_of_failed_member_case(false);
}

/// A member that shrank (a truncated member file, a member copied onto a smaller disk) is
/// refused by `prepare` with a clear error, before anything is written. (Before, nothing
/// checked a device's size against the data area its superblock records, and `start`
/// panicked encoding its superblock.)
#[test]
fn a_member_that_shrank_is_refused_not_a_panic() {
    let o = options(5, Level::Raid1, 2);
    let array = SimArray::create(o.clone()).unwrap();
    let devices = array.shutdown().unwrap();
    {
        let mut s = devices[1].state();
        let keep = (2 << 20) as usize;
        s.current.truncate(keep);
        s.durable.truncate(keep);
    }
    let all: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let prepared = prepare(&all, &request(StaleMembers::LeaveOut, DirtyDegraded::Refuse))?;
        start(&all, &prepared, 1, o.config, Kernel::best(), ArrayAccess::ReadWrite).map(|_| ())
    }));
    match outcome {
        Ok(Ok(())) => panic!("started on a member smaller than its data area"),
        Ok(Err(e)) => eprintln!("refused: {e}"),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("start panicked on a shrunk member instead of refusing it: {msg}");
        }
    }
}

/// Plant bytes on a simulated device, durably (as another tool writing it would).
fn plant(device: &SimMember, offset: usize, bytes: &[u8]) {
    let mut s = device.state();
    s.current[offset..offset + bytes.len()].copy_from_slice(bytes);
    s.durable[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// The device of a failed member, pulled and formatted with ext4 elsewhere (its head, copy 0
/// included, overwritten; copy 1 at the end still names its old role), is given back to
/// `spare add`. It is not taken back: its first superblock copy is gone, so it is neither
/// re-added (before, the re-add rebuilt only the regions the missed-write map names, and the
/// filesystem's blocks elsewhere were served as the array's data) nor made a spare without
/// --force.
#[test]
fn a_failed_members_device_reformatted_elsewhere_is_not_taken_back_without_force() {
    let o = options(7, Level::Raid5, 3);
    let mut rng = StdRng::seed_from_u64(7);
    let mut array = SimArray::create(o.clone()).unwrap();
    let mut data = array.fill_random(&mut rng);
    array.run_until_idle();
    array.run_steps(5000);
    let dev1 = array.role_device(1).unwrap();
    array.fail_member(1);
    let at = 4096 * 8;
    array.write_random(&mut data, at, 4 * 4096, &mut rng);
    array.flush().unwrap();
    array.run_until_idle();
    array.run_steps(5000);
    // mkfs.ext4 elsewhere: its superblock at 1024 (magic 0xef53 at 1080) and its blocks
    // across the device; the last 4 KiB (flashraid copy 1) happen to be untouched.
    {
        let size = dev1.size_bytes() as usize;
        let junk = vec![0xeeu8; size - (1 << 20) - 4096];
        plant(&dev1, 1 << 20, &junk);
        plant(&dev1, 0, &[0u8; 2048]);
        plant(&dev1, 1080, &[0x53, 0xef]);
    }
    dev1.state().gone = false;
    let detected = flashraid_control::detect_signature(&dev1);
    eprintln!("signature seen by create: {detected:?}");
    assert!(detected.is_some(), "create would refuse this device");
    let index = array.devices.iter().position(|d| d.name() == dev1.name()).unwrap();
    match array.re_add(index) {
        Err(e) => eprintln!("refused: {e}"),
        Ok(role) => {
            array.run_until_rebuilt();
            array.run_until_idle();
            let mut wrong = 0;
            for (i, block) in data.chunks(4096).enumerate() {
                if array.read(i as u64 * 4096, 4096).map(|got| got != block).unwrap_or(false) {
                    wrong += 1;
                }
            }
            panic!(
                "a device holding an ext4 filesystem was taken back as role {} without \
                 --force; afterwards {wrong} blocks read the filesystem's bytes",
                role.get()
            );
        }
    }
}

/// A bitmap block that passes its checksum and names this array but records more regions
/// than the array has counts as a block that cannot be trusted (every region dirty).
/// (Before, it panicked assembly with an index out of bounds in `union_of_maps`.)
#[test]
fn a_checksummed_bitmap_block_with_too_many_regions_does_not_panic_assembly() {
    use flashraid_format::bitmap::{BitmapBlock, REGIONS_PER_BLOCK_MAX};
    let o = options(11, Level::Raid1, 2);
    let mut array = SimArray::create(o.clone()).unwrap();
    array.write(0, &[1u8; 4096]).unwrap();
    let devices = array.crash();
    let sb = flashraid_control::read_candidate(&devices[0]).copies[0].clone().unwrap();
    let mut block = BitmapBlock::new(
        sb.array_uuid,
        0,
        1,
        sb.bitmap_region_bytes,
        u32::try_from(REGIONS_PER_BLOCK_MAX).unwrap(),
    );
    block.set(u32::try_from(REGIONS_PER_BLOCK_MAX).unwrap() - 1, true);
    plant(&devices[0], sb.bitmap_offset_bytes as usize, &block.encode());
    let all: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        prepare(&all, &request(StaleMembers::LeaveOut, DirtyDegraded::Refuse))
            .map(|p| p.dirty_regions.len())
    }));
    match outcome {
        Ok(r) => eprintln!("prepared: {r:?}"),
        Err(_) => panic!("assembly panicked on a checksummed bitmap block of this array"),
    }
}

/// `create` refuses a device formatted with F2FS (the flash file system; superblock magic
/// 0xF2F52010 at 1 KiB) or holding a bcache cache or backing superblock (magic at 4 KiB +
/// 24), both common on flash devices, without --force. (Before, neither was recognised.)
#[test]
fn create_refuses_an_f2fs_or_bcache_device() {
    let mut missed = vec![];
    let bcache_magic: [u8; 16] = [
        0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d,
        0x81,
    ];
    let cases: [(&str, usize, Vec<u8>); 2] = [
        ("f2fs", 1024, 0xf2f5_2010u32.to_le_bytes().to_vec()),
        ("bcache", 4096 + 24, bcache_magic.to_vec()),
    ];
    for (what, offset, magic) in cases {
        let device = SimMember::new("dev", 8 << 20);
        plant(&device, offset, &magic);
        if flashraid_control::detect_signature(&device).is_none() {
            missed.push(what);
        }
    }
    assert!(
        missed.is_empty(),
        "not recognised, so create overwrites them without --force: {missed:?}"
    );
}
