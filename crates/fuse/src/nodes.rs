//! Inode numbers between the kernel and ext4, and the kernel's lookup counts.
//!
//! FUSE calls its root inode 1; ext4's root is inode 2 (inode 1 is the
//! reserved bad-blocks inode and never appears in a directory). The mapping
//! is done here and nowhere else: [`to_ext4`] on every inode the kernel
//! sends, [`to_fuse`] on every inode we hand out.
//!
//! Every positive `LOOKUP`, `READDIRPLUS` entry (and `CREATE`, `MKDIR`,
//! ...) reply gives the kernel one reference ("lookup count") on the
//! inode, which it returns with `FORGET(ino, n)`. [`Nodes`] passes them to
//! the engine as holds (`Fs::hold_inode`, `Fs::drop_holds`), which counts
//! them by inode number (`ext4kit::vfs::holds`): a few bytes per inode the
//! kernel knows, not a cached inode. A held inode that is clean, linked
//! and not open may leave the engine's inode cache (it is read back when
//! next asked about); an unlinked one stays on the orphan list, and in
//! memory, until the last FORGET. (Before, each count pinned an
//! `Arc<CachedInode>` here: a million files created through the mount kept
//! a million cached inodes, 1.2 GiB of server RSS under a 256 MiB cache
//! budget.)
//!
//! Concurrency: the count is incremented *before* the reply is sent and the
//! kernel sends `FORGET` only for replies it has received, so a count never
//! goes below zero. The engine's count is one mutex-protected entry in one
//! of 64 shards: increment and decrement-to-zero are atomic with respect
//! to each other, with no I/O under the lock (see `ext4kit::vfs::holds`
//! for how the first hold and the last one meet an unlink).

use std::sync::Arc;

use ext4kit::vfs::holds::Holds;
use ext4kit::vfs::CachedInode;
use ext4kit::Fs;
use fuser::INodeNo;

/// ext4's root directory inode.
pub const EXT4_ROOT: u32 = 2;

/// The ext4 inode number for a FUSE node id (`None`: not a valid id).
pub fn to_ext4(ino: INodeNo) -> Option<u32> {
    match ino.0 {
        1 => Some(EXT4_ROOT),
        // 2 is never handed out (ext4's 2 is FUSE's 1); 0 is not an inode.
        0 | 2 => None,
        n => u32::try_from(n).ok(),
    }
}

/// The FUSE node id for an ext4 inode number. ext4 inode 1 (bad blocks)
/// has no FUSE id: callers reject directory entries that name it.
pub fn to_fuse(ino: u32) -> INodeNo {
    if ino == EXT4_ROOT {
        INodeNo::ROOT
    } else {
        INodeNo(u64::from(ino))
    }
}

/// The kernel's lookup counts: the engine's holds of the mounted `Fs`.
#[derive(Debug)]
pub struct Nodes {
    /// The engine's table (shared with the `Fs`, which decides by it).
    holds: Arc<Holds>,
}

impl Nodes {
    /// The kernel's counts on `fs`.
    pub fn new(fs: &Fs) -> Self {
        Nodes {
            holds: fs.holds().clone(),
        }
    }

    /// The kernel was (is about to be) given one more reference to `inode`:
    /// one more hold in the engine (`Fs::hold_inode`). Until the kernel
    /// forgets the node id the inode is not freed, even unlinked.
    /// Otherwise its number could be reused while the kernel still sends
    /// requests for the old file, and the kernel, seeing the id come back
    /// with a new generation, marks its inode bad: EIO, ESTALE, another
    /// file's contents, a missed ETXTBSY (found by the stress and
    /// pjdfstest runs). Fails (ENOENT) when the inode was freed since it
    /// was looked up: the reply must then not hand it out.
    pub fn remember(&self, fs: &Fs, inode: &Arc<CachedInode>) -> ext4kit::Result<()> {
        fs.hold_inode(inode)
    }

    /// The kernel dropped `n` references to `ino`; at zero the engine's
    /// hold goes (an unlinked inode is freed now). A failure to free an
    /// unlinked inode can only be reported (FORGET has no reply): it stays
    /// on the orphan list for the next open of the image.
    pub fn forget(&self, fs: &Fs, ino: u32, n: u64) {
        if let Err(e) = fs.drop_holds(ino, n) {
            eprintln!("ext4kit: releasing inode {ino}: {e}");
        }
    }

    /// Drop every hold (the session ended: the kernel sends no FORGET for
    /// what it still had), so unlinked inodes are freed before the final
    /// sync rather than left on the orphan list.
    pub fn release_all(&self, fs: &Fs) {
        if let Err(e) = fs.drop_all_holds() {
            eprintln!("ext4kit: releasing the kernel's inodes: {e}");
        }
    }

    /// The kernel's current count for `ino` (0 when unknown).
    pub fn count(&self, ino: u32) -> u64 {
        self.holds.count(ino)
    }

    /// Number of inodes the kernel holds.
    pub fn len(&self) -> usize {
        self.holds.len()
    }

    /// Whether the kernel holds no inode.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_both_ways_and_nothing_else_moves() {
        assert_eq!(to_ext4(INodeNo::ROOT), Some(2));
        assert_eq!(to_fuse(2), INodeNo::ROOT);
        assert_eq!(to_ext4(to_fuse(12)), Some(12));
        assert_eq!(to_ext4(INodeNo(2)), None);
        assert_eq!(to_ext4(INodeNo(0)), None);
        assert_eq!(to_ext4(INodeNo(1 << 32)), None);
    }

    #[test]
    fn counts_are_kept_by_number_until_forgotten() {
        use ext4kit::mkfs::{mkfs, MkfsOptions};
        let dev = std::sync::Arc::new(ext4kit::device::MemDevice::new(8 << 20));
        mkfs(&*dev, 8 << 20, &MkfsOptions::default()).unwrap();
        let fs = ext4kit::Fs::open_device(
            dev,
            &ext4kit::OpenOptions {
                read_only: false,
                cache_budget: 8 << 20,
                ..Default::default()
            },
        )
        .unwrap();
        let st = fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        let nodes = Nodes::new(&fs);
        let inode = fs.inode(st.ino).unwrap();
        let refs = Arc::strong_count(&inode);
        nodes.remember(&fs, &inode).unwrap();
        nodes.remember(&fs, &inode).unwrap();
        assert_eq!(nodes.count(st.ino), 2);
        // Counted by number: the table holds no reference, so the inode
        // cache may evict the inode (it is clean and linked).
        assert_eq!(Arc::strong_count(&inode), refs);
        nodes.forget(&fs, st.ino, 1);
        assert_eq!(nodes.count(st.ino), 1);
        nodes.forget(&fs, st.ino, 1);
        assert_eq!(nodes.count(st.ino), 0);
        assert!(nodes.is_empty());
        // A forget for an unknown inode (or too many) is harmless.
        nodes.forget(&fs, st.ino, 5);
        nodes.forget(&fs, 999, 1);
        assert!(nodes.is_empty());
    }
}
