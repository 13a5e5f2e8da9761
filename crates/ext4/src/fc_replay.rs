//! Fast-commit replay: applying the records that recovery found after the
//! last full commit (fs/ext4/fast_commit.c's replay; e2fsck's
//! `ext4_fc_replay` in e2fsck/journal.c is the form followed here, because
//! e2fsck's result is the oracle the tests compare with).
//!
//! A fast commit is a logical log: it does not carry blocks, it says what
//! changed, and replay redoes it with the filesystem's own code:
//!
//! - `ADD_RANGE` / `DEL_RANGE`: the inode's extents are read into a list,
//!   the range is cut out of it (and, for an add, the new extent put in),
//!   and the list is written back as a fresh extent tree when the next
//!   record concerns another inode (e2fsck's `ext4_fc_flush_extents`).
//!   Bitmap bits follow: blocks cut out are cleared, every block the list
//!   maps is set (fast commits do not log bitmaps, so a bit may already be
//!   as wanted; see `balloc::set_runs`).
//! - `INODE`: the logged record replaces the on-disk one except for
//!   `i_block` (the extent tree the ranges built), `i_blocks` is counted
//!   again, and the inode's bitmap bit follows its link count.
//! - `CREAT` / `LINK`: the name is (re)linked in its directory; `UNLINK`
//!   removes it if it still names that inode (a missing name is not an
//!   error: the kernel treats ENOENT as done).
//!
//! Link counts follow the kernel's replay (`ext4_fc_replay_unlink`,
//! `_link`, `_create`), not e2fsck's, which only edits the directory: an
//! unlink drops the inode's count and frees the inode when it reaches zero
//! (a file deleted and then a fast commit: no later `INODE` record brings
//! it back, and e2fsck's way leaves it allocated with no name); a link
//! raises it; a create sets it to one. A later `INODE` record, when there
//! is one, sets the count it logged anyway.
//!
//! Other deliberate differences from e2fsck: e2fsprogs 1.47 never links a
//! symlink created in a fast commit (a `return EXT2_FT_SYMLINK` where an
//! assignment was meant); the kernel links it, and so do we. And where
//! e2fsck leaves `i_blocks` without an inode's xattr block and the group
//! directory counts unchanged (its later passes repair them), we keep both
//! right, because a read-write open must leave an e2fsck-clean image.
//!
//! New extent-tree blocks must not land on blocks a later record will map
//! (the bitmap does not know them yet): the allocator skips every block
//! any `ADD_RANGE` of the replay names, as the kernel's
//! `ext4_fc_replay_check_excluded` does.

use ext4kit_format::extent::{Extent, ExtentHeader, EXTENT_MAGIC};
use ext4kit_format::fast_commit::{self, Record};
use ext4kit_format::inode::{flags, FileType, Inode, GOOD_OLD_INODE_SIZE};

use super::balloc::{self, BlockRequest};
use super::bmap::{self, BlockMap};
use super::bmap_write;
use super::dir;
use super::dir_delete;
use super::dir_insert::{self, NewEntry};
use super::dirblock::DirRef;
use super::extent_tree::{self, merge, Rebuild};
use super::ialloc;
use super::inode;
use super::reservation::Reserver;
use super::transaction::Handle;
use super::volume::Volume;
use super::xattr_write;
use crate::error::{Errno, Error, Result};

/// Offset of `i_block` in an inode record; everything before it is taken
/// from the logged record.
const I_BLOCK: usize = 0x28;
/// Offset of `i_generation`; everything from here to the record's end is
/// taken from the logged record too.
const I_GENERATION: usize = 0x64;

/// Apply fast-commit records, in order, to the volume.
pub fn replay(vol: &Volume, recs: &[Record]) -> Result<()> {
    let mut excluded: Vec<(u64, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::AddRange { extent, .. } => Some((extent.start(), extent.length() as u64)),
            _ => None,
        })
        .collect();
    excluded.sort_unstable();
    let mut r = Replayer {
        vol,
        list: None,
        excluded,
    };
    for rec in recs {
        r.apply(rec)?;
    }
    r.flush_unless(0)?;
    vol.sync_super()
}

/// The extent list of the inode being edited.
struct ExtList {
    ino: u32,
    extents: Vec<Extent>,
}

struct Replayer<'v> {
    vol: &'v Volume,
    list: Option<ExtList>,
    excluded: Vec<(u64, u64)>,
}

fn end(e: &Extent) -> u64 {
    e.block as u64 + e.length() as u64
}

fn extent(lblk: u64, pblk: u64, len: u64, uninit: bool) -> Extent {
    Extent::new(lblk as u32, len as u32, pblk, uninit)
}

impl Replayer<'_> {
    fn apply(&mut self, rec: &Record) -> Result<()> {
        match rec {
            Record::Dentry { tag, parent, ino, name } if *tag == fast_commit::TAG_UNLINK => {
                self.flush_unless(*ino)?;
                self.unlink(*parent, *ino, name)
            }
            Record::Dentry { tag, parent, ino, name } => {
                self.flush_unless(0)?;
                self.link(*parent, *ino, name, *tag == fast_commit::TAG_CREAT)
            }
            Record::AddRange { ino, extent } => {
                self.flush_unless(*ino)?;
                self.edit(*ino, extent.block as u64, extent.length() as u64, Some(*extent))
            }
            Record::DelRange { ino, lblk, len } => {
                self.flush_unless(*ino)?;
                self.edit(*ino, *lblk as u64, *len as u64, None)
            }
            Record::Inode { ino, raw } => {
                self.flush_unless(*ino)?;
                self.inode(*ino, raw)
            }
            Record::Tail { .. } => self.flush_unless(0),
            Record::Head { .. } | Record::Pad => Ok(()),
            Record::Unknown(t) => Err(Error::corrupt_msg(
                "fast commit",
                "fast-commit record",
                format!("tag {t:#x} is unknown"),
            )),
        }
    }

    fn check_ino(&self, ino: u32) -> Result<()> {
        if ino == 0 || ino > self.vol.geo().inodes_count() {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "fast-commit record",
                format!("inode number outside 1..={}", self.vol.geo().inodes_count()),
            ));
        }
        Ok(())
    }

    /// Cut `[lblk, lblk + len)` out of `ino`'s extent list and, for an
    /// add, put `add` in (`ext4_modify_extent_list`).
    fn edit(&mut self, ino: u32, lblk: u64, len: u64, add: Option<Extent>) -> Result<()> {
        self.check_ino(ino)?;
        if self.list.as_ref().is_none_or(|l| l.ino != ino) {
            let inode = inode::read(self.vol, ino)?;
            let extents = match bmap::load(self.vol, ino, &inode)? {
                BlockMap::Extents(v) => v,
                BlockMap::None => Vec::new(),
                _ => {
                    return Err(Error::posix(
                        Errno::EUCLEAN,
                        format!("fast commit maps blocks of inode {ino}, which has no extent tree"),
                    ))
                }
            };
            self.list = Some(ExtList { ino, extents });
        }
        let Some(list) = self.list.as_mut() else {
            unreachable!("the list was loaded just above")
        };
        let stop = lblk.saturating_add(len);
        let mut removed: Vec<(u64, u64)> = Vec::new();
        let mut kept: Vec<Extent> = Vec::with_capacity(list.extents.len() + 2);
        for e in &list.extents {
            let (s, t) = (e.block as u64, end(e));
            if t <= lblk || s >= stop || len == 0 {
                kept.push(*e);
                continue;
            }
            let cut_s = s.max(lblk);
            let cut_t = t.min(stop);
            removed.push((e.start() + (cut_s - s), cut_t - cut_s));
            if s < cut_s {
                kept.push(extent(s, e.start(), cut_s - s, e.is_uninit()));
            }
            if cut_t < t {
                kept.push(extent(cut_t, e.start() + (cut_t - s), t - cut_t, e.is_uninit()));
            }
        }
        if let Some(a) = add {
            if a.length() > 0 {
                kept.push(a);
            }
        }
        kept.sort_by_key(|e| e.block);
        merge(&mut kept);
        list.extents = kept;
        let mapped: Vec<(u64, u64)> = list.extents.iter().map(|e| (e.start(), e.length() as u64)).collect();
        let mut h = self.vol.begin()?;
        balloc::set_runs(self.vol, &mut h, &removed, false)?;
        balloc::set_runs(self.vol, &mut h, &mapped, true)?;
        h.commit()
    }

    /// Write the pending extent list back as a tree unless it is `ino`'s
    /// (`ext4_fc_flush_extents`; 0 flushes whatever is pending).
    fn flush_unless(&mut self, ino: u32) -> Result<()> {
        match &self.list {
            Some(l) if l.ino != ino || ino == 0 => {}
            _ => return Ok(()),
        }
        let Some(list) = self.list.take() else {
            return Ok(());
        };
        let vol = self.vol;
        let ino = list.ino;
        let mut inode = inode::read(vol, ino)?;
        if !inode.uses_extents() {
            return Err(Error::posix(
                Errno::EUCLEAN,
                format!("fast commit rewrites the extents of inode {ino}, which has no extent tree"),
            ));
        }
        let mut h = vol.begin()?;
        let excluded = &self.excluded;
        let mapped: Vec<(u64, u64)> = list.extents.iter().map(|e| (e.start(), e.length() as u64)).collect();
        let goal = mapped.first().map_or(0, |m| m.0);
        let mut held: Vec<(u64, u64)> = Vec::new();
        let mut alloc = |h: &mut Handle<'_>| -> Result<u64> {
            loop {
                let (b, _) = balloc::new_blocks(
                    vol,
                    h,
                    BlockRequest {
                        goal,
                        len: 1,
                        who: Reserver::Privileged,
                    },
                )?;
                let hit = |runs: &[(u64, u64)]| runs.iter().any(|&(s, n)| b >= s && b < s + n);
                if hit(excluded) || hit(&mapped) {
                    held.push((b, 1));
                    continue;
                }
                return Ok(b);
            }
        };
        let (old, new) = extent_tree::rebuild(
            vol,
            &mut h,
            ino,
            &mut inode,
            Rebuild {
                extents: &list.extents,
                alloc: &mut alloc,
            },
        )?;
        let old: Vec<(u64, u64)> = old.into_iter().map(|b| (b, 1)).collect();
        balloc::set_runs(vol, &mut h, &old, false)?;
        balloc::set_runs(vol, &mut h, &held, false)?;
        let data: u64 = mapped.iter().map(|m| m.1).sum();
        set_iblocks(vol, &mut inode, data + new.len() as u64);
        inode::write(vol, &mut h, ino, &inode)?;
        h.commit()
    }

    /// `ext4_fc_handle_inode`.
    fn inode(&mut self, ino: u32, raw: &[u8]) -> Result<()> {
        self.check_ino(ino)?;
        let vol = self.vol;
        let isize = vol.geo().inode_size();
        let mut len = GOOD_OLD_INODE_SIZE;
        if isize > GOOD_OLD_INODE_SIZE {
            let extra = raw.get(0x80..0x82).map_or(0, |b| u16::from_le_bytes([b[0], b[1]])) as usize;
            if extra < 4 || extra > isize - GOOD_OLD_INODE_SIZE {
                return Err(Error::corrupt_msg(
                    format!("inode {ino}"),
                    "fast-commit inode record",
                    format!("i_extra_isize {extra} does not fit a {isize}-byte inode"),
                ));
            }
            len += extra;
        }
        if raw.len() < len {
            return Err(Error::corrupt_msg(
                format!("inode {ino}"),
                "fast-commit inode record",
                format!("{} bytes where {len} are needed", raw.len()),
            ));
        }
        let (blk, off) = inode::location(vol, ino)?;
        let mut rec = vol.buffer(blk)?.data[off..off + isize].to_vec();
        let was = Inode::parse_raw(&rec).ok().and_then(|i| i.file_type());
        rec[..I_BLOCK].copy_from_slice(&raw[..I_BLOCK]);
        rec[I_GENERATION..len].copy_from_slice(&raw[I_GENERATION..len]);
        let mut inode = Inode::parse_raw(&rec).map_err(|e| Error::corrupt(format!("inode {ino} (fast commit)"), e))?;
        if inode.base.flags & flags::EXTENTS != 0 {
            if u16::from_le_bytes([inode.base.block[0], inode.base.block[1]]) != EXTENT_MAGIC {
                let mut b = [0u8; 60];
                ExtentHeader {
                    magic: EXTENT_MAGIC,
                    entries: 0,
                    max: 4,
                    depth: 0,
                    generation: 0,
                }
                .serialize_into(&mut b);
                inode.base.block = b;
            }
        } else if inode.base.flags & flags::INLINE_DATA != 0 {
            inode.base.block.copy_from_slice(&raw[I_BLOCK..I_GENERATION]);
        }
        let mut h = vol.begin()?;
        if inode.base.flags & flags::EXTENTS != 0 {
            let data: u64 = match bmap::load(vol, ino, &inode)? {
                BlockMap::Extents(v) => v.iter().map(|e| e.length() as u64).sum(),
                _ => 0,
            };
            let nodes = extent_tree::node_blocks(vol, ino, &inode)?.len() as u64;
            set_iblocks(vol, &mut inode, data + nodes);
        }
        inode::write(vol, &mut h, ino, &inode)?;
        let dir = inode.file_type() == Some(FileType::Directory) || was == Some(FileType::Directory);
        ialloc::set_used(vol, &mut h, ino, inode.base.links_count != 0, dir)?;
        h.commit()
    }

    /// `ext4_fc_handle_unlink`: remove `name` from `parent` if it names
    /// `ino`.
    fn unlink(&mut self, parent: u32, ino: u32, name: &[u8]) -> Result<()> {
        let vol = self.vol;
        let Ok(dir) = inode::read(vol, parent) else {
            return Ok(());
        };
        if dir.file_type() != Some(FileType::Directory) || name.is_empty() {
            return Ok(());
        }
        let map = bmap::load(vol, parent, &dir)?;
        let r = DirRef {
            ino: parent,
            inode: &dir,
            map: &map,
        };
        let found = match dir::lookup(vol, r, name)? {
            Some((found, _)) if found == ino || ino == 0 => found,
            _ => return Ok(()),
        };
        let mut h = vol.begin()?;
        dir_delete::remove_link(vol, &mut h, r, name)?;
        // __ext4_unlink: the inode loses a link; at zero it is evicted.
        let mut inode = inode::read(vol, found)?;
        inode.base.links_count = inode.base.links_count.saturating_sub(1);
        if inode.base.links_count == 0 && inode.file_type() != Some(FileType::Directory) {
            self.evict(&mut h, found, &mut inode)?;
        } else {
            inode::write(vol, &mut h, found, &inode)?;
        }
        h.commit()
    }

    /// Free an inode whose last link a replayed unlink removed, as the
    /// kernel's eviction does: its blocks, its xattr block, then the
    /// inode (links 0, deletion time set, bitmap bit cleared).
    fn evict(&mut self, h: &mut Handle<'_>, ino: u32, inode: &mut Inode) -> Result<()> {
        let vol = self.vol;
        if matches!(
            bmap::load(vol, ino, inode)?,
            BlockMap::Extents(_) | BlockMap::Indirect(_)
        ) {
            bmap_write::punch(vol, h, ino, inode, 0..u64::MAX)?;
        }
        xattr_write::drop_block(vol, h, ino, inode)?;
        inode.base.links_count = 0;
        inode.base.set_size(0);
        inode.base.dtime = vol.clock().now().sec.max(1) as u32;
        inode::write(vol, h, ino, inode)?;
        ialloc::set_used(vol, h, ino, false, false)?;
        Ok(())
    }

    /// `ext4_fc_handle_link_and_create`: (re)link `name` in `parent` to
    /// `ino`, replacing whatever the name pointed at; the inode's link count
    /// goes up by one (a link) or is set to one (a create of a non-directory).
    fn link(&mut self, parent: u32, ino: u32, name: &[u8], create: bool) -> Result<()> {
        self.check_ino(ino)?;
        let vol = self.vol;
        let inode = inode::read(vol, ino)?;
        let ft = inode.file_type().ok_or_else(|| {
            Error::corrupt_msg(
                format!("inode {ino}"),
                "fast-commit dentry",
                format!(
                    "a name is linked to inode {ino}, whose mode {:o} has no file type",
                    inode.base.mode
                ),
            )
        })?;
        dir_insert::check_name(name)?;
        let dir = inode::read(vol, parent)?;
        if dir.file_type() != Some(FileType::Directory) {
            return Err(Error::corrupt_msg(
                format!("inode {parent}"),
                "fast-commit dentry",
                "a name is linked into an inode that is not a directory",
            ));
        }
        let mut h = vol.begin()?;
        let map = bmap::load(vol, parent, &dir)?;
        let r = DirRef {
            ino: parent,
            inode: &dir,
            map: &map,
        };
        if dir::lookup(vol, r, name)?.is_some() {
            dir_delete::remove_link(vol, &mut h, r, name)?;
        }
        let mut new_dir = dir.clone();
        dir_insert::add_link(vol, &mut h, r, &mut new_dir, NewEntry::new(name, ino, ft))?;
        if new_dir != dir {
            inode::write(vol, &mut h, parent, &new_dir)?;
        }
        if ft != FileType::Directory {
            let mut inode = inode;
            inode.base.links_count = if create {
                1
            } else {
                inode.base.links_count.saturating_add(1)
            };
            inode::write(vol, &mut h, ino, &inode)?;
            ialloc::set_used(vol, &mut h, ino, true, false)?;
        }
        h.commit()
    }
}

/// `i_blocks` from scratch: `blocks` filesystem blocks of data and tree,
/// plus the xattr block if the inode has one.
fn set_iblocks(vol: &Volume, inode: &mut Inode, blocks: u64) {
    let total = blocks + u64::from(inode.file_acl() != 0);
    inode.base.set_blocks(0);
    inode::add_blocks(inode, total, vol.block_size());
}
