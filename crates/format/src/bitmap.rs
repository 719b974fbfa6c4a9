//! The write-intent bitmap's on-disk blocks.
//!
//! Owns: the encoding of one bitmap block and the choice of region size. The bitmap area holds
//! [`SHARDS_MAX`] blocks of 4 KiB; block `s` belongs to engine shard `s`, which alone writes
//! it, so shards never share a bitmap block (no lock between cores). Bit `r` of a shard's block
//! set means "shard s may have writes in flight in region r": member offsets
//! `[r * region_bytes, (r + 1) * region_bytes)` of the data area. After an unclean shutdown the
//! regions set in any shard's block, on any member, are resynced.
//!
//! Layout of a block (little-endian):
//!
//! ```text
//! 0   8  magic "FRBITMAP"
//! 8   4  version (1)
//! 12  2  shard index
//! 14  2  shard count the bitmap was written with
//! 16  8  sequence: bumped on every write of this block
//! 24  8  region bytes
//! 32  4  region count
//! 36  16 array UUID
//! 52  8  reserved, zero
//! 60  4  CRC32C of bytes 0..60 and 64..4096
//! 64  4032 bits, least significant bit first: bit r = byte r/8, bit r%8
//! ```
//!
//! The missed-write map uses the same block format with the magic "FRMISSED", in its own area
//! right after the bitmap area (block `s` again belongs to shard `s`). Bit `r` set means
//! "shard s wrote region r while some role was out of service": a member that failed while
//! in sync and comes back needs only those regions rebuilt. Its bits are set when a
//! write-intent bit is cleared while a role is out of service, and reach the disk before the
//! cleared write-intent bit does, so every region a returning member may have missed is
//! named by one map or the other.
//!
//! Fault model: a torn block fails its checksum; the reader then treats every region as dirty
//! (a full resync costs time, never data), or as missed (a full rebuild).

use crate::superblock::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::{FormatError, Uuid};

/// Bytes of one bitmap block.
pub const BITMAP_BLOCK_BYTES: usize = 4096;
/// Shard sections in the bitmap area: the most cores one array's engine can use.
pub const SHARDS_MAX: u32 = 64;
/// Bytes of the whole bitmap area.
pub const BITMAP_AREA_BYTES: u64 = SHARDS_MAX as u64 * BITMAP_BLOCK_BYTES as u64;
/// Bytes of header before the bits.
const HEADER_BYTES: usize = 64;
/// Regions one block (and so one array) can track.
pub const REGIONS_PER_BLOCK_MAX: usize = (BITMAP_BLOCK_BYTES - HEADER_BYTES) * 8;
/// Smallest region: finer tracking would cost bitmap writes for little resync saved.
pub const REGION_BYTES_MIN: u64 = 1 << 20;
const MAGIC: [u8; 8] = *b"FRBITMAP";
const MISSED_MAGIC: [u8; 8] = *b"FRMISSED";
/// Offset of the missed-write map area (right after the bitmap area; same size).
pub const MISSED_MAP_OFFSET_BYTES: u64 = crate::layout::BITMAP_OFFSET_BYTES + BITMAP_AREA_BYTES;
const _: () =
    assert!(MISSED_MAP_OFFSET_BYTES + BITMAP_AREA_BYTES <= crate::layout::DATA_OFFSET_BYTES);

/// Which map a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitmapKind {
    /// The write-intent bitmap: regions that may have writes in flight.
    WriteIntent,
    /// The missed-write map: regions written while some role was out of service.
    Missed,
}

impl BitmapKind {
    fn magic(self) -> [u8; 8] {
        match self {
            BitmapKind::WriteIntent => MAGIC,
            BitmapKind::Missed => MISSED_MAGIC,
        }
    }
}
const VERSION: u32 = 1;
const CRC_OFFSET: usize = 60;

/// The region size for a data area: the smallest power of two of at least 1 MiB and one
/// chunk that needs no more than [`REGIONS_PER_BLOCK_MAX`] regions.
pub fn default_region_bytes(member_data_bytes: u64, chunk_bytes: u32) -> u64 {
    let mut region = REGION_BYTES_MIN.max(u64::from(chunk_bytes));
    while member_data_bytes.div_ceil(region) > REGIONS_PER_BLOCK_MAX as u64 {
        region *= 2;
    }
    region
}

/// One shard's bitmap block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapBlock {
    pub kind: BitmapKind,
    pub array_uuid: Uuid,
    pub shard: u16,
    pub shard_count: u16,
    pub sequence: u64,
    pub region_bytes: u64,
    pub region_count: u32,
    bits: Vec<u8>,
}

impl BitmapBlock {
    /// An all-clear write-intent block.
    pub fn new(
        array_uuid: Uuid,
        shard: u16,
        shard_count: u16,
        region_bytes: u64,
        region_count: u32,
    ) -> Self {
        Self::new_kind(
            BitmapKind::WriteIntent,
            array_uuid,
            shard,
            shard_count,
            region_bytes,
            region_count,
        )
    }

    /// An all-clear block of either map.
    pub fn new_kind(
        kind: BitmapKind,
        array_uuid: Uuid,
        shard: u16,
        shard_count: u16,
        region_bytes: u64,
        region_count: u32,
    ) -> Self {
        assert!(usize::try_from(region_count).is_ok_and(|c| c <= REGIONS_PER_BLOCK_MAX));
        assert!(u32::from(shard) < u32::from(shard_count) && u32::from(shard_count) <= SHARDS_MAX);
        Self {
            kind,
            array_uuid,
            shard,
            shard_count,
            sequence: 0,
            region_bytes,
            region_count,
            bits: vec![0u8; BITMAP_BLOCK_BYTES - HEADER_BYTES],
        }
    }

    pub fn is_set(&self, region: u32) -> bool {
        assert!(region < self.region_count);
        let r = usize::try_from(region).expect("u32 fits usize");
        self.bits[r / 8] & (1 << (r % 8)) != 0
    }

    pub fn set(&mut self, region: u32, value: bool) {
        assert!(region < self.region_count);
        let r = usize::try_from(region).expect("u32 fits usize");
        if value {
            self.bits[r / 8] |= 1 << (r % 8);
        } else {
            self.bits[r / 8] &= !(1 << (r % 8));
        }
    }

    /// Regions whose bit is set, ascending.
    pub fn set_regions(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.region_count).filter(|&r| self.is_set(r))
    }

    pub fn encode(&self) -> [u8; BITMAP_BLOCK_BYTES] {
        let mut b = [0u8; BITMAP_BLOCK_BYTES];
        b[0..8].copy_from_slice(&self.kind.magic());
        put_u32(&mut b, 8, VERSION);
        put_u16(&mut b, 12, self.shard);
        put_u16(&mut b, 14, self.shard_count);
        put_u64(&mut b, 16, self.sequence);
        put_u64(&mut b, 24, self.region_bytes);
        put_u32(&mut b, 32, self.region_count);
        b[36..52].copy_from_slice(&self.array_uuid.0);
        b[HEADER_BYTES..].copy_from_slice(&self.bits);
        let crc = checksum(&b);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    /// Decode a block and check it belongs to `array_uuid`. Never panics.
    pub fn decode(bytes: &[u8], array_uuid: Uuid) -> Result<Self, FormatError> {
        if bytes.len() < BITMAP_BLOCK_BYTES {
            return Err(FormatError::Truncated { len_bytes: bytes.len() });
        }
        let b = &bytes[..BITMAP_BLOCK_BYTES];
        let kind = if b[0..8] == MAGIC {
            BitmapKind::WriteIntent
        } else if b[0..8] == MISSED_MAGIC {
            BitmapKind::Missed
        } else {
            return Err(FormatError::NoMagic);
        };
        let stored = get_u32(b, CRC_OFFSET);
        let computed = checksum(b);
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion { version });
        }
        let block = Self {
            kind,
            array_uuid: Uuid(b[36..52].try_into().expect("16 bytes")),
            shard: get_u16(b, 12),
            shard_count: get_u16(b, 14),
            sequence: get_u64(b, 16),
            region_bytes: get_u64(b, 24),
            region_count: get_u32(b, 32),
            bits: b[HEADER_BYTES..].to_vec(),
        };
        if block.array_uuid != array_uuid {
            return Err(FormatError::Invalid { what: "bitmap block of another array" });
        }
        let count_ok =
            usize::try_from(block.region_count).is_ok_and(|c| c <= REGIONS_PER_BLOCK_MAX);
        let shard_ok =
            block.shard < block.shard_count && u32::from(block.shard_count) <= SHARDS_MAX;
        if !count_ok || !shard_ok || !block.region_bytes.is_power_of_two() {
            return Err(FormatError::Invalid { what: "bitmap block header" });
        }
        // Bits past the region count must be clear, or the block was not written by us.
        let tail_dirty = (block.region_count as usize..REGIONS_PER_BLOCK_MAX)
            .any(|r| block.bits[r / 8] & (1 << (r % 8)) != 0);
        if tail_dirty {
            return Err(FormatError::Invalid { what: "bitmap bits past the region count" });
        }
        Ok(block)
    }
}

fn checksum(block: &[u8]) -> u32 {
    let head = crc32c::crc32c(&block[..CRC_OFFSET]);
    crc32c::crc32c_append(head, &block[HEADER_BYTES..BITMAP_BLOCK_BYTES])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let uuid = Uuid([7; 16]);
        let mut block = BitmapBlock::new(uuid, 1, 2, 1 << 20, 1000);
        block.set(0, true);
        block.set(999, true);
        block.set(500, true);
        block.set(500, false);
        block.sequence = 42;
        let bytes = block.encode();
        let back = BitmapBlock::decode(&bytes, uuid).unwrap();
        assert_eq!(back, block);
        assert_eq!(back.set_regions().collect::<Vec<_>>(), vec![0, 999]);
        let mut torn = bytes;
        torn[100] ^= 1;
        assert!(matches!(BitmapBlock::decode(&torn, uuid), Err(FormatError::Checksum { .. })));
        assert!(BitmapBlock::decode(&bytes, Uuid([8; 16])).is_err());
        let mut missed = BitmapBlock::new_kind(BitmapKind::Missed, uuid, 0, 1, 1 << 20, 10);
        missed.set(3, true);
        let back = BitmapBlock::decode(&missed.encode(), uuid).unwrap();
        assert_eq!(back.kind, BitmapKind::Missed);
        assert_eq!(back, missed);
    }

    #[test]
    fn the_missed_map_area_lies_between_the_bitmap_and_the_data() {
        assert_eq!(MISSED_MAP_OFFSET_BYTES, 320 << 10);
    }

    #[test]
    fn region_size_fits_one_block() {
        assert_eq!(default_region_bytes(64 << 20, 16384), 1 << 20);
        let huge = 16u64 << 40;
        let region = default_region_bytes(huge, 16384);
        assert!(huge.div_ceil(region) <= REGIONS_PER_BLOCK_MAX as u64);
        assert!(huge.div_ceil(region / 2) > REGIONS_PER_BLOCK_MAX as u64);
        assert_eq!(default_region_bytes(1 << 20, 1 << 20), 1 << 20);
    }
}
