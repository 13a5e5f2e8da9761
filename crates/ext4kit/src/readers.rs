//! Which programs can open an image: U-Boot (reading, writing), GRUB
//! 2.06 and 2.12, Android's platform build, and Linux by version — the
//! `ext4kit-format` crate's table of who supports which feature,
//! re-exported so that a program needs the library alone, and
//! [`image_features`] to judge an existing image.
//!
//! A build for one of them passes [`Reader`]s in
//! [`MkfsOptions::readers`](crate::mkfs::MkfsOptions::readers); an
//! existing image's verdicts are `Reader::check` of its [`FeatureWords`].

pub use ext4kit_format::readers::{
    feature, markdown_table, Effect, FeatureWords, LinuxVersion, Obstacle, Reader, Support, UnknownReader, Verdict,
    Word, READER_NAMES, SURVEY, TABLE,
};

use crate::device::BlockDevice;
use crate::error::{Error, Result};

/// The feature words of the filesystem on `dev`, read from its primary
/// superblock without opening it: an image the engine refuses (an
/// incompat feature it lacks, a bad checksum) is still judged, as each
/// reader decides from these words alone.
pub fn image_features(dev: &dyn BlockDevice) -> Result<FeatureWords> {
    let mut buf = [0u8; 1024];
    dev.read_at(1024, &mut buf)
        .map_err(|e| Error::io("reading the superblock (bytes 1024..2048)", e))?;
    FeatureWords::from_superblock(&buf).map_err(|e| Error::corrupt("superblock", e))
}
