//! Growing an htree: turning a full one-block directory into an index
//! (`make_indexed_dir`), splitting a full leaf at its median hash
//! (`do_split`), splitting full index nodes and adding a level at the root
//! (`ext4_dx_add_entry`).
//!
//! Order of work, so that a failure leaves nothing changed: read the path
//! and the leaf, decide how many blocks the insert needs (one leaf, plus
//! one per full index level, plus one when the root must grow a level —
//! ENOSPC first if the tree is at its depth limit), allocate them all, and
//! only then rewrite blocks. Every rewritten leaf gets its dirent checksum
//! tail, every index block its dx tail.
//!
//! Split rule (`do_split`): sort the leaf's records by hash, move the upper
//! part — records from the top while they fill less than half a block — to
//! the new leaf, whose index entry carries the first moved hash. When the
//! record below the split has the same hash, the run of equal hashes now
//! spans two leaves and the index entry gets [`HASH_COLLISION_BIT`], telling
//! lookups to continue into the next leaf (`ext4_htree_next_block`).

use ext4kit_format::hash::{dx_hash, HashVersion};
use ext4kit_format::htree::{
    self, node_limit, root_limit, DxEntry, DxIndex, DxInfo, DxRoot, HASH_COLLISION_BIT, HTREE_LEVEL_COMPAT,
    HTREE_LEVEL_LARGEDIR, NODE_COUNT_OFFSET, ROOT_COUNT_OFFSET, ROOT_INFO_LEN,
};
use ext4kit_format::inode::{flags, Inode};

use super::dir::{DirRef, LeafAccess};
use super::dir_insert::{find_slot, insert_at, leaf_records, packed_size, Rec, RecName};
use super::htree::{DxProbe, InsertHint};
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};
use ext4kit_format::dirent::rec_len_for;
use ext4kit_format::features::incompat;

/// A leaf's records split in two by hash: (lower, upper, index hash of the
/// upper leaf, collision bit included).
type Split = (Vec<Rec>, Vec<Rec>, u32);

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
    (
        lower.into_iter().map(|(_, r)| r).collect(),
        upper.into_iter().map(|(_, r)| r).collect(),
        upper_hash,
    )
}

impl Volume {
    fn csum_tails(&self) -> bool {
        self.geo().csum_seed().is_some()
    }

    fn hash_of(&self, name: &[u8], version: HashVersion) -> u32 {
        dx_hash(name, version, self.geo().hash_seed()).0
    }

    /// The hash function a new index uses: `s_def_hash_version`, with the
    /// superblock's signedness flag (kernel `make_indexed_dir`).
    fn default_hash_version(&self) -> Result<HashVersion> {
        let v = self.sb().read().def_hash_version;
        HashVersion::from_disk(v)
            .map(|h| HashVersion {
                unsigned: self.geo().unsigned_hash(),
                ..h
            })
            .ok_or_else(|| Error::Unsupported(format!("default directory hash version {v}")))
    }

    /// Turn a full one-block linear directory into an htree while adding
    /// `name` (`make_indexed_dir`): block 0 becomes the dx root, its
    /// records move to two new leaves split by hash.
    pub(crate) fn make_indexed_dir(
        &self,
        h: &mut Handle<'_>,
        dir: DirRef<'_>,
        new_dir: &mut Inode,
        name: &[u8],
        ino: u32,
        ftb: u8,
    ) -> Result<bool> {
        let loc = || format!("directory inode {}", dir.ino);
        let seed = self.geo().inode_seed(dir.ino, dir.inode.base.generation);
        let fmt = self.geo().dir_format();
        let buf = self
            .dir_leaf(dir, 0)?
            .ok_or_else(|| Error::corrupt_msg(loc(), "directory block", "block 0 is a hole"))?;
        let first = ext4kit_format::dirent::entry_at(&buf.data, 0, fmt);
        let second = ext4kit_format::dirent::entry_at(&buf.data, first.rec_len.min(buf.data.len() - 8), fmt);
        if first.name != b"." || second.name != b".." || first.rec_len != 12 {
            return Err(Error::corrupt_msg(
                loc(),
                "directory block",
                "block 0 does not start with \".\" (rec_len 12) and \"..\"",
            ));
        }
        let version = self.default_hash_version()?;
        let recs = leaf_records(&buf.data, self.leaf_limit(), fmt, true);
        let hashed: Vec<(u32, Rec)> = recs.into_iter().map(|r| (self.hash_of(&r.name, version), r)).collect();
        let new = (
            self.hash_of(name, version),
            Rec {
                ino,
                name: RecName::from_slice(name),
                ft: ftb,
            },
        );
        let root_entries;
        let leaves: Vec<Vec<Rec>>;
        if hashed.len() < 2 {
            // Cannot happen for a full block of legal names; keep one leaf.
            let mut all: Vec<Rec> = hashed.into_iter().map(|(_, r)| r).collect();
            all.push(new.1);
            leaves = vec![all];
            root_entries = vec![DxEntry { hash: 0, block: 1 }];
        } else {
            let (lo, hi, hash2) = split_records(hashed, new, self.leaf_limit());
            leaves = vec![lo, hi];
            root_entries = vec![DxEntry { hash: 0, block: 1 }, DxEntry { hash: hash2, block: 2 }];
        }
        // Build every block before allocating, so nothing can fail after.
        let built = leaves
            .iter()
            .map(|l| self.build_leaf(l, seed))
            .collect::<Result<Vec<_>>>()?;
        let csum = self.csum_tails();
        let root = DxRoot {
            dot_inode: first.inode,
            dotdot_inode: second.inode,
            file_type: if fmt.filetype { htree::FT_DIR } else { 0 },
            info: DxInfo {
                hash_version: version.to_root(),
                info_length: ROOT_INFO_LEN,
                indirect_levels: 0,
                unused_flags: 0,
            },
            index: DxIndex {
                limit: root_limit(self.block_size(), csum),
                count: root_entries.len() as u16,
                entries: root_entries,
                count_offset: ROOT_COUNT_OFFSET,
            },
        };
        let mut b = vec![0u8; self.block_size()].into_boxed_slice();
        htree::write_root(&mut b, &root, self.block_size(), seed).map_err(|e| Error::corrupt(loc(), e))?;
        let pblks = self.grow_dir(h, dir.ino, new_dir, 1, built.len() as u64)?;
        for (p, l) in pblks.into_iter().zip(built) {
            h.overwrite(p, l)?;
        }
        h.overwrite(buf.block, b)?;
        new_dir.base.flags |= flags::INDEX;
        Ok(true)
    }

    /// Insert into an indexed directory (`ext4_dx_add_entry`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dx_add_entry(
        &self,
        h: &mut Handle<'_>,
        dir: DirRef<'_>,
        new_dir: &mut Inode,
        name: &[u8],
        ino: u32,
        ftb: u8,
        hint: Option<InsertHint<'_>>,
    ) -> Result<bool> {
        let loc = || format!("htree of directory inode {}", dir.ino);
        let seed = self.geo().inode_seed(dir.ino, dir.inode.base.generation);
        let fmt = self.geo().dir_format();
        let limit = self.leaf_limit();
        let need = rec_len_for(name.len());
        // The create's lookup already descended the index and walked the
        // leaf (see `InsertHint`): trusted for this name and directory only.
        let hint = hint.filter(|x| x.name == name && x.dir_ino == dir.ino && x.dir_size == dir.inode.size());
        let (probe, known) = match hint {
            Some(x) => (x.probe, Some(x.room)),
            None => (self.dx_probe(dir, name)?, None),
        };
        let DxProbe {
            hash,
            version,
            path,
            levels,
        } = probe;
        let leaf_lblk = self.dx_child(dir, path.last())?;
        let hole = || Error::corrupt_msg(loc(), "htree entry", format!("leaf {leaf_lblk} is a hole"));
        // The common case: room in the leaf. Root, nodes and one leaf read
        // — as a writer's, so the leaf's draft is edited in place.
        let room = match known {
            Some(room) => room,
            None => {
                let (pblk, slot) = self
                    .with_leaf(dir, leaf_lblk, LeafAccess::Write, |pblk, d| {
                        (pblk, find_slot(d, limit, fmt, need))
                    })?
                    .ok_or_else(hole)?;
                slot.map(|off| (pblk, off))
            }
        };
        if let Some((pblk, off)) = room {
            h.modify(pblk, |d| {
                debug_assert_eq!(
                    find_slot(d, limit, fmt, need),
                    Some(off),
                    "an insert hint that no longer matches its leaf"
                );
                insert_at(d, off, fmt, name, ino, ftb);
                self.finish_leaf(d, seed);
                Ok(())
            })?;
            return Ok(false);
        }
        let leaf = self.dir_leaf(dir, leaf_lblk)?.ok_or_else(hole)?;

        // No single gap fits, but the live records packed tight leave room
        // (a leaf fragmented by removals): compact it in place, no split.
        let recs = leaf_records(&leaf.data, limit, fmt, false);
        if packed_size(&recs) + rec_len_for(name.len()) <= limit {
            let mut all = recs;
            all.push(Rec {
                ino,
                name: RecName::from_slice(name),
                ft: ftb,
            });
            let b = self.build_leaf(&all, seed)?;
            h.overwrite(leaf.block, b)?;
            return Ok(false);
        }

        // Full leaf. Count the blocks the insert needs before touching
        // anything: the new leaf, one per full level from the bottom up,
        // and one more if the root itself is full (a new level).
        let max_levels = if self.geo().has_incompat(incompat::LARGEDIR) {
            HTREE_LEVEL_LARGEDIR
        } else {
            HTREE_LEVEL_COMPAT
        } as usize;
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
                        dir.ino,
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
        // Physical blocks of the index levels (lblk 0 for the root).
        let mut lblks = vec![0u64];
        for (idx, at) in &path[..path.len() - 1] {
            lblks.push(idx.entries[*at].block as u64);
        }
        let mut pblks = Vec::with_capacity(lblks.len());
        for &l in &lblks {
            pblks.push(self.dir_pblk(dir, l)?);
        }
        let hashed: Vec<(u32, Rec)> = recs.into_iter().map(|r| (self.hash_of(&r.name, version), r)).collect();
        // Packed, the records overflow with the new one: there are at
        // least two of them (one record of at most 263 bytes plus another
        // always fit a 1 KiB leaf), so the split below has two sides.
        if hashed.len() < 2 {
            return Err(Error::corrupt_msg(
                loc(),
                "htree leaf",
                format!("leaf {leaf_lblk} is full with {} records", hashed.len()),
            ));
        }
        let new = (
            hash,
            Rec {
                ino,
                name: RecName::from_slice(name),
                ft: ftb,
            },
        );
        let (lo, hi, hash2) = split_records(hashed, new, limit);
        let (lo_b, hi_b) = (self.build_leaf(&lo, seed)?, self.build_leaf(&hi, seed)?);

        // Allocate everything, then modify.
        let first_new = dir.nblocks(self);
        let new_pblks = self.grow_dir(h, dir.ino, new_dir, first_new, need)?;
        let mut next_new = 0usize;
        // `need` counted exactly the overflows below; running out would be
        // a bug, reported rather than a panic.
        let mut take = || -> Result<(u64, u64)> {
            let i = next_new;
            next_new += 1;
            let p = new_pblks
                .get(i)
                .copied()
                .ok_or_else(|| Error::posix(Errno::EIO, "htree split needed more blocks than it counted"))?;
            Ok((first_new + i as u64, p))
        };

        let (new_leaf_l, new_leaf_p) = take()?;
        h.overwrite(leaf.block, lo_b)?;
        h.overwrite(new_leaf_p, hi_b)?;

        // Insert the new leaf's entry bottom-up, splitting full nodes.
        let csum = self.csum_tails();
        let mut indexes: Vec<DxIndex> = path.iter().map(|(i, _)| DxIndex::clone(i)).collect();
        let mut new_levels = levels;
        let mut ins = Some(DxEntry {
            hash: hash2,
            block: new_leaf_l as u32,
        });
        let mut dirty = vec![false; indexes.len()];
        for k in (0..indexes.len()).rev() {
            let Some(e) = ins.take() else { break };
            let at = path[k].1;
            indexes[k].entries.insert(at + 1, e);
            dirty[k] = true;
            if indexes[k].entries.len() <= indexes[k].limit as usize {
                continue;
            }
            let (nl, np) = take()?;
            if k > 0 {
                // Split the node by count; the upper half's first hash goes
                // up to the parent, right after the entry we came through.
                let half = indexes[k].entries.len() / 2;
                let upper = indexes[k].entries.split_off(half);
                let up_hash = upper[0].hash;
                self.write_new_node(h, np, upper, seed, csum)?;
                ins = Some(DxEntry {
                    hash: up_hash,
                    block: nl as u32,
                });
            } else {
                // Root full: its entries move to a new node below it.
                let all = std::mem::take(&mut indexes[0].entries);
                self.write_new_node(h, np, all, seed, csum)?;
                indexes[0].entries = vec![DxEntry {
                    hash: 0,
                    block: nl as u32,
                }];
                new_levels += 1;
            }
        }
        let bs = self.block_size();
        let large = self.geo().has_incompat(incompat::LARGEDIR);
        for k in 0..indexes.len() {
            if !dirty[k] {
                continue;
            }
            let idx = &indexes[k];
            if k == 0 {
                h.modify(pblks[0], |d| {
                    let mut root = htree::parse_root(d, bs, large, None).map_err(|e| Error::corrupt(loc(), e))?;
                    root.index.entries = idx.entries.clone();
                    root.index.count = idx.entries.len() as u16;
                    root.info.indirect_levels = new_levels as u8;
                    htree::write_root(d, &root, bs, seed).map_err(|e| Error::corrupt(loc(), e))
                })?;
            } else {
                h.modify(pblks[k], |d| {
                    let mut i = idx.clone();
                    i.count = i.entries.len() as u16;
                    i.count_offset = NODE_COUNT_OFFSET;
                    htree::write_node(d, &i, bs, seed).map_err(|e| Error::corrupt(loc(), e))
                })?;
            }
        }
        Ok(true)
    }

    fn write_new_node(
        &self,
        h: &mut Handle<'_>,
        pblk: u64,
        entries: Vec<DxEntry>,
        seed: Option<u32>,
        csum: bool,
    ) -> Result<()> {
        let idx = DxIndex {
            limit: node_limit(self.block_size(), csum),
            count: entries.len() as u16,
            entries,
            count_offset: NODE_COUNT_OFFSET,
        };
        let mut b = vec![0u8; self.block_size()].into_boxed_slice();
        htree::write_node(&mut b, &idx, self.block_size(), seed)
            .map_err(|e| Error::corrupt(format!("new htree node at block {pblk}"), e))?;
        h.overwrite(pblk, b)
    }
}

#[cfg(test)]
mod tests {
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
        let (lo, hi, h2) = split_records(recs, (5001, rec(99)), 1012);
        assert_eq!(lo.len() + hi.len(), 61);
        assert!(packed_size(&lo) <= 1012 && packed_size(&hi) <= 1012);
        assert!(hi.len() >= 29 && hi.len() <= 33, "{}", hi.len());
        assert_eq!(h2 & HASH_COLLISION_BIT, 0);
        assert!(hi.iter().any(|r| &r.name[..] == b"n00099") == (5001 >= h2));
    }

    #[test]
    fn split_inside_an_equal_hash_run_sets_the_collision_bit() {
        let recs: Vec<(u32, Rec)> = (0..60).map(|i| (7000, rec(i))).collect();
        let (lo, hi, h2) = split_records(recs, (100, rec(99)), 1012);
        assert_eq!(h2, 7000 | HASH_COLLISION_BIT);
        assert!(lo.iter().any(|r| &r.name[..] == b"n00099"));
        assert!(!hi.is_empty() && lo.len() > 1);
    }
}
