//! Kernel selection and the contract every kernel implements.
//!
//! Owns: the [`Kernel`] enum, CPU feature detection (once per process), and the two entry points
//! each kernel provides:
//! - `dot`: `outs[r] = sum over s of coef(r, s) * srcs[s]` over GF(2^8), with row 0 optionally
//!   plain XOR (every coefficient 1: P, or one data chunk from P);
//! - `update`: `parity[r] ^= coef(r) * (old ^ new)`, the read-modify-write delta, in place.
//!
//! Contract (the `unsafe` in every kernel rests on it; [`crate::Codec`] checks it before calling):
//! every pointer is valid for `len` bytes; `len` is a non-zero multiple of [`BLOCK_BYTES`];
//! outputs do not overlap each other or the sources (update's parity is read and written in
//! place, and nothing else overlaps it); `srcs.len()` is at most `DATA_CHUNKS_MAX`, outputs at
//! most `PARITY_CHUNKS_MAX`; the coefficient tables cover every (row, source) pair read.
//! Non-temporal stores are used only when every output is 64-byte aligned; otherwise the kernel
//! falls back to ordinary stores. Kernels allocate nothing.

pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx512;

use crate::matrix::Coefficients;
use std::fmt;
use std::str::FromStr;

/// Kernels process whole blocks of this many bytes; chunk lengths are multiples of 512, so a
/// block never straddles the end.
pub(crate) const BLOCK_BYTES: usize = 256;

/// Where parity stores go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Ordinary stores: the result stays in cache. Right when it is read again soon.
    Cached,
    /// Non-temporal stores that bypass the caches: right for parity that goes straight to the
    /// devices, and for cold stripes. Used only when every output is 64-byte aligned.
    NonTemporal,
}

/// One implementation of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// Byte-at-a-time table lookups: the reference every other kernel is tested against.
    Scalar,
    /// AVX2 with `vpshufb` nibble tables (Haswell and later, Zen 1-3).
    Avx2,
    /// AVX2 registers with GFNI affine multiplies (Intel client cores, Zen 4 in 256-bit mode).
    Avx2Gfni,
    /// AVX-512 with GFNI (Ice Lake-SP, Sapphire Rapids and later, Zen 4/5).
    Avx512Gfni,
}

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 4] =
        [Kernel::Scalar, Kernel::Avx2, Kernel::Avx2Gfni, Kernel::Avx512Gfni];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx2Gfni => "avx2-gfni",
            Kernel::Avx512Gfni => "avx512-gfni",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Kernels this CPU can run, slowest first.
    pub fn supported() -> Vec<Kernel> {
        Self::ALL.into_iter().filter(|k| k.is_supported()).collect()
    }

    /// The fastest kernel this CPU runs. Detected once per process.
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            *Self::supported().last().expect("the scalar kernel is always supported")
        })
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kernel {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|k| k.name() == text).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            format!("unknown parity kernel {text:?}; expected one of {}", names.join(", "))
        })
    }
}

/// A dot-product job, already validated by the caller (see the module contract).
#[derive(Clone, Copy)]
pub(crate) struct DotJob<'a> {
    pub len: usize,
    pub srcs: &'a [*const u8],
    pub outs: &'a [*mut u8],
    pub coefs: Coefficients<'a>,
    /// Row 0's coefficients are all 1.
    pub first_row_xor: bool,
    pub stores: Stores,
}

/// A read-modify-write job: `parity[r] ^= coefs(r, column) * (old ^ new)`.
#[derive(Clone, Copy)]
pub(crate) struct UpdateJob<'a> {
    pub len: usize,
    pub old: *const u8,
    pub new: *const u8,
    pub parity: &'a [*mut u8],
    pub coefs: Coefficients<'a>,
    pub column: usize,
}

impl DotJob<'_> {
    /// Non-temporal stores need 64-byte aligned outputs; otherwise fall back to cached stores.
    pub fn nontemporal(&self) -> bool {
        self.stores == Stores::NonTemporal
            && self.outs.iter().all(|&p| (p as usize).is_multiple_of(64))
    }
}

/// Run a dot-product job on `kernel`.
///
/// # Safety
/// The job satisfies the module contract and `kernel.is_supported()`.
pub(crate) unsafe fn run_dot(kernel: Kernel, job: &DotJob<'_>) {
    debug_assert!(job.len > 0 && job.len.is_multiple_of(BLOCK_BYTES));
    debug_assert!(!job.outs.is_empty() && job.outs.len() <= crate::PARITY_CHUNKS_MAX);
    match kernel {
        // SAFETY: forwarded contract.
        Kernel::Scalar => unsafe { scalar::dot(job) },
        // SAFETY: forwarded contract; the caller checked CPU support.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86_avx2::dot_pshufb(job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2Gfni => unsafe { x86_avx2::dot_gfni(job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Gfni => unsafe { x86_avx512::dot(job) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("unsupported kernels are refused by Codec::new"),
    }
}

/// Run an update job on `kernel`.
///
/// # Safety
/// The job satisfies the module contract and `kernel.is_supported()`.
pub(crate) unsafe fn run_update(kernel: Kernel, job: &UpdateJob<'_>) {
    debug_assert!(job.len > 0 && job.len.is_multiple_of(BLOCK_BYTES));
    match kernel {
        // SAFETY: forwarded contract.
        Kernel::Scalar => unsafe { scalar::update(job) },
        // SAFETY: forwarded contract; the caller checked CPU support.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86_avx2::update_pshufb(job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2Gfni => unsafe { x86_avx2::update_gfni(job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Gfni => unsafe { x86_avx512::update(job) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("unsupported kernels are refused by Codec::new"),
    }
}
