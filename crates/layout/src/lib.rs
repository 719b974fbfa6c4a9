//! flashraid geometry: where every byte of an array lives on its members.
//!
//! Owns: the RAID levels, the stripe shape, parity rotation, and the address newtypes. Pure
//! arithmetic: no IO, no clock, no allocation on the mapping paths.
//!
//! The model. Every member's data area is cut into chunks of `chunk_bytes`; chunk row `s` of
//! every member forms stripe `s` (so a stripe occupies the same member offset on every member).
//! A stripe holds `data_chunks()` data chunks, numbered by their *data index* (the index that
//! also weights Q and R in the parity code), plus parity chunks or mirror copies:
//!
//! | level | data chunks k | per stripe | placement |
//! |---|---|---|---|
//! | raid0 | n | data only | data index i on member i |
//! | raid1 | 1 | n copies | every member holds the chunk |
//! | raid10 | n/2 | 2 copies each | data index i on members 2i and 2i+1 ("near 2", n even) |
//! | raid5 | n-1 | P | left-symmetric, as md's default |
//! | raid6 | n-2 | P, Q | left-symmetric, as md's default |
//! | raid7.3 | n-3 | P, Q, R | left-symmetric, R after Q |
//!
//! Left-symmetric rotation: in stripe s the first parity chunk (P) is on member
//! `p = n - 1 - (s mod n)`, parity row r on `(p + r) mod n`, and data index i on
//! `(p + m + i) mod n` where m is the parity count. For raid5 and raid6 this is exactly md's
//! ALGORITHM_LEFT_SYMMETRIC, so each stripe's parity rotates across all members.
//!
//! Invariants (exhaustively tested for small geometries): the map from (stripe, data index,
//! copy) and (stripe, parity row) to (member, member offset) is a bijection onto the members'
//! data areas; array offsets map one-to-one onto (stripe, data index, offset in chunk).
//!
//! Limits: 2..=64 members, chunk sizes powers of two from 4 KiB to 1 MiB, array IO in whole
//! 4 KiB blocks.

#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// The array's logical block: every array offset and length is a multiple of it.
pub const BLOCK_BYTES: u64 = 4096;
/// Smallest chunk.
pub const CHUNK_BYTES_MIN: u32 = 4096;
/// Largest chunk.
pub const CHUNK_BYTES_MAX: u32 = 1 << 20;
/// The default chunk: what the fastest NVMe arrays use for random IO.
pub const CHUNK_BYTES_DEFAULT: u32 = 16 << 10;
/// Most members in one array.
pub const MEMBERS_MAX: usize = 64;
/// Largest array and member data area: offsets must fit in a signed 64-bit file offset
/// (`off_t`) with any request length added, so capacity is capped at 2^62 bytes (4 EiB).
pub const ARRAY_BYTES_MAX: u64 = 1 << 62;
/// Most parity chunks per stripe (raid7.3).
pub const PARITY_CHUNKS_MAX: usize = 3;

const _: () = assert!(CHUNK_BYTES_MIN as u64 == BLOCK_BYTES);
const _: () = assert!(MEMBERS_MAX <= u16::MAX as usize);

/// An offset in the array's address space (what users read and write), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ArrayOffset(pub u64);

/// An offset within one member's data area (not counting the metadata before it), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemberOffset(pub u64);

/// A member's position in the array (its role slot), 0..member_count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemberIndex(pub u16);

impl MemberIndex {
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

/// A stripe: chunk row `s` of every member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StripeIndex(pub u64);

/// A RAID level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
    /// Triple parity (P, Q, R): survives any three member failures.
    Raid7_3,
}

impl Level {
    pub const ALL: [Level; 6] =
        [Level::Raid0, Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6, Level::Raid7_3];

    pub fn name(self) -> &'static str {
        match self {
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid10 => "raid10",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid7_3 => "raid7.3",
        }
    }

    /// Parity chunks per stripe.
    pub fn parity_chunks(self) -> usize {
        match self {
            Level::Raid0 | Level::Raid1 | Level::Raid10 => 0,
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            Level::Raid7_3 => 3,
        }
    }

    /// Fewest members the level accepts.
    pub fn members_min(self) -> usize {
        match self {
            Level::Raid0 | Level::Raid1 => 2,
            Level::Raid5 => 3,
            Level::Raid10 | Level::Raid6 => 4,
            Level::Raid7_3 => 5,
        }
    }

    /// The level's code in the superblock.
    pub fn code(self) -> u8 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid7_3 => 73,
        }
    }

    pub fn from_code(code: u8) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.code() == code)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bare = text.strip_prefix("raid").unwrap_or(text);
        Level::ALL.into_iter().find(|l| l.name().strip_prefix("raid") == Some(bare)).ok_or_else(
            || format!("unknown RAID level {text:?}; expected one of 0, 1, 10, 5, 6, 7.3"),
        )
    }
}

/// Why a geometry is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{level} needs at least {min} members, got {count}")]
    TooFewMembers { level: Level, min: usize, count: usize },
    #[error("{count} members: at most {MEMBERS_MAX} are supported")]
    TooManyMembers { count: usize },
    #[error("raid10 needs an even number of members, got {count}")]
    OddRaid10 { count: usize },
    #[error(
        "chunk size {chunk_bytes} B: must be a power of two from {CHUNK_BYTES_MIN} to {CHUNK_BYTES_MAX}"
    )]
    ChunkSize { chunk_bytes: u64 },
    #[error("members hold {member_data_bytes} B of data each, less than one {chunk_bytes} B chunk")]
    TooSmall { member_data_bytes: u64, chunk_bytes: u32 },
    #[error("array or member data area larger than {ARRAY_BYTES_MAX} B")]
    TooLarge,
}

/// Where an array byte lives: stripe, data index within the stripe, offset within the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    pub stripe: StripeIndex,
    pub data_index: usize,
    pub offset_in_chunk_bytes: u32,
}

/// What a member's chunk is in one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Data chunk `index`; `copy` distinguishes mirrors (always 0 for raid0 and parity levels).
    Data { index: usize, copy: usize },
    /// Parity row `row` (0 = P, 1 = Q, 2 = R).
    Parity { row: usize },
}

/// One piece of an array range that lies within a single chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub location: Location,
    pub len_bytes: u32,
    /// Offset of this piece from the start of the range it was cut from.
    pub range_offset_bytes: u64,
}

/// The shape of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    level: Level,
    member_count: u16,
    chunk_bytes: u32,
    stripes: u64,
}

impl Geometry {
    /// A geometry whose members each offer `member_data_bytes` for data (rounded down to whole
    /// chunks).
    pub fn new(
        level: Level,
        member_count: usize,
        chunk_bytes: u64,
        member_data_bytes: u64,
    ) -> Result<Self, LayoutError> {
        if member_count > MEMBERS_MAX {
            return Err(LayoutError::TooManyMembers { count: member_count });
        }
        if member_count < level.members_min() {
            let min = level.members_min();
            return Err(LayoutError::TooFewMembers { level, min, count: member_count });
        }
        if level == Level::Raid10 && !member_count.is_multiple_of(2) {
            return Err(LayoutError::OddRaid10 { count: member_count });
        }
        let chunk = u32::try_from(chunk_bytes)
            .ok()
            .filter(|c| c.is_power_of_two() && (CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(c))
            .ok_or(LayoutError::ChunkSize { chunk_bytes })?;
        let stripes = member_data_bytes / u64::from(chunk);
        if stripes == 0 {
            return Err(LayoutError::TooSmall { member_data_bytes, chunk_bytes: chunk });
        }
        let member_count = u16::try_from(member_count).expect("checked against MEMBERS_MAX");
        let geometry = Self { level, member_count, chunk_bytes: chunk, stripes };
        let array_bytes = stripes
            .checked_mul(u64::from(chunk))
            .and_then(|b| b.checked_mul(geometry.data_chunks() as u64));
        if member_data_bytes > ARRAY_BYTES_MAX || array_bytes.is_none_or(|b| b > ARRAY_BYTES_MAX) {
            return Err(LayoutError::TooLarge);
        }
        Ok(geometry)
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn member_count(&self) -> usize {
        usize::from(self.member_count)
    }

    pub fn chunk_bytes(&self) -> u32 {
        self.chunk_bytes
    }

    /// Stripes in the array (chunk rows per member).
    pub fn stripes(&self) -> u64 {
        self.stripes
    }

    /// Data chunks per stripe (k).
    pub fn data_chunks(&self) -> usize {
        let n = self.member_count();
        match self.level {
            Level::Raid0 => n,
            Level::Raid1 => 1,
            Level::Raid10 => n / 2,
            level => n - level.parity_chunks(),
        }
    }

    /// Parity chunks per stripe (m).
    pub fn parity_chunks(&self) -> usize {
        self.level.parity_chunks()
    }

    /// Copies of each data chunk.
    pub fn copies(&self) -> usize {
        match self.level {
            Level::Raid1 => self.member_count(),
            Level::Raid10 => 2,
            _ => 1,
        }
    }

    /// Member failures every stripe survives.
    pub fn tolerance(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.member_count() - 1,
            Level::Raid10 => 1,
            level => level.parity_chunks(),
        }
    }

    /// Whether every stripe stays readable with the members marked in `failed` gone.
    /// (raid10 survives more than `tolerance()` failures when they hit different pairs.)
    pub fn survives(&self, failed: &[bool]) -> bool {
        assert_eq!(failed.len(), self.member_count());
        let failed_count = failed.iter().filter(|&&f| f).count();
        match self.level {
            Level::Raid0 => failed_count == 0,
            Level::Raid1 => failed_count < self.member_count(),
            Level::Raid10 => failed.chunks(2).all(|pair| !(pair[0] && pair[1])),
            level => failed_count <= level.parity_chunks(),
        }
    }

    /// Data bytes of one stripe.
    pub fn stripe_data_bytes(&self) -> u64 {
        u64::from(self.chunk_bytes) * self.data_chunks() as u64
    }

    /// Bytes of each member's data area the array uses.
    pub fn member_data_bytes(&self) -> u64 {
        self.stripes * u64::from(self.chunk_bytes)
    }

    /// The array's capacity in bytes.
    pub fn array_bytes(&self) -> u64 {
        self.stripes * self.stripe_data_bytes()
    }

    /// Where an array byte lives; `None` past the end.
    pub fn locate(&self, offset: ArrayOffset) -> Option<Location> {
        if offset.0 >= self.array_bytes() {
            return None;
        }
        let chunk = u64::from(self.chunk_bytes);
        let chunk_number = offset.0 / chunk;
        let k = self.data_chunks() as u64;
        Some(Location {
            stripe: StripeIndex(chunk_number / k),
            data_index: usize::try_from(chunk_number % k).expect("below data_chunks"),
            offset_in_chunk_bytes: u32::try_from(offset.0 % chunk).expect("below chunk_bytes"),
        })
    }

    /// The array offset of a location (inverse of [`Geometry::locate`]).
    pub fn array_offset(&self, location: Location) -> ArrayOffset {
        assert!(location.data_index < self.data_chunks());
        assert!(location.offset_in_chunk_bytes < self.chunk_bytes);
        let chunk_number =
            location.stripe.0 * self.data_chunks() as u64 + location.data_index as u64;
        ArrayOffset(
            chunk_number * u64::from(self.chunk_bytes) + u64::from(location.offset_in_chunk_bytes),
        )
    }

    /// Member offset of byte `offset_in_chunk_bytes` of stripe `stripe`'s chunks.
    pub fn member_offset(&self, stripe: StripeIndex, offset_in_chunk_bytes: u32) -> MemberOffset {
        assert!(stripe.0 < self.stripes && offset_in_chunk_bytes <= self.chunk_bytes);
        MemberOffset(stripe.0 * u64::from(self.chunk_bytes) + u64::from(offset_in_chunk_bytes))
    }

    /// The stripe that member offset `offset` belongs to.
    pub fn stripe_of(&self, offset: MemberOffset) -> StripeIndex {
        StripeIndex(offset.0 / u64::from(self.chunk_bytes))
    }

    /// Member of the first parity chunk (P) of a stripe, for parity levels.
    fn first_parity_member(&self, stripe: StripeIndex) -> usize {
        let n = u64::from(self.member_count);
        usize::try_from(n - 1 - stripe.0 % n).expect("below member_count")
    }

    /// Member holding copy `copy` of data index `data_index` in `stripe`.
    pub fn data_member(&self, stripe: StripeIndex, data_index: usize, copy: usize) -> MemberIndex {
        assert!(data_index < self.data_chunks() && copy < self.copies());
        let n = self.member_count();
        let member = match self.level {
            Level::Raid0 => data_index,
            Level::Raid1 => copy,
            Level::Raid10 => 2 * data_index + copy,
            level => (self.first_parity_member(stripe) + level.parity_chunks() + data_index) % n,
        };
        index(member)
    }

    /// Member holding parity row `row` of `stripe`.
    pub fn parity_member(&self, stripe: StripeIndex, row: usize) -> MemberIndex {
        assert!(row < self.parity_chunks(), "{} has no parity row {row}", self.level);
        index((self.first_parity_member(stripe) + row) % self.member_count())
    }

    /// What `member`'s chunk is in `stripe`.
    pub fn role(&self, stripe: StripeIndex, member: MemberIndex) -> Role {
        let n = self.member_count();
        let x = member.get();
        assert!(x < n);
        match self.level {
            Level::Raid0 => Role::Data { index: x, copy: 0 },
            Level::Raid1 => Role::Data { index: 0, copy: x },
            Level::Raid10 => Role::Data { index: x / 2, copy: x % 2 },
            level => {
                let m = level.parity_chunks();
                let distance = (x + n - self.first_parity_member(stripe)) % n;
                if distance < m {
                    Role::Parity { row: distance }
                } else {
                    Role::Data { index: distance - m, copy: 0 }
                }
            }
        }
    }

    /// Cut the array range `[offset, offset + len_bytes)` into pieces that each lie within one
    /// chunk, in array order. The range must be inside the array.
    pub fn segments(&self, offset: ArrayOffset, len_bytes: u64) -> Segments {
        assert!(offset.0.checked_add(len_bytes).is_some_and(|end| end <= self.array_bytes()));
        Segments { geometry: *self, next: offset.0, end: offset.0 + len_bytes, start: offset.0 }
    }
}

fn index(member: usize) -> MemberIndex {
    MemberIndex(u16::try_from(member).expect("members fit u16"))
}

/// Iterator from [`Geometry::segments`].
#[derive(Clone, Debug)]
pub struct Segments {
    geometry: Geometry,
    next: u64,
    end: u64,
    start: u64,
}

impl Iterator for Segments {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        if self.next >= self.end {
            return None;
        }
        let location = self.geometry.locate(ArrayOffset(self.next)).expect("inside the array");
        let room = u64::from(self.geometry.chunk_bytes - location.offset_in_chunk_bytes);
        let len = room.min(self.end - self.next);
        let segment = Segment {
            location,
            len_bytes: u32::try_from(len).expect("at most one chunk"),
            range_offset_bytes: self.next - self.start,
        };
        self.next += len;
        Some(segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Fuzz regression (router target): a member size near u64::MAX made `array_bytes`
    /// overflow. Capacities past ARRAY_BYTES_MAX are refused at construction.
    #[test]
    fn capacity_that_overflows_is_refused() {
        assert_eq!(Geometry::new(Level::Raid0, 64, 4096, u64::MAX), Err(LayoutError::TooLarge));
        assert_eq!(Geometry::new(Level::Raid6, 12, 1 << 20, 1 << 61), Err(LayoutError::TooLarge));
        let big = Geometry::new(Level::Raid1, 2, 4096, ARRAY_BYTES_MAX).unwrap();
        assert_eq!(big.array_bytes(), ARRAY_BYTES_MAX);
    }

    fn geometries() -> Vec<Geometry> {
        let mut all = vec![];
        for level in Level::ALL {
            for n in level.members_min()..=9 {
                if level == Level::Raid10 && n % 2 != 0 {
                    continue;
                }
                for chunk in [4096u64, 8192] {
                    all.push(Geometry::new(level, n, chunk, chunk * 11).unwrap());
                }
            }
        }
        all
    }

    /// Every (stripe, role) maps to a distinct (member, member offset) and every member chunk
    /// of every stripe has exactly one role: the layout is a bijection.
    #[test]
    fn placement_is_a_bijection() {
        for g in geometries() {
            let mut seen = HashSet::new();
            for s in 0..g.stripes() {
                let stripe = StripeIndex(s);
                for i in 0..g.data_chunks() {
                    for c in 0..g.copies() {
                        let member = g.data_member(stripe, i, c);
                        assert!(seen.insert((member, s)), "{g:?} stripe {s} data {i}.{c}");
                        assert_eq!(g.role(stripe, member), Role::Data { index: i, copy: c });
                    }
                }
                for r in 0..g.parity_chunks() {
                    let member = g.parity_member(stripe, r);
                    assert!(seen.insert((member, s)), "{g:?} stripe {s} parity {r}");
                    assert_eq!(g.role(stripe, member), Role::Parity { row: r });
                }
            }
            let member_chunks = g.member_count() as u64 * g.stripes();
            assert_eq!(seen.len() as u64, member_chunks, "{g:?}: every member chunk is used");
        }
    }

    #[test]
    fn array_offsets_round_trip_and_cover_the_capacity() {
        for g in geometries() {
            let mut seen = HashSet::new();
            for block in 0..g.array_bytes() / BLOCK_BYTES {
                let offset = ArrayOffset(block * BLOCK_BYTES);
                let location = g.locate(offset).unwrap();
                assert_eq!(g.array_offset(location), offset);
                let member = g.data_member(location.stripe, location.data_index, 0);
                let member_offset =
                    g.member_offset(location.stripe, location.offset_in_chunk_bytes);
                assert!(seen.insert((member, member_offset)), "{g:?} {offset:?} collides");
                assert_eq!(g.stripe_of(member_offset), location.stripe);
            }
            assert!(g.locate(ArrayOffset(g.array_bytes())).is_none());
            assert_eq!(g.array_bytes(), g.stripes() * g.stripe_data_bytes());
        }
    }

    #[test]
    fn parity_rotates_over_every_member() {
        for g in geometries().into_iter().filter(|g| g.parity_chunks() > 0) {
            let n = g.member_count() as u64;
            for r in 0..g.parity_chunks() {
                let members: HashSet<_> =
                    (0..n.min(g.stripes())).map(|s| g.parity_member(StripeIndex(s), r)).collect();
                assert_eq!(members.len() as u64, n.min(g.stripes()), "{g:?} row {r} repeats");
            }
        }
    }

    #[test]
    fn left_symmetric_matches_md() {
        // md raid5, 4 disks, ALGORITHM_LEFT_SYMMETRIC: stripe 0 = D0 D1 D2 P,
        // stripe 1 = D1 D2 P D0, stripe 2 = D2 P D0 D1, stripe 3 = P D0 D1 D2.
        let g = Geometry::new(Level::Raid5, 4, 4096, 4096 * 4).unwrap();
        let expect = ["D0 D1 D2 P", "D1 D2 P D0", "D2 P D0 D1", "P D0 D1 D2"];
        for (s, row) in expect.iter().enumerate() {
            let got: Vec<String> = (0..4)
                .map(|m| match g.role(StripeIndex(s as u64), MemberIndex(m)) {
                    Role::Data { index, .. } => format!("D{index}"),
                    Role::Parity { .. } => "P".to_string(),
                })
                .collect();
            assert_eq!(got.join(" "), *row, "stripe {s}");
        }
        // md raid6, 5 disks, ALGORITHM_LEFT_SYMMETRIC (pd = n-1-s%n, qd = pd+1 mod n,
        // data i at pd+2+i mod n): stripe 0 = Q D0 D1 D2 P, stripe 1 = D0 D1 D2 P Q.
        let g = Geometry::new(Level::Raid6, 5, 4096, 4096 * 5).unwrap();
        let name = |s: u64, m: u16| match g.role(StripeIndex(s), MemberIndex(m)) {
            Role::Data { index, .. } => format!("D{index}"),
            Role::Parity { row: 0 } => "P".into(),
            Role::Parity { .. } => "Q".into(),
        };
        let row = |s| (0..5).map(|m| name(s, m)).collect::<Vec<_>>().join(" ");
        assert_eq!(row(0), "Q D0 D1 D2 P");
        assert_eq!(row(1), "D0 D1 D2 P Q");
        assert_eq!(row(4), "P Q D0 D1 D2");
    }

    #[test]
    fn segments_split_at_chunk_boundaries() {
        let g = Geometry::new(Level::Raid6, 6, 16384, 16384 * 8).unwrap();
        let pieces: Vec<Segment> = g.segments(ArrayOffset(12288), 65536).collect();
        assert_eq!(pieces.iter().map(|p| u64::from(p.len_bytes)).sum::<u64>(), 65536);
        assert_eq!(pieces[0].len_bytes, 4096);
        assert_eq!(pieces[0].location.offset_in_chunk_bytes, 12288);
        assert!(pieces[1..].iter().all(|p| p.location.offset_in_chunk_bytes == 0));
        assert_eq!(pieces.last().unwrap().len_bytes, 12288);
        let mut expected_offset = 0;
        for p in &pieces {
            assert_eq!(p.range_offset_bytes, expected_offset);
            expected_offset += u64::from(p.len_bytes);
        }
    }

    #[test]
    fn survival_rules() {
        let g = Geometry::new(Level::Raid10, 4, 4096, 4096).unwrap();
        assert!(g.survives(&[true, false, false, true]));
        assert!(!g.survives(&[true, true, false, false]));
        let g = Geometry::new(Level::Raid6, 6, 4096, 4096).unwrap();
        assert!(g.survives(&[true, true, false, false, false, false]));
        assert!(!g.survives(&[true, true, true, false, false, false]));
        let g = Geometry::new(Level::Raid1, 3, 4096, 4096).unwrap();
        assert!(g.survives(&[true, true, false]));
        assert!(!g.survives(&[true, true, true]));
        let g = Geometry::new(Level::Raid0, 2, 4096, 4096).unwrap();
        assert!(!g.survives(&[false, true]));
    }

    #[test]
    fn bad_geometries_are_refused() {
        assert!(matches!(
            Geometry::new(Level::Raid6, 3, 16384, 1 << 20),
            Err(LayoutError::TooFewMembers { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid10, 5, 16384, 1 << 20),
            Err(LayoutError::OddRaid10 { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 12288, 1 << 20),
            Err(LayoutError::ChunkSize { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 2 << 20, 1 << 30),
            Err(LayoutError::ChunkSize { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 65, 16384, 1 << 20),
            Err(LayoutError::TooManyMembers { .. })
        ));
        assert!(matches!(
            Geometry::new(Level::Raid5, 4, 16384, 8192),
            Err(LayoutError::TooSmall { .. })
        ));
        assert_eq!("7.3".parse::<Level>().unwrap(), Level::Raid7_3);
        assert_eq!("raid10".parse::<Level>().unwrap(), Level::Raid10);
        assert!("raid4".parse::<Level>().is_err());
        for level in Level::ALL {
            assert_eq!(Level::from_code(level.code()), Some(level));
        }
    }
}
