//! Kernel lookup counts through a real mount: every name the kernel looks
//! up (or gets from READDIRPLUS) is counted and pins its inode, and when the
//! kernel drops its dentries and inodes it sends FORGET and the counts go
//! back to zero: nothing leaks, nothing the kernel holds is evicted.
//!
//! Needs /dev/fuse and root (CI runs as root); fails loudly otherwise.

use std::process::Command;
use std::time::{Duration, Instant};

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
    let t = Instant::now();
    while !refs.is_empty() {
        let _ = Command::new("sync").status();
        std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the kernel still holds {} inodes after dropping its caches",
            refs.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    ext4kit_fuse::unmount(&mnt, Duration::from_secs(30)).unwrap();
    server.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&work);
}
