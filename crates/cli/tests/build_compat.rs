//! `mkfs --compat READER` and `info --compat`: an image built for GRUB is
//! read back, every file of it, by GRUB's own ext2 driver (`grub-fstest`,
//! grub-common) and checked by e2fsck; an image for U-Boot carries nothing
//! U-Boot refuses to write; one for Linux 4.19 nothing newer than 4.19
//! (checked with dumpe2fs against ext4(5)'s KERNEL SUPPORT list, not
//! against our own table); an `-O` feature a reader lacks is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod building;
use building::{ext4kit, need_tool, ok, run, s};

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildcompat", tag)
}

/// The features dumpe2fs reports.
fn dumpe2fs_features(img: &Path) -> Vec<String> {
    let out = run(Command::new("dumpe2fs").arg("-h").arg(img));
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("Filesystem features:"))
        .unwrap_or_else(|| panic!("no feature line in dumpe2fs -h:\n{out}"));
    line.split_whitespace().map(str::to_string).collect()
}

/// A tree with nested directories, a directory large enough for a
/// hash-tree index, empty and multi-block files: path → contents
/// (directories end in '/').
fn make_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut want = BTreeMap::new();
    let mut add = |rel: &str, data: Vec<u8>| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        want.insert(format!("/{rel}"), data);
    };
    add("boot/vmlinuz", (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect());
    add("boot/grub/grub.cfg", b"set timeout=1\nmenuentry test {}\n".to_vec());
    add("etc/empty", Vec::new());
    add("etc/hostname", b"compat\n".to_vec());
    add("a/b/c/d/deep.txt", b"deep\n".repeat(3000));
    // 300 names: several directory blocks, indexed (dir_index stays for GRUB).
    for i in 0..300 {
        add(
            &format!("many/file-{i:04}-with-a-longer-name"),
            format!("{i}\n").into_bytes(),
        );
    }
    want
}

/// Every entry GRUB lists below `dir` (recursively), by `grub-fstest ls`.
fn grub_walk(img: &Path, dir: &str, out: &mut Vec<String>) {
    let listing = run(Command::new("grub-fstest").arg(img).arg("ls").arg(dir));
    for name in listing.split_whitespace() {
        if name == "lost+found/" {
            continue;
        }
        let path = format!("{dir}{name}");
        if name.ends_with('/') {
            grub_walk(img, &path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn grub_image_reads_back_through_grubs_driver() {
    need_tool("grub-fstest", "grub-common");
    need_tool("e2fsck", "e2fsprogs");
    let work = workdir("grub");
    let tree = work.join("tree");
    let want = make_tree(&tree);
    let img = work.join("grub.img");
    ok(&["mkfs", "-q", "--compat", "grub", "-d", s(&tree), s(&img), "64M"]);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let features = dumpe2fs_features(&img);
    assert!(features.contains(&"dir_index".to_string()), "{features:?}");
    let htree = run(Command::new("debugfs").args(["-R", "htree_dump /many"]).arg(&img));
    assert!(
        htree.contains("Root node"),
        "/many should be indexed, so GRUB reads an htree directory:\n{htree}"
    );

    // grub-fstest prints nothing and exits 0 for an image its driver
    // refuses: the listing itself must name every file.
    let mut listed = Vec::new();
    grub_walk(&img, "/", &mut listed);
    listed.sort();
    let expected: Vec<String> = want.keys().cloned().collect();
    assert_eq!(listed, expected, "GRUB's listing differs from the source tree");
    for (path, data) in &want {
        let o = Command::new("grub-fstest")
            .arg(&img)
            .arg("cat")
            .arg(path)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "grub-fstest cat {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            o.stdout == *data,
            "{path}: GRUB read {} bytes, the source has {}",
            o.stdout.len(),
            data.len()
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn info_compat_names_what_stops_each_reader() {
    need_tool("grub-fstest", "grub-common");
    let work = workdir("info");
    let default = work.join("default.img");
    ok(&["mkfs", "-q", s(&default), "64M"]);
    let out = ok(&["info", "--compat", s(&default)]);
    let line = |r: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(r))
            .unwrap_or_else(|| panic!("no line for {r}:\n{out}"))
            .to_string()
    };
    // mke2fs 1.47's defaults: U-Boot reads but will not write (metadata_csum);
    // GRUB 2.06 reads them all.
    assert!(line("u-boot").contains("read-only: metadata_csum"), "{out}");
    assert!(line("u-boot-read").ends_with("opens"), "{out}");
    assert!(line("grub").ends_with("opens"), "{out}");
    assert!(line("linux-4.19").ends_with("opens"), "{out}");
    assert!(
        out.contains("metadata_csum (ro_compat): U-Boot does not compute metadata checksums"),
        "{out}"
    );

    // metadata_csum_seed stops GRUB 2.06, not 2.12, nor Debian's backport.
    let seed = work.join("seed.img");
    ok(&["mkfs", "-q", "-O", "metadata_csum_seed", s(&seed), "64M"]);
    let out2 = ok(&["info", "--compat", s(&seed)]);
    let grub = out2.lines().find(|l| l.starts_with("grub ")).unwrap();
    assert!(grub.contains("cannot open: metadata_csum_seed"), "{out2}");
    assert!(
        out2.lines().any(|l| l.starts_with("grub-2.12") && l.ends_with("opens")),
        "{out2}"
    );
    assert!(
        out2.lines()
            .any(|l| l.starts_with("linux-3.10") && l.contains("cannot open: metadata_csum_seed")),
        "{out2}"
    );
    let listing = run(Command::new("grub-fstest").arg(&seed).args(["ls", "/"]));
    assert!(
        listing.contains("lost+found/"),
        "Debian's GRUB reads metadata_csum_seed (backport): {listing}"
    );

    // Built for U-Boot: U-Boot writes it.
    let ub = work.join("uboot.img");
    let made = ok(&["mkfs", "--compat", "u-boot", s(&ub), "64M"]);
    assert!(
        made.contains("left out metadata_csum") && made.contains("left out dir_index"),
        "{made}"
    );
    let out3 = ok(&["info", "--compat", s(&ub)]);
    assert!(
        out3.lines().any(|l| l.starts_with("u-boot ") && l.ends_with("opens")),
        "{out3}"
    );
    let f = dumpe2fs_features(&ub);
    for bad in ["metadata_csum", "dir_index", "metadata_csum_seed"] {
        assert!(!f.contains(&bad.to_string()), "{bad} in a U-Boot image: {f:?}");
    }
    assert!(
        f.contains(&"uninit_bg".to_string()),
        "descriptors keep a checksum: {f:?}"
    );
    ext4kit_testkit::e2fsck_clean(&ub).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn an_old_kernel_gets_nothing_newer() {
    need_tool("dumpe2fs", "e2fsprogs");
    let work = workdir("linux");
    let img = work.join("k419.img");
    let tree = work.join("tree");
    make_tree(&tree);
    ok(&["mkfs", "-q", "--compat", "linux-4.19", "-d", s(&tree), s(&img), "64M"]);
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    // ext4(5) KERNEL SUPPORT: the features Linux 4.19 has (and the state
    // bit needs_recovery, which a clean image does not carry).
    let known_419 = [
        "filetype",
        "sparse_super",
        "large_file",
        "has_journal",
        "ext_attr",
        "dir_index",
        "resize_inode",
        "64bit",
        "dir_nlink",
        "extent",
        "extra_isize",
        "flex_bg",
        "huge_file",
        "meta_bg",
        "uninit_bg",
        "mmp",
        "bigalloc",
        "quota",
        "inline_data",
        "sparse_super2",
        "metadata_csum",
        "encrypt",
        "metadata_csum_seed",
        "project",
        "ea_inode",
        "large_dir",
    ];
    for f in dumpe2fs_features(&img) {
        assert!(known_419.contains(&f.as_str()), "{f} is newer than Linux 4.19");
    }

    // -O orphan_file (Linux 5.15) for Linux 5.10: refused, nothing written.
    let refused = work.join("refused.img");
    let o = ext4kit(&[
        "mkfs",
        "-O",
        "orphan_file",
        "--compat",
        "linux-5.10",
        s(&refused),
        "64M",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "orphan_file for linux-5.10 was accepted");
    assert!(
        err.contains("orphan_file") && err.contains("--compat linux-5.10") && err.contains("from 5.15"),
        "{err}"
    );
    assert!(!refused.exists(), "a refused build left an image");
    // An unknown reader is refused by the parser, listing the readers.
    let o = ext4kit(&["mkfs", "--compat", "linux", s(&refused), "64M"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("linux-X.Y"), "{err}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn info_compat_on_what_is_not_an_image_is_a_clear_error() {
    // A hostile or truncated IMAGE: an error that says what is wrong and
    // where, a failing exit status, no verdicts.
    let work = workdir("notimage");
    let junk = work.join("junk.img");
    std::fs::write(&junk, vec![0x5au8; 4096]).unwrap();
    let short = work.join("short.img");
    std::fs::write(&short, vec![0u8; 1500]).unwrap();
    for (img, want) in [
        (&junk, "not an ext2/3/4 filesystem"),
        (&short, "past the end of the image"),
    ] {
        let o = ext4kit(&["info", "--compat", s(img)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}: info --compat succeeded", img.display());
        assert!(
            err.contains(want),
            "{}: the error says \"{want}\":\n{err}",
            img.display()
        );
        assert!(o.stdout.is_empty(), "{}: no verdicts printed", img.display());
    }
    let _ = std::fs::remove_dir_all(&work);
}
