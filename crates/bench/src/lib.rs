//! flashraid's benchmark lab.
//!
//! Owns: benchmarks that are code in the repository, with a documented command each, that
//! report ratios measured in one run (flashraid against a baseline on the same machine at the
//! same time) rather than absolute numbers alone, because the machines are shared and noisy.
//!
//! Today: [`parity`], the parity-kernel benchmark behind `flashraid bench parity`. The fio/SNIA
//! lab (issue 6) and the engine load generator (issue 3) land here later.

pub mod parity;
mod timing;

pub use timing::{Measurement, median};
