//! Opening and reading damaged images (the root is checked at open, as
//! `ext4_fill_super` checks it): a missing or non-directory root, or an
//! empty root record, is refused with a message naming the root inode and
//! saying "run e2fsck" — by the library (read-write and read-only) and by
//! `ext4kit mount`, which must not leave a mount whose every path (the mount
//! point's own included) is ENOENT; and `ext4kit get` of a directory holding
//! one name twice reports it and copies everything else instead of stopping
//! on "File exists".

use std::path::Path;
use std::process::Command;

use ext4kit::{Fs, OpenOptions};
use ext4kit_fuzz::damaged::check::find_cli;
use ext4kit_fuzz::damaged::corpus::{damage_bases, Damage, DamageBase, Kind};

/// The first seed of `kind` on each base.
fn images_of(kind: Kind, bases: &[DamageBase]) -> Vec<(Damage, Vec<u8>)> {
    let mut out: Vec<(Damage, Vec<u8>)> = Vec::new();
    for seed in 0..2000 {
        let d = Damage::generate(seed, bases);
        if d.kind == kind && !out.iter().any(|(o, _)| o.base == d.base) {
            let img = d.apply(bases);
            out.push((d, img));
        }
    }
    assert_eq!(out.len(), bases.len(), "no {kind:?} image for some base");
    out
}

/// `name` in this test's own scratch directory (the tests run in parallel).
fn scratch(test: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-damaged-open-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d.join(name)
}

fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let d = dir.display().to_string();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(d.as_str()))
}

fn assert_refused_root(img: &Path, what: &str, cli: &Path) {
    for read_only in [false, true] {
        let r = Fs::open_image(img, &OpenOptions { read_only, ..Default::default() });
        let e = r.err().unwrap_or_else(|| panic!("{what}: opened (read_only {read_only})")).to_string();
        assert!(e.contains("root inode") && e.contains("run e2fsck"), "{what}: unclear refusal: {e}");
    }
    let mnt = scratch("root", "mnt");
    std::fs::create_dir_all(&mnt).unwrap_or_else(|e| panic!("creating {}: {e}", mnt.display()));
    let out = Command::new("timeout")
        .arg("60")
        .arg(cli)
        .arg("mount")
        .arg(img)
        .arg(&mnt)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", cli.display()));
    let was_mounted = mounted(&mnt);
    if was_mounted {
        let _ = Command::new(cli).arg("umount").arg(&mnt).status();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!was_mounted && !out.status.success(), "{what}: ext4kit mount did not refuse: {err}");
    assert!(err.contains("root inode") && err.contains("run e2fsck"), "{what}: mount's refusal is unclear: {err}");
}

#[test]
fn a_missing_or_broken_root_is_refused_clearly_by_open_and_mount() {
    let bases = damage_bases().unwrap_or_else(|e| panic!("damaged-image bases: {e}"));
    let cli = find_cli().unwrap_or_else(|e| panic!("this test needs the ext4kit binary: {e}"));
    let img = scratch("root", "root.img");
    for kind in [Kind::RootMissing, Kind::RootNotDir] {
        for (d, bytes) in images_of(kind, bases) {
            std::fs::write(&img, &bytes).unwrap_or_else(|e| panic!("writing {}: {e}", img.display()));
            assert_refused_root(&img, &d.describe(bases), &cli);
        }
    }
    // A root record with i_size 0 (the kernel: "corrupt root inode").
    std::fs::write(&img, bases[0].bytes.as_slice()).unwrap_or_else(|e| panic!("writing {}: {e}", img.display()));
    let st = Command::new("debugfs")
        .args(["-w", "-R", "sif <2> size 0"])
        .arg(&img)
        .output()
        .unwrap_or_else(|e| panic!("running debugfs (install e2fsprogs): {e}"));
    assert!(st.status.success(), "debugfs failed: {}", String::from_utf8_lossy(&st.stderr));
    assert_refused_root(&img, "root i_size 0", &cli);
    let _ = std::fs::remove_dir_all(img.parent().unwrap_or(Path::new("/nonexistent")));
}

#[test]
fn get_reports_a_duplicate_name_and_copies_the_rest() {
    let bases = damage_bases().unwrap_or_else(|e| panic!("damaged-image bases: {e}"));
    let cli = find_cli().unwrap_or_else(|e| panic!("this test needs the ext4kit binary: {e}"));
    let img = scratch("dup", "dup.img");
    for (d, bytes) in images_of(Kind::DuplicateName, bases) {
        std::fs::write(&img, &bytes).unwrap_or_else(|e| panic!("writing {}: {e}", img.display()));
        let dest = scratch("dup", "dup-out");
        let _ = std::fs::remove_dir_all(&dest);
        let out = Command::new("timeout")
            .arg("120")
            .arg(&cli)
            .args(["get"])
            .arg(&img)
            .arg("/")
            .arg(&dest)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", cli.display()));
        let err = String::from_utf8_lossy(&out.stderr);
        let what = d.describe(bases);
        assert!(err.contains("twice") && err.contains("run e2fsck"), "{what}: duplicate not reported: {err}");
        assert!(!err.lines().any(|l| l.trim_end().ends_with("File exists (os error 17)")), "{what}: {err}");
        for p in ["small.txt", "dir/a/file2", "made/file", "big/entry-00000-"] {
            assert!(dest.join(p).exists() || err.contains(p), "{what}: {p} was not copied: {err}");
        }
        let _ = std::fs::remove_dir_all(&dest);
    }
    let _ = std::fs::remove_dir_all(img.parent().unwrap_or(Path::new("/nonexistent")));
}
