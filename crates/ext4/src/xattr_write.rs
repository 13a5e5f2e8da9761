//! Writing extended attributes: set or remove one attribute, placed the way
//! the kernel's `ext4_xattr_set_handle` places it.
//!
//! Placement (fs/ext4/xattr.c):
//! * a new or replaced value goes in the inode body (after
//!   `128 + i_extra_isize`, magic `0xEA020000`) when it fits there; if it
//!   was in the block before, it is then removed from the block;
//! * when the body has no room (`ext4_xattr_ibody_set` gives ENOSPC) it goes
//!   in the external block (`i_file_acl`), and a copy still in the body is
//!   removed;
//! * a removal takes the attribute from wherever it is (body first).
//!
//! The external block (`ext4_xattr_block_set`): modified in place when
//! `h_refcount` is 1; otherwise it is shared with other inodes (the kernel's
//! mbcache deduplicates identical blocks), so this inode gets a private copy
//! in a new block and the old block's refcount drops by one. A block left
//! with no entries is released (`ext4_xattr_release_block`: freed when this
//! was its last reference, else refcount - 1). `i_blocks` counts the block
//! for every inode that references it (the kernel charges each sharer).
//!
//! Locking: the caller holds the inode's write lock (the `i_rwsem` /
//! `xattr_sem` analogue) and writes the inode record afterwards. The
//! refcount of a shared block is only ever decreased by us (we never share
//! new blocks), and each decrease happens under the block's lock; a
//! refcount of 1 seen by the one inode that references the block is
//! therefore stable, which is what allows the in-place edit.

use ext4kit_format::bytes::{le32, put32};
use ext4kit_format::features::compat;
use ext4kit_format::inode::Inode;
use ext4kit_format::xattr::{self, XattrEntry};

use super::balloc::{self, BlockRequest};
use super::error::annotate;
use super::inode::{add_blocks, sub_blocks};
use super::transaction::Handle;
use super::volume::Volume;
use super::xattr::ea_inode_error;
use crate::error::{Errno, Error, Result};

/// `XATTR_CREATE`: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `XATTR_REPLACE`: fail with ENODATA if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;
/// Largest value the Linux xattr syscalls accept (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Longest full name (`XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;

/// Split a full attribute name into (name index, stored name), with the
/// errors the Linux VFS gives: ERANGE for an empty or over-long name,
/// EINVAL for a bare prefix ("user."), EOPNOTSUPP for a namespace ext4 has
/// no handler for (`system.` other than the POSIX ACLs, `gnu.`, unknown).
pub fn xattr_key(full: &[u8]) -> Result<(u8, &[u8])> {
    let show = || String::from_utf8_lossy(full).into_owned();
    if full.is_empty() || full.len() > XATTR_NAME_MAX {
        return Err(Error::posix(
            Errno::ERANGE,
            format!("attribute name {:?}: empty or longer than 255 bytes", show()),
        ));
    }
    match xattr::split_name(full) {
        Some((idx, name))
            if matches!(
                idx,
                xattr::INDEX_USER
                    | xattr::INDEX_TRUSTED
                    | xattr::INDEX_SECURITY
                    | xattr::INDEX_POSIX_ACL_ACCESS
                    | xattr::INDEX_POSIX_ACL_DEFAULT
            ) =>
        {
            Ok((idx, name))
        }
        None if [&b"user."[..], b"trusted.", b"security."].contains(&full) => Err(Error::posix(
            Errno::EINVAL,
            format!("attribute name {:?}: a namespace prefix alone", show()),
        )),
        _ => Err(Error::posix(
            Errno::EOPNOTSUPP,
            format!("attribute name {:?}: namespace not supported by ext4", show()),
        )),
    }
}

/// Whether `e` is the attribute (`index`, `name`).
fn is(e: &XattrEntry, index: u8, name: &[u8]) -> bool {
    e.name_index == index && e.name == name
}

/// The external block as read: its number, refcount and entries.
struct Block {
    nr: u64,
    refcount: u32,
    entries: Vec<XattrEntry>,
}

/// One attribute change: set `name` to `value` (`Some`) or remove it
/// (`None`), as the xattr syscalls ask for it.
#[derive(Debug, Clone, Copy)]
pub struct XattrChange<'a> {
    /// Full name, namespace prefix included (`user.mime_type`).
    pub name: &'a [u8],
    /// The new value (POSIX ACLs in the Linux xattr format), or `None` to
    /// remove the attribute.
    pub value: Option<&'a [u8]>,
    /// 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub flags: u32,
}

/// An attribute change in disk terms: name index, stored name and the
/// value in ext4's disk format.
struct Stored<'a> {
    index: u8,
    name: &'a [u8],
    value: Option<&'a [u8]>,
    flags: u32,
}

/// Apply `change` to inode `ino`, converting a POSIX ACL from the Linux
/// xattr format to ext4's disk format. The caller holds the inode's write
/// lock, and writes `rec` (changed in place: body area, `i_file_acl`,
/// `i_blocks`) with [`super::inode::write`] before committing `h`. Public:
/// the vfs layer's setxattr, removexattr and chmod (the access ACL).
pub fn set(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, change: XattrChange<'_>) -> Result<()> {
    let (index, name) = xattr_key(change.name)?;
    if let Some(v) = change.value {
        if v.len() > XATTR_SIZE_MAX {
            return Err(Error::posix(
                Errno::E2BIG,
                format!("inode {ino}: value of {} bytes (max {XATTR_SIZE_MAX})", v.len()),
            ));
        }
    }
    let acl;
    let value = match change.value {
        Some(v) if matches!(index, xattr::INDEX_POSIX_ACL_ACCESS | xattr::INDEX_POSIX_ACL_DEFAULT) => {
            acl = xattr::acl_xattr_to_disk(v)
                .map_err(|e| Error::posix(Errno::EINVAL, format!("inode {ino}: invalid POSIX ACL: {e}")))?;
            Some(&acl[..])
        }
        v => v,
    };
    let stored = Stored {
        index,
        name,
        value,
        flags: change.flags,
    };
    set_stored(vol, h, ino, rec, &stored)
}

/// Set or remove the stored attribute with its value in disk format (see
/// [`set`] for the contract).
fn set_stored(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, change: &Stored<'_>) -> Result<()> {
    let Stored {
        index,
        name,
        value,
        flags,
    } = *change;
    if !vol.geo().has_compat(compat::EXT_ATTR) {
        return Err(Error::posix(
            Errno::EOPNOTSUPP,
            "the filesystem has no ext_attr feature",
        ));
    }
    let show = || format!("inode {ino}: attribute {}", String::from_utf8_lossy(name));
    let mut body = body_entries(ino, rec)?;
    let block = read_block(vol, ino, rec)?;
    let in_body = body.iter().position(|e| is(e, index, name));
    let in_block = block
        .as_ref()
        .and_then(|b| b.entries.iter().position(|e| is(e, index, name)));
    let exists = in_body.is_some() || in_block.is_some();
    if exists && flags & XATTR_CREATE != 0 {
        return Err(Error::posix(Errno::EEXIST, format!("{}: exists", show())));
    }
    if !exists && (flags & XATTR_REPLACE != 0 || value.is_none()) {
        return Err(Error::posix(Errno::ENODATA, format!("{}: no such attribute", show())));
    }
    let Some(value) = value else {
        // Removal: from the body if there, else from the block.
        if let Some(k) = in_body {
            body.remove(k);
            store_body(ino, rec, &body)?;
        } else if let (Some(k), Some(mut b)) = (in_block, block) {
            b.entries.remove(k);
            store_block(vol, h, ino, rec, b)?;
        }
        return Ok(());
    };
    let new = XattrEntry::new(index, name, value);
    // First choice: the inode body.
    let mut body2 = body.clone();
    match in_body {
        Some(k) => body2[k] = new.clone(),
        None => body2.push(new.clone()),
    }
    if body_fits(rec, &body2) {
        store_body(ino, rec, &body2)?;
        if let (Some(k), Some(mut b)) = (in_block, block) {
            b.entries.remove(k);
            store_block(vol, h, ino, rec, b)?;
        }
        return Ok(());
    }
    // The block: replace there, or add.
    let mut b = block.unwrap_or(Block {
        nr: 0,
        refcount: 0,
        entries: Vec::new(),
    });
    match in_block {
        Some(k) => b.entries[k] = new,
        None => b.entries.push(new),
    }
    store_block(vol, h, ino, rec, b)?;
    if let Some(k) = in_body {
        body.remove(k);
        store_body(ino, rec, &body)?;
    }
    Ok(())
}

/// Release inode `ino`'s external attribute block (for inode deletion):
/// freed when this inode was its last user, else its refcount drops.
/// Clears `i_file_acl` and takes the block out of `i_blocks`; the caller
/// writes the inode. Public: the vfs layer's eviction of an unlinked inode.
pub fn drop_block(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode) -> Result<()> {
    let nr = rec.file_acl();
    if nr == 0 {
        return Ok(());
    }
    check_block_nr(vol, ino, nr)?;
    release_block(vol, h, ino, nr)?;
    rec.base.set_file_acl(0);
    sub_blocks(rec, 1, vol.block_size());
    Ok(())
}

/// Entries of the inode body (empty when the inode has no body area).
fn body_entries(ino: u32, rec: &Inode) -> Result<Vec<XattrEntry>> {
    xattr::parse_ibody(rec.in_inode_xattr_area())
        .map_err(|e| Error::corrupt(format!("in-inode xattrs of inode {ino}"), e))
}

/// Length of the body area (`ext4_xattr_ibody_set` refuses when
/// `i_extra_isize` is 0 or the record is 128 bytes).
fn body_len(rec: &Inode) -> usize {
    if rec.tail.is_empty() || rec.extra.extra_isize == 0 {
        0
    } else {
        rec.in_inode_xattr_area().len()
    }
}

fn body_fits(rec: &Inode, entries: &[XattrEntry]) -> bool {
    let len = body_len(rec);
    len >= 8 && xattr::serialize_ibody(entries, len).is_ok()
}

/// Write `entries` into the body area (all zeros, magic included, when
/// empty: the kernel clears the magic with the last attribute).
fn store_body(ino: u32, rec: &mut Inode, entries: &[XattrEntry]) -> Result<()> {
    let len = body_len(rec);
    if len == 0 {
        if entries.is_empty() {
            return Ok(());
        }
        return Err(Error::posix(
            Errno::ENOSPC,
            format!("inode {ino}: no in-inode xattr space"),
        ));
    }
    let area = xattr::serialize_ibody(entries, len)
        .map_err(|e| Error::posix(Errno::ENOSPC, format!("inode {ino}: in-inode xattrs: {e}")))?;
    let start = rec.tail.len() - len;
    rec.tail[start..].copy_from_slice(&area);
    Ok(())
}

fn check_block_nr(vol: &Volume, ino: u32, nr: u64) -> Result<()> {
    if nr < vol.geo().first_data_block() || nr >= vol.geo().blocks_count() {
        return Err(Error::corrupt_msg(
            format!("inode {ino}"),
            "i_file_acl",
            format!("xattr block {nr} outside the filesystem"),
        ));
    }
    Ok(())
}

fn read_block(vol: &Volume, ino: u32, rec: &Inode) -> Result<Option<Block>> {
    let nr = rec.file_acl();
    if nr == 0 {
        return Ok(None);
    }
    check_block_nr(vol, ino, nr)?;
    let buf = vol
        .buffer(nr)
        .map_err(|e| annotate(e, &format!("xattr block of inode {ino}")))?;
    let (hdr, entries) = xattr::parse_block(&buf.data, nr, vol.geo().csum_seed())
        .map_err(|e| Error::corrupt(format!("xattr block {nr} of inode {ino}"), e))?;
    if hdr.refcount == 0 {
        return Err(Error::corrupt_msg(
            format!("xattr block {nr} of inode {ino}"),
            "xattr block",
            "h_refcount is 0",
        ));
    }
    if let Some(e) = entries.iter().find(|e| e.in_ea_inode()) {
        return Err(ea_inode_error(vol, ino, e));
    }
    Ok(Some(Block {
        nr,
        refcount: hdr.refcount,
        entries,
    }))
}

/// Put `b.entries` on disk as inode `ino`'s block (`ext4_xattr_block_set`
/// after the entry edit): in place when the inode owns the block alone,
/// else in a new block; none at all when there are no entries.
fn store_block(vol: &Volume, h: &mut Handle<'_>, ino: u32, rec: &mut Inode, b: Block) -> Result<()> {
    let bs = vol.block_size();
    let had = b.nr != 0;
    if b.entries.is_empty() {
        if had {
            release_block(vol, h, ino, b.nr)?;
            rec.base.set_file_acl(0);
            sub_blocks(rec, 1, bs);
        }
        return Ok(());
    }
    let too_big = |e: ext4kit_format::FormatError| {
        // Not damage: the new set is too big (only the reason, not the
        // serialiser's "corrupt xattr block" wording, which would send
        // the user to e2fsck for nothing).
        let why = match e {
            ext4kit_format::FormatError::Corrupt { reason, .. } => reason,
            other => other.to_string(),
        };
        Error::posix(
            Errno::ENOSPC,
            format!("inode {ino}: attributes do not fit one {bs}-byte block: {why}"),
        )
    };
    if had && b.refcount == 1 {
        let bytes = xattr::serialize_block(&b.entries, bs, 1, b.nr, vol.geo().csum_seed()).map_err(too_big)?;
        return h.overwrite(b.nr, bytes.into_boxed_slice());
    }
    // Check the fit before allocating anything.
    xattr::serialize_block(&b.entries, bs, 1, 0, None).map_err(too_big)?;
    // The kernel's goal: the first block of the inode's group.
    let group = (ino - 1) / vol.geo().inodes_per_group();
    let goal = vol.geo().group_first_block(group as u64);
    let (nr, _) = balloc::new_blocks(vol, h, BlockRequest::near(goal, 1))?;
    let bytes = xattr::serialize_block(&b.entries, bs, 1, nr, vol.geo().csum_seed()).map_err(too_big)?;
    h.overwrite(nr, bytes.into_boxed_slice())?;
    rec.base.set_file_acl(nr);
    if had {
        // Copy-on-write of a shared block: still one block charged.
        release_block(vol, h, ino, b.nr)?;
    } else {
        add_blocks(rec, 1, bs);
    }
    Ok(())
}

/// Drop one reference to xattr block `nr` (`ext4_xattr_release_block`):
/// refcount - 1 under the block lock, or free the block when this was
/// the last reference. A freed block is never dirtied by this handle,
/// so the commit cannot write stale metadata over its next owner.
/// The last reference is released only if no other inode still names
/// the block (`owner_scan.rs`: a refcount that lies is damage, refused).
fn release_block(vol: &Volume, h: &mut Handle<'_>, ino: u32, nr: u64) -> Result<()> {
    let seed = vol.geo().csum_seed();
    let last = h.modify(nr, |d| {
        let rc = le32(d, 4);
        // Under the block's lock, where the count of inodes naming the
        // block moves with the refcount (owner_scan.rs).
        vol.owner_map().check_xattr_refcount(ino, nr, rc)?;
        if rc <= 1 {
            // Returning an error leaves the block out of the handle.
            return Err(Error::posix(Errno::ENODATA, "last reference"));
        }
        put32(d, 4, rc - 1);
        if let Some(s) = seed {
            xattr::set_block_checksum(d, nr, s);
        }
        vol.owner_map().xattr_unref(nr);
        Ok(())
    });
    match last {
        Ok(()) => Ok(()),
        Err(Error::Posix {
            errno: Errno::ENODATA, ..
        }) => {
            // bforget: another handle that dropped its reference before
            // ours may not have committed yet; without a journal its
            // commit writes the block's *current* version, so mark that
            // clean (under the block lock, after any write in progress)
            // and a late commit cannot put stale xattr bytes over the
            // block's next owner. With a journal, never: the current
            // version may be the one the last commit logged, which the
            // checkpoint must still write home — the committed
            // filesystem owns the block until this free commits, and
            // skipping it left an inode naming an xattr block whose home
            // held another file's old data once the log was emptied
            // (found by the crash harness's multi-threaded mix). The
            // journal's own books keep the block from its next owner
            // (commit.rs).
            if !vol.jbd().is_journaled() {
                let mut g = vol.bcache().lock(nr);
                if let Some(b) = vol.bcache().peek_locked(&mut g, nr) {
                    b.mark_clean();
                }
            }
            balloc::free_blocks(vol, h, nr, 1)?;
            vol.owner_map().xattr_unref(nr);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_their_errors() {
        assert_eq!(xattr_key(b"user.a").unwrap(), (xattr::INDEX_USER, &b"a"[..]));
        assert_eq!(xattr_key(b"trusted.x.y").unwrap(), (xattr::INDEX_TRUSTED, &b"x.y"[..]));
        assert_eq!(xattr_key(b"security.selinux").unwrap().0, xattr::INDEX_SECURITY);
        assert_eq!(
            xattr_key(b"system.posix_acl_access").unwrap(),
            (xattr::INDEX_POSIX_ACL_ACCESS, &b""[..])
        );
        assert_eq!(
            xattr_key(b"system.posix_acl_default").unwrap().0,
            xattr::INDEX_POSIX_ACL_DEFAULT
        );
        let errno = |n: &[u8]| xattr_key(n).unwrap_err().errno();
        assert_eq!(errno(b""), Errno::ERANGE);
        assert_eq!(errno(&[b'u'; 256]), Errno::ERANGE);
        assert_eq!(errno(b"user."), Errno::EINVAL);
        assert_eq!(errno(b"trusted."), Errno::EINVAL);
        assert_eq!(errno(b"system.data"), Errno::EOPNOTSUPP);
        assert_eq!(errno(b"system.richacl"), Errno::EOPNOTSUPP);
        assert_eq!(errno(b"gnu.translator"), Errno::EOPNOTSUPP);
        assert_eq!(errno(b"nonsense"), Errno::EOPNOTSUPP);
        // 255 bytes in all is the limit.
        let mut max = b"user.".to_vec();
        max.resize(255, b'n');
        assert!(xattr_key(&max).is_ok());
    }
}
