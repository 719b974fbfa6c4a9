//! What a completion result means, for callers of [`crate::Ring::reap`].
//!
//! Owns: the convention for raw CQE results. A `Read`/`Write` result is the number of bytes
//! transferred, or `-errno`; fewer bytes than asked (including 0 at or past the end of a
//! device) is a short transfer, which the ring never retries by itself. Every other op
//! succeeds with 0.
//!
//! Invariants: the functions are pure; they never panic, whatever the kernel returned.
//!
//! Fault model: a result larger than what was asked cannot come from a correct kernel; it is
//! reported as [`TransferError::Unexpected`] rather than trusted.
//!
//! Limits: transfers are at most `u32::MAX` bytes (an SQE's length field).

use std::io;

/// Why a completion is not a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("{}", io::Error::from_raw_os_error(*errno))]
    Errno { errno: i32 },
    #[error("short transfer: {done_bytes} of {len_bytes} bytes")]
    Short { done_bytes: u32, len_bytes: u32 },
    #[error("unexpected completion result {result} for {len_bytes} bytes")]
    Unexpected { result: i32, len_bytes: u32 },
}

impl TransferError {
    /// The errno, if the kernel reported one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            TransferError::Errno { errno } => Some(*errno),
            _ => None,
        }
    }
}

/// Classify the result of a `Read`/`Write` (fixed or not) of `len_bytes`: `Ok` only when
/// every byte was transferred. On [`TransferError::Short`] the caller may resubmit the rest
/// (`done_bytes..len_bytes`) once and treat a second short transfer as an IO error.
pub fn check_transfer(result: i32, len_bytes: u32) -> Result<(), TransferError> {
    match u32::try_from(result) {
        Err(_) => Err(TransferError::Errno { errno: result.saturating_neg() }),
        Ok(done_bytes) if done_bytes == len_bytes => Ok(()),
        Ok(done_bytes) if done_bytes < len_bytes => {
            Err(TransferError::Short { done_bytes, len_bytes })
        }
        Ok(_) => Err(TransferError::Unexpected { result, len_bytes }),
    }
}

/// Classify the result of a `Flush`, `Discard` or `WriteZeroes`: `Ok` when it is 0.
pub fn check_status(result: i32) -> Result<(), TransferError> {
    match result {
        0 => Ok(()),
        negative if negative < 0 => Err(TransferError::Errno { errno: negative.saturating_neg() }),
        _ => Err(TransferError::Unexpected { result, len_bytes: 0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_classified() {
        assert_eq!(check_transfer(4096, 4096), Ok(()));
        let short = TransferError::Short { done_bytes: 512, len_bytes: 4096 };
        assert_eq!(check_transfer(512, 4096), Err(short));
        let eof = TransferError::Short { done_bytes: 0, len_bytes: 4096 };
        assert_eq!(check_transfer(0, 4096), Err(eof));
        assert_eq!(
            check_transfer(-libc::EIO, 4096),
            Err(TransferError::Errno { errno: libc::EIO })
        );
        assert_eq!(check_transfer(-libc::EIO, 4096).unwrap_err().errno(), Some(libc::EIO));
        assert!(matches!(check_transfer(8192, 4096), Err(TransferError::Unexpected { .. })));
        assert!(matches!(check_transfer(i32::MIN, 1), Err(TransferError::Errno { .. })));
        assert_eq!(check_status(0), Ok(()));
        assert_eq!(check_status(-libc::EBADF), Err(TransferError::Errno { errno: libc::EBADF }));
        assert!(matches!(check_status(3), Err(TransferError::Unexpected { .. })));
    }

    #[test]
    fn errno_display_is_the_os_message() {
        let text = TransferError::Errno { errno: libc::ENOSPC }.to_string();
        assert!(text.contains("No space left"), "{text}");
    }
}
