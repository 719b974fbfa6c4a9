//! `Superblock::decode` on arbitrary bytes: it never panics, and what it accepts survives the
//! round trip `decode(encode(sb)) == sb` and is exactly what `encode` writes back, byte for
//! byte, apart from the bytes docs/on-disk-format.md marks reserved (and so the checksum).
//!
//! Each input is decoded twice: as given (random bytes almost never carry a valid CRC32C, so
//! this covers the length, magic and checksum checks) and with its checksum recomputed, so
//! that mutations reach the version, feature and cross-field checks behind the checksum.

#![no_main]

use flashraid_format::superblock::{SUPERBLOCK_BYTES, Superblock};
use libfuzzer_sys::fuzz_target;

const CRC_OFFSET: usize = SUPERBLOCK_BYTES - 4;
const MEMBER_TABLE_OFFSET: usize = 256;
const MEMBER_TABLE_END: usize = MEMBER_TABLE_OFFSET + 64 * MEMBER_ENTRY_BYTES;
const MEMBER_ENTRY_BYTES: usize = 48;

fuzz_target!(|data: &[u8]| {
    check_decode(data);
    if data.len() >= SUPERBLOCK_BYTES {
        let mut fixed = data[..SUPERBLOCK_BYTES].to_vec();
        let crc = crc32c::crc32c(&fixed[..CRC_OFFSET]);
        fixed[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        check_decode(&fixed);
    }
});

fn check_decode(bytes: &[u8]) {
    let Ok(sb) = Superblock::decode(bytes) else { return };
    let image = sb.encode();
    assert_eq!(Superblock::decode(&image), Ok(sb), "decode(encode(sb)) != sb");
    for (at, (&read, &written)) in bytes[..SUPERBLOCK_BYTES].iter().zip(&image).enumerate() {
        if !is_reserved(at) {
            assert_eq!(read, written, "byte {at}: decoded {read:#04x}, re-encoded {written:#04x}");
        }
    }
}

/// Bytes the version 1 decoder does not read (docs/on-disk-format.md, "reserved"), and the
/// checksum, which covers them.
fn is_reserved(at: usize) -> bool {
    if (MEMBER_TABLE_OFFSET..MEMBER_TABLE_END).contains(&at) {
        let in_entry = (at - MEMBER_TABLE_OFFSET) % MEMBER_ENTRY_BYTES;
        return (17..20).contains(&in_entry) || (32..48).contains(&in_entry);
    }
    matches!(at, 20..24 | 153 | 172..176 | 196..200 | 218..224 | 232..256)
        || (MEMBER_TABLE_END..SUPERBLOCK_BYTES).contains(&at)
}
