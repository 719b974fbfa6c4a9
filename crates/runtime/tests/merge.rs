//! Merged member IO on real engine traffic: RAID 6 over member files, two shards owning runs
//! of neighbouring stripes, many large requests in flight. Neighbouring chunks must be merged
//! into single member IOs (the status counter says so) and every byte must read back as
//! written. Timing never decides an assertion.

use flashraid_engine::ArrayOp;
use flashraid_engine::Durability;
use flashraid_layout::ArrayOffset;
use flashraid_layout::Level;
use flashraid_runtime::{Array, CreateSpec, Event, OpenOptions, Session, create};
use std::path::PathBuf;

const MIB: u64 = 1 << 20;
const IN_FLIGHT: u64 = 48;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(131) ^ seed.wrapping_mul(0x9e37_79b9)) as u8).collect()
}

/// Submit `ops` with every request in flight at once, then wait for all; read data lands
/// in `into` at the request's offset.
fn all_at_once(session: &mut Session, ops: &[(ArrayOp, Option<&[u8]>)], into: &mut [u8]) {
    for (tag, (op, data)) in ops.iter().enumerate() {
        session.submit(*op, *data, tag as u64).expect("room for every request");
    }
    let mut done = 0;
    while done < ops.len() {
        session.poll(true, &mut |event| match event {
            Event::Data { tag, offset_in_request, data } => {
                let ArrayOp::Read { offset, .. } = ops[tag as usize].0 else {
                    panic!("data of a write")
                };
                let at = (offset.0 + offset_in_request) as usize;
                into[at..at + data.len()].copy_from_slice(data);
            }
            Event::Done { result, .. } => {
                result.expect("request failed");
                done += 1;
            }
        });
    }
}

#[test]
fn neighbouring_chunks_merge_under_load_and_read_back_intact() {
    let dir = std::env::temp_dir().join(format!("flashraid-merge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<PathBuf> = (0..8).map(|i| dir.join(format!("m{i}"))).collect();
    let spec = CreateSpec {
        members: paths.clone(),
        create_files_bytes: Some(64 << 20),
        ..CreateSpec::in_memory("merge", Level::Raid6, 16 << 10, 2)
    };
    create(&spec).unwrap();
    let mut options = OpenOptions::recommended();
    options.shards = Some(2);
    options.session_buffer_bytes = 2 * IN_FLIGHT as usize * MIB as usize;
    options.config.stripe_run_member_bytes = 64 << 10;
    let array = Array::open(&paths, &options).unwrap();
    let bytes = IN_FLIGHT * MIB;
    assert!(array.size_bytes() >= bytes);
    let model = pattern(7, bytes as usize);
    let mut session = array.session().unwrap();
    for round in 0..3 {
        let writes: Vec<(ArrayOp, Option<&[u8]>)> = (0..IN_FLIGHT)
            .map(|i| {
                let op = ArrayOp::Write {
                    offset: ArrayOffset(i * MIB),
                    len_bytes: MIB,
                    durability: Durability::Cached,
                };
                (op, Some(&model[(i * MIB) as usize..((i + 1) * MIB) as usize]))
            })
            .collect();
        all_at_once(&mut session, &writes, &mut []);
        let reads: Vec<(ArrayOp, Option<&[u8]>)> = (0..IN_FLIGHT)
            .map(|i| (ArrayOp::Read { offset: ArrayOffset(i * MIB), len_bytes: MIB }, None))
            .collect();
        let mut got = vec![0u8; bytes as usize];
        all_at_once(&mut session, &reads, &mut got);
        assert!(got == model, "round {round}: the array did not read back what was written");
    }
    let status = array.status().unwrap();
    assert!(status.member_ios_merged > 0, "no member IO was merged: {status:#?}");
    assert_eq!(status.member_reads_retried, 0);
    drop(session);
    array.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
