//! The fresh images workloads start from, made by mke2fs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use ext4kit_testkit::{run_ok, FIXED_HASH_SEED, FIXED_TIME, FIXED_UUID};

/// Which filesystem a workload runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FsVariant {
    /// ext4, 4 KiB blocks, 32 MiB, mke2fs's default journal (4 MiB).
    Ext4,
    /// ext4, 1 KiB blocks, 16 MiB (mke2fs's "small" type), 1 MiB journal.
    Ext4Small,
    /// ext3 (indirect block maps, no extents), 1 KiB blocks, 16 MiB.
    Ext3,
}

impl FsVariant {
    /// Every variant.
    pub const ALL: [FsVariant; 3] = [FsVariant::Ext4, FsVariant::Ext4Small, FsVariant::Ext3];

    /// Short name (`ext4-4k`, `ext4-1k`, `ext3-1k`).
    pub fn name(self) -> &'static str {
        match self {
            FsVariant::Ext4 => "ext4-4k",
            FsVariant::Ext4Small => "ext4-1k",
            FsVariant::Ext3 => "ext3-1k",
        }
    }

    /// The variant called `s`.
    pub fn parse(s: &str) -> Option<FsVariant> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Image size in bytes.
    pub fn size(self) -> u64 {
        match self {
            FsVariant::Ext4 => 32 << 20,
            FsVariant::Ext4Small | FsVariant::Ext3 => 16 << 20,
        }
    }

    fn mkfs_args(self) -> [&'static str; 4] {
        match self {
            FsVariant::Ext4 => ["-t", "ext4", "-b", "4096"],
            FsVariant::Ext4Small => ["-t", "ext4", "-b", "1024"],
            FsVariant::Ext3 => ["-t", "ext3", "-b", "1024"],
        }
    }
}

/// Where the harness puts its scratch files: `/dev/shm` when it is
/// usable (crash images are written and read thousands of times), else the
/// temporary directory. `EXT4KIT_CRASH_SCRATCH` overrides.
pub fn scratch_root() -> PathBuf {
    if let Some(p) = std::env::var_os("EXT4KIT_CRASH_SCRATCH") {
        return PathBuf::from(p);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && writable(shm) {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

fn writable(p: &Path) -> bool {
    let probe = p.join(format!(".ext4kit-crash-probe-{}", std::process::id()));
    let ok = std::fs::write(&probe, b"x").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// The files every base image holds under `/base` (name, contents): what
/// the read-only workload reads, and bystanders for every other workload.
pub fn base_files() -> Vec<(&'static str, Vec<u8>)> {
    let pattern = |n: usize, k: u8| {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(k).wrapping_add(k))
            .collect::<Vec<u8>>()
    };
    vec![
        ("readme", b"the files every crash-test image starts with\n".to_vec()),
        ("data", pattern(20_000, 7)),
        ("big", pattern(300_000, 13)),
        ("sub/small", pattern(100, 3)),
        ("sub/empty", Vec::new()),
    ]
}

/// The fresh image of `v` (made once per process, then shared): mke2fs
/// with a fixed UUID, hash seed and time, `/base` filled from
/// [`base_files`] plus a symlink `/base/sub/link -> ../readme`.
pub fn base_image(v: FsVariant) -> std::io::Result<Arc<Vec<u8>>> {
    static CACHE: OnceLock<Mutex<HashMap<FsVariant, Arc<Vec<u8>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // Held while building: two threads wanting the same image build it once.
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(img) = cache.get(&v) {
        return Ok(img.clone());
    }
    let dir = scratch_root().join(format!("ext4kit-crash-base-{}-{}", std::process::id(), v.name()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    for (name, data) in base_files() {
        let p = src.join("base").join(name);
        std::fs::create_dir_all(p.parent().expect("has a parent"))?;
        std::fs::write(&p, data)?;
    }
    std::os::unix::fs::symlink("../readme", src.join("base/sub/link"))?;
    let img = dir.join("base.img");
    run_ok(
        Command::new("mke2fs")
            .env("E2FSPROGS_FAKE_TIME", FIXED_TIME.to_string())
            .args(["-q", "-F"])
            .args(v.mkfs_args())
            .args(["-U", FIXED_UUID])
            .args(["-E", &format!("hash_seed={FIXED_HASH_SEED}")])
            .arg("-d")
            .arg(&src)
            .arg(&img)
            .arg(format!("{}k", v.size() >> 10)),
        &[0],
    )?;
    let bytes = Arc::new(std::fs::read(&img)?);
    let _ = std::fs::remove_dir_all(&dir);
    cache.insert(v, bytes.clone());
    Ok(bytes)
}
