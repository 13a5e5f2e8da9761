//! The system zone (the kernel's `block_validity.c`): the blocks no file
//! may own — every group's bitmaps and inode table, and the superblock and
//! descriptor copies (with their reserved GDT blocks) of the groups that
//! carry them. A block map naming one is damaged; a bitmap marking one
//! free lies; freeing one would hand metadata out as data.
//!
//! Built once, on first use, from the group layout (fixed while the
//! filesystem is open); read without a lock afterwards.

use ext4kit_format::features::incompat;
use ext4kit_format::superblock::Superblock;

use crate::geometry::Geometry;

/// The system zone's ranges, sorted by start and merged where adjacent
/// (see the module doc).
#[derive(Debug)]
pub struct SystemZone {
    ranges: Vec<(u64, u64, &'static str)>,
}

impl SystemZone {
    /// The zone of the filesystem `geo` and `sb` describe, whose groups'
    /// bitmaps and inode tables are `metas` (block bitmap, inode bitmap,
    /// inode table: [`crate::group::Group::meta`], in group order).
    pub(crate) fn new(geo: &Geometry, sb: &Superblock, metas: impl Iterator<Item = (u64, u64, u64)>) -> SystemZone {
        let itb = geo.itable_blocks();
        let mut v = Vec::new();
        let meta_bg = geo.has_incompat(incompat::META_BG);
        let per_block = (geo.block_size() / sb.desc_size().max(1)).max(1);
        let gdt = (geo.group_count() as usize).div_ceil(per_block) as u64;
        for (g, (bb, ib, it)) in metas.enumerate() {
            v.push((bb, 1, "a block bitmap"));
            v.push((ib, 1, "an inode bitmap"));
            v.push((it, itb, "an inode table"));
            if sb.group_has_super(g as u64) {
                let first = geo.group_first_block(g as u64);
                let n = if meta_bg {
                    1
                } else {
                    1 + gdt + sb.reserved_gdt_blocks as u64
                };
                v.push((first, n, "a superblock or group descriptor copy"));
            }
        }
        v.sort_unstable();
        let mut ranges: Vec<(u64, u64, &'static str)> = Vec::with_capacity(v.len());
        for z in v {
            match ranges.last_mut() {
                Some(l) if z.0 <= l.0 + l.1 => l.1 = l.1.max(z.0 + z.1 - l.0),
                _ => ranges.push(z),
            }
        }
        SystemZone { ranges }
    }

    /// The range overlapping `[start, end)`, if any: (start, length, what
    /// it is).
    pub fn hit(&self, start: u64, end: u64) -> Option<(u64, u64, &'static str)> {
        // Sorted by start and not overlapping: the last range starting
        // before `end` is the only candidate.
        let i = self.ranges.partition_point(|z| z.0 < end);
        let z = *self.ranges.get(i.checked_sub(1)?)?;
        (z.0 + z.1 > start).then_some(z)
    }
}
