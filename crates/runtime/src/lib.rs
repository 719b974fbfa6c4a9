//! flashraid's runtime: arrays running on real devices.
//!
//! Owns: the threads (one reactor per shard, one controller), the io_uring driver that
//! connects the engine to the members, sessions through which clients submit IO, and the
//! embedded API ([`Array`], [`create`], [`inspect`]).
//!
//! ```no_run
//! use flashraid_runtime::{Array, OpenOptions};
//! # fn main() -> Result<(), flashraid_runtime::ArrayError> {
//! let paths = vec!["/var/lib/flashraid/m0".into(), "/var/lib/flashraid/m1".into()];
//! let array = Array::open(&paths, &OpenOptions::recommended())?;
//! let mut session = array.session()?;
//! session.write(0, &vec![7u8; 4096])?;
//! let mut back = vec![0u8; 4096];
//! session.read(0, &mut back)?;
//! session.flush()?;
//! array.shutdown()?;
//! # Ok(())
//! # }
//! ```

mod array;
mod copier;
mod device;
mod driver;
mod faults;
mod memory;
mod reactor;
mod session;

pub use array::{
    Array, ArrayStatus, CreateSpec, CreatedArray, EVENTS_KEPT, EventRecord, FailGuard,
    MemberStatus, OpenOptions, QUEUE_DEPTH_MAX, QUEUE_DEPTH_MIN, ReAdd, RebuildProgress,
    ScrubProgress, Stopped, Tunable, UNVERIFIABLE_STALL, create, create_in_memory,
    create_in_memory_with_spares, inspect, queue_depth_valid, rate_mib_per_s,
    stored_rate_bytes_per_s,
};
pub use device::MemberDevice;
pub use faults::{FaultRule, Faults, Healing, PowerDomain, SECTOR_BYTES, TornReport, Trigger};
pub use memory::MemMember;
pub use reactor::{JobStatus, SESSIONS_MAX, SHARD_JOBS_MAX, ShardJob, ShardStatus};
pub use session::{Event, SESSION_PIECES_MAX, SESSION_REQUESTS_MAX, Session, SubmitError};

use flashraid_engine::{ArrayOp, Durability, RequestError};
use flashraid_layout::ArrayOffset;

/// Why an array operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error(transparent)]
    Control(#[from] flashraid_control::ControlError),
    #[error("{0}")]
    Device(String),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error("the array is stopped")]
    Stopped,
    #[error("{0}")]
    Other(String),
}

impl Session {
    /// Submit and wait for one request (the convenience path; use `submit`/`poll` to keep
    /// many in flight).
    fn run_one(
        &mut self,
        op: ArrayOp,
        data: Option<&[u8]>,
        mut out: Option<&mut [u8]>,
    ) -> Result<(), ArrayError> {
        const TAG: u64 = u64::MAX;
        loop {
            match self.submit(op, data, TAG) {
                Ok(()) => break,
                Err(SubmitError::Full) => {
                    self.poll(true, &mut |_| {});
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut result = None;
        while result.is_none() {
            self.poll(true, &mut |event| match event {
                Event::Data { tag: TAG, offset_in_request, data } => {
                    if let Some(out) = out.as_deref_mut() {
                        let at = usize::try_from(offset_in_request).expect("fits");
                        out[at..at + data.len()].copy_from_slice(data);
                    }
                }
                Event::Done { tag: TAG, result: r } => result = Some(r),
                _ => {}
            });
        }
        result.expect("set")
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        let op = ArrayOp::Read { offset: ArrayOffset(offset), len_bytes: buf.len() as u64 };
        self.run_one(op, None, Some(buf))
    }

    /// Write `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ArrayError> {
        let op = ArrayOp::Write {
            offset: ArrayOffset(offset),
            len_bytes: data.len() as u64,
            durability: Durability::Cached,
        };
        self.run_one(op, Some(data), None)
    }

    /// Make every completed write durable.
    pub fn flush(&mut self) -> Result<(), ArrayError> {
        self.run_one(ArrayOp::Flush, None, None)
    }

    /// Deallocate whole stripes in the range (advisory).
    pub fn discard(&mut self, offset: u64, len_bytes: u64) -> Result<(), ArrayError> {
        let op = ArrayOp::Discard {
            offset: ArrayOffset(offset),
            len_bytes,
            durability: Durability::Cached,
        };
        self.run_one(op, None, None)
    }

    /// Make the range read as zeroes.
    pub fn write_zeroes(&mut self, offset: u64, len_bytes: u64) -> Result<(), ArrayError> {
        let op = ArrayOp::WriteZeroes {
            offset: ArrayOffset(offset),
            len_bytes,
            durability: Durability::Cached,
        };
        self.run_one(op, None, None)
    }
}
