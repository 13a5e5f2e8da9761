//! The VM machinery itself (ext4kit_testkit::vm): Debian's kernel boots
//! with a disk and a script, the script's sections come back with their
//! exit statuses, a write the VM makes lands in the disk file, and
//! `list_tree` of an ext4 prints the same in the VM as on the host (both
//! through a kernel's ext4).
//!
//! Needs `.ci/vm-kernel` to have prepared the kernel and qemu; fails
//! saying so otherwise.

use std::process::Command;

use ext4kit_testkit::vm::{boot, list_tree, Kernel, VmRequest};
use ext4kit_testkit::LoopMount;

#[test]
fn a_script_runs_in_the_vm_and_writes_its_disk() {
    let kernel = Kernel::find().unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("ext4kit-vm-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Disk 1: an ext4 made by mke2fs -d from a tree that the host's
    // kernel lists too; disk 2: blank, for the VM to write.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/file"), b"hello from the host\n").unwrap();
    std::os::unix::fs::symlink("sub/file", tree.join("link")).unwrap();
    std::fs::hard_link(tree.join("sub/file"), tree.join("again")).unwrap();
    let setfattr = Command::new("setfattr")
        .args(["-n", "user.note", "-v", "kept"])
        .arg(tree.join("sub"))
        .status()
        .expect("setfattr (Debian package attr)");
    assert!(setfattr.success());
    let fs_img = dir.join("fs.img");
    std::fs::File::create(&fs_img).unwrap().set_len(8 << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(&fs_img)
        .status()
        .unwrap();
    assert!(mkfs.success());
    let disk = dir.join("blank.img");
    std::fs::File::create(&disk).unwrap().set_len(4 << 20).unwrap();

    let script = r#"
section release uname -r
section failing sh -c 'echo to stderr >&2; exit 3'
mkdir /t && mount -o ro /dev/vda /t
section tree list_tree /t
umount /t
printf 'written by the VM' | dd of=/dev/vdb bs=512 seek=4096 conv=notrunc 2>/dev/null
"#;
    let run = boot(&VmRequest {
        work_dir: &dir,
        disks: &[&fs_img, &disk],
        programs: &["getfattr"],
        modules: &[],
        files: &[],
        script,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "VM boot and script: {:.1} s ({:?})",
        run.elapsed().as_secs_f64(),
        run.accel()
    );
    assert_eq!(run.status(), 0, "{}", run.console_tail());
    assert_eq!(run.section_ok("release").unwrap().trim(), kernel.release());
    let failing = run.section("failing").unwrap();
    assert_eq!((failing.status, failing.output.as_str()), (3, "to stderr\n"));
    assert!(run.section("absent").is_err());

    // The host's kernel lists the same filesystem the same way: modes,
    // owners, times, links, hashes, xattrs.
    let mnt = dir.join("mnt");
    let m = LoopMount::mount(&fs_img, &mnt, "ext4", true).unwrap();
    let ours = list_tree(&kernel, m.path());
    m.unmount().unwrap();
    let ours = ours.unwrap();
    assert_eq!(run.section_ok("tree").unwrap(), ours);
    for line in [
        "./link a1ff 0 0 1 8 ",
        "-> sub/file",
        "./sub xattr user.note=0x6b657074",
        "./sub/file 81a4 0 0 2 20 ",
    ] {
        assert!(ours.contains(line), "{line:?} is not in\n{ours}");
    }

    let after = std::fs::read(&disk).unwrap();
    assert_eq!(&after[4096 * 512..4096 * 512 + 17], b"written by the VM");
    std::fs::remove_dir_all(&dir).unwrap();
}
