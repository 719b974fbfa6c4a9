//! What FUA costs a long trim or write-zeroes through the embedded API (no NBD server in
//! between, so every stripe's zero carries the FUA flag into the engine).
//!
//! `cargo run --release -p flashraid-bench --example fua_zero_cost [DIR [REPEATS [IN_FLIGHT]]]`
//!
//! RAID 6 over six 256 MiB member files in DIR (default: a new directory in /dev/shm),
//! 16 KiB chunks, two shards; requests of 32 MiB, IN_FLIGHT at a time (default 1, as a
//! client that waits for each, like `nbdsh`; at most 64). Before each timed pass the
//! whole array is written (4 MiB writes, then a flush) (a zero of zeroes already there is faster); then a pass of
//! write-zeroes or discards over the whole array, with and without FUA. Prints seconds per
//! pass.

use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::{ArrayOffset, Level};
use flashraid_runtime::{Array, CreateSpec, Event, OpenOptions, Session, SubmitError};
use std::path::PathBuf;
use std::time::Instant;

const REQUEST_BYTES: u64 = 32 << 20;
/// Writes of the fill between passes (a session's buffers hold less than 32 MiB).
const WRITE_BYTES: u64 = 4 << 20;

/// Run `op(offset, len)` over the whole array in `step`s, `in_flight_max` at a time.
fn pass(
    session: &mut Session,
    in_flight_max: usize,
    size: u64,
    step: u64,
    data: Option<&[u8]>,
    op: &dyn Fn(u64, u64) -> ArrayOp,
) {
    let mut next = 0;
    let mut in_flight = 0;
    while next < size || in_flight > 0 {
        while next < size && in_flight < in_flight_max {
            let len = step.min(size - next);
            match session.submit(op(next, len), data.map(|d| &d[..len as usize]), next) {
                Ok(()) => {
                    next += len;
                    in_flight += 1;
                }
                Err(SubmitError::Full) => break,
                Err(e) => panic!("submit: {e}"),
            }
        }
        session.poll(true, &mut |e| {
            if let Event::Done { result, .. } = e {
                result.expect("request failed");
                in_flight -= 1;
            }
        });
    }
}

fn main() {
    let dir: PathBuf = std::env::args().nth(1).map_or_else(
        || PathBuf::from(format!("/dev/shm/fua-cost-{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    let repeats: usize = std::env::args().nth(2).map_or(3, |s| s.parse().expect("repeats"));
    let in_flight: usize = std::env::args().nth(3).map_or(1, |s| s.parse().expect("in flight"));
    assert!((1..=64).contains(&in_flight), "IN_FLIGHT: 1 to 64");
    let members: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("m{i}"))).collect();
    let mut spec = CreateSpec::in_memory("fua", Level::Raid6, 16 << 10, 2);
    spec.members = members.clone();
    spec.create_files_bytes = Some(256 << 20);
    flashraid_runtime::create(&spec).unwrap();
    let array = Array::open(&members, &OpenOptions::recommended()).unwrap();
    let size = array.status().unwrap().array_bytes;
    let mut session = array.session().unwrap();
    let data = vec![0x5au8; WRITE_BYTES as usize];
    let write = |offset, len_bytes| ArrayOp::Write {
        offset: ArrayOffset(offset),
        len_bytes,
        durability: Durability::Cached,
    };
    for _ in 0..repeats {
        for (name, durability, discard) in [
            ("zero FUA", Durability::Fua, false),
            ("zero", Durability::Cached, false),
            ("trim FUA", Durability::Fua, true),
            ("trim", Durability::Cached, true),
        ] {
            pass(&mut session, 8, size, WRITE_BYTES, Some(&data), &write);
            // One flush (one step's worth of "size").
            pass(&mut session, 1, 1, 1, None, &|_, _| ArrayOp::Flush);
            let t = Instant::now();
            pass(&mut session, in_flight, size, REQUEST_BYTES, None, &|offset, len_bytes| {
                let offset = ArrayOffset(offset);
                if discard {
                    ArrayOp::Discard { offset, len_bytes, durability }
                } else {
                    ArrayOp::WriteZeroes { offset, len_bytes, durability }
                }
            });
            println!("{name:9} {:.3} s", t.elapsed().as_secs_f64());
        }
    }
    drop(session);
    array.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
