//! The files extents live in.
//!
//! A hosted sparse extent grows: a grain written for the first time is
//! appended at the end of its file. An extent file is a device handed to
//! us or a regular file opened here by name; new grains need one that
//! grows.

use std::io;
use std::path::Path;
use std::sync::Arc;

use ext4kit_blockdev::FileDevice;

use crate::BlockDevice;

/// Positional I/O on one extent file, shared by many threads.
pub(crate) trait ExtentFile: Send + Sync {
    /// Fill `buf` from `off`; past the end is `UnexpectedEof`.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write `buf` at `off` (past the end only when [`ExtentFile::grows`]).
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// The current length in bytes.
    fn len(&self) -> u64;
    /// Whether a write past the end extends the file (grain allocation
    /// needs it).
    fn grows(&self) -> bool;
}

/// The device an extent lives on: a block device handed to
/// [`super::VmdkDisk::open`], or a regular file opened here by name. New
/// grains are appended only where the device grows
/// ([`BlockDevice::grows`]: a regular file, a growable memory device, or a
/// recording device over one); `FileDevice` follows the appended length.
pub(crate) struct Device(Arc<dyn BlockDevice>);

impl Device {
    /// The extent held by `dev`.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>) -> Device {
        Device(dev)
    }

    /// The file at `path`, read-write if `writable`.
    pub(crate) fn file(path: &Path, writable: bool) -> io::Result<Device> {
        let dev = FileDevice::open(path, writable)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Device(Arc::new(dev)))
    }
}

impl ExtentFile for Device {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
    fn len(&self) -> u64 {
        self.0.size()
    }
    fn grows(&self) -> bool {
        self.0.grows()
    }
}

/// A growable extent file in memory, for tests: the extent and the memory
/// device under it (to inspect the bytes written).
#[cfg(test)]
pub(crate) fn mem_file(bytes: Vec<u8>) -> (Device, Arc<ext4kit_blockdev::MemDevice>) {
    let mem = Arc::new(ext4kit_blockdev::MemDevice::growable(bytes));
    (Device(mem.clone()), mem)
}
