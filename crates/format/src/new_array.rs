//! The superblocks of a new array: one per member and spare, all at event 1, dirty until the
//! engine has initialised parity (issue 5 makes that a background process; until then the
//! caller initialises before marking the array clean).

use crate::Uuid;
use crate::bitmap::{SHARDS_MAX, default_region_bytes};
use crate::layout::{BITMAP_OFFSET_BYTES, DATA_OFFSET_BYTES, member_data_capacity};
use crate::superblock::{
    ArrayState, CURSOR_NONE, INIT_UNKNOWN, MemberEntry, MemberState, NAME_BYTES_MAX, ROLE_NONE,
    Superblock,
};
use flashraid_layout::{Geometry, LayoutError, Level, MEMBERS_MAX};

/// Everything that decides a new array. Safety-relevant, so no `Default`.
#[derive(Clone, Debug)]
pub struct NewArray {
    pub array_uuid: Uuid,
    pub array_name: String,
    pub created_at_unix_seconds: u64,
    pub level: Level,
    pub chunk_bytes: u64,
    /// One per role, in role order.
    pub member_uuids: Vec<Uuid>,
    /// Size of each member device, in role order.
    pub member_sizes_bytes: Vec<u64>,
    pub spare_uuids: Vec<Uuid>,
    pub spare_sizes_bytes: Vec<u64>,
    /// `None` picks [`default_region_bytes`].
    pub bitmap_region_bytes: Option<u64>,
    /// Shard sections the engine will use.
    pub shards: u32,
    /// Use at most this many bytes of each member for data (`None`: as much as the smallest
    /// member allows).
    pub member_data_bytes_max: Option<u64>,
    /// Tunables stored with the array.
    pub tunables: crate::superblock::Tunables,
}

/// Why a new array cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NewArrayError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("member {index} has {size_bytes} B: too small for flashraid's metadata and one chunk")]
    MemberTooSmall { index: usize, size_bytes: u64 },
    #[error("spare {index} has {size_bytes} B, less than the {needed_bytes} B each member uses")]
    SpareTooSmall { index: usize, size_bytes: u64, needed_bytes: u64 },
    #[error("{members} members and {spares} spares: at most {MEMBERS_MAX} in all")]
    TooManyDevices { members: usize, spares: usize },
    #[error("array name {name:?} {why}")]
    Name { name: String, why: String },
    #[error("{0}")]
    Other(&'static str),
}

/// Why `name` cannot name a new array, if it cannot. A name is 1 to `NAME_BYTES_MAX` bytes of
/// UTF-8 (what the superblock holds), and, since it also names the array's control socket
/// (`NAME.control` in a directory) and is given on command lines: no NUL, no `/` (the socket
/// would be made in another directory, or outside the one meant), not `.` or `..`, and not
/// starting with `-` (read as an option). Superblocks written before these rules may hold
/// such a name; they still decode, and whoever makes a path of a stored name checks it.
pub fn array_name_problem(name: &str) -> Option<String> {
    let why = if name.is_empty() || name.len() > NAME_BYTES_MAX {
        format!("must be 1 to {NAME_BYTES_MAX} bytes, not {}", name.len())
    } else if name.contains('\0') {
        "must not contain a NUL byte".to_string()
    } else if name.contains('/') {
        "must not contain '/': it names the control socket file NAME.control".to_string()
    } else if name == "." || name == ".." {
        "must not be '.' or '..': they name directories".to_string()
    } else if name.starts_with('-') {
        "must not start with '-': a command line would read it as an option".to_string()
    } else {
        return None;
    };
    Some(why)
}

/// Build the geometry and every device's superblock (members in role order, then spares).
pub fn new_array(new: &NewArray) -> Result<(Geometry, Vec<Superblock>), NewArrayError> {
    if let Some(why) = array_name_problem(&new.array_name) {
        return Err(NewArrayError::Name { name: new.array_name.clone(), why });
    }
    if new.member_uuids.len() != new.member_sizes_bytes.len()
        || new.spare_uuids.len() != new.spare_sizes_bytes.len()
    {
        return Err(NewArrayError::Other("one size per member and per spare"));
    }
    if new.member_uuids.len() + new.spare_uuids.len() > MEMBERS_MAX {
        let (members, spares) = (new.member_uuids.len(), new.spare_uuids.len());
        return Err(NewArrayError::TooManyDevices { members, spares });
    }
    if new.shards == 0 || new.shards > SHARDS_MAX {
        return Err(NewArrayError::Other("shard count out of range"));
    }
    let mut capacity = u64::MAX;
    for (index, &size_bytes) in new.member_sizes_bytes.iter().enumerate() {
        let usable = member_data_capacity(size_bytes)
            .ok_or(NewArrayError::MemberTooSmall { index, size_bytes })?;
        capacity = capacity.min(usable);
    }
    if let Some(limit) = new.member_data_bytes_max {
        capacity = capacity.min(limit);
    }
    let geometry = Geometry::new(new.level, new.member_uuids.len(), new.chunk_bytes, capacity)?;
    let needed = geometry.member_data_bytes();
    for (index, &size_bytes) in new.spare_sizes_bytes.iter().enumerate() {
        if member_data_capacity(size_bytes).is_none_or(|c| c < needed) {
            return Err(NewArrayError::SpareTooSmall { index, size_bytes, needed_bytes: needed });
        }
    }
    let region_bytes = new
        .bitmap_region_bytes
        .unwrap_or_else(|| default_region_bytes(needed, geometry.chunk_bytes()));
    let active = |uuid: &Uuid, state| MemberEntry { uuid: *uuid, state, ..MemberEntry::EMPTY };
    let members: Vec<MemberEntry> =
        new.member_uuids.iter().map(|u| active(u, MemberState::Active)).collect();
    let spares: Vec<MemberEntry> =
        new.spare_uuids.iter().map(|u| active(u, MemberState::Spare)).collect();
    let sizes: Vec<u64> =
        new.member_sizes_bytes.iter().chain(&new.spare_sizes_bytes).copied().collect();
    let uuids: Vec<Uuid> = new.member_uuids.iter().chain(&new.spare_uuids).copied().collect();
    let mut superblocks = Vec::with_capacity(uuids.len());
    for (slot, (&uuid, &size)) in uuids.iter().zip(&sizes).enumerate() {
        let sb = Superblock {
            array_uuid: new.array_uuid,
            array_name: new.array_name.clone(),
            created_at_unix_seconds: new.created_at_unix_seconds,
            event: 1,
            level: new.level,
            member_count: u16::try_from(new.member_uuids.len()).expect("at most 64"),
            chunk_bytes: geometry.chunk_bytes(),
            data_offset_bytes: DATA_OFFSET_BYTES,
            member_data_bytes: needed,
            state: ArrayState::Dirty,
            this_role: u16::try_from(slot).expect("at most 64"),
            this_uuid: uuid,
            member_size_bytes: size,
            bitmap_offset_bytes: BITMAP_OFFSET_BYTES,
            bitmap_region_bytes: region_bytes,
            bitmap_shards: new.shards,
            init_state: INIT_UNKNOWN,
            rebuild_cursor_stripes: CURSOR_NONE,
            rebuild_role: ROLE_NONE,
            members: members.clone(),
            spares: spares.clone(),
            tunables: new.tunables,
            // `create` sets it once it has written the blank map.
            missed_map_since_event: 0,
            update_count: 0,
            session_update_count: 0,
        };
        sb.validate().map_err(|_| NewArrayError::Other("bitmap region too small or misaligned"))?;
        superblocks.push(sb);
    }
    Ok((geometry, superblocks))
}
