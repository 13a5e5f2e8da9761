//! The orphan list: inodes with no name left that are still open
//! (the kernel's `orphan.c`, classic on-disk form).
//!
//! On disk the list is a chain: `s_last_orphan` in the superblock names the
//! first orphan, and each orphan's `i_dtime` holds the next one's number
//! (0 ends the chain). An unlinked file that is still open goes on the
//! list, so that after a crash the next mount (ours or the kernel's) or
//! e2fsck frees it; the last close takes it off and frees it.
//!
//! Locking: the superblock's write lock serialises list changes (the list
//! head lives there); callers hold the orphan's inode lock. The list is
//! short (open-but-unlinked files), so removal walks it.

use ext4kit_format::inode::Inode;

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Error, Result};

impl Volume {
    /// Put inode `ino` (record `inode`, written here through `h`) at the
    /// head of the orphan list. The superblock reaches the disk at the
    /// caller's next `sync_super`.
    pub fn orphan_add(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut sb = self.sb.write();
        inode.base.dtime = sb.last_orphan;
        self.write_inode(h, ino, inode)?;
        sb.last_orphan = ino;
        Ok(())
    }

    /// Take inode `ino` off the orphan list (its `i_dtime` link is cleared
    /// in `inode`, which the caller writes). A predecessor's link is
    /// rewritten through `h`.
    pub fn orphan_remove(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut sb = self.sb.write();
        let next = inode.base.dtime;
        inode.base.dtime = 0;
        if sb.last_orphan == ino {
            sb.last_orphan = next;
            return Ok(());
        }
        let mut cur = sb.last_orphan;
        // Bounded walk: a cycle in a damaged chain must not hang us.
        for _ in 0..self.inodes_count {
            if cur == 0 {
                break;
            }
            let mut rec = self.read_inode(cur)?;
            if rec.base.dtime == ino {
                rec.base.dtime = next;
                self.write_inode(h, cur, &rec)?;
                return Ok(());
            }
            cur = rec.base.dtime;
        }
        Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "orphan list",
            "an orphan is not on the superblock's orphan chain",
        ))
    }

    /// The orphan chain, head first (for recovery at open). A chain that
    /// loops, leaves the inode table or names a reserved inode is reported
    /// as corrupt rather than followed.
    pub fn orphan_chain(&self) -> Result<Vec<u32>> {
        let first_ino = self.sb.read().first_ino();
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut cur = self.sb.read().last_orphan;
        while cur != 0 {
            if cur < first_ino || cur > self.inodes_count || !seen.insert(cur) {
                return Err(Error::corrupt_msg(
                    format!("inode {cur}"),
                    "orphan list",
                    "the orphan chain loops or names an invalid inode",
                ));
            }
            out.push(cur);
            cur = self.read_inode(cur)?.base.dtime;
        }
        Ok(out)
    }
}
