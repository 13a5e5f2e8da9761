//! Open file and directory handles (the `fh` the kernel passes back).
//!
//! A concurrent map from handle number to what `OPEN`/`OPENDIR` created.
//! `READ` and `READDIR` look their handle up under the map's epoch guard and
//! use it in place: no lock, no reference-count change on the hot path
//! (seed 002: using a descriptor costs no atomic on shared state). Handle
//! numbers come from a counter and are never reused while the mount lives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit::{File, FileType};

/// A directory listing taken at `OPENDIR`. `READDIR` offsets index into it
/// (offset `k` resumes after entry `k - 1`), so a listing read in several
/// calls is consistent and offsets stay valid however the directory
/// changes meanwhile (what POSIX asks of `telldir`/`seekdir`).
#[derive(Debug)]
pub struct DirSnapshot {
    /// (name, ext4 inode, type) in on-disk order, "." and ".." included.
    pub entries: Vec<(Vec<u8>, u32, FileType)>,
}

/// What a handle refers to.
#[derive(Debug)]
pub enum Handle {
    /// An open regular file (or other non-directory).
    File(Arc<File>),
    /// An open directory.
    Dir(DirSnapshot),
}

/// The handle table.
#[derive(Debug)]
pub struct Handles {
    map: papaya::HashMap<u64, Handle>,
    next: AtomicU64,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            map: papaya::HashMap::new(),
            next: AtomicU64::new(1),
        }
    }
}

impl Handles {
    /// Store `h`; returns its number.
    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.map.pin().insert(fh, h);
        fh
    }

    /// Run `f` on handle `fh` in place (`None` if there is no such handle).
    pub fn with<R>(&self, fh: u64, f: impl FnOnce(&Handle) -> R) -> Option<R> {
        self.map.pin().get(&fh).map(f)
    }

    /// Close handle `fh`; whether it existed.
    pub fn remove(&self, fh: u64) -> bool {
        self.map.pin().remove(&fh).is_some()
    }

    /// Open handles.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no handle is open.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
