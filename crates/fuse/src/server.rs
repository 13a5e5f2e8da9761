//! The request handlers: each translates one FUSE request into calls on
//! [`ext4kit::Fs`] and the result into a reply. No filesystem logic lives
//! here: names, permissions on disk, data and attributes all come from the
//! engine; this file only maps numbers, handles, flags, credentials and
//! errors.

use ext4kit::{NewInode, NodeKind, OpenRequest, PermCheck, SyncLevel, Target};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::busypoll::BusyPoll;
use ext4kit::vfs::cred::Cred;
use ext4kit::vfs::CachedInode;
use ext4kit::{
    Caller, CreateMode, Fallocate, FileType as Ft, Fs, OpenFlags as EngineOpen, SetAttr, TimeSet, Timestamp, Whence,
    WriteAt, WriteRequest,
};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::attr::{file_attr, kind};
use crate::errno::{errno, res};
use crate::export;
use crate::handles::{DirEntry, Handle, Handles, OpenDir, OpenFile};
use crate::killpriv::{is_capability_kill, Invalidator};
use crate::nodes::{to_ext4, to_fuse, Nodes};

/// How long the kernel may trust a name (entry) or attributes without
/// asking again. See the crate documentation for why a long time is right.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Largest write the kernel may send (`max_write`).
pub const MAX_WRITE: u32 = 1 << 20;

/// Requests the kernel may have in flight in the background (readahead,
/// async reads, write-back): large, so readahead of several files is never
/// throttled.
pub const MAX_BACKGROUND: u16 = 256;

/// Largest piece copy_file_range moves per engine read + write.
const COPY_CHUNK: usize = 1 << 20;

/// How file data is cached in the kernel in front of the engine's own
/// page cache (see the crate documentation for the measurements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Kernel page cache, writes sent through at once (FUSE's default
    /// "write-through"): reads are cached, every write() is one WRITE.
    #[default]
    WriteThrough,
    /// `FUSE_WRITEBACK_CACHE`: the kernel buffers writes and sends them
    /// later in large pieces; it then owns size and mtime while dirty.
    Writeback,
    /// `FOPEN_DIRECT_IO`: no kernel page cache for file data at all; every
    /// read() and write() goes to the engine (whose page cache serves it).
    Direct,
}

/// Write-backs of the kernel's page cache (`cache=writeback`) that the
/// engine refused: the writer's write() succeeded long before, so the only
/// places left to tell are the kernel's error on the file (seen by an
/// fsync or close that checks) and the unmount's exit status, which this
/// feeds. Measured: a writer of a 64 MiB image under `cache=writeback` had
/// 6.5 GB accepted without an error while every write-back failed ENOSPC.
#[derive(Debug, Default)]
pub struct LostWriteback {
    /// (count, the first one's description).
    inner: parking_lot::Mutex<(u64, Option<String>)>,
}

impl LostWriteback {
    fn record(&self, node: u64, offset: u64, len: usize, e: Errno) {
        let mut g = self.inner.lock();
        g.0 += 1;
        if g.1.is_none() {
            let why = std::io::Error::from_raw_os_error(e.code());
            let msg = format!("node {node}: {len} bytes at offset {offset}: {why}");
            eprintln!("ext4kit: a write-back of cached data was refused, that data is lost: {msg}");
            g.1 = Some(msg);
        }
    }

    /// `None` when every write-back was taken, else a description for the
    /// unmount status.
    pub fn summary(&self) -> Option<String> {
        let g = self.inner.lock();
        let first = g.1.as_deref()?;
        Some(format!(
            "{} write-back(s) of the kernel's cached data were refused and that data is lost (first: {first}); \
             with cache=writeback a full disk or an I/O error is reported only to fsync and close",
            g.0
        ))
    }
}

/// The FUSE filesystem: an open [`Fs`], the kernel's lookup counts and the
/// open handles.
#[derive(Debug)]
pub struct Ext4Fuse {
    fs: Arc<Fs>,
    nodes: Arc<Nodes>,
    handles: Handles,
    read_only: bool,
    cache: CacheMode,
    block_size: u32,
    /// OPEN answers ENOSYS (see `init`).
    no_open: bool,
    /// `-o no_open` was given.
    want_no_open: bool,
    /// FUSE_WRITEBACK_CACHE was negotiated (set by INIT).
    writeback: bool,
    /// FUSE_POSIX_ACL and FUSE_DONT_MASK were negotiated (set by INIT):
    /// the kernel enforces ACLs it reads from us and sends the umask
    /// unapplied, which the engine applies or replaces by the parent's
    /// default ACL (`ext4kit::vfs::acl_inherit`).
    posix_acl: bool,
    /// FUSE_HANDLE_KILLPRIV_V2 was negotiated (set by INIT): the engine
    /// clears setuid/setgid on writes and truncations by unprivileged
    /// callers, and WRITE says whether the writer lacks CAP_FSETID.
    killpriv: bool,
    /// Attribute invalidations for changes a reply does not carry
    /// (setuid/setgid cleared by a write or fallocate: [`crate::killpriv`]).
    inval: Arc<Invalidator>,
    /// What INIT negotiated (for tests and `--debug` output).
    negotiated: Arc<parking_lot::Mutex<Option<InitFlags>>>,
    /// Write-backs of the kernel's cached pages we refused (see
    /// [`LostWriteback`]).
    lost: Arc<LostWriteback>,
    /// Spinning on the primary descriptor while requests keep coming
    /// ([`crate::busypoll`]); every request touches it.
    busy: Arc<BusyPoll>,
}

thread_local! {
    /// Per-thread read buffer: READ replies are copied out of it, so a
    /// request does not allocate.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Ext4Fuse {
    /// Serve `fs`, read-only or not, with kernel caching `cache`.
    pub fn new(fs: Arc<Fs>, read_only: bool, cache: CacheMode) -> Self {
        let block_size = fs.block_size();
        Ext4Fuse {
            nodes: Arc::new(Nodes::new(&fs)),
            fs,
            handles: Handles::default(),
            read_only,
            cache,
            block_size,
            no_open: false,
            want_no_open: false,
            writeback: false,
            killpriv: false,
            posix_acl: false,
            inval: Arc::default(),
            negotiated: Arc::default(),
            lost: Arc::default(),
            busy: BusyPoll::new(Duration::ZERO),
        }
    }

    /// Spin for `window` after each request (zero: never); see
    /// [`crate::busypoll`]. Takes effect once the session's descriptor is
    /// attached ([`BusyPoll::attach`] on [`Ext4Fuse::busy_poll`]).
    pub fn set_busy_poll(&mut self, window: Duration) {
        self.busy = BusyPoll::new(window);
    }

    /// Ask the kernel to open files without OPEN (`-o no_open`; only
    /// with write-through caching): see `init`.
    pub fn set_no_open(&mut self, wanted: bool) {
        self.want_no_open = wanted;
    }

    /// The busy-polling state, shared with the mount lifecycle.
    pub fn busy_poll(&self) -> Arc<BusyPoll> {
        self.busy.clone()
    }

    /// The kernel lookup counts (shared: tests and statistics read them
    /// while the session owns the server).
    pub fn nodes(&self) -> Arc<Nodes> {
        self.nodes.clone()
    }

    /// The attribute invalidator; the mount attaches the session's
    /// notifier to it once the session exists.
    pub fn invalidator(&self) -> Arc<Invalidator> {
        self.inval.clone()
    }

    /// The record of refused write-backs, read by the mount lifecycle at
    /// the end for the unmount's status.
    pub fn lost_writeback(&self) -> Arc<LostWriteback> {
        self.lost.clone()
    }

    /// A shared view of the capabilities INIT negotiated.
    pub fn negotiated(&self) -> Arc<parking_lot::Mutex<Option<InitFlags>>> {
        self.negotiated.clone()
    }

    fn ino(ino: INodeNo) -> Result<u32, Errno> {
        to_ext4(ino).ok_or(Errno::ESTALE)
    }

    /// The reply to a request that gave the kernel a new reference to inode
    /// `st.ino` (LOOKUP, MKDIR, MKNOD, SYMLINK, LINK, CREATE): count it.
    fn entry_of(&self, st: &ext4kit::Stat) -> Result<(fuser::FileAttr, Generation), Errno> {
        let inode = res(self.fs.inode(st.ino))?;
        res(self.nodes.remember(&self.fs, &inode))?;
        Ok((
            file_attr(st, self.block_size),
            Generation(export::generation(st.ino, st.generation)),
        ))
    }

    /// Look `name` up in `parent` and give the kernel a reference to it.
    /// `Ok(None)`: the name does not exist.
    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Result<Option<(fuser::FileAttr, Generation)>, Errno> {
        let dir = Self::ino(parent)?;
        if name.as_bytes() == b"." {
            // A file handle being decoded (`fuse_get_dentry`): the node
            // itself, of any type, checked as ext4 checks handles.
            let st = export::lookup_self(&self.fs, dir)?;
            return self.entry_of(&st).map(Some);
        }
        let Some((ino, _)) = res(self.fs.lookup_at(dir, name.as_bytes()))? else {
            return Ok(None);
        };
        if ino == 1 {
            // A name pointing at the bad-blocks inode is corruption.
            return Err(Errno::from_i32(libc::EUCLEAN));
        }
        let st = res(self.fs.stat(ino))?;
        self.entry_of(&st).map(Some)
    }

    fn attr(&self, ino: u32) -> Result<fuser::FileAttr, Errno> {
        Ok(file_attr(&res(self.fs.stat(ino))?, self.block_size))
    }

    /// Caller credentials: uid and gid from the request; supplementary
    /// groups from /proc (FUSE requests do not carry them). Root needs
    /// none, so its requests skip the /proc read.
    fn cred(req: &Request) -> Cred {
        let mut c = Cred::user(req.uid(), req.gid());
        if req.uid() != 0 {
            c.groups = proc_groups(req.pid());
        }
        c
    }

    /// The listing of directory `ino` as it is now (see [`OpenDir`]).
    fn listing(&self, ino: u32) -> Result<Vec<DirEntry>, Errno> {
        let list = res(self.fs.read_dir(ino))?;
        let mut entries = Vec::with_capacity(list.len());
        for e in list {
            let t = match e.file_type {
                Some(t) => t,
                None => res(self.fs.inode(e.ino))?.ftype,
            };
            entries.push((e.name, e.ino, t));
        }
        Ok(entries)
    }

    /// Open flags for the engine from the kernel's. O_APPEND is not kept
    /// on the engine's file: it is a property of the kernel's file (fcntl
    /// F_SETFL changes it without telling us), so each WRITE says whether
    /// it appends (see `write`).
    fn engine_flags(&self, bits: i32) -> EngineOpen {
        let mut f = EngineOpen::from_bits(bits);
        f.append = false;
        f
    }

    /// The handle a CREATE or TMPFILE reply gives the kernel for the
    /// engine's open file `f`. Under no-open there is none: the kernel
    /// sends no RELEASE once an OPEN has answered ENOSYS, so handle 0 ("by
    /// inode") is returned and `close` disposes of `f` now.
    fn created_handle(&self, req: &Request, f: Arc<ext4kit::File>, close: impl FnOnce(Arc<ext4kit::File>)) -> u64 {
        if self.no_open {
            close(f);
            return 0;
        }
        self.handles
            .insert(Handle::File(OpenFile::new(self.fs.clone(), f, req.uid() == 0)))
    }

    /// FOPEN flags for an opened file.
    fn fopen_flags(&self) -> FopenFlags {
        match self.cache {
            // PARALLEL_DIRECT_WRITES: the engine serialises writers of one
            // inode itself (its record lock), the kernel need not.
            CacheMode::Direct => FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            // KEEP_CACHE: we are the only writer of the image, so pages the
            // kernel cached at an earlier open are still valid. NOFLUSH: a
            // close needs no FLUSH round trip (nothing is buffered in the
            // kernel; with write-back caching the kernel ignores it and
            // writes dirty pages back at close anyway).
            _ => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        }
    }

    /// The open file behind `fh`.
    fn file(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        match self.handles.get(fh.0) {
            Some(h) if matches!(&*h, Handle::File(_)) => Ok(h),
            Some(_) => Err(Errno::EISDIR),
            None => Err(Errno::EBADF),
        }
    }

    /// SETATTR: a truncation to `size`, then the attribute changes of
    /// `attr`; `times_only` when the request carried only a ctime (the
    /// kernel's write-back cache flushing its times), which still goes to
    /// the engine so ctime moves.
    fn do_setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        size: Option<u64>,
        attr: &SetAttr,
        times_only: bool,
    ) -> Result<fuser::FileAttr, Errno> {
        let ino = Self::ino(ino)?;
        if let Some(len) = size {
            // truncate(2) / ftruncate(2) / O_TRUNC without atomic_o_trunc;
            // the kernel checked write permission (or the descriptor). The
            // engine clears setuid/setgid for a caller other than root (the
            // kernel flags it, FATTR_KILL_SUIDGID, but fuser does not pass
            // the flag on: CAP_FSETID is approximated by uid 0).
            let inode = res(self.fs.inode(ino))?;
            let cred = Cred::user(req.uid(), req.gid());
            let groups = || proc_groups(req.pid());
            res(self
                .fs
                .truncate_inode(&inode, len, &Self::caller(&cred, req.uid() == 0, &groups)))?;
        }
        if *attr != SetAttr::default() || times_only {
            let cred = Self::cred(req);
            let st = res(self.fs.stat(ino))?;
            // With `default_permissions` the kernel has already applied
            // may_setattr/setattr_prepare to every SETATTR a system call
            // makes (chown by non-root, chmod by non-owner, explicit times:
            // refused before we see them). A SETATTR from a caller who is
            // neither owner nor root that reaches us is one the kernel made
            // itself with ATTR_FORCE semantics: the setuid/setgid kill of
            // file_remove_privs after a write or truncate, or, with
            // write-back caching, the flush of its cached mtime/ctime.
            // The engine would refuse those (EPERM), so they run with
            // root's rights; everything else runs as the caller.
            let cred = if cred.is_root() || cred.uid == st.uid {
                cred
            } else {
                Cred::root()
            };
            res(self.fs.setattr(ino, attr, &cred))?;
        }
        self.attr(ino)
    }

    /// The engine's caller for a change made by the sender of a request:
    /// its ids as `cred`, CAP_FSETID as `fsetid` says, and its
    /// supplementary groups from `groups`, read only if the engine asks
    /// (the setgid rule for a file without group execute).
    fn caller<'a>(cred: &'a Cred, fsetid: bool, groups: &'a dyn Fn() -> Vec<u32>) -> Caller<'a> {
        Caller {
            cred,
            fsetid,
            more_groups: Some(groups),
        }
    }

    /// One WRITE to `inode`, translated: `at` as the kernel positions it,
    /// by the request's sender with CAP_FSETID or not (`fsetid`);
    /// `from_cache`: a write-back whose times the kernel owns. The rules
    /// — immutable, append-only, the setuid/setgid and capability kill,
    /// synchronous inodes — are the engine's (`Fs::write_inode`). The
    /// kernel does not refresh its cached mode after a write, so the
    /// attributes are dropped when the engine cleared bits.
    fn do_write(
        &self,
        req: &Request,
        inode: &CachedInode,
        at: WriteAt,
        data: &[u8],
        fsetid: bool,
        from_cache: bool,
    ) -> Result<usize, Errno> {
        let cred = Cred::user(req.uid(), req.gid());
        let groups = || proc_groups(req.pid());
        let w = res(self.fs.write_inode(
            inode,
            &WriteRequest {
                data,
                at,
                caller: Self::caller(&cred, fsetid, &groups),
                stamp_times: !from_cache,
                // O_SYNC / O_DSYNC: the kernel follows the WRITE with an
                // FSYNC (`generic_write_sync` in fuse_file_write_iter).
                sync: None,
            },
        ))?;
        if w.privs_cleared {
            self.inval.attrs(to_fuse(inode.ino));
        }
        Ok(w.len)
    }

    /// FALLOCATE on `inode` by the sender of `req` (CAP_FSETID: uid 0),
    /// translated; the engine clears setuid/setgid first, for every mode
    /// (`ext4_fallocate` → `file_modified`), and the reply carries no
    /// attributes, so the kernel's are dropped when it did.
    fn do_fallocate(&self, req: &Request, inode: &CachedInode, f: Fallocate) -> Result<(), Errno> {
        let cred = Cred::user(req.uid(), req.gid());
        let groups = || proc_groups(req.pid());
        if res(self
            .fs
            .fallocate_inode(inode, f, &Self::caller(&cred, req.uid() == 0, &groups)))?
        {
            self.inval.attrs(to_fuse(inode.ino));
        }
        Ok(())
    }

    /// The inode a file request works on and whether its writes keep
    /// setuid/setgid: the handle OPEN or CREATE made, or, for a file opened
    /// without OPEN (`no_open`, handle 0), the inode itself (the kernel
    /// checked the open mode and kills setuid/setgid itself where a request
    /// does not say).
    fn target(&self, ino: INodeNo, fh: FileHandle) -> Result<(Arc<CachedInode>, bool), Errno> {
        match self.file(fh) {
            Ok(h) => match &*h {
                Handle::File(f) => Ok((f.file().inode.clone(), f.privileged)),
                Handle::Dir(_) => Err(Errno::EISDIR),
            },
            Err(Errno::EBADF) if self.no_open => Ok((res(self.fs.inode(Self::ino(ino)?))?, true)),
            Err(e) => Err(e),
        }
    }

    /// The mode a new inode asks for: with POSIX ACL support the kernel
    /// sends the umask unapplied (`FUSE_DONT_MASK`) and the engine applies
    /// it or the parent's default ACL; without, the kernel applied it.
    fn create_mode(&self, mode: u32, umask: u32) -> CreateMode {
        CreateMode {
            perm: (mode & 0o7777) as u16,
            umask: if self.posix_acl { (umask & 0o777) as u16 } else { 0 },
        }
    }

    fn do_copy(
        &self,
        req: &Request,
        (ino_in, fh_in): (INodeNo, FileHandle),
        off_in: u64,
        (ino_out, fh_out): (INodeNo, FileHandle),
        off_out: u64,
        len: u64,
    ) -> Result<u32, Errno> {
        let (fin, _) = self.target(ino_in, fh_in)?;
        let (fout, keep) = self.target(ino_out, fh_out)?;
        // The reply carries a 32-bit count: copy at most that much per call
        // (copy_file_range(2) may copy less than asked; callers loop).
        let len = len.min(u64::from(u32::MAX) & !0xfff) as usize;
        let mut buf = vec![0u8; len.min(COPY_CHUNK)];
        let mut done = 0usize;
        while done < len {
            let want = (len - done).min(buf.len());
            let n = match self.fs.read_at(&fin, off_in + done as u64, &mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(errno(&e)),
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            // At the offset given: the kernel refuses O_APPEND targets.
            let w = match self.do_write(
                req,
                &fout,
                WriteAt::Offset(off_out + done as u64),
                &buf[..n],
                keep,
                false,
            ) {
                Ok(w) => w,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            done += w;
            if w < n {
                break;
            }
        }
        Ok(done as u32)
    }
}

/// The supplementary groups of process `pid` (FUSE requests carry only
/// the uid and gid): the `Groups:` line of /proc/PID/status, none if it
/// cannot be read (the process is gone).
fn proc_groups(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    s.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|g| g.parse().ok()).collect())
        .unwrap_or_default()
}

/// FUSE's `TimeOrNow` as the engine's `TimeSet`.
fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::Set(timestamp(t)),
    }
}

/// A time from a FUSE request as an ext4 timestamp. fuser 0.18 builds
/// request times before 1970 as `UNIX_EPOCH - Duration::new(-sec, nsec)`
/// from the kernel's (sec, nsec) (its `system_time_from_time`, which
/// subtracts the nanoseconds instead of adding them), so the kernel's pair
/// is read back the same way: whole seconds negated, nanoseconds as they
/// are.
fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            Timestamp {
                sec: -(d.as_secs() as i64),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

/// The file type in a `mode`'s S_IFMT bits (MKNOD).
fn mode_type(mode: u32) -> Result<Ft, Errno> {
    Ok(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Ft::Regular,
        libc::S_IFCHR => Ft::CharDevice,
        libc::S_IFBLK => Ft::BlockDevice,
        libc::S_IFIFO => Ft::Fifo,
        libc::S_IFSOCK => Ft::Socket,
        _ => return Err(Errno::EINVAL),
    })
}

/// The kernel's `new_decode_dev`: FUSE's 32-bit `rdev` as (major, minor).
fn decode_dev(rdev: u32) -> (u32, u32) {
    ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00))
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Filesystem for Ext4Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each capability alone: an old kernel lacking one keeps the rest.
        for cap in [
            // Lookups and readdirs in one directory run in parallel (the
            // engine's directory lookups take the directory's shared lock;
            // changes take it exclusively).
            InitFlags::FUSE_PARALLEL_DIROPS,
            // READDIRPLUS answers names and attributes in one round trip;
            // AUTO lets the kernel use it only when the caller stats.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            // Symlink targets cached in the kernel's page cache.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Reads of several pages in flight per file.
            InitFlags::FUSE_ASYNC_READ,
            // File handles that survive cache drops and remounts: LOOKUP
            // of "." and ".." by node id (see `crate::export`).
            InitFlags::FUSE_EXPORT_SUPPORT,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // OPEN is served by default: only there can an open for writing of
        // an immutable or append-only file be refused, as ext4's
        // `may_open` does (FUSE inodes carry no S_IMMUTABLE/S_APPEND for
        // the kernel to check; xfstests generic/079), at one round trip per
        // open (RELEASE goes in the background). With `-o no_open` and
        // write-through caching, opening a file needs no state here:
        // OPEN answers ENOSYS once and the kernel then
        // opens and closes files without asking us (FUSE_NO_OPEN_SUPPORT),
        // so open/close cost no round trip. Reads, writes, fsync, fallocate
        // and lseek then go by inode number. What RELEASE did for us is
        // done otherwise: the kernel holds its lookup reference to an open
        // file's inode until the last close (FORGET comes after it), and
        // our hold (`Nodes`) keeps an unlinked inode allocated until
        // then; the kernel's `may_open` checked the access mode; each WRITE
        // says whether to clear setuid/setgid (FUSE_WRITE_KILL_SUIDGID) and
        // whether the file appends (its flags); immutable and append-only
        // inodes are refused by the engine's write path itself. Not with
        // write-back caching either: the kernel accepts buffered writes
        // without asking us, so a write to an immutable or append-only file
        // could only fail later, at write-back, with its data already
        // "written"; there OPEN refuses such opens (`may_open`'s rule, as
        // ext4), at the cost of an OPEN/RELEASE round trip per open.
        self.no_open = self.want_no_open
            && self.cache == CacheMode::WriteThrough
            && config.add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT).is_ok();
        // No FUSE_ATOMIC_O_TRUNC: with it the kernel passes O_TRUNC to
        // OPEN and checks ETXTBSY only afterwards (`do_open` →
        // `handle_truncate` → `get_write_access`, after `vfs_open`), so an
        // O_TRUNC open of a running binary emptied the file here and then
        // failed with ETXTBSY — the program died of SIGBUS, its write
        // denial went with it, and the open could even succeed (pjdfstest
        // open::etxtbsy failed 11 runs in 30). Without it the kernel
        // truncates by SETATTR after that check, as ext4 does, at one more
        // round trip per truncating open of an existing file (a created
        // file is not truncated at all: FMODE_CREATED).
        // POSIX ACLs: the kernel reads them (GETXATTR system.posix_acl_*),
        // caches them and checks permissions with them; setting one goes
        // through its validation (`posix_acl_from_xattr`) to SETXATTR,
        // whose engine keeps the mode in step (`posix_acl_update_mode`).
        // New inodes are ours: with DONT_MASK the kernel sends the umask
        // unapplied, and the engine applies the parent's default ACL or the
        // umask in the creating transaction (`posix_acl_create` in ext4).
        // Both or neither: without DONT_MASK the kernel would apply the
        // umask first and a default ACL could not be applied correctly.
        self.posix_acl = config
            .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
            .is_ok();
        if !self.read_only {
            // The setuid/setgid kill of writes and truncations is ours
            // (the engine's write and truncate paths apply it for callers
            // without CAP_FSETID). Without it the kernel asks for
            // security.capability (GETXATTR) before every write(): with
            // it the superblock gets SB_NOSEC and that round trip goes.
            self.killpriv = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
            match self.cache {
                CacheMode::Writeback => {
                    self.writeback = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).is_ok();
                }
                CacheMode::Direct => {
                    // Shared writable mmap of direct-I/O files (kernel 6.6+).
                    let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
                }
                CacheMode::WriteThrough => {}
            }
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
        *self.negotiated.lock() = Some(config.capabilities());
        Ok(())
    }

    fn destroy(&mut self) {
        // Files still open (a lazy unmount, a killed client) are closed
        // through the engine first: unlinked ones are freed.
        self.handles.clear();
        self.nodes.release_all(&self.fs);
        if let Err(e) = self.fs.sync() {
            eprintln!("ext4kit: flushing at unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.busy.touch();
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
        self.busy.touch();
        if let Some(i) = to_ext4(ino) {
            self.nodes.forget(&self.fs, i, nlookup);
        }
    }

    // BATCH_FORGET: fuser's default calls `forget` for each node (its
    // ForgetOne type is not public, so it cannot be overridden).

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.busy.touch();
        match Self::ino(ino).and_then(|i| self.attr(i)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.busy.touch();
        if flags.is_some() {
            // BSD file flags (macOS chflags) have no Linux request.
            return reply.error(Errno::ENOSYS);
        }
        let attr = SetAttr {
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        match self.do_setattr(req, ino, size, &attr, ctime.is_some() && size.is_none()) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.busy.touch();
        match Self::ino(ino).and_then(|i| res(self.fs.read_link(i))) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        self.busy.touch();
        // `mode` carries the type and the requested permissions; the umask
        // or the parent's default ACL is the engine's (see `create_mode`).
        let r = Self::ino(parent).and_then(|p| {
            let t = mode_type(mode)?;
            let st = res(self.fs.create(
                &NewInode::new(
                    Target::at(p, name.as_bytes()),
                    res(NodeKind::mknod(t, decode_dev(rdev)))?,
                )
                .mode(self.create_mode(mode, umask))
                .cred(&Self::cred(req)),
            ))?;
            self.entry_of(&st)
        });
        reply_entry(reply, r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.busy.touch();
        let r = Self::ino(parent).and_then(|p| {
            let st = res(self.fs.create(
                &NewInode::dir(Target::at(p, name.as_bytes()))
                    .mode(self.create_mode(mode, umask))
                    .cred(&Self::cred(req)),
            ))?;
            self.entry_of(&st)
        });
        reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy.touch();
        let r = Self::ino(parent).and_then(|p| res(self.fs.unlink(Target::at(p, name.as_bytes()), &Self::cred(req))));
        reply_empty(reply, r);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy.touch();
        let r = Self::ino(parent).and_then(|p| res(self.fs.rmdir(Target::at(p, name.as_bytes()), &Self::cred(req))));
        reply_empty(reply, r);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.busy.touch();
        let r = Self::ino(parent).and_then(|p| {
            let st = res(self.fs.create(
                &NewInode::symlink(Target::at(p, link_name.as_bytes()), target.as_os_str().as_bytes())
                    .cred(&Self::cred(req)),
            ))?;
            self.entry_of(&st)
        });
        reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.busy.touch();
        let r = (|| {
            let (from, to) = (Self::ino(parent)?, Self::ino(newparent)?);
            let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT;
            if !known.contains(flags) {
                return Err(Errno::EINVAL);
            }
            // RENAME_WHITEOUT is overlayfs' copy-up and delete
            // (vfs/whiteout.rs); the kernel checked CAP_MKNOD for it.
            let f = ext4kit::RenameFlags {
                noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
                whiteout: flags.contains(RenameFlags::RENAME_WHITEOUT),
            };
            res(self.fs.rename(
                Target::at(from, name.as_bytes()),
                Target::at(to, newname.as_bytes()),
                f,
                &Self::cred(req),
            ))
        })();
        reply_empty(reply, r);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.busy.touch();
        let r = (|| {
            let to = Self::ino(newparent)?;
            let st = res(self
                .fs
                .link(Self::ino(ino)?, Target::at(to, newname.as_bytes()), &Self::cred(req)))?;
            self.entry_of(&st)
        })();
        reply_entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.busy.touch();
        let r = (|| {
            let ino = Self::ino(ino)?;
            if self.read_only && (flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0) {
                return Err(Errno::EROFS);
            }
            if self.no_open {
                // Check it exists and is not a directory, then let the
                // kernel stop asking (see `init`). Files opened that way keep
                // their page cache (the kernel's default for no-open is
                // FOPEN_KEEP_CACHE), as our OPEN replies asked. An O_TRUNC
                // open is followed by a SETATTR of the size (no
                // FUSE_ATOMIC_O_TRUNC with no-open).
                let inode = res(self.fs.inode(ino))?;
                if inode.ftype == Ft::Directory {
                    return Err(Errno::EISDIR);
                }
                return Err(Errno::ENOSYS);
            }
            // The kernel checked the mode bits (default_permissions). The
            // engine's open applies the append-only rule (`may_open`: a
            // writable open of an append-only inode needs O_APPEND), so it
            // is told about O_APPEND; its file is never written through
            // its own position (WRITE says where), so that is all it does.
            // O_TRUNC is the engine's too, with its setuid/setgid kill.
            let mut ef = self.engine_flags(flags.0);
            ef.append = flags.0 & libc::O_APPEND != 0;
            let f = res(self
                .fs
                .open_as(ino, &OpenRequest::new(ef).cred(&Self::cred(req)).check(PermCheck::Done)))?;
            if f.is_dir() {
                return Err(Errno::EISDIR);
            }
            Ok(self
                .handles
                .insert(Handle::File(OpenFile::new(self.fs.clone(), f, req.uid() == 0))))
        })();
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), self.fopen_flags()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.busy.touch();
        let r = (|| {
            let p = Self::ino(parent)?;
            if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
                return Err(Errno::EINVAL);
            }
            // An existing name is opened, not created (O_CREAT without
            // O_EXCL): it keeps its mode and ACLs.
            let cred = Self::cred(req);
            let open = ext4kit::OpenFlags {
                create: true,
                ..self.engine_flags(flags)
            };
            let how = OpenRequest::new(open)
                .mode(self.create_mode(mode, umask))
                .cred(&cred)
                .check(PermCheck::Done);
            let f = res(self.fs.open_as(Target::at(p, name.as_bytes()), &how))?;
            let (a, g) = match res(self.fs.stat(f.inode.ino)).and_then(|st| self.entry_of(&st)) {
                Ok(x) => x,
                Err(e) => {
                    if let Err(c) = self.fs.close_file(f) {
                        eprintln!("ext4kit: closing a file whose creation could not be answered: {c}");
                    }
                    return Err(e);
                }
            };
            // Without a handle under no-open the engine's file closes here
            // (the new inode is linked).
            Ok((a, g, self.created_handle(req, f, drop)))
        })();
        match r {
            Ok((a, g, fh)) => reply.created(&TTL, &a, g, FileHandle(fh), self.fopen_flags()),
            Err(e) => reply.error(e),
        }
    }

    /// `open(O_TMPFILE)` (FUSE_TMPFILE, sent by the kernel's `fuse_tmpfile`
    /// with CREATE's body): an unnamed regular inode on the orphan list,
    /// opened, answered as CREATE. The kernel marks its inode linkable
    /// (`I_LINKABLE`) unless the open had O_EXCL and refuses other links
    /// itself; the engine keeps the same mark, so LINK names the inode only
    /// then. With `-o no_open` the open is closed here and the node's
    /// lookup count keeps the inode until FORGET.
    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        self.busy.touch();
        let r = (|| {
            let p = Self::ino(parent)?;
            if self.read_only {
                return Err(Errno::EROFS);
            }
            if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
                return Err(Errno::EINVAL);
            }
            // The engine takes from the flags what is the open's (the
            // access mode; O_TMPFILE's O_DIRECTORY is not) and O_EXCL as
            // "never linkable". The default ACL is inherited as for a
            // create (the engine's).
            let cred = Self::cred(req);
            let how = OpenRequest::new(self.engine_flags(flags))
                .mode(self.create_mode(mode, umask))
                .cred(&cred);
            let f = res(self.fs.tmpfile_open(p, &how))?;
            let close = |f| {
                if let Err(e) = self.fs.close_file(f) {
                    eprintln!("ext4kit: closing a tmpfile: {e}");
                }
            };
            let (a, g) = match res(self.fs.stat(f.inode.ino)).and_then(|st| self.entry_of(&st)) {
                Ok(x) => x,
                Err(e) => {
                    close(f);
                    return Err(e);
                }
            };
            // Without a handle under no-open, the node's hold (entry_of)
            // keeps the nameless inode past this close.
            Ok((a, g, self.created_handle(req, f, close)))
        })();
        match r {
            Ok((a, g, fh)) => reply.created(&TTL, &a, g, FileHandle(fh), self.fopen_flags()),
            Err(e) => reply.error(e),
        }
    }

    /// statx(2) beyond the basic stats (FUSE_STATX: the kernel asks when a
    /// caller wants the birth time): GETATTR's attributes, the birth time
    /// from `i_crtime` when the record has room for it, and the
    /// `STATX_ATTR_*` bits ext4_getattr derives from the inode flags.
    fn statx(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, _flags: u32, _mask: u32, reply: ReplyStatx) {
        self.busy.touch();
        match Self::ino(ino).and_then(|i| res(self.fs.stat(i))) {
            Ok(st) => {
                let (attributes, mask) = st.statx_attributes();
                reply.statx(&TTL, &file_attr(&st, self.block_size), st.has_crtime, attributes, mask)
            }
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
        self.busy.touch();
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            let buf = &mut buf[..size as usize];
            let r = self.handles.with(fh.0, |h| match h {
                Handle::File(f) => self.fs.pread(f.file(), offset, buf),
                Handle::Dir(_) => Err(ext4kit::Error::posix(ext4kit::Errno::EISDIR, "read of a directory")),
            });
            // No handle (fh 0): opened without OPEN (see `init`); read by inode.
            let r = r.or_else(|| {
                if !self.no_open {
                    return None;
                }
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

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.busy.touch();
        // An O_APPEND write (the file's flags at the time of the write)
        // goes to the end of file as the engine sees it, atomically under
        // the inode lock (the kernel's offset is only its view of the size).
        // With write-back caching the kernel positions appends itself and
        // its write-back writes are plain writes at its offsets.
        let append = flags.0 & libc::O_APPEND != 0 && !self.writeback;
        // With write-back caching, a write-back of the kernel's page cache
        // (FUSE_WRITE_CACHE) carries data whose mtime/ctime the kernel
        // stamped at write(2) and sends itself (SETATTR): the engine must
        // not stamp the later time of the write-back over them. Without
        // it the flag marks the write-back of mmap'ed pages, whose times
        // are ours to stamp (xfstests generic/080).
        let from_cache = self.writeback && write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // Where: at the end for an append; with write-back caching where
        // the kernel placed it (it positions appends itself, and its OPEN
        // refused non-appending writers of append-only files); else at
        // the offset.
        let at = if append {
            WriteAt::End
        } else if self.writeback {
            WriteAt::Placed(offset)
        } else {
            WriteAt::Offset(offset)
        };
        let r = self.handles.with(fh.0, |h| match h {
            Handle::File(f) => self.do_write(req, &f.file().inode, at, data, f.privileged, from_cache),
            Handle::Dir(_) => Err(Errno::EISDIR),
        });
        // Opened without OPEN: write the inode. The kernel tells whether
        // the writer may keep setuid/setgid (it lacks CAP_FSETID: kill);
        // without KILLPRIV_V2 the kernel kills them itself beforehand.
        let r = r.or_else(|| {
            if !self.no_open {
                return None;
            }
            let keep = !(self.killpriv && write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID));
            Some(Self::ino(ino).and_then(|i| {
                let inode = res(self.fs.inode(i))?;
                self.do_write(req, &inode, at, data, keep, from_cache)
            }))
        });
        match r {
            Some(Ok(n)) => reply.written(n as u32),
            Some(Err(e)) => {
                if from_cache {
                    self.lost.record(ino.0, offset, data.len(), e);
                }
                reply.error(e)
            }
            None => reply.error(Errno::EBADF),
        }
    }

    // Nothing is buffered between the kernel and the engine's page cache,
    // which is the engine's to write back (as the kernel's own is): a
    // close needs no work here. (Write-back caching: the kernel writes its
    // dirty pages back at close before it would send FLUSH, `fuse_flush`.)
    // ENOSYS tells the kernel so once (`fc->no_flush`): closes then cost
    // no round trip, also for files opened without OPEN, which cannot
    // carry FOPEN_NOFLUSH. POSIX locks are the kernel's (see the crate
    // documentation), so no lock owner needs FLUSH either.
    //
    // The one exception: a write-back of this file failed since the last
    // report (an I/O error on the image); the close returns that error.
    // Once a close got ENOSYS the kernel sends no FLUSH again, so after
    // that only fsync reports such errors (docs/durability.md, "When
    // write-back fails anyway").
    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.busy.touch();
        let pending = Self::ino(ino)
            .ok()
            .and_then(|i| self.fs.inode(i).ok())
            .and_then(|inode| self.fs.take_writeback_error(&inode));
        match pending {
            Some(e) => {
                eprintln!("ext4kit: reporting at close: {e}");
                reply.error(errno(&e))
            }
            None => reply.error(Errno::ENOSYS),
        }
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
        self.busy.touch();
        // Closes through the engine (Fs::close_file): the last close of an
        // unlinked file frees it.
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.busy.touch();
        let r = (|| {
            let inode = match self.handles.get(fh.0) {
                Some(h) => match &*h {
                    Handle::File(f) => f.file().inode.clone(),
                    Handle::Dir(_) => return Err(Errno::EISDIR),
                },
                None => res(self.fs.inode(Self::ino(ino)?))?,
            };
            res(self
                .fs
                .fsync_inode(&inode, if datasync { SyncLevel::Data } else { SyncLevel::All }))
            .map(|_| ())
        })();
        reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.busy.touch();
        // The listing is taken by the first READDIR, under the kernel's
        // directory lock (see `OpenDir`); here only the inode is checked.
        let dir = Self::ino(ino).and_then(|i| match res(self.fs.inode(i))?.ftype {
            Ft::Directory => Ok(i),
            _ => Err(Errno::ENOTDIR),
        });
        match dir {
            // CACHE_DIR + KEEP_CACHE: the kernel may keep the listing in its
            // page cache across opens (it drops it when the directory changes
            // through the mount, the only way it can change).
            Ok(i) => reply.opened(
                FileHandle(self.handles.insert(Handle::Dir(OpenDir::new(i)))),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.busy.touch();
        let r = self.handles.with(fh.0, |h| {
            let Handle::Dir(d) = h else {
                return Err(Errno::ENOTDIR);
            };
            let entries = d.listing(offset, || self.listing(d.ino))?;
            for (i, (name, ino, t)) in entries.iter().enumerate().skip(offset as usize) {
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
        self.busy.touch();
        let r = self.handles.with(fh.0, |h| {
            let Handle::Dir(d) = h else {
                return Err(Errno::ENOTDIR);
            };
            let entries = d.listing(offset, || self.listing(d.ino))?;
            for (added, (i, (name, ino, _))) in entries.iter().enumerate().skip(offset as usize).enumerate() {
                let one = |ino: u32| -> Result<_, Errno> {
                    if ino == 1 {
                        // FUSE's node 1 is the root: an entry naming ext4's
                        // bad-blocks inode cannot be handed out (corruption).
                        return Err(Errno::from_i32(libc::EUCLEAN));
                    }
                    let inode = res(self.fs.inode(ino))?;
                    let st = res(self.fs.stat(ino))?;
                    // Every entry sent but "." and ".." takes a lookup
                    // count (the kernel's fuse_direntplus_link), taken
                    // before the entry goes in; it fails for an inode
                    // freed since it was looked up.
                    if !is_dot(name) {
                        res(self.nodes.remember(&self.fs, &inode))?;
                    }
                    Ok((inode, st))
                };
                // The kernel binds each name sent here to its inode in its
                // dentry cache (fuse_direntplus_link replaces a dentry that
                // names another node), so the binding must be the
                // directory's now, not the listing's: the listing was taken
                // at offset 0, and between two READDIRPLUS calls of one
                // listing the directory may change. A name renamed over
                // since then still names its old inode there, and
                // that inode may live on, unlinked, while the kernel holds
                // it. Sent, it made the kernel's `atomic` name the replaced
                // file again and its `tmp` name the file renamed away, which
                // the next O_TRUNC open of `tmp` then emptied (stress test
                // `directory_readers_...`). Looked up now, it is exact: the
                // kernel holds the directory's lock shared for the whole
                // READDIRPLUS, and every change to the directory (create,
                // unlink, rename) holds it exclusively until its reply is
                // applied. A name removed since is skipped. Read-only
                // mounts' listings cannot go stale.
                let now = || -> Result<_, Errno> {
                    if self.read_only || is_dot(name) {
                        return one(*ino);
                    }
                    match res(self.fs.lookup_at(d.ino, name))? {
                        Some((now, _)) => one(now),
                        None => Err(Errno::ENOENT),
                    }
                };
                let (inode, st) = match now() {
                    Ok(x) => x,
                    Err(_) if !self.read_only => continue,
                    // Report the failure on the entry it belongs to: return
                    // what fits before it; the next call starts there.
                    Err(e) if added == 0 => return Err(e),
                    Err(_) => break,
                };
                let counted = !is_dot(name);
                let attr = file_attr(&st, self.block_size);
                let full = reply.add(
                    to_fuse(inode.ino),
                    i as u64 + 1,
                    OsStr::from_bytes(name),
                    &TTL,
                    &attr,
                    Generation(export::generation(st.ino, st.generation)),
                );
                if full {
                    // Not sent after all.
                    if counted {
                        self.nodes.forget(&self.fs, inode.ino, 1);
                    }
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

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.busy.touch();
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.busy.touch();
        let r = (|| {
            let dir = match self.handles.with(fh.0, |h| match h {
                Handle::Dir(d) => Some(d.ino),
                Handle::File(_) => None,
            }) {
                Some(Some(d)) => d,
                Some(None) => return Err(Errno::ENOTDIR),
                None => Self::ino(ino)?,
            };
            let inode = res(self.fs.inode(dir))?;
            res(self
                .fs
                .fsync_inode(&inode, if datasync { SyncLevel::Data } else { SyncLevel::All }))
            .map(|_| ())
        })();
        reply_empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.busy.touch();
        match crate::statfs::statfs(&self.fs) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.busy.touch();
        let r = Self::ino(ino).and_then(|i| {
            res(self
                .fs
                .setxattr(i, name.as_bytes(), value, flags as u32, &Self::cred(req)))
        });
        reply_empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.busy.touch();
        let r = Self::ino(ino).and_then(|i| res(self.fs.getxattr(i, name.as_bytes(), &Self::cred(req))));
        match r {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.busy.touch();
        match Self::ino(ino).and_then(|i| res(self.fs.listxattr(i, &Self::cred(req)))) {
            Ok(all) => {
                let mut list = Vec::new();
                for n in all {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                xattr_reply(reply, size, &list)
            }
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy.touch();
        // The kernel's removal of file capabilities when an unprivileged
        // user writes, truncates or fallocates (see `crate::killpriv`).
        let cred = if is_capability_kill(name.as_bytes(), req.uid()) {
            Cred::root()
        } else {
            Self::cred(req)
        };
        let r = Self::ino(ino).and_then(|i| res(self.fs.removexattr(i, name.as_bytes(), &cred)));
        reply_empty(reply, r);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.busy.touch();
        // The engine's check: mode bits, ACLs, EROFS for writes to a
        // read-only filesystem, immutable inodes.
        let r = Self::ino(ino).and_then(|i| res(self.fs.access(i, (mask.bits() & 7) as u8, &Self::cred(req))));
        reply_empty(reply, r);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.busy.touch();
        // Modes, their errors and the setuid/setgid kill are the
        // engine's (Fs::fallocate_inode); the kernel checked the file is
        // open for writing (`vfs_fallocate`).
        let f = Fallocate {
            mode: mode as u32,
            off: offset,
            len: length,
        };
        let r = self.handles.with(fh.0, |h| match h {
            Handle::File(file) => self.do_fallocate(req, &file.file().inode, f),
            Handle::Dir(_) => Err(Errno::EISDIR),
        });
        // Opened without OPEN (the kernel refused files not open for
        // writing already: EBADF in `vfs_fallocate`).
        let r = r.or_else(|| {
            if !self.no_open {
                return None;
            }
            Some(Self::ino(ino).and_then(|i| {
                let inode = res(self.fs.inode(i))?;
                if inode.ftype != Ft::Regular {
                    return Err(Errno::ENODEV);
                }
                self.do_fallocate(req, &inode, f)
            }))
        });
        match r {
            Some(Ok(())) => reply.ok(),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        self.busy.touch();
        // With write-back caching the kernel holds written data we have
        // not seen, and `fuse_lseek` asks us without writing it back first:
        // our map would call its dirty pages a hole, and `cp`, `tar` and
        // every SEEK_DATA/SEEK_HOLE copier would skip them. ENOSYS makes the
        // kernel set `no_lseek` and answer from its own i_size instead
        // (`generic_file_llseek`: the whole file is data), which is always
        // right, if coarse.
        if self.writeback {
            return reply.error(Errno::ENOSYS);
        }
        let whence = match whence {
            libc::SEEK_SET => Whence::Set,
            libc::SEEK_CUR => Whence::Cur,
            libc::SEEK_END => Whence::End,
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self.handles.with(fh.0, |h| match h {
            Handle::File(f) => self.fs.lseek(f.file(), offset, whence).map_err(|e| errno(&e)),
            Handle::Dir(_) => Err(Errno::EINVAL),
        });
        // Opened without OPEN: a transient open file answers the question.
        let r = r.or_else(|| {
            if !self.no_open {
                return None;
            }
            let i = to_ext4(ino)?;
            Some(
                res(self.fs.open(i, EngineOpen::default()))
                    .and_then(|f| self.fs.lseek(&f, offset, whence).map_err(|e| errno(&e))),
            )
        });
        match r {
            Some(Ok(p)) => reply.offset(p as i64),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.busy.touch();
        // By inode: flags and the label do not depend on the open file.
        let r = Self::ino(ino).and_then(|i| crate::ioctl::ioctl(&self.fs, i, cmd, in_data, &Self::cred(req)));
        match r {
            Ok(mut out) => {
                // A flag change moves ctime (ext4_ioctl_setflags), which the
                // kernel has cached with a long TTL and does not drop after
                // an ioctl (xfstests generic/277: "ctime not updated after
                // chattr").
                if matches!(
                    cmd,
                    crate::ioctl::FS_IOC_SETFLAGS | crate::ioctl::FS_IOC32_SETFLAGS | crate::ioctl::FS_IOC_FSSETXATTR
                ) {
                    self.inval.attrs(ino);
                }
                out.truncate(out_size as usize);
                reply.ioctl(0, &out)
            }
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.busy.touch();
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        // An engine read and write per piece (no block sharing in ext4).
        match self.do_copy(req, (ino_in, fh_in), offset_in, (ino_out, fh_out), offset_out, len) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
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

/// Answer a request that returns nothing but success or an errno.
fn reply_empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Answer a request that creates or finds a name with the new entry.
fn reply_entry(reply: ReplyEntry, r: Result<(fuser::FileAttr, Generation), Errno>) {
    match r {
        Ok((a, g)) => reply.entry(&TTL, &a, g),
        Err(e) => reply.error(e),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_1970_undo_fusers_encoding() {
        // The kernel's (-2, 750_000_000) is -1.25 s; fuser hands it over
        // as EPOCH - 2.75 s.
        let from_fuser = UNIX_EPOCH - Duration::new(2, 750_000_000);
        assert_eq!(
            timestamp(from_fuser),
            Timestamp {
                sec: -2,
                nsec: 750_000_000
            }
        );
        let t = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(timestamp(t), Timestamp { sec: 5, nsec: 7 });
    }

    #[test]
    fn devices_decode_like_the_kernel() {
        for (ma, mi) in [(8, 1), (1, 0x12345), (259, 70000), (0, 0)] {
            assert_eq!(decode_dev(crate::attr::encode_dev(ma, mi)), (ma, mi));
        }
        assert_eq!(mode_type(libc::S_IFIFO | 0o644), Ok(Ft::Fifo));
        assert_eq!(mode_type(libc::S_IFDIR), Err(Errno::EINVAL));
    }
}
