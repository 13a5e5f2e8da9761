//! The write operations the corpus runs, each as a library call sequence
//! and as an `ext4kit` command line.
//!
//! Each aims at the objects the damage aims at (see
//! [`super::corpus::TARGETS`]): a linear and an indexed directory, files
//! with one extent, with an extent index level, with an xattr block, the
//! empty directory our library made.

use std::path::Path;

use ext4kit::{Access, Cred, Error, Fs, OpenFlags, RenameFlags};

/// One write operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// mkdir PATH.
    Mkdir(&'static str),
    /// Create PATH and write LEN bytes (`put`).
    Put(&'static str, usize),
    /// unlink PATH (`rm`).
    Unlink(&'static str),
    /// rmdir PATH (`rm -r` of an empty directory).
    Rmdir(&'static str),
    /// rename FROM TO (`mv`).
    Rename(&'static str, &'static str),
    /// link EXISTING NEW (`ln`).
    Link(&'static str, &'static str),
    /// symlink at PATH with a target of LEN bytes (`ln -s`).
    Symlink(&'static str, usize),
    /// truncate PATH to LEN.
    Truncate(&'static str, u64),
    /// setxattr PATH user.NAME = LEN bytes (`setfattr`).
    Setxattr(&'static str, &'static str, usize),
}

/// Every operation of the corpus, in the order cases rotate through them.
pub const OPS: &[Op] = &[
    Op::Mkdir("/dir/a/newdir"),
    Op::Mkdir("/big/newdir"),
    Op::Put("/dir/a/newfile", 40_000),
    Op::Put("/big/newfile", 5000),
    Op::Unlink("/medium.bin"),
    Op::Unlink("/fragmented.bin"),
    Op::Unlink("/xattr-big"),
    Op::Unlink("/made/file"),
    Op::Rmdir("/emptydir"),
    Op::Rename("/small.txt", "/dir/a/renamed"),
    Op::Rename("/dir/a/b", "/big/moved"),
    Op::Link("/dir/a/file2", "/big/newlink"),
    Op::Symlink("/dir/a/slowlink", 300),
    Op::Truncate("/fragmented.bin", 100_000),
    Op::Truncate("/medium.bin", 0),
    Op::Setxattr("/xattr-big", "user.new", 600),
    Op::Setxattr("/dir/a", "user.x", 10),
];

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| b"ext4kit-damaged-"[i % 16]).collect()
}

impl Op {
    /// Short label ("mkdir /dir/a/newdir").
    pub fn label(&self) -> String {
        match *self {
            Op::Mkdir(p) => format!("mkdir {p}"),
            Op::Put(p, n) => format!("put {p} ({n} bytes)"),
            Op::Unlink(p) => format!("rm {p}"),
            Op::Rmdir(p) => format!("rmdir {p}"),
            Op::Rename(a, b) => format!("mv {a} {b}"),
            Op::Link(a, b) => format!("ln {a} {b}"),
            Op::Symlink(p, n) => format!("ln -s ({n}-byte target) {p}"),
            Op::Truncate(p, n) => format!("truncate -s {n} {p}"),
            Op::Setxattr(p, name, n) => format!("setfattr -n {name} ({n} bytes) {p}"),
        }
    }

    /// The operation through the library, then `sync` (whose failure is
    /// the operation's: what it changed could not be stored).
    pub fn run_library(&self, fs: &Fs) -> Result<(), Error> {
        let root = Cred::root();
        match *self {
            Op::Mkdir(p) => fs.mkdir(p.as_bytes(), 0o755, &root).map(drop),
            Op::Put(p, n) => {
                fs.create(p.as_bytes(), 0o644, 0, 0)?;
                let f = fs.open(p.as_bytes(), OpenFlags { access: Access::WriteOnly, ..Default::default() })?;
                let w = f.write(fs, &payload(n));
                let c = fs.close_file(f);
                w.and(c).map(drop)
            }
            Op::Unlink(p) => fs.unlink(p.as_bytes(), &root),
            Op::Rmdir(p) => fs.rmdir(p.as_bytes(), &root),
            Op::Rename(a, b) => fs.rename(a.as_bytes(), b.as_bytes(), RenameFlags::default(), &root),
            Op::Link(a, b) => fs.link(a.as_bytes(), b.as_bytes(), &root).map(drop),
            Op::Symlink(p, n) => fs.symlink(&payload(n), p.as_bytes(), 0, 0).map(drop),
            Op::Truncate(p, n) => {
                let f = fs.open(p.as_bytes(), OpenFlags { access: Access::WriteOnly, ..Default::default() })?;
                let t = fs.truncate_inode(&f.inode, n, &ext4kit::Caller::root()).map(drop);
                let c = fs.close_file(f);
                t.and(c)
            }
            Op::Setxattr(p, name, n) => fs.setxattr(p.as_bytes(), name.as_bytes(), &payload(n), 0, false, &root),
        }?;
        fs.sync()
    }

    /// The `ext4kit` arguments for the same operation on `img` (`host` is
    /// a scratch directory for `put`'s source file).
    pub fn cli_args(&self, img: &Path, host: &Path) -> std::io::Result<Vec<String>> {
        let i = img.display().to_string();
        let s = |x: &str| x.to_string();
        Ok(match *self {
            Op::Mkdir(p) => vec![s("mkdir"), i, s(p)],
            Op::Put(p, n) => {
                let src = host.join(format!("put-src-{n}"));
                if !src.exists() {
                    std::fs::write(&src, payload(n))?;
                }
                vec![s("put"), src.display().to_string(), format!("{i}:{p}")]
            }
            Op::Unlink(p) => vec![s("rm"), i, s(p)],
            Op::Rmdir(p) => vec![s("rm"), s("-r"), i, s(p)],
            Op::Rename(a, b) => vec![s("mv"), i, s(a), s(b)],
            Op::Link(a, b) => vec![s("ln"), i, s(a), s(b)],
            Op::Symlink(p, n) => vec![s("ln"), s("-s"), i, String::from_utf8_lossy(&payload(n)).into_owned(), s(p)],
            Op::Truncate(p, n) => vec![s("truncate"), s("-c"), s("-s"), n.to_string(), i, s(p)],
            Op::Setxattr(p, name, n) => {
                let hex: String = payload(n).iter().map(|b| format!("{b:02x}")).collect();
                vec![s("setfattr"), s("-n"), s(name), s("-v"), format!("0x{hex}"), i, s(p)]
            }
        })
    }
}
