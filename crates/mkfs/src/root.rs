//! The root directory (2) and lost+found (11), as mke2fs's
//! `create_root_dir` and `create_lost_and_found` make them: root one block
//! holding `.`, `..` and `lost+found`; lost+found enough empty blocks for
//! e2fsck to reconnect files into without allocating. Directory blocks end
//! in a checksum tail with `metadata_csum`.

use ext4kit_format::dirent;
use ext4kit_format::inode::{flags as iflags, mode, Inode};

use crate::alloc::Alloc;
use crate::error::Result;
use crate::file_map::{FileMap, FileMapRequest};
use crate::inode::{set_blocks, set_size, LPF_INO, ROOT_INO};
use crate::plan::Plan;
use crate::writer::Writer;

/// lost+found's size in blocks: grown until it holds 16 KiB and at least
/// two blocks, at most 12 (the direct blocks), as
/// `create_lost_and_found` expands it.
pub(crate) fn lost_and_found_blocks(bs: u64) -> u64 {
    let mut n = 1u64;
    while n < 12 {
        let size = n * bs;
        if size >= 16 * 1024 && size >= 2 * bs {
            break;
        }
        n += 1;
    }
    n
}

/// A directory's blocks, mapped from the first data block.
fn directory_map(plan: &Plan, al: &mut Alloc, ino: u32, blocks: u64) -> Result<FileMap> {
    let g = plan.geometry();
    FileMap::build(
        al,
        g,
        &FileMapRequest {
            blocks,
            goal: g.first_data_block(),
            extents: plan.extents(),
            checksum_seed: plan.checksums().inode_seed(ino),
        },
    )
}

/// Seal a directory block: the checksum tail, with `metadata_csum`.
fn seal(plan: &Plan, ino: u32, blk: &mut [u8]) {
    if let Some(s) = plan.checksums().inode_seed(ino) {
        dirent::init_tail(blk);
        dirent::set_tail_checksum(blk, s);
    }
}

/// The inode of a directory of `blocks` blocks mapped by `map`.
fn directory_inode(plan: &Plan, perm: u16, links: u16, map: &FileMap) -> Result<Inode> {
    let bs = plan.geometry().block_size();
    let mut d = plan.new_inode(mode::S_IFDIR | perm, links)?;
    d.base.block = map.i_block();
    set_size(&mut d, map.data().len() as u64 * bs);
    set_blocks(&mut d, map.total(), bs);
    if plan.extents() {
        d.base.flags |= iflags::EXTENTS;
    }
    Ok(d)
}

/// Root: one block with `.`, `..` (itself) and `lost+found`, mode 0755,
/// three links (`.`, `..`, and lost+found's `..`).
pub(crate) fn create_root_dir(plan: &Plan, al: &mut Alloc, w: &mut Writer<'_>) -> Result<Inode> {
    let map = directory_map(plan, al, ROOT_INO, 1)?;
    let dfmt = plan.dir_format();
    let end = plan.geometry().block_size() as usize - plan.dir_tail();
    let blk = w.block(map.data()[0]);
    dirent::write_entry(blk, 0, ROOT_INO, 12, b".", 2, dfmt);
    dirent::write_entry(blk, 12, ROOT_INO, 12, b"..", 2, dfmt);
    dirent::write_entry(blk, 24, LPF_INO, end - 24, b"lost+found", 2, dfmt);
    seal(plan, ROOT_INO, blk);
    let root = directory_inode(plan, 0o755, 3, &map)?;
    map.write_meta(w);
    Ok(root)
}

/// lost+found: [`lost_and_found_blocks`] blocks, the first holding `.` and
/// `..` (root), the rest one empty entry each; mode 0700, two links.
pub(crate) fn create_lost_and_found(plan: &Plan, al: &mut Alloc, w: &mut Writer<'_>) -> Result<Inode> {
    let blocks = lost_and_found_blocks(plan.geometry().block_size());
    let map = directory_map(plan, al, LPF_INO, blocks)?;
    let dfmt = plan.dir_format();
    let end = plan.geometry().block_size() as usize - plan.dir_tail();
    for (i, &b) in map.data().iter().enumerate() {
        let blk = w.block(b);
        if i == 0 {
            dirent::write_entry(blk, 0, LPF_INO, 12, b".", 2, dfmt);
            dirent::write_entry(blk, 12, ROOT_INO, end - 12, b"..", 2, dfmt);
        } else {
            dirent::write_entry(blk, 0, 0, end, b"", 0, dfmt);
        }
        seal(plan, LPF_INO, blk);
    }
    let lpf = directory_inode(plan, 0o700, 2, &map)?;
    map.write_meta(w);
    Ok(lpf)
}
