//! `ext4kit mkfs -d SOURCE IMAGE` without SIZE: the smallest image that
//! holds the tree, no larger than what `resize2fs -M` makes of mke2fs -d's
//! image of the same tree; the kernel mounts it as the tree, e2fsck finds
//! it clean; `--free 10%` leaves at least a tenth of it free.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, CompareOpts, LoopMount};

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-buildsize-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test reads images back with the kernel (loop mount): {e}; CI runs as root");
    }
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
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
