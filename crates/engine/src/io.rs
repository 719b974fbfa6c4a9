//! The seam between the deterministic engine and the world: member IOs out, completions in.
//!
//! Owns: [`MemberIo`], [`MemberCompletion`] and the [`Driver`] trait that real IO (io_uring),
//! the simulator and tests implement.
//!
//! Memory contract (the one place raw pointers cross the seam): a `Read` or `Write` carries a
//! pointer into a buffer the engine owns. The engine keeps that memory alive and does not read
//! or write it until the completion with the same token has been passed to
//! `Shard::complete_io`. Drivers may read (Write) or write (Read) exactly `len_bytes` there
//! and nothing else. Only drivers dereference these pointers, and they live in the IO layer.
//!
//! Fault model: every IO completes exactly once, with success or an [`IoError`]; a driver that
//! loses a completion is a driver bug (the engine would wait forever), not a fault the engine
//! handles.

use flashraid_layout::MemberIndex;

/// Identifies one member IO until it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoToken(pub u64);

/// Whether a write must be durable when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// May sit in the device's volatile cache until a flush.
    Cached,
    /// Forced unit access: durable when it completes.
    Fua,
}

/// One operation on one member. Offsets are absolute byte offsets on the member device.
#[derive(Debug)]
pub enum MemberIoKind {
    Read {
        offset_bytes: u64,
        ptr: *mut u8,
        len_bytes: u32,
    },
    Write {
        offset_bytes: u64,
        ptr: *const u8,
        len_bytes: u32,
        durability: Durability,
    },
    /// Make every completed write durable.
    Flush,
    /// Deallocate; the engine only issues it where the member reads zeroes afterwards.
    Discard {
        offset_bytes: u64,
        len_bytes: u64,
    },
    /// Make the range read as zeroes.
    WriteZeroes {
        offset_bytes: u64,
        len_bytes: u64,
    },
}

/// A member IO the engine wants done.
#[derive(Debug)]
pub struct MemberIo {
    pub token: IoToken,
    pub member: MemberIndex,
    pub kind: MemberIoKind,
}

/// Why a member IO failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// The device reported an error for this IO (EIO, a medium error): the range may be bad.
    Media,
    /// The device is gone (ENODEV, ENXIO, a vanished file): every later IO will fail.
    Gone,
    /// The device does not support the operation (e.g. discard).
    Unsupported,
}

impl IoError {
    /// Map a negative errno from the kernel.
    pub fn from_errno(errno: i32) -> IoError {
        const ENXIO: i32 = 6;
        const ENODEV: i32 = 19;
        const EOPNOTSUPP: i32 = 95;
        const ESHUTDOWN: i32 = 108;
        match errno.abs() {
            ENXIO | ENODEV | ESHUTDOWN => IoError::Gone,
            EOPNOTSUPP => IoError::Unsupported,
            _ => IoError::Media,
        }
    }
}

/// The outcome of a member IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberCompletion {
    pub token: IoToken,
    pub result: Result<(), IoError>,
}

/// Performs member IO. Implemented by the io_uring layer, the simulator and tests.
pub trait Driver {
    /// Start an IO. Returns it back if the driver has no room now (backpressure); the caller
    /// retries after collecting completions.
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo>;
    /// Hand every available completion to `sink`.
    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(IoError::from_errno(-5), IoError::Media);
        assert_eq!(IoError::from_errno(-19), IoError::Gone);
        assert_eq!(IoError::from_errno(-6), IoError::Gone);
        assert_eq!(IoError::from_errno(-95), IoError::Unsupported);
    }
}
