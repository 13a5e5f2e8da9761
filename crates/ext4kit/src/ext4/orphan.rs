//! The orphan list: inodes with no name left that are still open
//! (the kernel's `orphan.c`, classic on-disk form).
//!
//! On disk the list is a chain: `s_last_orphan` in the superblock names the
//! first orphan, and each orphan's `i_dtime` holds the next one's number
//! (0 ends the chain). An unlinked file that is still open goes on the
//! list, so that after a crash the next mount (ours or the kernel's) or
//! e2fsck frees it; the last close takes it off and frees it.
//!
//! The links live in memory too ([`OrphanLinks`], the kernel's
//! `NEXT_ORPHAN` kept in the in-core inode): an orphan stays open and is
//! written back like any file, from its cached record, and that record's
//! `i_dtime` went stale the moment the orphan after it left the list (its
//! link was rewritten on disk only). A writeback then put the removed
//! inode back into the chain: the FUSE stress run found "an orphan is not
//! on the superblock's orphan chain" at a later close, and leaked blocks.
//! Now every record written for an orphan takes its link from memory
//! (`Volume::write_inode`), and a predecessor's link is patched in its
//! inode-table block in one copy-on-write step.
//!
//! Locking: the links' mutex serialises list changes and is held across
//! the block update that writes a link, so a link is never written stale;
//! it is taken before the superblock lock and before block locks. The list
//! is short (open-but-unlinked files), so removal searches it.

use std::collections::HashMap;

use ext4kit_format::inode::Inode;

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Error, Result};

/// Each orphan's successor on the chain (0 ends it). Starts empty: the
/// chain found on disk at open is emptied by recovery before anything is
/// added.
pub type OrphanLinks = parking_lot::Mutex<HashMap<u32, u32>>;

impl Volume {
    /// Put inode `ino` (record `inode`, written here through `h`) at the
    /// head of the orphan list. The superblock reaches the disk at the
    /// caller's next `sync_super`.
    pub fn orphan_add(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut links = self.orphans.lock();
        {
            let mut sb = self.sb.write();
            links.insert(ino, sb.last_orphan);
            inode.base.dtime = sb.last_orphan;
            sb.last_orphan = ino;
        }
        self.write_inode_linked(h, ino, inode, &links)
    }

    /// Take inode `ino` off the orphan list (its `i_dtime` link is cleared
    /// in `inode`, which the caller writes). A predecessor's link is
    /// rewritten through `h`.
    pub fn orphan_remove(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut links = self.orphans.lock();
        let Some(next) = links.remove(&ino) else {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "orphan list",
                "an orphan is not on the superblock's orphan chain",
            ));
        };
        inode.base.dtime = 0;
        {
            let mut sb = self.sb.write();
            if sb.last_orphan == ino {
                sb.last_orphan = next;
                return Ok(());
            }
        }
        let Some(prev) = links.iter().find(|&(_, &n)| n == ino).map(|(&p, _)| p) else {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "orphan list",
                "no orphan links to it and it is not the chain's head",
            ));
        };
        links.insert(prev, next);
        // Patch the predecessor's link in place, whatever its cached record
        // says (that one is corrected whenever it is written: see above).
        let (blk, off) = self.inode_location(prev)?;
        let (n, seed) = (self.inode_size, self.csum_seed);
        h.modify(blk, |d| {
            let mut rec = Inode::parse_raw(&d[off..off + n])
                .map_err(|e| Error::corrupt(format!("inode {prev} (block {blk})"), e))?;
            rec.base.dtime = next;
            d[off..off + n].copy_from_slice(&rec.to_bytes(seed.map(|s| (prev, s))));
            Ok(())
        })
    }

    /// `write_inode` for a caller holding the links: an orphan's record is
    /// written with its current link as `i_dtime`.
    pub(crate) fn write_inode_linked(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        inode: &Inode,
        links: &HashMap<u32, u32>,
    ) -> Result<()> {
        match links.get(&ino) {
            Some(&next) if inode.base.dtime != next => {
                let mut rec = inode.clone();
                rec.base.dtime = next;
                self.write_inode_raw(h, ino, &rec)
            }
            _ => self.write_inode_raw(h, ino, inode),
        }
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
