//! CPU time per IO of `bench rebuild`'s saturated read loads, healthy and degraded, on one
//! shard driven by one poller job: the whole load then runs on one reactor thread, so its CPU
//! time per IO is the work per IO (memory members complete IO at once: no waiting, no other
//! thread to wait for) and hardly depends on what else the shared machine runs, where IOPS
//! do.
//!
//! `cargo run --release -p flashraid-bench --example degraded_cost [SECONDS [LOAD]]`
//! (LOAD: run only that one, e.g. `degraded-seq`, for a profile)
//!
//! RAID 6 x8, 16 KiB chunks, 512 MiB in-memory members, QD 32; degraded: member 0 failed onto
//! a spare whose rebuild is held back, as in `bench rebuild`. Prints one line per load and
//! the ratios healthy/degraded of CPU per IO (what IOPS would be on a core of its own).

use flashraid_bench::load::{Measured, Pattern, run_array_pollers};
use flashraid_layout::Level;
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create_in_memory_with_spares};
use std::sync::Arc;
use std::time::Duration;

fn main() {
    let seconds: f64 = std::env::args().nth(1).map_or(3.0, |s| s.parse().expect("seconds"));
    let only = std::env::args().nth(2);
    let member_bytes = 512 << 20;
    let members: Vec<Arc<MemMember>> =
        (0..8).map(|i| MemMember::new(&format!("mem{i}"), member_bytes)).collect();
    let spares = vec![MemMember::new("spare0", member_bytes)];
    let spec = CreateSpec::in_memory("cost", Level::Raid6, 16 << 10, 1);
    create_in_memory_with_spares(&spec, &members, &spares).unwrap();
    let all: Vec<Arc<MemMember>> = members.iter().chain(&spares).cloned().collect();
    let mut options = OpenOptions::recommended();
    options.shards = Some(1);
    let array = Array::open_in_memory(&all, &options).unwrap();
    let rand = Pattern { block_bytes: 4096, read_percent: 100, sequential: false };
    let seq = Pattern { block_bytes: 128 << 10, read_percent: 100, sequential: true };
    let run = |name: &str, pattern, seed| -> Measured {
        let wanted = only.as_deref().is_none_or(|o| o == name);
        let t = Duration::from_secs_f64(if wanted { seconds } else { 0.01 });
        let m = run_array_pollers(&array, pattern, 1, 32, t, seed).unwrap();
        println!(
            "{name:14} ios {:9} iops {:8.0} cpu_us_per_io {:.3}",
            m.ios, m.iops, m.cpu_us_per_io
        );
        m
    };
    // Warm up uncounted (pages, buffers), then the loads as `bench rebuild` runs them.
    run_array_pollers(&array, rand, 1, 32, Duration::from_millis(500), 9).unwrap();
    let healthy_rand = run("healthy-rand", rand, 1);
    let healthy_seq = run("healthy-seq", seq, 2);
    array.set_rebuild_rate(1).unwrap();
    array.fail_member(0).unwrap();
    let degraded_rand = run("degraded-rand", rand, 4);
    let degraded_seq = run("degraded-seq", seq, 5);
    let ratio = |h: &Measured, d: &Measured| h.cpu_us_per_io / d.cpu_us_per_io;
    println!(
        "cpu ratio rand {:.3} seq {:.3}",
        ratio(&healthy_rand, &degraded_rand),
        ratio(&healthy_seq, &degraded_seq)
    );
    array.shutdown().unwrap();
}
