//! Encode, update and reconstruct allocate nothing: a counting global allocator watches them.
//! (Only plan construction allocates, once per erasure pattern.)

use flashraid_parity::{Codec, Kernel, Stores};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
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

#[test]
fn hot_paths_do_not_allocate() {
    let (k, m, len) = (10, 3, 16384);
    let data = vec![vec![7u8; len]; k];
    let new = vec![9u8; len];
    let mut parity = vec![vec![0u8; len]; m];
    for kernel in Kernel::supported() {
        let codec = Codec::with_kernel(k, m, kernel).unwrap();
        let plan = codec.plan_reconstruct(&[1, 2, k], &[1, 2, k]).unwrap();
        let mut stripe_storage: Vec<Vec<u8>> = data.iter().cloned().chain(parity.clone()).collect();
        let sources: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut stripe: Vec<&mut [u8]> =
            stripe_storage.iter_mut().map(|c| c.as_mut_slice()).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        codec.encode(&sources, &mut outs, Stores::Cached).unwrap();
        codec.encode(&sources, &mut outs, Stores::NonTemporal).unwrap();
        codec.update(3, &data[3], &new, &mut outs).unwrap();
        codec.reconstruct(&plan, &mut stripe, Stores::Cached).unwrap();
        let after = ALLOCATIONS.load(Ordering::SeqCst);
        assert_eq!(after, before, "{kernel}: the hot path allocated");
    }
}
