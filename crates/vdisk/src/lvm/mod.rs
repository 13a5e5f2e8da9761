//! LVM2 logical volumes as block devices.
//!
//! RHEL, Fedora and CentOS put the root filesystem in an LVM2 logical
//! volume: the disk's partition is a *physical volume* (PV), one or more
//! PVs make a *volume group* (VG), and the VG's text metadata maps each
//! *logical volume* (LV) onto extents of the PVs. This module reads that
//! mapping from the PVs themselves, without the kernel's device-mapper,
//! and presents an LV as a [`BlockDevice`] so the engine can open the
//! filesystem inside it.
//!
//! The layers, each its own module and named as LVM names them:
//! - [`label`]: the `LABELONE` sector and the PV header (uuid, data and
//!   metadata areas) — [`physical_volume`].
//! - `mda`: a metadata area's header and its circular text buffer.
//! - `metadata`: the text's syntax (LVM's config tree).
//! - [`vg`]: a VG's metadata interpreted and checked, and the VGs
//!   assembled from many devices — [`volume_groups`].
//! - [`lv`]: an LV's linear and striped segments as a device.
//!
//! Everything read from disk is treated as hostile: offsets are checked
//! against the device, sizes bounded before allocation, extent arithmetic
//! checked for overflow and against each PV's extent count, an LV's
//! segments checked to tile it exactly and LVs checked not to share an
//! extent; a damaged structure is an `InvalidData` error saying
//! "lvm2: ..." and what is wrong where. Layouts this module does not map
//! (thin, RAID, mirror, cache, VDO, snapshots) are `Unsupported` errors
//! naming the segment type, never a wrong answer.
//!
//! Writes go straight to the PVs' extents. The LV must not be active in a
//! kernel at the same time (the same rule as for any image opened
//! read-write); the metadata is never written.

use std::fmt;
use std::io;

#[cfg(doc)]
use crate::BlockDevice;

mod crc;
pub mod label;
pub mod lv;
mod mda;
mod metadata;
pub mod vg;

pub use label::{physical_volume, PhysicalVolume};
pub use lv::{LogicalVolume, LvInfo};
pub use vg::{volume_groups, VolumeGroup};

/// The error for damaged LVM2 structures: `InvalidData`, "lvm2: ...".
pub(crate) fn corrupt_lvm(what: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("lvm2: {what}"))
}

/// The error for valid LVM2 layouts this module does not implement:
/// `Unsupported`, "lvm2: ...".
pub(crate) fn unsupported_lvm(what: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("lvm2: {what}"))
}
