//! Filling an ext2/3/4 image from sources — a host directory, a tar
//! archive (plain, gzip, zstd or xz), an OCI image — through the `ext4kit` library's
//! public calls, without root: `mke2fs -d` and `cp -a` into an image,
//! with the owners a rootless build cannot give a host tree.
//!
//! A [`Source`] reads its own format and reports [`Entry`]s (one per
//! file, a directory before what it holds); the [`Populator`] puts them
//! into an open [`ext4kit::Fs`], each source overlaying the ones before,
//! owners as the [`Owners`] rule makes them. Errors name the source and
//! the entry, and stop the build.
//! [`ImageBuilder`] does the whole build — size, mkfs, fill, output format
//! (raw or Android sparse) — as `ext4kit mkfs -d` does. [`sizing`] says how large an image must
//! be before it is made.
//!
//! ```no_run
//! use ext4kit_populate::{source, Owners, Placement, Populator, Rules};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fs = ext4kit::Fs::open_image("disk.img", &ext4kit::OpenOptions::default())?;
//! let mut p = Populator::new(
//!     &fs,
//!     Rules {
//!         owners: Owners::all_root(),
//!         ..Default::default()
//!     },
//! );
//! let mut tar = source::open("rootfs.tar.gz".as_ref(), &Default::default())?;
//! p.add(&mut *tar, Placement::Into { dir: 2, path: b"/" })?;
//! p.finish()?;
//! fs.sync()?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod builder;
pub mod entry;
mod error;
pub mod file_contexts;
pub mod fs_config;
mod owners;
mod populator;
pub mod sizing;
pub mod source;

pub use builder::{BuildReport, ImageBuilder, ImageSize, OutputFormat};
pub use entry::{Entry, EntryKind, EntryPath, FileData, Meta, Xattrs};
pub use error::{Error, Result};
pub use owners::{IdMap, IdRange, Owners};
pub use populator::{Placement, Populator, Progress, Rules};
pub use source::{Sink, Source};
