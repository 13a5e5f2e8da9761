//! Inode attributes and extended attributes written through ext4kit:
//! xattrs spilling from the inode body to the external block and back,
//! replace and remove, POSIX ACLs, copy-on-write of blocks the kernel
//! shares between inodes, chmod/chown/utimens permission rules, and statfs.
//! Every image must stay `e2fsck -fn` clean, and the kernel (loop mount)
//! must read back what we wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit::ext4::inode;
use ext4kit::ext4::xattr_write::{self, XATTR_CREATE, XATTR_REPLACE};
use ext4kit::{Cred, Errno, Fs, OpenOptions, SetAttr, TimeSet, Timestamp};

fn sh(cmd: &mut Command) -> String {
    let out = ext4kit_testkit::run_ok(cmd, &[0]).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ext4kit-attrs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfs(dir: &Path, tag: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{tag}.img"));
    // A directory to hang a default ACL on (made by mke2fs -d).
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    sh(Command::new("mke2fs")
        .args(["-q", "-F"])
        .args(args)
        .arg("-d")
        .arg(&src)
        .arg(&img)
        .arg("32M"));
    img
}

fn fsck_clean(img: &Path) {
    ext4kit_testkit::e2fsck_clean(img).unwrap_or_else(|e| panic!("{e}"));
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

fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("the kernel cross-check needs a loop mount ({e}); CI runs as root");
    }
}

fn root() -> Cred {
    Cred::root()
}

fn sorted(v: Vec<(Vec<u8>, Vec<u8>)>) -> BTreeMap<String, String> {
    v.into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), show_value(&v)))
        .collect()
}

/// Short printable form of a value for assertion messages.
fn show_value(v: &[u8]) -> String {
    if v.len() <= 16 {
        hex(v)
    } else {
        format!(
            "{}..({} bytes, sum {})",
            hex(&v[..8]),
            v.len(),
            v.iter().map(|&b| b as u64).sum::<u64>()
        )
    }
}

fn shown(m: &BTreeMap<Vec<u8>, Vec<u8>>) -> BTreeMap<String, String> {
    sorted(m.clone().into_iter().collect())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every attribute the kernel sees on `path` (hex values), via getfattr.
fn kernel_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let out = sh(Command::new("getfattr")
        .args(["--absolute-names", "-d", "-m", "-", "-e", "hex"])
        .arg(path));
    let mut m = BTreeMap::new();
    for line in out.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        let v = v.strip_prefix("0x").unwrap_or(v);
        let bytes = (0..v.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
            .collect();
        m.insert(k.as_bytes().to_vec(), bytes);
    }
    m
}

/// The refcount in the header of xattr block `nr` of `img`.
fn block_refcount(img: &Path, nr: u64, bs: u64) -> u32 {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(img).unwrap();
    f.seek(SeekFrom::Start(nr * bs + 4)).unwrap();
    let mut b = [0u8; 4];
    f.read_exact(&mut b).unwrap();
    u32::from_le_bytes(b)
}

/// An ACL u::rw-, u:1000:rwx, g::r--, m::r-x, o::--- in the Linux xattr format.
fn acl_value() -> Vec<u8> {
    let mut x = 2u32.to_le_bytes().to_vec();
    for (t, p, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 7, 1000),
        (4, 4, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        x.extend_from_slice(&t.to_le_bytes());
        x.extend_from_slice(&p.to_le_bytes());
        x.extend_from_slice(&id.to_le_bytes());
    }
    x
}

fn value(n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|k| b'a' + ((k + salt) % 26) as u8).collect()
}

/// Spill, replace, move, remove, errors, ACLs — on one filesystem flavour.
fn xattr_cycle(tag: &str, args: &[&str], body_space: bool) {
    let dir = scratch(tag);
    let img = mkfs(&dir, tag, args);
    let fs = open_rw(&img);
    let bs = fs.statfs().unwrap().block_size as u64;
    let st = fs.write_file(b"/f", b"some data", 0o644, 0, 0).unwrap();
    let ino = st.ino;
    let base_blocks = st.blocks;
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();

    // A small first attribute: in the body when there is one.
    fs.setxattr(b"/f", b"user.small", b"v", 0, true, &root()).unwrap();
    want.insert(b"user.small".to_vec(), b"v".to_vec());
    let st = fs.stat(b"/f").unwrap();
    assert_eq!(st.file_acl == 0, body_space, "{tag}: first attribute placement");
    // Growing attributes until they no longer fit the inode.
    let mut k = 0;
    let mut total = 0;
    while total + 60 + 16 * k < (bs as usize) * 3 / 4 {
        let n = 8 + 12 * k;
        let name = format!("user.grow{k}");
        fs.setxattr(b"/f", name.as_bytes(), &value(n, k), XATTR_CREATE, true, &root())
            .unwrap_or_else(|e| panic!("{tag}: set {name} ({n} bytes): {e}"));
        want.insert(name.into_bytes(), value(n, k));
        total += n + name_len(k);
        k += 1;
    }
    let st = fs.stat(b"/f").unwrap();
    assert_ne!(st.file_acl, 0, "{tag}: attributes spilled into a block");
    assert_eq!(
        st.blocks,
        base_blocks + bs / 512,
        "{tag}: i_blocks counts the xattr block"
    );
    assert_eq!(sorted(fs.xattrs(b"/f").unwrap()), shown(&want));

    // Flags.
    assert_eq!(
        fs.setxattr(b"/f", b"user.small", b"x", XATTR_CREATE, true, &root())
            .unwrap_err()
            .errno(),
        Errno::EEXIST
    );
    assert_eq!(
        fs.setxattr(b"/f", b"user.none", b"x", XATTR_REPLACE, true, &root())
            .unwrap_err()
            .errno(),
        Errno::ENODATA
    );
    assert_eq!(
        fs.removexattr(b"/f", b"user.none", true, &root()).unwrap_err().errno(),
        Errno::ENODATA
    );
    // Names and sizes.
    for (name, errno) in [
        (&b"user."[..], Errno::EINVAL),
        (b"", Errno::ERANGE),
        (b"os2.x", Errno::EOPNOTSUPP),
        (b"system.foo", Errno::EOPNOTSUPP),
    ] {
        assert_eq!(
            fs.setxattr(b"/f", name, b"x", 0, true, &root()).unwrap_err().errno(),
            errno,
            "{name:?}"
        );
    }
    let long = [b'n'; 300];
    assert_eq!(
        fs.setxattr(b"/f", &[&b"user."[..], &long].concat(), b"x", 0, true, &root())
            .unwrap_err()
            .errno(),
        Errno::ERANGE
    );
    assert_eq!(
        fs.setxattr(b"/f", b"user.huge", &vec![1u8; 70_000], 0, true, &root())
            .unwrap_err()
            .errno(),
        Errno::E2BIG
    );
    assert_eq!(
        fs.setxattr(b"/f", b"user.huge", &vec![1u8; bs as usize], 0, true, &root())
            .unwrap_err()
            .errno(),
        Errno::ENOSPC
    );
    assert_eq!(
        sorted(fs.xattrs(b"/f").unwrap()),
        shown(&want),
        "{tag}: failed sets changed nothing"
    );

    // Replace: the largest one shrinks (it moves to the body if it fits),
    // the small one grows (into the block).
    let last = format!("user.grow{}", k - 1).into_bytes();
    fs.setxattr(b"/f", &last, b"tiny", XATTR_REPLACE, true, &root())
        .unwrap();
    want.insert(last.clone(), b"tiny".to_vec());
    assert_eq!(
        sorted(fs.xattrs(b"/f").unwrap()),
        shown(&want),
        "{tag}: shrunk into the body"
    );
    fs.setxattr(b"/f", b"user.small", &value(150, 3), XATTR_REPLACE, true, &root())
        .unwrap();
    want.insert(b"user.small".to_vec(), value(150, 3));
    assert_eq!(sorted(fs.xattrs(b"/f").unwrap()), shown(&want));

    // Other namespaces, ACLs.
    fs.setxattr(b"/f", b"trusted.t", b"trusted value", 0, true, &root())
        .unwrap();
    want.insert(b"trusted.t".to_vec(), b"trusted value".to_vec());
    fs.setxattr(b"/f", b"security.s", b"sec", 0, true, &root()).unwrap();
    want.insert(b"security.s".to_vec(), b"sec".to_vec());
    fs.setxattr(b"/f", b"system.posix_acl_access", &acl_value(), 0, true, &root())
        .unwrap();
    want.insert(b"system.posix_acl_access".to_vec(), acl_value());
    // The mode follows the ACL: owner rw-, mask r-x, other ---.
    assert_eq!(fs.stat(b"/f").unwrap().perm(), 0o650);
    fs.setxattr(b"/d", b"system.posix_acl_default", &acl_value(), 0, true, &root())
        .unwrap();
    assert_eq!(
        fs.setxattr(b"/f", b"system.posix_acl_default", &acl_value(), 0, true, &root())
            .unwrap_err()
            .errno(),
        Errno::EACCES
    );
    assert_eq!(sorted(fs.xattrs(b"/f").unwrap()), shown(&want));
    assert_eq!(
        fs.getxattr_as(b"/f", b"system.posix_acl_access", true, &root())
            .unwrap(),
        acl_value()
    );
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);

    // A fresh open and the kernel read the same.
    let fs = open_rw(&img);
    assert_eq!(sorted(fs.xattrs(b"/f").unwrap()), shown(&want));
    drop(fs);
    need_kernel();
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", true).unwrap();
        let got = kernel_xattrs(&m.path().join("f"));
        assert_eq!(shown(&got), shown(&want), "{tag}: the kernel's getfattr -d -m -");
        let d = kernel_xattrs(&m.path().join("d"));
        assert_eq!(
            d.get(&b"system.posix_acl_default"[..]).map(|v| hex(v)),
            Some(hex(&acl_value()))
        );
        m.unmount().unwrap();
    }
    // The kernel edits what we wrote (its own placement and hashing code
    // meets our layout), and e2fsck still agrees.
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", false).unwrap();
        let f = m.path().join("f");
        sh(Command::new("setfattr").args(["-x", "user.grow2"]).arg(&f));
        sh(Command::new("setfattr")
            .args(["-n", "user.kernel", "-v", "0x6b65726e656c"])
            .arg(&f));
        m.unmount().unwrap();
    }
    want.remove(&b"user.grow2"[..]);
    want.insert(b"user.kernel".to_vec(), b"kernel".to_vec());
    fsck_clean(&img);

    // Remove everything: the block goes, i_blocks comes back.
    let fs = open_rw(&img);
    for name in want.keys() {
        fs.removexattr(b"/f", name, true, &root())
            .unwrap_or_else(|e| panic!("{tag}: remove {}: {e}", String::from_utf8_lossy(name)));
    }
    fs.removexattr(b"/d", b"system.posix_acl_default", true, &root())
        .unwrap();
    let st = fs.stat_ino(ino).unwrap();
    assert_eq!(st.file_acl, 0);
    assert_eq!(st.blocks, base_blocks);
    assert!(fs.xattrs(b"/f").unwrap().is_empty());
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}

fn name_len(k: usize) -> usize {
    format!("grow{k}").len()
}

#[test]
fn xattrs_ext4_256() {
    xattr_cycle("ext4", &["-t", "ext4", "-I", "256", "-b", "1024"], true);
}

#[test]
fn xattrs_ext4_128() {
    xattr_cycle("ext4-128", &["-t", "ext4", "-I", "128", "-b", "4096"], false);
}

#[test]
fn xattrs_ext3() {
    xattr_cycle("ext3", &["-t", "ext3", "-I", "256", "-b", "1024"], true);
}

#[test]
fn xattrs_ext2() {
    xattr_cycle("ext2", &["-t", "ext2", "-b", "2048"], true);
}

/// Three files whose identical xattr blocks the kernel shares; changing
/// one copies the block, removing from another drops the refcount, and
/// dropping the third's frees it.
#[test]
fn shared_block_copy_on_write() {
    need_kernel();
    let dir = scratch("shared");
    let img = mkfs(&dir, "shared", &["-t", "ext4", "-I", "256", "-b", "1024"]);
    let big = value(600, 7);
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", false).unwrap();
        for f in ["a", "b", "c"] {
            let p = m.path().join(f);
            std::fs::write(&p, f).unwrap();
            sh(Command::new("setfattr")
                .args(["-n", "user.big", "-v"])
                .arg(format!("0x{}", hex(&big)))
                .arg(&p));
        }
        m.unmount().unwrap();
    }
    let fs = open_rw(&img);
    let bs = fs.statfs().unwrap().block_size as u64;
    let st: Vec<_> = ["/a", "/b", "/c"]
        .iter()
        .map(|p| fs.stat(p.as_bytes()).unwrap())
        .collect();
    let shared = st[0].file_acl;
    assert!(
        shared != 0 && st.iter().all(|s| s.file_acl == shared),
        "kernel shared the block: {st:?}"
    );
    assert_eq!(block_refcount(&img, shared, bs), 3);

    // Change a: it gets its own block, the shared one drops to 2.
    fs.setxattr(b"/a", b"user.big", &value(600, 8), XATTR_REPLACE, true, &root())
        .unwrap();
    let a = fs.stat(b"/a").unwrap();
    assert!(a.file_acl != 0 && a.file_acl != shared);
    assert_eq!(a.blocks, st[0].blocks);
    // Remove from b: refcount 1, b has no block.
    fs.removexattr(b"/b", b"user.big", true, &root()).unwrap();
    let b = fs.stat(b"/b").unwrap();
    assert_eq!(b.file_acl, 0);
    assert_eq!(b.blocks + bs / 512, st[1].blocks);
    fs.sync().unwrap();
    // sync commits to the journal; the home locations follow at the
    // checkpoint, which this test wants to read from the image file.
    fs.volume().checkpoint().unwrap();
    assert_eq!(block_refcount(&img, shared, bs), 1);
    assert_eq!(block_refcount(&img, a.file_acl, bs), 1);
    assert_eq!(fs.getxattr(b"/c", b"user.big").unwrap(), big);
    drop(fs);
    fsck_clean(&img);
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", true).unwrap();
        assert_eq!(kernel_xattrs(&m.path().join("a"))[&b"user.big"[..]], value(600, 8));
        assert!(kernel_xattrs(&m.path().join("b")).is_empty());
        assert_eq!(kernel_xattrs(&m.path().join("c"))[&b"user.big"[..]], big);
        m.unmount().unwrap();
    }

    // xattr_write::drop_block (what inode deletion calls) on c frees the last reference.
    let fs = open_rw(&img);
    let c = fs.lstat(b"/c").unwrap();
    {
        let ci = fs.inode(c.ino).unwrap();
        let mut rec = ci.disk.write();
        let mut new = rec.clone();
        let mut h = fs.volume().begin().unwrap();
        xattr_write::drop_block(fs.volume(), &mut h, c.ino, &mut new).unwrap();
        inode::write(fs.volume(), &mut h, c.ino, &new).unwrap();
        h.commit().unwrap();
        *rec = new;
    }
    let c2 = fs.stat(b"/c").unwrap();
    assert_eq!((c2.file_acl, c2.blocks + bs / 512), (0, c.blocks));
    let free_before = fs.statfs().unwrap().blocks_free;
    drop(fs);
    let fs = open_rw(&img);
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let out = sh(Command::new("debugfs")
        .args(["-R", &format!("testb {shared}")])
        .arg(&img));
    assert!(out.contains("not in use"), "block {shared} freed: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Permission rules of the xattr calls for an ordinary user.
#[test]
fn xattr_permissions() {
    let dir = scratch("xperm");
    let img = mkfs(&dir, "xperm", &["-t", "ext4", "-I", "256"]);
    let fs = open_rw(&img);
    let alice = Cred::user(1000, 1000);
    let bob = Cred::user(1001, 1001);
    fs.write_file(b"/mine", b"x", 0o644, 1000, 1000).unwrap();
    fs.mknod(b"/fifo", ext4kit::FileType::Fifo, 0o666, 1000, 1000, (0, 0))
        .unwrap();
    let e = |r: ext4kit::Result<()>| r.unwrap_err().errno();
    fs.symlink(b"mine", b"/link", 1000, 1000).unwrap();
    fs.setxattr(b"/mine", b"user.a", b"1", 0, true, &alice).unwrap();
    // lsetxattr on the link itself: user.* refused, trusted.* fine for root;
    // following the link reaches the file.
    assert_eq!(
        e(fs.setxattr(b"/link", b"user.b", b"2", 0, false, &alice)),
        Errno::EPERM
    );
    assert_eq!(
        e(fs.setxattr(b"/link", b"system.posix_acl_access", &acl_value(), 0, false, &alice)),
        Errno::EOPNOTSUPP
    );
    fs.setxattr(b"/link", b"trusted.l", b"on the link", 0, false, &root())
        .unwrap();
    assert_eq!(fs.getxattr_as(b"/link", b"user.a", true, &alice).unwrap(), b"1");
    assert_eq!(
        fs.listxattr(b"/link", false, &root()).unwrap(),
        vec![b"trusted.l".to_vec()]
    );
    // lchown changes the link, not the target.
    let l = fs.chown(b"/link", Some(5), Some(6), false, &root()).unwrap();
    assert_eq!((l.uid, l.gid), (5, 6));
    assert_eq!(fs.stat(b"/mine").unwrap().uid, 1000);
    assert_eq!(e(fs.setxattr(b"/mine", b"user.a", b"2", 0, true, &bob)), Errno::EACCES);
    assert_eq!(fs.getxattr_as(b"/mine", b"user.a", true, &bob).unwrap(), b"1");
    assert_eq!(
        e(fs.setxattr(b"/mine", b"trusted.a", b"2", 0, true, &alice)),
        Errno::EPERM
    );
    assert_eq!(
        e(fs.setxattr(b"/mine", b"security.a", b"2", 0, true, &alice)),
        Errno::EPERM
    );
    assert_eq!(e(fs.setxattr(b"/fifo", b"user.a", b"2", 0, true, &alice)), Errno::EPERM);
    assert_eq!(
        e(fs.setxattr(b"/mine", b"system.posix_acl_access", &acl_value(), 0, true, &bob)),
        Errno::EPERM
    );
    fs.setxattr(b"/mine", b"system.posix_acl_access", &acl_value(), 0, true, &alice)
        .unwrap();
    fs.setxattr(b"/mine", b"trusted.a", b"t", 0, true, &root()).unwrap();
    assert_eq!(
        fs.getxattr_as(b"/mine", b"trusted.a", true, &alice)
            .unwrap_err()
            .errno(),
        Errno::ENODATA
    );
    let names = fs.listxattr(b"/mine", true, &alice).unwrap();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(fs.listxattr(b"/mine", true, &root()).unwrap().len(), 3);
    // An equivalent ACL is not stored: it only sets the mode.
    let mut min = 2u32.to_le_bytes().to_vec();
    for (t, p) in [(1u16, 7u16), (4, 5), (0x20, 1)] {
        min.extend_from_slice(&t.to_le_bytes());
        min.extend_from_slice(&p.to_le_bytes());
        min.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    fs.setxattr(b"/mine", b"system.posix_acl_access", &min, 0, true, &alice)
        .unwrap();
    assert_eq!(fs.stat(b"/mine").unwrap().perm(), 0o751);
    assert_eq!(fs.listxattr(b"/mine", true, &alice).unwrap(), vec![b"user.a".to_vec()]);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}

/// chmod / chown / utimens rules, and nanosecond times read back by the kernel.
#[test]
fn setattr_rules_and_times() {
    let dir = scratch("setattr");
    let img = mkfs(&dir, "setattr", &["-t", "ext4", "-I", "256"]);
    let fs = open_rw(&img);
    let alice = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![3000],
    };
    let bob = Cred::user(1001, 1001);
    fs.write_file(b"/f", b"data", 0o644, 0, 0).unwrap();
    let e = |r: ext4kit::Result<ext4kit::Stat>| r.unwrap_err().errno();

    // Root: chmod, chown clears set-uid (and set-gid with group exec).
    fs.chmod(b"/f", 0o6755, &root()).unwrap();
    let st = fs.chown(b"/f", Some(1000), Some(2000), true, &root()).unwrap();
    assert_eq!((st.uid, st.gid, st.perm()), (1000, 2000, 0o755));
    // Set-gid without group exec survives a chown by root.
    fs.chmod(b"/f", 0o2745, &root()).unwrap();
    let st = fs.chown(b"/f", None, Some(2000), true, &root()).unwrap();
    assert_eq!(st.perm(), 0o2745);

    // The owner (not in group 2000): chmod drops S_ISGID.
    assert_eq!(fs.chmod(b"/f", 0o2750, &alice).unwrap().perm(), 0o750);
    // Not the owner: EPERM.
    assert_eq!(e(fs.chmod(b"/f", 0o777, &bob)), Errno::EPERM);
    // chown to someone else needs root; to oneself is fine.
    assert_eq!(e(fs.chown(b"/f", Some(1001), None, true, &alice)), Errno::EPERM);
    fs.chown(b"/f", Some(1000), None, true, &alice).unwrap();
    // chgrp by the owner: only to a group they are in.
    assert_eq!(e(fs.chown(b"/f", None, Some(4000), true, &alice)), Errno::EPERM);
    assert_eq!(fs.chown(b"/f", None, Some(3000), true, &alice).unwrap().gid, 3000);
    assert_eq!(e(fs.chown(b"/f", None, Some(1001), true, &bob)), Errno::EPERM);
    // chmod by the owner in the file's group keeps S_ISGID.
    assert_eq!(fs.chmod(b"/f", 0o2750, &alice).unwrap().perm(), 0o2750);

    // Times.
    let t = Timestamp {
        sec: 1_234_567_890,
        nsec: 123_456_789,
    };
    let before = fs.stat(b"/f").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        e(fs.utimens(b"/f", Some(TimeSet::Set(t)), None, true, &bob)),
        Errno::EPERM
    );
    assert_eq!(
        e(fs.utimens(b"/f", Some(TimeSet::Now), Some(TimeSet::Now), true, &bob)),
        Errno::EACCES
    );
    let st = fs
        .utimens(b"/f", Some(TimeSet::Set(t)), Some(TimeSet::Set(t)), true, &alice)
        .unwrap();
    assert_eq!((st.atime, st.mtime), (t, t));
    assert!(st.ctime > before.ctime, "ctime moves on every change");
    assert_eq!(
        e(fs.utimens(
            b"/f",
            Some(TimeSet::Set(Timestamp {
                sec: 0,
                nsec: 1_000_000_000
            })),
            None,
            true,
            &alice
        )),
        Errno::EINVAL
    );
    // A writable file: anyone may touch it to now, only the owner set times.
    fs.write_file(b"/w", b"", 0o666, 0, 0).unwrap();
    let st = fs
        .utimens(b"/w", Some(TimeSet::Now), Some(TimeSet::Now), true, &bob)
        .unwrap();
    assert!(st.mtime.sec > t.sec);
    assert_eq!(e(fs.utimens(b"/w", None, Some(TimeSet::Now), true, &bob)), Errno::EPERM);
    // Both omitted: no check, no change (not even ctime).
    assert_eq!(
        fs.utimens(b"/f", None, None, true, &bob).unwrap(),
        fs.stat(b"/f").unwrap()
    );
    // setattr_ino with everything at once, as root.
    let st = fs
        .setattr_ino(
            st.ino,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(77),
                gid: Some(88),
                atime: Some(TimeSet::Set(Timestamp { sec: -5, nsec: 7 })),
                mtime: None,
            },
            &root(),
        )
        .unwrap();
    assert_eq!(
        (st.perm(), st.uid, st.gid, st.atime.sec, st.atime.nsec),
        (0o600, 77, 88, -5, 7)
    );
    // access
    assert!(fs.access(b"/f", 4, &alice).is_ok());
    assert_eq!(fs.access(b"/f", 2, &bob).unwrap_err().errno(), Errno::EACCES);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);

    // The kernel sees the nanoseconds, the owner and the mode.
    need_kernel();
    let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", true).unwrap();
    let out = sh(Command::new("stat")
        .args(["-c", "%a %u %g %x|%y"])
        .arg(m.path().join("f")));
    let (head, times) = out.trim().split_once(' ').unwrap();
    assert_eq!(head, "2750");
    assert!(times.starts_with("1000 3000 "), "{times}");
    for part in times["1000 3000 ".len()..].split('|') {
        assert!(part.contains(".123456789"), "kernel reads ns: {part}");
    }
    let out = sh(Command::new("stat").args(["-c", "%a %u %g %X"]).arg(m.path().join("w")));
    assert_eq!(out.trim(), "600 77 88 -5");
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// statfs against the kernel's statfs of the same image.
#[test]
fn statfs_matches_kernel() {
    need_kernel();
    for (tag, args, extents) in [
        ("sf-ext4", &["-t", "ext4", "-m", "5"][..], true),
        ("sf-ext4-1k", &["-t", "ext4", "-b", "1024", "-m", "1"][..], true),
        ("sf-ext2", &["-t", "ext2", "-m", "5"][..], false),
    ] {
        let dir = scratch(tag);
        let img = mkfs(&dir, tag, args);
        let fs = open_rw(&img);
        for i in 0..20 {
            fs.write_file(format!("/f{i}").as_bytes(), &vec![7u8; 30_000], 0o644, 0, 0)
                .unwrap();
        }
        let ours = fs.statfs().unwrap();
        fs.sync().unwrap();
        drop(fs);
        fsck_clean(&img);
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", true).unwrap();
        let out = sh(Command::new("stat")
            .args(["-f", "-c", "%S %b %f %a %c %d %l %i"])
            .arg(m.path()));
        m.unmount().unwrap();
        let f: Vec<&str> = out.split_whitespace().collect();
        let n = |i: usize| f[i].parse::<u64>().unwrap();
        assert_eq!(n(0), ours.block_size as u64, "{tag}: {out}");
        assert_eq!(n(1), ours.blocks, "{tag} f_blocks: {out} vs {ours:?}");
        assert_eq!(n(2), ours.blocks_free, "{tag} f_bfree");
        // The kernel holds back min(2 %, 4096) clusters more on extent filesystems.
        let kresv = if extents {
            let total = ext4kit_blocks_count(&img);
            (total / 50).min(4096)
        } else {
            0
        };
        assert_eq!(n(3), ours.blocks_avail.saturating_sub(kresv), "{tag} f_bavail");
        assert_eq!(n(4), ours.files, "{tag} f_files");
        assert_eq!(n(5), ours.files_free, "{tag} f_ffree");
        assert_eq!(n(6), ours.name_max as u64);
        let fsid = u64::from_str_radix(f[7], 16).unwrap();
        assert!(
            fsid == ours.fsid || fsid == ours.fsid.rotate_left(32),
            "{tag} fsid {fsid:x} vs {:x}",
            ours.fsid
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn ext4kit_blocks_count(img: &Path) -> u64 {
    let out = sh(Command::new("dumpe2fs").arg("-h").arg(img));
    out.lines()
        .find_map(|l| l.strip_prefix("Block count:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// Times on 128-byte inodes: whole seconds, 32-bit range (the kernel's
/// s_time_min / s_time_max for inodes without the _extra fields).
#[test]
fn times_on_small_inodes() {
    let dir = scratch("small-times");
    let img = mkfs(&dir, "small-times", &["-t", "ext4", "-I", "128"]);
    let fs = open_rw(&img);
    fs.write_file(b"/f", b"", 0o644, 0, 0).unwrap();
    let t = Timestamp {
        sec: 5_000_000_000,
        nsec: 999,
    };
    let st = fs
        .utimens(
            b"/f",
            Some(TimeSet::Set(t)),
            Some(TimeSet::Set(Timestamp { sec: -7, nsec: 5 })),
            true,
            &root(),
        )
        .unwrap();
    assert_eq!(
        st.atime,
        Timestamp {
            sec: i32::MAX as i64,
            nsec: 0
        }
    );
    assert_eq!(st.mtime, Timestamp { sec: -7, nsec: 0 });
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without the ext_attr feature there is nowhere to put attributes.
#[test]
fn no_ext_attr_feature() {
    let dir = scratch("no-xattr");
    let img = mkfs(&dir, "no-xattr", &["-t", "ext2", "-O", "^ext_attr"]);
    let fs = open_rw(&img);
    fs.write_file(b"/f", b"", 0o644, 0, 0).unwrap();
    assert_eq!(
        fs.setxattr(b"/f", b"user.a", b"1", 0, true, &root())
            .unwrap_err()
            .errno(),
        Errno::EOPNOTSUPP
    );
    drop(fs);
    fsck_clean(&img);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Random set / replace / remove sequences on files that start out sharing
/// one kernel-made xattr block, checked after every step against a model
/// (values, `i_blocks`), then by e2fsck (which recounts block refcounts)
/// and the kernel.
fn random_sequence(tag: &str, args: &[&str], seed: u64) {
    need_kernel();
    let dir = scratch(tag);
    let img = mkfs(&dir, tag, args);
    const FILES: usize = 4;
    let shared = value(300, 1);
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", false).unwrap();
        for i in 0..FILES {
            let p = m.path().join(format!("f{i}"));
            std::fs::write(&p, b"x").unwrap();
            sh(Command::new("setfattr")
                .args(["-n", "user.shared", "-v"])
                .arg(format!("0x{}", hex(&shared)))
                .arg(&p));
        }
        m.unmount().unwrap();
    }
    let fs = open_rw(&img);
    let bs = fs.statfs().unwrap().block_size as u64;
    let mut model: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = (0..FILES)
        .map(|_| BTreeMap::from([(b"user.shared".to_vec(), shared.clone())]))
        .collect();
    let base: Vec<u64> = (0..FILES)
        .map(|i| {
            let st = fs.stat(format!("/f{i}").as_bytes()).unwrap();
            assert_ne!(st.file_acl, 0);
            st.blocks - bs / 512
        })
        .collect();
    let mut rng = ext4kit_testkit::TestRng::new(seed);
    let names: Vec<Vec<u8>> = (0..8)
        .map(|k| format!("user.{}", "n".repeat(1 + k * 3)).into_bytes())
        .chain([b"user.shared".to_vec(), b"trusted.t".to_vec(), b"security.s".to_vec()])
        .collect();
    // What the sequence went through: ENOSPC refusals, steps where a file
    // had no block, blocks distinct from the shared one.
    let (mut full, mut no_block, mut own_block) = (0, 0, 0);
    let first_block = fs.stat(b"/f0").unwrap().file_acl;
    for step in 0..600 {
        let f = rng.below(FILES as u64) as usize;
        let path = format!("/f{f}");
        let name = names[rng.below(names.len() as u64) as usize].clone();
        let present = model[f].contains_key(&name);
        if rng.below(80) == 0 {
            // Now and then empty the file, so that sequences also cover a
            // file losing its block and getting one again.
            for n in std::mem::take(&mut model[f]).keys() {
                fs.removexattr(path.as_bytes(), n, true, &root())
                    .unwrap_or_else(|e| panic!("{tag} step {step}: empty: {e}"));
            }
        } else if rng.below(2) == 0 {
            let r = fs.removexattr(path.as_bytes(), &name, true, &root());
            if present {
                r.unwrap_or_else(|e| panic!("{tag} step {step}: remove: {e}"));
                model[f].remove(&name);
            } else {
                assert_eq!(r.unwrap_err().errno(), Errno::ENODATA);
            }
        } else {
            let len = match rng.below(8) {
                0..=2 => rng.below(8),
                3..=4 => rng.below(64),
                5..=6 => rng.below(300),
                _ => bs / 4 + rng.below(bs / 4),
            } as usize;
            let v = value(len, step);
            match fs.setxattr(path.as_bytes(), &name, &v, 0, true, &root()) {
                Ok(()) => {
                    model[f].insert(name.clone(), v);
                }
                Err(e) => {
                    // Only a full block may refuse, and then nothing changed.
                    assert_eq!(e.errno(), Errno::ENOSPC, "{tag} step {step}: {e}");
                    full += 1;
                    let need: usize = model[f]
                        .iter()
                        .filter(|(n, _)| **n != name)
                        .map(|(n, v)| 16 + n.len() + v.len() + 8)
                        .sum::<usize>()
                        + v.len();
                    assert!(need > bs as usize / 2, "{tag} step {step}: ENOSPC with {need} bytes");
                }
            }
        }
        let got = sorted(fs.xattrs(path.as_bytes()).unwrap());
        assert_eq!(got, shown(&model[f]), "{tag} step {step}");
        let st = fs.stat(path.as_bytes()).unwrap();
        let want_blocks = base[f] + if st.file_acl != 0 { bs / 512 } else { 0 };
        assert_eq!(st.blocks, want_blocks, "{tag} step {step}: i_blocks");
        match st.file_acl {
            0 => no_block += 1,
            b if b != first_block => own_block += 1,
            _ => {}
        }
    }
    eprintln!("{tag}: {full} ENOSPC, {no_block} steps without a block, {own_block} with a private block");
    assert!(
        full > 0 && own_block > 0,
        "{tag}: the sequence covers ENOSPC and copies"
    );
    // Empty two files completely: their blocks are released.
    for f in 0..2 {
        let path = format!("/f{f}");
        for name in std::mem::take(&mut model[f]).keys() {
            fs.removexattr(path.as_bytes(), name, true, &root()).unwrap();
        }
        let st = fs.stat(path.as_bytes()).unwrap();
        assert_eq!((st.file_acl, st.blocks), (0, base[f]), "{tag}: f{f} emptied");
    }
    assert!(
        no_block > 0 || tag.contains("128"),
        "{tag}: some file lost its block mid-sequence"
    );
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", true).unwrap();
    for (i, want) in model.iter().enumerate() {
        let got = kernel_xattrs(&m.path().join(format!("f{i}")));
        assert_eq!(shown(&got), shown(want), "{tag}: kernel view of f{i}");
    }
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn random_sequence_ext4() {
    random_sequence(
        "rand-ext4",
        &["-t", "ext4", "-I", "256", "-b", "1024"],
        0x9e37_79b9_7f4a_7c15,
    );
}

#[test]
fn random_sequence_ext4_128() {
    random_sequence(
        "rand-ext4-128",
        &["-t", "ext4", "-I", "128", "-b", "1024"],
        0x1234_5678_9abc_def1,
    );
}

#[test]
fn random_sequence_ext2() {
    random_sequence("rand-ext2", &["-t", "ext2", "-b", "2048"], 0xdead_beef_cafe_f00d);
}

/// ACL-aware permission checks agree with the kernel's, before and after a
/// chmod (which rewrites the ACL's mask).
#[test]
fn acl_permissions_match_kernel() {
    need_kernel();
    let dir = scratch("acl-perm");
    let img = mkfs(&dir, "acl-perm", &["-t", "ext4", "-I", "256"]);
    let fs = open_rw(&img);
    fs.write_file(b"/f", b"secret", 0o650, 0, 20).unwrap();
    // u::rw-, u:1000:rwx, g::r--, g:3000:-w-, m::r-x, o::---
    let mut x = 2u32.to_le_bytes().to_vec();
    for (t, p, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 7, 1000),
        (4, 4, u32::MAX),
        (8, 2, 3000),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        x.extend_from_slice(&t.to_le_bytes());
        x.extend_from_slice(&p.to_le_bytes());
        x.extend_from_slice(&id.to_le_bytes());
    }
    fs.setxattr(b"/f", b"system.posix_acl_access", &x, 0, true, &root())
        .unwrap();
    let creds = [
        Cred::user(1000, 1000),
        Cred::user(1001, 20),
        Cred {
            uid: 1002,
            gid: 1002,
            groups: vec![3000],
        },
        Cred::user(1003, 1003),
    ];
    let ours = |fs: &Fs| -> Vec<String> {
        creds
            .iter()
            .map(|c| {
                [(4u8, 'r'), (2, 'w'), (1, 'x')]
                    .iter()
                    .map(|&(m, ch)| if fs.access(b"/f", m, c).is_ok() { ch } else { '-' })
                    .collect()
            })
            .collect()
    };
    let kernel = |img: &Path| -> Vec<String> {
        let m = ext4kit_testkit::LoopMount::mount(img, &dir.join("mnt"), "ext4", false).unwrap();
        let f = m.path().join("f");
        let v = creds
            .iter()
            .map(|c| {
                let groups: Vec<String> = c.groups.iter().map(|g| g.to_string()).collect();
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={}", c.uid)).arg(format!("--regid={}", c.gid));
                if groups.is_empty() {
                    cmd.arg("--clear-groups");
                } else {
                    cmd.arg(format!("--groups={}", groups.join(",")));
                }
                cmd.args([
                    "sh",
                    "-c",
                    "for t in r w x; do if test -$t \"$0\"; then printf $t; else printf -- -; fi; done",
                ])
                .arg(&f);
                sh(&mut cmd)
            })
            .collect();
        m.unmount().unwrap();
        v
    };
    let before = ours(&fs);
    assert_eq!(before, ["r-x", "r--", "---", "---"]);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    assert_eq!(kernel(&img), before, "the kernel applies the same ACL");

    // chmod 0640: the mask becomes r--, so u:1000 loses x.
    let fs = open_rw(&img);
    fs.chmod(b"/f", 0o640, &root()).unwrap();
    let after = ours(&fs);
    assert_eq!(after, ["r--", "r--", "---", "---"]);
    let acl = fs.getxattr(b"/f", b"system.posix_acl_access").unwrap();
    assert_eq!(&acl[4 + 8 * 4..4 + 8 * 4 + 4], &[0x10, 0, 4, 0], "mask entry r--");
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    assert_eq!(kernel(&img), after, "the kernel sees the rewritten mask");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Threads copying the same kernel-shared block at once: every refcount
/// decrement happens under the block lock, so the block ends with exactly
/// the references left (e2fsck recounts them) and is freed when none are.
#[test]
fn concurrent_copy_on_write_of_a_shared_block() {
    need_kernel();
    let dir = scratch("cow-race");
    let img = mkfs(&dir, "cow-race", &["-t", "ext4", "-I", "256", "-b", "1024"]);
    const FILES: usize = 16;
    let big = value(500, 3);
    {
        let m = ext4kit_testkit::LoopMount::mount(&img, &dir.join("mnt"), "ext4", false).unwrap();
        for i in 0..FILES {
            let p = m.path().join(format!("f{i}"));
            std::fs::write(&p, b"x").unwrap();
            sh(Command::new("setfattr")
                .args(["-n", "user.big", "-v"])
                .arg(format!("0x{}", hex(&big)))
                .arg(&p));
        }
        m.unmount().unwrap();
    }
    let fs = open_rw(&img);
    let shared = fs.stat(b"/f0").unwrap().file_acl;
    let bs = fs.statfs().unwrap().block_size as u64;
    assert_eq!(block_refcount(&img, shared, bs), FILES as u32);
    std::thread::scope(|s| {
        for t in 0..4 {
            let fs = &fs;
            s.spawn(move || {
                for i in (t..FILES).step_by(4) {
                    let p = format!("/f{i}");
                    if i % 2 == 0 {
                        fs.setxattr(p.as_bytes(), b"user.big", &value(500, i), XATTR_REPLACE, true, &root())
                            .unwrap();
                    } else {
                        fs.removexattr(p.as_bytes(), b"user.big", true, &root()).unwrap();
                    }
                }
            });
        }
    });
    for i in 0..FILES {
        let got = fs.xattrs(format!("/f{i}").as_bytes()).unwrap();
        if i % 2 == 0 {
            assert_eq!(got, vec![(b"user.big".to_vec(), value(500, i))]);
        } else {
            assert!(got.is_empty());
        }
    }
    // Every file that kept an attribute has a block of its own.
    let blocks: std::collections::BTreeSet<u64> = (0..FILES)
        .step_by(2)
        .map(|i| fs.stat(format!("/f{i}").as_bytes()).unwrap().file_acl)
        .collect();
    assert_eq!(blocks.len(), FILES / 2);
    fs.sync().unwrap();
    drop(fs);
    fsck_clean(&img);
    if !blocks.contains(&shared) {
        let out = sh(Command::new("debugfs")
            .args(["-R", &format!("testb {shared}")])
            .arg(&img));
        assert!(out.contains("not in use"), "the shared block was freed: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Damaged xattr blocks and pointers give a typed corruption error on
/// write, never a panic, and nothing is written.
#[test]
fn hostile_xattr_blocks() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = scratch("hostile");
    for (case, patch) in [("magic", 0u64), ("refcount", 4), ("blocks", 8), ("pointer", u64::MAX)] {
        let img = mkfs(&dir, case, &["-t", "ext2", "-I", "128", "-b", "1024"]);
        let fs = open_rw(&img);
        fs.write_file(b"/f", b"x", 0o644, 0, 0).unwrap();
        fs.setxattr(b"/f", b"user.a", &value(100, 0), 0, true, &root()).unwrap();
        let st = fs.stat(b"/f").unwrap();
        fs.sync().unwrap();
        drop(fs);
        if patch == u64::MAX {
            sh(Command::new("debugfs")
                .args(["-w", "-R", "sif /f file_acl 99999999"])
                .arg(&img));
        } else {
            let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            f.seek(SeekFrom::Start(st.file_acl * 1024 + patch)).unwrap();
            f.write_all(&if patch == 8 { 2u32 } else { 0u32 }.to_le_bytes())
                .unwrap();
        }
        let before = std::fs::read(&img).unwrap();
        let fs = open_rw(&img);
        let e1 = fs
            .setxattr(b"/f", b"user.b", &value(900, 1), 0, true, &root())
            .unwrap_err();
        let e2 = fs.removexattr(b"/f", b"user.a", true, &root()).unwrap_err();
        for e in [&e1, &e2] {
            assert_eq!(e.errno(), Errno::EUCLEAN, "{case}: {e}");
        }
        assert!(
            e1.to_string().contains("xattr") || e1.to_string().contains("i_file_acl"),
            "{case}: {e1}"
        );
        fs.sync().unwrap();
        drop(fs);
        let after = std::fs::read(&img).unwrap();
        let changed = before
            .chunks(1024)
            .zip(after.chunks(1024))
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            changed <= 1,
            "{case}: only the superblock may change, {changed} blocks did"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
