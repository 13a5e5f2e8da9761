//! Building and editing images from the command line: `mkfs -d` on every
//! filesystem type and several block sizes, read back by the kernel as
//! exactly the source tree; reproducible builds; and the edit commands
//! (put, mkdir, mv, ln, chmod, chown, touch, truncate, setfattr, rm),
//! checked by e2fsck and by the kernel.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ext4kit_testkit::{build_source_tree, compare_trees, CompareOpts, LoopMount, TreeOpts};

fn ext4kit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = ext4kit(args);
    assert!(
        o.status.success(),
        "ext4kit {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-build-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test reads images back with the kernel (loop mount): {e}; CI runs as root");
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn mkfs_d_builds_what_the_kernel_reads_as_the_source_tree() {
    need_kernel();
    let work = workdir("mkfs-d");
    let src = work.join("src");
    build_source_tree(
        &src,
        &TreeOpts {
            huge_sparse: true,
            ..TreeOpts::small()
        },
    )
    .unwrap();
    let mut failures = Vec::new();
    for (tag, args) in [
        ("ext4-4k", &["-t", "ext4"][..]),
        ("ext4-1k", &["-t", "ext4", "-b", "1024"][..]),
        ("ext3-2k", &["-t", "ext3", "-b", "2048"][..]),
        ("ext2-1k", &["-t", "ext2", "-b", "1024"][..]),
    ] {
        let img = work.join(format!("{tag}.img"));
        let mut a = vec!["mkfs", "-q"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-d", s(&src), s(&img), "96M"]);
        ok(&a);
        fsck_clean(&img);
        let mnt = work.join(format!("mnt-{tag}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let m = LoopMount::mount(&img, &mnt, "auto", true).unwrap();
        let opts = CompareOpts {
            ignore_lost_found: true,
            ..CompareOpts::default()
        };
        let diffs = compare_trees(&src, m.path(), &opts).unwrap();
        m.unmount().unwrap();
        failures.extend(diffs.iter().map(|d| format!("{tag}: {d}")));
        let _ = std::fs::remove_file(&img);
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn mkfs_d_twice_gives_identical_bytes() {
    let work = workdir("repro");
    let src = work.join("src");
    build_source_tree(&src, &TreeOpts::small()).unwrap();
    let build = |name: &str| {
        let img = work.join(name);
        ok(&[
            "mkfs",
            "-q",
            "-U",
            "01234567-89ab-cdef-0123-456789abcdef",
            "-E",
            "hash_seed=11111111-2222-3333-4444-555555555555",
            "-d",
            s(&src),
            s(&img),
            "64M",
        ]);
        std::fs::read(&img).unwrap()
    };
    // The copy reads the source with O_NOATIME, so it does not change the
    // atimes the image records: the second build sees the same tree. (The
    // tree has mtimes in the future, where relatime would otherwise update
    // atimes on every read.)
    pin_atimes(&src);
    let a = build("a.img");
    let b = build("b.img");
    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(
        a.len() == b.len() && differ == 0,
        "two builds of the same tree differ in {differ} bytes"
    );
    fsck_clean(&work.join("a.img"));
    let _ = std::fs::remove_dir_all(&work);
}

/// Set every atime below `root` to one fixed time (mtimes untouched).
fn pin_atimes(root: &Path) {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        let t = Timestamps {
            last_access: Timespec {
                tv_sec: 1_600_000_000,
                tv_nsec: 0,
            },
            last_modification: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
        };
        utimensat(CWD, &p, &t, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }
}

#[test]
fn edit_commands_are_clean_and_the_kernel_sees_them() {
    need_kernel();
    let work = workdir("edit");
    let img = work.join("disk.img");
    let im = s(&img);
    ok(&["mkfs", "-q", im, "32M"]);
    // A small host tree to put in.
    let site = work.join("site");
    std::fs::create_dir_all(site.join("css")).unwrap();
    std::fs::write(site.join("index.html"), b"<h1>hi</h1>\n").unwrap();
    std::fs::write(site.join("css/a.css"), vec![b'x'; 70_000]).unwrap();
    std::fs::set_permissions(site.join("index.html"), std::fs::Permissions::from_mode(0o640)).unwrap();
    ok(&["mkdir", "-p", im, "/srv/www/old", "/etc"]);
    ok(&["put", s(&site), &format!("{im}:/srv/www/site")]);
    ok(&["put", s(&site.join("index.html")), &format!("{im}:/etc")]);
    ok(&["mv", im, "/srv/www/site", "/srv/site"]);
    ok(&["mv", im, "/etc/index.html", "/srv/www/old"]);
    ok(&["ln", "-s", im, "/srv/site", "/www"]);
    ok(&["ln", im, "/srv/site/css/a.css", "/srv/a-hardlink.css"]);
    ok(&["chmod", im, "600", "/srv/site/css/a.css"]);
    ok(&["chown", im, "1000:2000", "/srv/site"]);
    ok(&["touch", "-d", "1234567890.5", im, "/srv/site/index.html", "/new-empty"]);
    ok(&["truncate", "-s", "10", im, "/srv/a-hardlink.css"]);
    ok(&["truncate", "-s", "1G", im, "/sparse"]);
    ok(&["setfattr", "-n", "user.note", "-v", "hello", im, "/srv/site/index.html"]);
    let got = ok(&["getfattr", im, "/srv/site/index.html"]);
    assert!(got.contains("user.note=\"hello\""), "{got}");
    ok(&["mkdir", im, "/doomed", "/doomed/inner"]);
    ok(&["put", s(&site), &format!("{im}:/doomed/inner/site")]);
    ok(&["rm", "-r", im, "/doomed"]);
    // Failures: one line, image and path named, nothing changed.
    let o = ext4kit(&["rm", im, "/srv"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/srv") && err.contains("is a directory"), "{err}");
    let o = ext4kit(&["mkdir", im, "/srv"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("exists"));
    let df = ok(&["df", im]);
    assert!(df.contains("inodes"), "{df}");
    fsck_clean(&img);

    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&img, &mnt, "auto", true).unwrap();
    let r = m.path();
    assert_eq!(std::fs::read(r.join("srv/site/index.html")).unwrap(), b"<h1>hi</h1>\n");
    assert_eq!(
        std::fs::read(r.join("srv/www/old/index.html")).unwrap(),
        b"<h1>hi</h1>\n"
    );
    assert_eq!(std::fs::read_link(r.join("www")).unwrap(), Path::new("/srv/site"));
    let css = std::fs::metadata(r.join("srv/site/css/a.css")).unwrap();
    assert_eq!((css.len(), css.nlink(), css.mode() & 0o7777), (10, 2, 0o600));
    let site_md = std::fs::metadata(r.join("srv/site")).unwrap();
    assert_eq!((site_md.uid(), site_md.gid()), (1000, 2000));
    let idx = std::fs::metadata(r.join("srv/site/index.html")).unwrap();
    assert_eq!(
        (idx.mtime(), idx.mtime_nsec(), idx.mode() & 0o777),
        (1234567890, 500_000_000, 0o640)
    );
    assert_eq!(std::fs::metadata(r.join("new-empty")).unwrap().len(), 0);
    let sp = std::fs::metadata(r.join("sparse")).unwrap();
    assert_eq!((sp.len(), sp.blocks()), (1 << 30, 0));
    let v = Command::new("getfattr")
        .args(["-n", "user.note", "--only-values"])
        .arg(r.join("srv/site/index.html"))
        .output()
        .unwrap();
    assert_eq!(v.stdout, b"hello");
    assert!(!r.join("doomed").exists());
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&work);
}
