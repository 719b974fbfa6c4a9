//! What the NBD test binaries share: an in-memory array to serve.

use flashraid_layout::Level;
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create_in_memory};
use std::sync::Arc;

/// A fresh array "t" at `level` over `count` in-memory members of `member_bytes`, 16 KiB
/// chunks, started with `shards` shards and 16 MiB of session buffers.
#[allow(dead_code)] // each test binary compiles this module; not every one calls both
pub fn memory_array(level: Level, count: usize, member_bytes: u64, shards: u32) -> Arc<Array> {
    memory_array_and_members(level, count, member_bytes, shards).0
}

/// `memory_array`, and its members (to look at what reached them).
pub fn memory_array_and_members(
    level: Level,
    count: usize,
    member_bytes: u64,
    shards: u32,
) -> (Arc<Array>, Vec<Arc<MemMember>>) {
    let members: Vec<_> =
        (0..count).map(|i| MemMember::new(&format!("m{i}"), member_bytes)).collect();
    let spec = CreateSpec::in_memory("t", level, 16384, shards);
    create_in_memory(&spec, &members).unwrap();
    let mut options = OpenOptions::recommended();
    options.shards = Some(shards);
    options.session_buffer_bytes = 16 << 20;
    let array = Arc::new(Array::open_in_memory(&members, &options).unwrap());
    (array, members)
}
