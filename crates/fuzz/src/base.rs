//! Base images: small, feature-diverse filesystems made by `mke2fs -d`
//! from a generated source tree, cached on disk.
//!
//! Mutating images made by the reference tool (rather than synthesising
//! bytes) means every structure the engine parses is present and valid
//! before the mutator touches it, so each mutation tests one broken rule
//! deep inside an otherwise well-formed filesystem. The variants cover the
//! parsers that differ between them: indirect maps vs extent trees, linear
//! vs htree directories (one two-level), 1/2/4/64 KiB blocks, 128/256-byte
//! inodes, inline data, and with/without `metadata_csum`.
//!
//! Images are cached under [`bases_dir`], keyed by [`BASES_VERSION`] and the
//! `mke2fs` version, so a seed names the same bytes on every run of one
//! machine. `mke2fs` copies host ctimes and readdir order, so different
//! machines may build different bytes: use `ext4kit-fuzz-images --save`
//! to hand a failing image to someone else.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use crate::map::StructureMap;
use crate::prng::Rng;

/// Bump when the tree, the variants or the mke2fs options change: old
/// caches are then ignored (and a seed's meaning changes with it).
pub const BASES_VERSION: &str = "v1";

/// What to put in the source tree besides the fixed core (see
/// [`build_source_tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeOpts {
    /// Entries in `/big` (empty files and hard links): enough to need
    /// several directory blocks, so `e2fsck -D` turns it into an htree.
    pub big_dir_entries: usize,
    /// Hard links in `/hlinks` to one file: many directory entries without
    /// spending inodes, to reach a two-level htree on 1 KiB blocks.
    pub hard_link_entries: usize,
    /// Extra regular files spread over `/many/dNN` (concurrent-reader image).
    pub many_files: usize,
    /// Largest size of a `many_files` file.
    pub many_file_max: usize,
}

impl TreeOpts {
    /// The tree of the fuzzing bases.
    pub const FUZZ: TreeOpts = TreeOpts { big_dir_entries: 400, hard_link_entries: 0, many_files: 0, many_file_max: 0 };
}

/// One base-image variant.
#[derive(Debug, Clone)]
pub struct BaseSpec {
    /// Short name, used in file names and reports.
    pub name: &'static str,
    /// Arguments to `mke2fs` (besides `-d`, the image and the size).
    pub mkfs_args: &'static [&'static str],
    /// Image size in MiB.
    pub size_mib: u64,
    /// Whether the image has `dir_index`, so `e2fsck -fyD` should index the
    /// big directories.
    pub dir_index: bool,
    /// Source tree options.
    pub tree: TreeOpts,
}

/// The fuzzing bases, in the order seeds rotate through them.
pub fn base_specs() -> Vec<BaseSpec> {
    let t = TreeOpts::FUZZ;
    vec![
        BaseSpec {
            name: "ext2-1k",
            mkfs_args: &["-t", "ext2", "-b", "1024", "-I", "128", "-O", "^dir_index"],
            size_mib: 8,
            dir_index: false,
            tree: t,
        },
        BaseSpec {
            name: "ext3-2k",
            mkfs_args: &["-t", "ext3", "-b", "2048", "-I", "256"],
            size_mib: 8,
            dir_index: true,
            tree: t,
        },
        BaseSpec {
            name: "ext4-4k-csum",
            mkfs_args: &["-t", "ext4", "-b", "4096", "-I", "256"],
            size_mib: 8,
            dir_index: true,
            tree: t,
        },
        BaseSpec {
            name: "ext4-1k-nocsum",
            mkfs_args: &["-t", "ext4", "-b", "1024", "-I", "256", "-O", "^metadata_csum"],
            size_mib: 8,
            dir_index: true,
            tree: TreeOpts { hard_link_entries: 3000, ..t },
        },
        BaseSpec {
            name: "ext4-4k-indirect",
            mkfs_args: &["-t", "ext4", "-b", "4096", "-I", "256", "-O", "^extent,^64bit"],
            size_mib: 8,
            dir_index: true,
            tree: t,
        },
        BaseSpec {
            name: "ext4-4k-inline",
            mkfs_args: &["-t", "ext4", "-b", "4096", "-I", "256", "-O", "inline_data"],
            size_mib: 8,
            dir_index: true,
            tree: t,
        },
        BaseSpec {
            name: "ext4-64k",
            mkfs_args: &["-t", "ext4", "-b", "65536", "-I", "256", "-O", "^has_journal"],
            // Every non-empty file takes a whole 64 KiB block.
            size_mib: 32,
            dir_index: true,
            tree: t,
        },
    ]
}

/// The image the concurrent-reader test uses: a few thousand files, a
/// 2,000-entry htree directory, 4 KiB blocks, default ext4 features.
pub fn readers_spec() -> BaseSpec {
    BaseSpec {
        name: "readers-ext4",
        mkfs_args: &["-t", "ext4", "-b", "4096", "-I", "256", "-N", "8192"],
        size_mib: 96,
        dir_index: true,
        tree: TreeOpts { big_dir_entries: 2000, hard_link_entries: 0, many_files: 2500, many_file_max: 40_000 },
    }
}

/// A base image in memory with the map of where its structures are.
#[derive(Debug, Clone)]
pub struct BaseImage {
    /// The variant.
    pub spec: BaseSpec,
    /// The clean image.
    pub bytes: Arc<Vec<u8>>,
    /// Where its structures are (computed from the clean bytes).
    pub map: StructureMap,
    /// The cached file.
    pub path: PathBuf,
}

/// Why base images could not be had.
#[derive(Debug)]
pub struct BaseError(pub String);

impl std::fmt::Display for BaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BaseError {}

fn err(msg: impl Into<String>) -> BaseError {
    BaseError(msg.into())
}

/// Check that e2fsprogs is installed and return `mke2fs`'s version line.
/// The error says what is missing and how to install it: tests must fail
/// loudly rather than pass without having fuzzed anything.
pub fn check_tools() -> Result<String, BaseError> {
    let mut version = String::new();
    for tool in ["mke2fs", "e2fsck"] {
        let out = Command::new(tool).arg("-V").output().map_err(|e| {
            err(format!(
                "{tool} is not available ({e}); the hostile-image tests build their base images with e2fsprogs: \
                 install it (apt-get install -y e2fsprogs)"
            ))
        })?;
        if tool == "mke2fs" {
            let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            version = text.lines().next().unwrap_or("unknown").trim().to_string();
        }
    }
    Ok(version)
}

/// Where cached bases live: `$EXT4KIT_FUZZ_BASES`, else
/// `target/fuzz-bases/<version>-<mke2fs version>` in the workspace.
pub fn bases_dir() -> Result<PathBuf, BaseError> {
    let mk = check_tools()?;
    let tag: String = mk.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    let root = match std::env::var_os("EXT4KIT_FUZZ_BASES") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-bases"),
    };
    Ok(root.join(format!("{BASES_VERSION}-{tag}")))
}

/// All fuzzing bases, built on first use and shared by the whole process.
pub fn bases() -> Result<&'static [BaseImage], BaseError> {
    static BASES: OnceLock<Result<Vec<BaseImage>, String>> = OnceLock::new();
    BASES
        .get_or_init(|| base_specs().iter().map(|s| load_or_build(s).map_err(|e| e.0)).collect())
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| BaseError(e.clone()))
}

/// The base called `name`.
pub fn base_named(name: &str) -> Result<&'static BaseImage, BaseError> {
    let all = bases()?;
    all.iter().find(|b| b.spec.name == name).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|b| b.spec.name).collect();
        err(format!("no base named {name:?} (have: {})", names.join(", ")))
    })
}

/// Load `spec`'s image from the cache, building it first if needed.
pub fn load_or_build(spec: &BaseSpec) -> Result<BaseImage, BaseError> {
    let dir = bases_dir()?;
    fs::create_dir_all(&dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
    let path = dir.join(format!("{}.img", spec.name));
    if !path.exists() {
        build_image(spec, &dir, &path)?;
    }
    let bytes = fs::read(&path).map_err(|e| err(format!("reading {}: {e}", path.display())))?;
    let map = StructureMap::build(&bytes).map_err(|e| err(format!("mapping base {}: {e}", spec.name)))?;
    Ok(BaseImage { spec: spec.clone(), bytes: Arc::new(bytes), map, path })
}

/// Build one image: source tree, `mke2fs -d`, `e2fsck -fyD` (indexes big
/// directories), then `e2fsck -fn` must be clean. Written under a private
/// name and renamed, so concurrent builders never see half an image.
fn build_image(spec: &BaseSpec, dir: &Path, out: &Path) -> Result<(), BaseError> {
    let uniq = format!("{}.{}.{:?}", spec.name, std::process::id(), std::thread::current().id());
    let uniq: String = uniq.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-').collect();
    let src = dir.join(format!("src.{uniq}"));
    let tmp = dir.join(format!("{uniq}.img.tmp"));
    let _ = fs::remove_dir_all(&src);
    build_source_tree(&src, &spec.tree).map_err(|e| err(format!("building the source tree for {}: {e}", spec.name)))?;
    let _ = fs::remove_file(&tmp);
    let mut args: Vec<String> = ["-q", "-F", "-o", "Linux"].iter().map(|s| s.to_string()).collect();
    if !spec.mkfs_args.contains(&"-N") {
        // Enough inodes for the tree on every block size (64 KiB blocks
        // would otherwise get very few).
        args.extend(["-N".to_string(), "1024".to_string()]);
    }
    args.extend(spec.mkfs_args.iter().map(|s| s.to_string()));
    args.extend([
        "-U".into(),
        "6b1f3a40-2c8e-4e7a-9d51-0f2a7c3e5b11".into(),
        "-E".into(),
        "hash_seed=0b7e8a9c-3d2f-4a61-8e5b-9c4d2f1a0e37,root_owner=0:0".into(),
        "-d".into(),
        src.display().to_string(),
        tmp.display().to_string(),
        format!("{}M", spec.size_mib),
    ]);
    let made = make_fs(spec, &args, &tmp);
    let _ = fs::remove_dir_all(&src);
    if let Err(e) = made {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, out).map_err(|e| err(format!("renaming {} to {}: {e}", tmp.display(), out.display())))
}

/// `mke2fs`, then `e2fsck -fyD` (indexes big directories) where the image
/// has dir_index, then `e2fsck -fn` must be clean.
fn make_fs(spec: &BaseSpec, args: &[String], tmp: &Path) -> Result<(), BaseError> {
    run("mke2fs", args, &[0])?;
    if spec.dir_index {
        run("e2fsck", &["-fyD".to_string(), tmp.display().to_string()], &[0, 1])?;
    }
    run("e2fsck", &["-fn".to_string(), tmp.display().to_string()], &[0])
        .map_err(|e| err(format!("base {} is not e2fsck-clean: {e}", spec.name)))?;
    Ok(())
}

/// Run an e2fsprogs tool under `timeout` (a corrupt image can make e2fsck
/// loop) and accept the listed exit codes.
fn run(tool: &str, args: &[String], ok: &[i32]) -> Result<(), BaseError> {
    let out = Command::new("timeout")
        .arg("300")
        .arg(tool)
        .args(args)
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .output()
        .map_err(|e| err(format!("running {tool}: {e}")))?;
    let code = out.status.code().unwrap_or(-1);
    if ok.contains(&code) {
        Ok(())
    } else {
        Err(err(format!(
            "{tool} {} exited {code}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// Fixed timestamp for every source file (2023-11-14).
const FIXED_TIME: i64 = 1_700_000_000;

/// Build the source tree at `root`.
///
/// The core holds one of everything the read path treats specially: empty,
/// small, medium (past the double-indirect boundary on 1 KiB blocks) and
/// sparse files (data at 0, 1 MiB, 70 MiB and 5 GiB, so indirect maps
/// reach the triple-indirect level), nested directories, a big directory,
/// fast, slow, dangling, looping and directory symlinks, a hard link,
/// a file of twelve separate runs (an extent tree with an index level),
/// in-inode and block xattrs, a POSIX ACL, a FIFO and tiny files (inline
/// on `inline_data` images).
pub fn build_source_tree(root: &Path, opts: &TreeOpts) -> io::Result<()> {
    let mut rng = Rng::new(0x7EE5);
    fs::create_dir_all(root)?;
    let w = |rel: &str, data: &[u8]| fs::write(root.join(rel), data);
    w("empty", b"")?;
    w("small.txt", b"hello, ext4kit\n")?;
    let mut medium = vec![0u8; 300 * 1024 + 123];
    rng.fill(&mut medium);
    w("medium.bin", &medium)?;
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(root.join("sparse.bin"))?;
        for (i, off) in [0u64, 1 << 20, 70 << 20, 5 << 30].into_iter().enumerate() {
            let mut chunk = vec![0u8; 4096];
            rng.fill(&mut chunk);
            chunk[0] = b'A' + i as u8;
            f.write_all_at(&chunk, off)?;
        }
        f.set_len((5 << 30) + 8192 + 17)?;
    }
    {
        // Twelve separate runs: more extents than the inode's root holds,
        // so the extent tree gets an index level.
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(root.join("fragmented.bin"))?;
        for i in 0..12u64 {
            let mut chunk = vec![0u8; 3000];
            rng.fill(&mut chunk);
            f.write_all_at(&chunk, i * (256 << 10))?;
        }
    }
    fs::create_dir_all(root.join("dir/a/b/c/d"))?;
    w("dir/a/b/c/d/deep.txt", b"deep\n")?;
    for i in 0..6 {
        let mut d = vec![0u8; 700 * i + 5];
        rng.fill(&mut d);
        w(&format!("dir/a/file{i}"), &d)?;
    }
    fs::hard_link(root.join("small.txt"), root.join("dir/hardlink"))?;
    // Tiny files and a tiny directory: inline on inline_data images.
    fs::create_dir_all(root.join("inline/sub"))?;
    for i in 0..5 {
        w(&format!("inline/tiny{i}"), &b"0123456789abcdef0123456789abcdef0123456789abcdef"[..i * 11])?;
    }
    w("inline/sub/x", b"x")?;
    // Symlinks.
    fs::create_dir_all(root.join("links"))?;
    symlink("../small.txt", root.join("links/fast"))?;
    let slow = format!("../dir/{}a/b/c/d/deep.txt", "./".repeat(80));
    symlink(&slow, root.join("links/slow"))?;
    symlink("nowhere/at/all", root.join("links/dangling"))?;
    symlink("loop2", root.join("links/loop1"))?;
    symlink("loop1", root.join("links/loop2"))?;
    symlink("../dir/a", root.join("links/dirlink"))?;
    symlink("/links/fast", root.join("links/absolute"))?;
    // Extended attributes: small ones fit in a 256-byte inode, the big one
    // needs an xattr block.
    w("xattr-small", b"x")?;
    setxattr(&root.join("xattr-small"), "user.small", b"v")?;
    setxattr(&root.join("xattr-small"), "user.two", b"22")?;
    w("xattr-big", b"y")?;
    let mut big = vec![0u8; 700];
    rng.fill(&mut big);
    setxattr(&root.join("xattr-big"), "user.big", &big)?;
    setxattr(&root.join("xattr-big"), "user.tag", b"t")?;
    setxattr(&root.join("dir"), "user.on-a-dir", b"dir value")?;
    w("acl-file", b"acl")?;
    // A POSIX ACL (Linux xattr form: version 2, then tag/perm/id entries);
    // mke2fs stores it in ext4's compact form. Skipped where the host
    // filesystem refuses ACLs (the rest of the tree is unaffected).
    let acl: Vec<u8> = [
        2u32.to_le_bytes().to_vec(),
        acl_entry(1, 6, u32::MAX),
        acl_entry(2, 4, 1000),
        acl_entry(4, 4, u32::MAX),
        acl_entry(0x10, 4, u32::MAX),
        acl_entry(0x20, 4, u32::MAX),
    ]
    .concat();
    let _ = setxattr(&root.join("acl-file"), "system.posix_acl_access", &acl);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .map_err(io::Error::from)?;
    // The big directory: names of varied length, mostly empty files, some
    // hard links.
    fs::create_dir_all(root.join("big"))?;
    for i in 0..opts.big_dir_entries {
        let name = format!("entry-{i:05}-{}", "n".repeat(i % 37));
        if i % 5 == 4 {
            fs::hard_link(root.join("small.txt"), root.join("big").join(&name))?;
        } else {
            w(&format!("big/{name}"), if i % 3 == 0 { b"" } else { b"e" })?;
        }
    }
    if opts.hard_link_entries > 0 {
        fs::create_dir_all(root.join("hlinks"))?;
        for i in 0..opts.hard_link_entries {
            fs::hard_link(
                root.join("dir/a/file1"),
                root.join(format!("hlinks/link-number-{i:06}-with-a-longish-name")),
            )?;
        }
    }
    for i in 0..opts.many_files {
        let d = root.join(format!("many/d{:02}", i % 40));
        fs::create_dir_all(&d)?;
        let len = rng.index(opts.many_file_max.max(1));
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let p = d.join(format!("f{i:05}"));
        fs::write(&p, &data)?;
        if i % 7 == 0 {
            setxattr(&p, "user.n", format!("{i}").as_bytes())?;
        }
        if i % 11 == 0 {
            symlink(format!("f{i:05}"), d.join(format!("l{i:05}")))?;
        }
    }
    set_times(root)
}

fn acl_entry(tag: u16, perm: u16, id: u32) -> Vec<u8> {
    [tag.to_le_bytes().as_slice(), &perm.to_le_bytes(), &id.to_le_bytes()].concat()
}

fn setxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    rustix::fs::lsetxattr(p, name, value, rustix::fs::XattrFlags::empty()).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("setxattr {name} on {}: {e} (the host filesystem must support user xattrs)", p.display()),
        )
    })
}

/// Give every file the same atime/mtime so images differ less between
/// builds (mke2fs copies them).
fn set_times(root: &Path) -> io::Result<()> {
    use rustix::fs::{AtFlags, Timespec, Timestamps};
    let ts = Timestamps {
        last_access: Timespec { tv_sec: FIXED_TIME, tv_nsec: 0 },
        last_modification: Timespec { tv_sec: FIXED_TIME, tv_nsec: 0 },
    };
    let mut stack = vec![root.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            }
            all.push(e.path());
        }
    }
    all.push(root.to_path_buf());
    for p in all {
        rustix::fs::utimensat(rustix::fs::CWD, &p, &ts, AtFlags::SYMLINK_NOFOLLOW).map_err(io::Error::from)?;
    }
    Ok(())
}
