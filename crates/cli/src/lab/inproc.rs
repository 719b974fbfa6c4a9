//! The lab's `flashraid-inproc` target: the array opened inside the lab's own process and
//! driven by flashraid's load generator (`flashraid-bench`'s sessions, one thread per SNIA
//! thread, its queue depth each), so a report can set the engine without a frontend beside
//! the same array through NBD and fio.
//!
//! Owns: turning a SNIA test's preconditioning and elements into load runs, and the load
//! runs' reads and writes into fio-shaped results (`JobResult`), so steady state, tables and
//! charts treat this target like any other.
//!
//! Invariants: the array is created afresh on the purged member files for every test, as for
//! the `flashraid` target; latencies are measured from submission to completion by the
//! generator (total latency, 1 us resolution, 200 ms cap: slower IOs count as 200 ms).
//!
//! Limits: the load is not fio's: the same shapes (block size, mix, random or sequential,
//! threads and queue depth) but another generator, so a ratio to a fio-driven column also
//! includes the generators' difference; elements have no ramp time; preconditioning writes
//! at least twice the capacity but in runs planned from a measured rate, each starting again at
//! offset 0, so the first blocks may be written more often than the last.

use super::{LabRunArgs, create_lab_array, report_round};
use anyhow::{Context, Result};
use flashraid_bench::load::{Pattern as LoadPattern, Split, Tally, run_array_split};
use flashraid_lab::fio::{DirectionResult, JobResult, LatencySource, Percentiles};
use flashraid_lab::profile::{Element, Pattern, TestPlan};
use flashraid_lab::report::{RunReport, TargetRun};
use flashraid_runtime::{Array, OpenOptions};
use std::time::{Duration, Instant};

/// The longest a preconditioning run is planned for (the rate is measured again after it).
const WIPC_RUN_MAX: Duration = Duration::from_secs(600);
/// Preconditioning runs before the lab gives up on a target that writes too slowly.
const WIPC_RUNS_MAX: usize = 64;

/// Create the array afresh and open it in this process, with session buffers for the test's
/// largest queue of its largest blocks.
pub(super) fn open_array(args: &LabRunArgs, test: &TestPlan) -> Result<(Array, String)> {
    let (members, made) = create_lab_array(args)?;
    let mut options = OpenOptions::recommended();
    options.shards = args.shards;
    let queue_bytes = test
        .elements
        .iter()
        .map(|e| e.block_size_bytes * u64::from(e.queue_depth))
        .chain([test.wipc.block_size_bytes * u64::from(test.wipc.queue_depth)])
        .max()
        .unwrap_or(0);
    options.session_buffer_bytes = usize::try_from(queue_bytes * 2)?.max(32 << 20);
    let array = Array::open(&members, &options).context("opening the array in process")?;
    let g = made.geometry;
    let description = format!(
        "flashraid {} x{}, {} KiB chunks, {} usable, over the member files; opened in the \
         lab's process, load from flashraid's own generator (not fio; fio's CPU columns do \
         not apply and read 0; latencies at 1 us resolution, capped at 200 ms)",
        g.level(),
        g.member_count(),
        g.chunk_bytes() >> 10,
        crate::array_cmds::human(g.array_bytes())
    );
    Ok((array, description))
}

fn load_pattern(element: &Element) -> Result<LoadPattern> {
    Ok(LoadPattern {
        block_bytes: u32::try_from(element.block_size_bytes)?,
        read_percent: element.read_percent,
        sequential: element.pattern == Pattern::Sequential,
    })
}

fn direction(tally: &Tally, seconds: f64) -> DirectionResult {
    let h = &tally.histogram;
    let busy = tally.ios > 0;
    DirectionResult {
        iops: tally.ios as f64 / seconds,
        bandwidth_bytes_per_s: tally.bytes as f64 / seconds,
        io_bytes: tally.bytes,
        ios: tally.ios,
        runtime_ms: (seconds * 1000.0) as u64,
        latency_us_mean: h.mean_us(),
        latency_us_max: h.max_us(),
        latency_us_min: None,
        percentiles: busy.then(|| Percentiles {
            source: LatencySource::Total,
            latency_us_p50: Some(h.percentile_us(0.50)),
            latency_us_p90: Some(h.percentile_us(0.90)),
            latency_us_p99: Some(h.percentile_us(0.99)),
            latency_us_p99_9: Some(h.percentile_us(0.999)),
            latency_us_p99_99: Some(h.percentile_us(0.9999)),
        }),
    }
}

/// A load run as the result of a fio job of the element's name.
fn job_result(element: &Element, split: &Split) -> JobResult {
    JobResult {
        name: element.name.clone(),
        group_id: 0,
        error_code: 0,
        // The generator's CPU is the lab process's, not measured per element.
        usr_cpu_percent: 0.0,
        sys_cpu_percent: 0.0,
        job_runtime_ms: (split.seconds * 1000.0) as u64 * u64::from(element.threads),
        read: direction(&split.read, split.seconds),
        write: direction(&split.write, split.seconds),
        sync: None,
    }
}

/// Preconditioning: sequential writes of the test's block size from the start of the array,
/// one job wrapping at the end, until `loops` times the capacity is written: runs planned from
/// the rate measured so far, repeated while short (a run starts again at offset 0).
fn precondition(array: &Array, test: &TestPlan, seed: u64) -> Result<f64> {
    let pattern = LoadPattern {
        block_bytes: u32::try_from(test.wipc.block_size_bytes)?,
        read_percent: 0,
        sequential: true,
    };
    let qd = test.wipc.queue_depth as usize;
    let want = array.size_bytes() * u64::from(test.wipc.loops);
    let mut written = 0u64;
    let mut planned = Duration::from_secs(1);
    for _ in 0..WIPC_RUNS_MAX {
        let run =
            run_array_split(array, pattern, 1, qd, planned, seed).map_err(anyhow::Error::msg)?;
        written += run.write.bytes;
        if written >= want {
            return Ok(written as f64 / array.size_bytes() as f64);
        }
        let rate = run.write.bytes as f64 / run.seconds;
        anyhow::ensure!(rate > 0.0, "preconditioning wrote nothing in {:?}", planned);
        // The remainder at the last rate, a tenth more; at least a second, at most the cap.
        let remaining = (want - written) as f64 / rate * 1.1;
        planned = Duration::from_secs_f64(remaining.max(1.0)).min(WIPC_RUN_MAX);
    }
    anyhow::bail!(
        "preconditioning wrote {written} of {want} bytes in {WIPC_RUNS_MAX} runs: the array is \
         too slow for this lab's time budget"
    )
}

/// One SNIA test on the in-process array: precondition, then rounds until the stop rule.
pub(super) fn run_test_inproc(
    args: &LabRunArgs,
    test: &TestPlan,
    array: &Array,
    column: &str,
    target_run: &mut TargetRun,
    report: &mut RunReport,
) -> Result<()> {
    let started = Instant::now();
    eprintln!("[{}] {column}: preconditioning in process", test.name);
    let passes = precondition(array, test, args.seed)?;
    report.manifest.insert(
        format!("{column} {}: wipc", test.name),
        format!(
            "in process: sequential {} writes, QD {}, {passes:.2} x capacity in {:.1} s",
            flashraid_lab::profile::size_label(test.wipc.block_size_bytes),
            test.wipc.queue_depth,
            started.elapsed().as_secs_f64()
        ),
    );
    let runtime = Duration::from_secs(u64::from(test.element_runtime_s));
    let rounds_max = test.stop.rounds_max;
    for round in 1..=rounds_max {
        eprintln!(
            "[{}] {column}: round {round}/{rounds_max}, {} elements in process",
            test.name,
            test.elements.len()
        );
        let mut jobs = vec![];
        for element in &test.elements {
            let split = run_array_split(
                array,
                load_pattern(element)?,
                element.threads as usize,
                element.queue_depth as usize,
                runtime,
                args.seed + round as u64,
            )
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("element {}", element.name))?;
            jobs.push(job_result(element, &split));
        }
        let test_run =
            target_run.test_mut(&test.name).expect("the target run was made from this plan");
        let decision = test_run.push_round(jobs)?;
        if report_round(test, column, test_run, decision, rounds_max) {
            return Ok(());
        }
    }
    Ok(())
}
