//! Shared helpers for the parity tests: seeded random stripes at chosen misalignments, and the
//! plainest possible encode (straight from the definition) to compare against.

#![allow(dead_code)]

use flashraid_parity::{coefficient, gf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The seed for a randomised test: `FLASHRAID_SEED` if set, else a fixed default; printed so a
/// failure can be replayed.
pub fn seed(test: &str, default: u64) -> StdRng {
    let seed = std::env::var("FLASHRAID_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("{test}: seed {seed} (replay with FLASHRAID_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

/// A buffer whose usable slice starts `misalign` bytes past a 64-byte boundary.
pub struct Buffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Buffer {
    pub fn new(len: usize, misalign: usize) -> Self {
        let storage = vec![0u8; len + 128];
        let base = storage.as_ptr() as usize;
        let start = (64 - base % 64) % 64 + misalign % 64;
        Self { storage, start, len }
    }

    pub fn random(len: usize, misalign: usize, rng: &mut StdRng) -> Self {
        let mut buffer = Self::new(len, misalign);
        rng.fill(buffer.as_mut());
        buffer
    }

    pub fn filled(len: usize, misalign: usize, byte: u8) -> Self {
        let mut buffer = Self::new(len, misalign);
        buffer.as_mut().fill(byte);
        buffer
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl AsMut<[u8]> for Buffer {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Parity row `row` of `data`, byte by byte from the definition sum_j (2^row)^j * D_j.
pub fn definition_parity(data: &[&[u8]], row: usize) -> Vec<u8> {
    let len = data[0].len();
    let mut out = vec![0u8; len];
    for (j, chunk) in data.iter().enumerate() {
        let c = coefficient(row, j);
        assert_eq!(c, gf::pow2(row * j));
        for (o, &d) in out.iter_mut().zip(chunk.iter()) {
            *o ^= gf::mul_slow(c, d);
        }
    }
    out
}

/// Linux md's RAID 6 syndrome, written from its published algorithm (hpa, "The mathematics of
/// RAID-6"): Horner from the highest data disk down, Q = Q*{02} ^ D, with multiply-by-2 done
/// as "shift left, xor 0x1d where the top bit was set" on whole 64-bit words, as lib/raid6's
/// int64 code does.
pub fn md_gen_syndrome(data: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
    let len = data[0].len();
    assert_eq!(len % 8, 0);
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    let word = |chunk: &[u8], i: usize| u64::from_le_bytes(chunk[i..i + 8].try_into().unwrap());
    for i in (0..len).step_by(8) {
        let top = data.len() - 1;
        let mut wp = word(data[top], i);
        let mut wq = wp;
        for z in (0..top).rev() {
            let wd = word(data[z], i);
            wp ^= wd;
            let high_bits = wq & 0x8080_8080_8080_8080;
            let mask = (high_bits << 1).wrapping_sub(high_bits >> 7);
            let w2 = mask & 0x1d1d_1d1d_1d1d_1d1d;
            let w1 = (wq << 1) & 0xfefe_fefe_fefe_fefe;
            wq = w1 ^ w2 ^ wd;
        }
        p[i..i + 8].copy_from_slice(&wp.to_le_bytes());
        q[i..i + 8].copy_from_slice(&wq.to_le_bytes());
    }
    (p, q)
}
