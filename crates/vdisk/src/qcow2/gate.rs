//! Which files a qcow2 chain may open: imago opens a backing file (and an
//! external data file) only through an `ImplicitOpenGate`, and ours lets a
//! name through only as [`NamedFiles`] allows, refuses a chain that comes
//! back to a file already in it, and bounds the chain's length. A qcow2
//! of the chain whose compressed clusters are zstd is handed to our own
//! reader ([`super::zstd_image`]) instead of imago, which refuses it.

use std::any::TypeId;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use imago::format::gate::ImplicitOpenGate;
use imago::qcow2::Qcow2;
use imago::{FormatAccess, FormatDriverBuilder, StorageOpenOptions};

use super::storage::DevStorage;
use crate::NamedFiles;

/// Longest backing chain followed. qemu has no limit; real chains (a
/// snapshot per backup) stay in the tens, and a bound turns a hostile
/// chain of thousands into an error instead of thousands of open files.
const MAX_CHAIN: usize = 64;

/// The gate for one image of a chain.
pub(super) struct ChainGate {
    /// Policy for names, relative to the image being opened.
    named: NamedFiles,
    /// Files of the chain so far, top first (canonical paths).
    chain: Vec<PathBuf>,
}

impl ChainGate {
    pub(super) fn new(named: NamedFiles, top: Option<PathBuf>) -> ChainGate {
        ChainGate {
            named,
            chain: top.into_iter().collect(),
        }
    }
}

impl ImplicitOpenGate<DevStorage> for ChainGate {
    fn open_format<F: FormatDriverBuilder<DevStorage>>(&mut self, builder: F) -> io::Result<FormatAccess<DevStorage>> {
        // The backing image's own backing file is named relative to it.
        let named = match builder.get_image_path() {
            Some(p) => self.named.for_file(&p),
            None => NamedFiles::none(),
        };
        let mut next = ChainGate {
            named,
            chain: self.chain.clone(),
        };
        // imago asks for a qcow2 (not a raw) backing file by the builder's
        // type; a zstd one is ours to read.
        if TypeId::of::<F::Format>() == TypeId::of::<Qcow2<DevStorage>>() {
            if let Some(path) = builder.get_image_path() {
                if let Some(ours) = super::zstd_image::open_if_zstd(&path, builder.get_writable(), &mut next)? {
                    return Ok(ours);
                }
            }
        }
        Ok(FormatAccess::new(builder.open(next)?))
    }

    fn open_storage(&mut self, opts: StorageOpenOptions) -> io::Result<DevStorage> {
        let what = "backing file";
        let name = opts
            .get_filename()
            .map(|p| p.to_string_lossy().into_owned())
            .ok_or_else(|| io::Error::new(io::ErrorKind::PermissionDenied, "qcow2: a file with no name"))?;
        let path = self.named.resolve(what, &name)?;
        if let Some(at) = self.chain.iter().position(|p| *p == path) {
            let cycle: Vec<String> = self.chain[at..]
                .iter()
                .chain([&path])
                .map(|p| p.display().to_string())
                .collect();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "qcow2: the backing chain comes back to a file already in it: {}",
                    cycle.join(" -> ")
                ),
            ));
        }
        if self.chain.len() >= MAX_CHAIN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("qcow2: a backing chain longer than {MAX_CHAIN} files"),
            ));
        }
        self.chain.push(path.clone());
        let dev = ext4kit_blockdev::FileDevice::open(&path, opts.get_writable())
            .map_err(|e| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display())))?;
        Ok(DevStorage::new(Arc::new(dev), Some(path)))
    }
}
