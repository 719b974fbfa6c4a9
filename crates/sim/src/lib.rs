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
/// n seeds, otherwise `default_count`; from 1, or from `FLASHRAID_SEED_FROM=f` (a soak that
/// explores seeds no earlier soak ran: `FLASHRAID_SEED_FROM=401 FLASHRAID_SEEDS=400`).
pub fn seeds(default_count: u64) -> Vec<u64> {
    seeds_from(default_count, |name| std::env::var(name).ok())
}

/// [`seeds`] with the environment given (`var` looks a name up).
fn seeds_from(default_count: u64, var: impl Fn(&str) -> Option<String>) -> Vec<u64> {
    let var = |name| var(name).and_then(|s| s.parse::<u64>().ok());
    if let Some(seed) = var("FLASHRAID_SEED") {
        return vec![seed];
    }
    let count = var("FLASHRAID_SEEDS").unwrap_or(default_count);
    let first = var("FLASHRAID_SEED_FROM").unwrap_or(1).max(1);
    (first..first.saturating_add(count)).collect()
}

/// `len` bytes of a fixed pseudo-random pattern per `seed` (xorshift): test data that a
/// read of the wrong place or version cannot match by chance.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The contents write `id` puts in 4 KiB array block `block`: a header naming both, then bytes
/// derived from them, so a block read back identifies the write it came from.
pub fn block_pattern(id: u64, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; 4096];
    out[..8].copy_from_slice(&id.to_le_bytes());
    out[8..16].copy_from_slice(&block.to_le_bytes());
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ block.wrapping_add(1);
    for byte in &mut out[16..] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    out
}

/// Which write a block came from (0: never written), or `None` if it is no write's pattern.
pub fn identify(data: &[u8], block: u64) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let id = u64::from_le_bytes(data[..8].try_into().unwrap());
    (data == block_pattern(id, block).as_slice()).then_some(id)
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

#[cfg(test)]
mod tests {
    use super::seeds_from;

    fn env<'a>(pairs: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn seeds_come_from_the_environment() {
        assert_eq!(seeds_from(3, env(&[])), vec![1, 2, 3]);
        assert_eq!(seeds_from(3, env(&[("FLASHRAID_SEEDS", "5")])), vec![1, 2, 3, 4, 5]);
        let from = [("FLASHRAID_SEEDS", "3"), ("FLASHRAID_SEED_FROM", "401")];
        assert_eq!(seeds_from(3, env(&from)), vec![401, 402, 403]);
        assert_eq!(seeds_from(2, env(&[("FLASHRAID_SEED_FROM", "7")])), vec![7, 8]);
        // One seed replayed, whatever else is set; 0 as a start is 1; junk is the default.
        let one = [("FLASHRAID_SEED", "1479"), ("FLASHRAID_SEEDS", "9")];
        assert_eq!(seeds_from(3, env(&one)), vec![1479]);
        assert_eq!(seeds_from(2, env(&[("FLASHRAID_SEED_FROM", "0")])), vec![1, 2]);
        assert_eq!(seeds_from(2, env(&[("FLASHRAID_SEEDS", "many")])), vec![1, 2]);
    }
}
