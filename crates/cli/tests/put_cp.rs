//! `ext4kit put` lands things where `cp -a` would: the trailing forms of a
//! source (`DIR`, `DIR/`, `DIR/.`, `.`), merging into an existing
//! directory, replacing existing files, and hard links given as separate
//! sources. The oracle is `cp -a` itself, run onto a host directory; the
//! image is read back by the kernel (loop mount) and the two trees are
//! compared whole (names, types, modes, owners, contents, xattrs, mtimes,
//! hard-link groups and link counts). e2fsck must find every image clean.
//!
//! Also: `mkfs` with one fixed UUID and `SOURCE_DATE_EPOCH` (no
//! `-E hash_seed=`) is reproducible byte for byte, `put` included.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, CompareOpts, LoopMount};

const EPOCH: &str = "1700000000";

/// Run ext4kit in `cwd`; panic with its stderr on failure.
fn ext4kit_in(cwd: &Path, args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(args)
        .current_dir(cwd)
        .env("SOURCE_DATE_EPOCH", EPOCH)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ext4kit {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `cp -a ARGS...` in `cwd`.
fn cp_a(cwd: &Path, args: &[&str]) {
    let o = Command::new("cp")
        .arg("-a")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cp -a {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-putcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test reads images back with the kernel (loop mount): {e}; CI runs as root");
    }
}

fn set_mtime(p: &Path, sec: i64) {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD};
    let t = Timespec {
        tv_sec: sec,
        tv_nsec: 0,
    };
    utimensat(
        CWD,
        p,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A small tree with what `cp -a` must keep: modes, an odd owner, a
/// symlink, a fifo, an xattr, a sparse file, hard links inside the tree
/// (also across directories), and directory times set last.
fn make_src(src: &Path) {
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("a"), b"alpha\n").unwrap();
    std::fs::write(src.join("sub/b"), b"beta\n").unwrap();
    std::fs::write(src.join("sub/deeper/c"), vec![7u8; 10_000]).unwrap();
    std::fs::hard_link(src.join("a"), src.join("a-link")).unwrap();
    std::fs::hard_link(src.join("a"), src.join("sub/a-link2")).unwrap();
    symlink("../a", src.join("sub/sym")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.set_len(3 << 20).unwrap();
    drop(f);
    rustix::fs::setxattr(
        src.join("sub/b").as_path(),
        "user.note",
        b"hi",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::chown(
        src.join("sub/b").as_path(),
        Some(rustix::fs::Uid::from_raw(1234)),
        Some(rustix::fs::Gid::from_raw(567)),
    )
    .unwrap();
    std::fs::set_permissions(src.join("sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::set_permissions(src, std::fs::Permissions::from_mode(0o711)).unwrap();
    for (p, t) in [
        ("a", 1_000_000_000),
        ("sub/b", 1_100_000_000),
        ("sub/deeper/c", 1_200_000_000),
        ("sub/sym", 1_250_000_000),
        ("fifo", 1_260_000_000),
        ("sparse", 1_270_000_000),
        ("sub/deeper", 1_300_000_000),
        ("sub", 1_400_000_000),
        ("", 1_500_000_000),
    ] {
        set_mtime(&src.join(p), t);
    }
}

/// What already sits in a destination before a merge: a file that the
/// source replaces (with a second hard link that must keep the old
/// contents, as cp leaves it), a directory the source merges into with an
/// entry of its own, and an unrelated file.
fn make_pre(pre: &Path) {
    std::fs::create_dir_all(pre.join("sub")).unwrap();
    std::fs::write(pre.join("a"), b"old contents\n").unwrap();
    std::fs::hard_link(pre.join("a"), pre.join("old-link")).unwrap();
    std::fs::write(pre.join("sub/mine"), b"kept\n").unwrap();
    std::fs::write(pre.join("unrelated"), b"kept too\n").unwrap();
    set_mtime(&pre.join("sub"), 900_000_000);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Mount `img` read-only with the kernel and compare each `(name, opts)`
/// below `reference` and the mount; returns the differences.
fn compare_with_kernel(img: &Path, reference: &Path, mnt: &Path, parts: &[(&str, CompareOpts)]) -> Vec<String> {
    let m = LoopMount::mount(img, mnt, "ext4", true).unwrap();
    let mut out = Vec::new();
    for (name, opts) in parts {
        let diffs = compare_trees(&reference.join(name), &m.path().join(name), opts).unwrap();
        out.extend(diffs.iter().map(|d| format!("{name}: {d}")));
    }
    m.unmount().unwrap();
    out
}

#[test]
fn put_places_sources_as_cp_a_does() {
    need_kernel();
    let w = workdir("forms");
    let src = w.join("src");
    make_src(&src);
    let pre = w.join("pre");
    make_pre(&pre);
    let reference = w.join("ref");
    std::fs::create_dir(&reference).unwrap();
    let img = w.join("img");
    ext4kit_in(&w, &["mkfs", "-q", s(&img), "32M"]);
    let im = |dest: &str| format!("{}:{dest}", img.display());

    // Destinations that exist before the copy: made the same way on both
    // sides (their own attributes are not part of what cp changes, except
    // for the DIR/. forms, which give them the source's).
    for d in ["ex_plain", "ex_slash", "ex_dot", "ex_dot_slash", "ex_cwd"] {
        std::fs::create_dir(reference.join(d)).unwrap();
        ext4kit_in(&w, &["mkdir", s(&img), &format!("/{d}")]);
    }
    cp_a(&w, &["pre", "ref/merge"]);
    ext4kit_in(&w, &["put", "pre", &im("/merge")]);

    // The forms, on both sides.
    let forms: &[(&Path, &[&str], &str)] = &[
        (&w, &["src"], "ex_plain"),
        (&w, &["src/"], "ex_slash"),
        (&w, &["src/."], "ex_dot"),
        (&w, &["src/./"], "ex_dot_slash"),
        (&src, &["."], "ex_cwd"),
        (&w, &["src"], "new_plain"),
        (&w, &["src/."], "new_dot"),
        (&w, &["src/."], "merge"),
    ];
    for (cwd, srcs, dest) in forms {
        let mut cp_args: Vec<String> = srcs.iter().map(|x| x.to_string()).collect();
        cp_args.push(s(&reference.join(dest)).to_string());
        cp_a(cwd, &cp_args.iter().map(String::as_str).collect::<Vec<_>>());
        let mut put_args: Vec<String> = vec!["put".into()];
        put_args.extend(srcs.iter().map(|x| x.to_string()));
        put_args.push(im(&format!("/{dest}")));
        ext4kit_in(cwd, &put_args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    // The merge replaced `a` but left the old inode to `old-link`.
    assert_eq!(
        std::fs::read(reference.join("merge/old-link")).unwrap(),
        b"old contents\n"
    );

    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let whole = CompareOpts::default();
    // cp does not touch an existing destination's own attributes when
    // copying into it under a name (and its mtime is "now" on both sides).
    let inside = CompareOpts {
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    let parts = [
        ("ex_plain", inside.clone()),
        ("ex_slash", inside.clone()),
        ("ex_dot", whole.clone()),
        ("ex_dot_slash", whole.clone()),
        ("ex_cwd", whole.clone()),
        ("new_plain", whole.clone()),
        ("new_dot", whole.clone()),
        ("merge", whole.clone()),
    ];
    let diffs = compare_with_kernel(&img, &reference, &w.join("mnt"), &parts);
    assert!(
        diffs.is_empty(),
        "{} differences from cp -a:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    // And each part holds what it should (the compare is against cp's
    // result, which must itself be what we think).
    assert!(reference.join("ex_plain/src/sub/deeper/c").exists());
    assert!(reference.join("ex_dot/sub/deeper/c").exists());
    assert!(!reference.join("ex_dot/src").exists());
    assert!(reference.join("merge/sub/mine").exists());
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn hard_links_given_as_separate_sources_stay_one_inode() {
    need_kernel();
    let w = workdir("links");
    std::fs::write(w.join("A"), b"one file\n").unwrap();
    std::fs::hard_link(w.join("A"), w.join("B")).unwrap();
    std::fs::create_dir(w.join("D")).unwrap();
    std::fs::hard_link(w.join("A"), w.join("D/C")).unwrap();
    std::fs::write(w.join("D/E"), b"two\n").unwrap();
    std::fs::hard_link(w.join("D/E"), w.join("F")).unwrap();
    set_mtime(&w.join("D"), 1_500_000_000);
    let reference = w.join("ref");
    std::fs::create_dir_all(reference.join("all")).unwrap();
    std::fs::create_dir_all(reference.join("pair")).unwrap();
    let img = w.join("img");
    ext4kit_in(&w, &["mkfs", "-q", s(&img), "16M"]);
    ext4kit_in(&w, &["mkdir", s(&img), "/all", "/pair"]);
    // A and B alone; then A, B, a tree holding a third link, and a file
    // linked from inside that tree.
    cp_a(&w, &["A", "B", "ref/pair"]);
    ext4kit_in(&w, &["put", "A", "B", &format!("{}:/pair", img.display())]);
    cp_a(&w, &["A", "B", "D", "F", "ref/all"]);
    ext4kit_in(&w, &["put", "A", "B", "D", "F", &format!("{}:/all", img.display())]);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));

    let inside = CompareOpts {
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    let diffs = compare_with_kernel(
        &img,
        &reference,
        &w.join("mnt"),
        &[("pair", inside.clone()), ("all", inside)],
    );
    assert!(
        diffs.is_empty(),
        "{} differences from cp -a:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    let _ = std::fs::remove_dir_all(&w);
}

/// Two builds with one fixed UUID and `SOURCE_DATE_EPOCH`, no hash seed
/// given: byte-identical images (a directory large enough to be indexed
/// makes the hash seed matter), and a different UUID gives a different
/// seed.
#[test]
fn fixed_uuid_and_source_date_epoch_are_enough_for_identical_images() {
    let w = workdir("repro");
    let src = w.join("src");
    std::fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..400 {
        std::fs::write(src.join(format!("many/file-{i:04}")), format!("{i}\n")).unwrap();
    }
    std::fs::write(src.join("top"), b"top\n").unwrap();
    for p in ["many", ""] {
        set_mtime(&src.join(p), 1_600_000_000);
    }
    let uuid = "01234567-89ab-cdef-0123-456789abcdef";
    let build = |name: &str, uuid: &str| {
        let img = w.join(name);
        ext4kit_in(&w, &["mkfs", "-q", "-U", uuid, s(&img), "32M"]);
        ext4kit_in(&w, &["put", "src", &format!("{}:/", img.display())]);
        ext4kit_in(&w, &["mkdir", s(&img), "/later"]);
        img
    };
    let a = build("a.img", uuid);
    let b = build("b.img", uuid);
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let differ = ba.iter().zip(&bb).filter(|(x, y)| x != y).count();
    assert!(
        ba.len() == bb.len() && differ == 0,
        "two builds with one UUID differ in {differ} bytes"
    );
    ext4kit_testkit::e2fsck_clean(&a).unwrap_or_else(|e| panic!("{e}"));

    // `mkfs -d` too.
    let d = |name: &str| {
        let img = w.join(name);
        ext4kit_in(&w, &["mkfs", "-q", "-U", uuid, "-d", "src", s(&img), "32M"]);
        std::fs::read(img).unwrap()
    };
    assert!(d("c.img") == d("d.img"), "two mkfs -d builds with one UUID differ");

    // The seed comes from the UUID: another UUID, another seed; and it is
    // neither zero (the kernel's "use the default") nor the UUID itself.
    let seed = |img: &Path| {
        let o = Command::new("dumpe2fs").arg("-h").arg(img).output().unwrap();
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        t.lines()
            .find_map(|l| l.strip_prefix("Directory Hash Seed:").map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no hash seed in dumpe2fs -h:\n{t}"))
    };
    let other = build("e.img", "fedcba98-7654-3210-fedc-ba9876543210");
    let (sa, se) = (seed(&a), seed(&other));
    assert_ne!(sa, se);
    assert_ne!(sa, uuid);
    assert_ne!(sa, "00000000-0000-0000-0000-000000000000");
    let _ = std::fs::remove_dir_all(&w);
}
