//! Seed images: one small ext4 (mke2fs -d) converted by the real tools
//! into every container variant the campaign mutates.
//!
//! Real tools, not our own writers, make the seeds, so the structures the
//! mutator breaks are laid out the way images in the wild are: qemu-img
//! for qcow2, VHD, VHDX and VMDK, img2simg for Android sparse, and LVM2's
//! own pvcreate/vgcreate/lvcreate on a loop device (activation disabled)
//! for the PV. Seeds are built once into a cache directory (built in a
//! temporary directory, then renamed, so concurrent builders never see a
//! half-made set) and read from there by every worker process.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ext4kit_blockdev::{BlockDevice, FileDevice};

/// Bump when the seed recipe changes, so stale caches are not reused.
const SEEDS_VERSION: u32 = 2;

/// Size of the raw ext4 every seed holds.
pub const RAW_SIZE: u64 = 8 << 20;

/// A container family: what `--format` selects and how a case is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// qcow2 (opened through imago).
    Qcow2,
    /// qcow2 whose compressed clusters are zstd (vdisk's own reader).
    Qcow2Zstd,
    /// VHD, fixed and dynamic.
    Vhd,
    /// VHDX, fixed and dynamic.
    Vhdx,
    /// VMDK: monolithicSparse, streamOptimized, descriptor + flat extent.
    Vmdk,
    /// Android sparse.
    AndroidSparse,
    /// An LVM2 physical volume.
    Lvm,
}

impl Family {
    /// Every family, in campaign order.
    pub const ALL: [Family; 7] =
        [Family::Qcow2, Family::Qcow2Zstd, Family::Vhd, Family::Vhdx, Family::Vmdk, Family::AndroidSparse, Family::Lvm];

    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Family::Qcow2 => "qcow2",
            Family::Qcow2Zstd => "qcow2-zstd",
            Family::Vhd => "vhd",
            Family::Vhdx => "vhdx",
            Family::Vmdk => "vmdk",
            Family::AndroidSparse => "android-sparse",
            Family::Lvm => "lvm",
        }
    }

    /// The family named `s`.
    pub fn parse(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// One seed: its files, the first being the one opened.
#[derive(Debug, Clone)]
pub struct Seed {
    /// Name ("qcow2-zlib").
    pub name: &'static str,
    /// Its family.
    pub family: Family,
    /// (file name, contents); `files[0]` is opened.
    pub files: Vec<(String, Vec<u8>)>,
}

/// The variants made, per family: (name, family, files).
const RECIPES: &[(&str, Family, &[&str])] = &[
    ("qcow2", Family::Qcow2, &["disk.qcow2"]),
    ("qcow2-zlib", Family::Qcow2, &["disk.qcow2"]),
    ("qcow2-backing", Family::Qcow2, &["overlay.qcow2", "base.qcow2"]),
    ("qcow2-zstd", Family::Qcow2Zstd, &["disk.qcow2"]),
    ("qcow2-zstd-backing", Family::Qcow2Zstd, &["overlay.qcow2", "base.qcow2"]),
    ("vhd-dynamic", Family::Vhd, &["disk.vhd"]),
    ("vhd-fixed", Family::Vhd, &["disk.vhd"]),
    ("vhdx-dynamic", Family::Vhdx, &["disk.vhdx"]),
    ("vhdx-fixed", Family::Vhdx, &["disk.vhdx"]),
    ("vmdk-sparse", Family::Vmdk, &["disk.vmdk"]),
    ("vmdk-stream", Family::Vmdk, &["disk.vmdk"]),
    ("vmdk-flat", Family::Vmdk, &["disk.vmdk", "disk-flat.vmdk"]),
    ("android-sparse", Family::AndroidSparse, &["disk.simg"]),
    ("lvm-pv", Family::Lvm, &["pv.img"]),
];

/// Why seeds could not be made.
#[derive(Debug)]
pub struct SeedError(pub String);

impl std::fmt::Display for SeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(s: impl Into<String>) -> SeedError {
    SeedError(s.into())
}

/// Fail, naming the package, when a tool the seeds need is missing.
pub fn check_tools(families: &[Family]) -> Result<(), SeedError> {
    let mut need = vec![("mke2fs", "e2fsprogs"), ("qemu-img", "qemu-utils")];
    if families.contains(&Family::AndroidSparse) {
        need.push(("img2simg", "android-sdk-libsparse-utils"));
    }
    if families.contains(&Family::Lvm) {
        need.extend([("lvm", "lvm2"), ("losetup", "util-linux")]);
    }
    for (tool, pkg) in need {
        if which(tool).is_none() {
            return Err(err(format!(
                "{tool} is not installed; the hostile-disk campaign builds its seed images with it: \
                 apt-get install -y {pkg}"
            )));
        }
    }
    if families.contains(&Family::Lvm) && !is_root() {
        return Err(err("the LVM seed is made with pvcreate on a loop device, which needs root"));
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(["/sbin".into(), "/usr/sbin".into()]).map(|d| d.join(tool)).find(|p| p.exists())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The cache: `$EXT4KIT_FUZZ_DISKS`, else `target/fuzz-disks/v<N>`.
pub fn seeds_dir() -> PathBuf {
    let root = match std::env::var_os("EXT4KIT_FUZZ_DISKS") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-disks"),
    };
    root.join(format!("v{SEEDS_VERSION}"))
}

/// Build (if not cached) and load the seeds of `families`.
pub fn seeds(families: &[Family]) -> Result<Vec<Seed>, SeedError> {
    let dir = seeds_dir();
    if !dir.join("done").exists() {
        check_tools(&Family::ALL)?;
        build_all(&dir)?;
    }
    load(&dir, families)
}

/// Load seeds of `families` from a built cache directory.
pub fn load(dir: &Path, families: &[Family]) -> Result<Vec<Seed>, SeedError> {
    let mut out = Vec::new();
    for &(name, family, files) in RECIPES.iter().filter(|r| families.contains(&r.1)) {
        let mut fs_ = Vec::new();
        for f in files {
            let p = dir.join(name).join(f);
            let bytes = fs::read(&p).map_err(|e| err(format!("seed {}: {e}", p.display())))?;
            fs_.push((f.to_string(), bytes));
        }
        out.push(Seed { name, family, files: fs_ });
    }
    Ok(out)
}

fn run(cmd: &str, args: &[&str]) -> Result<String, SeedError> {
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .map_err(|e| err(format!("cannot run {cmd}: {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "{cmd} {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Deterministic filler: text for compressible clusters, noise for the rest.
fn filler(len: usize, seed: u64, text: bool) -> Vec<u8> {
    let mut rng = crate::prng::Rng::new(seed);
    let mut v = vec![0u8; len];
    if text {
        for (i, b) in v.iter_mut().enumerate() {
            *b = b"ext4kit hostile disk seed\n"[i % 26];
        }
    } else {
        rng.fill(&mut v);
    }
    v
}

fn build_all(dir: &Path) -> Result<(), SeedError> {
    let parent = dir.parent().unwrap_or(dir);
    fs::create_dir_all(parent).map_err(|e| err(format!("{}: {e}", parent.display())))?;
    let tmp = parent.join(format!("building-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| err(e.to_string()))?;
    let r = build_into(&tmp);
    if let Err(e) = r {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    fs::write(tmp.join("done"), b"").map_err(|e| err(e.to_string()))?;
    // Another builder may have won the race: theirs is as good as ours.
    if fs::rename(&tmp, dir).is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    Ok(())
}

fn build_into(dir: &Path) -> Result<(), SeedError> {
    let raw = dir.join("raw.img");
    make_raw(dir, &raw)?;
    let sub = |name: &str| -> Result<PathBuf, SeedError> {
        let d = dir.join(name);
        fs::create_dir_all(&d).map_err(|e| err(e.to_string()))?;
        Ok(d)
    };
    let conv = |fmt: &str, opts: &[&str], out: &Path| -> Result<(), SeedError> {
        let mut a = vec!["convert", "-q", "-f", "raw", "-O", fmt];
        a.extend_from_slice(opts);
        a.extend_from_slice(&[p(&raw), p(out)]);
        run("qemu-img", &a).map(drop)
    };
    conv("qcow2", &[], &sub("qcow2")?.join("disk.qcow2"))?;
    conv("qcow2", &["-c", "-o", "compression_type=zlib"], &sub("qcow2-zlib")?.join("disk.qcow2"))?;
    // Backing chain: the overlay holds only what differs from base (the
    // last MiB, free space of the filesystem) and names "base.qcow2".
    let d = sub("qcow2-backing")?;
    conv("qcow2", &[], &d.join("base.qcow2"))?;
    let mut changed = fs::read(&raw).map_err(|e| err(e.to_string()))?;
    let n = changed.len();
    changed[n - (1 << 20)..n - (1 << 19)].copy_from_slice(&filler(1 << 19, 7, false));
    let raw2 = dir.join("raw2.img");
    fs::write(&raw2, &changed).map_err(|e| err(e.to_string()))?;
    let overlay = |d: &Path, opts: &[&str]| -> Result<(), SeedError> {
        let out = d.join("overlay.qcow2");
        let mut a = vec!["convert", "-q", "-f", "raw", "-O", "qcow2"];
        a.extend_from_slice(opts);
        a.extend_from_slice(&["-B", "base.qcow2", "-F", "qcow2", p(&raw2), p(&out)]);
        run("qemu-img", &a).map(drop)
    };
    overlay(&d, &[])?;
    // The same two shapes with zstd clusters, which vdisk reads itself.
    let zstd = ["-c", "-o", "compression_type=zstd"];
    conv("qcow2", &zstd, &sub("qcow2-zstd")?.join("disk.qcow2"))?;
    let d = sub("qcow2-zstd-backing")?;
    conv("qcow2", &zstd, &d.join("base.qcow2"))?;
    overlay(&d, &zstd)?;
    conv("vpc", &["-o", "subformat=dynamic"], &sub("vhd-dynamic")?.join("disk.vhd"))?;
    conv("vpc", &["-o", "subformat=fixed,force_size=on"], &sub("vhd-fixed")?.join("disk.vhd"))?;
    conv("vhdx", &["-o", "subformat=dynamic"], &sub("vhdx-dynamic")?.join("disk.vhdx"))?;
    conv("vhdx", &["-o", "subformat=fixed"], &sub("vhdx-fixed")?.join("disk.vhdx"))?;
    conv("vmdk", &["-o", "subformat=monolithicSparse"], &sub("vmdk-sparse")?.join("disk.vmdk"))?;
    conv("vmdk", &["-o", "subformat=streamOptimized"], &sub("vmdk-stream")?.join("disk.vmdk"))?;
    conv("vmdk", &["-o", "subformat=monolithicFlat"], &sub("vmdk-flat")?.join("disk.vmdk"))?;
    run("img2simg", &[p(&raw), p(&sub("android-sparse")?.join("disk.simg"))])?;
    make_lvm(&raw, &sub("lvm-pv")?.join("pv.img"))?;
    Ok(())
}

/// A small ext4 with directories, symlinks, a compressible file and an
/// incompressible one (so qcow2 has both compressed and plain clusters).
fn make_raw(dir: &Path, raw: &Path) -> Result<(), SeedError> {
    let tree = dir.join("tree");
    let w = |rel: &str, data: &[u8]| -> Result<(), SeedError> {
        let f = tree.join(rel);
        fs::create_dir_all(f.parent().unwrap()).map_err(|e| err(e.to_string()))?;
        fs::write(&f, data).map_err(|e| err(e.to_string()))
    };
    w("hello.txt", b"hello, hostile disk\n")?;
    w("dir/a/b/deep.txt", b"deep\n")?;
    w("text.bin", &filler(768 << 10, 1, true))?;
    w("noise.bin", &filler(1 << 20, 2, false))?;
    for i in 0..40 {
        w(&format!("many/file-{i:03}"), format!("{i}\n").as_bytes())?;
    }
    std::os::unix::fs::symlink("dir/a/b/deep.txt", tree.join("link")).map_err(|e| err(e.to_string()))?;
    run(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-L",
            "fuzzdisk",
            "-E",
            "root_owner=0:0",
            "-d",
            p(&tree),
            p(raw),
            "8M",
        ],
    )?;
    Ok(())
}

/// A 24 MiB PV holding VG `fuzzvg`: LV `lv` (8 MiB in two segments, the
/// ext4 written into it through our own LV writer) and LV `small` between
/// them. LVM runs against only this loop device, with no devices file,
/// no backups and activation off, so nothing outlives the build.
fn make_lvm(raw: &Path, out: &Path) -> Result<(), SeedError> {
    fs::File::create(out).and_then(|f| f.set_len(24 << 20)).map_err(|e| err(e.to_string()))?;
    let dev = run("losetup", &["-f", "--show", p(out)])?.trim().to_string();
    let cfg = format!(
        "devices {{ filter = [ \"a|^{dev}$|\", \"r|.*|\" ] use_devicesfile = 0 }} \
         backup {{ backup = 0 archive = 0 }} activation {{ udev_sync = 0 udev_rules = 0 }} \
         global {{ activation = 0 }}"
    );
    let vg = format!("fuzzvg{}", std::process::id());
    let lvm = |args: &[&str]| {
        let mut a = vec![args[0], "--config", &cfg];
        a.extend_from_slice(&args[1..]);
        run("lvm", &a)
    };
    let made = (|| {
        lvm(&["pvcreate", "-y", &dev])?;
        lvm(&["vgcreate", "-y", "-s", "1m", &vg, &dev])?;
        lvm(&["lvcreate", "-L", "4m", "-n", "lv", "-an", "-Zn", "-Wn", "-y", &vg])?;
        lvm(&["lvcreate", "-L", "1m", "-n", "small", "-an", "-Zn", "-Wn", "-y", &vg])?;
        lvm(&["lvextend", "-L", "8m", &format!("{vg}/lv")])?;
        Ok::<(), SeedError>(())
    })();
    let _ = Command::new("losetup").args(["-d", &dev]).output();
    made?;
    let pv: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(out, true).map_err(|e| err(e.to_string()))?);
    let vgs = ext4kit_vdisk::lvm::volume_groups(&[("pv".into(), pv.clone())]).map_err(|e| err(e.to_string()))?;
    let v = vgs.first().ok_or_else(|| err("the new PV holds no VG"))?;
    let lv = v.open("lv", true).map_err(|e| err(e.to_string()))?;
    let data = fs::read(raw).map_err(|e| err(e.to_string()))?;
    lv.write_at(0, &data).and_then(|_| lv.flush()).map_err(|e| err(format!("writing the LV: {e}")))?;
    Ok(())
}
