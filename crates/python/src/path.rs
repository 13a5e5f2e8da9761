//! Paths in and names out, as the `os` module treats them: a `str`,
//! `bytes` or `os.PathLike` path in; names back as `str` when the path
//! was a `str` (decoded with the filesystem encoding and
//! `surrogateescape`, so any byte string round-trips) and as `bytes` when
//! it was `bytes`. Paths name the image's tree from its root: `etc/passwd`
//! and `/etc/passwd` are the same file.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A path argument: its bytes for the engine, and the object itself for
/// the `filename` of an error.
pub(crate) struct PathArg<'py> {
    /// Absolute, as the engine takes it.
    pub(crate) bytes: Vec<u8>,
    /// Whether names derived from it are returned as `str`.
    pub(crate) is_str: bool,
    /// What the caller passed.
    pub(crate) obj: Bound<'py, PyAny>,
}

impl<'py> PathArg<'py> {
    /// `os.fsencode(os.fspath(obj))`, made absolute.
    pub(crate) fn new(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (bytes, is_str) = encode(obj)?;
        let bytes = if bytes.starts_with(b"/") {
            bytes
        } else {
            [b"/".as_slice(), &bytes].concat()
        };
        Ok(PathArg {
            bytes,
            is_str,
            obj: obj.clone(),
        })
    }

    /// A name (or target) as this path's kind: `str` or `bytes`.
    pub(crate) fn name_out(&self, name: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        decode(self.obj.py(), name, self.is_str)
    }
}

/// `os.fsencode(os.fspath(obj))` and whether it was a `str`: for xattr
/// names and symlink targets too, which are not made absolute.
pub(crate) fn encode(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<u8>, bool)> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok((b.as_bytes().to_vec(), false));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        // The common case without a call into `os`; a string with lone
        // surrogates (undecodable bytes) goes through fsencode below.
        if let Ok(s) = s.to_str() {
            return Ok((s.as_bytes().to_vec(), true));
        }
    }
    let os = obj.py().import("os")?;
    let p = os.call_method1("fspath", (obj,))?;
    let is_str = p.is_instance_of::<PyString>();
    let b = os.call_method1("fsencode", (p,))?;
    Ok((b.cast::<PyBytes>()?.as_bytes().to_vec(), is_str))
}

/// `name` as `str` (`os.fsdecode`) or `bytes`.
pub(crate) fn decode<'py>(py: Python<'py>, name: &[u8], as_str: bool) -> PyResult<Bound<'py, PyAny>> {
    if !as_str {
        return Ok(PyBytes::new(py, name).into_any());
    }
    match std::str::from_utf8(name) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => py.import("os")?.call_method1("fsdecode", (PyBytes::new(py, name),)),
    }
}
