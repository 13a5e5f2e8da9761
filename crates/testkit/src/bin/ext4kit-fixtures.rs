//! `ext4kit-fixtures OUTDIR [--small] [--verify]`: build the fixture source
//! tree and every image of the matrix into OUTDIR, so scripts and humans
//! can test readers against them.
//!
//! Writes OUTDIR/src (the tree), OUTDIR/<spec>.img for each spec,
//! OUTDIR/kernel.img when running as root with loop devices, and
//! OUTDIR/fixtures.tsv: one line per image with
//! `name<TAB>image<TAB>kernel-mountable<TAB>treecmp flags<TAB>description`.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use clap::Parser;
use ext4kit_testkit::{
    build_source_tree, compare_rdump, compare_trees, debugfs_rdump, image_matrix, is_kernel_unavailable,
    kernel_available, make_image, make_kernel_image, CompareOpts, LoopMount, TimeFidelity, TreeOpts, FIXTURE_VERSION,
};

/// Build the ext4kit fixture tree and image matrix.
#[derive(Parser, Debug)]
#[command(name = "ext4kit-fixtures", version)]
struct Args {
    /// Output directory (created if missing). A previous fixture directory
    /// (one holding fixtures.tsv) is rebuilt in place.
    outdir: PathBuf,
    /// Quick variant: 2,000-entry big directory, no 5 GiB sparse file.
    #[arg(long)]
    small: bool,
    /// Afterwards, read every image back with an independent reader (the
    /// kernel, read-only loop mount; debugfs rdump where the kernel cannot
    /// mount) and compare it with the source tree.
    #[arg(long)]
    verify: bool,
    /// Build only the specs with these names (repeatable).
    #[arg(long = "only")]
    only: Vec<String>,
    /// Do not build kernel.img.
    #[arg(long)]
    no_kernel: bool,
    /// Images built in parallel (mke2fs -d is single-threaded and, for the
    /// 50,000-entry directory, slow: minutes per 1 KiB-block image).
    #[arg(long, short = 'j', default_value_t = 2)]
    jobs: usize,
    /// Reuse OUTDIR if it already holds a complete fixture set built by this
    /// version with the same options (the full matrix takes minutes).
    #[arg(long)]
    reuse: bool,
}

const MANIFEST: &str = "fixtures.tsv";
const STAMP: &str = "fixtures.stamp";
const KERNEL_ARGS: &[&str] = &["-t", "ext4", "-O", "metadata_csum_seed"];

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ext4kit-fixtures: {e}");
            ExitCode::from(2)
        }
    }
}

/// Identifies what a fixture directory was built from, for --reuse.
fn stamp(args: &Args, opts: &TreeOpts) -> String {
    format!(
        "ext4kit-testkit fixtures v{FIXTURE_VERSION} {:?} only={:?} kernel={}\n",
        opts, args.only, !args.no_kernel
    )
}

fn reusable(out: &Path, stamp: &str) -> bool {
    let Ok(old) = fs::read_to_string(out.join(STAMP)) else {
        return false;
    };
    let Ok(manifest) = fs::read_to_string(out.join(MANIFEST)) else {
        return false;
    };
    old == stamp
        && out.join("src").is_dir()
        && manifest
            .lines()
            .filter_map(|l| l.split('\t').nth(1))
            .all(|img| out.join(img).is_file())
}

fn run(args: &Args) -> io::Result<bool> {
    let out = &args.outdir;
    fs::create_dir_all(out)?;
    // Two builders in one directory would delete each other's tree.
    let lock = fs::File::create(out.join(".lock"))?;
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(io::Error::other(format!(
            "another ext4kit-fixtures is using {} (lock {}); wait for it to finish",
            out.display(),
            out.join(".lock").display()
        )));
    }
    let src = out.join("src");
    let opts = if args.small {
        TreeOpts::small()
    } else {
        TreeOpts::default()
    };
    let stamp = stamp(args, &opts);
    if args.reuse && reusable(out, &stamp) {
        println!(
            "reusing the fixtures in {} (built with the same options)",
            out.display()
        );
        let manifest = fs::read_to_string(out.join(MANIFEST))?;
        return if args.verify {
            verify(out, &src, &manifest)
        } else {
            Ok(true)
        };
    }
    let _ = fs::remove_file(out.join(STAMP));
    if src.exists() {
        if out.join(MANIFEST).exists() {
            make_removable(&src)?;
            fs::remove_dir_all(&src)?;
        } else {
            return Err(io::Error::other(format!(
                "{} exists and {} has no {MANIFEST}: refusing to delete it",
                src.display(),
                out.display()
            )));
        }
    }
    let _ = fs::remove_file(out.join(MANIFEST));
    let total = Instant::now();
    let t = Instant::now();
    let m = build_source_tree(&src, &opts)?;
    println!(
        "source tree: {} entries, {} inodes, {} data bytes ({} apparent){} in {:.1}s",
        m.entries,
        m.inodes,
        m.data_bytes,
        m.apparent_bytes,
        if m.privileged {
            ""
        } else {
            " [unprivileged: no owners/devices/trusted xattrs]"
        },
        t.elapsed().as_secs_f64()
    );

    let specs: Vec<_> = image_matrix()
        .into_iter()
        .filter(|s| args.only.is_empty() || args.only.iter().any(|o| o == s.name))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.jobs.max(1))
            .map(|_| {
                scope.spawn(|| -> io::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(spec) = specs.get(i) else {
                            return Ok(());
                        };
                        let img = out.join(format!("{}.img", spec.name));
                        let t = Instant::now();
                        let r = make_image(spec, &src, &img);
                        let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                        match &r {
                            Ok(()) => println!(
                                "[{n}/{}] {:<24} ok  {:6.1}s  {}",
                                specs.len(),
                                spec.name,
                                t.elapsed().as_secs_f64(),
                                spec.description
                            ),
                            Err(e) => {
                                println!("[{n}/{}] {:<24} FAILED: {e}", specs.len(), spec.name)
                            }
                        }
                        r?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(io::Error::other("worker panicked"))))
            .collect()
    });
    for r in results {
        r?;
    }
    let mut manifest = String::new();
    for spec in &specs {
        manifest.push_str(&format!(
            "{}\t{}.img\t{}\t{}\t{}\n",
            spec.name,
            spec.name,
            if spec.kernel_mountable { "yes" } else { "no" },
            spec.treecmp_args().join(" "),
            spec.description
        ));
    }
    let want_kernel = !args.no_kernel && args.only.iter().all(|o| o == "kernel");
    if want_kernel {
        print!("[kernel] {:<24} ", "kernel");
        io::stdout().flush()?;
        let t = Instant::now();
        match make_kernel_image(&src, &out.join("kernel.img"), KERNEL_ARGS) {
            Ok(()) => {
                println!(
                    "ok  {:6.1}s  written by the kernel: mke2fs {}, loop mount, cp -a",
                    t.elapsed().as_secs_f64(),
                    KERNEL_ARGS.join(" ")
                );
                manifest.push_str(
                    "kernel\tkernel.img\tyes\t--ignore-lost-found\tthe tree written by the kernel (loop mount, cp -a)\n",
                );
            }
            Err(e) => match is_kernel_unavailable(&e) {
                Some(why) => println!("SKIPPED: {why}"),
                None => return Err(e),
            },
        }
    }
    fs::write(out.join(MANIFEST), &manifest)?;
    fs::write(out.join(STAMP), &stamp)?;
    println!(
        "fixtures in {} built in {:.1}s",
        out.display(),
        total.elapsed().as_secs_f64()
    );
    if args.verify {
        verify(out, &src, &manifest)
    } else {
        Ok(true)
    }
}

/// Reads every image back with an independent reader and compares.
fn verify(out: &Path, src: &Path, manifest: &str) -> io::Result<bool> {
    let kernel = kernel_available();
    if let Err(e) = &kernel {
        println!("NOTE: {e}; verifying every image with debugfs rdump (weaker)");
    }
    let specs = image_matrix();
    let mut all_ok = true;
    println!("{:<24} {:<8} {:<14} result", "image", "verdict", "reader");
    for line in manifest.lines() {
        let mut f = line.split('\t');
        let (Some(name), Some(img)) = (f.next(), f.next()) else {
            continue;
        };
        let img = out.join(img);
        let spec = specs.iter().find(|s| s.name == name);
        let mountable = spec.is_none_or(|s| s.kernel_mountable);
        let (reader, result) = if mountable && kernel.is_ok() {
            let opts = spec.map_or_else(
                || CompareOpts {
                    ignore_lost_found: true,
                    ..CompareOpts::default()
                },
                |s| s.compare_opts(),
            );
            let mnt = out.join(format!("mnt-{name}"));
            let r = LoopMount::mount(&img, &mnt, "ext4", true).and_then(|m| {
                let r = compare_trees(src, m.path(), &opts);
                m.unmount()?;
                r
            });
            let _ = fs::remove_dir(&mnt);
            ("kernel ro", r)
        } else {
            // The kernel cannot mount it: fuse2fs if present (whole seconds
            // only), else debugfs rdump (weaker still).
            let mnt = out.join(format!("mnt-{name}"));
            match LoopMount::fuse2fs(&img, &mnt) {
                Ok(m) => {
                    let mut opts = spec.map_or_else(CompareOpts::default, |s| s.compare_opts());
                    opts.ignore_lost_found = true;
                    if opts.times == TimeFidelity::Nanoseconds {
                        opts.times = TimeFidelity::Seconds;
                    }
                    let r = compare_trees(src, m.path(), &opts);
                    let r = m.unmount().and(r);
                    let _ = fs::remove_dir(&mnt);
                    ("fuse2fs (s)", r)
                }
                Err(e) => {
                    let _ = fs::remove_dir(&mnt);
                    println!("NOTE: {e}; falling back to debugfs rdump for {name}");
                    let dest = out.join(format!("rdump-{name}"));
                    if dest.exists() {
                        make_removable(&dest)?;
                        fs::remove_dir_all(&dest)?;
                    }
                    let r = debugfs_rdump(&img, &dest).and_then(|()| compare_rdump(src, &dest));
                    if matches!(&r, Ok(d) if d.is_empty()) {
                        make_removable(&dest)?;
                        fs::remove_dir_all(&dest)?;
                    }
                    ("debugfs rdump", r)
                }
            }
        };
        match result {
            Ok(d) if d.is_empty() => println!("{name:<24} {:<8} {reader:<14} identical", "PASS"),
            Ok(d) => {
                all_ok = false;
                println!("{name:<24} {:<8} {reader:<14} {} differences:", "FAIL", d.len());
                for x in d.iter().take(20) {
                    println!("    {x}");
                }
            }
            Err(e) => {
                all_ok = false;
                println!("{name:<24} {:<8} {reader:<14} error: {e}", "FAIL");
            }
        }
    }
    Ok(all_ok)
}

/// Makes every directory below `p` writable by its owner so a tree with
/// read-only directories can be deleted without root.
fn make_removable(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let md = fs::symlink_metadata(p)?;
    if md.is_dir() {
        let mode = md.permissions().mode();
        if mode & 0o700 != 0o700 {
            fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o700))?;
        }
        for e in fs::read_dir(p)? {
            make_removable(&e?.path())?;
        }
    }
    Ok(())
}
