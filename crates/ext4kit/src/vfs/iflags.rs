//! Inode flags (`chattr`/`lsattr`: `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS`,
//! and the `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR` view of them), and the
//! namespace rules of immutable and append-only inodes.
//!
//! Reading returns `i_flags & EXT4_FL_USER_VISIBLE` (`ext4_fileattr_get`).
//! Setting follows `vfs_fileattr_set` → `ext4_fileattr_set` →
//! `ext4_ioctl_setflags`:
//! * only the owner or root (`inode_owner_or_capable`: EPERM);
//! * changing append-only or immutable needs CAP_LINUX_IMMUTABLE (root;
//!   `fileattr_set_prepare`: EPERM); changing data journaling needs
//!   CAP_SYS_RESOURCE (EPERM);
//! * bits outside `EXT4_FL_USER_VISIBLE`: EOPNOTSUPP; visible bits that
//!   cannot be set are silently dropped (chattr passes back what it read);
//! * flags that do not apply to the file type (`ext4_mask_flags`: dirsync,
//!   topdir, casefold and project inheritance only on directories; only
//!   nodump and noatime on symlinks and special files): EOPNOTSUPP;
//! * an immutable inode that stays immutable may not change any other
//!   flag (`ext4_ioctl_check_immutable`: EPERM);
//! * the extent flag of an empty regular file switches its (empty) block
//!   map between an extent header and a block-map array, as
//!   `ext4_ind_migrate` / `ext4_ext_migrate` do for it; converting a file
//!   with data is not supported (EOPNOTSUPP; the kernel converts small
//!   ones), nor are per-file data journaling
//!   (`ext4_change_inode_journal_flag`) and case folding (needs the
//!   casefold feature, which we do not write): EOPNOTSUPP;
//! * ctime becomes now.
//!
//! Enforcement lives where the operations are: writes and opens refuse
//! immutable inodes and non-appending writes to append-only ones (io.rs,
//! open.rs), setattr and xattrs refuse both (attr.rs, xattr_ops.rs); the
//! namespace rules are here ([`check_create_in`], [`check_delete`],
//! [`check_link`]), called by namespace.rs: the kernel's `may_create`
//! (`inode_permission(dir, MAY_WRITE)`: EPERM on an immutable directory),
//! `may_delete` (EPERM from an append-only directory, and for an
//! immutable or append-only victim) and `vfs_link` (EPERM for an
//! immutable or append-only source).
//!
//! Locking: the inode's write lock is held from the checks to publishing
//! the new record.

use ext4kit_format::features::incompat;
use ext4kit_format::inode::{flags as fl, FileType, Inode, TimeField};

use super::cred::Cred;
use super::{Fs, Stat};
use crate::error::{Errno, Error, Result};
use crate::ext4::inode;

/// The `EXT4_*_FL` bits themselves (the values `FS_IOC_GETFLAGS` and
/// `FS_IOC_SETFLAGS` use).
pub use ext4kit_format::inode::flags;

/// `EXT4_FL_USER_VISIBLE`: the flags `FS_IOC_GETFLAGS` shows.
pub const USER_VISIBLE: u32 = 0x725B_DFFF;
/// `EXT4_FL_USER_MODIFIABLE`: the flags `FS_IOC_SETFLAGS` may change.
pub const USER_MODIFIABLE: u32 = 0x624B_C0FF;
/// `EXT4_DAX_FL`.
const DAX: u32 = 0x0200_0000;
/// Flags only directories take (`EXT4_REG_FLMASK`'s complement).
const DIR_ONLY: u32 = fl::DIRSYNC | fl::TOPDIR | fl::CASEFOLD | fl::PROJINHERIT;
/// The flags symlinks and special files take (`EXT4_OTHER_FLMASK`).
const OTHER_MASK: u32 = fl::NODUMP | fl::NOATIME;
/// Flags whose change needs work this engine does not do (the extent
/// flag of an empty file is the exception: [`relayout_empty`]).
const UNSUPPORTED_CHANGES: u32 = fl::JOURNAL_DATA | fl::CASEFOLD;

/// `FS_XFLAG_*` ↔ ext4 flag pairs (`ext4_iflags_to_xflags`); the flags
/// `FS_IOC_FSSETXATTR` can change (`FS_COMMON_FL`).
const XFLAGS: [(u32, u32); 7] = [
    (0x20, fl::SYNC),
    (0x8, fl::IMMUTABLE),
    (0x10, fl::APPEND),
    (0x80, fl::NODUMP),
    (0x40, fl::NOATIME),
    (0x200, fl::PROJINHERIT),
    (0x8000, DAX),
];

/// `ext4_mask_flags`: the part of `flags` an inode of type `t` can carry.
fn mask_for(t: FileType, flags: u32) -> u32 {
    match t {
        FileType::Directory => flags,
        FileType::Regular => flags & !DIR_ONLY,
        _ => flags & OTHER_MASK,
    }
}

/// The `FS_XFLAG_*` view of ext4 flags.
pub fn to_xflags(flags: u32) -> u32 {
    XFLAGS.iter().filter(|(_, f)| flags & f != 0).fold(0, |x, (b, _)| x | b)
}

/// ext4 flags after setting the `FS_XFLAG_*` bits `xflags` on an inode
/// with flags `old` (the other flags keep their values, as
/// `vfs_fileattr_set` fills them in from the old ones). `None` if `xflags`
/// has bits ext4 does not map.
pub fn from_xflags(old: u32, xflags: u32) -> Option<u32> {
    let known = XFLAGS.iter().fold(0, |m, (b, _)| m | b);
    if xflags & !known != 0 {
        return None;
    }
    let common = XFLAGS.iter().fold(0, |m, (_, f)| m | f);
    let set = XFLAGS
        .iter()
        .filter(|(b, _)| xflags & b != 0)
        .fold(0, |m, (_, f)| m | f);
    Some((old & !common) | set)
}

/// Switch the block map of the empty regular file `rec` to extents
/// (`to_extents`) or to a block-map array: an empty extent header
/// (`ext4_ext_tree_init`) or 60 zero bytes. Anything with data, inline
/// data or on a filesystem without the extent feature: EOPNOTSUPP / EINVAL.
fn relayout_empty(fs: &Fs, ino: u32, t: FileType, rec: &mut Inode, to_extents: bool) -> Result<()> {
    let unsupported = |why: &str| {
        Err(Error::posix(
            Errno::EOPNOTSUPP,
            format!("inode {ino}: changing the extent flag {why} is not supported"),
        ))
    };
    if t != FileType::Regular {
        return unsupported("of anything but a regular file");
    }
    if rec.size() != 0 || rec.base.blocks_lo != 0 || rec.base.blocks_high != 0 || rec.has_inline_data() {
        return unsupported("of a file with data");
    }
    if to_extents && !fs.vol.geo().has_incompat(incompat::EXTENTS) {
        return Err(Error::posix(
            Errno::EINVAL,
            format!("inode {ino}: the filesystem has no extent feature"),
        ));
    }
    rec.base.block = [0; 60];
    if to_extents {
        // ext4_extent_header: magic 0xF30A, 0 entries, room for 4, depth 0.
        rec.base.block[0..2].copy_from_slice(&0xF30Au16.to_le_bytes());
        rec.base.block[4..6].copy_from_slice(&4u16.to_le_bytes());
    }
    Ok(())
}

fn eperm(ino: u32, why: &str) -> Error {
    Error::posix(Errno::EPERM, format!("inode {ino}: {why}"))
}

fn name_eperm(what: &[u8], why: &str) -> Error {
    Error::posix(Errno::EPERM, format!("{}: {why}", String::from_utf8_lossy(what)))
}

/// `may_create` on directory `dir` for name `what`: an immutable
/// directory takes no new names (EPERM, before any access check, as
/// `inode_permission` with MAY_WRITE).
pub(crate) fn check_create_in(dir: &Inode, what: &[u8]) -> Result<()> {
    if dir.base.flags & fl::IMMUTABLE != 0 {
        return Err(name_eperm(what, "the directory is immutable"));
    }
    Ok(())
}

/// `may_delete` of name `what`: no name leaves an append-only directory,
/// and no immutable or append-only inode loses a name (EPERM).
pub(crate) fn check_delete(dir: &Inode, victim: &Inode, what: &[u8]) -> Result<()> {
    if dir.base.flags & fl::APPEND != 0 {
        return Err(name_eperm(what, "the directory is append-only"));
    }
    if victim.base.flags & (fl::APPEND | fl::IMMUTABLE) != 0 {
        return Err(name_eperm(what, "immutable or append-only"));
    }
    Ok(())
}

/// `vfs_link`: an immutable or append-only inode gets no new name `what`
/// (EPERM).
pub(crate) fn check_link(inode: &Inode, what: &[u8]) -> Result<()> {
    if inode.base.flags & (fl::APPEND | fl::IMMUTABLE) != 0 {
        return Err(name_eperm(what, "the file is immutable or append-only"));
    }
    Ok(())
}

impl Fs {
    /// `FS_IOC_GETFLAGS`: inode `ino`'s user-visible flags.
    pub fn get_flags_ino(&self, ino: u32) -> Result<u32> {
        let ci = self.inode(ino)?;
        let rec = ci.disk.read();
        Ok(rec.base.flags & USER_VISIBLE)
    }

    /// `FS_IOC_SETFLAGS` on inode `ino` by `cred` (see the module comment
    /// for the rules). Returns the new attributes.
    pub fn set_flags_ino(&self, ino: u32, flags: u32, cred: &Cred) -> Result<Stat> {
        if self.vol.read_only() {
            return Err(Error::posix(Errno::EROFS, "filesystem is read-only"));
        }
        if flags & !USER_VISIBLE != 0 {
            return Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: flags {:#x} are not ext4 flags", flags & !USER_VISIBLE),
            ));
        }
        let flags = flags & USER_MODIFIABLE;
        let ci = self.inode(ino)?;
        let mut rec = ci.disk.write();
        let old = rec.base.flags;
        if !cred.owner_or_root(&rec) {
            return Err(eperm(ino, "only the owner may change flags"));
        }
        let changed = (flags ^ old) & USER_MODIFIABLE;
        if changed & (fl::APPEND | fl::IMMUTABLE) != 0 && !cred.is_root() {
            return Err(eperm(
                ino,
                "changing append-only or immutable needs CAP_LINUX_IMMUTABLE",
            ));
        }
        if changed & fl::JOURNAL_DATA != 0 && !cred.is_root() {
            return Err(eperm(ino, "changing data journaling needs CAP_SYS_RESOURCE"));
        }
        if mask_for(ci.ftype, flags) != flags {
            return Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: flags {flags:#x} do not apply to this file type"),
            ));
        }
        if old & fl::IMMUTABLE != 0 && flags & fl::IMMUTABLE != 0 && old & !fl::IMMUTABLE != flags & !fl::IMMUTABLE {
            return Err(eperm(ino, "immutable inode"));
        }
        if changed & UNSUPPORTED_CHANGES != 0 {
            return Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!(
                    "inode {ino}: changing flags {:#x} (extents, data journaling or case folding) is not supported",
                    changed & UNSUPPORTED_CHANGES
                ),
            ));
        }
        let mut new = rec.clone();
        if changed & fl::EXTENTS != 0 {
            relayout_empty(self, ino, ci.ftype, &mut new, flags & fl::EXTENTS != 0)?;
        }
        new.base.flags = (old & !USER_MODIFIABLE) | flags;
        new.set_time(TimeField::Ctime, self.now());
        let mut h = self.vol.begin()?;
        inode::write(&self.vol, &mut h, ino, &new)?;
        h.commit()?;
        *rec = new;
        if changed & fl::EXTENTS != 0 {
            ci.reset_block_map();
        }
        let st = Stat::from_inode(&self.vol, ino, &rec);
        // ext4_ioctl_setflags: a synchronous inode (before or after the
        // change) has it durable now.
        drop(rec);
        self.sync_if_needed(&ci, old | flags)?;
        Ok(st)
    }

    /// `FS_IOC_FSGETXATTR`: inode `ino`'s flags as a `struct fsxattr`
    /// (extent-size hints, extent count and project id 0: what ext4
    /// reports without the project feature).
    pub fn get_xattr_flags_ino(&self, ino: u32) -> Result<FsXattr> {
        Ok(FsXattr {
            xflags: to_xflags(self.get_flags_ino(ino)?),
            ..FsXattr::default()
        })
    }

    /// `FS_IOC_FSSETXATTR`: set the `FS_XFLAG_*` flags of `fa` on inode
    /// `ino` (`ext4_fileattr_set`). Extent-size hints are not ext4's
    /// (EINVAL), nor a project id without the project feature
    /// (EOPNOTSUPP); the flags as [`Fs::set_flags_ino`].
    pub fn set_xflags_ino(&self, ino: u32, fa: &FsXattr, cred: &Cred) -> Result<Stat> {
        if fa.extsize != 0 || fa.cowextsize != 0 {
            return Err(Error::posix(
                Errno::EINVAL,
                format!("inode {ino}: ext4 has no extent-size hints"),
            ));
        }
        if fa.projid != 0 {
            return Err(Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: project ids need the project feature"),
            ));
        }
        let old = self.get_flags_ino(ino)?;
        let flags = from_xflags(old, fa.xflags).ok_or_else(|| {
            Error::posix(
                Errno::EOPNOTSUPP,
                format!("inode {ino}: FS_XFLAG bits {:#x} are not supported by ext4", fa.xflags),
            )
        })?;
        self.set_flags_ino(ino, flags, cred)
    }
}

/// `struct fsxattr`, what `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` pass
/// (28 bytes, little-endian here as on every Linux ext4 host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsXattr {
    /// `fsx_xflags`: `FS_XFLAG_*` bits.
    pub xflags: u32,
    /// `fsx_extsize`: extent-size hint.
    pub extsize: u32,
    /// `fsx_nextents`: extents (reported, never set).
    pub nextents: u32,
    /// `fsx_projid`: project id.
    pub projid: u32,
    /// `fsx_cowextsize`: copy-on-write extent-size hint.
    pub cowextsize: u32,
}

impl FsXattr {
    /// Size of `struct fsxattr` (five words and 8 bytes of padding).
    pub const SIZE: usize = 28;

    /// Decode the structure (`None` if `b` is shorter).
    pub fn parse(b: &[u8]) -> Option<FsXattr> {
        let w = |i: usize| {
            b.get(i * 4..i * 4 + 4)
                .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        };
        Some(FsXattr {
            xflags: w(0)?,
            extsize: w(1)?,
            nextents: w(2)?,
            projid: w(3)?,
            cowextsize: w(4)?,
        })
        .filter(|_| b.len() >= Self::SIZE)
    }

    /// Encode the structure.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        for (i, v) in [self.xflags, self.extsize, self.nextents, self.projid, self.cowextsize]
            .into_iter()
            .enumerate()
        {
            out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_the_kernels() {
        // EXT4_FL_USER_VISIBLE = MODIFIABLE | DIRTY | COMPRBLK | NOCOMPR |
        // ENCRYPT | INDEX | VERITY | INLINE_DATA.
        assert_eq!(
            USER_MODIFIABLE | 0x100 | 0x200 | 0x400 | fl::ENCRYPT | fl::INDEX | fl::VERITY | fl::INLINE_DATA,
            USER_VISIBLE
        );
        assert_eq!(mask_for(FileType::Regular, fl::DIRSYNC | fl::SYNC), fl::SYNC);
        assert_eq!(mask_for(FileType::Symlink, fl::IMMUTABLE | fl::NODUMP), fl::NODUMP);
        assert_eq!(mask_for(FileType::Directory, fl::DIRSYNC), fl::DIRSYNC);
    }

    use crate::vfs::mem_fs as fs;

    fn errno<T: std::fmt::Debug>(r: Result<T>) -> Errno {
        r.unwrap_err().errno()
    }

    #[test]
    fn who_may_set_what() {
        let fs = fs();
        let root = Cred::root();
        let st = fs.write_file(b"/f", b"x", 0o644, 1000, 1000).unwrap();
        let old = fs.get_flags_ino(st.ino).unwrap();
        let owner = Cred::user(1000, 1000);
        // Not the owner: EPERM; the owner: ordinary flags yes, i and a no.
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old | fl::NODUMP, &Cred::user(7, 7))),
            Errno::EPERM
        );
        fs.set_flags_ino(st.ino, old | fl::NODUMP, &owner).unwrap();
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old | fl::IMMUTABLE, &owner)),
            Errno::EPERM
        );
        assert_eq!(errno(fs.set_flags_ino(st.ino, old | fl::APPEND, &owner)), Errno::EPERM);
        // Flags for directories only, unknown bits, unsupported changes.
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old | fl::DIRSYNC, &root)),
            Errno::EOPNOTSUPP
        );
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old | 0x8000_0000, &root)),
            Errno::EOPNOTSUPP
        );
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old & !fl::EXTENTS, &root)),
            Errno::EOPNOTSUPP
        );
        // Visible but not settable bits (INDEX) are dropped silently.
        fs.set_flags_ino(st.ino, old | fl::NODUMP | fl::INDEX, &root).unwrap();
        assert_eq!(fs.get_flags_ino(st.ino).unwrap(), old | fl::NODUMP);
        // An immutable inode changes no other flag while it stays so.
        fs.set_flags_ino(st.ino, old | fl::IMMUTABLE, &root).unwrap();
        assert_eq!(
            errno(fs.set_flags_ino(st.ino, old | fl::IMMUTABLE | fl::NOATIME, &root)),
            Errno::EPERM
        );
        fs.set_flags_ino(st.ino, old, &root).unwrap();
        // The extent flag of an empty file switches its layout; it is
        // written through either layout afterwards.
        let e = fs.write_file(b"/e", b"", 0o644, 0, 0).unwrap();
        let eold = fs.get_flags_ino(e.ino).unwrap();
        fs.set_flags_ino(e.ino, eold & !fl::EXTENTS, &root).unwrap();
        let inode = fs.inode(e.ino).unwrap();
        fs.write_at(&inode, Some(0), b"block-mapped").unwrap();
        fs.sync().unwrap();
        assert_eq!(fs.get_flags_ino(e.ino).unwrap() & fl::EXTENTS, 0);
        let mut buf = [0u8; 12];
        assert_eq!(fs.read_at(&inode, 0, &mut buf).unwrap(), 12);
        assert_eq!(&buf, b"block-mapped");
    }

    #[test]
    fn immutable_and_append_only_names_stay() {
        let fs = fs();
        let root = Cred::root();
        let f = fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        let old = fs.get_flags_ino(f.ino).unwrap();
        for flag in [fl::IMMUTABLE, fl::APPEND] {
            fs.set_flags_ino(f.ino, old | flag, &root).unwrap();
            assert_eq!(errno(fs.unlink_at(2, b"f", &root)), Errno::EPERM);
            assert_eq!(errno(fs.link_at(f.ino, 2, b"g", &root)), Errno::EPERM);
            let rf = super::super::rename::RenameFlags::default();
            assert_eq!(errno(fs.rename_at(2, b"f", 2, b"h", rf, &root)), Errno::EPERM);
            fs.set_flags_ino(f.ino, old, &root).unwrap();
        }
        let d = fs.mkdir_at(2, b"d", 0o755, &root).unwrap();
        fs.write_file(b"/d/x", b"x", 0o644, 0, 0).unwrap();
        let dold = fs.get_flags_ino(d.ino).unwrap();
        fs.set_flags_ino(d.ino, dold | fl::IMMUTABLE, &root).unwrap();
        assert_eq!(errno(fs.mkdir_at(d.ino, b"y", 0o755, &root)), Errno::EPERM);
        assert_eq!(errno(fs.unlink_at(d.ino, b"x", &root)), Errno::EPERM);
        fs.set_flags_ino(d.ino, dold | fl::APPEND, &root).unwrap();
        fs.mkdir_at(d.ino, b"y", 0o755, &root).unwrap();
        assert_eq!(errno(fs.unlink_at(d.ino, b"x", &root)), Errno::EPERM);
        fs.set_flags_ino(d.ino, dold, &root).unwrap();
        fs.unlink_at(d.ino, b"x", &root).unwrap();
    }

    #[test]
    fn xflags_round_trip_and_keep_other_flags() {
        let old = fl::EXTENTS | fl::NODUMP;
        assert_eq!(to_xflags(old), 0x80);
        let new = from_xflags(old, 0x8 | 0x40).unwrap();
        assert_eq!(new, fl::EXTENTS | fl::IMMUTABLE | fl::NOATIME);
        assert_eq!(to_xflags(new), 0x8 | 0x40);
        assert_eq!(from_xflags(old, 0x1), None);
    }
}
