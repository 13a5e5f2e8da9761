//! Crash interoperability, both ways: a journal ext4kit left needing
//! recovery — the FUSE server killed with `kill -9` after fsyncs, while
//! writers were still busy — is replayed by the kernel's own mount, by
//! e2fsck and by ext4kit to the fsync'd tree, and e2fsck finds nothing to
//! repair beyond the replay; and an image the kernel left needing recovery
//! is taken over by an ext4kit read-write mount and written on.
//!
//! Needs root, FUSE and loop mounts (CI has them); fails with the reason
//! otherwise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

fn require_root_fuse_loop() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse does not exist: these tests need the FUSE driver"
    );
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests need root (FUSE and loop mounts); CI runs as root"
    );
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("these tests need loop mounts of ext4: {e}");
    }
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-crash-interop-{tag}-{}", std::process::id()));
    let _ = Command::new("umount").arg("-l").arg(w.join("mnt")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(w.join("mnt")).unwrap();
    w
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    ok(&o, what);
    o
}

fn mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
}

fn spawn_server(img: &Path, mnt: &Path) -> Child {
    let child = Command::new(BIN)
        .args(["mount", "--foreground"])
        .arg(img)
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !mounted(mnt) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the ext4kit mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// e2fsck -fy on a copy: it must only replay the journal and finish the
/// orphan list — any other repair means the crash left the filesystem
/// inconsistent. An orphan is a legitimate crash state: a file unlinked
/// while the kernel still held its inode stays allocated until the
/// kernel's FORGET (`ext4kit_fuse::nodes`), which comes asynchronously
/// (through /dev/fuse, also when requests travel over io_uring); a crash
/// before the release was committed leaves it on the orphan list, which
/// e2fsck releases ("Clearing orphaned inode", `release_orphan_inodes`) as
/// the kernel's mount does (`ext4_orphan_cleanup`).
///
/// The superblock's own free totals (`s_free_blocks_count`,
/// `s_free_inodes_count`) may lag the group descriptors in a crash image:
/// the journaled superblock carries the totals of its last logging, and
/// blocks freed by a later transaction move only the descriptors and
/// bitmaps. The kernel's journaled superblock lags the same way
/// (`ext4_orphan_add` logs it without touching the totals, which only
/// `ext4_commit_super` refreshes), its mount recounts from the descriptors
/// (`ext4_fill_super`), and e2fsck fixes the totals without a word under
/// -p (`PR_5_FREE_BLOCK_COUNT` and `PR_5_FREE_INODE_COUNT` are
/// `PR_PREEN_NOMSG`). Under -fy it prints them: those two lines (not the
/// per-group ones, which would be damage) are a crash state too.
fn e2fsck_only_replays(img: &Path, what: &str) {
    let o = Command::new("timeout")
        .args(["300", "e2fsck", "-fy"])
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let odd: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("Pass ")
                && !l.contains("recovering journal")
                && !l.contains(" files (")
                && !l.starts_with("e2fsck ")
                && !l.starts_with("Clearing orphaned inode ")
                && !is_superblock_total(l)
                && *l != "Fix? yes"
        })
        .collect();
    let crash_state = text
        .lines()
        .any(|l| l.starts_with("Clearing orphaned inode ") || is_superblock_total(l));
    // Releasing an orphan, or refreshing the totals, is a change e2fsck
    // reports.
    let odd: Vec<&str> = odd
        .into_iter()
        .filter(|l| !(crash_state && l.ends_with("***** FILE SYSTEM WAS MODIFIED *****")))
        .collect();
    assert!(
        matches!(o.status.code(), Some(0 | 1)) && odd.is_empty(),
        "{what}: e2fsck -fy had to repair more than replay the journal (exit {:?}):\n{}",
        o.status.code(),
        odd.join("\n")
    );
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{what}: after e2fsck's replay: {e}"));
}

/// Every file of `want` (path relative to the root → contents) exists with
/// exactly those contents under `root`.
fn check_fsynced(root: &Path, want: &BTreeMap<String, Vec<u8>>, gone: &[&str], what: &str) {
    for (p, data) in want {
        let got = std::fs::read(root.join(p)).unwrap_or_else(|e| panic!("{what}: fsync'd {p} is missing: {e}"));
        assert!(
            got == *data,
            "{what}: fsync'd {p} has {} bytes, not its {}",
            got.len(),
            data.len()
        );
    }
    for p in gone {
        assert!(
            !root.join(p).exists(),
            "{what}: {p} was removed and the directory fsync'd, but it is back"
        );
    }
}

/// e2fsck's pass-5 line for the superblock's own free total ("Free blocks
/// count wrong (N, counted=M)."), not a group's ("... for group #G").
fn is_superblock_total(l: &str) -> bool {
    (l.starts_with("Free blocks count wrong (") || l.starts_with("Free inodes count wrong ("))
        && !l.contains("for group")
}

fn fsync_path(p: &Path) {
    let f = std::fs::File::open(p).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn a_killed_server_leaves_a_journal_the_kernel_e2fsck_and_ext4kit_replay_to_the_fsynced_tree() {
    require_root_fuse_loop();
    let work = workdir("kill9");
    let img = work.join("fs.img");
    run(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&img)
            .arg("64M"),
        "mke2fs",
    );
    let mnt = work.join("mnt");
    let mut server = spawn_server(&img, &mnt);
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    std::fs::create_dir_all(mnt.join("d/sub")).unwrap();
    for i in 0..60u32 {
        let p = format!("d/f{i}");
        let data: Vec<u8> = (0..(i * 3001 % 70_000)).map(|k| (k * 7 + i) as u8).collect();
        std::fs::write(mnt.join(&p), &data).unwrap();
        fsync_path(&mnt.join(&p));
        want.insert(p, data);
    }
    // A rename and an unlink made durable by fsync of the directory.
    std::fs::rename(mnt.join("d/f1"), mnt.join("d/sub/moved")).unwrap();
    let moved = want.remove("d/f1").unwrap();
    want.insert("d/sub/moved".into(), moved);
    std::fs::remove_file(mnt.join("d/f2")).unwrap();
    want.remove("d/f2");
    fsync_path(&mnt.join("d"));
    fsync_path(&mnt.join("d/sub"));
    // Traffic in flight when the server dies.
    let busy = Command::new("sh")
        .arg("-c")
        .arg(
            "cd \"$1\" && i=0; while :; do i=$((i+1)); mkdir -p w/$((i % 5)) && head -c $((i * 997 % 100000)) \
             /dev/urandom > w/$((i % 5))/f$i 2>/dev/null || exit 0; rm -f w/$(((i+2) % 5))/f$((i-4)); done",
        )
        .arg("sh")
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = Command::new("umount").arg("-l").arg(&mnt).output();
    let mut busy = busy;
    let _ = busy.kill();
    let _ = busy.wait();
    let dump = run(Command::new("dumpe2fs").arg("-h").arg(&img), "dumpe2fs");
    let header = String::from_utf8_lossy(&dump.stdout).to_string();
    assert!(
        header.contains("needs_recovery"),
        "the killed server's image should need recovery (its journal holds the fsyncs):\n{header}"
    );
    let gone = ["d/f1", "d/f2"];

    // 1. The kernel's mount replays it.
    let k = work.join("kernel.img");
    std::fs::copy(&img, &k).unwrap();
    {
        let m = ext4kit_testkit::LoopMount::mount(&k, &work.join("kmnt"), "ext4", false).unwrap();
        check_fsynced(m.path(), &want, &gone, "kernel replay");
        m.unmount().unwrap();
    }
    ext4kit_testkit::e2fsck_clean(&k).unwrap_or_else(|e| panic!("after the kernel's replay: {e}"));

    // 2. e2fsck replays it and has nothing else to repair.
    let e = work.join("e2fsck.img");
    std::fs::copy(&img, &e).unwrap();
    e2fsck_only_replays(&e, "e2fsck replay");
    let out = work.join("e2fsck-tree");
    std::fs::create_dir_all(&out).unwrap();
    run(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump / {}", out.display()))
            .arg(&e),
        "debugfs rdump",
    );
    check_fsynced(&out, &want, &gone, "e2fsck replay");

    // 3. ext4kit replays it, in memory (the image is not changed) ...
    let before = std::fs::read(&img).unwrap();
    let got = work.join("ext4kit-tree");
    run(Command::new(BIN).arg("get").arg(&img).arg("/").arg(&got), "ext4kit get");
    check_fsynced(&got, &want, &gone, "ext4kit read-only replay");
    assert!(std::fs::read(&img).unwrap() == before, "a read changed the image");
    // ... and on disk when it mounts read-write again.
    let mut server = spawn_server(&img, &mnt);
    check_fsynced(&mnt, &want, &gone, "ext4kit read-write replay");
    ok(
        &Command::new(BIN).arg("umount").arg(&mnt).output().unwrap(),
        "ext4kit umount",
    );
    let _ = server.wait();
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("after ext4kit's replay and a clean unmount: {e}"));
    let header =
        String::from_utf8_lossy(&run(Command::new("dumpe2fs").arg("-h").arg(&img), "dumpe2fs").stdout).to_string();
    assert!(
        !header.contains("needs_recovery"),
        "a clean unmount leaves no recovery to do"
    );
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn an_image_the_kernel_left_needing_recovery_is_taken_over_and_written_on() {
    require_root_fuse_loop();
    let work = workdir("takeover");
    let img = work.join("fs.img");
    run(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&img)
            .arg("64M"),
        "mke2fs",
    );
    let kmnt = work.join("kmnt");
    let copy = work.join("copy.img");
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &kmnt, "ext4", false).unwrap();
        std::fs::create_dir(m.path().join("k")).unwrap();
        for i in 0..40u32 {
            let p = format!("k/f{i}");
            let data = vec![i as u8; (i * 1000) as usize];
            std::fs::write(m.path().join(&p), &data).unwrap();
            fsync_path(&m.path().join(&p));
            want.insert(p, data);
        }
        fsync_path(&m.path().join("k"));
        run(
            Command::new("cp").arg("--sparse=always").arg(&img).arg(&copy),
            "copy while mounted",
        );
        m.unmount().unwrap();
    }
    let header =
        String::from_utf8_lossy(&run(Command::new("dumpe2fs").arg("-h").arg(&copy), "dumpe2fs").stdout).to_string();
    assert!(
        header.contains("needs_recovery"),
        "the copy should need recovery:\n{header}"
    );
    // ext4kit mounts it read-write (replaying on disk) and writes on.
    let mnt = work.join("mnt");
    let mut server = spawn_server(&copy, &mnt);
    check_fsynced(&mnt, &want, &[], "ext4kit takeover");
    std::fs::create_dir(mnt.join("ours")).unwrap();
    for i in 0..20u32 {
        let p = format!("ours/g{i}");
        let data = vec![0x80 | i as u8; (i * 777) as usize];
        std::fs::write(mnt.join(&p), &data).unwrap();
        want.insert(p, data);
    }
    std::fs::remove_file(mnt.join("k/f3")).unwrap();
    want.remove("k/f3");
    ok(
        &Command::new(BIN).arg("umount").arg(&mnt).output().unwrap(),
        "ext4kit umount",
    );
    let _ = server.wait();
    ext4kit_testkit::e2fsck_clean(&copy).unwrap_or_else(|e| panic!("after the takeover: {e}"));
    let m = ext4kit_testkit::LoopMount::mount(&copy, &kmnt, "ext4", true).unwrap();
    check_fsynced(m.path(), &want, &["k/f3"], "the kernel reading what we wrote");
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&work);
}
