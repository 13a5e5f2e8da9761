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

use super::cred::Cred;
use super::lookup;
use super::namespace;
use super::rename;
use super::rename::RenameFlags;
use super::request::{NewInode, NodeKind};
use super::super_block::SuperBlock;
use super::target::Target;
use super::write;
use crate::error::{Errno, Error, Result};

/// The work of [`Fs::rename`](crate::Fs::rename) with `RENAME_WHITEOUT`.
pub(crate) fn rename_whiteout(
    sb: &SuperBlock,
    old: Target<'_>,
    new: Target<'_>,
    flags: RenameFlags,
    cred: &Cred,
) -> Result<()> {
    if flags.exchange {
        return Err(Error::posix(Errno::EINVAL, "RENAME_WHITEOUT with RENAME_EXCHANGE"));
    }
    let (old_dir, old_name) = lookup::entry(sb, old)?;
    let (new_dir, new_name) = lookup::entry(sb, new)?;
    // The source must exist before anything is made.
    if lookup::lookup_at(sb, old_dir, old_name)?.is_none() {
        return Err(Error::posix(
            Errno::ENOENT,
            format!("{}: no such file", String::from_utf8_lossy(old_name)),
        ));
    }
    let tmp = free_temp_name(sb, old_dir)?;
    write::create(
        sb,
        &NewInode::new(Target::at(old_dir, &tmp), NodeKind::CharDevice(0, 0))
            .mode(0)
            .cred(cred),
    )?;
    let moved = RenameFlags {
        whiteout: false,
        ..flags
    };
    if let Err(e) = rename::rename(
        sb,
        Target::at(old_dir, old_name),
        Target::at(new_dir, new_name),
        moved,
        cred,
    ) {
        if let Err(u) = namespace::unlink(sb, Target::at(old_dir, &tmp), &Cred::root()) {
            eprintln!(
                "ext4kit: removing the temporary whiteout {} after a failed rename: {u}",
                String::from_utf8_lossy(&tmp)
            );
        }
        return Err(lookup::annotate(e, old));
    }
    rename::rename(
        sb,
        Target::at(old_dir, &tmp),
        Target::at(old_dir, old_name),
        RenameFlags::default(),
        &Cred::root(),
    )
}

/// A name not in directory `dir` for the temporary whiteout.
fn free_temp_name(sb: &SuperBlock, dir: u32) -> Result<Vec<u8>> {
    for n in 0..1000u32 {
        let name = format!(".ext4kit-whiteout.{n}").into_bytes();
        if lookup::lookup_at(sb, dir, &name)?.is_none() {
            return Ok(name);
        }
    }
    Err(Error::posix(
        Errno::EEXIST,
        format!("directory inode {dir}: no free temporary name for a whiteout"),
    ))
}

#[cfg(test)]
mod tests {
    use crate::vfs::cred::Cred;
    use crate::FileType;
    use crate::{NewInode, RenameFlags, Target};

    #[test]
    fn whiteout_takes_the_old_name_and_failures_leave_nothing() {
        let fs = crate::vfs::mem_fs();
        let a = fs
            .write_file(&NewInode::file(b"/a").mode(0o644).owner(0, 0), b"A")
            .unwrap();
        fs.write_file(&NewInode::file(b"/b").mode(0o644).owner(0, 0), b"B")
            .unwrap();
        let root = Cred::root();
        // NOREPLACE onto an existing target: nothing changes.
        assert_eq!(
            fs.rename(
                Target::at(2, b"a"),
                Target::at(2, b"b"),
                RenameFlags {
                    noreplace: true,
                    whiteout: true,
                    ..Default::default()
                },
                &root
            )
            .unwrap_err()
            .errno(),
            crate::Errno::EEXIST
        );
        let names = |fs: &crate::Fs| {
            let mut v: Vec<_> = fs.read_dir(b"/").unwrap().into_iter().map(|e| e.name).collect();
            v.sort();
            v
        };
        assert_eq!(names(&fs), [&b"."[..], b"..", b"a", b"b", b"lost+found"]);
        fs.rename(
            Target::at(2, b"a"),
            Target::at(2, b"b"),
            RenameFlags {
                noreplace: false,
                whiteout: true,
                ..Default::default()
            },
            &root,
        )
        .unwrap();
        assert_eq!(fs.stat(b"/b").unwrap().ino, a.ino);
        let wh = fs.lstat(b"/a").unwrap();
        assert_eq!(wh.ftype, FileType::CharDevice);
        assert_eq!((wh.perm(), wh.rdev), (0, (0, 0)));
        assert_eq!(names(&fs), [&b"."[..], b"..", b"a", b"b", b"lost+found"]);
        // A missing source: ENOENT, no temporary left.
        assert_eq!(
            fs.rename(
                Target::at(2, b"zz"),
                Target::at(2, b"y"),
                RenameFlags {
                    noreplace: false,
                    whiteout: true,
                    ..Default::default()
                },
                &root
            )
            .unwrap_err()
            .errno(),
            crate::Errno::ENOENT
        );
        assert_eq!(names(&fs).len(), 5);
    }
}
