//! Open files: an inode, the dentry it was opened through, and a position.
//!
//! Lock-free dentry references: the inode and dentry are held through an [`OpenRef`] on the
//! opening thread's pin (`vfs::pin`), so opening and closing a file that
//! thread opened before writes no line other threads write.
//!
//! Lock-free lseek: the position is an atomic. SEEK_SET and SEEK_CUR touch only
//! it — no inode lock — and SEEK_END reads the inode's atomic size, so any
//! number of threads can seek their own (or a shared) open file while
//! others read or write the inode.
//!
//! The access mode is checked here (EBADF for a write through a read-only
//! description and vice versa); the data work is in `io.rs` and
//! `writeback.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ext4kit_format::inode::FileType;

use super::cred::{Caller, Cred};
use super::dcache::Dentry;
use super::pin::OpenRef;
use super::request::{Fallocate, WriteAt, WriteRequest};
use super::writeback::SyncLevel;
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

/// The access mode of an open file (the O_ACCMODE bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Access {
    /// O_RDONLY.
    #[default]
    ReadOnly,
    /// O_WRONLY.
    WriteOnly,
    /// O_RDWR.
    ReadWrite,
}

impl Access {
    /// Whether reads are allowed.
    pub fn reads(self) -> bool {
        self != Access::WriteOnly
    }

    /// Whether writes are allowed.
    pub fn writes(self) -> bool {
        self != Access::ReadOnly
    }
}

/// `O_RDONLY` (Linux value).
pub const O_RDONLY: i32 = 0;
/// `O_WRONLY`.
pub const O_WRONLY: i32 = 1;
/// `O_RDWR`.
pub const O_RDWR: i32 = 2;
/// `O_CREAT`.
pub const O_CREAT: i32 = 0o100;
/// `O_EXCL`.
pub const O_EXCL: i32 = 0o200;
/// `O_TRUNC`.
pub const O_TRUNC: i32 = 0o1000;
/// `O_APPEND`.
pub const O_APPEND: i32 = 0o2000;
/// `O_DIRECTORY`.
pub const O_DIRECTORY: i32 = 0o200000;
/// `O_NOFOLLOW`.
pub const O_NOFOLLOW: i32 = 0o400000;
/// `O_DSYNC`: each write's data (and the metadata reading it needs) is
/// durable when the write returns.
pub const O_DSYNC: i32 = 0o10000;
/// `O_SYNC` (`__O_SYNC | O_DSYNC`): each write is durable, metadata and
/// all, when it returns.
pub const O_SYNC: i32 = 0o4010000;

/// Open flags. `Default` is O_RDONLY with nothing else.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Do not follow a symlink in the last component (O_NOFOLLOW).
    pub nofollow: bool,
    /// Fail unless the target is a directory (O_DIRECTORY).
    pub directory: bool,
    /// O_RDONLY / O_WRONLY / O_RDWR.
    pub access: Access,
    /// Create a regular file if the name does not exist (O_CREAT).
    pub create: bool,
    /// With `create`: fail with EEXIST if the name exists (O_EXCL).
    pub excl: bool,
    /// Truncate a regular file to zero length (O_TRUNC).
    pub trunc: bool,
    /// Every write goes to the end of file, atomically (O_APPEND).
    pub append: bool,
    /// Writes are durable when they return: `Some(SyncLevel::Data)` for
    /// O_DSYNC (fdatasync after each), `Some(SyncLevel::All)` for O_SYNC
    /// (fsync after each), as `generic_write_sync`.
    pub sync: Option<SyncLevel>,
}

impl OpenFlags {
    /// Flags from Linux `open(2)` bits (the `O_*` constants of this
    /// module); unknown bits are ignored, as the kernel does.
    pub fn from_bits(bits: i32) -> Self {
        OpenFlags {
            nofollow: bits & O_NOFOLLOW != 0,
            directory: bits & O_DIRECTORY != 0,
            access: match bits & 3 {
                O_WRONLY => Access::WriteOnly,
                O_RDWR => Access::ReadWrite,
                _ => Access::ReadOnly,
            },
            create: bits & O_CREAT != 0,
            excl: bits & O_EXCL != 0,
            trunc: bits & O_TRUNC != 0,
            append: bits & O_APPEND != 0,
            sync: if bits & O_SYNC == O_SYNC {
                Some(SyncLevel::All)
            } else if bits & O_DSYNC != 0 {
                Some(SyncLevel::Data)
            } else {
                None
            },
        }
    }
}

/// An open file description.
#[derive(Debug)]
pub struct File {
    /// The inode (dereferences to `Arc<CachedInode>`), held by one open
    /// on a pin; dropping the file is the close.
    pub inode: OpenRef,
    pos: AtomicU64,
    /// Flags given at open.
    pub flags: OpenFlags,
    /// Who opened it: its writes, truncations and fallocates are made on
    /// the opener's behalf (root's keep setuid/setgid, others' clear them:
    /// `file_remove_privs`; the root reserve).
    pub(crate) opener: Cred,
}

impl File {
    pub(crate) fn new(inode: OpenRef, flags: OpenFlags) -> Self {
        File {
            inode,
            pos: AtomicU64::new(0),
            flags,
            opener: Cred::root(),
        }
    }

    /// A write of `buf` at `at` through this file, by its opener.
    fn write_req<'a>(&'a self, buf: &'a [u8], at: WriteAt) -> WriteRequest<'a> {
        WriteRequest {
            at,
            sync: self.flags.sync,
            ..WriteRequest::new(buf, Caller::new(&self.opener))
        }
    }

    /// The name it was opened through (`None` when opened by inode number).
    pub fn dentry(&self) -> Option<&Arc<Dentry>> {
        self.inode.dentry()
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos.load(Ordering::Relaxed)
    }

    /// Read at the current position and advance it. Concurrent `read`s on
    /// one description may overlap (POSIX leaves that unspecified for
    /// threads); each is atomic with respect to the data it returns.
    pub fn read(&self, fs: &Fs, buf: &mut [u8]) -> Result<usize> {
        self.check_read()?;
        let pos = self.pos.load(Ordering::Relaxed);
        let n = fs.read_at(&self.inode, pos, buf)?;
        self.pos.store(pos + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Read at `off` without touching the position.
    pub fn pread(&self, fs: &Fs, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.check_read()?;
        fs.read_at(&self.inode, off, buf)
    }

    /// Move the position (lock-free: no lock for SET/CUR, the atomic size for END).
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
                // Nothing is found before the start of the file: ENXIO, as
                // for an offset at or past the end (`iomap_seek_data` /
                // `iomap_seek_hole`: `pos < 0 || pos >= size`).
                if off < 0 {
                    return Err(Error::posix(
                        Errno::ENXIO,
                        format!("SEEK_DATA/SEEK_HOLE at negative offset {off}"),
                    ));
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

    fn check_read(&self) -> Result<()> {
        if self.flags.access.reads() {
            Ok(())
        } else {
            Err(Error::posix(Errno::EBADF, "file not open for reading"))
        }
    }

    fn check_write(&self) -> Result<()> {
        if self.flags.access.writes() {
            Ok(())
        } else {
            Err(Error::posix(Errno::EBADF, "file not open for writing"))
        }
    }

    /// Write at the current position (at the end of file, atomically, for
    /// O_APPEND) and advance the position past what was written.
    pub fn write(&self, fs: &Fs, buf: &[u8]) -> Result<usize> {
        self.check_write()?;
        let at = if self.flags.append {
            WriteAt::End
        } else {
            WriteAt::Offset(self.pos.load(Ordering::Relaxed))
        };
        let w = fs.write_inode(&self.inode, &self.write_req(buf, at))?;
        self.pos.store(w.offset + w.len as u64, Ordering::Relaxed);
        Ok(w.len)
    }

    /// Write at `off` without touching the position. As on Linux, an
    /// O_APPEND description appends whatever `off` says.
    pub fn pwrite(&self, fs: &Fs, off: u64, buf: &[u8]) -> Result<usize> {
        self.check_write()?;
        let at = if self.flags.append {
            WriteAt::End
        } else {
            WriteAt::Offset(off)
        };
        Ok(fs.write_inode(&self.inode, &self.write_req(buf, at))?.len)
    }

    /// ftruncate(2): EINVAL unless open for writing (as Linux).
    pub fn ftruncate(&self, fs: &Fs, len: u64) -> Result<()> {
        if !self.flags.access.writes() {
            return Err(Error::posix(Errno::EINVAL, "ftruncate: file not open for writing"));
        }
        fs.truncate_inode(&self.inode, len, &Caller::new(&self.opener))
            .map(|_| ())
    }

    /// fallocate(2) (see [`Fs::fallocate_inode`] for modes and errors).
    pub fn fallocate(&self, fs: &Fs, mode: u32, off: u64, len: u64) -> Result<()> {
        self.check_write()?;
        fs.fallocate_inode(&self.inode, Fallocate { mode, off, len }, &Caller::new(&self.opener))
            .map(|_| ())
    }

    /// fsync(2): dirty pages, then the inode record if dirty at any level,
    /// then a device flush.
    pub fn fsync(&self, fs: &Fs) -> Result<()> {
        fs.fsync_inode(&self.inode, false).map(|_| ())
    }

    /// fdatasync(2): dirty pages, the inode record only if data-relevant
    /// fields changed (size, block map), then a device flush.
    pub fn fdatasync(&self, fs: &Fs) -> Result<()> {
        fs.fsync_inode(&self.inode, true).map(|_| ())
    }
}
