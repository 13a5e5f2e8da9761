//! Running into limits: a full filesystem (blocks, then inodes), names
//! over 255 bytes, symlink loops, over-long symlink targets. Each must
//! fail with the right errno and a message naming what, leave the image
//! `e2fsck`-clean, and leave the filesystem usable (free something, and
//! the next create works).

use ext4kit::NewInode;
use std::path::PathBuf;
use std::process::Command;

use ext4kit::{Cred, Errno, Fs, OpenOptions};

fn image(tag: &str, mkfs: &[&str], size: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("limits");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join(format!("{tag}.img"));
    let _ = std::fs::remove_file(&img);
    ext4kit_testkit::run_ok(
        Command::new("mke2fs").args(["-q", "-F"]).args(mkfs).arg(&img).arg(size),
        &[0],
    )
    .unwrap();
    img
}

fn fsck_clean(img: &std::path::Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

fn rw(img: &std::path::Path) -> std::sync::Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn a_full_filesystem_says_enospc_and_stays_clean() {
    for (tag, args) in [
        ("full-ext4", &["-t", "ext4", "-b", "1024", "-m", "0"][..]),
        ("full-ext2", &["-t", "ext2", "-b", "1024", "-m", "0"][..]),
    ] {
        let img = image(tag, args, "4M");
        let fs = rw(&img);
        let root = Cred::root();
        fs.create(&NewInode::dir(b"/d").mode(0o755).cred(&root)).unwrap();
        let data = vec![0x5au8; 40 * 1024];
        let mut made = 0;
        let err = loop {
            match fs.write_file(
                &NewInode::file(format!("/d/f{made}").as_bytes()).mode(0o644).owner(0, 0),
                &data,
            ) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
            assert!(made < 1000, "{tag}: a 4 MiB image never filled");
        };
        assert_eq!(err.errno(), Errno::ENOSPC, "{tag}: {err}");
        assert!(made > 10, "{tag}: only {made} files fit");
        fs.sync().unwrap();
        fsck_clean(&img);
        // Freeing space makes room again.
        for i in 0..made {
            fs.unlink(format!("/d/f{i}").as_bytes(), &root).unwrap();
        }
        let _ = fs.unlink(format!("/d/f{made}").as_bytes(), &root);
        fs.write_file(&NewInode::file(b"/d/again").mode(0o644).owner(0, 0), &data)
            .unwrap();
        fs.sync().unwrap();
        drop(fs);
        fsck_clean(&img);
    }
}

#[test]
fn running_out_of_inodes_says_enospc() {
    let img = image("inodes", &["-t", "ext4", "-N", "64"], "8M");
    let fs = rw(&img);
    let root = Cred::root();
    let mut made = 0;
    let err = loop {
        let r = if made % 5 == 0 {
            fs.create(&NewInode::dir(format!("/d{made}").as_bytes()).mode(0o755).cred(&root))
                .map(|_| ())
        } else {
            fs.create(&NewInode::file(format!("/f{made}").as_bytes()).mode(0o644).owner(0, 0))
                .map(|_| ())
        };
        match r {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 1000, "64 inodes never ran out");
    };
    assert_eq!(err.errno(), Errno::ENOSPC, "{err}");
    assert!(
        err.to_string().contains("inode"),
        "the message should say inodes ran out: {err}"
    );
    fs.sync().unwrap();
    fsck_clean(&img);
    fs.unlink(b"/f1", &root).unwrap();
    fs.create(&NewInode::file(b"/last").mode(0o644).owner(0, 0)).unwrap();
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
}

#[test]
fn bad_names_and_loops_are_refused_cleanly() {
    let img = image("names", &["-t", "ext4"], "8M");
    let fs = rw(&img);
    let root = Cred::root();
    let long = format!("/{}", "x".repeat(256));
    let ok = format!("/{}", "y".repeat(255));
    assert_eq!(
        fs.create(&NewInode::file(long.as_bytes()).mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        fs.create(&NewInode::dir(long.as_bytes()).mode(0o755).cred(&root))
            .unwrap_err()
            .errno(),
        Errno::ENAMETOOLONG
    );
    fs.create(&NewInode::file(ok.as_bytes()).mode(0o644).owner(0, 0))
        .unwrap();
    assert_eq!(
        fs.rename(ok.as_bytes(), long.as_bytes(), Default::default(), &root)
            .unwrap_err()
            .errno(),
        Errno::ENAMETOOLONG
    );
    // A symlink loop: resolving through it is ELOOP, creating beside it works.
    fs.create(&NewInode::symlink(b"/loop-a", b"/loop-b").owner(0, 0))
        .unwrap();
    fs.create(&NewInode::symlink(b"/loop-b", b"/loop-a").owner(0, 0))
        .unwrap();
    assert_eq!(fs.stat(b"/loop-a").unwrap_err().errno(), Errno::ELOOP);
    assert_eq!(
        fs.create(&NewInode::file(b"/loop-a/x").mode(0o644).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ELOOP
    );
    assert_eq!(
        fs.create(&NewInode::dir(b"/loop-a/x").mode(0o755).cred(&root))
            .unwrap_err()
            .errno(),
        Errno::ELOOP
    );
    // A long symlink target takes a data block and reads back.
    let target = "t".repeat(1000); // 1 KiB blocks: up to 1023 bytes
    fs.create(&NewInode::symlink(b"/slow", target.as_bytes()).owner(0, 0))
        .unwrap();
    assert_eq!(fs.read_link(b"/slow").unwrap(), target.as_bytes());
    assert_eq!(
        fs.create(&NewInode::symlink(b"/too-long", "t".repeat(1024).as_bytes()).owner(0, 0))
            .unwrap_err()
            .errno(),
        Errno::ENAMETOOLONG
    );
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
}

/// More subdirectories than a link count holds (`dir_nlink`): when the
/// parent's count would reach 65,000 it becomes 1, "many", as
/// `ext4_inc_count` does, and stays 1 as subdirectories go and come
/// (`ext4_dec_count` leaves it). e2fsck accepts it; the kernel sees it.
#[test]
fn more_than_65000_subdirectories_use_dir_nlink() {
    let img = image("nlink", &["-t", "ext4", "-b", "1024", "-N", "70000", "-m", "0"], "160M");
    let fs = rw(&img);
    let root = Cred::root();
    fs.create(&NewInode::dir(b"/p").mode(0o755).cred(&root)).unwrap();
    // "." and the entry in "/" make 2; each subdirectory's ".." adds one.
    const BEFORE_MANY: usize = 64_997;
    for i in 0..BEFORE_MANY {
        fs.create(&NewInode::dir(format!("/p/d{i}").as_bytes()).mode(0o755).cred(&root))
            .unwrap();
    }
    assert_eq!(fs.stat(b"/p").unwrap().nlink, 64_999);
    for i in BEFORE_MANY..65_010 {
        fs.create(&NewInode::dir(format!("/p/d{i}").as_bytes()).mode(0o755).cred(&root))
            .unwrap();
        assert_eq!(fs.stat(b"/p").unwrap().nlink, 1, "after {} subdirectories", i + 1);
    }
    for i in 0..20 {
        fs.rmdir(format!("/p/d{i}").as_bytes(), &root).unwrap();
    }
    assert_eq!(fs.stat(b"/p").unwrap().nlink, 1, "\"many\" stays many");
    // Moving one out and back keeps both parents right.
    fs.create(&NewInode::dir(b"/q").mode(0o755).cred(&root)).unwrap();
    fs.rename(b"/p/d100", b"/q/d100", ext4kit::RenameFlags::default(), &root)
        .unwrap();
    assert_eq!(fs.stat(b"/q").unwrap().nlink, 3);
    assert_eq!(fs.stat(b"/p").unwrap().nlink, 1);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    if let Err(e) = ext4kit_testkit::kernel_available() {
        eprintln!("NOT CHECKED by the kernel: {e}");
        return;
    }
    let mnt = img.with_file_name("mnt-nlink");
    let m = ext4kit_testkit::LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.path().join("p")).unwrap().nlink(), 1);
    assert_eq!(std::fs::metadata(m.path().join("q")).unwrap().nlink(), 3);
    assert_eq!(std::fs::read_dir(m.path().join("p")).unwrap().count(), 65_010 - 21);
    m.unmount().unwrap();
}
