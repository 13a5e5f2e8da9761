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
//! A crash image that is a container file (qcow2, VHDX) is checked as
//! [`Checker::check_container`] says: `qemu-img check` first, then the
//! same steps through the container.
//!
//! e2fsck always runs under `timeout`: some corrupt images make it loop.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::CrashPoint;

use crate::container::{qemu_check, qemu_to_raw, Container, QemuCheck};
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
        self.check_full(rec, cut, img).failures
    }

    /// Every failed check of `img`, and what else was seen: the raw checks
    /// for a raw image, the container checks ([`Checker::check_container`])
    /// for a run inside a container format.
    pub fn check_full(&self, rec: &Recorded, cut: &CrashPoint, img: &[u8]) -> Checked {
        let mut res = Checked::default();
        match rec.spec.container {
            None => self.check_raw(rec, cut, img, &mut res.failures),
            Some(c) => self.check_container(c, rec, cut, img, &mut res),
        }
        res
    }

    /// The checks of a raw crash image (the module doc's 1–4).
    fn check_raw(&self, rec: &Recorded, cut: &CrashPoint, img: &[u8], out: &mut Vec<Failure>) {
        let a = self.dir.join("crash.img");
        let b = self.dir.join("e2fsck.img");
        let runs = data_runs(img);
        if let Err(e) = write_runs(&a, img, &runs).and_then(|()| write_runs(&b, img, &runs)) {
            out.push(Failure::new(FailKind::RoOpen, format!("writing the crash image: {e}")));
            return;
        }
        let ro = ro_view(&a, out);
        if rw_replay(&a, ro.as_ref().ok(), out) {
            e2fsck_after_replay(&a, out);
        }
        e2fsck_repair(&b, ro.as_ref().ok(), out);
        promises(rec, cut, ro.as_ref().ok(), out);
    }

    /// The checks of a crash image that is a container file:
    ///
    /// 1. `qemu-img check` on it: clean, or leaked clusters only;
    /// 2. the guest disk our format layer reads from it is the one
    ///    `qemu-img convert -O raw` reads;
    /// 3. ext4kit opens it through the container read-only (the
    ///    read-only view) and read-write (our format layer and our replay
    ///    writing into the container file); after that `qemu-img check`
    ///    again, and `e2fsck -fn` on the guest disk qemu-img reads out;
    /// 4. `e2fsck -fy` on qemu-img's reading of the crash image reaches
    ///    the read-only view's tree;
    /// 5. every promise, in the read-only view.
    pub fn check_container(&self, c: Container, rec: &Recorded, cut: &CrashPoint, img: &[u8], res: &mut Checked) {
        let out = &mut res.failures;
        let file = self.dir.join(format!("crash.{c}"));
        let qemu_raw = self.dir.join("e2fsck.img");
        let replayed_raw = self.dir.join("replayed.img");
        if let Err(e) = write_sparse(&file, img) {
            out.push(Failure::new(FailKind::RoOpen, format!("writing the crash image: {e}")));
            return;
        }

        // 1. The container as the power cut left it.
        match qemu_check(&file, c) {
            Ok(QemuCheck::Clean) => {}
            Ok(QemuCheck::Leaks(_)) => res.leaked = true,
            Ok(QemuCheck::Bad(code, text)) => out.push(Failure::new(
                FailKind::Container,
                format!("qemu-img check -f {c} exit {code} on the crash image:\n{text}"),
            )),
            Err(e) => out.push(Failure::new(FailKind::Container, e)),
        }

        // 2. qemu-img's guest disk and ours.
        let converted = qemu_to_raw(&file, c, &qemu_raw);
        if let Err(e) = &converted {
            out.push(Failure::new(FailKind::Container, format!("on the crash image: {e}")));
        }
        match c.read_disk(img) {
            Err(e) => out.push(Failure::new(
                FailKind::ContainerRead,
                format!("ext4kit's {c} layer cannot read the crash image: {e}"),
            )),
            Ok(ours) => {
                if converted.is_ok() {
                    match std::fs::read(&qemu_raw) {
                        Ok(theirs) => {
                            if let Some(d) = first_difference(&ours, &theirs) {
                                out.push(Failure::new(FailKind::ContainerRead, d));
                            }
                        }
                        Err(e) => out.push(Failure::new(
                            FailKind::ContainerRead,
                            format!("reading qemu's raw: {e}"),
                        )),
                    }
                }
            }
        }

        // 3. Through the container: the read-only view, then our replay
        // writing into the container file.
        let ro = ro_view(&file, out);
        if rw_replay(&file, ro.as_ref().ok(), out) {
            match qemu_check(&file, c) {
                Ok(QemuCheck::Clean | QemuCheck::Leaks(_)) => {}
                Ok(QemuCheck::Bad(code, text)) => out.push(Failure::new(
                    FailKind::Container,
                    format!("qemu-img check -f {c} exit {code} after ext4kit's replay into the container:\n{text}"),
                )),
                Err(e) => out.push(Failure::new(FailKind::Container, e)),
            }
            match qemu_to_raw(&file, c, &replayed_raw) {
                Ok(()) => e2fsck_after_replay(&replayed_raw, out),
                Err(e) => out.push(Failure::new(
                    FailKind::Container,
                    format!("after ext4kit's replay: {e}"),
                )),
            }
        }

        // 4. e2fsprogs' replay of the disk qemu reads from the crash image.
        if converted.is_ok() {
            e2fsck_repair(&qemu_raw, ro.as_ref().ok(), out);
        }

        // 5. The promises.
        promises(rec, cut, ro.as_ref().ok(), out);
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

/// What checking one crash image found.
#[derive(Debug, Default)]
pub struct Checked {
    /// The failed checks.
    pub failures: Vec<Failure>,
    /// The crash image's container had leaked clusters (`qemu-img check`
    /// exit 3): space no table points at, accepted after a power cut.
    pub leaked: bool,
}

/// Step 1: ext4kit's read-only view of `path` (the journal replayed in
/// memory); a file it cannot read is a failure, the view still returned.
fn ro_view(path: &Path, out: &mut Vec<Failure>) -> Result<Tree, String> {
    let ro = open_walk(path, true);
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
    ro
}

/// Step 2: ext4kit's read-write replay of `path`, in place, whose tree
/// must be the read-only view's. Whether it opened and closed.
fn rw_replay(path: &Path, ro: Option<&Tree>, out: &mut Vec<Failure>) -> bool {
    match open_walk(path, false) {
        Err(e) => {
            out.push(Failure::new(FailKind::RwOpen, e));
            false
        }
        Ok(rw) => {
            if let Some(ro) = ro {
                let d = compare(ro, &rw, "the read-only view", "the read-write replay");
                if !d.is_empty() {
                    out.push(Failure::new(FailKind::RwTree, summarize(&d, 8)));
                }
            }
            true
        }
    }
}

/// `e2fsck -fn` on the raw image ext4kit's replay left.
fn e2fsck_after_replay(raw: &Path, out: &mut Vec<Failure>) {
    match e2fsck(raw, "-fn") {
        Ok((0, _)) => {}
        Ok((code, text)) => out.push(Failure::new(
            FailKind::Fsck,
            format!("e2fsck -fn exit {code} after ext4kit's replay:\n{text}"),
        )),
        Err(e) => out.push(Failure::new(FailKind::Fsck, e)),
    }
}

/// Step 3: `e2fsck -fy`'s own replay and repair of the raw crash image
/// `raw` must reach the read-only view's tree.
fn e2fsck_repair(raw: &Path, ro: Option<&Tree>, out: &mut Vec<Failure>) {
    match e2fsck(raw, "-fy") {
        Ok((0..=3, _)) => match (open_walk(raw, true), ro) {
            (Ok(fixed), Some(ro)) => {
                let d = compare(ro, &fixed, "ext4kit's view", "e2fsck -fy's result");
                if !d.is_empty() {
                    out.push(Failure::new(FailKind::E2fsckTree, summarize(&d, 8)));
                }
            }
            (Err(e), _) => out.push(Failure::new(
                FailKind::E2fsckFailed,
                format!("ext4kit cannot read e2fsck -fy's result: {e}"),
            )),
            (Ok(_), None) => {}
        },
        Ok((code, text)) => out.push(Failure::new(
            FailKind::E2fsckFailed,
            format!("e2fsck -fy exit {code}:\n{text}"),
        )),
        Err(e) => out.push(Failure::new(FailKind::E2fsckFailed, e)),
    }
}

/// Step 4: every promise of every workload thread, in the read-only view.
fn promises(rec: &Recorded, cut: &CrashPoint, ro: Option<&Tree>, out: &mut Vec<Failure>) {
    if let Some(tree) = ro {
        let view = CutView {
            end: cut.end as u64,
            flushes: cut.flushes,
        };
        for h in &rec.histories {
            check_promises(h, tree, view, out);
        }
    }
}

/// Where two readings of one guest disk differ: the first byte, and how
/// many 4 KiB blocks differ; `None` when they are the same.
fn first_difference(ours: &[u8], theirs: &[u8]) -> Option<String> {
    if ours == theirs {
        return None;
    }
    if ours.len() != theirs.len() {
        return Some(format!(
            "ext4kit reads a {}-byte guest disk, qemu-img {} bytes",
            ours.len(),
            theirs.len()
        ));
    }
    let first = ours.iter().zip(theirs).position(|(a, b)| a != b).unwrap_or(0);
    let blocks = ours
        .chunks(4096)
        .zip(theirs.chunks(4096))
        .filter(|(a, b)| a != b)
        .count();
    Some(format!(
        "ext4kit and qemu-img read different guest disks: first at byte {first} (block {}), {blocks} 4 KiB blocks differ",
        first / 4096
    ))
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
