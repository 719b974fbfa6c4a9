//! Which hot spare takes a failed role: the one `replace` named when it can, never a device
//! something else may still be writing (a replace's copier that was told to stop and has not
//! yet said it stopped), and none at all when that device is the only spare. The metadata
//! is driven directly, on simulated members, so each case is exact.

use flashraid_control::{ControlError, Init, MetaDevice, Metadata, Overwrite, prepare, start};
use flashraid_engine::ShardConfig;
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
    };
    let prepared = prepare(&all, &request).unwrap();
    let (metadata, _) =
        start(&all, &prepared, 1, ShardConfig::recommended(), Kernel::best()).unwrap();
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
