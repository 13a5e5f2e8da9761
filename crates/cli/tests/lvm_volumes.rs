//! LVM2 logical volumes through the CLI: a GPT disk whose two partitions
//! are PVs of a volume group made by the real LVM tools, with an ext4 in a
//! linear LV that spans both PVs, opened as `IMAGE@VG/LV` — raw and
//! converted to qcow2 (the stack qcow2 → GPT → LV → ext4). `info` lists
//! the volume; `get` gives the filesystem's tree; `mkdir` and `put`
//! through the LV leave a filesystem e2fsck finds clean and the kernel
//! reads with the change, at the place LVM's own report says the LV is.
//!
//! The kernel here has no device-mapper, so the LV is never activated:
//! the filesystem is placed and read back where `lvs`/`pvs` say its
//! extents are (ext4kit_testkit::lvm). Needs root, loop devices, lvm2,
//! gdisk and qemu-img; CI runs as root and .ci/run installs them.

use std::path::PathBuf;
use std::process::Output;

use ext4kit_testkit::journal::kernel_tree;
use ext4kit_testkit::lvm::{e2fsck_clean, filesystem, run, Lab, Layout};
use ext4kit_testkit::{compare_trees, CompareOpts};

mod building;
use building::{expect_ok as ok, ext4kit_env, need_kernel, need_tool};

fn ext4kit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    ext4kit_env(args, &[])
}

const MIB: u64 = 1 << 20;

#[test]
fn a_logical_volume_is_read_and_written_as_image_at_vg_lv() {
    need_kernel();
    need_tool("qemu-img", "qemu-utils");
    let mut lab = Lab::new("cli");
    std::fs::File::create(&lab.image).unwrap().set_len(64 * MIB).unwrap();
    let img = lab.image.to_str().unwrap().to_string();
    run("sgdisk", &["-n1:2048:+24M", "-t1:8e00", "-n2:0:+24M", "-t2:8e00", &img]);
    lab.attach();
    let (p1, p2) = (lab.part(1), lab.part(2));
    let vg = lab.vg.clone();
    lab.lvm(&["pvcreate", "-y", &p1, &p2]);
    lab.lvm(&["vgcreate", "-y", "-s", "1m", &vg, &p1, &p2]);
    let create: &[&str] = if lab.dm { &["-y"] } else { &["-an", "-Zn", "-Wn", "-y"] };
    let mut a = vec!["lvcreate", "-L", "16m", "-n", "root"];
    a.extend_from_slice(create);
    a.extend_from_slice(&[&vg, &p1]);
    lab.lvm(&a);
    // Grown onto the second PV: two segments on two partitions.
    lab.lvm(&["lvextend", "-L", "30m", &format!("{vg}/root"), &p2]);
    if lab.dm {
        lab.lvm(&["vgchange", "-an", &vg]);
    }
    let layout = Layout::of(&lab, "root");
    assert_eq!(layout.segs.len(), 2, "root should span both PVs: {:?}", layout.segs);
    let fs = filesystem(&lab, "root", 30 * MIB, 30 * MIB);
    layout.put(&lab, &fs);
    lab.detach();

    // What the filesystem holds, from its bytes alone.
    let fs_img = lab.dir.join("root.ext4");
    let want = lab.dir.join("want");
    ok("get of the bare filesystem", ext4kit(&[&"get", &fs_img, &"/", &want]));

    let spec = format!("{img}@{vg}/root");
    let info = ok("info", ext4kit(&[&"info", &lab.image]));
    assert!(
        info.contains(&format!("Volume group:     {vg}")) && info.contains("root"),
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

    // Writes through the LV.
    ok("mkdir", ext4kit(&[&"mkdir", &spec, &"/added"]));
    ok(
        "put",
        ext4kit(&[&"put", &"/etc/hostname", &format!("{spec}:/added/hostname")]),
    );
    lab.attach();
    let bytes = Layout::of(&lab, "root").get(&lab, 30 * MIB);
    lab.detach();
    e2fsck_clean(&lab, "root-after", &bytes);
    let back = lab.dir.join("root-after.check");
    let kernel = lab.dir.join("kernel");
    if let Some(e) = kernel_tree(&back, &kernel, "ro").unwrap() {
        panic!("the kernel could not read the written LV: {e}");
    }
    assert_eq!(
        std::fs::read(kernel.join("added/hostname")).unwrap(),
        std::fs::read("/etc/hostname").unwrap(),
        "the kernel reads the file put through the LV"
    );
}
