//! The request handlers: each translates one FUSE request into calls on
//! [`ext4kit::Fs`] and the result into a reply. No filesystem logic lives
//! here: names, permissions on disk, data and attributes all come from the
//! engine; this file only maps numbers, handles and errors.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ext4kit::vfs::cred::Cred;
use ext4kit::{Fs, OpenFlags as EngineOpen, Whence};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::attr::{file_attr, kind};
use crate::errno::{errno, res};
use crate::handles::{DirSnapshot, Handle, Handles};
use crate::nodes::{to_ext4, to_fuse, Nodes};

/// How long the kernel may trust a name (entry) or attributes without
/// asking again. See the crate documentation for why a long time is right.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Largest write the kernel may send (`max_write`).
pub const MAX_WRITE: u32 = 1 << 20;

/// Requests the kernel may have in flight in the background (readahead,
/// async reads): large, so readahead of several files is never throttled.
pub const MAX_BACKGROUND: u16 = 256;

/// The FUSE filesystem: an open [`Fs`], the kernel's lookup counts and the
/// open handles.
#[derive(Debug)]
pub struct Ext4Fuse {
    fs: Arc<Fs>,
    nodes: Arc<Nodes>,
    handles: Handles,
    read_only: bool,
    block_size: u32,
    /// OPEN answers ENOSYS (see `init`).
    no_open: bool,
    /// What INIT negotiated (for tests and `--debug` output).
    negotiated: Arc<parking_lot::Mutex<Option<InitFlags>>>,
}

thread_local! {
    /// Per-thread read buffer: READ replies are copied out of it, so a
    /// request does not allocate.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The EROFS every write request gets until the write engine is wired in.
const WRITE_OPS_PENDING: Errno = Errno::EROFS;

impl Ext4Fuse {
    /// Serve `fs`. `read_only` must be true for now (see [`crate::mount`]).
    pub fn new(fs: Arc<Fs>, read_only: bool) -> Self {
        let block_size = fs.vol.block_size as u32;
        Ext4Fuse {
            fs,
            nodes: Arc::default(),
            handles: Handles::default(),
            read_only,
            block_size,
            no_open: false,
            negotiated: Arc::default(),
        }
    }

    /// The kernel lookup counts (shared: tests and statistics read them
    /// while the session owns the server).
    pub fn nodes(&self) -> Arc<Nodes> {
        self.nodes.clone()
    }

    /// A shared view of the capabilities INIT negotiated.
    pub fn negotiated(&self) -> Arc<parking_lot::Mutex<Option<InitFlags>>> {
        self.negotiated.clone()
    }

    /// Whether files are opened without OPEN requests (read-only mounts on
    /// kernels that support it; set by INIT).
    fn no_open(&self) -> bool {
        self.no_open
    }

    fn ino(ino: INodeNo) -> Result<u32, Errno> {
        to_ext4(ino).ok_or(Errno::ESTALE)
    }

    /// Look `name` up in `parent` and give the kernel a reference to it.
    /// `Ok(None)`: the name does not exist.
    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Result<Option<(fuser::FileAttr, Generation)>, Errno> {
        let dir = Self::ino(parent)?;
        let Some((ino, _)) = res(self.fs.lookup_at(dir, name.as_bytes()))? else {
            return Ok(None);
        };
        if ino == 1 {
            // A name pointing at the bad-blocks inode is corruption.
            return Err(Errno::from_i32(libc::EUCLEAN));
        }
        let inode = res(self.fs.inode(ino))?;
        let st = res(self.fs.stat_ino(ino))?;
        self.nodes.remember(&inode);
        Ok(Some((
            file_attr(&st, self.block_size),
            Generation(u64::from(st.generation)),
        )))
    }

    fn attr(&self, ino: u32) -> Result<fuser::FileAttr, Errno> {
        Ok(file_attr(&res(self.fs.stat_ino(ino))?, self.block_size))
    }

    /// Caller credentials: uid and gid from the request, supplementary
    /// groups from /proc (FUSE requests do not carry them).
    fn cred(req: &Request) -> Cred {
        let mut c = Cred::user(req.uid(), req.gid());
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) {
            if let Some(l) = s.lines().find(|l| l.starts_with("Groups:")) {
                c.groups = l[7..].split_whitespace().filter_map(|g| g.parse().ok()).collect();
            }
        }
        c
    }

    fn snapshot(&self, ino: u32) -> Result<DirSnapshot, Errno> {
        let list = res(self.fs.read_dir_ino(ino))?;
        let mut entries = Vec::with_capacity(list.len());
        for e in list {
            let t = match e.file_type {
                Some(t) => t,
                None => res(self.fs.inode(e.ino))?.ftype,
            };
            entries.push((e.name, e.ino, t));
        }
        Ok(DirSnapshot { entries })
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Filesystem for Ext4Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each capability alone: an old kernel lacking one keeps the rest.
        for cap in [
            // Lookups and readdirs in one directory run in parallel (the
            // engine's directory lookups take the directory's shared lock).
            InitFlags::FUSE_PARALLEL_DIROPS,
            // READDIRPLUS answers names and attributes in one round trip;
            // AUTO lets the kernel use it only when the caller stats.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            // Symlink targets cached in the kernel's page cache.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Reads of several pages in flight per file.
            InitFlags::FUSE_ASYNC_READ,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // Read-only: opening a file needs no state here (reads go by inode),
        // so OPEN answers ENOSYS once and the kernel stops sending OPEN and
        // RELEASE (FUSE_NO_OPEN_SUPPORT): open/close cost no round trip.
        // Files opened that way keep their page cache (the kernel's default
        // for no-open is FOPEN_KEEP_CACHE).
        self.no_open = self.read_only && config.add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT).is_ok();
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
        *self.negotiated.lock() = Some(config.capabilities());
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.sync() {
            eprintln!("ext4kit: flushing at unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.do_lookup(parent, name) {
            Ok(Some((attr, generation))) => reply.entry(&TTL, &attr, generation),
            // A negative entry (node id 0) with a timeout: the kernel caches
            // the absence like a name (a create through the mount replaces it).
            Ok(None) => {
                let mut attr = fuser::FileAttr {
                    ino: INodeNo(0),
                    ..empty_attr()
                };
                attr.blksize = self.block_size;
                reply.entry(&TTL, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Some(i) = to_ext4(ino) {
            self.nodes.forget(i, nlookup);
        }
    }

    // BATCH_FORGET: fuser's default calls `forget` for each node (its
    // ForgetOne type is not public, so it cannot be overridden).

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match Self::ino(ino).and_then(|i| self.attr(i)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match Self::ino(ino).and_then(|i| res(self.fs.read_link_ino(i))) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            let ino = Self::ino(ino)?;
            if self.read_only && (flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0) {
                return Err(Errno::EROFS);
            }
            let f = res(self.fs.open_ino(ino, EngineOpen::default()))?;
            if f.is_dir() {
                return Err(Errno::EISDIR);
            }
            if self.no_open() {
                return Err(Errno::ENOSYS);
            }
            Ok(self.handles.insert(Handle::File(f)))
        })();
        match r {
            // KEEP_CACHE: we are the only writer of the image, so pages the
            // kernel cached at an earlier open are still valid. NOFLUSH: a
            // close needs no FLUSH round trip (nothing is buffered here;
            // revisit when write-back caching is negotiated).
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            let buf = &mut buf[..size as usize];
            let r = self.handles.with(fh.0, |h| match h {
                Handle::File(f) => f.pread(&self.fs, offset, buf),
                Handle::Dir(_) => Err(ext4kit::Error::posix(ext4kit::Errno::EISDIR, "read of a directory")),
            });
            // No handle (fh 0): opened without OPEN (see `init`); read by inode.
            let r = r.or_else(|| {
                let i = to_ext4(ino)?;
                Some(self.fs.inode(i).and_then(|inode| self.fs.read_at(&inode, offset, buf)))
            });
            match r {
                Some(Ok(n)) => reply.data(&buf[..n]),
                Some(Err(e)) => reply.error(errno(&e)),
                None => reply.error(Errno::EBADF),
            }
        })
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match Self::ino(ino).and_then(|i| self.snapshot(i)) {
            // CACHE_DIR + KEEP_CACHE: the kernel may keep the listing in its
            // page cache across opens (it drops it when the directory changes
            // through the mount, the only way it can change).
            Ok(s) => reply.opened(
                FileHandle(self.handles.insert(Handle::Dir(s))),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = self.handles.with(fh.0, |h| {
            let Handle::Dir(d) = h else {
                return Err(Errno::ENOTDIR);
            };
            for (i, (name, ino, t)) in d.entries.iter().enumerate().skip(offset as usize) {
                if reply.add(to_fuse(*ino), i as u64 + 1, kind(*t), OsStr::from_bytes(name)) {
                    break;
                }
            }
            Ok(())
        });
        match r {
            Some(Ok(())) => reply.ok(),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    fn readdirplus(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let r = self.handles.with(fh.0, |h| {
            let Handle::Dir(d) = h else {
                return Err(Errno::ENOTDIR);
            };
            for (added, (i, (name, ino, _))) in d.entries.iter().enumerate().skip(offset as usize).enumerate() {
                let one = || -> Result<_, Errno> {
                    if *ino == 1 {
                        // FUSE's node 1 is the root: an entry naming ext4's
                        // bad-blocks inode cannot be handed out (corruption).
                        return Err(Errno::from_i32(libc::EUCLEAN));
                    }
                    let inode = res(self.fs.inode(*ino))?;
                    let st = res(self.fs.stat_ino(*ino))?;
                    Ok((inode, st))
                };
                let (inode, st) = match one() {
                    Ok(x) => x,
                    // Report the failure on the entry it belongs to: return
                    // what fits before it; the next call starts there.
                    Err(e) if added == 0 => return Err(e),
                    Err(_) => break,
                };
                let attr = file_attr(&st, self.block_size);
                let full = reply.add(
                    to_fuse(*ino),
                    i as u64 + 1,
                    OsStr::from_bytes(name),
                    &TTL,
                    &attr,
                    Generation(u64::from(st.generation)),
                );
                if full {
                    break;
                }
                // Every entry sent but "." and ".." takes a lookup count
                // (the kernel's fuse_direntplus_link).
                if !is_dot(name) {
                    self.nodes.remember(&inode);
                }
            }
            Ok(())
        });
        match r {
            Some(Ok(())) => reply.ok(),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match crate::statfs::statfs(&self.fs) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = Self::ino(ino).and_then(|i| res(self.fs.xattrs_ino(i))).and_then(|all| {
            all.into_iter()
                .find(|(n, _)| n.as_slice() == name.as_bytes())
                .map(|(_, v)| v)
                .ok_or(Errno::ENODATA)
        });
        match r {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match Self::ino(ino).and_then(|i| res(self.fs.xattrs_ino(i))) {
            Ok(all) => {
                let mut list = Vec::new();
                for (n, _) in all {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                xattr_reply(reply, size, &list)
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // The engine's check: mode bits, ACLs, EROFS for writes to a
        // read-only filesystem, immutable inodes.
        let r = Self::ino(ino).and_then(|i| res(self.fs.access_ino(i, (mask.bits() & 7) as u8, &Self::cred(req))));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let whence = match whence {
            libc::SEEK_SET => Whence::Set,
            libc::SEEK_CUR => Whence::Cur,
            libc::SEEK_END => Whence::End,
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self.handles.with(fh.0, |h| match h {
            Handle::File(f) => f.lseek(&self.fs, offset, whence).map_err(|e| errno(&e)),
            Handle::Dir(_) => Err(Errno::EINVAL),
        });
        // Opened without OPEN: a transient open file answers the question.
        let r = r.or_else(|| {
            let i = to_ext4(ino)?;
            Some(
                res(self.fs.open_ino(i, EngineOpen::default()))
                    .and_then(|f| f.lseek(&self.fs, offset, whence).map_err(|e| errno(&e))),
            )
        });
        match r {
            Some(Ok(p)) => reply.offset(p as i64),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    // Nothing is buffered for a read-only mount: flush and fsync succeed.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fs.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fs.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    // ---- The write side: EROFS until the write engine is merged. ----

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn mkdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn symlink(&self, _req: &Request, _parent: INodeNo, _link_name: &OsStr, _target: &Path, reply: ReplyEntry) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(WRITE_OPS_PENDING);
    }
}

/// The xattr size protocol: size 0 asks for the length; a buffer too small
/// is ERANGE; otherwise the bytes.
fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if (size as usize) < v.len() {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}

fn empty_attr() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
