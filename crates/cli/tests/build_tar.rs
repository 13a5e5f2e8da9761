//! Building images without root from tar archives and host trees:
//! `ext4kit mkfs -d` run as an unprivileged user (uid 65534) on archives
//! GNU tar wrote (pax with xattrs and nanosecond times and sparse 1.0;
//! GNU format with old-style sparse members, gzip-compressed) gives an
//! image whose kernel mount is exactly the tree tar was made from —
//! owners, modes, xattrs (capabilities and SELinux labels too), times,
//! hard links, devices, holes — and e2fsck finds clean. `--all-root` and
//! `--uid-map` give root's files from a tree the builder owns. A hostile
//! or broken archive is refused with the member named and leaves no image.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, read_xattrs, CompareOpts, LoopMount, TimeFidelity};

mod building;
use building::{ext4kit_as_nobody, need_root_and_kernel, ok_as_nobody, run, s, NOBODY};

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildtar", tag)
}

fn set_owner(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(p, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", p.display()));
}

/// A `security.capability` value (VFS_CAP_REVISION_2, effective): the
/// permitted set holds CAP_NET_RAW (13), as `setcap cap_net_raw+ep` writes.
fn cap_net_raw() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    v.extend_from_slice(&(1u32 << 13).to_le_bytes()); // permitted, low word
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, low word
    v.extend_from_slice(&0u32.to_le_bytes()); // permitted, high word
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, high word
    v
}

const LABEL: &[u8] = b"system_u:object_r:bin_t:s0\0";

/// The tree the archives are made of: owners 0, 1000 and 4242; setuid and
/// setgid; a file capability; an SELinux label; a user xattr; a hard
/// link; a symlink; a character device; a fifo; a 3 GiB sparse file.
fn make_tree(src: &Path) {
    let mk = |p: &str| {
        let d = src.join(p);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    for d in ["bin", "etc", "home/user", "srv/data", "dev", "run", "big"] {
        mk(d);
    }
    std::fs::write(src.join("etc/passwd"), b"root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(src.join("bin/su"), vec![0x7f; 20_000]).unwrap();
    std::fs::set_permissions(src.join("bin/su"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(src.join("bin/ping"), b"ping binary").unwrap();
    set_xattr(&src.join("bin/ping"), "security.capability", &cap_net_raw());
    set_xattr(&src.join("bin/ping"), "security.selinux", LABEL);
    set_xattr(&src.join("etc/passwd"), "user.origin", b"build 7");
    std::os::unix::fs::symlink("su", src.join("bin/sh")).unwrap();
    std::fs::hard_link(src.join("bin/su"), src.join("bin/su-again")).unwrap();
    std::fs::write(src.join("home/user/notes"), b"mine").unwrap();
    std::fs::write(src.join("srv/data/blob"), vec![42u8; 100_000]).unwrap();
    std::fs::set_permissions(src.join("srv"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    run(Command::new("mknod").args([s(&src.join("dev/null")), "c", "1", "3"]));
    run(Command::new("mkfifo").arg(src.join("run/fifo")));
    // 3 GiB with data at its start, at 1 GiB and in its last block.
    let f = std::fs::File::create(src.join("big/sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(&[9u8; 8192], 1 << 30).unwrap();
    f.write_all_at(b"end", (3u64 << 30) - 3).unwrap();
    drop(f);
    for p in ["home/user", "home/user/notes"] {
        set_owner(&src.join(p), 1000, 1000);
    }
    for p in ["srv", "srv/data", "srv/data/blob"] {
        set_owner(&src.join(p), 4242, 4242);
    }
    // Times with nanoseconds, directories last.
    let mut n = 0;
    let walk = walk(src);
    for p in walk.iter().rev() {
        n += 1;
        let t = rustix::fs::Timespec {
            tv_sec: 1_600_000_000 + n * 1000,
            tv_nsec: 123_456_789,
        };
        let ts = rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        };
        rustix::fs::utimensat(rustix::fs::CWD, p, &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }
}

/// Every path below `root` (itself included), parents before children.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            let mut kids: Vec<PathBuf> = std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()).collect();
            kids.sort();
            out.extend(kids);
        }
        i += 1;
    }
    out
}

/// Build IMAGE from SOURCE as uid 65534, check it with e2fsck, mount it
/// with the kernel and compare it with `reference`.
fn build_and_compare(work: &Path, source: &Path, reference: &Path, opts: &CompareOpts, extra: &[&str]) {
    let img = work.join("out.img");
    let mut args = vec!["mkfs", "-q", "-d", s(source)];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[s(&img), "4G"]);
    ok_as_nobody(&args);
    assert_eq!(
        std::fs::metadata(&img).unwrap().uid(),
        NOBODY,
        "the builder made the image"
    );
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let diffs = compare_trees(reference, m.path(), opts).unwrap();
    assert!(
        diffs.is_empty(),
        "{} differs from the kernel's view of the image:\n{diffs:#?}",
        source.display()
    );
    if opts.xattrs {
        // compare_trees (and read_xattrs) leave security.selinux out; the
        // archive carried it.
        let ping = m.path().join("bin/ping");
        let mut label = vec![0u8; 256];
        let n = rustix::fs::lgetxattr(&ping, "security.selinux", &mut label).expect("the image keeps the label");
        assert_eq!(&label[..n], LABEL);
        let x = read_xattrs(&ping).unwrap();
        assert_eq!(x.get(&b"security.capability"[..]), Some(&cap_net_raw()));
    }
    // The holes stayed holes: 3 GiB in about 16 KiB of blocks.
    let big = std::fs::metadata(m.path().join("big/sparse")).unwrap();
    assert_eq!(big.len(), 3 << 30);
    assert!(
        big.blocks() * 512 < 1 << 20,
        "3 GiB sparse file took {} blocks",
        big.blocks()
    );
    m.unmount().unwrap();
    std::fs::remove_file(&img).unwrap();
}

#[test]
fn an_unprivileged_build_from_tar_is_the_archive_exactly() {
    need_root_and_kernel();
    let work = workdir("exact");
    let src = work.join("src");
    std::fs::create_dir(&src).unwrap();
    make_tree(&src);

    // pax: xattrs, nanosecond times, sparse 1.0.
    let pax = work.join("root.tar");
    run(Command::new("tar")
        .args([
            "--format=posix",
            "--xattrs",
            "--xattrs-include=*",
            "--sparse",
            "--numeric-owner",
        ])
        .args(["-cf", s(&pax), "-C", s(&src), "."]));
    let exact = CompareOpts {
        ignore_lost_found: true,
        times: TimeFidelity::Nanoseconds,
        ..CompareOpts::default()
    };
    build_and_compare(&work, &pax, &src, &exact, &[]);

    // GNU format, old-style sparse members, gzip: whole seconds, and GNU
    // tar keeps no xattrs in this format.
    let gnu = work.join("root.tar.gz");
    run(Command::new("tar").args([
        "--format=gnu",
        "--sparse",
        "--numeric-owner",
        "-czf",
        s(&gnu),
        "-C",
        s(&src),
        ".",
    ]));
    let seconds = CompareOpts {
        ignore_lost_found: true,
        times: TimeFidelity::Seconds,
        xattrs: false,
        ..CompareOpts::default()
    };
    build_and_compare(&work, &gnu, &src, &seconds, &[]);
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn all_root_and_uid_map_give_root_files_from_the_builders_tree() {
    need_root_and_kernel();
    let work = workdir("owners");
    let src = work.join("src");
    std::fs::create_dir_all(src.join("etc/conf.d")).unwrap();
    std::fs::write(src.join("etc/conf.d/a"), b"a").unwrap();
    std::fs::write(src.join("etc/b"), b"b").unwrap();
    for p in walk(&src) {
        set_owner(&p, NOBODY, NOBODY);
    }
    for extra in [
        vec!["--all-root"],
        vec!["--uid-map", "0:65534:1", "--gid-map", "0:65534:1"],
    ] {
        let img = work.join("out.img");
        let mut args = vec!["mkfs", "-q", "-d", s(&src)];
        args.extend_from_slice(&extra);
        args.extend_from_slice(&[s(&img), "64M"]);
        ok_as_nobody(&args);
        ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
        let mnt = work.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
        for p in walk(m.path()) {
            if p.starts_with(m.path().join("lost+found")) {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!((md.uid(), md.gid()), (0, 0), "{} with {extra:?}", p.display());
        }
        m.unmount().unwrap();
        std::fs::remove_file(&img).unwrap();
    }
    // A uid the map does not cover is an error naming the entry.
    let o = ext4kit_as_nobody(&[
        "mkfs",
        "-q",
        "-d",
        s(&src),
        "--uid-map",
        "0:1000:1",
        s(&work.join("x.img")),
        "64M",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("uid 65534 is not covered"), "{err}");
    assert!(!work.join("x.img").exists(), "a failed build leaves no image");
    std::fs::remove_dir_all(&work).unwrap();
}

/// A ustar header for a hostile archive.
fn header(name: &str, typeflag: u8, size: usize, link: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[..name.len()].copy_from_slice(name.as_bytes());
    let oct = |f: &mut [u8], v: u64| {
        let s = format!("{:0w$o}\0", v, w = f.len() - 1);
        f.copy_from_slice(s.as_bytes());
    };
    oct(&mut b[100..108], 0o644);
    oct(&mut b[108..116], 0);
    oct(&mut b[116..124], 0);
    oct(&mut b[124..136], size as u64);
    oct(&mut b[136..148], 1_700_000_000);
    b[156] = typeflag;
    b[157..157 + link.len()].copy_from_slice(link.as_bytes());
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    b[148..156].copy_from_slice(b"        ");
    let sum: u64 = b.iter().map(|&x| u64::from(x)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

fn member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut v = header(name, b'0', data.len(), "");
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

#[test]
fn hostile_archives_are_refused_with_the_member_named_and_leave_no_image() {
    need_root_and_kernel();
    let work = workdir("hostile");
    let end = vec![0u8; 1024];
    let good = member("ok", b"fine");
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "dotdot",
            [good.clone(), member("../escape", b"x"), end.clone()].concat(),
            "../escape",
            "outside the tree",
        ),
        (
            "absolute",
            [member("/etc/shadow", b"x"), end.clone()].concat(),
            "/etc/shadow",
            "absolute path",
        ),
        (
            "hardlink",
            [good.clone(), header("link", b'1', 0, "missing"), end.clone()].concat(),
            "link",
            "did not give before it",
        ),
        (
            "truncated-data",
            [good.clone(), member("cut", &[1u8; 5000])[..2048].to_vec()].concat(),
            "cut",
            "truncated",
        ),
        ("no-end", good.clone(), "", "end-of-archive"),
        (
            "too-big",
            [member("huge", &vec![3u8; 24 << 20]), end.clone()].concat(),
            "huge",
            "the image is full",
        ),
    ];
    for (tag, bytes, name, why) in cases {
        let tar = work.join(format!("{tag}.tar"));
        std::fs::write(&tar, &bytes).unwrap();
        let img = work.join(format!("{tag}.img"));
        let o = ext4kit_as_nobody(&["mkfs", "-q", "-d", s(&tar), s(&img), "16M"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{tag}: the build succeeded");
        assert!(err.contains(why), "{tag}: expected \"{why}\" in:\n{err}");
        if !name.is_empty() {
            assert!(
                err.contains(&format!("\"{name}\"")) || err.contains(&format!(": {name}:")),
                "{tag}: the member is not named:\n{err}"
            );
        }
        assert!(!img.exists(), "{tag}: a failed build left its image");
    }
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn the_same_archive_and_options_give_the_same_bytes() {
    need_root_and_kernel();
    let work = workdir("repro");
    let src = work.join("src");
    std::fs::create_dir(&src).unwrap();
    make_tree(&src);
    let tar = work.join("root.tar.gz");
    run(Command::new("tar").args([
        "--format=posix",
        "--xattrs",
        "--xattrs-include=*",
        "--sparse",
        "-czf",
        s(&tar),
        "-C",
        s(&src),
        ".",
    ]));
    let build = |name: &str| {
        let img = work.join(name);
        ok_as_nobody(&[
            "mkfs",
            "-q",
            "-U",
            "01234567-89ab-cdef-0123-456789abcdef",
            "-d",
            s(&tar),
            "--all-root",
            s(&img),
            "4G",
        ]);
        img
    };
    let (a, b) = (build("a.img"), build("b.img"));
    assert_eq!(
        ext4kit_testkit::journal::first_difference(&a, &b).unwrap(),
        None,
        "two builds of one archive differ"
    );
    // The same edits on the same image give the same bytes too.
    for img in [&a, &b] {
        let at = |p: &str| format!("{}:{p}", s(img));
        ok_as_nobody(&["put", s(&tar), &at("/srv")]);
        ok_as_nobody(&["mv", s(img), "/etc/passwd", "/etc/passwd.old"]);
        ok_as_nobody(&["rm", "-r", s(img), "/home"]);
        ok_as_nobody(&["mkdir", s(img), "/new"]);
    }
    assert_eq!(
        ext4kit_testkit::journal::first_difference(&a, &b).unwrap(),
        None,
        "the same edits on two copies differ"
    );
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn put_takes_an_archive_into_an_existing_directory() {
    need_root_and_kernel();
    let work = workdir("put");
    let src = work.join("src");
    for (p, d) in [("a/b/c", &b"c"[..]), ("a/d", b"d"), ("e", b"e")] {
        let f = src.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, d).unwrap();
    }
    set_owner(&src.join("a/d"), 4242, 4242);
    let tar = work.join("t.tar.xz");
    run(Command::new("tar").args(["--format=posix", "-cJf", s(&tar), "-C", s(&src), "."]));
    let img = work.join("img");
    ok_as_nobody(&["mkfs", "-q", s(&img), "32M"]);
    ok_as_nobody(&["mkdir", s(&img), "/srv"]);
    ok_as_nobody(&["put", s(&tar), &format!("{}:/srv", s(&img))]);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let opts = CompareOpts {
        times: TimeFidelity::Nanoseconds,
        ..CompareOpts::default()
    };
    let diffs = compare_trees(&src, &m.path().join("srv"), &opts).unwrap();
    assert!(diffs.is_empty(), "{diffs:#?}");
    m.unmount().unwrap();
    // An archive needs an existing directory as DEST.
    let o = ext4kit_as_nobody(&["put", s(&tar), &format!("{}:/nothere", s(&img))]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not an existing directory"));
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn a_build_killed_half_way_leaves_image_as_it_was() {
    need_root_and_kernel();
    let work = workdir("killed");
    let src = work.join("src");
    for d in 0..20 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), vec![(d * 7 + f) as u8; 64 << 10]).unwrap();
        }
    }
    let tar = work.join("big.tar");
    run(Command::new("tar").args(["-cf", s(&tar), "-C", s(&src), "."]));
    let img = work.join("out.img");
    // Once with no image there, once over an old image: killed as soon as
    // its staged build has started writing, IMAGE is what it was before.
    for old in [None, Some(b"an old image".to_vec())] {
        let _ = std::fs::remove_file(&img);
        if let Some(o) = &old {
            std::fs::write(&img, o).unwrap();
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_ext4kit"))
            .args(["mkfs", "-q", "-d", s(&tar), s(&img), "512M"])
            .spawn()
            .unwrap();
        let staged = work.join(format!(".out.img.ext4kit-mkfs-{}", child.id()));
        let t = std::time::Instant::now();
        while std::fs::metadata(&staged).map_or(true, |m| m.blocks() < 2048) {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the build ended before it could be killed"
            );
            assert!(t.elapsed().as_secs() < 60, "the staged build never started writing");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        match &old {
            None => assert!(!img.exists(), "a killed build left an image"),
            Some(o) => assert_eq!(&std::fs::read(&img).unwrap(), o, "a killed build changed the old image"),
        }
        let _ = std::fs::remove_file(&staged);
    }
    // Not killed, the same build puts a complete image in place.
    ok_as_nobody(&["mkfs", "-q", "-d", s(&tar), s(&img), "512M"]);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    assert!(std::fs::read_dir(&work).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("ext4kit-mkfs")));
    std::fs::remove_dir_all(&work).unwrap();
}
