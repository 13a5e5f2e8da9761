//! Open files: an inode, the dentry it was opened through, and a position.
//!
//! Seed 000: the position is an atomic. SEEK_SET and SEEK_CUR touch only
//! it — no inode lock — and SEEK_END reads the inode's atomic size, so any
//! number of threads can seek their own (or a shared) open file while
//! others read or write the inode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit_format::inode::FileType;

use super::dcache::Dentry;
use super::icache::CachedInode;
use super::Fs;
use crate::error::{Errno, Error, Result};

/// `lseek` origins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    /// From the start.
    Set,
    /// From the current position.
    Cur,
    /// From the end of the file.
    End,
    /// Next data at or after the offset.
    Data,
    /// Next hole at or after the offset.
    Hole,
}

/// Open flags the read side understands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Do not follow a symlink in the last component (O_NOFOLLOW).
    pub nofollow: bool,
    /// Fail unless the target is a directory (O_DIRECTORY).
    pub directory: bool,
}

/// An open file description.
#[derive(Debug)]
pub struct File {
    /// The inode.
    pub inode: Arc<CachedInode>,
    /// The name it was opened through (`None` when opened by inode number).
    pub dentry: Option<Arc<Dentry>>,
    pos: AtomicU64,
    /// Flags given at open.
    pub flags: OpenFlags,
}

impl File {
    pub(crate) fn new(inode: Arc<CachedInode>, dentry: Option<Arc<Dentry>>, flags: OpenFlags) -> Self {
        File {
            inode,
            dentry,
            pos: AtomicU64::new(0),
            flags,
        }
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos.load(Ordering::Relaxed)
    }

    /// Read at the current position and advance it. Concurrent `read`s on
    /// one description may overlap (POSIX leaves that unspecified for
    /// threads); each is atomic with respect to the data it returns.
    pub fn read(&self, fs: &Fs, buf: &mut [u8]) -> Result<usize> {
        let pos = self.pos.load(Ordering::Relaxed);
        let n = fs.read_at(&self.inode, pos, buf)?;
        self.pos.store(pos + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Read at `off` without touching the position.
    pub fn pread(&self, fs: &Fs, off: u64, buf: &mut [u8]) -> Result<usize> {
        fs.read_at(&self.inode, off, buf)
    }

    /// Move the position (seed 000: no lock for SET/CUR, atomic size for END).
    pub fn lseek(&self, fs: &Fs, off: i64, whence: Whence) -> Result<u64> {
        let einval = || Error::posix(Errno::EINVAL, format!("lseek to offset {off} is invalid"));
        let to_pos = |base: u64| -> Result<u64> {
            let p = (base as i128) + off as i128;
            if p < 0 || p > i64::MAX as i128 {
                Err(einval())
            } else {
                Ok(p as u64)
            }
        };
        let new = match whence {
            Whence::Set => to_pos(0)?,
            Whence::Cur => {
                // Lock-free read-modify-write of the position only.
                let mut err = None;
                let r = self
                    .pos
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| match to_pos(cur) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            err = Some(e);
                            None
                        }
                    });
                return match r {
                    Ok(prev) => to_pos(prev),
                    Err(_) => Err(err.unwrap_or_else(einval)),
                };
            }
            Whence::End => to_pos(self.inode.size())?,
            Whence::Data | Whence::Hole => {
                if off < 0 {
                    return Err(einval());
                }
                fs.seek_data_hole(&self.inode, off as u64, whence == Whence::Data)?
            }
        };
        self.pos.store(new, Ordering::Relaxed);
        Ok(new)
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.inode.ftype == FileType::Directory
    }
}
