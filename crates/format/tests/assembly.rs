//! Assembly decisions: the newest view wins, stale and foreign devices are refused or left
//! out, duplicate roles and too many missing members stop assembly, dirty and degraded needs
//! force.

use flashraid_format::assembly::{
    Assembled, AssemblyError, AssemblyRequest, Candidate, DirtyDegraded, StaleMembers,
    StrictDevices, assemble,
};
use flashraid_format::superblock::{ArrayState, MemberState, Superblock};
use flashraid_format::{FormatError, NewArray, Uuid, new_array};
use flashraid_layout::Level;

fn uuid(a: u8, b: u8) -> Uuid {
    let mut bytes = [a; 16];
    bytes[15] = b;
    Uuid::from_random_bytes(bytes)
}

fn array(tag: u8, level: Level, members: usize, spares: usize) -> Vec<Superblock> {
    let new = NewArray {
        array_uuid: uuid(tag, 0),
        array_name: format!("array{tag}"),
        created_at_unix_seconds: 0,
        level,
        chunk_bytes: 16384,
        member_uuids: (0..members).map(|i| uuid(tag, 1 + i as u8)).collect(),
        member_sizes_bytes: vec![32 << 20; members],
        spare_uuids: (0..spares).map(|i| uuid(tag, 100 + i as u8)).collect(),
        spare_sizes_bytes: vec![32 << 20; spares],
        bitmap_region_bytes: None,
        shards: 1,
        member_data_bytes_max: None,
        tunables: Default::default(),
    };
    new_array(&new).unwrap().1
}

fn candidate(name: &str, sb: &Superblock) -> Candidate {
    Candidate { name: name.to_string(), copies: [Ok(sb.clone()), Ok(sb.clone())] }
}

fn request(strict: StrictDevices) -> AssemblyRequest {
    AssemblyRequest {
        array_uuid: None,
        array_name: None,
        strict,
        dirty_degraded: DirtyDegraded::Refuse,
        stale: StaleMembers::LeaveOut,
    }
}

fn clean(mut sbs: Vec<Superblock>) -> Vec<Superblock> {
    for sb in &mut sbs {
        sb.state = ArrayState::Clean;
    }
    sbs
}

/// Mark role `role` failed at `event` in every superblock given (the survivors' view).
fn fail(sbs: &mut [Superblock], role: usize, event: u64) {
    for sb in sbs.iter_mut() {
        sb.event = event;
        sb.members[role].state = MemberState::Failed;
        sb.members[role].failed_at_event = event;
    }
}

fn ok(result: Result<Assembled, AssemblyError>) -> Assembled {
    result.unwrap_or_else(|e| panic!("expected assembly, got: {e}"))
}

#[test]
fn a_healthy_array_assembles_in_any_device_order() {
    let sbs = clean(array(1, Level::Raid6, 6, 1));
    let mut candidates: Vec<Candidate> =
        sbs.iter().enumerate().map(|(i, sb)| candidate(&format!("d{i}"), sb)).collect();
    candidates.reverse();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    for role in 0..6 {
        let device = a.roles[role].unwrap();
        assert_eq!(candidates[device].name, format!("d{role}"));
    }
    assert_eq!(a.spares.len(), 1);
    assert!(!a.is_degraded() && !a.dirty);
}

#[test]
fn a_torn_copy_falls_back_to_the_other() {
    let sbs = clean(array(2, Level::Raid5, 4, 0));
    let mut candidates: Vec<Candidate> =
        sbs.iter().enumerate().map(|(i, sb)| candidate(&format!("d{i}"), sb)).collect();
    candidates[1].copies[0] = Err(FormatError::Checksum { stored: 1, computed: 2 });
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.roles[1], Some(1));
    // Both copies torn: that device is not a member, and a strict list refuses it.
    candidates[1].copies[1] = Err(FormatError::NoMagic);
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::NotAMember { ref device, .. } if device == "d1"), "{e}");
    // Scanning, it is skipped and the array starts degraded.
    let a = ok(assemble(&candidates, &request(StrictDevices::Scan)));
    assert_eq!(a.missing_roles, vec![1]);
}

#[test]
fn the_newest_copy_of_a_device_wins() {
    let sbs = clean(array(3, Level::Raid6, 5, 0));
    let mut newer = sbs.clone();
    fail(&mut newer, 4, 2);
    let candidates: Vec<Candidate> = (0..4)
        .map(|i| Candidate {
            name: format!("d{i}"),
            // Copy 1 still holds event 1 (the update was interrupted between copies).
            copies: [Ok(newer[i].clone()), Ok(sbs[i].clone())],
        })
        .collect();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.superblock.event, 2);
    assert_eq!(a.failed_roles, vec![4]);
}

#[test]
fn a_stale_member_is_left_out_and_said_so() {
    let old = clean(array(4, Level::Raid6, 6, 0));
    let mut new = old.clone();
    fail(&mut new, 2, 7);
    // Member 2 comes back with its old superblock that still says everything is fine.
    let mut candidates: Vec<Candidate> =
        (0..6).filter(|&i| i != 2).map(|i| candidate(&format!("d{i}"), &new[i])).collect();
    candidates.push(candidate("stale", &old[2]));
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.roles[2], None);
    assert_eq!(a.failed_roles, vec![2]);
    assert!(a.left_out.iter().any(|(d, why)| d == "stale" && why.contains("failed at event 7")));
}

/// Set every superblock given to `event`, `updates` write passes, and the last start's
/// writes beginning after pass `session`.
fn at(sbs: &mut [Superblock], event: u64, updates: u64, session: u64) {
    for sb in sbs.iter_mut() {
        sb.event = event;
        sb.update_count = updates;
        sb.session_update_count = session;
    }
}

#[test]
fn a_member_behind_on_metadata_only_is_used() {
    let mut old = clean(array(5, Level::Raid6, 6, 0));
    at(&mut old, 4, 7, 6);
    let mut new = old.clone();
    // One pass that failed member 5 (and bumped the event by several, as a pass may):
    // member 4 missed it (a crash during the pass), but the newest view lists it as active.
    fail(&mut new, 5, 9);
    at(&mut new, 9, 8, 6);
    let candidates: Vec<Candidate> = (0..5)
        .map(|i| candidate(&format!("d{i}"), if i == 4 { &old[i] } else { &new[i] }))
        .collect();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.roles[4], Some(4));
    assert_eq!(a.behind, vec!["d4".to_string()]);
    assert!(a.left_out.is_empty() && a.stale_used.is_empty());
    // Superblocks from before the update count (all zero) are never judged by it.
    let mut legacy_old = old.clone();
    let mut legacy_new = new.clone();
    at(&mut legacy_old, 1, 0, 0);
    at(&mut legacy_new, 9, 0, 0);
    let candidates: Vec<Candidate> = (0..5)
        .map(|i| candidate(&format!("d{i}"), if i == 4 { &legacy_old[i] } else { &legacy_new[i] }))
        .collect();
    assert_eq!(ok(assemble(&candidates, &request(StrictDevices::Strict))).roles[4], Some(4));
}

/// The gap this rule closes: a member's old image (a disk swapped for an older copy while
/// the array was stopped) still says "active" and was used as current, so reads of its
/// chunks returned data from before the last session's writes.
#[test]
fn a_stale_copy_of_a_member_is_left_out_and_its_role_rebuilt() {
    let mut before = clean(array(13, Level::Raid6, 6, 0));
    at(&mut before, 5, 4, 3);
    // A session ran since: two passes at its start (its writes after pass 6), one at its
    // clean stop.
    let mut now = before.clone();
    at(&mut now, 8, 7, 6);
    let mut candidates: Vec<Candidate> =
        (0..6).filter(|&i| i != 2).map(|i| candidate(&format!("d{i}"), &now[i])).collect();
    candidates.push(candidate("old-image", &before[2]));
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.roles[2], None, "the stale copy is never read");
    assert_eq!(a.missing_roles, vec![2]);
    let (name, why) = &a.left_out[0];
    assert_eq!(name, "old-image");
    assert!(why.contains("stale copy of role 2") && why.contains("update 4"), "{why}");
    // Given with the current device of its role, the copy is left out, not a duplicate.
    candidates.push(candidate("d2", &now[2]));
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(candidates[a.roles[2].unwrap()].name, "d2");
    assert_eq!(a.left_out.len(), 1);
    // One pass short of the session's is a crash during the start's second pass, not a
    // stale copy.
    at(&mut before, 6, 5, 3);
    candidates[5] = candidate("old-image", &before[2]);
    candidates.pop();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(candidates[a.roles[2].unwrap()].name, "old-image");
}

#[test]
fn an_array_that_needs_a_stale_copy_is_refused_unless_forced() {
    let mut before = clean(array(14, Level::Raid5, 4, 0));
    at(&mut before, 3, 2, 1);
    let mut now = before.clone();
    at(&mut now, 6, 5, 4);
    // Role 3 is missing too: without the copy of role 1, a RAID 5 lacks two members.
    let candidates =
        vec![candidate("d0", &now[0]), candidate("old-d1", &before[1]), candidate("d2", &now[2])];
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::StaleMembersNeeded { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("old-d1 (role 1)") && text.contains("--force"), "{text}");
    let mut forced = request(StrictDevices::Strict);
    forced.stale = StaleMembers::UseIfNeeded;
    forced.dirty_degraded = DirtyDegraded::Force;
    let a = ok(assemble(&candidates, &forced));
    assert_eq!(a.roles[1], Some(1));
    assert_eq!(a.stale_used, vec!["old-d1".to_string()]);
    assert!(a.dirty, "every region is resynced after a stale copy is used");
    // Forced, but not needed: still left out.
    let all = vec![
        candidate("d0", &now[0]),
        candidate("old-d1", &before[1]),
        candidate("d2", &now[2]),
        candidate("d3", &now[3]),
    ];
    let a = ok(assemble(&all, &forced));
    assert!(a.roles[1].is_none() && a.stale_used.is_empty() && !a.dirty);
}

#[test]
fn foreign_devices_are_refused_when_named_and_skipped_when_scanning() {
    let ours = clean(array(6, Level::Raid5, 3, 0));
    let theirs = clean(array(7, Level::Raid5, 3, 0));
    let mut candidates: Vec<Candidate> =
        ours.iter().enumerate().map(|(i, sb)| candidate(&format!("d{i}"), sb)).collect();
    candidates.push(candidate("theirs", &theirs[0]));
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::SeveralArrays { .. }), "{e}");
    let mut named = request(StrictDevices::Strict);
    named.array_name = Some("array6".into());
    let e = assemble(&candidates, &named).unwrap_err();
    assert!(
        matches!(e, AssemblyError::ForeignDevice { ref device, .. } if device == "theirs"),
        "{e}"
    );
    let mut scan = request(StrictDevices::Scan);
    scan.array_uuid = Some(ours[0].array_uuid);
    let a = ok(assemble(&candidates, &scan));
    assert!(a.left_out.iter().any(|(d, _)| d == "theirs"));
    let mut missing = request(StrictDevices::Scan);
    missing.array_name = Some("nope".into());
    assert!(matches!(assemble(&candidates, &missing), Err(AssemblyError::ArrayNotFound { .. })));
}

#[test]
fn two_devices_claiming_one_role_are_refused() {
    let sbs = clean(array(8, Level::Raid1, 2, 0));
    let candidates =
        vec![candidate("a", &sbs[0]), candidate("b", &sbs[1]), candidate("copy-of-a", &sbs[0])];
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::DuplicateRole { role: 0, .. }), "{e}");
    assert!(e.to_string().contains("copy-of-a"));
}

/// Fuzz regression (assembly target): a copied spare was used twice, as two spares with one
/// identity.
#[test]
fn two_devices_claiming_one_spare_are_refused() {
    let sbs = clean(array(9, Level::Raid5, 3, 1));
    assert_eq!(sbs.len(), 4);
    let candidates = vec![
        candidate("a", &sbs[0]),
        candidate("b", &sbs[1]),
        candidate("c", &sbs[2]),
        candidate("spare", &sbs[3]),
        candidate("copy-of-spare", &sbs[3]),
    ];
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::DuplicateSpare { .. }), "{e}");
    assert!(e.to_string().contains("copy-of-spare"));
}

#[test]
fn too_many_missing_members_stop_assembly() {
    let sbs = clean(array(9, Level::Raid6, 6, 0));
    let candidates: Vec<Candidate> = (0..3).map(|i| candidate(&format!("d{i}"), &sbs[i])).collect();
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AssemblyError::TooManyMissing { unavailable: 3, tolerance: 2, .. }), "{e}");
    assert!(text.contains("raid6 survives 2"), "{text}");
    // raid10 survives two failures in different pairs but not both of one pair.
    let sbs = clean(array(10, Level::Raid10, 4, 0));
    let other_pairs = vec![candidate("a", &sbs[0]), candidate("d", &sbs[3])];
    ok(assemble(&other_pairs, &request(StrictDevices::Strict)));
    let same_pair = vec![candidate("c", &sbs[2]), candidate("d", &sbs[3])];
    assert!(assemble(&same_pair, &request(StrictDevices::Strict)).is_err());
}

#[test]
fn dirty_and_degraded_needs_force() {
    let sbs = array(11, Level::Raid5, 4, 0); // dirty, as created
    let candidates: Vec<Candidate> = (0..3).map(|i| candidate(&format!("d{i}"), &sbs[i])).collect();
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::DirtyDegraded { .. }), "{e}");
    assert!(e.to_string().contains("parity that disagrees with their data"), "{e}");
    // Mirrors have no parity: the refusal says so in their words (found by a misuse test).
    let mirrors = array(13, Level::Raid1, 3, 0);
    let two: Vec<Candidate> = (0..2).map(|i| candidate(&format!("r{i}"), &mirrors[i])).collect();
    let e = assemble(&two, &request(StrictDevices::Strict)).unwrap_err().to_string();
    assert!(e.contains("mirror copies that disagree") && !e.contains("parity"), "{e}");
    let mut forced = request(StrictDevices::Strict);
    forced.dirty_degraded = DirtyDegraded::Force;
    let a = ok(assemble(&candidates, &forced));
    assert!(a.dirty && a.is_degraded());
    // Dirty but complete is fine: the bitmap says what to resync.
    let all: Vec<Candidate> = (0..4).map(|i| candidate(&format!("d{i}"), &sbs[i])).collect();
    assert!(ok(assemble(&all, &request(StrictDevices::Strict))).dirty);
}

#[test]
fn disagreeing_superblocks_at_one_event_are_refused() {
    let sbs = clean(array(12, Level::Raid5, 3, 0));
    let mut forked = sbs.clone();
    forked[1].members[2].state = MemberState::Failed;
    let candidates =
        vec![candidate("a", &sbs[0]), candidate("b", &forked[1]), candidate("c", &sbs[2])];
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    assert!(matches!(e, AssemblyError::InconsistentNewest { .. }), "{e}");
}

/// Review finding: the array pairs its i-th spare device with the table's i-th spare entry.
/// Spares given in another order than the table's, or one of them absent, mispaired them: a
/// superblock write then stamped one spare's identity on the other, and the next assembly
/// found two devices claiming one spare. Assembly gives the spares in table order and cuts
/// the table to the present ones.
#[test]
fn spares_come_in_table_order_and_the_table_keeps_the_present_ones() {
    let sbs = clean(array(3, Level::Raid6, 4, 3));
    // Spares (table slots 4, 5, 6) given in reverse, and slot 5's spare absent.
    let candidates: Vec<Candidate> =
        [6usize, 4, 0, 1, 2, 3].iter().map(|&i| candidate(&format!("d{i}"), &sbs[i])).collect();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    let names: Vec<&str> = a.spares.iter().map(|&i| candidates[i].name.as_str()).collect();
    assert_eq!(names, ["d4", "d6"], "table order");
    let uuids: Vec<_> = a.superblock.spares.iter().map(|e| e.uuid).collect();
    assert_eq!(uuids, [sbs[4].this_uuid, sbs[6].this_uuid], "the present spares, paired");
    a.superblock.validate().unwrap();
}

/// Review finding: a spare absent at one start leaves the table; when it comes back and is
/// named with the rest, the array still assembles (without it, said so), rather than refusing
/// the whole array for a device that holds none of its data.
#[test]
fn a_spare_that_was_absent_at_the_last_start_is_left_out_not_refused() {
    let sbs = clean(array(4, Level::Raid6, 4, 1));
    // The start without the spare: the survivors' table has no spare now, one event on.
    let mut later: Vec<Superblock> = sbs[..4].to_vec();
    for sb in &mut later {
        sb.spares.clear();
        sb.event += 1;
    }
    let mut candidates: Vec<Candidate> =
        later.iter().enumerate().map(|(i, sb)| candidate(&format!("d{i}"), sb)).collect();
    candidates.push(candidate("old-spare", &sbs[4]));
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert!(a.spares.is_empty() && a.roles.iter().all(Option::is_some));
    let (name, why) = &a.left_out[0];
    assert_eq!(name, "old-spare");
    assert!(why.contains("spare add"), "{why}");
}

/// Issue 5 finding: members failed past the tolerance left an array no start could bring
/// back, though the last member to fail held its data. Forced, that member's device is
/// brought back (the most recently failed first, only as many as needed).
#[test]
fn members_failed_past_the_tolerance_come_back_only_when_forced() {
    let mut before = clean(array(15, Level::Raid6, 5, 0));
    at(&mut before, 3, 2, 2);
    for sb in &mut before {
        // The missed-write map is kept from the last start with every role in service.
        sb.missed_map_since_event = 3;
    }
    // Roles 0, 1 and 2 fail in turn, at events 4, 5 and 6; each device kept its superblock
    // from before its own failure.
    let mut view = before.clone();
    let mut own = vec![];
    for (role, event) in [(0, 4), (1, 5), (2, 6)] {
        own.push(view[role].clone());
        fail(&mut view, role, event);
        for sb in &mut view {
            sb.members[role].in_sync_when_failed = true;
            sb.update_count += 1;
        }
    }
    let mut candidates: Vec<Candidate> =
        (0..3).map(|r| candidate(&format!("d{r}"), &own[r])).collect();
    candidates.push(candidate("d3", &view[3]));
    candidates.push(candidate("d4", &view[4]));
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AssemblyError::TooManyMissing { .. }), "{text}");
    assert!(text.contains("--force brings back d2 (role 2, failed at event 6)"), "{text}");
    assert!(!text.contains("d1 (role 1"), "only as many as needed: {text}");
    // As `--force` asks: the array comes back dirty (resynced) and degraded.
    let mut forced = request(StrictDevices::Strict);
    forced.stale = StaleMembers::UseIfNeeded;
    forced.dirty_degraded = DirtyDegraded::Force;
    let a = ok(assemble(&candidates, &forced));
    assert_eq!(a.failed_used, vec!["d2".to_string()]);
    assert_eq!(a.roles[2], Some(2));
    assert_eq!(a.failed_roles, vec![0, 1]);
    assert_eq!(a.superblock.members[2].state, MemberState::Active);
    assert!(a.dirty);
    // Its failure failed the array: it missed no write (the missed-write map is not distrusted).
    assert!(!a.revived_missed_writes);
    a.superblock.validate().unwrap();
    // An image of d2 older than the missed-write map's span is not what it held at its
    // failure (found by review): the member failed before it comes back instead.
    let mut older = own[2].clone();
    older.event = 2;
    let mut with_image = candidates.clone();
    with_image[2] = candidate("old-d2", &older);
    let a = ok(assemble(&with_image, &forced));
    assert_eq!(a.failed_used, vec!["d1".to_string()]);
    // The array survived d1's failure (roles 0 and 1 out): it missed the writes made since.
    assert!(a.revived_missed_writes);
    // A member that was being rebuilt when it failed holds only part of its chunks: never
    // brought back. The one failed before it is, and it missed the writes made between the
    // two failures (the array survived its failure).
    for copy in candidates[2].copies.iter_mut() {
        copy.as_mut().unwrap().members[2].state = MemberState::Rebuilding;
    }
    let a = ok(assemble(&candidates, &forced));
    assert_eq!(a.failed_used, vec!["d1".to_string()]);
    assert!(a.revived_missed_writes);
    // Within the tolerance (roles 0 and 1 failed) nothing failed comes back, forced or not.
    let mut two_failed = before.clone();
    fail(&mut two_failed, 0, 4);
    fail(&mut two_failed, 1, 5);
    let within: Vec<Candidate> = (0..5)
        .map(|r| candidate(&format!("d{r}"), if r < 2 { &own[r] } else { &two_failed[r] }))
        .collect();
    let a = ok(assemble(&within, &forced));
    assert!(a.failed_used.is_empty() && a.roles[0].is_none() && a.roles[1].is_none());
    assert!(!a.revived_missed_writes);
}

/// Starts cut short, one after another, leave one member passes ahead of the rest; none
/// recorded a session, so none of the rest is a stale copy (found by review: with the
/// newest pass as the yardstick, two cuts in a row failed every other member).
#[test]
fn members_behind_only_starts_that_never_wrote_are_current() {
    let mut sbs = clean(array(16, Level::Raid5, 4, 0));
    at(&mut sbs, 10, 9, 7);
    let mut ahead = sbs[0].clone();
    ahead.event = 12;
    ahead.update_count = 11;
    let mut candidates: Vec<Candidate> =
        (1..4).map(|i| candidate(&format!("d{i}"), &sbs[i])).collect();
    candidates.push(candidate("d0", &ahead));
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert!(a.left_out.is_empty() && a.roles.iter().all(Option::is_some), "{:?}", a.left_out);
}

fn forced() -> AssemblyRequest {
    let mut r = request(StrictDevices::Strict);
    r.dirty_degraded = DirtyDegraded::Force;
    r.stale = StaleMembers::UseIfNeeded;
    r
}

/// Review finding: forced, every stale copy was placed when any was needed. On RAID 10 a
/// stale copy beside a current mirror was then resync's reference and copied over it.
#[test]
fn forced_raid10_does_not_place_a_stale_mirror_beside_a_current_one() {
    let mut before = clean(array(21, Level::Raid10, 4, 0));
    at(&mut before, 3, 2, 1);
    let mut now = before.clone();
    at(&mut now, 6, 5, 4);
    let candidates = vec![
        candidate("old-d1", &before[1]),
        candidate("old-d2", &before[2]),
        candidate("d3", &now[3]),
    ];
    let a = ok(assemble(&candidates, &forced()));
    assert_eq!(a.roles[1], Some(0), "the needed stale copy is used");
    assert_eq!(a.roles[2], None, "a stale copy beside a current mirror: {:?}", a.stale_used);
    assert!(a.left_out.iter().any(|(d, _)| d == "old-d2"));
}

/// Review finding: a stale copy of a role being rebuilt (unavailable either way; its image
/// holds less than the newest cursor says) was placed when another stale copy was needed.
#[test]
fn forced_assembly_does_not_place_a_stale_copy_of_a_rebuilding_role() {
    let mut before = clean(array(22, Level::Raid6, 6, 0));
    for sb in &mut before {
        sb.members[0].state = MemberState::Rebuilding;
        sb.rebuild_role = 0;
        sb.rebuild_cursor_stripes = 10;
    }
    at(&mut before, 3, 2, 1);
    let mut now = before.clone();
    for sb in &mut now {
        sb.rebuild_cursor_stripes = 500;
    }
    at(&mut now, 9, 8, 6);
    let candidates = vec![
        candidate("old-d0", &before[0]),
        candidate("old-d2", &before[2]),
        candidate("d3", &now[3]),
        candidate("d4", &now[4]),
        candidate("d5", &now[5]),
    ];
    let a = ok(assemble(&candidates, &forced()));
    assert_eq!(a.roles[2], Some(1), "the needed stale copy is used");
    assert_eq!(a.roles[0], None, "a stale copy of a rebuilding role: {:?}", a.stale_used);
}

/// With both a member failed past the tolerance and a stale copy at hand, either of which
/// would let the array start, the failed member is preferred: its chunks are as of the
/// array's failure, the copy's only as of an earlier session.
#[test]
fn a_member_failed_last_is_preferred_to_a_stale_copy() {
    let mut before = clean(array(17, Level::Raid5, 4, 0));
    at(&mut before, 3, 2, 1);
    let mut session = before.clone();
    at(&mut session, 6, 5, 4);
    for sb in &mut session {
        sb.missed_map_since_event = 6;
    }
    let own1 = session[1].clone();
    let mut now = session.clone();
    fail(&mut now, 1, 7);
    for sb in &mut now {
        sb.members[1].in_sync_when_failed = true;
        sb.update_count = 6;
    }
    let candidates = vec![
        candidate("d0", &now[0]),
        candidate("d1", &own1),
        candidate("old-d2", &before[2]),
        candidate("d3", &now[3]),
    ];
    let e = assemble(&candidates, &request(StrictDevices::Strict)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AssemblyError::TooManyMissing { .. }), "{text}");
    assert!(text.contains("--force brings back d1 (role 1"), "{text}");
    let a = ok(assemble(&candidates, &forced()));
    assert_eq!(a.failed_used, vec!["d1".to_string()]);
    assert!(a.stale_used.is_empty() && a.roles[2].is_none(), "{:?}", a.stale_used);
    assert!(a.left_out.iter().any(|(d, why)| d == "old-d2" && why.contains("stale copy")));
}
