//! flashraid's benchmark lab.
//!
//! Owns: benchmarks that are code in the repository, with a documented command each, that
//! report ratios measured in one run (flashraid against a baseline on the same machine at the
//! same time) rather than absolute numbers alone, because the machines are shared and noisy.
//!
//! Today: [`parity`] (`flashraid bench parity`) and [`engine`] (`flashraid bench engine`, the
//! in-process load generator with its raw-member "hardware" column, in [`load`]). The fio/SNIA
//! lab (issue 6) lands here later.

pub mod engine;
pub mod load;
pub mod parity;
pub mod rebuild;
mod timing;

pub use timing::{Measurement, median};
