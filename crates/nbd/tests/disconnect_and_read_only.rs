//! After NBD_CMD_DISC the server reads nothing the client sent after it, let alone answers
//! it (the client "MUST NOT send anything to the server after sending an NBD_CMD_DISC"; the
//! server finishes the outstanding requests and closes), also when the server's stop comes
//! while requests sent before the DISC are in flight. And a write on a read-only export is
//! refused with EPERM whatever its length. (Found by review, 2026-11-25: the stop answered
//! the bytes after a DISC as requests, with ESHUTDOWN; an oversized write on a read-only
//! export got EINVAL. Each test failed before the fix.)

mod common;

use flashraid_layout::Level;
use flashraid_nbd::proto::{self, Request};
use flashraid_nbd::{ExportConfig, Listener, Server};
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

fn no_reply_after_disconnect(threads: bool) {
    let (array, members) = common::memory_array_and_members(Level::Raid6, 6, 24 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let mut export = ExportConfig::single("t", array.clone(), false);
    export.connection_threads = threads;
    let server = Server::start(export, vec![listener]).unwrap();
    let mut s = common::open_export_t(&socket).0;
    // Every member IO takes 300 ms: the read below is still in flight when the stop comes.
    for m in &members {
        m.faults().set_latency_us(300_000);
    }
    let mut wire = vec![];
    let read = |cookie| Request { flags: 0, kind: proto::CMD_READ, cookie, offset: 0, len: 4096 };
    proto::encode_request(&read(1), &mut wire);
    let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 2, offset: 0, len: 0 };
    proto::encode_request(&disc, &mut wire);
    // Bytes after the DISC (a misbehaving client, or a request racing the DISC).
    for cookie in 3..6 {
        proto::encode_request(&read(cookie), &mut wire);
    }
    s.write_all(&wire).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    server.stop();
    let mut out = vec![];
    let _ = s.read_to_end(&mut out);
    server.join();
    for m in &members {
        m.faults().set_latency_us(0);
    }
    // Parse the replies: cookie 1 (with 4096 bytes of data, or an error) and nothing else.
    let mut cookies = vec![];
    let mut at = 0;
    while at + 16 <= out.len() {
        let error = u32::from_be_bytes(out[at + 4..at + 8].try_into().unwrap());
        let cookie = u64::from_be_bytes(out[at + 8..at + 16].try_into().unwrap());
        cookies.push((cookie, error));
        at += 16;
        if cookie == 1 && error == 0 {
            at += 4096;
        }
    }
    assert_eq!(
        cookies.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![1],
        "threads={threads}: replies after the client's NBD_CMD_DISC: {cookies:?}"
    );
    Arc::try_unwrap(array).unwrap().shutdown().unwrap();
}

#[test]
fn requests_after_a_disconnect_are_never_answered_in_reactors() {
    no_reply_after_disconnect(false);
}

#[test]
fn requests_after_a_disconnect_are_never_answered_on_threads() {
    no_reply_after_disconnect(true);
}

/// The protocol says a server SHOULD answer EPERM to a write on a read-only export: also to
/// one over the 8 MiB maximum, whose payload is thrown away as it arrives.
#[test]
fn an_oversized_write_on_a_read_only_export_is_refused_as_eperm() {
    let array = common::memory_array(Level::Raid6, 6, 24 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let server =
        Server::start(ExportConfig::single("t", array.clone(), true), vec![listener]).unwrap();
    let mut s = common::open_export_t(&socket).0;
    let len = (8u32 << 20) + 4096;
    let mut wire = vec![];
    proto::encode_request(
        &Request { flags: 0, kind: proto::CMD_WRITE, cookie: 9, offset: 0, len },
        &mut wire,
    );
    wire.resize(wire.len() + len as usize, 0x33);
    s.write_all(&wire).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
    drop(s);
    server.stop();
    server.join();
    Arc::try_unwrap(array).unwrap().shutdown().unwrap();
    assert_eq!(error, proto::EPERM, "a write on a read-only export refused with {error}");
}
