//! `ext4kit df [--json] IMAGE`: sizes and free space as statfs(2)
//! reports them, as a df(1)-style table or one JSON document.

use serde_json::json;

use super::{Failure, Image};
use crate::json;

/// Print the image's space and inode counts.
pub fn run(image: &Image, json_out: bool, budget: usize) -> Result<(), Failure> {
    let fs = super::open_fs(image, budget, json_out)?;
    let s = fs.statfs().map_err(|e| Failure::image(image, e))?;
    let k = s.block_size as u64 / 1024;
    let used = s.blocks.saturating_sub(s.blocks_free);
    let pct = if used + s.blocks_avail == 0 {
        0
    } else {
        (used * 100).div_ceil(used + s.blocks_avail)
    };
    let inodes_used = s.files.saturating_sub(s.files_free);
    if json_out {
        json::print_document(&json!({
            "image": image.display(),
            "block_size": s.block_size,
            "blocks": s.blocks,
            "blocks_free": s.blocks_free,
            "blocks_available": s.blocks_avail,
            "kib_total": s.blocks * k,
            "kib_used": used * k,
            "kib_available": s.blocks_avail * k,
            "use_percent": pct,
            "inodes": s.files,
            "inodes_used": inodes_used,
            "inodes_free": s.files_free,
            "name_max": s.name_max,
        }))?;
        return Ok(());
    }
    println!(
        "{:<30} {:>12} {:>12} {:>12} {:>5}",
        "Image", "1K-blocks", "Used", "Available", "Use%"
    );
    println!(
        "{:<30} {:>12} {:>12} {:>12} {:>4}%",
        image.display(),
        s.blocks * k,
        used * k,
        s.blocks_avail * k,
        pct
    );
    println!(
        "{:<30} {:>12} {:>12} {:>12}",
        "  inodes", s.files, inodes_used, s.files_free
    );
    Ok(())
}
