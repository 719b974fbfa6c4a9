//! Faults injected into in-memory members: media errors, latency, torn and lost writes, power
//! loss, and a member that vanishes.
//!
//! Owns: [`Faults`] (one per [`MemMember`](crate::MemMember): what its next IOs suffer),
//! [`FaultRule`] (which IOs a fault hits), and [`PowerDomain`] (a power switch shared by
//! members). The member asks its `Faults` about every IO it serves, from the reactors' data
//! path and from the controller's metadata IO alike, so a fault hits the member as a device
//! fault would; only latency is the driver's (`MemDriver` delays completions, the controller's
//! synchronous metadata IO is not delayed).
//!
//! Every setting is an atomic, changed from any thread while reactors run, with no lock and
//! no allocation on the IO path. A rule is switched off while it is rewritten and switched on
//! last, so an IO concurrent with a change sees the old rule, no rule, or (for the fields
//! other than the range) a mix of the two; tests change rules between phases of a load.
//!
//! Fault model, in the order a write meets it: a vanished member fails everything with
//! `Gone`; a member whose power is cut acknowledges writes and flushes and persists nothing
//! (what reached it before the cut stays, as at the instant power goes); a write error fails
//! the write (`Media`) and persists nothing; a lost write is acknowledged and persists
//! nothing; a torn write persists a sector-aligned prefix and reports success or `Media`.
//! Reads fail with `Media` where the read rule fires, and may be healed by writes (a drive
//! remapping a bad sector). Reads after a power cut see what persisted.
//!
//! Limits: rule ranges are kept in 512-byte sectors in 32 bits (members up to 2 TiB); one
//! range per rule; a heal that would split a bad range leaves it whole. There is no volatile
//! write cache: a write is durable when it is persisted, and a power cut loses only the
//! writes that come after it (the simulator, `flashraid-sim`, models the cache).

use flashraid_engine::IoError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The unit of fault ranges and of torn-write prefixes.
pub const SECTOR_BYTES: u64 = 512;

/// Packed range meaning "no rule".
const RANGE_OFF: u64 = 0;
/// Packed range meaning "every IO, flushes included".
const RANGE_ALL: u64 = u64::MAX;
/// `fires_left` meaning "no limit".
const FIRES_UNLIMITED: u32 = u32::MAX;

/// Which IOs a [`FaultRule`] hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trigger {
    /// Only IOs overlapping `(offset_bytes, len_bytes)` (widened to whole sectors); `None`:
    /// every IO, flushes included.
    pub range_bytes: Option<(u64, u64)>,
    /// Hit every nth IO the range selects (1: each one).
    pub every_nth: u32,
    /// Stop after this many hits; `None`: never stop.
    pub hits_max: Option<u32>,
    /// Read rules only: a persisted write over the start or the end of the range (or all of
    /// it) makes that part good again, as a drive remaps a bad sector on write.
    pub healed_by_writes: Healing,
}

/// Whether writes heal a read rule's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Healing {
    /// The range stays bad whatever is written (a drive out of spare sectors).
    Never,
    /// Writes over it make it good again.
    ByWrites,
}

impl Trigger {
    /// Every IO, from now on.
    pub fn always() -> Self {
        Trigger {
            range_bytes: None,
            every_nth: 1,
            hits_max: None,
            healed_by_writes: Healing::Never,
        }
    }

    /// Every IO overlapping `len_bytes` at `offset_bytes`.
    pub fn range(offset_bytes: u64, len_bytes: u64) -> Self {
        Trigger { range_bytes: Some((offset_bytes, len_bytes)), ..Self::always() }
    }

    /// Hit only every nth selected IO.
    pub fn every_nth(self, n: u32) -> Self {
        assert!(n > 0, "every_nth must be at least 1");
        Trigger { every_nth: n, ..self }
    }

    /// Hit at most `hits` times.
    pub fn hits_max(self, hits: u32) -> Self {
        assert!(hits < FIRES_UNLIMITED, "hits_max must be below u32::MAX");
        Trigger { hits_max: Some(hits), ..self }
    }

    /// Let writes heal the range (read rules).
    pub fn healed_by_writes(self) -> Self {
        Trigger { healed_by_writes: Healing::ByWrites, ..self }
    }
}

/// One fault and the IOs it hits. All fields atomic: set from any thread.
#[derive(Debug, Default)]
pub struct FaultRule {
    /// Sector range: start in the high 32 bits, end (exclusive) in the low; `RANGE_OFF`,
    /// `RANGE_ALL` special.
    range: AtomicU64,
    every_nth: AtomicU32,
    hits_left: AtomicU32,
    heals: AtomicBool,
    /// IOs the range selected since the rule was set (for `every_nth`).
    selected: AtomicU64,
    /// Times the rule hit since the member was made.
    hits: AtomicU64,
}

fn pack_range(range_bytes: Option<(u64, u64)>) -> u64 {
    let Some((offset_bytes, len_bytes)) = range_bytes else { return RANGE_ALL };
    let end_bytes = offset_bytes.checked_add(len_bytes).expect("range end overflows");
    let start = offset_bytes / SECTOR_BYTES;
    let end = end_bytes.div_ceil(SECTOR_BYTES);
    let start = u32::try_from(start).expect("fault ranges end below 2 TiB");
    let end = u32::try_from(end).expect("fault ranges end below 2 TiB");
    // An empty range would read as "off" (or as a range that never selects): say so.
    assert!(start < end, "a fault range must not be empty");
    (u64::from(start) << 32) | u64::from(end)
}

fn unpack_range(packed: u64) -> (u64, u64) {
    ((packed >> 32) * SECTOR_BYTES, (packed & u64::from(u32::MAX)) * SECTOR_BYTES)
}

impl FaultRule {
    /// Start hitting the IOs `trigger` selects.
    pub fn set(&self, trigger: Trigger) {
        assert!(trigger.every_nth > 0, "every_nth must be at least 1");
        let packed = pack_range(trigger.range_bytes);
        self.range.store(RANGE_OFF, Ordering::SeqCst);
        self.every_nth.store(trigger.every_nth, Ordering::SeqCst);
        self.hits_left.store(trigger.hits_max.unwrap_or(FIRES_UNLIMITED), Ordering::SeqCst);
        self.heals.store(trigger.healed_by_writes == Healing::ByWrites, Ordering::SeqCst);
        self.selected.store(0, Ordering::SeqCst);
        self.range.store(packed, Ordering::SeqCst);
    }

    /// Stop hitting IOs.
    pub fn clear(&self) {
        self.range.store(RANGE_OFF, Ordering::SeqCst);
    }

    /// Whether the rule can still hit (set, with hits left, range not healed away).
    pub fn is_active(&self) -> bool {
        self.range.load(Ordering::SeqCst) != RANGE_OFF && self.hits_left.load(Ordering::SeqCst) != 0
    }

    /// Times the rule hit an IO since the member was made.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Decide whether this IO (`None`: a flush) is hit, and count it.
    pub(crate) fn hit(&self, io_bytes: Option<(u64, u64)>) -> bool {
        let packed = self.range.load(Ordering::Acquire);
        let selected = match (packed, io_bytes) {
            (RANGE_OFF, _) => false,
            (RANGE_ALL, _) => true,
            (_, None) => false,
            (_, Some((offset, len))) => {
                let (start, end) = unpack_range(packed);
                offset < end && start < offset.saturating_add(len)
            }
        };
        if !selected {
            return false;
        }
        let nth = u64::from(self.every_nth.load(Ordering::Acquire).max(1));
        let seen = self.selected.fetch_add(1, Ordering::AcqRel) + 1;
        if !seen.is_multiple_of(nth) {
            return false;
        }
        let took =
            self.hits_left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| match left {
                FIRES_UNLIMITED => Some(left),
                _ => left.checked_sub(1),
            });
        if took.is_err() {
            return false;
        }
        self.hits.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// A write of `len` bytes at `offset` persisted: if this rule heals, drop the part of its
    /// range the write covers (when that leaves one range).
    pub(crate) fn heal(&self, offset: u64, len: u64) {
        if !self.heals.load(Ordering::Acquire) {
            return;
        }
        let end = offset.saturating_add(len);
        let _ = self.range.fetch_update(Ordering::AcqRel, Ordering::Acquire, |packed| {
            if packed == RANGE_OFF || packed == RANGE_ALL {
                return None;
            }
            let (start_bytes, end_bytes) = unpack_range(packed);
            let covers_start = offset <= start_bytes && start_bytes < end;
            let covers_end = offset < end_bytes && end_bytes <= end;
            match (covers_start, covers_end) {
                (true, true) => Some(RANGE_OFF),
                // Only whole sectors heal: a partly written sector stays bad.
                (true, false) => {
                    let new_start = end / SECTOR_BYTES;
                    (new_start * SECTOR_BYTES < end_bytes)
                        .then_some((new_start << 32) | (packed & 0xffff_ffff))
                }
                (false, true) => {
                    let new_end = offset.div_ceil(SECTOR_BYTES);
                    (new_end * SECTOR_BYTES > start_bytes)
                        .then_some((packed & !0xffff_ffff) | new_end)
                }
                (false, false) => None,
            }
        });
    }
}

/// What a torn write reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TornReport {
    /// Success, though only the prefix persisted (a device that lies, or a crash mid-write).
    Success,
    /// A media error (the device knows the write did not complete).
    MediaError,
}

/// What happens to one write (or zeroing) at the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFate {
    /// Persist all of it and report success.
    Persist,
    /// Persist the first `len_bytes`, then report.
    Prefix { len_bytes: u64, report: TornReport },
    /// Persist nothing and report success (lost write, or power cut).
    Drop,
    /// Persist nothing and report the error.
    Fail(IoError),
}

/// The faults one in-memory member suffers. See the module documentation.
#[derive(Debug, Default)]
pub struct Faults {
    read_errors: FaultRule,
    write_errors: FaultRule,
    lost_writes: FaultRule,
    torn_writes: FaultRule,
    torn_keep_bytes: AtomicU64,
    torn_reports_error: AtomicBool,
    latency_us: AtomicU64,
    vanished: AtomicBool,
}

impl Faults {
    /// Reads that fail with a media error (flushes are never reads).
    pub fn read_errors(&self) -> &FaultRule {
        &self.read_errors
    }

    /// Writes, zeroings (and, for a rule without a range, flushes) that fail with a media
    /// error and persist nothing.
    pub fn write_errors(&self) -> &FaultRule {
        &self.write_errors
    }

    /// Writes and zeroings acknowledged and never persisted.
    pub fn lost_writes(&self) -> &FaultRule {
        &self.lost_writes
    }

    /// Writes and zeroings of which only a prefix persists; see [`Faults::tear_writes`].
    pub fn torn_writes(&self) -> &FaultRule {
        &self.torn_writes
    }

    /// Tear the writes `trigger` selects: persist their first `keep_bytes` (rounded down to
    /// a sector; all of a shorter write) and report `report`.
    pub fn tear_writes(&self, trigger: Trigger, keep_bytes: u64, report: TornReport) {
        self.torn_writes.clear();
        self.torn_keep_bytes.store(keep_bytes / SECTOR_BYTES * SECTOR_BYTES, Ordering::SeqCst);
        self.torn_reports_error.store(report == TornReport::MediaError, Ordering::SeqCst);
        self.torn_writes.set(trigger);
    }

    /// Every IO of the engine's data path completes no earlier than this after submission.
    pub fn set_latency_us(&self, latency_us: u64) {
        self.latency_us.store(latency_us, Ordering::SeqCst);
    }

    pub fn latency_us(&self) -> u64 {
        self.latency_us.load(Ordering::Relaxed)
    }

    /// From now on every IO fails with `Gone`.
    pub fn vanish(&self) {
        self.vanished.store(true, Ordering::SeqCst);
    }

    pub fn is_vanished(&self) -> bool {
        self.vanished.load(Ordering::Acquire)
    }

    /// Switch every fault off, the vanishing included (the member is back, as it was).
    pub fn clear(&self) {
        self.read_errors.clear();
        self.write_errors.clear();
        self.lost_writes.clear();
        self.torn_writes.clear();
        self.latency_us.store(0, Ordering::SeqCst);
        self.vanished.store(false, Ordering::SeqCst);
    }

    /// The outcome of a read of `len` bytes at `offset`.
    pub(crate) fn read_fate(&self, offset: u64, len: u64) -> Result<(), IoError> {
        if self.is_vanished() {
            return Err(IoError::Gone);
        }
        if self.read_errors.hit(Some((offset, len))) {
            return Err(IoError::Media);
        }
        Ok(())
    }

    /// The outcome of a write (or zeroing) of `len` bytes at `offset`.
    pub(crate) fn write_fate(&self, power: &PowerDomain, offset: u64, len: u64) -> WriteFate {
        if self.is_vanished() {
            return WriteFate::Fail(IoError::Gone);
        }
        if !power.admit_write() {
            return WriteFate::Drop;
        }
        let io = Some((offset, len));
        if self.write_errors.hit(io) {
            return WriteFate::Fail(IoError::Media);
        }
        if self.lost_writes.hit(io) {
            return WriteFate::Drop;
        }
        if self.torn_writes.hit(io) {
            let keep = self.torn_keep_bytes.load(Ordering::Acquire);
            let report = if self.torn_reports_error.load(Ordering::Acquire) {
                TornReport::MediaError
            } else {
                TornReport::Success
            };
            return WriteFate::Prefix { len_bytes: keep.min(len), report };
        }
        WriteFate::Persist
    }

    /// The outcome of a flush.
    pub(crate) fn flush_fate(&self, power: &PowerDomain) -> Result<(), IoError> {
        if self.is_vanished() {
            return Err(IoError::Gone);
        }
        if !power.is_on() {
            return Ok(());
        }
        if self.write_errors.hit(None) {
            return Err(IoError::Media);
        }
        Ok(())
    }

    /// Bytes persisted at `offset`: heal the read rule over them.
    pub(crate) fn note_persisted(&self, offset: u64, len: u64) {
        if len > 0 {
            self.read_errors.heal(offset, len);
        }
    }
}

/// `writes_before_cut` meaning "no cut planned".
const NO_PLANNED_CUT: u64 = u64::MAX;

#[derive(Debug)]
struct PowerState {
    cut: AtomicBool,
    /// Writes that may still persist before the power goes (`NO_PLANNED_CUT`: no limit).
    writes_before_cut: AtomicU64,
    writes_dropped: AtomicU64,
}

impl Default for PowerState {
    fn default() -> Self {
        Self {
            cut: AtomicBool::new(false),
            writes_before_cut: AtomicU64::new(NO_PLANNED_CUT),
            writes_dropped: AtomicU64::new(0),
        }
    }
}

/// A power switch shared by members (clone it to share). After [`PowerDomain::cut`] every
/// write to its members is acknowledged and dropped, and flushes are acknowledged: what
/// reached the members before the cut stays, nothing after it lands. One atomic for the
/// whole domain, so no member sees the cut later than another.
#[derive(Clone, Debug, Default)]
pub struct PowerDomain(Arc<PowerState>);

impl PowerDomain {
    /// A domain with the power on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cut the power: from now on nothing written to the domain's members persists.
    pub fn cut(&self) {
        self.0.cut.store(true, Ordering::SeqCst);
    }

    /// Cut the power once `writes` more writes (and zeroings) to the domain's members have
    /// persisted: a crash at a chosen point of a load, whatever the threads' timing.
    pub fn cut_after_writes(&self, writes: u64) {
        assert!(writes < NO_PLANNED_CUT, "writes must be below u64::MAX");
        self.0.writes_before_cut.store(writes, Ordering::SeqCst);
    }

    /// Power back on (the members keep what persisted); a planned cut is called off.
    pub fn restore(&self) {
        self.0.writes_before_cut.store(NO_PLANNED_CUT, Ordering::SeqCst);
        self.0.cut.store(false, Ordering::SeqCst);
    }

    pub fn is_on(&self) -> bool {
        !self.0.cut.load(Ordering::Acquire)
    }

    /// Writes (and zeroings) acknowledged and dropped because the power was cut.
    pub fn writes_dropped(&self) -> u64 {
        self.0.writes_dropped.load(Ordering::SeqCst)
    }

    /// Whether a write may persist now (counting it against a planned cut); a write that may
    /// not is counted as dropped.
    fn admit_write(&self) -> bool {
        if self.is_on() && self.take_planned_write() {
            return true;
        }
        self.0.writes_dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// False when a planned cut has come (and cuts the power).
    fn take_planned_write(&self) -> bool {
        let left = &self.0.writes_before_cut;
        if left.load(Ordering::Acquire) == NO_PLANNED_CUT {
            return true;
        }
        let taken = left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match n {
            NO_PLANNED_CUT | 0 => None,
            n => Some(n - 1),
        });
        match taken {
            Ok(_) | Err(NO_PLANNED_CUT) => true,
            Err(_) => {
                self.cut();
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_select_overlapping_ios_and_flushes_only_without_range() {
        let rule = FaultRule::default();
        assert!(!rule.hit(Some((0, 4096))), "unset rules hit nothing");
        rule.set(Trigger::range(8192, 4096));
        assert!(!rule.hit(Some((0, 8192))));
        assert!(rule.hit(Some((4096, 8192))));
        assert!(rule.hit(Some((12287, 1))));
        assert!(!rule.hit(Some((12288, 4096))));
        assert!(!rule.hit(None), "flushes have no range");
        rule.set(Trigger::always());
        assert!(rule.hit(None) && rule.hit(Some((1 << 30, 1))));
        rule.clear();
        assert!(!rule.hit(None));
        assert_eq!(rule.hits(), 4);
    }

    #[test]
    fn every_nth_and_hits_max() {
        let rule = FaultRule::default();
        rule.set(Trigger::always().every_nth(3).hits_max(2));
        let hits: Vec<bool> = (0..12).map(|_| rule.hit(Some((0, 512)))).collect();
        let expected = [false, false, true, false, false, true, false, false, false];
        assert_eq!(&hits[..9], &expected);
        assert!(!rule.is_active(), "no hits left");
        assert_eq!(rule.hits(), 2);
    }

    #[test]
    fn writes_heal_whole_sectors_at_the_ends_only() {
        let rule = FaultRule::default();
        rule.set(Trigger::range(4096, 8192).healed_by_writes());
        rule.heal(6144, 1024);
        assert!(rule.hit(Some((6144, 512))), "a heal in the middle would split the range");
        rule.heal(4096, 1000);
        assert!(!rule.hit(Some((4096, 512))), "the first sector healed");
        assert!(rule.hit(Some((4608, 512))), "the partly written sector stays bad");
        rule.heal(10240, 4096);
        assert!(!rule.hit(Some((10240, 2048))));
        assert!(rule.hit(Some((9728, 512))));
        rule.heal(0, 1 << 20);
        assert!(!rule.is_active() && !rule.hit(Some((4096, 8192))));
        let sticky = FaultRule::default();
        sticky.set(Trigger::range(0, 4096));
        sticky.heal(0, 4096);
        assert!(sticky.hit(Some((0, 4096))), "without healing the range stays bad");
    }

    #[test]
    fn write_fates_in_order() {
        let faults = Faults::default();
        let power = PowerDomain::new();
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Persist);
        faults.tear_writes(Trigger::always().hits_max(1), 1500, TornReport::Success);
        let torn = WriteFate::Prefix { len_bytes: 1024, report: TornReport::Success };
        assert_eq!(faults.write_fate(&power, 0, 4096), torn);
        faults.lost_writes().set(Trigger::range(0, 512).hits_max(1));
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Drop);
        faults.write_errors().set(Trigger::always());
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Fail(IoError::Media));
        assert_eq!(faults.flush_fate(&power), Err(IoError::Media));
        power.cut();
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Drop);
        assert_eq!(faults.flush_fate(&power), Ok(()), "a cut member acknowledges flushes");
        assert_eq!(power.writes_dropped(), 1);
        faults.vanish();
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Fail(IoError::Gone));
        assert_eq!(faults.read_fate(0, 4096), Err(IoError::Gone));
        faults.clear();
        power.restore();
        assert_eq!(faults.write_fate(&power, 0, 4096), WriteFate::Persist);
        assert_eq!(faults.read_fate(0, 4096), Ok(()));
    }

    #[test]
    fn a_planned_cut_lets_exactly_n_writes_persist() {
        let faults = Faults::default();
        let power = PowerDomain::new();
        power.cut_after_writes(2);
        let fates: Vec<WriteFate> = (0..4).map(|_| faults.write_fate(&power, 0, 512)).collect();
        let expected = [WriteFate::Persist, WriteFate::Persist, WriteFate::Drop, WriteFate::Drop];
        assert_eq!(fates, expected);
        assert!(!power.is_on());
        assert_eq!(power.writes_dropped(), 2);
        power.restore();
        assert_eq!(faults.write_fate(&power, 0, 512), WriteFate::Persist);
    }
}
