//! The deterministic source tree every fixture image is built from.
//!
//! The tree packs, into a few hundred paths plus one big directory, every
//! kind of object and every boundary the on-disk format treats specially:
//! block-boundary sizes, holes, indirect-map depths, fast/slow symlinks,
//! in-inode and external xattrs, ACLs, device numbers in old and new
//! encodings, timestamps outside 1970..2038 and with nanoseconds, 32-bit
//! owners, hard links across directories and an htree-sized directory.
//! The same `TreeOpts` always produce the same bytes, names and metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, Timespec, Timestamps, XattrFlags, CWD};

use crate::rng::TestRng;
use crate::util::{fnv1a, join_bytes, Context};

/// Shape of the generated tree. The defaults are the full fixture (what the
/// image matrix and the user-facing check script use); [`TreeOpts::small`]
/// is the same tree with a smaller big directory and no 5 GiB file, for
/// quick unit tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeOpts {
    /// Seed of every random name and byte in the tree.
    pub seed: u64,
    /// Number of (empty) files in `bigdir/`, the directory that must become
    /// an htree in dir_index images.
    pub big_dir_entries: usize,
    /// Adds `sparse/huge-5g`: 5 GiB apparent size, a few KiB of data at
    /// both ends (exercises 64-bit sizes, triple-indirect maps, large_file).
    pub huge_sparse: bool,
    /// Size of `sizes/large`, the "few MiB" file; the default crosses the
    /// double-indirect boundary for every block size up to 4 KiB.
    pub large_file_bytes: u64,
    /// Create what only root may: other owners (chown), device nodes,
    /// `trusted.*`/`security.*` xattrs. Defaults to "running as root".
    pub privileged: bool,
}

impl Default for TreeOpts {
    fn default() -> Self {
        Self {
            seed: 0x6578_7434_6b69_7400,
            big_dir_entries: 50_000,
            huge_sparse: true,
            large_file_bytes: 5 * 1024 * 1024 + 4321,
            privileged: rustix::process::geteuid().is_root(),
        }
    }
}

impl TreeOpts {
    /// The quick variant: 2,000 entries in the big directory (still several
    /// blocks, so still an htree) and no 5 GiB sparse file.
    pub fn small() -> Self {
        Self {
            big_dir_entries: 2_000,
            huge_sparse: false,
            ..Self::default()
        }
    }
}

/// What was built, for sizing images and for tests that want to poke at
/// specific objects without hard-coding the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeManifest {
    /// The root directory the tree was built in.
    pub root: PathBuf,
    /// Number of paths below the root (every name counts, hard links too).
    pub entries: u64,
    /// Number of distinct inodes, root included.
    pub inodes: u64,
    /// Bytes of actual file data (holes excluded).
    pub data_bytes: u64,
    /// Sum of regular file sizes (holes included).
    pub apparent_bytes: u64,
    /// Relative path of the big directory.
    pub big_dir: PathBuf,
    /// Relative paths of the one file that has three names.
    pub hard_link_group: Vec<PathBuf>,
    /// Relative paths of every symlink, with the target length.
    pub symlinks: Vec<(PathBuf, usize)>,
    /// Relative paths of the sparse files.
    pub sparse_files: Vec<PathBuf>,
    /// Whether the privileged objects (owners, devices, trusted xattrs) exist.
    pub privileged: bool,
}

/// Pre-1970 mtime used in `times/` (seconds).
pub const PRE_1970_SECS: i64 = -1_000_000_000;
/// Post-2038 mtime used in `times/` (seconds).
pub const POST_2038_SECS: i64 = 3_000_000_000;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Builds the fixture tree at `root` (which must not exist, or be an empty
/// directory) and returns what it built.
///
/// Why a library function and not a checked-in tarball: the tree holds a
/// 5 GiB sparse file, device nodes and foreign owners, none of which
/// survive git; building it takes seconds.
pub fn build_source_tree(root: &Path, opts: &TreeOpts) -> io::Result<TreeManifest> {
    match fs::read_dir(root) {
        Ok(mut it) => {
            if it.next().is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: tree root exists and is not empty", root.display()),
                ));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(root).context(|| format!("mkdir {}", root.display()))?;
        }
        Err(e) => return Err(e).context(|| format!("reading {}", root.display())),
    }
    let mut b = Builder {
        root,
        opts,
        times: BTreeMap::new(),
        dir_modes: BTreeMap::new(),
        symlinks: Vec::new(),
        sparse: Vec::new(),
        hard_link_group: Vec::new(),
    };
    b.build()?;
    b.finish_metadata()?;
    let (entries, inodes, data_bytes, apparent_bytes) = census(root)?;
    Ok(TreeManifest {
        root: root.to_path_buf(),
        entries,
        inodes,
        data_bytes,
        apparent_bytes,
        big_dir: PathBuf::from("bigdir"),
        hard_link_group: b.hard_link_group,
        symlinks: b.symlinks,
        sparse_files: b.sparse,
        privileged: opts.privileged,
    })
}

struct Builder<'a> {
    root: &'a Path,
    opts: &'a TreeOpts,
    /// Explicit mtimes (seconds, nanoseconds); everything else gets a
    /// per-path pseudo-random one in the final pass.
    times: BTreeMap<Vec<u8>, (i64, u32)>,
    /// Directory modes, applied at the end so a read-only directory can
    /// still be filled first.
    dir_modes: BTreeMap<Vec<u8>, u32>,
    symlinks: Vec<(PathBuf, usize)>,
    sparse: Vec<PathBuf>,
    hard_link_group: Vec<PathBuf>,
}

fn rel_path(rel: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(rel))
}

impl Builder<'_> {
    fn p(&self, rel: &[u8]) -> PathBuf {
        join_bytes(self.root, rel)
    }

    fn dir(&mut self, rel: &[u8], mode: u32) -> io::Result<()> {
        let p = self.p(rel);
        fs::create_dir(&p).context(|| format!("mkdir {}", p.display()))?;
        self.dir_modes.insert(rel.to_vec(), mode);
        Ok(())
    }

    fn file(&mut self, rel: &[u8], data: &[u8], mode: u32) -> io::Result<()> {
        let p = self.p(rel);
        let mut f = File::create(&p).context(|| format!("create {}", p.display()))?;
        f.write_all(data).context(|| format!("write {}", p.display()))?;
        drop(f);
        chmod(&p, mode)
    }

    fn random_file(&mut self, rel: &[u8], len: u64, mode: u32) -> io::Result<()> {
        let p = self.p(rel);
        let mut rng = TestRng::for_label(self.opts.seed, &String::from_utf8_lossy(rel));
        let mut f = File::create(&p).context(|| format!("create {}", p.display()))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill(&mut buf[..n]);
            f.write_all(&buf[..n]).context(|| format!("write {}", p.display()))?;
            left -= n as u64;
        }
        drop(f);
        chmod(&p, mode)
    }

    /// A sparse file: random data at each `(offset, len)`, holes elsewhere,
    /// final size `size`.
    fn sparse_file(&mut self, rel: &[u8], chunks: &[(u64, u64)], size: u64) -> io::Result<()> {
        let p = self.p(rel);
        let mut rng = TestRng::for_label(self.opts.seed, &String::from_utf8_lossy(rel));
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .context(|| format!("create {}", p.display()))?;
        for &(off, len) in chunks {
            let mut buf = vec![0u8; len as usize];
            rng.fill(&mut buf);
            f.write_all_at(&buf, off)
                .context(|| format!("write {} at {off}", p.display()))?;
        }
        f.set_len(size)
            .context(|| format!("truncate {} to {size}", p.display()))?;
        drop(f);
        chmod(&p, 0o644)?;
        self.sparse.push(rel_path(rel));
        Ok(())
    }

    fn symlink(&mut self, rel: &[u8], target: &[u8]) -> io::Result<()> {
        let p = self.p(rel);
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &p)
            .context(|| format!("symlink {}", p.display()))?;
        self.symlinks.push((rel_path(rel), target.len()));
        Ok(())
    }

    fn hard_link(&mut self, existing: &[u8], new: &[u8]) -> io::Result<()> {
        let (a, b) = (self.p(existing), self.p(new));
        fs::hard_link(&a, &b).context(|| format!("link {} -> {}", b.display(), a.display()))
    }

    fn node(&mut self, rel: &[u8], ft: FileType, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        let p = self.p(rel);
        rustix::fs::mknodat(
            CWD,
            &p,
            ft,
            Mode::from_raw_mode(mode),
            rustix::fs::makedev(major, minor),
        )
        .context(|| format!("mknod {}", p.display()))?;
        chmod(&p, mode)
    }

    fn owner(&mut self, rel: &[u8], uid: u32, gid: u32) -> io::Result<()> {
        if !self.opts.privileged {
            return Ok(());
        }
        let p = self.p(rel);
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).context(|| format!("chown {uid}:{gid} {}", p.display()))
    }

    fn xattr(&mut self, rel: &[u8], name: &str, value: &[u8]) -> io::Result<()> {
        let p = self.p(rel);
        rustix::fs::lsetxattr(&p, name, value, XattrFlags::empty())
            .context(|| format!("setxattr {name} on {}", p.display()))
    }

    fn time(&mut self, rel: &[u8], secs: i64, nsecs: u32) {
        self.times.insert(rel.to_vec(), (secs, nsecs));
    }

    fn build(&mut self) -> io::Result<()> {
        let priv_ = self.opts.privileged;

        // Nested directories, 6 levels, plus an empty directory at the bottom.
        self.dir(b"deep", 0o755)?;
        self.dir(b"deep/l1", 0o755)?;
        self.dir(b"deep/l1/l2", 0o750)?;
        self.dir(b"deep/l1/l2/l3", 0o755)?;
        self.dir(b"deep/l1/l2/l3/l4", 0o711)?;
        self.dir(b"deep/l1/l2/l3/l4/l5", 0o755)?;
        self.dir(b"deep/l1/l2/l3/l4/l5/empty-dir", 0o755)?;
        self.file(b"deep/l1/l2/l3/l4/l5/bottom.txt", b"at the bottom\n", 0o644)?;
        self.file(b"deep/l1/mid.txt", b"in the middle\n", 0o644)?;

        // Sizes: empty, tiny (inline_data candidates), block boundaries for
        // 1, 4 and 64 KiB blocks, and a multi-MiB file.
        self.dir(b"sizes", 0o755)?;
        self.file(b"sizes/empty", b"", 0o644)?;
        self.file(b"sizes/one-byte", b"x", 0o644)?;
        self.random_file(b"sizes/59", 59, 0o644)?;
        self.random_file(b"sizes/60", 60, 0o644)?;
        self.random_file(b"sizes/150", 150, 0o644)?;
        for n in [
            1023u64, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 12288, 65535, 65536, 65537,
        ] {
            self.random_file(format!("sizes/{n}").as_bytes(), n, 0o644)?;
        }
        // 1 KiB blocks: 12 direct + 256 single-indirect = 268 KiB; the next
        // byte needs the double-indirect block.
        self.random_file(b"sizes/268k-plus-1", 268 * KIB + 1, 0o644)?;
        self.random_file(b"sizes/large", self.opts.large_file_bytes, 0o644)?;
        // Blocks of zeros that are data, not holes: the reader must return
        // zeros whether the writer kept them or punched them out.
        {
            let mut rng = TestRng::for_label(self.opts.seed, "zero-blocks");
            let mut data = vec![0u8; 3 * 64 * 1024];
            rng.fill(&mut data[..64 * 1024]);
            rng.fill(&mut data[128 * 1024..]);
            self.file(b"sizes/zero-blocks", &data, 0o644)?;
        }

        // Sparse files.
        self.dir(b"sparse", 0o755)?;
        self.sparse_file(
            b"sparse/data-hole-data",
            &[(0, 8 * KIB), (64 * MIB, 8 * KIB)],
            64 * MIB + 8 * KIB,
        )?;
        self.sparse_file(b"sparse/hole-first", &[(MIB + 100, 5000)], MIB + 100 + 5000)?;
        self.sparse_file(b"sparse/hole-last", &[(0, 4 * KIB)], 16 * MIB)?;
        self.sparse_file(b"sparse/all-hole", &[], 10 * MIB + 1)?;
        // 24 separate extents: deeper than the 4 that fit in the inode.
        let chunks: Vec<(u64, u64)> = (0..24).map(|i| (i * MIB + 512, 3 * KIB)).collect();
        self.sparse_file(b"sparse/many-extents", &chunks, 24 * MIB)?;
        if self.opts.huge_sparse {
            let size = 5 * GIB + 3000;
            self.sparse_file(b"sparse/huge-5g", &[(0, 4 * KIB), (size - 6 * KIB, 6 * KIB)], size)?;
        }

        // Names.
        self.dir(b"names", 0o755)?;
        let mut long = b"long-name-".to_vec();
        while long.len() < 255 {
            long.push(b'a' + (long.len() % 26) as u8);
        }
        self.file(&[b"names/".as_slice(), &long].concat(), b"255 bytes\n", 0o644)?;
        // 85 three-byte characters: 255 bytes, 85 characters.
        let cjk: Vec<u8> = "日".repeat(85).into_bytes();
        self.file(&[b"names/".as_slice(), &cjk].concat(), b"255 bytes of CJK\n", 0o644)?;
        for (name, body) in [
            ("ünïcødé-file", "latin with diacritics\n"),
            ("日本語のファイル名", "japanese\n"),
            ("emoji-😀-🚀", "astral plane\n"),
            ("Ωmega-ωmega", "greek\n"),
            ("e\u{301}-combining", "combining acute\n"),
            ("with space", "space\n"),
            (".hidden", "dot file\n"),
            ("-dash-first", "dash\n"),
            ("colon:semi;quote'\"", "punctuation\n"),
            ("a", "one-char name\n"),
        ] {
            self.file(format!("names/{name}").as_bytes(), body.as_bytes(), 0o644)?;
        }
        // Not UTF-8: bytes >= 0x80 hash differently with signed and unsigned
        // char (s_flags signed/unsigned directory hash).
        self.file(b"names/raw-\x80\x81\xfe\xff", b"raw bytes\n", 0o644)?;
        self.file(b"names/latin1-caf\xe9", b"latin-1 e-acute\n", 0o644)?;
        self.dir("names/ディレクトリ".as_bytes(), 0o755)?;
        self.file("names/ディレクトリ/inside".as_bytes(), b"inside\n", 0o644)?;

        // Symlinks: fast (< 60 bytes, in i_block), the 59/60 boundary, slow
        // (a data block), dangling, to a directory, absolute, and a chain.
        self.dir(b"links", 0o755)?;
        self.symlink(b"links/fast", b"../sizes/one-byte")?;
        self.symlink(b"links/fast-59", &pattern_target(59))?;
        self.symlink(b"links/slow-60", &pattern_target(60))?;
        self.symlink(b"links/slow-200", &pattern_target(200))?;
        self.symlink(b"links/slow-1000", &pattern_target(1000))?;
        self.symlink(b"links/dangling", b"does/not/exist")?;
        self.symlink(b"links/to-dir", b"../deep/l1")?;
        self.symlink(b"links/absolute", b"/etc/hostname")?;
        self.symlink(b"links/chain", b"fast")?;
        self.symlink("links/ünï-target".as_bytes(), "../names/ünïcødé-file".as_bytes())?;

        // Hard links: one file with three names in three directories, and a
        // pair in one directory.
        self.dir(b"hard", 0o755)?;
        self.random_file(b"hard/three-names", 5000, 0o640)?;
        self.hard_link(b"hard/three-names", b"deep/l1/second-name")?;
        self.hard_link(b"hard/three-names", b"names/third-name")?;
        self.hard_link_group = vec![
            PathBuf::from("deep/l1/second-name"),
            PathBuf::from("hard/three-names"),
            PathBuf::from("names/third-name"),
        ];
        self.file(b"hard/pair-a", b"two names\n", 0o600)?;
        self.hard_link(b"hard/pair-a", b"hard/pair-b")?;

        // Extended attributes.
        self.dir(b"xattr", 0o755)?;
        self.file(b"xattr/small", b"small xattrs\n", 0o644)?;
        self.xattr(b"xattr/small", "user.a", b"1")?;
        self.xattr(b"xattr/small", "user.empty", b"")?;
        self.xattr(b"xattr/small", "user.mime_type", b"text/plain")?;
        // 900 bytes cannot fit in a 256-byte inode, so it goes to an external
        // xattr block; it still fits in a 1 KiB block (mke2fs -d fails on a
        // value larger than a block without ea_inode).
        self.file(b"xattr/big", b"one big xattr\n", 0o644)?;
        let mut big = vec![0u8; 900];
        TestRng::for_label(self.opts.seed, "xattr-big").fill(&mut big);
        self.xattr(b"xattr/big", "user.big", &big)?;
        // Small in the inode and a larger one beside it.
        self.file(b"xattr/mixed", b"mixed\n", 0o644)?;
        self.xattr(b"xattr/mixed", "user.tiny", b"t")?;
        self.xattr(b"xattr/mixed", "user.medium", &[b'm'; 400])?;
        self.file(b"xattr/many", b"many\n", 0o644)?;
        for i in 0..12 {
            self.xattr(
                b"xattr/many",
                &format!("user.attr-{i:02}"),
                format!("value number {i}").as_bytes(),
            )?;
        }
        self.xattr(b"xattr", "user.on-a-directory", b"dir value")?;
        // POSIX ACLs (stored by ext4 in its own compact format, returned to
        // user space in the xattr format).
        self.file(b"xattr/acl-file", b"acl\n", 0o640)?;
        self.xattr(
            b"xattr/acl-file",
            "system.posix_acl_access",
            &acl_value(&[
                (1, 6, None),
                (2, 4, Some(1000)),
                (4, 4, None),
                (0x10, 6, None),
                (0x20, 0, None),
            ]),
        )?;
        self.dir(b"xattr/acl-dir", 0o750)?;
        let dflt = acl_value(&[
            (1, 7, None),
            (4, 5, None),
            (8, 7, Some(2000)),
            (0x10, 7, None),
            (0x20, 0, None),
        ]);
        self.xattr(b"xattr/acl-dir", "system.posix_acl_default", &dflt)?;
        // Created after the default ACL: inherits an access ACL (and, being
        // created by File::create with 0666, a mode the ACL decides).
        {
            let p = self.p(b"xattr/acl-dir/inherited");
            File::create(&p).context(|| format!("create {}", p.display()))?;
        }
        if priv_ {
            self.file(b"xattr/trusted", b"trusted\n", 0o644)?;
            self.xattr(b"xattr/trusted", "trusted.ext4kit", b"trusted value")?;
            self.xattr(b"xattr/trusted", "security.ext4kit", b"security value")?;
            self.symlink(b"xattr/link-with-xattr", b"trusted")?;
            self.xattr(b"xattr/link-with-xattr", "trusted.on-symlink", b"yes")?;
        }

        // Special files.
        self.dir(b"special", 0o755)?;
        self.node(b"special/fifo", FileType::Fifo, 0o620, 0, 0)?;
        self.node(b"special/socket", FileType::Socket, 0o755, 0, 0)?;
        if priv_ {
            self.node(b"special/char-1-3", FileType::CharacterDevice, 0o666, 1, 3)?;
            self.node(b"special/block-7-200", FileType::BlockDevice, 0o660, 7, 200)?;
            // Major > 255 / minor > 255 need the "new" encoding in i_block[1].
            self.node(b"special/char-300-70000", FileType::CharacterDevice, 0o600, 300, 70000)?;
            self.node(b"special/block-259-0", FileType::BlockDevice, 0o600, 259, 0)?;
        }

        // Modes.
        self.dir(b"modes", 0o755)?;
        for (name, mode) in [
            ("setuid", 0o4755),
            ("setgid", 0o2755),
            ("setuid-setgid", 0o6711),
            ("sticky-file", 0o1644),
            ("all-bits", 0o7777),
            ("none", 0o000),
            ("world-writable", 0o666),
            ("odd", 0o517),
            ("exec-only", 0o111),
        ] {
            self.file(format!("modes/{name}").as_bytes(), name.as_bytes(), mode)?;
        }
        self.dir(b"modes/sticky-dir", 0o1777)?;
        self.file(b"modes/sticky-dir/f", b"f\n", 0o644)?;
        self.dir(b"modes/setgid-dir", 0o2775)?;
        self.dir(b"modes/read-only-dir", 0o555)?;
        self.file(b"modes/read-only-dir/f", b"f\n", 0o444)?;
        self.dir(b"modes/private-dir", 0o700)?;

        // Owners (uids and gids beyond 16 bits need the high halves).
        self.dir(b"owners", 0o755)?;
        for (name, uid, gid) in [
            ("u1000", 1000, 1000),
            ("nobody", 65534, 65534),
            ("u0-g5000", 0, 5000),
            ("big-ids", 100_000, 200_000),
            ("huge-ids", 4_000_000_000, 3_999_999_999),
        ] {
            self.file(format!("owners/{name}").as_bytes(), name.as_bytes(), 0o644)?;
            self.owner(format!("owners/{name}").as_bytes(), uid, gid)?;
        }
        // chown clears setuid: set the mode again afterwards.
        self.file(b"owners/setuid-1000", b"setuid\n", 0o4750)?;
        self.owner(b"owners/setuid-1000", 1000, 1000)?;
        chmod(&self.p(b"owners/setuid-1000"), 0o4750)?;
        self.dir(b"owners/dir-1234", 0o755)?;
        self.owner(b"owners/dir-1234", 1234, 4321)?;
        self.symlink(b"owners/link-2000", b"u1000")?;
        self.owner(b"owners/link-2000", 2000, 3000)?;

        // Timestamps.
        self.dir(b"times", 0o755)?;
        for (name, s, ns) in [
            ("nanoseconds", 1_234_567_890i64, 123_456_789u32),
            ("pre-1970", PRE_1970_SECS, 250_000_000),
            ("post-2038", POST_2038_SECS, 999_999_999),
            ("epoch", 0, 0),
            ("minus-one", -1, 0),
            ("max-int32", i64::from(i32::MAX), 500_000_000),
            ("past-int32", i64::from(i32::MAX) + 1, 1),
            ("year-2200", 7_258_118_400, 42),
        ] {
            self.file(format!("times/{name}").as_bytes(), name.as_bytes(), 0o644)?;
            self.time(format!("times/{name}").as_bytes(), s, ns);
        }
        self.dir(b"times/old-dir", 0o755)?;
        self.time(b"times/old-dir", PRE_1970_SECS, 1);
        self.symlink(b"times/link", b"epoch")?;
        self.time(b"times/link", 1_111_111_111, 111_111_111);

        // The big directory.
        self.big_dir()?;

        // Owners of the root are whoever runs this; give the root a fixed
        // mode and time like everything else.
        self.dir_modes.insert(Vec::new(), 0o755);
        Ok(())
    }

    fn big_dir(&mut self) -> io::Result<()> {
        self.dir(b"bigdir", 0o755)?;
        let mut rng = TestRng::for_label(self.opts.seed, "bigdir");
        let root = self.p(b"bigdir");
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_";
        for i in 0..self.opts.big_dir_entries {
            let mut name = format!("f{i:06}-").into_bytes();
            let extra = 13 + rng.below(21) as usize; // total 21..41 bytes
            for _ in 0..extra {
                name.push(ALNUM[rng.below(ALNUM.len() as u64) as usize]);
            }
            // Some names carry bytes >= 0x80 (valid UTF-8 and not), which
            // land in different hash buckets with signed and unsigned char.
            match i % 97 {
                13 => name.extend_from_slice("-é".as_bytes()),
                42 => name.extend_from_slice(b"-\xff\x80"),
                71 => name.extend_from_slice("-日本".as_bytes()),
                _ => {}
            }
            let p = root.join(std::ffi::OsStr::from_bytes(&name));
            File::create(&p).context(|| format!("create {}", p.display()))?;
        }
        Ok(())
    }

    /// Modes of directories and the mtimes of everything, last, so that no
    /// later creation disturbs a directory's mtime.
    fn finish_metadata(&mut self) -> io::Result<()> {
        let mut all = Vec::new();
        walk(self.root, Vec::new(), &mut all)?;
        // Non-directories first (sorted by path: deterministic for hard
        // links, the last name wins), then directories deepest first.
        let (dirs, others): (Vec<_>, Vec<_>) = all.into_iter().partition(|(_, is_dir)| *is_dir);
        for (rel, _) in &others {
            self.set_time(rel)?;
        }
        let mut dirs: Vec<Vec<u8>> = dirs.into_iter().map(|(r, _)| r).collect();
        dirs.push(Vec::new());
        dirs.sort_by_key(|r| std::cmp::Reverse(r.iter().filter(|&&c| c == b'/').count() + usize::from(!r.is_empty())));
        for rel in &dirs {
            if let Some(&mode) = self.dir_modes.get(rel) {
                chmod(&self.p(rel), mode)?;
            }
            self.set_time(rel)?;
        }
        Ok(())
    }

    fn set_time(&self, rel: &[u8]) -> io::Result<()> {
        let (s, ns) = self.times.get(rel).copied().unwrap_or_else(|| {
            let h = fnv1a(rel) ^ self.opts.seed;
            (
                1_400_000_000 + (h % 300_000_000) as i64,
                ((h >> 32) % 1_000_000_000) as u32,
            )
        });
        let ts = Timespec {
            tv_sec: s,
            tv_nsec: i64::from(ns),
        };
        let p = self.p(rel);
        rustix::fs::utimensat(
            CWD,
            &p,
            &Timestamps {
                last_access: ts,
                last_modification: ts,
            },
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .context(|| format!("utimensat {}", p.display()))
    }
}

fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).context(|| format!("chmod {mode:o} {}", p.display()))
}

/// A symlink target of exactly `len` bytes that looks like a path.
fn pattern_target(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut i = 0usize;
    while v.len() < len {
        if v.len() % 16 == 15 {
            v.push(b'/');
        } else {
            v.push(b'a' + (i % 26) as u8);
            i += 1;
        }
    }
    v
}

/// A `system.posix_acl_*` value in the user-space xattr format:
/// version 2, then (tag, perm, id) entries sorted by tag.
fn acl_value(entries: &[(u16, u16, Option<u32>)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.unwrap_or(u32::MAX).to_le_bytes());
    }
    v
}

/// Every path below `dir` (relative, as bytes) with "is a directory",
/// sorted by name at each level.
fn walk(dir: &Path, prefix: Vec<u8>, out: &mut Vec<(Vec<u8>, bool)>) -> io::Result<()> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).context(|| format!("readdir {}", dir.display()))? {
        let e = e.context(|| format!("readdir {}", dir.display()))?;
        let is_dir = e
            .file_type()
            .context(|| format!("stat {}", e.path().display()))?
            .is_dir();
        names.push((e.file_name().as_bytes().to_vec(), is_dir));
    }
    names.sort();
    for (name, is_dir) in names {
        let mut rel = prefix.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        out.push((rel.clone(), is_dir));
        if is_dir {
            walk(&dir.join(std::ffi::OsStr::from_bytes(&name)), rel, out)?;
        }
    }
    Ok(())
}

/// (entries, distinct inodes incl. root, data bytes, apparent bytes).
fn census(root: &Path) -> io::Result<(u64, u64, u64, u64)> {
    let mut all = Vec::new();
    walk(root, Vec::new(), &mut all)?;
    let mut inodes = BTreeSet::new();
    let (mut data, mut apparent) = (0u64, 0u64);
    let md = fs::symlink_metadata(root).context(|| format!("stat {}", root.display()))?;
    inodes.insert((md.dev(), md.ino()));
    for (rel, _) in &all {
        let p = join_bytes(root, rel);
        let md = fs::symlink_metadata(&p).context(|| format!("stat {}", p.display()))?;
        if inodes.insert((md.dev(), md.ino())) && md.file_type().is_file() {
            apparent += md.len();
            data += (md.blocks() * 512).min(md.len());
        }
    }
    Ok((all.len() as u64, inodes.len() as u64, data, apparent))
}
