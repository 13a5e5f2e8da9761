//! The inode tables: zeroed first (mke2fs's `write_inode_tables` without
//! `lazy_itable_init`, so every table can be marked `ITABLE_ZEROED`), then
//! the records of the reserved inodes written into them, and the inode
//! usage per group that the bitmaps and descriptors report.

use ext4kit_format::inode::Inode;

use crate::error::Result;
use crate::inode::{self, NewInode, FIRST_INO, LPF_INO, ROOT_INO};
use crate::layout::Layout;
use crate::plan::Plan;
use crate::writer::Writer;

/// Zero every inode table, unless the device already reads as zeros.
pub(crate) fn zero_inode_tables(plan: &Plan, layout: &Layout, w: &mut Writer<'_>) -> Result<()> {
    if plan.device_zeroed() {
        return Ok(());
    }
    for &t in layout.inode_tables() {
        w.zero_range(t, plan.geometry().inode_table_blocks())?;
    }
    Ok(())
}

/// The bad-blocks inode (1), as mke2fs's `create_bad_block_inode` leaves
/// it with no bad blocks: an empty record with its times set (but no
/// `i_crtime`, and no `i_extra_isize`).
pub(crate) fn bad_block_inode(plan: &Plan) -> Result<Inode> {
    let mut bad = inode::new_inode(
        plan.geometry().inode_size(),
        NewInode {
            mode: 0,
            links: 0,
            time: plan.identity().now(),
            extra_isize: false,
        },
    )?;
    bad.extra.crtime = 0;
    Ok(bad)
}

/// The inode records mkfs writes, by number.
#[derive(Default)]
pub(crate) struct InodeRecords {
    records: Vec<(u32, Inode)>,
}

impl InodeRecords {
    /// Add the record of inode `ino`.
    pub(crate) fn add(&mut self, ino: u32, inode: Inode) {
        self.records.push((ino, inode));
    }

    /// Write every record into its table block. The reserved inodes no
    /// step made (3..10 but the resize inode and the journal) get empty
    /// records — all zero, with their checksum — as mke2fs's
    /// `reserve_inodes` writes them.
    pub(crate) fn write(mut self, plan: &Plan, layout: &Layout, w: &mut Writer<'_>) -> Result<()> {
        let g = plan.geometry();
        for ino in 3..FIRST_INO {
            if !self.records.iter().any(|(n, _)| *n == ino) {
                let empty = NewInode {
                    mode: 0,
                    links: 0,
                    time: 0,
                    extra_isize: false,
                };
                self.records.push((ino, inode::new_inode(g.inode_size(), empty)?));
            }
        }
        self.records.sort_by_key(|(n, _)| *n);
        let bs = g.block_size();
        for (ino, inode) in &self.records {
            let byte = g.inode_index(*ino) * g.inode_size();
            let blk = layout.inode_table(g.inode_group(*ino)) + byte / bs;
            let off = (byte % bs) as usize;
            let rec = inode.to_bytes(plan.checksums().inode_record(*ino));
            w.block(blk)[off..off + rec.len()].copy_from_slice(&rec);
        }
        Ok(())
    }
}

/// Inodes in use per group on the new filesystem: the reserved inodes
/// 1..10 and lost+found (11), of which root and lost+found are
/// directories.
pub(crate) struct InodeUsage {
    used: Vec<u64>,
    high_water: Vec<u64>,
    dirs: Vec<u64>,
}

impl InodeUsage {
    /// The usage of a freshly made filesystem.
    pub(crate) fn new_fs(plan: &Plan) -> Self {
        let g = plan.geometry();
        let n = g.groups() as usize;
        let mut u = InodeUsage {
            used: vec![0; n],
            high_water: vec![0; n],
            dirs: vec![0; n],
        };
        for ino in (1..FIRST_INO).chain([LPF_INO]) {
            let grp = g.inode_group(ino);
            u.used[grp] += 1;
            u.high_water[grp] = u.high_water[grp].max(g.inode_index(ino) + 1);
        }
        u.dirs[g.inode_group(LPF_INO)] += 1;
        u.dirs[g.inode_group(ROOT_INO)] += 1;
        u
    }

    /// Inodes in use in group `grp`.
    pub(crate) fn used(&self, grp: usize) -> u64 {
        self.used[grp]
    }

    /// One past the last used inode index of group `grp`: the table
    /// entries from there on have never been used (`bg_itable_unused`).
    pub(crate) fn high_water(&self, grp: usize) -> u64 {
        self.high_water[grp]
    }

    /// Directories in group `grp` (`bg_used_dirs_count`).
    pub(crate) fn dirs(&self, grp: usize) -> u64 {
        self.dirs[grp]
    }
}
