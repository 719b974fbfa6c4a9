//! Read errors that are not repaired: a bad sector read again and again (a client retrying,
//! a stalled rebuild retrying) is one error, not many, and a member is never failed for
//! read errors when the array cannot do without it (each test here failed before the fix:
//! the count of a degraded RAID 5's member reached the limit and failed the array).
use flashraid_control::Init;
use flashraid_engine::{ArrayOp, RequestError, ShardEvent};
use flashraid_layout::{ArrayOffset, Level, Location, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn opts(seed: u64, level: Level, n: usize) -> SimOptions {
    let mut o = SimOptions::new(seed, level, n);
    (o.member_bytes, o.chunk_bytes, o.shards, o.init) = (2 << 20, 16 << 10, 1, Init::Zero);
    o
}
fn setup(o: SimOptions) -> (SimArray, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut array = SimArray::create(o).unwrap();
    let model = array.fill_random(&mut rng);
    array.run_until_idle();
    (array, model)
}

#[test]
fn a_degraded_raid5_read_retried_on_one_bad_sector_does_not_fail_the_array() {
    let mut o = opts(1, Level::Raid5, 4);
    o.config.member_read_errors_max = 8; // default 32: the 33rd read does it
    let (mut array, model) = setup(o);
    array.fail_member(0);
    array.run_until_idle();
    let g = array.geometry();
    let stripe = 5u64;
    let index = (0..g.data_chunks()).find(|&i| array.data_role(stripe, i) != 0).unwrap();
    let member = array.data_role(stripe, index);
    array.role_device(member).unwrap().state().bad_ranges.push((array.chunk_offset(stripe), 4096));
    let loc = Location { stripe: StripeIndex(stripe), data_index: index, offset_in_chunk_bytes: 0 };
    let offset = g.array_offset(loc).0;
    for attempt in 0..20 {
        let op = ArrayOp::Read { offset: ArrayOffset(offset), len_bytes: 4096 };
        let t = array.submit(op, None).unwrap();
        assert_eq!(array.wait(t).err(), Some(RequestError::Unreadable), "attempt {attempt}");
        array.run_until_idle();
    }
    // Another stripe (the chunk beside it may be the failed member's, whose reconstruction
    // needs the bad sector).
    let other = offset + 2 * g.stripe_data_bytes();
    let got = array.read(other, 4096).unwrap_or_else(|e| {
        panic!("the rest of the array must stay readable: {e}; {:?}", array.member_failures())
    });
    assert!(got == model[other as usize..other as usize + 4096]);
    assert!(array.member_failures().is_empty(), "{:?}", array.member_failures());
}

#[test]
fn read_errors_never_fail_a_member_the_array_cannot_do_without() {
    for degraded in [true, false] {
        let mut o = opts(7, Level::Raid5, 4);
        o.config.member_read_errors_max = 4;
        let (mut array, model) = setup(o);
        if degraded {
            array.fail_member(0);
            array.run_until_idle();
        }
        let g = array.geometry();
        let member = 2;
        let mut bad_offsets = vec![];
        for stripe in 1..9u64 {
            let Some(index) = (0..g.data_chunks()).find(|&i| array.data_role(stripe, i) == member)
            else {
                continue; // parity on member 2 in this stripe
            };
            array
                .role_device(member)
                .unwrap()
                .state()
                .bad_ranges
                .push((array.chunk_offset(stripe), 4096));
            let loc = Location {
                stripe: StripeIndex(stripe),
                data_index: index,
                offset_in_chunk_bytes: 0,
            };
            bad_offsets.push(g.array_offset(loc).0);
        }
        assert!(bad_offsets.len() > 4, "more bad stripes than the limit");
        for &offset in &bad_offsets {
            let got = array.read(offset, 4096);
            if degraded {
                assert_eq!(got.err(), Some(RequestError::Unreadable));
            } else {
                assert!(got.unwrap() == model[offset as usize..offset as usize + 4096]);
            }
            array.run_until_idle();
        }
        if degraded {
            assert!(array.member_failures().is_empty(), "{:?}", array.member_failures());
            let other = bad_offsets[0] + 2 * g.stripe_data_bytes() - 4096;
            let other = (10 * g.stripe_data_bytes()).max(other);
            assert!(
                array.read(other, 4096).unwrap() == model[other as usize..other as usize + 4096]
            );
        } else {
            assert!(
                array.member_failures().iter().any(|f| f.contains("ReadErrors")),
                "a healthy array fails the member past the limit: {:?}",
                array.member_failures()
            );
        }
    }
}

#[test]
fn a_stalled_rebuild_retrying_does_not_fail_its_source_member() {
    let mut o = opts(2, Level::Raid5, 4);
    o.spares = 1;
    o.config.rebuild_stall_retry_us = 2_000; // default 10 s: ~5.5 minutes with the default 32
    o.config.member_read_errors_max = 8;
    let (mut array, _) = setup(o);
    let stripe = 5u64;
    let mut member = array.data_role(stripe, 0);
    if member == 0 {
        member = array.data_role(stripe, 1);
    }
    array.role_device(member).unwrap().state().bad_ranges.push((array.chunk_offset(stripe), 4096));
    array.fail_member(0); // the spare takes role 0; its rebuild stalls at `stripe`
    array.run_steps(200 * 20);
    assert!(array.events.iter().any(|e| matches!(e, ShardEvent::RebuildStalled { .. })));
    assert!(
        array.member_failures().is_empty(),
        "retries failed source {member}: {:?}",
        array.member_failures()
    );
}

// ---- Bug 2: scrub rewrites a whole chunk around one bad sector (check scrubs too).
