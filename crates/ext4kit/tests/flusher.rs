//! The background worker (`ext4kit::cache::flusher`) under a create storm: the
//! caches and the dirty-metadata set stay within their bounds while the
//! worker sweeps and checkpoints beside the creating thread, the worker
//! brings them back under their limits once the storm stops, and dropping
//! the `Fs` leaves an image `e2fsck -fn` passes, holding every name.

use std::process::Command;
use std::time::{Duration, Instant};

use ext4kit::{Fs, OpenOptions};

const FILES: u32 = 20_000;
/// Cache budget: the inode cache holds 1,024 inodes, the dentry cache
/// 4,096 dentries (their floors in `Fs::open_device`), and the dirty
/// metadata limit is a few dozen blocks — a storm of 20,000 creates
/// crosses every threshold many times.
const BUDGET: usize = 1 << 20;
const INODES: usize = 1024;
const DENTRIES: usize = 4096;

fn open(img: &std::path::Path) -> std::sync::Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            cache_budget: BUDGET,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", img.display()))
}

#[test]
fn a_create_storm_stays_bounded_and_the_image_stays_clean() {
    let dir = ext4kit_testkit::Scratch::dir("ext4kit-flusher");
    let img = dir.join("storm.img");
    ext4kit_testkit::run_ok(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-N", "30000"])
            .arg(&img)
            .arg("64M"),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e} (apt-get install e2fsprogs)"));
    let fs = open(&img);
    fs.mkdir(b"/d", 0o755, &ext4kit::Cred::root()).unwrap();
    let dirty_limit = fs.volume().checkpoint_limit();
    let (mut most_inodes, mut most_dentries, mut most_dirty) = (0, 0, 0);
    for i in 0..FILES {
        fs.create(format!("/d/f{i:06}").as_bytes(), 0o644, 0, 0).unwrap();
        let s = fs.stats();
        most_inodes = most_inodes.max(s.cached_inodes);
        most_dentries = most_dentries.max(s.cached_dentries);
        most_dirty = most_dirty.max(fs.volume().jbd().checkpoint_len());
    }
    // Past its threshold a cache kicks the worker; past it by half its
    // limit again, the creating thread sweeps itself. So whatever the
    // worker's pace, the caches stay under 1.5 times their limits (plus
    // what one create adds), and the dirty set under 1.5 times its own.
    assert!(
        most_inodes <= INODES * 3 / 2 + 2,
        "{most_inodes} inodes cached, limit {INODES}"
    );
    assert!(
        most_dentries <= DENTRIES * 3 / 2 + 2,
        "{most_dentries} dentries cached, limit {DENTRIES}"
    );
    assert!(
        most_dirty <= dirty_limit * 3 / 2 + 8,
        "{most_dirty} metadata blocks dirty, limit {dirty_limit}"
    );
    // Left alone, the worker brings the caches back under their limits.
    let t = Instant::now();
    loop {
        let s = fs.stats();
        if s.cached_inodes <= INODES && s.cached_dentries <= DENTRIES {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the worker left {} inodes and {} dentries cached (limits {INODES}, {DENTRIES})",
            s.cached_inodes,
            s.cached_dentries
        );
        // Another create past the threshold kicks it again if its last
        // pass ended before the storm did.
        fs.create(format!("/d/late{}", t.elapsed().as_nanos()).as_bytes(), 0o644, 0, 0)
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let names = fs.read_dir(b"/d").unwrap().len();
    // Dropping the last handle stops the worker, then writes back.
    drop(fs);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let fs = open(&img);
    let listed = fs.read_dir(b"/d").unwrap();
    assert_eq!(listed.len(), names, "names after reopening");
    for i in (0..FILES).step_by(997) {
        fs.stat(format!("/d/f{i:06}").as_bytes()).unwrap();
    }
}
