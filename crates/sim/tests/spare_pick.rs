//! Which hot spare takes a failed role: the one `replace` named when it can, never a device
//! something else may still be writing (a replace's copier that was told to stop and has not
//! yet said it stopped), and none at all when that device is the only spare. And a spare
//! taken out (`spare remove`): the others keep their order and take over, the array
//! assembles without it, and it no longer claims the array once erased. The metadata is
//! driven directly, on simulated members, so each case is exact.

use flashraid_control::{
    ControlError, Init, MetaDevice, Metadata, Overwrite, erase_superblocks, prepare,
    read_candidate, start,
};
use flashraid_engine::{ArrayAccess, ShardConfig};
use flashraid_format::assembly::{AssemblyRequest, DirtyDegraded, StrictDevices};
use flashraid_format::{NewArray, Uuid};
use flashraid_layout::{Level, MemberIndex};
use flashraid_parity::Kernel;
use flashraid_sim::SimMember;

const MEMBERS: usize = 4;

/// A RAID 6 of four members and `spares` spares (devices 4, 5, ...), started.
fn started(devices: &[SimMember], spares: usize) -> Metadata {
    let all: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let uuid = |i: u8| Uuid::from_random_bytes([i + 1; 16]);
    let new = NewArray {
        array_uuid: uuid(100),
        array_name: "pick".to_string(),
        created_at_unix_seconds: 0,
        level: Level::Raid6,
        chunk_bytes: 4096,
        member_uuids: (0..MEMBERS as u8).map(uuid).collect(),
        member_sizes_bytes: vec![],
        spare_uuids: (0..spares as u8).map(|i| uuid(10 + i)).collect(),
        spare_sizes_bytes: vec![],
        bitmap_region_bytes: Some(1 << 20),
        shards: 1,
        member_data_bytes_max: None,
        tunables: Default::default(),
    };
    let (members, spare_devices) = all.split_at(MEMBERS);
    flashraid_control::create(&new, members, spare_devices, Overwrite::Refuse, Init::Zero).unwrap();
    let request = AssemblyRequest {
        array_uuid: None,
        array_name: None,
        strict: StrictDevices::Strict,
        dirty_degraded: DirtyDegraded::Refuse,
        stale: flashraid_format::assembly::StaleMembers::LeaveOut,
    };
    let prepared = prepare(&all, &request).unwrap();
    assert_eq!(prepared.assembled.spares.len(), spares);
    let (metadata, _) = start(
        &all,
        &prepared,
        1,
        ShardConfig::recommended(),
        Kernel::best(),
        ArrayAccess::ReadWrite,
    )
    .unwrap();
    metadata
}

fn devices(spares: usize) -> Vec<SimMember> {
    (0..MEMBERS + spares).map(|i| SimMember::new(&format!("d{i}"), 8 << 20)).collect()
}

/// Fail role 1 and offer it a spare as the controller would.
fn take(
    devices: &[SimMember],
    metadata: &mut Metadata,
    preferred: Option<usize>,
    busy: Option<usize>,
) -> Result<usize, ControlError> {
    let all: Vec<&dyn MetaDevice> = devices.iter().map(|d| d as &dyn MetaDevice).collect();
    let role = MemberIndex(1);
    if metadata.role_device(1).is_some() {
        metadata.fail_members(&all, &[role]).unwrap();
    }
    metadata.take_spare(&all, role, preferred, false, busy)
}

#[test]
fn the_named_spare_takes_over_when_it_is_free() {
    let d = devices(2);
    let mut m = started(&d, 2);
    assert_eq!(take(&d, &mut m, Some(5), None).unwrap(), 5);
    assert_eq!(m.role_device(1), Some(5));
    assert_eq!(m.spare_devices(), &[4]);
}

#[test]
fn a_busy_spare_is_passed_over_even_when_named() {
    let d = devices(2);
    let mut m = started(&d, 2);
    assert_eq!(take(&d, &mut m, Some(4), Some(4)).unwrap(), 5, "the free spare");
    assert_eq!(m.spare_devices(), &[4], "the busy one stays a spare");
}

#[test]
fn the_only_spare_busy_means_no_takeover_yet_then_it_takes_over() {
    let d = devices(1);
    let mut m = started(&d, 1);
    let e = take(&d, &mut m, Some(4), Some(4)).unwrap_err();
    assert!(e.to_string().contains("still being written"), "{e}");
    assert_eq!(m.role_device(1), None, "the role stays failed");
    assert_eq!(m.spare_devices(), &[4], "the spare is still listed");
    // The copier has stopped: the same spare is free now.
    assert_eq!(take(&d, &mut m, None, None).unwrap(), 4);
    assert_eq!(m.role_device(1), Some(4));
}

#[test]
fn a_removed_spare_leaves_the_table_and_the_others_keep_their_order() {
    let d = devices(3);
    let mut m = started(&d, 3);
    let all: Vec<&dyn MetaDevice> = d.iter().map(|x| x as &dyn MetaDevice).collect();
    // A replace's record goes with the entry it is on.
    m.set_replacing(&all, 5, Some(MemberIndex(2))).unwrap();
    assert_eq!(m.replacing(), Some((MemberIndex(2), 5)));
    let event = m.superblock().event;
    m.remove_spare(&all, 5).unwrap();
    assert_eq!(m.spare_devices(), &[4, 6]);
    assert_eq!(m.superblock().spares.len(), 2);
    assert_eq!(m.replacing(), None, "the removed spare's replace record is gone with it");
    assert!(m.superblock().event > event);
    // Not a spare (a member, or the one just removed): refused, nothing written.
    let event = m.superblock().event;
    for device in [0, 5] {
        let e = m.remove_spare(&all, device).unwrap_err();
        assert!(e.to_string().contains("is not a hot spare"), "{e}");
    }
    assert_eq!(m.superblock().event, event);

    let request = flashraid_format::assembly::AssemblyRequest {
        array_uuid: None,
        array_name: None,
        strict: StrictDevices::Strict,
        dirty_degraded: DirtyDegraded::Refuse,
        stale: flashraid_format::assembly::StaleMembers::LeaveOut,
    };
    // Its superblocks not erased yet (a crash right after the table was written): assembly
    // leaves it out, even when it is named, and never uses it.
    let prepared = prepare(&all, &request).unwrap();
    assert_eq!(prepared.assembled.spares, vec![4, 6]);
    assert!(prepared.assembled.left_out.iter().any(|(name, _)| name == "d5"), "{prepared:?}");
    // Erased, it claims nothing: `create` and `spare add` take it as a blank device.
    erase_superblocks(&d[5]).unwrap();
    assert!(read_candidate(&d[5]).copies.iter().all(Result::is_err));
    let without: Vec<&dyn MetaDevice> =
        all.iter().enumerate().filter(|&(i, _)| i != 5).map(|(_, x)| *x).collect();
    let prepared = prepare(&without, &request).unwrap();
    assert_eq!(prepared.assembled.spares.len(), 2, "{prepared:?}");

    // The first spare left takes the next failed role.
    assert_eq!(take(&d, &mut m, None, None).unwrap(), 4);
    assert_eq!(m.spare_devices(), &[6]);
}

/// An array failed past its tolerance keeps its spares: the members in service cannot
/// reconstruct a failed role, so a rebuild onto a spare would stall at its first stripe
/// (found by a misuse test: the spare took the last RAID 1 member's role). Once the array
/// survives again, the spare is wanted.
#[test]
fn no_spare_takes_a_role_while_the_array_is_failed_past_its_tolerance() {
    let d = devices(1);
    let mut m = started(&d, 1);
    let all: Vec<&dyn MetaDevice> = d.iter().map(|x| x as &dyn MetaDevice).collect();
    let roles = [MemberIndex(0), MemberIndex(1), MemberIndex(2)];
    m.fail_members(&all, &roles).unwrap();
    assert_eq!(m.spare_wanted(), None);
    assert_eq!(m.spare_held_back(), Some(vec![0, 1, 2]));
    let e = m.take_spare(&all, MemberIndex(0), None, false, None).unwrap_err();
    assert!(e.to_string().contains("nothing is left to rebuild role 0 from"), "{e}");
    assert_eq!(m.spare_devices(), &[4], "the spare stays a spare");
    assert_eq!(m.role_device(0), None);

    // Within the tolerance (two of RAID 6's four out), the spare is wanted and held back no
    // longer.
    let d = devices(1);
    let mut m = started(&d, 1);
    let all: Vec<&dyn MetaDevice> = d.iter().map(|x| x as &dyn MetaDevice).collect();
    m.fail_members(&all, &roles[..2]).unwrap();
    assert_eq!(m.spare_held_back(), None);
    assert_eq!(m.spare_wanted(), Some(MemberIndex(0)));
}
