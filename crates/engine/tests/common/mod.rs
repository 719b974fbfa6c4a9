//! Shared by the shard-seam tests: a shard over `n` members with chosen failed members and
//! dirty regions (no member data), and a driver step that takes every IO it issues.
#![allow(dead_code)] // Each test binary uses its own part of this.

use flashraid_engine::{
    ArrayAccess, BitmapSetup, Health, MemberIo, MemberSetup, Shard, ShardConfig, ShardSetup,
};
use flashraid_format::Uuid;
use flashraid_layout::{Geometry, Level};
use flashraid_parity::Kernel;

pub const CHUNK: u64 = 16384;
pub const DATA_OFFSET: u64 = 1 << 20;
pub const BITMAP_OFFSET: u64 = 4096 * 4;

pub fn shard(level: Level, n: usize, failed: &[usize], dirty: &[u32]) -> Shard {
    let config = ShardConfig { scratch_bytes: 4 << 20, ..ShardConfig::recommended() };
    shard_with(config, level, n, failed, dirty)
}

pub fn shard_with(
    config: ShardConfig,
    level: Level,
    n: usize,
    failed: &[usize],
    dirty: &[u32],
) -> Shard {
    Shard::new(setup_with(config, level, n, failed, dirty)).unwrap()
}

pub fn setup_with(
    config: ShardConfig,
    level: Level,
    n: usize,
    failed: &[usize],
    dirty: &[u32],
) -> ShardSetup {
    let geometry = Geometry::new(level, n, CHUNK, 64 * CHUNK).unwrap();
    let members = (0..n)
        .map(|m| MemberSetup {
            health: if failed.contains(&m) { Health::Failed } else { Health::Active },
            zeroes_after_discard: false,
        })
        .collect();
    ShardSetup {
        geometry,
        shard_index: 0,
        shard_count: 1,
        config,
        kernel: Kernel::best(),
        data_offset_bytes: DATA_OFFSET,
        members,
        bitmap: BitmapSetup {
            array_uuid: Uuid([7; 16]),
            area_offset_bytes: BITMAP_OFFSET,
            region_bytes: 4 * CHUNK,
            dirty_regions: dirty.to_vec(),
            missed_area_offset_bytes: BITMAP_OFFSET + (256 << 10),
            missed_regions: vec![],
        },
        access: ArrayAccess::ReadWrite,
    }
}

/// Every IO the shard has for its driver, each accepted at once.
pub fn ios(shard: &mut Shard) -> Vec<MemberIo> {
    let batch: Vec<MemberIo> = std::iter::from_fn(|| shard.poll_io()).collect();
    for io in &batch {
        shard.io_submitted(io.member, io.token);
    }
    batch
}

/// `len` bytes of a fixed pseudo-random pattern per `seed` (xorshift).
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
