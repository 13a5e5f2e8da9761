//! The structure-aware mutator.
//!
//! A [`Mutation`] is a pure function of a seed and the list of bases: it
//! picks a base (seeds rotate through them), one to eight edits aimed at
//! named fields of real structures (found through the
//! [`crate::map::StructureMap`]), optionally recomputes the
//! checksums of what it touched, and sometimes truncates the image.
//!
//! Why checksums are recomputed: on `metadata_csum` images almost every
//! edit would otherwise be rejected by the checksum check, and the parser
//! behind it would never see hostile values. "Fix checksums" lets a
//! corruption through the front door (as a buggy writer or a malicious
//! image would), so both the checksum path and the deep parsers are
//! exercised.
//!
//! Values are chosen the way hostile images break parsers: boundary values
//! (0, 1, all-ones, sign bits), geometry of this image (block count ± 1,
//! inode count ± 1, block size, ...), references that create cycles (a
//! child pointing at its parent, a node at itself), small deltas, bit
//! flips and random bytes.

use std::fmt::Write as _;

use ext4kit_format::bytes::{le16, le32};
use ext4kit_format::checksum::{crc32c, inode_csum_seed};
use ext4kit_format::dirent::{self, rec_len_from_disk};
use ext4kit_format::extent;
use ext4kit_format::group_desc::{GdCsum, GroupDesc};
use ext4kit_format::inode::flags;
use ext4kit_format::superblock::Superblock;
use ext4kit_format::xattr;

use crate::base::BaseImage;
use crate::map::{InodeLoc, OwnedBlock, StructureMap};
use crate::prng::Rng;

/// One byte-range replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// Byte offset in the image.
    pub offset: usize,
    /// The bytes written there.
    pub new: Vec<u8>,
    /// The clean bytes they replace.
    pub old: Vec<u8>,
    /// Which structure and field ("inode 12 i_size_lo", ...).
    pub what: String,
}

/// A structure an edit landed in, whose checksum "fix checksums" refreshes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The primary superblock.
    Superblock,
    /// Group descriptor `n`.
    Group(usize),
    /// An inode record (via the map's offset).
    Inode(u32),
    /// A non-root extent tree node.
    ExtentBlock(OwnedBlock),
    /// A linear directory block / htree leaf.
    DirLeaf(OwnedBlock),
    /// An htree root (count/limit at 0x20) or node (at 0x8).
    Htree(OwnedBlock, bool),
    /// An external xattr block.
    XattrBlock(OwnedBlock),
}

/// A complete, reproducible mutation of one base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// The seed it came from.
    pub seed: u64,
    /// Index of the base in the list it was generated from.
    pub base: usize,
    /// The base's name.
    pub base_name: String,
    /// Edits, applied in order.
    pub edits: Vec<Edit>,
    /// Structures to re-checksum when `fix_checksums` is on.
    pub touched: Vec<Touched>,
    /// Recompute checksums of touched structures after editing.
    pub fix_checksums: bool,
    /// Cut the image to this many bytes after editing.
    pub truncate_to: Option<usize>,
}

impl Mutation {
    /// The mutation for `seed` over `bases` (rotating through them).
    pub fn generate(seed: u64, bases: &[BaseImage]) -> Mutation {
        let base = (seed % bases.len().max(1) as u64) as usize;
        let b = &bases[base];
        let mut rng = Rng::new(seed);
        let mut g = Gen { rng: &mut rng, map: &b.map, img: &b.bytes, edits: Vec::new(), touched: Vec::new() };
        let n = match g.rng.weighted(&[55, 20, 10, 15]) {
            0 => 1,
            1 => 2,
            2 => 3,
            _ => 4 + g.rng.index(5),
        };
        let truncate_only = g.rng.chance(3, 100);
        if !truncate_only {
            for _ in 0..n {
                g.one_edit();
            }
        }
        let fix_checksums = g.rng.chance(3, 4);
        let truncate_to = if truncate_only || g.rng.chance(2, 100) {
            let len = b.bytes.len();
            Some(if g.rng.chance(1, 2) {
                let blocks = len / b.map.block_size;
                g.rng.index(blocks.max(1)) * b.map.block_size
            } else {
                g.rng.index(len)
            })
        } else {
            None
        };
        let (edits, mut touched) = (g.edits, g.touched);
        touched.dedup();
        Mutation { seed, base, base_name: b.spec.name.to_string(), edits, touched, fix_checksums, truncate_to }
    }

    /// A mutation that only truncates `base` to `len` bytes.
    pub fn truncation(bases: &[BaseImage], base: usize, len: usize) -> Mutation {
        Mutation {
            seed: u64::MAX,
            base,
            base_name: bases[base].spec.name.to_string(),
            edits: Vec::new(),
            touched: Vec::new(),
            fix_checksums: false,
            truncate_to: Some(len),
        }
    }

    /// The mutated image.
    pub fn apply(&self, base: &BaseImage) -> Vec<u8> {
        let mut img = base.bytes.as_ref().clone();
        for e in &self.edits {
            let end = (e.offset + e.new.len()).min(img.len());
            if e.offset < end {
                img[e.offset..end].copy_from_slice(&e.new[..end - e.offset]);
            }
        }
        if self.fix_checksums {
            fix_checksums(&mut img, &base.map, &self.touched);
        }
        if let Some(n) = self.truncate_to {
            img.truncate(n);
        }
        img
    }

    /// The same mutation without edit `i` (for minimising a failure).
    pub fn without_edit(&self, i: usize) -> Mutation {
        let mut m = self.clone();
        m.edits.remove(i);
        m
    }

    /// Short name of the case: "seed N" or "ext4-64k truncated to N".
    pub fn label(&self) -> String {
        if self.seed == u64::MAX {
            format!("{} truncated to {}", self.base_name, self.truncate_to.unwrap_or(0))
        } else {
            format!("seed {}", self.seed)
        }
    }

    /// Human-readable account of every change.
    pub fn describe(&self) -> String {
        let mut s = format!("base {} (index {})", self.base_name, self.base);
        if self.seed != u64::MAX {
            let _ = write!(s, ", seed {}", self.seed);
        }
        let _ = write!(s, ", fix checksums: {}", if self.fix_checksums { "yes" } else { "no" });
        for e in &self.edits {
            let _ = write!(s, "\n  {} @ {:#x}: {} -> {}", e.what, e.offset, hex(&e.old), hex(&e.new));
        }
        if let Some(n) = self.truncate_to {
            let _ = write!(s, "\n  truncated to {n} bytes");
        }
        s
    }
}

fn hex(b: &[u8]) -> String {
    if b.len() > 16 {
        return format!("{}.. ({} bytes)", hex(&b[..16]), b.len());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A field: absolute offset, width in bytes (1, 2, 4, 8), name.
struct Field {
    off: usize,
    width: usize,
    name: String,
    /// Values that matter for this field beyond the generic ones.
    special: Vec<u64>,
}

fn field(off: usize, width: usize, name: impl Into<String>) -> Field {
    Field { off, width, name: name.into(), special: Vec::new() }
}

const SB_FIELDS: &[(usize, usize, &str)] = &[
    (0x0, 4, "s_inodes_count"),
    (0x4, 4, "s_blocks_count_lo"),
    (0x14, 4, "s_first_data_block"),
    (0x18, 4, "s_log_block_size"),
    (0x1C, 4, "s_log_cluster_size"),
    (0x20, 4, "s_blocks_per_group"),
    (0x24, 4, "s_clusters_per_group"),
    (0x28, 4, "s_inodes_per_group"),
    (0x38, 2, "s_magic"),
    (0x3A, 2, "s_state"),
    (0x4C, 4, "s_rev_level"),
    (0x54, 4, "s_first_ino"),
    (0x58, 2, "s_inode_size"),
    (0x5C, 4, "s_feature_compat"),
    (0x60, 4, "s_feature_incompat"),
    (0x64, 4, "s_feature_ro_compat"),
    (0x68, 4, "s_uuid[0..4]"),
    (0xCE, 2, "s_reserved_gdt_blocks"),
    (0xE0, 4, "s_journal_inum"),
    (0xE8, 4, "s_last_orphan"),
    (0xEC, 4, "s_hash_seed[0]"),
    (0xFC, 1, "s_def_hash_version"),
    (0xFE, 2, "s_desc_size"),
    (0x104, 4, "s_first_meta_bg"),
    (0x150, 4, "s_blocks_count_hi"),
    (0x15C, 2, "s_min_extra_isize"),
    (0x15E, 2, "s_want_extra_isize"),
    (0x160, 4, "s_flags"),
    (0x174, 1, "s_log_groups_per_flex"),
    (0x175, 1, "s_checksum_type"),
    (0x24C, 4, "s_backup_bgs[0]"),
    (0x270, 4, "s_checksum_seed"),
    (0x27C, 2, "s_encoding"),
    (0x280, 4, "s_orphan_file_inum"),
    (0x3FC, 4, "s_checksum"),
];

const GD_FIELDS: &[(usize, usize, &str)] = &[
    (0x0, 4, "bg_block_bitmap_lo"),
    (0x4, 4, "bg_inode_bitmap_lo"),
    (0x8, 4, "bg_inode_table_lo"),
    (0xC, 2, "bg_free_blocks_count_lo"),
    (0xE, 2, "bg_free_inodes_count_lo"),
    (0x10, 2, "bg_used_dirs_count_lo"),
    (0x12, 2, "bg_flags"),
    (0x1C, 2, "bg_itable_unused_lo"),
    (0x1E, 2, "bg_checksum"),
    (0x20, 4, "bg_block_bitmap_hi"),
    (0x24, 4, "bg_inode_bitmap_hi"),
    (0x28, 4, "bg_inode_table_hi"),
    (0x32, 2, "bg_itable_unused_hi"),
];

const INODE_FIELDS: &[(usize, usize, &str)] = &[
    (0x0, 2, "i_mode"),
    (0x4, 4, "i_size_lo"),
    (0x6C, 4, "i_size_high"),
    (0x14, 4, "i_dtime"),
    (0x1A, 2, "i_links_count"),
    (0x1C, 4, "i_blocks_lo"),
    (0x74, 2, "i_blocks_high"),
    (0x20, 4, "i_flags"),
    (0x64, 4, "i_generation"),
    (0x68, 4, "i_file_acl_lo"),
    (0x76, 2, "i_file_acl_high"),
    (0x7C, 2, "i_checksum_lo"),
];

/// The edit generator: state shared by the target-specific helpers.
struct Gen<'a> {
    rng: &'a mut Rng,
    map: &'a StructureMap,
    img: &'a [u8],
    edits: Vec<Edit>,
    touched: Vec<Touched>,
}

impl Gen<'_> {
    fn one_edit(&mut self) {
        // Weights: inodes and directories are where most parsing happens.
        let w = [10, 7, 2, 22, 8, 5, 5, 12, 8, 5, 6, 5, 2, 6, 6, 1, 4, 4];
        let ok = match self.rng.weighted(&w) {
            0 => self.superblock(),
            1 => self.group_desc(),
            2 => self.bitmap(),
            3 => self.inode_field(),
            4 => self.extent_root(),
            5 => self.extent_block(),
            6 => self.indirect(),
            7 => self.dir_leaf(),
            8 => self.htree(true),
            9 => self.htree(false),
            10 => self.xattr_block(),
            11 => self.xattr_ibody(),
            12 => self.symlink_block(),
            13 => self.random_anywhere(),
            14 => self.random_in_metadata(),
            15 => self.data_block(),
            16 => self.copy_block(),
            _ => self.copy_inode(),
        };
        if !ok {
            self.random_anywhere();
        }
    }

    fn geometry(&self) -> Vec<u64> {
        let m = self.map;
        vec![
            m.blocks_count,
            m.blocks_count - 1,
            m.blocks_count + 1,
            m.inodes_count as u64,
            m.inodes_count as u64 + 1,
            m.block_size as u64,
            m.block_size as u64 + 1,
            (m.block_size / 4) as u64,
            m.inodes_per_group as u64,
            m.inode_size as u64,
            12,
            60,
            0x7fff,
            0x8000,
            0xffff,
            0x1_0000,
            0x7fff_ffff,
            0x8000_0000,
        ]
    }

    /// Write a new value into `f`, chosen by one of the strategies in the
    /// module docs, and record the edit.
    fn set(&mut self, f: Field, touched: Option<Touched>) {
        if f.off + f.width > self.img.len() {
            return;
        }
        let old_bytes = self.img[f.off..f.off + f.width].to_vec();
        let mut oldv = [0u8; 8];
        oldv[..f.width].copy_from_slice(&old_bytes);
        let old = u64::from_le_bytes(oldv);
        let bits = 8 * f.width as u32;
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let v = match self.rng.weighted(&[20, 8, 8, 6, 10, 14, 6, 6, 12]) {
            0 => old ^ (1 << self.rng.below(bits as u64)),
            1 => 0,
            2 => mask,
            3 => 1,
            4 => {
                let d = 1 + self.rng.below(4);
                if self.rng.chance(1, 2) {
                    old.wrapping_add(d)
                } else {
                    old.wrapping_sub(d)
                }
            }
            5 => *self.rng.pick(&self.geometry()),
            6 => 1 << (bits - 1),
            7 => self.rng.next_u64(),
            _ if !f.special.is_empty() => *self.rng.pick(&f.special),
            _ => old ^ (1 << self.rng.below(bits as u64)),
        } & mask;
        let new = v.to_le_bytes()[..f.width].to_vec();
        self.edits.push(Edit { offset: f.off, new, old: old_bytes, what: f.name });
        if let Some(t) = touched {
            self.touched.push(t);
        }
    }

    fn set_bytes(&mut self, off: usize, len: usize, what: String, touched: Option<Touched>) {
        if len == 0 || off + len > self.img.len() {
            return;
        }
        let old = self.img[off..off + len].to_vec();
        let mut new = old.clone();
        match self.rng.below(3) {
            0 => {
                let i = self.rng.index(len);
                new[i] ^= 1 << self.rng.below(8);
            }
            1 => {
                let i = self.rng.index(len);
                new[i] = *self.rng.pick(&[0u8, b'/', b'.', 0xff, 0x80]);
            }
            _ => self.rng.fill(&mut new),
        }
        self.edits.push(Edit { offset: off, new, old, what });
        if let Some(t) = touched {
            self.touched.push(t);
        }
    }

    fn superblock(&mut self) -> bool {
        let &(off, w, name) = self.rng.pick(SB_FIELDS);
        let mut f = field(1024 + off, w, name);
        if name.starts_with("s_feature") {
            // Single feature bits are what matter: flip one.
            f.special = (0..32).map(|b| (le32(self.img, 1024 + off) ^ (1 << b)) as u64).collect();
        }
        if name == "s_log_block_size" || name == "s_log_cluster_size" {
            f.special = vec![0, 1, 2, 3, 4, 5, 6, 7, 31, 32];
        }
        self.set(f, Some(Touched::Superblock));
        true
    }

    fn group_desc(&mut self) -> bool {
        let g = self.rng.index(self.map.groups.len());
        let fields: Vec<_> = GD_FIELDS.iter().filter(|f| f.0 + f.1 <= self.map.desc_size).collect();
        let &&(off, w, name) = self.rng.pick(&fields);
        let mut f = field(self.map.groups[g].desc_offset + off, w, format!("group {g} {name}"));
        f.special =
            self.map.groups.iter().flat_map(|l| [l.block_bitmap, l.inode_bitmap, l.inode_table, 0, 1, 2]).collect();
        self.set(f, Some(Touched::Group(g)));
        true
    }

    fn bitmap(&mut self) -> bool {
        let g = *self.rng.pick(&self.map.groups);
        let blk = if self.rng.chance(1, 2) { g.block_bitmap } else { g.inode_bitmap };
        let off = self.map.block_offset(blk) + self.rng.index(self.map.block_size.min(256));
        self.set_bytes(off, 1, format!("bitmap block {blk}"), None);
        true
    }

    /// An in-use inode, mostly user files (which the walk reaches).
    fn pick_inode(&mut self, want: impl Fn(&InodeLoc) -> bool) -> Option<InodeLoc> {
        let c: Vec<InodeLoc> = self.map.inodes.iter().filter(|i| want(i)).copied().collect();
        (!c.is_empty()).then(|| *self.rng.pick(&c))
    }

    fn inode_name(i: &InodeLoc) -> String {
        match i.ftype {
            Some(t) => format!("inode {} ({t:?})", i.ino),
            None => format!("inode {} (bad mode)", i.ino),
        }
    }

    fn inode_field(&mut self) -> bool {
        // Mostly inodes the walk reaches; now and then a reserved one.
        let any = self.rng.chance(3, 20);
        let Some(i) = self.pick_inode(|i| any || i.ino == 2 || i.ino >= 11) else {
            return false;
        };
        let name = Self::inode_name(&i);
        let t = Some(Touched::Inode(i.ino));
        match self.rng.below(10) {
            0..=6 => {
                let &(off, w, fname) = self.rng.pick(INODE_FIELDS);
                let mut f = field(i.offset + off, w, format!("{name} {fname}"));
                f.special = match fname {
                    "i_mode" => {
                        [0o100644u64, 0o40755, 0o120777, 0o20644, 0o60644, 0o10644, 0o140644, 0, 0o170000, 0o30000]
                            .iter()
                            .map(|&m| m | (le16(self.img, i.offset) as u64 & 0o7777))
                            .collect()
                    }
                    "i_flags" => {
                        let cur = le32(self.img, i.offset + 0x20) as u64;
                        [
                            flags::EXTENTS,
                            flags::INLINE_DATA,
                            flags::INDEX,
                            flags::HUGE_FILE,
                            flags::EA_INODE,
                            flags::ENCRYPT,
                            flags::CASEFOLD,
                            flags::VERITY,
                        ]
                        .iter()
                        .map(|&b| cur ^ b as u64)
                        .collect()
                    }
                    "i_file_acl_lo" => {
                        let mut v: Vec<u64> = self.map.xattr_blocks.iter().map(|x| x.block).collect();
                        v.extend(self.map.dir_leaves.iter().take(3).map(|x| x.block));
                        v.extend(self.map.groups.iter().map(|g| g.inode_table));
                        v
                    }
                    "i_size_lo" | "i_size_high" => {
                        vec![0, 59, 60, 61, self.map.block_size as u64, 0xffff_ffff]
                    }
                    _ => Vec::new(),
                };
                self.set(f, t);
            }
            7 => {
                // A raw slot of i_block: a block pointer on indirect inodes,
                // symlink text or extent root bytes otherwise.
                let slot = self.rng.index(15);
                let mut f = field(i.offset + 0x28 + 4 * slot, 4, format!("{name} i_block[{slot}]"));
                f.special = self.block_refs();
                self.set(f, t);
            }
            _ => {
                if self.map.inode_size <= 128 {
                    return false;
                }
                let mut f = field(i.offset + 0x80, 2, format!("{name} i_extra_isize"));
                f.special = vec![
                    0,
                    2,
                    4,
                    28,
                    32,
                    36,
                    (self.map.inode_size - 128) as u64,
                    (self.map.inode_size - 127) as u64,
                    0xfffc,
                ];
                self.set(f, t);
            }
        }
        true
    }

    /// Block numbers worth pointing at: metadata of this image, edges.
    fn block_refs(&self) -> Vec<u64> {
        let m = self.map;
        let mut v = vec![0, 1, 2, m.blocks_count - 1, m.blocks_count, m.blocks_count + 1, 0xffff_ffff];
        v.extend(m.groups.iter().map(|g| g.inode_table));
        v.extend(m.dir_leaves.iter().take(4).map(|b| b.block));
        v.extend(m.htree_roots.iter().take(2).map(|b| b.block));
        v.extend(m.extent_nodes.iter().take(2).map(|b| b.block));
        v.extend(m.indirect_blocks.iter().take(4).map(|b| b.block));
        v
    }

    /// Fields of an extent node at byte `base` holding `n` entries.
    fn extent_fields(&mut self, base: usize, entries: usize, leaf: bool, name: &str, t: Touched) {
        let refs = self.block_refs();
        let f = if self.rng.chance(2, 5) || entries == 0 {
            let (o, w, n) = *self.rng.pick(&[
                (0, 2, "eh_magic"),
                (2, 2, "eh_entries"),
                (4, 2, "eh_max"),
                (6, 2, "eh_depth"),
                (8, 4, "eh_generation"),
            ]);
            let mut f = field(base + o, w, format!("{name} {n}"));
            f.special = match n {
                "eh_depth" => vec![0, 1, 2, 5, 6, 0xffff],
                "eh_entries" | "eh_max" => vec![0, 1, 4, 5, 84, 85, 340, 341, 0xffff],
                _ => Vec::new(),
            };
            f
        } else {
            let e = self.rng.index(entries);
            let at = base + 12 + 12 * e;
            let fields: &[(usize, usize, &str)] = if leaf {
                &[(0, 4, "ee_block"), (4, 2, "ee_len"), (6, 2, "ee_start_hi"), (8, 4, "ee_start_lo")]
            } else {
                &[(0, 4, "ei_block"), (4, 4, "ei_leaf_lo"), (8, 2, "ei_leaf_hi")]
            };
            let &(o, w, n) = self.rng.pick(fields);
            let mut f = field(at + o, w, format!("{name} entry {e} {n}"));
            f.special = match n {
                "ee_len" => vec![0, 1, 32768, 32769, 65535, 0x7fff],
                "ee_block" | "ei_block" => vec![0, 1, 0x7fff_ffff, 0xffff_ffff, 0xffff_fffe],
                _ => refs,
            };
            f
        };
        self.set(f, Some(t));
    }

    fn extent_root(&mut self) -> bool {
        let Some(i) = self.pick_inode(|i| i.has_extents() && i.ino != 8 && i.ino != 7) else {
            return false;
        };
        let base = i.offset + 0x28;
        let entries = le16(self.img, base + 2) as usize;
        let leaf = le16(self.img, base + 6) == 0;
        self.extent_fields(
            base,
            entries.min(4),
            leaf,
            &format!("{} extent root", Self::inode_name(&i)),
            Touched::Inode(i.ino),
        );
        true
    }

    fn extent_block(&mut self) -> bool {
        if self.map.extent_nodes.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.extent_nodes);
        let base = self.map.block_offset(b.block);
        let entries = (le16(self.img, base + 2) as usize).min((self.map.block_size - 12) / 12);
        let leaf = le16(self.img, base + 6) == 0;
        if self.rng.chance(1, 10) {
            // The checksum tail itself.
            let off = base + extent::tail_offset(le16(self.img, base + 4));
            self.set(field(off, 4, format!("extent block {} tail", b.block)), None);
            return true;
        }
        self.extent_fields(
            base,
            entries,
            leaf,
            &format!("extent block {} of inode {}", b.block, b.ino),
            Touched::ExtentBlock(b),
        );
        true
    }

    fn indirect(&mut self) -> bool {
        if self.map.indirect_blocks.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.indirect_blocks);
        let base = self.map.block_offset(b.block);
        // Mostly slots in use (the first few), sometimes anywhere.
        let used = (0..self.map.block_size / 4).take_while(|&k| le32(self.img, base + 4 * k) != 0).count().max(1);
        let slot = if self.rng.chance(3, 4) { self.rng.index(used) } else { self.rng.index(self.map.block_size / 4) };
        let mut f = field(base + 4 * slot, 4, format!("indirect block {} of inode {} slot {slot}", b.block, b.ino));
        let mut refs = self.block_refs();
        refs.push(b.block); // itself: a cycle
        f.special = refs;
        self.set(f, None);
        true
    }

    /// Record offsets of a clean directory block (stops at the first bad one).
    fn records(&self, base: usize) -> Vec<usize> {
        let bs = self.map.block_size;
        let mut v = Vec::new();
        let mut off = 0;
        while off + 8 <= bs && v.len() < 4096 {
            v.push(off);
            let rl = rec_len_from_disk(le16(self.img, base + off + 4), bs);
            if rl < 8 || rl & 3 != 0 {
                break;
            }
            off += rl;
        }
        v
    }

    fn dir_leaf(&mut self) -> bool {
        if self.map.dir_leaves.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.dir_leaves);
        let base = self.map.block_offset(b.block);
        let recs = self.records(base);
        let r = *self.rng.pick(&recs);
        let at = base + r;
        let name = format!("dir block {} of inode {} record @{r}", b.block, b.ino);
        let t = Some(Touched::DirLeaf(b));
        let bs = self.map.block_size as u64;
        let rec_len = le16(self.img, at + 4) as u64;
        match self.rng.below(6) {
            0 => {
                let mut f = field(at, 4, format!("{name} inode"));
                let mut v: Vec<u64> = vec![
                    0,
                    1,
                    2,
                    7,
                    8,
                    11,
                    self.map.inodes_count as u64,
                    self.map.inodes_count as u64 + 1,
                    b.ino as u64,
                ];
                v.extend(self.map.inodes.iter().map(|i| i.ino as u64).take(40));
                f.special = v;
                self.set(f, t);
            }
            1 | 2 => {
                let mut f = field(at + 4, 2, format!("{name} rec_len"));
                f.special = vec![
                    0,
                    1,
                    4,
                    7,
                    8,
                    12,
                    rec_len + 4,
                    rec_len.wrapping_sub(4),
                    bs,
                    bs - r as u64,
                    bs - r as u64 + 4,
                    0xfffc,
                    0xffff,
                ];
                self.set(f, t);
            }
            3 => {
                let mut f = field(at + 6, 1, format!("{name} name_len"));
                f.special = vec![0, 1, 2, 255, rec_len.saturating_sub(8), rec_len.saturating_sub(7)];
                self.set(f, t);
            }
            4 => {
                let mut f = field(at + 7, 1, format!("{name} file_type"));
                f.special = vec![0, 1, 2, 3, 7, 8, 0xde, 0xff];
                self.set(f, t);
            }
            _ => {
                let nl = (self.img[at + 6] as usize).max(1);
                self.set_bytes(at + 8, nl.min(8), format!("{name} name"), t);
            }
        }
        true
    }

    fn htree(&mut self, root: bool) -> bool {
        let list = if root { &self.map.htree_roots } else { &self.map.htree_nodes };
        if list.is_empty() {
            return false;
        }
        let b = *self.rng.pick(list);
        let base = self.map.block_offset(b.block);
        let co = if root { 0x20 } else { 0x8 };
        let count = le16(self.img, base + co + 2) as usize;
        let nblocks = self
            .map
            .inode(b.ino)
            .map(|i| (le32(self.img, i.offset + 4) as u64).div_ceil(self.map.block_size as u64))
            .unwrap_or(1);
        let kind = if root { "htree root" } else { "htree node" };
        let name = format!("{kind} block {} of inode {}", b.block, b.ino);
        let t = Some(Touched::Htree(b, root));
        let blockvals = vec![0, 1, nblocks.saturating_sub(1), nblocks, nblocks + 1, 0x7fff_ffff, 0xffff_ffff];
        let pick = self.rng.below(if root { 8 } else { 5 });
        let mut f = match pick {
            0 => field(base + co, 2, format!("{name} limit")),
            1 => field(base + co + 2, 2, format!("{name} count")),
            2 => {
                let e = self.rng.index(count.max(1));
                let mut f = field(base + co + 4 + 8 * e, 4, format!("{name} entry {e} block"));
                f.special = blockvals.clone();
                f
            }
            3 if count > 1 => {
                let e = 1 + self.rng.index(count - 1);
                let prev = le32(self.img, base + co + 8 * (e - 1));
                let mut f = field(base + co + 8 * e, 4, format!("{name} entry {e} hash"));
                f.special =
                    vec![0, 1, 0xffff_ffff, 0xffff_fffe, prev as u64, prev as u64 | 1, prev.wrapping_sub(2) as u64];
                f
            }
            3 | 4 => field(base + 4, 2, format!("{name} record rec_len")),
            5 => {
                let mut f = field(base + 0x1E, 1, format!("{name} indirect_levels"));
                f.special = vec![0, 1, 2, 3, 0xff];
                f
            }
            6 => {
                let mut f = field(base + 0x1C, 1, format!("{name} hash_version"));
                f.special = vec![0, 1, 2, 3, 4, 5, 6, 7, 0xff];
                f
            }
            _ => {
                let (o, w, n) = *self.rng.pick(&[
                    (0x18, 4, "reserved_zero"),
                    (0x1D, 1, "info_length"),
                    (0x1F, 1, "unused_flags"),
                    (0, 4, "dot inode"),
                    (12, 4, "dotdot inode"),
                    (16, 2, "dotdot rec_len"),
                ]);
                field(base + o, w, format!("{name} {n}"))
            }
        };
        if f.special.is_empty() {
            f.special = vec![0, 1, 2, count as u64 + 1, 0xffff, (self.map.block_size / 8) as u64];
        }
        self.set(f, t);
        true
    }

    /// Entry offsets of an xattr entry table starting at `first` (clean).
    fn xattr_entries(&self, first: usize, end: usize) -> Vec<usize> {
        let mut v = Vec::new();
        let mut off = first;
        while off + 16 <= end && le32(self.img, off) != 0 && v.len() < 64 {
            v.push(off);
            off += (16 + self.img[off] as usize + 3) & !3;
        }
        v
    }

    fn xattr_entry_field(&mut self, at: usize, name: &str, t: Option<Touched>) {
        let (o, w, n) = *self.rng.pick(&[
            (0, 1, "e_name_len"),
            (1, 1, "e_name_index"),
            (2, 2, "e_value_offs"),
            (4, 4, "e_value_inum"),
            (8, 4, "e_value_size"),
            (12, 4, "e_hash"),
        ]);
        let mut f = field(at + o, w, format!("{name} {n}"));
        f.special = match n {
            "e_name_index" => vec![0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 0xff],
            "e_value_offs" | "e_value_size" => {
                let bs = self.map.block_size as u64;
                vec![0, 1, 3, 4, bs - 4, bs, bs + 4, 0xffff, 0xffff_fffc, 1 << 24, (1 << 24) + 1]
            }
            "e_value_inum" => vec![0, 1, 2, 11, 12, self.map.inodes_count as u64],
            _ => Vec::new(),
        };
        self.set(f, t);
    }

    fn xattr_block(&mut self) -> bool {
        if self.map.xattr_blocks.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.xattr_blocks);
        let base = self.map.block_offset(b.block);
        let name = format!("xattr block {}", b.block);
        let t = Some(Touched::XattrBlock(b));
        let entries = self.xattr_entries(base + 32, base + self.map.block_size);
        if entries.is_empty() || self.rng.chance(1, 3) {
            let (o, w, n) = *self.rng.pick(&[
                (0, 4, "h_magic"),
                (4, 4, "h_refcount"),
                (8, 4, "h_blocks"),
                (12, 4, "h_hash"),
                (16, 4, "h_checksum"),
            ]);
            self.set(field(base + o, w, format!("{name} {n}")), t);
        } else if self.rng.chance(1, 6) {
            let at = *self.rng.pick(&entries);
            let nl = self.img[at] as usize;
            self.set_bytes(at + 16, nl.max(1), format!("{name} entry name"), t);
        } else {
            let at = *self.rng.pick(&entries);
            self.xattr_entry_field(at, &format!("{name} entry @{}", at - base), t);
        }
        true
    }

    fn xattr_ibody(&mut self) -> bool {
        if self.map.inode_size <= 128 {
            return false;
        }
        let isz = self.map.inode_size;
        let img = self.img;
        let Some(i) = self.pick_inode(|i| {
            let x = le16(img, i.offset + 0x80) as usize;
            128 + x + 4 <= isz && le32(img, i.offset + 128 + x) == xattr::XATTR_MAGIC
        }) else {
            return false;
        };
        let name = format!("{} in-inode xattrs", Self::inode_name(&i));
        let start = i.offset + 128 + le16(self.img, i.offset + 0x80) as usize;
        let t = Some(Touched::Inode(i.ino));
        let entries = self.xattr_entries(start + 4, i.offset + isz);
        if entries.is_empty() || self.rng.chance(1, 5) {
            self.set(field(start, 4, format!("{name} magic")), t);
        } else {
            let at = *self.rng.pick(&entries);
            self.xattr_entry_field(at, &format!("{name} entry @{}", at - start), t);
        }
        true
    }

    fn symlink_block(&mut self) -> bool {
        if self.map.symlink_blocks.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.symlink_blocks);
        let off = self.map.block_offset(b.block) + self.rng.index(160);
        self.set_bytes(off, 1, format!("symlink block {} of inode {}", b.block, b.ino), None);
        true
    }

    fn data_block(&mut self) -> bool {
        if self.map.data_blocks.is_empty() {
            return false;
        }
        let b = *self.rng.pick(&self.map.data_blocks);
        let off = self.map.block_offset(b.block) + self.rng.index(self.map.block_size);
        self.set_bytes(off, 1, format!("data block {} of inode {}", b.block, b.ino), None);
        true
    }

    /// Every mapped metadata block with what it is (for aliasing edits).
    fn metadata_blocks(&self) -> Vec<(OwnedBlock, &'static str)> {
        let m = self.map;
        let mut v = Vec::new();
        for (list, kind) in [
            (&m.extent_nodes, "extent block"),
            (&m.indirect_blocks, "indirect block"),
            (&m.dir_leaves, "dir block"),
            (&m.htree_roots, "htree root"),
            (&m.htree_nodes, "htree node"),
            (&m.xattr_blocks, "xattr block"),
            (&m.symlink_blocks, "symlink block"),
        ] {
            v.extend(list.iter().map(|&b| (b, kind)));
        }
        v
    }

    /// Overwrite one metadata block with a copy of another (a directory
    /// block of one directory inside another, an htree node over a leaf,
    /// a directory block over an extent node, ...). With "fix checksums"
    /// the copy is re-sealed for its new owner, so it parses.
    fn copy_block(&mut self) -> bool {
        let all = self.metadata_blocks();
        if all.len() < 2 {
            return false;
        }
        let (src, sk) = *self.rng.pick(&all);
        let (dst, dk) = *self.rng.pick(&all);
        if src.block == dst.block {
            return false;
        }
        let bs = self.map.block_size;
        let (so, d) = (self.map.block_offset(src.block), self.map.block_offset(dst.block));
        if so + bs > self.img.len() || d + bs > self.img.len() {
            return false;
        }
        let touched = match dk {
            "extent block" => Some(Touched::ExtentBlock(dst)),
            "dir block" => Some(Touched::DirLeaf(dst)),
            "htree root" => Some(Touched::Htree(dst, true)),
            "htree node" => Some(Touched::Htree(dst, false)),
            "xattr block" => Some(Touched::XattrBlock(dst)),
            _ => None,
        };
        self.edits.push(Edit {
            offset: d,
            new: self.img[so..so + bs].to_vec(),
            old: self.img[d..d + bs].to_vec(),
            what: format!(
                "{dk} {} of inode {} replaced by {sk} {} of inode {}",
                dst.block, dst.ino, src.block, src.ino
            ),
        });
        self.touched.extend(touched);
        true
    }

    /// Overwrite one inode record with another's: two inodes sharing
    /// blocks, a file turned into a copy of a directory, ...
    fn copy_inode(&mut self) -> bool {
        let Some(src) = self.pick_inode(|_| true) else { return false };
        let Some(dst) = self.pick_inode(|i| i.ino == 2 || i.ino >= 11) else { return false };
        if src.ino == dst.ino {
            return false;
        }
        let n = self.map.inode_size;
        self.edits.push(Edit {
            offset: dst.offset,
            new: self.img[src.offset..src.offset + n].to_vec(),
            old: self.img[dst.offset..dst.offset + n].to_vec(),
            what: format!("{} replaced by a copy of {}", Self::inode_name(&dst), Self::inode_name(&src)),
        });
        self.touched.push(Touched::Inode(dst.ino));
        true
    }

    fn random_anywhere(&mut self) -> bool {
        let off = self.rng.index(self.img.len());
        let len = 1 + self.rng.index(4);
        self.set_bytes(off, len.min(self.img.len() - off), "random bytes".into(), None);
        true
    }

    /// A random byte inside a random metadata block (any kind), so the
    /// mutator also finds fields it has no name for.
    fn random_in_metadata(&mut self) -> bool {
        let m = self.map;
        let mut blocks: Vec<u64> = vec![m.blocks_count.min(1)];
        for l in [&m.extent_nodes, &m.indirect_blocks, &m.dir_leaves, &m.htree_roots, &m.htree_nodes, &m.xattr_blocks] {
            blocks.extend(l.iter().map(|b| b.block));
        }
        blocks.extend(m.groups.iter().flat_map(|g| [g.inode_table, g.inode_table + 1]));
        let blk = *self.rng.pick(&blocks);
        let off = m.block_offset(blk) + self.rng.index(m.block_size);
        self.set_bytes(off, 1, format!("metadata block {blk} byte"), None);
        true
    }
}

/// Recompute the checksums of every touched structure, using the
/// filesystem seed of the *mutated* superblock (a mutated UUID or seed
/// then invalidates everything else, as it would on disk).
pub fn fix_checksums(img: &mut [u8], map: &StructureMap, touched: &[Touched]) {
    if img.len() < 2048 {
        return;
    }
    let sb = Superblock::parse_raw(&img[1024..2048]);
    let bytes = sb.to_bytes_with_checksum();
    img[1024..2048].copy_from_slice(&bytes);
    let seed = sb.metadata_csum().then(|| sb.csum_seed());
    let gd_csum = match seed {
        Some(seed) => GdCsum::Crc32c { seed },
        None if sb.gdt_csum() => GdCsum::Crc16 { uuid: sb.uuid },
        None => GdCsum::None,
    };
    let bs = map.block_size;
    let len = img.len();
    let block_range = |b: u64| -> Option<std::ops::Range<usize>> {
        let s = (b as usize).checked_mul(bs)?;
        (s + bs <= len).then_some(s..s + bs)
    };
    let owner_seed = |img: &[u8], ino: u32| -> Option<u32> {
        let s = seed?;
        let loc = map.inode(ino)?;
        Some(inode_csum_seed(s, ino, le32(img, loc.offset + 0x64)))
    };
    for &t in touched {
        match t {
            Touched::Superblock => {}
            Touched::Group(g) => {
                let off = map.groups[g].desc_offset;
                let ds = map.desc_size;
                let gd = GroupDesc::parse_sized(&img[off..off + ds], ds);
                let out = gd.to_bytes_sized(ds, g as u32, gd_csum);
                img[off..off + ds].copy_from_slice(&out);
            }
            Touched::Inode(ino) => {
                let (Some(s), Some(loc)) = (seed, map.inode(ino)) else {
                    continue;
                };
                fix_inode(&mut img[loc.offset..loc.offset + map.inode_size], ino, s);
            }
            Touched::ExtentBlock(b) => {
                let (Some(s), Some(r)) = (owner_seed(img, b.ino), block_range(b.block)) else {
                    continue;
                };
                let blk = &mut img[r];
                if extent::tail_offset(le16(blk, 4)) + 4 <= blk.len() {
                    extent::set_block_checksum(blk, s);
                }
            }
            Touched::DirLeaf(b) => {
                let (Some(s), Some(r)) = (owner_seed(img, b.ino), block_range(b.block)) else {
                    continue;
                };
                let blk = &mut img[r];
                if dirent::has_tail(blk) {
                    dirent::set_tail_checksum(blk, s);
                }
            }
            Touched::Htree(b, root) => {
                let (Some(s), Some(r)) = (owner_seed(img, b.ino), block_range(b.block)) else {
                    continue;
                };
                fix_dx(&mut img[r], if root { 0x20 } else { 0x8 }, s);
            }
            Touched::XattrBlock(b) => {
                let (Some(s), Some(r)) = (seed, block_range(b.block)) else {
                    continue;
                };
                xattr::set_block_checksum(&mut img[r], b.block, s);
            }
        }
    }
}

/// Refresh an inode record's checksum (done by hand rather than through
/// `Inode::to_bytes`, which needs a record that parses).
fn fix_inode(rec: &mut [u8], ino: u32, fs_seed: u32) {
    let has_hi = rec.len() > 128 && le16(rec, 0x80) >= 4;
    let c = ext4kit_format::inode::Inode::compute_checksum(rec, ino, le32(rec, 0x64), fs_seed, has_hi);
    rec[0x7C..0x7E].copy_from_slice(&(c as u16).to_le_bytes());
    if has_hi {
        rec[0x82..0x84].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
    }
}

/// `ext4_dx_csum` with the block's own (possibly mutated) count and limit,
/// when the tail they imply lies inside the block.
fn fix_dx(blk: &mut [u8], count_offset: usize, seed: u32) {
    let limit = le16(blk, count_offset) as usize;
    let count = le16(blk, count_offset + 2) as usize;
    let tail = count_offset + 8 * limit;
    if tail + 8 > blk.len() || count_offset + 8 * count > blk.len() {
        return;
    }
    let c = crc32c(seed, &blk[..count_offset + 8 * count]);
    let c = crc32c(c, &blk[tail..tail + 4]);
    let c = crc32c(c, &[0u8; 4]);
    blk[tail + 4..tail + 8].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dx_fix_ignores_impossible_geometry() {
        let mut b = vec![0u8; 1024];
        b[0x20..0x22].copy_from_slice(&0xffffu16.to_le_bytes());
        fix_dx(&mut b, 0x20, 1); // must not panic
        let mut r = vec![0u8; 256];
        fix_inode(&mut r, 12, 7);
        assert_ne!(&r[0x7C..0x7E], &[0, 0]);
    }

    #[test]
    fn hex_is_short() {
        assert_eq!(hex(&[1, 0xab]), "01ab");
        assert!(hex(&[0; 40]).ends_with("(40 bytes)"));
    }
}
