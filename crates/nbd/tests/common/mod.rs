//! What the NBD test binaries share: an in-memory array to serve, and a client's handshake.

use flashraid_layout::Level;
use flashraid_nbd::proto;
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create_in_memory};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// Through the fixed newstyle handshake with NBD_OPT_EXPORT_NAME "t" on a Unix socket (30 s
/// read timeout); the stream and the export's size.
#[allow(dead_code)] // each test binary compiles this module; not every one calls it
pub fn open_export_t(socket: &std::path::Path) -> (UnixStream, u64) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).to_be_bytes()).unwrap();
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
    b.extend_from_slice(&1u32.to_be_bytes());
    b.extend_from_slice(b"t");
    s.write_all(&b).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    (s, u64::from_be_bytes(reply[..8].try_into().unwrap()))
}

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
