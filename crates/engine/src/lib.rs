//! flashraid's array engine: the deterministic core.
//!
//! Owns: [`Shard`], the state machine that serves one shard of an array (its stripes, its
//! buffers, its bitmap block); [`Router`], which cuts array requests into shard requests; the
//! write planner ([`plan`]); and the [`Driver`] seam through which member IO leaves the core.
//!
//! It does no IO, reads no clock, starts no threads and draws no randomness. The io_uring
//! runtime and the simulator both drive the same shards through `submit`/`poll_io`/
//! `complete_io`/`poll_reply`/`tick`.
//!
//! Limits: 64 members, chunk sizes 4 KiB to 1 MiB, 4 KiB blocks, 64 shards.

#![forbid(unsafe_code)]

mod bitmap;
pub mod config;
pub mod io;
pub mod owner;
pub mod plan;
pub mod request;
pub mod router;
pub mod shard;
mod table;

pub use config::{
    ArrayAccess, MEMBER_IO_TIMEOUT_US_DEFAULT, MEMBER_IO_TIMEOUT_US_MAX, MEMBER_IO_TIMEOUT_US_MIN,
    MERGE_WINDOW_US_MAX, ShardConfig,
};
pub use io::{Driver, Durability, IoError, IoToken, MemberCompletion, MemberIo, MemberIoKind};
pub use owner::Ownership;
pub use request::{Rejected, RequestError, RequestId, ShardOp, ShardReply, ShardRequest, ZeroHow};
pub use router::{ArrayOp, Piece, PieceOp, RouteError, Router};
pub use shard::{
    BitmapSetup, EPOCHS, FailReason, Health, MemberSetup, RebuildStatus, ScrubStatus, ScrubTally,
    Shard, ShardCounters, ShardEvent, ShardSetup, ShutdownState, StallCause,
};

/// Why an engine component could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    #[error("invalid setup: {0}")]
    Setup(&'static str),
    #[error(transparent)]
    Parity(#[from] flashraid_parity::ParityError),
}
