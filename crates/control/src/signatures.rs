//! Recognising devices that hold someone's data, so `create` refuses them without `--force`.
//!
//! Checked: flashraid superblocks (either copy), MBR and GPT partition tables, ext2/3/4, XFS,
//! btrfs, F2FS, Linux md superblocks (0.90, 1.0, 1.1, 1.2), LVM2 physical volumes, LUKS,
//! bcache cache and backing devices, swap, and ZFS vdev labels. A device with none of these is not proven empty, only unrecognised; the
//! list covers what an operator is most likely to point `create` at by mistake.

use crate::MetaDevice;
use flashraid_format::superblock::{SUPERBLOCK_MAGIC, Superblock};
use flashraid_iobuf::IoBuf;
use std::fmt;

/// Something recognised on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signature {
    Flashraid { array: String },
    PartitionTable(&'static str),
    Filesystem(&'static str),
    Md,
    Lvm,
    Luks,
    Bcache,
    Swap,
    Zfs,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signature::Flashraid { array } => write!(f, "a member of flashraid array {array}"),
            Signature::PartitionTable(kind) => write!(f, "a {kind} partition table"),
            Signature::Filesystem(kind) => write!(f, "a {kind} filesystem"),
            Signature::Md => f.write_str("a Linux md RAID superblock"),
            Signature::Lvm => f.write_str("an LVM2 physical volume"),
            Signature::Luks => f.write_str("a LUKS encrypted volume"),
            Signature::Bcache => f.write_str("a bcache cache or backing device"),
            Signature::Swap => f.write_str("Linux swap space"),
            Signature::Zfs => f.write_str("a ZFS vdev label"),
        }
    }
}

const HEAD_BYTES: usize = 128 << 10;

/// bcache's superblock magic (`BCACHE_MAGIC` in the kernel's bcache.h).
const BCACHE_MAGIC: [u8; 16] = [
    0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d, 0x81,
];

/// Look at the head and the tail of a device for known signatures.
pub fn detect_signature(device: &dyn MetaDevice) -> Option<Signature> {
    let size = device.size_bytes();
    let head_len = usize::try_from(size.min(HEAD_BYTES as u64)).ok()? / 4096 * 4096;
    if head_len == 0 {
        return None;
    }
    let mut head = IoBuf::new(HEAD_BYTES);
    if device.read_at(&mut head.as_mut_slice()[..head_len], 0).is_err() {
        return None;
    }
    let h = &head.as_slice()[..head_len];
    let at = |offset: usize, magic: &[u8]| h.get(offset..offset + magic.len()) == Some(magic);
    if at(0, &SUPERBLOCK_MAGIC) {
        let array = Superblock::decode(&h[..4096])
            .map(|sb| sb.array_name)
            .unwrap_or_else(|e| format!("(damaged superblock: {e})"));
        return Some(Signature::Flashraid { array });
    }
    if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        return Some(Signature::PartitionTable("GPT"));
    }
    if at(0, b"XFSB") {
        return Some(Signature::Filesystem("XFS"));
    }
    if at(1080, &[0x53, 0xef]) {
        return Some(Signature::Filesystem("ext2/3/4"));
    }
    if at(65600, b"_BHRfS_M") {
        return Some(Signature::Filesystem("btrfs"));
    }
    // F2FS, the flash file system: its superblock magic 0xF2F52010 at 1 KiB.
    if at(1024, &0xf2f5_2010_u32.to_le_bytes()) {
        return Some(Signature::Filesystem("F2FS"));
    }
    // bcache: the superblock at 4 KiB carries its 16-byte magic at offset 24.
    if at(4096 + 24, &BCACHE_MAGIC) {
        return Some(Signature::Bcache);
    }
    let md_magic = 0xa92b_4efc_u32.to_le_bytes();
    if at(0, &md_magic) || at(4096, &md_magic) {
        return Some(Signature::Md);
    }
    if at(512, b"LABELONE") || at(0, b"LABELONE") {
        return Some(Signature::Lvm);
    }
    if at(0, b"LUKS\xba\xbe") {
        return Some(Signature::Luks);
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Some(Signature::Swap);
    }
    // ZFS labels start at 0 and 256 KiB; the uberblock ring (at 128 KiB in each label) is
    // past our head window, but the label's nvlist of the pool begins at 16 KiB with an XDR
    // header whose first bytes are fixed (encoding 1, endian 1).
    if at(16 << 10, &[1, 1, 0, 0]) && h.get((16 << 10) + 4..(16 << 10) + 8) == Some(&[0, 0, 0, 0]) {
        return Some(Signature::Zfs);
    }
    if h[510] == 0x55 && h[511] == 0xaa {
        return Some(Signature::PartitionTable("MBR (DOS)"));
    }
    // The tail: flashraid copy 1 and md 0.90/1.0 superblocks live near the end.
    tail_signature(device, size)
}

fn tail_signature(device: &dyn MetaDevice, size: u64) -> Option<Signature> {
    let block = 4096u64;
    let aligned = size - size % block;
    let mut buf = IoBuf::new(4096);
    let mut check = |offset: u64| -> Option<Signature> {
        device.read_at(buf.as_mut_slice(), offset).ok()?;
        let b = buf.as_slice();
        if b[..8] == SUPERBLOCK_MAGIC {
            let array = Superblock::decode(b)
                .map(|sb| sb.array_name)
                .unwrap_or_else(|e| format!("(damaged superblock: {e})"));
            return Some(Signature::Flashraid { array });
        }
        if b[..4] == 0xa92b_4efc_u32.to_le_bytes() {
            return Some(Signature::Md);
        }
        None
    };
    // flashraid copy 1: the last whole block. md 1.0: 8 KiB from the end (4 KiB aligned).
    // md 0.90: the last 64 KiB-aligned 64 KiB block.
    let md090 = (size & !(64 * 1024 - 1)).checked_sub(64 * 1024);
    [aligned.checked_sub(block), aligned.checked_sub(2 * block), md090]
        .into_iter()
        .flatten()
        .find_map(&mut check)
}
