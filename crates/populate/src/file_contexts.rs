//! SELinux labels from a `file_contexts` file, matched the way libselinux
//! matches one (`selabel_lookup` with the file backend, what
//! `matchpathcon -f FILE` prints), so an image built here carries the
//! labels `restorecon` would give the same paths.
//!
//! A line is `REGEX [TYPE] CONTEXT`: REGEX is matched against the whole
//! absolute path (libselinux anchors it as `^(REGEX)$`); TYPE is one of
//! `--` (regular file), `-d`, `-l`, `-c`, `-b`, `-p`, `-s`, or absent
//! (every type); CONTEXT is the label, or `<<none>>` for "leave it
//! unlabelled". Which line wins when several match (label_file.c's
//! `sort_specs`, then a search from the end): lines whose REGEX has no
//! regular-expression metacharacter (an exact path) are tried before all
//! others, and within each group the line last in the file wins.
//!
//! libselinux compiles with PCRE2; the `regex` crate reads the dialect
//! file_contexts files use (groups, alternation, `?`, `*`, `+`, classes,
//! escapes), and a line it cannot read — a look-around, a backreference —
//! is an error naming the line, not a silently different label.

use regex::bytes::Regex;

use crate::entry::EntryKind;

/// Which file types a line applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeMatch {
    Any,
    Regular,
    Dir,
    Symlink,
    Char,
    Block,
    Fifo,
    Socket,
}

impl TypeMatch {
    fn parse(s: &str) -> Option<TypeMatch> {
        Some(match s {
            "--" => TypeMatch::Regular,
            "-d" => TypeMatch::Dir,
            "-l" => TypeMatch::Symlink,
            "-c" => TypeMatch::Char,
            "-b" => TypeMatch::Block,
            "-p" => TypeMatch::Fifo,
            "-s" => TypeMatch::Socket,
            _ => return None,
        })
    }

    fn matches(self, kind: &EntryKind) -> bool {
        match self {
            TypeMatch::Any => true,
            TypeMatch::Regular => matches!(kind, EntryKind::File { .. }),
            TypeMatch::Dir => matches!(kind, EntryKind::Dir),
            TypeMatch::Symlink => matches!(kind, EntryKind::Symlink(_)),
            TypeMatch::Char => matches!(kind, EntryKind::CharDevice(..)),
            TypeMatch::Block => matches!(kind, EntryKind::BlockDevice(..)),
            TypeMatch::Fifo => matches!(kind, EntryKind::Fifo),
            TypeMatch::Socket => matches!(kind, EntryKind::Socket),
        }
    }
}

#[derive(Debug)]
struct Spec {
    re: Regex,
    ftype: TypeMatch,
    /// `None`: `<<none>>`.
    context: Option<Vec<u8>>,
    exact: bool,
}

/// A parsed file_contexts file.
#[derive(Debug, Default)]
pub struct FileContexts {
    /// In lookup order: the regex lines, then the exact ones, each in
    /// file order (searched from the end).
    specs: Vec<Spec>,
}

/// libselinux's test for an exact path: none of `.^$?*+|[({`.
fn has_meta(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'.' | b'^' | b'$' | b'?' | b'*' | b'+' | b'|' | b'[' | b'(' | b'{' => return true,
            // An escaped character counts as itself.
            b'\\' => i += 1,
            _ => {}
        }
        i += 1;
    }
    false
}

impl FileContexts {
    /// Parse a file_contexts file's text; `name` is what errors call it.
    pub fn parse(text: &str, name: &str) -> Result<FileContexts, String> {
        let mut regexes = Vec::new();
        let mut exacts = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| format!("{name}:{}: {why}", n + 1);
            let f: Vec<&str> = line.split_whitespace().collect();
            let (path, ftype, ctx) = match f.as_slice() {
                [p, c] => (*p, TypeMatch::Any, *c),
                [p, t, c] => (
                    *p,
                    TypeMatch::parse(t).ok_or_else(|| bad(format!("unknown file type \"{t}\"")))?,
                    *c,
                ),
                _ => return Err(bad("expected REGEX [TYPE] CONTEXT".into())),
            };
            let re =
                Regex::new(&format!("^(?:{path})$")).map_err(|e| bad(format!("regular expression \"{path}\": {e}")))?;
            let spec = Spec {
                re,
                ftype,
                context: (ctx != "<<none>>").then(|| ctx.as_bytes().to_vec()),
                exact: !has_meta(path),
            };
            if spec.exact {
                exacts.push(spec);
            } else {
                regexes.push(spec);
            }
        }
        regexes.extend(exacts);
        Ok(FileContexts { specs: regexes })
    }

    /// The label for absolute path `path` of this kind: `None` when no
    /// line matches or the winning line says `<<none>>`.
    pub fn lookup(&self, path: &[u8], kind: &EntryKind) -> Option<&[u8]> {
        self.specs
            .iter()
            .rev()
            .find(|s| s.ftype.matches(kind) && s.re.is_match(path))
            .and_then(|s| s.context.as_deref())
    }

    /// The `security.selinux` value for a label: the context and a NUL, as
    /// libselinux's `lsetfilecon` writes it.
    pub fn xattr_value(label: &[u8]) -> Vec<u8> {
        let mut v = label.to_vec();
        v.push(0);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FC: &str = "
# comment
/.*                      system_u:object_r:default_t:s0
/usr(/.*)?               system_u:object_r:usr_t:s0
/usr/bin(/.*)?           system_u:object_r:bin_t:s0
/usr/bin/su     --       system_u:object_r:su_exec_t:s0
/usr/lib(64)?/.*\\.so(\\.[^/]*)*  --  system_u:object_r:lib_t:s0
/usr/bin        -d       system_u:object_r:bin_dir_t:s0
/tmp(/.*)?               <<none>>
/usr/.*                  system_u:object_r:later_t:s0
";

    fn look<'a>(fc: &'a FileContexts, p: &str, k: &EntryKind) -> Option<&'a str> {
        fc.lookup(p.as_bytes(), k).map(|v| std::str::from_utf8(v).unwrap())
    }

    #[test]
    fn libselinux_order() {
        let fc = FileContexts::parse(FC, "fc").unwrap();
        let file = EntryKind::File { size: 0 };
        // The last matching regex line wins...
        assert_eq!(look(&fc, "/usr/bin/ls", &file), Some("system_u:object_r:later_t:s0"));
        // ...but an exact path beats every regex, whatever the order.
        assert_eq!(look(&fc, "/usr/bin/su", &file), Some("system_u:object_r:su_exec_t:s0"));
        assert_eq!(
            look(&fc, "/usr/bin", &EntryKind::Dir),
            Some("system_u:object_r:bin_dir_t:s0")
        );
        // The type field: "/usr/bin" as a file is not the -d line.
        assert_eq!(look(&fc, "/usr/bin", &file), Some("system_u:object_r:later_t:s0"));
        assert_eq!(look(&fc, "/usr", &EntryKind::Dir), Some("system_u:object_r:usr_t:s0"));
        assert_eq!(look(&fc, "/etc/passwd", &file), Some("system_u:object_r:default_t:s0"));
        assert_eq!(look(&fc, "/tmp/x", &file), None);
        // Anchored: a prefix does not match.
        assert_eq!(look(&fc, "/usrx", &file), Some("system_u:object_r:default_t:s0"));
    }

    #[test]
    fn meta_characters() {
        assert!(!has_meta("/usr/bin/su"));
        assert!(!has_meta("/usr/bin/a\\.b"));
        assert!(has_meta("/usr(/.*)?"));
        assert!(has_meta("/a.b"));
    }

    #[test]
    fn bad_lines_are_named() {
        let e = FileContexts::parse("/a -x ctx\n", "fc").unwrap_err();
        assert!(e.starts_with("fc:1:"), "{e}");
        let e = FileContexts::parse("\n/(?=x) ctx\n", "fc").unwrap_err();
        assert!(e.starts_with("fc:2:"), "{e}");
        assert!(FileContexts::parse("/a\n", "fc").is_err());
    }
}
