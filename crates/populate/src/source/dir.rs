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
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ext4kit::Timestamp;
use rustix::fs::SeekFrom;

use super::{Sink, Source};
use crate::entry::{Entry, EntryKind, EntryPath, FileData, Meta, Xattrs};
use crate::error::{Error, Result};

/// What the walk needs of a host file's inode, from `lstat` of the root
/// or `statat` in its directory.
#[derive(Debug, Clone, Copy)]
struct HostStat {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    blocks: u64,
    nlink: u64,
    dev: u64,
    ino: u64,
    rdev: u64,
    atime: Timestamp,
    mtime: Timestamp,
}

impl HostStat {
    fn of_metadata(md: &Metadata) -> Self {
        HostStat {
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            size: md.len(),
            blocks: md.blocks(),
            nlink: md.nlink(),
            dev: md.dev(),
            ino: md.ino(),
            rdev: md.rdev(),
            atime: ts(md.atime(), md.atime_nsec()),
            mtime: ts(md.mtime(), md.mtime_nsec()),
        }
    }

    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    fn of_stat(st: &rustix::fs::Stat) -> Self {
        HostStat {
            mode: st.st_mode as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            nlink: st.st_nlink as u64,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            rdev: st.st_rdev as u64,
            atime: ts(st.st_atime as i64, st.st_atime_nsec as i64),
            mtime: ts(st.st_mtime as i64, st.st_mtime_nsec as i64),
        }
    }

    fn kind(&self) -> rustix::fs::FileType {
        rustix::fs::FileType::from_raw_mode(self.mode as rustix::fs::RawMode)
    }
}

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

    /// The entry for host path `p` (named `name` in directory `dir`, when
    /// the walk has the directory open) at tree path `at`.
    fn entry_for(&self, p: &Path, at_dir: Option<(&OwnedFd, &[u8])>, st: &HostStat, at: EntryPath) -> Result<Entry> {
        use rustix::fs::FileType as T;
        let (major, minor) = (rustix::fs::major(st.rdev), rustix::fs::minor(st.rdev));
        let ft = st.kind();
        let kind = match ft {
            T::Directory => EntryKind::Dir,
            T::Symlink => {
                let t = read_link_keep_atime(p, at_dir, st).map_err(|e| self.err(p, e))?;
                EntryKind::Symlink(t)
            }
            T::RegularFile => EntryKind::File { size: st.size },
            T::Fifo => EntryKind::Fifo,
            T::Socket => EntryKind::Socket,
            T::CharacterDevice => EntryKind::CharDevice(major, minor),
            _ => EntryKind::BlockDevice(major, minor),
        };
        let identity = (ft != T::Directory && st.nlink > 1).then_some((st.dev, st.ino));
        Ok(Entry {
            path: at,
            kind,
            meta: Meta {
                perm: (st.mode & 0o7777) as u16,
                uid: st.uid,
                gid: st.gid,
                atime: st.atime,
                mtime: st.mtime,
            },
            xattrs: Vec::new(),
            identity,
        })
    }

    /// Report one entry, with its xattrs and, for a regular file, its data.
    /// A file or directory is opened (in its directory, when the walk has
    /// that open: no path walk per entry) and its xattrs read through the
    /// descriptor; the others' xattrs are read by path.
    fn report(
        &self,
        emit: &mut Emit<'_>,
        p: &Path,
        at_dir: Option<(&OwnedFd, &[u8])>,
        st: &HostStat,
        mut e: Entry,
    ) -> Result<Option<OwnedFd>> {
        let openable = matches!(e.kind, EntryKind::File { .. } | EntryKind::Dir);
        let fd = if openable {
            let dir = e.kind == EntryKind::Dir;
            let fd = match at_dir {
                Some((d, name)) => open_noatime_at(d, name, dir),
                None => open_noatime(p, dir),
            };
            Some(fd.map_err(|err| self.err(p, err))?)
        } else {
            None
        };
        e.xattrs = match &fd {
            Some(fd) => read_xattrs(XattrOf::Fd(fd)),
            None => read_xattrs(XattrOf::Path(p)),
        }
        .map_err(|err| self.err(p, err))?;
        match (&e.kind, fd) {
            (&EntryKind::File { size }, Some(fd)) => {
                // A file with a block allocated for every block of its
                // size has no hole to look for: one data region, without
                // two seeks per file.
                let dense = st.blocks * 512 >= size.div_ceil(4096) * 4096;
                let end = if dense { size } else { 0 };
                emit(e, Some(HostData { fd, size, pos: 0, end }))?;
                Ok(None)
            }
            (_, fd) => {
                emit(e, None)?;
                Ok(fd)
            }
        }
    }
}

impl Source for DirSource {
    fn name(&self) -> String {
        self.root.display().to_string()
    }

    /// The walk runs on a thread of its own, a bounded queue ahead of the
    /// sink: the host's calls (statat, openat, xattrs, a small file's
    /// read) overlap the image's side instead of adding to it. The order
    /// is the walk's, so the image is the same.
    fn visit(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<(Entry, Option<Data>)>>>(AHEAD);
        let this = &*self;
        std::thread::scope(|scope| {
            let walker = scope.spawn(move || {
                // Entries go over in batches: a wake-up of the sink per
                // entry cost more than the walk saved.
                let mut batch = Vec::with_capacity(BATCH);
                let mut bytes = 0;
                let r = this.walk(&mut |e, data| {
                    let data = data.map(Data::take);
                    if let Some(Data::Mem { buf, .. }) = &data {
                        bytes += buf.len();
                    }
                    batch.push((e, data));
                    if batch.len() < BATCH && bytes < BATCH_BYTES {
                        return Ok(());
                    }
                    bytes = 0;
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    // The sink gave up (it returned an error): stop.
                    tx.send(Ok(full))
                        .map_err(|_| Error::source(&this.root, "the build stopped"))
                });
                let _ = match r {
                    Ok(()) => tx.send(Ok(batch)),
                    Err(e) => tx.send(Err(e)),
                };
            });
            let mut result = Ok(());
            'items: for batch in rx.iter() {
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                };
                for (e, mut data) in batch {
                    let r = match &mut data {
                        Some(d) => sink.entry(&e, Some(d)),
                        None => sink.entry(&e, None),
                    };
                    if let Err(e) = r {
                        result = Err(e);
                        break 'items;
                    }
                }
            }
            // Dropping the receiver makes the walker's next send fail.
            drop(rx);
            if walker.join().is_err() {
                return Err(Error::source(&self.root, "the directory walk panicked"));
            }
            result
        })
    }
}

impl DirSource {
    /// The walk: every entry, in order, to `emit`.
    fn walk(&self, emit: &mut Emit<'_>) -> Result<()> {
        let md = if self.follow_root {
            std::fs::metadata(&self.root)
        } else {
            std::fs::symlink_metadata(&self.root)
        }
        .map_err(|e| Error::source(&self.root, e.to_string()))?;
        let st = HostStat::of_metadata(&md);
        let root = self.entry_for(&self.root, None, &st, EntryPath::root())?;
        let Some(root_fd) = self.report(emit, &self.root, None, &st, root)? else {
            return Ok(());
        };
        // Directories still to read: their host path and tree path, and
        // the descriptor when it is open already (pending directories are
        // opened when their turn comes: a wide tree must not hold a
        // descriptor for each).
        let mut stack = vec![(self.root.clone(), EntryPath::root(), Some(root_fd))];
        while let Some((dir, at, fd)) = stack.pop() {
            let dfd = match fd {
                Some(fd) => fd,
                None => open_noatime(&dir, true).map_err(|e| self.err(&dir, e))?,
            };
            let mut names = list_dir(&dfd).map_err(|e| self.err(&dir, e))?;
            // Byte order of names: the same tree, the same order.
            names.sort();
            let mut dirs = Vec::new();
            for name in names {
                let k = dir.join(std::ffi::OsStr::from_bytes(&name));
                let st = rustix::fs::statat(&dfd, name.as_slice(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| HostStat::of_stat(&s))
                    .map_err(|e| self.err(&k, e))?;
                let e = self.entry_for(&k, Some((&dfd, &name)), &st, at.join(&name))?;
                let path = e.path.clone();
                // A subdirectory's descriptor is not kept: it is opened
                // again when its turn comes.
                if self.report(emit, &k, Some((&dfd, &name)), &st, e)?.is_some() {
                    dirs.push((k, path, None));
                }
            }
            // Subdirectories after the files of this level, in order.
            stack.extend(dirs.into_iter().rev());
        }
        Ok(())
    }
}

/// Where the walk hands each entry, with a regular file's open data.
type Emit<'a> = dyn FnMut(Entry, Option<HostData>) -> Result<()> + 'a;

/// Batches the walk may run ahead of the sink.
const AHEAD: usize = 4;

/// Entries per batch, and the file bytes read whole after which a batch
/// goes anyway: the queue holds at most `AHEAD` × (`BATCH_BYTES` + `SMALL`).
const BATCH: usize = 32;
const BATCH_BYTES: usize = 1 << 20;

/// A file the walker reads whole before handing it over: up to this size
/// (and without holes).
const SMALL: u64 = 64 << 10;

/// A file's data as it crosses from the walker to the sink: read whole
/// by the walker when small and dense, else the open file itself.
enum Data {
    Mem { buf: Vec<u8>, pos: usize },
    Host(HostData),
}

impl Data {
    fn take(h: HostData) -> Data {
        if h.end != h.size || h.size > SMALL {
            return Data::Host(h);
        }
        let mut buf = vec![0u8; h.size as usize];
        let mut got = 0;
        while got < buf.len() {
            match rustix::io::pread(&h.fd, &mut buf[got..], got as u64) {
                // The file shrank under us: what is left reads as a hole.
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                // Read again by the sink, which reports the error.
                Err(_) => return Data::Host(h),
            }
        }
        buf.truncate(got);
        Data::Mem { buf, pos: 0 }
    }
}

impl FileData for Data {
    fn read_segment(&mut self, out: &mut [u8]) -> std::io::Result<Option<(u64, usize)>> {
        match self {
            Data::Mem { buf, pos } => {
                let n = (buf.len() - *pos).min(out.len());
                if n == 0 {
                    return Ok(None);
                }
                out[..n].copy_from_slice(&buf[*pos..*pos + n]);
                let at = *pos as u64;
                *pos += n;
                Ok(Some((at, n)))
            }
            Data::Host(h) => h.read_segment(out),
        }
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

/// [`open_noatime`] for `name` in the open directory `dir`.
fn open_noatime_at(dir: &OwnedFd, name: &[u8], is_dir: bool) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let base =
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | if is_dir { OFlags::DIRECTORY } else { OFlags::empty() };
    match rustix::fs::openat(dir, name, base | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => Ok(rustix::fs::openat(dir, name, base, Mode::empty())?),
        r => Ok(r?),
    }
}

/// The names in an open host directory (without "." and "..").
fn list_dir(fd: &OwnedFd) -> std::io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(fd)? {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    Ok(out)
}

/// readlink(2) updates a symlink's atime and there is no O_NOATIME for it:
/// put the atime back (as `tar --atime-preserve=replace` does) when we may.
fn read_link_keep_atime(p: &Path, at_dir: Option<(&OwnedFd, &[u8])>, st: &HostStat) -> std::io::Result<Vec<u8>> {
    use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let (dir, name): (rustix::fd::BorrowedFd<'_>, Vec<u8>) = match at_dir {
        Some((d, n)) => (d.as_fd(), n.to_vec()),
        None => (CWD, p.as_os_str().as_bytes().to_vec()),
    };
    let t = rustix::fs::readlinkat(dir, name.as_slice(), Vec::new())?.into_bytes();
    let now = rustix::fs::statat(dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW).map(|s| HostStat::of_stat(&s));
    if now.is_ok_and(|n| n.atime != st.atime) {
        let ts = Timestamps {
            last_access: Timespec {
                tv_sec: st.atime.sec,
                tv_nsec: st.atime.nsec.into(),
            },
            last_modification: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
        };
        let _ = rustix::fs::utimensat(dir, name.as_slice(), &ts, AtFlags::SYMLINK_NOFOLLOW);
    }
    Ok(t)
}

/// Whose xattrs to read: an open file's, or a path's (not following a
/// symlink).
enum XattrOf<'a> {
    Fd(&'a OwnedFd),
    Path(&'a Path),
}

/// Every xattr (none where the host filesystem has none). Most files
/// have none or a few short ones: stack buffers serve them, and only a
/// longer list or value goes to the heap (two zeroed 64 KiB buffers per
/// entry were 5% of a tree build's time).
fn read_xattrs(of: XattrOf<'_>) -> std::result::Result<Xattrs, String> {
    let list = |buf: &mut [u8]| match &of {
        XattrOf::Fd(fd) => rustix::fs::flistxattr(fd, buf),
        XattrOf::Path(p) => rustix::fs::llistxattr(*p, buf),
    };
    let get = |name: &std::ffi::OsStr, buf: &mut [u8]| match &of {
        XattrOf::Fd(fd) => rustix::fs::fgetxattr(fd, name, buf),
        XattrOf::Path(p) => rustix::fs::lgetxattr(*p, name, buf),
    };
    let mut small = [0u8; 1024];
    let mut big = Vec::new();
    let names: &[u8] = match list(&mut small) {
        Ok(n) => &small[..n],
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        // Longer than the stack buffer: the kernel's limit is 64 KiB.
        Err(rustix::io::Errno::RANGE) => {
            big.resize(65536, 0);
            let n = list(&mut big).map_err(|e| format!("listing xattrs: {e}"))?;
            &big[..n]
        }
        Err(e) => return Err(format!("listing xattrs: {e}")),
    };
    let mut out = Vec::new();
    let mut val = [0u8; 4096];
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let os = std::ffi::OsStr::from_bytes(name);
        let err = |e: rustix::io::Errno| format!("xattr {}: {e}", String::from_utf8_lossy(name));
        let value = match get(os, &mut val) {
            Ok(len) => val[..len].to_vec(),
            Err(rustix::io::Errno::RANGE) => {
                let mut v = vec![0u8; 65536];
                let len = get(os, &mut v).map_err(err)?;
                v.truncate(len);
                v
            }
            Err(e) => return Err(err(e)),
        };
        out.push((name.to_vec(), value));
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
