//! Timing helpers: per-thread CPU time in doubling batches, medians.
//!
//! Why CPU time: the benchmark machines are shared; a thread descheduled for a neighbour would
//! count that wait against the code under test in wall time. CPU time removes descheduling but
//! not cache or memory-bandwidth interference, so results are reported as ratios to a baseline
//! measured in the same run, interleaved repetition by repetition.

use cpu_time::ThreadTime;
use std::time::Duration;

/// Bytes processed and CPU time spent by one repetition.
#[derive(Clone, Copy, Debug)]
pub struct Measurement {
    pub bytes: u64,
    pub cpu: Duration,
}

impl Measurement {
    /// Throughput in GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.cpu.as_secs_f64() / 1e9
    }
}

/// Run `step` (which processes `bytes_per_step` bytes) in doubling batches until at least
/// `min_cpu` of thread CPU time has passed. The clock is read once per batch, not per step:
/// reading the thread CPU clock is a system call that would otherwise dominate small steps.
pub fn measure(min_cpu: Duration, bytes_per_step: u64, mut step: impl FnMut()) -> Measurement {
    // One untimed step warms caches and resolves lazy symbols.
    step();
    let start = ThreadTime::now();
    let mut steps = 0u64;
    let mut batch = 1u64;
    loop {
        for _ in 0..batch {
            step();
        }
        steps += batch;
        let cpu = start.elapsed();
        if cpu >= min_cpu {
            return Measurement { bytes: steps * bytes_per_step, cpu };
        }
        batch = batch.saturating_mul(2).min(1 << 20);
    }
}

/// Median of a non-empty list (the lower middle for even lengths).
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() - 1) / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_picks_the_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[5.0]), 5.0);
    }

    #[test]
    fn measure_counts_every_step() {
        let mut calls = 0u64;
        let m = measure(Duration::from_millis(5), 10, || {
            calls += 1;
            std::hint::black_box(calls);
        });
        // The warm-up step is not counted.
        assert_eq!(m.bytes, (calls - 1) * 10);
        assert!(m.cpu >= Duration::from_millis(5));
    }
}
