//! Seeded random request mixes against a live server, with connections in reactors and on
//! threads of their own: pipelined requests of every command (unknown ones too) with random
//! flags, offsets and lengths around the export's end, 0, 8 MiB and u32::MAX each get
//! exactly one reply with their cookie and the server keeps serving; writes sent in small
//! pieces with pauses, FUA, and write-zeroes read back as a model holds them; a server stop
//! under six pipelining clients ends well inside its bound. (Written by a review of the NBD
//! frontend, 2026-11-25; it found no bug, and stays as a regression net.)

mod common;

use flashraid_layout::Level;
use flashraid_nbd::proto::{self, Request};
use flashraid_nbd::{ExportConfig, Listener, Server};
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
}

fn soup(threads: bool, seed: u64) {
    let array = common::memory_array(Level::Raid6, 6, 24 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let mut export = ExportConfig::single("t", array.clone(), false);
    export.connection_threads = threads;
    let server = Server::start(export, vec![listener]).unwrap();
    let mut rng = Rng(seed);
    for round in 0..30 {
        let (mut s, size) = common::open_export_t(&socket);
        let mut wire = vec![];
        let mut expect = vec![];
        for cookie in 0..40u64 {
            let kind = rng.pick(&[0u16, 0, 1, 1, 3, 4, 6, 5, 7, 9]);
            let flags = rng.pick(&[0u16, 0, 0, 1, 2, 3, 4, 16, 0x8000]);
            let (r1, r2) = (rng.next(), rng.next());
            let offset = rng.pick(&[
                0u64,
                4096,
                100,
                size - 4096,
                size,
                size - 100,
                size + 4096,
                u64::MAX - 4095,
                (r1 % size) & !4095,
                r2 % size,
            ]);
            let len = rng.pick(&[
                0u32,
                1,
                4096,
                8192,
                65536,
                100_000,
                1 << 20,
                (8 << 20) - 4096,
                8 << 20,
                (8 << 20) + 4096,
                u32::MAX,
            ]);
            let len = if kind == proto::CMD_WRITE { len.min((9 << 20) as u32) } else { len };
            proto::encode_request(&Request { flags, kind, cookie, offset, len }, &mut wire);
            if kind == proto::CMD_WRITE {
                wire.resize(wire.len() + len as usize, cookie as u8);
            }
            expect.push((cookie, kind, len));
        }
        let mut writer = s.try_clone().unwrap();
        let w = std::thread::spawn(move || {
            writer.write_all(&wire).unwrap();
        });
        let mut got = std::collections::HashMap::new();
        for _ in 0..expect.len() {
            let mut h = [0u8; 16];
            if let Err(e) = s.read_exact(&mut h) {
                panic!(
                    "round {round} seed {seed} threads {threads}: reply missing: {e}; got {} of {}: {got:?}",
                    got.len(),
                    expect.len()
                );
            }
            assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), proto::SIMPLE_REPLY_MAGIC);
            let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
            let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let (_, kind, len) = expect[cookie as usize];
            if error == 0 && kind == proto::CMD_READ {
                let mut d = vec![0u8; len as usize];
                s.read_exact(&mut d).unwrap();
            }
            assert!(got.insert(cookie, error).is_none(), "cookie {cookie} twice");
        }
        w.join().unwrap();
        eprintln!("round {round}: {:?}", {
            let mut v: Vec<_> = got.iter().map(|(c, e)| (*c, expect[*c as usize], *e)).collect();
            v.sort();
            v.into_iter()
                .filter(|x| x.2 != 0)
                .map(|(_, (_, k, l), e)| (k, l, e))
                .take(5)
                .collect::<Vec<_>>()
        });
    }
    server.stop();
    server.join();
    std::sync::Arc::try_unwrap(array).unwrap().shutdown().unwrap();
}

#[test]
fn soup_in_reactors() {
    for seed in 1..4 {
        soup(false, seed * 7919);
    }
}

#[test]
fn soup_on_threads() {
    for seed in 1..4 {
        soup(true, seed * 7919);
    }
}

fn hammer_and_stop(threads: bool, seed: u64) {
    let array = common::memory_array(Level::Raid6, 6, 24 << 20, 2);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let mut export = ExportConfig::single("t", array.clone(), false);
    export.connection_threads = threads;
    let server = Server::start(export, vec![listener]).unwrap();
    let mut clients = vec![];
    for c in 0..6u64 {
        let socket = socket.clone();
        clients.push(std::thread::spawn(move || {
            let (s, size) = common::open_export_t(&socket);
            let mut w = s.try_clone().unwrap();
            let mut r = s;
            let reader = std::thread::spawn(move || {
                let mut b = vec![0u8; 1 << 20];
                while let Ok(n) = r.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                }
            });
            let mut rng = Rng(seed + c * 1000 + 1);
            let mut wire = vec![];
            for cookie in 0..2000u64 {
                let kind = rng.pick(&[0u16, 1, 1, 3, 4, 6]);
                let len = rng.pick(&[4096u32, 65536, 1 << 20, 4 << 20]);
                let offset = (rng.next() % (size - u64::from(len))) & !4095;
                let flags = rng.pick(&[0u16, 1]);
                wire.clear();
                proto::encode_request(&Request { flags, kind, cookie, offset, len }, &mut wire);
                if kind == 1 {
                    wire.resize(wire.len() + len as usize, 7);
                }
                if w.write_all(&wire).is_err() {
                    break;
                }
            }
            drop(w);
            reader.join().unwrap();
        }));
    }
    std::thread::sleep(Duration::from_millis(300 + seed % 500));
    let started = std::time::Instant::now();
    server.stop();
    server.join();
    assert!(started.elapsed() < Duration::from_secs(15), "stop took {:?}", started.elapsed());
    for c in clients {
        c.join().unwrap();
    }
    std::sync::Arc::try_unwrap(array).unwrap().shutdown().unwrap();
}

#[test]
fn hammer_stop_in_reactors() {
    for seed in 1..6 {
        hammer_and_stop(false, seed * 31);
    }
}

#[test]
fn hammer_stop_on_threads() {
    for seed in 1..6 {
        hammer_and_stop(true, seed * 31);
    }
}

fn model_check(threads: bool, seed: u64) {
    let array = common::memory_array(Level::Raid6, 7, 24 << 20, 3);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let listener = Listener::Unix(UnixListener::bind(&socket).unwrap());
    let mut export = ExportConfig::single("t", array.clone(), false);
    export.connection_threads = threads;
    let server = Server::start(export, vec![listener]).unwrap();
    let (mut s, size) = common::open_export_t(&socket);
    let size = size.min(64 << 20);
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng(seed);
    for i in 0..300u64 {
        let op = rng.next() % 4;
        match op {
            0 | 1 => {
                let len = rng.pick(&[4096u64, 8192, 40960, 65536, 200 << 10, 1 << 20, 3 << 20]);
                let offset = (rng.next() % (size - len)) & !4095;
                let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                let mut wire = vec![];
                let flags = rng.pick(&[0u16, 1]);
                proto::encode_request(
                    &Request { flags, kind: 1, cookie: i, offset, len: len as u32 },
                    &mut wire,
                );
                wire.extend_from_slice(&data);
                let chunk = rng.pick(&[usize::MAX, 1000, 30000, 5000]);
                for part in wire.chunks(chunk.min(wire.len())) {
                    s.write_all(part).unwrap();
                    if chunk != usize::MAX && rng.next().is_multiple_of(4) {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                }
                let mut h = [0u8; 16];
                s.read_exact(&mut h).unwrap();
                assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0, "write {i}");
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            }
            2 => {
                let len = rng.pick(&[4096u64, 12288, 65536, 1 << 20]);
                let offset = (rng.next() % (size - len)) & !4095;
                let mut wire = vec![];
                proto::encode_request(
                    &Request {
                        flags: rng.pick(&[0u16, 1, 2, 3]),
                        kind: 6,
                        cookie: i,
                        offset,
                        len: len as u32,
                    },
                    &mut wire,
                );
                s.write_all(&wire).unwrap();
                let mut h = [0u8; 16];
                s.read_exact(&mut h).unwrap();
                assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0, "zero {i}");
                model[offset as usize..(offset + len) as usize].fill(0);
            }
            _ => {
                let len = 1 + rng.next() % (2 << 20);
                let offset = rng.next() % (size - len);
                let mut wire = vec![];
                proto::encode_request(
                    &Request { flags: 0, kind: 0, cookie: i, offset, len: len as u32 },
                    &mut wire,
                );
                s.write_all(&wire).unwrap();
                let mut h = [0u8; 16];
                s.read_exact(&mut h).unwrap();
                assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0, "read {i}");
                let mut d = vec![0u8; len as usize];
                s.read_exact(&mut d).unwrap();
                assert!(
                    d == model[offset as usize..(offset + len) as usize],
                    "read {i} at {offset}+{len} differs"
                );
            }
        }
    }
    drop(s);
    server.stop();
    server.join();
    std::sync::Arc::try_unwrap(array).unwrap().shutdown().unwrap();
}

#[test]
fn model_in_reactors() {
    for seed in 1..4 {
        model_check(false, seed * 104729);
    }
}

#[test]
fn model_on_threads() {
    for seed in 1..4 {
        model_check(true, seed * 104729);
    }
}
