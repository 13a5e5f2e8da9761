//! Changing inode attributes: mode, owner, times (`chmod`, `chown`,
//! `utimensat`), the checks Linux makes for them, `access(2)` and
//! `statfs(2)`.
//!
//! The rules are the kernel's `notify_change` → `may_setattr` →
//! `setattr_prepare` (fs/attr.c):
//! * immutable or append-only inodes refuse mode, owner and explicit-time
//!   changes (EPERM), and immutable ones refuse "touch" too;
//! * changing the owner needs root, except "changing" it to itself by the
//!   owner (`chown_ok`); changing the group needs root, or the owner giving
//!   it to the current group or one they belong to (`chgrp_ok`);
//! * chmod needs the owner or root; a non-root chmod drops S_ISGID when the
//!   caller is not in the file's (new) group;
//! * explicit times need the owner or root (EPERM); setting both times to
//!   "now" also works for anyone with write permission (else EACCES);
//! * a chown of a non-directory clears S_ISUID, S_ISGID when group-exec
//!   is set or the caller is neither root nor in the group
//!   (`setattr_should_drop_sgid`), and `security.capability`
//!   (`vfs::killpriv`);
//! * ctime becomes now on every change;
//! * a chmod rewrites the access ACL's owner, mask and other entries to the
//!   new bits (`posix_acl_chmod`), so the ACL and the mode stay one.
//!
//! Locking: the inode's write lock (`i_rwsem` analogue) is held from the
//! permission check to publishing the new record, so the check and the
//! change see the same owner and mode.

use ext4kit_format::features::incompat;
use ext4kit_format::inode::{flags, FileType, Inode, TimeField, Timestamp};

use super::acl;
use super::acl::{acl_chmod, ACL_ACCESS};
use super::cred::{Cred, MAY_WRITE};
use super::killpriv;
use super::killpriv::chown_drops;
use super::lookup;
use super::stat;
use super::super_block::SuperBlock;
use super::target::Target;
use super::Stat;
use crate::error::{Errno, Error, Result};
use crate::ext4::xattr_write::{self, XattrChange, XATTR_REPLACE};
use crate::ext4::ROOT_INO;
use crate::ext4::{inode, xattr};

const S_ISGID: u16 = 0o2000;

/// A time to set: the current time, or a given one (nanosecond precision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    /// `UTIME_NOW`.
    Now,
    /// An explicit time.
    Set(Timestamp),
}

/// Which attributes to change (`None`: leave it). Size changes are
/// truncate's business and not here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (the file type bits are ignored).
    pub mode: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

/// What `statfs(2)` reports, computed the way the kernel's `ext4_statfs`
/// does so `df` on a kernel mount of the same image shows the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Block size (`f_bsize`).
    pub block_size: u32,
    /// Blocks for data: all blocks minus the filesystem's fixed overhead
    /// (superblocks, descriptor tables, bitmaps, inode tables, journal), as
    /// `ext4_calculate_overhead` counts it (`f_blocks`).
    pub blocks: u64,
    /// Free blocks, summed over the group descriptors, minus the blocks
    /// buffered writes have claimed and not yet allocated (`f_bfree`).
    pub blocks_free: u64,
    /// Free blocks minus the root reserve `s_r_blocks_count`, not below 0
    /// (`f_bavail`; the kernel also holds back its own runtime reserve of
    /// min(2 %, 4096) clusters on extent filesystems, which we do not).
    pub blocks_avail: u64,
    /// Inodes (`f_files`).
    pub files: u64,
    /// Free inodes, summed over the group descriptors (`f_ffree`).
    pub files_free: u64,
    /// Longest name (`f_namelen`).
    pub name_max: u32,
    /// The UUID's two halves XORed (`f_fsid`, as ext4 computes it).
    pub fsid: u64,
}

/// Clamp a time to what the inode can hold: 32-bit signed seconds, plus
/// two epoch bits when the record has the `_extra` fields (the kernel's
/// `s_time_min` / `s_time_max`).
fn clamp_time(inode: &Inode, t: Timestamp) -> Timestamp {
    let min = i32::MIN as i64;
    let max = if inode.has_extra(0x10) {
        i32::MAX as i64 + (3i64 << 32)
    } else {
        i32::MAX as i64
    };
    Timestamp {
        sec: t.sec.clamp(min, max),
        nsec: if inode.has_extra(0x10) { t.nsec } else { 0 },
    }
}

fn eperm(ino: u32, what: &str) -> Error {
    Error::posix(Errno::EPERM, format!("inode {ino}: {what}: operation not permitted"))
}

/// The work of [`Fs::setattr`](crate::Fs::setattr).
pub(crate) fn setattr(sb: &SuperBlock, t: Target<'_>, attr: &SetAttr, cred: &Cred) -> Result<Stat> {
    lookup::on_inode(sb, t, |ino| setattr_ino(sb, ino, attr, cred))
}

/// [`setattr`] on inode `ino`.
fn setattr_ino(sb: &SuperBlock, ino: u32, attr: &SetAttr, cred: &Cred) -> Result<Stat> {
    for t in [attr.atime, attr.mtime].into_iter().flatten() {
        if let TimeSet::Set(ts) = t {
            if ts.nsec >= 1_000_000_000 {
                return Err(Error::posix(
                    Errno::EINVAL,
                    format!("inode {ino}: {} nanoseconds", ts.nsec),
                ));
            }
        }
    }
    let ci = sb.inode(ino)?;
    let mut rec = ci.disk.write();
    let old = &*rec;
    let owner = cred.owner_or_root(old);
    let immutable = old.base.flags & flags::IMMUTABLE != 0;
    let append = old.base.flags & flags::APPEND != 0;
    // utimensat(NOW, NOW) (or NULL times) is ATTR_TOUCH; any other
    // time argument is ATTR_TIMES_SET.
    let touch = attr.atime == Some(TimeSet::Now) && attr.mtime == Some(TimeSet::Now);
    let times_set = !touch && (attr.atime.is_some() || attr.mtime.is_some());
    // may_setattr
    if (attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some() || times_set) && (immutable || append) {
        return Err(eperm(ino, "immutable or append-only inode"));
    }
    if touch {
        if immutable {
            return Err(eperm(ino, "immutable inode"));
        }
        if !owner && !acl::permission(sb, ino, old, MAY_WRITE, cred)? {
            return Err(Error::posix(
                Errno::EACCES,
                format!("inode {ino}: setting times to now needs write permission"),
            ));
        }
    }
    // setattr_prepare
    if let Some(u) = attr.uid {
        if !(cred.is_root() || (cred.uid == old.uid() && u == old.uid())) {
            return Err(eperm(ino, "changing the owner"));
        }
    }
    if let Some(g) = attr.gid {
        if !(cred.is_root() || (cred.uid == old.uid() && (g == old.gid() || cred.in_group(g)))) {
            return Err(eperm(ino, "changing the group"));
        }
    }
    if attr.mode.is_some() && !owner {
        return Err(eperm(ino, "changing the mode"));
    }
    if times_set && !owner {
        return Err(eperm(ino, "setting explicit times"));
    }

    let mut new = old.clone();
    let t = sb.now();
    let mut mode = old.base.mode;
    if let Some(m) = attr.mode {
        mode = (mode & 0o170000) | (m & 0o7777);
        let group = attr.gid.unwrap_or(old.gid());
        if !cred.is_root() && !cred.in_group(group) {
            mode &= !S_ISGID;
        }
    }
    // chown_common: a non-directory loses setuid, setgid by the group
    // rule, and its file capability (ATTR_KILL_SUID, ATTR_KILL_PRIV).
    let chown = (attr.uid.is_some() || attr.gid.is_some()) && ci.ftype != FileType::Directory;
    if chown {
        mode &= !chown_drops(old.base.mode, old.gid(), cred);
    }
    new.base.mode = mode;
    if let Some(u) = attr.uid {
        new.base.set_uid(u);
    }
    if let Some(g) = attr.gid {
        new.base.set_gid(g);
    }
    for (which, set) in [(TimeField::Atime, attr.atime), (TimeField::Mtime, attr.mtime)] {
        match set {
            Some(TimeSet::Now) => new.set_time(which, clamp_time(&new, t)),
            Some(TimeSet::Set(ts)) => new.set_time(which, clamp_time(&new, ts)),
            None => {}
        }
    }
    new.set_time(TimeField::Ctime, clamp_time(&new, t));
    let mut h = sb.vol().begin()?;
    if chown {
        killpriv::drop_capability(sb, &mut h, ino, &mut new)?;
    }
    if attr.mode.is_some() {
        // posix_acl_chmod: an access ACL follows the new bits.
        let acl = xattr::list(sb.vol(), ino, &new)?
            .into_iter()
            .find(|(n, _)| n == ACL_ACCESS);
        if let Some((_, mut x)) = acl {
            acl_chmod(&mut x, mode);
            xattr_write::set(
                sb.vol(),
                &mut h,
                ino,
                &mut new,
                XattrChange {
                    name: ACL_ACCESS,
                    value: Some(&x),
                    flags: XATTR_REPLACE,
                },
            )?;
        }
    }
    inode::write(sb.vol(), &mut h, ino, &new)?;
    h.commit()?;
    *rec = new;
    Ok(Stat::from_inode(sb.vol(), ino, &rec))
}

/// The work of [`Fs::chmod`](crate::Fs::chmod).
pub(crate) fn chmod(sb: &SuperBlock, t: Target<'_>, mode: u16, cred: &Cred) -> Result<Stat> {
    let attr = SetAttr {
        mode: Some(mode),
        ..Default::default()
    };
    setattr(sb, t, &attr, cred)
}

/// The work of [`Fs::chown`](crate::Fs::chown).
pub(crate) fn chown(sb: &SuperBlock, t: Target<'_>, uid: Option<u32>, gid: Option<u32>, cred: &Cred) -> Result<Stat> {
    let attr = SetAttr {
        uid,
        gid,
        ..Default::default()
    };
    setattr(sb, t, &attr, cred)
}

/// The work of [`Fs::utimens`](crate::Fs::utimens).
pub(crate) fn utimens(
    sb: &SuperBlock,
    t: Target<'_>,
    atime: Option<TimeSet>,
    mtime: Option<TimeSet>,
    cred: &Cred,
) -> Result<Stat> {
    lookup::on_inode(sb, t, |ino| {
        if atime.is_none() && mtime.is_none() {
            // Both UTIME_OMIT: nothing to do, no check, ctime untouched.
            return stat::stat_ino(sb, ino);
        }
        let attr = SetAttr {
            atime,
            mtime,
            ..Default::default()
        };
        setattr_ino(sb, ino, &attr, cred)
    })
}

/// [`access`] on inode `ino`.
fn access_ino(sb: &SuperBlock, ino: u32, mask: u8, cred: &Cred) -> Result<()> {
    let ci = sb.inode(ino)?;
    let rec = ci.disk.read();
    if mask & MAY_WRITE != 0 {
        if sb.vol().read_only() && matches!(ci.ftype, FileType::Regular | FileType::Directory | FileType::Symlink) {
            return Err(Error::posix(Errno::EROFS, format!("inode {ino}: read-only filesystem")));
        }
        if rec.base.flags & flags::IMMUTABLE != 0 {
            return Err(eperm(ino, "write access to an immutable inode"));
        }
    }
    if acl::permission(sb, ino, &rec, mask, cred)? {
        Ok(())
    } else {
        Err(Error::posix(Errno::EACCES, format!("inode {ino}: permission denied")))
    }
}

/// The work of [`Fs::access`](crate::Fs::access).
pub(crate) fn access(sb: &SuperBlock, t: Target<'_>, mask: u8, cred: &Cred) -> Result<()> {
    lookup::on_inode(sb, t, |ino| access_ino(sb, ino, mask, cred))
}

/// The work of [`Fs::statfs`](crate::Fs::statfs).
pub(crate) fn statfs(sb: &SuperBlock) -> Result<StatFs> {
    // The space of a removed file counts as free once its free is done
    // (`vfs::releasing`).
    sb.releasing().wait_idle();
    let (free_blocks, free_inodes) = sb.vol().groups().iter().fold((0u64, 0u64), |(b, i), g| {
        let d = g.desc().read();
        (b + d.free_blocks_count() as u64, i + d.free_inodes_count() as u64)
    });
    let (reserved, uuid, stored_overhead, journal_ino) = {
        let s = sb.vol().sb().read();
        (s.r_blocks_count(), s.uuid, s.overhead_clusters, s.journal_inum)
    };
    let overhead = if stored_overhead != 0 {
        stored_overhead as u64
    } else {
        overhead(sb, journal_ino)?
    };
    let half = |k: usize| u64::from_le_bytes(uuid[k..k + 8].try_into().unwrap_or([0; 8]));
    Ok(StatFs {
        block_size: sb.vol().block_size() as u32,
        blocks: sb.vol().geo().blocks_count().saturating_sub(overhead),
        // Blocks promised to buffered writes not yet written back are
        // not free (`ext4_statfs`: s_freeclusters_counter minus
        // s_dirtyclusters_counter), so `df` shows what write(2) has
        // already accepted.
        blocks_free: free_blocks.saturating_sub(sb.vol().reservations().dirty()),
        blocks_avail: free_blocks
            .saturating_sub(sb.vol().reservations().dirty())
            .saturating_sub(reserved),
        files: sb.vol().geo().inodes_count() as u64,
        files_free: free_inodes,
        name_max: ext4kit_format::dirent::NAME_MAX as u32,
        fsid: half(0) ^ half(8),
    })
}

/// `ext4_calculate_overhead`: blocks before `s_first_data_block`, per
/// group the superblock copy and descriptor blocks where there is a
/// backup (reserved GDT blocks are not counted, as in the kernel), two
/// bitmaps and the inode table, and the internal journal.
fn overhead(sb: &SuperBlock, journal_ino: u32) -> Result<u64> {
    let vol = sb.vol();
    let ngroups = vol.groups().len() as u64;
    let itb = (vol.geo().inodes_per_group() as u64 * vol.geo().inode_size() as u64).div_ceil(vol.block_size() as u64);
    let (gdb, meta_bg, first_meta_bg) = {
        let s = vol.sb().read();
        let per = (vol.block_size() / s.desc_size()) as u64;
        (
            ngroups.div_ceil(per),
            vol.geo().has_incompat(incompat::META_BG),
            s.first_meta_bg as u64,
        )
    };
    let mut total = vol.geo().first_data_block() + ngroups * (itb + 2);
    let s = vol.sb().read();
    for g in 0..ngroups {
        if s.group_has_super(g) {
            total += 1 + if meta_bg { first_meta_bg.min(gdb) } else { gdb };
        }
    }
    drop(s);
    if journal_ino != 0
        && journal_ino != ROOT_INO
        && vol.geo().has_compat(ext4kit_format::features::compat::HAS_JOURNAL)
    {
        total += inode::read(vol, journal_ino)?.size() / vol.block_size() as u64;
    }
    Ok(total)
}
