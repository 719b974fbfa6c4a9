//! Member IO for flashraid: io_uring with O_DIRECT on regular files and block devices.
//!
//! Owns: opening members ([`Device`]), synchronous IO for metadata paths, and the
//! asynchronous data path ([`Ring`], [`Op`], [`Waker`]). This crate is the edge that talks to
//! the kernel; it knows nothing about RAID: a member is a path, a descriptor and a range of
//! bytes, and an operation is a read, write, flush, discard or write-zeroes on it.
//!
//! Invariants: all IO is direct (`O_DIRECT`): offsets and lengths are multiples of the
//! device's logical block size and buffers are [`flashraid_iobuf::IO_ALIGN_BYTES`]-aligned.
//! [`Device`] checks this for synchronous IO (buffers on 4096), [`Ring::push`] for queued IO
//! (buffers on the logical block). Memory lent to the kernel is governed by [`Ring::push`]'s
//! safety contract.
//!
//! Fault model: expected faults are typed: [`DeviceError`] and [`RingError`] for calls that
//! fail, negative results in ring completions for device errors ([`check_transfer`] and
//! [`check_status`] classify them). Nothing panics on a device fault.
//!
//! Limits: Linux only (io_uring with `IORING_FEAT_EXT_ARG`, Linux 5.11+); bounds are named
//! constants ([`RING_ENTRIES_MAX`], [`REGISTERED_FILES_MAX`], [`REGISTERED_BUFFERS_MAX`]).
//! `unsafe` lives in `sys` (ioctls, fallocate, eventfd) and `ring` (lending memory to the
//! kernel), each block with its justification.

mod completion;
mod device;
mod ring;
mod sys;
mod waker;

pub use completion::{TransferError, check_status, check_transfer};
pub use device::{
    Access, Capabilities, Device, DeviceError, DeviceKind, FILE_LOGICAL_BLOCK_BYTES, LOCK_WAIT,
};
/// The entry of a vectored op's buffer list ([`Op::Readv`], [`Op::Writev`]).
pub use libc::iovec;
pub use ring::{
    IOVECS_MAX, Op, REGISTERED_BUFFERS_MAX, REGISTERED_FILES_MAX, RING_ENTRIES_MAX, Ring,
    RingError, USER_DATA_RESERVED,
};
pub use waker::Waker;
