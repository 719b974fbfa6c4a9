//! The `degraded-rebuild` profile: the same load on a healthy array, with a member failed,
//! while the replacement rebuilds, and after (benchmark-method.md §7.3 P7); the rebuild's
//! duration and rate at each load level; and a verdict on the data written before the
//! failure, which must read back intact (a RAID benchmark that loses data has no result).
//!
//! Owns: the load's fio job (a 70/30 4 KiB random mix on the second half of the target, the
//! first half holding the verified data), the verify jobs, [`DegradedReport`] and its
//! renderings. Pure: the runner fails the member, adds the spare, watches the rebuild and
//! hands back fio's results.
//!
//! Limits: one array and one failure per load level; the load is measured in fixed-length
//! fio runs per phase (the rebuilding phase as many runs as the rebuild lasts), not one
//! continuous run with 1-s logs; no charts yet.

use crate::fio::JobResult;
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
    let mut out = String::from("; flashraid-lab: degraded-rebuild load (generated)\n[global]\n");
    out.push_str(&target.global_lines()?);
    out.push_str("thread=1\ngroup_reporting=1\ntime_based=1\nnorandommap=1\nrefill_buffers=1\n");
    let _ = writeln!(out, "runtime={}\nrandseed={randseed}", load.runtime_s);
    let _ = writeln!(out, "percentile_list={}", crate::profile::PERCENTILE_LIST);
    out.push_str("\n[load]\nrw=randrw\nrwmixread=70\nbs=4096\n");
    let _ = writeln!(out, "offset={half}\nsize={rest}");
    let _ = writeln!(out, "numjobs={}\niodepth={}", load.threads, load.queue_depth);
    if let Some(rate) = load.rate_iops_per_thread {
        let _ = writeln!(out, "rate_iops={rate}");
    }
    Ok(out)
}

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
    }
    md_manifest(&mut out, &report.manifest);
    out
}

pub fn render_degraded_html(report: &DegradedReport) -> String {
    let mut out = html_open(&title(report));
    html_label(&mut out, &report.conformance);
    for level in &report.levels {
        out.push_str(&html_table(&level_table(level)));
    }
    html_manifest(&mut out, &report.manifest);
    out.push_str("</body></html>\n");
    out
}
