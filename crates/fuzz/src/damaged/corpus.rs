//! The damaged images: clean bases and seed-deterministic damage.
//!
//! A base is made by `mke2fs -d` from the fuzzing source tree (indexed by
//! `e2fsck -fyD`), then written by our own library (an empty directory, a
//! file with data and an xattr, a symlink), then checked clean by
//! `e2fsck -fn`. Damage is aimed at the objects the write operations of
//! [`super::ops`] touch (their inodes, extent nodes, directory blocks,
//! xattr blocks, bitmap bits), so that most cases exercise a write path
//! over the damage rather than damage nobody reads.
//!
//! [`Damage::generate`] is a pure function of the seed and the bases, so a
//! failing case is reproduced from its seed alone
//! (`ext4kit-damaged --seed N`).

use ext4kit::{NewInode, Target};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use ext4kit_format::bytes::{le16, le32};
use ext4kit_format::checksum::crc32c;
use ext4kit_format::group_desc::{GdCsum, GroupDesc};
use ext4kit_format::inode::FileType;
use ext4kit_format::superblock::Superblock;

use crate::base::{bases_dir, build_source_tree, BaseError, TreeOpts};
use crate::map::{OwnedBlock, StructureMap};
use crate::mutate::{fix_checksums, Touched};
use crate::prng::Rng;

/// Bump when the bases' recipe changes (old caches are then ignored).
pub const DAMAGED_BASES_VERSION: &str = "d1";

/// Paths whose inodes the damage aims at: what [`super::ops`] touches.
pub const TARGETS: &[&str] = &[
    "/",
    "/lost+found",
    "/dir",
    "/dir/a",
    "/dir/a/b",
    "/dir/a/file2",
    "/big",
    "/medium.bin",
    "/fragmented.bin",
    "/xattr-big",
    "/xattr-small",
    "/small.txt",
    "/emptydir",
    "/made",
    "/made/file",
];

/// One clean base of the corpus.
#[derive(Debug, Clone)]
pub struct DamageBase {
    /// Short name.
    pub name: &'static str,
    /// The clean image.
    pub bytes: Arc<Vec<u8>>,
    /// Where its structures are.
    pub map: StructureMap,
    /// Inode numbers of [`TARGETS`] (those that exist on this base).
    pub targets: Vec<(&'static str, u32)>,
}

impl DamageBase {
    /// The inode of target `path`.
    pub fn target(&self, path: &str) -> Option<u32> {
        self.targets.iter().find(|(p, _)| *p == path).map(|t| t.1)
    }
}

/// (name, mke2fs arguments): ext4 with a journal (4 KiB blocks,
/// metadata_csum), ext4 without a journal on 1 KiB blocks, ext2 and ext3
/// on 1 KiB blocks (indirect maps, no checksums).
const SPECS: &[(&str, &[&str])] = &[
    ("ext4-journal", &["-t", "ext4", "-b", "4096", "-I", "256"]),
    ("ext4-1k-nojournal", &["-t", "ext4", "-b", "1024", "-I", "256", "-O", "^has_journal"]),
    ("ext2-1k", &["-t", "ext2", "-b", "1024", "-I", "128"]),
    ("ext3-1k", &["-t", "ext3", "-b", "1024", "-I", "256"]),
];

/// All bases, built on first use (cached beside the fuzzing bases).
pub fn damage_bases() -> Result<&'static [DamageBase], BaseError> {
    static B: OnceLock<Result<Vec<DamageBase>, String>> = OnceLock::new();
    B.get_or_init(|| SPECS.iter().map(|(n, a)| load(n, a).map_err(|e| e.0)).collect())
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| BaseError(e.clone()))
}

fn err(m: impl Into<String>) -> BaseError {
    BaseError(m.into())
}

fn load(name: &'static str, args: &[&str]) -> Result<DamageBase, BaseError> {
    let dir = bases_dir()?;
    fs::create_dir_all(&dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
    let path = dir.join(format!("{DAMAGED_BASES_VERSION}-{name}.img"));
    if !path.exists() {
        build(name, args, &dir, &path)?;
    }
    let bytes = fs::read(&path).map_err(|e| err(format!("reading {}: {e}", path.display())))?;
    let map = StructureMap::build(&bytes).map_err(|e| err(format!("mapping base {name}: {e}")))?;
    let targets = resolve_targets(&path)?;
    Ok(DamageBase { name, bytes: Arc::new(bytes), map, targets })
}

fn resolve_targets(path: &Path) -> Result<Vec<(&'static str, u32)>, BaseError> {
    let opts = ext4kit::OpenOptions { read_only: true, ..Default::default() };
    let fs = ext4kit::Fs::open_image(path, &opts).map_err(|e| err(format!("opening base {}: {e}", path.display())))?;
    Ok(TARGETS.iter().filter_map(|p| fs.lstat(p.as_bytes()).ok().map(|s| (*p, s.ino))).collect())
}

fn run(tool: &str, args: &[String], ok: &[i32]) -> Result<(), BaseError> {
    let out = Command::new("timeout")
        .arg("300")
        .arg(tool)
        .args(args)
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .output()
        .map_err(|e| err(format!("running {tool}: {e} (install e2fsprogs)")))?;
    let code = out.status.code().unwrap_or(-1);
    if ok.contains(&code) {
        return Ok(());
    }
    Err(err(format!(
        "{tool} {} exited {code}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// mke2fs -d, e2fsck -fyD, our library's writes, e2fsck -fn clean.
fn build(name: &str, args: &[&str], dir: &Path, out: &Path) -> Result<(), BaseError> {
    let uniq = format!("{name}.{}", std::process::id());
    let src = dir.join(format!("dsrc.{uniq}"));
    let tmp = dir.join(format!("{uniq}.dimg.tmp"));
    let _ = fs::remove_dir_all(&src);
    let tree = TreeOpts { big_dir_entries: 200, ..TreeOpts::FUZZ };
    build_source_tree(&src, &tree).map_err(|e| err(format!("source tree for {name}: {e}")))?;
    let t = tmp.display().to_string();
    let mut a: Vec<String> = ["-q", "-F", "-o", "Linux", "-N", "1024"].iter().map(|s| s.to_string()).collect();
    a.extend(args.iter().map(|s| s.to_string()));
    a.extend([
        "-U".into(),
        "0d1a6e2b-5c3f-4b7a-8e9d-1f2a3b4c5d6e".into(),
        "-E".into(),
        "hash_seed=3c2b1a09-8f7e-4d6c-9b5a-493827161504,root_owner=0:0".into(),
        "-d".into(),
        src.display().to_string(),
        t.clone(),
        "8M".into(),
    ]);
    let r = run("mke2fs", &a, &[0])
        .and_then(|()| run("e2fsck", &["-fyD".into(), t.clone()], &[0, 1]))
        .and_then(|()| populate(&tmp))
        .and_then(|()| run("e2fsck", &["-fn".into(), t.clone()], &[0]));
    let _ = fs::remove_dir_all(&src);
    if let Err(e) = r {
        let _ = fs::remove_file(&tmp);
        return Err(err(format!("building damaged-corpus base {name}: {e}")));
    }
    fs::rename(&tmp, out).map_err(|e| err(format!("renaming {}: {e}", tmp.display())))
}

/// Our own library writes part of every base, so the corpus covers
/// structures as we lay them out too.
fn populate(img: &Path) -> Result<(), BaseError> {
    use ext4kit::{Access, Cred, Fs, OpenFlags};
    let e = |what: &str, x: ext4kit::Error| err(format!("populating {}: {what}: {x}", img.display()));
    let fs = Fs::open_image(img, &ext4kit::OpenOptions { read_only: false, ..Default::default() })
        .map_err(|x| e("open", x))?;
    let root = Cred::root();
    fs.create(&NewInode::dir(b"/emptydir").mode(0o755).cred(&root)).map_err(|x| e("mkdir /emptydir", x))?;
    fs.create(&NewInode::dir(b"/made").mode(0o755).cred(&root)).map_err(|x| e("mkdir /made", x))?;
    fs.create(&NewInode::file(b"/made/file").mode(0o644).owner(0, 0)).map_err(|x| e("create /made/file", x))?;
    let f = fs
        .open(b"/made/file", OpenFlags { access: Access::WriteOnly, ..Default::default() })
        .map_err(|x| e("open /made/file", x))?;
    let data: Vec<u8> = (0..30_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(&f, &data).map_err(|x| e("write /made/file", x))?;
    fs.close_file(f).map_err(|x| e("close /made/file", x))?;
    fs.setxattr(Target::path(b"/made/file").nofollow(), b"user.lib", &[7u8; 400], 0, &root)
        .map_err(|x| e("setxattr /made/file", x))?;
    fs.create(&NewInode::symlink(b"/made/link", b"file").owner(0, 0)).map_err(|x| e("symlink /made/link", x))?;
    fs.sync().map_err(|x| e("sync", x))?;
    Ok(())
}

/// What was damaged (the corpus' categories; the figures in
/// docs/damaged-images.md count these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// One bit flipped in the superblock.
    FlipSuperblock,
    /// One bit flipped in a group descriptor.
    FlipGroupDesc,
    /// One bit flipped in a block bitmap.
    FlipBlockBitmap,
    /// One bit flipped in an inode bitmap.
    FlipInodeBitmap,
    /// One bit flipped in a target's inode record.
    FlipInode,
    /// One bit flipped in a target's extent root (`i_block`).
    FlipExtentRoot,
    /// One bit flipped in an extent index or leaf block.
    FlipExtentNode,
    /// One bit flipped in an indirect block.
    FlipIndirect,
    /// One bit flipped in a directory block.
    FlipDirBlock,
    /// One bit flipped in an htree root or interior node.
    FlipHtree,
    /// One bit flipped in an xattr block.
    FlipXattrBlock,
    /// An extent node (or an inode's block map) lost entries.
    TruncatedMap,
    /// A file's block map names a block another file owns.
    CrossLinked,
    /// A live block is marked free in its bitmap.
    LyingBlockBitmap,
    /// A live inode (often 11, lost+found) is marked free.
    LyingInodeBitmap,
    /// Two entries of one directory block have the same name.
    DuplicateName,
    /// An xattr entry names an EA inode on an image without `ea_inode`.
    EaInodeRef,
    /// The root inode is deleted (mode 0, no links, dtime set).
    RootMissing,
    /// The root inode is a regular file.
    RootNotDir,
}

impl Kind {
    /// Every kind, in the order seeds rotate through them.
    pub const ALL: [Kind; 19] = [
        Kind::FlipSuperblock,
        Kind::FlipGroupDesc,
        Kind::FlipBlockBitmap,
        Kind::FlipInodeBitmap,
        Kind::FlipInode,
        Kind::FlipExtentRoot,
        Kind::FlipExtentNode,
        Kind::FlipIndirect,
        Kind::FlipDirBlock,
        Kind::FlipHtree,
        Kind::FlipXattrBlock,
        Kind::TruncatedMap,
        Kind::CrossLinked,
        Kind::LyingBlockBitmap,
        Kind::LyingInodeBitmap,
        Kind::DuplicateName,
        Kind::EaInodeRef,
        Kind::RootMissing,
        Kind::RootNotDir,
    ];
}

/// One byte edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// Byte offset in the image.
    pub offset: usize,
    /// New bytes.
    pub new: Vec<u8>,
}

/// A reproducible damaged image.
#[derive(Debug, Clone)]
pub struct Damage {
    /// The seed.
    pub seed: u64,
    /// Index of the base.
    pub base: usize,
    /// What kind of damage (may differ from the seed's first choice when
    /// the base has no such structure: the next kind that applies).
    pub kind: Kind,
    /// What exactly was changed, for reports.
    pub what: String,
    edits: Vec<Edit>,
    touched: Vec<Touched>,
    /// Bitmaps whose descriptor checksum must follow them: (group, inode bitmap?).
    bitmaps: Vec<(usize, bool)>,
    fix: bool,
}

impl Damage {
    /// The damage of `seed`: base `seed % bases`, kind from the seed.
    pub fn generate(seed: u64, bases: &[DamageBase]) -> Damage {
        let base = (seed % bases.len() as u64) as usize;
        let b = &bases[base];
        let mut rng = Rng::new(seed ^ 0xD4_4A6E);
        let first = ((seed / bases.len() as u64) % Kind::ALL.len() as u64) as usize;
        for k in 0..Kind::ALL.len() {
            let kind = Kind::ALL[(first + k) % Kind::ALL.len()];
            let mut g = Gen { b, rng: &mut rng, edits: Vec::new(), touched: Vec::new(), bitmaps: Vec::new() };
            if let Some(what) = g.make(kind) {
                let (edits, touched, bitmaps) = (g.edits, g.touched, g.bitmaps);
                // Checksums are fixed for most cases so the damage reaches
                // the logic behind the checksum check; some keep a stale one.
                let fix = !kind.is_flip() || rng.chance(3, 4);
                return Damage { seed, base, kind, what, edits, touched, bitmaps, fix };
            }
        }
        Damage {
            seed,
            base,
            kind: Kind::FlipSuperblock,
            what: "nothing applicable".into(),
            edits: Vec::new(),
            touched: Vec::new(),
            bitmaps: Vec::new(),
            fix: false,
        }
    }

    /// The damaged image.
    pub fn apply(&self, bases: &[DamageBase]) -> Vec<u8> {
        let b = &bases[self.base];
        let mut img = b.bytes.as_ref().clone();
        for e in &self.edits {
            img[e.offset..e.offset + e.new.len()].copy_from_slice(&e.new);
        }
        if self.fix {
            for &(g, inode) in &self.bitmaps {
                fix_bitmap_csum(&mut img, &b.map, g, inode);
            }
            fix_checksums(&mut img, &b.map, &self.touched);
        }
        img
    }

    /// One line: base, kind, what.
    pub fn describe(&self, bases: &[DamageBase]) -> String {
        format!(
            "seed {} on {}: {:?}: {}{}",
            self.seed,
            bases[self.base].name,
            self.kind,
            self.what,
            if self.fix { "" } else { " (checksums left stale)" }
        )
    }
}

impl Kind {
    fn is_flip(self) -> bool {
        (self as usize) <= Kind::FlipXattrBlock as usize
    }
}

/// Refresh a bitmap's checksum in its group descriptor (metadata_csum).
fn fix_bitmap_csum(img: &mut [u8], map: &StructureMap, g: usize, inode: bool) {
    let sb = Superblock::parse_raw(&img[1024..2048]);
    if !sb.metadata_csum() {
        return;
    }
    let seed = sb.csum_seed();
    let loc = map.groups[g];
    let blk = if inode { loc.inode_bitmap } else { loc.block_bitmap } as usize * map.block_size;
    let len = if inode { sb.inodes_per_group as usize / 8 } else { sb.blocks_per_group as usize / 8 };
    let c = crc32c(seed, &img[blk..blk + len]);
    let off = loc.desc_offset;
    let (lo, hi) = if inode { (0x1A, 0x3A) } else { (0x18, 0x38) };
    img[off + lo..off + lo + 2].copy_from_slice(&(c as u16).to_le_bytes());
    if map.desc_size >= 64 {
        img[off + hi..off + hi + 2].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
    }
    let gd = GroupDesc::parse_sized(&img[off..off + map.desc_size], map.desc_size);
    let out = gd.to_bytes_sized(map.desc_size, g as u32, GdCsum::Crc32c { seed });
    img[off..off + map.desc_size].copy_from_slice(&out);
}

struct Gen<'a> {
    b: &'a DamageBase,
    rng: &'a mut Rng,
    edits: Vec<Edit>,
    touched: Vec<Touched>,
    bitmaps: Vec<(usize, bool)>,
}

impl Gen<'_> {
    fn img(&self) -> &[u8] {
        &self.b.bytes
    }

    fn target_inos(&self) -> Vec<u32> {
        self.b.targets.iter().map(|t| t.1).collect()
    }

    /// Blocks of `list` owned by targets (all of them when none is).
    fn owned(&mut self, list: &[OwnedBlock]) -> Option<OwnedBlock> {
        let t = self.target_inos();
        let mine: Vec<OwnedBlock> = list.iter().copied().filter(|o| t.contains(&o.ino)).collect();
        let pool = if mine.is_empty() { list.to_vec() } else { mine };
        (!pool.is_empty()).then(|| *self.rng.pick(&pool))
    }

    fn flip_in(&mut self, start: usize, len: usize, header: usize) -> String {
        let span = if self.rng.chance(1, 2) { header.min(len) } else { len };
        let off = start + self.rng.index(span.max(1));
        let bit = self.rng.index(8);
        let v = self.img()[off] ^ (1 << bit);
        self.edits.push(Edit { offset: off, new: vec![v] });
        format!("bit {bit} of byte {:#x} (+{})", off, off - start)
    }

    fn set(&mut self, offset: usize, new: &[u8]) {
        self.edits.push(Edit { offset, new: new.to_vec() });
    }

    fn inode_off(&self, ino: u32) -> Option<usize> {
        self.b.map.inode(ino).map(|i| i.offset)
    }

    fn make(&mut self, kind: Kind) -> Option<String> {
        let map = self.b.map.clone();
        let bs = map.block_size;
        match kind {
            Kind::FlipSuperblock => {
                self.touched.push(Touched::Superblock);
                // The fields the engine and e2fsck read (the first 0x180
                // bytes), not the checksum itself.
                Some(format!("superblock {}", self.flip_in(1024, 0x3FC, 0x180)))
            }
            Kind::FlipGroupDesc => {
                let g = self.rng.index(map.groups.len());
                let off = map.groups[g].desc_offset;
                self.touched.push(Touched::Group(g));
                Some(format!("group descriptor {g} {}", self.flip_in(off, map.desc_size, 0x20)))
            }
            Kind::FlipBlockBitmap | Kind::FlipInodeBitmap => {
                let inode = kind == Kind::FlipInodeBitmap;
                let g = self.rng.index(map.groups.len());
                let b = if inode { map.groups[g].inode_bitmap } else { map.groups[g].block_bitmap };
                let bits = if inode { map.inodes_per_group as usize } else { 8 * bs };
                // Near the used region, where it matters.
                let off = b as usize * bs + self.rng.index((bits / 8).min(64));
                let bit = self.rng.index(8);
                let v = self.img()[off] ^ (1 << bit);
                self.set(off, &[v]);
                self.bitmaps.push((g, inode));
                self.touched.push(Touched::Group(g));
                Some(format!("{} bitmap of group {g}: byte {off:#x} bit {bit}", if inode { "inode" } else { "block" }))
            }
            Kind::FlipInode => {
                let ino = *self.rng.pick(&self.target_inos());
                let off = self.inode_off(ino)?;
                self.touched.push(Touched::Inode(ino));
                Some(format!("inode {ino} {}", self.flip_in(off, map.inode_size.min(160), 0x40)))
            }
            Kind::FlipExtentRoot => {
                let cands: Vec<u32> =
                    self.target_inos().into_iter().filter(|&i| map.inode(i).is_some_and(|l| l.has_extents())).collect();
                if cands.is_empty() {
                    return None;
                }
                let ino = *self.rng.pick(&cands);
                let off = self.inode_off(ino)? + 0x28;
                self.touched.push(Touched::Inode(ino));
                Some(format!("inode {ino} extent root {}", self.flip_in(off, 60, 24)))
            }
            Kind::FlipExtentNode | Kind::FlipIndirect | Kind::FlipDirBlock | Kind::FlipXattrBlock => {
                let list = match kind {
                    Kind::FlipExtentNode => &map.extent_nodes,
                    Kind::FlipIndirect => &map.indirect_blocks,
                    Kind::FlipDirBlock => &map.dir_leaves,
                    _ => &map.xattr_blocks,
                };
                let o = self.owned(list)?;
                self.touched.push(match kind {
                    Kind::FlipExtentNode => Touched::ExtentBlock(o),
                    Kind::FlipDirBlock => Touched::DirLeaf(o),
                    Kind::FlipXattrBlock => Touched::XattrBlock(o),
                    _ => Touched::Superblock,
                });
                let start = o.block as usize * bs;
                Some(format!("{kind:?} block {} of inode {} {}", o.block, o.ino, self.flip_in(start, bs, 64)))
            }
            Kind::FlipHtree => {
                let mut all: Vec<(OwnedBlock, bool)> = map.htree_roots.iter().map(|&o| (o, true)).collect();
                all.extend(map.htree_nodes.iter().map(|&o| (o, false)));
                if all.is_empty() {
                    return None;
                }
                let (o, root) = *self.rng.pick(&all);
                self.touched.push(Touched::Htree(o, root));
                let start = o.block as usize * bs;
                let what = if root { "root" } else { "node" };
                Some(format!("htree {what} block {} of inode {} {}", o.block, o.ino, self.flip_in(start, bs, 0x40)))
            }
            Kind::TruncatedMap => self.truncated_map(),
            Kind::CrossLinked => self.cross_linked(),
            Kind::LyingBlockBitmap => {
                let mut pool: Vec<OwnedBlock> = map.data_blocks.clone();
                pool.extend(map.dir_leaves.iter().copied());
                pool.extend(map.extent_nodes.iter().copied());
                pool.extend(map.xattr_blocks.iter().copied());
                let o = self.owned(&pool)?;
                let first = le32(self.img(), 1024 + 0x14) as u64;
                let bpg = le32(self.img(), 1024 + 0x20) as u64;
                let rel = o.block.checked_sub(first)?;
                let (g, bit) = ((rel / bpg) as usize, (rel % bpg) as usize);
                let off = map.groups.get(g)?.block_bitmap as usize * bs + bit / 8;
                let v = self.img()[off] & !(1 << (bit % 8));
                self.set(off, &[v]);
                self.bitmaps.push((g, false));
                self.touched.push(Touched::Group(g));
                Some(format!("block {} (inode {}) marked free in group {g}'s bitmap", o.block, o.ino))
            }
            Kind::LyingInodeBitmap => {
                let ino = if self.rng.chance(1, 2) { 11 } else { *self.rng.pick(&self.target_inos()) };
                let rel = (ino - 1) as usize;
                let ipg = map.inodes_per_group as usize;
                let (g, bit) = (rel / ipg, rel % ipg);
                let off = map.groups.get(g)?.inode_bitmap as usize * bs + bit / 8;
                let v = self.img()[off] & !(1 << (bit % 8));
                self.set(off, &[v]);
                self.bitmaps.push((g, true));
                self.touched.push(Touched::Group(g));
                Some(format!("live inode {ino} marked free in group {g}'s inode bitmap"))
            }
            Kind::DuplicateName => self.duplicate_name(),
            Kind::EaInodeRef => self.ea_inode_ref(),
            Kind::RootMissing | Kind::RootNotDir => {
                let off = self.inode_off(2)?;
                self.touched.push(Touched::Inode(2));
                if kind == Kind::RootNotDir {
                    self.set(off, &0o100755u16.to_le_bytes());
                    return Some("root inode's mode made a regular file".into());
                }
                if self.rng.chance(1, 2) {
                    self.set(off, &0u16.to_le_bytes());
                    self.set(off + 0x1A, &0u16.to_le_bytes());
                    self.set(off + 0x14, &1_700_000_000u32.to_le_bytes());
                    Some("root inode deleted (mode 0, links 0, dtime set)".into())
                } else {
                    self.set(off, &0u16.to_le_bytes());
                    Some("root inode's mode zeroed".into())
                }
            }
        }
    }

    /// An extent node or root loses entries (eh_entries lowered), or an
    /// indirect-mapped file loses its indirect block pointer.
    fn truncated_map(&mut self) -> Option<String> {
        let map = self.b.map.clone();
        let bs = map.block_size;
        let t = self.target_inos();
        let nodes: Vec<OwnedBlock> = map.extent_nodes.iter().copied().filter(|o| t.contains(&o.ino)).collect();
        if !nodes.is_empty() && self.rng.chance(1, 2) {
            let o = *self.rng.pick(&nodes);
            let off = o.block as usize * bs;
            let n = le16(self.img(), off + 2);
            if n > 0 {
                let new = self.rng.below(n as u64) as u16;
                self.set(off + 2, &new.to_le_bytes());
                self.touched.push(Touched::ExtentBlock(o));
                return Some(format!("extent node {} of inode {}: eh_entries {n} -> {new}", o.block, o.ino));
            }
        }
        let files: Vec<u32> = t
            .iter()
            .copied()
            .filter(|&i| {
                map.inode(i).is_some_and(|l| l.ftype == Some(FileType::Regular) || l.ftype == Some(FileType::Directory))
            })
            .filter(|&i| map.inode(i).is_some_and(|l| l.flags & ext4kit_format::inode::flags::INLINE_DATA == 0))
            .collect();
        let ino = *self.rng.pick(&files);
        let loc = *map.inode(ino)?;
        let ib = loc.offset + 0x28;
        if loc.has_extents() {
            let n = le16(self.img(), ib + 2);
            if n == 0 {
                return None;
            }
            let new = self.rng.below(n as u64) as u16;
            self.set(ib + 2, &new.to_le_bytes());
            self.touched.push(Touched::Inode(ino));
            return Some(format!("inode {ino} extent root: eh_entries {n} -> {new}"));
        }
        // Indirect: drop the single- or double-indirect pointer, or a direct one.
        let slot = *self.rng.pick(&[0usize, 1, 12, 13]);
        if le32(self.img(), ib + 4 * slot) == 0 {
            return None;
        }
        self.set(ib + 4 * slot, &[0; 4]);
        self.touched.push(Touched::Inode(ino));
        Some(format!("inode {ino} i_block[{slot}] zeroed"))
    }

    /// A target file's first mapped block is replaced by a block another
    /// inode owns (both now claim it).
    fn cross_linked(&mut self) -> Option<String> {
        let map = self.b.map.clone();
        let t = self.target_inos();
        let mut victims: Vec<OwnedBlock> = map.data_blocks.clone();
        victims.extend(map.dir_leaves.iter().copied());
        let files: Vec<u32> = t
            .iter()
            .copied()
            .filter(|&i| map.inode(i).is_some_and(|l| l.ftype == Some(FileType::Regular)))
            .filter(|&i| map.data_blocks.iter().any(|d| d.ino == i))
            .collect();
        if files.is_empty() {
            return None;
        }
        let ino = *self.rng.pick(&files);
        let others: Vec<OwnedBlock> = victims.into_iter().filter(|v| v.ino != ino).collect();
        let other = *self.rng.pick(&others);
        let loc = *map.inode(ino)?;
        let ib = loc.offset + 0x28;
        if loc.has_extents() {
            // Depth 0 root: the first leaf entry's ee_start; deeper trees:
            // the first index's child is left alone and the first leaf
            // block's first extent is redirected instead.
            let depth = le16(self.img(), ib + 6);
            let entry = if depth == 0 {
                ib + 12
            } else {
                let node = map.extent_nodes.iter().find(|o| o.ino == ino)?;
                self.touched.push(Touched::ExtentBlock(*node));
                if le16(self.img(), node.block as usize * map.block_size + 6) != 0 {
                    return None;
                }
                node.block as usize * map.block_size + 12
            };
            self.set(entry + 6, &((other.block >> 32) as u16).to_le_bytes());
            self.set(entry + 8, &(other.block as u32).to_le_bytes());
        } else {
            self.set(ib, &(other.block as u32).to_le_bytes());
        }
        self.touched.push(Touched::Inode(ino));
        Some(format!("inode {ino}'s first block now block {} (owned by inode {})", other.block, other.ino))
    }

    /// Entry k of a directory block takes entry j's name (same length
    /// only, so the block stays well-formed).
    fn duplicate_name(&mut self) -> Option<String> {
        let map = self.b.map.clone();
        let bs = map.block_size;
        let t = self.target_inos();
        let leaves: Vec<OwnedBlock> = map.dir_leaves.iter().copied().filter(|o| t.contains(&o.ino)).collect();
        for _ in 0..8 {
            let o = *self.rng.pick(&leaves);
            let start = o.block as usize * bs;
            let blk = &self.b.bytes[start..start + bs];
            let mut ents = Vec::new(); // (offset, name)
            let mut p = 0;
            while p + 8 <= bs {
                let rl = ext4kit_format::dirent::rec_len_from_disk(le16(blk, p + 4), bs);
                let nl = blk[p + 6] as usize;
                if rl < 8 || p + rl > bs {
                    break;
                }
                if le32(blk, p) != 0 && nl > 0 && p + 8 + nl <= bs {
                    let name = blk[p + 8..p + 8 + nl].to_vec();
                    if name != b"." && name != b".." {
                        ents.push((p, name));
                    }
                }
                p += rl;
            }
            let mut pairs = Vec::new();
            for (i, a) in ents.iter().enumerate() {
                for b2 in &ents[i + 1..] {
                    if a.1.len() == b2.1.len() {
                        pairs.push((a.clone(), b2.clone()));
                    }
                }
            }
            if pairs.is_empty() {
                continue;
            }
            let (a, b2) = self.rng.pick(&pairs).clone();
            self.set(start + b2.0 + 8, &a.1);
            self.touched.push(Touched::DirLeaf(o));
            return Some(format!(
                "directory inode {} block {}: {:?} renamed to a second {:?}",
                o.ino,
                o.block,
                String::from_utf8_lossy(&b2.1),
                String::from_utf8_lossy(&a.1)
            ));
        }
        None
    }

    /// The first xattr entry of a target's xattr block (or in-inode area)
    /// gets `e_value_inum` set: a live file's inode or a free one.
    fn ea_inode_ref(&mut self) -> Option<String> {
        let map = self.b.map.clone();
        let bs = map.block_size;
        let live = self.b.target("/dir/a/file2")?;
        let inum = if self.rng.chance(1, 2) { live } else { map.inodes_count - 3 };
        let blocks: Vec<OwnedBlock> = map.xattr_blocks.clone();
        if !blocks.is_empty() && self.rng.chance(2, 3) {
            let o = self.owned(&blocks)?;
            // Entries start after the 32-byte header; e_value_inum at +4.
            let off = o.block as usize * bs + 32 + 4;
            self.set(off, &inum.to_le_bytes());
            self.touched.push(Touched::XattrBlock(o));
            return Some(format!("xattr block {} (inode {}): first entry's e_value_inum = {inum}", o.block, o.ino));
        }
        let ino = self.b.target("/xattr-small")?;
        let off = self.inode_off(ino)?;
        if map.inode_size <= 128 {
            return None;
        }
        let extra = le16(self.img(), off + 0x80) as usize;
        let hdr = off + 128 + extra;
        if le32(self.img(), hdr) != 0xEA02_0000 {
            return None;
        }
        self.set(hdr + 4 + 4, &inum.to_le_bytes());
        self.touched.push(Touched::Inode(ino));
        Some(format!("inode {ino}'s in-inode xattr: first entry's e_value_inum = {inum}"))
    }
}

/// Where the corpus' scratch files go: `$TMPDIR/ext4kit-damaged-<pid>`.
pub fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ext4kit-damaged-{}", std::process::id()))
}
