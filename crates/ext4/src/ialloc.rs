//! Inode allocation (the kernel's `ialloc.c`).
//!
//! Placement: a file goes in its parent's group when that group has a free
//! inode; a directory goes to the group, from the parent's on, with the
//! most free inodes among those with at least the average free blocks (an
//! Orlov-like spread, so directory trees do not pile into group 0).
//!
//! No inode is handed out before the owner scan (`owner_scan.rs`) has run,
//! nor from an inode-table block another inode's map names (the bad-blocks
//! inode's list, or a file whose map points into the table): writing the
//! new record there would change what that inode holds.
//!
//! Locking: the group lock (descriptor write lock) is held from reading the
//! inode bitmap to writing the descriptor; nothing filesystem-wide is held.

use std::sync::atomic::{AtomicU32, Ordering};

use ext4kit_format::extent::{ExtentHeader, EXTENT_MAGIC};
use ext4kit_format::features::incompat;
use ext4kit_format::group_desc::{GroupDesc, BG_INODE_UNINIT};
use ext4kit_format::inode::{flags, FileType, Inode, InodeBase, InodeExtra, TimeField, Timestamp};

use crate::bitmap::{clear_bit, find_zero, set_bit, test_bit};
use crate::error::{Errno, Error, Result};
use crate::group::BITMAP_INODE_CORRUPT;
use crate::inode;
use crate::owner_scan;
use crate::transaction::Handle;
use crate::volume::Volume;

/// Generation numbers for new inodes (distinguishes reuses of a number).
static GENERATION: AtomicU32 = AtomicU32::new(0x5eed_0001);

/// Who creates an inode and how.
#[derive(Debug, Clone, Copy)]
pub struct NewInode {
    /// Type.
    pub ftype: FileType,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Creation time for all four timestamps.
    pub now: Timestamp,
    /// The parent directory's `i_flags` and `i_projid`: what a new inode
    /// inherits ([`inherited_flags`]).
    pub parent: (u32, u32),
}

#[cfg(test)]
impl NewInode {
    /// A root-owned 0644 regular file at time 0 in a directory without
    /// flags: what tests that only need some file allocate.
    pub(crate) fn plain_file() -> NewInode {
        NewInode {
            ftype: FileType::Regular,
            perm: 0o644,
            uid: 0,
            gid: 0,
            now: Timestamp::default(),
            parent: (0, 0),
        }
    }
}

/// `EXT4_FL_INHERITED`: the flags a new inode takes from its directory
/// (`__ext4_new_inode`): secure/undelete deletion, compression hints,
/// sync, nodump, noatime, data journaling, notail, dirsync, project
/// inheritance and DAX. (Casefold is inherited too, but a casefolded
/// image is not opened.)
const FL_INHERITED: u32 = flags::SECRM
    | flags::UNRM
    | flags::COMPR
    | flags::SYNC
    | flags::NODUMP
    | flags::NOATIME
    | 0x400 // EXT4_NOCOMPR_FL
    | flags::JOURNAL_DATA
    | flags::NOTAIL
    | flags::DIRSYNC
    | flags::PROJINHERIT
    | 0x0200_0000; // EXT4_DAX_FL

/// The inherited flags of a new inode of type `ftype` in a directory with
/// `parent_flags` (`ext4_mask_flags`): directories keep them all, regular
/// files lose the directory-only ones (EXT4_REG_FLMASK), everything else
/// keeps only nodump and noatime (EXT4_OTHER_FLMASK).
pub fn inherited_flags(ftype: FileType, parent_flags: u32) -> u32 {
    let f = parent_flags & FL_INHERITED;
    match ftype {
        FileType::Directory => f,
        FileType::Regular => f & !(flags::DIRSYNC | flags::TOPDIR | flags::CASEFOLD | flags::PROJINHERIT),
        _ => f & (flags::NODUMP | flags::NOATIME),
    }
}

/// A fresh in-memory inode record of this filesystem's size for `n`
/// (what `__ext4_new_inode` fills in): mode, owner, links, a new
/// generation, the flags and project id inherited from the parent, an
/// empty extent root where extents are used, all four times `n.now`.
pub fn new_record(vol: &Volume, n: &NewInode) -> Inode {
    let mut base = InodeBase::parse_raw(&[0u8; 128]);
    base.mode = n.ftype.mode_bits() | (n.perm & 0o7777);
    base.set_uid(n.uid);
    base.set_gid(n.gid);
    base.links_count = if n.ftype == FileType::Directory { 2 } else { 1 };
    base.generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    base.flags = inherited_flags(n.ftype, n.parent.0);
    let extents =
        vol.geo().has_incompat(incompat::EXTENTS) && matches!(n.ftype, FileType::Regular | FileType::Directory);
    if extents {
        base.flags |= flags::EXTENTS;
        let h = ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: 0,
            max: 4,
            depth: 0,
            generation: 0,
        };
        h.serialize_into(&mut base.block);
    }
    let tail_len = vol.geo().inode_size() - 128;
    let mut extra = InodeExtra::parse_raw(&[0u8; 32]);
    if tail_len >= 32 {
        // s_want_extra_isize is 32 on every mke2fs 1.47 image.
        extra.extra_isize = 32;
        // A project's directory hands its id down (ext4_new_inode:
        // i_projid from a PROJINHERIT parent, else the default 0).
        if n.parent.0 & flags::PROJINHERIT != 0 {
            extra.projid = n.parent.1;
        }
    }
    let mut inode = Inode {
        base,
        extra,
        tail: ext4kit_format::inode::InodeTail::from_elem(0, tail_len),
    };
    for f in [TimeField::Atime, TimeField::Mtime, TimeField::Ctime, TimeField::Crtime] {
        inode.set_time(f, n.now);
    }
    inode
}

/// Allocate the number of a new inode of type `ftype` in directory
/// `parent` (the allocation half of the kernel's `__ext4_new_inode`): a
/// file near its parent, a directory spread over the groups (see the
/// module doc). The caller writes the record ([`new_record`]). Public:
/// the vfs layer creates inodes (create, mkdir, symlink, O_TMPFILE).
pub fn new_inode(vol: &Volume, h: &mut Handle<'_>, parent: u32, ftype: FileType) -> Result<u32> {
    // The owner scan runs before the first allocation, and before any
    // group lock is taken: it reads the descriptors.
    owner_scan::sets(vol)?;
    let dir = ftype == FileType::Directory;
    let ngroups = vol.groups().len();
    let parent_group = ((parent.max(1) - 1) / vol.geo().inodes_per_group()) as usize % ngroups;
    if dir {
        for g in dir_group_order(vol, parent_group) {
            if let Some(ino) = alloc_in_group(vol, h, g, dir)? {
                return Ok(ino);
            }
        }
        return Err(no_free_inodes(vol));
    }
    // A file goes in its parent's group when there is room (the kernel's
    // find_group_other), else in the group the last such overflow went
    // to, searching on from there. Starting each search at the parent's
    // group again made a create in a directory whose neighbourhood is
    // full visit every full group first: ~1 µs per create by 1,000,000
    // files in one directory.
    if let Some(ino) = alloc_in_group(vol, h, parent_group, false)? {
        return Ok(ino);
    }
    let hint = vol.groups().inode_overflow().load(Ordering::Relaxed) as usize;
    for k in 0..ngroups {
        let g = (hint + k) % ngroups;
        // Full groups are skipped under the shared lock.
        if g == parent_group || vol.groups()[g].desc().read().free_inodes_count() == 0 {
            continue;
        }
        if let Some(ino) = alloc_in_group(vol, h, g, false)? {
            vol.groups().inode_overflow().store(g as u32, Ordering::Relaxed);
            return Ok(ino);
        }
    }
    Err(no_free_inodes(vol))
}

/// ENOSPC — or, when groups were skipped for a damaged inode bitmap, the
/// damage, which is what hides the free inodes; or, when the only free
/// inodes left lie in cross-linked inode-table blocks, that.
fn no_free_inodes(vol: &Volume) -> Error {
    let bad: Vec<usize> = (0..vol.groups().len())
        .filter(|&g| vol.groups()[g].bitmap_state().load(Ordering::Relaxed) & BITMAP_INODE_CORRUPT != 0)
        .collect();
    if bad.is_empty() {
        let counted_free = vol.groups().iter().any(|g| g.desc().read().free_inodes_count() > 0);
        if counted_free && vol.owner_map().get().is_some_and(|c| c.any_itable_named()) {
            return Error::corrupt_msg(
                "inode tables",
                "inode table",
                "no usable free inodes: the free ones left lie in inode-table blocks that the bad-blocks inode \
                 lists or another inode's block map names",
            );
        }
        return Error::posix(Errno::ENOSPC, "no free inodes left on the filesystem");
    }
    Error::corrupt_msg(
        format!("inode bitmaps of groups {bad:?}"),
        "inode bitmap",
        "no usable free inodes: the other groups are full and these disagree with their descriptors' free counts",
    )
}

fn dir_group_order(vol: &Volume, start: usize) -> Vec<usize> {
    let n = vol.groups().len();
    let stats: Vec<(u32, u32)> = vol
        .groups()
        .iter()
        .map(|g| {
            let d = g.desc().read();
            (d.free_inodes_count(), d.free_blocks_count())
        })
        .collect();
    let avg_blocks = stats.iter().map(|s| s.1 as u64).sum::<u64>() / n as u64;
    let mut order: Vec<usize> = (0..n).map(|k| (start + k) % n).collect();
    // Groups with enough free blocks first, most free inodes first.
    order.sort_by_key(|&g| (stats[g].1 as u64) < avg_blocks);
    let split = order
        .iter()
        .position(|&g| (stats[g].1 as u64) < avg_blocks)
        .unwrap_or(n);
    order[..split].sort_by_key(|&g| std::cmp::Reverse(stats[g].0));
    order
}

/// The indices of group `g`'s inodes whose records lie in inode-table
/// blocks another inode's map names (the owner scan's `itable`): left out
/// of the search as if in use. Empty on a healthy filesystem.
fn cross_linked_slots(vol: &Volume, g: usize) -> Vec<usize> {
    let Some(c) = vol.owner_map().get() else {
        return Vec::new();
    };
    let ipg = vol.geo().inodes_per_group() as usize;
    let per_block = (vol.block_size() / vol.geo().inode_size()).max(1);
    let table = vol.groups()[g].inode_table();
    c.itable_named_in(table, ipg.div_ceil(per_block) as u64)
        .into_iter()
        .flat_map(|b| {
            let s = (b - table) as usize * per_block;
            s..(s + per_block).min(ipg)
        })
        .collect()
}

fn alloc_in_group(vol: &Volume, h: &mut Handle<'_>, g: usize, dir: bool) -> Result<Option<u32>> {
    let grp = &vol.groups()[g];
    let mut gd = grp.desc().write();
    if gd.free_inodes_count() == 0 {
        return Ok(None);
    }
    let ipg = vol.geo().inodes_per_group() as usize;
    let csum_groups = vol.geo().has_group_desc_csum();
    let uninit = csum_groups && gd.flags & BG_INODE_UNINIT != 0;
    let bm_blk = gd.inode_bitmap();
    let first = if g == 0 {
        vol.sb().read().first_ino() as usize - 1
    } else {
        0
    };
    let mut new = *gd;
    let full = || {
        Error::corrupt_msg(
            format!("group {g}"),
            "group descriptor",
            format!("{} free inodes counted but the bitmap is full", gd.free_inodes_count()),
        )
    };
    // Take the first free bit, and note whether the new inode is alone in
    // its inode-table block (see `fresh_itable_block`).
    let hint = if uninit {
        first
    } else {
        (grp.inode_hint().load(Ordering::Relaxed) as usize).max(first)
    };
    let per_block = (vol.block_size() / vol.geo().inode_size()).max(1);
    let avoid = cross_linked_slots(vol, g);
    let pick = |bitmap: &[u8]| -> Option<usize> {
        let find = |b: &[u8]| find_zero(b, hint, ipg).or_else(|| find_zero(b, first, hint));
        if avoid.is_empty() {
            return find(bitmap);
        }
        let mut view = bitmap.to_vec();
        for &k in &avoid {
            set_bit(&mut view, k);
        }
        find(&view)
    };
    let take = |bitmap: &mut [u8], new: &mut GroupDesc| -> Result<(usize, bool)> {
        let i = pick(bitmap).ok_or_else(full)?;
        set_bit(bitmap, i);
        vol.groups().set_inode_bitmap_csum(new, bitmap);
        let start = i / per_block * per_block;
        let alone = (start..(start + per_block).min(ipg)).all(|k| k == i || !test_bit(bitmap, k));
        Ok((i, alone))
    };
    if !uninit {
        let bm = vol.buffer(bm_blk)?;
        if !vol.groups().inode_bitmap_usable(g, &gd, &bm.data, vol.geo()) {
            return Ok(None);
        }
        // The bit we are about to take must not belong to a live inode (a
        // bitmap that lies about inode 11 would hand out lost+found): look
        // at the record unless it lies past the table's high-water mark,
        // which the group's own accounting says was never used (and which
        // a create storm reaches without reading the table).
        let cand = pick(&bm.data);
        if cand.is_none() && !avoid.is_empty() {
            // Its only free inodes are in table blocks other inodes name
            // (see `no_free_inodes`).
            return Ok(None);
        }
        if let Some(i) = cand {
            let past_mark = csum_groups && i >= ipg - (gd.itable_unused() as usize).min(ipg);
            if !past_mark {
                let ino = (g * ipg + i + 1) as u32;
                if let Some(why) = live_record(vol, ino)? {
                    grp.bitmap_state().fetch_or(BITMAP_INODE_CORRUPT, Ordering::Relaxed);
                    return Err(Error::corrupt_msg(
                        format!("inode {ino}"),
                        "inode bitmap",
                        format!("marked free in group {g}'s bitmap (block {bm_blk}) but its record is in use ({why})"),
                    ));
                }
            }
        }
    }
    let (i, alone) = if uninit {
        // An uninitialised bitmap: no inode used; bits past the group's
        // inodes are padding and must read as set.
        let mut b = uninit_inode_bitmap(vol);
        if pick(&b).is_none() {
            return Ok(None);
        }
        let r = take(&mut b, &mut new)?;
        h.overwrite(bm_blk, b.into_boxed_slice())?;
        r
    } else {
        // In place: the bitmap's draft is only ever read by allocators,
        // under this group lock (see `buffer.rs`).
        h.modify(bm_blk, |b| take(b, &mut new))?
    };
    if alone {
        fresh_itable_block(vol, h, g, i)?;
    }
    let free = gd.free_inodes_count() - 1;
    new.set_free_inodes_count(free);
    if dir {
        let u = new.used_dirs_count() + 1;
        new.set_used_dirs_count(u);
    }
    // The table past the old high-water mark may hold garbage
    // (BG_INODE_ZEROED clear): the record we hand out is rewritten whole
    // by the caller.
    note_itable_used(&mut new, i, ipg, uninit);
    vol.write_group_desc(h, g, &new)?;
    *gd = new;
    // Bits below the old hint were set (the hint's rule), and the scan
    // passed set bits from there to `i`; or the rescan from `first` found
    // `i` first. Either way nothing below `i + 1` is free.
    grp.inode_hint().store(i as u32 + 1, Ordering::Relaxed);
    Ok(Some((g * ipg + i + 1) as u32))
}

/// The inode bitmap of a group whose inodes are not initialised: no inode
/// used; the bits past the group's inodes are padding and read as set.
fn uninit_inode_bitmap(vol: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; vol.block_size()];
    for k in vol.geo().inodes_per_group() as usize..vol.block_size() * 8 {
        set_bit(&mut b, k);
    }
    b
}

/// Why inode `ino`'s record is in use (a mode, links and no deletion time:
/// what e2fsck's pass 1 counts as in use), or `None`.
fn live_record(vol: &Volume, ino: u32) -> Result<Option<String>> {
    let (blk, off) = inode::location(vol, ino)?;
    let b = vol.buffer(blk)?;
    let r = b
        .data
        .get(off..off + 0x20)
        .ok_or_else(|| Error::corrupt_msg(format!("inode {ino}"), "inode table", "record past its block"))?;
    let mode = u16::from_le_bytes([r[0], r[1]]);
    let links = u16::from_le_bytes([r[0x1A], r[0x1B]]);
    let dtime = u32::from_le_bytes([r[0x14], r[0x15], r[0x16], r[0x17]]);
    Ok((mode != 0 && links > 0 && dtime == 0).then(|| format!("mode {mode:o}, {links} links")))
}

/// When every other inode in the new inode's table block is free, the
/// block's old contents do not matter: start it zeroed in the cache
/// instead of reading it, as the kernel's `__ext4_get_inode_loc` does for
/// a new inode. A create storm otherwise reads one inode-table block from
/// the device every 4096 / inode_size creates.
fn fresh_itable_block(vol: &Volume, h: &mut Handle<'_>, g: usize, i: usize) -> Result<()> {
    let (blk, _) = inode::location(vol, (g * vol.geo().inodes_per_group() as usize + i + 1) as u32)?;
    if vol.bcache().contains(blk) {
        return Ok(());
    }
    h.overwrite(blk, vec![0u8; vol.block_size()].into_boxed_slice())
}

/// Set inode `ino`'s bitmap bit to `used` whatever it was, moving the
/// group's free count (and, with `dir`, its directory count) only if the
/// bit changed; the inode-table high-water mark and the INODE_UNINIT flag
/// follow a newly used inode. Recovery's `ext2fs_mark_inode_bitmap2`: a
/// fast commit carries inode records but not the bitmap. Returns whether
/// the bit changed.
pub(crate) fn set_used(vol: &Volume, h: &mut Handle<'_>, ino: u32, used: bool, dir: bool) -> Result<bool> {
    if ino == 0 || ino > vol.geo().inodes_count() {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "inode number",
            format!("outside 1..={}", vol.geo().inodes_count()),
        ));
    }
    let ipg = vol.geo().inodes_per_group() as usize;
    let g = ((ino - 1) / vol.geo().inodes_per_group()) as usize;
    let i = ((ino - 1) % vol.geo().inodes_per_group()) as usize;
    let grp = &vol.groups()[g];
    let mut gd = grp.desc().write();
    let uninit = vol.geo().has_group_desc_csum() && gd.flags & BG_INODE_UNINIT != 0;
    let bm_blk = gd.inode_bitmap();
    let mut bitmap = if uninit {
        uninit_inode_bitmap(vol)
    } else {
        vol.buffer(bm_blk)?.data.to_vec()
    };
    if test_bit(&bitmap, i) == used {
        return Ok(false);
    }
    let mut new = *gd;
    let free = gd.free_inodes_count();
    let free = if used {
        set_bit(&mut bitmap, i);
        free.saturating_sub(1)
    } else {
        clear_bit(&mut bitmap, i);
        free + 1
    };
    new.set_free_inodes_count(free);
    if dir {
        let u = if used {
            new.used_dirs_count() + 1
        } else {
            new.used_dirs_count().saturating_sub(1)
        };
        new.set_used_dirs_count(u);
    }
    if used {
        note_itable_used(&mut new, i, ipg, uninit);
    }
    vol.groups().set_inode_bitmap_csum(&mut new, &bitmap);
    h.overwrite(bm_blk, bitmap.into_boxed_slice())?;
    vol.write_group_desc(h, g, &new)?;
    *gd = new;
    if !used {
        grp.inode_hint().fetch_min(i as u32, Ordering::Relaxed);
    }
    Ok(true)
}

/// Return inode `ino` (record `rec`) to its group's free pool (the
/// kernel's `ext4_free_inode`). The caller has already released the
/// inode's blocks and xattr block and written its record with
/// `i_links_count` 0 and `i_dtime` set (e2fsck expects a deleted inode to
/// carry a deletion time). A directory lowers the group's
/// used-directories count. Public: the vfs layer frees an inode at its
/// last unlink or close, and undoes a create that failed half-way.
pub fn free_inode(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &Inode) -> Result<()> {
    if ino < vol.sb().read().first_ino() || ino > vol.geo().inodes_count() {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("inode {ino} is reserved or out of range and cannot be freed"),
        ));
    }
    let dir = rec.file_type() == Some(FileType::Directory);
    let ipg = vol.geo().inodes_per_group();
    let g = ((ino - 1) / ipg) as usize;
    let i = ((ino - 1) % ipg) as usize;
    let grp = &vol.groups()[g];
    let mut gd = grp.desc().write();
    let bm_blk = gd.inode_bitmap();
    let mut bitmap = vol.buffer(bm_blk)?.data.to_vec();
    if !test_bit(&bitmap, i) {
        // The bitmap lied about a live inode; it is right now. Nothing to
        // clear or count (the kernel's ext4_free_inode: "bit already
        // cleared for inode", and it carries on). The group stays suspect
        // for the allocator until e2fsck.
        grp.bitmap_state().fetch_or(BITMAP_INODE_CORRUPT, Ordering::Relaxed);
        return Ok(());
    }
    clear_bit(&mut bitmap, i);
    let mut new = *gd;
    vol.groups().set_inode_bitmap_csum(&mut new, &bitmap);
    h.overwrite(bm_blk, bitmap.into_boxed_slice())?;
    let free = gd.free_inodes_count() + 1;
    new.set_free_inodes_count(free);
    if dir {
        let u = new.used_dirs_count().saturating_sub(1);
        new.set_used_dirs_count(u);
    }
    vol.write_group_desc(h, g, &new)?;
    *gd = new;
    grp.inode_hint().fetch_min(i as u32, Ordering::Relaxed);
    Ok(())
}

/// Group `gd`'s inode `i` (of `ipg`) is now in use: the group's inodes are
/// initialised (INODE_UNINIT cleared) and the table's high-water mark
/// (`bg_itable_unused`, all `ipg` when `uninit`) lies past it.
///
/// Whatever the features: e2fsck's pass 2 checks every name against its
/// inode's group flag and `bg_itable_unused` without asking for
/// gdt_csum/metadata_csum (`check_dir_block`: PR_2_INOREF_BG_INO_UNINIT,
/// PR_2_INOREF_IN_UNUSED), so a descriptor that carries lazy-init fields
/// without the feature (e2fsck's "Group descriptor N marked uninitialized
/// without feature set", PR_0_GDT_UNINIT, left unrepaired) must not keep
/// a new inode in its "unused" area. The kernel ignores both fields there;
/// on a healthy ext2/ext3 image they are zero and nothing changes.
fn note_itable_used(gd: &mut GroupDesc, i: usize, ipg: usize, uninit: bool) {
    gd.flags &= !BG_INODE_UNINIT;
    let unused = if uninit { ipg } else { gd.itable_unused() as usize };
    if i >= ipg.saturating_sub(unused) {
        gd.set_itable_unused((ipg - i - 1) as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::scratch_volume as volume;

    /// The scan hint (`Group::inode_hint`) must not change which inode is
    /// handed out: always the lowest free one of the group, as the kernel's
    /// find_inode_bit gives, also after frees below and above the hint.
    #[test]
    fn the_lowest_free_inode_of_the_group_is_taken_whatever_the_hint() {
        let v = volume();
        let mut h = v.begin().unwrap();
        let new = |h: &mut Handle<'_>| new_inode(&v, h, 2, FileType::Regular).unwrap();
        let file = new_record(&v, &NewInode::plain_file());
        let a: Vec<u32> = (0..200).map(|_| new(&mut h)).collect();
        assert!(
            a.windows(2).all(|w| w[1] == w[0] + 1),
            "a fresh group fills in order: {a:?}"
        );
        for &i in [a[150], a[3], a[70]].iter() {
            free_inode(&v, &mut h, i, &file).unwrap();
        }
        for want in [a[3], a[70], a[150], a[199] + 1] {
            assert_eq!(new(&mut h), want);
        }
        // A hint that claims too much (as if a free had bypassed it) costs
        // a rescan, never a "bitmap full" error or a skipped inode.
        free_inode(&v, &mut h, a[10], &file).unwrap();
        v.groups()[0].inode_hint().store(a[199], Ordering::Relaxed);
        let g0_inodes = v.geo().inodes_per_group();
        while v.groups()[0].desc().read().free_inodes_count() > 1 {
            assert!(new(&mut h) <= g0_inodes);
        }
        assert_eq!(new(&mut h), a[10]);
        h.commit().unwrap();
    }
}
