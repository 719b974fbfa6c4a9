//! Read errors never fail a member that stripes resync has not vouched for still need (they
//! are never reconstructed): found by review, a RAID 5 whose resync stopped at a bad sector
//! failed member 0 after 40 bad sectors were read, and its readable blocks became unreadable.
//! Review D: a member failed for read errors while resync has not vouched for its stripes.
use flashraid_engine::{Health, RequestError, RequestId, Shard, ShardOp, ShardRequest};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, Level, MemberIndex, Role, StripeIndex};

mod common;
use common::{CHUNK, DATA_OFFSET, Mem, drive, shard};

fn read(
    s: &mut Shard,
    mem: &mut Mem,
    now: &mut u64,
    id: u64,
    offset: u64,
) -> Result<(), RequestError> {
    s.submit(ShardRequest {
        id: RequestId(id),
        op: ShardOp::Read { offset: ArrayOffset(offset), len_bytes: 4096 },
        buf: Some(IoBuf::new(4096)),
    })
    .unwrap();
    drive(s, mem, now);
    s.poll_reply().expect("a reply").result
}

/// RAID 5 after an unclean stop (every region dirty). Member 0 has one bad 4 KiB sector in
/// each of 40 stripes where it holds data. Resync stops at the first (RAID 5 cannot rebuild
/// an unreadable data unit it could check), so the stripes after it stay untrusted and reads
/// there are never reconstructed. A client reading the bad sectors gets `Unreadable` each
/// time (right), but each counts as a read error, and past 32 member 0 is failed: the array
/// "survives" one member out, yet every untrusted stripe now needs member 0's chunk, so
/// every readable block member 0 held there becomes unreadable too.
#[test]
fn read_errors_do_not_fail_a_member_whose_untrusted_stripes_need_it() {
    let dirty: Vec<u32> = (0..16).collect();
    let mut s = shard(Level::Raid5, 4, &[], &dirty);
    let g = *s.geometry();
    let mut mem = Mem::new(4, DATA_OFFSET + 64 * CHUNK);
    let data_of_0 = |st: u64| match g.role(StripeIndex(st), MemberIndex(0)) {
        Role::Data { index, .. } => Some(index as u64),
        Role::Parity { .. } => None,
    };
    let stripes: Vec<u64> = (0..64).filter(|&st| data_of_0(st).is_some()).collect();
    let bad: Vec<u64> = stripes[..40].to_vec();
    for &st in &bad {
        mem.bad[0].push((DATA_OFFSET + g.member_offset(StripeIndex(st), 0).0, 4096));
    }
    let mut now = 0;
    drive(&mut s, &mut mem, &mut now); // resync runs and stops at the first bad stripe
    assert!(s.resync_pending(), "setup: resync stopped at the bad sector");
    // A readable block of member 0 in an untrusted stripe reads before.
    let last = *stripes.last().unwrap();
    let good = last * g.stripe_data_bytes() + data_of_0(last).unwrap() * CHUNK + 8192;
    assert_eq!(read(&mut s, &mut mem, &mut now, 1, good), Ok(()), "setup: readable before");
    for (i, &st) in bad.iter().enumerate() {
        let at = st * g.stripe_data_bytes() + data_of_0(st).unwrap() * CHUNK;
        let r = read(&mut s, &mut mem, &mut now, 100 + i as u64, at);
        assert_eq!(r, Err(RequestError::Unreadable), "stripe {st}");
    }
    let health = s.member_health(MemberIndex(0));
    let after = read(&mut s, &mut mem, &mut now, 2, good);
    assert_eq!(
        after,
        Ok(()),
        "a readable block became unreadable: member 0 is {health:?} after 40 bad sectors read \
         in stripes resync has not vouched for"
    );
    assert_eq!(health, Health::Active);
}
