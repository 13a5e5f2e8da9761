//! A deterministic "source tree" and its tarball, for the untar / find /
//! rm -rf workload of the mount benchmark.
//!
//! A Linux source tarball would be the classic input, but these machines
//! are offline; what matters for a filesystem is the shape, which this
//! generator imitates: a few thousand directories of varied depth and
//! fan-out, tens of thousands of small files (64 B..32 KiB, log-uniform,
//! so most are a few KiB like source files) and a sprinkling of symlinks.
//! The same [`TreeShape`] always gives the same names, sizes and bytes, and
//! the tarball is made with fixed owners, times and order, so two machines
//! untar byte-identical input.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::TestRng;

/// How big a tree to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    /// Directories below the root.
    pub dirs: usize,
    /// Regular files.
    pub files: usize,
    /// Seed of every name, size and byte.
    pub seed: u64,
}

/// What a generated tree holds (for checking what `find` lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeCounts {
    /// Directories below the root.
    pub dirs: u64,
    /// Regular files.
    pub files: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Bytes of file data.
    pub bytes: u64,
}

impl TreeCounts {
    /// Lines `find ROOT` prints: every entry plus the root itself.
    pub fn find_lines(&self) -> u64 {
        1 + self.dirs + self.files + self.symlinks
    }
}

const EXTS: [&str; 6] = ["c", "h", "rs", "S", "txt", "mk"];

/// Where [`build_tree_into`] puts the tree: the host's filesystem
/// ([`build_tree`]), or anything else that makes directories, files and
/// symlinks (the library, for the in-process untar of `ext4kit bench`).
pub trait TreeSink {
    /// Make the directory `p` (its parent exists).
    fn mkdir(&mut self, p: &Path) -> std::io::Result<()>;
    /// Make the regular file `p` holding `data`.
    fn write(&mut self, p: &Path, data: &[u8]) -> std::io::Result<()>;
    /// Make the symlink `p` pointing at `target`.
    fn symlink(&mut self, target: &str, p: &Path) -> std::io::Result<()>;
}

/// The host's filesystem.
struct HostSink;

impl TreeSink for HostSink {
    fn mkdir(&mut self, p: &Path) -> std::io::Result<()> {
        std::fs::create_dir(p)
    }
    fn write(&mut self, p: &Path, data: &[u8]) -> std::io::Result<()> {
        std::fs::write(p, data)
    }
    fn symlink(&mut self, target: &str, p: &Path) -> std::io::Result<()> {
        std::os::unix::fs::symlink(target, p)
    }
}

/// Makes nothing: what a tree of a shape holds, without writing it.
struct CountSink;

impl TreeSink for CountSink {
    fn mkdir(&mut self, _: &Path) -> std::io::Result<()> {
        Ok(())
    }
    fn write(&mut self, _: &Path, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn symlink(&mut self, _: &str, _: &Path) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a tree of `shape` holds (the same numbers [`build_tree`] returns).
pub fn counts(shape: &TreeShape) -> TreeCounts {
    match build_tree_into(&mut CountSink, Path::new("/"), shape) {
        Ok(c) => c,
        // CountSink never fails.
        Err(_) => TreeCounts {
            dirs: 0,
            files: 0,
            symlinks: 0,
            bytes: 0,
        },
    }
}

/// Build the tree under `root` (created; must not exist).
///
/// Directories: each new one goes under a random earlier one, biased to
/// recent ones, which gives a depth of a handful of levels like a source
/// tree. Files go into random directories; one in a hundred entries is a
/// symlink to a sibling-ish relative path (dangling is fine for `find`).
pub fn build_tree(root: &Path, shape: &TreeShape) -> std::io::Result<TreeCounts> {
    build_tree_into(&mut HostSink, root, shape)
}

/// [`build_tree`] into any [`TreeSink`]: the same names, sizes and bytes.
pub fn build_tree_into(sink: &mut dyn TreeSink, root: &Path, shape: &TreeShape) -> std::io::Result<TreeCounts> {
    let mut rng = TestRng::new(shape.seed);
    sink.mkdir(root)?;
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    for i in 0..shape.dirs {
        // Half of the time a parent from the newest 64 (depth), else any.
        let n = dirs.len() as u64;
        let parent = if rng.below(2) == 0 {
            n - 1 - rng.below(n.min(64))
        } else {
            rng.below(n)
        };
        let d = dirs[parent as usize].join(format!("dir{i:05}"));
        sink.mkdir(&d)?;
        dirs.push(d);
    }
    let mut counts = TreeCounts {
        dirs: shape.dirs as u64,
        files: 0,
        symlinks: 0,
        bytes: 0,
    };
    let mut buf = vec![0u8; 32 * 1024];
    for i in 0..shape.files {
        let d = &dirs[rng.below(dirs.len() as u64) as usize];
        let ext = EXTS[rng.below(EXTS.len() as u64) as usize];
        if rng.below(100) == 0 {
            let target = format!("../file{:06}.{ext}", rng.below(shape.files as u64));
            sink.symlink(&target, &d.join(format!("link{i:06}")))?;
            counts.symlinks += 1;
            continue;
        }
        // log-uniform 64 B .. 32 KiB: 2^(6 + 9u).
        let exp = 6.0 + 9.0 * (rng.below(1 << 20) as f64 / (1u64 << 20) as f64);
        let len = (2f64.powf(exp) as usize).min(buf.len());
        rng.fill(&mut buf[..len]);
        sink.write(&d.join(format!("file{i:06}.{ext}")), &buf[..len])?;
        counts.files += 1;
        counts.bytes += len as u64;
    }
    Ok(counts)
}

/// The tarball of a tree of `shape`, built once into `work` and reused:
/// returns its path and what it holds. Owners root, one mtime, names
/// sorted, so the archive is byte-identical from run to run.
pub fn tarball(work: &Path, shape: &TreeShape) -> Result<(PathBuf, TreeCounts), String> {
    let stem = format!("tree-{}d-{}f-{:x}", shape.dirs, shape.files, shape.seed);
    let tar = work.join(format!("{stem}.tar"));
    let counts_file = work.join(format!("{stem}.counts"));
    if let (true, Ok(s)) = (tar.exists(), std::fs::read_to_string(&counts_file)) {
        let v: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if let [dirs, files, symlinks, bytes] = v[..] {
            return Ok((
                tar,
                TreeCounts {
                    dirs,
                    files,
                    symlinks,
                    bytes,
                },
            ));
        }
    }
    let src = work.join(format!("{stem}.src"));
    let _ = std::fs::remove_dir_all(&src);
    let root = src.join("tree");
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let counts = build_tree(&root, shape).map_err(|e| format!("building {}: {e}", root.display()))?;
    let tmp = tar.with_extension("tmp");
    crate::run(
        Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@1700000000",
                "--format=gnu",
                "-cf",
            ])
            .arg(&tmp)
            .arg("-C")
            .arg(&src)
            .arg("tree"),
    )?;
    std::fs::rename(&tmp, &tar).map_err(|e| e.to_string())?;
    std::fs::write(
        &counts_file,
        format!(
            "{} {} {} {}\n",
            counts.dirs, counts.files, counts.symlinks, counts.bytes
        ),
    )
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&src);
    Ok((tar, counts))
}
