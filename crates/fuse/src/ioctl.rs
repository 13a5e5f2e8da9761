//! The ioctls ext4 answers that make sense through FUSE: inode flags
//! (`lsattr`/`chattr`) and the filesystem label.
//!
//! The kernel turns `FS_IOC_GETFLAGS`/`SETFLAGS` and
//! `FS_IOC_FSGETXATTR`/`FSSETXATTR` into its `fileattr` operations and
//! sends them to us as "restricted" FUSE ioctls (`fuse_fileattr_get` /
//! `fuse_fileattr_set`, 4-byte flags or a 28-byte `struct fsxattr`),
//! after its own checks (`vfs_fileattr_set`: owner, CAP_LINUX_IMMUTABLE
//! for append-only and immutable). Other commands arrive as the caller
//! issued them (`fuse_do_ioctl`, sizes from the command's encoding):
//! `FS_IOC_GETFSLABEL`/`SETFSLABEL` here. The engine applies ext4's rules
//! ([`ext4kit::vfs::iflags`], [`ext4kit::vfs::fslabel`]) and enforces the
//! flags: FUSE inodes carry no S_IMMUTABLE/S_APPEND, so the kernel in
//! front of us does not.
//!
//! Anything else is ENOTTY, never ENOSYS: ENOSYS would make the kernel
//! stop sending ioctls for the rest of the mount (`fc->no_ioctl`).

use ext4kit::vfs::cred::Cred;
use ext4kit::vfs::fslabel;
use ext4kit::vfs::iflags::FsXattr;
use ext4kit::Fs;
use fuser::Errno;

use crate::errno::res;

/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`) and its 32-bit form.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC32_GETFLAGS`.
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
/// `FS_IOC_SETFLAGS` (`_IOW('f', 2, long)`).
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC32_SETFLAGS`.
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR` (`_IOR('X', 31, struct fsxattr)`).
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR` (`_IOW('X', 32, struct fsxattr)`).
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `FS_IOC_GETFSLABEL` (`_IOR(0x94, 49, char[FSLABEL_MAX])`).
pub const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
/// `FS_IOC_SETFSLABEL` (`_IOW(0x94, 50, char[FSLABEL_MAX])`).
pub const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;

/// What an ioctl answers: bytes for the caller's buffer.
pub type IoctlOut = Vec<u8>;

/// Run ioctl `cmd` on ext4 inode `ino` for `cred` (`uid` 0 stands for the
/// capabilities the commands need); `input` is what the caller passed.
/// Every rule (who may, what a read-only filesystem refuses, which values
/// ext4 takes) is the engine's.
pub fn ioctl(fs: &Fs, ino: u32, cmd: u32, input: &[u8], cred: &Cred) -> Result<IoctlOut, Errno> {
    match cmd {
        FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => Ok(res(fs.get_flags_ino(ino))?.to_le_bytes().to_vec()),
        FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
            let flags = input.get(..4).ok_or(Errno::EINVAL)?;
            res(fs.set_flags_ino(ino, u32::from_le_bytes([flags[0], flags[1], flags[2], flags[3]]), cred))?;
            Ok(Vec::new())
        }
        FS_IOC_FSGETXATTR => Ok(res(fs.get_xattr_flags_ino(ino))?.to_bytes().to_vec()),
        FS_IOC_FSSETXATTR => {
            let fa = FsXattr::parse(input).ok_or(Errno::EINVAL)?;
            res(fs.set_xflags_ino(ino, &fa, cred))?;
            Ok(Vec::new())
        }
        FS_IOC_GETFSLABEL => {
            // ext4_ioctl_getlabel copies EXT4_LABEL_MAX + 1 bytes.
            let mut out = fs.fs_label();
            out.resize(fslabel::LABEL_MAX + 1, 0);
            Ok(out)
        }
        FS_IOC_SETFSLABEL => {
            let n = input.len().min(fslabel::LABEL_MAX + 1);
            res(fs.set_fs_label(&input[..n], cred))?;
            Ok(Vec::new())
        }
        _ => Err(Errno::ENOTTY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_IOC(dir, type, nr, size)` as the kernel encodes it.
    fn ioc(dir: u32, ty: u8, nr: u8, size: u32) -> u32 {
        (dir << 30) | (size << 16) | (u32::from(ty) << 8) | u32::from(nr)
    }

    #[test]
    fn command_numbers_are_the_kernels() {
        const R: u32 = 2;
        const W: u32 = 1;
        assert_eq!(FS_IOC_GETFLAGS, ioc(R, b'f', 1, 8));
        assert_eq!(FS_IOC32_GETFLAGS, ioc(R, b'f', 1, 4));
        assert_eq!(FS_IOC_SETFLAGS, ioc(W, b'f', 2, 8));
        assert_eq!(FS_IOC_FSGETXATTR, ioc(R, b'X', 31, 28));
        assert_eq!(FS_IOC_FSSETXATTR, ioc(W, b'X', 32, 28));
        assert_eq!(FS_IOC_GETFSLABEL, ioc(R, 0x94, 49, 256));
        assert_eq!(FS_IOC_SETFSLABEL, ioc(W, 0x94, 50, 256));
    }
}
