//! The `vm-images` profile's results: many VMs' mixed random IO on one target, judged by
//! aggregate throughput, per-VM fairness and the worst VM's tail latency (benchmark-method.md
//! §7.3 P4).
//!
//! Owns: [`VmReport`] (serde; what the runner stores), Jain's fairness index, and the
//! Markdown and HTML renderings with a comparison across targets.
//!
//! Invariants: every repetition holds one fio job per VM (fio's `group_reporting=0`), all of
//! the same job name; figures are means over repetitions, except the worst-VM tail, which is
//! the worst over all of them.
//!
//! Limits: no 1-s timelines (fio's logs are kept in the raw folder but not drawn), no noisy-
//! neighbour or fsync variants yet.

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

fn title(report: &VmReport) -> String {
    format!("flashraid lab: vm-images ({} mode), run {}", report.mode, report.run_id)
}

/// The report as Markdown: the summary with ratios, then per-VM tables, then the manifest.
pub fn render_vm_markdown(report: &VmReport) -> String {
    let mut out = format!("# {}\n\n", title(report));
    md_label(&mut out, &report.conformance);
    out.push_str(&md_table(&summary_table(report)));
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
}
