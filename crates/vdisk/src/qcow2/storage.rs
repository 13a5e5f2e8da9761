//! The file under a qcow2 image, for imago: any of our block devices (an
//! image file, a recording device in the crash tests, a remote object).
//!
//! imago declares its storage primitives `unsafe fn`: the contract is the
//! caller's (a pure read or write bypasses imago's serialization of
//! overlapping requests, so only imago's own layers call them). The bodies
//! here do nothing unsafe; they are plain positional reads and writes on
//! a `BlockDevice`, which is safe to call from many threads.
//!
//! Write barriers while imago writes its metadata back: imago orders its
//! cache write-back (refcount blocks before the L2 tables that point at
//! newly allocated clusters; L2 tables before refcount blocks that free
//! clusters) but issues those writes back to back, with no sync between
//! them, so a device with a volatile cache may keep the L2 table and lose
//! the refcount block — an L2 entry pointing at a cluster whose refcount
//! is 0 (qemu-img check: corruption; the cluster could be handed out
//! twice). qemu syncs the file between the two caches
//! (`qcow2_cache_flush_dependency`). Here, while [`Barriers`]
//! are raised (during [`crate::qcow2::Qcow2Disk`]'s flush, when imago
//! writes only metadata), every write is followed by a sync, so each
//! table is durable before the next one is written.

#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use imago::io_buffers::{IoVector, IoVectorMut};
use imago::storage::drivers::CommonStorageHelper;
use imago::Storage;

use crate::BlockDevice;

/// A block device as imago storage.
pub(crate) struct DevStorage {
    dev: Arc<dyn BlockDevice>,
    /// Its path on this machine, for resolving the names it holds
    /// (backing files); `None` for a device with no path.
    path: Option<PathBuf>,
    helper: CommonStorageHelper,
    /// Raised while imago writes its caches back: every write is then
    /// followed by a device flush (the module doc says why). Shared with
    /// the disk, which raises it ([`Barriers`]).
    barriers: Arc<AtomicBool>,
}

impl DevStorage {
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, path: Option<PathBuf>) -> DevStorage {
        DevStorage {
            dev,
            path,
            helper: CommonStorageHelper::default(),
            barriers: Arc::default(),
        }
    }

    /// The device under this storage (to probe a file's format).
    pub(crate) fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The storage's barrier switch, for [`Barriers::raise`].
    pub(crate) fn barrier_switch(&self) -> Arc<AtomicBool> {
        self.barriers.clone()
    }
}

/// Every write of a storage durable before the next, while this lives.
pub(crate) struct Barriers<'a>(&'a AtomicBool);

impl<'a> Barriers<'a> {
    /// Raise the barriers of the storage whose switch is `switch`.
    pub(crate) fn raise(switch: &'a AtomicBool) -> Self {
        switch.store(true, Ordering::Release);
        Barriers(switch)
    }
}

impl Drop for Barriers<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl fmt::Debug for DevStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevStorage")
            .field("path", &self.path)
            .field("size", &self.dev.size())
            .finish()
    }
}

impl fmt::Display for DevStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}", p.display()),
            None => f.write_str("(device)"),
        }
    }
}

impl Storage for DevStorage {
    fn size(&self) -> io::Result<u64> {
        Ok(self.dev.size())
    }

    fn resolve_relative_path<P: AsRef<Path>>(&self, relative: P) -> io::Result<PathBuf> {
        let relative = relative.as_ref();
        if relative.is_absolute() {
            return Ok(relative.to_path_buf());
        }
        match self.path.as_ref().and_then(|p| p.parent()) {
            Some(dir) => Ok(dir.join(relative)),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: names {} relative to itself, but has no directory",
                    self,
                    relative.display()
                ),
            )),
        }
    }

    fn get_filename(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    unsafe fn pure_readv(&self, bufv: IoVectorMut<'_>, offset: u64) -> io::Result<()> {
        // Past the end of the file reads as zeros (imago's contract: qcow2
        // reads whole clusters, and the last one may be cut short).
        let size = self.dev.size();
        let mut pos = offset;
        for mut slice in bufv.into_inner() {
            let buf: &mut [u8] = &mut slice;
            let inside = size.saturating_sub(pos).min(buf.len() as u64) as usize;
            self.dev.read_at(pos, &mut buf[..inside])?;
            buf[inside..].fill(0);
            pos += buf.len() as u64;
        }
        Ok(())
    }

    unsafe fn pure_writev(&self, bufv: IoVector<'_>, offset: u64) -> io::Result<()> {
        let mut pos = offset;
        for slice in bufv.into_inner() {
            self.dev.write_at(pos, &slice)?;
            pos += slice.len() as u64;
        }
        if self.barriers.load(Ordering::Acquire) {
            self.dev.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // Nothing is buffered here; durability is `sync`.
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.dev.flush()
    }

    unsafe fn invalidate_cache(&self) -> io::Result<()> {
        Ok(())
    }

    fn get_storage_helper(&self) -> &CommonStorageHelper {
        &self.helper
    }
}
