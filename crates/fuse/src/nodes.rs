//! Inode numbers between the kernel and ext4, and the kernel's lookup counts.
//!
//! FUSE calls its root inode 1; ext4's root is inode 2 (inode 1 is the
//! reserved bad-blocks inode and never appears in a directory). The mapping
//! is done here and nowhere else: [`to_ext4`] on every inode the kernel
//! sends, [`to_fuse`] on every inode we hand out.
//!
//! Every positive `LOOKUP`, `READDIRPLUS` entry (and later `CREATE`,
//! `MKDIR`, ...) reply gives the kernel one reference ("lookup count") on
//! the inode, which it returns with `FORGET(ino, n)`. [`Nodes`] counts them
//! and, while the count is above zero, holds an `Arc<CachedInode>`: the
//! inode cache only evicts inodes nobody else references, so an inode the
//! kernel knows about stays in memory (its attributes and page cache too)
//! until the kernel forgets it.
//!
//! Concurrency: the count is incremented *before* the reply is sent and the
//! kernel sends `FORGET` only for replies it has received, so a count never
//! goes below zero. Increment and decrement-to-zero-and-remove must be
//! atomic with respect to each other; a map sharded into 64 mutex-protected
//! parts gives that with short critical sections (no I/O under them) and
//! spreads the traffic of parallel lookups over many locks.

use std::collections::HashMap;
use std::sync::Arc;

use ext4kit::vfs::CachedInode;
use fuser::INodeNo;
use parking_lot::Mutex;

/// ext4's root directory inode.
pub const EXT4_ROOT: u32 = 2;

const SHARDS: usize = 64;

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

/// Kernel lookup counts, each pinning its in-memory inode.
#[derive(Debug)]
pub struct Nodes {
    shards: Box<[Mutex<HashMap<u32, Held>>]>,
}

#[derive(Debug)]
struct Held {
    count: u64,
    _inode: Arc<CachedInode>,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl Nodes {
    fn shard(&self, ino: u32) -> &Mutex<HashMap<u32, Held>> {
        &self.shards[ino as usize % SHARDS]
    }

    /// The kernel was (is about to be) given one more reference to `inode`.
    /// An inode number freed and reused while the kernel still counted the
    /// old inode (unlink, then a create that got the same number) pins the
    /// new in-memory inode from now on.
    pub fn remember(&self, inode: &Arc<CachedInode>) {
        let mut m = self.shard(inode.ino).lock();
        let h = m.entry(inode.ino).or_insert_with(|| Held {
            count: 0,
            _inode: inode.clone(),
        });
        if !Arc::ptr_eq(&h._inode, inode) {
            h._inode = inode.clone();
        }
        h.count += 1;
    }

    /// The kernel dropped `n` references to `ino`; at zero the inode is
    /// released to the inode cache's normal eviction.
    pub fn forget(&self, ino: u32, n: u64) {
        let mut m = self.shard(ino).lock();
        if let Some(h) = m.get_mut(&ino) {
            h.count = h.count.saturating_sub(n);
            if h.count == 0 {
                m.remove(&ino);
            }
        }
    }

    /// The kernel's current count for `ino` (0 when unknown).
    pub fn count(&self, ino: u32) -> u64 {
        self.shard(ino).lock().get(&ino).map_or(0, |h| h.count)
    }

    /// Number of inodes the kernel holds.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether the kernel holds no inode.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    fn counts_pin_inodes_until_forgotten() {
        use ext4kit::ext4::mkfs::{mkfs, MkfsOptions};
        let dev = std::sync::Arc::new(ext4kit_blockdev::MemDevice::new(8 << 20));
        mkfs(&*dev, 8 << 20, &MkfsOptions::default()).unwrap();
        let fs = ext4kit::Fs::open_device(
            dev,
            &ext4kit::OpenOptions {
                read_only: false,
                cache_budget: 8 << 20,
            },
        )
        .unwrap();
        let st = fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        let nodes = Nodes::default();
        let inode = fs.inode(st.ino).unwrap();
        let refs = Arc::strong_count(&inode);
        nodes.remember(&inode);
        nodes.remember(&inode);
        assert_eq!(nodes.count(st.ino), 2);
        // The table holds one reference however many lookups: the inode
        // cache cannot evict it (it only drops inodes nobody references).
        assert_eq!(Arc::strong_count(&inode), refs + 1);
        nodes.forget(st.ino, 1);
        assert_eq!(nodes.count(st.ino), 1);
        nodes.forget(st.ino, 1);
        assert_eq!(nodes.count(st.ino), 0);
        assert!(nodes.is_empty());
        assert_eq!(Arc::strong_count(&inode), refs);
        // A forget for an unknown inode (or too many) is harmless.
        nodes.forget(st.ino, 5);
        nodes.forget(999, 1);
        assert!(nodes.is_empty());
    }
}
