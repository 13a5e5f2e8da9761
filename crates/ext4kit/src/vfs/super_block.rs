//! The vfs layer's state of one open filesystem: the kernel's VFS
//! `struct super_block` (not the on-disk superblock, which is the ext4
//! layer's `SuperState`, reached through [`Volume`]).
//!
//! It owns the parts every operation works on — the volume below
//! (`s_fs_info`), the inode cache, the dentry cache, the page budget, the
//! frontends' holds, the background worker, and the mount's flags
//! (`SB_SYNCHRONOUS`, `SB_DIRSYNC`, why it is read-only) — and gives them
//! out by reference. The operations themselves are module functions that
//! take `sb: &SuperBlock` (`namespace::unlink(sb, ...)`,
//! `io::write_inode(sb, ...)`), and [`Fs`](super::Fs) is the public face
//! that calls them. Nothing here imports an operation: data flows down.
//!
//! The caches, the volume and the holds are shared with the background
//! worker, hence the `Arc`s; the accessors hand out `&Arc`s, so a call
//! through them costs what a field access did.

use std::sync::Arc;

use ext4kit_format::inode::{flags as fl, Timestamp};

use super::dcache::Dcache;
use super::holds::Holds;
use super::icache::{CachedInode, Icache};
use super::pagecache::PageBudget;
use super::releasing::Releasing;
use crate::error::{Errno, Result};
use crate::ext4::{OpenOptions, Volume, ROOT_INO};
use ext4kit_cache::flusher::Flusher;

/// The filesystem-wide synchronous modes (mount options `sync` and
/// `dirsync`, the kernel's `SB_SYNCHRONOUS` and `SB_DIRSYNC`), given with
/// the open options; `vfs::syncmode` applies them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SyncMount {
    /// Every change durable when it returns (`-o sync`).
    pub(crate) sync: bool,
    /// Directory changes durable when they return (`-o dirsync`).
    pub(crate) dirsync: bool,
}

impl SyncMount {
    /// `IS_SYNC` of an inode with flags `flags`.
    #[inline]
    pub(crate) fn is_sync(self, flags: u32) -> bool {
        self.sync || flags & fl::SYNC != 0
    }

    /// `IS_DIRSYNC` of a directory with flags `flags`.
    #[inline]
    pub(crate) fn is_dirsync(self, flags: u32) -> bool {
        self.sync || self.dirsync || flags & (fl::SYNC | fl::DIRSYNC) != 0
    }
}

/// One open filesystem as the vfs layer sees it (see the module doc).
#[derive(Debug)]
pub(crate) struct SuperBlock {
    /// The ext4 layer below.
    vol: Arc<Volume>,
    /// In-memory inodes.
    icache: Arc<Icache>,
    /// Dentries.
    dcache: Arc<Dcache>,
    /// Page-cache memory accounting.
    pages: Arc<PageBudget>,
    /// Frontend holds by inode number (`vfs::holds`).
    holds: Arc<Holds>,
    /// Frees of unlinked inodes in flight (`vfs::releasing`).
    releasing: Releasing,
    /// Reclaim and checkpoints off the callers' threads (`ext4kit_cache::flusher`);
    /// none when no thread could be started (the caches then work inline),
    /// and none once stopped at the close.
    flusher: Option<Flusher>,
    /// The `sync` / `dirsync` open options.
    sync_mount: SyncMount,
    /// Why a read-write open became read-only (`vfs::mount`).
    read_only_reason: Option<String>,
}

impl SuperBlock {
    /// The caches over an opened volume, sized from
    /// [`OpenOptions::cache_budget`]: an eighth of it for inodes (about
    /// 1 KiB each) and an eighth for dentries (about 256 bytes each); the
    /// pages and the buffers share the rest through the volume's budget.
    /// No worker yet ([`Self::set_flusher`]).
    pub(crate) fn new(vol: Volume, opts: &OpenOptions, read_only_reason: Option<String>) -> SuperBlock {
        let budget = opts.cache_budget;
        let pages = Arc::new(PageBudget::new(vol.budget().clone(), vol.block_size()));
        SuperBlock {
            icache: Arc::new(Icache::new((budget / 8 / 1024).max(1024), pages.clone())),
            dcache: Arc::new(Dcache::new(ROOT_INO, (budget / 8 / 256).max(4096))),
            pages,
            holds: Arc::default(),
            releasing: Releasing::default(),
            vol: Arc::new(vol),
            flusher: None,
            sync_mount: SyncMount {
                sync: opts.sync,
                dirsync: opts.dirsync,
            },
            read_only_reason,
        }
    }

    /// The background worker, started over this filesystem's parts.
    pub(crate) fn set_flusher(&mut self, f: Option<Flusher>) {
        self.flusher = f;
    }

    /// Stop the background worker (at the close: a checkpoint of its own
    /// must not run on after the final one, nor after the caller got its
    /// image back).
    pub(crate) fn stop_flusher(&mut self) {
        if let Some(f) = &mut self.flusher {
            f.stop();
        }
    }

    /// The ext4 layer below.
    #[inline]
    pub(crate) fn vol(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The inode cache.
    #[inline]
    pub(crate) fn icache(&self) -> &Arc<Icache> {
        &self.icache
    }

    /// The dentry cache.
    #[inline]
    pub(crate) fn dcache(&self) -> &Arc<Dcache> {
        &self.dcache
    }

    /// The page cache's memory accounting.
    #[inline]
    pub(crate) fn pages(&self) -> &Arc<PageBudget> {
        &self.pages
    }

    /// The frontends' holds.
    #[inline]
    pub(crate) fn holds(&self) -> &Arc<Holds> {
        &self.holds
    }

    /// Frees of unlinked inodes in flight, which `statfs` waits for.
    pub(crate) fn releasing(&self) -> &Releasing {
        &self.releasing
    }

    /// The filesystem-wide synchronous modes.
    #[inline]
    pub(crate) fn sync_mount(&self) -> SyncMount {
        self.sync_mount
    }

    /// Why a read-write open became read-only.
    pub(crate) fn read_only_reason(&self) -> Option<&str> {
        self.read_only_reason.as_deref()
    }

    /// The in-memory inode `ino` (the kernel's `iget`).
    #[inline]
    pub(crate) fn inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        self.icache.get(&self.vol, ino)
    }

    /// The current time, from the clock the filesystem was opened with
    /// ([`OpenOptions::clock`]): what every time this layer stamps (inode
    /// times, `i_dtime`, the superblock's mount times) reads.
    #[inline]
    pub(crate) fn now(&self) -> Timestamp {
        self.vol.clock().now()
    }

    /// Run `f`, and once more after a commit if it failed with ENOSPC
    /// while blocks freed by the running transaction wait for it to commit
    /// (the kernel's `ext4_should_retry_alloc`): with a journal, a freed
    /// block is reused only once its freeing transaction is committed (see
    /// `ext4::commit`), so right after a delete the space is there but not
    /// yet usable. `f` is an operation that failed cleanly (no half-made
    /// change), and the caller holds no lock a handle could wait for.
    pub(crate) fn retry_enospc<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        match f() {
            Err(e) if e.errno() == Errno::ENOSPC && self.vol.has_busy_blocks() => {
                self.vol.commit_running()?;
                f()
            }
            r => r,
        }
    }

    /// Give back page-cache memory: sweep inodes' clean pages (clock).
    pub(crate) fn shrink_pages(&self) {
        // Buffers that grew into the pages' share while file data was idle
        // give it back first (see `ext4kit_cache::budget`).
        self.vol.bcache().give_back();
        let target = self.pages.limit() / 4 * 3;
        self.icache.for_each(|i| {
            let n = i.pages.sweep(&self.pages);
            self.pages.release(n);
            self.pages.used() > target
        });
    }

    /// Drop every cached page, dirty ones included, with the budget's
    /// accounting: the close, after the write-back. A thread's cached pins
    /// (`vfs::pin`) keep their inodes in memory past the close, until that
    /// thread opens other files or exits; their pages go now.
    pub(crate) fn drop_pages(&self) {
        self.icache.for_each(|i| {
            let (pages, dirty) = i.pages.remove_range(0, u64::MAX, &self.pages);
            self.pages.release(pages);
            self.pages.release_dirty(dirty);
            true
        });
    }
}
