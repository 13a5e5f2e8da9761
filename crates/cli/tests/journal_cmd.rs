//! `ext4kit journal` against `debugfs -R 'logdump -a'`, the listing it
//! stands in for: on journals written by debugfs' own journal writer
//! (descriptors, revokes, an uncommitted transaction, 32- and 64-bit tags,
//! checksum v2 and v3) and by the kernel (a loop mount copied while
//! mounted), every transaction's logged blocks (filesystem block → journal
//! block), its revoke records and where the log ends must be what
//! logdump prints. And `--json`'s replay verdict must match what e2fsck
//! replays: the blocks it names are exactly the blocks whose contents
//! differ between the image and e2fsck's replayed copy (up to blocks e2fsck
//! rewrites itself).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-journal-cmd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What logdump -a says: per transaction, its (fs block, journal block)
/// pairs and revoked blocks; and the block where the log ends.
#[derive(Debug, Default, PartialEq, Eq)]
struct Dump {
    logged: BTreeMap<u32, Vec<(u64, u32)>>,
    revoked: BTreeMap<u32, Vec<u64>>,
    end_block: Option<u32>,
}

fn logdump(img: &Path) -> Dump {
    let text = run(Command::new("debugfs").arg("-R").arg("logdump -a").arg(img));
    let mut d = Dump::default();
    let mut seq = 0u32;
    let num = |s: &str| s.trim_matches(|c: char| !c.is_ascii_digit()).parse::<u64>().unwrap();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with("Dumping descriptor block, sequence") || line.starts_with("Dumping revoke block, sequence")
        {
            seq = num(w[4]) as u32;
        } else if line.starts_with("  FS block") {
            // "  FS block N logged at journal block M (flags 0xF)"
            d.logged.entry(seq).or_default().push((num(w[2]), num(w[7]) as u32));
        } else if line.starts_with("  Revoke FS block") {
            d.revoked.entry(seq).or_default().push(num(w[3]));
        } else if line.starts_with("No magic number at block") || line.contains(": end of journal.") {
            let at = w.iter().position(|x| *x == "block").unwrap();
            d.end_block = Some(num(w[at + 1]) as u32);
        }
    }
    d
}

fn ours(img: &Path) -> (Dump, Value) {
    let text = run(Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(["journal", "--json"])
        .arg(img));
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut d = Dump::default();
    for t in v["transactions"].as_array().unwrap() {
        let seq = t["sequence"].as_u64().unwrap() as u32;
        for b in t["blocks"].as_array().unwrap() {
            // logdump prints the low 32 bits of the tag's block number.
            d.logged.entry(seq).or_default().push((
                b["fs_block"].as_u64().unwrap() & 0xffff_ffff,
                b["journal_block"].as_u64().unwrap() as u32,
            ));
        }
        for r in t["revokes"].as_array().unwrap() {
            for b in r["fs_blocks"].as_array().unwrap() {
                d.revoked.entry(seq).or_default().push(b.as_u64().unwrap());
            }
        }
    }
    d.end_block = v["end"]["block"].as_u64().map(|b| b as u32);
    (d, v)
}

/// Blocks whose bytes differ between two images of the same size.
fn changed_blocks(a: &Path, b: &Path, bs: usize) -> Vec<u64> {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    x.chunks(bs)
        .zip(y.chunks(bs))
        .enumerate()
        .filter(|(_, (p, q))| p != q)
        .map(|(i, _)| i as u64)
        .collect()
}

fn check(img: &Path, work: &Path, name: &str) {
    let want = logdump(img);
    let (got, v) = ours(img);
    assert!(!want.logged.is_empty(), "{name}: the fixture logged nothing: {want:?}");
    assert_eq!(got, want, "{name}: ext4kit journal disagrees with debugfs logdump -a");
    // The verdict: the blocks replay would write are the ones e2fsck's
    // replay changed, except those e2fsck writes for itself (superblock,
    // journal superblock) and replayed blocks whose copy equals the home.
    // Fast-commit replay changes blocks no log entry names (bitmaps, inode
    // tables, directories): those journals are checked by the replay tests.
    if v["replay"]["fast_commit_records"].as_u64() != Some(0) {
        return;
    }
    let replayed = work.join(format!("{name}-e2fsck.img"));
    std::fs::copy(img, &replayed).unwrap();
    let _ = Command::new("e2fsck")
        .args(["-E", "journal_only", "-y"])
        .arg(&replayed)
        .output()
        .unwrap();
    let bs = v["block_size"].as_u64().unwrap() as usize;
    let plan: Vec<u64> = v["replay"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["fs_block"].as_u64().unwrap())
        .collect();
    let sb_block = if bs == 1024 { 1 } else { 0 };
    let journal_sb = {
        let out = run(Command::new("debugfs").arg("-R").arg("bmap <8> 0").arg(img));
        out.trim().parse::<u64>().unwrap()
    };
    for b in changed_blocks(img, &replayed, bs) {
        if b == sb_block || b == journal_sb {
            continue;
        }
        assert!(
            plan.contains(&b),
            "{name}: e2fsck's replay changed block {b}, which ext4kit journal does not list as replayed"
        );
    }
}

fn mkfs(img: &Path, args: &[&str], size: &str) {
    let _ = std::fs::remove_file(img);
    run(Command::new("mke2fs").args(["-q", "-F"]).args(args).arg(img).arg(size));
}

fn bitmaps(img: &Path) -> String {
    let out = run(Command::new("dumpe2fs").arg(img));
    let mut v = Vec::new();
    for l in out.lines().filter(|l| l.contains("bitmap at")) {
        let at = l.find("bitmap at ").unwrap() + "bitmap at ".len();
        let n: String = l[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
        v.push(n);
    }
    v.join(",")
}

/// Journals written by debugfs, the way e2fsprogs' j_* tests write them.
#[test]
fn debugfs_written_journals_list_as_logdump_lists_them() {
    let work = workdir("debugfs");
    let cases: [(&str, &[&str]); 4] = [
        ("csum-v3-64bit", &["-t", "ext4", "-b", "4096"]),
        ("csum-v3-32bit", &["-t", "ext4", "-b", "4096", "-O", "^64bit"]),
        ("no-csum-ext3", &["-t", "ext3", "-b", "1024"]),
        ("csum-v3-1k", &["-t", "ext4", "-b", "1024"]),
    ];
    for (name, args) in cases {
        let img = work.join(format!("{name}.img"));
        mkfs(&img, args, "65536");
        let bm = bitmaps(&img);
        let cmds = work.join(format!("{name}.cmd"));
        std::fs::write(
            &cmds,
            format!(
                "jo\njw -b {bm} /dev/zero\njc\njo\njw -r {bm}\njc\njo\njw -b 333,334 /dev/zero\njc\njo\njw -b 400 /dev/zero\n"
            ),
        )
        .unwrap();
        run(Command::new("debugfs").arg("-w").arg("-f").arg(&cmds).arg(&img));
        check(&img, &work, name);
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// A journal the kernel wrote: a loop mount copied while still mounted,
/// after fsyncs.
#[test]
fn a_kernel_journal_lists_as_logdump_lists_it() {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test needs root and loop mounts to make a kernel journal: {e}");
    }
    let work = workdir("kernel");
    let img = work.join("k.img");
    mkfs(&img, &["-t", "ext4", "-O", "fast_commit"], "64M");
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = ext4kit_testkit::LoopMount::mount(&img, &mnt, "ext4", false).unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..40 {
        std::fs::write(mnt.join(format!("d/f{i}")), format!("file {i}\n")).unwrap();
    }
    run(Command::new("sync").arg("-f").arg(mnt.join("d")));
    std::fs::write(mnt.join("d/late"), vec![7u8; 10000]).unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("d/late"))
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    let copy = work.join("copy.img");
    run(Command::new("cp").arg("--sparse=always").arg(&img).arg(&copy));
    m.unmount().unwrap();
    check(&copy, &work, "kernel");
    let (_, v) = ours(&copy);
    assert!(
        !v["fast_commits"].as_array().unwrap().is_empty(),
        "the fsync should have left a fast commit: {v}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
