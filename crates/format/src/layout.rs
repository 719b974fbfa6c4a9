//! Where things live on one member.
//!
//! ```text
//! offset 0            superblock copy 0 (4 KiB)
//! 4 KiB .. 64 KiB     reserved, zero
//! 64 KiB              write-intent bitmap: SHARDS_MAX blocks of 4 KiB, one per shard section
//! 320 KiB             missed-write map: SHARDS_MAX blocks of 4 KiB, one per shard section
//! 576 KiB .. 1 MiB    reserved, zero
//! 1 MiB               data area: member_data_bytes (whole chunks)
//! ...                 unused tail
//! end - 4 KiB         superblock copy 1 (the last whole 4 KiB block of the member)
//! ```
//!
//! Why two copies at opposite ends: a torn superblock write damages one copy only (they are
//! written one after the other), and something that overwrites the head of a member (a
//! partition tool, a stray mkfs) leaves copy 1 to identify it.

use crate::bitmap::BITMAP_AREA_BYTES;
use crate::superblock::SUPERBLOCK_BYTES;

/// Offset of superblock copy 0.
pub const SUPERBLOCK_COPY0_OFFSET_BYTES: u64 = 0;
/// Offset of the write-intent bitmap area.
pub const BITMAP_OFFSET_BYTES: u64 = 64 << 10;
/// Offset of the data area (version 1 always uses 1 MiB: aligned for every device).
pub const DATA_OFFSET_BYTES: u64 = 1 << 20;

const _: () = assert!(BITMAP_OFFSET_BYTES + BITMAP_AREA_BYTES <= DATA_OFFSET_BYTES);

/// Offset of superblock copy 1 on a member of `member_size_bytes`: its last whole 4 KiB block.
/// `None` if the member is too small to hold both copies and a data area.
pub fn superblock_copy1_offset(member_size_bytes: u64) -> Option<u64> {
    let block = SUPERBLOCK_BYTES as u64;
    let aligned = member_size_bytes - member_size_bytes % block;
    aligned.checked_sub(block).filter(|&offset| offset > DATA_OFFSET_BYTES)
}

/// Bytes a member of `member_size_bytes` offers to the data area (before rounding to chunks).
pub fn member_data_capacity(member_size_bytes: u64) -> Option<u64> {
    superblock_copy1_offset(member_size_bytes).map(|copy1| copy1 - DATA_OFFSET_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy1_is_the_last_whole_block() {
        assert_eq!(superblock_copy1_offset(8 << 20), Some((8 << 20) - 4096));
        assert_eq!(superblock_copy1_offset((8 << 20) + 1000), Some((8 << 20) - 4096));
        assert_eq!(superblock_copy1_offset(1 << 20), None);
        assert_eq!(member_data_capacity(8 << 20), Some((7 << 20) - 4096));
    }
}
