//! The orphan list: inodes with no name left that are still open
//! (the kernel's `orphan.c`, classic on-disk form).
//!
//! On disk the list is a chain: `s_last_orphan` in the superblock names the
//! first orphan, and each orphan's `i_dtime` holds the next one's number
//! (0 ends the chain). An unlinked file that is still open goes on the
//! list, so that after a crash the next mount (ours or the kernel's) or
//! e2fsck frees it; the last close takes it off and frees it.
//!
//! The links live in memory too ([`crate::orphan_links::OrphanLinks`], the kernel's
//! `NEXT_ORPHAN` kept in the in-core inode): an orphan stays open and is
//! written back like any file, from its cached record, and that record's
//! `i_dtime` went stale the moment the orphan after it left the list (its
//! link was rewritten on disk only). A writeback then put the removed
//! inode back into the chain: the FUSE stress run found "an orphan is not
//! on the superblock's orphan chain" at a later close, and leaked blocks.
//! Now every record written for an orphan takes its link from memory
//! (`inode::write`), and a predecessor's link is patched in its
//! inode-table block in one copy-on-write step.
//!
//! The orphan file (the `orphan_file` feature) is read and emptied here
//! too, never added to: our orphans use the chain, which every reader also
//! honours.
//!
//! Locking: the links' mutex serialises list changes and is held across
//! the block update that writes a link, so a link is never written stale;
//! it is taken before the superblock lock and before block locks. The list
//! is short (open-but-unlinked files), so removal searches it.

use ext4kit_format::inode::Inode;

use crate::bmap;
use crate::error::{Error, Result};
use crate::inode;
use crate::transaction::Handle;
use crate::volume::Volume;

/// Put inode `ino` (record `rec`, written here through `h`) at the head
/// of the orphan list (the kernel's `ext4_orphan_add`). The superblock
/// reaches the disk at the caller's next `sync_super`. Public: the vfs
/// layer orphans a file unlinked while open (and an O_TMPFILE inode).
pub fn add(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode) -> Result<()> {
    let mut links = vol.orphans().lock();
    {
        let mut sb = vol.sb().write();
        links.insert(ino, sb.last_orphan);
        rec.base.dtime = sb.last_orphan;
        sb.last_orphan = ino;
    }
    if vol.jbd().is_journaled() {
        // The chain's head and the new link in one transaction.
        vol.journal_super(h)?;
    }
    inode::write_linked(vol, h, ino, rec, &links)
}

/// Take inode `ino` off the orphan list (the kernel's `ext4_orphan_del`;
/// its `i_dtime` link is cleared in `rec`, which the caller writes). A
/// predecessor's link is rewritten through `h`. Public: the vfs layer
/// takes an orphan off at its last close, or when it is linked again.
pub fn remove(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode) -> Result<()> {
    let mut links = vol.orphans().lock();
    let Some(next) = links.remove(&ino) else {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "orphan list",
            "an orphan is not on the superblock's orphan chain",
        ));
    };
    rec.base.dtime = 0;
    let was_head = {
        let mut sb = vol.sb().write();
        let head = sb.last_orphan == ino;
        if head {
            sb.last_orphan = next;
        }
        head
    };
    if was_head {
        if vol.jbd().is_journaled() {
            vol.journal_super(h)?;
        }
        return Ok(());
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
    let (blk, off) = inode::location(vol, prev)?;
    let (n, seed) = (vol.geo().inode_size(), vol.geo().csum_seed());
    h.modify(blk, |d| {
        let mut p =
            Inode::parse_raw(&d[off..off + n]).map_err(|e| Error::corrupt(format!("inode {prev} (block {blk})"), e))?;
        p.base.dtime = next;
        d[off..off + n].copy_from_slice(&p.to_bytes(seed.map(|s| (prev, s))));
        Ok(())
    })
}

/// The orphan chain, head first (for recovery at open). A chain that
/// loops, leaves the inode table or names a reserved inode is reported
/// as corrupt rather than followed. Public: the vfs layer empties the
/// chain at a read-write open.
pub fn chain(vol: &Volume) -> Result<Vec<u32>> {
    let first_ino = vol.sb().read().first_ino();
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut cur = vol.sb().read().last_orphan;
    while cur != 0 {
        if cur < first_ino || cur > vol.geo().inodes_count() || !seen.insert(cur) {
            return Err(Error::corrupt_msg(
                format!("inode {cur}"),
                "orphan list",
                "the orphan chain loops or names an invalid inode",
            ));
        }
        out.push(cur);
        cur = inode::read(vol, cur)?.base.dtime;
    }
    Ok(out)
}

/// `EXT4_ORPHAN_BLOCK_MAGIC`: the tail of every orphan-file block.
pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0b10_ca04;
/// Size of an orphan-file block's tail (`struct ext4_orphan_block_tail`:
/// magic, checksum).
const ORPHAN_TAIL: usize = 8;

/// One used slot of the orphan file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanSlot {
    /// Physical block of the orphan file holding the slot.
    pub pblk: u64,
    /// Slot index in the block.
    pub slot: usize,
    /// The orphan inode.
    pub ino: u32,
}

/// The used slots of the orphan file (the `orphan_file` feature,
/// fs/ext4/orphan.c): an inode whose blocks each hold an array of le32
/// inode numbers and a tail `{ob_magic, ob_checksum}`. The kernel puts
/// an orphan there instead of on the `s_last_orphan` chain when the
/// feature is on; we only ever read it (our orphans use the chain, which
/// every reader also honours). A block whose magic is wrong is corrupt.
/// Public: the vfs layer empties the orphan file at a read-write open.
pub fn file_slots(vol: &Volume) -> Result<Vec<OrphanSlot>> {
    let ino = vol.sb().read().orphan_file_inum;
    if !vol.geo().has_compat(ext4kit_format::features::compat::ORPHAN_FILE) || ino == 0 {
        return Ok(Vec::new());
    }
    let inode = inode::read(vol, ino)?;
    let bs = vol.block_size();
    let nblocks = inode.size() / bs as u64;
    let runs = bmap::load(vol, ino, &inode)?.runs(vol, nblocks)?;
    let per_block = (bs - ORPHAN_TAIL) / 4;
    let first_ino = vol.sb().read().first_ino();
    let mut out = Vec::new();
    for (_, p, n) in runs {
        for pblk in p..p + n {
            let buf = vol.buffer(pblk)?;
            let d = &buf.data;
            let magic = u32::from_le_bytes([d[bs - 8], d[bs - 7], d[bs - 6], d[bs - 5]]);
            if magic != ORPHAN_BLOCK_MAGIC {
                return Err(Error::corrupt_msg(
                    format!("orphan file inode {ino}, block {pblk}"),
                    "orphan file block",
                    format!("bad magic {magic:#010x}"),
                ));
            }
            for slot in 0..per_block {
                let o = u32::from_le_bytes([d[slot * 4], d[slot * 4 + 1], d[slot * 4 + 2], d[slot * 4 + 3]]);
                if o == 0 {
                    continue;
                }
                if o < first_ino || o > vol.geo().inodes_count() {
                    return Err(Error::corrupt_msg(
                        format!("orphan file inode {ino}, block {pblk}"),
                        "orphan file block",
                        format!("slot {slot} names inode {o}, which cannot be an orphan"),
                    ));
                }
                out.push(OrphanSlot { pblk, slot, ino: o });
            }
        }
    }
    Ok(out)
}

/// Empty the given orphan-file slots, refreshing each block's checksum
/// (`ext4_orphan_file_block_csum`: crc32c seeded with the orphan file
/// inode's checksum seed, over the le64 block number, then the slots).
pub fn clear_file_slots(vol: &Volume, h: &mut Handle<'_>, slots: &[OrphanSlot]) -> Result<()> {
    let ino = vol.sb().read().orphan_file_inum;
    let generation = inode::read(vol, ino)?.base.generation;
    let seed = vol.geo().inode_seed(ino, generation);
    let bs = vol.block_size();
    let per_block = (bs - ORPHAN_TAIL) / 4;
    let mut blocks: Vec<u64> = slots.iter().map(|s| s.pblk).collect();
    blocks.sort_unstable();
    blocks.dedup();
    for pblk in blocks {
        h.modify(pblk, |d| {
            for s in slots.iter().filter(|s| s.pblk == pblk) {
                d[s.slot * 4..s.slot * 4 + 4].fill(0);
            }
            if let Some(seed) = seed {
                let c = ext4kit_format::checksum::crc32c(seed, &pblk.to_le_bytes());
                let c = ext4kit_format::checksum::crc32c(c, &d[..per_block * 4]);
                d[bs - 4..].copy_from_slice(&c.to_le_bytes());
            }
            Ok(())
        })?;
    }
    Ok(())
}
