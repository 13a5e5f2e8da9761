//! The journal inode (8), as `ext2fs_add_journal_inode3` makes it for
//! ext3/ext4: `ext2fs_default_journal_size` blocks, placed from the first
//! block of the emptiest group around the middle of the filesystem
//! (`get_midpoint_journal_block`), mapped by extents (ext4) or indirect
//! blocks (ext3), and backed up in `s_jnl_blocks`. Its superblock is v2
//! with an empty log; `64BIT` and `CSUM_V3` are set when the filesystem is
//! 64bit / metadata_csum (mke2fs leaves them for the kernel to set at
//! mount).

use ext4kit_format::features::incompat;
use ext4kit_format::inode::{flags as iflags, mode, Inode};
use ext4kit_format::jbd2::{self, JournalSuperblock};

use crate::alloc::Alloc;
use crate::error::Result;
use crate::file_map::{FileMap, FileMapRequest};
use crate::inode::{set_blocks, set_size, JOURNAL_INO};
use crate::layout::LOG_GROUPS_PER_FLEX;
use crate::plan::Plan;
use crate::writer::Writer;

/// The journal inode and its `s_jnl_blocks` backup.
pub(crate) struct JournalInode {
    inode: Inode,
    backup: [u32; 17],
}

impl JournalInode {
    /// The inode record.
    pub(crate) fn into_inode(self) -> Inode {
        self.inode
    }

    /// `s_jnl_blocks`: `i_block` word for word, then `i_size_high` and
    /// `i_size` (so e2fsck can rebuild a damaged journal inode).
    pub(crate) fn backup(&self) -> [u32; 17] {
        self.backup
    }
}

/// The journal, or `None` without one. Its data blocks are zeroed unless
/// the device reads as zeros; the first holds the journal superblock.
pub(crate) fn add_journal_inode(plan: &Plan, al: &mut Alloc, w: &mut Writer<'_>) -> Result<Option<JournalInode>> {
    let blocks = plan.journal_blocks();
    if blocks == 0 {
        return Ok(None);
    }
    let g = plan.geometry();
    let bs = g.block_size();
    let extents = plan.extents();
    // Block-mapped journals (ext3) go where libext2fs's bmap allocator
    // puts them: from the start of the filesystem.
    let goal = if extents {
        g.group_first(midpoint_group(plan, al))
    } else {
        g.first_data_block()
    };
    let map = FileMap::build(
        al,
        g,
        &FileMapRequest {
            blocks,
            goal,
            extents,
            checksum_seed: plan.checksums().inode_seed(JOURNAL_INO),
        },
    )?;
    if !plan.device_zeroed() {
        w.zero_runs(map.data())?;
    }
    w.block(map.data()[0])[..jbd2::SUPERBLOCK_SIZE].copy_from_slice(&journal_superblock(plan));
    let mut ji = plan.new_inode(mode::S_IFREG | 0o600, 1)?;
    ji.base.block = map.i_block();
    set_size(&mut ji, blocks * bs);
    set_blocks(&mut ji, map.total(), bs);
    if extents {
        ji.base.flags |= iflags::EXTENTS;
    }
    map.write_meta(w);
    let mut backup = [0u32; 17];
    for (i, v) in backup.iter_mut().take(15).enumerate() {
        let b = &ji.base.block[4 * i..4 * i + 4];
        *v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    backup[15] = ji.base.size_high;
    backup[16] = ji.base.size_lo;
    Ok(Some(JournalInode { inode: ji, backup }))
}

/// `get_midpoint_journal_block`: the group holding the middle of the
/// filesystem (with `flex_bg`, past the first flex group: the first group
/// with free blocks from the start of its flex group); then, of the groups
/// from there (from the one before it, without `flex_bg`) to the next, the
/// one with the most free blocks, the first on a tie.
fn midpoint_group(plan: &Plan, al: &Alloc) -> u64 {
    let g = plan.geometry();
    let free_in = |grp: u64| g.blocks_in_group(grp) - al.count_used(g.group_first(grp), g.blocks_in_group(grp));
    let mut grp = ((g.blocks() - g.first_data_block()) / 2).saturating_sub(g.first_data_block()) / g.blocks_per_group();
    let log_flex = 1u64 << LOG_GROUPS_PER_FLEX;
    let start;
    if plan.features().has_incompat(incompat::FLEX_BG) && grp > log_flex {
        grp &= !(log_flex - 1);
        while grp < g.groups() && free_in(grp) == 0 {
            grp += 1;
        }
        if grp == g.groups() {
            grp = 0;
        }
        start = grp;
    } else {
        start = grp.saturating_sub(1);
    }
    let end = if grp + 1 < g.groups() { grp + 1 } else { grp };
    let mut best = start;
    for i in start + 1..=end {
        if free_in(i) > free_in(best) {
            best = i;
        }
    }
    best
}

/// The journal superblock: v2, an empty log (`s_start = 0`), the UUID of
/// the filesystem; `64BIT` with `64bit`, `CSUM_V3` with `metadata_csum`.
fn journal_superblock(plan: &Plan) -> Vec<u8> {
    let mut jinc = 0;
    if plan.features().has_incompat(incompat::BIT64) {
        jinc |= jbd2::features::INCOMPAT_64BIT;
    }
    if plan.checksums().metadata() {
        jinc |= jbd2::features::INCOMPAT_CSUM_V3;
    }
    let jsb = JournalSuperblock::new_internal(
        plan.geometry().block_size() as u32,
        plan.journal_blocks() as u32,
        plan.identity().uuid(),
        jinc,
    );
    jsb.to_bytes_with_checksum()
}
