//! Where a filesystem lives: the block devices the engine opens, and the
//! partition tables and offsets that place a filesystem inside an image.
//!
//! [`Fs::open_image`](crate::Fs::open_image) opens a file at a
//! [`Location`]; [`Fs::open_device`](crate::Fs::open_device) takes any
//! [`BlockDevice`] — a [`FileDevice`] (an image file or a block device), a
//! [`MemDevice`] (an image in memory), a [`WindowDevice`] (a byte range of
//! another device), a [`scratch::ScratchDevice`] (only the written blocks,
//! for an image exported in another format, e.g. [`android_sparse`]). A frontend lists a disk's partitions with
//! [`partitions`] and recognises ext2/3/4 in one with [`probe_ext`]. These
//! are the `ext4kit-blockdev` crate's, re-exported so that a program needs
//! the library alone.

pub use ext4kit_blockdev::partition::{partitions, probe_ext, ExtProbe, Partition, PartitionTable, TableKind};
pub use ext4kit_blockdev::{android_sparse, scratch};
pub use ext4kit_blockdev::{open_location, BlockDevice, FileDevice, Location, MemDevice, WindowDevice};
/// Container formats (qcow2, VHDX, VMDK, VHD, Android sparse): the
/// `ext4kit-vdisk` crate, re-exported.
pub use ext4kit_vdisk as vdisk;
pub use ext4kit_vdisk::{Disk, DiskFormat, DiskRequest, LayerInfo};

/// Whether `name` is a URL [`open_disk`] reads remotely (https://, s3://,
/// gs://, az://), rather than a path on this machine.
pub fn is_remote(name: &std::path::Path) -> bool {
    #[cfg(feature = "remote")]
    if name.to_str().is_some_and(ext4kit_remote::is_url) {
        return true;
    }
    let _ = name;
    false
}

/// Open the image `name` names as the guest's disk, through its container
/// format (and logical volume, if asked): a file or block device on this
/// machine, or — with the `remote` feature — a URL (`https://`, `s3://`,
/// `gs://`, `az://`) read by ranges through a bounded cache, read-only
/// (credentials from each store's standard environment variables).
///
/// A remote image's backing files are never followed: a name in it would
/// be a path on this machine chosen by whoever made the image.
pub fn open_disk(name: &std::path::Path, req: &DiskRequest) -> std::io::Result<Disk> {
    #[cfg(feature = "remote")]
    if let Some(url) = name.to_str().filter(|s| ext4kit_remote::is_url(s)) {
        if req.writable {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{url}: a remote image is read-only; copy it to a local file to change it"),
            ));
        }
        let dev = ext4kit_remote::open_url(url, &ext4kit_remote::RemoteOptions::default())?;
        return ext4kit_vdisk::open_device(std::sync::Arc::new(dev), None, req);
    }
    ext4kit_vdisk::open_file(name, req)
}
