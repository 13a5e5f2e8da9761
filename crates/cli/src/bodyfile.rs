//! The Sleuth Kit 3.x+ body file, the input of `mactime -b FILE`: one line
//! per name, `MD5|name|inode|mode_as_string|UID|GID|size|atime|mtime|ctime|crtime`.
//!
//! What Debian's sleuthkit 4.11 `mactime` does with a line (read from its
//! Perl source and tried): it splits on `|` and then decodes `%XX` in
//! every field, so a name carrying `|`, a newline or `%` is written with
//! those escaped and comes back exact; a time is taken as a Perl number,
//! so `1700000000.123456789` is accepted and printed to the second (a
//! time before 1970 is left out of its timeline); a time of 0 means
//! "none" (a missing crtime). We write the MD5 as 0 (not computed), as
//! `fls -m` does.

use std::fmt::Write;

use ext4kit::{FileType, Stat, Timestamp};

use crate::fmt::mode_string;

/// One body-file line (without its newline) for `name` and `s`.
pub fn line(name: &[u8], s: &Stat) -> String {
    format!(
        "0|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        escape(name),
        s.ino,
        mode(s.ftype, s.mode),
        s.uid,
        s.gid,
        s.size,
        time(s.atime),
        time(s.mtime),
        time(s.ctime),
        if s.has_crtime { time(s.crtime) } else { "0".into() }
    )
}

/// A name with `%`, `|`, control characters and bytes that are not UTF-8
/// written as `%XX` (mactime decodes them back).
pub fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' || c == '|' || c.is_control() {
                let mut b = [0u8; 4];
                for byte in c.encode_utf8(&mut b).bytes() {
                    let _ = write!(out, "%{byte:02X}");
                }
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Seconds since the epoch, with the nanoseconds as a fraction when
/// there are any: `1700000000` or `1700000000.000000005`; before 1970,
/// the same number (`-1.5` for 0.5 s before `-1`).
pub fn time(t: Timestamp) -> String {
    match (t.nsec, t.sec < 0) {
        (0, _) => t.sec.to_string(),
        (n, false) => format!("{}.{n:09}", t.sec),
        // sec + nsec/1e9 with sec < 0: e.g. -2 + 0.5 = -1.5.
        (n, true) => format!("-{}.{:09}", -(t.sec + 1), 1_000_000_000 - n),
    }
}

/// TSK's mode string: the name's type, `/`, the inode's type and its
/// permissions as ls prints them (`r/rrw-r--r--`, `d/drwxr-xr-x`).
pub fn mode(ft: FileType, m: u16) -> String {
    let t = match ft {
        FileType::Regular => 'r',
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
    };
    let ls = mode_string(ft, m);
    format!("{t}/{t}{}", &ls[1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(
            time(Timestamp {
                sec: 1_700_000_000,
                nsec: 0
            }),
            "1700000000"
        );
        assert_eq!(time(Timestamp { sec: 5, nsec: 5 }), "5.000000005");
        assert_eq!(
            time(Timestamp {
                sec: -2,
                nsec: 500_000_000
            }),
            "-1.500000000"
        );
        assert_eq!(time(Timestamp { sec: -1, nsec: 1 }), "-0.999999999");
    }

    #[test]
    fn names_round_trip_through_mactime_decoding() {
        assert_eq!(escape(b"a|b%c\nd"), "a%7Cb%25c%0Ad");
        assert_eq!(escape("café".as_bytes()), "café");
        assert_eq!(escape(b"x\xffy"), "x%FFy");
    }

    #[test]
    fn modes() {
        assert_eq!(mode(FileType::Regular, 0o100644), "r/rrw-r--r--");
        assert_eq!(mode(FileType::Directory, 0o41777), "d/drwxrwxrwt");
        assert_eq!(mode(FileType::Symlink, 0o120777), "l/lrwxrwxrwx");
    }
}
