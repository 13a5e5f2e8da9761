//! A full disk through `ext4kit mount` (space is claimed at write(2), never
//! found missing at writeback): the scenario a new user hit — `mke2fs -t
//! ext4 e.img 64M`, `keep`, `dir`, `sync`, one file written until ENOSPC,
//! `ext4kit umount` — keeps `keep`, `dir` and every byte write() accepted;
//! an ordinary user gets ENOSPC where only the root reserve is left while
//! root may still fill it; and a write-back that fails on the image file
//! (the host filesystem under a sparse image is full) reaches fsync and
//! `ext4kit umount`'s exit status without costing the files committed
//! before. Oracles: e2fsck -fn, the kernel's ext4 reading the image back,
//! debugfs.
//!
//! They need root, /dev/fuse, e2fsprogs, util-linux (setpriv, fallocate)
//! and tmpfs (CI runs as root); without them they fail and say why.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ext4kit_testkit::{e2fsck_clean, LoopMount};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");
const ENOSPC: i32 = 28;
const EIO: i32 = 5;

fn require_root_and_fuse() {
    ext4kit_testkit::require_root_and_fuse("they mount, mount tmpfs, loop-mount and switch to user nobody");
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-fulldisk-{tag}-{}", std::process::id()));
    let _ = Command::new("umount").arg("-l").arg(w.join("mnt")).output();
    let _ = Command::new("umount").arg("-l").arg(w.join("host")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(w.join("mnt")).unwrap();
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
    w
}

fn run(c: &mut Command) -> Output {
    c.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {c:?}: {e}"))
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

fn mkfs(img: &Path) {
    ok(
        &run(Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(img)
            .arg("64M")),
        "mke2fs (apt-get install e2fsprogs)",
    );
}

fn mount(img: &Path, mnt: &Path, opts: &[&str]) {
    let mut c = Command::new(BIN);
    c.arg("mount");
    for o in opts {
        c.args(["-o", o]);
    }
    ok(&run(c.arg(img).arg(mnt)), "ext4kit mount");
}

fn umount(mnt: &Path) -> Output {
    run(Command::new(BIN).arg("umount").arg(mnt))
}

/// The byte at offset `k` of test file `salt`.
fn pattern(salt: u64, k: u64) -> u8 {
    (k.wrapping_mul(0x9E37_79B9).wrapping_add(salt * 131) >> 7) as u8
}

fn chunk(salt: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|k| pattern(salt, off + k)).collect()
}

/// Write `salt`'s pattern to `path` in 128 KiB writes until one fails;
/// returns the bytes accepted and the failing write's errno.
fn fill(path: &Path, salt: u64) -> (u64, i32) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut done = 0u64;
    loop {
        let data = chunk(salt, done, 128 << 10);
        match f.write(&data) {
            Ok(0) => panic!("write returned 0 at {done}"),
            Ok(n) => done += n as u64,
            Err(e) => return (done, e.raw_os_error().unwrap_or(0)),
        }
        assert!(done < 1 << 30, "no ENOSPC after 1 GiB on a 64 MiB filesystem");
    }
}

fn check_file(path: &Path, salt: u64, len: u64) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, len, "{}: size", path.display());
    if let Some(i) = (0..data.len()).find(|&i| data[i] != pattern(salt, i as u64)) {
        panic!("{}: byte {i} differs from what was written", path.display());
    }
}

/// (f_bfree, f_bavail) of the filesystem at `dir`.
fn df(dir: &Path) -> (u64, u64) {
    let s = rustix::fs::statvfs(dir).unwrap();
    (s.f_bfree, s.f_bavail)
}

/// The kernel's ext4 reads the image read-only for `f`.
fn with_kernel<R>(img: &Path, work: &Path, f: impl FnOnce(&Path) -> R) -> R {
    let k = work.join("kernel");
    std::fs::create_dir_all(&k).unwrap();
    let m = LoopMount::mount(img, &k, "ext4", true).unwrap_or_else(|e| panic!("loop mount: {e}"));
    let r = f(m.path());
    m.unmount().unwrap();
    r
}

/// The scenario, as root: nothing is lost and e2fsck is clean.
#[test]
fn full_disk_keeps_keep_dir_and_every_accepted_byte() {
    require_root_and_fuse();
    let work = workdir("root");
    let (img, mnt) = (work.join("e.img"), work.join("mnt"));
    mkfs(&img);
    mount(&img, &mnt, &[]);
    std::fs::write(mnt.join("keep"), b"keep\n").unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    ok(&run(&mut Command::new("sync")), "sync");
    let (free0, _) = df(&mnt);
    let (accepted, errno) = fill(&mnt.join("big"), 1);
    assert_eq!(errno, ENOSPC, "the write that did not fit");
    // df counts what write() accepted, though it is not written back yet.
    let (bfree, bavail) = df(&mnt);
    assert_eq!(bavail, 0, "df after the disk filled: {bfree} free");
    assert!(bfree < free0 / 50, "df after the disk filled: {bfree} of {free0} free");
    assert!(
        accepted > free0 * 1024 * 95 / 100,
        "only {accepted} bytes accepted of {free0} free 1 KiB blocks"
    );
    ok(&umount(&mnt), "ext4kit umount");
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    with_kernel(&img, &work, |k| {
        assert_eq!(std::fs::read(k.join("keep")).unwrap(), b"keep\n");
        assert!(k.join("dir").is_dir());
        check_file(&k.join("big"), 1, accepted);
    });
    let _ = std::fs::remove_dir_all(&work);
}

/// With `-o cache=writeback` the kernel accepts writes into its own cache
/// without asking the server, so a full disk cannot be refused at write():
/// it reaches the writer's close, and `ext4kit umount` exits nonzero saying
/// data was lost; what was synced before stays, e2fsck is clean.
#[test]
fn writeback_cache_reports_a_full_disk_at_close_and_umount() {
    require_root_and_fuse();
    let work = workdir("wb");
    let (img, mnt) = (work.join("e.img"), work.join("mnt"));
    mkfs(&img);
    mount(&img, &mnt, &["cache=writeback"]);
    std::fs::write(mnt.join("keep"), b"keep\n").unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::File::open(mnt.join("keep")).unwrap().sync_all().unwrap();
    // 96 MiB into a 64 MiB filesystem: write() takes it all (the kernel's
    // cache), the close that writes it back fails.
    let o = run(Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=96"])
        .arg(format!("of={}", mnt.join("big").display())));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "dd of 96 MiB into 64 MiB succeeded: {err}");
    assert!(err.contains("No space left on device"), "dd: {err}");
    let u = umount(&mnt);
    let msg = String::from_utf8_lossy(&u.stderr).into_owned();
    assert!(
        !u.status.success(),
        "ext4kit umount exited 0 after lost write-backs: {msg}"
    );
    assert!(msg.contains("write-back") && msg.contains("lost"), "{msg}");
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    with_kernel(&img, &work, |k| {
        assert_eq!(std::fs::read(k.join("keep")).unwrap(), b"keep\n");
        assert!(k.join("dir").is_dir());
    });
    let _ = std::fs::remove_dir_all(&work);
}

/// An ordinary user's write gets ENOSPC at the root reserve; root may
/// then use it; both files survive as accepted.
#[test]
fn an_ordinary_user_stops_at_the_root_reserve() {
    require_root_and_fuse();
    let work = workdir("user");
    let (img, mnt) = (work.join("e.img"), work.join("mnt"));
    mkfs(&img);
    mount(&img, &mnt, &["allow_other"]);
    let public = mnt.join("pub");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = run(Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "dd",
            "if=/dev/zero",
            "bs=64k",
        ])
        .arg(format!("of={}", public.join("u").display())));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "dd as nobody never failed: {err}");
    assert!(err.contains("No space left on device"), "dd as nobody: {err}");
    let user_bytes: u64 = err
        .lines()
        .find_map(|l| l.split_once(" bytes").and_then(|(n, _)| n.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no byte count in dd's report: {err}"));
    let (bfree, bavail) = df(&mnt);
    assert_eq!(bavail, 0, "nothing left for ordinary users ({bfree} free)");
    // mke2fs's 5 % of 65536 blocks: 3276 reserved for root.
    assert!(bfree >= 3276, "the reserve is still free: {bfree}");
    let (root_bytes, errno) = fill(&mnt.join("rootfile"), 2);
    assert_eq!(errno, ENOSPC);
    assert!(
        root_bytes > 3276 * 1024 * 9 / 10,
        "root got only {root_bytes} bytes of the reserve"
    );
    ok(&umount(&mnt), "ext4kit umount");
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    with_kernel(&img, &work, |k| {
        let u = std::fs::read(k.join("pub/u")).unwrap();
        assert_eq!(
            u.len() as u64,
            user_bytes,
            "nobody's file holds what dd was told was written"
        );
        assert!(u.iter().all(|&b| b == 0));
        check_file(&k.join("rootfile"), 2, root_bytes);
    });
    let _ = std::fs::remove_dir_all(&work);
}

/// The image file lives on a full tmpfs with its free blocks punched out:
/// writes of new data to it fail (the host says ENOSPC), writes of the
/// metadata already there succeed. fsync reports EIO, `ext4kit umount`
/// exits nonzero naming the failure, and what was committed before stays.
#[test]
fn a_writeback_io_error_reaches_fsync_and_the_umount_status() {
    require_root_and_fuse();
    let work = workdir("eio");
    let (host, mnt) = (work.join("host"), work.join("mnt"));
    std::fs::create_dir_all(&host).unwrap();
    ok(
        &run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=80m", "tmpfs"])
            .arg(&host)),
        "mount -t tmpfs",
    );
    let img = host.join("e.img");
    mkfs(&img);
    mount(&img, &mnt, &[]);
    std::fs::write(mnt.join("keep"), b"keep\n").unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/f"), chunk(3, 0, 3000)).unwrap();
    std::fs::File::create(mnt.join("big")).unwrap();
    ok(&umount(&mnt), "ext4kit umount (setting up)");
    // Every block in use is allocated on the host; every free one is a
    // hole; the host has nothing left to fill a hole with.
    let full = host.join("full.img");
    ok(
        &run(Command::new("cp").arg("--sparse=never").arg(&img).arg(&full)),
        "cp",
    );
    std::fs::rename(&full, &img).unwrap();
    let d = run(Command::new("dumpe2fs").arg(&img));
    ok(&d, "dumpe2fs");
    let text = String::from_utf8_lossy(&d.stdout).into_owned();
    for l in text.lines().filter_map(|l| l.strip_prefix("  Free blocks: ")) {
        for r in l.split(", ").map(str::trim).filter(|r| !r.is_empty()) {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            ok(
                &run(Command::new("fallocate")
                    .args([
                        "-p",
                        "-o",
                        &(a * 1024).to_string(),
                        "-l",
                        &((b - a + 1) * 1024).to_string(),
                    ])
                    .arg(&img)),
                "fallocate -p",
            );
        }
    }
    let avail = rustix::fs::statvfs(&host).unwrap();
    let left = avail.f_bavail * avail.f_bsize;
    ok(
        &run(Command::new("fallocate")
            .args(["-l", &left.saturating_sub(64 << 10).to_string()])
            .arg(host.join("filler"))),
        "fallocate filler",
    );
    mount(&img, &mnt, &[]);
    let mut f = std::fs::OpenOptions::new().write(true).open(mnt.join("big")).unwrap();
    for i in 0..40 {
        f.write_all(&chunk(4, i * (256 << 10), 256 << 10))
            .expect("the writes are accepted: the image has room");
    }
    let e = f.sync_all().expect_err("fsync of data the image file cannot take");
    assert_eq!(e.raw_os_error(), Some(EIO), "{e}");
    drop(f);
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"keep\n");
    let o = umount(&mnt);
    let msg = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "ext4kit umount exited 0 after a failed write-back: {msg}"
    );
    assert!(
        msg.contains("writing back at unmount failed") && msg.contains("data of inode"),
        "umount's message: {msg}"
    );
    std::fs::remove_file(host.join("filler")).unwrap();
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    with_kernel(&img, &work, |k| {
        assert_eq!(std::fs::read(k.join("keep")).unwrap(), b"keep\n");
        check_file(&k.join("dir/f"), 3, 3000);
        // The failed data is not there, and no stale block shows instead.
        let big = std::fs::read(k.join("big")).unwrap();
        assert!(big.iter().all(|&b| b == 0), "unwritten data reads as zeros");
    });
    ok(&run(Command::new("umount").arg(&host)), "umount tmpfs");
    let _ = std::fs::remove_dir_all(&work);
}
