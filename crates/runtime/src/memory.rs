//! In-memory members: the engine measured alone, with no kernel in the IO path, and a
//! member that suffers injected faults for tests.
//!
//! A `MemMember` is a block of memory that behaves as a device whose writes are durable at
//! once. Its driver copies data synchronously at submit time and completes on the next poll
//! (or, with injected latency, on the first poll after the IO's deadline). Several threads
//! (each reactor, and the controller for metadata) use one member at once; they always touch
//! disjoint ranges (a stripe belongs to one shard, each shard has its own bitmap block,
//! superblocks are written only by the controller), exactly as a real device serves
//! concurrent DMA to different sectors. That discipline is the engine's; this module trusts
//! it and checks bounds.
//!
//! Faults: every IO, from the driver and from the controller's metadata IO, first asks the
//! member's [`Faults`] and [`PowerDomain`] what happens to it (see `faults.rs`). With no fault
//! set that costs a few relaxed atomic loads per IO.
//!
//! Limits: `MemDriver` holds at most `in_flight_max` completions (submit refuses beyond,
//! which is the engine's backpressure); it allocates nothing after `new`.

use crate::faults::{Faults, PowerDomain, TornReport, WriteFate};
use flashraid_engine::{Driver, IoError, MemberCompletion, MemberIo, MemberIoKind};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Memory posing as a device.
#[derive(Debug)]
pub struct MemMember {
    name: String,
    ptr: *mut u8,
    len: usize,
    // Owns the memory behind `ptr`; never touched after construction (so `ptr` stays valid).
    _storage: Vec<u8>,
    faults: Faults,
    power: PowerDomain,
    /// Flushes asked of the member (see `flushes`).
    flushes: AtomicU64,
}

// SAFETY: the memory is only accessed through `ptr` by `copy_out`/`copy_in`/`fill_zero`,
// which copy bytes; concurrent callers touch disjoint ranges by the engine's ownership rules
// (module doc), so sharing across threads races on no byte. `faults`, `power` and `flushes` are
// atomics.
unsafe impl Send for MemMember {}
// SAFETY: as above.
unsafe impl Sync for MemMember {}

impl MemMember {
    /// A member with its own power supply.
    pub fn new(name: &str, size_bytes: u64) -> Arc<Self> {
        Self::new_in(name, size_bytes, &PowerDomain::new())
    }

    /// A member powered by `power` (shared with the other members made in it).
    pub fn new_in(name: &str, size_bytes: u64, power: &PowerDomain) -> Arc<Self> {
        let len = usize::try_from(size_bytes).expect("fits");
        let mut storage = vec![0u8; len];
        let ptr = storage.as_mut_ptr();
        Arc::new(Self {
            name: name.to_string(),
            ptr,
            len,
            _storage: storage,
            faults: Faults::default(),
            power: power.clone(),
            flushes: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.len as u64
    }

    /// The faults this member suffers; change them from any thread.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The power domain this member is in.
    pub fn power(&self) -> &PowerDomain {
        &self.power
    }

    fn check(&self, offset: u64, len: usize) -> Result<usize, String> {
        let start = usize::try_from(offset).map_err(|_| "offset too large")?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(format!("{}: IO at {offset}+{len} past the end ({} B)", self.name, self.len)),
        }
    }

    fn describe(&self, error: IoError) -> String {
        match error {
            IoError::Gone => format!("{}: the member is gone", self.name),
            IoError::Media => format!("{}: media error", self.name),
            IoError::Unsupported => format!("{}: unsupported", self.name),
        }
    }

    /// Read as the device would (faults included).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let start = self.check(offset, buf.len())?;
        self.faults.read_fate(offset, buf.len() as u64).map_err(|e| self.describe(e))?;
        self.copy_out(buf, start);
        Ok(())
    }

    /// What the member holds, bypassing every fault (for tests that look at what persisted).
    /// Like every access, it must not overlap a write in flight.
    pub fn read_stored(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let start = self.check(offset, buf.len())?;
        self.copy_out(buf, start);
        Ok(())
    }

    /// Write as the device would (faults included: the write may persist partly or not at all
    /// and still succeed).
    pub fn write(&self, data: &[u8], offset: u64) -> Result<(), String> {
        let start = self.check(offset, data.len())?;
        self.write_checked(data, start, offset).map_err(|e| self.describe(e))
    }

    /// Zero as the device would (faults included).
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), String> {
        let len_usize = usize::try_from(len).map_err(|_| "length too large")?;
        let start = self.check(offset, len_usize)?;
        self.zero_checked(start, offset, len).map_err(|e| self.describe(e))
    }

    /// Flush as the device would (faults included; persisted data is durable already).
    pub fn flush(&self) -> Result<(), String> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.faults.flush_fate(&self.power).map_err(|e| self.describe(e))
    }

    /// Flushes asked of this member so far, from the data path and the controller alike,
    /// whatever their outcome. A member here has no cache to flush, so this is how a test
    /// sees where the engine made something durable.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    fn write_checked(&self, data: &[u8], start: usize, offset: u64) -> Result<(), IoError> {
        let (keep_bytes, result) = self.settle_write(offset, data.len() as u64)?;
        self.copy_in(&data[..keep_bytes], start);
        result
    }

    fn zero_checked(&self, start: usize, offset: u64, len: u64) -> Result<(), IoError> {
        let (keep_bytes, result) = self.settle_write(offset, len)?;
        self.fill_zero(start, keep_bytes);
        result
    }

    /// How many bytes of a write at `offset` persist, and what it reports.
    fn settle_write(&self, offset: u64, len: u64) -> Result<(usize, Result<(), IoError>), IoError> {
        let (keep, result) = match self.faults.write_fate(&self.power, offset, len) {
            WriteFate::Persist => (len, Ok(())),
            WriteFate::Drop => (0, Ok(())),
            WriteFate::Fail(error) => return Err(error),
            WriteFate::Prefix { len_bytes, report: TornReport::Success } => (len_bytes, Ok(())),
            WriteFate::Prefix { len_bytes, report: TornReport::MediaError } => {
                (len_bytes, Err(IoError::Media))
            }
        };
        self.faults.note_persisted(offset, keep);
        Ok((usize::try_from(keep).expect("at most the IO's length"), result))
    }

    fn copy_out(&self, buf: &mut [u8], start: usize) {
        // SAFETY: `start..start + buf.len()` is inside the allocation (`check`); no other
        // thread writes this range concurrently (module doc); `buf` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(start), buf.as_mut_ptr(), buf.len()) };
    }

    fn copy_in(&self, data: &[u8], start: usize) {
        // SAFETY: as in `copy_out`, with the roles of the buffers swapped (`data` is at most
        // the checked length).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(start), data.len()) };
    }

    fn fill_zero(&self, start: usize, len: usize) {
        // SAFETY: the range is inside the allocation (`check`, and `len` is at most the
        // checked length) and not used concurrently (module doc).
        unsafe { std::ptr::write_bytes(self.ptr.add(start), 0, len) };
    }

    /// Serve one engine IO (the driver's path): faults, then the copy. No allocation.
    fn perform(&self, kind: &MemberIoKind) -> Result<(), IoError> {
        match *kind {
            MemberIoKind::Read { offset_bytes, ptr, len_bytes } => {
                let len = usize::try_from(len_bytes).expect("fits");
                let start = self.check_io(offset_bytes, len)?;
                self.faults.read_fate(offset_bytes, u64::from(len_bytes))?;
                // SAFETY: the engine's memory contract (flashraid_engine::io): `ptr` is valid
                // for `len` bytes and untouched by the engine until this IO's completion is
                // delivered.
                let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                self.copy_out(buf, start);
                Ok(())
            }
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, .. } => {
                let len = usize::try_from(len_bytes).expect("fits");
                let start = self.check_io(offset_bytes, len)?;
                // SAFETY: as above, for reading the engine's buffer.
                let buf = unsafe { std::slice::from_raw_parts(ptr, len) };
                self.write_checked(buf, start, offset_bytes)
            }
            MemberIoKind::Flush => {
                self.flushes.fetch_add(1, Ordering::Relaxed);
                self.faults.flush_fate(&self.power)
            }
            MemberIoKind::Discard { offset_bytes, len_bytes }
            | MemberIoKind::WriteZeroes { offset_bytes, len_bytes } => {
                let len = usize::try_from(len_bytes).map_err(|_| IoError::Media)?;
                let start = self.check_io(offset_bytes, len)?;
                self.zero_checked(start, offset_bytes, len_bytes)
            }
        }
    }

    /// Bounds check without a message: the engine's IO past the end is a media error.
    fn check_io(&self, offset: u64, len: usize) -> Result<usize, IoError> {
        let start = usize::try_from(offset).map_err(|_| IoError::Media)?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(IoError::Media),
        }
    }
}

/// A completion waiting for its member's latency to pass.
#[derive(Debug)]
struct Pending {
    completion: MemberCompletion,
    /// `None`: deliverable at the next poll.
    due_at: Option<Instant>,
}

/// The engine's driver over in-memory members.
#[derive(Debug)]
pub struct MemDriver {
    /// The device serving each role now (`None`: missing or failed; no IO comes for it).
    members: Vec<Option<Arc<MemMember>>>,
    /// Devices by registration slot, numbered like the io_uring driver's registered files:
    /// the roles' devices at the start, then spares. `assign_role` maps a role to a slot's
    /// device; `None`: no device (a role missing at the start, a slot released).
    slots: Vec<Option<Arc<MemMember>>>,
    pending: VecDeque<Pending>,
    in_flight_max: usize,
}

impl MemDriver {
    pub fn new(
        members: Vec<Option<Arc<MemMember>>>,
        spares: Vec<Arc<MemMember>>,
        in_flight_max: usize,
    ) -> Self {
        let in_flight_max = in_flight_max.max(1);
        let slots = members.iter().cloned().chain(spares.into_iter().map(Some)).collect();
        Self { members, slots, pending: VecDeque::with_capacity(in_flight_max), in_flight_max }
    }

    /// A device added while running takes registration slot `slot`: the next one, or one
    /// a released device left.
    pub fn add_device(&mut self, slot: usize, member: Arc<MemMember>) {
        if slot == self.slots.len() {
            self.slots.push(Some(member));
        } else {
            assert!(self.slots[slot].is_none(), "slot {slot} is taken");
            self.slots[slot] = Some(member);
        }
    }

    /// Let go of the device in registration slot `slot` (a spare removed): the engine sends
    /// it no IO (it holds no role; a role's own reference is in `members`). Memory has
    /// nothing to close.
    pub fn release_device(&mut self, slot: usize) {
        if let Some(device) = self.slots.get_mut(slot) {
            *device = None;
        }
    }

    /// From now on, IO for `role` goes to the device in registration slot `slot`. IO
    /// already submitted was performed where it was sent.
    pub fn assign_role(&mut self, role: usize, slot: usize) {
        self.members[role] = self.slots.get(slot).cloned().flatten();
    }

    /// When the earliest delayed completion is due (`None`: none is waiting for time). A
    /// reactor could sleep until then instead of its idle timeout.
    pub(crate) fn next_due_at(&self) -> Option<Instant> {
        self.pending.iter().filter_map(|p| p.due_at).min()
    }
}

impl Driver for MemDriver {
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo> {
        if self.pending.len() >= self.in_flight_max {
            return Err(io);
        }
        let (result, latency_us) = match &self.members[io.member.get()] {
            None => (Err(IoError::Gone), 0),
            Some(member) => (member.perform(&io.kind), member.faults().latency_us()),
        };
        // Read the clock only for delayed IO: a memory copy is cheaper than a clock read.
        let due_at = (latency_us > 0).then(|| Instant::now() + Duration::from_micros(latency_us));
        self.pending.push_back(Pending {
            completion: MemberCompletion { token: io.token, result },
            due_at,
        });
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion)) {
        let mut now: Option<Instant> = None;
        // Each completion is looked at once; those not yet due go back in order.
        for _ in 0..self.pending.len() {
            let pending = self.pending.pop_front().expect("counted");
            let due = match pending.due_at {
                None => true,
                Some(at) => at <= *now.get_or_insert_with(Instant::now),
            };
            if due {
                sink(pending.completion);
            } else {
                self.pending.push_back(pending);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Trigger;
    use flashraid_engine::IoToken;
    use flashraid_layout::MemberIndex;

    fn write_io(token: u64, offset_bytes: u64, data: &[u8]) -> MemberIo {
        MemberIo {
            token: IoToken(token),
            member: MemberIndex(0),
            kind: MemberIoKind::Write {
                offset_bytes,
                ptr: data.as_ptr(),
                len_bytes: u32::try_from(data.len()).unwrap(),
                durability: flashraid_engine::Durability::Cached,
            },
        }
    }

    fn collect(driver: &mut MemDriver) -> Vec<MemberCompletion> {
        let mut out = vec![];
        driver.poll(&mut |c| out.push(c));
        out
    }

    fn stored(member: &MemMember, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        member.read_stored(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn torn_lost_and_failed_writes_persist_what_they_say() {
        let member = MemMember::new("m", 1 << 20);
        let mut driver = MemDriver::new(vec![Some(member.clone())], vec![], 4);
        let data = vec![0xabu8; 4096];
        member.faults().tear_writes(Trigger::range(0, 4096), 1536, TornReport::Success);
        driver.submit(write_io(1, 0, &data)).unwrap();
        member.faults().torn_writes().clear();
        member.faults().lost_writes().set(Trigger::range(8192, 4096).hits_max(1));
        driver.submit(write_io(2, 8192, &data)).unwrap();
        member.faults().write_errors().set(Trigger::range(16384, 1));
        driver.submit(write_io(3, 16384, &data)).unwrap();
        member.faults().tear_writes(Trigger::always(), 512, TornReport::MediaError);
        driver.submit(write_io(4, 24576, &data)).unwrap();
        assert!(driver.submit(write_io(5, 0, &data)).is_err(), "in_flight_max is the bound");
        let results: Vec<_> = collect(&mut driver).iter().map(|c| (c.token.0, c.result)).collect();
        assert_eq!(
            results,
            [(1, Ok(())), (2, Ok(())), (3, Err(IoError::Media)), (4, Err(IoError::Media))]
        );
        let torn = stored(&member, 0, 4096);
        assert!(torn[..1536].iter().all(|&b| b == 0xab), "the prefix persisted");
        assert!(torn[1536..].iter().all(|&b| b == 0), "the rest did not");
        assert!(stored(&member, 8192, 4096).iter().all(|&b| b == 0), "the lost write");
        assert!(stored(&member, 16384, 4096).iter().all(|&b| b == 0), "the failed write");
        let second = stored(&member, 24576, 4096);
        assert!(second[..512].iter().all(|&b| b == 0xab) && second[512..].iter().all(|&b| b == 0));
        assert_eq!(member.faults().lost_writes().hits(), 1);
        // The lost-write rule is used up: the next write there lands.
        member.faults().clear();
        driver.submit(write_io(6, 8192, &data)).unwrap();
        assert_eq!(collect(&mut driver)[0].result, Ok(()));
        assert!(stored(&member, 8192, 4096) == data);
    }

    #[test]
    fn power_cut_drops_writes_in_the_whole_domain_and_vanish_is_gone() {
        let power = PowerDomain::new();
        let a = MemMember::new_in("a", 1 << 20, &power);
        let b = MemMember::new_in("b", 1 << 20, &power);
        a.write(&[1u8; 4096], 0).unwrap();
        power.cut();
        a.write(&[2u8; 4096], 0).unwrap();
        b.write(&[2u8; 4096], 0).unwrap();
        b.zero(0, 4096).unwrap();
        a.flush().unwrap();
        assert!(stored(&a, 0, 4096) == [1u8; 4096] && stored(&b, 0, 4096) == [0u8; 4096]);
        assert_eq!(power.writes_dropped(), 3);
        power.restore();
        b.write(&[3u8; 4096], 0).unwrap();
        assert!(stored(&b, 0, 4096) == [3u8; 4096]);
        b.faults().vanish();
        let mut buf = [0u8; 4096];
        assert!(b.read(&mut buf, 0).unwrap_err().contains("gone"));
        assert!(b.write(&buf, 0).is_err() && b.flush().is_err());
        let mut driver = MemDriver::new(vec![Some(b.clone())], vec![], 4);
        driver.submit(write_io(1, 0, &buf)).unwrap();
        assert_eq!(collect(&mut driver)[0].result, Err(IoError::Gone));
    }

    #[test]
    fn latency_holds_completions_until_due_and_others_pass() {
        let slow = MemMember::new("slow", 1 << 20);
        let fast = MemMember::new("fast", 1 << 20);
        let mut driver = MemDriver::new(vec![Some(slow.clone()), Some(fast)], vec![], 8);
        slow.faults().set_latency_us(20_000);
        let data = [7u8; 4096];
        let submitted = Instant::now();
        driver.submit(write_io(1, 0, &data)).unwrap();
        let mut to_fast = write_io(2, 0, &data);
        to_fast.member = MemberIndex(1);
        driver.submit(to_fast).unwrap();
        let first = collect(&mut driver);
        assert_eq!(first.len(), 1, "the fast member's IO is not held behind the slow one");
        assert_eq!(first[0].token.0, 2);
        assert!(driver.next_due_at().is_some());
        let mut delivered = vec![];
        while delivered.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            delivered = collect(&mut driver);
        }
        assert!(submitted.elapsed() >= Duration::from_millis(20));
        assert_eq!(delivered[0].token.0, 1);
        assert!(driver.next_due_at().is_none());
    }
}
