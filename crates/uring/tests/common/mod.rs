//! Test helpers: unique temporary paths that clean up after themselves, loop devices that are
//! detached even when a test fails, a seeded generator, and block stamps for data checks.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// tmpfs: O_DIRECT works, punch hole works, zero-range does not.
pub const SHM_DIR: &str = "/dev/shm";
/// ext4 on this machine: O_DIRECT, punch hole and zero-range all work.
pub const TMP_DIR: &str = "/tmp";

/// A path that is removed (if it exists) when dropped.
#[derive(Debug)]
pub struct TempPath {
    path: PathBuf,
}

impl TempPath {
    pub fn new(dir: &str, name: &str) -> TempPath {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let file = format!("flashraid-uring-{}-{unique}-{name}", std::process::id());
        let path = Path::new(dir).join(file);
        let _ = std::fs::remove_file(&path);
        TempPath { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A loop device over a sparse file in /tmp, detached when dropped (also while unwinding from
/// a failed assertion). Declare it before any `Device` or `Ring` that uses it, so those are
/// dropped (closed) first.
#[derive(Debug)]
pub struct LoopDevice {
    device: PathBuf,
    _backing: TempPath,
}

impl LoopDevice {
    /// `None` (after printing why) only when `losetup` is not installed; any other failure
    /// to attach fails the test.
    pub fn attach(size_bytes: u64, sector_bytes: u32, name: &str) -> Option<LoopDevice> {
        if Command::new("losetup").arg("--version").output().is_err() {
            eprintln!("NOTICE: losetup is not installed; skipping the loop-device part of {name}");
            return None;
        }
        let backing = TempPath::new(TMP_DIR, &format!("{name}.img"));
        let file = std::fs::File::create_new(backing.path()).expect("create the backing file");
        file.set_len(size_bytes).expect("size the backing file");
        drop(file);
        let output = Command::new("losetup")
            .args(["-f", "--show", "--sector-size", &sector_bytes.to_string()])
            .arg(backing.path())
            .output()
            .expect("run losetup");
        assert!(
            output.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let device = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
        Some(LoopDevice { device, _backing: backing })
    }

    pub fn path(&self) -> &Path {
        &self.device
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let status = Command::new("losetup").arg("-d").arg(&self.device).status();
        if !status.is_ok_and(|status| status.success()) {
            eprintln!("WARNING: could not detach {}", self.device.display());
        }
    }
}

/// splitmix64: small, seedable, good enough to pick offsets and fill buffers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `0..bound` for tests.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

/// The seed from `FLASHRAID_SEED`, or a fresh one; printed either way so a failure can be
/// replayed.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("FLASHRAID_SEED") {
        Ok(text) => text.parse().expect("FLASHRAID_SEED must be a u64"),
        Err(_) => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        }
    };
    println!("{test}: seed {seed} (replay with FLASHRAID_SEED={seed})");
    seed
}

/// Fill `block` with bytes that depend on `(block_index, generation)` only, so a reader can
/// tell exactly which write it is looking at.
pub fn stamp(block: &mut [u8], block_index: u64, generation: u64) {
    let mut rng = Rng::new(block_index.wrapping_mul(0x1000_0000_01b3) ^ generation);
    for chunk in block.chunks_mut(8) {
        let bytes = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    block[..8].copy_from_slice(&block_index.to_le_bytes());
    block[8..16].copy_from_slice(&generation.to_le_bytes());
}

/// Whether `block` holds exactly `stamp(block_index, generation)`; on mismatch, says what
/// the header claims.
pub fn check_stamp(block: &[u8], block_index: u64, generation: u64) -> Result<(), String> {
    let mut expected = vec![0u8; block.len()];
    stamp(&mut expected, block_index, generation);
    if block == expected.as_slice() {
        return Ok(());
    }
    let found_block = u64::from_le_bytes(block[..8].try_into().unwrap());
    let found_generation = u64::from_le_bytes(block[8..16].try_into().unwrap());
    Err(format!(
        "block {block_index}: expected generation {generation}, found a block claiming \
         block {found_block} generation {found_generation}"
    ))
}
