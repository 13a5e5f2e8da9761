//! `ext4kit getfattr [-n NAME] [--json] IMAGE PATH...`: extended
//! attributes as `getfattr -d` prints them (`name="text"` or
//! `name=0xHEX`), or as one JSON document. Read-only.

use ext4kit::{Cred, Fs, Target};
use serde_json::{json, Map, Value};

use super::edit::abs;
use super::{Failure, Image};
use crate::json;

/// Which attributes of which files, and how to print them.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Only this attribute (else all of each file's).
    pub name: Option<&'a str>,
    /// Files inside the image.
    pub paths: &'a [String],
    /// One JSON document instead of text.
    pub json: bool,
}

/// Print the attributes of each path. A path that cannot be read is
/// reported and the others are still printed; the command then fails.
pub fn run(image: &Image, req: &Request<'_>, budget: usize) -> Result<(), Failure> {
    let fs = super::open_fs(image, budget, req.json)?;
    let mut first: Option<Failure> = None;
    let mut files = Vec::new();
    for p in req.paths {
        let p = abs(p);
        match attributes(&fs, image, &p, req.name) {
            Ok((attrs, failures)) => {
                if req.json {
                    files.push(file_json(&p, &attrs));
                } else {
                    print_text(&p, &attrs);
                }
                for f in failures {
                    first.get_or_insert(f.reported(req.json));
                }
            }
            Err(f) => {
                first.get_or_insert(f.reported(req.json));
            }
        }
    }
    if req.json {
        json::print_document(&json!({"files": files}))?;
    }
    first.map_or(Ok(()), Err)
}

/// The attributes of `p` (all, or the one named) with their values, and
/// the failures of single attributes. Listing the names failing fails it.
#[allow(clippy::type_complexity)]
fn attributes(
    fs: &Fs,
    image: &Image,
    p: &str,
    name: Option<&str>,
) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, Vec<Failure>), Failure> {
    let root = Cred::root();
    let target = || Target::path(p.as_bytes()).nofollow();
    let names = match name {
        Some(n) => vec![n.as_bytes().to_vec()],
        None => fs
            .listxattr(target(), &root)
            .map_err(|e| Failure::engine(image, p, e))?,
    };
    let mut attrs = Vec::new();
    let mut failures = Vec::new();
    for n in names {
        match fs.getxattr(target(), &n, &root) {
            Ok(v) => attrs.push((n, v)),
            Err(e) => failures.push(Failure::engine(image, p, e)),
        }
    }
    Ok((attrs, failures))
}

fn print_text(p: &str, attrs: &[(Vec<u8>, Vec<u8>)]) {
    println!("# file: {}", p.trim_start_matches('/'));
    for (n, v) in attrs {
        println!("{}={}", String::from_utf8_lossy(n), encode_value(v));
    }
    println!();
}

/// `{"path", "xattrs": [{"name", "value"}]}`, names and values by the
/// `_bytes` rule of [`json::put_bytes`].
fn file_json(p: &str, attrs: &[(Vec<u8>, Vec<u8>)]) -> Value {
    let list: Vec<Value> = attrs
        .iter()
        .map(|(n, v)| {
            let mut m = Map::new();
            json::put_bytes(&mut m, "name", n);
            json::put_bytes(&mut m, "value", v);
            Value::Object(m)
        })
        .collect();
    json!({"path": p, "xattrs": list})
}

/// getfattr's text encoding: printable text quoted, anything else hex.
fn encode_value(v: &[u8]) -> String {
    if v.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\') {
        format!("\"{}\"", String::from_utf8_lossy(v))
    } else {
        format!("0x{}", json::hex(v))
    }
}
