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
use ext4kit::{Cred, FileType, Fs, Timestamp};

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
    let (entries, bytes) = measure(src);
    let bar = ProgressBar::new(bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{entries} entries"));
    let mut c = Copier {
        fs,
        image,
        cred: Cred::root(),
        links: HashMap::new(),
        bar,
        sum: Summary::default(),
        buf: vec![0u8; CHUNK],
    };
    let md = std::fs::symlink_metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
    if into_root {
        if !md.is_dir() {
            return Err(format!("{}: not a directory", src.display()));
        }
        let root = 2u32;
        c.set_owner_mode(root, &md, src);
        c.copy_xattrs(root, src);
        c.copy_tree(src, root);
        c.set_times(root, &md, src);
    } else if md.is_dir() {
        if let Some(ino) = c.create(src, &md, parent, name) {
            c.copy_tree(src, ino);
            c.set_times(ino, &md, src);
        }
    } else {
        c.create(src, &md, parent, name);
    }
    c.bar.finish_and_clear();
    Ok(c.sum)
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
    fn create(&mut self, src: &Path, md: &Metadata, parent: u32, name: &[u8]) -> Option<u32> {
        let owner = Some((md.uid(), md.gid()));
        let perm = (md.mode() & 0o7777) as u16;
        let ft = md.file_type();
        let fs = self.fs;
        // A second name of a file already copied: a hard link.
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&ino) = self.links.get(&(md.dev(), md.ino())) {
                return match fs.link_at(ino, parent, name, &self.cred) {
                    Ok(_) => {
                        self.sum.entries += 1;
                        Some(ino)
                    }
                    Err(e) => {
                        self.problem(src, e);
                        None
                    }
                };
            }
        }
        let made = if ft.is_dir() {
            fs.mkdir_owned(parent, name, perm, &self.cred, owner)
        } else if ft.is_symlink() {
            match read_link_keep_atime(src, md) {
                Ok(t) => fs.symlink_owned(parent, name, t.as_os_str().as_bytes(), &self.cred, owner),
                Err(e) => {
                    self.problem(src, e);
                    return None;
                }
            }
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
            fs.mknod_owned(parent, name, ftype, perm, rdev, &self.cred, owner)
        };
        let st = match made {
            Ok(st) => st,
            Err(e) => {
                self.problem(src, e);
                return None;
            }
        };
        self.sum.entries += 1;
        if ft.is_file() {
            if let Err(e) = self.copy_data(src, st.ino, md.len()) {
                self.problem(src, e);
            }
        }
        self.copy_xattrs(st.ino, src);
        if !ft.is_dir() {
            self.set_times(st.ino, md, src);
            if md.nlink() > 1 {
                self.links.insert((md.dev(), md.ino()), st.ino);
            }
        }
        Some(st.ino)
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
            self.fs.truncate_inode(&inode, size).map_err(|e| e.to_string())?;
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
/// image. With one SRC, DEST may be a new name; otherwise (or when DEST is
/// an existing directory) each SRC goes into DEST under its own name.
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
    let mut total = Summary::default();
    for src in srcs {
        let (parent, name) = match &dest_dir {
            Some(d) => {
                let name = src
                    .file_name()
                    .ok_or_else(|| format!("{}: has no file name to copy under", src.display()))?;
                (d.ino, name.as_bytes().to_vec())
            }
            None => {
                let trimmed = dest.trim_end_matches('/');
                let (pp, n) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
                let pp = if pp.is_empty() { "/" } else { pp };
                let pst = fs.stat(pp.as_bytes()).map_err(|e| super::err(image, pp, e))?;
                (pst.ino, n.as_bytes().to_vec())
            }
        };
        let s = copy_in(&fs, image, src, parent, &name, false)?;
        total.entries += s.entries;
        total.bytes += s.bytes;
        total.problems += s.problems;
    }
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
