//! Reading a tar stream member by member: the headers that only modify
//! the next member (pax `x`, GNU `L` / `K` long names) folded into it,
//! pax globals (`g`) kept, GNU and pax sparse maps resolved, and the
//! member's data handed out as segments of the file it holds.
//!
//! Nothing is trusted: a size that runs past the stream, a sparse map out
//! of order or past the file's end, an extended header of more than
//! [`MAX_META`] bytes, a stream that ends without the two zero blocks that
//! close every archive — each is an error naming the member and its
//! offset, never a panic and never a member cut short in silence.

use std::io::{self, Read};

use super::header::{self, is_zero_block, Dialect, Header, BLOCK};
use super::pax::Records;

/// The largest extended header or long name we read into memory: a pax
/// header holds a path and xattrs (each at most 64 KiB in ext4), far less.
pub(crate) const MAX_META: u64 = 16 << 20;

/// What a member is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink(Vec<u8>),
    HardLink(Vec<u8>),
    CharDevice(u32, u32),
    BlockDevice(u32, u32),
    Fifo,
}

/// One member, everything its headers say folded together.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// The path as written (pax `path`, else GNU long name, else ustar).
    pub(crate) path: Vec<u8>,
    pub(crate) kind: Kind,
    pub(crate) mode: u16,
    pub(crate) uid: u64,
    pub(crate) gid: u64,
    pub(crate) mtime: (i64, u32),
    pub(crate) atime: Option<(i64, u32)>,
    /// The file's size (for a sparse file, with its holes).
    pub(crate) size: u64,
    pub(crate) xattrs: crate::entry::Xattrs,
    /// Data segments (offset in the file, length), in order; the stored
    /// data is their concatenation. One segment `(0, size)` for a dense
    /// file.
    pub(crate) segments: Vec<(u64, u64)>,
}

/// A tar stream.
pub(crate) struct Archive<R> {
    r: R,
    /// Bytes consumed from `r`.
    pos: u64,
    /// Unread stored data of the current member, and its padding.
    left: u64,
    pad: u64,
    globals: Records,
    ended: bool,
}

/// What the headers before a member left for it: a pax `x` header's
/// records, GNU long names.
#[derive(Default)]
struct Pending {
    local: Option<Records>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

/// An error reading the stream, with where it happened.
#[derive(Debug)]
pub(crate) struct ArchiveError {
    /// The member's path when known.
    pub(crate) member: Option<Vec<u8>>,
    /// Offset in the decompressed stream.
    pub(crate) offset: u64,
    pub(crate) reason: String,
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.member {
            Some(m) => write!(
                f,
                "member \"{}\" (at byte {}): {}",
                String::from_utf8_lossy(m),
                self.offset,
                self.reason
            ),
            None => write!(f, "at byte {}: {}", self.offset, self.reason),
        }
    }
}

type Result<T> = std::result::Result<T, ArchiveError>;

impl<R: Read> Archive<R> {
    pub(crate) fn new(r: R) -> Self {
        Archive {
            r,
            pos: 0,
            left: 0,
            pad: 0,
            globals: Records::default(),
            ended: false,
        }
    }

    fn err(&self, member: Option<&[u8]>, offset: u64, reason: impl Into<String>) -> ArchiveError {
        ArchiveError {
            member: member.map(|m| m.to_vec()),
            offset,
            reason: reason.into(),
        }
    }

    /// Read exactly `buf.len()` bytes; `Ok(false)` on a clean end of
    /// stream before the first byte.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "stream ends inside a block",
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += buf.len() as u64;
        Ok(true)
    }

    /// Skip `n` bytes of the stream.
    fn skip(&mut self, mut n: u64) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let k = n.min(buf.len() as u64) as usize;
            if !self.fill(&mut buf[..k])? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ends inside a member's data",
                ));
            }
            n -= k as u64;
        }
        Ok(())
    }

    /// A whole small data area (an extended header, a long name).
    fn read_meta(&mut self, size: u64, what: &str, at: u64) -> Result<Vec<u8>> {
        if size > MAX_META {
            return Err(self.err(None, at, format!("{what} of {size} bytes (more than {MAX_META})")));
        }
        let mut v = vec![0u8; size as usize];
        let pad = padding(size);
        match self.fill(&mut v) {
            Ok(true) => {}
            Ok(false) if size == 0 => {}
            Ok(false) => return Err(self.err(None, at, format!("the stream ends inside its {what}"))),
            Err(e) => return Err(self.err(None, at, format!("reading its {what}: {e}"))),
        }
        self.skip(pad)
            .map_err(|e| self.err(None, at, format!("reading its {what}: {e}")))?;
        Ok(v)
    }

    /// The next member, or `None` at the end of the archive.
    pub(crate) fn next_member(&mut self) -> Result<Option<Member>> {
        if self.ended {
            return Ok(None);
        }
        let (left, pad) = (self.left, self.pad);
        self.left = 0;
        self.pad = 0;
        let at = self.pos;
        self.skip(left + pad)
            .map_err(|e| self.err(None, at, format!("skipping the previous member's data: {e}")))?;

        let mut pending = Pending::default();
        let mut block = [0u8; BLOCK];
        loop {
            let at = self.pos;
            match self.fill(&mut block) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(self.err(
                        None,
                        at,
                        "the archive ends without its end-of-archive blocks (truncated?)",
                    ))
                }
                Err(e) => return Err(self.err(None, at, format!("reading a header: {e}"))),
            }
            if is_zero_block(&block) {
                // The end: one zero block may be all a writer left before
                // the stream's end; a second one is normal.
                let mut second = [0u8; BLOCK];
                match self.fill(&mut second) {
                    Ok(false) => {}
                    Ok(true) if is_zero_block(&second) => {}
                    Ok(true) => {
                        return Err(self.err(None, at, "a zero block inside the archive (corrupt or concatenated)"))
                    }
                    Err(e) => return Err(self.err(None, at, format!("reading the end of the archive: {e}"))),
                }
                if pending.local.is_some() || pending.long_name.is_some() || pending.long_link.is_some() {
                    return Err(self.err(
                        None,
                        at,
                        "the archive ends after an extended header, without its member",
                    ));
                }
                self.ended = true;
                return Ok(None);
            }
            let h = Header::parse(&block).map_err(|e| self.err(None, at, e.to_string()))?;
            let size = h.size().map_err(|e| self.err(Some(&h.path()), at, e.to_string()))?;
            match h.typeflag() {
                b'x' => {
                    let d = self.read_meta(size, "pax extended header", at)?;
                    let r = Records::parse(&d).map_err(|e| self.err(None, at, e))?;
                    pending.local = Some(match pending.local.take() {
                        Some(l) => l.overlay(&r),
                        None => r,
                    });
                }
                b'g' => {
                    let d = self.read_meta(size, "pax global header", at)?;
                    let r = Records::parse(&d).map_err(|e| self.err(None, at, e))?;
                    self.globals = self.globals.overlay(&r);
                }
                b'L' => pending.long_name = Some(trim_nul(self.read_meta(size, "GNU long name", at)?)),
                b'K' => pending.long_link = Some(trim_nul(self.read_meta(size, "GNU long link name", at)?)),
                b'V' => {
                    // A volume label: no file.
                    self.skip(size + padding(size))
                        .map_err(|e| self.err(None, at, format!("reading a volume label: {e}")))?;
                }
                _ => return self.member(&h, size, at, pending).map(Some),
            }
        }
    }

    /// Fold one member's headers together: its own header, at `at`, with
    /// `stored` bytes of data, and what the headers before it left.
    fn member(&mut self, h: &Header<'_>, stored: u64, at: u64, pending: Pending) -> Result<Member> {
        let pax = &match &pending.local {
            Some(l) => self.globals.overlay(l),
            None => self.globals.clone(),
        };
        let mut path = match (pax.get("path"), pending.long_name) {
            (Some(p), _) => p.to_vec(),
            (None, Some(n)) => n,
            (None, None) => h.path(),
        };
        if let Some(n) = pax.get("GNU.sparse.name") {
            path = n.to_vec();
        }
        let p = path.clone();
        let bad = |this: &Self, reason: String| this.err(Some(&p), at, reason);
        let link = match (pax.get("linkpath"), pending.long_link) {
            (Some(l), _) => l.to_vec(),
            (None, Some(l)) => l,
            (None, None) => h.link_name(),
        };
        let num =
            |r: std::result::Result<u64, header::HeaderError>, this: &Self| r.map_err(|e| bad(this, e.to_string()));
        let mode = h.mode().map_err(|e| bad(self, e.to_string()))?;
        let uid = match pax.number("uid").map_err(|e| bad(self, e))? {
            Some(u) => u,
            None => num(h.uid(), self)?,
        };
        let gid = match pax.number("gid").map_err(|e| bad(self, e))? {
            Some(g) => g,
            None => num(h.gid(), self)?,
        };
        let mtime = match pax.time("mtime").map_err(|e| bad(self, e))? {
            Some(t) => t,
            None => (h.mtime().map_err(|e| bad(self, e.to_string()))?, 0),
        };
        let atime = match pax.time("atime").map_err(|e| bad(self, e))? {
            Some(t) => Some(t),
            None => h.gnu_atime().map(|s| (s, 0)),
        };
        let stored = pax.number("size").map_err(|e| bad(self, e))?.unwrap_or(stored);
        let xattrs = pax.xattrs().map_err(|e| bad(self, e))?;
        let (major, minor) = h.device().map_err(|e| bad(self, e.to_string()))?;
        let dev = |key: &str, dflt: u32, this: &Self| -> Result<u32> {
            match pax.number(key).map_err(|e| bad(this, e))? {
                Some(v) => u32::try_from(v).map_err(|_| bad(this, format!("pax {key}={v} is too large"))),
                None => Ok(dflt),
            }
        };
        let (major, minor) = (
            dev("SCHILY.devmajor", major, self)?,
            dev("SCHILY.devminor", minor, self)?,
        );

        let kind = match h.typeflag() {
            b'0' | b'7' | 0 if path.ends_with(b"/") && h.dialect() == Dialect::V7 => Kind::Dir,
            b'0' | b'7' | 0 | b'S' => Kind::File,
            b'1' => Kind::HardLink(link),
            b'2' => Kind::Symlink(link),
            b'3' => Kind::CharDevice(major, minor),
            b'4' => Kind::BlockDevice(major, minor),
            b'5' | b'D' => Kind::Dir,
            b'6' => Kind::Fifo,
            t => {
                let what = match t {
                    b'M' => "a GNU multi-volume continuation".to_string(),
                    b'N' => "an old GNU long-name member".to_string(),
                    t if t.is_ascii_graphic() => format!("type '{}'", t as char),
                    t => format!("type {t}"),
                };
                return Err(bad(self, format!("unsupported member: {what}")));
            }
        };

        // What follows the header: the data (or a sparse map and the data).
        let mut left = stored;
        let (size, segments) = if h.typeflag() == b'S' {
            self.gnu_sparse(h, at, &path)?
        } else if let Some(major) = pax.get("GNU.sparse.major") {
            if major != b"1" || pax.get("GNU.sparse.minor") != Some(b"0") {
                return Err(bad(self, "unsupported pax sparse format version".into()));
            }
            let real = pax
                .number("GNU.sparse.realsize")
                .map_err(|e| bad(self, e))?
                .ok_or_else(|| bad(self, "pax sparse 1.0 without GNU.sparse.realsize".into()))?;
            let (map, used) = self.sparse_map_in_data(stored, at, &path)?;
            left = stored - used;
            (real, map)
        } else if let Some(real) = pax.number("GNU.sparse.size").map_err(|e| bad(self, e))? {
            // pax sparse 0.0 (offset/numbytes records) or 0.1 (one map).
            let map = match pax.get("GNU.sparse.map") {
                Some(m) => parse_map_list(m).map_err(|e| bad(self, e))?,
                None => pax.sparse_pairs().map_err(|e| bad(self, e))?,
            };
            (real, map)
        } else if matches!(kind, Kind::File) {
            (stored, vec![(0, stored)])
        } else {
            (0, Vec::new())
        };
        if matches!(kind, Kind::File) {
            check_map(&segments, size, left).map_err(|e| bad(self, e))?;
        }
        self.left = left;
        self.pad = padding(stored);
        Ok(Member {
            path,
            kind,
            mode,
            uid,
            gid,
            mtime,
            atime,
            size,
            xattrs,
            segments,
        })
    }

    /// Old GNU sparse ('S'): four map slots in the header, then extension
    /// blocks of 21 slots each while their flag byte (504) is set.
    fn gnu_sparse(&mut self, h: &Header<'_>, at: u64, path: &[u8]) -> Result<(u64, Vec<(u64, u64)>)> {
        let header::GnuSparse {
            mut map,
            mut extended,
            real,
        } = h.gnu_sparse().map_err(|e| self.err(Some(path), at, e.to_string()))?;
        let mut ext = [0u8; BLOCK];
        let mut blocks = 0u32;
        while extended {
            blocks += 1;
            if u64::from(blocks) * BLOCK as u64 > MAX_META {
                return Err(self.err(Some(path), at, "GNU sparse map of too many extension blocks"));
            }
            match self.fill(&mut ext) {
                Ok(true) => {}
                Ok(false) => return Err(self.err(Some(path), at, "the stream ends inside the sparse map")),
                Err(e) => return Err(self.err(Some(path), at, format!("reading the sparse map: {e}"))),
            }
            map.extend(
                header::sparse_slots(&ext[..504], "sparse map").map_err(|e| self.err(Some(path), at, e.to_string()))?,
            );
            extended = ext[504] != 0;
        }
        Ok((real, map))
    }

    /// pax sparse 1.0: the map leads the data, as decimal numbers each
    /// ended by a newline (the count, then offset and length pairs),
    /// padded to a whole block. Returns the map and the bytes it took.
    fn sparse_map_in_data(&mut self, stored: u64, at: u64, path: &[u8]) -> Result<(Vec<(u64, u64)>, u64)> {
        let mut used = 0u64;
        let mut text: Vec<u8> = Vec::new();
        let mut block = [0u8; BLOCK];
        let mut numbers: Vec<u64> = Vec::new();
        let mut want: Option<u64> = None;
        loop {
            if let Some(n) = want {
                if numbers.len() as u64 == 1 + 2 * n {
                    break;
                }
            }
            if used + BLOCK as u64 > stored.max(BLOCK as u64) || used >= MAX_META {
                return Err(self.err(Some(path), at, "pax sparse map runs past the member's data"));
            }
            match self.fill(&mut block) {
                Ok(true) => {}
                Ok(false) => return Err(self.err(Some(path), at, "the stream ends inside the sparse map")),
                Err(e) => return Err(self.err(Some(path), at, format!("reading the sparse map: {e}"))),
            }
            used += BLOCK as u64;
            text.extend_from_slice(&block);
            while let Some(nl) = text.iter().position(|&c| c == b'\n') {
                let line: Vec<u8> = text.drain(..=nl).collect();
                let v = std::str::from_utf8(&line[..line.len() - 1])
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| self.err(Some(path), at, "pax sparse map holds something not a number"))?;
                numbers.push(v);
                if want.is_none() {
                    if v > MAX_META / 16 {
                        return Err(self.err(Some(path), at, format!("pax sparse map of {v} segments")));
                    }
                    want = Some(v);
                }
                if numbers.len() as u64 == 1 + 2 * want.unwrap_or(0) {
                    break;
                }
            }
        }
        if used > stored {
            return Err(self.err(Some(path), at, "pax sparse map runs past the member's data"));
        }
        let map = numbers[1..].chunks_exact(2).map(|p| (p[0], p[1])).collect();
        Ok((map, used))
    }

    /// Where the current member's stored data starts in the stream (just
    /// after `next_member`).
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// Read the current member's stored data (the segments' bytes, one
    /// after another); 0 at its end.
    pub(crate) fn read_data(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let k = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = loop {
            match self.r.read(&mut buf[..k]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ends inside the member's data (truncated?)",
            ));
        }
        self.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Bytes of padding after `size` bytes of data, to the next block.
fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// pax sparse 0.1's `GNU.sparse.map`: "offset,length,offset,length…".
fn parse_map_list(m: &[u8]) -> std::result::Result<Vec<(u64, u64)>, String> {
    let s = std::str::from_utf8(m).map_err(|_| "GNU.sparse.map is not text".to_string())?;
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let nums: Vec<u64> = s
        .split(',')
        .map(|x| x.trim().parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| "GNU.sparse.map holds something not a number".to_string())?;
    if !nums.len().is_multiple_of(2) {
        return Err("GNU.sparse.map has an odd count of numbers".into());
    }
    Ok(nums.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

/// A map's segments are in order, do not overlap, end within the file,
/// and their lengths add up to the data stored.
fn check_map(map: &[(u64, u64)], size: u64, stored: u64) -> std::result::Result<(), String> {
    let mut end = 0u64;
    let mut total = 0u64;
    for &(off, len) in map {
        if off < end {
            return Err(format!("sparse map segment at {off} overlaps or is out of order"));
        }
        end = off
            .checked_add(len)
            .filter(|&e| e <= size)
            .ok_or_else(|| format!("sparse map segment {off}+{len} runs past the file's size {size}"))?;
        total += len;
    }
    if total != stored {
        return Err(format!(
            "the map's segments hold {total} bytes but the member stores {stored}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::header::tests::{put_octal, seal, ustar};
    use super::super::pax::tests::record;
    use super::*;

    fn member_bytes(h: [u8; BLOCK], data: &[u8]) -> Vec<u8> {
        let mut v = h.to_vec();
        v.extend_from_slice(data);
        v.resize(v.len() + padding(data.len() as u64) as usize, 0);
        v
    }

    fn end() -> Vec<u8> {
        vec![0u8; 2 * BLOCK]
    }

    fn all(bytes: &[u8]) -> std::result::Result<Vec<(Member, Vec<u8>)>, ArchiveError> {
        let mut a = Archive::new(bytes);
        let mut out = Vec::new();
        while let Some(m) = a.next_member()? {
            let mut data = Vec::new();
            let mut buf = [0u8; 100];
            loop {
                let n = a
                    .read_data(&mut buf)
                    .map_err(|e| a.err(Some(&m.path), 0, e.to_string()))?;
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
            }
            out.push((m, data));
        }
        Ok(out)
    }

    #[test]
    fn files_dirs_and_links() {
        let mut t = member_bytes(ustar(b"dir/", b'5', 0, 0o755), b"");
        t.extend(member_bytes(ustar(b"dir/f", b'0', 5, 0o644), b"hello"));
        let mut l = ustar(b"dir/l", b'2', 0, 0o777);
        l[157..158].copy_from_slice(b"f");
        seal(&mut l);
        t.extend(member_bytes(l, b""));
        t.extend(end());
        let ms = all(&t).unwrap();
        assert_eq!(ms.len(), 3);
        assert_eq!(ms[0].0.kind, Kind::Dir);
        assert_eq!(ms[1].1, b"hello");
        assert_eq!(ms[1].0.segments, vec![(0, 5)]);
        assert_eq!(ms[2].0.kind, Kind::Symlink(b"f".to_vec()));
    }

    #[test]
    fn truncation_is_an_error() {
        let mut t = member_bytes(ustar(b"f", b'0', 5, 0o644), b"hello");
        // No end blocks.
        let e = all(&t).unwrap_err();
        assert!(e.reason.contains("end-of-archive"), "{e}");
        // Cut inside the data.
        t.truncate(BLOCK + 3);
        let e = all(&t).unwrap_err();
        assert!(e.to_string().contains("\"f\""), "{e}");
    }

    #[test]
    fn gnu_long_names_and_pax_override() {
        let long = vec![b'n'; 300];
        let mut t = member_bytes(
            ustar(b"././@LongLink", b'L', 301, 0o644),
            &[long.clone(), vec![0]].concat(),
        );
        t.extend(member_bytes(ustar(b"short", b'0', 0, 0o644), b""));
        let pax = [record("uid", b"5000000"), record("path", b"paxname")].concat();
        t.extend(member_bytes(
            ustar(b"PaxHeaders/x", b'x', pax.len() as u64, 0o644),
            &pax,
        ));
        t.extend(member_bytes(ustar(b"x", b'0', 0, 0o644), b""));
        t.extend(end());
        let ms = all(&t).unwrap();
        assert_eq!(ms[0].0.path, long);
        assert_eq!(ms[1].0.path, b"paxname");
        assert_eq!(ms[1].0.uid, 5_000_000);
    }

    #[test]
    fn old_gnu_sparse() {
        // 10 KiB file: data at 0..512 and 8192..8704.
        let mut h = ustar(b"sparse", b'S', 1024, 0o644);
        h[257..263].copy_from_slice(b"ustar ");
        h[263..265].copy_from_slice(b" \0");
        put_octal(&mut h[386..398], 0);
        put_octal(&mut h[398..410], 512);
        put_octal(&mut h[410..422], 8192);
        put_octal(&mut h[422..434], 512);
        put_octal(&mut h[483..495], 10240);
        seal(&mut h);
        let data = [vec![1u8; 512], vec![2u8; 512]].concat();
        let mut t = member_bytes(h, &data);
        t.extend(end());
        let ms = all(&t).unwrap();
        assert_eq!(ms[0].0.size, 10240);
        assert_eq!(ms[0].0.segments, vec![(0, 512), (8192, 512)]);
        assert_eq!(ms[0].1, data);
    }

    #[test]
    fn pax_sparse_1_0() {
        let pax = [
            record("GNU.sparse.major", b"1"),
            record("GNU.sparse.minor", b"0"),
            record("GNU.sparse.name", b"big"),
            record("GNU.sparse.realsize", b"1048576"),
        ]
        .concat();
        let mut t = member_bytes(ustar(b"PaxHeaders/big", b'x', pax.len() as u64, 0o644), &pax);
        let mut map = b"1\n524288\n3\n".to_vec();
        map.resize(BLOCK, 0);
        let data = [map, b"abc".to_vec()].concat();
        t.extend(member_bytes(
            ustar(b"GNUSparseFile.0/big", b'0', data.len() as u64, 0o644),
            &data,
        ));
        t.extend(end());
        let ms = all(&t).unwrap();
        assert_eq!(ms[0].0.path, b"big");
        assert_eq!(ms[0].0.size, 1 << 20);
        assert_eq!(ms[0].0.segments, vec![(524288, 3)]);
        assert_eq!(ms[0].1, b"abc");
    }

    #[test]
    fn a_sparse_map_past_the_end_is_refused() {
        let pax = [
            record("GNU.sparse.major", b"1"),
            record("GNU.sparse.minor", b"0"),
            record("GNU.sparse.realsize", b"100"),
        ]
        .concat();
        let mut t = member_bytes(ustar(b"PaxHeaders/big", b'x', pax.len() as u64, 0o644), &pax);
        let mut map = b"1\n524288\n3\n".to_vec();
        map.resize(BLOCK, 0);
        let data = [map, b"abc".to_vec()].concat();
        t.extend(member_bytes(ustar(b"big", b'0', data.len() as u64, 0o644), &data));
        t.extend(end());
        let e = all(&t).unwrap_err();
        assert!(e.reason.contains("past the file's size"), "{e}");
    }

    #[test]
    fn garbage_is_not_an_archive() {
        let e = all(&[7u8; 4096]).unwrap_err();
        assert!(e.reason.contains("checksum"), "{e}");
        let e = all(b"").unwrap_err();
        assert!(e.reason.contains("end-of-archive"), "{e}");
    }

    /// A valid archive of every kind of member the reader folds: pax
    /// records, a GNU long name, an old GNU sparse member, a pax sparse 1.0
    /// member.
    fn rich_archive() -> Vec<u8> {
        let mut t = member_bytes(ustar(b"dir/", b'5', 0, 0o755), b"");
        let pax = [record("path", b"dir/paxname"), record("SCHILY.xattr.user.a", b"v")].concat();
        t.extend(member_bytes(
            ustar(b"PaxHeaders/x", b'x', pax.len() as u64, 0o644),
            &pax,
        ));
        t.extend(member_bytes(ustar(b"x", b'0', 3, 0o644), b"abc"));
        t.extend(member_bytes(ustar(b"././@LongLink", b'L', 5, 0o644), b"long\0"));
        t.extend(member_bytes(ustar(b"short", b'0', 0, 0o644), b""));
        let mut h = ustar(b"sparse", b'S', 512, 0o644);
        h[257..263].copy_from_slice(b"ustar ");
        h[263..265].copy_from_slice(b" \0");
        put_octal(&mut h[386..398], 4096);
        put_octal(&mut h[398..410], 512);
        put_octal(&mut h[483..495], 8192);
        seal(&mut h);
        t.extend(member_bytes(h, &[5u8; 512]));
        let pax = [
            record("GNU.sparse.major", b"1"),
            record("GNU.sparse.minor", b"0"),
            record("GNU.sparse.realsize", b"65536"),
        ]
        .concat();
        t.extend(member_bytes(
            ustar(b"PaxHeaders/big", b'x', pax.len() as u64, 0o644),
            &pax,
        ));
        let mut map = b"1\n1024\n3\n".to_vec();
        map.resize(BLOCK, 0);
        let data = [map, b"xyz".to_vec()].concat();
        t.extend(member_bytes(ustar(b"big", b'0', data.len() as u64, 0o644), &data));
        t.extend(end());
        t
    }

    #[test]
    fn the_rich_archive_reads() {
        let ms = all(&rich_archive()).unwrap();
        let names: Vec<&[u8]> = ms.iter().map(|m| m.0.path.as_slice()).collect();
        assert_eq!(names, vec![&b"dir/"[..], b"dir/paxname", b"long", b"sparse", b"big"]);
    }

    proptest::proptest! {
        /// Whatever bytes are changed, cut or appended, reading ends in a
        /// result — members or an error — never a panic or a hang.
        #[test]
        fn damaged_archives_never_panic(
            edits in proptest::collection::vec((0usize..12_000, proptest::prelude::any::<u8>()), 1..8),
            cut in proptest::option::of(0usize..12_000),
        ) {
            let mut t = rich_archive();
            for (at, b) in edits {
                let n = t.len();
                t[at % n] = b;
            }
            if let Some(c) = cut {
                t.truncate(c % (t.len() + 1));
            }
            let _ = all(&t);
        }
    }
}
