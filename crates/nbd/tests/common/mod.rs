//! What the NBD test binaries share: an in-memory array to serve.

use flashraid_layout::Level;
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create_in_memory};
use std::sync::Arc;

/// A fresh array "t" at `level` over `count` in-memory members of `member_bytes`, 16 KiB
/// chunks, started with `shards` shards and 16 MiB of session buffers.
pub fn memory_array(level: Level, count: usize, member_bytes: u64, shards: u32) -> Arc<Array> {
    let members: Vec<_> =
        (0..count).map(|i| MemMember::new(&format!("m{i}"), member_bytes)).collect();
    let spec = CreateSpec::in_memory("t", level, 16384, shards);
    create_in_memory(&spec, &members).unwrap();
    let mut options = OpenOptions::recommended();
    options.shards = Some(shards);
    options.session_buffer_bytes = 16 << 20;
    Arc::new(Array::open_in_memory(&members, &options).unwrap())
}
