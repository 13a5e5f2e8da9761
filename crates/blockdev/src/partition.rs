//! Where the filesystem lives inside an image file: the whole file, one
//! partition of a partitioned disk (GPT or MBR), or a byte offset.

use std::io;
use std::sync::Arc;

use crate::window::WindowDevice;
use crate::BlockDevice;

/// Where in an image file (or device) the filesystem starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Location {
    /// The filesystem is the whole file (what mke2fs makes).
    #[default]
    Whole,
    /// Partition `n` (1-based, as `fdisk -l` and the kernel's `loop0pN`
    /// number them) of a GPT or MBR partition table.
    Partition(u32),
    /// The filesystem starts this many bytes into the file and runs to its
    /// end (fuse2fs's `-o offset=`).
    Offset(u64),
}

/// The device holding the filesystem at `loc` of `disk`.
pub fn open_location(disk: Arc<dyn BlockDevice>, loc: Location) -> io::Result<Arc<dyn BlockDevice>> {
    match loc {
        Location::Whole => Ok(disk),
        Location::Offset(off) => {
            let len = disk.size().checked_sub(off).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("offset {off} is past the end of the image ({} bytes)", disk.size()),
                )
            })?;
            Ok(Arc::new(WindowDevice::new(disk, off, len)?))
        }
        Location::Partition(n) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("partition {n}: partition tables are not read yet"),
        )),
    }
}
