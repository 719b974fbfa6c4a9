//! Member devices for the control plane: the io_uring layer's `Device` behind the control
//! crate's `MetaDevice` trait.

use flashraid_control::MetaDevice;
use flashraid_uring::Device;

/// One opened member (file or block device).
#[derive(Debug)]
pub struct MemberDevice {
    pub device: Device,
}

impl MetaDevice for MemberDevice {
    fn name(&self) -> String {
        self.device.path().display().to_string()
    }

    fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), String> {
        self.device.read_at(buf, offset_bytes).map_err(|e| e.to_string())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), String> {
        self.device.write_at(buf, offset_bytes).map_err(|e| e.to_string())
    }

    fn sync(&self) -> Result<(), String> {
        self.device.sync().map_err(|e| e.to_string())
    }

    fn zeroes_after_discard(&self) -> bool {
        self.device.capabilities().discard_zeroes
    }

    fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), String> {
        let caps = self.device.capabilities();
        let result = if caps.discard_zeroes {
            self.device.discard(offset_bytes, len_bytes)
        } else if caps.write_zeroes {
            self.device.write_zeroes(offset_bytes, len_bytes)
        } else {
            return write_zero_blocks(&self.device, offset_bytes, len_bytes);
        };
        result.map_err(|e| e.to_string())
    }
}

/// Zero a range by writing zero blocks (for devices with neither discard-to-zero nor
/// write-zeroes). 1 MiB at a time.
fn write_zero_blocks(device: &Device, offset_bytes: u64, len_bytes: u64) -> Result<(), String> {
    const STEP: u64 = 1 << 20;
    let zeroes = flashraid_iobuf::IoBuf::new(usize::try_from(STEP).expect("fits"));
    let mut at = offset_bytes;
    let end = offset_bytes + len_bytes;
    while at < end {
        let len = usize::try_from(STEP.min(end - at)).expect("fits");
        device.write_at(&zeroes.as_slice()[..len], at).map_err(|e| e.to_string())?;
        at += len as u64;
    }
    Ok(())
}
