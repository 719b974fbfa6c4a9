//! flashraid parity: XOR and GF(2^8) P/Q/R kernels for RAID 5, 6 and 7.3.
//!
//! Owns: the parity code (P = XOR, Q = sum of 2^j D_j as in Linux md RAID 6, R = sum of
//! 4^j D_j), encode, the read-modify-write delta update, and reconstruction of up to three
//! erased chunks (data and parity mixed) in one pass, on a scalar reference kernel and SIMD
//! kernels chosen once at run time (AVX-512+GFNI, AVX2+GFNI, AVX2 `pshufb`).
//!
//! Invariants:
//! - P and Q are byte-identical to Linux md RAID 6; all three rows are byte-identical to ISA-L's
//!   `gf_gen_rs_matrix` (tests check both against ISA-L).
//! - Every kernel produces exactly the scalar reference's bytes (differential tests).
//! - Encode, update and reconstruct allocate nothing and do no matrix work; a
//!   [`ReconstructPlan`] carries the decode coefficients for one erasure pattern and is built
//!   once, then reused for every stripe with that pattern.
//! - Inputs are validated once at this boundary; past it the kernels trust their arguments.
//!
//! Limits: 2..=255 data chunks, 1..=3 parity chunks, chunk lengths a multiple of 512 bytes from
//! 512 B to 4 MiB, no alignment required (64-byte aligned buffers go faster, and non-temporal
//! stores need it). The API names parity rows by index so more rows (Cauchy-derived, for four or
//! more parity chunks) can be added without changing callers; see `matrix.rs`.
//!
//! No IO, no clock, no threads, no randomness: this crate is part of the deterministic core.

pub mod gf;
mod kernels;
mod matrix;

pub use kernels::{Kernel, Stores};
pub use matrix::{ReconstructPlan, coefficient};

use kernels::{DotJob, UpdateJob};

/// Fewest data chunks in a stripe.
pub const DATA_CHUNKS_MIN: usize = 2;
/// Most data chunks in a stripe: the generator {02} has order 255.
pub const DATA_CHUNKS_MAX: usize = 255;
/// Most parity chunks (P, Q, R).
pub const PARITY_CHUNKS_MAX: usize = 3;
/// Chunk lengths are multiples of this.
pub const CHUNK_BYTES_MULTIPLE: usize = 512;
/// Shortest chunk.
pub const CHUNK_BYTES_MIN: usize = 512;
/// Longest chunk.
pub const CHUNK_BYTES_MAX: usize = 4 << 20;

const _: () = assert!(CHUNK_BYTES_MULTIPLE.is_multiple_of(kernels::BLOCK_BYTES));
const _: () =
    assert!(DATA_CHUNKS_MAX <= 255, "coefficients are powers of a generator of order 255");

/// Why a parity call was refused. Nothing is written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParityError {
    #[error("{count} data chunks: a stripe has {DATA_CHUNKS_MIN} to {DATA_CHUNKS_MAX}")]
    DataChunkCount { count: usize },
    #[error("{count} parity chunks: a stripe has 1 to {PARITY_CHUNKS_MAX}")]
    ParityChunkCount { count: usize },
    #[error("the {kernel} parity kernel needs CPU features this machine lacks")]
    KernelUnsupported { kernel: Kernel },
    #[error("expected {expected} {what} buffers, got {actual}")]
    BufferCount { what: &'static str, expected: usize, actual: usize },
    #[error(
        "chunk length {len_bytes} B: must be a multiple of {CHUNK_BYTES_MULTIPLE} from \
         {CHUNK_BYTES_MIN} to {CHUNK_BYTES_MAX}"
    )]
    ChunkLength { len_bytes: usize },
    #[error("chunk lengths differ: {first_bytes} B and {other_bytes} B")]
    LengthMismatch { first_bytes: usize, other_bytes: usize },
    #[error("chunk index {index} is outside a stripe of {chunks} chunks")]
    ChunkIndexOutOfRange { index: usize, chunks: usize },
    #[error("chunk index {index} appears twice")]
    DuplicateChunkIndex { index: usize },
    #[error("{erased} chunks erased: {parity_chunks} parity chunks recover at most that many")]
    TooManyErasures { erased: usize, parity_chunks: usize },
    #[error("chunk {index} is a reconstruct target but not erased")]
    TargetNotErased { index: usize },
    #[error("the plan is for a {plan_data}+{plan_parity} stripe, the codec is {data}+{parity}")]
    PlanShape { plan_data: usize, plan_parity: usize, data: usize, parity: usize },
}

/// Parity operations for one stripe shape (k data + m parity chunks) on one kernel.
///
/// Cheap to copy and share: it holds no buffers. Build one per array.
#[derive(Clone, Copy, Debug)]
pub struct Codec {
    data_chunks: usize,
    parity_chunks: usize,
    kernel: Kernel,
}

fn check_len(len_bytes: usize) -> Result<(), ParityError> {
    if !len_bytes.is_multiple_of(CHUNK_BYTES_MULTIPLE)
        || !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&len_bytes)
    {
        return Err(ParityError::ChunkLength { len_bytes });
    }
    Ok(())
}

fn check_count(what: &'static str, expected: usize, actual: usize) -> Result<(), ParityError> {
    if expected != actual {
        return Err(ParityError::BufferCount { what, expected, actual });
    }
    Ok(())
}

/// One common, valid length for all the given lengths.
fn common_len(mut lens: impl Iterator<Item = usize>) -> Result<usize, ParityError> {
    let first_bytes = lens.next().unwrap_or(0);
    check_len(first_bytes)?;
    for other_bytes in lens {
        if other_bytes != first_bytes {
            return Err(ParityError::LengthMismatch { first_bytes, other_bytes });
        }
    }
    Ok(first_bytes)
}

impl Codec {
    /// A codec on the fastest kernel this CPU runs.
    pub fn new(data_chunks: usize, parity_chunks: usize) -> Result<Self, ParityError> {
        Self::with_kernel(data_chunks, parity_chunks, Kernel::best())
    }

    /// A codec on a chosen kernel (tests and benchmarks force each one).
    pub fn with_kernel(
        data_chunks: usize,
        parity_chunks: usize,
        kernel: Kernel,
    ) -> Result<Self, ParityError> {
        if !(DATA_CHUNKS_MIN..=DATA_CHUNKS_MAX).contains(&data_chunks) {
            return Err(ParityError::DataChunkCount { count: data_chunks });
        }
        if !(1..=PARITY_CHUNKS_MAX).contains(&parity_chunks) {
            return Err(ParityError::ParityChunkCount { count: parity_chunks });
        }
        if !kernel.is_supported() {
            return Err(ParityError::KernelUnsupported { kernel });
        }
        Ok(Self { data_chunks, parity_chunks, kernel })
    }

    pub fn data_chunks(&self) -> usize {
        self.data_chunks
    }

    pub fn parity_chunks(&self) -> usize {
        self.parity_chunks
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Compute every parity chunk of a stripe from its data chunks.
    pub fn encode(
        &self,
        data: &[&[u8]],
        parity: &mut [&mut [u8]],
        stores: Stores,
    ) -> Result<(), ParityError> {
        check_count("data", self.data_chunks, data.len())?;
        check_count("parity", self.parity_chunks, parity.len())?;
        let len = common_len(data.iter().map(|d| d.len()).chain(parity.iter().map(|p| p.len())))?;
        let mut srcs = [std::ptr::null::<u8>(); DATA_CHUNKS_MAX];
        for (slot, chunk) in srcs.iter_mut().zip(data) {
            *slot = chunk.as_ptr();
        }
        let mut outs = [std::ptr::null_mut::<u8>(); PARITY_CHUNKS_MAX];
        for (slot, chunk) in outs.iter_mut().zip(parity.iter_mut()) {
            *slot = chunk.as_mut_ptr();
        }
        let job = DotJob {
            len,
            srcs: &srcs[..self.data_chunks],
            outs: &outs[..self.parity_chunks],
            coefs: matrix::encode_coefficients(),
            first_row_xor: true,
            stores,
        };
        // SAFETY: every pointer comes from a live slice of `len` bytes; `&[&[u8]]` and
        // `&mut [&mut [u8]]` cannot overlap; counts and length were checked above; the encode
        // tables cover every row and data position; the kernel was checked at construction.
        unsafe { kernels::run_dot(self.kernel, &job) };
        Ok(())
    }

    /// Read-modify-write update: data chunk `data_index` changes from `old` to `new`; bring
    /// every parity chunk up to date in place (`P ^= d`, `Q ^= 2^j d`, `R ^= 4^j d`, with
    /// `d = old ^ new`).
    pub fn update(
        &self,
        data_index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        if data_index >= self.data_chunks {
            return Err(ParityError::ChunkIndexOutOfRange {
                index: data_index,
                chunks: self.data_chunks,
            });
        }
        check_count("parity", self.parity_chunks, parity.len())?;
        let len =
            common_len([old.len(), new.len()].into_iter().chain(parity.iter().map(|p| p.len())))?;
        let mut outs = [std::ptr::null_mut::<u8>(); PARITY_CHUNKS_MAX];
        for (slot, chunk) in outs.iter_mut().zip(parity.iter_mut()) {
            *slot = chunk.as_mut_ptr();
        }
        let job = UpdateJob {
            len,
            old: old.as_ptr(),
            new: new.as_ptr(),
            parity: &outs[..self.parity_chunks],
            coefs: matrix::encode_coefficients(),
            column: data_index,
        };
        // SAFETY: pointers from live slices of `len` bytes; the parity slices are unique
        // borrows, so they overlap neither each other nor `old`/`new`; checked as in `encode`.
        unsafe { kernels::run_update(self.kernel, &job) };
        Ok(())
    }

    /// Build the decode plan for one erasure pattern: `erased` lists every chunk whose contents
    /// are unknown (data positions `0..k`, parity row r at `k + r`), `targets` the ones to
    /// rebuild. Build once per pattern and keep it; see [`ReconstructPlan`].
    pub fn plan_reconstruct(
        &self,
        erased: &[usize],
        targets: &[usize],
    ) -> Result<ReconstructPlan, ParityError> {
        ReconstructPlan::build(self.data_chunks, self.parity_chunks, erased, targets)
    }

    fn check_plan(&self, plan: &ReconstructPlan) -> Result<(), ParityError> {
        if plan.data_chunks != self.data_chunks || plan.parity_chunks != self.parity_chunks {
            return Err(ParityError::PlanShape {
                plan_data: plan.data_chunks,
                plan_parity: plan.parity_chunks,
                data: self.data_chunks,
                parity: self.parity_chunks,
            });
        }
        Ok(())
    }

    /// Rebuild `plan.targets()` from `plan.sources()`, given in those orders.
    pub fn reconstruct_from(
        &self,
        plan: &ReconstructPlan,
        sources: &[&[u8]],
        targets: &mut [&mut [u8]],
        stores: Stores,
    ) -> Result<(), ParityError> {
        self.check_plan(plan)?;
        check_count("source", plan.sources.len(), sources.len())?;
        check_count("target", plan.targets.len(), targets.len())?;
        if targets.is_empty() {
            return Ok(());
        }
        let len =
            common_len(sources.iter().map(|s| s.len()).chain(targets.iter().map(|t| t.len())))?;
        let mut srcs = [std::ptr::null::<u8>(); DATA_CHUNKS_MAX];
        for (slot, chunk) in srcs.iter_mut().zip(sources) {
            *slot = chunk.as_ptr();
        }
        let mut outs = [std::ptr::null_mut::<u8>(); PARITY_CHUNKS_MAX];
        for (slot, chunk) in outs.iter_mut().zip(targets.iter_mut()) {
            *slot = chunk.as_mut_ptr();
        }
        let job = DotJob {
            len,
            srcs: &srcs[..sources.len()],
            outs: &outs[..targets.len()],
            coefs: plan.coefficients(),
            first_row_xor: plan.first_row_xor,
            stores,
        };
        // SAFETY: as in `encode`; the plan's tables cover its targets x sources, and a plan
        // has at most PARITY_CHUNKS_MAX targets and DATA_CHUNKS_MAX sources by construction.
        unsafe { kernels::run_dot(self.kernel, &job) };
        Ok(())
    }

    /// Rebuild `plan.targets()` in place in a whole stripe: `stripe[i]` is chunk i (data, then
    /// parity). Chunks the plan neither reads nor writes may be empty slices.
    pub fn reconstruct(
        &self,
        plan: &ReconstructPlan,
        stripe: &mut [&mut [u8]],
        stores: Stores,
    ) -> Result<(), ParityError> {
        self.check_plan(plan)?;
        check_count("stripe", self.data_chunks + self.parity_chunks, stripe.len())?;
        if plan.targets.is_empty() {
            return Ok(());
        }
        // Gather pointers in plan order. Sources and targets are distinct chunks (a plan
        // invariant), so reading the ones while writing the others aliases nothing.
        let len =
            common_len(plan.sources.iter().chain(&plan.targets).map(|&chunk| stripe[chunk].len()))?;
        let mut srcs = [std::ptr::null::<u8>(); DATA_CHUNKS_MAX];
        for (slot, &chunk) in srcs.iter_mut().zip(&plan.sources) {
            *slot = stripe[chunk].as_ptr();
        }
        let mut outs = [std::ptr::null_mut::<u8>(); PARITY_CHUNKS_MAX];
        for (slot, &chunk) in outs.iter_mut().zip(&plan.targets) {
            *slot = stripe[chunk].as_mut_ptr();
        }
        let job = DotJob {
            len,
            srcs: &srcs[..plan.sources.len()],
            outs: &outs[..plan.targets.len()],
            coefs: plan.coefficients(),
            first_row_xor: plan.first_row_xor,
            stores,
        };
        // SAFETY: every pointer comes from a live chunk of `len` bytes of the exclusively
        // borrowed stripe; the plan's sources and targets are disjoint, so no output overlaps a
        // source or another output; the plan's tables cover its targets x sources.
        unsafe { kernels::run_dot(self.kernel, &job) };
        Ok(())
    }
}

/// Read every byte of `buffer` as fast as this CPU can and fold it into a value the optimiser
/// cannot discard. The parity benchmark uses it to measure the memory read bandwidth its
/// figures are compared with; it lives here because it is a SIMD loop.
pub fn read_probe(buffer: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if Kernel::Avx512Gfni.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { kernels::x86_avx512::read_probe(buffer) };
    }
    buffer.chunks(8).fold(0u64, |acc, word| {
        let mut bytes = [0u8; 8];
        bytes[..word.len()].copy_from_slice(word);
        acc ^ u64::from_le_bytes(bytes)
    })
}
