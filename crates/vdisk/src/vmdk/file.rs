//! The files extents live in.
//!
//! A hosted sparse extent grows: a grain written for the first time is
//! appended at the end of its file. A [`BlockDevice`] has a fixed size
//! (reads past its end are `UnexpectedEof`), so an extent file is one of
//! two things: a device handed to us, which is read (and written in
//! place) but never grows, or a regular file opened here, whose length
//! follows the writes appended to it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// A block device handed to [`super::VmdkDisk::open`]: fixed size.
pub(crate) struct Device(pub(crate) Arc<dyn BlockDevice>);

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
        false
    }
}

/// A file opened here with `pread`/`pwrite`, whose length is tracked as
/// writes extend it.
pub(crate) struct OsFile {
    file: File,
    len: AtomicU64,
    writable: bool,
    regular: bool,
}

impl OsFile {
    /// Open `path`, read-write if `writable`.
    pub(crate) fn open(path: &Path, writable: bool) -> io::Result<OsFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = file.metadata()?;
        let len = if meta.file_type().is_file() {
            meta.len()
        } else {
            use std::io::Seek;
            (&file).seek(io::SeekFrom::End(0))?
        };
        Ok(OsFile {
            file,
            len: AtomicU64::new(len),
            writable,
            regular: meta.file_type().is_file(),
        })
    }
}

impl ExtentFile for OsFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = self.len.load(Ordering::Acquire);
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {off} past the end of the file ({len} bytes)",
                    buf.len()
                ),
            ));
        }
        self.file.read_exact_at(buf, off)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "file opened read-only"));
        }
        let end = off
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "write offset overflows"))?;
        if !self.regular && end > self.len.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("write at {off} past the end"),
            ));
        }
        self.file.write_all_at(buf, off)?;
        // Readers may read the new bytes only once they are written.
        self.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.writable {
            self.file.sync_data()
        } else {
            Ok(())
        }
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn grows(&self) -> bool {
        self.regular
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
