//! Adding names to directories (the insert half of the kernel's `namei.c`:
//! `ext4_add_entry`, `add_dirent_to_buf`, `ext4_init_new_dir`).
//!
//! A linear directory takes a new entry in the first record with enough
//! slack (`rec_len` minus the space its own name needs) in any block; when
//! no block has room it grows by one block — or, when it is a single full
//! block on a `dir_index` filesystem, it becomes an htree
//! (`dx_split.rs::make_indexed_dir`). An indexed directory takes the entry
//! in the one leaf the hash selects (seed 004: O(depth) blocks, no scan),
//! splitting the leaf and the index when full (`dx_split.rs`).
//!
//! Every function here expects the caller to hold the directory's inode
//! lock (writer side of `i_rwsem`): the blocks read through the cache
//! cannot change underneath between the read and the handle's `modify`.
//! Every changed leaf gets its checksum tail refreshed in the same handle.

use ext4kit_format::dirent::{self, rec_len_for, DirFormat, NAME_MAX};
use ext4kit_format::features::compat;
use ext4kit_format::inode::{FileType, Inode};

use super::bmap::{BlockMap, Mapping};
use super::dir::DirRef;
use super::htree::InsertHint;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// A live record decoded from a leaf, owned (leaves are rebuilt from these
/// when they split).
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub ino: u32,
    pub name: RecName,
    pub ft: u8,
}

/// A record's name, inline up to 32 bytes: a leaf split decodes every
/// record of the leaf (~170 in a 4 KiB leaf of short names), and with a
/// `Vec` per name that was 1.5 allocations per create in a create storm,
/// amortised over the inserts between splits (uprobe count, seed 004).
pub(crate) type RecName = smallvec::SmallVec<[u8; 32]>;

/// Offset of the first record whose slack can hold a record of `need`
/// bytes, without changing the block (`ext4_find_dest_de`).
pub(crate) fn find_slot(d: &[u8], limit: usize, fmt: DirFormat, need: usize) -> Option<usize> {
    let mut off = 0;
    while off + dirent::DIRENT_HEADER <= limit {
        let e = dirent::entry_at(d, off, fmt);
        if e.rec_len < dirent::DIRENT_HEADER {
            return None;
        }
        let used = if e.inode == 0 { 0 } else { rec_len_for(e.name.len()) };
        if e.rec_len >= used + need {
            return Some(off);
        }
        off += e.rec_len;
    }
    None
}

/// One pass over a leaf for a create: the entry named `name` (inode,
/// type byte) if the leaf holds it, else where [`find_slot`] would put a
/// record of `need` bytes. The lookup that proves a name absent and the
/// search for room walk the same records; doing both in one walk reads
/// the leaf once per create instead of twice (seed 004).
pub(crate) fn scan_for_insert(
    d: &[u8],
    limit: usize,
    fmt: DirFormat,
    name: &[u8],
    need: usize,
) -> std::result::Result<(u32, u8), Option<usize>> {
    let mut slot = None;
    let mut off = 0;
    while off + dirent::DIRENT_HEADER <= limit {
        let e = dirent::entry_at(d, off, fmt);
        if e.rec_len < dirent::DIRENT_HEADER {
            break;
        }
        if e.inode != 0 && dirent::same_name(e.name, name) {
            return Ok((e.inode, e.file_type));
        }
        if slot.is_none() {
            let used = if e.inode == 0 { 0 } else { rec_len_for(e.name.len()) };
            if e.rec_len >= used + need {
                slot = Some(off);
            }
        }
        off += e.rec_len;
    }
    Err(slot)
}

/// Place an entry in the record at `off` (found by [`find_slot`]): reuse
/// an unused record, or shrink a live one to its name and take its slack
/// (`ext4_insert_dentry`).
pub(crate) fn insert_at(d: &mut [u8], off: usize, fmt: DirFormat, name: &[u8], ino: u32, ft: u8) {
    let e = dirent::entry_at(d, off, fmt);
    let rec = e.rec_len;
    if e.inode == 0 {
        dirent::write_entry(d, off, ino, rec, name, ft, fmt);
    } else {
        // The live record keeps its header and name; only its length
        // shrinks (copying its name out to rewrite it was an allocation
        // per create).
        let used = rec_len_for(e.name.len());
        dirent::set_rec_len(d, off, used, fmt);
        dirent::write_entry(d, off + used, ino, rec - used, name, ft, fmt);
    }
}

/// Try to place an entry in one block's records; returns whether it fit.
#[cfg(test)]
fn insert_in_block(d: &mut [u8], limit: usize, fmt: DirFormat, name: &[u8], ino: u32, ft: u8) -> bool {
    match find_slot(d, limit, fmt, rec_len_for(name.len())) {
        Some(off) => {
            insert_at(d, off, fmt, name, ino, ft);
            true
        }
        None => false,
    }
}

/// Live records of a (validated) leaf, in block order; `skip_dots` drops
/// the leading "." and ".." of block 0.
pub(crate) fn leaf_records(d: &[u8], limit: usize, fmt: DirFormat, skip_dots: bool) -> Vec<Rec> {
    dirent::entries(&d[..limit], fmt)
        .enumerate()
        .filter(|(i, e)| e.inode != 0 && !(skip_dots && *i < 2 && (e.name == b"." || e.name == b"..")))
        .map(|(_, e)| Rec {
            ino: e.inode,
            name: RecName::from_slice(e.name),
            ft: e.file_type,
        })
        .collect()
}

/// Bytes the records need packed tight.
pub(crate) fn packed_size(recs: &[Rec]) -> usize {
    recs.iter().map(|r| rec_len_for(r.name.len())).sum()
}

impl Volume {
    /// Usable bytes of a leaf (the block minus the checksum tail).
    pub(crate) fn leaf_limit(&self) -> usize {
        if self.csum_seed.is_some() {
            self.block_size - dirent::TAIL_SIZE
        } else {
            self.block_size
        }
    }

    /// A fresh leaf holding `recs` packed, the last record stretched to the
    /// end (an empty leaf is one unused record spanning it), plus the tail.
    pub(crate) fn build_leaf(&self, recs: &[Rec], seed: Option<u32>) -> Result<Box<[u8]>> {
        let fmt = self.dir_format();
        let limit = self.leaf_limit();
        if packed_size(recs) > limit {
            return Err(Error::posix(
                Errno::EIO,
                "directory leaf split produced more entries than a block holds",
            ));
        }
        let mut b = vec![0u8; self.block_size].into_boxed_slice();
        let mut off = 0;
        for (i, r) in recs.iter().enumerate() {
            let len = if i + 1 == recs.len() {
                limit - off
            } else {
                rec_len_for(r.name.len())
            };
            dirent::write_entry(&mut b, off, r.ino, len, &r.name, r.ft, fmt);
            off += len;
        }
        if recs.is_empty() {
            dirent::write_entry(&mut b, 0, 0, limit, b"", 0, fmt);
        }
        self.finish_leaf(&mut b, seed);
        Ok(b)
    }

    /// Write the checksum tail of a leaf we built or changed.
    pub(crate) fn finish_leaf(&self, d: &mut [u8], seed: Option<u32>) {
        if let Some(s) = seed {
            if !dirent::has_tail(d) {
                dirent::init_tail(d);
            }
            dirent::set_tail_checksum(d, s);
        }
    }

    /// Physical block of directory block `lblk`, which must be mapped.
    pub(crate) fn dir_pblk(&self, dir: DirRef<'_>, lblk: u64) -> Result<u64> {
        match dir.map.map(self, lblk)? {
            Mapping::Mapped { pblk, .. } => Ok(pblk),
            Mapping::Hole { .. } => Err(Error::corrupt_msg(
                format!("directory inode {}", dir.ino),
                "block map",
                format!("directory block {lblk} is a hole"),
            )),
        }
    }

    /// Add `name` -> `ino` to a directory (`ext4_add_entry`).
    ///
    /// `new_dir` is the caller's copy of the directory's record
    /// (`dir.inode`'s contents), updated in place when the directory grows
    /// (size, `i_blocks`, block map, INDEX flag); the caller writes it
    /// through `h`. Returns true when the block map changed (the caller then
    /// drops its cached map). On error (ENOSPC, ...) nothing has changed:
    /// blocks are allocated before any directory block is modified. The
    /// caller holds the directory's inode lock and has checked that `name`
    /// is not present. After a call that returned true, a further call on
    /// the same directory needs a DirRef over the updated record and a
    /// reloaded map (EINVAL otherwise).
    pub fn add_link(
        &self,
        h: &mut Handle<'_>,
        dir: DirRef<'_>,
        new_dir: &mut Inode,
        name: &[u8],
        ino: u32,
        ft: FileType,
    ) -> Result<bool> {
        self.add_link_hinted(h, dir, new_dir, name, ino, ft, None)
    }

    /// [`Self::add_link`] after [`Self::lookup_for_create`]: `hint` is
    /// where that lookup found room for `name` (see [`InsertHint`]).
    #[allow(clippy::too_many_arguments)]
    pub fn add_link_hinted(
        &self,
        h: &mut Handle<'_>,
        dir: DirRef<'_>,
        new_dir: &mut Inode,
        name: &[u8],
        ino: u32,
        ft: FileType,
        hint: Option<InsertHint<'_>>,
    ) -> Result<bool> {
        check_name(name)?;
        // A second add_link in one handle after the first grew the
        // directory must use a refreshed DirRef (new size and map): with a
        // stale one we would map a block that is already in use.
        if new_dir.size() != dir.inode.size()
            || (new_dir.base.flags ^ dir.inode.base.flags) & ext4kit_format::inode::flags::INDEX != 0
        {
            return Err(Error::posix(
                Errno::EINVAL,
                format!(
                    "add_link on directory inode {}: the DirRef is older than the record (refresh it after the directory grew)",
                    dir.ino
                ),
            ));
        }
        if matches!(dir.map, BlockMap::Inline(_)) {
            return Err(Error::Unsupported(format!(
                "adding entries to inline-data directory inode {} is not supported yet",
                dir.ino
            )));
        }
        let fmt = self.dir_format();
        let ftb = if fmt.filetype { ft.to_dirent() } else { 0 };
        if dir.is_indexed(self) {
            return self.dx_add_entry(h, dir, new_dir, name, ino, ftb, hint);
        }
        // Linear: the first block with room (the kernel scans the same way).
        // An INDEX flag without the dir_index feature is ignored and cleared,
        // as the kernel's `ext4_add_entry` fallback does.
        new_dir.base.flags &= !ext4kit_format::inode::flags::INDEX;
        let need = rec_len_for(name.len());
        let limit = self.leaf_limit();
        let seed = self.inode_seed(dir.ino, dir.inode.base.generation);
        let nblocks = dir.nblocks(self);
        for (lstart, _p, len) in dir.map.runs(self, nblocks)? {
            for lblk in lstart..lstart + len {
                let Some(buf) = self.dir_leaf(dir, lblk)? else { continue };
                if let Some(off) = find_slot(&buf.data, limit, fmt, need) {
                    h.modify(buf.block, |d| {
                        insert_at(d, off, fmt, name, ino, ftb);
                        self.finish_leaf(d, seed);
                        Ok(())
                    })?;
                    return Ok(false);
                }
            }
        }
        if nblocks == 1 && self.has_compat(compat::DIR_INDEX) {
            return self.make_indexed_dir(h, dir, new_dir, name, ino, ftb);
        }
        // Append a block holding just the new entry.
        let lblk = nblocks;
        let pblk = self.grow_dir(h, dir.ino, new_dir, lblk, 1)?[0];
        let b = self.build_leaf(
            &[Rec {
                ino,
                name: RecName::from_slice(name),
                ft: ftb,
            }],
            seed,
        )?;
        h.overwrite(pblk, b)?;
        Ok(true)
    }

    /// Check, before an operation that adds a name to `dir` begins changing
    /// anything (its new inode is allocated before the name goes in), that
    /// the insertion will not meet damage the lookup passed over: a hole
    /// at block 0 (`ext4_read_dirblock`'s "Directory hole found"; a linear
    /// lookup skips holes, but "." and ".." and the htree root live
    /// there), or — for a one-block linear directory, which a full block
    /// turns into an htree (`make_indexed_dir`) — a block 0 that does not
    /// start with "." and "..". Without a journal, meeting either after the
    /// inode was allocated would leave the image changed. The directory's
    /// own record, which the insertion rewrites (mtime, size), must not lie
    /// in a cross-linked inode-table block ([`Volume::check_record_writable`]).
    /// Reads only.
    pub fn check_dir_insertable(&self, dir: DirRef<'_>) -> Result<()> {
        self.check_record_writable(dir.ino)?;
        if !matches!(dir.map, BlockMap::Extents(_) | BlockMap::Indirect(_)) || dir.nblocks(self) == 0 {
            return Ok(());
        }
        let loc = || format!("directory inode {}", dir.ino);
        if let Mapping::Hole { .. } = dir.map.map(self, 0)? {
            return Err(Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"));
        }
        if dir.is_indexed(self) || dir.nblocks(self) != 1 || !self.has_compat(compat::DIR_INDEX) {
            return Ok(());
        }
        let fmt = self.dir_format();
        let buf = self
            .dir_leaf(dir, 0)?
            .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
        let first = dirent::entry_at(&buf.data, 0, fmt);
        let second = dirent::entry_at(&buf.data, first.rec_len.min(buf.data.len() - 8), fmt);
        if first.name != b"." || second.name != b".." || first.rec_len != 12 {
            return Err(Error::corrupt_msg(
                loc(),
                "directory block",
                "block 0 does not start with \".\" (rec_len 12) and \"..\"",
            ));
        }
        Ok(())
    }

    /// Map `n` new directory blocks at `lblk..lblk + n` and set `i_size` to
    /// cover them; returns their physical blocks in logical order. Nothing
    /// is written into them: the caller overwrites each one in the same
    /// handle.
    pub(crate) fn grow_dir(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        new_dir: &mut Inode,
        lblk: u64,
        n: u64,
    ) -> Result<Vec<u64>> {
        // Without large_dir a directory's i_size_high must stay zero (it
        // was i_dir_acl; e2fsck pass 1 insists), so 4 GiB is the end.
        let size = (lblk + n) * self.block_size as u64;
        if size > u32::MAX as u64 && !self.has_incompat(ext4kit_format::features::incompat::LARGEDIR) {
            return Err(Error::posix(
                Errno::ENOSPC,
                format!("directory inode {ino} would exceed 4 GiB without large_dir"),
            ));
        }
        let runs = self.map_blocks(h, ino, new_dir, lblk, n, false)?;
        let mut out = Vec::with_capacity(n as usize);
        for r in runs {
            out.extend(r.pblk..r.pblk + r.len);
        }
        if out.len() as u64 != n {
            return Err(Error::posix(
                Errno::EIO,
                format!("directory inode {ino}: mapped {} of {n} new blocks", out.len()),
            ));
        }
        new_dir.base.size_lo = size as u32;
        new_dir.base.size_high = (size >> 32) as u32;
        Ok(out)
    }

    /// Give a new directory inode its first block holding "." and ".."
    /// (and the checksum tail): `ext4_init_new_dir`. `inode` is the new
    /// directory's record (written by the caller through `h`); its size
    /// becomes one block.
    pub fn init_dir(&self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode, parent_ino: u32) -> Result<()> {
        let fmt = self.dir_format();
        let ftb = if fmt.filetype {
            FileType::Directory.to_dirent()
        } else {
            0
        };
        let seed = self.inode_seed(ino, inode.base.generation);
        let pblk = self.grow_dir(h, ino, inode, 0, 1)?[0];
        let limit = self.leaf_limit();
        let mut b = vec![0u8; self.block_size].into_boxed_slice();
        dirent::write_entry(&mut b, 0, ino, 12, b".", ftb, fmt);
        dirent::write_entry(&mut b, 12, parent_ino, limit - 12, b"..", ftb, fmt);
        self.finish_leaf(&mut b, seed);
        h.overwrite(pblk, b)
    }

    /// The parent directory recorded in `dir`'s ".." entry. An indexed
    /// directory keeps "." and ".." in its dx root, where hash lookups never
    /// look, so this reads them from block 0 directly.
    pub fn dotdot(&self, dir: DirRef<'_>) -> Result<u32> {
        let loc = || format!("directory inode {}", dir.ino);
        if let BlockMap::Inline(data) = dir.map {
            // Inline directories store the parent as the first 4 bytes.
            return data
                .get(0..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| Error::corrupt_msg(loc(), "inline directory", "too short for a parent"));
        }
        if dir.is_indexed(self) {
            let buf = self
                .dx_root_block(dir)?
                .ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
            let large = self.has_incompat(ext4kit_format::features::incompat::LARGEDIR);
            let root = ext4kit_format::htree::parse_root(&buf.data, self.block_size, large, None)
                .map_err(|e| Error::corrupt(loc(), e))?;
            return Ok(root.dotdot_inode);
        }
        let fmt = self.dir_format();
        let buf = self
            .dir_leaf(dir, 0)?
            .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
        let first = dirent::entry_at(&buf.data, 0, fmt);
        let second = (first.rec_len + dirent::DIRENT_HEADER <= buf.data.len())
            .then(|| dirent::entry_at(&buf.data, first.rec_len, fmt));
        match second {
            Some(e) if first.name == b"." && e.name == b".." => Ok(e.inode),
            _ => Err(Error::corrupt_msg(
                loc(),
                "directory block",
                "block 0 does not start with \".\" and \"..\"",
            )),
        }
    }

    /// Point ".." at `parent_ino` (a directory moved to another parent).
    /// ".." is the second record of block 0 in both layouts; in an htree
    /// root the dx checksum covers it, in a linear block the tail does.
    pub fn set_dotdot(&self, h: &mut Handle<'_>, dir: DirRef<'_>, parent_ino: u32) -> Result<()> {
        if matches!(dir.map, BlockMap::Inline(_)) {
            return Err(Error::Unsupported(format!(
                "changing \"..\" of inline-data directory inode {} is not supported yet",
                dir.ino
            )));
        }
        let seed = self.inode_seed(dir.ino, dir.inode.base.generation);
        let fmt = self.dir_format();
        let loc = || format!("directory inode {}", dir.ino);
        if dir.is_indexed(self) {
            let buf = self
                .dx_root_block(dir)?
                .ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
            let (bs, large) = (
                self.block_size,
                self.has_incompat(ext4kit_format::features::incompat::LARGEDIR),
            );
            return h.modify(buf.block, |d| {
                let mut root =
                    ext4kit_format::htree::parse_root(d, bs, large, None).map_err(|e| Error::corrupt(loc(), e))?;
                root.dotdot_inode = parent_ino;
                ext4kit_format::htree::write_root(d, &root, bs, seed).map_err(|e| Error::corrupt(loc(), e))
            });
        }
        let buf = self
            .dir_leaf(dir, 0)?
            .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
        let first = dirent::entry_at(&buf.data, 0, fmt);
        let second = (first.rec_len + dirent::DIRENT_HEADER <= buf.data.len())
            .then(|| dirent::entry_at(&buf.data, first.rec_len, fmt));
        if first.name != b"." || second.is_none_or(|e| e.name != b"..") {
            return Err(Error::corrupt_msg(
                loc(),
                "directory block",
                "block 0 does not start with \".\" and \"..\"",
            ));
        }
        let off = first.rec_len;
        h.modify(buf.block, |d| {
            d[off..off + 4].copy_from_slice(&parent_ino.to_le_bytes());
            self.finish_leaf(d, seed);
            Ok(())
        })
    }
}

/// Names a directory entry can hold: 1..=255 bytes, no '/' or NUL, not
/// "." or "..".
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::posix(
            Errno::ENAMETOOLONG,
            format!("name of {} bytes is too long", name.len()),
        ));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("invalid name {:?}", String::from_utf8_lossy(name)),
        ));
    }
    Ok(())
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
                let recs = leaf_records(&b, 1024, fmt, true);
                assert_eq!(recs.len(), 62);
                assert_eq!(packed_size(&recs), 62 * 16);
                assert_eq!(&recs[61].name[..], b"name-061");
                return;
            }
        }
        panic!("a 1 KiB block cannot hold 100 such names");
    }

    /// The create's one-pass walk answers exactly what the lookup's walk
    /// and `find_slot` answer separately, on leaves with slack in the
    /// middle (removed entries merged into their predecessors) and unused
    /// records, for present and absent names of every length class.
    #[test]
    fn one_walk_finds_what_the_lookup_and_find_slot_find() {
        let fmt = DirFormat {
            block_size: 1024,
            filetype: true,
        };
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut rnd = |n: u64| rng.random_range(0..n);
        let name_of = |i: u64, len: u64| format!("{i:0width$}", width = len as usize).into_bytes();
        for _ in 0..300 {
            let mut b = vec![0u8; 1024];
            dirent::write_entry(&mut b, 0, 0, 1024, b"", 0, fmt);
            let mut names = Vec::new();
            for i in 0..rnd(80) {
                let name = name_of(i, 1 + rnd(40));
                if insert_in_block(&mut b, 1024, fmt, &name, 100 + i as u32, 1) {
                    names.push(name);
                }
            }
            // Remove some: merged into the predecessor, or (first record)
            // left as an unused record.
            let mut off = 0;
            let mut prev: Option<usize> = None;
            while off < 1024 {
                let e = dirent::entry_at(&b, off, fmt);
                let len = e.rec_len;
                if e.inode != 0 && rnd(4) == 0 {
                    match prev {
                        Some(p) => {
                            let plen = dirent::entry_at(&b, p, fmt).rec_len;
                            dirent::set_rec_len(&mut b, p, plen + len, fmt);
                            off += len;
                            continue;
                        }
                        None => b[off..off + 4].fill(0),
                    }
                }
                prev = Some(off);
                off += len;
            }
            dirent::check_block(&b, fmt, None).unwrap();
            for probe in names
                .iter()
                .cloned()
                .chain((0..5).map(|i| name_of(500 + i, 1 + rnd(60))))
            {
                let need = rec_len_for(probe.len());
                let found = dirent::entries(&b, fmt)
                    .find(|e| e.inode != 0 && e.name == &probe[..])
                    .map(|e| (e.inode, e.file_type));
                let want = found.ok_or_else(|| find_slot(&b, 1024, fmt, need));
                assert_eq!(scan_for_insert(&b, 1024, fmt, &probe, need), want, "{probe:?}");
            }
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"ok").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&[b'x'; 256]).is_err());
        assert!(check_name(&[b'x'; 255]).is_ok());
    }
}
