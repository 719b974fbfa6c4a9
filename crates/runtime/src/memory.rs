//! In-memory members: the engine measured alone, with no kernel in the IO path.
//!
//! A `MemMember` is a block of memory that behaves as a device whose writes are durable at
//! once. Its driver copies data synchronously at submit time and completes on the next poll.
//! Several threads (each reactor, and the controller for metadata) use one member at once;
//! they always touch disjoint ranges (a stripe belongs to one shard, each shard has its own
//! bitmap block, superblocks are written only by the controller), exactly as a real device
//! serves concurrent DMA to different sectors. That discipline is the engine's; this module
//! trusts it and checks bounds.

use flashraid_engine::{Driver, IoToken, MemberCompletion, MemberIo, MemberIoKind};
use std::collections::VecDeque;
use std::sync::Arc;

/// Memory posing as a device.
#[derive(Debug)]
pub struct MemMember {
    name: String,
    ptr: *mut u8,
    len: usize,
    // Owns the memory behind `ptr`; never touched after construction (so `ptr` stays valid).
    _storage: Vec<u8>,
}

// SAFETY: the memory is only accessed through `ptr` by `read`/`write`/`zero`, which copy
// bytes; concurrent callers touch disjoint ranges by the engine's ownership rules (module
// doc), so sharing across threads races on no byte.
unsafe impl Send for MemMember {}
// SAFETY: as above.
unsafe impl Sync for MemMember {}

impl MemMember {
    pub fn new(name: &str, size_bytes: u64) -> Arc<Self> {
        let len = usize::try_from(size_bytes).expect("fits");
        let mut storage = vec![0u8; len];
        let ptr = storage.as_mut_ptr();
        Arc::new(Self { name: name.to_string(), ptr, len, _storage: storage })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.len as u64
    }

    fn check(&self, offset: u64, len: usize) -> Result<usize, String> {
        let start = usize::try_from(offset).map_err(|_| "offset too large")?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(format!("{}: IO at {offset}+{len} past the end ({} B)", self.name, self.len)),
        }
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let start = self.check(offset, buf.len())?;
        // SAFETY: `start..start + buf.len()` is inside the allocation (checked); no other
        // thread writes this range concurrently (module doc); `buf` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(start), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    pub fn write(&self, data: &[u8], offset: u64) -> Result<(), String> {
        let start = self.check(offset, data.len())?;
        // SAFETY: as in `read`, with the roles of the buffers swapped.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(start), data.len()) };
        Ok(())
    }

    pub fn zero(&self, offset: u64, len: u64) -> Result<(), String> {
        let len = usize::try_from(len).map_err(|_| "length too large")?;
        let start = self.check(offset, len)?;
        // SAFETY: the range is inside the allocation and not used concurrently (module doc).
        unsafe { std::ptr::write_bytes(self.ptr.add(start), 0, len) };
        Ok(())
    }
}

/// The engine's driver over in-memory members.
#[derive(Debug)]
pub struct MemDriver {
    members: Vec<Option<Arc<MemMember>>>,
    done: VecDeque<MemberCompletion>,
}

impl MemDriver {
    pub fn new(members: Vec<Option<Arc<MemMember>>>, in_flight_max: usize) -> Self {
        Self { members, done: VecDeque::with_capacity(in_flight_max) }
    }
}

impl Driver for MemDriver {
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo> {
        if self.done.len() == self.done.capacity() {
            return Err(io);
        }
        let result = match &self.members[io.member.get()] {
            None => Err(flashraid_engine::IoError::Gone),
            Some(member) => perform(member, &io.kind).map_err(|_| flashraid_engine::IoError::Media),
        };
        self.done.push_back(MemberCompletion { token: IoToken(io.token.0), result });
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion)) {
        while let Some(c) = self.done.pop_front() {
            sink(c);
        }
    }
}

fn perform(member: &MemMember, kind: &MemberIoKind) -> Result<(), String> {
    match *kind {
        MemberIoKind::Read { offset_bytes, ptr, len_bytes } => {
            let len = usize::try_from(len_bytes).expect("fits");
            // SAFETY: the engine's memory contract (flashraid_engine::io): `ptr` is valid for
            // `len` bytes and untouched by the engine until this IO's completion is delivered.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            member.read(buf, offset_bytes)
        }
        MemberIoKind::Write { offset_bytes, ptr, len_bytes, .. } => {
            let len = usize::try_from(len_bytes).expect("fits");
            // SAFETY: as above, for reading the engine's buffer.
            let buf = unsafe { std::slice::from_raw_parts(ptr, len) };
            member.write(buf, offset_bytes)
        }
        MemberIoKind::Flush => Ok(()),
        MemberIoKind::Discard { offset_bytes, len_bytes }
        | MemberIoKind::WriteZeroes { offset_bytes, len_bytes } => {
            member.zero(offset_bytes, len_bytes)
        }
    }
}
