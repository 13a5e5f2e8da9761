//! Journal recovery at open: an image whose journal needs recovery reads
//! exactly as recovery leaves it, and `--no-replay` shows what the home
//! locations hold.
//!
//! For every fixture of `ext4kit_testkit::journal` (kernel-written images
//! over operation kinds, mount options, formats and fast commits, and
//! debugfs-written journals in e2fsprogs' j_* shapes; each made here, each
//! checked to be meaningful, each with e2fsck's and the kernel's recovery as
//! oracles):
//!
//! - `ext4kit get IMG / OUT` is the recovered tree, and the image's bytes
//!   are unchanged by the read;
//! - `ext4kit --no-replay get IMG / OUT` is the unreplayed tree (the
//!   kernel's `-o ro,noload`);
//! - `ext4kit mount -o ro IMG DIR` shows the recovered tree and leaves the
//!   image unchanged;
//! - a read-write open (`ext4kit mkdir IMG /after-replay`) succeeds and
//!   leaves an image `e2fsck -fn` finds clean whose tree (ours, and the
//!   kernel's loop mount) is the recovered tree plus the new directory.
//!
//! One run reports every fixture and every check that failed, with what
//! differed. `EXT4KIT_JOURNAL_ONLY=k-create,dbg-revoke` runs a subset;
//! `EXT4KIT_BIN` judges another build. `ext4kit-journal make DIR` builds the
//! same fixtures by hand. Needs root, loop devices and /dev/fuse (CI runs as
//! root); without them it fails and says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ext4kit_testkit::journal::{
    copy_sparse, diffs_beyond_new_dir, e2fsck_fn, first_difference, journal_specs, kernel_tree, make_journal_fixture,
    JournalFixture,
};
use ext4kit_testkit::{compare_trees, ext4kit_bin, is_kernel_unavailable, kernel_available, Difference, Scratch};

/// Differences listed per check before "... and N more".
const SHOWN: usize = 12;

fn bin() -> PathBuf {
    ext4kit_bin(env!("CARGO_BIN_EXE_ext4kit"))
}

fn ext4kit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(bin());
    for a in args {
        c.arg(a);
    }
    c.stdin(Stdio::null()).output().expect("run ext4kit")
}

/// Exit code and output of a command, on one line.
fn said(o: &Output) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    format!("exit {:?}: {}", o.status.code(), lines.join(" | "))
}

fn diff_lines(what: &str, d: &[Difference]) -> Vec<String> {
    let mut v: Vec<String> = d.iter().take(SHOWN).map(|x| format!("{what}: {x}")).collect();
    if d.len() > SHOWN {
        v.push(format!("{what}: ... and {} more differences", d.len() - SHOWN));
    }
    v
}

/// The outcome of one check: the problems found (empty = passed).
type Problems = Vec<String>;

struct Row {
    name: String,
    secs: f64,
    get: Problems,
    no_replay: Problems,
    mount: Problems,
    rw: Problems,
}

fn unchanged(pristine: &Path, image: &Path, after: &str) -> Problems {
    match first_difference(pristine, image) {
        Ok(None) => vec![],
        Ok(Some(off)) => vec![format!("{after} changed the image (first difference at byte {off})")],
        Err(e) => vec![format!("comparing the image with its pristine copy: {e}")],
    }
}

fn check_get(f: &JournalFixture, pristine: &Path, work: &Path) -> Problems {
    let out = work.join("get");
    let o = ext4kit(&[&"get", &f.image, &"/", &out]);
    let mut p = Vec::new();
    if !o.status.success() {
        p.push(format!("ext4kit get failed: {}", said(&o)));
    }
    if out.exists() {
        match compare_trees(&f.oracle, &out, &f.compare) {
            Ok(d) => p.extend(diff_lines("get vs recovered tree", &d)),
            Err(e) => p.push(format!("comparing: {e}")),
        }
    }
    p.extend(unchanged(pristine, &f.image, "ext4kit get"));
    p
}

fn check_no_replay(f: &JournalFixture, pristine: &Path, work: &Path) -> Problems {
    let out = work.join("get-no-replay");
    let o = ext4kit(&[&"--no-replay", &"get", &f.image, &"/", &out]);
    let mut p = Vec::new();
    // Where the kernel could not read all of the unreplayed view either, a
    // reader may report errors: the trees must still agree.
    if !o.status.success() && (f.unreplayed_errors.is_none() || !out.exists()) {
        p.push(format!("ext4kit --no-replay get failed: {}", said(&o)));
    }
    if out.exists() {
        match compare_trees(&f.unreplayed, &out, &f.compare) {
            Ok(d) => p.extend(diff_lines("--no-replay get vs unreplayed tree", &d)),
            Err(e) => p.push(format!("comparing: {e}")),
        }
    }
    p.extend(unchanged(pristine, &f.image, "ext4kit --no-replay get"));
    p
}

fn mounted(dir: &Path) -> bool {
    let Ok(t) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    t.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == dir))
}

fn check_mount(f: &JournalFixture, pristine: &Path, work: &Path) -> Problems {
    let mnt = work.join("mnt");
    if let Err(e) = std::fs::create_dir_all(&mnt) {
        return vec![format!("mkdir {}: {e}", mnt.display())];
    }
    let o = ext4kit(&[&"mount", &"-o", &"ro", &f.image, &mnt]);
    if !o.status.success() {
        return vec![format!("ext4kit mount -o ro failed: {}", said(&o))];
    }
    let mut p = match compare_trees(&f.oracle, &mnt, &f.compare) {
        Ok(d) => diff_lines("mount vs recovered tree", &d),
        Err(e) => vec![format!("comparing through the mount: {e}")],
    };
    // "busy" can be transient: a child the other worker forks holds our
    // descriptors until it execs.
    let t = Instant::now();
    let mut u = ext4kit(&[&"umount", &mnt]);
    while !u.status.success() && said(&u).contains("busy") && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        u = ext4kit(&[&"umount", &mnt]);
    }
    if !u.status.success() {
        p.push(format!("ext4kit umount failed: {}", said(&u)));
        let _ = Command::new("umount").arg("-l").arg(&mnt).output();
    }
    let t = Instant::now();
    while mounted(&mnt) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    p.extend(unchanged(pristine, &f.image, "ext4kit mount -o ro"));
    p
}

fn check_rw(f: &JournalFixture, work: &Path) -> Problems {
    let img = work.join("rw.img");
    if let Err(e) = copy_sparse(&f.image, &img) {
        return vec![format!("copying the image: {e}")];
    }
    let o = ext4kit(&[&"mkdir", &img, &"/after-replay"]);
    if !o.status.success() {
        return vec![format!("ext4kit mkdir (a read-write open) failed: {}", said(&o))];
    }
    let mut p = Vec::new();
    match e2fsck_fn(&img) {
        Ok(Ok(())) => {}
        Ok(Err(out)) => p.push(format!("e2fsck -fn after the read-write open: {out}")),
        Err(e) => p.push(format!("e2fsck: {e}")),
    }
    let out = work.join("get-rw");
    let g = ext4kit(&[&"get", &img, &"/", &out]);
    if !g.status.success() {
        p.push(format!("ext4kit get after the read-write open failed: {}", said(&g)));
    }
    if out.exists() {
        match diffs_beyond_new_dir(&f.oracle, &out, b"after-replay", &f.compare) {
            Ok(d) => p.extend(diff_lines("after rw, ours vs recovered tree + /after-replay", &d)),
            Err(e) => p.push(format!("comparing: {e}")),
        }
    }
    let kt = work.join("kernel-rw");
    match kernel_tree(&img, &kt, "ro") {
        Ok(errors) => {
            if let Some(e) = errors {
                p.push(format!("the kernel could not read everything after the rw open: {e}"));
            }
            match diffs_beyond_new_dir(&f.oracle, &kt, b"after-replay", &f.compare) {
                Ok(d) => p.extend(diff_lines("after rw, kernel vs recovered tree + /after-replay", &d)),
                Err(e) => p.push(format!("comparing: {e}")),
            }
        }
        Err(e) => p.push(format!("the kernel cannot mount the image after the rw open: {e}")),
    }
    p
}

fn check_fixture(f: &JournalFixture, work: &Path) -> Row {
    let t = Instant::now();
    let pristine = work.join("pristine.img");
    let setup = copy_sparse(&f.image, &pristine);
    let problems_if = |p: Problems| -> Problems {
        match &setup {
            Ok(()) => p,
            Err(e) => vec![format!("copying the image: {e}")],
        }
    };
    let get = problems_if(check_get(f, &pristine, work));
    let no_replay = problems_if(check_no_replay(f, &pristine, work));
    let mount = problems_if(check_mount(f, &pristine, work));
    let rw = check_rw(f, work);
    Row {
        name: f.name.clone(),
        secs: t.elapsed().as_secs_f64(),
        get,
        no_replay,
        mount,
        rw,
    }
}

#[test]
fn journal_fixtures_read_as_recovered() {
    if let Err(e) = kernel_available() {
        let why = is_kernel_unavailable(&e).map_or_else(|| e.to_string(), |k| k.reason.clone());
        panic!("the journal tests need the kernel's loop mounts for their oracles: {why} (CI runs as root)");
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse does not exist: the journal tests mount with FUSE (modprobe fuse)"
    );
    let only: Vec<String> = std::env::var("EXT4KIT_JOURNAL_ONLY")
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let specs: Vec<_> = journal_specs()
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    assert!(!specs.is_empty(), "EXT4KIT_JOURNAL_ONLY={only:?} matches no fixture");
    let work = Scratch::dir("ext4kit-journal-replay");
    let started = Instant::now();

    // Two at a time: the machines have two cores.
    let next = AtomicUsize::new(0);
    let rows = Mutex::new(Vec::new());
    let broken = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(spec) = specs.get(i) else { return };
                let fixtures = work.join("fixtures");
                let f = match make_journal_fixture(spec, &fixtures) {
                    Ok(f) => f,
                    Err(e) => {
                        eprintln!("{:<28} cannot make the fixture: {e}", spec.name);
                        broken
                            .lock()
                            .unwrap()
                            .push(format!("{}: cannot make the fixture: {e}", spec.name));
                        continue;
                    }
                };
                let w = work.join("checks").join(spec.name);
                std::fs::create_dir_all(&w).unwrap();
                let row = check_fixture(&f, &w);
                let cell = |p: &Problems| if p.is_empty() { "ok" } else { "FAIL" };
                eprintln!(
                    "{:<28} get {:<4} --no-replay {:<4} mount {:<4} rw {:<4} ({:.1}s)",
                    row.name,
                    cell(&row.get),
                    cell(&row.no_replay),
                    cell(&row.mount),
                    cell(&row.rw),
                    row.secs
                );
                if [&row.get, &row.no_replay, &row.mount, &row.rw]
                    .iter()
                    .all(|p| p.is_empty())
                {
                    let _ = std::fs::remove_dir_all(&w);
                }
                rows.lock().unwrap().push(row);
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let broken = broken.into_inner().unwrap();

    let mut report = String::new();
    let mut failed_checks = 0;
    for r in &rows {
        for (what, p) in [
            ("get", &r.get),
            ("--no-replay get", &r.no_replay),
            ("mount -o ro", &r.mount),
            ("read-write open", &r.rw),
        ] {
            if !p.is_empty() {
                failed_checks += 1;
                report.push_str(&format!("\n{} / {what}:\n", r.name));
                for l in p {
                    report.push_str(&format!("    {l}\n"));
                }
            }
        }
    }
    let passed = rows
        .iter()
        .filter(|r| [&r.get, &r.no_replay, &r.mount, &r.rw].iter().all(|p| p.is_empty()))
        .count();
    eprintln!(
        "{passed} of {} fixtures pass every check; {failed_checks} checks failed; {} fixtures could not be made; {:.0}s",
        specs.len(),
        broken.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        broken.is_empty() && failed_checks == 0,
        "{} of {} fixtures failed:\n{}{}",
        specs.len() - passed,
        specs.len(),
        broken.join("\n"),
        report
    );
}
