//! `ext4kit mkfs -d SOURCE IMAGE` without SIZE: the smallest image that
//! holds the tree, no larger than what `resize2fs -M` makes of mke2fs -d's
//! image of the same tree; the kernel mounts it as the tree, e2fsck finds
//! it clean; `--free 10%` leaves at least a tenth of it free. And what
//! fits is written whatever the SIZE: a file of 10,000 extents (a deep
//! extent tree), an image filled to its last blocks.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, CompareOpts, LoopMount};

mod building;
use building::{need_kernel, run, s};

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildsize", tag)
}

/// A tree with what costs blocks: files of many sizes, a directory of
/// 3,000 names (indexed), long symlinks, xattrs, a sparse file.
fn make_tree(src: &Path) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for d in 0..20 {
        let dir = src.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..30 {
            let len = (next() % 200_000) as usize;
            let byte = (next() % 251) as u8;
            std::fs::write(dir.join(format!("f{f:03}")), vec![byte; len]).unwrap();
        }
    }
    let big = src.join("many");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..3000 {
        std::fs::write(big.join(format!("name-{i:05}-{}", "x".repeat(i % 40))), b"").unwrap();
    }
    for i in 0..50 {
        std::os::unix::fs::symlink("t".repeat(100 + i), src.join(format!("link{i}"))).unwrap();
    }
    std::fs::write(src.join("attrs"), b"a").unwrap();
    rustix::fs::setxattr(
        src.join("attrs"),
        "user.big",
        &[7u8; 600],
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"end", 1 << 30).unwrap();
}

fn block_count(img: &Path) -> u64 {
    let out = run(Command::new("dumpe2fs").args(["-h", s(img)]));
    out.lines()
        .find_map(|l| l.strip_prefix("Block count:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("dumpe2fs prints the block count")
}

#[test]
fn without_size_the_image_is_as_small_as_resize2fs_would_make_it() {
    need_kernel();
    let work = workdir("min");
    let src = work.join("src");
    make_tree(&src);

    let ours = work.join("ours.img");
    let said = run(Command::new(env!("CARGO_BIN_EXE_ext4kit")).args(["mkfs", "-d", s(&src), s(&ours)]));
    assert!(said.contains("the sources need"), "the size is printed:\n{said}");
    ext4kit_testkit::e2fsck_clean(&ours).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&ours, &mnt, "ext4", true).unwrap();
    let opts = CompareOpts {
        ignore_lost_found: true,
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    let diffs = compare_trees(&src, m.path(), &opts).unwrap();
    assert!(diffs.is_empty(), "{diffs:#?}");
    m.unmount().unwrap();

    // mke2fs -d, then resize2fs -M.
    let theirs = work.join("theirs.img");
    run(Command::new("mke2fs").args(["-q", "-F", "-t", "ext4", "-b", "4096", "-d", s(&src), s(&theirs), "1G"]));
    run(Command::new("resize2fs").args(["-M", s(&theirs)]));
    let (a, b) = (block_count(&ours), block_count(&theirs));
    assert_eq!(std::fs::metadata(&ours).unwrap().len(), a * 4096);
    assert!(a <= b, "ours {a} blocks, resize2fs -M {b}");
    eprintln!("smallest image: ours {a} blocks, mke2fs -d + resize2fs -M {b}");

    // --free 10%: a tenth of the image stays free.
    let roomy = work.join("roomy.img");
    run(Command::new(env!("CARGO_BIN_EXE_ext4kit")).args(["mkfs", "-q", "-d", s(&src), "--free", "10%", s(&roomy)]));
    let m = LoopMount::mount(&roomy, &mnt, "ext4", true).unwrap();
    let st = rustix::fs::statvfs(m.path()).unwrap();
    let total = std::fs::metadata(&roomy).unwrap().len() / 4096;
    assert!(st.f_bfree * 10 >= total, "{} free of {total} blocks", st.f_bfree);
    m.unmount().unwrap();
    assert!(std::fs::metadata(&roomy).unwrap().size() > std::fs::metadata(&ours).unwrap().size());
    std::fs::remove_dir_all(&work).unwrap();
}

/// Free blocks of an image, as dumpe2fs reads its superblock.
fn free_blocks(img: &Path) -> u64 {
    let out = run(Command::new("dumpe2fs").args(["-h", s(img)]));
    out.lines()
        .find_map(|l| l.strip_prefix("Free blocks:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("dumpe2fs prints the free blocks")
}

#[test]
fn a_file_of_10000_extents_and_an_image_filled_to_its_last_block() {
    need_kernel();
    let work = workdir("extents");
    let src = work.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 10,000 data blocks, each between two holes: 10,000 extents.
    let f = std::fs::File::create(src.join("frag")).unwrap();
    use std::os::unix::fs::FileExt;
    for i in 0..10_000u64 {
        f.write_all_at(&[(i % 251) as u8 + 1; 4096], i * 8192).unwrap();
    }
    drop(f);
    let tar = work.join("frag.tar");
    run(Command::new("tar").args(["--format=posix", "--sparse", "-cf", s(&tar), "-C", s(&src), "."]));
    let img = work.join("frag.img");
    run(Command::new(env!("CARGO_BIN_EXE_ext4kit")).args(["mkfs", "-q", "-b", "4096", "-d", s(&tar), s(&img), "256M"]));
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let frag = m.path().join("frag");
    run(Command::new("cmp").args([s(&src.join("frag")), s(&frag)]));
    // filefrag without -v merges physically adjacent extents; its -v
    // table lists the mapping's extents (FIEMAP) one a line.
    let table = run(Command::new("filefrag").args(["-v", s(&frag)]));
    let n = table
        .lines()
        .filter(|l| {
            l.trim_start()
                .split(':')
                .next()
                .is_some_and(|k| k.trim().parse::<u64>().is_ok())
        })
        .count();
    assert_eq!(
        n,
        10_000,
        "{}…{}",
        &table[..table.len().min(600)],
        &table[table.len().saturating_sub(600)..]
    );
    // The holes stayed holes: 10,000 data blocks and the extent tree's.
    let blocks = std::fs::metadata(&frag).unwrap().blocks() / 8;
    assert!((10_000..10_100).contains(&blocks), "{blocks} blocks");
    m.unmount().unwrap();

    // Filled to the last block: the largest file that still builds into
    // a 16 MiB image leaves (almost) nothing free, and the image is clean.
    let fill = work.join("fill");
    std::fs::create_dir_all(&fill).unwrap();
    let full = work.join("full.img");
    let build = |blocks: u64| {
        std::fs::write(fill.join("data"), vec![0x5au8; (blocks * 4096) as usize]).unwrap();
        let _ = std::fs::remove_file(&full);
        Command::new(env!("CARGO_BIN_EXE_ext4kit"))
            .args(["mkfs", "-q", "-b", "4096", "-m", "0", "-d", s(&fill), s(&full), "16M"])
            .output()
            .unwrap()
            .status
            .success()
    };
    let (mut lo, mut hi) = (0u64, 4096u64);
    assert!(build(lo) && !build(hi));
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if build(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert!(build(lo));
    ext4kit_testkit::e2fsck_clean(&full).unwrap_or_else(|e| panic!("{e}"));
    // What may stay free: the worst case of extent-tree growth a write
    // reserves beside its data block (the tree's depth plus one), which
    // one more data block could not do without.
    let left = free_blocks(&full);
    assert!(left <= 4, "the fullest build left {left} blocks free");
    let m = LoopMount::mount(&full, &mnt, "ext4", true).unwrap();
    run(Command::new("cmp").args([s(&fill.join("data")), s(&m.path().join("data"))]));
    m.unmount().unwrap();
    std::fs::remove_dir_all(&work).unwrap();
}
