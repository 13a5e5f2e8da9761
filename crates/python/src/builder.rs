//! Building images from Python: `ext4kit.build(...)` is
//! `ext4kit_populate::ImageBuilder` (what `ext4kit mkfs -d` runs) with its
//! options as keyword arguments, and `Filesystem.put` is the populator
//! `ext4kit put` runs, copying a host file or tree into an open image.

use std::path::{Path, PathBuf};

use ext4kit::mkfs::{FsType, MkfsOptions};
use ext4kit::readers::Reader;
use ext4kit::{Clock, FileType, Fs};
use ext4kit_populate::file_contexts::FileContexts;
use ext4kit_populate::fs_config::FsConfig;
use ext4kit_populate::sizing::Extra;
use ext4kit_populate::source::{self, dir::DirSource, oci::ImageChoice};
use ext4kit_populate::{IdMap, ImageBuilder, ImageSize, OutputFormat, Owners, Placement, Populator, Progress, Rules};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::build_error;

/// Free space or free inodes beyond what the sources need: a number
/// (bytes, or inodes), or a string percentage of the image's (`"10%"`).
fn extra(v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Extra> {
    let Some(v) = v else { return Ok(Extra::Amount(0)) };
    if let Ok(n) = v.extract::<u64>() {
        return Ok(Extra::Amount(n));
    }
    let s: String = v.extract()?;
    Extra::parse(&s, |a| a.parse::<u64>().map_err(|_| format!("\"{a}\": not a number")))
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// The owner rule: every file root's, or ids mapped as a user
/// namespace's `uid_map` lines ("IMAGE:SOURCE:COUNT"), or the sources'.
fn owners(all_root: bool, uid_map: &[String], gid_map: &[String]) -> PyResult<Owners> {
    if all_root {
        return Ok(Owners::all_root());
    }
    let (mut u, mut g) = (IdMap::default(), IdMap::default());
    for s in uid_map {
        u.push(s).map_err(|e| PyValueError::new_err(format!("uid_map {e}")))?;
    }
    for s in gid_map {
        g.push(s).map_err(|e| PyValueError::new_err(format!("gid_map {e}")))?;
    }
    Ok(Owners::mapped(u, g))
}

/// A rules file read and parsed (`file_contexts`, `fs_config`).
fn read_rules<T>(p: Option<&Path>, parse: impl Fn(&str, &str) -> Result<T, String>) -> PyResult<Option<T>> {
    let Some(p) = p else { return Ok(None) };
    let text = std::fs::read_to_string(p).map_err(|e| PyValueError::new_err(format!("{}: {e}", p.display())))?;
    parse(&text, &p.display().to_string())
        .map(Some)
        .map_err(PyValueError::new_err)
}

/// Build an ext2/3/4 image at `output` from `sources` (directories, tar
/// archives plain or compressed, OCI images; later over earlier), as
/// `ext4kit mkfs -d` does. Without `size` the image is the smallest that
/// holds the sources plus `free` and `free_inodes`. Returns what was
/// made: size, blocks, inodes, uuid, features, entries and bytes copied,
/// and what the sources needed. The build goes to a temporary file renamed
/// over `output` when complete: a failed build leaves nothing behind.
#[pyfunction]
#[pyo3(signature = (
    output, sources=Vec::new(), *, size=None, free=None, free_inodes=None, fs_type="ext4",
    block_size=None, inode_size=None, inodes=None, label=None, uuid=None, reserved_percent=None,
    features=Vec::new(), compat=Vec::new(), all_root=false, uid_map=Vec::new(), gid_map=Vec::new(),
    file_contexts=None, fs_config=None, output_format="raw", oci_image=None, platform=None,
    timestamp=None, progress=None,
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn build<'py>(
    py: Python<'py>,
    output: PathBuf,
    sources: Vec<PathBuf>,
    size: Option<u64>,
    free: Option<&Bound<'py, PyAny>>,
    free_inodes: Option<&Bound<'py, PyAny>>,
    fs_type: &str,
    block_size: Option<u32>,
    inode_size: Option<u16>,
    inodes: Option<u64>,
    label: Option<String>,
    uuid: Option<&Bound<'py, PyAny>>,
    reserved_percent: Option<f64>,
    features: Vec<String>,
    compat: Vec<String>,
    all_root: bool,
    uid_map: Vec<String>,
    gid_map: Vec<String>,
    file_contexts: Option<PathBuf>,
    fs_config: Option<PathBuf>,
    output_format: &str,
    oci_image: Option<String>,
    platform: Option<String>,
    timestamp: Option<i64>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let fs_type = FsType::parse(fs_type)
        .ok_or_else(|| PyValueError::new_err(format!("unknown fs_type {fs_type:?} (ext2, ext3 or ext4)")))?;
    let mut o = MkfsOptions {
        fs_type,
        block_size,
        inodes,
        label: label.unwrap_or_default(),
        features,
        readers: compat
            .iter()
            .map(|r| Reader::parse(r).map_err(|e| PyValueError::new_err(e.to_string())))
            .collect::<PyResult<_>>()?,
        ..MkfsOptions::default()
    };
    if let Some(i) = inode_size {
        o.inode_size = i;
    }
    if let Some(m) = reserved_percent {
        o.reserved_percent = m;
    }
    if let Some(u) = uuid {
        // uuid.UUID reads every spelling (and takes a UUID object's str).
        let bytes: Vec<u8> = py
            .import("uuid")?
            .getattr("UUID")?
            .call1((u.str()?,))?
            .getattr("bytes")?
            .extract()?;
        o.uuid = Some(
            bytes
                .try_into()
                .map_err(|_| PyValueError::new_err("uuid: not 16 bytes"))?,
        );
    }
    o.clock = match timestamp {
        Some(t) => Clock::fixed(t),
        None => Clock::from_source_date_epoch().map_err(PyValueError::new_err)?,
    };
    let size = match size {
        Some(b) => ImageSize::Bytes(b),
        None => ImageSize::Smallest {
            free: extra(free, "free")?,
            free_inodes: extra(free_inodes, "free_inodes")?,
        },
    };
    let rules = Rules {
        owners: owners(all_root, &uid_map, &gid_map)?,
        file_contexts: read_rules(file_contexts.as_deref(), FileContexts::parse)?,
        fs_config: read_rules(fs_config.as_deref(), FsConfig::parse)?,
    };
    let format = OutputFormat::parse(output_format).map_err(PyValueError::new_err)?;
    let choice = ImageChoice {
        image: oci_image,
        platform,
    };
    // The sources are opened and the build made on the detached thread:
    // a source is not `Send`, and the build is long I/O.
    let report = py.detach(move || {
        let mut b = ImageBuilder::new(o).size(size).rules(rules).format(format);
        for s in &sources {
            b = b.source(source::open(s, &choice)?);
        }
        if let Some(cb) = progress {
            b = b.on_progress(move |p: Progress| {
                // A failing callback cannot stop the build; it is told
                // again at the next step.
                Python::try_attach(|py| {
                    if let Err(e) = cb.call1(py, (p.entries, p.bytes)) {
                        e.write_unraisable(py, None);
                    }
                });
            });
        }
        b.build(&output)
    });
    let r = report.map_err(|e| build_error(py, &e))?;
    let d = PyDict::new(py);
    d.set_item("size", r.size)?;
    d.set_item("block_size", r.mkfs.block_size)?;
    d.set_item("blocks", r.mkfs.blocks_count)?;
    d.set_item("inodes", r.mkfs.inodes_count)?;
    d.set_item("free_blocks", r.mkfs.free_blocks)?;
    d.set_item("journal_blocks", r.mkfs.journal_blocks)?;
    d.set_item("features", &r.mkfs.features)?;
    d.set_item("uuid", uuid_text(&r.mkfs.uuid))?;
    d.set_item("notes", &r.mkfs.notes)?;
    d.set_item("entries", r.copied.entries)?;
    d.set_item("bytes", r.copied.bytes)?;
    match r.needs {
        Some(n) => {
            let needs = PyDict::new(py);
            needs.set_item("inodes", n.inodes)?;
            needs.set_item("blocks", n.blocks)?;
            needs.set_item("data_bytes", n.data_bytes)?;
            d.set_item("needs", needs)?;
        }
        None => d.set_item("needs", py.None())?,
    }
    Ok(d)
}

/// Why a `put` failed: the image said no, or the source did.
pub(crate) enum PutError {
    Engine(ext4kit::Error),
    Build(ext4kit_populate::Error),
}

/// `Filesystem.put`: `src` into the directory `dest` under its own name,
/// or as `dest` when that is not an existing directory (`cp -a`).
pub(crate) fn put(fs: &Fs, src: &Path, dest: &[u8], all_root: bool) -> Result<Progress, PutError> {
    let owners = if all_root {
        Owners::all_root()
    } else {
        Owners::as_source()
    };
    let mut p = Populator::new(
        fs,
        Rules {
            owners,
            ..Default::default()
        },
    );
    let mut s = DirSource::entry(src, false);
    let dest = dest.strip_suffix(b"/").filter(|d| !d.is_empty()).unwrap_or(dest);
    let into = fs.stat(dest).ok().filter(|st| st.ftype == FileType::Directory);
    let (parent, name): (Vec<u8>, Vec<u8>) = match into {
        Some(_) => {
            let name = src.file_name().map(|n| n.as_encoded_bytes().to_vec()).ok_or_else(|| {
                PutError::Build(ext4kit_populate::Error::source(src, "has no file name to copy under"))
            })?;
            (dest.to_vec(), name)
        }
        None => {
            let cut = dest.iter().rposition(|&c| c == b'/').unwrap_or(0);
            let parent = if cut == 0 { b"/".to_vec() } else { dest[..cut].to_vec() };
            (parent, dest[cut + 1..].to_vec())
        }
    };
    let pst = fs.stat(&parent).map_err(PutError::Engine)?;
    p.add(
        &mut s,
        Placement::Named {
            parent: pst.ino,
            parent_path: &parent,
            name: &name,
        },
    )
    .map_err(PutError::Build)?;
    let done = p.finish().map_err(PutError::Build)?;
    Ok(done)
}

/// A UUID in its usual spelling (8-4-4-4-12 hex digits).
fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
