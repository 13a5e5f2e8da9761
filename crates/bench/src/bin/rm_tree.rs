//! What freeing costs through the library: `rm -rf` of a tree in-process,
//! and the one-time claim scan (`ext4kit_ext4::claims`) that the first free
//! of a session runs over every live inode.
//!
//! ```text
//! target/ci/rm-tree                                  # 20,000 files to remove, nothing else
//! target/ci/rm-tree --others 200000 --size 2G        # the same beside 200,000 other files
//! ```
//!
//! The image (ext4 from `mke2fs`, 4 KiB blocks) is populated through the
//! library — `--others` files of `--bytes` bytes under /pop, then the
//! tree of `--files` files under /tree in `--dirs` directories — synced and
//! closed. It is then opened again (page cache warm: nothing drops the
//! host's caches) and timed: the first unlink of the session (a file
//! under /pop: it runs the scan), a second one, then the removal of /tree
//! (read_dir, unlink every file, rmdir every directory) and a sync.
//! `--runs` repeats the timed part on fresh copies of the populated image.

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use ext4kit::NewInode;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ext4kit::{Cred, Fs, OpenOptions};

#[derive(Parser)]
#[command(about = "rm -rf of a tree through the library, and the first free's claim scan")]
struct Args {
    /// Files in the tree that is removed.
    #[arg(long, default_value_t = 20_000)]
    files: usize,
    /// Directories the tree's files are spread over.
    #[arg(long, default_value_t = 100)]
    dirs: usize,
    /// Other files on the image (the scan reads them all; they stay).
    #[arg(long, default_value_t = 0)]
    others: usize,
    /// Bytes in each file.
    #[arg(long, default_value_t = 100)]
    bytes: usize,
    /// Image size (mke2fs syntax).
    #[arg(long, default_value = "512M")]
    size: String,
    /// Timed runs, each on a fresh copy of the populated image.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Work directory.
    #[arg(long, default_value = "target/bench-rm-tree")]
    work: PathBuf,
}

fn open_rw(img: &Path) -> Result<Arc<Fs>, String> {
    Fs::open_image(
        img,
        &OpenOptions {
            read_only: false,
            ..Default::default()
        },
    )
    .map_err(|e| format!("opening {}: {e}", img.display()))
}

fn populate(img: &Path, a: &Args) -> Result<(), String> {
    let fs = open_rw(img)?;
    let root = Cred::root();
    let data = vec![b'x'; a.bytes];
    let e = |what: String, x: ext4kit::Error| format!("{what}: {x}");
    let spread = |top: &str, n: usize, dirs: usize| -> Result<(), String> {
        fs.create(&NewInode::dir(top.as_bytes()).mode(0o755).cred(&root))
            .map_err(|x| e(top.into(), x))?;
        let dirs = dirs.max(1);
        for d in 0..dirs {
            let p = format!("{top}/d{d:04}");
            fs.create(&NewInode::dir(p.as_bytes()).mode(0o755).cred(&root))
                .map_err(|x| e(p.clone(), x))?;
        }
        for i in 0..n {
            let p = format!("{top}/d{:04}/f{i:07}", i % dirs);
            fs.write_file(&NewInode::file(p.as_bytes()).mode(0o644).owner(0, 0), &data)
                .map_err(|x| e(p.clone(), x))?;
        }
        Ok(())
    };
    spread("/pop", a.others.max(2), pop_dirs(a))?;
    spread("/tree", a.files, a.dirs)?;
    fs.sync().map_err(|x| e("sync".into(), x))
}

/// Directories under /pop: one per thousand files.
fn pop_dirs(a: &Args) -> usize {
    a.others.div_ceil(1000).max(1)
}

/// What the owner scan found (where it exists).
fn scan_stats(fs: &Fs) -> String {
    match fs.volume().owner_map().get() {
        Some(c) => {
            let s = c.stats();
            format!(
                "scan: {} records read, {} live inodes, {} blocks owned, {} named twice, {} marked free; \
                 {:.3} s, {} KiB of found-block bits",
                s.records,
                s.inodes,
                s.owned,
                s.multi,
                s.unmarked,
                s.elapsed.as_secs_f64(),
                s.peak_bytes / 1024
            )
        }
        None => "scan: none".into(),
    }
}

fn timed_run(img: &Path, a: &Args) -> Result<(f64, f64, f64, f64), String> {
    let root = Cred::root();
    let t = Instant::now();
    let fs = open_rw(img)?;
    let open = t.elapsed().as_secs_f64();
    let t = Instant::now();
    fs.unlink(b"/pop/d0000/f0000000", &root).map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    // The next file of /pop/d0000 (`populate` deals files round the
    // directories).
    let second_file = format!("/pop/d0000/f{:07}", pop_dirs(a));
    let t = Instant::now();
    fs.unlink(second_file.as_bytes(), &root)
        .map_err(|e| format!("{second_file}: {e}"))?;
    let second = t.elapsed().as_secs_f64();
    eprintln!("  {}", scan_stats(&fs));
    let t = Instant::now();
    for d in fs.read_dir(b"/tree").map_err(|e| e.to_string())? {
        if d.name == b"." || d.name == b".." {
            continue;
        }
        let dir = format!("/tree/{}", String::from_utf8_lossy(&d.name));
        for f in fs.read_dir(dir.as_bytes()).map_err(|e| e.to_string())? {
            if f.name == b"." || f.name == b".." {
                continue;
            }
            let p = format!("{dir}/{}", String::from_utf8_lossy(&f.name));
            fs.unlink(p.as_bytes(), &root).map_err(|e| format!("{p}: {e}"))?;
        }
        fs.rmdir(dir.as_bytes(), &root).map_err(|e| format!("{dir}: {e}"))?;
    }
    fs.rmdir(b"/tree", &root).map_err(|e| e.to_string())?;
    fs.sync().map_err(|e| e.to_string())?;
    let rm = t.elapsed().as_secs_f64();
    Ok((open, first, second, rm))
}

fn main() -> ExitCode {
    let a = Args::parse();
    if let Err(e) = std::fs::create_dir_all(&a.work) {
        eprintln!("rm-tree: {}: {e}", a.work.display());
        return ExitCode::FAILURE;
    }
    let base = a.work.join(format!("base-{}-{}-{}.img", a.files, a.others, a.bytes));
    let inodes = (a.files + a.others + a.dirs + a.others / 1000 + 4096).to_string();
    if !base.exists() {
        let tmp = a.work.join("making.img");
        let _ = std::fs::remove_file(&tmp);
        let st = Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-N", &inodes])
            .arg(&tmp)
            .arg(&a.size)
            .status();
        if !st.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("rm-tree: mke2fs failed ({st:?})");
            return ExitCode::FAILURE;
        }
        let t = Instant::now();
        if let Err(e) = populate(&tmp, &a) {
            eprintln!("rm-tree: populating: {e}");
            return ExitCode::FAILURE;
        }
        eprintln!("populated {} in {:.1} s", tmp.display(), t.elapsed().as_secs_f64());
        if let Err(e) = std::fs::rename(&tmp, &base) {
            eprintln!("rm-tree: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!(
        "{} files to remove in {} directories, {} other files, {} bytes each",
        a.files, a.dirs, a.others, a.bytes
    );
    println!(
        "{:>4} {:>9} {:>12} {:>12} {:>10}",
        "run", "open s", "1st rm s", "2nd rm s", "rm -rf s"
    );
    for r in 0..a.runs {
        let img = a.work.join("run.img");
        let st = Command::new("cp")
            .args(["--sparse=always"])
            .arg(&base)
            .arg(&img)
            .status();
        if !st.is_ok_and(|s| s.success()) {
            eprintln!("rm-tree: copying the image failed");
            return ExitCode::FAILURE;
        }
        match timed_run(&img, &a) {
            Ok((o, f, s, rm)) => println!("{r:>4} {o:>9.3} {f:>12.4} {s:>12.4} {rm:>10.3}"),
            Err(e) => {
                eprintln!("rm-tree: {e}");
                return ExitCode::FAILURE;
            }
        }
        let _ = std::fs::remove_file(&img);
    }
    ExitCode::SUCCESS
}
