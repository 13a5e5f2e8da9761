//! Opening an image file as the disk it holds: the container format is
//! chosen by content ([`detect`]) unless the user forced one, and the
//! format's device is what the partition table and the filesystem are
//! read from.

use std::io;
use std::path::Path;
use std::sync::Arc;

use ext4kit_blockdev::FileDevice;

use crate::android_sparse::AndroidSparseDisk;
use crate::lvm::LvInfo;
use crate::qcow2::Qcow2Disk;
use crate::vhd::VhdDisk;
use crate::vhdx::VhdxDisk;
use crate::vmdk::VmdkDisk;
use crate::{detect, BlockDevice, DiskFormat, DiskImage, LayerInfo, NamedFiles};

/// How to open an image file's container.
#[derive(Debug, Clone, Default)]
pub struct DiskRequest {
    /// Open for writing (the format's tables are updated as blocks are written).
    pub writable: bool,
    /// The container format, when the user forced it (`--format`); by
    /// content otherwise.
    pub format: Option<DiskFormat>,
    /// Follow files the image names (backing files, extents) anywhere on
    /// this machine, not only inside the image's directory.
    pub any_backing_path: bool,
    /// An LVM2 logical volume of the disk ("VG/LV"): the disk returned is
    /// that volume, found on the disk or any of its partitions.
    pub volume: Option<String>,
}

/// The disk an image file holds, and the layers it came through.
pub struct Disk {
    dev: Arc<dyn BlockDevice>,
    /// The container; `None` for a raw image.
    layer: Option<LayerInfo>,
    /// The logical volume, when one was asked for.
    volume: Option<LvInfo>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("size", &self.dev.size())
            .field("layer", &self.layer)
            .field("volume", &self.volume)
            .finish()
    }
}

impl Disk {
    /// The guest's disk.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The guest's disk, owned.
    pub fn into_device(self) -> Arc<dyn BlockDevice> {
        self.dev
    }

    /// The container layer (format, variant, facts); `None` for raw.
    pub fn layer(&self) -> Option<&LayerInfo> {
        self.layer.as_ref()
    }

    /// The logical volume the disk is, when one was asked for.
    pub fn volume(&self) -> Option<&LvInfo> {
        self.volume.as_ref()
    }

    /// The container format.
    pub fn format(&self) -> DiskFormat {
        self.layer.as_ref().map_or(DiskFormat::Raw, |l| l.format)
    }
}

/// Open the image file at `path`.
pub fn open_file(path: &Path, req: &DiskRequest) -> io::Result<Disk> {
    let file = FileDevice::open(path, req.writable)?;
    open_device(Arc::new(file), Some(path), req)
}

/// Open the image held by `file` (at `path` on this machine, if it is a
/// local file: the names it holds are resolved against its directory).
pub fn open_device(file: Arc<dyn BlockDevice>, path: Option<&Path>, req: &DiskRequest) -> io::Result<Disk> {
    let format = match req.format {
        Some(f) => f,
        None => detect(&*file)?,
    };
    let named = match path {
        Some(p) => NamedFiles::beside(p, req.any_backing_path),
        None => NamedFiles::none(),
    };
    let disk = open_container(file, path, format, &named, req.writable)?;
    match &req.volume {
        None => Ok(disk),
        Some(spec) => {
            let lv = crate::lvm::open_on_disk(&disk.dev, spec, req.writable)?;
            Ok(Disk {
                volume: Some(lv.describe()),
                dev: Arc::new(lv),
                layer: disk.layer,
            })
        }
    }
}

fn open_container(
    file: Arc<dyn BlockDevice>,
    path: Option<&Path>,
    format: DiskFormat,
    named: &NamedFiles,
    w: bool,
) -> io::Result<Disk> {
    let image: Arc<dyn DiskImage> = match format {
        DiskFormat::Raw => {
            return Ok(Disk {
                dev: file,
                layer: None,
                volume: None,
            })
        }
        DiskFormat::Qcow2 => Arc::new(Qcow2Disk::open(file, path, w, named)?),
        DiskFormat::Vhd => Arc::new(VhdDisk::open(file, w)?),
        DiskFormat::AndroidSparse => Arc::new(AndroidSparseDisk::open(file, w)?),
        DiskFormat::Vhdx => Arc::new(VhdxDisk::open(file, w)?),
        // A sparse extent grows as grains are written: a regular file's
        // FileDevice grows (BlockDevice::grows) and follows its length.
        DiskFormat::Vmdk => Arc::new(VmdkDisk::open(file, w, named)?),
    };
    let layer = Some(image.layer());
    Ok(Disk {
        dev: image,
        layer,
        volume: None,
    })
}
