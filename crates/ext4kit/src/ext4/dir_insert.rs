//! Adding names to directories (the insert half of the kernel's `namei.c`).
//!
//! A new entry goes into the first record with enough slack (`rec_len`
//! minus the space its own name needs) — in any block of a linear
//! directory, or in the one leaf the hash selects in an indexed directory
//! (seed 004: inserting never scans an indexed directory). The block's
//! checksum tail is refreshed in the same handle.
//!
//! Growing a directory by a block, and splitting full htree leaves, come
//! with the block allocator: until then a full directory answers ENOSPC
//! with a message saying so.

use ext4kit_format::dirent::{self, rec_len_for, DirFormat, NAME_MAX};
use ext4kit_format::inode::FileType;

use super::bmap::{BlockMap, Mapping};
use super::dir::DirRef;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Try to place an entry in one block's records; returns whether it fit.
fn insert_in_block(d: &mut [u8], limit: usize, fmt: DirFormat, name: &[u8], ino: u32, ft: u8) -> bool {
    let need = rec_len_for(name.len());
    let mut off = 0;
    while off + dirent::DIRENT_HEADER <= limit {
        let e = dirent::entry_at(d, off, fmt);
        if e.rec_len < dirent::DIRENT_HEADER {
            return false;
        }
        let used = if e.inode == 0 { 0 } else { rec_len_for(e.name.len()) };
        if e.rec_len >= used + need {
            let rec = e.rec_len;
            if e.inode == 0 {
                dirent::write_entry(d, off, ino, rec, name, ft, fmt);
            } else {
                let (oi, on, oft) = (e.inode, e.name.to_vec(), e.file_type);
                dirent::write_entry(d, off, oi, used, &on, oft, fmt);
                dirent::write_entry(d, off + used, ino, rec - used, name, ft, fmt);
            }
            return true;
        }
        off += e.rec_len;
    }
    false
}

impl Volume {
    /// Find the directory block a new entry `name` will go in, without
    /// changing anything: callers look for room *before* allocating, so a
    /// full directory fails cleanly with nothing to undo. The caller holds
    /// the directory's inode lock, so the room cannot vanish before
    /// [`Volume::add_link_at`].
    pub fn find_dir_slot(&self, dir: DirRef<'_>, name: &[u8]) -> Result<u64> {
        if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0) {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("invalid name {:?}", String::from_utf8_lossy(name)),
            ));
        }
        if matches!(dir.map, BlockMap::Inline(_)) {
            return Err(Error::Unsupported(format!(
                "adding entries to inline-data directory inode {} is not supported yet",
                dir.ino
            )));
        }
        let fmt = self.dir_format();
        let candidates: Vec<u64> = if dir.is_indexed(self) {
            vec![self.dx_leaf_for(dir, name)?]
        } else {
            let n = dir.nblocks(self);
            dir.map
                .runs(self, n)?
                .into_iter()
                .flat_map(|(l, _, len)| l..l + len)
                .collect()
        };
        let limit = if self.csum_seed.is_some() {
            self.block_size - dirent::TAIL_SIZE
        } else {
            self.block_size
        };
        for lblk in candidates {
            let Some(buf) = self.dir_leaf(dir, lblk)? else { continue };
            let mut copy = buf.data.to_vec();
            if insert_in_block(&mut copy, limit, fmt, name, 1, 0) {
                return Ok(lblk);
            }
        }
        Err(Error::posix(
            Errno::ENOSPC,
            format!(
                "directory inode {} has no room for another entry (growing directories is not supported yet)",
                dir.ino
            ),
        ))
    }

    /// Add `name` → `ino` in directory block `lblk` (found by
    /// [`Volume::find_dir_slot`] under the same directory lock).
    pub fn add_link_at(
        &self,
        h: &mut Handle<'_>,
        dir: DirRef<'_>,
        lblk: u64,
        name: &[u8],
        ino: u32,
        ft: FileType,
    ) -> Result<()> {
        let fmt = self.dir_format();
        let ftb = if fmt.filetype { ft.to_dirent() } else { 0 };
        let seed = self.inode_seed(dir.ino, dir.inode.base.generation);
        let pblk = match dir.map.map(self, lblk)? {
            Mapping::Mapped { pblk, .. } => pblk,
            Mapping::Hole { .. } => {
                return Err(Error::corrupt_msg(
                    format!("directory inode {}", dir.ino),
                    "block map",
                    "slot in a hole",
                ))
            }
        };
        let limit = if seed.is_some() {
            self.block_size - dirent::TAIL_SIZE
        } else {
            self.block_size
        };
        let placed = h.modify(pblk, |d| {
            if !insert_in_block(d, limit, fmt, name, ino, ftb) {
                return Ok(false);
            }
            if let Some(s) = seed {
                dirent::set_tail_checksum(d, s);
            }
            Ok(true)
        })?;
        if !placed {
            return Err(Error::posix(
                Errno::EIO,
                format!("directory inode {} block {lblk} lost its free slot", dir.ino),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_uses_slack_and_keeps_the_chain_valid() {
        let fmt = DirFormat {
            block_size: 1024,
            filetype: true,
        };
        let mut b = vec![0u8; 1024];
        dirent::write_entry(&mut b, 0, 2, 12, b".", 2, fmt);
        dirent::write_entry(&mut b, 12, 2, 1012, b"..", 2, fmt);
        // "name-NNN" needs 16 bytes: (1024 - 12 - 12) / 16 = 62 fit.
        for i in 0..100u32 {
            let name = format!("name-{i:03}");
            let fit = insert_in_block(&mut b, 1024, fmt, name.as_bytes(), 100 + i, 1);
            dirent::check_block(&b, fmt, None).unwrap();
            if !fit {
                assert_eq!(i, 62, "ran out at {i}");
                return;
            }
        }
        panic!("a 1 KiB block cannot hold 100 such names");
    }
}
