//! `stat()` results as Python sees them: the fields of `os.stat_result`
//! under the same names, so code written for `os.stat` reads an image's
//! inodes unchanged, plus the creation time ext4 keeps (`i_crtime`).

use ext4kit::{FileType, Stat, Timestamp};
use pyo3::prelude::*;

/// What `stat` and `lstat` return: `os.stat_result`'s fields by name
/// (`st_mode`, `st_ino`, `st_nlink`, ..., the times as float seconds and
/// as integer nanoseconds), plus `st_birthtime_ns` / `st_birthtime` (the
/// inode's creation time; `None` when its record has no room for one, as
/// in 128-byte inodes), `st_flags` (the ext4 inode flags, `chattr`'s) and
/// `st_generation`.
#[pyclass(frozen, module = "ext4kit", name = "StatResult")]
pub(crate) struct StatResult {
    st: Stat,
}

/// Nanoseconds since the epoch: what `st_*time_ns` hold (signed: ext4
/// times reach back to 1901).
fn ns(t: Timestamp) -> i128 {
    i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec)
}

/// Seconds as a float, as `os.stat_result`'s `st_*time`.
fn secs(t: Timestamp) -> f64 {
    t.sec as f64 + f64::from(t.nsec) * 1e-9
}

impl StatResult {
    pub(crate) fn new(st: Stat) -> Self {
        StatResult { st }
    }
}

#[pymethods]
impl StatResult {
    /// File type and permission bits (`S_ISDIR(st_mode)` etc. work).
    #[getter]
    fn st_mode(&self) -> u32 {
        u32::from(self.st.mode)
    }
    #[getter]
    fn st_ino(&self) -> u32 {
        self.st.ino
    }
    /// Always 0: an image has no device number of its own.
    #[getter]
    fn st_dev(&self) -> u32 {
        0
    }
    #[getter]
    fn st_nlink(&self) -> u16 {
        self.st.nlink
    }
    #[getter]
    fn st_uid(&self) -> u32 {
        self.st.uid
    }
    #[getter]
    fn st_gid(&self) -> u32 {
        self.st.gid
    }
    #[getter]
    fn st_size(&self) -> u64 {
        self.st.size
    }
    /// 512-byte units allocated, as `stat(2)` counts them.
    #[getter]
    fn st_blocks(&self) -> u64 {
        self.st.blocks
    }
    /// A device node's number, encoded as `os.makedev` (glibc's layout);
    /// 0 for other files.
    #[getter]
    fn st_rdev(&self) -> u64 {
        match self.st.ftype {
            FileType::CharDevice | FileType::BlockDevice => rustix::fs::makedev(self.st.rdev.0, self.st.rdev.1),
            _ => 0,
        }
    }
    #[getter]
    fn st_atime_ns(&self) -> i128 {
        ns(self.st.atime)
    }
    #[getter]
    fn st_mtime_ns(&self) -> i128 {
        ns(self.st.mtime)
    }
    #[getter]
    fn st_ctime_ns(&self) -> i128 {
        ns(self.st.ctime)
    }
    /// The creation time, or `None` when the inode has no room for it.
    #[getter]
    fn st_birthtime_ns(&self) -> Option<i128> {
        self.st.has_crtime.then(|| ns(self.st.crtime))
    }
    #[getter]
    fn st_atime(&self) -> f64 {
        secs(self.st.atime)
    }
    #[getter]
    fn st_mtime(&self) -> f64 {
        secs(self.st.mtime)
    }
    #[getter]
    fn st_ctime(&self) -> f64 {
        secs(self.st.ctime)
    }
    #[getter]
    fn st_birthtime(&self) -> Option<f64> {
        self.st.has_crtime.then(|| secs(self.st.crtime))
    }
    /// The ext4 inode flags (`i_flags`: immutable, append-only, extents, ...).
    #[getter]
    fn st_flags(&self) -> u32 {
        self.st.flags
    }
    #[getter]
    fn st_generation(&self) -> u32 {
        self.st.generation
    }

    fn __repr__(&self) -> String {
        let s = &self.st;
        format!(
            "ext4kit.StatResult(st_mode=0o{:o}, st_ino={}, st_nlink={}, st_uid={}, st_gid={}, st_size={}, \
             st_mtime_ns={})",
            s.mode,
            s.ino,
            s.nlink,
            s.uid,
            s.gid,
            s.size,
            ns(s.mtime)
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<StatResult>().is_ok_and(|o| o.get().st == self.st)
    }
}
