//! How large an image must be to hold its sources, decided before
//! anything is written: the sources are read once into a model of the
//! tree they make together (later sources over earlier ones, whiteouts
//! and opaque directories applied, hard links counted once), the model's
//! inodes and blocks are counted as ext4 lays them out, and mkfs's own
//! dry run finds the smallest filesystem whose free blocks and inodes hold
//! them plus the free space asked for.
//!
//! The count of a file's blocks follows the on-disk rules: data blocks are
//! the blocks its data segments touch (holes take none); an extent maps at
//! most 32,768 blocks and an inode holds four extents (`i_block`), more
//! need a leaf block per 340 (4 KiB blocks: (4096 − 12) / 12) and an index
//! level above four leaves; a directory's entries take 8 bytes plus the
//! name rounded to 4 (`ext4_dir_entry_2`), its blocks reserve 12 for the
//! checksum tail, and an indexed directory's leaves are counted half full
//! (a split leaves two half-full blocks) with its root block; a symlink of
//! 60 bytes or more takes a block; xattrs beyond the inode's in-body space
//! (256-byte inodes: 92 bytes after the 32-byte extra fields and the
//! header) take an xattr block. What the engine allocates can differ from
//! the count by the extents a file is split into where allocation crosses
//! a group's metadata, so each file is allowed one more extent per group
//! it can span.

use std::collections::{BTreeMap, HashSet};

use ext4kit::mkfs::{dry_run, MkfsOptions};

use crate::entry::{Entry, EntryKind, EntryPath, FileData};
use crate::error::{Error, Result};
use crate::source::{Sink, Source};

/// Slack beyond the count, for what it cannot see: where the allocator
/// splits a file or grows a directory across a group's metadata, xattr
/// blocks it does not share. 1% and 32 blocks; the tree of
/// `tests/build_size.rs` needs 15,414 blocks by the count and builds in
/// an image of 17,554 (mke2fs -d + resize2fs -M: 28,803).
const SLACK_FIXED: u64 = 32;
const SLACK_DIVISOR: u64 = 100;

/// What the sources need, in blocks of one size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Inodes (files, directories, links to nothing else), the root's
    /// included.
    pub inodes: u64,
    /// Blocks: data, extent tree, directory and xattr blocks.
    pub blocks: u64,
    /// Bytes of file data (holes excluded).
    pub data_bytes: u64,
}

/// Free space asked for beyond what the sources need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Extra {
    /// This many (bytes for blocks; a count for inodes).
    Amount(u64),
    /// This percentage of the filesystem's total.
    Percent(f64),
}

impl Extra {
    /// Parse `10%` as a percentage, anything else with `amount` (the
    /// caller's own size syntax for space, a plain count for inodes).
    pub fn parse(
        s: &str,
        amount: impl Fn(&str) -> std::result::Result<u64, String>,
    ) -> std::result::Result<Extra, String> {
        let s = s.trim();
        match s.strip_suffix('%') {
            Some(p) => {
                let v: f64 = p.trim().parse().map_err(|_| format!("\"{s}\": not a percentage"))?;
                if !(0.0..100.0).contains(&v) {
                    return Err(format!("\"{s}\": a percentage from 0 to below 100"));
                }
                Ok(Extra::Percent(v))
            }
            None => amount(s).map(Extra::Amount),
        }
    }

    /// How many of `total`, for a need of `amount` units of `unit` bytes.
    fn of(self, total: u64, unit: u64) -> u64 {
        match self {
            Extra::Amount(n) => n.div_ceil(unit),
            Extra::Percent(p) => ((total as f64) * p / 100.0).ceil() as u64,
        }
    }
}

/// One name in the model.
#[derive(Debug, Default)]
struct Node {
    /// Blocks of its own (data, extent tree, symlink, xattr block).
    blocks: u64,
    data_bytes: u64,
    /// An inode of its own (false: a hard link to one counted elsewhere).
    inode: bool,
    /// Children by name, for a directory.
    children: Option<BTreeMap<Vec<u8>, Node>>,
    /// The layer that made it (an opaque marker keeps its own layer's).
    layer: u32,
}

/// Reads sources into the model.
struct Model {
    root: Node,
    block_size: u64,
    layer: u32,
    identities: HashSet<(u64, u64)>,
    buf: Vec<u8>,
}

/// What the sources need on a filesystem of `block_size`-byte blocks,
/// read in order as a build would apply them.
pub fn measure(sources: &mut [Box<dyn Source>], block_size: u32) -> Result<Needs> {
    let mut m = Model {
        root: Node {
            inode: true,
            children: Some(BTreeMap::new()),
            ..Node::default()
        },
        block_size: u64::from(block_size),
        layer: 0,
        identities: HashSet::new(),
        buf: vec![0u8; 1 << 20],
    };
    for s in sources.iter_mut() {
        m.layer += 1;
        s.visit(&mut m)?;
    }
    let mut n = Needs::default();
    m.count(&m.root, &mut n);
    Ok(n)
}

impl Model {
    /// The directory node at `path`, made where missing.
    fn dir(&mut self, path: &EntryPath) -> std::result::Result<&mut BTreeMap<Vec<u8>, Node>, String> {
        let layer = self.layer;
        let mut node = &mut self.root;
        for c in path.components() {
            let kids = node.children.as_mut().ok_or("a path through a non-directory")?;
            node = kids.entry(c.to_vec()).or_insert_with(|| Node {
                inode: true,
                children: Some(BTreeMap::new()),
                layer,
                ..Node::default()
            });
        }
        node.children
            .as_mut()
            .ok_or_else(|| format!("\"{path}\" is not a directory"))
    }

    /// Blocks a file of these data segments takes: its data and its
    /// extent tree.
    fn file_blocks(&self, segments: &[(u64, u64)]) -> u64 {
        let bs = self.block_size;
        let mut blocks = 0u64;
        let mut extents = 0u64;
        let mut last: Option<u64> = None;
        for &(off, len) in segments {
            if len == 0 {
                continue;
            }
            let (first, end) = (off / bs, (off + len).div_ceil(bs));
            // A segment sharing its first block with the one before.
            let first = if last == Some(first) { first + 1 } else { first };
            if first >= end {
                continue;
            }
            let n = end - first;
            blocks += n;
            extents += n.div_ceil(32_768);
            last = Some(end - 1);
        }
        // One more extent per group the data can be split at.
        extents += blocks / (8 * bs) + 1;
        blocks + extent_tree_blocks(extents, bs)
    }

    fn count(&self, node: &Node, n: &mut Needs) {
        if node.inode {
            n.inodes += 1;
        }
        n.blocks += node.blocks;
        n.data_bytes += node.data_bytes;
        if let Some(kids) = &node.children {
            n.blocks += dir_blocks(kids.keys().map(|k| k.len()), self.block_size);
            for k in kids.values() {
                self.count(k, n);
            }
        }
    }

    fn entry_node(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> std::result::Result<Node, String> {
        let bs = self.block_size;
        let mut node = Node {
            inode: true,
            layer: self.layer,
            ..Node::default()
        };
        if let Some(id) = e.identity {
            if !self.identities.insert(id) {
                node.inode = false;
                return Ok(node);
            }
        }
        match &e.kind {
            EntryKind::Dir => node.children = Some(BTreeMap::new()),
            EntryKind::File { .. } => {
                let mut segs: Vec<(u64, u64)> = Vec::new();
                if let Some(d) = data {
                    while let Some((off, len)) = d.read_segment(&mut self.buf).map_err(|e| format!("reading: {e}"))? {
                        match segs.last_mut() {
                            Some(l) if l.0 + l.1 == off => l.1 += len as u64,
                            _ => segs.push((off, len as u64)),
                        }
                        node.data_bytes += len as u64;
                    }
                }
                node.blocks = self.file_blocks(&segs);
            }
            EntryKind::Symlink(t) => node.blocks = u64::from(t.len() >= 60),
            EntryKind::HardLink(_) => node.inode = false,
            _ => {}
        }
        if node.inode && xattr_bytes(&e.xattrs) > 92 {
            node.blocks += xattr_bytes(&e.xattrs).div_ceil(bs - 32);
        }
        Ok(node)
    }
}

impl Sink for Model {
    fn begin_layer(&mut self) -> Result<()> {
        self.layer += 1;
        Ok(())
    }

    fn entry(&mut self, e: &Entry, data: Option<&mut dyn FileData>) -> Result<()> {
        let fail = |r: String| Error::entry("sizing", e.path.to_string(), r);
        let Some((dir, name)) = e.path.split() else {
            // The root exists; only its xattrs may add a block.
            return Ok(());
        };
        let layer = self.layer;
        match &e.kind {
            EntryKind::Whiteout => {
                self.dir(&dir).map_err(fail)?.remove(name);
            }
            EntryKind::Opaque => {
                let kids = self.dir(&e.path).map_err(fail)?;
                kids.retain(|_, k| k.layer == layer);
            }
            _ => {
                let node = self.entry_node(e, data).map_err(fail)?;
                let kids = self.dir(&dir).map_err(fail)?;
                match kids.get_mut(name) {
                    // A directory over a directory merges.
                    Some(old) if old.children.is_some() && node.children.is_some() => old.layer = layer,
                    _ => {
                        kids.insert(name.to_vec(), node);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Extent tree blocks for `extents` extents: none while the inode's four
/// slots hold them, then a leaf per `(bs - 12) / 12`, and index blocks
/// above more than four leaves.
fn extent_tree_blocks(extents: u64, bs: u64) -> u64 {
    if extents <= 4 {
        return 0;
    }
    let per = (bs - 12) / 12;
    let mut level = extents.div_ceil(per);
    let mut total = level;
    while level > 4 {
        level = level.div_ceil(per);
        total += level;
    }
    total
}

/// Blocks of a directory holding names of these lengths.
fn dir_blocks(names: impl Iterator<Item = usize>, bs: u64) -> u64 {
    // "." and "..", then 8 + the name rounded to 4 per entry; 12 bytes
    // of each block are the checksum tail.
    let bytes: u64 = 24 + names.map(|l| 8 + (l as u64).div_ceil(4) * 4).sum::<u64>();
    let room = bs - 12;
    let linear = bytes.div_ceil(room);
    if linear <= 1 {
        1
    } else {
        // Indexed: leaves half full after splits, and the root block.
        (2 * bytes).div_ceil(room) + 1
    }
}

/// Bytes xattrs take in the xattr area: a 16-byte entry header plus the
/// name (without its namespace prefix) rounded to 4, and the value
/// rounded to 4.
fn xattr_bytes(x: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    x.iter()
        .map(|(n, v)| {
            let short = n.iter().position(|&c| c == b'.').map_or(n.len(), |i| n.len() - i - 1);
            16 + (short as u64).div_ceil(4) * 4 + (v.len() as u64).div_ceil(4) * 4
        })
        .sum::<u64>()
        + if x.is_empty() { 0 } else { 4 }
}

/// The smallest filesystem mkfs `opts` makes that holds `needs` with
/// `free` blocks and `free_inodes` inodes to spare, outside the root
/// reserve: its size in bytes, and the inode count it needs (`-N`) when
/// mkfs's default is too few.
pub fn smallest(needs: &Needs, opts: &MkfsOptions, free: Extra, free_inodes: Extra) -> Result<(u64, Option<u64>)> {
    let bs = u64::from(opts.block_size.unwrap_or(4096));
    let fits = |blocks: u64| -> std::result::Result<Option<Option<u64>>, String> {
        // Inodes: what the sources need plus the spare; mkfs's default
        // for this size if that is more.
        let want_inodes = needs.inodes + 11 + free_inodes.of(needs.inodes, 1);
        let mut o = opts.clone();
        o.block_size = Some(bs as u32);
        let r = match dry_run(blocks * bs, &o) {
            Ok(r) => r,
            Err(_) => return Ok(None),
        };
        let inodes = if u64::from(r.inodes_count) >= want_inodes {
            None
        } else {
            o.inodes = Some(want_inodes);
            Some(want_inodes)
        };
        let r = match dry_run(blocks * bs, &o) {
            Ok(r) => r,
            Err(_) => return Ok(None),
        };
        let spare = free.of(r.blocks_count, bs);
        // The root reserve (-m) is not for the build: directory growth
        // never takes from it.
        let reserve = (r.blocks_count as f64 * o.reserved_percent / 100.0).ceil() as u64;
        Ok(
            (r.free_blocks >= needs.blocks + SLACK_FIXED + needs.blocks / SLACK_DIVISOR + spare + reserve)
                .then_some(inodes),
        )
    };
    let err = |r: String| Error::entry("sizing", "the smallest image", r);
    // Grow until it fits, then search back down.
    let mut hi = (needs.blocks + needs.blocks / 8 + 4096).max(2048);
    let mut tries = 0;
    while fits(hi).map_err(err)?.is_none() {
        hi = hi.checked_mul(2).ok_or_else(|| err("no size fits".into()))?;
        tries += 1;
        if tries > 40 {
            return Err(err("no size fits".into()));
        }
    }
    let mut lo = needs.blocks.max(64);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid).map_err(err)?.is_some() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let inodes = fits(hi).map_err(err)?.flatten();
    Ok((hi * bs, inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_trees() {
        assert_eq!(extent_tree_blocks(4, 4096), 0);
        assert_eq!(extent_tree_blocks(5, 4096), 1);
        assert_eq!(extent_tree_blocks(340, 4096), 1);
        assert_eq!(extent_tree_blocks(341, 4096), 2);
        // 10,000 extents: 30 leaves and one index block.
        assert_eq!(extent_tree_blocks(10_000, 4096), 31);
    }

    #[test]
    fn directories() {
        assert_eq!(dir_blocks(std::iter::empty(), 4096), 1);
        // 1,000 names of 10 bytes: 20 bytes each, about 5 blocks linear.
        let n = dir_blocks(std::iter::repeat_n(10, 1000), 4096);
        assert!((10..=12).contains(&n), "{n}");
    }

    #[test]
    fn extras() {
        let count = |s: &str| s.parse::<u64>().map_err(|e| e.to_string());
        assert_eq!(Extra::parse("10%", count), Ok(Extra::Percent(10.0)));
        assert_eq!(Extra::parse("1000", count), Ok(Extra::Amount(1000)));
        assert!(Extra::parse("100%", count).is_err());
        assert!(Extra::parse("x%", count).is_err());
        assert!(Extra::parse("x", count).is_err());
        assert_eq!(Extra::Percent(10.0).of(1000, 4096), 100);
        assert_eq!(Extra::Amount(8192).of(0, 4096), 2);
    }

    #[test]
    fn the_smallest_size_fits_and_one_block_less_does_not() {
        let needs = Needs {
            inodes: 5000,
            blocks: 30_000,
            data_bytes: 0,
        };
        let o = MkfsOptions::default();
        let (bytes, inodes) = smallest(&needs, &o, Extra::Amount(0), Extra::Amount(0)).unwrap();
        let made = MkfsOptions {
            block_size: Some(4096),
            inodes,
            ..o.clone()
        };
        let r = dry_run(bytes, &made).unwrap();
        assert!(r.free_blocks >= 30_000, "{r:?}");
        assert!(u64::from(r.inodes_count) >= 5000 + 11, "{r:?}");
        assert!(bytes < 30_000 * 4096 * 2, "{bytes}");
        // A little smaller does not hold the need and the slack.
        let r = dry_run(bytes - 4096 * 64, &made).unwrap();
        let reserve = (r.blocks_count as f64 * 0.05).ceil() as u64;
        assert!(
            r.free_blocks < 30_000 + 30_000 / SLACK_DIVISOR + SLACK_FIXED + reserve,
            "{r:?}"
        );
    }
}
