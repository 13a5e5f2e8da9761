//! Engine errors as Python exceptions. An `ext4kit::Error` carries the
//! errno a system call would return; `OSError(errno, strerror, filename)`
//! built from it is the subclass Python's own `os` calls raise for that
//! errno (`FileNotFoundError` for ENOENT, `PermissionError` for EACCES,
//! ...) — CPython's `OSError.__new__` picks the subclass from the errno — so
//! `except FileNotFoundError` works as it does around `os.stat`.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _ext4kit,
    BuildError,
    PyOSError,
    "An image build failed: the message names the source, the entry and why \
     (the image is not left behind looking complete)."
);

/// The exception for `e`, naming `filename` (and `filename2`, for the calls
/// that name two paths), with the engine's message as `strerror`.
pub(crate) fn os_error(
    py: Python<'_>,
    e: &ext4kit::Error,
    filename: Option<&Bound<'_, PyAny>>,
    filename2: Option<&Bound<'_, PyAny>>,
) -> PyErr {
    // The device's own error keeps its errno (a missing image file is
    // ENOENT, not the EIO the engine reports for any device failure).
    let errno = match e {
        ext4kit::Error::Io { source, .. } => source.raw_os_error().unwrap_or(e.errno() as i32),
        _ => e.errno() as i32,
    };
    from_errno(py, errno, &e.to_string(), filename, filename2)
}

/// `OSError(errno, message, filename, None, filename2)`: the subclass the
/// errno maps to.
pub(crate) fn from_errno(
    py: Python<'_>,
    errno: i32,
    message: &str,
    filename: Option<&Bound<'_, PyAny>>,
    filename2: Option<&Bound<'_, PyAny>>,
) -> PyErr {
    let os_error = py.get_type::<PyOSError>();
    let made = match filename2 {
        Some(f2) => os_error.call1((errno, message, filename, py.None(), f2)),
        None => os_error.call1((errno, message, filename)),
    };
    match made {
        Ok(v) => PyErr::from_value(v),
        Err(e) => e,
    }
}

/// A build's failure: `BuildError(message)`, with the entry (or archive
/// member) it is about as `filename` when there is one.
pub(crate) fn build_error(py: Python<'_>, e: &ext4kit_populate::Error) -> PyErr {
    let err = BuildError::new_err(e.to_string());
    if let Some(entry) = e.entry_name() {
        // Setting an attribute of a fresh exception cannot fail.
        let _ = err.value(py).setattr("filename", entry);
    }
    err
}

/// Any call on a filesystem or file after `close()`: Python's own
/// "I/O operation on closed file".
pub(crate) fn closed(what: &str) -> PyErr {
    PyValueError::new_err(format!("I/O operation on closed {what}"))
}
