//! `ext4kit mkfs --output-format android-sparse`: the Android sparse image
//! expands (`simg2img`, Debian android-sdk-libsparse-utils) to exactly the
//! bytes of the raw build of the same sources and options, with a SIZE
//! and without; it is written without a raw image first (it fits where a
//! raw image and its conversion would not); and what it cannot be (a
//! partition, a size not a multiple of 4 KiB) is refused before anything
//! is left behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{compare_trees, e2fsck_clean, CompareOpts, LoopMount, TestRng};

mod building;
use building::{need_kernel, need_tool, ok_as_nobody, run, s};

const UUID: &str = "01234567-89ab-cdef-0123-456789abcdef";

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildout", tag)
}

/// A tree with data of several shapes: random files (RAW chunks), a file
/// of one repeated word (FILL chunks), a sparse file, small files, a
/// symlink, a hard link, an xattr.
fn make_tree(src: &Path, random_bytes: usize) {
    let mut rng = TestRng::new(0x51_6d_67);
    std::fs::create_dir_all(src.join("bin")).unwrap();
    let mut left = random_bytes;
    let mut i = 0;
    while left > 0 {
        let n = left.min(3 << 20);
        let mut b = vec![0u8; n];
        rng.fill(&mut b);
        std::fs::write(src.join(format!("bin/blob{i}")), b).unwrap();
        left -= n;
        i += 1;
    }
    std::fs::write(src.join("pattern"), 0xa5a5_5a5a_u32.to_le_bytes().repeat(300_000)).unwrap();
    let f = std::fs::File::create(src.join("holes")).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"start", 4096).unwrap();
    f.write_all_at(b"end", 200 << 20).unwrap();
    std::fs::create_dir_all(src.join("etc")).unwrap();
    for j in 0..200 {
        std::fs::write(src.join(format!("etc/conf{j}")), format!("line {j}\n")).unwrap();
    }
    std::os::unix::fs::symlink("../bin/blob0", src.join("etc/link")).unwrap();
    std::fs::hard_link(src.join("etc/conf1"), src.join("etc/conf1.hard")).unwrap();
    rustix::fs::setxattr(
        src.join("pattern"),
        "user.kind",
        b"fill",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
}

/// The first byte where two files differ, if they do.
fn first_difference(a: &Path, b: &Path) -> Option<String> {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    if x.len() != y.len() {
        return Some(format!("{} bytes against {}", x.len(), y.len()));
    }
    x.iter()
        .zip(&y)
        .position(|(p, q)| p != q)
        .map(|i| format!("byte {i:#x}: {:#04x} against {:#04x}", x[i], y[i]))
}

#[test]
fn android_sparse_output_expands_to_the_raw_build_byte_for_byte() {
    need_tool("simg2img", "android-sdk-libsparse-utils");
    need_tool("tar", "tar");
    need_tool("setpriv", "util-linux");
    let work = workdir("same");
    let tree = work.join("tree");
    make_tree(&tree, 6 << 20);
    let tar = work.join("src.tar");
    run(Command::new("tar").args(["--xattrs", "--sparse", "-C", s(&tree), "-cf", s(&tar), "."]));
    for size in [Some("256M"), None] {
        let tag = size.unwrap_or("min");
        let raw = work.join(format!("raw-{tag}.img"));
        let simg = work.join(format!("sparse-{tag}.simg"));
        let expanded = work.join(format!("expanded-{tag}.img"));
        let mut args = vec!["mkfs", "-q", "-U", UUID, "--all-root", "-d", s(&tar)];
        let mut raw_args = args.clone();
        raw_args.push(s(&raw));
        args.extend(["--output-format", "android-sparse", s(&simg)]);
        if let Some(sz) = size {
            raw_args.push(sz);
            args.push(sz);
        }
        // Built as uid 65534: neither output needs root.
        ok_as_nobody(&raw_args);
        ok_as_nobody(&args);
        let head = std::fs::read(&simg).unwrap();
        assert_eq!(&head[..4], &[0x3a, 0xff, 0x26, 0xed], "{tag}: the sparse image's magic");
        run(Command::new("simg2img").args([s(&simg), s(&expanded)]));
        if let Some(d) = first_difference(&raw, &expanded) {
            panic!("{tag}: simg2img of the Android sparse output differs from the raw build: {d}");
        }
        e2fsck_clean(&expanded).unwrap_or_else(|e| panic!("{tag}: {e}"));
        let raw_len = std::fs::metadata(&raw).unwrap().len();
        if size.is_some() {
            assert!(
                (head.len() as u64) < raw_len / 4,
                "{tag}: the sparse image ({} bytes) holds only what is used of {raw_len}",
                head.len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Unmounts a tmpfs when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn android_sparse_build_needs_no_room_for_a_raw_image() {
    // A 40 MiB filesystem for the output, 24 MiB of data to build from: a
    // raw image (24 MiB used) and its conversion (24 MiB more) would not
    // fit together; the build writes the sparse image from the scratch of
    // written blocks, whose space it gives back as the output grows.
    if !rustix::process::geteuid().is_root() {
        panic!("this test mounts a small tmpfs for the output (root); CI runs as root");
    }
    need_kernel();
    need_tool("simg2img", "android-sdk-libsparse-utils");
    let work = workdir("room");
    let tree = work.join("tree");
    let data = 24usize << 20;
    make_tree(&tree, data);
    let small = work.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let room: u64 = 40 << 20;
    run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={room}"), "tmpfs", s(&small)]));
    let guard = Tmpfs(small.clone());
    assert!(
        2 * data as u64 > room,
        "the room must be too small for a raw image and its conversion"
    );
    let simg = small.join("out.simg");
    run(Command::new(env!("CARGO_BIN_EXE_ext4kit")).args([
        "mkfs",
        "-q",
        "-d",
        s(&tree),
        "--output-format",
        "android-sparse",
        s(&simg),
        "2G",
    ]));
    let names: Vec<String> = std::fs::read_dir(&small)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["out.simg"], "only the output is left in its directory");
    let expanded = work.join("expanded.img");
    run(Command::new("simg2img").args([s(&simg), s(&expanded)]));
    drop(guard);
    e2fsck_clean(&expanded).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    let m = LoopMount::mount(&expanded, &mnt, "ext4", true).unwrap();
    let opts = CompareOpts {
        ignore_lost_found: true,
        ..CompareOpts::default()
    };
    let diffs = compare_trees(&tree, m.path(), &opts).unwrap();
    m.unmount().unwrap();
    assert!(diffs.is_empty(), "the kernel reads the tree back: {diffs:#?}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn android_sparse_refusals_leave_nothing_behind() {
    let work = workdir("refuse");
    let tree = work.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("f"), b"x").unwrap();
    let bin = env!("CARGO_BIN_EXE_ext4kit");
    let fails = |args: &[&str], want: &str| {
        let o = Command::new(bin).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: the error says \"{want}\":\n{err}");
    };
    let out = work.join("x.simg");
    // 1025 KiB of 1 KiB blocks: not a whole number of 4 KiB blocks.
    fails(
        &[
            "mkfs",
            "-b",
            "1024",
            "-d",
            s(&tree),
            "--output-format",
            "android-sparse",
            s(&out),
            "1025K",
        ],
        "multiple of 4096",
    );
    fails(
        &[
            "mkfs",
            "-d",
            s(&tree),
            "--output-format",
            "android-sparse",
            "--offset",
            "1M",
            s(&out),
            "8M",
        ],
        "cannot be written onto a device",
    );
    fails(
        &["mkfs", "--output-format", "qcow3", s(&out), "8M"],
        "unknown output format",
    );
    let left: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("tree")], "nothing was left: {left:?}");
    let _ = std::fs::remove_dir_all(&work);
}

/// Kill `mkfs --output-format FORMAT` mid-build: the image is written
/// under a temporary name and renamed into place at the end (a sparse
/// image's scratch is an unlinked file), so IMAGE is the old image and no
/// staged name is left.
fn killed_build_leaves_image_as_it_was(format: &str, name: &str) {
    let work = workdir(&format!("killed-{format}"));
    let tree = work.join("tree");
    make_tree(&tree, 96 << 20);
    let img = work.join(name);
    std::fs::write(&img, b"an old image").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(["mkfs", "-q", "-d", s(&tree), "--output-format", format, s(&img), "1G"])
        .spawn()
        .unwrap();
    let staged = work.join(format!(".{name}.ext4kit-mkfs-{}", child.id()));
    let t = std::time::Instant::now();
    while !staged.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{format}: the build ended before it could be killed"
        );
        assert!(t.elapsed().as_secs() < 60, "{format}: the staged build never started");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        child.try_wait().unwrap().is_none(),
        "{format}: the build ended before it could be killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        std::fs::read(&img).unwrap(),
        b"an old image",
        "{format}: a killed build changed IMAGE"
    );
    let _ = std::fs::remove_file(&staged);
    let left: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "tree" && n != name)
        .collect();
    assert!(left.is_empty(), "{format}: nothing else is left beside IMAGE: {left:?}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn a_killed_android_sparse_build_leaves_image_as_it_was() {
    killed_build_leaves_image_as_it_was("android-sparse", "out.simg");
}

#[test]
fn a_killed_build_into_a_vm_disk_leaves_image_as_it_was() {
    for (format, name) in [("qcow2", "out.qcow2"), ("vhdx", "out.vhdx"), ("vhd", "out.vhd")] {
        killed_build_leaves_image_as_it_was(format, name);
    }
}
