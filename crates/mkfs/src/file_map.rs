//! Data blocks for the files mkfs makes (root, lost+found, the journal)
//! and their block maps: an extent tree (`ext2fs_extent_*`: the extents in
//! `i_block` while they fit, else one leaf block under a depth-1 root) or
//! direct and indirect blocks (`ext2fs_bmap`: each indirect block placed
//! just before the blocks it maps).

use ext4kit_format::extent::{self, Extent, ExtentHeader, ExtentIndex, EXTENT_MAGIC};

use crate::alloc::Alloc;
use crate::error::{MkfsError, Result};
use crate::geometry::Geometry;
use crate::writer::Writer;

/// Extents an inode's `i_block` holds after its header.
const EXTENTS_IN_INODE: usize = 4;
/// Direct block pointers in `i_block` (`EXT2_NDIR_BLOCKS`).
const DIRECT_BLOCKS: usize = 12;

/// What to map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileMapRequest {
    /// Data blocks.
    pub(crate) blocks: u64,
    /// Where the search for free blocks starts.
    pub(crate) goal: u64,
    /// Map by extents (else by direct/indirect blocks).
    pub(crate) extents: bool,
    /// The owner's inode checksum seed, for an extent leaf's tail
    /// (`metadata_csum`).
    pub(crate) checksum_seed: Option<u32>,
}

/// A file's block map as built here: `i_block`, the metadata blocks to
/// write and the data blocks in file order.
pub(crate) struct FileMap {
    i_block: [u8; 60],
    meta: Vec<(u64, Vec<u8>)>,
    data: Vec<u64>,
}

impl FileMap {
    /// Claim the data blocks (first fit from the goal) and build their map.
    pub(crate) fn build(al: &mut Alloc, g: &Geometry, req: &FileMapRequest) -> Result<FileMap> {
        if req.extents {
            map_extents(al, g, req)
        } else {
            map_indirect(al, g, req)
        }
    }

    /// `i_block` of the owning inode.
    pub(crate) fn i_block(&self) -> [u8; 60] {
        self.i_block
    }

    /// The data blocks, in file order.
    pub(crate) fn data(&self) -> &[u64] {
        &self.data
    }

    /// Blocks the file holds, data and map together (for `i_blocks`).
    pub(crate) fn total(&self) -> u64 {
        self.data.len() as u64 + self.meta.len() as u64
    }

    /// Put the map's own blocks (extent leaf, indirect blocks) into the
    /// writer.
    pub(crate) fn write_meta(self, w: &mut Writer<'_>) {
        for (b, data) in self.meta {
            *w.block(b) = data;
        }
    }
}

fn header(entries: usize, max: u16, depth: u16) -> ExtentHeader {
    ExtentHeader {
        magic: EXTENT_MAGIC,
        entries: entries as u16,
        max,
        depth,
        generation: 0,
    }
}

/// Extents: one per run of consecutive blocks (at most
/// `EXT_INIT_MAX_LEN`); up to 4 in `i_block`, more in one leaf block
/// (itself claimed after the data) indexed from `i_block`.
fn map_extents(al: &mut Alloc, g: &Geometry, req: &FileMapRequest) -> Result<FileMap> {
    let mut cursor = req.goal;
    let mut data = Vec::with_capacity(req.blocks as usize);
    for _ in 0..req.blocks {
        data.push(al.next(&mut cursor, g.first_data_block())?);
    }
    let mut runs: Vec<Extent> = Vec::new();
    for (i, &b) in data.iter().enumerate() {
        match runs.last_mut() {
            Some(e) if e.start() + e.len as u64 == b && (e.len as u32) < extent::MAX_INIT_LEN as u32 => e.len += 1,
            _ => runs.push(Extent::new(i as u32, 1, b, false)),
        }
    }
    let mut i_block = [0u8; 60];
    let mut meta = Vec::new();
    if runs.len() <= EXTENTS_IN_INODE {
        header(runs.len(), EXTENTS_IN_INODE as u16, 0).serialize_into(&mut i_block);
        for (i, e) in runs.iter().enumerate() {
            e.serialize_into(&mut i_block[12 + 12 * i..]);
        }
    } else {
        let bs = g.block_size();
        let max = ((bs - 12) / 12) as u16;
        if runs.len() > max as usize {
            return Err(MkfsError::NoSpace("free space too fragmented for the journal".into()));
        }
        let leaf = al.next(&mut cursor, g.first_data_block())?;
        let mut blk = vec![0u8; bs as usize];
        header(runs.len(), max, 0).serialize_into(&mut blk);
        for (i, e) in runs.iter().enumerate() {
            e.serialize_into(&mut blk[12 + 12 * i..]);
        }
        if let Some(s) = req.checksum_seed {
            extent::set_block_checksum(&mut blk, s);
        }
        header(1, EXTENTS_IN_INODE as u16, 1).serialize_into(&mut i_block);
        ExtentIndex::new(0, leaf).serialize_into(&mut i_block[12..]);
        meta.push((leaf, blk));
    }
    Ok(FileMap { i_block, meta, data })
}

/// Direct blocks in `i_block[0..12]`, then single, double and triple
/// indirect trees in slots 12, 13 and 14, each tree's blocks claimed
/// depth first (an indirect block, then what it maps).
fn map_indirect(al: &mut Alloc, g: &Geometry, req: &FileMapRequest) -> Result<FileMap> {
    let mut t = IndirectTree {
        al,
        cursor: req.goal,
        from: g.first_data_block(),
        per_block: g.block_size() / 4,
        block_size: g.block_size(),
        left: req.blocks,
        meta: Vec::new(),
        data: Vec::with_capacity(req.blocks as usize),
    };
    let mut i_block = [0u8; 60];
    for slot in 0..DIRECT_BLOCKS {
        if t.left == 0 {
            break;
        }
        let b = t.data_block()?;
        i_block[4 * slot..4 * slot + 4].copy_from_slice(&(b as u32).to_le_bytes());
    }
    for level in 1..=3u32 {
        if t.left == 0 {
            break;
        }
        let top = t.fill(level)?;
        let slot = DIRECT_BLOCKS - 1 + level as usize;
        i_block[4 * slot..4 * slot + 4].copy_from_slice(&(top as u32).to_le_bytes());
    }
    if t.left != 0 {
        return Err(MkfsError::invalid("file too large for an indirect block map"));
    }
    Ok(FileMap {
        i_block,
        meta: t.meta,
        data: t.data,
    })
}

/// The state of an indirect map being built.
struct IndirectTree<'a> {
    al: &'a mut Alloc,
    cursor: u64,
    from: u64,
    /// Block numbers per indirect block (`block_size / 4`).
    per_block: u64,
    block_size: u64,
    /// Data blocks still to map.
    left: u64,
    meta: Vec<(u64, Vec<u8>)>,
    data: Vec<u64>,
}

impl IndirectTree<'_> {
    /// Claim the next data block.
    fn data_block(&mut self) -> Result<u64> {
        let b = self.al.next(&mut self.cursor, self.from)?;
        self.data.push(b);
        self.left -= 1;
        Ok(b)
    }

    /// Claim an indirect block of `level` (1: it lists data blocks) and
    /// fill it, depth first, until the data runs out or it is full.
    fn fill(&mut self, level: u32) -> Result<u64> {
        let me = self.al.next(&mut self.cursor, self.from)?;
        let idx = self.meta.len();
        self.meta.push((me, vec![0u8; self.block_size as usize]));
        for i in 0..self.per_block as usize {
            if self.left == 0 {
                break;
            }
            let child = if level == 1 {
                self.data_block()?
            } else {
                self.fill(level - 1)?
            };
            self.meta[idx].1[4 * i..4 * i + 4].copy_from_slice(&(child as u32).to_le_bytes());
        }
        Ok(me)
    }
}
