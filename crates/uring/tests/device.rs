//! Device: open and create, synchronous O_DIRECT IO, refusals, discard and write-zeroes, on
//! tmpfs (/dev/shm), ext4 (/tmp) and a loop device.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{LoopDevice, SHM_DIR, TMP_DIR, TempPath, check_stamp, stamp};
use flashraid_iobuf::IoBuf;
use flashraid_uring::{Access, Capabilities, Device, DeviceError, DeviceKind};

const MIB: u64 = 1 << 20;

#[test]
fn create_file_reserves_the_size_and_refuses_an_existing_path() {
    for dir in [SHM_DIR, TMP_DIR] {
        let temp = TempPath::new(dir, "create");
        let device = Device::create_file(temp.path(), 3 * MIB).unwrap();
        assert_eq!(device.kind(), DeviceKind::RegularFile);
        assert_eq!(device.size_bytes(), 3 * MIB);
        assert_eq!(device.logical_block_bytes(), 512);
        assert_eq!(device.access(), Access::ReadWrite);
        assert_eq!(device.path(), temp.path());
        let metadata = std::fs::metadata(temp.path()).unwrap();
        assert_eq!(metadata.len(), 3 * MIB);
        assert!(metadata.blocks() * 512 >= 3 * MIB, "{dir}: space is reserved, not sparse");
        drop(device);

        let again = Device::create_file(temp.path(), MIB).unwrap_err();
        assert!(matches!(again, DeviceError::AlreadyExists { .. }), "{again}");
        assert!(again.to_string().contains(&temp.path().display().to_string()), "{again}");
        assert_eq!(std::fs::metadata(temp.path()).unwrap().len(), 3 * MIB, "left untouched");

        for access in [Access::ReadWrite, Access::ReadOnly] {
            let device = Device::open(temp.path(), access).unwrap();
            assert_eq!((device.kind(), device.size_bytes()), (DeviceKind::RegularFile, 3 * MIB));
            assert_eq!(device.access(), access);
        }
    }
}

#[test]
fn create_file_refuses_bad_sizes_and_leaves_nothing() {
    for size_bytes in [0, 1000] {
        let temp = TempPath::new(SHM_DIR, "bad-size");
        let error = Device::create_file(temp.path(), size_bytes).unwrap_err();
        assert!(matches!(error, DeviceError::InvalidSize { .. }), "{error}");
        assert!(!temp.path().exists());
    }
    let missing_dir = Path::new("/dev/shm/flashraid-no-such-dir/member");
    let error = Device::create_file(missing_dir, MIB).unwrap_err();
    assert!(matches!(error, DeviceError::Create { .. }), "{error}");
    assert!(error.to_string().contains("/dev/shm/flashraid-no-such-dir/member"), "{error}");
}

#[test]
fn read_write_round_trip_with_o_direct_on_tmpfs_and_ext4() {
    for dir in [SHM_DIR, TMP_DIR] {
        let temp = TempPath::new(dir, "round-trip");
        let device = Device::create_file(temp.path(), 2 * MIB).unwrap();
        let mut written = IoBuf::new(64 * 1024);
        for (index, block) in written.as_mut_slice().chunks_mut(4096).enumerate() {
            stamp(block, index as u64, 7);
        }
        device.write_at(written.as_slice(), MIB - 4096).unwrap();
        device.sync().unwrap();

        let reopened = Device::open(temp.path(), Access::ReadOnly).unwrap();
        let mut read = IoBuf::new(64 * 1024);
        reopened.read_at(read.as_mut_slice(), MIB - 4096).unwrap();
        assert_eq!(read.as_slice(), written.as_slice(), "{dir}");
        // A 512-byte aligned sub-range: the file's logical block is 512 bytes.
        let mut small = IoBuf::new(4096);
        reopened.read_at(&mut small.as_mut_slice()[..512], MIB - 4096 + 512).unwrap();
        assert_eq!(&small.as_slice()[..512], &written.as_slice()[512..1024]);
        for (index, block) in read.as_slice().chunks(4096).enumerate() {
            check_stamp(block, index as u64, 7).unwrap();
        }
    }
}

#[test]
fn misaligned_and_out_of_range_requests_are_refused_without_io() {
    let temp = TempPath::new(TMP_DIR, "misaligned");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut buf = IoBuf::new(8192);
    let path_text = temp.path().display().to_string();

    let off_by_512 = &mut buf.as_mut_slice()[512..4608];
    let error = device.read_at(off_by_512, 0).unwrap_err();
    assert!(matches!(error, DeviceError::Misaligned { op: "read", .. }), "{error}");
    assert!(error.to_string().contains(&path_text) && error.to_string().contains("buffer"));

    let error = device.write_at(&buf.as_slice()[..4096], 100).unwrap_err();
    assert!(matches!(error, DeviceError::Misaligned { op: "write", offset_bytes: 100, .. }));
    assert!(error.to_string().contains("offset"), "{error}");

    let error = device.read_at(&mut buf.as_mut_slice()[..1000], 0).unwrap_err();
    assert!(matches!(error, DeviceError::Misaligned { len_bytes: 1000, .. }), "{error}");

    let error = device.discard(512, 100).unwrap_err();
    assert!(matches!(error, DeviceError::Misaligned { op: "discard", .. }), "{error}");

    let error = device.write_at(buf.as_slice(), MIB - 4096).unwrap_err();
    assert!(matches!(error, DeviceError::OutOfRange { size_bytes: MIB, .. }), "{error}");
    assert_eq!(std::fs::metadata(temp.path()).unwrap().len(), MIB, "a write never grows a file");
    let error = device.write_zeroes(u64::MAX - 511, 512).unwrap_err();
    assert!(matches!(error, DeviceError::OutOfRange { .. }), "{error}");

    let read_only = Device::open(temp.path(), Access::ReadOnly).unwrap();
    let error = read_only.write_at(&buf.as_slice()[..4096], 0).unwrap_err();
    assert!(matches!(error, DeviceError::ReadOnly { op: "write", .. }), "{error}");
    assert_eq!(
        read_only.capabilities(),
        Capabilities { discard: false, discard_zeroes: false, write_zeroes: false }
    );
    assert!(matches!(read_only.discard(0, 4096), Err(DeviceError::ReadOnly { .. })));

    // Zero-length IO is a no-op, not an error.
    device.read_at(&mut buf.as_mut_slice()[..0], 0).unwrap();
    device.discard(0, 0).unwrap();
}

#[test]
fn opening_a_missing_path_or_a_directory_names_the_path() {
    let missing = Path::new("/dev/shm/flashraid-uring-definitely-missing");
    let error = Device::open(missing, Access::ReadWrite).unwrap_err();
    assert!(matches!(error, DeviceError::Open { .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains("/dev/shm/flashraid-uring-definitely-missing"), "{text}");
    assert!(text.contains("No such file"), "{text}");

    let error = Device::open(Path::new(SHM_DIR), Access::ReadOnly).unwrap_err();
    assert!(matches!(error, DeviceError::UnsupportedKind { found: "directory", .. }), "{error}");
    assert!(error.to_string().contains(SHM_DIR), "{error}");
}

/// Write stamps over the whole device, apply `clear` to blocks 2..5, then check that those
/// read back zeroes and every other block kept its stamp.
fn check_range_reads_zeroes(device: &Device, clear: impl Fn(&Device, u64, u64)) {
    let blocks = 8;
    let mut buf = IoBuf::new(blocks * 4096);
    for (index, block) in buf.as_mut_slice().chunks_mut(4096).enumerate() {
        stamp(block, index as u64, 1);
    }
    device.write_at(buf.as_slice(), 0).unwrap();
    clear(device, 2 * 4096, 3 * 4096);
    buf.as_mut_slice().fill(0xee);
    device.read_at(buf.as_mut_slice(), 0).unwrap();
    for (index, block) in buf.as_slice().chunks(4096).enumerate() {
        if (2..5).contains(&index) {
            assert!(
                block.iter().all(|&byte| byte == 0),
                "{}: block {index}",
                device.path().display()
            );
        } else {
            check_stamp(block, index as u64, 1).unwrap();
        }
    }
}

#[test]
fn discard_and_write_zeroes_on_files_read_back_zeroes() {
    let ext4 = TempPath::new(TMP_DIR, "zeroes");
    let device = Device::create_file(ext4.path(), MIB).unwrap();
    let all = Capabilities { discard: true, discard_zeroes: true, write_zeroes: true };
    assert_eq!(device.capabilities(), all, "ext4 punches holes and zeroes ranges");
    check_range_reads_zeroes(&device, |device, offset, len| device.discard(offset, len).unwrap());
    check_range_reads_zeroes(&device, |device, offset, len| {
        device.write_zeroes(offset, len).unwrap()
    });
    assert_eq!(std::fs::metadata(ext4.path()).unwrap().len(), MIB, "size kept");

    let tmpfs = TempPath::new(SHM_DIR, "zeroes");
    let device = Device::create_file(tmpfs.path(), MIB).unwrap();
    let punch_only = Capabilities { discard: true, discard_zeroes: true, write_zeroes: false };
    assert_eq!(device.capabilities(), punch_only, "tmpfs has no zero-range");
    check_range_reads_zeroes(&device, |device, offset, len| device.discard(offset, len).unwrap());
    let error = device.write_zeroes(0, 4096).unwrap_err();
    assert!(matches!(error, DeviceError::Unsupported { op: "write zeroes", .. }), "{error}");
}

#[test]
fn loop_device_reports_kind_size_block_size_and_is_exclusive() {
    let Some(loop_device) = LoopDevice::attach(8 * MIB, 4096, "device") else { return };
    let path = loop_device.path();
    let device = Device::open(path, Access::ReadWrite).unwrap();
    assert_eq!(device.kind(), DeviceKind::BlockDevice);
    assert_eq!(device.size_bytes(), 8 * MIB);
    assert_eq!(device.logical_block_bytes(), 4096, "BLKSSZGET, not the file default");
    let capabilities = device.capabilities();
    assert!(capabilities.discard, "a loop device over an ext4 file discards");
    assert!(!capabilities.discard_zeroes, "block devices never promise zeroes after discard");
    assert!(capabilities.write_zeroes);

    // O_EXCL: a second read-write open fails and names the path; read-only opens still work.
    let error = Device::open(path, Access::ReadWrite).unwrap_err();
    assert!(matches!(error, DeviceError::Open { .. }), "{error}");
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    let read_only = Device::open(path, Access::ReadOnly).unwrap();
    assert_eq!(read_only.size_bytes(), 8 * MIB);

    // 512-byte granularity is refused on a 4096-byte-sector device.
    let mut buf = IoBuf::new(4096);
    let error = device.read_at(buf.as_mut_slice(), 512).unwrap_err();
    assert!(matches!(error, DeviceError::Misaligned { logical_block_bytes: 4096, .. }), "{error}");

    check_range_reads_zeroes(&device, |device, offset, len| {
        device.write_zeroes(offset, len).unwrap()
    });
    device.discard(0, MIB).unwrap();
    device.sync().unwrap();
    let error = device.read_at(buf.as_mut_slice(), 8 * MIB).unwrap_err();
    assert!(matches!(error, DeviceError::OutOfRange { .. }), "{error}");
}

/// The open flags as the kernel sees them (`/proc/self/fdinfo`), octal.
fn open_flags(device: &Device) -> u32 {
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", device.raw_fd())).unwrap();
    let line = fdinfo.lines().find(|line| line.starts_with("flags:")).unwrap();
    u32::from_str_radix(line.trim_start_matches("flags:").trim(), 8).unwrap()
}

#[test]
fn descriptors_are_direct_and_close_on_exec() {
    let temp = TempPath::new(TMP_DIR, "flags");
    let created = Device::create_file(temp.path(), MIB).unwrap();
    let opened = Device::open(temp.path(), Access::ReadOnly).unwrap();
    for device in [&created, &opened] {
        let flags = open_flags(device);
        assert_ne!(flags & libc::O_DIRECT as u32, 0, "O_DIRECT in {flags:o}");
        assert_ne!(flags & libc::O_CLOEXEC as u32, 0, "O_CLOEXEC in {flags:o}");
    }
    assert_eq!(open_flags(&opened) & libc::O_ACCMODE as u32, libc::O_RDONLY as u32);
    assert_eq!(open_flags(&created) & libc::O_ACCMODE as u32, libc::O_RDWR as u32);
}

/// Found by a misuse test: a second `serve` (or `create --force`) wrote members a running
/// server held, and one file named twice (a symlink, a hard link, `./m` beside `m`) became two
/// members of one array. A regular file open read-write is locked: a second read-write open,
/// by any name, is refused as in use; read-only opens still see it; closing frees it.
#[test]
fn a_file_open_for_writing_is_refused_a_second_writer_by_any_name() {
    let temp = TempPath::new(SHM_DIR, "lock");
    let first = Device::create_file(temp.path(), MIB).unwrap();
    let again = Device::open(temp.path(), Access::ReadWrite).unwrap_err();
    assert!(matches!(&again, DeviceError::InUse { .. }), "{again}");
    assert!(again.to_string().contains("--force does not override"), "{again}");
    let link = TempPath::new(SHM_DIR, "lock-link");
    std::os::unix::fs::symlink(temp.path(), link.path()).unwrap();
    assert!(matches!(Device::open(link.path(), Access::ReadWrite), Err(DeviceError::InUse { .. })));
    let hard = TempPath::new(SHM_DIR, "lock-hard");
    std::fs::hard_link(temp.path(), hard.path()).unwrap();
    assert!(matches!(Device::open(hard.path(), Access::ReadWrite), Err(DeviceError::InUse { .. })));
    // Another process's writer is refused the same way (flock is per open file, and a child
    // shell's `flock -n` sees ours).
    let status = std::process::Command::new("flock")
        .args(["-n", "-x", temp.path().to_str().unwrap(), "true"])
        .status();
    if let Ok(status) = status {
        assert!(!status.success(), "another process took the lock we hold");
    }
    // Found by review: a clone (a replace's copier holds one) shares the lock and, dropped,
    // does not release it.
    drop(first.try_clone().unwrap());
    assert!(matches!(Device::open(temp.path(), Access::ReadWrite), Err(DeviceError::InUse { .. })));
    let reader = Device::open(temp.path(), Access::ReadOnly).unwrap();
    drop(first);
    let second = Device::open(link.path(), Access::ReadWrite).unwrap();
    drop((second, reader));
    // Found by the end-to-end test: a server killed with SIGKILL keeps its lock until the
    // kernel has torn its rings down, a moment later. A lock let go within the wait is taken.
    let holder = Device::open(temp.path(), Access::ReadWrite).unwrap();
    let started = std::time::Instant::now();
    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(holder);
    });
    let after = Device::open(temp.path(), Access::ReadWrite).unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    assert!(started.elapsed() < flashraid_uring::LOCK_WAIT);
    letting_go.join().unwrap();
    drop(after);
}
