//! The results model of a lab run and its renderings: long CSV, Markdown and self-contained
//! HTML, plus side-by-side comparison of earlier runs.
//!
//! Owns: [`RunReport`] (serde; the document a runner stores next to the raw fio JSON), the
//! bookkeeping of rounds and steady state per target and test ([`TestRun::push_round`]), and
//! every table and chart derived from it.
//!
//! Invariants:
//! * A round holds exactly one successful fio result per planned element, in plan order;
//!   anything else is refused when the round is pushed, so renderers never guess.
//! * Reported values are averages over the measurement window (the last `window_rounds` rounds,
//!   or all rounds when fewer ran), as SNIA tabulates them; the CSV keeps every round.
//! * Every rendering starts with the conformance label; `quick-smoke` output says it is not a
//!   performance statement, and SNIA labels list their deviations.
//! * Comparisons show each value's ratio to the first column (by convention the "hardware"
//!   baseline: raw members, measured the same way), and only between runs of one shape (mode,
//!   preset, each element's load and length: [`shape_differences`]) unless the caller asks
//!   for more, and then they say what differs.
//!
//! Limits: renderers cover the SNIA profiles' tables (IOPS matrix, MB/s, latency percentiles,
//! steady-state determination) and charts (convergence, IOPS by block size, latency and
//! throughput bars); 3D plots, per-member utilisation and time series are not drawn here.

use crate::chart::{self, BarChart, Guide, LineChart, Series};
use crate::fio::{DirectionResult, JobResult, LatencySource};
use crate::profile::{
    ConformanceLabel, Element, Mode, Pattern, Precondition, Preset, Profile, ProfilePlan, TestPlan,
    TrackingMetric, TrackingVariable, size_label,
};
use crate::steady::{SteadyError, SteadyState, StopDecision, decide_after_round, steady_state};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The state of the array while a target's results were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArrayState {
    Healthy,
    Degraded,
    Rebuilding,
}

impl ArrayState {
    pub fn name(self) -> &'static str {
        match self {
            ArrayState::Healthy => "healthy",
            ArrayState::Degraded => "degraded",
            ArrayState::Rebuilding => "rebuilding",
        }
    }
}

/// One lab run: a profile over one or more targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub run_id: String,
    pub profile: Profile,
    pub preset: Preset,
    pub mode: Mode,
    pub conformance: ConformanceLabel,
    /// Free-form facts the runner records: tool versions, machine, target descriptions, array
    /// settings, purge and WIPC, fio job files as run (multi-line values are fine).
    pub manifest: BTreeMap<String, String>,
    /// In column order; the first is the baseline of every ratio.
    pub targets: Vec<TargetRun>,
}

impl RunReport {
    pub fn new(run_id: String, plan: &ProfilePlan, manifest: BTreeMap<String, String>) -> Self {
        RunReport {
            run_id,
            profile: plan.profile,
            preset: plan.preset,
            mode: plan.mode,
            conformance: plan.conformance.clone(),
            manifest,
            targets: Vec::new(),
        }
    }

    pub fn to_json(&self) -> Result<String, ReportError> {
        serde_json::to_string_pretty(self).map_err(|e| ReportError::Json(e.to_string()))
    }

    pub fn from_json(text: &str) -> Result<RunReport, ReportError> {
        serde_json::from_str(text).map_err(|e| ReportError::Json(e.to_string()))
    }
}

/// The results of one target (the array, its raw members, a comparator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetRun {
    /// Short column name, e.g. `hardware` or `flashraid`.
    pub name: String,
    pub description: String,
    pub state: ArrayState,
    pub tests: Vec<TestRun>,
}

impl TargetRun {
    /// A target with an empty run of every test of `plan`.
    pub fn new(name: String, description: String, state: ArrayState, plan: &ProfilePlan) -> Self {
        let tests = plan.tests.iter().cloned().map(TestRun::new).collect();
        TargetRun { name, description, state, tests }
    }

    pub fn test(&self, name: &str) -> Option<&TestRun> {
        self.tests.iter().find(|t| t.plan.name == name)
    }

    pub fn test_mut(&mut self, name: &str) -> Option<&mut TestRun> {
        self.tests.iter_mut().find(|t| t.plan.name == name)
    }
}

/// The rounds of one test on one target, with the steady-state determination so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRun {
    pub plan: TestPlan,
    pub rounds: Vec<RoundResult>,
    /// One per tracking variable of the plan, updated by every round.
    pub steady_state: Vec<TrackingVerdict>,
}

/// One round: the fio result of every element, in plan order. `round` counts from 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundResult {
    pub round: usize,
    pub elements: Vec<JobResult>,
    /// CPU seconds (user + system) the target's server process used during the round, when
    /// the lab runs that server (the flashraid target): the cost per IO of the array itself,
    /// which fio's own CPU figures do not show.
    #[serde(default)]
    pub server_cpu_seconds: Option<f64>,
}

/// A tracking variable's per-round values and its latest steady-state evaluation (`None` until
/// a full window of rounds exists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackingVerdict {
    pub variable: TrackingVariable,
    pub values: Vec<f64>,
    pub steady_state: Option<SteadyState>,
}

/// Errors in feeding results or rendering reports.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    #[error("test {test}: element {element} has no fio result in this round")]
    MissingElement { test: String, element: String },
    #[error("test {test}: fio reported job {job:?}, which is not an element of the plan")]
    UnexpectedJob { test: String, job: String },
    #[error("test {test}: fio reported job {job:?} twice (is group_reporting off?)")]
    DuplicateJob { test: String, job: String },
    #[error("test {test}: element {element} failed with fio error {error_code}")]
    JobFailed { test: String, element: String, error_code: i64 },
    #[error("test {test}: element {element} has no value for its tracking variable (no IO?)")]
    NoTrackingValue { test: String, element: String },
    #[error("steady state: {0}")]
    Steady(#[from] SteadyError),
    #[error("nothing to compare: no reports")]
    NoReports,
    #[error("cannot compare profile {first} with profile {other}")]
    ProfileMismatch { first: Profile, other: Profile },
    #[error(
        "run {other} has another shape than run {first} ({}): their elements measured \
         different things",
        differences.join("; ")
    )]
    ShapeMismatch { first: String, other: String, differences: Vec<String> },
    #[error("report JSON: {0}")]
    Json(String),
}

impl TestRun {
    pub fn new(plan: TestPlan) -> TestRun {
        let steady_state = plan
            .tracking
            .iter()
            .map(|v| TrackingVerdict {
                variable: v.clone(),
                values: Vec::new(),
                steady_state: None,
            })
            .collect();
        TestRun { plan, rounds: Vec::new(), steady_state }
    }

    /// Record the next round from fio's jobs (any order) and say whether to run another.
    /// Nothing is recorded when the round is refused.
    pub fn push_round(&mut self, jobs: Vec<JobResult>) -> Result<StopDecision, ReportError> {
        let elements = self.order_jobs(jobs)?;
        let mut tracked = Vec::with_capacity(self.steady_state.len());
        for verdict in &self.steady_state {
            let index = self.element_index(&verdict.variable.element).ok_or_else(|| {
                ReportError::MissingElement {
                    test: self.plan.name.clone(),
                    element: verdict.variable.element.clone(),
                }
            })?;
            let value =
                tracking_value(verdict.variable.metric, &elements[index]).ok_or_else(|| {
                    ReportError::NoTrackingValue {
                        test: self.plan.name.clone(),
                        element: verdict.variable.element.clone(),
                    }
                })?;
            tracked.push(value);
        }
        self.rounds.push(RoundResult {
            round: self.rounds.len() + 1,
            elements,
            server_cpu_seconds: None,
        });
        let window_rounds = self.plan.stop.window_rounds;
        for (verdict, value) in self.steady_state.iter_mut().zip(tracked) {
            verdict.values.push(value);
            verdict.steady_state = steady_state(&verdict.values, window_rounds);
        }
        self.decision()
    }

    /// The stop decision after the rounds recorded so far.
    pub fn decision(&self) -> Result<StopDecision, ReportError> {
        let series: Vec<&[f64]> = self.steady_state.iter().map(|v| v.values.as_slice()).collect();
        Ok(decide_after_round(&series, self.plan.stop)?)
    }

    /// The measurement window as (first, last) round: the last `window_rounds` rounds, or all
    /// rounds when fewer ran. `None` before the first round.
    pub fn window(&self) -> Option<(usize, usize)> {
        let last = self.rounds.len();
        (last > 0).then(|| ((last + 1).saturating_sub(self.plan.stop.window_rounds).max(1), last))
    }

    /// Average of `value` over the window's rounds for one element; rounds where `value` is
    /// `None` (e.g. latency of a direction without IO) are left out.
    pub fn window_average(
        &self,
        element: &str,
        value: impl Fn(&JobResult) -> Option<f64>,
    ) -> Option<f64> {
        let index = self.element_index(element)?;
        let (first, last) = self.window()?;
        let values: Vec<f64> =
            self.rounds[first - 1..last].iter().filter_map(|r| value(&r.elements[index])).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// Largest `value` over the window's rounds for one element (a worst case stays one).
    pub fn window_max(
        &self,
        element: &str,
        value: impl Fn(&JobResult) -> Option<f64>,
    ) -> Option<f64> {
        let index = self.element_index(element)?;
        let (first, last) = self.window()?;
        self.rounds[first - 1..last]
            .iter()
            .filter_map(|r| value(&r.elements[index]))
            .fold(None, |max: Option<f64>, v| Some(max.map_or(v, |m| m.max(v))))
    }

    fn element_index(&self, name: &str) -> Option<usize> {
        self.plan.elements.iter().position(|e| e.name == name)
    }

    fn order_jobs(&self, jobs: Vec<JobResult>) -> Result<Vec<JobResult>, ReportError> {
        let test = || self.plan.name.clone();
        let mut slots: Vec<Option<JobResult>> = vec![None; self.plan.elements.len()];
        for job in jobs {
            let Some(index) = self.element_index(&job.name) else {
                return Err(ReportError::UnexpectedJob { test: test(), job: job.name });
            };
            if job.error_code != 0 {
                let (element, error_code) = (job.name, job.error_code);
                return Err(ReportError::JobFailed { test: test(), element, error_code });
            }
            if slots[index].is_some() {
                return Err(ReportError::DuplicateJob { test: test(), job: job.name });
            }
            slots[index] = Some(job);
        }
        slots
            .into_iter()
            .zip(&self.plan.elements)
            .map(|(slot, element)| {
                slot.ok_or_else(|| ReportError::MissingElement {
                    test: test(),
                    element: element.name.clone(),
                })
            })
            .collect()
    }
}

/// The value of `metric` for one element's result.
pub fn tracking_value(metric: TrackingMetric, job: &JobResult) -> Option<f64> {
    match metric {
        TrackingMetric::IopsTotal => Some(job.iops_total()),
        TrackingMetric::LatencyUsMean => job.latency_us_mean(),
        TrackingMetric::WriteMegabytesPerS => Some(mb_per_s(job.write.bandwidth_bytes_per_s)),
    }
}

/// Decimal megabytes per second (SNIA and KDiskMark convention: MB = 10^6 bytes).
pub(crate) fn mb_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / 1e6
}

// ---------------------------------------------------------------------------------------------
// CSV

/// The long CSV's columns (benchmark-method.md §7.2 "Results schema"): one row per element per
/// round. Latency columns are total latency; percentile_source says whose percentiles they are.
pub const CSV_COLUMNS: [&str; 39] = [
    "run_id",
    "profile",
    "preset",
    "mode",
    "target",
    "state",
    "test",
    "round",
    "in_window",
    "element",
    "pattern",
    "read_percent",
    "block_size_bytes",
    "threads",
    "queue_depth",
    "iops_read",
    "iops_write",
    "iops_total",
    "throughput_mb_per_s_read",
    "throughput_mb_per_s_write",
    "latency_us_mean_read",
    "latency_us_max_read",
    "latency_us_p50_read",
    "latency_us_p99_read",
    "latency_us_p99_9_read",
    "latency_us_p99_99_read",
    "latency_us_mean_write",
    "latency_us_max_write",
    "latency_us_p50_write",
    "latency_us_p99_write",
    "latency_us_p99_9_write",
    "latency_us_p99_99_write",
    "ios_read",
    "ios_write",
    "percentile_source",
    "cpu_usr_percent",
    "cpu_sys_percent",
    "runtime_ms",
    "job_error",
];

/// Render the long CSV of a report.
pub fn render_csv(report: &RunReport) -> String {
    let mut out = String::new();
    out.push_str(&CSV_COLUMNS.join(","));
    out.push('\n');
    for target in &report.targets {
        for test in &target.tests {
            let window = test.window();
            for round in &test.rounds {
                let in_window = window.is_some_and(|(f, l)| (f..=l).contains(&round.round));
                for (element, job) in test.plan.elements.iter().zip(&round.elements) {
                    let mut row: Vec<String> = vec![
                        report.run_id.clone(),
                        report.profile.name().to_string(),
                        report.preset.name().to_string(),
                        report.mode.name().to_string(),
                        target.name.clone(),
                        target.state.name().to_string(),
                        test.plan.name.clone(),
                        round.round.to_string(),
                        u8::from(in_window).to_string(),
                    ];
                    row.extend(csv_element_fields(element, job));
                    let cells: Vec<String> = row.iter().map(|c| csv_escape(c)).collect();
                    out.push_str(&cells.join(","));
                    out.push('\n');
                }
            }
        }
    }
    out
}

fn csv_element_fields(element: &Element, job: &JobResult) -> Vec<String> {
    let num =
        |v: Option<f64>| v.filter(|v| v.is_finite()).map(|v| format!("{v:.3}")).unwrap_or_default();
    let mut fields = vec![
        element.name.clone(),
        match element.pattern {
            Pattern::Random => "random".to_string(),
            Pattern::Sequential => "sequential".to_string(),
        },
        element.read_percent.to_string(),
        element.block_size_bytes.to_string(),
        element.threads.to_string(),
        element.queue_depth.to_string(),
        num(Some(job.read.iops)),
        num(Some(job.write.iops)),
        num(Some(job.iops_total())),
        num(Some(mb_per_s(job.read.bandwidth_bytes_per_s))),
        num(Some(mb_per_s(job.write.bandwidth_bytes_per_s))),
    ];
    for direction in [&job.read, &job.write] {
        let p = direction.percentiles.as_ref();
        fields.extend([
            num(direction.latency_us_mean),
            num(direction.latency_us_max),
            num(p.and_then(|p| p.latency_us_p50)),
            num(p.and_then(|p| p.latency_us_p99)),
            num(p.and_then(|p| p.latency_us_p99_9)),
            num(p.and_then(|p| p.latency_us_p99_99)),
        ]);
    }
    let source = job.read.percentiles.as_ref().or(job.write.percentiles.as_ref()).map(|p| p.source);
    fields.extend([
        job.read.ios.to_string(),
        job.write.ios.to_string(),
        match source {
            Some(LatencySource::Total) => "total".to_string(),
            Some(LatencySource::Completion) => "completion".to_string(),
            None => String::new(),
        },
        num(Some(job.usr_cpu_percent)),
        num(Some(job.sys_cpu_percent)),
        job.runtime_ms().to_string(),
        job.error_code.to_string(),
    ]);
    fields
}

fn csv_escape(cell: &str) -> String {
    if cell.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", cell.replace('"', "\"\""))
    } else {
        cell.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Tables, shared by Markdown and HTML

/// A rendered-agnostic table: the same data becomes Markdown or HTML.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Table {
    pub(crate) title: String,
    pub(crate) header: Vec<String>,
    pub(crate) rows: Vec<Vec<String>>,
}

const MISSING: &str = "n/a";

pub(crate) fn fixed(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => MISSING.to_string(),
    }
}

fn mix_label(read_percent: u8) -> String {
    format!("{read_percent}/{}", 100 - read_percent)
}

/// Steady-state determination of every tracking variable of one test on one target.
fn steady_table(target: &TargetRun, test: &TestRun) -> Table {
    let header = [
        "Tracking variable",
        "Window rounds",
        "Average",
        "Allowed data excursion",
        "Measured data excursion",
        "Allowed slope excursion",
        "Measured slope excursion",
        "Least-squares fit",
        "Steady state",
    ];
    let decision = test.decision().ok();
    let rows = test
        .steady_state
        .iter()
        .map(|verdict| {
            let mut row = vec![verdict.variable.label()];
            match &verdict.steady_state {
                Some(s) => row.extend([
                    format!("{}-{}", s.window_first_round, s.window_last_round),
                    fixed(Some(s.average), 2),
                    fixed(Some(s.allowed_data_excursion), 2),
                    fixed(Some(s.data_excursion), 2),
                    fixed(Some(s.allowed_slope_excursion), 2),
                    fixed(Some(s.slope_excursion), 2),
                    s.fit_formula(),
                    verdict_text(s.ok, decision),
                ]),
                None => {
                    row.push(format!(
                        "{} of {} rounds",
                        verdict.values.len(),
                        test.plan.stop.window_rounds
                    ));
                    row.extend(std::iter::repeat_n(MISSING.to_string(), 6));
                    row.push("not evaluated (too few rounds)".to_string());
                }
            }
            row
        })
        .collect();
    Table {
        title: format!("Steady state determination: {} on {}", test.plan.name, target.name),
        header: header.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

fn verdict_text(ok: bool, decision: Option<StopDecision>) -> String {
    match (ok, decision) {
        (true, _) => "achieved".to_string(),
        (false, Some(StopDecision::NotAchieved { .. })) => "SS NOT ACHIEVED".to_string(),
        (false, _) => "not yet".to_string(),
    }
}

/// Block sizes and mixes of a test's random elements, in plan order.
fn matrix_axes(plan: &TestPlan) -> (Vec<u64>, Vec<u8>) {
    let mut block_sizes = Vec::new();
    let mut mixes = Vec::new();
    for e in plan.elements.iter().filter(|e| e.pattern == Pattern::Random) {
        if !block_sizes.contains(&e.block_size_bytes) {
            block_sizes.push(e.block_size_bytes);
        }
        if !mixes.contains(&e.read_percent) {
            mixes.push(e.read_percent);
        }
    }
    (block_sizes, mixes)
}

fn random_element(plan: &TestPlan, read_percent: u8, block_size_bytes: u64) -> Option<&Element> {
    plan.elements.iter().find(|e| {
        e.pattern == Pattern::Random
            && e.read_percent == read_percent
            && e.block_size_bytes == block_size_bytes
    })
}

/// Rows block size, columns R/W mix: the SNIA tabular layout.
fn matrix_table(
    title: String,
    test: &TestRun,
    decimals: usize,
    value: impl Fn(&JobResult) -> Option<f64>,
) -> Option<Table> {
    let (block_sizes, mixes) = matrix_axes(&test.plan);
    if block_sizes.is_empty() {
        return None;
    }
    let mut header = vec!["Block size".to_string()];
    header.extend(mixes.iter().map(|&m| mix_label(m)));
    let rows = block_sizes
        .iter()
        .map(|&bs| {
            let mut row = vec![size_label(bs)];
            row.extend(mixes.iter().map(|&mix| match random_element(&test.plan, mix, bs) {
                Some(e) => fixed(test.window_average(&e.name, &value), decimals),
                None => String::new(),
            }));
            row
        })
        .collect();
    Some(Table { title, header, rows })
}

/// Picks one direction out of a job result.
type PickDirection = fn(&JobResult) -> &DirectionResult;
const DIRECTIONS: [(&str, PickDirection); 2] = [("read", |j| &j.read), ("write", |j| &j.write)];

fn latency_table(target: &TargetRun, test: &TestRun) -> Table {
    let header = ["Element", "Dir", "IOs per round", "Avg", "p50", "p99", "p99.9", "p99.99", "Max"];
    let mut rows = Vec::new();
    for element in &test.plan.elements {
        for (dir, pick) in DIRECTIONS {
            let ios = test.window_average(&element.name, |j| Some(pick(j).ios as f64));
            if ios.is_none_or(|n| n == 0.0) {
                continue;
            }
            let pct = |f: fn(&crate::fio::Percentiles) -> Option<f64>| {
                let v = test
                    .window_average(&element.name, |j| pick(j).percentiles.as_ref().and_then(f));
                fixed(v, 1)
            };
            rows.push(vec![
                element.name.clone(),
                dir.to_string(),
                fixed(ios, 0),
                fixed(test.window_average(&element.name, |j| pick(j).latency_us_mean), 1),
                pct(|p| p.latency_us_p50),
                pct(|p| p.latency_us_p99),
                pct(|p| p.latency_us_p99_9),
                pct(|p| p.latency_us_p99_99),
                fixed(test.window_max(&element.name, |j| pick(j).latency_us_max), 1),
            ]);
        }
    }
    let source = percentile_source_note(test);
    Table {
        title: format!(
            "Latency (us; avg: window average; percentiles: mean of the window's per-round \
             percentiles; max: the window's maximum; {source}): {} on {}",
            test.plan.name, target.name
        ),
        header: header.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

fn percentile_source_note(test: &TestRun) -> &'static str {
    let source = test.rounds.iter().flat_map(|r| &r.elements).find_map(|j| {
        j.read.percentiles.as_ref().or(j.write.percentiles.as_ref()).map(|p| p.source)
    });
    match source {
        Some(LatencySource::Total) => "avg/max and percentiles of total latency",
        Some(LatencySource::Completion) => {
            "avg/max total latency, percentiles of completion latency"
        }
        None => "total latency",
    }
}

fn throughput_table(target: &TargetRun, test: &TestRun) -> Table {
    // fio's own CPU (the load generator's, e.g. libnbd's for NBD targets), mean per thread.
    let header =
        ["Element", "Read MB/s", "Write MB/s", "Total MB/s", "fio usr CPU %", "fio sys CPU %"];
    let rows = test
        .plan
        .elements
        .iter()
        .map(|e| {
            let avg = |f: fn(&JobResult) -> f64| test.window_average(&e.name, |j| Some(f(j)));
            vec![
                e.name.clone(),
                fixed(avg(|j| mb_per_s(j.read.bandwidth_bytes_per_s)), 2),
                fixed(avg(|j| mb_per_s(j.write.bandwidth_bytes_per_s)), 2),
                fixed(avg(|j| mb_per_s(j.bandwidth_bytes_per_s_total())), 2),
                fixed(avg(|j| j.usr_cpu_percent), 1),
                fixed(avg(|j| j.sys_cpu_percent), 1),
            ]
        })
        .collect();
    Table {
        title: format!(
            "Throughput (MB/s = 10^6 B/s, window average): {} on {}",
            test.plan.name, target.name
        ),
        header: header.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The headline value of a test's elements for comparisons: what the test is about.
fn headline(metric: TrackingMetric) -> (&'static str, fn(&JobResult) -> Option<f64>) {
    match metric {
        TrackingMetric::IopsTotal => ("IOPS", |j| Some(j.iops_total())),
        TrackingMetric::LatencyUsMean => ("mean latency us", |j| j.latency_us_mean()),
        TrackingMetric::WriteMegabytesPerS => {
            ("MB/s", |j| Some(mb_per_s(j.bandwidth_bytes_per_s_total())))
        }
    }
}

fn headline_of(plan: &TestPlan) -> (&'static str, fn(&JobResult) -> Option<f64>) {
    headline(plan.tracking.first().map_or(TrackingMetric::IopsTotal, |v| v.metric))
}

/// A column of a comparison: one target of one report.
struct Column<'a> {
    label: String,
    target: &'a TargetRun,
}

fn ratio_cell(value: Option<f64>, baseline: Option<f64>, first: bool) -> String {
    match (value, baseline) {
        (Some(v), _) if first => fixed(Some(v), 1),
        (Some(v), Some(b)) if b != 0.0 && v.is_finite() => format!("{v:.1} ({:.2}x)", v / b),
        (Some(v), _) => fixed(Some(v), 1),
        (None, _) => MISSING.to_string(),
    }
}

/// Element-by-element headline values across columns, with ratios to the first column.
fn comparison_table(test_name: &str, plan: &TestPlan, columns: &[Column<'_>]) -> Table {
    let (metric_name, value) = headline_of(plan);
    let mut header = vec!["Element".to_string()];
    header.extend(columns.iter().map(|c| c.label.clone()));
    let rows = plan
        .elements
        .iter()
        .map(|e| {
            let values: Vec<Option<f64>> = columns
                .iter()
                .map(|c| c.target.test(test_name).and_then(|t| t.window_average(&e.name, value)))
                .collect();
            let mut row = vec![e.name.clone()];
            row.extend(values.iter().enumerate().map(|(i, v)| ratio_cell(*v, values[0], i == 0)));
            row
        })
        .collect();
    let baseline = columns.first().map_or("", |c| c.label.as_str());
    Table {
        title: format!("Comparison: {test_name}, {metric_name} (ratio to {baseline})"),
        header,
        rows,
    }
}

/// Every table of one test on one target, in report order.
fn test_tables(target: &TargetRun, test: &TestRun) -> Vec<Table> {
    let mut tables = vec![steady_table(target, test)];
    let name = &test.plan.name;
    let iops = matrix_table(
        format!("IOPS (read + write, window average): {name} on {}", target.name),
        test,
        1,
        |j| Some(j.iops_total()),
    );
    let mbps =
        matrix_table(format!("MB/s (window average): {name} on {}", target.name), test, 2, |j| {
            Some(mb_per_s(j.bandwidth_bytes_per_s_total()))
        });
    tables.extend(iops);
    tables.extend(mbps);
    if test.plan.elements.iter().any(|e| e.pattern == Pattern::Sequential) {
        tables.push(throughput_table(target, test));
    }
    tables.push(latency_table(target, test));
    tables.extend(server_cpu_table(target, test));
    tables
}

/// The server's CPU per IO over the window: its CPU seconds over the IOs of all elements.
fn server_cpu_table(target: &TargetRun, test: &TestRun) -> Option<Table> {
    let (first, last) = test.window()?;
    let rounds = &test.rounds[first - 1..last];
    let cpu_seconds: f64 = rounds.iter().map(|r| r.server_cpu_seconds).sum::<Option<f64>>()?;
    let ios: u64 = rounds.iter().flat_map(|r| &r.elements).map(|j| j.read.ios + j.write.ios).sum();
    if ios == 0 {
        return None;
    }
    Some(Table {
        title: format!(
            "Server CPU (rounds {first}-{last}, all elements; user + system of the server \
             process): {} on {}",
            test.plan.name, target.name
        ),
        header: ["CPU seconds", "IOs", "CPU us per IO"].iter().map(|h| h.to_string()).collect(),
        rows: vec![vec![
            format!("{cpu_seconds:.2}"),
            ios.to_string(),
            format!("{:.2}", cpu_seconds * 1e6 / ios as f64),
        ]],
    })
}

fn report_columns(report: &RunReport) -> Vec<Column<'_>> {
    report.targets.iter().map(|t| Column { label: t.name.clone(), target: t }).collect()
}

/// Test plans in first-seen order across columns.
fn column_tests<'a>(columns: &[Column<'a>]) -> Vec<&'a TestPlan> {
    let mut plans: Vec<&TestPlan> = Vec::new();
    for column in columns {
        for test in &column.target.tests {
            if !plans.iter().any(|p| p.name == test.plan.name) {
                plans.push(&test.plan);
            }
        }
    }
    plans
}

// ---------------------------------------------------------------------------------------------
// Markdown

fn md_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

pub(crate) fn md_table(table: &Table) -> String {
    let mut out = format!("#### {}\n\n", md_cell(&table.title));
    let header: Vec<String> = table.header.iter().map(|h| md_cell(h)).collect();
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for row in &table.rows {
        let cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push('\n');
    out
}

pub(crate) fn md_label(out: &mut String, label: &ConformanceLabel) {
    let _ = writeln!(out, "**Conformance: {}**\n", label.title());
    if !label.deviations().is_empty() {
        out.push_str("Deviations:\n\n");
        for d in label.deviations() {
            let _ = writeln!(out, "- {}", md_cell(d));
        }
        out.push('\n');
    }
}

pub(crate) fn md_manifest(out: &mut String, manifest: &BTreeMap<String, String>) {
    out.push_str("## Manifest\n\n");
    let (multi, single): (Vec<_>, Vec<_>) = manifest.iter().partition(|(_, v)| v.contains('\n'));
    if !single.is_empty() {
        out.push_str("| Key | Value |\n|---|---|\n");
        for (k, v) in single {
            let _ = writeln!(out, "| {} | {} |", md_cell(k), md_cell(v));
        }
        out.push('\n');
    }
    for (k, v) in multi {
        // Job files and the like stay verbatim; a longer fence than any run of backticks inside.
        let fence = "`".repeat(3.max(longest_backtick_run(v) + 1));
        let _ = writeln!(out, "### {}\n\n{fence}\n{}\n{fence}\n", md_cell(k), v.trim_end());
    }
}

fn longest_backtick_run(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// Render a report as Markdown.
pub fn render_markdown(report: &RunReport) -> String {
    let mut out = format!(
        "# flashraid lab: {} (preset {}, {} mode), run {}\n\n",
        report.profile,
        report.preset,
        report.mode,
        md_cell(&report.run_id)
    );
    md_label(&mut out, &report.conformance);
    out.push_str("## Targets\n\n| Target | State | Description |\n|---|---|---|\n");
    for t in &report.targets {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            md_cell(&t.name),
            t.state.name(),
            md_cell(&t.description)
        );
    }
    out.push('\n');
    let columns = report_columns(report);
    for plan in column_tests(&columns) {
        let _ = writeln!(out, "## Test {}\n", plan.name);
        for target in &report.targets {
            if let Some(test) = target.test(&plan.name) {
                for table in test_tables(target, test) {
                    out.push_str(&md_table(&table));
                }
            }
        }
        if columns.len() > 1 {
            out.push_str(&comparison_note(&report.conformance));
            out.push_str(&md_table(&comparison_table(&plan.name, plan, &columns)));
        }
    }
    // Last: what shapes the results (long job files would push the results out of view).
    md_manifest(&mut out, &report.manifest);
    out
}

fn comparison_note(label: &ConformanceLabel) -> String {
    match label {
        ConformanceLabel::QuickSmoke { .. } => {
            "Ratios from quick-smoke runs check the pipeline; they are not performance results.\n\n"
                .to_string()
        }
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// HTML

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1100px}\
table{border-collapse:collapse;margin:0.5em 0 1.5em}\
th,td{border:1px solid #bbb;padding:2px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}\
caption{font-weight:bold;text-align:left;padding:4px 0}\
.label{font-size:1.2em;font-weight:bold;padding:6px;border:2px solid #333;display:inline-block}\
pre{background:#f4f4f4;padding:6px;overflow:auto}";

fn html_escape(text: &str) -> String {
    chart::xml_escape(text)
}

pub(crate) fn html_table(table: &Table) -> String {
    let mut out = format!("<table><caption>{}</caption><tr>", html_escape(&table.title));
    for h in &table.header {
        let _ = write!(out, "<th>{}</th>", html_escape(h));
    }
    out.push_str("</tr>");
    for row in &table.rows {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{}</td>", html_escape(c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>\n");
    out
}

pub(crate) fn html_open(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = html_escape(title)
    )
}

pub(crate) fn html_label(out: &mut String, label: &ConformanceLabel) {
    let _ = writeln!(out, "<p class=\"label\">Conformance: {}</p>", html_escape(&label.title()));
    if !label.deviations().is_empty() {
        out.push_str("<p>Deviations:</p><ul>");
        for d in label.deviations() {
            let _ = write!(out, "<li>{}</li>", html_escape(d));
        }
        out.push_str("</ul>\n");
    }
}

pub(crate) fn html_manifest(out: &mut String, manifest: &BTreeMap<String, String>) {
    out.push_str("<h2>Manifest</h2>\n<table><tr><th>Key</th><th>Value</th></tr>");
    for (k, v) in manifest {
        let value = if v.contains('\n') {
            let lines = v.lines().count();
            format!(
                "<details><summary>{lines} lines</summary><pre>{}</pre></details>",
                html_escape(v)
            )
        } else {
            html_escape(v)
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td style=\"text-align:left\">{value}</td></tr>",
            html_escape(k)
        );
    }
    out.push_str("</table>\n");
}

/// Render a report as one self-contained HTML page with inline SVG charts.
pub fn render_html(report: &RunReport) -> String {
    let title = format!(
        "flashraid lab: {} (preset {}, {} mode), run {}",
        report.profile, report.preset, report.mode, report.run_id
    );
    let mut out = html_open(&title);
    html_label(&mut out, &report.conformance);
    out.push_str(
        "<h2>Targets</h2>\n<table><tr><th>Target</th><th>State</th><th>Description</th></tr>",
    );
    for t in &report.targets {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            html_escape(&t.name),
            t.state.name(),
            html_escape(&t.description)
        );
    }
    out.push_str("</table>\n");
    let columns = report_columns(report);
    for plan in column_tests(&columns) {
        let _ = writeln!(out, "<h2>Test {}</h2>", html_escape(&plan.name));
        out.push_str(&test_charts(plan, &columns));
        for target in &report.targets {
            if let Some(test) = target.test(&plan.name) {
                for table in test_tables(target, test) {
                    out.push_str(&html_table(&table));
                }
            }
        }
        if columns.len() > 1 {
            let _ =
                write!(out, "<p>{}</p>", html_escape(comparison_note(&report.conformance).trim()));
            out.push_str(&html_table(&comparison_table(&plan.name, plan, &columns)));
        }
    }
    // Last: what shapes the results, job files folded (they would push the charts away).
    html_manifest(&mut out, &report.manifest);
    out.push_str("</body></html>\n");
    out
}

/// All charts of one test, each column (target) a series.
fn test_charts(plan: &TestPlan, columns: &[Column<'_>]) -> String {
    let mut out = String::new();
    for variable in &plan.tracking {
        out.push_str(&chart::line_chart_svg(&convergence_chart(plan, variable, columns)));
        out.push('\n');
    }
    let (_, mixes) = matrix_axes(plan);
    for mix in mixes {
        out.push_str(&chart::line_chart_svg(&iops_by_block_size_chart(plan, mix, columns)));
        out.push('\n');
    }
    let latency = element_bar_chart(
        format!("Mean latency per element: {}", plan.name),
        "latency (us)",
        plan,
        columns,
        |j| j.latency_us_mean(),
    );
    let throughput = element_bar_chart(
        format!("Throughput per element: {}", plan.name),
        "MB/s",
        plan,
        columns,
        |j| Some(mb_per_s(j.bandwidth_bytes_per_s_total())),
    );
    for bars in [latency, throughput] {
        out.push_str(&chart::bar_chart_svg(&bars));
        out.push('\n');
    }
    out
}

/// Tracking value per round for each column, with the window average, the 110 %/90 % display
/// band and the least-squares fit over the window.
fn convergence_chart(
    plan: &TestPlan,
    variable: &TrackingVariable,
    columns: &[Column<'_>],
) -> LineChart {
    let mut series = Vec::new();
    let mut guides = Vec::new();
    let mut rounds_max = 0;
    for (index, column) in columns.iter().enumerate() {
        let Some(verdict) = column
            .target
            .test(&plan.name)
            .and_then(|t| t.steady_state.iter().find(|v| v.variable == *variable))
        else {
            continue;
        };
        rounds_max = rounds_max.max(verdict.values.len());
        let points = verdict.values.iter().enumerate().map(|(i, v)| ((i + 1) as f64, *v)).collect();
        series.push(Series { name: column.label.clone(), colour_index: index, points });
        if let Some(s) = &verdict.steady_state {
            let (x0, x1) = (s.window_first_round as f64, s.window_last_round as f64);
            let flat = |kind, y: f64, dash| Guide {
                kind,
                colour_index: index,
                from: (x0, y),
                to: (x1, y),
                dash,
            };
            guides.push(flat("window average", s.average, None));
            guides.push(flat("110% / 90% of average", s.average * 1.1, Some("2,3")));
            guides.push(flat("110% / 90% of average", s.average * 0.9, Some("2,3")));
            guides.push(Guide {
                kind: "least-squares fit",
                colour_index: index,
                from: (x0, s.fit_at(s.window_first_round)),
                to: (x1, s.fit_at(s.window_last_round)),
                dash: Some("8,3,2,3"),
            });
        }
    }
    let x_ticks = (1..=rounds_max).map(|r| (r as f64, r.to_string())).collect();
    LineChart {
        title: format!("Steady state convergence: {} ({})", variable.label(), plan.name),
        x_label: "Round".to_string(),
        y_label: variable.metric.label().to_string(),
        x_ticks,
        log_y: false,
        series,
        guides,
    }
}

/// IOPS against block size for one mix, log scale (SNIA's 2D plot), a series per column.
fn iops_by_block_size_chart(plan: &TestPlan, mix: u8, columns: &[Column<'_>]) -> LineChart {
    let (block_sizes, _) = matrix_axes(plan);
    // Smallest block size on the left, as the 2D plots draw it.
    let ordered: Vec<u64> = {
        let mut v = block_sizes.clone();
        v.sort_unstable();
        v
    };
    let x_ticks = ordered.iter().enumerate().map(|(i, bs)| (i as f64, size_label(*bs))).collect();
    let series = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let points = ordered
                .iter()
                .enumerate()
                .filter_map(|(i, &bs)| {
                    let element = random_element(plan, mix, bs)?;
                    let test = column.target.test(&plan.name)?;
                    Some((i as f64, test.window_average(&element.name, |j| Some(j.iops_total()))?))
                })
                .collect();
            Series { name: column.label.clone(), colour_index: index, points }
        })
        .collect();
    LineChart {
        title: format!("IOPS by block size, R/W mix {} ({})", mix_label(mix), plan.name),
        x_label: "Block size".to_string(),
        y_label: "IOPS (log)".to_string(),
        x_ticks,
        log_y: true,
        series,
        guides: Vec::new(),
    }
}

fn element_bar_chart(
    title: String,
    y_label: &str,
    plan: &TestPlan,
    columns: &[Column<'_>],
    value: fn(&JobResult) -> Option<f64>,
) -> BarChart {
    let categories = plan.elements.iter().map(|e| e.name.clone()).collect();
    let series = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let values = plan
                .elements
                .iter()
                .map(|e| {
                    column.target.test(&plan.name).and_then(|t| t.window_average(&e.name, value))
                })
                .collect();
            (column.label.clone(), index, values)
        })
        .collect();
    BarChart { title, y_label: y_label.to_string(), categories, series }
}

// ---------------------------------------------------------------------------------------------
// Comparison of earlier reports

fn compare_columns(
    reports: &[RunReport],
    across_shapes: bool,
) -> Result<Vec<Column<'_>>, ReportError> {
    let first = reports.first().ok_or(ReportError::NoReports)?;
    if let Some(other) = reports.iter().find(|r| r.profile != first.profile) {
        return Err(ReportError::ProfileMismatch { first: first.profile, other: other.profile });
    }
    if !across_shapes {
        // Elements match by name, and the same name runs another load in another mode or
        // preset (r100-4k at TC 2 / QD 8 for 1 s, or TC 4 / QD 32 for 60 s): a ratio
        // between them would read as a speed difference.
        for other in &reports[1..] {
            let differences = shape_differences(first, other);
            if !differences.is_empty() {
                return Err(ReportError::ShapeMismatch {
                    first: first.run_id.clone(),
                    other: other.run_id.clone(),
                    differences,
                });
            }
        }
    }
    Ok(reports
        .iter()
        .flat_map(|r| {
            r.targets
                .iter()
                .map(move |t| Column { label: format!("{}/{}", r.run_id, t.name), target: t })
        })
        .collect())
}

/// What makes two SNIA runs' results measure different things, in words (empty when they
/// measured the same): mode, preset, and over the tests both ran the element run time, stop
/// rule, preconditioning, latency kind and the load of each element both ran (threads, queue
/// depth, block size, mix, pattern), each difference once with the tests or elements it
/// touches. Elements one run has and the other lacks (the 512 B elements a run with an NBD
/// target leaves out) are no difference: they compare as missing.
pub fn shape_differences(a: &RunReport, b: &RunReport) -> Vec<String> {
    let mut differences = vec![];
    if a.profile != b.profile {
        differences.push(format!("profile {} vs {}", a.profile, b.profile));
    }
    if a.mode != b.mode {
        differences.push(format!("mode {} vs {}", a.mode.name(), b.mode.name()));
    }
    if a.preset != b.preset {
        differences.push(format!("preset {} vs {}", a.preset.name(), b.preset.name()));
    }
    // Every target of a run ran the same plan; a run stopped before its first target has none.
    let plans = |r: &RunReport| -> Vec<TestPlan> {
        r.targets
            .first()
            .map(|t| t.tests.iter().map(|t| t.plan.clone()).collect())
            .unwrap_or_default()
    };
    let (plans_a, plans_b) = (plans(a), plans(b));
    // Each difference, with where it was seen (tests or elements), in first-seen order.
    let mut seen: Vec<(String, Vec<String>)> = vec![];
    let mut note = |what: String, whom: &str| match seen.iter_mut().find(|(w, _)| *w == what) {
        Some((_, whom_all)) => whom_all.push(whom.to_string()),
        None => seen.push((what, vec![whom.to_string()])),
    };
    for pa in &plans_a {
        let Some(pb) = plans_b.iter().find(|p| p.name == pa.name) else { continue };
        let test = pa.name.as_str();
        if pa.element_runtime_s != pb.element_runtime_s {
            note(
                format!("elements of {} s vs {} s", pa.element_runtime_s, pb.element_runtime_s),
                test,
            );
        }
        if pa.stop != pb.stop {
            note(
                format!(
                    "at most {} rounds (window {}) vs {} (window {})",
                    pa.stop.rounds_max,
                    pa.stop.window_rounds,
                    pb.stop.rounds_max,
                    pb.stop.window_rounds
                ),
                test,
            );
        }
        if pa.wipc != pb.wipc {
            let wipc = |p: &Precondition| {
                format!("{} x {} at QD {}", p.loops, size_label(p.block_size_bytes), p.queue_depth)
            };
            note(format!("preconditioning {} vs {}", wipc(&pa.wipc), wipc(&pb.wipc)), test);
        }
        if pa.latency_percentiles_total != pb.latency_percentiles_total {
            let kind = |total: bool| if total { "total" } else { "completion" };
            note(
                format!(
                    "percentiles of {} vs {} latency",
                    kind(pa.latency_percentiles_total),
                    kind(pb.latency_percentiles_total)
                ),
                test,
            );
        }
        for ea in &pa.elements {
            let Some(eb) = pb.element(&ea.name) else { continue };
            if (ea.threads, ea.queue_depth) != (eb.threads, eb.queue_depth) {
                note(
                    format!(
                        "TC {} / QD {} vs TC {} / QD {}",
                        ea.threads, ea.queue_depth, eb.threads, eb.queue_depth
                    ),
                    &ea.name,
                );
            }
            if (ea.pattern, ea.block_size_bytes, ea.read_percent)
                != (eb.pattern, eb.block_size_bytes, eb.read_percent)
            {
                note("another block size, mix or pattern under the same name".into(), &ea.name);
            }
        }
    }
    let names = |plans: &[TestPlan]| plans.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    if !plans_a.is_empty() && !plans_b.is_empty() && names(&plans_a) != names(&plans_b) {
        seen.push((
            format!("tests {} vs {}", names(&plans_a).join(", "), names(&plans_b).join(", ")),
            vec![],
        ));
    }
    differences.extend(seen.into_iter().map(|(what, mut whom)| {
        whom.dedup();
        if whom.is_empty() { what } else { format!("{what} ({})", whom.join(", ")) }
    }));
    differences
}

/// Runs of one profile grouped by shape ([`shape_differences`] empty against each group's
/// first run), in first-seen order, so each group compares on its own.
pub fn group_by_shape(reports: Vec<RunReport>) -> Vec<Vec<RunReport>> {
    let mut groups: Vec<Vec<RunReport>> = vec![];
    for report in reports {
        match groups.iter_mut().find(|g| shape_differences(&g[0], &report).is_empty()) {
            Some(group) => group.push(report),
            None => groups.push(vec![report]),
        }
    }
    groups
}

/// The note a comparison across shapes carries: what differs from the first run.
fn shapes_note(reports: &[RunReport]) -> Option<String> {
    let notes: Vec<String> = reports[1..]
        .iter()
        .filter_map(|r| {
            let differences = shape_differences(&reports[0], r);
            (!differences.is_empty()).then(|| {
                format!("{} against {}: {}", r.run_id, reports[0].run_id, differences.join("; "))
            })
        })
        .collect();
    (!notes.is_empty()).then(|| {
        format!(
            "Runs of different shapes, put side by side on request: their elements measured \
             different loads, so a ratio is not a speed difference. {}",
            notes.join(". ")
        )
    })
}

/// Manifest keys whose values differ between reports (settings diffed side by side).
fn manifest_diff(reports: &[RunReport]) -> Table {
    let mut keys: Vec<&String> = reports.iter().flat_map(|r| r.manifest.keys()).collect();
    keys.sort();
    keys.dedup();
    let rows = keys
        .into_iter()
        .filter(|k| {
            let first = reports[0].manifest.get(*k);
            reports.iter().any(|r| r.manifest.get(*k) != first)
        })
        .map(|k| {
            let mut row = vec![k.clone()];
            row.extend(reports.iter().map(|r| {
                r.manifest.get(k).map_or(MISSING.to_string(), |v| v.replace('\n', " / "))
            }));
            row
        })
        .collect();
    let mut header = vec!["Manifest key".to_string()];
    header.extend(reports.iter().map(|r| r.run_id.clone()));
    Table { title: "Settings that differ".to_string(), header, rows }
}

fn runs_table(reports: &[RunReport]) -> Table {
    let rows = reports
        .iter()
        .map(|r| {
            let mut deviations = r.conformance.deviations().join("; ");
            if deviations.is_empty() {
                deviations = "none".to_string();
            }
            vec![
                r.run_id.clone(),
                r.preset.name().to_string(),
                r.mode.name().to_string(),
                r.conformance.title(),
                deviations,
            ]
        })
        .collect();
    let header = ["Run", "Preset", "Mode", "Conformance", "Deviations"];
    Table {
        title: "Runs".to_string(),
        header: header.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// Earlier reports side by side (Markdown): every target of every report is a column, ratios
/// to the first. Reports must share a profile, and a shape unless `across_shapes` (then the
/// comparison says what differs).
pub fn compare_markdown(reports: &[RunReport], across_shapes: bool) -> Result<String, ReportError> {
    let columns = compare_columns(reports, across_shapes)?;
    let mut out = format!("# flashraid lab comparison: {}\n\n", reports[0].profile);
    if reports.iter().any(|r| matches!(r.conformance, ConformanceLabel::QuickSmoke { .. })) {
        out.push_str(&comparison_note(&ConformanceLabel::QuickSmoke { deviations: vec![] }));
    }
    if let Some(note) = shapes_note(reports) {
        out.push_str(&note);
        out.push_str("\n\n");
    }
    out.push_str(&md_table(&runs_table(reports)));
    out.push_str(&md_table(&manifest_diff(reports)));
    for plan in column_tests(&columns) {
        out.push_str(&md_table(&comparison_table(&plan.name, plan, &columns)));
    }
    Ok(out)
}

/// Earlier reports side by side (self-contained HTML with charts); `across_shapes` as for
/// [`compare_markdown`].
pub fn compare_html(reports: &[RunReport], across_shapes: bool) -> Result<String, ReportError> {
    let columns = compare_columns(reports, across_shapes)?;
    let mut out = html_open(&format!("flashraid lab comparison: {}", reports[0].profile));
    if reports.iter().any(|r| matches!(r.conformance, ConformanceLabel::QuickSmoke { .. })) {
        let _ = write!(
            out,
            "<p>{}</p>",
            html_escape(
                comparison_note(&ConformanceLabel::QuickSmoke { deviations: vec![] }).trim()
            )
        );
    }
    if let Some(note) = shapes_note(reports) {
        let _ = write!(out, "<p>{}</p>", html_escape(&note));
    }
    out.push_str(&html_table(&runs_table(reports)));
    out.push_str(&html_table(&manifest_diff(reports)));
    for plan in column_tests(&columns) {
        let _ = writeln!(out, "<h2>Test {}</h2>", html_escape(&plan.name));
        out.push_str(&test_charts(plan, &columns));
        out.push_str(&html_table(&comparison_table(&plan.name, plan, &columns)));
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

#[cfg(test)]
mod tests;
