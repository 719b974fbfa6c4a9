//! `BitmapBlock::decode` on arbitrary bytes: the first 16 input bytes (when there are 16) are
//! the expected array UUID, the rest is the block. It never panics; what it accepts survives
//! `decode(encode(block)) == block` and re-encodes to the same bytes, apart from the reserved
//! bytes 52..60 (and so the checksum).
//!
//! Each input is decoded twice: as given and with its checksum recomputed, so that mutations
//! reach the checks behind the checksum.

#![no_main]

use flashraid_format::Uuid;
use flashraid_format::bitmap::{BITMAP_BLOCK_BYTES, BitmapBlock};
use libfuzzer_sys::fuzz_target;

const CRC_OFFSET: usize = 60;
const HEADER_BYTES: usize = 64;
/// Reserved bytes, and the checksum that covers them.
const NOT_COMPARED: std::ops::Range<usize> = 52..HEADER_BYTES;

fuzz_target!(|data: &[u8]| {
    let (uuid, block) = match data.split_first_chunk::<16>() {
        Some((uuid, block)) => (Uuid(*uuid), block),
        None => (Uuid::NIL, data),
    };
    check_decode(block, uuid);
    if block.len() >= BITMAP_BLOCK_BYTES {
        let mut fixed = block[..BITMAP_BLOCK_BYTES].to_vec();
        let head = crc32c::crc32c(&fixed[..CRC_OFFSET]);
        let crc = crc32c::crc32c_append(head, &fixed[HEADER_BYTES..]);
        fixed[CRC_OFFSET..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        check_decode(&fixed, uuid);
    }
});

fn check_decode(bytes: &[u8], uuid: Uuid) {
    let Ok(block) = BitmapBlock::decode(bytes, uuid) else { return };
    assert_eq!(block.array_uuid, uuid, "accepted a block of another array");
    let image = block.encode();
    assert_eq!(BitmapBlock::decode(&image, uuid), Ok(block.clone()), "round trip");
    for (at, (&read, &written)) in bytes[..BITMAP_BLOCK_BYTES].iter().zip(&image).enumerate() {
        if !NOT_COMPARED.contains(&at) {
            assert_eq!(read, written, "byte {at}: decoded {read:#04x}, re-encoded {written:#04x}");
        }
    }
    // Every set bit lies below the region count, and is_set agrees with the bytes.
    for region in block.set_regions() {
        assert!(region < block.region_count);
        let r = usize::try_from(region).expect("u32 fits usize");
        assert_ne!(bytes[HEADER_BYTES + r / 8] & (1 << (r % 8)), 0);
    }
}
