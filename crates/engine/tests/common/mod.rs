//! Shared by the shard-seam tests: a shard over `n` members with chosen failed members and
//! dirty regions, a driver step that takes every IO it issues, and simulated member bytes
//! with bad ranges (`Mem`) for the tests that need data.
#![allow(dead_code)] // Each test binary uses its own part of this.

use flashraid_engine::{
    ArrayAccess, BitmapSetup, Health, IoError, MemberCompletion, MemberIo, MemberIoKind,
    MemberSetup, Shard, ShardConfig, ShardEvent, ShardSetup,
};
use flashraid_format::Uuid;
use flashraid_layout::MemberIndex;
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
            dirty_init_only: false,
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

/// Member bytes simulated at the shard seam: reads of a bad range fail with `Media` and
/// leave garbage; a write heals the bad ranges it covers.
pub struct Mem {
    pub data: Vec<Vec<u8>>,
    pub bad: Vec<Vec<(u64, u64)>>,
}

impl Mem {
    pub fn new(n: usize, bytes: u64) -> Self {
        Self { data: vec![vec![0u8; bytes as usize]; n], bad: vec![vec![]; n] }
    }
    pub fn overlaps_bad(&self, m: usize, at: u64, len: u64) -> bool {
        self.bad[m].iter().any(|&(b, l)| b < at + len && at < b + l)
    }

    /// Do `io` on the member's bytes.
    pub fn perform(&mut self, io: &MemberIo) -> Result<(), IoError> {
        let m = io.member.get();
        match io.kind {
            MemberIoKind::Read { offset_bytes, ptr, len_bytes } => {
                if self.overlaps_bad(m, offset_bytes, u64::from(len_bytes)) {
                    // What a failed read leaves: garbage.
                    // SAFETY: `ptr` is the shard's buffer of `len_bytes` for this IO, which it
                    // leaves alone until the IO completes.
                    unsafe { std::ptr::write_bytes(ptr, 0xee, len_bytes as usize) };
                    return Err(IoError::Media);
                }
                let src = &self.data[m][offset_bytes as usize..][..len_bytes as usize];
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, src.len()) };
            }
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, .. } => {
                let dst = &mut self.data[m][offset_bytes as usize..][..len_bytes as usize];
                // SAFETY: the shard keeps the `len_bytes` behind `ptr` unchanged until the IO
                // completes.
                unsafe { std::ptr::copy_nonoverlapping(ptr, dst.as_mut_ptr(), dst.len()) };
                let (lo, hi) = (offset_bytes, offset_bytes + u64::from(len_bytes));
                self.bad[m].retain(|&(b, l)| !(lo <= b && b + l <= hi));
            }
            _ => {}
        }
        Ok(())
    }
}

/// Run the shard's IO against `mem` (reads of a bad range fail with Media; a write heals the
/// bad ranges it covers) until it issues no more, ticking the clock.
pub fn drive(s: &mut Shard, mem: &mut Mem, now: &mut u64) {
    drive_with(s, mem, now, &mut |_| None);
}

/// `drive`, with `fault` answering an IO first where it returns a result (a member gone).
pub fn drive_with(
    s: &mut Shard,
    mem: &mut Mem,
    now: &mut u64,
    fault: &mut dyn FnMut(&MemberIo) -> Option<Result<(), IoError>>,
) {
    let mut empty = 0;
    for _ in 0..100_000 {
        *now += 1000;
        s.tick(*now);
        let batch = ios(s);
        if batch.is_empty() {
            empty += 1;
            if empty > 5 {
                return;
            }
            continue;
        }
        empty = 0;
        for io in batch {
            let r = fault(&io).unwrap_or_else(|| mem.perform(&io));
            s.complete_io(MemberCompletion { token: io.token, result: r });
        }
        let failed: Vec<MemberIndex> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                ShardEvent::MemberFailed { member, .. } => Some(member),
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            s.apply_failed(&failed);
        }
    }
    panic!("never settled");
}
