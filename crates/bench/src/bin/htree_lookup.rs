//! The htree experiment on the read side: the cost of looking one name up
//! in directories of 1k, 10k and 50k entries, indexed (htree) versus the
//! same names in a linear directory (`-O ^dir_index`), on ext4kit and on
//! the kernel (loop mount), side by side.
//!
//! Each measured lookup is a dentry-cache miss (every probe asks a name not
//! asked before on that `Fs`); the metadata buffer cache is warm, as it is
//! for a kernel lookup whose directory blocks sit in the page cache. The
//! kernel column uses `stat(2)` on names never looked up since the mount.
//!
//!     sudo target/release/htree-lookup [--probes 2000] [--sizes 1000,10000,50000]

/// The benchmark programs run the library in-process, so they use the
/// allocator the `ext4kit` binary ships with (see its `main.rs`): numbers
/// then describe what users of our binaries get.
#[global_allocator]
static ALLOC: ext4kit_alloc::Allocator = ext4kit_alloc::Allocator;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use ext4kit::{Fs, OpenOptions};
use ext4kit_bench::{median, mount, need_kernel, run};

#[derive(Parser)]
#[command(about = "Lookup time in big directories: htree vs linear, ext4kit vs kernel")]
struct Args {
    /// Lookups measured per configuration.
    #[arg(long, default_value_t = 2000)]
    probes: usize,
    /// Directory sizes.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    sizes: Vec<usize>,
    /// Work directory (images are kept there between runs).
    #[arg(long, default_value = "target/bench-htree")]
    work: PathBuf,
}

fn name(i: usize) -> String {
    format!("file-{i:07}-{}", i.wrapping_mul(2654435761) % 100_000)
}

fn make_image(work: &Path, entries: usize, dir_index: bool) -> Result<PathBuf, String> {
    let img = work.join(format!(
        "dir{entries}-{}.img",
        if dir_index { "htree" } else { "linear" }
    ));
    if img.exists() {
        return Ok(img);
    }
    let feat = if dir_index { "dir_index" } else { "^dir_index" };
    let tmp = img.with_extension("tmp");
    run(Command::new("mke2fs")
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-O",
            feat,
            "-N",
            &(entries + 100).to_string(),
        ])
        .arg(&tmp)
        .arg(format!("{}M", 32 + entries / 1000)))?;
    {
        let m = mount(&tmp, &work.join("mnt"), "")?;
        std::fs::create_dir(m.path().join("big")).map_err(|e| e.to_string())?;
        for i in 0..entries {
            std::fs::File::create(m.path().join("big").join(name(i))).map_err(|e| e.to_string())?;
        }
    }
    std::fs::rename(&tmp, &img).map_err(|e| e.to_string())?;
    Ok(img)
}

/// (median per lookup, directory blocks per lookup) through ext4kit.
fn ext4kit_lookup(img: &Path, entries: usize, probes: usize) -> Result<(Duration, f64), String> {
    // A fresh Fs: empty dentry cache. Warm only the metadata buffer cache,
    // by listing the directory once (readdir creates no dentries).
    let fs = Fs::open_image(img, &OpenOptions::default()).map_err(|e| e.to_string())?;
    fs.read_dir(b"/big").map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(probes);
    let before = fs.stats().dir_block_reads;
    for k in 0..probes {
        let p = format!("/big/{}", name((k * 7919) % entries));
        let t = Instant::now();
        let d = fs
            .resolve(ext4kit::Target::path(p.as_bytes()).nofollow())
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        std::hint::black_box(d);
    }
    let blocks = (fs.stats().dir_block_reads - before) as f64 / probes as f64;
    Ok((median(&mut times), blocks))
}

fn kernel_lookup(img: &Path, work: &Path, entries: usize, probes: usize) -> Result<Duration, String> {
    let m = mount(img, &work.join("mnt"), "ro")?;
    // Bring directory blocks into the page cache without creating dentries
    // for the probed names: readdir.
    let _ = std::fs::read_dir(m.path().join("big"))
        .map_err(|e| e.to_string())?
        .count();
    let mut times = Vec::with_capacity(probes);
    for k in 0..probes {
        let p = m.path().join("big").join(name((k * 7919) % entries));
        let t = Instant::now();
        let r = std::fs::symlink_metadata(&p);
        times.push(t.elapsed());
        r.map_err(|e| e.to_string())?;
    }
    Ok(median(&mut times))
}

fn main() -> Result<(), String> {
    ext4kit_alloc::tune();
    let a = Args::parse();
    need_kernel("htree-lookup")?;
    std::fs::create_dir_all(&a.work).map_err(|e| e.to_string())?;
    println!(
        "lookup of one name (median of {} distinct names, dentry-cache misses, warm block cache)",
        a.probes
    );
    println!(
        "{:>8} | {:>13} {:>8} | {:>13} {:>8} | {:>7} | {:>12} {:>12}",
        "entries", "ext4kit htree", "blk/lkp", "ext4kit linear", "blk/lkp", "lin/htr", "kernel htree", "kernel linear"
    );
    for &n in &a.sizes {
        let h = make_image(&a.work, n, true)?;
        let l = make_image(&a.work, n, false)?;
        let probes = a.probes.min(n);
        let (th, bh) = ext4kit_lookup(&h, n, probes)?;
        let (tl, bl) = ext4kit_lookup(&l, n, probes.min(500))?;
        let kh = kernel_lookup(&h, &a.work, n, probes)?;
        let kl = kernel_lookup(&l, &a.work, n, probes.min(500))?;
        println!(
            "{:>8} | {:>10.2} µs {:>8.2} | {:>11.2} µs {:>8.1} | {:>6.1}x | {:>9.2} µs {:>10.2} µs",
            n,
            th.as_secs_f64() * 1e6,
            bh,
            tl.as_secs_f64() * 1e6,
            bl,
            tl.as_secs_f64() / th.as_secs_f64().max(1e-9),
            kh.as_secs_f64() * 1e6,
            kl.as_secs_f64() * 1e6
        );
    }
    Ok(())
}
