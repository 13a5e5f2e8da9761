//! The owner scan: who else names a block, so that freeing never takes a
//! block from under another file (cross-linked blocks).
//!
//! ext4 keeps no reverse map from blocks to their owners. The kernel's
//! `ext4_free_blocks` clears whatever bits a dying map names; when a
//! damaged map names a block another inode also uses (a cross-link, made
//! by a flipped pointer or a bad repair), that block becomes free while
//! its other owner still reads and writes it, and the next allocation
//! hands it out a third time. e2fsck finds such blocks in its pass 1
//! ("multiply-claimed blocks", passes 1B-1D) by reading every inode. We do
//! the same, once per open and lazily: the first allocation or free of the
//! session (or the first check before one: `release_check.rs`,
//! `balloc::check_allocatable`) walks every live inode's block map —
//! extent trees with their index blocks, indirect maps with their indirect
//! blocks, xattr blocks, EA inodes (inodes of their own), directories, the
//! journal, the resize inode, the bad-blocks inode's list — and derives
//! four small sets ([`OwnerSets`], kept in the volume's [`OwnerMap`]):
//!
//! - `multi`: blocks named more than once (as data, map block or xattr
//!   block; an xattr block shared through its refcount counts once), with
//!   the inodes naming them. A free that would take one is refused, naming
//!   the block and the inodes, "run e2fsck".
//! - `unmarked`: blocks a live inode names while the block bitmap says
//!   free (a bitmap that lies). The allocator never hands them out. A lie
//!   the allocators' own check cannot see — a cleared bit in a bitmap
//!   whose count agrees — is why the scan comes before the first
//!   allocation too (e2fsprogs' f_ind_inode_collision and
//!   f_invalid_bad_inode: new files were given blocks another inode's map
//!   names).
//! - `shared_xattr`: xattr blocks named by several inodes, and by how many:
//!   the last reference is released only when the count agrees, so a
//!   refcount that lies cannot free a block another inode still names.
//! - `itable`: inode-table blocks some inode's map names — the bad-blocks
//!   inode listing a table block (e2fsck's inode scan skips it and counts
//!   its inodes in use, `EXT2_ET_BAD_BLOCK_IN_INODE_TABLE`; a name
//!   pointing there is PR_2_BB_INODE), or a file whose map points into the
//!   table (PR_1_CRITICAL_METADATA_COLLISION: e2fsck reads the records as
//!   that file's data or map). The inode allocator hands out no record in
//!   such a block, and no record there is rewritten: that would change
//!   what the other owner holds.
//!
//! And one finding: a block of the journal that another inode names too
//! (a flipped pointer into the log). The log is written round and round,
//! so any commit may overwrite it: every handle and every commit is then
//! refused ([`OwnerMap::check_journal`]), leaving the image as it was.
//!
//! On a healthy filesystem all four are empty, and the cost after the
//! scan is one atomic load per free and per allocation.
//!
//! Why nothing else needs to be kept up to date: after the scan the engine
//! never makes a block named twice. The allocator hands out only blocks
//! free in the bitmap and not in `unmarked`; a free either takes a block's
//! only owner (nothing to record: the bitmap bit goes) or is refused. So
//! the sets only shrink. What the scan itself needs is temporary: one bit
//! per block of the groups that hold named blocks, dropped when it ends.
//!
//! Concurrency (DESIGN.md's locking rules). The scan runs under the owner
//! map's build lock ([`OwnerMap::get_or_build`]); every free and every
//! allocation waits for it (each calls [`sets`] before it takes a group
//! lock or changes a bitmap), so no block is freed, allocated or reused
//! while it runs — and none was before it in this session, since the first
//! allocation or free is what starts it. What it reads can still change
//! under it (an inode record rewritten by a write that allocates nothing);
//! an inode seen half old, half new can only hide owners or count one of
//! its blocks twice, which is why a refusal re-reads the owners' current
//! maps first ([`check_free`]).
//!
//! Records and map blocks are read through the buffer cache's current
//! versions where cached (dirty metadata lives there), else straight from
//! the device in large runs, so the scan neither misses an uncheckpointed
//! change nor floods the cache with inode tables.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use ext4kit_format::extent::{Extent, ExtentHeader, ExtentIndex, EXTENT_MAGIC, MAX_DEPTH};
use ext4kit_format::features::compat;
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ext4kit_format::indirect;
use ext4kit_format::inode::{FileType, Inode, GOOD_OLD_INODE_SIZE};

use crate::bitmap::test_bit;
use crate::error::{Error, Result};
use crate::inode;
#[cfg(doc)]
use crate::owners::OwnerMap;
use crate::owners::{cross_linked, Findings, OwnerSets, Role, ScanStats};
use crate::volume::Volume;

/// e2fsck's `block_found_map`: one bit per block of the groups that hold
/// named blocks, allocated a group at a time, so the scan's memory is what
/// the filesystem has in use, at one bit a block.
struct BlockFoundMap {
    first: u64,
    per_group: u64,
    groups: Vec<Option<Box<[u64]>>>,
    bytes: usize,
}

impl BlockFoundMap {
    fn new(first: u64, per_group: u64, ngroups: usize) -> Self {
        BlockFoundMap {
            first,
            per_group,
            groups: (0..ngroups).map(|_| None).collect(),
            bytes: 0,
        }
    }

    /// Mark `[start, start + len)` named; blocks already marked go to
    /// `dups`. The run lies inside the filesystem.
    fn mark(&mut self, start: u64, len: u64, dups: &mut Vec<u64>) {
        let (mut p, end) = (start, start + len);
        while p < end {
            let rel = p - self.first;
            let g = (rel / self.per_group) as usize;
            let Some(slot) = self.groups.get_mut(g) else { return };
            let group_end = self.first + (g as u64 + 1) * self.per_group;
            let stop = end.min(group_end);
            let words = slot.get_or_insert_with(|| {
                let n = self.per_group.div_ceil(64) as usize;
                self.bytes += n * 8;
                vec![0u64; n].into_boxed_slice()
            });
            let mut i = rel % self.per_group;
            let last = stop - self.first - g as u64 * self.per_group;
            while i < last {
                let w = (i / 64) as usize;
                let lo = i % 64;
                let hi = (last - (i - lo)).min(64);
                let mask = if hi - lo == 64 {
                    u64::MAX
                } else {
                    ((1u64 << (hi - lo)) - 1) << lo
                };
                let mut seen = words[w] & mask;
                while seen != 0 {
                    let bit = seen.trailing_zeros() as u64;
                    dups.push(self.first + g as u64 * self.per_group + w as u64 * 64 + bit);
                    seen &= seen - 1;
                }
                words[w] |= mask;
                i = i - lo + hi;
            }
            p = stop;
        }
    }

    fn test(&self, b: u64) -> bool {
        let Some(rel) = b.checked_sub(self.first) else {
            return false;
        };
        let g = (rel / self.per_group) as usize;
        let i = rel % self.per_group;
        matches!(self.groups.get(g), Some(Some(w)) if w[(i / 64) as usize] >> (i % 64) & 1 == 1)
    }

    fn count(&self) -> u64 {
        self.groups
            .iter()
            .flatten()
            .map(|w| w.iter().map(|x| x.count_ones() as u64).sum::<u64>())
            .sum()
    }
}

/// The owner sets, scanning every live inode the first time (see the
/// module doc). Every free and every allocation calls this before it
/// takes a group lock or changes a bitmap.
pub(crate) fn sets(vol: &Volume) -> Result<&OwnerSets> {
    vol.owner_map().get_or_build(|| scan(vol))
}

/// Refuse, before anything changes, to free blocks of `runs` (which inode
/// `ino`, record `rec`, is about to free) that another inode — or `ino`
/// itself a second time — also names. A block the scan found named twice
/// is looked at again in its owners' current maps (the scan may have seen
/// a tree half-restructured), and forgotten when it no longer is. Reads
/// only.
pub(crate) fn check_free(vol: &Volume, ino: u32, rec: &Inode, runs: &[(u64, u64)]) -> Result<()> {
    let set = sets(vol)?;
    if set.is_clean() {
        return Ok(());
    }
    for &(start, len) in runs {
        for (b, owners) in set.multi_in(start, len) {
            let mut inos: Vec<u32> = owners.iter().map(|c| c.0).collect();
            inos.push(ino);
            inos.sort_unstable();
            inos.dedup();
            let mut now: Vec<(u32, Role)> = Vec::new();
            for o in inos {
                let r = if o == ino {
                    rec.clone()
                } else {
                    match inode::read(vol, o) {
                        Ok(r) => r,
                        // Unreadable now: trust what the scan saw.
                        Err(_) => {
                            now.extend(owners.iter().filter(|c| c.0 == o));
                            continue;
                        }
                    }
                };
                if o != ino && !owns_blocks(vol, o, &r) {
                    continue;
                }
                walk_map(vol, &r, &mut |s, l, role| {
                    if b >= s && b - s < l {
                        now.push((o, role));
                    }
                })?;
                if r.file_acl() == b {
                    now.push((o, Role::Xattr));
                }
            }
            if now.len() < 2 {
                set.forget_multi(b);
                continue;
            }
            return Err(cross_linked(b, ino, &now));
        }
    }
    Ok(())
}

/// Refuse to rewrite inode `ino`'s record when the inode-table block
/// holding it is also named by an inode's map ([`OwnerMap::check_record`]).
/// Runs the owner scan if it has not run, so call it before a handle
/// begins. Reads only. Public: the vfs layer checks every record a
/// namespace change will rewrite before the change begins.
pub fn check_record(vol: &Volume, ino: u32) -> Result<()> {
    sets(vol)?;
    let (blk, _) = inode::location(vol, ino)?;
    vol.owner_map().check_record(ino, blk)
}

/// Whether inode `ino` (record `rec`) may own blocks, as e2fsck's pass 1
/// decides: in use when it has links (whatever its bitmap says); one with
/// no links still owns its blocks while its bitmap bit is set (an open,
/// unlinked file on the orphan list). Inode 1, the bad-blocks inode, has
/// no mode but owns the blocks it lists.
fn owns_blocks(vol: &Volume, ino: u32, rec: &Inode) -> bool {
    if ino == 1 {
        return true;
    }
    if rec.base.mode == 0 {
        return false;
    }
    if rec.base.links_count > 0 {
        return true;
    }
    let ipg = vol.geo().inodes_per_group();
    let idx = ino - 1;
    let Some(grp) = vol.groups().get((idx / ipg) as usize) else {
        return false;
    };
    let mut buf = vec![0u8; vol.block_size()];
    matches!(read_current(vol, grp.inode_bitmap(), &mut buf), Ok(true)) && test_bit(&buf, (idx % ipg) as usize)
}

/// Read `buf.len() / block_size` blocks from `start`: each block's current
/// version from the buffer cache where cached, else from the device.
/// `Ok(false)` when the run lies outside the filesystem (a damaged
/// pointer: the caller skips it; no corruption is raised, so a scan inside
/// a handle never marks it as having met damage).
pub(crate) fn read_current(vol: &Volume, start: u64, buf: &mut [u8]) -> Result<bool> {
    let bs = vol.block_size();
    let n = (buf.len() / bs) as u64;
    if start == 0
        || start < vol.geo().first_data_block()
        || start.checked_add(n).is_none_or(|e| e > vol.geo().blocks_count())
    {
        return Ok(false);
    }
    vol.disk()
        .device()
        .read_at(start * bs as u64, buf)
        .map_err(|e| Error::io(format!("reading blocks {start}+{n} to find their owners"), e))?;
    for i in 0..n {
        if let Some(b) = vol.bcache().peek(start + i) {
            let at = i as usize * bs;
            buf[at..at + bs].copy_from_slice(&b.data);
        }
    }
    Ok(true)
}

/// Every block the inode record `rec` names, as far as its map can be
/// read: `f(start, len, role)` for each run inside the filesystem.
/// Tolerant, like e2fsck's pass 1: checksums are not checked, a node that
/// does not parse contributes its own block and nothing under it, an
/// out-of-range pointer is skipped. The xattr block is not included
/// (shared blocks are counted apart). Only device errors fail.
fn walk_map(vol: &Volume, rec: &Inode, f: &mut dyn FnMut(u64, u64, Role)) -> Result<()> {
    if rec.has_inline_data() {
        return Ok(());
    }
    match rec.file_type() {
        Some(FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket) => return Ok(()),
        Some(FileType::Symlink) if inode::is_fast_symlink(vol, rec) => return Ok(()),
        _ => {}
    }
    let mut walk = MapWalk {
        vol,
        // The whole filesystem is the most any map can name; a map that
        // loops is cut off there.
        budget: vol.geo().blocks_count(),
        seen: HashSet::new(),
        emit: f,
    };
    // The bad-blocks inode too is read through its extent tree when it
    // says it has one: e2fsck's pass 1 walks it with
    // ext2fs_block_iterate3, which follows EXTENTS_FL whatever the inode
    // (and only then calls it invalid, PR_1_INVALID_BAD_INODE, which -n
    // leaves), so the blocks that tree names are in use.
    if rec.uses_extents() {
        walk.extent_node(&rec.base.block, None)
    } else {
        let root = indirect::root_pointers(&rec.base.block);
        for (slot, &p) in root.iter().enumerate() {
            walk.indirect(p as u64, indirect::slot_depth(slot))?;
        }
        Ok(())
    }
}

/// One walk of a block map ([`walk_map`]): what it has left to read and
/// where the runs it finds go.
struct MapWalk<'a, 'f> {
    vol: &'a Volume,
    /// Map blocks it may still read (a map that loops is cut off).
    budget: u64,
    /// Extent-tree nodes already read (a tree that loops is cut off).
    seen: HashSet<u64>,
    emit: &'f mut dyn FnMut(u64, u64, Role),
}

impl MapWalk<'_, '_> {
    /// Pass on the part of `[s, s + l)` inside the filesystem.
    fn found(&mut self, s: u64, l: u64, role: Role) {
        let geo = self.vol.geo();
        let s2 = s.max(geo.first_data_block());
        let e = s.saturating_add(l).min(geo.blocks_count());
        if s2 < e {
            (self.emit)(s2, e - s2, role);
        }
    }

    fn extent_node(&mut self, node: &[u8], want_depth: Option<u16>) -> Result<()> {
        if node.len() < ExtentHeader::SIZE {
            return Ok(());
        }
        let h = ExtentHeader::parse_raw(node);
        if h.magic != EXTENT_MAGIC || h.depth > MAX_DEPTH || want_depth.is_some_and(|d| d != h.depth) {
            return Ok(());
        }
        let fit = (node.len() - ExtentHeader::SIZE) / 12;
        let n = (h.entries as usize).min(h.max as usize).min(fit);
        let slot = |i: usize| &node[ExtentHeader::SIZE + 12 * i..ExtentHeader::SIZE + 12 * (i + 1)];
        if h.depth == 0 {
            for i in 0..n {
                let e = Extent::parse_raw(slot(i));
                if e.length() > 0 {
                    self.found(e.start(), e.length() as u64, Role::Data);
                }
            }
            return Ok(());
        }
        let mut buf = vec![0u8; self.vol.block_size()];
        for i in 0..n {
            let blk = ExtentIndex::parse_raw(slot(i)).leaf();
            if !self.seen.insert(blk) || self.budget == 0 {
                continue;
            }
            self.budget -= 1;
            self.found(blk, 1, Role::ExtentNode);
            if read_current(self.vol, blk, &mut buf)? {
                self.extent_node(&buf, Some(h.depth - 1))?;
            }
        }
        Ok(())
    }

    fn indirect(&mut self, blk: u64, depth: usize) -> Result<()> {
        if blk == 0 {
            return Ok(());
        }
        if depth == 0 {
            self.found(blk, 1, Role::Data);
            return Ok(());
        }
        if self.budget == 0 {
            return Ok(());
        }
        self.budget -= 1;
        self.found(blk, 1, Role::Indirect);
        let mut buf = vec![0u8; self.vol.block_size()];
        if !read_current(self.vol, blk, &mut buf)? {
            return Ok(());
        }
        for i in 0..self.vol.block_size() / 4 {
            let p = indirect::pointer(&buf, i) as u64;
            if p != 0 {
                self.indirect(p, depth - 1)?;
            }
        }
        Ok(())
    }
}

/// Call `f(ino, record)` for every inode that may own blocks
/// ([`owns_blocks`]), reading the inode tables in large runs. A group
/// whose inodes are not initialised (`INODE_UNINIT`) is skipped, and so is
/// the tail of a table past both `bg_itable_unused` and the last inode its
/// bitmap marks in use. Returns the number of records read.
fn for_each_live_inode(vol: &Volume, f: &mut dyn FnMut(u32, &Inode) -> Result<()>) -> Result<u64> {
    let bs = vol.block_size();
    let isz = vol.geo().inode_size();
    let ipg = vol.geo().inodes_per_group() as usize;
    let csum_groups = vol.geo().has_group_desc_csum();
    let mut records = 0u64;
    let mut ibm = vec![0u8; bs];
    const CHUNK_BLOCKS: usize = 256;
    let mut chunk = Vec::new();
    for (g, grp) in vol.groups().iter().enumerate() {
        let gd = *grp.desc().read();
        let uninit = csum_groups && gd.flags & BG_INODE_UNINIT != 0;
        if uninit {
            continue;
        }
        let (_, ib, itable) = grp.meta();
        let have_bitmap = read_current(vol, ib, &mut ibm)?;
        let last_used = if have_bitmap {
            (0..ipg.min(bs * 8))
                .rev()
                .find(|&i| test_bit(&ibm, i))
                .map_or(0, |i| i + 1)
        } else {
            ipg
        };
        let by_unused = if csum_groups {
            ipg - (gd.itable_unused() as usize).min(ipg)
        } else {
            ipg
        };
        let n = by_unused.max(last_used).min(ipg);
        let per_block = bs / isz;
        let blocks = n.div_ceil(per_block);
        let mut done = 0usize;
        while done < blocks {
            let k = (blocks - done).min(CHUNK_BLOCKS);
            chunk.resize(k * bs, 0);
            if !read_current(vol, itable + done as u64, &mut chunk)? {
                break;
            }
            for j in 0..k * per_block {
                let i = done * per_block + j;
                if i >= n {
                    break;
                }
                let ino = (g * ipg + i + 1) as u32;
                let raw = &chunk[j * isz..(j + 1) * isz];
                records += 1;
                let rec = match Inode::parse_raw(raw) {
                    Ok(r) => r,
                    Err(_) => match Inode::parse_raw(&raw[..GOOD_OLD_INODE_SIZE]) {
                        Ok(r) => r,
                        Err(_) => continue,
                    },
                };
                let live = if ino == 1 {
                    true
                } else if rec.base.mode == 0 {
                    false
                } else {
                    rec.base.links_count > 0 || have_bitmap && test_bit(&ibm, i)
                };
                if live {
                    f(ino, &rec)?;
                }
            }
            done += k;
        }
    }
    Ok(records)
}

/// The scan (see the module doc): every live inode's blocks into a
/// bitmap, blocks met twice noted; then, only if there are any, a second
/// pass to name their owners; then the block bitmaps of the groups with
/// named blocks, for named blocks marked free; then the inode-table blocks
/// a map names.
fn scan(vol: &Volume) -> Result<OwnerSets> {
    let t0 = Instant::now();
    let geo = vol.geo();
    let mut found = BlockFoundMap::new(geo.first_data_block(), geo.blocks_per_group(), vol.groups().len());
    let mut dups: Vec<u64> = Vec::new();
    let mut xattr_refs: HashMap<u64, u32> = HashMap::new();
    let mut inodes = 0u64;
    let records = for_each_live_inode(vol, &mut |_, rec| {
        inodes += 1;
        let acl = rec.file_acl();
        if acl != 0 {
            *xattr_refs.entry(acl).or_insert(0) += 1;
        }
        walk_map(vol, rec, &mut |s, l, _| found.mark(s, l, &mut dups))
    })?;
    // An xattr block shared through its refcount is one owner.
    let mut shared_xattr = HashMap::new();
    for (&b, &n) in &xattr_refs {
        if b >= geo.first_data_block() && b < geo.blocks_count() {
            found.mark(b, 1, &mut dups);
            if n > 1 {
                shared_xattr.insert(b, n);
            }
        }
    }
    let mut multi: BTreeMap<u64, Vec<(u32, Role)>> = BTreeMap::new();
    if !dups.is_empty() {
        let dupset: HashSet<u64> = dups.iter().copied().collect();
        for_each_live_inode(vol, &mut |ino, rec| {
            walk_map(vol, rec, &mut |s, l, role| {
                // Dups are few; runs may be long: test the smaller side.
                if l as usize <= dupset.len() {
                    for b in s..s + l {
                        if dupset.contains(&b) {
                            multi.entry(b).or_default().push((ino, role));
                        }
                    }
                } else {
                    for &b in &dupset {
                        if b >= s && b - s < l {
                            multi.entry(b).or_default().push((ino, role));
                        }
                    }
                }
            })?;
            let acl = rec.file_acl();
            if dupset.contains(&acl) {
                let v = multi.entry(acl).or_default();
                // A shared xattr block counts once, whoever names it.
                if !v.iter().any(|c| c.1 == Role::Xattr) {
                    v.push((ino, Role::Xattr));
                }
            }
            Ok(())
        })?;
        multi.retain(|_, v| v.len() > 1);
    }
    // Named blocks the bitmaps mark free (no allocation runs during the
    // scan: each waits for it).
    let csum_groups = geo.has_group_desc_csum();
    let mut unmarked = BTreeSet::new();
    let mut bm = vec![0u8; vol.block_size()];
    for (g, words) in found.groups.iter().enumerate() {
        let Some(words) = words else { continue };
        let gd = *vol.groups()[g].desc().read();
        let have = if csum_groups && gd.flags & BG_BLOCK_UNINIT != 0 {
            // An unsupported layout cannot be implied: the group is skipped.
            match vol.groups().implied_block_bitmap(g, geo, &vol.sb().read()) {
                Ok(v) => {
                    bm.copy_from_slice(&v);
                    true
                }
                Err(_) => false,
            }
        } else {
            read_current(vol, vol.groups()[g].block_bitmap(), &mut bm)?
        };
        if !have {
            continue;
        }
        let first = geo.group_first_block(g as u64);
        let n = geo.blocks_in_group(g) as usize;
        for (w, &word) in words.iter().enumerate() {
            let mut x = word;
            while x != 0 {
                let bit = w * 64 + x.trailing_zeros() as usize;
                x &= x - 1;
                if bit < n && bit < bm.len() * 8 && !test_bit(&bm, bit) {
                    unmarked.insert(first + bit as u64);
                }
            }
        }
    }
    // Inode-table blocks a map names (see `OwnerSets::itable_named_in`).
    let itable_blocks = geo.itable_blocks();
    let itable: BTreeSet<u64> = vol
        .groups()
        .iter()
        .flat_map(|g| g.inode_table()..g.inode_table().saturating_add(itable_blocks))
        .filter(|&b| found.test(b))
        .collect();
    let stats = ScanStats {
        records,
        inodes,
        owned: found.count(),
        multi: multi.len(),
        unmarked: unmarked.len(),
        elapsed: t0.elapsed(),
        peak_bytes: found.bytes,
    };
    Ok(OwnerSets::new(Findings {
        multi,
        unmarked,
        shared_xattr,
        itable,
        journal_ino: if geo.has_compat(compat::HAS_JOURNAL) {
            vol.sb().read().journal_inum
        } else {
            0
        },
        stats,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ialloc::{self, NewInode};
    use crate::volume::scratch_volume_unjournaled;
    use crate::{alloc_map, bmap};

    /// A regular file of `blocks` blocks (not linked anywhere: the scan
    /// goes by the inode table, not by names).
    fn file(v: &Volume, blocks: usize) -> (u32, Inode) {
        let mut h = v.begin().unwrap();
        let ino = ialloc::new_inode(v, &mut h, 2, FileType::Regular).unwrap();
        let mut rec = ialloc::new_record(v, &NewInode::plain_file());
        alloc_map::store(v, &mut h, ino, &mut rec, &vec![7u8; blocks * v.block_size()]).unwrap();
        inode::write(v, &mut h, ino, &rec).unwrap();
        h.commit().unwrap();
        (ino, rec)
    }

    /// Damage made through the engine comes after the session's first
    /// allocation, which ran the scan: forget it, so the next use scans
    /// the damaged volume, as the next open would.
    fn rescan(v: &mut Volume) {
        v.forget_owner_map();
    }

    fn runs(v: &Volume, ino: u32, rec: &Inode) -> Vec<(u64, u64)> {
        let m = bmap::load(v, ino, rec).unwrap();
        m.runs(v, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(_, p, n)| (p, n))
            .collect()
    }

    /// Point `rec`'s first extent (depth-0 root) at `target`, one block long.
    fn redirect(v: &Volume, ino: u32, rec: &mut Inode, target: u64) {
        let b = &mut rec.base.block;
        b[12 + 4..12 + 6].copy_from_slice(&1u16.to_le_bytes());
        b[12 + 6..12 + 8].copy_from_slice(&((target >> 32) as u16).to_le_bytes());
        b[12 + 8..12 + 12].copy_from_slice(&(target as u32).to_le_bytes());
        let mut h = v.begin().unwrap();
        inode::write(v, &mut h, ino, rec).unwrap();
        h.commit().unwrap();
    }

    #[test]
    fn a_healthy_volume_scans_clean() {
        let v = scratch_volume_unjournaled();
        let (_, _) = file(&v, 3);
        let set = sets(&v).unwrap();
        assert!(set.is_clean());
        assert!(set.stats().inodes >= 3, "root, lost+found, the file: {:?}", set.stats());
        assert!(set.stats().owned >= 3);
    }

    /// A block two inodes name is refused by the check and by the free
    /// path itself, naming both; the check forgets an entry the owners'
    /// current maps no longer bear out.
    #[test]
    fn a_cross_link_is_found_refused_and_rechecked() {
        let mut v = scratch_volume_unjournaled();
        let (a, arec) = file(&v, 2);
        let (b, mut brec) = file(&v, 2);
        let shared = runs(&v, a, &arec)[0].0;
        redirect(&v, b, &mut brec, shared);
        rescan(&mut v);
        let set = sets(&v).unwrap();
        assert_eq!(set.multi_blocks(), vec![shared]);
        let e = check_free(&v, b, &brec, &runs(&v, b, &brec)).unwrap_err().to_string();
        assert!(
            e.contains(&format!("block {shared}"))
                && e.contains(&format!("inode {a}"))
                && e.contains(&format!("inode {b}")),
            "{e}"
        );
        assert!(e.contains("run e2fsck"), "{e}");
        assert!(
            set.refuse_multi_in(&[(shared, 1)]).is_err(),
            "the free path refuses too"
        );
        // /a's second block is no one else's.
        check_free(&v, a, &arec, &[(shared + 1, 1)]).unwrap();
        // /b now points elsewhere (as a change the scan saw half-made may
        // leave it): the recheck drops the entry.
        let (c, crec) = file(&v, 1);
        redirect(&v, b, &mut brec, runs(&v, c, &crec)[0].0);
        check_free(&v, a, &arec, &[(shared, 1)]).unwrap();
        assert!(set.multi_blocks().is_empty());
        assert!(set.refuse_multi_in(&[(shared, 1)]).is_ok());
    }

    /// The bad-blocks inode with an extent tree (e2fsprogs'
    /// f_invalid_bad_inode): e2fsck's pass 1 walks it with
    /// ext2fs_block_iterate3, which follows EXTENTS_FL, so the blocks its
    /// tree names are in use — read as a block map, its root names none.
    #[test]
    fn the_bad_blocks_inode_is_walked_through_its_extent_tree() {
        let mut v = scratch_volume_unjournaled();
        let (a, arec) = file(&v, 1);
        let x = runs(&v, a, &arec)[0].0;
        let mut bad = inode::read(&v, 1).unwrap();
        bad.base.flags |= ext4kit_format::inode::flags::EXTENTS;
        let b = &mut bad.base.block;
        b.fill(0);
        ExtentHeader {
            magic: EXTENT_MAGIC,
            entries: 1,
            max: 4,
            depth: 0,
            generation: 0,
        }
        .serialize_into(b);
        b[12 + 4..12 + 6].copy_from_slice(&1u16.to_le_bytes());
        b[12 + 8..12 + 12].copy_from_slice(&(x as u32).to_le_bytes());
        let mut h = v.begin().unwrap();
        inode::write(&v, &mut h, 1, &bad).unwrap();
        h.commit().unwrap();
        rescan(&mut v);
        assert_eq!(
            sets(&v).unwrap().multi_blocks(),
            vec![x],
            "inode 1's extent and /a's block"
        );
    }

    /// An xattr block whose refcount disagrees with the inodes naming it
    /// is refused both ways.
    #[test]
    fn an_xattr_refcount_must_match_its_referrers() {
        let v = scratch_volume_unjournaled();
        let (a, _) = file(&v, 1);
        let (c, crec) = file(&v, 1);
        let x = runs(&v, c, &crec)[0].0;
        let mut arec = inode::read(&v, a).unwrap();
        arec.base.set_file_acl(x);
        let mut h = v.begin().unwrap();
        inode::write(&v, &mut h, a, &arec).unwrap();
        h.commit().unwrap();
        sets(&v).unwrap();
        v.owner_map().check_xattr_refcount(a, x, 1).unwrap();
        let e = v.owner_map().check_xattr_refcount(a, x, 17).unwrap_err().to_string();
        assert!(e.contains("reference count is 17 but 1 inode(s)"), "{e}");
    }

    #[test]
    fn the_found_map_finds_every_block_named_twice_across_words_and_groups() {
        // Groups of 100 blocks from block 1: 1..101, 101..201, 201..301.
        let mut b = BlockFoundMap::new(1, 100, 3);
        let mut d = Vec::new();
        b.mark(1, 69, &mut d);
        b.mark(150, 51, &mut d); // across the first group boundary
        assert!(d.is_empty());
        b.mark(60, 20, &mut d); // 60..70 twice
        b.mark(199, 3, &mut d); // 199, 200 twice; 201 new
        assert_eq!(d, (60..70).chain([199, 200]).collect::<Vec<_>>());
        assert_eq!(b.count(), 69 + 51 + 10 + 1);
        // A run past the last group is cut off, not a panic.
        b.mark(295, 20, &mut d);
        assert_eq!(b.count(), 69 + 51 + 10 + 1 + 6);
        assert_eq!(b.bytes, 3 * 2 * 8);
    }
}
