//! Writeback: turning an inode's dirty pages (and dirty record) into disk
//! writes — the kernel's `ext4_writepages` + `ext4_sync_file`.
//!
//! For one inode, under its `disk` write lock (the `i_rwsem` analogue; a
//! writer cannot re-dirty a page while we run, and the record we write is
//! the one the pages belong to), one pass (`Pass`, the kernel's
//! `struct mpage_da_data`) runs these phases:
//!
//! 1. **collect** the dirty set — exactly the dirty blocks, in logical
//!    order, so the cost is O(dirty) however many clean pages are cached
//!    ("fsync costs O(dirty)") — grouped into runs of consecutive blocks
//!    capped at [`MAX_RUN`] to bound the staging buffer, and each run's
//!    cached pages (`Pass::collect_pages`, as
//!    `mpage_prepare_extent_to_map` gathers them);
//! 2. **map** each run extent by extent (`Pass::map_extent`, the kernel's
//!    `mpage_map_one_extent` → `ext4_map_blocks`): written blocks are
//!    overwritten in place, holes and unwritten extents go through
//!    `map_blocks` — delayed allocation: the blocks are chosen only now,
//!    so a run of dirty pages becomes one contiguous allocation;
//! 3. **write** each extent's data with one device write
//!    (`Pass::submit_extent`), then convert the unwritten extents it
//!    covered (`Pass::convert_unwritten`, `ext4_convert_unwritten_extents`);
//! 4. **journal the metadata**: write the inode record (size, block map)
//!    if the map changed or the caller's level asks for it
//!    (`Pass::write_inode`), settle the space claims
//!    (`Pass::settle_claims`), and commit the handle — data reaches the
//!    device before the metadata that points at it (ordered mode);
//! 5. **complete**: mark clean only the pages whose contents were written
//!    and are still the cached ones (`Pass::complete`).
//!
//! Space: the blocks step 2 allocates were claimed when the writes were
//! accepted (`pagecache`'s reservations, `ext4::reservation`). The inode's
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
use crate::ext4::bmap_write::{self, MapRequest, MappedRun};
use crate::ext4::transaction::Handle;
use crate::ext4::{inode, BlockMap, Mapping, Volume};

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
    /// Write back inode `inode` (the kernel's `writeback_single_inode`):
    /// take its `disk` write lock, then [`Self::writeback_locked`]. Does
    /// not flush the device (fsync does).
    pub fn writeback_single_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        // ext4_should_retry_alloc: with a journal, blocks freed by the
        // running transaction are reused only once it commits.
        match self.writeback_single_inode_once(inode, level) {
            Err(e) if e.errno() == Errno::ENOSPC && self.vol.has_busy_blocks() => {
                self.vol.commit_running()?;
                self.writeback_single_inode_once(inode, level)
            }
            r => r,
        }
    }

    /// One attempt of [`Self::writeback_single_inode`].
    fn writeback_single_inode_once(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        if !inode.is_dirty() {
            return Ok(WritebackStats::default());
        }
        let mut rec = inode.disk.write();
        self.writeback_locked(inode, &mut rec, level)
    }

    /// Write back inode `inode` for a caller holding its `disk` write lock
    /// (`rec` is the guarded record): the phases of the module doc, the
    /// way `ext4_writepages` runs them.
    pub(crate) fn writeback_locked(
        &self,
        inode: &CachedInode,
        rec: &mut Inode,
        level: SyncLevel,
    ) -> Result<WritebackStats> {
        let dirty = inode.pages.dirty_blocks();
        let mut pass = Pass::new(self, inode, rec, dirty.len());
        let failure = if dirty.is_empty() {
            None
        } else {
            let map = inode.block_map_locked(self.vol, pass.rec)?;
            pass.write_dirty(&map, &dirty).err()
        };
        pass.finish(level, failure)
    }
}

/// One writeback pass over one inode, under its `disk` write lock: the
/// state `ext4_writepages` keeps in `struct mpage_da_data`.
struct Pass<'a> {
    vol: &'a Volume,
    pages: &'a PageBudget,
    inode: &'a CachedInode,
    rec: &'a mut Inode,
    /// The handle, opened at the first allocation (or for the record).
    h: Option<Handle<'a>>,
    /// Whether the inode's claims were handed to `h` (see the module doc).
    claims_taken: bool,
    /// Whether the block map changed (allocations, conversions).
    map_changed: bool,
    /// The pages written, with the version written.
    written: Vec<(u64, Arc<Page>)>,
    /// Device writes issued for data.
    data_writes: usize,
}

impl<'a> Pass<'a> {
    fn new(w: &Writer<'a>, inode: &'a CachedInode, rec: &'a mut Inode, dirty: usize) -> Self {
        Pass {
            vol: w.vol,
            pages: w.pages,
            inode,
            rec,
            h: None,
            claims_taken: false,
            map_changed: false,
            written: Vec::with_capacity(dirty),
            data_writes: 0,
        }
    }

    /// Steps 1–3 for every dirty block (`dirty`: sorted): each run of
    /// consecutive blocks is collected, mapped and written. The first
    /// failure ends the pass.
    fn write_dirty(&mut self, map: &BlockMap, dirty: &[u64]) -> Result<()> {
        for (start, len) in runs(dirty) {
            let pages = self.collect_pages(start, len)?;
            self.write_run(map, start, &pages)?;
        }
        Ok(())
    }

    /// The cached pages of blocks `start..start + len` (the collecting half
    /// of `mpage_prepare_extent_to_map`). A dirty block always has one.
    fn collect_pages(&self, start: u64, len: u64) -> Result<Vec<Arc<Page>>> {
        let mut pages = Vec::with_capacity(len as usize);
        for l in start..start + len {
            match self.inode.pages.get(l) {
                Some(p) => pages.push(p),
                None => {
                    return Err(Error::corrupt_msg(
                        format!("inode {}", self.inode.ino),
                        "page cache",
                        format!("dirty block {l} has no cached page"),
                    ))
                }
            }
        }
        Ok(pages)
    }

    /// Map and write one run of dirty pages, `pages[0]` being block
    /// `start` (`mpage_map_and_submit_extent`): extent by extent, as the
    /// block map and the allocator cut it.
    fn write_run(&mut self, map: &BlockMap, start: u64, pages: &[Arc<Page>]) -> Result<()> {
        let end = start + pages.len() as u64;
        let mut l = start;
        while l < end {
            let mut extents = self.map_extent(map, l, end)?.into_iter();
            while let Some(ext) = extents.next() {
                let first = (ext.lblk - start) as usize;
                let chunk = &pages[first..first + ext.len as usize];
                self.submit_extent(&ext, chunk, &mut extents)?;
                self.convert_unwritten(&ext)?;
                for (k, p) in chunk.iter().enumerate() {
                    self.written.push((ext.lblk + k as u64, p.clone()));
                }
                l = ext.lblk + ext.len;
            }
        }
        Ok(())
    }

    /// Where blocks `l..end` go (`mpage_map_one_extent` → `ext4_map_blocks`):
    /// written blocks are overwritten in place; holes and unwritten
    /// extents are allocated now — delayed allocation, so a run of dirty
    /// pages becomes one contiguous allocation where the allocator can.
    fn map_extent(&mut self, map: &BlockMap, l: u64, end: u64) -> Result<Vec<MappedRun>> {
        match map.map(self.vol, l)? {
            Mapping::Mapped {
                pblk,
                len: n,
                uninit: false,
            } => Ok(vec![MappedRun {
                lblk: l,
                pblk,
                len: n.min(end - l),
                uninit: false,
                new: false,
            }]),
            Mapping::Mapped { len: n, .. } | Mapping::Hole { len: n } => {
                let n = n.min(end - l);
                self.begin_alloc()?;
                let h = self.h.as_mut().expect("begun by begin_alloc");
                let req = MapRequest {
                    lblk: l,
                    len: n,
                    uninit: false,
                };
                let extents = bmap_write::map_blocks(self.vol, h, self.inode.ino, self.rec, req)?;
                self.map_changed = true;
                Ok(extents)
            }
        }
    }

    /// Make ready the handle allocations go through: begun at the first
    /// one, when the inode's claims are handed to it, so the allocator
    /// draws from them (settled in [`Self::settle_claims`]).
    fn begin_alloc(&mut self) -> Result<()> {
        if self.h.is_none() {
            self.h = Some(self.vol.begin()?);
        }
        if !self.claims_taken {
            self.claims_taken = true;
            let h = self.h.as_mut().expect("just begun");
            h.add_reserved(self.inode.pages.take_claims());
        }
        Ok(())
    }

    /// Write one extent's pages with one device write. If the write fails,
    /// the blocks this pass allocated for it and for the rest of its
    /// mapping (`rest`) leave the map again: committed, the map would show
    /// whatever they held before. The pages stay dirty (and delayed) for a
    /// later try.
    fn submit_extent(
        &mut self,
        ext: &MappedRun,
        chunk: &[Arc<Page>],
        rest: &mut impl Iterator<Item = MappedRun>,
    ) -> Result<()> {
        let ino = self.inode.ino;
        let mut buf = Vec::with_capacity(chunk.len() * self.vol.block_size());
        for p in chunk {
            buf.extend_from_slice(&p.data);
        }
        if let Err(e) = self.vol.disk().write_raw(ext.pblk, &buf) {
            let e = crate::ext4::error::annotate(e, &format!("data of inode {ino}"));
            let unmap: Vec<(u64, u64)> = std::iter::once((ext.lblk, ext.len, ext.new))
                .chain(rest.map(|r| (r.lblk, r.len, r.new)))
                .filter(|r| r.2)
                .map(|r| (r.0, r.1))
                .collect();
            if let Some(h) = self.h.as_mut() {
                for (ul, un) in unmap {
                    if let Err(e2) = bmap_write::punch(self.vol, h, ino, self.rec, ul..ul + un) {
                        eprintln!(
                            "ext4kit: inode {ino}: unmapping blocks {ul}..{} after a failed data write: {e2}",
                            ul + un
                        );
                        break;
                    }
                }
            }
            return Err(e);
        }
        self.data_writes += 1;
        Ok(())
    }

    /// An unwritten extent whose data is now on the device becomes a
    /// written one (`ext4_convert_unwritten_extents`, at I/O completion).
    fn convert_unwritten(&mut self, ext: &MappedRun) -> Result<()> {
        if !ext.uninit {
            return Ok(());
        }
        let h = self.h.as_mut().expect("uninit extents come from map_blocks");
        bmap_write::mark_written(self.vol, h, self.inode.ino, self.rec, ext.lblk..ext.lblk + ext.len)?;
        self.map_changed = true;
        Ok(())
    }

    /// Steps 4–5, run even after a failure: allocations already installed
    /// in the handle's blocks must reach the disk together with the map
    /// that owns them. Returns `failure` if there was one.
    fn finish(mut self, level: SyncLevel, failure: Option<Error>) -> Result<WritebackStats> {
        let inode_written = self.write_inode(level)?;
        self.settle_claims();
        if let Some(e) = &failure {
            self.inode.pages.set_wb_error(e);
        }
        if let Some(h) = self.h.take() {
            if let Err(e) = h.commit() {
                self.inode.pages.set_wb_error(&e);
                return Err(e);
            }
        }
        if self.map_changed {
            self.inode.reset_block_map();
        }
        if inode_written {
            self.inode.clear_dirty();
        }
        let st = WritebackStats {
            pages: self.written.len(),
            data_writes: self.data_writes,
            inode_written,
        };
        self.complete();
        match failure {
            Some(e) => Err(e),
            None => Ok(st),
        }
    }

    /// Write the inode record through the handle when the map changed (the
    /// size and block map `mpage_map_and_submit_extent` journals with
    /// `ext4_mark_inode_dirty`) or the caller's level asks for it (fsync's
    /// `ext4_write_inode`). Returns whether it was written.
    fn write_inode(&mut self, level: SyncLevel) -> Result<bool> {
        if self.map_changed {
            self.inode.mark_dirty(DIRTY_DATA);
        }
        let need_inode = match level {
            SyncLevel::All => self.inode.dirty_level() != 0,
            SyncLevel::Data => self.inode.dirty_level() & DIRTY_DATA != 0,
        };
        if need_inode {
            if self.h.is_none() {
                self.h = Some(self.vol.begin()?);
            }
            let h = self.h.as_mut().expect("just begun");
            inode::write(self.vol, h, self.inode.ino, self.rec)?;
        }
        Ok(need_inode)
    }

    /// Settle the claims before the commit can fail, so they never leak
    /// (`ext4_da_update_reserve_space`): the pages now on disk leave the
    /// delayed set, and what the handle did not use is kept for the pages
    /// still delayed or given back.
    fn settle_claims(&self) {
        if !self.claims_taken {
            return;
        }
        let left = self.h.as_ref().map_or(0, |h| h.reserved_left());
        let rec: &Inode = self.rec;
        let meta = |n: u64| crate::ext4::reservation::worst_map_growth(self.vol.block_size(), rec, n);
        self.inode.pages.settle(self.written.iter().map(|w| w.0), left, &meta);
    }

    /// Mark clean the pages whose written version is still the cached one
    /// (a page replaced meanwhile stays dirty), and give their dirty budget
    /// back (`ext4_finish_bio` → `end_page_writeback`).
    fn complete(self) {
        let mut cleaned = 0;
        for (l, p) in &self.written {
            if self.inode.pages.mark_clean(*l, p) {
                cleaned += 1;
            }
        }
        self.pages.release_dirty(cleaned);
    }
}

impl Fs {
    /// What writeback needs of this filesystem.
    pub(super) fn writer(&self) -> Writer<'_> {
        Writer {
            vol: &self.vol,
            pages: &self.pages,
        }
    }

    /// Write back inode `inode`: dirty pages, then the record as `level`
    /// requires. Does not flush the device (fsync does).
    pub fn writeback_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        self.writer().writeback_single_inode(inode, level)
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
            // the transaction holds, not the file's size (fsync costs
            // O(dirty)); an
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
        if let Err(e) = w.writeback_single_inode(&i, SyncLevel::All) {
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
