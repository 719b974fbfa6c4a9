//! Renderer tests over a small synthetic run: two targets, a 2x2 IOPS matrix, five rounds.

use super::*;
use crate::fio::Percentiles;
use crate::profile::{Profile, plan_snia};
use crate::steady::StopRule;

fn direction(iops: f64, block_size_bytes: u64, latency_us: f64) -> DirectionResult {
    let ios = (iops * 1.0) as u64;
    let has_io = ios > 0;
    DirectionResult {
        iops,
        bandwidth_bytes_per_s: iops * block_size_bytes as f64,
        io_bytes: ios * block_size_bytes,
        ios,
        runtime_ms: if has_io { 1000 } else { 0 },
        latency_us_mean: has_io.then_some(latency_us),
        latency_us_max: has_io.then_some(latency_us * 10.0),
        latency_us_min: has_io.then_some(latency_us / 2.0),
        percentiles: has_io.then_some(Percentiles {
            source: LatencySource::Completion,
            latency_us_p50: Some(latency_us),
            latency_us_p90: None,
            latency_us_p99: Some(latency_us * 3.0),
            latency_us_p99_9: Some(latency_us * 5.0),
            latency_us_p99_99: Some(latency_us * 8.0),
        }),
    }
}

/// A job result for `element` with `iops` split by its read percentage.
fn job(element: &Element, iops: f64, latency_us: f64) -> JobResult {
    let read_fraction = f64::from(element.read_percent) / 100.0;
    JobResult {
        name: element.name.clone(),
        group_id: 0,
        error_code: 0,
        usr_cpu_percent: 5.0,
        sys_cpu_percent: 20.0,
        job_runtime_ms: 2000,
        read: direction(iops * read_fraction, element.block_size_bytes, latency_us),
        write: direction(iops * (1.0 - read_fraction), element.block_size_bytes, latency_us * 2.0),
        sync: None,
    }
}

/// Quick snia-iops, cut to the 2x2 corner {100, 0} x {64k, 4k} to keep golden tables small.
fn small_plan() -> ProfilePlan {
    let mut plan = plan_snia(Profile::SniaIops, Preset::Spec11, Mode::Quick).unwrap();
    let keep = ["r100-64k", "r100-4k", "r0-64k", "r0-4k"];
    plan.tests[0].elements.retain(|e| keep.contains(&e.name.as_str()));
    plan
}

/// IOPS of an element in a round: 4k does 10x the 64k rate, writes half the reads, and the
/// array target (`scale`) a fraction of the hardware.
fn iops_of(element: &Element, round: usize, scale: f64) -> f64 {
    let base = if element.block_size_bytes == 4096 { 10000.0 } else { 1000.0 };
    let mix = if element.read_percent == 100 { 1.0 } else { 0.5 };
    // A gentle wobble keeps the window within SNIA's limits but not flat.
    let wobble = [1.0, 1.02, 0.99, 1.01, 1.0][(round - 1) % 5];
    base * mix * scale * wobble
}

fn run_target(name: &str, plan: &ProfilePlan, scale: f64, rounds: usize) -> TargetRun {
    let mut target =
        TargetRun::new(name.to_string(), format!("{name} target"), ArrayState::Healthy, plan);
    let test = &mut target.tests[0];
    for round in 1..=rounds {
        let jobs = test
            .plan
            .elements
            .iter()
            .map(|e| job(e, iops_of(e, round, scale), 100.0 / scale))
            .collect();
        test.push_round(jobs).unwrap();
    }
    target
}

fn small_report() -> RunReport {
    let plan = small_plan();
    let manifest = BTreeMap::from([
        ("fio".to_string(), "fio-3.33".to_string()),
        ("job file r1".to_string(), "[global]\nrw=randrw | x".to_string()),
    ]);
    let mut report = RunReport::new("run-1".to_string(), &plan, manifest);
    report.targets.push(run_target("hardware", &plan, 1.0, 5));
    report.targets.push(run_target("flashraid", &plan, 0.5, 5));
    report
}

/// Tags balance: every opened element is closed, in order (void elements are self-closed).
fn assert_balanced(markup: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = markup;
    while let Some(start) = rest.find('<') {
        let end = start + rest[start..].find('>').expect("unterminated tag");
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') || tag.ends_with('/') {
            continue;
        }
        let name: String =
            tag.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if tag.starts_with('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.as_str()), "closing {name}");
        } else {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn rounds_track_steady_state_and_stop() {
    let plan = small_plan();
    let mut test = TestRun::new(plan.tests[0].clone());
    let round = |r| test_jobs(&plan, r);
    for r in 1..=4 {
        assert_eq!(test.push_round(round(r)), Ok(StopDecision::Continue));
    }
    assert_eq!(
        test.push_round(round(5)),
        Ok(StopDecision::SteadyStateReached { window_first_round: 1, window_last_round: 5 })
    );
    let verdict = &test.steady_state[0];
    assert_eq!(verdict.variable.element, "r0-4k");
    assert_eq!(verdict.values[1], 5100.0);
    assert!(verdict.steady_state.unwrap().ok);
    assert_eq!(test.window(), Some((1, 5)));
    let avg = test.window_average("r0-4k", |j| Some(j.iops_total())).unwrap();
    assert!((avg - 5020.0).abs() < 1e-9, "{avg}");
}

fn test_jobs(plan: &ProfilePlan, round: usize) -> Vec<JobResult> {
    plan.tests[0].elements.iter().map(|e| job(e, iops_of(e, round, 1.0), 100.0)).collect()
}

#[test]
fn bad_rounds_are_refused_and_not_recorded() {
    let plan = small_plan();
    let mut test = TestRun::new(plan.tests[0].clone());
    let mut missing = test_jobs(&plan, 1);
    missing.pop();
    assert!(matches!(test.push_round(missing),
            Err(ReportError::MissingElement { element, .. }) if element == "r0-4k"));
    let mut extra = test_jobs(&plan, 1);
    extra[0].name = "r50-8k".to_string();
    assert!(matches!(test.push_round(extra), Err(ReportError::UnexpectedJob { .. })));
    let mut twice = test_jobs(&plan, 1);
    twice[1] = twice[0].clone();
    assert!(matches!(test.push_round(twice), Err(ReportError::DuplicateJob { .. })));
    let mut failed = test_jobs(&plan, 1);
    failed[2].error_code = 5;
    assert!(matches!(test.push_round(failed), Err(ReportError::JobFailed { error_code: 5, .. })));
    assert!(test.rounds.is_empty() && test.steady_state[0].values.is_empty());
    // Jobs may arrive in any order; they are stored in plan order.
    let mut reversed = test_jobs(&plan, 1);
    reversed.reverse();
    test.push_round(reversed).unwrap();
    let names: Vec<&str> = test.rounds[0].elements.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["r100-64k", "r100-4k", "r0-64k", "r0-4k"]);
}

#[test]
fn latency_tracking_without_io_is_an_error() {
    let plan = plan_snia(Profile::SniaLatency, Preset::Spec, Mode::Quick).unwrap();
    let mut test = TestRun::new(plan.tests[0].clone());
    let jobs = test.plan.elements.iter().map(|e| job(e, 0.0, 50.0)).collect();
    assert!(matches!(test.push_round(jobs), Err(ReportError::NoTrackingValue { .. })));
}

#[test]
fn csv_has_the_schema_and_one_row_per_element_per_round() {
    let report = small_report();
    let csv = render_csv(&report);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_COLUMNS.join(","));
    assert_eq!(lines.len(), 1 + 2 * 5 * 4);
    for line in &lines {
        assert_eq!(line.split(',').count(), CSV_COLUMNS.len(), "{line}");
    }
    // Round 2 of r0-4k on the hardware: 5100 write IOPS, no reads, so empty read latency.
    let row = lines[8];
    assert!(
        row.starts_with(
            "run-1,snia-iops,spec-1.1,quick,hardware,healthy,snia-iops,2,1,r0-4k,random,0,4096,2,8,"
        ),
        "{row}"
    );
    assert!(row.contains(",0.000,5100.000,5100.000,0.000,20.890,,,,,,,200.000,2000.000,"), "{row}");
    assert!(row.ends_with(",0,5100,completion,5.000,20.000,1000,0"), "{row}");
    assert_eq!(csv_escape("a,\"b\""), "\"a,\"\"b\"\"\"");
}

#[test]
fn markdown_has_label_matrix_steady_state_and_comparison() {
    let md = render_markdown(&small_report());
    assert!(
        md.starts_with("# flashraid lab: snia-iops (preset spec-1.1, quick mode), run run-1\n\n")
    );
    assert!(
        md.contains("**Conformance: quick-smoke (pipeline check; not a performance statement)**")
    );
    let iops_matrix = "\
#### IOPS (read + write, window average): snia-iops on hardware

| Block size | 100/0 | 0/100 |
|---|---|---|
| 64k | 1004.0 | 502.0 |
| 4k | 10040.0 | 5020.0 |
";
    assert!(md.contains(iops_matrix), "{md}");
    let steady = "| IOPS r0-4k | 1-5 | 5020.00 | 1004.00 | 150.00 | 502.00 | 20.00 \
                  | -5 * R + 5035 | achieved |";
    assert!(md.contains(steady), "{md}");
    let comparison = "\
| Element | hardware | flashraid |
|---|---|---|
| r100-64k | 1004.0 | 502.0 (0.50x) |
";
    assert!(md.contains(comparison), "{md}");
    assert!(md.contains("Ratios from quick-smoke runs check the pipeline"));
    assert!(
        md.contains("| r0-4k | write | 5020 | 200.0 | 200.0 | 600.0 | 1000.0 | 1600.0 | 2000.0 |"),
        "{md}"
    );
    // Multi-line manifest values become code blocks; pipes are escaped in tables.
    assert!(md.contains("### job file r1\n\n```\n[global]\nrw=randrw | x\n```"));
    assert!(md.contains("| fio | fio-3.33 |"));
}

#[test]
fn snia_labels_list_deviations_and_not_achieved() {
    let plan = plan_snia(Profile::SniaIops, Preset::Raidix2018, Mode::Full).unwrap();
    let mut test_plan = small_plan().tests.remove(0);
    test_plan.stop = StopRule::new(5, 5).unwrap();
    let mut target =
        TargetRun::new("flashraid".into(), "array".into(), ArrayState::Degraded, &plan);
    target.tests = vec![TestRun::new(test_plan)];
    let elements = target.tests[0].plan.elements.clone();
    for round in 1..=5 {
        // Rising 10 % a round: never steady.
        let jobs =
            elements.iter().map(|e| job(e, 1000.0 * (1.0 + 0.1 * round as f64), 10.0)).collect();
        let decision = target.tests[0].push_round(jobs).unwrap();
        assert_eq!(decision == StopDecision::Continue, round < 5);
    }
    let mut report = RunReport::new("r2".into(), &plan, BTreeMap::new());
    report.targets.push(target);
    let md = render_markdown(&report);
    let label = "**Conformance: SNIA-derived (preset raidix-2018)**\n\nDeviations:\n\n\
                 - block size 0.5 KiB dropped";
    assert!(md.contains(label), "{md}");
    assert!(md.contains("| SS NOT ACHIEVED |"), "{md}");
    assert!(md.contains("| flashraid | degraded | array |"));
}

#[test]
fn html_is_self_contained_and_well_formed() {
    let html = render_html(&small_report());
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("Conformance: quick-smoke"));
    // One convergence chart, one IOPS-by-block-size chart per mix, latency and throughput bars.
    assert_eq!(html.matches("<svg").count(), 1 + 2 + 2);
    assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    assert_balanced(&html);
    assert!(!html.contains("<script") && !html.contains("href="));
    assert_eq!(
        html.matches("http").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    // Both targets are series with a legend; the window guides are drawn.
    assert!(html.contains(">hardware</text>") && html.contains(">flashraid</text>"));
    assert!(html.contains("least-squares fit") && html.contains("110% / 90% of average"));
    assert!(html.contains("<pre>[global]\nrw=randrw | x</pre>"));
    assert!(!html.contains("NaN") && !html.contains("inf\""));
}

#[test]
fn compare_puts_reports_side_by_side() {
    let old = small_report();
    let mut new = small_report();
    new.run_id = "run-2".to_string();
    new.manifest.insert("fio".to_string(), "fio-3.35".to_string());
    new.targets.remove(0);
    let md = compare_markdown(&[old.clone(), new.clone()], false).unwrap();
    assert!(
        md.contains(
            "| Manifest key | run-1 | run-2 |\n|---|---|---|\n| fio | fio-3.33 | fio-3.35 |\n\n"
        ),
        "{md}"
    );
    assert!(
        md.contains("| Element | run-1/hardware | run-1/flashraid | run-2/flashraid |"),
        "{md}"
    );
    assert!(md.contains("| r0-4k | 5020.0 | 2510.0 (0.50x) | 2510.0 (0.50x) |"), "{md}");
    let html = compare_html(&[old.clone(), new], false).unwrap();
    assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    assert_balanced(&html);
    assert_eq!(compare_markdown(&[], false), Err(ReportError::NoReports));
    let mut other = old.clone();
    other.profile = Profile::SniaLatency;
    assert!(matches!(compare_html(&[old, other], false), Err(ReportError::ProfileMismatch { .. })));
}

/// Runs of one profile but another mode or preset are refused side by side (their elements
/// share names, not loads), unless asked for, and then the comparison says what differs.
/// Checked to fail before the shape check (the two were compared, element by name).
#[test]
fn compare_refuses_runs_of_another_shape() {
    let quick = small_report();
    let full_plan = {
        let mut plan = plan_snia(Profile::SniaIops, Preset::Spec11, Mode::Full).unwrap();
        let keep = ["r100-64k", "r100-4k", "r0-64k", "r0-4k"];
        plan.tests[0].elements.retain(|e| keep.contains(&e.name.as_str()));
        plan
    };
    let mut full = RunReport::new("run-full".to_string(), &full_plan, BTreeMap::new());
    full.targets.push(run_target("flashraid", &full_plan, 0.5, 5));
    let differences = shape_differences(&quick, &full);
    assert!(differences.iter().any(|d| d == "mode quick vs full"), "{differences:?}");
    assert!(
        differences.iter().any(|d| d == "elements of 1 s vs 60 s (snia-iops)"),
        "{differences:?}"
    );
    assert!(
        differences.iter().any(|d| d.starts_with("TC 2 / QD 8 vs") && d.contains("r100-4k")),
        "{differences:?}"
    );
    let refused = compare_markdown(&[quick.clone(), full.clone()], false).unwrap_err();
    assert!(matches!(refused, ReportError::ShapeMismatch { .. }), "{refused}");
    assert!(refused.to_string().contains("mode quick vs full"), "{refused}");
    assert!(compare_html(&[quick.clone(), full.clone()], false).is_err());
    let md = compare_markdown(&[quick.clone(), full.clone()], true).unwrap();
    assert!(md.contains("Runs of different shapes, put side by side on request"), "{md}");
    // Another preset alone differs too (raidix-2018's TC 64 against spec-1.1's TC 4).
    let raidix = plan_snia(Profile::SniaIops, Preset::Raidix2018, Mode::Full).unwrap();
    let spec = plan_snia(Profile::SniaIops, Preset::Spec11, Mode::Full).unwrap();
    let report = |id: &str, plan: &ProfilePlan| {
        let mut r = RunReport::new(id.to_string(), plan, BTreeMap::new());
        r.targets.push(TargetRun::new("t".into(), String::new(), ArrayState::Healthy, plan));
        r
    };
    let (a, b) = (report("a", &spec), report("b", &raidix));
    let differences = shape_differences(&a, &b);
    assert!(differences.iter().any(|d| d.starts_with("preset spec-1.1 vs raidix-2018")));
    assert!(differences.iter().any(|d| d.contains("TC")), "{differences:?}");
    // The same shape, one target fewer, one element fewer (a 512 B element an NBD target
    // leaves out): one group.
    let mut fewer = small_report();
    fewer.targets[0].tests[0].plan.elements.pop();
    assert!(shape_differences(&quick, &fewer).is_empty());
    let groups = group_by_shape(vec![quick.clone(), full, fewer]);
    assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
}

#[test]
fn report_json_round_trips() {
    let report = small_report();
    let text = report.to_json().unwrap();
    assert_eq!(RunReport::from_json(&text).unwrap(), report);
    assert!(
        text.contains("\"profile\": \"snia-iops\"") && text.contains("\"kind\": \"quick-smoke\"")
    );
    assert!(matches!(RunReport::from_json("{"), Err(ReportError::Json(_))));
}
