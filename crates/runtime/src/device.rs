//! Member devices for the control plane: the io_uring layer's `Device`, or in-memory members,
//! behind the control crate's `MetaDevice` trait.

use crate::memory::MemMember;
use flashraid_control::MetaDevice;
use flashraid_uring::Device;
use std::sync::Arc;

/// One opened member: a file or block device, or memory.
#[derive(Debug)]
pub enum MemberDevice {
    Device(Device),
    Memory(Arc<MemMember>),
    /// A device this server held and let go (a hot spare removed): closed, with its name
    /// kept for messages. It holds no role and no spare entry, so the metadata never
    /// addresses it; its IO fails if anything tried. Its index may be given to the next
    /// device added.
    Released(String),
}

impl MemberDevice {
    /// A device let go of (`Released`): closed, no longer the server's.
    pub fn is_released(&self) -> bool {
        matches!(self, MemberDevice::Released(_))
    }
}

/// Why a released device takes no IO.
const RELEASED: &str = "the device was released (removed from the array) and is closed";

impl MetaDevice for MemberDevice {
    fn name(&self) -> String {
        match self {
            MemberDevice::Device(d) => d.path().display().to_string(),
            MemberDevice::Memory(m) => m.name().to_string(),
            MemberDevice::Released(name) => name.clone(),
        }
    }

    fn size_bytes(&self) -> u64 {
        match self {
            MemberDevice::Device(d) => d.size_bytes(),
            MemberDevice::Memory(m) => m.size_bytes(),
            MemberDevice::Released(_) => 0,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), String> {
        match self {
            MemberDevice::Device(d) => d.read_at(buf, offset_bytes).map_err(|e| e.to_string()),
            MemberDevice::Memory(m) => m.read(buf, offset_bytes),
            MemberDevice::Released(_) => Err(RELEASED.into()),
        }
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), String> {
        match self {
            MemberDevice::Device(d) => d.write_at(buf, offset_bytes).map_err(|e| e.to_string()),
            MemberDevice::Memory(m) => m.write(buf, offset_bytes),
            MemberDevice::Released(_) => Err(RELEASED.into()),
        }
    }

    fn sync(&self) -> Result<(), String> {
        match self {
            MemberDevice::Device(d) => d.sync().map_err(|e| e.to_string()),
            MemberDevice::Memory(m) => m.flush(),
            MemberDevice::Released(_) => Err(RELEASED.into()),
        }
    }

    fn zeroes_after_discard(&self) -> bool {
        match self {
            MemberDevice::Device(d) => d.capabilities().discard_zeroes,
            MemberDevice::Memory(_) => true,
            MemberDevice::Released(_) => false,
        }
    }

    fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), String> {
        let device = match self {
            MemberDevice::Device(d) => d,
            MemberDevice::Memory(m) => return m.zero(offset_bytes, len_bytes),
            MemberDevice::Released(_) => return Err(RELEASED.into()),
        };
        let caps = device.capabilities();
        let result = if caps.discard_zeroes {
            device.discard(offset_bytes, len_bytes)
        } else if caps.write_zeroes {
            device.write_zeroes(offset_bytes, len_bytes)
        } else {
            return write_zero_blocks(device, offset_bytes, len_bytes);
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
