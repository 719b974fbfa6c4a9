//! The syscalls std does not wrap: block-device ioctls, `fallocate`, `eventfd` and `fcntl`.
//!
//! Owns: every `unsafe` call into libc made by this crate outside the ring itself, so the
//! rest of the device code is safe Rust.
//!
//! Invariants: each wrapper takes a `BorrowedFd` (open for the whole call by construction) or
//! a raw fd that only reaches a syscall, never memory; out-pointers point to live locals of the
//! exact type the kernel writes.
//!
//! Fault model: every failure comes back as the `io::Error` of `errno`; nothing here panics.
//! Offsets and lengths that do not fit the kernel's signed `off_t` come back as `EINVAL`
//! instead of wrapping to a negative value.
//!
//! Limits: Linux only; the ioctl numbers are the x86_64/aarch64 encodings (`_IO`/`_IOR` with
//! the generic layout), which is every architecture this project builds for.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
/// `_IO(0x12, 119)`: discard a byte range (`[start, len]` as two u64).
const BLKDISCARD: libc::Ioctl = 0x1277;
/// `_IO(0x12, 127)`: zero a byte range (`[start, len]` as two u64); falls back to writing zero
/// pages when the device has no write-zeroes command, so it always reads back zeroes.
const BLKZEROOUT: libc::Ioctl = 0x127f;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

fn to_off(value: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(value).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Take an exclusive `flock` on the open file without waiting: `Ok(false)` if another open
/// file description holds one (another process, or another open of the same file here).
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    try_lock(fd, libc::LOCK_EX)
}

/// `flock(LOCK_SH | LOCK_NB)`: as [`try_lock_exclusive`], but other shared holders may hold
/// it too (a read-only server holds its members this way: another read-only one may serve
/// them beside it, a writer may not).
pub(crate) fn try_lock_shared(fd: BorrowedFd<'_>) -> io::Result<bool> {
    try_lock(fd, libc::LOCK_SH)
}

fn try_lock(fd: BorrowedFd<'_>, how: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: flock takes a descriptor and flags and touches no memory of ours; `fd` is
        // open for the duration of the call.
        let rc = unsafe { libc::flock(fd.as_raw_fd(), how | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(error),
        }
    }
}

/// Release a `flock` held on the open file (a no-op if none is held).
pub(crate) fn unlock(fd: BorrowedFd<'_>) {
    // SAFETY: as in `try_lock_exclusive`. Failure leaves the lock to the file's last close.
    let _ = unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_UN) };
}

/// Size of a block device in bytes (`BLKGETSIZE64`).
pub(crate) fn block_size_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes exactly one u64 through the pointer, which points to a live,
    // writable local of that type; `fd` is open for the duration of the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut size_bytes as *mut u64) })?;
    Ok(size_bytes)
}

/// Logical block size of a block device in bytes (`BLKSSZGET`).
pub(crate) fn block_logical_block_bytes(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut block_bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes exactly one int through the pointer, which points to a live,
    // writable local of that type; `fd` is open for the duration of the call.
    check(unsafe {
        libc::ioctl(fd.as_raw_fd(), libc::BLKSSZGET, &mut block_bytes as *mut libc::c_int)
    })?;
    u32::try_from(block_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn block_range_ioctl(fd: RawFd, request: libc::Ioctl, offset_bytes: u64, len_bytes: u64) -> i32 {
    let range: [u64; 2] = [offset_bytes, len_bytes];
    // SAFETY: BLKDISCARD and BLKZEROOUT read two u64 (start, length) through the pointer, which
    // points to a live local array of exactly that shape. The fd is only passed to the kernel:
    // a stale number yields EBADF (or acts on another file the caller owns), never touches our
    // memory.
    let rc = unsafe { libc::ioctl(fd, request, range.as_ptr()) };
    if rc < 0 { -io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) } else { 0 }
}

/// `BLKDISCARD` on `fd`; returns 0 or `-errno` (the shape of a CQE result, because the ring
/// posts it as one).
pub(crate) fn block_discard(fd: RawFd, offset_bytes: u64, len_bytes: u64) -> i32 {
    block_range_ioctl(fd, BLKDISCARD, offset_bytes, len_bytes)
}

/// `BLKZEROOUT` on `fd`; returns 0 or `-errno`.
pub(crate) fn block_zero_out(fd: RawFd, offset_bytes: u64, len_bytes: u64) -> i32 {
    block_range_ioctl(fd, BLKZEROOUT, offset_bytes, len_bytes)
}

/// `fallocate(2)` with `mode` over `[offset_bytes, offset_bytes + len_bytes)`.
pub(crate) fn fallocate(
    fd: BorrowedFd<'_>,
    mode: libc::c_int,
    offset_bytes: u64,
    len_bytes: u64,
) -> io::Result<()> {
    let (offset, len) = (to_off(offset_bytes)?, to_off(len_bytes)?);
    loop {
        // SAFETY: fallocate takes no pointers; `fd` is open for the duration of the call.
        match check(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset, len) }) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// A new non-blocking, close-on-exec eventfd with a zero counter.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: eventfd just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A close-on-exec duplicate of `fd`, owned by the caller. Takes a raw fd because the ring's
/// public API does: a stale number yields EBADF, never touches memory.
pub(crate) fn dup_raw(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes no pointers; an invalid fd is reported as EBADF.
    let new_fd = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new_fd) })
}
