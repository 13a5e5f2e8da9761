//! [`Fs`], the library's API: one handle on an open filesystem, whose
//! methods are the whole contract a frontend (the FUSE mount, the CLI, a
//! program) uses. Each method is a thin call into the module that does
//! the work, named as the kernel names it — `namespace::mkdir_at`,
//! `io::write_inode`, `rename::rename_at` — on the filesystem's state,
//! [`SuperBlock`] (the volume, the caches, the holds, the mount's flags).
//! A reader looking for an operation finds it by its file name; this file
//! only lists them. The calls are `#[inline]`: going through the facade
//! costs nothing over calling the module.

use std::path::Path;
use std::sync::Arc;

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::inode::{FileType, Inode};

use super::acl_inherit::CreateMode;
use super::attr::{SetAttr, StatFs, TimeSet};
use super::by_ino::PermCheck;
use super::cred::{Caller, Cred};
use super::dcache::Dentry;
use super::fiemap::DataLayout;
use super::file::{File, OpenFlags, Whence};
use super::holds::Holds;
use super::icache::CachedInode;
use super::iflags::FsXattr;
use super::mount::MountRecord;
use super::rename::RenameFlags;
use super::request::{Fallocate, WriteRequest, Written};
use super::stat::{FsInfo, FsStats, Stat};
use super::super_block::SuperBlock;
use super::writeback::{SyncLevel, WritebackStats};
use super::{
    acl, attr, by_ino, evict, fiemap, fslabel, iflags, io, lookup, mount, namei, namespace, open, read, read_write,
    readdir, rename, stat, whiteout, write, writeback, xattr_ops,
};
use crate::error::{Error, Result};
use crate::ext4::reservation::Reserver;
use crate::ext4::{DirEntry, OpenOptions, Volume};

/// An open filesystem. `Send + Sync`: share it between threads with `Arc`.
///
/// Every filesystem rule is applied by its methods — permissions,
/// immutable and append-only, the setuid/setgid/capability kill, ACL
/// inheritance, synchronous inodes and directories, the mount state — so
/// a program calling it gets what the FUSE mount gives.
///
/// Dropping the last handle writes back what is dirty, as an unmount does:
/// committed metadata waits for a checkpoint, and a library user who never
/// calls [`Fs::sync`] must not lose it. Nothing is written when nothing is
/// dirty (a read-write open that only read leaves the image's bytes
/// alone). A drop cannot return an error, so a failure is printed.
#[derive(Debug)]
pub struct Fs {
    sb: SuperBlock,
}

impl Drop for Fs {
    fn drop(&mut self) {
        mount::close(&mut self.sb);
    }
}

impl Fs {
    fn new(sb: SuperBlock) -> Arc<Fs> {
        Arc::new(Fs { sb })
    }

    /// The state under the API, for the unit tests beside the modules.
    #[cfg(test)]
    pub(crate) fn sb(&self) -> &SuperBlock {
        &self.sb
    }

    // ---- Opening, the filesystem as a whole, closing (dropping the last handle closes: `mount::close`) ----

    /// Open an image file (or the partition or offset of it that
    /// `opts.location` names).
    ///
    /// Opening a partitioned disk whole fails with a message listing its
    /// partitions (see [`crate::device::partitions`]).
    #[inline]
    pub fn open_image(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Arc<Fs>> {
        open::open_image(path.as_ref(), opts).map(Fs::new)
    }

    /// Open the filesystem on any block device, recovering what a crash
    /// left: the journal is replayed, then fast commits, then the orphan
    /// list is finished (`ext4_fill_super`'s order). A read-only open
    /// recovers into memory and leaves the device as it was.
    ///
    /// A read-write open of a filesystem that must not be written (features
    /// we cannot maintain, `mmp`), or of a read-only device, is decided
    /// before recovery writes anything: it opens read-only, with the reason
    /// as a warning and in [`Fs::read_only_reason`].
    #[inline]
    pub fn open_device(dev: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<Arc<Fs>> {
        open::open_device(dev, opts).map(Fs::new)
    }

    /// Whether the filesystem is open read-only (asked for, or decided at
    /// the open: [`Fs::read_only_reason`]).
    #[inline]
    pub fn read_only(&self) -> bool {
        mount::read_only(&self.sb)
    }

    /// Why a read-write open became read-only (a feature we cannot write,
    /// `mmp`, a read-only device); `None` when it did not, or read-only
    /// was asked for.
    #[inline]
    pub fn read_only_reason(&self) -> Option<&str> {
        self.sb.read_only_reason()
    }

    /// Warnings from opening (read-only fallbacks, journal recovery).
    #[inline]
    pub fn warnings(&self) -> &[String] {
        self.sb.vol().warnings()
    }

    /// Record a read-write mount at `mount_point` in the superblock (see
    /// the module doc) and write it. Returns what
    /// [`Fs::record_unmount`] restores, and `ext4_setup_super`'s warnings.
    #[inline]
    pub fn record_mount(&self, mount_point: &[u8]) -> Result<(MountRecord, Vec<String>)> {
        mount::record_mount(&self.sb, mount_point)
    }

    /// The clean unmount's superblock: everything is flushed
    /// ([`Fs::sync`]), then `s_state` is what it was at mount and
    /// `s_wtime` now.
    #[inline]
    pub fn record_unmount(&self, m: MountRecord) -> Result<()> {
        mount::record_unmount(&self.sb, m)
    }

    /// sync(2): write back every dirty page and inode, write the
    /// superblock's summary counters, and make it all durable *and home*:
    /// with a journal, the running transaction is committed, everything is
    /// checkpointed and the log emptied, so that the image file is complete
    /// on its own (no replay needed) — what a program building an image
    /// expects of `sync` — which is more than the kernel's `ext4_sync_fs`
    /// (a commit); fsync and fdatasync commit only. Without a journal, a
    /// checkpoint of every dirty metadata block. Then the device is
    /// flushed.
    ///
    /// A file whose data cannot be written back (an I/O error on the image)
    /// does not stop the rest: everything else is still committed and
    /// written home, and the first failure is returned at the end — one
    /// file's failure never costs another file's metadata.
    #[inline]
    pub fn sync(&self) -> Result<()> {
        write::sync(&self.sb)
    }

    /// A summary of the superblock (what `ext4kit info` prints).
    #[inline]
    pub fn info(&self) -> FsInfo {
        stat::info(&self.sb)
    }

    /// Filesystem-wide counts (`statfs(2)`), from the group descriptors'
    /// live counts rather than the superblock's (which are only brought up
    /// to date by `sync`).
    #[inline]
    pub fn statfs(&self) -> Result<StatFs> {
        attr::statfs(&self.sb)
    }

    /// The label: `s_volume_name` up to its first NUL (at most 16 bytes).
    #[inline]
    pub fn fs_label(&self) -> Vec<u8> {
        fslabel::fs_label(&self.sb)
    }

    /// Set the label to `label` (up to its first NUL) for `cred`, in
    /// `ext4_ioctl_setlabel`'s order: EPERM unless root (CAP_SYS_ADMIN),
    /// EINVAL if longer than 16 bytes, EROFS on a read-only filesystem.
    #[inline]
    pub fn set_fs_label(&self, label: &[u8], cred: &Cred) -> Result<()> {
        fslabel::set_fs_label(&self.sb, label, cred)
    }

    /// Bytes per block (what `st_blksize` advertises).
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.sb.vol().block_size() as u32
    }

    /// Counters the tests and benchmarks look at.
    #[inline]
    pub fn stats(&self) -> FsStats {
        stat::stats(&self.sb)
    }

    /// The ext4 layer under this filesystem, for tools that inspect the
    /// on-disk structures: tests, benchmarks, the crash harness. A
    /// frontend needs none of it — every filesystem rule is applied by
    /// `Fs`'s own methods, and a change made on the volume directly
    /// bypasses both the rules and the caches above it.
    #[inline]
    pub fn volume(&self) -> &Volume {
        self.sb.vol()
    }

    // ---- Names: path walk, lookups, attributes and listings ----

    /// Resolve `path` (absolute, or relative to the root) to its dentry.
    /// With `follow`, a symlink in the last component is followed too.
    ///
    /// The whole walk runs under one pin of the dentry cache and keeps the
    /// chain of directories it went through as *borrowed* dentries: no lock
    /// and no reference count is touched on `/`, `/usr`, ... Only the final
    /// dentry is cloned for the caller.
    #[inline]
    pub fn resolve(&self, path: &[u8], follow: bool) -> Result<Arc<Dentry>> {
        namei::resolve(&self.sb, path, follow)
    }

    /// The inode `name` refers to in directory inode `dir_ino`, with its
    /// type; `None` when the name does not exist. "." and ".." are looked up
    /// like any other name (they are real entries in ext4 directories).
    ///
    /// Errors: ENOTDIR when `dir_ino` is not a directory, ENAMETOOLONG for a
    /// name longer than 255 bytes, EINVAL for an empty name or one with '/'.
    #[inline]
    pub fn lookup_at(&self, dir_ino: u32, name: &[u8]) -> Result<Option<(u32, FileType)>> {
        lookup::lookup_at(&self.sb, dir_ino, name)
    }

    /// Build the absolute path of a dentry (the kernel's `d_path`, built
    /// without a global lock).
    #[inline]
    pub fn d_path(&self, d: &Arc<Dentry>) -> Vec<u8> {
        self.sb.dcache().d_path(d)
    }

    /// The in-memory inode `ino` (read from disk if not cached).
    #[inline]
    pub fn inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        self.sb.inode(ino)
    }

    /// Attributes of `path`, following a final symlink.
    #[inline]
    pub fn stat(&self, path: &[u8]) -> Result<Stat> {
        stat::stat(&self.sb, path)
    }

    /// Attributes of `path` itself (a final symlink is not followed).
    #[inline]
    pub fn lstat(&self, path: &[u8]) -> Result<Stat> {
        stat::lstat(&self.sb, path)
    }

    /// Attributes of inode `ino`.
    #[inline]
    pub fn stat_ino(&self, ino: u32) -> Result<Stat> {
        stat::stat_ino(&self.sb, ino)
    }

    /// The attributes of the inode a file handle names (`name_to_handle_at`,
    /// NFS export: a frontend's handles are inode numbers), checked as
    /// ext4's `ext4_nfs_get_inode` checks them before anything is read for
    /// a number that came from a user: ESTALE for a reserved inode other
    /// than the root, a number past `s_inodes_count`, or an inode that is
    /// free or unlinked (no links); the record is read without caching
    /// first, so a free inode's never enters the inode cache (`ext4_iget`).
    #[inline]
    pub fn stat_by_handle(&self, ino: u32) -> Result<Stat> {
        by_ino::stat_by_handle(&self.sb, ino)
    }

    /// Entries of the directory at `path` ("." and ".." included).
    #[inline]
    pub fn read_dir(&self, path: &[u8]) -> Result<Vec<DirEntry>> {
        readdir::read_dir(&self.sb, path)
    }

    /// Entries of directory inode `ino`.
    #[inline]
    pub fn read_dir_ino(&self, ino: u32) -> Result<Vec<DirEntry>> {
        readdir::read_dir_ino(&self.sb, ino)
    }

    /// Target of the symlink at `path`.
    #[inline]
    pub fn read_link(&self, path: &[u8]) -> Result<Vec<u8>> {
        namei::read_link(&self.sb, path)
    }

    /// Target of symlink inode `ino`.
    #[inline]
    pub fn read_link_ino(&self, ino: u32) -> Result<Vec<u8>> {
        namei::read_link_ino(&self.sb, ino)
    }

    /// Where inode `ino`'s data lives.
    #[inline]
    pub fn data_layout(&self, ino: u32) -> Result<DataLayout> {
        fiemap::data_layout(&self.sb, ino)
    }

    /// `access(2)` on `path` (following symlinks).
    #[inline]
    pub fn access(&self, path: &[u8], mask: u8, cred: &Cred) -> Result<()> {
        attr::access(&self.sb, path, mask, cred)
    }

    /// `access(2)` on inode `ino`: `mask` is MAY_* bits (0 checks
    /// existence only). EACCES when refused; EROFS for a write check on a
    /// read-only filesystem (regular files, directories, symlinks).
    #[inline]
    pub fn access_ino(&self, ino: u32, mask: u8, cred: &Cred) -> Result<()> {
        attr::access_ino(&self.sb, ino, mask, cred)
    }

    /// `generic_permission` with ACLs: whether `cred` may access inode
    /// `ino` (record `inode`, which the caller has locked) for `mask`
    /// (MAY_* bits). Root and the owner are decided by the mode alone; for
    /// others, an access ACL replaces the group class when the mode has
    /// group bits (`acl_permission_check`).
    #[inline]
    pub fn permission(&self, ino: u32, inode: &Inode, mask: u8, cred: &Cred) -> Result<bool> {
        acl::permission(&self.sb, ino, inode, mask, cred)
    }

    // ---- Namespace changes: create, mkdir, unlink, rmdir, link, rename ----

    /// Create an empty regular file (`open(O_CREAT|O_EXCL)` without the open).
    #[inline]
    pub fn create(&self, path: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Stat> {
        write::create(&self.sb, path, perm, uid, gid)
    }

    /// Create a file, fifo, socket or device node owned by `uid`:`gid`
    /// (image building: no permission check).
    #[inline]
    pub fn mknod(&self, path: &[u8], ftype: FileType, perm: u16, uid: u32, gid: u32, rdev: (u32, u32)) -> Result<Stat> {
        write::mknod(&self.sb, path, ftype, perm, uid, gid, rdev)
    }

    /// Create a file, fifo, socket or device node `name` in directory
    /// `parent`, owned by the caller (or the directory's group when it is
    /// set-group-id).
    ///
    /// `perm` is the requested mode; with a umask ([`CreateMode`]) it is
    /// applied unless the parent's default ACL is inherited instead
    /// (`vfs::acl_inherit`). A directory with the dirsync flag (or a
    /// `sync`/`dirsync` filesystem) has the change durable at the return.
    #[inline]
    pub fn mknod_at(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        perm: impl Into<CreateMode>,
        rdev: (u32, u32),
        cred: &Cred,
    ) -> Result<Stat> {
        write::mknod_at(&self.sb, parent, name, ftype, perm, rdev, cred)
    }

    /// [`Fs::mknod_at`] with an explicit owner: image building copies
    /// owners from a source tree while acting with `cred`'s rights.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn mknod_owned(
        &self,
        parent: u32,
        name: &[u8],
        ftype: FileType,
        perm: impl Into<CreateMode>,
        rdev: (u32, u32),
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        write::mknod_owned(&self.sb, parent, name, ftype, perm, rdev, cred, owner)
    }

    /// Create a symbolic link at `path` pointing to `target`.
    #[inline]
    pub fn symlink(&self, target: &[u8], path: &[u8], uid: u32, gid: u32) -> Result<Stat> {
        write::symlink(&self.sb, target, path, uid, gid)
    }

    /// Create symbolic link `name` in directory `parent` pointing to
    /// `target`: a fast symlink (target in `i_block`) under 60 bytes, else
    /// one data block, as the kernel does.
    #[inline]
    pub fn symlink_at(&self, parent: u32, name: &[u8], target: &[u8], cred: &Cred) -> Result<Stat> {
        write::symlink_at(&self.sb, parent, name, target, cred)
    }

    /// [`Fs::symlink_at`] with an explicit owner (image building).
    #[inline]
    pub fn symlink_owned(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        write::symlink_owned(&self.sb, parent, name, target, cred, owner)
    }

    /// Create a regular file at `path` holding `data` (an interim entry
    /// point for image building until `pwrite` through the page cache
    /// lands; it uses the same allocation and mapping code writeback will).
    #[inline]
    pub fn write_file(&self, path: &[u8], data: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Stat> {
        write::write_file(&self.sb, path, data, perm, uid, gid)
    }

    /// `mkdir(2)`.
    #[inline]
    pub fn mkdir(&self, path: &[u8], perm: impl Into<CreateMode>, cred: &Cred) -> Result<Stat> {
        namespace::mkdir(&self.sb, path, perm, cred)
    }

    /// Create directory `name` in directory `parent` (the mode as for
    /// [`Fs::mknod_at`]: a umask, or the parent's default ACL).
    #[inline]
    pub fn mkdir_at(&self, parent: u32, name: &[u8], perm: impl Into<CreateMode>, cred: &Cred) -> Result<Stat> {
        namespace::mkdir_at(&self.sb, parent, name, perm, cred)
    }

    /// [`Fs::mkdir_at`] with an explicit owner: image building copies owners
    /// from a source tree while acting with `cred`'s rights.
    #[inline]
    pub fn mkdir_owned(
        &self,
        parent: u32,
        name: &[u8],
        perm: impl Into<CreateMode>,
        cred: &Cred,
        owner: Option<(u32, u32)>,
    ) -> Result<Stat> {
        namespace::mkdir_owned(&self.sb, parent, name, perm, cred, owner)
    }

    /// `unlink(2)`.
    #[inline]
    pub fn unlink(&self, path: &[u8], cred: &Cred) -> Result<()> {
        namespace::unlink(&self.sb, path, cred)
    }

    /// Remove the name `name` (not a directory) from directory `parent`; the
    /// inode dies with its last link, or at its last close if still open.
    #[inline]
    pub fn unlink_at(&self, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
        namespace::unlink_at(&self.sb, parent, name, cred)
    }

    /// `rmdir(2)`.
    #[inline]
    pub fn rmdir(&self, path: &[u8], cred: &Cred) -> Result<()> {
        namespace::rmdir(&self.sb, path, cred)
    }

    /// Remove the empty directory `name` from directory `parent`.
    #[inline]
    pub fn rmdir_at(&self, parent: u32, name: &[u8], cred: &Cred) -> Result<()> {
        namespace::rmdir_at(&self.sb, parent, name, cred)
    }

    /// `link(2)`: `new_path` becomes another name of `old_path` (not followed
    /// if a symlink, as Linux `link` does).
    #[inline]
    pub fn link(&self, old_path: &[u8], new_path: &[u8], cred: &Cred) -> Result<Stat> {
        namespace::link(&self.sb, old_path, new_path, cred)
    }

    /// Give inode `ino` (not a directory) another name: `name` in `parent`.
    #[inline]
    pub fn link_at(&self, ino: u32, parent: u32, name: &[u8], cred: &Cred) -> Result<Stat> {
        namespace::link_at(&self.sb, ino, parent, name, cred)
    }

    /// `renameat2(2)`.
    #[inline]
    pub fn rename(&self, old_path: &[u8], new_path: &[u8], flags: RenameFlags, cred: &Cred) -> Result<()> {
        rename::rename(&self.sb, old_path, new_path, flags, cred)
    }

    /// Rename `old_name` in `old_dir` to `new_name` in `new_dir`; durable
    /// at the return when either directory is dirsync (`ext4_rename`'s
    /// `ext4_handle_sync`, `vfs::syncmode`).
    #[inline]
    pub fn rename_at(
        &self,
        old_dir: u32,
        old_name: &[u8],
        new_dir: u32,
        new_name: &[u8],
        flags: RenameFlags,
        cred: &Cred,
    ) -> Result<()> {
        rename::rename_at(&self.sb, old_dir, old_name, new_dir, new_name, flags, cred)
    }

    /// Rename `old_name` in `old_dir` to `new_name` in `new_dir` and leave
    /// a whiteout at the old name (see the module comment). `noreplace`:
    /// EEXIST when the target exists, as `RENAME_NOREPLACE`.
    #[inline]
    pub fn rename_whiteout(
        &self,
        old_dir: u32,
        old_name: &[u8],
        new_dir: u32,
        new_name: &[u8],
        noreplace: bool,
        cred: &Cred,
    ) -> Result<()> {
        whiteout::rename_whiteout(&self.sb, old_dir, old_name, new_dir, new_name, noreplace, cred)
    }

    // ---- Open files: open, the calls on a description, close ----

    /// Open `path` as root (no permission checks; new files get mode 0644
    /// owned by root). See [`Fs::open_as`] for the flags.
    #[inline]
    pub fn open(&self, path: &[u8], flags: OpenFlags) -> Result<Arc<File>> {
        io::open_as(&self.sb, path, flags, 0o644, &Cred::root())
    }

    /// open(2): resolve `path` (creating a regular file with `mode` for
    /// O_CREAT), check `cred`'s permissions, apply O_TRUNC, and return the
    /// open file description.
    #[inline]
    pub fn open_as(&self, path: &[u8], flags: OpenFlags, mode: u16, cred: &Cred) -> Result<Arc<File>> {
        io::open_as(&self.sb, path, flags, mode, cred)
    }

    /// Open inode `ino` directly (no path, so no dentry) as root: for
    /// tools that walk the tree by inode numbers.
    #[inline]
    pub fn open_ino(&self, ino: u32, flags: OpenFlags) -> Result<Arc<File>> {
        by_ino::open_ino(&self.sb, ino, flags)
    }

    /// `open(2)` of inode `ino` by `cred` with `flags` (O_CREAT/O_EXCL are
    /// ignored: the inode exists). Applies O_TRUNC to regular files.
    #[inline]
    pub fn open_ino_as(&self, ino: u32, flags: OpenFlags, cred: &Cred, check: PermCheck) -> Result<Arc<File>> {
        by_ino::open_ino_as(&self.sb, ino, flags, cred, check)
    }

    /// `open(O_CREAT)` of `name` in directory `parent`: create a regular
    /// file with mode `perm` (a umask, or the parent's default ACL, as for
    /// [`Fs::mknod_at`]) owned by `cred` (or the directory's group when it
    /// is set-group-id),
    /// then open it. When the name exists, O_EXCL gives EEXIST and
    /// otherwise the existing file is opened (with the permission check a
    /// plain open makes), as `open(2)` does after losing a creation race.
    /// Returns the attributes and the open file.
    #[inline]
    pub fn create_open_at(
        &self,
        parent: u32,
        name: &[u8],
        perm: impl Into<CreateMode>,
        flags: OpenFlags,
        cred: &Cred,
        check: PermCheck,
    ) -> Result<(Stat, Arc<File>)> {
        by_ino::create_open_at(&self.sb, parent, name, perm, flags, cred, check)
    }

    /// `open(O_TMPFILE)` in directory `parent` (`vfs_tmpfile` →
    /// `ext4_tmpfile`, then the open): a regular file with mode `perm` (a
    /// umask, or the parent's default ACL) and no name, open with `flags`
    /// (its access mode; O_CREAT, O_EXCL, O_TRUNC and O_DIRECTORY are the
    /// caller's to strip). With `linkable` (the open had no O_EXCL) a later
    /// [`Fs::link_at`] may name it; otherwise its last close frees it.
    /// Close it with [`Fs::close_file`].
    #[inline]
    pub fn tmpfile_open_at(
        &self,
        parent: u32,
        perm: impl Into<CreateMode>,
        flags: OpenFlags,
        linkable: bool,
        cred: &Cred,
    ) -> Result<(Stat, Arc<File>)> {
        by_ino::tmpfile_open_at(&self.sb, parent, perm, flags, linkable, cred)
    }

    /// read(2) through `file`: at its position, which moves past what was
    /// read. Concurrent reads on one description may overlap (POSIX leaves
    /// that unspecified for threads); each is atomic with respect to the
    /// data it returns.
    #[inline]
    pub fn read(&self, file: &File, buf: &mut [u8]) -> Result<usize> {
        read_write::read(&self.sb, file, buf)
    }

    /// pread(2): read through `file` at `off` without touching its position.
    #[inline]
    pub fn pread(&self, file: &File, off: u64, buf: &mut [u8]) -> Result<usize> {
        read_write::pread(&self.sb, file, off, buf)
    }

    /// lseek(2) on `file`'s position (lock-free: no lock for SET/CUR, the
    /// atomic size for END; SEEK_DATA and SEEK_HOLE ask the block map).
    #[inline]
    pub fn lseek(&self, file: &File, off: i64, whence: Whence) -> Result<u64> {
        read_write::lseek(&self.sb, file, off, whence)
    }

    /// write(2) through `file`: at its position (at the end of file,
    /// atomically, for O_APPEND), which moves past what was written. The
    /// write is its opener's (see [`Fs::write_inode`] for the rules).
    #[inline]
    pub fn write(&self, file: &File, buf: &[u8]) -> Result<usize> {
        read_write::write(&self.sb, file, buf)
    }

    /// pwrite(2): write through `file` at `off` without touching its
    /// position. As on Linux, an O_APPEND description appends whatever
    /// `off` says.
    #[inline]
    pub fn pwrite(&self, file: &File, off: u64, buf: &[u8]) -> Result<usize> {
        read_write::pwrite(&self.sb, file, off, buf)
    }

    /// ftruncate(2): EINVAL unless `file` is open for writing (as Linux).
    #[inline]
    pub fn ftruncate(&self, file: &File, len: u64) -> Result<()> {
        read_write::ftruncate(&self.sb, file, len)
    }

    /// fallocate(2) through `file` (see [`Fs::fallocate_inode`] for modes
    /// and errors).
    #[inline]
    pub fn fallocate(&self, file: &File, mode: u32, off: u64, len: u64) -> Result<()> {
        read_write::fallocate(&self.sb, file, mode, off, len)
    }

    /// fsync(2): dirty pages, then the inode record if dirty at any level,
    /// then the commit and a device flush.
    #[inline]
    pub fn fsync(&self, file: &File) -> Result<()> {
        read_write::fsync(&self.sb, file, false)
    }

    /// fdatasync(2): dirty pages, the inode record only if data-relevant
    /// fields changed (size, block map), then the commit and a device flush.
    #[inline]
    pub fn fdatasync(&self, file: &File) -> Result<()> {
        read_write::fsync(&self.sb, file, true)
    }

    /// Close an open file: drop this reference, and if it was the last open
    /// of an inode that has no name left, free the inode (the last close of
    /// an unlinked file). Frontends call this instead of just dropping the
    /// `Arc<File>`; a file dropped without it stays on the orphan list until
    /// the next open of the image frees it.
    #[inline]
    pub fn close_file(&self, file: Arc<super::File>) -> Result<()> {
        evict::close_file(&self.sb, file)
    }

    // ---- File data by inode: the page cache, truncate, fallocate, writeback ----

    /// Read file data of `inode` at `off` through the page cache; returns
    /// the bytes read (0 at or past end of file).
    #[inline]
    pub fn read_at(&self, inode: &CachedInode, off: u64, buf: &mut [u8]) -> Result<usize> {
        read::read_at(&self.sb, inode, off, buf)
    }

    /// Buffered write of `buf` at `off` (`None`: at the end of file, read
    /// under the lock — O_APPEND) by root. Returns (offset written at,
    /// bytes). See [`Self::write_inode`] for the rules.
    #[inline]
    pub fn write_at(&self, inode: &CachedInode, off: Option<u64>, buf: &[u8]) -> Result<(u64, usize)> {
        io::write_at(&self.sb, inode, off, buf)
    }

    /// The buffered write (`ext4_buffered_write_iter`): the data of `req`
    /// into the page cache, with the rules of the kernel's write path —
    /// immutable inodes refuse (EPERM); an append-only inode takes appends
    /// only ([`WriteAt::End`]; a write at an offset is EPERM, the rule
    /// `may_open` enforces for the kernel); setuid/setgid and a file
    /// capability are cleared first as `file_remove_privs` says
    /// (`vfs::killpriv`); mtime and ctime move; and the data is durable
    /// before the call returns when the open asked (O_SYNC, O_DSYNC), the
    /// inode is synchronous (`chattr +S`) or the filesystem was opened
    /// `sync` (`generic_write_sync`).
    ///
    /// Before a byte is accepted, the blocks it will need at writeback are
    /// claimed (delayed allocation's accounting, see `ext4::reservation`):
    /// with no room the write is short, or ENOSPC when nothing fits — never
    /// a loss discovered at writeback. The root reserve is for the callers
    /// [`Self::reserver`] names.
    #[inline]
    pub fn write_inode(&self, inode: &CachedInode, req: &WriteRequest<'_>) -> Result<Written> {
        io::write_inode(&self.sb, inode, req)
    }

    /// Whether a caller with `uid`/`gid` may use the blocks reserved for
    /// root (`s_r_blocks_count`): root, `s_def_resuid`, or `s_def_resgid`
    /// (`ext4_has_free_clusters`).
    #[inline]
    pub fn reserver(&self, uid: u32, gid: u32) -> Reserver {
        io::reserver(&self.sb, uid, gid)
    }

    /// Set the size of `inode` to `len` (truncate/ftruncate) on behalf of
    /// `caller`. Shrinking frees every whole block past the new end and
    /// zeroes the tail of the last partial block; growing only changes the
    /// size (the new range is a hole). As `do_truncate`: mtime and ctime
    /// are updated, setuid/setgid and a file capability cleared
    /// (`vfs::killpriv`); append-only and immutable inodes refuse (EPERM);
    /// a synchronous inode or filesystem commits before the return
    /// (`ext4_truncate`'s `ext4_handle_sync`). Returns whether
    /// setuid/setgid were cleared.
    #[inline]
    pub fn truncate_inode(&self, inode: &CachedInode, len: u64, caller: &Caller<'_>) -> Result<bool> {
        io::truncate_inode(&self.sb, inode, len, caller)
    }

    /// fallocate(2) on `inode`: `mode` 0 (allocate, extend the size),
    /// [`FALLOC_FL_KEEP_SIZE`], [`FALLOC_FL_PUNCH_HOLE`] (with KEEP_SIZE) or
    /// [`FALLOC_FL_ZERO_RANGE`] (optionally with KEEP_SIZE).
    ///
    /// Errors as the kernel's `vfs_fallocate` / `ext4_fallocate`: EINVAL
    /// for an empty range; EOPNOTSUPP for unknown mode bits, PUNCH_HOLE
    /// without KEEP_SIZE, PUNCH_HOLE with ZERO_RANGE, and ZERO_RANGE on an
    /// indirect-mapped file (no unwritten state there); EFBIG past the
    /// largest file size. On indirect-mapped files plain allocation is done
    /// by writing zeros into the new blocks (what glibc's posix_fallocate
    /// emulation does), hole punching works as on extent files.
    ///
    /// On behalf of `caller`: setuid/setgid and a file capability are
    /// cleared first, for every mode (`ext4_fallocate` → `file_modified`),
    /// and a synchronous inode or filesystem commits before the return.
    /// Returns whether setuid/setgid were cleared.
    #[inline]
    pub fn fallocate_inode(&self, inode: &CachedInode, req: Fallocate, caller: &Caller<'_>) -> Result<bool> {
        io::fallocate_inode(&self.sb, inode, req, caller)
    }

    /// The error of a background write-back of `inode` that failed since
    /// the last report (an I/O error on the image: memory pressure or the
    /// periodic flush wrote its pages), taken: the kernel's
    /// `filemap_check_errors` at close, which reports it once.
    #[inline]
    pub fn take_writeback_error(&self, inode: &CachedInode) -> Option<Error> {
        io::take_writeback_error(inode)
    }

    /// Write back inode `inode`: dirty pages, then the record as `level`
    /// requires. Does not flush the device (fsync does).
    #[inline]
    pub fn writeback_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        writeback::writeback_inode(&self.sb, inode, level)
    }

    /// Write back every dirty inode (sync(2), and memory pressure). Tries
    /// them all and reports the first failure.
    #[inline]
    pub fn writeback_all(&self) -> Result<()> {
        writeback::writeback_all(&self.sb)
    }

    /// fsync (`data_only: false`) or fdatasync (`true`) of one inode:
    /// write back its dirty pages, its record as the level requires, the
    /// committed metadata, then flush the device cache.
    #[inline]
    pub fn fsync_inode(&self, inode: &CachedInode, data_only: bool) -> Result<WritebackStats> {
        writeback::fsync_inode(&self.sb, inode, data_only)
    }

    // ---- Attributes and flags ----

    /// Change attributes of inode `ino` on behalf of `cred` (see the module
    /// comment for the rules). Returns the new attributes.
    #[inline]
    pub fn setattr_ino(&self, ino: u32, attr: &SetAttr, cred: &Cred) -> Result<Stat> {
        attr::setattr_ino(&self.sb, ino, attr, cred)
    }

    /// `chmod(2)`: set the permission bits of `path` (following symlinks).
    #[inline]
    pub fn chmod(&self, path: &[u8], mode: u16, cred: &Cred) -> Result<Stat> {
        attr::chmod(&self.sb, path, mode, cred)
    }

    /// `chown(2)` (`follow`) or `lchown(2)` (`!follow`): `None` leaves the
    /// owner or group unchanged (the syscalls' -1).
    #[inline]
    pub fn chown(&self, path: &[u8], uid: Option<u32>, gid: Option<u32>, follow: bool, cred: &Cred) -> Result<Stat> {
        attr::chown(&self.sb, path, uid, gid, follow, cred)
    }

    /// `utimensat(2)`: `None` is `UTIME_OMIT`; `follow` false is
    /// `AT_SYMLINK_NOFOLLOW`.
    #[inline]
    pub fn utimens(
        &self,
        path: &[u8],
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
        follow: bool,
        cred: &Cred,
    ) -> Result<Stat> {
        attr::utimens(&self.sb, path, atime, mtime, follow, cred)
    }

    /// `FS_IOC_GETFLAGS`: inode `ino`'s user-visible flags.
    #[inline]
    pub fn get_flags_ino(&self, ino: u32) -> Result<u32> {
        iflags::get_flags_ino(&self.sb, ino)
    }

    /// `FS_IOC_SETFLAGS` on inode `ino` by `cred` (see the module comment
    /// for the rules). Returns the new attributes.
    #[inline]
    pub fn set_flags_ino(&self, ino: u32, flags: u32, cred: &Cred) -> Result<Stat> {
        iflags::set_flags_ino(&self.sb, ino, flags, cred)
    }

    /// `FS_IOC_FSGETXATTR`: inode `ino`'s flags as a `struct fsxattr`
    /// (extent-size hints, extent count and project id 0: what ext4
    /// reports without the project feature).
    #[inline]
    pub fn get_xattr_flags_ino(&self, ino: u32) -> Result<FsXattr> {
        iflags::get_xattr_flags_ino(&self.sb, ino)
    }

    /// `FS_IOC_FSSETXATTR`: set the `FS_XFLAG_*` flags of `fa` on inode
    /// `ino` (`ext4_fileattr_set`). Extent-size hints are not ext4's
    /// (EINVAL), nor a project id without the project feature
    /// (EOPNOTSUPP); the flags as [`Fs::set_flags_ino`].
    #[inline]
    pub fn set_xflags_ino(&self, ino: u32, fa: &FsXattr, cred: &Cred) -> Result<Stat> {
        iflags::set_xflags_ino(&self.sb, ino, fa, cred)
    }

    // ---- Extended attributes ----

    /// Every extended attribute of `path` (not following a final symlink),
    /// without permission checks.
    #[inline]
    pub fn xattrs(&self, path: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        xattr_ops::xattrs(&self.sb, path)
    }

    /// Every extended attribute of inode `ino`, without permission checks.
    #[inline]
    pub fn xattrs_ino(&self, ino: u32) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        xattr_ops::xattrs_ino(&self.sb, ino)
    }

    /// One attribute's value (ENODATA when absent), without permission
    /// checks.
    #[inline]
    pub fn getxattr(&self, path: &[u8], name: &[u8]) -> Result<Vec<u8>> {
        xattr_ops::getxattr(&self.sb, path, name)
    }

    /// `setxattr(2)` (`follow`) / `lsetxattr(2)`.
    #[inline]
    pub fn setxattr(
        &self,
        path: &[u8],
        name: &[u8],
        value: &[u8],
        flags: u32,
        follow: bool,
        cred: &Cred,
    ) -> Result<()> {
        xattr_ops::setxattr(&self.sb, path, name, value, flags, follow, cred)
    }

    /// `removexattr(2)` (`follow`) / `lremovexattr(2)`.
    #[inline]
    pub fn removexattr(&self, path: &[u8], name: &[u8], follow: bool, cred: &Cred) -> Result<()> {
        xattr_ops::removexattr(&self.sb, path, name, follow, cred)
    }

    /// `getxattr(2)` (`follow`) / `lgetxattr(2)` with permission checks.
    #[inline]
    pub fn getxattr_as(&self, path: &[u8], name: &[u8], follow: bool, cred: &Cred) -> Result<Vec<u8>> {
        xattr_ops::getxattr_as(&self.sb, path, name, follow, cred)
    }

    /// `listxattr(2)` (`follow`) / `llistxattr(2)`.
    #[inline]
    pub fn listxattr(&self, path: &[u8], follow: bool, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        xattr_ops::listxattr(&self.sb, path, follow, cred)
    }

    /// Set attribute `name` of inode `ino` to `value` (`flags`:
    /// 0, XATTR_CREATE or XATTR_REPLACE). ACL values are in the Linux
    /// xattr format.
    #[inline]
    pub fn setxattr_ino(&self, ino: u32, name: &[u8], value: &[u8], flags: u32, cred: &Cred) -> Result<()> {
        xattr_ops::setxattr_ino(&self.sb, ino, name, value, flags, cred)
    }

    /// Remove attribute `name` of inode `ino` (ENODATA if absent).
    #[inline]
    pub fn removexattr_ino(&self, ino: u32, name: &[u8], cred: &Cred) -> Result<()> {
        xattr_ops::removexattr_ino(&self.sb, ino, name, cred)
    }

    /// The value of attribute `name` of inode `ino` (ENODATA if absent;
    /// ACLs in the Linux xattr format).
    #[inline]
    pub fn getxattr_ino(&self, ino: u32, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
        xattr_ops::getxattr_ino(&self.sb, ino, name, cred)
    }

    /// Names of inode `ino`'s attributes `cred` may see (trusted.* only for
    /// root, as `ext4_xattr_trusted_list`).
    #[inline]
    pub fn listxattr_ino(&self, ino: u32, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        xattr_ops::listxattr_ino(&self.sb, ino, cred)
    }

    // ---- Frontend holds and the end of an inode's life ----

    /// Keep `inode` allocated as an open file does, for a frontend that
    /// hands its number out and may be asked about it after its last name
    /// is gone. FUSE's lookup count is that: until FORGET the kernel may
    /// send requests for the node id, and were the inode freed and its
    /// number reused, they would reach another file (the kernel, seeing the
    /// id come back with a new generation, marks its inode bad: EIO,
    /// ESTALE, a missed ETXTBSY). Unlinked while held, it waits on the
    /// orphan list like an open file. Pair with [`Fs::drop_hold`] or
    /// [`Fs::drop_holds`].
    ///
    /// A hold is a count by inode number (`vfs::holds`), not a reference:
    /// a held inode that is clean, linked and not open may leave the inode
    /// cache, and its hold stays exact.
    ///
    /// ENOENT when the inode was freed meanwhile (a lookup that found the
    /// name just before an unlink freed it): the first hold is taken under
    /// the inode's lock, where `drop_link` decides between freeing and the
    /// orphan list, so either the unlink sees the hold or the hold sees the
    /// inode dead. Further holds on a held number take no inode lock (a
    /// held number cannot be freed; see `vfs::holds`).
    #[inline]
    pub fn hold_inode(&self, inode: &CachedInode) -> Result<()> {
        evict::hold_inode(&self.sb, inode)
    }

    /// Undo one [`Fs::hold_inode`]; the last hold or close of an inode that
    /// has no name left frees it.
    #[inline]
    pub fn drop_hold(&self, inode: &CachedInode) -> Result<()> {
        evict::drop_hold(&self.sb, inode)
    }

    /// Undo `n` [`Fs::hold_inode`]s of inode number `ino` (FUSE's
    /// `FORGET(ino, n)`; more than it has drops them all). The last hold
    /// of an inode that has no name left and is not open frees it.
    #[inline]
    pub fn drop_holds(&self, ino: u32, n: u64) -> Result<()> {
        evict::drop_holds(&self.sb, ino, n)
    }

    /// Drop every hold (a frontend's session ended: the kernel sends no
    /// FORGET for what it still had), freeing the unlinked inodes they
    /// kept. Tries them all and reports the first failure.
    #[inline]
    pub fn drop_all_holds(&self) -> Result<()> {
        evict::drop_all_holds(&self.sb)
    }

    /// The frontend holds of inode numbers (read-only view: counts, size).
    #[inline]
    pub fn holds(&self) -> &Arc<Holds> {
        self.sb.holds()
    }

    /// The last close of inode `inode`: if it has no name left, it leaves
    /// the orphan list and is freed.
    #[inline]
    pub fn release_unlinked(&self, inode: &CachedInode) -> Result<()> {
        evict::release_unlinked(&self.sb, inode)
    }

    /// Finish what the orphan list says was left half done, as the kernel
    /// does at mount (`ext4_orphan_cleanup`) and e2fsck does
    /// (`release_orphan_inodes`): an orphan with no links left (unlinked
    /// while open) is freed; one that still has links was being truncated
    /// and loses its blocks past `i_size`. Both the classic chain
    /// (`s_last_orphan`) and the orphan file (`orphan_file`) are read; both
    /// are empty afterwards. Returns how many inodes were freed.
    #[inline]
    pub fn recover_orphans(&self) -> Result<usize> {
        evict::recover_orphans(&self.sb)
    }
}
