//! Partitioned disk images (GPT and MBR) and filesystems at an offset:
//! every read and write command through `--partition N`, `IMAGE@N` and
//! `--offset`, writes that leave every byte outside the chosen partition as
//! it was, `e2fsck -fn` on the partition, mkfs into a partition, the
//! automatic choice of a disk's one ext partition, `--no-replay`, hostile
//! tables, the kernel's view of the same partitions through `losetup -P`,
//! and the FUSE mount of a partition.
//!
//! Disks are made with sgdisk (GPT, package gdisk) and sfdisk (MBR, package
//! fdisk) on plain files and filled with `mke2fs -E offset=`; `.ci/run`
//! installs both. The kernel and mount tests need root, loop devices and
//! /dev/fuse (CI has them): without them they fail and say why.

use std::ffi::{OsStr, OsString};
use std::hash::Hasher;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ext4kit_testkit::{
    build_source_tree, compare_trees, e2fsck_clean, image_matrix, is_kernel_unavailable, kernel_available, make_image,
    CompareOpts, Scratch, TreeOpts,
};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

/// Run a host tool; a missing one fails with the package to install.
fn tool(name: &str, args: &[&dyn AsRef<OsStr>]) -> Output {
    let mut c = Command::new(name);
    for a in args {
        c.arg(a);
    }
    c.env("LC_ALL", "C").stdin(Stdio::null());
    match c.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let pkg = match name {
                "sgdisk" => "gdisk",
                "sfdisk" => "fdisk",
                "losetup" => "mount",
                _ => "e2fsprogs",
            };
            panic!("{name} is not installed: apt-get install {pkg} (.ci/run does)")
        }
        Err(e) => panic!("running {name}: {e}"),
    }
}

fn tool_ok(name: &str, args: &[&dyn AsRef<OsStr>]) -> String {
    let o = tool(name, args);
    assert!(
        o.status.success(),
        "{name} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ext4kit<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(BIN).args(args).stdin(Stdio::null()).output().unwrap()
}

/// Stdout of a command that must succeed.
fn ok<S: AsRef<OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let o = ext4kit(args);
    assert!(
        o.status.success(),
        "ext4kit {args:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command that must fail with one line on stderr holding every needle
/// (and no panic).
fn fails<S: AsRef<OsStr> + std::fmt::Debug>(args: &[S], needles: &[&str]) -> String {
    let o = ext4kit(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "ext4kit {args:?} should fail; stdout:\n{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!err.contains("panicked"), "ext4kit {args:?} panicked: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "ext4kit {args:?}: one line please:\n{err}"
    );
    for n in needles {
        assert!(err.contains(n), "ext4kit {args:?}: {n:?} missing from: {err}");
    }
    err
}

/// One partition: its kernel number and byte range.
#[derive(Debug, Clone, Copy)]
struct Part {
    number: u32,
    start: u64,
    size: u64,
}

/// A partitioned disk image.
#[derive(Debug)]
struct Disk {
    path: PathBuf,
    parts: Vec<Part>,
}

impl Disk {
    /// The table as `sfdisk -d` reads it (GPT or MBR).
    fn read(path: &Path) -> Disk {
        let dump = tool_ok("sfdisk", &[&"-d", &path]);
        let prefix = path.to_str().unwrap();
        let parts = dump
            .lines()
            .filter_map(|l| {
                let (dev, rest) = l.split_once(" : ")?;
                let number = dev.trim().strip_prefix(prefix)?.parse().ok()?;
                let field = |k: &str| -> Option<u64> {
                    rest.split(',')
                        .find_map(|f| f.trim().strip_prefix(&format!("{k}="))?.trim().parse().ok())
                };
                Some(Part {
                    number,
                    start: field("start")? * 512,
                    size: field("size")? * 512,
                })
            })
            .collect();
        Disk {
            path: path.to_path_buf(),
            parts,
        }
    }

    fn part(&self, n: u32) -> Part {
        *self
            .parts
            .iter()
            .find(|p| p.number == n)
            .unwrap_or_else(|| panic!("no partition {n}: {self:?}"))
    }

    /// A hash of every byte outside partition `n`.
    fn outside(&self, n: u32) -> u64 {
        let p = self.part(n);
        let bytes = std::fs::read(&self.path).unwrap();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(&bytes[..p.start as usize]);
        h.write(&bytes[(p.start + p.size) as usize..]);
        h.finish()
    }

    /// Partition `n` copied to its own file (e2fsck takes no offset).
    fn extract(&self, n: u32, to: &Path) {
        let p = self.part(n);
        let f = std::fs::File::open(&self.path).unwrap();
        let mut buf = vec![0u8; p.size as usize];
        f.read_exact_at(&mut buf, p.start).unwrap();
        std::fs::write(to, buf).unwrap();
    }

    fn fsck(&self, n: u32, work: &Path) {
        let copy = work.join(format!("part{n}.img"));
        self.extract(n, &copy);
        e2fsck_clean(&copy).unwrap_or_else(|e| panic!("partition {n}: {e}"));
        std::fs::remove_file(&copy).unwrap();
    }

    /// `disk.img@N`.
    fn at(&self, n: u32) -> String {
        format!("{}@{n}", self.path.display())
    }

    fn p(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// Make an ext filesystem of `args` (e.g. `-t ext4`) filling partition `n`,
/// from `src` if given.
fn mke2fs_in(disk: &Disk, n: u32, args: &[&str], src: Option<&Path>) {
    let p = disk.part(n);
    let mut a: Vec<OsString> = ["-q", "-F"].iter().map(OsString::from).collect();
    a.extend(args.iter().map(OsString::from));
    a.push("-E".into());
    a.push(format!("offset={}", p.start).into());
    if let Some(s) = src {
        a.push("-d".into());
        a.push(s.into());
    }
    a.push(disk.path.clone().into());
    // With -E offset, the size is the filesystem's (in KiB here).
    a.push(format!("{}k", p.size / 1024).into());
    let refs: Vec<&dyn AsRef<OsStr>> = a.iter().map(|x| x as &dyn AsRef<OsStr>).collect();
    tool_ok("mke2fs", &refs);
}

/// Fill partition `n` with a byte pattern (a non-ext partition whose bytes
/// must survive).
fn junk(disk: &Disk, n: u32) {
    let p = disk.part(n);
    let f = std::fs::OpenOptions::new().write(true).open(&disk.path).unwrap();
    let buf: Vec<u8> = (0..p.size).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
    f.write_all_at(&buf, p.start).unwrap();
}

/// A small tree for the second partition.
fn small_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/hostname"), "data-partition\n").unwrap();
    std::fs::write(dir.join("readme"), "second filesystem\n").unwrap();
}

/// A GPT disk: 1 EFI (junk), 2 ext4 "root" from the fixture tree, 3 ext2
/// "data" (1 KiB blocks) from a small tree, 4 swap (junk). Returns the disk
/// and the fixture tree.
fn gpt_fixture(work: &Path, tree: bool) -> (Disk, PathBuf) {
    let src = work.join("src");
    if tree {
        build_source_tree(&src, &TreeOpts::small()).unwrap();
    } else {
        small_tree(&src);
    }
    let small = work.join("small");
    small_tree(&small);
    // Partition 2: the fixture tree as the image matrix makes it (mke2fs
    // -d, then every time restored to the nanosecond), copied in; its size
    // is the filesystem's, rounded up to MiB.
    let p2 = work.join("p2.img");
    let spec = image_matrix().into_iter().find(|s| s.name == "ext4-default").unwrap();
    if tree {
        make_image(&spec, &src, &p2).unwrap();
    } else {
        let mut v: Vec<&dyn AsRef<OsStr>> = vec![&"-q", &"-F", &"-t", &"ext4", &"-I", &"256", &"-d", &src, &p2];
        v.push(&"8M");
        tool_ok("mke2fs", &v);
    }
    tool_ok("tune2fs", &[&"-L", &"root", &p2]);
    let p2_mib = std::fs::metadata(&p2).unwrap().len().div_ceil(1 << 20);
    let path = work.join("disk.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len((p2_mib + 40) << 20)
        .unwrap();
    let n2 = format!("-n2:0:+{p2_mib}M");
    tool_ok(
        "sgdisk",
        &[
            &"-n1:2048:+4M",
            &"-t1:ef00",
            &"-c1:esp",
            &n2,
            &"-t2:8300",
            &"-c2:root",
            &"-n3:0:+24M",
            &"-t3:8300",
            &"-c3:data",
            &"-n4:0:0",
            &"-t4:8200",
            &"-c4:swap",
            &path,
        ],
    );
    let disk = Disk::read(&path);
    assert_eq!(disk.parts.len(), 4, "{disk:?}");
    junk(&disk, 1);
    junk(&disk, 4);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&std::fs::read(&p2).unwrap(), disk.part(2).start)
        .unwrap();
    std::fs::remove_file(&p2).unwrap();
    mke2fs_in(&disk, 3, &["-t", "ext2", "-b", "1024", "-L", "data"], Some(&small));
    (disk, src)
}

/// How a test names partition `n`: the flag (after the subcommand), the
/// flag before the subcommand, the short form, the byte offset.
#[derive(Debug, Clone, Copy)]
enum Form {
    Flag,
    GlobalFlag,
    Short,
    Offset,
}

const FORMS: [Form; 4] = [Form::Flag, Form::GlobalFlag, Form::Short, Form::Offset];

/// `ext4kit SUB ARGS` with partition `n` of `disk` chosen by `form`; "IMG"
/// in `args` is replaced by the image argument (also inside "IMG:/dest").
fn cmd(disk: &Disk, n: u32, form: Form, sub: &str, args: &[&str]) -> Vec<String> {
    let img = match form {
        Form::Short => disk.at(n),
        _ => disk.p().to_string(),
    };
    let flag = match form {
        Form::Flag | Form::GlobalFlag => vec!["--partition".to_string(), n.to_string()],
        Form::Offset => vec!["--offset".to_string(), disk.part(n).start.to_string()],
        Form::Short => vec![],
    };
    let mut v = Vec::new();
    if matches!(form, Form::GlobalFlag) {
        v.extend(flag.clone());
    }
    v.push(sub.to_string());
    if !matches!(form, Form::GlobalFlag) {
        v.extend(flag);
    }
    v.extend(args.iter().map(|a| a.replace("IMG", &img)));
    v
}

/// How get's output and a mount compare with the source tree (as the
/// image matrix's ext4-default).
fn tree_opts() -> CompareOpts {
    image_matrix()
        .into_iter()
        .find(|s| s.name == "ext4-default")
        .unwrap()
        .compare_opts()
}

#[test]
fn every_read_command_works_through_every_form() {
    let work = Scratch::dir("ext4kit-part-read");
    let (disk, src) = gpt_fixture(&work, true);
    let before = std::fs::read(&disk.path).unwrap();
    for form in FORMS {
        let info = ok(&cmd(&disk, 2, form, "info", &["IMG"]));
        assert!(
            info.contains("Label:            root") && info.contains("metadata_csum"),
            "{form:?}: {info}"
        );
        if !matches!(form, Form::Offset) {
            assert!(
                info.contains("Partition:        2 of 4 (GPT)") && info.contains("\"root\""),
                "{form:?}: {info}"
            );
        }
        let ls = ok(&cmd(&disk, 2, form, "ls", &["IMG", "/"]));
        assert!(ls.lines().any(|l| l == "bigdir"), "{form:?}: {ls}");
        let lsl = ok(&cmd(&disk, 2, form, "ls", &["-l", "IMG", "/bigdir"]));
        assert_eq!(lsl.lines().count(), 2000, "{form:?}");
        let size = ok(&cmd(&disk, 2, form, "stat", &["IMG", "/sizes/large"]));
        assert!(size.contains("Size: 5247201"), "{form:?}: {size}");
        let cat = Command::new(BIN)
            .args(cmd(&disk, 2, form, "cat", &["IMG", "/sizes/large"]))
            .output()
            .unwrap();
        assert!(cat.status.success());
        assert_eq!(cat.stdout, std::fs::read(src.join("sizes/large")).unwrap(), "{form:?}");
        let df = ok(&cmd(&disk, 2, form, "df", &["IMG"]));
        assert!(df.contains("Use%"), "{form:?}: {df}");
        let xattr_file = find_xattr_file(&src);
        let rel = format!("/{}", xattr_file.strip_prefix(&src).unwrap().display());
        let fattr = ok(&cmd(&disk, 2, form, "getfattr", &["IMG", &rel]));
        assert!(fattr.contains("user."), "{form:?}: {fattr}");
        // The whole tree, out and compared with the source.
        let out = work.join(format!("out-{form:?}"));
        ok(&cmd(&disk, 2, form, "get", &["IMG", "/", out.to_str().unwrap()]));
        let diffs = compare_trees(&src, &out, &tree_opts()).unwrap();
        assert!(diffs.is_empty(), "{form:?}: get differs from the source:\n{diffs:#?}");
        std::fs::remove_dir_all(&out).unwrap();
        // The other ext partition, to show the number matters.
        let ls3 = ok(&cmd(&disk, 3, form, "cat", &["IMG", "/etc/hostname"]));
        assert_eq!(ls3, "data-partition\n");
    }
    assert!(
        std::fs::read(&disk.path).unwrap() == before,
        "a read command changed the disk"
    );
}

/// A file with a user.* xattr in the fixture tree.
fn find_xattr_file(src: &Path) -> PathBuf {
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p.clone());
            }
            if ft.is_file() {
                let names = ext4kit_testkit::read_xattrs(&p).unwrap();
                if names.keys().any(|k| k.starts_with(b"user.")) {
                    return p;
                }
            }
        }
    }
    panic!("the fixture tree has no file with a user.* xattr")
}

#[test]
fn writes_stay_inside_the_partition() {
    let work = Scratch::dir("ext4kit-part-write");
    let (disk, _src) = gpt_fixture(&work, false);
    let host = work.join("host.txt");
    std::fs::write(&host, "from the host\n").unwrap();
    let outside = disk.outside(2);
    for form in FORMS {
        let d = format!("/w-{form:?}");
        let dd = |s: &str| format!("{d}/{s}");
        ok(&cmd(&disk, 2, form, "mkdir", &["-p", "IMG", &dd("a/b")]));
        ok(&cmd(
            &disk,
            2,
            form,
            "put",
            &[host.to_str().unwrap(), &format!("IMG:{}", dd("f"))],
        ));
        ok(&cmd(&disk, 2, form, "ln", &["-s", "IMG", "f", &dd("sym")]));
        ok(&cmd(&disk, 2, form, "ln", &["IMG", &dd("f"), &dd("hard")]));
        ok(&cmd(&disk, 2, form, "mv", &["IMG", &dd("f"), &dd("g")]));
        ok(&cmd(&disk, 2, form, "chmod", &["IMG", "600", &dd("g")]));
        ok(&cmd(&disk, 2, form, "chown", &["IMG", "1000:100", &dd("g")]));
        ok(&cmd(
            &disk,
            2,
            form,
            "touch",
            &["-d", "1000000000.5", "IMG", &dd("g"), &dd("new")],
        ));
        ok(&cmd(&disk, 2, form, "truncate", &["-s", "1M", "IMG", &dd("big")]));
        ok(&cmd(
            &disk,
            2,
            form,
            "setfattr",
            &["-n", "user.k", "-v", "v1", "IMG", &dd("g")],
        ));
        ok(&cmd(&disk, 2, form, "rm", &["-r", "IMG", &dd("a")]));
        // Read back through the same form.
        assert_eq!(
            ok(&cmd(&disk, 2, form, "cat", &["IMG", &dd("hard")])),
            "from the host\n"
        );
        let ls = ok(&cmd(&disk, 2, form, "ls", &["IMG", &d]));
        assert_eq!(
            ls.lines().collect::<Vec<_>>(),
            vec!["big", "g", "hard", "new", "sym"],
            "{form:?}"
        );
        let st = ok(&cmd(&disk, 2, form, "stat", &["IMG", &dd("g")]));
        assert!(
            st.contains("Mode: 0600 (-rw-------)  Uid: 1000  Gid: 100"),
            "{form:?}: {st}"
        );
        assert!(st.contains("Modify: 2001-09-09 01:46:40.500000000"), "{form:?}: {st}");
        let x = ok(&cmd(&disk, 2, form, "getfattr", &["-n", "user.k", "IMG", &dd("g")]));
        assert!(x.contains("v1"), "{form:?}: {x}");
        assert_eq!(disk.outside(2), outside, "{form:?}: bytes outside partition 2 changed");
    }
    disk.fsck(2, &work);
    disk.fsck(3, &work);
}

#[test]
fn one_ext_partition_is_chosen_alone_and_several_are_listed() {
    let work = Scratch::dir("ext4kit-part-auto");
    let (disk, _src) = gpt_fixture(&work, false);
    // Two ext partitions: commands refuse and list them; info lists them.
    let e = fails(
        &["ls", disk.p(), "/"],
        &[
            "partitioned disk",
            "GPT",
            "2 (Linux filesystem",
            "3 (Linux filesystem",
            "--partition N",
        ],
    );
    assert!(e.contains("ext4 \"root\"") && e.contains("ext2 \"data\""), "{e}");
    fails(&["mkdir", disk.p(), "/x"], &["partitioned disk", "--partition N"]);
    let info = ok(&["info", disk.p()]);
    for want in [
        "Partition table:  GPT, 512-byte sectors, 4 partitions",
        "EFI System",
        "esp",
        "Linux swap",
        "ext4 \"root\"",
        "ext2 \"data\"",
    ] {
        assert!(info.contains(want), "{want:?} missing from:\n{info}");
    }
    assert!(!info.contains("Block size:"), "two ext partitions: no summary:\n{info}");
    // Make partition 3 not ext: now the one ext partition is used, with a note.
    junk(&disk, 3);
    let o = ext4kit(&["ls", disk.p(), "/"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("note:") && err.contains("using partition 2"), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "etc"));
    ok(&["mkdir", disk.p(), "/auto"]);
    assert!(ok(&["ls", &disk.at(2), "/"]).lines().any(|l| l == "auto"));
    let info = ok(&["info", disk.p()]);
    assert!(
        info.contains("Partition 2 holds the only ext2/3/4 filesystem") && info.contains("Label:            root"),
        "{info}"
    );
    // A partition without ext: a clear message, not "bad magic".
    fails(
        &["ls", &disk.at(4), "/"],
        &["partition 4 (type Linux swap) holds no ext2/3/4 filesystem"],
    );
    fails(
        &["ls", &disk.at(7), "/"],
        &["partition 7 does not exist", "partitions 1, 2, 3 and 4"],
    );
    // mkfs over the whole disk would destroy the table: refused.
    fails(
        &["mkfs", disk.p(), "10M"],
        &["GPT partition table", "--partition N", "-F"],
    );
    disk.fsck(2, &work);
}

#[test]
fn mbr_primary_and_logical_partitions() {
    let work = Scratch::dir("ext4kit-part-mbr");
    let src = work.join("small");
    small_tree(&src);
    let path = work.join("mbr.img");
    std::fs::File::create(&path).unwrap().set_len(64 << 20).unwrap();
    let script = "label: dos\n2048,16M,83\n,8M,07\n,,5\n,16M,83\n,,82\n";
    let mut c = Command::new("sfdisk");
    c.arg("-q").arg(&path).stdin(Stdio::piped()).stdout(Stdio::null());
    let mut child = c.spawn().expect("sfdisk (apt-get install fdisk)");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let disk = Disk::read(&path);
    let nums: Vec<u32> = disk.parts.iter().map(|p| p.number).collect();
    assert_eq!(nums, vec![1, 2, 3, 5, 6], "{disk:?}");
    junk(&disk, 2);
    mke2fs_in(&disk, 1, &["-t", "ext2", "-b", "1024", "-L", "prim"], Some(&src));
    mke2fs_in(&disk, 5, &["-t", "ext3", "-L", "logical"], Some(&src));
    let info = ok(&["info", disk.p()]);
    for want in [
        "MBR",
        "Linux (0x83)",
        "Extended (0x05)",
        "ext2 \"prim\"",
        "ext3 \"logical\"",
        "Linux swap (0x82)",
    ] {
        assert!(info.contains(want), "{want:?} missing from:\n{info}");
    }
    for n in [1, 5] {
        assert_eq!(ok(&["cat", &disk.at(n), "/etc/hostname"]), "data-partition\n");
    }
    let outside = disk.outside(5);
    let host = work.join("f");
    std::fs::write(&host, vec![7u8; 300_000]).unwrap();
    ok(&["put", host.to_str().unwrap(), &format!("{}:/f", disk.at(5))]);
    ok(&["mkdir", "--partition", "5", disk.p(), "/d"]);
    assert_eq!(disk.outside(5), outside, "bytes outside partition 5 changed");
    disk.fsck(5, &work);
    disk.fsck(1, &work);
    fails(&["ls", &disk.at(3), "/"], &["extended partition"]);
}

#[test]
fn mkfs_into_a_partition_and_at_an_offset() {
    let work = Scratch::dir("ext4kit-part-mkfs");
    let (disk, _src) = gpt_fixture(&work, false);
    let tree = work.join("tree");
    small_tree(&tree);
    let outside = disk.outside(3);
    let out = ok(&[
        "mkfs",
        "-q",
        "-t",
        "ext4",
        "-L",
        "fresh",
        "-d",
        tree.to_str().unwrap(),
        &disk.at(3),
    ]);
    assert!(out.is_empty(), "{out}");
    assert_eq!(disk.outside(3), outside, "mkfs wrote outside partition 3");
    disk.fsck(3, &work);
    let got = work.join("got");
    ok(&["get", &disk.at(3), "/", got.to_str().unwrap()]);
    let diffs = compare_trees(
        &tree,
        &got,
        &CompareOpts {
            ignore_root_attrs: true,
            ..tree_opts()
        },
    )
    .unwrap();
    assert!(diffs.is_empty(), "{diffs:#?}");
    assert!(ok(&["info", &disk.at(3)]).contains("Label:            fresh"));
    // Too big for the partition: refused before anything is written.
    fails(&["mkfs", &disk.at(3), "1G"], &["larger than the partition"]);

    // --offset into an existing file keeps what is before the offset, and
    // grows the file to hold the filesystem.
    let img = work.join("off.img");
    let head: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&img, &head).unwrap();
    ok(&["mkfs", "-q", "--offset", "1M", img.to_str().unwrap(), "8M"]);
    let bytes = std::fs::read(&img).unwrap();
    assert_eq!(bytes.len(), 9 << 20);
    assert!(
        bytes[..1 << 20] == head[..],
        "mkfs --offset changed bytes before the offset"
    );
    let part = work.join("off-part.img");
    std::fs::write(&part, &bytes[1 << 20..]).unwrap();
    e2fsck_clean(&part).unwrap();
    ok(&["mkdir", "--offset", "1M", img.to_str().unwrap(), "/x"]);
    // mke2fs's spelling, -E offset=, is the same.
    let img2 = work.join("off2.img");
    ok(&["mkfs", "-q", "-E", "offset=1048576", img2.to_str().unwrap(), "8M"]);
    assert!(ok(&["ls", "--offset", "1M", img2.to_str().unwrap(), "/"]).contains("lost+found"));
    assert!(ok(&["ls", "--offset", "1048576", img.to_str().unwrap(), "/"])
        .lines()
        .any(|l| l == "x"));
}

#[test]
fn no_replay_reads_and_refuses_writes() {
    let work = Scratch::dir("ext4kit-part-noreplay");
    let (disk, _src) = gpt_fixture(&work, false);
    assert_eq!(
        ok(&["cat", "--no-replay", &disk.at(3), "/readme"]),
        "second filesystem\n"
    );
    assert!(ok(&["--no-replay", "ls", &disk.at(2), "/"]).contains("etc"));
    let host = work.join("h");
    std::fs::write(&host, "x").unwrap();
    let before = std::fs::read(&disk.path).unwrap();
    for args in [
        vec!["mkdir", "--no-replay", &disk.at(2), "/x"],
        vec!["rm", "--no-replay", &disk.at(2), "/readme"],
        vec![
            "put",
            "--no-replay",
            host.to_str().unwrap(),
            &format!("{}:/h", disk.at(2)),
        ],
        vec!["mkfs", "--no-replay", &disk.at(3)],
    ] {
        fails(&args, &["--no-replay", "replay"]);
    }
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    fails(
        &["mount", "--no-replay", "-o", "rw", &disk.at(2), m],
        &["--no-replay", "rw"],
    );
    fails(&["mount", "-o", "noload,rw", &disk.at(2), m], &["noload", "rw"]);
    fails(&["demo", "--partition", "1"], &["this command takes none"]);
    assert!(std::fs::read(&disk.path).unwrap() == before, "a refused command wrote");
}

/// A raw MBR: entries (type, first sector, sectors).
fn raw_mbr(path: &Path, size: u64, entries: &[(u8, u32, u32)]) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut s = [0u8; 512];
    for (i, &(ty, first, n)) in entries.iter().enumerate() {
        let e = 446 + 16 * i;
        s[e + 4] = ty;
        s[e + 8..e + 12].copy_from_slice(&first.to_le_bytes());
        s[e + 12..e + 16].copy_from_slice(&n.to_le_bytes());
    }
    s[510] = 0x55;
    s[511] = 0xAA;
    f.write_all_at(&s, 0).unwrap();
}

#[test]
fn hostile_tables_give_clear_errors() {
    let work = Scratch::dir("ext4kit-part-hostile");
    let img = work.join("bad.img");
    // 1: past the end; 2: empty; 3: an ext2 filesystem; 4: overlaps 3.
    raw_mbr(
        &img,
        8 << 20,
        &[
            (0x83, 2048, 100_000),
            (0x83, 100, 0),
            (0x83, 4096, 8192),
            (0x83, 8192, 2048),
        ],
    );
    let disk = Disk {
        path: img.clone(),
        parts: vec![Part {
            number: 3,
            start: 4096 * 512,
            size: 8192 * 512,
        }],
    };
    let small = work.join("small");
    small_tree(&small);
    mke2fs_in(&disk, 3, &["-t", "ext2", "-b", "1024"], Some(&small));
    let i = img.to_str().unwrap();
    fails(
        &["ls", &format!("{i}@1"), "/"],
        &[
            "partition 1 cannot be opened",
            "past the end of the image",
            "8388608 bytes",
        ],
    );
    fails(
        &["ls", &format!("{i}@2"), "/"],
        &["partition 2 cannot be opened", "empty"],
    );
    assert_eq!(ok(&["cat", &format!("{i}@3"), "/readme"]), "second filesystem\n");
    fails(
        &["mkdir", &format!("{i}@3"), "/x"],
        &["cannot be opened for writing", "overlaps partition 4", "read-only"],
    );
    let info = ok(&["info", i]);
    for want in [
        "4 partitions",
        "Partition 1 cannot be opened",
        "Partition 2 cannot be opened",
        "Partition 3 opens read-only only",
    ] {
        assert!(info.contains(want), "{want:?} missing from:\n{info}");
    }
    // Auto-choice of the one ext partition works for reading.
    assert!(ok(&["ls", i, "/"]).contains("readme"));

    // A protective MBR with garbage where the GPT headers should be.
    let g = work.join("garbage-gpt.img");
    raw_mbr(&g, 4 << 20, &[(0xEE, 1, 8191)]);
    let f = std::fs::OpenOptions::new().write(true).open(&g).unwrap();
    f.write_all_at(&[0x5a; 4096], 512).unwrap();
    let gs = g.to_str().unwrap();
    fails(&["ls", gs, "/"], &["partition table cannot be read", "GPT"]);
    fails(&["info", gs], &["GPT"]);
    fails(&["ls", &format!("{gs}@1"), "/"], &["GPT"]);
    // A signature and a bad checksum, primary and backup: both named.
    f.write_all_at(b"EFI PART", 512).unwrap();
    f.write_all_at(b"EFI PART", (4 << 20) - 512).unwrap();
    fails(&["ls", &format!("{gs}@1"), "/"], &["GPT", "sector 1", "sector 8191"]);

    // A real GPT whose primary header is damaged: read from the backup.
    let (disk, _src) = gpt_fixture(&work, false);
    let f = std::fs::OpenOptions::new().write(true).open(&disk.path).unwrap();
    f.write_all_at(&[0xff; 8], 512 + 40).unwrap();
    let info = ok(&["info", disk.p()]);
    assert!(
        info.contains("primary GPT header is damaged") && info.contains("backup"),
        "{info}"
    );
    assert_eq!(ok(&["cat", &disk.at(3), "/readme"]), "second filesystem\n");

    // Conflicting choices.
    let o = ext4kit(&["ls", "--partition", "2", "--offset", "4096", disk.p(), "/"]);
    assert_eq!(o.status.code(), Some(2), "clap's usage error");
    fails(
        &["ls", "--partition", "3", &disk.at(2), "/"],
        &["partition 2", "--partition 3"],
    );
    fails(&["ls", "--offset", "200M", disk.p(), "/"], &["past the end"]);
}

/// `losetup -P` of a disk, its partitions mounted by the kernel; all
/// undone on drop.
struct KernelDisk {
    loopdev: String,
    mounts: Vec<PathBuf>,
}

impl KernelDisk {
    fn attach(disk: &Path, read_only: bool) -> KernelDisk {
        if let Err(e) = kernel_available() {
            let why = is_kernel_unavailable(&e).map_or_else(|| e.to_string(), |k| k.reason.clone());
            panic!("cannot compare with the kernel here: {why} (CI runs as root with loop devices)");
        }
        let mut args: Vec<&dyn AsRef<OsStr>> = vec![&"-P", &"-f", &"--show"];
        if read_only {
            args.push(&"-r");
        }
        args.push(&disk);
        let dev = tool_ok("losetup", &args).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        KernelDisk {
            loopdev: dev,
            mounts: Vec::new(),
        }
    }

    /// The kernel's device for partition `n`. A kernel built without
    /// partition parsers (this VM's has neither CONFIG_EFI_PARTITION nor
    /// CONFIG_MSDOS_PARTITION) scans nothing at `losetup -P`; then `partx
    /// -a` (util-linux, its own parser) adds the partitions through
    /// BLKPG, which is an independent reading of the table too.
    fn partition(&self, n: u32) -> String {
        let part = format!("{}p{n}", self.loopdev);
        let wait = |limit: Duration| {
            let t = Instant::now();
            while !Path::new(&part).exists() {
                if t.elapsed() > limit {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        };
        if !wait(Duration::from_millis(500)) {
            tool_ok("partx", &[&"-a", &self.loopdev]);
            assert!(
                wait(Duration::from_secs(10)),
                "{part} did not appear after losetup -P and partx -a"
            );
        }
        part
    }

    fn mount(&mut self, n: u32, dir: &Path, ro: bool) {
        let part = self.partition(n);
        std::fs::create_dir_all(dir).unwrap();
        tool_ok("mount", &[&"-o", &if ro { "ro" } else { "rw" }, &part, &dir]);
        self.mounts.push(dir.to_path_buf());
    }

    fn unmount_all(&mut self) {
        while let Some(m) = self.mounts.pop() {
            tool_ok("umount", &[&m]);
        }
    }
}

impl Drop for KernelDisk {
    fn drop(&mut self) {
        for m in self.mounts.drain(..).rev() {
            let _ = Command::new("umount").arg("-l").arg(&m).output();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.loopdev).output();
    }
}

#[test]
fn the_kernel_sees_the_same_partitions() {
    let work = Scratch::dir("ext4kit-part-kernel");
    let (disk, src) = gpt_fixture(&work, true);
    // ext4kit writes into partition 2 first.
    let host = work.join("h");
    std::fs::write(&host, "written by ext4kit\n").unwrap();
    ok(&["mkdir", "-p", &disk.at(2), "/ek/a/b"]);
    ok(&["put", host.to_str().unwrap(), &format!("{}:/ek/a/h", disk.at(2))]);
    ok(&["rm", "-r", &disk.at(2), "/ek/a/b"]);
    ok(&["mv", &disk.at(2), "/sizes", "/ek/sizes"]);
    {
        let mut k = KernelDisk::attach(&disk.path, true);
        for n in [2, 3] {
            let kdir = work.join(format!("kernel{n}"));
            k.mount(n, &kdir, true);
            let out = work.join(format!("ours{n}"));
            ok(&["get", &disk.at(n), "/", out.to_str().unwrap()]);
            let diffs = compare_trees(&kdir, &out, &CompareOpts::default()).unwrap();
            assert!(
                diffs.is_empty(),
                "partition {n}: the kernel and ext4kit differ:\n{diffs:#?}"
            );
        }
        // While the kernel has a partition mounted, mounting any part of
        // the disk is refused (the whole file is in use).
        let mnt = work.join("fuse");
        std::fs::create_dir_all(&mnt).unwrap();
        fails(&["mount", &disk.at(3), mnt.to_str().unwrap()], &["already mounted"]);
        k.unmount_all();
    }
    // The kernel writes into partition 3; ext4kit reads what it wrote. A
    // copy taken after an fsync and before the unmount holds the new file
    // in the journal only (needs_recovery): read with the journal replayed
    // it is there, with --no-replay it is not.
    let crash = Disk {
        path: work.join("crash.img"),
        parts: disk.parts.clone(),
    };
    {
        let mut k = KernelDisk::attach(&disk.path, false);
        let kdir = work.join("kernel-rw");
        k.mount(3, &kdir, false);
        tool_ok("cp", &[&"-a", &src.join("sizes"), &kdir.join("sizes")]);
        tool_ok("sync", &[&kdir]);
        // Partition 2 is the ext4 one (3 is ext2: no journal).
        let jdir = work.join("kernel-journal");
        k.mount(2, &jdir, false);
        std::fs::write(jdir.join("fresh"), "in the journal\n").unwrap();
        tool_ok("sync", &[&jdir.join("fresh"), &jdir]);
        tool_ok("cp", &[&"--sparse=always", &disk.path, &crash.path]);
        k.unmount_all();
    }
    let out = work.join("after-kernel");
    ok(&["get", &disk.at(3), "/sizes", out.to_str().unwrap()]);
    let diffs = compare_trees(&src.join("sizes"), &out, &CompareOpts::default()).unwrap();
    assert!(
        diffs.is_empty(),
        "what the kernel wrote reads back differently:\n{diffs:#?}"
    );
    disk.fsck(2, &work);
    disk.fsck(3, &work);

    let crash_bytes = std::fs::read(&crash.path).unwrap();
    assert_eq!(ok(&["cat", &crash.at(2), "/fresh"]), "in the journal\n");
    let log = ok(&["journal", &crash.at(2)]);
    assert!(
        log.contains("Needs recovery:   yes") && log.contains("Transaction"),
        "{log}"
    );
    let home = ok(&["ls", "--no-replay", &crash.at(2), "/"]);
    assert!(
        !home.lines().any(|l| l == "fresh"),
        "--no-replay showed a journalled file:\n{home}"
    );
    fails(&["mkdir", "--no-replay", &crash.at(2), "/x"], &["--no-replay"]);
    assert!(
        std::fs::read(&crash.path).unwrap() == crash_bytes,
        "reading a crashed disk wrote to it"
    );
    // A write replays the journal on disk first, inside the partition.
    let outside = crash.outside(2);
    ok(&["mkdir", &crash.at(2), "/after"]);
    assert_eq!(crash.outside(2), outside, "replay wrote outside partition 2");
    assert!(ok(&["ls", "--no-replay", &crash.at(2), "/"])
        .lines()
        .any(|l| l == "fresh"));
    crash.fsck(2, &work);
}

fn require_fuse() {
    ext4kit_testkit::require_root_and_fuse("this test mounts through FUSE");
}

#[test]
fn the_fuse_mount_serves_a_partition() {
    require_fuse();
    let work = Scratch::dir("ext4kit-part-fuse");
    let (disk, src) = gpt_fixture(&work, true);
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    let outside = disk.outside(2);
    // Two ext partitions: the mount needs a choice.
    fails(&["mount", disk.p(), m], &["partitioned disk", "--partition N"]);
    ok(&["mount", "--partition", "2", disk.p(), m]);
    let diffs = compare_trees(&src, &mnt, &tree_opts()).unwrap();
    std::fs::write(mnt.join("through-fuse"), "hello\n").unwrap();
    ok(&["umount", m]);
    assert!(
        diffs.is_empty(),
        "the mount of partition 2 differs from the source:\n{diffs:#?}"
    );
    assert_eq!(ok(&["cat", &disk.at(2), "/through-fuse"]), "hello\n");
    assert_eq!(disk.outside(2), outside, "the mount wrote outside partition 2");
    disk.fsck(2, &work);

    // -o offset= (read-only) and -o noload (read-only too).
    for opt in [
        format!("offset={},ro", disk.part(3).start),
        "partition=3,noload".to_string(),
    ] {
        ok(&["mount", "-o", &opt, disk.p(), m]);
        let txt = std::fs::read_to_string(mnt.join("readme"));
        let write = std::fs::write(mnt.join("nope"), "x");
        ok(&["umount", m]);
        assert_eq!(txt.unwrap(), "second filesystem\n", "-o {opt}");
        assert_eq!(write.unwrap_err().raw_os_error(), Some(30), "-o {opt}: EROFS expected");
    }
    // The short form, read-write.
    ok(&["mount", &disk.at(3), m]);
    std::fs::create_dir(mnt.join("made")).unwrap();
    ok(&["umount", m]);
    assert!(ok(&["ls", &disk.at(3), "/"]).lines().any(|l| l == "made"));
    disk.fsck(3, &work);
}
