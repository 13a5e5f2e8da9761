//! Virtual disk formats.
//!
//! The ext4 a user needs to open is rarely a bare file: VM disks are
//! qcow2 (KVM, OpenStack), VMDK (VMware, OVA exports), VHDX (Hyper-V, WSL's
//! `ext4.vhdx`) or VHD (Azure); Android builds ship sparse images; RHEL-
//! family disks put the root filesystem in an LVM2 logical volume. Each
//! format here turns the file that holds it into a [`BlockDevice`] of the
//! guest's disk, so everything above (partition tables, the engine, the
//! mount) sees a plain disk.
//!
//! The stack, bottom up: a file (or a remote object) → a container format
//! chosen by its magic ([`probe`]) → a partition table
//! (`ext4kit_blockdev::partition`) → an LVM2 logical volume → the
//! filesystem.
//!
//! New images go the other way: [`create()`] writes an empty qcow2, VHD or
//! VHDX of a given size into an empty file and opens it read-write, so
//! `mkfs` can put a filesystem straight into the container a VM boots.
//!
//! Every format reads tables and headers from files that may be hostile:
//! an offset is checked against the file before it is followed, a table's
//! size against the file before it is allocated, a chain of files against
//! cycles; the error names the format, the structure and where it is.
//! Files an image names (a qcow2 backing file, a VMDK extent) are opened
//! only as [`NamedFiles`] allows.

#![warn(missing_docs)]
// One module implements imago's storage trait, whose methods are declared
// `unsafe fn` (see qcow2/storage.rs); nothing else may use `unsafe`.
#![deny(unsafe_code)]

use std::fmt;
use std::io;

pub use ext4kit_blockdev::BlockDevice;

pub mod android_sparse;
pub mod create;
pub mod lvm;
pub mod named;
pub mod probe;
pub mod qcow2;
mod sizing;
pub mod stack;
pub mod vhd;
pub mod vhdx;
pub mod vmdk;

pub use create::{create, CreateRequest, VhdSizing};
pub use named::NamedFiles;
pub use probe::{detect, DiskFormat};
pub use stack::{open_device, open_file, Disk, DiskRequest};

/// What one layer of the stack tells `info`: the format, its variant and
/// the size of the disk it presents, plus format-specific facts (a backing
/// file, a cluster size, snapshots) as label/value pairs in the order to
/// show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerInfo {
    /// The container format.
    pub format: DiskFormat,
    /// The variant within the format ("v3", "dynamic", "streamOptimized").
    pub variant: String,
    /// Size in bytes of the disk this layer presents.
    pub virtual_size: u64,
    /// Further facts, label and value.
    pub details: Vec<(String, String)>,
}

impl fmt::Display for LayerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.format)?;
        if !self.variant.is_empty() {
            write!(f, " ({})", self.variant)?;
        }
        Ok(())
    }
}

/// A container format presented as the guest's disk.
///
/// Writes follow the format's own ordering rule: data reaches the file
/// before the table entry that points at it, so an interrupted write never
/// leaves an entry pointing at garbage; [`BlockDevice::flush`] makes every
/// completed write durable, table updates included, so a journal commit
/// the engine issues after a flush never depends on a table entry that a
/// power cut could still lose.
pub trait DiskImage: BlockDevice {
    /// This layer's description for `info`.
    fn layer(&self) -> LayerInfo;
}

/// The error for a malformed image: `InvalidData`, naming the format and
/// what is wrong where.
pub fn corrupt(format: DiskFormat, what: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{format}: {what}"))
}

/// The error for a valid image that uses something this crate does not
/// implement (a feature, a subformat, writing where the format cannot be
/// written): `Unsupported`, naming the format and the feature.
pub fn unsupported(format: DiskFormat, what: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("{format}: {what}"))
}
