//! The vfs layer: the [`Fs`] handle every frontend calls, with the caches
//! and concurrency machinery of the five principles (dentry cache and
//! lock-free path walk, inode cache, page cache, open files with atomic
//! positions, descriptor tables).

pub mod acl;
pub mod acl_inherit;
pub mod attr;
pub mod by_ino;
pub mod cred;
pub mod dcache;
mod evict;
pub mod fdtable;
pub mod file;
pub mod fslabel;
pub mod holds;
pub mod icache;
pub mod iflags;
pub mod io;
pub mod killpriv;
pub mod lookup;
pub mod mount;
pub mod namei;
pub mod namespace;
mod open;
pub mod pagecache;
pub mod pin;
pub mod rename;
pub mod request;
pub mod shared;
mod stat;
pub mod syncmode;
pub mod whiteout;
pub mod write;
pub mod writeback;
pub mod xattr_ops;

/// An empty 8 MiB filesystem made by our mkfs in memory, opened
/// read-write: what the unit tests beside the vfs code start from.
#[cfg(test)]
pub(crate) fn mem_fs() -> std::sync::Arc<Fs> {
    let dev = std::sync::Arc::new(ext4kit_blockdev::MemDevice::new(8 << 20));
    ext4kit_mkfs::mkfs(&*dev, 8 << 20, &ext4kit_mkfs::MkfsOptions::default()).unwrap();
    let opts = crate::OpenOptions {
        read_only: false,
        cache_budget: 8 << 20,
        ..Default::default()
    };
    Fs::open_device(dev, &opts).unwrap()
}

use std::sync::Arc;

use ext4kit_format::inode::{FileType, Timestamp};

pub use attr::{SetAttr, StatFs, TimeSet};
pub use cred::Cred;
pub use dcache::Dentry;
pub use fdtable::{Fd, Process};
pub use file::{Access, File, OpenFlags, Whence};
pub use icache::CachedInode;
pub use stat::{statx_attributes, FsInfo, Stat};
pub use writeback::{SyncLevel, WritebackStats};

use crate::error::{Errno, Error, Result};
use crate::ext4::{dir, symlink, xattr, BlockMap, DirEntry, DirRef, Mapping, Volume};
use namei::show;
use pagecache::{Page, PageBudget};

/// An open filesystem. `Send + Sync`: share it between threads with `Arc`.
///
/// Every filesystem rule is applied by its methods — permissions,
/// immutable and append-only, the setuid/setgid/capability kill, ACL
/// inheritance, synchronous inodes and directories, the mount state — so
/// a program calling it gets what the FUSE mount gives.
#[derive(Debug)]
pub struct Fs {
    /// The ext4 layer below (shared with the background worker).
    pub(crate) vol: Arc<Volume>,
    /// In-memory inodes.
    pub(crate) icache: Arc<icache::Icache>,
    /// Dentries.
    pub(crate) dcache: Arc<dcache::Dcache>,
    /// Page-cache memory accounting.
    pub(crate) pages: Arc<PageBudget>,
    /// Frontend holds by inode number ([`Fs::hold_inode`], `vfs::holds`).
    pub(crate) holds: Arc<holds::Holds>,
    /// Reclaim and checkpoints off the callers' threads (`ext4kit_cache::flusher`);
    /// none when no thread could be started (the caches then work inline).
    pub(crate) flusher: Option<ext4kit_cache::flusher::Flusher>,
    /// The `sync` / `dirsync` open options (`vfs::syncmode`).
    pub(crate) sync_mount: syncmode::SyncMount,
    /// Why a read-write open became read-only (`vfs::mount`).
    pub(crate) read_only_reason: Option<String>,
}

/// Dropping the last handle writes back what is dirty, as an unmount does:
/// committed metadata waits for a checkpoint, and a library user who never
/// calls `sync` must not lose it. Nothing is written when nothing is dirty
/// (a read-write open that only read leaves the image's bytes alone).
/// Drop cannot return an error, so a failure is printed.
impl Drop for Fs {
    fn drop(&mut self) {
        // First the worker: a checkpoint of its own must not run on after
        // the final one below, nor after the caller got its image back.
        if let Some(f) = &mut self.flusher {
            f.stop();
        }
        if !self.vol.read_only() {
            self.write_back_at_close();
        }
        // A thread's cached pins (`vfs::pin`) keep their inodes in memory
        // past this handle, until that thread opens other files or exits;
        // the inodes' cached pages, written back above, go now.
        self.icache.for_each(|i| {
            let (pages, dirty) = i.pages.remove_range(0, u64::MAX, &self.pages);
            self.pages.release(pages);
            self.pages.release_dirty(dirty);
            true
        });
    }
}

impl Fs {
    /// The write-back of [`Fs`]'s drop (see there).
    fn write_back_at_close(&self) {
        // A file that cannot be written back does not keep the rest from
        // being closed cleanly (`Fs::sync`): its error is printed below.
        let wb = self.writeback_all();
        let j = self.vol.jbd();
        let r = match j.is_journaled() {
            // A clean close of a journaled volume: everything committed,
            // written home, the log emptied and needs_recovery cleared —
            // only if anything was ever written (an open that only read
            // leaves the image alone).
            true => {
                if j.running_is_empty() && j.checkpoint_len() == 0 && !j.needs_recovery_on_disk() {
                    Ok(())
                } else {
                    let again = self.writeback_all();
                    self.vol
                        .sync_super()
                        .and_then(|()| self.vol.close_journal(true))
                        .and(again)
                }
            }
            false => {
                if j.checkpoint_len() == 0 {
                    Ok(())
                } else {
                    self.sync()
                }
            }
        };
        let r = wb.and(r);
        if let Err(e) = r {
            eprintln!("ext4kit: writing back at close failed, the image may lose recent changes: {e}");
        }
    }
}

pub(crate) use ext4kit_cache::clock::touch;

/// Largest single device read when filling the page cache (blocks).
const MAX_READ_RUN: u64 = 256;

/// One contiguous run of a file's data on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First logical block.
    pub logical: u64,
    /// First physical block.
    pub physical: u64,
    /// Blocks in the run.
    pub len: u64,
    /// Allocated but unwritten (reads as zeros).
    pub uninit: bool,
}

/// Where an inode's data lives (for `ext4kit stat` and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLayout {
    /// "extent tree", "indirect block map", "inline data" or "none".
    pub kind: &'static str,
    /// Mapped runs in logical order.
    pub runs: Vec<Run>,
}

/// Counters the tests and benchmarks look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Directory blocks accessed by lookups and readdir.
    pub dir_block_reads: u64,
    /// Metadata blocks read from the device.
    pub metadata_misses: u64,
    /// Inode records read.
    pub inode_reads: u64,
    /// Inode records written.
    pub inode_writes: u64,
    /// Bytes of dirty file pages.
    pub dirty_page_bytes: usize,
    /// Inodes cached.
    pub cached_inodes: usize,
    /// Dentries cached.
    pub cached_dentries: usize,
    /// Bytes of file pages cached.
    pub cached_page_bytes: usize,
    /// d_path calls that fell back to the rename lock.
    pub d_path_fallbacks: u64,
}

impl Fs {
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

    /// The ext4 layer under this filesystem, for tools that inspect the
    /// on-disk structures: tests, benchmarks, the crash harness. A
    /// frontend needs none of it — every filesystem rule is applied by
    /// `Fs`'s own methods, and a change made on the volume directly
    /// bypasses both the rules and the caches above it.
    pub fn volume(&self) -> &Volume {
        &self.vol
    }

    /// Bytes per block (what `st_blksize` advertises).
    pub fn block_size(&self) -> u32 {
        self.vol.block_size() as u32
    }

    /// The current time, from the clock the filesystem was opened with
    /// ([`crate::OpenOptions::clock`]): what every time this layer stamps
    /// (inode times, `i_dtime`, the superblock's mount times) reads.
    pub(crate) fn now(&self) -> Timestamp {
        self.vol.clock().now()
    }

    /// Warnings from opening (read-only fallbacks, journal recovery).
    pub fn warnings(&self) -> &[String] {
        self.vol.warnings()
    }

    /// The in-memory inode `ino`.
    pub fn inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        self.icache.get(&self.vol, ino)
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        use std::sync::atomic::Ordering::Relaxed;
        FsStats {
            dir_block_reads: self.vol.stats().dir_block_reads(),
            metadata_misses: self.vol.bcache().misses.load(Relaxed),
            inode_reads: self.vol.stats().inode_reads(),
            inode_writes: self.vol.stats().inode_writes(),
            dirty_page_bytes: self.pages.dirty_bytes(),
            cached_inodes: self.icache.len(),
            cached_dentries: self.dcache.len(),
            cached_page_bytes: self.pages.used(),
            d_path_fallbacks: self.dcache.d_path_fallbacks.load(Relaxed),
        }
    }

    /// Open `path` as root (no permission checks; new files get mode 0644
    /// owned by root). See [`Fs::open_as`] for the flags.
    pub fn open(&self, path: &[u8], flags: OpenFlags) -> Result<Arc<File>> {
        self.open_as(path, flags, 0o644, &Cred::root())
    }

    /// Open inode `ino` directly (no path, so no dentry): for tools that
    /// walk the tree by inode numbers.
    pub fn open_ino(&self, ino: u32, flags: OpenFlags) -> Result<Arc<File>> {
        let inode = self.inode(ino)?;
        if flags.directory && inode.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
        }
        let r = pin::open(&inode, None).ok_or_else(|| Error::posix(Errno::ENOENT, format!("inode {ino} was freed")))?;
        Ok(Arc::new(File::new(r, flags)))
    }

    /// Attributes of `path`, following a final symlink.
    pub fn stat(&self, path: &[u8]) -> Result<Stat> {
        let d = self.resolve(path, true)?;
        self.stat_ino(d.ino)
    }

    /// Attributes of `path` itself (a final symlink is not followed).
    pub fn lstat(&self, path: &[u8]) -> Result<Stat> {
        let d = self.resolve(path, false)?;
        self.stat_ino(d.ino)
    }

    /// Attributes of inode `ino`.
    pub fn stat_ino(&self, ino: u32) -> Result<Stat> {
        let i = self.inode(ino)?;
        let disk = i.disk.read();
        Ok(Stat::from_inode(&self.vol, ino, &disk))
    }

    /// Entries of the directory at `path` ("." and ".." included).
    pub fn read_dir(&self, path: &[u8]) -> Result<Vec<DirEntry>> {
        let d = self.resolve(path, true)?;
        self.read_dir_ino(d.ino).map_err(|e| match e {
            Error::Posix {
                errno: Errno::ENOTDIR, ..
            } => Error::posix(Errno::ENOTDIR, format!("{}: not a directory", show(path))),
            e => e,
        })
    }

    /// Entries of directory inode `ino`.
    pub fn read_dir_ino(&self, ino: u32) -> Result<Vec<DirEntry>> {
        let dir = self.inode(ino)?;
        if dir.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("inode {ino} is not a directory")));
        }
        let inode = dir.disk.read(); // held for the listing, not copied
        let map = dir.block_map_locked(&self.vol, &inode)?; // in step with the record
        let mut v = dir::readdir(
            &self.vol,
            DirRef {
                ino,
                inode: &inode,
                map: &map,
            },
        )?;
        drop(inode);
        // Entries without a type (no `filetype` feature) get it from the inode.
        for e in v.iter_mut().filter(|e| e.file_type.is_none()) {
            e.file_type = Some(self.inode(e.ino)?.ftype);
        }
        Ok(v)
    }

    /// Target of the symlink at `path`.
    pub fn read_link(&self, path: &[u8]) -> Result<Vec<u8>> {
        let d = self.resolve(path, false)?;
        self.read_link_ino(d.ino).map_err(|e| {
            if e.errno() == Errno::EINVAL {
                Error::posix(Errno::EINVAL, format!("{}: not a symbolic link", show(path)))
            } else {
                e
            }
        })
    }

    /// Target of symlink inode `ino`.
    pub fn read_link_ino(&self, ino: u32) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.ftype != FileType::Symlink {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("inode {ino} is not a symbolic link"),
            ));
        }
        let map = i.block_map(&self.vol)?;
        let disk = i.disk.read();
        symlink::read(&self.vol, ino, &disk, &map)
    }

    /// Every extended attribute of `path` (not following a final symlink).
    pub fn xattrs(&self, path: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let d = self.resolve(path, false)?;
        self.xattrs_ino(d.ino)
    }

    /// Every extended attribute of inode `ino`.
    pub fn xattrs_ino(&self, ino: u32) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let i = self.inode(ino)?;
        let disk = i.disk.read();
        xattr::list(&self.vol, ino, &disk)
    }

    /// One attribute's value (ENODATA when absent).
    pub fn getxattr(&self, path: &[u8], name: &[u8]) -> Result<Vec<u8>> {
        self.xattrs(path)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::posix(Errno::ENODATA, format!("{}: no attribute {}", show(path), show(name))))
    }

    /// Where inode `ino`'s data lives.
    pub fn data_layout(&self, ino: u32) -> Result<DataLayout> {
        let i = self.inode(ino)?;
        let map = i.block_map(&self.vol)?;
        let nblocks = i.size().div_ceil(self.vol.block_size() as u64);
        Ok(match &*map {
            BlockMap::Extents(ext) => DataLayout {
                kind: "extent tree",
                runs: ext
                    .iter()
                    .map(|e| Run {
                        logical: e.block as u64,
                        physical: e.start(),
                        len: e.length() as u64,
                        uninit: e.is_uninit(),
                    })
                    .collect(),
            },
            BlockMap::Indirect(_) => DataLayout {
                kind: "indirect block map",
                runs: map
                    .runs(&self.vol, nblocks)?
                    .into_iter()
                    .map(|(l, p, n)| Run {
                        logical: l,
                        physical: p,
                        len: n,
                        uninit: false,
                    })
                    .collect(),
            },
            BlockMap::Inline(_) => DataLayout {
                kind: "inline data",
                runs: vec![],
            },
            BlockMap::None => DataLayout {
                kind: "none",
                runs: vec![],
            },
        })
    }

    /// Build the absolute path of a dentry (the kernel's `d_path`, built without a global lock).
    pub fn d_path(&self, d: &Arc<Dentry>) -> Vec<u8> {
        self.dcache.d_path(d)
    }

    /// Read file data at `off` through the page cache; returns bytes read
    /// (0 at or past end of file).
    pub fn read_at(&self, inode: &CachedInode, off: u64, buf: &mut [u8]) -> Result<usize> {
        match inode.ftype {
            FileType::Regular => {}
            FileType::Directory => {
                return Err(Error::posix(
                    Errno::EISDIR,
                    format!("inode {} is a directory", inode.ino),
                ))
            }
            _ => {
                return Err(Error::posix(
                    Errno::EINVAL,
                    format!("inode {} is not a regular file", inode.ino),
                ))
            }
        }
        let size = inode.size();
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let want = ((size - off).min(buf.len() as u64)) as usize;
        // The miss begins before the map is loaded: a change to either
        // after this point is seen by the rechecks below (PageMap's `dirty`).
        let mut miss = inode.pages.miss();
        // The map is loaded at the first page-cache miss: a read served
        // from cached pages never touches it (a loaded map is an `Arc`
        // clone, a write to a count every reader of the file shares — the
        // `storm` benchmark reads small cached files). Loaded after `miss`,
        // as the rechecks require.
        let mut map: Option<Arc<BlockMap>> = None;
        let bs = self.vol.block_size() as u64;
        let mut done = 0usize;
        while done < want {
            let pos = off + done as u64;
            let lblk = pos / bs;
            let in_blk = (pos % bs) as usize;
            let n = (bs as usize - in_blk).min(want - done);
            // Copy straight out of the cached page under the map's epoch
            // guard: no reference count is touched on the shared page. A
            // dirty page is found here too, before the block map is asked:
            // with delayed allocation its block may still be a hole.
            if inode
                .pages
                .with(lblk, |p| buf[done..done + n].copy_from_slice(&p[in_blk..in_blk + n]))
                .is_some()
            {
                done += n;
                continue;
            }
            let blocks_left = (off + want as u64).div_ceil(bs) - lblk;
            let m = match map.take() {
                Some(m) => m,
                None => {
                    let m = inode.block_map(&self.vol)?;
                    if let BlockMap::Inline(data) = &*m {
                        // Inline data is never in the page cache.
                        let end = (pos as usize + want - done).min(data.len());
                        let start = (pos as usize).min(end);
                        buf[done..done + end - start].copy_from_slice(&data[start..end]);
                        buf[done + end - start..want].fill(0);
                        return Ok(want);
                    }
                    m
                }
            };
            let mapping = m.map(&self.vol, lblk)?;
            map = Some(m);
            match mapping {
                Mapping::Hole { len } | Mapping::Mapped { len, uninit: true, .. } => {
                    // Zero-fill the hole directly; nothing is cached. Stop
                    // at the next dirty page (delayed allocation: data the
                    // map does not know about yet).
                    let mut span = len.min(blocks_left);
                    if let Some(d) = inode.pages.first_dirty_in(lblk + 1, lblk.saturating_add(span)) {
                        span = d - lblk;
                    }
                    let bytes = ((span * bs) as usize - in_blk).min(want - done);
                    buf[done..done + bytes].fill(0);
                    if !inode.pages.unchanged(&miss) {
                        // Written back (and maybe evicted) or remapped
                        // meanwhile: redo this step with the current map.
                        miss = inode.pages.miss();
                        map = None;
                        continue;
                    }
                    done += bytes;
                }
                Mapping::Mapped { pblk, len, .. } => {
                    let run = len.min(blocks_left).min(MAX_READ_RUN);
                    let mut raw = vec![0u8; (run * bs) as usize];
                    self.vol
                        .disk()
                        .read_raw(pblk, &mut raw)
                        .map_err(|e| crate::ext4::error::annotate(e, &format!("data of inode {}", inode.ino)))?;
                    // Charged before insertion, so the count never dips
                    // below what is cached while a sweep runs.
                    let over = self.pages.charge(run as usize);
                    let mut added = 0;
                    let mut pages = Vec::with_capacity(run as usize);
                    for (k, chunk) in raw.chunks(bs as usize).enumerate() {
                        // A page cached meanwhile (dirty or not) wins; a
                        // write-side change since `miss` voids what we read.
                        match inode.pages.insert_clean_at(
                            lblk + k as u64,
                            Arc::new(Page::new(chunk.into())),
                            &miss,
                            &self.pages,
                        ) {
                            Some((page, new)) => {
                                added += new as usize;
                                pages.push(page);
                            }
                            None => break,
                        }
                    }
                    self.pages.release(run as usize - added);
                    if over {
                        self.shrink_pages();
                    }
                    if pages.len() < run as usize {
                        // The write side cleaned, dropped or remapped
                        // while we read the disk: what we read may be older
                        // than a write already written back and evicted, or
                        // come from blocks a truncate freed. Redo the step.
                        miss = inode.pages.miss();
                        map = None;
                        continue;
                    }
                    let mut copied = 0;
                    for (k, page) in pages.iter().enumerate() {
                        let a = if k == 0 { in_blk } else { 0 };
                        let m = (bs as usize - a).min(want - done - copied);
                        if m == 0 {
                            break;
                        }
                        buf[done + copied..done + copied + m].copy_from_slice(&page.data[a..a + m]);
                        copied += m;
                    }
                    done += copied;
                }
            }
        }
        Ok(want)
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

    /// SEEK_DATA / SEEK_HOLE from `off`.
    pub(crate) fn seek_data_hole(&self, inode: &CachedInode, off: u64, data: bool) -> Result<u64> {
        let size = inode.size();
        let enxio = || {
            Error::posix(
                Errno::ENXIO,
                format!("offset {off} is past the end of inode {}", inode.ino),
            )
        };
        if off >= size {
            return Err(enxio());
        }
        // Delayed allocation: dirty pages are data the map does not show
        // yet; write them back so the map answers for them.
        if inode.pages.dirty_count() != 0 {
            self.writeback_inode(inode, SyncLevel::All)?;
        }
        let map = inode.block_map(&self.vol)?;
        let bs = self.vol.block_size() as u64;
        let nblocks = size.div_ceil(bs);
        if data {
            match map.next_data(&self.vol, off / bs, nblocks)? {
                Some(b) => Ok((b * bs).max(off)),
                None => Err(enxio()),
            }
        } else {
            let mut b = off / bs;
            while b < nblocks {
                match map.map(&self.vol, b)? {
                    Mapping::Mapped { len, uninit: false, .. } => b = b.saturating_add(len),
                    Mapping::Hole { .. } | Mapping::Mapped { .. } if !matches!(&*map, BlockMap::Inline(_)) => {
                        return Ok((b * bs).max(off));
                    }
                    _ => break,
                }
            }
            Ok(size)
        }
    }
}
