//! The disk-formats workload: what reading through a container and
//! through a remote store costs.
//!
//! - The tree workload's image, built by `ext4kit mkfs -d` and converted to
//!   an uncompressed qcow2 by `qemu-img convert`, copied out whole by
//!   `ext4kit get` from the raw file (peer lib) and from the qcow2
//!   (variant qcow2), the kernel's page cache dropped before each: the
//!   cost of the qcow2 layer on a cold copy.
//! - The same qcow2 served by nginx on 127.0.0.1 and opened by URL through
//!   the library: for a walk of every name (`ls -lR`: readdir and an lstat
//!   of every entry) and for the largest file read whole, the
//!   bytes fetched from the server against the bytes the filesystem read
//!   from the device, and the requests made.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ext4kit::device::vdisk::{open_device, DiskRequest};
use ext4kit::device::BlockDevice;
use ext4kit::{FileType, Fs, OpenFlags, OpenOptions};
use ext4kit_remote::{open_url, RemoteDevice, RemoteOptions, RemoteStats};
use ext4kit_testkit::servers::Nginx;

use super::figure::Figure;
use super::live::Live;
use super::tree_image::build_tree_image;
use super::Sizes;

/// Seconds to copy the whole tree out (`ext4kit get`), cold.
pub const FORMATS_GET_METRIC: &str = "tree copied out (get), cold";
/// Bytes fetched from the server ÷ bytes the filesystem read.
pub const REMOTE_FETCHED_METRIC: &str = "remote: bytes fetched ÷ bytes the filesystem read";
/// Requests made to the server.
pub const REMOTE_REQUESTS_METRIC: &str = "remote: requests";

fn io(what: &'static str) -> impl Fn(ext4kit::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// See the module doc.
pub(super) fn w_formats(l: &mut Live, s: &Sizes) -> Result<Vec<Figure>, String> {
    let work = l.work_dir();
    let bin = l.ext4kit_bin().to_path_buf();
    let raw = build_tree_image(&bin, &work, s)?;
    let qcow2 = raw.with_extension("qcow2");
    let _ = std::fs::remove_file(&qcow2);
    crate::run(
        Command::new("qemu-img")
            .args(["convert", "-O", "qcow2"])
            .arg(&raw)
            .arg(&qcow2),
    )
    .map_err(|e| format!("qemu-img convert (apt-get install qemu-utils): {e}"))?;
    let mut out = Vec::new();
    for (variant, image) in [(None, &raw), (Some("qcow2"), &qcow2)] {
        let dest = work.join("formats-out");
        let _ = std::fs::remove_dir_all(&dest);
        drop_caches()?;
        let t = Instant::now();
        crate::run(Command::new(&bin).arg("get").arg(image).arg("/").arg(&dest))?;
        out.push(Figure {
            metric: FORMATS_GET_METRIC.into(),
            unit: "s",
            higher_better: false,
            x: None,
            variant,
            value: t.elapsed().as_secs_f64(),
        });
        let _ = std::fs::remove_dir_all(&dest);
    }
    out.extend(remote(&qcow2)?);
    let _ = std::fs::remove_file(&qcow2);
    Ok(out)
}

/// Write back and drop the kernel's page cache (needs root).
fn drop_caches() -> Result<(), String> {
    crate::run(&mut Command::new("sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| format!("dropping the page cache (root): {e}"))
}

/// The remote figures for `qcow2` served by nginx.
fn remote(qcow2: &Path) -> Result<Vec<Figure>, String> {
    let nginx = Nginx::start();
    nginx.put_file("tree.qcow2", qcow2);
    let url = nginx.url("/tree.qcow2");
    let mut out = Vec::new();
    // A fresh device (empty cache) for each measurement.
    let open = || -> Result<(Arc<RemoteDevice>, Arc<Fs>), String> {
        let dev = Arc::new(open_url(&url, &RemoteOptions::default()).map_err(|e| format!("{url}: {e}"))?);
        let disk = open_device(dev.clone() as Arc<dyn BlockDevice>, None, &DiskRequest::default())
            .map_err(|e| format!("{url}: {e}"))?;
        let fs = Fs::open_device(disk.into_device(), &OpenOptions::default()).map_err(io("open"))?;
        Ok((dev, fs))
    };
    let mut figures = |what: &'static str, s: RemoteStats| {
        out.push(Figure {
            metric: REMOTE_FETCHED_METRIC.into(),
            unit: "×",
            higher_better: false,
            x: None,
            variant: Some(what),
            value: s.bytes_fetched as f64 / s.bytes_read.max(1) as f64,
        });
        out.push(Figure {
            metric: REMOTE_REQUESTS_METRIC.into(),
            unit: "requests",
            higher_better: false,
            x: None,
            variant: Some(what),
            value: s.requests as f64,
        });
    };
    let (dev, fs) = open()?;
    let mut largest = (0u64, Vec::new());
    walk(&fs, b"/", &mut largest)?;
    figures("ls -lR", dev.stats());
    drop(fs);
    let (dev, fs) = open()?;
    let f = fs.open(&largest.1, OpenFlags::default()).map_err(io("open"))?;
    let mut buf = vec![0u8; 1 << 20];
    while fs.read(&f, &mut buf).map_err(io("read"))? != 0 {}
    drop(f);
    figures("get of the largest file", dev.stats());
    Ok(out)
}

/// Every name below `dir` (readdir; lstat where the entry has no type),
/// noting the largest regular file.
fn walk(fs: &Fs, dir: &[u8], largest: &mut (u64, Vec<u8>)) -> Result<(), String> {
    for e in fs.read_dir(dir).map_err(io("readdir"))? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let mut path = dir.to_vec();
        if path != b"/" {
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        let st = fs.lstat(&path).map_err(io("lstat"))?;
        match st.ftype {
            FileType::Directory => walk(fs, &path, largest)?,
            FileType::Regular if st.size > largest.0 => *largest = (st.size, path),
            _ => {}
        }
    }
    Ok(())
}
