//! Writeback: turning an inode's dirty pages (and dirty record) into disk
//! writes — the kernel's `ext4_writepages` + `ext4_sync_file`, seed 003.
//!
//! For one inode, under its `disk` write lock (the `i_rwsem` analogue; a
//! writer cannot re-dirty a page while we run, and the record we write is
//! the one the pages belong to):
//!
//! 1. take the dirty set — exactly the dirty blocks, in logical order, so
//!    the cost is O(dirty) however many clean pages are cached;
//! 2. group consecutive blocks into runs; look each run up in the cached
//!    block map: written blocks are overwritten in place, holes and
//!    unwritten extents go through `map_blocks` — delayed allocation: the
//!    blocks are chosen only now, so a run of dirty pages becomes one
//!    contiguous allocation;
//! 3. write each physical run with one device write (runs are capped at
//!    [`MAX_RUN`] blocks to bound the staging buffer), then convert
//!    unwritten extents it covered (`mark_written`);
//! 4. write the inode record if the map changed or the caller's level asks
//!    for it, and commit the handle: data reaches the device before the
//!    metadata that points at it (ordered mode);
//! 5. mark clean only the pages whose contents were written and are still
//!    the cached ones.
//!
//! Space: the blocks step 2 allocates were claimed when the writes were
//! accepted (`pagecache`'s reservations, `ext4::reserve`). The inode's
//! claims are handed to the transaction before the first allocation, the
//! allocator draws from them, and afterwards the books are settled: the
//! pages now on disk leave the delayed set, and what is left of the claims
//! is kept for the pages still delayed or given back. So writeback does not
//! look for free space of its own, and cannot run out of it.
//!
//! A failure (an I/O error writing the image) ends the pass: newly
//! allocated blocks whose data could not be written are unmapped again
//! (so no file ever shows blocks holding someone else's old data), what
//! was done is committed, the pages stay dirty, and the error is kept on
//! the inode (`PageMap::set_wb_error`) for the next fsync or FLUSH as well
//! as returned.

use std::sync::Arc;

use ext4kit_format::inode::Inode;

use super::icache::Icache;
use super::icache::{CachedInode, DIRTY_DATA};
use super::pagecache::{Page, PageBudget};
use super::Fs;
use crate::error::{Errno, Error, Result};
use crate::ext4::bmap_write::{self, MapRequest};
use crate::ext4::transaction::Handle;
use crate::ext4::{inode, Mapping, Volume};

/// Longest run written with one device write (blocks).
pub const MAX_RUN: u64 = 1024;

/// When the inode record must be written along with the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncLevel {
    /// fsync / sync / memory pressure: if dirty at any level.
    All,
    /// fdatasync: only if data-relevant fields changed ([`DIRTY_DATA`]);
    /// timestamps alone stay in memory.
    Data,
}

/// What one writeback did (for tests and benchmarks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WritebackStats {
    /// Pages written.
    pub pages: usize,
    /// Device writes issued for data.
    pub data_writes: usize,
    /// Whether the inode record was written.
    pub inode_written: bool,
}

/// What writeback needs of an open filesystem: the volume and the page
/// budget. The background worker holds these (never the `Fs`, whose last
/// handle must be dropped by a caller), so it can write back expired
/// dirty data too ([`write_back_expired`]).
pub(crate) struct Writer<'a> {
    pub(crate) vol: &'a Volume,
    pub(crate) pages: &'a PageBudget,
}

impl Writer<'_> {
    /// Write back inode `inode`: dirty pages, then the record as `level`
    /// requires. Does not flush the device (fsync does).
    pub fn writeback_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        // ext4_should_retry_alloc: with a journal, blocks freed by the
        // running transaction are reused only once it commits.
        match self.writeback_inode_once(inode, level) {
            Err(e) if e.errno() == Errno::ENOSPC && self.vol.has_busy_blocks() => {
                self.vol.commit_running()?;
                self.writeback_inode_once(inode, level)
            }
            r => r,
        }
    }

    /// One attempt of [`Self::writeback_inode`].
    fn writeback_inode_once(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        if !inode.is_dirty() {
            return Ok(WritebackStats::default());
        }
        let mut rec = inode.disk.write();
        self.writeback_locked(inode, &mut rec, level)
    }

    /// [`Self::writeback_inode`] for a caller holding the `disk` write lock
    /// (`rec` is the guarded record).
    pub(crate) fn writeback_locked(
        &self,
        inode: &CachedInode,
        rec: &mut Inode,
        level: SyncLevel,
    ) -> Result<WritebackStats> {
        let ino = inode.ino;
        let bs = self.vol.block_size();
        let mut st = WritebackStats::default();
        let dirty = inode.pages.dirty_blocks();
        let mut h: Option<Handle<'_>> = None;
        let mut map_changed = false;
        let mut written: Vec<(u64, Arc<Page>)> = Vec::with_capacity(dirty.len());
        let mut failure: Option<Error> = None;
        // Claims handed to the handle (see the module doc), once taken.
        let mut claims_taken = false;
        let map = if dirty.is_empty() {
            None
        } else {
            Some(inode.block_map_locked(self.vol, rec)?)
        };

        'runs: for (start, len) in runs(&dirty) {
            let mut pages = Vec::with_capacity(len as usize);
            for l in start..start + len {
                match inode.pages.get(l) {
                    Some(p) => pages.push(p),
                    None => {
                        failure = Some(Error::corrupt_msg(
                            format!("inode {ino}"),
                            "page cache",
                            format!("dirty block {l} has no cached page"),
                        ));
                        break 'runs;
                    }
                }
            }
            let map = map.as_ref().expect("loaded when pages are dirty");
            let mut l = start;
            while l < start + len {
                let end = start + len;
                let seg: Vec<(u64, u64, u64, bool, bool)> = match map.map(self.vol, l) {
                    Err(e) => {
                        failure = Some(e);
                        break 'runs;
                    }
                    Ok(Mapping::Mapped {
                        pblk,
                        len: n,
                        uninit: false,
                    }) => vec![(l, pblk, n.min(end - l), false, false)],
                    Ok(Mapping::Mapped { len: n, .. }) | Ok(Mapping::Hole { len: n }) => {
                        // Delayed allocation happens here.
                        let n = n.min(end - l);
                        if h.is_none() {
                            match self.vol.begin() {
                                Ok(x) => h = Some(x),
                                Err(e) => {
                                    failure = Some(e);
                                    break 'runs;
                                }
                            }
                        }
                        let hh = h.as_mut().expect("just begun");
                        if !claims_taken {
                            claims_taken = true;
                            hh.add_reserved(inode.pages.take_claims());
                        }
                        match bmap_write::map_blocks(
                            self.vol,
                            hh,
                            ino,
                            rec,
                            MapRequest {
                                lblk: l,
                                len: n,
                                uninit: false,
                            },
                        ) {
                            Ok(rs) => {
                                map_changed = true;
                                rs.into_iter()
                                    .map(|r| (r.lblk, r.pblk, r.len, r.uninit, r.new))
                                    .collect()
                            }
                            Err(e) => {
                                failure = Some(e);
                                break 'runs;
                            }
                        }
                    }
                };
                let mut seg = seg.into_iter();
                while let Some((sl, pblk, n, uninit, new)) = seg.next() {
                    let first = (sl - start) as usize;
                    let chunk = &pages[first..first + n as usize];
                    let mut buf = Vec::with_capacity(n as usize * bs);
                    for p in chunk {
                        buf.extend_from_slice(&p.data);
                    }
                    if let Err(e) = self.vol.disk().write_raw(pblk, &buf) {
                        failure = Some(crate::ext4::error::annotate(e, &format!("data of inode {ino}")));
                        // Blocks allocated for data that never reached them
                        // leave the map again: committed, the map would show
                        // whatever they held before. The pages stay dirty
                        // (and delayed) for a later try.
                        let hh = h.as_mut();
                        let unmap: Vec<(u64, u64)> = std::iter::once((sl, n, new))
                            .chain(seg.by_ref().map(|(l2, _, n2, _, new2)| (l2, n2, new2)))
                            .filter(|r| r.2)
                            .map(|r| (r.0, r.1))
                            .collect();
                        if let Some(hh) = hh {
                            for (ul, un) in unmap {
                                if let Err(e2) = bmap_write::punch(self.vol, hh, ino, rec, ul..ul + un) {
                                    eprintln!(
                                        "ext4kit: inode {ino}: unmapping blocks {ul}..{} after a failed data write: {e2}",
                                        ul + un
                                    );
                                    break;
                                }
                            }
                        }
                        break 'runs;
                    }
                    st.data_writes += 1;
                    if uninit {
                        let hh = h.as_mut().expect("uninit extents come from map_blocks");
                        if let Err(e) = bmap_write::mark_written(self.vol, hh, ino, rec, sl..sl + n) {
                            failure = Some(e);
                            break 'runs;
                        }
                        map_changed = true;
                    }
                    for (k, p) in chunk.iter().enumerate() {
                        written.push((sl + k as u64, p.clone()));
                    }
                    l = sl + n;
                }
            }
        }

        // Commit what was done, even after a failure: allocations already
        // installed in the handle's blocks must reach the disk together
        // with the map that owns them.
        if map_changed {
            inode.mark_dirty(DIRTY_DATA);
        }
        let need_inode = match level {
            SyncLevel::All => inode.dirty_level() != 0,
            SyncLevel::Data => inode.dirty_level() & DIRTY_DATA != 0,
        };
        if need_inode {
            if h.is_none() {
                h = Some(self.vol.begin()?);
            }
            inode::write(self.vol, h.as_mut().expect("just begun"), ino, rec)?;
        }
        let left = h.as_ref().map_or(0, |h| h.reserved_left());
        if claims_taken {
            // Settle before the commit can fail: the claims must not leak.
            let meta = |n: u64| crate::ext4::reservation::worst_map_growth(self.vol.block_size(), rec, n);
            inode.pages.settle(written.iter().map(|w| w.0), left, &meta);
        }
        if let Some(e) = &failure {
            inode.pages.set_wb_error(e);
        }
        if let Some(h) = h {
            if let Err(e) = h.commit() {
                inode.pages.set_wb_error(&e);
                return Err(e);
            }
        }
        if map_changed {
            inode.reset_block_map();
        }
        if need_inode {
            inode.clear_dirty();
            st.inode_written = true;
        }
        let mut cleaned = 0;
        for (l, p) in &written {
            if inode.pages.mark_clean(*l, p) {
                cleaned += 1;
            }
        }
        self.pages.release_dirty(cleaned);
        st.pages = written.len();
        match failure {
            Some(e) => Err(e),
            None => Ok(st),
        }
    }
}

impl Fs {
    fn writer(&self) -> Writer<'_> {
        Writer {
            vol: &self.vol,
            pages: &self.pages,
        }
    }

    /// Write back inode `inode`: dirty pages, then the record as `level`
    /// requires. Does not flush the device (fsync does).
    pub fn writeback_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        self.writer().writeback_inode(inode, level)
    }

    /// [`Self::writeback_inode`] for a caller holding the `disk` write lock
    /// (`rec` is the guarded record).
    pub(crate) fn writeback_locked(
        &self,
        inode: &CachedInode,
        rec: &mut Inode,
        level: SyncLevel,
    ) -> Result<WritebackStats> {
        self.writer().writeback_locked(inode, rec, level)
    }

    /// Write back every dirty inode (sync(2), and memory pressure). Tries
    /// them all and reports the first failure.
    pub fn writeback_all(&self) -> Result<()> {
        let mut todo = self.icache.collect(|i| i.is_dirty());
        // Inode order, not hash-map order: the same sequence of calls then
        // allocates the same blocks (reproducible images, `mkfs -d`).
        todo.sort_by_key(|i| i.ino);
        let mut first = None;
        for i in todo {
            if let Err(e) = self.writeback_inode(&i, SyncLevel::All) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// fsync (`data_only: false`) or fdatasync (`true`) of one inode:
    /// write back its dirty pages, its record as the level requires, the
    /// committed metadata, then flush the device cache.
    pub fn fsync_inode(&self, inode: &CachedInode, data_only: bool) -> Result<WritebackStats> {
        let level = if data_only { SyncLevel::Data } else { SyncLevel::All };
        let st = match self.writeback_inode(inode, level) {
            Ok(st) => st,
            Err(e) => {
                // Reported now: not again at the next fsync or FLUSH.
                inode.pages.take_wb_error();
                return Err(e);
            }
        };
        // Whether the device still needs a flush for the data: a commit
        // ends with one (after its commit block), which covers the data
        // written before it too.
        let mut flushed = false;
        match self.vol.jbd().is_journaled() {
            // With a journal: commit the running transaction, which holds
            // the inode's metadata if anything of it changed (and whatever
            // else is running: jbd2's fsync does the same). Concurrent
            // fsyncs share one commit (`commit_upto`). Its cost is what
            // the transaction holds, not the file's size (seed 003); an
            // fdatasync of an overwrite that changed only timestamps finds
            // nothing running and commits nothing.
            // Always through the commit path, even with nothing running:
            // the inode's last change may sit in a transaction another
            // thread is committing right now, and returning before that
            // commit ends would promise what the disk does not hold yet.
            // `commit_running` waits for it (the log lock), and an empty
            // transaction costs just the flush the data needs anyway.
            true => {
                self.vol.commit_running()?;
                flushed = true;
            }
            // Without one the inode's metadata (its record, its map, its
            // directory entry and the bitmaps) is only durable once written
            // home; writing all dirty metadata is bounded by the
            // checkpoint budget, not by the file's size.
            false => self.vol.checkpoint()?,
        }
        if !self.vol.read_only() && !flushed {
            self.vol
                .disk()
                .device()
                .flush()
                .map_err(|e| Error::io("flushing the device", e))?;
        }
        // A background write-back of this file that failed since the last
        // report (memory pressure, the periodic flush): the data it held
        // may be lost, and this fsync is where the writer learns it
        // (`file_check_and_advance_wb_err`).
        if let Some(e) = inode.pages.take_wb_error() {
            return Err(e);
        }
        Ok(st)
    }

    /// Called by writers after dirtying pages: over the dirty budget, write
    /// back this inode, then (if still over) every other dirty inode.
    /// Caller holds no inode lock.
    pub(crate) fn balance_dirty(&self, inode: &CachedInode) -> Result<()> {
        if !self.pages.dirty_over() {
            return Ok(());
        }
        self.writeback_inode(inode, SyncLevel::All)?;
        if self.pages.dirty_over() {
            self.writeback_all()?;
        }
        Ok(())
    }
}

/// The background worker's periodic pass (the kernel's flusher threads
/// with `dirty_expire_centisecs`): write back every inode whose oldest
/// dirty page has waited `expire` or longer, and every inode whose record
/// alone is dirty, so that the commit that follows makes them durable.
/// This is what makes "everything older than the commit interval
/// survives" true of file data as well as of metadata — and what `sync(1)`
/// and `syncfs(2)` rely on through a FUSE mount, where they never reach the
/// server (README, "Crashes and what survives them"). A failure is kept on
/// the inode for its next fsync (and printed: nobody else may ever ask).
pub(crate) fn write_back_expired(vol: &Volume, icache: &Icache, pages: &PageBudget, expire: std::time::Duration) {
    let mut todo = icache.collect(|i| match i.pages.dirty_since() {
        Some(t) => t.elapsed() >= expire,
        None => i.is_dirty(),
    });
    todo.sort_by_key(|i| i.ino);
    let w = Writer { vol, pages };
    for i in todo {
        if let Err(e) = w.writeback_inode(&i, SyncLevel::All) {
            eprintln!("ext4kit: background write-back of inode {} failed: {e}", i.ino);
        }
    }
}

/// Consecutive runs `(start, len)` of sorted block numbers, each at most
/// [`MAX_RUN`] long.
fn runs(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in sorted {
        match out.last_mut() {
            Some((s, n)) if *s + *n == b && *n < MAX_RUN => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_group_consecutive_blocks() {
        assert_eq!(super::runs(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        let long: Vec<u64> = (0..super::MAX_RUN + 5).collect();
        assert_eq!(super::runs(&long), vec![(0, super::MAX_RUN), (super::MAX_RUN, 5)]);
        assert!(super::runs(&[]).is_empty());
    }
}
