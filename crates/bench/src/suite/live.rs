//! One peer holding one image while a workload runs on it: the library's
//! `Fs` opened in-process, or a mount (ours, fuse2fs, the kernel's).
//!
//! Workloads see a [`Target`]: the `Fs` to call, or a directory to use
//! with ordinary system calls. [`Live::cold`] starts over with empty
//! caches (a new `Fs`, or a new mount after dropping the kernel's caches)
//! for the phases that must read from the image; [`Live::settle`] makes
//! everything written durable on the image and says how long that took.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ext4kit::{Fs, OpenOptions};

use super::PeerId;
use crate::peers::{Peer, PeerConfig, PeerMount};

/// What a workload drives.
pub enum Target<'a> {
    /// The library, in-process.
    Lib(&'a Arc<Fs>),
    /// A mount point: the workload uses system calls (or programs) on it.
    Dir(&'a Path),
}

enum Held {
    Lib(Arc<Fs>),
    Mount(PeerMount),
    Loop(ext4kit_testkit::LoopMount),
    None,
}

/// A peer with an image open or mounted.
pub struct Live<'a> {
    peer: PeerId,
    cfg: &'a PeerConfig,
    image: PathBuf,
    mnt: PathBuf,
    held: Held,
    /// The largest `VmHWM` of the FUSE servers this peer ran, KiB.
    peak_rss_kib: Option<u64>,
}

fn open_lib(image: &Path, cache_budget: usize) -> Result<Arc<Fs>, String> {
    Fs::open_image(
        image,
        &OpenOptions {
            read_only: false,
            cache_budget,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))
}

impl<'a> Live<'a> {
    /// Open or mount `image` as `peer` (the kernel's caches dropped first,
    /// so every peer starts from the same cold image).
    pub fn start(peer: PeerId, cfg: &'a PeerConfig, image: &Path, mnt: &Path) -> Result<Self, String> {
        let mut l = Live {
            peer,
            cfg,
            image: image.to_path_buf(),
            mnt: mnt.to_path_buf(),
            held: Held::None,
            peak_rss_kib: None,
        };
        l.open()?;
        Ok(l)
    }

    fn open(&mut self) -> Result<(), String> {
        crate::drop_kernel_caches();
        self.held = match self.peer {
            PeerId::Lib => Held::Lib(open_lib(&self.image, self.cfg.cache_budget)?),
            PeerId::Mount => Held::Mount(PeerMount::mount(
                Peer::Ext4kit,
                self.cfg,
                &self.image,
                &self.mnt,
                false,
            )?),
            PeerId::Fuse2fs => Held::Mount(PeerMount::mount(
                Peer::Fuse2fs,
                self.cfg,
                &self.image,
                &self.mnt,
                false,
            )?),
            PeerId::Kernel => Held::Mount(PeerMount::mount(Peer::Kernel, self.cfg, &self.image, &self.mnt, false)?),
            PeerId::Ext2 => {
                std::fs::create_dir_all(&self.mnt).map_err(|e| format!("{}: {e}", self.mnt.display()))?;
                Held::Loop(
                    ext4kit_testkit::LoopMount::mount(&self.image, &self.mnt, "ext2", false)
                        .map_err(|e| format!("mount -t ext2: {e}"))?,
                )
            }
        };
        Ok(())
    }

    fn close(&mut self) -> Result<(), String> {
        match std::mem::replace(&mut self.held, Held::None) {
            Held::Lib(fs) => {
                fs.sync().map_err(|e| format!("sync: {e}"))?;
                drop(fs);
                Ok(())
            }
            Held::Mount(m) => {
                // Read before the unmount: the server exits with it.
                if let Some(k) = m.server_peak_rss_kib() {
                    self.peak_rss_kib = Some(self.peak_rss_kib.map_or(k, |p| p.max(k)));
                }
                m.unmount()
            }
            Held::Loop(m) => m.unmount().map_err(|e| e.to_string()),
            Held::None => Ok(()),
        }
    }

    /// The FUSE server's resident memory now, MiB (None: no server).
    pub fn server_rss_mib(&self) -> Option<f64> {
        match &self.held {
            Held::Mount(m) => m.server_rss_kib().map(|k| k as f64 / 1024.0),
            _ => None,
        }
    }

    /// The `ext4kit` binary of the mount (and of the image builds).
    pub fn ext4kit_bin(&self) -> &Path {
        &self.cfg.ext4kit_bin
    }

    /// Which peer this is.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// The directory the image is in (the run's work directory), where a
    /// workload may keep inputs between rounds (the tree's tarball).
    pub fn work_dir(&self) -> PathBuf {
        self.image
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }

    /// What the workload drives now.
    pub fn target(&self) -> Result<Target<'_>, String> {
        match &self.held {
            Held::Lib(fs) => Ok(Target::Lib(fs)),
            Held::Mount(m) => Ok(Target::Dir(m.path())),
            Held::Loop(m) => Ok(Target::Dir(m.path())),
            Held::None => Err("the image is not open (an earlier step failed)".into()),
        }
    }

    /// Close and open again with every cache empty: the library's (a new
    /// `Fs`), the FUSE server's (a new server) and the kernel's (dropped).
    pub fn cold(&mut self) -> Result<(), String> {
        self.close()?;
        self.open()
    }

    /// Make everything written so far durable on the image; seconds taken.
    /// The library: `Fs::sync`. The kernel: `syncfs`. A FUSE server: an
    /// unmount (and a new mount after it), because `sync`/`syncfs` do not
    /// reach a FUSE server (TESTING-NOTES), so only the unmount says its
    /// writes are home.
    pub fn settle(&mut self) -> Result<f64, String> {
        let t = Instant::now();
        let kernel_dir = match &self.held {
            Held::Mount(m) if self.peer == PeerId::Kernel => Some(m.path().to_path_buf()),
            Held::Loop(m) => Some(m.path().to_path_buf()),
            _ => None,
        };
        if let Held::Lib(fs) = &self.held {
            fs.sync().map_err(|e| format!("sync: {e}"))?;
        } else if let Some(dir) = kernel_dir {
            let f = std::fs::File::open(&dir).map_err(|e| format!("open {}: {e}", dir.display()))?;
            rustix::fs::syncfs(&f).map_err(|e| format!("syncfs: {e}"))?;
        } else {
            self.close()?;
            let secs = t.elapsed().as_secs_f64();
            self.open()?;
            return Ok(secs);
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Close (sync, unmount and wait for the server) so the image can be
    /// checked. Returns the FUSE server's peak resident memory in MiB (the
    /// largest of the servers a remount started), for the peers that have
    /// a server: the target is that it stay within `--cache-mib` plus a
    /// bounded overhead.
    pub fn finish(mut self) -> Result<Option<f64>, String> {
        self.close()?;
        Ok(self.peak_rss_kib.map(|k| k as f64 / 1024.0))
    }
}
