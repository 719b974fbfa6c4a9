//! Cross-thread wake-up for a thread blocked in [`crate::Ring::submit`].
//!
//! Owns: one eventfd, shared by every clone of a [`Waker`] and by any ring it is armed on (a
//! ring keeps a clone while its read is in flight, so the descriptor cannot close under the
//! kernel).
//!
//! Invariants: the eventfd is non-blocking, so [`Waker::wake`] never blocks; its counter only
//! grows between reads, so wakes are never lost: a wake before the ring arms the read
//! completes the read at once.
//!
//! Fault model: `wake` cannot fail in a way the caller can act on. The only write error on an
//! eventfd is `EAGAIN` when the counter is at its maximum, and then a wake is already pending;
//! it is ignored.
//!
//! Limits: wakes coalesce: several `wake` calls before the ring's read complete it once (the
//! read returns 8 bytes holding the count). Wakes may be spurious (a ring dropped with the
//! waker armed wakes it to finish its read), so a woken thread re-checks its inbox. Arm one
//! waker on one ring: two rings reading the same eventfd would split its wakes between them.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use crate::RingError;
use crate::sys;

/// A handle that wakes the ring it is armed on ([`crate::Ring::arm_waker`]). `Clone + Send +
/// Sync`: hand clones to any thread.
#[derive(Debug, Clone)]
pub struct Waker {
    eventfd: Arc<File>,
}

impl Waker {
    pub fn new() -> Result<Waker, RingError> {
        let eventfd = sys::eventfd().map_err(|source| RingError::Waker { source })?;
        Ok(Waker { eventfd: Arc::new(File::from(eventfd)) })
    }

    /// Wake the ring this waker is armed on (or the next ring that arms it).
    pub fn wake(&self) {
        let one: u64 = 1;
        // EAGAIN (counter saturated) means a wake is already pending; nothing else can fail
        // on a valid eventfd with an 8-byte write.
        let _ = (&*self.eventfd).write(&one.to_ne_bytes());
    }

    /// Consume pending wakes (for a thread that waits on the descriptor with `poll(2)`
    /// rather than through a ring). Never blocks.
    pub fn drain(&self) {
        let mut count = [0u8; 8];
        // EAGAIN: nothing pending. The eventfd is non-blocking, so this never waits.
        let _ = std::io::Read::read(&mut &*self.eventfd, &mut count);
    }

    /// The eventfd, for rings that read it.
    pub fn raw_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }
}
