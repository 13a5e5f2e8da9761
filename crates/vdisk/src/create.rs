//! Creating an empty image: a new qcow2, VHD or VHDX of a given size,
//! written into an empty file and opened read-write, so `mkfs` can put a
//! filesystem straight into the container a VM or Hyper-V will boot.
//!
//! Each format writes its own structures ([`crate::qcow2`] through
//! imago's creation code, [`crate::vhd`] and [`crate::vhdx`] laid out as
//! qemu's `vpc_create` and `vhdx_create` lay them out); this module checks
//! what every format shares (an empty writable file, a size that is not
//! zero, whole 512-byte sectors) and picks the format.
//!
//! Sizes are rounded up to whole 512-byte sectors (as `qemu-img create`
//! does): every reader counts the disk in sectors, and a qcow2 or VHD of
//! an odd size would be cut short by qemu. A VHD may round further (see
//! [`VhdSizing`]); the returned device's [`BlockDevice::size`] is the size
//! created, at least the size asked for.

use std::io;
use std::sync::Arc;

pub use crate::sizing::VhdSizing;
use crate::sizing::{invalid, sectors};
use crate::{BlockDevice, DiskFormat, DiskImage};

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The container format: qcow2, VHD or VHDX.
    pub format: DiskFormat,
    /// The disk's size in bytes (rounded up to whole 512-byte sectors).
    pub size: u64,
    /// The unit the format allocates in: the qcow2 cluster size (a power of
    /// two from 512 bytes to 2 MiB; default 64 KiB, as qemu), the VHD block
    /// size (a power of two from 512 KiB to 16 MiB; default 2 MiB, the
    /// only size qemu and Virtual PC write) or the VHDX block size (a
    /// power of two from 1 MiB to 256 MiB; default 32 MiB, Hyper-V's).
    /// `None`: the format's default.
    pub allocation_unit: Option<u64>,
    /// VHD only: how the size is recorded.
    pub vhd_sizing: VhdSizing,
}

impl CreateRequest {
    /// A request for a `size`-byte disk in `format`, every option at its
    /// default.
    pub fn new(format: DiskFormat, size: u64) -> CreateRequest {
        CreateRequest {
            format,
            size,
            allocation_unit: None,
            vhd_sizing: VhdSizing::default(),
        }
    }
}

/// Create an empty image of `req.format` in `file` and open it
/// read-write.
///
/// `file` must be writable and empty (length 0): every format here grows
/// its file as blocks are written and finds the end by the file's
/// length, so bytes already in a file (or a block device's fixed length)
/// would be mistaken for the image's end. Nothing is written before the
/// request is checked; the structure that makes the file recognizable as
/// its format is written last, so an interrupted creation is not taken
/// for an image.
///
/// Errors: `InvalidInput` for a size of 0, a size over the format's limit
/// (qcow2: what its L1 table can address; VHD: 2040 GiB; VHDX: 64 TiB),
/// a bad allocation unit or a non-empty file; `PermissionDenied` for a
/// read-only file; `Unsupported` for raw, VMDK and Android sparse images
/// (a raw image is the file itself, sized with `set_len`).
pub fn create(file: Arc<dyn BlockDevice>, req: &CreateRequest) -> io::Result<Arc<dyn DiskImage>> {
    let format = req.format;
    if !matches!(format, DiskFormat::Qcow2 | DiskFormat::Vhd | DiskFormat::Vhdx) {
        return Err(crate::unsupported(
            format,
            "creating an image is supported for qcow2, vhd and vhdx only (a raw image is the file itself)",
        ));
    }
    if file.read_only() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{format}: the file to create the image in is open read-only"),
        ));
    }
    if file.size() != 0 {
        return Err(invalid(
            format,
            format_args!(
                "the file to create the image in holds {} bytes; it must be empty (the image grows at the \
                 file's end)",
                file.size()
            ),
        ));
    }
    let size = sectors(format, req.size)?;
    let image: Arc<dyn DiskImage> = match format {
        DiskFormat::Qcow2 => Arc::new(crate::qcow2::create(file, size, req.allocation_unit)?),
        DiskFormat::Vhd => Arc::new(crate::vhd::create(file, size, req.allocation_unit, req.vhd_sizing)?),
        DiskFormat::Vhdx => Arc::new(crate::vhdx::create(file, size, req.allocation_unit)?),
        _ => unreachable!("refused above"),
    };
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_blockdev::MemDevice;

    #[test]
    fn formats_that_are_not_created_here_are_unsupported() {
        for f in [DiskFormat::Raw, DiskFormat::Vmdk, DiskFormat::AndroidSparse] {
            let dev = Arc::new(MemDevice::new(0));
            let e = create(dev, &CreateRequest::new(f, 1 << 20)).map(|_| ()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        }
    }

    #[test]
    fn zero_sizes_full_files_and_read_only_files_are_refused() {
        for f in [DiskFormat::Qcow2, DiskFormat::Vhd, DiskFormat::Vhdx] {
            let e = create(Arc::new(MemDevice::new(0)), &CreateRequest::new(f, 0))
                .map(|_| ())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("0 bytes"), "{e}");
            let e = create(Arc::new(MemDevice::new(4096)), &CreateRequest::new(f, 1 << 20))
                .map(|_| ())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("must be empty"), "{e}");
            let ro = Arc::new(MemDevice::from_vec_read_only(Vec::new()));
            let e = create(ro, &CreateRequest::new(f, 1 << 20)).map(|_| ()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            let e = create(Arc::new(MemDevice::new(0)), &CreateRequest::new(f, u64::MAX))
                .map(|_| ())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
    }
}
