//! Images in VM disk formats, end to end through the CLI and the mount:
//! for every container format qemu-img (and img2simg) converts one raw
//! ext4 image to, `ext4kit get` gives the tree it gives from the raw
//! image; `mkdir`, `put`, `rm` and the read-write mount on the writable
//! formats leave an image qemu-img checks clean whose raw conversion
//! e2fsck -fn finds clean and the kernel reads with the change.
//!
//! Needs root, loop devices and /dev/fuse, qemu-img (qemu-utils) and
//! img2simg (android-sdk-libsparse-utils); CI runs as root and .ci/run
//! installs them. Without them the tests fail and say why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ext4kit_testkit::journal::{e2fsck_fn, kernel_tree};
use ext4kit_testkit::{build_source_tree, compare_trees, CompareOpts, TreeOpts};

mod building;
use building::{expect_ok as ok, ext4kit_env, need_kernel, need_tool};

fn ext4kit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    ext4kit_env(args, &[])
}

fn run(what: &str, c: &mut Command) -> String {
    ok(
        what,
        c.stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{what}: {e}")),
    )
}

/// A scratch directory with a raw ext4 image made by mke2fs -d from a
/// generated tree (files of many sizes, links, symlinks, devices,
/// xattrs), and that image's tree as `ext4kit get` gives it.
struct Fixture {
    dir: PathBuf,
    raw: PathBuf,
    tree: PathBuf,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        need_kernel();
        need_tool("qemu-img", "qemu-utils");
        let dir = std::env::temp_dir().join(format!("ext4kit-disk-formats-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        let opts = TreeOpts {
            big_dir_entries: 3000,
            huge_sparse: false,
            ..Default::default()
        };
        build_source_tree(&src, &opts).unwrap();
        let raw = dir.join("raw.img");
        run(
            "mke2fs -d",
            Command::new("mke2fs")
                .args(["-q", "-F", "-t", "ext4", "-d"])
                .arg(&src)
                .arg(&raw)
                .arg("96M"),
        );
        let tree = dir.join("tree-raw");
        ok("ext4kit get of the raw image", ext4kit(&[&"get", &raw, &"/", &tree]));
        Fixture { dir, raw, tree }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Convert the raw image with qemu-img.
    fn convert(&self, name: &str, args: &[&str]) -> PathBuf {
        let out = self.path(name);
        run(
            &format!("qemu-img convert {args:?}"),
            Command::new("qemu-img")
                .arg("convert")
                .args(args)
                .arg(&self.raw)
                .arg(&out),
        );
        out
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn same_tree(what: &str, expected: &Path, actual: &Path) {
    let d = compare_trees(expected, actual, &CompareOpts::default()).unwrap();
    assert!(
        d.is_empty(),
        "{what}: {} differences, first: {:?}",
        d.len(),
        &d[..d.len().min(5)]
    );
}

/// qemu-img's format name, as `-f` takes it.
fn qemu_format(name: &str) -> &'static str {
    if name.ends_with(".vhd") {
        "vpc"
    } else if name.ends_with(".vhdx") {
        "vhdx"
    } else if name.ends_with(".vmdk") {
        "vmdk"
    } else {
        "qcow2"
    }
}

#[test]
fn get_through_every_format_is_the_raw_images_tree() {
    let f = Fixture::new("get");
    need_tool("img2simg", "android-sdk-libsparse-utils");
    let mut images = vec![
        f.convert("plain.qcow2", &["-O", "qcow2"]),
        f.convert("zlib.qcow2", &["-O", "qcow2", "-c"]),
        f.convert("zstd.qcow2", &["-O", "qcow2", "-c", "-o", "compression_type=zstd"]),
        f.convert("v2.qcow2", &["-O", "qcow2", "-o", "compat=0.10"]),
        f.convert("dynamic.vhd", &["-O", "vpc"]),
        f.convert("fixed.vhd", &["-O", "vpc", "-o", "subformat=fixed"]),
        f.convert("dynamic.vhdx", &["-O", "vhdx"]),
        f.convert("fixed.vhdx", &["-O", "vhdx", "-o", "subformat=fixed"]),
        f.convert("sparse.vmdk", &["-O", "vmdk"]),
        f.convert("stream.vmdk", &["-O", "vmdk", "-o", "subformat=streamOptimized"]),
        f.convert("flat.vmdk", &["-O", "vmdk", "-o", "subformat=monolithicFlat"]),
    ];
    let simg = f.path("android.simg");
    run("img2simg", Command::new("img2simg").arg(&f.raw).arg(&simg));
    images.push(simg);
    for img in images {
        let name = img.file_name().unwrap().to_string_lossy().into_owned();
        let out = f.path(&format!("tree-{name}"));
        ok(&format!("ext4kit get {name}"), ext4kit(&[&"get", &img, &"/", &out]));
        same_tree(&name, &f.tree, &out);
        let info = ok(&format!("ext4kit info {name}"), ext4kit(&[&"info", &img]));
        assert!(
            info.starts_with("Container:"),
            "{name}: info shows no container:\n{info}"
        );
        // The same stack for scripts: container first, the filesystem last.
        let json = ok(
            &format!("ext4kit info --json {name}"),
            ext4kit(&[&"info", &"--json", &img]),
        );
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name}: {e}:\n{json}"));
        let stack = doc["stack"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: no stack: {json}"));
        let format = match name.rsplit('.').next() {
            Some("simg") => "android-sparse",
            Some(ext) => ext,
            None => unreachable!(),
        };
        assert_eq!(stack[0]["layer"], "container", "{name}: {json}");
        assert_eq!(stack[0]["format"], format, "{name}: {json}");
        let last = stack.last().unwrap();
        assert_eq!(last["layer"], "filesystem", "{name}: {json}");
        let raw_info = ok("info --json raw", ext4kit(&[&"info", &"--json", &f.raw]));
        let raw_doc: serde_json::Value = serde_json::from_str(&raw_info).unwrap();
        assert_eq!(
            last["uuid"], raw_doc["stack"][0]["uuid"],
            "{name}: the filesystem inside is the raw image's"
        );
    }
    // zstd clusters are read, never written: a write command is refused
    // saying so, and the image is untouched.
    let zstd = f.path("zstd.qcow2");
    let before = std::fs::read(&zstd).unwrap();
    let out = ext4kit(&[&"mkdir", &zstd, &"/added"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("zstd") && err.contains("read-only"),
        "mkdir in a zstd qcow2: {:?}\n{err}",
        out.status
    );
    assert!(std::fs::read(&zstd).unwrap() == before, "the zstd image changed");
}

/// After writes to `img`: qemu-img check (qcow2), the raw conversion is
/// e2fsck -fn clean, and the kernel's tree of it is ours.
fn check_written(f: &Fixture, img: &Path) {
    let name = img.file_name().unwrap().to_string_lossy().into_owned();
    let fmt = qemu_format(&name);
    if fmt != "vpc" {
        run(
            &format!("qemu-img check {name}"),
            Command::new("qemu-img").args(["check", "-f", fmt]).arg(img),
        );
    }
    let back = f.path(&format!("{name}.back.raw"));
    run(
        &format!("qemu-img convert {name} to raw"),
        Command::new("qemu-img")
            .args(["convert", "-f", fmt, "-O", "raw"])
            .arg(img)
            .arg(&back),
    );
    if let Err(e) = e2fsck_fn(&back).unwrap() {
        panic!("{name}: e2fsck -fn of its raw conversion: {e}");
    }
    let ours = f.path(&format!("ours-{name}"));
    ok(&format!("ext4kit get {name}"), ext4kit(&[&"get", &img, &"/", &ours]));
    let kernel = f.path(&format!("kernel-{name}"));
    if let Some(e) = kernel_tree(&back, &kernel, "ro").unwrap() {
        panic!("{name}: the kernel could not read everything: {e}");
    }
    let opts = CompareOpts {
        ignore_lost_found: true,
        ..Default::default()
    };
    let d = compare_trees(&kernel, &ours, &opts).unwrap();
    assert!(d.is_empty(), "{name}: kernel vs ours: {:?}", &d[..d.len().min(5)]);
    assert!(
        kernel.join("added/dir/hostname").is_file(),
        "{name}: the kernel does not see the put file"
    );
}

#[test]
fn cli_writes_through_every_writable_format_are_clean_and_kernel_readable() {
    let f = Fixture::new("write");
    let base = f.convert("base.qcow2", &["-O", "qcow2"]);
    let top = f.path("top.qcow2");
    run(
        "qemu-img create -b",
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2"])
            .arg(&top),
    );
    let base_before = std::fs::read(&base).unwrap();
    let images = [
        f.convert("w.qcow2", &["-O", "qcow2"]),
        f.convert("w-zlib.qcow2", &["-O", "qcow2", "-c"]),
        f.convert("w.vhd", &["-O", "vpc"]),
        f.convert("w-fixed.vhd", &["-O", "vpc", "-o", "subformat=fixed"]),
        f.convert("w.vhdx", &["-O", "vhdx"]),
        f.convert("w.vmdk", &["-O", "vmdk"]),
        top.clone(),
    ];
    for img in &images {
        let name = img.file_name().unwrap().to_string_lossy().into_owned();
        ok(&format!("mkdir {name}"), ext4kit(&[&"mkdir", img, &"/added"]));
        ok(&format!("mkdir {name}"), ext4kit(&[&"mkdir", img, &"/added/dir"]));
        let dest = format!("{}:/added/dir/hostname", img.display());
        ok(&format!("put {name}"), ext4kit(&[&"put", &"/etc/hostname", &dest]));
        ok(&format!("rm {name}"), ext4kit(&[&"rm", &"-r", img, &"/bigdir"]));
        check_written(&f, img);
    }
    assert!(std::fs::read(&base).unwrap() == base_before, "the backing file changed");
}

#[test]
fn the_read_write_mount_on_qcow2_vhd_and_vhdx_is_clean_and_kernel_readable() {
    ext4kit_testkit::require_root_and_fuse("the read-write mount of qcow2, VHD and VHDX images");
    let f = Fixture::new("mount");
    for img in [
        f.convert("m.qcow2", &["-O", "qcow2"]),
        f.convert("m.vhd", &["-O", "vpc"]),
    ] {
        let name = img.file_name().unwrap().to_string_lossy().into_owned();
        let mnt = f.path(&format!("mnt-{name}"));
        std::fs::create_dir_all(&mnt).unwrap();
        ok(&format!("mount {name}"), ext4kit(&[&"mount", &img, &mnt]));
        let wrote = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(mnt.join("added/dir"))?;
            std::fs::copy("/etc/hostname", mnt.join("added/dir/hostname"))?;
            std::fs::remove_dir_all(mnt.join("bigdir"))?;
            Ok(())
        })();
        ok(&format!("umount {name}"), ext4kit(&[&"umount", &mnt]));
        wrote.unwrap_or_else(|e| panic!("{name}: writing through the mount: {e}"));
        check_written(&f, &img);
    }
}

#[test]
fn mkfs_writes_straight_into_qcow2_vhdx_and_vhd() {
    let f = Fixture::new("mkfs");
    let src = f.path("src");
    for (name, format) in [("built.qcow2", "qcow2"), ("built.vhdx", "vhdx"), ("built.vhd", "vhd")] {
        let img = f.path(name);
        ok(
            &format!("mkfs --output-format {format}"),
            ext4kit(&[&"mkfs", &"--output-format", &format, &"-d", &src, &img]),
        );
        let info = ok("info --json", ext4kit(&[&"info", &"--json", &img]));
        let doc: serde_json::Value = serde_json::from_str(&info).unwrap();
        assert_eq!(doc["stack"][0]["format"], format, "{name}: {info}");
        // qemu-img's view: a clean image whose raw conversion e2fsck and
        // the kernel accept, holding the same tree mke2fs -d made.
        let fmt = qemu_format(name);
        if fmt != "vpc" {
            run(
                &format!("qemu-img check {name}"),
                Command::new("qemu-img").args(["check", "-f", fmt]).arg(&img),
            );
        }
        let back = f.path(&format!("{name}.raw"));
        run(
            "qemu-img convert",
            Command::new("qemu-img")
                .args(["convert", "-f", fmt, "-O", "raw"])
                .arg(&img)
                .arg(&back),
        );
        if let Err(e) = e2fsck_fn(&back).unwrap() {
            panic!("{name}: e2fsck -fn of its raw conversion: {e}");
        }
        let kernel = f.path(&format!("kernel-{name}"));
        if let Some(e) = kernel_tree(&back, &kernel, "ro").unwrap() {
            panic!("{name}: the kernel could not read everything: {e}");
        }
        let opts = CompareOpts {
            ignore_lost_found: true,
            ignore_root_attrs: true,
            ..Default::default()
        };
        let d = compare_trees(&src, &kernel, &opts).unwrap();
        assert!(
            d.is_empty(),
            "{name}: the source tree vs ours through the kernel: {:?}",
            &d[..d.len().min(5)]
        );
    }
    let e = ext4kit(&[&"mkfs", &"--output-format", &"vmdk", &"-d", &src, &f.path("x.vmdk")]);
    assert!(
        !e.status.success() && String::from_utf8_lossy(&e.stderr).contains("not created"),
        "{e:?}"
    );
}
