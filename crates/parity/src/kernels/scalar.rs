//! The scalar reference kernel: one byte at a time through the 64 KiB product table.
//!
//! It is deliberately the most obvious code that computes the definition, so the SIMD kernels
//! can be tested against it. It ignores `first_row_xor` (the coefficients say 1 anyway) and the
//! store hint. Roughly 1 GB/s: a fallback for CPUs without AVX2, not a fast path.

use super::{DotJob, UpdateJob};
use crate::gf::MUL;
use std::slice;

/// # Safety
/// The job satisfies the kernel contract in `kernels/mod.rs`.
pub(crate) unsafe fn dot(job: &DotJob<'_>) {
    for (r, &out_ptr) in job.outs.iter().enumerate() {
        // SAFETY: contract: `out_ptr` is valid for `len` bytes and overlaps no source or other
        // output, so a unique slice over it is sound while this loop runs.
        let out = unsafe { slice::from_raw_parts_mut(out_ptr, job.len) };
        out.fill(0);
        for (s, &src_ptr) in job.srcs.iter().enumerate() {
            // SAFETY: contract: `src_ptr` is valid for `len` bytes and not written by this job.
            let src = unsafe { slice::from_raw_parts(src_ptr, job.len) };
            let table = &MUL[usize::from(job.coefs.gf[job.coefs.index(r, s)])];
            for (o, &d) in out.iter_mut().zip(src) {
                *o ^= table[usize::from(d)];
            }
        }
    }
}

/// # Safety
/// The job satisfies the kernel contract in `kernels/mod.rs`.
pub(crate) unsafe fn update(job: &UpdateJob<'_>) {
    // SAFETY: contract: `old` and `new` are valid for `len` bytes and not written by this job.
    let (old, new) = unsafe {
        (slice::from_raw_parts(job.old, job.len), slice::from_raw_parts(job.new, job.len))
    };
    for (r, &parity_ptr) in job.parity.iter().enumerate() {
        // SAFETY: contract: each parity buffer is valid for `len` bytes and overlaps nothing else.
        let parity = unsafe { slice::from_raw_parts_mut(parity_ptr, job.len) };
        let table = &MUL[usize::from(job.coefs.gf[job.coefs.index(r, job.column)])];
        for ((p, &o), &n) in parity.iter_mut().zip(old).zip(new) {
            *p ^= table[usize::from(o ^ n)];
        }
    }
}
