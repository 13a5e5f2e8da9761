//! Indexed directory lookup (dir_index / htree): hash the name, descend
//! the dx root and up to two (three with largedir) levels of index nodes by
//! binary search, then scan one leaf block — a constant number of block
//! reads whatever the directory size (seed 004). Leaves that share a hash
//! are chained by the collision bit of the next index entry.

use std::sync::Arc;

use ext4kit_format::features::incompat;
use ext4kit_format::hash::{dx_hash, HashVersion};
use ext4kit_format::htree::{self, DxIndex};
use ext4kit_format::inode::FileType;

use super::buffer::Buffer;
use super::dir::{DirRef, LeafAccess};
use super::volume::Volume;
use crate::error::{Error, Result};

/// The (index, chosen entry) pairs from the root down to a leaf.
/// Inline up to 3 levels (a largedir htree's most), so a probe — two per
/// create — allocates nothing.
pub(crate) type DxPath = smallvec::SmallVec<[(Arc<DxIndex>, usize); 3]>;

/// What [`Volume::dx_probe`] found: the name's hash, the directory's hash
/// function, and the path from the root down to the leaf's index entry.
#[derive(Debug, Clone)]
pub(crate) struct DxProbe {
    /// Major hash of the name.
    pub hash: u32,
    /// The hash function of this directory (root's version + superblock flag).
    pub version: HashVersion,
    /// (index, chosen entry) from the root (level 0) down.
    pub path: DxPath,
    /// `indirect_levels` of the root.
    pub levels: usize,
}

/// Where `add_link` puts a name that the lookup of a create proved absent
/// from an indexed directory: that lookup's descent of the index and, when
/// the leaf has room, the record whose slack takes the name — found in the
/// same pass over the leaf that looked for the name. A create then
/// descends the index and walks the leaf once instead of twice (at a
/// million names the second descent was one more cold index node, the
/// second walk one more pass over a 4 KiB leaf; seed 004).
///
/// Valid only for that name in that directory, while the caller holds the
/// directory's lock for writing and has changed nothing in it since;
/// `add_link` ignores a hint for another name, directory or size.
#[derive(Debug)]
pub struct InsertHint<'n> {
    pub(crate) name: &'n [u8],
    pub(crate) dir_ino: u32,
    pub(crate) dir_size: u64,
    pub(crate) probe: DxProbe,
    /// The leaf's physical block and the offset of the record with room
    /// (`None`: the leaf is full and must be compacted or split).
    pub(crate) room: Option<(u64, usize)>,
}

/// What the lookup of a create found.
#[derive(Debug)]
pub enum CreateLookup<'n> {
    /// The name is taken.
    Exists,
    /// The name is free; in an indexed directory, where it goes.
    Absent(Option<InsertHint<'n>>),
}

/// Whether the leaf after `path`'s starts a hash that continues `hash` (a
/// collision chain): the test [`Volume::dx_next_leaf`] makes before it
/// moves, without moving.
fn dx_chain_continues(path: &DxPath, hash: u32) -> bool {
    path.iter()
        .rev()
        .find_map(|(idx, at)| idx.entries.get(at + 1))
        .is_some_and(|next| next.hash & !htree::HASH_COLLISION_BIT == hash)
}

impl Volume {
    fn largedir(&self) -> bool {
        self.geo().has_incompat(incompat::LARGEDIR)
    }

    /// Block 0 of an indexed directory, validated as a dx root once.
    pub(crate) fn dx_root_block(&self, dir: DirRef<'_>) -> Result<Option<Arc<Buffer>>> {
        let Some(buf) = self.dir_block_raw(dir, 0)? else {
            return Err(Error::corrupt_msg(
                format!("directory inode {}", dir.ino),
                "htree root",
                "block 0 is a hole",
            ));
        };
        let seed = self.geo().inode_seed(dir.ino, dir.inode.base.generation);
        let (bs, large) = (self.block_size(), self.largedir());
        buf.check_once(|d| htree::parse_root(d, bs, large, seed).map(|_| ()))
            .map_err(|e| {
                Error::corrupt(
                    format!("htree root of directory inode {} (disk block {})", dir.ino, buf.block),
                    e,
                )
            })?;
        Ok(Some(buf))
    }

    pub(crate) fn dx_node(&self, dir: DirRef<'_>, lblk: u64) -> Result<Arc<DxIndex>> {
        let loc = || format!("htree node {lblk} of directory inode {}", dir.ino);
        let Some(buf) = self.dir_block_raw(dir, lblk)? else {
            return Err(Error::corrupt_msg(loc(), "htree node", "points at a hole"));
        };
        let seed = self.geo().inode_seed(dir.ino, dir.inode.base.generation);
        let bs = self.block_size();
        buf.check_once(|d| htree::parse_node(d, bs, seed).map(|_| ()))
            .map_err(|e| Error::corrupt(loc(), e))?;
        buf.dx_index(|d| htree::parse_node(d, bs, None).map(|i| (None, i)))
            .map(|(_, i)| i)
            .map_err(|e| Error::corrupt(loc(), e))
    }

    /// Hash `name` and descend the index to its leaf (the kernel's
    /// `dx_probe`): the hash, the path of (index, chosen entry) from the root
    /// down, and the number of index levels below the root.
    pub(crate) fn dx_probe(&self, dir: DirRef<'_>, name: &[u8]) -> Result<DxProbe> {
        let loc = || format!("htree of directory inode {}", dir.ino);
        let rootbuf = self
            .dx_root_block(dir)?
            .ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
        let (bs, large) = (self.block_size(), self.largedir());
        let (info, index) = rootbuf
            .dx_index(|d| htree::parse_root(d, bs, large, None).map(|r| (Some(r.info), r.index)))
            .map_err(|e| Error::corrupt(loc(), e))?;
        let info = info.ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "decoded as an index node"))?;
        let version = HashVersion::from_root(info.hash_version, self.geo().unsigned_hash()).ok_or_else(|| {
            Error::corrupt_msg(
                loc(),
                "htree root",
                format!("unknown hash version {}", info.hash_version),
            )
        })?;
        let (hash, _minor) = dx_hash(name, version, self.geo().hash_seed());
        let levels = info.indirect_levels as usize;
        let mut path = DxPath::new();
        let i = index.find(hash);
        path.push((index, i));
        for _ in 0..levels {
            let blk = self.dx_child(dir, path.last())?;
            let node = self.dx_node(dir, blk)?;
            let j = node.find(hash);
            path.push((node, j));
        }
        Ok(DxProbe {
            hash,
            version,
            path,
            levels,
        })
    }

    /// The directory block the chosen entry of the last path step points
    /// at, checked to lie inside the directory and not be the root.
    pub(crate) fn dx_child(&self, dir: DirRef<'_>, step: Option<&(Arc<DxIndex>, usize)>) -> Result<u64> {
        let loc = || format!("htree of directory inode {}", dir.ino);
        let (idx, at) = step.ok_or_else(|| Error::corrupt_msg(loc(), "htree", "empty path"))?;
        let b = idx.entries[*at].block as u64;
        let nblocks = dir.nblocks(self);
        if b == 0 || b >= nblocks {
            return Err(Error::corrupt_msg(
                loc(),
                "htree entry",
                format!("points at block {b} of a {nblocks}-block directory"),
            ));
        }
        Ok(b)
    }

    /// Lookup through the index.
    pub(crate) fn dx_lookup(
        &self,
        dir: DirRef<'_>,
        name: &[u8],
        access: LeafAccess,
    ) -> Result<Option<(u32, Option<FileType>)>> {
        Ok(self.dx_find(dir, name, access)?.map(|(_, hit)| hit))
    }

    /// The leaf block holding `name` and what the name's entry says,
    /// following a collision chain across leaves when the name's hash
    /// continues into the next block.
    #[allow(clippy::type_complexity)]
    pub(crate) fn dx_find(
        &self,
        dir: DirRef<'_>,
        name: &[u8],
        access: LeafAccess,
    ) -> Result<Option<(u64, (u32, Option<FileType>))>> {
        let DxProbe {
            hash, mut path, levels, ..
        } = self.dx_probe(dir, name)?;
        let leaf = self.dx_child(dir, path.last())?;
        if let Some(hit) = self.search_leaf(dir, leaf, name, access)? {
            return Ok(Some((leaf, hit)));
        }
        self.dx_find_in_chain(dir, &mut path, hash, levels, name, access)
    }

    /// Search the leaves after `path`'s that continue `hash` (a collision
    /// chain) for `name`.
    #[allow(clippy::type_complexity)]
    fn dx_find_in_chain(
        &self,
        dir: DirRef<'_>,
        path: &mut DxPath,
        hash: u32,
        levels: usize,
        name: &[u8],
        access: LeafAccess,
    ) -> Result<Option<(u64, (u32, Option<FileType>))>> {
        let nblocks = dir.nblocks(self);
        let mut visited = 1u64;
        while self.dx_next_leaf(dir, path, hash, levels)? {
            let leaf = self.dx_child(dir, path.last())?;
            if let Some(hit) = self.search_leaf(dir, leaf, name, access)? {
                return Ok(Some((leaf, hit)));
            }
            visited += 1;
            if visited > nblocks {
                return Err(Error::corrupt_msg(
                    format!("htree of directory inode {}", dir.ino),
                    "htree",
                    "collision chain longer than the directory",
                ));
            }
        }
        Ok(None)
    }

    /// [`Self::dx_find`] for a create: the entry of `name` if present, else
    /// an [`InsertHint`] for `add_link` (leaves read as a writer's).
    pub(crate) fn dx_find_for_create<'n>(&self, dir: DirRef<'_>, name: &'n [u8]) -> Result<CreateLookup<'n>> {
        let probe = self.dx_probe(dir, name)?;
        let (limit, fmt) = (self.leaf_limit(), self.geo().dir_format());
        let need = ext4kit_format::dirent::rec_len_for(name.len());
        let leaf = self.dx_child(dir, probe.path.last())?;
        let first = self.with_leaf(dir, leaf, LeafAccess::Write, |pblk, d| {
            super::dir_insert::scan_for_insert(d, limit, fmt, name, need).map_err(|slot| slot.map(|off| (pblk, off)))
        })?;
        let room = match first {
            Some(Ok(_)) => return Ok(CreateLookup::Exists),
            Some(Err(room)) => room,
            // A hole: `add_link` meets it again and says so.
            None => None,
        };
        // Leaves after the first hold the name only when its hash
        // continues into them (a collision chain): rare, searched as before.
        // The hint keeps the probe's path, which the chain walk advances:
        // walk a copy, and only when there is a chain.
        if dx_chain_continues(&probe.path, probe.hash) {
            let mut path = probe.path.clone();
            if self
                .dx_find_in_chain(dir, &mut path, probe.hash, probe.levels, name, LeafAccess::Write)?
                .is_some()
            {
                return Ok(CreateLookup::Exists);
            }
        }
        Ok(CreateLookup::Absent(Some(InsertHint {
            name,
            dir_ino: dir.ino,
            dir_size: dir.inode.size(),
            probe,
            room,
        })))
    }

    /// Advance `path` to the next leaf if its first hash continues `hash`
    /// (the kernel's `ext4_htree_next_block`).
    fn dx_next_leaf(&self, dir: DirRef<'_>, path: &mut DxPath, hash: u32, levels: usize) -> Result<bool> {
        // Climb to the lowest level that has a next entry.
        let mut level = path.len();
        loop {
            if level == 0 {
                return Ok(false);
            }
            level -= 1;
            let (idx, at) = &path[level];
            if at + 1 < idx.entries.len() {
                break;
            }
        }
        path[level].1 += 1;
        let (idx, at) = &path[level];
        let next_hash = idx.entries[*at].hash;
        if next_hash & !htree::HASH_COLLISION_BIT != hash {
            return Ok(false);
        }
        // Descend along the leftmost edge to the leaf level.
        path.truncate(level + 1);
        while path.len() < levels + 1 {
            let (idx, at) = path
                .last()
                .map(|(x, a)| (x, *a))
                .ok_or_else(|| Error::corrupt_msg("htree", "htree", "empty path"))?;
            let blk = idx.entries[at].block as u64;
            if blk == 0 || blk >= dir.nblocks(self) {
                return Err(Error::corrupt_msg(
                    format!("htree of directory inode {}", dir.ino),
                    "htree entry",
                    format!("points at block {blk}"),
                ));
            }
            let node = self.dx_node(dir, blk)?;
            path.push((node, 0));
        }
        Ok(true)
    }
}
