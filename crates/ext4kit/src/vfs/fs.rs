//! [`Fs`], the library's API: one handle on an open filesystem, whose
//! methods are the whole contract a frontend (the FUSE mount, the CLI, a
//! program) uses. Each method is a thin call into the module that does
//! the work, named as the kernel names it — `namespace::unlink`,
//! `io::write_inode`, `rename::rename` — on the filesystem's state,
//! [`SuperBlock`] (the volume, the caches, the holds, the mount's flags).
//! A reader looking for an operation finds it by its file name; this file
//! only lists them. The calls are `#[inline]`: going through the facade
//! costs nothing over calling the module.

use std::path::Path;
use std::sync::Arc;

use ext4kit_blockdev::BlockDevice;
use ext4kit_format::inode::{FileType, Inode};

use super::attr::{SetAttr, StatFs, TimeSet};
use super::cred::{Caller, Cred};
use super::dcache::Dentry;
use super::fiemap::DataLayout;
use super::file::{File, OpenFlags, Whence};
use super::holds::Holds;
use super::icache::CachedInode;
use super::iflags::FsXattr;
use super::inode_table::InodeTable;
use super::mount::MountRecord;
use super::rename::RenameFlags;
use super::request::{Fallocate, NewInode, OpenRequest, WriteRequest, Written};
use super::stat::{FsInfo, FsStats, Stat};
use super::super_block::SuperBlock;
use super::target::Target;
use super::writeback::{SyncLevel, WritebackStats};
use super::{
    acl, attr, evict, export, fiemap, fill_super, fslabel, iflags, inode_table, io, lookup, mount, namei, namespace,
    open, read, read_write, readdir, rename, stat, whiteout, write, writeback, xattr_ops,
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
        fill_super::open_image(path.as_ref(), opts).map(Fs::new)
    }

    /// Open the filesystem on a disk already opened through its container
    /// ([`crate::device::open_disk`]'s [`Disk`](crate::device::Disk)
    /// device), at `opts.volume` and `opts.location`, as
    /// [`Fs::open_image`] would (`opts.disk_format` and the backing-path
    /// choice were the container open's). A frontend that opened the image
    /// to probe it reuses that open: a remote image's requests and a
    /// qcow2's tables are read once. `name` is for messages.
    #[inline]
    pub fn open_on_disk(disk: Arc<dyn BlockDevice>, name: impl AsRef<Path>, opts: &OpenOptions) -> Result<Arc<Fs>> {
        fill_super::open_on_disk(disk, name.as_ref(), opts).map(Fs::new)
    }

    /// Open an image whose bytes `image` holds, as [`Fs::open_image`]
    /// opens a file: its container format (qcow2, VHDX, ...) found by
    /// content, then the partition, offset or logical volume
    /// `opts` names. For images that are not files on this machine (in
    /// memory, behind a program's own I/O); no file the image names (a
    /// backing file) is followed.
    #[inline]
    pub fn open_image_device(image: Arc<dyn BlockDevice>, opts: &OpenOptions) -> Result<Arc<Fs>> {
        fill_super::open_image_device(image, opts).map(Fs::new)
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
        fill_super::open_device(dev, opts).map(Fs::new)
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

    /// Walk the path `t` names (absolute, or relative to the root) to its
    /// dentry; a symlink in the last component is followed unless
    /// [`Target::nofollow`] says not to. Only a path has a dentry: another
    /// target is EINVAL.
    ///
    /// The whole walk runs under one pin of the dentry cache and keeps the
    /// chain of directories it went through as *borrowed* dentries: no lock
    /// and no reference count is touched on `/`, `/usr`, ... Only the final
    /// dentry is cloned for the caller.
    #[inline]
    pub fn resolve<'a>(&self, t: impl Into<Target<'a>>) -> Result<Arc<Dentry>> {
        namei::resolve_target(&self.sb, t.into())
    }

    /// The inode `name` refers to in directory inode `dir_ino`, with its
    /// type; `None` when the name does not exist. "." and ".." are looked up
    /// like any other name (they are real entries in ext4 directories).
    /// This is a frontend's `LOOKUP`: the dentry cache answers when it can,
    /// else the directory on disk (its htree), under its shared lock.
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

    /// The in-memory inode `ino` (read from disk if not cached): what the
    /// calls on file data by inode take.
    #[inline]
    pub fn inode(&self, ino: u32) -> Result<Arc<CachedInode>> {
        self.sb.inode(ino)
    }

    /// `stat(2)`: the attributes of what `t` names (a path, a name in a
    /// directory, an inode number; see [`Target`]).
    ///
    /// ```no_run
    /// # fn f(fs: &ext4kit::Fs) -> ext4kit::Result<()> {
    /// let st = fs.stat(b"/etc/hostname")?;
    /// assert_eq!(fs.stat(st.ino)?.size, st.size);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn stat<'a>(&self, t: impl Into<Target<'a>>) -> Result<Stat> {
        stat::stat(&self.sb, t.into())
    }

    /// `lstat(2)`: [`Fs::stat`] without following a path's final symlink.
    #[inline]
    pub fn lstat<'a>(&self, t: impl Into<Target<'a>>) -> Result<Stat> {
        stat::stat(&self.sb, t.into().nofollow())
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
        export::stat_by_handle(&self.sb, ino)
    }

    /// The entries of the directory `t` names, "." and ".." included
    /// (entries without a type on disk get it from their inode).
    #[inline]
    pub fn read_dir<'a>(&self, t: impl Into<Target<'a>>) -> Result<Vec<DirEntry>> {
        readdir::read_dir(&self.sb, t.into())
    }

    /// The names removed from the directory `t` names whose records its
    /// blocks still hold, for forensic listings (TSK's `fls -d`). Best
    /// effort: Linux 5.13 and later, and this engine, wipe a removed
    /// record, so only names removed by older kernels or e2fsprogs remain;
    /// the inode a name gives may since have been reused. See
    /// `ext4::dir_slack` for what is recognised as a record.
    #[inline]
    pub fn deleted_entries<'a>(&self, t: impl Into<Target<'a>>) -> Result<Vec<DirEntry>> {
        readdir::deleted_entries(&self.sb, t.into())
    }

    /// Every inode record of the inode tables, in inode order, in use or
    /// free, with the inode bitmap's verdict: the inodes a path walk never
    /// meets (deleted files whose records remain, unlinked inodes, the
    /// reserved ones). Read from the tables directly, a bounded chunk at a
    /// time; groups never initialised are skipped. Read-only.
    ///
    /// ```no_run
    /// # fn f(fs: &ext4kit::Fs) -> ext4kit::Result<()> {
    /// for r in fs.inode_table() {
    ///     let r = r?;
    ///     if r.in_use() == Some(false) && r.looks_intact() {
    ///         println!("deleted inode {}, dtime {}", r.ino(), r.dtime());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn inode_table(&self) -> InodeTable<'_> {
        inode_table::inode_table(&self.sb)
    }

    /// `readlink(2)`: the target of the symlink `t` names (a path's final
    /// component is the link read, never followed); EINVAL for anything
    /// else.
    #[inline]
    pub fn read_link<'a>(&self, t: impl Into<Target<'a>>) -> Result<Vec<u8>> {
        stat::read_link(&self.sb, t.into())
    }

    /// Where inode `ino`'s data lives (`FS_IOC_FIEMAP`'s view).
    #[inline]
    pub fn data_layout(&self, ino: u32) -> Result<DataLayout> {
        fiemap::data_layout(&self.sb, ino)
    }

    /// `access(2)` on what `t` names: `mask` is MAY_* bits (0 checks
    /// existence only). EACCES when refused; EROFS for a write check on a
    /// read-only filesystem (regular files, directories, symlinks); EPERM
    /// for a write check on an immutable inode.
    #[inline]
    pub fn access<'a>(&self, t: impl Into<Target<'a>>, mask: u8, cred: &Cred) -> Result<()> {
        attr::access(&self.sb, t.into(), mask, cred)
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

    // ---- Namespace changes: create, unlink, rmdir, link, rename ----

    /// Make a new inode and its name, as [`NewInode`] describes: a regular
    /// file, a directory, a symlink, a device node, a fifo or a socket
    /// (`creat`, `mkdir`, `symlink`, `mknod`), in one transaction.
    ///
    /// The caller ([`NewInode::cred`]) needs write and search permission
    /// on the directory (EACCES), which must not be immutable or
    /// append-only (EPERM). The new inode is owned by the caller, with a
    /// set-group-id directory's group (and, for a directory, its S_ISGID
    /// bit), unless [`NewInode::owner`] says otherwise. Its mode is
    /// limited by the umask, unless the parent has a default ACL, which it
    /// inherits instead in the same transaction (`vfs::acl_inherit`). A
    /// directory with the dirsync flag (or a `sync`/`dirsync` filesystem)
    /// has the change durable at the return.
    ///
    /// ```no_run
    /// # fn f(fs: &ext4kit::Fs) -> ext4kit::Result<()> {
    /// use ext4kit::NewInode;
    /// fs.create(&NewInode::dir(b"/etc"))?;
    /// fs.create(&NewInode::symlink(b"/etc/localtime", b"/usr/share/zoneinfo/UTC"))?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn create(&self, req: &NewInode<'_>) -> Result<Stat> {
        write::create(&self.sb, req)
    }

    /// Create the regular file `req` describes holding `data`, written
    /// straight to its blocks (image building: the allocation and mapping
    /// code writeback uses, without going through the page cache).
    #[inline]
    pub fn write_file(&self, req: &NewInode<'_>, data: &[u8]) -> Result<Stat> {
        write::write_file(&self.sb, req, data)
    }

    /// `unlink(2)`: remove the name `t` names (not a directory; a path or
    /// [`Target::at`]). The inode dies with its last link, or at its last
    /// close if still open.
    #[inline]
    pub fn unlink<'a>(&self, t: impl Into<Target<'a>>, cred: &Cred) -> Result<()> {
        namespace::unlink(&self.sb, t.into(), cred)
    }

    /// `rmdir(2)`: remove the empty directory `t` names.
    #[inline]
    pub fn rmdir<'a>(&self, t: impl Into<Target<'a>>, cred: &Cred) -> Result<()> {
        namespace::rmdir(&self.sb, t.into(), cred)
    }

    /// `link(2)`: `new` becomes another name of the inode `src` names (a
    /// symlink there is not followed, as Linux `link` does; an inode
    /// number is accepted, which is how an `O_TMPFILE` file gets a name).
    #[inline]
    pub fn link<'a, 'b>(&self, src: impl Into<Target<'a>>, new: impl Into<Target<'b>>, cred: &Cred) -> Result<Stat> {
        namespace::link(&self.sb, src.into(), new.into(), cred)
    }

    /// `renameat2(2)`: move the name `old` to `new` (paths or names in
    /// directories), with `RENAME_NOREPLACE`, `RENAME_EXCHANGE` or
    /// `RENAME_WHITEOUT` as `flags` says; durable at the return when either
    /// directory is dirsync (`ext4_rename`'s `ext4_handle_sync`).
    #[inline]
    pub fn rename<'a, 'b>(
        &self,
        old: impl Into<Target<'a>>,
        new: impl Into<Target<'b>>,
        flags: RenameFlags,
        cred: &Cred,
    ) -> Result<()> {
        if flags.whiteout {
            whiteout::rename_whiteout(&self.sb, old.into(), new.into(), flags, cred)
        } else {
            rename::rename(&self.sb, old.into(), new.into(), flags, cred)
        }
    }

    // ---- Open files: open, the calls on a description, close ----

    /// Open what `t` names as root. A path is opened as `open(2)` opens it
    /// (O_CREAT makes a file with mode 0644 owned by root; immutable and
    /// append-only inodes still refuse a write); an inode number or a name
    /// in a directory is opened with no checks at all, for tools that walk
    /// a tree by inode numbers (such a file has no dentry).
    ///
    /// ```no_run
    /// # fn f(fs: &ext4kit::Fs) -> ext4kit::Result<()> {
    /// use ext4kit::OpenFlags;
    /// let f = fs.open(b"/etc/hostname", OpenFlags::default())?;
    /// let mut buf = [0u8; 256];
    /// let n = fs.read(&f, &mut buf)?;
    /// fs.close_file(f)?;
    /// # let _ = n; Ok(()) }
    /// ```
    #[inline]
    pub fn open<'a>(&self, t: impl Into<Target<'a>>, flags: OpenFlags) -> Result<Arc<File>> {
        open::open_as_root(&self.sb, t.into(), flags)
    }

    /// `open(2)` of what `t` names on behalf of [`OpenRequest::cred`]:
    /// O_CREAT makes a regular file (for a path or a name in a directory),
    /// the caller's rights are checked (by the engine, or already by the
    /// caller: [`PermCheck`](crate::PermCheck)), O_TRUNC empties a regular file. The file
    /// remembers its opener: its writes, truncations and fallocates are
    /// the opener's (only root's keep setuid/setgid bits).
    ///
    /// For a name in a directory with O_CREAT, the kernel's `lookup_open`:
    /// when the name exists, O_EXCL gives EEXIST, otherwise the existing
    /// file is opened with the permission check a plain open makes.
    #[inline]
    pub fn open_as<'a>(&self, t: impl Into<Target<'a>>, req: &OpenRequest<'_>) -> Result<Arc<File>> {
        open::open(&self.sb, t.into(), req)
    }

    /// `open(O_TMPFILE)` in the directory `dir` names (`vfs_tmpfile` →
    /// `ext4_tmpfile`, then the open): a regular file with the request's
    /// mode (a umask, or the parent's default ACL) and no name, open with
    /// its access mode. Without O_EXCL a later [`Fs::link`] of its inode
    /// number may name it; otherwise its last close frees it. It is on the
    /// orphan list until then, so a crash leaves nothing behind. Close it
    /// with [`Fs::close_file`].
    #[inline]
    pub fn tmpfile_open<'a>(&self, dir: impl Into<Target<'a>>, req: &OpenRequest<'_>) -> Result<Arc<File>> {
        open::tmpfile_open(&self.sb, dir.into(), req)
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
        read_write::fsync(&self.sb, file, SyncLevel::All)
    }

    /// fdatasync(2): dirty pages, the inode record only if data-relevant
    /// fields changed (size, block map), then the commit and a device flush.
    #[inline]
    pub fn fdatasync(&self, file: &File) -> Result<()> {
        read_write::fsync(&self.sb, file, SyncLevel::Data)
    }

    /// Close an open file: drop this reference, and if it was the last open
    /// of an inode that has no name left, free the inode (the last close of
    /// an unlinked file). Frontends call this instead of just dropping the
    /// `Arc<File>`; a file dropped without it stays on the orphan list until
    /// the next open of the image frees it.
    #[inline]
    pub fn close_file(&self, file: Arc<File>) -> Result<()> {
        evict::close_file(&self.sb, file)
    }

    // ---- File data by inode: the page cache, truncate, fallocate, writeback ----

    /// Read file data of `inode` at `off` through the page cache; returns
    /// the bytes read (0 at or past end of file).
    #[inline]
    pub fn read_at(&self, inode: &CachedInode, off: u64, buf: &mut [u8]) -> Result<usize> {
        read::read_at(&self.sb, inode, off, buf)
    }

    /// The buffered write (`ext4_buffered_write_iter`): the data of `req`
    /// into the page cache, with the rules of the kernel's write path —
    /// immutable inodes refuse (EPERM); an append-only inode takes appends
    /// only ([`WriteAt::End`](crate::WriteAt::End); a write at an offset is EPERM, the rule
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
    /// [`Fs::reserver`] names.
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
    /// [`FALLOC_FL_KEEP_SIZE`](super::io::FALLOC_FL_KEEP_SIZE), [`FALLOC_FL_PUNCH_HOLE`](super::io::FALLOC_FL_PUNCH_HOLE) (with KEEP_SIZE) or
    /// [`FALLOC_FL_ZERO_RANGE`](super::io::FALLOC_FL_ZERO_RANGE) (optionally with KEEP_SIZE).
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

    /// fsync ([`SyncLevel::All`]) or fdatasync ([`SyncLevel::Data`]) of
    /// one inode: write back its dirty pages and its record as the level
    /// requires, commit the metadata (or, without a journal, write it
    /// home), then flush the device cache. A background write-back of it
    /// that failed since the last report is reported here.
    #[inline]
    pub fn fsync_inode(&self, inode: &CachedInode, level: SyncLevel) -> Result<WritebackStats> {
        writeback::fsync_inode(&self.sb, inode, level)
    }

    // ---- Attributes and flags ----

    /// Change the attributes of what `t` names on behalf of `cred`
    /// (`notify_change`: `may_setattr` and `setattr_prepare`'s rules —
    /// immutable and append-only inodes refuse, only the owner or root may
    /// change the mode or set explicit times, only root may give a file
    /// away; a chown clears setuid/setgid and a file capability; a chmod
    /// rewrites the access ACL to match). Returns the new attributes.
    #[inline]
    pub fn setattr<'a>(&self, t: impl Into<Target<'a>>, attr: &SetAttr, cred: &Cred) -> Result<Stat> {
        attr::setattr(&self.sb, t.into(), attr, cred)
    }

    /// `chmod(2)`: set the permission bits (see [`Fs::setattr`]).
    #[inline]
    pub fn chmod<'a>(&self, t: impl Into<Target<'a>>, mode: u16, cred: &Cred) -> Result<Stat> {
        attr::chmod(&self.sb, t.into(), mode, cred)
    }

    /// `chown(2)` (`lchown(2)` with [`Target::nofollow`]): `None` leaves
    /// the owner or group unchanged (the syscalls' -1).
    #[inline]
    pub fn chown<'a>(&self, t: impl Into<Target<'a>>, uid: Option<u32>, gid: Option<u32>, cred: &Cred) -> Result<Stat> {
        attr::chown(&self.sb, t.into(), uid, gid, cred)
    }

    /// `utimensat(2)`: `None` is `UTIME_OMIT` (both: nothing changes, no
    /// check); [`Target::nofollow`] is `AT_SYMLINK_NOFOLLOW`.
    #[inline]
    pub fn utimens<'a>(
        &self,
        t: impl Into<Target<'a>>,
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
        cred: &Cred,
    ) -> Result<Stat> {
        attr::utimens(&self.sb, t.into(), atime, mtime, cred)
    }

    /// `FS_IOC_GETFLAGS`: the user-visible inode flags of what `t` names.
    #[inline]
    pub fn get_flags<'a>(&self, t: impl Into<Target<'a>>) -> Result<u32> {
        iflags::get_flags(&self.sb, t.into())
    }

    /// `FS_IOC_SETFLAGS` by `cred` (`ext4_ioctl_setflags`: the owner or
    /// root; append-only and immutable need root). Returns the new
    /// attributes.
    #[inline]
    pub fn set_flags<'a>(&self, t: impl Into<Target<'a>>, flags: u32, cred: &Cred) -> Result<Stat> {
        iflags::set_flags(&self.sb, t.into(), flags, cred)
    }

    /// `FS_IOC_FSGETXATTR`: the flags as a `struct fsxattr` (extent-size
    /// hints, extent count and project id 0: what ext4 reports without the
    /// project feature).
    #[inline]
    pub fn get_fsxattr<'a>(&self, t: impl Into<Target<'a>>) -> Result<FsXattr> {
        iflags::get_fsxattr(&self.sb, t.into())
    }

    /// `FS_IOC_FSSETXATTR`: set the `FS_XFLAG_*` flags of `fa`
    /// (`ext4_fileattr_set`). Extent-size hints are not ext4's (EINVAL),
    /// nor a project id without the project feature (EOPNOTSUPP); the
    /// flags as [`Fs::set_flags`].
    #[inline]
    pub fn set_fsxattr<'a>(&self, t: impl Into<Target<'a>>, fa: &FsXattr, cred: &Cred) -> Result<Stat> {
        iflags::set_fsxattr(&self.sb, t.into(), fa, cred)
    }

    // ---- Extended attributes ----

    /// Every extended attribute of what `t` names, with its value and
    /// without permission checks; a path's final symlink is never followed
    /// (for tools that copy or compare trees).
    #[inline]
    pub fn xattrs<'a>(&self, t: impl Into<Target<'a>>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        xattr_ops::xattrs(&self.sb, t.into())
    }

    /// `getxattr(2)`: the value of attribute `name` (ENODATA if absent;
    /// ACLs in the Linux xattr format), with the namespaces' permission
    /// rules for `cred` (`trusted.*` is root's; `user.*` needs read
    /// permission and exists only on files and directories).
    #[inline]
    pub fn getxattr<'a>(&self, t: impl Into<Target<'a>>, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
        xattr_ops::getxattr(&self.sb, t.into(), name, cred)
    }

    /// `listxattr(2)`: the names of the attributes `cred` may see
    /// (`trusted.*` only for root, as `ext4_xattr_trusted_list`).
    #[inline]
    pub fn listxattr<'a>(&self, t: impl Into<Target<'a>>, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        xattr_ops::listxattr(&self.sb, t.into(), cred)
    }

    /// `setxattr(2)`: set attribute `name` to `value` (`flags`: 0,
    /// XATTR_CREATE or XATTR_REPLACE), with the namespaces' permission
    /// rules for `cred`. Setting the access ACL also sets the mode's
    /// permission bits from it, and an ACL that says no more than the mode
    /// is not stored (`posix_acl_update_mode`). A synchronous inode has the
    /// change durable at the return.
    #[inline]
    pub fn setxattr<'a>(
        &self,
        t: impl Into<Target<'a>>,
        name: &[u8],
        value: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()> {
        xattr_ops::setxattr(&self.sb, t.into(), name, value, flags, cred)
    }

    /// `removexattr(2)`: remove attribute `name` (ENODATA if absent).
    #[inline]
    pub fn removexattr<'a>(&self, t: impl Into<Target<'a>>, name: &[u8], cred: &Cred) -> Result<()> {
        xattr_ops::removexattr(&self.sb, t.into(), name, cred)
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
