//! Mirror reads of stripes an unclean shutdown left dirty, served before resync reaches them
//! (docs/safety.md, hazards table: "Mirror reads of a stripe awaiting resync ...").
//!
//! After a power loss a mirror's copies of a dirty region may differ: a cached write reached
//! some members' media and was lost from the others' volatile caches. Resync makes every copy
//! equal to the reference copy, the lowest available member holding it. A read served before
//! resync must return that same copy; a read of any other copy would return bytes that resync
//! later overwrites, so the same range would read differently with no write in between.
//!
//! Each case, on RAID 1 or RAID 10 in the simulator:
//! 1. OLD is written over the last stripes of bitmap region 0 and flushed; NEW is written over
//!    it (cached). The bitmap clear delay is long, so the region's bit stays set on disk.
//! 2. Power is lost with NEW on the media of the members the case names and lost from the
//!    others' caches (a legal power-loss outcome, chosen rather than drawn so every case is
//!    exact). The members' bytes are checked to hold exactly that.
//! 3. Reassembly. Resync is throttled to one stripe in flight per shard and starts at the
//!    region's first stripe, so the reads below are served while the target stripes' copies
//!    still differ on the members (checked on the stored bytes after each read completes).
//!    Reads: several whole-range and per-stripe reads submitted before the first step, then
//!    whole-range reads between steps until resync finishes.
//! 4. After resync: every copy on the members equals the reference copy (so the test's
//!    reference is resync's), and a last read equals it too.
//!
//! Every read, before, during and after resync, must equal the reference copy's bytes.
//!
//! The cases are discriminating: in each, the copy the healthy read path starts at (the copy
//! rotates by stripe to spread reads) differs from the reference copy on some target stripe,
//! which is asserted. Checked by mutation, in a scratch copy of the workspace (the engine
//! sources here untouched); each mutant fails the first case, `raid1 x2 kept_new [false,
//! true] seed 1`:
//! - `Shard::reference_copy` (crates/engine/src/shard/read.rs) returning `.max()` instead of
//!   `.min()`: "read before resync: stripe 248 data position 0: read NEW, which differs from
//!   the reference copy (member 0)";
//! - `begin_read` calling `pick_copy` instead of `reference_copy` for untrusted stripes:
//!   "read before resync: stripe 249 ... read NEW ...";
//! - resync's mirror reference (`resync_after_reads`, background.rs) taken as the highest
//!   readable copy instead of the lowest: "read during resync: stripe 249 ... read NEW ..."
//!   (the same stripe read OLD before resync: a read result changed without a write).

use flashraid_engine::ArrayOp;
use flashraid_format::assembly::DirtyDegraded;
use flashraid_layout::{ArrayOffset, Geometry, Level, Location, MemberIndex, Role, StripeIndex};
use flashraid_sim::{SimArray, SimMember, SimOptions, Ticket, pattern};

const CHUNK: u64 = 4096;
/// The bitmap region size `SimArray::create` uses (member bytes per region).
const REGION_BYTES: u64 = 1 << 20;
/// Target stripes: the last ones of bitmap region 0, so resync (which walks the region from
/// its first stripe) reaches them last.
const TARGET_STRIPES: u64 = 8;
const FIRST_STRIPE: u64 = REGION_BYTES / CHUNK - TARGET_STRIPES;

/// One scenario: a mirror level and which members hold NEW (rather than OLD) after the crash.
struct Case {
    level: Level,
    members: usize,
    kept_new: &'static [bool],
}

/// The target range in the array and the geometry facts the checks need.
struct Target {
    geometry: Geometry,
    data_offset: u64,
    /// Array offset and length of the target stripes.
    offset: u64,
    len: u64,
}

impl Target {
    fn stripes(&self) -> impl Iterator<Item = StripeIndex> {
        (FIRST_STRIPE..FIRST_STRIPE + TARGET_STRIPES).map(StripeIndex)
    }

    /// Byte range in the target buffers of data position `i` of `stripe`.
    fn slice_of(&self, stripe: StripeIndex, i: usize) -> std::ops::Range<usize> {
        let at = self.geometry.array_offset(Location {
            stripe,
            data_index: i,
            offset_in_chunk_bytes: 0,
        });
        let start = usize::try_from(at.0 - self.offset).unwrap();
        start..start + CHUNK as usize
    }

    /// The members holding a copy of data position `i` of `stripe`, in copy order.
    fn copies(&self, stripe: StripeIndex, i: usize) -> Vec<usize> {
        (0..self.geometry.copies()).map(|c| self.geometry.data_member(stripe, i, c).get()).collect()
    }

    /// The chunk `member` stores for `stripe`, as its media reads now.
    fn stored(&self, device: &SimMember, stripe: StripeIndex) -> Vec<u8> {
        let at = self.data_offset + self.geometry.member_offset(stripe, 0).0;
        let at = usize::try_from(at).unwrap();
        device.state().current[at..at + CHUNK as usize].to_vec()
    }

    /// Whether every target stripe still has copies that differ on the members: resync has
    /// repaired none of them yet.
    fn all_copies_differ(&self, devices: &[SimMember]) -> bool {
        self.stripes().all(|s| {
            (0..self.geometry.data_chunks()).any(|i| {
                let copies = self.copies(s, i);
                let first = self.stored(&devices[copies[0]], s);
                copies[1..].iter().any(|&m| self.stored(&devices[m], s) != first)
            })
        })
    }
}

fn members_of(array: &SimArray, n: usize) -> Vec<SimMember> {
    (0..n).map(|role| array.role_device(role).expect("every member active")).collect()
}

/// Where a read's differing chunk first differs, described for the failure message.
fn explain(target: &Target, got: &[u8], expected: &[u8], old: &[u8], new: &[u8]) -> String {
    for s in target.stripes() {
        for i in 0..target.geometry.data_chunks() {
            let r = target.slice_of(s, i);
            if got[r.clone()] != expected[r.clone()] {
                let what = if got[r.clone()] == old[r.clone()] {
                    "OLD"
                } else if got[r.clone()] == new[r.clone()] {
                    "NEW"
                } else {
                    "neither OLD nor NEW"
                };
                let reference = target.copies(s, i).into_iter().min().unwrap();
                return format!(
                    "stripe {} data position {i}: read {what}, which differs from the reference \
                     copy (member {reference})",
                    s.0
                );
            }
        }
    }
    "no difference".to_string()
}

fn run(case: &Case, seed: u64) {
    let name = format!("{} x{} kept_new {:?} seed {seed}", case.level, case.members, case.kept_new);
    let mut options = SimOptions::new(seed, case.level, case.members);
    options.chunk_bytes = CHUNK;
    // The region's bit stays set until the crash; resync goes one stripe at a time.
    options.config.bitmap_clear_delay_us = 60_000_000;
    options.config.resync_stripes_max = 1;
    let mut array = SimArray::create(options.clone()).unwrap();
    let geometry = array.geometry();
    let k = geometry.data_chunks() as u64;
    let target = Target {
        geometry,
        data_offset: array.metadata().superblock().data_offset_bytes,
        offset: FIRST_STRIPE * k * CHUNK,
        len: TARGET_STRIPES * k * CHUNK,
    };
    let len = usize::try_from(target.len).unwrap();
    let old = pattern(seed * 2 + 1, len);
    let new = pattern(seed * 2 + 2, len);

    // 1. OLD durable everywhere, then NEW in the members' caches.
    array.write(target.offset, &old).unwrap();
    array.flush().unwrap();
    array.write(target.offset, &new).unwrap();

    // 2. Power loss: NEW reaches the media of the members in `kept_new` only.
    let members = members_of(&array, case.members);
    let member_lo = target.data_offset + geometry.member_offset(StripeIndex(FIRST_STRIPE), 0).0;
    let member_hi = member_lo + TARGET_STRIPES * CHUNK;
    for (m, device) in members.iter().enumerate() {
        let mut state = device.state();
        for &(o, l) in &state.unflushed {
            assert!(
                member_lo <= o && o + l <= member_hi,
                "{name}: member {m} has an unflushed write outside the target ({o}+{l})"
            );
        }
        if case.kept_new[m] {
            state.flush().unwrap();
        } else {
            state.unflushed.clear();
        }
    }
    let devices = array.crash();

    // The stored bytes are exactly the case's: NEW on `kept_new` members, OLD elsewhere.
    for s in target.stripes() {
        for (m, device) in members.iter().enumerate() {
            let Role::Data { index: i, .. } = geometry.role(s, MemberIndex(m as u16)) else {
                unreachable!("mirrors hold data only")
            };
            let r = target.slice_of(s, i);
            let want = if case.kept_new[m] { &new[r] } else { &old[r] };
            assert!(target.stored(device, s) == want, "{name}: crash left member {m} unexpected");
        }
    }

    // The bytes resync will make authoritative: the lowest member holding each copy.
    let mut expected = vec![0u8; len];
    let mut discriminating = false;
    for s in target.stripes() {
        for i in 0..geometry.data_chunks() {
            let copies = target.copies(s, i);
            let reference = *copies.iter().min().unwrap();
            let r = target.slice_of(s, i);
            let source = if case.kept_new[reference] { &new } else { &old };
            expected[r.clone()].copy_from_slice(&source[r.clone()]);
            // The healthy read path starts at the copy `stripe % copies` (spreading reads).
            let rotated = copies[usize::try_from(s.0 % copies.len() as u64).unwrap()];
            discriminating |= case.kept_new[rotated] != case.kept_new[reference];
        }
    }
    assert!(discriminating, "{name}: the case cannot tell the reference copy from the others");

    // 3. Reassemble; read before resync reaches the target stripes.
    let mut array = SimArray::assemble(devices, options, DirtyDegraded::Refuse)
        .unwrap_or_else(|e| panic!("{name}: reassembly failed: {e}"));
    let devices = members_of(&array, case.members);
    assert!(array.is_resyncing(), "{name}: the crash left nothing to resync");
    let check = |phase: &str, got: &[u8]| {
        assert!(
            got == expected.as_slice(),
            "{name}: read {phase}: {}",
            explain(&target, got, &expected, &old, &new)
        );
    };

    // Before the first step (resync has not started): whole-range reads and one read per
    // stripe, all queued at once.
    let read_op =
        |offset: u64, len: u64| ArrayOp::Read { offset: ArrayOffset(offset), len_bytes: len };
    let mut tickets: Vec<(u64, Ticket)> = vec![];
    for _ in 0..3 {
        tickets
            .push((target.offset, array.submit(read_op(target.offset, target.len), None).unwrap()));
    }
    for s in target.stripes() {
        let at =
            geometry.array_offset(Location { stripe: s, data_index: 0, offset_in_chunk_bytes: 0 });
        tickets.push((at.0, array.submit(read_op(at.0, k * CHUNK), None).unwrap()));
    }
    let mut reads_first = 0;
    for (at, ticket) in tickets {
        let got = array.wait(ticket).unwrap().expect("read data");
        let start = usize::try_from(at - target.offset).unwrap();
        let mut whole = expected.clone();
        whole[start..start + got.len()].copy_from_slice(&got);
        check("before resync", &whole);
        reads_first += 1;
    }
    assert!(
        target.all_copies_differ(&devices),
        "{name}: resync reached the target stripes during the first reads"
    );

    // While resync works through the region's earlier stripes (and then the target ones).
    let mut reads_before = 0;
    let mut reads_during = 0;
    let mut rounds = 0;
    while array.is_resyncing() {
        array.run_steps(5);
        let got = array.read(target.offset, target.len).unwrap();
        let unrepaired = target.all_copies_differ(&devices);
        check(if unrepaired { "before resync" } else { "during resync" }, &got);
        if unrepaired {
            reads_before += 1;
        } else {
            reads_during += 1;
        }
        rounds += 1;
        assert!(rounds < 10_000, "{name}: resync never finished");
    }
    assert!(reads_before >= 3, "{name}: only {reads_before} reads between steps before resync");

    // 4. After resync: every copy equals the reference copy, and so does a read.
    array.run_until_idle();
    assert!(!array.is_resyncing(), "{name}: resync did not finish");
    assert!(
        array.counters().resync_repairs >= TARGET_STRIPES,
        "{name}: resync did not repair every target stripe"
    );
    for s in target.stripes() {
        for (m, device) in devices.iter().enumerate() {
            let Role::Data { index: i, .. } = geometry.role(s, MemberIndex(m as u16)) else {
                unreachable!("mirrors hold data only")
            };
            assert!(
                target.stored(device, s) == expected[target.slice_of(s, i)],
                "{name}: after resync member {m}'s copy of stripe {} is not the reference copy",
                s.0
            );
        }
    }
    let after = array.read(target.offset, target.len).unwrap();
    check("after resync", &after);
    if std::env::var_os("FLASHRAID_VERBOSE").is_some() {
        eprintln!(
            "{name}: {reads_first} reads queued at once and {reads_before} between steps before \
             resync, {reads_during} during or after it"
        );
    }
}

#[test]
fn reads_before_resync_return_the_copy_resync_keeps() {
    let cases = [
        // RAID 1, two copies: NEW only on the second member (resync rolls it back), then
        // only on the first (resync spreads it).
        Case { level: Level::Raid1, members: 2, kept_new: &[false, true] },
        Case { level: Level::Raid1, members: 2, kept_new: &[true, false] },
        // RAID 1, three copies.
        Case { level: Level::Raid1, members: 3, kept_new: &[false, true, true] },
        Case { level: Level::Raid1, members: 3, kept_new: &[true, false, false] },
        Case { level: Level::Raid1, members: 3, kept_new: &[false, false, true] },
        // RAID 10: pair (0, 1) keeps OLD as reference, pair (2, 3) keeps NEW, and the reverse.
        Case { level: Level::Raid10, members: 4, kept_new: &[false, true, true, false] },
        Case { level: Level::Raid10, members: 4, kept_new: &[true, false, false, true] },
    ];
    for case in &cases {
        for seed in 1..=3 {
            run(case, seed);
        }
    }
}
