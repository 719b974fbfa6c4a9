//! Lab profiles, their SNIA test plans, and the fio job files a round runs.
//!
//! Owns: the identity of the seven profiles of benchmark-method.md §7.3, the presets of the three
//! SNIA profiles, the element matrix of a round (order included: R/W mix is the outer loop from
//! 100 % read down, block size the inner loop from largest down, as PTS requires), the tracking
//! variables, the stop rule, the WIPC job, and the INI text of a round for a [`Target`].
//!
//! Invariants: job files are a pure function of (plan, target, seed), byte for byte, so a report
//! can store the exact files it ran and a rerun produces the same text. Every element is its own
//! `stonewall`ed section under `group_reporting=1`, so fio reports one result per element, named
//! as the element. Sequential streams of several threads get disjoint slices
//! (`size` + `offset_increment`) because fio starts every sequential job at offset 0.
//!
//! Limits: the four non-SNIA profiles (P4-P7) are described here as data ([`workload_shape`]);
//! their job files are rendered in `vm`, `files` and `degraded` (vm-images' here). Quick mode
//! exists to check the pipeline on the 2-core CI box and never yields a performance claim.

use crate::steady::{ROUNDS_MAX_SNIA, StopRule, WINDOW_ROUNDS_SNIA};
use serde::{Deserialize, Serialize};
use std::fmt::{self, Write as _};
use std::str::FromStr;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
#[cfg(test)]
const GIB: u64 = 1024 * MIB;

/// fio's percentile list for every element (benchmark-method.md §7.2).
pub const PERCENTILE_LIST: &str = "50:90:99:99.9:99.99:99.999";
/// fio start-up and reporting overhead per stonewalled element, measured on the CI box
/// (64.1 s for 49 one-second elements, benchmark-method.md §6); for time budgets only.
pub const ELEMENT_OVERHEAD_MS_ESTIMATE: u64 = 310;

/// The seven lab profiles, named as in benchmark-method.md §7.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    SniaIops,
    SniaLatency,
    SniaThroughput,
    VmImages,
    VideoFrames,
    SmallFiles,
    DegradedRebuild,
}

impl Profile {
    pub const ALL: [Profile; 7] = [
        Profile::SniaIops,
        Profile::SniaLatency,
        Profile::SniaThroughput,
        Profile::VmImages,
        Profile::VideoFrames,
        Profile::SmallFiles,
        Profile::DegradedRebuild,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Profile::SniaIops => "snia-iops",
            Profile::SniaLatency => "snia-latency",
            Profile::SniaThroughput => "snia-throughput",
            Profile::VmImages => "vm-images",
            Profile::VideoFrames => "video-frames",
            Profile::SmallFiles => "small-files",
            Profile::DegradedRebuild => "degraded-rebuild",
        }
    }

    /// The presets a profile accepts; the first is the default. Empty for non-SNIA profiles.
    pub fn presets(self) -> &'static [Preset] {
        match self {
            Profile::SniaIops => &[Preset::Spec11, Preset::Spec20, Preset::Raidix2018],
            Profile::SniaLatency | Profile::SniaThroughput => &[Preset::Spec, Preset::Raidix2018],
            _ => &[],
        }
    }

    pub fn is_snia(self) -> bool {
        !self.presets().is_empty()
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = ProfileError;
    fn from_str(text: &str) -> Result<Profile, ProfileError> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| ProfileError::UnknownProfile(text.to_string()))
    }
}

/// Parameter presets of the SNIA profiles (benchmark-method.md §1 and §7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Preset {
    /// PTS-E 1.1 IOPS: 8 block sizes x 7 mixes, tracking 0/100 4 KiB.
    #[serde(rename = "spec-1.1")]
    Spec11,
    /// PTS 2.0.x IOPS: the same matrix, three tracking variables, TC 4 / QD 32.
    #[serde(rename = "spec-2.0")]
    Spec20,
    /// The spec's latency or throughput test.
    #[serde(rename = "spec")]
    Spec,
    /// The RAIDIX 2018 article's parameters, to reproduce that comparison.
    #[serde(rename = "raidix-2018")]
    Raidix2018,
}

impl Preset {
    pub const ALL: [Preset; 4] = [Preset::Spec11, Preset::Spec20, Preset::Spec, Preset::Raidix2018];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Spec11 => "spec-1.1",
            Preset::Spec20 => "spec-2.0",
            Preset::Spec => "spec",
            Preset::Raidix2018 => "raidix-2018",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = ProfileError;
    fn from_str(text: &str) -> Result<Preset, ProfileError> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| ProfileError::UnknownPreset(text.to_string()))
    }
}

/// Quick: the CI box, pipeline check only. Full: real hardware, durations per the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Quick,
    Full,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = ProfileError;
    fn from_str(text: &str) -> Result<Mode, ProfileError> {
        match text {
            "quick" => Ok(Mode::Quick),
            "full" => Ok(Mode::Full),
            _ => Err(ProfileError::UnknownMode(text.to_string())),
        }
    }
}

/// What a report may claim (benchmark-method.md §7.1 rule 1). The plan proposes a label; the
/// runner demotes it with [`ConformanceLabel::with_deviations`] when, for example, purge or
/// write-cache control was impossible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ConformanceLabel {
    /// CI: checks the pipeline; never a performance statement. Deviations are still listed
    /// (what a full run with the same settings would have to declare).
    QuickSmoke {
        #[serde(default)]
        deviations: Vec<String>,
    },
    SniaDerived {
        preset: Preset,
        deviations: Vec<String>,
    },
    SniaConformant {
        preset: Preset,
    },
    /// A full run of one of the lab's own workloads (vm-images, video-frames, small-files,
    /// degraded-rebuild): no SNIA PTS test stands behind it, so it names no preset and claims
    /// nothing of the spec; the deviations say how it was run.
    Workload {
        #[serde(default)]
        deviations: Vec<String>,
    },
}

impl ConformanceLabel {
    /// The heading every report starts with.
    pub fn title(&self) -> String {
        match self {
            ConformanceLabel::QuickSmoke { .. } => {
                "quick-smoke (pipeline check; not a performance statement)".to_string()
            }
            ConformanceLabel::SniaDerived { preset, .. } => {
                format!("SNIA-derived (preset {preset})")
            }
            ConformanceLabel::SniaConformant { preset } => {
                format!("SNIA-conformant (preset {preset})")
            }
            ConformanceLabel::Workload { .. } => {
                "workload profile, full mode (the lab's own workload, not a SNIA PTS test)"
                    .to_string()
            }
        }
    }

    pub fn deviations(&self) -> &[String] {
        match self {
            ConformanceLabel::SniaDerived { deviations, .. }
            | ConformanceLabel::QuickSmoke { deviations }
            | ConformanceLabel::Workload { deviations } => deviations,
            ConformanceLabel::SniaConformant { .. } => &[],
        }
    }

    /// Add deviations: a conformant label becomes derived; quick-smoke stays quick-smoke and
    /// lists them.
    pub fn with_deviations(self, more: Vec<String>) -> ConformanceLabel {
        match self {
            _ if more.is_empty() => self,
            ConformanceLabel::QuickSmoke { mut deviations } => {
                deviations.extend(more);
                ConformanceLabel::QuickSmoke { deviations }
            }
            ConformanceLabel::SniaConformant { preset } => {
                ConformanceLabel::SniaDerived { preset, deviations: more }
            }
            ConformanceLabel::SniaDerived { preset, mut deviations } => {
                deviations.extend(more);
                ConformanceLabel::SniaDerived { preset, deviations }
            }
            ConformanceLabel::Workload { mut deviations } => {
                deviations.extend(more);
                ConformanceLabel::Workload { deviations }
            }
        }
    }
}

/// Random elements sweep the whole region; sequential ones stream through per-thread slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    Random,
    Sequential,
}

/// One element of a round: one stonewalled fio job section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Element {
    /// Section and result name: `r65-4k` (random, 65 % reads) or `seq-1m-write`.
    pub name: String,
    pub pattern: Pattern,
    pub block_size_bytes: u64,
    /// Percentage of IOs that are reads, 0..=100.
    pub read_percent: u8,
    /// fio `numjobs` (SNIA's thread count, TC).
    pub threads: u32,
    /// fio `iodepth` per thread (SNIA's OIO/thread, QD).
    pub queue_depth: u32,
}

impl Element {
    fn random(read_percent: u8, block_size_bytes: u64, threads: u32, queue_depth: u32) -> Element {
        Element {
            name: format!("r{read_percent}-{}", size_label(block_size_bytes)),
            pattern: Pattern::Random,
            block_size_bytes,
            read_percent,
            threads,
            queue_depth,
        }
    }

    fn sequential(read: bool, block_size_bytes: u64, threads: u32, queue_depth: u32) -> Element {
        let direction = if read { "read" } else { "write" };
        Element {
            name: format!("seq-{}-{direction}", size_label(block_size_bytes)),
            pattern: Pattern::Sequential,
            block_size_bytes,
            read_percent: if read { 100 } else { 0 },
            threads,
            queue_depth,
        }
    }
}

/// The value of an element that steady state tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrackingMetric {
    /// Read + write IOPS (IOPS test).
    IopsTotal,
    /// Mean total latency over all IOs (latency test).
    LatencyUsMean,
    /// Sequential write bandwidth (throughput test), decimal MB/s (10^6 bytes per second).
    WriteMegabytesPerS,
}

impl TrackingMetric {
    pub fn label(self) -> &'static str {
        match self {
            TrackingMetric::IopsTotal => "IOPS",
            TrackingMetric::LatencyUsMean => "mean latency (us)",
            TrackingMetric::WriteMegabytesPerS => "write MB/s",
        }
    }
}

/// A tracking variable: one metric of one element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackingVariable {
    pub element: String,
    pub metric: TrackingMetric,
}

impl TrackingVariable {
    pub fn label(&self) -> String {
        format!("{} {}", self.metric.label(), self.element)
    }
}

/// Workload-independent preconditioning: sequential writes over the whole target, size-based
/// (never time-based: it must write `loops` times the capacity, benchmark-method.md §3.2 item 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Precondition {
    pub block_size_bytes: u64,
    pub queue_depth: u32,
    /// Passes over the capacity; SNIA asks for 2x user capacity.
    pub loops: u32,
}

/// One SNIA test: its own WIPC, rounds of elements, tracking variables and stop rule. The
/// throughput profile has one test per block size (each with its own purge and WIPC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestPlan {
    /// Globally meaningful, e.g. `snia-iops` or `snia-throughput-1m`.
    pub name: String,
    /// In run order.
    pub elements: Vec<Element>,
    pub tracking: Vec<TrackingVariable>,
    pub element_runtime_s: u32,
    pub stop: StopRule,
    pub wipc: Precondition,
    /// Run with `lat_percentiles=1` so percentiles are of total latency (latency test).
    pub latency_percentiles_total: bool,
}

impl TestPlan {
    /// Measured time of one round, without fio's per-element overhead.
    pub fn round_runtime_s(&self) -> u64 {
        self.elements.len() as u64 * u64::from(self.element_runtime_s)
    }

    /// Wall-time estimate of one round including fio's per-element overhead, for budgets.
    pub fn round_wall_ms_estimate(&self) -> u64 {
        self.elements.len() as u64
            * (u64::from(self.element_runtime_s) * 1000 + ELEMENT_OVERHEAD_MS_ESTIMATE)
    }

    pub fn element(&self, name: &str) -> Option<&Element> {
        self.elements.iter().find(|e| e.name == name)
    }
}

/// A SNIA profile ready to run: its tests and the label its report may carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfilePlan {
    pub profile: Profile,
    pub preset: Preset,
    pub mode: Mode,
    pub tests: Vec<TestPlan>,
    pub conformance: ConformanceLabel,
}

/// Errors in choosing a profile or rendering its job files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("unknown profile {0:?}")]
    UnknownProfile(String),
    #[error("unknown preset {0:?}")]
    UnknownPreset(String),
    #[error("unknown mode {0:?} (quick or full)")]
    UnknownMode(String),
    #[error("preset {preset} does not apply to profile {profile}")]
    PresetNotForProfile { preset: Preset, profile: Profile },
    #[error("profile {0} is not a SNIA profile; its runner is not built yet")]
    NotSnia(Profile),
    #[error("target has no paths")]
    NoPaths,
    #[error("{what} {value:?} cannot go into a fio job file: {reason}")]
    UnsafeValue { what: &'static str, value: String, reason: &'static str },
    #[error("target region of {region_bytes} bytes is smaller than {needed_bytes} bytes ({why})")]
    TargetTooSmall { region_bytes: u64, needed_bytes: u64, why: &'static str },
    #[error("{hosts} load hosts for {vms} VMs: every load host runs at least one VM")]
    TooManyHosts { hosts: usize, vms: u32 },
}

/// Quick mode caps threads and queue depth at the shape measured on the 2-core CI box (TC 2,
/// QD 8, benchmark-method.md §6); more would measure the scheduler, not the array.
const QUICK_THREADS_MAX: u32 = 2;
const QUICK_QUEUE_DEPTH_MAX: u32 = 8;
/// Quick mode's round limit (benchmark-method.md §7.3 P1).
const QUICK_ROUNDS_MAX: usize = 6;
const QUICK_ELEMENT_RUNTIME_S: u32 = 1;
const FULL_ELEMENT_RUNTIME_S: u32 = 60;

/// SNIA's R/W mixes, read percent, in loop order.
const MIXES_SPEC: [u8; 7] = [100, 95, 65, 50, 35, 5, 0];
const MIXES_SHORT: [u8; 3] = [100, 65, 0];
const BLOCK_SIZES_IOPS_SPEC: [u64; 8] =
    [MIB, 128 * KIB, 64 * KIB, 32 * KIB, 16 * KIB, 8 * KIB, 4 * KIB, 512];
const BLOCK_SIZES_IOPS_QUICK: [u64; 3] = [MIB, 64 * KIB, 4 * KIB];
const BLOCK_SIZES_LATENCY_SPEC: [u64; 3] = [8 * KIB, 4 * KIB, 512];
const BLOCK_SIZES_LATENCY_RAIDIX: [u64; 3] = [16 * KIB, 8 * KIB, 4 * KIB];
const BLOCK_SIZES_THROUGHPUT: [u64; 2] = [MIB, 128 * KIB];

/// The plan of a SNIA profile. `preset` must be one of [`Profile::presets`].
///
/// Operator choices, recorded here because PTS-E 1.1 leaves them open: spec-1.1 IOPS runs at
/// TC 4 / QD 32 (2.0.x's PTS-E recommendation), spec throughput at TC 1 / QD 32 (SSSPT's 2.0.1
/// reading). Quick mode uses the 3x3 IOPS matrix, 1-s elements, at most 6 rounds, and caps
/// TC/QD at 2/8; its label is always quick-smoke.
pub fn plan_snia(
    profile: Profile,
    preset: Preset,
    mode: Mode,
) -> Result<ProfilePlan, ProfileError> {
    if !profile.is_snia() {
        return Err(ProfileError::NotSnia(profile));
    }
    if !profile.presets().contains(&preset) {
        return Err(ProfileError::PresetNotForProfile { preset, profile });
    }
    let (element_runtime_s, stop) = match mode {
        Mode::Quick => (
            QUICK_ELEMENT_RUNTIME_S,
            StopRule { window_rounds: WINDOW_ROUNDS_SNIA, rounds_max: QUICK_ROUNDS_MAX },
        ),
        Mode::Full => (
            FULL_ELEMENT_RUNTIME_S,
            StopRule { window_rounds: WINDOW_ROUNDS_SNIA, rounds_max: ROUNDS_MAX_SNIA },
        ),
    };
    let shape = Shape { mode, element_runtime_s, stop };
    let (tests, deviations) = match profile {
        Profile::SniaIops => plan_iops(preset, shape),
        Profile::SniaLatency => plan_latency(preset, shape),
        _ => plan_throughput(preset, shape),
    };
    let conformance = match mode {
        Mode::Quick => ConformanceLabel::QuickSmoke { deviations },
        Mode::Full if deviations.is_empty() => ConformanceLabel::SniaConformant { preset },
        Mode::Full => ConformanceLabel::SniaDerived { preset, deviations },
    };
    Ok(ProfilePlan { profile, preset, mode, tests, conformance })
}

#[derive(Clone, Copy)]
struct Shape {
    mode: Mode,
    element_runtime_s: u32,
    stop: StopRule,
}

impl Shape {
    fn threads(self, full: u32) -> u32 {
        if self.mode == Mode::Quick { full.min(QUICK_THREADS_MAX) } else { full }
    }
    fn queue_depth(self, full: u32) -> u32 {
        if self.mode == Mode::Quick { full.min(QUICK_QUEUE_DEPTH_MAX) } else { full }
    }
}

/// SEQ 128 KiB, QD 32, twice over: the WIPC of the IOPS and latency tests.
const WIPC_128K: Precondition =
    Precondition { block_size_bytes: 128 * KIB, queue_depth: 32, loops: 2 };

fn matrix(mixes: &[u8], block_sizes: &[u64], threads: u32, queue_depth: u32) -> Vec<Element> {
    // Mix is the outer loop and block size the inner one; PTS requires this nesting and order.
    mixes
        .iter()
        .flat_map(|&mix| {
            block_sizes.iter().map(move |&bs| Element::random(mix, bs, threads, queue_depth))
        })
        .collect()
}

fn track(metric: TrackingMetric, names: &[&str]) -> Vec<TrackingVariable> {
    names.iter().map(|n| TrackingVariable { element: n.to_string(), metric }).collect()
}

fn plan_iops(preset: Preset, shape: Shape) -> (Vec<TestPlan>, Vec<String>) {
    let (threads, queue_depth) = match preset {
        Preset::Raidix2018 => (64, 32),
        _ => (4, 32),
    };
    let block_sizes: &[u64] = match (shape.mode, preset) {
        (Mode::Quick, _) => &BLOCK_SIZES_IOPS_QUICK,
        (Mode::Full, Preset::Raidix2018) => &BLOCK_SIZES_IOPS_SPEC[..7],
        (Mode::Full, _) => &BLOCK_SIZES_IOPS_SPEC,
    };
    let mixes: &[u8] = if shape.mode == Mode::Quick { &MIXES_SHORT } else { &MIXES_SPEC };
    let tracking = match preset {
        Preset::Spec20 => track(TrackingMetric::IopsTotal, &["r0-4k", "r65-64k", "r100-1m"]),
        _ => track(TrackingMetric::IopsTotal, &["r0-4k"]),
    };
    let deviations = match preset {
        Preset::Raidix2018 => {
            vec!["block size 0.5 KiB dropped (7 block sizes, 49 elements per round)".to_string()]
        }
        _ => Vec::new(),
    };
    let test = TestPlan {
        name: Profile::SniaIops.name().to_string(),
        elements: matrix(
            mixes,
            block_sizes,
            shape.threads(threads),
            shape.queue_depth(queue_depth),
        ),
        tracking,
        element_runtime_s: shape.element_runtime_s,
        stop: shape.stop,
        wipc: WIPC_128K,
        latency_percentiles_total: false,
    };
    (vec![test], deviations)
}

fn plan_latency(preset: Preset, shape: Shape) -> (Vec<TestPlan>, Vec<String>) {
    let (block_sizes, deviations) = match preset {
        Preset::Raidix2018 => {
            (&BLOCK_SIZES_LATENCY_RAIDIX, vec!["block size 16 KiB instead of 0.5 KiB".to_string()])
        }
        _ => (&BLOCK_SIZES_LATENCY_SPEC, Vec::new()),
    };
    // Latency is defined at one outstanding IO: TC 1 / QD 1 in every mode.
    let test = TestPlan {
        name: Profile::SniaLatency.name().to_string(),
        elements: matrix(&MIXES_SHORT, block_sizes, 1, 1),
        tracking: track(TrackingMetric::LatencyUsMean, &["r0-4k"]),
        element_runtime_s: shape.element_runtime_s,
        stop: shape.stop,
        wipc: WIPC_128K,
        latency_percentiles_total: true,
    };
    (vec![test], deviations)
}

fn plan_throughput(preset: Preset, shape: Shape) -> (Vec<TestPlan>, Vec<String>) {
    let (threads, queue_depth) = match preset {
        Preset::Raidix2018 => (64, 8),
        _ => (1, 32),
    };
    let (threads, queue_depth) = (shape.threads(threads), shape.queue_depth(queue_depth));
    let tests = BLOCK_SIZES_THROUGHPUT
        .iter()
        .map(|&bs| {
            let read = Element::sequential(true, bs, threads, queue_depth);
            let write = Element::sequential(false, bs, threads, queue_depth);
            let tracking = track(TrackingMetric::WriteMegabytesPerS, &[&write.name]);
            TestPlan {
                name: format!("{}-{}", Profile::SniaThroughput.name(), size_label(bs)),
                elements: vec![read, write],
                tracking,
                element_runtime_s: shape.element_runtime_s,
                stop: shape.stop,
                // Implementations precondition at the test's own block size, per block size.
                wipc: Precondition { block_size_bytes: bs, queue_depth: 32, loops: 2 },
                latency_percentiles_total: false,
            }
        })
        .collect();
    (tests, Vec::new())
}

/// fio's engine for file and block-device targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileEngine {
    #[default]
    IoUring,
    /// The engine of the 2018 article and most SNIA implementations.
    Libaio,
}

impl FileEngine {
    pub(crate) fn fio_name(self) -> &'static str {
        match self {
            FileEngine::IoUring => "io_uring",
            FileEngine::Libaio => "libaio",
        }
    }
}

/// How fio reaches the device under test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Target {
    /// Files or block devices with O_DIRECT. Several paths (e.g. raw members, for the
    /// "hardware" baseline) are driven all at once by one job; `size_bytes` is the region used
    /// on each path.
    File { paths: Vec<String>, size_bytes: u64, engine: FileEngine },
    /// An NBD export through fio's nbd engine (libnbd; it takes no `direct`).
    Nbd { uri: String, size_bytes: u64 },
}

impl Target {
    /// A file target with the default engine (io_uring).
    pub fn file(paths: Vec<String>, size_bytes: u64) -> Target {
        Target::File { paths, size_bytes, engine: FileEngine::default() }
    }

    /// One line for report headers.
    pub fn describe(&self) -> String {
        match self {
            Target::File { paths, size_bytes, engine } => {
                let each = if paths.len() > 1 { " each" } else { "" };
                format!("{} ({size_bytes} bytes{each}, {})", paths.join(", "), engine.fio_name())
            }
            Target::Nbd { uri, size_bytes } => format!("{uri} ({size_bytes} bytes, nbd)"),
        }
    }

    fn size_bytes(&self) -> u64 {
        match self {
            Target::File { size_bytes, .. } | Target::Nbd { size_bytes, .. } => *size_bytes,
        }
    }

    /// fio's `size` applies to the job as a whole and is split evenly over its files.
    fn path_count(&self) -> u64 {
        match self {
            Target::File { paths, .. } => paths.len() as u64,
            Target::Nbd { .. } => 1,
        }
    }

    /// The `[global]` lines that point fio at the target.
    pub(crate) fn global_lines(&self) -> Result<String, ProfileError> {
        match self {
            Target::File { paths, engine, .. } => {
                if paths.is_empty() {
                    return Err(ProfileError::NoPaths);
                }
                let escaped =
                    paths.iter().map(|p| escape_path(p)).collect::<Result<Vec<_>, _>>()?;
                Ok(format!(
                    "filename={}\nioengine={}\ndirect=1\n",
                    escaped.join(":"),
                    engine.fio_name()
                ))
            }
            Target::Nbd { uri, .. } => {
                check_value("nbd uri", uri)?;
                Ok(format!("ioengine=nbd\nuri={uri}\n"))
            }
        }
    }
}

/// Refuse values that would change the job file's meaning: line breaks end the option, fio
/// expands `$` (environment variables, `$ncpus`...) and a backslash would be read as an escape.
fn check_value(what: &'static str, value: &str) -> Result<(), ProfileError> {
    let reason = if value.is_empty() {
        "empty"
    } else if value.contains(['\n', '\r']) {
        "contains a line break"
    } else if value.contains('$') {
        "contains '$', which fio expands"
    } else if value.contains('\\') {
        "contains a backslash, which fio reads as an escape"
    } else if value.trim() != value {
        "has leading or trailing blanks, which fio strips"
    } else {
        return Ok(());
    };
    Err(ProfileError::UnsafeValue { what, value: value.to_string(), reason })
}

/// fio separates filenames with ':'; a ':' inside a path is written `\:`.
fn escape_path(path: &str) -> Result<String, ProfileError> {
    check_value("path", path)?;
    Ok(path.replace(':', "\\:"))
}

/// Render the fio job file of one round of `test` against `target`.
pub fn render_round(
    test: &TestPlan,
    target: &Target,
    randseed: u64,
) -> Result<String, ProfileError> {
    let mut out = format!("; flashraid-lab: one round of {} (generated)\n[global]\n", test.name);
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\ngroup_reporting=1\ntime_based=1\n");
    let _ = writeln!(out, "runtime={}", test.element_runtime_s);
    out.push_str("norandommap=1\nrefill_buffers=1\n");
    let _ = writeln!(out, "randseed={randseed}");
    let _ = writeln!(out, "percentile_list={PERCENTILE_LIST}");
    if test.latency_percentiles_total {
        out.push_str("lat_percentiles=1\n");
    }
    for element in &test.elements {
        out.push('\n');
        out.push_str(&render_element(element, target)?);
    }
    Ok(out)
}

/// One load host's job for a round that `hosts` load hosts run at once: the target split in
/// `hosts` parts aligned to 1 MiB (the largest block), host `host` owning part `host` (no two
/// hosts touch the same blocks, as clients of one array each with its own volume), and a seed
/// of its own.
pub fn render_round_on_host(
    test: &TestPlan,
    target: &Target,
    randseed: u64,
    host: usize,
    hosts: usize,
) -> Result<String, ProfileError> {
    assert!(host < hosts, "host {host} of {hosts}");
    let share = target.size_bytes() / hosts as u64 / MIB * MIB;
    if share == 0 {
        return Err(ProfileError::TargetTooSmall {
            region_bytes: target.size_bytes(),
            needed_bytes: MIB * hosts as u64,
            why: "1 MiB per load host",
        });
    }
    let mut part = target.clone();
    match &mut part {
        Target::File { size_bytes, .. } | Target::Nbd { size_bytes, .. } => *size_bytes = share,
    }
    // Seeds far apart, so hosts' random offsets are unrelated.
    let text = render_round(test, &part, randseed.wrapping_add(host as u64 * 1_000_003))?;
    // fio adds a job's offset_increment share to the global offset.
    Ok(text.replacen("[global]\n", &format!("[global]\noffset={}\n", share * host as u64), 1))
}

fn render_element(element: &Element, target: &Target) -> Result<String, ProfileError> {
    let bs = element.block_size_bytes;
    let region = target.size_bytes();
    if region < bs {
        return Err(ProfileError::TargetTooSmall {
            region_bytes: region,
            needed_bytes: bs,
            why: "one block",
        });
    }
    let mut out = format!("[{}]\nstonewall\n", element.name);
    match element.pattern {
        Pattern::Random => {
            let _ = writeln!(out, "rw=randrw\nrwmixread={}", element.read_percent);
            let _ = writeln!(
                out,
                "bs={bs}\nnumjobs={}\niodepth={}",
                element.threads, element.queue_depth
            );
            let _ = writeln!(out, "size={}", region * target.path_count());
        }
        Pattern::Sequential => {
            let rw = if element.read_percent == 100 { "read" } else { "write" };
            let _ = writeln!(
                out,
                "rw={rw}\nbs={bs}\nnumjobs={}\niodepth={}",
                element.threads, element.queue_depth
            );
            // Each thread owns [k * slice, (k + 1) * slice) on every path, block aligned.
            let slice = region / u64::from(element.threads.max(1)) / bs * bs;
            if slice == 0 {
                let needed_bytes = bs * u64::from(element.threads);
                return Err(ProfileError::TargetTooSmall {
                    region_bytes: region,
                    needed_bytes,
                    why: "one block per thread",
                });
            }
            let _ = writeln!(out, "size={}", slice * target.path_count());
            if element.threads > 1 {
                let _ = writeln!(out, "offset_increment={slice}");
            }
        }
    }
    Ok(out)
}

/// Render the WIPC job of `test`: sequential writes of `loops` x the target, size-based.
pub fn render_wipc(test: &TestPlan, target: &Target) -> Result<String, ProfileError> {
    let wipc = test.wipc;
    let region = target.size_bytes();
    if region < wipc.block_size_bytes {
        return Err(ProfileError::TargetTooSmall {
            region_bytes: region,
            needed_bytes: wipc.block_size_bytes,
            why: "one WIPC block",
        });
    }
    let mut out = format!(
        "; flashraid-lab: WIPC of {} ({} passes of SEQ {} writes; generated)\n[global]\n",
        test.name,
        wipc.loops,
        size_label(wipc.block_size_bytes)
    );
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\nrefill_buffers=1\n\n[wipc]\nrw=write\n");
    let _ = writeln!(out, "bs={}\niodepth={}\nnumjobs=1", wipc.block_size_bytes, wipc.queue_depth);
    let _ = writeln!(out, "size={}\nloops={}", region * target.path_count(), wipc.loops);
    Ok(out)
}

/// `4096` -> `4k`, `1048576` -> `1m`, `512` -> `512`: the names elements use.
pub fn size_label(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}m", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{}k", bytes / KIB)
    } else {
        bytes.to_string()
    }
}

/// The job shapes of the profiles whose runners are not built yet (P4-P7), as data taken from
/// benchmark-method.md §7.3. Runners will grow from these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "profile", rename_all = "kebab-case")]
pub enum WorkloadShape {
    VmImages(VmImagesShape),
    VideoFrames(VideoFramesShape),
    SmallFiles(SmallFilesShape),
    DegradedRebuild(DegradedRebuildShape),
}

/// P4: about 32 VMs of mixed random IO with skew, one fio job per VM over its own slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmImagesShape {
    pub vms: u32,
    pub read_percent: u8,
    /// fio `bssplit`: (block size, percent of IOs); a lab proposal, not from a source.
    pub block_size_split: Vec<(u64, u8)>,
    pub queue_depth: u32,
    /// fio `random_distribution=zipf:<theta>`.
    pub zipf_theta: f64,
    pub ramp_s: u32,
    pub runtime_s: u32,
    pub repetitions: u32,
    pub log_average_ms: u32,
}

/// P5b: frame files (one file per frame, the frametest/DPX model) written by concurrent
/// streams, then read back; frame times, late frames and MB/s over time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VideoFramesShape {
    pub formats: Vec<FrameFormat>,
    /// Frames per stream, unless fewer fit (see `space_percent_max`).
    pub frames_per_stream: u32,
    pub streams: Vec<u32>,
    /// A test's frames never take more than this share of the filesystem's free space.
    pub space_percent_max: u8,
    /// A test with fewer frames per stream than this is skipped as "target too small".
    pub frames_per_stream_min: u32,
    /// Frame-rate deadlines a frame is checked against (late = took longer than 1/rate).
    pub frame_rates_per_s: Vec<u32>,
    /// Width of the MB/s-over-time bins (widened so a long run has at most 200 bins).
    pub timeline_bin_ms: u32,
    /// P5a's ladder: one large file of each size (whole frames of the largest format),
    /// written then read, at each of `large_file_depths` (empty in reports from before P5a).
    #[serde(default)]
    pub large_file_bytes: Vec<u64>,
    #[serde(default)]
    pub large_file_depths: Vec<u32>,
    /// P5c, the fill sweep: frame files of the largest format written in this many batches
    /// (each in its own directories) until the filesystem is `fill_percent_max` full, then
    /// every other batch deleted, as many written again into the holes, and the oldest batch
    /// read back (0: no sweep, as in reports from before P5c).
    #[serde(default)]
    pub fill_batches: u32,
    #[serde(default)]
    pub fill_percent_max: u8,
}

/// An uncompressed frame format: 10-bit RGB DPX packs three 10-bit samples in 32 bits, so 4
/// bytes a pixel (pixel payload only; a DPX header would add 2 KiB and break 4 KiB alignment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameFormat {
    pub name: String,
    pub width: u32,
    pub height: u32,
    pub bytes_per_pixel: u32,
}

impl VideoFramesShape {
    /// The format with the largest frames (the large-file ladder's and the fill sweep's).
    pub fn largest_format(&self) -> Option<&FrameFormat> {
        self.formats.iter().max_by_key(|f| f.frame_bytes())
    }
}

impl FrameFormat {
    fn dpx10(name: &str, width: u32, height: u32) -> FrameFormat {
        FrameFormat { name: name.to_string(), width, height, bytes_per_pixel: 4 }
    }

    pub fn frame_bytes(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height) * u64::from(self.bytes_per_pixel)
    }
}

/// P6: many small files on a filesystem on the target: create, stat and delete (fio's
/// filecreate, filestat and filedelete engines), then the mail-server pattern (random reads and
/// writes of small files, fsync after every write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SmallFilesShape {
    /// Files per metadata test, shared among its jobs; each job has its own directory.
    pub metadata_files: u32,
    pub metadata_jobs: Vec<u32>,
    /// Files of the data test, shared among its jobs.
    pub data_files: u32,
    pub data_jobs: u32,
    pub data_file_size_bytes: u64,
    pub data_block_bytes: u64,
    pub data_read_percent: u8,
    pub data_runtime_s: u32,
    /// P6a, PostMark (absent in reports from before it).
    #[serde(default)]
    pub postmark: Option<crate::postmark::PostmarkShape>,
}

/// P7: continuous load across healthy, fail, degraded, rebuild and post-rebuild phases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegradedRebuildShape {
    /// Duration of the healthy, degraded and post-rebuild phases; rebuild runs until done.
    pub phase_duration_s: u32,
    /// Foreground load as a percentage of the healthy maximum; 0 = idle rebuild.
    pub load_percent_levels: Vec<u8>,
    /// A verifying job must pass: a RAID benchmark that loses data is not a result.
    pub verify: String,
}

/// The shape of a non-SNIA profile in `mode`; `None` for SNIA profiles (use [`plan_snia`]).
pub fn workload_shape(profile: Profile, mode: Mode) -> Option<WorkloadShape> {
    let quick = mode == Mode::Quick;
    let shape = match profile {
        Profile::SniaIops | Profile::SniaLatency | Profile::SniaThroughput => return None,
        Profile::VmImages => WorkloadShape::VmImages(VmImagesShape {
            vms: 32,
            read_percent: 70,
            block_size_split: vec![
                (4 * KIB, 45),
                (8 * KIB, 20),
                (16 * KIB, 10),
                (64 * KIB, 15),
                (128 * KIB, 10),
            ],
            queue_depth: 4,
            zipf_theta: 1.1,
            ramp_s: if quick { 3 } else { 300 },
            runtime_s: if quick { 20 } else { 1800 },
            repetitions: if quick { 1 } else { 3 },
            log_average_ms: 1000,
        }),
        Profile::VideoFrames => WorkloadShape::VideoFrames(VideoFramesShape {
            formats: if quick {
                vec![FrameFormat::dpx10("SD", 720, 576), FrameFormat::dpx10("DCI-4K", 4096, 2160)]
            } else {
                vec![
                    FrameFormat::dpx10("SD", 720, 576),
                    FrameFormat::dpx10("HD", 1920, 1080),
                    FrameFormat::dpx10("UHD", 3840, 2160),
                    FrameFormat::dpx10("DCI-4K", 4096, 2160),
                ]
            },
            frames_per_stream: if quick { 200 } else { 3000 },
            streams: if quick { vec![1, 2] } else { vec![1, 2, 4, 8] },
            space_percent_max: 50,
            frames_per_stream_min: 4,
            frame_rates_per_s: vec![24, 30, 60],
            timeline_bin_ms: 100,
            large_file_bytes: if quick {
                vec![256 << 20, 1 << 30]
            } else {
                vec![1 << 30, 4 << 30, 16 << 30, 64 << 30]
            },
            // Frame by frame (a recorder or player), and four ahead (one that buffers).
            large_file_depths: vec![1, 4],
            fill_batches: if quick { 4 } else { 20 },
            fill_percent_max: 95,
        }),
        Profile::SmallFiles => WorkloadShape::SmallFiles(SmallFilesShape {
            metadata_files: if quick { 10_000 } else { 1_000_000 },
            metadata_jobs: vec![1, 16],
            data_files: 10_000,
            data_jobs: 8,
            data_file_size_bytes: 16 * KIB,
            data_block_bytes: 4 * KIB,
            data_read_percent: 70,
            data_runtime_s: if quick { 10 } else { 300 },
            postmark: Some(crate::postmark::PostmarkShape::for_mode(quick)),
        }),
        Profile::DegradedRebuild => WorkloadShape::DegradedRebuild(DegradedRebuildShape {
            phase_duration_s: if quick { 15 } else { 600 },
            load_percent_levels: vec![100, 50, 25, 0],
            verify: "verify=crc32c verify_backlog=1024 verify_fatal=1".to_string(),
        }),
    };
    Some(shape)
}

/// Render P4's fio job file: one job per VM, each on its own slice, reported per VM. fio
/// writes its per-VM IOPS and latency logs as `LOG_PREFIX_iops.N.log` (N = VM, from 1) and
/// so on, averaged over `log_average_ms`.
pub fn render_vm_images(
    shape: &VmImagesShape,
    target: &Target,
    randseed: u64,
    log_prefix: &str,
) -> Result<String, ProfileError> {
    render_vms(shape, target, randseed, log_prefix, 0..shape.vms)
}

/// The VMs load host `host` of `hosts` runs: an even share of `vms`, the first hosts taking
/// one more where they do not divide evenly.
pub fn vms_on_host(vms: u32, host: usize, hosts: usize) -> std::ops::Range<u32> {
    assert!(host < hosts, "host {host} of {hosts}");
    let (hosts, host) = (u32::try_from(hosts).expect("hosts fit"), host as u32);
    let (each, extra) = (vms / hosts, vms % hosts);
    let start = host * each + host.min(extra);
    start..start + each + u32::from(host < extra)
}

/// vm-images from several load hosts: host `host` of `hosts` runs its share of the VMs
/// ([`vms_on_host`]), each on the same region of the target it has when one host runs them
/// all, with a seed of its own. Its job is named [`vm_job_on_host`] (so its VMs are told
/// apart from other hosts' by name, also for two fio servers on one address), and its logs
/// `LOG_PREFIX_KIND.N.log`, one per VM (fio's client adds the host to each name; N is fio's
/// job number, not necessarily the VM's place in its share).
pub fn render_vm_images_on_host(
    shape: &VmImagesShape,
    target: &Target,
    randseed: u64,
    log_prefix: &str,
    host: usize,
    hosts: usize,
) -> Result<String, ProfileError> {
    if u32::try_from(hosts).map_or(true, |h| h > shape.vms) {
        return Err(ProfileError::TooManyHosts { hosts, vms: shape.vms });
    }
    let vms = vms_on_host(shape.vms, host, hosts);
    let text =
        render_vms(shape, target, randseed.wrapping_add(host as u64 * 1_000_003), log_prefix, vms)?;
    let section = "\n[vm]\n";
    assert!(text.ends_with(section), "render_vms ends with the VM job's section");
    Ok(format!("{}\n[{}]\n", &text[..text.len() - section.len()], vm_job_on_host(host)))
}

/// The job name of load host `host`'s VMs.
pub fn vm_job_on_host(host: usize) -> String {
    format!("vm-h{host}")
}

/// The job for VMs `vms` (of `shape.vms`, each on its own slice of the target).
fn render_vms(
    shape: &VmImagesShape,
    target: &Target,
    randseed: u64,
    log_prefix: &str,
    vms: std::ops::Range<u32>,
) -> Result<String, ProfileError> {
    assert!(!vms.is_empty() && vms.end <= shape.vms, "VMs {vms:?} of {}", shape.vms);
    let region = target.size_bytes();
    let slice = region / u64::from(shape.vms.max(1)) / (4 * KIB) * (4 * KIB);
    if slice == 0 {
        return Err(ProfileError::TargetTooSmall {
            region_bytes: region,
            needed_bytes: 4 * KIB * u64::from(shape.vms),
            why: "one 4 KiB block per VM",
        });
    }
    let split: Vec<String> = shape
        .block_size_split
        .iter()
        .map(|(bs, pct)| format!("{}/{pct}", size_label(*bs)))
        .collect();
    let mut out = String::from("; flashraid-lab: vm-images (generated)\n[global]\n");
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\ntime_based=1\n");
    let _ = writeln!(out, "runtime={}\nramp_time={}", shape.runtime_s, shape.ramp_s);
    let _ =
        writeln!(out, "rw=randrw\nrwmixread={}\nbssplit={}", shape.read_percent, split.join(":"));
    let _ = writeln!(out, "iodepth={}\nnumjobs={}", shape.queue_depth, vms.len());
    // VM k's slice starts at k * slice (fio adds offset_increment per clone to offset).
    if vms.start > 0 {
        let _ = writeln!(out, "offset={}", u64::from(vms.start) * slice);
    }
    let _ = writeln!(out, "size={}\noffset_increment={slice}", slice * target.path_count());
    let _ = writeln!(out, "random_distribution=zipf:{}", shape.zipf_theta);
    // Per-VM results are the point of this profile (fairness), so no group reporting.
    out.push_str("group_reporting=0\nrefill_buffers=1\n");
    let _ = writeln!(out, "randseed={randseed}\npercentile_list={PERCENTILE_LIST}");
    let _ = writeln!(
        out,
        "write_iops_log={log_prefix}\nwrite_lat_log={log_prefix}\nlog_avg_msec={}",
        shape.log_average_ms
    );
    out.push_str("\n[vm]\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick_iops() -> ProfilePlan {
        plan_snia(Profile::SniaIops, Preset::Spec11, Mode::Quick).unwrap()
    }

    #[test]
    fn load_hosts_get_disjoint_parts_and_seeds_of_their_own() {
        let plan = plan_snia(Profile::SniaThroughput, Preset::Spec, Mode::Quick).unwrap();
        let target = Target::Nbd { uri: "nbd://10.0.0.1:10809/lab".into(), size_bytes: 3 * GIB };
        let jobs: Vec<String> = (0..3)
            .map(|h| render_round_on_host(&plan.tests[0], &target, 5, h, 3).unwrap())
            .collect();
        for (h, job) in jobs.iter().enumerate() {
            assert!(job.lines().any(|l| l == format!("offset={}", h as u64 * GIB)), "{job}");
            assert!(job.lines().any(|l| l == format!("randseed={}", 5 + h as u64 * 1_000_003)));
        }
        // Every host's sequential slices stay inside its own GiB.
        let sizes: Vec<u64> = jobs[0]
            .lines()
            .filter_map(|l| l.strip_prefix("size="))
            .map(|v| v.parse().unwrap())
            .collect();
        assert!(!sizes.is_empty() && sizes.iter().all(|&s| s <= GIB), "{sizes:?}");
        let tiny = Target::Nbd { uri: "nbd://h/x".into(), size_bytes: MIB };
        assert!(render_round_on_host(&plan.tests[0], &tiny, 1, 1, 2).is_err());
    }

    #[test]
    fn names_round_trip() {
        for p in Profile::ALL {
            assert_eq!(p.name().parse::<Profile>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
        }
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
        }
        assert!("snia".parse::<Profile>().is_err());
        assert_eq!("full".parse::<Mode>(), Ok(Mode::Full));
    }

    #[test]
    fn quick_iops_is_the_3x3_matrix_in_spec_order() {
        let plan = quick_iops();
        assert!(matches!(plan.conformance, ConformanceLabel::QuickSmoke { .. }));
        let test = &plan.tests[0];
        let names: Vec<&str> = test.elements.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "r100-1m", "r100-64k", "r100-4k", "r65-1m", "r65-64k", "r65-4k", "r0-1m", "r0-64k",
                "r0-4k"
            ]
        );
        assert!(test.elements.iter().all(|e| e.threads == 2 && e.queue_depth == 8));
        assert_eq!(test.element_runtime_s, 1);
        assert_eq!(test.stop, StopRule { window_rounds: 5, rounds_max: 6 });
        assert_eq!(test.tracking, track(TrackingMetric::IopsTotal, &["r0-4k"]));
        assert_eq!(test.round_runtime_s(), 9);
    }

    #[test]
    fn full_iops_matrices_match_the_presets() {
        let spec = plan_snia(Profile::SniaIops, Preset::Spec11, Mode::Full).unwrap();
        let t = &spec.tests[0];
        assert_eq!(t.elements.len(), 56);
        assert_eq!(t.elements[7].name, "r100-512");
        assert_eq!(t.elements[8].name, "r95-1m");
        assert_eq!((t.elements[0].threads, t.elements[0].queue_depth), (4, 32));
        assert_eq!(t.round_runtime_s(), 56 * 60);
        assert_eq!(t.stop, StopRule::SNIA);
        assert_eq!(spec.conformance, ConformanceLabel::SniaConformant { preset: Preset::Spec11 });

        let raidix = plan_snia(Profile::SniaIops, Preset::Raidix2018, Mode::Full).unwrap();
        assert_eq!(raidix.tests[0].elements.len(), 49);
        assert_eq!(
            (raidix.tests[0].elements[0].threads, raidix.tests[0].elements[0].queue_depth),
            (64, 32)
        );
        assert_eq!(raidix.conformance.deviations().len(), 1);
        assert!(raidix.conformance.title().starts_with("SNIA-derived (preset raidix-2018)"));

        let spec20 = plan_snia(Profile::SniaIops, Preset::Spec20, Mode::Quick).unwrap();
        let tracked: Vec<&str> =
            spec20.tests[0].tracking.iter().map(|t| t.element.as_str()).collect();
        assert_eq!(tracked, ["r0-4k", "r65-64k", "r100-1m"]);
        // Every tracking variable names an element of the round, in quick mode too.
        for plan in [&spec, &raidix, &spec20] {
            for v in &plan.tests[0].tracking {
                assert!(plan.tests[0].element(&v.element).is_some(), "{}", v.element);
            }
        }
    }

    #[test]
    fn latency_and_throughput_plans() {
        let lat = plan_snia(Profile::SniaLatency, Preset::Raidix2018, Mode::Quick).unwrap();
        let t = &lat.tests[0];
        assert_eq!(t.elements.len(), 9);
        assert_eq!(t.elements[0].name, "r100-16k");
        assert!(t.elements.iter().all(|e| e.threads == 1 && e.queue_depth == 1));
        assert!(t.latency_percentiles_total);
        assert_eq!(t.tracking, track(TrackingMetric::LatencyUsMean, &["r0-4k"]));

        let tp = plan_snia(Profile::SniaThroughput, Preset::Raidix2018, Mode::Full).unwrap();
        let names: Vec<&str> = tp.tests.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["snia-throughput-1m", "snia-throughput-128k"]);
        assert_eq!(tp.tests[1].elements[1].name, "seq-128k-write");
        assert_eq!(tp.tests[1].wipc.block_size_bytes, 128 * KIB);
        assert_eq!((tp.tests[0].elements[0].threads, tp.tests[0].elements[0].queue_depth), (64, 8));
        assert_eq!(tp.tests[0].round_runtime_s(), 120);
    }

    #[test]
    fn wrong_profile_or_preset_is_an_error() {
        assert_eq!(
            plan_snia(Profile::VmImages, Preset::Spec, Mode::Quick),
            Err(ProfileError::NotSnia(Profile::VmImages))
        );
        assert!(matches!(
            plan_snia(Profile::SniaLatency, Preset::Spec11, Mode::Quick),
            Err(ProfileError::PresetNotForProfile { .. })
        ));
    }

    #[test]
    fn golden_round_for_a_file_target() {
        let mut test = quick_iops().tests.remove(0);
        test.elements.truncate(2);
        let target = Target::file(vec!["/dev/fr0".to_string()], GIB);
        let expected = "\
; flashraid-lab: one round of snia-iops (generated)
[global]
filename=/dev/fr0
ioengine=io_uring
direct=1
thread=1
group_reporting=1
time_based=1
runtime=1
norandommap=1
refill_buffers=1
randseed=42
percentile_list=50:90:99:99.9:99.99:99.999

[r100-1m]
stonewall
rw=randrw
rwmixread=100
bs=1048576
numjobs=2
iodepth=8
size=1073741824

[r100-64k]
stonewall
rw=randrw
rwmixread=100
bs=65536
numjobs=2
iodepth=8
size=1073741824
";
        assert_eq!(render_round(&test, &target, 42).unwrap(), expected);
        // Deterministic: same inputs, same bytes.
        assert_eq!(render_round(&test, &target, 42).unwrap(), expected);
    }

    #[test]
    fn golden_throughput_round_over_members_has_disjoint_slices() {
        let plan = plan_snia(Profile::SniaThroughput, Preset::Spec, Mode::Quick).unwrap();
        let target = Target::File {
            paths: vec!["/tmp/m0".to_string(), "/tmp/odd:name".to_string()],
            size_bytes: 8 * MIB + 4096,
            engine: FileEngine::Libaio,
        };
        let text = render_round(&plan.tests[0], &target, 7).unwrap();
        let expected_head = "\
; flashraid-lab: one round of snia-throughput-1m (generated)
[global]
filename=/tmp/m0:/tmp/odd\\:name
ioengine=libaio
direct=1
";
        assert!(text.starts_with(expected_head), "{text}");
        // TC 1 (capped QD 8): one stream over the block-aligned region of each path.
        let expected_write = "\
[seq-1m-write]
stonewall
rw=write
bs=1048576
numjobs=1
iodepth=8
size=16777216
";
        assert!(text.ends_with(expected_write), "{text}");
        assert!(!text.contains("lat_percentiles"));

        let raidix = plan_snia(Profile::SniaThroughput, Preset::Raidix2018, Mode::Full).unwrap();
        let text =
            render_round(&raidix.tests[1], &Target::file(vec!["/dev/fr0".into()], GIB), 7).unwrap();
        // 64 threads x 16 MiB slices cover the 1 GiB without overlap.
        let expected = "[seq-128k-read]\nstonewall\nrw=read\nbs=131072\nnumjobs=64\niodepth=8\n\
                        size=16777216\noffset_increment=16777216\n";
        assert!(text.contains(expected), "{text}");
    }

    #[test]
    fn golden_nbd_latency_round_and_wipc() {
        let plan = plan_snia(Profile::SniaLatency, Preset::Spec, Mode::Full).unwrap();
        let target =
            Target::Nbd { uri: "nbd+unix:///fr?socket=/run/fr.sock".to_string(), size_bytes: GIB };
        let text = render_round(&plan.tests[0], &target, 1).unwrap();
        assert!(
            text.contains(
                "[global]\nioengine=nbd\nuri=nbd+unix:///fr?socket=/run/fr.sock\nthread=1\n"
            ),
            "{text}"
        );
        assert!(!text.contains("direct="), "the nbd engine takes no direct option");
        assert!(!text.contains("filename="));
        assert!(text.contains("runtime=60\n") && text.contains("lat_percentiles=1\n"));
        assert_eq!(text.matches("stonewall").count(), 9);

        let wipc = render_wipc(&plan.tests[0], &target).unwrap();
        let expected = "\
; flashraid-lab: WIPC of snia-latency (2 passes of SEQ 128k writes; generated)
[global]
ioengine=nbd
uri=nbd+unix:///fr?socket=/run/fr.sock
thread=1
refill_buffers=1

[wipc]
rw=write
bs=131072
iodepth=32
numjobs=1
size=1073741824
loops=2
";
        assert_eq!(wipc, expected);
        assert!(!wipc.contains("time_based"), "WIPC is size-based");
    }

    #[test]
    fn unsafe_targets_are_refused() {
        let test = &quick_iops().tests[0];
        let bad =
            |paths: Vec<&str>| Target::file(paths.into_iter().map(String::from).collect(), GIB);
        assert_eq!(render_round(test, &bad(vec![]), 1), Err(ProfileError::NoPaths));
        for path in ["", "/tmp/a\nrw=trim", "/tmp/${HOME}", "/tmp/a\\b", " /tmp/a"] {
            assert!(
                matches!(
                    render_round(test, &bad(vec![path]), 1),
                    Err(ProfileError::UnsafeValue { .. })
                ),
                "{path:?}"
            );
        }
        let tiny = Target::file(vec!["/tmp/a".into()], 4096);
        assert!(matches!(render_round(test, &tiny, 1), Err(ProfileError::TargetTooSmall { .. })));
        let tp = plan_snia(Profile::SniaThroughput, Preset::Raidix2018, Mode::Full).unwrap();
        let small = Target::file(vec!["/tmp/a".into()], 32 * MIB);
        assert!(matches!(
            render_round(&tp.tests[0], &small, 1),
            Err(ProfileError::TargetTooSmall { .. })
        ));
    }

    #[test]
    fn conformance_labels_demote_on_deviations() {
        let label = ConformanceLabel::SniaConformant { preset: Preset::Spec11 };
        assert_eq!(label.clone().with_deviations(Vec::new()), label);
        let demoted = label.with_deviations(vec!["no purge: members do not support it".into()]);
        assert_eq!(demoted.title(), "SNIA-derived (preset spec-1.1)");
        assert_eq!(demoted.deviations().len(), 1);
        assert_eq!(
            ConformanceLabel::QuickSmoke { deviations: vec![] }.with_deviations(vec!["x".into()]),
            ConformanceLabel::QuickSmoke { deviations: vec!["x".into()] }
        );
    }

    #[test]
    fn non_snia_shapes_and_vm_images_job() {
        for p in Profile::ALL {
            assert_eq!(workload_shape(p, Mode::Quick).is_some(), !p.is_snia(), "{p}");
        }
        let Some(WorkloadShape::VmImages(shape)) = workload_shape(Profile::VmImages, Mode::Quick)
        else {
            panic!("vm-images shape");
        };
        assert_eq!(shape.block_size_split.iter().map(|(_, pct)| u32::from(*pct)).sum::<u32>(), 100);
        let text = render_vm_images(&shape, &Target::file(vec!["/dev/fr0".into()], GIB), 3, "vm-2")
            .unwrap();
        assert!(text.contains("write_iops_log=vm-2\nwrite_lat_log=vm-2\nlog_avg_msec=1000\n"));
        assert!(text.contains("bssplit=4k/45:8k/20:16k/10:64k/15:128k/10\n"), "{text}");
        assert!(text.contains("numjobs=32\nsize=33554432\noffset_increment=33554432\n"), "{text}");
        assert!(text.contains("runtime=20\nramp_time=3\n") && text.ends_with("\n[vm]\n"));
    }

    #[test]
    fn load_hosts_split_the_vms_and_keep_each_vm_on_its_slice() {
        let Some(WorkloadShape::VmImages(shape)) = workload_shape(Profile::VmImages, Mode::Quick)
        else {
            panic!("vm-images shape");
        };
        assert_eq!(shape.vms, 32);
        let target = Target::Nbd { uri: "nbd://10.0.0.1:10809/lab".into(), size_bytes: GIB };
        let slice = GIB / 32;
        for hosts in [1usize, 2, 3, 5, 32] {
            let mut next_vm = 0;
            for host in 0..hosts {
                let vms = vms_on_host(shape.vms, host, hosts);
                assert_eq!(vms.start, next_vm, "{hosts} hosts: VMs contiguous and in order");
                assert!(vms.len() >= 32 / hosts && vms.len() <= 32 / hosts + 1);
                next_vm = vms.end;
                let text =
                    render_vm_images_on_host(&shape, &target, 7, "vm-1-h0", host, hosts).unwrap();
                let line = |key: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .map(|v| v.parse::<u64>().unwrap())
                };
                assert_eq!(line("numjobs="), Some(vms.len() as u64), "{text}");
                assert_eq!(line("offset_increment="), Some(slice));
                assert_eq!(line("size="), Some(slice));
                assert_eq!(line("offset=").unwrap_or(0), u64::from(vms.start) * slice, "{text}");
                assert_eq!(line("randseed="), Some(7 + host as u64 * 1_000_003));
            }
            assert_eq!(next_vm, 32, "{hosts} hosts run every VM");
        }
        // One host runs what render_vm_images renders, under its own job name.
        assert_eq!(
            render_vm_images_on_host(&shape, &target, 7, "p", 0, 1).unwrap(),
            render_vm_images(&shape, &target, 7, "p").unwrap().replace("\n[vm]\n", "\n[vm-h0]\n")
        );
        let text = render_vm_images_on_host(&shape, &target, 7, "p", 2, 3).unwrap();
        assert!(text.ends_with("\n[vm-h2]\n") && !text.contains("[vm]"), "{text}");
        assert!(matches!(
            render_vm_images_on_host(&shape, &target, 7, "p", 0, 33),
            Err(ProfileError::TooManyHosts { hosts: 33, vms: 32 })
        ));
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(512), "512");
        assert_eq!(size_label(4096), "4k");
        assert_eq!(size_label(MIB), "1m");
        assert_eq!(size_label(1536), "1536");
    }
}
