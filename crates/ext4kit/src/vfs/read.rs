//! Reading file data through the page cache (the kernel's
//! `filemap_read`), and SEEK_DATA / SEEK_HOLE.
//!
//! Readers take no lock. A read copies straight out of the cached pages
//! under the page map's epoch guard, zero-fills holes and unwritten
//! extents without caching them, and fills the cache from the device in
//! runs of up to `MAX_READ_RUN` blocks. A page read from disk is
//! inserted only if nothing on the write side changed since the miss
//! began (`PageMap::miss`, `PageMap::insert_clean_at`): a clean, drop or
//! remap meanwhile voids what was read, and the step is redone.

use std::sync::Arc;

use ext4kit_format::inode::FileType;

use super::icache::CachedInode;
use super::pagecache::Page;
use super::super_block::SuperBlock;
use super::writeback::{self, SyncLevel};
use crate::error::{Errno, Error, Result};
use crate::ext4::{BlockMap, Mapping};

/// Largest single device read when filling the page cache (blocks).
const MAX_READ_RUN: u64 = 256;

/// Read file data at `off` through the page cache ([`Fs::read_at`](crate::Fs::read_at)).
pub(crate) fn read_at(sb: &SuperBlock, inode: &CachedInode, off: u64, buf: &mut [u8]) -> Result<usize> {
    match inode.ftype {
        FileType::Regular => {}
        FileType::Directory => {
            return Err(Error::posix(
                Errno::EISDIR,
                format!("inode {} is a directory", inode.ino),
            ))
        }
        _ => {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("inode {} is not a regular file", inode.ino),
            ))
        }
    }
    let size = inode.size();
    if off >= size || buf.is_empty() {
        return Ok(0);
    }
    let want = ((size - off).min(buf.len() as u64)) as usize;
    // The miss begins before the map is loaded: a change to either
    // after this point is seen by the rechecks below (PageMap's `dirty`).
    let mut miss = inode.pages.miss();
    // The map is loaded at the first page-cache miss: a read served
    // from cached pages never touches it (a loaded map is an `Arc`
    // clone, a write to a count every reader of the file shares — the
    // `storm` benchmark reads small cached files). Loaded after `miss`,
    // as the rechecks require.
    let mut map: Option<Arc<BlockMap>> = None;
    let bs = sb.vol().block_size() as u64;
    let mut done = 0usize;
    while done < want {
        let pos = off + done as u64;
        let lblk = pos / bs;
        let in_blk = (pos % bs) as usize;
        let n = (bs as usize - in_blk).min(want - done);
        // Copy straight out of the cached page under the map's epoch
        // guard: no reference count is touched on the shared page. A
        // dirty page is found here too, before the block map is asked:
        // with delayed allocation its block may still be a hole.
        if inode
            .pages
            .with(lblk, |p| buf[done..done + n].copy_from_slice(&p[in_blk..in_blk + n]))
            .is_some()
        {
            done += n;
            continue;
        }
        let blocks_left = (off + want as u64).div_ceil(bs) - lblk;
        let m = match map.take() {
            Some(m) => m,
            None => {
                let m = inode.block_map(sb.vol())?;
                if let BlockMap::Inline(data) = &*m {
                    // Inline data is never in the page cache.
                    let end = (pos as usize + want - done).min(data.len());
                    let start = (pos as usize).min(end);
                    buf[done..done + end - start].copy_from_slice(&data[start..end]);
                    buf[done + end - start..want].fill(0);
                    return Ok(want);
                }
                m
            }
        };
        let mapping = m.map(sb.vol(), lblk)?;
        map = Some(m);
        match mapping {
            Mapping::Hole { len } | Mapping::Mapped { len, uninit: true, .. } => {
                // Zero-fill the hole directly; nothing is cached. Stop
                // at the next dirty page (delayed allocation: data the
                // map does not know about yet).
                let mut span = len.min(blocks_left);
                if let Some(d) = inode.pages.first_dirty_in(lblk + 1, lblk.saturating_add(span)) {
                    span = d - lblk;
                }
                let bytes = ((span * bs) as usize - in_blk).min(want - done);
                buf[done..done + bytes].fill(0);
                if !inode.pages.unchanged(&miss) {
                    // Written back (and maybe evicted) or remapped
                    // meanwhile: redo this step with the current map.
                    miss = inode.pages.miss();
                    map = None;
                    continue;
                }
                done += bytes;
            }
            Mapping::Mapped { pblk, len, .. } => {
                let run = len.min(blocks_left).min(MAX_READ_RUN);
                let mut raw = vec![0u8; (run * bs) as usize];
                sb.vol()
                    .disk()
                    .read_raw(pblk, &mut raw)
                    .map_err(|e| crate::ext4::error::annotate(e, &format!("data of inode {}", inode.ino)))?;
                // Charged before insertion, so the count never dips
                // below what is cached while a sweep runs.
                let over = sb.pages().charge(run as usize);
                let mut added = 0;
                let mut pages = Vec::with_capacity(run as usize);
                for (k, chunk) in raw.chunks(bs as usize).enumerate() {
                    // A page cached meanwhile (dirty or not) wins; a
                    // write-side change since `miss` voids what we read.
                    match inode.pages.insert_clean_at(
                        lblk + k as u64,
                        Arc::new(Page::new(chunk.into())),
                        &miss,
                        sb.pages(),
                    ) {
                        Some((page, new)) => {
                            added += new as usize;
                            pages.push(page);
                        }
                        None => break,
                    }
                }
                sb.pages().release(run as usize - added);
                if over {
                    sb.shrink_pages();
                }
                if pages.len() < run as usize {
                    // The write side cleaned, dropped or remapped
                    // while we read the disk: what we read may be older
                    // than a write already written back and evicted, or
                    // come from blocks a truncate freed. Redo the step.
                    miss = inode.pages.miss();
                    map = None;
                    continue;
                }
                let mut copied = 0;
                for (k, page) in pages.iter().enumerate() {
                    let a = if k == 0 { in_blk } else { 0 };
                    let m = (bs as usize - a).min(want - done - copied);
                    if m == 0 {
                        break;
                    }
                    buf[done + copied..done + copied + m].copy_from_slice(&page.data[a..a + m]);
                    copied += m;
                }
                done += copied;
            }
        }
    }
    Ok(want)
}

/// SEEK_DATA / SEEK_HOLE from `off`.
pub(crate) fn seek_data_hole(sb: &SuperBlock, inode: &CachedInode, off: u64, data: bool) -> Result<u64> {
    let size = inode.size();
    let enxio = || {
        Error::posix(
            Errno::ENXIO,
            format!("offset {off} is past the end of inode {}", inode.ino),
        )
    };
    if off >= size {
        return Err(enxio());
    }
    // Delayed allocation: dirty pages are data the map does not show
    // yet; write them back so the map answers for them.
    if inode.pages.dirty_count() != 0 {
        writeback::writeback_inode(sb, inode, SyncLevel::All)?;
    }
    let map = inode.block_map(sb.vol())?;
    let bs = sb.vol().block_size() as u64;
    let nblocks = size.div_ceil(bs);
    if data {
        match map.next_data(sb.vol(), off / bs, nblocks)? {
            Some(b) => Ok((b * bs).max(off)),
            None => Err(enxio()),
        }
    } else {
        let mut b = off / bs;
        while b < nblocks {
            match map.map(sb.vol(), b)? {
                Mapping::Mapped { len, uninit: false, .. } => b = b.saturating_add(len),
                Mapping::Hole { .. } | Mapping::Mapped { .. } if !matches!(&*map, BlockMap::Inline(_)) => {
                    return Ok((b * bs).max(off));
                }
                _ => break,
            }
        }
        Ok(size)
    }
}
