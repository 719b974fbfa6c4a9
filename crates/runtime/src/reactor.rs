//! One reactor thread per shard: it owns the shard, its io_uring ring and its buffers, and
//! talks to everything else by message.
//!
//! A turn: take messages (requests from sessions, control from the controller), let time
//! pass, move the shard's member IO into the ring, hand completions back, route replies to
//! their sessions and events to the controller, and run the jobs placed on this shard. When
//! turns did nothing for `SPIN_BEFORE_SLEEP` and no job said `Running`, the reactor sleeps:
//! with no jobs in the ring (files) until a completion, a ring of its doorbell or a short
//! timeout (for the shard's timers), or on its inbox (memory members); with jobs in `poll(2)`
//! (below).
//!
//! Doorbell: a thread that queued a message rings the doorbell, which costs a syscall only if
//! the reactor said it is about to sleep. The reactor announces sleep, then looks at its inbox
//! once more before blocking; senders publish the message, then look at the announcement. With
//! a SeqCst fence on both sides one of them sees the other, so no wake is lost and a busy
//! reactor is never woken by syscall.
//!
//! Jobs ("poller" mode): a closure placed on a shard runs once per turn inside the reactor
//! thread, like an SPDK poller: a client with no thread of its own (a benchmark worker, an
//! NBD connection) submits and collects with no thread hand-off on its side. A job that says
//! `Running` keeps its reactor polling. One that says `Waiting` names the descriptor it
//! waits on; when every job waits, the reactor may sleep as it does without jobs, in
//! `poll(2)` on those descriptors and on what wakes it anyway (its ring's descriptor, which
//! turns readable with a completion or a ring of the doorbell, or for memory members the
//! doorbell's own descriptor). The replies to a waiting job's requests that other shards send
//! ring this reactor's doorbell (`Array::job_session`).
//!
//! Limits: sessions per array `SESSIONS_MAX`; jobs per shard `SHARD_JOBS_MAX`; messages
//! queued to a reactor bounded by its channel; requests taken from the channel and not yet
//! accepted by the shard at most `HELD_REQUESTS_MAX` (beyond that the channel holds them);
//! IO queued beyond the ring's room waits in the shard.

use crate::driver::UringDriver;
use crate::memory::MemDriver;
use flashraid_engine::Health;
use flashraid_engine::{
    Driver, MemberIo, Rejected, Shard, ShardCounters, ShardReply, ShardRequest, ShutdownState,
};
use flashraid_layout::{MemberIndex, StripeIndex};
use flashraid_uring::{Ring, Waker};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// Sessions (clients) one array serves at once.
pub const SESSIONS_MAX: usize = 4096;
/// Jobs one shard runs at once (as many as the NBD server's connections, which may all land
/// on one shard).
pub const SHARD_JOBS_MAX: usize = 128;
/// Requests a reactor holds after taking them from its channel while the shard is busy.
const HELD_REQUESTS_MAX: usize = 4096;
/// User data of the waker's completion (shard tokens never have origin 0).
pub(crate) const WAKER_TAG: u64 = 0;
/// How long a reactor with nothing to do keeps polling (yielding its core between turns)
/// before it sleeps.
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// A polling reactor with nothing to do yields its core once per this many idle turns.
const YIELD_EVERY_IDLE_TURNS: u32 = 8;
/// A parked job is called at least once per this many turns.
const PARKED_CALL_EVERY_TURNS: u32 = 64;
/// How long an idle reactor sleeps before ticking the shard's timers.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// A shard's state as reported to `status`.
#[derive(Clone, Debug)]
pub struct ShardStatus {
    pub counters: ShardCounters,
    pub health: Vec<Health>,
    pub resyncing: bool,
    /// `Shard::resync_pending`.
    pub resync_pending: bool,
    pub bitmap_regions_set: usize,
    /// Merged member reads that failed and were read again part by part (io_uring only).
    pub member_reads_retried: u64,
    /// Member IOs that carried several of the engine's IOs (io_uring only).
    pub member_ios_merged: u64,
    pub idle: bool,
    pub rebuild: Option<flashraid_engine::RebuildStatus>,
    pub scrub: Option<flashraid_engine::ScrubStatus>,
}

thread_local! {
    static IN_REACTOR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Microseconds since `start`: the shard's clock (`Shard::tick`, `next_deadline_us`).
fn elapsed_us(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Whether the calling thread is a reactor (code there must never wait for a reactor).
pub(crate) fn in_reactor_thread() -> bool {
    IN_REACTOR.with(|flag| flag.get())
}

/// What a job says after a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Call again next turn.
    Running,
    /// Nothing to do until descriptor `fd` reports one of `events` (`poll(2)` flags; `fd`
    /// -1: nothing but a reply) or a request of the job's session finishes. Called again
    /// next turn all the same; the reactor only may sleep in between.
    Waiting { fd: std::os::fd::RawFd, events: i16 },
    /// Nothing in flight and nothing to do until `fd` reports one of `events`: the reactor
    /// calls the job again only when one `poll(2)` per turn over all such jobs says so, or
    /// every `PARKED_CALL_EVERY_TURNS` turns (a job may watch a flag, such as a stop), so
    /// a shard with many quiet connections pays one system call per turn, not one each.
    Parked { fd: std::os::fd::RawFd, events: i16 },
    /// Done: the reactor drops the job and reports it finished.
    Finished,
}

/// Work run inside a reactor thread, once per turn. It must not block: it submits and
/// collects through a session with `poll(false, ..)`. A job that panics is dropped (its
/// session with it) and its sender hears why; the reactor and its other jobs go on.
pub type ShardJob = Box<dyn FnMut() -> JobStatus + Send>;

pub(crate) enum Control {
    ApplyFailed(Vec<MemberIndex>),
    Status(Sender<ShardStatus>),
    /// Stop taking requests; once idle flush, clear the bitmap and acknowledge with whether
    /// the shard ended clean, and whether only background init's regions were left.
    CleanShutdown(Sender<(bool, bool)>),
    /// Run a job each turn until it finishes; the sender hears when (or why not).
    RunJob(ShardJob, Sender<Result<(), String>>),
    /// Exit the thread now (after a clean shutdown, or to simulate a crash).
    Stop,
    /// A hot spare holds `role` now (`device`: its registered index, after the roles): route
    /// the role's IO there and rebuild it from stripe `from`.
    StartRebuild {
        role: MemberIndex,
        device: usize,
        from: StripeIndex,
        zeroes_after_discard: bool,
        /// The role's own member came back: only what it missed is rebuilt.
        partial: bool,
    },
    /// The rebuild of `role` is recorded finished: the member is active again.
    FinishRebuild(MemberIndex),
    /// Every role is recorded in service: the missed-write map can be emptied.
    ClearMissed,
    /// A member is being copied to its replacement: record every region written in the
    /// missed-write map (or stop), then answer.
    CopyRecording(bool, Sender<()>),
    /// This shard's share of the rebuild rate, bytes per second (0: unlimited).
    SetRebuildRate(u64),
    /// `Shard::set_rebuild_trust_parity`.
    SetRebuildTrustParity(bool),
    /// This shard's share of the busy-time rebuild rate (0: no separate limit).
    SetRebuildBusyRate(u64),
    /// This shard's share of the resync rate (0: unlimited).
    SetResyncRate(u64),
    /// The merge window for partial-stripe writes, microseconds (0: none).
    SetMergeWindow(u64),
    /// The member timeout, microseconds (0: never).
    SetMemberTimeout(u64),
    /// This shard's share of a running scrub's rate (0: unlimited).
    SetScrubRate(u64),
    /// Scrub every stripe (`repair`: rewrite what disagrees) at this shard's share of a rate
    /// (bytes read per second; 0: unlimited).
    StartScrub {
        repair: bool,
        rate_bytes_per_s: u64,
    },
    StopScrub,
    /// A device added while running (a hot spare) takes registration slot `slot`; the
    /// reactor answers whether its driver could take it.
    AddDevice {
        slot: usize,
        device: AddedDevice,
        done: Sender<Result<(), String>>,
    },
    /// Let go of the device in registration slot `slot` (a spare removed, or one refused
    /// after registration): the ring's duplicate of its descriptor is replaced by
    /// `placeholder` (the controller keeps that open until every reactor answered), so a
    /// block device is no longer claimed once the controller closes its own descriptor.
    /// The engine has no IO for the slot: it serves no role.
    ReleaseDevice {
        slot: usize,
        placeholder: std::os::fd::RawFd,
        done: Sender<Result<(), String>>,
    },
}

/// What a reactor needs to address a device added while running.
#[derive(Clone, Debug)]
pub(crate) enum AddedDevice {
    /// Its descriptor (the controller keeps it open; the ring takes its own duplicate).
    Fd(std::os::fd::RawFd),
    Memory(Arc<crate::memory::MemMember>),
}

pub(crate) enum ToReactor {
    Request(ShardRequest),
    Session { id: u32, replies: Sender<ShardReply>, bell: Option<Arc<Doorbell>> },
    Control(Control),
}

/// How other threads get a sleeping thread's attention (module doc: Doorbell). Reactors have
/// one; so do sessions that wait with `poll(2)` (`Array::session_with_bell`).
#[derive(Debug)]
pub(crate) struct Doorbell {
    waker: Waker,
    sleeping: AtomicBool,
    /// Rung since the reactor last cleared it (`take_rung`). A reply for a job's session
    /// goes to that session's channel, which the reactor does not look at before it
    /// sleeps; this flag is what it looks at instead.
    rung: AtomicBool,
}

impl Doorbell {
    pub fn new(waker: Waker) -> Self {
        Self { waker, sleeping: AtomicBool::new(false), rung: AtomicBool::new(false) }
    }

    /// Call after queueing a message: wakes the reactor if it sleeps or is about to.
    pub fn ring(&self) {
        // Release: a reactor that clears the flag (Acquire) sees the message queued before.
        self.rung.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.waker.wake();
        }
    }

    pub fn announce_sleep(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Whether the bell rang since the last call (before jobs look at their sessions; after
    /// `announce_sleep`, a true here means something may have come that no sleep would
    /// notice: with the fences on both sides, either the ringer saw the announcement or
    /// this sees the ring).
    pub fn take_rung(&self) -> bool {
        self.rung.swap(false, Ordering::AcqRel)
    }

    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    pub fn waker(&self) -> &Waker {
        &self.waker
    }
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

    /// Submit queued IO and, when `sleep`, wait until there is something to do, at most
    /// `max_wait`. A message taken from the inbox while deciding or sleeping is returned.
    /// `job_fds[1..]` are the descriptors waiting jobs named (`job_fds[0]` is this
    /// function's own).
    fn wait(
        &mut self,
        sleep: bool,
        max_wait: Duration,
        inbox: &Receiver<ToReactor>,
        bell: &Doorbell,
        job_fds: &mut [libc::pollfd],
    ) -> Result<Option<ToReactor>, String> {
        // With jobs (`job_fds` holds the wait's own slot then), sleep in poll(2): jobs wait
        // on their descriptors, and on replies that ring the doorbell.
        let jobs_wait = !job_fds.is_empty();
        match self {
            Backend::Uring(d) if sleep && jobs_wait => {
                d.submit_ring(0, None).map_err(|e| e.to_string())?;
                // The ring's descriptor turns readable with a completion (the armed waker's
                // too); one already taken out of the ring would not: then no sleep.
                let own_fd = (!d.ring().has_local_completions()).then(|| d.ring().raw_fd());
                Ok(sleep_with_jobs(bell, inbox, job_fds, own_fd, max_wait))
            }
            Backend::Uring(d) if sleep => {
                bell.announce_sleep();
                let result = match inbox.try_recv() {
                    // A message slipped in: no sleep, but send what is queued.
                    Ok(message) => d.submit_ring(0, None).map(|_| Some(message)),
                    Err(_) => d.submit_ring(1, Some(max_wait)).map(|_| None),
                };
                bell.awake();
                result.map_err(|e| e.to_string())
            }
            Backend::Memory(d) if sleep && jobs_wait => {
                let wait = d.next_due_at().map_or(max_wait, |at| {
                    at.saturating_duration_since(Instant::now()).min(max_wait)
                });
                let message =
                    sleep_with_jobs(bell, inbox, job_fds, Some(bell.waker().raw_fd()), wait);
                // Memory members never arm the waker in a ring: its count is read here.
                bell.waker().drain();
                Ok(message)
            }
            Backend::Uring(d) => d.submit_ring(0, None).map(|_| None).map_err(|e| e.to_string()),
            Backend::Memory(d) if sleep => {
                // Delayed completions (fault injection) are due at a known time.
                let wait = d.next_due_at().map_or(max_wait, |at| {
                    at.saturating_duration_since(Instant::now()).min(max_wait)
                });
                Ok(inbox.recv_timeout(wait).ok())
            }
            Backend::Memory(_) => Ok(None),
        }
    }
}

/// A reactor with jobs, all waiting: announce the sleep and, unless a message or a ring came
/// meanwhile (or `own_fd` is `None`), sleep in `poll(2)` on `own_fd` (what wakes the reactor
/// anyway) and the jobs' descriptors (`job_fds[1..]`). Returns a message taken meanwhile.
fn sleep_with_jobs(
    bell: &Doorbell,
    inbox: &Receiver<ToReactor>,
    job_fds: &mut [libc::pollfd],
    own_fd: Option<std::os::fd::RawFd>,
    timeout: Duration,
) -> Option<ToReactor> {
    bell.announce_sleep();
    let message = inbox.try_recv().ok();
    if let Some(fd) = own_fd.filter(|_| message.is_none() && !bell.take_rung()) {
        job_fds[0] = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        sleep_in_poll(job_fds, timeout);
    }
    bell.awake();
    message
}

/// Sleep until one of `fds` reports an event or `timeout` passes. An interrupted or failed
/// `poll` only ends the sleep early: the reactor's next turn looks at everything again.
fn sleep_in_poll(fds: &mut [libc::pollfd], timeout: Duration) {
    // Round a short wait up to a millisecond (poll's unit); zero stays zero: only a look.
    let millis = if timeout.is_zero() {
        0
    } else {
        i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX)
    };
    let count = libc::nfds_t::try_from(fds.len()).expect("at most SHARD_JOBS_MAX + 1");
    // SAFETY: `fds` is a valid, exclusively borrowed array of `count` pollfd for the call.
    unsafe { libc::poll(fds.as_mut_ptr(), count, millis) };
}

/// Runs one shard until told to stop.
pub(crate) struct Reactor {
    // Field order is drop order: the driver (its ring waits in `drop` for every IO in flight)
    // goes before the shard, whose buffers that IO reads and writes. A reactor stopped with
    // IO in flight (an `Array` dropped without `shutdown`) must not free them first.
    pub driver: Backend,
    pub shard: Shard,
    pub bell: Arc<Doorbell>,
    pub inbox: Receiver<ToReactor>,
    pub events: Sender<crate::array::ToController>,
    pub shard_index: u32,
}

/// Where a session's replies go, and its bell if it sleeps in `poll(2)`.
type SessionLink = (Sender<ShardReply>, Option<Arc<Doorbell>>);

/// What a reactor keeps between turns.
struct TurnState {
    start: Instant,
    sessions: Vec<Option<SessionLink>>,
    held_requests: VecDeque<ShardRequest>,
    held_io: Option<MemberIo>,
    /// Answered with (clean, stopped with only background init's regions left).
    shutdown_ack: Option<Sender<(bool, bool)>>,
    woke_with: Option<ToReactor>,
    jobs: Vec<(ShardJob, Sender<Result<(), String>>)>,
    /// Per job (same index): where it is parked (`JobStatus::Parked`), if it is; `revents`
    /// holds this turn's look at it.
    parked: Vec<Option<libc::pollfd>>,
    /// Scratch for the per-turn look at parked jobs' descriptors (at most `SHARD_JOBS_MAX`).
    parked_fds: Vec<libc::pollfd>,
    /// Turns run, for calling parked jobs now and then.
    turns: u32,
    /// Every job said `Waiting` or `Parked` in the last turn (true with no jobs).
    jobs_waiting: bool,
    /// Slot 0 for `Backend::wait`, then what waiting jobs wait on (at most
    /// `SHARD_JOBS_MAX + 1`, allocated once); empty when the shard has no jobs.
    job_fds: Vec<libc::pollfd>,
}

/// Whether the reactor goes on after a turn.
enum Next {
    /// `foreground`: requests came in or replies went out (not only background work).
    Continue {
        progress: bool,
        foreground: bool,
    },
    Exit,
}

impl Reactor {
    pub fn run(mut self) {
        IN_REACTOR.with(|flag| flag.set(true));
        if let Err(e) = self.driver.arm(&self.bell.waker) {
            panic!("reactor {}: cannot arm its waker: {e}", self.shard_index);
        }
        let mut state = TurnState {
            start: Instant::now(),
            sessions: Vec::new(),
            held_requests: VecDeque::with_capacity(HELD_REQUESTS_MAX),
            held_io: None,
            shutdown_ack: None,
            woke_with: None,
            jobs: Vec::with_capacity(SHARD_JOBS_MAX),
            parked: Vec::with_capacity(SHARD_JOBS_MAX),
            parked_fds: Vec::with_capacity(SHARD_JOBS_MAX),
            turns: 0,
            jobs_waiting: true,
            job_fds: Vec::with_capacity(SHARD_JOBS_MAX + 1),
        };
        let mut idle_since: Option<Instant> = None;
        let mut idle_turns = 0u32;
        loop {
            let (progress, foreground) = match self.turn(&mut state) {
                Next::Continue { progress, foreground } => (progress, foreground),
                Next::Exit => return,
            };
            idle_turns = if progress { 0 } else { idle_turns.saturating_add(1) };
            // Submit what was queued; sleep only when nothing happened for a while and
            // every job waits. The short spin (yielding the core) catches the next request of
            // a busy client without the cost of a sleep and a wake-up, which dominate at high
            // IOPS. With a job running the reactor never sleeps, so it reads no clock for this.
            // A job that did something says `Running`: that counts as work for the spin.
            let busy = progress || !state.jobs_waiting;
            let sleep = match (busy, idle_since) {
                (true, _) => {
                    idle_since = None;
                    false
                }
                (false, None) => {
                    idle_since = Some(Instant::now());
                    false
                }
                (false, Some(since)) => since.elapsed() >= SPIN_BEFORE_SLEEP,
            };
            // A sleep ends by the shard's next timer (writes waiting for the merge window),
            // or after IDLE_WAIT for the timers read from the clock each turn.
            let max_wait = match self.shard.next_deadline_us().filter(|_| sleep) {
                Some(at_us) => Duration::from_micros(at_us.saturating_sub(elapsed_us(state.start)))
                    .min(IDLE_WAIT),
                None => IDLE_WAIT,
            };
            match self.driver.wait(sleep, max_wait, &self.inbox, &self.bell, &mut state.job_fds) {
                Ok(message) => state.woke_with = message,
                Err(e) => panic!("reactor {}: waiting for IO failed: {e}", self.shard_index),
            }
            // Polling with nothing to do: now and then let the kernel's own IO workers
            // (io_uring punts some IO to them) and other threads have this core; a yield is a
            // system call, so not on every idle turn.
            // A turn that did only background work (rebuild, scrub, resync) yields its core:
            // on a machine with no core to spare, the clients' threads would otherwise wait
            // for the scheduler to preempt a reactor that never sleeps.
            let background_only =
                progress && !foreground && state.jobs_waiting && self.shard.background_busy();
            if background_only
                || (!sleep && idle_turns > 0 && idle_turns.is_multiple_of(YIELD_EVERY_IDLE_TURNS))
            {
                std::thread::yield_now();
            }
        }
    }

    fn turn(&mut self, state: &mut TurnState) -> Next {
        let mut progress = false;
        let mut foreground = false;
        // Messages, while there is room to hold requests the shard cannot take yet.
        while state.held_requests.len() < HELD_REQUESTS_MAX {
            let message = match state.woke_with.take() {
                Some(m) => Ok(m),
                None => self.inbox.try_recv(),
            };
            match message {
                Ok(ToReactor::Request(request)) => {
                    progress = true;
                    foreground = true;
                    state.held_requests.push_back(request);
                }
                Ok(ToReactor::Session { id, replies, bell }) => {
                    let id = usize::try_from(id).expect("fits");
                    if state.sessions.len() <= id {
                        state.sessions.resize_with(id + 1, || None);
                    }
                    state.sessions[id] = Some((replies, bell));
                }
                Ok(ToReactor::Control(control)) => {
                    progress = true;
                    match control {
                        Control::ApplyFailed(members) => {
                            self.shard.apply_failed(&members);
                            // What was queued for them would fail or be ignored anyway; left
                            // queued, it could reach a device that later takes the slot.
                            for &m in &members {
                                self.cancel_role_io(&mut state.held_io, m);
                            }
                        }
                        Control::Status(reply) => {
                            let _ = reply.send(self.status());
                        }
                        Control::CleanShutdown(ack) => {
                            self.shard.begin_shutdown();
                            state.shutdown_ack = Some(ack);
                        }
                        Control::RunJob(job, done) => {
                            if state.jobs.len() < SHARD_JOBS_MAX {
                                state.jobs.push((job, done));
                                state.parked.push(None);
                            } else {
                                let _ = done.send(Err(format!(
                                    "shard {} already runs {SHARD_JOBS_MAX} jobs",
                                    self.shard_index
                                )));
                            }
                        }
                        Control::Stop => return Next::Exit,
                        Control::StartRebuild {
                            role,
                            device,
                            from,
                            zeroes_after_discard,
                            partial,
                        } => {
                            // IO for the failed device that never reached the kernel fails:
                            // after the remap it would reach the new one.
                            self.cancel_role_io(&mut state.held_io, role);
                            match &mut self.driver {
                                Backend::Uring(d) => {
                                    d.assign_role(role.get(), u32::try_from(device).expect("fits"))
                                }
                                Backend::Memory(d) => d.assign_role(role.get(), device),
                            }
                            self.shard.start_rebuild(role, from, zeroes_after_discard, partial);
                        }
                        Control::FinishRebuild(role) => self.shard.finish_rebuild(role),
                        Control::ClearMissed => self.shard.clear_missed(),
                        Control::CopyRecording(on, done) => {
                            self.shard.set_copy_recording(on);
                            let _ = done.send(());
                        }
                        Control::SetRebuildRate(rate) => self.shard.set_rebuild_rate(rate),
                        Control::SetRebuildTrustParity(on) => {
                            self.shard.set_rebuild_trust_parity(on)
                        }
                        Control::SetRebuildBusyRate(rate) => self.shard.set_rebuild_busy_rate(rate),
                        Control::SetResyncRate(rate) => self.shard.set_resync_rate(rate),
                        Control::SetMergeWindow(us) => self.shard.set_merge_window_us(us),
                        Control::SetMemberTimeout(us) => self.shard.set_member_io_timeout_us(us),
                        Control::SetScrubRate(rate) => self.shard.set_scrub_rate(rate),
                        Control::StartScrub { repair, rate_bytes_per_s } => {
                            self.shard.start_scrub(repair, rate_bytes_per_s)
                        }
                        Control::StopScrub => self.shard.stop_scrub(),
                        Control::AddDevice { slot, device, done } => {
                            let result = match (&mut self.driver, device) {
                                (Backend::Uring(d), AddedDevice::Fd(fd)) => {
                                    d.ring().update_file(slot, fd).map_err(|e| e.to_string())
                                }
                                (Backend::Memory(d), AddedDevice::Memory(m)) => {
                                    d.add_device(slot, m);
                                    Ok(())
                                }
                                _ => Err("a device of another kind than the array's".to_string()),
                            };
                            let _ = done.send(result);
                        }
                        Control::ReleaseDevice { slot, placeholder, done } => {
                            let result = match &mut self.driver {
                                Backend::Uring(d) => {
                                    // Only failed roles can map here (the device is in
                                    // no role); what they staged must not outlive it.
                                    let shard = &mut self.shard;
                                    let file = u32::try_from(slot).expect("fits");
                                    d.fail_staged_for_file(file, &mut |c| shard.complete_io(c));
                                    d.ring()
                                        .update_file(slot, placeholder)
                                        .map_err(|e| e.to_string())
                                }
                                Backend::Memory(d) => {
                                    d.release_device(slot);
                                    Ok(())
                                }
                            };
                            let _ = done.send(result);
                        }
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Next::Exit,
            }
        }
        while let Some(request) = state.held_requests.pop_front() {
            if let Err(Rejected::Busy(request)) = self.shard.submit(request) {
                state.held_requests.push_front(request);
                break;
            }
        }
        let now_us = elapsed_us(state.start);
        self.shard.tick(now_us);
        progress |= self.push_io(&mut state.held_io);
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
            // A ring of the doorbell ends an io_uring sleep only through the armed waker
            // read: unarmed, the reactor would sleep through every wake. The ring keeps the
            // read its room, so this cannot fail.
            self.driver.arm(&self.bell.waker).unwrap_or_else(|e| {
                panic!("reactor {}: re-arming its waker: {e}", self.shard_index)
            });
        }
        progress |= completed > 0 || woken;
        progress |= self.push_io(&mut state.held_io);
        while let Some(reply) = self.shard.poll_reply() {
            progress = true;
            foreground = true;
            let session =
                usize::try_from(reply.id.0 >> crate::session::SESSION_SHIFT).expect("fits");
            if let Some(Some((tx, bell))) = state.sessions.get(session) {
                // A session that went away drops its reply (and the buffer with it).
                let _ = tx.send(reply);
                if let Some(bell) = bell {
                    bell.ring();
                }
            }
        }
        while let Some(event) = self.shard.poll_event() {
            let _ = self.events.send(crate::array::ToController::Event(self.shard_index, event));
        }
        if let ShutdownState::Done { clean } = self.shard.shutdown_state()
            && let Some(ack) = state.shutdown_ack.take()
        {
            let _ = ack.send((clean, self.shard.stopped_with_only_init_left()));
        }
        // Jobs run last, so what they submit reaches the shard at the top of the next turn
        // (their own replies were routed just above).
        if !state.jobs.is_empty() {
            // Before the jobs look at their sessions: a ring from now on means a reply (or a
            // message) may have come after they looked (`Backend::wait`).
            self.bell.take_rung();
        }
        Self::run_jobs(state);
        Next::Continue { progress, foreground }
    }

    /// Call every job that is not parked, and the parked ones whose descriptor is ready
    /// (or whose turn to be called anyway has come); note what the waiting ones wait on.
    fn run_jobs(state: &mut TurnState) {
        state.turns = state.turns.wrapping_add(1);
        let call_all_parked = state.turns.is_multiple_of(PARKED_CALL_EVERY_TURNS);
        state.parked_fds.clear();
        if !call_all_parked {
            state.parked_fds.extend(state.parked.iter().flatten().copied());
            if !state.parked_fds.is_empty() {
                sleep_in_poll(&mut state.parked_fds, Duration::ZERO);
            }
        }
        // The look's answers go back to the parked entries, in job order (`revents` 0: not
        // ready, skipped this turn).
        let mut looked = state.parked_fds.iter();
        for parked in state.parked.iter_mut().flatten() {
            parked.revents = if call_all_parked {
                libc::POLLIN
            } else {
                looked.next().expect("one entry per parked job").revents
            };
        }
        state.jobs_waiting = true;
        state.job_fds.clear();
        // Slot 0 belongs to `Backend::wait`; the list stays empty with no jobs.
        state.job_fds.push(libc::pollfd { fd: -1, events: 0, revents: 0 });
        let mut index = 0;
        while index < state.jobs.len() {
            if let Some(parked) = state.parked[index].filter(|p| p.revents == 0) {
                state.job_fds.push(parked);
                index += 1;
                continue;
            }
            state.parked[index] = None;
            // A job's state is its own (a connection, its session, its socket): one that
            // panics is dropped alone and the shard, which it reaches only by message, goes
            // on serving the others. The shard's own assertions are outside this and still
            // stop the reactor.
            let job = &mut state.jobs[index].0;
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let status = match called {
                Ok(status) => status,
                Err(payload) => {
                    let (job, done) = state.jobs.swap_remove(index);
                    state.parked.swap_remove(index);
                    // Its drop may panic too, over state the first panic left half done.
                    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        drop(job);
                    }));
                    let why = panic_message(payload.as_ref());
                    let _ = done.send(Err(match dropped {
                        Ok(()) => format!("the job panicked: {why}"),
                        Err(_) => format!("the job panicked ({why}), and again as it was dropped"),
                    }));
                    continue;
                }
            };
            match status {
                JobStatus::Finished => {
                    let (_, done) = state.jobs.swap_remove(index);
                    state.parked.swap_remove(index);
                    let _ = done.send(Ok(()));
                    continue;
                }
                JobStatus::Running => state.jobs_waiting = false,
                JobStatus::Waiting { fd, events } => {
                    if fd >= 0 {
                        state.job_fds.push(libc::pollfd { fd, events, revents: 0 });
                    }
                }
                JobStatus::Parked { fd, events } => {
                    let entry = libc::pollfd { fd, events, revents: 0 };
                    state.parked[index] = Some(entry);
                    state.job_fds.push(entry);
                }
            }
            index += 1;
        }
        if state.jobs.is_empty() {
            state.job_fds.clear();
        }
    }

    /// IO meant for failed `role`'s device that has not reached the kernel fails as `Gone`:
    /// the IO held back for a full ring, the shard's queue, and the driver's staged runs for
    /// the role's file (unless another role in service maps to that file: a failed member's
    /// device re-added into another role). The role's file may later hold another device,
    /// or the role another file; either must never receive IO meant for the old one.
    fn cancel_role_io(&mut self, held: &mut Option<MemberIo>, role: MemberIndex) {
        if let Some(io) = held.take_if(|io| io.member == role) {
            self.shard.complete_unsubmitted_io(flashraid_engine::MemberCompletion {
                token: io.token,
                result: Err(flashraid_engine::IoError::Gone),
            });
        }
        self.shard.cancel_queued_io(role);
        if let Backend::Uring(d) = &mut self.driver {
            let file = d.role_file(role.get());
            let roles = self.shard.geometry().member_count();
            let shared = (0..roles).any(|r| {
                let other = MemberIndex(u16::try_from(r).expect("fits"));
                r != role.get()
                    && d.role_file(r) == file
                    && self.shard.member_health(other) != Health::Failed
            });
            if !shared {
                let shard = &mut self.shard;
                d.fail_staged_for_file(file, &mut |c| shard.complete_io(c));
            }
        }
    }

    /// Move the shard's IO into the ring until it is full. True if anything moved.
    fn push_io(&mut self, held: &mut Option<MemberIo>) -> bool {
        let mut moved = false;
        loop {
            let Some(io) = held.take().or_else(|| self.shard.poll_io()) else { return moved };
            let (member, token) = (io.member, io.token);
            match self.driver.driver().submit(io) {
                Ok(()) => {
                    self.shard.io_submitted(member, token);
                    moved = true;
                }
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
            resync_pending: self.shard.resync_pending(),
            bitmap_regions_set: self.shard.bitmap_regions_set(),
            member_reads_retried: match &self.driver {
                Backend::Uring(d) => d.reads_retried(),
                Backend::Memory(_) => 0,
            },
            member_ios_merged: match &self.driver {
                Backend::Uring(d) => d.merged_pushed(),
                Backend::Memory(_) => 0,
            },
            idle: self.shard.is_idle(),
            rebuild: self.shard.rebuild_status(),
            scrub: self.shard.scrub_status(),
        }
    }
}

/// A panic's message, where it carries one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "no message"
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
