//! AVX-512 + GFNI kernels: the fast path on Ice Lake-SP, Sapphire Rapids and later, Zen 4/5.
//!
//! Shape, and why:
//! - Multiplication by a constant is one `vgf2p8affineqb` with the coefficient's 8x8 bit matrix
//!   (`vgf2p8mulb` is hard-wired to the AES polynomial 0x11b and cannot be used).
//! - Dot-product form: every source vector is loaded once and all output rows accumulate in
//!   registers (one pass over the data, no read-modify-write of parity).
//! - Sources are consumed in pairs and folded with one `vpternlogq` per accumulator (a ^ b ^ c),
//!   which cuts vector ALU work from 3 to 2 ops per source and row pair for P+Q.
//! - Row 0 of an encode (P) is plain XOR: no multiply by 1.
//! - Four 64-byte columns per iteration (a 256-byte block) hide the affine latency; for three
//!   rows that is 12 accumulators plus 8 source registers, inside the 32 zmm registers.
//!   Measured alternatives that lost on this machine class (interleaved A/B, 2026-11-22): two
//!   columns (-3 to -9%), eight columns one source at a time (-6 to -20% for P+Q), software
//!   prefetch 256 B to 2 KiB ahead on hot stripes (-2 to -30%; the L2 streamer keeps up).
//! - Two-row dot products over at most 16 sources are specialised per source count
//!   (`dot_fixed_sources`); the non-temporal variants, meant for cold stripes, prefetch ahead.
//! - Unaligned loads and stores (callers need not align); non-temporal stores only when asked
//!   and every output is 64-byte aligned, followed by `sfence` so the stores are ordered before
//!   whatever hands the buffer to a device.
//!
//! Limits: `len` a multiple of 256 (the kernel contract); at most 3 output rows.

use super::{BLOCK_BYTES, DotJob, UpdateJob};
use crate::matrix::Coefficients;
use core::arch::x86_64::*;

const VECTOR_BYTES: usize = 64;
const COLUMNS: usize = BLOCK_BYTES / VECTOR_BYTES;

/// Two-row dot products over at most this many sources run a kernel specialised for the
/// source count (see `dot_fixed_sources`).
const FIXED_SOURCES_MAX: usize = 16;

/// Dispatch a two-row job to `dot_fixed_sources::<K, ..>` for its source count K.
macro_rules! fixed_sources {
    ($job:expr, $xor:literal, $nt:literal) => {
        match $job.srcs.len() {
            2 => dot_fixed_sources::<2, $xor, $nt>($job),
            3 => dot_fixed_sources::<3, $xor, $nt>($job),
            4 => dot_fixed_sources::<4, $xor, $nt>($job),
            5 => dot_fixed_sources::<5, $xor, $nt>($job),
            6 => dot_fixed_sources::<6, $xor, $nt>($job),
            7 => dot_fixed_sources::<7, $xor, $nt>($job),
            8 => dot_fixed_sources::<8, $xor, $nt>($job),
            9 => dot_fixed_sources::<9, $xor, $nt>($job),
            10 => dot_fixed_sources::<10, $xor, $nt>($job),
            11 => dot_fixed_sources::<11, $xor, $nt>($job),
            12 => dot_fixed_sources::<12, $xor, $nt>($job),
            13 => dot_fixed_sources::<13, $xor, $nt>($job),
            14 => dot_fixed_sources::<14, $xor, $nt>($job),
            15 => dot_fixed_sources::<15, $xor, $nt>($job),
            16 => dot_fixed_sources::<16, $xor, $nt>($job),
            // One source: the generic kernel handles it (the caller only routes 2..=16 here).
            _ => dot_rows::<2, $xor, $nt>($job),
        }
    };
}

/// # Safety
/// The job satisfies the kernel contract and the CPU has AVX-512F/BW and GFNI.
pub(crate) unsafe fn dot(job: &DotJob<'_>) {
    let nontemporal = job.nontemporal();
    macro_rules! go {
        ($rows:literal, $xor:literal) => {
            if nontemporal {
                // SAFETY: forwarded contract.
                unsafe { dot_rows::<$rows, $xor, true>(job) }
            } else {
                // SAFETY: forwarded contract.
                unsafe { dot_rows::<$rows, $xor, false>(job) }
            }
        };
    }
    macro_rules! fixed {
        ($xor:literal) => {
            if nontemporal {
                // SAFETY: forwarded contract; the macro matches K to the source count.
                unsafe { fixed_sources!(job, $xor, true) }
            } else {
                // SAFETY: as above.
                unsafe { fixed_sources!(job, $xor, false) }
            }
        };
    }
    match (job.outs.len(), job.first_row_xor) {
        (2, true) if job.srcs.len() <= FIXED_SOURCES_MAX => fixed!(true),
        (2, false) if job.srcs.len() <= FIXED_SOURCES_MAX => fixed!(false),
        (1, true) => go!(1, true),
        (1, false) => go!(1, false),
        (2, true) => go!(2, true),
        (2, false) => go!(2, false),
        (3, true) => go!(3, true),
        (3, false) => go!(3, false),
        (rows, _) => unreachable!("{rows} output rows: checked by the caller"),
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,gfni")]
fn multiply(data: __m512i, matrix: __m512i) -> __m512i {
    _mm512_gf2p8affine_epi64_epi8::<0>(data, matrix)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(a, b, c)
}

/// How far ahead the non-temporal (cold-stripe) kernels prefetch each source.
const PREFETCH_BYTES: usize = 512;

/// Prefetch one block `PREFETCH_BYTES` past `ptr` into L1. Used only by the non-temporal
/// variants, which callers pick for cold stripes: the L2 streamer restarts at every 4 KiB page
/// and on many streams at once ramps up too slowly. Measured (2026-11-22, k = 10, cold): +6% to
/// +14% at 16 KiB chunks; `prefetchnta` instead halved throughput; on hot stripes any software
/// prefetch cost 2-30%, so the cached variants have none.
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_ahead(ptr: *const u8) {
    for c in 0..COLUMNS {
        // Prefetches never fault, so running past the end of a buffer is harmless; wrapping
        // arithmetic keeps the address computation itself defined.
        let target = ptr.wrapping_add(PREFETCH_BYTES + c * VECTOR_BYTES).cast::<i8>();
        _mm_prefetch::<_MM_HINT_T0>(target);
    }
}

/// # Safety
/// Each pointer is valid for reads of `COLUMNS * 64` bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_block(ptr: *const u8) -> [__m512i; COLUMNS] {
    let mut block = [_mm512_setzero_si512(); COLUMNS];
    for (c, vector) in block.iter_mut().enumerate() {
        // SAFETY: the caller guarantees the block is readable; loadu has no alignment need.
        *vector = unsafe { _mm512_loadu_si512(ptr.add(c * VECTOR_BYTES).cast()) };
    }
    block
}

/// The affine matrix of coefficient (row, source), in every lane.
///
/// # Safety
/// The coefficient tables cover (row, source).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn broadcast_matrix(coefs: &Coefficients<'_>, row: usize, source: usize) -> __m512i {
    // SAFETY: the caller guarantees the index is inside the table.
    let entry = unsafe { *coefs.affine.get_unchecked(coefs.index(row, source)) };
    _mm512_set1_epi64(entry as i64)
}

/// # Safety
/// See [`dot`].
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn dot_rows<const ROWS: usize, const FIRST_XOR: bool, const NONTEMPORAL: bool>(
    job: &DotJob<'_>,
) {
    let sources = job.srcs.len();
    let coefs = &job.coefs;
    // A macro rather than a closure: closures do not inherit the target features, so the
    // intrinsic would not inline into one.
    macro_rules! matrix {
        ($row:expr, $source:expr) => {
            // SAFETY: the contract says the tables cover every (row, source) pair of the job.
            unsafe { broadcast_matrix(coefs, $row, $source) }
        };
    }
    let mut offset = 0;
    while offset < job.len {
        let mut acc = [[_mm512_setzero_si512(); COLUMNS]; ROWS];
        let mut s = 0;
        while s + 2 <= sources {
            if NONTEMPORAL {
                prefetch_ahead(job.srcs[s].wrapping_add(offset));
                prefetch_ahead(job.srcs[s + 1].wrapping_add(offset));
            }
            // SAFETY: `s + 1 < sources`; each source is valid for `len` bytes and
            // `offset + BLOCK_BYTES <= len`.
            let (a, b) = unsafe {
                (
                    load_block(job.srcs.get_unchecked(s).add(offset)),
                    load_block(job.srcs.get_unchecked(s + 1).add(offset)),
                )
            };
            for (row, row_acc) in acc.iter_mut().enumerate() {
                if FIRST_XOR && row == 0 {
                    for c in 0..COLUMNS {
                        row_acc[c] = xor3(row_acc[c], a[c], b[c]);
                    }
                } else {
                    let (ma, mb) = (matrix!(row, s), matrix!(row, s + 1));
                    for c in 0..COLUMNS {
                        row_acc[c] = xor3(row_acc[c], multiply(a[c], ma), multiply(b[c], mb));
                    }
                }
            }
            s += 2;
        }
        if s < sources {
            // SAFETY: as above, for the last (odd) source.
            let a = unsafe { load_block(job.srcs.get_unchecked(s).add(offset)) };
            for (row, row_acc) in acc.iter_mut().enumerate() {
                if FIRST_XOR && row == 0 {
                    for c in 0..COLUMNS {
                        row_acc[c] = _mm512_xor_si512(row_acc[c], a[c]);
                    }
                } else {
                    let ma = matrix!(row, s);
                    for c in 0..COLUMNS {
                        row_acc[c] = _mm512_xor_si512(row_acc[c], multiply(a[c], ma));
                    }
                }
            }
        }
        // SAFETY: `ROWS == outs.len()` (dispatch matched on it); each output is valid for `len`
        // bytes; with NONTEMPORAL the caller checked 64-byte alignment.
        unsafe { store_rows::<ROWS, NONTEMPORAL>(job, offset, &acc) };
        offset += BLOCK_BYTES;
    }
    if NONTEMPORAL {
        _mm_sfence();
    }
}

/// Two output rows over exactly `K` sources. With the count known at compile time the source
/// loop unrolls completely: every source gets its own load instructions, which the L1 stride
/// prefetcher can follow, and the pointers stay in registers. Measured (interleaved A/B,
/// 2026-11-22, k = 10): P+Q +6% at 16 KiB and +12% at 64 KiB over [`dot_rows`]. Three rows
/// specialised the same way spill registers and run at half speed, so they stay generic.
///
/// # Safety
/// See [`dot`]; additionally `job.srcs.len() == K` and `job.outs.len() == 2`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn dot_fixed_sources<const K: usize, const FIRST_XOR: bool, const NONTEMPORAL: bool>(
    job: &DotJob<'_>,
) {
    const ROWS: usize = 2;
    assert!(job.srcs.len() == K && job.outs.len() == ROWS);
    let srcs: [*const u8; K] = core::array::from_fn(|s| job.srcs[s]);
    let coefs = &job.coefs;
    let mut offset = 0;
    while offset < job.len {
        let mut acc = [[_mm512_setzero_si512(); COLUMNS]; ROWS];
        let mut s = 0;
        while s < K {
            if NONTEMPORAL {
                prefetch_ahead(srcs[s].wrapping_add(offset));
                if s + 1 < K {
                    prefetch_ahead(srcs[s + 1].wrapping_add(offset));
                }
            }
            if s + 1 == K {
                // SAFETY: `s < K`; each source is valid for `len` bytes.
                let a = unsafe { load_block(srcs[s].add(offset)) };
                for (row, row_acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the tables cover every (row, source) pair of the job.
                    let ma = unsafe { broadcast_matrix(coefs, row, s) };
                    for c in 0..COLUMNS {
                        let term = if FIRST_XOR && row == 0 { a[c] } else { multiply(a[c], ma) };
                        row_acc[c] = _mm512_xor_si512(row_acc[c], term);
                    }
                }
                break;
            }
            // SAFETY: `s + 1 < K`; each source is valid for `len` bytes and
            // `offset + BLOCK_BYTES <= len`.
            let (a, b) =
                unsafe { (load_block(srcs[s].add(offset)), load_block(srcs[s + 1].add(offset))) };
            for (row, row_acc) in acc.iter_mut().enumerate() {
                if FIRST_XOR && row == 0 {
                    for c in 0..COLUMNS {
                        row_acc[c] = xor3(row_acc[c], a[c], b[c]);
                    }
                } else {
                    // SAFETY: the tables cover every (row, source) pair of the job.
                    let (ma, mb) = unsafe {
                        (broadcast_matrix(coefs, row, s), broadcast_matrix(coefs, row, s + 1))
                    };
                    for c in 0..COLUMNS {
                        row_acc[c] = xor3(row_acc[c], multiply(a[c], ma), multiply(b[c], mb));
                    }
                }
            }
            s += 2;
        }
        // SAFETY: as in `dot_rows`.
        unsafe { store_rows::<ROWS, NONTEMPORAL>(job, offset, &acc) };
        offset += BLOCK_BYTES;
    }
    if NONTEMPORAL {
        _mm_sfence();
    }
}

/// Store a block of accumulators to the outputs at `offset`.
///
/// # Safety
/// `ROWS <= outs.len()`; each output is valid for `offset + BLOCK_BYTES` bytes; with
/// NONTEMPORAL every output is 64-byte aligned.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_rows<const ROWS: usize, const NONTEMPORAL: bool>(
    job: &DotJob<'_>,
    offset: usize,
    acc: &[[__m512i; COLUMNS]; ROWS],
) {
    for (row, row_acc) in acc.iter().enumerate() {
        // SAFETY: guaranteed by the caller.
        unsafe {
            let out = job.outs.get_unchecked(row).add(offset);
            for (c, vector) in row_acc.iter().enumerate() {
                let dst = out.add(c * VECTOR_BYTES);
                if NONTEMPORAL {
                    _mm512_stream_si512(dst.cast(), *vector);
                } else {
                    _mm512_storeu_si512(dst.cast(), *vector);
                }
            }
        }
    }
}

/// # Safety
/// The job satisfies the kernel contract and the CPU has AVX-512F/BW and GFNI.
pub(crate) unsafe fn update(job: &UpdateJob<'_>) {
    match job.parity.len() {
        // SAFETY: forwarded contract.
        1 => unsafe { update_rows::<1>(job) },
        // SAFETY: forwarded contract.
        2 => unsafe { update_rows::<2>(job) },
        // SAFETY: forwarded contract.
        3 => unsafe { update_rows::<3>(job) },
        rows => unreachable!("{rows} parity rows: checked by the caller"),
    }
}

/// # Safety
/// See [`update`].
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn update_rows<const ROWS: usize>(job: &UpdateJob<'_>) {
    let coefs = job.coefs;
    let mut matrices = [_mm512_setzero_si512(); ROWS];
    let mut is_xor = [false; ROWS];
    for row in 0..ROWS {
        let index = coefs.index(row, job.column);
        matrices[row] = _mm512_set1_epi64(coefs.affine[index] as i64);
        is_xor[row] = coefs.gf[index] == 1;
    }
    let mut offset = 0;
    while offset < job.len {
        // SAFETY: old and new are valid for `len` bytes and `offset + BLOCK_BYTES <= len`.
        let (old, new) =
            unsafe { (load_block(job.old.add(offset)), load_block(job.new.add(offset))) };
        let mut delta = [_mm512_setzero_si512(); COLUMNS];
        for c in 0..COLUMNS {
            delta[c] = _mm512_xor_si512(old[c], new[c]);
        }
        for row in 0..ROWS {
            // SAFETY: `row < parity.len()`; each parity buffer is valid for `len` bytes and is
            // only touched here, read before written.
            unsafe {
                let parity = job.parity.get_unchecked(row).add(offset);
                let current = load_block(parity);
                for c in 0..COLUMNS {
                    let term =
                        if is_xor[row] { delta[c] } else { multiply(delta[c], matrices[row]) };
                    let updated = _mm512_xor_si512(current[c], term);
                    _mm512_storeu_si512(parity.add(c * VECTOR_BYTES).cast(), updated);
                }
            }
        }
        offset += BLOCK_BYTES;
    }
}

/// XOR-fold a buffer with 64-byte loads, four independent accumulators; see
/// [`crate::read_probe`].
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn read_probe(buffer: &[u8]) -> u64 {
    let mut acc = [_mm512_setzero_si512(); COLUMNS];
    let mut blocks = buffer.chunks_exact(BLOCK_BYTES);
    for block in &mut blocks {
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: the block holds BLOCK_BYTES = COLUMNS * 64 bytes.
            let v = unsafe { _mm512_loadu_si512(block.as_ptr().add(c * VECTOR_BYTES).cast()) };
            *a = _mm512_xor_si512(*a, v);
        }
    }
    let folded = xor3(acc[0], acc[1], _mm512_xor_si512(acc[2], acc[3]));
    let mut words = [0u64; 8];
    // SAFETY: `words` is 64 writable bytes.
    unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast(), folded) };
    let tail = blocks.remainder().iter().fold(0u64, |a, &b| a.rotate_left(8) ^ u64::from(b));
    words.iter().fold(tail, |a, &w| a ^ w)
}
