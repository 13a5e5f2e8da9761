//! The raw file behind `Filesystem.open()`: an open file of the engine
//! with its own position. The Python half wraps it in an `io.RawIOBase`
//! subclass (`ext4kit.File`), so `io.BufferedReader`, `shutil.copyfileobj`
//! and `with` work as for a host file. Reads and writes run without the
//! GIL.

use std::sync::Arc;

use ext4kit::{Access, File, Fs, Whence};
use parking_lot::RwLock;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice};

use crate::errors::{closed, os_error};

/// Reads beyond this are done in pieces, each with the GIL released.
const CHUNK: usize = 1 << 20;

/// See the module doc.
#[pyclass(frozen, module = "ext4kit._ext4kit", name = "RawFile")]
pub(crate) struct RawFile {
    /// The open file and its filesystem, `None` once closed. The
    /// filesystem stays open while one of its files is: `close()` of the
    /// filesystem finishes when its last file is closed.
    open: RwLock<Option<(Arc<Fs>, Arc<File>)>>,
    access: Access,
}

impl RawFile {
    pub(crate) fn new(fs: Arc<Fs>, file: Arc<File>, access: Access) -> Self {
        RawFile {
            open: RwLock::new(Some((fs, file))),
            access,
        }
    }

    /// Run `f` on the open file without the GIL.
    fn run<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&Fs, &File) -> ext4kit::Result<T> + Send) -> PyResult<T> {
        let (fs, file) = self.open.read().clone().ok_or_else(|| closed("file"))?;
        py.detach(|| f(&fs, &file)).map_err(|e| os_error(py, &e, None, None))
    }
}

/// Close `file` and let go of `fs`: the last close of an unlinked file
/// frees it, and the last handle on a closed filesystem closes the image
/// (written back as at an unmount). Engine work, so without the GIL where
/// there is a GIL to release.
fn release(fs: Arc<Fs>, file: Arc<File>) -> ext4kit::Result<()> {
    let r = fs.close_file(file);
    drop(fs);
    r
}

impl Drop for RawFile {
    fn drop(&mut self) {
        if let Some((fs, file)) = self.open.get_mut().take() {
            let mut held = Some((fs, file));
            Python::try_attach(|py| {
                py.detach(|| {
                    if let Some((fs, file)) = held.take() {
                        let _ = release(fs, file);
                    }
                })
            });
            if let Some((fs, file)) = held.take() {
                let _ = release(fs, file);
            }
        }
    }
}

#[pymethods]
impl RawFile {
    /// Read into the writable buffer `b` (bytes-like, one byte per item)
    /// at the position; returns how many bytes were read (0 at the end).
    fn readinto(&self, py: Python<'_>, b: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buf = PyBuffer::<u8>::get(b)?;
        if buf.readonly() {
            return Err(PyValueError::new_err("readinto() needs a writable buffer"));
        }
        let len = buf.item_count();
        let mut data = vec![0u8; len];
        let n = self.run(py, |fs, f| fs.read(f, &mut data))?;
        if n == len {
            buf.copy_from_slice(py, &data)?;
        } else if n > 0 {
            let view = PyMemoryView::from(b)?;
            let part = view.get_item(PySlice::new(py, 0, n as isize, 1))?;
            PyBuffer::<u8>::get(&part)?.copy_from_slice(py, &data[..n])?;
        }
        Ok(n)
    }

    /// Read up to `size` bytes (all to the end with -1) at the position.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.run(py, |fs, f| {
            let want = match u64::try_from(size) {
                Ok(n) => n,
                Err(_) => f.inode.size().saturating_sub(f.position()),
            };
            let mut out = Vec::new();
            while (out.len() as u64) < want {
                let step = (want - out.len() as u64).min(CHUNK as u64) as usize;
                let at = out.len();
                out.resize(at + step, 0);
                let n = fs.read(f, &mut out[at..])?;
                out.truncate(at + n);
                if n == 0 || size >= 0 {
                    break;
                }
            }
            Ok(out)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Read up to `size` bytes at `offset`, the position unchanged
    /// (`os.pread`): for threads sharing one file.
    fn pread<'py>(&self, py: Python<'py>, size: usize, offset: u64) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.run(py, |fs, f| {
            let mut out = vec![0u8; size];
            let n = fs.pread(f, offset, &mut out)?;
            out.truncate(n);
            Ok(out)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Write the bytes-like `b` at the position (at the end in append
    /// mode); returns how many bytes were written.
    fn write(&self, py: Python<'_>, b: &Bound<'_, PyAny>) -> PyResult<usize> {
        let data = PyBuffer::<u8>::get(b)?.to_vec(py)?;
        self.run(py, |fs, f| {
            let mut done = 0;
            while done < data.len() {
                done += fs.write(f, &data[done..])?;
            }
            Ok(done)
        })
    }

    /// `lseek`: `whence` 0, 1, 2 (`os.SEEK_SET`, `SEEK_CUR`, `SEEK_END`),
    /// or `os.SEEK_DATA` / `os.SEEK_HOLE`; returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let w = match whence {
            0 => Whence::Set,
            1 => Whence::Cur,
            2 => Whence::End,
            3 => Whence::Data,
            4 => Whence::Hole,
            _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
        };
        self.run(py, |fs, f| fs.lseek(f, offset, w))
    }

    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.seek(py, 0, 1)
    }

    /// Set the file's size to `size` (the position when `None`).
    #[pyo3(signature = (size=None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        self.run(py, |fs, f| {
            let size = match size {
                Some(s) => s,
                None => fs.lseek(f, 0, Whence::Cur)?,
            };
            fs.ftruncate(f, size).map(|()| size)
        })
    }

    /// `os.fsync`: the file's data and inode durable in the image.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |fs, f| fs.fsync(f))
    }

    fn readable(&self) -> bool {
        self.access.reads()
    }

    fn writable(&self) -> bool {
        self.access.writes()
    }

    /// The inode number.
    #[getter]
    fn ino(&self, py: Python<'_>) -> PyResult<u32> {
        self.run(py, |_, f| Ok(f.inode.ino))
    }

    /// Close the file (the last close of an unlinked file frees it).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some((fs, file)) = self.open.write().take() else {
            return Ok(());
        };
        py.detach(|| release(fs, file))
            .map_err(|e| os_error(py, &e, None, None))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.open.read().is_none()
    }
}
