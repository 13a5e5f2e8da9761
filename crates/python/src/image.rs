//! Where a filesystem's image comes from: a path or URL (through the
//! library's own open: container formats, partitions, remote images), or
//! a Python file-like object (through [`PyFileDevice`]). The journal
//! report reads the image again, beside the open filesystem, so both ways
//! keep what reopens it.

use std::path::PathBuf;
use std::sync::Arc;

use ext4kit::device::{vdisk, BlockDevice, DiskRequest};
use ext4kit::{Fs, Location, OpenOptions};

use crate::device::PyFileDevice;

/// See the module doc.
pub(crate) enum ImageSource {
    /// A path on this machine or a URL.
    Path(PathBuf),
    /// A Python object's bytes.
    Object(Arc<PyFileDevice>),
}

impl ImageSource {
    /// Open the filesystem at `opts.location` of the image.
    pub(crate) fn open(&self, opts: &OpenOptions) -> ext4kit::Result<Arc<Fs>> {
        match self {
            ImageSource::Path(p) => Fs::open_image(p, opts),
            ImageSource::Object(dev) => Fs::open_image_device(dev.clone(), opts),
        }
    }

    /// The journal of the filesystem at `loc`, read from the image as it is
    /// now (never through the open filesystem's in-memory replay).
    pub(crate) fn journal(&self, loc: Location) -> ext4kit::Result<ext4kit::journal::JournalReport> {
        let req = DiskRequest {
            writable: false,
            format: None,
            any_backing_path: false,
            volume: None,
        };
        let disk = match self {
            ImageSource::Path(p) => ext4kit::device::open_disk(p, &req),
            ImageSource::Object(dev) => vdisk::open_device(dev.clone(), None, &req),
        }
        .map_err(|e| ext4kit::Error::io("opening the image", e))?;
        let dev: Arc<dyn BlockDevice> = ext4kit::device::open_location(disk.into_device(), loc)
            .map_err(|e| ext4kit::Error::io("finding the filesystem", e))?;
        ext4kit::journal::inspect(&dev)
    }

    /// What `repr()` shows.
    pub(crate) fn describe(&self) -> String {
        match self {
            ImageSource::Path(p) => format!("{:?}", p.display().to_string()),
            ImageSource::Object(_) => "<file object>".to_string(),
        }
    }
}
