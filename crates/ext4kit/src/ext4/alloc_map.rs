//! Giving an empty inode its data blocks: allocate runs (goal: right after
//! the inode's own group start, then after the previous run, so a file is
//! contiguous when space allows), write the data, and record the runs in
//! the inode's block map — extents in the `i_block` root (up to four runs)
//! or direct + single-indirect pointers on ext2/ext3 images (which never
//! gain the extent feature).
//!
//! Data blocks are written to the device before the handle commits the
//! metadata that points at them (ordered mode), so a crash never exposes a
//! block map pointing at stale data. Deeper extent trees and double/triple
//! indirect maps arrive with the full write path.

use ext4kit_format::extent::{Extent, ExtentHeader, ExtentNode, NodeEntries, EXTENT_MAGIC};
use ext4kit_format::indirect;
use ext4kit_format::inode::{flags, Inode};

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

impl Volume {
    /// Store `data` as the contents of `inode` (number `ino`), which must
    /// have no blocks yet. Updates size, block map and `i_blocks` in
    /// `inode`; the caller writes the inode through the same handle.
    pub fn write_new_data(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, data: &[u8]) -> Result<()> {
        if inode.size() != 0 || inode.base.blocks_lo != 0 {
            return Err(Error::posix(Errno::EINVAL, format!("inode {ino} already has data")));
        }
        let bs = self.block_size;
        let nblocks = data.len().div_ceil(bs) as u64;
        let extents = inode.base.flags & flags::EXTENTS != 0;
        let max_blocks = if extents {
            u64::MAX
        } else {
            (indirect::DIRECT + bs / 4) as u64
        };
        if nblocks > max_blocks {
            return Err(Error::Unsupported(format!(
                "files over {} blocks on a non-extent filesystem need double-indirect maps (not yet)",
                max_blocks
            )));
        }
        // Allocate every run first (no data written yet, nothing to undo on
        // failure except the allocations, which are given back).
        let g = ((ino - 1) / self.inodes_per_group) as u64;
        let mut goal = self.group_first_block(g);
        let mut runs: Vec<(u64, u64, u32)> = Vec::new(); // (logical, physical, len)
        let mut done = 0u64;
        let mut failure = None;
        while done < nblocks {
            let want = (nblocks - done).min(32768) as u32;
            match self.alloc_blocks(h, goal, want) {
                Ok((p, n)) => {
                    if let Some(last) = runs.last_mut() {
                        if last.1 + last.2 as u64 == p && last.2 as u64 + n as u64 <= 32768 {
                            last.2 += n;
                            done += n as u64;
                            goal = p + n as u64;
                            continue;
                        }
                    }
                    runs.push((done, p, n));
                    done += n as u64;
                    goal = p + n as u64;
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            if extents && runs.len() > 4 {
                failure = Some(Error::Unsupported(
                    "data too fragmented for an extent root (trees come next)".into(),
                ));
                break;
            }
        }
        let mut ind_block = None;
        if failure.is_none() && !extents && nblocks > indirect::DIRECT as u64 {
            match self.alloc_blocks(h, goal, 1) {
                Ok((p, _)) => ind_block = Some(p),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            for &(_, p, n) in &runs {
                self.free_blocks(h, p, n)?;
            }
            return Err(e);
        }
        // Data first (ordered mode), in one write per run.
        for &(l, p, n) in &runs {
            let start = l as usize * bs;
            let end = (start + n as usize * bs).min(data.len());
            let mut buf = data[start..end].to_vec();
            buf.resize(n as usize * bs, 0);
            self.write_raw(p, &buf)?;
        }
        let mut blocks_used = nblocks;
        if extents {
            let ext: Vec<Extent> = runs
                .iter()
                .map(|&(l, p, n)| Extent::new(l as u32, n, p, false))
                .collect();
            let node = ExtentNode {
                header: ExtentHeader {
                    magic: EXTENT_MAGIC,
                    entries: ext.len() as u16,
                    max: 4,
                    depth: 0,
                    generation: 0,
                },
                entries: NodeEntries::Leaf(ext),
            };
            inode.base.block = [0; 60];
            node.serialize_into(&mut inode.base.block);
        } else {
            let mut ptrs: Vec<u32> = Vec::with_capacity(nblocks as usize);
            for &(_, p, n) in &runs {
                ptrs.extend((0..n as u64).map(|k| (p + k) as u32));
            }
            let mut root = [0u8; 60];
            for (i, &p) in ptrs.iter().take(indirect::DIRECT).enumerate() {
                root[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
            }
            if let Some(ib) = ind_block {
                let mut b = vec![0u8; bs];
                for (i, &p) in ptrs.iter().skip(indirect::DIRECT).enumerate() {
                    b[4 * i..4 * i + 4].copy_from_slice(&p.to_le_bytes());
                }
                h.overwrite(ib, b.into_boxed_slice())?;
                root[4 * indirect::IND..4 * indirect::IND + 4].copy_from_slice(&(ib as u32).to_le_bytes());
                blocks_used += 1;
            }
            inode.base.block = root;
        }
        let size = data.len() as u64;
        inode.base.size_lo = size as u32;
        inode.base.size_high = (size >> 32) as u32;
        let sectors = blocks_used * (bs as u64 / 512);
        inode.base.blocks_lo = sectors as u32;
        inode.base.blocks_high = (sectors >> 32) as u16;
        Ok(())
    }
}
