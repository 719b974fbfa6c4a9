//! A member flush that fails (client or internal) proves nothing durable, and must not stop
//! later flushes from clearing the write-intent bitmap (found by review: its mark stayed set,
//! no clearing flush was issued again, and every region written afterwards stayed dirty until
//! a stop; a crash then left a dirty, degraded array that needs `--force`).
//! Review D: the write-intent bitmap's flush mark (`flush_issued_at`) after a failed flush.
use flashraid_engine::{
    Durability, IoError, MemberCompletion, MemberIoKind, RequestId, Shard, ShardConfig, ShardEvent,
    ShardOp, ShardRequest,
};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, Level, MemberIndex};

mod common;
use common::{Mem, ios, shard_with};

fn write(s: &mut Shard, id: u64, offset: u64) {
    let mut buf = IoBuf::new(4096);
    buf.as_mut_slice().fill(id as u8);
    s.submit(ShardRequest {
        id: RequestId(id),
        op: ShardOp::Write {
            offset: ArrayOffset(offset),
            len_bytes: 4096,
            durability: Durability::Cached,
        },
        buf: Some(buf),
    })
    .unwrap();
}

/// Run for `us` microseconds of shard time, completing every IO (member flushes of
/// `bad_flush` fail), applying failures at once.
fn run(s: &mut Shard, mem: &mut Mem, now: &mut u64, us: u64, bad_flush: Option<usize>) {
    let end = *now + us;
    while *now < end {
        *now += 1000;
        s.tick(*now);
        for io in ios(s) {
            let r = if matches!(io.kind, MemberIoKind::Flush) && Some(io.member.get()) == bad_flush
            {
                Err(IoError::Media)
            } else {
                mem.perform(&io)
            };
            s.complete_io(MemberCompletion { token: io.token, result: r });
        }
        let failed: Vec<MemberIndex> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                ShardEvent::MemberFailed { member, .. } => Some(member),
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            s.apply_failed(&failed);
        }
        while s.poll_reply().is_some() {}
    }
}

#[test]
fn bits_still_clear_after_a_client_flush_failed_on_a_member() {
    let config = ShardConfig {
        scratch_bytes: 4 << 20,
        bitmap_clear_delay_us: 20_000,
        ..ShardConfig::recommended()
    };
    let mut s = shard_with(config, Level::Raid6, 5, &[], &[]);
    let mut mem = Mem::new(5, 8 << 20);
    let mut now = 0;
    // Control: a write's region clears once idle and flushed.
    write(&mut s, 1, 0);
    run(&mut s, &mut mem, &mut now, 200_000, None);
    assert_eq!(s.bitmap_regions_set(), 0, "control: the region clears");
    // A client flush fails on member 4 (it is failed; RAID 6 goes on with one out).
    write(&mut s, 2, 0);
    run(&mut s, &mut mem, &mut now, 5_000, None);
    s.submit(ShardRequest { id: RequestId(3), op: ShardOp::Flush, buf: None }).unwrap();
    run(&mut s, &mut mem, &mut now, 5_000, Some(4));
    // Later writes, then a long idle time: their regions should clear as before.
    write(&mut s, 4, 0);
    run(&mut s, &mut mem, &mut now, 2_000_000, None);
    assert_eq!(
        s.bitmap_regions_set(),
        0,
        "a region written after a failed flush is never cleared: no internal flush is issued again"
    );
}

#[test]
fn bits_still_clear_after_an_internal_flush_failed_on_a_member() {
    let config = ShardConfig {
        scratch_bytes: 4 << 20,
        bitmap_clear_delay_us: 20_000,
        ..ShardConfig::recommended()
    };
    let mut s = shard_with(config, Level::Raid6, 5, &[], &[]);
    let mut mem = Mem::new(5, 8 << 20);
    let mut now = 0;
    write(&mut s, 1, 0);
    // The internal (clearing) flush fails on member 4.
    run(&mut s, &mut mem, &mut now, 200_000, Some(4));
    write(&mut s, 2, 0);
    run(&mut s, &mut mem, &mut now, 2_000_000, None);
    assert_eq!(
        s.bitmap_regions_set(),
        0,
        "the region is never cleared after a failed internal flush"
    );
}
