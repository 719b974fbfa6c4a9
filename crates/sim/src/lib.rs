//! flashraid's simulator: the real engine and control plane over simulated members.
//!
//! Owns: simulated members ([`member`]) with a volatile write cache, power loss and faults; a
//! driver ([`driver`]) that completes IO in a seeded random order; and a whole-array harness
//! ([`array`]) for model-based tests and seeded fault and power-loss simulation.
//!
//! Deterministic: every choice comes from a seed, and a run is replayed by running it with
//! the same seed. Single-threaded.

pub mod array;
pub mod driver;
pub mod member;

pub use array::{SimArray, SimOptions, Ticket};
pub use member::{SimError, SimMember};
