//! A simulated member: bytes in memory with a volatile write cache, power loss, and faults.
//!
//! Owns: two images of the device. `current` is what reads see; `durable` is what survives a
//! power loss. A write lands in `current` and is remembered as unflushed until a flush (or
//! FUA) copies it to `durable`. At power loss every unflushed write independently survives,
//! vanishes, or is torn at 4 KiB granularity, and `current` becomes `durable`.
//!
//! Faults: bad ranges (reads fail until the range is rewritten, as a drive remaps a sector on
//! write), failing writes, a device that vanishes (every IO fails), a device that lies about
//! flush (acknowledges without persisting), silent corruption (flipped bytes).

use flashraid_control::MetaDevice;
use rand::Rng;
use rand::rngs::StdRng;
use std::cell::RefCell;
use std::rc::Rc;

/// Block size of torn writes.
const TEAR_BYTES: u64 = 4096;

#[derive(Clone, Debug)]
pub struct MemberState {
    pub name: String,
    pub current: Vec<u8>,
    pub durable: Vec<u8>,
    /// Ranges written since the last flush, oldest first.
    pub unflushed: Vec<(u64, u64)>,
    /// Reads overlapping these ranges fail; a write over a range clears the overlap.
    pub bad_ranges: Vec<(u64, u64)>,
    /// The next this many reads fail with a media error whatever they read, then reads
    /// work again (a transient fault: a cable, a controller reset).
    pub transient_read_errors: u32,
    pub writes_fail: bool,
    pub gone: bool,
    pub lies_about_flush: bool,
    pub zeroes_after_discard: bool,
    /// Discard and write-zeroes commands are refused as unsupported (like a file system
    /// without ZERO_RANGE); reads and writes work.
    pub zeroing_unsupported: bool,
    pub reads: u64,
    pub writes: u64,
}

/// A shared handle to one simulated member (the driver and the control plane both use it).
#[derive(Clone, Debug)]
pub struct SimMember(pub Rc<RefCell<MemberState>>);

impl SimMember {
    pub fn new(name: &str, size_bytes: u64) -> Self {
        let size = usize::try_from(size_bytes).expect("fits");
        SimMember(Rc::new(RefCell::new(MemberState {
            name: name.to_string(),
            current: vec![0; size],
            durable: vec![0; size],
            unflushed: vec![],
            bad_ranges: vec![],
            transient_read_errors: 0,
            writes_fail: false,
            gone: false,
            lies_about_flush: false,
            zeroes_after_discard: true,
            zeroing_unsupported: false,
            reads: 0,
            writes: 0,
        })))
    }

    /// A stand-in for a member that is not there: every IO fails as gone.
    pub fn gone(name: &str) -> Self {
        let member = Self::new(name, 0);
        member.state().gone = true;
        member
    }

    pub fn state(&self) -> std::cell::RefMut<'_, MemberState> {
        self.0.borrow_mut()
    }

    /// A separate device holding what this one holds now, durably (a disk image taken with
    /// the array stopped): what it later receives is not this one's.
    pub fn image(&self) -> SimMember {
        let mut state = self.0.borrow().clone();
        state.current.clone_from(&state.durable);
        state.unflushed.clear();
        SimMember(Rc::new(RefCell::new(state)))
    }
}

fn range(offset: u64, len: u64) -> std::ops::Range<usize> {
    let start = usize::try_from(offset).expect("fits");
    start..start + usize::try_from(len).expect("fits")
}

impl MemberState {
    pub fn size_bytes(&self) -> u64 {
        self.current.len() as u64
    }

    fn in_bounds(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size_bytes())
    }

    /// Read `buf.len()` bytes at `offset` as the device would.
    pub fn read(&mut self, buf: &mut [u8], offset: u64) -> Result<(), SimError> {
        let len = buf.len() as u64;
        if self.gone {
            return Err(SimError::Gone);
        }
        if !self.in_bounds(offset, len) {
            return Err(SimError::OutOfRange);
        }
        if self.bad_ranges.iter().any(|&(o, l)| o < offset + len && offset < o + l) {
            return Err(SimError::Media);
        }
        if self.transient_read_errors > 0 {
            self.transient_read_errors -= 1;
            return Err(SimError::Media);
        }
        self.reads += 1;
        buf.copy_from_slice(&self.current[range(offset, len)]);
        Ok(())
    }

    pub fn write(&mut self, data: &[u8], offset: u64, fua: bool) -> Result<(), SimError> {
        let len = data.len() as u64;
        if self.gone {
            return Err(SimError::Gone);
        }
        if self.writes_fail {
            return Err(SimError::Media);
        }
        if !self.in_bounds(offset, len) {
            return Err(SimError::OutOfRange);
        }
        self.writes += 1;
        self.current[range(offset, len)].copy_from_slice(data);
        self.heal(offset, len);
        if fua && !self.lies_about_flush {
            self.durable[range(offset, len)].copy_from_slice(data);
        } else {
            self.unflushed.push((offset, len));
        }
        Ok(())
    }

    /// A write remaps bad sectors: the overlapping part of bad ranges is good again.
    fn heal(&mut self, offset: u64, len: u64) {
        let end = offset + len;
        let mut kept = vec![];
        for &(o, l) in &self.bad_ranges {
            let e = o + l;
            if e <= offset || end <= o {
                kept.push((o, l));
                continue;
            }
            if o < offset {
                kept.push((o, offset - o));
            }
            if end < e {
                kept.push((end, e - end));
            }
        }
        self.bad_ranges = kept;
    }

    pub fn flush(&mut self) -> Result<(), SimError> {
        if self.gone {
            return Err(SimError::Gone);
        }
        if self.lies_about_flush {
            return Ok(());
        }
        for (offset, len) in std::mem::take(&mut self.unflushed) {
            let r = range(offset, len);
            let (current, durable) = (&self.current, &mut self.durable);
            durable[r.clone()].copy_from_slice(&current[r]);
        }
        Ok(())
    }

    pub fn zero(&mut self, offset: u64, len: u64) -> Result<(), SimError> {
        if self.gone {
            return Err(SimError::Gone);
        }
        if self.zeroing_unsupported {
            return Err(SimError::Unsupported);
        }
        if self.writes_fail {
            return Err(SimError::Media);
        }
        if !self.in_bounds(offset, len) {
            return Err(SimError::OutOfRange);
        }
        self.current[range(offset, len)].fill(0);
        self.heal(offset, len);
        self.unflushed.push((offset, len));
        Ok(())
    }

    /// Power loss: each unflushed write survives, vanishes or is torn; then what reads see is
    /// what was durable.
    pub fn power_loss(&mut self, rng: &mut StdRng) {
        for (offset, len) in std::mem::take(&mut self.unflushed) {
            match rng.random_range(0..3) {
                0 => {
                    let r = range(offset, len);
                    let (current, durable) = (&self.current, &mut self.durable);
                    durable[r.clone()].copy_from_slice(&current[r]);
                }
                1 => {}
                _ => {
                    let mut at = offset;
                    while at < offset + len {
                        let piece = TEAR_BYTES.min(offset + len - at);
                        if rng.random_bool(0.5) {
                            let r = range(at, piece);
                            let (current, durable) = (&self.current, &mut self.durable);
                            durable[r.clone()].copy_from_slice(&current[r]);
                        }
                        at += piece;
                    }
                }
            }
        }
        self.current.copy_from_slice(&self.durable);
    }
}

/// Why a simulated IO failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimError {
    Media,
    Gone,
    OutOfRange,
    Unsupported,
}

impl MetaDevice for SimMember {
    fn name(&self) -> String {
        self.0.borrow().name.clone()
    }

    fn size_bytes(&self) -> u64 {
        self.0.borrow().size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), String> {
        self.0.borrow_mut().read(buf, offset_bytes).map_err(|e| format!("{e:?}"))
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), String> {
        self.0.borrow_mut().write(buf, offset_bytes, false).map_err(|e| format!("{e:?}"))
    }

    fn sync(&self) -> Result<(), String> {
        self.0.borrow_mut().flush().map_err(|e| format!("{e:?}"))
    }

    fn zeroes_after_discard(&self) -> bool {
        self.0.borrow().zeroes_after_discard
    }

    fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), String> {
        self.0.borrow_mut().zero(offset_bytes, len_bytes).map_err(|e| format!("{e:?}"))
    }
}
