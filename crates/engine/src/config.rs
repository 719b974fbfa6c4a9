//! Limits and tunables of one shard. Every queue and pool the shard owns is sized from here,
//! once, at start.

use crate::EngineError;

/// The longest merge window accepted, in microseconds: a window is for neighbouring writes
/// already on their way, and a mistaken huge one would hold writes for minutes.
pub const MERGE_WINDOW_US_MAX: u32 = 100_000;
/// The member timeout when none is set: twice Linux's default NVMe and SCSI command timeout
/// (30 s), so the kernel gives up on a hung command (and reports an error) first.
pub const MEMBER_IO_TIMEOUT_US_DEFAULT: u64 = 60_000_000;
/// The longest member timeout: an hour.
pub const MEMBER_IO_TIMEOUT_US_MAX: u64 = 3_600_000_000;
/// The shortest member timeout (but 0, never): a second. Far above how long a reactor goes
/// between ticks when idle (a few milliseconds), so a tick gap of half the timeout means the
/// process did not run, not that it slept.
pub const MEMBER_IO_TIMEOUT_US_MIN: u64 = 1_000_000;

/// Whether the array's members may be written while it runs. Fixed at the start (it is not a
/// tunable): a read-only array (`serve --read-only`, like `mdadm --assemble --readonly`)
/// writes nothing to any member, so its shards refuse writes, discards and zeroes with
/// `RequestError::ReadOnly`, start no resync (dirty regions stay untrusted: reads that
/// would reconstruct there fail rather than guess), do not rewrite a range that failed to
/// read (it is served from redundancy), and end a shutdown without flushing or clearing
/// the bitmap. Rebuilds and scrubs are not started on them (the metadata owner refuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayAccess {
    ReadWrite,
    ReadOnly,
}

/// One shard's configuration. Safety-relevant limits have no `Default`; use
/// [`ShardConfig::recommended`] and adjust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// Requests accepted and not yet replied to.
    pub requests_max: usize,
    /// Stripes with an operation running or queued.
    pub stripes_active_max: usize,
    /// Memory for read and parity scratch buffers, in bytes.
    pub scratch_bytes: usize,
    /// Read errors a member may return before the shard fails it.
    pub member_read_errors_max: u32,
    /// How long a cached write that leaves its stripe partial (parity levels) may wait for
    /// neighbouring writes to fill the stripe, in microseconds (0: never wait). A stripe
    /// filled meanwhile is written whole, with no member reads; otherwise its writes start
    /// when the window ends. A read, zero or FUA write to the stripe starts it at once.
    pub merge_window_us: u64,
    /// How long a write-intent bitmap region stays set after its last write, in microseconds.
    pub bitmap_clear_delay_us: u64,
    /// Resync operations in flight (background initialisation, and the dirty regions after
    /// an unclean shutdown).
    pub resync_stripes_max: usize,
    /// Resync rate limit for the whole array, in bytes of each member swept per second (a
    /// chunk per stripe; each shard takes its share); 0: as fast as `resync_stripes_max`
    /// allows.
    pub resync_rate_bytes_per_s: u64,
    /// Rebuild operations (one stripe each) in flight per shard.
    pub rebuild_stripes_max: usize,
    /// Rebuild operations in flight per shard while foreground requests are in flight (the
    /// rebuild's priority: lower keeps foreground latency down, higher rebuilds sooner under
    /// load). At most `rebuild_stripes_max`.
    pub rebuild_busy_stripes_max: usize,
    /// How long a stalled rebuild (a stripe it could not reconstruct) waits before it tries
    /// again from its low-water mark, in microseconds.
    pub rebuild_stall_retry_us: u64,
    /// Scrub operations (one stripe each) in flight per shard.
    pub scrub_stripes_max: usize,
    /// Rebuild rate limit for the whole array, in bytes written to the replacement member
    /// per second (each shard takes its share); 0: as fast as `rebuild_stripes_max` allows.
    pub rebuild_rate_bytes_per_s: u64,
    /// Rebuild rate while the array is busy (a foreground request in the last 2 ms), for the
    /// whole array; 0: no separate limit. Like md's speed_limit_min: the rebuild runs at full
    /// speed when idle and steps down to this under load.
    pub rebuild_busy_rate_bytes_per_s: u64,
    /// Bytes of every member one shard's run of neighbouring stripes covers (0: one stripe
    /// per run, stripes dealt to shards one by one). Longer runs let neighbouring chunks of
    /// a large request be merged into one member IO on io_uring members, at the cost of
    /// putting more of one large request on one shard (see `crate::owner`). Not stored on
    /// disk; the router and every shard must be built with the same value.
    pub stripe_run_member_bytes: u64,
    /// How long a member may have IO outstanding with none of it completing before the
    /// shard reports it stalled (`ShardEvent::MemberStalled`; the metadata owner fails it
    /// where the array survives that), in microseconds (0: never; else
    /// `MEMBER_IO_TIMEOUT_US_MIN` to `_MAX`). Longer than the kernel's own
    /// command timeout by default, so a device the kernel is still retrying or resetting
    /// is not failed before the kernel gives up on it.
    pub member_io_timeout_us: u64,
}

impl ShardConfig {
    /// Sound defaults for a member of NVMe-class speed.
    pub fn recommended() -> Self {
        Self {
            requests_max: 1024,
            stripes_active_max: 1024,
            scratch_bytes: 32 << 20,
            member_read_errors_max: 32,
            merge_window_us: 0,
            bitmap_clear_delay_us: 5_000_000,
            resync_stripes_max: 8,
            resync_rate_bytes_per_s: 0,
            rebuild_stripes_max: 8,
            rebuild_busy_stripes_max: 1,
            rebuild_stall_retry_us: 10_000_000,
            scrub_stripes_max: 4,
            rebuild_rate_bytes_per_s: 0,
            rebuild_busy_rate_bytes_per_s: 200 << 20,
            stripe_run_member_bytes: 0,
            member_io_timeout_us: MEMBER_IO_TIMEOUT_US_DEFAULT,
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |what| Err(EngineError::Config(what));
        if self.stripe_run_member_bytes > 64 << 20 {
            return bad("stripe_run_member_bytes must be at most 64 MiB");
        }
        if self.requests_max == 0 || self.requests_max > 1 << 20 {
            return bad("requests_max must be 1 to 1048576");
        }
        if self.stripes_active_max == 0 || self.stripes_active_max > 1 << 20 {
            return bad("stripes_active_max must be 1 to 1048576");
        }
        // Op slots (stripes_active_max and the resync, rebuild and scrub maxima) and
        // request slots travel in 24-bit fields of member IO tokens; these bounds keep both
        // far below 2^24.
        if self.resync_stripes_max == 0 || self.resync_stripes_max > 1 << 16 {
            return bad("resync_stripes_max must be 1 to 65536");
        }
        if self.rebuild_stripes_max == 0 || self.rebuild_stripes_max > 1 << 16 {
            return bad("rebuild_stripes_max must be 1 to 65536");
        }
        if self.rebuild_busy_stripes_max == 0
            || self.rebuild_busy_stripes_max > self.rebuild_stripes_max
        {
            return bad("rebuild_busy_stripes_max must be 1 to rebuild_stripes_max");
        }
        if self.merge_window_us > u64::from(MERGE_WINDOW_US_MAX) {
            return bad("merge_window_us must be at most 100000 (0.1 s)");
        }
        let timeout = self.member_io_timeout_us;
        if timeout != 0 && !(MEMBER_IO_TIMEOUT_US_MIN..=MEMBER_IO_TIMEOUT_US_MAX).contains(&timeout)
        {
            return bad("member_io_timeout_us must be 0 (never) or 1 s to an hour");
        }
        if self.rebuild_stall_retry_us == 0 {
            return bad("rebuild_stall_retry_us must be at least 1");
        }
        if self.scrub_stripes_max == 0 || self.scrub_stripes_max > 1 << 16 {
            return bad("scrub_stripes_max must be 1 to 65536");
        }
        Ok(())
    }
}
