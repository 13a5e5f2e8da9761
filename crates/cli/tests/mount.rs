//! `ext4kit mount` through the kernel's FUSE driver: the whole fixture tree
//! read back through a real mount (names, types, modes, owners, sizes,
//! contents, symlinks, devices, hard links, xattrs, times), concurrent
//! readers, the lifecycle (detach, umount, signals, kill -9 of a server
//! with writers, unmount while a writer is busy), read-write by default and
//! the read-only fallbacks (read-only features, mmp; needs_recovery replays),
//! refusal of an image already in use, a second mount of a served image
//! as a bind mount of the first (and of another partition of it refused),
//! and an unprivileged mount through fusermount3. (Each write request is tested in crates/fuse/tests/rw.rs.)
//!
//! These tests need /dev/fuse and fusermount3 (.ci/run installs fuse3) and
//! root (CI runs as root); without them they fail and say why, rather than
//! pass without testing anything.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ext4kit_testkit::{build_source_tree, compare_trees, e2fsck_clean, image_matrix, make_image, LoopMount, TreeOpts};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

fn require_fuse() {
    ext4kit_testkit::require_root_and_fuse("they mount, loop-mount and switch to user nobody");
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-mount-{tag}-{}", std::process::id()));
    let _ = Command::new("umount").arg("-l").arg(w.join("mnt")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(w.join("mnt")).unwrap();
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
    w
}

fn ext4kit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(BIN);
    for a in args {
        c.arg(a);
    }
    c.stdin(Stdio::null()).output().unwrap()
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

/// The mount table's type for `dir`, if mounted.
fn mounted_type(dir: &Path) -> Option<String> {
    let t = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    t.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (Path::new(left.split(' ').nth(4)?) == dir).then(|| right.split(' ').next().unwrap_or("").to_string())
    })
}

/// Pids of `ext4kit mount` processes serving `image` (given by the same
/// absolute path the tests pass on the command line).
fn servers_of(image: &Path) -> Vec<u32> {
    let needle = image.to_string_lossy().into_owned();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "mount") && args.contains(&needle) {
            v.push(pid);
        }
    }
    v
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// sha256 of every regular file's bytes in sorted path order (as a shell
/// pipeline, so the reads come from separate processes).
fn content_digest(dir: &Path) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 cat | sha256sum")
        .arg("sh")
        .arg(dir)
        .output()
        .unwrap();
    ok(&o, "find | cat | sha256sum");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `kill -TERM` the server.
fn sigterm(child: &Child) {
    let o = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .output()
        .unwrap();
    ok(&o, "kill -TERM");
}

fn spawn_foreground(img: &Path, mnt: &Path) -> Child {
    spawn_foreground_with(img, mnt, &[])
}

/// A foreground server with extra `ext4kit mount` arguments.
fn spawn_foreground_with(img: &Path, mnt: &Path, extra: &[&str]) -> Child {
    let child = Command::new(BIN)
        .args(["mount", "--foreground", "--threads", "2"])
        .args(extra)
        .arg(img)
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the foreground mount", Duration::from_secs(20), || {
        mounted_type(mnt).is_some()
    });
    child
}

fn exit_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(t.elapsed() < limit, "the server did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn small_image(work: &Path, spec_name: &str) -> (PathBuf, PathBuf, ext4kit_testkit::ImageSpec) {
    let src = work.join("src");
    build_source_tree(&src, &TreeOpts::small()).unwrap();
    let spec = image_matrix().into_iter().find(|s| s.name == spec_name).unwrap();
    let img = work.join(format!("{spec_name}.img"));
    make_image(&spec, &src, &img).unwrap();
    (src, img, spec)
}

#[test]
fn the_whole_tree_reads_back_through_the_mount_with_concurrent_readers() {
    require_fuse();
    for name in ["ext4-default", "ext2-1k"] {
        let work = workdir(name);
        let (src, img, spec) = small_image(&work, name);
        let mnt = work.join("mnt");
        // ext4 read-write (the default), ext2 read-only (-o ro).
        let ro = name == "ext2-1k";
        let o = if ro {
            ext4kit(&[&"mount", &"-o", &"ro", &img, &mnt])
        } else {
            ext4kit(&[&"mount", &img, &mnt])
        };
        ok(&o, "ext4kit mount");
        // Detached: the command returned and the mount already works.
        assert_eq!(mounted_type(&mnt).as_deref(), Some("fuse.ext4kit"), "{name}");
        let servers = servers_of(&img);
        assert_eq!(servers.len(), 1, "{name}: one server process: {servers:?}");

        let opts = spec.compare_opts();
        let diffs = compare_trees(&src, &mnt, &opts).unwrap();
        assert!(
            diffs.is_empty(),
            "{name}: the mount differs from the source:\n{diffs:#?}"
        );

        // Several threads comparing the whole tree while several processes
        // cat every file: every reader sees exactly the source.
        let want = content_digest(&src);
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| s.spawn(|| compare_trees(&src, &mnt, &opts).unwrap()))
                .collect();
            let procs: Vec<_> = (0..3).map(|_| s.spawn(|| content_digest(&mnt))).collect();
            for t in threads {
                let d = t.join().unwrap();
                assert!(d.is_empty(), "{name}: a concurrent reader saw differences: {d:#?}");
            }
            for p in procs {
                assert_eq!(p.join().unwrap(), want, "{name}: a concurrent cat saw other bytes");
            }
        });

        // statfs through the mount is the image's.
        let df = Command::new("stat")
            .args(["-f", "-c", "%S %b %c"])
            .arg(&mnt)
            .output()
            .unwrap();
        ok(&df, "stat -f");
        let info = ext4kit(&[&"info", &img]);
        let bs = String::from_utf8_lossy(&df.stdout)
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        assert_eq!(bs.trim(), spec.block_size.to_string(), "{name}: statfs block size");
        assert!(String::from_utf8_lossy(&info.stdout).contains(&bs), "{name}");

        if ro {
            // Writes are refused: the mount is read-only.
            let e = std::fs::write(mnt.join("new-file"), b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{name}: {e}");
        } else {
            std::fs::write(mnt.join("new-file"), b"x").unwrap();
            assert_eq!(std::fs::read(mnt.join("new-file")).unwrap(), b"x");
        }

        let o = ext4kit(&[&"umount", &mnt]);
        ok(&o, "ext4kit umount");
        assert_eq!(mounted_type(&mnt), None, "{name}: still mounted after umount");
        wait_until("the server to exit", Duration::from_secs(10), || {
            servers_of(&img).is_empty()
        });
        e2fsck_clean(&img).unwrap();
        let _ = std::fs::remove_dir_all(&work);
    }
}

fn libc_erofs() -> i32 {
    30
}

#[test]
fn umount_and_signals_end_a_foreground_server_with_status_0() {
    require_fuse();
    let work = workdir("signals");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let mnt = work.join("mnt");
    for how in ["umount", "TERM", "INT"] {
        let mut child = spawn_foreground(&img, &mnt);
        assert!(
            std::fs::read_dir(&mnt).unwrap().count() > 3,
            "{how}: the mount lists the tree"
        );
        match how {
            "umount" => ok(&ext4kit(&[&"umount", &mnt]), "ext4kit umount"),
            sig => {
                let o = Command::new("kill")
                    .arg(format!("-{sig}"))
                    .arg(child.id().to_string())
                    .output()
                    .unwrap();
                ok(&o, "kill");
            }
        }
        let st = exit_within(&mut child, Duration::from_secs(20));
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(st.success(), "{how}: the server exited with {st}: {err}");
        assert_eq!(mounted_type(&mnt), None, "{how}: still mounted");
    }
    e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn kill_9_of_a_server_with_writers_leaves_an_image_that_opens_and_e2fsck_repairs() {
    require_fuse();
    let work = workdir("kill9");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let mnt = work.join("mnt");
    let mut child = spawn_foreground(&img, &mnt);
    // Durable before the crash: written and fsynced.
    let keep: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("kept")).unwrap();
        f.write_all(&keep).unwrap();
        f.sync_all().unwrap();
    }
    // Traffic in flight when the server dies: readers and writers.
    let busy = Command::new("sh")
        .arg("-c")
        .arg(
            "cd \"$1\" && i=0; while :; do i=$((i+1)); mkdir -p w/$((i % 7)) && head -c $((i * 997 % 200000)) \
             /dev/urandom > w/$((i % 7))/f$i 2>/dev/null || exit 0; rm -f w/$(((i+3) % 7))/f$((i-5)); \
             find . -type f -exec cat {} + >/dev/null 2>&1; done",
        )
        .arg("sh")
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    // The dead mount answers ENOTCONN until it is detached.
    let _ = Command::new("umount").arg("-l").arg(&mnt).output().unwrap();
    let mut busy = busy;
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(mounted_type(&mnt), None);
    // The image opens (read-only: nothing is changed before e2fsck).
    let fs = ext4kit::Fs::open_image(
        &img,
        &ext4kit::OpenOptions {
            read_only: true,
            cache_budget: 16 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        fs.read_dir(b"/").unwrap().iter().filter(|e| e.name == b"kept").count(),
        1
    );
    drop(fs);
    // The superblock says the journal needs recovery (the fsync was
    // committed to it), so e2fsck replays it (exit 0 or 1); the state
    // stays "clean", as the kernel's journaled mounts leave it.
    let o = Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("needs_recovery"),
        "a crashed read-write mount of a journaled image leaves its journal to replay"
    );
    let o = Command::new("e2fsck").arg("-fy").arg(&img).output().unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "e2fsck -fy could not repair the image ({}):\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
    );
    e2fsck_clean(&img).unwrap();
    // The lock died with the process: the image mounts again; fsynced data survived.
    ok(&ext4kit(&[&"mount", &img, &mnt]), "mount after kill -9");
    let back = std::fs::read(mnt.join("kept"));
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    assert!(back.unwrap() == keep, "the fsynced file survived the crash");
    e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn unmount_while_a_writer_is_busy_waits_for_it_and_loses_nothing() {
    require_fuse();
    let work = workdir("busy");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let mnt = work.join("mnt");
    let mut child = spawn_foreground(&img, &mnt);
    // A writer holding the file open for a few seconds.
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg("exec 3>\"$1/busy\" && for i in $(seq 1 60); do head -c 65536 /dev/zero >&3 || exit 1; sleep 0.05; done")
        .arg("sh")
        .arg(&mnt)
        .spawn()
        .unwrap();
    wait_until("the writer to start", Duration::from_secs(10), || {
        mnt.join("busy").exists()
    });
    // A plain unmount is refused while the file is open...
    let o = ext4kit(&[&"umount", &mnt]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // ...SIGTERM detaches the mount (lazy unmount) and the server keeps
    // serving the writer until it closes, then flushes and exits 0.
    sigterm(&child);
    wait_until("the mount to be detached", Duration::from_secs(10), || {
        mounted_type(&mnt).is_none()
    });
    assert!(
        writer.wait().unwrap().success(),
        "the writer kept writing after the detach"
    );
    let st = exit_within(&mut child, Duration::from_secs(30));
    assert!(st.success(), "the server exited with {st}");
    e2fsck_clean(&img).unwrap();
    let lm = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let len = std::fs::metadata(mnt.join("busy")).map(|m| m.len());
    let zeros = std::fs::read(mnt.join("busy")).map(|d| d.iter().all(|&b| b == 0));
    lm.unmount().unwrap();
    assert_eq!(len.unwrap(), 60 * 65536, "every write reached the image");
    assert!(zeros.unwrap());
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn an_image_in_use_is_refused_with_a_clear_message() {
    require_fuse();
    let work = workdir("twice");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let (mnt, mnt2) = (work.join("mnt"), work.join("mnt2"));
    std::fs::create_dir_all(&mnt2).unwrap();

    // (A second ext4kit mount of it is a bind mount: see
    // a_second_mount_is_a_bind_mount_of_the_first.)
    // Mounted by the kernel through a loop device: refused.
    let lm = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let o = ext4kit(&[&"mount", &img, &mnt2]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "mount of a loop-mounted image: {err}");
    assert!(err.contains("already mounted") && err.contains("/dev/loop"), "{err}");
    lm.unmount().unwrap();

    // An unknown option is named.
    let o = ext4kit(&[&"mount", &"-o", &"bogus", &img, &mnt2]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("`bogus`"));
    let _ = std::fs::remove_dir_all(&work);
}

/// Mount `img` without options and with `-o rw`: the first mounts
/// read-only with a warning naming `why`, the second is refused with it.
fn read_only_fallback(img: &Path, mnt: &Path, why: &str) {
    let o = ext4kit(&[&"mount", &img, &mnt]);
    ok(&o, "mount");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("mounting read-only") && err.contains(why), "{why}: {err}");
    let e = std::fs::write(mnt.join("new-file"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{why}: {e}");
    assert!(std::fs::read_dir(mnt).unwrap().count() > 3, "{why}: the tree reads");
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    let o = ext4kit(&[&"mount", &"-o", &"rw", &img, &mnt]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{why}: -o rw must be refused: {err}");
    assert!(
        err.contains("cannot mount read-write") && err.contains(why),
        "{why}: {err}"
    );
    assert_eq!(mounted_type(mnt), None);
}

#[test]
fn images_that_must_not_be_written_mount_read_only_and_refuse_rw() {
    require_fuse();
    let work = workdir("rofeat");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let mnt = work.join("mnt");
    let run = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).arg(&img).output().unwrap();
        ok(&o, &args.join(" "));
    };
    // The read-only feature (an unsupported RO_COMPAT bit for writing).
    run(&["tune2fs", "-O", "read-only"]);
    read_only_fallback(&img, &mnt, "read-only");
    run(&["tune2fs", "-O", "^read-only"]);
    // needs_recovery is no reason: a read-write mount replays the journal
    // (here an empty log) and clears the flag, as the kernel's does.
    run(&["debugfs", "-w", "-R", "feature needs_recovery"]);
    ok(
        &ext4kit(&[&"mount", &"-o", &"rw", &img, &mnt]),
        "mount -o rw of needs_recovery",
    );
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    let out = Command::new("dumpe2fs").arg("-h").arg(&img).output().unwrap();
    let feats = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !feats.contains("needs_recovery"),
        "a read-write mount left needs_recovery set:\n{feats}"
    );
    // mmp: multi-mount protection, not implemented for writing.
    run(&["tune2fs", "-O", "mmp"]);
    read_only_fallback(&img, &mnt, "mmp");
    run(&["tune2fs", "-O", "^mmp"]);
    // And without them the image mounts read-write again.
    ok(&ext4kit(&[&"mount", &"-o", &"rw", &img, &mnt]), "mount -o rw");
    std::fs::write(mnt.join("new-file"), b"x").unwrap();
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn a_held_image_lock_refuses_a_second_server() {
    require_fuse();
    let work = workdir("lock");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let f = std::fs::File::open(&img).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    // Held throughout: the mount waits for it (saying so), then refuses.
    let t = Instant::now();
    let o = ext4kit(&[&"mount", &img, &work.join("mnt")]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("waiting") && err.contains("in use"), "{err}");
    assert!(t.elapsed() >= Duration::from_secs(5), "refused after {:?}", t.elapsed());
    // Let go while a mount waits: it mounts.
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        drop(f);
    });
    ok(&ext4kit(&[&"mount", &img, &mnt]), "mount once the lock is let go");
    releaser.join().unwrap();
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    let _ = std::fs::remove_dir_all(&work);
}

/// umount(2) of a FUSE mount returns before the server has written back
/// and let go of the image; a mount of the same image right after (or while
/// umount(8) still runs, as xfstests generic/604 does) waits for it instead
/// of being refused, and sees everything the first mount wrote.
#[test]
fn a_mount_right_after_an_unmount_waits_for_the_old_server() {
    require_fuse();
    let work = workdir("handover");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let mnt = work.join("mnt");
    for round in 0..3 {
        ok(&ext4kit(&[&"mount", &img, &mnt]), "mount");
        for i in 0..40 {
            std::fs::write(mnt.join(format!("r{round}-{i}")), vec![round as u8; 1024]).unwrap();
        }
        let mut um = Command::new("umount").arg(&mnt).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(10));
        ok(&ext4kit(&[&"mount", &img, &mnt]), "mount while the old one goes");
        assert!(um.wait().unwrap().success());
        for i in 0..40 {
            assert_eq!(
                std::fs::read(mnt.join(format!("r{round}-{i}"))).unwrap(),
                vec![round as u8; 1024]
            );
        }
        ok(&ext4kit(&[&"umount", &mnt]), "umount");
    }
    e2fsck_clean(&img).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn an_unprivileged_user_mounts_through_fusermount3() {
    require_fuse();
    assert!(
        Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success()),
        "fusermount3 is missing: apt-get install fuse3 (.ci/run does)"
    );
    // fusermount3 opens /dev/fuse with the caller's rights; fuse3's udev
    // rule makes it 0666. Machines without udev (this VM) leave it 0600.
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o777;
    if mode != 0o666 {
        eprintln!("/dev/fuse is {mode:o}; setting 0666 as fuse3's udev rule does");
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o20666)).unwrap();
    }
    let work = workdir("nobody");
    let (_src, img, _) = small_image(&work, "ext4-default");
    std::fs::set_permissions(&img, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = work.join("mnt");
    std::os::unix::fs::chown(&mnt, Some(65534), Some(65534)).unwrap();
    let as_nobody = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
        for a in args {
            c.arg(a);
        }
        c.stdin(Stdio::null()).output().unwrap()
    };
    ok(&as_nobody(&[&BIN, &"mount", &img, &mnt]), "mount as nobody");
    assert_eq!(mounted_type(&mnt).as_deref(), Some("fuse.ext4kit"));
    let o = as_nobody(&[&"cat", &mnt.join("sizes/59")]);
    ok(&o, "cat as nobody");
    assert_eq!(o.stdout, std::fs::read(work.join("src/sizes/59")).unwrap());
    // Without allow_other/allow_root, other users (root too) are kept out.
    let e = std::fs::read_dir(&mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(13), "{e}");
    ok(&as_nobody(&[&BIN, &"umount", &mnt]), "umount as nobody");
    assert_eq!(mounted_type(&mnt), None);
    let _ = std::fs::remove_dir_all(&work);
}

/// Every SEEK_DATA / SEEK_HOLE answer (walking each sparse file from 0,
/// alternating) as (offset asked, whence, result or errno).
fn seek_map(root: &Path, files: &[PathBuf]) -> Vec<(String, u64, &'static str, Result<u64, i32>)> {
    use rustix::fs::SeekFrom;
    let mut v = Vec::new();
    for rel in files {
        let f = std::fs::File::open(root.join(rel)).unwrap();
        let size = f.metadata().unwrap().len();
        let mut off = 0u64;
        let mut data = true;
        // Bounded walk: each step moves forward or ends with ENXIO.
        for _ in 0..64 {
            let (w, r) = if data {
                ("DATA", rustix::fs::seek(&f, SeekFrom::Data(off)))
            } else {
                ("HOLE", rustix::fs::seek(&f, SeekFrom::Hole(off)))
            };
            let r = r.map_err(|e| e.raw_os_error());
            v.push((rel.to_string_lossy().into_owned(), off, w, r));
            match r {
                Ok(p) if p < size => {
                    off = if p == off { p + 1 } else { p };
                    data = !data;
                }
                _ => break,
            }
        }
    }
    v
}

/// `stat -f`: block size, blocks, free blocks, inodes, free inodes.
fn statfs_line(dir: &Path) -> String {
    let o = Command::new("stat")
        .args(["-f", "-c", "%S %b %f %c %d"])
        .arg(dir)
        .output()
        .unwrap();
    ok(&o, "stat -f");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn seek_data_seek_hole_and_statfs_answer_like_the_kernel() {
    require_fuse();
    let work = workdir("seek");
    let src = work.join("src");
    let manifest = build_source_tree(&src, &TreeOpts::small()).unwrap();
    assert!(!manifest.sparse_files.is_empty(), "the fixture has sparse files");
    let spec = image_matrix().into_iter().find(|s| s.name == "ext4-default").unwrap();
    let img = work.join("seek.img");
    make_image(&spec, &src, &img).unwrap();
    let mnt = work.join("mnt");
    let lm = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let want = seek_map(&mnt, &manifest.sparse_files);
    let want_statfs = statfs_line(&mnt);
    lm.unmount().unwrap();
    ok(&ext4kit(&[&"mount", &img, &mnt]), "mount");
    let got = seek_map(&mnt, &manifest.sparse_files);
    let got_statfs = statfs_line(&mnt);
    ok(&ext4kit(&[&"umount", &mnt]), "umount");
    // statfs: block size, data blocks (overhead excluded), free blocks,
    // inodes and free inodes exactly as the kernel counts them. (f_bavail
    // differs by design: the kernel holds back a runtime reserve.)
    assert_eq!(got_statfs, want_statfs, "statfs through ext4kit vs the kernel");
    assert!(
        want.len() > manifest.sparse_files.len(),
        "the walk visited data and holes: {want:?}"
    );
    assert_eq!(got, want, "SEEK_DATA/SEEK_HOLE through ext4kit vs the kernel");
    let _ = std::fs::remove_dir_all(&work);
}

/// The mount table's (device number, source) of the mount at `dir`.
fn mount_dev_source(dir: &Path) -> Option<(String, String)> {
    let t = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    t.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        (Path::new(f.get(4)?) == dir).then(|| (f[2].to_string(), right.split(' ').nth(1).unwrap_or("").to_string()))
    })
}

/// Whether a server holds the image lock.
fn image_locked(img: &Path) -> bool {
    let f = std::fs::File::open(img).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// xfstests generic/732: one image mounted at two places, renames in one
/// read in the other. The second mount (and a third, read-only) is a bind
/// mount of the first: one server, one device number; unmounting the
/// first returns at once and leaves the others working; the last unmount
/// stops the server and leaves the image clean.
#[test]
fn a_second_mount_is_a_bind_mount_of_the_first() {
    require_fuse();
    let work = ext4kit_testkit::Scratch::dir("ext4kit-mount-bind");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let (m1, m2, m3) = (work.join("m1"), work.join("m2"), work.join("m3"));
    for m in [&m1, &m2, &m3] {
        std::fs::create_dir_all(m).unwrap();
    }
    ok(&ext4kit(&[&"mount", &img, &m1]), "mount m1");
    // A live mount of the same image: bound at once, not waited for (the
    // handover after an unmount waits up to 2 s, then refuses).
    let t = Instant::now();
    let o = ext4kit(&[&"mount", &"-v", &img, &m2]);
    ok(&o, "mount m2");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "the second mount took {:?}",
        t.elapsed()
    );
    assert!(stderr_of(&o).contains("bind mount of"), "{}", stderr_of(&o));
    let (d1, s1) = mount_dev_source(&m1).unwrap();
    let (d2, s2) = mount_dev_source(&m2).unwrap();
    assert_eq!(
        (d2, s2.as_str()),
        (d1, s1.as_str()),
        "m2 is the same FUSE connection as m1"
    );
    assert_eq!(s1, img.to_string_lossy(), "the whole image's source is its path");
    assert_eq!(servers_of(&img).len(), 1, "one server: {:?}", servers_of(&img));
    // Mounting the same place again is refused, as mount(8) does.
    let o = ext4kit(&[&"mount", &img, &m2]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr_of(&o));
    assert!(stderr_of(&o).contains("already mounted at"), "{}", stderr_of(&o));

    // The generic/732 sequence.
    std::fs::create_dir(m1.join("A")).unwrap();
    std::fs::create_dir(m1.join("B")).unwrap();
    std::fs::write(m1.join("A/f"), b"seven\n").unwrap();
    std::fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
    assert_eq!(std::fs::read(m2.join("B/f")).unwrap(), b"seven\n");
    std::fs::rename(m2.join("B/f"), m2.join("A/f")).unwrap();
    assert_eq!(std::fs::read(m1.join("A/f")).unwrap(), b"seven\n");
    assert!(!m1.join("B/f").exists());
    std::fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
    assert!(m2.join("B/f").exists() && !m2.join("A/f").exists());

    // A read-only bind of the read-write server; a server option asked
    // differently is named in a note and left as the server has it.
    let o = ext4kit(&[&"mount", &"-o", &"ro,cache=direct", &img, &m3]);
    ok(&o, "mount -o ro m3");
    assert!(
        stderr_of(&o).contains("note") && stderr_of(&o).contains("cache=direct (it has cache=writethrough)"),
        "{}",
        stderr_of(&o)
    );
    let e = std::fs::write(m3.join("no"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{e}");
    std::fs::write(m2.join("late"), b"from m2").unwrap();
    assert_eq!(std::fs::read(m3.join("late")).unwrap(), b"from m2");
    assert_eq!(servers_of(&img).len(), 1);

    // Unmounting the first returns at once (the server keeps serving the
    // others: it is not waited for) and the others go on working.
    let t = Instant::now();
    ok(&ext4kit(&[&"umount", &m1]), "umount m1");
    assert!(t.elapsed() < Duration::from_secs(2), "umount m1 took {:?}", t.elapsed());
    assert_eq!(mounted_type(&m1), None);
    assert_eq!(servers_of(&img).len(), 1, "the server still serves m2 and m3");
    std::fs::write(m2.join("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(m3.join("after")).unwrap(), b"still here");
    assert_eq!(std::fs::read(m2.join("B/f")).unwrap(), b"seven\n");
    ok(&ext4kit(&[&"umount", &m3]), "umount m3");
    assert_eq!(servers_of(&img).len(), 1);
    // The last one: the server flushes, lets go and exits before umount
    // returns.
    ok(&ext4kit(&[&"umount", &m2]), "umount m2");
    assert!(servers_of(&img).is_empty(), "the server exited: {:?}", servers_of(&img));
    e2fsck_clean(&img).unwrap();
    // Everything written through any of them is in the image.
    ok(&ext4kit(&[&"mount", &"-o", &"ro", &img, &m1]), "mount again");
    let after = std::fs::read(m1.join("after"));
    let f = std::fs::read(m1.join("B/f"));
    ok(&ext4kit(&[&"umount", &m1]), "umount");
    assert_eq!(after.unwrap(), b"still here");
    assert_eq!(f.unwrap(), b"seven\n");
}

/// A read-only server: a second mount without options is bound read-only
/// with a warning; `-o rw` is refused. A stop signal to the server
/// unmounts every mount point it serves.
#[test]
fn a_read_only_server_refuses_a_read_write_bind_and_a_signal_stops_all() {
    require_fuse();
    let work = ext4kit_testkit::Scratch::dir("ext4kit-mount-robind");
    let (_src, img, _) = small_image(&work, "ext4-default");
    let (m1, m2) = (work.join("m1"), work.join("m2"));
    std::fs::create_dir_all(&m1).unwrap();
    std::fs::create_dir_all(&m2).unwrap();
    let mut child = spawn_foreground_with(&img, &m1, &["-o", "ro"]);
    let o = ext4kit(&[&"mount", &"-o", &"rw", &img, &m2]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("cannot mount read-write") && stderr_of(&o).contains("read-only at"),
        "{}",
        stderr_of(&o)
    );
    assert_eq!(mounted_type(&m2), None);
    let o = ext4kit(&[&"mount", &img, &m2]);
    ok(&o, "mount m2");
    assert!(stderr_of(&o).contains("mounting read-only"), "{}", stderr_of(&o));
    let e = std::fs::write(m2.join("no"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{e}");
    assert!(m2.join("sizes").is_dir(), "the tree reads through the bind");
    // SIGTERM: both mount points go, the server exits 0.
    sigterm(&child);
    let st = exit_within(&mut child, Duration::from_secs(30));
    assert!(st.success(), "the server exited with {st}");
    assert_eq!(mounted_type(&m1), None);
    assert_eq!(mounted_type(&m2), None, "the bind mount went with the server");
}

/// Two filesystems of one disk file: the mount table names the partition
/// (`disk.img@1`), a second mount of the same partition (however it is
/// named) is bound, and one of the other partition (or of an offset, even
/// where the partition starts) is refused, naming the first: the image
/// lock covers the whole file, one server per file.
#[test]
fn another_partition_of_a_served_disk_is_refused_not_bound() {
    require_fuse();
    let work = ext4kit_testkit::Scratch::dir("ext4kit-mount-bindpart");
    let disk = work.join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(80 << 20).unwrap();
    let p1 = 1u64 << 20;
    let p2 = 34_603_008u64; // sector 67584: sgdisk's start of partition 2 below
    for off in [p1, p2] {
        let o = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-E"])
            .arg(format!("offset={off}"))
            .arg(&disk)
            .arg("32M")
            .output()
            .unwrap();
        ok(&o, "mke2fs -E offset=");
    }
    let o = Command::new("sgdisk")
        .args(["-n1:2048:+32M", "-n2:0:+32M"])
        .arg(&disk)
        .output()
        .expect("sgdisk (apt-get install gdisk)");
    ok(&o, "sgdisk");
    let (m1, m2, m3) = (work.join("m1"), work.join("m2"), work.join("m3"));
    for m in [&m1, &m2, &m3] {
        std::fs::create_dir_all(m).unwrap();
    }
    let at1 = format!("{}@1", disk.display());
    ok(&ext4kit(&[&"mount", &at1, &m1]), "mount disk@1");
    let (d1, s1) = mount_dev_source(&m1).unwrap();
    assert_eq!(s1, at1, "the source names the partition");
    ok(
        &ext4kit(&[&"mount", &"--partition", &"1", &disk, &m2]),
        "mount --partition 1",
    );
    assert_eq!(
        mount_dev_source(&m2).unwrap().0,
        d1,
        "partition 1 again is a bind of m1"
    );
    std::fs::write(m1.join("one"), b"p1").unwrap();
    assert_eq!(std::fs::read(m2.join("one")).unwrap(), b"p1");
    for (what, args) in [
        ("partition 2", vec![format!("{}@2", disk.display())]),
        (
            "an offset",
            vec![
                "--offset".to_string(),
                p1.to_string(),
                disk.to_string_lossy().into_owned(),
            ],
        ),
    ] {
        let mut c = Command::new(BIN);
        c.arg("mount").args(&args).arg(&m3).stdin(Stdio::null());
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr_of(&o));
        let err = stderr_of(&o);
        assert!(
            err.contains("already mounted") && err.contains(&*m1.to_string_lossy()) && err.contains("partition 1"),
            "{what}: {err}"
        );
        assert_eq!(mounted_type(&m3), None, "{what}");
    }
    assert!(image_locked(&disk), "the server of partition 1 holds the disk");
    ok(&ext4kit(&[&"umount", &m2]), "umount m2");
    assert!(image_locked(&disk), "m1 is still served");
    ok(&ext4kit(&[&"umount", &m1]), "umount m1");
    assert!(
        !image_locked(&disk),
        "the server let go of the disk before umount returned"
    );
    // Now partition 2 mounts (served on its own).
    ok(
        &ext4kit(&[&"mount", &format!("{}@2", disk.display()), &m3]),
        "mount disk@2",
    );
    assert!(!m3.join("one").exists(), "partition 2 is another filesystem");
    ok(&ext4kit(&[&"umount", &m3]), "umount m3");
}

/// A `/proc/PID/status` or `smaps_rollup` field, KiB.
fn proc_kib(pid: u32, file: &str, field: &str) -> u64 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    t.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/{file}"))
}

/// The server's memory is its cache budget plus a small fixed overhead: its
/// read buffers are `max_write` long (16 MiB each were 22 of an idle
/// server's 28 MiB), and the heap gets no transparent huge pages (one
/// resident 2 MiB page for every 2 MiB of address space touched at all).
/// Measured when written: 13 MiB idle (28 with 16 MiB read buffers), a 50
/// MiB peak, no huge page added.
#[test]
fn a_server_uses_its_cache_budget_plus_a_small_fixed_overhead() {
    require_fuse();
    let work = workdir("rss");
    let img = work.join("img");
    let o = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .arg(&img)
        .arg("512M")
        .output()
        .unwrap();
    ok(&o, "mke2fs");
    let mnt = work.join("mnt");
    let mut child = spawn_foreground_with(&img, &mnt, &["--cache-mib", "16"]);
    let pid = child.id();
    let idle = proc_kib(pid, "status", "VmRSS");
    let huge_idle = proc_kib(pid, "smaps_rollup", "AnonHugePages");
    // 200 MiB written and read back, 20,000 files created: far more than
    // the budget of pages, buffers, inodes and dentries.
    let chunk = vec![0x5a_u8; 1 << 20];
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("big")).unwrap();
        for _ in 0..200 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let mut back = Vec::new();
    std::fs::File::open(mnt.join("big"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(
        back.len() == 200 << 20 && back.iter().all(|&b| b == 0x5a),
        "the file reads back"
    );
    drop(back);
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..20_000 {
        std::fs::File::create(mnt.join(format!("d/f{i}"))).unwrap();
    }
    let peak = proc_kib(pid, "status", "VmHWM");
    let huge = proc_kib(pid, "smaps_rollup", "AnonHugePages");
    ok(&ext4kit(&[&"umount", &mnt]), "ext4kit umount");
    assert!(exit_within(&mut child, Duration::from_secs(60)).success());
    e2fsck_clean(&img).unwrap();
    eprintln!("server RSS: {idle} KiB idle, peak {peak} KiB; huge pages {huge_idle} -> {huge} KiB");
    assert!(idle < 20 << 10, "an idle server is {idle} KiB resident");
    assert!(
        huge <= huge_idle + 2048,
        "the heap took transparent huge pages: {huge_idle} KiB idle, {huge} KiB after"
    );
    assert!(
        peak < (16 + 48) << 10,
        "a server with a 16 MiB budget peaked at {peak} KiB"
    );
    let _ = std::fs::remove_dir_all(&work);
}
