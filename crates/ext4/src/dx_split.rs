//! Growing an htree: turning a full one-block directory into an index
//! (`make_indexed_dir`), and adding a name to an indexed directory
//! (`ext4_dx_add_entry`) — into the leaf the hash picks, splitting that
//! leaf at its median hash (`do_split`) when it is full, and with it full
//! index nodes (`dx_insert_block`) and a full root (a new level).
//!
//! The on-disk rules an insert keeps:
//! - the root holds at most `root_limit` entries and a node `node_limit`
//!   (the block's slots after the header, less the `dx_tail` with
//!   metadata_csum); the root's limit is the smaller, so a full root's
//!   entries plus one always fit the node they move into;
//! - entries of an index block are sorted by hash, the first one's hash
//!   is implicitly 0 (its slot holds count and limit), and a new entry goes
//!   right after the entry the probe came through;
//! - the low bit of an entry's hash is the continuation (collision) bit:
//!   the run of equal hashes before it goes on in this block;
//! - `indirect_levels` stays below 2 — 3 with largedir
//!   (`ext4_dir_htree_level`): an insert that would need one more level is
//!   ENOSPC ("Directory index full").
//!
//! Order of work, so that a failure leaves nothing changed: read the path
//! and the leaf, decide how many blocks the insert needs (one leaf, plus
//! one per full index level, plus one when the root must grow a level —
//! ENOSPC first if the tree is at its depth limit), allocate them all, and
//! only then rewrite blocks. Every rewritten leaf gets its dirent checksum
//! tail, every index block its dx tail. An insert reads O(depth) blocks,
//! never scans the directory.
//!
//! Split rule (`do_split`): sort the leaf's records by hash, move the upper
//! part — records from the top while they fill less than half a block — to
//! the new leaf, whose index entry carries the first moved hash. When the
//! record below the split has the same hash, the run of equal hashes now
//! spans two leaves and the index entry gets [`HASH_COLLISION_BIT`], telling
//! lookups to continue into the next leaf (`ext4_htree_next_block`).

use std::sync::Arc;

use ext4kit_format::dirent::{self, rec_len_for};
use ext4kit_format::features::incompat;
use ext4kit_format::hash::{dx_hash, HashVersion};
use ext4kit_format::htree::{
    node_limit, parse_root, root_limit, write_node, write_root, DxEntry, DxIndex, DxInfo, DxRoot, FT_DIR,
    HASH_COLLISION_BIT, HTREE_LEVEL_COMPAT, HTREE_LEVEL_LARGEDIR, NODE_COUNT_OFFSET, ROOT_COUNT_OFFSET, ROOT_INFO_LEN,
};
use ext4kit_format::inode::{flags, Inode};

use super::buffer::Buffer;
use super::dir_leaf::{self, packed_size, LeafLayout, NewRec, Rec};
use super::dirblock::{self, DirRef, LeafAccess};
use super::htree::{self, DxPath, DxProbe, InsertHint};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// A leaf's records split in two by hash (`do_split`'s result before the
/// blocks are built).
struct Split {
    lower: Vec<Rec>,
    upper: Vec<Rec>,
    /// The index hash of the upper leaf, collision bit included.
    hash: u32,
}

/// `do_split`'s choice over records sorted by hash: from the top, move
/// records while the moved part stays under half of `limit` bytes; if that
/// moves everything (or nothing), split by count. The new entry (`new`,
/// with hash `new_hash`) then joins the half its hash belongs to.
fn split_records(mut recs: Vec<(u32, Rec)>, new: (u32, Rec), limit: usize) -> Split {
    recs.sort_by_key(|(h, _)| *h);
    let count = recs.len();
    let mut size = 0;
    let mut moved = 0;
    let mut stopped = false;
    for (_, r) in recs.iter().rev() {
        let s = rec_len_for(r.name.len());
        if size + s / 2 > limit / 2 {
            stopped = true;
            break;
        }
        size += s;
        moved += 1;
    }
    let split = if stopped && moved > 0 && moved < count {
        count - moved
    } else {
        (count / 2).max(1)
    };
    let hash2 = recs[split].0;
    let continued = recs[split - 1].0 == hash2;
    let upper_hash = hash2 | if continued { HASH_COLLISION_BIT } else { 0 };
    let (nh, nr) = new;
    let mut upper: Vec<(u32, Rec)> = recs.split_off(split);
    let mut lower = recs;
    // A name whose hash equals hash2 belongs with the upper records unless
    // the run continues from the lower leaf (lookups start at the lower
    // one and follow the chain, so either is found; the kernel puts it by
    // `hinfo->hash >= hash2`).
    if nh >= hash2 {
        upper.push((nh, nr));
    } else {
        lower.push((nh, nr));
    }
    Split {
        lower: lower.into_iter().map(|(_, r)| r).collect(),
        upper: upper.into_iter().map(|(_, r)| r).collect(),
        hash: upper_hash,
    }
}

fn hash_of(vol: &Volume, name: &[u8], version: HashVersion) -> u32 {
    dx_hash(name, version, vol.geo().hash_seed()).0
}

/// The hash function a new index uses: `s_def_hash_version`, with the
/// superblock's signedness flag (kernel `make_indexed_dir`).
fn default_hash_version(vol: &Volume) -> Result<HashVersion> {
    let v = vol.sb().read().def_hash_version;
    HashVersion::from_disk(v)
        .map(|h| HashVersion {
            unsigned: vol.geo().unsigned_hash(),
            ..h
        })
        .ok_or_else(|| Error::Unsupported(format!("default directory hash version {v}")))
}

/// Block 0 of a one-block linear directory about to become an htree, and
/// the inodes of its "." and "..": it must start with "." (rec_len 12)
/// and "..", whose places the dx root keeps (`make_indexed_dir` checks the
/// same before it moves anything).
pub(crate) struct DotBlock {
    buf: Arc<Buffer>,
    dot: u32,
    dotdot: u32,
}

/// Read and check block 0 as [`DotBlock`] says.
pub(crate) fn read_dot_block(vol: &Volume, dir: DirRef<'_>) -> Result<DotBlock> {
    let loc = || format!("directory inode {}", dir.ino);
    let fmt = vol.geo().dir_format();
    let buf = dirblock::read_leaf(vol, dir, 0)?
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
    let (dot, dotdot) = (first.inode, second.inode);
    Ok(DotBlock { buf, dot, dotdot })
}

/// The records with their hashes under the directory's hash function.
fn hash_records(vol: &Volume, recs: Vec<Rec>, version: HashVersion) -> Vec<(u32, Rec)> {
    recs.into_iter().map(|r| (hash_of(vol, &r.name, version), r)).collect()
}

/// Turn a full one-block linear directory into an htree while adding
/// `rec` (`make_indexed_dir`): block 0 becomes the dx root, its records
/// move to two new leaves split by hash.
pub(crate) fn make_indexed_dir(
    vol: &Volume,
    h: &mut Handle<'_>,
    dir: DirRef<'_>,
    new_dir: &mut Inode,
    rec: NewRec<'_>,
) -> Result<bool> {
    let loc = || format!("directory inode {}", dir.ino);
    let seed = dir.csum_seed(vol);
    let layout = LeafLayout::of(vol.geo());
    let fmt = layout.fmt();
    let DotBlock { buf, dot, dotdot } = read_dot_block(vol, dir)?;
    let version = default_hash_version(vol)?;
    let hashed = hash_records(vol, layout.records(&buf.data, true), version);
    let new = (hash_of(vol, rec.name, version), rec.to_rec());
    let root_entries;
    let leaves: Vec<Vec<Rec>>;
    if hashed.len() < 2 {
        // Cannot happen for a full block of legal names; keep one leaf.
        let mut all: Vec<Rec> = hashed.into_iter().map(|(_, r)| r).collect();
        all.push(new.1);
        leaves = vec![all];
        root_entries = vec![DxEntry { hash: 0, block: 1 }];
    } else {
        let split = split_records(hashed, new, layout.limit());
        leaves = vec![split.lower, split.upper];
        root_entries = vec![
            DxEntry { hash: 0, block: 1 },
            DxEntry {
                hash: split.hash,
                block: 2,
            },
        ];
    }
    // Build every block before allocating, so nothing can fail after.
    let built = leaves
        .iter()
        .map(|l| layout.build(l, seed))
        .collect::<Result<Vec<_>>>()?;
    let csum = vol.geo().csum_seed().is_some();
    let root = DxRoot {
        dot_inode: dot,
        dotdot_inode: dotdot,
        file_type: if fmt.filetype { FT_DIR } else { 0 },
        info: DxInfo {
            hash_version: version.to_root(),
            info_length: ROOT_INFO_LEN,
            indirect_levels: 0,
            unused_flags: 0,
        },
        index: DxIndex {
            limit: root_limit(vol.block_size(), csum),
            count: root_entries.len() as u16,
            entries: root_entries,
            count_offset: ROOT_COUNT_OFFSET,
        },
    };
    let mut b = vec![0u8; vol.block_size()].into_boxed_slice();
    write_root(&mut b, &root, vol.block_size(), seed).map_err(|e| Error::corrupt(loc(), e))?;
    let pblks = dirblock::append(vol, h, dir.ino, new_dir, built.len() as u64)?;
    for (p, l) in pblks.into_iter().zip(built) {
        h.overwrite(p, l)?;
    }
    h.overwrite(buf.block, b)?;
    new_dir.base.flags |= flags::INDEX;
    Ok(true)
}

/// One insert into an indexed directory: the directory, the record it
/// gains, and what every step needs to write a block of it.
struct DxInsert<'d, 'n> {
    dir: DirRef<'d>,
    rec: NewRec<'n>,
    layout: LeafLayout,
    /// The directory's checksum seed (metadata_csum), for leaf and dx tails.
    seed: Option<u32>,
    /// Whether index blocks end in a `dx_tail` (metadata_csum), which
    /// takes one slot off `root_limit` and `node_limit`.
    csum: bool,
    largedir: bool,
}

impl DxInsert<'_, '_> {
    fn loc(&self) -> String {
        format!("htree of directory inode {}", self.dir.ino)
    }

    fn block_size(&self) -> usize {
        self.layout.fmt().block_size
    }

    /// The most levels below the root (`indirect_levels`) plus one that a
    /// tree may have (`ext4_dir_htree_level`).
    fn max_levels(&self) -> usize {
        let levels = if self.largedir {
            HTREE_LEVEL_LARGEDIR
        } else {
            HTREE_LEVEL_COMPAT
        };
        levels.into()
    }

    fn hole(&self, lblk: u64) -> Error {
        Error::corrupt_msg(self.loc(), "htree entry", format!("leaf {lblk} is a hole"))
    }
}

/// Insert into an indexed directory (`ext4_dx_add_entry`): probe (or take
/// the create's [`InsertHint`]), try the leaf the hash picks, repack it
/// when removals fragmented it, else split it (`do_split`) and add the new
/// leaf to the index, splitting full index nodes and adding a level when
/// the root is full. Returns whether the block map changed.
pub(crate) fn dx_add_entry(
    vol: &Volume,
    h: &mut Handle<'_>,
    dir: DirRef<'_>,
    new_dir: &mut Inode,
    rec: NewRec<'_>,
    hint: Option<InsertHint<'_>>,
) -> Result<bool> {
    let ins = DxInsert {
        dir,
        rec,
        layout: LeafLayout::of(vol.geo()),
        seed: dir.csum_seed(vol),
        csum: vol.geo().csum_seed().is_some(),
        largedir: vol.geo().has_incompat(incompat::LARGEDIR),
    };
    // The create's lookup already descended the index and walked the
    // leaf (see `InsertHint`): trusted for this name and directory only.
    let (probe, known_room) = match hint.filter(|x| x.fits(dir, rec.name)) {
        Some(x) => (x.probe, Some(x.room)),
        None => (htree::probe(vol, dir, rec.name)?, None),
    };
    let leaf_lblk = probe.leaf(vol, dir)?;
    if add_to_leaf(vol, h, &ins, leaf_lblk, known_room)? {
        return Ok(false);
    }
    let leaf = dirblock::read_leaf(vol, dir, leaf_lblk)?.ok_or_else(|| ins.hole(leaf_lblk))?;
    let recs = ins.layout.records(&leaf.data, false);
    if packed_size(&recs) + rec.rec_len() <= ins.layout.limit() {
        repack_leaf(h, &ins, leaf.block, recs)?;
        return Ok(false);
    }
    // Full leaf: count and check everything before touching anything.
    let new_blocks = blocks_needed(&ins, &probe)?;
    let index_pblks = index_blocks(vol, dir, &probe.path)?;
    let split = split_leaf(vol, &ins, &probe, leaf_lblk, recs)?;

    // Allocate everything, then modify.
    let mut blocks = NewBlocks::alloc(vol, h, dir, new_dir, new_blocks)?;
    let (new_leaf_lblk, new_leaf_pblk) = blocks.take()?;
    h.overwrite(leaf.block, split.lower)?;
    h.overwrite(new_leaf_pblk, split.upper)?;
    let mut index = IndexEdit::new(&probe);
    index.insert(
        h,
        &ins,
        DxEntry {
            hash: split.hash,
            block: new_leaf_lblk as u32,
        },
        &mut blocks,
    )?;
    index.write(h, &ins, &index_pblks)?;
    Ok(true)
}

/// Put the record in the probed leaf if one record's slack holds it
/// (`add_dirent_to_buf`); `known` is the create's finding for this leaf.
/// The common case: root, nodes and one leaf read — as a writer's, so the
/// leaf's draft is edited in place. Returns whether it went in.
fn add_to_leaf(
    vol: &Volume,
    h: &mut Handle<'_>,
    ins: &DxInsert<'_, '_>,
    leaf_lblk: u64,
    known: Option<Option<(u64, usize)>>,
) -> Result<bool> {
    let (layout, rec) = (ins.layout, ins.rec);
    let need = rec.rec_len();
    let room = match known {
        Some(room) => room,
        None => {
            let (pblk, slot) = dirblock::with_leaf(vol, ins.dir, leaf_lblk, LeafAccess::Write, |pblk, d| {
                (pblk, layout.find_slot(d, need))
            })?
            .ok_or_else(|| ins.hole(leaf_lblk))?;
            slot.map(|off| (pblk, off))
        }
    };
    let Some((pblk, off)) = room else {
        return Ok(false);
    };
    h.modify(pblk, |d| {
        debug_assert_eq!(
            layout.find_slot(d, need),
            Some(off),
            "an insert hint that no longer matches its leaf"
        );
        dir_leaf::insert_at(d, off, layout.fmt(), rec);
        dir_leaf::set_tail(d, ins.seed);
        Ok(())
    })?;
    Ok(true)
}

/// No single gap fits, but the live records packed tight leave room (a
/// leaf fragmented by removals): rewrite the leaf packed, with the new
/// record, instead of splitting it. (The kernel splits here; a split
/// would cost a block and an index entry the leaf does not need.)
fn repack_leaf(h: &mut Handle<'_>, ins: &DxInsert<'_, '_>, pblk: u64, mut recs: Vec<Rec>) -> Result<()> {
    recs.push(ins.rec.to_rec());
    let b = ins.layout.build(&recs, ins.seed)?;
    h.overwrite(pblk, b)
}

/// Blocks a leaf split needs: the new leaf, one per full index block from
/// the bottom up, and one more when the root itself is full (a new
/// level). ENOSPC when that new level would pass the depth limit.
fn blocks_needed(ins: &DxInsert<'_, '_>, probe: &DxProbe) -> Result<u64> {
    let (path, levels, max_levels) = (&probe.path, probe.levels, ins.max_levels());
    let mut need = 1u64;
    for k in (0..path.len()).rev() {
        let idx = &path[k].0;
        if idx.entries.len() < idx.limit as usize {
            break;
        }
        if k == 0 && levels + 1 >= max_levels {
            return Err(Error::posix(
                Errno::ENOSPC,
                format!(
                    "directory inode {}: htree index full at {} levels (the limit{})",
                    ins.dir.ino,
                    levels + 1,
                    if max_levels == HTREE_LEVEL_COMPAT as usize {
                        " without large_dir"
                    } else {
                        ""
                    }
                ),
            ));
        }
        need += 1;
    }
    Ok(need)
}

/// Physical blocks of the index blocks on `path`: the root (block 0),
/// then each node down to the leaf's parent.
fn index_blocks(vol: &Volume, dir: DirRef<'_>, path: &DxPath) -> Result<Vec<u64>> {
    let mut lblks = vec![0u64];
    for (idx, at) in &path[..path.len() - 1] {
        lblks.push(idx.entries[*at].block as u64);
    }
    let mut pblks = Vec::with_capacity(lblks.len());
    for &l in &lblks {
        pblks.push(dirblock::pblk(vol, dir, l)?);
    }
    Ok(pblks)
}

/// A full leaf's records and the new one, split by hash and built as two
/// leaf blocks: the lower half rewrites the leaf, the upper half goes to
/// the new leaf whose index entry carries `hash`.
struct LeafSplit {
    lower: Box<[u8]>,
    upper: Box<[u8]>,
    hash: u32,
}

/// `do_split`: hash the leaf's records with the directory's hash
/// function, split them and the new record by hash ([`split_records`]),
/// and build both leaves.
fn split_leaf(
    vol: &Volume,
    ins: &DxInsert<'_, '_>,
    probe: &DxProbe,
    leaf_lblk: u64,
    recs: Vec<Rec>,
) -> Result<LeafSplit> {
    let hashed = hash_records(vol, recs, probe.version);
    // Packed, the records overflow with the new one: there are at least
    // two of them (one record of at most 263 bytes plus another always
    // fit a 1 KiB leaf), so the split below has two sides.
    if hashed.len() < 2 {
        return Err(Error::corrupt_msg(
            ins.loc(),
            "htree leaf",
            format!("leaf {leaf_lblk} is full with {} records", hashed.len()),
        ));
    }
    let split = split_records(hashed, (probe.hash, ins.rec.to_rec()), ins.layout.limit());
    Ok(LeafSplit {
        lower: ins.layout.build(&split.lower, ins.seed)?,
        upper: ins.layout.build(&split.upper, ins.seed)?,
        hash: split.hash,
    })
}

/// The blocks an insert allocated before changing anything, handed out in
/// logical order as the split consumes them.
struct NewBlocks {
    first_lblk: u64,
    pblks: Vec<u64>,
    next: usize,
}

impl NewBlocks {
    /// Append `n` blocks to the directory (`new_dir` records the growth).
    fn alloc(vol: &Volume, h: &mut Handle<'_>, dir: DirRef<'_>, new_dir: &mut Inode, n: u64) -> Result<Self> {
        let first_lblk = dir.nblocks(vol);
        let pblks = dirblock::append(vol, h, dir.ino, new_dir, n)?;
        Ok(Self {
            first_lblk,
            pblks,
            next: 0,
        })
    }

    /// The next block: (logical, physical). [`blocks_needed`] counted
    /// exactly the overflows the split meets; running out would be a bug,
    /// reported rather than a panic.
    fn take(&mut self) -> Result<(u64, u64)> {
        let i = self.next;
        self.next += 1;
        let p = self
            .pblks
            .get(i)
            .copied()
            .ok_or_else(|| Error::posix(Errno::EIO, "htree split needed more blocks than it counted"))?;
        Ok((self.first_lblk + i as u64, p))
    }
}

/// The index blocks on a probe's path as an insert changes them (the
/// kernel's `dx_frame`s): a copy of the root and of each node down to the
/// leaf's parent, the entry each path step came through, which blocks
/// changed, and the tree's depth after the insert.
struct IndexEdit<'p> {
    path: &'p DxPath,
    indexes: Vec<DxIndex>,
    dirty: Vec<bool>,
    levels: usize,
}

impl<'p> IndexEdit<'p> {
    fn new(probe: &'p DxProbe) -> Self {
        let indexes: Vec<DxIndex> = probe.path.iter().map(|(i, _)| DxIndex::clone(i)).collect();
        let dirty = vec![false; indexes.len()];
        Self {
            path: &probe.path,
            indexes,
            dirty,
            levels: probe.levels,
        }
    }

    /// Add `entry` (a new leaf) right after the entry the path came
    /// through at the bottom level, bottom-up: a block that overflows its
    /// limit splits (`dx_insert_block` into the parent), a full root moves
    /// its entries down into a new node (a new level). New index blocks
    /// are written here; the changed ones on the path by [`Self::write`].
    fn insert(
        &mut self,
        h: &mut Handle<'_>,
        ins: &DxInsert<'_, '_>,
        entry: DxEntry,
        blocks: &mut NewBlocks,
    ) -> Result<()> {
        let mut carry = Some(entry);
        for k in (0..self.indexes.len()).rev() {
            let Some(e) = carry.take() else { break };
            let at = self.path[k].1;
            let idx = &mut self.indexes[k];
            idx.entries.insert(at + 1, e);
            self.dirty[k] = true;
            if idx.entries.len() <= idx.limit as usize {
                continue;
            }
            let (nl, np) = blocks.take()?;
            if k > 0 {
                carry = Some(split_node(h, ins, idx, (nl, np))?);
            } else {
                add_level(h, ins, idx, (nl, np))?;
                self.levels += 1;
            }
        }
        Ok(())
    }

    /// Rewrite the changed index blocks on the path (`pblks`, root first):
    /// the root keeps its `dx_root_info` and gets the new depth, every
    /// block its entries, count and dx tail.
    fn write(&self, h: &mut Handle<'_>, ins: &DxInsert<'_, '_>, pblks: &[u64]) -> Result<()> {
        let (bs, large, seed) = (ins.block_size(), ins.largedir, ins.seed);
        let loc = || ins.loc();
        for (k, idx) in self.indexes.iter().enumerate() {
            if !self.dirty[k] {
                continue;
            }
            if k == 0 {
                h.modify(pblks[0], |d| {
                    let mut root = parse_root(d, bs, large, None).map_err(|e| Error::corrupt(loc(), e))?;
                    root.index.entries = idx.entries.clone();
                    root.index.count = idx.entries.len() as u16;
                    root.info.indirect_levels = self.levels as u8;
                    write_root(d, &root, bs, seed).map_err(|e| Error::corrupt(loc(), e))
                })?;
            } else {
                h.modify(pblks[k], |d| {
                    let mut i = idx.clone();
                    i.count = i.entries.len() as u16;
                    i.count_offset = NODE_COUNT_OFFSET;
                    write_node(d, &i, bs, seed).map_err(|e| Error::corrupt(loc(), e))
                })?;
            }
        }
        Ok(())
    }
}

/// Split an overflowing index node by count into the new block `(lblk,
/// pblk)`: the upper half moves there, and its first hash goes up to the
/// parent as the entry to add right after the one we came through.
fn split_node(
    h: &mut Handle<'_>,
    ins: &DxInsert<'_, '_>,
    idx: &mut DxIndex,
    (lblk, pblk): (u64, u64),
) -> Result<DxEntry> {
    let half = idx.entries.len() / 2;
    let upper = idx.entries.split_off(half);
    let up_hash = upper[0].hash;
    write_new_node(h, ins, pblk, upper)?;
    Ok(DxEntry {
        hash: up_hash,
        block: lblk as u32,
    })
}

/// Add a level under a full root: its entries (the new one included —
/// `root_limit` < `node_limit`, so they fit) move to the new node `(lblk,
/// pblk)`, and the root keeps one entry pointing at it.
fn add_level(h: &mut Handle<'_>, ins: &DxInsert<'_, '_>, root: &mut DxIndex, (lblk, pblk): (u64, u64)) -> Result<()> {
    let all = std::mem::take(&mut root.entries);
    write_new_node(h, ins, pblk, all)?;
    root.entries = vec![DxEntry {
        hash: 0,
        block: lblk as u32,
    }];
    Ok(())
}

/// Write a new index node at `pblk` holding `entries`.
fn write_new_node(h: &mut Handle<'_>, ins: &DxInsert<'_, '_>, pblk: u64, entries: Vec<DxEntry>) -> Result<()> {
    let bs = ins.block_size();
    let idx = DxIndex {
        limit: node_limit(bs, ins.csum),
        count: entries.len() as u16,
        entries,
        count_offset: NODE_COUNT_OFFSET,
    };
    let mut b = vec![0u8; bs].into_boxed_slice();
    write_node(&mut b, &idx, bs, ins.seed).map_err(|e| Error::corrupt(format!("new htree node at block {pblk}"), e))?;
    h.overwrite(pblk, b)
}

#[cfg(test)]
mod tests {
    use super::dir_leaf::RecName;
    use super::*;

    fn rec(n: usize) -> Rec {
        Rec {
            ino: n as u32 + 11,
            name: RecName::from_slice(format!("n{n:05}").as_bytes()),
            ft: 1,
        }
    }

    #[test]
    fn split_halves_by_size_and_routes_the_new_entry() {
        let recs: Vec<(u32, Rec)> = (0..60).map(|i| ((i as u32) * 100, rec(i))).collect();
        let Split {
            lower: lo,
            upper: hi,
            hash: h2,
        } = split_records(recs, (5001, rec(99)), 1012);
        assert_eq!(lo.len() + hi.len(), 61);
        assert!(packed_size(&lo) <= 1012 && packed_size(&hi) <= 1012);
        assert!(hi.len() >= 29 && hi.len() <= 33, "{}", hi.len());
        assert_eq!(h2 & HASH_COLLISION_BIT, 0);
        assert!(hi.iter().any(|r| &r.name[..] == b"n00099") == (5001 >= h2));
    }

    #[test]
    fn split_inside_an_equal_hash_run_sets_the_collision_bit() {
        let recs: Vec<(u32, Rec)> = (0..60).map(|i| (7000, rec(i))).collect();
        let Split {
            lower: lo,
            upper: hi,
            hash: h2,
        } = split_records(recs, (100, rec(99)), 1012);
        assert_eq!(h2, 7000 | HASH_COLLISION_BIT);
        assert!(lo.iter().any(|r| &r.name[..] == b"n00099"));
        assert!(!hi.is_empty() && lo.len() > 1);
    }
}
