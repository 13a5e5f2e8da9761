//! The layout step: where each group's metadata lives.
//!
//! - **Superblock areas** (`ext2fs_reserve_super_and_bgd`): the primary
//!   superblock at byte 1024 (block 0 with 1 KiB blocks is the boot
//!   block); with `sparse_super`, backups in groups 1 and the powers of 3,
//!   5 and 7, each followed by a copy of the descriptor table and the
//!   reserved GDT blocks.
//! - **Bitmaps and inode tables** (`ext2fs_allocate_group_table`): with
//!   `flex_bg` (16 groups per flex group, `s_log_groups_per_flex = 4`) the
//!   bitmaps and tables of a flex group are packed at the start of its
//!   first group, block bitmaps then inode bitmaps then tables, each run
//!   `table_offset` apart; without it each group holds its own block
//!   bitmap, inode bitmap and table right after its superblock area.

use crate::alloc::Alloc;
use crate::error::{MkfsError, Result};
use crate::plan::Plan;
use ext4kit_format::features::incompat;

/// `s_log_groups_per_flex` (mke2fs default flex_bg size 16).
pub(crate) const LOG_GROUPS_PER_FLEX: u8 = 4;

/// Each group's `bg_block_bitmap`, `bg_inode_bitmap` and `bg_inode_table`,
/// and the metadata overhead they make with the superblock areas.
pub(crate) struct Layout {
    block_bitmap: Vec<u64>,
    inode_bitmap: Vec<u64>,
    inode_table: Vec<u64>,
    overhead: u64,
}

impl Layout {
    /// The layout step: reserve the superblock areas, then place the
    /// bitmaps and inode tables, claiming every block in `al`.
    pub(crate) fn place(plan: &Plan, al: &mut Alloc) -> Result<Layout> {
        reserve_super_areas(plan, al);
        let n = plan.geometry().groups() as usize;
        let mut l = Layout {
            block_bitmap: vec![0; n],
            inode_bitmap: vec![0; n],
            inode_table: vec![0; n],
            overhead: 0,
        };
        if plan.features().has_incompat(incompat::FLEX_BG) {
            l.place_flex_groups(plan, al)?;
        } else {
            l.place_in_groups(plan, al)?;
        }
        // s_overhead_clusters: block 0 (1 KiB blocks), superblocks,
        // descriptor tables, reserved GDT, bitmaps and inode tables (the
        // journal is added by the superblock step), as mke2fs 1.47
        // computes it.
        l.overhead = al.count_used(0, plan.geometry().blocks());
        Ok(l)
    }

    /// `flex_bg`: for each flex group, the block bitmaps of its groups
    /// from the first free block after the first group's superblock area,
    /// the inode bitmaps `table_offset` further, the inode tables
    /// `2 * table_offset` further. `table_offset` is the flex group size,
    /// except in the last flex group, which keeps its runs contiguous:
    /// there it is that group's count (still the flex size when the last
    /// flex group has a single group), as `ext2fs_allocate_group_table`
    /// computes it for `last_grp == group_desc_count - 1`.
    fn place_flex_groups(&mut self, plan: &Plan, al: &mut Alloc) -> Result<()> {
        let g = plan.geometry();
        let fsz = 1u64 << LOG_GROUPS_PER_FLEX;
        let mut g0 = 0;
        while g0 < g.groups() {
            let last = (g0 | (fsz - 1)).min(g.groups() - 1);
            let n = last - g0 + 1;
            let table_offset = if last == g.groups() - 1 && g0 % fsz == 0 {
                match last & (fsz - 1) {
                    0 => fsz,
                    x => x + 1,
                }
            } else {
                fsz
            };
            let base = g.group_first(g0) + g.super_area(g0);
            for i in 0..n {
                self.block_bitmap[(g0 + i) as usize] = al.alloc_range(base + i, 1, g.first_data_block())?;
            }
            for i in 0..n {
                self.inode_bitmap[(g0 + i) as usize] =
                    al.alloc_range(base + table_offset + i, 1, g.first_data_block())?;
            }
            let itb = g.inode_table_blocks();
            for i in 0..n {
                self.inode_table[(g0 + i) as usize] =
                    al.alloc_range(base + 2 * table_offset + i * itb, itb, g.first_data_block())?;
            }
            g0 = last + 1;
        }
        Ok(())
    }

    /// Without `flex_bg`: block bitmap, inode bitmap and inode table of
    /// each group right after its superblock area, inside the group.
    fn place_in_groups(&mut self, plan: &Plan, al: &mut Alloc) -> Result<()> {
        let g = plan.geometry();
        let itb = g.inode_table_blocks();
        for grp in 0..g.groups() {
            let base = g.group_first(grp) + g.super_area(grp);
            let i = grp as usize;
            self.block_bitmap[i] = al.alloc_range(base, 1, g.first_data_block())?;
            self.inode_bitmap[i] = al.alloc_range(base + 1, 1, g.first_data_block())?;
            self.inode_table[i] = al.alloc_range(base + 2, itb, g.first_data_block())?;
            if self.inode_table[i] + itb > g.group_first(grp) + g.blocks_in_group(grp) {
                return Err(MkfsError::invalid(format!("group {grp} too small for its inode table")));
            }
        }
        Ok(())
    }

    /// `bg_block_bitmap` of group `grp`.
    pub(crate) fn block_bitmap(&self, grp: usize) -> u64 {
        self.block_bitmap[grp]
    }
    /// `bg_inode_bitmap` of group `grp`.
    pub(crate) fn inode_bitmap(&self, grp: usize) -> u64 {
        self.inode_bitmap[grp]
    }
    /// `bg_inode_table` of group `grp`.
    pub(crate) fn inode_table(&self, grp: usize) -> u64 {
        self.inode_table[grp]
    }
    /// Every group's first inode table block, in group order.
    pub(crate) fn inode_tables(&self) -> &[u64] {
        &self.inode_table
    }
    /// Blocks taken by the boot block, superblock areas, bitmaps and
    /// inode tables.
    pub(crate) fn overhead(&self) -> u64 {
        self.overhead
    }
}

/// Claim block 0 with 1 KiB blocks (the boot block, before
/// `s_first_data_block`) and every group's superblock area.
fn reserve_super_areas(plan: &Plan, al: &mut Alloc) {
    let g = plan.geometry();
    if g.first_data_block() == 1 {
        al.mark(0, 1);
    }
    for grp in 0..g.groups() {
        al.mark(g.group_first(grp), g.super_area(grp));
    }
}
