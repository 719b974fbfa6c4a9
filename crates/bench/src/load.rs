//! Load generators for `flashraid bench engine`: one drives the raw member files directly
//! with io_uring (the "hardware" column), the other drives a flashraid array through
//! sessions. Both keep `queue_depth` IOs in flight per job thread for a fixed time and record
//! every IO's latency in a fixed histogram (no allocation per IO).
//!
//! The raw generator is IO-layer code: it lends buffers to the kernel through the ring, the
//! one `unsafe` in this crate, under the ring's contract (buffers stay put until reaped).

use cpu_time::ProcessTime;
use flashraid_engine::{ArrayOp, Durability};
use flashraid_iobuf::IoBuf;
use flashraid_layout::ArrayOffset;
use flashraid_runtime::{Array, Event, JobStatus, MemMember, ShardJob};
use flashraid_uring::{Device, Op, Ring, check_transfer};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Latency buckets of 1 µs up to this, then one overflow bucket.
const HISTOGRAM_US_MAX: usize = 200_000;

/// Per-IO latencies, microsecond resolution.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
}

impl Histogram {
    pub fn new() -> Self {
        Self { buckets: vec![0; HISTOGRAM_US_MAX + 1], count: 0 }
    }

    pub fn record(&mut self, latency: Duration) {
        let us = usize::try_from(latency.as_micros()).unwrap_or(usize::MAX).min(HISTOGRAM_US_MAX);
        self.buckets[us] += 1;
        self.count += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
    }

    /// IOs recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean latency in µs at the histogram's 1 µs resolution (`None` when empty).
    pub fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| {
            let sum: u64 = self.buckets.iter().enumerate().map(|(us, &n)| us as u64 * n).sum();
            sum as f64 / self.count as f64
        })
    }

    /// The largest latency recorded, in µs (the overflow bucket counts as its bound).
    pub fn max_us(&self) -> Option<f64> {
        self.buckets.iter().rposition(|&n| n > 0).map(|us| us as f64)
    }

    /// The latency below which `fraction` of IOs completed, in µs.
    pub fn percentile_us(&self, fraction: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let target = (self.count as f64 * fraction).ceil() as u64;
        let mut seen = 0;
        for (us, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return us as f64;
            }
        }
        HISTOGRAM_US_MAX as f64
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// What a load run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Measured {
    pub ios: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub bytes_per_second: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    /// Process CPU time (every thread) per IO.
    pub cpu_us_per_io: f64,
}

fn measured(
    ios: u64,
    bytes: u64,
    wall: Duration,
    cpu: Duration,
    histogram: &Histogram,
) -> Measured {
    let seconds = wall.as_secs_f64().max(1e-9);
    Measured {
        ios,
        bytes,
        seconds,
        iops: ios as f64 / seconds,
        bytes_per_second: bytes as f64 / seconds,
        latency_us_p50: histogram.percentile_us(0.50),
        latency_us_p99: histogram.percentile_us(0.99),
        latency_us_p999: histogram.percentile_us(0.999),
        cpu_us_per_io: cpu.as_secs_f64() * 1e6 / (ios.max(1) as f64),
    }
}

/// Add up the jobs' counts and latencies into one measurement.
fn combine(
    results: impl IntoIterator<Item = Result<(u64, u64, Histogram), String>>,
    wall: Duration,
    cpu: Duration,
) -> Result<Measured, String> {
    let (mut ios, mut bytes) = (0, 0);
    let mut histogram = Histogram::new();
    for result in results {
        let (i, b, h) = result?;
        ios += i;
        bytes += b;
        histogram.merge(&h);
    }
    Ok(measured(ios, bytes, wall, cpu, &histogram))
}

/// The shape of a load.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    pub block_bytes: u32,
    /// Share of IOs that read, 0 to 100; each IO draws its kind from the job's seeded RNG.
    pub read_percent: u8,
    pub sequential: bool,
}

impl Pattern {
    /// Whether the next IO writes.
    fn draw_write(&self, rng: &mut SmallRng) -> bool {
        match self.read_percent {
            100.. => false,
            0 => true,
            p => rng.random_range(0..100u8) >= p,
        }
    }

    /// Whether any IO writes (write data is prepared only then).
    pub fn writes(&self) -> bool {
        self.read_percent < 100
    }
}

/// Where the raw members' data areas are.
#[derive(Clone, Copy, Debug)]
pub struct RawArea {
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// Drive the member devices directly: each job thread has its own ring with every member
/// registered; random IOs pick a member and an offset uniformly, sequential IOs stream
/// through each member in turn.
pub fn run_raw(
    devices: &[Device],
    area: RawArea,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Measured, String> {
    let fds: Vec<i32> = devices.iter().map(|d| d.raw_fd()).collect();
    let cpu_start = ProcessTime::now();
    let start = Instant::now();
    let results: Vec<Result<(u64, u64, Histogram), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|job| {
                let fds = fds.clone();
                scope.spawn(move || {
                    raw_job(&fds, area, pattern, job, jobs, queue_depth, duration, seed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| "raw job panicked".to_string())?).collect()
    });
    let wall = start.elapsed();
    let cpu = cpu_start.elapsed();
    combine(results, wall, cpu)
}

#[allow(clippy::too_many_arguments)]
fn raw_job(
    fds: &[i32],
    area: RawArea,
    pattern: Pattern,
    job: usize,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<(u64, u64, Histogram), String> {
    let entries = u32::try_from((queue_depth * 2).next_power_of_two()).unwrap_or(1024).min(4096);
    let mut ring = Ring::new(entries).map_err(|e| e.to_string())?;
    ring.register_files(fds).map_err(|e| e.to_string())?;
    let block = u64::from(pattern.block_bytes);
    let mut bufs: Vec<IoBuf> =
        (0..queue_depth).map(|_| IoBuf::new(usize::try_from(block).expect("fits"))).collect();
    for b in &mut bufs {
        b.as_mut_slice().fill(0x5a);
    }
    let mut started = vec![Instant::now(); queue_depth];
    let mut rng = SmallRng::seed_from_u64(seed ^ (job as u64) << 32);
    let members = fds.len();
    let blocks_per_member = area.len_bytes / block;
    // Sequential: each job owns a slice of every member and walks it.
    let slice_blocks = (blocks_per_member / jobs as u64).max(1);
    let mut cursor = vec![0u64; members];
    let mut next_member = 0usize;
    let mut histogram = Histogram::new();
    let (mut ios, mut bytes) = (0u64, 0u64);
    let deadline = Instant::now() + duration;
    let mut issue =
        |slot: usize, ring: &mut Ring, bufs: &mut Vec<IoBuf>, started: &mut Vec<Instant>| {
            let (member, block_index) = if pattern.sequential {
                let m = next_member;
                next_member = (next_member + 1) % members;
                let b = job as u64 * slice_blocks + cursor[m] % slice_blocks;
                cursor[m] += 1;
                (m, b.min(blocks_per_member - 1))
            } else {
                (rng.random_range(0..members), rng.random_range(0..blocks_per_member))
            };
            let offset_bytes = area.offset_bytes + block_index * block;
            let file = u32::try_from(member).expect("fits");
            // Timed from here, so the stamp counts as it does on the array's side.
            started[slot] = Instant::now();
            let write = pattern.draw_write(&mut rng);
            if write {
                stamp(bufs[slot].as_mut_slice(), offset_bytes);
            }
            let ptr = bufs[slot].as_mut_ptr();
            let op = if write {
                Op::Write {
                    file,
                    offset_bytes,
                    ptr: ptr.cast_const(),
                    len_bytes: pattern.block_bytes,
                    fua: false,
                }
            } else {
                Op::Read { file, offset_bytes, ptr, len_bytes: pattern.block_bytes }
            };
            // SAFETY: the buffer for `slot` is not touched until its completion is reaped (the
            // slot is reused only after that), and the ring outlives every op it holds.
            unsafe { ring.push(op, slot as u64) }.map_err(|e| e.to_string())
        };
    for slot in 0..queue_depth {
        issue(slot, &mut ring, &mut bufs, &mut started)?;
    }
    let mut in_flight = queue_depth;
    while in_flight > 0 {
        ring.submit(1, Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
        let mut done: Vec<(usize, i32)> = Vec::with_capacity(queue_depth);
        ring.reap(|user_data, result| {
            done.push((usize::try_from(user_data).expect("fits"), result))
        });
        for (slot, result) in done {
            check_transfer(result, pattern.block_bytes)
                .map_err(|e| format!("raw IO failed: {e:?}"))?;
            histogram.record(started[slot].elapsed());
            ios += 1;
            bytes += block;
            if Instant::now() < deadline {
                issue(slot, &mut ring, &mut bufs, &mut started)?;
            } else {
                in_flight -= 1;
            }
        }
    }
    Ok((ios, bytes, histogram))
}

/// Drive in-memory members directly: the "hardware" column of the memory backend. Each job
/// copies blocks between its own buffer and the members, one IO at a time (a memory copy
/// has no queue to keep full), with the same block size and placement as `run_raw`.
pub fn run_raw_memory(
    members: &[Arc<MemMember>],
    area: RawArea,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Measured, String> {
    let cpu_start = ProcessTime::now();
    let start = Instant::now();
    let results: Vec<Result<(u64, u64, Histogram), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|job| {
                scope.spawn(move || {
                    memory_job(members, area, pattern, job, jobs, queue_depth, duration, seed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| "raw job panicked".to_string())?).collect()
    });
    let wall = start.elapsed();
    let cpu = cpu_start.elapsed();
    combine(results, wall, cpu)
}

#[allow(clippy::too_many_arguments)]
fn memory_job(
    members: &[Arc<MemMember>],
    area: RawArea,
    pattern: Pattern,
    job: usize,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<(u64, u64, Histogram), String> {
    let block = u64::from(pattern.block_bytes);
    // As many buffers as a device at this queue depth would transfer into, used in turn: one
    // buffer reused for every copy stays in the CPU's cache and makes a large copy faster
    // than any load with `queue_depth` requests in flight can be (1 MiB copies: 17 GB/s
    // into one buffer, 12 GB/s into 32 on this machine). The array's loads rotate through
    // their session's buffers the same way.
    let buf_bytes = usize::try_from(block).map_err(|_| "block")?;
    let mut bufs = vec![vec![0x5au8; buf_bytes]; queue_depth.max(1)];
    let mut rng = SmallRng::seed_from_u64(seed ^ (job as u64) << 32);
    let blocks_per_member = area.len_bytes / block;
    let slice_blocks = (blocks_per_member / jobs as u64).max(1);
    let mut cursor = vec![0u64; members.len()];
    let mut next_member = 0usize;
    let mut histogram = Histogram::new();
    let (mut ios, mut bytes) = (0u64, 0u64);
    let deadline = Instant::now() + duration;
    // Check the clock every few IOs only: a memory copy of 4 KiB is cheaper than a clock read.
    while ios % 64 != 0 || Instant::now() < deadline {
        let (member, block_index) = if pattern.sequential {
            let m = next_member;
            next_member = (next_member + 1) % members.len();
            let b = job as u64 * slice_blocks + cursor[m] % slice_blocks;
            cursor[m] += 1;
            (m, b.min(blocks_per_member - 1))
        } else {
            (rng.random_range(0..members.len()), rng.random_range(0..blocks_per_member))
        };
        let offset_bytes = area.offset_bytes + block_index * block;
        let started = Instant::now();
        let turn = usize::try_from(ios % bufs.len() as u64).expect("below the buffer count");
        let buf = &mut bufs[turn];
        if pattern.draw_write(&mut rng) {
            stamp(buf, offset_bytes);
            members[member].write(buf, offset_bytes)?;
        } else {
            members[member].read(buf, offset_bytes)?;
        }
        histogram.record(started.elapsed());
        ios += 1;
        bytes += block;
    }
    Ok((ios, bytes, histogram))
}

/// Drive an array through sessions, one per job thread.
pub fn run_array(
    array: &Array,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Measured, String> {
    let size = array.size_bytes();
    run_jobs(jobs, |job| {
        array_job(array, size, pattern, job, jobs, queue_depth, duration, seed).map(Split::total)
    })
}

/// One direction's IOs of a load run.
#[derive(Clone, Debug)]
pub struct Tally {
    pub ios: u64,
    pub bytes: u64,
    pub histogram: Histogram,
}

impl Tally {
    fn new() -> Tally {
        Tally { ios: 0, bytes: 0, histogram: Histogram::new() }
    }

    fn merge(&mut self, other: &Tally) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.histogram.merge(&other.histogram);
    }
}

/// A load run's reads and writes apart, over the wall time of the run.
#[derive(Clone, Debug)]
pub struct Split {
    pub read: Tally,
    pub write: Tally,
    pub seconds: f64,
}

impl Split {
    fn total(self) -> (u64, u64, Histogram) {
        let mut all = self.read;
        all.merge(&self.write);
        (all.ios, all.bytes, all.histogram)
    }
}

/// [`run_array`] with reads and writes measured apart (for the lab's fio-shaped results).
pub fn run_array_split(
    array: &Array,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Split, String> {
    let size = array.size_bytes();
    let start = Instant::now();
    let results = on_threads(jobs, |job| {
        array_job(array, size, pattern, job, jobs, queue_depth, duration, seed)
    });
    let mut split = Split { read: Tally::new(), write: Tally::new(), seconds: 0.0 };
    for result in results {
        let one = result?;
        split.read.merge(&one.read);
        split.write.merge(&one.write);
    }
    split.seconds = start.elapsed().as_secs_f64().max(1e-9);
    Ok(split)
}

/// Run `job(0..jobs)` on threads of their own and combine what they measured (wall time and
/// the process's CPU time over all of them).
fn run_jobs(
    jobs: usize,
    job: impl Fn(usize) -> Result<(u64, u64, Histogram), String> + Sync,
) -> Result<Measured, String> {
    let cpu_start = ProcessTime::now();
    let start = Instant::now();
    let results = on_threads(jobs, job);
    combine(results, start.elapsed(), cpu_start.elapsed())
}

/// `job(0..jobs)`, each on a thread of its own; their results in job order.
fn on_threads<T: Send>(
    jobs: usize,
    job: impl Fn(usize) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|scope| {
        let job = &job;
        let handles: Vec<_> = (0..jobs).map(|j| scope.spawn(move || job(j))).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "array job panicked".to_string())?)
            .collect()
    })
}

/// Take a session's finished IOs: their tags into `finished`; the first error, if any.
fn collect_finished(
    session: &mut flashraid_runtime::Session,
    wait: bool,
    finished: &mut Vec<usize>,
) -> Result<(), String> {
    let mut failure: Option<String> = None;
    session.poll(wait, &mut |event| {
        if let Event::Done { tag, result } = event {
            if let Err(e) = result {
                failure.get_or_insert(e.to_string());
            }
            finished.push(usize::try_from(tag).expect("fits"));
        }
    });
    failure.map_or(Ok(()), |e| Err(format!("array IO failed: {e}")))
}

#[allow(clippy::too_many_arguments)]
fn array_job(
    array: &Array,
    size: u64,
    pattern: Pattern,
    job: usize,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Split, String> {
    let mut session = array.session().map_err(|e| e.to_string())?;
    let block = u64::from(pattern.block_bytes);
    let mut ops = OpGen::new(size, pattern, job, jobs, seed);
    let mut started = vec![Instant::now(); queue_depth];
    let mut writes = vec![false; queue_depth];
    let mut split = Split { read: Tally::new(), write: Tally::new(), seconds: 0.0 };
    let begun = Instant::now();
    let deadline = begun + duration;
    for slot in 0..queue_depth {
        let op = ops.next();
        started[slot] = Instant::now();
        writes[slot] = matches!(op, ArrayOp::Write { .. });
        submit_retrying(&mut session, op, slot as u64)?;
    }
    let mut in_flight = queue_depth;
    let mut finished: Vec<usize> = Vec::with_capacity(queue_depth);
    while in_flight > 0 {
        finished.clear();
        collect_finished(&mut session, true, &mut finished)?;
        for &slot in &finished {
            let tally = if writes[slot] { &mut split.write } else { &mut split.read };
            tally.histogram.record(started[slot].elapsed());
            tally.ios += 1;
            tally.bytes += block;
            if Instant::now() < deadline {
                let op = ops.next();
                started[slot] = Instant::now();
                writes[slot] = matches!(op, ArrayOp::Write { .. });
                submit_retrying(&mut session, op, slot as u64)?;
            } else {
                in_flight -= 1;
            }
        }
    }
    split.seconds = begun.elapsed().as_secs_f64();
    Ok(split)
}

/// Drive an array through sessions like `run_array`, but paced: the jobs together start at
/// most `target_iops` IOs per second (each its share, on a fixed schedule), so latency is
/// measured at a given load rather than at saturation.
#[allow(clippy::too_many_arguments)]
pub fn run_array_paced(
    array: &Array,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
    target_iops: f64,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Measured, String> {
    let size = array.size_bytes();
    let share = target_iops / jobs.max(1) as f64;
    run_jobs(jobs, |job| {
        paced_job(array, size, pattern, (job, jobs, queue_depth, duration, seed, share), stop)
    })
}

/// A paced job sleeps only when its next request is due further off than this; closer, it
/// yields instead.
const PACED_SLEEP_FROM: Duration = Duration::from_micros(200);

fn paced_job(
    array: &Array,
    size: u64,
    pattern: Pattern,
    (job, jobs, queue_depth, duration, seed, iops): (usize, usize, usize, Duration, u64, f64),
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<(u64, u64, Histogram), String> {
    let mut session = array.session().map_err(|e| e.to_string())?;
    let block = u64::from(pattern.block_bytes);
    let mut ops = OpGen::new(size, pattern, job, jobs, seed);
    let start = Instant::now();
    let mut started = vec![start; queue_depth];
    let mut free: Vec<usize> = (0..queue_depth).collect();
    let mut histogram = Histogram::new();
    let (mut ios, mut bytes, mut issued) = (0u64, 0u64, 0u64);
    let mut finished: Vec<usize> = Vec::with_capacity(queue_depth);
    loop {
        let elapsed = start.elapsed();
        let stopped = stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
        let done = elapsed >= duration || stopped;
        // Latency counts from the scheduled time: a load that falls behind shows it.
        let due = (elapsed.as_secs_f64() * iops) as u64;
        while !done && issued < due {
            let Some(slot) = free.pop() else { break };
            let op = ops.next();
            started[slot] = start + Duration::from_secs_f64(issued as f64 / iops);
            submit_retrying(&mut session, op, slot as u64)?;
            issued += 1;
        }
        let in_flight = queue_depth - free.len();
        if done && in_flight == 0 {
            break;
        }
        finished.clear();
        if in_flight > 0 {
            collect_finished(&mut session, false, &mut finished)?;
        }
        if finished.is_empty() {
            // Wait for the next due request or a completion. Near term (the next request is
            // due within microseconds at these rates): yield the core, as the saturating
            // jobs' polls do; a timed sleep costs a timer and its slack (tens of
            // microseconds), which at half of the saturating rate left the generator itself
            // behind schedule (p99 in milliseconds with the array idle).
            let next_due = start + Duration::from_secs_f64(issued as f64 / iops);
            let wait = next_due.saturating_duration_since(Instant::now());
            if wait > PACED_SLEEP_FROM {
                std::thread::sleep(wait - PACED_SLEEP_FROM);
            } else {
                std::thread::yield_now();
            }
        }
        for &slot in &finished {
            histogram.record(started[slot].elapsed());
            ios += 1;
            bytes += block;
            free.push(slot);
        }
    }
    Ok((ios, bytes, histogram))
}

/// How array load reaches the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Drive {
    /// One thread per job, handing requests to the reactor threads (how a program with its
    /// own threads embeds flashraid).
    Threads,
    /// Jobs run inside the reactor threads, polling (`Array::run_on_shards`): no hand-off on
    /// the client side, reactors never sleep while jobs run.
    Pollers,
}

/// The next request of one job: random over the whole array, or sequential through the job's
/// own slice of it.
struct OpGen {
    pattern: Pattern,
    block: u64,
    blocks: u64,
    slice: u64,
    job: u64,
    cursor: u64,
    rng: SmallRng,
}

impl OpGen {
    fn new(size: u64, pattern: Pattern, job: usize, jobs: usize, seed: u64) -> Self {
        let block = u64::from(pattern.block_bytes);
        let blocks = size / block;
        Self {
            pattern,
            block,
            blocks,
            slice: (blocks / jobs as u64).max(1),
            job: job as u64,
            cursor: 0,
            rng: SmallRng::seed_from_u64(seed ^ (job as u64) << 40),
        }
    }

    fn next(&mut self) -> ArrayOp {
        let index = if self.pattern.sequential {
            let i = self.job * self.slice + self.cursor % self.slice;
            self.cursor += 1;
            i.min(self.blocks - 1)
        } else {
            self.rng.random_range(0..self.blocks)
        };
        let offset = ArrayOffset(index * self.block);
        if self.pattern.draw_write(&mut self.rng) {
            ArrayOp::Write { offset, len_bytes: self.block, durability: Durability::Cached }
        } else {
            ArrayOp::Read { offset, len_bytes: self.block }
        }
    }
}

/// One job of the poller mode: all its state, advanced once per reactor turn.
struct PollerJob {
    session: flashraid_runtime::Session,
    ops: OpGen,
    started: Vec<Instant>,
    finished: Vec<usize>,
    queue_depth: usize,
    in_flight: usize,
    primed: bool,
    deadline: Instant,
    ios: u64,
    bytes: u64,
    histogram: Histogram,
    failure: Option<String>,
    report: std::sync::mpsc::Sender<Result<(u64, u64, Histogram), String>>,
}

impl PollerJob {
    fn submit(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        let op = self.ops.next();
        self.started[slot] = now;
        submit_retrying(&mut self.session, op, slot as u64)
    }

    fn turn(&mut self) -> JobStatus {
        if !self.primed {
            self.primed = true;
            self.deadline = Instant::now() + (self.deadline - self.started[0]);
            let now = Instant::now();
            for slot in 0..self.queue_depth {
                if let Err(e) = self.submit(slot, now) {
                    return self.end(Err(e));
                }
                self.in_flight += 1;
            }
            self.session.kick();
            return JobStatus::Running;
        }
        let mut finished = std::mem::take(&mut self.finished);
        let failure = &mut self.failure;
        self.session.poll(false, &mut |event| {
            if let Event::Done { tag, result } = event {
                if let Err(e) = result {
                    failure.get_or_insert(e.to_string());
                }
                finished.push(usize::try_from(tag).expect("fits"));
            }
        });
        if let Some(e) = self.failure.take() {
            return self.end(Err(format!("array IO failed: {e}")));
        }
        if finished.is_empty() {
            self.finished = finished;
            return JobStatus::Running;
        }
        let now = Instant::now();
        let more = now < self.deadline;
        for &slot in &finished {
            self.histogram.record(now - self.started[slot]);
            self.ios += 1;
            self.bytes += self.ops.block;
            if more {
                if let Err(e) = self.submit(slot, now) {
                    return self.end(Err(e));
                }
            } else {
                self.in_flight -= 1;
            }
        }
        finished.clear();
        self.finished = finished;
        if self.in_flight == 0 {
            let result = Ok((self.ios, self.bytes, std::mem::take(&mut self.histogram)));
            return self.end(result);
        }
        JobStatus::Running
    }

    fn end(&mut self, result: Result<(u64, u64, Histogram), String>) -> JobStatus {
        let _ = self.report.send(result);
        JobStatus::Finished
    }
}

/// Array load in poller mode (see [`Drive::Pollers`]): `jobs` jobs spread over the shards.
pub fn run_array_pollers(
    array: &Array,
    pattern: Pattern,
    jobs: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<Measured, String> {
    let size = array.size_bytes();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut list: Vec<ShardJob> = Vec::with_capacity(jobs);
    for job in 0..jobs {
        let now = Instant::now();
        let mut state = PollerJob {
            session: array.session().map_err(|e| e.to_string())?,
            ops: OpGen::new(size, pattern, job, jobs, seed),
            started: vec![now; queue_depth.max(1)],
            finished: Vec::with_capacity(queue_depth),
            queue_depth,
            in_flight: 0,
            primed: false,
            // Re-based when the job first runs (`turn`): the duration counts from there.
            deadline: now + duration,
            ios: 0,
            bytes: 0,
            histogram: Histogram::new(),
            failure: None,
            report: tx.clone(),
        };
        list.push(Box::new(move || state.turn()));
    }
    drop(tx);
    let cpu_start = ProcessTime::now();
    let start = Instant::now();
    array.run_on_shards(list).map_err(|e| e.to_string())?;
    let wall = start.elapsed();
    let cpu = cpu_start.elapsed();
    combine(rx.iter(), wall, cpu)
}

/// Write the offset of every 4 KiB block of `buf` into its first 8 bytes: the data a load's
/// write produces. Both columns do it per write (the raw generators in their IO buffer, the
/// array's clients in the session's buffers), so each write carries data of its own at the
/// same small cost on both sides.
pub(crate) fn stamp(buf: &mut [u8], offset_bytes: u64) {
    for (i, block) in buf.chunks_mut(STAMP_BLOCK_BYTES).enumerate() {
        let at = offset_bytes + (i * STAMP_BLOCK_BYTES) as u64;
        let n = block.len().min(8);
        block[..n].copy_from_slice(&at.to_le_bytes()[..n]);
    }
}

const STAMP_BLOCK_BYTES: usize = 4096;

/// Submit one request. A write's data is produced in place, in the session's own buffers
/// (`Session::submit_filled`, which the NBD server uses for a payload it reads from its
/// socket), as a client that avoids a copy does; see [`stamp`]. The bench sizes the
/// session's buffers for its queue depth, so a full session means that sizing is wrong: say
/// so rather than measure something else.
fn submit_retrying(
    session: &mut flashraid_runtime::Session,
    op: ArrayOp,
    tag: u64,
) -> Result<(), String> {
    let result = match op {
        ArrayOp::Write { offset, .. } => session.submit_filled(op, tag, &mut |at, piece| {
            stamp(piece, offset.0 + at);
            Ok(())
        }),
        _ => session.submit(op, None, tag),
    };
    match result {
        Ok(()) => Ok(()),
        Err(flashraid_runtime::SubmitError::Full) => {
            Err("session buffers exhausted: the bench's session_buffer_bytes is too small"
                .to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut h = Histogram::new();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.percentile_us(0.5), 50.0);
        assert_eq!(h.percentile_us(0.99), 99.0);
        assert_eq!(h.percentile_us(1.0), 100.0);
        h.record(Duration::from_secs(10));
        assert_eq!(h.percentile_us(1.0), HISTOGRAM_US_MAX as f64);
    }

    #[test]
    fn a_stamp_marks_every_block_with_its_offset() {
        let mut buf = vec![0u8; 3 * 4096];
        stamp(&mut buf, 1 << 20);
        for i in 0..3 {
            let at = u64::from_le_bytes(buf[i * 4096..i * 4096 + 8].try_into().unwrap());
            assert_eq!(at, (1 << 20) + (i as u64) * 4096);
            assert!(buf[i * 4096 + 8..(i + 1) * 4096].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn mean_and_max() {
        let mut h = Histogram::new();
        assert_eq!((h.mean_us(), h.max_us()), (None, None));
        for us in [10u64, 20, 30, 100] {
            h.record(Duration::from_micros(us));
        }
        assert_eq!((h.mean_us(), h.max_us(), h.count()), (Some(40.0), Some(100.0), 4));
    }

    /// The split run counts reads and writes apart, in the element's mix, and together they
    /// are what the combined run would report.
    #[test]
    fn split_runs_count_reads_and_writes_apart() {
        use flashraid_control::{Init, Overwrite};
        use flashraid_runtime::{CreateSpec, OpenOptions, create_in_memory};
        let members: Vec<_> = (0..4).map(|i| MemMember::new(&format!("m{i}"), 16 << 20)).collect();
        let spec = CreateSpec {
            name: "split".into(),
            level: flashraid_layout::Level::Raid5,
            chunk_bytes: 16 << 10,
            members: vec![],
            spares: vec![],
            create_files_bytes: None,
            overwrite: Overwrite::Refuse,
            init: Some(Init::Zero),
            bitmap_region_bytes: None,
            shards: 1,
            tunables: Default::default(),
        };
        create_in_memory(&spec, &members).unwrap();
        let mut options = OpenOptions::recommended();
        options.shards = Some(1);
        let array = Array::open_in_memory(&members, &options).unwrap();
        let mixed = Pattern { block_bytes: 4096, read_percent: 70, sequential: false };
        let split = run_array_split(&array, mixed, 2, 4, Duration::from_millis(300), 7).unwrap();
        let (r, w) = (split.read.ios, split.write.ios);
        assert!(r > 0 && w > 0, "{r} reads, {w} writes");
        let share = r as f64 / (r + w) as f64;
        assert!((0.6..0.8).contains(&share), "read share {share}");
        assert_eq!(split.read.bytes, r * 4096);
        assert_eq!(split.read.histogram.count() + split.write.histogram.count(), r + w);
        let reads = Pattern { read_percent: 100, ..mixed };
        let only = run_array_split(&array, reads, 1, 2, Duration::from_millis(100), 7).unwrap();
        assert!(only.read.ios > 0 && only.write.ios == 0);
        array.shutdown().unwrap();
    }
}
