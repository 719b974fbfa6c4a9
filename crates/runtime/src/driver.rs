//! The engine's `Driver` over an io_uring `Ring`: member IO for one shard.
//!
//! Role `i` of the array starts as registered file `i` of the ring; hot spares are
//! registered after the roles, and a spare that takes over a role is mapped to it
//! (`assign_role`), so IO already in flight (or staged, below) keeps its file. Missing
//! members get a placeholder descriptor that the engine never addresses (it issues no IO to
//! unavailable members). Tokens travel as io_uring user data. Short transfers are errors: the
//! member ended early, so it is gone (it shrank under us), not a bad range to repair.
//!
//! Merging (what the block layer's plugging does for other IO; O_DIRECT through io_uring gets
//! none). Reads and cached writes are staged until the reactor submits
//! ([`UringDriver::submit_ring`]). A staged IO that continues the run staged for its role (same
//! file, same direction, starting at the run's next byte) joins it, and the run goes to the
//! kernel as one `Readv`/`Writev`. Neighbouring chunks of one member meet here when one
//! shard owns neighbouring stripes: with runs of stripes (`flashraid_engine::owner`, a
//! setting whose default is one stripe) or a single shard. A 1 MiB read on RAID 6 x8 with
//! 16 KiB chunks and 64 KiB runs is then 26-32 member IOs instead of 64 (counted in review;
//! `tests/merge.rs` checks only that merging happens).
//! - A merged write that fails (or is short) fails every part with its error: any write
//!   error fails the member, whichever part it hit, so the engine ends where it would have
//!   unmerged. A merged IO whose device is gone fails every part as `Gone` at once.
//! - A merged read that fails (or is short) reports nothing itself: each part is read again
//!   on its own and gets its own result, so the engine learns which range is bad and repairs
//!   only that one. This is a second attempt that an unmerged read does not get: an error
//!   the second read does not repeat is not seen by the engine. Such retries are counted
//!   (`member_reads_retried` in `status --json`) so they are not silent.
//! - FUA writes, flushes, discards and zeroing are never staged. Nothing the engine issues
//!   depends on the order of IOs pushed together (the ring runs them in any order anyway),
//!   so holding reads and cached writes until the end of the turn changes no ordering the
//!   engine relies on; they reach the kernel in the same `io_uring_enter` as before.
//!
//! Only a busy ring merges: when fewer than [`MERGE_IN_FLIGHT_MIN`] IOs were in flight after
//! the last reaping, IOs go unmerged. (Counted then, not as this turn's IOs are pushed, so a
//! lone large request does not make its own ring look busy.) On files io_uring hands each IO
//! to a kernel worker, so separate IOs are copied in parallel; a lone 1 MiB read at queue
//! depth 1 ran at 2.2-3.3 GB/s merged against 4.6-6.8 unmerged on tmpfs. Under load there is
//! parallelism to spare and the saving per IO counts.
//!
//! Bounds: [`MERGED_RUNS_MAX`] runs staged or in flight, each of at most [`MERGE_PARTS_MAX`]
//! parts and [`MERGE_BYTES_MAX`] bytes; parts waiting to be pushed again after a failed
//! merged IO stay in its slot until each is pushed. All allocated at start. With every run
//! slot taken, an IO is pushed unmerged.

use flashraid_engine::{
    Driver, Durability, IoError, IoToken, MemberCompletion, MemberIo, MemberIoKind,
};
use flashraid_layout::MEMBERS_MAX;
use flashraid_uring::{Op, Ring, RingError, check_status, check_transfer, iovec};
use std::collections::{HashMap, VecDeque};

/// Most member IOs one merged IO carries.
pub const MERGE_PARTS_MAX: usize = 16;
/// Most bytes one merged IO moves.
pub const MERGE_BYTES_MAX: u64 = 1 << 20;
/// IOs in flight on the ring from which new IOs are staged for merging.
pub const MERGE_IN_FLIGHT_MIN: usize = 128;
/// Runs staged or in flight at once, per ring.
pub const MERGED_RUNS_MAX: usize = 256;
/// User data of a merged IO: this bit plus the run's slot. Engine tokens never set it
/// (asserted in `submit`), and the reactor's waker tag is 0.
const MERGED_TAG: u64 = 1 << 63;

/// One member IO of a run.
#[derive(Clone, Copy, Debug)]
struct Part {
    token: u64,
    ptr: *mut u8,
    len_bytes: u32,
}

const NO_PART: Part = Part { token: 0, ptr: std::ptr::null_mut(), len_bytes: 0 };

/// Consecutive member IOs of one role, staged or in flight as one.
#[derive(Debug)]
struct Run {
    file: u32,
    write: bool,
    offset_bytes: u64,
    len_bytes: u64,
    parts: [Part; MERGE_PARTS_MAX],
    count: usize,
    /// Handed to the kernel with a merged push; untouched until its completion.
    iovecs: [iovec; MERGE_PARTS_MAX],
    /// After a failed merged IO: the parts before this one were pushed again on their own.
    retried: usize,
    /// ...and this is where the next one starts on the member.
    retry_offset_bytes: u64,
}

impl Run {
    fn empty() -> Self {
        let iovec = iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        Self {
            file: 0,
            write: false,
            offset_bytes: 0,
            len_bytes: 0,
            parts: [NO_PART; MERGE_PARTS_MAX],
            count: 0,
            iovecs: [iovec; MERGE_PARTS_MAX],
            retried: 0,
            retry_offset_bytes: 0,
        }
    }

    fn continues(&self, file: u32, write: bool, offset_bytes: u64, len_bytes: u32) -> bool {
        self.file == file
            && self.write == write
            && self.offset_bytes + self.len_bytes == offset_bytes
            && self.count < MERGE_PARTS_MAX
            && self.len_bytes + u64::from(len_bytes) <= MERGE_BYTES_MAX
    }
}

#[derive(Debug)]
pub struct UringDriver {
    ring: Ring,
    /// Length of each unmerged transfer in flight, to detect short ones. Pre-sized to the
    /// ring's in-flight maximum, so inserting never allocates.
    transfer_len: HashMap<u64, u32>,
    /// Registered file index per role.
    role_file: [u32; MEMBERS_MAX],
    /// Run slots; a boxed slice so a pushed run's iovecs never move.
    runs: Box<[Run]>,
    free_runs: Vec<u16>,
    /// The run each role is gathering (staged, not pushed).
    open: [Option<u16>; MEMBERS_MAX],
    /// Bit `r`: `open[r]` is set (so pushing what is staged visits only those roles).
    open_roles: u64,
    /// Runs whose merged IO failed, their parts being pushed again one by one.
    retries: VecDeque<u16>,
    /// Merged IOs pushed (for tests and profiles).
    merged_pushed: u64,
    /// Merged reads that failed and were read again part by part.
    reads_retried: u64,
    /// [`MERGE_IN_FLIGHT_MIN`], lowered by tests.
    merge_in_flight_min: usize,
    /// IOs in flight right after the last `poll` reaped: how busy the ring was before this
    /// turn's IOs came.
    in_flight_after_reap: usize,
}

// SAFETY: the raw pointers a driver holds (staged and in-flight runs) name buffers of the
// shard it serves, which lives on the same reactor thread; the driver is moved to that thread
// when it is built, before any IO (as its `Ring` must be: see flashraid_uring::ring).
unsafe impl Send for UringDriver {}

impl UringDriver {
    pub fn new(ring: Ring) -> Self {
        let capacity = ring.in_flight_max();
        let role_file = std::array::from_fn(|i| u32::try_from(i).expect("fits"));
        let runs: Box<[Run]> = (0..MERGED_RUNS_MAX).map(|_| Run::empty()).collect();
        let free_runs =
            (0..MERGED_RUNS_MAX).rev().map(|s| u16::try_from(s).expect("fits")).collect();
        Self {
            ring,
            transfer_len: HashMap::with_capacity(capacity),
            role_file,
            runs,
            free_runs,
            open: [None; MEMBERS_MAX],
            open_roles: 0,
            retries: VecDeque::with_capacity(MERGED_RUNS_MAX),
            merged_pushed: 0,
            reads_retried: 0,
            merge_in_flight_min: MERGE_IN_FLIGHT_MIN,
            in_flight_after_reap: 0,
        }
    }

    /// From now on, IO for `role` goes to registered file `file`.
    pub fn assign_role(&mut self, role: usize, file: u32) {
        self.role_file[role] = file;
    }

    /// The registered file `role`'s IO goes to now.
    pub fn role_file(&self, role: usize) -> u32 {
        self.role_file[role]
    }

    /// Fail as `Gone` every IO staged for registered file `file` and not yet pushed (a run
    /// still gathering, or the parts of a failed merged read not yet read again): its
    /// device failed or is let go, and the slot may later hold another device, which must
    /// never receive IO meant for this one. IO already pushed completes on the old file.
    pub fn fail_staged_for_file(&mut self, file: u32, sink: &mut dyn FnMut(MemberCompletion)) {
        let gone = Err(IoError::Gone);
        let mut roles = self.open_roles;
        while roles != 0 {
            let role = roles.trailing_zeros() as usize;
            roles &= roles - 1;
            let slot = self.open[role].expect("an open role has a run");
            let run = &self.runs[usize::from(slot)];
            if run.file != file {
                continue;
            }
            for part in &run.parts[..run.count] {
                sink(MemberCompletion { token: IoToken(part.token), result: gone });
            }
            self.open[role] = None;
            self.open_roles &= !(1 << role);
            self.free_runs.push(slot);
        }
        let (runs, free_runs) = (&self.runs, &mut self.free_runs);
        self.retries.retain(|&slot| {
            let run = &runs[usize::from(slot)];
            if run.file != file {
                return true;
            }
            for part in &run.parts[run.retried..run.count] {
                sink(MemberCompletion { token: IoToken(part.token), result: gone });
            }
            free_runs.push(slot);
            false
        });
    }

    pub fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    /// Push everything staged, then submit to the kernel (see [`Ring::submit`]). What the
    /// ring has no room for stays staged for the next call.
    pub fn submit_ring(
        &mut self,
        wait_for: usize,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize, RingError> {
        self.push_staged();
        self.ring.submit(wait_for, timeout)
    }

    /// Merged reads that failed and were read again part by part, so far.
    pub fn reads_retried(&self) -> u64 {
        self.reads_retried
    }

    fn push_staged(&mut self) {
        while let Some(&slot) = self.retries.front() {
            let run = &self.runs[usize::from(slot)];
            let (file, write, count) = (run.file, run.write, run.count);
            while self.runs[usize::from(slot)].retried < count {
                let run = &self.runs[usize::from(slot)];
                let (part, offset_bytes) = (run.parts[run.retried], run.retry_offset_bytes);
                if !pushed(self.push_plain(file, write, offset_bytes, part)) {
                    return;
                }
                let run = &mut self.runs[usize::from(slot)];
                run.retried += 1;
                run.retry_offset_bytes += u64::from(part.len_bytes);
            }
            self.retries.pop_front();
            self.free_runs.push(slot);
        }
        while self.open_roles != 0 {
            let role = self.open_roles.trailing_zeros() as usize;
            let slot = self.open[role].expect("an open role has a run");
            if !pushed(self.push_run(slot)) {
                return;
            }
            self.open[role] = None;
            self.open_roles &= !(1 << role);
        }
    }

    /// Push one unmerged read or cached write.
    fn push_plain(
        &mut self,
        file: u32,
        write: bool,
        offset_bytes: u64,
        part: Part,
    ) -> Result<(), RingError> {
        let Part { token, ptr, len_bytes } = part;
        let op = if write {
            Op::Write { file, offset_bytes, ptr: ptr.cast_const(), len_bytes, fua: false }
        } else {
            Op::Read { file, offset_bytes, ptr, len_bytes }
        };
        // SAFETY: the engine's memory contract (flashraid_engine::io): the buffer of a Read
        // or Write stays valid and untouched until this token's completion is delivered,
        // which happens only after the ring reaps it.
        unsafe { self.ring.push(op, token) }?;
        self.transfer_len.insert(token, len_bytes);
        Ok(())
    }

    /// Push a staged run: as a plain IO if it holds one part, else as one vectored IO. On
    /// success the slot is freed (plain) or owned by the kernel until its completion.
    fn push_run(&mut self, slot: u16) -> Result<(), RingError> {
        let run = &mut self.runs[usize::from(slot)];
        let (file, write, offset_bytes) = (run.file, run.write, run.offset_bytes);
        if run.count == 1 {
            let part = run.parts[0];
            self.push_plain(file, write, offset_bytes, part)?;
            self.free_runs.push(slot);
            return Ok(());
        }
        for (iovec, part) in run.iovecs.iter_mut().zip(&run.parts[..run.count]) {
            *iovec = iovec {
                iov_base: part.ptr.cast(),
                iov_len: usize::try_from(part.len_bytes).expect("fits"),
            };
        }
        let (iovecs, count) = (run.iovecs.as_ptr(), u32::try_from(run.count).expect("fits"));
        let op = if write {
            Op::Writev { file, offset_bytes, iovecs, count }
        } else {
            Op::Readv { file, offset_bytes, iovecs, count }
        };
        // SAFETY: every part's buffer is under the engine's memory contract (valid and
        // untouched until its token's completion, delivered only after this merged IO is
        // reaped); the iovec array lives in `self.runs`, a boxed slice that never moves, and
        // this slot is neither reused nor written until the completion is reaped (`poll`).
        unsafe { self.ring.push(op, MERGED_TAG | u64::from(slot)) }?;
        self.merged_pushed += 1;
        Ok(())
    }

    /// Merged IOs pushed so far (`member_ios_merged` in `status --json`).
    pub fn merged_pushed(&self) -> u64 {
        self.merged_pushed
    }

    /// Stage a read or cached write; start a new run if it does not continue its role's.
    fn stage(&mut self, io: MemberIo, file: u32, write: bool) -> Result<(), MemberIo> {
        let (offset_bytes, ptr, len_bytes) = match io.kind {
            MemberIoKind::Read { offset_bytes, ptr, len_bytes } => (offset_bytes, ptr, len_bytes),
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, .. } => {
                (offset_bytes, ptr.cast_mut(), len_bytes)
            }
            _ => unreachable!("only reads and writes are staged"),
        };
        let role = io.member.get();
        let part = Part { token: io.token.0, ptr, len_bytes };
        // A quiet ring: parallel IOs serve it better than fewer ones (module docs).
        let quiet =
            self.in_flight_after_reap < self.merge_in_flight_min && self.open[role].is_none();
        if let Some(slot) = self.open[role] {
            let run = &mut self.runs[usize::from(slot)];
            if run.continues(file, write, offset_bytes, len_bytes) {
                run.parts[run.count] = part;
                run.count += 1;
                run.len_bytes += u64::from(len_bytes);
                return Ok(());
            }
            // It cannot grow: send it now and let this IO start the next run.
            if !pushed(self.push_run(slot)) {
                return Err(io);
            }
            self.open[role] = None;
            self.open_roles &= !(1 << role);
        }
        let Some(slot) = (!quiet).then(|| self.free_runs.pop()).flatten() else {
            // A quiet ring, or every run slot is busy: this one goes unmerged.
            return if pushed(self.push_plain(file, write, offset_bytes, part)) {
                Ok(())
            } else {
                Err(io)
            };
        };
        let run = &mut self.runs[usize::from(slot)];
        run.file = file;
        run.write = write;
        run.offset_bytes = offset_bytes;
        run.len_bytes = u64::from(len_bytes);
        run.parts[0] = part;
        run.count = 1;
        self.open[role] = Some(slot);
        self.open_roles |= 1 << role;
        Ok(())
    }
}

impl Driver for UringDriver {
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo> {
        assert_eq!(io.token.0 & MERGED_TAG, 0, "engine tokens leave the merged tag bit clear");
        let file = self.role_file[io.member.get()];
        let op = match io.kind {
            MemberIoKind::Read { .. } => return self.stage(io, file, false),
            MemberIoKind::Write { durability: Durability::Cached, .. } => {
                return self.stage(io, file, true);
            }
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, durability: Durability::Fua } => {
                Op::Write { file, offset_bytes, ptr, len_bytes, fua: true }
            }
            MemberIoKind::Flush => Op::Flush { file },
            MemberIoKind::Discard { offset_bytes, len_bytes } => {
                Op::Discard { file, offset_bytes, len_bytes }
            }
            MemberIoKind::WriteZeroes { offset_bytes, len_bytes } => {
                Op::WriteZeroes { file, offset_bytes, len_bytes }
            }
        };
        // SAFETY: the engine's memory contract (flashraid_engine::io): buffers named by a
        // Read or Write stay valid and untouched until this token's completion is delivered,
        // which happens only after the ring reaps it.
        if !pushed(unsafe { self.ring.push(op, io.token.0) }) {
            return Err(io);
        }
        if let Op::Write { len_bytes, .. } = op {
            self.transfer_len.insert(io.token.0, len_bytes);
        }
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion)) {
        let lens = &mut self.transfer_len;
        let runs = &mut self.runs;
        let free_runs = &mut self.free_runs;
        let retries = &mut self.retries;
        let reads_retried = &mut self.reads_retried;
        self.ring.reap(|user_data, result| {
            if user_data & MERGED_TAG != 0 {
                let slot = u16::try_from(user_data & !MERGED_TAG).expect("a run slot");
                let run = &mut runs[usize::from(slot)];
                let len = u32::try_from(run.len_bytes).expect("merged IOs fit u32");
                let transfer = check_transfer(result, len);
                // A short merged read ends inside the run: its parts before the end are
                // whole, so each is read again to learn which one the member's end cuts.
                let short_read =
                    !run.write && transfer.as_ref().is_err_and(|e| e.errno().is_none());
                let outcome = transfer.map_err(io_error);
                if outcome.is_ok() || run.write || (outcome == Err(IoError::Gone) && !short_read) {
                    // Success, or a failure every part shares (module docs).
                    for part in &run.parts[..run.count] {
                        sink(MemberCompletion { token: IoToken(part.token), result: outcome });
                    }
                    free_runs.push(slot);
                } else {
                    // A read: each part again on its own, for its own result (module docs);
                    // the slot is freed once all are pushed. One entry per slot: bounded.
                    run.retried = 0;
                    run.retry_offset_bytes = run.offset_bytes;
                    assert!(retries.len() < MERGED_RUNS_MAX, "one retry entry per run slot");
                    retries.push_back(slot);
                    *reads_retried += 1;
                }
                return;
            }
            let outcome = match lens.remove(&user_data) {
                Some(len) => check_transfer(result, len),
                None => check_status(result),
            };
            sink(MemberCompletion { token: IoToken(user_data), result: outcome.map_err(io_error) });
        });
        self.in_flight_after_reap = self.ring.in_flight();
    }
}

/// The engine's view of a failed transfer.
fn io_error(error: flashraid_uring::TransferError) -> IoError {
    match error.errno() {
        Some(errno) => IoError::from_errno(errno),
        // A short transfer: O_DIRECT transfers are short only at the end of the device, so
        // the member shrank under us (a truncated file). Not a bad range to rewrite: found
        // by a misuse test, the repair's write grew the file back with a hole, whose zeros
        // were then read as good data. The member is gone.
        None => IoError::Gone,
    }
}

/// Whether a push went through. `Full` is backpressure (false: try again after reaping);
/// any other refusal is a malformed IO, an engine or driver bug, and stops the reactor
/// loudly rather than leaving the IO stuck.
fn pushed(push: Result<(), RingError>) -> bool {
    match push {
        Ok(()) => true,
        Err(RingError::Full) => false,
        Err(e) => panic!("io_uring refused a well-formed member IO: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashraid_iobuf::IoBuf;
    use flashraid_layout::MemberIndex;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;

    const BLOCK: usize = 4096;

    /// A scratch file of `blocks` blocks, block `i` filled with byte `i + 1`.
    fn member_file(blocks: usize) -> std::fs::File {
        let mut file = tempfile::tempfile().unwrap();
        for i in 0..blocks {
            file.write_all(&[u8::try_from(i + 1).unwrap(); BLOCK]).unwrap();
        }
        file
    }

    /// A driver that merges from the first IO (these tests have nothing else in flight).
    fn driver(files: &[&std::fs::File]) -> UringDriver {
        let mut ring = Ring::new(64).unwrap();
        let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
        ring.register_files(&fds).unwrap();
        let mut d = UringDriver::new(ring);
        d.merge_in_flight_min = 0;
        d
    }

    #[test]
    fn a_quiet_ring_does_not_merge() {
        let a = member_file(4);
        let mut d = driver(&[&a]);
        d.merge_in_flight_min = MERGE_IN_FLIGHT_MIN;
        let mut bufs: [IoBuf; 2] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let [b0, b1] = bufs.each_mut();
        let done = run(&mut d, vec![read(1, 0, 0, b0), read(2, 0, 1, b1)], 2);
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert_eq!(d.merged_pushed(), 0);
        assert!(bufs[1].as_slice().iter().all(|&x| x == 2));
    }

    fn read(token: u64, member: u16, block: usize, buf: &mut IoBuf) -> MemberIo {
        MemberIo {
            token: IoToken(token),
            member: MemberIndex(member),
            kind: MemberIoKind::Read {
                offset_bytes: (block * BLOCK) as u64,
                ptr: buf.as_mut_ptr(),
                len_bytes: BLOCK as u32,
            },
        }
    }

    fn write(token: u64, block: usize, buf: &IoBuf, durability: Durability) -> MemberIo {
        MemberIo {
            token: IoToken(token),
            member: MemberIndex(0),
            kind: MemberIoKind::Write {
                offset_bytes: (block * BLOCK) as u64,
                ptr: buf.as_slice().as_ptr(),
                len_bytes: BLOCK as u32,
                durability,
            },
        }
    }

    /// Submit, then collect `count` completions.
    fn run(d: &mut UringDriver, ios: Vec<MemberIo>, count: usize) -> Vec<MemberCompletion> {
        for io in ios {
            d.submit(io).expect("room");
        }
        collect(d, count)
    }

    /// Push what is staged and collect `count` completions, sorted by token.
    fn collect(d: &mut UringDriver, count: usize) -> Vec<MemberCompletion> {
        let mut done = vec![];
        while done.len() < count {
            d.submit_ring(1, Some(std::time::Duration::from_millis(100))).unwrap();
            d.poll(&mut |c| done.push(c));
        }
        done.sort_by_key(|c| c.token.0);
        done
    }

    /// Neighbouring reads of one member become one IO; others stay apart; every token
    /// completes once with its own bytes.
    #[test]
    fn neighbouring_reads_of_a_member_merge_and_land_in_their_own_buffers() {
        let (a, b) = (member_file(8), member_file(8));
        let mut d = driver(&[&a, &b]);
        let mut bufs: [IoBuf; 6] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let [b0, b1, b2, b3, b4, b5] = bufs.each_mut();
        let ios = vec![
            read(1, 0, 2, b0),
            read(2, 1, 2, b1), // another member: its own run
            read(3, 0, 3, b2),
            read(4, 0, 4, b3),
            read(5, 1, 6, b4), // not next to block 2: a new run
            read(6, 0, 5, b5),
        ];
        let done = run(&mut d, ios, 6);
        assert_eq!(done.iter().map(|c| c.token.0).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        let blocks = [2, 2, 3, 4, 6, 5];
        for (buf, block) in bufs.iter().zip(blocks) {
            assert!(buf.as_slice().iter().all(|&x| x == block as u8 + 1), "block {block}");
        }
        // Member 0's four reads went as one; member 1's two reads as two plain ones.
        assert_eq!(d.merged_pushed(), 1);
    }

    #[test]
    fn neighbouring_cached_writes_merge_and_fua_writes_do_not() {
        let mut a = member_file(8);
        let mut d = driver(&[&a]);
        let mut bufs: Vec<IoBuf> = (0..3).map(|_| IoBuf::new(BLOCK)).collect();
        for (i, buf) in bufs.iter_mut().enumerate() {
            buf.as_mut_slice().fill(0xa0 + i as u8);
        }
        let ios = vec![
            write(1, 1, &bufs[0], Durability::Cached),
            write(2, 2, &bufs[1], Durability::Cached),
            write(3, 3, &bufs[2], Durability::Fua),
        ];
        let done = run(&mut d, ios, 3);
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert_eq!(d.merged_pushed(), 1, "blocks 1 and 2 merge; the FUA write stays apart");
        let mut contents = vec![0u8; 8 * BLOCK];
        a.seek(SeekFrom::Start(0)).unwrap();
        a.read_exact(&mut contents).unwrap();
        let block = |i: usize| &contents[i * BLOCK..(i + 1) * BLOCK];
        assert!(block(0).iter().all(|&x| x == 1));
        assert!(block(1).iter().all(|&x| x == 0xa0));
        assert!(block(2).iter().all(|&x| x == 0xa1));
        assert!(block(3).iter().all(|&x| x == 0xa2));
        assert!(block(4).iter().all(|&x| x == 5));
    }

    /// A merged read that comes back short is not reported whole: each part is read again on
    /// its own, so only the part past the end fails, as it would unmerged.
    #[test]
    fn a_short_merged_read_is_retried_part_by_part() {
        let a = member_file(3);
        let mut d = driver(&[&a]);
        let mut bufs: [IoBuf; 3] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let [b0, b1, b2] = bufs.each_mut();
        let ios = vec![read(1, 0, 1, b0), read(2, 0, 2, b1), read(3, 0, 3, b2)];
        let done = run(&mut d, ios, 3);
        assert_eq!(d.merged_pushed(), 1);
        assert_eq!(done[0].result, Ok(()));
        assert_eq!(done[1].result, Ok(()));
        assert_eq!(
            done[2].result,
            Err(IoError::Gone),
            "block 3 is past the end: the member shrank"
        );
        assert_eq!(d.reads_retried(), 1);
        assert!(bufs[0].as_slice().iter().all(|&x| x == 2));
        assert!(bufs[1].as_slice().iter().all(|&x| x == 3));
    }

    /// Any write error fails the member whichever part it hit, so a failed merged write fails
    /// every part at once; nothing is written again.
    #[test]
    fn a_failed_merged_write_fails_every_part() {
        let file = member_file(4);
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let read_only = std::fs::File::open(path).unwrap();
        let mut d = driver(&[&read_only]);
        let bufs: [IoBuf; 2] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let ios = vec![
            write(1, 0, &bufs[0], Durability::Cached),
            write(2, 1, &bufs[1], Durability::Cached),
        ];
        let done = run(&mut d, ios, 2);
        assert_eq!(d.merged_pushed(), 1);
        assert!(done.iter().all(|c| c.result == Err(IoError::Media)), "{done:?}");
        assert_eq!(d.reads_retried(), 0);
    }

    /// IO staged for a file that is let go (or whose role failed) fails as `Gone` and never
    /// reaches the kernel; IO staged for other files is untouched and completes.
    #[test]
    fn staged_io_for_a_file_let_go_fails_and_the_rest_completes() {
        let (a, b) = (member_file(4), member_file(4));
        let mut d = driver(&[&a, &b]);
        let mut bufs: [IoBuf; 4] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let [b0, b1, b2, b3] = bufs.each_mut();
        for io in [read(1, 0, 0, b0), read(2, 0, 1, b1), read(3, 1, 2, b2), read(4, 1, 3, b3)] {
            d.submit(io).expect("room");
        }
        let mut failed = vec![];
        d.fail_staged_for_file(d.role_file(0), &mut |c| failed.push(c));
        failed.sort_by_key(|c| c.token.0);
        assert_eq!(failed.iter().map(|c| c.token.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(failed.iter().all(|c| c.result == Err(IoError::Gone)));
        let done = collect(&mut d, 2);
        assert_eq!(done.iter().map(|c| c.token.0).collect::<Vec<_>>(), vec![3, 4]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert!(bufs[0].as_slice().iter().all(|&x| x == 0), "a failed read reached the file");
        assert!(bufs[2].as_slice().iter().all(|&x| x == 3));
        // Nothing is left staged, and the run slots came back.
        d.submit_ring(0, None).unwrap();
        assert_eq!(d.ring.in_flight(), 0);
        assert_eq!(d.free_runs.len(), MERGED_RUNS_MAX);
    }

    /// The parts of a failed merged read that wait to be read again are staged IO too: a
    /// file let go meanwhile fails them, once each, and frees their run slot.
    #[test]
    fn a_pending_retry_for_a_file_let_go_fails() {
        let a = member_file(3);
        let mut d = driver(&[&a]);
        let mut bufs: [IoBuf; 3] = std::array::from_fn(|_| IoBuf::new(BLOCK));
        let [b0, b1, b2] = bufs.each_mut();
        for io in [read(1, 0, 1, b0), read(2, 0, 2, b1), read(3, 0, 3, b2)] {
            d.submit(io).expect("room");
        }
        // The merged read comes back short (block 3 is past the end): its parts wait to
        // be pushed again one by one at the next submit.
        let mut done = vec![];
        while d.reads_retried() == 0 {
            d.submit_ring(1, Some(std::time::Duration::from_millis(100))).unwrap();
            d.poll(&mut |c| done.push(c));
        }
        assert!(done.is_empty(), "{done:?}");
        d.fail_staged_for_file(0, &mut |c| done.push(c));
        done.sort_by_key(|c| c.token.0);
        assert_eq!(done.iter().map(|c| c.token.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(done.iter().all(|c| c.result == Err(IoError::Gone)));
        d.submit_ring(0, None).unwrap();
        assert_eq!(d.ring.in_flight(), 0, "a failed part was pushed anyway");
        assert_eq!(d.free_runs.len(), MERGED_RUNS_MAX);
    }

    /// A malformed IO is a bug to stop at, not backpressure to wait out forever.
    #[test]
    #[should_panic(expected = "refused a well-formed member IO")]
    fn a_misaligned_staged_read_stops_loudly() {
        let a = member_file(2);
        let mut d = driver(&[&a]);
        let mut buf = IoBuf::new(BLOCK);
        let io = MemberIo {
            token: IoToken(1),
            member: MemberIndex(0),
            kind: MemberIoKind::Read { offset_bytes: 100, ptr: buf.as_mut_ptr(), len_bytes: 4096 },
        };
        d.submit(io).expect("staged");
        let _ = d.submit_ring(0, None);
    }
}
