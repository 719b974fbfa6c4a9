//! The lab's filesystem profiles at the edge: `video-frames` and `small-files` make a
//! filesystem on each target, mount it, run fio in it, and take it down again.
//!
//! Owns: the mount stack of a target and its teardown. A `flashraid` or `nbd:` target goes
//! NBD export -> nbdfuse (a file) -> loop device -> mkfs -> mount; a `path:` file gets a loop
//! device, a `path:` block device is formatted as it is; `members` gets one filesystem per
//! member file (loop devices), and fio spreads each job's files round-robin over them: the
//! single drives side by side, the hardware column of a filesystem workload.
//!
//! Invariants: loop devices are made with direct IO on (no second page cache under the
//! filesystem) and the state the kernel granted is recorded; every layer set up is taken
//! down in reverse order, also after a failure (the teardown runs on drop); mount points live
//! in a fresh 0700 directory under the system temp directory, never in a user's path.
//!
//! small-files ends with PostMark (P6a): one `postmark` process per filesystem, started
//! together, each with its share of the files and transactions, timed by the lab's clock
//! as well as its own; each process's command file and report are kept in the raw folder.
//!
//! Limits: needs root (mount, losetup), /dev/fuse for NBD targets, mkfs for the chosen
//! filesystem, and `postmark` for small-files. The frames and file counts shrink to the room the filesystem has, and a test
//! with too little room is skipped and listed, not run smaller than its minimum.

use super::{
    LabRunArgs, ROUND_OVERRUN, TargetSpec, close_target, prepare_target, run_fio, run_header,
    stopped_early, workload_label, write_outputs,
};
use anyhow::{Context, Result, bail};
use flashraid_lab::files::{
    FilesReport, FilesShape, FilesTarget, FillBatch, FillStep, FramePhase, FsTarget, IoSample,
    LargeFileRun, MetaOp, MetaRun, SkippedTest, fill_batch_frames, fill_log_name, frames_log_name,
    frames_run, frames_that_fit, large_file_frames, large_file_log_name, metadata_subdirs,
    parse_lat_log, render_files_html, render_files_markdown, render_frames, render_large_file,
    render_metadata, render_small_data,
};
use flashraid_lab::fio::parse_fio_output;
use flashraid_lab::postmark::{PostmarkRun, PostmarkShape, parse_postmark, render_postmark_config};
use flashraid_lab::profile::{Profile, SmallFilesShape, Target, VideoFramesShape};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long nbdfuse may take to expose the export as a file.
const NBDFUSE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long nbdfuse may take to exit after its unmount.
const NBDFUSE_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// small-files' P6a benchmark (Debian's postmark).
const POSTMARK: &str = "postmark";
/// fio's floor speed for a time limit on a frames phase: slower than this is wedged.
const WEDGED_BYTES_PER_S: u64 = 1 << 20;

/// The filesystem the lab makes on each target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FsKind {
    Ext4,
    Xfs,
}

impl FsKind {
    /// The mkfs command (without the device). ext4 initialises its inode tables and journal
    /// now, so no background writer competes with the measurement; one inode per 8 KiB, as
    /// small files need.
    fn mkfs(self) -> Vec<&'static str> {
        match self {
            FsKind::Ext4 => vec![
                "mkfs.ext4",
                "-q",
                "-F",
                "-i",
                "8192",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ],
            FsKind::Xfs => vec!["mkfs.xfs", "-f", "-q"],
        }
    }

    /// The smallest device the mkfs accepts. xfsprogs 5.19 and later (Debian 12's 6.1)
    /// refuse a data section under 300 MiB; ext4 makes a filesystem in 1 MiB.
    fn size_bytes_min(self) -> u64 {
        match self {
            FsKind::Ext4 => 1 << 20,
            FsKind::Xfs => 300 << 20,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
        }
    }
}

/// Refuse a device too small for the filesystem before anything is written to it, with the
/// way out, rather than passing on mkfs's usage text. `what` reads with the size after it
/// ("each member file is").
fn check_fs_room(kind: FsKind, what: &str, size_bytes: u64) -> Result<()> {
    if size_bytes < kind.size_bytes_min() {
        bail!(
            "{what} {}, and {} needs at least {}: give it more room (for the \
             lab's own targets, a larger --member-size) or take --fs ext4",
            crate::array_cmds::human(size_bytes),
            kind.name(),
            crate::array_cmds::human(kind.size_bytes_min())
        );
    }
    Ok(())
}

const MOUNT_OPTIONS: &str = "noatime";

/// A filesystem stack on a target, taken down on `unmount` or drop.
struct Mounted {
    fs: FsTarget,
    description: String,
    base: PathBuf,
    mounts: Vec<PathBuf>,
    loops: Vec<String>,
    fuse: Option<(PathBuf, Child)>,
}

impl Mounted {
    fn unmount(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let mut first_error = None;
        let mut note = |r: Result<String>| {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        };
        for mount in self.mounts.drain(..).rev() {
            note(run_tool(Command::new("umount").arg(&mount)));
        }
        for device in self.loops.drain(..).rev() {
            note(run_tool(Command::new("losetup").arg("-d").arg(&device)));
        }
        if let Some((dir, mut child)) = self.fuse.take() {
            note(run_tool(Command::new("fusermount3").arg("-u").arg(&dir)));
            let deadline = Instant::now() + NBDFUSE_STOP_TIMEOUT;
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Only empty directories go (rmdir semantics): a mount left behind is never deleted.
        if let Ok(entries) = std::fs::read_dir(&self.base) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&self.base);
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("lab: taking down the filesystem stack: {e:#}");
        }
    }
}

/// Run a tool; the head of its stderr in the error when it fails.
fn run_tool(command: &mut Command) -> Result<String> {
    let out =
        command.stdin(Stdio::null()).output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            out.status,
            stderr_head(&String::from_utf8_lossy(&out.stderr))
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Lines of a failed tool's stderr kept in the error (and the report's deviation note).
const STDERR_LINES_MAX: usize = 3;

/// The first lines of a tool's stderr, which say what went wrong; a usage text after them
/// (mkfs.xfs prints forty lines of it) is counted, not copied into the report.
fn stderr_head(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let mut head = lines[..lines.len().min(STDERR_LINES_MAX)].join(" ");
    if lines.len() > STDERR_LINES_MAX {
        head += &format!(" (and {} more lines)", lines.len() - STDERR_LINES_MAX);
    }
    head
}

/// (size, used) in bytes of the filesystem mounted at `dir`, as df counts them.
fn size_and_used(dir: &str) -> Result<(u64, u64)> {
    let text = run_tool(Command::new("df").arg("--output=size,used").arg("-B1").arg(dir))?;
    let line = text.lines().nth(1).context("df's output")?;
    let mut numbers = line.split_whitespace().map(str::parse::<u64>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(size)), Some(Ok(used))) => Ok((size, used)),
        _ => bail!("df's output for {dir}: {line:?}"),
    }
}

/// Bytes available to an unprivileged writer on the filesystem mounted at `dir` (df).
fn free_bytes(dir: &Path) -> Result<u64> {
    let text = run_tool(Command::new("df").arg("--output=avail").arg("-B1").arg(dir))?;
    text.lines().nth(1).and_then(|l| l.trim().parse().ok()).context("df's output")
}

/// Refuse early, with what is missing, rather than half-way through a run.
/// `own_targets`: the lab's own targets (members, the array it makes over them) and the
/// most room each can have; one too small for the filesystem is refused before any purge.
/// (Named targets are checked at `mount`, once their size is known.)
pub(super) fn check_tools(
    fs: FsKind,
    specs: &[TargetSpec],
    postmark: bool,
    own_targets: &[(&str, u64)],
) -> Result<()> {
    for &(what, size_bytes) in own_targets {
        check_fs_room(fs, what, size_bytes)?;
    }
    if super::current_uid()? != 0 {
        bail!(
            "video-frames and small-files make and mount a filesystem on each target \
             (mkfs, losetup, mount): run the lab as root for them"
        );
    }
    let mut tools = vec![fs.mkfs()[0], "losetup", "mount", "umount", "df"];
    if postmark {
        tools.push(POSTMARK);
    }
    if specs.iter().any(|s| matches!(s, TargetSpec::Flashraid | TargetSpec::Nbd(_))) {
        tools.extend(["nbdfuse", "fusermount3"]);
        if !Path::new("/dev/fuse").exists() {
            bail!("NBD targets reach a filesystem through nbdfuse, which needs /dev/fuse");
        }
    }
    for tool in tools {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            bail!(
                "{tool} not found (Debian: e2fsprogs or xfsprogs, mount, coreutils, \
                 libnbd-bin's nbdfuse, fuse3, postmark)"
            );
        }
    }
    Ok(())
}

/// Attach `file` to a loop device with direct IO and 4 KiB sectors; the device and whether
/// the kernel granted direct IO.
fn attach_loop(file: &Path) -> Result<(String, bool)> {
    let device = run_tool(
        Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--sector-size", "4096"])
            .arg(file),
    )?;
    let dio =
        run_tool(Command::new("losetup").args(["--noheadings", "-O", "DIO", "-l"]).arg(&device))
            .map(|v| v.trim() == "1")
            .unwrap_or(false);
    Ok((device, dio))
}

/// Make the filesystem stack on `target`.
fn mount(
    target: &Target,
    kind: FsKind,
    engine: flashraid_lab::profile::FileEngine,
) -> Result<Mounted> {
    let base = std::env::temp_dir().join(format!("flashraid-lab-mnt-{}", std::process::id()));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&base)
            .with_context(|| format!("mount directory {}", base.display()))?;
    }
    let mut mounted = Mounted {
        fs: FsTarget { dirs: vec![], free_bytes_min: 0, engine },
        description: String::new(),
        base: base.clone(),
        mounts: vec![],
        loops: vec![],
        fuse: None,
    };
    let files: Vec<PathBuf> = match target {
        Target::File { paths, .. } => paths.iter().map(PathBuf::from).collect(),
        Target::Nbd { uri, .. } => {
            let dir = base.join("fuse");
            std::fs::create_dir(&dir)?;
            // Its own process group, for the same reason as the server's (see `prepare`).
            let child =
                std::os::unix::process::CommandExt::process_group(&mut Command::new("nbdfuse"), 0)
                    .arg(&dir)
                    .arg(uri)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .context("starting nbdfuse")?;
            mounted.fuse = Some((dir.clone(), child));
            let file = dir.join("nbd");
            let deadline = Instant::now() + NBDFUSE_START_TIMEOUT;
            while !file.exists() {
                if let Some((_, child)) = mounted.fuse.as_mut()
                    && let Some(status) = child.try_wait()?
                {
                    bail!("nbdfuse exited with {status} before exposing {uri}");
                }
                if Instant::now() > deadline {
                    bail!("nbdfuse did not expose {uri} within {NBDFUSE_START_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            vec![file]
        }
    };
    let size_bytes = match target {
        Target::File { size_bytes, .. } | Target::Nbd { size_bytes, .. } => *size_bytes,
    };
    let what = if files.len() > 1 { "each member file is" } else { "the target is" };
    check_fs_room(kind, what, size_bytes)?;
    let mut layers = vec![];
    for (index, file) in files.iter().enumerate() {
        use std::os::unix::fs::FileTypeExt;
        let is_block = std::fs::metadata(file)?.file_type().is_block_device();
        let device = if is_block {
            layers.push(format!("{} directly", file.display()));
            file.display().to_string()
        } else {
            let (device, dio) = attach_loop(file)?;
            mounted.loops.push(device.clone());
            layers.push(format!(
                "{} on {device} (loop direct IO {})",
                file.display(),
                if dio { "on" } else { "OFF: reads may come from the page cache" }
            ));
            device
        };
        let mkfs = kind.mkfs();
        run_tool(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&device))?;
        let dir = base.join(format!("fs{index}"));
        std::fs::create_dir(&dir)?;
        run_tool(Command::new("mount").args(["-o", MOUNT_OPTIONS]).arg(&device).arg(&dir))?;
        mounted.mounts.push(dir.clone());
        mounted.fs.dirs.push(dir.display().to_string());
    }
    let mut free_min = u64::MAX;
    for dir in &mounted.mounts {
        free_min = free_min.min(free_bytes(dir)?);
    }
    mounted.fs.free_bytes_min = free_min;
    let via_fuse = if mounted.fuse.is_some() { "the export through nbdfuse: " } else { "" };
    mounted.description = format!(
        "{} filesystem(s) made with `{}`, mounted -o {MOUNT_OPTIONS}, {} free on the \
         smallest; {via_fuse}{}",
        mounted.mounts.len(),
        kind.mkfs().join(" "),
        crate::array_cmds::human(free_min),
        layers.join("; ")
    );
    Ok(mounted)
}

/// Remove what a test left in the filesystems (its files and per-job directories).
fn clear(fs: &FsTarget) -> Result<()> {
    for dir in &fs.dirs {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_name() == "lost+found" {
                continue;
            }
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .with_context(|| format!("clearing {}", path.display()))?;
        }
    }
    run_tool(&mut Command::new("sync")).map(|_| ())
}

/// video-frames or small-files over every target. Returns the report folder and Markdown.
pub(super) fn run_files(
    args: &LabRunArgs,
    specs: &[TargetSpec],
    shape: FilesShape,
    out: &Path,
    machine: &BTreeMap<String, String>,
) -> Result<(PathBuf, String)> {
    let profile = match shape {
        FilesShape::VideoFrames(_) => Profile::VideoFrames,
        FilesShape::SmallFiles(_) => Profile::SmallFiles,
    };
    let dir = out.join(profile.name());
    std::fs::create_dir_all(&dir)?;
    let conformance = workload_label(
        args.mode,
        &format!(
            "{} is the lab's filesystem workload, not a SNIA test: a fresh filesystem on each \
             purged target, no preconditioning, no steady-state rounds",
            profile.name()
        ),
    );
    let (run_id, mut manifest) = run_header(out, profile, args, machine);
    manifest
        .insert("filesystem".into(), format!("{} -o {MOUNT_OPTIONS}", args.fs.mkfs().join(" ")));
    let mut report = FilesReport {
        run_id,
        mode: args.mode,
        conformance,
        shape: shape.clone(),
        manifest,
        targets: vec![],
    };
    let write_partial = |report: &mut FilesReport, note: String| {
        report.conformance = report.conformance.clone().with_deviations(vec![note]);
        write_files_report(&dir, report)
    };
    for target in specs.iter().enumerate() {
        // A target that cannot be set up ends the run, but not the earlier targets' results.
        let (column, raw_dir, prepared) =
            match prepare_target(args, target, &dir, profile, &mut report.manifest) {
                Ok(prepared) => prepared,
                Err(e) => {
                    return Err(stopped_early(e, &dir, |note| write_partial(&mut report, note)));
                }
            };
        let mut target = FilesTarget {
            name: column.clone(),
            description: prepared.description.clone(),
            filesystem: String::new(),
            frames: vec![],
            large_files: vec![],
            fill: vec![],
            metadata: vec![],
            data: None,
            postmark: None,
            skipped: vec![],
        };
        let result = (|| -> Result<()> {
            let mounted = mount(&prepared.target, args.fs, super::engine(args))?;
            target.filesystem = mounted.description.clone();
            let ran = match &shape {
                FilesShape::VideoFrames(shape) => {
                    run_frames(args, shape, &mounted.fs, &raw_dir, &column, &mut target)
                }
                FilesShape::SmallFiles(shape) => {
                    run_small(args, shape, &mounted.fs, &raw_dir, &column, &mut target)
                }
            };
            ran.and(mounted.unmount())
        })();
        report.targets.push(target);
        close_target(result, prepared.server, &dir, |note| write_partial(&mut report, note))?;
    }
    write_files_report(&dir, &report)?;
    Ok((dir, render_files_markdown(&report)))
}

fn write_files_report(dir: &Path, report: &FilesReport) -> Result<()> {
    let json = serde_json::to_string_pretty(report)? + "\n";
    write_outputs(
        dir,
        "files-run.json",
        json,
        &render_files_markdown(report),
        render_files_html(report),
        &report.manifest,
    )
}

/// Parse fio's JSON and fail on any job fio says failed.
fn checked_jobs(text: &str, what: &str) -> Result<Vec<flashraid_lab::fio::JobResult>> {
    let parsed = parse_fio_output(text).with_context(|| format!("fio output of {what}"))?;
    if let Some(bad) = parsed.jobs.iter().find(|j| j.error_code != 0) {
        bail!("{what}: fio job {} failed with error {}", bad.name, bad.error_code);
    }
    Ok(parsed.jobs)
}

/// fio's per-IO latency log of job `n` (from 1) of the run logged as `name`.
fn read_lat_log(raw_dir: &Path, name: &str, n: u32) -> Result<Vec<IoSample>> {
    let path = raw_dir.join(format!("{name}_lat.{n}.log"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("fio's latency log {}", path.display()))?;
    parse_lat_log(&text).with_context(|| path.display().to_string())
}

fn run_frames(
    args: &LabRunArgs,
    shape: &VideoFramesShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    for format in &shape.formats {
        for &streams in &shape.streams {
            let test = format!("{} x{streams}", format.name);
            let Some(frames) = frames_that_fit(shape, format, streams, fs) else {
                target.skipped.push(SkippedTest {
                    test,
                    reason: format!(
                        "fewer than {} frames a stream fit in {}% of the free space",
                        shape.frames_per_stream_min, shape.space_percent_max
                    ),
                });
                continue;
            };
            let bytes = format.frame_bytes() * u64::from(frames) * u64::from(streams);
            let limit = ROUND_OVERRUN + Duration::from_secs(bytes / WEDGED_BYTES_PER_S);
            for phase in [FramePhase::Write, FramePhase::Read] {
                let name = frames_log_name(format, streams, phase);
                eprintln!(
                    "[video-frames] {column}: {test}, {frames} frames a stream, {}",
                    phase.name()
                );
                let test = FramesTest { format, streams, frames, phase, limit };
                let run = run_frames_phase(args, shape, &test, fs, raw_dir, &name)?;
                eprintln!(
                    "    {:.0} MB/s, {:.1} frames/s, p99 {:.1} ms, max {:.1} ms",
                    run.mb_per_s, run.frames_per_s, run.frame_ms_p99, run.frame_ms_max
                );
                target.frames.push(run);
            }
            clear(fs)?;
        }
    }
    run_large_files(args, shape, fs, raw_dir, column, target)?;
    run_fill_sweep(args, shape, fs, raw_dir, column, target)
}

/// One phase of frame files: what to run.
struct FramesTest<'a> {
    format: &'a flashraid_lab::profile::FrameFormat,
    streams: u32,
    frames: u32,
    phase: FramePhase,
    limit: Duration,
}

/// Run one phase of frame files in `fs`, logged as `name`, and check every frame was timed.
fn run_frames_phase(
    args: &LabRunArgs,
    shape: &VideoFramesShape,
    test: &FramesTest<'_>,
    fs: &FsTarget,
    raw_dir: &Path,
    name: &str,
) -> Result<flashraid_lab::files::FramesRun> {
    let FramesTest { format, streams, frames, phase, limit } = *test;
    let job = render_frames(format, streams, frames, fs, phase, name)?;
    let text = run_fio(&args.fio, raw_dir, name, &job, Some(limit))?;
    checked_jobs(&text, name)?;
    let logs = (1..=streams).map(|n| read_lat_log(raw_dir, name, n)).collect::<Result<Vec<_>>>()?;
    let run = frames_run(shape, format, streams, phase, &logs)
        .with_context(|| format!("{name}: no frame completed"))?;
    if run.frames != u64::from(frames) * u64::from(streams) {
        bail!("{name}: {} frames logged, {} expected", run.frames, frames * streams);
    }
    Ok(run)
}

/// P5c: batches of frame files (the largest format, the shape's most streams, spread over the
/// filesystems as in the frames tests) into directories of their own until the fullest
/// filesystem a stream writes to is `fill_percent_max` full; then
/// every other batch deleted and as many written again into the holes; then the oldest
/// batch read back. Each batch is timed as a frames test, with how full it left the target.
fn run_fill_sweep(
    args: &LabRunArgs,
    shape: &VideoFramesShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    let Some(format) = shape.largest_format() else {
        return Ok(());
    };
    if shape.fill_batches == 0 {
        return Ok(());
    }
    // fio gives stream j directory j mod dirs (as in the frames tests): the filesystems the
    // first `streams` directories are on fill, each with `per_fs` streams.
    let streams = shape.streams.iter().copied().max().unwrap_or(1).max(1);
    let written = &fs.dirs[..fs.dirs.len().min(streams as usize)];
    let per_fs = streams.div_ceil(u32::try_from(fs.dirs.len()).unwrap_or(u32::MAX).max(1));
    let fullness =
        || -> Result<Vec<(u64, u64)>> { written.iter().map(|d| size_and_used(d)).collect() };
    let percent_full = |filesystems: &[(u64, u64)]| {
        filesystems
            .iter()
            .map(|&(size, used)| used as f64 * 100.0 / size.max(1) as f64)
            .fold(0.0, f64::max)
    };
    let Some(frames) = fill_batch_frames(
        &fullness()?,
        shape.fill_percent_max,
        shape.fill_batches,
        format.frame_bytes(),
        per_fs,
        shape.frames_per_stream_min,
    ) else {
        target.skipped.push(SkippedTest {
            test: "fill sweep".into(),
            reason: format!(
                "fewer than {} frames a stream per batch fit below {}% full",
                shape.frames_per_stream_min, shape.fill_percent_max
            ),
        });
        return Ok(());
    };
    let bytes = format.frame_bytes() * u64::from(frames) * u64::from(streams);
    let limit = ROUND_OVERRUN + Duration::from_secs(bytes / WEDGED_BYTES_PER_S);
    let batch_dirs = |batch: u32| -> Result<FsTarget> {
        let dirs = fs
            .dirs
            .iter()
            .map(|d| {
                let dir = format!("{d}/fill-{batch:02}");
                std::fs::create_dir_all(&dir).with_context(|| format!("creating {dir}"))?;
                Ok(dir)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(FsTarget { dirs, ..fs.clone() })
    };
    let mut run_batch = |batch: u32, step: FillStep| -> Result<()> {
        let phase = if step == FillStep::ReadOldest { FramePhase::Read } else { FramePhase::Write };
        let name = fill_log_name(batch, step);
        eprintln!("[video-frames] {column}: fill sweep, batch {batch} ({})", step.name());
        let test = FramesTest { format, streams, frames, phase, limit };
        let run = run_frames_phase(args, shape, &test, &batch_dirs(batch)?, raw_dir, &name)?;
        let fill_percent = percent_full(&fullness()?);
        eprintln!("    {:.0} MB/s at {fill_percent:.1}% full", run.mb_per_s);
        target.fill.push(FillBatch { step, batch, fill_percent, run });
        Ok(())
    };
    for batch in 0..shape.fill_batches {
        run_batch(batch, FillStep::Fill)?;
    }
    // Holes: every other batch, the oldest kept.
    let holes: Vec<u32> = (1..shape.fill_batches).step_by(2).collect();
    for &batch in &holes {
        for d in &fs.dirs {
            let dir = format!("{d}/fill-{batch:02}");
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {dir}"))?;
        }
    }
    run_tool(&mut Command::new("sync"))?;
    for i in 0..u32::try_from(holes.len()).unwrap_or(0) {
        run_batch(shape.fill_batches + i, FillStep::Rewrite)?;
    }
    run_batch(0, FillStep::ReadOldest)?;
    clear(fs)
}

/// P5a: per size of the ladder and per queue depth, one large file of the largest format
/// written frame by frame, then read back.
fn run_large_files(
    args: &LabRunArgs,
    shape: &VideoFramesShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    let Some(format) = shape.largest_format() else {
        return Ok(());
    };
    // The file lives on the first filesystem (one per member for the raw members).
    let budget = fs.free_bytes_min / 100 * u64::from(shape.space_percent_max);
    for &file_bytes in &shape.large_file_bytes {
        for &iodepth in &shape.large_file_depths {
            let test = format!("large file {} MiB QD{iodepth}", file_bytes >> 20);
            let frames = large_file_frames(format, file_bytes);
            let reason = if file_bytes > budget {
                Some(format!(
                    "it does not fit in {}% of the free space ({} MiB)",
                    shape.space_percent_max,
                    budget >> 20
                ))
            } else if frames < u64::from(shape.frames_per_stream_min) {
                Some(format!(
                    "it holds {frames} {} frames, fewer than {}",
                    format.name, shape.frames_per_stream_min
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                target.skipped.push(SkippedTest { test, reason });
                continue;
            }
            let limit = ROUND_OVERRUN + Duration::from_secs(file_bytes / WEDGED_BYTES_PER_S);
            for phase in [FramePhase::Write, FramePhase::Read] {
                let name = large_file_log_name(format, file_bytes, iodepth, phase);
                eprintln!("[video-frames] {column}: {test}, {frames} frames, {}", phase.name());
                let job = render_large_file(format, file_bytes, iodepth, fs, phase)?;
                let text = run_fio(&args.fio, raw_dir, &name, &job, Some(limit))?;
                checked_jobs(&text, &name)?;
                let samples = read_lat_log(raw_dir, &name, 1)?;
                let large =
                    LargeFileRun::from_samples(shape, format, file_bytes, iodepth, phase, samples)
                        .with_context(|| format!("{name}: no frame completed"))?;
                if large.run.frames != frames {
                    bail!("{name}: {} frames logged, {frames} expected", large.run.frames);
                }
                eprintln!(
                    "    {:.0} MB/s (min {:.0}), p99 {:.1} ms, max {:.1} ms",
                    large.run.mb_per_s,
                    large.min_mb_per_s,
                    large.run.frame_ms_p99,
                    large.run.frame_ms_max
                );
                target.large_files.push(large);
            }
            clear(fs)?;
        }
    }
    Ok(())
}

fn run_small(
    args: &LabRunArgs,
    shape: &SmallFilesShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    for &jobs in &shape.metadata_jobs {
        for dir in &fs.dirs {
            for sub in metadata_subdirs(jobs) {
                std::fs::create_dir(Path::new(dir).join(sub))?;
            }
        }
        for op in MetaOp::ALL {
            let name = format!("meta-{}-j{jobs}", op.name());
            eprintln!(
                "[small-files] {column}: {} {} files, {jobs} job(s)",
                op.name(),
                shape.metadata_files
            );
            let job = render_metadata(op, jobs, shape.metadata_files, fs)?;
            let text = run_fio(&args.fio, raw_dir, &name, &job, Some(ROUND_OVERRUN * 2))?;
            let results = checked_jobs(&text, &name)?;
            let run = MetaRun::from_job(op, jobs, &results[0]);
            eprintln!("    {:.0} ops/s", run.ops_per_s);
            target.metadata.push(run);
        }
        clear(fs)?;
    }
    run_small_data(args, shape, fs, raw_dir, column, target)?;
    if let Some(postmark) = &shape.postmark {
        run_postmark(args, postmark, fs, raw_dir, column, target)?;
    }
    Ok(())
}

fn run_small_data(
    args: &LabRunArgs,
    shape: &SmallFilesShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    let data_bytes = u64::from(shape.data_files) * shape.data_file_size_bytes;
    if data_bytes > fs.free_bytes_min.saturating_mul(fs.dirs.len() as u64) / 2 {
        target.skipped.push(SkippedTest {
            test: "data".into(),
            reason: format!("its {} bytes of files need half the free space", data_bytes),
        });
        return Ok(());
    }
    eprintln!(
        "[small-files] {column}: data, {} files, {} jobs, {} s",
        shape.data_files, shape.data_jobs, shape.data_runtime_s
    );
    let layout = render_small_data(shape, fs, args.seed, true)?;
    run_fio(&args.fio, raw_dir, "data-layout", &layout, Some(ROUND_OVERRUN * 2))?;
    run_tool(&mut Command::new("sync"))?;
    let job = render_small_data(shape, fs, args.seed, false)?;
    let limit = Duration::from_secs(u64::from(shape.data_runtime_s)) + ROUND_OVERRUN;
    let text = run_fio(&args.fio, raw_dir, "data", &job, Some(limit))?;
    let mut results = checked_jobs(&text, "data")?;
    let data = results.remove(0);
    eprintln!(
        "    {:.0} read + {:.0} write IOPS, {} fsyncs",
        data.read.iops,
        data.write.iops,
        data.sync.as_ref().map_or(0, |s| s.syncs)
    );
    target.data = Some(data);
    clear(fs)
}

/// P6a: one PostMark process per filesystem, all started together, each with its share of
/// the files and transactions; its report (and command file) kept in `raw_dir`.
fn run_postmark(
    args: &LabRunArgs,
    shape: &PostmarkShape,
    fs: &FsTarget,
    raw_dir: &Path,
    column: &str,
    target: &mut FilesTarget,
) -> Result<()> {
    let processes = u32::try_from(fs.dirs.len()).context("filesystems")?;
    // Each process's share of the files at their largest, on its own filesystem.
    let share_bytes = u64::from(shape.share(0, processes).0) * u64::from(shape.size_max_bytes);
    if share_bytes > fs.free_bytes_min / 2 {
        target.skipped.push(SkippedTest {
            test: "postmark".into(),
            reason: format!(
                "its files may take {share_bytes} bytes per filesystem, more than half the free space"
            ),
        });
        return Ok(());
    }
    eprintln!(
        "[small-files] {column}: PostMark, {} files, {} transactions, {processes} process(es)",
        shape.files, shape.transactions
    );
    let limit = Duration::from_secs(u64::from(shape.time_limit_s));
    let mut children = Vec::with_capacity(fs.dirs.len());
    let started = Instant::now();
    for (index, dir) in fs.dirs.iter().enumerate() {
        let location = Path::new(dir).join("postmark");
        std::fs::create_dir(&location)?;
        let location = location.to_str().context("a filesystem path that is not UTF-8")?;
        let config = render_postmark_config(shape, location, index as u32, processes, args.seed)?;
        let config_path = raw_dir.join(format!("postmark-{index}.cfg"));
        std::fs::write(&config_path, config)?;
        let output = raw_dir.join(format!("postmark-{index}.out"));
        let mut command = Command::new(POSTMARK);
        flashraid_nbd::signals::unblock_in_child(&mut command);
        command
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&output)?)
            .stderr(Stdio::inherit());
        children.push((command.spawn().context("running postmark")?, output));
    }
    let mut done = vec![false; children.len()];
    let mut failure = None;
    while done.iter().any(|d| !d) {
        for (k, (child, _)) in children.iter_mut().enumerate() {
            if done[k] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                done[k] = true;
                if !status.success() && failure.is_none() {
                    failure = Some(format!("postmark {k} on {column} ended with {status}"));
                }
            }
        }
        let interrupted = super::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst);
        if failure.is_some() || interrupted || started.elapsed() > limit {
            for (k, (child, _)) in children.iter_mut().enumerate() {
                if !done[k] {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            if interrupted {
                bail!("interrupted by a signal while PostMark ran on {column}");
            }
            bail!(
                "{}",
                failure.unwrap_or_else(|| format!(
                    "PostMark ran {} s on {column}, past its limit: the target seems wedged",
                    started.elapsed().as_secs()
                ))
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut outputs = Vec::with_capacity(children.len());
    for (_, path) in &children {
        let text = std::fs::read_to_string(path)?;
        outputs.push(parse_postmark(&text).with_context(|| format!("{}", path.display()))?);
    }
    let run = PostmarkRun { processes: outputs, wall_seconds };
    eprintln!(
        "    {:.0} transactions/s (PostMark), {:.0} file ops/s over {:.1} s",
        run.transactions_per_s(),
        run.file_ops_per_s(),
        run.wall_seconds
    );
    target.postmark = Some(run);
    clear(fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_text_after_the_error_is_counted_not_copied() {
        let stderr = "Filesystem must be larger than 300MB.\nUsage: mkfs.xfs\n\n/* blocksize */ [-b size=num]\n/* config */ [-c x]\n";
        assert_eq!(
            stderr_head(stderr),
            "Filesystem must be larger than 300MB. Usage: mkfs.xfs /* blocksize */ [-b size=num] \
             (and 1 more lines)"
        );
        assert_eq!(stderr_head("one line\n"), "one line");
        assert_eq!(stderr_head(""), "");
    }

    #[test]
    fn a_device_too_small_for_the_filesystem_is_refused_with_the_way_out() {
        let e =
            check_fs_room(FsKind::Xfs, "each member file is", 16 << 20).unwrap_err().to_string();
        assert!(e.contains("16.0 MiB") && e.contains("300") && e.contains("--fs ext4"), "{e}");
        check_fs_room(FsKind::Xfs, "the target", 300 << 20).unwrap();
        check_fs_room(FsKind::Ext4, "each member file", 16 << 20).unwrap();
        let own = [("each member file (the `members` target) is", 64 << 20)];
        let e = check_tools(FsKind::Xfs, &[TargetSpec::Members], false, &own).unwrap_err();
        assert!(e.to_string().contains("`members` target"), "{e}");
    }
}
