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
