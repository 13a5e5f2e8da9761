//! What the image-building tests (`build_tar`, `build_oci`, `build_size`,
//! `build_labels`) share: a scratch directory the unprivileged builder may
//! write in, the checks that say loudly why a test cannot run, and running
//! `ext4kit` as uid 65534.

#![allow(dead_code)] // each test binary uses its own part

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The unprivileged builder: uid and gid 65534 (nobody, nogroup).
pub const NOBODY: u32 = 65534;

/// A fresh scratch directory, writable by everyone (the builder writes
/// its image there).
pub fn workdir(test: &str, tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-{test}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o777)).unwrap();
    w
}

/// The kernel reads the images back (loop mounts): fail loudly without it.
pub fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test reads images back with the kernel (loop mount): {e}; CI runs as root");
    }
}

/// Root makes the fixtures (owners, devices) and the kernel reads back.
pub fn need_root_and_kernel() {
    if !rustix::process::geteuid().is_root() {
        panic!("this test builds its fixtures as root (owners, devices) and runs the build as uid {NOBODY}; CI runs as root");
    }
    need_kernel();
}

/// A tool from a Debian package the comparison needs.
pub fn need_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        panic!("this test compares with {tool} ({package}), which is not installed; .ci/run installs it");
    }
}

/// `ext4kit ARGS` as uid/gid 65534 with no supplementary groups, at a
/// fixed SOURCE_DATE_EPOCH.
pub fn ext4kit_as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_ext4kit"))
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .expect("setpriv (util-linux) runs")
}

/// The same, which must succeed.
pub fn ok_as_nobody(args: &[&str]) {
    let o = ext4kit_as_nobody(args);
    assert!(
        o.status.success(),
        "ext4kit {args:?} as uid {NOBODY} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Run a command that must succeed; its standard output and error.
pub fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A path as the `&str` a command line takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ext4kit mkfs ARGS` (as the caller), which must succeed; the image at
/// `img` checked by e2fsck and mounted read-only by the kernel at
/// `work/mnt`.
pub fn mkfs_and_mount(work: &Path, args: &[&str], img: &Path) -> ext4kit_testkit::LoopMount {
    run(Command::new(env!("CARGO_BIN_EXE_ext4kit")).arg("mkfs").args(args));
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    ext4kit_testkit::LoopMount::mount(img, &mnt, "ext4", true).unwrap()
}

/// `ext4kit ARGS` as the caller, at a fixed SOURCE_DATE_EPOCH.
pub fn ext4kit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap()
}

/// The same, which must succeed: its standard output and error (notes
/// go to standard error).
pub fn ok(args: &[&str]) -> String {
    let o = ext4kit(args);
    assert!(
        o.status.success(),
        "ext4kit {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// `ext4kit ARGS` (paths or strings) with `env` added and no standard
/// input, the binary `EXT4KIT_BIN` names if set: the form the disk-format,
/// LVM and remote-image tests use.
pub fn ext4kit_env(args: &[&dyn AsRef<std::ffi::OsStr>], env: &[(&str, String)]) -> Output {
    let mut c = Command::new(ext4kit_testkit::ext4kit_bin(env!("CARGO_BIN_EXE_ext4kit")));
    for a in args {
        c.arg(a);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(std::process::Stdio::null()).output().expect("run ext4kit")
}

/// A run that must succeed (`what` names it in the failure, with both
/// outputs): its standard output.
pub fn expect_ok(what: &str, o: Output) -> String {
    assert!(
        o.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
