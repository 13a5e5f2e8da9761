//! The JSON conventions every `--json` output shares (README.md, "JSON
//! output", lists the fields; they are kept stable):
//!
//! - a time is `{"sec": <i64 seconds since the epoch>, "nsec": <u32>}`,
//!   under `atime`, `mtime`, `ctime` and `crtime`; `crtime` is `null` when
//!   the inode has no room for it (128-byte inodes);
//! - a mode is the integer `st_mode` (type and permission bits) beside a
//!   `type` string: `file`, `dir`, `symlink`, `chardev`, `blockdev`,
//!   `fifo`, `socket`;
//! - bytes that may not be UTF-8 (names, paths, link targets, xattr names
//!   and values) are given as a string, decoded lossily, and — only when
//!   the decoding lost something — as the exact bytes in hex under the
//!   same key with `_bytes` appended (`name` and `name_bytes`).

use std::io::Write;

use ext4kit::{FileType, Stat, Timestamp};
use serde_json::{json, Map, Value};

/// A time as every JSON output gives it.
pub fn time(t: Timestamp) -> Value {
    json!({"sec": t.sec, "nsec": t.nsec})
}

/// The `type` string of a file type.
pub fn type_name(ft: FileType) -> &'static str {
    match ft {
        FileType::Regular => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        FileType::CharDevice => "chardev",
        FileType::BlockDevice => "blockdev",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `key`: `bytes` decoded lossily; `key_bytes`: the bytes in hex, only
/// when the decoding was lossy (not UTF-8).
pub fn put_bytes(m: &mut Map<String, Value>, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            m.insert(key.into(), s.into());
        }
        Err(_) => {
            m.insert(key.into(), String::from_utf8_lossy(bytes).into());
            m.insert(format!("{key}_bytes"), hex(bytes).into());
        }
    }
}

/// The attributes of an inode every listing shares: `ino`, `type`,
/// `mode`, `nlink`, `uid`, `gid`, `size`, `blocks`, the four times,
/// `rdev` (`{"major", "minor"}` for device nodes, else `null`) and
/// `target` (a symlink's contents, else `null`).
pub fn put_inode(m: &mut Map<String, Value>, s: &Stat, target: Option<&[u8]>) {
    m.insert("ino".into(), s.ino.into());
    m.insert("type".into(), type_name(s.ftype).into());
    m.insert("mode".into(), s.mode.into());
    m.insert("nlink".into(), s.nlink.into());
    m.insert("uid".into(), s.uid.into());
    m.insert("gid".into(), s.gid.into());
    m.insert("size".into(), s.size.into());
    m.insert("blocks".into(), s.blocks.into());
    m.insert("atime".into(), time(s.atime));
    m.insert("mtime".into(), time(s.mtime));
    m.insert("ctime".into(), time(s.ctime));
    m.insert("crtime".into(), if s.has_crtime { time(s.crtime) } else { Value::Null });
    let rdev = if matches!(s.ftype, FileType::CharDevice | FileType::BlockDevice) {
        json!({"major": s.rdev.0, "minor": s.rdev.1})
    } else {
        Value::Null
    };
    m.insert("rdev".into(), rdev);
    match target {
        Some(t) => put_bytes(m, "target", t),
        None => {
            m.insert("target".into(), Value::Null);
        }
    }
}

/// Write `v` as one line (JSON Lines). `false` when the output has gone
/// away (a closed pipe): the caller stops quietly.
pub fn write_line(out: &mut impl Write, v: &Value) -> bool {
    serde_json::to_writer(&mut *out, v).is_ok() && out.write_all(b"\n").is_ok()
}

/// Print `v` as one pretty document on stdout.
pub fn print_document(v: &Value) -> Result<(), String> {
    let s = serde_json::to_string_pretty(v).map_err(|e| format!("encoding JSON: {e}"))?;
    println!("{s}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_lossless() {
        let mut m = Map::new();
        put_bytes(&mut m, "name", b"caf\xc3\xa9");
        assert_eq!(Value::Object(m), json!({"name": "café"}));
        let mut m = Map::new();
        put_bytes(&mut m, "name", b"a\xffb");
        assert_eq!(Value::Object(m), json!({"name": "a\u{fffd}b", "name_bytes": "61ff62"}));
    }

    #[test]
    fn times_are_objects() {
        assert_eq!(time(Timestamp { sec: -1, nsec: 5 }), json!({"sec": -1, "nsec": 5}));
    }
}
