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
use crate::reactor::{Doorbell, ToReactor};
use flashraid_engine::{
    ArrayOp, Piece, PieceOp, RequestId, Router, ShardOp, ShardReply, ShardRequest,
};
use flashraid_iobuf::{BufPool, IoBuf};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Request ids: session in the top bits, then ticket, then piece.
pub(crate) const SESSION_SHIFT: u32 = 44;
const TICKET_SHIFT: u32 = 20;
const PIECES_MAX: u64 = 1 << TICKET_SHIFT;
/// Requests one session has in flight at most.
pub const SESSION_REQUESTS_MAX: usize = 1 << 16;
/// Pieces (shard requests) one session has in flight at most; also bounds its outbox.
pub const SESSION_PIECES_MAX: usize = 1 << 16;

/// Slices one `Session::fill_staged` call offers (pieces of a staged write).
pub const FILL_SLICES_MAX: usize = 16;
/// How long `poll(wait)` polls for replies, yielding its core, before it blocks.
const SPIN_BEFORE_BLOCK: Duration = Duration::from_micros(50);

/// A reactor as seen from a session.
#[derive(Clone, Debug)]
pub(crate) struct ReactorLink {
    pub tx: SyncSender<ToReactor>,
    pub bell: Arc<Doorbell>,
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
    #[error("the request needs {pieces} pieces; a session takes at most {max}")]
    TooLarge { pieces: usize, max: usize },
    #[error("the request needs more buffer memory than the session has ({budget_bytes} B)")]
    NeverFits { budget_bytes: usize },
    #[error("the array is stopped")]
    Stopped,
    #[error("the write's data could not be had: {0}")]
    Fill(String),
}

/// Where a write's bytes come from.
enum WriteSource<'a> {
    /// Copied from the request's whole range.
    Slice(&'a [u8]),
    /// Put into each piece's buffer by the caller ([`Session::submit_filled`]).
    Fill(&'a mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>),
}

/// The length of a staged write's piece (a write is cut into write pieces only).
fn staged_piece_bytes(piece: &Piece) -> usize {
    let PieceOp::Write { len_bytes, .. } = piece.op else {
        panic!("a staged write cut into a piece that is not a write");
    };
    usize::try_from(len_bytes).expect("fits")
}

/// Where a staged write stands: its ticket, its tag, and how far its pieces are filled.
#[derive(Debug)]
struct Staged {
    slot: usize,
    tag: u64,
    /// The piece being filled, and the bytes of it already in place.
    piece: usize,
    piece_filled_bytes: usize,
}

/// A request slot. Slots are reused; `read_pieces` keeps its capacity across requests so a
/// warmed-up session allocates nothing per request.
#[derive(Debug)]
struct Ticket {
    live: bool,
    tag: u64,
    pieces_left: u32,
    result: Result<(), ArrayError>,
    /// Per piece index of a read: (offset in the request, length).
    read_pieces: Vec<(u64, usize)>,
}

/// One client's connection to the array.
pub struct Session {
    id: u32,
    router: Router,
    reactors: Arc<Vec<ReactorLink>>,
    replies: Receiver<ShardReply>,
    pool: BufPool,
    tickets: Vec<Ticket>,
    free_tickets: Vec<usize>,
    live_tickets: usize,
    pieces_in_flight: usize,
    /// Messages a full reactor inbox could not take yet, in order; sent by `kick`. Never
    /// longer than `SESSION_PIECES_MAX`.
    outbox: VecDeque<(usize, ToReactor)>,
    /// Requests that needed no piece, to report done at the next poll.
    finished_empty: Vec<usize>,
    wake: Vec<bool>,
    // Scratch reused by every `submit`.
    pieces: Vec<Piece>,
    bufs: Vec<Option<IoBuf>>,
    ops: Vec<ShardOp>,
    /// Rung by reactors after replying while this session sleeps in `poll(2)`.
    bell: Option<Arc<Doorbell>>,
    /// A reply taken while checking whether it is safe to sleep; handled first by `poll`.
    stashed: Option<ShardReply>,
    /// The write being filled over time, if any ([`Session::stage_write`]), with its own
    /// pieces and buffers (kept apart from the scratch every `submit` reuses).
    staged: Option<Staged>,
    staged_pieces: Vec<Piece>,
    staged_bufs: Vec<Option<IoBuf>>,
    /// Where the id goes back when the session is dropped with nothing in flight.
    id_pool: Arc<std::sync::Mutex<Vec<u32>>>,
}

impl Drop for Session {
    /// Requests in flight finish first (outside reactor threads), so no reply meant for
    /// this session can reach the next one with its id; only then is the id given back. A
    /// session dropped inside a reactor (a job) cannot wait on its own reactor: if it still
    /// has requests in flight its id is never reused.
    fn drop(&mut self) {
        self.cancel_staged();
        if !crate::reactor::in_reactor_thread() {
            while !self.is_idle() {
                if self.poll(true, &mut |_| {}) == 0 && !self.is_idle() {
                    break; // the reactors are gone: nothing more will come
                }
            }
        }
        if self.is_idle() && self.outbox.is_empty() {
            self.id_pool.lock().expect("not poisoned").push(self.id);
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("requests_in_flight", &self.live_tickets)
            .field("pieces_in_flight", &self.pieces_in_flight)
            .field("outbox", &self.outbox.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(
        id: u32,
        router: Router,
        reactors: Arc<Vec<ReactorLink>>,
        replies: Receiver<ShardReply>,
        pool: BufPool,
        bell: Option<Arc<Doorbell>>,
        id_pool: Arc<std::sync::Mutex<Vec<u32>>>,
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
            live_tickets: 0,
            pieces_in_flight: 0,
            outbox: VecDeque::new(),
            finished_empty: Vec::new(),
            wake: vec![false; shards],
            pieces: Vec::with_capacity(64),
            bufs: Vec::with_capacity(64),
            ops: Vec::with_capacity(64),
            bell,
            stashed: None,
            staged: None,
            staged_pieces: Vec::with_capacity(64),
            staged_bufs: Vec::with_capacity(64),
            id_pool,
        }
    }

    fn ticket_slot(&mut self) -> Option<usize> {
        if let Some(slot) = self.free_tickets.pop() {
            return Some(slot);
        }
        if self.tickets.len() >= SESSION_REQUESTS_MAX {
            return None;
        }
        self.tickets.push(Ticket {
            live: false,
            tag: 0,
            pieces_left: 0,
            result: Ok(()),
            read_pieces: Vec::new(),
        });
        Some(self.tickets.len() - 1)
    }

    /// Submit a request; `tag` comes back with its events. Write data is copied now.
    pub fn submit(
        &mut self,
        op: ArrayOp,
        data: Option<&[u8]>,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_from(op, data.map(WriteSource::Slice), tag)
    }

    /// Submit a write whose bytes the caller puts straight into the session's buffers:
    /// `fill(offset_in_request, piece)` is called for every piece, in request order, before
    /// anything is sent, so a payload arriving from a socket is copied once, not twice. If
    /// `fill` fails, nothing is sent and the buffers go back to the pool
    /// ([`SubmitError::Fill`]). For other requests `fill` is not called.
    pub fn submit_filled(
        &mut self,
        op: ArrayOp,
        tag: u64,
        fill: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> Result<(), SubmitError> {
        self.submit_from(op, Some(WriteSource::Fill(fill)), tag)
    }

    /// Begin a write whose data arrives over time, for a caller that cannot wait for it
    /// (an NBD connection run inside a reactor, reading a payload from a non-blocking
    /// socket): its ticket and buffers are taken now, as by `submit`; [`Session::fill_staged`]
    /// puts bytes in them, in request order, as they come; [`Session::submit_staged`] sends
    /// the write once full, or [`Session::cancel_staged`] gives it up. One at a time per
    /// session. On error nothing is staged.
    pub fn stage_write(&mut self, op: ArrayOp, tag: u64) -> Result<(), SubmitError> {
        assert!(self.staged.is_none(), "a session stages one write at a time");
        assert!(matches!(op, ArrayOp::Write { .. }), "only writes are staged");
        let mut pieces = std::mem::take(&mut self.staged_pieces);
        let mut bufs = std::mem::take(&mut self.staged_bufs);
        pieces.clear();
        bufs.clear();
        let reserved = self.reserve(op, &mut pieces, &mut bufs);
        self.staged_pieces = pieces;
        self.staged_bufs = bufs;
        let slot = reserved?;
        self.staged = Some(Staged { slot, tag, piece: 0, piece_filled_bytes: 0 });
        Ok(())
    }

    /// Put more of the staged write's data in place: `fill(targets)` writes up to their
    /// total length into `targets`, in order (the rest of the staged write, at most
    /// `FILL_SLICES_MAX` pieces: one `readv` from a socket), and says how many bytes (0:
    /// none now). Returns true once every byte is in place. An error leaves the write
    /// staged (cancel it).
    pub fn fill_staged(
        &mut self,
        fill: &mut dyn FnMut(&mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize>,
    ) -> std::io::Result<bool> {
        let staged = self.staged.as_mut().expect("a staged write to fill");
        while staged.piece < self.staged_pieces.len() {
            let mut targets: [std::io::IoSliceMut<'_>; FILL_SLICES_MAX] =
                std::array::from_fn(|_| std::io::IoSliceMut::new(&mut []));
            let mut count = 0;
            let mut room_bytes = 0;
            let rest = self.staged_pieces[staged.piece..].iter();
            for (piece, buf) in rest.zip(self.staged_bufs[staged.piece..].iter_mut()) {
                if count == FILL_SLICES_MAX {
                    break;
                }
                let len = staged_piece_bytes(piece);
                let from = if count == 0 { staged.piece_filled_bytes } else { 0 };
                let slice = &mut buf.as_mut().expect("taken").as_mut_slice()[from..len];
                room_bytes += slice.len();
                targets[count] = std::io::IoSliceMut::new(slice);
                count += 1;
            }
            let mut n = fill(&mut targets[..count])?;
            if n == 0 {
                return Ok(false);
            }
            assert!(n <= room_bytes, "fill reported more bytes than it was given room for");
            while n > 0 {
                let left = staged_piece_bytes(&self.staged_pieces[staged.piece])
                    - staged.piece_filled_bytes;
                if n < left {
                    staged.piece_filled_bytes += n;
                    break;
                }
                n -= left;
                staged.piece += 1;
                staged.piece_filled_bytes = 0;
            }
        }
        Ok(true)
    }

    /// Send the staged write; every byte must be in place (`fill_staged` said so).
    pub fn submit_staged(&mut self) -> Result<(), SubmitError> {
        let staged = self.staged.take().expect("a staged write to submit");
        let mut pieces = std::mem::take(&mut self.staged_pieces);
        let mut bufs = std::mem::take(&mut self.staged_bufs);
        let mut ops = std::mem::take(&mut self.ops);
        assert_eq!(staged.piece, pieces.len(), "a staged write submitted before it was full");
        ops.clear();
        self.tickets[staged.slot].read_pieces.clear();
        ops.extend(pieces.iter().map(|piece| match piece.op {
            PieceOp::Write { offset, len_bytes, durability, .. } => {
                ShardOp::Write { offset, len_bytes, durability }
            }
            _ => unreachable!("checked by staged_piece_bytes while filling"),
        }));
        let result = self.launch(staged.slot, staged.tag, &mut pieces, &mut bufs, &mut ops);
        self.staged_pieces = pieces;
        self.staged_bufs = bufs;
        self.ops = ops;
        result
    }

    /// Give up the staged write, if any: its buffers and ticket go back, nothing is sent.
    pub fn cancel_staged(&mut self) {
        if let Some(staged) = self.staged.take() {
            let mut bufs = std::mem::take(&mut self.staged_bufs);
            self.unreserve(staged.slot, &mut bufs);
            self.staged_bufs = bufs;
            self.staged_pieces.clear();
        }
    }

    fn submit_from(
        &mut self,
        op: ArrayOp,
        source: Option<WriteSource<'_>>,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let mut pieces = std::mem::take(&mut self.pieces);
        let mut bufs = std::mem::take(&mut self.bufs);
        let mut ops = std::mem::take(&mut self.ops);
        pieces.clear();
        bufs.clear();
        ops.clear();
        let result = self.submit_pieces(op, source, tag, &mut pieces, &mut bufs, &mut ops);
        self.pieces = pieces;
        self.bufs = bufs;
        self.ops = ops;
        result
    }

    fn submit_pieces(
        &mut self,
        op: ArrayOp,
        mut source: Option<WriteSource<'_>>,
        tag: u64,
        pieces: &mut Vec<Piece>,
        bufs: &mut Vec<Option<IoBuf>>,
        ops: &mut Vec<ShardOp>,
    ) -> Result<(), SubmitError> {
        let slot = self.reserve(op, pieces, bufs)?;
        // Then put the write data in them (the step that can fail, for a filled write),
        // and only then send anything. Only a read's pieces have entries here: a reply
        // with an entry is read data.
        self.tickets[slot].read_pieces.clear();
        for (index, (piece, buf)) in pieces.iter().zip(bufs.iter_mut()).enumerate() {
            let op = match piece.op {
                PieceOp::Read { offset, len_bytes, request_offset } => {
                    let len = usize::try_from(len_bytes).expect("fits");
                    let reads = &mut self.tickets[slot].read_pieces;
                    if reads.len() <= index {
                        reads.resize(index + 1, (0, 0));
                    }
                    reads[index] = (request_offset, len);
                    ShardOp::Read { offset, len_bytes }
                }
                PieceOp::Write { offset, len_bytes, request_offset, durability } => {
                    let len = usize::try_from(len_bytes).expect("fits");
                    let target = &mut buf.as_mut().expect("taken").as_mut_slice()[..len];
                    match source.as_mut().expect("writes carry data") {
                        WriteSource::Slice(data) => {
                            let at = usize::try_from(request_offset).expect("fits");
                            target.copy_from_slice(&data[at..at + len]);
                        }
                        WriteSource::Fill(fill) => {
                            if let Err(e) = fill(request_offset, target) {
                                self.unreserve(slot, bufs);
                                return Err(SubmitError::Fill(e.to_string()));
                            }
                        }
                    }
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
            ops.push(op);
        }
        self.launch(slot, tag, pieces, bufs, ops)
    }

    /// Cut `op` into `pieces` and take a ticket and every buffer they need, so a request is
    /// sent whole or not at all. Returns the ticket's slot.
    fn reserve(
        &mut self,
        op: ArrayOp,
        pieces: &mut Vec<Piece>,
        bufs: &mut Vec<Option<IoBuf>>,
    ) -> Result<usize, SubmitError> {
        self.router.split(op, &mut |p| pieces.push(p))?;
        if pieces.len() as u64 >= PIECES_MAX || pieces.len() > SESSION_PIECES_MAX {
            let max = SESSION_PIECES_MAX.min(PIECES_MAX as usize - 1);
            return Err(SubmitError::TooLarge { pieces: pieces.len(), max });
        }
        if self.pieces_in_flight + pieces.len() > SESSION_PIECES_MAX {
            return Err(SubmitError::Full);
        }
        let slot = self.ticket_slot().ok_or(SubmitError::Full)?;
        // Take every buffer first so a request is sent whole or not at all.
        for piece in pieces.iter() {
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
                    self.unreserve(slot, bufs);
                    if self.pool.is_full() {
                        // Every buffer is free and still not enough: waiting cannot help.
                        let budget_bytes = self
                            .pool
                            .class_bytes()
                            .iter()
                            .zip(self.pool.built_counts())
                            .map(|(b, n)| b * n)
                            .sum();
                        return Err(SubmitError::NeverFits { budget_bytes });
                    }
                    return Err(SubmitError::Full);
                }
                None => bufs.push(None),
            }
        }
        Ok(slot)
    }

    /// Give back what `reserve` took, sending nothing.
    fn unreserve(&mut self, slot: usize, bufs: &mut Vec<Option<IoBuf>>) {
        for buf in bufs.drain(..).flatten() {
            self.pool.give(buf);
        }
        self.free_tickets.push(slot);
    }

    /// Send a reserved request whose data is in place: `ops[i]` is what `pieces[i]` asks
    /// of its shard, with `bufs[i]`.
    fn launch(
        &mut self,
        slot: usize,
        tag: u64,
        pieces: &mut Vec<Piece>,
        bufs: &mut Vec<Option<IoBuf>>,
        ops: &mut Vec<ShardOp>,
    ) -> Result<(), SubmitError> {
        let count = u32::try_from(pieces.len()).expect("fits");
        let ticket = &mut self.tickets[slot];
        ticket.live = true;
        ticket.tag = tag;
        ticket.pieces_left = count;
        ticket.result = Ok(());
        self.live_tickets += 1;
        if count == 0 {
            // Nothing to do (a discard smaller than a stripe): finished at the next poll.
            self.finished_empty.push(slot);
            return Ok(());
        }
        self.pieces_in_flight += pieces.len();
        for (index, ((piece, buf), op)) in
            pieces.drain(..).zip(bufs.drain(..)).zip(ops.drain(..)).enumerate()
        {
            let id = (u64::from(self.id) << SESSION_SHIFT)
                | ((slot as u64) << TICKET_SHIFT)
                | index as u64;
            let shard = usize::try_from(piece.shard).expect("fits");
            let request = ShardRequest { id: RequestId(id), op, buf };
            self.send(shard, ToReactor::Request(request))?;
        }
        Ok(())
    }

    /// Queue a message to a reactor. A full inbox never blocks the session (it may run
    /// inside a reactor, which would then wait on itself): the message waits in the outbox.
    fn send(&mut self, shard: usize, message: ToReactor) -> Result<(), SubmitError> {
        if !self.outbox.is_empty() {
            self.outbox.push_back((shard, message));
            return Ok(());
        }
        match self.reactors[shard].tx.try_send(message) {
            Ok(()) => {
                self.wake[shard] = true;
                Ok(())
            }
            Err(TrySendError::Full(m)) => {
                self.outbox.push_back((shard, m));
                self.reactors[shard].bell.ring();
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }

    /// Send what the outbox holds, as far as the inboxes take it.
    fn drain_outbox(&mut self) {
        while let Some((shard, message)) = self.outbox.pop_front() {
            match self.reactors[shard].tx.try_send(message) {
                Ok(()) => self.wake[shard] = true,
                Err(TrySendError::Full(m)) => {
                    self.outbox.push_front((shard, m));
                    self.reactors[shard].bell.ring();
                    return;
                }
                // The reactor is gone: its replies never come; `poll` sees the session's
                // reply channel close... or times out. Drop the message.
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    /// Ring every reactor that has new messages (once per batch of submissions).
    pub fn kick(&mut self) {
        self.drain_outbox();
        for (shard, wake) in self.wake.iter_mut().enumerate() {
            if std::mem::take(wake) {
                self.reactors[shard].bell.ring();
            }
        }
    }

    /// Deliver events for finished work. With `wait`, block until at least one request
    /// finishes (or the reactors are gone); nothing in flight returns at once. Returns the
    /// number of requests finished.
    pub fn poll(&mut self, wait: bool, handler: &mut dyn FnMut(Event<'_>)) -> usize {
        self.kick();
        let mut finished = 0;
        while let Some(slot) = self.finished_empty.pop() {
            finished += self.finish(slot, handler);
        }
        if let Some(reply) = self.stashed.take() {
            finished += self.on_reply(reply, handler);
        }
        let mut spin_since: Option<Instant> = None;
        loop {
            let reply = match self.replies.try_recv() {
                Ok(reply) => Some(reply),
                Err(_) if !wait || finished > 0 || self.is_idle() => return finished,
                // Replies to requests in flight come within microseconds on fast members:
                // poll a little (yielding the core) before blocking, which costs a futex
                // wait here and a wake-up in the reactor per reply (the threaded path spent
                // over half its CPU in them).
                Err(_)
                    if spin_since.get_or_insert_with(Instant::now).elapsed()
                        < SPIN_BEFORE_BLOCK =>
                {
                    if !self.outbox.is_empty() {
                        // A full inbox may have room now.
                        self.kick();
                    }
                    std::thread::yield_now();
                    continue;
                }
                Err(_) => {
                    // Messages still in the outbox: come back soon to send them.
                    let patience = if self.outbox.is_empty() {
                        Duration::from_secs(1)
                    } else {
                        Duration::from_micros(50)
                    };
                    match self.replies.recv_timeout(patience) {
                        Ok(reply) => Some(reply),
                        Err(RecvTimeoutError::Timeout) => {
                            self.kick();
                            None
                        }
                        Err(RecvTimeoutError::Disconnected) => return finished,
                    }
                }
            };
            if let Some(reply) = reply {
                // A reply that finished no request still counts as the wait paying off.
                spin_since = None;
                finished += self.on_reply(reply, handler);
            }
        }
    }

    fn on_reply(&mut self, reply: ShardReply, handler: &mut dyn FnMut(Event<'_>)) -> usize {
        let slot = usize::try_from(
            (reply.id.0 >> TICKET_SHIFT) & ((1 << (SESSION_SHIFT - TICKET_SHIFT)) - 1),
        )
        .expect("fits");
        let index = usize::try_from(reply.id.0 & (PIECES_MAX - 1)).expect("fits");
        self.pieces_in_flight -= 1;
        let ticket = &mut self.tickets[slot];
        assert!(ticket.live, "a reply for request slot {slot}, which is not in flight");
        if let Some(buf) = reply.buf {
            if let (Some(&(offset, len)), Ok(())) = (ticket.read_pieces.get(index), reply.result)
                && len > 0
            {
                handler(Event::Data {
                    tag: ticket.tag,
                    offset_in_request: offset,
                    data: &buf.as_slice()[..len],
                });
            }
            self.pool.give(buf);
        }
        let ticket = &mut self.tickets[slot];
        if let Err(e) = reply.result {
            ticket.result = Err(ArrayError::Request(e));
        }
        ticket.pieces_left -= 1;
        if ticket.pieces_left > 0 {
            return 0;
        }
        self.finish(slot, handler)
    }

    fn finish(&mut self, slot: usize, handler: &mut dyn FnMut(Event<'_>)) -> usize {
        let ticket = &mut self.tickets[slot];
        ticket.live = false;
        let result = std::mem::replace(&mut ticket.result, Ok(()));
        let tag = ticket.tag;
        self.live_tickets -= 1;
        self.free_tickets.push(slot);
        handler(Event::Done { tag, result });
        1
    }

    /// The descriptor that becomes readable when this session should `poll` again (sessions
    /// from `Array::session_with_bell` only).
    pub fn notify_fd(&self) -> Option<std::os::fd::RawFd> {
        self.bell.as_ref().map(|b| b.waker().raw_fd())
    }

    /// Before waiting on `notify_fd` with `poll(2)`: sends what is queued, then says whether
    /// sleeping is safe (false: replies are already here, call `poll`). After the wait, call
    /// `woke`. Without a bell, always false.
    pub fn prepare_to_sleep(&mut self) -> bool {
        self.kick();
        let Some(bell) = &self.bell else { return false };
        if !self.outbox.is_empty() || self.stashed.is_some() || !self.finished_empty.is_empty() {
            return false;
        }
        bell.announce_sleep();
        match self.replies.try_recv() {
            Ok(reply) => {
                self.stashed = Some(reply);
                bell.awake();
                false
            }
            Err(_) => true,
        }
    }

    /// After a `poll(2)` wait prepared by `prepare_to_sleep`.
    pub fn woke(&mut self) {
        if let Some(bell) = &self.bell {
            bell.awake();
            bell.waker().drain();
        }
    }

    /// Messages wait for room in a reactor's inbox: call `poll` or `kick` again soon (no
    /// reply need come to prompt it).
    pub fn has_queued(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.live_tickets == 0
    }
}
