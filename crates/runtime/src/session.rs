//! Sessions: how a client (an NBD connection, a benchmark worker, an embedding program) talks
//! to the reactors.
//!
//! A session owns a bounded pool of IO buffers and a reply channel. It cuts each array request
//! into pieces with the router, copies write data into buffers, sends each piece to the
//! reactor of its shard, wakes each reactor it sent to once per batch, and joins the replies.
//! Many requests may be in flight per session (pipelining); the pool bounds how many bytes.
//!
//! Not thread-safe by design: one session per client thread, no locks between them.

use crate::ArrayError;
use crate::reactor::ToReactor;
use flashraid_engine::{ArrayOp, PieceOp, RequestId, Router, ShardOp, ShardReply, ShardRequest};
use flashraid_iobuf::{BufPool, IoBuf};
use flashraid_uring::Waker;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

/// Request ids: session in the top bits, then ticket, then piece.
pub(crate) const SESSION_SHIFT: u32 = 44;
const TICKET_SHIFT: u32 = 20;
const PIECES_MAX: u64 = 1 << TICKET_SHIFT;
/// Requests one session has in flight at most.
pub const SESSION_REQUESTS_MAX: usize = 1 << 16;

/// A reactor as seen from a session.
#[derive(Clone, Debug)]
pub(crate) struct ReactorLink {
    pub tx: SyncSender<ToReactor>,
    pub waker: Waker,
}

/// Something that happened to a submitted request.
#[derive(Debug)]
pub enum Event<'a> {
    /// Read data: `data` belongs at `offset_in_request` of the request's range. Pieces arrive
    /// in any order.
    Data { tag: u64, offset_in_request: u64, data: &'a [u8] },
    /// The request finished (after all its `Data` events).
    Done { tag: u64, result: Result<(), ArrayError> },
}

/// Why `submit` did not take a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the session's buffers are all in flight: collect completions and retry")]
    Full,
    #[error(transparent)]
    Invalid(#[from] flashraid_engine::RouteError),
    #[error("the array is stopped")]
    Stopped,
}

#[derive(Debug)]
struct Ticket {
    tag: u64,
    pieces_left: u32,
    result: Result<(), ArrayError>,
    /// Per piece: (offset in the request, length) for reads.
    reads: bool,
}

/// One client's connection to the array.
#[derive(Debug)]
pub struct Session {
    id: u32,
    router: Router,
    reactors: Arc<Vec<ReactorLink>>,
    replies: Receiver<ShardReply>,
    pool: BufPool,
    tickets: Vec<Option<Ticket>>,
    free_tickets: Vec<usize>,
    /// Per in-flight read piece id: where its data goes in the request, and its length.
    piece_offsets: std::collections::HashMap<u64, (u64, usize)>,
    wake: Vec<bool>,
}

impl Session {
    pub(crate) fn new(
        id: u32,
        router: Router,
        reactors: Arc<Vec<ReactorLink>>,
        replies: Receiver<ShardReply>,
        pool: BufPool,
    ) -> Self {
        let shards = reactors.len();
        Self {
            id,
            router,
            reactors,
            replies,
            pool,
            tickets: Vec::new(),
            free_tickets: Vec::new(),
            piece_offsets: std::collections::HashMap::with_capacity(1024),
            wake: vec![false; shards],
        }
    }

    fn ticket_slot(&mut self) -> Option<usize> {
        if let Some(slot) = self.free_tickets.pop() {
            return Some(slot);
        }
        if self.tickets.len() >= SESSION_REQUESTS_MAX {
            return None;
        }
        self.tickets.push(None);
        Some(self.tickets.len() - 1)
    }

    /// Submit a request; `tag` comes back with its events. Write data is copied now.
    pub fn submit(
        &mut self,
        op: ArrayOp,
        data: Option<&[u8]>,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let mut pieces = Vec::new();
        self.router.split(op, &mut |p| pieces.push(p))?;
        if pieces.len() as u64 >= PIECES_MAX {
            return Err(SubmitError::Invalid(flashraid_engine::RouteError::Empty));
        }
        let slot = self.ticket_slot().ok_or(SubmitError::Full)?;
        // Take every buffer first so a request is sent whole or not at all.
        let mut bufs: Vec<Option<IoBuf>> = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            let needs = match piece.op {
                PieceOp::Read { len_bytes, .. } | PieceOp::Write { len_bytes, .. } => {
                    Some(len_bytes)
                }
                PieceOp::WriteZeroes { len_bytes, .. } => Some(len_bytes),
                PieceOp::Zero { .. } | PieceOp::Flush => None,
            };
            match needs.map(|len| self.pool.take(usize::try_from(len).expect("fits"))) {
                Some(Some(buf)) => bufs.push(Some(buf)),
                Some(None) => {
                    for buf in bufs.into_iter().flatten() {
                        self.pool.give(buf);
                    }
                    self.free_tickets.push(slot);
                    return Err(SubmitError::Full);
                }
                None => bufs.push(None),
            }
        }
        let reads = matches!(op, ArrayOp::Read { .. });
        let count = u32::try_from(pieces.len()).expect("fits");
        self.tickets[slot] = Some(Ticket { tag, pieces_left: count, result: Ok(()), reads });
        if count == 0 {
            // Nothing to do (a discard smaller than a stripe).
            return Ok(());
        }
        for (index, (piece, mut buf)) in pieces.into_iter().zip(bufs).enumerate() {
            let id = (u64::from(self.id) << SESSION_SHIFT)
                | ((slot as u64) << TICKET_SHIFT)
                | index as u64;
            let op = match piece.op {
                PieceOp::Read { offset, len_bytes, request_offset } => {
                    let len = usize::try_from(len_bytes).expect("fits");
                    self.piece_offsets.insert(id, (request_offset, len));
                    ShardOp::Read { offset, len_bytes }
                }
                PieceOp::Write { offset, len_bytes, request_offset, durability } => {
                    let data = data.expect("writes carry data");
                    let at = usize::try_from(request_offset).expect("fits");
                    let len = usize::try_from(len_bytes).expect("fits");
                    buf.as_mut().expect("taken").as_mut_slice()[..len]
                        .copy_from_slice(&data[at..at + len]);
                    ShardOp::Write { offset, len_bytes, durability }
                }
                PieceOp::WriteZeroes { offset, len_bytes, durability } => {
                    let len = usize::try_from(len_bytes).expect("fits");
                    buf.as_mut().expect("taken").as_mut_slice()[..len].fill(0);
                    ShardOp::Write { offset, len_bytes, durability }
                }
                PieceOp::Zero { stripe, how, durability } => {
                    ShardOp::Zero { stripe, how, durability }
                }
                PieceOp::Flush => ShardOp::Flush,
            };
            let shard = usize::try_from(piece.shard).expect("fits");
            let request = ShardRequest { id: RequestId(id), op, buf };
            self.send(shard, ToReactor::Request(request))?;
        }
        Ok(())
    }

    fn send(&mut self, shard: usize, message: ToReactor) -> Result<(), SubmitError> {
        let mut message = message;
        loop {
            match self.reactors[shard].tx.try_send(message) {
                Ok(()) => {
                    self.wake[shard] = true;
                    return Ok(());
                }
                Err(TrySendError::Full(m)) => {
                    // The reactor's inbox is full: wake it and wait for room.
                    self.reactors[shard].waker.wake();
                    message = m;
                    std::thread::yield_now();
                }
                Err(TrySendError::Disconnected(_)) => return Err(SubmitError::Stopped),
            }
        }
    }

    /// Wake every reactor that has new messages (once per batch of submissions).
    pub fn kick(&mut self) {
        for (shard, wake) in self.wake.iter_mut().enumerate() {
            if std::mem::take(wake) {
                self.reactors[shard].waker.wake();
            }
        }
    }

    /// Deliver events for finished work. With `wait`, block until at least one request
    /// finishes (or a second passes). Returns the number of requests finished.
    pub fn poll(&mut self, wait: bool, handler: &mut dyn FnMut(Event<'_>)) -> usize {
        self.kick();
        let mut finished = 0;
        let mut first = true;
        loop {
            let reply = if wait && first && finished == 0 {
                match self.replies.recv_timeout(Duration::from_secs(1)) {
                    Ok(reply) => Some(reply),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            } else {
                self.replies.try_recv().ok()
            };
            first = false;
            let Some(reply) = reply else {
                if wait && finished == 0 && !self.is_idle() {
                    first = true;
                    continue;
                }
                return finished;
            };
            finished += self.on_reply(reply, handler);
        }
    }

    fn on_reply(&mut self, reply: ShardReply, handler: &mut dyn FnMut(Event<'_>)) -> usize {
        let slot = usize::try_from(
            (reply.id.0 >> TICKET_SHIFT) & ((1 << (SESSION_SHIFT - TICKET_SHIFT)) - 1),
        )
        .expect("fits");
        let ticket = self.tickets[slot].as_mut().expect("reply for a live ticket");
        let tag = ticket.tag;
        if let Some(buf) = reply.buf {
            let read = self.piece_offsets.remove(&reply.id.0);
            if let (true, Some((offset, len)), Ok(())) = (ticket.reads, read, reply.result) {
                handler(Event::Data {
                    tag,
                    offset_in_request: offset,
                    data: &buf.as_slice()[..len],
                });
            }
            self.pool.give(buf);
        }
        let ticket = self.tickets[slot].as_mut().expect("live");
        if let Err(e) = reply.result {
            ticket.result = Err(ArrayError::Request(e));
        }
        ticket.pieces_left -= 1;
        if ticket.pieces_left > 0 {
            return 0;
        }
        let ticket = self.tickets[slot].take().expect("live");
        self.free_tickets.push(slot);
        handler(Event::Done { tag, result: ticket.result });
        1
    }

    /// Nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.tickets.iter().all(Option::is_none)
    }
}
