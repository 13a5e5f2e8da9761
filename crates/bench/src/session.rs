//! One workload run on one peer: a sequence of phases on one image, each
//! either writing or only reading, with remounts where a phase must start
//! cold.
//!
//! A peer that cannot write yet (ext4kit's mount is read-only until the
//! write engine is merged into the FUSE server) still gets its read phases
//! measured: the writing phases before them run on a kernel loop mount of
//! the same image as a stand-in (not measured, reported as n/a), then the
//! image is mounted read-only by the peer for the reads. Writing phases
//! after the first read phase are skipped for such a peer.

use std::path::{Path, PathBuf};

use crate::peers::{Peer, PeerConfig, PeerMount};

/// The mounts of one (workload, peer, image).
pub struct Session<'a> {
    peer: Peer,
    cfg: &'a PeerConfig,
    image: PathBuf,
    dir: PathBuf,
    writable: bool,
    cur: Option<PeerMount>,
    read_only_started: bool,
}

impl<'a> Session<'a> {
    /// A session on `image`, mounted at `dir` when a phase needs it;
    /// `writable` false: the peer mounts read-only only (see the module doc).
    pub fn new(peer: Peer, cfg: &'a PeerConfig, image: &Path, dir: &Path, writable: bool) -> Self {
        Self {
            peer,
            cfg,
            image: image.to_path_buf(),
            dir: dir.to_path_buf(),
            writable,
            cur: None,
            read_only_started: false,
        }
    }

    /// Mount `peer` (read-only if `ro`) unless it is already the mount;
    /// `cold`: a new mount in any case, after dropping the kernel's caches
    /// (the page cache of the image file and of the mount). The first mount
    /// of a session is always cold.
    fn ensure(&mut self, peer: Peer, ro: bool, cold: bool) -> Result<&Path, String> {
        let first = self.cur.is_none();
        if cold || self.cur.as_ref().is_none_or(|m| m.peer() != peer) {
            if let Some(m) = self.cur.take() {
                m.unmount()?;
            }
            if cold || first {
                crate::drop_kernel_caches();
            }
            self.cur = Some(PeerMount::mount(peer, self.cfg, &self.image, &self.dir, ro)?);
        }
        Ok(self.cur.as_ref().map(|m| m.path()).unwrap_or(&self.dir))
    }

    /// A phase that writes: `Some(result)` measured on the peer; `None`
    /// when the peer cannot write (run on the kernel stand-in so later read
    /// phases find its files, or skipped after the peer's reads began).
    pub fn write<T>(&mut self, f: impl FnOnce(&Path) -> Result<T, String>) -> Result<Option<T>, String> {
        if self.writable {
            let dir = self.ensure(self.peer, false, false)?.to_path_buf();
            return f(&dir).map(Some);
        }
        if self.read_only_started {
            return Ok(None);
        }
        let dir = self.ensure(Peer::Kernel, false, false)?.to_path_buf();
        f(&dir).map(|_| None)
    }

    /// A phase that only reads, on the peer; `cold`: on a fresh mount with
    /// the kernel's caches dropped (the servers' own caches start empty).
    /// Not cold: on the current mount (the read-only peer replacing a
    /// stand-in finds the image file in the host's page cache, as a
    /// writing peer would).
    pub fn read<T>(&mut self, cold: bool, f: impl FnOnce(&Path) -> Result<T, String>) -> Result<Option<T>, String> {
        let ro = !self.writable;
        let dir = self.ensure(self.peer, ro, cold)?.to_path_buf();
        self.read_only_started |= ro;
        f(&dir).map(Some)
    }

    /// Make everything the peer accepted durable on the image and return
    /// how long that took: `syncfs` on the kernel's mount; for a FUSE
    /// server an unmount (the next phase mounts again), because `sync` and
    /// `syncfs` do not reach a FUSE server (TESTING-NOTES: the kernel sends
    /// FUSE_SYNCFS only when the connection asks for it, which fuser does
    /// not), so unmounting is the only way to know its writes are home.
    /// `None` when the peer did not write (a read-only stand-in).
    pub fn settle(&mut self) -> Result<Option<f64>, String> {
        if !self.writable {
            return Ok(None);
        }
        let t = std::time::Instant::now();
        match self.cur.take() {
            Some(m) if m.peer() == Peer::Kernel => {
                let f = std::fs::File::open(m.path()).map_err(|e| format!("open mount point: {e}"))?;
                rustix::fs::syncfs(&f).map_err(|e| format!("syncfs: {e}"))?;
                self.cur = Some(m);
            }
            Some(m) => m.unmount()?,
            None => {}
        }
        Ok(Some(t.elapsed().as_secs_f64()))
    }

    /// Unmount (waiting for the server to finish writing the image).
    pub fn finish(mut self) -> Result<(), String> {
        match self.cur.take() {
            Some(m) => m.unmount(),
            None => Ok(()),
        }
    }
}
