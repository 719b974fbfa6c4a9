//! `create` must refuse devices holding someone's data: each recognised signature, planted
//! where its tool writes it, is detected; a blank device is not.

use flashraid_control::{MetaDevice, Signature, detect_signature};
use std::cell::RefCell;

struct Mem(RefCell<Vec<u8>>);

impl MetaDevice for Mem {
    fn name(&self) -> String {
        "mem".into()
    }
    fn size_bytes(&self) -> u64 {
        self.0.borrow().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), String> {
        let o = offset as usize;
        buf.copy_from_slice(&self.0.borrow()[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), String> {
        let o = offset as usize;
        self.0.borrow_mut()[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> Result<(), String> {
        Ok(())
    }
    fn zeroes_after_discard(&self) -> bool {
        true
    }
    fn zero_range(&self, offset: u64, len: u64) -> Result<(), String> {
        self.0.borrow_mut()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

fn device_with(offset: usize, bytes: &[u8]) -> Mem {
    let mut data = vec![0u8; 8 << 20];
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
    Mem(RefCell::new(data))
}

#[test]
fn each_signature_is_detected_where_its_tool_writes_it() {
    let size = 8usize << 20;
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (512, b"EFI PART".to_vec(), "GPT"),
        (0, b"XFSB".to_vec(), "XFS"),
        (1080, vec![0x53, 0xef], "ext2/3/4"),
        (65600, b"_BHRfS_M".to_vec(), "btrfs"),
        (4096, 0xa92b_4efc_u32.to_le_bytes().to_vec(), "md"),
        (size - 8192, 0xa92b_4efc_u32.to_le_bytes().to_vec(), "md"),
        (512, b"LABELONE".to_vec(), "LVM2"),
        (0, b"LUKS\xba\xbe".to_vec(), "LUKS"),
        (4086, b"SWAPSPACE2".to_vec(), "swap"),
        (510, vec![0x55, 0xaa], "MBR"),
    ];
    for (offset, magic, what) in cases {
        let device = device_with(offset, &magic);
        let found =
            detect_signature(&device).unwrap_or_else(|| panic!("{what} at {offset} not detected"));
        let text = found.to_string();
        assert!(text.contains(what), "{what}: got {text}");
    }
    assert_eq!(detect_signature(&device_with(0, &[])), None, "a blank device is not refused");
}

#[test]
fn a_flashraid_member_is_detected_even_with_its_head_overwritten() {
    // Copy 1 at the end identifies the member.
    let size = 8usize << 20;
    let device = device_with(size - 4096, b"FLSHRAID");
    assert!(matches!(detect_signature(&device), Some(Signature::Flashraid { .. })));
}
