//! The write-out step, in `ext2fs_flush`'s order: everything else first,
//! then the descriptor table copies, then the superblocks, primary last —
//! until then the device holds no valid filesystem (an old one's primary
//! superblock is gone only at the end).

use ext4kit_format::superblock::{Superblock, STATE_VALID};

use crate::error::Result;
use crate::groups::DescriptorTable;
use crate::plan::Plan;
use crate::writer::Writer;

/// Write the collected blocks (with 1 KiB blocks, the boot block as
/// zeros), the descriptor table after each superblock copy, and the
/// superblock copies from the last group down to the primary. Each copy
/// carries its `s_block_group_nr`; the backups have `s_state` without
/// `VALID`, so a fsck that has to fall back on one checks everything.
/// `s_kbytes_written` counts everything this run writes, superblocks
/// included.
pub(crate) fn write_out(plan: &Plan, w: &mut Writer<'_>, gdt: &DescriptorTable, mut sb: Superblock) -> Result<()> {
    let g = plan.geometry();
    let bs = g.block_size();
    if g.first_data_block() == 1 {
        w.block(0);
    }
    w.write_blocks()?;
    let sb_groups: Vec<u64> = g.super_groups().collect();
    for &grp in &sb_groups {
        let first = g.group_first(grp);
        for k in 0..g.desc_blocks() {
            let off = (k * bs) as usize;
            w.write_now(first + 1 + k, &gdt.bytes()[off..off + bs as usize])?;
        }
    }
    sb.kbytes_written = (w.written() + sb_groups.len() as u64 * bs) / 1024;
    for &grp in sb_groups.iter().rev() {
        let mut s = sb;
        s.block_group_nr = grp as u16;
        if grp != 0 {
            s.state &= !STATE_VALID;
        }
        // The primary sits at byte 1024: inside block 0 for larger blocks.
        let mut blk = vec![0u8; bs as usize];
        let off = if grp == 0 && bs > 1024 { 1024 } else { 0 };
        blk[off..off + 1024].copy_from_slice(&s.to_bytes_with_checksum());
        w.write_now(g.group_first(grp), &blk)?;
    }
    w.flush()
}
