//! One io_uring instance driven by one thread: queue operations, submit, reap completions.
//!
//! Owns: the ring, duplicates of the descriptors registered with it (fixed files), the
//! 8-byte buffer of the armed [`Waker`] read, and a bounded queue of completions this module
//! produced itself (block-device discard, see below).
//!
//! Invariants:
//! - Every operation pushed is reported by [`Ring::reap`] exactly once, with the caller's
//!   `user_data` and the raw result (bytes transferred, or `-errno`).
//! - At most [`Ring::in_flight_max`] operations (the completion queue's size) are in flight
//!   counting the armed waker read, so the completion queue can never overflow. Reaching the
//!   limit, or a full submission queue, is [`RingError::Full`]: backpressure, never growth.
//! - One completion slot and one submission entry are kept for the waker read whether it
//!   is armed or not, so [`Ring::arm_waker`] never finds the ring full: operations alone
//!   fill at most `in_flight_max - 1` slots and one entry less than the submission queue. (Without the reserve, a burst of IO that
//!   filled the submission queue as the waker's completion was reaped left the waker
//!   unarmed for good, and its owner slept through every wake from then on.)
//! - `user_data == USER_DATA_RESERVED` is never accepted from the caller; it tags the waker
//!   read, so the ring can tell its own completion apart without trusting the caller's
//!   numbering.
//! - The memory an operation points to is the caller's, lent for the operation's lifetime
//!   (the contract of [`Ring::push`]); dropping the ring waits until every operation in flight
//!   has completed, so the kernel never writes to memory after the ring is gone.
//! - No allocation on the push/submit/reap path: the completion queue for synthetic
//!   completions is allocated once at its maximum size.
//! - Every `Read`/`Write`/`Discard`/`WriteZeroes` is checked before it is queued: offset,
//!   length and buffer address are multiples of the file's logical block (`BLKSSZGET` for a
//!   block device, 512 otherwise). The kernel does not always check (tmpfs and reads of
//!   holes on ext4 accept anything), and code tested there must not break on real devices.
//!
//! Fault model: device errors arrive as negative results in completions; they are data, not
//! `Err`s. `Err` is for misuse the caller can fix (an unknown file index, a misaligned op, a
//! reserved `user_data`) and for the ring itself failing (setup, registration,
//! `io_uring_enter`).
//! An interrupted or timed-out wait is not an error: `submit` returns and the caller reaps
//! whatever is ready.
//!
//! Short transfers: a `Read`/`Write` completion whose result is non-negative but smaller than
//! `len_bytes` is a short transfer (reading at or past the end of a device returns 0). The
//! ring does not resubmit; the caller treats it as an error or resubmits the rest.
//! [`crate::check_transfer`] classifies a result.
//!
//! Ordering: like io_uring itself, operations pushed together run in any order; a `Flush`
//! covers only writes that completed before it was pushed.
//!
//! Block devices and discard: before Linux 6.12's `uring_cmd` discard, io_uring has no
//! portable discard for block devices, so `Op::Discard` on a registered block device runs
//! `BLKDISCARD` synchronously inside [`Ring::push`] and queues its result for the next
//! [`Ring::reap`]. It therefore blocks the calling thread for as long as the device takes;
//! keep those ranges modest. `Op::WriteZeroes` on a block device stays asynchronous:
//! `IORING_OP_FALLOCATE` with `ZERO_RANGE` runs the same kernel routine as `BLKZEROOUT`
//! (zero-out without unmapping, with the kernel's zero-page fallback) on an io_uring worker.
//!
//! Threads: a ring is `Send` but not `Sync`: one thread at a time drives it. Move it only
//! with nothing in flight, because the kernel cancels requests still owned by a thread that
//! exits (they would complete with `-ECANCELED`).
//!
//! Limits: [`RING_ENTRIES_MAX`] submission entries, [`REGISTERED_FILES_MAX`] files and
//! [`REGISTERED_BUFFERS_MAX`] buffers, each registered once; one armed waker at a time.
//! Dropping a ring blocks until in-flight IO completes; a device that never completes an IO
//! makes the drop hang (the only alternative is letting the kernel write freed memory).

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use io_uring::{IoUring, opcode, squeue, types};

use crate::Waker;
use crate::device::FILE_LOGICAL_BLOCK_BYTES;
use crate::sys;

/// Largest submission queue a ring may have. The completion queue is twice as large.
pub const RING_ENTRIES_MAX: u32 = 4096;
/// Most files one ring may register.
pub const REGISTERED_FILES_MAX: usize = 1024;
/// Most buffers one ring may register.
pub const REGISTERED_BUFFERS_MAX: usize = 1024;
/// Most buffers one `Readv`/`Writev` may name (the kernel's `UIO_MAXIOV` is 1024).
pub const IOVECS_MAX: u32 = 1024;
/// The one `user_data` value callers may not use: it tags the ring's own waker read.
pub const USER_DATA_RESERVED: u64 = u64::MAX;

/// Bytes an eventfd read transfers.
const WAKER_READ_BYTES: u32 = 8;
/// How long each wait of the drop-time drain lasts before it checks again.
const DROP_WAIT_SLICE: Duration = Duration::from_millis(100);
/// Largest offset + length the kernel accepts (`loff_t`); io_uring also reads an offset of
/// `u64::MAX` as "the current file position", which must never happen by accident.
const OFFSET_END_MAX_BYTES: u64 = i64::MAX as u64;

/// One operation on a registered file (`file` is the index into
/// [`Ring::register_files`]'s list). Pointers are lent to the kernel under
/// [`Ring::push`]'s contract.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Read `len_bytes` at `offset_bytes` into `ptr`.
    Read { file: u32, offset_bytes: u64, ptr: *mut u8, len_bytes: u32 },
    /// Write `len_bytes` from `ptr` at `offset_bytes`. `fua`: the write is durable when it
    /// completes (`RWF_DSYNC`).
    Write { file: u32, offset_bytes: u64, ptr: *const u8, len_bytes: u32, fua: bool },
    /// `Read` into a buffer registered with [`Ring::register_buffers`] as `buf_index`;
    /// `ptr..ptr + len_bytes` must lie inside that buffer (the kernel answers `-EFAULT`
    /// otherwise).
    ReadFixed { file: u32, offset_bytes: u64, ptr: *mut u8, len_bytes: u32, buf_index: u16 },
    /// `Write` from a registered buffer; see [`Op::ReadFixed`].
    WriteFixed {
        file: u32,
        offset_bytes: u64,
        ptr: *const u8,
        len_bytes: u32,
        buf_index: u16,
        fua: bool,
    },
    /// Read consecutive bytes at `offset_bytes` into the `count` buffers `iovecs` names, in
    /// order (`preadv`). Every buffer's address and length are aligned as for `Read`; at most
    /// [`IOVECS_MAX`] entries.
    Readv { file: u32, offset_bytes: u64, iovecs: *const libc::iovec, count: u32 },
    /// Write the `count` buffers `iovecs` names to consecutive bytes at `offset_bytes`
    /// (`pwritev`); see [`Op::Readv`]. Never durable on completion: no FUA form.
    Writev { file: u32, offset_bytes: u64, iovecs: *const libc::iovec, count: u32 },
    /// `fdatasync`: writes completed before this was pushed are durable when it completes.
    Flush { file: u32 },
    /// Files: punch a hole (reads back zeroes). Block devices: `BLKDISCARD`, run
    /// synchronously inside `push` (see the module docs); contents afterwards unspecified.
    Discard { file: u32, offset_bytes: u64, len_bytes: u64 },
    /// The range reads back zeroes. Files: zero-range (not supported by tmpfs: the result is
    /// `-EOPNOTSUPP`). Block devices: fallocate zero-range, the same zero-out as `BLKZEROOUT`.
    WriteZeroes { file: u32, offset_bytes: u64, len_bytes: u64 },
}

/// Why the ring refused or failed. Device errors are not here: they are negative results
/// in completions.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("ring entries {entries}: must be a power of two from 1 to {RING_ENTRIES_MAX}")]
    InvalidEntries { entries: u32 },
    #[error("io_uring setup with {entries} entries failed: {source}")]
    Setup { entries: u32, source: io::Error },
    #[error("the kernel's io_uring lacks {feature}")]
    Unsupported { feature: &'static str },
    /// Backpressure: nothing was queued; submit and reap, then push again.
    #[error(
        "the submission queue is full or the in-flight maximum is reached: submit, reap, retry"
    )]
    Full,
    #[error("user_data {USER_DATA_RESERVED:#x} is reserved for the ring's waker read")]
    ReservedUserData,
    #[error("files are already registered on this ring")]
    FilesAlreadyRegistered,
    #[error("{count} files: must be 1 to {REGISTERED_FILES_MAX}")]
    FileCount { count: usize },
    #[error("file {index} (fd {fd}) cannot be registered: {source}")]
    FileNotUsable { index: usize, fd: RawFd, source: io::Error },
    #[error("registering {count} files with io_uring failed: {source}")]
    RegisterFiles { count: usize, source: io::Error },
    #[error("file index {file} is not registered ({registered} files registered)")]
    UnknownFile { file: u32, registered: usize },
    #[error("buffers are already registered on this ring")]
    BuffersAlreadyRegistered,
    #[error("{count} buffers: must be 1 to {REGISTERED_BUFFERS_MAX}")]
    BufferCount { count: usize },
    #[error("registering {count} buffers with io_uring failed: {source}")]
    RegisterBuffers { count: usize, source: io::Error },
    #[error("buffer index {buf_index} is not registered ({registered} buffers registered)")]
    UnknownBuffer { buf_index: u16, registered: usize },
    #[error("a vectored op names {count} buffers: must be 1 to {IOVECS_MAX}")]
    IovecCount { count: u32 },
    #[error(
        "file {file}: offset {offset_bytes}, length {len_bytes} and buffer address {address:#x} \
         must be multiples of the logical block ({logical_block_bytes} bytes)"
    )]
    Misaligned {
        file: u32,
        offset_bytes: u64,
        len_bytes: u64,
        address: usize,
        logical_block_bytes: u32,
    },
    #[error("offset {offset_bytes} + length {len_bytes} is past the largest file offset")]
    OffsetTooLarge { offset_bytes: u64, len_bytes: u64 },
    #[error("a waker read is already armed on this ring")]
    WakerArmed,
    #[error("creating a waker (eventfd) failed: {source}")]
    Waker { source: io::Error },
    #[error("io_uring_enter failed: {source}")]
    Submit { source: io::Error },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    BlockDevice,
    Other,
}

/// A registered file: our own duplicate of the caller's descriptor, so the fd number the
/// synchronous discard uses cannot be closed and reused under us.
#[derive(Debug)]
struct RegisteredFile {
    file: File,
    kind: FileKind,
    /// Direct IO granularity: `BLKSSZGET` for block devices, 512 for anything else.
    logical_block_bytes: u32,
}

impl RegisteredFile {
    /// Duplicate `fd` (registration slot `index`, for messages) and learn how it takes
    /// direct IO.
    fn open(index: usize, fd: RawFd) -> Result<Self, RingError> {
        let not_usable = |source| RingError::FileNotUsable { index, fd, source };
        let file = File::from(sys::dup_raw(fd).map_err(not_usable)?);
        let is_block = file.metadata().map_err(not_usable)?.file_type().is_block_device();
        let (kind, logical_block_bytes) = if is_block {
            let block_bytes = sys::block_logical_block_bytes(file.as_fd()).map_err(not_usable)?;
            if !block_bytes.is_power_of_two() {
                let odd = io::Error::other(format!("logical block of {block_bytes} bytes"));
                return Err(not_usable(odd));
            }
            (FileKind::BlockDevice, block_bytes)
        } else {
            (FileKind::Other, FILE_LOGICAL_BLOCK_BYTES)
        };
        Ok(Self { file, kind, logical_block_bytes })
    }
}

#[derive(Debug)]
struct ArmedWaker {
    /// Keeps the eventfd open while the kernel reads it.
    waker: Waker,
    user_data: u64,
}

/// One io_uring instance, owned by one thread. Files are registered once (fixed files); IO
/// buffers are owned by the caller and lent for the duration of each operation.
pub struct Ring {
    ring: IoUring,
    files: Vec<RegisteredFile>,
    files_registered: bool,
    buffers_registered: usize,
    /// Pushed with `push` and not yet reaped (the waker read is not counted).
    ops_in_flight: usize,
    in_flight_max: usize,
    /// Completions produced inside `push` (block-device discard), reaped before the kernel's.
    /// Capacity `in_flight_max`, never exceeded because each one is also in flight.
    local_completions: VecDeque<(u64, i32)>,
    waker: Option<ArmedWaker>,
    /// Target of the waker read. Heap, so its address is stable while the ring moves; an
    /// `UnsafeCell` because the kernel writes it behind our back.
    waker_buffer: Box<UnsafeCell<u64>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("sq_entries", &self.ring.params().sq_entries())
            .field("files", &self.files)
            .field("buffers_registered", &self.buffers_registered)
            .field("ops_in_flight", &self.ops_in_flight)
            .field("in_flight_max", &self.in_flight_max)
            .field("waker_armed", &self.waker.is_some())
            .finish()
    }
}

impl Ring {
    /// A ring with `entries` submission entries (a power of two, at most
    /// [`RING_ENTRIES_MAX`]) and twice as many completion entries.
    pub fn new(entries: u32) -> Result<Ring, RingError> {
        if entries == 0 || entries > RING_ENTRIES_MAX || !entries.is_power_of_two() {
            return Err(RingError::InvalidEntries { entries });
        }
        // SUBMIT_ALL (5.18) keeps submitting a batch past an entry that fails at submission
        // time; older kernels refuse the flag, and then the default behaviour is fine.
        let ring = IoUring::builder()
            .setup_submit_all()
            .build(entries)
            .or_else(|_| IoUring::new(entries))
            .map_err(|source| RingError::Setup { entries, source })?;
        if !ring.params().is_feature_ext_arg() {
            return Err(RingError::Unsupported { feature: "IORING_FEAT_EXT_ARG (Linux 5.11)" });
        }
        let cq_entries = ring.params().cq_entries();
        let in_flight_max = usize::try_from(cq_entries).expect("u32 fits in usize");
        Ok(Ring {
            ring,
            files: Vec::new(),
            files_registered: false,
            buffers_registered: 0,
            ops_in_flight: 0,
            in_flight_max,
            local_completions: VecDeque::with_capacity(in_flight_max),
            waker: None,
            waker_buffer: Box::new(UnsafeCell::new(0)),
        })
    }

    /// The ring's own descriptor: `poll(2)` reports it readable while completions wait in
    /// the kernel's queue (this ring uses no `DEFER_TASKRUN`, so they get there unasked).
    pub fn raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Completions already taken from the kernel's queue and not yet handed out: a sleep
    /// on [`Ring::raw_fd`] would not see them.
    pub fn has_local_completions(&self) -> bool {
        !self.local_completions.is_empty()
    }

    /// Register `fds` as fixed files: index `i` in every [`Op`] is `fds[i]`. The ring keeps
    /// its own duplicates, so the caller may close its descriptors afterwards (a block device
    /// opened with `O_EXCL` then stays claimed until the ring is dropped). May be called once.
    pub fn register_files(&mut self, fds: &[RawFd]) -> Result<(), RingError> {
        if self.files_registered {
            return Err(RingError::FilesAlreadyRegistered);
        }
        if fds.is_empty() || fds.len() > REGISTERED_FILES_MAX {
            return Err(RingError::FileCount { count: fds.len() });
        }
        let mut files = Vec::with_capacity(fds.len());
        for (index, &fd) in fds.iter().enumerate() {
            files.push(RegisteredFile::open(index, fd)?);
        }
        let raw: Vec<RawFd> = files.iter().map(|registered| registered.file.as_raw_fd()).collect();
        let count = raw.len();
        self.ring
            .submitter()
            .register_files(&raw)
            .map_err(|source| RingError::RegisterFiles { count, source })?;
        self.files = files;
        self.files_registered = true;
        Ok(())
    }

    /// Replace registered file `index` with `fd` (a device added while the ring runs: a hot
    /// spare). IO already submitted on the old file completes on it: the kernel holds its
    /// own reference until then.
    pub fn update_file(&mut self, index: usize, fd: RawFd) -> Result<(), RingError> {
        if index >= self.files.len() {
            return Err(RingError::UnknownFile {
                file: u32::try_from(index).unwrap_or(u32::MAX),
                registered: self.files.len(),
            });
        }
        let registered = RegisteredFile::open(index, fd)?;
        let offset = u32::try_from(index).expect("below REGISTERED_FILES_MAX");
        self.ring
            .submitter()
            .register_files_update(offset, &[registered.file.as_raw_fd()])
            .map_err(|source| RingError::RegisterFiles { count: 1, source })?;
        self.files[index] = registered;
        Ok(())
    }

    /// Register buffers for [`Op::ReadFixed`] and [`Op::WriteFixed`]: index `i` is `bufs[i]`
    /// as (start, length in bytes). The kernel pins their pages once instead of per IO.
    /// May be called once.
    ///
    /// # Safety
    /// Every buffer must stay allocated and mapped at the same address until the ring is
    /// dropped: the kernel pins the pages at registration, and a fixed op reaches those pages,
    /// not whatever the addresses map to later. Between operations the caller may use the
    /// memory freely; during one, [`Ring::push`]'s contract applies.
    pub unsafe fn register_buffers(&mut self, bufs: &[(*mut u8, usize)]) -> Result<(), RingError> {
        if self.buffers_registered > 0 {
            return Err(RingError::BuffersAlreadyRegistered);
        }
        if bufs.is_empty() || bufs.len() > REGISTERED_BUFFERS_MAX {
            return Err(RingError::BufferCount { count: bufs.len() });
        }
        let iovecs: Vec<libc::iovec> = bufs
            .iter()
            .map(|&(start, len_bytes)| libc::iovec { iov_base: start.cast(), iov_len: len_bytes })
            .collect();
        let count = iovecs.len();
        // SAFETY: the caller guarantees every buffer outlives the ring (this function's
        // contract); the kernel copies the iovec array during the call.
        unsafe { self.ring.submitter().register_buffers(&iovecs) }
            .map_err(|source| RingError::RegisterBuffers { count, source })?;
        self.buffers_registered = count;
        Ok(())
    }

    /// Queue an operation. Nothing is sent to the kernel until [`Ring::submit`], except a
    /// block-device `Discard`, which runs here (see the module docs). Returns
    /// [`RingError::Full`] when the submission queue is full or [`Ring::in_flight_max`]
    /// operations are in flight: submit and reap, then retry; nothing was queued.
    ///
    /// # Safety
    /// Any memory the op points to (`ptr .. ptr + len_bytes`; for `Readv`/`Writev` the iovec
    /// array and every buffer it names) must stay valid, and must not be accessed by the
    /// caller (read or written, for reads; written, for writes and for the iovec array),
    /// until the completion carrying `user_data` has been reaped, or the ring has been
    /// dropped.
    pub unsafe fn push(&mut self, op: Op, user_data: u64) -> Result<(), RingError> {
        if user_data == USER_DATA_RESERVED {
            return Err(RingError::ReservedUserData);
        }
        self.check_capacity(false)?;
        let Some(entry) = self.prepare(op, user_data)? else {
            return Ok(());
        };
        // SAFETY: the entry points only at memory the caller lent under this function's
        // contract (valid and untouched until its completion is reaped or the ring dropped).
        unsafe { self.ring.submission().push(&entry.user_data(user_data)) }
            .map_err(|_| RingError::Full)?;
        self.ops_in_flight += 1;
        Ok(())
    }

    /// Build the entry for `op`, or run it here (block-device discard) and return `None`.
    fn prepare(&mut self, op: Op, user_data: u64) -> Result<Option<squeue::Entry>, RingError> {
        let entry = match op {
            Op::Read { file, offset_bytes, ptr, len_bytes } => {
                let fd = self.fixed(file, offset_bytes, u64::from(len_bytes))?;
                self.check_aligned(file, offset_bytes, u64::from(len_bytes), ptr.addr())?;
                opcode::Read::new(fd, ptr, len_bytes).offset(offset_bytes).build()
            }
            Op::Write { file, offset_bytes, ptr, len_bytes, fua } => {
                let fd = self.fixed(file, offset_bytes, u64::from(len_bytes))?;
                self.check_aligned(file, offset_bytes, u64::from(len_bytes), ptr.addr())?;
                let rw_flags = if fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, len_bytes)
                    .offset(offset_bytes)
                    .rw_flags(rw_flags)
                    .build()
            }
            Op::ReadFixed { file, offset_bytes, ptr, len_bytes, buf_index } => {
                let fd = self.fixed(file, offset_bytes, u64::from(len_bytes))?;
                self.check_aligned(file, offset_bytes, u64::from(len_bytes), ptr.addr())?;
                self.check_buffer(buf_index)?;
                opcode::ReadFixed::new(fd, ptr, len_bytes, buf_index).offset(offset_bytes).build()
            }
            Op::WriteFixed { file, offset_bytes, ptr, len_bytes, buf_index, fua } => {
                let fd = self.fixed(file, offset_bytes, u64::from(len_bytes))?;
                self.check_aligned(file, offset_bytes, u64::from(len_bytes), ptr.addr())?;
                self.check_buffer(buf_index)?;
                let rw_flags = if fua { libc::RWF_DSYNC } else { 0 };
                opcode::WriteFixed::new(fd, ptr, len_bytes, buf_index)
                    .offset(offset_bytes)
                    .rw_flags(rw_flags)
                    .build()
            }
            Op::Readv { file, offset_bytes, iovecs, count } => {
                let len_bytes = self.check_iovecs(file, offset_bytes, iovecs, count)?;
                let fd = self.fixed(file, offset_bytes, len_bytes)?;
                opcode::Readv::new(fd, iovecs, count).offset(offset_bytes).build()
            }
            Op::Writev { file, offset_bytes, iovecs, count } => {
                let len_bytes = self.check_iovecs(file, offset_bytes, iovecs, count)?;
                let fd = self.fixed(file, offset_bytes, len_bytes)?;
                opcode::Writev::new(fd, iovecs, count).offset(offset_bytes).build()
            }
            Op::Flush { file } => {
                let fd = self.fixed(file, 0, 0)?;
                opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build()
            }
            Op::Discard { file, offset_bytes, len_bytes } => {
                let fd = self.fixed(file, offset_bytes, len_bytes)?;
                self.check_aligned(file, offset_bytes, len_bytes, 0)?;
                if self.files[index(file)].kind == FileKind::BlockDevice {
                    self.discard_block_now(file, offset_bytes, len_bytes, user_data);
                    return Ok(None);
                }
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                opcode::Fallocate::new(fd, len_bytes).offset(offset_bytes).mode(mode).build()
            }
            Op::WriteZeroes { file, offset_bytes, len_bytes } => {
                let fd = self.fixed(file, offset_bytes, len_bytes)?;
                self.check_aligned(file, offset_bytes, len_bytes, 0)?;
                let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
                opcode::Fallocate::new(fd, len_bytes).offset(offset_bytes).mode(mode).build()
            }
        };
        Ok(Some(entry))
    }

    /// `BLKDISCARD` now, its result queued as a completion for the next `reap`.
    fn discard_block_now(&mut self, file: u32, offset_bytes: u64, len_bytes: u64, user_data: u64) {
        let fd = self.files[index(file)].file.as_raw_fd();
        let result = sys::block_discard(fd, offset_bytes, len_bytes);
        // Bounded: check_capacity admitted this op, so in-flight (which includes every local
        // completion) is below in_flight_max, the queue's capacity.
        assert!(self.local_completions.len() < self.in_flight_max);
        self.local_completions.push_back((user_data, result));
        self.ops_in_flight += 1;
    }

    /// Arm a read of `waker`'s eventfd: when another thread calls [`Waker::wake`], the read
    /// completes and [`Ring::reap`] reports `user_data` (result 8, or `-errno`). A thread
    /// blocked in [`Ring::submit`] therefore wakes. Re-arm after each waker completion; one
    /// waker read may be armed at a time. Like `push`, nothing reaches the kernel until
    /// `submit`.
    pub fn arm_waker(&mut self, waker: &Waker, user_data: u64) -> Result<(), RingError> {
        if user_data == USER_DATA_RESERVED {
            return Err(RingError::ReservedUserData);
        }
        if self.waker.is_some() {
            return Err(RingError::WakerArmed);
        }
        // Never fails: operations leave one slot and one entry for this read (`push`).
        self.check_capacity(true)?;
        let buffer = self.waker_buffer.get().cast::<u8>();
        let entry = opcode::Read::new(types::Fd(waker.raw_fd()), buffer, WAKER_READ_BYTES)
            .offset(0)
            .build()
            .user_data(USER_DATA_RESERVED);
        // SAFETY: the target is the ring's own heap buffer of 8 bytes, which we never touch
        // (the value read is not used) and which lives until the completion is reaped (`reap`
        // clears `self.waker` only then) or is leaked by `drop`. The eventfd stays open
        // because `self.waker` holds a clone of the waker until then.
        unsafe { self.ring.submission().push(&entry) }.map_err(|_| RingError::Full)?;
        self.waker = Some(ArmedWaker { waker: waker.clone(), user_data });
        Ok(())
    }

    /// Submit queued operations. If `wait_for > 0`, block until at least that many
    /// completions are ready to reap, or `timeout` passes (`None`: no timeout), or a signal
    /// arrives. The wait is capped at the number of operations that can still complete, so
    /// it cannot block forever on nothing. Returns how many entries the kernel took.
    pub fn submit(
        &mut self,
        wait_for: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, RingError> {
        let local = self.local_completions.len();
        let kernel_pending = self.ops_in_flight - local + usize::from(self.waker.is_some());
        let want = wait_for.saturating_sub(local).min(kernel_pending);
        if want == 0 && self.ring.submission().is_empty() {
            // Nothing to send and nothing to wait for: skip the syscall. Completions reach
            // the queue without one (no DEFER_TASKRUN), and the queue cannot overflow.
            return Ok(0);
        }
        let submitter = self.ring.submitter();
        let result = match timeout {
            Some(timeout) if want > 0 => {
                let timespec = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&timespec);
                submitter.submit_with_args(want, &args)
            }
            _ => submitter.submit_and_wait(want),
        };
        match result {
            Ok(submitted) => Ok(submitted),
            // Timed out, interrupted, or the kernel asks us to reap first: the caller reaps
            // what is ready and calls again; queued entries stay queued.
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Ok(0)
            }
            Err(source) => Err(RingError::Submit { source }),
        }
    }

    /// Call `f(user_data, result)` for every ready completion (`result`: bytes transferred,
    /// or `-errno`). Returns how many were reaped.
    pub fn reap(&mut self, mut f: impl FnMut(u64, i32)) -> usize {
        let mut reaped = 0;
        while let Some((user_data, result)) = self.local_completions.pop_front() {
            self.ops_in_flight -= 1;
            reaped += 1;
            f(user_data, result);
        }
        for entry in self.ring.completion() {
            let (user_data, result) = (entry.user_data(), entry.result());
            if user_data == USER_DATA_RESERVED {
                let armed = self.waker.take().expect("a waker completion without an armed waker");
                reaped += 1;
                f(armed.user_data, result);
                continue;
            }
            self.ops_in_flight =
                self.ops_in_flight.checked_sub(1).expect("a completion that was never pushed");
            reaped += 1;
            f(user_data, result);
        }
        reaped
    }

    /// Operations pushed with [`Ring::push`] and not yet reaped (the waker read is not
    /// counted).
    pub fn in_flight(&self) -> usize {
        self.ops_in_flight
    }

    /// Most operations in flight at once, counting an armed waker read (the completion
    /// queue's size).
    pub fn in_flight_max(&self) -> usize {
        self.in_flight_max
    }

    /// Whether a waker read is armed (pushed and not yet reaped).
    pub fn is_waker_armed(&self) -> bool {
        self.waker.is_some()
    }

    /// Room to queue one more entry: `for_waker`, the waker read itself; otherwise an
    /// operation, which must leave the waker read a submission entry always (an armed
    /// read's entry may have left the queue long before its completion is reaped and the
    /// read re-armed) and a completion slot if it is not armed (an armed one holds its own).
    fn check_capacity(&mut self, for_waker: bool) -> Result<(), RingError> {
        let slot_reserve = usize::from(!for_waker && self.waker.is_none());
        let entry_reserve = usize::from(!for_waker);
        let in_flight = self.ops_in_flight + usize::from(self.waker.is_some());
        let queue = self.ring.submission();
        if in_flight + 1 + slot_reserve > self.in_flight_max
            || queue.len() + 1 + entry_reserve > queue.capacity()
        {
            return Err(RingError::Full);
        }
        Ok(())
    }

    /// The fixed-file handle for `file`, after checking the index and the byte range.
    fn fixed(
        &self,
        file: u32,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<types::Fixed, RingError> {
        if index(file) >= self.files.len() {
            return Err(RingError::UnknownFile { file, registered: self.files.len() });
        }
        match offset_bytes.checked_add(len_bytes) {
            Some(end_bytes) if end_bytes <= OFFSET_END_MAX_BYTES => Ok(types::Fixed(file)),
            _ => Err(RingError::OffsetTooLarge { offset_bytes, len_bytes }),
        }
    }

    /// Direct IO needs offset, length and buffer address on the file's logical block. Checked
    /// here, not left to the kernel, because the kernel does not always check: tmpfs and
    /// reads of holes on ext4 accept anything, and code tested there would then fail on a
    /// real device.
    fn check_aligned(
        &self,
        file: u32,
        offset_bytes: u64,
        len_bytes: u64,
        address: usize,
    ) -> Result<(), RingError> {
        let logical_block_bytes = self.files[index(file)].logical_block_bytes;
        let block_bytes = u64::from(logical_block_bytes);
        // One test for all three: logical blocks are powers of two (checked at registration).
        let address_bytes = u64::try_from(address).expect("usize fits in u64");
        if (offset_bytes | len_bytes | address_bytes).is_multiple_of(block_bytes) {
            return Ok(());
        }
        Err(RingError::Misaligned { file, offset_bytes, len_bytes, address, logical_block_bytes })
    }

    /// Check a vectored op's entries as `check_aligned` checks one buffer; returns the total
    /// length. Only called from `push`, whose contract makes `iovecs..iovecs + count` valid.
    fn check_iovecs(
        &self,
        file: u32,
        offset_bytes: u64,
        iovecs: *const libc::iovec,
        count: u32,
    ) -> Result<u64, RingError> {
        if index(file) >= self.files.len() {
            return Err(RingError::UnknownFile { file, registered: self.files.len() });
        }
        if count == 0 || count > IOVECS_MAX || iovecs.is_null() {
            return Err(RingError::IovecCount { count });
        }
        // SAFETY: `push`'s contract: the iovec array the op names is valid and untouched by
        // the caller until completion; `count` entries were checked above to be a sane number.
        let entries = unsafe { std::slice::from_raw_parts(iovecs, count as usize) };
        let mut total_bytes = 0u64;
        for entry in entries {
            let len_bytes = u64::try_from(entry.iov_len).expect("usize fits in u64");
            self.check_aligned(file, offset_bytes, len_bytes, entry.iov_base.addr())?;
            total_bytes += len_bytes;
        }
        Ok(total_bytes)
    }

    fn check_buffer(&self, buf_index: u16) -> Result<(), RingError> {
        if usize::from(buf_index) >= self.buffers_registered {
            let registered = self.buffers_registered;
            return Err(RingError::UnknownBuffer { buf_index, registered });
        }
        Ok(())
    }
}

fn index(file: u32) -> usize {
    usize::try_from(file).expect("u32 fits in usize")
}

impl Drop for Ring {
    /// Wait until nothing is in flight, so no kernel write lands in memory after the ring
    /// (and, under `push`'s contract, the caller's buffers) are gone. An armed waker read is
    /// completed by waking it ourselves (one spurious wake for anyone else using that
    /// waker; wakes may always be spurious).
    fn drop(&mut self) {
        if let Some(armed) = &self.waker {
            armed.waker.wake();
        }
        while self.ops_in_flight > 0 || self.waker.is_some() {
            if self.submit(1, Some(DROP_WAIT_SLICE)).is_err() {
                break;
            }
            self.reap(|_, _| {});
        }
        if let Some(armed) = self.waker.take() {
            // The ring failed while its waker read was in flight: leak the read's buffer and
            // the eventfd rather than free memory the kernel may still write.
            let buffer = std::mem::replace(&mut self.waker_buffer, Box::new(UnsafeCell::new(0)));
            std::mem::forget(buffer);
            std::mem::forget(armed);
        }
    }
}
