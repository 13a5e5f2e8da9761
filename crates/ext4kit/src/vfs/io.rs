//! The write side of file I/O on an inode: buffered writes through the page
//! cache, truncate and fallocate.
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

use ext4kit_format::features::ro_compat;
use ext4kit_format::indirect;
use ext4kit_format::inode::{flags as iflags, FileType, Inode, TimeField, Timestamp};

use super::cred::Caller;
use super::icache::{CachedInode, DIRTY_DATA, DIRTY_TIME};
use super::killpriv;
use super::request::{Fallocate, WriteAt, WriteRequest, Written};
use super::super_block::SuperBlock;
use super::syncmode;
use super::writeback;
use super::writeback::SyncLevel;
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
pub(crate) fn max_file_size(sb: &SuperBlock, rec: &Inode) -> u64 {
    let bs = sb.vol().block_size() as u64;
    let map_limit = if rec.uses_extents() {
        ((1u64 << 32) - 1) * bs
    } else {
        let per = bs / 4;
        (indirect::DIRECT as u64 + per + per * per + per * per * per).saturating_mul(bs)
    };
    let sectors = if sb.vol().geo().has_ro_compat(ro_compat::HUGE_FILE) {
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

fn check_writable(sb: &SuperBlock, inode: &CachedInode, rec: &Inode) -> Result<()> {
    check_regular(inode)?;
    if sb.vol().read_only() {
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
fn check_not_append_only(inode: &CachedInode, rec: &Inode) -> Result<()> {
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
fn block_contents(sb: &SuperBlock, inode: &CachedInode, map: &BlockMap, lblk: u64) -> Result<Box<[u8]>> {
    if let Some(p) = inode.pages.get(lblk) {
        return Ok(p.data.clone());
    }
    let mut b = vec![0u8; sb.vol().block_size()].into_boxed_slice();
    if let Mapping::Mapped {
        pblk, uninit: false, ..
    } = map.map(sb.vol(), lblk)?
    {
        sb.vol()
            .disk()
            .read_raw(pblk, &mut b)
            .map_err(|e| crate::ext4::error::annotate(e, &format!("data of inode {}", inode.ino)))?;
    }
    Ok(b)
}

/// Zero block `at / bs` from byte `at % bs` to its end, through the
/// cache (dirtying it) — only if those bytes are not already zero.
fn zero_block_tail(sb: &SuperBlock, inode: &CachedInode, rec: &Inode, at: u64) -> Result<()> {
    zero_in_block(
        sb,
        inode,
        rec,
        at,
        at.div_ceil(sb.vol().block_size() as u64) * sb.vol().block_size() as u64,
    )
}

/// Zero bytes `[from, to)`, which lie in one block, through the cache.
fn zero_in_block(sb: &SuperBlock, inode: &CachedInode, rec: &Inode, from: u64, to: u64) -> Result<()> {
    let bs = sb.vol().block_size() as u64;
    if from >= to {
        return Ok(());
    }
    let lblk = from / bs;
    let (a, b) = ((from % bs) as usize, (to - lblk * bs) as usize);
    let map = inode.block_map_locked(sb.vol(), rec)?;
    let cached = inode.pages.get(lblk).is_some();
    if !cached && !matches!(map.map(sb.vol(), lblk)?, Mapping::Mapped { uninit: false, .. }) {
        return Ok(()); // a hole or unwritten extent already reads as zeros
    }
    let mut data = block_contents(sb, inode, &map, lblk)?;
    if all_zero(&data[a..b]) {
        return Ok(());
    }
    data[a..b].fill(0);
    install_dirty(sb, inode, vec![(lblk, data)]);
    Ok(())
}

/// Whether every byte is zero. Every write that ends inside a block past
/// the old end of file asks this of the block's tail (up to a block), so it
/// must not cost a cycle a byte: a byte loop with an early exit is not
/// vectorised (1,048,576 one-byte appends spent 65% of their time in it,
/// 1.5 µs each), an OR over 64 bytes without a branch is.
fn all_zero(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(64);
    for c in &mut chunks {
        if c.iter().fold(0u8, |acc, &x| acc | x) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&x| x == 0)
}

fn install_dirty(sb: &SuperBlock, inode: &CachedInode, pages: Vec<(u64, Box<[u8]>)>) {
    let (new_pages, new_dirty) = inode.pages.write_pages(pages, sb.pages());
    sb.pages().charge_dirty(new_dirty);
    if sb.pages().charge(new_pages) {
        sb.shrink_pages();
    }
}

/// The work of [`Fs::take_writeback_error`](crate::Fs::take_writeback_error).
pub(crate) fn take_writeback_error(inode: &CachedInode) -> Option<Error> {
    inode.pages.take_wb_error()
}

/// The work of [`Fs::reserver`](crate::Fs::reserver).
pub(crate) fn reserver(sb: &SuperBlock, uid: u32, gid: u32) -> Reserver {
    if uid == 0 || uid == sb.vol().sb().resuid() || gid == sb.vol().sb().resgid() {
        Reserver::Privileged
    } else {
        Reserver::User
    }
}

/// The work of [`Fs::write_inode`](crate::Fs::write_inode).
pub(crate) fn write_inode(sb: &SuperBlock, inode: &CachedInode, req: &WriteRequest<'_>) -> Result<Written> {
    check_regular(inode)?;
    // Past the dirty budget because write-back keeps failing (a dying
    // device): refuse more data rather than hold it in memory without
    // bound. The data already accepted stays dirty, its error is kept
    // for fsync.
    if sb.pages().dirty_over() {
        if let Err(e) = writeback::balance_dirty(sb, inode) {
            if sb.pages().dirty_over() {
                return Err(e);
            }
        }
    }
    let r = write_locked(sb, inode, req);
    // Memory pressure is handled with no inode lock held. Its failure
    // is not this write's (the data is accepted and stays dirty): it
    // is kept on the inode that failed for its next fsync.
    if r.is_ok() {
        let _ = writeback::balance_dirty(sb, inode);
    }
    let (written, inode_sync) = r?;
    // generic_write_sync: O_SYNC writes back everything (fsync); O_DSYNC
    // and a synchronous inode or filesystem what the data needs
    // (fdatasync: the size, the block map).
    let level = match req.sync {
        Some(l) => Some(l),
        None if inode_sync || sb.sync_mount().sync => Some(SyncLevel::Data),
        None => None,
    };
    if let Some(l) = level {
        if written.len > 0 {
            writeback::fsync_inode(sb, inode, l)?;
        }
    }
    Ok(written)
}

/// The blocks of `[first, upto]` that need a claim before they can be
/// dirtied: not delayed already, and over a hole (`true`) or an
/// unwritten extent (`false`). Written blocks are overwritten in place.
fn unclaimed_blocks(
    sb: &SuperBlock,
    inode: &CachedInode,
    map: &BlockMap,
    first: u64,
    upto: u64,
) -> Result<Vec<(u64, bool)>> {
    let mut out = Vec::new();
    let mut l = first;
    while l <= upto {
        let (len, kind) = match map.map(sb.vol(), l)? {
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
fn write_locked(sb: &SuperBlock, inode: &CachedInode, req: &WriteRequest<'_>) -> Result<(Written, bool)> {
    let buf = req.data;
    let who = reserver(sb, req.caller.cred.uid, req.caller.cred.gid);
    let mut rec = inode.disk.write();
    check_writable(sb, inode, &rec)?;
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
    let max = max_file_size(sb, &rec);
    if off >= max {
        return Err(Error::posix(
            Errno::EFBIG,
            format!("inode {}: offset {off} is past the largest file size {max}", inode.ino),
        ));
    }
    // ext4_write_checks → file_modified: privileges go before the data.
    let privs_cleared = killpriv::remove_privs(sb, inode, &mut rec, &req.caller)?;
    let buf = &buf[..buf.len().min((max - off) as usize)];
    let end = off + buf.len() as u64;
    let bs = sb.vol().block_size() as u64;
    // A failure after some chunks were written ends the write short
    // (write(2) reports what it wrote; the next call sees the error).
    let mut failure = None;
    let mut pos = off;
    let mut tail_zeroed = false;
    'chunks: while pos < end {
        let map = match inode.block_map_locked(sb.vol(), &rec) {
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
        let new = match unclaimed_blocks(sb, inode, &map, first, upto) {
            Ok(n) => n,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let meta = |n: u64| crate::ext4::reservation::worst_map_growth(sb.vol().block_size(), &rec, n);
        match inode.pages.reserve(sb.vol().reservations(), who, &new, &meta) {
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
            if let Err(e) = zero_block_tail(sb, inode, &rec, old_size) {
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
                match block_contents(sb, inode, &map, lblk) {
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
        install_dirty(sb, inode, pages);
        pos = stop.min((upto + 1) * bs);
        if pos > rec.size() {
            set_size(inode, &mut rec, pos);
            inode.mark_dirty(DIRTY_DATA);
        }
        if failure.is_some() {
            break;
        }
        if pos < end && sb.pages().dirty_over() {
            // The data is accepted; a failure to write it back now is
            // the inode's to report at fsync (kept by writeback).
            let _ = writeback::writer(sb).writeback_locked(inode, &mut rec, SyncLevel::All);
        }
    }
    if pos == off {
        if let Some(e) = failure {
            return Err(e);
        }
    }
    if req.stamp_times {
        touch_mtime(inode, &mut rec, sb.now());
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

/// The work of [`Fs::truncate_inode`](crate::Fs::truncate_inode).
pub(crate) fn truncate_inode(sb: &SuperBlock, inode: &CachedInode, len: u64, caller: &Caller<'_>) -> Result<bool> {
    let (cleared, sync) = sb.retry_enospc(|| truncate_inode_once(sb, inode, len, caller))?;
    if sync {
        syncmode::commit_for(sb, inode)?;
    }
    Ok(cleared)
}

/// One attempt of [`Fs::truncate_inode`]: whether setuid/setgid were
/// cleared, and whether the change must be durable now.
fn truncate_inode_once(sb: &SuperBlock, inode: &CachedInode, len: u64, caller: &Caller<'_>) -> Result<(bool, bool)> {
    check_regular(inode)?;
    let mut rec = inode.disk.write();
    check_writable(sb, inode, &rec)?;
    check_not_append_only(inode, &rec)?;
    let max = max_file_size(sb, &rec);
    if len > max {
        return Err(Error::posix(
            Errno::EFBIG,
            format!("inode {}: size {len} is past the largest file size {max}", inode.ino),
        ));
    }
    let cleared = killpriv::remove_privs(sb, inode, &mut rec, caller)?;
    let sync = sb.sync_mount().is_sync(rec.base.flags);
    let old = rec.size();
    let bs = sb.vol().block_size() as u64;
    if len < old {
        let fb = len.div_ceil(bs);
        // Everything the punch will free and the tail zeroing will
        // write is checked while nothing has changed (release_check.rs).
        let tail = (!len.is_multiple_of(bs)).then_some(len / bs);
        release_check::punch(
            sb.vol(),
            &Punch {
                ino: inode.ino,
                rec: &rec,
                from: fb,
                to: u64::MAX,
                tail,
            },
        )?;
        // Punch first: it fails (interim limits) before changing anything.
        let mut h = sb.vol().begin()?;
        // Readers that looked at the old map must not trust blocks we
        // free from here on (PageMap's `seq`).
        inode.pages.bump();
        bmap_write::punch(sb.vol(), &mut h, inode.ino, &mut rec, fb..u64::MAX)?;
        set_size(inode, &mut rec, len);
        let (pages, dirty) = inode.pages.remove_range(fb, u64::MAX, sb.pages());
        sb.pages().release(pages);
        sb.pages().release_dirty(dirty);
        inode.reset_block_map();
        // A failure here (reading the tail block) must not keep the
        // freed blocks and the new map from reaching disk together.
        let tail = if len.is_multiple_of(bs) {
            Ok(())
        } else {
            zero_block_tail(sb, inode, &rec, len)
        };
        touch_mtime(inode, &mut rec, sb.now());
        // Freed blocks and the map that no longer holds them go to disk
        // in one handle, so the record is written now.
        inode::write(sb.vol(), &mut h, inode.ino, &rec)?;
        h.commit()?;
        inode.clear_dirty();
        tail?;
    } else {
        if len > old {
            if !old.is_multiple_of(bs) {
                zero_block_tail(sb, inode, &rec, old)?;
            }
            set_size(inode, &mut rec, len);
            inode.mark_dirty(DIRTY_DATA);
        }
        touch_mtime(inode, &mut rec, sb.now());
    }
    Ok((cleared, sync))
}

/// The work of [`Fs::fallocate_inode`](crate::Fs::fallocate_inode).
pub(crate) fn fallocate_inode(
    sb: &SuperBlock,
    inode: &CachedInode,
    req: Fallocate,
    caller: &Caller<'_>,
) -> Result<bool> {
    let (cleared, sync) = sb.retry_enospc(|| fallocate_inode_once(sb, inode, req, caller))?;
    if sync {
        syncmode::commit_for(sb, inode)?;
    }
    Ok(cleared)
}

/// One attempt of [`Fs::fallocate_inode`]: whether setuid/setgid
/// were cleared, and whether the change must be durable now.
fn fallocate_inode_once(
    sb: &SuperBlock,
    inode: &CachedInode,
    req: Fallocate,
    caller: &Caller<'_>,
) -> Result<(bool, bool)> {
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
    check_writable(sb, inode, &rec)?;
    if mode & !FALLOC_FL_KEEP_SIZE != 0 {
        check_not_append_only(inode, &rec)?;
    }
    let max = max_file_size(sb, &rec);
    let end = off.checked_add(len).filter(|&e| e <= max).ok_or_else(|| {
        Error::posix(
            Errno::EFBIG,
            format!("fallocate on inode {ino}: range past the largest file size {max}"),
        )
    })?;
    if mode & FALLOC_FL_ZERO_RANGE != 0 && !rec.uses_extents() {
        return Err(bad("ZERO_RANGE needs an extent-mapped file"));
    }
    let sync = sb.sync_mount().is_sync(rec.base.flags);
    let bs = sb.vol().block_size() as u64;
    let size = rec.size();
    if mode & FALLOC_FL_PUNCH_HOLE != 0 {
        // ext4_punch_hole: nothing past EOF (not even file_modified);
        // partial edge blocks zeroed in the cache, whole blocks freed.
        let end = end.min(size);
        if off >= end {
            return Ok((false, false));
        }
        let cleared = killpriv::remove_privs(sb, inode, &mut rec, caller)?;
        let (fb, lb) = (off.div_ceil(bs), end / bs);
        // What the punch frees is checked while nothing has changed.
        check_whole_blocks_freed(sb, ino, &rec, fb, lb)?;
        zero_range_edges(sb, inode, &rec, off, end)?;
        if fb < lb {
            let mut h = sb.vol().begin()?;
            inode.pages.bump();
            bmap_write::punch(sb.vol(), &mut h, ino, &mut rec, fb..lb)?;
            let (pages, dirty) = inode.pages.remove_range(fb, lb, sb.pages());
            sb.pages().release(pages);
            sb.pages().release_dirty(dirty);
            inode.reset_block_map();
            touch_mtime(inode, &mut rec, sb.now());
            inode::write(sb.vol(), &mut h, ino, &rec)?;
            h.commit()?;
            inode.clear_dirty();
        } else {
            touch_mtime(inode, &mut rec, sb.now());
        }
        return Ok((cleared, sync));
    }
    let cleared = killpriv::remove_privs(sb, inode, &mut rec, caller)?;
    if mode & FALLOC_FL_ZERO_RANGE != 0 {
        // ZERO_RANGE punches the whole blocks before mapping them
        // unwritten: what it frees is checked while nothing has changed.
        check_whole_blocks_freed(sb, ino, &rec, off.div_ceil(bs), end / bs)?;
    }
    let mut h = sb.vol().begin()?;
    let r = fallocate_blocks(sb, &mut h, inode, &mut rec, mode, off, end);
    // Whatever was changed is committed, even after a failure: the
    // handle's bitmaps and the record's map must reach disk together.
    inode.reset_block_map();
    let mut r = r;
    if r.is_ok() && mode & FALLOC_FL_KEEP_SIZE == 0 && end > size {
        if !size.is_multiple_of(bs) {
            r = zero_block_tail(sb, inode, &rec, size);
        }
        if r.is_ok() {
            set_size(inode, &mut rec, end);
        }
    }
    // ext4_fallocate updates the times like a write does.
    touch_mtime(inode, &mut rec, sb.now());
    inode::write(sb.vol(), &mut h, ino, &rec)?;
    h.commit()?;
    inode.clear_dirty();
    r.map(|()| (cleared, sync))
}

/// The block-map part of fallocate's allocate and ZERO_RANGE modes.
fn fallocate_blocks(
    sb: &SuperBlock,
    h: &mut crate::ext4::transaction::Handle<'_>,
    inode: &CachedInode,
    rec: &mut Inode,
    mode: u32,
    off: u64,
    end: u64,
) -> Result<()> {
    let bs = sb.vol().block_size() as u64;
    let ino = inode.ino;
    if mode & FALLOC_FL_ZERO_RANGE != 0 {
        // ext4_zero_range: partial edges zeroed through the cache (bytes
        // past EOF are zero already); whole blocks become unwritten
        // extents: they read as zeros and stay allocated.
        zero_range_edges(sb, inode, rec, off, end.min(rec.size().max(off)))?;
        let (fb, lb) = (off.div_ceil(bs), end / bs);
        if fb < lb {
            inode.pages.bump();
            bmap_write::punch(sb.vol(), h, ino, rec, fb..lb)?;
            let (pages, dirty) = inode.pages.remove_range(fb, lb, sb.pages());
            sb.pages().release(pages);
            sb.pages().release_dirty(dirty);
            bmap_write::map_blocks(
                sb.vol(),
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
        sb.vol(),
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
            sb.vol().disk().write_raw(r.pblk, &zeros)?;
        }
    }
    Ok(())
}

/// Check what freeing file blocks `fb..lb` of inode `ino` (none when
/// `fb >= lb`) would release, before anything changes
/// (`release_check`): a block another inode also claims stops the call.
fn check_whole_blocks_freed(sb: &SuperBlock, ino: u32, rec: &Inode, fb: u64, lb: u64) -> Result<()> {
    if fb >= lb {
        return Ok(());
    }
    release_check::punch(
        sb.vol(),
        &Punch {
            ino,
            rec,
            from: fb,
            to: lb,
            tail: None,
        },
    )
}

/// Zero the partial blocks at the edges of `[off, end)` through the
/// cache (both edges may be one block).
fn zero_range_edges(sb: &SuperBlock, inode: &CachedInode, rec: &Inode, off: u64, end: u64) -> Result<()> {
    let bs = sb.vol().block_size() as u64;
    if off >= end {
        return Ok(());
    }
    if off / bs == (end - 1) / bs {
        if !off.is_multiple_of(bs) || !end.is_multiple_of(bs) {
            zero_in_block(sb, inode, rec, off, end)?;
        }
        return Ok(());
    }
    if !off.is_multiple_of(bs) {
        zero_in_block(sb, inode, rec, off, off.div_ceil(bs) * bs)?;
    }
    if !end.is_multiple_of(bs) {
        zero_in_block(sb, inode, rec, end / bs * bs, end)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::all_zero;

    #[test]
    fn all_zero_sees_any_byte_set() {
        for len in [0usize, 1, 63, 64, 65, 127, 4096] {
            let mut b = vec![0u8; len];
            assert!(all_zero(&b), "{len} zeros");
            for at in 0..len {
                b[at] = 1;
                assert!(!all_zero(&b), "byte {at} of {len}");
                b[at] = 0;
            }
        }
    }
}
