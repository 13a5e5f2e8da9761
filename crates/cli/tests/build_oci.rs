//! Building images from OCI images without root: a layout with two
//! layers (a plain tar, then a gzip one with a whiteout and an opaque
//! directory), made here with GNU tar and sha256sum, as a directory and
//! packed as an oci-archive. `ext4kit mkfs -d` run as uid 65534 gives an
//! image the kernel mounts as exactly the tree the layers make; a blob
//! whose digest does not match, and a whiteout of what no lower layer
//! has, fail the build with the reason and leave no image.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, CompareOpts, LoopMount, TimeFidelity};

mod building;
use building::{ext4kit_as_nobody, need_root_and_kernel, run, s};

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildoci", tag)
}

fn sha256(p: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(p));
    out.split_whitespace().next().unwrap().to_string()
}

fn set_mtime(p: &Path, sec: i64) {
    let t = rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: 250_000_000,
    };
    let ts = rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(rustix::fs::CWD, p, &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// The two layers' trees and the tree they make together.
struct Trees {
    base: PathBuf,
    top: PathBuf,
    expected: PathBuf,
}

fn make_trees(work: &Path) -> Trees {
    let base = work.join("base");
    let top = work.join("top");
    let expected = work.join("expected");
    // Layer 1: a, d/{x,y}, e/p, keep/k.
    for (p, d) in [
        ("a", &b"gone"[..]),
        ("d/x", b"x"),
        ("d/y", b"y"),
        ("e/p", b"p"),
        ("keep/k", b"k"),
    ] {
        write(&base.join(p), d);
    }
    std::os::unix::fs::lchown(base.join("e/p"), Some(1000), Some(1000)).unwrap();
    // Layer 2: removes a, makes d opaque with a new z, adds e/q.
    for (p, d) in [
        ("d/z", &b"z"[..]),
        ("e/q", b"q"),
        (".wh.a", b""),
        ("d/.wh..wh..opq", b""),
    ] {
        write(&top.join(p), d);
    }
    std::os::unix::fs::lchown(top.join("e/q"), Some(4242), Some(4242)).unwrap();
    // What the image must hold.
    for (p, d) in [("d/z", &b"z"[..]), ("e/p", b"p"), ("e/q", b"q"), ("keep/k", b"k")] {
        write(&expected.join(p), d);
    }
    std::os::unix::fs::lchown(expected.join("e/p"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::lchown(expected.join("e/q"), Some(4242), Some(4242)).unwrap();
    // Times: files as their layer has them; a directory as the top-most
    // layer that has it.
    let times = [
        ("d/z", 1_600_000_100),
        ("e/p", 1_600_000_200),
        ("e/q", 1_600_000_300),
        ("keep/k", 1_600_000_400),
        ("keep", 1_600_000_500),
    ];
    for (p, t) in &times {
        for root in [&base, &top, &expected] {
            if root.join(p).exists() {
                set_mtime(&root.join(p), *t);
            }
        }
    }
    for (p, t) in [("d", 1_600_001_000), ("e", 1_600_002_000), ("", 1_600_003_000)] {
        set_mtime(&top.join(p), t);
        set_mtime(&expected.join(p), t);
        set_mtime(&base.join(p), t - 500);
    }
    for p in ["a", "d/x", "d/y", ".wh.a", "d/.wh..wh..opq"] {
        for root in [&base, &top] {
            if root.join(p).exists() {
                set_mtime(&root.join(p), 1_500_000_000);
            }
        }
    }
    // base's own d and e were re-stamped by the files above: again.
    set_mtime(&base.join("d"), 1_600_000_500);
    set_mtime(&base.join("e"), 1_600_001_500);
    set_mtime(&base, 1_600_002_500);
    Trees { base, top, expected }
}

/// An OCI layout of the two layers; returns its directory.
fn make_layout(work: &Path, t: &Trees) -> PathBuf {
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let tar = |src: &Path, out: &Path, gzip: bool| {
        run(Command::new("tar")
            .args(["--format=posix", "--numeric-owner", "--sort=name"])
            .args(if gzip { &["-czf"][..] } else { &["-cf"][..] })
            .args([s(out), "-C", s(src), "."]));
    };
    let l1 = work.join("l1.tar");
    tar(&t.base, &l1, false);
    let l2 = work.join("l2.tar.gz");
    tar(&t.top, &l2, true);
    let l2_plain = work.join("l2.tar");
    run(Command::new("sh").args(["-c", &format!("gzip -dc {} > {}", s(&l2), s(&l2_plain))]));
    let blob = |p: &Path| -> (String, u64) {
        let h = sha256(p);
        std::fs::copy(p, blobs.join(&h)).unwrap();
        (h, std::fs::metadata(p).unwrap().len())
    };
    let (h1, n1) = blob(&l1);
    let (h2, n2) = blob(&l2);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["sha256:{}","sha256:{}"]}}}}"#,
        sha256(&l1),
        sha256(&l2_plain)
    );
    let cfg = work.join("config.json");
    std::fs::write(&cfg, &config).unwrap();
    let (hc, nc) = blob(&cfg);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{hc}","size":{nc}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:{h1}","size":{n1}}},{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:{h2}","size":{n2}}}]}}"#
    );
    let man = work.join("manifest.json");
    std::fs::write(&man, &manifest).unwrap();
    let (hm, nm) = blob(&man);
    std::fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{hm}","size":{nm},"annotations":{{"org.opencontainers.image.ref.name":"v1"}}}}]}}"#
        ),
    )
    .unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    layout
}

fn build_and_compare(work: &Path, source: &Path, expected: &Path) {
    let img = work.join("out.img");
    let o = ext4kit_as_nobody(&["mkfs", "-q", "-d", s(source), "--image", "v1", s(&img), "32M"]);
    assert!(
        o.status.success(),
        "mkfs -d {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    ext4kit_testkit::e2fsck_clean(&img).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let opts = CompareOpts {
        ignore_lost_found: true,
        times: TimeFidelity::Nanoseconds,
        ..CompareOpts::default()
    };
    let diffs = compare_trees(expected, m.path(), &opts).unwrap();
    assert!(
        diffs.is_empty(),
        "{}: the image is not what the layers make:\n{diffs:#?}",
        source.display()
    );
    m.unmount().unwrap();
    std::fs::remove_file(&img).unwrap();
}

#[test]
fn an_oci_image_builds_as_its_layers_make_it() {
    need_root_and_kernel();
    let work = workdir("layers");
    let t = make_trees(&work);
    let layout = make_layout(&work, &t);
    build_and_compare(&work, &layout, &t.expected);
    // The same layout packed as an oci-archive.
    let archive = work.join("image.tar");
    run(Command::new("tar").args(["-cf", s(&archive), "-C", s(&layout), "."]));
    build_and_compare(&work, &archive, &t.expected);
    // An image name the index does not have.
    let o = ext4kit_as_nobody(&[
        "mkfs",
        "-q",
        "-d",
        s(&layout),
        "--image",
        "v2",
        s(&work.join("x.img")),
        "32M",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no image named \"v2\""));
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn a_bad_digest_or_a_stray_whiteout_fails_the_build_and_leaves_no_image() {
    need_root_and_kernel();
    let work = workdir("bad");
    let t = make_trees(&work);
    let layout = make_layout(&work, &t);
    // A stray whiteout: the top layer removes what no layer below has.
    {
        std::fs::write(t.top.join(".wh.nothere"), b"").unwrap();
        let l = make_layout(&work.join("again"), &t);
        std::fs::remove_file(t.top.join(".wh.nothere")).unwrap();
        let img = work.join("stray.img");
        let o = ext4kit_as_nobody(&["mkfs", "-q", "-d", s(&l), s(&img), "32M"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("nothere") && err.contains("no earlier layer"), "{err}");
        assert!(!img.exists(), "a failed build left its image");
    }
    // A layer blob changed after its digest was taken.
    let blobs = layout.join("blobs/sha256");
    let biggest = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&biggest).unwrap();
    // The plain layer's data: flip a byte of file "a" ("gone").
    let at = bytes
        .windows(4)
        .position(|w| w == b"gone")
        .expect("layer 1 holds file a's data");
    bytes[at] = b'G';
    std::fs::write(&biggest, &bytes).unwrap();
    let img = work.join("digest.img");
    let o = ext4kit_as_nobody(&["mkfs", "-q", "-d", s(&layout), s(&img), "32M"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("digest mismatch") && err.contains("layer 1"), "{err}");
    assert!(!img.exists(), "a failed build left its image");
    std::fs::remove_dir_all(&work).unwrap();
}
