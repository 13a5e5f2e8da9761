//! LVM2 logical volumes through the CLI: a GPT disk whose two partitions
//! are PVs of a volume group made by the real LVM tools (Debian's lvm2 on
//! a loop device), with an ext4 in a linear LV that spans both PVs and
//! another in a two-stripe LV, opened as `IMAGE@VG/LV` — raw and
//! converted to qcow2 (the stack qcow2 → GPT → LV → ext4). `info` lists
//! the volumes; `get` gives the filesystem's tree; then ext4kit writes
//! through the LVs (a tree of every kind of file put in, mkdir, rm, mv,
//! ln, chmod, chown, setfattr).
//!
//! The judge is a kernel with device-mapper: a VM (ext4kit_testkit::vm,
//! Debian's kernel; the host's has no device-mapper) activates the VG
//! with `vgchange -ay`, finds both filesystems clean with `e2fsck -fn
//! /dev/VG/LV`, and lists both trees from read-only mounts — names,
//! modes, owners, link counts, sizes, times, SHA-256 of contents, symlink
//! targets, xattrs. The listings must equal what ext4kit reads: the same
//! listing, by the same busybox and getfattr, of `ext4kit mount -o ro
//! IMAGE@VG/LV`. Then the VM's kernel writes into the linear LV (files,
//! links, xattrs, a rename, a removal); e2fsck there finds it clean, and
//! ext4kit reads the kernel's tree exactly as the kernel lists it.
//!
//! Needs root, loop devices, FUSE, lvm2, gdisk, qemu-img, attr and the VM
//! kernel (`.ci/vm-kernel`); CI runs as root and .ci/run installs them.

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use ext4kit_testkit::lvm::{e2fsck_clean, filesystem, run, Lab, Layout, CREATE_INACTIVE};
use ext4kit_testkit::vm::{list_tree, Kernel};
use ext4kit_testkit::{compare_trees, CompareOpts};

mod building;
use building::{expect_ok as ok, ext4kit_env, need_tool};

fn ext4kit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    ext4kit_env(args, &[])
}

const MIB: u64 = 1 << 20;

/// What ext4kit reads of `spec`: the VM's listing of it, made on the host
/// over `ext4kit mount -o ro SPEC` by the same busybox and getfattr.
fn ext4kit_listing(kernel: &Kernel, spec: &str, mnt: &Path) -> String {
    std::fs::create_dir_all(mnt).unwrap();
    ok("mount -o ro", ext4kit(&[&"mount", &"-o", &"ro", &spec, &mnt]));
    let listing = list_tree(kernel, mnt);
    ok("umount", ext4kit(&[&"umount", &mnt]));
    listing.unwrap_or_else(|e| panic!("{e}"))
}

/// The two listings are the same; otherwise the lines only one has.
fn same_listing(what: &str, kernel_side: &str, ours: &str) {
    if kernel_side == ours {
        return;
    }
    let k: Vec<&str> = kernel_side.lines().collect();
    let o: Vec<&str> = ours.lines().collect();
    let only_k: Vec<_> = k.iter().filter(|l| !o.contains(l)).collect();
    let only_o: Vec<_> = o.iter().filter(|l| !k.contains(l)).collect();
    panic!("{what}: the kernel's listing and ext4kit's differ\nonly the kernel's:\n{only_k:#?}\nonly ext4kit's:\n{only_o:#?}");
}

/// A source tree with every kind of file `put` copies: sizes around a
/// block, a sparse file, hard links, fast and slow symlinks, special
/// modes, another owner, a fifo, a device, xattrs in the inode and in a
/// block of their own; `gone/` is removed again after the put.
fn source_tree(root: &Path) {
    let p = |rel: &str| root.join(rel);
    for d in [
        "docs",
        "data",
        "links",
        "modes/sticky",
        "modes/private",
        "special",
        "gone/deep",
    ] {
        std::fs::create_dir_all(p(d)).unwrap();
    }
    std::fs::write(p("docs/readme.txt"), "put through an LVM2 logical volume\n").unwrap();
    std::fs::write(p("docs/empty"), "").unwrap();
    std::fs::write(p("docs/one-block"), vec![b'b'; 4096]).unwrap();
    let big: Vec<u8> = (0..700_001u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(p("data/big.bin"), &big).unwrap();
    std::fs::hard_link(p("data/big.bin"), p("data/big-again.bin")).unwrap();
    let sparse = std::fs::File::create(p("data/sparse")).unwrap();
    sparse.set_len(3 * MIB).unwrap();
    sparse.write_all_at(b"start", 0).unwrap();
    sparse.write_all_at(b"end", 3 * MIB - 3).unwrap();
    std::os::unix::fs::symlink("../docs/readme.txt", p("links/short")).unwrap();
    std::os::unix::fs::symlink(format!("{}target", "long/".repeat(30)), p("links/long")).unwrap();
    std::os::unix::fs::symlink("nowhere", p("links/dangling")).unwrap();
    std::fs::write(p("modes/setuid"), "#!/bin/sh\n").unwrap();
    std::fs::write(p("modes/private/key"), "secret\n").unwrap();
    std::fs::write(p("gone/deep/file"), "removed again\n").unwrap();
    for (rel, mode) in [
        ("modes/setuid", 0o4755),
        ("modes/sticky", 0o1777),
        ("modes/private", 0o700),
        ("modes/private/key", 0o600),
    ] {
        std::fs::set_permissions(p(rel), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::write(p("docs/owned"), "not root's\n").unwrap();
    rustix::fs::chown(
        p("docs/owned"),
        Some(rustix::fs::Uid::from_raw(1234)),
        Some(rustix::fs::Gid::from_raw(5678)),
    )
    .unwrap();
    run("mkfifo", &[p("special/fifo").to_str().unwrap()]);
    run("mknod", &[p("special/null").to_str().unwrap(), "c", "1", "3"]);
    // The filesystems have 1 KiB blocks: a value that needs a block of its own.
    let big_value = "v".repeat(700);
    for (rel, name, value) in [
        ("docs/readme.txt", "user.note", "in the inode"),
        ("data/big.bin", "user.big", big_value.as_str()),
        ("docs", "trusted.dir", "root only"),
        ("links/short", "trusted.on-a-link", "yes"),
    ] {
        run("setfattr", &["-h", "-n", name, "-v", value, p(rel).to_str().unwrap()]);
    }
}

#[test]
fn a_logical_volume_is_read_and_written_as_image_at_vg_lv() {
    need_tool("qemu-img", "qemu-utils");
    need_tool("setfattr", "attr");
    let kernel = Kernel::find().unwrap_or_else(|e| panic!("{e}"));
    let mut lab = Lab::new("cli");
    std::fs::File::create(&lab.image).unwrap().set_len(64 * MIB).unwrap();
    let img = lab.image.to_str().unwrap().to_string();
    run("sgdisk", &["-n1:2048:+24M", "-t1:8e00", "-n2:0:+24M", "-t2:8e00", &img]);
    lab.attach();
    let (p1, p2) = (lab.part(1), lab.part(2));
    let vg = lab.vg.clone();
    lab.lvm(&["pvcreate", "-y", &p1, &p2]);
    lab.lvm(&["vgcreate", "-y", "-s", "1m", &vg, &p1, &p2]);
    let mut a = vec!["lvcreate", "-L", "16m", "-n", "root"];
    a.extend_from_slice(&CREATE_INACTIVE);
    a.extend_from_slice(&[&vg, &p1]);
    lab.lvm(&a);
    let mut a = vec!["lvcreate", "-L", "8m", "-i", "2", "-I", "64k", "-n", "str"];
    a.extend_from_slice(&CREATE_INACTIVE);
    a.push(&vg);
    lab.lvm(&a);
    // Grown onto the second PV: two segments on two partitions.
    lab.lvm(&["lvextend", "-L", "30m", &format!("{vg}/root"), &p2]);
    let layout = Layout::of(&lab, "root");
    assert_eq!(layout.segs.len(), 2, "root should span both PVs: {:?}", layout.segs);
    let str_layout = Layout::of(&lab, "str");
    assert_eq!(str_layout.segs[0].ranges.len(), 2, "str should have two stripes");
    let fs = filesystem(&lab, "root", 30 * MIB, 30 * MIB);
    layout.put(&lab, &fs);
    str_layout.put(&lab, &filesystem(&lab, "str", 8 * MIB, 8 * MIB));
    lab.detach();

    // What the filesystem holds, from its bytes alone.
    let fs_img = lab.dir.join("root.ext4");
    let want = lab.dir.join("want");
    ok("get of the bare filesystem", ext4kit(&[&"get", &fs_img, &"/", &want]));

    let spec = format!("{img}@{vg}/root");
    let str_spec = format!("{img}@{vg}/str");
    let info = ok("info", ext4kit(&[&"info", &lab.image]));
    assert!(
        info.contains(&format!("Volume group:     {vg}")) && info.contains("root") && info.contains("str"),
        "info:\n{info}"
    );
    let refusal = ext4kit(&[&"ls", &lab.image, &"/"]);
    assert!(!refusal.status.success());
    assert!(
        String::from_utf8_lossy(&refusal.stderr).contains(&format!("{vg}/root")),
        "{refusal:?}"
    );

    let got = lab.dir.join("got");
    ok("get IMAGE@VG/LV", ext4kit(&[&"get", &spec, &"/", &got]));
    let same = |what: &str, a: &PathBuf, b: &PathBuf| {
        let d = compare_trees(a, b, &CompareOpts::default()).unwrap();
        assert!(d.is_empty(), "{what}: {:?}", &d[..d.len().min(5)]);
    };
    same("get IMAGE@VG/LV", &want, &got);

    // The same disk as qcow2: container, then the GPT, then the LV.
    let q = lab.dir.join("disk.qcow2");
    run("qemu-img", &["convert", "-O", "qcow2", &img, q.to_str().unwrap()]);
    let got_q = lab.dir.join("got-qcow2");
    ok(
        "get through qcow2",
        ext4kit(&[&"get", &format!("{}@{vg}/root", q.display()), &"/", &got_q]),
    );
    same("get through qcow2", &want, &got_q);
    let via_option = ok(
        "ls --lv",
        ext4kit(&[&"ls", &"--lv", &format!("{vg}/root"), &q, &"/etc"]),
    );
    assert!(via_option.contains("hostname"), "{via_option}");
    std::fs::remove_file(&q).unwrap();

    // Writes through the LVs.
    let src = lab.dir.join("tree-src");
    source_tree(&src);
    for s in [&spec, &str_spec] {
        ok("put", ext4kit(&[&"put", &src, &format!("{s}:/tree")]));
        ok("rm", ext4kit(&[&"rm", &s, &"/blob"]));
        ok("rm -r", ext4kit(&[&"rm", &"-r", &s, &"/tree/gone"]));
    }
    ok("mkdir -p", ext4kit(&[&"mkdir", &"-p", &spec, &"/made/deeper"]));
    ok(
        "put a file",
        ext4kit(&[&"put", &"/etc/hostname", &format!("{spec}:/made/hostname")]),
    );
    ok(
        "ln -s",
        ext4kit(&[&"ln", &"-s", &spec, &"/tree/docs/readme.txt", &"/made/to-readme"]),
    );
    ok("mv", ext4kit(&[&"mv", &spec, &"/etc/hostname", &"/etc/hostname.moved"]));
    ok("chmod", ext4kit(&[&"chmod", &spec, &"0750", &"/made/deeper"]));
    ok("chown", ext4kit(&[&"chown", &spec, &"42:43", &"/made/hostname"]));
    ok(
        "setfattr",
        ext4kit(&[
            &"setfattr",
            &spec,
            &"-n",
            &"user.added",
            &"-v",
            &"through the LV",
            &"/made",
        ]),
    );

    // What ext4kit reads now, listed over its own read-only mounts.
    let mnt = lab.dir.join("mnt");
    let ours_root = ext4kit_listing(&kernel, &spec, &mnt);
    let ours_str = ext4kit_listing(&kernel, &str_spec, &mnt);
    for line in [
        "./tree/data/big.bin 81a4 0 0 2 700001 ",
        "./tree/docs/owned 81a4 1234 5678 1 ",
        "./tree/modes/setuid 89ed ",
        "./tree/modes/sticky 43ff ",
        "./tree/links/short xattr trusted.on-a-link=0x796573",
        "./made xattr user.added=",
        "-> /tree/docs/readme.txt",
    ] {
        assert!(ours_root.contains(line), "{line:?} is not in\n{ours_root}");
    }
    assert!(
        ours_root
            .lines()
            .any(|l| l.starts_with("./tree/special/null 21a4 0 0 1 0 ") && l.contains(" 1:3 ")),
        "{ours_root}"
    );
    assert!(
        ours_root
            .lines()
            .any(|l| l.starts_with("./made/hostname 81") && l.contains(" 42 43 1 ")),
        "{ours_root}"
    );
    assert!(!ours_root.contains("./blob ") && !ours_root.contains("./tree/gone"));

    // The kernel's view: device-mapper activates the VG; e2fsck on the
    // LVs; the trees listed; then the kernel writes into root.
    let script = format!(
        r#"
section activate lvm vgchange -ay {vg}
section fsck-root e2fsck -fn /dev/{vg}/root
section fsck-str e2fsck -fn /dev/{vg}/str
mkdir -p /mnt/root /mnt/str
section mount sh -c 'mount -o ro /dev/{vg}/root /mnt/root && mount -o ro /dev/{vg}/str /mnt/str'
section list-root list_tree /mnt/root
section list-str list_tree /mnt/str
section umount umount /mnt/root /mnt/str
section kernel-writes sh -ec '
  mount /dev/{vg}/root /mnt/root
  cd /mnt/root
  mkdir from-vm
  echo "written by the VM kernel" >from-vm/hello
  dd if=/dev/zero bs=4096 count=300 2>/dev/null | tr "\0" k >from-vm/big
  ln from-vm/hello tree/hello-link
  ln -s ../tree/docs from-vm/docs-link
  setfattr -n user.vm -v kernel from-vm/hello
  mv tree/docs/readme.txt from-vm/readme.txt
  rm tree/data/big.bin
  chmod 0640 from-vm/hello
  touch -d "2001-02-03 04:05:06" from-vm/big
  cd /
  umount /mnt/root'
section fsck-after e2fsck -fn /dev/{vg}/root
section mount-after mount -o ro /dev/{vg}/root /mnt/root
section list-after list_tree /mnt/root
section umount-after umount /mnt/root
section deactivate lvm vgchange -an {vg}
"#
    );
    let vm = lab.boot_vm(&[], &script);
    let vm_ok = |name: &str| vm.section_ok(name).unwrap_or_else(|e| panic!("{e}"));
    vm_ok("activate");
    let fsck_root = vm_ok("fsck-root");
    assert!(fsck_root.contains(&format!("/dev/{vg}/root: ")), "{fsck_root}");
    vm_ok("fsck-str");
    vm_ok("mount");
    same_listing("root after ext4kit's writes", &vm_ok("list-root"), &ours_root);
    same_listing("str after ext4kit's writes", &vm_ok("list-str"), &ours_str);
    vm_ok("umount");
    vm_ok("kernel-writes");
    vm_ok("fsck-after");
    vm_ok("mount-after");
    let kernel_after = vm_ok("list-after");
    vm_ok("umount-after");
    vm_ok("deactivate");

    // What the kernel wrote, read by ext4kit.
    let hello = ok("cat", ext4kit(&[&"cat", &spec, &"/from-vm/hello"]));
    assert_eq!(hello, "written by the VM kernel\n");
    let ours_after = ext4kit_listing(&kernel, &spec, &mnt);
    assert_ne!(ours_after, ours_root, "the kernel's writes are not seen");
    for line in [
        "./from-vm/hello 81a0 0 0 2 25 ",
        "./from-vm/hello xattr user.vm=0x6b65726e656c",
        "./from-vm/big 81a4 0 0 1 1228800 981173106 ",
    ] {
        assert!(ours_after.contains(line), "{line:?} is not in\n{ours_after}");
    }
    same_listing("root after the kernel's writes", &kernel_after, &ours_after);

    // And e2fsck on the host, over the bytes where LVM says the LV is.
    lab.attach();
    let bytes = Layout::of(&lab, "root").get(&lab, 30 * MIB);
    lab.detach();
    e2fsck_clean(&lab, "root-after", &bytes);

    // Two LVs of one disk are two filesystems: while root is mounted, a
    // mount of str is refused (one server per image file), never bound to
    // root's mount (which would show root's tree under str's name).
    let (m1, m2) = (lab.dir.join("m-root"), lab.dir.join("m-str"));
    std::fs::create_dir_all(&m1).unwrap();
    std::fs::create_dir_all(&m2).unwrap();
    ok("mount root", ext4kit(&[&"mount", &"-o", &"ro", &spec, &m1]));
    let second = ext4kit(&[&"mount", &"-o", &"ro", &str_spec, &m2]);
    let shows_root = m2.join("from-vm").exists();
    ok("umount root", ext4kit(&[&"umount", &m1]));
    if second.status.success() {
        let _ = ext4kit(&[&"umount", &m2]);
    }
    assert!(!shows_root, "the mount of {str_spec} shows root's tree");
    assert!(
        !second.status.success(),
        "a second LV of a mounted image was mounted: {second:?}"
    );
    let why = String::from_utf8_lossy(&second.stderr);
    assert!(
        why.contains(&format!("logical volume {vg}/root")) && why.contains(&format!("logical volume {vg}/str")),
        "the refusal names both volumes: {why}"
    );

    // mkfs onto an LV (the striped one): the volume is the filesystem's
    // device, filled from a tree; e2fsck over LVM's extents is clean.
    let made = lab.dir.join("made-src");
    std::fs::create_dir_all(made.join("etc")).unwrap();
    std::fs::write(made.join("etc/os-release"), b"ID=lvtest\n").unwrap();
    std::fs::write(made.join("data.bin"), vec![0x5au8; 300_000]).unwrap();
    ok(
        "mkfs -d IMAGE@VG/LV",
        ext4kit(&[&"mkfs", &"-q", &"-d", &made, &str_spec]),
    );
    let got_made = lab.dir.join("got-made");
    ok("get after mkfs", ext4kit(&[&"get", &str_spec, &"/", &got_made]));
    let opts = CompareOpts {
        ignore_lost_found: true,
        ignore_root_attrs: true,
        ..CompareOpts::default()
    };
    let d = compare_trees(&made, &got_made, &opts).unwrap();
    assert!(d.is_empty(), "mkfs onto the LV: {:?}", &d[..d.len().min(5)]);
    lab.attach();
    let bytes = Layout::of(&lab, "str").get(&lab, 8 * MIB);
    lab.detach();
    e2fsck_clean(&lab, "str-mkfs", &bytes);
}
