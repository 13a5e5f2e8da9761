//! Indexed directory lookup (dir_index / htree): hash the name, descend
//! the dx root and up to two (three with largedir) levels of index nodes by
//! binary search, then scan one leaf block — a constant number of block
//! reads whatever the directory size (htree: no linear scan). Leaves that
//! share a hash are chained by the collision bit of the next index entry.
//!
//! [`DxProbe`] is the kernel's `dx_frame` array: the path a probe took,
//! which the collision-chain walk advances (`ext4_htree_next_block`) and an
//! insert splits (`dx_split.rs`).

use std::sync::Arc;

use ext4kit_format::dirent::rec_len_for;
use ext4kit_format::features::incompat;
use ext4kit_format::hash::{dx_hash, HashVersion};
use ext4kit_format::htree::{self, DxIndex};
use ext4kit_format::inode::FileType;

use super::buffer::Buffer;
use super::dir_leaf::{self, LeafLayout};
use super::dirblock::{self, DirRef, LeafAccess};
use super::volume::Volume;
use crate::error::{Error, Result};

/// The (index, chosen entry) pairs from the root down to a leaf.
/// Inline up to 3 levels (a largedir htree's most), so a probe — two per
/// create — allocates nothing.
pub(crate) type DxPath = smallvec::SmallVec<[(Arc<DxIndex>, usize); 3]>;

/// What [`probe`] found: the name's hash, the directory's hash function,
/// and the path from the root down to the leaf's index entry.
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
/// second walk one more pass over a 4 KiB leaf).
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

impl InsertHint<'_> {
    /// Whether the hint was made for adding `name` to `dir` as it is now.
    pub(crate) fn fits(&self, dir: DirRef<'_>, name: &[u8]) -> bool {
        self.name == name && self.dir_ino == dir.ino && self.dir_size == dir.inode.size()
    }
}

/// What the lookup of a create found.
#[derive(Debug)]
pub enum CreateLookup<'n> {
    /// The name is taken.
    Exists,
    /// The name is free; in an indexed directory, where it goes.
    Absent(Option<InsertHint<'n>>),
}

/// A leaf block and what the entry found in it says: (leaf's logical
/// block, (inode, type)).
pub(crate) type LeafHit = (u64, (u32, Option<FileType>));

impl DxProbe {
    /// The leaf the probe's last index entry points at, checked to lie
    /// inside the directory and not be the root.
    pub(crate) fn leaf(&self, vol: &Volume, dir: DirRef<'_>) -> Result<u64> {
        let loc = || format!("htree of directory inode {}", dir.ino);
        let (idx, at) = self
            .path
            .last()
            .ok_or_else(|| Error::corrupt_msg(loc(), "htree", "empty path"))?;
        let b = idx.entries[*at].block as u64;
        let nblocks = dir.nblocks(vol);
        if b == 0 || b >= nblocks {
            return Err(Error::corrupt_msg(
                loc(),
                "htree entry",
                format!("points at block {b} of a {nblocks}-block directory"),
            ));
        }
        Ok(b)
    }

    /// Whether the leaf after the path's starts a hash that continues the
    /// probe's (a collision chain): the test [`Self::next_leaf`] makes
    /// before it moves, without moving.
    fn chain_continues(&self) -> bool {
        self.path
            .iter()
            .rev()
            .find_map(|(idx, at)| idx.entries.get(at + 1))
            .is_some_and(|next| next.hash & !htree::HASH_COLLISION_BIT == self.hash)
    }

    /// Advance the path to the next leaf if its first hash continues the
    /// probe's (the kernel's `ext4_htree_next_block`).
    fn next_leaf(&mut self, vol: &Volume, dir: DirRef<'_>) -> Result<bool> {
        let path = &mut self.path;
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
        if next_hash & !htree::HASH_COLLISION_BIT != self.hash {
            return Ok(false);
        }
        // Descend along the leftmost edge to the leaf level.
        path.truncate(level + 1);
        while path.len() < self.levels + 1 {
            let (idx, at) = path
                .last()
                .map(|(x, a)| (x, *a))
                .ok_or_else(|| Error::corrupt_msg("htree", "htree", "empty path"))?;
            let blk = idx.entries[at].block as u64;
            if blk == 0 || blk >= dir.nblocks(vol) {
                return Err(Error::corrupt_msg(
                    format!("htree of directory inode {}", dir.ino),
                    "htree entry",
                    format!("points at block {blk}"),
                ));
            }
            let node = index_node(vol, dir, blk)?;
            path.push((node, 0));
        }
        Ok(true)
    }

    /// Search the leaves after the path's that continue the probe's hash
    /// (a collision chain) for `name`, advancing the path.
    fn find_in_chain(
        &mut self,
        vol: &Volume,
        dir: DirRef<'_>,
        name: &[u8],
        access: LeafAccess,
    ) -> Result<Option<LeafHit>> {
        let nblocks = dir.nblocks(vol);
        let mut visited = 1u64;
        while self.next_leaf(vol, dir)? {
            let leaf = self.leaf(vol, dir)?;
            if let Some(hit) = dirblock::search_leaf(vol, dir, leaf, name, access)? {
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
}

fn largedir(vol: &Volume) -> bool {
    vol.geo().has_incompat(incompat::LARGEDIR)
}

/// Block 0 of an indexed directory, validated as a dx root once.
pub(crate) fn root_block(vol: &Volume, dir: DirRef<'_>) -> Result<Option<Arc<Buffer>>> {
    let Some(buf) = dirblock::read_raw(vol, dir, 0)? else {
        return Err(Error::corrupt_msg(
            format!("directory inode {}", dir.ino),
            "htree root",
            "block 0 is a hole",
        ));
    };
    let seed = dir.csum_seed(vol);
    let (bs, large) = (vol.block_size(), largedir(vol));
    buf.check_once(|d| htree::parse_root(d, bs, large, seed).map(|_| ()))
        .map_err(|e| {
            Error::corrupt(
                format!("htree root of directory inode {} (disk block {})", dir.ino, buf.block),
                e,
            )
        })?;
    Ok(Some(buf))
}

/// Index node `lblk` of a directory, validated once and decoded once per
/// cached version.
fn index_node(vol: &Volume, dir: DirRef<'_>, lblk: u64) -> Result<Arc<DxIndex>> {
    let loc = || format!("htree node {lblk} of directory inode {}", dir.ino);
    let Some(buf) = dirblock::read_raw(vol, dir, lblk)? else {
        return Err(Error::corrupt_msg(loc(), "htree node", "points at a hole"));
    };
    let seed = dir.csum_seed(vol);
    let bs = vol.block_size();
    buf.check_once(|d| htree::parse_node(d, bs, seed).map(|_| ()))
        .map_err(|e| Error::corrupt(loc(), e))?;
    buf.dx_index(|d| htree::parse_node(d, bs, None).map(|i| (None, i)))
        .map(|(_, i)| i)
        .map_err(|e| Error::corrupt(loc(), e))
}

/// Hash `name` and descend the index to its leaf (the kernel's
/// `dx_probe`): the hash, the path of (index, chosen entry) from the root
/// down, and the number of index levels below the root.
pub(crate) fn probe(vol: &Volume, dir: DirRef<'_>, name: &[u8]) -> Result<DxProbe> {
    let loc = || format!("htree of directory inode {}", dir.ino);
    let rootbuf = root_block(vol, dir)?.ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "missing"))?;
    let (bs, large) = (vol.block_size(), largedir(vol));
    let (info, index) = rootbuf
        .dx_index(|d| htree::parse_root(d, bs, large, None).map(|r| (Some(r.info), r.index)))
        .map_err(|e| Error::corrupt(loc(), e))?;
    let info = info.ok_or_else(|| Error::corrupt_msg(loc(), "htree root", "decoded as an index node"))?;
    let version = HashVersion::from_root(info.hash_version, vol.geo().unsigned_hash()).ok_or_else(|| {
        Error::corrupt_msg(
            loc(),
            "htree root",
            format!("unknown hash version {}", info.hash_version),
        )
    })?;
    let (hash, _minor) = dx_hash(name, version, vol.geo().hash_seed());
    let levels = info.indirect_levels as usize;
    let mut probe = DxProbe {
        hash,
        version,
        path: DxPath::new(),
        levels,
    };
    let i = index.find(hash);
    probe.path.push((index, i));
    for _ in 0..levels {
        let blk = probe.leaf(vol, dir)?;
        let node = index_node(vol, dir, blk)?;
        let j = node.find(hash);
        probe.path.push((node, j));
    }
    Ok(probe)
}

/// Lookup through the index.
pub(crate) fn lookup(
    vol: &Volume,
    dir: DirRef<'_>,
    name: &[u8],
    access: LeafAccess,
) -> Result<Option<(u32, Option<FileType>)>> {
    Ok(find(vol, dir, name, access)?.map(|(_, hit)| hit))
}

/// The leaf block holding `name` and what the name's entry says,
/// following a collision chain across leaves when the name's hash
/// continues into the next block.
///
/// A writer (`LeafAccess::Write`: about to add, remove or change a name)
/// whose leaf is a hole is refused: the change would meet the hole only
/// after it began (`ext4_dx_find_entry` and `ext4_dx_add_entry` refuse it
/// too: "Directory hole found for htree leaf block"). A reader passes it
/// by, as a name that is not there.
pub(crate) fn find(vol: &Volume, dir: DirRef<'_>, name: &[u8], access: LeafAccess) -> Result<Option<LeafHit>> {
    let mut probe = probe(vol, dir, name)?;
    let leaf = probe.leaf(vol, dir)?;
    let fmt = vol.geo().dir_format();
    match dirblock::with_leaf(vol, dir, leaf, access, |_, d| dir_leaf::find_name(d, fmt, name))? {
        Some(Some(hit)) => return Ok(Some((leaf, hit))),
        None if access == LeafAccess::Write => return Err(leaf_hole(dir, leaf)),
        Some(None) | None => {}
    }
    probe.find_in_chain(vol, dir, name, access)
}

/// The refusal of a leaf the index names that is a hole.
fn leaf_hole(dir: DirRef<'_>, leaf: u64) -> Error {
    Error::corrupt_msg(
        format!("htree of directory inode {}", dir.ino),
        "htree entry",
        format!("leaf {leaf} is a hole"),
    )
}

/// [`find`] for a create: the entry of `name` if present, else an
/// [`InsertHint`] for `add_link` (leaves read as a writer's).
pub(crate) fn find_for_create<'n>(vol: &Volume, dir: DirRef<'_>, name: &'n [u8]) -> Result<CreateLookup<'n>> {
    let probe = probe(vol, dir, name)?;
    let layout = LeafLayout::of(vol.geo());
    let need = rec_len_for(name.len());
    let leaf = probe.leaf(vol, dir)?;
    let first = dirblock::with_leaf(vol, dir, leaf, LeafAccess::Write, |pblk, d| {
        layout
            .scan_for_insert(d, name, need)
            .map_err(|slot| slot.map(|off| (pblk, off)))
    })?;
    let room = match first {
        Some(Ok(_)) => return Ok(CreateLookup::Exists),
        Some(Err(room)) => room,
        // A hole where the index sends the name: the insert would meet it
        // only after the new inode was allocated, and without a journal
        // that half-made create would be written as it stood (see `find`).
        None => return Err(leaf_hole(dir, leaf)),
    };
    // Leaves after the first hold the name only when its hash continues
    // into them (a collision chain): rare, searched as before. The hint
    // keeps the probe's path, which the chain walk advances: walk a copy,
    // and only when there is a chain.
    if probe.chain_continues() {
        let mut chain = probe.clone();
        if chain.find_in_chain(vol, dir, name, LeafAccess::Write)?.is_some() {
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
