//! The filesystem object: one open image, its tree read and changed with
//! the calls and argument conventions of Python's `os` module (`stat`,
//! `lstat`, `readlink`, `mkdir`, `rename`, `chmod`, `chown`, `utime`,
//! the xattr calls...). The Python half (`python/ext4kit/__init__.py`)
//! subclasses it for `walk`, `scandir`, `listdir` and the `io` file.
//!
//! Every engine call runs with the GIL released (`py.detach`), so other
//! Python threads run during image I/O and several threads can use one
//! filesystem at once: the engine is thread-safe, and this object holds
//! only a lock around the handle that `close()` takes away.

use std::os::unix::ffi::OsStringExt;
use std::sync::{Arc, LazyLock};

use ext4kit::{
    Access, Cred, Fs, Location, NewInode, NodeKind, OpenFlags, OpenOptions, OpenRequest, RenameFlags, Target, TimeSet,
    Timestamp,
};
use parking_lot::RwLock;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::device::PyFileDevice;
use crate::errors::{self, closed, os_error};
use crate::file::RawFile;
use crate::image::ImageSource;
use crate::path::{self, PathArg};
use crate::stat::StatResult;

/// Every call acts as root: a tool working on an image, not a user of
/// a mounted filesystem (the engine still applies immutable and
/// append-only).
static ROOT: LazyLock<Cred> = LazyLock::new(Cred::root);

/// An open ext2/3/4 filesystem (see the module doc). `ext4kit.open`
/// makes one.
#[pyclass(frozen, subclass, module = "ext4kit._ext4kit", name = "Filesystem")]
pub(crate) struct Filesystem {
    /// `None` once closed.
    fs: RwLock<Option<Arc<Fs>>>,
    source: ImageSource,
    location: Location,
}

impl Filesystem {
    /// The open filesystem, or ValueError after `close()`.
    fn get(&self) -> PyResult<Arc<Fs>> {
        self.fs.read().clone().ok_or_else(|| closed("filesystem"))
    }

    /// Run `f` on the filesystem without the GIL; an engine error becomes
    /// the OSError for it, naming `p`.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        p: &PathArg<'_>,
        f: impl FnOnce(&Fs, &[u8]) -> ext4kit::Result<T> + Send,
    ) -> PyResult<T> {
        let fs = self.get()?;
        let bytes = &p.bytes;
        py.detach(|| f(&fs, bytes))
            .map_err(|e| os_error(py, &e, Some(&p.obj), None))
    }
}

impl Drop for Filesystem {
    fn drop(&mut self) {
        // Closing writes back; a device that is a Python object needs the
        // GIL for that, so the close runs detached (its I/O attaches).
        if let Some(fs) = self.fs.get_mut().take() {
            let mut fs = Some(fs);
            Python::try_attach(|py| py.detach(|| drop(fs.take())));
            drop(fs);
        }
    }
}

/// The `OpenFlags` of a Python file mode (`rb`, `wb`, `ab`, `xb`, `r+b`,
/// ...; binary only: the engine reads and writes bytes).
fn parse_mode(mode: &str) -> PyResult<OpenFlags> {
    let bad = || {
        PyValueError::new_err(format!(
            "invalid mode: {mode:?} (binary modes: rb, wb, ab, xb, r+b, w+b, ...)"
        ))
    };
    let mut chars: Vec<char> = mode.chars().collect();
    chars.sort_unstable();
    if chars.contains(&'t') || chars.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad());
    }
    let plus = chars.contains(&'+');
    let kinds: Vec<char> = chars.iter().copied().filter(|c| "rwxa".contains(*c)).collect();
    if kinds.len() != 1 || chars.iter().any(|c| !"rwxab+".contains(*c)) {
        return Err(bad());
    }
    let mut f = OpenFlags::default();
    match kinds[0] {
        'r' => f.access = if plus { Access::ReadWrite } else { Access::ReadOnly },
        k => {
            f.access = if plus { Access::ReadWrite } else { Access::WriteOnly };
            f.create = true;
            f.trunc = k == 'w';
            f.excl = k == 'x';
            f.append = k == 'a';
        }
    }
    Ok(f)
}

/// Nanoseconds since the epoch as an ext4 time.
fn timestamp(ns: i128) -> PyResult<Timestamp> {
    let sec = i64::try_from(ns.div_euclid(1_000_000_000)).map_err(|_| PyValueError::new_err("time out of range"))?;
    Ok(Timestamp {
        sec,
        nsec: ns.rem_euclid(1_000_000_000) as u32,
    })
}

#[pymethods]
impl Filesystem {
    /// Open the filesystem in `image`: a path (or URL) or a binary file
    /// object, at partition `partition` or byte `offset` of it.
    #[new]
    #[pyo3(signature = (image, *, partition=None, offset=None, writable=false, no_replay=false))]
    fn new(
        py: Python<'_>,
        image: &Bound<'_, PyAny>,
        partition: Option<u32>,
        offset: Option<u64>,
        writable: bool,
        no_replay: bool,
    ) -> PyResult<Self> {
        let location = match (partition, offset) {
            (None, None) => Location::Whole,
            (Some(n), None) => Location::Partition(n),
            (None, Some(o)) => Location::Offset(o),
            (Some(_), Some(_)) => return Err(PyValueError::new_err("give partition or offset, not both")),
        };
        if no_replay && writable {
            return Err(PyValueError::new_err(
                "no_replay is for read-only opens: a writable open replays the journal first",
            ));
        }
        let source = if image.is_instance_of::<pyo3::types::PyString>()
            || image.is_instance_of::<PyBytes>()
            || image.hasattr("__fspath__")?
        {
            let (p, _) = path::encode(image)?;
            ImageSource::Path(std::path::PathBuf::from(std::ffi::OsString::from_vec(p)))
        } else if image.hasattr("read")? {
            ImageSource::Object(Arc::new(PyFileDevice::new(image, writable)?))
        } else {
            return Err(PyTypeError::new_err(
                "image must be a path, a URL or a binary file object (with read and seek)",
            ));
        };
        let opts = OpenOptions {
            read_only: !writable,
            no_replay,
            location,
            ..OpenOptions::default()
        };
        let fs = py.detach(|| source.open(&opts)).map_err(|e| {
            os_error(
                py,
                &e,
                Some(image).filter(|_| matches!(source, ImageSource::Path(_))),
                None,
            )
        })?;
        Ok(Filesystem {
            fs: RwLock::new(Some(fs)),
            source,
            location,
        })
    }

    /// `os.stat`: the inode `path` names, symlinks followed unless
    /// `follow_symlinks=False`.
    #[pyo3(signature = (path, *, follow_symlinks=true))]
    fn stat(&self, py: Python<'_>, path: &Bound<'_, PyAny>, follow_symlinks: bool) -> PyResult<StatResult> {
        let p = PathArg::new(path)?;
        let st = self.run(py, &p, |fs, b| match follow_symlinks {
            true => fs.stat(b),
            false => fs.lstat(b),
        })?;
        Ok(StatResult::new(st))
    }

    /// `os.lstat`: a final symlink is not followed.
    fn lstat(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<StatResult> {
        self.stat(py, path, false)
    }

    /// The entries of the directory `path`, without `.` and `..`:
    /// `(name, inode, type)` with `type` the `stat.S_IFMT` bits of the
    /// entry's file type (`None` on a filesystem without `filetype`).
    fn read_dir<'py>(&self, py: Python<'py>, path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let p = PathArg::new(path)?;
        let entries = self.run(py, &p, |fs, b| fs.read_dir(b))?;
        let out = PyList::empty(py);
        for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
            let kind = e.file_type.map(|t| u32::from(t.mode_bits()));
            out.append((p.name_out(&e.name)?, e.ino, kind))?;
        }
        Ok(out)
    }

    /// `os.readlink`: the target of the symlink `path`.
    fn readlink<'py>(&self, py: Python<'py>, path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let p = PathArg::new(path)?;
        let target = self.run(py, &p, |fs, b| fs.read_link(b))?;
        p.name_out(&target)
    }

    /// The raw file behind `open()` (the Python half wraps it in an
    /// `io.RawIOBase`): `mode` as Python's binary modes, `perm` the
    /// permission bits of a file it creates.
    #[pyo3(signature = (path, mode="rb", *, perm=0o644))]
    fn open_raw(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: &str, perm: u16) -> PyResult<RawFile> {
        let flags = parse_mode(mode)?;
        let p = PathArg::new(path)?;
        let fs = self.get()?;
        let file = self.run(py, &p, |fs, b| fs.open_as(b, &OpenRequest::new(flags).mode(perm)))?;
        Ok(RawFile::new(fs, file, flags.access))
    }

    /// `os.getxattr`: the value of extended attribute `attribute`
    /// (`user.x`, `security.selinux`, `trusted.*`, `system.posix_acl_access`).
    #[pyo3(signature = (path, attribute, *, follow_symlinks=true))]
    fn getxattr<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        attribute: &Bound<'py, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let p = PathArg::new(path)?;
        let (name, _) = path::encode(attribute)?;
        let v = self.run(py, &p, |fs, b| fs.getxattr(target(b, follow_symlinks), &name, &ROOT))?;
        Ok(PyBytes::new(py, &v))
    }

    /// `os.listxattr`: the names of the extended attributes, as `str`.
    #[pyo3(signature = (path, *, follow_symlinks=true))]
    fn listxattr<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let p = PathArg::new(path)?;
        let names = self.run(py, &p, |fs, b| fs.listxattr(target(b, follow_symlinks), &ROOT))?;
        let out = PyList::empty(py);
        for n in names {
            out.append(path::decode(py, &n, true)?)?;
        }
        Ok(out)
    }

    /// `os.setxattr` (`flags`: `os.XATTR_CREATE`, `os.XATTR_REPLACE`).
    #[pyo3(signature = (path, attribute, value, flags=0, *, follow_symlinks=true))]
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        attribute: &Bound<'_, PyAny>,
        value: &[u8],
        flags: u32,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let p = PathArg::new(path)?;
        let (name, _) = path::encode(attribute)?;
        self.run(py, &p, |fs, b| {
            fs.setxattr(target(b, follow_symlinks), &name, value, flags, &ROOT)
        })
    }

    /// `os.removexattr`.
    #[pyo3(signature = (path, attribute, *, follow_symlinks=true))]
    fn removexattr(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        attribute: &Bound<'_, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let p = PathArg::new(path)?;
        let (name, _) = path::encode(attribute)?;
        self.run(py, &p, |fs, b| fs.removexattr(target(b, follow_symlinks), &name, &ROOT))
    }

    /// `os.mkdir` (no umask: `mode` is what the directory gets).
    #[pyo3(signature = (path, mode=0o755))]
    fn mkdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u16) -> PyResult<()> {
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| fs.create(&NewInode::dir(b).mode(mode)).map(drop))
    }

    /// `os.symlink`: `dst` becomes a symlink to `src`.
    fn symlink(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let (target_bytes, _) = path::encode(src)?;
        let p = PathArg::new(dst)?;
        self.run(py, &p, |fs, b| {
            fs.create(&NewInode::symlink(b, &target_bytes)).map(drop)
        })
    }

    /// `os.link`: `dst` becomes another name of `src`'s inode.
    fn link(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let (s, d) = (PathArg::new(src)?, PathArg::new(dst)?);
        let fs = self.get()?;
        py.detach(|| fs.link(&s.bytes[..], &d.bytes[..], &ROOT).map(drop))
            .map_err(|e| os_error(py, &e, Some(&s.obj), Some(&d.obj)))
    }

    /// `os.mknod`: a device node (`stat.S_IFCHR`/`S_IFBLK` in `mode`,
    /// `device` from `os.makedev`), fifo or socket.
    #[pyo3(signature = (path, mode=0o600 | 0o010000, device=0))]
    fn mknod(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32, device: u64) -> PyResult<()> {
        let (major, minor) = (rustix::fs::major(device), rustix::fs::minor(device));
        let kind = match mode & 0o170000 {
            0o020000 => NodeKind::CharDevice(major, minor),
            0o060000 => NodeKind::BlockDevice(major, minor),
            0o010000 => NodeKind::Fifo,
            0o140000 => NodeKind::Socket,
            0o100000 | 0 => NodeKind::File,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "mknod: unsupported file type in mode 0o{mode:o}"
                )))
            }
        };
        let p = PathArg::new(path)?;
        let perm = (mode & 0o7777) as u16;
        self.run(py, &p, |fs, b| fs.create(&NewInode::new(b, kind).mode(perm)).map(drop))
    }

    /// `os.remove` / `os.unlink`: remove a name that is not a directory.
    fn remove(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| fs.unlink(b, &ROOT))
    }

    /// `os.unlink`: the same as `remove`.
    fn unlink(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        self.remove(py, path)
    }

    /// `os.rmdir`: remove an empty directory.
    fn rmdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| fs.rmdir(b, &ROOT))
    }

    /// `os.rename` (`os.replace`): move `src` to `dst`, replacing what is
    /// there; `noreplace=True` fails with FileExistsError instead.
    #[pyo3(signature = (src, dst, *, noreplace=false))]
    fn rename(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>, noreplace: bool) -> PyResult<()> {
        let (s, d) = (PathArg::new(src)?, PathArg::new(dst)?);
        let fs = self.get()?;
        let flags = RenameFlags {
            noreplace,
            ..Default::default()
        };
        py.detach(|| fs.rename(&s.bytes[..], &d.bytes[..], flags, &ROOT))
            .map_err(|e| os_error(py, &e, Some(&s.obj), Some(&d.obj)))
    }

    /// `os.chmod`: the permission bits (set-id and sticky included).
    #[pyo3(signature = (path, mode, *, follow_symlinks=true))]
    fn chmod(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u16, follow_symlinks: bool) -> PyResult<()> {
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| {
            fs.chmod(target(b, follow_symlinks), mode, &ROOT).map(drop)
        })
    }

    /// `os.chown`: -1 leaves the owner or group as it is.
    #[pyo3(signature = (path, uid, gid, *, follow_symlinks=true))]
    fn chown(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        uid: i64,
        gid: i64,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let id = |v: i64| -> PyResult<Option<u32>> {
            match v {
                -1 => Ok(None),
                v => u32::try_from(v)
                    .map(Some)
                    .map_err(|_| PyValueError::new_err(format!("id {v} out of range"))),
            }
        };
        let (u, g) = (id(uid)?, id(gid)?);
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| {
            fs.chown(target(b, follow_symlinks), u, g, &ROOT).map(drop)
        })
    }

    /// `os.utime` with `ns=(atime_ns, mtime_ns)`; without it, both now.
    #[pyo3(signature = (path, *, ns=None, follow_symlinks=true))]
    fn utime(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        ns: Option<(i128, i128)>,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let (a, m) = match ns {
            Some((a, m)) => (TimeSet::Set(timestamp(a)?), TimeSet::Set(timestamp(m)?)),
            None => (TimeSet::Now, TimeSet::Now),
        };
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| {
            fs.utimens(target(b, follow_symlinks), Some(a), Some(m), &ROOT)
                .map(drop)
        })
    }

    /// `os.truncate`: set the size of the file `path`.
    fn truncate(&self, py: Python<'_>, path: &Bound<'_, PyAny>, length: u64) -> PyResult<()> {
        let p = PathArg::new(path)?;
        self.run(py, &p, |fs, b| {
            let flags = OpenFlags {
                access: Access::WriteOnly,
                ..Default::default()
            };
            let f = fs.open(b, flags)?;
            let r = fs.ftruncate(&f, length);
            r.and(fs.close_file(f))
        })
    }

    /// Copy the host file or tree `src` in as `cp -a SRC DEST` does
    /// (`ext4kit put`): into `dest` under its own name when `dest` is a
    /// directory, else as `dest`. Modes, owners (the host's, or root's
    /// with `all_root=True`), times, symlinks, hard links, device nodes,
    /// xattrs and holes are kept. Returns `(entries, bytes)` copied.
    #[pyo3(signature = (src, dest, *, all_root=false))]
    fn put(
        &self,
        py: Python<'_>,
        src: std::path::PathBuf,
        dest: &Bound<'_, PyAny>,
        all_root: bool,
    ) -> PyResult<(u64, u64)> {
        let d = PathArg::new(dest)?;
        let fs = self.get()?;
        let r = py.detach(|| crate::builder::put(&fs, &src, &d.bytes, all_root));
        match r {
            Ok(p) => Ok((p.entries, p.bytes)),
            Err(crate::builder::PutError::Engine(e)) => Err(os_error(py, &e, Some(&d.obj), None)),
            Err(crate::builder::PutError::Build(e)) => Err(errors::build_error(py, &e)),
        }
    }

    /// Write everything back and make it durable; the image is complete
    /// on its own afterwards (the journal checkpointed and emptied).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let fs = self.get()?;
        py.detach(|| fs.sync()).map_err(|e| os_error(py, &e, None, None))
    }

    /// Close: write back, and close the image cleanly (a clean journal,
    /// `e2fsck -fn` has nothing to say). Files still open keep the image
    /// open until they are closed; every other call raises ValueError.
    /// Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(fs) = self.fs.write().take() else {
            return Ok(());
        };
        py.detach(|| {
            let r = if fs.read_only() { Ok(()) } else { fs.sync() };
            drop(fs);
            r
        })
        .map_err(|e| os_error(py, &e, None, None))
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.fs.read().is_none()
    }

    /// Whether the filesystem is open read-only (asked for, or decided at
    /// the open: see `info()["read_only_reason"]`).
    #[getter]
    fn read_only(&self) -> PyResult<bool> {
        Ok(self.get()?.read_only())
    }

    /// The superblock's summary, as `ext4kit info` prints it: label,
    /// uuid, block_size, inode_size, blocks, free_blocks,
    /// reserved_blocks, inodes, free_inodes, groups, blocks_per_group,
    /// inodes_per_group, features, state, hash_alg, wtime, mkfs_time,
    /// read_only, read_only_reason, warnings.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let fs = self.get()?;
        let i = py.detach(|| fs.info());
        let d = PyDict::new(py);
        d.set_item("label", i.label)?;
        d.set_item("uuid", i.uuid)?;
        d.set_item("block_size", i.block_size)?;
        d.set_item("inode_size", i.inode_size)?;
        d.set_item("blocks", i.blocks)?;
        d.set_item("free_blocks", i.free_blocks)?;
        d.set_item("reserved_blocks", i.reserved_blocks)?;
        d.set_item("inodes", i.inodes)?;
        d.set_item("free_inodes", i.free_inodes)?;
        d.set_item("groups", i.groups)?;
        d.set_item("blocks_per_group", i.blocks_per_group)?;
        d.set_item("inodes_per_group", i.inodes_per_group)?;
        d.set_item("features", i.features)?;
        d.set_item("state", i.state)?;
        d.set_item("hash_alg", i.hash_alg)?;
        d.set_item("wtime", i.wtime)?;
        d.set_item("mkfs_time", i.mkfs_time)?;
        d.set_item("read_only", i.read_only)?;
        d.set_item("read_only_reason", fs.read_only_reason())?;
        d.set_item("warnings", i.warnings)?;
        Ok(d)
    }

    /// What the journal holds and what replaying it would do, read from
    /// the image as it is now: the document `ext4kit journal --json`
    /// prints (`transactions`, `end`, `replay`, `verdict`, ...), as dicts
    /// and lists. OSError when the filesystem has no journal.
    fn journal<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get()?;
        let loc = self.location;
        let report = py
            .detach(|| self.source.journal(loc).map(|r| r.to_json()))
            .map_err(|e| os_error(py, &e, None, None))?;
        crate::journal::to_py(py, &report)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = match &*self.fs.read() {
            None => "closed",
            Some(fs) if fs.read_only() => "read-only",
            Some(_) => "writable",
        };
        let at = match self.location {
            Location::Whole => String::new(),
            l => format!(" at {l}"),
        };
        format!("<ext4kit.Filesystem {}{at} ({state})>", self.source.describe())
    }
}

/// A path target, its final symlink followed or not.
fn target(path: &[u8], follow: bool) -> Target<'_> {
    match follow {
        true => Target::path(path),
        false => Target::path(path).nofollow(),
    }
}
