//! One module per subcommand. Each returns `Err(message)` with a one-line
//! message naming the image, the path and the cause.

pub mod bench;
pub mod cat;
pub mod completions;
pub mod demo;
pub mod edit;
pub mod get;
pub mod info;
pub mod info_json;
pub mod journal;
pub mod ls;
pub mod manpages;
pub mod mkfs;
pub mod mount;
pub mod put;
pub mod stat;

use std::sync::Arc;

use ext4kit::{Fs, OpenOptions};

pub use crate::image::Image;

/// Open an image read-only (at the location the user chose, or a
/// partitioned disk's one ext partition), printing the engine's warnings.
pub fn open(image: &Image, budget: usize) -> Result<Arc<Fs>, String> {
    let location = image.resolve()?;
    let fs = Fs::open_image(
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
    .map_err(|e| format!("{}: {e}", image.display()))?;
    for w in fs.warnings() {
        eprintln!("ext4kit: warning: {}: {w}", image.display());
    }
    Ok(fs)
}

/// Format an engine error for a path in an image.
pub fn err(image: &Image, path: &str, e: ext4kit::Error) -> String {
    // Engine messages for path lookups already name the path.
    let s = e.to_string();
    if s.starts_with(path) || s.starts_with(&format!("/{path}")) {
        format!("{}: {s}", image.display())
    } else {
        format!("{}: {path}: {s}", image.display())
    }
}
