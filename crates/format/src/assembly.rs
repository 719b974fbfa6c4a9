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
//! 5. A device holding an active (or rebuilding) role whose superblock is two or more write
//!    passes (`update_count`) short of the pass after which the last start began writing,
//!    or that ended the last clean stop (`session_update_count`), is a stale copy: a disk
//!    image put back, a member swapped for an old one while the array was stopped, a copy
//!    of a member taken while it ran. It is left out and never read (its role is
//!    failed at start, to be rebuilt), or, when the array cannot start without it, assembly
//!    is refused unless forced (then the fewest needed are used and every region resynced).
//! 6. Two devices claiming one role: refused.
//! 7. Members missing or failed beyond what the level survives: refused; forced, the devices
//!    of failed members that were in sync when they failed are brought back, the most
//!    recently failed first, until the level survives (like mdadm's `--assemble --force`).
//!    The last member to fail holds the array's data as of the array's failure (a failed
//!    array takes no writes, though the write that failed it may have reached some
//!    members); one failed earlier missed the writes made in between. They are preferred
//!    to stale copies (rule 5), whose chunks are as of an earlier session. Only a device
//!    whose superblock is the one it had at its failure, within the missed-write map's
//!    span, is brought back; the regions the bitmap or the map names are then untrusted
//!    (resynced where the level can, reconstructed reads there refused while degraded).
//! 8. A dirty array that is also degraded: refused unless forced, because stripes that were
//!    being written at the crash may have parity that disagrees with their data (the RAID 5/6
//!    write hole) and the missing member's chunks of those stripes cannot be trusted.
//!
//! Why one pass short is current and two are stale: every superblock update is one pass that
//! reaches every device holding a slot before the next pass starts (a device whose write
//! fails is marked failed by the next pass). A start writes a first pass, then a second that
//! records its own count as the session's, and only then data. Every member in service had
//! the first pass, so it is at most one short of the session's count, whatever crashed
//! since (starts cut short, one after another, record no session and write no data), while
//! a device that missed the session's first pass is two or more short. A device that takes
//! a role is written first in its pass, so a cut never leaves the role named for a device
//! whose own superblock is old. A member behind missed metadata, not data: degraded writes
//! only ever skip members the metadata already marks failed. Its superblock is rewritten at
//! the next update. A clean stop, after the session's last data write, makes two passes the
//! same way (the second recording its own count as the session's), so a copy of a member
//! taken while the array ran is two or more passes short once it has stopped clean.
//!
//! Limit: after a crash, a dirty stop, or a cut inside a clean stop's first pass, a copy
//! taken while the array ran (after the session's last metadata update) and put back is not
//! told apart: no per-write generation is kept. md has the same limit.

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
    /// Start a dirty, degraded array anyway (see rule 8).
    pub dirty_degraded: DirtyDegraded,
    /// Whether stale copies, and members failed past the level's tolerance, may be used
    /// when the array cannot start without them (rules 5 and 7).
    pub stale: StaleMembers,
}

/// What to do with stale copies of members (rule 5) and with the devices of members failed
/// past the level's tolerance (rule 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleMembers {
    /// Leave them out; refuse to start if the array needs them.
    LeaveOut,
    /// The operator accepts their old chunks (`--force`): used only when the array cannot
    /// start without them; then every region is resynced after a stale copy, and the
    /// bitmap's and missed-write map's regions after a failed member.
    UseIfNeeded,
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
    /// Stale copies used anyway (forced): their roles' chunks are old, so every region must
    /// be resynced. Device names.
    pub stale_used: Vec<String>,
    /// Devices of members failed past the level's tolerance, brought back (forced): their
    /// roles are active again in `superblock`. Their chunks may be old where the write-intent
    /// bitmap names a region (the write that failed the array may have reached only some
    /// members), and, if `revived_missed_writes`, where the missed-write map does (writes made
    /// after their failure); `control::prepare` makes those regions dirty. Device names.
    pub failed_used: Vec<String>,
    /// Some member brought back by force (`failed_used`) failed while the array still
    /// served writes (the roles out of service then, itself included, were no more than the
    /// level survives), so it missed the writes the missed-write map names. A member whose
    /// failure took the array past its tolerance missed none (writes were refused from then
    /// on) except those in flight at its failure, whose regions stay in the write-intent
    /// bitmap (the engine releases no bit while the array is failed).
    pub revived_missed_writes: bool,
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
         unavailable (missing: {missing:?}, failed: {failed:?}); {level} survives \
         {tolerance}{hint}"
    )]
    TooManyMissing {
        array: String,
        level: flashraid_layout::Level,
        members: usize,
        unavailable: usize,
        missing: Vec<usize>,
        failed: Vec<usize>,
        tolerance: usize,
        /// What `--force` would bring back, if anything (empty, or a sentence after "; ").
        /// Boxed: kept small, as every `Result` of assembly carries this error's size.
        hint: Box<str>,
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
    #[error(
        "array {array} ({level}) cannot start without {devices}: each is a stale copy of its \
         role (its superblock is older than the array's last start or clean stop, so it \
         missed that session's writes), and {level} survives {tolerance} unavailable. \
         Find the current devices, or start it anyway with --force: those roles' chunks are \
         then used as they are (data written since the copies were taken is lost or mixed \
         there) and every region is resynced"
    )]
    StaleMembersNeeded { array: String, level: String, devices: String, tolerance: usize },
}

/// The newest valid copy of one device.
fn newest_copy(candidate: &Candidate) -> Result<&Superblock, AssemblyError> {
    let valid = candidate.copies.iter().filter_map(|c| c.as_ref().ok());
    valid.max_by_key(|sb| (sb.event, sb.update_count)).ok_or_else(|| AssemblyError::NotAMember {
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
    // Copies at one event come from one pass, so they carry one update count; the highest is
    // taken all the same, so the stale rule never measures from an older copy.
    let newest = members
        .iter()
        .filter(|(_, sb)| sb.event == newest_event)
        .max_by_key(|(_, sb)| sb.update_count)
        .expect("exists")
        .1;
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
    // Stale copies of roles (rule 5), placed only if needed.
    let mut stale_copies: Vec<StaleCopy> = vec![];
    // Devices of failed members that could be brought back (rule 7): (slot, candidate,
    // failed_at_event).
    let mut revivable: Vec<(usize, usize, u64)> = vec![];
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
            // Its own superblock as it was when it failed, whole (its chunks are the array's
            // as of its failure, except what the missed-write map names), by the bounds a
            // re-add uses: not an older image of it (found by review: an image from before
            // the last session was brought back as current).
            let own_view_active = usize::from(sb.this_role) == slot
                && sb.members.get(slot).is_some_and(|e| e.state == MemberState::Active);
            let map_covers = newest.missed_map_since_event != 0
                && newest.missed_map_since_event <= entry.failed_at_event
                && sb.event >= newest.missed_map_since_event;
            // The member whose failure failed the array is brought back trusted as of its
            // failure, with only the write-intent bitmap distrusted: its device must have
            // seen the start of the session it failed in, as rule 5 asks of every member
            // (found by review: an image taken at the clean stop before that session was
            // brought back as current). Unknown (0) for a failure recorded by an older
            // version.
            let failed_the_array =
                slot < role_count && !newest.geometry().survives(&out_at_failure(newest, slot));
            let of_last_session =
                sb.update_count.saturating_add(1) >= entry.failed_session_update_count;
            if slot < role_count
                && entry.in_sync_when_failed
                && own_view_active
                && map_covers
                && sb.event < entry.failed_at_event
                && (of_last_session || !failed_the_array)
            {
                revivable.push((slot, i, entry.failed_at_event));
            }
            continue;
        }
        if entry.state != MemberState::Spare
            && sb.update_count.saturating_add(1) < newest.session_update_count
        {
            let why = format!(
                "a stale copy of role {slot}: its superblock (event {}, update {}) is older \
                 than the array's last start or clean stop (update {}; the array is at event \
                 {}), so it \
                 missed that session's writes and its chunks are old",
                sb.event, sb.update_count, newest.session_update_count, newest.event
            );
            stale_copies.push(StaleCopy { slot, candidate: i, update_count: sb.update_count, why });
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
    // Members failed past the tolerance first: the last to fail holds the data as of the
    // array's failure, a stale copy only as of an earlier session.
    let (failed_used, hint) =
        revive_failed(candidates, newest, &mut roles, revivable, &mut left_out, request.stale);
    let stale_used = place_stale_copies(
        candidates,
        newest,
        &mut roles,
        stale_copies,
        &mut left_out,
        StaleCopyUse { policy: request.stale, revival_suffices: !hint.is_empty() },
    )?;
    let revived_roles: Vec<usize> = (0..role_count)
        .filter(|&r| roles[r].is_some() && newest.members[r].state == MemberState::Failed)
        .collect();
    let failed_roles: Vec<usize> = (0..role_count)
        .filter(|&r| newest.members[r].state == MemberState::Failed && !revived_roles.contains(&r))
        .collect();
    let revived_missed_writes =
        revived_roles.iter().any(|&r| geometry.survives(&out_at_failure(newest, r)));
    let missing_roles: Vec<usize> =
        (0..role_count).filter(|&r| roles[r].is_none() && !failed_roles.contains(&r)).collect();
    // A replacement still being rebuilt does not hold the chunks above its cursor.
    let unavailable = unavailable_roles(newest, &roles);
    if !geometry.survives(&unavailable) {
        return Err(AssemblyError::TooManyMissing {
            array: label(newest),
            level: geometry.level(),
            members: role_count,
            unavailable: unavailable.iter().filter(|&&u| u).count(),
            missing: missing_roles,
            failed: failed_roles,
            tolerance: geometry.tolerance(),
            hint: hint.into(),
        });
    }
    // Forced stale copies, or failed members brought back, may disagree with parity: the
    // array resyncs as after an unclean shutdown (`control::prepare` says which regions).
    let dirty =
        newest.state == ArrayState::Dirty || !stale_used.is_empty() || !failed_used.is_empty();
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
    for &role in &revived_roles {
        let entry = &mut superblock.members[role];
        entry.state = MemberState::Active;
        entry.failed_at_event = 0;
        entry.failed_session_update_count = 0;
        entry.in_sync_when_failed = false;
    }
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
        stale_used,
        failed_used,
        revived_missed_writes,
    })
}

/// Per role, whether it was out of service when `role` failed, as far as the member table
/// tells: roles failed at or before `role`'s failure event (`role` itself included), and a
/// role being rebuilt. A rebuild starts only while the array survives (no spare is taken and
/// no member re-added past the tolerance), so a role whose rebuild started after `role`'s
/// failure, counted here, never makes the count exceed what the array had then survived:
/// the count can be too high only where it stays within the tolerance, never in a way that
/// calls a member that missed writes current.
fn out_at_failure(newest: &Superblock, role: usize) -> Vec<bool> {
    let at = newest.members[role].failed_at_event;
    newest.members[..usize::from(newest.member_count)]
        .iter()
        .map(|e| {
            (e.state == MemberState::Failed && e.failed_at_event <= at)
                || e.state == MemberState::Rebuilding
        })
        .collect()
}

/// Per role, whether it is unavailable with `roles` held: no device, or being rebuilt (it
/// holds only part of its chunks).
fn unavailable_roles(newest: &Superblock, roles: &[Option<usize>]) -> Vec<bool> {
    (0..roles.len())
        .map(|r| roles[r].is_none() || newest.members[r].state == MemberState::Rebuilding)
        .collect()
}

/// Whether the level survives with `roles` held.
fn survives_with(newest: &Superblock, roles: &[Option<usize>]) -> bool {
    newest.geometry().survives(&unavailable_roles(newest, roles))
}

/// The fewest of `options` (slot, candidate), taken in the order given, that make the level
/// survive with `roles`: added one at a time until it survives, then each dropped again,
/// newest addition first, where the level survives without it. `None`: even all of them do
/// not suffice. Irreducible, so a device whose role's data another holder has (a RAID 10
/// partner, a RAID 1 copy) is never added beside it.
fn fewest_needed(
    newest: &Superblock,
    roles: &[Option<usize>],
    options: &[(usize, usize)],
) -> Option<Vec<(usize, usize)>> {
    let mut trial = roles.to_vec();
    let mut chosen = vec![];
    for &(slot, i) in options {
        if survives_with(newest, &trial) {
            break;
        }
        if trial[slot].is_none() {
            trial[slot] = Some(i);
            chosen.push((slot, i));
        }
    }
    if !survives_with(newest, &trial) {
        return None;
    }
    for n in (0..chosen.len()).rev() {
        let (slot, _) = chosen[n];
        trial[slot] = None;
        if survives_with(newest, &trial) {
            chosen.remove(n);
        } else {
            trial[slot] = Some(chosen[n].1);
        }
    }
    Some(chosen)
}

/// Rule 7, forced: bring back the devices of failed members, the most recently failed first,
/// the fewest that let the level survive. Returns the names brought back, and (unforced)
/// what `--force` would bring back, as a hint for the refusal.
fn revive_failed(
    candidates: &[Candidate],
    newest: &Superblock,
    roles: &mut [Option<usize>],
    mut revivable: Vec<(usize, usize, u64)>,
    left_out: &mut Vec<(String, String)>,
    policy: StaleMembers,
) -> (Vec<String>, String) {
    if revivable.is_empty() || survives_with(newest, roles) {
        return (vec![], String::new());
    }
    // The most recently failed first; of two devices claiming one failed role (a device and
    // an image of it), the one with the newer superblock (found by review: the one named
    // first was taken, an old image over the device itself).
    let freshness = |i: usize| {
        candidates[i].copies.iter().flatten().map(|sb| (sb.event, sb.update_count)).max()
    };
    revivable.sort_by_key(|&(slot, i, failed_at)| {
        (std::cmp::Reverse(failed_at), slot, std::cmp::Reverse(freshness(i)))
    });
    let options: Vec<(usize, usize)> = revivable.iter().map(|&(slot, i, _)| (slot, i)).collect();
    let Some(chosen) = fewest_needed(newest, roles, &options) else {
        return (vec![], String::new());
    };
    let names: Vec<String> = chosen
        .iter()
        .map(|&(slot, i)| {
            let at = newest.members[slot].failed_at_event;
            format!("{} (role {slot}, failed at event {at})", candidates[i].name)
        })
        .collect();
    if policy == StaleMembers::LeaveOut {
        let hint = format!(
            "; --force brings back {}: the last member to fail holds the data as of the \
             array's failure, one failed earlier lacks what was written after it failed; the \
             regions being written then and those written while a member was out (the \
             missed-write map) are resynced",
            names.join(", ")
        );
        return (vec![], hint);
    }
    let mut used = vec![];
    for (slot, i) in chosen {
        roles[slot] = Some(i);
        let name = candidates[i].name.clone();
        left_out.retain(|(n, _)| *n != name);
        used.push(name);
    }
    (used, String::new())
}

/// How rule 5 may use stale copies.
#[derive(Clone, Copy)]
struct StaleCopyUse {
    policy: StaleMembers,
    /// Bringing back failed members would let the array start (the refusal says so): stale
    /// copies are then not what it needs.
    revival_suffices: bool,
}

/// One stale copy found by rule 5: its role slot, candidate index, update count and why it
/// is stale.
struct StaleCopy {
    slot: usize,
    candidate: usize,
    update_count: u64,
    why: String,
}

/// Rule 5: stale copies are left out (said why) unless the array cannot start without some;
/// then refused, or (forced) the fewest placed that let it start, the freshest first, never
/// one of a role being rebuilt (it counts as unavailable either way, and its image holds
/// less than the cursor says). Returns the names of those placed.
fn place_stale_copies(
    candidates: &[Candidate],
    newest: &Superblock,
    roles: &mut [Option<usize>],
    mut stale_copies: Vec<StaleCopy>,
    left_out: &mut Vec<(String, String)>,
    uses: StaleCopyUse,
) -> Result<Vec<String>, AssemblyError> {
    let policy = uses.policy;
    stale_copies.sort_by_key(|c| (std::cmp::Reverse(c.update_count), c.slot));
    let options: Vec<(usize, usize)> = stale_copies
        .iter()
        .filter(|c| newest.members[c.slot].state != MemberState::Rebuilding)
        .map(|c| (c.slot, c.candidate))
        .collect();
    let needed = if survives_with(newest, roles) || uses.revival_suffices {
        vec![]
    } else {
        fewest_needed(newest, roles, &options).unwrap_or_default()
    };
    if !needed.is_empty() && policy == StaleMembers::LeaveOut {
        let devices: Vec<String> = needed
            .iter()
            .map(|&(slot, i)| format!("{} (role {slot})", candidates[i].name))
            .collect();
        return Err(AssemblyError::StaleMembersNeeded {
            array: label(newest),
            level: newest.geometry().level().to_string(),
            devices: devices.join(", "),
            tolerance: newest.geometry().tolerance(),
        });
    }
    let mut used = vec![];
    for copy in stale_copies {
        let name = candidates[copy.candidate].name.clone();
        if needed.contains(&(copy.slot, copy.candidate)) {
            roles[copy.slot] = Some(copy.candidate);
            used.push(name);
        } else {
            left_out.push((
                name,
                format!(
                    "{}; left out: its role is failed, to be rebuilt onto a hot spare (this \
                     device can be one: `flashraid spare add` it)",
                    copy.why
                ),
            ));
        }
    }
    Ok(used)
}

/// What a dirty stop may leave disagreeing in stripes that were being written, in the
/// level's words (a misuse test found "parity" said of RAID 1 arrays).
pub fn dirty_disagreement(level: Level) -> &'static str {
    match level {
        Level::Raid1 | Level::Raid10 => "mirror copies that disagree with each other",
        _ => "parity that disagrees with their data",
    }
}
