//! flashraid's benchmark lab, pure logic (issue 6).
//!
//! Layering: this crate is the deterministic core of the lab. It does no IO, spawns no
//! processes, reads no clock and starts no threads; everything here is a function over data, so
//! every rule of the method (benchmark-method.md §2 and §7) is unit-tested. A runner at the edge
//! (elsewhere) prepares targets, writes the job files rendered here, runs fio, stores its raw
//! JSON next to the derived results, feeds the parsed results back, and asks when to stop.
//!
//! ```text
//!   profile  --plan, job files-->  runner (edge: fio, arrays, files)
//!      ^                              |  raw fio JSON
//!      |                              v
//!   steady  <--tracking values--  fio (parse)  -->  report (RunReport, CSV, Markdown, HTML)
//! ```
//!
//! Modules:
//! * [`steady`]: SNIA steady state over the last five rounds and the stop rule (25 rounds).
//! * [`fio`]: fio 3.33 `json`/`json+` output into per-element results.
//! * [`profile`]: the seven profiles, SNIA presets and modes, element matrices, targets, and
//!   the fio job files of a round and of WIPC.
//! * [`report`]: the run report (serde), its long CSV, Markdown and self-contained HTML with
//!   inline SVG charts, and side-by-side comparison of earlier reports.
//! * [`vm`], [`files`], [`degraded`]: the non-SNIA profiles' job files (where not in
//!   `profile`), results and reports: vm-images; video-frames and small-files; degraded-rebuild.
//! * [`postmark`]: small-files' PostMark run (its command file, the parse of its report).
//!
//! Honesty rules carried in types: every report has a [`profile::ConformanceLabel`]; quick mode
//! is always `quick-smoke`; steady state is computed here from per-round values, never taken
//! from fio's own `--steadystate`, which judges one job's seconds rather than a matrix's rounds.

#![forbid(unsafe_code)]

mod chart;
pub mod degraded;
pub mod files;
pub mod fio;
pub mod merge;
pub mod postmark;
pub mod profile;
pub mod report;
pub mod steady;
pub mod vm;
