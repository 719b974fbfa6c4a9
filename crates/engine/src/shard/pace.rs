//! A token bucket for background work (resync, rebuild, scrub): bytes per second, refilled
//! from the shard's clock. Owns nothing else; no IO, no clock of its own.
//!
//! Invariant: the budget never exceeds `REFILL_BURST_US` worth of the rate (at least one
//! unit of work), so an idle spell does not turn into a burst against foreground IO.

/// Longest time the bucket saves up for.
const REFILL_BURST_US: u64 = 20_000;

#[derive(Clone, Copy, Debug)]
pub(super) struct Pace {
    /// Bytes per second; 0: no limit.
    rate_bytes_per_s: u64,
    budget_bytes: u64,
    last_refill_us: u64,
}

impl Pace {
    pub(super) fn new(rate_bytes_per_s: u64, now_us: u64) -> Self {
        Self { rate_bytes_per_s, budget_bytes: 0, last_refill_us: now_us }
    }

    pub(super) fn set_rate(&mut self, rate_bytes_per_s: u64) {
        self.rate_bytes_per_s = rate_bytes_per_s;
    }

    /// Add what the time since the last refill earned; `unit_bytes` is the smallest piece of
    /// work (the cap never goes below it).
    pub(super) fn refill(&mut self, now_us: u64, unit_bytes: u64) {
        let rate = self.rate_bytes_per_s;
        if rate == 0 {
            self.last_refill_us = now_us;
            return;
        }
        let elapsed = now_us.saturating_sub(self.last_refill_us);
        let earned = u128::from(elapsed) * u128::from(rate) / 1_000_000;
        if earned == 0 {
            // Keep the time: slow rates earn over many refills.
            return;
        }
        self.last_refill_us = now_us;
        let cap = (u128::from(rate) * u128::from(REFILL_BURST_US) / 1_000_000)
            .max(u128::from(unit_bytes));
        self.budget_bytes =
            u64::try_from((u128::from(self.budget_bytes) + earned).min(cap)).expect("capped");
    }

    /// Whether `take(bytes)` would succeed now.
    pub(super) fn can_take(&self, bytes: u64) -> bool {
        self.rate_bytes_per_s == 0 || self.budget_bytes >= bytes
    }

    /// Take `bytes` if the budget allows (always, with no limit).
    pub(super) fn take(&mut self, bytes: u64) -> bool {
        if self.rate_bytes_per_s == 0 {
            return true;
        }
        if self.budget_bytes < bytes {
            return false;
        }
        self.budget_bytes -= bytes;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_pace_allows_its_rate_and_no_burst() {
        let mut p = Pace::new(1_000_000, 0); // 1 MB/s
        assert!(!p.take(4096), "nothing earned at start");
        p.refill(10_000, 4096); // 10 ms: 10 kB
        assert!(p.take(4096) && p.take(4096) && !p.take(4096));
        p.refill(10_000_000, 4096); // 10 s idle: capped at 20 ms worth
        let mut taken = 0;
        while p.take(1000) {
            taken += 1;
        }
        assert_eq!(taken, 20, "the budget is capped at 20 ms worth, leftovers included");
    }

    #[test]
    fn slow_rates_accumulate_and_no_limit_always_allows() {
        let mut p = Pace::new(100, 0); // 100 B/s
        for t in 1..=100 {
            p.refill(t * 1000, 4096); // 1 ms steps earn 0.1 B each
        }
        assert!(p.take(10), "100 ms at 100 B/s is 10 bytes");
        let mut free = Pace::new(0, 0);
        assert!(free.take(u64::MAX));
    }
}
