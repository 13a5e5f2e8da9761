//! The filesystem rules the engine applies itself — the ones a frontend
//! used to apply on its own — checked by calling the library directly and
//! comparing with the kernel's ext4 on a loop mount of an identical image:
//!
//! - a write, or a truncation, by someone other than the owner clears
//!   setuid (and setgid with group execute, or for an outsider) and a file
//!   capability (`file_remove_privs`);
//! - an append-only file refuses an overwrite and a truncation (EPERM) but
//!   takes appends, a positioned write through an O_APPEND file included;
//! - a write to a synchronous file (`chattr +S`), and a directory change
//!   in a dirsync directory (`chattr +D`), are durable when the call
//!   returns: the crash image a power cut right then leaves (the recording
//!   device's, for the library; a copy of the kernel's image file taken
//!   before the unmount, for the kernel) holds them;
//! - a default ACL is inherited at create: the new file's and directory's
//!   modes and ACL xattrs equal the kernel's.
//!
//! Every library image is e2fsck-clean afterwards.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit::device::{BlockDevice, MemDevice};
use ext4kit::vfs::acl_inherit::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME};
use ext4kit::vfs::file::{O_APPEND, O_WRONLY};
use ext4kit::vfs::iflags::flags as fl;
use ext4kit::vfs::killpriv::CAPABILITY;
use ext4kit::{Caller, CreateMode, Cred, FileType, Fs, OpenFlags, OpenOptions, SetAttr, WriteAt, WriteRequest};
use ext4kit_blockdev::RecordingDevice;
use ext4kit_testkit::mountpeer::{assert_same_observations, mkfs_ext4};
use ext4kit_testkit::{e2fsck_clean, kernel_available, run_ok, sh_as, LoopMount};

/// Observations of one scenario, one line each: the kernel's and the
/// library's must be equal.
type Log = Vec<String>;

const NOBODY: u32 = 65534;

fn need_kernel() {
    if let Err(e) = kernel_available() {
        panic!("the kernel comparison needs a loop mount ({e}); CI runs as root");
    }
}

fn workdir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("kernel_rules")
        .join(tag);
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh 64 MiB ext4 image at `path` (fixed UUID and hash seed: two are
/// identical).
fn image(path: &Path) {
    mkfs_ext4(path, 64, &[]).unwrap_or_else(|e| panic!("{e}"));
}

fn open_rw(img: &Path) -> Arc<Fs> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn fsck_clean(img: &Path) {
    e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
}

/// Run `kernel` on a kernel loop mount of a fresh image (given the mount
/// point) and `ours` on the library over an identical image, and require
/// the same observations and an e2fsck-clean image from the library
/// (`EXT4KIT_RULES_SHOW=1` prints the kernel's).
fn same_as_kernel(tag: &str, kernel: impl FnOnce(&Path) -> Log, ours: impl FnOnce(&Fs) -> Log) {
    need_kernel();
    let work = workdir(tag);
    let kimg = work.join("kernel.img");
    image(&kimg);
    let k = {
        let m = LoopMount::mount(&kimg, &work.join("mnt"), "ext4", false).unwrap();
        let log = kernel(m.path());
        m.unmount().unwrap();
        log
    };
    let img = work.join("ext4kit.img");
    image(&img);
    let o = {
        let fs = open_rw(&img);
        let log = ours(&fs);
        fs.sync().unwrap();
        log
    };
    fsck_clean(&img);
    assert_same_observations(tag, &k, &o, "EXT4KIT_RULES_SHOW");
    let _ = fs::remove_dir_all(&work);
}

/// One attribute of `p` through the kernel (`None`: it has none).
fn kernel_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let o = Command::new("getfattr")
        .args(["--absolute-names", "-e", "hex", "-n", name])
        .arg(p)
        .output()
        .unwrap();
    if !o.status.success() {
        return None;
    }
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let v = out
        .lines()
        .find_map(|l| l.split_once('='))
        .map(|(_, v)| v.to_string())?;
    let v = v.trim().strip_prefix("0x").unwrap_or(v.trim()).to_string();
    Some(
        (0..v.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
            .collect(),
    )
}

fn set_kernel_xattr(p: &Path, name: &str, v: &[u8]) {
    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
    run_ok(
        Command::new("setfattr")
            .args(["-n", name, "-v", &format!("0x{hex}")])
            .arg(p),
        &[0],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn hex(v: Option<Vec<u8>>) -> String {
    match v {
        Some(v) => v.iter().map(|b| format!("{b:02x}")).collect(),
        None => "none".into(),
    }
}

fn perm_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn lib_errno<T>(r: ext4kit::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {}", e.errno() as i32),
    }
}

/// A file capability (v2, cap_net_raw permitted and effective).
fn capability() -> Vec<u8> {
    let mut cap = 0x0200_0001u32.to_le_bytes().to_vec();
    cap.extend_from_slice(&(1u32 << 13).to_le_bytes());
    cap.extend_from_slice(&[0; 12]);
    cap
}

/// The start modes of the killpriv scenario: setuid always goes, setgid
/// with group execute, or (0o2767) for a writer outside the file's group.
const START_MODES: [u32; 4] = [0o6777, 0o4777, 0o2777, 0o2767];

/// The changes of the killpriv scenario: a non-owner's (or root's) write
/// and truncation, as the shell makes them on the kernel's side.
const CHANGES: [(&str, &str); 2] = [("write", "printf x >> f"), ("truncate", "truncate -s 1 f")];

#[test]
fn a_non_owner_write_or_truncation_clears_setuid_and_capabilities_like_the_kernel() {
    let kernel = |d: &Path| {
        let mut log = Log::new();
        for (op, script) in CHANGES {
            for start in START_MODES {
                for uid in [NOBODY, 0] {
                    let f = d.join("f");
                    fs::write(&f, vec![1u8; 6000]).unwrap();
                    fs::set_permissions(&f, fs::Permissions::from_mode(start)).unwrap();
                    let code = sh_as(uid, d, script);
                    log.push(format!(
                        "{op} as {uid} on {start:o}: exit {code}, mode {:o}",
                        perm_of(&f)
                    ));
                    fs::remove_file(&f).unwrap();
                }
            }
            for uid in [NOBODY, 0] {
                let c = d.join("f");
                fs::write(&c, b"data").unwrap();
                fs::set_permissions(&c, fs::Permissions::from_mode(0o666)).unwrap();
                set_kernel_xattr(&c, "security.capability", &capability());
                let code = sh_as(uid, d, script);
                log.push(format!(
                    "{op} as {uid} of a file with a capability: exit {code}, capability {}",
                    hex(kernel_xattr(&c, "security.capability"))
                ));
                fs::remove_file(&c).unwrap();
            }
        }
        log
    };
    // The library, with the same callers: an open by them, then the file's
    // write or ftruncate.
    let ours = |fs: &Fs| {
        let mut log = Log::new();
        let root = Cred::root();
        for (op, _) in CHANGES {
            let change = |cred: &Cred| -> ext4kit::Result<()> {
                let f = fs.open_as(b"/f", OpenFlags::from_bits(O_WRONLY | O_APPEND), 0, cred)?;
                let r = match op {
                    "write" => f.write(fs, b"x").map(drop),
                    _ => f.ftruncate(fs, 1),
                };
                fs.close_file(f)?;
                r
            };
            let code = |r: ext4kit::Result<()>| if r.is_ok() { 0 } else { 1 };
            for start in START_MODES {
                for uid in [NOBODY, 0] {
                    let st = fs.write_file(b"/f", &[1u8; 6000], 0o644, 0, 0).unwrap();
                    let mode = SetAttr {
                        mode: Some(start as u16),
                        ..SetAttr::default()
                    };
                    fs.setattr_ino(st.ino, &mode, &root).unwrap();
                    let code = code(change(&Cred::user(uid, uid)));
                    let now = fs.stat(b"/f").unwrap().perm();
                    log.push(format!("{op} as {uid} on {start:o}: exit {code}, mode {now:o}"));
                    fs.unlink(b"/f", &root).unwrap();
                }
            }
            for uid in [NOBODY, 0] {
                let st = fs.write_file(b"/f", b"data", 0o666, 0, 0).unwrap();
                fs.setxattr_ino(st.ino, CAPABILITY, &capability(), 0, &root).unwrap();
                let code = code(change(&Cred::user(uid, uid)));
                let cap = fs.getxattr_ino(st.ino, CAPABILITY, &root).ok();
                log.push(format!(
                    "{op} as {uid} of a file with a capability: exit {code}, capability {}",
                    hex(cap)
                ));
                fs.unlink(b"/f", &root).unwrap();
            }
        }
        log
    };
    same_as_kernel("killpriv", kernel, ours);
}

#[test]
fn an_append_only_file_refuses_an_overwrite_but_takes_appends_like_the_kernel() {
    let kernel = |d: &Path| {
        let mut log = Log::new();
        let f = d.join("f");
        fs::write(&f, b"abc").unwrap();
        run_ok(Command::new("chattr").arg("+a").arg(&f), &[0]).unwrap();
        // An overwrite needs an opener without O_APPEND: refused at open.
        log.push(format!(
            "overwrite: {}",
            errno_of(fs::OpenOptions::new().write(true).open(&f))
        ));
        let a = fs::OpenOptions::new().append(true).open(&f).unwrap();
        log.push(format!("append: {}", errno_of((&a).write_all(b"def"))));
        // pwrite on an O_APPEND file appends on Linux.
        log.push(format!("positioned append: {}", errno_of(a.write_at(b"g", 0))));
        log.push(format!("truncate: {}", errno_of(a.set_len(1))));
        drop(a);
        log.push(format!("contents: {}", String::from_utf8_lossy(&fs::read(&f).unwrap())));
        run_ok(Command::new("chattr").arg("-a").arg(&f), &[0]).unwrap();
        log
    };
    let ours = |fs: &Fs| {
        let mut log = Log::new();
        let root = Cred::root();
        let st = fs.write_file(b"/f", b"abc", 0o644, 0, 0).unwrap();
        let flags = fs.get_flags_ino(st.ino).unwrap();
        fs.set_flags_ino(st.ino, flags | fl::APPEND, &root).unwrap();
        // The library's overwrite: a write at an offset, on the inode.
        let inode = fs.inode(st.ino).unwrap();
        let over = fs.write_inode(
            &inode,
            &WriteRequest {
                at: WriteAt::Offset(0),
                ..WriteRequest::new(b"x", Caller::root())
            },
        );
        log.push(format!("overwrite: {}", lib_errno(over)));
        let a = fs
            .open_as(b"/f", OpenFlags::from_bits(O_WRONLY | O_APPEND), 0, &root)
            .unwrap();
        log.push(format!("append: {}", lib_errno(a.write(fs, b"def"))));
        log.push(format!("positioned append: {}", lib_errno(a.pwrite(fs, 0, b"g"))));
        log.push(format!("truncate: {}", lib_errno(a.ftruncate(fs, 1))));
        fs.close_file(a).unwrap();
        let mut buf = vec![0u8; 64];
        let n = fs
            .open(b"/f", OpenFlags::default())
            .unwrap()
            .read(fs, &mut buf)
            .unwrap();
        log.push(format!("contents: {}", String::from_utf8_lossy(&buf[..n])));
        // The open refuses what the kernel's open refuses.
        let e = fs.open_as(b"/f", OpenFlags::from_bits(O_WRONLY), 0, &root);
        assert_eq!(lib_errno(e), "errno 1", "a non-appending open of an append-only file");
        fs.set_flags_ino(st.ino, flags, &root).unwrap();
        log
    };
    same_as_kernel("append-only", kernel, ours);
}

/// The crash image a power cut leaves right after `op` returned: every
/// write before the last flush the device completed by then, nothing
/// after (what a volatile disk cache may lose, all of it lost). `setup`
/// prepares the filesystem (and is made durable before `op`); `check`
/// reads the crash image.
fn crash_image_after(
    base: &[u8],
    setup: impl FnOnce(&Fs),
    op: impl FnOnce(&Fs),
    check: impl FnOnce(&Fs) -> String,
) -> String {
    let mem = Arc::new(MemDevice::from_vec(base.to_vec()));
    let rec = Arc::new(RecordingDevice::new(mem));
    let dev: Arc<dyn BlockDevice> = rec.clone();
    let fs = Fs::open_device(
        dev,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    setup(&fs);
    fs.sync().unwrap();
    op(&fs);
    let end = rec.position() as usize;
    let log = rec.take_log();
    let last_flush = log.entries()[..end]
        .iter()
        .rposition(|e| e.is_flush())
        .expect("the setup's sync flushed");
    let cut = log.flush_cut(last_flush).unwrap();
    let img = log.image(base, &cut).unwrap();
    drop(fs);
    // The crash image opens (its journal replayed in memory) and is read.
    let crashed = Fs::open_device(Arc::new(MemDevice::from_vec(img)), &OpenOptions::default()).unwrap();
    check(&crashed)
}

/// Read `path` of the filesystem in image file `img` after replaying its
/// journal the way e2fsprogs does (`e2fsck -E journal_only`, then
/// `debugfs`): what a crash at the time the image was copied leaves.
fn debugfs_after_replay(img: &Path, request: &str) -> String {
    let o = Command::new("e2fsck")
        .args(["-E", "journal_only", "-y"])
        .arg(img)
        .output()
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "replaying {}: {o:?}",
        img.display()
    );
    let o = Command::new("debugfs").args(["-R", request]).arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_synchronous_file_write_and_dirsync_mkdir_are_durable_at_return_like_the_kernel() {
    need_kernel();
    let work = workdir("sync");
    let data: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();

    // The kernel: the flags as chattr sets them, and a copy of the image
    // file taken right after the write (and the mkdir) returned, before
    // anything else flushes, holds them once its journal is replayed.
    let kimg = work.join("kernel.img");
    image(&kimg);
    let mut kernel = Log::new();
    let copy = work.join("kernel-crash.img");
    {
        let m = LoopMount::mount(&kimg, &work.join("mnt"), "ext4", false).unwrap();
        let f = m.path().join("f");
        let d = m.path().join("d");
        fs::write(&f, b"").unwrap();
        fs::create_dir(&d).unwrap();
        run_ok(Command::new("chattr").arg("+S").arg(&f), &[0]).unwrap();
        run_ok(Command::new("chattr").arg("+D").arg(&d), &[0]).unwrap();
        run_ok(&mut Command::new("sync"), &[0]).unwrap();
        let lsattr = |p: &Path| {
            let o = run_ok(Command::new("lsattr").arg("-d").arg(p), &[0]).unwrap();
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string()
        };
        kernel.push(format!("f synchronous: {}", lsattr(&f).contains('S')));
        kernel.push(format!("d dirsync: {}", lsattr(&d).contains('D')));
        fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .write_all(&data)
            .unwrap();
        fs::create_dir(d.join("sub")).unwrap();
        run_ok(Command::new("cp").arg("--sparse=always").arg(&kimg).arg(&copy), &[0]).unwrap();
        m.unmount().unwrap();
    }
    let cat = debugfs_after_replay(&copy, "cat /f");
    kernel.push(format!(
        "f after a crash: {} bytes, same: {}",
        cat.len(),
        cat.as_bytes() == data
    ));
    let ls = debugfs_after_replay(&copy, "ls -l /d");
    kernel.push(format!("d/sub after a crash: {}", ls.contains(" sub")));

    // The library, over the recording device.
    let img = work.join("ext4kit.img");
    image(&img);
    let base = fs::read(&img).unwrap();
    let mut ours = Log::new();
    {
        let fs = open_rw(&img);
        let root = Cred::root();
        let f = fs.write_file(b"/f", b"", 0o644, 0, 0).unwrap();
        let d = fs.mkdir(b"/d", 0o755, &root).unwrap();
        let ff = fs.get_flags_ino(f.ino).unwrap();
        fs.set_flags_ino(f.ino, ff | fl::SYNC, &root).unwrap();
        let df = fs.get_flags_ino(d.ino).unwrap();
        fs.set_flags_ino(d.ino, df | fl::DIRSYNC, &root).unwrap();
        ours.push(format!(
            "f synchronous: {}",
            fs.get_flags_ino(f.ino).unwrap() & fl::SYNC != 0
        ));
        ours.push(format!(
            "d dirsync: {}",
            fs.get_flags_ino(d.ino).unwrap() & fl::DIRSYNC != 0
        ));
        fs.sync().unwrap();
    }
    fsck_clean(&img);
    let setup = |fs: &Fs, flag: u32| {
        let root = Cred::root();
        let f = fs.write_file(b"/f", b"", 0o644, 0, 0).unwrap();
        let d = fs.mkdir(b"/d", 0o755, &root).unwrap();
        if flag != 0 {
            let ff = fs.get_flags_ino(f.ino).unwrap();
            fs.set_flags_ino(f.ino, ff | fl::SYNC, &root).unwrap();
            let df = fs.get_flags_ino(d.ino).unwrap();
            fs.set_flags_ino(d.ino, df | fl::DIRSYNC, &root).unwrap();
        }
    };
    let op = |fs: &Fs| {
        let f = fs
            .open_as(b"/f", OpenFlags::from_bits(O_WRONLY), 0, &Cred::root())
            .unwrap();
        assert_eq!(f.write(fs, &data).unwrap(), data.len());
        fs.close_file(f).unwrap();
        let d = fs.stat(b"/d").unwrap().ino;
        fs.mkdir_at(d, b"sub", 0o755, &Cred::root()).unwrap();
    };
    let check = |fs: &Fs| {
        let st = fs.stat(b"/f").unwrap();
        let mut buf = vec![0u8; data.len() + 1];
        let n = fs
            .open(b"/f", OpenFlags::default())
            .unwrap()
            .read(fs, &mut buf)
            .unwrap();
        let sub = fs.stat(b"/d/sub").is_ok();
        format!("{} {} {sub}", st.size, buf[..n] == data[..])
    };
    let durable = crash_image_after(&base, |fs| setup(fs, 1), op, check);
    let (size, rest) = durable.split_once(' ').unwrap();
    let (same_data, sub) = rest.split_once(' ').unwrap();
    ours.push(format!("f after a crash: {size} bytes, same: {same_data}"));
    ours.push(format!("d/sub after a crash: {sub}"));
    // The control: without the flags the same calls leave nothing durable
    // at their return (the data waits in the page cache, the mkdir in the
    // running transaction) — the test can tell the difference.
    let lazy = crash_image_after(&base, |fs| setup(fs, 0), op, check);
    assert_eq!(lazy, "0 false false", "without +S/+D nothing is durable at the return");
    assert_same_observations("sync/dirsync", &kernel, &ours, "EXT4KIT_RULES_SHOW");
    let _ = fs::remove_dir_all(&work);
}

/// A default ACL in the xattr format: u::rwx, u:65534:rwx, g::r-x, m::rwx,
/// o::r-x (ids of the unnamed entries: ACL_UNDEFINED_ID).
fn default_acl() -> Vec<u8> {
    const UNDEF: u32 = u32::MAX;
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, UNDEF),
        (0x02, 7, NOBODY),
        (0x04, 5, UNDEF),
        (0x10, 7, UNDEF),
        (0x20, 5, UNDEF),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[test]
fn a_default_acl_is_inherited_at_create_like_the_kernel() {
    // (what, parent, name, umask); created by `: > NAME` (0666) or
    // `mkdir NAME` (0777).
    let made = [
        ("file", "d", "f", 0o022u16),
        ("dir", "d", "sub", 0o022),
        ("file", "", "plain", 0o027),
        ("dir", "", "plaind", 0o027),
    ];
    let show = |what: &str, name: &str, perm: u32, access: Option<Vec<u8>>, default: Option<Vec<u8>>| {
        format!(
            "{what} {name}: mode {perm:o}, access ACL {}, default ACL {}",
            hex(access),
            hex(default)
        )
    };
    let kernel = |m: &Path| {
        let mut log = Log::new();
        let d = m.join("d");
        fs::create_dir(&d).unwrap();
        set_kernel_xattr(&d, "system.posix_acl_default", &default_acl());
        for (what, parent, name, umask) in made {
            let dir = m.join(parent);
            let make = if what == "file" {
                format!(": > {name}")
            } else {
                format!("mkdir {name}")
            };
            assert_eq!(sh_as(0, &dir, &format!("umask {umask:o}; {make}")), 0);
            let p = dir.join(name);
            log.push(show(
                what,
                name,
                perm_of(&p),
                kernel_xattr(&p, "system.posix_acl_access"),
                kernel_xattr(&p, "system.posix_acl_default"),
            ));
        }
        log
    };
    let ours = |fs: &Fs| {
        let mut log = Log::new();
        let root = Cred::root();
        let d = fs.mkdir(b"/d", 0o755, &root).unwrap();
        fs.setxattr_ino(d.ino, ACL_DEFAULT_NAME, &default_acl(), 0, &root)
            .unwrap();
        let inos: BTreeMap<&str, u32> = [("d", d.ino), ("", 2)].into_iter().collect();
        for (what, parent, name, umask) in made {
            let p = inos[parent];
            let st = if what == "file" {
                let mode = CreateMode { perm: 0o666, umask };
                fs.mknod_at(p, name.as_bytes(), FileType::Regular, mode, (0, 0), &root)
            } else {
                fs.mkdir_at(p, name.as_bytes(), CreateMode { perm: 0o777, umask }, &root)
            }
            .unwrap();
            log.push(show(
                what,
                name,
                u32::from(st.perm()),
                fs.getxattr_ino(st.ino, ACL_ACCESS_NAME, &root).ok(),
                fs.getxattr_ino(st.ino, ACL_DEFAULT_NAME, &root).ok(),
            ));
        }
        log
    };
    same_as_kernel("default-acl", kernel, ours);
}
