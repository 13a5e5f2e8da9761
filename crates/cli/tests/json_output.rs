//! `--json` of every read command (ls, ls -R, stat, df, getfattr, info)
//! parses and carries the same facts as the command's text output, and
//! the facts are the kernel's: each test makes its image with the kernel
//! (mke2fs, loop mount, files made through the mount: non-UTF-8 names,
//! hard links, a symlink, device nodes, a fifo, xattrs with binary and
//! non-UTF-8 values, nanosecond times), then compares our JSON field by
//! field with our text and with what the kernel reports through a
//! read-only loop mount of the same image (stat/statx, statvfs, getfattr).
//! Failures with `--json` print one JSON object on stderr.
//!
//! They need root (loop mounts), e2fsprogs, attr (getfattr) and GNU date;
//! without them they fail and say why. CI runs as root.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ext4kit_testkit::LoopMount;
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, XattrFlags, CWD};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-json-{tag}-{}", std::process::id()));
    let _ = Command::new("umount").arg(w.join("mnt")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn need_kernel() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("these tests compare with the kernel's view (loop mount): {e}; CI runs as root");
    }
}

fn run(c: &mut Command) -> Output {
    c.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {c:?}: {e}"))
}

fn ours(args: &[&OsStr]) -> Output {
    run(Command::new(BIN).args(args))
}

/// Our command's stdout; it must succeed with nothing on stderr.
fn ok(args: &[&OsStr]) -> String {
    let o = ours(args);
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "{args:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap_or_else(|e| panic!("{args:?}: output is not UTF-8: {e}"))
}

macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(OsStr::new($a)),*] };
}

/// A time as (seconds, nanoseconds).
type Time = (i64, u32);

fn jtime(v: &Value) -> Time {
    (
        v["sec"].as_i64().unwrap_or_else(|| panic!("no sec in {v}")),
        v["nsec"].as_u64().unwrap_or_else(|| panic!("no nsec in {v}")) as u32,
    )
}

/// GNU date's UTC rendering of each second count in `secs` (`date -u -f`).
fn utc(secs: &[i64], fmt: &str) -> Vec<String> {
    let mut c = Command::new("date");
    c.args(["-u", "-f", "-", &format!("+{fmt}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().expect("GNU date is needed to check the text output's dates");
    let input: String = secs.iter().map(|s| format!("@{s}\n")).collect();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// ls's mode string of a JSON entry (the test's own rendering of `mode`
/// and `type`).
fn mode_string(kind: &str, mode: u32) -> String {
    let t = match kind {
        "file" => '-',
        "dir" => 'd',
        "symlink" => 'l',
        "chardev" => 'c',
        "blockdev" => 'b',
        "fifo" => 'p',
        "socket" => 's',
        other => panic!("unknown type {other}"),
    };
    let mut s = String::from(t);
    for (i, who) in [(6, 0o4000), (3, 0o2000), (0, 0o1000)] {
        let bits = (mode >> i) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        let special = mode & who != 0;
        let on = if i == 0 { 't' } else { 's' };
        s.push(match (special, x) {
            (true, true) => on,
            (true, false) => on.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

fn set_times(p: &Path, atime: Time, mtime: Time) {
    let ts = |t: Time| Timespec {
        tv_sec: t.0,
        tv_nsec: t.1 as _,
    };
    rustix::fs::utimensat(
        CWD,
        p,
        &Timestamps {
            last_access: ts(atime),
            last_modification: ts(mtime),
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap_or_else(|e| panic!("utimensat {}: {e}", p.display()));
}

/// The name that is not UTF-8 (Latin-1 "café").
const LATIN1: &[u8] = b"caf\xe9";

/// Fill a kernel mount with every kind of file the listings must show.
fn populate(root: &Path) {
    let p = |s: &str| root.join(s);
    std::fs::write(p("a.txt"), "hello\n").unwrap();
    for (n, v) in [
        ("user.note", &b"hi there"[..]),
        ("user.bin", &[0u8, 1, 0xff][..]),
        ("user.latin", LATIN1),
    ] {
        rustix::fs::setxattr(p("a.txt"), n, v, XattrFlags::empty()).unwrap();
    }
    std::fs::create_dir_all(p("dir/sub")).unwrap();
    std::fs::write(p("dir/sub/deep.bin"), vec![7u8; 100_000]).unwrap();
    std::fs::hard_link(p("a.txt"), p("dir/hard")).unwrap();
    std::os::unix::fs::symlink("a.txt", p("link")).unwrap();
    rustix::fs::mknodat(CWD, p("dir/fifo"), rustix::fs::FileType::Fifo, Mode::from(0o644), 0).unwrap();
    rustix::fs::mknodat(
        CWD,
        p("dir/null"),
        rustix::fs::FileType::CharacterDevice,
        Mode::from(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    std::fs::write(root.join(OsStr::from_bytes(LATIN1)), "latin\n").unwrap();
    std::fs::write(p("weird|%41"), "").unwrap();
    std::fs::write(p(".hidden"), "").unwrap();
    std::fs::create_dir(p("many")).unwrap();
    for i in 0..150 {
        std::fs::write(p(&format!("many/f{i:03}")), "").unwrap();
    }
    std::fs::write(p("suid"), "#!/bin/sh\n").unwrap();
    rustix::fs::chmod(p("suid"), Mode::from(0o4755)).unwrap();
    rustix::fs::chown(
        p("suid"),
        Some(rustix::process::Uid::from_raw(1000)),
        Some(rustix::process::Gid::from_raw(100)),
    )
    .unwrap();
    // Times with nanoseconds, one before 1970.
    set_times(&p("a.txt"), (1_600_000_000, 123_456_789), (1_650_000_000, 987_654_321));
    set_times(&p("link"), (1_600_000_001, 1), (1_650_000_001, 2));
    set_times(&p("dir/sub"), (1_600_000_002, 3), (1_650_000_002, 999_999_999));
    set_times(&p("suid"), (-1_000_000, 5), (-2, 500_000_000));
}

/// An image the kernel wrote, `populate`d, with `isize`-byte inodes;
/// `mnt` is where the tests mount it read-only.
struct Fixture {
    img: PathBuf,
    mnt: PathBuf,
}

fn fixture(w: &Path, isize: u32) -> Fixture {
    need_kernel();
    let img = w.join("fs.img");
    let o = run(Command::new("mke2fs")
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-I",
            &isize.to_string(),
            "-L",
            "jsonfix",
        ])
        .arg(&img)
        .arg("32M"));
    assert!(o.status.success(), "mke2fs: {}", String::from_utf8_lossy(&o.stderr));
    let mnt = w.join("mnt");
    let m = LoopMount::mount(&img, &mnt, "ext4", false).unwrap();
    populate(m.path());
    m.unmount().unwrap();
    Fixture { img, mnt }
}

impl Fixture {
    fn mount(&self) -> LoopMount {
        LoopMount::mount(&self.img, &self.mnt, "ext4", true).unwrap()
    }

    fn img(&self) -> &OsStr {
        self.img.as_os_str()
    }
}

/// A JSON name: its exact bytes (from `KEY_bytes` when given) and the text.
fn jbytes(v: &Value, key: &str) -> Vec<u8> {
    match v.get(format!("{key}_bytes")) {
        Some(h) => {
            let h = h.as_str().unwrap();
            assert!(
                std::str::from_utf8(&hex_decode(h)).is_err(),
                "{key}_bytes given for a UTF-8 {key}: {v}"
            );
            hex_decode(h)
        }
        None => v[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in {v}"))
            .as_bytes()
            .to_vec(),
    }
}

fn hex_decode(h: &str) -> Vec<u8> {
    assert!(h.len().is_multiple_of(2), "{h}");
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// The kernel's stat of `path` (bytes, absolute in the image) under `mnt`.
fn kernel_meta(mnt: &Path, path: &[u8]) -> std::fs::Metadata {
    let p = mnt.join(OsStr::from_bytes(&path[1..]));
    std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("kernel stat {}: {e}", p.display()))
}

/// Every attribute of a JSON inode object against the kernel's stat.
fn same_as_kernel(what: &str, j: &Value, m: &std::fs::Metadata) {
    let u = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{what}: no {k} in {j}"));
    assert_eq!(u("ino"), m.ino(), "{what}: ino");
    assert_eq!(u("mode") as u32, m.mode(), "{what}: mode");
    assert_eq!(u("nlink"), m.nlink(), "{what}: nlink");
    assert_eq!(u("uid") as u32, m.uid(), "{what}: uid");
    assert_eq!(u("gid") as u32, m.gid(), "{what}: gid");
    assert_eq!(u("size"), m.size(), "{what}: size");
    assert_eq!(u("blocks"), m.blocks(), "{what}: blocks");
    assert_eq!(jtime(&j["atime"]), (m.atime(), m.atime_nsec() as u32), "{what}: atime");
    assert_eq!(jtime(&j["mtime"]), (m.mtime(), m.mtime_nsec() as u32), "{what}: mtime");
    assert_eq!(jtime(&j["ctime"]), (m.ctime(), m.ctime_nsec() as u32), "{what}: ctime");
    match m.created() {
        Ok(t) => {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
            assert_eq!(
                jtime(&j["crtime"]),
                (d.as_secs() as i64, d.subsec_nanos()),
                "{what}: crtime"
            );
        }
        Err(_) => assert!(j["crtime"].is_null(), "{what}: the kernel has no birth time: {j}"),
    }
    let kind = match m.file_type() {
        t if t.is_file() => "file",
        t if t.is_dir() => "dir",
        t if t.is_symlink() => "symlink",
        _ => match m.mode() & 0o170000 {
            0o020000 => "chardev",
            0o060000 => "blockdev",
            0o010000 => "fifo",
            0o140000 => "socket",
            other => panic!("{what}: kernel type {other:o}"),
        },
    };
    assert_eq!(j["type"], kind, "{what}: type");
    if matches!(kind, "chardev" | "blockdev") {
        let dev = m.rdev();
        assert_eq!(
            (j["rdev"]["major"].as_u64(), j["rdev"]["minor"].as_u64()),
            (Some(libc::major(dev) as u64), Some(libc::minor(dev) as u64)),
            "{what}: rdev"
        );
    } else {
        assert!(j["rdev"].is_null(), "{what}: rdev {j}");
    }
}

/// Parse JSON Lines: every line one object.
fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

#[test]
fn ls_json_matches_text_and_kernel() {
    let w = workdir("ls");
    let f = fixture(&w, 256);
    let img = f.img();
    let m = f.mount();
    for dir in ["/", "/dir", "/many"] {
        // Names and types (without -l: name, path, ino, type only).
        let j = lines(&ok(args![&"ls", &"-a", &"--json", img, &dir]));
        let text = ok(args![&"ls", &"-a", img, &dir]);
        let jnames: Vec<String> = j.iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(jnames, text.lines().collect::<Vec<_>>(), "{dir}: ls -a --json vs ls -a");
        let mut kernel: BTreeSet<Vec<u8>> = std::fs::read_dir(m.path().join(&dir[1..]))
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        kernel.insert(b".".to_vec());
        kernel.insert(b"..".to_vec());
        let ours: BTreeSet<Vec<u8>> = j.iter().map(|e| jbytes(e, "name")).collect();
        assert_eq!(ours, kernel, "{dir}: names vs the kernel's");
        for e in &j {
            let keys: BTreeSet<&str> = e.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            let mut want = BTreeSet::from(["name", "path", "ino", "type"]);
            if e.get("name_bytes").is_some() {
                want.extend(["name_bytes", "path_bytes"]);
            }
            assert_eq!(keys, want, "{e}");
            let path = jbytes(e, "path");
            let name = jbytes(e, "name");
            if name != b"." && name != b".." {
                let km = kernel_meta(m.path(), &path);
                assert_eq!(e["ino"].as_u64(), Some(km.ino()), "{e}");
            }
        }
        // -l: every attribute, against ls -l and the kernel.
        let jl = lines(&ok(args![&"ls", &"-la", &"--json", img, &dir]));
        let tl = ok(args![&"ls", &"-la", img, &dir]);
        assert_eq!(jl.len(), tl.lines().count(), "{dir}");
        let dates = utc(
            &jl.iter().map(|e| jtime(&e["mtime"]).0).collect::<Vec<_>>(),
            "%Y-%m-%d %H:%M",
        );
        for ((e, t), date) in jl.iter().zip(tl.lines()).zip(dates) {
            let kind = e["type"].as_str().unwrap();
            let mut want = format!(
                "{} {:>3} {:>5} {:>5} {:>10} {} {}",
                mode_string(kind, e["mode"].as_u64().unwrap() as u32),
                e["nlink"].to_string(),
                e["uid"].to_string(),
                e["gid"].to_string(),
                if e["rdev"].is_null() {
                    e["size"].to_string()
                } else {
                    format!("{}, {}", e["rdev"]["major"], e["rdev"]["minor"])
                },
                date,
                e["name"].as_str().unwrap()
            );
            if let Some(target) = e["target"].as_str() {
                want.push_str(&format!(" -> {target}"));
            }
            assert_eq!(t, want, "ls -l line vs its JSON {e}");
            let name = jbytes(e, "name");
            if name != b"." && name != b".." {
                let path = jbytes(e, "path");
                let km = kernel_meta(m.path(), &path);
                same_as_kernel(&String::from_utf8_lossy(&path), e, &km);
                if kind == "symlink" {
                    let kt = std::fs::read_link(m.path().join(OsStr::from_bytes(&path[1..]))).unwrap();
                    assert_eq!(jbytes(e, "target"), kt.as_os_str().as_bytes(), "{e}");
                } else {
                    assert!(e["target"].is_null(), "{e}");
                }
            }
        }
    }
    // The name that is not UTF-8: lossy in name, exact in name_bytes.
    let root = lines(&ok(args![&"ls", &"--json", img, &"/"]));
    let latin = root
        .iter()
        .find(|e| e.get("name_bytes").is_some())
        .expect("the Latin-1 name has name_bytes");
    assert_eq!(latin["name"], "caf\u{fffd}");
    assert_eq!(latin["name_bytes"], "636166e9");
    assert_eq!(latin["path_bytes"], "2f636166e9");
    // A file: one line, named as given.
    let one = lines(&ok(args![&"ls", &"-l", &"--json", img, &"/dir/hard"]));
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0]["name"].as_str(), one[0]["nlink"].as_u64()),
        (Some("/dir/hard"), Some(2))
    );
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn ls_recursive_json_matches_text_and_kernel() {
    let w = workdir("lsr");
    let f = fixture(&w, 256);
    let img = f.img();
    let m = f.mount();
    // The kernel's tree: every path under the mount.
    let mut kernel = BTreeSet::new();
    let mut todo = vec![m.path().to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(m.path()).unwrap();
            let mut b = b"/".to_vec();
            b.extend_from_slice(rel.as_os_str().as_bytes());
            kernel.insert(b);
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    let j = lines(&ok(args![&"ls", &"-aR", &"--json", img, &"/"]));
    let ours: BTreeSet<Vec<u8>> = j
        .iter()
        .filter(|e| e["name"] != "." && e["name"] != "..")
        .map(|e| jbytes(e, "path"))
        .collect();
    assert_eq!(ours, kernel, "ls -aR --json paths vs the kernel's tree");
    // Text: "DIR:" headers, the names, blank lines between directories.
    let text = ok(args![&"ls", &"-aR", img, &"/"]);
    let mut from_text = BTreeSet::new();
    let mut dir = String::new();
    for l in text.lines() {
        if let Some(d) = l.strip_suffix(':').filter(|d| d.starts_with('/')) {
            dir = d.to_string();
        } else if !l.is_empty() {
            from_text.insert((dir.clone(), l.to_string()));
        }
    }
    let from_json: BTreeSet<(String, String)> = j
        .iter()
        .map(|e| {
            let path = e["path"].as_str().unwrap();
            let name = e["name"].as_str().unwrap();
            let parent = &path[..path.len() - name.len()];
            let parent = if parent == "/" {
                "/"
            } else {
                parent.trim_end_matches('/')
            };
            (parent.to_string(), name.to_string())
        })
        .collect();
    assert_eq!(from_json, from_text, "ls -aR --json vs ls -aR");
    assert!(text.starts_with("/:\n"), "{text}");
    // Without -a: no hidden names, and only directories below PATH.
    let sub = lines(&ok(args![&"ls", &"-lR", &"--json", img, &"/dir"]));
    let paths: Vec<&str> = sub.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["/dir/fifo", "/dir/hard", "/dir/null", "/dir/sub", "/dir/sub/deep.bin"]
    );
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&w);
}

/// `stat`'s text, line by line, keyed by the label before ':'.
fn stat_text(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

#[test]
fn stat_json_matches_text_and_kernel() {
    for isize in [256, 128] {
        let w = workdir(&format!("stat{isize}"));
        let f = fixture(&w, isize);
        let img = f.img();
        let m = f.mount();
        for path in [
            "/a.txt",
            "/dir",
            "/link",
            "/dir/null",
            "/dir/fifo",
            "/suid",
            "/dir/sub/deep.bin",
        ] {
            let j: Value = serde_json::from_str(&ok(args![&"stat", &"--json", img, &path])).unwrap();
            let t = stat_text(&ok(args![&"stat", img, &path]));
            let what = format!("{isize}-byte inodes, {path}");
            same_as_kernel(&what, &j, &kernel_meta(m.path(), path.as_bytes()));
            assert_eq!(j["path"], path);
            // The text's facts, from the JSON.
            let inode_line = t["Inode"].split_whitespace().next().unwrap().to_string();
            assert_eq!(inode_line, j["ino"].to_string(), "{what}");
            let mode = j["mode"].as_u64().unwrap() as u32;
            let kind = j["type"].as_str().unwrap();
            assert!(
                t["Mode"].starts_with(&format!("{:04o} ({})", mode & 0o7777, mode_string(kind, mode))),
                "{what}: {:?}",
                t["Mode"]
            );
            let secs: Vec<i64> = ["atime", "mtime", "ctime", "crtime"]
                .iter()
                .map(|k| j[*k].get("sec").and_then(Value::as_i64).unwrap_or(0))
                .collect();
            let dates = utc(&secs, "%Y-%m-%d %H:%M:%S");
            for ((k, label), date) in [
                ("atime", "Access"),
                ("mtime", "Modify"),
                ("ctime", "Change"),
                ("crtime", "Birth"),
            ]
            .iter()
            .zip(&dates)
            {
                match j[*k].get("nsec") {
                    Some(ns) => assert_eq!(
                        t.get(*label).map(String::as_str),
                        Some(format!("{date}.{:09} +0000", ns.as_u64().unwrap()).as_str()),
                        "{what}: {label}"
                    ),
                    None => assert!(!t.contains_key(*label), "{what}: {label} without a crtime"),
                }
            }
            assert_eq!(j["crtime"].is_null(), isize == 128, "{what}: crtime {}", j["crtime"]);
            assert_eq!(
                t["Flags"].split_whitespace().next(),
                Some(format!("{:#010x}", j["flags"].as_u64().unwrap()).as_str())
            );
            match kind {
                "symlink" => assert_eq!(t["Target"], j["target"].as_str().unwrap()),
                "chardev" => assert_eq!(t["Device"], "1, 3"),
                _ => assert!(!t.contains_key("Target") && j["target"].is_null(), "{what}"),
            }
            // Xattrs: names and sizes, as text lists them and the kernel has them.
            let xattrs: BTreeMap<String, u64> = j["xattrs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| (x["name"].as_str().unwrap().to_string(), x["size"].as_u64().unwrap()))
                .collect();
            let text_x: BTreeMap<String, u64> = ok(args![&"stat", img, &path])
                .lines()
                .skip_while(|l| *l != "Xattrs:")
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .map(|l| {
                    let (n, rest) = l.trim().split_once(" (").unwrap();
                    (n.to_string(), rest.trim_end_matches(" bytes)").parse().unwrap())
                })
                .collect();
            assert_eq!(xattrs, text_x, "{what}: xattrs");
            if path == "/a.txt" {
                assert_eq!(xattrs.get("user.bin"), Some(&3));
                assert_eq!(xattrs.get("user.note"), Some(&8));
            }
            // The data map: the kind and the runs the text shows.
            assert_eq!(j["data"]["kind"], t["Data"], "{what}");
            let text_runs: Vec<(u64, u64)> = ok(args![&"stat", img, &path])
                .lines()
                .filter(|l| l.trim_start().starts_with("logical"))
                .map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    (w[1].parse().unwrap(), w[6].parse().unwrap())
                })
                .collect();
            let runs: Vec<(u64, u64)> = j["data"]["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["logical"].as_u64().unwrap(), r["physical"].as_u64().unwrap()))
                .collect();
            assert_eq!(runs, text_runs, "{what}: runs");
        }
        m.unmount().unwrap();
        let _ = std::fs::remove_dir_all(&w);
    }
}

#[test]
fn df_json_matches_text_and_kernel() {
    let w = workdir("df");
    let f = fixture(&w, 256);
    let img = f.img();
    let j: Value = serde_json::from_str(&ok(args![&"df", &"--json", img])).unwrap();
    let text = ok(args![&"df", img]);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    let u = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("no {k} in {j}"));
    let n = rows[1].len();
    assert_eq!(
        rows[1][n - 4..],
        [
            u("kib_total").to_string(),
            u("kib_used").to_string(),
            u("kib_available").to_string(),
            format!("{}%", u("use_percent"))
        ]
    );
    assert_eq!(
        rows[2][1..],
        [
            u("inodes").to_string(),
            u("inodes_used").to_string(),
            u("inodes_free").to_string()
        ]
    );
    assert_eq!(u("kib_total"), u("blocks") * u("block_size") / 1024);
    // statvfs through the kernel: f_bsize f_blocks f_bfree f_bavail f_files f_ffree.
    let m = f.mount();
    let o = run(Command::new("stat")
        .args(["-f", "-c", "%S %b %f %a %c %d %l"])
        .arg(m.path()));
    let k: Vec<u64> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    m.unmount().unwrap();
    assert_eq!(
        [
            u("block_size"),
            u("blocks"),
            u("blocks_free"),
            u("inodes"),
            u("inodes_free"),
            u("name_max")
        ],
        [k[0], k[1], k[2], k[4], k[5], k[6]],
        "df --json vs the kernel's statvfs"
    );
    // The kernel also holds back min(2 %, 4096) clusters from f_bavail.
    assert!(u("blocks_available") >= k[3], "{j} vs {k:?}");
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn getfattr_json_matches_text_and_kernel() {
    let w = workdir("getfattr");
    let f = fixture(&w, 256);
    let img = f.img();
    let j: Value = serde_json::from_str(&ok(args![&"getfattr", &"--json", img, &"/a.txt", &"dir/hard"])).unwrap();
    let files = j["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(
        (files[0]["path"].as_str(), files[1]["path"].as_str()),
        (Some("/a.txt"), Some("/dir/hard"))
    );
    let m = f.mount();
    for file in files {
        let path = file["path"].as_str().unwrap();
        let ours: BTreeMap<Vec<u8>, Vec<u8>> = file["xattrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (jbytes(x, "name"), jbytes(x, "value")))
            .collect();
        // The text's name=value lines (quoted text or 0x hex).
        let text = ok(args![&"getfattr", img, &path]);
        let from_text: BTreeMap<Vec<u8>, Vec<u8>> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(n, v)| {
                let v = match v.strip_prefix("0x") {
                    Some(h) => hex_decode(h),
                    None => v.trim_matches('"').as_bytes().to_vec(),
                };
                (n.as_bytes().to_vec(), v)
            })
            .collect();
        assert_eq!(ours, from_text, "{path}: --json vs text");
        // The kernel's, through getfattr(1) on the mount.
        let o = run(Command::new("getfattr")
            .args(["-d", "-m", "-", "-e", "hex", "--absolute-names"])
            .arg(m.path().join(&path[1..])));
        assert!(
            o.status.success(),
            "getfattr(1): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let kernel: BTreeMap<Vec<u8>, Vec<u8>> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(n, v)| (n.as_bytes().to_vec(), hex_decode(v.trim_start_matches("0x"))))
            .collect();
        assert_eq!(ours, kernel, "{path}: --json vs the kernel's xattrs");
        assert_eq!(ours.get(&b"user.latin"[..]).map(Vec::as_slice), Some(LATIN1));
    }
    let latin = files[0]["xattrs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "user.latin")
        .unwrap();
    assert_eq!(
        (latin["value"].as_str(), latin["value_bytes"].as_str()),
        (Some("caf\u{fffd}"), Some("636166e9"))
    );
    m.unmount().unwrap();
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn info_json_has_every_fact_of_the_summary() {
    let w = workdir("info");
    let f = fixture(&w, 256);
    let img = f.img();
    let doc: Value = serde_json::from_str(&ok(args![&"info", &"--json", img])).unwrap();
    let fs = doc["stack"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(fs["layer"], "filesystem");
    let text: BTreeMap<String, String> = ok(args![&"info", img])
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, v)| (k.to_string(), v.trim().to_string())))
        .collect();
    let u = |k: &str| fs[k].as_u64().unwrap_or_else(|| panic!("no {k} in {fs}"));
    let first = |k: &str| text[k].split_whitespace().next().unwrap().to_string();
    assert_eq!(text["Label"], fs["label"].as_str().unwrap());
    assert_eq!(text["UUID"], fs["uuid"].as_str().unwrap());
    assert_eq!(text["State"], fs["state"].as_str().unwrap());
    let feats: Vec<&str> = fs["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(text["Features"], feats.join(" "));
    assert_eq!(first("Block size"), u("block_size").to_string());
    assert_eq!(first("Inode size"), u("inode_size").to_string());
    assert_eq!(first("Blocks"), u("blocks").to_string());
    assert_eq!(first("Free blocks"), u("free_blocks").to_string());
    assert_eq!(first("Reserved blocks"), u("reserved_blocks").to_string());
    assert_eq!(first("Inodes"), u("inodes").to_string());
    assert_eq!(first("Free inodes"), u("free_inodes").to_string());
    assert_eq!(
        text["Groups"],
        format!(
            "{} ({} blocks, {} inodes each)",
            u("groups"),
            u("blocks_per_group"),
            u("inodes_per_group")
        )
    );
    assert_eq!(text["Directory hash"], fs["directory_hash"].as_str().unwrap());
    let times = [jtime(&fs["created"]), jtime(&fs["last_written"])];
    let dates = utc(&[times[0].0, times[1].0], "%Y-%m-%d %H:%M:%S");
    // "Created:          2024-05-01 12:00:00.000000000 +0000" (split at the first ':').
    let whole = |k: &str| {
        ok(args![&"info", img])
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")).map(|v| v.trim().to_string()))
            .unwrap()
    };
    assert_eq!(whole("Created"), format!("{}.{:09} +0000", dates[0], times[0].1));
    assert_eq!(whole("Last written"), format!("{}.{:09} +0000", dates[1], times[1].1));
    // e2fsprogs' view of the same superblock.
    let o = run(Command::new("dumpe2fs").arg("-h").arg(img));
    let dump: BTreeMap<String, String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, v)| (k.to_string(), v.trim().to_string())))
        .collect();
    assert_eq!(dump["Filesystem UUID"], fs["uuid"].as_str().unwrap());
    assert_eq!(dump["Filesystem volume name"], fs["label"].as_str().unwrap());
    for (k, j) in [
        ("Block count", "blocks"),
        ("Free blocks", "free_blocks"),
        ("Reserved block count", "reserved_blocks"),
        ("Inode count", "inodes"),
        ("Free inodes", "free_inodes"),
        ("Block size", "block_size"),
        ("Inode size", "inode_size"),
        ("Blocks per group", "blocks_per_group"),
        ("Inodes per group", "inodes_per_group"),
    ] {
        assert_eq!(dump[k], u(j).to_string(), "dumpe2fs {k} vs info --json {j}");
    }
    let _ = std::fs::remove_dir_all(&w);
}

/// The one JSON object a failing `--json` command prints on stderr.
fn json_failure(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let ls = lines(&err);
    assert_eq!(ls.len(), 1, "one JSON line on stderr: {err}");
    ls[0]["error"].clone()
}

#[test]
fn failures_with_json_are_json_objects() {
    let w = workdir("fail");
    let f = fixture(&w, 256);
    let img = f.img();
    let i = img.to_str().unwrap();
    for (args, path, errno) in [
        (vec!["stat", "--json", i, "/missing"], "/missing", "ENOENT"),
        (vec!["ls", "--json", i, "/a.txt/x"], "/a.txt/x", "ENOTDIR"),
        (vec!["ls", "-R", "--json", i, "/nothing"], "/nothing", "ENOENT"),
        (
            vec!["getfattr", "--json", "-n", "user.none", i, "/a.txt"],
            "/a.txt",
            "ENODATA",
        ),
    ] {
        let o = ours(&args.iter().map(OsStr::new).collect::<Vec<_>>());
        let e = json_failure(&o);
        assert_eq!(
            (e["path"].as_str(), e["errno"].as_str()),
            (Some(path), Some(errno)),
            "{args:?}: {e}"
        );
        assert!(e["message"].as_str().unwrap().contains(i), "{e}");
    }
    // getfattr goes on past a missing file: the document has the others.
    let o = ours(args![&"getfattr", &"--json", img, &"/missing", &"/a.txt"]);
    let e = json_failure(&o);
    assert_eq!(e["errno"], "ENOENT");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["files"][0]["path"], "/a.txt");
    // No image at all: a JSON error too, nothing on stdout.
    let o = ours(args![&"df", &"--json", &w.join("none.img")]);
    let e = json_failure(&o);
    assert!(e["message"].as_str().unwrap().contains("none.img"), "{e}");
    assert!(o.stdout.is_empty());
    // Without --json the same failure is one text line.
    let o = ours(args![&"stat", img, &"/missing"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("ext4kit: ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&w);
}
