//! htree: no linear scan. A lookup in an indexed directory reads a constant
//! number of directory blocks, whatever the directory size; the same names
//! in a linear (`^dir_index`) directory cost blocks in proportion to size.
//!
//! Images are made by mke2fs -d and re-indexed by `e2fsck -fyD` (which
//! builds real htrees); the counts come from the engine's own counter of
//! directory block accesses.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::{Fs, OpenOptions};

fn tool_or_fail(name: &str) {
    let ok = Command::new(name).arg("-V").output().is_ok();
    assert!(ok, "{name} is required for this test (apt-get install e2fsprogs)");
}

fn run(cmd: &mut Command) {
    ext4kit_testkit::run_ok(cmd, &[0]).unwrap();
}

/// An ext4 image whose /big holds `entries` empty files, created by the
/// kernel through a loop mount. (`mke2fs -d` inserts into a linear
/// directory and is quadratic: 50,000 names take it over five minutes.)
/// The kernel indexes the directory itself when dir_index is on.
fn make_dir_image(dir: &Path, entries: usize, dir_index: bool) -> PathBuf {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test loop-mounts an image so the kernel builds the directory ({e}); CI runs as root");
    }
    let img = dir.join(format!("d{entries}-{dir_index}.img"));
    let feat = if dir_index { "dir_index" } else { "^dir_index" };
    let size = format!("{}M", 16 + entries / 1500);
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", feat, "-N", &(entries + 100).to_string()])
        .arg(&img)
        .arg(&size));
    let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join(format!("mnt-{entries}-{dir_index}")), "ext4", false)
        .unwrap();
    let mnt = m.path().to_path_buf();
    let made = (|| -> std::io::Result<()> {
        std::fs::create_dir(mnt.join("big"))?;
        for i in 0..entries {
            std::fs::File::create(mnt.join("big").join(name(i)))?;
        }
        Ok(())
    })();
    m.unmount().unwrap();
    made.unwrap();
    let fsck = Command::new("e2fsck").arg("-fn").arg(&img).output().unwrap();
    assert!(
        fsck.status.success(),
        "kernel-made image not clean: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    img
}

fn name(i: usize) -> String {
    format!("file-{i:07}-{}", i.wrapping_mul(2654435761) % 100_000)
}

/// Average directory blocks touched per lookup of `probes` distinct names.
fn blocks_per_lookup(img: &Path, entries: usize, probes: usize) -> (f64, u64) {
    let fs = Fs::open_image(img, &OpenOptions::default()).unwrap();
    fs.resolve(b"/big", true).unwrap();
    let mut max = 0;
    let mut total = 0;
    for k in 0..probes {
        let i = (k * 7919) % entries;
        let before = fs.stats().dir_block_reads;
        let d = fs.resolve(format!("/big/{}", name(i)).as_bytes(), false).unwrap();
        assert!(d.ino > 0);
        let n = fs.stats().dir_block_reads - before;
        total += n;
        max = max.max(n);
    }
    // A miss must be as cheap as a hit.
    let before = fs.stats().dir_block_reads;
    assert!(fs.resolve(b"/big/no-such-name", false).is_err());
    max = max.max(fs.stats().dir_block_reads - before);
    (total as f64 / probes as f64, max)
}

#[test]
fn htree_lookup_reads_constant_blocks() {
    tool_or_fail("mke2fs");
    let dir = std::env::temp_dir().join(format!("ext4kit-htree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut maxes = Vec::new();
    for entries in [1_000, 10_000, 50_000] {
        let img = make_dir_image(&dir, entries, true);
        let (avg, max) = blocks_per_lookup(&img, entries, 200);
        eprintln!("htree {entries:>6} entries: {avg:.2} blocks/lookup (max {max})");
        // Root + (past ~500 leaf blocks) one index node + one leaf;
        // a hash collision spanning two leaves adds one.
        assert!(max <= 4, "{entries} entries: a lookup read {max} directory blocks");
        maxes.push(max);
    }
    // Constant: the 50k directory costs no more than one extra level over 1k.
    assert!(maxes[2] <= maxes[0] + 1, "block reads grew with size: {maxes:?}");

    // The same names without an index: cost grows with the directory.
    let lin_small = blocks_per_lookup(&make_dir_image(&dir, 1_000, false), 1_000, 50).0;
    let lin_big = blocks_per_lookup(&make_dir_image(&dir, 10_000, false), 10_000, 50).0;
    eprintln!("linear: 1k {lin_small:.1}, 10k {lin_big:.1} blocks/lookup");
    assert!(
        lin_big > 5.0 * lin_small,
        "linear scans should grow with size ({lin_small} vs {lin_big})"
    );
    std::fs::remove_dir_all(&dir).ok();
}
