//! The resize inode (7), as `ext2fs_create_resize_inode` makes it: its
//! double-indirect block lists the primary reserved GDT blocks, and each
//! of those, used as an indirect block, lists its copies in the backup
//! groups — exactly the layout e2fsck verifies and online resize grows
//! the descriptor table into.

use ext4kit_format::features::compat;
use ext4kit_format::inode::{mode, Inode};

use crate::alloc::Alloc;
use crate::error::Result;
use crate::inode::{set_blocks, set_size};
use crate::plan::Plan;
use crate::writer::Writer;

/// `i_block` slot of the double-indirect block (`EXT2_DIND_BLOCK`).
const DIND_SLOT: usize = 13;

/// The resize inode, or `None` without `resize_inode`. Claims its
/// double-indirect block from the first data block; writes the reserved
/// GDT blocks' lists and zeroes their backups (which `ext2fs_flush`
/// never writes) unless the device reads as zeros.
pub(crate) fn create_resize_inode(plan: &Plan, al: &mut Alloc, w: &mut Writer<'_>) -> Result<Option<Inode>> {
    if !plan.features().has_compat(compat::RESIZE_INODE) {
        return Ok(None);
    }
    let g = plan.geometry();
    let bs = g.block_size();
    let apb = bs / 4;
    let mut cursor = g.first_data_block();
    let dind = al.next(&mut cursor, g.first_data_block())?;
    let mut nblocks = 1u64;
    let mut dind_buf = vec![0u8; bs as usize];
    let backups: Vec<u64> = g.super_groups().filter(|&grp| grp != 0).collect();
    for r in 0..g.reserved_gdt_blocks() {
        let gdt_blk = g.group_first(0) + 1 + g.desc_blocks() + r;
        // The double-indirect block is indexed as the descriptor table
        // would grow: entry (desc_blocks + r) mod (block_size / 4).
        let off = ((g.desc_blocks() + r) % apb) as usize;
        dind_buf[4 * off..4 * off + 4].copy_from_slice(&(gdt_blk as u32).to_le_bytes());
        nblocks += 1;
        let blk = w.block(gdt_blk);
        for (i, &grp) in backups.iter().enumerate().take(apb as usize) {
            let copy = gdt_blk + grp * g.blocks_per_group();
            blk[4 * i..4 * i + 4].copy_from_slice(&(copy as u32).to_le_bytes());
            nblocks += 1;
        }
    }
    if !plan.device_zeroed() {
        for &grp in &backups {
            w.zero_range(g.group_first(grp) + 1 + g.desc_blocks(), g.reserved_gdt_blocks())?;
        }
    }
    *w.block(dind) = dind_buf;
    let mut ri = plan.new_inode(mode::S_IFREG | 0o600, 1)?;
    ri.base.block[4 * DIND_SLOT..4 * DIND_SLOT + 4].copy_from_slice(&(dind as u32).to_le_bytes());
    // i_size covers every block a double-indirect map can reach.
    set_size(&mut ri, (apb * apb + apb + 12) * bs);
    set_blocks(&mut ri, nblocks, bs);
    Ok(Some(ri))
}
