//! The filesystem profiles: `video-frames` (benchmark-method.md §7.3 P5b: one file per frame,
//! written by concurrent streams, then read back) and `small-files` (P6b and P6c: create,
//! stat and delete many files, then small random reads and writes with an fsync after every
//! write). Both run on a filesystem the runner makes on the target.
//!
//! Owns: the fio job files of both profiles, the parse of fio's per-IO latency logs, the
//! per-frame figures (frame times, late frames, MB/s over time), [`FilesReport`] (serde; what
//! the runner stores) and its Markdown and HTML renderings with ratios to the first target.
//!
//! Invariants: a frame is one fio IO (`bs` = `filesize` = the frame, `iodepth=1`, one file
//! per frame), so fio's per-IO latency log is the per-frame time; every job file is a pure
//! function of its inputs; a test that does not fit the filesystem is skipped with its reason,
//! never shrunk silently below `frames_per_stream_min`.
//!
//! video-frames also runs P5a, the AJA-like large-file test: per file size of a ladder and
//! per queue depth, one file of the largest frame format written sequentially one frame per
//! IO, then read back ([`LargeFileRun`]: average and minimum MB/s, frame times).
//!
//! small-files also runs P6a, PostMark, when the shape asks for it (its parse and figures
//! live in [`crate::postmark`]; this module puts its table in the report).
//!
//! video-frames ends with P5c, the fill sweep ([`FillBatch`]): batches of frame files until
//! the filesystem is nearly full (MB/s against percent full), every other batch deleted and
//! written again into the holes, the oldest batch read back.
//!
//! Limits: a frame's time is its write or read alone: fio opens and closes files outside the
//! IO it times, which frametest would count. The fill sweep's percent full is the
//! filesystem's own count (df), after each batch's closing fsync. Earlier runs compare
//! through `merge`.

use crate::chart::{self, BarChart, LineChart};
use crate::fio::JobResult;
use crate::profile::{
    ConformanceLabel, FileEngine, FrameFormat, Mode, PERCENTILE_LIST, SmallFilesShape,
    VideoFramesShape,
};
use crate::report::{
    Table, fixed, html_label, html_manifest, html_open, html_table, md_label, md_manifest, md_table,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The most MB/s-over-time bins a phase is drawn with (bins widen to stay under it).
pub const TIMELINE_BINS_MAX: u64 = 200;

/// Where the runner mounted the target: one directory per filesystem (one for an array or a
/// device; one per member for the raw members, files spread round-robin over them by fio).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsTarget {
    pub dirs: Vec<String>,
    /// The least free space of any of the filesystems (fio spreads files evenly).
    pub free_bytes_min: u64,
    pub engine: FileEngine,
}

/// Why a job file could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    #[error("directory {0:?} holds ':', which fio's directory list uses as its separator")]
    ColonInPath(String),
    #[error("no directories to run in")]
    NoDirs,
    #[error("fio latency log line {line}: {problem}")]
    BadLogLine { line: usize, problem: String },
}

impl FsTarget {
    /// fio's `directory` line; also the check that every directory can go in fio's
    /// ':'-separated lists.
    fn directory_line(&self) -> Result<String, FilesError> {
        if self.dirs.is_empty() {
            return Err(FilesError::NoDirs);
        }
        if let Some(bad) = self.dirs.iter().find(|d| d.contains(':')) {
            return Err(FilesError::ColonInPath(bad.clone()));
        }
        Ok(format!("directory={}\n", self.dirs.join(":")))
    }
}

/// Write the frames, or read them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FramePhase {
    Write,
    Read,
}

impl FramePhase {
    pub fn name(self) -> &'static str {
        match self {
            FramePhase::Write => "write",
            FramePhase::Read => "read",
        }
    }
}

/// Frames per stream for `streams` streams of `format` on `target`: the shape's count, or
/// fewer when they would take more than `space_percent_max` of the free space; `None` when
/// fewer than `frames_per_stream_min` fit.
pub fn frames_that_fit(
    shape: &VideoFramesShape,
    format: &FrameFormat,
    streams: u32,
    target: &FsTarget,
) -> Option<u32> {
    // Streams share filesystems round-robin (see `render_frames`): the fullest one decides.
    let dirs = (target.dirs.len() as u64).max(1);
    let streams_per_dir = u64::from(streams.max(1)).div_ceil(dirs);
    let budget = target.free_bytes_min / 100 * u64::from(shape.space_percent_max);
    let per_stream = budget / (format.frame_bytes() * streams_per_dir);
    let frames = per_stream.min(u64::from(shape.frames_per_stream)) as u32;
    (frames >= shape.frames_per_stream_min).then_some(frames)
}

/// The log name (fio's `write_lat_log` prefix) of a frames test; fio appends `_lat.N.log`,
/// N = stream number from 1.
pub fn frames_log_name(format: &FrameFormat, streams: u32, phase: FramePhase) -> String {
    format!("frames-{}-s{streams}-{}", format.name.to_ascii_lowercase(), phase.name())
}

/// fio job file of one frames phase: `streams` jobs, each writing (or reading) `frames`
/// files of one frame, one IO per frame, O_DIRECT. With several filesystems fio gives job
/// clone j directory j mod dirs, so each stream lives on one filesystem (a file lives on one
/// drive without RAID); files are named so the read phase finds what the write phase made.
/// (Naming every frame's file in the job instead would spread a stream, but fio caps an
/// option's value at 4096 bytes.)
pub fn render_frames(
    format: &FrameFormat,
    streams: u32,
    frames: u32,
    target: &FsTarget,
    phase: FramePhase,
    log_name: &str,
) -> Result<String, FilesError> {
    let frame = format.frame_bytes();
    let mut out = format!(
        "; flashraid-lab: video-frames {} {}x{}, {streams} stream(s) x {frames} frames, {} \
         (generated)\n[global]\n",
        format.name,
        format.width,
        format.height,
        phase.name()
    );
    out.push_str(&target.directory_line()?);
    let _ = writeln!(out, "ioengine={}\ndirect=1\nthread=1", target.engine.fio_name());
    let _ = writeln!(out, "bs={frame}\nfilesize={frame}\nnrfiles={frames}\niodepth=1");
    // One frame file open at a time, in order, as a frame writer or player does.
    out.push_str("openfiles=1\nfile_service_type=sequential\n");
    out.push_str("filename_format=$jobname.$jobnum.$filenum\n");
    match phase {
        // No preallocation: the filesystem allocates as the frames land, as in frametest;
        // files appear when opened; the data is on the target before the phase ends.
        FramePhase::Write => {
            out.push_str("rw=write\nfallocate=none\ncreate_on_open=1\nend_fsync=1\n")
        }
        FramePhase::Read => out.push_str("rw=read\n"),
    }
    let _ = writeln!(out, "numjobs={streams}\ngroup_reporting=0\nrefill_buffers=1");
    let _ = writeln!(out, "percentile_list={PERCENTILE_LIST}");
    // Every IO logged (log_avg_msec=0): the per-frame times, one log per stream.
    let _ = writeln!(out, "write_lat_log={log_name}\nlog_avg_msec=0");
    out.push_str("\n[stream]\n");
    Ok(out)
}

/// The log name of a large-file test (fio appends `_lat.1.log`).
pub fn large_file_log_name(
    format: &FrameFormat,
    file_bytes: u64,
    iodepth: u32,
    phase: FramePhase,
) -> String {
    let name = format.name.to_ascii_lowercase();
    format!("large-{name}-{}m-qd{iodepth}-{}", file_bytes >> 20, phase.name())
}

/// Whole frames of `format` in a file of at most `file_bytes` (the file is that many frames).
pub fn large_file_frames(format: &FrameFormat, file_bytes: u64) -> u64 {
    file_bytes / format.frame_bytes().max(1)
}

/// fio job file of one large-file phase (P5a): one file on the target's first filesystem (a
/// file lives on one drive without RAID), `bs` = the frame so that every IO is one frame,
/// `iodepth` 1 (a recorder or player frame by frame) or more (one that buffers ahead).
pub fn render_large_file(
    format: &FrameFormat,
    file_bytes: u64,
    iodepth: u32,
    target: &FsTarget,
    phase: FramePhase,
) -> Result<String, FilesError> {
    let frame = format.frame_bytes();
    let frames = large_file_frames(format, file_bytes);
    let size = frames * frame;
    let first = FsTarget { dirs: target.dirs.iter().take(1).cloned().collect(), ..target.clone() };
    let mut out = format!(
        "; flashraid-lab: video-frames large file (AJA-like), {frames} frames of {} {}x{}, \
         iodepth {iodepth}, {} (generated)\n[global]\n",
        format.name,
        format.width,
        format.height,
        phase.name()
    );
    out.push_str(&first.directory_line()?);
    let _ = writeln!(out, "ioengine={}\ndirect=1\nthread=1", target.engine.fio_name());
    let _ = writeln!(out, "bs={frame}\nsize={size}\niodepth={iodepth}\nfilename=large-file");
    match phase {
        FramePhase::Write => out.push_str("rw=write\nfallocate=none\nend_fsync=1\n"),
        FramePhase::Read => out.push_str("rw=read\n"),
    }
    let _ = writeln!(out, "refill_buffers=1\npercentile_list={PERCENTILE_LIST}");
    let name = large_file_log_name(format, file_bytes, iodepth, phase);
    let _ = writeln!(out, "write_lat_log={name}\nlog_avg_msec=0");
    out.push_str("\n[large]\n");
    Ok(out)
}

/// One IO from fio's latency log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSample {
    /// Completion time from the job's start.
    pub completion_ms: u64,
    pub latency_ns: u64,
    pub bytes: u64,
}

/// Parse fio's latency log (`time_ms, latency_ns, direction, block_bytes, offset[, prio]` a
/// line; fio 3.x logs latency in nanoseconds).
pub fn parse_lat_log(text: &str) -> Result<Vec<IoSample>, FilesError> {
    let mut samples = vec![];
    for (line, fields) in crate::fio::log_lines(text) {
        let bad = |problem: &str| FilesError::BadLogLine { line, problem: problem.into() };
        if fields.len() < 4 {
            return Err(bad("fewer than 4 fields"));
        }
        let number = |i: usize| fields[i].parse::<u64>().map_err(|_| bad("not a number"));
        samples.push(IoSample {
            completion_ms: number(0)?,
            latency_ns: number(1)?,
            bytes: number(3)?,
        });
    }
    Ok(samples)
}

/// One frames phase on one target, from every stream's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FramesRun {
    pub format: FrameFormat,
    pub streams: u32,
    pub phase: FramePhase,
    pub frames: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    /// Frames per second, all streams together.
    pub frames_per_s: f64,
    pub frame_ms_p50: f64,
    pub frame_ms_p99: f64,
    pub frame_ms_max: f64,
    /// (frame rate, frames that took longer than 1/rate).
    pub late_frames: Vec<(u32, u64)>,
    pub timeline_bin_ms: u64,
    /// MB/s of the frames completed in each bin, from the phase's start.
    pub timeline_mb_per_s: Vec<f64>,
}

/// What a batch of the fill sweep (P5c) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FillStep {
    /// A new batch written, the filesystem fuller after each.
    Fill,
    /// A batch written again into the space that deleting every other batch freed.
    Rewrite,
    /// The oldest batch read back after the rewrites.
    ReadOldest,
}

impl FillStep {
    pub fn name(self) -> &'static str {
        match self {
            FillStep::Fill => "fill",
            FillStep::Rewrite => "rewrite",
            FillStep::ReadOldest => "read oldest",
        }
    }
}

/// One batch of the fill sweep on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FillBatch {
    pub step: FillStep,
    /// The batch's number in the order written (the rewrites go on counting).
    pub batch: u32,
    /// The fullest filesystem of the target after the batch, percent of its size.
    pub fill_percent: f64,
    /// The batch's frames as a frames test measures them.
    pub run: FramesRun,
}

/// Frames per stream of one fill batch: `batches` batches take the fullest of `filesystems`
/// (each `(size, used)` in bytes) from where it is to `percent_max` full, with
/// `streams_per_fs` streams writing to each; `None` when that leaves fewer than
/// `frames_min` frames a stream (the target is too small or already full).
pub fn fill_batch_frames(
    filesystems: &[(u64, u64)],
    percent_max: u8,
    batches: u32,
    frame_bytes: u64,
    streams_per_fs: u32,
    frames_min: u32,
) -> Option<u32> {
    let room = filesystems
        .iter()
        .map(|&(size, used)| (size / 100 * u64::from(percent_max)).saturating_sub(used))
        .min()?;
    let per_stream = room / u64::from(batches.max(1)) / u64::from(streams_per_fs.max(1));
    let frames = u32::try_from(per_stream / frame_bytes.max(1)).unwrap_or(u32::MAX);
    (frames >= frames_min.max(1)).then_some(frames)
}

/// The log name of a fill-sweep batch (fio appends `_lat.N.log`).
pub fn fill_log_name(batch: u32, step: FillStep) -> String {
    let step = match step {
        FillStep::Fill => "fill",
        FillStep::Rewrite => "rewrite",
        FillStep::ReadOldest => "read",
    };
    format!("fill-{batch:02}-{step}")
}

/// One large-file phase (P5a) on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LargeFileRun {
    /// The ladder's size (the file holds the whole frames that fit in it).
    pub file_bytes: u64,
    pub iodepth: u32,
    /// The figures as for frame files, with one stream; at a queue depth above 1 the frame
    /// times (percentiles, late frames) are the gaps between completions, not IO times.
    pub run: FramesRun,
    /// AJA's minimum: the slowest delivery of a frame, its bytes over the time since the
    /// frame before it completed (the first frame: since the start; frames completing in one
    /// millisecond, the log's resolution, count together). Never above the mean, whatever
    /// the queue depth. Per frame, not per timeline bin: a 35 MB frame can take longer than
    /// a 100 ms bin, leaving empty bins in a steady stream.
    pub min_mb_per_s: f64,
}

impl LargeFileRun {
    /// From the phase's latency log; `None` when no frame completed.
    pub fn from_samples(
        shape: &VideoFramesShape,
        format: &FrameFormat,
        file_bytes: u64,
        iodepth: u32,
        phase: FramePhase,
        samples: Vec<IoSample>,
    ) -> Option<LargeFileRun> {
        let mut samples = samples;
        samples.sort_by_key(|s| s.completion_ms);
        let (mut since_ms, mut bytes, mut min_mb_per_s) = (0u64, 0u64, f64::INFINITY);
        for s in &samples {
            bytes += s.bytes;
            if s.completion_ms > since_ms {
                let rate = bytes as f64 / 1e6 / ((s.completion_ms - since_ms) as f64 / 1000.0);
                min_mb_per_s = min_mb_per_s.min(rate);
                (since_ms, bytes) = (s.completion_ms, 0);
            }
        }
        // One frame in flight: its IO's time is its time (the method's P5a). More: an IO's
        // time spans the frames in flight with it, so a frame's time is the gap since the
        // frame before it arrived, as a player sees it (at the log's 1 ms resolution).
        if iodepth > 1 {
            let mut previous_ms = 0;
            for s in &mut samples {
                s.latency_ns = (s.completion_ms - previous_ms) * 1_000_000;
                previous_ms = s.completion_ms;
            }
        }
        let run = frames_run(shape, format, 1, phase, &[samples])?;
        // Everything within the first millisecond: no interval to measure; the mean stands.
        let min_mb_per_s = if min_mb_per_s.is_finite() { min_mb_per_s } else { run.mb_per_s };
        Some(LargeFileRun { file_bytes, iodepth, run, min_mb_per_s })
    }

    fn key(&self) -> (u64, u32, FramePhase) {
        (self.file_bytes, self.iodepth, self.run.phase)
    }

    fn label(&self) -> String {
        format!("{} MiB QD{} {}", self.file_bytes >> 20, self.iodepth, self.run.phase.name())
    }
}

/// A test the target had no room for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedTest {
    pub test: String,
    pub reason: String,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], at: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((at / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The figures of a frames phase from each stream's samples (all streams start together).
/// `None` when no frame completed.
pub fn frames_run(
    shape: &VideoFramesShape,
    format: &FrameFormat,
    streams: u32,
    phase: FramePhase,
    per_stream: &[Vec<IoSample>],
) -> Option<FramesRun> {
    let all: Vec<IoSample> = per_stream.iter().flatten().copied().collect();
    let end_ms = all.iter().map(|s| s.completion_ms).max()?;
    // A phase shorter than a millisecond still took time: never divide by zero.
    let seconds = (end_ms.max(1)) as f64 / 1000.0;
    let bytes: u64 = all.iter().map(|s| s.bytes).sum();
    let mut latencies: Vec<u64> = all.iter().map(|s| s.latency_ns).collect();
    latencies.sort_unstable();
    let ms = |ns: u64| ns as f64 / 1e6;
    let late_frames = shape
        .frame_rates_per_s
        .iter()
        .map(|&rate| {
            let deadline_ns = 1_000_000_000 / u64::from(rate.max(1));
            (rate, latencies.iter().filter(|&&l| l > deadline_ns).count() as u64)
        })
        .collect();
    // A frame's bytes count in the bin its completion ends, as a sample of fio's averaged
    // logs covers the interval ending at its time: bin `b` is `(b * bin, (b + 1) * bin]`, the
    // last one ends at the last completion and its rate is over the part the phase covered
    // (found by review: a completion on a boundary opened a bin of its own after the phase,
    // and the first and last bins read half the steady rate).
    let mut bin_ms = u64::from(shape.timeline_bin_ms.max(1));
    while end_ms.div_ceil(bin_ms) > TIMELINE_BINS_MAX {
        bin_ms *= 2;
    }
    let bin_count = end_ms.div_ceil(bin_ms).max(1);
    let mut bins = vec![0u64; bin_count as usize];
    for s in &all {
        bins[(s.completion_ms.saturating_sub(1) / bin_ms) as usize] += s.bytes;
    }
    let last_ms = (end_ms - (bin_count - 1) * bin_ms).max(1);
    let timeline_mb_per_s = bins
        .iter()
        .enumerate()
        .map(|(b, &bytes)| {
            let width_ms = if b as u64 == bin_count - 1 { last_ms } else { bin_ms };
            bytes as f64 / 1e6 / (width_ms as f64 / 1000.0)
        })
        .collect();
    Some(FramesRun {
        format: format.clone(),
        streams,
        phase,
        frames: all.len() as u64,
        seconds,
        mb_per_s: bytes as f64 / 1e6 / seconds,
        frames_per_s: all.len() as f64 / seconds,
        frame_ms_p50: ms(percentile(&latencies, 50.0)),
        frame_ms_p99: ms(percentile(&latencies, 99.0)),
        frame_ms_max: ms(*latencies.last()?),
        late_frames,
        timeline_bin_ms: bin_ms,
        timeline_mb_per_s,
    })
}

/// A small-files metadata operation (fio's file engines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetaOp {
    Create,
    Stat,
    Delete,
}

impl MetaOp {
    pub const ALL: [MetaOp; 3] = [MetaOp::Create, MetaOp::Stat, MetaOp::Delete];

    pub fn name(self) -> &'static str {
        match self {
            MetaOp::Create => "create",
            MetaOp::Stat => "stat",
            MetaOp::Delete => "delete",
        }
    }

    fn engine(self) -> &'static str {
        match self {
            MetaOp::Create => "filecreate",
            MetaOp::Stat => "filestat",
            MetaOp::Delete => "filedelete",
        }
    }
}

/// The per-job directories of the metadata tests, which the runner makes in every filesystem
/// beforehand (fio's file engines do not make directories).
pub fn metadata_subdirs(jobs: u32) -> Vec<String> {
    (0..jobs.max(1)).map(|j| format!("meta-j{j}")).collect()
}

/// fio job file of one metadata operation: `jobs` jobs sharing `files` files, each job in its
/// own directory (`meta-jN/`), file names shared by the three operations so stat and delete
/// find what create made.
pub fn render_metadata(
    op: MetaOp,
    jobs: u32,
    files: u32,
    target: &FsTarget,
) -> Result<String, FilesError> {
    let jobs = jobs.max(1);
    let per_job = (files / jobs).max(1);
    let mut out = format!(
        "; flashraid-lab: small-files {} of {} files by {jobs} job(s) (generated)\n[global]\n",
        op.name(),
        per_job * jobs
    );
    out.push_str(&target.directory_line()?);
    let _ = writeln!(out, "ioengine={}\nthread=1", op.engine());
    // filecreate makes empty files; filesize and bs only feed fio's accounting.
    let _ = writeln!(out, "nrfiles={per_job}\nfilesize=4k\nbs=4k\nopenfiles=1");
    // Otherwise fio would first write every file up to `filesize` for stat and delete.
    out.push_str("create_on_open=1\n");
    out.push_str("filename_format=meta-j$jobnum/f.$filenum\n");
    let _ = writeln!(out, "numjobs={jobs}\ngroup_reporting=1");
    let _ = writeln!(out, "percentile_list={PERCENTILE_LIST}");
    let _ = writeln!(out, "\n[{}-j{jobs}]", op.name());
    Ok(out)
}

/// fio job file of the small-file data test: random 4 KiB reads and writes over many 16 KiB
/// files (70 % reads), an fsync after every write, like a mail server (filebench varmail).
/// With `layout_only`, the job that makes the files first (no fsync per file: the runner
/// syncs once after it), so the measured job finds them in place.
pub fn render_small_data(
    shape: &SmallFilesShape,
    target: &FsTarget,
    randseed: u64,
    layout_only: bool,
) -> Result<String, FilesError> {
    let jobs = shape.data_jobs.max(1);
    let per_job = (shape.data_files / jobs).max(1);
    let what = if layout_only { "data layout" } else { "data" };
    let mut out = format!("; flashraid-lab: small-files {what} (generated)\n[global]\n");
    out.push_str(&target.directory_line()?);
    // Buffered IO, as mail servers do: the fsync after each write is what reaches the target.
    let _ = writeln!(out, "ioengine=psync\nthread=1\nfsync=1");
    let _ = writeln!(
        out,
        "nrfiles={per_job}\nfilesize={}\nbs={}\nfile_service_type=random",
        shape.data_file_size_bytes, shape.data_block_bytes
    );
    out.push_str("filename_format=data-j$jobnum/f.$filenum\n");
    let _ = writeln!(out, "rw=randrw\nrwmixread={}", shape.data_read_percent);
    if layout_only {
        out.push_str("create_only=1\ncreate_fsync=0\n");
    } else {
        let _ = writeln!(out, "time_based=1\nruntime={}", shape.data_runtime_s);
    }
    let _ = writeln!(out, "numjobs={jobs}\ngroup_reporting=1\nrandseed={randseed}");
    let _ = writeln!(out, "percentile_list={PERCENTILE_LIST}");
    out.push_str("\n[data]\n");
    Ok(out)
}

/// A metadata operation's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaRun {
    pub op: MetaOp,
    pub jobs: u32,
    pub files: u64,
    pub ops_per_s: f64,
    pub latency_us_p50: Option<f64>,
    pub latency_us_p99: Option<f64>,
    pub latency_us_max: Option<f64>,
}

impl MetaRun {
    /// From the group's fio result: fio counts each file operation as a read.
    pub fn from_job(op: MetaOp, jobs: u32, job: &JobResult) -> MetaRun {
        let r = &job.read;
        // fio's own iops divides by a whole-millisecond runtime, coarse for short runs: take
        // the count over the direction's runtime, at no less than one millisecond.
        let wall_ms = (r.runtime_ms.max(1)) as f64;
        MetaRun {
            op,
            jobs,
            files: r.ios,
            ops_per_s: r.ios as f64 * 1000.0 / wall_ms,
            latency_us_p50: r.percentiles.as_ref().and_then(|p| p.latency_us_p50),
            latency_us_p99: r.percentiles.as_ref().and_then(|p| p.latency_us_p99),
            latency_us_max: r.latency_us_max,
        }
    }
}

/// Everything measured on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilesTarget {
    pub name: String,
    pub description: String,
    /// Filesystem, mkfs command and mount options, loop devices.
    pub filesystem: String,
    pub frames: Vec<FramesRun>,
    /// video-frames' large-file tests (absent in reports from before them).
    #[serde(default)]
    pub large_files: Vec<LargeFileRun>,
    /// video-frames' fill sweep, P5c (absent in reports from before it, or when skipped).
    #[serde(default)]
    pub fill: Vec<FillBatch>,
    pub metadata: Vec<MetaRun>,
    pub data: Option<JobResult>,
    /// small-files' PostMark run (absent in reports from before it, or when skipped).
    #[serde(default)]
    pub postmark: Option<crate::postmark::PostmarkRun>,
    pub skipped: Vec<SkippedTest>,
}

/// Which profile a [`FilesReport`] holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "profile", rename_all = "kebab-case")]
pub enum FilesShape {
    VideoFrames(VideoFramesShape),
    SmallFiles(SmallFilesShape),
}

/// One video-frames or small-files run over one or more targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilesReport {
    pub run_id: String,
    pub mode: Mode,
    pub conformance: ConformanceLabel,
    pub shape: FilesShape,
    pub manifest: BTreeMap<String, String>,
    /// In column order; the first is the baseline of every ratio.
    pub targets: Vec<FilesTarget>,
}

fn ratio(value: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{value:.1} ({:.2}x)", value / b),
        _ => format!("{value:.1}"),
    }
}

fn frames_key(run: &FramesRun) -> (String, u32, FramePhase) {
    (run.format.name.clone(), run.streams, run.phase)
}

/// Per frame rate: the frames that missed its deadline, and their share.
fn late_cells<'a>(run: &'a FramesRun, rates: &'a [u32]) -> impl Iterator<Item = String> + 'a {
    rates.iter().map(|rate| {
        let late = run.late_frames.iter().find(|(r, _)| r == rate).map_or(0, |(_, n)| *n);
        let share = late as f64 * 100.0 / run.frames.max(1) as f64;
        format!("{late} ({share:.1}%)")
    })
}

/// `names`, then a "late at N fps" column per rate.
fn header_with_late(names: &[&str], rates: &[u32]) -> Vec<String> {
    let late = rates.iter().map(|r| format!("late at {r} fps"));
    names.iter().map(|h| h.to_string()).chain(late).collect()
}

fn frames_table(report: &FilesReport, rates: &[u32]) -> Table {
    let base = report.targets.first();
    let mut rows = vec![];
    for target in &report.targets {
        for run in &target.frames {
            let base_run =
                base.and_then(|b| b.frames.iter().find(|r| frames_key(r) == frames_key(run)));
            let mut row = vec![
                target.name.clone(),
                format!("{} {}x{}", run.format.name, run.format.width, run.format.height),
                run.streams.to_string(),
                run.phase.name().to_string(),
                run.frames.to_string(),
                ratio(run.mb_per_s, base_run.map(|b| b.mb_per_s)),
                format!("{:.1}", run.frames_per_s),
                format!("{:.2}", run.frame_ms_p50),
                format!("{:.2}", run.frame_ms_p99),
                format!("{:.2}", run.frame_ms_max),
            ];
            row.extend(late_cells(run, rates));
            rows.push(row);
        }
    }
    let header = header_with_late(
        &[
            "Target", "Format", "Streams", "Phase", "Frames", "MB/s", "Frames/s", "p50 ms",
            "p99 ms", "max ms",
        ],
        rates,
    );
    Table {
        title: format!(
            "video-frames: one file per frame, O_DIRECT, one IO per frame (MB/s ratios to {})",
            base.map_or("-", |t| t.name.as_str())
        ),
        header,
        rows,
    }
}

fn large_file_table(report: &FilesReport, rates: &[u32]) -> Table {
    let base = report.targets.first();
    let mut rows = vec![];
    for target in &report.targets {
        for large in &target.large_files {
            let base_run = base.and_then(|b| b.large_files.iter().find(|r| r.key() == large.key()));
            let run = &large.run;
            let mut row = vec![
                target.name.clone(),
                format!("{} {}x{}", run.format.name, run.format.width, run.format.height),
                format!("{}", large.file_bytes >> 20),
                large.iodepth.to_string(),
                run.phase.name().to_string(),
                ratio(run.mb_per_s, base_run.map(|b| b.run.mb_per_s)),
                ratio(large.min_mb_per_s, base_run.map(|b| b.min_mb_per_s)),
                format!("{:.2}", run.frame_ms_p99),
                format!("{:.2}", run.frame_ms_max),
            ];
            row.extend(late_cells(run, rates));
            rows.push(row);
        }
    }
    let header = header_with_late(
        &["Target", "Format", "File MiB", "QD", "Phase", "MB/s", "min MB/s", "p99 ms", "max ms"],
        rates,
    );
    Table {
        title: format!(
            "video-frames: one large file, a frame per IO (AJA-like), O_DIRECT (MB/s ratios to {})",
            base.map_or("-", |t| t.name.as_str())
        ),
        header,
        rows,
    }
}

fn fill_table(report: &FilesReport) -> Table {
    let base = report.targets.first();
    let mut rows = vec![];
    for target in &report.targets {
        for (i, batch) in target.fill.iter().enumerate() {
            // Batches pair up by position: every target runs the same sequence of steps.
            let base_batch = base.and_then(|b| b.fill.get(i)).filter(|b| b.step == batch.step);
            let run = &batch.run;
            rows.push(vec![
                target.name.clone(),
                batch.batch.to_string(),
                batch.step.name().to_string(),
                format!("{:.1}", batch.fill_percent),
                run.frames.to_string(),
                ratio(run.mb_per_s, base_batch.map(|b| b.run.mb_per_s)),
                format!("{:.2}", run.frame_ms_p99),
                format!("{:.2}", run.frame_ms_max),
            ]);
        }
    }
    let format = report.targets.iter().find_map(|t| t.fill.first()).map_or(String::new(), |b| {
        format!(", {} frame files x{}", b.run.format.name, b.run.streams)
    });
    Table {
        title: format!(
            "video-frames: fill sweep{format}, batches until the filesystem is nearly full, every \
             other batch deleted and written again, the oldest read back (MB/s ratios to {})",
            base.map_or("-", |t| t.name.as_str())
        ),
        header: ["Target", "Batch", "Step", "Full %", "Frames", "MB/s", "p99 ms", "max ms"]
            .map(String::from)
            .to_vec(),
        rows,
    }
}

/// MB/s of each batch against how full the filesystem was after it, one line per target
/// (the fill batches only: the rewrites and the read are in the table).
fn fill_chart(report: &FilesReport) -> LineChart {
    let series: Vec<chart::Series> = report
        .targets
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.fill.is_empty())
        .map(|(index, t)| chart::Series {
            name: t.name.clone(),
            colour_index: index,
            points: t
                .fill
                .iter()
                .filter(|b| b.step == FillStep::Fill)
                .map(|b| (b.fill_percent, b.run.mb_per_s))
                .collect(),
        })
        .collect();
    LineChart {
        title: "video-frames fill sweep: MB/s by how full the filesystem is".into(),
        x_label: "percent full after the batch".into(),
        y_label: "MB/s".into(),
        x_ticks: (0..=5).map(|i| (f64::from(i) * 20.0, format!("{}", i * 20))).collect(),
        log_y: false,
        series,
        guides: vec![],
    }
}

fn metadata_table(report: &FilesReport) -> Table {
    let base = report.targets.first();
    let mut rows = vec![];
    for target in &report.targets {
        for run in &target.metadata {
            let base_run =
                base.and_then(|b| b.metadata.iter().find(|r| r.op == run.op && r.jobs == run.jobs));
            rows.push(vec![
                target.name.clone(),
                run.op.name().to_string(),
                run.jobs.to_string(),
                run.files.to_string(),
                ratio(run.ops_per_s, base_run.map(|b| b.ops_per_s)),
                fixed(run.latency_us_p50, 1),
                fixed(run.latency_us_p99, 1),
                fixed(run.latency_us_max, 0),
            ]);
        }
    }
    Table {
        title: format!(
            "small-files: metadata (fio filecreate/filestat/filedelete; ratios to {})",
            base.map_or("-", |t| t.name.as_str())
        ),
        header: ["Target", "Operation", "Jobs", "Files", "ops/s", "p50 us", "p99 us", "max us"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    }
}

fn data_table(report: &FilesReport) -> Table {
    let base = report.targets.first().and_then(|t| t.data.as_ref());
    let rows = report
        .targets
        .iter()
        .filter_map(|t| t.data.as_ref().map(|d| (t, d)))
        .map(|(t, d)| {
            let sync = d.sync.as_ref();
            let sync_p = |pick: fn(&crate::fio::Percentiles) -> Option<f64>| {
                sync.and_then(|s| s.percentiles.as_ref()).and_then(pick)
            };
            vec![
                t.name.clone(),
                ratio(d.read.iops, base.map(|b| b.read.iops)),
                ratio(d.write.iops, base.map(|b| b.write.iops)),
                fixed(d.read.percentiles.as_ref().and_then(|p| p.latency_us_p99), 0),
                sync.map_or("-".into(), |s| s.syncs.to_string()),
                fixed(sync_p(|p| p.latency_us_p50), 0),
                fixed(sync_p(|p| p.latency_us_p99), 0),
                fixed(sync_p(|p| p.latency_us_p99_9), 0),
                fixed(sync.and_then(|s| s.latency_us_max), 0),
            ]
        })
        .collect();
    Table {
        title: "small-files: data (random 4 KiB reads and writes in 16 KiB files, fsync after \
                every write)"
            .to_string(),
        header: [
            "Target",
            "read IOPS",
            "write IOPS",
            "read p99 us",
            "fsyncs",
            "fsync p50 us",
            "fsync p99 us",
            "fsync p99.9 us",
            "fsync max us",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

fn postmark_table(report: &FilesReport) -> Table {
    let base = report.targets.first().and_then(|t| t.postmark.as_ref());
    let rows = report
        .targets
        .iter()
        .filter_map(|t| t.postmark.as_ref().map(|p| (t, p)))
        .map(|(t, p)| std::iter::once(t.name.clone()).chain(p.cells(base)).collect())
        .collect();
    let header =
        std::iter::once("Target".to_string()).chain(crate::postmark::PostmarkRun::header());
    Table {
        title: format!(
            "small-files: PostMark (file ops/s ratios to {})",
            report.targets.first().map_or("-", |t| t.name.as_str())
        ),
        header: header.collect(),
        rows,
    }
}

fn skipped_lines(report: &FilesReport) -> Vec<String> {
    report
        .targets
        .iter()
        .flat_map(|t| {
            t.skipped.iter().map(move |s| format!("{}: {} skipped: {}", t.name, s.test, s.reason))
        })
        .collect()
}

fn title(report: &FilesReport) -> String {
    let profile = match report.shape {
        FilesShape::VideoFrames(_) => "video-frames",
        FilesShape::SmallFiles(_) => "small-files",
    };
    format!("flashraid lab: {profile} ({} mode), run {}", report.mode, report.run_id)
}

fn tables(report: &FilesReport) -> Vec<Table> {
    match &report.shape {
        FilesShape::VideoFrames(shape) => {
            let mut tables = vec![frames_table(report, &shape.frame_rates_per_s)];
            if report.targets.iter().any(|t| !t.large_files.is_empty()) {
                tables.push(large_file_table(report, &shape.frame_rates_per_s));
            }
            if report.targets.iter().any(|t| !t.fill.is_empty()) {
                tables.push(fill_table(report));
            }
            tables
        }
        FilesShape::SmallFiles(_) => {
            let mut tables = vec![metadata_table(report), data_table(report)];
            if report.targets.iter().any(|t| t.postmark.is_some()) {
                tables.push(postmark_table(report));
            }
            tables
        }
    }
}

fn has_postmark(report: &FilesReport) -> bool {
    report.targets.iter().any(|t| t.postmark.is_some())
}

const FRAMES_NOTE: &str = "A frame's time is its one write or read (fio times the IO, not the \
open and close around it). Late: frames whose own write or read took longer than 1/rate, which a \
stream at that rate would drop. MB/s and frames/s: all streams together, from the first start to the last completion.";

/// The report as Markdown: the tables with ratios, what was skipped, the filesystems, the
/// manifest.
pub fn render_files_markdown(report: &FilesReport) -> String {
    let mut out = format!("# {}\n\n", title(report));
    md_label(&mut out, &report.conformance);
    if matches!(report.shape, FilesShape::VideoFrames(_)) {
        let _ = writeln!(out, "{FRAMES_NOTE}\n");
    }
    for table in tables(report) {
        out.push_str(&md_table(&table));
    }
    if has_postmark(report) {
        let _ = writeln!(out, "{}\n", crate::postmark::POSTMARK_NOTE);
    }
    for line in skipped_lines(report) {
        let _ = writeln!(out, "- {line}");
    }
    out.push('\n');
    for target in &report.targets {
        let _ = writeln!(out, "{}: {}; {}\n", target.name, target.description, target.filesystem);
    }
    md_manifest(&mut out, &report.manifest);
    out
}

/// MB/s over time of one (format, streams, phase), one line per target.
fn timeline_chart(report: &FilesReport, key: &(String, u32, FramePhase)) -> LineChart {
    let lines = report
        .targets
        .iter()
        .enumerate()
        .filter_map(|(index, t)| {
            let run = t.frames.iter().find(|r| &frames_key(r) == key)?;
            let bin_s = run.timeline_bin_ms as f64 / 1000.0;
            Some((t.name.clone(), index, bin_s, run.timeline_mb_per_s.as_slice()))
        })
        .collect();
    chart::binned_timeline_chart(
        format!("{} x{} {}: MB/s over time", key.0, key.1, key.2.name()),
        "MB/s",
        lines,
    )
}

/// MB/s over time of one large-file test, one line per target.
fn large_file_chart(report: &FilesReport, key: (u64, u32, FramePhase), label: &str) -> LineChart {
    let lines = report
        .targets
        .iter()
        .enumerate()
        .filter_map(|(index, t)| {
            let large = t.large_files.iter().find(|r| r.key() == key)?;
            let bin_s = large.run.timeline_bin_ms as f64 / 1000.0;
            Some((t.name.clone(), index, bin_s, large.run.timeline_mb_per_s.as_slice()))
        })
        .collect();
    chart::binned_timeline_chart(format!("large file {label}: MB/s over time"), "MB/s", lines)
}

/// One bar per key (in the first target's order) per target.
fn bars<K: PartialEq>(
    report: &FilesReport,
    title: &str,
    y_label: &str,
    keys: &[K],
    label: impl Fn(&K) -> String,
    value: impl Fn(&FilesTarget, &K) -> Option<f64>,
) -> BarChart {
    BarChart {
        title: title.into(),
        y_label: y_label.into(),
        categories: keys.iter().map(&label).collect(),
        series: report
            .targets
            .iter()
            .enumerate()
            .map(|(index, t)| (t.name.clone(), index, keys.iter().map(|k| value(t, k)).collect()))
            .collect(),
    }
}

fn throughput_bars(report: &FilesReport) -> BarChart {
    let keys: Vec<(String, u32, FramePhase)> = report
        .targets
        .first()
        .map(|t| t.frames.iter().map(frames_key).collect())
        .unwrap_or_default();
    bars(
        report,
        "Frames: MB/s per format, streams and phase",
        "MB/s",
        &keys,
        |k| format!("{} x{} {}", k.0, k.1, k.2.name()),
        |t, k| t.frames.iter().find(|r| &frames_key(r) == k).map(|r| r.mb_per_s),
    )
}

fn metadata_bars(report: &FilesReport) -> BarChart {
    let keys: Vec<(MetaOp, u32)> = report
        .targets
        .first()
        .map(|t| t.metadata.iter().map(|m| (m.op, m.jobs)).collect())
        .unwrap_or_default();
    bars(
        report,
        "Metadata operations per second",
        "ops/s",
        &keys,
        |(op, jobs)| format!("{} x{jobs}", op.name()),
        |t, k| t.metadata.iter().find(|m| (m.op, m.jobs) == *k).map(|m| m.ops_per_s),
    )
}

/// PostMark's rates side by side, one bar per target in each group.
fn postmark_bars(report: &FilesReport) -> BarChart {
    use crate::postmark::PostmarkRun;
    let rate = |run: &PostmarkRun, wall_clock: bool| {
        if wall_clock { run.file_ops_per_s() } else { run.transactions_per_s() }
    };
    bars(
        report,
        "PostMark",
        "per second",
        &[false, true],
        |&wall_clock| {
            if wall_clock { "file ops/s (wall clock)" } else { "transactions/s (PostMark)" }
                .to_string()
        },
        |t, &wall_clock| t.postmark.as_ref().map(|run| rate(run, wall_clock)),
    )
}

/// The report as one self-contained HTML page.
pub fn render_files_html(report: &FilesReport) -> String {
    let mut out = html_open(&title(report));
    html_label(&mut out, &report.conformance);
    for table in tables(report) {
        out.push_str(&html_table(&table));
    }
    match report.shape {
        FilesShape::VideoFrames(_) => {
            let _ = writeln!(out, "<p>{}</p>", chart::xml_escape(FRAMES_NOTE));
            out.push_str(&chart::bar_chart_svg(&throughput_bars(report)));
            let keys: Vec<_> = report
                .targets
                .first()
                .map(|t| t.frames.iter().map(frames_key).collect())
                .unwrap_or_default();
            for key in &keys {
                out.push_str(&chart::line_chart_svg(&timeline_chart(report, key)));
            }
            // Every target's tests, in first-seen order: a larger file may fit only on the
            // array.
            let mut large: Vec<((u64, u32, FramePhase), String)> = vec![];
            for r in report.targets.iter().flat_map(|t| &t.large_files) {
                if !large.iter().any(|(k, _)| *k == r.key()) {
                    large.push((r.key(), r.label()));
                }
            }
            for (key, label) in &large {
                out.push_str(&chart::line_chart_svg(&large_file_chart(report, *key, label)));
            }
            if report.targets.iter().any(|t| !t.fill.is_empty()) {
                out.push_str(&chart::line_chart_svg(&fill_chart(report)));
            }
        }
        FilesShape::SmallFiles(_) => {
            out.push_str(&chart::bar_chart_svg(&metadata_bars(report)));
            if has_postmark(report) {
                let _ =
                    writeln!(out, "<p>{}</p>", chart::xml_escape(crate::postmark::POSTMARK_NOTE));
                out.push_str(&chart::bar_chart_svg(&postmark_bars(report)));
            }
        }
    }
    let skipped = skipped_lines(report);
    if !skipped.is_empty() {
        out.push_str("<ul>");
        for line in skipped {
            let _ = write!(out, "<li>{}</li>", chart::xml_escape(&line));
        }
        out.push_str("</ul>\n");
    }
    for target in &report.targets {
        let _ = writeln!(
            out,
            "<p><b>{}</b>: {}; {}</p>",
            chart::xml_escape(&target.name),
            chart::xml_escape(&target.description),
            chart::xml_escape(&target.filesystem)
        );
    }
    html_manifest(&mut out, &report.manifest);
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests;
