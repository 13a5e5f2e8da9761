//! The structure map of a clean base image: where its superblock, group
//! descriptors, bitmaps, in-use inode records, extent and indirect blocks,
//! directory leaves, htree roots and nodes, xattr blocks and symlink blocks
//! are, and which inode owns each block.
//!
//! The mutator aims at these regions, and needs the owner to recompute
//! checksums that are seeded per inode. The map is computed from the clean
//! bytes with the `ext4kit-format` parsers (not the engine under test), in
//! a few milliseconds, so it is not stored beside the cached image: it can
//! never go stale.

use ext4kit_format::bytes::{le16, le32};
use ext4kit_format::dirent::rec_len_from_disk;
use ext4kit_format::extent::{ExtentNode, NodeEntries};
use ext4kit_format::features::incompat;
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::inode::{flags, FileType, Inode};
use ext4kit_format::superblock::Superblock;

/// One block group's metadata locations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLoc {
    /// Byte offset of the group's descriptor in the image.
    pub desc_offset: usize,
    /// Block bitmap block.
    pub block_bitmap: u64,
    /// Inode bitmap block.
    pub inode_bitmap: u64,
    /// First inode table block.
    pub inode_table: u64,
}

/// An in-use inode record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeLoc {
    /// Inode number.
    pub ino: u32,
    /// Byte offset of the record in the image.
    pub offset: usize,
    /// Type from `i_mode`.
    pub ftype: Option<FileType>,
    /// `i_flags`.
    pub flags: u32,
}

impl InodeLoc {
    /// Whether `i_block` holds an extent tree root.
    pub fn has_extents(&self) -> bool {
        self.flags & flags::EXTENTS != 0 && self.flags & flags::INLINE_DATA == 0
    }
}

/// A block and the inode that owns it (whose checksum seed covers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedBlock {
    /// Owning inode.
    pub ino: u32,
    /// Physical block.
    pub block: u64,
}

/// Where everything is in one clean image.
#[derive(Debug, Clone, Default)]
pub struct StructureMap {
    /// Block size.
    pub block_size: usize,
    /// Inode record size.
    pub inode_size: usize,
    /// Group descriptor size.
    pub desc_size: usize,
    /// Blocks in the filesystem.
    pub blocks_count: u64,
    /// Inodes in the filesystem.
    pub inodes_count: u32,
    /// Inodes per group.
    pub inodes_per_group: u32,
    /// Whether `metadata_csum` is on.
    pub metadata_csum: bool,
    /// Per-group locations.
    pub groups: Vec<GroupLoc>,
    /// In-use inode records (root, reserved inodes in use, and every file).
    pub inodes: Vec<InodeLoc>,
    /// Non-root extent tree nodes.
    pub extent_nodes: Vec<OwnedBlock>,
    /// Indirect, double- and triple-indirect blocks.
    pub indirect_blocks: Vec<OwnedBlock>,
    /// Linear directory blocks (and htree leaves).
    pub dir_leaves: Vec<OwnedBlock>,
    /// Block 0 of indexed directories.
    pub htree_roots: Vec<OwnedBlock>,
    /// Interior htree index blocks.
    pub htree_nodes: Vec<OwnedBlock>,
    /// External xattr blocks (owner: the first inode seen using it).
    pub xattr_blocks: Vec<OwnedBlock>,
    /// Data blocks of slow symlinks.
    pub symlink_blocks: Vec<OwnedBlock>,
    /// A sample of regular-file data blocks (never the journal).
    pub data_blocks: Vec<OwnedBlock>,
}

/// Journal and resize inodes: their blocks are not what the read path
/// parses, so the map leaves them out (random flips still reach them).
const SKIP_DATA_INOS: [u32; 2] = [7, 8];

impl StructureMap {
    /// Map a clean image.
    pub fn build(img: &[u8]) -> Result<StructureMap, String> {
        let sb = Superblock::parse(img.get(1024..2048).ok_or("image shorter than a superblock")?)
            .map_err(|e| format!("superblock: {e}"))?;
        if sb.has_incompat(incompat::META_BG) {
            return Err("meta_bg bases are not supported by the mapper".into());
        }
        let bs = sb.block_size() as usize;
        let mut m = StructureMap {
            block_size: bs,
            inode_size: sb.inode_size() as usize,
            desc_size: sb.desc_size(),
            blocks_count: sb.blocks_count(),
            inodes_count: sb.inodes_count,
            inodes_per_group: sb.inodes_per_group,
            metadata_csum: sb.metadata_csum(),
            ..Default::default()
        };
        let gdt = (sb.first_data_block as usize + 1) * bs;
        for g in 0..sb.group_count() as usize {
            let off = gdt + g * m.desc_size;
            let raw = img.get(off..off + m.desc_size).ok_or("descriptor table past the end")?;
            let gd = GroupDesc::parse_sized(raw, m.desc_size);
            m.groups.push(GroupLoc {
                desc_offset: off,
                block_bitmap: gd.block_bitmap(),
                inode_bitmap: gd.inode_bitmap(),
                inode_table: gd.inode_table(),
            });
        }
        for ino in 1..=m.inodes_count {
            let g = ((ino - 1) / m.inodes_per_group) as usize;
            let idx = ((ino - 1) % m.inodes_per_group) as usize;
            let off = m.groups[g].inode_table as usize * bs + idx * m.inode_size;
            let Some(raw) = img.get(off..off + m.inode_size) else {
                continue;
            };
            let Ok(inode) = Inode::parse_raw(raw) else {
                continue;
            };
            if inode.base.mode == 0 || (inode.base.links_count == 0 && ino >= sb.first_ino()) {
                continue;
            }
            let loc = InodeLoc { ino, offset: off, ftype: inode.file_type(), flags: inode.base.flags };
            m.inodes.push(loc);
            m.map_inode(img, &loc, &inode);
        }
        Ok(m)
    }

    fn block<'a>(&self, img: &'a [u8], b: u64) -> Option<&'a [u8]> {
        if b == 0 || b >= self.blocks_count {
            return None;
        }
        let off = b as usize * self.block_size;
        img.get(off..off + self.block_size)
    }

    fn map_inode(&mut self, img: &[u8], loc: &InodeLoc, inode: &Inode) {
        let acl = inode.file_acl();
        if acl != 0 && !self.xattr_blocks.iter().any(|x| x.block == acl) {
            self.xattr_blocks.push(OwnedBlock { ino: loc.ino, block: acl });
        }
        if inode.has_inline_data() {
            return;
        }
        let fast_symlink = loc.ftype == Some(FileType::Symlink) && inode.size() < 60 && !loc.has_extents();
        if fast_symlink || !matches!(loc.ftype, Some(FileType::Regular | FileType::Directory | FileType::Symlink)) {
            return;
        }
        let mut runs = Vec::new(); // (logical, physical)
        if loc.has_extents() {
            if let Ok(root) = ExtentNode::parse(&inode.base.block) {
                // Directories and symlinks: every block; files: a sample.
                let cap = if loc.ftype == Some(FileType::Regular) { 64 } else { 1 << 16 };
                self.walk_extents(img, loc.ino, &root, &mut runs, cap, 0);
            }
        } else {
            let p: Vec<u64> = (0..15).map(|i| le32(&inode.base.block, 4 * i) as u64).collect();
            let per = (self.block_size / 4) as u64;
            for (i, &b) in p.iter().enumerate().take(12) {
                if b != 0 {
                    runs.push((i as u64, b));
                }
            }
            let mut base = 12u64;
            for (depth, &b) in p[12..].iter().enumerate() {
                self.walk_indirect(img, loc.ino, b, depth as u32 + 1, base, &mut runs);
                base += per.pow(depth as u32 + 1);
            }
        }
        let indexed = inode.base.flags & flags::INDEX != 0;
        let mut data_sample = 0;
        for (lblk, pblk) in runs {
            let owned = OwnedBlock { ino: loc.ino, block: pblk };
            match loc.ftype {
                Some(FileType::Directory) if indexed && lblk == 0 => self.htree_roots.push(owned),
                Some(FileType::Directory) => {
                    let is_node = indexed
                        && self.block(img, pblk).is_some_and(|d| {
                            le32(d, 0) == 0 && rec_len_from_disk(le16(d, 4), self.block_size) == self.block_size
                        });
                    if is_node {
                        self.htree_nodes.push(owned);
                    } else {
                        self.dir_leaves.push(owned);
                    }
                }
                Some(FileType::Symlink) => self.symlink_blocks.push(owned),
                _ if SKIP_DATA_INOS.contains(&loc.ino) => {}
                _ => {
                    if data_sample < 4 {
                        self.data_blocks.push(owned);
                        data_sample += 1;
                    }
                }
            }
        }
    }

    fn walk_extents(
        &mut self,
        img: &[u8],
        ino: u32,
        node: &ExtentNode,
        runs: &mut Vec<(u64, u64)>,
        cap: u64,
        guard: u32,
    ) {
        match &node.entries {
            NodeEntries::Leaf(v) => {
                for e in v {
                    for k in 0..(e.length() as u64).min(cap) {
                        runs.push((e.block as u64 + k, e.start() + k));
                    }
                }
            }
            NodeEntries::Index(v) => {
                for idx in v {
                    if guard > 5 {
                        return;
                    }
                    let blk = idx.leaf();
                    let Some(d) = self.block(img, blk) else {
                        continue;
                    };
                    self.extent_nodes.push(OwnedBlock { ino, block: blk });
                    if let Ok(child) = ExtentNode::parse(d) {
                        self.walk_extents(img, ino, &child, runs, cap, guard + 1);
                    }
                }
            }
        }
    }

    fn walk_indirect(&mut self, img: &[u8], ino: u32, blk: u64, depth: u32, base: u64, runs: &mut Vec<(u64, u64)>) {
        let Some(d) = self.block(img, blk) else {
            return;
        };
        self.indirect_blocks.push(OwnedBlock { ino, block: blk });
        let per = (self.block_size / 4) as u64;
        let span = per.pow(depth - 1);
        for i in 0..per as usize {
            let p = le32(d, 4 * i) as u64;
            if p == 0 {
                continue;
            }
            let lblk = base + i as u64 * span;
            if depth == 1 {
                runs.push((lblk, p));
            } else {
                self.walk_indirect(img, ino, p, depth - 1, lblk, runs);
            }
        }
    }

    /// The in-use inode `ino`, if mapped.
    pub fn inode(&self, ino: u32) -> Option<&InodeLoc> {
        self.inodes.iter().find(|i| i.ino == ino)
    }

    /// Byte offset of block `b`.
    pub fn block_offset(&self, b: u64) -> usize {
        b as usize * self.block_size
    }
}
