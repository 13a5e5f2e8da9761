//! Block allocation (the kernel's `balloc.c` / a first `mballoc.c`):
//! goal-directed, one group at a time under that group's lock, so
//! sequential writers get contiguous runs and allocations in different
//! groups never contend.
//!
//! A group flagged BLOCK_UNINIT has no bitmap on disk yet; its contents are
//! implied by the layout ([`crate::group::GroupTable::implied_block_bitmap`])
//! and are written out the first time the group is allocated from,
//! clearing the flag.
//!
//! Nothing is handed out or freed before the owner scan (`owner_scan.rs`)
//! has found the blocks live inodes name: a bitmap that lies about one
//! would hand it to a second owner, a map that names another's block
//! would free it from under that owner.

use std::sync::atomic::Ordering;

use ext4kit_format::group_desc::{GroupDesc, BG_BLOCK_UNINIT};

use crate::bitmap::{clear_bit, find_zero, set_bit, test_bit};
use crate::error::{Errno, Error, Result};
use crate::group::{BITMAP_BLOCK_CHECKED, BITMAP_BLOCK_CORRUPT};
use crate::owner_scan;
use crate::reservation::Reserver;
use crate::transaction::Handle;
use crate::volume::Volume;

/// What an allocation asks for (the kernel's `ext4_allocation_request`).
#[derive(Debug, Clone, Copy)]
pub struct BlockRequest {
    /// Where to look first: the goal's group from the goal on, then the
    /// following groups, wrapping around.
    pub goal: u64,
    /// Contiguous blocks wanted; fewer may be given (at least one).
    pub len: u32,
    /// Whose free space: [`Reserver::User`] never takes the root reserve
    /// (`s_r_blocks_count`), [`Reserver::Privileged`] may (the kernel's
    /// `EXT4_MB_USE_RESERVED`).
    pub who: Reserver,
}

impl BlockRequest {
    /// Up to `len` blocks near `goal`, outside the root reserve.
    pub fn near(goal: u64, len: u32) -> Self {
        BlockRequest {
            goal,
            len,
            who: Reserver::User,
        }
    }
}

/// Allocate up to `req.len` contiguous blocks, preferring `req.goal`;
/// returns the first block and how many were allocated (at least one).
///
/// A [`Reserver::User`] request never takes the last `s_r_blocks_count`
/// free blocks (the root reserve), the way the kernel's
/// `ext4_has_free_clusters` treats a caller without CAP_SYS_RESOURCE — nor
/// blocks that buffered writes have reserved for data not yet written
/// back (`reservation.rs`). Blocks the handle was given from such
/// reservations ([`Handle::add_reserved`], writeback) are drawn first and
/// need no check: they were counted when the write was accepted. Map and
/// directory blocks of other operations ask as users whoever the caller
/// is (this layer has no caller identity), so root making a directory
/// does not dip into the reserve — stricter than the kernel, never
/// looser. Paths that must succeed where root would (freeing, which may
/// split an extent) ask as [`Reserver::Privileged`].
///
/// The check and the bitmap change are not one atomic step, so the grant
/// is reserved first (`ext4_claim_free_clusters`) and released once the
/// group's free count has dropped: concurrent allocations and buffered
/// writes never promise the same block twice.
///
/// Public: tests of the layers above allocate and free blocks directly.
pub fn new_blocks(vol: &Volume, h: &mut Handle<'_>, req: BlockRequest) -> Result<(u64, u32)> {
    // Nothing is handed out before the owner scan has found the blocks
    // live inodes name though the bitmap says free. Taken here, before
    // any group lock: the scan reads descriptors.
    owner_scan::sets(vol)?;
    let want = req.len.max(1) as u64;
    // Writeback of accepted data may take the reserve for what its
    // reservations did not cover (see `Handle::writes_back_delayed`).
    let who = if h.writes_back_delayed() {
        Reserver::Privileged
    } else {
        req.who
    };
    let drawn = h.draw_reserved(want);
    let mut reserved = 0;
    if drawn < want {
        match vol.reservations().reserve_up_to(want - drawn, who) {
            Ok(k) => reserved = k,
            Err(e) if drawn == 0 => return Err(e),
            Err(_) => {}
        }
    }
    let grant = (drawn + reserved) as u32;
    let r = alloc_granted(vol, h, req.goal, grant);
    let used = r.as_ref().map_or(0, |&(_, n)| n as u64);
    let from_drawn = used.min(drawn);
    // What the handle drew and did not use stays its own; the
    // reservations used are now allocated blocks (the free count dropped
    // already), and an ordinary allocation's unused reservation is not
    // needed any more.
    h.return_reserved(drawn - from_drawn);
    vol.reservations().release(from_drawn + reserved);
    r
}

/// Find `grant` blocks (or fewer, contiguous) near `goal`: the groups from
/// the goal's onward, wrapping around.
fn alloc_granted(vol: &Volume, h: &mut Handle<'_>, goal: u64, grant: u32) -> Result<(u64, u32)> {
    let geo = vol.geo();
    let ngroups = vol.groups().len();
    let goal = goal.clamp(geo.first_data_block(), geo.blocks_count() - 1);
    let g0 = geo.group_of_block(goal);
    for k in 0..ngroups {
        let g = (g0 + k) % ngroups;
        let from = if k == 0 {
            goal - geo.group_first_block(g as u64)
        } else {
            0
        };
        if let Some(r) = alloc_in_group(vol, h, g, from as usize, grant.max(1))? {
            return Ok(r);
        }
    }
    // Space a damaged bitmap hides is not "no space": say which.
    let bad: Vec<usize> = (0..ngroups)
        .filter(|&g| vol.groups()[g].bitmap_state().load(Ordering::Relaxed) & BITMAP_BLOCK_CORRUPT != 0)
        .collect();
    if !bad.is_empty() {
        return Err(Error::corrupt_msg(
            format!("block bitmaps of groups {bad:?}"),
            "block bitmap",
            "no usable free blocks: the other groups are full and these disagree with their descriptors' free counts",
        ));
    }
    Err(Error::posix(Errno::ENOSPC, "no free blocks left on the filesystem"))
}

/// Check, before an operation changes anything, that block allocation
/// will not meet a damaged bitmap: some group with free blocks, from
/// `goal`'s on, has a bitmap that agrees with its descriptor. An operation
/// that allocates only after it has begun changing the filesystem
/// (mkdir's directory block, a symlink's block, a growing directory) is
/// refused here, while the image is as it was, instead of failing
/// half-way. Cheap once each group has been checked (one flag per group).
/// ENOSPC is left to the allocation itself. Public: the vfs layer checks
/// before a namespace change begins.
pub fn check_allocatable(vol: &Volume, goal: u64) -> Result<()> {
    // The first allocation of a session waits for the owner scan: run it
    // here, before the caller's handle begins.
    owner_scan::sets(vol)?;
    let geo = vol.geo();
    let n = vol.groups().len();
    let goal = goal.clamp(geo.first_data_block(), geo.blocks_count().saturating_sub(1));
    let g0 = geo.group_of_block(goal);
    let csum_groups = geo.has_group_desc_csum();
    let mut bad = Vec::new();
    for k in 0..n {
        let g = (g0 + k) % n;
        let gd = *vol.groups()[g].desc().read();
        if gd.free_blocks_count() == 0 {
            continue;
        }
        let st = vol.groups()[g].bitmap_state().load(Ordering::Relaxed);
        if st & BITMAP_BLOCK_CORRUPT != 0 {
            bad.push(g);
            continue;
        }
        if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
            if uninit_group_metadata_marked(vol, g)? {
                return Ok(());
            }
            bad.push(g);
            continue;
        }
        if st & BITMAP_BLOCK_CHECKED != 0 {
            return Ok(());
        }
        let bm = vol.buffer(gd.block_bitmap())?;
        if bitmap_usable(vol, g, &gd, &bm.data) {
            return Ok(());
        }
        bad.push(g);
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(Error::corrupt_msg(
        format!("block bitmaps of groups {bad:?}"),
        "block bitmap",
        "disagree with their descriptors' free counts (or mark metadata free); no block can be allocated safely",
    ))
}

/// [`crate::group::GroupTable::block_bitmap_usable`] with this volume's
/// geometry and system zone.
fn bitmap_usable(vol: &Volume, g: usize, gd: &GroupDesc, bm: &[u8]) -> bool {
    vol.groups()
        .block_bitmap_usable(g, gd, bm, vol.geo(), vol.system_zone())
}

/// Whether uninitialised group `g` may be initialised: every one of its
/// bitmaps and inode-table blocks that lies in another group (flex_bg) is
/// marked in that group's bitmap. While `g` is BLOCK_UNINIT, e2fsprogs
/// marks those blocks itself when it reads the bitmaps (`read_bitmaps` →
/// `ext2fs_reserve_super_and_bgd` and the group's own metadata); once the
/// flag is cleared only the home group's bitmap speaks for them, so a
/// home bitmap that lies about them (e2fsprogs' j_recover_csum2_* replay a
/// zeroed one) would show up as new "block bitmap differences". Such a
/// group is not allocated from. Reads only.
fn uninit_group_metadata_marked(vol: &Volume, g: usize) -> Result<bool> {
    let geo = vol.geo();
    let first = geo.group_first_block(g as u64);
    let end = first + geo.blocks_in_group(g);
    let (bb, ib, it) = vol.groups()[g].meta();
    let csum_groups = geo.has_group_desc_csum();
    for b in [bb, ib].into_iter().chain(it..it.saturating_add(geo.itable_blocks())) {
        if (first..end).contains(&b) || b < geo.first_data_block() || b >= geo.blocks_count() {
            continue;
        }
        let f = geo.group_of_block(b);
        let fd = *vol.groups()[f].desc().read();
        if csum_groups && fd.flags & BG_BLOCK_UNINIT != 0 {
            // Its implied bitmap marks every group's metadata in it.
            continue;
        }
        let bm = vol.buffer(fd.block_bitmap())?;
        if !test_bit(&bm.data, (b - geo.group_first_block(f as u64)) as usize) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Group `g`'s block bitmap (descriptor `gd`, read under the group lock)
/// as a copy to change, and whether it is the implied bitmap of an
/// uninitialised group (whose flag the change then clears).
fn read_bitmap(vol: &Volume, g: usize, gd: &GroupDesc) -> Result<(Vec<u8>, bool)> {
    if vol.geo().has_group_desc_csum() && gd.flags & BG_BLOCK_UNINIT != 0 {
        let bm = vol.groups().implied_block_bitmap(g, vol.geo(), &vol.sb().read())?;
        return Ok((bm, true));
    }
    Ok((vol.buffer(gd.block_bitmap())?.data.to_vec(), false))
}

fn alloc_in_group(vol: &Volume, h: &mut Handle<'_>, g: usize, from: usize, want: u32) -> Result<Option<(u64, u32)>> {
    let geo = vol.geo();
    let grp = &vol.groups()[g];
    // Checked before this group's lock: it reads other groups'
    // descriptors (no lock order between groups is needed).
    if geo.has_group_desc_csum()
        && grp.desc().read().flags & BG_BLOCK_UNINIT != 0
        && !uninit_group_metadata_marked(vol, g)?
    {
        return Ok(None);
    }
    let mut gd = grp.desc().write();
    if gd.free_blocks_count() == 0 {
        return Ok(None);
    }
    let (mut bm, uninit) = read_bitmap(vol, g, &gd)?;
    if !uninit && !bitmap_usable(vol, g, &gd, &bm) {
        return Ok(None);
    }
    let n = geo.blocks_in_group(g) as usize;
    let first = geo.group_first_block(g as u64);
    // Blocks freed by a transaction not yet committed look used (see
    // busy.rs): the allocator works on a copy of the bitmap with them
    // set, and sets only bits free in the real one.
    let mut view = bm.clone();
    if vol.jbd().is_journaled() {
        let runs = vol.busy().busy_in(vol.jbd(), first, first + n as u64);
        for (p, len) in &runs {
            for b in *p..*p + *len {
                set_bit(&mut view, (b - first) as usize);
            }
        }
        if !runs.is_empty() && find_zero(&view, 0, n).is_none() {
            return Ok(None);
        }
    }
    // Blocks a live inode names though the bitmap says free (the owner
    // scan's `unmarked`, built before the first allocation) are never
    // handed out.
    if let Some(c) = vol.owner_map().get() {
        if c.mask_unmarked(first, n, &mut view) && find_zero(&view, 0, n).is_none() {
            return Ok(None);
        }
    }
    // First free bit at or after the goal, else from the group start.
    let start = find_zero(&view, from.min(n), n).or_else(|| find_zero(&view, 0, n));
    let Some(start) = start else {
        return Err(Error::corrupt_msg(
            format!("group {g}"),
            "group descriptor",
            format!("{} free blocks counted but the bitmap is full", gd.free_blocks_count()),
        ));
    };
    let zone = vol.system_zone();
    if let Some((zs, zl, name)) = zone.hit(first + start as u64, first + start as u64 + 1) {
        // A free bit on a bitmap or inode table: the bitmap lies.
        grp.bitmap_state().fetch_or(BITMAP_BLOCK_CORRUPT, Ordering::Relaxed);
        return Err(Error::corrupt_msg(
            format!("block bitmap of group {g} (block {})", gd.block_bitmap()),
            "block bitmap",
            format!(
                "block {} is marked free but is {name} (blocks {zs}..{})",
                first + start as u64,
                zs + zl
            ),
        ));
    }
    let mut len = 0usize;
    while len < want as usize
        && start + len < n
        && !test_bit(&view, start + len)
        && (len == 0
            || zone
                .hit(first + (start + len) as u64, first + (start + len) as u64 + 1)
                .is_none())
    {
        set_bit(&mut bm, start + len);
        set_bit(&mut view, start + len);
        len += 1;
    }
    vol.busy().allocated(vol.jbd(), first + start as u64, len as u64);
    let mut new = *gd;
    if uninit {
        new.flags &= !BG_BLOCK_UNINIT;
    }
    let free = gd.free_blocks_count().checked_sub(len as u32).ok_or_else(|| {
        Error::corrupt_msg(
            format!("group {g}"),
            "group descriptor",
            "free block count below the bitmap's",
        )
    })?;
    new.set_free_blocks_count(free);
    vol.groups().set_block_bitmap_csum(&mut new, &bm);
    h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
    vol.write_group_desc(h, g, &new)?;
    *gd = new;
    vol.reservations().free_changed(-(len as i64));
    Ok(Some((first + start as u64, len as u32)))
}

/// Cut `runs` at group boundaries, checking that each piece lies inside
/// the filesystem (`what` says which run is refused when one does not)
/// and, with `zone`, outside the system zone; sorted.
fn group_pieces(vol: &Volume, runs: &[(u64, u64)], what: &str, zone: bool) -> Result<Vec<(u64, u64)>> {
    let geo = vol.geo();
    let mut pieces: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(mut p, mut n) in runs {
        while n > 0 {
            if p < geo.first_data_block() || p >= geo.blocks_count() {
                return Err(Error::corrupt_msg(format!("block {p}"), "block map", what.to_string()));
            }
            let g = geo.group_of_block(p) as u64;
            let k = n.min(geo.group_first_block(g) + geo.blocks_per_group() - p);
            if zone {
                if let Some((zs, zl, name)) = vol.system_zone().hit(p, p + k) {
                    // A map naming metadata: freeing it would hand a
                    // bitmap or inode table out as data.
                    return Err(Error::corrupt_msg(
                        format!("block {p}"),
                        "block map",
                        format!(
                            "freeing blocks {p}+{k}, which overlap {name} (blocks {zs}..{})",
                            zs + zl
                        ),
                    ));
                }
            }
            pieces.push((p, k));
            p += k;
            n -= k;
        }
    }
    pieces.sort_unstable();
    Ok(pieces)
}

/// The end of the run of `pieces` from `i` that lies in the same group as
/// `pieces[i]` (sorted pieces, each inside one group).
fn same_group_end(vol: &Volume, pieces: &[(u64, u64)], i: usize) -> usize {
    let g = vol.geo().group_of_block(pieces[i].0);
    let mut j = i;
    while j < pieces.len() && vol.geo().group_of_block(pieces[j].0) == g {
        j += 1;
    }
    j
}

/// Set the bitmap bits of `runs` to `used`, whatever each was, and move
/// each group's free count by the bits that changed (recovery's
/// `ext2fs_mark_block_bitmap_range2` / `unmark`): a fast commit names
/// extents but not the bitmap, which may already say what it should.
/// Blocks freed this way leave the buffer cache as in [`free_runs`].
/// Returns how many bits changed.
pub(crate) fn set_runs(vol: &Volume, h: &mut Handle<'_>, runs: &[(u64, u64)], used: bool) -> Result<u64> {
    let pieces = group_pieces(
        vol,
        runs,
        "a replayed extent names a block outside the filesystem",
        false,
    )?;
    if !used {
        forget_freed(vol, &pieces);
    }
    let mut changed = 0u64;
    let mut i = 0;
    while i < pieces.len() {
        let g = vol.geo().group_of_block(pieces[i].0);
        let j = same_group_end(vol, &pieces, i);
        let mut gd = vol.groups()[g].desc().write();
        let (mut bm, uninit) = read_bitmap(vol, g, &gd)?;
        let first = vol.geo().group_first_block(g as u64);
        let mut delta = 0i64;
        for &(s, n) in &pieces[i..j] {
            for b in s..s + n {
                let bit = (b - first) as usize;
                if test_bit(&bm, bit) != used {
                    if used {
                        set_bit(&mut bm, bit);
                        delta -= 1;
                    } else {
                        clear_bit(&mut bm, bit);
                        delta += 1;
                    }
                }
            }
        }
        if delta != 0 || uninit {
            let mut new = *gd;
            if uninit {
                new.flags &= !BG_BLOCK_UNINIT;
            }
            let free = (gd.free_blocks_count() as i64 + delta).clamp(0, vol.geo().blocks_in_group(g) as i64) as u32;
            new.set_free_blocks_count(free);
            vol.groups().set_block_bitmap_csum(&mut new, &bm);
            h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
            vol.write_group_desc(h, g, &new)?;
            vol.reservations()
                .free_changed(free as i64 - gd.free_blocks_count() as i64);
            *gd = new;
        }
        changed += delta.unsigned_abs();
        i = j;
    }
    Ok(changed)
}

/// Return many runs `(start, len)` to the free pool, changing each group's
/// bitmap once however many runs fall in it (a truncate of a fragmented
/// file frees thousands of runs). Runs may cross groups. Groups are
/// locked one at a time, in ascending order. Public, with [`free_blocks`],
/// for tests of the layers above.
pub fn free_runs(vol: &Volume, h: &mut Handle<'_>, runs: &[(u64, u64)]) -> Result<()> {
    let pieces = group_pieces(vol, runs, "freeing a block outside the filesystem", true)?;
    // No block another inode still names is freed (owner_scan.rs): all
    // runs are looked at before the first group changes.
    owner_scan::sets(vol)?.refuse_multi_in(&pieces)?;
    let mut i = 0;
    while i < pieces.len() {
        let g = vol.geo().group_of_block(pieces[i].0);
        let j = same_group_end(vol, &pieces, i);
        free_in_group(vol, h, g, &pieces[i..j])?;
        i = j;
    }
    vol.owner_map().freed(&pieces);
    Ok(())
}

/// Return `len` blocks from `start` to the free pool (they must lie in
/// one group).
pub fn free_blocks(vol: &Volume, h: &mut Handle<'_>, start: u64, len: u32) -> Result<()> {
    if start < vol.geo().first_data_block() {
        return Err(Error::corrupt_msg(
            format!("block {start}"),
            "block map",
            "before the first data block",
        ));
    }
    let g = vol.geo().group_of_block(start);
    let run = [(start, len as u64)];
    owner_scan::sets(vol)?.refuse_multi_in(&run)?;
    free_in_group(vol, h, g, &run)?;
    vol.owner_map().freed(&run);
    Ok(())
}

/// Drop freed blocks from the buffer cache, and make sure no checkpoint
/// writes their old contents (the kernel's `ext4_forget` / `bforget`): a
/// freed block may be allocated again at once — as file data written
/// straight to the device — and a late write of the stale extent node,
/// indirect block, directory or xattr block would destroy it. Taking the
/// checkpoint's I/O lock waits out a checkpoint that may be writing one of
/// them right now; once forgotten, a checkpoint finds no dirty version and
/// skips the block. Most freed blocks are file data that was never
/// cached: a miss per block.
fn forget_freed(vol: &Volume, runs: &[(u64, u64)]) {
    // Revoke what the log holds of them, and keep them from reuse until
    // the freeing transaction commits (busy.rs).
    vol.jbd().forget(runs);
    vol.busy().freed(vol.jbd(), runs);
    let _io = vol.jbd().hold_checkpoint();
    for &(p, n) in runs {
        for blk in p..p + n {
            if vol.bcache().contains(blk) {
                let mut g = vol.bcache().lock(blk);
                // Its draft (the freed block's last contents) goes too.
                vol.bcache().forget_locked(&mut g, blk);
            }
        }
    }
}

/// Clear the bits of `runs` (all inside group `g`) under the group lock.
fn free_in_group(vol: &Volume, h: &mut Handle<'_>, g: usize, runs: &[(u64, u64)]) -> Result<()> {
    forget_freed(vol, runs);
    let start = runs.first().map_or(0, |r| r.0);
    let grp = vol
        .groups()
        .get(g)
        .ok_or_else(|| Error::corrupt_msg(format!("block {start}"), "block map", "outside every group"))?;
    let mut gd = grp.desc().write();
    let (mut bm, uninit) = read_bitmap(vol, g, &gd)?;
    let first = vol.geo().group_first_block(g as u64);
    let mut total = 0u32;
    for &(s, len) in runs {
        let off = (s - first) as usize;
        if off + len as usize > vol.geo().blocks_in_group(g) as usize {
            return Err(Error::corrupt_msg(
                format!("block {s}"),
                "block map",
                format!("run of {len} crosses group {g}"),
            ));
        }
        // A bit already clear is a bitmap that lied about a live block:
        // it is freed all the same (the bitmap was already right about its
        // future) and not counted twice — the kernel's mb_free_blocks,
        // which reports "freeing already freed block" and carries on. The
        // group's bitmap is then known to disagree with its count until
        // e2fsck.
        for i in off..off + len as usize {
            if test_bit(&bm, i) {
                clear_bit(&mut bm, i);
                total += 1;
            } else {
                grp.bitmap_state().fetch_or(BITMAP_BLOCK_CORRUPT, Ordering::Relaxed);
            }
        }
    }
    let mut new = *gd;
    if uninit {
        new.flags &= !BG_BLOCK_UNINIT;
    }
    let free = gd.free_blocks_count() + total;
    new.set_free_blocks_count(free);
    vol.groups().set_block_bitmap_csum(&mut new, &bm);
    h.overwrite(gd.block_bitmap(), bm.into_boxed_slice())?;
    vol.write_group_desc(h, g, &new)?;
    *gd = new;
    vol.reservations().free_changed(total as i64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ordinary allocations see the reservations; a handle given reserved blocks
    /// (writeback) draws from them without a check; the free counter stays
    /// the sum of the group descriptors.
    #[test]
    fn allocations_respect_reservations_and_draw_from_the_handle() {
        let v = crate::volume::scratch_volume();
        let groups = |v: &crate::volume::Volume| -> u64 {
            v.groups()
                .iter()
                .map(|g| g.desc().read().free_blocks_count() as u64)
                .sum()
        };
        let free = v.reservations().free();
        assert_eq!(free, groups(&v));
        let avail = v.reservations().available(Reserver::User);
        v.reservations().reserve(avail, Reserver::User).unwrap();
        let mut h = v.begin().unwrap();
        let e = new_blocks(&v, &mut h, BlockRequest::near(0, 1)).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        h.add_reserved(10);
        let (p, n) = new_blocks(&v, &mut h, BlockRequest::near(0, 4)).unwrap();
        assert!((1..=4).contains(&n));
        assert_eq!(h.reserved_left(), 10 - n as u64);
        assert_eq!(
            v.reservations().dirty(),
            avail - n as u64,
            "the blocks drawn left the reservations"
        );
        assert_eq!(v.reservations().free(), free - n as u64);
        assert_eq!(v.reservations().free(), groups(&v));
        free_blocks(&v, &mut h, p, n).unwrap();
        assert_eq!(v.reservations().free(), groups(&v));
        h.commit().unwrap();
    }
}
