//! Ring: concurrent random IO with verification, flush and FUA, backpressure, error
//! propagation, discard and write-zeroes, the waker, registered buffers and misuse.

mod common;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use common::{LoopDevice, Rng, SHM_DIR, TMP_DIR, TempPath, check_stamp, seed, stamp};
use flashraid_iobuf::IoBuf;
use flashraid_uring::{
    Access, Device, Op, Ring, RingError, TransferError, USER_DATA_RESERVED, Waker, check_status,
    check_transfer,
};

const MIB: u64 = 1 << 20;
const BLOCK_BYTES: u64 = 4096;
const WAIT: Option<Duration> = Some(Duration::from_secs(5));

/// Push `op`, submit, and wait for its completion; returns the result.
fn run_one(ring: &mut Ring, op: Op, user_data: u64) -> i32 {
    // SAFETY: the caller's buffer (if any) outlives this call, which reaps the completion
    // before returning.
    unsafe { ring.push(op, user_data) }.unwrap();
    let mut result = None;
    while result.is_none() {
        ring.submit(1, WAIT).unwrap();
        ring.reap(|done, value| {
            assert_eq!(done, user_data);
            result = Some(value);
        });
    }
    result.unwrap()
}

fn read_op(buf: &mut IoBuf, offset_bytes: u64, len_bytes: usize) -> Op {
    let len_bytes = u32::try_from(len_bytes).unwrap();
    Op::Read { file: 0, offset_bytes, ptr: buf.as_mut_ptr(), len_bytes }
}

fn write_op(buf: &mut IoBuf, offset_bytes: u64, len_bytes: usize, fua: bool) -> Op {
    let len_bytes = u32::try_from(len_bytes).unwrap();
    Op::Write { file: 0, offset_bytes, ptr: buf.as_mut_ptr(), len_bytes, fua }
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    write: Option<u64>, // the generation written, or None for a read
    first_block: u64,
    blocks: u64,
}

const SLOTS: usize = 48;
const BLOCKS_PER_OP_MAX: u64 = 4;
const FLUSH_TAG: u64 = 1 << 40;

/// Random reads and writes of 1-4 blocks at random offsets, up to `SLOTS` in flight (more
/// than the ring's 32 submission entries, so backpressure happens), with occasional FUA
/// writes and flushes. Every read is checked against the model as it completes, and the
/// whole device at the end. No two operations in flight touch the same block.
fn random_workload(label: &str, device: &Device, ops_total: usize, seed: u64) {
    let blocks_total = device.size_bytes() / BLOCK_BYTES;
    let mut generation = vec![0u64; blocks_total as usize];
    let mut image = IoBuf::new(device.size_bytes() as usize);
    for (index, block) in image.as_mut_slice().chunks_mut(BLOCK_BYTES as usize).enumerate() {
        stamp(block, index as u64, 0);
    }
    device.write_at(image.as_slice(), 0).unwrap();

    let mut ring = Ring::new(32).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    let mut rng = Rng::new(seed);
    let mut bufs: Vec<IoBuf> =
        (0..SLOTS).map(|_| IoBuf::new((BLOCKS_PER_OP_MAX * BLOCK_BYTES) as usize)).collect();
    let mut slots: Vec<Option<InFlight>> = vec![None; SLOTS];
    let mut free: Vec<usize> = (0..SLOTS).rev().collect();
    let mut busy = vec![false; blocks_total as usize];
    let (mut issued, mut completed, mut next_generation) = (0, 0, 1u64);
    let (mut reads_checked, mut full_seen, mut flushes_pending) = (0usize, 0usize, 0usize);
    let mut in_flight_peak = 0;

    while completed < ops_total || flushes_pending > 0 {
        let mut collisions = 0;
        while issued < ops_total {
            let Some(&slot) = free.last() else { break };
            if rng.below(32) == 0 {
                // SAFETY: a flush lends no memory.
                match unsafe { ring.push(Op::Flush { file: 0 }, FLUSH_TAG + issued as u64) } {
                    Ok(()) => flushes_pending += 1,
                    Err(RingError::Full) => {
                        full_seen += 1;
                        break;
                    }
                    Err(error) => panic!("{error}"),
                }
            }
            let blocks = 1 + rng.below(BLOCKS_PER_OP_MAX);
            let first_block = rng.below(blocks_total - blocks + 1);
            let range = first_block as usize..(first_block + blocks) as usize;
            if busy[range.clone()].iter().any(|&busy| busy) {
                // Something is in flight there: pick again, a few times, then submit and reap.
                collisions += 1;
                if collisions == 8 {
                    break;
                }
                continue;
            }
            let len_bytes = (blocks * BLOCK_BYTES) as usize;
            let offset_bytes = first_block * BLOCK_BYTES;
            let buf = &mut bufs[slot];
            let (op, write) = if rng.below(2) == 0 {
                let written = next_generation;
                next_generation += 1;
                let data = &mut buf.as_mut_slice()[..len_bytes];
                for (index, block) in data.chunks_mut(BLOCK_BYTES as usize).enumerate() {
                    stamp(block, first_block + index as u64, written);
                }
                (write_op(buf, offset_bytes, len_bytes, rng.below(8) == 0), Some(written))
            } else {
                (read_op(buf, offset_bytes, len_bytes), None)
            };
            // SAFETY: bufs[slot] is not touched again until the completion for `slot` is
            // reaped below, and outlives the ring.
            match unsafe { ring.push(op, slot as u64) } {
                Ok(()) => {}
                Err(RingError::Full) => {
                    full_seen += 1;
                    break;
                }
                Err(error) => panic!("{error}"),
            }
            busy[range].fill(true);
            slots[slot] = Some(InFlight { write, first_block, blocks });
            free.pop();
            issued += 1;
        }
        in_flight_peak = in_flight_peak.max(ring.in_flight());
        ring.submit(1, WAIT).unwrap();
        ring.reap(|user_data, result| {
            if user_data >= FLUSH_TAG {
                check_status(result).unwrap();
                flushes_pending -= 1;
                return;
            }
            let slot = user_data as usize;
            let in_flight = slots[slot].take().expect("one completion per push");
            let len_bytes = in_flight.blocks * BLOCK_BYTES;
            check_transfer(result, len_bytes as u32).unwrap();
            let blocks = in_flight.first_block..in_flight.first_block + in_flight.blocks;
            let data = &bufs[slot].as_slice()[..len_bytes as usize];
            for (block, bytes) in blocks.clone().zip(data.chunks(BLOCK_BYTES as usize)) {
                match in_flight.write {
                    Some(written) => generation[block as usize] = written,
                    None => check_stamp(bytes, block, generation[block as usize]).unwrap(),
                }
                busy[block as usize] = false;
            }
            reads_checked += usize::from(in_flight.write.is_none());
            free.push(slot);
            completed += 1;
        });
    }
    assert_eq!(ring.in_flight(), 0);
    assert!(reads_checked > ops_total / 4, "{reads_checked} reads checked");
    println!(
        "{label}: {ops_total} ops, {reads_checked} reads checked, Full seen {full_seen} times, \
         in-flight peak {in_flight_peak}"
    );

    device.read_at(image.as_mut_slice(), 0).unwrap();
    for (index, block) in image.as_slice().chunks(BLOCK_BYTES as usize).enumerate() {
        check_stamp(block, index as u64, generation[index]).unwrap();
    }
}

#[test]
fn random_reads_and_writes_verify_on_tmpfs() {
    const LABEL: &str = "random_reads_and_writes_verify_on_tmpfs";
    let temp = TempPath::new(SHM_DIR, "random");
    let device = Device::create_file(temp.path(), 4 * MIB).unwrap();
    random_workload(LABEL, &device, 20_000, seed(LABEL));
}

#[test]
fn random_reads_and_writes_verify_on_ext4() {
    const LABEL: &str = "random_reads_and_writes_verify_on_ext4";
    let temp = TempPath::new(TMP_DIR, "random");
    let device = Device::create_file(temp.path(), 4 * MIB).unwrap();
    random_workload(LABEL, &device, 10_000, seed(LABEL));
}

#[test]
fn random_reads_and_writes_verify_on_a_loop_device() {
    const LABEL: &str = "random_reads_and_writes_verify_on_a_loop_device";
    let Some(loop_device) = LoopDevice::attach(4 * MIB, 512, "ring-random") else { return };
    let device = Device::open(loop_device.path(), Access::ReadWrite).unwrap();
    random_workload(LABEL, &device, 10_000, seed(LABEL));
}

#[test]
fn fua_writes_and_flushes_complete_and_the_data_is_there() {
    let temp = TempPath::new(TMP_DIR, "fua");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut ring = Ring::new(8).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    let mut buf = IoBuf::new(8192);
    stamp(&mut buf.as_mut_slice()[..4096], 3, 11);
    stamp(&mut buf.as_mut_slice()[4096..], 4, 11);
    let result = run_one(&mut ring, write_op(&mut buf, 3 * BLOCK_BYTES, 8192, true), 1);
    check_transfer(result, 8192).unwrap();
    let result = run_one(&mut ring, write_op(&mut buf, 10 * BLOCK_BYTES, 8192, false), 2);
    check_transfer(result, 8192).unwrap();
    check_status(run_one(&mut ring, Op::Flush { file: 0 }, 3)).unwrap();

    let mut read = IoBuf::new(8192);
    for offset_bytes in [3 * BLOCK_BYTES, 10 * BLOCK_BYTES] {
        device.read_at(read.as_mut_slice(), offset_bytes).unwrap();
        assert_eq!(read.as_slice(), buf.as_slice());
    }
}

#[test]
fn a_full_queue_is_backpressure_and_nothing_is_lost() {
    let temp = TempPath::new(SHM_DIR, "full");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut ring = Ring::new(8).unwrap();
    assert_eq!(ring.in_flight_max(), 16, "completion queue: twice the submission queue");
    ring.register_files(&[device.raw_fd()]).unwrap();
    let ops_total = 100u64;
    let mut bufs: Vec<IoBuf> = (0..ops_total).map(|_| IoBuf::new(4096)).collect();
    for (index, buf) in bufs.iter_mut().enumerate() {
        stamp(buf.as_mut_slice(), index as u64, 5);
    }
    let push = |ring: &mut Ring, bufs: &mut [IoBuf], index: u64| {
        let op = write_op(&mut bufs[index as usize], index * BLOCK_BYTES, 4096, false);
        // SAFETY: bufs outlives the ring's use of it: every completion is reaped below.
        unsafe { ring.push(op, index) }
    };

    // The submission queue holds 8 entries; operations get 7, one is the waker's.
    for index in 0..7 {
        push(&mut ring, &mut bufs, index).unwrap();
    }
    assert!(matches!(push(&mut ring, &mut bufs, 7), Err(RingError::Full)));
    assert_eq!(ring.in_flight(), 7, "the refused push queued nothing");
    assert_eq!(ring.submit(0, None).unwrap(), 7);
    // The in-flight limit (16, one of them the waker's) holds even when the submission
    // queue has room.
    for index in 7..14 {
        push(&mut ring, &mut bufs, index).unwrap();
    }
    assert_eq!(ring.submit(0, None).unwrap(), 7);
    push(&mut ring, &mut bufs, 14).unwrap();
    assert_eq!(ring.submit(0, None).unwrap(), 1);
    assert!(matches!(push(&mut ring, &mut bufs, 15), Err(RingError::Full)));
    // The waker can still be armed with operations at their limit (before the reserve, a
    // reactor whose waker completed while its ring was this full stayed unarmed and slept
    // through every wake), and once it is armed operations get no more room.
    let waker = Waker::new().unwrap();
    ring.arm_waker(&waker, u64::MAX - 7).unwrap();
    assert!(matches!(push(&mut ring, &mut bufs, 15), Err(RingError::Full)));
    waker.wake();
    let mut woken = false;

    let mut seen = vec![0u32; ops_total as usize];
    let mut next = 15;
    while seen.iter().sum::<u32>() < ops_total as u32 {
        while next < ops_total {
            match push(&mut ring, &mut bufs, next) {
                Ok(()) => next += 1,
                Err(RingError::Full) => break,
                Err(error) => panic!("{error}"),
            }
        }
        ring.submit(1, WAIT).unwrap();
        ring.reap(|user_data, result| {
            if user_data == u64::MAX - 7 {
                woken = true;
                return;
            }
            check_transfer(result, 4096).unwrap();
            seen[user_data as usize] += 1;
        });
    }
    while !woken {
        ring.submit(1, WAIT).unwrap();
        ring.reap(|user_data, _| woken |= user_data == u64::MAX - 7);
    }
    assert!(seen.iter().all(|&count| count == 1), "every op completes exactly once");
    let mut read = IoBuf::new(4096);
    for index in 0..ops_total {
        device.read_at(read.as_mut_slice(), index * BLOCK_BYTES).unwrap();
        check_stamp(read.as_slice(), index, 5).unwrap();
    }
}

#[test]
fn io_errors_come_back_as_negative_results() {
    let temp = TempPath::new(TMP_DIR, "errors");
    let writable = Device::create_file(temp.path(), MIB).unwrap();
    let read_only = Device::open(temp.path(), Access::ReadOnly).unwrap();
    let mut ring = Ring::new(8).unwrap();
    ring.register_files(&[read_only.raw_fd(), writable.raw_fd()]).unwrap();
    let mut buf = IoBuf::new(8192);
    let ptr = buf.as_mut_ptr();

    let errno = |result: i32| check_transfer(result, 4096).map_err(|error| error.errno());
    let write = Op::Write { file: 0, offset_bytes: 0, ptr, len_bytes: 4096, fua: false };
    assert_eq!(errno(run_one(&mut ring, write, 1)), Err(Some(libc::EBADF)), "write to read-only");
    let zeroes = Op::WriteZeroes { file: 0, offset_bytes: 0, len_bytes: 4096 };
    assert_eq!(run_one(&mut ring, zeroes, 2), -libc::EBADF);

    let at_end = Op::Read { file: 1, offset_bytes: MIB, ptr, len_bytes: 4096 };
    let short = TransferError::Short { done_bytes: 0, len_bytes: 4096 };
    assert_eq!(check_transfer(run_one(&mut ring, at_end, 4), 4096), Err(short), "EOF is short");

    let Some(loop_device) = LoopDevice::attach(MIB, 512, "errors") else { return };
    let block = Device::open(loop_device.path(), Access::ReadWrite).unwrap();
    let mut ring = Ring::new(8).unwrap();
    ring.register_files(&[block.raw_fd()]).unwrap();
    let past_end = Op::Write { file: 0, offset_bytes: MIB, ptr, len_bytes: 4096, fua: false };
    let result = run_one(&mut ring, past_end, 5);
    assert_eq!(result, -libc::ENOSPC, "a write past the end of a block device fails");
    // Reads at or past the end are not errors to the kernel: they are short (0 bytes).
    let straddling = Op::Read { file: 0, offset_bytes: MIB - 4096, ptr, len_bytes: 8192 };
    let short = TransferError::Short { done_bytes: 4096, len_bytes: 8192 };
    assert_eq!(check_transfer(run_one(&mut ring, straddling, 6), 8192), Err(short));
    let past_end = Op::Read { file: 0, offset_bytes: 2 * MIB, ptr, len_bytes: 4096 };
    let short = TransferError::Short { done_bytes: 0, len_bytes: 4096 };
    assert_eq!(check_transfer(run_one(&mut ring, past_end, 7), 4096), Err(short));
    drop(ring);
    drop(block);
}

#[test]
fn discard_and_write_zeroes_ops_on_files_and_block_devices() {
    let fill_and_clear = |device: &Device, op: Op| -> i32 {
        let mut buf = IoBuf::new(4 * 4096);
        for (index, block) in buf.as_mut_slice().chunks_mut(4096).enumerate() {
            stamp(block, index as u64, 9);
        }
        device.write_at(buf.as_slice(), 0).unwrap();
        let mut ring = Ring::new(4).unwrap();
        ring.register_files(&[device.raw_fd()]).unwrap();
        let result = run_one(&mut ring, op, 77);
        if result == 0 {
            device.read_at(buf.as_mut_slice(), 0).unwrap();
            check_stamp(&buf.as_slice()[..4096], 0, 9).unwrap();
            check_stamp(&buf.as_slice()[3 * 4096..], 3, 9).unwrap();
            let cleared = &buf.as_slice()[4096..3 * 4096];
            if !matches!(op, Op::Discard { .. }) || device.capabilities().discard_zeroes {
                assert!(cleared.iter().all(|&byte| byte == 0), "{op:?} reads back zeroes");
            }
        }
        result
    };
    let discard = Op::Discard { file: 0, offset_bytes: 4096, len_bytes: 8192 };
    let zeroes = Op::WriteZeroes { file: 0, offset_bytes: 4096, len_bytes: 8192 };

    let ext4 = TempPath::new(TMP_DIR, "ops");
    let device = Device::create_file(ext4.path(), MIB).unwrap();
    assert_eq!(fill_and_clear(&device, discard), 0);
    assert_eq!(fill_and_clear(&device, zeroes), 0);

    let tmpfs = TempPath::new(SHM_DIR, "ops");
    let device = Device::create_file(tmpfs.path(), MIB).unwrap();
    assert_eq!(fill_and_clear(&device, discard), 0);
    assert_eq!(fill_and_clear(&device, zeroes), -libc::EOPNOTSUPP, "tmpfs has no zero-range");

    let Some(loop_device) = LoopDevice::attach(MIB, 512, "ops") else { return };
    let device = Device::open(loop_device.path(), Access::ReadWrite).unwrap();
    assert_eq!(fill_and_clear(&device, zeroes), 0);
    assert_eq!(fill_and_clear(&device, discard), 0);

    // A block-device discard completes inside push: reap reports it before any submit.
    let mut ring = Ring::new(4).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    // SAFETY: a discard lends no memory.
    unsafe { ring.push(discard, 5) }.unwrap();
    assert_eq!(ring.in_flight(), 1);
    let mut reaped = Vec::new();
    assert_eq!(ring.reap(|user_data, result| reaped.push((user_data, result))), 1);
    assert_eq!(reaped, [(5, 0)]);
    assert_eq!(ring.in_flight(), 0);
    let beyond = Op::Discard { file: 0, offset_bytes: 2 * MIB, len_bytes: 4096 };
    assert_eq!(run_one(&mut ring, beyond, 6), -libc::EINVAL, "BLKDISCARD past the end");
}

#[test]
fn a_waker_wakes_a_thread_blocked_in_submit() {
    let waker = Waker::new().unwrap();
    let mut ring = Ring::new(4).unwrap();
    ring.arm_waker(&waker, 42).unwrap();
    assert!(matches!(ring.arm_waker(&waker, 43), Err(RingError::WakerArmed)));
    assert_eq!(ring.in_flight(), 0, "the waker read is not an op");

    let remote = waker.clone();
    let delay = Duration::from_millis(100);
    let waking = thread::spawn(move || {
        thread::sleep(delay);
        remote.wake();
    });
    let started = Instant::now();
    ring.submit(1, Some(Duration::from_secs(5))).unwrap();
    let mut reaped = Vec::new();
    ring.reap(|user_data, result| reaped.push((user_data, result)));
    let elapsed = started.elapsed();
    waking.join().unwrap();
    assert_eq!(reaped, [(42, 8)]);
    assert!(elapsed >= delay && elapsed < Duration::from_secs(1), "woke after {elapsed:?}");
    assert!(!ring.is_waker_armed());

    // A wake before the ring waits is not lost, and wakes coalesce.
    waker.wake();
    waker.wake();
    ring.arm_waker(&waker, 44).unwrap();
    let started = Instant::now();
    ring.submit(1, Some(Duration::from_secs(5))).unwrap();
    let mut reaped = Vec::new();
    ring.reap(|user_data, result| reaped.push((user_data, result)));
    assert_eq!(reaped, [(44, 8)]);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn submit_times_out_and_drop_completes_an_armed_waker() {
    let waker = Waker::new().unwrap();
    let mut ring = Ring::new(4).unwrap();
    ring.arm_waker(&waker, 1).unwrap();
    let started = Instant::now();
    assert_eq!(ring.submit(1, Some(Duration::from_millis(50))).unwrap(), 1);
    assert_eq!(ring.submit(1, Some(Duration::from_millis(50))).unwrap(), 0);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(50) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert_eq!(ring.reap(|_, _| panic!("nothing completed")), 0);
    // Nothing in flight: a wait cannot block forever on nothing.
    let mut idle = Ring::new(4).unwrap();
    let started = Instant::now();
    assert_eq!(idle.submit(1, None).unwrap(), 0);
    assert!(started.elapsed() < Duration::from_secs(1));
    drop(ring); // must not hang: the drop wakes its own armed read and reaps it
}

#[test]
fn dropping_a_ring_waits_for_io_in_flight() {
    let temp = TempPath::new(TMP_DIR, "drop");
    let device = Device::create_file(temp.path(), 4 * MIB).unwrap();
    let mut bufs: Vec<IoBuf> = (0..16).map(|_| IoBuf::new(64 * 1024)).collect();
    {
        // 32 entries: 16 reads fit beside the slot kept for the waker.
        let mut ring = Ring::new(32).unwrap();
        ring.register_files(&[device.raw_fd()]).unwrap();
        for (index, buf) in bufs.iter_mut().enumerate() {
            let op = read_op(buf, index as u64 * 64 * 1024, 64 * 1024);
            // SAFETY: bufs outlives the ring, whose drop waits for these reads.
            unsafe { ring.push(op, index as u64) }.unwrap();
        }
        ring.submit(0, None).unwrap();
        // Dropped with 16 reads in flight and none reaped.
    }
    drop(bufs);
}

#[test]
fn registered_buffers_round_trip() {
    let temp = TempPath::new(SHM_DIR, "fixed");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut bufs: Vec<IoBuf> = (0..2).map(|_| IoBuf::new(16 * 1024)).collect();
    let mut ring = Ring::new(8).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    let regions: Vec<(*mut u8, usize)> =
        bufs.iter_mut().map(|buf| (buf.as_mut_ptr(), buf.capacity_bytes())).collect();
    // SAFETY: bufs outlives the ring (declared before it, dropped after).
    unsafe { ring.register_buffers(&regions) }.unwrap();
    // SAFETY: as above.
    let again = unsafe { ring.register_buffers(&regions) };
    assert!(matches!(again, Err(RingError::BuffersAlreadyRegistered)));

    for (index, block) in bufs[0].as_mut_slice().chunks_mut(4096).enumerate() {
        stamp(block, index as u64, 3);
    }
    let write = Op::WriteFixed {
        file: 0,
        offset_bytes: 8192,
        ptr: bufs[0].as_mut_ptr(),
        len_bytes: 16 * 1024,
        buf_index: 0,
        fua: false,
    };
    check_transfer(run_one(&mut ring, write, 1), 16 * 1024).unwrap();
    // Read the middle 8 KiB into the middle of the second registered buffer.
    let ptr = bufs[1].as_mut_slice()[4096..].as_mut_ptr();
    let read =
        Op::ReadFixed { file: 0, offset_bytes: 8192 + 4096, ptr, len_bytes: 8192, buf_index: 1 };
    check_transfer(run_one(&mut ring, read, 2), 8192).unwrap();
    assert_eq!(&bufs[1].as_slice()[4096..12288], &bufs[0].as_slice()[4096..12288]);

    // A range outside the named registered buffer is the kernel's to refuse.
    let outside = Op::ReadFixed { file: 0, offset_bytes: 0, ptr, len_bytes: 4096, buf_index: 0 };
    assert_eq!(run_one(&mut ring, outside, 4), -libc::EFAULT);

    let unknown = Op::ReadFixed { file: 0, offset_bytes: 0, ptr, len_bytes: 4096, buf_index: 2 };
    // SAFETY: refused before anything is queued.
    let error = unsafe { ring.push(unknown, 3) }.unwrap_err();
    assert!(matches!(error, RingError::UnknownBuffer { buf_index: 2, registered: 2 }), "{error}");
    drop(ring);
}

/// Push an op the ring must refuse before queuing it.
fn refuse(ring: &mut Ring, op: Op, user_data: u64) -> RingError {
    // SAFETY: the ops passed here are flushes or are refused before anything is queued, so
    // no memory is lent (and their pointers are never dereferenced).
    let result = unsafe { ring.push(op, user_data) };
    result.expect_err("the ring must refuse this op")
}

#[test]
fn misuse_is_refused_with_typed_errors() {
    for entries in [0, 3, 8192] {
        assert!(matches!(Ring::new(entries), Err(RingError::InvalidEntries { .. })));
    }
    let temp = TempPath::new(SHM_DIR, "misuse");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut ring = Ring::new(4).unwrap();
    let flush = Op::Flush { file: 0 };
    let error = refuse(&mut ring, flush, 1);
    assert!(matches!(error, RingError::UnknownFile { file: 0, registered: 0 }), "{error}");
    assert!(matches!(ring.register_files(&[]), Err(RingError::FileCount { count: 0 })));
    let error = ring.register_files(&[9999]).unwrap_err();
    assert!(matches!(error, RingError::FileNotUsable { index: 0, fd: 9999, .. }), "{error}");
    ring.register_files(&[device.raw_fd()]).unwrap();
    let again = ring.register_files(&[device.raw_fd()]);
    assert!(matches!(again, Err(RingError::FilesAlreadyRegistered)));
    let error = refuse(&mut ring, flush, USER_DATA_RESERVED);
    assert!(matches!(error, RingError::ReservedUserData));
    let waker = Waker::new().unwrap();
    assert!(matches!(ring.arm_waker(&waker, USER_DATA_RESERVED), Err(RingError::ReservedUserData)));
    let error = refuse(&mut ring, Op::Flush { file: 1 }, 1);
    assert!(matches!(error, RingError::UnknownFile { file: 1, registered: 1 }), "{error}");
    let huge = Op::Discard { file: 0, offset_bytes: u64::MAX - 4095, len_bytes: 4096 };
    let error = refuse(&mut ring, huge, 1);
    assert!(matches!(error, RingError::OffsetTooLarge { .. }), "{error}");
    let minus_one =
        Op::Read { file: 0, offset_bytes: u64::MAX, ptr: std::ptr::null_mut(), len_bytes: 0 };
    let error = refuse(&mut ring, minus_one, 1);
    assert!(
        matches!(error, RingError::OffsetTooLarge { .. }),
        "offset -1 means 'current position'"
    );
    let ptr = std::ptr::without_provenance_mut::<u8>(4096);
    for (offset_bytes, len_bytes, ptr) in
        [(100, 4096, ptr), (0, 1000, ptr), (0, 4096, ptr.wrapping_add(8))]
    {
        let misaligned = Op::Read { file: 0, offset_bytes, ptr, len_bytes };
        let error = refuse(&mut ring, misaligned, 1);
        assert!(matches!(error, RingError::Misaligned { logical_block_bytes: 512, .. }), "{error}");
    }
    let misaligned = Op::WriteZeroes { file: 0, offset_bytes: 512, len_bytes: 100 };
    let error = refuse(&mut ring, misaligned, 1);
    assert!(matches!(error, RingError::Misaligned { .. }), "{error}");
    assert_eq!(ring.in_flight(), 0, "nothing refused was queued");

    // The registered duplicate outlives the caller's descriptor.
    drop(device);
    check_status(run_one(&mut ring, flush, 2)).unwrap();
}

#[test]
fn ring_and_waker_can_move_between_threads() {
    fn is_send<T: Send>() {}
    fn is_send_sync<T: Send + Sync>() {}
    is_send::<Ring>();
    is_send_sync::<Waker>();
    let mut ring = Ring::new(4).unwrap();
    let waker = Waker::new().unwrap();
    ring.arm_waker(&waker, 7).unwrap();
    waker.wake();
    let reaped = thread::spawn(move || {
        ring.submit(1, WAIT).unwrap();
        let mut reaped = Vec::new();
        ring.reap(|user_data, result| reaped.push((user_data, result)));
        reaped
    })
    .join()
    .unwrap();
    assert_eq!(reaped, [(7, 8)]);
}

#[test]
fn completions_carry_the_callers_user_data() {
    let temp = TempPath::new(SHM_DIR, "user-data");
    let device = Device::create_file(temp.path(), MIB).unwrap();
    let mut ring = Ring::new(8).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    let tags = [0, 1, u64::MAX - 1, 1 << 63];
    for tag in tags {
        // SAFETY: flushes lend no memory.
        unsafe { ring.push(Op::Flush { file: 0 }, tag) }.unwrap();
    }
    let mut results: HashMap<u64, i32> = HashMap::new();
    while results.len() < tags.len() {
        ring.submit(tags.len() - results.len(), WAIT).unwrap();
        ring.reap(|user_data, result| assert!(results.insert(user_data, result).is_none()));
    }
    assert!(tags.iter().all(|tag| results[tag] == 0));
}
