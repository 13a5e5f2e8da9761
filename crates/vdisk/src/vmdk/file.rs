//! The files extents live in.
//!
//! A hosted sparse extent grows: a grain written for the first time is
//! appended at the end of its file. An extent file is one of two things:
//! a device handed to us, which is read (and written in place) but never
//! grows, or a regular file opened here by name, whose `FileDevice`
//! follows the writes appended to it.

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
/// [`super::VmdkDisk::open`] (fixed size: it may not hold a device that
/// grows), or a regular file opened here by name, which grows as grains
/// are appended (`FileDevice` follows its length).
pub(crate) struct Device {
    dev: Arc<dyn BlockDevice>,
    grows: bool,
}

impl Device {
    /// A device of fixed size.
    pub(crate) fn fixed(dev: Arc<dyn BlockDevice>) -> Device {
        Device { dev, grows: false }
    }

    /// The file at `path`, read-write if `writable`; it grows when it is a
    /// regular file (a block device node cannot).
    pub(crate) fn file(path: &Path, writable: bool) -> io::Result<Device> {
        let dev = FileDevice::open(path, writable)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let grows = std::fs::metadata(path)?.file_type().is_file();
        Ok(Device {
            dev: Arc::new(dev),
            grows,
        })
    }
}

impl ExtentFile for Device {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.dev.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.dev.write_at(off, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }
    fn len(&self) -> u64 {
        self.dev.size()
    }
    fn grows(&self) -> bool {
        self.grows
    }
}

/// A growable file in memory, for tests.
#[cfg(test)]
#[derive(Default, Debug)]
pub(crate) struct MemFile(pub(crate) parking_lot::RwLock<Vec<u8>>);

#[cfg(test)]
impl MemFile {
    pub(crate) fn new(v: Vec<u8>) -> MemFile {
        MemFile(parking_lot::RwLock::new(v))
    }
}

#[cfg(test)]
impl ExtentFile for MemFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.0.read();
        match off.checked_add(buf.len() as u64).filter(|&e| e <= d.len() as u64) {
            Some(end) => {
                buf.copy_from_slice(&d[off as usize..end as usize]);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "past the end")),
        }
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut d = self.0.write();
        let end = off as usize + buf.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[off as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> u64 {
        self.0.read().len() as u64
    }
    fn grows(&self) -> bool {
        true
    }
}
