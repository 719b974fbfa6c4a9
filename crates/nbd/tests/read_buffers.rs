//! A client that pipelines large reads and never reads the replies must not make the server
//! hold memory without bound: a connection's read buffers stay within
//! `READ_BUFFERS_BYTES_MAX` beyond one request, and every reply still comes once the client
//! reads. Its own test binary (its own process), so that the resident size it measures is
//! this server's alone.

mod common;

use flashraid_layout::Level;
use flashraid_nbd::proto::{self, Request};
use flashraid_nbd::server::{READ_BUFFERS_BYTES_MAX, REQUEST_BYTES_MAX};
use flashraid_nbd::{ExportConfig, Listener, Server};
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads sent at once: every request slot of the connection.
const READS: u64 = flashraid_nbd::server::CONNECTION_REQUESTS_MAX as u64;

fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

fn pipelined_reads_without_reading_replies(threads: bool) {
    let array = common::memory_array(Level::Raid6, 6, 64 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let mut export = ExportConfig::single("t", array.clone(), false);
    export.connection_threads = threads;
    let server = Server::start(export, vec![listener]).unwrap();

    let (mut s, size) = common::open_export_t(&socket);
    let len = REQUEST_BYTES_MAX;
    let blocks = size / u64::from(len);
    let mut b = vec![];
    for cookie in 0..READS {
        let offset = cookie % blocks * u64::from(len);
        let r = Request { flags: 0, kind: proto::CMD_READ, cookie, offset, len };
        proto::encode_request(&r, &mut b);
    }
    // Warm up first, reading as we go (one request at a time), so the engine's and the
    // session's buffers are touched before the measurement.
    let mut data = vec![0u8; len as usize];
    for r in b.chunks(proto::REQUEST_BYTES).take(8) {
        s.write_all(r).unwrap();
        let mut h = [0u8; proto::SIMPLE_REPLY_BYTES];
        s.read_exact(&mut h).unwrap();
        s.read_exact(&mut data).unwrap();
    }
    let before = resident_bytes();
    s.write_all(&b).unwrap();
    // The server takes what it may; measure while it holds the most.
    let mut most = before;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        most = most.max(resident_bytes());
        std::thread::sleep(Duration::from_millis(20));
    }
    let grown = most.saturating_sub(before);
    // One request beyond the limit, and room for the socket's and the engine's buffers.
    let allowed = READ_BUFFERS_BYTES_MAX + len as usize + (64 << 20);
    assert!(
        grown <= allowed,
        "threads={threads}: the server grew by {} MiB for reads nobody read (allowed {} MiB)",
        grown >> 20,
        allowed >> 20
    );
    eprintln!("threads={threads}: grew by {} MiB", grown >> 20);
    // Every reply comes once the client reads.
    let mut seen = vec![false; READS as usize];
    for _ in 0..READS {
        let mut h = [0u8; proto::SIMPLE_REPLY_BYTES];
        s.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), proto::SIMPLE_REPLY_MAGIC);
        assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0, "an error reply");
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        assert!(!std::mem::replace(&mut seen[cookie as usize], true), "cookie {cookie} twice");
        s.read_exact(&mut data).unwrap();
    }
    drop(s);
    server.stop();
    server.join();
    Arc::try_unwrap(array).expect("the server let the array go").shutdown().unwrap();
}

#[test]
fn unread_replies_hold_bounded_memory_in_both_modes() {
    // One after the other: both in one process would add up.
    pipelined_reads_without_reading_replies(false);
    pipelined_reads_without_reading_replies(true);
}
