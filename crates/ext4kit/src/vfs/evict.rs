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
use super::super_block::SuperBlock;
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

/// After a link count went down: if it reached zero, free the inode now
/// (nobody has it open) or put it on the orphan list (freed at the last
/// close). Writes `rec` through `h` in every case but `Alive`.
pub(crate) fn drop_link(
    sb: &SuperBlock,
    h: &mut crate::ext4::transaction::Handle<'_>,
    inode: &CachedInode,
    rec: &mut Inode,
    t: Timestamp,
) -> Result<Death> {
    if rec.base.links_count > 0 {
        inode::write(sb.vol(), h, inode.ino, rec)?;
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
    if inode.opens.load(Ordering::SeqCst) > 0 || sb.holds().is_held(inode.ino) {
        orphan::add(sb.vol(), h, inode.ino, rec)?;
        return Ok(Death::Orphaned);
    }
    discard_pages(sb, inode);
    destroy(sb, h, inode.ino, rec, t)?;
    // Dead in memory (the record on disk keeps its mode): a late
    // releaser or holder must not free or use it again.
    rec.base.mode = 0;
    Ok(Death::Freed)
}

/// Drop every cached page of a dying inode, dirty ones included (their
/// data has nowhere to go), with the page budget's accounting, and stop
/// readers from trusting the old block map.
fn discard_pages(sb: &SuperBlock, inode: &CachedInode) {
    inode.pages.bump();
    let (pages, dirty) = inode.pages.remove_range(0, u64::MAX, sb.pages());
    sb.pages().release(pages);
    sb.pages().release_dirty(dirty);
    inode.clear_dirty();
    inode.size.store(0, Ordering::Release);
    inode.reset_block_map();
}

/// Free everything inode `ino` owns and the inode itself (`ext4_evict_inode`):
/// data and map blocks, the xattr block, then the record (links 0,
/// `i_dtime` set, as e2fsck expects of a deleted inode) and its bitmap bit.
pub(crate) fn destroy(
    sb: &SuperBlock,
    h: &mut crate::ext4::transaction::Handle<'_>,
    ino: u32,
    rec: &mut Inode,
    t: Timestamp,
) -> Result<()> {
    if matches!(
        bmap::load(sb.vol(), ino, rec)?,
        BlockMap::Extents(_) | BlockMap::Indirect(_)
    ) {
        bmap_write::punch(sb.vol(), h, ino, rec, 0..u64::MAX)?;
    }
    xattr_write::drop_block(sb.vol(), h, ino, rec)?;
    rec.base.links_count = 0;
    rec.base.set_size(0);
    rec.base.dtime = t.sec as u32;
    inode::write(sb.vol(), h, ino, rec)?;
    ialloc::free_inode(sb.vol(), h, ino, rec)
}

/// The work of [`Fs::release_unlinked`](crate::Fs::release_unlinked).
pub(crate) fn release_unlinked(sb: &SuperBlock, inode: &CachedInode) -> Result<()> {
    super::shared::note(2);
    let _freeing = sb.releasing().enter();
    let mut rec = inode.disk.write();
    if rec.base.links_count != 0 || rec.base.mode == 0 {
        return Ok(());
    }
    // Idle pins give their units back first (`vfs::pin`); then the
    // count is of open files and holds only.
    super::pin::revoke_idle(inode);
    if inode.opens.load(Ordering::SeqCst) != 0 || sb.holds().is_held(inode.ino) {
        return Ok(());
    }
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let mut new = rec.clone();
    discard_pages(sb, inode);
    orphan::remove(sb.vol(), &mut h, inode.ino, &mut new)?;
    destroy(sb, &mut h, inode.ino, &mut new, t)?;
    h.commit()?;
    sb.vol().sync_super()?;
    new.base.mode = 0; // dead: a late releaser must not free it twice
    *rec = new;
    drop(rec);
    sb.icache().forget_if(inode);
    Ok(())
}

/// The work of [`Fs::close_file`](crate::Fs::close_file).
pub(crate) fn close_file(sb: &SuperBlock, file: Arc<super::File>) -> Result<()> {
    // The pin's own count (its thread's line), not the inode's.
    let pin = file.inode.pin().clone();
    drop(file);
    after_pin_dropped(sb, pin)
}

/// Close an open that never became a file (an open that failed its
/// checks, or whose dentry went stale): as [`Fs::close_file`].
pub(crate) fn close_open(sb: &SuperBlock, open: super::pin::OpenRef) -> Result<()> {
    let pin = open.pin().clone();
    drop(open);
    after_pin_dropped(sb, pin)
}

/// After an open on `pin` was dropped: `pin` is the caller's own
/// reference, which ends the pin when nothing else (its thread's cache,
/// another open) holds it.
fn after_pin_dropped(sb: &SuperBlock, pin: Arc<super::pin::Pin>) -> Result<()> {
    if Arc::strong_count(&pin) == 1 {
        // The pin left its thread's cache and this close ends it: its
        // unit of `opens` goes back (a shared write, off the common path).
        let inode = pin.inode().clone();
        super::shared::note(2);
        drop(pin);
        return after_close(sb, &inode);
    }
    after_close(sb, pin.inode())
}

/// After a close or a dropped hold: free the inode if that was the
/// last user of an unlinked one. Reads two shared words, writes
/// nothing unless the inode is unlinked (see `vfs::pin` for why the
/// flag is read after the open was dropped).
fn after_close(sb: &SuperBlock, inode: &CachedInode) -> Result<()> {
    if inode.unlinked.load(Ordering::SeqCst) || inode.opens.load(Ordering::Acquire) == 0 {
        release_unlinked(sb, inode)?;
    }
    Ok(())
}

/// The work of [`Fs::hold_inode`](crate::Fs::hold_inode).
pub(crate) fn hold_inode(sb: &SuperBlock, inode: &CachedInode) -> Result<()> {
    // `unlinked` is set on every dead in-memory inode (`drop_link`
    // sets it before freeing): such a copy goes the slow way and is
    // refused there, even if its number has a new, held owner.
    if !inode.unlinked.load(Ordering::Acquire) && sb.holds().add_if_held(inode.ino) {
        return Ok(());
    }
    let rec = inode.disk.read();
    if rec.base.mode == 0 {
        return Err(Error::posix(Errno::ENOENT, format!("inode {} was freed", inode.ino)));
    }
    sb.holds().add(inode.ino);
    Ok(())
}

/// The work of [`Fs::drop_hold`](crate::Fs::drop_hold).
pub(crate) fn drop_hold(sb: &SuperBlock, inode: &CachedInode) -> Result<()> {
    drop_holds(sb, inode.ino, 1)
}

/// The work of [`Fs::drop_holds`](crate::Fs::drop_holds).
pub(crate) fn drop_holds(sb: &SuperBlock, ino: u32, n: u64) -> Result<()> {
    // A FORGET of an inode already unlinked may free it: counted from
    // before the hold count goes down, so a `statfs` that comes after
    // this FORGET waits for the free. Only those: every other FORGET
    // leaves the one shared counter alone (the flag is read in place in
    // the inode cache: no shared write). It is read again after the count
    // went down (`after_last_hold`); an unlink that sets it meanwhile
    // still frees the inode there, only without the `statfs` wait.
    let _freeing = sb.icache().is_unlinked(ino).then(|| sb.releasing().enter());
    if !sb.holds().sub(ino, n) {
        return Ok(());
    }
    after_last_hold(sb, ino)
}

/// The work of [`Fs::drop_all_holds`](crate::Fs::drop_all_holds).
pub(crate) fn drop_all_holds(sb: &SuperBlock) -> Result<()> {
    let mut first = None;
    for ino in sb.holds().drain() {
        if let Err(e) = after_last_hold(sb, ino) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// The last hold of `ino` went: free it if it is an unlinked inode
/// nothing else uses. The flag is read after the hold count's mutex
/// section, so a `drop_link` that saw the hold (and orphaned the
/// inode) is seen here (`vfs::holds`, n → 0). An unlinked inode is
/// never evicted (`Icache::evict`), so not cached means linked (or
/// freed already): nothing to do, and nothing read from disk.
fn after_last_hold(sb: &SuperBlock, ino: u32) -> Result<()> {
    match sb.icache().cached(ino) {
        Some(inode) if inode.unlinked.load(Ordering::SeqCst) => release_unlinked(sb, &inode),
        _ => Ok(()),
    }
}

/// The work of [`Fs::recover_orphans`](crate::Fs::recover_orphans).
pub(crate) fn recover_orphans(sb: &SuperBlock) -> Result<usize> {
    if sb.vol().read_only() {
        return Ok(0);
    }
    let chain = orphan::chain(sb.vol())?;
    let slots = orphan::file_slots(sb.vol())?;
    let present = sb.vol().sb().read().feature_ro_compat & ro_compat::ORPHAN_PRESENT != 0;
    if chain.is_empty() && slots.is_empty() && !present {
        return Ok(0);
    }
    let t = sb.now();
    let mut h = sb.vol().begin()?;
    let mut freed = 0;
    let mut seen = std::collections::HashSet::new();
    for ino in chain.iter().copied().chain(slots.iter().map(|s| s.ino)) {
        if !seen.insert(ino) {
            continue;
        }
        let mut rec = inode::read(sb.vol(), ino)?;
        rec.base.dtime = 0;
        if rec.base.links_count == 0 {
            destroy(sb, &mut h, ino, &mut rec, t)?;
            freed += 1;
        } else {
            // A truncate that did not finish: free what lies past the
            // size (ext4_truncate).
            let keep = rec.size().div_ceil(sb.vol().block_size() as u64);
            if matches!(
                rec.file_type(),
                Some(FileType::Regular | FileType::Directory | FileType::Symlink)
            ) && matches!(
                bmap::load(sb.vol(), ino, &rec)?,
                BlockMap::Extents(_) | BlockMap::Indirect(_)
            ) {
                bmap_write::punch(sb.vol(), &mut h, ino, &mut rec, keep..u64::MAX)?;
            }
            inode::write(sb.vol(), &mut h, ino, &rec)?;
        }
    }
    if !slots.is_empty() {
        orphan::clear_file_slots(sb.vol(), &mut h, &slots)?;
    }
    h.commit()?;
    {
        let mut s = sb.vol().sb().write();
        s.last_orphan = 0;
        s.feature_ro_compat &= !ro_compat::ORPHAN_PRESENT;
    }
    sb.vol().sync_super()?;
    Ok(freed)
}
