//! One reactor thread per shard: it owns the shard, its io_uring ring and its buffers, and
//! talks to everything else by message.
//!
//! Loop: take messages (requests from sessions, control from the controller), let time pass,
//! move the shard's member IO into the ring, hand completions back, route replies to their
//! sessions and events to the controller. When nothing happened it blocks in the ring until a
//! completion, a wake (another thread queued a message) or a short timeout (for the shard's
//! timers).
//!
//! Limits: sessions per array `SESSIONS_MAX`; messages queued to a reactor bounded by its
//! channel; IO queued beyond the ring's room waits in the shard.

use crate::driver::UringDriver;
use crate::memory::MemDriver;
use flashraid_engine::Health;
use flashraid_engine::{
    Driver, MemberIo, Rejected, Shard, ShardCounters, ShardReply, ShardRequest, ShutdownState,
};
use flashraid_layout::MemberIndex;
use flashraid_uring::{Ring, Waker};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// Sessions (clients) one array serves at once.
pub const SESSIONS_MAX: usize = 4096;
/// User data of the waker's completion (shard tokens never have origin 0).
pub(crate) const WAKER_TAG: u64 = 0;
/// How long an idle reactor sleeps before ticking the shard's timers.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// A shard's state as reported to `status`.
#[derive(Clone, Debug)]
pub struct ShardStatus {
    pub counters: ShardCounters,
    pub health: Vec<Health>,
    pub resyncing: bool,
    pub bitmap_regions_set: usize,
    pub idle: bool,
}

pub(crate) enum Control {
    ApplyFailed(Vec<MemberIndex>),
    Status(Sender<ShardStatus>),
    /// Stop taking requests; once idle flush, clear the bitmap and acknowledge with whether
    /// the shard ended clean.
    CleanShutdown(Sender<bool>),
    /// Exit the thread now (after a clean shutdown, or to simulate a crash).
    Stop,
}

pub(crate) enum ToReactor {
    Request(ShardRequest),
    Session { id: u32, replies: Sender<ShardReply> },
    Control(Control),
}

/// Where a reactor's member IO goes.
// One per reactor thread, built once and never moved on the data path: size is irrelevant.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    /// Files and block devices through io_uring; the reactor sleeps in the ring.
    Uring(UringDriver),
    /// In-memory members; the reactor sleeps on its inbox.
    Memory(MemDriver),
}

impl Backend {
    fn driver(&mut self) -> &mut dyn Driver {
        match self {
            Backend::Uring(d) => d,
            Backend::Memory(d) => d,
        }
    }

    fn arm(&mut self, waker: &Waker) -> Result<(), String> {
        match self {
            Backend::Uring(d) => d.ring().arm_waker(waker, WAKER_TAG).map_err(|e| e.to_string()),
            Backend::Memory(_) => Ok(()),
        }
    }

    /// Submit queued IO and, when nothing happened, sleep until there is something to do.
    /// A message received while sleeping is returned.
    fn wait(
        &mut self,
        progress: bool,
        inbox: &Receiver<ToReactor>,
    ) -> Result<Option<ToReactor>, String> {
        match self {
            Backend::Uring(d) => {
                let wait_for = usize::from(!progress);
                let timeout = if progress { None } else { Some(IDLE_WAIT) };
                d.ring().submit(wait_for, timeout).map_err(|e| e.to_string())?;
                Ok(None)
            }
            Backend::Memory(_) if progress => Ok(None),
            Backend::Memory(_) => Ok(inbox.recv_timeout(IDLE_WAIT).ok()),
        }
    }
}

/// Runs one shard until told to stop.
pub(crate) struct Reactor {
    pub shard: Shard,
    pub driver: Backend,
    pub waker: Waker,
    pub inbox: Receiver<ToReactor>,
    pub events: Sender<crate::array::ToController>,
    pub shard_index: u32,
}

impl Reactor {
    pub fn run(mut self) {
        let start = Instant::now();
        let mut sessions: Vec<Option<Sender<ShardReply>>> = Vec::new();
        let mut held_requests: VecDeque<ShardRequest> = VecDeque::new();
        let mut held_io: Option<MemberIo> = None;
        let mut shutdown_ack: Option<Sender<bool>> = None;
        if let Err(e) = self.driver.arm(&self.waker) {
            panic!("reactor {}: cannot arm its waker: {e}", self.shard_index);
        }
        let mut woke_with: Option<ToReactor> = None;
        loop {
            let mut progress = false;
            // Messages.
            loop {
                let message = match woke_with.take() {
                    Some(m) => Ok(m),
                    None => self.inbox.try_recv(),
                };
                match message {
                    Ok(ToReactor::Request(request)) => {
                        progress = true;
                        held_requests.push_back(request);
                    }
                    Ok(ToReactor::Session { id, replies }) => {
                        let id = usize::try_from(id).expect("fits");
                        if sessions.len() <= id {
                            sessions.resize_with(id + 1, || None);
                        }
                        sessions[id] = Some(replies);
                    }
                    Ok(ToReactor::Control(control)) => {
                        progress = true;
                        match control {
                            Control::ApplyFailed(members) => self.shard.apply_failed(&members),
                            Control::Status(reply) => {
                                let _ = reply.send(self.status());
                            }
                            Control::CleanShutdown(ack) => {
                                self.shard.begin_shutdown();
                                shutdown_ack = Some(ack);
                            }
                            Control::Stop => return,
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            while let Some(request) = held_requests.pop_front() {
                if let Err(Rejected::Busy(request)) = self.shard.submit(request) {
                    held_requests.push_front(request);
                    break;
                }
            }
            let now_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.shard.tick(now_us);
            progress |= self.push_io(&mut held_io);
            let mut completed = 0usize;
            let mut woken = false;
            {
                let shard = &mut self.shard;
                self.driver.driver().poll(&mut |completion| {
                    if completion.token.0 == WAKER_TAG {
                        woken = true;
                    } else {
                        completed += 1;
                        shard.complete_io(completion);
                    }
                });
            }
            if woken {
                let _ = self.driver.arm(&self.waker);
            }
            progress |= completed > 0 || woken;
            progress |= self.push_io(&mut held_io);
            while let Some(reply) = self.shard.poll_reply() {
                progress = true;
                let session =
                    usize::try_from(reply.id.0 >> crate::session::SESSION_SHIFT).expect("fits");
                if let Some(Some(tx)) = sessions.get(session) {
                    // A session that went away drops its reply (and the buffer with it).
                    let _ = tx.send(reply);
                }
            }
            while let Some(event) = self.shard.poll_event() {
                let _ =
                    self.events.send(crate::array::ToController::Event(self.shard_index, event));
            }
            if let ShutdownState::Done { clean } = self.shard.shutdown_state()
                && let Some(ack) = shutdown_ack.take()
            {
                let _ = ack.send(clean);
            }
            // Submit what was queued; sleep only when nothing happened.
            match self.driver.wait(progress, &self.inbox) {
                Ok(message) => woke_with = message,
                Err(e) => panic!("reactor {}: waiting for IO failed: {e}", self.shard_index),
            }
        }
    }

    /// Move the shard's IO into the ring until it is full. True if anything moved.
    fn push_io(&mut self, held: &mut Option<MemberIo>) -> bool {
        let mut moved = false;
        loop {
            let Some(io) = held.take().or_else(|| self.shard.poll_io()) else { return moved };
            match self.driver.driver().submit(io) {
                Ok(()) => moved = true,
                Err(io) => {
                    *held = Some(io);
                    return moved;
                }
            }
        }
    }

    fn status(&self) -> ShardStatus {
        let n = self.shard.geometry().member_count();
        ShardStatus {
            counters: self.shard.counters(),
            health: (0..n)
                .map(|m| self.shard.member_health(MemberIndex(u16::try_from(m).expect("fits"))))
                .collect(),
            resyncing: self.shard.is_resyncing(),
            bitmap_regions_set: self.shard.bitmap_regions_set(),
            idle: self.shard.is_idle(),
        }
    }
}

/// Build a ring for a shard with every member registered.
pub(crate) fn member_ring(
    fds: &[std::os::fd::RawFd],
    entries: u32,
) -> Result<Ring, flashraid_uring::RingError> {
    let mut ring = Ring::new(entries)?;
    ring.register_files(fds)?;
    Ok(ring)
}
