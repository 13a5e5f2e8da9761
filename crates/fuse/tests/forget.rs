//! Kernel lookup counts through a real mount: every name the kernel looks
//! up (or gets from READDIRPLUS) is counted (a hold on its inode number in
//! the engine), and when the kernel drops its dentries and inodes it sends
//! FORGET and the counts go back to zero: nothing leaks.
//!
//! Needs /dev/fuse and root (CI runs as root); fails loudly otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

#[test]
fn lookups_are_counted_and_forgotten() {
    ext4kit_testkit::require_root_and_fuse("this test mounts with mount(2)");
    let work = std::env::temp_dir().join(format!("ext4kit-fuse-forget-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let src = work.join("src");
    for d in 0..5 {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..40 {
            std::fs::write(src.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let img = work.join("img");
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("16M")
        .status()
        .unwrap();
    assert!(st.success());
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = ext4kit_fuse::mount(&img, &mnt, &ext4kit_fuse::MountOptions::default()).unwrap();
    let refs = m.kernel_refs();
    let server = std::thread::spawn(move || m.run());

    assert!(refs.is_empty(), "nothing looked up yet: {}", refs.len());
    // `ls -l`-style walk: lookups (or READDIRPLUS) of every name.
    let mut n = 0;
    for d in std::fs::read_dir(&mnt).unwrap() {
        let d = d.unwrap();
        std::fs::symlink_metadata(d.path()).unwrap();
        n += 1;
        if d.file_type().unwrap().is_dir() {
            for f in std::fs::read_dir(d.path()).unwrap() {
                let f = f.unwrap();
                assert!(!std::fs::read(f.path()).unwrap().is_empty() || f.path().ends_with("lost+found"));
                n += 1;
            }
        }
    }
    assert!(n > 200);
    let held = refs.len();
    assert!(held >= 200, "the kernel holds every name it saw: {held} of {n}");

    // Make the kernel drop its dentries and inodes: it FORGETs them all.
    ext4kit_testkit::drop_kernel_caches_until(
        Duration::from_secs(20),
        || refs.is_empty(),
        || format!("the kernel still holds {} inodes after dropping its caches", refs.len()),
    );

    ext4kit_fuse::unmount(&mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

/// The kernel may hold far more inodes than the engine's inode cache has
/// room for (when each lookup count pinned a cached inode, a million files
/// created through the mount kept a million cached inodes: 1.2 GiB of
/// server RSS under a 256 MiB budget).
/// Its holds are counts by number: the held inodes leave the cache, and
/// unlinking them while held still puts them on the orphan list, from
/// which the kernel's FORGETs free them; the image is e2fsck-clean.
#[test]
fn held_inodes_leave_the_cache_and_unlinked_ones_wait_for_forget() {
    ext4kit_testkit::require_root_and_fuse("this test mounts with mount(2)");
    let (work, img, mnt) = fresh_image("held", &["-N", "20000"], "64M");
    let opts = ext4kit_fuse::MountOptions {
        // The smallest caches: 1,024 inodes.
        cache_budget: 4 << 20,
        ..Default::default()
    };
    let m = ext4kit_fuse::mount(&img, &mnt, &opts).unwrap();
    // The server runs in this process: a failing assertion would leave a
    // dead mount (ENOTCONN) behind once the process exits; detach it.
    struct DetachOnPanic(std::path::PathBuf);
    impl Drop for DetachOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = Command::new("umount").arg("-l").arg(&self.0).output();
            }
        }
    }
    let _detach = DetachOnPanic(mnt.clone());
    let refs = m.kernel_refs();
    let fs = m.fs().clone();
    let server = std::thread::spawn(move || m.run());

    const N: usize = 12_000;
    let d = mnt.join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..N {
        std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    // (The other test in this file drops the kernel's caches, which may
    // make it forget some of ours.)
    let held = refs.len();
    assert!(held >= N / 2, "the kernel holds what it created: {held}");
    let cached = fs.stats().cached_inodes;
    assert!(
        cached < 3000,
        "{cached} inodes cached while the kernel holds {held} (the cache's limit is 1,024)"
    );
    let free_before = fs.statfs().unwrap().files_free;
    for i in 0..N {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    // Unlinked while the kernel still knew them: on the orphan list until
    // it forgets them, then freed (the FORGET path of the engine: the last
    // hold of an unlinked inode frees it).
    let target = free_before + N as u64;
    ext4kit_testkit::drop_kernel_caches_until(
        Duration::from_secs(30),
        || fs.statfs().unwrap().files_free >= target,
        || {
            format!(
                "{} of {N} unlinked files not freed; the kernel holds {} inodes",
                target - fs.statfs().unwrap().files_free,
                refs.len()
            )
        },
    );
    drop(fs);
    ext4kit_fuse::unmount(&mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
    ext4kit_testkit::e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

/// `rm` of a big closed file, then `df`: over FUSE the blocks are freed at
/// the kernel's FORGET, which another server thread may still be working
/// on when the STATFS arrives; the kernel's ext4 shows them free as soon
/// as `unlink(2)` returns, and so must we after the `syncfs` xfstests
/// generic/015 runs between the two.
#[test]
fn space_of_a_removed_file_is_free_at_the_next_statfs() {
    ext4kit_testkit::require_root_and_fuse("this test mounts with mount(2)");
    let (work, img, mnt) = fresh_image("df", &[], "256M");
    let m = ext4kit_fuse::mount(&img, &mnt, &ext4kit_fuse::MountOptions::default()).unwrap();
    let server = std::thread::spawn(move || m.run());
    let avail = || {
        let s = rustix::fs::statvfs(&mnt).unwrap();
        (s.f_bavail, s.f_blocks)
    };
    let (empty, total) = avail();
    let chunk = vec![0x5au8; 1 << 20];
    for round in 0..3 {
        let f = mnt.join("fill");
        {
            let mut w = std::fs::File::create(&f).unwrap();
            for _ in 0..200 {
                std::io::Write::write_all(&mut w, &chunk).unwrap();
            }
        }
        let (full, _) = avail();
        assert!(
            full < empty / 4,
            "round {round}: 200 MiB written, {full} of {total} blocks still free"
        );
        std::fs::remove_file(&f).unwrap();
        // As the test does: syncfs(2), which over FUSE waits for the
        // kernel's writeback, not for the server's FORGET work.
        rustix::fs::syncfs(std::fs::File::open(&mnt).unwrap()).unwrap();
        let (after, _) = avail();
        assert!(
            after + 64 >= empty,
            "round {round}: right after rm, {after} blocks free; {empty} before the file was written"
        );
    }
    ext4kit_fuse::unmount(&mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
    ext4kit_testkit::e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

/// A fresh work directory `ext4kit-fuse-TAG-PID` with an ext4 image of
/// `size` made by mke2fs (`extra` options) and an empty mount point:
/// (work, image, mount point).
fn fresh_image(tag: &str, extra: &[&str], size: &str) -> (PathBuf, PathBuf, PathBuf) {
    let work = std::env::temp_dir().join(format!("ext4kit-fuse-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let img = work.join("img");
    let st = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .args(extra)
        .arg(&img)
        .arg(size)
        .status()
        .unwrap();
    assert!(st.success(), "mke2fs {extra:?} {size}");
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    (work, img, mnt)
}
