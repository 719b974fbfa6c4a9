//! One member device: a regular file or a block device opened for O_DIRECT IO.
//!
//! Owns: the open file (its descriptor lives exactly as long as the [`Device`]), what it is
//! (kind, size, logical block size, discard and write-zeroes support, all read once at open),
//! and the synchronous IO used by metadata paths (create, assembly, inspect). The data path
//! goes through [`crate::Ring`] instead, using [`Device::raw_fd`].
//!
//! Invariants:
//! - Every descriptor is opened with `O_DIRECT | O_CLOEXEC`; a block device opened read-write
//!   also gets `O_EXCL`, so nobody can mount it or open it exclusively while we hold it, and a
//!   regular file opened read-write an exclusive `flock`, so no second flashraid (another
//!   `serve`, a `create --force`) writes a member one holds, and one file named twice under
//!   different names (a symlink, a hard link, `./m` and `m`) is refused at its second open.
//!   Read-only opens (`inspect`, assembly's look at the superblocks) take no lock, except
//!   [`Device::open_read_only_held`] (the members of an array served read-only): a shared
//!   `flock` on a regular file, so no writer holds it meanwhile (another read-only server
//!   may), and `O_EXCL` on a block device, so nothing mounts it or opens it exclusively.
//! - Every synchronous IO is checked before it reaches the kernel: offset and length are
//!   multiples of [`Device::logical_block_bytes`], buffers start on an [`IO_ALIGN_BYTES`]
//!   boundary, and the range lies inside [`Device::size_bytes`] (so a write never grows a
//!   member file). A refused call does no IO.
//! - Nothing here knows what the bytes mean.
//!
//! Fault model: every failure is a [`DeviceError`] naming the path, the operation and the
//! range; nothing panics. Short transfers are retried until the range is done; end of file
//! inside the range is [`DeviceError::UnexpectedEof`]. `EINTR` is retried.
//!
//! Limits: size and logical block size are read once at open; a member that is resized while
//! open is not noticed here (the data path sees a shrunk member's short transfers and fails
//! it). Regular files always report a 512-byte logical block (what O_DIRECT
//! needs on ext4, xfs and tmpfs). Discard and write-zeroes support of a file is probed once at
//! open on an unnamed `O_TMPFILE` in the same directory (no visible side effect); when that
//! probe cannot run (read-only directory, other filesystem) both are reported unsupported.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use flashraid_iobuf::IO_ALIGN_BYTES;

use crate::sys;

/// Logical block size reported for regular files: O_DIRECT on ext4, xfs and tmpfs accepts
/// 512-byte granularity.
pub const FILE_LOGICAL_BLOCK_BYTES: u32 = 512;

/// Size of the unnamed temporary file used to probe a filesystem's fallocate modes.
const PROBE_FILE_BYTES: u64 = 4096;

/// Permissions of member files made by [`Device::create_file`]: they hold user data.
const CREATED_FILE_MODE: u32 = 0o600;

/// What a member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    RegularFile,
    BlockDevice,
}

/// How a member is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

/// What [`Device::discard`] and [`Device::write_zeroes`] (and the ring's `Discard` and
/// `WriteZeroes` ops) do on this device, through this handle. A read-only handle reports
/// everything unsupported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Discard is accepted (files: punch hole; block devices: `BLKDISCARD`).
    pub discard: bool,
    /// A discarded range reads back as zeroes. True for files (a punched hole reads zeroes);
    /// false for block devices, where the device may return anything after a discard.
    pub discard_zeroes: bool,
    /// Write-zeroes is accepted and the range reads back zeroes (files: zero-range;
    /// block devices: `BLKZEROOUT`, which the kernel completes by writing zero pages when the
    /// device has no write-zeroes command, so it is always available).
    pub write_zeroes: bool,
}

impl Capabilities {
    const NONE: Capabilities =
        Capabilities { discard: false, discard_zeroes: false, write_zeroes: false };
}

impl Drop for Device {
    /// The lock goes with the device, not with the file's last reference: a ring the device
    /// was registered in may hold the file a while longer (io_uring tears rings down in the
    /// background), and the array must be able to open its members again at once (a
    /// restart in the same process, `spare remove` then `create` elsewhere).
    fn drop(&mut self) {
        if self.owns_lock {
            sys::unlock(self.file.as_fd());
        }
    }
}

/// How long an open waits for another holder's lock on a member file to go (found by the
/// end-to-end test: a server killed with SIGKILL held its files' locks through its io_uring
/// rings for a moment after it died, and the restart was refused).
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a device operation failed. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    // `error`, not `source`: the message carries it, and as a source it printed twice in
    // error chains (found by review: "cannot open: No such file ...: No such file ...").
    #[error("{}: cannot open: {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    #[error(
        "{}: in use: another open of this file held it for {} s (a running flashraid serve \
         or create, or this same file named twice, under another name or through a link); stop \
         that first or name each member once (--force does not override this)",
        path.display(),
        LOCK_WAIT.as_secs()
    )]
    InUse { path: PathBuf },
    #[error("{}: already exists; refusing to create a member file over it", path.display())]
    AlreadyExists { path: PathBuf },
    #[error("{}: cannot create ({step}): {error}", path.display())]
    Create { path: PathBuf, step: &'static str, error: io::Error },
    #[error(
        "{}: size {size_bytes} bytes is not a positive multiple of {FILE_LOGICAL_BLOCK_BYTES}",
        path.display()
    )]
    InvalidSize { path: PathBuf, size_bytes: u64 },
    #[error("{}: is a {found}, not a regular file or a block device", path.display())]
    UnsupportedKind { path: PathBuf, found: &'static str },
    #[error("{}: cannot query {what}: {error}", path.display())]
    Query { path: PathBuf, what: &'static str, error: io::Error },
    #[error(
        "{}: {op} of {len_bytes} bytes at offset {offset_bytes} refused: {reason} \
         (logical block {logical_block_bytes} bytes, buffer alignment {IO_ALIGN_BYTES} bytes)",
        path.display()
    )]
    Misaligned {
        path: PathBuf,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        reason: &'static str,
        logical_block_bytes: u32,
    },
    #[error(
        "{}: {op} of {len_bytes} bytes at offset {offset_bytes} is outside the device \
         ({size_bytes} bytes)",
        path.display()
    )]
    OutOfRange {
        path: PathBuf,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        size_bytes: u64,
    },
    #[error("{}: {op} refused: the device is open read-only", path.display())]
    ReadOnly { path: PathBuf, op: &'static str },
    #[error("{}: {op} is not supported by this device", path.display())]
    Unsupported { path: PathBuf, op: &'static str },
    #[error(
        "{}: {op} of {len_bytes} bytes at offset {offset_bytes} hit end of file after \
         {done_bytes} bytes",
        path.display()
    )]
    UnexpectedEof {
        path: PathBuf,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        done_bytes: u64,
    },
    #[error(
        "{}: {op} of {len_bytes} bytes at offset {offset_bytes} failed: {error}",
        path.display()
    )]
    Io { path: PathBuf, op: &'static str, offset_bytes: u64, len_bytes: u64, error: io::Error },
}

/// An open member device. Dropping it closes the descriptor (a ring that registered it keeps
/// its own reference until the ring is dropped).
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
    kind: DeviceKind,
    access: Access,
    size_bytes: u64,
    logical_block_bytes: u32,
    capabilities: Capabilities,
    /// This handle took the file's `flock` and lets it go when dropped. A clone shares the
    /// lock (one open file description) but never releases it (found by review: a replace's
    /// copier dropped its clones and unlocked both files the array still held).
    owns_lock: bool,
}

impl Device {
    /// Open an existing regular file or block device with `O_DIRECT | O_CLOEXEC`, adding
    /// `O_EXCL` for a block device opened read-write, and for a regular file opened
    /// read-write an exclusive `flock` (waiting up to [`LOCK_WAIT`] for a holder to let go;
    /// then [`DeviceError::InUse`]).
    pub fn open(path: &Path, access: Access) -> Result<Device, DeviceError> {
        Device::open_locking(path, access, access == Access::ReadWrite)
    }

    /// Open read-only, held against writers while open: a member of an array served
    /// read-only, which must not change under it (a read-write `serve` of the same members
    /// would make its reads torn and its view of the metadata stale). A regular file gets a
    /// shared `flock` (waiting up to [`LOCK_WAIT`] for a writer to let go; then
    /// [`DeviceError::InUse`]): writers take theirs exclusive, so either one holds the file
    /// or the other. A block device gets `O_EXCL`, as a read-write open does.
    pub fn open_read_only_held(path: &Path) -> Result<Device, DeviceError> {
        Device::open_locking(path, Access::ReadOnly, true)
    }

    /// [`Device::open`] without the lock on a regular file: for the in-process benchmark's
    /// raw column only, which writes the data areas of the very member files the array it
    /// measures holds (their contents are the benchmark's, not anyone's data).
    pub fn open_unlocked_for_benchmark(path: &Path) -> Result<Device, DeviceError> {
        Device::open_locking(path, Access::ReadWrite, false)
    }

    fn open_locking(path: &Path, access: Access, lock: bool) -> Result<Device, DeviceError> {
        let open_error = |source| DeviceError::Open { path: path.to_owned(), error: source };
        // Stat first: O_EXCL is only wanted (and only meaningful) on block devices.
        let metadata = std::fs::metadata(path).map_err(open_error)?;
        let kind = kind_of(path, &metadata)?;
        let mut flags = libc::O_DIRECT | libc::O_CLOEXEC;
        if kind == DeviceKind::BlockDevice && (access == Access::ReadWrite || lock) {
            flags |= libc::O_EXCL;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(access == Access::ReadWrite)
            .custom_flags(flags)
            .open(path)
            .map_err(open_error)?;
        let device = Device::from_file(path, file, access, lock)?;
        if device.kind != kind {
            let changed = io::Error::other("the path changed type between stat and open");
            return Err(open_error(changed));
        }
        Ok(device)
    }

    /// Create a new regular file of exactly `size_bytes` with its space reserved (fallocate),
    /// refusing if anything exists at `path`, make the creation durable, then open it as
    /// [`Device::open`] would (read-write). On failure after creation the file is removed.
    pub fn create_file(path: &Path, size_bytes: u64) -> Result<Device, DeviceError> {
        let block_bytes = u64::from(FILE_LOGICAL_BLOCK_BYTES);
        if size_bytes == 0 || !size_bytes.is_multiple_of(block_bytes) {
            return Err(DeviceError::InvalidSize { path: path.to_owned(), size_bytes });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(CREATED_FILE_MODE)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => {
                    DeviceError::AlreadyExists { path: path.to_owned() }
                }
                _ => DeviceError::Create { path: path.to_owned(), step: "open", error: source },
            })?;
        let result = reserve_and_persist(path, &file, size_bytes)
            .and_then(|()| Device::from_file(path, file, Access::ReadWrite, true));
        if result.is_err() {
            // Best effort: the error we return is the interesting one.
            let _ = std::fs::remove_file(path);
        }
        result
    }

    fn from_file(
        path: &Path,
        file: File,
        access: Access,
        lock: bool,
    ) -> Result<Device, DeviceError> {
        let query =
            |what| move |source| DeviceError::Query { path: path.to_owned(), what, error: source };
        let metadata = file.metadata().map_err(query("file status (fstat)"))?;
        let kind = kind_of(path, &metadata)?;
        let mut owns_lock = false;
        if kind == DeviceKind::RegularFile && lock {
            // A process killed with its rings open keeps its lock until the kernel has torn
            // the rings down, in the background: a restart right after a crash waits for it.
            let deadline = std::time::Instant::now() + LOCK_WAIT;
            let try_lock = match access {
                Access::ReadWrite => sys::try_lock_exclusive,
                Access::ReadOnly => sys::try_lock_shared,
            };
            loop {
                match try_lock(file.as_fd()) {
                    Ok(true) => {
                        owns_lock = true;
                        break;
                    }
                    Ok(false) if std::time::Instant::now() >= deadline => {
                        return Err(DeviceError::InUse { path: path.to_owned() });
                    }
                    Ok(false) => std::thread::sleep(std::time::Duration::from_millis(20)),
                    // A filesystem without flock (NFS without its lock daemon): no lock, as
                    // before locks existed, rather than no member.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP)) => {
                        break;
                    }
                    Err(e) => return Err(query("a lock (flock)")(e)),
                }
            }
        }
        let (size_bytes, logical_block_bytes, capabilities) = match kind {
            DeviceKind::RegularFile => {
                let capabilities = match access {
                    Access::ReadWrite => probe_file_capabilities(path, metadata.dev()),
                    Access::ReadOnly => Capabilities::NONE,
                };
                (metadata.len(), FILE_LOGICAL_BLOCK_BYTES, capabilities)
            }
            DeviceKind::BlockDevice => {
                let size_bytes =
                    sys::block_size_bytes(file.as_fd()).map_err(query("size (BLKGETSIZE64)"))?;
                let block_bytes = sys::block_logical_block_bytes(file.as_fd())
                    .map_err(query("logical block size (BLKSSZGET)"))?;
                let capabilities = match access {
                    Access::ReadWrite => block_capabilities(metadata.rdev()),
                    Access::ReadOnly => Capabilities::NONE,
                };
                (size_bytes, block_bytes, capabilities)
            }
        };
        Ok(Device {
            file,
            path: path.to_owned(),
            kind,
            access,
            size_bytes,
            logical_block_bytes,
            capabilities,
            owns_lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    pub fn access(&self) -> Access {
        self.access
    }

    /// File length, or the block device's size (`BLKGETSIZE64`), read at open.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// `BLKSSZGET` for block devices; [`FILE_LOGICAL_BLOCK_BYTES`] for files. Every offset and
    /// length of direct IO on this device must be a multiple of it.
    pub fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }

    /// The descriptor, for [`crate::Ring::register_files`]. It stays valid while `self` lives.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// A second handle to the same open device (a duplicated descriptor sharing its open
    /// file description, flags and any exclusive claim), for a thread of its own: closing one
    /// handle leaves the other open.
    pub fn try_clone(&self) -> Result<Device, DeviceError> {
        let file = self
            .file
            .try_clone()
            .map_err(|source| DeviceError::Open { path: self.path.clone(), error: source })?;
        Ok(Device {
            file,
            path: self.path.clone(),
            kind: self.kind,
            access: self.access,
            size_bytes: self.size_bytes,
            logical_block_bytes: self.logical_block_bytes,
            capabilities: self.capabilities,
            owns_lock: false,
        })
    }

    /// Read exactly `buf.len()` bytes at `offset_bytes`.
    pub fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), DeviceError> {
        const OP: &str = "read";
        let len_bytes = len_u64(buf.len());
        self.check_buffer(OP, buf.as_ptr(), offset_bytes, len_bytes)?;
        let mut done_bytes = 0;
        while done_bytes < buf.len() {
            let at_bytes = offset_bytes + len_u64(done_bytes);
            match self.file.read_at(&mut buf[done_bytes..], at_bytes) {
                Ok(0) => {
                    let done_bytes = len_u64(done_bytes);
                    return Err(self.eof(OP, offset_bytes, len_bytes, done_bytes));
                }
                Ok(n) => done_bytes += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(self.io(OP, offset_bytes, len_bytes, source)),
            }
        }
        Ok(())
    }

    /// Write all of `buf` at `offset_bytes`. Not durable until [`Device::sync`].
    pub fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), DeviceError> {
        const OP: &str = "write";
        let len_bytes = len_u64(buf.len());
        self.check_writable(OP)?;
        self.check_buffer(OP, buf.as_ptr(), offset_bytes, len_bytes)?;
        let mut done_bytes = 0;
        while done_bytes < buf.len() {
            let at_bytes = offset_bytes + len_u64(done_bytes);
            match self.file.write_at(&buf[done_bytes..], at_bytes) {
                Ok(0) => {
                    let done_bytes = len_u64(done_bytes);
                    return Err(self.eof(OP, offset_bytes, len_bytes, done_bytes));
                }
                Ok(n) => done_bytes += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(self.io(OP, offset_bytes, len_bytes, source)),
            }
        }
        Ok(())
    }

    /// Make completed writes durable (`fdatasync`; on a block device this flushes its cache).
    pub fn sync(&self) -> Result<(), DeviceError> {
        self.file.sync_data().map_err(|source| self.io("sync", 0, self.size_bytes, source))
    }

    /// Tell the device the range's contents are no longer needed. Files: punch a hole (reads
    /// back zeroes, space is released). Block devices: `BLKDISCARD` (contents afterwards are
    /// unspecified). `len_bytes == 0` does nothing.
    pub fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DeviceError> {
        let file_mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        self.range_command("discard", file_mode, sys::block_discard, offset_bytes, len_bytes)
    }

    /// Make the range read back as zeroes without sending zero buffers. Files: zero-range
    /// (space stays reserved). Block devices: `BLKZEROOUT`. `len_bytes == 0` does nothing.
    pub fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DeviceError> {
        let file_mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        self.range_command("write zeroes", file_mode, sys::block_zero_out, offset_bytes, len_bytes)
    }

    /// A range command: `fallocate(file_mode)` on files, the `block` ioctl on block devices.
    fn range_command(
        &self,
        op: &'static str,
        file_mode: libc::c_int,
        block: fn(RawFd, u64, u64) -> libc::c_int,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), DeviceError> {
        self.check_writable(op)?;
        self.check_range(op, offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let result = match self.kind {
            DeviceKind::RegularFile => {
                sys::fallocate(self.file.as_fd(), file_mode, offset_bytes, len_bytes)
            }
            DeviceKind::BlockDevice => errno_result(block(self.raw_fd(), offset_bytes, len_bytes)),
        };
        result.map_err(|source| self.range_error(op, offset_bytes, len_bytes, source))
    }

    fn check_writable(&self, op: &'static str) -> Result<(), DeviceError> {
        match self.access {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(DeviceError::ReadOnly { path: self.path.clone(), op }),
        }
    }

    fn check_buffer(
        &self,
        op: &'static str,
        buffer: *const u8,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), DeviceError> {
        if !(buffer as usize).is_multiple_of(IO_ALIGN_BYTES) {
            let reason = "the buffer address is not aligned";
            return Err(self.misaligned(op, offset_bytes, len_bytes, reason));
        }
        self.check_range(op, offset_bytes, len_bytes)
    }

    fn check_range(
        &self,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), DeviceError> {
        let block_bytes = u64::from(self.logical_block_bytes);
        if !offset_bytes.is_multiple_of(block_bytes) {
            let reason = "the offset is not a multiple of the logical block";
            return Err(self.misaligned(op, offset_bytes, len_bytes, reason));
        }
        if !len_bytes.is_multiple_of(block_bytes) {
            let reason = "the length is not a multiple of the logical block";
            return Err(self.misaligned(op, offset_bytes, len_bytes, reason));
        }
        match offset_bytes.checked_add(len_bytes) {
            Some(end_bytes) if end_bytes <= self.size_bytes => Ok(()),
            _ => Err(DeviceError::OutOfRange {
                path: self.path.clone(),
                op,
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes,
            }),
        }
    }

    fn misaligned(
        &self,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        reason: &'static str,
    ) -> DeviceError {
        DeviceError::Misaligned {
            path: self.path.clone(),
            op,
            offset_bytes,
            len_bytes,
            reason,
            logical_block_bytes: self.logical_block_bytes,
        }
    }

    fn eof(&self, op: &'static str, offset_bytes: u64, len_bytes: u64, done: u64) -> DeviceError {
        let path = self.path.clone();
        DeviceError::UnexpectedEof { path, op, offset_bytes, len_bytes, done_bytes: done }
    }

    fn io(
        &self,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        source: io::Error,
    ) -> DeviceError {
        DeviceError::Io { path: self.path.clone(), op, offset_bytes, len_bytes, error: source }
    }

    fn range_error(
        &self,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        source: io::Error,
    ) -> DeviceError {
        match source.raw_os_error() {
            Some(libc::EOPNOTSUPP) => DeviceError::Unsupported { path: self.path.clone(), op },
            _ => self.io(op, offset_bytes, len_bytes, source),
        }
    }
}

fn len_u64(len_bytes: usize) -> u64 {
    u64::try_from(len_bytes).expect("usize fits in u64 on every supported target")
}

fn errno_result(result: i32) -> io::Result<()> {
    if result < 0 { Err(io::Error::from_raw_os_error(-result)) } else { Ok(()) }
}

fn kind_of(path: &Path, metadata: &std::fs::Metadata) -> Result<DeviceKind, DeviceError> {
    let file_type = metadata.file_type();
    let found = if file_type.is_file() {
        return Ok(DeviceKind::RegularFile);
    } else if file_type.is_block_device() {
        return Ok(DeviceKind::BlockDevice);
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "file of unknown type"
    };
    Err(DeviceError::UnsupportedKind { path: path.to_owned(), found })
}

/// Reserve the file's space and make the new file and its directory entry durable.
fn reserve_and_persist(path: &Path, file: &File, size_bytes: u64) -> Result<(), DeviceError> {
    let create_error =
        |step| move |source| DeviceError::Create { path: path.to_owned(), step, error: source };
    sys::fallocate(file.as_fd(), 0, 0, size_bytes)
        .map_err(create_error("reserve space (fallocate)"))?;
    file.sync_all().map_err(create_error("sync the file"))?;
    let directory = parent_directory(path);
    File::open(directory)
        .and_then(|directory| directory.sync_all())
        .map_err(create_error("sync the directory"))
}

fn parent_directory(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Which fallocate modes the filesystem holding `path` supports, tried on an unnamed
/// temporary file in the same directory (it vanishes on close, so the probe leaves nothing
/// behind). tmpfs, for example, punches holes but has no zero-range.
fn probe_file_capabilities(path: &Path, device_id: u64) -> Capabilities {
    let probe = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .mode(CREATED_FILE_MODE)
        .open(parent_directory(path));
    let Ok(probe) = probe else { return Capabilities::NONE };
    // A file bind-mounted from another filesystem would make the probe answer for the wrong
    // filesystem: refuse to guess.
    let same_filesystem = probe.metadata().is_ok_and(|metadata| metadata.dev() == device_id);
    if !same_filesystem || probe.set_len(PROBE_FILE_BYTES).is_err() {
        return Capabilities::NONE;
    }
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    let discard = sys::fallocate(probe.as_fd(), punch, 0, PROBE_FILE_BYTES).is_ok();
    let write_zeroes = sys::fallocate(probe.as_fd(), zero, 0, PROBE_FILE_BYTES).is_ok();
    Capabilities { discard, discard_zeroes: discard, write_zeroes }
}

/// Discard support of a block device from sysfs (`discard_max_bytes > 0`). A partition has no
/// queue directory of its own; its disk's is one level up.
fn block_capabilities(device_number: u64) -> Capabilities {
    let (major, minor) = (libc::major(device_number), libc::minor(device_number));
    let discard_max_bytes = ["queue", "../queue"].iter().find_map(|queue| {
        let path = format!("/sys/dev/block/{major}:{minor}/{queue}/discard_max_bytes");
        std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok()
    });
    let discard = discard_max_bytes.is_some_and(|max_bytes| max_bytes > 0);
    Capabilities { discard, discard_zeroes: false, write_zeroes: true }
}
