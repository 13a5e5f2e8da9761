//! Images whose journal needs recovery, each with the oracles that say how
//! it must read (recovery compared with e2fsck's and the kernel's).
//!
//! A fixture is an image file with `needs_recovery` set and committed
//! transactions in its journal that its home locations do not hold yet, as
//! a VM snapshot, a disk from a machine that lost power, or a copy of a
//! mounted image has them. [`make_journal_fixture`] builds one per
//! [`JournalSpec`] ([`journal_specs`] is the set the tests use), written by
//! one of two independent writers:
//!
//! - **the kernel**: loop mount (`commit=60`, so only an fsync commits), one
//!   kind of operation, fsync, then `cp --sparse=always` of the image file
//!   *while still mounted*: the copy keeps `needs_recovery` and the old home
//!   locations (the kernel writes journaled metadata home only at a
//!   checkpoint or after the 30 s writeback expiry), then unmount;
//! - **debugfs' journal writer** (`jo` / `jw -b BLOCKS FILE` / `jw -r` /
//!   `jc`, how e2fsprogs' own `j_*` tests are made): the blocks in which a
//!   debugfs-edited copy differs from the base image are written into the
//!   base image's journal, as one transaction or several, with revokes, with
//!   an uncommitted one at the end, with journal checksums v1/v2/v3.
//!
//! Beside each image the maker leaves, in `DIR/NAME/`:
//!
//! - `oracle/`: the tree recovery must show. The image replayed by
//!   `e2fsck -E journal_only -y`, mounted read-only by the kernel and copied
//!   out with `cp -a` (names, modes, owners, sizes, contents, symlinks, hard
//!   links, xattrs, nanosecond times). The kernel's own replay (a read-write
//!   loop mount of another copy) is the second oracle: the two must agree,
//!   or the spec says why not ([`E2fsckReplay`]). A debugfs fixture also
//!   knows the image its transactions describe: the oracle must equal it.
//! - `unreplayed/`: the tree the home locations hold, as the kernel's
//!   `-o ro,noload` shows it (what `--no-replay` must show).
//! - `logdump.txt` (`debugfs -R 'logdump -a'`) and `notes.txt` (how it was
//!   made and the evidence that it is meaningful).
//!
//! Every fixture is checked to be *meaningful* before it is returned: the
//! oracle differs from the unreplayed tree (a reader that ignores the
//! journal fails), and the shape it claims is in the journal (the journal
//! features, revoke records whose blocks a later file really reuses, a
//! fast-commit area whose tags the replay really needs, a log that really
//! wraps, …). A kernel fixture whose copy was caught after a writeback
//! (another process's `sync`, say) is made again.
//!
//! Facts measured here (kernel 6.18, e2fsprogs 1.47.0), which the specs
//! encode:
//!
//! - `e2fsck -E journal_only -y` exits 0 after a successful replay (not 1),
//!   and also releases the orphan list (check_super_block runs before it
//!   stops).
//! - The first fsync after a mount is always a full commit (the fast-commit
//!   statistics count it "ineligible" with no reason given); later fsyncs of
//!   small changes are fast commits. An fsync of a directory after an unlink
//!   is a full commit; the unlink goes into a fast commit when a file is
//!   fsynced instead.
//! - e2fsck 1.47.0 (and e2fsprogs master as of this writing) replays a fast
//!   commit with the superblock and group descriptors it read *before* the
//!   full-commit replay and writes them back: when a full commit in the live
//!   log logged the superblock (the kernel does on the first file open after
//!   a mount, to record s_last_mounted, when the mount point's path fits in
//!   64 bytes: the fixtures mount at a short path), e2fsck ends with "Superblock
//!   checksum does not match" (exit 12) or loses the full commit's inodes,
//!   while the kernel's replay is clean. The fast-commit fixtures therefore
//!   checkpoint the mount's first full commit with `syncfs` first;
//!   `k-fc-after-full` keeps it and takes the kernel's replay as the oracle.
//! - e2fsck's replay of a fast-commit unlink (DEL_ENTRY) removes the name
//!   but leaves the inode allocated ("Unattached inode"); the kernel frees
//!   it. Same tree, so e2fsck's tree is still the oracle.
//! - e2fsck 1.47.0 `-E journal_only` on an image with orphan_file clears the
//!   orphaned inode but leaves its orphan-file entry, `orphan_present` and
//!   the free counts (a second run "clears" it again); the kernel's replay
//!   is clean. Same tree.
//! - A fast commit's dentry tag carries no directory inode: the kernel's
//!   replay sets the parent's mtime to the time of the replay, e2fsck's
//!   keeps the home value. Fast-commit fixtures do not compare directory
//!   mtimes.
//! - When the kernel checkpoints part of the log (the wrap-around fixture),
//!   the home locations mix blocks of different transactions: the kernel's
//!   `-o noload` view can fail to read an inode (EBADMSG), and the
//!   unreplayed tree is then partial (recorded in the fixture).
//! - A fast commit of an fsync on an unlinked, still open file makes the
//!   kernel refuse its own journal ("error loading journal") and e2fsck
//!   leave "deleted inode has zero dtime": no fixture, no oracle.
//! - With `data=journal` the kernel writes no revoke records at all (ext4_forget
//!   never revokes in that mode): freed blocks are only forgotten, and data
//!   reusing them is logged too.
//! - The kernel refuses `journal_async_commit` with `data=ordered`
//!   (writeback is used); without metadata_csum, `journal_checksum` gives
//!   the old v1 commit-block checksum.
//! - The journal has at least 1,024 blocks (mke2fs refuses less), so the
//!   wrap-around fixture uses 1 KiB blocks and `-J size=1`.
//! - debugfs reads command lines of at most 8 KiB from `-f`, so block lists
//!   are written as ranges; `jo -c` on a filesystem without metadata_csum
//!   sets the v1 checksum, `jo -c -v 2` csum v2 with it; an uncommitted
//!   transaction alone does not even set needs_recovery.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::compare::{compare_trees, CompareOpts, DiffKind, Difference};
use crate::image::{debugfs_run, e2fs, kernel_available, LoopMount, FIXED_HASH_SEED, FIXED_UUID};
use crate::rng::TestRng;
use crate::util::{describe, run, run_ok, Context};

/// One kind of operation the kernel performs on the mounted image before
/// the copy (all end with an fsync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelOp {
    /// New files (one small, one of several blocks) in two directories.
    Create,
    /// Remove a file in a subdirectory and a multi-block file at the root.
    Unlink,
    /// Rename across directories, within one, and over an existing file.
    Rename,
    /// Append new blocks to files.
    Append,
    /// Shrink a multi-block file and empty another.
    Truncate,
    /// chmod, chown and a directory's mode.
    Chmod,
    /// On a nearly full filesystem, delete a file and write a new one into
    /// its freed data blocks (ordered mode writes the new data home at
    /// once: the unreplayed view shows the old file with the new bytes).
    ReuseData,
    /// A directory's blocks, logged in one transaction, freed (revoked) in
    /// the next and reused for file data in a third: replaying the first
    /// transaction's copies without honouring the revoke destroys the data.
    ReuseMeta,
    /// 3,000 files in six directories, one transaction per directory.
    Many,
    /// mkdir of a new tree, rmdir of an empty directory.
    MkdirRmdir,
    /// Hard links within and across directories.
    HardLink,
    /// A fast (in-inode) and a slow (block) symlink.
    Symlink,
    /// Set an in-inode xattr, a large one (external block), remove one.
    Xattr,
    /// Create, append, unlink, rename, chmod, link, symlink, xattr, mkdir
    /// in one transaction.
    Mixed,
    /// An open file is unlinked: the transaction adds it to the orphan list
    /// (or orphan file); recovery must free it.
    Orphan,
    /// Many small transactions on a 1,024-block journal until the live log
    /// wraps past the journal's end.
    Wrap,
    /// Fast commit of a new file (CREAT_DENTRY, ADD_RANGE, INODE).
    FcCreate,
    /// Fast commit of an append that allocates blocks (ADD_RANGE).
    FcAppend,
    /// Fast commit of an unlink (DEL_ENTRY), carried by a file's fsync.
    FcUnlink,
    /// Fast commit of a rename across directories (ADD_ENTRY, DEL_ENTRY).
    FcRename,
    /// Fast commit of a hard link (ADD_ENTRY).
    FcLink,
    /// A full commit and a fast commit after it, both in the live log.
    FcAfterFull,
}

impl KernelOp {
    /// How many blocks to leave free when the fixture fills the filesystem
    /// first (see [`KernelOp::ReuseData`]).
    fn fills(self) -> Option<u64> {
        match self {
            // The deleted file's 16 blocks plus 4: the new file must reuse.
            KernelOp::ReuseData => Some(4),
            // Room for the directory's ~5 blocks, which the file reuses.
            KernelOp::ReuseMeta => Some(16),
            _ => None,
        }
    }

    /// Fast-commit tags `debugfs logdump -a` must show.
    fn fc_tags(self) -> &'static [&'static str] {
        match self {
            KernelOp::FcCreate => &["CREAT_DENTRY", "ADD_RANGE", "INODE"],
            KernelOp::FcAppend => &["ADD_RANGE", "INODE"],
            KernelOp::FcUnlink => &["DEL_ENTRY"],
            KernelOp::FcRename => &["ADD_ENTRY", "DEL_ENTRY"],
            KernelOp::FcLink => &["ADD_ENTRY"],
            KernelOp::FcAfterFull => &["CREAT_DENTRY"],
            _ => &[],
        }
    }
}

/// The journal shapes made with debugfs' journal writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugfsShape {
    /// One short transaction (`j_short_trans`): a handful of metadata
    /// blocks and a data block that starts with the jbd2 magic (escaped).
    Short,
    /// One transaction of thousands of blocks (`j_long_trans`): several
    /// descriptor blocks.
    Long,
    /// Blocks written in transaction 1, revoked in 2, one of them written
    /// again in 3 (`j_short_revoke_trans`): the revoked copy must not be
    /// replayed, the later one must.
    Revoke,
    /// A committed transaction followed by one without a commit block
    /// (`j_short_uncommitted_trans`): only the first is replayed.
    Uncommitted,
    /// Four committed transactions rewriting the same blocks (bitmaps, the
    /// root directory): the last copy of each block wins.
    Sequence,
}

/// Who writes a fixture's journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The kernel, mounted with `commit=60` plus `mount_opts`.
    Kernel {
        /// What it does before the copy.
        op: KernelOp,
        /// Extra mount options ("" or e.g. "data=journal").
        mount_opts: &'static str,
    },
    /// debugfs' journal writer.
    Debugfs {
        /// The transactions written.
        shape: DebugfsShape,
        /// The journal-open command: `jo`, `jo -c` (checksums: v3 with
        /// metadata_csum, v1 without), `jo -c -v 2`.
        open: &'static str,
    },
}

/// How far e2fsck's own replay of a fixture can be trusted (measured; see
/// the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E2fsckReplay {
    /// e2fsck's replay is `e2fsck -fn` clean and reads as the kernel's: it
    /// is the oracle.
    Exact,
    /// e2fsck's replay reads as the kernel's, but (unlike the kernel's) is
    /// not `e2fsck -fn` clean; the tree is still the oracle.
    SameTreeUnclean(&'static str),
    /// e2fsck's replay reads differently from the kernel's (clean) replay,
    /// which is the oracle.
    Wrong(&'static str),
}

/// One journal fixture: how to make it and what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSpec {
    /// Short unique name (the fixture's directory).
    pub name: &'static str,
    /// What it covers.
    pub description: &'static str,
    /// mke2fs arguments (type, block size, features, journal size).
    pub mkfs: &'static [&'static str],
    /// Image size in MiB.
    pub size_mib: u64,
    /// Who writes the journal.
    pub writer: Writer,
    /// Words `dumpe2fs -h`'s "Journal features:" line must contain on the
    /// fixture (proves the recipe made the format it claims).
    pub journal_features: &'static [&'static str],
    /// What e2fsck's replay of it is worth.
    pub e2fsck: E2fsckReplay,
    /// Whether directory mtimes are compared. Not for fast commits: a
    /// dentry tag carries no directory inode, and the kernel's replay sets
    /// the parent's mtime to the time of the replay while e2fsck's keeps the
    /// home value, so no reader can be held to one value.
    pub dir_times: bool,
}

impl JournalSpec {
    /// How trees of this fixture are compared: everything (see
    /// [`journal_compare_opts`]), less directory mtimes where
    /// [`JournalSpec::dir_times`] says so.
    pub fn compare_opts(&self) -> CompareOpts {
        CompareOpts {
            dir_times: self.dir_times,
            ..journal_compare_opts()
        }
    }
}

/// A made fixture (see the module documentation for the layout).
#[derive(Debug, Clone)]
pub struct JournalFixture {
    /// The spec's name.
    pub name: String,
    /// The spec's description.
    pub description: String,
    /// The image whose journal needs recovery. Tests must not change it:
    /// they work on copies or check it is unchanged.
    pub image: PathBuf,
    /// The recovered tree.
    pub oracle: PathBuf,
    /// The tree at the home locations (kernel `-o ro,noload`).
    pub unreplayed: PathBuf,
    /// Errors `cp -a` met copying the unreplayed view (entries the kernel
    /// could not read without the journal), if any.
    pub unreplayed_errors: Option<String>,
    /// What e2fsck's replay was worth here.
    pub e2fsck: E2fsckReplay,
    /// How the fixture was confirmed meaningful (also in `notes.txt`).
    pub evidence: Vec<String>,
    /// How to compare a reader's tree with `oracle` and `unreplayed`.
    pub compare: CompareOpts,
}

/// The comparison the journal tests use: everything (names, types, modes,
/// owners, sizes, contents, symlinks, hard links, xattrs, nanosecond
/// mtimes, the root's attributes, lost+found).
pub fn journal_compare_opts() -> CompareOpts {
    CompareOpts::default()
}

const EXT4_4K: &[&str] = &["-t", "ext4", "-b", "4096"];

/// The fixture set: kernel-written images over operation kinds, mount
/// options and formats, fast commits, and debugfs-written journals in
/// e2fsprogs' shapes.
pub fn journal_specs() -> Vec<JournalSpec> {
    let k = |name, description, op, mount_opts| JournalSpec {
        name,
        description,
        mkfs: EXT4_4K,
        size_mib: 64,
        writer: Writer::Kernel { op, mount_opts },
        journal_features: &["journal_64bit", "journal_checksum_v3"],
        e2fsck: E2fsckReplay::Exact,
        dir_times: true,
    };
    let fc = |name, description, op| JournalSpec {
        mkfs: &["-t", "ext4", "-b", "4096", "-O", "fast_commit"],
        // dumpe2fs 1.47.0 has no name for the fast-commit bit (0x20).
        journal_features: &["journal_checksum_v3", "FEATURE_I5"],
        dir_times: false,
        ..k(name, description, op, "")
    };
    let d = |name, description, mkfs, shape, open, journal_features| JournalSpec {
        name,
        description,
        mkfs,
        size_mib: 64,
        writer: Writer::Debugfs { shape, open },
        journal_features,
        e2fsck: E2fsckReplay::Exact,
        dir_times: true,
    };
    use DebugfsShape as S;
    use KernelOp as K;
    vec![
        // ext4 defaults (metadata_csum: journal csum v3, 64-bit tags).
        k("k-create", "kernel, ext4: create files", K::Create, ""),
        k("k-unlink", "kernel, ext4: unlink files", K::Unlink, ""),
        k(
            "k-rename",
            "kernel, ext4: renames (across, within, over a file)",
            K::Rename,
            "",
        ),
        k("k-append", "kernel, ext4: append new blocks", K::Append, ""),
        k("k-truncate", "kernel, ext4: truncate down", K::Truncate, ""),
        k("k-chmod", "kernel, ext4: chmod, chown", K::Chmod, ""),
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-m", "0"],
            ..k(
                "k-reuse-data",
                "kernel, ext4: a deleted file's data blocks reused by a new file",
                K::ReuseData,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-m", "0"],
            ..k(
                "k-revoke",
                "kernel, ext4: directory blocks revoked and reused as file data",
                K::ReuseMeta,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-J", "size=16"],
            size_mib: 96,
            ..k("k-many", "kernel, ext4: 3,000 files in six transactions", K::Many, "")
        },
        k("k-mkdir-rmdir", "kernel, ext4: mkdir and rmdir", K::MkdirRmdir, ""),
        k("k-link", "kernel, ext4: hard links", K::HardLink, ""),
        k("k-symlink", "kernel, ext4: fast and slow symlinks", K::Symlink, ""),
        k(
            "k-xattr",
            "kernel, ext4: xattrs set (in-inode, block) and removed",
            K::Xattr,
            "",
        ),
        k(
            "k-orphan",
            "kernel, ext4: an open file unlinked (orphan list)",
            K::Orphan,
            "",
        ),
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-O", "orphan_file"],
            e2fsck: E2fsckReplay::SameTreeUnclean(
                "e2fsck 1.47.0 -E journal_only clears the orphaned inode but leaves its orphan-file entry, \
                 orphan_present and the free counts (a second run clears it again); the kernel's replay is clean",
            ),
            ..k(
                "k-orphan-file",
                "kernel, ext4 with orphan_file: an open file unlinked",
                K::Orphan,
                "",
            )
        },
        // Mount options.
        k(
            "k-dj-mixed",
            "kernel, data=journal: mixed operations (file data in the journal)",
            K::Mixed,
            "data=journal",
        ),
        k("k-dj-append", "kernel, data=journal: append", K::Append, "data=journal"),
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-m", "0"],
            ..k(
                "k-dj-reuse-data",
                "kernel, data=journal: a deleted file's blocks reused (no revoke records: the new data is logged too)",
                K::ReuseData,
                "data=journal",
            )
        },
        JournalSpec {
            journal_features: &["journal_64bit", "journal_checksum_v3", "journal_async_commit"],
            ..k(
                "k-async-commit",
                "kernel, ext4, journal_async_commit (data=writeback): mixed operations",
                K::Mixed,
                "journal_async_commit,data=writeback",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
            journal_features: &["journal_64bit", "journal_checksum"],
            ..k(
                "k-csum-v1",
                "kernel, ext4 without metadata_csum, journal_checksum: v1 commit checksums",
                K::Mixed,
                "journal_checksum",
            )
        },
        // Formats.
        JournalSpec {
            mkfs: &["-t", "ext3", "-b", "4096"],
            journal_features: &[],
            ..k(
                "k-ext3-mixed",
                "kernel, ext3: mixed operations (indirect maps, no csum)",
                K::Mixed,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext3", "-b", "4096", "-m", "0"],
            // ext3 files have no extents: the filler is written, not
            // fallocated, so keep the image small.
            size_mib: 32,
            journal_features: &[],
            ..k(
                "k-ext3-revoke",
                "kernel, ext3: directory blocks revoked and reused",
                K::ReuseMeta,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "1024"],
            ..k(
                "k-1k-mixed",
                "kernel, ext4 1 KiB blocks: mixed operations",
                K::Mixed,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "1024", "-J", "size=16"],
            size_mib: 96,
            ..k("k-1k-many", "kernel, ext4 1 KiB blocks: 3,000 files", K::Many, "")
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-O", "^64bit"],
            journal_features: &["journal_checksum_v3"],
            ..k(
                "k-32bit",
                "kernel, ext4 without 64bit (csum v3): mixed operations",
                K::Mixed,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "4096", "-O", "^64bit,^metadata_csum"],
            journal_features: &[],
            ..k(
                "k-32bit-nocsum",
                "kernel, ext4 without 64bit or metadata_csum (8-byte tags, no checksums)",
                K::Mixed,
                "",
            )
        },
        JournalSpec {
            mkfs: &["-t", "ext4", "-b", "1024", "-J", "size=1"],
            size_mib: 32,
            ..k(
                "k-wrap",
                "kernel, ext4 1 KiB blocks, 1,024-block journal: the live log wraps",
                K::Wrap,
                "",
            )
        },
        // Fast commits.
        fc("k-fc-create", "kernel, fast commit: create", K::FcCreate),
        fc("k-fc-append", "kernel, fast commit: append", K::FcAppend),
        JournalSpec {
            e2fsck: E2fsckReplay::SameTreeUnclean(
                "e2fsck 1.47.0 replays DEL_ENTRY without freeing the inode (Unattached inode); the kernel frees it",
            ),
            ..fc("k-fc-unlink", "kernel, fast commit: unlink", K::FcUnlink)
        },
        fc("k-fc-rename", "kernel, fast commit: rename", K::FcRename),
        fc("k-fc-link", "kernel, fast commit: hard link", K::FcLink),
        JournalSpec {
            e2fsck: E2fsckReplay::Wrong(
                "e2fsck 1.47.0 replays the fast commit with the superblock (and group descriptors) it read before \
                 the full-commit replay and writes them back over the full commit's copy: the superblock checksum \
                 is left wrong and e2fsck exits 12, or the full commit's new inode is lost",
            ),
            ..fc(
                "k-fc-after-full",
                "kernel, fast commit after a full commit in the same live log",
                K::FcAfterFull,
            )
        },
        // debugfs' journal writer, e2fsprogs' j_* shapes.
        d(
            "dbg-short",
            "debugfs: one short transaction (32-bit, no checksum; an escaped block)",
            &["-t", "ext4", "-b", "4096", "-O", "^64bit,^metadata_csum"],
            S::Short,
            "jo",
            &[],
        ),
        d(
            "dbg-short-64bit",
            "debugfs: one short transaction, 64-bit tags, no checksum",
            &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
            S::Short,
            "jo",
            &["journal_64bit"],
        ),
        d(
            "dbg-short-csum3-64bit",
            "debugfs: one short transaction, csum v3, 64-bit",
            EXT4_4K,
            S::Short,
            "jo -c",
            &["journal_64bit", "journal_checksum_v3"],
        ),
        d(
            "dbg-short-csum2-32bit",
            "debugfs: one short transaction, csum v2, 32-bit",
            &["-t", "ext4", "-b", "4096", "-O", "^64bit"],
            S::Short,
            "jo -c -v 2",
            &["journal_checksum_v2"],
        ),
        d(
            "dbg-short-csum1",
            "debugfs: one short transaction, old-style (v1) commit checksum",
            &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
            S::Short,
            "jo -c",
            &["journal_checksum"],
        ),
        d(
            "dbg-long-csum3-64bit",
            "debugfs: one long transaction (1 KiB blocks, several descriptor blocks), csum v3",
            &["-t", "ext4", "-b", "1024"],
            S::Long,
            "jo -c",
            &["journal_64bit", "journal_checksum_v3"],
        ),
        d(
            "dbg-long-32bit",
            "debugfs: one long transaction, 32-bit, no checksum",
            &["-t", "ext4", "-b", "1024", "-O", "^64bit,^metadata_csum"],
            S::Long,
            "jo",
            &[],
        ),
        d(
            "dbg-revoke",
            "debugfs: write, revoke, write again (32-bit, no checksum)",
            &["-t", "ext4", "-b", "4096", "-O", "^64bit,^metadata_csum"],
            S::Revoke,
            "jo",
            &["journal_incompat_revoke"],
        ),
        d(
            "dbg-revoke-csum3-64bit",
            "debugfs: write, revoke, write again (csum v3, 64-bit revoke records)",
            EXT4_4K,
            S::Revoke,
            "jo -c",
            &["journal_incompat_revoke", "journal_64bit", "journal_checksum_v3"],
        ),
        d(
            "dbg-uncommitted",
            "debugfs: a committed transaction, then one without a commit block",
            &["-t", "ext4", "-b", "4096", "-O", "^64bit,^metadata_csum"],
            S::Uncommitted,
            "jo",
            &[],
        ),
        d(
            "dbg-uncommitted-csum3-64bit",
            "debugfs: committed then uncommitted transactions, csum v3",
            EXT4_4K,
            S::Uncommitted,
            "jo -c",
            &["journal_64bit", "journal_checksum_v3"],
        ),
        d(
            "dbg-sequence",
            "debugfs: four transactions rewriting the same blocks, csum v3",
            EXT4_4K,
            S::Sequence,
            "jo -c",
            &["journal_64bit", "journal_checksum_v3"],
        ),
    ]
}

/// A fixture that proves nothing (its replayed tree equals its unreplayed
/// tree, or its journal lacks the shape it claims). For kernel fixtures the
/// usual cause is a writeback between the fsync and the copy (another
/// process's `sync`): [`make_journal_fixture`] tries again.
#[derive(Debug)]
struct NotMeaningful(String);

impl std::fmt::Display for NotMeaningful {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fixture is not meaningful: {}", self.0)
    }
}

impl std::error::Error for NotMeaningful {}

fn not_meaningful(why: impl Into<String>) -> io::Error {
    io::Error::other(NotMeaningful(why.into()))
}

fn is_not_meaningful(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<NotMeaningful>())
}

/// Makes the fixture `spec` in `parent/NAME/` (replacing an old one) and
/// returns it. Needs root and loop devices (the oracles are read with the
/// kernel); without them the error is [`crate::KernelUnavailable`].
pub fn make_journal_fixture(spec: &JournalSpec, parent: &Path) -> io::Result<JournalFixture> {
    kernel_available()?;
    let mut last = None;
    for attempt in 1..=3 {
        match make_once(spec, parent) {
            Err(e) if is_not_meaningful(&e) => {
                if !matches!(spec.writer, Writer::Kernel { .. }) {
                    return Err(e);
                }
                eprintln!("{}: attempt {attempt}: {e}; trying again", spec.name);
                last = Some(e);
            }
            r => return r,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

fn make_once(spec: &JournalSpec, parent: &Path) -> io::Result<JournalFixture> {
    let dir = parent.join(spec.name);
    remove_tree(&dir)?;
    let work = dir.join("work");
    fs::create_dir_all(&work).context(|| format!("mkdir {}", work.display()))?;
    let image = dir.join("image.img");
    let mut evidence = Vec::new();
    let t = Instant::now();
    let expected = match spec.writer {
        Writer::Kernel { op, mount_opts } => {
            make_kernel(spec, op, mount_opts, &work, &image, &mut evidence)?;
            None
        }
        Writer::Debugfs { shape, open } => Some(make_debugfs(spec, shape, open, &work, &image, &mut evidence)?),
    };
    let fixture = match finish(spec, &dir, &image, expected.as_deref(), evidence) {
        Ok(f) => f,
        // Kept as is: make_journal_fixture retries on it.
        Err(e) if is_not_meaningful(&e) => return Err(e),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("{} ({:.1}s): {e}", spec.name, t.elapsed().as_secs_f64()),
            ))
        }
    };
    remove_tree(&work)?;
    Ok(fixture)
}

// ---------------------------------------------------------------------------
// Common finishing: the oracles, the unreplayed view, meaningfulness.

fn finish(
    spec: &JournalSpec,
    dir: &Path,
    image: &Path,
    expected: Option<&Path>,
    mut evidence: Vec<String>,
) -> io::Result<JournalFixture> {
    let work = dir.join("work");
    let dump = dumpe2fs_header(image)?;
    let features = header_field(&dump, "Filesystem features:");
    if !features.split_whitespace().any(|w| w == "needs_recovery") {
        return Err(not_meaningful(format!(
            "the image does not need recovery (features: {features})"
        )));
    }
    let jfeatures = header_field(&dump, "Journal features:");
    for want in spec.journal_features {
        if !jfeatures.split_whitespace().any(|w| w == *want) {
            return Err(io::Error::other(format!(
                "journal features are `{jfeatures}`, the spec wants {want}"
            )));
        }
    }
    evidence.push(format!("journal features: {jfeatures}"));
    let log = logdump(image)?;
    fs::write(dir.join("logdump.txt"), &log)?;
    let summary = LogSummary::parse(&log);
    evidence.push(summary.describe());
    if summary.commits == 0 && summary.fc_tags.is_empty() {
        return Err(not_meaningful("logdump shows no committed transaction"));
    }

    // Oracle 1: e2fsck's replay. Where the spec knows it to be wrong, it
    // may also fail outright.
    let e_img = work.join("e2fsck-replayed.img");
    copy_sparse(image, &e_img)?;
    let rep = e2fsck_replay(&e_img)?;
    let e_tree = work.join("e2fsck-tree");
    let e_result: Result<Result<(), String>, String> = if rep.code != 0 {
        Err(format!(
            "e2fsck -E journal_only -y exited {}:\n{}",
            rep.code, rep.output
        ))
    } else {
        let clean = e2fsck_fn(&e_img)?;
        match kernel_tree(&e_img, &e_tree, "ro") {
            Ok(None) => Ok(clean),
            Ok(Some(err)) => Err(format!("cp -a of the e2fsck-replayed image met errors:\n{err}")),
            Err(e) => Err(format!("the kernel cannot mount e2fsck's replay: {e}")),
        }
    };

    // Oracle 2: the kernel's replay (read-write mount of a copy).
    let k_img = work.join("kernel-replayed.img");
    copy_sparse(image, &k_img)?;
    kernel_replay(&k_img, &work.join("mnt-replay"))?;
    if let Err(out) = e2fsck_fn(&k_img)? {
        return Err(io::Error::other(format!(
            "the kernel's replay is not e2fsck-clean:\n{out}"
        )));
    }
    let k_tree = work.join("kernel-tree");
    if let Some(err) = kernel_tree(&k_img, &k_tree, "ro")? {
        return Err(io::Error::other(format!(
            "cp -a of the kernel-replayed image met errors:\n{err}"
        )));
    }
    let opts = spec.compare_opts();
    let e_vs_k = match &e_result {
        Ok(_) => Some(compare_trees(&e_tree, &k_tree, &opts)?),
        Err(_) => None,
    };
    let agree = || -> io::Result<Result<(), String>> {
        let clean = e_result.clone().map_err(io::Error::other)?;
        match &e_vs_k {
            Some(d) if !d.is_empty() => Err(io::Error::other(format!(
                "e2fsck's and the kernel's replays differ:\n{}",
                list(d, 20)
            ))),
            _ => Ok(clean),
        }
    };
    let oracle_src = match spec.e2fsck {
        E2fsckReplay::Exact => {
            if let Err(out) = agree()? {
                return Err(io::Error::other(format!(
                    "e2fsck's replay is not e2fsck-clean (the kernel's is):\n{out}"
                )));
            }
            evidence.push("e2fsck's and the kernel's replays agree and are e2fsck-clean".to_string());
            &e_tree
        }
        E2fsckReplay::SameTreeUnclean(why) => {
            if agree()?.is_ok() {
                return Err(io::Error::other(format!(
                    "e2fsck's replay is now clean: the spec's note ({why}) is out of date; make it Exact"
                )));
            }
            evidence.push(format!(
                "e2fsck's replay reads as the kernel's but is not clean ({why})"
            ));
            &e_tree
        }
        E2fsckReplay::Wrong(why) => {
            let what = match (&e_result, &e_vs_k) {
                (Err(e), _) => format!(
                    "e2fsck failed: {}",
                    e.lines()
                        .rev()
                        .find(|l| l.contains("e2fsck:"))
                        .unwrap_or_else(|| e.lines().next().unwrap_or(""))
                ),
                (Ok(Ok(())), Some(d)) if d.is_empty() => {
                    return Err(io::Error::other(format!(
                        "e2fsck's replay now agrees with the kernel's: the spec's note ({why}) is out of date; make \
                         it Exact"
                    )))
                }
                (Ok(c), d) => format!(
                    "e2fsck's replay differs in {} places and is {}",
                    d.as_ref().map_or(0, Vec::len),
                    if c.is_ok() { "clean" } else { "not clean" }
                ),
            };
            evidence.push(format!("the kernel's replay is the oracle: {why} ({what})"));
            &k_tree
        }
    };
    let oracle = dir.join("oracle");
    fs::rename(oracle_src, &oracle)?;

    // The unreplayed view.
    let u_img = work.join("unreplayed.img");
    copy_sparse(image, &u_img)?;
    let unreplayed = dir.join("unreplayed");
    let unreplayed_errors = kernel_tree(&u_img, &unreplayed, "ro,noload")?;
    let opts = spec.compare_opts();
    if let Some(e) = &unreplayed_errors {
        evidence.push(format!(
            "the kernel could not read all of the unreplayed view: {}",
            e.lines().next().unwrap_or("")
        ));
    }
    let diffs = compare_trees(&oracle, &unreplayed, &opts)?;
    if diffs.is_empty() {
        return Err(not_meaningful(
            "the replayed tree equals the unreplayed tree (was the copy taken after a writeback?)",
        ));
    }
    evidence.push(format!(
        "replayed vs unreplayed: {} differences, e.g. {}",
        diffs.len(),
        diffs.first().map(|d| d.to_string()).unwrap_or_default()
    ));

    // A debugfs fixture knows what its committed transactions describe.
    if let Some(expected) = expected {
        let x_tree = work.join("expected-tree");
        if let Some(err) = kernel_tree(expected, &x_tree, "ro")? {
            return Err(io::Error::other(format!(
                "cp -a of the expected image met errors:\n{err}"
            )));
        }
        let d = compare_trees(&x_tree, &oracle, &opts)?;
        if !d.is_empty() {
            return Err(io::Error::other(format!(
                "the replayed tree is not the tree the committed transactions describe:\n{}",
                list(&d, 20)
            )));
        }
        evidence.push("the replayed tree is exactly the image the committed transactions describe".to_string());
    }

    // Shape-specific evidence that needs the replayed image.
    if let Writer::Kernel { op, .. } = spec.writer {
        kernel_evidence(
            op,
            image,
            &e_img,
            &k_img,
            &oracle,
            &summary,
            &work,
            &opts,
            &mut evidence,
        )?;
    }

    let mut notes = format!(
        "{}: {}\nmkfs: {}\nwriter: {:?}\ne2fsck's replay: {:?}\n",
        spec.name,
        spec.description,
        spec.mkfs.join(" "),
        spec.writer,
        spec.e2fsck
    );
    for e in &evidence {
        notes.push_str("- ");
        notes.push_str(e);
        notes.push('\n');
    }
    fs::write(dir.join("notes.txt"), notes)?;
    Ok(JournalFixture {
        name: spec.name.to_string(),
        description: spec.description.to_string(),
        image: image.to_path_buf(),
        oracle,
        unreplayed,
        unreplayed_errors,
        e2fsck: spec.e2fsck,
        evidence,
        compare: opts,
    })
}

/// Evidence for kernel fixtures that the shape is really there.
#[allow(clippy::too_many_arguments)]
fn kernel_evidence(
    op: KernelOp,
    image: &Path,
    e_img: &Path,
    k_img: &Path,
    oracle: &Path,
    summary: &LogSummary,
    work: &Path,
    opts: &CompareOpts,
    evidence: &mut Vec<String>,
) -> io::Result<()> {
    let replayed = if matches!(op, KernelOp::FcAfterFull) {
        k_img
    } else {
        e_img
    };
    match op {
        KernelOp::ReuseData => {
            let old = file_blocks(image, "/victim.bin")?;
            let new = file_blocks(replayed, "/reused.bin")?;
            let shared = old.intersection(&new).count();
            if shared == 0 {
                return Err(not_meaningful(format!(
                    "reused.bin ({} blocks) shares no block with the deleted victim.bin ({} blocks)",
                    new.len(),
                    old.len()
                )));
            }
            evidence.push(format!(
                "reused.bin reuses {shared} of the deleted victim.bin's {} blocks",
                old.len()
            ));
        }
        KernelOp::ReuseMeta => {
            let new = file_blocks(replayed, "/F.bin")?;
            let shared: Vec<u64> = summary.revoked.intersection(&new).copied().collect();
            if shared.is_empty() {
                return Err(not_meaningful(format!(
                    "F.bin's blocks {new:?} include no revoked block ({:?})",
                    summary.revoked
                )));
            }
            if !summary.logged.iter().any(|b| shared.contains(b)) {
                return Err(not_meaningful(
                    "no revoked block that F.bin reuses has an older copy in the log",
                ));
            }
            evidence.push(format!(
                "{} revoked directory blocks, logged earlier in the live log, hold F.bin's data: {:?}",
                shared.len(),
                shared
            ));
        }
        KernelOp::Many if summary.commits < 6 => {
            return Err(not_meaningful(format!("only {} commits in the log", summary.commits)));
        }
        KernelOp::Wrap if !summary.wrapped => {
            return Err(not_meaningful("the live log does not wrap"));
        }
        KernelOp::Orphan => {
            // Replaying without processing the orphan list (debugfs'
            // journal_run) leaves the unlinked inode for recovery to free.
            let j = work.join("journal-run.img");
            copy_sparse(image, &j)?;
            debugfs_run(&j, true, true, "jr\n")?;
            let d = dumpe2fs_header(&j)?;
            let first = header_field(&d, "First orphan inode:");
            let present = header_field(&d, "Filesystem features:")
                .split_whitespace()
                .any(|w| w == "orphan_present");
            if first.is_empty() && !present {
                return Err(not_meaningful(
                    "after a replay without orphan processing there is no orphan",
                ));
            }
            evidence.push(format!(
                "replayed without orphan processing: {}",
                if first.is_empty() {
                    "orphan_present set (orphan file)".to_string()
                } else {
                    format!("first orphan inode {first}")
                }
            ));
        }
        _ => {}
    }
    let tags = op.fc_tags();
    if !tags.is_empty() {
        for t in tags {
            if !summary.fc_tags.iter().any(|x| x == t) {
                return Err(not_meaningful(format!(
                    "the fast-commit area lacks a {t} tag (tags: {:?})",
                    summary.fc_tags
                )));
            }
        }
        // The fast commit is needed: without it, recovery reads otherwise.
        let z = work.join("fc-zeroed.img");
        copy_sparse(image, &z)?;
        zero_fast_commit_area(&z)?;
        let zt = work.join("fc-zeroed-tree");
        if matches!(op, KernelOp::FcAfterFull) {
            kernel_replay(&z, &work.join("mnt-fcz"))?;
        } else {
            let r = e2fsck_replay(&z)?;
            if r.code != 0 {
                return Err(io::Error::other(format!(
                    "e2fsck replay with the fast-commit area zeroed exited {}:\n{}",
                    r.code, r.output
                )));
            }
        }
        kernel_tree(&z, &zt, "ro")?;
        let d = compare_trees(oracle, &zt, opts)?;
        if d.is_empty() {
            return Err(not_meaningful(
                "with the fast-commit area zeroed, recovery gives the same tree: the fast commit carries nothing",
            ));
        }
        evidence.push(format!(
            "fast-commit tags {:?}; without them recovery differs in {} places",
            summary.fc_tags,
            d.len()
        ));
    }
    Ok(())
}

fn list(d: &[Difference], max: usize) -> String {
    let mut s: Vec<String> = d.iter().take(max).map(|x| format!("  {x}")).collect();
    if d.len() > max {
        s.push(format!("  ... and {} more", d.len() - max));
    }
    s.join("\n")
}

// ---------------------------------------------------------------------------
// Tools.

/// Outcome of `e2fsck -E journal_only -y`.
#[derive(Debug, Clone)]
pub struct E2fsckRun {
    /// Exit code (-1 if killed, e.g. by the timeout).
    pub code: i32,
    /// stdout and stderr.
    pub output: String,
}

/// `timeout 120 e2fsck -E journal_only -y IMAGE`, in place: replays the
/// journal and releases orphans, nothing else. Exit code 0 after a
/// successful replay; 8 or more when it gave up.
pub fn e2fsck_replay(image: &Path) -> io::Result<E2fsckRun> {
    let mut c = Command::new("timeout");
    c.args(["120", "e2fsck", "-E", "journal_only", "-y"])
        .arg(image)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    let o = run(&mut c)?;
    Ok(E2fsckRun {
        code: o.status.code().unwrap_or(-1),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    })
}

/// `timeout 120 e2fsck -fn IMAGE`: Ok if clean (exit 0), else Err with its
/// output.
pub fn e2fsck_fn(image: &Path) -> io::Result<Result<(), String>> {
    let mut c = Command::new("timeout");
    c.args(["120", "e2fsck", "-fn"])
        .arg(image)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    let o = run(&mut c)?;
    if o.status.code() == Some(0) {
        Ok(Ok(()))
    } else {
        Ok(Err(format!(
            "exit {:?}:\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )))
    }
}

/// Copies the tree of `image` as the kernel shows it with mount options
/// `opts` (`ro`, `ro,noload`) into `dest` (created) with `cp -a`, which
/// keeps modes, owners, times, symlinks, hard links and xattrs (zeros
/// become holes: the comparator reads holes as zeros). Returns
/// `cp`'s complaints when it could not copy everything (the tree is then
/// partial), None when it copied all.
pub fn kernel_tree(image: &Path, dest: &Path, opts: &str) -> io::Result<Option<String>> {
    let mnt = PathBuf::from(format!("{}.mnt", dest.display()));
    fs::create_dir_all(dest).context(|| format!("mkdir {}", dest.display()))?;
    let m = LoopMount::mount_with(image, &mnt, "ext4", opts)?;
    let mut from = m.path().as_os_str().to_os_string();
    from.push("/.");
    let mut cp = Command::new("cp");
    cp.args(["-a", "--sparse=always"])
        .arg(&from)
        .arg(dest)
        .stdin(Stdio::null());
    let o = run(&mut cp);
    let u = m.unmount();
    let _ = fs::remove_dir(&mnt);
    let o = o?;
    u?;
    if o.status.success() {
        Ok(None)
    } else {
        Ok(Some(String::from_utf8_lossy(&o.stderr).into_owned()))
    }
}

/// Replays `image`'s journal with the kernel: a read-write loop mount
/// (noatime) at `mnt`, then unmount.
pub fn kernel_replay(image: &Path, mnt: &Path) -> io::Result<()> {
    let m = LoopMount::mount_with(image, mnt, "ext4", "rw,noatime")?;
    let r = m.unmount();
    let _ = fs::remove_dir(mnt);
    r
}

/// `dumpe2fs -h IMAGE` (the superblock and journal superblock).
pub fn dumpe2fs_header(image: &Path) -> io::Result<String> {
    let mut c = Command::new("dumpe2fs");
    c.arg("-h").arg(image).env("LC_ALL", "C").stdin(Stdio::null());
    let o = run_ok(&mut c, &[0])?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The value of a `dumpe2fs -h` line ("" if absent).
pub fn header_field(dump: &str, key: &str) -> String {
    dump.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// `debugfs -R 'logdump -a' IMAGE`: every descriptor, revoke and commit
/// block of the live log and the fast-commit area's tags.
pub fn logdump(image: &Path) -> io::Result<String> {
    let mut c = Command::new("debugfs");
    c.args(["-R", "logdump -a"])
        .arg(image)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    let o = run_ok(&mut c, &[0])?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// What a `logdump -a` says about the live log.
#[derive(Debug, Default, Clone)]
pub struct LogSummary {
    /// Journal block the log starts at.
    pub start: u64,
    /// Commit blocks found.
    pub commits: usize,
    /// Revoke blocks found.
    pub revoke_blocks: usize,
    /// Filesystem blocks revoked.
    pub revoked: BTreeSet<u64>,
    /// Filesystem blocks logged in descriptor tags.
    pub logged: BTreeSet<u64>,
    /// Tags with the escape flag (a block starting with the jbd2 magic).
    pub escaped: usize,
    /// Descriptor blocks found.
    pub descriptors: usize,
    /// Whether some log block lies before the start (the log wraps).
    pub wrapped: bool,
    /// Fast-commit tags, in order (HEAD/TAIL/PAD left out).
    pub fc_tags: Vec<String>,
}

impl LogSummary {
    /// Parses `debugfs logdump -a` output.
    pub fn parse(log: &str) -> LogSummary {
        let mut s = LogSummary::default();
        let mut in_fc = false;
        for l in log.lines() {
            let t = l.trim();
            if let Some(r) = t.strip_prefix("Journal starts at block ") {
                s.start = r.split(',').next().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            } else if t.starts_with("Found expected sequence") {
                let at = t.rsplit("at block ").next().and_then(|v| v.trim().parse::<u64>().ok());
                if let Some(b) = at {
                    if b < s.start {
                        s.wrapped = true;
                    }
                }
                if t.contains("(commit block)") {
                    s.commits += 1;
                } else if t.contains("(revoke table)") {
                    s.revoke_blocks += 1;
                } else if t.contains("(descriptor block)") {
                    s.descriptors += 1;
                }
            } else if let Some(r) = t.strip_prefix("Revoke FS block ") {
                if let Ok(b) = r.trim().parse() {
                    s.revoked.insert(b);
                }
            } else if let Some(r) = t.strip_prefix("FS block ") {
                // "FS block N logged at journal block J (flags 0xF)"
                if let Some(b) = r.split_whitespace().next().and_then(|v| v.parse().ok()) {
                    s.logged.insert(b);
                }
                if let Some(f) = r.split("flags 0x").nth(1) {
                    let f = f.trim_end_matches(')');
                    if u32::from_str_radix(f, 16).is_ok_and(|f| f & 1 != 0) {
                        s.escaped += 1;
                    }
                }
            } else if t.starts_with("*** Fast Commit Area ***") {
                in_fc = true;
            } else if in_fc {
                if let Some(r) = t.strip_prefix("tag ") {
                    let name = r.split([',', ' ']).next().unwrap_or("");
                    if !matches!(name, "HEAD" | "TAIL" | "PAD" | "") {
                        s.fc_tags.push(name.to_string());
                    }
                }
            }
        }
        s
    }

    /// One line for the notes.
    pub fn describe(&self) -> String {
        format!(
            "log from journal block {}: {} descriptor, {} commit, {} revoke blocks ({} blocks revoked), {} escaped \
             tags{}{}",
            self.start,
            self.descriptors,
            self.commits,
            self.revoke_blocks,
            self.revoked.len(),
            self.escaped,
            if self.wrapped {
                ", wraps past the journal's end"
            } else {
                ""
            },
            if self.fc_tags.is_empty() {
                String::new()
            } else {
                format!(", fast-commit tags {:?}", self.fc_tags)
            }
        )
    }
}

/// The physical blocks of a file (`debugfs -R 'blocks PATH'`).
fn file_blocks(image: &Path, path: &str) -> io::Result<BTreeSet<u64>> {
    let mut c = Command::new("debugfs");
    c.arg("-R")
        .arg(format!("blocks {path}"))
        .arg(image)
        .stdin(Stdio::null());
    let o = run_ok(&mut c, &[0])?;
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("not found") {
        return Err(io::Error::other(format!("{path} is not in {}", image.display())));
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect())
}

/// The journal inode's physical blocks, in logical order.
fn journal_blocks(image: &Path) -> io::Result<Vec<u64>> {
    let mut c = Command::new("debugfs");
    c.args(["-R", "blocks <8>"]).arg(image).stdin(Stdio::null());
    let o = run_ok(&mut c, &[0])?;
    let v: Vec<u64> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    if v.is_empty() {
        return Err(io::Error::other(format!("{} has no journal blocks", image.display())));
    }
    Ok(v)
}

fn block_size(image: &Path) -> io::Result<u64> {
    let d = dumpe2fs_header(image)?;
    header_field(&d, "Block size:")
        .parse()
        .map_err(|_| io::Error::other(format!("no block size in dumpe2fs -h {}", image.display())))
}

/// Zeroes the fast-commit area (the journal's last "Fast commit length"
/// blocks).
fn zero_fast_commit_area(image: &Path) -> io::Result<()> {
    let d = dumpe2fs_header(image)?;
    let n: usize = header_field(&d, "Fast commit length:")
        .parse()
        .map_err(|_| io::Error::other("no fast-commit length in dumpe2fs -h"))?;
    let bs = block_size(image)?;
    let jb = journal_blocks(image)?;
    let f = fs::OpenOptions::new().write(true).open(image)?;
    let zero = vec![0u8; bs as usize];
    for b in &jb[jb.len().saturating_sub(n)..] {
        f.write_all_at(&zero, b * bs)?;
    }
    f.sync_all()
}

/// `cp --sparse=always FROM TO`.
pub fn copy_sparse(from: &Path, to: &Path) -> io::Result<()> {
    let mut c = Command::new("cp");
    c.arg("--sparse=always").arg(from).arg(to).stdin(Stdio::null());
    run_ok(&mut c, &[0]).map(|_| ())
}

/// The first byte offset at which two files differ (a length difference
/// counts at the shorter length), or None if they are identical.
pub fn first_difference(a: &Path, b: &Path) -> io::Result<Option<u64>> {
    let mut fa = File::open(a).context(|| format!("open {}", a.display()))?;
    let mut fb = File::open(b).context(|| format!("open {}", b.display()))?;
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        let n = na.min(nb);
        if let Some(i) = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y) {
            return Ok(Some(off + i as u64));
        }
        if na != nb {
            return Ok(Some(off + n as u64));
        }
        if na == 0 {
            return Ok(None);
        }
        off += n as u64;
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn remove_tree(p: &Path) -> io::Result<()> {
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).context(|| format!("remove {}", p.display())),
    }
}

fn mkfs(image: &Path, spec: &JournalSpec, src: &Path) -> io::Result<()> {
    match fs::remove_file(image) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(|| format!("remove {}", image.display())),
    }
    let mut c = e2fs("mke2fs");
    c.args(["-F", "-q"])
        .args(spec.mkfs)
        .args(["-U", FIXED_UUID])
        .args([
            "-E",
            &format!("hash_seed={FIXED_HASH_SEED},lazy_itable_init=0,lazy_journal_init=0"),
        ])
        .arg("-d")
        .arg(src)
        .arg(image)
        .arg(format!("{}M", spec.size_mib));
    run_ok(&mut c, &[0]).map(|_| ())
}

/// Deterministic bytes for a labelled file.
fn bytes(label: &str, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    TestRng::for_label(17, label).fill(&mut v);
    v
}

// ---------------------------------------------------------------------------
// The kernel as the journal writer.

/// The tree every kernel fixture starts from (made into the image with
/// `mke2fs -d`).
fn kernel_base_tree(src: &Path) -> io::Result<()> {
    use std::os::unix::fs::symlink;
    fs::create_dir_all(src)?;
    fs::write(src.join("keep.txt"), b"untouched\n")?;
    fs::write(src.join("a.txt"), bytes("a", 100))?;
    fs::write(src.join("big.bin"), bytes("big", 200 * 1024))?;
    fs::write(src.join("victim.bin"), bytes("victim", 64 * 1024))?;
    fs::write(src.join("x.txt"), b"has xattrs\n")?;
    rustix::fs::lsetxattr(
        src.join("x.txt"),
        "user.attr",
        b"old value",
        rustix::fs::XattrFlags::empty(),
    )
    .context(|| "setxattr on the base tree (does TMPDIR support user xattrs?)".to_string())?;
    fs::create_dir(src.join("dir1"))?;
    for i in 0..40 {
        fs::write(
            src.join(format!("dir1/f{i:03}")),
            bytes(&format!("f{i}"), (i * 379) % 6000),
        )?;
    }
    fs::create_dir(src.join("dir2"))?;
    fs::write(src.join("dir2/existing"), b"to be replaced\n")?;
    fs::create_dir(src.join("emptydir"))?;
    symlink("a.txt", src.join("sym"))?;
    fs::write(src.join("hl1"), b"hard linked\n")?;
    fs::hard_link(src.join("hl1"), src.join("hl2"))?;
    Ok(())
}

fn fsync_path(p: &Path) -> io::Result<()> {
    File::open(p)
        .and_then(|f| f.sync_all())
        .context(|| format!("fsync {}", p.display()))
}

fn write_synced(p: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = File::create(p).context(|| format!("create {}", p.display()))?;
    f.write_all(data)?;
    f.sync_all().context(|| format!("fsync {}", p.display()))
}

fn append_synced(p: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(p)
        .context(|| format!("open {}", p.display()))?;
    f.write_all(data)?;
    f.sync_all().context(|| format!("fsync {}", p.display()))
}

/// The loop device behind the mount at `dir` (e.g. "loop3").
fn loop_device_of(dir: &Path) -> Option<String> {
    let t = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = fs::canonicalize(dir).ok()?;
    t.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if Path::new(left.split(' ').nth(4)?) != dir {
            return None;
        }
        let src = right.split(' ').nth(1)?;
        src.strip_prefix("/dev/").map(str::to_string)
    })
}

/// Free blocks of the mounted filesystem (statvfs f_bfree) and its block
/// size.
fn free_blocks(mnt: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(mnt).context(|| format!("statvfs {}", mnt.display()))?;
    Ok((st.f_bfree, st.f_frsize))
}

/// Lets root's data allocations use every free block (the kernel keeps 2%
/// back for metadata otherwise), so a nearly full filesystem really forces
/// reuse.
fn no_reserved_clusters(mnt: &Path) -> io::Result<()> {
    let dev = loop_device_of(mnt).ok_or_else(|| io::Error::other("no loop device for the mount"))?;
    fs::write(format!("/sys/fs/ext4/{dev}/reserved_clusters"), b"0")
        .context(|| format!("writing /sys/fs/ext4/{dev}/reserved_clusters"))
}

/// Fills the mounted filesystem until about `keep` blocks are free: with
/// unwritten (fallocated) files, or with zeros where the files have no
/// extents (ext3).
fn fill_leaving(mnt: &Path, keep: u64) -> io::Result<()> {
    let mut extents = true;
    for i in 0..64 {
        let (free, bs) = free_blocks(mnt)?;
        if free <= keep {
            return Ok(());
        }
        let p = mnt.join(format!("filler{i}"));
        let mut f = File::create(&p).context(|| format!("create {}", p.display()))?;
        let mut want = free - keep;
        while extents {
            match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, want * bs) {
                Ok(()) => break,
                Err(rustix::io::Errno::NOSPC) if want > 1 => want /= 2,
                Err(rustix::io::Errno::OPNOTSUPP) => extents = false,
                Err(e) => return Err(io::Error::from(e)).context(|| format!("fallocate {}", p.display())),
            }
        }
        if !extents {
            // Leave room for the indirect blocks (one per 1,024 data blocks
            // at 4 KiB) and converge over several files.
            let n = (want - want / 256).saturating_sub(2).max(1);
            let zeros = vec![0u8; bs as usize];
            for _ in 0..n {
                match f.write_all(&zeros) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(28) => break,
                    Err(e) => return Err(e).context(|| format!("write {}", p.display())),
                }
            }
        }
        f.sync_all()?;
    }
    Err(io::Error::other(format!(
        "could not fill {} to {keep} free blocks",
        mnt.display()
    )))
}

fn make_kernel(
    spec: &JournalSpec,
    op: KernelOp,
    mount_opts: &str,
    work: &Path,
    image: &Path,
    evidence: &mut Vec<String>,
) -> io::Result<()> {
    let src = work.join("src");
    kernel_base_tree(&src)?;
    let live = work.join("live.img");
    mkfs(&live, spec, &src)?;
    // A short mount point: the kernel records it in the superblock
    // (s_last_mounted, a journaled change on the first file open) only if
    // the path fits in 64 bytes, as on real systems ("/", "/home").
    let mnt = short_mount_dir()?;
    let r = mount_and_run(op, mount_opts, &live, &mnt, image, evidence);
    let _ = fs::remove_dir(&mnt);
    r?;
    let _ = fs::remove_file(&live);
    Ok(())
}

/// A fresh, empty directory with a path shorter than 64 bytes.
fn short_mount_dir() -> io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let tmp = std::env::temp_dir();
    let base = if tmp.as_os_str().len() <= 32 {
        tmp
    } else {
        PathBuf::from("/tmp")
    };
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = base.join(format!("ejm-{}-{n}", std::process::id()));
    fs::create_dir_all(&d).context(|| format!("mkdir {}", d.display()))?;
    Ok(d)
}

fn mount_and_run(
    op: KernelOp,
    mount_opts: &str,
    live: &Path,
    mnt: &Path,
    image: &Path,
    evidence: &mut Vec<String>,
) -> io::Result<()> {
    if let Some(keep) = op.fills() {
        let m = LoopMount::mount_with(live, mnt, "ext4", "rw")?;
        let r = no_reserved_clusters(mnt).and_then(|()| fill_leaving(mnt, keep));
        let u = m.unmount();
        r?;
        u?;
    }
    let opts = if mount_opts.is_empty() {
        "commit=60".to_string()
    } else {
        format!("commit=60,{mount_opts}")
    };
    let m = LoopMount::mount_with(live, mnt, "ext4", &opts)?;
    let r = kernel_op(op, mnt, live, image, evidence);
    let u = m.unmount();
    r?;
    u
}

/// Runs `op` on the mount and copies the live image to `image` at the
/// moment the fixture needs (normally right after the last fsync).
fn kernel_op(op: KernelOp, m: &Path, live: &Path, image: &Path, evidence: &mut Vec<String>) -> io::Result<()> {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let snapshot = || copy_sparse(live, image);
    let chmod = |p: &Path, mode: u32| fs::set_permissions(p, fs::Permissions::from_mode(mode));
    // Fast commits: the first fsync after a mount is a full commit;
    // checkpoint it (syncfs) so that the live log holds only fast commits
    // (see the module notes on e2fsck).
    let warm_up = || -> io::Result<()> {
        write_synced(&m.join("warm"), b"warm-up: a full commit\n")?;
        let f = File::open(m)?;
        rustix::fs::syncfs(&f).context(|| "syncfs".to_string())
    };
    match op {
        KernelOp::Create => {
            write_synced(&m.join("dir1/new.txt"), &bytes("new", 3000))?;
            write_synced(&m.join("new-top.bin"), &bytes("new-top", 20 * 1024))?;
            fsync_path(&m.join("dir1"))?;
            fsync_path(m)?;
        }
        KernelOp::Unlink => {
            fs::remove_file(m.join("dir1/f005"))?;
            fs::remove_file(m.join("victim.bin"))?;
            fsync_path(&m.join("dir1"))?;
            fsync_path(m)?;
        }
        KernelOp::Rename => {
            fs::rename(m.join("a.txt"), m.join("dir2/a-moved.txt"))?;
            fs::rename(m.join("dir1/f001"), m.join("dir1/f001-renamed"))?;
            fs::rename(m.join("dir1/f002"), m.join("dir2/existing"))?;
            fs::rename(m.join("emptydir"), m.join("dir2/moved-dir"))?;
            fsync_path(&m.join("dir1"))?;
            fsync_path(&m.join("dir2"))?;
            fsync_path(m)?;
        }
        KernelOp::Append => {
            append_synced(&m.join("a.txt"), &bytes("append-a", 10_000))?;
            append_synced(&m.join("dir1/f003"), &bytes("append-f3", 5_000))?;
        }
        KernelOp::Truncate => {
            for (p, len) in [("big.bin", 5000u64), ("dir1/f004", 0)] {
                let f = fs::OpenOptions::new().write(true).open(m.join(p))?;
                f.set_len(len)?;
                f.sync_all()?;
            }
        }
        KernelOp::Chmod => {
            chmod(&m.join("a.txt"), 0o640)?;
            std::os::unix::fs::chown(m.join("x.txt"), Some(1000), Some(1000))?;
            chmod(&m.join("dir2"), 0o700)?;
            chmod(&m.join("dir1/f006"), 0o4755)?;
            fsync_path(&m.join("a.txt"))?;
        }
        KernelOp::ReuseData => {
            no_reserved_clusters(m)?;
            fs::remove_file(m.join("victim.bin"))?;
            fsync_path(m)?;
            let (free, bs) = free_blocks(m)?;
            evidence.push(format!("{free} blocks free after deleting victim.bin"));
            let n = (free.saturating_sub(1) * bs).min(64 * 1024) as usize;
            write_synced(&m.join("reused.bin"), &bytes("reused", n))?;
            fsync_path(m)?;
        }
        KernelOp::ReuseMeta => {
            no_reserved_clusters(m)?;
            let d = m.join("D");
            fs::create_dir(&d)?;
            for i in 0..300 {
                File::create(d.join(format!("a-rather-long-directory-entry-name-{i:04}")))?;
            }
            fsync_path(&d)?;
            fsync_path(m)?;
            fs::remove_dir_all(&d)?;
            fsync_path(m)?;
            let (free, bs) = free_blocks(m)?;
            evidence.push(format!("{free} blocks free after removing D"));
            // Leave room for an indirect block (ext3) and for the tests'
            // mkdir after recovery.
            let n = (free.saturating_sub(3) * bs) as usize;
            write_synced(&m.join("F.bin"), &bytes("F", n))?;
            fsync_path(m)?;
        }
        KernelOp::Many => {
            fs::create_dir(m.join("many"))?;
            for d in 0..6 {
                let dir = m.join(format!("many/d{d}"));
                fs::create_dir(&dir)?;
                for i in 0..500 {
                    fs::write(dir.join(format!("file-{i:04}")), format!("{d}/{i}\n").repeat(8))?;
                }
                fsync_path(&dir)?;
                fsync_path(&m.join("many"))?;
            }
        }
        KernelOp::MkdirRmdir => {
            fs::create_dir_all(m.join("newdir/sub/leaf"))?;
            chmod(&m.join("newdir/sub"), 0o750)?;
            fs::remove_dir(m.join("emptydir"))?;
            fsync_path(&m.join("newdir/sub"))?;
            fsync_path(&m.join("newdir"))?;
            fsync_path(m)?;
        }
        KernelOp::HardLink => {
            fs::hard_link(m.join("a.txt"), m.join("dir2/a-link"))?;
            fs::hard_link(m.join("dir1/f006"), m.join("dir1/f006-link"))?;
            fs::hard_link(m.join("hl1"), m.join("hl3"))?;
            fsync_path(&m.join("dir2"))?;
            fsync_path(&m.join("dir1"))?;
            fsync_path(m)?;
        }
        KernelOp::Symlink => {
            symlink("a.txt", m.join("short-sym"))?;
            let long = format!("{}/target", "long-symlink-component".repeat(14));
            symlink(long, m.join("dir1/long-sym"))?;
            fsync_path(&m.join("dir1"))?;
            fsync_path(m)?;
        }
        KernelOp::Xattr => {
            let set = |p: &Path, n: &str, v: &[u8]| {
                rustix::fs::lsetxattr(p, n, v, rustix::fs::XattrFlags::empty())
                    .context(|| format!("setxattr {n} on {}", p.display()))
            };
            set(&m.join("a.txt"), "user.new", b"small value")?;
            set(&m.join("big.bin"), "user.big", &bytes("xattr-big", 3000))?;
            rustix::fs::lremovexattr(m.join("x.txt"), "user.attr").context(|| "removexattr".to_string())?;
            set(&m.join("dir1"), "trusted.dir", b"on a directory")?;
            for p in ["a.txt", "big.bin", "x.txt", "dir1"] {
                fsync_path(&m.join(p))?;
            }
        }
        KernelOp::Mixed => {
            write_synced(&m.join("dir1/new.txt"), &bytes("mixed-new", 7000))?;
            append_synced(&m.join("a.txt"), &bytes("mixed-append", 9000))?;
            fs::remove_file(m.join("dir1/f005"))?;
            fs::remove_file(m.join("victim.bin"))?;
            fs::rename(m.join("dir1/f001"), m.join("dir2/f001-moved"))?;
            chmod(&m.join("keep.txt"), 0o600)?;
            fs::hard_link(m.join("dir1/f006"), m.join("dir2/f006-link"))?;
            symlink("dir1/new.txt", m.join("new-sym"))?;
            rustix::fs::lsetxattr(
                m.join("dir1/f007"),
                "user.mixed",
                b"value",
                rustix::fs::XattrFlags::empty(),
            )?;
            fs::create_dir_all(m.join("newdir/sub"))?;
            let f = fs::OpenOptions::new().write(true).open(m.join("big.bin"))?;
            f.set_len(4096 * 3 + 17)?;
            f.sync_all()?;
            fsync_path(m)?;
        }
        KernelOp::Orphan => {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.join("victim.bin"))?;
            fs::remove_file(m.join("victim.bin"))?;
            f.write_all_at(b"still open", 0)?;
            f.sync_all()?;
            write_synced(&m.join("marker.txt"), b"the transaction also creates this\n")?;
            fsync_path(m)?;
            // The file is still open: the copy has it on the orphan list.
            snapshot()?;
            drop(f);
            return Ok(());
        }
        KernelOp::Wrap => {
            fs::create_dir(m.join("many"))?;
            fsync_path(m)?;
            for round in 0..80 {
                for i in 0..10 {
                    write_synced(
                        &m.join(format!("many/r{round:02}-{i}")),
                        format!("round {round} file {i}\n").as_bytes(),
                    )?;
                }
                snapshot()?;
                let s = LogSummary::parse(&logdump(image)?);
                if s.wrapped {
                    evidence.push(format!("the live log wrapped after {} rounds of 10 fsyncs", round + 1));
                    return Ok(());
                }
            }
            return Err(not_meaningful("the log did not wrap after 800 fsyncs"));
        }
        KernelOp::FcCreate => {
            warm_up()?;
            write_synced(&m.join("dir1/fc-new.txt"), &bytes("fc-new", 5000))?;
        }
        KernelOp::FcAppend => {
            warm_up()?;
            append_synced(&m.join("a.txt"), &bytes("fc-append", 10_000))?;
        }
        KernelOp::FcUnlink => {
            warm_up()?;
            fs::remove_file(m.join("dir1/f005"))?;
            append_synced(&m.join("dir1/f003"), b"carries the unlink\n")?;
        }
        KernelOp::FcRename => {
            warm_up()?;
            fs::rename(m.join("a.txt"), m.join("dir2/a-fc.txt"))?;
            fsync_path(&m.join("dir2/a-fc.txt"))?;
        }
        KernelOp::FcLink => {
            warm_up()?;
            fs::hard_link(m.join("a.txt"), m.join("dir2/a-fc-link"))?;
            fsync_path(&m.join("dir2/a-fc-link"))?;
        }
        KernelOp::FcAfterFull => {
            write_synced(&m.join("first.txt"), &bytes("first", 1000))?;
            write_synced(&m.join("second.txt"), &bytes("second", 3000))?;
        }
    }
    snapshot()?;
    // Whether an fsync becomes a fast commit is the kernel's choice (a
    // commit still running makes it a full one): check, and let the caller
    // try again.
    let tags = op.fc_tags();
    if !tags.is_empty() {
        let s = LogSummary::parse(&logdump(image)?);
        if let Some(t) = tags.iter().find(|t| !s.fc_tags.iter().any(|x| x == *t)) {
            return Err(not_meaningful(format!(
                "the kernel wrote no fast commit with a {t} tag ({} full commits, tags {:?})",
                s.commits, s.fc_tags
            )));
        }
        // e2fsck's bug needs the superblock in the full commit (the kernel
        // logs it on the first open after a mount, to record
        // s_last_mounted, if the mount point's path fits in 64 bytes).
        if op == KernelOp::FcAfterFull && !s.logged.contains(&0) {
            return Err(not_meaningful(format!(
                "the full commit before the fast commit does not log the superblock ({} commits, blocks {:?})",
                s.commits, s.logged
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// debugfs' journal writer.

/// One transaction for `jw`.
struct Tx {
    /// (filesystem block, new contents).
    blocks: Vec<(u64, Vec<u8>)>,
    /// Blocks revoked (`jw -r`).
    revoke: Vec<u64>,
    /// Whether a commit block is written.
    commit: bool,
}

/// The blocks in which `b` differs from `a`, outside the journal.
fn diff_blocks(a: &Path, b: &Path, bs: u64, journal: &BTreeSet<u64>) -> io::Result<Vec<(u64, Vec<u8>)>> {
    let fa = File::open(a)?;
    let fb = File::open(b)?;
    let len = fa.metadata()?.len().min(fb.metadata()?.len());
    let mut out = Vec::new();
    let mut x = vec![0u8; bs as usize];
    let mut y = vec![0u8; bs as usize];
    let mut blk = 0u64;
    while blk * bs < len {
        fa.read_exact_at(&mut x, blk * bs)?;
        fb.read_exact_at(&mut y, blk * bs)?;
        if x != y && !journal.contains(&blk) {
            out.push((blk, y.clone()));
        }
        blk += 1;
    }
    Ok(out)
}

/// "1,2,3,7,9-12" style list, as debugfs' read_list parses it.
fn block_list(blocks: impl IntoIterator<Item = u64>) -> String {
    let v: Vec<u64> = blocks.into_iter().collect();
    let mut parts = Vec::new();
    let mut i = 0;
    // Ranges only where the list is contiguous: the data file follows the
    // list's order, so the order is kept.
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        if j > i {
            parts.push(format!("{}-{}", v[i], v[j]));
        } else {
            parts.push(v[i].to_string());
        }
        i = j + 1;
    }
    parts.join(",")
}

/// Writes one transaction into `image`'s journal in its own debugfs
/// session (each `jo` finds the log's head itself, so transactions follow
/// each other exactly).
fn write_tx(image: &Path, open: &str, tx: &Tx, data: &Path) -> io::Result<()> {
    let mut script = format!("{open}\n");
    let c = if tx.commit { "" } else { " -c" };
    if !tx.blocks.is_empty() {
        let mut f = File::create(data)?;
        for (_, b) in &tx.blocks {
            f.write_all(b)?;
        }
        f.sync_all()?;
        script.push_str(&format!(
            "jw{c} -b {} {}\n",
            block_list(tx.blocks.iter().map(|x| x.0)),
            data.display()
        ));
    }
    if !tx.revoke.is_empty() {
        script.push_str(&format!("jw{c} -r {}\n", block_list(tx.revoke.iter().copied())));
    }
    script.push_str("jc\n");
    if script.lines().any(|l| l.len() > 4000) {
        return Err(io::Error::other(
            "a jw command line is longer than debugfs reads (8 KiB): too scattered a transaction",
        ));
    }
    let out = debugfs_run(image, true, true, &script)?;
    let text = String::from_utf8_lossy(&out);
    if let Some(l) = text
        .lines()
        .find(|l| l.contains("journal_write") || l.contains("while") || l.contains("not open"))
    {
        return Err(io::Error::other(format!("debugfs {open}/jw/jc: {l}")));
    }
    Ok(())
}

/// The tree every debugfs fixture starts from.
fn debugfs_base_tree(src: &Path, bs: usize) -> io::Result<()> {
    fs::create_dir_all(src.join("d"))?;
    fs::write(src.join("a"), b"alpha\n")?;
    fs::write(src.join("b"), b"beta, whose mode and xattrs change\n")?;
    fs::write(src.join("data1"), bytes("data1", bs))?;
    fs::write(src.join("data2"), bytes("data2", bs))?;
    fs::write(src.join("keep"), b"never changed\n")?;
    for i in 0..12 {
        fs::write(src.join(format!("d/f{i}")), bytes(&format!("d{i}"), 100 + i * 700))?;
    }
    Ok(())
}

/// A copy of `from` edited by a debugfs script; must be e2fsck-clean.
fn edited(from: &Path, to: &Path, script: &str) -> io::Result<()> {
    copy_sparse(from, to)?;
    debugfs_run(to, true, true, script).context(|| format!("debugfs -w on {}", to.display()))?;
    e2fsck_fn(to)?.map_err(|e| io::Error::other(format!("{} after debugfs edits is not clean: {e}", to.display())))
}

fn make_debugfs(
    spec: &JournalSpec,
    shape: DebugfsShape,
    open: &str,
    work: &Path,
    image: &Path,
    evidence: &mut Vec<String>,
) -> io::Result<PathBuf> {
    let bs_arg = spec
        .mkfs
        .iter()
        .position(|a| *a == "-b")
        .and_then(|i| spec.mkfs.get(i + 1))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(4096);
    let src = work.join("src");
    debugfs_base_tree(&src, bs_arg)?;
    let base = work.join("base.img");
    mkfs(&base, spec, &src)?;
    let bs = block_size(&base)?;
    let journal: BTreeSet<u64> = journal_blocks(&base)?.into_iter().collect();

    // Host files debugfs writes into the image.
    let magic = work.join("magic.bin");
    let mut m = vec![0xc0, 0x3b, 0x39, 0x98];
    m.extend(bytes("magic", 2 * bs as usize - 4));
    fs::write(&magic, m)?;
    let small = work.join("small.bin");
    fs::write(&small, bytes("small", 5000))?;
    let big = work.join("big.bin");
    fs::write(&big, bytes("long", 3 * 1024 * 1024))?;

    let script_small = format!(
        "mkdir /newdir\nwrite {} /newdir/magic\nrm /a\nsymlink /sl newdir/magic\nsif /b mode 0100600\n\
         ea_set /b user.k hello\nmkdir /newdir/sub\nwrite {} /newdir/sub/small\n",
        magic.display(),
        small.display()
    );
    let a_img = work.join("A.img");
    let mut txs = Vec::new();
    let expected = work.join("expected.img");
    match shape {
        DebugfsShape::Short => {
            edited(&base, &a_img, &script_small)?;
            txs.push(Tx {
                blocks: diff_blocks(&base, &a_img, bs, &journal)?,
                revoke: vec![],
                commit: true,
            });
            copy_sparse(&a_img, &expected)?;
        }
        DebugfsShape::Long => {
            edited(&base, &a_img, &format!("write {} /long\n", big.display()))?;
            txs.push(Tx {
                blocks: diff_blocks(&base, &a_img, bs, &journal)?,
                revoke: vec![],
                commit: true,
            });
            copy_sparse(&a_img, &expected)?;
        }
        DebugfsShape::Revoke => {
            edited(&base, &a_img, &script_small)?;
            let d1 = *file_blocks(&base, "/data1")?
                .iter()
                .next()
                .ok_or_else(|| io::Error::other("/data1 has no block"))?;
            let d2 = *file_blocks(&base, "/data2")?
                .iter()
                .next()
                .ok_or_else(|| io::Error::other("/data2 has no block"))?;
            let mut t1 = diff_blocks(&base, &a_img, bs, &journal)?;
            t1.push((d1, bytes("data1-new", bs as usize)));
            t1.push((d2, bytes("data2-new", bs as usize)));
            let later = bytes("data2-after-revoke", bs as usize);
            txs.push(Tx {
                blocks: t1,
                revoke: vec![],
                commit: true,
            });
            txs.push(Tx {
                blocks: vec![],
                revoke: vec![d1, d2],
                commit: true,
            });
            txs.push(Tx {
                blocks: vec![(d2, later.clone())],
                revoke: vec![],
                commit: true,
            });
            // Replay: transaction 1's copies of d1 and d2 are revoked by 2;
            // transaction 3 rewrites d2 after the revoke.
            copy_sparse(&a_img, &expected)?;
            let f = fs::OpenOptions::new().write(true).open(&expected)?;
            f.write_all_at(&later, d2 * bs)?;
            evidence.push(format!(
                "blocks {d1} (/data1) and {d2} (/data2) written in transaction 1, revoked in 2; {d2} written again \
                 in 3"
            ));
        }
        DebugfsShape::Uncommitted => {
            edited(&base, &a_img, &script_small)?;
            let b_img = work.join("B.img");
            edited(
                &a_img,
                &b_img,
                &format!("mkdir /later\nrm /keep\nwrite {} /later/x\n", small.display()),
            )?;
            txs.push(Tx {
                blocks: diff_blocks(&base, &a_img, bs, &journal)?,
                revoke: vec![],
                commit: true,
            });
            txs.push(Tx {
                blocks: diff_blocks(&a_img, &b_img, bs, &journal)?,
                revoke: vec![],
                commit: false,
            });
            copy_sparse(&a_img, &expected)?;
        }
        DebugfsShape::Sequence => {
            let steps = [
                "mkdir /s1\n".to_string(),
                format!("write {} /s1/f\n", small.display()),
                "rm /b\nsif /a mode 0100640\n".to_string(),
                format!("mkdir /s4\nsymlink /s4/l ../s1/f\nwrite {} /s4/m\n", magic.display()),
            ];
            let mut prev = base.clone();
            for (i, s) in steps.iter().enumerate() {
                let next = work.join(format!("step{i}.img"));
                edited(&prev, &next, s)?;
                txs.push(Tx {
                    blocks: diff_blocks(&prev, &next, bs, &journal)?,
                    revoke: vec![],
                    commit: true,
                });
                prev = next;
            }
            copy_sparse(&prev, &expected)?;
        }
    }

    copy_sparse(&base, image)?;
    for (i, tx) in txs.iter().enumerate() {
        write_tx(image, open, tx, &work.join(format!("tx{i}.bin")))?;
    }
    let s = LogSummary::parse(&logdump(image)?);
    let committed = txs.iter().filter(|t| t.commit).count();
    if s.commits != committed {
        return Err(io::Error::other(format!(
            "logdump shows {} commit blocks, {committed} transactions were committed",
            s.commits
        )));
    }
    let total: usize = txs.iter().map(|t| t.blocks.len()).sum();
    evidence.push(format!(
        "{} transactions ({committed} committed) of {total} blocks written with `{open}` / jw / jc",
        txs.len()
    ));
    match shape {
        DebugfsShape::Short if s.escaped == 0 => {
            return Err(not_meaningful(
                "no escaped tag although a block starts with the jbd2 magic",
            ));
        }
        DebugfsShape::Long if s.descriptors < 2 => {
            return Err(not_meaningful(format!("only {} descriptor blocks", s.descriptors)));
        }
        DebugfsShape::Revoke if s.revoked.len() != 2 => {
            return Err(not_meaningful(format!("revoked blocks {:?}", s.revoked)));
        }
        _ => {}
    }
    Ok(expected)
}

// ---------------------------------------------------------------------------
// Checking an arbitrary image (scripts/check-journal-images).

/// One cell of [`ImageCheck`]: whether ext4kit behaved as the oracle
/// says, and a short reason.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// As expected.
    pub ok: bool,
    /// Short text for the table.
    pub text: String,
    /// Details (differences, command output) for after the table.
    pub details: Vec<String>,
}

impl Verdict {
    fn ok(text: impl Into<String>) -> Verdict {
        Verdict {
            ok: true,
            text: text.into(),
            details: vec![],
        }
    }
    fn bad(text: impl Into<String>, details: Vec<String>) -> Verdict {
        Verdict {
            ok: false,
            text: text.into(),
            details,
        }
    }
}

/// The checks of one image against e2fsck's recovery.
#[derive(Debug, Clone)]
pub struct ImageCheck {
    /// What e2fsck -E journal_only did (exit code, clean afterwards?).
    pub e2fsck: String,
    /// `ext4kit get` reads the tree of e2fsck's replay (or refuses where
    /// e2fsck does).
    pub replayed: Verdict,
    /// The image's bytes are unchanged by the read-only `get`.
    pub unchanged: Verdict,
    /// A read-write open (`ext4kit mkdir`) leaves an e2fsck-clean image (as
    /// clean as e2fsck's own replay), or is refused where the kernel's
    /// read-write mount is refused too.
    pub rw: Verdict,
    /// Whether recovery changes the tree at all (e2fsck's replay against
    /// the kernel's `-o ro,noload` view; None where either is unreadable).
    /// Many of e2fsprogs' j_* images journal bitmaps only: there the tree
    /// check proves little.
    pub recovery_changes_tree: Option<bool>,
}

fn ext4kit_cmd(bin: &Path, args: &[&std::ffi::OsStr]) -> io::Result<(bool, String)> {
    let mut c = Command::new(bin);
    c.args(args).stdin(Stdio::null());
    let desc = describe(&c);
    let o = run(&mut c)?;
    Ok((
        o.status.success(),
        format!(
            "`{desc}` exit {:?}: {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .trim_end()
        .to_string(),
    ))
}

/// Runs the journal checks on `image` (never modified: every step works on
/// a copy in `work`): e2fsck's replay of a copy is the oracle (its tree via
/// a read-only kernel mount, or debugfs rdump where the kernel cannot mount
/// it); `ext4kit get` must read that tree, or fail where e2fsck gave up;
/// the read must not change the image; a read-write open must succeed
/// where e2fsck's replay did (or be refused where the kernel's read-write
/// mount is refused too) and leave an image as clean as e2fsck's.
pub fn check_image(bin: &Path, image: &Path, work: &Path) -> io::Result<ImageCheck> {
    remove_tree(work)?;
    fs::create_dir_all(work)?;
    let img = work.join("image.img");
    copy_sparse(image, &img)?;

    // The oracle.
    let e = work.join("e2fsck.img");
    copy_sparse(image, &e)?;
    let rep = e2fsck_replay(&e)?;
    let still = dumpe2fs_header(&e)
        .map(|d| header_field(&d, "Filesystem features:").contains("needs_recovery"))
        .unwrap_or(true);
    let refused = rep.code >= 8 || still;
    let e_clean = if refused { None } else { Some(e2fsck_fn(&e)?) };
    let e2fsck = format!(
        "exit {}{}",
        rep.code,
        match &e_clean {
            None => ", gave up".to_string(),
            Some(Ok(())) => ", clean".to_string(),
            Some(Err(_)) => ", errors left".to_string(),
        }
    );
    let opts = journal_compare_opts();
    let oracle = work.join("oracle");
    let mut lenient = false;
    if !refused {
        match kernel_tree(&e, &oracle, "ro") {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => {
                remove_tree(&oracle)?;
                crate::image::debugfs_rdump(&e, &oracle).or_else(|err| {
                    // rdump reports unreadable entries but copies the rest.
                    if oracle.exists() {
                        Ok(())
                    } else {
                        Err(err)
                    }
                })?;
                lenient = true;
            }
        }
    }

    // ext4kit's read-only view.
    let out = work.join("ours");
    let (ok, msg) = ext4kit_cmd(bin, &["get".as_ref(), img.as_os_str(), "/".as_ref(), out.as_os_str()])?;
    let replayed = if refused {
        if ok {
            Verdict::bad(
                "read, e2fsck gave up",
                vec![format!("e2fsck gave up ({}):\n{}", rep.code, rep.output)],
            )
        } else {
            Verdict::ok("both refuse")
        }
    } else if !ok && !out.exists() {
        Verdict::bad("refused", vec![msg])
    } else {
        let d = if lenient {
            crate::image::compare_rdump(&out, &oracle)?
        } else {
            compare_trees(&oracle, &out, &opts)?
        };
        if d.is_empty() && ok {
            Verdict::ok(if lenient { "yes (rdump)" } else { "yes" })
        } else {
            let mut det: Vec<String> = d.iter().take(30).map(|x| x.to_string()).collect();
            if !ok {
                det.insert(0, msg);
            }
            Verdict::bad(format!("NO ({} differences)", d.len()), det)
        }
    };
    let recovery_changes_tree = if refused || lenient {
        None
    } else {
        let u = work.join("unreplayed.img");
        copy_sparse(image, &u)?;
        let ut = work.join("unreplayed");
        match kernel_tree(&u, &ut, "ro,noload") {
            Ok(None) => Some(!compare_trees(&oracle, &ut, &opts)?.is_empty()),
            _ => None,
        }
    };
    let unchanged = match first_difference(image, &img)? {
        None => Verdict::ok("yes"),
        Some(off) => Verdict::bad(format!("NO (byte {off})"), vec![]),
    };

    // Read-write.
    let rw_img = work.join("rw.img");
    copy_sparse(image, &rw_img)?;
    let (ok, msg) = ext4kit_cmd(bin, &["mkdir".as_ref(), rw_img.as_os_str(), "/after-replay".as_ref()])?;
    let rw = match (&e_clean, ok) {
        (None, false) => Verdict::ok("both refuse"),
        (None, true) => Verdict::bad("opened, e2fsck gave up", vec![msg]),
        // Refusing to write where the kernel's mount refuses too (a
        // journal it cannot recover: "run e2fsck") is the kernel's outcome.
        (Some(_), false) => match kernel_refuses_rw(image, work)? {
            Some(why) => Verdict {
                ok: true,
                text: "refused, as the kernel".to_string(),
                details: vec![msg, format!("the kernel's read-write mount: {why}")],
            },
            None => Verdict::bad("refused", vec![msg]),
        },
        (Some(want), true) => match (e2fsck_fn(&rw_img)?, want) {
            (Ok(()), _) => Verdict::ok("clean"),
            (Err(_), Err(_)) => Verdict::ok("unclean, as e2fsck's"),
            (Err(out), Ok(())) => Verdict::bad("NOT CLEAN", vec![out]),
        },
    };
    Ok(ImageCheck {
        e2fsck,
        replayed,
        unchanged,
        rw,
        recovery_changes_tree,
    })
}

/// Why the kernel refuses a read-write loop mount of a copy of `image`, or
/// None if it mounts it (or cannot be asked: not root).
fn kernel_refuses_rw(image: &Path, work: &Path) -> io::Result<Option<String>> {
    if kernel_available().is_err() {
        return Ok(None);
    }
    let k = work.join("kernel-rw.img");
    copy_sparse(image, &k)?;
    let mnt = work.join("mnt-kernel-rw");
    let r = match LoopMount::mount_with(&k, &mnt, "ext4", "rw") {
        Ok(m) => {
            m.unmount()?;
            None
        }
        Err(e) => Some(e.to_string().lines().last().unwrap_or("").trim().to_string()),
    };
    let _ = fs::remove_dir(&mnt);
    Ok(r)
}

/// Differences between a tree and the oracle plus one new empty directory
/// `new_dir` at the root (whose mtime changes with it): what remains is
/// wrong.
pub fn diffs_beyond_new_dir(
    oracle: &Path,
    actual: &Path,
    new_dir: &[u8],
    opts: &CompareOpts,
) -> io::Result<Vec<Difference>> {
    let d = compare_trees(oracle, actual, opts)?;
    let mut found = false;
    let mut rest = Vec::new();
    for x in d {
        match &x.kind {
            DiffKind::Extra if x.path == new_dir => found = true,
            DiffKind::Mtime { .. } if x.path.is_empty() => {}
            _ => rest.push(x),
        }
    }
    if !found {
        rest.push(Difference {
            path: new_dir.to_vec(),
            kind: DiffKind::Missing,
        });
    } else if !fs::symlink_metadata(crate::util::join_bytes(actual, new_dir)).is_ok_and(|m| m.is_dir()) {
        rest.push(Difference {
            path: new_dir.to_vec(),
            kind: DiffKind::Error {
                message: "not a directory".to_string(),
            },
        });
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_lists_use_ranges_in_order() {
        assert_eq!(block_list([1, 2, 3, 7, 9, 10, 4]), "1-3,7,9-10,4");
        assert_eq!(block_list([]), "");
    }

    #[test]
    fn logdump_summary_parses() {
        let log = "Journal starts at block 413, transaction 90\n\
Found expected sequence 90, type 1 (descriptor block) at block 413\n\
Dumping descriptor block, sequence 90, at block 413:\n\
  FS block 25 logged at journal block 414 (flags 0x0)\n\
  FS block 1554 logged at journal block 415 (flags 0xb)\n\
Found expected sequence 90, type 2 (commit block) at block 416\n\
Found expected sequence 91, type 5 (revoke table) at block 1\n\
Dumping revoke block, sequence 91, at block 1:\n\
  Revoke FS block 7014\n\
  Revoke FS block 7009\n\
Found expected sequence 91, type 2 (commit block) at block 2\n\
No magic number at block 3: end of journal.\n\
\n\
*** Fast Commit Area ***\n\
tag HEAD, features 0x0, tid 92\n\
tag ADD_RANGE, inode 15, lblk 0, pblk 2086, len 1\n\
tag CREAT_DENTRY, parent 14, ino 17, name \"new\"\n\
tag TAIL, tid 92\n";
        let s = LogSummary::parse(log);
        assert_eq!(s.start, 413);
        assert_eq!(s.commits, 2);
        assert_eq!(s.revoke_blocks, 1);
        assert_eq!(s.revoked, [7009, 7014].into_iter().collect());
        assert_eq!(s.logged, [25, 1554].into_iter().collect());
        assert_eq!(s.escaped, 1);
        assert!(s.wrapped);
        assert_eq!(s.fc_tags, vec!["ADD_RANGE", "CREAT_DENTRY"]);
    }

    #[test]
    fn every_spec_name_is_unique() {
        let specs = journal_specs();
        let names: BTreeSet<_> = specs.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), specs.len());
    }
}
