//! The text metadata's syntax: LVM's config tree (`libdm/libdm-config.c`),
//! the language of `vgcfgbackup` files and of the text in a metadata area.
//!
//! ```text
//! vg0 {                       # a section: a name, then items in braces
//!     id = "zPBv4e-..."       # a string (backslash escapes the next byte)
//!     seqno = 4               # an integer (a float has a '.')
//!     status = ["READ", "WRITE"]   # an array of scalars
//! }
//! ```
//!
//! Comments run from `#` to the end of the line. Names are runs of bytes
//! other than blanks and the punctuation above. Arrays hold only scalars.
//!
//! The text comes off a disk and may be hostile, so the parser bounds its
//! work: sections nest at most [`MAX_DEPTH`] deep (the VG metadata needs
//! four), integers that overflow are errors, a key given twice in one
//! section is an error (two LVs of one name would make "which one" a
//! guess), and an unterminated string, array or section is an error
//! naming the line it started on. Memory is linear in the text, which the
//! metadata area reader has already bounded.

use std::collections::HashSet;
use std::io;

use super::corrupt_lvm;

/// How deep sections may nest: the VG's section, `logical_volumes`, an LV,
/// a segment, and room to spare for future metadata.
pub(crate) const MAX_DEPTH: usize = 16;

/// A scalar or array value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
}

/// One `name = value` or `name { ... }`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    Value(Value),
    Section(Section),
}

/// A section's items, in the order of the text.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Section {
    items: Vec<(String, Item)>,
}

impl Section {
    pub(crate) fn get(&self, key: &str) -> Option<&Item> {
        self.items.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn section(&self, key: &str) -> Option<&Section> {
        match self.get(key) {
            Some(Item::Section(s)) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn value(&self, key: &str) -> Option<&Value> {
        match self.get(key) {
            Some(Item::Value(v)) => Some(v),
            _ => None,
        }
    }

    /// The subsections, name and body, in the text's order.
    pub(crate) fn sections(&self) -> impl Iterator<Item = (&str, &Section)> {
        self.items.iter().filter_map(|(k, v)| match v {
            Item::Section(s) => Some((k.as_str(), s)),
            Item::Value(_) => None,
        })
    }
}

/// Parse a whole metadata text into its top-level section.
pub(crate) fn parse(text: &[u8]) -> io::Result<Section> {
    let mut p = Parser { text, pos: 0, line: 1 };
    let top = p.items(0, None)?;
    Ok(top)
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
}

/// Bytes that end a name.
fn is_punct(b: u8) -> bool {
    matches!(b, b'#' | b'=' | b'{' | b'}' | b'[' | b']' | b',' | b'"' | b'\'')
}

impl Parser<'_> {
    fn err(&self, what: impl std::fmt::Display) -> io::Error {
        corrupt_lvm(format!("metadata text line {}: {what}", self.line))
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    /// Skip blanks and comments.
    fn skip(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b'\n' => {
                    self.line += 1;
                    self.pos += 1;
                }
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.pos += 1;
                    }
                }
                b if b.is_ascii_whitespace() => self.pos += 1,
                _ => return,
            }
        }
    }

    /// Items until `}` (inside a section opened on line `open`) or the end
    /// of the text (at the top).
    fn items(&mut self, depth: usize, open: Option<usize>) -> io::Result<Section> {
        let mut sec = Section::default();
        // Keys seen, so a duplicate check stays linear in a long section.
        let mut seen = HashSet::new();
        loop {
            self.skip();
            match self.peek() {
                None => {
                    return match open {
                        None => Ok(sec),
                        Some(l) => Err(self.err(format!("the section opened on line {l} is not closed"))),
                    }
                }
                Some(b'}') => {
                    if open.is_none() {
                        return Err(self.err("'}' with no section open"));
                    }
                    self.pos += 1;
                    return Ok(sec);
                }
                Some(_) => {}
            }
            let name = self.name()?;
            if !seen.insert(name.clone()) {
                return Err(self.err(format!("{name:?} appears twice in one section")));
            }
            self.skip();
            let item = match self.peek() {
                Some(b'=') => {
                    self.pos += 1;
                    self.skip();
                    Item::Value(self.value(true)?)
                }
                Some(b'{') => {
                    if depth + 1 > MAX_DEPTH {
                        return Err(self.err(format!("sections nested more than {MAX_DEPTH} deep")));
                    }
                    let line = self.line;
                    self.pos += 1;
                    Item::Section(self.items(depth + 1, Some(line))?)
                }
                _ => return Err(self.err(format!("expected '=' or '{{' after {name:?}"))),
            };
            sec.items.push((name, item));
        }
    }

    fn name(&mut self) -> io::Result<String> {
        let start = self.pos;
        while self.peek().is_some_and(|b| !b.is_ascii_whitespace() && !is_punct(b)) {
            self.pos += 1;
        }
        if self.pos == start {
            let what = self
                .peek()
                .map_or("the end".to_string(), |b| format!("{:?}", b as char));
            return Err(self.err(format!("expected a name, found {what}")));
        }
        Ok(String::from_utf8_lossy(&self.text[start..self.pos]).into_owned())
    }

    fn value(&mut self, array_ok: bool) -> io::Result<Value> {
        match self.peek() {
            Some(q @ (b'"' | b'\'')) => self.string(q),
            Some(b'[') if array_ok => self.array(),
            Some(b'[') => Err(self.err("arrays do not nest")),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b) => Err(self.err(format!("expected a value, found {:?}", b as char))),
            None => Err(self.err("expected a value, found the end")),
        }
    }

    fn string(&mut self, quote: u8) -> io::Result<Value> {
        let line = self.line;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err(corrupt_lvm(format!("metadata text line {line}: string not terminated"))),
                Some(b) if b == quote => {
                    self.pos += 1;
                    return Ok(Value::Str(String::from_utf8_lossy(&out).into_owned()));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b) => {
                            if b == b'\n' {
                                self.line += 1;
                            }
                            out.push(b);
                            self.pos += 1;
                        }
                        None => return Err(corrupt_lvm(format!("metadata text line {line}: string not terminated"))),
                    }
                }
                Some(b) => {
                    if b == b'\n' {
                        self.line += 1;
                    }
                    out.push(b);
                    self.pos += 1;
                }
            }
        }
    }

    fn number(&mut self) -> io::Result<Value> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while self.peek().is_some_and(|b| b.is_ascii_digit() || b == b'.') {
            self.pos += 1;
        }
        let s = std::str::from_utf8(&self.text[start..self.pos]).map_err(|_| self.err("bad number"))?;
        if !s.bytes().any(|b| b.is_ascii_digit()) {
            return Err(self.err(format!("bad number {s:?}")));
        }
        if s.contains('.') {
            s.parse::<f64>()
                .map(Value::Float)
                .map_err(|_| self.err(format!("bad number {s:?}")))
        } else {
            s.parse::<i64>()
                .map(Value::Int)
                .map_err(|_| self.err(format!("number {s:?} is not a 64-bit integer")))
        }
    }

    fn array(&mut self) -> io::Result<Value> {
        let line = self.line;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            self.skip();
            match self.peek() {
                None => return Err(corrupt_lvm(format!("metadata text line {line}: array not terminated"))),
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(out));
                }
                // libdm treats the commas as optional separators.
                Some(b',') => self.pos += 1,
                Some(_) => out.push(self.value(false)?),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_vgcfgbackup_file() {
        let text = include_bytes!("testdata/vgcfgbackup.txt");
        let top = parse(text).unwrap();
        assert_eq!(top.value("version"), Some(&Value::Int(1)));
        assert_eq!(
            top.value("contents"),
            Some(&Value::Str("Text Format Volume Group".into()))
        );
        let vg = top.section("ext4kit_probe").unwrap();
        assert_eq!(vg.value("seqno"), Some(&Value::Int(4)));
        assert_eq!(
            vg.value("status"),
            Some(&Value::Array(vec![
                Value::Str("RESIZEABLE".into()),
                Value::Str("READ".into()),
                Value::Str("WRITE".into())
            ]))
        );
        assert_eq!(vg.value("flags"), Some(&Value::Array(vec![])));
        let lvs: Vec<_> = vg
            .section("logical_volumes")
            .unwrap()
            .sections()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(lvs, ["lin", "str"]);
        let seg = vg
            .section("logical_volumes")
            .unwrap()
            .section("str")
            .unwrap()
            .section("segment1")
            .unwrap();
        assert_eq!(
            seg.value("stripes"),
            Some(&Value::Array(vec![
                Value::Str("pv0".into()),
                Value::Int(2),
                Value::Str("pv1".into()),
                Value::Int(0)
            ]))
        );
    }

    #[test]
    fn parses_the_text_of_a_metadata_area() {
        // As LVM writes it into the metadata area: no indentation, the VG first.
        let top = parse(include_bytes!("testdata/mda_text.txt")).unwrap();
        assert!(top.section("ext4kit_probe").is_some());
        assert_eq!(top.value("creation_host"), Some(&Value::Str("vm".into())));
    }

    #[test]
    fn scalars() {
        let top = parse(b"a = -5\nb = 1.5\nc = \"q\\\"uo\\\\te\"\nd = 'single'\ne = [1 2, \"x\",]\n").unwrap();
        assert_eq!(top.value("a"), Some(&Value::Int(-5)));
        assert_eq!(top.value("b"), Some(&Value::Float(1.5)));
        assert_eq!(top.value("c"), Some(&Value::Str("q\"uo\\te".into())));
        assert_eq!(top.value("d"), Some(&Value::Str("single".into())));
        assert_eq!(
            top.value("e"),
            Some(&Value::Array(vec![
                Value::Int(1),
                Value::Int(2),
                Value::Str("x".into())
            ]))
        );
    }

    #[test]
    fn hostile_texts_are_errors() {
        for (text, want) in [
            (
                &b"vg {\n a = 1\n"[..],
                "line 3: the section opened on line 1 is not closed",
            ),
            (b"a = \"never ends", "string not terminated"),
            (b"a = [1, 2", "array not terminated"),
            (b"a = [[1]]", "arrays do not nest"),
            (b"a = 99999999999999999999", "not a 64-bit integer"),
            (b"a = 1\na = 2", "line 2: \"a\" appears twice"),
            (b"}", "no section open"),
            (b"a 1", "expected '=' or '{'"),
            (b"a =", "expected a value"),
            (b"= 1", "expected a name"),
            (b"a = --1", "bad number"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(want), "{:?}: {e}", String::from_utf8_lossy(text));
        }
        // Deep nesting is refused before it costs stack.
        let deep = "a {".repeat(100_000);
        let e = parse(deep.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
        let ok = format!("{}{}", "a {".repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn a_huge_flat_text_parses_in_linear_time() {
        let mut t = String::from("vg {\n");
        for i in 0..50_000 {
            t.push_str(&format!("k{i} = [\"a\", {i}]\n"));
        }
        t.push('}');
        let start = std::time::Instant::now();
        let _ = parse(t.as_bytes());
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}
