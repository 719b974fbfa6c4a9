//! `flashraid bench rebuild`: the array healthy, degraded and rebuilding, measured in one run
//! (issue 5's speed questions).
//!
//! Method, on in-memory members (the engine alone) with one hot spare:
//! 1. healthy: 4 KiB random reads and 128 KiB sequential reads at saturation (poller jobs),
//!    and 4 KiB random reads paced at half the saturation rate of thread-driven load (p99
//!    latency, counted from each IO's scheduled time);
//! 2. degraded: a member is failed and the spare takes over with its rebuild held back (rate
//!    limit 1 B/s): the same two saturated loads, as ratios to healthy;
//! 3. rebuild under load: the rate limit is lifted (or set to `--rebuild-rate`) while the
//!    paced load runs, for exactly as long as the rebuild takes: the load's p99 against the
//!    healthy paced p99, and the rebuild rate meanwhile;
//! 4. rebuild alone: a second member is failed onto a second spare and rebuilt with no load:
//!    the rate, against the rate one member takes sequential chunk writes (the raw
//!    "replacement" figure, `run_raw_memory` on the spare).
//!
//! Limits: memory members only (files: the same phases need a device per spare; later). The
//! "replacement write rate" of a memory member is a memory copy, far above what the engine
//! can reconstruct on two cores, so that ratio says where the CPU stands, not a device.

use crate::load::{
    Measured, Pattern, RawArea, run_array, run_array_paced, run_array_pollers, run_raw_memory,
};
use flashraid_format::layout::DATA_OFFSET_BYTES;
use flashraid_layout::Level;
use flashraid_runtime::{
    Array, ArrayStatus, CreateSpec, MemMember, OpenOptions, create_in_memory_with_spares,
};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    pub level: Level,
    pub members: usize,
    pub chunk_bytes: u64,
    pub member_bytes: u64,
    pub shards: u32,
    pub jobs: usize,
    pub queue_depth: usize,
    pub run_time: Duration,
    /// Rebuild rate limit while the paced load runs, bytes per second (0: none).
    pub rate_under_load: u64,
    /// The rebuild's busy-time limit (`ShardConfig::rebuild_busy_rate_bytes_per_s`; 0: none).
    pub busy_rate: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub level: String,
    pub members: usize,
    pub chunk_bytes: u64,
    pub member_bytes: u64,
    pub shards: u32,
    pub jobs: usize,
    pub queue_depth: usize,
    pub healthy_randread: Measured,
    pub healthy_seqread: Measured,
    pub degraded_randread: Measured,
    pub degraded_seqread: Measured,
    /// 4 KiB random reads from thread-driven load at saturation (the kind of client the
    /// paced load is), healthy and with the member failed.
    pub healthy_threads_randread: Option<Measured>,
    pub degraded_threads_randread: Option<Measured>,
    /// Half the 4 KiB random read IOPS of thread-driven load at saturation.
    pub paced_iops: f64,
    pub rate_under_load: u64,
    pub busy_rate: u64,
    pub healthy_paced: Measured,
    pub rebuilding_paced: Measured,
    /// Bytes written to the replacement per second while the paced load ran.
    pub rebuild_under_load_bytes_per_s: f64,
    /// Bytes written to the replacement per second with no load.
    pub rebuild_alone_bytes_per_s: f64,
    pub rebuild_alone_seconds: f64,
    /// Sequential chunk-size writes to one member, bytes per second.
    pub replacement_write_bytes_per_s: f64,
}

fn wait_rebuild_done(array: &Array, limit: Duration) -> Result<ArrayStatus, String> {
    let start = Instant::now();
    loop {
        let s = array.status().map_err(|e| e.to_string())?;
        if s.rebuild.is_none() {
            return Ok(s);
        }
        if start.elapsed() > limit {
            return Err(format!("rebuild did not finish in {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn rebuilt_stripes(array: &Array) -> Result<u64, String> {
    Ok(array.status().map_err(|e| e.to_string())?.counters.rebuild_stripes)
}

pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> Result<Report, String> {
    if config.level == Level::Raid0 {
        return Err("rebuild needs a level with redundancy".into());
    }
    let members: Vec<Arc<MemMember>> = (0..config.members)
        .map(|i| MemMember::new(&format!("mem{i}"), config.member_bytes))
        .collect();
    let spares: Vec<Arc<MemMember>> =
        (0..2).map(|i| MemMember::new(&format!("spare{i}"), config.member_bytes)).collect();
    let spec =
        CreateSpec::in_memory("bench-rebuild", config.level, config.chunk_bytes, config.shards);
    create_in_memory_with_spares(&spec, &members, &spares).map_err(|e| e.to_string())?;
    let all: Vec<Arc<MemMember>> = members.iter().chain(&spares).cloned().collect();
    let mut options = OpenOptions::recommended();
    options.shards = Some(config.shards);
    options.config.rebuild_busy_rate_bytes_per_s = config.busy_rate;
    let array = Array::open_in_memory(&all, &options).map_err(|e| e.to_string())?;
    let chunk = u64::from(array.geometry().chunk_bytes());
    let rand = Pattern { block_bytes: 4096, read_percent: 100, sequential: false };
    let seq = Pattern { block_bytes: 128 << 10, read_percent: 100, sequential: true };
    let (jobs, qd, t) = (config.jobs, config.queue_depth, config.run_time);

    progress("healthy: 4k random read, 128k sequential read");
    let healthy_randread = run_array_pollers(&array, rand, jobs, qd, t, 1)?;
    let healthy_seqread = run_array_pollers(&array, seq, jobs, qd, t, 2)?;
    // Paced load runs on threads (a poller cannot sleep to a schedule): half of what the
    // threads reach at saturation.
    let threads_randread = run_array(&array, rand, jobs, qd, t, 8)?;
    let paced_iops = threads_randread.iops / 2.0;
    progress(&format!("healthy: 4k random read paced at {paced_iops:.0} IOPS"));
    let healthy_paced = run_array_paced(&array, rand, jobs, qd, t, 3, paced_iops, None)?;

    progress("degraded: member 0 failed, its rebuild held back");
    array.set_rebuild_rate(1).map_err(|e| e.to_string())?;
    array.fail_member(0).map_err(|e| e.to_string())?;
    let degraded_randread = run_array_pollers(&array, rand, jobs, qd, t, 4)?;
    let degraded_seqread = run_array_pollers(&array, seq, jobs, qd, t, 5)?;
    // What thread-driven clients reach degraded: the paced load's headroom during the
    // rebuild is this minus the paced rate, less what the rebuild itself takes.
    let degraded_threads_randread = run_array(&array, rand, jobs, qd, t, 9)?;

    progress("rebuild under the paced load (the load runs exactly as long as the rebuild)");
    let before = rebuilt_stripes(&array)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let (rebuilding_paced, rebuild_seconds) = std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            let limit = Duration::from_secs(600);
            run_array_paced(&array, rand, jobs, qd, limit, 6, paced_iops, Some(&stop))
        });
        let set = array.set_rebuild_rate(config.rate_under_load).map_err(|e| e.to_string());
        let done = set.and_then(|()| wait_rebuild_done(&array, Duration::from_secs(600)));
        let seconds = started.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let measured = load.join().map_err(|_| "paced load panicked".to_string())?;
        done?;
        Ok::<_, String>((measured?, seconds))
    })?;
    let during = rebuilt_stripes(&array)? - before;
    let rebuild_under_load_bytes_per_s = (during * chunk) as f64 / rebuild_seconds;
    array.set_rebuild_rate(0).map_err(|e| e.to_string())?;

    progress("rebuild with no load: member 1 onto the second spare");
    let before = rebuilt_stripes(&array)?;
    let started = Instant::now();
    array.fail_member(1).map_err(|e| e.to_string())?;
    wait_rebuild_done(&array, Duration::from_secs(600))?;
    let rebuild_alone_seconds = started.elapsed().as_secs_f64();
    let stripes = rebuilt_stripes(&array)? - before;
    let rebuild_alone_bytes_per_s = (stripes * chunk) as f64 / rebuild_alone_seconds;
    let data_bytes = array.geometry().member_data_bytes();
    array.shutdown().map_err(|e| e.to_string())?;

    progress("replacement: sequential chunk writes to one member");
    let area = RawArea { offset_bytes: DATA_OFFSET_BYTES, len_bytes: data_bytes };
    let write = Pattern {
        block_bytes: u32::try_from(chunk).expect("chunk fits u32"),
        read_percent: 0,
        sequential: true,
    };
    let raw = run_raw_memory(&spares[..1], area, write, 1, qd, t, 7)?;
    Ok(Report {
        level: config.level.to_string(),
        members: config.members,
        chunk_bytes: config.chunk_bytes,
        member_bytes: config.member_bytes,
        shards: config.shards,
        jobs,
        queue_depth: qd,
        healthy_randread,
        healthy_seqread,
        degraded_randread,
        degraded_seqread,
        healthy_threads_randread: Some(threads_randread),
        degraded_threads_randread: Some(degraded_threads_randread),
        paced_iops,
        rate_under_load: config.rate_under_load,
        busy_rate: config.busy_rate,
        healthy_paced,
        rebuilding_paced,
        rebuild_under_load_bytes_per_s,
        rebuild_alone_bytes_per_s,
        rebuild_alone_seconds,
        replacement_write_bytes_per_s: raw.bytes_per_second,
    })
}

pub fn format_report(r: &Report) -> String {
    let mib = |b: f64| b / (1 << 20) as f64;
    let mut out = format!(
        "{} x{} (+2 spares), chunk {} KiB, members {} MiB in memory, {} shards, {} jobs x QD {}\n\n",
        r.level,
        r.members,
        r.chunk_bytes >> 10,
        r.member_bytes >> 20,
        r.shards,
        r.jobs,
        r.queue_depth
    );
    let limit = match (r.rate_under_load, r.busy_rate) {
        (0, 0) => "no limit".to_string(),
        (0, b) => format!("busy limit {:.0} MiB/s", mib(b as f64)),
        (l, 0) => format!("limit {:.0} MiB/s", mib(l as f64)),
        (l, b) => format!("limit {:.0}, busy {:.0} MiB/s", mib(l as f64), mib(b as f64)),
    };
    out +=
        "| measure | healthy | degraded / rebuilding | ratio | target |\n|---|---|---|---|---|\n";
    out += &format!(
        "| 4k random read, IOPS | {:.0} | {:.0} | {:.2} | >= 0.80 |\n",
        r.healthy_randread.iops,
        r.degraded_randread.iops,
        r.degraded_randread.iops / r.healthy_randread.iops
    );
    out += &format!(
        "| 128k sequential read, MiB/s | {:.0} | {:.0} | {:.2} | >= 0.80 |\n",
        mib(r.healthy_seqread.bytes_per_second),
        mib(r.degraded_seqread.bytes_per_second),
        r.degraded_seqread.bytes_per_second / r.healthy_seqread.bytes_per_second
    );
    if let (Some(h), Some(d)) = (&r.healthy_threads_randread, &r.degraded_threads_randread) {
        out += &format!(
            "| 4k random read, IOPS, thread clients (as the paced load) | {:.0} | {:.0} | {:.2} | |\n",
            h.iops,
            d.iops,
            d.iops / h.iops
        );
    }
    out += &format!(
        "| 4k random read at {:.0} IOPS (half of healthy), p99 us, during the rebuild ({limit}) | {:.0} | {:.0} | {:.2} | <= 2.00 |\n",
        r.paced_iops,
        r.healthy_paced.latency_us_p99,
        r.rebuilding_paced.latency_us_p99,
        r.rebuilding_paced.latency_us_p99 / r.healthy_paced.latency_us_p99.max(1e-9)
    );
    out += &format!(
        "| rebuild, no load, MiB/s to the replacement | {:.0} (one member's write rate) | {:.0} ({:.1} s) | {:.2} | >= 0.90 |\n",
        mib(r.replacement_write_bytes_per_s),
        mib(r.rebuild_alone_bytes_per_s),
        r.rebuild_alone_seconds,
        r.rebuild_alone_bytes_per_s / r.replacement_write_bytes_per_s
    );
    out += &format!(
        "| rebuild under the paced load ({limit}), MiB/s | | {:.0} | | |\n",
        mib(r.rebuild_under_load_bytes_per_s)
    );
    out
}
