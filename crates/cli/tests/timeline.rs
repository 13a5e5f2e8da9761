//! `ext4kit timeline`: the body file Sleuth Kit's `mactime` reads, and its
//! JSON Lines form, against the kernel and e2fsprogs.
//!
//! - An image the kernel wrote (loop mount: files with nanosecond times,
//!   hard links, a symlink, a fifo, names that need escaping or are not
//!   UTF-8) and in which the kernel then deleted files (rm, umount):
//!   `mactime -b FILE -d` reads the body file without a complaint and its
//!   timeline has every name's four times to the second, as the kernel's
//!   stat gives them; the body file itself has them to the nanosecond;
//!   the deleted files are there as unallocated inodes, with the mode,
//!   owner, atime and crtime they had (the deletion set mtime and ctime).
//! - The JSON lines parse and say the same as the body file.
//! - PATH limits the lines to its subtree.
//! - A name removed by e2fsprogs (`debugfs rm`, which leaves the record in
//!   the slack of the one before it) is found, marked deleted, with its
//!   inode's times; on 128-byte inodes crtime is 0 / null.
//!
//! They need root (loop mounts), e2fsprogs, sleuthkit (mactime) and GNU
//! date; without them they fail and say why. CI runs as root.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ext4kit_testkit::LoopMount;
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, CWD};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-timeline-{tag}-{}", std::process::id()));
    let _ = Command::new("umount").arg(w.join("mnt")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn need_tools() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("these tests make their images with the kernel (loop mount): {e}; CI runs as root");
    }
    let mactime = Command::new("mactime").arg("-V").output();
    assert!(
        mactime.is_ok(),
        "mactime is not installed: these tests read the body file with the Sleuth Kit's mactime \
         (apt-get install sleuthkit; .ci/run installs it)"
    );
}

fn run(c: &mut Command) -> Output {
    c.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {c:?}: {e}"))
}

/// `ext4kit ARGS`: must succeed with nothing on stderr (no terminal: no progress).
fn ours(args: &[&OsStr]) -> Vec<u8> {
    let o = run(Command::new(BIN).args(args));
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "{args:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(OsStr::new($a)),*] };
}

type Time = (i64, u32);

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
    .unwrap();
}

/// What the kernel says of a file: (ino, mode, uid, gid, size, [atime, mtime, ctime, crtime]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Facts {
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    times: [Option<Time>; 4],
}

fn facts(p: &Path) -> Facts {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let crtime = m.created().ok().map(|t| {
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
        (d.as_secs() as i64, d.subsec_nanos())
    });
    Facts {
        ino: m.ino(),
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        size: m.size(),
        times: [
            Some((m.atime(), m.atime_nsec() as u32)),
            Some((m.mtime(), m.mtime_nsec() as u32)),
            Some((m.ctime(), m.ctime_nsec() as u32)),
            crtime,
        ],
    }
}

/// Every path under `root` (absolute in the image, "/" first) with the kernel's facts.
fn kernel_tree(root: &Path) -> BTreeMap<Vec<u8>, Facts> {
    let mut out = BTreeMap::new();
    out.insert(b"/".to_vec(), facts(root));
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let mut key = b"/".to_vec();
            key.extend_from_slice(p.strip_prefix(root).unwrap().as_os_str().as_bytes());
            let f = facts(&p);
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                todo.push(p);
            }
            out.insert(key, f);
        }
    }
    out
}

/// One body-file line, its name's %XX decoded as mactime decodes them.
#[derive(Debug, Clone)]
struct BodyLine {
    name: Vec<u8>,
    ino: u64,
    mode: String,
    uid: u32,
    gid: u32,
    size: u64,
    /// atime, mtime, ctime, crtime; `None` for 0 (none).
    times: [Option<Time>; 4],
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// "1700000000" or "1700000000.000000005" (or "-1.5") as (sec, nsec).
fn body_time(s: &str) -> Option<Time> {
    if s == "0" {
        return None;
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut ns: u32 = if frac.is_empty() {
        0
    } else {
        assert_eq!(frac.len(), 9, "nine digits of fraction: {s}");
        frac.parse().unwrap()
    };
    let mut sec: i64 = int.parse().unwrap();
    if int.starts_with('-') && ns != 0 {
        sec -= 1;
        ns = 1_000_000_000 - ns;
    }
    Some((sec, ns))
}

fn parse_body(body: &[u8]) -> Vec<BodyLine> {
    std::str::from_utf8(body)
        .expect("the body file is ASCII-safe UTF-8 (bytes that are not UTF-8 are %XX)")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 11, "11 fields: {l}");
            assert_eq!(f[0], "0", "MD5 not computed: {l}");
            BodyLine {
                name: unescape(f[1]),
                ino: f[2].parse().unwrap(),
                mode: f[3].to_string(),
                uid: f[4].parse().unwrap(),
                gid: f[5].parse().unwrap(),
                size: f[6].parse().unwrap(),
                times: [body_time(f[7]), body_time(f[8]), body_time(f[9]), body_time(f[10])],
            }
        })
        .collect()
}

/// TSK's mode string of an st_mode (the test's own rendering).
fn tsk_mode(mode: u32) -> String {
    let t = match mode & 0o170000 {
        0o100000 => 'r',
        0o040000 => 'd',
        0o120000 => 'l',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        other => panic!("type {other:o}"),
    };
    let mut s = format!("{t}/{t}");
    for (i, who) in [(6, 0o4000), (3, 0o2000), (0, 0o1000)] {
        let bits = (mode >> i) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let on = if i == 0 { 't' } else { 's' };
        s.push(match (mode & who != 0, bits & 1 != 0) {
            (true, true) => on,
            (true, false) => on.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// GNU date's ISO rendering (UTC) of each second count, as `mactime -y` prints them.
fn iso(secs: &[i64]) -> Vec<String> {
    let mut child = Command::new("date")
        .args(["-u", "-f", "-", "+%Y-%m-%dT%H:%M:%SZ"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("GNU date");
    let input: String = secs.iter().map(|s| format!("@{s}\n")).collect();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `mactime -b BODY -d -y` in UTC: (inode, name) → the date of each of
/// m, a, c, b. It must exit 0 with nothing on stderr.
fn mactime(body: &Path) -> BTreeMap<(u64, Vec<u8>), BTreeMap<char, String>> {
    let o = run(Command::new("mactime")
        .arg("-b")
        .arg(body)
        .args(["-d", "-y"])
        .env("TZ", "UTC"));
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "mactime: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let mut out: BTreeMap<(u64, Vec<u8>), BTreeMap<char, String>> = BTreeMap::new();
    let mut lines = o.stdout.split(|&b| b == b'\n');
    assert_eq!(lines.next(), Some(&b"Date,Size,Type,Mode,UID,GID,Meta,File Name"[..]));
    for l in lines.filter(|l| !l.is_empty()) {
        // Date,Size,Type,Mode,UID,GID,Meta,"File Name" (the name may hold commas).
        let mut f = l.splitn(8, |&b| b == b',');
        let date = String::from_utf8(f.next().unwrap().to_vec()).unwrap();
        let _size = f.next();
        let kind = String::from_utf8(f.next().unwrap().to_vec()).unwrap();
        let (_mode, _uid, _gid) = (f.next(), f.next(), f.next());
        let ino: u64 = std::str::from_utf8(f.next().unwrap()).unwrap().parse().unwrap();
        let name = f.next().unwrap();
        let name = name[1..name.len() - 1].to_vec();
        let e = out.entry((ino, name)).or_default();
        for c in kind.chars().filter(|c| *c != '.') {
            e.insert(c, date.clone());
        }
    }
    out
}

fn json_lines(out: &[u8]) -> Vec<Value> {
    std::str::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

fn jtime(v: &Value) -> Option<Time> {
    if v.is_null() {
        return None;
    }
    Some((v["sec"].as_i64().unwrap(), v["nsec"].as_u64().unwrap() as u32))
}

fn jname(v: &Value) -> Option<Vec<u8>> {
    if let Some(h) = v.get("name_bytes") {
        let h = h.as_str().unwrap();
        return Some(
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect(),
        );
    }
    v["name"].as_str().map(|s| s.as_bytes().to_vec())
}

const LATIN1: &[u8] = b"caf\xe9";

#[test]
fn kernel_image_with_kernel_deletions() {
    need_tools();
    let w = workdir("kernel");
    let img = w.join("fs.img");
    let o = run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096"])
        .arg(&img)
        .arg("32M"));
    assert!(o.status.success(), "mke2fs: {}", String::from_utf8_lossy(&o.stderr));
    let mnt = w.join("mnt");
    let m = LoopMount::mount(&img, &mnt, "ext4", false).unwrap();
    let r = m.path();
    std::fs::write(r.join("a.txt"), "hello\n").unwrap();
    std::fs::create_dir_all(r.join("dir/sub")).unwrap();
    std::fs::write(r.join("dir/sub/deep"), vec![1u8; 50_000]).unwrap();
    std::fs::hard_link(r.join("a.txt"), r.join("dir/hard")).unwrap();
    std::os::unix::fs::symlink("../a.txt", r.join("dir/link")).unwrap();
    rustix::fs::mknodat(
        CWD,
        r.join("dir/fifo"),
        rustix::fs::FileType::Fifo,
        Mode::from(0o600),
        0,
    )
    .unwrap();
    std::fs::write(r.join(OsStr::from_bytes(LATIN1)), "x").unwrap();
    std::fs::write(r.join("weird|%41,name"), "y").unwrap();
    set_times(
        &r.join("a.txt"),
        (1_600_000_000, 123_456_789),
        (1_650_000_000, 987_654_321),
    );
    set_times(&r.join("dir/link"), (1_600_000_001, 1), (1_650_000_001, 999_999_999));
    // Files the kernel will delete: their facts before.
    std::fs::create_dir(r.join("doomed")).unwrap();
    let mut doomed = Vec::new();
    for (i, name) in ["one", "two"].iter().enumerate() {
        let p = r.join("doomed").join(name);
        std::fs::write(&p, vec![9u8; 10_000 * (i + 1)]).unwrap();
        rustix::fs::chown(&p, Some(rustix::process::Uid::from_raw(1234 + i as u32)), None).unwrap();
        rustix::fs::chmod(&p, Mode::from(0o640)).unwrap();
        set_times(&p, (1_500_000_000 + i as i64, 42), (1_550_000_000, 7));
        doomed.push(facts(&p));
    }
    let _ = Command::new("sync").status();
    for name in ["one", "two"] {
        std::fs::remove_file(r.join("doomed").join(name)).unwrap();
    }
    m.unmount().unwrap();
    // The kernel's view of what is left.
    let m = LoopMount::mount(&img, &mnt, "ext4", true).unwrap();
    let kernel = kernel_tree(m.path());
    m.unmount().unwrap();

    let body = ours(args![&"timeline", &img]);
    let body_path = w.join("body.txt");
    std::fs::write(&body_path, &body).unwrap();
    let lines = parse_body(&body);
    // Every name of the tree, once each, with the kernel's facts to the ns.
    let named: BTreeMap<Vec<u8>, &BodyLine> = lines
        .iter()
        .filter(|l| l.name.starts_with(b"/"))
        .map(|l| (l.name.clone(), l))
        .collect();
    assert_eq!(
        named.keys().collect::<BTreeSet<_>>(),
        kernel.keys().collect::<BTreeSet<_>>(),
        "the body file's names vs the kernel's tree"
    );
    for (name, k) in &kernel {
        let l = named[name];
        let what = String::from_utf8_lossy(name);
        assert_eq!(
            (l.ino, &l.mode, l.uid, l.gid, l.size),
            (k.ino, &tsk_mode(k.mode), k.uid, k.gid, k.size),
            "{what}"
        );
        assert_eq!(
            l.times, k.times,
            "{what}: atime, mtime, ctime, crtime to the nanosecond"
        );
    }
    assert_eq!(
        named[&b"/a.txt"[..]].ino,
        named[&b"/dir/hard"[..]].ino,
        "a line per hard link"
    );
    // The deleted files: unallocated inodes, as they were but for the deletion's stamps.
    for d in &doomed {
        let want = format!("<unallocated inode {}>", d.ino);
        let l = lines.iter().find(|l| l.ino == d.ino).unwrap_or_else(|| {
            panic!(
                "deleted inode {} missing from:\n{}",
                d.ino,
                String::from_utf8_lossy(&body)
            )
        });
        assert_eq!(String::from_utf8_lossy(&l.name), want);
        assert_eq!((&l.mode, l.uid, l.gid), (&tsk_mode(d.mode), d.uid, d.gid), "{want}");
        assert_eq!(l.times[0], d.times[0], "{want}: atime survives the deletion");
        assert_eq!(l.times[3], d.times[3], "{want}: crtime survives the deletion");
        for i in [1, 2] {
            assert!(l.times[i] >= d.times[i], "{want}: the deletion stamps mtime and ctime");
        }
    }
    // mactime reads it without complaint; its timeline has every name's
    // times to the second.
    let tl = mactime(&body_path);
    for (name, k) in &kernel {
        let got = tl
            .get(&(k.ino, name.clone()))
            .unwrap_or_else(|| panic!("{} missing from mactime's timeline", String::from_utf8_lossy(name)));
        let secs: Vec<i64> = k.times.iter().map(|t| t.unwrap().0).collect();
        let want = iso(&secs);
        for (c, d) in ['a', 'm', 'c', 'b'].iter().zip(&want) {
            assert_eq!(got.get(c), Some(d), "{}: {c}", String::from_utf8_lossy(name));
        }
    }
    for d in &doomed {
        let key = (d.ino, format!("<unallocated inode {}>", d.ino).into_bytes());
        assert_eq!(tl[&key].get(&'b'), Some(&iso(&[d.times[3].unwrap().0])[0]));
    }
    // JSON Lines: the same lines, the same facts.
    let json = json_lines(&ours(args![&"timeline", &"--json", &img]));
    assert_eq!(json.len(), lines.len(), "a JSON line per body-file line");
    for (j, l) in json.iter().zip(&lines) {
        assert_eq!(j["ino"].as_u64(), Some(l.ino), "{j}");
        let times = ["atime", "mtime", "ctime", "crtime"].map(|k| jtime(&j[k]));
        assert_eq!(times, l.times, "{j}");
        match jname(j) {
            Some(n) => {
                assert_eq!(n, l.name, "{j}");
                assert_eq!(j["allocated"], true, "{j}");
            }
            None => assert!(l.name.starts_with(b"<"), "{j}"),
        }
        assert_eq!(j["name_deleted"], false, "{j}");
        for k in [
            "type", "mode", "uid", "gid", "size", "nlink", "blocks", "dtime", "rdev", "target",
        ] {
            assert!(j.get(k).is_some(), "{k} missing: {j}");
        }
    }
    for d in &doomed {
        let j = json.iter().find(|j| j["ino"].as_u64() == Some(d.ino)).unwrap();
        assert_eq!(
            (j["allocated"].as_bool(), j["type"].as_str()),
            (Some(false), Some("file")),
            "{j}"
        );
        let dtime = jtime(&j["dtime"]).unwrap_or_else(|| panic!("a deleted inode's dtime: {j}"));
        assert!(dtime.0 >= d.times[2].unwrap().0, "{j}");
    }
    let latin = json
        .iter()
        .find(|j| j.get("name_bytes").is_some())
        .expect("the Latin-1 name");
    assert_eq!(latin["name_bytes"], "2f636166e9");
    // PATH: its subtree only, the same lines.
    let sub = parse_body(&ours(args![&"timeline", &img, &"/dir"]));
    let names: BTreeSet<Vec<u8>> = sub.iter().map(|l| l.name.clone()).collect();
    let want: BTreeSet<Vec<u8>> = kernel
        .keys()
        .filter(|k| k.starts_with(b"/dir/") || k.as_slice() == b"/dir")
        .cloned()
        .collect();
    assert_eq!(names, want, "timeline IMAGE /dir");
    for l in &sub {
        assert_eq!(l.times, named[&l.name].times);
    }
    let one = parse_body(&ours(args![&"timeline", &img, &"/dir/sub/deep"]));
    assert_eq!(one.len(), 1);
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn names_removed_by_e2fsprogs_are_found() {
    need_tools();
    for isize in [256, 128] {
        let w = workdir(&format!("debugfs{isize}"));
        let src = w.join("src");
        std::fs::create_dir_all(src.join("dir")).unwrap();
        for n in ["keep", "victim", "zlast"] {
            std::fs::write(src.join("dir").join(n), n).unwrap();
        }
        let img = w.join("fs.img");
        let o = run(Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-b", "1024", "-I", &isize.to_string(), "-d"])
            .arg(&src)
            .arg(&img)
            .arg("8M"));
        assert!(o.status.success(), "mke2fs: {}", String::from_utf8_lossy(&o.stderr));
        let before = json_lines(&ours(args![&"timeline", &"--json", &img, &"/dir/victim"]));
        assert_eq!(before.len(), 1);
        let victim = before[0]["ino"].as_u64().unwrap();
        let o = run(Command::new("debugfs").args(["-w", "-R", "rm /dir/victim"]).arg(&img));
        assert!(o.status.success(), "debugfs rm: {}", String::from_utf8_lossy(&o.stderr));
        let json = json_lines(&ours(args![&"timeline", &"--json", &img]));
        let hits: Vec<&Value> = json.iter().filter(|j| j["ino"].as_u64() == Some(victim)).collect();
        assert_eq!(hits.len(), 1, "{isize}: one line for the removed name: {hits:?}");
        let j = hits[0];
        assert_eq!(j["name"], "/dir/victim", "{j}");
        assert_eq!(
            (j["name_deleted"].as_bool(), j["allocated"].as_bool()),
            (Some(true), Some(false)),
            "{j}"
        );
        assert_eq!(jtime(&j["atime"]), jtime(&before[0]["atime"]), "{j}");
        assert_eq!(j["crtime"].is_null(), isize == 128, "{j}");
        // The body file names it as TSK does, and mactime reads it.
        let body = ours(args![&"timeline", &img]);
        let lines = parse_body(&body);
        let l = lines.iter().find(|l| l.ino == victim).unwrap();
        assert_eq!(l.name, b"/dir/victim (deleted)");
        assert_eq!(l.times[3].is_none(), isize == 128);
        let body_path = w.join("body.txt");
        std::fs::write(&body_path, &body).unwrap();
        let tl = mactime(&body_path);
        assert!(tl.contains_key(&(victim, b"/dir/victim (deleted)".to_vec())), "{tl:?}");
        // Under a PATH too (the removed names of its directories).
        let sub = json_lines(&ours(args![&"timeline", &"--json", &img, &"/dir"]));
        assert!(sub
            .iter()
            .any(|j| j["ino"].as_u64() == Some(victim) && j["name_deleted"] == true));
        assert!(sub
            .iter()
            .all(|j| j["name"].as_str().is_some_and(|n| n.starts_with("/dir"))));
        let _ = std::fs::remove_dir_all(&w);
    }
}
