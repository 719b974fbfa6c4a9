//! flashraid's simulator: the real engine and control plane over simulated members.
//!
//! Owns: simulated members ([`member`]) with a volatile write cache, power loss and faults; a
//! driver ([`driver`]) that completes IO in a seeded random order; and a whole-array harness
//! ([`array`]) for model-based tests and seeded fault and power-loss simulation.
//!
//! Deterministic: every choice comes from a seed, and a run is replayed by running it with
//! the same seed. Single-threaded.

pub mod array;
pub mod driver;
pub mod member;

pub use array::{SimArray, SimOptions, Ticket};
pub use member::{SimError, SimMember};

/// The seeds a seeded test runs: `FLASHRAID_SEED=n` replays one; `FLASHRAID_SEEDS=n` runs
/// seeds 1 to n; otherwise 1 to `default_count`.
pub fn seeds(default_count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("FLASHRAID_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let count =
        std::env::var("FLASHRAID_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_count);
    (1..=count).collect()
}

/// The redundant levels the lifecycle simulations cover, each at its smallest useful width.
pub const REDUNDANT_LEVELS: [(flashraid_layout::Level, usize); 5] = [
    (flashraid_layout::Level::Raid1, 3),
    (flashraid_layout::Level::Raid10, 4),
    (flashraid_layout::Level::Raid5, 5),
    (flashraid_layout::Level::Raid6, 6),
    (flashraid_layout::Level::Raid7_3, 7),
];

/// Run `f(level, members, seed)` for every redundant level and every seed of
/// [`seeds`]`(3)`; the seed passed is `seed * 100 + members` (so each level's runs differ).
pub fn for_each_redundant_level(mut f: impl FnMut(flashraid_layout::Level, usize, u64)) {
    for (level, members) in REDUNDANT_LEVELS {
        for seed in seeds(3) {
            f(level, members, seed * 100 + members as u64);
        }
    }
}
