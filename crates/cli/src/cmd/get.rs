//! `ext4kit get IMAGE PATH DEST`: copy a file or tree out of an image.
//!
//! Safety rule: nothing is ever written outside DEST. Every object is
//! created relative to an open descriptor of its parent directory (which
//! this command created itself), by a single validated name component
//! ("/", ".", ".." and NUL are refused), with O_EXCL/O_NOFOLLOW semantics,
//! so neither a hostile name nor a symlink extracted earlier can redirect a
//! later write.
//!
//! Metadata order per object: contents, xattrs, owner (root only; chown
//! clears set-id bits, so it comes first), mode, then times — directories
//! last of all, after their children, so their mtimes stick.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ext4kit::{FileType, Fs, OpenFlags, Stat, Timestamp, Whence};

use super::Image;
use indicatif::{ProgressBar, ProgressStyle};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timespec, Timestamps, XattrFlags};

/// Deepest directory nesting we extract.
const MAX_DEPTH: usize = 1024;

struct Ctx<'a> {
    fs: Arc<Fs>,
    image: &'a Image,
    root: bool,
    /// inode → path (relative to DEST's parent fd) of its first copy, for hard links.
    links: HashMap<u32, PathBuf>,
    /// Directories on the current path (cycle detection).
    active_dirs: HashSet<u32>,
    bar: ProgressBar,
    problems: usize,
    top_fd: OwnedFd,
}

/// Copy PATH out of IMAGE into DEST.
pub fn run(image: &Image, path: &str, dest: &Path, budget: usize) -> Result<(), String> {
    let fs = super::open(image, budget)?;
    let st = fs.lstat(path.as_bytes()).map_err(|e| super::err(image, path, e))?;
    // Where the top object goes: DEST itself, or DEST/<name> when DEST is
    // an existing directory and PATH is not a directory.
    let (parent, name, fill_existing) = place(dest, path, &st)?;
    let top_fd = rfs::open(
        &parent,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", parent.display()))?;
    raise_fd_limit();
    let (entries, bytes) = survey(&fs, st.ino);
    let bar = ProgressBar::new(bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{entries} entries"));
    let mut ctx = Ctx {
        fs,
        image,
        root: rustix::process::geteuid().is_root(),
        links: HashMap::new(),
        active_dirs: HashSet::new(),
        bar,
        problems: 0,
        top_fd,
    };
    let top_dir = ctx
        .top_fd
        .try_clone()
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let top = Item {
        name: &name,
        src: path.as_bytes(),
        st: &st,
        depth: 0,
        fill_existing,
    };
    let r = ctx.copy(&top_dir, Path::new(""), &top);
    ctx.bar.finish_and_clear();
    r.map_err(|e| format!("{}: {e}", dest.display()))?;
    if ctx.problems > 0 {
        return Err(format!(
            "{}: {path}: {} entries could not be copied completely (see messages above)",
            image.display(),
            ctx.problems
        ));
    }
    Ok(())
}

/// Decide the parent directory, the top name, and whether DEST is an
/// existing empty directory to fill.
fn place(dest: &Path, path: &str, st: &Stat) -> Result<(PathBuf, Vec<u8>, bool), String> {
    use std::os::unix::ffi::OsStrExt;
    let parent_of = |p: &Path| -> PathBuf {
        match p.parent() {
            Some(x) if !x.as_os_str().is_empty() => x.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let name = dest
                .file_name()
                .ok_or_else(|| format!("{}: not a usable destination name", dest.display()))?;
            Ok((parent_of(dest), name.as_bytes().to_vec(), false))
        }
        Err(e) => Err(format!("{}: {e}", dest.display())),
        Ok(m) if m.is_dir() => {
            if st.ftype == FileType::Directory {
                let empty = std::fs::read_dir(dest)
                    .map_err(|e| format!("{}: {e}", dest.display()))?
                    .next()
                    .is_none();
                if !empty {
                    return Err(format!("{}: destination directory is not empty", dest.display()));
                }
                let name = dest
                    .canonicalize()
                    .ok()
                    .and_then(|c| c.file_name().map(|n| n.as_bytes().to_vec()))
                    .ok_or_else(|| format!("{}: cannot fill this directory (use a named directory)", dest.display()))?;
                let canon = dest.canonicalize().map_err(|e| format!("{}: {e}", dest.display()))?;
                Ok((parent_of(&canon), name, true))
            } else {
                let base = path
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or("")
                    .as_bytes()
                    .to_vec();
                if base.is_empty() {
                    return Err(format!("{}: {path}: cannot name the copy", dest.display()));
                }
                Ok((dest.to_path_buf(), base, false))
            }
        }
        Ok(_) => Err(format!("{}: destination exists", dest.display())),
    }
}

/// Count entries and bytes below `ino` (for the progress bar); errors are
/// left for the copy to report.
fn survey(fs: &Fs, ino: u32) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    let mut stack = vec![ino];
    let mut seen = HashSet::new();
    while let Some(i) = stack.pop() {
        if !seen.insert(i) || n > 50_000_000 {
            continue;
        }
        n += 1;
        let Ok(s) = fs.stat(i) else { continue };
        match s.ftype {
            FileType::Regular => bytes += s.size.min(s.blocks * 512 + 4096),
            FileType::Directory => {
                if let Ok(es) = fs.read_dir(i) {
                    stack.extend(
                        es.into_iter()
                            .filter(|e| e.name != b"." && e.name != b"..")
                            .map(|e| e.ino),
                    );
                }
            }
            _ => {}
        }
    }
    (n, bytes)
}

fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if let Some(max) = l.maximum {
        if l.current.is_some_and(|c| c < max) {
            l.current = Some(max.min(1 << 20));
            let _ = setrlimit(Resource::Nofile, l);
        }
    }
}

/// A single path component safe to create: no "/", NUL, ".", "..", or "".
fn safe_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

fn os(name: &[u8]) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(name)
}

fn ts(t: Timestamp) -> Timespec {
    Timespec {
        tv_sec: t.sec,
        tv_nsec: t.nsec as _,
    }
}

/// One object of the image being copied out, and where it sits in the
/// walk.
struct Item<'a> {
    /// Its name in its directory (the name it gets in DEST).
    name: &'a [u8],
    /// Its path in the image, for messages.
    src: &'a [u8],
    st: &'a Stat,
    /// Directories above it in the copy, bounded by `MAX_DEPTH`.
    depth: usize,
    /// DEST is an existing empty directory that takes its place.
    fill_existing: bool,
}

impl Ctx<'_> {
    fn warn(&mut self, src: &[u8], what: impl std::fmt::Display) {
        self.problems += 1;
        self.bar.suspend(|| {
            eprintln!(
                "ext4kit: {}: {}: {what}",
                self.image.display(),
                String::from_utf8_lossy(src)
            )
        });
    }

    /// Copy one object named `name` into the directory `dir` (whose path
    /// relative to the top parent is `rel`). Errors returned are errors
    /// writing DEST (fatal); problems reading the image are reported and
    /// counted, and the copy goes on.
    fn copy(&mut self, dir: &OwnedFd, rel: &Path, item: &Item<'_>) -> io::Result<()> {
        let Item { name, src, st, .. } = *item;
        let my_rel = rel.join(os(name));
        if st.ftype != FileType::Directory && st.nlink > 1 {
            if let Some(first) = self.links.get(&st.ino) {
                rfs::linkat(&self.top_fd, first, dir, os(name), AtFlags::empty())?;
                return Ok(());
            }
            self.links.insert(st.ino, my_rel.clone());
        }
        match st.ftype {
            FileType::Directory => self.copy_dir(dir, &my_rel, item),
            FileType::Regular => self.copy_file(dir, name, src, st),
            FileType::Symlink => {
                let target = match self.fs.read_link(st.ino) {
                    Ok(t) => t,
                    Err(e) => {
                        self.warn(src, e);
                        return Ok(());
                    }
                };
                if target.contains(&0) {
                    self.warn(src, "symlink target contains a NUL byte; skipped");
                    return Ok(());
                }
                rfs::symlinkat(os(&target), dir, os(name))?;
                self.finish(dir, name, src, st, None)
            }
            FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket => {
                let (ft, dev) = match st.ftype {
                    FileType::CharDevice => (rfs::FileType::CharacterDevice, rfs::makedev(st.rdev.0, st.rdev.1)),
                    FileType::BlockDevice => (rfs::FileType::BlockDevice, rfs::makedev(st.rdev.0, st.rdev.1)),
                    FileType::Fifo => (rfs::FileType::Fifo, 0),
                    _ => (rfs::FileType::Socket, 0),
                };
                if matches!(st.ftype, FileType::CharDevice | FileType::BlockDevice) && !self.root {
                    self.warn(src, "device node skipped (creating device nodes needs root)");
                    return Ok(());
                }
                rfs::mknodat(dir, os(name), ft, Mode::from_raw_mode(0o600), dev)?;
                self.finish(dir, name, src, st, None)
            }
        }
    }

    fn copy_dir(&mut self, dir: &OwnedFd, my_rel: &Path, item: &Item<'_>) -> io::Result<()> {
        let Item { name, src, st, .. } = *item;
        if item.depth > MAX_DEPTH {
            self.warn(
                src,
                format!("nested deeper than {MAX_DEPTH} directories; not descended"),
            );
            return Ok(());
        }
        if !self.active_dirs.insert(st.ino) {
            self.warn(
                src,
                format!(
                    "directory inode {} contains itself (corrupt image: directory cycle); not descended",
                    st.ino
                ),
            );
            return Ok(());
        }
        if !item.fill_existing {
            rfs::mkdirat(dir, os(name), Mode::from_raw_mode(0o700))?;
        }
        let sub = rfs::openat(
            dir,
            os(name),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        match self.fs.read_dir(st.ino) {
            Ok(mut entries) => {
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                let mut prev: Option<Vec<u8>> = None;
                for e in entries {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let mut child_src = src.to_vec();
                    if !child_src.ends_with(b"/") {
                        child_src.push(b'/');
                    }
                    child_src.extend_from_slice(&e.name);
                    // A damaged directory can hold one name twice; the
                    // host directory cannot: keep the first, report the
                    // rest (instead of stopping on a bare "File exists").
                    if prev.as_deref() == Some(&e.name[..]) {
                        self.warn(
                            &child_src,
                            format!(
                                "directory inode {} holds this name twice (corrupt image: run e2fsck); \
                                 the entry for inode {} was skipped",
                                st.ino, e.ino
                            ),
                        );
                        continue;
                    }
                    prev = Some(e.name.clone());
                    if !safe_name(&e.name) {
                        self.warn(
                            &child_src,
                            "unsafe name in directory (contains '/' or NUL, or is '.'/'..'); skipped",
                        );
                        continue;
                    }
                    match self.fs.stat(e.ino) {
                        Ok(cst) => {
                            let child = Item {
                                name: &e.name,
                                src: &child_src,
                                st: &cst,
                                depth: item.depth + 1,
                                fill_existing: false,
                            };
                            self.copy(&sub, my_rel, &child)?
                        }
                        Err(err) => self.warn(&child_src, err),
                    }
                }
            }
            Err(e) => self.warn(src, e),
        }
        self.active_dirs.remove(&st.ino);
        self.finish(dir, name, src, st, Some(sub.as_fd()))
    }

    fn copy_file(&mut self, dir: &OwnedFd, name: &[u8], src: &[u8], st: &Stat) -> io::Result<()> {
        let out = std::fs::File::from(rfs::openat(
            dir,
            os(name),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?);
        if let Err(e) = self.copy_data(&out, st) {
            match e {
                CopyError::Write(e) => return Err(e),
                CopyError::Read(e) => self.warn(src, e),
            }
        }
        self.finish(dir, name, src, st, Some(out.as_fd()))
    }

    /// Copy data segments only (SEEK_DATA/SEEK_HOLE), so holes stay holes.
    fn copy_data(&mut self, out: &std::fs::File, st: &Stat) -> Result<(), CopyError> {
        let fs = self.fs.clone();
        let f = fs.open(st.ino, OpenFlags::default()).map_err(CopyError::Read)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        while off < st.size {
            let data = match fs.lseek(&f, off as i64, Whence::Data) {
                Ok(d) => d,
                Err(e) if e.errno() == ext4kit::Errno::ENXIO => break,
                Err(e) => return Err(CopyError::Read(e)),
            };
            let hole = fs
                .lseek(&f, data as i64, Whence::Hole)
                .map_err(CopyError::Read)?
                .min(st.size);
            let mut pos = data;
            while pos < hole {
                let want = ((hole - pos) as usize).min(buf.len());
                let n = fs.pread(&f, pos, &mut buf[..want]).map_err(CopyError::Read)?;
                if n == 0 {
                    break;
                }
                out.write_all_at(&buf[..n], pos).map_err(CopyError::Write)?;
                pos += n as u64;
                self.bar.inc(n as u64);
            }
            off = hole.max(data + 1);
        }
        rfs::ftruncate(out, st.size).map_err(|e| CopyError::Write(e.into()))?;
        Ok(())
    }

    /// Apply xattrs, owner, mode and times to a created object. `fd` is an
    /// open descriptor of the object for files and directories.
    fn finish(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        src: &[u8],
        st: &Stat,
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        match self.fs.xattrs(st.ino) {
            Ok(xs) => {
                for (n, v) in xs {
                    if n.contains(&0) {
                        continue;
                    }
                    let r = match fd {
                        Some(fd) => rfs::fsetxattr(fd, os(&n), &v, XattrFlags::empty()),
                        None => {
                            let p = PathBuf::from(format!("/proc/self/fd/{}", fd_num(dir))).join(os(name));
                            rfs::lsetxattr(&p, os(&n), &v, XattrFlags::empty())
                        }
                    };
                    if let Err(e) = r {
                        // user.* on symlinks and devices is refused by Linux.
                        let is_user_on_special = n.starts_with(b"user.") && fd.is_none();
                        if !is_user_on_special || e != rustix::io::Errno::PERM {
                            self.warn(src, format!("xattr {}: {e}", String::from_utf8_lossy(&n)));
                        }
                    }
                }
            }
            Err(e) => self.warn(src, format!("xattrs: {e}")),
        }
        if self.root {
            // u32::MAX is "no change" to chown(2), not an id: leave it be.
            let uid = (st.uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(st.uid));
            let gid = (st.gid != u32::MAX).then(|| rustix::fs::Gid::from_raw(st.gid));
            rfs::chownat(dir, os(name), uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        if st.ftype != FileType::Symlink {
            let mode = Mode::from_raw_mode(st.perm() as _);
            match fd {
                Some(fd) => rfs::fchmod(fd, mode)?,
                None => rfs::chmodat(dir, os(name), mode, AtFlags::empty())?,
            }
        }
        let times = Timestamps {
            last_access: ts(st.atime),
            last_modification: ts(st.mtime),
        };
        rfs::utimensat(dir, os(name), &times, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }
}

enum CopyError {
    Read(ext4kit::Error),
    Write(io::Error),
}

fn fd_num(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_fd().as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::safe_name;

    #[test]
    fn unsafe_names_are_refused() {
        for n in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert!(!safe_name(n), "{n:?}");
        }
        assert!(safe_name(b"...") && safe_name("é".as_bytes()) && safe_name(b".hidden"));
    }
}
