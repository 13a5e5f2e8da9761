//! The tree workload's source tree as the image workloads read: its
//! shape at a size, its tar unpacked once, and an image of it built by
//! `ext4kit mkfs -d`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Sizes;
use crate::srctree::{tarball, TreeCounts, TreeShape};

/// The tree's shape at the sizes of this run.
pub(super) fn tree_shape(s: &Sizes) -> TreeShape {
    TreeShape {
        dirs: s.tree_dirs,
        files: s.tree_files,
        seed: 0x7472_6565,
    }
}

/// The tree workload's source tree as a tar, and unpacked beside it once
/// (the tree the builders read), with its counts.
pub(super) fn unpacked_tree(work: &Path, s: &Sizes) -> Result<(PathBuf, PathBuf, TreeCounts), String> {
    let (tar, counts) = tarball(work, &tree_shape(s))?;
    let unpacked = tar.with_extension("unpacked");
    if !unpacked.join("tree").is_dir() {
        let _ = std::fs::remove_dir_all(&unpacked);
        std::fs::create_dir_all(&unpacked).map_err(|e| format!("{}: {e}", unpacked.display()))?;
        crate::run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&unpacked))?;
    }
    Ok((tar, unpacked.join("tree"), counts))
}

/// An image of the tree workload's source tree made by `ext4kit mkfs -d`
/// (4 KiB blocks, sized as the build workload sizes it), for workloads
/// that read a realistic filesystem.
pub(super) fn build_tree_image(bin: &Path, work: &Path, s: &Sizes) -> Result<PathBuf, String> {
    let (_, tree, counts) = unpacked_tree(work, s)?;
    let img = work.join("tree.img");
    let _ = std::fs::remove_file(&img);
    let size = format!("{}M", counts.bytes * 3 / (1 << 20) + 256);
    crate::run(
        Command::new(bin)
            .args(["mkfs", "-q", "-b", "4096", "-d"])
            .arg(&tree)
            .arg(&img)
            .arg(&size),
    )?;
    Ok(img)
}
