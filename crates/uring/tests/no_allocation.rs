//! The data path allocates nothing: push, submit and reap (reads, writes, flushes, discards,
//! write-zeroes, a block-device discard completed inside push, and the waker) run under a
//! counting global allocator. Setup (ring, registration, buffers) allocates, once.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{LoopDevice, SHM_DIR, TempPath};
use flashraid_iobuf::IoBuf;
use flashraid_uring::{Access, Device, Op, Ring, Waker};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Only the measuring thread counts: the test harness may allocate on its own threads.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROUNDS: u64 = 200;

#[test]
fn push_submit_and_reap_do_not_allocate() {
    let loop_device = LoopDevice::attach(1 << 20, 512, "no-allocation");
    let temp = TempPath::new(SHM_DIR, "no-allocation");
    let file = Device::create_file(temp.path(), 1 << 20).unwrap();
    let block = loop_device
        .as_ref()
        .map(|loop_device| Device::open(loop_device.path(), Access::ReadWrite).unwrap());
    let mut fds = vec![file.raw_fd()];
    fds.extend(block.as_ref().map(Device::raw_fd));
    let mut ring = Ring::new(16).unwrap();
    ring.register_files(&fds).unwrap();
    let waker = Waker::new().unwrap();
    let mut buf = IoBuf::new(8192);
    let ptr = buf.as_mut_ptr();
    let mut completed = 0u64;

    COUNTING.with(|counting| counting.set(true));
    for round in 0..ROUNDS {
        let offset_bytes = (round % 64) * 8192;
        let mut ops = [
            Some(Op::Write { file: 0, offset_bytes, ptr, len_bytes: 8192, fua: round % 2 == 0 }),
            Some(Op::Flush { file: 0 }),
            Some(Op::Discard { file: 0, offset_bytes, len_bytes: 4096 }),
            Some(Op::Read { file: 0, offset_bytes, ptr, len_bytes: 8192 }),
            None,
        ];
        if block.is_some() {
            ops[4] = Some(Op::Discard { file: 1, offset_bytes: 0, len_bytes: 4096 });
        }
        for (index, op) in ops.into_iter().flatten().enumerate() {
            // SAFETY: `buf` outlives the ring, and every op is reaped before `buf` is used
            // again (the write and the read share it, but the read is pushed only after the
            // write completed: each op is submitted and reaped before the next).
            unsafe { ring.push(op, round * 8 + index as u64) }.unwrap();
            while ring.in_flight() > 0 {
                ring.submit(1, Some(Duration::from_secs(5))).unwrap();
                ring.reap(|_, result| {
                    assert!(result >= 0, "{result}");
                    completed += 1;
                });
            }
        }
        ring.arm_waker(&waker, u64::MAX - 1).unwrap();
        waker.wake();
        while ring.is_waker_armed() {
            ring.submit(1, Some(Duration::from_secs(5))).unwrap();
            ring.reap(|_, result| assert_eq!(result, 8));
        }
    }
    COUNTING.with(|counting| counting.set(false));
    assert!(completed >= 4 * ROUNDS);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "the data path allocated");
}
