//! A window onto part of a device: the filesystem inside one partition of
//! a disk image, or at a byte offset (fuse2fs's `-o offset=`, mke2fs's
//! `-E offset=`). Offsets above this device are relative to the window's
//! start, and nothing outside the window can be read or written.

use std::io;
use std::sync::Arc;

use crate::BlockDevice;

/// `len` bytes of `base` starting at byte `start`.
pub struct WindowDevice {
    base: Arc<dyn BlockDevice>,
    start: u64,
    len: u64,
}

impl std::fmt::Debug for WindowDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowDevice")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl WindowDevice {
    /// The window `start .. start + len` of `base`; an error if it does not
    /// lie inside the device.
    pub fn new(base: Arc<dyn BlockDevice>, start: u64, len: u64) -> io::Result<Self> {
        if start.checked_add(len).is_none_or(|e| e > base.size()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {start}..{} are past the end of the image ({} bytes)",
                    start.saturating_add(len),
                    base.size()
                ),
            ));
        }
        Ok(WindowDevice { base, start, len })
    }

    /// Where the window starts in the device underneath, in bytes.
    pub fn start(&self) -> u64 {
        self.start
    }

    fn check(&self, off: u64, n: usize) -> io::Result<u64> {
        match off.checked_add(n as u64) {
            Some(e) if e <= self.len => Ok(self.start + off),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access of {n} bytes at offset {off} past the end of the filesystem's area ({} bytes)",
                    self.len
                ),
            )),
        }
    }
}

impl BlockDevice for WindowDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.check(off, buf.len())?;
        self.base.read_at(at, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        let at = self.check(off, buf.len())?;
        self.base.write_at(at, buf)
    }

    fn flush(&self) -> io::Result<()> {
        self.base.flush()
    }

    fn size(&self) -> u64 {
        self.len
    }

    fn read_only(&self) -> bool {
        self.base.read_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    #[test]
    fn offsets_are_relative_and_bounded() {
        let base: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4096));
        let w = WindowDevice::new(base.clone(), 1024, 2048).unwrap();
        w.write_at(0, b"start").unwrap();
        let mut b = [0u8; 5];
        base.read_at(1024, &mut b).unwrap();
        assert_eq!(&b, b"start");
        assert_eq!(w.size(), 2048);
        assert!(w.write_at(2046, b"abc").is_err());
        assert!(w.read_at(u64::MAX, &mut b).is_err());
        assert!(WindowDevice::new(base, 4000, 200).is_err());
    }
}
