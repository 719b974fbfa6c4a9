//! AVX2 kernels, in two flavours that share one loop shape:
//! - `*_gfni`: 256-bit `vgf2p8affineqb` (Intel client cores from Alder Lake, Zen 4 in 256-bit);
//! - `*_pshufb`: the classic split-nibble `vpshufb` table multiply (Haswell and later, Zen 1-3):
//!   `c*x = T_lo[x & 15] ^ T_hi[x >> 4]`, each 16-byte table broadcast to both lanes.
//!
//! Shape, and why: dot-product form (each source loaded once, every output row accumulated in
//! registers), row 0 as plain XOR when its coefficients are all 1, and as many 32-byte columns
//! per iteration as the 16 ymm registers allow: 4 for one or two rows, 2 for three rows.
//! Unaligned loads and stores; non-temporal stores only when asked and every output is 32-byte
//! aligned (the job checks 64), then `sfence`.
//!
//! Limits: `len` a multiple of 256 (the kernel contract); at most 3 output rows.

use super::{BLOCK_BYTES, DotJob, UpdateJob};
use crate::matrix::Coefficients;
use core::arch::x86_64::*;

const VECTOR_BYTES: usize = 32;

/// Multiplier state for the GFNI flavour: the broadcast affine matrix.
#[derive(Clone, Copy)]
struct GfniFactor(__m256i);

/// Multiplier state for the `pshufb` flavour: low- and high-nibble tables.
#[derive(Clone, Copy)]
struct NibbleFactor(__m256i, __m256i);

/// # Safety
/// The tables cover (row, source).
#[inline]
#[target_feature(enable = "avx2,gfni")]
unsafe fn gfni_factor(coefs: &Coefficients<'_>, row: usize, source: usize) -> GfniFactor {
    // SAFETY: the caller guarantees the index is inside the table.
    let entry = unsafe { *coefs.affine.get_unchecked(coefs.index(row, source)) };
    GfniFactor(_mm256_set1_epi64x(entry as i64))
}

#[inline]
#[target_feature(enable = "avx2,gfni")]
fn gfni_multiply(data: __m256i, factor: GfniFactor, _mask: __m256i) -> __m256i {
    _mm256_gf2p8affine_epi64_epi8::<0>(data, factor.0)
}

/// # Safety
/// The tables cover (row, source).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_factor(coefs: &Coefficients<'_>, row: usize, source: usize) -> NibbleFactor {
    // SAFETY: the caller guarantees the index is inside the table; each entry is 32 bytes.
    unsafe {
        let tables = coefs.nibbles.get_unchecked(coefs.index(row, source)).as_ptr();
        NibbleFactor(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(tables.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(tables.add(16).cast())),
        )
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn nibble_multiply(data: __m256i, factor: NibbleFactor, mask: __m256i) -> __m256i {
    let low = _mm256_and_si256(data, mask);
    let high = _mm256_and_si256(_mm256_srli_epi64::<4>(data), mask);
    _mm256_xor_si256(_mm256_shuffle_epi8(factor.0, low), _mm256_shuffle_epi8(factor.1, high))
}

macro_rules! avx2_kernels {
    ($features:literal, $dot:ident, $dot_rows:ident, $update:ident, $update_rows:ident,
     $factor:ident, $factor_zero:expr, $multiply:ident) => {
        /// # Safety
        /// The job satisfies the kernel contract and the CPU has the flavour's features.
        pub(crate) unsafe fn $dot(job: &DotJob<'_>) {
            let nontemporal = job.nontemporal();
            macro_rules! go {
                ($rows:literal, $columns:literal, $xor:literal) => {
                    if nontemporal {
                        // SAFETY: forwarded contract.
                        unsafe { $dot_rows::<$rows, $columns, $xor, true>(job) }
                    } else {
                        // SAFETY: forwarded contract.
                        unsafe { $dot_rows::<$rows, $columns, $xor, false>(job) }
                    }
                };
            }
            match (job.outs.len(), job.first_row_xor) {
                (1, true) => go!(1, 4, true),
                (1, false) => go!(1, 4, false),
                (2, true) => go!(2, 4, true),
                (2, false) => go!(2, 4, false),
                (3, true) => go!(3, 2, true),
                (3, false) => go!(3, 2, false),
                (rows, _) => unreachable!("{rows} output rows: checked by the caller"),
            }
        }

        /// # Safety
        /// See the entry point.
        #[target_feature(enable = $features)]
        unsafe fn $dot_rows<
            const ROWS: usize,
            const COLUMNS: usize,
            const FIRST_XOR: bool,
            const NONTEMPORAL: bool,
        >(
            job: &DotJob<'_>,
        ) {
            const { assert!(BLOCK_BYTES % (COLUMNS * VECTOR_BYTES) == 0) };
            let step_bytes = COLUMNS * VECTOR_BYTES;
            let coefs = &job.coefs;
            let mask = _mm256_set1_epi8(0x0f);
            let mut offset = 0;
            while offset < job.len {
                let mut acc = [[_mm256_setzero_si256(); COLUMNS]; ROWS];
                for (s, &src) in job.srcs.iter().enumerate() {
                    let mut data = [_mm256_setzero_si256(); COLUMNS];
                    for (c, vector) in data.iter_mut().enumerate() {
                        // SAFETY: each source is valid for `len` bytes and
                        // `offset + step_bytes <= len` (len is a multiple of the step).
                        *vector = unsafe {
                            _mm256_loadu_si256(src.add(offset + c * VECTOR_BYTES).cast())
                        };
                    }
                    for (row, row_acc) in acc.iter_mut().enumerate() {
                        if FIRST_XOR && row == 0 {
                            for c in 0..COLUMNS {
                                row_acc[c] = _mm256_xor_si256(row_acc[c], data[c]);
                            }
                        } else {
                            // SAFETY: the tables cover every (row, source) pair of the job.
                            let factor = unsafe { $factor(coefs, row, s) };
                            for c in 0..COLUMNS {
                                let term = $multiply(data[c], factor, mask);
                                row_acc[c] = _mm256_xor_si256(row_acc[c], term);
                            }
                        }
                    }
                }
                for (row, row_acc) in acc.iter().enumerate() {
                    // SAFETY: `row < outs.len()`; each output is valid for `len` bytes; with
                    // NONTEMPORAL the caller checked 64-byte alignment.
                    unsafe {
                        let out = job.outs.get_unchecked(row).add(offset);
                        for (c, vector) in row_acc.iter().enumerate() {
                            let dst = out.add(c * VECTOR_BYTES);
                            if NONTEMPORAL {
                                _mm256_stream_si256(dst.cast(), *vector);
                            } else {
                                _mm256_storeu_si256(dst.cast(), *vector);
                            }
                        }
                    }
                }
                offset += step_bytes;
            }
            if NONTEMPORAL {
                _mm_sfence();
            }
        }

        /// # Safety
        /// The job satisfies the kernel contract and the CPU has the flavour's features.
        pub(crate) unsafe fn $update(job: &UpdateJob<'_>) {
            match job.parity.len() {
                // SAFETY: forwarded contract.
                1 => unsafe { $update_rows::<1>(job) },
                // SAFETY: forwarded contract.
                2 => unsafe { $update_rows::<2>(job) },
                // SAFETY: forwarded contract.
                3 => unsafe { $update_rows::<3>(job) },
                rows => unreachable!("{rows} parity rows: checked by the caller"),
            }
        }

        /// # Safety
        /// See the entry point.
        #[target_feature(enable = $features)]
        unsafe fn $update_rows<const ROWS: usize>(job: &UpdateJob<'_>) {
            let mask = _mm256_set1_epi8(0x0f);
            let mut factors = [$factor_zero; ROWS];
            for (row, factor) in factors.iter_mut().enumerate() {
                // SAFETY: the tables cover (row, column) for every parity row of the job.
                *factor = unsafe { $factor(&job.coefs, row, job.column) };
            }
            let mut offset = 0;
            while offset < job.len {
                // SAFETY: old and new are valid for `len` bytes; `offset + 32 <= len`.
                let delta = unsafe {
                    _mm256_xor_si256(
                        _mm256_loadu_si256(job.old.add(offset).cast()),
                        _mm256_loadu_si256(job.new.add(offset).cast()),
                    )
                };
                for row in 0..ROWS {
                    let term = $multiply(delta, factors[row], mask);
                    // SAFETY: `row < parity.len()`; each parity buffer is valid for `len` bytes
                    // and only touched here, read then written.
                    unsafe {
                        let parity = job.parity.get_unchecked(row).add(offset);
                        let current = _mm256_loadu_si256(parity.cast());
                        _mm256_storeu_si256(parity.cast(), _mm256_xor_si256(current, term));
                    }
                }
                offset += VECTOR_BYTES;
            }
        }
    };
}

avx2_kernels!(
    "avx2,gfni",
    dot_gfni,
    dot_rows_gfni,
    update_gfni,
    update_rows_gfni,
    gfni_factor,
    GfniFactor(_mm256_setzero_si256()),
    gfni_multiply
);
avx2_kernels!(
    "avx2",
    dot_pshufb,
    dot_rows_pshufb,
    update_pshufb,
    update_rows_pshufb,
    nibble_factor,
    NibbleFactor(_mm256_setzero_si256(), _mm256_setzero_si256()),
    nibble_multiply
);
