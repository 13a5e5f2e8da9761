//! A tar archive as a source: GNU, pax and ustar (and V7) members, long
//! names, pax xattrs (`SCHILY.xattr.*`, `LIBARCHIVE.xattr.*`), hard links,
//! devices, GNU and pax sparse files (whose holes stay holes), read as a
//! stream (compressed or not) in one pass, in archive order.
//!
//! The reading is ours (`header`, `pax`, `archive`) rather than the `tar`
//! crate's: that crate expands a sparse member into its zeros without
//! saying where the holes were, and reads pax sparse 1.0 members as files
//! named `GNUSparseFile.0/…`; an image builder needs both right.

mod archive;
mod header;
mod pax;

use std::io::Read;
use std::path::PathBuf;

use ext4kit::Timestamp;

pub(crate) use self::archive::Archive;
use self::archive::{Kind, Member};
use super::compress::{self, Compression};
use super::{Sink, Source};
use crate::entry::{Entry, EntryKind, EntryPath, FileData, Meta};
use crate::error::{Error, Result};

/// Whether a stream's first bytes are a tar header (a valid checksum) or
/// the zero block of an empty archive.
pub(crate) fn looks_like_tar(head: &[u8]) -> bool {
    let Some(b) = head.get(..header::BLOCK) else {
        return false;
    };
    let b: &[u8; header::BLOCK] = b.try_into().expect("512 bytes");
    header::is_zero_block(b) || header::Header::parse(b).is_ok()
}

/// A tar archive file.
pub struct TarSource {
    path: PathBuf,
    compression: Compression,
}

impl TarSource {
    /// The archive at `path`, compressed as `compression` says.
    pub fn new(path: PathBuf, compression: Compression) -> Self {
        TarSource { path, compression }
    }

    /// Read the archive from any stream (already decompressed) and report
    /// its entries; `name` is what messages call it.
    pub fn visit_stream(name: &str, r: impl Read, sink: &mut dyn Sink) -> Result<()> {
        let mut a = Archive::new(r);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let m = match a.next_member() {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(match &e.member {
                        Some(m) => Error::entry(
                            name,
                            String::from_utf8_lossy(m),
                            format!("at byte {}: {}", e.offset, e.reason),
                        ),
                        None => Error::entry(name, format!("byte {}", e.offset), e.reason),
                    })
                }
            };
            let shown = String::from_utf8_lossy(&m.path).into_owned();
            let entry = to_entry(&m).map_err(|r| Error::entry(name, &shown, r))?;
            if let EntryKind::File { .. } = entry.kind {
                let mut data = MemberData {
                    a: &mut a,
                    segments: &m.segments,
                    next: 0,
                    within: 0,
                };
                sink.entry(&entry, Some(&mut data))
                    .map_err(|e| with_member(e, name, &shown))?;
                // Whatever the sink did not read is read (and checked) here.
                while data
                    .read_segment(&mut buf)
                    .map_err(|e| Error::entry(name, &shown, e.to_string()))?
                    .is_some()
                {}
            } else {
                sink.entry(&entry, None).map_err(|e| with_member(e, name, &shown))?;
            }
        }
    }
}

/// A sink's error about the entry names the member when it names nothing.
fn with_member(e: Error, name: &str, member: &str) -> Error {
    if e.entry_name().is_some() {
        e
    } else {
        Error::entry(name, member, e.reason().to_string())
    }
}

impl Source for TarSource {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn visit(&mut self, sink: &mut dyn Sink) -> Result<()> {
        let r = compress::reader(&self.path, self.compression).map_err(|e| Error::source(&self.path, e.to_string()))?;
        Self::visit_stream(&self.name(), r, sink)
    }
}

fn ts((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}

/// A member as an entry: its path checked, its ids in ext4's 32 bits.
fn to_entry(m: &Member) -> std::result::Result<Entry, String> {
    let path = EntryPath::parse(&m.path)?;
    let id = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} does not fit ext4's 32 bits"));
    let kind = match &m.kind {
        Kind::File => EntryKind::File { size: m.size },
        Kind::Dir => EntryKind::Dir,
        Kind::Symlink(t) => {
            if t.is_empty() {
                return Err("a symbolic link with an empty target".into());
            }
            EntryKind::Symlink(t.clone())
        }
        Kind::HardLink(t) => {
            let target = EntryPath::parse(t).map_err(|r| format!("hard link target: {r}"))?;
            if target.is_root() {
                return Err("a hard link to the tree's root".into());
            }
            EntryKind::HardLink(target)
        }
        Kind::CharDevice(a, b) => EntryKind::CharDevice(*a, *b),
        Kind::BlockDevice(a, b) => EntryKind::BlockDevice(*a, *b),
        Kind::Fifo => EntryKind::Fifo,
    };
    Ok(Entry {
        path,
        kind,
        meta: Meta {
            perm: m.mode,
            uid: id(m.uid, "uid")?,
            gid: id(m.gid, "gid")?,
            atime: ts(m.atime.unwrap_or(m.mtime)),
            mtime: ts(m.mtime),
        },
        xattrs: m.xattrs.clone(),
        identity: None,
    })
}

/// A member's data, segment by segment.
struct MemberData<'a, R> {
    a: &'a mut Archive<R>,
    segments: &'a [(u64, u64)],
    /// The segment being read, and how far into it.
    next: usize,
    within: u64,
}

impl<R: Read> FileData for MemberData<'_, R> {
    fn read_segment(&mut self, buf: &mut [u8]) -> std::io::Result<Option<(u64, usize)>> {
        while let Some(&(off, len)) = self.segments.get(self.next) {
            if self.within == len {
                self.next += 1;
                self.within = 0;
                continue;
            }
            let want = buf.len().min((len - self.within).min(usize::MAX as u64) as usize);
            let n = self.a.read_data(&mut buf[..want])?;
            let at = off + self.within;
            self.within += n as u64;
            return Ok(Some((at, n)));
        }
        Ok(None)
    }
}
