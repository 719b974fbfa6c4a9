//! `flashraid bench engine`: the array engine in-process against its own members.
//!
//! Method: member files are created (on tmpfs by default, where O_DIRECT works), an array is
//! created on them and filled once sequentially. Then, for each workload and repetition, the
//! same load runs first on the raw member files (io_uring, O_DIRECT, same block size, jobs
//! and queue depth: the "hardware" column) and then on the array, one after the other in the
//! same run. Each figure is the median of the repetitions; ratios compare figures of the same
//! run. CPU time is the whole process's (every thread) per IO.
//!
//! Bounds (what the array could at best do, from the raw figures of the same repetition):
//! - random reads and sequential reads: the raw figure (every member serves data; parity
//!   chunks are skipped);
//! - random small writes: read-modify-write costs (1 + m) reads and (1 + m) writes per write,
//!   so the bound is `1 / ((1+m)/R + (1+m)/W)` with R, W the raw random read and write IOPS;
//!   mirrors write every copy: `W / copies`;
//! - full-stripe sequential writes: `(N - M) / N` of the raw write bandwidth (mirrors:
//!   `1 / copies`);
//! - a custom load (`--pattern`, `--block-size`, `--read-percent`): the raw run has the same
//!   shape; an array read costs one member IO, a write `copies` (mirrors), 2(1+m) (random, on
//!   parity levels: read-modify-write) or N/(N-M) of its bytes (sequential, whole stripes).
//!   A model, not a measurement: it ignores that member reads and writes cost differently.

use crate::load::{
    Drive, Measured, Pattern, RawArea, run_array, run_array_pollers, run_raw, run_raw_memory,
};
use crate::median;
use flashraid_control::{Init, Overwrite};
use flashraid_layout::Level;
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create, create_in_memory};
use flashraid_uring::Device;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where the members live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// Files in `dir`, driven through io_uring with O_DIRECT.
    Files,
    /// Process memory: the engine alone, no kernel in the IO path.
    Memory,
}

/// A workload of the engine benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    RandRead4k,
    RandWrite4k,
    SeqRead128k,
    SeqRead1m,
    /// Sequential writes of whole stripes.
    SeqWriteStripe,
    /// A load of the user's shape (`--pattern`, `--block-size`, `--read-percent`).
    Custom {
        sequential: bool,
        block_bytes: u32,
        read_percent: u8,
    },
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::RandRead4k,
        Workload::RandWrite4k,
        Workload::SeqRead128k,
        Workload::SeqRead1m,
        Workload::SeqWriteStripe,
    ];

    pub fn name(self) -> String {
        match self {
            Workload::RandRead4k => "randread-4k".into(),
            Workload::RandWrite4k => "randwrite-4k".into(),
            Workload::SeqRead128k => "seqread-128k".into(),
            Workload::SeqRead1m => "seqread-1m".into(),
            Workload::SeqWriteStripe => "seqwrite-stripe".into(),
            Workload::Custom { sequential, block_bytes, read_percent } => format!(
                "{}-{}k-r{read_percent}",
                if sequential { "seq" } else { "rand" },
                block_bytes >> 10
            ),
        }
    }

    pub fn parse(text: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == text)
    }

    /// (array pattern, raw pattern): block sizes may differ (a full stripe on the array is
    /// 128 KiB pieces on the members).
    fn patterns(self, stripe_bytes: u32) -> (Pattern, Pattern) {
        let p = |block_bytes, write: bool, sequential| Pattern {
            block_bytes,
            read_percent: if write { 0 } else { 100 },
            sequential,
        };
        match self {
            Workload::RandRead4k => (p(4096, false, false), p(4096, false, false)),
            Workload::RandWrite4k => (p(4096, true, false), p(4096, true, false)),
            Workload::SeqRead128k => (p(131072, false, true), p(131072, false, true)),
            Workload::SeqRead1m => (p(1 << 20, false, true), p(1 << 20, false, true)),
            Workload::SeqWriteStripe => (p(stripe_bytes, true, true), p(131072, true, true)),
            Workload::Custom { sequential, block_bytes, read_percent } => {
                let same = Pattern { block_bytes, read_percent, sequential };
                (same, same)
            }
        }
    }

    /// Whether figures are IOPS (random) or bytes per second (sequential).
    fn uses_iops(self) -> bool {
        match self {
            Workload::RandRead4k | Workload::RandWrite4k => true,
            Workload::Custom { sequential, .. } => !sequential,
            _ => false,
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub level: Level,
    pub members: usize,
    pub chunk_bytes: u64,
    pub member_bytes: u64,
    /// Where the member files go (removed afterwards).
    pub dir: PathBuf,
    pub shards: u32,
    pub jobs: usize,
    pub queue_depth: usize,
    pub run_time: Duration,
    pub repetitions: usize,
    pub workloads: Vec<Workload>,
    pub merge_window_us: u64,
    pub stripe_run_member_bytes: u64,
    pub backend: Backend,
    pub drive: Drive,
}

/// One workload's result.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: Workload,
    pub raw: Measured,
    pub array: Measured,
    /// IOPS or bytes per second the array could at best reach (see the module doc).
    pub bound: f64,
    /// Array figure over the bound, median over repetitions.
    pub ratio_to_bound: f64,
    pub ratio_spread: (f64, f64),
    pub target: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub level: String,
    pub members: usize,
    pub chunk_bytes: u64,
    pub member_bytes: u64,
    pub shards: u32,
    pub jobs: usize,
    pub queue_depth: usize,
    pub run_seconds: f64,
    pub repetitions: usize,
    pub dir: String,
    pub backend: Backend,
    pub drive: Drive,
    /// Bytes of every member a shard's run of stripes covers (0: one stripe per run).
    #[serde(default)]
    pub stripe_run_member_bytes: u64,
    pub rows: Vec<Row>,
}

fn target(workload: Workload) -> f64 {
    match workload {
        Workload::RandRead4k
        | Workload::RandWrite4k
        | Workload::SeqWriteStripe
        | Workload::Custom { .. } => 0.90,
        Workload::SeqRead128k | Workload::SeqRead1m => 0.95,
    }
}

fn bound(
    workload: Workload,
    level: Level,
    members: usize,
    raw: &Measured,
    raw_read_iops: Option<f64>,
) -> f64 {
    let m = level.parity_chunks() as f64;
    let n = members as f64;
    let copies = match level {
        Level::Raid1 => n,
        Level::Raid10 => 2.0,
        _ => 1.0,
    };
    match workload {
        Workload::RandRead4k | Workload::SeqRead128k | Workload::SeqRead1m => {
            if workload.uses_iops() { raw.iops } else { raw.bytes_per_second }
        }
        Workload::RandWrite4k => {
            let w = raw.iops;
            if m == 0.0 {
                w / copies
            } else {
                let r = raw_read_iops.unwrap_or(w);
                1.0 / ((1.0 + m) / r + (1.0 + m) / w)
            }
        }
        Workload::SeqWriteStripe => {
            raw.bytes_per_second * if m == 0.0 { 1.0 / copies } else { (n - m) / n }
        }
        Workload::Custom { sequential, read_percent, .. } => {
            // The raw run had the same shape, each of its IOs one member IO. An array IO
            // costs one member IO to read; to write, `copies` on mirrors, 2(1+m) small
            // read-modify-write IOs on parity levels when random, N/(N-M) of the data when
            // sequential (whole stripes).
            let r = f64::from(read_percent) / 100.0;
            let write_cost = match (m == 0.0, sequential) {
                (true, _) => copies,
                (false, false) => 2.0 * (1.0 + m),
                (false, true) => n / (n - m),
            };
            let raw_value = if workload.uses_iops() { raw.iops } else { raw.bytes_per_second };
            raw_value / (r + (1.0 - r) * write_cost)
        }
    }
}

/// Run the benchmark. `progress` gets a line per step.
pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> Result<Report, String> {
    if config.backend == Backend::Memory {
        let members: Vec<Arc<MemMember>> = (0..config.members)
            .map(|i| MemMember::new(&format!("mem{i}"), config.member_bytes))
            .collect();
        return run_inner(config, Members::Memory(&members), &mut progress);
    }
    std::fs::create_dir_all(&config.dir).map_err(|e| format!("{}: {e}", config.dir.display()))?;
    let paths: Vec<PathBuf> =
        (0..config.members).map(|i| config.dir.join(format!("member{i}"))).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let result = run_inner(config, Members::Files(&paths), &mut progress);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    result
}

#[derive(Clone, Copy)]
enum Members<'a> {
    Files(&'a [PathBuf]),
    Memory(&'a [Arc<MemMember>]),
}

/// What the raw loads run against.
enum Raw<'a> {
    Devices(Vec<Device>),
    Memory(&'a [Arc<MemMember>]),
}

fn run_inner(
    config: &Config,
    members: Members,
    progress: &mut impl FnMut(&str),
) -> Result<Report, String> {
    let spec = CreateSpec {
        name: "bench".into(),
        level: config.level,
        chunk_bytes: config.chunk_bytes,
        members: match members {
            Members::Files(paths) => paths.to_vec(),
            Members::Memory(_) => vec![],
        },
        spares: vec![],
        create_files_bytes: Some(config.member_bytes),
        overwrite: Overwrite::Refuse,
        init: Some(Init::Zero),
        bitmap_region_bytes: None,
        shards: config.shards,
        tunables: Default::default(),
    };
    let made = match members {
        Members::Files(_) => create(&spec),
        Members::Memory(list) => create_in_memory(&spec, list),
    }
    .map_err(|e| e.to_string())?;
    let geometry = made.geometry;
    let mut options = OpenOptions::recommended();
    options.shards = Some(config.shards);
    options.config.merge_window_us = config.merge_window_us;
    options.config.stripe_run_member_bytes = config.stripe_run_member_bytes;
    // Enough session buffers for every job's queue of the largest requests (1 MiB reads).
    options.session_buffer_bytes = (config.queue_depth * (2 << 20) * 2).max(32 << 20);
    let array = match members {
        Members::Files(paths) => Array::open(paths, &options),
        Members::Memory(list) => Array::open_in_memory(list, &options),
    }
    .map_err(|e| e.to_string())?;
    progress(&format!(
        "array: {} x{} chunk {} KiB, {} MiB; filling it once",
        config.level,
        config.members,
        config.chunk_bytes >> 10,
        array.size_bytes() >> 20
    ));
    fill(&array).map_err(|e| format!("fill: {e}"))?;
    // Raw members: a second set of descriptors on the same files, or the same memory.
    let raw_target = match members {
        Members::Files(paths) => Raw::Devices(
            paths
                .iter()
                .map(|p| Device::open_unlocked_for_benchmark(p).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?,
        ),
        Members::Memory(list) => Raw::Memory(list),
    };
    let area = RawArea {
        offset_bytes: flashraid_format::layout::DATA_OFFSET_BYTES,
        len_bytes: geometry.member_data_bytes(),
    };
    let stripe = u32::try_from(geometry.stripe_data_bytes()).map_err(|_| "stripe too large")?;
    let mut rows = vec![];
    let mut raw_read_iops: Option<f64> = None;
    for &workload in &config.workloads {
        let (array_pattern, raw_pattern) = workload.patterns(stripe);
        let mut raws = vec![];
        let mut arrays = vec![];
        let mut ratios = vec![];
        for rep in 0..config.repetitions {
            let seed = rep as u64 * 1000 + 17;
            let raw = match &raw_target {
                Raw::Devices(devices) => run_raw(
                    devices,
                    area,
                    raw_pattern,
                    config.jobs,
                    config.queue_depth,
                    config.run_time,
                    seed,
                )?,
                Raw::Memory(list) => run_raw_memory(
                    list,
                    area,
                    raw_pattern,
                    config.jobs,
                    config.queue_depth,
                    config.run_time,
                    seed,
                )?,
            };
            let drive = match config.drive {
                Drive::Threads => run_array,
                Drive::Pollers => run_array_pollers,
            };
            let on_array = drive(
                &array,
                array_pattern,
                config.jobs,
                config.queue_depth,
                config.run_time,
                seed,
            )?;
            if workload == Workload::RandRead4k {
                raw_read_iops = Some(raw.iops);
            }
            let b = bound(workload, config.level, config.members, &raw, raw_read_iops);
            let value =
                if workload.uses_iops() { on_array.iops } else { on_array.bytes_per_second };
            ratios.push(value / b);
            progress(&format!(
                "{:<16} rep {}: raw {}, array {}, {:.0}% of bound",
                workload.name(),
                rep + 1,
                figure(workload, &raw),
                figure(workload, &on_array),
                value / b * 100.0
            ));
            raws.push(raw);
            arrays.push(on_array);
        }
        let ratio = median(&ratios);
        let pick = |list: &[Measured]| {
            let values: Vec<f64> = list
                .iter()
                .map(|m| if workload.uses_iops() { m.iops } else { m.bytes_per_second })
                .collect();
            let mid = median(&values);
            list.iter()
                .find(|m| (if workload.uses_iops() { m.iops } else { m.bytes_per_second }) == mid)
                .expect("median is a member")
                .clone()
        };
        let raw = pick(&raws);
        let on_array = pick(&arrays);
        let b = bound(workload, config.level, config.members, &raw, raw_read_iops);
        let spread =
            ratios.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        rows.push(Row {
            workload,
            raw,
            array: on_array,
            bound: b,
            ratio_to_bound: ratio,
            ratio_spread: spread,
            target: target(workload),
        });
    }
    array.shutdown().map_err(|e| e.to_string())?;
    Ok(Report {
        level: config.level.name().to_string(),
        members: config.members,
        chunk_bytes: config.chunk_bytes,
        member_bytes: config.member_bytes,
        shards: config.shards,
        jobs: config.jobs,
        queue_depth: config.queue_depth,
        run_seconds: config.run_time.as_secs_f64(),
        repetitions: config.repetitions,
        dir: config.dir.display().to_string(),
        backend: config.backend,
        drive: config.drive,
        stripe_run_member_bytes: config.stripe_run_member_bytes,
        rows,
    })
}

/// Write the whole array once, sequentially, in stripe-sized pieces.
fn fill(array: &Array) -> Result<(), String> {
    let mut session = array.session().map_err(|e| e.to_string())?;
    let stripe = array.geometry().stripe_data_bytes();
    let block = stripe * (1 << 20) / stripe.max(1);
    let block = block.max(stripe) / stripe * stripe;
    let data = vec![0xa5u8; usize::try_from(block).map_err(|_| "block")?];
    let size = array.size_bytes();
    let mut at = 0;
    while at < size {
        let len = block.min(size - at);
        session
            .write(at, &data[..usize::try_from(len).map_err(|_| "len")?])
            .map_err(|e| e.to_string())?;
        at += len;
    }
    session.flush().map_err(|e| e.to_string())
}

fn figure(workload: Workload, m: &Measured) -> String {
    if workload.uses_iops() {
        format!("{:.0}k IOPS", m.iops / 1000.0)
    } else {
        format!("{:.2} GB/s", m.bytes_per_second / 1e9)
    }
}

/// The report as a table.
pub fn format_report(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<16} {:>12} {:>12} {:>8} {:>12} {:>9} {:>9} {:>9} {:>9}\n",
        "workload",
        "raw",
        "flashraid",
        "vs raw",
        "bound",
        "of bound",
        "target",
        "p99 us",
        "CPU us/IO"
    ));
    out.push_str(&format!("{}\n", "-".repeat(104)));
    for row in &report.rows {
        let w = row.workload;
        let array_value = if w.uses_iops() { row.array.iops } else { row.array.bytes_per_second };
        let raw_value = if w.uses_iops() { row.raw.iops } else { row.raw.bytes_per_second };
        let bound = if w.uses_iops() {
            format!("{:.0}k IOPS", row.bound / 1000.0)
        } else {
            format!("{:.2} GB/s", row.bound / 1e9)
        };
        out.push_str(&format!(
            "{:<16} {:>12} {:>12} {:>7.0}% {:>12} {:>8.0}% {:>8.0}% {:>9.0} {:>9.1}\n",
            w.name(),
            figure(w, &row.raw),
            figure(w, &row.array),
            array_value / raw_value * 100.0,
            bound,
            row.ratio_to_bound * 100.0,
            row.target * 100.0,
            row.array.latency_us_p99,
            row.array.cpu_us_per_io,
        ));
    }
    out
}
