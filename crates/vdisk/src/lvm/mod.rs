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

/// The volume groups on a disk: its PVs may be the whole disk or any of
/// its partitions (the usual RHEL layout is a GPT or MBR partition holding
/// one PV), so the disk and each partition that can be opened are read.
pub fn disk_volume_groups(disk: &std::sync::Arc<dyn crate::BlockDevice>) -> io::Result<Vec<VolumeGroup>> {
    use ext4kit_blockdev::partition::{open_location, partitions, Location};
    let mut devs = vec![("the whole disk".to_string(), disk.clone())];
    // A damaged table is the partition code's error to report; here it
    // only means there are no partitions to look in.
    if let Ok(Some(table)) = partitions(&**disk) {
        for p in table.partitions.iter().filter(|p| !p.extended && p.problem.is_none()) {
            if let Ok(dev) = open_location(disk.clone(), Location::Partition(p.number)) {
                devs.push((format!("partition {}", p.number), dev));
            }
        }
    }
    // A whole disk that is itself a PV also shows its partitions' bytes
    // inside its data area; LVM's filters skip a PV's partitions the same
    // way: a labelled whole disk is the PV.
    if physical_volume(&**disk)?.is_some() {
        devs.truncate(1);
    }
    volume_groups(&devs)
}

/// Open the logical volume `spec` ("VG/LV", as `/dev/VG/LV` names it) of a
/// disk (see [`disk_volume_groups`]).
pub fn open_on_disk(
    disk: &std::sync::Arc<dyn crate::BlockDevice>,
    spec: &str,
    writable: bool,
) -> io::Result<LogicalVolume> {
    let Some((vg, lv)) = spec
        .split_once('/')
        .filter(|(v, l)| !v.is_empty() && !l.is_empty() && !l.contains('/'))
    else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{spec:?} is not VG/LV (a volume group and a logical volume, e.g. rhel/root)"),
        ));
    };
    let groups = disk_volume_groups(disk)?;
    let Some(g) = groups.iter().find(|g| g.name() == vg) else {
        let names: Vec<&str> = groups.iter().map(|g| g.name()).collect();
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            if names.is_empty() {
                format!("lvm2: no volume group {vg}: the disk holds no LVM2 physical volume")
            } else {
                format!("lvm2: no volume group {vg} on this disk (it has: {})", names.join(", "))
            },
        ));
    };
    g.open(lv, writable)
}
