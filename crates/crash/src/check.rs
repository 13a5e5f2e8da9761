//! The checks of one crash image.
//!
//! For a crash image (the raw bytes a power cut left):
//!
//! 1. ext4kit opens it read-only — replaying the journal in memory, as
//!    `ext4kit get` or a read-only mount would — and reads the whole tree
//!    (contents, links, xattrs): the *read-only view*;
//! 2. ext4kit opens a copy read-write (replaying on disk, cleaning up
//!    orphans), reads the tree again, syncs and closes it; the result must
//!    be `e2fsck -fn` clean and the tree the same as the read-only view;
//! 3. `e2fsck -fy` runs on another copy of the raw image (e2fsprogs' own
//!    replay and repair) and the tree ext4kit then reads from it must be
//!    the read-only view (a repair that changes the tree means the image
//!    was not consistent, whatever e2fsck -fn said after our replay);
//! 4. every durability promise of every workload thread
//!    ([`crate::model::check_promises`]) is checked in the read-only view.
//!
//! e2fsck always runs under `timeout`: some corrupt images make it loop.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::CrashPoint;

use crate::fsimage::scratch_root;
use crate::model::{check_promises, CutView, FailKind, Failure};
use crate::tree::{compare, summarize, walk, Data, Tree};
use crate::workload::Recorded;

/// Seconds e2fsck may run on one image.
pub const E2FSCK_TIMEOUT: u64 = 60;

/// Checks crash images, with a scratch directory of its own (one per
/// checking thread). The directory is removed when it is dropped.
#[derive(Debug)]
pub struct Checker {
    dir: PathBuf,
}

impl Checker {
    /// A checker whose scratch directory is named after `tag` (and made
    /// unique in the process).
    pub fn new(tag: &str) -> io::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = scratch_root().join(format!("ext4kit-crash-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Checker { dir })
    }

    /// Every failed check of `img`, the image of `cut` in `rec`.
    pub fn check(&self, rec: &Recorded, cut: &CrashPoint, img: &[u8]) -> Vec<Failure> {
        let mut out = Vec::new();
        let a = self.dir.join("crash.img");
        let b = self.dir.join("e2fsck.img");
        let runs = data_runs(img);
        if let Err(e) = write_runs(&a, img, &runs).and_then(|()| write_runs(&b, img, &runs)) {
            out.push(Failure::new(FailKind::RoOpen, format!("writing the crash image: {e}")));
            return out;
        }

        // 1. The read-only view.
        let ro = open_walk(&a, true);
        match &ro {
            Err(e) => out.push(Failure::new(FailKind::RoOpen, e.clone())),
            Ok(t) => {
                let bad: Vec<String> = t
                    .iter()
                    .filter_map(|(p, n)| match &n.data {
                        Data::Unreadable(e) => Some(format!("{p}: {e}")),
                        _ => None,
                    })
                    .collect();
                if !bad.is_empty() {
                    out.push(Failure::new(
                        FailKind::RoRead,
                        format!("{} unreadable: {}", bad.len(), bad.join("; ")),
                    ));
                }
            }
        }

        // 2. Read-write replay, then e2fsck -fn.
        let rw = open_walk(&a, false);
        match rw {
            Err(e) => out.push(Failure::new(FailKind::RwOpen, e)),
            Ok(rw) => {
                if let Ok(ro) = &ro {
                    let d = compare(ro, &rw, "the read-only view", "the read-write replay");
                    if !d.is_empty() {
                        out.push(Failure::new(FailKind::RwTree, summarize(&d, 8)));
                    }
                }
                match e2fsck(&a, "-fn") {
                    Ok((0, _)) => {}
                    Ok((code, text)) => out.push(Failure::new(
                        FailKind::Fsck,
                        format!("e2fsck -fn exit {code} after ext4kit's replay:\n{text}"),
                    )),
                    Err(e) => out.push(Failure::new(FailKind::Fsck, e)),
                }
            }
        }

        // 3. e2fsck's own replay and repair of the raw image.
        match e2fsck(&b, "-fy") {
            Ok((0..=3, _)) => match (open_walk(&b, true), &ro) {
                (Ok(fixed), Ok(ro)) => {
                    let d = compare(ro, &fixed, "ext4kit's view", "e2fsck -fy's result");
                    if !d.is_empty() {
                        out.push(Failure::new(FailKind::E2fsckTree, summarize(&d, 8)));
                    }
                }
                (Err(e), _) => out.push(Failure::new(
                    FailKind::E2fsckFailed,
                    format!("ext4kit cannot read e2fsck -fy's result: {e}"),
                )),
                (Ok(_), Err(_)) => {}
            },
            Ok((code, text)) => out.push(Failure::new(
                FailKind::E2fsckFailed,
                format!("e2fsck -fy exit {code}:\n{text}"),
            )),
            Err(e) => out.push(Failure::new(FailKind::E2fsckFailed, e)),
        }

        // 4. The promises.
        if let Ok(tree) = &ro {
            let view = CutView {
                end: cut.end as u64,
                flushes: cut.flushes,
            };
            for h in &rec.histories {
                check_promises(h, tree, view, &mut out);
            }
        }
        out
    }

    /// Where the checker writes the crash image (kept after a failure by
    /// [`save_image`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Open `path` with ext4kit (read-only or read-write) and read its tree;
/// a read-write open is synced and closed before returning.
pub fn open_walk(path: &Path, read_only: bool) -> Result<Tree, String> {
    let how = if read_only { "read-only" } else { "read-write" };
    let fs = Fs::open_image(
        path,
        &OpenOptions {
            read_only,
            ..Default::default()
        },
    )
    .map_err(|e| format!("ext4kit cannot open the image {how}: {e}"))?;
    let tree = walk(&fs).map_err(|e| format!("ext4kit ({how}) cannot list the tree: {e}"))?;
    if !read_only {
        fs.sync()
            .map_err(|e| format!("ext4kit cannot sync the replayed image: {e}"))?;
    }
    drop(fs);
    Ok(tree)
}

/// Run `e2fsck OPT IMG` under `timeout`: (exit code, the problem lines of
/// its output).
pub fn e2fsck(img: &Path, opt: &str) -> Result<(i32, String), String> {
    let out = Command::new("timeout")
        .arg(E2FSCK_TIMEOUT.to_string())
        .arg("e2fsck")
        .arg(opt)
        .arg(img)
        .output()
        .map_err(|e| format!("cannot run e2fsck: {e}"))?;
    let code = out.status.code().unwrap_or(-1);
    if code == 124 {
        return Err(format!("e2fsck {opt} timed out after {E2FSCK_TIMEOUT} s"));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("Pass ") && !l.trim().is_empty() && !l.starts_with("e2fsck 1."))
        .collect();
    let mut shown: Vec<String> = lines.iter().take(12).map(|l| format!("  {l}")).collect();
    if lines.len() > 12 {
        shown.push(format!("  ... {} more lines", lines.len() - 12));
    }
    Ok((code, shown.join("\n")))
}

/// The byte ranges of `bytes` holding something other than zeros, in
/// 4 KiB granules, adjacent granules merged.
pub fn data_runs(bytes: &[u8]) -> Vec<(usize, usize)> {
    const CHUNK: usize = 4096;
    static ZERO: [u8; CHUNK] = [0; CHUNK];
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (k, c) in bytes.chunks(CHUNK).enumerate() {
        if c == &ZERO[..c.len()] {
            continue;
        }
        let (a, b) = (k * CHUNK, k * CHUNK + c.len());
        match out.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => out.push((a, b)),
        }
    }
    out
}

/// Write `bytes` to `path` as a sparse file with data only in `runs`
/// ([`data_runs`]).
pub fn write_runs(path: &Path, bytes: &[u8], runs: &[(usize, usize)]) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let f = File::create(path)?;
    f.set_len(bytes.len() as u64)?;
    for &(a, b) in runs {
        f.write_all_at(&bytes[a..b], a as u64)?;
    }
    Ok(())
}

/// Write `bytes` to `path`, leaving all-zero 4 KiB blocks as holes.
pub fn write_sparse(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_runs(path, bytes, &data_runs(bytes))
}

/// Keep a failing crash image for inspection: `DIR/NAME.img` plus
/// `DIR/NAME.txt` holding `report`. Returns the image's path.
pub fn save_image(dir: &Path, name: &str, img: &[u8], report: &str) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let p = dir.join(format!("{name}.img"));
    write_sparse(&p, img)?;
    let mut t = File::create(dir.join(format!("{name}.txt")))?;
    t.write_all(report.as_bytes())?;
    Ok(p)
}

/// The log entries within `w` entries of `cut` (each with its fate: in
/// the image, lost, after the cut) and every thread's operations that
/// overlap them: what a failure report needs to say which writes an fsync
/// relied on.
pub fn explain(rec: &Recorded, cut: &CrashPoint, w: u64) -> String {
    use ext4kit_blockdev::record::EntryKind;
    use std::fmt::Write as _;
    let mut s = String::new();
    let (lo, hi) = ((cut.end as u64).saturating_sub(w), cut.end as u64 + w);
    let kept = cut.kept(&rec.log);
    let _ = writeln!(
        s,
        "log entries {lo}..{hi} (the cut is at {}; every write before {} is in the image):",
        cut.end, cut.durable
    );
    let mut flushes = 0;
    for (i, e) in rec.log.entries().iter().enumerate() {
        if e.is_flush() {
            flushes += 1;
        }
        if (i as u64) < lo || (i as u64) >= hi {
            continue;
        }
        let fate = if i >= cut.end {
            "after the cut"
        } else if i < cut.durable || kept[i - cut.durable] {
            "in the image"
        } else {
            "LOST"
        };
        let _ = match e.kind {
            EntryKind::Write => writeln!(s, "  {i:6} write {:>10}+{:<6} {fate}", e.offset, e.len),
            EntryKind::Flush { honoured } => writeln!(
                s,
                "  {i:6} flush #{flushes}{} {fate}",
                if honoured { "" } else { " (unhonoured)" }
            ),
            EntryKind::Mark => writeln!(
                s,
                "  {i:6} mark: {}",
                String::from_utf8_lossy(&rec.log.data(i).unwrap_or_default())
            ),
        };
    }
    for h in &rec.histories {
        let ops: Vec<String> = h
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.end + 1 >= lo && op.start <= hi)
            .map(|(k, op)| {
                format!(
                    "  #{k} entries {}..{}, {} flushes at return: {}{}",
                    op.start,
                    op.end,
                    op.flushes,
                    op.desc,
                    if op.marks.is_empty() { "" } else { " (a promise)" }
                )
            })
            .collect();
        if !ops.is_empty() {
            let _ = writeln!(s, "{}:\n{}", h.name, ops.join("\n"));
        }
    }
    s
}
