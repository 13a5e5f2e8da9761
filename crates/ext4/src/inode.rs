//! Inode records in the inode tables: where a record is, reading and
//! verifying it, writing it through a handle, and the record fields that
//! are derived from what the inode holds (`i_blocks`, the fast-symlink
//! test).
//!
//! Inode `n` lives in group `(n-1) / s_inodes_per_group` at index
//! `(n-1) % s_inodes_per_group` of that group's table. On checksummed
//! filesystems a group flagged INODE_UNINIT, or an index beyond
//! `bg_itable_unused`, holds no valid inode: the table may be garbage.

use std::collections::HashMap;

use ext4kit_format::features::ro_compat;
use ext4kit_format::group_desc::BG_INODE_UNINIT;
use ext4kit_format::inode::{flags, Inode};

use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// The root directory's inode number.
pub const ROOT_INO: u32 = 2;

/// Read and verify inode `ino` (the kernel's `__ext4_iget`: the record,
/// its checksum, and a refusal of records in a group's unused table part).
/// Public: the vfs layer reads every inode it caches through it.
pub fn read(vol: &Volume, ino: u32) -> Result<Inode> {
    let geo = vol.geo();
    if ino == 0 || ino > geo.inodes_count() {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "inode number",
            format!("outside 1..={}", geo.inodes_count()),
        ));
    }
    let idx = ino - 1;
    let g = (idx / geo.inodes_per_group()) as usize;
    let i = idx % geo.inodes_per_group();
    let group = vol.groups().get(g).ok_or_else(|| {
        Error::corrupt_msg(
            format!("inode {ino}"),
            "inode number",
            format!("group {g} does not exist"),
        )
    })?;
    let gd = *group.desc().read();
    if geo.has_ro_compat(ro_compat::GDT_CSUM | ro_compat::METADATA_CSUM)
        && (gd.flags & BG_INODE_UNINIT != 0 || i >= geo.inodes_per_group().saturating_sub(gd.itable_unused()))
    {
        return Err(Error::posix(
            Errno::EUCLEAN,
            format!("inode {ino} is in the unused part of group {g}'s inode table (a directory entry points at a free inode)"),
        ));
    }
    let off = i as u64 * geo.inode_size() as u64;
    let blk = gd.inode_table() + off / vol.block_size() as u64;
    let within = (off % vol.block_size() as u64) as usize;
    let buf = vol
        .buffer(blk)
        .map_err(|e| super::error::annotate(e, &format!("inode table of group {g}")))?;
    vol.stats().count_inode_read();
    Inode::parse(&buf.data[within..within + geo.inode_size()], ino, geo.csum_seed())
        .map_err(|e| Error::corrupt(format!("inode {ino} (block {blk})"), e))
}

/// Where inode `ino`'s record is: (block, byte offset in it).
pub(crate) fn location(vol: &Volume, ino: u32) -> Result<(u64, usize)> {
    let geo = vol.geo();
    if ino == 0 || ino > geo.inodes_count() {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "inode number",
            "out of range",
        ));
    }
    let idx = ino - 1;
    let g = (idx / geo.inodes_per_group()) as usize;
    let i = idx % geo.inodes_per_group();
    let table = vol.groups()[g].inode_table();
    let off = i as u64 * geo.inode_size() as u64;
    Ok((
        table + off / vol.block_size() as u64,
        (off % vol.block_size() as u64) as usize,
    ))
}

/// Write inode `ino` (its checksum refreshed) through the handle. An
/// inode with no links may be an orphan: then its `i_dtime` is the chain
/// link kept in memory (`orphan.rs`), written under the links' mutex so
/// that it cannot go stale on the way. Public: every change the vfs layer
/// makes to a record reaches the disk through it.
pub fn write(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &Inode) -> Result<()> {
    if rec.base.links_count == 0 {
        let links = vol.orphans().lock();
        if links.contains_key(&ino) {
            return write_linked(vol, h, ino, rec, &links);
        }
    }
    write_raw(vol, h, ino, rec)
}

/// [`write`] for a caller holding the orphan links (`links`): an orphan's
/// record is written with its current link as `i_dtime`.
pub(crate) fn write_linked(
    vol: &Volume,
    h: &mut Handle<'_>,
    ino: u32,
    rec: &Inode,
    links: &HashMap<u32, u32>,
) -> Result<()> {
    match links.get(&ino) {
        Some(&next) if rec.base.dtime != next => {
            let mut linked = rec.clone();
            linked.base.dtime = next;
            write_raw(vol, h, ino, &linked)
        }
        _ => write_raw(vol, h, ino, rec),
    }
}

/// Write inode `ino` exactly as given (`i_dtime` included).
pub(crate) fn write_raw(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &Inode) -> Result<()> {
    let (blk, off) = location(vol, ino)?;
    // The last line behind the operations' own checks: never into an
    // inode-table block another inode's map names (`owner_scan.rs`).
    vol.owner_map().check_record(ino, blk)?;
    let n = vol.geo().inode_size();
    if rec.record_len() != n {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("inode {ino}: record of {} bytes", rec.record_len()),
        ));
    }
    vol.stats().count_inode_write();
    let csum = vol.geo().csum_seed().map(|s| (ino, s));
    h.modify(blk, |d| {
        rec.write_into(&mut d[off..off + n], csum);
        Ok(())
    })
}

/// The kernel's `ext4_inode_is_fast_symlink`: no data blocks besides a
/// possible xattr block, and a target that fits in `i_block`. Such a
/// link's `i_block` holds text, never block numbers.
pub(crate) fn is_fast_symlink(vol: &Volume, rec: &Inode) -> bool {
    if rec.has_inline_data() {
        return false;
    }
    let huge = vol.geo().has_ro_compat(ro_compat::HUGE_FILE);
    let ea_blocks = if rec.file_acl() != 0 {
        (vol.block_size() / 512) as u64
    } else {
        0
    };
    rec.blocks_512(huge, vol.block_size() as u32) <= ea_blocks && rec.size() < 60
}

/// `i_blocks += n` filesystem blocks. `i_blocks` counts 512-byte sectors,
/// or filesystem blocks when the inode carries EXT4_HUGE_FILE_FL
/// (`ext4_inode_blocks_set`); we never set that flag but keep its unit on
/// inodes that have it. `blocks_high` only has a meaning with the
/// huge_file feature, which is the only way a file reaches 2^32 sectors.
pub(crate) fn add_blocks(rec: &mut Inode, n: u64, bs: usize) {
    let cur = rec.base.blocks();
    rec.base.set_blocks(cur + n * block_unit(rec, bs));
}

/// `i_blocks -= n` filesystem blocks (see [`add_blocks`]), never below 0.
pub(crate) fn sub_blocks(rec: &mut Inode, n: u64, bs: usize) {
    let cur = rec.base.blocks();
    rec.base.set_blocks(cur.saturating_sub(n * block_unit(rec, bs)));
}

/// One filesystem block in `i_blocks` units.
fn block_unit(rec: &Inode, bs: usize) -> u64 {
    if rec.base.flags & flags::HUGE_FILE != 0 {
        1
    } else {
        bs as u64 / 512
    }
}
