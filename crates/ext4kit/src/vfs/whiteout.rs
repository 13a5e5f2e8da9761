//! `rename(2)` with `RENAME_WHITEOUT` (overlayfs' copy-up and delete):
//! the source moves to the target and a whiteout — a character device
//! 0:0 with mode 0 (`WHITEOUT_DEV`, `WHITEOUT_MODE`), owned by the caller —
//! takes its old name (ext4's `ext4_whiteout_for_rename`).
//!
//! ext4 does it in one transaction. Here it is three engine operations,
//! ordered so that a failure leaves the tree as it was: (1) the whiteout
//! is made under a temporary name in the source directory, (2) the source
//! is renamed to the target (if that fails, the temporary is removed),
//! (3) the temporary is renamed to the source's old name, which (2) just
//! freed, so it needs no new directory space. A crash between the steps
//! can leave the temporary name (`.ext4kit-whiteout.N`, a harmless
//! 0:0 device) or, after (2), the source's name without its whiteout.
//! Through the FUSE mount the kernel holds both directories' locks for the
//! whole request, so no lookup or listing sees the intermediate states.
//!
//! Rules (`do_renameat2`, `vfs_rename`): combined with `RENAME_EXCHANGE`
//! it is EINVAL; the caller needs CAP_MKNOD, which the caller checks (the
//! kernel does, before sending the request).

use ext4kit_format::inode::FileType;

use super::cred::Cred;
use super::rename::RenameFlags;
use super::Fs;
use crate::error::{Errno, Error, Result};

impl Fs {
    /// Rename `old_name` in `old_dir` to `new_name` in `new_dir` and leave
    /// a whiteout at the old name (see the module comment). `noreplace`:
    /// EEXIST when the target exists, as `RENAME_NOREPLACE`.
    pub fn rename_whiteout(
        &self,
        old_dir: u32,
        old_name: &[u8],
        new_dir: u32,
        new_name: &[u8],
        noreplace: bool,
        cred: &Cred,
    ) -> Result<()> {
        // The source must exist before anything is made.
        if self.lookup_at(old_dir, old_name)?.is_none() {
            return Err(Error::posix(
                Errno::ENOENT,
                format!("{}: no such file", String::from_utf8_lossy(old_name)),
            ));
        }
        let tmp = self.free_temp_name(old_dir)?;
        self.mknod_at(old_dir, &tmp, FileType::CharDevice, 0, (0, 0), cred)?;
        let flags = RenameFlags {
            noreplace,
            exchange: false,
        };
        if let Err(e) = self.rename_at(old_dir, old_name, new_dir, new_name, flags, cred) {
            if let Err(u) = self.unlink_at(old_dir, &tmp, &Cred::root()) {
                eprintln!(
                    "ext4kit: removing the temporary whiteout {} after a failed rename: {u}",
                    String::from_utf8_lossy(&tmp)
                );
            }
            return Err(e);
        }
        self.rename_at(old_dir, &tmp, old_dir, old_name, RenameFlags::default(), &Cred::root())
    }

    /// A name not in directory `dir` for the temporary whiteout.
    fn free_temp_name(&self, dir: u32) -> Result<Vec<u8>> {
        for n in 0..1000u32 {
            let name = format!(".ext4kit-whiteout.{n}").into_bytes();
            if self.lookup_at(dir, &name)?.is_none() {
                return Ok(name);
            }
        }
        Err(Error::posix(
            Errno::EEXIST,
            format!("directory inode {dir}: no free temporary name for a whiteout"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::vfs::cred::Cred;
    use crate::FileType;

    #[test]
    fn whiteout_takes_the_old_name_and_failures_leave_nothing() {
        let fs = crate::vfs::mem_fs();
        let a = fs.write_file(b"/a", b"A", 0o644, 0, 0).unwrap();
        fs.write_file(b"/b", b"B", 0o644, 0, 0).unwrap();
        let root = Cred::root();
        // NOREPLACE onto an existing target: nothing changes.
        assert_eq!(
            fs.rename_whiteout(2, b"a", 2, b"b", true, &root).unwrap_err().errno(),
            crate::Errno::EEXIST
        );
        let names = |fs: &crate::Fs| {
            let mut v: Vec<_> = fs.read_dir(b"/").unwrap().into_iter().map(|e| e.name).collect();
            v.sort();
            v
        };
        assert_eq!(names(&fs), [&b"."[..], b"..", b"a", b"b", b"lost+found"]);
        fs.rename_whiteout(2, b"a", 2, b"b", false, &root).unwrap();
        assert_eq!(fs.stat(b"/b").unwrap().ino, a.ino);
        let wh = fs.lstat(b"/a").unwrap();
        assert_eq!(wh.ftype, FileType::CharDevice);
        assert_eq!((wh.perm(), wh.rdev), (0, (0, 0)));
        assert_eq!(names(&fs), [&b"."[..], b"..", b"a", b"b", b"lost+found"]);
        // A missing source: ENOENT, no temporary left.
        assert_eq!(
            fs.rename_whiteout(2, b"zz", 2, b"y", false, &root).unwrap_err().errno(),
            crate::Errno::ENOENT
        );
        assert_eq!(names(&fs).len(), 5);
    }
}
