//! `Stat` (the engine's view of an inode) to `FileAttr` (the kernel's).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ext4kit::{FileType as Ft, Stat, Timestamp};
use fuser::{FileAttr, FileType};

use crate::nodes::to_fuse;

/// Kernel file type of an ext4 file type.
pub fn kind(t: Ft) -> FileType {
    match t {
        Ft::Regular => FileType::RegularFile,
        Ft::Directory => FileType::Directory,
        Ft::Symlink => FileType::Symlink,
        Ft::CharDevice => FileType::CharDevice,
        Ft::BlockDevice => FileType::BlockDevice,
        Ft::Fifo => FileType::NamedPipe,
        Ft::Socket => FileType::Socket,
    }
}

/// An ext4 timestamp (seconds may be negative: before 1970) as SystemTime.
pub fn time(t: Timestamp) -> SystemTime {
    let ns = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec as u64) + ns
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + ns
    }
}

/// The kernel's `new_encode_dev`: what FUSE's 32-bit `rdev` carries and
/// `stat` decodes with `new_decode_dev` (12-bit major, 20-bit minor).
pub fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The kernel's attributes for an inode; `blksize` is the filesystem block
/// size (the unit `st_blksize` advertises for efficient I/O).
pub fn file_attr(st: &Stat, blksize: u32) -> FileAttr {
    FileAttr {
        ino: to_fuse(st.ino),
        size: st.size,
        blocks: st.blocks,
        atime: time(st.atime),
        mtime: time(st.mtime),
        ctime: time(st.ctime),
        crtime: time(st.crtime),
        kind: kind(st.ftype),
        perm: st.perm(),
        nlink: u32::from(st.nlink),
        uid: st.uid,
        gid: st.gid,
        rdev: encode_dev(st.rdev.0, st.rdev.1),
        blksize,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_1970_keep_nanoseconds() {
        let t = time(Timestamp { sec: -2, nsec: 500 });
        assert_eq!(UNIX_EPOCH.duration_since(t).unwrap(), Duration::new(1, 999_999_500));
        let t = time(Timestamp {
            sec: 3_000_000_000,
            nsec: 7,
        });
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap(), Duration::new(3_000_000_000, 7));
    }

    #[test]
    fn statx_attributes_are_ext4_getattrs() {
        use ext4kit::vfs::iflags::flags as fl;
        use ext4kit::vfs::statx_attributes;
        // The uapi values (include/uapi/linux/stat.h, as libc has them):
        // the code relies on their being the EXT4_*_FL bits.
        const STATX_ATTR_COMPRESSED: u64 = libc::STATX_ATTR_COMPRESSED as u64;
        const STATX_ATTR_IMMUTABLE: u64 = libc::STATX_ATTR_IMMUTABLE as u64;
        const STATX_ATTR_APPEND: u64 = libc::STATX_ATTR_APPEND as u64;
        const STATX_ATTR_NODUMP: u64 = libc::STATX_ATTR_NODUMP as u64;
        const STATX_ATTR_ENCRYPTED: u64 = libc::STATX_ATTR_ENCRYPTED as u64;
        const STATX_ATTR_VERITY: u64 = libc::STATX_ATTR_VERITY as u64;
        let mask = STATX_ATTR_COMPRESSED
            | STATX_ATTR_IMMUTABLE
            | STATX_ATTR_APPEND
            | STATX_ATTR_NODUMP
            | STATX_ATTR_ENCRYPTED
            | STATX_ATTR_VERITY;
        assert_eq!(statx_attributes(0), (0, mask));
        assert_eq!(
            statx_attributes(fl::IMMUTABLE | fl::EXTENTS),
            (STATX_ATTR_IMMUTABLE, mask)
        );
        assert_eq!(
            statx_attributes(fl::APPEND | fl::NODUMP | fl::NOATIME | fl::SYNC),
            (STATX_ATTR_APPEND | STATX_ATTR_NODUMP, mask)
        );
        assert_eq!(
            statx_attributes(fl::ENCRYPT | fl::VERITY | fl::COMPR),
            (STATX_ATTR_ENCRYPTED | STATX_ATTR_VERITY | STATX_ATTR_COMPRESSED, mask)
        );
    }

    #[test]
    fn devices_encode_like_the_kernel() {
        assert_eq!(encode_dev(8, 1), 0x801);
        // Large minors spill above the major (new_encode_dev).
        assert_eq!(encode_dev(1, 0x12345), 0x45 | (1 << 8) | (0x12300 << 12));
        assert_eq!(libc::major(u64::from(encode_dev(259, 7))), 259);
        assert_eq!(libc::minor(u64::from(encode_dev(259, 70000))), 70000);
    }
}
