//! The `ext4kit` Python package's extension module, `ext4kit._ext4kit`:
//! the ext4kit library's calls with Python's conventions. One module per
//! concept: [`image`] and [`device`] (where an image comes from: a path,
//! a URL, a file object), [`fs`] (the filesystem object), [`file`] (an
//! open file), [`stat`] (stat results), [`path`] (paths and names),
//! [`errors`] (engine errors as `OSError`s), [`journal`] (the journal
//! report), [`builder`] (building images, copying host trees in). The
//! Python half (python/ext4kit) adds `walk`, `scandir`, `listdir` and the
//! `io.RawIOBase` file over these.

mod builder;
mod device;
mod errors;
mod file;
mod fs;
mod image;
mod journal;
mod path;
mod stat;

use pyo3::prelude::*;

#[pymodule]
fn _ext4kit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<fs::Filesystem>()?;
    m.add_class::<file::RawFile>()?;
    m.add_class::<stat::StatResult>()?;
    m.add_function(wrap_pyfunction!(builder::build, m)?)?;
    m.add("BuildError", m.py().get_type::<errors::BuildError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
