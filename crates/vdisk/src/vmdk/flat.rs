//! FLAT (and ESX's VMFS) extents: the extent's sectors, as they are, from
//! an offset in a file.
//!
//! Spec: `RW <sectors> FLAT "<file>" <offset>`, where the offset (in
//! sectors) is where the extent starts in its file. A flat extent file is
//! preallocated, so the whole range must be in the file: a shorter file is
//! a truncated image, found when it is opened rather than mid-read.

use std::io;
use std::sync::Arc;

use super::file::ExtentFile;
use super::header::SECTOR;
use crate::{corrupt, DiskFormat};

// The first bytes of a descriptor: a flat extent that starts with them is
// a descriptor named as data (the descriptor itself, or another one).
use crate::probe::VMDK_DESCRIPTOR as DESCRIPTOR_MAGIC;

/// A flat extent.
pub(crate) struct FlatExtent {
    file: Arc<dyn ExtentFile>,
    /// Byte offset of the extent in its file.
    start: u64,
}

impl FlatExtent {
    /// The flat extent of `len` bytes at `offset_sectors` in `file`.
    pub(crate) fn open(file: Arc<dyn ExtentFile>, offset_sectors: u64, len: u64, what: &str) -> io::Result<FlatExtent> {
        let bad = |why: String| corrupt(DiskFormat::Vmdk, format!("{what}: {why}"));
        let start = offset_sectors
            .checked_mul(SECTOR)
            .ok_or_else(|| bad(format!("offset {offset_sectors} sectors is absurd")))?;
        let mut head = [0u8; DESCRIPTOR_MAGIC.len()];
        let is_descriptor = |at: u64, head: &mut [u8]| file.read_at(at, head).is_ok() && head == DESCRIPTOR_MAGIC;
        if is_descriptor(0, &mut head) || is_descriptor(start, &mut head) {
            return Err(bad(
                "the file is a VMDK descriptor, not extent data (a descriptor naming itself or another descriptor)"
                    .into(),
            ));
        }
        let flen = file.len();
        if start.checked_add(len).is_none_or(|end| end > flen) {
            return Err(bad(format!(
                "the extent needs {len} bytes from offset {start}, the file has {flen} bytes"
            )));
        }
        Ok(FlatExtent { file, start })
    }

    /// Read `buf` from byte `off` of the extent.
    pub(crate) fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_at(self.start + off, buf)
    }

    /// Write `buf` at byte `off` of the extent, in place.
    pub(crate) fn write(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_at(self.start + off, buf)
    }

    /// Make the writes durable.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.file.flush()
    }
}
