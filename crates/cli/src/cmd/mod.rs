//! One module per subcommand. Each returns `Err(message)` with a one-line
//! message naming the image, the path and the cause (the read commands
//! with `--json` a [`Failure`], which also knows the path and the errno).

pub mod bench;
pub mod cat;
pub mod completions;
pub mod demo;
pub mod df;
pub mod edit;
pub mod get;
pub mod getfattr;
pub mod info;
pub mod info_json;
pub mod journal;
pub mod ls;
pub mod manpages;
pub mod mkfs;
pub mod mount;
pub mod put;
pub mod stat;
pub mod timeline;

use std::sync::Arc;

use ext4kit::{Fs, OpenOptions};

pub use crate::failure::{err, Failure};
pub use crate::image::Image;

/// Open an image read-only (at the location the user chose, or a
/// partitioned disk's one ext partition), printing the engine's warnings.
pub fn open(image: &Image, budget: usize) -> Result<Arc<Fs>, String> {
    open_fs(image, budget, false).map_err(String::from)
}

/// [`open`], failing with the cause's errno where it is known (for the
/// commands whose `--json` errors carry it); with `json`, each warning is
/// a line `{"warning": {"message": ..}}` on stderr.
pub fn open_fs(image: &Image, budget: usize, json: bool) -> Result<Arc<Fs>, Failure> {
    let location = image.resolve()?;
    // The image's container is already open (its probes used it): the
    // engine reads the filesystem through that open instead of a second.
    let disk = image.disk().map_err(|e| format!("{}: {e}", image.display()))?;
    let fs = Fs::open_on_disk(
        disk.device().clone(),
        &image.path,
        &OpenOptions {
            read_only: true,
            cache_budget: budget,
            no_replay: image.no_replay,
            location,
            disk_format: image.format(),
            any_backing_path: image.any_backing_path(),
            volume: image.volume().map(str::to_string),
            ..Default::default()
        },
    )
    .map_err(|e| Failure::image(image, e))?;
    for w in fs.warnings() {
        let message = format!("{}: {w}", image.display());
        if json {
            eprintln!("{}", serde_json::json!({"warning": {"message": message}}));
        } else {
            eprintln!("ext4kit: warning: {message}");
        }
    }
    Ok(fs)
}

/// The path of `name` in directory `dir` (`dir/name`, without doubling a
/// trailing '/'), as bytes: names in an image need not be UTF-8.
pub fn child_path(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}
