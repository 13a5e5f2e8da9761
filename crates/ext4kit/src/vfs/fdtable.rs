//! Descriptor tables: lookup without atomics while the table is not shared.
//!
//! A [`Process`] owns a table of open files indexed by small integers.
//! While the table is not shared (the common case: one thread per
//! process-like handle), a lookup is a plain vector index that borrows the
//! file: no atomic operation, no lock, no reference count. Once shared
//! ([`Process::share`], the `CLONE_FILES` analogue), lookups are lock-free
//! reads of a concurrent map under an epoch guard — still without taking a
//! reference; [`Process::get_file`] clones the `Arc` only when the caller
//! needs the file to outlive the call.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::file::{File, OpenFlags, Whence};
use super::{Cred, Fs};
use crate::error::{Errno, Error, Result};

/// A file descriptor.
pub type Fd = i32;

/// Most descriptors one table holds (the RLIMIT_NOFILE analogue).
pub const DEFAULT_MAX_FDS: usize = 1 << 20;

#[derive(Debug)]
struct SharedTable {
    files: ext4kit_cache::map::Map<Fd, Arc<File>>,
    /// Serialises allocation of numbers (open/close), never lookups.
    alloc: Mutex<Vec<Fd>>,
    next: AtomicI32,
}

#[derive(Debug)]
enum Table {
    Unshared(Vec<Option<Arc<File>>>),
    Shared(Arc<SharedTable>),
}

/// A process-like handle: a descriptor table bound to a filesystem.
///
/// `Process` is `Send` but not `Sync`: one thread uses it at a time, which
/// is what makes the unshared fast path sound without atomics.
#[derive(Debug)]
pub struct Process {
    fs: Arc<Fs>,
    table: Table,
    max_fds: usize,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl Process {
    /// A new process with an empty, unshared table.
    pub fn new(fs: Arc<Fs>) -> Self {
        Process {
            fs,
            table: Table::Unshared(Vec::new()),
            max_fds: DEFAULT_MAX_FDS,
            _not_sync: Default::default(),
        }
    }

    /// Limit the number of open descriptors (EMFILE beyond).
    pub fn set_max_fds(&mut self, n: usize) {
        self.max_fds = n;
    }

    /// The filesystem.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// Share the table with a new handle (like a thread made with
    /// CLONE_FILES). Both handles see the same descriptors from now on.
    pub fn share(&mut self) -> Process {
        if let Table::Unshared(v) = &mut self.table {
            let files = ext4kit_cache::map::new();
            let mut free = Vec::new();
            {
                let m = files.pin();
                for (i, f) in v.drain(..).enumerate() {
                    match f {
                        Some(f) => {
                            m.insert(i as Fd, f);
                        }
                        None => free.push(i as Fd),
                    }
                }
            }
            let next = files.len() as i32 + free.len() as i32;
            self.table = Table::Shared(Arc::new(SharedTable {
                files,
                alloc: Mutex::new(free),
                next: AtomicI32::new(next),
            }));
        }
        let Table::Shared(t) = &self.table else {
            unreachable!("table was just made shared")
        };
        Process {
            fs: self.fs.clone(),
            table: Table::Shared(t.clone()),
            max_fds: self.max_fds,
            _not_sync: Default::default(),
        }
    }

    /// Whether the table is shared.
    pub fn is_shared(&self) -> bool {
        matches!(self.table, Table::Shared(_))
    }

    /// Install `file` at the lowest free number.
    pub fn install(&mut self, file: Arc<File>) -> Result<Fd> {
        let max = self.max_fds;
        let emfile = || Error::posix(Errno::EMFILE, format!("too many open files (limit {max})"));
        match &mut self.table {
            Table::Unshared(v) => {
                if let Some(i) = v.iter().position(|s| s.is_none()) {
                    v[i] = Some(file);
                    return Ok(i as Fd);
                }
                if v.len() >= max {
                    return Err(emfile());
                }
                v.push(Some(file));
                Ok((v.len() - 1) as Fd)
            }
            Table::Shared(t) => {
                let mut free = t.alloc.lock();
                free.sort_unstable_by(|a, b| b.cmp(a));
                let fd = match free.pop() {
                    Some(fd) => fd,
                    None => {
                        let fd = t.next.load(Ordering::Relaxed);
                        if fd as usize >= max {
                            return Err(emfile());
                        }
                        t.next.store(fd + 1, Ordering::Relaxed);
                        fd
                    }
                };
                t.files.pin().insert(fd, file);
                Ok(fd)
            }
        }
    }

    /// Open `path` and return a descriptor.
    pub fn open(&mut self, path: impl AsRef<[u8]>, flags: OpenFlags) -> Result<Fd> {
        let f = self.fs.open(path.as_ref(), flags)?;
        self.install(f)
    }

    /// Open `path` with `cred`'s permissions (O_CREAT makes a regular file
    /// with permission bits `mode`) and return a descriptor.
    pub fn open_as(&mut self, path: impl AsRef<[u8]>, flags: OpenFlags, mode: u16, cred: &Cred) -> Result<Fd> {
        let f = self.fs.open_as(path.as_ref(), flags, mode, cred)?;
        self.install(f)
    }

    /// Run `f` with the file behind `fd` borrowed — no reference taken.
    #[inline]
    pub fn with_file<R>(&self, fd: Fd, f: impl FnOnce(&File) -> Result<R>) -> Result<R> {
        let ebadf = || Error::posix(Errno::EBADF, format!("bad file descriptor {fd}"));
        match &self.table {
            // Unshared table: a plain index, no atomic, no lock (only this
            // thread can reach it, as the kernel's files_lookup_fd_raw when
            // files->count is 1).
            Table::Unshared(v) => match usize::try_from(fd).ok().and_then(|i| v.get(i)) {
                Some(Some(file)) => f(file),
                _ => Err(ebadf()),
            },
            Table::Shared(t) => {
                let m = t.files.pin();
                match m.get(&fd) {
                    Some(file) => f(file),
                    None => Err(ebadf()),
                }
            }
        }
    }

    /// The file behind `fd`, with a reference that outlives this call.
    pub fn get_file(&self, fd: Fd) -> Result<Arc<File>> {
        match &self.table {
            Table::Unshared(v) => usize::try_from(fd).ok().and_then(|i| v.get(i)).and_then(|s| s.clone()),
            Table::Shared(t) => t.files.pin().get(&fd).cloned(),
        }
        .ok_or_else(|| Error::posix(Errno::EBADF, format!("bad file descriptor {fd}")))
    }

    /// Read from `fd` at its position.
    pub fn read(&self, fd: Fd, buf: &mut [u8]) -> Result<usize> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.read(fs, buf))
    }

    /// Read from `fd` at `off`.
    pub fn pread(&self, fd: Fd, buf: &mut [u8], off: u64) -> Result<usize> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.pread(fs, off, buf))
    }

    /// Reposition `fd`.
    pub fn lseek(&self, fd: Fd, off: i64, whence: Whence) -> Result<u64> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.lseek(fs, off, whence))
    }

    /// Write to `fd` at its position (at the end for O_APPEND).
    pub fn write(&self, fd: Fd, buf: &[u8]) -> Result<usize> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.write(fs, buf))
    }

    /// Write to `fd` at `off`.
    pub fn pwrite(&self, fd: Fd, buf: &[u8], off: u64) -> Result<usize> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.pwrite(fs, off, buf))
    }

    /// Set the size of the file behind `fd`.
    pub fn ftruncate(&self, fd: Fd, len: u64) -> Result<()> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.ftruncate(fs, len))
    }

    /// fallocate(2) on `fd` (modes: `vfs::io::FALLOC_FL_*`).
    pub fn fallocate(&self, fd: Fd, mode: u32, off: u64, len: u64) -> Result<()> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.fallocate(fs, mode, off, len))
    }

    /// fsync(2).
    pub fn fsync(&self, fd: Fd) -> Result<()> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.fsync(fs))
    }

    /// fdatasync(2).
    pub fn fdatasync(&self, fd: Fd) -> Result<()> {
        let fs = &self.fs;
        self.with_file(fd, |f| f.fdatasync(fs))
    }

    /// Duplicate `fd` onto the lowest free number (shares the position).
    pub fn dup(&mut self, fd: Fd) -> Result<Fd> {
        let f = self.get_file(fd)?;
        self.install(f)
    }

    /// Close `fd`.
    pub fn close(&mut self, fd: Fd) -> Result<()> {
        let ebadf = || Error::posix(Errno::EBADF, format!("bad file descriptor {fd}"));
        let file = match &mut self.table {
            Table::Unshared(v) => {
                let slot = usize::try_from(fd).ok().and_then(|i| v.get_mut(i)).ok_or_else(ebadf)?;
                slot.take().ok_or_else(ebadf)?
            }
            Table::Shared(t) => {
                let mut free = t.alloc.lock();
                let f = t.files.pin().remove(&fd).cloned().ok_or_else(ebadf)?;
                free.push(fd);
                f
            }
        };
        // The last close of an unlinked file frees it.
        self.fs.close_file(file)
    }
}

#[cfg(test)]
mod tests {
    fn assert_send<T: Send>() {}

    #[test]
    fn process_is_send() {
        assert_send::<super::Process>();
    }
}
