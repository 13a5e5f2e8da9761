//! The mount benchmark's machinery: the generated tree is deterministic and
//! its counts are what is on disk; fuse2fs and kernel mounts come and go
//! leaving an image e2fsck accepts; a session on a peer that cannot write
//! runs writing phases on the kernel stand-in and reads on the peer.
//!
//! The mount tests need root, loop devices and fuse2fs; they skip loudly
//! otherwise.

use std::path::Path;
use std::process::Command;

use ext4kit_bench::peers::{fsck_verdict, mount_options, Peer, PeerConfig, PeerMount};
use ext4kit_bench::session::Session;
use ext4kit_bench::srctree::{build_tree, tarball, TreeCounts, TreeShape};

/// Every path below `root` with its kind and (for files) size and a hash
/// of the bytes, sorted; plus the counts a walk finds.
fn listing(root: &Path) -> (Vec<String>, TreeCounts) {
    let mut out = Vec::new();
    let mut c = TreeCounts {
        dirs: 0,
        files: 0,
        symlinks: 0,
        bytes: 0,
    };
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("readdir") {
            let p = e.expect("entry").path();
            let rel = p.strip_prefix(root).expect("prefix").display().to_string();
            let md = std::fs::symlink_metadata(&p).expect("lstat");
            if md.is_dir() {
                c.dirs += 1;
                out.push(format!("d {rel}"));
                stack.push(p);
            } else if md.is_symlink() {
                c.symlinks += 1;
                out.push(format!(
                    "l {rel} -> {}",
                    std::fs::read_link(&p).expect("readlink").display()
                ));
            } else {
                let data = std::fs::read(&p).expect("read");
                c.files += 1;
                c.bytes += data.len() as u64;
                let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                });
                out.push(format!("f {rel} {} {h:x}", data.len()));
            }
        }
    }
    out.sort();
    (out, c)
}

#[test]
fn generated_tree_is_deterministic_and_counted() {
    let t = tempfile::tempdir().expect("tempdir");
    let shape = TreeShape {
        dirs: 60,
        files: 700,
        seed: 9,
    };
    let a = build_tree(&t.path().join("a"), &shape).expect("build a");
    let b = build_tree(&t.path().join("b"), &shape).expect("build b");
    assert_eq!(a, b);
    let (la, ca) = listing(&t.path().join("a"));
    let (lb, _) = listing(&t.path().join("b"));
    assert_eq!(la, lb, "two builds of one shape differ");
    assert_eq!(ca, a, "the counts returned are not what is on disk");
    assert_eq!(a.files + a.symlinks, 700);
    assert!(a.symlinks > 0 && a.files > 600, "{a:?}");
    assert_eq!(a.find_lines(), 1 + la.len() as u64);
    // A different seed gives a different tree.
    let other = build_tree(&t.path().join("c"), &TreeShape { seed: 10, ..shape }).expect("build c");
    let (lc, _) = listing(&t.path().join("c"));
    assert_ne!(la, lc);
    assert_eq!(other.dirs, 60);
}

#[test]
fn tarball_is_reused_and_byte_identical() {
    let t = tempfile::tempdir().expect("tempdir");
    let shape = TreeShape {
        dirs: 10,
        files: 100,
        seed: 3,
    };
    let (tar, counts) = tarball(t.path(), &shape).expect("tarball");
    let first = std::fs::read(&tar).expect("read tar");
    // Rebuilt from scratch: the same bytes.
    std::fs::remove_file(&tar).expect("rm");
    let (tar2, counts2) = tarball(t.path(), &shape).expect("tarball again");
    assert_eq!(counts, counts2);
    assert_eq!(
        first,
        std::fs::read(&tar2).expect("read tar"),
        "tarball not reproducible"
    );
    // And what it holds is the tree: untar and count.
    let x = t.path().join("x");
    std::fs::create_dir(&x).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xf")
        .arg(&tar2)
        .arg("-C")
        .arg(&x)
        .status()
        .expect("tar");
    assert!(st.success());
    let (l, c) = listing(&x.join("tree"));
    assert_eq!(c, counts);
    assert_eq!(counts.find_lines(), 1 + l.len() as u64);
}

/// The benchmark's peers need root (loop and FUSE mounts) and fuse2fs:
/// without them this test fails saying so, rather than passing untested
/// (CI runs as root; `.ci/run` installs fuse2fs).
fn mount_env() -> tempfile::TempDir {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the mount benchmark's peers need root and loop devices: {e}");
    }
    if Command::new("fuse2fs").arg("--version").output().is_err() {
        panic!("fuse2fs is not installed (apt-get install fuse2fs; .ci/run installs it)");
    }
    tempfile::tempdir().expect("tempdir")
}

fn mkfs(img: &Path) {
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096"])
        .arg(img)
        .arg("64M")
        .status()
        .expect("mke2fs");
    assert!(st.success());
}

fn cfg() -> PeerConfig {
    PeerConfig {
        ext4kit_bin: "ext4kit-not-used".into(),
        threads: 2,
        cache_budget: ext4kit::OpenOptions::default().cache_budget,
        fuse2fs_opts: String::new(),
    }
}

#[test]
fn fuse2fs_and_kernel_mounts_write_clean_images() {
    let t = mount_env();
    for peer in [Peer::Fuse2fs, Peer::Kernel] {
        let img = t.path().join(format!("{}.img", peer.name()));
        mkfs(&img);
        let mnt = t.path().join("mnt");
        let m = PeerMount::mount(peer, &cfg(), &img, &mnt, false).expect("mount rw");
        assert_eq!(m.peer(), peer);
        let opts = mount_options(m.path()).expect("the mount is in mountinfo");
        let want = if peer == Peer::Kernel { "ext4 " } else { "fuse" };
        assert!(opts.starts_with(want), "{}: {opts}", peer.name());
        std::fs::create_dir(m.path().join("d")).expect("mkdir");
        std::fs::write(m.path().join("d/f"), b"hello mount").expect("write");
        m.unmount().expect("unmount");
        assert!(mount_options(&mnt).is_none(), "{} still mounted", peer.name());
        let (ok, verdict) = fsck_verdict(&img);
        assert!(ok, "{}: {verdict}", peer.name());
        // Read back read-only through the same peer.
        let m = PeerMount::mount(peer, &cfg(), &img, &mnt, true).expect("mount ro");
        assert_eq!(std::fs::read(m.path().join("d/f")).expect("read"), b"hello mount");
        assert!(
            std::fs::write(m.path().join("g"), b"x").is_err(),
            "ro mount accepted a write"
        );
        m.unmount().expect("unmount ro");
    }
}

#[test]
fn fsck_verdict_reports_damage() {
    let t = mount_env();
    let img = t.path().join("bad.img");
    mkfs(&img);
    // Zero the first group descriptor block (block 1 with 4 KiB blocks).
    let f = std::fs::OpenOptions::new().write(true).open(&img).expect("open");
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 4096], 4096).expect("zero");
    drop(f);
    let (ok, verdict) = fsck_verdict(&img);
    assert!(!ok);
    assert!(verdict.starts_with("NOT CLEAN"), "{verdict}");
}

#[test]
fn session_stands_in_for_a_read_only_peer() {
    let t = mount_env();
    let img = t.path().join("s.img");
    mkfs(&img);
    let mnt = t.path().join("mnt");
    let c = cfg();
    // fuse2fs playing a peer that can only mount read-only.
    let mut s = Session::new(Peer::Fuse2fs, &c, &img, &mnt, false);
    let w = s
        .write(|dir| {
            assert!(
                mount_options(dir).expect("mounted").starts_with("ext4 "),
                "stand-in is not the kernel"
            );
            std::fs::write(dir.join("f"), b"written by the stand-in").map_err(|e| e.to_string())
        })
        .expect("write phase");
    assert!(w.is_none(), "a stand-in write must not count as measured");
    let r = s
        .read(false, |dir| {
            assert!(
                mount_options(dir).expect("mounted").starts_with("fuse"),
                "read not on the peer"
            );
            std::fs::read(dir.join("f")).map_err(|e| e.to_string())
        })
        .expect("read phase");
    assert_eq!(r.as_deref(), Some(&b"written by the stand-in"[..]));
    // After the peer's reads began, writing phases are skipped, not run.
    let mut ran = false;
    let w = s
        .write(|_| {
            ran = true;
            Ok(())
        })
        .expect("skipped write");
    assert!(w.is_none() && !ran);
    s.finish().expect("finish");
    let (ok, verdict) = fsck_verdict(&img);
    assert!(ok, "{verdict}");

    // A writable peer: writes measured on the peer, a cold read remounts.
    let mut s = Session::new(Peer::Fuse2fs, &c, &img, &mnt, true);
    let w = s
        .write(|dir| {
            assert!(mount_options(dir).expect("mounted").starts_with("fuse"));
            std::fs::write(dir.join("g"), b"by the peer").map_err(|e| e.to_string())
        })
        .expect("write");
    assert_eq!(w, Some(()));
    let r = s
        .read(true, |dir| std::fs::read(dir.join("g")).map_err(|e| e.to_string()))
        .expect("read");
    assert_eq!(r.as_deref(), Some(&b"by the peer"[..]));
    s.finish().expect("finish");
    let (ok, verdict) = fsck_verdict(&img);
    assert!(ok, "{verdict}");
}
