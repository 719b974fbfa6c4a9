//! A stripe whose parity rows are all on members out of service (RAID 5 with its parity
//! member failed, RAID 6 with P and Q failed) has nothing to keep consistent: a write to its
//! readable data chunks is written straight through, with no reads. Found by review: the
//! planner read the other data chunks (reconstruct-write, for parity it could not write), and
//! a bad sector there failed the client's write with `Unreadable`.
use flashraid_layout::{Level, StripeIndex};
use flashraid_sim::{SimArray, SimOptions, pattern};

#[test]
fn a_write_with_the_parity_member_gone_does_not_fail_on_another_chunks_bad_sector() {
    let mut o = SimOptions::new(7, Level::Raid5, 3);
    o.shards = 1;
    let mut array = SimArray::create(o).unwrap();
    let g = array.geometry();
    let s0 = StripeIndex(0);
    let parity = g.parity_member(s0, 0).get();
    let d1 = g.data_member(s0, 1, 0).get();
    let chunk = u64::from(g.chunk_bytes());
    let old = pattern(1, 2 * chunk as usize); // stripe 0: data chunks 0 and 1
    array.write(0, &old).unwrap();
    array.flush().unwrap();
    // The parity member leaves; data chunk 1 of stripe 0 has a bad sector at its start.
    array.fail_member(parity);
    array.run_until_idle();
    let data_offset = array.metadata().superblock().data_offset_bytes;
    array.role_device(d1).unwrap().state().bad_ranges.push((data_offset, 4096));
    // 4 KiB into data chunk 0: nothing needs to be read (no parity left to update).
    let new = pattern(2, 4096);
    let result = array.write(0, &new);
    assert_eq!(result, Ok(()), "write to a healthy data chunk failed");
    assert_eq!(array.read(0, 4096).unwrap(), new);
}

/// RAID 6 x6 (4 data chunks) with both parity members of the stripe gone (within its
/// tolerance of two): a write of three whole chunks is planned RCW (one read: the fourth).
#[test]
fn raid6_a_write_with_both_parity_members_gone_does_not_fail_on_a_bad_sector() {
    let mut o = SimOptions::new(8, Level::Raid6, 6);
    o.shards = 1;
    let mut array = SimArray::create(o).unwrap();
    let g = array.geometry();
    let s0 = StripeIndex(0);
    let chunk = g.chunk_bytes() as usize;
    array.write(0, &pattern(1, 4 * chunk)).unwrap();
    array.flush().unwrap();
    array.fail_member(g.parity_member(s0, 0).get());
    array.fail_member(g.parity_member(s0, 1).get());
    array.run_until_idle();
    let data_offset = array.metadata().superblock().data_offset_bytes;
    let d3 = g.data_member(s0, 3, 0).get();
    array.role_device(d3).unwrap().state().bad_ranges.push((data_offset, 4096));
    let new = pattern(2, 3 * chunk);
    assert_eq!(array.write(0, &new), Ok(()), "write to healthy data chunks failed");
    assert_eq!(array.read(0, 3 * chunk as u64).unwrap(), new);
}
