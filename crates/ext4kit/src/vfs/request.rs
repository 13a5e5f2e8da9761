//! The arguments of the calls that take more than a few, as request
//! types: a new inode and its name ([`NewInode`]), an open on behalf of a
//! caller ([`OpenRequest`]), where a write goes and who makes it
//! ([`WriteRequest`]), what it did ([`Written`]), an fallocate's range
//! ([`Fallocate`]). Their own module, below the open file (`file.rs`) and
//! the operations (`write.rs`, `namespace.rs`, `open.rs`, `io.rs`) that
//! take them.

use ext4kit_format::inode::FileType;

use super::cred::{Caller, Cred, ROOT};
use super::file::OpenFlags;
use super::target::Target;
use super::writeback::SyncLevel;
use crate::error::{Errno, Error, Result};

/// The mode a creating call asks for: the permission bits (with setuid,
/// setgid and sticky) and the creator's umask. The umask applies only
/// when the parent has no default ACL (see the module doc); a caller that
/// applied it already passes 0 — a plain `u16` converts to that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateMode {
    /// Requested mode bits (`0o7777` of them count).
    pub perm: u16,
    /// The creator's umask (`0o777` of it counts).
    pub umask: u16,
}

impl From<u16> for CreateMode {
    fn from(perm: u16) -> Self {
        CreateMode { perm, umask: 0 }
    }
}

impl From<(u16, u16)> for CreateMode {
    /// `(perm, umask)`.
    fn from((perm, umask): (u16, u16)) -> Self {
        CreateMode { perm, umask }
    }
}

/// What kind of inode [`NewInode`] makes, with what only that kind needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind<'a> {
    /// An empty regular file (`creat`, `open(O_CREAT)`).
    File,
    /// A directory holding "." and ".." (`mkdir`).
    Dir,
    /// A symbolic link to this target (`symlink`; 1 to 4095 bytes, less
    /// than a block).
    Symlink(&'a [u8]),
    /// A character device with this major and minor number.
    CharDevice(u32, u32),
    /// A block device with this major and minor number.
    BlockDevice(u32, u32),
    /// A named pipe.
    Fifo,
    /// A Unix-domain socket.
    Socket,
}

impl NodeKind<'_> {
    /// What `mknod(2)` makes of a file type from the mode bits and a
    /// device number: EINVAL for a directory or a symlink, which have
    /// calls of their own.
    pub fn mknod(ftype: FileType, rdev: (u32, u32)) -> Result<NodeKind<'static>> {
        Ok(match ftype {
            FileType::Regular => NodeKind::File,
            FileType::CharDevice => NodeKind::CharDevice(rdev.0, rdev.1),
            FileType::BlockDevice => NodeKind::BlockDevice(rdev.0, rdev.1),
            FileType::Fifo => NodeKind::Fifo,
            FileType::Socket => NodeKind::Socket,
            FileType::Directory | FileType::Symlink => {
                return Err(Error::posix(Errno::EINVAL, format!("mknod cannot make a {ftype:?}")))
            }
        })
    }

    /// The file type of the inode it makes.
    pub fn file_type(&self) -> FileType {
        match self {
            NodeKind::File => FileType::Regular,
            NodeKind::Dir => FileType::Directory,
            NodeKind::Symlink(_) => FileType::Symlink,
            NodeKind::CharDevice(..) => FileType::CharDevice,
            NodeKind::BlockDevice(..) => FileType::BlockDevice,
            NodeKind::Fifo => FileType::Fifo,
            NodeKind::Socket => FileType::Socket,
        }
    }
}

/// A new inode and its name: what `creat`, `mknod`, `mkdir` and `symlink`
/// take, as one description ([`Fs::create`](super::Fs::create)).
///
/// Built from where the name goes and what the inode is, with the mode,
/// the caller and the owner as the defaults say unless set:
///
/// ```no_run
/// # fn f(fs: &ext4kit::Fs) -> ext4kit::Result<()> {
/// use ext4kit::{Cred, NewInode, NodeKind, Target};
/// // Image building: root makes it, owned as the source tree says.
/// fs.create(&NewInode::dir(b"/srv").mode(0o750).owner(33, 33))?;
/// fs.create(&NewInode::new(b"/dev/null", NodeKind::CharDevice(1, 3)).mode(0o666))?;
/// // A frontend acting for a user, by parent inode and name; the umask
/// // applies unless the parent has a default ACL.
/// let user = Cred::user(1000, 1000);
/// let req = NewInode::file(Target::at(2, b"notes")).mode((0o666, 0o022)).cred(&user);
/// fs.create(&req)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct NewInode<'a> {
    /// Where its name goes: a path, or a name in a directory
    /// ([`Target::at`]).
    pub at: Target<'a>,
    /// What it is.
    pub kind: NodeKind<'a>,
    /// Its permission bits (with setuid, setgid, sticky) and the creator's
    /// umask. Defaults: 0755 for a directory, 0644 for the rest; a
    /// symlink's mode is always 0777.
    pub mode: CreateMode,
    /// Who makes it: the permission to change the directory, and the
    /// owner unless [`Self::owner`] is set. Defaults to root.
    pub cred: &'a Cred,
    /// An explicit owner and group (image building copies them from a
    /// source tree); `None`: the caller's, with a set-group-id directory's
    /// group.
    pub owner: Option<(u32, u32)>,
}

impl<'a> NewInode<'a> {
    /// A `kind` inode named `at`, made by root with the default mode.
    pub fn new(at: impl Into<Target<'a>>, kind: NodeKind<'a>) -> Self {
        let perm = if kind == NodeKind::Dir { 0o755 } else { 0o644 };
        NewInode {
            at: at.into(),
            kind,
            mode: CreateMode { perm, umask: 0 },
            cred: &ROOT,
            owner: None,
        }
    }

    /// An empty regular file named `at`.
    pub fn file(at: impl Into<Target<'a>>) -> Self {
        Self::new(at, NodeKind::File)
    }

    /// A directory named `at`.
    pub fn dir(at: impl Into<Target<'a>>) -> Self {
        Self::new(at, NodeKind::Dir)
    }

    /// A symbolic link named `at` pointing to `target`.
    pub fn symlink(at: impl Into<Target<'a>>, target: &'a [u8]) -> Self {
        Self::new(at, NodeKind::Symlink(target))
    }

    /// With mode `mode`: permission bits, or bits and a umask
    /// (`(0o666, 0o022)`).
    pub fn mode(self, mode: impl Into<CreateMode>) -> Self {
        NewInode {
            mode: mode.into(),
            ..self
        }
    }

    /// Made by `cred`.
    pub fn cred(self, cred: &'a Cred) -> Self {
        NewInode { cred, ..self }
    }

    /// Owned by `uid`:`gid` whoever makes it.
    pub fn owner(self, uid: u32, gid: u32) -> Self {
        NewInode {
            owner: Some((uid, gid)),
            ..self
        }
    }

    /// The mode it is made with (a symlink's is 0777, no umask).
    pub(crate) fn create_mode(&self) -> CreateMode {
        match self.kind {
            NodeKind::Symlink(_) => CreateMode { perm: 0o777, umask: 0 },
            _ => self.mode,
        }
    }
}

/// Who checks mode bits and ACLs at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermCheck {
    /// The engine checks `cred` against the inode (library callers).
    Engine,
    /// The caller already did (a FUSE mount with `default_permissions`:
    /// the kernel's `may_open` ran before OPEN was sent, and the flags we
    /// see may have been widened since — writeback caching turns O_WRONLY
    /// into O_RDWR — so checking them again would refuse legal opens).
    /// Immutable / append-only / read-only-filesystem checks still apply:
    /// the kernel cannot make them, it does not see the inode flags.
    Done,
}

/// An `open(2)` on behalf of a caller ([`Fs::open_as`](super::Fs::open_as)).
#[derive(Debug, Clone, Copy)]
pub struct OpenRequest<'a> {
    /// The flags: access mode, O_CREAT, O_EXCL, O_TRUNC, O_APPEND…
    pub flags: OpenFlags,
    /// The mode of a file O_CREAT makes (its umask applies unless the
    /// parent has a default ACL). Default 0644.
    pub mode: CreateMode,
    /// Who opens (and owns what O_CREAT makes). Default root.
    pub cred: &'a Cred,
    /// Who checks the mode bits and ACLs. Default the engine.
    pub check: PermCheck,
}

impl<'a> OpenRequest<'a> {
    /// An open with `flags` by root, checked by the engine, creating with
    /// mode 0644.
    pub fn new(flags: OpenFlags) -> Self {
        OpenRequest {
            flags,
            mode: CreateMode { perm: 0o644, umask: 0 },
            cred: &ROOT,
            check: PermCheck::Engine,
        }
    }

    /// By `cred`.
    pub fn cred(self, cred: &'a Cred) -> Self {
        OpenRequest { cred, ..self }
    }

    /// Creating with `mode` (bits, or bits and a umask).
    pub fn mode(self, mode: impl Into<CreateMode>) -> Self {
        OpenRequest {
            mode: mode.into(),
            ..self
        }
    }

    /// With the permission check made by `check`.
    pub fn check(self, check: PermCheck) -> Self {
        OpenRequest { check, ..self }
    }
}

/// One fallocate(2) call's arguments ([`Fs::fallocate_inode`](super::Fs::fallocate_inode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallocate {
    /// `FALLOC_FL_*` bits (0: allocate and extend the size).
    pub mode: u32,
    /// Start of the range.
    pub off: u64,
    /// Length of the range (0 is EINVAL).
    pub len: u64,
}

/// Where a write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteAt {
    /// At this offset (`pwrite`). An append-only inode refuses it (EPERM):
    /// only an O_APPEND opener may write one.
    Offset(u64),
    /// At the end of file, read under the inode's lock, so concurrent
    /// appends never overlap (O_APPEND).
    End,
    /// At this offset, which a caller that keeps a page cache of its own
    /// in front of the engine chose for an O_APPEND writer or for its own
    /// write-back (FUSE's write-back cache: the kernel positions appends
    /// and checked append-only at open). Accepted on an append-only inode.
    Placed(u64),
}

/// One buffered write ([`Fs::write_inode`](super::Fs::write_inode)).
#[derive(Debug, Clone, Copy)]
pub struct WriteRequest<'a> {
    /// The bytes to write.
    pub data: &'a [u8],
    /// Where.
    pub at: WriteAt,
    /// Who writes: whether setuid/setgid survive, the root reserve.
    pub caller: Caller<'a>,
    /// Stamp mtime and ctime (`file_update_time`). False for a caller that
    /// owns them: FUSE's write-back cache stamps them at write(2) and sends
    /// them in a SETATTR (`fuse_flush_times`); the data it writes back
    /// later must not stamp a later time over them.
    pub stamp_times: bool,
    /// The open file's O_SYNC ([`SyncLevel::All`]) or O_DSYNC
    /// ([`SyncLevel::Data`]): durable before the call returns.
    pub sync: Option<SyncLevel>,
}

impl<'a> WriteRequest<'a> {
    /// `data` at the end of file by `caller`, times stamped, no sync asked.
    pub fn new(data: &'a [u8], caller: Caller<'a>) -> Self {
        WriteRequest {
            data,
            at: WriteAt::End,
            caller,
            stamp_times: true,
            sync: None,
        }
    }

    /// `data` at offset `off` by root (image building, tools): the
    /// common case, to adjust with the other fields.
    ///
    /// ```no_run
    /// # fn f(fs: &ext4kit::Fs, ino: u32) -> ext4kit::Result<()> {
    /// use ext4kit::WriteRequest;
    /// let inode = fs.inode(ino)?;
    /// let w = fs.write_inode(&inode, &WriteRequest::at(4096, b"hello"))?;
    /// assert_eq!((w.offset, w.len), (4096, 5));
    /// # Ok(()) }
    /// ```
    pub fn at(off: u64, data: &'a [u8]) -> Self {
        WriteRequest {
            at: WriteAt::Offset(off),
            ..WriteRequest::new(data, Caller::root())
        }
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Where it wrote (the end of file for an append).
    pub offset: u64,
    /// Bytes written (short only when the filesystem is full or an error
    /// came after some of them).
    pub len: usize,
    /// setuid/setgid were cleared (a frontend caching attributes must drop
    /// them: the kernel keeps a FUSE inode's mode across a WRITE).
    pub privs_cleared: bool,
}
