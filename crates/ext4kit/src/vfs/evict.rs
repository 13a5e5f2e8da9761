//! The end of an inode's life, as the kernel's `iput_final` → `evict` →
//! `ext4_evict_inode` and the orphan list run it: at its last link an
//! inode nobody uses is freed at once; one still open (or held by a
//! frontend) goes on the orphan list and is freed at its last close or
//! dropped hold; what a crash left on the orphan list is finished at the
//! next read-write open (`ext4_orphan_cleanup`).
//!
//! Who decides, and the ordering that makes "exactly one of them frees
//! it" true: `drop_link` (under the inode's writer lock: flag, revoke the
//! idle pins, then count opens and holds) against a close
//! (`vfs::pin`: drop the open, then read the flag) and a dropped hold
//! (`vfs::holds`: n → 0 under the shard mutex, then read the flag).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ext4kit_format::features::ro_compat;
use ext4kit_format::inode::{FileType, Inode, Timestamp};

use super::icache::CachedInode;
use super::Fs;
use crate::error::{Errno, Error, Result};
use crate::ext4::{bmap, bmap_write, ialloc, inode, orphan, xattr_write, BlockMap};

/// What became of an inode whose link count dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Death {
    /// Still has names.
    Alive,
    /// No names, still open: on the orphan list.
    Orphaned,
    /// Freed.
    Freed,
}

impl Fs {
    /// After a link count went down: if it reached zero, free the inode now
    /// (nobody has it open) or put it on the orphan list (freed at the last
    /// close). Writes `rec` through `h` in every case but `Alive`.
    pub(super) fn drop_link(
        &self,
        h: &mut crate::ext4::transaction::Handle<'_>,
        inode: &CachedInode,
        rec: &mut Inode,
        t: Timestamp,
    ) -> Result<Death> {
        if rec.base.links_count > 0 {
            inode::write(&self.vol, h, inode.ino, rec)?;
            return Ok(Death::Alive);
        }
        // Flag first, then revoke the idle pins, then count: a close that
        // drops the last open after the revocation looked at its pin sees
        // the flag (`vfs::pin`) and frees the inode itself.
        inode.unlinked.store(true, Ordering::SeqCst);
        super::pin::revoke_idle(inode);
        // Open files and frontend holds keep it: on the orphan list until
        // the last close or dropped hold (`vfs::holds` for why reading the
        // count here, under the inode's writer lock, after the flag, is
        // enough).
        if inode.opens.load(Ordering::SeqCst) > 0 || self.holds.is_held(inode.ino) {
            orphan::add(&self.vol, h, inode.ino, rec)?;
            return Ok(Death::Orphaned);
        }
        self.discard_pages(inode);
        self.destroy(h, inode.ino, rec, t)?;
        // Dead in memory (the record on disk keeps its mode): a late
        // releaser or holder must not free or use it again.
        rec.base.mode = 0;
        Ok(Death::Freed)
    }

    /// Drop every cached page of a dying inode, dirty ones included (their
    /// data has nowhere to go), with the page budget's accounting, and stop
    /// readers from trusting the old block map.
    fn discard_pages(&self, inode: &CachedInode) {
        inode.pages.bump();
        let (pages, dirty) = inode.pages.remove_range(0, u64::MAX, &self.pages);
        self.pages.release(pages);
        self.pages.release_dirty(dirty);
        inode.clear_dirty();
        inode.size.store(0, Ordering::Release);
        inode.reset_block_map();
    }

    /// Free everything inode `ino` owns and the inode itself (`ext4_evict_inode`):
    /// data and map blocks, the xattr block, then the record (links 0,
    /// `i_dtime` set, as e2fsck expects of a deleted inode) and its bitmap bit.
    pub(super) fn destroy(
        &self,
        h: &mut crate::ext4::transaction::Handle<'_>,
        ino: u32,
        rec: &mut Inode,
        t: Timestamp,
    ) -> Result<()> {
        if matches!(
            bmap::load(&self.vol, ino, rec)?,
            BlockMap::Extents(_) | BlockMap::Indirect(_)
        ) {
            bmap_write::punch(&self.vol, h, ino, rec, 0..u64::MAX)?;
        }
        xattr_write::drop_block(&self.vol, h, ino, rec)?;
        rec.base.links_count = 0;
        rec.base.set_size(0);
        rec.base.dtime = t.sec as u32;
        inode::write(&self.vol, h, ino, rec)?;
        ialloc::free_inode(&self.vol, h, ino, rec)
    }

    /// The last close of inode `inode`: if it has no name left, it leaves
    /// the orphan list and is freed.
    pub fn release_unlinked(&self, inode: &CachedInode) -> Result<()> {
        super::shared::note(2);
        let mut rec = inode.disk.write();
        if rec.base.links_count != 0 || rec.base.mode == 0 {
            return Ok(());
        }
        // Idle pins give their units back first (`vfs::pin`); then the
        // count is of open files and holds only.
        super::pin::revoke_idle(inode);
        if inode.opens.load(Ordering::SeqCst) != 0 || self.holds.is_held(inode.ino) {
            return Ok(());
        }
        let t = self.now();
        let mut h = self.vol.begin()?;
        let mut new = rec.clone();
        self.discard_pages(inode);
        orphan::remove(&self.vol, &mut h, inode.ino, &mut new)?;
        self.destroy(&mut h, inode.ino, &mut new, t)?;
        h.commit()?;
        self.vol.sync_super()?;
        new.base.mode = 0; // dead: a late releaser must not free it twice
        *rec = new;
        drop(rec);
        self.icache.forget_if(inode);
        Ok(())
    }

    /// Close an open file: drop this reference, and if it was the last open
    /// of an inode that has no name left, free the inode (the last close of
    /// an unlinked file). Frontends call this instead of just dropping the
    /// `Arc<File>`; a file dropped without it stays on the orphan list until
    /// the next open of the image frees it.
    pub fn close_file(&self, file: Arc<super::File>) -> Result<()> {
        // The pin's own count (its thread's line), not the inode's.
        let pin = file.inode.pin().clone();
        drop(file);
        self.after_pin_dropped(pin)
    }

    /// Close an open that never became a file (an open that failed its
    /// checks, or whose dentry went stale): as [`Fs::close_file`].
    pub(crate) fn close_open(&self, open: super::pin::OpenRef) -> Result<()> {
        let pin = open.pin().clone();
        drop(open);
        self.after_pin_dropped(pin)
    }

    /// After an open on `pin` was dropped: `pin` is the caller's own
    /// reference, which ends the pin when nothing else (its thread's cache,
    /// another open) holds it.
    fn after_pin_dropped(&self, pin: Arc<super::pin::Pin>) -> Result<()> {
        if Arc::strong_count(&pin) == 1 {
            // The pin left its thread's cache and this close ends it: its
            // unit of `opens` goes back (a shared write, off the common path).
            let inode = pin.inode().clone();
            super::shared::note(2);
            drop(pin);
            return self.after_close(&inode);
        }
        self.after_close(pin.inode())
    }

    /// After a close or a dropped hold: free the inode if that was the
    /// last user of an unlinked one. Reads two shared words, writes
    /// nothing unless the inode is unlinked (see `vfs::pin` for why the
    /// flag is read after the open was dropped).
    fn after_close(&self, inode: &CachedInode) -> Result<()> {
        if inode.unlinked.load(Ordering::SeqCst) || inode.opens.load(Ordering::Acquire) == 0 {
            self.release_unlinked(inode)?;
        }
        Ok(())
    }

    /// Keep `inode` allocated as an open file does, for a frontend that
    /// hands its number out and may be asked about it after its last name
    /// is gone. FUSE's lookup count is that: until FORGET the kernel may
    /// send requests for the node id, and were the inode freed and its
    /// number reused, they would reach another file (the kernel, seeing the
    /// id come back with a new generation, marks its inode bad: EIO,
    /// ESTALE, a missed ETXTBSY). Unlinked while held, it waits on the
    /// orphan list like an open file. Pair with [`Fs::drop_hold`] or
    /// [`Fs::drop_holds`].
    ///
    /// A hold is a count by inode number (`vfs::holds`), not a reference:
    /// a held inode that is clean, linked and not open may leave the inode
    /// cache, and its hold stays exact.
    ///
    /// ENOENT when the inode was freed meanwhile (a lookup that found the
    /// name just before an unlink freed it): the first hold is taken under
    /// the inode's lock, where `drop_link` decides between freeing and the
    /// orphan list, so either the unlink sees the hold or the hold sees the
    /// inode dead. Further holds on a held number take no inode lock (a
    /// held number cannot be freed; see `vfs::holds`).
    pub fn hold_inode(&self, inode: &CachedInode) -> Result<()> {
        // `unlinked` is set on every dead in-memory inode (`drop_link`
        // sets it before freeing): such a copy goes the slow way and is
        // refused there, even if its number has a new, held owner.
        if !inode.unlinked.load(Ordering::Acquire) && self.holds.add_if_held(inode.ino) {
            return Ok(());
        }
        let rec = inode.disk.read();
        if rec.base.mode == 0 {
            return Err(Error::posix(Errno::ENOENT, format!("inode {} was freed", inode.ino)));
        }
        self.holds.add(inode.ino);
        Ok(())
    }

    /// Undo one [`Fs::hold_inode`]; the last hold or close of an inode that
    /// has no name left frees it.
    pub fn drop_hold(&self, inode: &CachedInode) -> Result<()> {
        self.drop_holds(inode.ino, 1)
    }

    /// Undo `n` [`Fs::hold_inode`]s of inode number `ino` (FUSE's
    /// `FORGET(ino, n)`; more than it has drops them all). The last hold
    /// of an inode that has no name left and is not open frees it.
    pub fn drop_holds(&self, ino: u32, n: u64) -> Result<()> {
        if !self.holds.sub(ino, n) {
            return Ok(());
        }
        self.after_last_hold(ino)
    }

    /// Drop every hold (a frontend's session ended: the kernel sends no
    /// FORGET for what it still had), freeing the unlinked inodes they
    /// kept. Tries them all and reports the first failure.
    pub fn drop_all_holds(&self) -> Result<()> {
        let mut first = None;
        for ino in self.holds.drain() {
            if let Err(e) = self.after_last_hold(ino) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The frontend holds of inode numbers (read-only view: counts, size).
    pub fn holds(&self) -> &Arc<super::holds::Holds> {
        &self.holds
    }

    /// The last hold of `ino` went: free it if it is an unlinked inode
    /// nothing else uses. The flag is read after the hold count's mutex
    /// section, so a `drop_link` that saw the hold (and orphaned the
    /// inode) is seen here (`vfs::holds`, n → 0). An unlinked inode is
    /// never evicted (`Icache::evict`), so not cached means linked (or
    /// freed already): nothing to do, and nothing read from disk.
    fn after_last_hold(&self, ino: u32) -> Result<()> {
        match self.icache.cached(ino) {
            Some(inode) if inode.unlinked.load(Ordering::SeqCst) => self.release_unlinked(&inode),
            _ => Ok(()),
        }
    }

    /// Finish what the orphan list says was left half done, as the kernel
    /// does at mount (`ext4_orphan_cleanup`) and e2fsck does
    /// (`release_orphan_inodes`): an orphan with no links left (unlinked
    /// while open) is freed; one that still has links was being truncated
    /// and loses its blocks past `i_size`. Both the classic chain
    /// (`s_last_orphan`) and the orphan file (`orphan_file`) are read; both
    /// are empty afterwards. Returns how many inodes were freed.
    pub fn recover_orphans(&self) -> Result<usize> {
        if self.vol.read_only() {
            return Ok(0);
        }
        let chain = orphan::chain(&self.vol)?;
        let slots = orphan::file_slots(&self.vol)?;
        let present = self.vol.sb().read().feature_ro_compat & ro_compat::ORPHAN_PRESENT != 0;
        if chain.is_empty() && slots.is_empty() && !present {
            return Ok(0);
        }
        let t = self.now();
        let mut h = self.vol.begin()?;
        let mut freed = 0;
        let mut seen = std::collections::HashSet::new();
        for ino in chain.iter().copied().chain(slots.iter().map(|s| s.ino)) {
            if !seen.insert(ino) {
                continue;
            }
            let mut rec = inode::read(&self.vol, ino)?;
            rec.base.dtime = 0;
            if rec.base.links_count == 0 {
                self.destroy(&mut h, ino, &mut rec, t)?;
                freed += 1;
            } else {
                // A truncate that did not finish: free what lies past the
                // size (ext4_truncate).
                let keep = rec.size().div_ceil(self.vol.block_size() as u64);
                if matches!(
                    rec.file_type(),
                    Some(FileType::Regular | FileType::Directory | FileType::Symlink)
                ) && matches!(
                    bmap::load(&self.vol, ino, &rec)?,
                    BlockMap::Extents(_) | BlockMap::Indirect(_)
                ) {
                    bmap_write::punch(&self.vol, &mut h, ino, &mut rec, keep..u64::MAX)?;
                }
                inode::write(&self.vol, &mut h, ino, &rec)?;
            }
        }
        if !slots.is_empty() {
            orphan::clear_file_slots(&self.vol, &mut h, &slots)?;
        }
        h.commit()?;
        {
            let mut sb = self.vol.sb().write();
            sb.last_orphan = 0;
            sb.feature_ro_compat &= !ro_compat::ORPHAN_PRESENT;
        }
        self.vol.sync_super()?;
        Ok(freed)
    }
}
