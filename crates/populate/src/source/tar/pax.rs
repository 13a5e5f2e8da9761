//! pax extended headers (POSIX.1-2001 `pax` format): the records of an
//! `x` header (for the next member) or a `g` header (for every member
//! after it), and what they override in the ustar header.
//!
//! A record is `"%d %s=%s\n"`: its own length in decimal (counting
//! everything, the length digits and the newline included), a space, the
//! keyword, `=`, the value. Values are bytes: an xattr's value may hold
//! anything, newlines included, which the length makes safe.

use std::collections::BTreeMap;

use crate::entry::Xattrs;

/// The keywords of one extended header, in the order written (a later
/// record of the same keyword wins).
#[derive(Debug, Default, Clone)]
pub(crate) struct Records {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Sparse 0.0 writes `GNU.sparse.offset` / `GNU.sparse.numbytes` pairs
    /// as repeated records, so their order matters.
    sparse_pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Records {
    /// Parse an extended header's data; the error names what is wrong.
    pub(crate) fn parse(data: &[u8]) -> Result<Records, String> {
        let mut r = Records::default();
        let mut rest = data;
        while !rest.is_empty() {
            // Some writers pad the data with NULs.
            if rest.iter().all(|&c| c == 0) {
                break;
            }
            let sp = rest
                .iter()
                .position(|&c| c == b' ')
                .ok_or("pax record without a length")?;
            let len: usize = std::str::from_utf8(&rest[..sp])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("pax record length is not a number")?;
            if len <= sp + 1 || len > rest.len() {
                return Err(format!("pax record length {len} does not fit the header"));
            }
            let rec = &rest[sp + 1..len];
            let rec = rec.strip_suffix(b"\n").ok_or("pax record not ended by a newline")?;
            let eq = rec.iter().position(|&c| c == b'=').ok_or("pax record without '='")?;
            let (k, v) = (rec[..eq].to_vec(), rec[eq + 1..].to_vec());
            if k == b"GNU.sparse.offset" || k == b"GNU.sparse.numbytes" {
                r.sparse_pairs.push((k.clone(), v.clone()));
            }
            r.map.insert(k, v);
            rest = &rest[len..];
        }
        Ok(r)
    }

    /// Records of `other` override these (a local header over the global
    /// ones).
    pub(crate) fn overlay(&self, other: &Records) -> Records {
        let mut r = self.clone();
        for (k, v) in &other.map {
            r.map.insert(k.clone(), v.clone());
        }
        r.sparse_pairs.extend(other.sparse_pairs.iter().cloned());
        r
    }

    /// A keyword's value.
    pub(crate) fn get(&self, key: &str) -> Option<&[u8]> {
        self.map.get(key.as_bytes()).map(|v| v.as_slice())
    }

    /// A keyword's value as a decimal number.
    pub(crate) fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map(Some)
                .ok_or_else(|| format!("pax {key}={} is not a number", String::from_utf8_lossy(v))),
        }
    }

    /// A keyword's value as a time: seconds with an optional fraction,
    /// possibly negative (`mtime=1700000000.123456789`).
    pub(crate) fn time(&self, key: &str) -> Result<Option<(i64, u32)>, String> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || format!("pax {key}={} is not a time", String::from_utf8_lossy(v));
        let s = std::str::from_utf8(v).map_err(|_| bad())?;
        let (neg, s) = match s.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, s),
        };
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        let sec: i64 = whole.parse().map_err(|_| bad())?;
        if !frac.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        let mut ns = 0u32;
        for (i, c) in frac.bytes().take(9).enumerate() {
            ns += u32::from(c - b'0') * 10u32.pow(8 - i as u32);
        }
        // -1.25 is 1.25 s before the epoch: second -2, 750 ms into it.
        Ok(Some(if !neg {
            (sec, ns)
        } else if ns == 0 {
            (-sec, 0)
        } else {
            (-sec - 1, 1_000_000_000 - ns)
        }))
    }

    /// Extended attributes: `SCHILY.xattr.NAME=VALUE` (GNU tar, star,
    /// bsdtar) with the raw value, and `LIBARCHIVE.xattr.NAME=BASE64`
    /// (bsdtar) with a %-encoded name and a base64 value.
    pub(crate) fn xattrs(&self) -> Result<Xattrs, String> {
        let mut out: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for (k, v) in &self.map {
            if let Some(name) = k.strip_prefix(b"LIBARCHIVE.xattr.") {
                let name = percent_decode(name);
                let val = base64_decode(v)
                    .ok_or_else(|| format!("pax {}: value is not base64", String::from_utf8_lossy(k)))?;
                out.insert(name, val);
            }
        }
        // SCHILY's spelling wins where both name one attribute.
        for (k, v) in &self.map {
            if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                out.insert(name.to_vec(), v.clone());
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Sparse format 0.0's map: repeated offset / numbytes records.
    pub(crate) fn sparse_pairs(&self) -> Result<Vec<(u64, u64)>, String> {
        let num = |v: &[u8]| -> Result<u64, String> {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("pax GNU.sparse value {} is not a number", String::from_utf8_lossy(v)))
        };
        let mut out = Vec::new();
        let mut it = self.sparse_pairs.iter();
        while let Some((k, v)) = it.next() {
            if k != b"GNU.sparse.offset" {
                return Err("pax GNU.sparse.numbytes without an offset before it".into());
            }
            let (k2, v2) = it.next().ok_or("pax GNU.sparse.offset without numbytes")?;
            if k2 != b"GNU.sparse.numbytes" {
                return Err("pax GNU.sparse.offset without numbytes".into());
            }
            out.push((num(v)?, num(v2)?));
        }
        Ok(out)
    }
}

/// `%XX` escapes, as libarchive writes xattr names.
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            let hex = std::str::from_utf8(&s[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// Standard base64 (RFC 4648), padding optional, as libarchive writes it.
fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s: Vec<u8> = s.iter().copied().filter(|&c| c != b'=').collect();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = acc << 6 | val(c)?;
        }
        acc <<= 6 * (4 - chunk.len() as u32);
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One record with its length prefix computed.
    pub(crate) fn record(k: &str, v: &[u8]) -> Vec<u8> {
        let body_len = 1 + k.len() + 1 + v.len() + 1;
        let mut n = body_len + 1;
        while n.to_string().len() + body_len != n {
            n = n.to_string().len() + body_len;
        }
        let mut r = format!("{n} {k}=").into_bytes();
        r.extend_from_slice(v);
        r.push(b'\n');
        r
    }

    #[test]
    fn records_and_xattrs() {
        let mut d = record("path", b"a/very/long/name");
        d.extend(record("mtime", b"1700000000.5"));
        d.extend(record("SCHILY.xattr.security.selinux", b"system_u:object_r:bin_t:s0\0"));
        d.extend(record("SCHILY.xattr.user.nl", b"a\nb"));
        d.extend(record("LIBARCHIVE.xattr.user.b64", b"aGVsbG8="));
        let r = Records::parse(&d).unwrap();
        assert_eq!(r.get("path"), Some(&b"a/very/long/name"[..]));
        assert_eq!(r.time("mtime").unwrap(), Some((1_700_000_000, 500_000_000)));
        let x = r.xattrs().unwrap();
        assert!(x.contains(&(b"security.selinux".to_vec(), b"system_u:object_r:bin_t:s0\0".to_vec())));
        assert!(x.contains(&(b"user.nl".to_vec(), b"a\nb".to_vec())));
        assert!(x.contains(&(b"user.b64".to_vec(), b"hello".to_vec())));
    }

    #[test]
    fn negative_fractional_time() {
        let r = Records::parse(&record("mtime", b"-1.25")).unwrap();
        assert_eq!(r.time("mtime").unwrap(), Some((-2, 750_000_000)));
    }

    #[test]
    fn broken_records_are_errors() {
        assert!(Records::parse(b"99 path=x\n").is_err());
        assert!(Records::parse(b"x path=x\n").is_err());
        assert!(Records::parse(b"10 pathx\nxx").is_err());
        assert!(Records::parse(b"3 \n").is_err());
    }

    #[test]
    fn base64() {
        assert_eq!(base64_decode(b"aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode(b"aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode(b"").unwrap(), b"");
        assert!(base64_decode(b"a").is_none());
        assert!(base64_decode(b"a!==").is_none());
    }

    #[test]
    fn percent() {
        assert_eq!(percent_decode(b"user.a%3Db"), b"user.a=b");
        assert_eq!(percent_decode(b"user.%"), b"user.%");
        assert_eq!(percent_decode(b"user.%zz"), b"user.%zz");
    }
}
