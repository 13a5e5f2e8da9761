//! The calls on an open file description (the kernel's
//! fs/read_write.c, and `ftruncate`, `fallocate`, `fsync`): the access
//! mode checks and the position, over the data paths of `read.rs`,
//! `io.rs` and `writeback.rs`. Everything done through a description is
//! done on behalf of its opener (`File::caller`).

use super::file::{File, Whence};
use super::request::{Fallocate, WriteAt, WriteRequest};
use super::super_block::SuperBlock;
use super::writeback::{self, SyncLevel};
use super::{io, read};
use crate::error::{Errno, Error, Result};

/// read(2): at the position, which then moves past what was read.
/// Concurrent reads on one description may overlap (POSIX leaves that
/// unspecified for threads); each is atomic with respect to the data it
/// returns.
#[inline]
pub(crate) fn read(sb: &SuperBlock, file: &File, buf: &mut [u8]) -> Result<usize> {
    file.check_read()?;
    let pos = file.position();
    let n = read::read_at(sb, &file.inode, pos, buf)?;
    file.set_position(pos + n as u64);
    Ok(n)
}

/// pread(2): at `off`, the position untouched.
#[inline]
pub(crate) fn pread(sb: &SuperBlock, file: &File, off: u64, buf: &mut [u8]) -> Result<usize> {
    file.check_read()?;
    read::read_at(sb, &file.inode, off, buf)
}

/// lseek(2): SEEK_DATA and SEEK_HOLE ask the block map (after writing
/// back dirty pages, whose blocks the map does not show yet).
pub(crate) fn lseek(sb: &SuperBlock, file: &File, off: i64, whence: Whence) -> Result<u64> {
    file.seek(off, whence, |o, data| read::seek_data_hole(sb, &file.inode, o, data))
}

/// write(2): at the position (at the end of file, atomically, for
/// O_APPEND), which then moves past what was written.
pub(crate) fn write(sb: &SuperBlock, file: &File, buf: &[u8]) -> Result<usize> {
    file.check_write()?;
    let at = if file.flags.append {
        WriteAt::End
    } else {
        WriteAt::Offset(file.position())
    };
    let w = io::write_inode(sb, &file.inode, &write_req(file, buf, at))?;
    file.set_position(w.offset + w.len as u64);
    Ok(w.len)
}

/// pwrite(2): at `off`, the position untouched. As on Linux, an O_APPEND
/// description appends whatever `off` says.
pub(crate) fn pwrite(sb: &SuperBlock, file: &File, off: u64, buf: &[u8]) -> Result<usize> {
    file.check_write()?;
    let at = if file.flags.append {
        WriteAt::End
    } else {
        WriteAt::Offset(off)
    };
    Ok(io::write_inode(sb, &file.inode, &write_req(file, buf, at))?.len)
}

/// ftruncate(2): EINVAL unless open for writing (as Linux).
pub(crate) fn ftruncate(sb: &SuperBlock, file: &File, len: u64) -> Result<()> {
    if !file.flags.access.writes() {
        return Err(Error::posix(Errno::EINVAL, "ftruncate: file not open for writing"));
    }
    io::truncate_inode(sb, &file.inode, len, &file.caller()).map(|_| ())
}

/// fallocate(2) (modes and errors: `io::fallocate_inode`).
pub(crate) fn fallocate(sb: &SuperBlock, file: &File, mode: u32, off: u64, len: u64) -> Result<()> {
    file.check_write()?;
    io::fallocate_inode(sb, &file.inode, Fallocate { mode, off, len }, &file.caller()).map(|_| ())
}

/// fsync(2) ([`SyncLevel::All`]) or fdatasync(2) ([`SyncLevel::Data`]).
pub(crate) fn fsync(sb: &SuperBlock, file: &File, level: SyncLevel) -> Result<()> {
    writeback::fsync_inode(sb, &file.inode, level).map(|_| ())
}

/// A write of `buf` at `at` through `file`, by its opener, with its
/// O_SYNC / O_DSYNC.
fn write_req<'a>(file: &'a File, buf: &'a [u8], at: WriteAt) -> WriteRequest<'a> {
    WriteRequest {
        at,
        sync: file.flags.sync,
        ..WriteRequest::new(buf, file.caller())
    }
}
