//! Export support: file handles (`name_to_handle_at`, NFS export) that
//! survive the kernel dropping its caches and remounts.
//!
//! The kernel's FUSE file handle is the node id and the generation
//! (`fuse_encode_fh`). Our node ids are ext4 inode numbers
//! ([`crate::nodes`]) and generations are ext4's `i_generation`, so both
//! are stable across remounts. When the kernel no longer has the inode
//! (`fuse_get_dentry` after its cache was dropped, or on a new mount) it
//! sends LOOKUP(node id, ".") — for any kind of inode — and compares the
//! generation it gets with the handle's (ESTALE if they differ); to
//! connect a directory to the tree it sends LOOKUP(dir, "..")
//! (`fuse_get_parent`). Negotiated with `FUSE_EXPORT_SUPPORT`.
//!
//! A node id the kernel sends in a LOOKUP of "." comes from a handle, i.e.
//! from the user: the engine checks it as ext4's `ext4_nfs_get_inode` does
//! ([`Fs::stat_by_handle`]: ESTALE for a reserved inode other than the
//! root, a number past `s_inodes_count`, or an inode that is free or
//! unlinked) before anything is read for it.
//!
//! The root's generation is always 0 in our replies: the kernel made its
//! root inode with generation 0 at mount (`fuse_get_root_inode`), and a
//! reply naming node 1 with another generation would make it think the
//! root was replaced and mark it bad (`fuse_stale_inode`).

use ext4kit::{Fs, Stat};
use fuser::Errno;

use crate::errno::res;
use crate::nodes::EXT4_ROOT;

/// The generation the kernel is given for ext4 inode `ino` whose
/// `i_generation` is `generation` (0 for the root, see the module doc).
pub fn generation(ino: u32, generation: u32) -> u64 {
    if ino == EXT4_ROOT {
        0
    } else {
        u64::from(generation)
    }
}

/// The inode a file handle names, for LOOKUP(`ino`, "."): its attributes,
/// or ESTALE when no such live inode exists (the engine's check,
/// [`Fs::stat_by_handle`], as ext4's `ext4_nfs_get_inode`).
pub fn lookup_self(fs: &Fs, ino: u32) -> Result<Stat, Errno> {
    res(fs.stat_by_handle(ino))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit::mkfs::{mkfs, MkfsOptions};

    #[test]
    fn handles_name_live_inodes_only() {
        let dev = std::sync::Arc::new(ext4kit::device::MemDevice::new(8 << 20));
        mkfs(&*dev, 8 << 20, &MkfsOptions::default()).unwrap();
        let fs = Fs::open_device(
            dev,
            &ext4kit::OpenOptions {
                read_only: false,
                cache_budget: 8 << 20,
                ..Default::default()
            },
        )
        .unwrap();
        let st = fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        assert_eq!(lookup_self(&fs, st.ino).unwrap().ino, st.ino);
        assert_eq!(lookup_self(&fs, EXT4_ROOT).unwrap().ino, EXT4_ROOT);
        // Reserved (the journal, 8), unused and out-of-range numbers.
        assert_eq!(lookup_self(&fs, 8).unwrap_err(), Errno::ESTALE);
        assert_eq!(lookup_self(&fs, st.ino + 1).unwrap_err(), Errno::ESTALE);
        assert_eq!(lookup_self(&fs, u32::MAX).unwrap_err(), Errno::ESTALE);
        assert_eq!(generation(EXT4_ROOT, 77), 0);
        assert_eq!(generation(12, 77), 77);
    }
}
