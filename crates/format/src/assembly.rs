//! Assembly: from the superblocks found on a set of devices, decide which array they form,
//! which device holds which role, and whether it is safe to start. Pure: the caller reads the
//! superblocks and acts on the decision.
//!
//! Rules, in order (each refusal names the devices involved):
//! 1. Per device, the valid copy with the highest event wins; a device with no valid copy is
//!    not a member (refused when the device list is strict, ignored when scanning).
//! 2. Devices of other arrays: refused when strict, ignored when scanning; devices of several
//!    arrays with none requested: refused.
//! 3. The newest view is the superblock with the highest event. Every device at that event
//!    must agree on the member table.
//! 4. A device whose member the newest view marks failed, or does not list, is stale: it is
//!    left out with a message and never read (its data missed writes).
//! 5. Two devices claiming one role: refused.
//! 6. Members missing or failed beyond what the level survives: refused.
//! 7. A dirty array that is also degraded: refused unless forced, because stripes that were
//!    being written at the crash may have parity that disagrees with their data (the RAID 5/6
//!    write hole) and the missing member's chunks of those stripes cannot be trusted.
//!
//! A device whose own superblock is older than the newest view but whose member the newest
//! view lists as active is used: degraded writes only ever skip members the metadata already
//! marks failed, so such a member missed a metadata update, not data. Its superblock is
//! rewritten at the next update.

use crate::superblock::{ArrayState, MemberState, Superblock};
use crate::{FormatError, Uuid};
use flashraid_layout::{Geometry, Level};

/// What was read from one device: both superblock copies.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// A name for messages (usually the path).
    pub name: String,
    pub copies: [Result<Superblock, FormatError>; 2],
}

/// What the caller wants assembled.
#[derive(Clone, Debug)]
pub struct AssemblyRequest {
    /// Only this array (by UUID); `None` accepts the single array the devices form.
    pub array_uuid: Option<Uuid>,
    /// Only this array (by name).
    pub array_name: Option<String>,
    /// The devices were named by the operator: a device that is not a current member of the
    /// array is an error rather than something to skip.
    pub strict: StrictDevices,
    /// Start a dirty, degraded array anyway (see rule 7).
    pub dirty_degraded: DirtyDegraded,
}

/// Whether unrelated devices are errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrictDevices {
    /// Every device given must belong to the array.
    Strict,
    /// Devices that do not belong are skipped (scanning).
    Scan,
}

/// Whether a dirty, degraded array may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyDegraded {
    Refuse,
    /// The operator accepts that stripes being written at the crash may reconstruct wrongly.
    Force,
}

/// The decision.
#[derive(Clone, Debug)]
pub struct Assembled {
    /// The newest superblock (with this_role/this_uuid of one of the devices that hold it),
    /// its spare list cut to the spares present, in table order (as `spares`).
    pub superblock: Superblock,
    pub geometry: Geometry,
    /// Per role slot: the candidate index that holds it, if present and current.
    pub roles: Vec<Option<usize>>,
    /// Candidate indices of hot spares listed in the newest view.
    pub spares: Vec<usize>,
    /// Roles the newest view marks failed.
    pub failed_roles: Vec<usize>,
    /// Roles active in the newest view with no device present.
    pub missing_roles: Vec<usize>,
    /// Devices left out, with the reason (stale members, unrelated devices when scanning).
    pub left_out: Vec<(String, String)>,
    /// Devices whose superblock is behind the newest view (rewritten at the next update).
    pub behind: Vec<String>,
    /// The array was not shut down cleanly: bitmap regions must be resynced.
    pub dirty: bool,
}

impl Assembled {
    /// Whether any role is missing or failed.
    pub fn is_degraded(&self) -> bool {
        !self.failed_roles.is_empty() || !self.missing_roles.is_empty()
    }
}

/// Why the devices do not form an array that may start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("{device} holds no flashraid superblock: copy 0: {copy0}; copy 1: {copy1}")]
    NotAMember { device: String, copy0: String, copy1: String },
    #[error("no flashraid array found on the devices given")]
    NothingFound,
    #[error("the devices belong to several arrays ({arrays}); name the one to assemble")]
    SeveralArrays { arrays: String },
    #[error("{device} belongs to array {array} ({uuid}), not the one being assembled")]
    ForeignDevice { device: String, array: String, uuid: Uuid },
    #[error("no device holds array {wanted}")]
    ArrayNotFound { wanted: String },
    #[error("devices {a} and {b} both claim role {role} of array {array}")]
    DuplicateRole { role: usize, a: String, b: String, array: String },
    #[error(
        "devices {a} and {b} both claim spare {uuid} of array {array} (a copied device?); give only one"
    )]
    DuplicateSpare { uuid: Uuid, a: String, b: String, array: String },
    #[error("{device} is a stale member of {array}: {reason}; re-add or replace it to use it")]
    StaleMember { device: String, array: String, reason: String },
    #[error(
        "superblocks at the newest event {event} disagree about the members ({a} vs {b}); \
         refusing to guess"
    )]
    InconsistentNewest { event: u64, a: String, b: String },
    #[error(
        "array {array} ({level}, {members} members) cannot start: {unavailable} members \
         unavailable (missing: {missing:?}, failed: {failed:?}); {level} survives {tolerance}"
    )]
    TooManyMissing {
        array: String,
        level: String,
        members: usize,
        unavailable: usize,
        missing: Vec<usize>,
        failed: Vec<usize>,
        tolerance: usize,
    },
    #[error(
        "array {array} was not shut down cleanly and is degraded (roles {roles:?} unavailable): \
         stripes that were being written may have {disagreement}, so the unavailable members' \
         chunks of those stripes cannot be rebuilt reliably. Start it anyway with --force; \
         reconstructed reads of regions marked in the write-intent bitmap will then be refused \
         rather than guessed"
    )]
    DirtyDegraded {
        array: String,
        roles: Vec<usize>,
        /// What may disagree, in the level's words (`dirty_disagreement`).
        disagreement: String,
    },
}

/// The newest valid copy of one device.
fn newest_copy(candidate: &Candidate) -> Result<&Superblock, AssemblyError> {
    let valid = candidate.copies.iter().filter_map(|c| c.as_ref().ok());
    valid.max_by_key(|sb| sb.event).ok_or_else(|| AssemblyError::NotAMember {
        device: candidate.name.clone(),
        copy0: describe(&candidate.copies[0]),
        copy1: describe(&candidate.copies[1]),
    })
}

fn describe(copy: &Result<Superblock, FormatError>) -> String {
    match copy {
        Ok(sb) => format!("valid, event {}", sb.event),
        Err(e) => e.to_string(),
    }
}

fn label(sb: &Superblock) -> String {
    if sb.array_name.is_empty() { sb.array_uuid.to_string() } else { sb.array_name.clone() }
}

/// Decide. See the module documentation for the rules.
pub fn assemble(
    candidates: &[Candidate],
    request: &AssemblyRequest,
) -> Result<Assembled, AssemblyError> {
    let strict = request.strict == StrictDevices::Strict;
    let mut left_out = vec![];
    let mut found: Vec<(usize, &Superblock)> = vec![];
    for (i, candidate) in candidates.iter().enumerate() {
        match newest_copy(candidate) {
            Ok(sb) => found.push((i, sb)),
            Err(e) if strict => return Err(e),
            Err(e) => left_out.push((candidate.name.clone(), e.to_string())),
        }
    }
    let wanted = |sb: &Superblock| {
        request.array_uuid.is_none_or(|u| u == sb.array_uuid)
            && request.array_name.as_ref().is_none_or(|n| *n == sb.array_name)
    };
    let target = pick_array(&found, request, &wanted)?;
    let mut members: Vec<(usize, &Superblock)> = vec![];
    for &(i, sb) in &found {
        if sb.array_uuid == target {
            members.push((i, sb));
        } else if strict {
            let device = candidates[i].name.clone();
            return Err(AssemblyError::ForeignDevice {
                device,
                array: label(sb),
                uuid: sb.array_uuid,
            });
        } else {
            left_out.push((candidates[i].name.clone(), format!("member of array {}", label(sb))));
        }
    }
    let newest_event = members.iter().map(|(_, sb)| sb.event).max().expect("target has members");
    let newest = members.iter().find(|(_, sb)| sb.event == newest_event).expect("exists").1;
    for (i, sb) in &members {
        let same_table = sb.members == newest.members && sb.spares == newest.spares;
        if sb.event == newest_event && !same_table {
            return Err(AssemblyError::InconsistentNewest {
                event: newest_event,
                a: candidates[members[0].0].name.clone(),
                b: candidates[*i].name.clone(),
            });
        }
    }
    place_members(candidates, &members, newest, strict, left_out, request)
}

fn pick_array(
    found: &[(usize, &Superblock)],
    request: &AssemblyRequest,
    wanted: &dyn Fn(&Superblock) -> bool,
) -> Result<Uuid, AssemblyError> {
    let mut arrays: Vec<(Uuid, String)> = vec![];
    for (_, sb) in found.iter().filter(|(_, sb)| wanted(sb)) {
        if !arrays.iter().any(|(u, _)| *u == sb.array_uuid) {
            arrays.push((sb.array_uuid, label(sb)));
        }
    }
    match arrays.len() {
        1 => Ok(arrays[0].0),
        0 if request.array_uuid.is_none() && request.array_name.is_none() => {
            Err(AssemblyError::NothingFound)
        }
        0 => Err(AssemblyError::ArrayNotFound {
            wanted: request
                .array_name
                .clone()
                .or(request.array_uuid.map(|u| u.to_string()))
                .unwrap_or_default(),
        }),
        _ => Err(AssemblyError::SeveralArrays {
            arrays: arrays.iter().map(|(u, n)| format!("{n} ({u})")).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The identity the chosen superblock of candidate `i` claims.
fn candidate_uuid(members: &[(usize, &Superblock)], i: usize) -> Option<Uuid> {
    members.iter().find(|(c, _)| *c == i).map(|(_, sb)| sb.this_uuid)
}

fn place_members(
    candidates: &[Candidate],
    members: &[(usize, &Superblock)],
    newest: &Superblock,
    strict: bool,
    mut left_out: Vec<(String, String)>,
    request: &AssemblyRequest,
) -> Result<Assembled, AssemblyError> {
    let geometry = newest.geometry();
    let role_count = usize::from(newest.member_count);
    let mut roles: Vec<Option<usize>> = vec![None; role_count];
    let mut spares = vec![];
    let mut behind = vec![];
    for &(i, sb) in members {
        let name = &candidates[i].name;
        let slot = newest
            .members
            .iter()
            .chain(&newest.spares)
            .position(|entry| entry.uuid == sb.this_uuid && entry.state != MemberState::Empty);
        let stale = |reason: String| AssemblyError::StaleMember {
            device: name.clone(),
            array: label(newest),
            reason,
        };
        let Some(slot) = slot else {
            if sb.slot(usize::from(sb.this_role)).state == MemberState::Spare {
                // A spare absent at an earlier start left the table then, and one taken out
                // with `spare remove` whose superblocks were not erased: it holds nothing
                // of the array's, so it is left out (even when named), not a reason to refuse.
                let e = stale(format!(
                    "a hot spare the array no longer lists (removed, or absent when the array \
                     last started; its superblock is at event {}, the array at {}): add it \
                     again with `flashraid spare add`",
                    sb.event, newest.event
                ));
                left_out.push((name.clone(), e.to_string()));
                continue;
            }
            let e = stale(format!(
                "it is no longer listed (its superblock is at event {}, the array at {})",
                sb.event, newest.event
            ));
            if strict {
                return Err(e);
            }
            left_out.push((name.clone(), e.to_string()));
            continue;
        };
        let entry = newest.slot(slot);
        if entry.state == MemberState::Failed {
            // Left out even in strict mode: the array can still start without it.
            let e = stale(format!("marked failed at event {}", entry.failed_at_event));
            left_out.push((name.clone(), e.to_string()));
            continue;
        }
        if sb.event < newest.event {
            behind.push(name.clone());
        }
        if entry.state == MemberState::Spare {
            // Two devices with one spare identity (a cloned disk): using both would let a
            // rebuild write to one while the metadata tracks the other.
            if let Some(&(_, previous)) = spares
                .iter()
                .find(|&&(_, p): &&(usize, usize)| candidate_uuid(members, p) == Some(sb.this_uuid))
            {
                return Err(AssemblyError::DuplicateSpare {
                    uuid: sb.this_uuid,
                    a: candidates[previous].name.clone(),
                    b: name.clone(),
                    array: label(newest),
                });
            }
            spares.push((slot, i));
            continue;
        }
        if let Some(previous) = roles[slot] {
            return Err(AssemblyError::DuplicateRole {
                role: slot,
                a: candidates[previous].name.clone(),
                b: name.clone(),
                array: label(newest),
            });
        }
        roles[slot] = Some(i);
    }
    let failed_roles: Vec<usize> =
        (0..role_count).filter(|&r| newest.members[r].state == MemberState::Failed).collect();
    let missing_roles: Vec<usize> =
        (0..role_count).filter(|&r| roles[r].is_none() && !failed_roles.contains(&r)).collect();
    // A replacement still being rebuilt does not hold the chunks above its cursor.
    let unavailable: Vec<bool> = (0..role_count)
        .map(|r| roles[r].is_none() || newest.members[r].state == MemberState::Rebuilding)
        .collect();
    if !geometry.survives(&unavailable) {
        return Err(AssemblyError::TooManyMissing {
            array: label(newest),
            level: geometry.level().to_string(),
            members: role_count,
            unavailable: unavailable.iter().filter(|&&u| u).count(),
            missing: missing_roles,
            failed: failed_roles,
            tolerance: geometry.tolerance(),
        });
    }
    let dirty = newest.state == ArrayState::Dirty;
    let degraded = unavailable.iter().any(|&u| u);
    let redundant = geometry.tolerance() > 0;
    if dirty && degraded && redundant && request.dirty_degraded == DirtyDegraded::Refuse {
        let roles = (0..role_count).filter(|&r| unavailable[r]).collect();
        let disagreement = dirty_disagreement(geometry.level()).to_string();
        return Err(AssemblyError::DirtyDegraded { array: label(newest), roles, disagreement });
    }
    // The spares in table order, and the table's spares cut to the present ones: the array's
    // metadata pairs its i-th spare device with the table's i-th spare entry, whatever order
    // the devices were given in. A spare absent now leaves the table (at its return it is a
    // former spare of this array, added again with `spare add`).
    spares.sort_unstable();
    let mut superblock = newest.clone();
    superblock.spares = spares.iter().map(|&(slot, _)| *newest.slot(slot)).collect();
    if usize::from(superblock.this_role) >= role_count {
        // Read from a spare's copy: "this" now names role 0 (every write sets its own).
        superblock.this_role = 0;
        superblock.this_uuid = superblock.members[0].uuid;
    }
    let spares = spares.into_iter().map(|(_, i)| i).collect();
    Ok(Assembled {
        superblock,
        geometry,
        roles,
        spares,
        failed_roles,
        missing_roles,
        left_out,
        behind,
        dirty,
    })
}

/// What a dirty stop may leave disagreeing in stripes that were being written, in the
/// level's words (a misuse test found "parity" said of RAID 1 arrays).
pub fn dirty_disagreement(level: Level) -> &'static str {
    match level {
        Level::Raid1 | Level::Raid10 => "mirror copies that disagree with each other",
        _ => "parity that disagrees with their data",
    }
}
