//! Which shard owns which stripe.
//!
//! Owns: the one rule the router and every shard agree on. Stripes are dealt to shards in
//! runs of `run_stripes` consecutive stripes, round-robin: stripe `s` belongs to shard
//! `(s / run_stripes) mod shard_count`. A run covers `ShardConfig::stripe_run_member_bytes`
//! of every member (at least one stripe; the default, 0, is one stripe). With longer runs the
//! chunks a large request reads or writes on one member are mostly neighbours served by one
//! shard, and the IO layer can merge them into one member IO (`runtime::driver`). Random
//! small requests spread evenly over the shards either way.
//!
//! Why one stripe is the default: measured on 2 vCPUs (docs/PERFORMANCE.md), 64 KiB runs
//! made a lone 1 MiB request at queue depth 1 13-25% slower (more of it on one shard), while
//! the gain under deep sequential load was within this machine's run-to-run noise. Devices
//! where a member IO costs more than a memory copy may want longer runs.
//!
//! Invariants: `shard_of` is a function of the stripe alone (for a given geometry and shard
//! count), so every stripe has exactly one owner; `first_owned_from`, `next_owned` and
//! `owned_below` are consistent with it (`owned_below(first_owned_from(s)) ==
//! owned_below(s)`, and `next_owned` steps through exactly the stripes `shard_of` gives the
//! shard, in order). Tested exhaustively for small shapes below.
//!
//! Nothing on disk depends on the rule: bitmap blocks are per shard but read back as their
//! union, and the rebuild cursor is an array-wide stripe number. A restart with another
//! shard count or run length is therefore safe.

use flashraid_layout::Geometry;

/// The stripe-to-shard rule. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    shard_count: u64,
    run_stripes: u64,
}

impl Ownership {
    pub fn new(shard_count: u32, run_stripes: u64) -> Self {
        assert!(shard_count >= 1 && run_stripes >= 1, "at least one shard and one stripe per run");
        Self { shard_count: u64::from(shard_count), run_stripes }
    }

    /// The rule for an array whose runs cover `run_member_bytes` of every member (rounded
    /// down to whole stripes, at least one).
    pub fn for_geometry(geometry: &Geometry, shard_count: u32, run_member_bytes: u64) -> Self {
        let run = (run_member_bytes / u64::from(geometry.chunk_bytes())).max(1);
        Self::new(shard_count, run)
    }

    pub fn run_stripes(&self) -> u64 {
        self.run_stripes
    }

    pub fn shard_count(&self) -> u32 {
        u32::try_from(self.shard_count).expect("built from a u32")
    }

    pub fn shard_of(&self, stripe: u64) -> u32 {
        u32::try_from(stripe / self.run_stripes % self.shard_count).expect("below shard count")
    }

    /// How many stripes below `stripe` belong to `shard`.
    pub fn owned_below(&self, shard: u32, stripe: u64) -> u64 {
        let cycle = self.run_stripes * self.shard_count;
        let run_start = u64::from(shard) * self.run_stripes;
        let in_cycle = (stripe % cycle).saturating_sub(run_start).min(self.run_stripes);
        stripe / cycle * self.run_stripes + in_cycle
    }

    /// How many stripes of `shard` lie in `from..to` (`from <= to`).
    pub fn owned_between(&self, shard: u32, from: u64, to: u64) -> u64 {
        self.owned_below(shard, to) - self.owned_below(shard, from)
    }

    /// The first stripe at or after `stripe` that belongs to `shard`.
    pub fn first_owned_from(&self, shard: u32, stripe: u64) -> u64 {
        if self.shard_of(stripe) == shard {
            return stripe;
        }
        let cycle = self.run_stripes * self.shard_count;
        let start = stripe - stripe % cycle + u64::from(shard) * self.run_stripes;
        // `stripe` is not in this cycle's run of `shard`: that run is either still ahead or
        // already behind (then the next cycle's).
        if start > stripe { start } else { start + cycle }
    }

    /// The stripe of `shard` after `stripe`.
    pub fn next_owned(&self, shard: u32, stripe: u64) -> u64 {
        self.first_owned_from(shard, stripe + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every helper against a brute-force walk over the stripes, for small shapes.
    #[test]
    fn helpers_agree_with_shard_of_exhaustively() {
        for shards in 1..=5u32 {
            for run in 1..=6u64 {
                let o = Ownership::new(shards, run);
                let stripes = 3 * run * u64::from(shards) + 7;
                for shard in 0..shards {
                    let mut count = 0;
                    for s in 0..stripes {
                        assert_eq!(o.owned_below(shard, s), count, "{shards} {run} {shard} {s}");
                        let first = (s..).find(|&t| o.shard_of(t) == shard).expect("some");
                        assert_eq!(o.first_owned_from(shard, s), first);
                        assert_eq!(o.next_owned(shard, s), o.first_owned_from(shard, s + 1));
                        count += u64::from(o.shard_of(s) == shard);
                    }
                }
                for s in 0..stripes {
                    let owner = o.shard_of(s);
                    assert!(owner < shards);
                    if s % run != 0 {
                        assert_eq!(owner, o.shard_of(s - 1), "a run stays on one shard");
                    }
                }
            }
        }
    }

    #[test]
    fn runs_cover_whole_stripes_of_the_member_bytes_asked() {
        use flashraid_layout::Level;
        let g = |chunk: u64| Geometry::new(Level::Raid6, 8, chunk, 64 << 20).expect("valid");
        let run = |chunk, bytes| Ownership::for_geometry(&g(chunk), 2, bytes).run_stripes();
        assert_eq!(run(16 << 10, 64 << 10), 4);
        assert_eq!(run(4 << 10, 64 << 10), 16);
        assert_eq!(run(64 << 10, 64 << 10), 1);
        assert_eq!(run(1 << 20, 64 << 10), 1);
        assert_eq!(run(16 << 10, 0), 1, "the default: one stripe per run");
    }
}
