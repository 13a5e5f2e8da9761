//! A Python file-like object (`io.BytesIO`, an open file, anything with
//! `seek` and `read`, and `write` for a writable image) as the engine's
//! [`BlockDevice`].
//!
//! The engine calls the device from whichever thread does the I/O — the
//! caller's, or its background commit worker — always without the GIL
//! (every engine call from Python runs in `py.detach`). Each call takes
//! the device's lock first and only then attaches to the interpreter, for
//! the `seek` and the `read` or `write` of that one request: the lock
//! keeps another thread's `seek` from landing between the two, and taking
//! it before the GIL (never while holding it) means a thread holding the
//! GIL never waits for a thread that waits for the GIL.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use ext4kit::device::BlockDevice;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// See the module doc.
pub(crate) struct PyFileDevice {
    obj: Py<PyAny>,
    /// Held across each request's `seek` and `read`/`write`.
    lock: Mutex<()>,
    /// The object's length: measured at open, raised by writes past it (a
    /// container format that appends to its file reads back what it
    /// appended).
    size: AtomicU64,
    writable: bool,
}

impl PyFileDevice {
    /// Wrap `obj`, measuring it with `seek(0, 2)`. A writable device needs
    /// a `write` method, and `writable()` true where the object has one.
    pub(crate) fn new(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        for m in ["seek", "read"] {
            if !obj.hasattr(m)? {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "an image object needs a {m}() method (a file opened in binary mode, io.BytesIO, ...)"
                )));
            }
        }
        if writable {
            let can = obj.hasattr("write")?
                && match obj.getattr_opt("writable")? {
                    Some(f) => f.call0()?.is_truthy()?,
                    None => true,
                };
            if !can {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "writable=True needs an image object that can be written (write() and writable())",
                ));
            }
        }
        let size: u64 = obj.call_method1("seek", (0, 2))?.extract()?;
        Ok(PyFileDevice {
            obj: obj.clone().unbind(),
            lock: Mutex::new(()),
            size: AtomicU64::new(size),
            writable,
        })
    }

    /// Run `f` with the object, under the lock and attached to the
    /// interpreter; a Python exception becomes an I/O error naming it.
    fn with_obj<T>(&self, f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>) -> io::Result<T> {
        let _held = self.lock.lock();
        Python::try_attach(|py| f(self.obj.bind(py)).map_err(|e| io::Error::other(format!("the image object: {e}"))))
            .unwrap_or_else(|| Err(io::Error::other("the Python interpreter is shutting down")))
    }
}

impl BlockDevice for PyFileDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let size = self.size.load(Ordering::Acquire);
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at offset {off} past the end of the image ({size} bytes)",
                    buf.len()
                ),
            ));
        }
        self.with_obj(|obj| {
            obj.call_method1("seek", (off,))?;
            // read() may return less than asked (a raw file, a pipe-like
            // object): ask again for the rest.
            let mut done = 0;
            while done < buf.len() {
                let chunk = obj.call_method1("read", (buf.len() - done,))?;
                let bytes = chunk.cast::<PyBytes>()?.as_bytes();
                if bytes.is_empty() {
                    return Err(pyo3::exceptions::PyEOFError::new_err(format!(
                        "read() returned nothing at offset {} of {size} bytes",
                        off + done as u64
                    )));
                }
                let n = bytes.len().min(buf.len() - done);
                buf[done..done + n].copy_from_slice(&bytes[..n]);
                done += n;
            }
            Ok(())
        })
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "image object opened read-only",
            ));
        }
        let end = off
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("write at {off} past the end")))?;
        self.with_obj(|obj| {
            obj.call_method1("seek", (off,))?;
            let mut done = 0;
            while done < buf.len() {
                let n: Option<usize> = obj
                    .call_method1("write", (PyBytes::new(obj.py(), &buf[done..]),))?
                    .extract()?;
                match n {
                    Some(0) => {
                        return Err(pyo3::exceptions::PyOSError::new_err("write() wrote nothing"));
                    }
                    Some(n) => done += n,
                    // None: a non-blocking raw file with no room; a
                    // buffered file writes all or raises.
                    None => return Err(pyo3::exceptions::PyBlockingIOError::new_err("write() returned None")),
                }
            }
            Ok(())
        })?;
        // Only a write past the end touches the shared size: writes
        // inside the image (all of an ext4's) stay a plain load.
        if end > self.size.load(Ordering::Acquire) {
            self.size.fetch_max(end, Ordering::AcqRel);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.with_obj(|obj| {
            if obj.hasattr("flush")? {
                obj.call_method0("flush")?;
            }
            Ok(())
        })
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_only(&self) -> bool {
        !self.writable
    }

    /// A writable binary file object (a file, `io.BytesIO`) extends on a
    /// write past its end, as a VMDK sparse extent's new grains need.
    fn grows(&self) -> bool {
        self.writable
    }
}
