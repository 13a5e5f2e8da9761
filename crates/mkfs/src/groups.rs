//! Each group's bitmaps and descriptor, as mke2fs leaves them:
//!
//! - Bitmaps have the bits of used blocks / inodes set and their padding
//!   (past the group's blocks, past `inodes_per_group`) set to 1.
//! - With descriptor checksums (`metadata_csum` or `uninit_bg`):
//!   `INODE_UNINIT` on groups with no inode in use, `BLOCK_UNINIT` on
//!   groups (not the last) whose only used blocks are the ones the kernel
//!   (`ext4_init_block_bitmap`) and e2fsck derive for such a group — its
//!   superblock area and whichever of its own bitmaps and table lie inside
//!   it. Those bitmaps are not written (zeros, when the device does not
//!   already read as zeros) and their checksums stay 0: the kernel
//!   computes them when it first initialises the bitmap.
//!   `bg_itable_unused` counts the never-used inodes at the end of each
//!   table.
//! - Every table is marked `ITABLE_ZEROED` (even without descriptor
//!   checksums, as mke2fs does): the tables were zeroed.
//! - With `metadata_csum`, the crc32c of each written bitmap (over
//!   `blocks_per_group / 8` and `inodes_per_group / 8` bytes) goes into the
//!   descriptor, its high half only with 64-byte descriptors.

use ext4kit_format::checksum::crc32c;
use ext4kit_format::group_desc::{GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED};

use crate::alloc::Alloc;
use crate::error::Result;
use crate::inode_tables::InodeUsage;
use crate::layout::Layout;
use crate::plan::Plan;
use crate::writer::Writer;

/// One copy of the descriptor table and the free counts it sums to.
pub(crate) struct DescriptorTable {
    bytes: Vec<u8>,
    free_blocks: u64,
    free_inodes: u64,
}

impl DescriptorTable {
    /// The table, `desc_blocks` blocks long.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// `s_free_blocks_count`.
    pub(crate) fn free_blocks(&self) -> u64 {
        self.free_blocks
    }
    /// `s_free_inodes_count`.
    pub(crate) fn free_inodes(&self) -> u64 {
        self.free_inodes
    }
}

/// The groups step: write each group's bitmaps now and build the
/// descriptor table (written later, with the superblocks).
pub(crate) fn write_groups(plan: &Plan, layout: &Layout, al: &Alloc, w: &mut Writer<'_>) -> Result<DescriptorTable> {
    let g = plan.geometry();
    let usage = InodeUsage::new_fs(plan);
    let groups = Groups {
        plan,
        layout,
        al,
        usage: &usage,
    };
    let mut table = DescriptorTable {
        bytes: vec![0u8; (g.desc_blocks() * g.block_size()) as usize],
        free_blocks: 0,
        free_inodes: 0,
    };
    for grp in 0..g.groups() {
        let state = groups.state(grp);
        table.free_blocks += state.free_blocks;
        table.free_inodes += state.free_inodes;
        let d = groups.descriptor(grp, &state);
        groups.write_bitmaps(grp, &state, w)?;
        let raw = d.to_bytes_sized(g.desc_size() as usize, grp as u32, plan.checksums().descriptor_kind());
        let off = (grp * g.desc_size()) as usize;
        table.bytes[off..off + raw.len()].copy_from_slice(&raw);
    }
    Ok(table)
}

/// What the groups step reads.
struct Groups<'a> {
    plan: &'a Plan,
    layout: &'a Layout,
    al: &'a Alloc,
    usage: &'a InodeUsage,
}

/// One group's bitmaps, flags and free counts.
struct GroupState {
    block_bitmap: Vec<u8>,
    inode_bitmap: Vec<u8>,
    block_uninit: bool,
    inode_uninit: bool,
    free_blocks: u64,
    free_inodes: u64,
}

impl Groups<'_> {
    /// Group `grp`'s bitmaps from the used blocks and inodes, and whether
    /// it may be left uninitialised.
    fn state(&self, grp: u64) -> GroupState {
        let g = self.plan.geometry();
        let i = grp as usize;
        let bs = g.block_size();
        let first = g.group_first(grp);
        let nb = g.blocks_in_group(grp);
        let mut block_bitmap = vec![0u8; bs as usize];
        let mut used = 0;
        for (s, e) in self.al.used_in(first, nb) {
            set_bits(&mut block_bitmap, s - first, e - first);
            used += e - s;
        }
        set_bits(&mut block_bitmap, nb, bs * 8);
        let mut inode_bitmap = vec![0u8; bs as usize];
        set_bits(&mut inode_bitmap, 0, self.usage.high_water(i));
        set_bits(&mut inode_bitmap, g.inodes_per_group(), bs * 8);
        // The blocks the kernel and e2fsck derive for a BLOCK_UNINIT group.
        let in_group = |s: u64, n: u64| {
            let (a, b) = (s.max(first), (s + n).min(first + nb));
            b.saturating_sub(a)
        };
        let derivable = g.super_area(grp)
            + in_group(self.layout.block_bitmap(i), 1)
            + in_group(self.layout.inode_bitmap(i), 1)
            + in_group(self.layout.inode_table(i), g.inode_table_blocks());
        let csums = self.plan.checksums().descriptors();
        GroupState {
            block_bitmap,
            inode_bitmap,
            block_uninit: csums && grp + 1 < g.groups() && used == derivable,
            inode_uninit: csums && self.usage.used(i) == 0,
            free_blocks: nb - used,
            free_inodes: g.inodes_per_group() - self.usage.used(i),
        }
    }

    /// Group `grp`'s descriptor (before its own checksum, which
    /// `to_bytes_sized` computes).
    fn descriptor(&self, grp: u64, st: &GroupState) -> GroupDesc {
        let g = self.plan.geometry();
        let i = grp as usize;
        let (bb, ib, it) = (
            self.layout.block_bitmap(i),
            self.layout.inode_bitmap(i),
            self.layout.inode_table(i),
        );
        let dirs = self.usage.dirs(i);
        let mut d = GroupDesc::parse_raw(&[0u8; 64]);
        d.set_block_bitmap(bb);
        d.set_inode_bitmap(ib);
        d.set_inode_table(it);
        d.set_free_blocks_count(st.free_blocks as u32);
        d.set_free_inodes_count(st.free_inodes as u32);
        d.set_used_dirs_count(dirs as u32);
        d.flags = BG_INODE_ZEROED;
        if st.block_uninit {
            d.flags |= BG_BLOCK_UNINIT;
        }
        if st.inode_uninit {
            d.flags |= BG_INODE_UNINIT;
        }
        let sums = self.plan.checksums();
        if sums.descriptors() {
            let unused = g.inodes_per_group() - self.usage.high_water(i);
            d.set_itable_unused(unused as u32);
        }
        if sums.metadata() && !st.block_uninit {
            let bc = crc32c(sums.fs_seed(), &st.block_bitmap[..(g.blocks_per_group() / 8) as usize]);
            d.set_block_bitmap_csum(bc, g.desc_size() >= 64);
        }
        if sums.metadata() && !st.inode_uninit {
            let ic = crc32c(sums.fs_seed(), &st.inode_bitmap[..(g.inodes_per_group() / 8) as usize]);
            d.set_inode_bitmap_csum(ic, g.desc_size() >= 64);
        }
        d
    }

    /// Write group `grp`'s bitmaps: as built, or zeros for an
    /// uninitialised one unless the device already reads as zeros.
    fn write_bitmaps(&self, grp: u64, st: &GroupState, w: &mut Writer<'_>) -> Result<()> {
        let i = grp as usize;
        let zeros = || vec![0u8; self.plan.geometry().block_size() as usize];
        if !st.block_uninit {
            w.write_now(self.layout.block_bitmap(i), &st.block_bitmap)?;
        } else if !self.plan.device_zeroed() {
            w.write_now(self.layout.block_bitmap(i), &zeros())?;
        }
        if !st.inode_uninit {
            w.write_now(self.layout.inode_bitmap(i), &st.inode_bitmap)?;
        } else if !self.plan.device_zeroed() {
            w.write_now(self.layout.inode_bitmap(i), &zeros())?;
        }
        Ok(())
    }
}

/// Set bits `from .. to` of a little-endian bitmap.
fn set_bits(map: &mut [u8], from: u64, to: u64) {
    let mut k = from;
    while k < to {
        if k.is_multiple_of(8) && k + 8 <= to {
            let end = (to / 8) as usize;
            map[(k / 8) as usize..end].fill(0xff);
            k = to & !7;
        } else {
            map[(k / 8) as usize] |= 1 << (k % 8);
            k += 1;
        }
    }
}
