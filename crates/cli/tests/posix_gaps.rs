//! The POSIX behaviours xfstests found missing through the mount (issue
//! 19), each run on the kernel's ext4 (loop mount) and on `ext4kit mount`
//! of identical fresh images, and compared observation by observation:
//! the kernel is the oracle. After each ext4kit run the image must be
//! e2fsck-clean.
//!
//! - setuid/setgid and `security.capability` cleared when someone else
//!   writes, truncates, fallocates or punches (generic/355, 683–685, 688);
//! - SEEK_DATA/SEEK_HOLE at a negative offset: ENXIO (generic/448);
//! - default ACL inheritance, the umask, ACL↔mode sync and ACL
//!   enforcement (generic/099, 319, 375, 444, 697);
//! - file handles across cache drops and remounts (generic/426, 467, 477,
//!   756, 777);
//! - RENAME_WHITEOUT and RENAME_EXCHANGE;
//! - inode flags (chattr/lsattr) and their enforcement, dirsync included;
//! - the filesystem label ioctls;
//! - O_TMPFILE and linkat of it (generic/004, 389, 531), and its orphan
//!   freed by the next mount after a crash;
//! - statx's birth time and attributes (generic/528, 424).
//!
//! `EXT4KIT_POSIX_GAPS_SHOW=1` prints the kernel's observations.
//!
//! Needs root, loop devices, /dev/fuse, util-linux's `setpriv` and
//! `fallocate` and attr's `setfattr` (to act as user nobody); without
//! them the tests fail and say why.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ext4kit_testkit::mountpeer::{assert_same_observations, mkfs_ext4, Peer, PeerMount};
use ext4kit_testkit::{e2fsck_clean, ext4kit_bin, sh_as};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");
const NOBODY: u32 = 65534;

/// Observations of one scenario, one line each.
type Log = Vec<String>;

fn require() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests need root (loop and FUSE mounts, acting as user nobody); CI runs as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse does not exist: the ext4kit mount needs the FUSE driver"
    );
    for tool in ["setpriv", "fallocate", "truncate", "chattr", "lsattr", "setfattr"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "`{tool}` is not installed (util-linux / coreutils / e2fsprogs): the tests use it"
        );
    }
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-posix-gaps-{tag}-{}", std::process::id()));
    for m in ["kernel", "ext4kit"] {
        let _ = Command::new("umount").arg("-l").arg(w.join(m)).output();
    }
    let _ = fs::remove_dir_all(&w);
    fs::create_dir_all(&w).unwrap();
    fs::set_permissions(&w, fs::Permissions::from_mode(0o755)).unwrap();
    w
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `rc` as "ok" or the errno's name-independent number ("errno 1").
fn rc(r: Result<(), i32>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("errno {e}"),
    }
}

fn io_rc<T>(r: std::io::Result<T>) -> String {
    rc(r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1)))
}

fn perm(p: &Path) -> String {
    match fs::symlink_metadata(p) {
        Ok(m) => format!("{:o}", m.mode() & 0o7777),
        Err(e) => format!("stat errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

fn getx(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: path and name are NUL-terminated, buf is writable for its length.
    let r = unsafe { libc::lgetxattr(cstr(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn setx(p: &Path, name: &str, v: &[u8]) -> Result<(), i32> {
    let n = CString::new(name).unwrap();
    // SAFETY: path and name are NUL-terminated, v is readable for its length.
    let r = unsafe { libc::lsetxattr(cstr(p).as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn show_x(r: Result<Vec<u8>, i32>) -> String {
    match r {
        Ok(v) => v.iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => format!("errno {e}"),
    }
}

/// An ACL in the xattr format (version 2, then tag/perm/id entries).
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}
const U_OBJ: u16 = 1;
const U: u16 = 2;
const G_OBJ: u16 = 4;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const NONE: u32 = u32::MAX;

/// Mount a fresh image with `peer` in `work`, run `scenario` on it,
/// unmount (checked), and return the observations.
fn run_on(peer: &Peer, work: &Path, scenario: &dyn Fn(&Path) -> Log) -> Log {
    let image = work.join(format!("{}.img", peer.name()));
    mkfs_ext4(&image, 64, &[]).unwrap();
    let m = PeerMount::mount(peer, &image, &work.join(peer.name())).unwrap();
    let log = scenario(m.path());
    m.unmount()
        .unwrap_or_else(|e| panic!("unmounting {}: {e}", peer.name()));
    log
}

/// Run `scenario` on the kernel's ext4 and on ext4kit and require the same
/// observations, and an e2fsck-clean image from ext4kit.
fn same_as_kernel(tag: &str, scenario: &dyn Fn(&Path) -> Log) {
    require();
    let work = workdir(tag);
    let kernel = run_on(&Peer::Kernel, &work, scenario);
    let ours = run_on(&Peer::Ext4kit(ext4kit_bin(BIN)), &work, scenario);
    assert_same_observations(tag, &kernel, &ours, "EXT4KIT_POSIX_GAPS_SHOW");
    e2fsck_clean(&work.join("ext4kit.img")).unwrap();
    let _ = fs::remove_dir_all(&work);
}

#[test]
fn setuid_setgid_and_capabilities_are_cleared_like_the_kernel() {
    same_as_kernel("killpriv", &|d| {
        let mut log = Log::new();
        let ops = [
            ("write", "echo x >> f"),
            ("truncate", "truncate -s 1 f"),
            ("fallocate", "fallocate -l 8192 f"),
            ("punch", "fallocate -p -o 0 -l 4096 f"),
        ];
        // setuid always goes; setgid only with group execute.
        for (op, script) in ops {
            for start in [0o6777, 0o4777, 0o2777, 0o2767] {
                for uid in [NOBODY, 0] {
                    let f = d.join("f");
                    fs::write(&f, vec![1u8; 6000]).unwrap();
                    fs::set_permissions(&f, fs::Permissions::from_mode(start)).unwrap();
                    let code = sh_as(uid, d, script);
                    log.push(format!("{op} as {uid} on {start:o}: exit {code}, mode {}", perm(&f)));
                    fs::remove_file(&f).unwrap();
                }
            }
        }
        // security.capability (v2, cap_net_raw permitted + effective):
        // a write, truncate or fallocate by someone else removes it and
        // succeeds (generic/688); so does a write by root.
        let mut cap = 0x0200_0001u32.to_le_bytes().to_vec();
        cap.extend_from_slice(&(1u32 << 13).to_le_bytes());
        cap.extend_from_slice(&[0; 12]);
        for (op, script) in ops {
            for uid in [NOBODY, 0] {
                let c = d.join("c");
                fs::write(&c, b"data").unwrap();
                fs::set_permissions(&c, fs::Permissions::from_mode(0o666)).unwrap();
                log.push(format!("set capability: {}", rc(setx(&c, "security.capability", &cap))));
                let code = sh_as(uid, d, script.replace(" f", " c").as_str());
                log.push(format!(
                    "{op} as {uid} of a file with capabilities: exit {code}, capability now {}",
                    show_x(getx(&c, "security.capability"))
                ));
                fs::remove_file(&c).unwrap();
            }
        }
        log
    });
}

#[test]
fn seek_data_and_hole_at_a_negative_offset_are_enxio() {
    same_as_kernel("seek", &|d| {
        let mut log = Log::new();
        let f = d.join("s");
        fs::write(&f, vec![7u8; 4096]).unwrap();
        let file = fs::File::open(&f).unwrap();
        use std::os::fd::AsRawFd;
        for (name, whence) in [("SEEK_DATA", libc::SEEK_DATA), ("SEEK_HOLE", libc::SEEK_HOLE)] {
            for off in [-1i64, -4096, i64::MIN, 0, 4096] {
                // SAFETY: a valid descriptor; lseek has no memory arguments.
                let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
                let what = if r < 0 {
                    format!("errno {}", errno())
                } else {
                    r.to_string()
                };
                log.push(format!("{name} at {off}: {what}"));
            }
        }
        log
    });
}

#[test]
fn default_acls_are_inherited_and_acls_and_modes_stay_one() {
    same_as_kernel("acl", &|d| {
        let mut log = Log::new();
        let ad = d.join("ad");
        fs::create_dir(&ad).unwrap();
        let default = acl(&[
            (U_OBJ, 7, NONE),
            (U, 7, NOBODY),
            (G_OBJ, 5, NONE),
            (MASK, 7, NONE),
            (OTHER, 5, NONE),
        ]);
        log.push(format!(
            "set default ACL: {}",
            rc(setx(&ad, "system.posix_acl_default", &default))
        ));
        // Under a default ACL the umask is ignored; elsewhere it applies.
        let code = sh_as(
            0,
            d,
            "umask 027; touch ad/f; mkdir ad/sub; mkfifo ad/p; mkdir ad/sub/deeper; touch plain; mkdir plaind",
        );
        log.push(format!("creations: exit {code}"));
        for n in ["ad/f", "ad/sub", "ad/p", "ad/sub/deeper", "plain", "plaind"] {
            let p = d.join(n);
            log.push(format!(
                "{n}: mode {} access {} default {}",
                perm(&p),
                show_x(getx(&p, "system.posix_acl_access")),
                show_x(getx(&p, "system.posix_acl_default"))
            ));
        }
        // Setting an access ACL sets the mode; chmod rewrites the ACL.
        let af = d.join("af");
        fs::write(&af, b"secret").unwrap();
        fs::set_permissions(&af, fs::Permissions::from_mode(0o600)).unwrap();
        log.push(format!("nobody reads 600: exit {}", sh_as(NOBODY, d, "cat af")));
        let a = acl(&[
            (U_OBJ, 6, NONE),
            (U, 6, NOBODY),
            (G_OBJ, 4, NONE),
            (MASK, 6, NONE),
            (OTHER, 0, NONE),
        ]);
        log.push(format!(
            "set access ACL: {}",
            rc(setx(&af, "system.posix_acl_access", &a))
        ));
        log.push(format!("af: mode {}", perm(&af)));
        // The kernel enforces the ACL it reads from the filesystem.
        log.push(format!("nobody reads via the ACL: exit {}", sh_as(NOBODY, d, "cat af")));
        fs::set_permissions(&af, fs::Permissions::from_mode(0o640)).unwrap();
        log.push(format!(
            "after chmod 640: access {}",
            show_x(getx(&af, "system.posix_acl_access"))
        ));
        log.push(format!("nobody reads, mask r: exit {}", sh_as(NOBODY, d, "cat af")));
        log.push(format!(
            "nobody writes, mask r: exit {}",
            sh_as(NOBODY, d, "echo x >> af")
        ));
        let deny = acl(&[
            (U_OBJ, 6, NONE),
            (U, 0, NOBODY),
            (G_OBJ, 4, NONE),
            (MASK, 4, NONE),
            (OTHER, 4, NONE),
        ]);
        log.push(format!(
            "deny nobody: {}",
            rc(setx(&af, "system.posix_acl_access", &deny))
        ));
        log.push(format!("af: mode {}", perm(&af)));
        log.push(format!("nobody reads, denied: exit {}", sh_as(NOBODY, d, "cat af")));
        // Setting an access ACL as an owner outside the file's group drops
        // setgid (posix_acl_update_mode; generic/375).
        let g = d.join("g");
        fs::write(&g, "").unwrap();
        rustix::fs::chown(&g, Some(rustix::fs::Uid::from_raw(NOBODY)), None).unwrap();
        fs::set_permissions(&g, fs::Permissions::from_mode(0o2770)).unwrap();
        let hex: String = acl(&[
            (U_OBJ, 7, NONE),
            (U, 5, 0),
            (G_OBJ, 7, NONE),
            (MASK, 7, NONE),
            (OTHER, 0, NONE),
        ])
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
        let code = sh_as(NOBODY, d, &format!("setfattr -n system.posix_acl_access -v 0x{hex} g"));
        log.push(format!(
            "owner outside the group sets an ACL: exit {code}, mode {}",
            perm(&g)
        ));
        // A set-group-id directory with a default ACL: new entries take
        // its group, subdirectories its setgid, files created by someone
        // outside the group lose a requested setgid (generic/697).
        let sd = d.join("sd");
        fs::create_dir(&sd).unwrap();
        fs::set_permissions(&sd, fs::Permissions::from_mode(0o2777)).unwrap();
        log.push(format!(
            "default ACL on sd: {}",
            rc(setx(&sd, "system.posix_acl_default", &default))
        ));
        let code = sh_as(
            NOBODY,
            d,
            "umask 022; touch sd/f; mkdir sd/s; install -m 2775 /dev/null sd/x 2>/dev/null; exit 0",
        );
        log.push(format!("nobody creates in sd: exit {code}"));
        for n in ["sd/f", "sd/s", "sd/x"] {
            let p = d.join(n);
            let gid = fs::symlink_metadata(&p)
                .map(|m| m.gid().to_string())
                .unwrap_or_else(|e| e.to_string());
            log.push(format!(
                "{n}: mode {} gid {gid} access {}",
                perm(&p),
                show_x(getx(&p, "system.posix_acl_access"))
            ));
        }
        // An ACL equal to the mode is not stored.
        let plain = acl(&[(U_OBJ, 6, NONE), (G_OBJ, 4, NONE), (OTHER, 0, NONE)]);
        log.push(format!(
            "minimal ACL: {}",
            rc(setx(&af, "system.posix_acl_access", &plain))
        ));
        log.push(format!(
            "af: mode {} access {}",
            perm(&af),
            show_x(getx(&af, "system.posix_acl_access"))
        ));
        log
    });
}

extern "C" {
    fn name_to_handle_at(dirfd: i32, path: *const libc::c_char, fh: *mut u8, mount_id: *mut i32, flags: i32) -> i32;
    fn open_by_handle_at(mount_fd: i32, fh: *mut u8, flags: i32) -> i32;
}

/// `name_to_handle_at` of `p`: the `struct file_handle` bytes.
fn handle_of(p: &Path) -> Vec<u8> {
    let mut fh = vec![0u8; 8 + 128];
    fh[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id = 0;
    // SAFETY: fh holds a file_handle header and 128 bytes of room as its
    // handle_bytes says; the path is NUL-terminated.
    let r = unsafe { name_to_handle_at(libc::AT_FDCWD, cstr(p).as_ptr(), fh.as_mut_ptr(), &mut mount_id, 0) };
    assert_eq!(r, 0, "name_to_handle_at {}: errno {}", p.display(), errno());
    fh
}

/// Open handle `fh` on the mount at `mnt` and describe what it names:
/// file contents or the directory listing, and its path as the kernel
/// reconnected it (relative to the mount).
fn open_handle(mnt: &Path, fh: &[u8]) -> String {
    let m = fs::File::open(mnt).unwrap();
    let mut fh = fh.to_vec();
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: fh is a file_handle that name_to_handle_at filled in.
    let fd = unsafe { open_by_handle_at(m.as_raw_fd(), fh.as_mut_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return format!("errno {}", errno());
    }
    // SAFETY: fd is a descriptor we own from here on.
    let f = unsafe { fs::File::from_raw_fd(fd) };
    let md = f.metadata().unwrap();
    let path = fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
    let rel = path
        .strip_prefix(mnt)
        .map_or_else(|_| path.display().to_string(), |r| r.display().to_string());
    let what = if md.is_dir() {
        let mut names: Vec<String> = fs::read_dir(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.join(",")
    } else {
        fs::read_to_string(format!("/proc/self/fd/{fd}")).unwrap()
    };
    // A file's path is not reconnected (only directories are): the
    // kernel shows "/" for it on both.
    format!("mode {:o} {what} at {rel}", md.mode())
}

fn drop_caches() {
    rustix::fs::sync();
    fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .and_then(|mut f| f.write_all(b"3"))
        .expect("writing /proc/sys/vm/drop_caches (needs root)");
}

#[test]
fn file_handles_survive_cache_drops_and_remounts() {
    require();
    let work = workdir("handles");
    let names = ["d/f", "d", "d/sub", ".", "gone"];
    let mut logs = Vec::new();
    for peer in [Peer::Kernel, Peer::Ext4kit(ext4kit_bin(BIN))] {
        let image = work.join(format!("{}.img", peer.name()));
        mkfs_ext4(&image, 64, &[]).unwrap();
        let dir = work.join(peer.name());
        let m = PeerMount::mount(&peer, &image, &dir).unwrap();
        let d = m.path().to_path_buf();
        fs::create_dir_all(d.join("d/sub")).unwrap();
        fs::write(d.join("d/f"), "hello").unwrap();
        fs::write(d.join("gone"), "x").unwrap();
        let handles: Vec<Vec<u8>> = names.iter().map(|n| handle_of(&d.join(n))).collect();
        fs::remove_file(d.join("gone")).unwrap();
        let mut log = Log::new();
        drop_caches();
        for (n, h) in names.iter().zip(&handles) {
            log.push(format!("after drop_caches {n}: {}", open_handle(&d, h)));
        }
        m.unmount().unwrap();
        let m = PeerMount::mount(&peer, &image, &dir).unwrap();
        for (n, h) in names.iter().zip(&handles) {
            log.push(format!("after remount {n}: {}", open_handle(m.path(), h)));
        }
        m.unmount().unwrap();
        logs.push(log);
    }
    assert_eq!(
        logs[0], logs[1],
        "file handles: kernel (left) and ext4kit (right) differ"
    );
    assert!(
        logs[1].iter().filter(|l| l.contains("hello")).count() == 2,
        "the file's handle did not open: {:#?}",
        logs[1]
    );
    e2fsck_clean(&work.join("ext4kit.img")).unwrap();
    let _ = fs::remove_dir_all(&work);
}

fn ls(d: &Path) -> String {
    let mut v: Vec<String> = fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            format!(
                "{}:{:o}:{}:{}",
                e.file_name().to_string_lossy(),
                m.mode(),
                m.rdev(),
                if m.is_file() {
                    fs::read_to_string(e.path()).unwrap_or_default()
                } else {
                    String::new()
                }
            )
        })
        .collect();
    v.sort();
    v.join(" ")
}

#[test]
fn rename_whiteout_and_exchange_match_the_kernel() {
    same_as_kernel("rename", &|d| {
        let mut log = Log::new();
        fs::create_dir(d.join("dd")).unwrap();
        for (n, c) in [("r1", "one"), ("r2", "two"), ("r3", "three"), ("r4", "four")] {
            fs::write(d.join(n), c).unwrap();
        }
        let rn = |a: &str, b: &str, flags: u32| {
            let (a, b) = (cstr(&d.join(a)), cstr(&d.join(b)));
            // SAFETY: NUL-terminated paths.
            let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
            rc(if r == 0 { Ok(()) } else { Err(errno()) })
        };
        log.push(format!("exchange r3 r4: {}", rn("r3", "r4", libc::RENAME_EXCHANGE)));
        log.push(format!(
            "exchange r3 missing: {}",
            rn("r3", "zz", libc::RENAME_EXCHANGE)
        ));
        log.push(format!("whiteout r1 -> r2: {}", rn("r1", "r2", libc::RENAME_WHITEOUT)));
        log.push(format!(
            "whiteout noreplace: {}",
            rn("r3", "r2", libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE)
        ));
        log.push(format!(
            "whiteout into dd: {}",
            rn("r3", "dd/r3", libc::RENAME_WHITEOUT)
        ));
        log.push(format!(
            "whiteout exchange: {}",
            rn("r4", "r2", libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE)
        ));
        log.push(format!("whiteout missing: {}", rn("nope", "r9", libc::RENAME_WHITEOUT)));
        log.push(format!("top: {}", ls(d)));
        log.push(format!("dd: {}", ls(&d.join("dd"))));
        log
    });
}

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

fn get_flags(p: &Path) -> Result<u32, i32> {
    let f = fs::File::open(p).map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut v) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(v as u32)
    }
}

fn set_flags(p: &Path, flags: u32) -> Result<(), i32> {
    let f = fs::File::open(p).map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    use std::os::fd::AsRawFd;
    let v = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS, &v) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Set FS_XFLAG_DAX on `p` (`chattr +x`, FS_IOC_FSGETXATTR then
/// FS_IOC_FSSETXATTR of the 28-byte `struct fsxattr`).
fn set_dax(p: &Path) -> Result<(), i32> {
    const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
    const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
    const FS_XFLAG_DAX: u32 = 0x8000;
    let f = fs::File::open(p).map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    use std::os::fd::AsRawFd;
    let mut x = [0u32; 7];
    // SAFETY: both ioctls read or write one struct fsxattr (28 bytes).
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FSGETXATTR, x.as_mut_ptr()) } < 0 {
        return Err(errno());
    }
    x[0] |= FS_XFLAG_DAX;
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FSSETXATTR, x.as_ptr()) } < 0 {
        return Err(errno());
    }
    Ok(())
}

/// Open `p` with `flags` and write to it: the first failure's errno. (The
/// kernel refuses writes to immutable and non-appending writes to
/// append-only files at open; through FUSE files are opened without
/// asking the server, which refuses the write instead. Either way the
/// program cannot write.)
fn open_write(p: &Path, flags: i32) -> String {
    let c = cstr(p);
    // SAFETY: NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return format!("errno {}", errno());
    }
    // SAFETY: fd is open; the buffer is 1 byte.
    let r = unsafe { libc::write(fd, b"z".as_ptr().cast(), 1) };
    let out = if r < 0 {
        format!("errno {}", errno())
    } else {
        "ok".into()
    };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    out
}

#[test]
fn inode_flags_are_kept_and_enforced_like_the_kernel() {
    const IMMUTABLE: u32 = 0x10;
    const APPEND: u32 = 0x20;
    const NODUMP: u32 = 0x40;
    const NOATIME: u32 = 0x80;
    const SYNC: u32 = 0x8;
    const DIRSYNC: u32 = 0x10000;
    same_as_kernel("flags", &|d| {
        let mut log = Log::new();
        let f = d.join("f");
        fs::write(&f, "data").unwrap();
        let base = get_flags(&f);
        log.push(format!("new file flags {base:x?}"));
        let base = base.unwrap_or(0);
        for (name, fl) in [
            ("nodump+noatime+sync", NODUMP | NOATIME | SYNC),
            ("dirsync on a file", DIRSYNC),
        ] {
            log.push(format!("set {name}: {}", rc(set_flags(&f, base | fl))));
            log.push(format!("  now {:x?}", get_flags(&f)));
            let _ = set_flags(&f, base);
        }
        // A flag change moves ctime, and a stat through the mount sees it
        // (xfstests generic/277).
        let ctime = |p: &Path| fs::metadata(p).map(|m| (m.ctime(), m.ctime_nsec())).unwrap_or_default();
        let c0 = ctime(&f);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _ = set_flags(&f, base | NODUMP);
        log.push(format!("ctime moved at chattr: {}", ctime(&f) > c0));
        let _ = set_flags(&f, base);
        // The extent flag of an empty file (ext4_ind_migrate), then data
        // through the block-map layout.
        let e = d.join("e");
        fs::write(&e, "").unwrap();
        let eb = get_flags(&e).unwrap_or(0);
        log.push(format!("-e on an empty file: {}", rc(set_flags(&e, eb & !0x80000))));
        log.push(format!("  now {:x?}", get_flags(&e)));
        log.push(format!("  write: {}", io_rc(fs::write(&e, vec![5u8; 10000]))));
        log.push(format!("  read back {:?}", fs::read(&e).map(|v| v == vec![5u8; 10000])));
        // A file past the twelve direct blocks cannot move to a block map
        // (ext4_ind_migrate: EOPNOTSUPP). A small one is not observed: the
        // kernel converts it only once its written-back extent is no longer
        // unwritten, which races with the I/O completion of the flush it
        // starts (seen both ways on one kernel).
        let big = d.join("big");
        let filled = std::fs::File::create(&big).and_then(|mut w| {
            std::io::Write::write_all(&mut w, &vec![7u8; 13 * 4096])?;
            w.sync_all()
        });
        log.push(format!("13-block file written: {}", io_rc(filled)));
        let bb = get_flags(&big).unwrap_or(0);
        log.push(format!(
            "-e on a file with data: {}",
            rc(set_flags(&big, bb & !0x80000))
        ));
        // Immutable: no change of any kind.
        log.push(format!("+i: {}", rc(set_flags(&f, base | IMMUTABLE))));
        log.push(format!(
            "  change another flag: {}",
            rc(set_flags(&f, base | IMMUTABLE | NODUMP))
        ));
        log.push(format!("  write: {}", open_write(&f, libc::O_WRONLY)));
        log.push(format!("  append: {}", open_write(&f, libc::O_WRONLY | libc::O_APPEND)));
        log.push(format!(
            "  truncate: {}",
            io_rc(fs::OpenOptions::new().write(true).open(&f).and_then(|h| h.set_len(0)))
        ));
        log.push(format!(
            "  chmod: {}",
            io_rc(fs::set_permissions(&f, fs::Permissions::from_mode(0o600)))
        ));
        log.push(format!("  setxattr: {}", rc(setx(&f, "user.x", b"1"))));
        log.push(format!("  link: {}", io_rc(fs::hard_link(&f, d.join("f2")))));
        log.push(format!("  rename: {}", io_rc(fs::rename(&f, d.join("f3")))));
        log.push(format!("  unlink: {}", io_rc(fs::remove_file(&f))));
        log.push(format!("  nobody clears it: exit {}", sh_as(NOBODY, d, "chattr -i f")));
        log.push(format!("-i: {}", rc(set_flags(&f, base))));
        log.push(format!("  contents {:?}", fs::read_to_string(&f).ok()));
        // Append-only: appends only, no other change.
        log.push(format!("+a: {}", rc(set_flags(&f, base | APPEND))));
        log.push(format!("  append: {}", open_write(&f, libc::O_WRONLY | libc::O_APPEND)));
        log.push(format!("  overwrite: {}", open_write(&f, libc::O_WRONLY)));
        log.push(format!(
            "  truncate: {}",
            io_rc(fs::OpenOptions::new().append(true).open(&f).and_then(|h| h.set_len(0)))
        ));
        log.push(format!("  unlink: {}", io_rc(fs::remove_file(&f))));
        log.push(format!("-a: {}", rc(set_flags(&f, base))));
        log.push(format!("  contents {:?}", fs::read_to_string(&f).ok()));
        // Directories.
        let di = d.join("di");
        fs::create_dir(&di).unwrap();
        fs::write(di.join("old"), "o").unwrap();
        let dbase = get_flags(&di).unwrap_or(0);
        log.push(format!("dir +i: {}", rc(set_flags(&di, dbase | IMMUTABLE))));
        log.push(format!("  create: {}", io_rc(fs::write(di.join("new"), "n"))));
        log.push(format!("  unlink: {}", io_rc(fs::remove_file(di.join("old")))));
        log.push(format!("dir -i +a: {}", rc(set_flags(&di, dbase | APPEND))));
        log.push(format!("  create: {}", io_rc(fs::write(di.join("new"), "n"))));
        log.push(format!("  unlink: {}", io_rc(fs::remove_file(di.join("old")))));
        log.push(format!(
            "  rename out: {}",
            io_rc(fs::rename(di.join("new"), d.join("moved")))
        ));
        log.push(format!("dir -a +dirsync: {}", rc(set_flags(&di, dbase | DIRSYNC))));
        log.push(format!("  now {:x?}", get_flags(&di)));
        // What new inodes inherit from their directory (EXT4_FL_INHERITED,
        // ext4_mask_flags by type; xfstests generic/607 for DAX).
        let inh = d.join("inh");
        fs::create_dir(&inh).unwrap();
        let ib = get_flags(&inh).unwrap_or(0);
        log.push(format!(
            "dir +dSA: {}",
            rc(set_flags(&inh, ib | NODUMP | SYNC | NOATIME | DIRSYNC))
        ));
        log.push(format!("dir +x (DAX): {}", rc(set_dax(&inh))));
        fs::write(inh.join("file"), "x").unwrap();
        fs::create_dir(inh.join("sub")).unwrap();
        std::os::unix::fs::symlink("file", inh.join("link")).unwrap();
        for n in ["file", "sub"] {
            log.push(format!("  new {n}: {:x?}", get_flags(&inh.join(n))));
        }
        // Who may: the owner for ordinary flags, root for i and a.
        let o = d.join("o");
        fs::write(&o, "").unwrap();
        log.push(format!(
            "nobody +d on root's file: exit {}",
            sh_as(NOBODY, d, "chattr +d o")
        ));
        rustix::fs::chown(&o, Some(rustix::fs::Uid::from_raw(NOBODY)), None).unwrap();
        log.push(format!("owner nobody +d: exit {}", sh_as(NOBODY, d, "chattr +d o")));
        log.push(format!("owner nobody +i: exit {}", sh_as(NOBODY, d, "chattr +i o")));
        log.push(format!("owner nobody +a: exit {}", sh_as(NOBODY, d, "chattr +a o")));
        log.push(format!("  now {:x?}", get_flags(&o)));
        // lsattr itself through the mount.
        let out = Command::new("lsattr").arg("-d").arg(&o).arg(&di).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).replace(&d.display().to_string(), "M");
        log.push(format!("lsattr: {} {}", out.status, text.trim()));
        log
    });
}

const FS_IOC_GETFSLABEL: libc::c_ulong = 0x8100_9431;
const FS_IOC_SETFSLABEL: libc::c_ulong = 0x4100_9432;

#[test]
fn filesystem_label_ioctls_match_the_kernel() {
    require();
    let work = workdir("label");
    let mut logs = Vec::new();
    for peer in [Peer::Kernel, Peer::Ext4kit(ext4kit_bin(BIN))] {
        let image = work.join(format!("{}.img", peer.name()));
        mkfs_ext4(&image, 64, &["-L", "before"]).unwrap();
        let m = PeerMount::mount(&peer, &image, &work.join(peer.name())).unwrap();
        let root = fs::File::open(m.path()).unwrap();
        use std::os::fd::AsRawFd;
        let mut log = Log::new();
        let get = |log: &mut Log| {
            let mut buf = [0u8; 256];
            // SAFETY: GETFSLABEL writes at most FSLABEL_MAX (256) bytes.
            let r = unsafe { libc::ioctl(root.as_raw_fd(), FS_IOC_GETFSLABEL, buf.as_mut_ptr()) };
            let end = buf.iter().position(|&b| b == 0).unwrap_or(256);
            log.push(if r < 0 {
                format!("get: errno {}", errno())
            } else {
                format!("get: {:?}", String::from_utf8_lossy(&buf[..end]))
            });
        };
        let set = |log: &mut Log, label: &[u8]| {
            let mut buf = [0u8; 256];
            buf[..label.len()].copy_from_slice(label);
            // SAFETY: SETFSLABEL reads FSLABEL_MAX (256) bytes.
            let r = unsafe { libc::ioctl(root.as_raw_fd(), FS_IOC_SETFSLABEL, buf.as_ptr()) };
            log.push(format!(
                "set {:?}: {}",
                String::from_utf8_lossy(label),
                rc(if r < 0 { Err(errno()) } else { Ok(()) })
            ));
        };
        get(&mut log);
        set(&mut log, b"sixteen-bytes-ok");
        get(&mut log);
        set(&mut log, b"seventeen-bytes!!");
        set(&mut log, b"lbl");
        get(&mut log);
        drop(root);
        m.unmount().unwrap();
        let dump = ext4kit_testkit::journal::dumpe2fs_header(&image).unwrap();
        log.push(format!(
            "on disk: {}",
            ext4kit_testkit::journal::header_field(&dump, "Filesystem volume name")
        ));
        logs.push(log);
    }
    assert_eq!(
        logs[0], logs[1],
        "label ioctls: kernel (left) and ext4kit (right) differ"
    );
    e2fsck_clean(&work.join("ext4kit.img")).unwrap();
    let _ = fs::remove_dir_all(&work);
}

/// `linkat` of descriptor `fd` to `dst`: through `/proc/self/fd` with
/// AT_SYMLINK_FOLLOW (`via_proc`) or with AT_EMPTY_PATH.
fn link_fd(fd: i32, dst: &Path, via_proc: bool) -> String {
    let d = cstr(dst);
    let r = if via_proc {
        let p = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
        // SAFETY: NUL-terminated paths.
        unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                p.as_ptr(),
                libc::AT_FDCWD,
                d.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        }
    } else {
        // SAFETY: NUL-terminated paths; fd is open.
        unsafe { libc::linkat(fd, c"".as_ptr(), libc::AT_FDCWD, d.as_ptr(), libc::AT_EMPTY_PATH) }
    };
    rc(if r < 0 { Err(errno()) } else { Ok(()) })
}

/// `open(dir, O_TMPFILE | extra, mode)`: the descriptor or the errno.
fn open_tmpfile(dir: &Path, extra: i32, mode: libc::mode_t) -> Result<i32, i32> {
    let c = cstr(dir);
    // SAFETY: NUL-terminated path; callers close the descriptor.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | extra, mode) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

fn fd_stat(fd: i32) -> String {
    // SAFETY: fstat fills the zeroed struct; fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return format!("fstat errno {}", errno());
    }
    format!("nlink {} mode {:o} size {}", st.st_nlink, st.st_mode, st.st_size)
}

fn fd_write(fd: i32, data: &[u8]) -> String {
    // SAFETY: fd is open; data is readable for its length.
    let r = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    if r < 0 {
        format!("write errno {}", errno())
    } else {
        format!("wrote {r}")
    }
}

fn close_fd(fd: i32) {
    // SAFETY: the caller's descriptor, closed once.
    unsafe { libc::close(fd) };
}

/// Free inodes of the filesystem at `mnt` (statvfs `f_ffree`).
fn free_inodes(mnt: &Path) -> u64 {
    let s = rustix::fs::statvfs(mnt).unwrap();
    s.f_ffree
}

/// Polls (the release of a FUSE file and the kernel's FORGET are sent
/// after close returns) until `mnt` has `want` free inodes again.
fn freed_again(mnt: &Path, want: u64) -> bool {
    for _ in 0..200 {
        if free_inodes(mnt) == want {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// O_TMPFILE (generic/004, 389, 531): an unnamed file, written, given a
/// name by linkat through /proc/self/fd or AT_EMPTY_PATH and read back
/// under it; one made with O_EXCL cannot be linked, nor can one whose
/// first name was removed again (ENOENT); one never linked is freed at
/// its close; the directory must be one (ENOTDIR). ext4kit's image must
/// be e2fsck-clean afterwards.
#[test]
fn o_tmpfile_is_created_linked_and_freed_like_the_kernel() {
    same_as_kernel("tmpfile", &|d| {
        let mut log = Log::new();
        fs::create_dir(d.join("dir")).unwrap();
        fs::set_permissions(d.join("dir"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(d.join("plain"), "x").unwrap();
        let base = free_inodes(d);

        let fd = open_tmpfile(&d.join("dir"), libc::O_RDWR, 0o640).unwrap();
        log.push(format!("tmpfile: {}", fd_stat(fd)));
        log.push(format!("dir after tmpfile: {}", ls(&d.join("dir"))));
        log.push(fd_write(fd, b"written before it had a name"));
        log.push(format!("linkat /proc: {}", link_fd(fd, &d.join("dir/named"), true)));
        log.push(format!("after link: {}", fd_stat(fd)));
        log.push(format!("read back: {:?}", fs::read_to_string(d.join("dir/named"))));
        log.push(format!("perm of the name: {}", perm(&d.join("dir/named"))));
        log.push(format!("second link: {}", link_fd(fd, &d.join("dir/second"), false)));
        fs::remove_file(d.join("dir/named")).unwrap();
        fs::remove_file(d.join("dir/second")).unwrap();
        log.push(format!(
            "relink after unlink: {}",
            link_fd(fd, &d.join("dir/again"), true)
        ));
        close_fd(fd);

        let fd = open_tmpfile(d, libc::O_RDWR, 0o600).unwrap();
        log.push(format!("AT_EMPTY_PATH: {}", link_fd(fd, &d.join("empty"), false)));
        log.push(fd_write(fd, b"after the link"));
        close_fd(fd);
        log.push(format!("read back: {:?}", fs::read_to_string(d.join("empty"))));

        let fd = open_tmpfile(d, libc::O_RDWR | libc::O_EXCL, 0o600).unwrap();
        log.push(format!("O_EXCL: {}", fd_stat(fd)));
        log.push(format!("O_EXCL linkat: {}", link_fd(fd, &d.join("excl"), true)));
        log.push(format!("O_EXCL AT_EMPTY_PATH: {}", link_fd(fd, &d.join("excl"), false)));
        close_fd(fd);

        // So far one inode more is in use ("empty"): the others are freed
        // (through FUSE when the kernel's RELEASE and FORGET arrive).
        let before = base - 1;
        log.push(format!("earlier ones freed: {}", freed_again(d, before)));
        // Never linked, with data: freed at its close (inodes and blocks:
        // e2fsck checks the blocks).
        let fd = open_tmpfile(d, libc::O_WRONLY, 0o600).unwrap();
        log.push(fd_write(fd, &vec![0x5a; 300_000]));
        // SAFETY: fd is open.
        log.push(format!(
            "fsync: {}",
            rc(if unsafe { libc::fsync(fd) } < 0 {
                Err(errno())
            } else {
                Ok(())
            })
        ));
        log.push(format!("one inode in use while open: {}", free_inodes(d) + 1 == before));
        close_fd(fd);
        log.push(format!("freed at close: {}", freed_again(d, before)));
        log.push(format!(
            "free inodes vs. start: {}",
            free_inodes(d) as i64 - base as i64
        ));

        log.push(format!(
            "on a file: {}",
            rc(open_tmpfile(&d.join("plain"), libc::O_RDWR, 0o600).map(close_fd))
        ));
        log.push(format!("dir at the end: {}", ls(&d.join("dir"))));
        log.push(format!("top at the end: {}", ls(d)));
        log
    });
}

/// A crash (the server killed) with an unlinked O_TMPFILE open leaves an
/// orphan with blocks; the next mount, ours or the kernel's, frees it
/// (orphan recovery), and the image is e2fsck-clean after.
#[test]
fn o_tmpfile_open_at_a_crash_is_freed_by_the_next_mount() {
    require();
    let work = workdir("tmpfile-crash");
    let image = work.join("crash.img");
    mkfs_ext4(&image, 64, &[]).unwrap();
    let bin = ext4kit_bin(BIN);
    let mut m = PeerMount::mount(&Peer::Ext4kit(bin.clone()), &image, &work.join("m")).unwrap();
    let before = free_inodes(m.path());
    let fd = open_tmpfile(m.path(), libc::O_RDWR, 0o600).unwrap();
    assert_eq!(fd_write(fd, &vec![1; 1 << 20]), format!("wrote {}", 1 << 20));
    // SAFETY: fd is open.
    assert_eq!(unsafe { libc::fsync(fd) }, 0, "fsync: errno {}", errno());
    m.signal_server(rustix::process::Signal::KILL).unwrap();
    m.wait_server(std::time::Duration::from_secs(10)).unwrap();
    close_fd(fd);
    m.detach().unwrap();
    drop(m);
    for peer in [Peer::Ext4kit(bin), Peer::Kernel] {
        let copy = work.join(format!("after-{}.img", peer.name()));
        ext4kit_testkit::journal::copy_sparse(&image, &copy).unwrap();
        let m = PeerMount::mount(&peer, &copy, &work.join(peer.name())).unwrap();
        assert_eq!(
            free_inodes(m.path()),
            before,
            "{}: the crashed tmpfile's inode was not freed at mount",
            peer.name()
        );
        m.unmount().unwrap();
        e2fsck_clean(&copy).unwrap_or_else(|e| panic!("after recovery by {}: {e}", peer.name()));
    }
    let _ = fs::remove_dir_all(&work);
}

/// `statx` of `p` (not following a final symlink), asking for `mask`.
fn statx_of(p: &Path, mask: u32) -> libc::statx {
    let c = cstr(p);
    // SAFETY: statx fills the zeroed struct it is given; NUL-terminated path.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, mask, &mut stx) };
    assert_eq!(r, 0, "statx {}: errno {}", p.display(), errno());
    stx
}

fn ts_ns(t: libc::statx_timestamp) -> i128 {
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// STATX_ATTR_* bits ext4_getattr reports (compressed, immutable, append,
/// nodump, encrypted, verity).
const EXT4_STATX_ATTRS: u64 = 0x4 | 0x10 | 0x20 | 0x40 | 0x800 | 0x100000;

/// statx's birth time (generic/528) and attributes (generic/424): for a
/// file, a directory and a symlink the birth time is reported, lies
/// between the clock before and after the creation, is not after the
/// ctime and survives a chmod and a write; chattr +i, +a and +d show as
/// STATX_ATTR_IMMUTABLE, APPEND and NODUMP beside the kernel's.
///
/// The attributes: the kernel's FUSE (6.18) copies only the birth time
/// out of a FUSE_STATX reply (`fuse_do_statx`), not `attributes`, so
/// through any FUSE mount statx shows none of ext4's bits, whatever the
/// server answers; ext4kit answers them as ext4_getattr would
/// (`ext4kit_fuse::attr::statx_attributes`, unit-tested there). This test
/// requires them equal to the kernel's as soon as the mount reports
/// ext4's attribute mask, and until then asserts the kernel's omission.
#[test]
fn statx_birth_time_and_attributes_match_the_kernel() {
    require();
    let work = workdir("statx");
    let mut logs = Vec::new();
    let mut attrs = Vec::new();
    for peer in [Peer::Kernel, Peer::Ext4kit(ext4kit_bin(BIN))] {
        let image = work.join(format!("{}.img", peer.name()));
        mkfs_ext4(&image, 64, &[]).unwrap();
        let m = PeerMount::mount(&peer, &image, &work.join(peer.name())).unwrap();
        let d = m.path().to_path_buf();
        let mut log = Log::new();
        let now = || {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as i128
        };
        for (name, make) in [
            ("file", &(|p: &Path| fs::write(p, "x").unwrap()) as &dyn Fn(&Path)),
            ("dir", &|p: &Path| fs::create_dir(p).unwrap()),
            ("symlink", &|p: &Path| std::os::unix::fs::symlink("target", p).unwrap()),
        ] {
            let p = d.join(name);
            let t0 = now();
            make(&p);
            let t1 = now();
            let s = statx_of(&p, libc::STATX_BASIC_STATS | libc::STATX_BTIME);
            let b = ts_ns(s.stx_btime);
            log.push(format!("{name}: btime in mask {}", s.stx_mask & libc::STATX_BTIME != 0));
            // The kernel stamps with its coarse clock (up to a tick behind).
            let sane = b >= t0 - 1_000_000_000 && b <= t1 + 1_000_000_000;
            log.push(format!("{name}: btime between the clock before and after {sane}"));
            // A file's write after its creation moved its ctime on.
            log.push(format!("{name}: btime <= ctime {}", b <= ts_ns(s.stx_ctime)));
            if name == "file" {
                std::thread::sleep(std::time::Duration::from_millis(20));
                fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
                fs::write(&p, "changed").unwrap();
                let s2 = statx_of(&p, libc::STATX_BASIC_STATS | libc::STATX_BTIME);
                log.push(format!("file: btime kept {}", ts_ns(s2.stx_btime) == b));
                log.push(format!("file: mtime moved past btime {}", ts_ns(s2.stx_mtime) > b));
            }
        }
        // Basic stats only: no birth time asked, none needed.
        let s = statx_of(&d.join("file"), libc::STATX_BASIC_STATS);
        log.push(format!("basic stats: mode {:o} nlink {}", s.stx_mode, s.stx_nlink));
        let mut seen = Vec::new();
        for (tag, flag) in [("+i", 0x10u32), ("+a", 0x20), ("+d", 0x40)] {
            let p = d.join("file");
            let base = get_flags(&p).unwrap();
            set_flags(&p, base | flag).unwrap();
            let s = statx_of(&p, libc::STATX_BASIC_STATS | libc::STATX_BTIME);
            seen.push((
                tag,
                s.stx_attributes & EXT4_STATX_ATTRS,
                s.stx_attributes_mask & EXT4_STATX_ATTRS,
            ));
            set_flags(&p, base).unwrap();
        }
        attrs.push(seen);
        logs.push(log);
        m.unmount().unwrap();
    }
    if std::env::var_os("EXT4KIT_POSIX_GAPS_SHOW").is_some() {
        eprintln!("statx, the kernel's observations:\n  {}", logs[0].join("\n  "));
        eprintln!("statx attributes: kernel {:?}, ext4kit {:?}", attrs[0], attrs[1]);
    }
    assert_eq!(logs[0], logs[1], "statx: kernel (left) and ext4kit (right) differ");
    assert!(
        logs[1].iter().all(|l| !l.ends_with("false")),
        "statx birth time: {:#?}",
        logs[1]
    );
    assert_eq!(
        attrs[0],
        [
            ("+i", 0x10, EXT4_STATX_ATTRS),
            ("+a", 0x20, EXT4_STATX_ATTRS),
            ("+d", 0x40, EXT4_STATX_ATTRS)
        ],
        "the kernel's ext4"
    );
    if attrs[1].iter().any(|&(_, _, mask)| mask != 0) {
        assert_eq!(
            attrs[1], attrs[0],
            "statx attributes through the mount differ from the kernel's"
        );
    } else {
        assert!(
            attrs[1].iter().all(|&(_, a, _)| a == 0),
            "the kernel's FUSE reported attributes without their mask: {:?}",
            attrs[1]
        );
    }
    e2fsck_clean(&work.join("ext4kit.img")).unwrap();
    let _ = fs::remove_dir_all(&work);
}

/// The names in directory `dir` of `image` after its journal is replayed
/// (debugfs on a replayed copy), sorted, without "." and "..".
fn names_after_replay(image: &Path, copy: &Path, dir: &str) -> Vec<String> {
    ext4kit_testkit::journal::copy_sparse(image, copy).unwrap();
    let run = ext4kit_testkit::journal::e2fsck_replay(copy).unwrap();
    assert!(run.code < 8, "replaying {}: {}", copy.display(), run.output);
    let out = Command::new("debugfs")
        .args(["-R", &format!("ls {dir}")])
        .arg(copy)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<String> = text
        .split_whitespace()
        .filter(|w| !w.starts_with('(') && w.parse::<u64>().is_err() && *w != "." && *w != "..")
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// A directory with the dirsync flag (`chattr +D`) has its entry changes
/// committed before the call returns (ext4's `ext4_handle_sync`): a copy
/// of the image taken right after, replayed, has them; without the flag
/// they wait for the commit interval.
#[test]
fn dirsync_directories_commit_their_changes_at_once() {
    require();
    let work = workdir("dirsync");
    let mut logs = Vec::new();
    for peer in [Peer::Kernel, Peer::Ext4kit(ext4kit_bin(BIN))] {
        let image = work.join(format!("{}.img", peer.name()));
        mkfs_ext4(&image, 64, &[]).unwrap();
        let m = PeerMount::mount(&peer, &image, &work.join(peer.name())).unwrap();
        let d = m.path().to_path_buf();
        fs::create_dir(d.join("ds")).unwrap();
        rustix::fs::sync();
        let base = get_flags(&d.join("ds")).unwrap();
        set_flags(&d.join("ds"), base | 0x10000).unwrap();
        fs::create_dir(d.join("ds/sub")).unwrap();
        fs::write(d.join("ds/file"), "x").unwrap();
        fs::rename(d.join("ds/file"), d.join("ds/renamed")).unwrap();
        let names = names_after_replay(&image, &work.join("copy.img"), "/ds");
        logs.push(format!("{names:?}"));
        m.unmount().unwrap();
    }
    assert_eq!(logs[0], logs[1], "dirsync: kernel (left) and ext4kit (right) differ");
    assert_eq!(
        logs[1], r#"["renamed", "sub"]"#,
        "the dirsync directory's changes were not committed"
    );
    e2fsck_clean(&work.join("ext4kit.img")).unwrap();
    let _ = fs::remove_dir_all(&work);
}
