//! One 512-byte tar header block, as POSIX ustar (pax's base), GNU tar
//! and old V7 tar lay it out, and the numbers in it.
//!
//! ustar: name 0..100, mode 100..108, uid 108..116, gid 116..124, size
//! 124..136, mtime 136..148, chksum 148..156, typeflag 156, linkname
//! 157..257, magic 257..263 ("ustar\0"), version 263..265 ("00"), uname,
//! gname, devmajor 329..337, devminor 337..345, prefix 345..500 (the path
//! is prefix + "/" + name). GNU tar writes magic "ustar " version " \0"
//! and puts atime 345..357, ctime 357..369, four sparse map slots 386..482,
//! an "extended" flag 482 and the real size 483..495 where ustar has its
//! prefix. Numbers are octal, space- or NUL-terminated; GNU writes
//! numbers too large for octal in base 256, big-endian, marked by the high
//! bit of the first byte (0xff: negative, for times before 1970).

/// Size of every tar block.
pub(crate) const BLOCK: usize = 512;

/// Which dialect wrote the header; it decides what lies at 345..500.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Pre-POSIX tar: no magic, no owner names, no prefix.
    V7,
    /// POSIX ustar (and pax, which is ustar plus extended headers).
    Ustar,
    /// GNU tar's own layout.
    Gnu,
}

/// What an old GNU sparse header says of its file.
pub(crate) struct GnuSparse {
    /// (offset, length) of the data segments in this block.
    pub(crate) map: Vec<(u64, u64)>,
    /// Extension blocks with more segments follow.
    pub(crate) extended: bool,
    /// The file's size, holes included.
    pub(crate) real: u64,
}

/// A header block, checked.
pub(crate) struct Header<'a> {
    b: &'a [u8; BLOCK],
    dialect: Dialect,
}

/// Why a block is not a header.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// The stored checksum does not match the block.
    Checksum,
    /// A numeric field holds something that is not a number.
    Number(&'static str),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Checksum => write!(f, "header checksum does not match (not a tar archive, or corrupt)"),
            HeaderError::Number(field) => write!(f, "header field {field} is not a number"),
        }
    }
}

/// Whether a block is all zeros: two of them end an archive.
pub(crate) fn is_zero_block(b: &[u8; BLOCK]) -> bool {
    b.iter().all(|&x| x == 0)
}

impl<'a> Header<'a> {
    /// Check the block's checksum: the sum of its bytes with the checksum
    /// field counted as eight spaces. POSIX says unsigned bytes; some old
    /// tars summed signed ones, and GNU tar accepts either.
    pub(crate) fn parse(b: &'a [u8; BLOCK]) -> Result<Header<'a>, HeaderError> {
        let stored = octal(&b[148..156]).ok_or(HeaderError::Checksum)?;
        let (mut unsigned, mut signed) = (0i64, 0i64);
        for (i, &x) in b.iter().enumerate() {
            let x = if (148..156).contains(&i) { b' ' } else { x };
            unsigned += i64::from(x);
            signed += i64::from(x as i8);
        }
        if stored != unsigned as u64 && stored as i64 != signed {
            return Err(HeaderError::Checksum);
        }
        let dialect = match (&b[257..263], &b[263..265]) {
            (b"ustar ", b" \0") => Dialect::Gnu,
            (m, _) if m.starts_with(b"ustar") => Dialect::Ustar,
            _ => Dialect::V7,
        };
        Ok(Header { b, dialect })
    }

    /// The dialect that wrote it.
    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The type flag (`'0'`, `'5'`, `'x'`, …; NUL is an old regular file).
    pub(crate) fn typeflag(&self) -> u8 {
        self.b[156]
    }

    /// The path this header alone gives: ustar's prefix + "/" + name.
    pub(crate) fn path(&self) -> Vec<u8> {
        let name = cstr(&self.b[0..100]);
        if self.dialect == Dialect::Ustar {
            let prefix = cstr(&self.b[345..500]);
            if !prefix.is_empty() {
                let mut p = prefix.to_vec();
                p.push(b'/');
                p.extend_from_slice(name);
                return p;
            }
        }
        name.to_vec()
    }

    /// The link target (hard or symbolic) this header alone gives.
    pub(crate) fn link_name(&self) -> Vec<u8> {
        cstr(&self.b[157..257]).to_vec()
    }

    /// The mode's low twelve bits (permissions, setuid, setgid, sticky).
    pub(crate) fn mode(&self) -> Result<u16, HeaderError> {
        Ok((self.num(100..108, "mode")? & 0o7777) as u16)
    }

    /// The owner's uid.
    pub(crate) fn uid(&self) -> Result<u64, HeaderError> {
        self.num(108..116, "uid")
    }

    /// The owner's gid.
    pub(crate) fn gid(&self) -> Result<u64, HeaderError> {
        self.num(116..124, "gid")
    }

    /// Bytes of data that follow the header in the archive.
    pub(crate) fn size(&self) -> Result<u64, HeaderError> {
        self.num(124..136, "size")
    }

    /// Modification time in seconds (negative before 1970).
    pub(crate) fn mtime(&self) -> Result<i64, HeaderError> {
        self.signed(136..148, "mtime")
    }

    /// GNU's access time, when it wrote one.
    pub(crate) fn gnu_atime(&self) -> Option<i64> {
        if self.dialect != Dialect::Gnu || self.b[345..357].iter().all(|&x| x == 0) {
            return None;
        }
        self.signed(345..357, "atime").ok()
    }

    /// Device major and minor numbers (devices only; V7 has none).
    pub(crate) fn device(&self) -> Result<(u32, u32), HeaderError> {
        if self.dialect == Dialect::V7 {
            return Ok((0, 0));
        }
        let major = self.num(329..337, "devmajor")?;
        let minor = self.num(337..345, "devminor")?;
        let major = u32::try_from(major).map_err(|_| HeaderError::Number("devmajor"))?;
        let minor = u32::try_from(minor).map_err(|_| HeaderError::Number("devminor"))?;
        Ok((major, minor))
    }

    /// GNU sparse header ('S'): the map slots in this block, whether
    /// extension blocks follow, and the file's real size.
    pub(crate) fn gnu_sparse(&self) -> Result<GnuSparse, HeaderError> {
        Ok(GnuSparse {
            map: sparse_slots(&self.b[386..482], "sparse map")?,
            extended: self.b[482] != 0,
            real: self.num(483..495, "realsize")?,
        })
    }

    fn num(&self, r: std::ops::Range<usize>, field: &'static str) -> Result<u64, HeaderError> {
        number(&self.b[r]).ok_or(HeaderError::Number(field))
    }

    fn signed(&self, r: std::ops::Range<usize>, field: &'static str) -> Result<i64, HeaderError> {
        let f = &self.b[r];
        if f.first() == Some(&0xff) {
            // Base 256, two's complement: a negative number.
            let mut v: i64 = -1;
            for &x in &f[1..] {
                v = v.checked_shl(8).ok_or(HeaderError::Number(field))? | i64::from(x);
            }
            return Ok(v);
        }
        let v = number(f).ok_or(HeaderError::Number(field))?;
        i64::try_from(v).map_err(|_| HeaderError::Number(field))
    }
}

/// The slots of a GNU sparse map (in the header or an extension block):
/// pairs of 12-byte numbers (offset, length); a slot starting with NUL is
/// unused.
pub(crate) fn sparse_slots(b: &[u8], field: &'static str) -> Result<Vec<(u64, u64)>, HeaderError> {
    let mut out = Vec::new();
    for slot in b.chunks_exact(24) {
        if slot[0] == 0 {
            break;
        }
        let off = number(&slot[..12]).ok_or(HeaderError::Number(field))?;
        let len = number(&slot[12..]).ok_or(HeaderError::Number(field))?;
        out.push((off, len));
    }
    Ok(out)
}

/// A numeric field: base 256 when the first byte's high bit is set,
/// otherwise octal digits after optional spaces, ended by a space, a NUL
/// or the field's end. An empty field is 0 (V7 tars leave some blank).
pub(crate) fn number(f: &[u8]) -> Option<u64> {
    if let Some(&first) = f.first() {
        if first & 0x80 != 0 {
            if first == 0xff {
                return None; // negative: not a size or an id
            }
            let mut v = u64::from(first & 0x7f);
            for &x in &f[1..] {
                v = v.checked_mul(256)?.checked_add(u64::from(x))?;
            }
            return Some(v);
        }
    }
    octal(f)
}

fn octal(f: &[u8]) -> Option<u64> {
    let mut i = 0;
    while i < f.len() && f[i] == b' ' {
        i += 1;
    }
    let mut v = 0u64;
    while i < f.len() && (b'0'..=b'7').contains(&f[i]) {
        v = v.checked_mul(8)?.checked_add(u64::from(f[i] - b'0'))?;
        i += 1;
    }
    // What follows the digits must be a terminator.
    if f[i..].iter().all(|&c| c == b' ' || c == 0) {
        Some(v)
    } else {
        None
    }
}

/// A NUL-terminated (or field-long) string.
fn cstr(f: &[u8]) -> &[u8] {
    match f.iter().position(|&c| c == 0) {
        Some(n) => &f[..n],
        None => f,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ustar header for tests, checksum filled in.
    pub(crate) fn ustar(name: &[u8], typeflag: u8, size: u64, mode: u32) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[..name.len()].copy_from_slice(name);
        put_octal(&mut b[100..108], u64::from(mode));
        put_octal(&mut b[108..116], 1000);
        put_octal(&mut b[116..124], 1000);
        put_octal(&mut b[124..136], size);
        put_octal(&mut b[136..148], 1_700_000_000);
        b[156] = typeflag;
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
        seal(&mut b);
        b
    }

    pub(crate) fn put_octal(f: &mut [u8], v: u64) {
        let s = format!("{:0w$o}\0", v, w = f.len() - 1);
        f.copy_from_slice(s.as_bytes());
    }

    /// Recompute the checksum after editing a block.
    pub(crate) fn seal(b: &mut [u8; BLOCK]) {
        b[148..156].copy_from_slice(b"        ");
        let sum: u64 = b.iter().map(|&x| u64::from(x)).sum();
        let s = format!("{sum:06o}\0 ");
        b[148..156].copy_from_slice(s.as_bytes());
    }

    #[test]
    fn numbers() {
        assert_eq!(number(b"0000644\0"), Some(0o644));
        assert_eq!(number(b"  755 \0\0"), Some(0o755));
        assert_eq!(number(b"\0\0\0\0"), Some(0));
        assert_eq!(number(b"12x4\0"), None);
        assert_eq!(number(b"9\0"), None);
        // Base 256: 2^40.
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[6] = 1;
        assert_eq!(number(&f), Some(1 << 40));
        assert_eq!(number(&[0xff; 12]), None);
        // Too large for u64.
        assert_eq!(
            number(&[0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None
        );
    }

    #[test]
    fn a_ustar_header_reads_back() {
        let mut b = ustar(b"name", b'0', 1234, 0o4755);
        b[345..351].copy_from_slice(b"prefix");
        seal(&mut b);
        let h = Header::parse(&b).unwrap();
        assert_eq!(h.dialect(), Dialect::Ustar);
        assert_eq!(h.path(), b"prefix/name");
        assert_eq!(h.size().unwrap(), 1234);
        assert_eq!(h.mode().unwrap(), 0o4755);
        assert_eq!(h.uid().unwrap(), 1000);
        assert_eq!(h.mtime().unwrap(), 1_700_000_000);
    }

    #[test]
    fn a_bad_checksum_is_refused() {
        let mut b = ustar(b"name", b'0', 0, 0o644);
        b[0] = b'N';
        assert_eq!(Header::parse(&b).err(), Some(HeaderError::Checksum));
    }

    #[test]
    fn negative_base256_mtime() {
        let mut b = ustar(b"old", b'0', 0, 0o644);
        b[136..148].copy_from_slice(&[0xff; 12]);
        b[147] = 0xfe; // -2
        seal(&mut b);
        assert_eq!(Header::parse(&b).unwrap().mtime().unwrap(), -2);
    }
}
