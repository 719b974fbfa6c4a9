//! The `vm-images` profile's results: many VMs' mixed random IO on one target, judged by
//! aggregate throughput, per-VM fairness and the worst VM's tail latency (benchmark-method.md
//! §7.3 P4).
//!
//! Owns: [`VmReport`] (serde; what the runner stores), Jain's fairness index, the IOPS and
//! latency timeline of each repetition from fio's 1-s averaged logs ([`parse_fio_log`],
//! [`vm_timeline`], [`add_latency`]), and the Markdown and HTML renderings with a
//! comparison across targets.
//!
//! Invariants: every repetition holds one fio job per VM (fio's `group_reporting=0`), all of
//! the same job name; figures are means over repetitions, except the worst-VM tail, which is
//! the worst over all of them.
//!
//! A timeline covers the intervals every VM logged. A VM that logged nothing in an interval
//! within that range counts 0 IOPS there: fio writes no averaged entry for a window without
//! IO, so that is a stall (or fio's logging thread more than half an interval late, which
//! looks the same). At most [`VM_TIMELINE_BINS_MAX`] bins (wider bins beyond). A repetition
//! whose logs cannot be read has no timeline (`None`), and the run goes on.
//!
//! Latency over time is the worst VM's mean per bin ([`add_latency`]: fio's averaged
//! latency logs hold means, so no percentiles over time).
//!
//! Limits: no noisy-neighbour or fsync variants yet.

use crate::chart::{self, BarChart};
use crate::fio::JobResult;
use crate::profile::{ConformanceLabel, Mode, VmImagesShape};
use crate::report::{
    Table, fixed, html_label, html_manifest, html_open, html_table, mb_per_s, md_label,
    md_manifest, md_table,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One vm-images run over one or more targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmReport {
    pub run_id: String,
    pub mode: Mode,
    pub conformance: ConformanceLabel,
    pub shape: VmImagesShape,
    pub manifest: BTreeMap<String, String>,
    /// In column order; the first is the baseline of every ratio.
    pub targets: Vec<VmTarget>,
}

/// One target's repetitions: per repetition, one fio job result per VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmTarget {
    pub name: String,
    pub description: String,
    pub repetitions: Vec<Vec<JobResult>>,
    /// Per repetition, IOPS over time; `None` where fio's logs could not be read (reports
    /// written before timelines have none).
    #[serde(default)]
    pub timelines: Vec<Option<VmTimeline>>,
}

/// Bins a timeline holds at most; a longer run gets wider bins.
pub const VM_TIMELINE_BINS_MAX: usize = 600;

/// One repetition's IOPS over time, all VMs together and the slowest VM, per bin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmTimeline {
    pub bin_ms: u64,
    /// Per bin from the log's start: the IOPS of every VM together (reads + writes).
    pub total_iops: Vec<f64>,
    /// Per bin: the IOPS of the VM with the fewest in that bin.
    pub slowest_vm_iops: Vec<f64>,
    /// Per bin: the highest mean latency (us) any VM logged in it, the worse of read and
    /// write (empty when the latency logs were not read).
    #[serde(default)]
    pub worst_vm_latency_us: Vec<f64>,
}

/// One line of fio's averaged IOPS or latency log: `time_ms, value, direction, block size,
/// offset` (value: IOPS, or mean latency in ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogSample {
    pub time_ms: u64,
    pub value: f64,
    /// 0 read, 1 write, 2 trim.
    pub direction: u8,
}

/// Parse one fio IOPS or latency log (`write_iops_log` / `write_lat_log` with `log_avg_msec`).
pub fn parse_fio_log(text: &str) -> Result<Vec<LogSample>, VmError> {
    let mut samples = vec![];
    for (line, fields) in crate::fio::log_lines(text) {
        let bad = |problem: &str| VmError::BadLogLine { line, problem: problem.into() };
        if fields.len() < 3 {
            return Err(bad("fewer than 3 fields"));
        }
        let time_ms = fields[0].parse::<u64>().map_err(|_| bad("time is not a number"))?;
        let value = fields[1].parse::<f64>().map_err(|_| bad("the value is not a number"))?;
        let direction = fields[2].parse::<u8>().map_err(|_| bad("direction is not a number"))?;
        if !value.is_finite() || value < 0.0 || direction > 2 {
            return Err(bad("value or direction out of range"));
        }
        samples.push(LogSample { time_ms, value, direction });
    }
    Ok(samples)
}

/// Interval index of a sample at `time_ms` (a sample covers the interval ending at its
/// time; fio's stamps drift by a few ms around multiples of the interval).
fn interval_of(time_ms: u64, interval_ms: u64) -> usize {
    usize::try_from((time_ms.saturating_add(interval_ms / 2) / interval_ms).saturating_sub(1))
        .unwrap_or(usize::MAX)
}

/// Build a repetition's timeline from every VM's IOPS log (one entry per VM; `interval_ms`:
/// the logs' `log_avg_msec`). A sample at time t covers the interval ending at t.
pub fn vm_timeline(logs: &[Vec<LogSample>], interval_ms: u64) -> Result<VmTimeline, VmError> {
    timeline_binned(logs, interval_ms, VM_TIMELINE_BINS_MAX)
}

/// [`vm_timeline`] with at most `bins_max` bins (`usize::MAX`: one bin per interval).
pub(crate) fn timeline_binned(
    logs: &[Vec<LogSample>],
    interval_ms: u64,
    bins_max: usize,
) -> Result<VmTimeline, VmError> {
    let interval_ms = interval_ms.max(1);
    if logs.is_empty() {
        return Err(VmError::NoLogs);
    }
    let interval = |t: u64| interval_of(t, interval_ms);
    let mut covered = usize::MAX;
    for (vm, log) in logs.iter().enumerate() {
        let last = log.iter().map(|s| interval(s.time_ms)).max().ok_or(VmError::EmptyLog { vm })?;
        covered = covered.min(last.saturating_add(1));
    }
    let mut per_bin = 1usize;
    while covered.div_ceil(per_bin) > bins_max {
        per_bin *= 2;
    }
    let bins = covered.div_ceil(per_bin);
    // Intervals in each bin: `per_bin`, except perhaps the last.
    let intervals_in = |bin: usize| per_bin.min(covered - bin * per_bin) as f64;
    let mut total = vec![0.0; bins];
    let mut slowest = vec![f64::INFINITY; bins];
    let mut vm_bins = vec![0.0; bins];
    for log in logs {
        vm_bins.iter_mut().for_each(|v| *v = 0.0);
        for sample in log {
            let index = interval(sample.time_ms);
            if index < covered {
                // Each interval's IOPS are a rate over that interval: a bin of several
                // intervals holds their mean.
                vm_bins[index / per_bin] += sample.value / intervals_in(index / per_bin);
            }
        }
        for (bin, value) in vm_bins.iter().enumerate() {
            total[bin] += value;
            slowest[bin] = slowest[bin].min(*value);
        }
    }
    Ok(VmTimeline {
        bin_ms: interval_ms * per_bin as u64,
        total_iops: total,
        slowest_vm_iops: slowest,
        worst_vm_latency_us: vec![],
    })
}

/// Add the worst VM's mean latency per bin from every VM's latency log (`write_lat_log`,
/// same interval): per bin, the highest per-interval mean of any VM in either direction. A
/// bin with no sample from any VM holds 0.
pub fn add_latency(timeline: &mut VmTimeline, logs: &[Vec<LogSample>], interval_ms: u64) {
    let interval_ms = interval_ms.max(1);
    let per_bin = usize::try_from(timeline.bin_ms / interval_ms).unwrap_or(1).max(1);
    let mut worst = vec![0.0f64; timeline.total_iops.len()];
    for sample in logs.iter().flatten() {
        let bin = interval_of(sample.time_ms, interval_ms) / per_bin;
        if let Some(slot) = worst.get_mut(bin) {
            *slot = slot.max(sample.value / 1000.0);
        }
    }
    timeline.worst_vm_latency_us = worst;
}

/// Why a repetition's results are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmError {
    #[error("fio reported {got} VM jobs, the profile runs {want}")]
    WrongJobCount { got: usize, want: usize },
    #[error("VM job {index} failed with fio error {error_code}")]
    JobFailed { index: usize, error_code: i64 },
    #[error("VM job {index} did no IO")]
    NoIo { index: usize },
    #[error("fio log line {line}: {problem}")]
    BadLogLine { line: usize, problem: String },
    #[error("no IOPS logs for the repetition")]
    NoLogs,
    #[error("the IOPS log of VM {vm} is empty")]
    EmptyLog { vm: usize },
    #[error("a log runs {seconds} s from its own start, longer than any run: its stamps are wrong")]
    LogSpan { seconds: u64 },
}

impl VmTarget {
    /// Record a repetition; refused unless every VM ran and did IO.
    pub fn push_repetition(&mut self, jobs: Vec<JobResult>, vms: u32) -> Result<(), VmError> {
        if jobs.len() != vms as usize {
            return Err(VmError::WrongJobCount { got: jobs.len(), want: vms as usize });
        }
        for (index, job) in jobs.iter().enumerate() {
            if job.error_code != 0 {
                return Err(VmError::JobFailed { index, error_code: job.error_code });
            }
            if job.read.ios + job.write.ios == 0 {
                return Err(VmError::NoIo { index });
            }
        }
        self.repetitions.push(jobs);
        Ok(())
    }

    /// The summary figures, means over repetitions (worst tail: worst over all).
    pub fn summary(&self) -> Option<VmSummary> {
        if self.repetitions.is_empty() {
            return None;
        }
        let n = self.repetitions.len() as f64;
        let mut s = VmSummary::default();
        for jobs in &self.repetitions {
            let iops: Vec<f64> = jobs.iter().map(JobResult::iops_total).collect();
            s.iops_total += iops.iter().sum::<f64>() / n;
            s.mb_per_s_total +=
                jobs.iter().map(|j| mb_per_s(j.bandwidth_bytes_per_s_total())).sum::<f64>() / n;
            s.jain_index += jain_index(&iops) / n;
            let (min, max) =
                iops.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            s.min_over_max += if max > 0.0 { min / max } else { 0.0 } / n;
            for job in jobs {
                for p in [&job.read.percentiles, &job.write.percentiles].into_iter().flatten() {
                    if let Some(v) = p.latency_us_p99_9 {
                        s.worst_p99_9_us = s.worst_p99_9_us.max(v);
                    }
                }
            }
        }
        Some(s)
    }
}

/// What vm-images reports per target.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VmSummary {
    pub iops_total: f64,
    pub mb_per_s_total: f64,
    /// Jain's index over per-VM IOPS: 1 is perfectly fair, 1/n is one VM taking everything.
    pub jain_index: f64,
    /// The slowest VM's IOPS over the fastest's.
    pub min_over_max: f64,
    /// The worst p99.9 latency of any VM, either direction, microseconds.
    pub worst_p99_9_us: f64,
}

/// Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 for equal shares.
pub fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if values.is_empty() || squares == 0.0 {
        return 0.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

fn summary_table(report: &VmReport) -> Table {
    let base = report.targets.first().and_then(VmTarget::summary);
    let ratio = |v: f64, b: Option<f64>| match b {
        Some(b) if b > 0.0 => format!("{v:.1} ({:.2}x)", v / b),
        _ => format!("{v:.1}"),
    };
    let rows = report
        .targets
        .iter()
        .filter_map(|t| t.summary().map(|s| (t, s)))
        .map(|(t, s)| {
            vec![
                t.name.clone(),
                ratio(s.iops_total, base.map(|b| b.iops_total)),
                ratio(s.mb_per_s_total, base.map(|b| b.mb_per_s_total)),
                format!("{:.3}", s.jain_index),
                format!("{:.2}", s.min_over_max),
                fixed(Some(s.worst_p99_9_us), 0),
            ]
        })
        .collect();
    Table {
        title: format!(
            "vm-images: {} VMs, {}% reads, QD {} each (ratios to {})",
            report.shape.vms,
            report.shape.read_percent,
            report.shape.queue_depth,
            report.targets.first().map_or("-", |t| t.name.as_str())
        ),
        header: ["Target", "IOPS", "MB/s", "Jain fairness", "min/max VM IOPS", "worst VM p99.9 us"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    }
}

fn per_vm_table(target: &VmTarget) -> Option<Table> {
    let jobs = target.repetitions.last()?;
    let rows = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            vec![
                format!("vm{i}"),
                format!("{:.0}", j.iops_total()),
                fixed(j.worse_percentile_us(|p| p.latency_us_p50), 0),
                fixed(j.worse_percentile_us(|p| p.latency_us_p99), 0),
                fixed(j.worse_percentile_us(|p| p.latency_us_p99_9), 0),
            ]
        })
        .collect();
    Some(Table {
        title: format!(
            "Per VM on {} (last repetition; latency: the worse of read and write)",
            target.name
        ),
        header: ["VM", "IOPS", "p50 us", "p99 us", "p99.9 us"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    })
}

fn per_vm_chart(report: &VmReport) -> BarChart {
    let vms = report.shape.vms as usize;
    BarChart {
        title: "IOPS per VM (last repetition)".to_string(),
        y_label: "IOPS".to_string(),
        categories: (0..vms).map(|i| format!("vm{i}")).collect(),
        series: report
            .targets
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let values = (0..vms)
                    .map(|i| t.repetitions.last().and_then(|r| r.get(i)).map(|j| j.iops_total()))
                    .collect();
                (t.name.clone(), index, values)
            })
            .collect(),
    }
}

/// Per target, its first repetition's timeline: IOPS per bin, all VMs and the slowest VM.
fn timeline_table(report: &VmReport) -> Option<Table> {
    let rows: Vec<Vec<String>> = report
        .targets
        .iter()
        .filter_map(|t| {
            let line = t.timelines.first()?.as_ref()?;
            let mut sorted = line.total_iops.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted.get(sorted.len() / 2).copied();
            let lowest_vm = line.slowest_vm_iops.iter().copied().reduce(f64::min);
            let worst_latency = line.worst_vm_latency_us.iter().copied().reduce(f64::max);
            Some(vec![
                t.name.clone(),
                format!("{} x {} ms", line.total_iops.len(), line.bin_ms),
                fixed(sorted.first().copied(), 0),
                fixed(median, 0),
                fixed(sorted.last().copied(), 0),
                fixed(lowest_vm, 0),
                fixed(worst_latency, 0),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(Table {
        title: "IOPS and latency over time (first repetition, fio's averaged logs)".to_string(),
        header: [
            "Target",
            "bins",
            "all VMs: lowest bin",
            "median bin",
            "highest bin",
            "slowest VM's lowest bin",
            "worst VM's highest mean latency us",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    })
}

/// IOPS over time of the first repetition: one chart for all VMs, one for the slowest.
fn timeline_charts(report: &VmReport) -> Vec<chart::LineChart> {
    let lines = |pick: fn(&VmTimeline) -> &[f64]| {
        report
            .targets
            .iter()
            .enumerate()
            .filter_map(|(index, t)| {
                let line = t.timelines.first()?.as_ref()?;
                Some((t.name.clone(), index, line.bin_ms as f64 / 1000.0, pick(line)))
            })
            .collect::<Vec<_>>()
    };
    let all = lines(|l| &l.total_iops);
    if all.is_empty() {
        return vec![];
    }
    vec![
        chart::binned_timeline_chart("IOPS over time, all VMs".into(), "IOPS", all),
        chart::binned_timeline_chart(
            "IOPS over time, the slowest VM in each bin".into(),
            "IOPS",
            lines(|l| &l.slowest_vm_iops),
        ),
        chart::binned_timeline_chart(
            "Mean latency over time, the worst VM in each bin".into(),
            "us",
            lines(|l| &l.worst_vm_latency_us),
        ),
    ]
}

fn title(report: &VmReport) -> String {
    format!("flashraid lab: vm-images ({} mode), run {}", report.mode, report.run_id)
}

/// The report as Markdown: the summary with ratios, then per-VM tables, then the manifest.
pub fn render_vm_markdown(report: &VmReport) -> String {
    let mut out = format!("# {}\n\n", title(report));
    md_label(&mut out, &report.conformance);
    out.push_str(&md_table(&summary_table(report)));
    if let Some(table) = timeline_table(report) {
        out.push_str(&md_table(&table));
    }
    for target in &report.targets {
        let _ = writeln!(out, "{}: {}\n", target.name, target.description);
        if let Some(table) = per_vm_table(target) {
            out.push_str(&md_table(&table));
        }
    }
    md_manifest(&mut out, &report.manifest);
    out
}

/// The report as one self-contained HTML page.
pub fn render_vm_html(report: &VmReport) -> String {
    let mut out = html_open(&title(report));
    html_label(&mut out, &report.conformance);
    out.push_str(&html_table(&summary_table(report)));
    out.push_str(&chart::bar_chart_svg(&per_vm_chart(report)));
    if let Some(table) = timeline_table(report) {
        out.push_str(&html_table(&table));
    }
    for line_chart in timeline_charts(report) {
        out.push_str(&chart::line_chart_svg(&line_chart));
    }
    for target in &report.targets {
        if let Some(table) = per_vm_table(target) {
            out.push_str(&html_table(&table));
        }
    }
    html_manifest(&mut out, &report.manifest);
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_hog() {
        assert!((jain_index(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[8.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain_index(&[1.0, 3.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 0.0);
    }

    fn log(lines: &[(u64, f64, u8)]) -> Vec<LogSample> {
        lines
            .iter()
            .map(|&(time_ms, value, direction)| LogSample { time_ms, value, direction })
            .collect()
    }

    #[test]
    fn iops_logs_parse_and_bad_lines_are_named() {
        let text = "1000, 418659, 0, 0, 0\n1000, 179292, 1, 0, 0\n\n2003, 446283, 0, 0, 0\n";
        assert_eq!(
            parse_fio_log(text).unwrap(),
            log(&[(1000, 418659.0, 0), (1000, 179292.0, 1), (2003, 446283.0, 0)])
        );
        let err = parse_fio_log("1000, 5, 0, 0, 0\n2000, x, 0, 0, 0\n").unwrap_err();
        assert_eq!(
            err,
            VmError::BadLogLine { line: 2, problem: "the value is not a number".into() }
        );
        assert!(parse_fio_log("1000, 5\n").is_err());
        assert!(parse_fio_log("1000, 5, 7, 0, 0\n").is_err(), "no such direction");
        assert!(parse_fio_log("1000, -5, 0, 0, 0\n").is_err());
    }

    #[test]
    fn a_timeline_sums_directions_and_vms_and_finds_the_slowest_vm() {
        // VM 0 runs three intervals (reads and writes); VM 1 stalls in the second and logs
        // one interval fewer, so the timeline covers the two intervals both logged.
        let vm0 = log(&[
            (1000, 70.0, 0),
            (1000, 30.0, 1),
            (2001, 60.0, 0),
            (2001, 20.0, 1),
            (3000, 9.0, 0),
        ]);
        let vm1 = log(&[(999, 50.0, 0), (2000, 0.0, 0)]);
        let line = vm_timeline(&[vm0, vm1.clone()], 1000).unwrap();
        assert_eq!(line.bin_ms, 1000);
        assert_eq!(line.total_iops, [150.0, 80.0]);
        assert_eq!(line.slowest_vm_iops, [50.0, 0.0]);
        // A VM with no sample in an interval inside the range did no IO there.
        let gap = log(&[(1000, 10.0, 0), (3000, 10.0, 0)]);
        let line =
            vm_timeline(&[gap, log(&[(1000, 5.0, 0), (2000, 5.0, 0), (3000, 5.0, 0)])], 1000)
                .unwrap();
        assert_eq!(line.total_iops, [15.0, 5.0, 15.0]);
        assert_eq!(line.slowest_vm_iops, [5.0, 0.0, 5.0]);
        assert_eq!(vm_timeline(&[], 1000).unwrap_err(), VmError::NoLogs);
        assert_eq!(vm_timeline(&[vm1, vec![]], 1000).unwrap_err(), VmError::EmptyLog { vm: 1 });
    }

    #[test]
    fn a_long_timeline_gets_wider_bins_holding_the_mean_rate() {
        let intervals = VM_TIMELINE_BINS_MAX as u64 * 2 + 1;
        let vm = log(&(1..=intervals).map(|i| (i * 1000, i as f64, 0)).collect::<Vec<_>>());
        let line = vm_timeline(&[vm], 1000).unwrap();
        assert_eq!(line.bin_ms, 4000);
        assert!(line.total_iops.len() <= VM_TIMELINE_BINS_MAX);
        assert_eq!(line.total_iops.len() as u64, intervals.div_ceil(4));
        assert_eq!(line.total_iops[0], (1.0 + 2.0 + 3.0 + 4.0) / 4.0);
        // The last bin holds the one interval left over, at its own rate (not a quarter).
        assert_eq!(*line.total_iops.last().unwrap(), intervals as f64);
        // A timestamp at the end of time is an interval far past the others, not a panic.
        let late = log(&[(1000, 1.0, 0), (u64::MAX, 1.0, 0)]);
        assert_eq!(vm_timeline(&[late, log(&[(1000, 2.0, 0)])], 1000).unwrap().total_iops, [3.0]);
    }

    #[test]
    fn the_worst_vm_latency_per_bin_is_the_highest_mean_in_either_direction() {
        let iops = log(&[(1000, 1.0, 0), (2000, 1.0, 0), (3000, 1.0, 0)]);
        let mut line = vm_timeline(&[iops.clone(), iops], 1000).unwrap();
        let vm0 = log(&[(1000, 5000.0, 0), (1007, 9000.0, 1), (2001, 4000.0, 0)]);
        let vm1 = log(&[(999, 7000.0, 0), (2000, 3000.0, 1), (9000, 1e9, 0)]);
        add_latency(&mut line, &[vm0, vm1], 1000);
        // ns to us; bin 3 had no sample; the sample past the timeline is left out.
        assert_eq!(line.worst_vm_latency_us, [9.0, 4.0, 0.0]);
        // Wide bins take the worst interval inside them.
        let mut wide = VmTimeline {
            bin_ms: 2000,
            total_iops: vec![1.0, 1.0],
            slowest_vm_iops: vec![1.0, 1.0],
            worst_vm_latency_us: vec![],
        };
        add_latency(
            &mut wide,
            &[log(&[(1000, 1000.0, 0), (2000, 8000.0, 0), (3000, 2000.0, 1)])],
            1000,
        );
        assert_eq!(wide.worst_vm_latency_us, [8.0, 2.0]);
    }

    #[test]
    fn the_report_draws_the_timelines_of_targets_that_have_them() {
        let shape =
            match crate::profile::workload_shape(crate::profile::Profile::VmImages, Mode::Quick) {
                Some(crate::profile::WorkloadShape::VmImages(shape)) => shape,
                _ => panic!("vm-images shape"),
            };
        let target = |name: &str, timelines: Vec<Option<VmTimeline>>| VmTarget {
            name: name.into(),
            description: String::new(),
            repetitions: vec![],
            timelines,
        };
        let line = VmTimeline {
            bin_ms: 1000,
            total_iops: vec![10.0, 30.0, 20.0],
            slowest_vm_iops: vec![1.0, 0.0, 2.0],
            worst_vm_latency_us: vec![100.0, 900.0, 300.0],
        };
        let mut report = VmReport {
            run_id: "r".into(),
            mode: Mode::Quick,
            conformance: ConformanceLabel::QuickSmoke { deviations: vec![] },
            shape,
            manifest: BTreeMap::new(),
            targets: vec![
                target("members", vec![Some(line)]),
                target("old", vec![]),
                target("no-logs", vec![None]),
            ],
        };
        let md = render_vm_markdown(&report);
        assert!(md.contains("| members | 3 x 1000 ms | 10 | 20 | 30 | 0 | 900 |"), "{md}");
        assert!(!md.contains("| old | "), "a target without a timeline has no row");
        assert!(!md.contains("| no-logs | 1 x"), "nor one whose logs could not be read");
        let html = render_vm_html(&report);
        assert!(html.contains("IOPS over time, all VMs") && html.contains("the slowest VM"));
        assert!(html.contains("Mean latency over time, the worst VM"));
        // Reports written before timelines existed still read and render.
        report.targets.truncate(1);
        report.targets[0].timelines.clear();
        let mut json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        json["targets"][0].as_object_mut().unwrap().remove("timelines");
        let old: VmReport = serde_json::from_value(json).unwrap();
        assert!(old.targets[0].timelines.is_empty());
        assert!(!render_vm_html(&old).contains("IOPS over time"));
    }
}
