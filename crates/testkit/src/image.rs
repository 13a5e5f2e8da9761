//! Fixture images: the source tree baked by `mke2fs -d` across the feature
//! matrix ext4kit promises to read, and by the kernel (loop mount + `cp -a`).
//!
//! Every image this module returns has passed `e2fsck -fn`; a fixture that
//! e2fsprogs itself rejects would make every test built on it meaningless.
//!
//! Facts about e2fsprogs 1.47.0 this module works around (measured here):
//! - `mke2fs -d` writes directories linearly, however big: the htrees are
//!   made afterwards by `e2fsck -fyD`, which rebuilds every multi-block
//!   directory with the superblock's default hash (set first with
//!   `tune2fs -E hash_alg=`) and its signed/unsigned flag (set with
//!   `debugfs -w -R "ssv flags N"`).
//! - `mke2fs -d` stores only 32-bit seconds: no nanoseconds, no epoch bits
//!   (3000000000 comes back as 1928), and the root gets the mkfs time. The
//!   source times are restored afterwards with `debugfs sif` on every inode
//!   (`mtime_lo` + `mtime_extra`), so images carry what the kernel's
//!   `cp -a` would have written.
//! - `mke2fs -d` copies ctime from the source (not reproducible); the same
//!   pass sets every ctime to [`FIXED_TIME`].
//! - `mke2fs -d` with inline_data sets i_size of a file ending in a hole to
//!   the end of its last data (16 MiB with 4 KiB of data → 4096); e2fsck
//!   does not notice. The same pass restores the size.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::compare::{compare_trees, CompareOpts, TimeFidelity};
use crate::util::{describe, join_bytes, run, run_ok, Context};

/// The filesystem UUID of every fixture (`mke2fs -U`), for reproducibility.
pub const FIXED_UUID: &str = "e4e4e4e4-0000-4000-8000-000000000001";
/// The directory hash seed of every fixture (`mke2fs -E hash_seed=`).
pub const FIXED_HASH_SEED: &str = "5eed5eed-1111-4222-8333-444444444444";
/// The "now" given to e2fsprogs (`E2FSPROGS_FAKE_TIME`, `E2FSCK_TIME`) and
/// written as every inode's ctime, so images are byte-reproducible.
pub const FIXED_TIME: i64 = 1_700_000_000;

/// A directory hash algorithm (superblock `s_def_hash_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirHash {
    /// The original ext3 hash (version 0).
    Legacy,
    /// Half MD4 (version 1), mke2fs's default.
    HalfMd4,
    /// TEA (version 2).
    Tea,
}

impl DirHash {
    /// The on-disk hash version number.
    pub fn version(self) -> u8 {
        match self {
            DirHash::Legacy => 0,
            DirHash::HalfMd4 => 1,
            DirHash::Tea => 2,
        }
    }

    /// The name `tune2fs -E hash_alg=` takes.
    pub fn tune2fs_name(self) -> &'static str {
        match self {
            DirHash::Legacy => "legacy",
            DirHash::HalfMd4 => "half_md4",
            DirHash::Tea => "tea",
        }
    }
}

/// Whether directory hashes treat name bytes as signed or unsigned char
/// (superblock `s_flags` bit 0x1 / 0x2). Differs for bytes ≥ 0x80 only;
/// mke2fs picks the host's `char` signedness (signed on x86, unsigned on
/// ARM and POWER), so both occur in the wild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashSign {
    /// `EXT2_FLAGS_SIGNED_HASH` (0x1).
    Signed,
    /// `EXT2_FLAGS_UNSIGNED_HASH` (0x2).
    Unsigned,
}

impl HashSign {
    fn s_flags(self) -> u32 {
        match self {
            HashSign::Signed => 1,
            HashSign::Unsigned => 2,
        }
    }
    fn dumpe2fs_word(self) -> &'static str {
        match self {
            HashSign::Signed => "signed_directory_hash",
            HashSign::Unsigned => "unsigned_directory_hash",
        }
    }
}

/// One image of the fixture matrix: how to make it and what a reader of it
/// may expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// Short name; the image file is `<name>.img`.
    pub name: &'static str,
    /// What this image is for.
    pub description: &'static str,
    /// `mke2fs -t` type: "ext2", "ext3" or "ext4".
    pub fs_type: &'static str,
    /// Block size in bytes (`-b`).
    pub block_size: u32,
    /// Inode size in bytes (`-I`).
    pub inode_size: u32,
    /// Extra `-O` feature edits, e.g. "inline_data" or "^extent".
    pub features: &'static [&'static str],
    /// Whether the image has dir_index (its big directories become htrees).
    pub dir_index: bool,
    /// Default directory hash the htrees must use.
    pub hash: DirHash,
    /// Forced hash signedness; None keeps mke2fs's choice.
    pub hash_sign: Option<HashSign>,
    /// Whether this kernel can mount it (64 KiB blocks > page size: no).
    pub kernel_mountable: bool,
    /// How precisely the image keeps mtimes (128-byte inodes: 32-bit
    /// seconds only).
    pub time_fidelity: TimeFidelity,
}

impl ImageSpec {
    /// The comparison a correct reader of this image must pass against
    /// the source tree (lost+found ignored; everything else compared).
    pub fn compare_opts(&self) -> CompareOpts {
        CompareOpts {
            ignore_lost_found: true,
            times: self.time_fidelity,
            ..CompareOpts::default()
        }
    }

    /// The same as [`ImageSpec::compare_opts`], as `ext4kit-treecmp` flags.
    pub fn treecmp_args(&self) -> Vec<&'static str> {
        let mut v = vec!["--ignore-lost-found"];
        match self.time_fidelity {
            TimeFidelity::Nanoseconds => {}
            TimeFidelity::Seconds => v.extend(["--times", "seconds"]),
            TimeFidelity::Seconds32 => v.extend(["--times", "seconds32"]),
            TimeFidelity::Ignore => v.extend(["--times", "ignore"]),
        }
        v
    }

    /// The mke2fs arguments (without -d, size, inode count and file name).
    pub fn mkfs_args(&self) -> Vec<String> {
        let mut v = vec![
            "-t".to_string(),
            self.fs_type.to_string(),
            "-b".to_string(),
            self.block_size.to_string(),
            "-I".to_string(),
            self.inode_size.to_string(),
        ];
        if !self.features.is_empty() {
            v.push("-O".to_string());
            v.push(self.features.join(","));
        }
        v
    }
}

/// The fixture matrix: mke2fs 1.47's layouts ext4kit promises to read.
pub fn image_matrix() -> Vec<ImageSpec> {
    let base = ImageSpec {
        name: "",
        description: "",
        fs_type: "ext4",
        block_size: 4096,
        inode_size: 256,
        features: &["metadata_csum_seed"],
        dir_index: true,
        hash: DirHash::HalfMd4,
        hash_sign: None,
        kernel_mountable: true,
        time_fidelity: TimeFidelity::Nanoseconds,
    };
    vec![
        ImageSpec {
            name: "ext2-1k",
            description: "ext2, 1 KiB blocks, no dir_index (linear directories, indirect maps up to triple)",
            fs_type: "ext2",
            block_size: 1024,
            features: &["^dir_index"],
            dir_index: false,
            ..base.clone()
        },
        ImageSpec {
            name: "ext3-2k",
            description: "ext3, 2 KiB blocks, journal, htree (half_md4)",
            fs_type: "ext3",
            block_size: 2048,
            features: &[],
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-default",
            description: "ext4 mke2fs defaults (4 KiB, extents, 64bit, flex_bg, metadata_csum) + metadata_csum_seed",
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-1k",
            description: "ext4, 1 KiB blocks (what mke2fs picks for small filesystems; the full big directory needs a two-level htree)",
            block_size: 1024,
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-64k",
            description: "ext4, 64 KiB blocks (not mountable by a 4 KiB-page kernel)",
            block_size: 65536,
            kernel_mountable: false,
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-inline",
            description: "ext4 with inline_data (small files and directories inside the inode)",
            features: &["metadata_csum_seed", "inline_data"],
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-noextent",
            description: "ext4 without extents (indirect block maps; 64bit must go too)",
            features: &["metadata_csum_seed", "^extent", "^64bit"],
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-inode128",
            description: "ext4 with 128-byte inodes (no extra fields: 32-bit seconds, all xattrs external)",
            inode_size: 128,
            time_fidelity: TimeFidelity::Seconds32,
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-tea",
            description: "ext4, default directory hash TEA",
            hash: DirHash::Tea,
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-halfmd4-unsigned",
            description: "ext4, half_md4 with unsigned char hashing (as mke2fs makes it on ARM/POWER)",
            hash_sign: Some(HashSign::Unsigned),
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-legacy-signed",
            description: "ext4, legacy directory hash, signed char",
            hash: DirHash::Legacy,
            hash_sign: Some(HashSign::Signed),
            ..base.clone()
        },
        ImageSpec {
            name: "ext4-legacy-unsigned",
            description: "ext4, legacy directory hash, unsigned char",
            hash: DirHash::Legacy,
            hash_sign: Some(HashSign::Unsigned),
            ..base.clone()
        },
    ]
}

/// e2fsprogs with a fixed clock, so the images are reproducible.
pub(crate) fn e2fs(prog: &str) -> Command {
    let mut c = Command::new(prog);
    c.env("E2FSPROGS_FAKE_TIME", FIXED_TIME.to_string())
        .env("E2FSCK_TIME", FIXED_TIME.to_string())
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    c
}

/// Size and inode count an image needs to hold the tree at `src`.
struct Estimate {
    bytes: u64,
    inodes: u64,
    /// Directories (relative paths) whose entries span several blocks: the
    /// ones that must be htrees when dir_index is on.
    multi_block_dirs: Vec<Vec<u8>>,
}

fn estimate(src: &Path, block_size: u64, inode_size: u64) -> io::Result<Estimate> {
    let mut inodes = std::collections::BTreeSet::new();
    let mut blocks: u64 = 0;
    let mut multi_block_dirs = Vec::new();
    let mut stack = vec![Vec::<u8>::new()];
    let md = fs::symlink_metadata(src).context(|| format!("stat {}", src.display()))?;
    inodes.insert(md.ino());
    while let Some(rel) = stack.pop() {
        let dir = join_bytes(src, &rel);
        let mut dirent_bytes: u64 = 24; // . and ..
        for e in fs::read_dir(&dir).context(|| format!("readdir {}", dir.display()))? {
            let e = e.context(|| format!("readdir {}", dir.display()))?;
            let name = e.file_name();
            let name = name.as_bytes();
            dirent_bytes += 8 + (name.len() as u64).div_ceil(4) * 4;
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(name);
            let md = fs::symlink_metadata(e.path()).context(|| format!("stat {}", e.path().display()))?;
            if !inodes.insert(md.ino()) {
                continue;
            }
            let ft = md.file_type();
            if ft.is_dir() {
                stack.push(child);
            } else if ft.is_file() && md.len() > 0 {
                let allocated = (md.blocks() * 512).div_ceil(block_size);
                let apparent = md.len().div_ceil(block_size);
                // Partial blocks at each end of each data run, plus map
                // blocks (indirect/extent) for sparse and large files.
                blocks += apparent.min(allocated + 8) + 2 + apparent / (block_size / 4);
            } else if ft.is_symlink() && md.len() >= 60 {
                blocks += 1;
            }
            // One external xattr block at most per inode.
            if rustix::fs::llistxattr_query(e.path()).unwrap_or(0) > 0 {
                blocks += 1;
            }
        }
        // Directory blocks are rarely more than half full after a rehash.
        let dir_blocks = (dirent_bytes * 2).div_ceil(block_size) + 1;
        if dirent_bytes > 2 * block_size {
            multi_block_dirs.push(rel);
        }
        blocks += dir_blocks;
    }
    let n = inodes.len() as u64;
    let inode_count = n + n / 8 + 128;
    let journal = 64 * 1024 * 1024 + 1024 * block_size;
    let bytes =
        blocks * block_size + blocks * block_size / 4 + inode_count * inode_size * 5 / 4 + journal + 32 * 1024 * 1024;
    Ok(Estimate {
        bytes: bytes.div_ceil(1024 * 1024) * 1024 * 1024,
        inodes: inode_count,
        multi_block_dirs,
    })
}

/// Builds `out` from the tree at `src` per `spec`: mke2fs -d with fixed
/// UUID, hash seed and clock; htrees rebuilt with the wanted hash; source
/// timestamps restored at full precision; then checked: the big
/// directories must be htrees with the wanted hash version and sign, and
/// `e2fsck -fn` must be clean. Any failure is an error naming the step.
pub fn make_image(spec: &ImageSpec, src: &Path, out: &Path) -> io::Result<()> {
    let est = estimate(src, u64::from(spec.block_size), u64::from(spec.inode_size))?;
    match fs::remove_file(out) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(|| format!("remove old {}", out.display())),
    }
    let mut mk = e2fs("mke2fs");
    mk.args(["-F", "-q"])
        .args(spec.mkfs_args())
        .args(["-N", &est.inodes.to_string()])
        .args(["-U", FIXED_UUID])
        .args(["-E", &format!("hash_seed={FIXED_HASH_SEED}")])
        .arg("-d")
        .arg(src)
        .arg(out)
        .arg(format!("{}k", est.bytes / 1024));
    run_ok(&mut mk, &[0]).context(|| format!("{}: mke2fs", spec.name))?;

    if spec.dir_index {
        if spec.hash != DirHash::HalfMd4 {
            let mut t = e2fs("tune2fs");
            t.args(["-E", &format!("hash_alg={}", spec.hash.tune2fs_name())])
                .arg(out);
            run_ok(&mut t, &[0]).context(|| format!("{}: tune2fs", spec.name))?;
        }
        if let Some(sign) = spec.hash_sign {
            debugfs_run(out, true, true, &format!("ssv flags {}\n", sign.s_flags()))
                .context(|| format!("{}: set s_flags", spec.name))?;
        }
        // -D: rebuild (index) every directory with the default hash.
        let mut fsck = e2fs("e2fsck");
        fsck.args(["-fyD"]).arg(out);
        run_ok(&mut fsck, &[0, 1]).context(|| format!("{}: e2fsck -fyD (building htrees)", spec.name))?;
    }

    let map = image_inode_map(out).context(|| format!("{}: listing inodes", spec.name))?;
    restore_times(spec, src, out, &map).context(|| format!("{}: restoring timestamps", spec.name))?;

    if spec.dir_index {
        for dir in &est.multi_block_dirs {
            let ino = map.get(dir).map(|e| e.ino).ok_or_else(|| {
                io::Error::other(format!(
                    "{}: /{} not found in the image",
                    spec.name,
                    String::from_utf8_lossy(dir)
                ))
            })?;
            let v = htree_hash_version(out, ino)?;
            match v {
                Some(v) if v == spec.hash.version() => {}
                Some(v) => {
                    return Err(io::Error::other(format!(
                        "{}: /{} is an htree with hash version {v}, wanted {}",
                        spec.name,
                        String::from_utf8_lossy(dir),
                        spec.hash.version()
                    )))
                }
                None => {
                    return Err(io::Error::other(format!(
                        "{}: /{} is not hash-indexed after e2fsck -D",
                        spec.name,
                        String::from_utf8_lossy(dir)
                    )))
                }
            }
        }
        if let Some(sign) = spec.hash_sign {
            let mut d = e2fs("dumpe2fs");
            d.arg("-h").arg(out);
            let o = run_ok(&mut d, &[0])?;
            let text = String::from_utf8_lossy(&o.stdout);
            let flags = text.lines().find(|l| l.starts_with("Filesystem flags:")).unwrap_or("");
            if !flags.split_whitespace().any(|w| w == sign.dumpe2fs_word()) {
                return Err(io::Error::other(format!(
                    "{}: superblock flags are `{flags}`, wanted {}",
                    spec.name,
                    sign.dumpe2fs_word()
                )));
            }
        }
    }
    e2fsck_clean(out).context(|| format!("{}: final check", spec.name))
}

/// `timeout 300 e2fsck -fn IMAGE` must exit 0; otherwise an error holding
/// its output. Why a timeout: some damaged images make e2fsck loop.
pub fn e2fsck_clean(image: &Path) -> io::Result<()> {
    let mut c = Command::new("timeout");
    c.args(["300", "e2fsck", "-fn"])
        .arg(image)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    let o = run(&mut c)?;
    if o.status.code() == Some(0) {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "e2fsck -fn {} is not clean ({}):\n{}{}",
            image.display(),
            o.status
                .code()
                .map_or_else(|| "killed".to_string(), |c| format!("exit {c}")),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )))
    }
}

/// Runs a debugfs command script (fed on stdin, echoed as "debugfs: CMD"
/// lines in the output) and returns stdout as bytes (names may not be
/// UTF-8). With `strict`, any error message from a command fails the call:
/// debugfs itself exits 0 whatever its commands did.
pub(crate) fn debugfs_run(image: &Path, write: bool, strict: bool, script: &str) -> io::Result<Vec<u8>> {
    let mut c = e2fs("debugfs");
    if write {
        c.arg("-w");
    }
    c.args(["-f", "-"])
        .arg(image)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let desc = describe(&c);
    let mut child = c.spawn().context(|| format!("cannot run `{desc}`"))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("debugfs: no stdin pipe"))?;
    let script_owned = script.to_string();
    // Feed stdin from a thread: the script can be larger than a pipe.
    let feeder = std::thread::spawn(move || stdin.write_all(script_owned.as_bytes()));
    let out = child.wait_with_output().context(|| format!("waiting for `{desc}`"))?;
    feeder
        .join()
        .map_err(|_| io::Error::other("debugfs stdin feeder panicked"))?
        .context(|| format!("writing script to `{desc}`"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("debugfs ") && !l.trim().is_empty())
        .collect();
    if !out.status.success() || (strict && !errors.is_empty()) {
        return Err(io::Error::other(format!(
            "`{desc}` reported errors:\n{}",
            errors.join("\n")
        )));
    }
    Ok(out.stdout)
}

/// One path of an image, per `debugfs ls -p`.
struct ImageEntry {
    ino: u32,
    /// i_size, for regular files.
    size: Option<u64>,
}

/// Maps every path of the image (relative, as bytes; "" is the root) to
/// its inode number, by `debugfs ls -p` on each directory by inode number
/// (so no name ever needs quoting).
fn image_inode_map(image: &Path) -> io::Result<BTreeMap<Vec<u8>, ImageEntry>> {
    let mut map = BTreeMap::new();
    map.insert(Vec::new(), ImageEntry { ino: 2, size: None });
    let mut level: Vec<(Vec<u8>, u32)> = vec![(Vec::new(), 2)];
    while !level.is_empty() {
        let mut script = String::new();
        for (_, ino) in &level {
            script.push_str(&format!("ls -p <{ino}>\n"));
        }
        let out = debugfs_run(image, false, true, &script)?;
        // Sections are introduced by the echoed command "debugfs: ls -p <N>".
        let mut next = Vec::new();
        let mut cur: Option<usize> = None;
        let mut idx = 0usize;
        for line in out.split(|&c| c == b'\n') {
            if line.starts_with(b"debugfs: ls -p") {
                cur = Some(idx);
                idx += 1;
                continue;
            }
            let Some(i) = cur else { continue };
            let Some((parent, _)) = level.get(i) else {
                continue;
            };
            if !line.starts_with(b"/") {
                continue;
            }
            let f: Vec<&[u8]> = line.split(|&c| c == b'/').collect();
            if f.len() != 8 {
                return Err(io::Error::other(format!(
                    "cannot parse debugfs ls -p line {:?}",
                    String::from_utf8_lossy(line)
                )));
            }
            let name = f[5];
            // Empty slots (inode 0, empty name) are listed too: skip them.
            if name.is_empty() || name == b"." || name == b".." || f[1] == b"0" {
                continue;
            }
            let ino: u32 = std::str::from_utf8(f[1])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| io::Error::other("bad inode number in debugfs ls -p"))?;
            let is_dir = f[2].starts_with(b"04");
            let mut rel = parent.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name);
            if is_dir {
                next.push((rel.clone(), ino));
            }
            let size = if f[2].starts_with(b"10") {
                std::str::from_utf8(f[6]).ok().and_then(|s| s.parse().ok())
            } else {
                None
            };
            map.insert(rel, ImageEntry { ino, size });
        }
        level = next;
    }
    Ok(map)
}

/// Sets every inode's atime/mtime to the source's (full precision where the
/// inode has room) and its ctime to [`FIXED_TIME`]; repairs i_size where
/// mke2fs got it wrong.
fn restore_times(spec: &ImageSpec, src: &Path, out: &Path, map: &BTreeMap<Vec<u8>, ImageEntry>) -> io::Result<()> {
    let extra = spec.inode_size > 128;
    let mut script = String::new();
    let mut done = std::collections::BTreeSet::new();
    for (rel, entry) in map {
        let ino = &entry.ino;
        if rel.as_slice() == b"lost+found" {
            continue;
        }
        let p = join_bytes(src, rel);
        let md = match fs::symlink_metadata(&p) {
            Ok(md) => md,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::other(format!(
                    "/{} is in the image but not in the source",
                    String::from_utf8_lossy(rel)
                )))
            }
            Err(e) => return Err(e).context(|| format!("stat {}", p.display())),
        };
        if !done.insert(*ino) {
            continue;
        }
        // mke2fs 1.47.0 -d with inline_data drops trailing holes from
        // i_size (a 16 MiB file with 4 KiB of data becomes 4 KiB long);
        // a larger i_size over unallocated blocks is valid, so set it back.
        if let Some(size) = entry.size {
            if md.is_file() && size != md.len() {
                script.push_str(&format!("sif <{ino}> size 0x{:x}\n", md.len()));
            }
        }
        let (sec, nsec) = (md.mtime(), md.mtime_nsec());
        let lo = sec as u32;
        let epoch = ((sec - i64::from(sec as i32)) >> 32) as u32 & 3;
        let xtra = epoch | ((nsec as u32) << 2);
        for f in ["mtime", "atime"] {
            script.push_str(&format!("sif <{ino}> {f}_lo 0x{lo:08x}\n"));
            if extra {
                script.push_str(&format!("sif <{ino}> {f}_extra 0x{xtra:08x}\n"));
            }
        }
        script.push_str(&format!("sif <{ino}> ctime_lo 0x{:08x}\n", FIXED_TIME as u32));
        if extra {
            script.push_str(&format!("sif <{ino}> ctime_extra 0\n"));
        }
    }
    debugfs_run(out, true, true, &script).map(|_| ())
}

/// The hash version of the htree root of directory inode `ino`, or None if
/// it is not hash-indexed.
fn htree_hash_version(image: &Path, ino: u32) -> io::Result<Option<u8>> {
    // Not strict: on filesystems without metadata_csum htree_dump complains
    // on stderr that blocks have no checksum tail.
    let out = debugfs_run(image, false, false, &format!("htree_dump <{ino}>\n"))?;
    let text = String::from_utf8_lossy(&out);
    for line in text.lines() {
        if let Some(v) = line.trim().strip_prefix("Hash Version:") {
            return v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| io::Error::other(format!("bad htree_dump line {line:?}")));
        }
    }
    Ok(None)
}

/// Extracts the whole image with `debugfs -R "rdump / DEST"` into `dest`
/// (created if missing). Why: the only reader for images the kernel cannot
/// mount (64 KiB blocks). rdump restores mode, owner and mtime (seconds
/// only), not hard links, xattrs or symlink times; compare with
/// [`compare_rdump`].
pub fn debugfs_rdump(image: &Path, dest: &Path) -> io::Result<()> {
    fs::create_dir_all(dest).context(|| format!("mkdir {}", dest.display()))?;
    let mut c = e2fs("debugfs");
    c.arg("-R").arg(format!("rdump / \"{}\"", dest.display())).arg(image);
    let o = run_ok(&mut c, &[0])?;
    let stderr = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("debugfs ") && !l.trim().is_empty())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "debugfs rdump of {} reported:\n{}",
            image.display(),
            errors.join("\n")
        )))
    }
}

/// Compares a `debugfs rdump` extraction (see [`debugfs_rdump`]) with the
/// source tree, holding it only to what rdump can restore. debugfs 1.47.0
/// rdump: skips fifos, sockets and device nodes; clears setuid, setgid and
/// sticky bits; does not chown symlinks; restores mtimes as unsigned 32-bit
/// seconds (pre-1970 and post-2106 times wrap, no nanoseconds); does not
/// restore hard links, xattrs or the root's attributes.
pub fn compare_rdump(src: &Path, dest: &Path) -> io::Result<Vec<crate::Difference>> {
    use crate::DiffKind;
    let opts = CompareOpts {
        ignore_lost_found: true,
        ignore_root_attrs: true,
        xattrs: false,
        hard_links: false,
        times: TimeFidelity::Seconds,
        symlink_times: false,
        ..CompareOpts::default()
    };
    let diffs = compare_trees(src, dest, &opts)?;
    let mut kept = Vec::new();
    for d in diffs {
        let p = join_bytes(src, &d.path);
        let md = fs::symlink_metadata(&p).ok();
        let ft = md.as_ref().map(|m| m.file_type());
        let tolerated = match &d.kind {
            DiffKind::Missing => ft.is_some_and(|t| !t.is_file() && !t.is_dir() && !t.is_symlink()),
            DiffKind::Mode { expected, actual } => expected & 0o777 == *actual,
            DiffKind::Owner { .. } => ft.is_some_and(|t| t.is_symlink()),
            DiffKind::Mtime { expected, actual } => i64::from(expected.0 as u32) == actual.0,
            _ => false,
        };
        if !tolerated {
            kept.push(d);
        }
    }
    Ok(kept)
}

/// Why the kernel oracle cannot be used here (not root, no loop device,
/// mount refused). Tests that get this should print it and skip loudly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelUnavailable {
    /// Human-readable reason.
    pub reason: String,
}

impl std::fmt::Display for KernelUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel loop mount unavailable: {}", self.reason)
    }
}

impl std::error::Error for KernelUnavailable {}

fn unavailable(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, KernelUnavailable { reason: reason.into() })
}

/// If `err` means "the kernel oracle is unavailable here", the reason.
pub fn is_kernel_unavailable(err: &io::Error) -> Option<&KernelUnavailable> {
    err.get_ref().and_then(|e| e.downcast_ref::<KernelUnavailable>())
}

/// Checks the preconditions of loop mounting: root and a loop device.
/// Returns the [`KernelUnavailable`] error otherwise.
pub fn kernel_available() -> io::Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Err(unavailable("not running as root"));
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err(unavailable("/dev/loop-control does not exist (no loop driver)"));
    }
    Ok(())
}

/// A kernel loop mount that is unmounted when dropped, so a failing test
/// does not leave mounts behind.
#[derive(Debug)]
pub struct LoopMount {
    dir: PathBuf,
    mounted: bool,
}

impl LoopMount {
    /// `mount -t FSTYPE -o loop[,ro] IMAGE DIR` (DIR is created if
    /// missing). Use fstype "ext4" for ext2/ext3 images too: the ext2
    /// driver ignores nanoseconds and the extra timestamp bits.
    pub fn mount(image: &Path, dir: &Path, fstype: &str, read_only: bool) -> io::Result<Self> {
        Self::mount_with(image, dir, fstype, if read_only { "ro" } else { "rw" })
    }

    /// `mount -t FSTYPE -o loop,OPTIONS IMAGE DIR` (DIR is created if
    /// missing): [`LoopMount::mount`] with any mount options, e.g.
    /// `ro,noload` or `commit=60,data=journal`.
    pub fn mount_with(image: &Path, dir: &Path, fstype: &str, options: &str) -> io::Result<Self> {
        kernel_available()?;
        fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        let mut c = Command::new("mount");
        c.args(["-t", fstype, "-o", &format!("loop,{options}")])
            .arg(image)
            .arg(dir)
            .stdin(Stdio::null());
        let o = run(&mut c)?;
        if !o.status.success() {
            let msg = String::from_utf8_lossy(&o.stderr).trim().to_string();
            if msg.contains("loop device") || msg.contains("permission denied") {
                return Err(unavailable(format!("{}: {msg}", describe(&c))));
            }
            return Err(io::Error::other(format!("`{}` failed: {msg}", describe(&c))));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            mounted: true,
        })
    }

    /// `fuse2fs -o ro IMAGE DIR`: e2fsprogs' own user-space reader, the
    /// independent oracle for images this kernel cannot mount (64 KiB
    /// blocks). fuse2fs 1.47.0 reports whole-second times only.
    pub fn fuse2fs(image: &Path, dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        let mut c = Command::new("fuse2fs");
        c.arg("-o").arg("ro").arg(image).arg(dir).stdin(Stdio::null());
        let o = match c.output() {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(unavailable("fuse2fs is not installed (apt-get install fuse2fs)"))
            }
            Err(e) => return Err(e).context(|| format!("cannot run `{}`", describe(&c))),
        };
        if !o.status.success() {
            return Err(unavailable(format!(
                "`{}` failed: {}",
                describe(&c),
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            mounted: true,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Unmounts, reporting failure (Drop can only try).
    ///
    /// "target is busy" can be transient when tests run in parallel (a
    /// child process of another test briefly holding the mount, the loop
    /// device's final flush), so it is retried for up to ten seconds; on
    /// failure the mount stays recorded and Drop tries again (lazily).
    pub fn unmount(mut self) -> io::Result<()> {
        let mut last = None;
        for attempt in 0..100 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let mut c = Command::new("umount");
            c.arg(&self.dir).stdin(Stdio::null());
            match run_ok(&mut c, &[0]) {
                Ok(_) => {
                    self.mounted = false;
                    return Ok(());
                }
                Err(e) if e.to_string().contains("busy") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("umount kept failing")))
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .stdin(Stdio::null())
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&self.dir)
                    .stdin(Stdio::null())
                    .output();
            }
        }
    }
}

/// Makes `out` the way the kernel writes: `mke2fs` of an empty image with
/// `mkfs_args` (default type ext4; inode count and size from the tree
/// unless given), loop mount, `cp -a SRC/. MNT/`, unmount, `e2fsck -fn`.
///
/// Errors with [`KernelUnavailable`] (check with [`is_kernel_unavailable`])
/// when not root or loop mounts are impossible, so tests can skip loudly.
pub fn make_kernel_image(src: &Path, out: &Path, mkfs_args: &[&str]) -> io::Result<()> {
    kernel_available()?;
    let bs = mkfs_args
        .iter()
        .position(|a| *a == "-b")
        .and_then(|i| mkfs_args.get(i + 1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(4096);
    let isz = mkfs_args
        .iter()
        .position(|a| *a == "-I")
        .and_then(|i| mkfs_args.get(i + 1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(256);
    let est = estimate(src, bs, isz)?;
    match fs::remove_file(out) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(|| format!("remove old {}", out.display())),
    }
    let mut mk = Command::new("mke2fs");
    mk.args(["-F", "-q"]).env("LC_ALL", "C").stdin(Stdio::null());
    if !mkfs_args.contains(&"-t") {
        mk.args(["-t", "ext4"]);
    }
    if !mkfs_args.contains(&"-N") && !mkfs_args.contains(&"-i") {
        mk.args(["-N", &est.inodes.to_string()]);
    }
    if !mkfs_args.contains(&"-U") {
        mk.args(["-U", FIXED_UUID]);
    }
    mk.args(mkfs_args).arg(out).arg(format!("{}k", est.bytes / 1024));
    run_ok(&mut mk, &[0]).context(|| "kernel image: mke2fs".to_string())?;

    let mnt = PathBuf::from(format!("{}.mnt", out.display()));
    let m = LoopMount::mount(out, &mnt, "ext4", false)?;
    let mut src_dot = src.as_os_str().to_os_string();
    src_dot.push("/.");
    let mut cp = Command::new("cp");
    cp.arg("-a").arg(&src_dot).arg(m.path()).stdin(Stdio::null());
    let copied = run_ok(&mut cp, &[0]);
    let unmounted = m.unmount();
    let _ = fs::remove_dir(&mnt);
    copied.context(|| "kernel image: cp -a".to_string())?;
    unmounted.context(|| "kernel image: umount".to_string())?;
    e2fsck_clean(out)
}
