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
use ext4kit::Fs;
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
    inode: Arc<CachedInode>,
}

/// Give an inode's hold back to the engine; a failure to free an unlinked
/// inode can only be reported (FORGET has no reply): it stays on the
/// orphan list for the next open of the image.
fn release(fs: &Fs, inode: &CachedInode) {
    if let Err(e) = fs.drop_hold(inode) {
        eprintln!("ext4kit: releasing inode {}: {e}", inode.ino);
    }
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
    /// The first one also holds the inode in the engine
    /// (`Fs::hold_inode`): until the kernel forgets the node id the inode
    /// is not freed, even unlinked. Otherwise its number could be reused
    /// while the kernel still sends requests for the old file, and the
    /// kernel, seeing the id come back with a new generation, marks its
    /// inode bad: EIO, ESTALE, another file's contents, a missed ETXTBSY
    /// (found by the stress and pjdfstest runs). Fails (ENOENT) when the
    /// inode was freed since it was looked up: the reply must then not
    /// hand it out. Releasing a hold may free the inode (I/O), so that
    /// happens with no shard lock held.
    pub fn remember(&self, fs: &Fs, inode: &Arc<CachedInode>) -> ext4kit::Result<()> {
        // Taken first, outside the shard lock (it waits for the inode's
        // lock); if the kernel already had a reference, ours is extra and
        // goes back at once (the existing hold keeps the count above 0).
        fs.hold_inode(inode)?;
        let extra = {
            let mut m = self.shard(inode.ino).lock();
            match m.get_mut(&inode.ino) {
                Some(h) => {
                    h.count += 1;
                    if Arc::ptr_eq(&h.inode, inode) {
                        Some(inode.clone())
                    } else {
                        // A held inode is never freed, so its number cannot
                        // come back as another in-memory inode; should it
                        // anyway, the hold moves to the live one.
                        Some(std::mem::replace(&mut h.inode, inode.clone()))
                    }
                }
                None => {
                    m.insert(
                        inode.ino,
                        Held {
                            count: 1,
                            inode: inode.clone(),
                        },
                    );
                    None
                }
            }
        };
        if let Some(x) = extra {
            release(fs, &x);
        }
        Ok(())
    }

    /// The kernel dropped `n` references to `ino`; at zero the engine's
    /// hold goes (an unlinked inode is freed now) and the inode returns to
    /// the inode cache's normal eviction.
    pub fn forget(&self, fs: &Fs, ino: u32, n: u64) {
        let gone = {
            let mut m = self.shard(ino).lock();
            match m.get_mut(&ino) {
                Some(h) => {
                    h.count = h.count.saturating_sub(n);
                    if h.count == 0 {
                        m.remove(&ino).map(|h| h.inode)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        if let Some(inode) = gone {
            release(fs, &inode);
        }
    }

    /// Drop every hold (the session ended: the kernel sends no FORGET for
    /// what it still had), so unlinked inodes are freed before the final
    /// sync rather than left on the orphan list.
    pub fn release_all(&self, fs: &Fs) {
        for s in self.shards.iter() {
            let all: Vec<Held> = s.lock().drain().map(|(_, h)| h).collect();
            for h in all {
                release(fs, &h.inode);
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
                ..Default::default()
            },
        )
        .unwrap();
        let st = fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        let nodes = Nodes::default();
        let inode = fs.inode(st.ino).unwrap();
        let refs = Arc::strong_count(&inode);
        nodes.remember(&fs, &inode).unwrap();
        nodes.remember(&fs, &inode).unwrap();
        assert_eq!(nodes.count(st.ino), 2);
        // The table holds one reference however many lookups: the inode
        // cache cannot evict it (it only drops inodes nobody references).
        assert_eq!(Arc::strong_count(&inode), refs + 1);
        nodes.forget(&fs, st.ino, 1);
        assert_eq!(nodes.count(st.ino), 1);
        nodes.forget(&fs, st.ino, 1);
        assert_eq!(nodes.count(st.ino), 0);
        assert!(nodes.is_empty());
        assert_eq!(Arc::strong_count(&inode), refs);
        // A forget for an unknown inode (or too many) is harmless.
        nodes.forget(&fs, st.ino, 5);
        nodes.forget(&fs, 999, 1);
        assert!(nodes.is_empty());
    }
}
