//! qcow2 (QEMU copy-on-write v2 and v3), read and write, through imago.
//!
//! imago is the qcow2 driver of Hanna Czenczek (a maintainer of qemu's
//! block layer): cluster allocation with refcounts and L2 tables kept
//! consistent, the refcount/L2 cache flush dependencies qemu uses,
//! copy-on-write from backing files, zlib-compressed clusters, and gates
//! on every file an image names. What is ours: images whose compressed
//! clusters are zstd, which imago refuses, are read (never written) by
//! [`zstd_image`], anywhere in a chain; the storage under imago is any
//! of our block devices ([`storage`]), so a qcow2 in a crash test or in
//! object storage is opened as one on disk; the gate applies
//! [`NamedFiles`] to backing files and bounds the chain ([`gate`]); and
//! the header facts `info` shows, with the features refused up front
//! ([`header`]).
//!
//! Durability: [`BlockDevice::flush`] writes imago's cached L2 tables and
//! refcount blocks in dependency order, each synced before the next (a
//! barrier imago itself does not issue: [`storage`]), then syncs the file, so a journal
//! commit the engine writes after a flush never depends on a table entry
//! a power cut could still lose. Writes go to the top image only; a
//! backing file is opened read-only.

mod create;
mod gate;
mod header;
mod storage;
mod zstd_image;

use std::io;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use imago::qcow2::Qcow2;
use imago::{FormatAccess, FormatDriverBuilder};

use crate::{BlockDevice, DiskFormat, DiskImage, LayerInfo, NamedFiles};
use header::Facts;
use storage::{Barriers, DevStorage};

pub(crate) use create::create;

const FORMAT: DiskFormat = DiskFormat::Qcow2;

/// A qcow2 image (and its backing chain) presented as its disk.
pub struct Qcow2Disk {
    access: FormatAccess<DevStorage>,
    /// The top image's barrier switch: raised while imago writes its
    /// caches back ([`storage`]'s module doc).
    barriers: Arc<AtomicBool>,
    facts: Facts,
    writable: bool,
}

impl std::fmt::Debug for Qcow2Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qcow2Disk")
            .field("facts", &self.facts)
            .field("writable", &self.writable)
            .finish()
    }
}

/// imago's error, said as ours ("qcow2: ...").
fn said(e: io::Error) -> io::Error {
    let text = e.to_string();
    if text.starts_with("qcow2") || text.starts_with("backing file") {
        e
    } else {
        io::Error::new(e.kind(), format!("qcow2: {text}"))
    }
}

impl Qcow2Disk {
    /// Open the qcow2 held by `file`. `path` is where the file is on this
    /// machine (backing file names are resolved against its directory and
    /// checked by `named`); `None` for a file that has no path, whose
    /// backing files are then never followed.
    pub fn open(
        file: Arc<dyn BlockDevice>,
        path: Option<&Path>,
        writable: bool,
        named: &NamedFiles,
    ) -> io::Result<Qcow2Disk> {
        if writable && file.read_only() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "qcow2: the file is open read-only",
            ));
        }
        let facts = header::read(&*file)?;
        let canonical = path.map(|p| p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
        let named = if path.is_some() {
            named.clone()
        } else {
            NamedFiles::none()
        };
        let mut gate = gate::ChainGate::new(named, canonical.clone());
        if facts.is_zstd() {
            let name = canonical
                .as_ref()
                .map_or_else(|| "(device)".into(), |p| p.display().to_string());
            if writable {
                return Err(zstd_image::refuse_writable(&name));
            }
            let image = zstd_image::ZstdImage::open(file, canonical.as_deref(), &facts, &mut gate)?;
            return Ok(Qcow2Disk {
                barriers: Arc::default(),
                access: image.into_format(canonical)?,
                facts,
                writable,
            });
        }
        let storage = DevStorage::new(file, canonical);
        let barriers = storage.barrier_switch();
        let qcow2 = Qcow2::<DevStorage>::builder(storage)
            .write(writable)
            .open(gate)
            .map_err(said)?;
        Ok(Qcow2Disk {
            barriers,
            access: FormatAccess::new(qcow2),
            facts,
            writable,
        })
    }

    fn past_end(&self, off: u64, len: usize) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "qcow2: {len} bytes at offset {off} run past the end of the {}-byte disk",
                self.access.size()
            ),
        )
    }
}

impl BlockDevice for Qcow2Disk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.access.size()) {
            return Err(self.past_end(off, buf.len()));
        }
        self.access.read(buf, off).map_err(said)
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "qcow2: opened read-only",
            ));
        }
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.access.size()) {
            return Err(self.past_end(off, buf.len()));
        }
        self.access.write(buf, off).map_err(said)
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        // imago writes refcount blocks and L2 tables back in dependency
        // order but without syncs between them: each is made durable
        // before the next is written (storage.rs says why).
        let barriers = Barriers::raise(&self.barriers);
        self.access.flush().map_err(said)?;
        drop(barriers);
        self.access.sync().map_err(said)
    }

    fn size(&self) -> u64 {
        self.access.size()
    }

    fn read_only(&self) -> bool {
        !self.writable
    }
}

impl DiskImage for Qcow2Disk {
    fn layer(&self) -> LayerInfo {
        let f = &self.facts;
        let mut details = vec![
            ("cluster size".to_string(), f.cluster_size.to_string()),
            ("compression".to_string(), f.compression.to_string()),
        ];
        if let Some(b) = &f.backing {
            details.push(("backing file".into(), b.clone()));
        }
        if !f.snapshots.is_empty() {
            details.push(("snapshots".into(), f.snapshots.join(", ")));
        }
        LayerInfo {
            format: FORMAT,
            variant: format!("v{}", f.version),
            virtual_size: f.size,
            details,
        }
    }
}
