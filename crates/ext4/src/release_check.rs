//! Checking what freeing an inode will touch, before anything changes.
//!
//! Removing the last name of a file is two steps on disk: the directory
//! entry goes, then the inode's blocks, xattr block and bitmap bit are
//! freed. If the second step meets damage (an extent pointing outside the
//! filesystem, a node that does not parse, an xattr naming an EA inode on
//! an image without `ea_inode`) after the first has happened, the inode is
//! left with no name — worse than before. The kernel's `ext4_evict_inode`
//! can only report such damage; we look first: [`Volume::check_release`]
//! reads the whole block map and the xattrs and checks every block they
//! name, so the caller can refuse (naming the damage, "run e2fsck")
//! while the image is still as it was. A truncate or hole punch is checked
//! the same way first ([`Volume::check_punch`]): the whole map, not only
//! the part freed, since without a journal a free stopped half-way by
//! damage would be written as it stood.
//!
//! Both also refuse to free a block another inode still claims (a
//! cross-link: `claims.rs`). A group whose free count disagrees with its
//! bitmap is no reason to refuse: a free moves both by the same amount
//! (a bit already clear is not counted twice, `free_in_group`), and the
//! superblock's total keeps its own distance from the groups' sum
//! (`Volume::damaged_count_bias`), so the disagreement stays what it was.
//!
//! The system zone (the kernel's `block_validity.c`): a block map must
//! not name a superblock or descriptor copy, a bitmap or an inode table.

use ext4kit_format::features::incompat;
use ext4kit_format::indirect;
use ext4kit_format::inode::Inode;

use crate::bmap::{self, BlockMap};
use crate::error::{Error, Result};
use crate::volume::Volume;
use crate::{extent_tree, xattr};

/// What an inode's block map names, each block checked to lie inside the
/// filesystem and outside the system zone.
struct CheckedMap {
    /// Data runs: (logical block, physical block, length).
    data: Vec<(u64, u64, u64)>,
    /// Extent tree nodes or indirect blocks.
    meta: Vec<u64>,
}

impl Volume {
    /// Check that everything inode `ino` (record `inode`) owns can be
    /// freed: its block map reads whole and names only blocks inside the
    /// filesystem and outside the system zone, its xattrs parse and store
    /// no value in an EA inode, and no block it frees is claimed by
    /// another inode too (`claims.rs`). Reads only.
    pub fn check_release(&self, ino: u32, inode: &Inode) -> Result<()> {
        let map = self.checked_map(ino, inode)?;
        let acl = inode.file_acl();
        if acl != 0 {
            self.check_owned_run(ino, "xattr block", acl, 1)?;
        }
        // Parses the body and the block; refuses an EA-inode value.
        xattr::entries(self, ino, inode)?;
        let mut runs: Vec<(u64, u64)> = map.data.iter().map(|&(_, p, n)| (p, n)).collect();
        runs.extend(map.meta.iter().map(|&b| (b, 1)));
        if acl != 0 {
            // The last reference frees the block; an earlier one only
            // writes its refcount — into a block another inode may own.
            runs.push((acl, 1));
            self.check_xattr_refs(ino, acl)?;
        }
        self.check_free_claims(ino, inode, &runs)
    }

    /// Check, before an xattr of inode `ino` (record `inode`) is set or
    /// removed, that its xattr block may be rewritten, shared-copied or
    /// released: it lies inside the filesystem and outside the system
    /// zone, no other inode claims it as anything but a sharer of the
    /// block (a cross-link: writing it in place would overwrite the other
    /// owner's block), and its refcount agrees with the inodes naming it.
    /// The inode's own record, rewritten too, must not lie in a
    /// cross-linked inode-table block (`Volume::check_record_writable`).
    /// Reads only.
    pub fn check_xattr_block_change(&self, ino: u32, inode: &Inode) -> Result<()> {
        self.check_record_writable(ino)?;
        let acl = inode.file_acl();
        if acl == 0 {
            return Ok(());
        }
        self.check_owned_run(ino, "xattr block", acl, 1)?;
        self.check_xattr_refs(ino, acl)?;
        self.check_free_claims(ino, inode, &[(acl, 1)])
    }

    /// Check, before a truncate or hole punch of inode `ino` (record
    /// `inode`) changes anything, that freeing logical blocks `[from, to)`
    /// will not stop half-way: the whole block map reads and names only
    /// blocks inside the filesystem and outside the system zone (so damage
    /// anywhere in it is met now, not after part of it was freed: without
    /// a journal that would be written as it stood), no block freed — nor
    /// `tail`, the logical block whose end is zeroed — is claimed by
    /// another inode too, and the inode's record (rewritten with the new
    /// map and size) does not lie in a cross-linked inode-table block
    /// (`Volume::check_record_writable`). Reads only.
    pub fn check_punch(&self, ino: u32, inode: &Inode, from: u64, to: u64, tail: Option<u64>) -> Result<()> {
        self.check_record_writable(ino)?;
        if !matches!(
            bmap::load(self, ino, inode)?,
            BlockMap::Extents(_) | BlockMap::Indirect(_)
        ) {
            return Ok(());
        }
        let map = self.checked_map(ino, inode)?;
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
        self.check_free_claims(ino, inode, &runs)
    }

    /// The block map of inode `ino`, read whole, every block checked
    /// (`check_owned_run`).
    fn checked_map(&self, ino: u32, inode: &Inode) -> Result<CheckedMap> {
        let mut out = CheckedMap {
            data: Vec::new(),
            meta: Vec::new(),
        };
        match bmap::load(self, ino, inode)? {
            BlockMap::Extents(ext) => {
                for e in &ext {
                    self.check_owned_run(ino, "extent", e.start(), e.length() as u64)?;
                    out.data.push((e.block as u64, e.start(), e.length() as u64));
                }
                if inode.uses_extents() {
                    for b in extent_tree::node_blocks(self, ino, inode)? {
                        self.check_owned_run(ino, "extent tree node", b, 1)?;
                        out.meta.push(b);
                    }
                }
            }
            m @ BlockMap::Indirect(root) => {
                let mut budget = self.geo().blocks_count();
                for (slot, &p) in root.iter().enumerate() {
                    let depth = indirect::slot_depth(slot);
                    self.check_indirect(ino, p as u64, depth, &mut budget, &mut out.meta)?;
                }
                out.data = m.runs(self, u64::MAX)?;
            }
            BlockMap::Inline(_) | BlockMap::None => {}
        }
        Ok(out)
    }

    fn check_indirect(&self, ino: u32, blk: u64, depth: usize, budget: &mut u64, meta: &mut Vec<u64>) -> Result<()> {
        if blk == 0 {
            return Ok(());
        }
        let what = if depth == 0 { "block" } else { "indirect block" };
        self.check_owned_run(ino, what, blk, 1)?;
        if depth == 0 {
            return Ok(());
        }
        meta.push(blk);
        *budget = budget.checked_sub(1).ok_or_else(|| {
            Error::corrupt_msg(
                format!("block map of inode {ino}"),
                "indirect map",
                "more blocks than the filesystem",
            )
        })?;
        let buf = self.buffer(blk)?;
        for i in 0..self.block_size() / 4 {
            let p = indirect::pointer(&buf.data, i) as u64;
            self.check_indirect(ino, p, depth - 1, budget, meta)?;
        }
        Ok(())
    }

    /// `[start, start + len)`, named by inode `ino` as `what`, lies inside
    /// the filesystem and outside the system zone.
    pub fn check_owned_run(&self, ino: u32, what: &str, start: u64, len: u64) -> Result<()> {
        let end = start
            .checked_add(len)
            .filter(|&e| start >= self.geo().first_data_block() && e <= self.geo().blocks_count());
        let Some(end) = end else {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "block map",
                format!(
                    "{what} {start}+{len} lies outside the filesystem (blocks {}..{})",
                    self.geo().first_data_block(),
                    self.geo().blocks_count()
                ),
            ));
        };
        if let Some((zs, zl, name)) = self.system_zone_hit(start, end) {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "block map",
                format!("{what} {start}+{len} overlaps {name} (blocks {zs}..{})", zs + zl),
            ));
        }
        Ok(())
    }

    /// The system-zone range overlapping `[start, end)`, if any.
    pub fn system_zone_hit(&self, start: u64, end: u64) -> Option<(u64, u64, &'static str)> {
        let zone = self.system_zone().get_or_init(|| self.build_system_zone());
        // Sorted by start and not overlapping: the last range starting
        // before `end` is the only candidate.
        let i = zone.partition_point(|z| z.0 < end);
        let z = *zone.get(i.checked_sub(1)?)?;
        (z.0 + z.1 > start).then_some(z)
    }

    /// Every group's bitmaps and inode table, and the superblock and
    /// descriptor copies (with their reserved GDT blocks) of the groups
    /// that carry them: sorted, merged where adjacent.
    fn build_system_zone(&self) -> Vec<(u64, u64, &'static str)> {
        let sb = self.sb().read();
        let itb = self.geo().itable_blocks();
        let mut v = Vec::new();
        let meta_bg = self.geo().has_incompat(incompat::META_BG);
        let per_block = (self.block_size() / sb.desc_size().max(1)).max(1);
        let gdt = self.groups().len().div_ceil(per_block) as u64;
        for (g, grp) in self.groups().iter().enumerate() {
            let (bb, ib, it) = grp.meta();
            v.push((bb, 1, "a block bitmap"));
            v.push((ib, 1, "an inode bitmap"));
            v.push((it, itb, "an inode table"));
            if sb.group_has_super(g as u64) {
                let first = self.geo().group_first_block(g as u64);
                let n = if meta_bg {
                    1
                } else {
                    1 + gdt + sb.reserved_gdt_blocks as u64
                };
                v.push((first, n, "a superblock or group descriptor copy"));
            }
        }
        v.sort_unstable();
        let mut out: Vec<(u64, u64, &'static str)> = Vec::with_capacity(v.len());
        for z in v {
            match out.last_mut() {
                Some(l) if z.0 <= l.0 + l.1 => l.1 = l.1.max(z.0 + z.1 - l.0),
                _ => out.push(z),
            }
        }
        out
    }
}
