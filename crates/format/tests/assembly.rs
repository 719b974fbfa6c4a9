//! Assembly decisions: the newest view wins, stale and foreign devices are refused or left
//! out, duplicate roles and too many missing members stop assembly, dirty and degraded needs
//! force.

use flashraid_format::assembly::{
    Assembled, AssemblyError, AssemblyRequest, Candidate, DirtyDegraded, StrictDevices, assemble,
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

#[test]
fn a_member_behind_on_metadata_only_is_used() {
    let old = clean(array(5, Level::Raid6, 6, 0));
    let mut new = old.clone();
    fail(&mut new, 5, 3);
    // Member 4 missed the event-3 update but the newest view lists it as active.
    let candidates: Vec<Candidate> = (0..5)
        .map(|i| candidate(&format!("d{i}"), if i == 4 { &old[i] } else { &new[i] }))
        .collect();
    let a = ok(assemble(&candidates, &request(StrictDevices::Strict)));
    assert_eq!(a.roles[4], Some(4));
    assert_eq!(a.behind, vec!["d4".to_string()]);
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
