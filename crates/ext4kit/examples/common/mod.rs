//! What the examples share: a scratch directory and an empty image file
//! made by ext4kit's own mkfs, so every example runs on a fresh machine,
//! without root and without e2fsprogs.
//!
//! Not every example uses every helper.
#![allow(dead_code)]

use std::error::Error;
use std::path::{Path, PathBuf};

// mkfs and the image-file device are not re-exported by `ext4kit` yet:
// these two imports are the only ones the examples take from its sibling
// crates.
use ext4kit::device::FileDevice;
use ext4kit::mkfs::{mkfs, MkfsOptions};

use ext4kit::{Fs, OpenOptions};

/// A new, empty directory under the system's temporary directory, named
/// for the example and this process. The caller removes it when done.
pub fn scratch_dir(example: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ext4kit-example-{example}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Make an empty ext4 filesystem (mke2fs's defaults: a journal, extents,
/// metadata checksums) in a new sparse file of `size` bytes at `path`.
pub fn make_image(path: &Path, size: u64, opts: &MkfsOptions) -> Result<(), Box<dyn Error>> {
    std::fs::File::create(path)?.set_len(size)?;
    let dev = FileDevice::open(path, true)?;
    mkfs(&dev, size, opts)?;
    Ok(())
}

/// [`make_image`] with the default options.
pub fn make_empty_image(path: &Path, size: u64) -> Result<(), Box<dyn Error>> {
    make_image(path, size, &MkfsOptions::default())
}

/// Open the image at `path` for writing (`OpenOptions::default()` is
/// read-only).
pub fn open_writable(path: &Path) -> ext4kit::Result<std::sync::Arc<Fs>> {
    let opts = OpenOptions {
        read_only: false,
        ..Default::default()
    };
    Fs::open_image(path, &opts)
}
