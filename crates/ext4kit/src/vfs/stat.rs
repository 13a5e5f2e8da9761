//! `stat` and `statfs`-style views of inodes and of the whole filesystem.

use ext4kit_format::features::{self, ro_compat};
use ext4kit_format::inode::{FileType, Inode, TimeField, Timestamp};
use ext4kit_format::superblock::{STATE_ERROR, STATE_VALID};

use super::lookup;
use super::namei;
use super::super_block::SuperBlock;
use super::target::{Named, Target};
use crate::error::{Errno, Error, Result};
use crate::ext4::Volume;

/// What `stat(2)` reports, plus ext4 details the CLI shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u32,
    /// File type.
    pub ftype: FileType,
    /// Full `i_mode` (type and permission bits).
    pub mode: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Hard links.
    pub nlink: u16,
    /// Last access.
    pub atime: Timestamp,
    /// Last data change.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
    /// Creation (zero when the inode has no room for it).
    pub crtime: Timestamp,
    /// Whether the record has room for `i_crtime` (`i_extra_isize`
    /// covers it: ext4_getattr's `EXT4_FITS_IN_INODE(.., i_crtime)`), so
    /// that `crtime` is the birth time and not a zero stand-in.
    pub has_crtime: bool,
    /// Space used in 512-byte units.
    pub blocks: u64,
    /// `i_flags`.
    pub flags: u32,
    /// Device (major, minor) for device inodes.
    pub rdev: (u32, u32),
    /// `i_generation`.
    pub generation: u32,
    /// Block of the external xattr block (0 if none).
    pub file_acl: u64,
}

impl Stat {
    pub(crate) fn from_inode(vol: &Volume, ino: u32, i: &Inode) -> Stat {
        let ftype = i.file_type().unwrap_or(FileType::Regular);
        let rdev = if matches!(ftype, FileType::CharDevice | FileType::BlockDevice) {
            i.device()
        } else {
            (0, 0)
        };
        Stat {
            ino,
            ftype,
            mode: i.base.mode,
            uid: i.uid(),
            gid: i.gid(),
            size: i.size(),
            nlink: i.base.links_count,
            atime: i.time(TimeField::Atime),
            mtime: i.time(TimeField::Mtime),
            ctime: i.time(TimeField::Ctime),
            crtime: i.time(TimeField::Crtime),
            has_crtime: i.has_extra(0x14),
            blocks: i.blocks_512(vol.geo().has_ro_compat(ro_compat::HUGE_FILE), vol.block_size() as u32),
            flags: i.base.flags,
            rdev,
            generation: i.base.generation,
            file_acl: i.file_acl(),
        }
    }

    /// Permission bits.
    pub fn perm(&self) -> u16 {
        self.mode & 0o7777
    }

    /// statx's `STATX_ATTR_*` bits for this inode and the mask of those
    /// ext4 reports (`ext4_getattr`): append-only, compressed, encrypted,
    /// immutable, nodump and verity, whose `STATX_ATTR_*` values are the
    /// `EXT4_*_FL` ones. DAX is not among them: the kernel reports
    /// `STATX_ATTR_DAX` from the inode's effective DAX mode (`IS_DAX`, set
    /// by `vfs_getattr_nosec`), never from the flag, and an image in a
    /// file has none; the VFS adds that bit to every mask itself.
    pub fn statx_attributes(&self) -> (u64, u64) {
        statx_attributes(self.flags)
    }
}

/// [`Stat::statx_attributes`] of inode flags `flags`.
pub fn statx_attributes(flags: u32) -> (u64, u64) {
    use ext4kit_format::inode::flags as fl;
    const MASK: u32 = fl::APPEND | fl::COMPR | fl::ENCRYPT | fl::IMMUTABLE | fl::NODUMP | fl::VERITY;
    (u64::from(flags & MASK), u64::from(MASK))
}

/// A summary of the filesystem (what `ext4kit info` prints).
#[derive(Debug, Clone)]
pub struct FsInfo {
    /// Volume label.
    pub label: String,
    /// UUID, formatted.
    pub uuid: String,
    /// Block size.
    pub block_size: u32,
    /// Inode record size.
    pub inode_size: u16,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks (superblock count).
    pub free_blocks: u64,
    /// Blocks reserved for root.
    pub reserved_blocks: u64,
    /// Total inodes.
    pub inodes: u32,
    /// Free inodes.
    pub free_inodes: u32,
    /// Block groups.
    pub groups: u64,
    /// Blocks per group.
    pub blocks_per_group: u32,
    /// Inodes per group.
    pub inodes_per_group: u32,
    /// Feature names (compat, incompat, ro_compat together).
    pub features: Vec<String>,
    /// "clean", "not clean", "with errors".
    pub state: String,
    /// Default directory hash.
    pub hash_alg: String,
    /// Last write time (seconds).
    pub wtime: i64,
    /// Creation time (seconds).
    pub mkfs_time: i64,
    /// Whether opened read-only.
    pub read_only: bool,
    /// Warnings from opening.
    pub warnings: Vec<String>,
}

/// Summarise the superblock ([`Fs::info`](crate::Fs::info)).
pub(crate) fn info(sb: &SuperBlock) -> FsInfo {
    let s = sb.vol().sb().read();
    let mut feats = features::names(s.feature_compat, features::COMPAT_NAMES);
    feats.extend(features::names(s.feature_incompat, features::INCOMPAT_NAMES));
    feats.extend(features::names(s.feature_ro_compat, features::RO_COMPAT_NAMES));
    let u = s.uuid;
    let uuid = format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]
    );
    let state = match (s.state & STATE_VALID != 0, s.state & STATE_ERROR != 0) {
        (_, true) => "with errors",
        (true, false) => "clean",
        (false, false) => "not clean",
    }
    .to_string();
    let hash_alg = match s.def_hash_version {
        0 => "legacy",
        1 => "half_md4",
        2 => "tea",
        3 => "legacy_unsigned",
        4 => "half_md4_unsigned",
        5 => "tea_unsigned",
        6 => "siphash",
        _ => "unknown",
    }
    .to_string();
    FsInfo {
        label: s.label(),
        uuid,
        block_size: s.block_size(),
        inode_size: s.inode_size(),
        blocks: s.blocks_count(),
        free_blocks: s.free_blocks_count(),
        reserved_blocks: s.r_blocks_count(),
        inodes: s.inodes_count,
        free_inodes: s.free_inodes_count,
        groups: s.group_count(),
        blocks_per_group: s.blocks_per_group,
        inodes_per_group: s.inodes_per_group,
        features: feats,
        state,
        hash_alg,
        wtime: s.wtime(),
        mkfs_time: s.mkfs_time(),
        read_only: sb.vol().read_only(),
        warnings: sb.vol().warnings().to_vec(),
    }
}

/// Attributes of the inode `t` names ([`Fs::stat`](crate::Fs::stat)).
pub(crate) fn stat(sb: &SuperBlock, t: Target<'_>) -> Result<Stat> {
    lookup::on_inode(sb, t, |ino| stat_ino(sb, ino))
}

/// Attributes of inode `ino`.
pub(crate) fn stat_ino(sb: &SuperBlock, ino: u32) -> Result<Stat> {
    let i = sb.inode(ino)?;
    let disk = i.disk.read();
    Ok(Stat::from_inode(sb.vol(), ino, &disk))
}

/// `readlinkat(2)` (fs/stat.c): the target of the symlink `t` names ([`Fs::read_link`](crate::Fs::read_link)):
/// a path's final symlink is the one read, never followed.
pub(crate) fn read_link(sb: &SuperBlock, t: Target<'_>) -> Result<Vec<u8>> {
    let ino = match t.named() {
        Named::Path(p) => namei::resolve(sb, p, false)?.ino,
        _ => lookup::target_ino(sb, t)?,
    };
    namei::read_link_ino(sb, ino).map_err(|e| match t.path_shown() {
        Some(p) if e.errno() == Errno::EINVAL => {
            Error::posix(Errno::EINVAL, format!("{}: not a symbolic link", namei::show(p)))
        }
        _ => e,
    })
}

/// Counters the tests and benchmarks look at ([`Fs::stats`](crate::Fs::stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Directory blocks accessed by lookups and readdir.
    pub dir_block_reads: u64,
    /// Metadata blocks read from the device.
    pub metadata_misses: u64,
    /// Inode records read.
    pub inode_reads: u64,
    /// Inode records written.
    pub inode_writes: u64,
    /// Bytes of dirty file pages.
    pub dirty_page_bytes: usize,
    /// Inodes cached.
    pub cached_inodes: usize,
    /// Dentries cached.
    pub cached_dentries: usize,
    /// Bytes of file pages cached.
    pub cached_page_bytes: usize,
    /// d_path calls that fell back to the rename lock.
    pub d_path_fallbacks: u64,
}

/// The counters now.
pub(crate) fn stats(sb: &SuperBlock) -> FsStats {
    use std::sync::atomic::Ordering::Relaxed;
    let vol = sb.vol();
    FsStats {
        dir_block_reads: vol.stats().dir_block_reads(),
        metadata_misses: vol.bcache().misses.load(Relaxed),
        inode_reads: vol.stats().inode_reads(),
        inode_writes: vol.stats().inode_writes(),
        dirty_page_bytes: sb.pages().dirty_bytes(),
        cached_inodes: sb.icache().len(),
        cached_dentries: sb.dcache().len(),
        cached_page_bytes: sb.pages().used(),
        d_path_fallbacks: sb.dcache().d_path_fallbacks.load(Relaxed),
    }
}
