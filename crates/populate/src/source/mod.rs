//! Where the files of an image come from: a host directory ([`dir`]), a
//! tar archive ([`tar`], compressed or not), an OCI image ([`oci`]: a
//! layout directory, an `oci-archive` or a `docker save` tar). Each reads its own format
//! and reports [`Entry`]s, in an order that puts a directory before what
//! it holds, to a [`Sink`] — the writer that puts them into the image.
//!
//! [`open`] tells the kinds apart by what is there (a directory, or a
//! file's first bytes), never by a file name.

pub mod compress;
pub mod dir;
pub mod oci;
pub mod tar;

use std::path::{Path, PathBuf};

use crate::entry::{Entry, FileData};
use crate::error::{Error, Result};

/// What receives a source's entries.
pub trait Sink {
    /// A new layer of an image starts: an opaque marker in it keeps what
    /// this layer made and removes what the layers before made.
    fn begin_layer(&mut self) -> Result<()> {
        Ok(())
    }

    /// One entry; a regular file's data comes with it and must be read
    /// before the next entry arrives.
    fn entry(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Result<()>;
}

/// A source of entries.
pub trait Source {
    /// What to call it in messages (its path).
    fn name(&self) -> String;
    /// Report every entry to `sink`, the root first.
    fn visit(&mut self, sink: &mut dyn Sink) -> Result<()>;
}

/// What `path` holds, by its contents: a directory, a tar archive
/// (compressed as said), or neither.
pub fn kind_of(path: &Path) -> Result<Option<compress::Compression>> {
    let md = std::fs::metadata(path).map_err(|e| Error::source(path, format!("{e}")))?;
    if md.is_dir() {
        return Ok(None);
    }
    let head = compress::head(path).map_err(|e| Error::source(path, e))?;
    let c = compress::classify(&head);
    if c == compress::Compression::None && !tar::looks_like_tar(&head) {
        return Err(Error::source(
            path,
            "not a directory and not a tar archive (plain, gzip, zstd or xz) or OCI image",
        ));
    }
    Ok(Some(c))
}

/// Whether `path` is an archive (a tar, compressed or not, or an OCI
/// image packed in one) rather than a file to copy as it is.
pub fn is_archive(path: &Path) -> bool {
    path.is_file() && matches!(kind_of(path), Ok(Some(_)))
}

/// Open `path` as the source it is: an OCI image (layout directory or
/// archive, the image `choice` picks), a directory, or a tar archive
/// (plain, gzip, zstd or xz).
pub fn open(path: &Path, choice: &oci::ImageChoice) -> Result<Box<dyn Source>> {
    let kind = kind_of(path)?;
    if oci::is_image(path, kind.unwrap_or(compress::Compression::None)) {
        return Ok(Box::new(oci::OciSource::new(path, choice.clone())));
    }
    if *choice != oci::ImageChoice::default() {
        return Err(Error::source(
            path,
            "--image and --platform choose within an OCI image; this is none",
        ));
    }
    match kind {
        None => Ok(Box::new(dir::DirSource::new(path))),
        Some(c) => Ok(Box::new(tar::TarSource::new(PathBuf::from(path), c))),
    }
}
