//! Open file and directory handles (the `fh` the kernel passes back).
//!
//! A table from handle number to what `OPEN`/`CREATE`/`OPENDIR` made,
//! sharded into 64 mutex-protected maps (short critical sections: a lookup
//! clones an `Arc`, no I/O under a shard lock). A request takes its own
//! reference to the handle and works outside the lock, so requests on
//! different handles never wait for each other and requests on one handle
//! share only that handle's reference count.
//!
//! Closing must be deterministic: the last close of a file that was
//! unlinked while open frees its inode ([`Fs::close_file`]), and that has to
//! happen when the kernel sends RELEASE, not whenever a deferred-reclamation
//! scheme gets round to dropping the value (an earlier version kept handles
//! in an epoch-reclaimed map; the file's open count then stayed up after
//! RELEASE). [`OpenFile`] closes through the engine when its last reference
//! goes — normally at RELEASE, at the latest when the server shuts down.
//! Handle numbers come from a counter and are never reused while the mount
//! lives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit::{File, FileType, Fs};
use parking_lot::Mutex;

const SHARDS: usize = 64;

/// One part of the table.
type Shard = Mutex<HashMap<u64, Arc<Handle>>>;

/// One entry of a directory listing: name, ext4 inode, type.
pub type DirEntry = (Vec<u8>, u32, FileType);

/// An open directory and the listing its reads index into. `READDIR`
/// offsets index into the listing (offset `k` resumes after entry `k - 1`),
/// so a listing read in several calls is consistent and offsets stay valid
/// however the directory changes meanwhile (what POSIX asks of
/// `telldir`/`seekdir`).
///
/// The listing is taken by the read at offset 0, not at `OPENDIR`: the
/// kernel holds the directory's lock shared for a `READDIR`, and every
/// change to it (create, unlink, rename) holds it exclusively until its
/// reply is applied, so a listing taken there is the directory as of that
/// read. `OPENDIR` holds no lock: a listing taken there and sent later
/// lacked the names created in between, and with `FOPEN_CACHE_DIR` the
/// kernel cached that stale listing as valid for the directory's version
/// at the read — names went missing from every later `ls` until the
/// directory changed again (stress test `directory_readers_...`). A read
/// from offset 0 again (`rewinddir`) sees the directory as it is then, as
/// POSIX asks.
#[derive(Debug)]
pub struct OpenDir {
    /// The directory's inode (FSYNCDIR on the handle).
    pub ino: u32,
    listing: Mutex<Option<Arc<Vec<DirEntry>>>>,
}

impl OpenDir {
    /// An open directory whose listing is taken at its first read.
    pub fn new(ino: u32) -> Self {
        OpenDir {
            ino,
            listing: Mutex::new(None),
        }
    }

    /// The listing a read at `offset` indexes: a new one from `take` at
    /// offset 0 (or when none was taken yet), else the one taken then.
    pub fn listing<E>(
        &self,
        offset: u64,
        take: impl FnOnce() -> Result<Vec<DirEntry>, E>,
    ) -> Result<Arc<Vec<DirEntry>>, E> {
        let mut l = self.listing.lock();
        match &*l {
            Some(cur) if offset != 0 => Ok(cur.clone()),
            _ => {
                let fresh = Arc::new(take()?);
                *l = Some(fresh.clone());
                Ok(fresh)
            }
        }
    }
}

/// An open file that is closed through the engine ([`Fs::close_file`])
/// when dropped, so an unlinked file is freed at its last close.
#[derive(Debug)]
pub struct OpenFile {
    file: Option<Arc<File>>,
    fs: Arc<Fs>,
    /// Opened by root (CAP_FSETID): its writes keep setuid/setgid bits.
    pub privileged: bool,
}

impl OpenFile {
    /// Wrap `file` opened on `fs` by a caller that is `privileged` or not.
    pub fn new(fs: Arc<Fs>, file: Arc<File>, privileged: bool) -> Self {
        OpenFile {
            file: Some(file),
            fs,
            privileged,
        }
    }

    /// The open file description.
    pub fn file(&self) -> &File {
        // Only `drop` takes it out.
        self.file.as_deref().expect("an OpenFile holds its file until dropped")
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            if let Err(e) = self.fs.close_file(f) {
                eprintln!("ext4kit: closing a file: {e}");
            }
        }
    }
}

/// What a handle refers to.
#[derive(Debug)]
pub enum Handle {
    /// An open regular file (or other non-directory).
    File(OpenFile),
    /// An open directory.
    Dir(OpenDir),
}

/// The handle table.
#[derive(Debug)]
pub struct Handles {
    shards: Box<[Shard]>,
    next: AtomicU64,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl Handles {
    fn shard(&self, fh: u64) -> &Shard {
        &self.shards[fh as usize % SHARDS]
    }

    /// Store `h`; returns its number.
    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).lock().insert(fh, Arc::new(h));
        fh
    }

    /// Handle `fh` (`None` if there is no such handle).
    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).lock().get(&fh).cloned()
    }

    /// Run `f` on handle `fh` (`None` if there is no such handle). The
    /// shard lock is not held while `f` runs.
    pub fn with<R>(&self, fh: u64, f: impl FnOnce(&Handle) -> R) -> Option<R> {
        self.get(fh).map(|h| f(&h))
    }

    /// Close handle `fh`; whether it existed. A file handle is closed
    /// through the engine here, unless a request still holds it (then when
    /// that request ends).
    pub fn remove(&self, fh: u64) -> bool {
        let h = self.shard(fh).lock().remove(&fh);
        h.is_some()
    }

    /// Close every handle (server shutdown).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let all: Vec<_> = s.lock().drain().collect();
            drop(all);
        }
    }

    /// Open handles.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no handle is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
