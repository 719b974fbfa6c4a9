//! The runtime on real files with io_uring and O_DIRECT: create, open, read and write from
//! several threads, fail a member, shut down cleanly, reopen; refuse devices that hold data.

use flashraid_control::Overwrite;
use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::{ArrayOffset, Level};
use flashraid_runtime::{Array, ArrayError, CreateSpec, Event, OpenOptions, Stopped, create};
use std::path::PathBuf;

fn spec(dir: &std::path::Path, level: Level, members: usize) -> CreateSpec {
    CreateSpec {
        name: "test".into(),
        level,
        chunk_bytes: 16384,
        members: (0..members).map(|i| dir.join(format!("m{i}"))).collect(),
        spares: vec![],
        create_files_bytes: Some(24 << 20),
        overwrite: Overwrite::Refuse,
        init: None,
        bitmap_region_bytes: None,
        shards: 2,
        tunables: Default::default(),
    }
}

fn options() -> OpenOptions {
    let mut o = OpenOptions::recommended();
    o.shards = Some(2);
    o.session_buffer_bytes = 8 << 20;
    o
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn scratch_dir() -> tempfile::TempDir {
    // tmpfs when available: O_DIRECT works there and it keeps the tests fast.
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    tempfile::Builder::new().prefix("flashraid-test").tempdir_in(base).unwrap()
}

/// A member named twice (the same path, or a link to it) is refused at once, naming both,
/// and the array then starts from the right list (found by review: the second open waited
/// out the first one's lock, 5 s, and then said the device was in use).
#[test]
fn a_member_named_twice_is_refused_at_once() {
    let dir = scratch_dir();
    let spec = spec(dir.path(), Level::Raid5, 3);
    create(&spec).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&spec.members[1], &link).unwrap();
    for twice in [spec.members[1].clone(), link] {
        let mut paths = spec.members.clone();
        paths.push(twice.clone());
        let started = std::time::Instant::now();
        let e = Array::open(&paths, &options()).unwrap_err().to_string();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert!(e.contains("named twice") && e.contains(&twice.display().to_string()), "{e}");
    }
    Array::open(&spec.members, &options()).unwrap().shutdown().unwrap();
}

#[test]
fn create_open_write_read_shutdown_reopen() {
    let dir = scratch_dir();
    let spec = spec(dir.path(), Level::Raid6, 6);
    let made = create(&spec).unwrap();
    assert_eq!(made.created_files.len(), 6);
    let array = Array::open(&spec.members, &options()).unwrap();
    let size = array.size_bytes();
    let mut session = array.session().unwrap();
    let data = pattern(3, 1 << 20);
    session.write(65536, &data).unwrap();
    let mut back = vec![0u8; 1 << 20];
    session.read(65536, &mut back).unwrap();
    assert!(back == data);
    session.flush().unwrap();
    // Several threads at once, each its own session and range.
    std::thread::scope(|scope| {
        for t in 0..3u8 {
            let array = &array;
            scope.spawn(move || {
                let mut s = array.session().unwrap();
                // Each thread its own 2 MiB range.
                let base = (4 << 20) + u64::from(t) * (2 << 20);
                for i in 0..50u64 {
                    let offset = (base + i * 8192) % (size - 8192) / 4096 * 4096;
                    let d = pattern(t.wrapping_add(i as u8), 8192);
                    s.write(offset, &d).unwrap();
                    let mut r = vec![0u8; 8192];
                    s.read(offset, &mut r).unwrap();
                    assert!(r == d, "thread {t} op {i}");
                }
            });
        }
    });
    let status = array.status().unwrap();
    assert!(!status.degraded && status.counters.writes > 0);
    drop(session);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
    let array = Array::open(&spec.members, &options()).unwrap();
    let status = array.status().unwrap();
    assert!(!status.resyncing, "a clean shutdown needs no resync");
    let mut s = array.session().unwrap();
    let mut back = vec![0u8; 1 << 20];
    s.read(65536, &mut back).unwrap();
    assert!(back == data, "data survives a clean shutdown and reopen");
    drop(s);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
}

#[test]
fn pipelined_requests_and_a_failed_member() {
    let dir = scratch_dir();
    let spec = spec(dir.path(), Level::Raid5, 4);
    create(&spec).unwrap();
    let array = Array::open(&spec.members, &options()).unwrap();
    let mut s = array.session().unwrap();
    // 64 writes in flight at once.
    let chunks: Vec<Vec<u8>> = (0..64u8).map(|i| pattern(i, 16384)).collect();
    for (i, d) in chunks.iter().enumerate() {
        let op = ArrayOp::Write {
            offset: ArrayOffset(i as u64 * 16384),
            len_bytes: 16384,
            durability: Durability::Cached,
        };
        s.submit(op, Some(d), i as u64).unwrap();
    }
    let mut done = 0;
    while done < 64 {
        done += s.poll(true, &mut |e| {
            if let Event::Done { result, .. } = e {
                result.unwrap();
            }
        });
    }
    array.fail_member(1).unwrap();
    let status = array.status().unwrap();
    assert!(status.degraded && !status.failed);
    let mut back = vec![0u8; 64 * 16384];
    s.read(0, &mut back).unwrap();
    assert!(back == chunks.concat(), "degraded reads reconstruct the failed member's data");
    s.write(0, &pattern(99, 16384)).unwrap();
    let mut r = vec![0u8; 16384];
    s.read(0, &mut r).unwrap();
    assert!(r == pattern(99, 16384));
    drop(s);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
    // The failed member is recorded: reopening with all four leaves it out as stale.
    let array = Array::open(&spec.members, &options()).unwrap();
    let status = array.status().unwrap();
    assert!(status.degraded, "member 1 stays failed");
    assert!(status.members[1].path.is_none());
    drop(array);
}

#[test]
fn create_refuses_a_device_with_data_unless_forced() {
    let dir = scratch_dir();
    let spec = spec(dir.path(), Level::Raid1, 2);
    create(&spec).unwrap();
    // The members now hold an array: creating again is refused, and says why.
    let mut again = spec.clone();
    again.create_files_bytes = None;
    let e = create(&again).unwrap_err();
    assert!(matches!(e, ArrayError::Control(_)), "{e}");
    assert!(e.to_string().contains("refusing to overwrite"), "{e}");
    again.overwrite = Overwrite::Force;
    create(&again).unwrap();
}

#[test]
fn opening_with_a_missing_file_names_it() {
    let dir = scratch_dir();
    let missing: Vec<PathBuf> = vec![dir.path().join("nope")];
    let e = Array::open(&missing, &options()).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn in_memory_members_write_read_shutdown_reopen() {
    use flashraid_runtime::{MemMember, create_in_memory};
    let members: Vec<_> = (0..5).map(|i| MemMember::new(&format!("mem{i}"), 24 << 20)).collect();
    let mut spec = spec(std::path::Path::new("/nonexistent"), Level::Raid5, 5);
    spec.members.clear();
    create_in_memory(&spec, &members).unwrap();
    let array = Array::open_in_memory(&members, &options()).unwrap();
    let mut session = array.session().unwrap();
    let data = pattern(9, 300 << 10);
    session.write(12288, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    session.read(12288, &mut back).unwrap();
    assert!(back == data);
    drop(session);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
    // The same memory assembles again, clean, with the data in place.
    let array = Array::open_in_memory(&members, &options()).unwrap();
    let mut session = array.session().unwrap();
    let mut back = vec![0u8; data.len()];
    session.read(12288, &mut back).unwrap();
    assert!(back == data);
    drop(session);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
}

/// A new array on `count` in-memory members of `member_bytes` each (names `prefix0..`),
/// opened with `options()` and sessions of `session_buffer_bytes`.
fn in_memory_array(
    prefix: &str,
    level: Level,
    count: usize,
    member_bytes: u64,
    session_buffer_bytes: usize,
) -> Array {
    use flashraid_runtime::{MemMember, create_in_memory};
    let members: Vec<_> =
        (0..count).map(|i| MemMember::new(&format!("{prefix}{i}"), member_bytes)).collect();
    let mut spec = spec(std::path::Path::new("/nonexistent"), level, count);
    spec.members.clear();
    create_in_memory(&spec, &members).unwrap();
    let mut o = options();
    o.session_buffer_bytes = session_buffer_bytes;
    Array::open_in_memory(&members, &o).unwrap()
}

#[test]
fn session_ids_are_reused_so_a_server_never_runs_out() {
    let array = in_memory_array("mem", Level::Raid5, 4, 8 << 20, 1 << 20);
    // More sessions over the array's life than it serves at once, each dropped with a
    // request still in flight (the drop waits for it) or idle.
    for i in 0..(flashraid_runtime::SESSIONS_MAX as u64 + 100) {
        let mut session = array.session().unwrap();
        if i % 500 == 0 {
            let data = vec![i as u8; 4096];
            let op = ArrayOp::Write {
                offset: ArrayOffset(i * 4096 % (4 << 20)),
                len_bytes: 4096,
                durability: Durability::Cached,
            };
            session.submit(op, Some(&data), 1).unwrap();
        }
    }
    let mut session = array.session().unwrap();
    let mut back = vec![0u8; 4096];
    session.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    drop(session);
    // At once, the limit still holds.
    let open: Vec<_> =
        (1..flashraid_runtime::SESSIONS_MAX).map(|_| array.session().unwrap()).collect();
    assert!(array.session().is_err());
    drop(open);
    assert!(array.session().is_ok());
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
}

#[test]
fn filled_writes_land_in_order_and_a_failed_fill_sends_nothing() {
    use flashraid_runtime::SubmitError;
    let array = in_memory_array("fill", Level::Raid6, 6, 24 << 20, options().session_buffer_bytes);
    let mut session = array.session().unwrap();
    // 200 KiB starting mid-stripe: several pieces, filled from a "socket" in request order.
    let data = pattern(5, 200 << 10);
    let (offset, len) = (20480u64, data.len() as u64);
    let mut expect_at = 0u64;
    let mut fill = |at: u64, piece: &mut [u8]| -> std::io::Result<()> {
        assert_eq!(at, expect_at, "pieces are filled in request order, without gaps");
        let start = usize::try_from(at).unwrap();
        piece.copy_from_slice(&data[start..start + piece.len()]);
        expect_at += piece.len() as u64;
        Ok(())
    };
    let op = ArrayOp::Write {
        offset: ArrayOffset(offset),
        len_bytes: len,
        durability: Durability::Cached,
    };
    session.submit_filled(op, 1, &mut fill).unwrap();
    assert_eq!(expect_at, len, "every byte of the request was asked for");
    let mut done = 0;
    while done == 0 {
        done = session.poll(true, &mut |e| {
            if let Event::Done { result, .. } = e {
                result.unwrap();
            }
        });
    }
    let mut back = vec![0u8; data.len()];
    session.read(offset, &mut back).unwrap();
    assert!(back == data);
    // A fill that fails half-way (a client that went away): nothing is written, the
    // buffers come back, and the session goes on.
    let mut calls = 0;
    let mut failing = |_: u64, piece: &mut [u8]| -> std::io::Result<()> {
        calls += 1;
        piece.fill(0xee);
        if calls == 2 { Err(std::io::ErrorKind::UnexpectedEof.into()) } else { Ok(()) }
    };
    let err = session.submit_filled(op, 2, &mut failing).unwrap_err();
    assert!(matches!(err, SubmitError::Fill(_)), "{err:?}");
    assert!(session.is_idle());
    session.read(offset, &mut back).unwrap();
    assert!(back == data, "a failed fill wrote nothing");
    drop(session);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
}

/// A staged write (an NBD connection in a reactor reading a payload as it arrives) takes its
/// buffers at once, is filled in dribs across pieces in request order, and is sent whole;
/// one given up sends nothing and gives every buffer back.
#[test]
fn a_job_that_panics_is_dropped_alone_and_its_reactor_serves_on() {
    use flashraid_runtime::JobStatus;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let array = in_memory_array("panic", Level::Raid6, 6, 24 << 20, 1 << 20);
    let before = pattern(3, 256 << 10);
    array.session().unwrap().write(0, &before).unwrap();
    // A neighbour on the same shard (jobs 0 and 2 both land on shard 0 of 2), called until
    // told to stop.
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (neighbour_calls, neighbour_stop) = (calls.clone(), stop.clone());
    let neighbour = array
        .start_job(
            0,
            Box::new(move || {
                neighbour_calls.fetch_add(1, Ordering::Relaxed);
                if neighbour_stop.load(Ordering::Relaxed) {
                    JobStatus::Finished
                } else {
                    JobStatus::Running
                }
            }),
        )
        .unwrap();
    // The job panics on its third call with writes of its session still in flight, so its
    // session is dropped in the reactor with requests outstanding.
    let mut session = array.job_session(2).unwrap();
    let mut turn = 0u32;
    let scribble = pattern(200, 64 << 10);
    let panicking = array
        .start_job(
            2,
            Box::new(move || {
                turn += 1;
                if turn == 3 {
                    panic!("a bug in connection code (this test's)");
                }
                for i in 0..4u64 {
                    let op = ArrayOp::Write {
                        offset: ArrayOffset((1 << 20) + (u64::from(turn) * 4 + i) * (64 << 10)),
                        len_bytes: 64 << 10,
                        durability: Durability::Cached,
                    };
                    session.submit(op, Some(&scribble), i).unwrap();
                }
                session.poll(false, &mut |_| {});
                JobStatus::Running
            }),
        )
        .unwrap();
    let why = panicking.recv_timeout(std::time::Duration::from_secs(10)).unwrap().unwrap_err();
    assert!(why.contains("panicked") && why.contains("this test's"), "{why}");
    // The neighbour is still called, the array still reads and writes, and the data written
    // before is intact.
    let seen = calls.load(Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while calls.load(Ordering::Relaxed) < seen + 100 {
        assert!(std::time::Instant::now() < deadline, "the reactor stopped calling jobs");
        std::thread::yield_now();
    }
    let mut client = array.session().unwrap();
    let mut back = vec![0u8; before.len()];
    client.read(0, &mut back).unwrap();
    assert!(back == before, "the data written before the panic reads back");
    let after = pattern(77, 128 << 10);
    client.write(8 << 20, &after).unwrap();
    let mut back = vec![0u8; after.len()];
    client.read(8 << 20, &mut back).unwrap();
    assert!(back == after);
    stop.store(true, Ordering::Relaxed);
    neighbour.recv_timeout(std::time::Duration::from_secs(10)).unwrap().unwrap();
    drop(client);
    array.shutdown().unwrap();
}

#[test]
fn staged_writes_fill_in_dribs_and_a_cancelled_one_sends_nothing() {
    use flashraid_runtime::SubmitError;
    let array = in_memory_array("stage", Level::Raid6, 6, 24 << 20, 1 << 20);
    let mut session = array.session().unwrap();
    let write = |offset: u64, len: usize| ArrayOp::Write {
        offset: ArrayOffset(offset),
        len_bytes: len as u64,
        durability: Durability::Cached,
    };
    // 200 KiB from mid-stripe (pieces of several sizes), arriving 777 bytes at a time, with
    // "nothing now" answers in between.
    let data = pattern(9, 200 << 10);
    let offset = 20480u64;
    session.stage_write(write(offset, data.len()), 7).unwrap();
    let mut at = 0usize;
    let mut calls = 0u32;
    loop {
        let full = session
            .fill_staged(&mut |targets| {
                calls += 1;
                if calls.is_multiple_of(3) {
                    return Ok(0);
                }
                let mut n = 0;
                for target in targets.iter_mut() {
                    let take = target.len().min(777 - n).min(data.len() - at);
                    target[..take].copy_from_slice(&data[at..at + take]);
                    at += take;
                    n += take;
                    if n == 777 || at == data.len() {
                        break;
                    }
                }
                Ok(n)
            })
            .unwrap();
        if full {
            break;
        }
        assert!(calls < 10_000, "the staged write never filled");
    }
    assert_eq!(at, data.len(), "every byte was asked for, once");
    session.submit_staged().unwrap();
    let mut done = 0;
    while done == 0 {
        done = session.poll(true, &mut |e| {
            if let Event::Done { tag, result } = e {
                assert_eq!(tag, 7);
                result.unwrap();
            }
        });
    }
    let mut back = vec![0u8; data.len()];
    session.read(offset, &mut back).unwrap();
    assert!(back == data, "the staged write landed whole and in order");
    // Staged and given up: nothing is written, and every buffer comes back (a request
    // as large as the whole budget fits again).
    session.stage_write(write(offset, 512 << 10), 8).unwrap();
    let mut once = true;
    let mut zeroes = |targets: &mut [std::io::IoSliceMut<'_>]| -> std::io::Result<usize> {
        if !std::mem::take(&mut once) {
            return Ok(0);
        }
        targets[0].fill(0);
        Ok(targets[0].len())
    };
    assert!(!session.fill_staged(&mut zeroes).unwrap(), "one piece of several is not all");
    session.cancel_staged();
    assert!(session.is_idle());
    session.read(offset, &mut back).unwrap();
    assert!(back == data, "a cancelled staged write wrote nothing");
    // Two more of the same size, one after the other: the budget holds one, so the
    // second fits only if the cancelled ones gave their buffers back.
    session.stage_write(write(0, 512 << 10), 9).unwrap();
    session.cancel_staged();
    session.stage_write(write(0, 512 << 10), 9).unwrap();
    session.cancel_staged();
    // More than the session's buffers can ever hold is refused at staging.
    let err = session.stage_write(write(0, 2 << 20), 10).unwrap_err();
    assert!(matches!(err, SubmitError::NeverFits { .. } | SubmitError::TooLarge { .. }), "{err:?}");
    drop(session);
    assert_eq!(array.shutdown().unwrap(), Stopped::Clean);
}

/// Found by a misuse test: a member file truncated while served returned short reads, which
/// were repaired as bad ranges by rewriting them, growing the file back with a hole whose
/// zeros were later read as good data. A member that ends early is gone: it is failed, its
/// stripes are served from redundancy, and nothing writes it again.
#[test]
fn a_member_file_truncated_while_served_is_failed_not_rewritten() {
    let dir = scratch_dir();
    let spec = spec(dir.path(), Level::Raid5, 4);
    create(&spec).unwrap();
    let array = Array::open(&spec.members, &options()).unwrap();
    let size = array.size_bytes();
    let mut s = array.session().unwrap();
    let data = pattern(7, usize::try_from(size).unwrap());
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        s.write(i as u64 * (1 << 20), piece).unwrap();
    }
    s.flush().unwrap();
    let cut_bytes = 10u64 << 20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&spec.members[2])
        .unwrap()
        .set_len(cut_bytes)
        .unwrap();
    // Read everything, first a range whose member-2 chunks lie past the cut.
    let mut back = vec![0u8; data.len()];
    for (i, piece) in back.chunks_mut(1 << 20).enumerate().rev() {
        s.read(i as u64 * (1 << 20), piece).unwrap();
    }
    assert!(back == data, "every byte reads back, from redundancy where member 2 ended");
    let status = array.status().unwrap();
    assert!(status.degraded, "the shrunk member is out of service");
    assert_ne!(
        status.members[2].health,
        flashraid_engine::Health::Active,
        "{:?}",
        status.members[2]
    );
    // Again, after the failure: still right, and the file never grew back.
    let mut again = vec![0u8; data.len()];
    for (i, piece) in again.chunks_mut(1 << 20).enumerate() {
        s.read(i as u64 * (1 << 20), piece).unwrap();
    }
    assert!(again == data);
    drop(s);
    array.shutdown().unwrap();
    assert_eq!(std::fs::metadata(&spec.members[2]).unwrap().len(), cut_bytes);
}
