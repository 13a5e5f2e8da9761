//! An initramfs: the cpio archive (the kernel's "newc" format) the kernel
//! unpacks into its first root filesystem and runs `/init` from.
//!
//! Entries are collected by path and written parents first (sorted paths
//! put a directory before everything in it, which newc requires: the
//! kernel creates each entry as it reads it). Host programs come with the
//! shared libraries `ldd` names, at the same paths, so the dynamic loader
//! finds them as it would on the host.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::Context;

enum Entry {
    Dir,
    /// Contents copied from a host file when the archive is written.
    HostFile(PathBuf, u32),
    Bytes(Vec<u8>, u32),
    Symlink(String),
    CharDevice(u32, u32),
}

/// The files of an initramfs, written out by [`Initramfs::write`].
#[derive(Default)]
pub struct Initramfs {
    entries: BTreeMap<String, Entry>,
}

impl Initramfs {
    /// An archive holding only the device the kernel opens as init's
    /// standard streams (`/dev/console`).
    pub fn new() -> Initramfs {
        let mut i = Initramfs::default();
        i.add("dev/console", Entry::CharDevice(5, 1));
        i
    }

    fn add(&mut self, path: &str, entry: Entry) {
        let path = path.trim_start_matches('/');
        for a in Path::new(path).ancestors().skip(1) {
            if a.as_os_str().is_empty() {
                break;
            }
            self.entries
                .entry(a.to_string_lossy().into_owned())
                .or_insert(Entry::Dir);
        }
        self.entries.insert(path.to_string(), entry);
    }

    /// An empty directory (mount points).
    pub fn dir(&mut self, path: &str) {
        self.add(path, Entry::Dir);
    }

    /// A file with these contents and permission bits.
    pub fn bytes(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) {
        self.add(path, Entry::Bytes(data.into(), mode));
    }

    /// A copy of the host file `source` (its contents read at write time).
    pub fn host_file(&mut self, path: &str, source: &Path, mode: u32) {
        self.add(path, Entry::HostFile(source.to_path_buf(), mode));
    }

    /// A symbolic link to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.add(path, Entry::Symlink(target.to_string()));
    }

    /// The host program `name` (looked up in PATH, /usr/sbin and /sbin) at
    /// `/usr/sbin/NAME`, with every shared library `ldd` lists for it at
    /// the path ldd gives. Fails naming the program when it is missing.
    pub fn program(&mut self, name: &str) -> io::Result<()> {
        let path =
            find_program(name).ok_or_else(|| io::Error::other(format!("{name} is not installed on this host")))?;
        for lib in shared_libraries(&path)? {
            let dest = lib.to_string_lossy().into_owned();
            self.host_file(&dest, &lib, 0o755);
        }
        self.host_file(&format!("usr/sbin/{name}"), &path, 0o755);
        Ok(())
    }

    /// Writes the archive to `out`.
    pub fn write(&self, out: &Path) -> io::Result<()> {
        let f = fs::File::create(out).context(|| format!("create {}", out.display()))?;
        let mut w = BufWriter::new(f);
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let b = cpio::newc::Builder::new(path).ino(ino as u32 + 1);
            let (b, data): (_, Vec<u8>) = match entry {
                Entry::Dir => (b.mode(0o040755).nlink(2), Vec::new()),
                Entry::HostFile(src, mode) => {
                    let data = fs::read(src).context(|| format!("read {}", src.display()))?;
                    (b.mode(0o100000 | mode), data)
                }
                Entry::Bytes(data, mode) => (b.mode(0o100000 | mode), data.clone()),
                Entry::Symlink(target) => (b.mode(0o120777), target.as_bytes().to_vec()),
                Entry::CharDevice(major, minor) => (b.mode(0o020600).rdev_major(*major).rdev_minor(*minor), Vec::new()),
            };
            let len = u32::try_from(data.len())
                .map_err(|_| io::Error::other(format!("{path}: too large for a newc archive")))?;
            let mut fw = b.write(&mut w, len);
            fw.write_all(&data)?;
            fw.finish()?;
        }
        cpio::newc::trailer(&mut w)?;
        w.flush()
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// The libraries `ldd` resolves for `program`, the dynamic loader
/// included: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x...)`.
fn shared_libraries(program: &Path) -> io::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context(|| format!("ldd {}", program.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // A static program: "not a dynamic executable".
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(p) if p.starts_with('/') => libs.push(PathBuf::from(p)),
            Some("not") => {
                return Err(io::Error::other(format!(
                    "{}: ldd cannot find a library: {line}",
                    program.display()
                )))
            }
            _ => {}
        }
    }
    Ok(libs)
}
