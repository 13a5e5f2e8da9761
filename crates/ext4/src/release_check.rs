//! Checking what freeing an inode will touch, before anything changes.
//!
//! Removing the last name of a file is two steps on disk: the directory
//! entry goes, then the inode's blocks, xattr block and bitmap bit are
//! freed. If the second step meets damage (an extent pointing outside the
//! filesystem, a node that does not parse, an xattr naming an EA inode on
//! an image without `ea_inode`) after the first has happened, the inode is
//! left with no name — worse than before. The kernel's `ext4_evict_inode`
//! can only report such damage; we look first: [`release`]
//! reads the whole block map and the xattrs and checks every block they
//! name, so the caller can refuse (naming the damage, "run e2fsck")
//! while the image is still as it was. A truncate or hole punch is checked
//! the same way first ([`punch`]): the whole map, not only
//! the part freed, since without a journal a free stopped half-way by
//! damage would be written as it stood.
//!
//! Both also refuse to free a block another inode still names (a
//! cross-link: `owner_scan.rs`), and to rewrite the inode's record when
//! it lies in a cross-linked inode-table block. A group whose free count
//! disagrees with its
//! bitmap is no reason to refuse: a free moves both by the same amount
//! (a bit already clear is not counted twice, `balloc::free_runs`), and
//! the superblock's total keeps its own distance from the groups' sum (the
//! count bias of `superblock.rs`), so the disagreement stays what it was.
//!
//! Every block a map names must lie outside the system zone
//! (`system_zone.rs`, the kernel's `block_validity.c`): a superblock or
//! descriptor copy, a bitmap or an inode table.

use ext4kit_format::indirect;
use ext4kit_format::inode::Inode;

use crate::bmap::{self, BlockMap};
use crate::error::{Error, Result};
use crate::owner_scan;
use crate::volume::Volume;
use crate::{extent_tree, xattr};

/// A truncate or hole punch to check before it begins ([`punch`]).
#[derive(Debug, Clone, Copy)]
pub struct Punch<'a> {
    /// The inode.
    pub ino: u32,
    /// Its record as it stands.
    pub rec: &'a Inode,
    /// The logical blocks `[from, to)` to free.
    pub from: u64,
    /// See `from`.
    pub to: u64,
    /// The logical block whose end is zeroed (a truncate to a size inside
    /// a block), if any.
    pub tail: Option<u64>,
}

/// What an inode's block map names, each block checked to lie inside the
/// filesystem and outside the system zone.
struct CheckedMap {
    /// Data runs: (logical block, physical block, length).
    data: Vec<(u64, u64, u64)>,
    /// Extent tree nodes or indirect blocks.
    meta: Vec<u64>,
}

/// Check that everything inode `ino` (record `rec`) owns can be freed:
/// its block map reads whole and names only blocks inside the filesystem
/// and outside the system zone, its xattrs parse and store no value in an
/// EA inode, and no block it frees is named by another inode too
/// (`owner_scan.rs`). Reads only. Public: the vfs layer checks before the
/// last name of an inode goes.
pub fn release(vol: &Volume, ino: u32, rec: &Inode) -> Result<()> {
    let map = checked_map(vol, ino, rec)?;
    let acl = rec.file_acl();
    if acl != 0 {
        owned_run(vol, ino, "xattr block", acl, 1)?;
    }
    // Parses the body and the block; refuses an EA-inode value.
    xattr::entries(vol, ino, rec)?;
    let mut runs: Vec<(u64, u64)> = map.data.iter().map(|&(_, p, n)| (p, n)).collect();
    runs.extend(map.meta.iter().map(|&b| (b, 1)));
    if acl != 0 {
        // The last reference frees the block; an earlier one only writes
        // its refcount — into a block another inode may own.
        runs.push((acl, 1));
        xattr_refs(vol, ino, acl)?;
    }
    owner_scan::check_free(vol, ino, rec, &runs)
}

/// Check, before an xattr of inode `ino` (record `rec`) is set or
/// removed, that its xattr block may be rewritten, shared-copied or
/// released: it lies inside the filesystem and outside the system zone,
/// no other inode names it as anything but a sharer of the block (a
/// cross-link: writing it in place would overwrite the other owner's
/// block), and its refcount agrees with the inodes naming it. The inode's
/// own record, rewritten too, must not lie in a cross-linked inode-table
/// block ([`owner_scan::check_record`]). Reads only. Public: the vfs
/// layer checks before setxattr and removexattr begin.
pub fn xattr_change(vol: &Volume, ino: u32, rec: &Inode) -> Result<()> {
    owner_scan::check_record(vol, ino)?;
    let acl = rec.file_acl();
    if acl == 0 {
        return Ok(());
    }
    owned_run(vol, ino, "xattr block", acl, 1)?;
    xattr_refs(vol, ino, acl)?;
    owner_scan::check_free(vol, ino, rec, &[(acl, 1)])
}

/// Check, before a truncate or hole punch changes anything, that freeing
/// logical blocks `[p.from, p.to)` of inode `p.ino` will not stop
/// half-way: the whole block map reads and names only blocks inside the
/// filesystem and outside the system zone (so damage anywhere in it is
/// met now, not after part of it was freed: without a journal that would
/// be written as it stood), no block freed — nor the one whose end is
/// zeroed, `p.tail` — is named by another inode too, and the inode's
/// record (rewritten with the new map and size) does not lie in a
/// cross-linked inode-table block ([`owner_scan::check_record`]). Reads
/// only. Public: the vfs layer checks before truncate, hole punch and
/// collapse begin.
pub fn punch(vol: &Volume, p: &Punch<'_>) -> Result<()> {
    let Punch {
        ino,
        rec,
        from,
        to,
        tail,
    } = *p;
    owner_scan::check_record(vol, ino)?;
    if !matches!(bmap::load(vol, ino, rec)?, BlockMap::Extents(_) | BlockMap::Indirect(_)) {
        return Ok(());
    }
    let map = checked_map(vol, ino, rec)?;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &(l, p, n) in &map.data {
        let s = l.max(from);
        let e = l.saturating_add(n).min(to);
        if s < e {
            runs.push((p + (s - l), e - s));
        }
    }
    // Any node or indirect block may be freed when what it maps goes.
    runs.extend(map.meta.iter().map(|&b| (b, 1)));
    if let Some(t) = tail {
        if let Some(&(l, p, _)) = map.data.iter().find(|&&(l, _, n)| t >= l && t - l < n) {
            runs.push((p + (t - l), 1));
        }
    }
    owner_scan::check_free(vol, ino, rec, &runs)
}

/// Refuse to change the references of xattr block `nr` (inode `ino` names
/// it) when its refcount disagrees with the number of inodes naming it
/// ([`crate::owners::OwnerMap::check_xattr_refcount`]). Runs the owner
/// scan first. The refcount is read under the block's lock, where every
/// release changes both it and the count of inodes naming the block
/// (`xattr_write.rs`), so the two agree however many inodes release the
/// block at once. Reads only.
fn xattr_refs(vol: &Volume, ino: u32, nr: u64) -> Result<()> {
    owner_scan::sets(vol)?;
    let mut g = vol.bcache().lock(nr);
    let buf = vol.buffer_locked(&mut g, nr)?;
    vol.owner_map()
        .check_xattr_refcount(ino, nr, ext4kit_format::bytes::le32(&buf.data, 4))
}

/// The block map of inode `ino` (record `rec`), read whole, every block
/// checked ([`owned_run`]).
fn checked_map(vol: &Volume, ino: u32, rec: &Inode) -> Result<CheckedMap> {
    let mut out = CheckedMap {
        data: Vec::new(),
        meta: Vec::new(),
    };
    match bmap::load(vol, ino, rec)? {
        BlockMap::Extents(ext) => {
            for e in &ext {
                owned_run(vol, ino, "extent", e.start(), e.length() as u64)?;
                out.data.push((e.block as u64, e.start(), e.length() as u64));
            }
            if rec.uses_extents() {
                for b in extent_tree::node_blocks(vol, ino, rec)? {
                    owned_run(vol, ino, "extent tree node", b, 1)?;
                    out.meta.push(b);
                }
            }
        }
        m @ BlockMap::Indirect(root) => {
            let mut walk = IndirectCheck {
                vol,
                ino,
                budget: vol.geo().blocks_count(),
                meta: &mut out.meta,
            };
            for (slot, &p) in root.iter().enumerate() {
                walk.check(p as u64, indirect::slot_depth(slot))?;
            }
            out.data = m.runs(vol, u64::MAX)?;
        }
        BlockMap::Inline(_) | BlockMap::None => {}
    }
    Ok(out)
}

/// The walk of an indirect map in [`checked_map`]: every pointer checked,
/// the indirect blocks collected.
struct IndirectCheck<'a> {
    vol: &'a Volume,
    ino: u32,
    /// Indirect blocks it may still read (a map that loops is refused).
    budget: u64,
    meta: &'a mut Vec<u64>,
}

impl IndirectCheck<'_> {
    fn check(&mut self, blk: u64, depth: usize) -> Result<()> {
        if blk == 0 {
            return Ok(());
        }
        let what = if depth == 0 { "block" } else { "indirect block" };
        owned_run(self.vol, self.ino, what, blk, 1)?;
        if depth == 0 {
            return Ok(());
        }
        self.meta.push(blk);
        self.budget = self.budget.checked_sub(1).ok_or_else(|| {
            Error::corrupt_msg(
                format!("block map of inode {}", self.ino),
                "indirect map",
                "more blocks than the filesystem",
            )
        })?;
        let buf = self.vol.buffer(blk)?;
        for i in 0..self.vol.block_size() / 4 {
            let p = indirect::pointer(&buf.data, i) as u64;
            self.check(p, depth - 1)?;
        }
        Ok(())
    }
}

/// `[start, start + len)`, named by inode `ino` as `what`, lies inside the
/// filesystem and outside the system zone.
fn owned_run(vol: &Volume, ino: u32, what: &str, start: u64, len: u64) -> Result<()> {
    let end = start
        .checked_add(len)
        .filter(|&e| start >= vol.geo().first_data_block() && e <= vol.geo().blocks_count());
    let Some(end) = end else {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "block map",
            format!(
                "{what} {start}+{len} lies outside the filesystem (blocks {}..{})",
                vol.geo().first_data_block(),
                vol.geo().blocks_count()
            ),
        ));
    };
    if let Some((zs, zl, name)) = vol.system_zone().hit(start, end) {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "block map",
            format!("{what} {start}+{len} overlaps {name} (blocks {zs}..{})", zs + zl),
        ));
    }
    Ok(())
}
