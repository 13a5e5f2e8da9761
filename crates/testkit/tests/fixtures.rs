//! End-to-end checks of the test kit itself: the tree is deterministic, the
//! images are what the tree says, and the independent readers agree.
//!
//! Tests that need root or loop devices print SKIP and why, loudly.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ext4kit_testkit::{
    build_source_tree, compare_rdump, compare_trees, debugfs_rdump, image_matrix, is_kernel_unavailable, make_image,
    make_kernel_image, CompareOpts, ImageSpec, LoopMount, TreeOpts,
};

fn spec(name: &str) -> ImageSpec {
    image_matrix()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no spec {name}"))
}

fn tiny() -> TreeOpts {
    TreeOpts {
        big_dir_entries: 600,
        ..TreeOpts::small()
    }
}

#[test]
fn tree_is_deterministic_and_complete() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let ma = build_source_tree(&a, &tiny()).expect("build a");
    let mb = build_source_tree(&b, &tiny()).expect("build b");
    assert_eq!(ma.entries, mb.entries);
    assert_eq!(ma.data_bytes, mb.data_bytes);
    let d = compare_trees(&a, &b, &CompareOpts::default()).expect("compare");
    assert!(d.is_empty(), "two builds differ: {d:#?}");

    // The hard-linked file has three names.
    for p in &ma.hard_link_group {
        assert_eq!(a.join(p).symlink_metadata().expect("stat").nlink(), 3);
    }
    // Boundary sizes and the big directory exist.
    assert_eq!(a.join("sizes/4097").metadata().expect("stat").len(), 4097);
    let n = std::fs::read_dir(a.join("bigdir")).expect("readdir").count();
    assert_eq!(n, 600);
    // 255-byte names.
    let longest = std::fs::read_dir(a.join("names"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().len())
        .max();
    assert_eq!(longest, Some(255));
    // A non-empty root must be refused (determinism).
    assert!(build_source_tree(&a, &tiny()).is_err());
}

/// Mounts read-only and compares, or says loudly why it cannot.
fn kernel_check(spec: &ImageSpec, src: &Path, img: &Path, mnt: &Path) {
    match LoopMount::mount(img, mnt, "ext4", true) {
        Ok(m) => {
            let d = compare_trees(src, m.path(), &spec.compare_opts()).expect("compare");
            m.unmount().expect("umount");
            assert!(d.is_empty(), "{}: kernel reads a different tree: {d:#?}", spec.name);
        }
        Err(e) => match is_kernel_unavailable(&e) {
            Some(why) => eprintln!("SKIP kernel check of {}: {why}", spec.name),
            None => panic!("mount {}: {e}", spec.name),
        },
    }
}

#[test]
fn images_match_the_tree() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    build_source_tree(&src, &tiny()).expect("build");
    for name in ["ext4-default", "ext4-inode128", "ext4-legacy-unsigned"] {
        let s = spec(name);
        let img = tmp.path().join(format!("{name}.img"));
        make_image(&s, &src, &img).expect("make_image");
        kernel_check(&s, &src, &img, &tmp.path().join(format!("mnt-{name}")));
    }
}

#[test]
fn unmountable_image_reads_back_with_debugfs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    build_source_tree(&src, &tiny()).expect("build");
    let s = spec("ext4-64k");
    assert!(!s.kernel_mountable);
    let img = tmp.path().join("64k.img");
    make_image(&s, &src, &img).expect("make_image");
    let dest = tmp.path().join("rdump");
    debugfs_rdump(&img, &dest).expect("rdump");
    let d = compare_rdump(&src, &dest).expect("compare");
    assert!(d.is_empty(), "rdump differs: {d:#?}");
    // The comparison is not vacuous: break one file and it must notice.
    std::fs::write(dest.join("sizes/1025"), b"changed").expect("write");
    assert!(!compare_rdump(&src, &dest).expect("compare").is_empty());
}

#[test]
fn kernel_written_image_matches_the_tree() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    build_source_tree(&src, &tiny()).expect("build");
    let img = tmp.path().join("kernel.img");
    match make_kernel_image(&src, &img, &["-t", "ext4", "-O", "metadata_csum_seed"]) {
        Ok(()) => {
            let s = spec("ext4-default");
            kernel_check(&s, &src, &img, &tmp.path().join("mnt"));
        }
        Err(e) => match is_kernel_unavailable(&e) {
            Some(why) => eprintln!("SKIP kernel-written image: {why}"),
            None => panic!("make_kernel_image: {e}"),
        },
    }
}
