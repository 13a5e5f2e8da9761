//! Block devices for ext4kit.
//!
//! The engine addresses storage by byte offset with positional I/O so that
//! many threads can read and write at once without sharing a file cursor.
//! Everything above this crate sees only the [`BlockDevice`] trait. Besides
//! image files and memory there are a window onto part of a device (a
//! partition), a copy-on-write overlay (journal replay of a read-only open),
//! a scratch device that keeps only written blocks (for output formats
//! other than raw, such as Android sparse images) and, for crash tests, a
//! recording device.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

pub mod android_sparse;
pub mod overlay;
pub mod partition;
pub mod record;
pub mod scratch;
pub mod window;

pub use overlay::OverlayDevice;
pub use partition::{open_location, Location};
pub use record::{CrashImages, CrashPoint, RecordingDevice, WriteLog};
pub use scratch::ScratchDevice;
pub use window::WindowDevice;

/// Storage the filesystem lives on.
///
/// Implementations must be safe to call from many threads at once; reads and
/// writes at disjoint offsets must not interfere.
pub trait BlockDevice: Send + Sync {
    /// Fill `buf` from byte offset `off`. Reading past the end is an
    /// `UnexpectedEof` error (a truncated image), never a short read.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write `buf` at byte offset `off`.
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Size of the device in bytes.
    fn size(&self) -> u64;
    /// Whether writes are refused.
    fn read_only(&self) -> bool;
    /// Whether a write past the end extends the device, as it does a
    /// regular file. A container format that appends to its file (a VMDK
    /// sparse extent's new grains) can only write on a device that grows;
    /// a disk, a partition or a fixed buffer does not.
    fn grows(&self) -> bool {
        false
    }
}

/// An image file (or block device node) accessed with `pread`/`pwrite`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// The file's length: set at open and raised by writes past the end, so
    /// a container format that appends to its file (a VHDX or qcow2 block
    /// allocated at the end) can read back what it appended.
    size: AtomicU64,
    read_only: bool,
    /// A regular file opened for writing extends on a write past its end;
    /// a block device node cannot.
    grows: bool,
}

impl FileDevice {
    /// Open `path`, read-only or read-write.
    pub fn open(path: impl AsRef<Path>, writable: bool) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(writable).open(path.as_ref())?;
        let meta = file.metadata()?;
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            // Block devices report 0 in metadata; seek to the end instead.
            use std::io::Seek;
            let mut f = &file;
            f.seek(io::SeekFrom::End(0))?
        };
        Ok(FileDevice {
            file,
            size: AtomicU64::new(size),
            read_only: !writable,
            grows: writable && meta.file_type().is_file(),
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let size = self.size.load(Ordering::Acquire);
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {off} past the end of the image ({size} bytes)",
                    buf.len(),
                ),
            ));
        }
        self.file.read_exact_at(buf, off)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "device opened read-only",
            ));
        }
        let end = off
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("write at {off} past the end")))?;
        self.file.write_all_at(buf, off)?;
        // Only a write past the end touches the shared size: every write
        // inside the file (all of an ext4 image's) stays a plain load, not
        // a read-modify-write on a line all writers share.
        if end > self.size.load(Ordering::Acquire) {
            self.size.fetch_max(end, Ordering::AcqRel);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn grows(&self) -> bool {
        self.grows
    }
}

/// A device held in memory: tests, fuzzing, and images built in RAM.
#[derive(Debug, Default)]
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    read_only: bool,
    /// Writes past the end extend the device (zeros in any gap), as a
    /// file does: [`MemDevice::growable`].
    grows: bool,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes.
    pub fn new(size: usize) -> Self {
        Self::from_vec(vec![0; size])
    }

    /// A device holding `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        MemDevice {
            data: RwLock::new(bytes),
            read_only: false,
            grows: false,
        }
    }

    /// A read-only device holding `bytes`.
    pub fn from_vec_read_only(bytes: Vec<u8>) -> Self {
        MemDevice {
            data: RwLock::new(bytes),
            read_only: true,
            grows: false,
        }
    }

    /// A device holding `bytes` that grows like a file: a write past the
    /// end extends it (any gap reads as zeros). What a container format's
    /// file (qcow2, VHDX: new clusters and blocks are appended) needs in
    /// memory, as [`FileDevice`] is on disk.
    pub fn growable(bytes: Vec<u8>) -> Self {
        MemDevice {
            data: RwLock::new(bytes),
            read_only: false,
            grows: true,
        }
    }

    /// A copy of the current contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read();
        let end = off.checked_add(buf.len() as u64).filter(|&e| e <= d.len() as u64);
        match end {
            Some(end) => {
                buf.copy_from_slice(&d[off as usize..end as usize]);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {off} past the end of the image ({} bytes)",
                    buf.len(),
                    d.len()
                ),
            )),
        }
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "device opened read-only",
            ));
        }
        let mut d = self.data.write();
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= d.len() as u64 || (self.grows && usize::try_from(e).is_ok()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("write at {off} past the end")))?;
        if end > d.len() as u64 {
            d.resize(end as usize, 0);
        }
        d[off as usize..end as usize].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn grows(&self) -> bool {
        self.grows && !self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(d: &dyn BlockDevice) {
        d.write_at(100, b"hello").unwrap();
        let mut b = [0u8; 5];
        d.read_at(100, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        let mut big = vec![0u8; 10];
        let e = d.read_at(d.size() - 5, &mut big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(d.read_at(u64::MAX - 2, &mut big).is_err());
        d.flush().unwrap();
    }

    #[test]
    fn mem_device() {
        exercise(&MemDevice::new(4096));
        let ro = MemDevice::from_vec_read_only(vec![0; 10]);
        assert!(ro.write_at(0, b"x").is_err());
    }

    #[test]
    fn growable_mem_device_extends_like_a_file() {
        let d = MemDevice::growable(vec![1; 10]);
        exercise(&d);
        d.write_at(20, b"xy").unwrap();
        assert_eq!(d.size(), 105);
        d.write_at(200, b"end").unwrap();
        assert_eq!(d.size(), 203);
        let mut gap = [9u8; 95];
        d.read_at(105, &mut gap).unwrap();
        assert_eq!(gap, [0; 95]);
        // A fixed-size one refuses.
        assert!(MemDevice::new(10).write_at(8, b"xyz").is_err());
        // And each says which it is.
        assert!(d.grows());
        assert!(!MemDevice::new(10).grows());
        assert!(!MemDevice::from_vec_read_only(vec![0; 10]).grows());
    }

    #[test]
    fn a_writable_regular_file_grows_a_read_only_one_or_a_device_node_does_not() {
        let p = std::env::temp_dir().join(format!("ext4kit-blockdev-grows-{}", std::process::id()));
        std::fs::write(&p, vec![0u8; 512]).unwrap();
        let rw = FileDevice::open(&p, true).unwrap();
        assert!(rw.grows());
        rw.write_at(1024, b"abc").unwrap();
        assert_eq!(rw.size(), 1027);
        assert!(!FileDevice::open(&p, false).unwrap().grows());
        std::fs::remove_file(&p).unwrap();
        // /dev/zero is a character device: its length is fixed.
        if let Ok(z) = FileDevice::open("/dev/zero", true) {
            assert!(!z.grows());
        }
    }

    #[test]
    fn file_device() {
        let p = std::env::temp_dir().join(format!("ext4kit-blockdev-{}", std::process::id()));
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        exercise(&FileDevice::open(&p, true).unwrap());
        let ro = FileDevice::open(&p, false).unwrap();
        assert!(ro.write_at(0, b"x").is_err());
        // A write past the end grows the file, and what it wrote reads back.
        let rw = FileDevice::open(&p, true).unwrap();
        rw.write_at(8192, b"tail").unwrap();
        assert_eq!(rw.size(), 8196);
        let mut t = [0u8; 4];
        rw.read_at(8192, &mut t).unwrap();
        assert_eq!(&t, b"tail");
        std::fs::remove_file(&p).unwrap();
    }
}
