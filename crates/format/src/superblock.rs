//! The superblock: one 4 KiB record that says which array a member belongs to, what it is in
//! it, and the array's shape and state. Every member carries two copies.
//!
//! Owns: the typed [`Superblock`], its byte encoding (version 1, little-endian; the diagram is
//! in docs/on-disk-format.md), and validation of everything decoded.
//!
//! Invariants: `decode(encode(sb)) == sb` for every valid `sb`; `decode` never panics, on any
//! input, and accepts only a record whose checksum, magic, version and every cross-field rule
//! hold (a decoded superblock is trusted by the rest of the code).
//!
//! Fault model: a torn or corrupted copy fails its CRC32C and is ignored in favour of the other
//! copy; a copy from a newer incompatible format is refused with a clear error, not
//! misread.

use crate::{FormatError, Uuid};
use flashraid_layout::{Geometry, Level, MEMBERS_MAX};

/// Bytes of one superblock copy.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// The magic that starts every superblock.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"FLSHRAID";
/// The format version this code writes.
pub const FORMAT_VERSION: u32 = 1;
/// Longest array name, in bytes of UTF-8.
pub const NAME_BYTES_MAX: usize = 64;
/// Bytes of one member-table entry.
const MEMBER_ENTRY_BYTES: usize = 48;
/// Where the member table starts.
const MEMBER_TABLE_OFFSET: usize = 256;
/// Where the checksum lives (the last four bytes).
const CRC_OFFSET: usize = SUPERBLOCK_BYTES - 4;

const _: () = assert!(MEMBER_TABLE_OFFSET + MEMBERS_MAX * MEMBER_ENTRY_BYTES <= CRC_OFFSET);

/// Marks "no cursor": the process is finished or was never started.
pub const CURSOR_NONE: u64 = u64::MAX;
/// `init_state`: nothing known of the dirty regions (they may hold writes in flight at a
/// crash).
pub const INIT_UNKNOWN: u64 = u64::MAX;
/// `init_state`: the dirty regions are only those background init has not reached, with no
/// crash since the array was created or last stopped clean.
pub const INIT_PENDING_NO_CRASH: u64 = 0;
/// Marks "no member".
pub const ROLE_NONE: u16 = u16::MAX;

/// Whether the array was shut down cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayState {
    /// Every write reached every member and parity is consistent.
    Clean,
    /// Writes may have been in flight: the write-intent bitmap names the regions to resync.
    Dirty,
}

/// A role slot's state in the member table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// The slot has no member (never used, or its member was removed).
    Empty,
    /// In service and current.
    Active,
    /// Failed: its contents are stale from `failed_at_event` on and it must not be read.
    Failed,
    /// A hot spare waiting to take over a failed slot (issue 5).
    Spare,
    /// Being rebuilt: current below the rebuild cursor only (issue 5).
    Rebuilding,
}

impl MemberState {
    fn code(self) -> u8 {
        match self {
            MemberState::Empty => 0,
            MemberState::Active => 1,
            MemberState::Failed => 2,
            MemberState::Spare => 3,
            MemberState::Rebuilding => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => MemberState::Empty,
            1 => MemberState::Active,
            2 => MemberState::Failed,
            3 => MemberState::Spare,
            4 => MemberState::Rebuilding,
            _ => return None,
        })
    }
}

/// One slot of the member table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberEntry {
    pub uuid: Uuid,
    pub state: MemberState,
    /// Read errors repaired on this member (reported in status; never reset by assembly).
    pub errors_corrected: u32,
    /// The event at which the member failed (0 when it has not).
    pub failed_at_event: u64,
    /// The array's `session_update_count` when the member failed (0 when it has not, or
    /// failed under a version before this field): its device saw that session's start, so
    /// a device of it whose superblock is older (an image taken before) is not it as of its
    /// failure. Bytes 32-39 of the entry.
    pub failed_session_update_count: u64,
    /// Failed while it was fully in sync (active, not being rebuilt): its chunks are the
    /// array's as of its failure, so a re-add needs only what the missed-write map names.
    /// Only on a failed entry.
    pub in_sync_when_failed: bool,
    /// Being rebuilt from the missed-write map (a re-added member): above the rebuild cursor
    /// it is current except in the regions the map names. Only on a rebuilding entry.
    pub partial_rebuild: bool,
    /// The role this spare is replacing (`flashraid replace`: the role's member is being
    /// copied to it). Only on a spare entry, at most one per table; a start that finds it
    /// starts the copy over. Bytes 18-19 of the entry, flag bit 2.
    pub replacing: Option<u16>,
}

impl MemberEntry {
    pub const EMPTY: MemberEntry = MemberEntry {
        uuid: Uuid::NIL,
        state: MemberState::Empty,
        errors_corrected: 0,
        failed_at_event: 0,
        failed_session_update_count: 0,
        in_sync_when_failed: false,
        partial_rebuild: false,
        replacing: None,
    };
}

/// Member-entry flag bits (byte 17 of an entry).
const ENTRY_IN_SYNC_WHEN_FAILED: u8 = 1;
const ENTRY_PARTIAL_REBUILD: u8 = 2;
const ENTRY_REPLACING: u8 = 4;
/// Where `missed_map_since_event` lives (the first bytes after the member table).
const MISSED_SINCE_OFFSET: usize = MEMBER_TABLE_OFFSET + MEMBERS_MAX * MEMBER_ENTRY_BYTES;

/// Tunables stored with the array (set at create or changed live; `None`: not set, the
/// server's option or default applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tunables {
    /// Rebuild rate limit, MiB/s (0: no limit).
    pub rebuild_rate_mib_per_s: Option<u32>,
    /// Scrub rate limit, MiB/s (0: no limit).
    pub scrub_rate_mib_per_s: Option<u32>,
    /// Partial-stripe write merge window, microseconds.
    pub merge_window_us: Option<u32>,
    /// A check scrub this often while served, hours (0: only on request).
    pub scrub_interval_hours: Option<u32>,
    /// Rebuild rate limit while the array is busy, MiB/s (0: no separate limit).
    pub rebuild_busy_rate_mib_per_s: Option<u32>,
    /// Background initialisation and resync rate limit, MiB/s of each member swept (0: no
    /// limit).
    pub resync_rate_mib_per_s: Option<u32>,
    /// Reactor threads (cores used).
    pub shards: Option<u32>,
    /// Member IOs in flight per reactor (its io_uring's entries).
    pub queue_depth: Option<u32>,
    /// A member with IO outstanding and none of it completing for this long is stalled,
    /// milliseconds (0: never): failed where the array survives without it, else waited
    /// out.
    pub member_timeout_ms: Option<u32>,
}

const TUNABLES_OFFSET: usize = 232;
/// Tunables 5 and later: after `missed_map_since_event`, in bytes that were reserved (zero,
/// so an older superblock reads as "nothing stored"; an older binary ignores them).
const TUNABLES_EXT_OFFSET: usize = MISSED_SINCE_OFFSET + 8;
/// Tunables stored at `TUNABLES_OFFSET + 4` (the rest go to `TUNABLES_EXT_OFFSET`).
const TUNABLES_BASE_COUNT: usize = 5;
const TUNABLES_COUNT: usize = 9;
/// Where `update_count` lives: the last eight bytes before the checksum, away from the
/// tunables, which grow upwards from `TUNABLES_EXT_OFFSET`; `session_update_count` just
/// before it.
const UPDATE_COUNT_OFFSET: usize = CRC_OFFSET - 8;
const SESSION_UPDATE_COUNT_OFFSET: usize = UPDATE_COUNT_OFFSET - 8;

const _: () = assert!(
    TUNABLES_EXT_OFFSET + 4 * (TUNABLES_COUNT - TUNABLES_BASE_COUNT) <= SESSION_UPDATE_COUNT_OFFSET
);

/// Where tunable `i`'s value lives.
fn tunable_offset(i: usize) -> usize {
    if i < TUNABLES_BASE_COUNT {
        TUNABLES_OFFSET + 4 + 4 * i
    } else {
        TUNABLES_EXT_OFFSET + 4 * (i - TUNABLES_BASE_COUNT)
    }
}

impl Tunables {
    fn encode(&self, b: &mut [u8]) {
        let fields = self.fields();
        let mut flags = 0u32;
        for (i, f) in fields.iter().enumerate() {
            if let Some(v) = f {
                flags |= 1 << i;
                put_u32(b, tunable_offset(i), *v);
            }
        }
        put_u32(b, TUNABLES_OFFSET, flags);
    }

    fn decode(b: &[u8]) -> Self {
        let flags = get_u32(b, TUNABLES_OFFSET);
        let field = |i: usize| (flags & (1 << i) != 0).then(|| get_u32(b, tunable_offset(i)));
        Self::from_fields(std::array::from_fn(field))
    }

    /// The inverse of `fields`.
    fn from_fields(f: [Option<u32>; TUNABLES_COUNT]) -> Self {
        Tunables {
            rebuild_rate_mib_per_s: f[0],
            scrub_rate_mib_per_s: f[1],
            merge_window_us: f[2],
            scrub_interval_hours: f[3],
            rebuild_busy_rate_mib_per_s: f[4],
            resync_rate_mib_per_s: f[5],
            shards: f[6],
            queue_depth: f[7],
            member_timeout_ms: f[8],
        }
    }

    /// Tunable `i` at index `i` (`from_fields`, a struct literal, makes a tunable added
    /// later fail to compile until it has an index).
    fn fields(&self) -> [Option<u32>; TUNABLES_COUNT] {
        [
            self.rebuild_rate_mib_per_s,
            self.scrub_rate_mib_per_s,
            self.merge_window_us,
            self.scrub_interval_hours,
            self.rebuild_busy_rate_mib_per_s,
            self.resync_rate_mib_per_s,
            self.shards,
            self.queue_depth,
            self.member_timeout_ms,
        ]
    }

    /// These tunables where they are set, else `stored`'s (an operator's setting over what the
    /// array stores).
    pub fn or(self, stored: Tunables) -> Tunables {
        let (given, stored) = (self.fields(), stored.fields());
        Self::from_fields(std::array::from_fn(|i| given[i].or(stored[i])))
    }
}

/// A decoded, validated superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub array_uuid: Uuid,
    pub array_name: String,
    pub created_at_unix_seconds: u64,
    /// Bumped on every metadata change; the copy with the highest event is the newest.
    pub event: u64,
    pub level: Level,
    pub member_count: u16,
    pub chunk_bytes: u32,
    /// Where the data area starts on every member.
    pub data_offset_bytes: u64,
    /// Bytes of each member's data area in use (whole chunks).
    pub member_data_bytes: u64,
    pub state: ArrayState,
    /// This copy's member: its slot in the table.
    pub this_role: u16,
    pub this_uuid: Uuid,
    /// Size of this member when the superblock was written; copy 1 sits in its last 4 KiB.
    pub member_size_bytes: u64,
    pub bitmap_offset_bytes: u64,
    pub bitmap_region_bytes: u64,
    /// Shard sections the bitmap was last written with.
    pub bitmap_shards: u32,
    /// [`INIT_PENDING_NO_CRASH`]: every region the write-intent bitmap names is one
    /// background init has not reached, and no write was in flight there at an unclean stop
    /// (written by `create --init background` and by the clean stop of a session that began
    /// so); else [`INIT_UNKNOWN`] (written by every start, so a crash in the session leaves
    /// it so). Bytes 200-207 (once reserved for an init cursor, always written u64::MAX).
    pub init_state: u64,
    /// Rebuild progress in stripes ([`CURSOR_NONE`] when none runs; issue 5).
    pub rebuild_cursor_stripes: u64,
    /// Slot being rebuilt ([`ROLE_NONE`] when none).
    pub rebuild_role: u16,
    /// Role slots `0..member_count` (a member's role is its slot).
    pub members: Vec<MemberEntry>,
    /// Hot spares (state [`MemberState::Spare`]), stored in the table slots after the roles.
    pub spares: Vec<MemberEntry>,
    pub tunables: Tunables,
    /// The missed-write map (on every member, after the bitmap area) names every region
    /// written while some role was out of service since this event; 0: no map is kept (an
    /// array from before the map, or one whose map was lost), so nothing can be re-added
    /// without a full rebuild.
    pub missed_map_since_event: u64,
    /// Superblock write passes over the members in service (one per update, whatever it
    /// bumped `event` by). Every pass reaches every device holding a slot (or fails it)
    /// before the next starts. 0 on an array last written by a version before the count.
    pub update_count: u64,
    /// The `update_count` of the pass after which the last start began writing data (its
    /// second pass; the first reached every member before it). A member in service is at
    /// most one pass short of it; a device two or more short missed that session's writes
    /// (a stale copy). 0: no start has recorded one (nothing can then be judged).
    pub session_update_count: u64,
}

impl Superblock {
    /// The array's geometry (validated when the superblock was decoded or built).
    pub fn geometry(&self) -> Geometry {
        Geometry::new(
            self.level,
            usize::from(self.member_count),
            u64::from(self.chunk_bytes),
            self.member_data_bytes,
        )
        .expect("a validated superblock has a valid geometry")
    }

    /// Table slot `index`: a role below `member_count`, a spare above.
    pub fn slot(&self, index: usize) -> &MemberEntry {
        if index < self.members.len() {
            &self.members[index]
        } else {
            &self.spares[index - self.members.len()]
        }
    }

    /// Whether this copy belongs to a spare rather than to a role.
    pub fn is_spare(&self) -> bool {
        self.this_role >= self.member_count
    }

    /// Check every cross-field rule; `encode` and `decode` both call it.
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |what: &'static str| Err(FormatError::Invalid { what });
        if self.array_name.len() > NAME_BYTES_MAX || self.array_name.contains('\0') {
            return bad("array name longer than 64 bytes or containing NUL");
        }
        let geometry = Geometry::new(
            self.level,
            usize::from(self.member_count),
            u64::from(self.chunk_bytes),
            self.member_data_bytes,
        )
        .map_err(|_| FormatError::Invalid { what: "geometry (level, members, chunk, size)" })?;
        if geometry.member_data_bytes() != self.member_data_bytes {
            return bad("member data size is not a whole number of chunks");
        }
        if self.init_state != INIT_UNKNOWN && self.init_state != INIT_PENDING_NO_CRASH {
            return bad("init state");
        }
        if self.members.len() != usize::from(self.member_count) {
            return bad("member table length differs from member count");
        }
        if self.members.iter().any(|m| m.state == MemberState::Spare) {
            return bad("a role slot is marked spare");
        }
        if self.members.len() + self.spares.len() > MEMBERS_MAX {
            return bad("more members and spares than table slots");
        }
        if self.spares.iter().any(|m| m.state != MemberState::Spare) {
            return bad("a spare slot is not marked spare");
        }
        let slots = self.members.len() + self.spares.len();
        if usize::from(self.this_role) >= slots {
            return bad("this member's slot is outside the member table");
        }
        let this = self.slot(usize::from(self.this_role));
        if this.uuid != self.this_uuid || this.state == MemberState::Empty {
            return bad("this member's slot does not hold this member");
        }
        if self.array_uuid.is_nil() || self.this_uuid.is_nil() {
            return bad("nil UUID");
        }
        let all: Vec<&MemberEntry> = self.members.iter().chain(&self.spares).collect();
        for (i, a) in all.iter().enumerate() {
            if a.state != MemberState::Empty && a.uuid.is_nil() {
                return bad("a used slot has a nil member UUID");
            }
            if a.state != MemberState::Empty && all[..i].iter().any(|b| b.uuid == a.uuid) {
                return bad("one member UUID appears in two slots");
            }
        }
        if !self.data_offset_bytes.is_multiple_of(4096) || self.data_offset_bytes == 0 {
            return bad("data offset not a non-zero multiple of 4 KiB");
        }
        let data_end = self.data_offset_bytes.checked_add(self.member_data_bytes);
        let copy1 = crate::layout::superblock_copy1_offset(self.member_size_bytes);
        if data_end.is_none_or(|end| copy1.is_none_or(|c| end > c)) {
            return bad("data area overlaps the second superblock copy or the member's end");
        }
        if !self.bitmap_region_bytes.is_power_of_two()
            || self.bitmap_region_bytes < u64::from(self.chunk_bytes)
        {
            return bad("bitmap region not a power of two of at least one chunk");
        }
        let regions = self.member_data_bytes.div_ceil(self.bitmap_region_bytes);
        if regions > crate::bitmap::REGIONS_PER_BLOCK_MAX as u64 {
            return bad("bitmap region too small: more regions than one bitmap block holds");
        }
        let bitmap_end = self
            .bitmap_offset_bytes
            .checked_add(crate::bitmap::BITMAP_AREA_BYTES)
            .filter(|&end| end <= self.data_offset_bytes);
        if self.bitmap_offset_bytes < 4096 || bitmap_end.is_none() {
            return bad("bitmap area outside the space before the data area");
        }
        // The missed-write map sits at a fixed place: it must overlap neither the bitmap
        // area nor the data area.
        let missed = crate::bitmap::MISSED_MAP_OFFSET_BYTES;
        let missed_end = missed + crate::bitmap::BITMAP_AREA_BYTES;
        let bitmap_end = bitmap_end.expect("checked");
        if self.data_offset_bytes < missed_end
            || (self.bitmap_offset_bytes < missed_end && missed < bitmap_end)
        {
            return bad("bitmap or data area over the missed-write map");
        }
        if self.bitmap_shards == 0 || self.bitmap_shards > crate::bitmap::SHARDS_MAX {
            return bad("bitmap shard count out of range");
        }
        if self.rebuild_role != ROLE_NONE && self.rebuild_role >= self.member_count {
            return bad("rebuild role outside the member table");
        }
        for entry in &all {
            if entry.in_sync_when_failed && entry.state != MemberState::Failed {
                return bad("an entry not failed is marked in sync when failed");
            }
            if entry.partial_rebuild && entry.state != MemberState::Rebuilding {
                return bad("an entry not being rebuilt is marked for a partial rebuild");
            }
            if let Some(role) = entry.replacing {
                if entry.state != MemberState::Spare {
                    return bad("an entry not a spare is marked as replacing a member");
                }
                if role >= self.member_count {
                    return bad("a spare replaces a role outside the member table");
                }
            }
        }
        if all.iter().filter(|e| e.replacing.is_some()).count() > 1 {
            return bad("more than one spare is marked as replacing a member");
        }
        if self.missed_map_since_event > self.event {
            return bad("missed-write map newer than the superblock");
        }
        if self.session_update_count > self.update_count {
            return bad("session start counted after the superblock's own pass");
        }
        Ok(())
    }

    /// The 4 KiB on-disk image. Panics if the superblock is invalid: callers build superblocks
    /// from validated parts, so an invalid one is a broken invariant.
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        if let Err(e) = self.validate() {
            panic!("encoding an invalid superblock: {e}");
        }
        let mut b = [0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        put_u32(&mut b, 8, FORMAT_VERSION);
        put_u32(&mut b, 12, u32::try_from(SUPERBLOCK_BYTES).expect("4096"));
        put_u32(&mut b, 16, 0); // incompatible feature flags: none in version 1
        b[24..40].copy_from_slice(&self.array_uuid.0);
        b[40..40 + self.array_name.len()].copy_from_slice(self.array_name.as_bytes());
        put_u64(&mut b, 104, self.created_at_unix_seconds);
        put_u64(&mut b, 112, self.event);
        b[120] = self.level.code();
        b[121] = u8::try_from(self.level.parity_chunks()).expect("at most 3");
        put_u16(&mut b, 122, self.member_count);
        put_u32(&mut b, 124, self.chunk_bytes);
        put_u64(&mut b, 128, self.data_offset_bytes);
        put_u64(&mut b, 136, self.member_data_bytes);
        put_u64(&mut b, 144, self.geometry().array_bytes());
        b[152] = match self.state {
            ArrayState::Clean => 0,
            ArrayState::Dirty => 1,
        };
        put_u16(&mut b, 154, self.this_role);
        b[156..172].copy_from_slice(&self.this_uuid.0);
        put_u64(&mut b, 176, self.bitmap_offset_bytes);
        put_u64(&mut b, 184, self.bitmap_region_bytes);
        put_u32(&mut b, 192, self.bitmap_shards);
        put_u64(&mut b, 200, self.init_state);
        put_u64(&mut b, 208, self.rebuild_cursor_stripes);
        put_u16(&mut b, 216, self.rebuild_role);
        put_u64(&mut b, 224, self.member_size_bytes);
        self.tunables.encode(&mut b);
        for (i, entry) in self.members.iter().chain(&self.spares).enumerate() {
            let at = MEMBER_TABLE_OFFSET + i * MEMBER_ENTRY_BYTES;
            b[at..at + 16].copy_from_slice(&entry.uuid.0);
            b[at + 16] = entry.state.code();
            put_u32(&mut b, at + 20, entry.errors_corrected);
            put_u64(&mut b, at + 24, entry.failed_at_event);
            put_u64(&mut b, at + 32, entry.failed_session_update_count);
            b[at + 17] = (u8::from(entry.in_sync_when_failed) * ENTRY_IN_SYNC_WHEN_FAILED)
                | (u8::from(entry.partial_rebuild) * ENTRY_PARTIAL_REBUILD)
                | (u8::from(entry.replacing.is_some()) * ENTRY_REPLACING);
            put_u16(&mut b, at + 18, entry.replacing.unwrap_or(0));
        }
        put_u64(&mut b, MISSED_SINCE_OFFSET, self.missed_map_since_event);
        put_u64(&mut b, UPDATE_COUNT_OFFSET, self.update_count);
        put_u64(&mut b, SESSION_UPDATE_COUNT_OFFSET, self.session_update_count);
        let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    /// Decode and validate one copy. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() < SUPERBLOCK_BYTES {
            return Err(FormatError::Truncated { len_bytes: bytes.len() });
        }
        let b = &bytes[..SUPERBLOCK_BYTES];
        if b[0..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::NoMagic);
        }
        let stored = get_u32(b, CRC_OFFSET);
        let computed = crc32c::crc32c(&b[..CRC_OFFSET]);
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        let version = get_u32(b, 8);
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion { version });
        }
        if get_u32(b, 12) != u32::try_from(SUPERBLOCK_BYTES).expect("4096") {
            return Err(FormatError::Invalid { what: "header size" });
        }
        let incompat = get_u32(b, 16);
        if incompat != 0 {
            return Err(FormatError::UnsupportedFeatures { flags: incompat });
        }
        let name_bytes = &b[40..40 + NAME_BYTES_MAX];
        let name_len = name_bytes.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES_MAX);
        let array_name = std::str::from_utf8(&name_bytes[..name_len])
            .map_err(|_| FormatError::Invalid { what: "array name is not UTF-8" })?
            .to_string();
        if name_bytes[name_len..].iter().any(|&c| c != 0) {
            return Err(FormatError::Invalid { what: "array name padding" });
        }
        let level = Level::from_code(b[120]).ok_or(FormatError::Invalid { what: "RAID level" })?;
        if usize::from(b[121]) != level.parity_chunks() {
            return Err(FormatError::Invalid { what: "parity count disagrees with the level" });
        }
        let member_count = get_u16(b, 122);
        if usize::from(member_count) > MEMBERS_MAX {
            return Err(FormatError::Invalid { what: "member count" });
        }
        let state = match b[152] {
            0 => ArrayState::Clean,
            1 => ArrayState::Dirty,
            _ => return Err(FormatError::Invalid { what: "array state" }),
        };
        let mut members = Vec::with_capacity(usize::from(member_count));
        let mut spares = Vec::new();
        let mut table_ended = false;
        for i in 0..MEMBERS_MAX {
            let at = MEMBER_TABLE_OFFSET + i * MEMBER_ENTRY_BYTES;
            let state = MemberState::from_code(b[at + 16])
                .ok_or(FormatError::Invalid { what: "member state" })?;
            let flags = b[at + 17];
            if flags & !(ENTRY_IN_SYNC_WHEN_FAILED | ENTRY_PARTIAL_REBUILD | ENTRY_REPLACING) != 0 {
                return Err(FormatError::Invalid { what: "member entry flags" });
            }
            let replaced_role = get_u16(b, at + 18);
            if flags & ENTRY_REPLACING == 0 && replaced_role != 0 {
                return Err(FormatError::Invalid { what: "member entry reserved bytes" });
            }
            let entry = MemberEntry {
                uuid: Uuid(b[at..at + 16].try_into().expect("16 bytes")),
                state,
                errors_corrected: get_u32(b, at + 20),
                failed_at_event: get_u64(b, at + 24),
                failed_session_update_count: get_u64(b, at + 32),
                in_sync_when_failed: flags & ENTRY_IN_SYNC_WHEN_FAILED != 0,
                partial_rebuild: flags & ENTRY_PARTIAL_REBUILD != 0,
                replacing: (flags & ENTRY_REPLACING != 0).then_some(replaced_role),
            };
            if i < usize::from(member_count) {
                members.push(entry);
            } else if entry.state == MemberState::Spare && !table_ended {
                spares.push(entry);
            } else if entry == MemberEntry::EMPTY {
                table_ended = true;
            } else {
                return Err(FormatError::Invalid { what: "member table entry past the spares" });
            }
        }
        let sb = Superblock {
            array_uuid: Uuid(b[24..40].try_into().expect("16 bytes")),
            array_name,
            created_at_unix_seconds: get_u64(b, 104),
            event: get_u64(b, 112),
            level,
            member_count,
            chunk_bytes: get_u32(b, 124),
            data_offset_bytes: get_u64(b, 128),
            member_data_bytes: get_u64(b, 136),
            state,
            this_role: get_u16(b, 154),
            this_uuid: Uuid(b[156..172].try_into().expect("16 bytes")),
            member_size_bytes: get_u64(b, 224),
            bitmap_offset_bytes: get_u64(b, 176),
            bitmap_region_bytes: get_u64(b, 184),
            bitmap_shards: get_u32(b, 192),
            init_state: get_u64(b, 200),
            rebuild_cursor_stripes: get_u64(b, 208),
            rebuild_role: get_u16(b, 216),
            tunables: Tunables::decode(b),
            members,
            spares,
            missed_map_since_event: get_u64(b, MISSED_SINCE_OFFSET),
            update_count: get_u64(b, UPDATE_COUNT_OFFSET),
            session_update_count: get_u64(b, SESSION_UPDATE_COUNT_OFFSET),
        };
        sb.validate()?;
        if get_u64(b, 144) != sb.geometry().array_bytes() {
            return Err(FormatError::Invalid { what: "array size disagrees with the geometry" });
        }
        Ok(sb)
    }
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
