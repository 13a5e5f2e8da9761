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
//! while the image is still as it was.
//!
//! The system zone (the kernel's `block_validity.c`): a block map must
//! not name a superblock or descriptor copy, a bitmap or an inode table.

use ext4kit_format::features::incompat;
use ext4kit_format::indirect;
use ext4kit_format::inode::Inode;

use crate::bmap::BlockMap;
use crate::error::{Error, Result};
use crate::volume::Volume;

impl Volume {
    /// Check that everything inode `ino` (record `inode`) owns can be
    /// freed: its block map reads whole and names only blocks inside the
    /// filesystem and outside the system zone, and its xattrs parse and
    /// store no value in an EA inode. Reads only.
    pub fn check_release(&self, ino: u32, inode: &Inode) -> Result<()> {
        match self.block_map(ino, inode)? {
            BlockMap::Extents(ext) => {
                for e in &ext {
                    self.check_owned_run(ino, "extent", e.start(), e.length() as u64)?;
                }
                if inode.uses_extents() {
                    for b in self.ext_node_blocks(ino, inode)? {
                        self.check_owned_run(ino, "extent tree node", b, 1)?;
                    }
                }
            }
            BlockMap::Indirect(root) => {
                let mut budget = self.blocks_count;
                for (slot, &p) in root.iter().enumerate() {
                    let depth = match slot {
                        s if s < indirect::DIRECT => 0,
                        indirect::IND => 1,
                        indirect::DIND => 2,
                        _ => 3,
                    };
                    self.check_indirect(ino, p as u64, depth, &mut budget)?;
                }
            }
            BlockMap::Inline(_) | BlockMap::None => {}
        }
        let acl = inode.file_acl();
        if acl != 0 {
            self.check_owned_run(ino, "xattr block", acl, 1)?;
        }
        // Parses the body and the block; refuses an EA-inode value.
        self.xattr_entries(ino, inode)?;
        // The groups whose free counts the frees will move must agree with
        // their bitmaps, or the counts would grow more wrong (and the
        // superblock's total with them).
        let mut groups: Vec<usize> = Vec::new();
        if let Ok(BlockMap::Extents(ext)) = self.block_map(ino, inode) {
            for e in ext.iter().take(4096) {
                groups.push(((e.start() - self.first_data_block) / self.blocks_per_group) as usize);
            }
        }
        if acl != 0 {
            groups.push(((acl - self.first_data_block) / self.blocks_per_group) as usize);
        }
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            let Some(grp) = self.groups.get(g) else { continue };
            let gd = *grp.desc.read();
            let (bm, uninit) = self.block_bitmap_of(g, &gd)?;
            if !uninit && !self.block_bitmap_usable(g, &gd, &bm) {
                return Err(Error::corrupt_msg(
                    format!("group {g}"),
                    "block bitmap",
                    format!(
                        "inode {ino}'s blocks are in a group whose bitmap disagrees with its descriptor's free count ({})",
                        gd.free_blocks_count()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_indirect(&self, ino: u32, blk: u64, depth: usize, budget: &mut u64) -> Result<()> {
        if blk == 0 {
            return Ok(());
        }
        let what = if depth == 0 { "block" } else { "indirect block" };
        self.check_owned_run(ino, what, blk, 1)?;
        if depth == 0 {
            return Ok(());
        }
        *budget = budget.checked_sub(1).ok_or_else(|| {
            Error::corrupt_msg(
                format!("block map of inode {ino}"),
                "indirect map",
                "more blocks than the filesystem",
            )
        })?;
        let buf = self.buffer(blk)?;
        for i in 0..self.block_size / 4 {
            let p = indirect::pointer(&buf.data, i) as u64;
            self.check_indirect(ino, p, depth - 1, budget)?;
        }
        Ok(())
    }

    /// `[start, start + len)`, named by inode `ino` as `what`, lies inside
    /// the filesystem and outside the system zone.
    pub fn check_owned_run(&self, ino: u32, what: &str, start: u64, len: u64) -> Result<()> {
        let end = start
            .checked_add(len)
            .filter(|&e| start >= self.first_data_block && e <= self.blocks_count);
        let Some(end) = end else {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "block map",
                format!(
                    "{what} {start}+{len} lies outside the filesystem (blocks {}..{})",
                    self.first_data_block, self.blocks_count
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
        let zone = self.system_zone.get_or_init(|| self.build_system_zone());
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
        let sb = self.sb.read();
        let itb = (self.inodes_per_group as u64 * self.inode_size as u64).div_ceil(self.block_size as u64);
        let mut v = Vec::new();
        let meta_bg = self.has_incompat(incompat::META_BG);
        let per_block = (self.block_size / sb.desc_size().max(1)).max(1);
        let gdt = self.groups.len().div_ceil(per_block) as u64;
        for (g, grp) in self.groups.iter().enumerate() {
            let (bb, ib, it) = grp.meta;
            v.push((bb, 1, "a block bitmap"));
            v.push((ib, 1, "an inode bitmap"));
            v.push((it, itb, "an inode table"));
            if sb.group_has_super(g as u64) {
                let first = self.group_first_block(g as u64);
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
