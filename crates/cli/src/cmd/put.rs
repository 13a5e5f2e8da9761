//! Copying host files into an image: `ext4kit put SRC... IMAGE:DEST` and
//! `ext4kit mkfs -d DIR`.
//!
//! Everything goes through the library's public calls (create, mkdir,
//! link, write, setattr, setxattr), the same as any other caller. What is
//! copied: type, permission bits, owner, atime and mtime with nanoseconds,
//! contents (holes stay holes: data is found with SEEK_DATA/SEEK_HOLE),
//! symlink targets, device numbers, hard links (by source device and
//! inode), and xattrs including POSIX ACLs. ctime and crtime are "now"
//! (`SOURCE_DATE_EPOCH` when set), as for any file created today.
//!
//! Order per object: create with owner and mode, contents, xattrs, then
//! times — directories' times after all their children, so they stick.
//! Entries are visited in byte order of their names, one at a time, so the
//! same tree always yields the same allocation order (reproducible images).
//!
//! A problem with one source entry is reported and counted, and the copy
//! goes on; the command fails at the end if anything was skipped.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ext4kit::vfs::{SetAttr, TimeSet};
use ext4kit::{Cred, Errno, FileType, Fs, Timestamp};

use super::Image;
use indicatif::{ProgressBar, ProgressStyle};
use rustix::fs::SeekFrom;

/// Largest write handed to the library at once.
const CHUNK: usize = 1 << 20;

/// What a copy did.
#[derive(Debug, Default)]
pub struct Summary {
    /// Entries created (directories, files, links, ...).
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
    /// Source entries that could not be copied (already reported).
    pub problems: u64,
}

struct Copier<'a> {
    fs: &'a Fs,
    image: &'a Image,
    cred: Cred,
    links: HashMap<(u64, u64), u32>,
    bar: ProgressBar,
    sum: Summary,
    buf: Vec<u8>,
}

/// Open `p` for reading without updating its atime where we may (owner or
/// root: `O_NOATIME`), so building an image leaves the source tree as it
/// was — and two builds of one tree see the same atimes.
fn open_noatime(p: &Path, dir: bool) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let base = OFlags::RDONLY | OFlags::CLOEXEC | if dir { OFlags::DIRECTORY } else { OFlags::empty() };
    match rustix::fs::open(p, base | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => Ok(rustix::fs::open(p, base, Mode::empty())?),
        r => Ok(r?),
    }
}

/// The entries of host directory `p` (without "." and ".."), read without
/// touching its atime.
fn list_dir(p: &Path) -> std::io::Result<Vec<PathBuf>> {
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

/// Count entries and bytes below `src` (for the progress bar).
fn measure(src: &Path) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    let mut stack = vec![src.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        n += 1;
        if md.is_file() {
            bytes += md.len();
        } else if md.is_dir() {
            if let Ok(kids) = list_dir(&p) {
                stack.extend(kids);
            }
        }
    }
    (n, bytes)
}

fn ts(sec: i64, nsec: i64) -> Timestamp {
    Timestamp {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// Copy `src` into the image. With `into_root`, `src` must be a directory
/// and its contents (and its own mode, owner and times) go into `/`;
/// otherwise `src` becomes `name` in directory inode `parent`.
pub fn copy_in(
    fs: &Fs,
    image: &Image,
    src: &Path,
    parent: u32,
    name: &[u8],
    into_root: bool,
) -> Result<Summary, String> {
    let mut c = Copier::new(fs, image, &[src]);
    if into_root {
        c.merge_into(src, 2)?;
    } else {
        c.copy_named(src, parent, name)?;
    }
    Ok(c.finish())
}

impl<'a> Copier<'a> {
    /// A copier for `srcs` (measured up front for the progress bar). One
    /// copier serves every source of a command, so that names of one file
    /// given as different sources become hard links of one inode, as with
    /// `cp -a A B DEST/`.
    fn new(fs: &'a Fs, image: &'a Image, srcs: &[&Path]) -> Self {
        let (entries, bytes) = srcs
            .iter()
            .map(|s| measure(s))
            .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2));
        let bar = ProgressBar::new(bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{entries} entries"));
        Copier {
            fs,
            image,
            cred: Cred::root(),
            links: HashMap::new(),
            bar,
            sum: Summary::default(),
            buf: vec![0u8; CHUNK],
        }
    }

    fn finish(self) -> Summary {
        self.bar.finish_and_clear();
        self.sum
    }

    /// `cp -a DIR/. DEST`: DIR's contents go into the existing image
    /// directory `ino`, which takes DIR's mode, owner, xattrs and times.
    fn merge_into(&mut self, src: &Path, ino: u32) -> Result<(), String> {
        let md = std::fs::metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
        if !md.is_dir() {
            return Err(format!("{}: not a directory", src.display()));
        }
        self.set_owner_mode(ino, &md, src);
        self.copy_xattrs(ino, src);
        self.copy_tree(src, ino);
        self.set_times(ino, &md, src);
        Ok(())
    }

    /// `src` (a tree or a single entry) becomes `name` in directory inode
    /// `parent`; an existing entry of that name is merged into (directory
    /// onto directory) or replaced (non-directory onto non-directory), as
    /// `cp -a` does.
    fn copy_named(&mut self, src: &Path, parent: u32, name: &[u8]) -> Result<(), String> {
        // "DIR/." names DIR itself (followed if DIR is a symlink, as cp does).
        let md = if ends_in_dot(src) {
            std::fs::metadata(src)
        } else {
            std::fs::symlink_metadata(src)
        }
        .map_err(|e| format!("{}: {e}", src.display()))?;
        if let Some(ino) = self.create(src, &md, parent, name) {
            if md.is_dir() {
                self.copy_tree(src, ino);
                self.set_times(ino, &md, src);
            }
        }
        Ok(())
    }
}

/// Whether the last component of `p` as written is "." or ".." (`DIR/.`,
/// `.`, `DIR/./`): `cp -a DIR/. DEST` copies DIR's contents into DEST.
/// (`Path::file_name` would drop the "." and say "DIR".)
fn ends_in_dot(p: &Path) -> bool {
    matches!(last_component(p), b"." | b"..")
}

/// The last component of `p` as written, trailing slashes ignored.
fn last_component(p: &Path) -> &[u8] {
    let b = p.as_os_str().as_bytes();
    let mut end = b.len();
    while end > 1 && b[end - 1] == b'/' {
        end -= 1;
    }
    let b = &b[..end];
    match b.iter().rposition(|&c| c == b'/') {
        Some(i) => &b[i + 1..],
        None => b,
    }
}

/// What [`Copier::make`] did.
enum Made {
    /// A new inode.
    New(u32),
    /// A new name for the copy of a file seen before.
    Linked(u32),
}

/// Directory frames for the iterative walk.
enum Frame {
    /// Copy the children of this host directory into image inode `ino`.
    Enter(PathBuf, u32),
    /// All children done: set this directory's times.
    Leave(PathBuf, u32, Box<Metadata>),
}

impl Copier<'_> {
    fn problem(&mut self, src: &Path, what: impl std::fmt::Display) {
        self.sum.problems += 1;
        self.bar
            .suspend(|| eprintln!("ext4kit: {}: {}: {what}", self.image.display(), src.display()));
    }

    /// Copy everything below host directory `dir` into image directory `ino`.
    fn copy_tree(&mut self, dir: &Path, ino: u32) {
        let mut stack = vec![Frame::Enter(dir.to_path_buf(), ino)];
        while let Some(f) = stack.pop() {
            match f {
                Frame::Leave(p, ino, md) => self.set_times(ino, &md, &p),
                Frame::Enter(p, ino) => {
                    let mut kids: Vec<PathBuf> = match list_dir(&p) {
                        Ok(k) => k,
                        Err(e) => {
                            self.problem(&p, e);
                            continue;
                        }
                    };
                    // Byte order of names: the same tree, the same order.
                    kids.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
                    let mut dirs = Vec::new();
                    for k in kids {
                        let md = match std::fs::symlink_metadata(&k) {
                            Ok(m) => m,
                            Err(e) => {
                                self.problem(&k, e);
                                continue;
                            }
                        };
                        let name = k.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
                        if let Some(child) = self.create(&k, &md, ino, &name) {
                            if md.is_dir() {
                                dirs.push((k, child, md));
                            }
                        }
                    }
                    // Subdirectories after the files of this level, in order.
                    for (k, child, md) in dirs.into_iter().rev() {
                        stack.push(Frame::Leave(k.clone(), child, Box::new(md)));
                        stack.push(Frame::Enter(k, child));
                    }
                }
            }
        }
    }

    /// Create one entry (not its children); returns its inode.
    ///
    /// An entry of that name that exists already is handled as `cp -a`
    /// handles it: a directory copied onto a directory merges (the existing
    /// one takes the source's owner, mode and xattrs); a non-directory onto
    /// a non-directory replaces it (unlinked first, so its other hard
    /// links keep the old contents, as cp does for a multiply-linked
    /// destination); a directory onto a non-directory or the reverse is
    /// reported and skipped.
    fn create(&mut self, src: &Path, md: &Metadata, parent: u32, name: &[u8]) -> Option<u32> {
        let ft = md.file_type();
        let target = if ft.is_symlink() {
            match read_link_keep_atime(src, md) {
                Ok(t) => Some(t),
                Err(e) => {
                    self.problem(src, e);
                    return None;
                }
            }
        } else {
            None
        };
        let mut replaced = false;
        let made = loop {
            match self.make(md, parent, name, target.as_deref()) {
                Ok(m) => break m,
                Err(e) if e.errno() == Errno::EEXIST && !replaced => {
                    let existing = match self.fs.lookup_at(parent, name) {
                        Ok(Some(x)) => x,
                        Ok(None) => {
                            self.problem(src, e);
                            return None;
                        }
                        Err(e) => {
                            self.problem(src, e);
                            return None;
                        }
                    };
                    match (existing.1 == FileType::Directory, ft.is_dir()) {
                        (true, true) => {
                            // Merge: the children are copied by the caller.
                            self.set_owner_mode(existing.0, md, src);
                            self.copy_xattrs(existing.0, src);
                            return Some(existing.0);
                        }
                        (true, false) => {
                            self.problem(src, "cannot overwrite a directory with a non-directory");
                            return None;
                        }
                        (false, true) => {
                            self.problem(src, "cannot overwrite a non-directory with a directory");
                            return None;
                        }
                        (false, false) => {
                            let key = (md.dev(), md.ino());
                            if md.nlink() > 1 && self.links.get(&key) == Some(&existing.0) {
                                // This name is already that file (a source
                                // given twice): nothing to do.
                                return Some(existing.0);
                            }
                            if let Err(e) = self.fs.unlink_at(parent, name, &self.cred) {
                                self.problem(src, e);
                                return None;
                            }
                            replaced = true;
                        }
                    }
                }
                Err(e) => {
                    self.problem(src, e);
                    return None;
                }
            }
        };
        self.sum.entries += 1;
        let ino = match made {
            Made::Linked(ino) => return Some(ino),
            Made::New(ino) => ino,
        };
        if ft.is_file() {
            if let Err(e) = self.copy_data(src, ino, md.len()) {
                self.problem(src, e);
            }
        }
        self.copy_xattrs(ino, src);
        if !ft.is_dir() {
            self.set_times(ino, md, src);
            if md.nlink() > 1 {
                self.links.insert((md.dev(), md.ino()), ino);
            }
        }
        Some(ino)
    }

    /// The creating step of [`Copier::create`]: a new inode, or a hard link
    /// to the copy of a file seen before (by source device and inode).
    fn make(&self, md: &Metadata, parent: u32, name: &[u8], target: Option<&Path>) -> ext4kit::Result<Made> {
        let owner = Some((md.uid(), md.gid()));
        let perm = (md.mode() & 0o7777) as u16;
        let ft = md.file_type();
        let fs = self.fs;
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&ino) = self.links.get(&(md.dev(), md.ino())) {
                return fs.link_at(ino, parent, name, &self.cred).map(|_| Made::Linked(ino));
            }
        }
        let st = if ft.is_dir() {
            fs.mkdir_owned(parent, name, perm, &self.cred, owner)?
        } else if let Some(t) = target {
            fs.symlink_owned(parent, name, t.as_os_str().as_bytes(), &self.cred, owner)?
        } else {
            let (ftype, rdev) = if ft.is_file() {
                (FileType::Regular, (0, 0))
            } else if ft.is_fifo() {
                (FileType::Fifo, (0, 0))
            } else if ft.is_socket() {
                (FileType::Socket, (0, 0))
            } else {
                let dev = md.rdev();
                let mm = (rustix::fs::major(dev), rustix::fs::minor(dev));
                if ft.is_char_device() {
                    (FileType::CharDevice, mm)
                } else {
                    (FileType::BlockDevice, mm)
                }
            };
            fs.mknod_owned(parent, name, ftype, perm, rdev, &self.cred, owner)?
        };
        Ok(Made::New(st.ino))
    }

    /// Write the data regions of host file `src` into image inode `ino`;
    /// holes are skipped, and a trailing hole is made by setting the size.
    fn copy_data(&mut self, src: &Path, ino: u32, size: u64) -> Result<(), String> {
        let f = open_noatime(src, false).map_err(|e| e.to_string())?;
        let inode = self.fs.inode(ino).map_err(|e| e.to_string())?;
        let mut off = 0u64;
        while off < size {
            // Next data region [start, end); ENXIO: no more data.
            let start = match rustix::fs::seek(&f, SeekFrom::Data(off)) {
                Ok(s) => s,
                Err(rustix::io::Errno::NXIO) => break,
                Err(_) => off, // no SEEK_DATA here: treat everything as data
            };
            let end = rustix::fs::seek(&f, SeekFrom::Hole(start)).unwrap_or(size).min(size);
            let mut pos = start;
            while pos < end {
                let want = ((end - pos) as usize).min(self.buf.len());
                let n = rustix::io::pread(&f, &mut self.buf[..want], pos).map_err(|e| e.to_string())?;
                if n == 0 {
                    break; // the file shrank under us
                }
                let mut done = 0;
                while done < n {
                    let (_, w) = self
                        .fs
                        .write_at(&inode, Some(pos + done as u64), &self.buf[done..n])
                        .map_err(|e| e.to_string())?;
                    done += w;
                }
                pos += n as u64;
                self.sum.bytes += n as u64;
                self.bar.inc(n as u64);
            }
            off = end.max(start + 1);
        }
        if inode.size() < size {
            self.fs
                .truncate_inode(&inode, size, &ext4kit::Caller::root())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn copy_xattrs(&mut self, ino: u32, src: &Path) {
        let mut names = vec![0u8; 65536];
        let n = match rustix::fs::llistxattr(src, &mut names) {
            Ok(n) => n,
            Err(rustix::io::Errno::NOTSUP) => return,
            Err(e) => {
                self.problem(src, format!("listing xattrs: {e}"));
                return;
            }
        };
        let mut val = vec![0u8; 65536];
        for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let os = std::ffi::OsStr::from_bytes(name);
            let len = match rustix::fs::lgetxattr(src, os, &mut val) {
                Ok(l) => l,
                Err(e) => {
                    self.problem(src, format!("xattr {}: {e}", String::from_utf8_lossy(name)));
                    continue;
                }
            };
            if let Err(e) = self.fs.setxattr_ino(ino, name, &val[..len], 0, &self.cred) {
                self.problem(src, format!("xattr {}: {e}", String::from_utf8_lossy(name)));
            }
        }
    }

    fn set_owner_mode(&mut self, ino: u32, md: &Metadata, src: &Path) {
        let a = SetAttr {
            uid: Some(md.uid()),
            gid: Some(md.gid()),
            ..Default::default()
        };
        let b = SetAttr {
            mode: Some((md.mode() & 0o7777) as u16),
            ..Default::default()
        };
        for attr in [a, b] {
            if let Err(e) = self.fs.setattr_ino(ino, &attr, &self.cred) {
                self.problem(src, e);
            }
        }
    }

    fn set_times(&mut self, ino: u32, md: &Metadata, src: &Path) {
        let attr = SetAttr {
            atime: Some(TimeSet::Set(ts(md.atime(), md.atime_nsec()))),
            mtime: Some(TimeSet::Set(ts(md.mtime(), md.mtime_nsec()))),
            ..Default::default()
        };
        if let Err(e) = self.fs.setattr_ino(ino, &attr, &self.cred) {
            self.problem(src, e);
        }
    }
}

/// `ext4kit put SRC... IMAGE:DEST`: copy host files or trees into the
/// image, with `cp -a`'s rules for where each lands. When DEST is an
/// existing directory, each SRC goes into it under its own name — except a
/// SRC written as `DIR/.` (or `.`), whose contents go into DEST itself;
/// otherwise (one SRC) DEST is the name of the copy. Sources that are hard
/// links of one file become one inode with several names.
pub fn run(srcs: &[PathBuf], target: &str, sel: &crate::image::ImageArgs, budget: usize) -> Result<(), String> {
    let (image, dest) = split_target(target)?;
    let image = &sel.image(image)?;
    let fs = super::edit::open_rw(image, budget)?;
    let dest = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("/{dest}")
    };
    let dest_dir = fs
        .stat(dest.as_bytes())
        .ok()
        .filter(|st| st.ftype == FileType::Directory);
    if srcs.len() > 1 && dest_dir.is_none() {
        return Err(format!(
            "{}: {dest}: not an existing directory (several sources)",
            image.display()
        ));
    }
    // Every source is looked at before anything is written.
    for src in srcs {
        if dest_dir.is_some() && !ends_in_dot(src) && last_component(src).is_empty() {
            return Err(format!("{}: has no file name to copy under", src.display()));
        }
        std::fs::symlink_metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    let paths: Vec<&Path> = srcs.iter().map(|p| p.as_path()).collect();
    let mut c = Copier::new(&fs, image, &paths);
    for src in srcs {
        match &dest_dir {
            Some(d) if ends_in_dot(src) => c.merge_into(src, d.ino)?,
            Some(d) => {
                let name = last_component(src).to_vec();
                c.copy_named(src, d.ino, &name)?;
            }
            None => {
                let trimmed = dest.trim_end_matches('/');
                let (pp, n) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
                let pp = if pp.is_empty() { "/" } else { pp };
                let pst = fs.stat(pp.as_bytes()).map_err(|e| super::err(image, pp, e))?;
                c.copy_named(src, pst.ino, n.as_bytes())?;
            }
        }
    }
    let total = c.finish();
    fs.sync()
        .map_err(|e| format!("{}: writing back: {e}", image.display()))?;
    if total.problems > 0 {
        return Err(format!(
            "{}: {} entries copied, {} could not be (see above)",
            image.display(),
            total.entries,
            total.problems
        ));
    }
    eprintln!(
        "ext4kit: {}: copied {} entries, {} bytes",
        image.display(),
        total.entries,
        total.bytes
    );
    Ok(())
}

/// Split "IMAGE:/path" (the first ":/"; or the last ":" for a relative DEST).
fn split_target(t: &str) -> Result<(&str, &str), String> {
    if let Some(i) = t.find(":/") {
        return Ok((&t[..i], &t[i + 1..]));
    }
    match t.rsplit_once(':') {
        Some((img, dest)) if !img.is_empty() => Ok((img, if dest.is_empty() { "/" } else { dest })),
        _ => Err(format!(
            "\"{t}\": the last argument must be IMAGE:DEST (for example disk.img:/srv)"
        )),
    }
}
