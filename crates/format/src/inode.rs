//! Inodes: the 128-byte base record, the extra fields that follow it in large
//! inodes (`i_extra_isize` says how many are present), and whatever lies
//! beyond (in-inode extended attributes), kept verbatim.
//!
//! Timestamps: the 32-bit seconds field is signed (pre-1970 times are
//! negative); in large inodes the `_extra` word adds two epoch bits (extending
//! the range past 2038 to 2446) and 30 bits of nanoseconds.

use crate::checksum::{crc32c, inode_csum_seed};
use crate::error::{corrupt, FormatError, Result};

/// Size of the original (revision 0) inode.
pub const GOOD_OLD_INODE_SIZE: usize = 128;

/// `i_mode` file-type mask and values.
#[allow(missing_docs)]
pub mod mode {
    pub const S_IFMT: u16 = 0o170000;
    pub const S_IFSOCK: u16 = 0o140000;
    pub const S_IFLNK: u16 = 0o120000;
    pub const S_IFREG: u16 = 0o100000;
    pub const S_IFBLK: u16 = 0o060000;
    pub const S_IFDIR: u16 = 0o040000;
    pub const S_IFCHR: u16 = 0o020000;
    pub const S_IFIFO: u16 = 0o010000;
}

/// `i_flags` bits the engine interprets.
#[allow(missing_docs)]
pub mod flags {
    pub const SECRM: u32 = 0x1;
    pub const UNRM: u32 = 0x2;
    pub const COMPR: u32 = 0x4;
    pub const SYNC: u32 = 0x8;
    pub const IMMUTABLE: u32 = 0x10;
    pub const APPEND: u32 = 0x20;
    pub const NODUMP: u32 = 0x40;
    pub const NOATIME: u32 = 0x80;
    pub const ENCRYPT: u32 = 0x800;
    pub const INDEX: u32 = 0x1000;
    pub const IMAGIC: u32 = 0x2000;
    pub const JOURNAL_DATA: u32 = 0x4000;
    pub const NOTAIL: u32 = 0x8000;
    pub const DIRSYNC: u32 = 0x10000;
    pub const TOPDIR: u32 = 0x20000;
    pub const HUGE_FILE: u32 = 0x40000;
    pub const EXTENTS: u32 = 0x80000;
    pub const VERITY: u32 = 0x100000;
    pub const EA_INODE: u32 = 0x200000;
    pub const INLINE_DATA: u32 = 0x10000000;
    pub const PROJINHERIT: u32 = 0x20000000;
    pub const CASEFOLD: u32 = 0x40000000;
}

/// The kind of object an inode is, from the `S_IFMT` bits of `i_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
}

impl FileType {
    /// Decode from `i_mode`; `None` for an invalid type.
    pub fn from_mode(m: u16) -> Option<Self> {
        Some(match m & mode::S_IFMT {
            mode::S_IFREG => Self::Regular,
            mode::S_IFDIR => Self::Directory,
            mode::S_IFLNK => Self::Symlink,
            mode::S_IFCHR => Self::CharDevice,
            mode::S_IFBLK => Self::BlockDevice,
            mode::S_IFIFO => Self::Fifo,
            mode::S_IFSOCK => Self::Socket,
            _ => return None,
        })
    }

    /// Decode a directory entry's `file_type` byte.
    pub fn from_dirent(t: u8) -> Option<Self> {
        Some(match t {
            1 => Self::Regular,
            2 => Self::Directory,
            3 => Self::CharDevice,
            4 => Self::BlockDevice,
            5 => Self::Fifo,
            6 => Self::Socket,
            7 => Self::Symlink,
            _ => return None,
        })
    }

    /// The directory entry `file_type` byte for this type.
    pub fn to_dirent(self) -> u8 {
        match self {
            Self::Regular => 1,
            Self::Directory => 2,
            Self::CharDevice => 3,
            Self::BlockDevice => 4,
            Self::Fifo => 5,
            Self::Socket => 6,
            Self::Symlink => 7,
        }
    }

    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u16 {
        match self {
            Self::Regular => mode::S_IFREG,
            Self::Directory => mode::S_IFDIR,
            Self::Symlink => mode::S_IFLNK,
            Self::CharDevice => mode::S_IFCHR,
            Self::BlockDevice => mode::S_IFBLK,
            Self::Fifo => mode::S_IFIFO,
            Self::Socket => mode::S_IFSOCK,
        }
    }
}

crate::layout! {
    /// The first 128 bytes of `struct ext4_inode` (Linux `osd1`/`osd2`).
    pub struct InodeBase (128) {
        mode: u16 = 0x0,
        uid: u16 = 0x2,
        size_lo: u32 = 0x4,
        atime: u32 = 0x8,
        ctime: u32 = 0xC,
        mtime: u32 = 0x10,
        dtime: u32 = 0x14,
        gid: u16 = 0x18,
        links_count: u16 = 0x1A,
        blocks_lo: u32 = 0x1C,
        flags: u32 = 0x20,
        version: u32 = 0x24,
        block: [u8; 60] = 0x28,
        generation: u32 = 0x64,
        file_acl_lo: u32 = 0x68,
        size_high: u32 = 0x6C,
        obso_faddr: u32 = 0x70,
        blocks_high: u16 = 0x74,
        file_acl_high: u16 = 0x76,
        uid_high: u16 = 0x78,
        gid_high: u16 = 0x7A,
        checksum_lo: u16 = 0x7C,
        reserved: u16 = 0x7E,
    }
    split {
        /// File size in bytes (`i_size_high` is used for every type; it was
        /// `i_dir_acl` on very old revisions but is zero there).
        size / set_size: u64 = size_lo + size_high,
        /// `i_blocks` as stored: 512-byte sectors, or filesystem blocks when
        /// the inode has the HUGE_FILE flag; `i_blocks_high` counts only
        /// with the `huge_file` feature (see [`Inode::blocks_512`]).
        blocks / set_blocks: u64 = blocks_lo + blocks_high,
        /// Block of the external xattr block (0 if none).
        file_acl / set_file_acl: u64 = file_acl_lo + file_acl_high,
        /// Owner uid (32-bit: `i_uid` and `l_i_uid_high`).
        uid / set_uid: u32 = uid + uid_high,
        /// Owner gid (32-bit: `i_gid` and `l_i_gid_high`).
        gid / set_gid: u32 = gid + gid_high,
    }
}

crate::layout! {
    /// The fields after byte 128 in large inodes. Only the first
    /// `i_extra_isize` bytes are meaningful; see [`Inode::has_extra`].
    pub struct InodeExtra (32) {
        extra_isize: u16 = 0x0,
        checksum_hi: u16 = 0x2,
        ctime_extra: u32 = 0x4,
        mtime_extra: u32 = 0x8,
        atime_extra: u32 = 0xC,
        crtime: u32 = 0x10,
        crtime_extra: u32 = 0x14,
        version_hi: u32 = 0x18,
        projid: u32 = 0x1C,
    }
}

/// A timestamp with nanoseconds, as stored by ext4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    /// Seconds since the epoch (may be negative).
    pub sec: i64,
    /// Nanoseconds (0..1e9).
    pub nsec: u32,
}

impl Timestamp {
    /// Decode `(seconds, extra)`; `extra` is `None` on small inodes.
    pub fn decode(lo: u32, extra: Option<u32>) -> Self {
        let mut sec = lo as i32 as i64;
        let mut nsec = 0;
        if let Some(x) = extra {
            sec += ((x & 3) as i64) << 32;
            nsec = (x >> 2).min(999_999_999);
        }
        Timestamp { sec, nsec }
    }

    /// Encode into `(seconds, extra)`.
    pub fn encode(self) -> (u32, u32) {
        let lo = self.sec as u32;
        let epoch = ((self.sec - (lo as i32 as i64)) >> 32) as u32 & 3;
        (lo, (self.nsec << 2) | epoch)
    }
}

/// Which timestamp of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeField {
    /// Last access.
    Atime,
    /// Last data change.
    Mtime,
    /// Last inode change.
    Ctime,
    /// Creation (large inodes only).
    Crtime,
}

/// Bytes 128.. of an inode record, inline up to 128 (the whole tail of
/// mke2fs's default 256-byte inodes): a new inode's record and the copy of
/// its directory's record that a create changes then allocate nothing.
pub type InodeTail = smallvec::SmallVec<[u8; 128]>;

/// A whole on-disk inode: base, extra fields and the rest of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// The first 128 bytes.
    pub base: InodeBase,
    /// Extra fields (zeros beyond what the record holds).
    pub extra: InodeExtra,
    /// Bytes 128.. of the record, verbatim (extra fields and in-inode
    /// xattrs); empty for 128-byte inodes.
    pub tail: InodeTail,
}

/// Offset of the in-inode extended attribute area magic, relative to the
/// start of the inode: `128 + i_extra_isize`.
pub fn in_inode_xattr_offset(extra_isize: u16) -> usize {
    GOOD_OLD_INODE_SIZE + extra_isize as usize
}

impl Inode {
    /// Decode a record of `buf.len()` bytes (the filesystem inode size) with
    /// no checksum check; validates that `i_extra_isize` fits.
    pub fn parse_raw(buf: &[u8]) -> Result<Self> {
        if buf.len() < GOOD_OLD_INODE_SIZE {
            return Err(corrupt("inode", format!("record of {} bytes", buf.len())));
        }
        let base = InodeBase::parse_raw(buf);
        let tail = InodeTail::from_slice(&buf[GOOD_OLD_INODE_SIZE..]);
        let mut ex = [0u8; InodeExtra::SIZE];
        let n = tail.len().min(InodeExtra::SIZE);
        ex[..n].copy_from_slice(&tail[..n]);
        let extra = InodeExtra::parse_raw(&ex);
        let ino = Inode { base, extra, tail };
        if !ino.tail.is_empty() {
            let e = ino.extra.extra_isize as usize;
            if !e.is_multiple_of(4) || GOOD_OLD_INODE_SIZE + e > buf.len() {
                return Err(corrupt(
                    "inode",
                    format!("i_extra_isize {e} does not fit a {}-byte inode", buf.len()),
                ));
            }
        }
        Ok(ino)
    }

    /// Decode and verify the checksum (`metadata_csum` images).
    /// `fs_seed` is `None` when the filesystem has no metadata checksums.
    pub fn parse(buf: &[u8], ino: u32, fs_seed: Option<u32>) -> Result<Self> {
        let inode = Self::parse_raw(buf)?;
        if let Some(seed) = fs_seed {
            if buf.iter().all(|&b| b == 0) {
                return Ok(inode); // never-used record: e2fsprogs accepts it
            }
            let computed = Self::compute_checksum(buf, ino, inode.base.generation, seed, inode.has_checksum_hi());
            let stored = inode.stored_checksum();
            let (c, s) = if inode.has_checksum_hi() {
                (computed, stored)
            } else {
                (computed & 0xffff, stored & 0xffff)
            };
            if c != s {
                return Err(FormatError::Checksum {
                    structure: "inode",
                    stored: s,
                    computed: c,
                });
            }
        }
        Ok(inode)
    }

    /// The kernel's `ext4_inode_csum` over a raw record.
    pub fn compute_checksum(buf: &[u8], ino: u32, generation: u32, fs_seed: u32, has_hi: bool) -> u32 {
        let seed = inode_csum_seed(fs_seed, ino, generation);
        let mut c = crc32c(seed, &buf[..0x7C]);
        c = crc32c(c, &[0, 0]);
        c = crc32c(c, &buf[0x7E..GOOD_OLD_INODE_SIZE]);
        if buf.len() > GOOD_OLD_INODE_SIZE {
            c = crc32c(c, &buf[GOOD_OLD_INODE_SIZE..0x82.min(buf.len())]);
            let mut off = 0x82;
            if has_hi {
                c = crc32c(c, &[0, 0]);
                off += 2;
            }
            if off < buf.len() {
                c = crc32c(c, &buf[off..]);
            }
        }
        c
    }

    fn stored_checksum(&self) -> u32 {
        let hi = if self.has_checksum_hi() {
            self.extra.checksum_hi as u32
        } else {
            0
        };
        hi << 16 | self.base.checksum_lo as u32
    }

    /// Whether `i_checksum_hi` is present (`i_extra_isize >= 4`).
    pub fn has_checksum_hi(&self) -> bool {
        self.has_extra(0x4)
    }

    /// Whether the extra field ending at byte `end` (relative to 128) is
    /// within `i_extra_isize`.
    pub fn has_extra(&self, end: usize) -> bool {
        !self.tail.is_empty() && self.extra.extra_isize as usize >= end
    }

    /// Serialise to a record of `self.tail.len() + 128` bytes; with
    /// `csum = Some((ino, fs_seed))` the checksum fields are refreshed.
    pub fn to_bytes(&self, csum: Option<(u32, u32)>) -> Vec<u8> {
        let mut v = vec![0u8; self.record_len()];
        self.write_into(&mut v, csum);
        v
    }

    /// Bytes of the serialised record (`128 + tail`).
    pub fn record_len(&self) -> usize {
        GOOD_OLD_INODE_SIZE + self.tail.len()
    }

    /// [`Self::to_bytes`] into `out` (exactly [`Self::record_len`] bytes,
    /// else a panic): a writer encodes straight into the inode-table block,
    /// with no record-sized buffer allocated per inode written (three
    /// allocations of a create went to that).
    pub fn write_into(&self, out: &mut [u8], csum: Option<(u32, u32)>) {
        assert_eq!(out.len(), self.record_len(), "inode record size");
        // The base layout covers all of its 128 bytes, the tail the rest.
        self.base.serialize_into(out);
        out[GOOD_OLD_INODE_SIZE..].copy_from_slice(&self.tail);
        let mut ex = [0u8; InodeExtra::SIZE];
        self.extra.serialize_into(&mut ex);
        let n = self.tail.len().min(InodeExtra::SIZE);
        out[GOOD_OLD_INODE_SIZE..GOOD_OLD_INODE_SIZE + n].copy_from_slice(&ex[..n]);
        if let Some((ino, seed)) = csum {
            let has_hi = self.has_checksum_hi();
            let c = Self::compute_checksum(out, ino, self.base.generation, seed, has_hi);
            out[0x7C..0x7E].copy_from_slice(&(c as u16).to_le_bytes());
            if has_hi {
                out[0x82..0x84].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
            }
        }
    }

    /// File type from `i_mode`.
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.base.mode)
    }

    /// Permission bits (including setuid/setgid/sticky).
    pub fn perm(&self) -> u16 {
        self.base.mode & 0o7777
    }

    /// File size in bytes ([`InodeBase::size`]).
    pub fn size(&self) -> u64 {
        self.base.size()
    }

    /// Owner uid, 32-bit ([`InodeBase::uid`]).
    pub fn uid(&self) -> u32 {
        self.base.uid()
    }

    /// Owner gid, 32-bit ([`InodeBase::gid`]).
    pub fn gid(&self) -> u32 {
        self.base.gid()
    }

    /// Block of the external xattr block, 0 if none ([`InodeBase::file_acl`]).
    pub fn file_acl(&self) -> u64 {
        self.base.file_acl()
    }

    /// Space used, in 512-byte sectors. `huge_file` enables the high word and
    /// the per-inode HUGE_FILE flag switches the unit to filesystem blocks.
    pub fn blocks_512(&self, huge_file_feature: bool, block_size: u32) -> u64 {
        if !huge_file_feature {
            return self.base.blocks_lo as u64;
        }
        let n = self.base.blocks();
        if self.base.flags & flags::HUGE_FILE != 0 {
            n * (block_size as u64 / 512)
        } else {
            n
        }
    }

    /// One of the four timestamps, with nanoseconds where the record has them.
    pub fn time(&self, which: TimeField) -> Timestamp {
        let (lo, extra, end) = match which {
            TimeField::Atime => (self.base.atime, self.extra.atime_extra, 0x10),
            TimeField::Mtime => (self.base.mtime, self.extra.mtime_extra, 0xC),
            TimeField::Ctime => (self.base.ctime, self.extra.ctime_extra, 0x8),
            TimeField::Crtime => {
                if !self.has_extra(0x14) {
                    return Timestamp::default();
                }
                (self.extra.crtime, self.extra.crtime_extra, 0x18)
            }
        };
        Timestamp::decode(lo, self.has_extra(end).then_some(extra))
    }

    /// Set one of the timestamps (nanoseconds kept only if the record has room).
    pub fn set_time(&mut self, which: TimeField, t: Timestamp) {
        let (lo, extra) = t.encode();
        match which {
            TimeField::Atime => {
                self.base.atime = lo;
                if self.has_extra(0x10) {
                    self.extra.atime_extra = extra;
                }
            }
            TimeField::Mtime => {
                self.base.mtime = lo;
                if self.has_extra(0xC) {
                    self.extra.mtime_extra = extra;
                }
            }
            TimeField::Ctime => {
                self.base.ctime = lo;
                if self.has_extra(0x8) {
                    self.extra.ctime_extra = extra;
                }
            }
            TimeField::Crtime => {
                if self.has_extra(0x18) {
                    self.extra.crtime = lo;
                    self.extra.crtime_extra = extra;
                }
            }
        }
    }

    /// Whether the block map is an extent tree.
    pub fn uses_extents(&self) -> bool {
        self.base.flags & flags::EXTENTS != 0
    }

    /// Whether the data lives in `i_block` (and `system.data`).
    pub fn has_inline_data(&self) -> bool {
        self.base.flags & flags::INLINE_DATA != 0
    }

    /// The in-inode xattr area (`128 + i_extra_isize` .. end), if any.
    pub fn in_inode_xattr_area(&self) -> &[u8] {
        let start = self.extra.extra_isize as usize;
        if self.tail.is_empty() || start >= self.tail.len() {
            &[]
        } else {
            &self.tail[start..]
        }
    }

    /// Device number of a character/block device inode: old 16-bit encoding
    /// in `i_block[0]`, new 32-bit encoding in `i_block[1]`.
    pub fn device(&self) -> (u32, u32) {
        let b0 = u32::from_le_bytes(self.base.block[0..4].try_into().unwrap_or([0; 4]));
        let b1 = u32::from_le_bytes(self.base.block[4..8].try_into().unwrap_or([0; 4]));
        if b0 != 0 {
            ((b0 >> 8) & 0xff, b0 & 0xff)
        } else {
            ((b1 & 0xfff00) >> 8, (b1 & 0xff) | ((b1 >> 12) & 0xfff00))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layouts_are_complete() {
        InodeBase::layout_covers_every_byte();
        InodeExtra::layout_covers_every_byte();
    }

    proptest! {
        #[test]
        fn roundtrip_is_bit_exact(size in prop::sample::select(vec![128usize, 256, 512, 1024]), seed in any::<u64>()) {
            let mut bytes = vec![0u8; size];
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
            rand::RngCore::fill_bytes(&mut rng, &mut bytes);
            if size > 128 {
                let e = ((rand::RngCore::next_u64(&mut rng) % ((size as u64 - 128) / 4 + 1)) * 4) as u16;
                bytes[128..130].copy_from_slice(&e.to_le_bytes());
            }
            let ino = Inode::parse_raw(&bytes).unwrap();
            prop_assert_eq!(ino.to_bytes(None), bytes.clone());
            // Encoded in place over old bytes (an inode-table block): every
            // byte of the record is rewritten, none beside it.
            let mut block = vec![0xAAu8; size + 8];
            ino.write_into(&mut block[4..4 + size], Some((12, 0xdead_beef)));
            // The record read, with only its checksum fields refreshed.
            let mut expect = bytes.clone();
            let has_hi = ino.has_checksum_hi();
            let c = Inode::compute_checksum(&expect, 12, ino.base.generation, 0xdead_beef, has_hi);
            expect[0x7C..0x7E].copy_from_slice(&(c as u16).to_le_bytes());
            if has_hi {
                expect[0x82..0x84].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
            }
            prop_assert_eq!(&block[4..4 + size], &expect[..]);
            prop_assert!(Inode::parse(&block[4..4 + size], 12, Some(0xdead_beef)).is_ok());
            prop_assert!(block[..4].iter().chain(&block[4 + size..]).all(|&b| b == 0xAA));
        }

        #[test]
        fn timestamps_roundtrip(sec in -(1i64 << 31)..(1i64 << 34) - (1 << 31), nsec in 0u32..1_000_000_000) {
            let t = Timestamp { sec, nsec };
            let (lo, ex) = t.encode();
            prop_assert_eq!(Timestamp::decode(lo, Some(ex)), t);
        }
    }

    #[test]
    fn checksum_roundtrip_and_detects_flips() {
        let mut bytes = vec![0u8; 256];
        bytes[0] = 0xA4;
        bytes[1] = 0x81;
        bytes[128] = 32;
        let ino = Inode::parse_raw(&bytes).unwrap();
        let out = ino.to_bytes(Some((12, 0xdead_beef)));
        assert!(Inode::parse(&out, 12, Some(0xdead_beef)).is_ok());
        assert!(Inode::parse(&out, 13, Some(0xdead_beef)).is_err());
        let mut bad = out.clone();
        bad[200] ^= 4;
        assert!(Inode::parse(&bad, 12, Some(0xdead_beef)).is_err());
    }

    #[test]
    fn pre_1970_and_post_2038() {
        assert_eq!(Timestamp::decode(0xffff_ffff, None).sec, -1);
        let t = Timestamp {
            sec: 3_000_000_000,
            nsec: 5,
        };
        let (lo, ex) = t.encode();
        assert_eq!(Timestamp::decode(lo, Some(ex)), t);
    }
}
