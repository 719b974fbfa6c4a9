//! The `degraded-rebuild` profile: the same load on a healthy array, with a member failed,
//! while the replacement rebuilds, and after (benchmark-method.md §7.3 P7); the rebuild's
//! duration and rate at each load level; and a verdict on the data written before the
//! failure, which must read back intact (a RAID benchmark that loses data has no result).
//!
//! Owns: the load's fio job (a 70/30 4 KiB random mix on the second half of the target, the
//! first half holding the verified data), the verify jobs, [`DegradedReport`] and its
//! renderings, and the comparison of several runs ([`compare_degraded`]: per load level, one
//! row per run, and for the drills a row per run with each step's worst second and recovery
//! and one chart of every run's IOPS as a share of its healthy, aligned at the failure). Pure: the runner fails the member, adds the spare, watches the rebuild and
//! hands back fio's results.
//!
//! Besides the per-phase runs (percentiles per phase), each loaded level has a drill: one
//! continuous fio run with 1-s IOPS and latency logs through a second failure, degraded
//! running, the spare's rebuild and after, with the moment of each step marked ([`Drill`]):
//! the timeline with its markers (charts), and the failure transients (worst second and time
//! back within 10 % of healthy after the failure and after the spare arrives).
//!
//! Limits: one array and one failure per load level for the phase runs, plus the drill's;
//! fio's averaged logs hold means, so the timeline has mean latency per second, not p99.

use crate::fio::JobResult;
use crate::merge::{MergeError, group_runs, merged_header};
use crate::profile::{ConformanceLabel, Mode, Target};
use crate::report::{
    Table, fixed, html_label, html_manifest, html_open, html_table, md_label, md_manifest, md_table,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The phases, in order.
pub const PHASES: [&str; 4] = ["healthy", "degraded", "rebuilding", "rebuilt"];

/// The load of every phase: 4 KiB random, 70 % reads, on the target's second half.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseLoad {
    pub threads: u32,
    pub queue_depth: u32,
    pub runtime_s: u32,
    /// fio `rate_iops` per thread (a load level below saturation); `None`: as fast as it goes.
    pub rate_iops_per_thread: Option<u64>,
}

fn halves(target: &Target) -> (u64, u64) {
    let size = match target {
        Target::File { size_bytes, .. } | Target::Nbd { size_bytes, .. } => *size_bytes,
    };
    let half = size / 2 / (1 << 20) * (1 << 20);
    (half, size - half)
}

/// fio job of one load run (the target's second half).
pub fn render_phase_load(
    load: &PhaseLoad,
    target: &Target,
    randseed: u64,
) -> Result<String, crate::profile::ProfileError> {
    let (half, rest) = halves(target);
    phase_load_job(load, target, randseed, half, rest)
}

/// [`render_phase_load`] for load host `host` of `hosts` (fio's client/server mode): the
/// host's own contiguous share of the load region (1/`hosts` of it, whole MiB; what the
/// rounding leaves at the end is not loaded), with a seed of its own. `load` is what each
/// host runs: its threads, and their pace, are that host's.
pub fn render_phase_load_on_host(
    load: &PhaseLoad,
    target: &Target,
    randseed: u64,
    host: usize,
    hosts: usize,
) -> Result<String, crate::profile::ProfileError> {
    let (offset, share) = host_share(target, host, hosts)?;
    phase_load_job(load, target, host_seed(randseed, host), offset, share)
}

/// Host `host`'s share of the load region: its offset and length.
fn host_share(
    target: &Target,
    host: usize,
    hosts: usize,
) -> Result<(u64, u64), crate::profile::ProfileError> {
    assert!(host < hosts, "load host {host} of {hosts}");
    const MIB: u64 = 1 << 20;
    let (half, rest) = halves(target);
    let share = rest / hosts as u64 / MIB * MIB;
    if share == 0 {
        return Err(crate::profile::ProfileError::TargetTooSmall {
            region_bytes: rest,
            needed_bytes: MIB * hosts as u64,
            why: "1 MiB of the load region (the target's second half) per load host",
        });
    }
    Ok((half + share * host as u64, share))
}

/// Seeds far apart, so the hosts' random offsets are unrelated.
fn host_seed(randseed: u64, host: usize) -> u64 {
    randseed.wrapping_add(host as u64 * 1_000_003)
}

fn phase_load_job(
    load: &PhaseLoad,
    target: &Target,
    randseed: u64,
    offset: u64,
    size: u64,
) -> Result<String, crate::profile::ProfileError> {
    let mut out = String::from("; flashraid-lab: degraded-rebuild load (generated)\n[global]\n");
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\ngroup_reporting=1\ntime_based=1\nnorandommap=1\nrefill_buffers=1\n");
    let _ = writeln!(out, "runtime={}\nrandseed={randseed}", load.runtime_s);
    let _ = writeln!(out, "percentile_list={}", crate::profile::PERCENTILE_LIST);
    let _ = writeln!(out, "\n[load]\nrw=randrw\nrwmixread={LOAD_READ_PERCENT}\nbs=4096");
    let _ = writeln!(out, "offset={offset}\nsize={size}");
    let _ = writeln!(out, "numjobs={}\niodepth={}", load.threads, load.queue_depth);
    if let Some(rate) = load.rate_iops_per_thread {
        // fio caps reads and writes apart, a single value each (found by review: the paced
        // levels ran twice their rate, half reads): the thread's rate split by the mix.
        let reads = (rate * LOAD_READ_PERCENT).div_ceil(100);
        let writes = (rate * (100 - LOAD_READ_PERCENT)).div_ceil(100);
        let _ = writeln!(out, "rate_iops={reads},{writes}");
    }
    Ok(out)
}

/// The phase load's share of reads, percent.
const LOAD_READ_PERCENT: u64 = 70;

/// fio job of a drill: the phase load with no end of its own (the runner stops fio with
/// SIGINT once the drill is over) and 1-s IOPS and latency logs named `drill`.
pub fn render_drill_load(
    load: &PhaseLoad,
    target: &Target,
    randseed: u64,
) -> Result<String, crate::profile::ProfileError> {
    let mut out = render_phase_load(
        &PhaseLoad { runtime_s: DRILL_RUNTIME_MAX_S, ..*load },
        target,
        randseed,
    )?;
    out.push_str("write_iops_log=drill\nwrite_lat_log=drill\nlog_avg_msec=1000\n");
    Ok(out)
}

/// [`render_drill_load`] for load host `host` of `hosts`: the host's share and seed as in
/// [`render_phase_load_on_host`], logs named `drill-hK` (fio's client brings them back with
/// the host's name appended) and stamped with Unix epoch milliseconds (`log_unix_epoch`),
/// since the hosts' jobs start at different moments: [`Drill::from_epoch_logs`] puts them on
/// one clock, which needs the hosts' clocks to agree.
pub fn render_drill_load_on_host(
    load: &PhaseLoad,
    target: &Target,
    randseed: u64,
    host: usize,
    hosts: usize,
) -> Result<String, crate::profile::ProfileError> {
    let load = PhaseLoad { runtime_s: DRILL_RUNTIME_MAX_S, ..*load };
    let mut out = render_phase_load_on_host(&load, target, randseed, host, hosts)?;
    let _ = writeln!(out, "write_iops_log={0}\nwrite_lat_log={0}", drill_log_prefix(host));
    out.push_str("log_avg_msec=1000\nlog_unix_epoch=1\n");
    Ok(out)
}

/// The most a load host's clock may be off the lab host's for its drill logs to be used:
/// far more than fio's connect takes or its stamps jitter, far less than a drill's steps.
pub const CLOCK_SKEW_MAX_MS: u64 = 2000;

/// Whether a load host's drill logs fit the drill as the lab host's clock saw it: fio was
/// started at `spawned_ms` and stopped by `stopped_ms` (epoch milliseconds here), and the
/// host's logs ran from `logs_start_ms` (its earliest log's first sample less one interval)
/// to `logs_end_ms` (its latest sample) by its own clock. A clock behind shows as a start
/// before fio was started, one ahead as samples after it was stopped. The problem, if any.
pub fn host_clock_problem(
    logs_start_ms: u64,
    logs_end_ms: u64,
    spawned_ms: u64,
    stopped_ms: u64,
) -> Option<String> {
    let seconds = |ms: u64| ms as f64 / 1000.0;
    if logs_start_ms.saturating_add(CLOCK_SKEW_MAX_MS) < spawned_ms {
        return Some(format!(
            "its drill logs start {:.1} s before fio was started here: its clock is behind \
             this host's by at least that",
            seconds(spawned_ms - logs_start_ms)
        ));
    }
    if logs_end_ms > stopped_ms.saturating_add(CLOCK_SKEW_MAX_MS) {
        return Some(format!(
            "its drill logs run {:.1} s past the moment fio was stopped here: its clock is \
             ahead of this host's by at least that",
            seconds(logs_end_ms - stopped_ms)
        ));
    }
    None
}

/// The drill logs' name on load host `host`.
pub fn drill_log_prefix(host: usize) -> String {
    format!("drill-h{host}")
}

/// A drill's fio runtime: a day, so that only the runner ends it.
pub const DRILL_RUNTIME_MAX_S: u32 = 86_400;

/// fio job that writes (`verify_only` false) or checks (true) the first half with crc32c
/// verify headers.
pub fn render_verify(
    target: &Target,
    verify_only: bool,
) -> Result<String, crate::profile::ProfileError> {
    let (half, _) = halves(target);
    let mut out =
        String::from("; flashraid-lab: degraded-rebuild data check (generated)\n[global]\n");
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\n\n[verify]\nrw=write\nbs=65536\niodepth=8\n");
    let _ = writeln!(out, "offset=0\nsize={half}");
    out.push_str("verify=crc32c\nverify_fatal=1\nverify_state_save=0\nrandseed=4242\n");
    if verify_only {
        out.push_str("verify_only=1\n");
    } else {
        out.push_str("do_verify=0\n");
    }
    Ok(out)
}

/// One load level's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelResult {
    /// Percent of the healthy maximum; 0: no load (the rebuild alone).
    pub load_percent: u8,
    pub load: PhaseLoad,
    /// Per phase (in [`PHASES`] order), the fio runs measured in it.
    pub phases: Vec<(String, Vec<JobResult>)>,
    pub rebuild_seconds: f64,
    /// Bytes the rebuild wrote to the replacement.
    pub rebuild_bytes: u64,
    /// The data written before the failure read back intact after the rebuild.
    pub verified: bool,
    /// The continuous run through a second failure and rebuild (loaded levels; older
    /// reports have none).
    #[serde(default)]
    pub drill: Option<Drill>,
}

/// Seconds after a marker in which its transient is measured.
pub const TRANSIENT_WINDOW_S: f64 = 10.0;

/// One continuous load run through a failure and a rebuild: fio's 1-s logs of all threads
/// together, and when each step happened (seconds from the load's start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drill {
    pub bin_ms: u64,
    /// Per bin: IOPS of every thread together (reads + writes).
    pub iops: Vec<f64>,
    /// Per bin: the highest mean latency (us) any thread logged, read or write (0: none).
    pub latency_us: Vec<f64>,
    pub markers: Vec<DrillMarker>,
    /// Seconds from which every log runs: load hosts start at different moments, and the
    /// healthy baseline counts only the seconds all of them load (0 with one host; older
    /// reports have none).
    #[serde(default)]
    pub load_from_s: f64,
}

/// A step of the drill and when it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillMarker {
    /// e.g. "member 0 failed", "spare added", "rebuilt".
    pub what: String,
    pub at_s: f64,
}

/// What the load went through after one marker.
#[derive(Debug, Clone, PartialEq)]
pub struct Transient {
    pub what: String,
    pub at_s: f64,
    /// The lowest bin's IOPS and the highest bin's latency in [`TRANSIENT_WINDOW_S`] after
    /// the marker (`None`: no bin there).
    pub worst_iops: Option<f64>,
    pub worst_latency_us: Option<f64>,
    /// Seconds from the marker to the first bin back within 10 % of healthy IOPS (`None`:
    /// not before the next marker or the end).
    pub back_within_10_percent_s: Option<f64>,
}

impl Drill {
    /// Build from every thread's IOPS and latency logs (`log_avg_msec` = `interval_ms`) and
    /// the markers (seconds from the job's start, as fio's log times are). One bin per log
    /// interval, however long the drill (a full-mode drill lasts half an hour and more; wider
    /// bins would hide the seconds after a step); charts thin it for drawing.
    pub fn from_logs(
        iops_logs: &[Vec<crate::vm::LogSample>],
        latency_logs: &[Vec<crate::vm::LogSample>],
        interval_ms: u64,
        markers: Vec<DrillMarker>,
    ) -> Result<Drill, crate::vm::VmError> {
        let mut timeline = crate::vm::timeline_binned(iops_logs, interval_ms, usize::MAX)?;
        crate::vm::add_latency(&mut timeline, latency_logs, interval_ms);
        Ok(Drill {
            bin_ms: timeline.bin_ms,
            iops: timeline.total_iops,
            latency_us: timeline.worst_vm_latency_us,
            markers,
            load_from_s: 0.0,
        })
    }

    /// [`Drill::from_logs`] for logs stamped with Unix epoch milliseconds (`log_unix_epoch`:
    /// a drill from several load hosts, whose jobs start at different moments) and markers
    /// at epoch milliseconds. The clock starts where the earliest log's first interval does
    /// (its first sample less one interval). Each log is placed whole, at the interval
    /// nearest its own start, and its samples keep their places on its own grid: hosts that
    /// started apart are aligned to within half an interval, and a host's sample is never
    /// moved into a neighbour's bin by jitter in its stamps (found by review: placing every
    /// sample alone put two of a host's samples in one bin and none in the next when it
    /// started half an interval off the clock). A log's stamps less its own start must fit in
    /// a drill's longest run ([`DRILL_RUNTIME_MAX_S`]), else the logs are refused.
    pub fn from_epoch_logs(
        iops_logs: &[Vec<crate::vm::LogSample>],
        latency_logs: &[Vec<crate::vm::LogSample>],
        interval_ms: u64,
        markers_epoch_ms: Vec<(String, u64)>,
    ) -> Result<Drill, crate::vm::VmError> {
        let interval_ms = interval_ms.max(1);
        let start_of = |log: &[crate::vm::LogSample]| {
            log.first().map(|s| s.time_ms.saturating_sub(interval_ms))
        };
        let origin_ms = iops_logs.iter().filter_map(|l| start_of(l)).min().unwrap_or(0);
        let span_max_ms = u64::from(DRILL_RUNTIME_MAX_S) * 1000 + 2 * interval_ms;
        let mut load_from_ms = 0;
        let mut place = |logs: &[Vec<crate::vm::LogSample>]| -> Result<Vec<Vec<_>>, _> {
            let mut placed = Vec::with_capacity(logs.len());
            for log in logs {
                let Some(start) = start_of(log) else {
                    placed.push(vec![]);
                    continue;
                };
                // Whole intervals from the clock's start to the log's, rounded.
                let offset_ms =
                    (start.saturating_sub(origin_ms) + interval_ms / 2) / interval_ms * interval_ms;
                load_from_ms = load_from_ms.max(offset_ms);
                let mut out = Vec::with_capacity(log.len());
                for sample in log {
                    let own_ms = sample.time_ms.saturating_sub(start);
                    if own_ms.saturating_add(offset_ms) > span_max_ms {
                        return Err(crate::vm::VmError::LogSpan {
                            seconds: own_ms.saturating_add(offset_ms) / 1000,
                        });
                    }
                    out.push(crate::vm::LogSample { time_ms: own_ms + offset_ms, ..*sample });
                }
                placed.push(out);
            }
            Ok(placed)
        };
        let iops = place(iops_logs)?;
        let latency = place(latency_logs)?;
        let markers = markers_epoch_ms
            .into_iter()
            .map(|(what, at_ms)| DrillMarker {
                what,
                at_s: at_ms.saturating_sub(origin_ms) as f64 / 1000.0,
            })
            .collect();
        let mut drill = Drill::from_logs(&iops, &latency, interval_ms, markers)?;
        drill.load_from_s = load_from_ms as f64 / 1000.0;
        Ok(drill)
    }

    fn bin_s(&self) -> f64 {
        self.bin_ms.max(1) as f64 / 1000.0
    }

    /// Bins lying wholly in `[from_s, to_s)`.
    fn bins_between(&self, from_s: f64, to_s: f64) -> std::ops::Range<usize> {
        let bin_s = self.bin_s();
        let first = (from_s / bin_s).ceil().max(0.0) as usize;
        let end = ((to_s / bin_s).floor().max(0.0) as usize).min(self.iops.len());
        first.min(end)..end
    }

    /// Bins overlapping `[from_s, to_s)`: the bin a step happens in holds the first moments
    /// after it, often the worst.
    fn bins_touching(&self, from_s: f64, to_s: f64) -> std::ops::Range<usize> {
        let bin_s = self.bin_s();
        let first = (from_s / bin_s).floor().max(0.0) as usize;
        let end = ((to_s / bin_s).ceil().max(0.0) as usize).min(self.iops.len());
        first.min(end)..end
    }

    /// Mean IOPS before the first marker (the healthy state), from the moment every log
    /// runs; `None` without such a bin.
    pub fn healthy_iops(&self) -> Option<f64> {
        let first = self.markers.first().map_or(f64::INFINITY, |m| m.at_s);
        let bins = self.bins_between(self.load_from_s, first);
        (!bins.is_empty()).then(|| self.iops[bins.clone()].iter().sum::<f64>() / bins.len() as f64)
    }

    /// Per marker: the worst second in the window after it, and how long the load took to
    /// get back within 10 % of healthy (looking until the next marker).
    pub fn transients(&self) -> Vec<Transient> {
        let healthy = self.healthy_iops();
        let end_s = self.iops.len() as f64 * self.bin_s();
        self.markers
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let window = self.bins_touching(m.at_s, m.at_s + TRANSIENT_WINDOW_S);
                let worst_iops = self.iops[window.clone()].iter().copied().reduce(f64::min);
                let worst_latency_us =
                    self.latency_us.get(window).and_then(|l| l.iter().copied().reduce(f64::max));
                let next_s = self.markers.get(i + 1).map_or(end_s, |n| n.at_s);
                let back_within_10_percent_s = healthy.and_then(|h| {
                    self.bins_between(m.at_s, next_s)
                        .find(|&b| self.iops[b] >= 0.9 * h)
                        .map(|b| (b as f64 * self.bin_s() - m.at_s).max(0.0))
                });
                Transient {
                    what: m.what.clone(),
                    at_s: m.at_s,
                    worst_iops,
                    worst_latency_us,
                    back_within_10_percent_s,
                }
            })
            .collect()
    }
}

fn transient_table(level: &LevelResult, drill: &Drill) -> Table {
    let healthy = drill.healthy_iops();
    let rows = drill
        .transients()
        .into_iter()
        .map(|t| {
            let of_healthy = match (t.worst_iops, healthy) {
                (Some(w), Some(h)) if h > 0.0 => format!("{:.0}%", 100.0 * w / h),
                _ => "n/a".into(),
            };
            vec![
                t.what,
                format!("{:.1}", t.at_s),
                fixed(t.worst_iops, 0),
                of_healthy,
                fixed(t.worst_latency_us.filter(|&l| l > 0.0), 0),
                t.back_within_10_percent_s
                    .map_or("not in this step".into(), |s| format!("{s:.0} s")),
            ]
        })
        .collect();
    Table {
        title: format!(
            "Load {}%: one continuous run through a failure and a rebuild (healthy {} IOPS)",
            level.load_percent,
            fixed(healthy, 0)
        ),
        header: [
            "Step",
            "at s",
            "worst 1-s IOPS (next 10 s)",
            "of healthy",
            "worst mean latency us (next 10 s)",
            "back within 10% of healthy after",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

/// Points a drill chart draws at most: longer drills are shown as means over wider bins.
const DRILL_CHART_POINTS_MAX: usize = 900;

/// `values` per `bin_s` thinned to at most [`DRILL_CHART_POINTS_MAX`] points (means over
/// groups of bins; the last group may be short): the bin width and the values.
fn thinned(values: &[f64], bin_s: f64) -> (f64, Vec<f64>) {
    let group = values.len().div_ceil(DRILL_CHART_POINTS_MAX).max(1);
    let points = values.chunks(group).map(|c| c.iter().sum::<f64>() / c.len() as f64).collect();
    (bin_s * group as f64, points)
}

/// The drill's timeline charts: IOPS and mean latency per bin, each step a dashed vertical
/// line (in order: the failure, the spare added, rebuilt; times in the table).
fn drill_charts(level: &LevelResult, drill: &Drill) -> String {
    let mut out = String::new();
    for (name, unit, values) in
        [("IOPS", "IOPS", &drill.iops), ("mean latency", "us", &drill.latency_us)]
    {
        let (bin_s, points) = thinned(values, drill.bin_s());
        let per = if bin_s > drill.bin_s() {
            format!("mean per {bin_s:.0} s")
        } else {
            "per second".into()
        };
        let mut chart = crate::chart::binned_timeline_chart(
            format!("Load {}%: {name} {per} through the drill", level.load_percent),
            unit,
            vec![(name.to_string(), 0, bin_s, points.as_slice())],
        );
        let top = points.iter().copied().fold(0.0f64, f64::max);
        for marker in &drill.markers {
            chart.guides.push(crate::chart::Guide {
                kind: "steps: failure, spare added, rebuilt",
                colour_index: 1,
                from: (marker.at_s, 0.0),
                to: (marker.at_s, top),
                dash: Some("4 3"),
            });
        }
        out.push_str(&crate::chart::line_chart_svg(&chart));
    }
    out
}

/// A degraded-rebuild run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegradedReport {
    pub run_id: String,
    pub mode: Mode,
    pub conformance: ConformanceLabel,
    pub target: String,
    pub manifest: BTreeMap<String, String>,
    pub levels: Vec<LevelResult>,
}

/// Mean IOPS and worst p99 / p99.9 of a phase's runs.
pub fn phase_figures(runs: &[JobResult]) -> Option<(f64, f64, f64)> {
    if runs.is_empty() {
        return None;
    }
    let iops = runs.iter().map(JobResult::iops_total).sum::<f64>() / runs.len() as f64;
    let p99 =
        runs.iter().filter_map(|j| j.worse_percentile_us(|p| p.latency_us_p99)).fold(0.0, f64::max);
    let p999 = runs
        .iter()
        .filter_map(|j| j.worse_percentile_us(|p| p.latency_us_p99_9))
        .fold(0.0, f64::max);
    Some((iops, p99, p999))
}

fn level_table(level: &LevelResult) -> Table {
    let healthy =
        level.phases.iter().find(|(p, _)| p == "healthy").and_then(|(_, r)| phase_figures(r));
    let rows = level
        .phases
        .iter()
        .filter(|(_, runs)| !runs.is_empty())
        .map(|(phase, runs)| {
            let figures = phase_figures(runs);
            let ratio = |v: Option<f64>, b: Option<f64>| match (v, b) {
                (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
                _ => "n/a".to_string(),
            };
            vec![
                phase.clone(),
                runs.len().to_string(),
                fixed(figures.map(|f| f.0), 0),
                ratio(figures.map(|f| f.0), healthy.map(|h| h.0)),
                fixed(figures.map(|f| f.1), 0),
                ratio(figures.map(|f| f.1), healthy.map(|h| h.1)),
                fixed(figures.map(|f| f.2), 0),
            ]
        })
        .collect();
    let load = match level.load_percent {
        0 => "no load (the rebuild alone)".to_string(),
        p => format!("{p}% of the healthy maximum"),
    };
    Table {
        title: format!(
            "Load {load}: rebuild {:.1} s, {:.0} MiB/s; data written before the failure {}",
            level.rebuild_seconds,
            level.rebuild_bytes as f64 / (1u64 << 20) as f64 / level.rebuild_seconds.max(1e-9),
            if level.verified { "intact" } else { "NOT intact" }
        ),
        header: ["Phase", "fio runs", "IOPS", "of healthy", "p99 us", "p99 vs healthy", "p99.9 us"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    }
}

fn title(report: &DegradedReport) -> String {
    format!(
        "flashraid lab: degraded-rebuild on {} ({} mode), run {}",
        report.target, report.mode, report.run_id
    )
}

pub fn render_degraded_markdown(report: &DegradedReport) -> String {
    let mut out = format!("# {}\n\n", title(report));
    md_label(&mut out, &report.conformance);
    out.push_str("Load: 4 KiB random, 70% reads, on the second half of the array; the first half holds data written with crc32c verify headers before the failure and checked after the rebuild. IOPS: mean of the phase's fio runs; p99 and p99.9: the worst run's (the worse of read and write). The rebuilding phase is fio runs back to back from a second before the spare is added until the rebuild is over, so its first and last runs also cover a little of the degraded and rebuilt states.\n\n");
    for level in &report.levels {
        let table = level_table(level);
        if table.rows.is_empty() {
            let _ = writeln!(out, "#### {}\n\n(no foreground load)\n", table.title);
        } else {
            out.push_str(&md_table(&table));
        }
        if let Some(drill) = &level.drill {
            out.push_str(&md_table(&transient_table(level, drill)));
        }
    }
    md_manifest(&mut out, &report.manifest);
    out
}

pub fn render_degraded_html(report: &DegradedReport) -> String {
    let mut out = html_open(&title(report));
    html_label(&mut out, &report.conformance);
    for level in &report.levels {
        out.push_str(&html_table(&level_table(level)));
        if let Some(drill) = &level.drill {
            out.push_str(&html_table(&transient_table(level, drill)));
            out.push_str(&drill_charts(level, drill));
        }
    }
    html_manifest(&mut out, &report.manifest);
    out.push_str("</body></html>\n");
    out
}

/// Several degraded-rebuild runs side by side (`bench compare`): per load level, one row
/// per run.
#[derive(Debug, Clone, PartialEq)]
pub struct DegradedComparison {
    pub run_id: String,
    pub conformance: ConformanceLabel,
    pub manifest: BTreeMap<String, String>,
    pub runs: Vec<DegradedReport>,
}

/// The load levels of a run, in order: runs compare only with the same levels and mode (a
/// run cut short has fewer levels, so it compares only with runs cut at the same point).
fn levels_of(report: &DegradedReport) -> Vec<u8> {
    report.levels.iter().map(|l| l.load_percent).collect()
}

fn same_shape(a: &DegradedReport, b: &DegradedReport) -> bool {
    a.mode == b.mode && levels_of(a) == levels_of(b)
}

/// Runs grouped by shape (mode and load levels), in first-seen order.
pub fn group_degraded(runs: Vec<DegradedReport>) -> Vec<Vec<DegradedReport>> {
    group_runs(runs, same_shape)
}

/// Put runs of one shape side by side.
pub fn compare_degraded(runs: &[DegradedReport]) -> Result<DegradedComparison, MergeError> {
    let [first, rest @ ..] = runs else { return Err(MergeError::TooFew(0)) };
    if rest.is_empty() {
        return Err(MergeError::TooFew(1));
    }
    if let Some(other) = rest.iter().find(|r| !same_shape(first, r)) {
        return Err(MergeError::ShapeDiffers {
            first: first.run_id.clone(),
            other: other.run_id.clone(),
        });
    }
    let (run_id, conformance, manifest) = merged_header(
        &runs.iter().map(|r| (r.run_id.as_str(), &r.conformance, &r.manifest)).collect::<Vec<_>>(),
    );
    Ok(DegradedComparison { run_id, conformance, manifest, runs: runs.to_vec() })
}

/// One load level across the runs: a row per run with every phase's IOPS as a share of that
/// run's healthy phase, the p99 while rebuilding against healthy, and the rebuild.
fn compare_table(comparison: &DegradedComparison, level_index: usize) -> Table {
    // Runs of one comparison have the same levels (compare_degraded checks).
    let load_percent = comparison.runs[0].levels[level_index].load_percent;
    let rows = comparison
        .runs
        .iter()
        .filter_map(|run| {
            let level = run.levels.get(level_index)?;
            let figures = |phase: &str| {
                level.phases.iter().find(|(p, _)| p == phase).and_then(|(_, r)| phase_figures(r))
            };
            let healthy = figures("healthy");
            let share = |phase: &str| match (figures(phase), healthy) {
                (Some(f), Some(h)) if h.0 > 0.0 => format!("{:.0} ({:.2})", f.0, f.0 / h.0),
                (Some(f), _) => format!("{:.0}", f.0),
                (None, _) => "n/a".to_string(),
            };
            let p99_vs_healthy = match (figures("rebuilding"), healthy) {
                (Some(f), Some(h)) if h.1 > 0.0 => format!("{:.2}x", f.1 / h.1),
                _ => "n/a".to_string(),
            };
            Some(vec![
                format!("{}: {}", run.run_id, run.target),
                fixed(healthy.map(|h| h.0), 0),
                share("degraded"),
                share("rebuilding"),
                share("rebuilt"),
                p99_vs_healthy,
                format!("{:.1}", level.rebuild_seconds),
                format!(
                    "{:.0}",
                    level.rebuild_bytes as f64
                        / (1u64 << 20) as f64
                        / level.rebuild_seconds.max(1e-9)
                ),
                if level.verified { "intact" } else { "NOT intact" }.to_string(),
            ])
        })
        .collect();
    let load = match load_percent {
        0 => "No foreground load (the rebuild alone)".to_string(),
        p => format!("Load {p}% of each run's healthy maximum"),
    };
    Table {
        title: format!("{load}: IOPS per phase (share of the run's healthy phase)"),
        header: [
            "Run: target",
            "healthy IOPS",
            "degraded",
            "rebuilding",
            "rebuilt",
            "p99 rebuilding vs healthy",
            "rebuild s",
            "rebuild MiB/s",
            "data",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    }
}

fn compare_tables(comparison: &DegradedComparison) -> Vec<Table> {
    let levels = comparison.runs.first().map_or(0, |r| r.levels.len());
    (0..levels)
        .flat_map(|i| {
            std::iter::once(compare_table(comparison, i)).chain(drill_table(comparison, i))
        })
        .collect()
}

/// Each run's drill at a level (`None` for a run without one: from before drills, or the
/// level without load).
fn drills_at(comparison: &DegradedComparison, level_index: usize) -> Vec<(String, Option<&Drill>)> {
    comparison
        .runs
        .iter()
        .map(|run| {
            let drill = run.levels.get(level_index).and_then(|l| l.drill.as_ref());
            (format!("{}: {}", run.run_id, run.target), drill)
        })
        .collect()
}

/// The drills of one load level across the runs, if any run has one: per run its healthy
/// IOPS, then per step (named as in the first drill) the worst second's share of healthy
/// and how long the load took to get back within 10 %.
fn drill_table(comparison: &DegradedComparison, level_index: usize) -> Option<Table> {
    let drills = drills_at(comparison, level_index);
    let steps: Vec<String> =
        drills.iter().find_map(|(_, d)| *d)?.markers.iter().map(|m| m.what.clone()).collect();
    let rows = drills
        .iter()
        .map(|(name, drill)| {
            let mut row = vec![name.clone()];
            let Some(drill) = drill else {
                row.push("no drill".into());
                row.extend(steps.iter().flat_map(|_| ["n/a".to_string(), "n/a".to_string()]));
                return row;
            };
            let healthy = drill.healthy_iops();
            row.push(fixed(healthy, 0));
            let transients = drill.transients();
            for step in &steps {
                let t = transients.iter().find(|t| &t.what == step);
                row.push(match (t.and_then(|t| t.worst_iops), healthy) {
                    (Some(w), Some(h)) if h > 0.0 => format!("{:.0}%", 100.0 * w / h),
                    _ => "n/a".into(),
                });
                row.push(match t {
                    Some(t) => t
                        .back_within_10_percent_s
                        .map_or("not in this step".into(), |s| format!("{s:.0} s")),
                    None => "n/a".into(),
                });
            }
            row
        })
        .collect();
    let load_percent = comparison.runs[0].levels[level_index].load_percent;
    let mut header = vec!["Run: target".to_string(), "healthy IOPS (drill)".to_string()];
    for step in &steps {
        header.push(format!("{step}: worst 1-s IOPS of healthy"));
        header.push(format!("{step}: back within 10% after"));
    }
    Some(Table {
        title: format!(
            "Load {load_percent}%: the drill (one continuous run through a failure and a \
             rebuild) across the runs"
        ),
        header,
        rows,
    })
}

/// The drills of one load level on one chart: each run's IOPS as a share of its own healthy
/// IOPS, its time axis shifted so that its first step (the failure) is at 0 s.
fn drill_compare_chart(
    comparison: &DegradedComparison,
    level_index: usize,
) -> Option<crate::chart::LineChart> {
    let mut series = vec![];
    for (i, (name, drill)) in drills_at(comparison, level_index).into_iter().enumerate() {
        let Some(drill) = drill else { continue };
        let (Some(healthy), Some(failure)) = (drill.healthy_iops(), drill.markers.first()) else {
            continue;
        };
        if healthy <= 0.0 {
            continue;
        }
        let (bin_s, values) = thinned(&drill.iops, drill.bin_s());
        let points = values
            .iter()
            .enumerate()
            .map(|(b, v)| ((b as f64 + 0.5) * bin_s - failure.at_s, 100.0 * v / healthy))
            .collect();
        series.push(crate::chart::Series { name, colour_index: i, points });
    }
    if series.is_empty() {
        return None;
    }
    let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (low, high) = (xs().fold(0.0f64, f64::min), xs().fold(0.0f64, f64::max));
    let step = crate::chart::nice_step((high - low).max(0.1) / 6.0);
    let x_ticks = ((low / step).floor() as i64..=(high / step).ceil() as i64)
        .map(|k| (k as f64 * step, crate::chart::short_number(k as f64 * step)))
        .collect();
    let top = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(100.0f64, f64::max);
    let load_percent = comparison.runs[0].levels[level_index].load_percent;
    Some(crate::chart::LineChart {
        title: format!(
            "Load {load_percent}%: IOPS through the drill, % of each run's healthy, 0 s = the failure"
        ),
        x_label: "seconds from the failure".into(),
        y_label: "% of healthy IOPS".into(),
        x_ticks,
        log_y: false,
        series,
        guides: vec![crate::chart::Guide {
            kind: "the failure",
            colour_index: 0,
            from: (0.0, 0.0),
            to: (0.0, top),
            dash: Some("4 3"),
        }],
    })
}

fn compare_title(comparison: &DegradedComparison) -> String {
    format!("flashraid lab: degraded-rebuild, {}", comparison.run_id)
}

pub fn render_degraded_compare_markdown(comparison: &DegradedComparison) -> String {
    let mut out = format!("# {}\n\n", compare_title(comparison));
    md_label(&mut out, &comparison.conformance);
    for table in compare_tables(comparison) {
        out.push_str(&md_table(&table));
    }
    md_manifest(&mut out, &comparison.manifest);
    out
}

pub fn render_degraded_compare_html(comparison: &DegradedComparison) -> String {
    let mut out = html_open(&compare_title(comparison));
    html_label(&mut out, &comparison.conformance);
    let levels = comparison.runs.first().map_or(0, |r| r.levels.len());
    for i in 0..levels {
        out.push_str(&html_table(&compare_table(comparison, i)));
        if let Some(table) = drill_table(comparison, i) {
            out.push_str(&html_table(&table));
        }
        if let Some(chart) = drill_compare_chart(comparison, i) {
            out.push_str(&crate::chart::line_chart_svg(&chart));
        }
    }
    html_manifest(&mut out, &comparison.manifest);
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fio::{DirectionResult, LatencySource, Percentiles};

    /// A phase's fio run: `iops` in all (70% reads), p99 `p99_us` on both directions.
    fn run(iops: f64, p99_us: f64) -> JobResult {
        let direction = |iops: f64| DirectionResult {
            iops,
            bandwidth_bytes_per_s: iops * 4096.0,
            io_bytes: (iops * 4096.0) as u64,
            ios: iops as u64,
            runtime_ms: 1000,
            latency_us_mean: Some(p99_us / 4.0),
            latency_us_max: Some(p99_us * 2.0),
            latency_us_min: Some(1.0),
            percentiles: Some(Percentiles {
                source: LatencySource::Total,
                latency_us_p50: Some(p99_us / 4.0),
                latency_us_p90: Some(p99_us / 2.0),
                latency_us_p99: Some(p99_us),
                latency_us_p99_9: Some(p99_us * 1.5),
                latency_us_p99_99: None,
            }),
        };
        JobResult {
            name: "load".into(),
            group_id: 0,
            error_code: 0,
            usr_cpu_percent: 1.0,
            sys_cpu_percent: 1.0,
            job_runtime_ms: 1000,
            read: direction(iops * 0.7),
            write: direction(iops * 0.3),
            sync: None,
        }
    }

    fn level(load_percent: u8, healthy: f64, degraded: f64, verified: bool) -> LevelResult {
        let phases = if load_percent == 0 {
            PHASES.iter().map(|p| (p.to_string(), vec![])).collect()
        } else {
            vec![
                ("healthy".to_string(), vec![run(healthy, 100.0)]),
                ("degraded".to_string(), vec![run(degraded, 150.0)]),
                ("rebuilding".to_string(), vec![run(degraded / 2.0, 300.0), run(degraded, 200.0)]),
                ("rebuilt".to_string(), vec![run(healthy, 100.0)]),
            ]
        };
        LevelResult {
            load_percent,
            load: PhaseLoad {
                threads: 2,
                queue_depth: 8,
                runtime_s: 2,
                rate_iops_per_thread: None,
            },
            phases,
            rebuild_seconds: 2.0,
            rebuild_bytes: 64 << 20,
            verified,
            drill: None,
        }
    }

    fn samples(values: &[f64]) -> Vec<crate::vm::LogSample> {
        values
            .iter()
            .enumerate()
            .map(|(i, &value)| crate::vm::LogSample {
                time_ms: (i as u64 + 1) * 1000,
                value,
                direction: 0,
            })
            .collect()
    }

    /// Two threads of 500 IOPS healthy; the failure at 5 s drops them to 100 and 150 (250)
    /// two seconds, then 400 each (80 %: not back within 10 %); the spare at 10 s, back to
    /// 480 each (96 %) two seconds later.
    fn drill() -> Drill {
        let a =
            [500., 500., 500., 500., 500., 100., 100., 400., 400., 400., 300., 350., 480., 480.];
        let b =
            [500., 500., 500., 500., 500., 150., 150., 400., 400., 400., 300., 350., 480., 480.];
        let latency: Vec<f64> = a.iter().map(|&v| 1_000_000_000.0 / v).collect();
        Drill::from_logs(
            &[samples(&a), samples(&b)],
            &[samples(&latency)],
            1000,
            vec![
                DrillMarker { what: "member 0 failed".into(), at_s: 5.0 },
                DrillMarker { what: "spare added".into(), at_s: 10.0 },
                DrillMarker { what: "rebuilt".into(), at_s: 13.0 },
            ],
        )
        .unwrap()
    }

    fn nbd(size_bytes: u64) -> Target {
        Target::Nbd { uri: "nbd://10.0.0.1:10809/a".into(), size_bytes }
    }

    fn value(job: &str, key: &str) -> String {
        let prefix = format!("{key}=");
        let found: Vec<&str> = job.lines().filter_map(|l| l.strip_prefix(&prefix)).collect();
        assert_eq!(found.len(), 1, "{key} in {job}");
        found[0].to_string()
    }

    /// Load hosts share the load region (the target's second half) out in whole MiB, each
    /// with its own seed and the load's own threads and pace; their drills log under their
    /// own names, stamped with the epoch. The verified first half is no host's.
    #[test]
    fn load_hosts_share_the_load_region_out_and_keep_to_it() {
        let load =
            PhaseLoad { threads: 2, queue_depth: 8, runtime_s: 5, rate_iops_per_thread: Some(700) };
        let target = nbd(64 << 20);
        let whole = render_phase_load(&load, &target, 9).unwrap();
        assert_eq!(value(&whole, "offset"), (32u64 << 20).to_string());
        for hosts in [1usize, 2, 3, 5] {
            let mut end = 32u64 << 20;
            let mut seeds = vec![];
            for host in 0..hosts {
                let job = render_phase_load_on_host(&load, &target, 9, host, hosts).unwrap();
                let offset: u64 = value(&job, "offset").parse().unwrap();
                let size: u64 = value(&job, "size").parse().unwrap();
                assert_eq!(offset, end, "host {host} of {hosts} starts where the last ended");
                assert!(
                    size > 0
                        && size.is_multiple_of(1 << 20)
                        && size >= (32 << 20) / hosts as u64 - (1 << 20)
                );
                end = offset + size;
                assert_eq!(value(&job, "numjobs"), "2");
                // fio caps reads and writes apart: 700 a thread at 70% reads.
                assert_eq!(value(&job, "rate_iops"), "490,210");
                assert_eq!(value(&job, "runtime"), "5");
                seeds.push(value(&job, "randseed"));
                let drill = render_drill_load_on_host(&load, &target, 9, host, hosts).unwrap();
                assert_eq!(value(&drill, "offset"), offset.to_string());
                assert_eq!(value(&drill, "write_iops_log"), format!("drill-h{host}"));
                assert_eq!(value(&drill, "write_lat_log"), drill_log_prefix(host));
                assert_eq!(value(&drill, "log_unix_epoch"), "1");
                assert_eq!(value(&drill, "runtime"), DRILL_RUNTIME_MAX_S.to_string());
            }
            assert!(end <= 64 << 20);
            seeds.sort();
            seeds.dedup();
            assert_eq!(seeds.len(), hosts, "every host its own seed");
        }
        // 2 MiB of load region: two hosts get 1 MiB each, three cannot.
        let small = nbd(4 << 20);
        assert!(render_phase_load_on_host(&load, &small, 1, 1, 2).is_ok());
        assert!(matches!(
            render_phase_load_on_host(&load, &small, 1, 0, 3),
            Err(crate::profile::ProfileError::TargetTooSmall { .. })
        ));
    }

    fn stamped(start_ms: u64, times_ms: &[u64], value: f64) -> Vec<crate::vm::LogSample> {
        times_ms
            .iter()
            .map(|&t| crate::vm::LogSample { time_ms: start_ms + t, value, direction: 0 })
            .collect()
    }

    /// Logs stamped with the epoch (hosts whose jobs started 300 ms and 2 s apart) land on one
    /// clock from the earliest start: the hosts' seconds add up bin by bin, the markers sit
    /// where they happened on it, and the healthy baseline waits for the late host.
    #[test]
    fn epoch_stamped_logs_from_hosts_that_started_apart_share_one_clock() {
        let start_ms = 1_790_000_000_000u64;
        let host = |offset_ms: u64, values: &[f64]| -> Vec<crate::vm::LogSample> {
            samples(values)
                .into_iter()
                .map(|s| crate::vm::LogSample { time_ms: s.time_ms + start_ms + offset_ms, ..s })
                .collect()
        };
        let a = host(0, &[100.0, 100.0, 100.0, 100.0, 10.0, 100.0]);
        let b = host(300, &[200.0, 200.0, 200.0, 200.0, 20.0, 200.0]);
        // A host that connected 2 s late: its first second is the other hosts' third.
        let c = host(2000, &[400.0, 400.0, 40.0, 400.0]);
        let d = Drill::from_epoch_logs(
            &[a.clone(), b, c],
            &[a],
            1000,
            vec![("member 0 failed".into(), start_ms + 4100)],
        )
        .unwrap();
        assert_eq!(d.iops, vec![300.0, 300.0, 700.0, 700.0, 70.0, 700.0]);
        assert_eq!(d.markers, vec![DrillMarker { what: "member 0 failed".into(), at_s: 4.1 }]);
        assert_eq!(d.transients()[0].worst_iops, Some(70.0));
        // Found by review: the first two seconds (host c not yet loading) counted as healthy.
        assert_eq!(d.load_from_s, 2.0);
        assert_eq!(d.healthy_iops(), Some(700.0));
        // A step before every log (a clock behind) sits at 0, not before the timeline.
        let early =
            Drill::from_epoch_logs(&[host(0, &[5.0])], &[], 1000, vec![("x".into(), start_ms - 1)])
                .unwrap();
        assert_eq!(early.markers[0].at_s, 0.0);
        assert_eq!(early.iops, vec![5.0]);
    }

    /// Found by review: with every sample placed alone, a host that started half an interval
    /// off the clock had stamps jitter either side of a bin edge, so one bin got two of its
    /// samples and the next none (a steady 300 IOPS drawn as 100, 500, 100, 500). A log is
    /// placed whole; its stamps keep their places on its own grid.
    #[test]
    fn stamps_that_jitter_around_a_bin_edge_keep_a_steady_load_steady() {
        let t0 = 1_790_000_000_000u64;
        let a = stamped(t0, &[1003, 2003, 3003, 4003, 5003, 6003], 100.0);
        let b = stamped(t0, &[1502, 2497, 3505, 4498, 5503, 6496], 200.0);
        let d = Drill::from_epoch_logs(&[a, b], &[], 1000, vec![]).unwrap();
        assert_eq!(d.iops, vec![300.0; 6]);
        let late = stamped(t0, &[1498, 2503, 3495, 4505, 5497, 6502], 200.0);
        let a = stamped(t0, &[1003, 2003, 3003, 4003, 5003, 6003], 100.0);
        let d = Drill::from_epoch_logs(&[a, late], &[], 1000, vec![]).unwrap();
        assert_eq!(d.iops, vec![300.0; 6]);
    }

    /// A load host's clock more than [`CLOCK_SKEW_MAX_MS`] behind or ahead of the lab host's
    /// is found from its logs' span against fio's start and stop here (found by review: a
    /// host 60 s behind set the timeline's start, and the other host's samples fell past its
    /// end, dropped without a word).
    #[test]
    fn a_load_hosts_clock_off_the_labs_is_found_from_its_logs() {
        let (spawned, stopped) = (1_000_000u64, 1_060_000u64);
        // fio connects within a second and stamps its last sample as it is stopped.
        assert_eq!(host_clock_problem(spawned + 900, stopped - 300, spawned, stopped), None);
        assert_eq!(host_clock_problem(spawned - 1500, stopped + 1500, spawned, stopped), None);
        let behind = host_clock_problem(spawned - 60_000, stopped - 60_000, spawned, stopped);
        assert!(behind.as_deref().is_some_and(|p| p.contains("behind") && p.contains("60.0 s")));
        let ahead = host_clock_problem(spawned + 5_000, stopped + 5_000, spawned, stopped);
        assert!(ahead.as_deref().is_some_and(|p| p.contains("ahead") && p.contains("5.0 s")));
    }

    /// Stamps that are not the epoch's, or a log that runs longer than any drill, are refused
    /// rather than drawn as a timeline of years (found by review: it allocated 14 GB).
    #[test]
    fn a_log_longer_than_any_drill_is_refused() {
        let t0 = 1_790_000_000_000u64;
        let too_long = u64::from(DRILL_RUNTIME_MAX_S) * 1000 + 5000;
        let log = stamped(t0, &[1000, 2000, too_long], 1.0);
        assert!(matches!(
            Drill::from_epoch_logs(&[log], &[], 1000, vec![]),
            Err(crate::vm::VmError::LogSpan { .. })
        ));
        let behind = stamped(t0, &[1000, 2000], 1.0);
        let far_ahead = stamped(t0 + too_long, &[1000, 2000], 1.0);
        assert!(matches!(
            Drill::from_epoch_logs(&[behind, far_ahead], &[], 1000, vec![]),
            Err(crate::vm::VmError::LogSpan { .. })
        ));
    }

    #[test]
    fn drill_transients_find_the_worst_second_and_the_recovery() {
        let d = drill();
        assert_eq!(d.iops.len(), 14);
        assert_eq!(d.healthy_iops(), Some(1000.0));
        let t = d.transients();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].worst_iops, Some(250.0));
        // 1e9 ns / 100 IOPS = 10 ms mean latency in the worst second after the failure.
        assert_eq!(t[0].worst_latency_us, Some(10_000.0));
        assert_eq!(t[0].back_within_10_percent_s, None, "800 is not within 10% of 1000");
        assert_eq!(t[1].worst_iops, Some(600.0));
        assert_eq!(t[1].back_within_10_percent_s, Some(2.0));
        assert_eq!(t[2].back_within_10_percent_s, Some(0.0));
    }

    /// Review findings: a long (full-mode) drill kept 4-s bins, and the second a step
    /// happens in was left out of its transient. A dip in the marker's own second counts,
    /// and half an hour keeps 1-s bins.
    #[test]
    fn a_dip_in_the_steps_own_second_counts_and_long_drills_keep_1_s_bins() {
        let mut values = vec![1000.0; 1830];
        values[601] = 10.0;
        let d = Drill::from_logs(
            &[samples(&values)],
            &[samples(&values)],
            1000,
            vec![DrillMarker { what: "member 0 failed".into(), at_s: 601.2 }],
        )
        .unwrap();
        assert_eq!(d.bin_ms, 1000);
        assert_eq!(d.iops.len(), 1830);
        let t = d.transients();
        assert_eq!(t[0].worst_iops, Some(10.0));
        assert_eq!(t[0].back_within_10_percent_s.map(|s| s.round()), Some(1.0));
        let (bin_s, points) = thinned(&d.iops, 1.0);
        assert!(points.len() <= DRILL_CHART_POINTS_MAX && bin_s == 3.0, "{bin_s} {}", points.len());
    }

    #[test]
    fn drills_render_their_steps_and_charts_and_old_reports_still_read() {
        let mut with = level(100, 1000.0, 700.0, true);
        with.drill = Some(drill());
        let r = report("d1", Mode::Quick, vec![with]);
        let md = render_degraded_markdown(&r);
        assert!(md.contains("one continuous run through a failure"), "{md}");
        assert!(
            md.contains("| member 0 failed | 5.0 | 250 | 25% | 10000 | not in this step |"),
            "{md}"
        );
        let html = render_degraded_html(&r);
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("stroke-dasharray=\"4 3\"") && html.contains("steps: failure"));
        // A report from before drills: no `drill` field.
        let mut json =
            serde_json::to_value(report("d0", Mode::Quick, vec![level(100, 1.0, 1.0, true)]))
                .unwrap();
        json["levels"][0].as_object_mut().unwrap().remove("drill");
        let back: DegradedReport = serde_json::from_value(json).unwrap();
        assert!(back.levels[0].drill.is_none());
    }

    fn report(run_id: &str, mode: Mode, levels: Vec<LevelResult>) -> DegradedReport {
        DegradedReport {
            run_id: run_id.into(),
            mode,
            conformance: ConformanceLabel::QuickSmoke { deviations: vec![] },
            target: "flashraid".into(),
            manifest: BTreeMap::from([("level".to_string(), "raid6".to_string())]),
            levels,
        }
    }

    /// Drills compare too: a row per run with each step's worst second and recovery (a run
    /// without a drill says so), and one chart with every run's IOPS as a share of its own
    /// healthy, aligned at the failure.
    #[test]
    fn drills_compare_step_by_step_and_on_one_chart_aligned_at_the_failure() {
        let mut with = level(100, 1000.0, 700.0, true);
        with.drill = Some(drill());
        let mut later = drill();
        for m in &mut later.markers {
            m.at_s += 3.0; // a run whose failure came 3 s later
        }
        later.iops.splice(0..0, [1000.0; 3]);
        later.latency_us.splice(0..0, [1.0; 3]);
        let mut with_later = with.clone();
        with_later.drill = Some(later);
        let without = level(100, 1000.0, 700.0, true);
        let runs = [
            report("a", Mode::Quick, vec![with]),
            report("b", Mode::Quick, vec![with_later]),
            report("old", Mode::Quick, vec![without]),
        ];
        let comparison = compare_degraded(&runs).unwrap();
        let md = render_degraded_compare_markdown(&comparison);
        assert!(md.contains("the drill (one continuous run"), "{md}");
        assert!(md.contains("| member 0 failed: worst 1-s IOPS of healthy |"), "{md}");
        let row = "| 1000 | 25% | not in this step | 60% | 2 s | 96% | 0 s |";
        assert!(md.contains(&format!("| a: flashraid {row}")), "{md}");
        assert!(md.contains(&format!("| b: flashraid {row}")), "the same drill, later: {md}");
        assert!(md.contains("| old: flashraid | no drill | n/a | n/a |"), "{md}");
        let html = render_degraded_compare_html(&comparison);
        assert_eq!(html.matches("<svg").count(), 1, "one drill chart for the one level");
        assert!(html.contains("0 s = the failure") && html.contains("stroke-dasharray=\"4 3\""));
        // A curve per run with a drill; once aligned at the failure, b's (3 s longer before
        // it) holds a's points.
        let chart = drill_compare_chart(&comparison, 0).unwrap();
        let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a: flashraid", "b: flashraid"]);
        let (a, b) = (&chart.series[0].points, &chart.series[1].points);
        assert_eq!(a[0], (-4.5, 100.0));
        assert_eq!(b[0], (-7.5, 100.0));
        assert_eq!(&b[3..], &a[..], "the same drill, shifted by 3 s");
        assert_eq!(a[5], (0.5, 25.0), "the worst second, just after the failure");
    }

    #[test]
    fn runs_of_one_shape_compare_level_by_level_with_shares_of_their_own_healthy_phase() {
        let a = report(
            "a",
            Mode::Quick,
            vec![level(100, 1000.0, 800.0, true), level(0, 0.0, 0.0, true)],
        );
        let b = report(
            "b",
            Mode::Quick,
            vec![level(100, 2000.0, 1000.0, false), level(0, 0.0, 0.0, true)],
        );
        let comparison = compare_degraded(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(comparison.run_id, "compare of a, b");
        assert_eq!(comparison.manifest.get("b: level").map(String::as_str), Some("raid6"));
        let md = render_degraded_compare_markdown(&comparison);
        // Rebuilding: the mean of its two runs (400 and 800 -> 600; 500 and 1000 -> 750), p99
        // the worst run's (300 against 100).
        assert!(
            md.contains("| a: flashraid | 1000 | 800 (0.80) | 600 (0.60) | 1000 (1.00) | 3.00x | 2.0 | 32 | intact |"),
            "{md}"
        );
        assert!(md.contains("| b: flashraid | 2000 | 1000 (0.50) | 750 (0.38) | 2000 (1.00) | 3.00x | 2.0 | 32 | NOT intact |"), "{md}");
        assert!(
            md.contains("Load 100% of each run's healthy maximum")
                && md.contains("No foreground load")
        );
        assert!(
            md.contains("| a: flashraid | n/a | n/a | n/a | n/a | n/a | 2.0 | 32 | intact |"),
            "{md}"
        );
        assert!(render_degraded_compare_html(&comparison).contains("NOT intact"));

        // Other load levels or another mode: another shape, which does not compare.
        let c = report("c", Mode::Quick, vec![level(50, 1000.0, 900.0, true)]);
        let d = report("d", Mode::Full, a.levels.clone());
        for other in [c.clone(), d.clone()] {
            assert!(matches!(
                compare_degraded(&[a.clone(), other]),
                Err(MergeError::ShapeDiffers { .. })
            ));
        }
        assert_eq!(compare_degraded(std::slice::from_ref(&a)).unwrap_err(), MergeError::TooFew(1));
        let groups = group_degraded(vec![a, c, b, d]);
        let ids: Vec<Vec<&str>> =
            groups.iter().map(|g| g.iter().map(|r| r.run_id.as_str()).collect()).collect();
        assert_eq!(ids, [vec!["a", "b"], vec!["c"], vec!["d"]]);
    }
}
