//! A host directory tree as a source (`mke2fs -d DIR`, `cp -a`): type,
//! permission bits, owner, atime and mtime with nanoseconds, contents with
//! their holes (found with `SEEK_DATA` / `SEEK_HOLE`), symlink targets,
//! device numbers, xattrs (POSIX ACLs included), and hard links, which are
//! reported with the host file's identity so the writer links them.
//!
//! Entries come in byte order of their names, a directory's files before
//! its subdirectories, one directory at a time: the same tree always gives
//! the same order, and so the same image. Reading leaves the tree as it
//! was: files and directories are opened with `O_NOATIME` where we may,
//! and a symlink's atime, which `readlink` moves, is put back.

use std::fs::Metadata;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ext4kit::Timestamp;
use rustix::fs::SeekFrom;

use super::{Sink, Source};
use crate::entry::{Entry, EntryKind, EntryPath, FileData, Meta, Xattrs};
use crate::error::{Error, Result};

/// A host directory.
pub struct DirSource {
    root: PathBuf,
    /// Follow the root if it is a symlink (`DIR/.` names what DIR points
    /// to, as `cp -a DIR/. DEST` does).
    follow_root: bool,
}

impl DirSource {
    /// The tree below `root`, `root` itself as the entry at the tree's
    /// root.
    pub fn new(root: &Path) -> Self {
        DirSource {
            root: root.to_path_buf(),
            follow_root: true,
        }
    }

    /// One host path that need not be a directory (`put FILE IMAGE:DEST`):
    /// a symlink is copied as a symlink.
    pub fn entry(path: &Path, follow: bool) -> Self {
        DirSource {
            root: path.to_path_buf(),
            follow_root: follow,
        }
    }

    fn err(&self, p: &Path, reason: impl std::fmt::Display) -> Error {
        Error::entry(
            self.root.display().to_string(),
            p.display().to_string(),
            reason.to_string(),
        )
    }

    /// The entry for host path `p` at tree path `at`.
    fn entry_for(&self, p: &Path, md: &Metadata, at: EntryPath) -> Result<Entry> {
        let ft = md.file_type();
        let (major, minor) = (rustix::fs::major(md.rdev()), rustix::fs::minor(md.rdev()));
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_symlink() {
            let t = read_link_keep_atime(p, md).map_err(|e| self.err(p, e))?;
            EntryKind::Symlink(t.as_os_str().as_bytes().to_vec())
        } else if ft.is_file() {
            EntryKind::File { size: md.len() }
        } else if ft.is_fifo() {
            EntryKind::Fifo
        } else if ft.is_socket() {
            EntryKind::Socket
        } else if ft.is_char_device() {
            EntryKind::CharDevice(major, minor)
        } else {
            EntryKind::BlockDevice(major, minor)
        };
        let identity = (!ft.is_dir() && md.nlink() > 1).then(|| (md.dev(), md.ino()));
        Ok(Entry {
            path: at,
            kind,
            meta: Meta {
                perm: (md.mode() & 0o7777) as u16,
                uid: md.uid(),
                gid: md.gid(),
                atime: ts(md.atime(), md.atime_nsec()),
                mtime: ts(md.mtime(), md.mtime_nsec()),
            },
            xattrs: read_xattrs(p).map_err(|e| self.err(p, e))?,
            identity,
        })
    }

    /// Report one entry, with its data if it is a regular file.
    fn report(&self, sink: &mut dyn Sink, p: &Path, md: &Metadata, e: &Entry) -> Result<()> {
        if let EntryKind::File { size } = e.kind {
            let fd = open_noatime(p, false).map_err(|err| self.err(p, err))?;
            // A file with a block allocated for every block of its size
            // has no hole to look for: one data region, without two seeks
            // per file (a third of the syscalls of a small file).
            let dense = md.blocks() * 512 >= size.div_ceil(4096) * 4096;
            let end = if dense { size } else { 0 };
            let mut data = HostData { fd, size, pos: 0, end };
            sink.entry(e, Some(&mut data))
        } else {
            sink.entry(e, None)
        }
    }
}

impl Source for DirSource {
    fn name(&self) -> String {
        self.root.display().to_string()
    }

    fn visit(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let md = if self.follow_root {
            std::fs::metadata(&self.root)
        } else {
            std::fs::symlink_metadata(&self.root)
        }
        .map_err(|e| Error::source(&self.root, e.to_string()))?;
        let root = self.entry_for(&self.root, &md, EntryPath::root())?;
        self.report(sink, &self.root, &md, &root)?;
        if !md.is_dir() {
            return Ok(());
        }
        let mut stack = vec![(self.root.clone(), EntryPath::root())];
        while let Some((dir, at)) = stack.pop() {
            let mut kids = list_dir(&dir).map_err(|e| self.err(&dir, e))?;
            // Byte order of names: the same tree, the same order.
            kids.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
            let mut dirs = Vec::new();
            for k in kids {
                let md = std::fs::symlink_metadata(&k).map_err(|e| self.err(&k, e))?;
                let name = k.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
                let e = self.entry_for(&k, &md, at.join(&name))?;
                self.report(sink, &k, &md, &e)?;
                if md.is_dir() {
                    dirs.push((k, e.path));
                }
            }
            // Subdirectories after the files of this level, in order.
            stack.extend(dirs.into_iter().rev());
        }
        Ok(())
    }
}

fn ts(sec: i64, nsec: i64) -> Timestamp {
    Timestamp {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// Open `p` for reading without updating its atime where we may (owner or
/// root: `O_NOATIME`), so building an image leaves the source tree as it
/// was — and two builds of one tree see the same atimes.
fn open_noatime(p: &Path, dir: bool) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let base = OFlags::RDONLY | OFlags::CLOEXEC | if dir { OFlags::DIRECTORY } else { OFlags::empty() };
    match rustix::fs::open(p, base | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => Ok(rustix::fs::open(p, base, Mode::empty())?),
        r => Ok(r?),
    }
}

/// The entries of host directory `p` (without "." and ".."), read without
/// touching its atime.
pub(crate) fn list_dir(p: &Path) -> std::io::Result<Vec<PathBuf>> {
    let fd = open_noatime(p, true)?;
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(&fd)? {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(p.join(std::ffi::OsStr::from_bytes(name)));
        }
    }
    Ok(out)
}

/// readlink(2) updates a symlink's atime and there is no O_NOATIME for it:
/// put the atime back (as `tar --atime-preserve=replace` does) when we may.
fn read_link_keep_atime(p: &Path, md: &Metadata) -> std::io::Result<PathBuf> {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let t = std::fs::read_link(p)?;
    if std::fs::symlink_metadata(p).is_ok_and(|now| now.atime() != md.atime() || now.atime_nsec() != md.atime_nsec()) {
        let ts = Timestamps {
            last_access: Timespec {
                tv_sec: md.atime(),
                tv_nsec: md.atime_nsec(),
            },
            last_modification: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
        };
        let _ = utimensat(CWD, p, &ts, AtFlags::SYMLINK_NOFOLLOW);
    }
    Ok(t)
}

/// Every xattr of host path `p` (not following a symlink); none where the
/// host filesystem has no xattrs.
fn read_xattrs(p: &Path) -> std::result::Result<Xattrs, String> {
    let mut names = vec![0u8; 65536];
    let n = match rustix::fs::llistxattr(p, &mut names) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(format!("listing xattrs: {e}")),
    };
    let mut out = Vec::new();
    let mut val = vec![0u8; 65536];
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let os = std::ffi::OsStr::from_bytes(name);
        let len = rustix::fs::lgetxattr(p, os, &mut val)
            .map_err(|e| format!("xattr {}: {e}", String::from_utf8_lossy(name)))?;
        out.push((name.to_vec(), val[..len].to_vec()));
    }
    Ok(out)
}

/// A host file's data regions, found with SEEK_DATA / SEEK_HOLE.
struct HostData {
    fd: OwnedFd,
    size: u64,
    /// The next byte to read, and the end of its data region.
    pos: u64,
    end: u64,
}

impl FileData for HostData {
    fn read_segment(&mut self, buf: &mut [u8]) -> std::io::Result<Option<(u64, usize)>> {
        loop {
            if self.pos >= self.size {
                return Ok(None);
            }
            if self.pos >= self.end {
                // Next data region [start, end); ENXIO: no more data.
                let start = match rustix::fs::seek(&self.fd, SeekFrom::Data(self.pos)) {
                    Ok(s) => s,
                    Err(rustix::io::Errno::NXIO) => return Ok(None),
                    Err(_) => self.pos, // no SEEK_DATA here: everything is data
                };
                self.pos = start;
                self.end = rustix::fs::seek(&self.fd, SeekFrom::Hole(start))
                    .unwrap_or(self.size)
                    .min(self.size);
                if self.end <= start {
                    // No hole after it that the host would say: read to the end.
                    self.end = self.size;
                }
                continue;
            }
            let want = ((self.end - self.pos) as usize).min(buf.len());
            let n = rustix::io::pread(&self.fd, &mut buf[..want], self.pos)?;
            if n == 0 {
                // The file shrank under us: what is left reads as a hole.
                return Ok(None);
            }
            let at = self.pos;
            self.pos += n as u64;
            return Ok(Some((at, n)));
        }
    }
}
