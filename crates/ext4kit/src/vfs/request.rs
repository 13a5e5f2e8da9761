//! The arguments of a change of a file's data, as request types: where a
//! write goes and who makes it ([`WriteRequest`]), what it did
//! ([`Written`]), an fallocate's range ([`Fallocate`]). Their own module,
//! below both the open file (`file.rs`) and the data paths (`io.rs`) that
//! take them.

use super::cred::Caller;
use super::writeback::SyncLevel;

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
