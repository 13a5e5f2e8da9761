//! Changing extent trees of any depth (the kernel's `fs/ext4/extents.c`).
//!
//! Every change is an *edit of the leaves covering a logical range*: the
//! edit descends from the root in `i_block` to each leaf whose key range
//! meets `[start, end)`, lets a closure change that leaf's extent list
//! (insert, trim, split, convert — always followed by merging neighbours),
//! and on the way back up stores each changed node:
//!
//! - a node left empty is freed and its index entry dropped
//!   (`ext4_ext_rm_idx`);
//! - a node over `eh_max` is split into new node blocks whose index entries
//!   go into the parent (`ext4_ext_split`) — when the split is at the tail
//!   (appending) the left node stays full, as the kernel's "split at the
//!   insertion point" does, so sequential growth packs leaves;
//! - every index entry's `ei_block` is set to its child's first key (e2fsck
//!   checks equality: `PR_1_EXTENT_INDEX_START_INVALID`).
//!
//! When the root (4 slots) overflows, its entries move into a new block and
//! the root becomes an index with one entry (`ext4_ext_grow_indepth`). When
//! a shrinking edit leaves everything under the root fitting in the root,
//! the tree loses a level (`ext4_ext_try_to_merge_up`, generalised), so a
//! truncate to zero gives the depth-0 empty root of a fresh inode.
//!
//! Node blocks that a split may need are reserved *before* anything is
//! changed (up to two leaf splits cascading to the root, plus growth), so a
//! full filesystem fails the edit with ENOSPC while the tree is untouched;
//! unused reserved blocks are returned at the end.
//!
//! Caller rules: the inode's write lock (`i_rwsem`) is held, so the tree's
//! node blocks belong to this edit alone; node blocks are rewritten whole
//! through the handle (`h.overwrite`).

use std::ops::Range;

use ext4kit_format::extent::{
    set_block_checksum, verify_block_checksum, Extent, ExtentHeader, ExtentIndex, ExtentNode, NodeEntries,
    EXTENT_MAGIC, MAX_DEPTH,
};
use ext4kit_format::inode::Inode;

use super::balloc::{self, BlockRequest};
use super::reservation::Reserver;
use super::transaction::Handle;
use super::volume::Volume;
use crate::error::{Errno, Error, Result};

/// Longest initialised extent (`EXT_INIT_MAX_LEN`).
pub(crate) const INIT_MAX: u64 = 32768;
/// Longest unwritten extent (`EXT_UNWRITTEN_MAX_LEN`).
pub(crate) const UNINIT_MAX: u64 = 32767;
/// Slots in the root node inside `i_block` (60 bytes: header + 4).
const ROOT_MAX: usize = 4;

/// One extent tree node held in memory while it is edited.
#[derive(Debug, Clone)]
struct Node {
    depth: u16,
    leaf: Vec<Extent>,
    idx: Vec<ExtentIndex>,
}

impl Node {
    fn empty_leaf() -> Node {
        Node {
            depth: 0,
            leaf: Vec::new(),
            idx: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        if self.depth == 0 {
            self.leaf.len()
        } else {
            self.idx.len()
        }
    }

    /// The first logical block this node's entries cover.
    fn first_key(&self) -> u32 {
        if self.depth == 0 {
            self.leaf.first().map_or(0, |e| e.block)
        } else {
            self.idx.first().map_or(0, |e| e.block)
        }
    }

    /// Entries `[a, b)` as a node of the same depth.
    fn slice(&self, a: usize, b: usize) -> Node {
        Node {
            depth: self.depth,
            leaf: if self.depth == 0 {
                self.leaf[a..b].to_vec()
            } else {
                Vec::new()
            },
            idx: if self.depth == 0 {
                Vec::new()
            } else {
                self.idx[a..b].to_vec()
            },
        }
    }

    /// Keys of the entries, in order.
    fn keys(&self) -> Vec<u32> {
        if self.depth == 0 {
            self.leaf.iter().map(|e| e.block).collect()
        } else {
            self.idx.iter().map(|e| e.block).collect()
        }
    }

    fn to_node(&self, max: u16) -> ExtentNode {
        ExtentNode {
            header: ExtentHeader {
                magic: EXTENT_MAGIC,
                entries: self.len() as u16,
                max,
                depth: self.depth,
                generation: 0,
            },
            entries: if self.depth == 0 {
                NodeEntries::Leaf(self.leaf.clone())
            } else {
                NodeEntries::Index(self.idx.clone())
            },
        }
    }
}

fn index_entry(first: u32, blk: u64) -> ExtentIndex {
    ExtentIndex::new(first, blk)
}

/// What a lookup found around a logical block.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Found {
    /// The extent containing the block.
    pub(crate) cur: Option<Extent>,
    /// The nearest extent before the block in the same leaf (allocation goal).
    pub(crate) prev: Option<Extent>,
    /// First mapped logical block after the block (bounds a hole).
    pub(crate) next_start: Option<u64>,
}

/// What an edit does to the leaves (decides reservation and collapse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EditKind {
    /// Add one extent (map_blocks).
    Insert,
    /// Remove a range (punch, truncate).
    Punch,
    /// Unwritten to written (mark_written).
    Convert,
}

/// One edit of the leaves covering logical blocks `[start, end)`.
pub(crate) struct Edit<'f> {
    /// Goal for new node blocks (near the data, as
    /// `ext4_ext_new_meta_block`).
    pub(crate) goal: u64,
    /// First logical block the edit touches.
    pub(crate) start: u64,
    /// End (exclusive) of the edited range.
    pub(crate) end: u64,
    /// What the edit does (decides reservation and collapse).
    pub(crate) kind: EditKind,
    /// The change to one leaf's extent list; it may add at most two
    /// entries to a leaf.
    pub(crate) leaf: &'f mut dyn FnMut(&mut Vec<Extent>) -> Result<()>,
}

/// Node blocks an edit put into and took out of the tree: what `i_blocks`
/// gains and loses besides the data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeCount {
    /// Node blocks put into the tree.
    pub(crate) added: u64,
    /// Node blocks removed from the tree (freed).
    pub(crate) removed: u64,
}

/// A rebuild of a tree from its extent list ([`rebuild`]).
pub(crate) struct Rebuild<'a> {
    /// The new extents, sorted by logical block, not overlapping.
    pub(crate) extents: &'a [Extent],
    /// Where each new node block comes from.
    pub(crate) alloc: &'a mut dyn FnMut(&mut Handle<'_>) -> Result<u64>,
}

/// One inode's extent tree: where its nodes are read from and written to,
/// with the inode's checksum seed for the node tails.
struct Tree<'a> {
    vol: &'a Volume,
    ino: u32,
    seed: Option<u32>,
}

impl<'a> Tree<'a> {
    fn new(vol: &'a Volume, ino: u32, rec: &Inode) -> Tree<'a> {
        Tree {
            vol,
            ino,
            seed: vol.geo().inode_seed(ino, rec.base.generation),
        }
    }

    /// Slots in a non-root node: `(block_size - 12) / 12`
    /// (`ext4_ext_space_block`, the tail fits in what is left over).
    fn node_max(&self) -> usize {
        (self.vol.block_size() - ExtentHeader::SIZE) / 12
    }

    fn root(&self, rec: &Inode) -> Result<Node> {
        let n = ExtentNode::parse(&rec.base.block)
            .map_err(|e| Error::corrupt(format!("extent tree root of inode {}", self.ino), e))?;
        Ok(from_parsed(n))
    }

    fn load(&self, blk: u64, depth: u16) -> Result<Node> {
        let loc = || format!("extent tree of inode {}, node block {blk}", self.ino);
        let buf = self.vol.buffer(blk).map_err(|e| super::error::annotate(e, &loc()))?;
        let n = ExtentNode::parse(&buf.data).map_err(|e| Error::corrupt(loc(), e))?;
        if n.header.depth != depth {
            return Err(Error::corrupt_msg(
                loc(),
                "extent header",
                format!("depth {} where {} was expected", n.header.depth, depth),
            ));
        }
        if let Some(s) = self.seed {
            buf.check_once(|d| verify_block_checksum(d, s))
                .map_err(|e| Error::corrupt(loc(), e))?;
        }
        Ok(from_parsed(n))
    }

    fn write(&self, h: &mut Handle<'_>, blk: u64, node: &Node) -> Result<()> {
        let mut buf = vec![0u8; self.vol.block_size()];
        node.to_node(self.node_max() as u16).serialize_into(&mut buf);
        if let Some(s) = self.seed {
            set_block_checksum(&mut buf, s);
        }
        h.overwrite(blk, buf.into_boxed_slice())
    }

    /// Give node block `blk` back to the free space.
    fn free(&self, h: &mut Handle<'_>, blk: u64) -> Result<()> {
        balloc::free_runs(self.vol, h, &[(blk, 1)])
    }

    /// Find what maps `lblk` (descending by index keys, as `ext4_find_extent`).
    fn find(&self, rec: &Inode, lblk: u64) -> Result<Found> {
        let mut node = self.root(rec)?;
        let mut next_bound: Option<u64> = None;
        loop {
            if node.depth == 0 {
                let v = &node.leaf;
                let i = v.partition_point(|e| e.block as u64 + e.length() as u64 <= lblk);
                let mut f = Found::default();
                match v.get(i) {
                    Some(e) if e.block as u64 <= lblk => {
                        f.cur = Some(*e);
                        f.next_start = v.get(i + 1).map(|n| n.block as u64).or(next_bound);
                    }
                    Some(e) => f.next_start = Some(e.block as u64),
                    None => f.next_start = next_bound,
                }
                if f.cur.is_none() && i > 0 {
                    f.prev = Some(v[i - 1]);
                }
                return Ok(f);
            }
            let i = node.idx.partition_point(|x| x.block as u64 <= lblk).saturating_sub(1);
            let Some(ent) = node.idx.get(i) else {
                return Ok(Found {
                    next_start: next_bound,
                    ..Found::default()
                });
            };
            if let Some(n) = node.idx.get(i + 1) {
                next_bound = Some(next_bound.map_or(n.block as u64, |b| b.min(n.block as u64)));
            }
            node = self.load(ent.leaf(), node.depth - 1)?;
        }
    }

    /// Entries in the leaf where `lblk` belongs, its capacity, and the tree
    /// depth.
    fn leaf_fill(&self, root: &Node, lblk: u64) -> Result<(usize, usize, u16)> {
        let mut node = root.clone();
        let mut max = ROOT_MAX;
        while node.depth > 0 {
            let i = node.idx.partition_point(|x| x.block as u64 <= lblk).saturating_sub(1);
            let Some(ent) = node.idx.get(i) else { break };
            node = self.load(ent.leaf(), node.depth - 1)?;
            max = self.node_max();
        }
        Ok((node.len(), max, root.depth))
    }

    /// Every node block (not the data), in the order a depth-first walk
    /// meets them.
    fn node_blocks(&self, rec: &Inode) -> Result<Vec<u64>> {
        let root = self.root(rec)?;
        let mut out = Vec::new();
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if n.depth == 0 {
                continue;
            }
            for e in &n.idx {
                let blk = e.leaf();
                if out.contains(&blk) || out.len() > 1 << 20 {
                    return Err(Error::corrupt_msg(
                        format!("extent tree of inode {}", self.ino),
                        "extent index",
                        format!("node block {blk} is reached twice"),
                    ));
                }
                out.push(blk);
                stack.push(self.load(blk, n.depth - 1)?);
            }
        }
        Ok(out)
    }
}

/// Find what maps logical block `lblk` of inode `ino` (record `rec`).
pub(crate) fn find(vol: &Volume, ino: u32, rec: &Inode, lblk: u64) -> Result<Found> {
    Tree::new(vol, ino, rec).find(rec, lblk)
}

/// Edit the leaves of inode `ino`'s tree covering `[edit.start, edit.end)`
/// with `edit.leaf`, then store, split, free and collapse nodes as needed
/// and write the new root into `rec`. Returns the node blocks the edit
/// added and removed (for `i_blocks`).
pub(crate) fn edit(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, edit: Edit<'_>) -> Result<NodeCount> {
    let Edit {
        goal,
        start,
        end,
        kind,
        leaf,
    } = edit;
    let tree = Tree::new(vol, ino, rec);
    let mut root = tree.root(rec)?;
    // Reserve what splits could need before changing anything: a leaf
    // near full (an edit adds at most two entries) may split, and the
    // split may cascade to the root and grow the tree. Only inserts,
    // punches strictly inside one extent and conversions cutting an
    // unwritten extent add entries at all.
    let last = end.saturating_sub(1).max(start);
    let grows = match kind {
        EditKind::Insert => true,
        EditKind::Punch => tree
            .find(rec, start)?
            .cur
            .is_some_and(|e| (e.block as u64) < start && e.block as u64 + e.length() as u64 > end),
        EditKind::Convert => {
            let a = tree.find(rec, start)?.cur;
            let b = tree.find(rec, last)?.cur;
            a.is_some_and(|e| e.is_uninit() && (e.block as u64) < start)
                || b.is_some_and(|e| e.is_uninit() && e.block as u64 + e.length() as u64 > end)
        }
    };
    // An insert fills a hole and a punch splits at most the extent at
    // `start`: one leaf. A conversion may cut extents at both ends.
    let (n1, max1, depth) = tree.leaf_fill(&root, start)?;
    let (n2, max2) = if kind == EditKind::Convert {
        let (n, m, _) = tree.leaf_fill(&root, last)?;
        (n, m)
    } else {
        (0, usize::MAX)
    };
    let mut cx = EditCx {
        tree,
        goal,
        pool: Vec::new(),
        nodes: NodeCount::default(),
        who: if kind == EditKind::Insert {
            Reserver::User
        } else {
            Reserver::Privileged
        },
        shrinking: kind != EditKind::Insert,
        start,
        end,
        leaf,
    };
    if grows && (n1 + 2 > max1 || n2 + 2 > max2) {
        if depth >= MAX_DEPTH {
            return Err(Error::posix(
                Errno::EFBIG,
                format!("inode {ino}: extent tree would exceed depth {MAX_DEPTH}"),
            ));
        }
        let need = 2 * (depth as u64 + 1) + 1;
        cx.reserve_pool(h, need)?;
    }
    let r = cx.run(h, rec, &mut root);
    // Unused reservations go back whatever happened.
    let pool = std::mem::take(&mut cx.pool);
    for b in pool {
        cx.tree.free(h, b)?;
    }
    r.map(|()| cx.nodes)
}

/// State of one edit: the range and the leaf change, where new node blocks
/// come from, and what happened to `i_blocks`.
struct EditCx<'a, 'f> {
    tree: Tree<'a>,
    /// Goal for node blocks (near the data, as `ext4_ext_new_meta_block`).
    goal: u64,
    /// Blocks reserved for splits before the edit started.
    pool: Vec<u64>,
    /// Node blocks put into and removed from the tree by this edit.
    nodes: NodeCount,
    /// Whose free space node blocks come from: removing or converting
    /// blocks may use the root reserve, so that it does not fail for want
    /// of a node block (the kernel's `EXT4_EX_NOFAIL`).
    who: Reserver,
    /// The edit removes entries: join siblings and collapse the root.
    shrinking: bool,
    start: u64,
    end: u64,
    leaf: &'f mut dyn FnMut(&mut Vec<Extent>) -> Result<()>,
}

impl EditCx<'_, '_> {
    /// Edit from the root down, grow or collapse the root, and write it
    /// into `rec`.
    fn run(&mut self, h: &mut Handle<'_>, rec: &mut Inode, root: &mut Node) -> Result<()> {
        self.edit_node(h, root)?;
        if root.len() > ROOT_MAX {
            // ext4_ext_grow_indepth: the root's entries move into a new
            // block one level down; the root indexes it.
            let b = self.take_block(h)?;
            self.tree.write(h, b, root)?;
            *root = Node {
                depth: root.depth + 1,
                leaf: Vec::new(),
                idx: vec![index_entry(root.first_key(), b)],
            };
        }
        if root.depth > 0 && root.idx.is_empty() {
            *root = Node::empty_leaf();
        }
        if self.shrinking {
            self.collapse(h, root)?;
        }
        rec.base.block = [0; 60];
        root.to_node(ROOT_MAX as u16).serialize_into(&mut rec.base.block);
        Ok(())
    }

    /// Pull the children of the root up into it while they all fit there.
    fn collapse(&mut self, h: &mut Handle<'_>, root: &mut Node) -> Result<()> {
        while root.depth > 0 {
            let mut total = 0;
            let mut children = Vec::with_capacity(root.idx.len());
            for ent in &root.idx {
                let c = self.tree.load(ent.leaf(), root.depth - 1)?;
                total += c.len();
                if total > ROOT_MAX {
                    return Ok(());
                }
                children.push((ent.leaf(), c));
            }
            let mut merged = Node {
                depth: root.depth - 1,
                leaf: Vec::new(),
                idx: Vec::new(),
            };
            for (b, c) in children {
                merged.leaf.extend(c.leaf);
                merged.idx.extend(c.idx);
                self.tree.free(h, b)?;
                self.nodes.removed += 1;
            }
            *root = merged;
        }
        Ok(())
    }

    fn edit_node(&mut self, h: &mut Handle<'_>, node: &mut Node) -> Result<()> {
        if node.depth == 0 {
            return (self.leaf)(&mut node.leaf);
        }
        let (start, end) = (self.start, self.end);
        let idx = std::mem::take(&mut node.idx);
        // Child i covers [idx[i].block, idx[i+1].block); the first child
        // also takes everything before its key.
        let first = idx.partition_point(|x| x.block as u64 <= start).saturating_sub(1);
        let mut out: Vec<ExtentIndex> = idx[..first.min(idx.len())].to_vec();
        let mut j = first;
        let edited_from = out.len();
        while j < idx.len() && (j == first || (idx[j].block as u64) < end) {
            let blk = idx[j].leaf();
            let mut child = self.tree.load(blk, node.depth - 1)?;
            self.edit_node(h, &mut child)?;
            out.extend(self.store_node(h, blk, &child)?);
            j += 1;
        }
        let edited_to = out.len();
        out.extend_from_slice(&idx[j.min(idx.len())..]);
        if self.shrinking {
            self.merge_siblings(h, &mut out, node.depth - 1, edited_from..edited_to)?;
        }
        node.idx = out;
        Ok(())
    }

    /// After a shrinking edit, join each edited child with its neighbour
    /// while both fit in one node, so emptied ranges do not leave a level
    /// of half-empty blocks (what e2fsck reports as "could be narrower").
    /// `out[edited]` are the edited children; their neighbours on either
    /// side are candidates too.
    fn merge_siblings(
        &mut self,
        h: &mut Handle<'_>,
        out: &mut Vec<ExtentIndex>,
        child_depth: u16,
        edited: Range<usize>,
    ) -> Result<()> {
        let max = self.tree.node_max();
        let mut k = edited.start.saturating_sub(1);
        let mut stop = (edited.end + 1).min(out.len());
        while k + 1 < stop {
            let (a, b) = (out[k].leaf(), out[k + 1].leaf());
            let mut left = self.tree.load(a, child_depth)?;
            let right = self.tree.load(b, child_depth)?;
            if left.len() + right.len() <= max {
                left.leaf.extend(right.leaf);
                left.idx.extend(right.idx);
                self.tree.write(h, a, &left)?;
                self.tree.free(h, b)?;
                self.nodes.removed += 1;
                out.remove(k + 1);
                stop -= 1;
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    /// Write back an edited non-root node at `blk`: freed when empty, split
    /// over several blocks when over `eh_max`. Returns the index entries
    /// that now stand for it in its parent.
    fn store_node(&mut self, h: &mut Handle<'_>, blk: u64, node: &Node) -> Result<Vec<ExtentIndex>> {
        let n = node.len();
        let max = self.tree.node_max();
        if n == 0 {
            self.tree.free(h, blk)?;
            self.nodes.removed += 1;
            return Ok(Vec::new());
        }
        if n <= max {
            self.tree.write(h, blk, node)?;
            return Ok(vec![index_entry(node.first_key(), blk)]);
        }
        // Split at the edit point, as ext4_ext_split does: the first entry
        // the edit made stays with those before it and everything after it
        // moves to the new node; an entry appended at the end moves alone.
        // Ascending inserts so fill the left node and appending keeps full
        // nodes behind it. When that would leave a side empty or
        // over-full, split evenly.
        let start = self.start;
        let at_edit = node.keys().partition_point(|&k| (k as u64) < start);
        let cut = if at_edit + 1 < n { at_edit + 1 } else { at_edit };
        let sizes = if cut >= 1 && cut <= max && n - cut <= max {
            vec![cut, n - cut]
        } else {
            split_sizes(n, max, false)
        };
        // Every block first, so a failure writes nothing (the reservation
        // makes that failure a can't-happen; this keeps it harmless).
        let mut blocks = vec![blk];
        while blocks.len() < sizes.len() {
            match self.take_block(h) {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    for &b in &blocks[1..] {
                        self.tree.free(h, b)?;
                        self.nodes.added -= 1;
                    }
                    return Err(e);
                }
            }
        }
        let mut out = Vec::with_capacity(sizes.len());
        let mut at = 0;
        for (sz, b) in sizes.into_iter().zip(blocks) {
            let piece = node.slice(at, at + sz);
            self.tree.write(h, b, &piece)?;
            out.push(index_entry(piece.first_key(), b));
            at += sz;
        }
        Ok(out)
    }

    fn reserve_pool(&mut self, h: &mut Handle<'_>, need: u64) -> Result<()> {
        while (self.pool.len() as u64) < need {
            let want = (need - self.pool.len() as u64) as u32;
            match balloc::new_blocks(
                self.tree.vol,
                h,
                BlockRequest {
                    goal: self.goal,
                    len: want,
                    who: self.who,
                },
            ) {
                Ok((p, n)) => self.pool.extend((0..n as u64).map(|k| p + k)),
                Err(e) => {
                    for b in std::mem::take(&mut self.pool) {
                        self.tree.free(h, b)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// A block for a new node: from the reservation, else freshly allocated.
    fn take_block(&mut self, h: &mut Handle<'_>) -> Result<u64> {
        let b = match self.pool.pop() {
            Some(b) => b,
            None => {
                balloc::new_blocks(
                    self.tree.vol,
                    h,
                    BlockRequest {
                        goal: self.goal,
                        len: 1,
                        who: self.who,
                    },
                )?
                .0
            }
        };
        self.nodes.added += 1;
        Ok(b)
    }
}

/// Every node block of inode `ino`'s extent tree (not the data), in the
/// order a depth-first walk meets them.
pub(crate) fn node_blocks(vol: &Volume, ino: u32, rec: &Inode) -> Result<Vec<u64>> {
    Tree::new(vol, ino, rec).node_blocks(rec)
}

/// Replace inode `ino`'s extent tree with a fresh one holding
/// `req.extents`, as e2fsck's fast-commit replay rewrites a tree from its
/// extent list (`e2fsck_rewrite_extent_tree`): up to four extents live in
/// the inode; more go into full leaves under as many index levels as it
/// takes. New node blocks come from `req.alloc`; the old tree's node
/// blocks are *not* freed here but returned, so the caller can free them
/// by its own rules. The new root is written into `rec` (the caller writes
/// the record); returns (old node blocks, new node blocks).
pub(crate) fn rebuild(
    vol: &Volume,
    h: &mut Handle<'_>,
    ino: u32,
    rec: &mut Inode,
    req: Rebuild<'_>,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let Rebuild { extents, alloc } = req;
    let tree = Tree::new(vol, ino, rec);
    let old = tree.node_blocks(rec)?;
    let max = tree.node_max();
    let mut level = Node {
        depth: 0,
        leaf: extents.to_vec(),
        idx: Vec::new(),
    };
    let mut new = Vec::new();
    while level.len() > ROOT_MAX {
        if level.depth >= MAX_DEPTH {
            return Err(Error::posix(
                Errno::EFBIG,
                format!(
                    "inode {ino}: {} extents need a tree deeper than {MAX_DEPTH}",
                    extents.len()
                ),
            ));
        }
        let mut up = Node {
            depth: level.depth + 1,
            leaf: Vec::new(),
            idx: Vec::new(),
        };
        let mut a = 0;
        for n in split_sizes(level.len(), max, true) {
            let node = level.slice(a, a + n);
            let blk = alloc(h)?;
            new.push(blk);
            tree.write(h, blk, &node)?;
            up.idx.push(index_entry(node.first_key(), blk));
            a += n;
        }
        level = up;
    }
    let mut root = [0u8; 60];
    level.to_node(ROOT_MAX as u16).serialize_into(&mut root);
    rec.base.block = root;
    Ok((old, new))
}

fn from_parsed(n: ExtentNode) -> Node {
    match n.entries {
        NodeEntries::Leaf(v) => Node {
            depth: n.header.depth,
            leaf: v,
            idx: Vec::new(),
        },
        NodeEntries::Index(v) => Node {
            depth: n.header.depth,
            leaf: Vec::new(),
            idx: v,
        },
    }
}

/// How to cut `n` entries into nodes of at most `max`: full nodes then the
/// rest when appending, else as even as possible.
fn split_sizes(n: usize, max: usize, tail: bool) -> Vec<usize> {
    if tail {
        let mut v = Vec::new();
        let mut left = n;
        while left > max {
            v.push(max);
            left -= max;
        }
        v.push(left);
        v
    } else {
        let k = n.div_ceil(max);
        (0..k).map(|i| n / k + usize::from(i < n % k)).collect()
    }
}

/// Join neighbours that are contiguous logically and physically and share
/// the unwritten state, within the length limits (`ext4_ext_try_to_merge`).
pub(crate) fn merge(ext: &mut Vec<Extent>) {
    let mut out: Vec<Extent> = Vec::with_capacity(ext.len());
    for e in ext.drain(..) {
        if let Some(last) = out.last_mut() {
            let cap = if e.is_uninit() { UNINIT_MAX } else { INIT_MAX };
            let ll = last.length() as u64;
            if last.is_uninit() == e.is_uninit()
                && last.block as u64 + ll == e.block as u64
                && last.start() + ll == e.start()
                && ll + e.length() as u64 <= cap
            {
                *last = Extent::new(last.block, (ll + e.length() as u64) as u32, last.start(), e.is_uninit());
                continue;
            }
        }
        out.push(e);
    }
    *ext = out;
}

/// Remove `[start, end)` from a leaf's extents, trimming or splitting the
/// ones it meets; the removed physical runs are appended to `freed`.
pub(crate) fn punch_leaf(leaf: &mut Vec<Extent>, start: u64, end: u64, freed: &mut Vec<(u64, u64)>) {
    let mut out = Vec::with_capacity(leaf.len() + 1);
    for e in leaf.drain(..) {
        let (s, l) = (e.block as u64, e.length() as u64);
        let (ps, pe) = (s.max(start), (s + l).min(end));
        if ps >= pe {
            out.push(e);
            continue;
        }
        if s < ps {
            out.push(Extent::new(s as u32, (ps - s) as u32, e.start(), e.is_uninit()));
        }
        freed.push((e.start() + (ps - s), pe - ps));
        if pe < s + l {
            out.push(Extent::new(
                pe as u32,
                (s + l - pe) as u32,
                e.start() + (pe - s),
                e.is_uninit(),
            ));
        }
    }
    *leaf = out;
}

/// Mark `[start, end)` written in a leaf: an unwritten extent it meets is
/// split into up to three (`ext4_split_convert_extents`), then neighbours
/// merge.
pub(crate) fn convert_leaf(leaf: &mut Vec<Extent>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(leaf.len() + 2);
    for e in leaf.drain(..) {
        let (s, l) = (e.block as u64, e.length() as u64);
        let (ps, pe) = (s.max(start), (s + l).min(end));
        if !e.is_uninit() || ps >= pe {
            out.push(e);
            continue;
        }
        if s < ps {
            out.push(Extent::new(s as u32, (ps - s) as u32, e.start(), true));
        }
        out.push(Extent::new(ps as u32, (pe - ps) as u32, e.start() + (ps - s), false));
        if pe < s + l {
            out.push(Extent::new(pe as u32, (s + l - pe) as u32, e.start() + (pe - s), true));
        }
    }
    merge(&mut out);
    *leaf = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_sizes_cover_everything() {
        assert_eq!(split_sizes(85, 84, true), vec![84, 1]);
        assert_eq!(split_sizes(85, 84, false), vec![43, 42]);
        assert_eq!(split_sizes(86, 84, false), vec![43, 43]);
        assert_eq!(split_sizes(5, 4, true), vec![4, 1]);
        for n in 1..400 {
            for tail in [true, false] {
                let v = split_sizes(n, 84, tail);
                assert_eq!(v.iter().sum::<usize>(), n);
                assert!(v.iter().all(|&s| (1..=84).contains(&s)));
            }
        }
    }

    #[test]
    fn punch_splits_and_trims() {
        let mut leaf = vec![Extent::new(0, 10, 100, false), Extent::new(20, 5, 200, true)];
        let mut freed = Vec::new();
        punch_leaf(&mut leaf, 3, 5, &mut freed);
        assert_eq!(
            leaf,
            vec![
                Extent::new(0, 3, 100, false),
                Extent::new(5, 5, 105, false),
                Extent::new(20, 5, 200, true)
            ]
        );
        assert_eq!(freed, vec![(103, 2)]);
        punch_leaf(&mut leaf, 8, 22, &mut freed);
        assert_eq!(
            leaf,
            vec![
                Extent::new(0, 3, 100, false),
                Extent::new(5, 3, 105, false),
                Extent::new(22, 3, 202, true)
            ]
        );
        assert_eq!(freed, vec![(103, 2), (108, 2), (200, 2)]);
    }

    #[test]
    fn convert_splits_in_three_and_merges() {
        let mut leaf = vec![Extent::new(0, 4, 50, false), Extent::new(4, 10, 54, true)];
        convert_leaf(&mut leaf, 6, 8);
        assert_eq!(
            leaf,
            vec![
                Extent::new(0, 4, 50, false),
                Extent::new(4, 2, 54, true),
                Extent::new(6, 2, 56, false),
                Extent::new(8, 6, 58, true)
            ]
        );
        convert_leaf(&mut leaf, 0, 14);
        assert_eq!(leaf, vec![Extent::new(0, 14, 50, false)]);
    }

    #[test]
    fn merge_respects_state_and_caps() {
        let mut v = vec![
            Extent::new(0, 32767, 1000, true),
            Extent::new(32767, 1, 1000 + 32767, true),
            Extent::new(32768, 1, 1000 + 32768, false),
        ];
        merge(&mut v);
        assert_eq!(v.len(), 3, "an unwritten extent stops at 32767 blocks");
    }
}
