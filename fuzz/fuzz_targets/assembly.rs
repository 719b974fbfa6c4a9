//! `assembly::assemble` on 1..8 devices built from the input. Each device's two copies are
//! either a superblock of one of two real arrays (made with `new_array`), unchanged or with a
//! few fields changed (event, update counts, array state, a slot's state or UUID, which slot the copy belongs
//! to, array UUID and name, spares added or dropped), or decoded from bytes (the real image
//! with input-chosen bytes changed, or 4096 input bytes; the checksum fixed in both), or a
//! torn copy. Changed superblocks pass through `encode`/`decode` as the real ones would; those
//! that break a validation rule become a refused copy, since assembly only ever sees decoded
//! superblocks.
//!
//! Checks: `assemble` never panics, whatever the request; when it decides to start an array,
//! the decision is consistent: indices in range, no device used twice, every device placed,
//! left out or refused exactly once, no failed, empty or foreign device in a role, the newest
//! event wins, a stale copy (two or more passes short of the last start's) holds a role only
//! when forced and needed, a failed member's device is brought back only when forced and
//! needed, and the level survives what is missing.

#![no_main]

use flashraid_format::assembly::{
    Assembled, AssemblyRequest, Candidate, DirtyDegraded, StaleMembers, StrictDevices, assemble,
};
use flashraid_format::superblock::{
    ArrayState, MemberEntry, MemberState, SUPERBLOCK_BYTES, Superblock,
};
use flashraid_format::{FormatError, NewArray, Uuid, new_array};
use flashraid_layout::Level;
use libfuzzer_sys::arbitrary::{Arbitrary, Error, Result, Unstructured};
use libfuzzer_sys::fuzz_target;

const CANDIDATES_MAX: usize = 8;
const MUTATIONS_MAX: usize = 4;
const TAGS: [u8; 2] = [0xa0, 0xb0];
const CHUNKS_BYTES: [u64; 4] = [4096, 16384, 65536, 1 << 20];
const STATES: [MemberState; 5] = [
    MemberState::Empty,
    MemberState::Active,
    MemberState::Failed,
    MemberState::Spare,
    MemberState::Rebuilding,
];

/// One case: the devices and the request. Printed by `cargo fuzz fmt assembly <input>`, which
/// is what a regression test needs.
#[derive(Debug)]
struct Case {
    candidates: Vec<Candidate>,
    request: AssemblyRequest,
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let mut arrays = vec![];
        for tag in TAGS {
            arrays.push(build_array(u, tag)?.ok_or(Error::IncorrectFormat)?);
        }
        let count = u.int_in_range(1..=CANDIDATES_MAX)?;
        let mut candidates = Vec::with_capacity(count);
        for i in 0..count {
            let array = &arrays[u.choose_index(arrays.len())?];
            let device = &array[u.choose_index(array.len())?];
            let copies = [build_copy(u, device)?, build_copy(u, device)?];
            candidates.push(Candidate { name: format!("d{i}"), copies });
        }
        let request = AssemblyRequest {
            array_uuid: match u.int_in_range(0..=3)? {
                0 | 1 => None,
                2 => Some(array_uuid(TAGS[u.choose_index(TAGS.len())?])),
                _ => Some(Uuid(u.arbitrary()?)),
            },
            array_name: match u.int_in_range(0..=3)? {
                0 | 1 => None,
                2 => Some(array_name(TAGS[u.choose_index(TAGS.len())?])),
                _ => Some(String::new()),
            },
            strict: if u.arbitrary()? { StrictDevices::Strict } else { StrictDevices::Scan },
            dirty_degraded: if u.arbitrary()? {
                DirtyDegraded::Force
            } else {
                DirtyDegraded::Refuse
            },
            stale: if u.arbitrary()? {
                StaleMembers::UseIfNeeded
            } else {
                StaleMembers::LeaveOut
            },
        };
        Ok(Case { candidates, request })
    }
}

fuzz_target!(|case: Case| {
    if let Ok(assembled) = assemble(&case.candidates, &case.request) {
        check_decision(&case.candidates, &case.request, &assembled);
    }
});

fn array_uuid(tag: u8) -> Uuid {
    Uuid::from_random_bytes([tag; 16])
}

fn array_name(tag: u8) -> String {
    format!("array{tag:x}")
}

/// A device UUID: `tag` picks the array, `index` the device.
fn device_uuid(tag: u8, index: u8) -> Uuid {
    let mut bytes = [tag.wrapping_add(1); 16];
    bytes[15] = index;
    Uuid::from_random_bytes(bytes)
}

/// Every superblock of a new array whose shape comes from the input (`None`: not a valid one).
fn build_array(u: &mut Unstructured, tag: u8) -> Result<Option<Vec<Superblock>>> {
    let level = *u.choose(&Level::ALL)?;
    let members = u.int_in_range(level.members_min()..=level.members_min() + 4)?;
    let spares = u.int_in_range(0..=2)?;
    let new = NewArray {
        array_uuid: array_uuid(tag),
        array_name: array_name(tag),
        created_at_unix_seconds: 0,
        level,
        chunk_bytes: *u.choose(&CHUNKS_BYTES)?,
        member_uuids: (0..members).map(|i| device_uuid(tag, index(i))).collect(),
        member_sizes_bytes: vec![32 << 20; members],
        spare_uuids: (0..spares).map(|i| device_uuid(tag, 100 + index(i))).collect(),
        spare_sizes_bytes: vec![32 << 20; spares],
        bitmap_region_bytes: None,
        shards: 1,
        member_data_bytes_max: None,
        tunables: Default::default(),
    };
    Ok(new_array(&new).ok().map(|(_, superblocks)| superblocks))
}

fn index(i: usize) -> u8 {
    u8::try_from(i).expect("few devices")
}

/// One copy of `device`'s superblock, as a device would return it after decoding.
fn build_copy(
    u: &mut Unstructured,
    device: &Superblock,
) -> Result<Result<Superblock, FormatError>> {
    Ok(match u.int_in_range(0..=5)? {
        0 | 1 => Ok(device.clone()),
        2 => {
            let mut sb = device.clone();
            for _ in 0..u.int_in_range(1..=MUTATIONS_MAX)? {
                mutate(u, &mut sb)?;
            }
            if sb.validate().is_err() {
                return Ok(Err(FormatError::Invalid {
                    what: "mutated into an invalid superblock",
                }));
            }
            let decoded = Superblock::decode(&sb.encode());
            assert_eq!(decoded.as_ref(), Ok(&sb), "a valid superblock does not round-trip");
            decoded
        }
        3 => {
            // Flip input-chosen bytes of the real image and fix the checksum: the decoder
            // decides what survives.
            let mut image = device.encode();
            for _ in 0..u.int_in_range(1..=MUTATIONS_MAX)? {
                let at = u.int_in_range(0..=SUPERBLOCK_BYTES - 5)?;
                image[at] ^= u.int_in_range(1..=u8::MAX)?;
            }
            decode_with_checksum(image)
        }
        4 => {
            let mut image = [0u8; SUPERBLOCK_BYTES];
            let bytes = u.bytes(u.len().min(SUPERBLOCK_BYTES))?;
            image[..bytes.len()].copy_from_slice(bytes);
            decode_with_checksum(image)
        }
        _ => Err(FormatError::Checksum { stored: 0, computed: 1 }),
    })
}

fn decode_with_checksum(mut image: [u8; SUPERBLOCK_BYTES]) -> Result<Superblock, FormatError> {
    let crc = crc32c::crc32c(&image[..SUPERBLOCK_BYTES - 4]);
    image[SUPERBLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    Superblock::decode(&image)
}

fn mutate(u: &mut Unstructured, sb: &mut Superblock) -> Result<()> {
    let slots = sb.members.len() + sb.spares.len();
    match u.int_in_range(0..=11)? {
        0 => sb.event = u64::from(u.int_in_range(0..=4u8)?),
        10 => sb.update_count = u64::from(u.int_in_range(0..=4u8)?),
        11 => sb.session_update_count = u64::from(u.int_in_range(0..=4u8)?),
        1 => sb.event = u.arbitrary()?,
        2 => sb.state = if u.arbitrary()? { ArrayState::Clean } else { ArrayState::Dirty },
        3 => {
            let entry = slot_mut(sb, u.choose_index(slots)?);
            entry.state = *u.choose(&STATES)?;
            entry.failed_at_event = u64::from(u.int_in_range(0..=4u8)?);
        }
        4 => {
            // This copy now belongs to another slot's device.
            let slot = u.choose_index(slots)?;
            sb.this_role = u16::try_from(slot).expect("at most 64 slots");
            sb.this_uuid = sb.slot(slot).uuid;
        }
        5 => sb.this_role = u.arbitrary()?,
        6 => {
            let tag = TAGS[u.choose_index(TAGS.len())?];
            let uuid = device_uuid(tag, u.int_in_range(0..=101)?);
            slot_mut(sb, u.choose_index(slots)?).uuid = uuid;
        }
        7 => sb.array_uuid = array_uuid(TAGS[u.choose_index(TAGS.len())?]),
        8 => sb.array_name = array_name(TAGS[u.choose_index(TAGS.len())?]),
        _ => {
            if u.arbitrary()? {
                sb.spares.pop();
            } else {
                let tag = TAGS[u.choose_index(TAGS.len())?];
                let uuid = device_uuid(tag, u.int_in_range(0..=101)?);
                sb.spares.push(MemberEntry {
                    uuid,
                    state: MemberState::Spare,
                    ..MemberEntry::EMPTY
                });
            }
        }
    }
    Ok(())
}

fn slot_mut(sb: &mut Superblock, slot: usize) -> &mut MemberEntry {
    let roles = sb.members.len();
    if slot < roles { &mut sb.members[slot] } else { &mut sb.spares[slot - roles] }
}

/// The copy `assemble` treats as the device's: the valid one with the highest event, then
/// update count (the later copy on a tie, as `Iterator::max_by_key`).
fn newest_copy(candidate: &Candidate) -> Option<&Superblock> {
    candidate
        .copies
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .max_by_key(|sb| (sb.event, sb.update_count))
}

fn check_decision(candidates: &[Candidate], request: &AssemblyRequest, a: &Assembled) {
    let sb = &a.superblock;
    let role_count = usize::from(sb.member_count);
    assert_eq!(a.geometry, sb.geometry());
    assert_eq!(a.roles.len(), role_count);
    assert!(request.array_uuid.is_none_or(|uuid| uuid == sb.array_uuid), "wrong array");
    // The name picks the array when any of its devices carries it (not necessarily the newest
    // view: the name is matched per device, like the UUID).
    let named = |name: &String| {
        candidates
            .iter()
            .filter_map(newest_copy)
            .any(|own| own.array_uuid == sb.array_uuid && own.array_name == *name)
    };
    assert!(request.array_name.as_ref().is_none_or(named), "no device has the requested name");

    // Each device is used at most once, and each used device really holds what it is used as.
    let mut used = vec![false; candidates.len()];
    let placed = a.roles.iter().enumerate().filter_map(|(role, c)| c.map(|c| (Some(role), c)));
    for (role, c) in placed.chain(a.spares.iter().map(|&c| (None, c))) {
        assert!(c < candidates.len(), "candidate index {c} out of range");
        assert!(!used[c], "device {c} used twice: roles {:?}, spares {:?}", a.roles, a.spares);
        used[c] = true;
        let own = newest_copy(&candidates[c]).expect("a used device has a valid copy");
        assert_eq!(own.array_uuid, sb.array_uuid, "device {c} of another array is used");
        assert!(own.event <= sb.event, "device {c} is newer than the newest view");
        let entry = match role {
            Some(role) => &sb.members[role],
            None => sb.spares.iter().find(|e| e.uuid == own.this_uuid).expect("a listed spare"),
        };
        assert_eq!(entry.uuid, own.this_uuid, "device {c} is not the member of its slot");
        let expected: &[MemberState] = match role {
            Some(_) => &[MemberState::Active, MemberState::Rebuilding],
            None => &[MemberState::Spare],
        };
        assert!(expected.contains(&entry.state), "device {c} used in a {:?} slot", entry.state);
        let revived = a.failed_used.contains(&candidates[c].name);
        assert!(!revived || role.is_some(), "device {c} brought back, but not to a role");
        assert!(!revived || request.stale == StaleMembers::UseIfNeeded, "brought back unforced");
        assert!(!revived || own.members[role.expect("checked")].state == MemberState::Active);
        let stale = role.is_some()
            && !revived
            && own.update_count.saturating_add(1) < sb.session_update_count;
        assert!(
            !stale || sb.members[role.expect("checked")].state != MemberState::Rebuilding,
            "a stale copy of a role being rebuilt is used"
        );
        let listed = a.stale_used.contains(&candidates[c].name);
        assert_eq!(stale, listed, "device {c}: a stale copy used unsaid, or said and not one");
        assert!(!stale || request.stale == StaleMembers::UseIfNeeded, "stale copy used unforced");
    }
    // Stale copies and failed members brought back are each needed: without any one of them
    // the array could not start (a role being rebuilt counts as unavailable: it holds only
    // part of its chunks).
    for forced_in in a.stale_used.iter().chain(&a.failed_used) {
        let without: Vec<bool> = (0..role_count)
            .map(|r| {
                sb.members[r].state == MemberState::Rebuilding
                    || a.roles[r].is_none_or(|c| candidates[c].name == *forced_in)
            })
            .collect();
        assert!(!a.geometry.survives(&without), "{forced_in} used though not needed");
    }
    // Two devices claiming one spare slot would be two devices with one identity.
    for (n, &c) in a.spares.iter().enumerate() {
        let uuid = newest_copy(&candidates[c]).expect("checked").this_uuid;
        for &other in &a.spares[..n] {
            let other_uuid = newest_copy(&candidates[other]).expect("checked").this_uuid;
            assert_ne!(uuid, other_uuid, "devices {other} and {c} both claim spare {uuid}");
        }
    }
    // Every device is accounted for exactly once: used, or left out with a reason.
    for (c, candidate) in candidates.iter().enumerate() {
        let left_out = a.left_out.iter().filter(|(name, _)| *name == candidate.name).count();
        assert_eq!(usize::from(used[c]) + left_out, 1, "device {c} placed {} times", left_out);
        if request.strict == StrictDevices::Strict {
            let own = newest_copy(candidate).expect("strict: every device has a valid copy");
            assert_eq!(own.array_uuid, sb.array_uuid, "strict: a foreign device was skipped");
        }
        let own_event = newest_copy(candidate).filter(|own| own.array_uuid == sb.array_uuid);
        assert!(own_event.is_none_or(|own| own.event <= sb.event), "newest view is not newest");
        let behind = a.behind.contains(&candidate.name);
        let is_behind = own_event.is_some_and(|own| own.event < sb.event);
        assert!(!behind || (used[c] && is_behind), "device {c} wrongly reported behind");
        let stale_used = a.stale_used.contains(&candidate.name);
        assert!(
            !(used[c] && is_behind) || behind || stale_used,
            "device {c} behind but not reported"
        );
    }

    // Failed, missing and the level's tolerance.
    let failed: Vec<usize> =
        (0..role_count).filter(|&r| sb.members[r].state == MemberState::Failed).collect();
    assert_eq!(a.failed_roles, failed);
    let missing: Vec<usize> =
        (0..role_count).filter(|&r| a.roles[r].is_none() && !failed.contains(&r)).collect();
    assert_eq!(a.missing_roles, missing);
    let unavailable: Vec<bool> = a.roles.iter().map(Option::is_none).collect();
    assert!(a.geometry.survives(&unavailable), "started without enough members");
    let forced = !a.stale_used.is_empty() || !a.failed_used.is_empty();
    assert_eq!(a.dirty, sb.state == ArrayState::Dirty || forced);
    if a.dirty && a.is_degraded() && a.geometry.tolerance() > 0 {
        assert_eq!(request.dirty_degraded, DirtyDegraded::Force, "dirty and degraded, unforced");
    }
}
