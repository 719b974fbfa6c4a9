//! Requests a shard accepts and the replies it gives.
//!
//! A shard request touches one stripe (reads and writes) or no stripe (flush); the router
//! ([`crate::router`]) cuts array requests into shard requests and joins the replies. Read
//! and write data travel in an [`IoBuf`] owned by the requester: moved in with the request,
//! moved back with the reply, never copied on the way when the layout allows.

use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, StripeIndex};

pub use crate::io::Durability;

/// Identifies a request until its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// How to zero a whole stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroHow {
    /// Deallocate on members that read back zeroes afterwards, write zeroes on the others.
    Discard,
    /// Write zeroes (members may use a zeroing deallocate where they have one).
    WriteZeroes,
}

/// What a shard request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardOp {
    /// Read `len_bytes` at `offset` into the request buffer. Within one stripe.
    Read { offset: ArrayOffset, len_bytes: u32 },
    /// Write `len_bytes` at `offset` from the request buffer. Within one stripe.
    Write { offset: ArrayOffset, len_bytes: u32, durability: Durability },
    /// Make every write completed before this request durable.
    Flush,
    /// Zero a whole stripe (data and parity, so parity stays consistent: the parity of zeroes
    /// is zero for P, Q and R).
    Zero { stripe: StripeIndex, how: ZeroHow, durability: Durability },
}

/// A request to one shard.
#[derive(Debug)]
pub struct ShardRequest {
    pub id: RequestId,
    pub op: ShardOp,
    /// Read destination or write source: bytes `0..len_bytes`. `None` for flush and zero.
    pub buf: Option<IoBuf>,
}

/// Why a request failed. Nothing the engine knows to be wrong is ever returned as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("data unreadable: the members holding it and its redundancy are unavailable")]
    Unreadable,
    #[error("the array has failed (more members lost than its level survives); writes refused")]
    ArrayFailed,
    #[error("request outside the array or not aligned to 4 KiB blocks")]
    OutOfRange,
    #[error("request malformed: {0}")]
    Malformed(&'static str),
    #[error("media error on a member of an array without redundancy")]
    Media,
    #[error("the shard is shutting down")]
    ShuttingDown,
    #[error(
        "the array is served read-only: writes, discards and zeroes are refused (stop it and \
         start it without --read-only to write)"
    )]
    ReadOnly,
}

/// The answer to a request.
#[derive(Debug)]
pub struct ShardReply {
    pub id: RequestId,
    pub result: Result<(), RequestError>,
    /// The request's buffer, returned (filled, for reads).
    pub buf: Option<IoBuf>,
}

/// Why a request was not accepted. The request is handed back untouched.
#[derive(Debug)]
pub enum Rejected {
    /// A limit (requests in flight) is reached: retry after some replies.
    Busy(ShardRequest),
}
