//! `e2fsck -fn` as a comparable set of problems.
//!
//! "No worse than before" is decided on e2fsck's own words: every problem
//! line, with its numbers replaced by `#` (an allocation moves the counts
//! in "Free blocks count wrong ... counted=N" without adding a problem),
//! kept as a multiset. An operation made the image worse when some
//! normalised line appears more often after it than before, or e2fsck's
//! exit status went from clean to not clean.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// One `e2fsck -fn` run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fsck {
    /// Exit status (0 clean, 4 errors left, 8 operational error; -1 timed out).
    pub code: i32,
    /// Normalised problem lines and how often each appears.
    pub problems: BTreeMap<String, usize>,
    /// The raw output (stdout then stderr).
    pub raw: String,
}

/// Seconds e2fsck may take on one image (some damage makes it loop).
pub const FSCK_TIMEOUT_SECS: u32 = 60;

impl Fsck {
    /// Run `e2fsck -fn` on `img` under `timeout`.
    pub fn run(img: &Path) -> Result<Fsck, String> {
        let out = Command::new("timeout")
            .arg(FSCK_TIMEOUT_SECS.to_string())
            .args(["e2fsck", "-fn"])
            .arg(img)
            .output()
            .map_err(|e| format!("running e2fsck: {e} (install e2fsprogs)"))?;
        let raw = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let code = match out.status.code() {
            Some(124) | None => -1,
            Some(c) => c,
        };
        Ok(Fsck { code, problems: problems(&raw), raw })
    }

    /// Whether e2fsck finished (did not time out).
    pub fn finished(&self) -> bool {
        self.code >= 0
    }

    /// Total problem lines.
    pub fn count(&self) -> usize {
        self.problems.values().sum()
    }

    /// Whether e2fsck gave up in pass 1B: an inode it could not read
    /// ("Error while scanning inodes (N)") ends the run there.
    pub fn aborted_in_pass1b(&self) -> bool {
        self.raw.contains("Error while scanning inodes") && self.raw.contains("e2fsck: aborted")
    }

    /// The problems `after` has beyond `self`, or `None` when `after` is no
    /// worse.
    ///
    /// When both runs gave up in pass 1B, its "Multiply-claimed block(s) in
    /// inode N" lines are not compared: they are what e2fsck printed before
    /// the inode it could not read, and which inode it blames there shifts
    /// with unrelated changes (seed 552: a flipped extent of inode 13 —
    /// unreadable, stale checksum — names inode 146's block; deleting an
    /// unrelated file, by us or by debugfs' own `kill_file`, makes pass 1B
    /// print the block under inode 7, the resize inode, which names no
    /// block at all).
    pub fn worse(&self, after: &Fsck) -> Option<String> {
        let mut new = Vec::new();
        let unreliable_1b = self.aborted_in_pass1b() && after.aborted_in_pass1b();
        for (line, &n) in &after.problems {
            if unreliable_1b && line.starts_with("Multiply-claimed block(s) in inode") {
                continue;
            }
            let was = self.problems.get(line).copied().unwrap_or(0);
            if n > was {
                new.push(format!("{line} (x{} -> x{n})", was));
            }
        }
        if self.code == 0 && after.code != 0 && new.is_empty() {
            new.push(format!("e2fsck exit status 0 -> {}", after.code));
        }
        if !after.finished() && self.finished() {
            new.push("e2fsck now times out".into());
        }
        (!new.is_empty()).then(|| new.join("; "))
    }
}

/// The problem lines of e2fsck's output, normalised.
fn problems(raw: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for line in raw.lines() {
        let l = line.trim();
        if l.is_empty()
            || l.starts_with("Pass ")
            || l.starts_with("e2fsck 1.")
            || l.contains(" files (") && l.contains(" blocks")
            || l.contains("********** WARNING: Filesystem still has errors")
        {
            continue;
        }
        // Bitmap differences are one line listing blocks or inodes: each
        // entry is its own problem, number kept (a rm that frees one of
        // two wrongly marked blocks leaves a shorter, not a new, line).
        if let Some(rest) = l.strip_prefix("Block bitmap differences:").or(l.strip_prefix("Inode bitmap differences:"))
        {
            let kind = if l.starts_with("Block") { "block" } else { "inode" };
            for item in rest.split_whitespace() {
                for one in expand(item) {
                    *m.entry(format!("{kind} bitmap difference {one}")).or_insert(0) += 1;
                }
            }
            continue;
        }
        // Pass 1D names each file sharing a multiply-claimed block by its
        // path and mtime ("File /dir/a (inode #12, mod time Tue Nov 14
        // 22:13:20 2023)", then its sharers). Those describe a problem,
        // they are not one: an operation that adds a name to such a
        // directory, or moves it, changes them without making anything
        // worse (and the weekday of "now" would count as new). The sharing
        // itself is still counted — one such line per file, and pass 1B's
        // "Multiply-claimed block(s) in inode N" lines.
        if let Some(at) = l.find(" (inode #").filter(|_| l.contains(", mod time ") && l.ends_with(')')) {
            let file = if l[..at].starts_with("File ") { "File " } else { "" };
            *m.entry(format!("{file}<path> (inode #, mod time <time>)")).or_insert(0) += 1;
            continue;
        }
        // e2fsck's own crash report ("Signal (11) SIGSEGV ... fault
        // addr=0x55f1c74b615c", then a backtrace of "e2fsck(+0x36671)
        // [0x55f0ea2eb671]" lines) carries addresses that move from run
        // to run (ASLR): hexadecimal numbers are numbers too.
        let l = unhex(l);
        let mut norm = String::with_capacity(l.len());
        let mut in_digits = false;
        for c in l.chars() {
            if c.is_ascii_digit() {
                if !in_digits {
                    norm.push('#');
                }
                in_digits = true;
            } else {
                in_digits = false;
                norm.push(c);
            }
        }
        *m.entry(norm).or_insert(0) += 1;
    }
    m
}

/// `l` with every `0x…` hexadecimal number written as `0`.
fn unhex(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut rest = l;
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let n = tail.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(tail.len());
        out.push_str(if n > 0 { "0" } else { "0x" });
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// "+5" → ["+5"]; "-(3--6)" → ["-3", "-4", "-5", "-6"] (ranges past
/// 4096 entries stay whole).
fn expand(item: &str) -> Vec<String> {
    let (sign, body) = item.split_at(item.len().min(1));
    let range = body.strip_prefix('(').and_then(|b| b.strip_suffix(')')).and_then(|b| b.split_once("--"));
    if let Some((a, b)) = range {
        if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
            if b >= a && b - a < 4096 {
                return (a..=b).map(|n| format!("{sign}{n}")).collect();
            }
        }
    }
    vec![item.to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_do_not_make_a_problem_new_but_more_of_one_does() {
        let a = Fsck {
            code: 4,
            problems: problems("Pass 1: Checking inodes\nFree blocks count wrong (10, counted=12).\nFix? no\n"),
            raw: String::new(),
        };
        let b = Fsck {
            code: 4,
            problems: problems("Free blocks count wrong (9, counted=14).\nFix? no\n"),
            raw: String::new(),
        };
        assert_eq!(a.worse(&b), None);
        let c = Fsck {
            code: 4,
            problems: problems("Free blocks count wrong (9, counted=14).\nInode 12 ref count is 2, should be 1.\n"),
            raw: String::new(),
        };
        assert!(a.worse(&c).is_some_and(|w| w.contains("ref count")));
        let two = Fsck { code: 4, problems: problems("Block bitmap differences:  +7 -(10--12)\n"), raw: String::new() };
        let one = Fsck { code: 4, problems: problems("Block bitmap differences:  -11\n"), raw: String::new() };
        assert_eq!(two.worse(&one), None, "a subset of the differences is not worse");
        assert!(one.worse(&two).is_some());
        let clean = Fsck::default();
        assert!(clean.worse(&a).is_some());
    }

    /// e2fsck crashing the same way before and after is no new problem:
    /// its backtrace's addresses move with ASLR.
    #[test]
    fn an_e2fsck_crash_report_compares_without_its_addresses() {
        let crash = |a: &str, b: &str| Fsck {
            code: 8,
            problems: problems(&format!(
                "Signal (11) SIGSEGV si_code=SEGV_MAPERR fault addr=0x{a}\ne2fsck(e2fsck_pass2+0x258)[0x{b}]\n"
            )),
            raw: String::new(),
        };
        assert_eq!(crash("55f1c74b615c", "55f0ea2d6e28").worse(&crash("55d51f385c1a", "7faddccf6305")), None);
        assert_eq!(unhex("flags 0x80800, 0x"), "flags 0, 0x");
    }

    /// Pass 1D's file descriptions: a new mtime or path is not a new
    /// problem, one more sharing file is.
    #[test]
    fn multiply_claimed_file_descriptions_ignore_path_and_mtime() {
        let out = |dir: &str, when: &str| {
            format!(
                "File {dir} (inode #12, mod time {when}) \n  has 1 multiply-claimed block(s), shared with 1 file(s):\n\t/medium.bin (inode #206, mod time Tue Nov 14 22:13:20 2023)\nClone multiply-claimed blocks? no\n"
            )
        };
        let before =
            Fsck { code: 4, problems: problems(&out("/dir/a", "Tue Nov 14 22:13:20 2023")), raw: String::new() };
        let after =
            Fsck { code: 4, problems: problems(&out("/big/moved", "Wed Nov 25 20:24:36 2026")), raw: String::new() };
        assert_eq!(before.worse(&after), None);
        let more =
            out("/dir/a", "Tue Nov 14 22:13:20 2023") + "\t/other (inode #300, mod time Wed Nov 25 20:24:36 2026)\n";
        let more = Fsck { code: 4, problems: problems(&more), raw: String::new() };
        assert!(before.worse(&more).is_some(), "a third file sharing the block is worse");
    }
}
