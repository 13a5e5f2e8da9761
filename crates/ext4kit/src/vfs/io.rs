//! The write side of file I/O on an inode: buffered writes through the page
//! cache, truncate, fallocate, and `open` with creation flags.
//!
//! Locking: every function here takes the inode's `disk` write lock (the
//! `i_rwsem` analogue) for the whole change, so writers to one file are
//! serialised and the in-memory record, the atomic size and the page cache
//! move together. Readers take no lock (see `read_at` and the page cache's
//! replace-on-write rule). Nothing here holds two inode locks.
//!
//! Writes are buffered with delayed allocation: a write only fills pages
//! and marks them dirty; blocks are allocated at writeback. Size growth is
//! data-relevant dirtiness ([`DIRTY_DATA`]); the mtime/ctime update of a
//! write that does not change the size is timestamps-only ([`DIRTY_TIME`]),
//! so fdatasync leaves the record alone (fdatasync costs O(dirty)).
//!
//! On-disk rule kept throughout: the bytes of the last block past `i_size`
//! are zero (the kernel zeroes them at writeout and in
//! `ext4_block_truncate_page`), so growing a file never exposes old data.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ext4kit_format::features::ro_compat;
use ext4kit_format::indirect;
use ext4kit_format::inode::{flags as iflags, FileType, Inode, TimeField, Timestamp};

use super::cred::{Caller, Cred, MAY_EXEC, MAY_READ, MAY_WRITE};
use super::file::{File, OpenFlags};
use super::icache::{CachedInode, DIRTY_DATA, DIRTY_TIME};
use super::namei::show;
use super::request::{Fallocate, WriteAt, WriteRequest, Written};
use super::writeback::SyncLevel;
use super::Fs;
use crate::error::{Errno, Error, Result};
use crate::ext4::bmap_write::{self, MapRequest};
use crate::ext4::release_check::{self, Punch};
use crate::ext4::reservation::Reserver;
use crate::ext4::{inode, BlockMap, Mapping};

/// fallocate: do not change the file size.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// fallocate: deallocate the range (must be combined with KEEP_SIZE).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// fallocate: make the range read as zeros, keeping it allocated.
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// Pages filled per step of a large write before the dirty budget is
/// checked (so one huge write cannot dirty unbounded memory).
const WRITE_CHUNK: u64 = 256;

/// Largest file size this filesystem allows for `rec` (`ext4_max_size` /
/// `ext4_max_bitmap_size`): the block map's reach, and `i_blocks` (counted
/// in 512-byte sectors, 32 bits without `huge_file`, 48 with).
pub fn max_file_size(fs: &Fs, rec: &Inode) -> u64 {
    let bs = fs.vol.block_size() as u64;
    let map_limit = if rec.uses_extents() {
        ((1u64 << 32) - 1) * bs
    } else {
        let per = bs / 4;
        (indirect::DIRECT as u64 + per + per * per + per * per * per).saturating_mul(bs)
    };
    let sectors = if fs.vol.geo().has_ro_compat(ro_compat::HUGE_FILE) {
        1u64 << 48
    } else {
        (1u64 << 32) - 1
    };
    map_limit
        .min(sectors.saturating_mul(512) / bs * bs)
        .min(i64::MAX as u64)
}

fn set_size(inode: &CachedInode, rec: &mut Inode, size: u64) {
    rec.base.set_size(size);
    inode.size.store(size, Ordering::Release);
}

/// A data change's mtime and ctime (`file_update_time`), at `t`.
fn touch_mtime(inode: &CachedInode, rec: &mut Inode, t: Timestamp) {
    rec.set_time(TimeField::Mtime, t);
    rec.set_time(TimeField::Ctime, t);
    inode.mark_dirty(DIRTY_TIME);
}

fn check_regular(inode: &CachedInode) -> Result<()> {
    match inode.ftype {
        FileType::Regular => Ok(()),
        FileType::Directory => Err(Error::posix(
            Errno::EISDIR,
            format!("inode {} is a directory", inode.ino),
        )),
        _ => Err(Error::posix(
            Errno::EINVAL,
            format!("inode {} is not a regular file", inode.ino),
        )),
    }
}

impl Fs {
    fn check_writable(&self, inode: &CachedInode, rec: &Inode) -> Result<()> {
        check_regular(inode)?;
        if self.vol.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        if rec.base.flags & iflags::IMMUTABLE != 0 {
            return Err(Error::posix(Errno::EPERM, format!("inode {} is immutable", inode.ino)));
        }
        if rec.has_inline_data() {
            return Err(Error::Unsupported(format!(
                "inode {}: writing inline-data files is not supported yet",
                inode.ino
            )));
        }
        Ok(())
    }

    /// Changes other than appending (truncate, punching, zeroing) are
    /// refused on an append-only inode (`IS_APPEND`), as the kernel does.
    fn check_not_append_only(&self, inode: &CachedInode, rec: &Inode) -> Result<()> {
        if rec.base.flags & iflags::APPEND != 0 {
            return Err(Error::posix(
                Errno::EPERM,
                format!("inode {} is append-only", inode.ino),
            ));
        }
        Ok(())
    }

    /// The current contents of block `lblk` (cached page, else the disk,
    /// else zeros for holes and unwritten extents). Caller holds the lock.
    fn block_contents(&self, inode: &CachedInode, map: &BlockMap, lblk: u64) -> Result<Box<[u8]>> {
        if let Some(p) = inode.pages.get(lblk) {
            return Ok(p.data.clone());
        }
        let mut b = vec![0u8; self.vol.block_size()].into_boxed_slice();
        if let Mapping::Mapped {
            pblk, uninit: false, ..
        } = map.map(&self.vol, lblk)?
        {
            self.vol
                .disk()
                .read_raw(pblk, &mut b)
                .map_err(|e| crate::ext4::error::annotate(e, &format!("data of inode {}", inode.ino)))?;
        }
        Ok(b)
    }

    /// Zero block `at / bs` from byte `at % bs` to its end, through the
    /// cache (dirtying it) — only if those bytes are not already zero.
    fn zero_block_tail(&self, inode: &CachedInode, rec: &Inode, at: u64) -> Result<()> {
        self.zero_in_block(
            inode,
            rec,
            at,
            at.div_ceil(self.vol.block_size() as u64) * self.vol.block_size() as u64,
        )
    }

    /// Zero bytes `[from, to)`, which lie in one block, through the cache.
    fn zero_in_block(&self, inode: &CachedInode, rec: &Inode, from: u64, to: u64) -> Result<()> {
        let bs = self.vol.block_size() as u64;
        if from >= to {
            return Ok(());
        }
        let lblk = from / bs;
        let (a, b) = ((from % bs) as usize, (to - lblk * bs) as usize);
        let map = inode.block_map_locked(&self.vol, rec)?;
        let cached = inode.pages.get(lblk).is_some();
        if !cached && !matches!(map.map(&self.vol, lblk)?, Mapping::Mapped { uninit: false, .. }) {
            return Ok(()); // a hole or unwritten extent already reads as zeros
        }
        let mut data = self.block_contents(inode, &map, lblk)?;
        if data[a..b].iter().all(|&x| x == 0) {
            return Ok(());
        }
        data[a..b].fill(0);
        self.install_dirty(inode, vec![(lblk, data)]);
        Ok(())
    }

    fn install_dirty(&self, inode: &CachedInode, pages: Vec<(u64, Box<[u8]>)>) {
        let (new_pages, new_dirty) = inode.pages.write_pages(pages, &self.pages);
        self.pages.charge_dirty(new_dirty);
        if self.pages.charge(new_pages) {
            self.shrink_pages();
        }
    }

    /// Buffered write of `buf` at `off` (`None`: at the end of file, read
    /// under the lock — O_APPEND) by root. Returns (offset written at,
    /// bytes). See [`Self::write_inode`] for the rules.
    pub fn write_at(&self, inode: &CachedInode, off: Option<u64>, buf: &[u8]) -> Result<(u64, usize)> {
        let w = self.write_inode(
            inode,
            &WriteRequest {
                at: off.map_or(WriteAt::End, WriteAt::Offset),
                ..WriteRequest::new(buf, Caller::root())
            },
        )?;
        Ok((w.offset, w.len))
    }

    /// The error of a background write-back of `inode` that failed since
    /// the last report (an I/O error on the image: memory pressure or the
    /// periodic flush wrote its pages), taken: the kernel's
    /// `filemap_check_errors` at close, which reports it once.
    pub fn take_writeback_error(&self, inode: &CachedInode) -> Option<Error> {
        inode.pages.take_wb_error()
    }

    /// Whether a caller with `uid`/`gid` may use the blocks reserved for
    /// root (`s_r_blocks_count`): root, `s_def_resuid`, or `s_def_resgid`
    /// (`ext4_has_free_clusters`).
    pub fn reserver(&self, uid: u32, gid: u32) -> Reserver {
        if uid == 0 || uid == self.vol.sb().resuid() || gid == self.vol.sb().resgid() {
            Reserver::Privileged
        } else {
            Reserver::User
        }
    }

    /// The buffered write (`ext4_buffered_write_iter`): the data of `req`
    /// into the page cache, with the rules of the kernel's write path —
    /// immutable inodes refuse (EPERM); an append-only inode takes appends
    /// only ([`WriteAt::End`]; a write at an offset is EPERM, the rule
    /// `may_open` enforces for the kernel); setuid/setgid and a file
    /// capability are cleared first as `file_remove_privs` says
    /// (`vfs::killpriv`); mtime and ctime move; and the data is durable
    /// before the call returns when the open asked (O_SYNC, O_DSYNC), the
    /// inode is synchronous (`chattr +S`) or the filesystem was opened
    /// `sync` (`generic_write_sync`).
    ///
    /// Before a byte is accepted, the blocks it will need at writeback are
    /// claimed (delayed allocation's accounting, see `ext4::reservation`):
    /// with no room the write is short, or ENOSPC when nothing fits — never
    /// a loss discovered at writeback. The root reserve is for the callers
    /// [`Self::reserver`] names.
    pub fn write_inode(&self, inode: &CachedInode, req: &WriteRequest<'_>) -> Result<Written> {
        check_regular(inode)?;
        // Past the dirty budget because write-back keeps failing (a dying
        // device): refuse more data rather than hold it in memory without
        // bound. The data already accepted stays dirty, its error is kept
        // for fsync.
        if self.pages.dirty_over() {
            if let Err(e) = self.balance_dirty(inode) {
                if self.pages.dirty_over() {
                    return Err(e);
                }
            }
        }
        let r = self.write_locked(inode, req);
        // Memory pressure is handled with no inode lock held. Its failure
        // is not this write's (the data is accepted and stays dirty): it
        // is kept on the inode that failed for its next fsync.
        if r.is_ok() {
            let _ = self.balance_dirty(inode);
        }
        let (written, inode_sync) = r?;
        // generic_write_sync: O_SYNC writes back everything (fsync); O_DSYNC
        // and a synchronous inode or filesystem what the data needs
        // (fdatasync: the size, the block map).
        let level = match req.sync {
            Some(l) => Some(l),
            None if inode_sync || self.sync_mount().sync => Some(SyncLevel::Data),
            None => None,
        };
        if let Some(l) = level {
            if written.len > 0 {
                self.fsync_inode(inode, l == SyncLevel::Data)?;
            }
        }
        Ok(written)
    }

    /// The blocks of `[first, upto]` that need a claim before they can be
    /// dirtied: not delayed already, and over a hole (`true`) or an
    /// unwritten extent (`false`). Written blocks are overwritten in place.
    fn unclaimed_blocks(&self, inode: &CachedInode, map: &BlockMap, first: u64, upto: u64) -> Result<Vec<(u64, bool)>> {
        let mut out = Vec::new();
        let mut l = first;
        while l <= upto {
            let (len, kind) = match map.map(&self.vol, l)? {
                Mapping::Hole { len } => (len, Some(true)),
                Mapping::Mapped { len, uninit: true, .. } => (len, Some(false)),
                Mapping::Mapped { len, .. } => (len, None),
            };
            let stop = l.saturating_add(len.max(1)).min(upto + 1);
            if let Some(hole) = kind {
                for b in l..stop {
                    if !inode.pages.is_delayed(b) {
                        out.push((b, hole));
                    }
                }
            }
            l = stop;
        }
        Ok(out)
    }

    /// The write under the inode's lock. Returns what was written and
    /// whether the inode is synchronous (`chattr +S`).
    fn write_locked(&self, inode: &CachedInode, req: &WriteRequest<'_>) -> Result<(Written, bool)> {
        let buf = req.data;
        let who = self.reserver(req.caller.cred.uid, req.caller.cred.gid);
        let mut rec = inode.disk.write();
        self.check_writable(inode, &rec)?;
        let old_size = rec.size();
        let append_only = rec.base.flags & iflags::APPEND != 0;
        let off = match req.at {
            WriteAt::End => old_size,
            // Only an O_APPEND opener may write an append-only inode
            // (`may_open`, and fcntl's F_SETFL refuses to drop O_APPEND).
            WriteAt::Offset(_) if append_only => {
                return Err(Error::posix(
                    Errno::EPERM,
                    format!("inode {}: append-only: writes must append", inode.ino),
                ))
            }
            WriteAt::Offset(o) | WriteAt::Placed(o) => o,
        };
        let inode_sync = rec.base.flags & iflags::SYNC != 0;
        if buf.is_empty() {
            return Ok((
                Written {
                    offset: off,
                    len: 0,
                    privs_cleared: false,
                },
                inode_sync,
            ));
        }
        // generic_write_check_limits: past the limit EFBIG, up to it a short write.
        let max = max_file_size(self, &rec);
        if off >= max {
            return Err(Error::posix(
                Errno::EFBIG,
                format!("inode {}: offset {off} is past the largest file size {max}", inode.ino),
            ));
        }
        // ext4_write_checks → file_modified: privileges go before the data.
        let privs_cleared = self.remove_privs(inode, &mut rec, &req.caller)?;
        let buf = &buf[..buf.len().min((max - off) as usize)];
        let end = off + buf.len() as u64;
        let bs = self.vol.block_size() as u64;
        // A failure after some chunks were written ends the write short
        // (write(2) reports what it wrote; the next call sees the error).
        let mut failure = None;
        let mut pos = off;
        let mut tail_zeroed = false;
        'chunks: while pos < end {
            let map = match inode.block_map_locked(&self.vol, &rec) {
                Ok(m) => m,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let first = pos / bs;
            let last = (end - 1) / bs;
            let mut upto = last.min(first + WRITE_CHUNK - 1);
            let mut stop = end;
            // Claim the blocks first (ext4_da_reserve_space): what does not
            // fit is not accepted.
            let new = match self.unclaimed_blocks(inode, &map, first, upto) {
                Ok(n) => n,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let meta = |n: u64| crate::ext4::reservation::worst_map_growth(self.vol.block_size(), &rec, n);
            match inode.pages.reserve(self.vol.reservations(), who, &new, &meta) {
                Ok(k) if k == new.len() => {}
                Ok(k) => {
                    upto = new[k].0 - 1;
                    stop = new[k].0 * bs;
                    failure = Some(Error::posix(
                        Errno::ENOSPC,
                        format!(
                            "inode {}: no room for more than {} bytes of this write",
                            inode.ino,
                            stop - off
                        ),
                    ));
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            if !tail_zeroed && stop > old_size && !old_size.is_multiple_of(bs) {
                // Keep the tail past the old EOF zero before it becomes file data.
                tail_zeroed = true;
                if let Err(e) = self.zero_block_tail(inode, &rec, old_size) {
                    failure = Some(e);
                    break;
                }
            }
            let mut pages = Vec::with_capacity((upto - first + 1) as usize);
            for lblk in first..=upto {
                let bstart = lblk * bs;
                let a = pos.max(bstart);
                let b = stop.min(bstart + bs);
                let mut data = if a == bstart && b == bstart + bs {
                    vec![0u8; bs as usize].into_boxed_slice()
                } else if bstart >= old_size.div_ceil(bs) * bs && inode.pages.get(lblk).is_none() {
                    // Wholly past the old EOF: no old contents to keep.
                    vec![0u8; bs as usize].into_boxed_slice()
                } else {
                    match self.block_contents(inode, &map, lblk) {
                        Ok(d) => d,
                        Err(e) => {
                            failure = Some(e);
                            break 'chunks;
                        }
                    }
                };
                let src = &buf[(a - off) as usize..(b - off) as usize];
                data[(a - bstart) as usize..(b - bstart) as usize].copy_from_slice(src);
                pages.push((lblk, data));
            }
            self.install_dirty(inode, pages);
            pos = stop.min((upto + 1) * bs);
            if pos > rec.size() {
                set_size(inode, &mut rec, pos);
                inode.mark_dirty(DIRTY_DATA);
            }
            if failure.is_some() {
                break;
            }
            if pos < end && self.pages.dirty_over() {
                // The data is accepted; a failure to write it back now is
                // the inode's to report at fsync (kept by writeback).
                let _ = self
                    .writer()
                    .writeback_locked(inode, &mut rec, super::writeback::SyncLevel::All);
            }
        }
        if pos == off {
            if let Some(e) = failure {
                return Err(e);
            }
        }
        if req.stamp_times {
            touch_mtime(inode, &mut rec, self.now());
        }
        Ok((
            Written {
                offset: off,
                len: (pos - off) as usize,
                privs_cleared,
            },
            inode_sync,
        ))
    }

    /// Set the size of `inode` to `len` (truncate/ftruncate) on behalf of
    /// `caller`. Shrinking frees every whole block past the new end and
    /// zeroes the tail of the last partial block; growing only changes the
    /// size (the new range is a hole). As `do_truncate`: mtime and ctime
    /// are updated, setuid/setgid and a file capability cleared
    /// (`vfs::killpriv`); append-only and immutable inodes refuse (EPERM);
    /// a synchronous inode or filesystem commits before the return
    /// (`ext4_truncate`'s `ext4_handle_sync`). Returns whether
    /// setuid/setgid were cleared.
    pub fn truncate_inode(&self, inode: &CachedInode, len: u64, caller: &Caller<'_>) -> Result<bool> {
        let (cleared, sync) = self.retry_enospc(|| self.truncate_inode_once(inode, len, caller))?;
        if sync {
            self.commit_for(inode)?;
        }
        Ok(cleared)
    }

    /// One attempt of [`Self::truncate_inode`]: whether setuid/setgid were
    /// cleared, and whether the change must be durable now.
    fn truncate_inode_once(&self, inode: &CachedInode, len: u64, caller: &Caller<'_>) -> Result<(bool, bool)> {
        check_regular(inode)?;
        let mut rec = inode.disk.write();
        self.check_writable(inode, &rec)?;
        self.check_not_append_only(inode, &rec)?;
        let max = max_file_size(self, &rec);
        if len > max {
            return Err(Error::posix(
                Errno::EFBIG,
                format!("inode {}: size {len} is past the largest file size {max}", inode.ino),
            ));
        }
        let cleared = self.remove_privs(inode, &mut rec, caller)?;
        let sync = self.is_sync(rec.base.flags);
        let old = rec.size();
        let bs = self.vol.block_size() as u64;
        if len < old {
            let fb = len.div_ceil(bs);
            // Everything the punch will free and the tail zeroing will
            // write is checked while nothing has changed (release_check.rs).
            let tail = (!len.is_multiple_of(bs)).then_some(len / bs);
            release_check::punch(
                &self.vol,
                &Punch {
                    ino: inode.ino,
                    rec: &rec,
                    from: fb,
                    to: u64::MAX,
                    tail,
                },
            )?;
            // Punch first: it fails (interim limits) before changing anything.
            let mut h = self.vol.begin()?;
            // Readers that looked at the old map must not trust blocks we
            // free from here on (PageMap's `seq`).
            inode.pages.bump();
            bmap_write::punch(&self.vol, &mut h, inode.ino, &mut rec, fb..u64::MAX)?;
            set_size(inode, &mut rec, len);
            let (pages, dirty) = inode.pages.remove_range(fb, u64::MAX, &self.pages);
            self.pages.release(pages);
            self.pages.release_dirty(dirty);
            inode.reset_block_map();
            // A failure here (reading the tail block) must not keep the
            // freed blocks and the new map from reaching disk together.
            let tail = if len.is_multiple_of(bs) {
                Ok(())
            } else {
                self.zero_block_tail(inode, &rec, len)
            };
            touch_mtime(inode, &mut rec, self.now());
            // Freed blocks and the map that no longer holds them go to disk
            // in one handle, so the record is written now.
            inode::write(&self.vol, &mut h, inode.ino, &rec)?;
            h.commit()?;
            inode.clear_dirty();
            tail?;
        } else {
            if len > old {
                if !old.is_multiple_of(bs) {
                    self.zero_block_tail(inode, &rec, old)?;
                }
                set_size(inode, &mut rec, len);
                inode.mark_dirty(DIRTY_DATA);
            }
            touch_mtime(inode, &mut rec, self.now());
        }
        Ok((cleared, sync))
    }

    /// fallocate(2) on `inode`: `mode` 0 (allocate, extend the size),
    /// [`FALLOC_FL_KEEP_SIZE`], [`FALLOC_FL_PUNCH_HOLE`] (with KEEP_SIZE) or
    /// [`FALLOC_FL_ZERO_RANGE`] (optionally with KEEP_SIZE).
    ///
    /// Errors as the kernel's `vfs_fallocate` / `ext4_fallocate`: EINVAL
    /// for an empty range; EOPNOTSUPP for unknown mode bits, PUNCH_HOLE
    /// without KEEP_SIZE, PUNCH_HOLE with ZERO_RANGE, and ZERO_RANGE on an
    /// indirect-mapped file (no unwritten state there); EFBIG past the
    /// largest file size. On indirect-mapped files plain allocation is done
    /// by writing zeros into the new blocks (what glibc's posix_fallocate
    /// emulation does), hole punching works as on extent files.
    ///
    /// On behalf of `caller`: setuid/setgid and a file capability are
    /// cleared first, for every mode (`ext4_fallocate` → `file_modified`),
    /// and a synchronous inode or filesystem commits before the return.
    /// Returns whether setuid/setgid were cleared.
    pub fn fallocate_inode(&self, inode: &CachedInode, req: Fallocate, caller: &Caller<'_>) -> Result<bool> {
        let (cleared, sync) = self.retry_enospc(|| self.fallocate_inode_once(inode, req, caller))?;
        if sync {
            self.commit_for(inode)?;
        }
        Ok(cleared)
    }

    /// One attempt of [`Self::fallocate_inode`]: whether setuid/setgid
    /// were cleared, and whether the change must be durable now.
    fn fallocate_inode_once(&self, inode: &CachedInode, req: Fallocate, caller: &Caller<'_>) -> Result<(bool, bool)> {
        let Fallocate { mode, off, len } = req;
        let ino = inode.ino;
        let bad = |why: &str| Error::posix(Errno::EOPNOTSUPP, format!("fallocate on inode {ino}: {why}"));
        if len == 0 {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("fallocate on inode {ino}: empty range"),
            ));
        }
        if mode & !(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
            return Err(bad(&format!("mode {mode:#x} is not supported")));
        }
        if mode & FALLOC_FL_PUNCH_HOLE != 0 && mode & FALLOC_FL_ZERO_RANGE != 0 {
            return Err(bad("PUNCH_HOLE and ZERO_RANGE are mutually exclusive"));
        }
        if mode & FALLOC_FL_PUNCH_HOLE != 0 && mode & FALLOC_FL_KEEP_SIZE == 0 {
            return Err(bad("PUNCH_HOLE needs KEEP_SIZE"));
        }
        check_regular(inode)?;
        let mut rec = inode.disk.write();
        self.check_writable(inode, &rec)?;
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            self.check_not_append_only(inode, &rec)?;
        }
        let max = max_file_size(self, &rec);
        let end = off.checked_add(len).filter(|&e| e <= max).ok_or_else(|| {
            Error::posix(
                Errno::EFBIG,
                format!("fallocate on inode {ino}: range past the largest file size {max}"),
            )
        })?;
        if mode & FALLOC_FL_ZERO_RANGE != 0 && !rec.uses_extents() {
            return Err(bad("ZERO_RANGE needs an extent-mapped file"));
        }
        let sync = self.is_sync(rec.base.flags);
        let bs = self.vol.block_size() as u64;
        let size = rec.size();
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            // ext4_punch_hole: nothing past EOF (not even file_modified);
            // partial edge blocks zeroed in the cache, whole blocks freed.
            let end = end.min(size);
            if off >= end {
                return Ok((false, false));
            }
            let cleared = self.remove_privs(inode, &mut rec, caller)?;
            let (fb, lb) = (off.div_ceil(bs), end / bs);
            if fb < lb {
                // What the punch frees is checked while nothing has changed.
                release_check::punch(
                    &self.vol,
                    &Punch {
                        ino,
                        rec: &rec,
                        from: fb,
                        to: lb,
                        tail: None,
                    },
                )?;
            }
            self.zero_range_edges(inode, &rec, off, end)?;
            if fb < lb {
                let mut h = self.vol.begin()?;
                inode.pages.bump();
                bmap_write::punch(&self.vol, &mut h, ino, &mut rec, fb..lb)?;
                let (pages, dirty) = inode.pages.remove_range(fb, lb, &self.pages);
                self.pages.release(pages);
                self.pages.release_dirty(dirty);
                inode.reset_block_map();
                touch_mtime(inode, &mut rec, self.now());
                inode::write(&self.vol, &mut h, ino, &rec)?;
                h.commit()?;
                inode.clear_dirty();
            } else {
                touch_mtime(inode, &mut rec, self.now());
            }
            return Ok((cleared, sync));
        }
        let cleared = self.remove_privs(inode, &mut rec, caller)?;
        if mode & FALLOC_FL_ZERO_RANGE != 0 {
            // ZERO_RANGE punches the whole blocks before mapping them
            // unwritten: what it frees is checked while nothing has changed.
            let (fb, lb) = (off.div_ceil(bs), end / bs);
            if fb < lb {
                release_check::punch(
                    &self.vol,
                    &Punch {
                        ino,
                        rec: &rec,
                        from: fb,
                        to: lb,
                        tail: None,
                    },
                )?;
            }
        }
        let mut h = self.vol.begin()?;
        let r = self.fallocate_blocks(&mut h, inode, &mut rec, mode, off, end);
        // Whatever was changed is committed, even after a failure: the
        // handle's bitmaps and the record's map must reach disk together.
        inode.reset_block_map();
        let mut r = r;
        if r.is_ok() && mode & FALLOC_FL_KEEP_SIZE == 0 && end > size {
            if !size.is_multiple_of(bs) {
                r = self.zero_block_tail(inode, &rec, size);
            }
            if r.is_ok() {
                set_size(inode, &mut rec, end);
            }
        }
        // ext4_fallocate updates the times like a write does.
        touch_mtime(inode, &mut rec, self.now());
        inode::write(&self.vol, &mut h, ino, &rec)?;
        h.commit()?;
        inode.clear_dirty();
        r.map(|()| (cleared, sync))
    }

    /// The block-map part of fallocate's allocate and ZERO_RANGE modes.
    fn fallocate_blocks(
        &self,
        h: &mut crate::ext4::transaction::Handle<'_>,
        inode: &CachedInode,
        rec: &mut Inode,
        mode: u32,
        off: u64,
        end: u64,
    ) -> Result<()> {
        let bs = self.vol.block_size() as u64;
        let ino = inode.ino;
        if mode & FALLOC_FL_ZERO_RANGE != 0 {
            // ext4_zero_range: partial edges zeroed through the cache (bytes
            // past EOF are zero already); whole blocks become unwritten
            // extents: they read as zeros and stay allocated.
            self.zero_range_edges(inode, rec, off, end.min(rec.size().max(off)))?;
            let (fb, lb) = (off.div_ceil(bs), end / bs);
            if fb < lb {
                inode.pages.bump();
                bmap_write::punch(&self.vol, h, ino, rec, fb..lb)?;
                let (pages, dirty) = inode.pages.remove_range(fb, lb, &self.pages);
                self.pages.release(pages);
                self.pages.release_dirty(dirty);
                bmap_write::map_blocks(
                    &self.vol,
                    h,
                    ino,
                    rec,
                    MapRequest {
                        lblk: fb,
                        len: lb - fb,
                        uninit: true,
                    },
                )?;
            }
            return Ok(());
        }
        let extents = rec.uses_extents();
        let (a, b) = (off / bs, end.div_ceil(bs));
        let runs = bmap_write::map_blocks(
            &self.vol,
            h,
            ino,
            rec,
            MapRequest {
                lblk: a,
                len: b - a,
                uninit: extents,
            },
        )?;
        if !extents {
            // No unwritten state: new blocks must hold zeros on disk before
            // the map pointing at them commits.
            for r in runs.iter().filter(|r| r.new) {
                let zeros = vec![0u8; (r.len * bs) as usize];
                self.vol.disk().write_raw(r.pblk, &zeros)?;
            }
        }
        Ok(())
    }

    /// Zero the partial blocks at the edges of `[off, end)` through the
    /// cache (both edges may be one block).
    fn zero_range_edges(&self, inode: &CachedInode, rec: &Inode, off: u64, end: u64) -> Result<()> {
        let bs = self.vol.block_size() as u64;
        if off >= end {
            return Ok(());
        }
        if off / bs == (end - 1) / bs {
            if !off.is_multiple_of(bs) || !end.is_multiple_of(bs) {
                self.zero_in_block(inode, rec, off, end)?;
            }
            return Ok(());
        }
        if !off.is_multiple_of(bs) {
            self.zero_in_block(inode, rec, off, off.div_ceil(bs) * bs)?;
        }
        if !end.is_multiple_of(bs) {
            self.zero_in_block(inode, rec, end / bs * bs, end)?;
        }
        Ok(())
    }

    /// open(2): resolve `path` (creating a regular file with `mode` for
    /// O_CREAT), check `cred`'s permissions, apply O_TRUNC, and return the
    /// open file description.
    pub fn open_as(&self, path: &[u8], flags: OpenFlags, mode: u16, cred: &Cred) -> Result<Arc<File>> {
        // An inode freed between the walk and the open (a rename over the
        // name, an unlink) sends the open back to walk again: the name now
        // leads to another file, or nowhere. Each retry needs another
        // writer to have won the race, so a few are plenty.
        for _ in 0..16 {
            if let Some(f) = self.open_once(path, flags, mode, cred)? {
                return Ok(f);
            }
        }
        Err(Error::posix(
            Errno::ENOENT,
            format!("{}: removed again and again while being opened", show(path)),
        ))
    }

    /// One attempt of [`Fs::open_as`]: `None` when the inode the walk found
    /// was freed, or its name taken away, before the open counted itself
    /// (see [`Fs::open_walked`]).
    fn open_once(&self, path: &[u8], flags: OpenFlags, mode: u16, cred: &Cred) -> Result<Option<Arc<File>>> {
        let follow = !(flags.nofollow || (flags.create && flags.excl));
        if !flags.create && !flags.trunc {
            // The common open (a lock-free open that writes no shared
            // line): walk, find the thread's pin on
            // (inode, dentry), check the dentry is still cached, done —
            // nothing shared is written when this thread opened the file
            // before (see `vfs::pin`).
            let inode = {
                let g = self.dcache.pin();
                let d = self.resolve_in(&g, path, follow)?;
                match self.open_walked(Some(&g), d)? {
                    Some(r) => r,
                    None => return Ok(None),
                }
            };
            return self.finish_open(inode, path, flags, cred, false).map(Some);
        }
        let mut created = false;
        let d = match self.resolve(path, follow) {
            Ok(d) => {
                if flags.create && flags.excl {
                    return Err(Error::posix(Errno::EEXIST, format!("{}: file exists", show(path))));
                }
                d
            }
            Err(e) if e.errno() == Errno::ENOENT && flags.create => {
                let (parent, _) = split_last(path);
                let pd = self.resolve(parent, true)?;
                let dir = self.inode(pd.ino)?;
                let (dir_mode, dir_gid) = {
                    let r = dir.disk.read();
                    if !cred.may(&r, MAY_WRITE | MAY_EXEC) {
                        return Err(Error::posix(
                            Errno::EACCES,
                            format!("{}: permission denied (creating in {})", show(path), show(parent)),
                        ));
                    }
                    (r.base.mode, r.gid())
                };
                // A setgid directory hands its group to new files.
                let gid = if dir_mode & 0o2000 != 0 { dir_gid } else { cred.gid };
                match self.create(path, mode & 0o7777, cred.uid, gid) {
                    Ok(_) => created = true,
                    // Lost a race with another creator: open theirs.
                    Err(e) if e.errno() == Errno::EEXIST && !flags.excl => {}
                    Err(e) => return Err(e),
                }
                self.resolve(path, follow)?
            }
            Err(e) => return Err(e),
        };
        // Counted and checked before the truncation below: a walk that
        // lost a race must not truncate the inode number's next owner.
        let Some(inode) = self.open_walked(None, &d)? else {
            // Ours, just created, renamed over or unlinked already: the
            // retry opens what the name leads to now (or says ENOENT).
            return Ok(None);
        };
        self.finish_open(inode, path, flags, cred, created).map(Some)
    }

    /// One open of the inode dentry `d` (which a walk just found) names,
    /// counted on the calling thread's pin (`vfs::pin`); `None` when the
    /// inode was freed or `d` left the dentry cache meanwhile (the caller
    /// walks again). `g`: the walk's pin of the dentry cache, when `d` is
    /// borrowed under it.
    ///
    /// The race this closes (the pins' stress (now in tests/open_race.rs) read 0 bytes of a 20-byte
    /// file 1 run in 3–6 without it): a dentry holds an inode *number*,
    /// and numbers are reused at once — ext4 hands out the lowest free one
    /// in the group, so the file created right after a free usually gets
    /// the number just freed. An opener's walk finds `h0` → inode 17 and is
    /// descheduled; a rename over `h0` frees 17 (no open counted on it,
    /// every idle pin revoked); the renamer's next write_file creates
    /// `tmp` and gets number 17, empty until its write. The opener, back,
    /// finds no pin of its own on the new `CachedInode` 17 and makes one:
    /// `Pin::new` checks only that 17 is not freed, and it is not — it is
    /// the new, still-empty file. The pin said "alive", not "the inode
    /// this name named".
    ///
    /// So after the count is taken (which keeps whatever inode it counted
    /// from being freed until the open is closed), `d` must still be the
    /// cached dentry of its name: unlink and rename take a dying name out
    /// of the dentry cache before its inode is freed (`remove_at`,
    /// `rename_at`), a dentry taken out never comes back (a new lookup
    /// makes a new one; only a rename's source moves, alive), and the
    /// check holds `d` (by the pin, and `g`), so no other dentry can have
    /// its address. Cached at the check, then, `d`'s inode was not freed
    /// before it, so it is the inode counted (the counted one exists only
    /// after a free of `d`'s) — and the name led to it at the check: the
    /// open takes effect there, and never opens a freed inode, its
    /// number's next owner, or what a name renamed over used to be once
    /// the rename has completed. The check is reads only (a map lookup
    /// and two arc-swap guards, the thread's own debt slots): the common
    /// open still writes no shared line. It runs on the thread's cached
    /// pin too, though that pin was checked when it was made (so its inode
    /// is `d`'s) — the same rule on both paths costs one map probe.
    fn open_walked(
        &self,
        g: Option<&super::dcache::DcacheGuard<'_>>,
        d: &Arc<super::dcache::Dentry>,
    ) -> Result<Option<super::pin::OpenRef>> {
        // The thread's pin on (the cached inode of `d.ino`, `d`), if any;
        // looked up while `d` is held, so the addresses are live objects.
        let cached = self
            .icache
            .peek(d.ino)
            .and_then(|i| super::pin::reopen(i, Arc::as_ptr(d)));
        let r = match cached {
            Some(r) => r,
            None => {
                let inode = match self.inode(d.ino) {
                    Ok(i) => i,
                    // Freed since the walk (its record says deleted).
                    Err(e) if e.errno() == Errno::ENOENT => return Ok(None),
                    Err(e) => return Err(e),
                };
                match super::pin::open(&inode, Some(d)) {
                    Some(r) => r,
                    // Freed between the lookup and the count.
                    None => return Ok(None),
                }
            }
        };
        let cached_now = match g {
            Some(g) => g.holds(d),
            None => self.dcache.pin().holds(d),
        };
        if !cached_now {
            // Its pin will never match a walk again (`d` is gone for
            // good): out of the thread's cache, and the open dropped as a
            // close is — the last user of an inode unlinked meanwhile
            // frees it.
            super::pin::uncache(r.pin());
            self.close_open(r)?;
            return Ok(None);
        }
        Ok(Some(r))
    }

    /// The checks and O_TRUNC of an open whose walk found `inode` (already
    /// counted: an error closes it again).
    fn finish_open(
        &self,
        inode: super::pin::OpenRef,
        path: &[u8],
        flags: OpenFlags,
        cred: &Cred,
        created: bool,
    ) -> Result<Arc<File>> {
        let checked = if flags.nofollow && inode.ftype == FileType::Symlink {
            Err(Error::posix(
                Errno::ELOOP,
                format!("{}: is a symbolic link (O_NOFOLLOW)", show(path)),
            ))
        } else {
            self.may_open(&inode, flags, cred, !created, &|| show(path).to_string())
                .and_then(|()| {
                    if flags.trunc && inode.ftype == FileType::Regular && !created {
                        self.truncate_inode(&inode, 0, &Caller::new(cred))?;
                    }
                    Ok(())
                })
        };
        if let Err(e) = checked {
            // Closed as any open is (an unlink since the count may have
            // left this the inode's last user).
            self.close_open(inode)?;
            return Err(e);
        }
        let mut file = File::new(inode, flags);
        file.opener = cred.clone();
        Ok(Arc::new(file))
    }

    /// The kernel's `may_open` for an inode about to be opened with
    /// `flags`, after the path walk or the node lookup: ENOTDIR for
    /// O_DIRECTORY on a non-directory, EISDIR for writing a directory, the
    /// mode bits and ACLs when `check_perm` (not for a file this open just
    /// created, nor when the caller checked already), EPERM for writing an
    /// immutable inode or an append-only one without O_APPEND (or with
    /// O_TRUNC), EROFS for writing a regular file on a read-only volume
    /// (devices, fifos and sockets can be written there). `what` names the
    /// inode in messages (a path, or "inode N").
    pub(crate) fn may_open(
        &self,
        inode: &CachedInode,
        flags: OpenFlags,
        cred: &Cred,
        check_perm: bool,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        if flags.directory && inode.ftype != FileType::Directory {
            return Err(Error::posix(Errno::ENOTDIR, format!("{}: not a directory", what())));
        }
        let write = flags.access.writes() || flags.trunc;
        if inode.ftype == FileType::Directory && write {
            return Err(Error::posix(Errno::EISDIR, format!("{}: is a directory", what())));
        }
        // What follows reads the record only for a check whose outcome it
        // can change: permission bits for anyone but root (root may read
        // and write anything; open never asks for exec), immutable and
        // append-only for a write or truncation. A read-only open by root
        // takes no lock: a reader lock is a write to the lock word, which
        // every opener of the inode shares (opens write no shared line).
        if !write && (!check_perm || cred.is_root()) {
            return Ok(());
        }
        super::shared::note(2);
        let rec = inode.disk.read();
        if check_perm {
            let mut mask = 0;
            if flags.access.reads() {
                mask |= MAY_READ;
            }
            if write {
                mask |= MAY_WRITE;
            }
            if !cred.may(&rec, mask) {
                return Err(Error::posix(Errno::EACCES, format!("{}: permission denied", what())));
            }
        }
        let f = rec.base.flags;
        if write && f & iflags::IMMUTABLE != 0
            || f & iflags::APPEND != 0 && (flags.trunc || flags.access.writes() && !flags.append)
        {
            return Err(Error::posix(
                Errno::EPERM,
                format!("{}: immutable or append-only", what()),
            ));
        }
        if write && self.vol.read_only() && inode.ftype == FileType::Regular {
            return Err(Error::posix(Errno::EROFS, format!("{}: read-only filesystem", what())));
        }
        Ok(())
    }
}

/// "/a/b/c" -> ("/a/b", "c"), trailing slashes ignored.
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    let mut e = path.len();
    while e > 1 && path[e - 1] == b'/' {
        e -= 1;
    }
    let p = &path[..e];
    match p.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &p[1..]),
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"/", p),
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cred, OpenFlags, RenameFlags};

    use crate::vfs::mem_fs as fs;

    /// The window the pins' stress (tests/open_race.rs) hit 1 run in 3–6, made to happen on
    /// one thread: a walk finds `/h0` → inode N; before the open counts
    /// itself, a rename over `/h0` frees N and a create reuses N (empty).
    /// The open must not open the new file (`open_walked` says `None`:
    /// walk again) — and then opens what `/h0` is now.
    #[test]
    fn an_open_whose_inode_number_was_reused_walks_again() {
        let fs = fs();
        let root = Cred::root();
        fs.write_file(b"/h0", b"old contents", 0o644, 0, 0).unwrap();
        // The walk's result, held as a walk borrows it.
        let d = fs.resolve(b"/h0", true).unwrap();
        let n = d.ino;
        fs.write_file(b"/tmp", b"new contents", 0o644, 0, 0).unwrap();
        fs.rename(b"/tmp", b"/h0", RenameFlags::default(), &root).unwrap();
        // The next file gets the lowest free number: the one just freed.
        fs.write_file(b"/next", b"", 0o644, 0, 0).unwrap();
        assert_eq!(fs.stat(b"/next").unwrap().ino, n, "the number was reused");
        assert!(
            fs.open_walked(None, &d).unwrap().is_none(),
            "opened the freed number's next owner through a stale dentry"
        );
        let f = fs.open(b"/h0", OpenFlags::default()).unwrap();
        let mut buf = [0u8; 32];
        let got = f.pread(&fs, 0, &mut buf).unwrap();
        assert_eq!(&buf[..got], b"new contents");
        fs.close_file(f).unwrap();
    }

    /// The thread's cached pin is checked too: with `/h0` open on this
    /// thread (its pin busy), a rename over the name keeps the old inode
    /// as an orphan; an open whose walk found the old dentry before the
    /// rename must not open it once the rename is done (`None`), and the
    /// old inode is freed at its last close.
    #[test]
    fn a_cached_pin_on_a_name_renamed_over_is_not_reused() {
        let fs = fs();
        let root = Cred::root();
        let free0 = fs.statfs().unwrap().files_free;
        fs.write_file(b"/h0", b"old contents", 0o644, 0, 0).unwrap();
        let held = fs.open(b"/h0", OpenFlags::default()).unwrap();
        let d = fs.resolve(b"/h0", true).unwrap();
        fs.write_file(b"/tmp", b"new contents", 0o644, 0, 0).unwrap();
        fs.rename(b"/tmp", b"/h0", RenameFlags::default(), &root).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 2, "the old /h0 is open: kept");
        assert!(
            fs.open_walked(None, &d).unwrap().is_none(),
            "reopened a name renamed over"
        );
        let mut buf = [0u8; 32];
        let got = held.pread(&fs, 0, &mut buf).unwrap();
        assert_eq!(&buf[..got], b"old contents");
        fs.close_file(held).unwrap();
        assert_eq!(fs.statfs().unwrap().files_free, free0 - 1, "freed at its last close");
    }

    #[test]
    fn split_last_component() {
        assert_eq!(super::split_last(b"/a/b/c"), (&b"/a/b"[..], &b"c"[..]));
        assert_eq!(super::split_last(b"/c//"), (&b"/"[..], &b"c"[..]));
        assert_eq!(super::split_last(b"c"), (&b"/"[..], &b"c"[..]));
    }
}
