//! Micro-benchmark: do registered buffers (READ_FIXED/WRITE_FIXED) beat plain READ/WRITE?
//!
//! Random O_DIRECT reads or writes at a fixed queue depth on one file, one thread, one ring,
//! each mode for a fixed time. Run:
//!
//! ```text
//! cargo run --release -p flashraid-uring --example fixed_buffers -- [DIR] [SECONDS] [ROUNDS]
//! ```
//!
//! `DIR` defaults to /dev/shm (tmpfs). Each case runs `ROUNDS` times (default 5), plain and
//! fixed alternating so drift hits both alike, `SECONDS` each (default 1); the median is
//! reported. The file (256 MiB) is removed at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use flashraid_iobuf::IoBuf;
use flashraid_uring::{Device, Op, Ring, check_transfer};

const FILE_BYTES: u64 = 256 << 20;
const QUEUE_DEPTH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Fixed,
}

fn run(device: &Device, write: bool, mode: Mode, block_bytes: usize, seconds: f64) -> (f64, f64) {
    let mut bufs: Vec<IoBuf> = (0..QUEUE_DEPTH).map(|_| IoBuf::new(block_bytes)).collect();
    let mut ring = Ring::new(64).unwrap();
    ring.register_files(&[device.raw_fd()]).unwrap();
    if mode == Mode::Fixed {
        let regions: Vec<(*mut u8, usize)> =
            bufs.iter_mut().map(|buf| (buf.as_mut_ptr(), buf.capacity_bytes())).collect();
        // SAFETY: `bufs` is declared before `ring`, so it is dropped after the ring.
        unsafe { ring.register_buffers(&regions) }.unwrap();
    }
    let blocks = FILE_BYTES / block_bytes as u64;
    let mut seed = 0x1234_5678_u64;
    let mut next_offset = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % blocks) * block_bytes as u64
    };
    let len_bytes = u32::try_from(block_bytes).unwrap();
    let mut push = |ring: &mut Ring, bufs: &mut [IoBuf], slot: usize| {
        let (offset_bytes, ptr, buf_index) = (next_offset(), bufs[slot].as_mut_ptr(), slot as u16);
        let op = match (write, mode) {
            (false, Mode::Plain) => Op::Read { file: 0, offset_bytes, ptr, len_bytes },
            (false, Mode::Fixed) => {
                Op::ReadFixed { file: 0, offset_bytes, ptr, len_bytes, buf_index }
            }
            (true, Mode::Plain) => Op::Write { file: 0, offset_bytes, ptr, len_bytes, fua: false },
            (true, Mode::Fixed) => {
                Op::WriteFixed { file: 0, offset_bytes, ptr, len_bytes, buf_index, fua: false }
            }
        };
        // SAFETY: bufs[slot] is not touched until slot's completion is reaped, and outlives
        // the ring.
        unsafe { ring.push(op, slot as u64) }.unwrap();
    };
    for slot in 0..QUEUE_DEPTH {
        push(&mut ring, &mut bufs, slot);
    }
    let deadline = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut done = 0u64;
    let mut ready = Vec::with_capacity(QUEUE_DEPTH);
    while started.elapsed() < deadline {
        ring.submit(1, None).unwrap();
        ring.reap(|slot, result| {
            check_transfer(result, len_bytes).unwrap();
            ready.push(slot as usize);
        });
        done += ready.len() as u64;
        for slot in ready.drain(..) {
            push(&mut ring, &mut bufs, slot);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let iops = done as f64 / elapsed;
    (iops, iops * block_bytes as f64 / (1u64 << 30) as f64)
}

fn median(mut samples: Vec<(f64, f64)>) -> (f64, f64) {
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    samples[samples.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm".to_owned()));
    let seconds: f64 = args.next().map_or(1.0, |text| text.parse().expect("SECONDS"));
    let rounds: usize = args.next().map_or(5, |text| text.parse().expect("ROUNDS"));
    let path = dir.join(format!("flashraid-fixed-bench-{}", std::process::id()));
    let device = Device::create_file(&path, FILE_BYTES).unwrap();
    // Touch every page once so reads measure IO, not first-touch allocation.
    let mut chunk = IoBuf::new(1 << 20);
    chunk.as_mut_slice().fill(0x5a);
    for offset_bytes in (0..FILE_BYTES).step_by(1 << 20) {
        device.write_at(chunk.as_slice(), offset_bytes).unwrap();
    }
    println!(
        "dir {}, file {} MiB, QD {QUEUE_DEPTH}, median of {rounds} x {seconds} s per case",
        dir.display(),
        FILE_BYTES >> 20
    );
    println!(
        "{:<6} {:>8} {:>12} {:>12} {:>9} {:>9} {:>7}",
        "op", "block", "plain IOPS", "fixed IOPS", "plain GiB/s", "fixed GiB/s", "gain"
    );
    for write in [false, true] {
        for block_bytes in [4096, 65536, 1 << 20] {
            let (mut plain, mut fixed) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                plain.push(run(&device, write, Mode::Plain, block_bytes, seconds));
                fixed.push(run(&device, write, Mode::Fixed, block_bytes, seconds));
            }
            let ((plain_iops, plain_gib), (fixed_iops, fixed_gib)) = (median(plain), median(fixed));
            println!(
                "{:<6} {:>8} {:>12.0} {:>12.0} {:>9.2} {:>9.2} {:>+6.1}%",
                if write { "write" } else { "read" },
                block_bytes,
                plain_iops,
                fixed_iops,
                plain_gib,
                fixed_gib,
                (fixed_iops / plain_iops - 1.0) * 100.0
            );
        }
    }
    drop(device);
    std::fs::remove_file(&path).unwrap();
}
