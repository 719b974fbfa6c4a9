//! Degraded reads at the shard's seam (requests in, member IOs out, no member data): a read of
//! part of a missing chunk reads only that part of each source, at its offset in the chunk, k
//! reads in all, and rebuilds it in the request's own buffer. The bytes themselves are checked
//! in the simulator (`crates/sim/tests/degraded_read.rs`).

use flashraid_engine::{MemberCompletion, MemberIoKind, RequestId, Shard, ShardOp, ShardRequest};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, Level, MemberIndex, Role, StripeIndex};

mod common;
use common::{CHUNK, DATA_OFFSET, ios};

fn shard(level: Level, n: usize, failed: &[usize]) -> Shard {
    common::shard(level, n, failed, &[])
}

/// A 4 KiB read at each offset of a chunk on a failed member: k member reads of exactly that
/// 4 KiB, from the stripe's other members, and the chunk rebuilt in place.
#[test]
fn a_4k_read_of_a_missing_chunk_reads_4k_of_each_source() {
    for (level, n, failed) in [
        (Level::Raid5, 4, vec![0]),
        (Level::Raid6, 6, vec![0, 3]),
        (Level::Raid7_3, 7, vec![0, 2, 5]),
    ] {
        let mut s = shard(level, n, &failed);
        let g = *s.geometry();
        // A stripe where member 0 (failed) holds data.
        let (stripe, index) = (0..g.stripes())
            .map(StripeIndex)
            .find_map(|st| match g.role(st, MemberIndex(0)) {
                Role::Data { index, .. } => Some((st, index)),
                Role::Parity { .. } => None,
            })
            .unwrap();
        for (id, in_chunk) in (0..CHUNK).step_by(4096).enumerate() {
            let offset = stripe.0 * g.stripe_data_bytes() + index as u64 * CHUNK + in_chunk;
            let op = ShardOp::Read { offset: ArrayOffset(offset), len_bytes: 4096 };
            let request =
                ShardRequest { id: RequestId(id as u64), op, buf: Some(IoBuf::new(4096)) };
            s.submit(request).unwrap();
            let reads = ios(&mut s);
            let what = format!("{level} without {failed:?}, 4 KiB at {in_chunk} in the chunk");
            assert_eq!(reads.len(), g.data_chunks(), "{what}: k sources");
            for io in &reads {
                let MemberIoKind::Read { offset_bytes, len_bytes, .. } = io.kind else {
                    panic!("{what}: {io:?} is not a read");
                };
                assert!(!failed.contains(&io.member.get()), "{what}: read a failed member");
                let at = DATA_OFFSET + stripe.0 * CHUNK + in_chunk;
                assert_eq!((offset_bytes, len_bytes), (at, 4096), "{what}: {io:?}");
            }
            for io in reads {
                s.complete_io(MemberCompletion { token: io.token, result: Ok(()) });
            }
            let reply = s.poll_reply().expect("a reply");
            assert_eq!(reply.result, Ok(()), "{what}");
            assert!(ios(&mut s).is_empty(), "{what}: more IO after the reply");
        }
        let c = s.counters();
        let reads = CHUNK / 4096;
        assert_eq!((c.degraded_reads, c.degraded_reads_in_place), (reads, reads), "{level}");
    }
}
