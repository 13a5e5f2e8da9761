//! The command as a distribution installs it: shell completion scripts and
//! man pages generated from the clap definitions, and the Debian package
//! that `scripts/build-deb` makes, installed with dpkg.
//!
//! Oracles: bash, zsh and fish parse the scripts; bash-completion's own
//! loader and completion machinery complete a subcommand prefix and an
//! option; man-db's `man` renders every page without a groff warning and
//! shows each command's help text; dpkg installs the package into a
//! throwaway copy of this machine — an overlay whose lower layer is `/`,
//! mounted in a private mount namespace and chrooted into, so the host's
//! dpkg database and /usr are never touched — where the binary runs, `man
//! ext4kit-put` shows the page and `whatis` finds it in man-db's index,
//! bash and fish complete `ext4kit pu`, zsh's compinit binds `_ext4kit`,
//! and `dpkg -r` takes it all away.
//!
//! Needs bash-completion, man-db, zsh, fish and cargo-deb (.ci/run installs
//! them); the package test needs root (CI runs as root). A missing tool
//! fails the test with its name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");
const BASH_COMPLETION: &str = "/usr/share/bash-completion/bash_completion";

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-pkg-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"))
}

/// Run and demand success; stdout as text.
fn ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ext4kit(args: &[&str]) -> String {
    ok(Command::new(BIN).args(args))
}

/// A tool the test needs, or a failure naming the package that has it.
fn need(tool: &str, package: &str) {
    let found = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    assert!(
        found,
        "`{tool}` not found: install the Debian package {package} (.ci/run does)"
    );
}

/// The visible subcommands, as `ext4kit --help` lists them (not from the
/// clap definitions the generators read, so a generator that skipped one
/// is caught).
fn subcommands() -> Vec<String> {
    let help = ext4kit(&["--help"]);
    let list = help.split("Commands:\n").nth(1).expect("a Commands: section in --help");
    let names: Vec<String> = list
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&n| n != "help")
        .map(str::to_string)
        .collect();
    assert!(
        names.len() > 20 && names.iter().any(|n| n == "put"),
        "subcommands from --help: {names:?}"
    );
    names
}

/// Words of a text, for comparing help texts with what groff made of
/// them: runs of ASCII letters and digits, so line breaks, justification,
/// quotes and dashes (which groff may turn into other characters) do not
/// matter.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn contains_seq(hay: &[String], needle: &[String]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Every help paragraph of `ext4kit help SUB` (the long help, as `SUB
/// --help` shows it; bench hands --help to its own program): the
/// command's description and each argument's text (the indented blocks
/// under an argument line).
fn help_paragraphs(sub: &str) -> Vec<String> {
    let help = ext4kit(&["help", sub]);
    let mut paras = vec![help.split("\n\nUsage:").next().unwrap_or_default().to_string()];
    let mut cur = String::new();
    for line in help.lines() {
        if let Some(text) = same_line_help(line) {
            paras.push(text);
        } else if line.starts_with("          ") {
            // "[default: …]" and "Possible values:" lists are rendered by
            // clap_mangen in a layout of its own; the prose is what matters.
            let t = line.trim();
            if t.starts_with('[') || t.starts_with("Possible values") || t.starts_with("- ") {
                continue;
            }
            cur.push_str(t);
            cur.push(' ');
        } else if !cur.is_empty() {
            paras.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        paras.push(cur);
    }
    // Every command has arguments (the global options at least).
    assert!(
        paras.len() >= 2,
        "no argument texts found in `ext4kit help {sub}`:\n{help}"
    );
    paras
}

/// An argument's text when clap puts it on the argument's own line (a
/// command none of whose arguments has a long help): after the first run
/// of two spaces that follows the names, less a trailing "[default: …]".
fn same_line_help(line: &str) -> Option<String> {
    let spec = line.trim_start();
    if !(spec.starts_with('-') || spec.starts_with('<') || spec.starts_with('[')) || spec.len() == line.len() {
        return None;
    }
    let text = spec.split_once("  ")?.1.trim();
    let text = match text.rfind(" [") {
        Some(i) if text.ends_with(']') => &text[..i],
        _ => text,
    };
    (!text.is_empty()).then(|| text.to_string())
}

/// `man` on a page, rendered as plain text with no hyphenation (--nh) or
/// justification (--nj), groff's warnings on (--warnings).
fn man(args: &[&str]) -> Output {
    need("man", "man-db");
    let mut cmd = Command::new("man");
    cmd.args(["--warnings", "--nh", "--nj", "-P", "cat"])
        .args(args)
        .env("MANWIDTH", "200")
        .env("LC_ALL", "C.UTF-8");
    run(&mut cmd)
}

#[test]
fn completion_scripts_parse() {
    let dir = tmp("parse");
    for (shell, check) in [
        ("bash", &["bash", "-n"][..]),
        ("zsh", &["zsh", "-n"][..]),
        ("fish", &["fish", "--no-execute"][..]),
    ] {
        need(check[0], check[0]);
        let script = ext4kit(&["completions", shell]);
        assert!(
            script.contains("mkfs") && script.contains("uid-map"),
            "{shell}: {script}"
        );
        let path = dir.join(format!("ext4kit.{shell}"));
        std::fs::write(&path, &script).unwrap();
        ok(Command::new(check[0]).args(&check[1..]).arg(&path));
    }
    // No interpreter here for these two: at least every subcommand is in them.
    for shell in ["elvish", "powershell"] {
        let script = ext4kit(&["completions", shell]);
        for sub in subcommands() {
            assert!(script.contains(&sub), "{shell} script lacks {sub}");
        }
    }
    let o = run(Command::new(BIN).args(["completions", "tcsh"]));
    assert!(!o.status.success(), "an unknown shell must be refused");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bash"),
        "the error lists the shells"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What bash completes for `words` (the last one being completed), after
/// `load` has made ext4kit's completion available: bash-completion is
/// sourced, the function `complete -p ext4kit` names is called as bash
/// calls it, and COMPREPLY is the answer.
pub const COMPLETE_SH: &str = r#"
. /usr/share/bash-completion/bash_completion
eval "$LOAD"
spec=$(complete -p ext4kit) || { echo "no completion registered for ext4kit" >&2; exit 3; }
fn=${spec#*-F }; fn=${fn%% *}
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
COMP_TYPE=9
COMP_KEY=9
"$fn" ext4kit "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;

fn bash_complete(load: &str, words: &[&str]) -> BTreeSet<String> {
    need("bash", "bash");
    assert!(
        Path::new(BASH_COMPLETION).exists(),
        "{BASH_COMPLETION} not found: install the Debian package bash-completion (.ci/run does)"
    );
    let out = ok(Command::new("bash")
        .args(["-c", COMPLETE_SH, "bash"])
        .args(words)
        .env("LOAD", load));
    out.lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn bash_completes_subcommands_and_options() {
    let dir = tmp("bash");
    let script = dir.join("ext4kit.bash");
    std::fs::write(&script, ext4kit(&["completions", "bash"])).unwrap();
    let load = format!(". '{}'", script.display());
    let complete = |words: &[&str]| bash_complete(&load, words);

    assert_eq!(complete(&["ext4kit", "pu"]), set(&["put"]));
    // The packager's hidden command is not offered.
    assert_eq!(complete(&["ext4kit", "m"]), set(&["mkfs", "mount", "mkdir", "mv"]));
    assert_eq!(complete(&["ext4kit", "manp"]), set(&[]));
    // The shells (with, as clap completes an empty word, the options).
    let shells: BTreeSet<String> = complete(&["ext4kit", "completions", ""])
        .into_iter()
        .filter(|w| !w.starts_with('-'))
        .collect();
    assert_eq!(shells, set(&["bash", "elvish", "fish", "powershell", "zsh"]));
    assert_eq!(complete(&["ext4kit", "completions", "z"]), set(&["zsh"]));
    // Options of the subcommand, its own and the global ones.
    let put = complete(&["ext4kit", "put", "--"]);
    for opt in [
        "--uid-map",
        "--all-root",
        "--file-contexts",
        "--partition",
        "--no-replay",
        "--help",
    ] {
        assert!(put.contains(opt), "`ext4kit put --` offers {put:?}, not {opt}");
    }
    assert!(!put.contains("--long"), "ls's option offered for put: {put:?}");
    assert_eq!(complete(&["ext4kit", "ls", "--al"]), set(&["--all"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_command_has_a_man_page_with_its_help() {
    let dir = tmp("man");
    let pages = dir.join("man1");
    ext4kit(&["manpages", pages.to_str().unwrap()]);
    let subs = subcommands();
    let mut want: BTreeSet<String> = subs.iter().map(|s| format!("ext4kit-{s}.1")).collect();
    want.insert("ext4kit.1".into());
    let have: BTreeSet<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(have, want, "one page per visible command, no other");

    for page in &want {
        let path = pages.join(page);
        let o = man(&["-l", path.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && err.trim().is_empty(),
            "man -l {page}: {}\n{err}",
            o.status
        );
        let name = page.trim_end_matches(".1");
        assert!(text.contains("NAME") && text.contains(name), "{page}:\n{text}");
        assert!(text.contains("SEE ALSO"), "{page} has no SEE ALSO:\n{text}");
    }
    // Each subcommand's page carries its long help: the description and
    // every argument's text, word for word.
    for sub in &subs {
        let path = pages.join(format!("ext4kit-{sub}.1"));
        let text = String::from_utf8_lossy(&man(&["-l", path.to_str().unwrap()]).stdout).into_owned();
        let text_words = words(&text);
        for para in help_paragraphs(sub) {
            assert!(
                contains_seq(&text_words, &words(&para)),
                "ext4kit-{sub}.1 lacks this help text:\n{para}\n--- page:\n{text}"
            );
        }
    }
    // The whole command's page: the long description and a way to every
    // subcommand's page.
    let main = String::from_utf8_lossy(&man(&["-l", pages.join("ext4kit.1").to_str().unwrap()]).stdout).into_owned();
    assert!(
        contains_seq(
            &words(&main),
            &words("mkfs, put, mkdir, rm, mv, ln, chmod, chown, touch, truncate")
        ),
        "{main}"
    );
    for sub in &subs {
        assert!(
            main.contains(&format!("ext4kit-{sub}(1)")),
            "ext4kit.1 does not point to ext4kit-{sub}(1)"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The profile this test binary was built with, as cargo-deb names it:
/// the directory holding the ext4kit binary (`debug` is cargo's directory
/// for the dev profile).
fn profile() -> String {
    let dir = Path::new(BIN)
        .parent()
        .and_then(Path::file_name)
        .expect("the binary's directory");
    match dir.to_string_lossy().as_ref() {
        "debug" => "dev".to_string(),
        p => p.to_string(),
    }
}

/// Build the .deb from the binary this test runs (`--no-build`), into `out`.
fn build_deb(out: &Path) -> PathBuf {
    let cargo_deb = run(Command::new("cargo").args(["deb", "--version"]));
    assert!(
        cargo_deb.status.success(),
        "cargo-deb is not installed (`cargo install cargo-deb --locked`; .ci/run does): {}",
        String::from_utf8_lossy(&cargo_deb.stderr).trim()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/build-deb");
    let stdout = ok(Command::new(script)
        .args(["--profile", &profile(), "--no-build", "--", "--fast", "-o"])
        .arg(out));
    let deb = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(
        deb.is_file() && deb.starts_with(out),
        "build-deb's last line is not the .deb: {stdout}"
    );
    deb
}

/// Installs the package in an overlay copy of this machine; runs in the
/// private mount namespace. The host's / is the overlay's read-only lower
/// layer; its writes land in a tmpfs that disappears with the namespace.
/// $OUT (a host directory) is bound at /out for the results.
const INSTALL_SH: &str = r#"
set -eu
mount -t tmpfs ext4kit-pkg-test "$T"
mkdir "$T/upper" "$T/work" "$T/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$T/upper,workdir=$T/work" "$T/root"
mount -t proc proc "$T/root/proc"
mount --rbind /dev "$T/root/dev"
mkdir -p "$T/root/out"
mount --bind "$OUT" "$T/root/out"
cp "$DEB" "$T/root/tmp/ext4kit.deb"
exec chroot "$T/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
  MANWIDTH=200 LOAD="$LOAD" COMPLETE_SH="$COMPLETE_SH" /bin/bash -c '
set -eu
cd /out
# A copy installed on this machine outside the test goes first (in the
# overlay only), so what runs below is what the package installed.
dpkg -P ext4kit > /dev/null 2>&1 || true
rm -f /usr/bin/ext4kit
dpkg -i /tmp/ext4kit.deb > dpkg-install.txt 2>&1
dpkg -L ext4kit > dpkg-files.txt
ext4kit --version > version.txt
readelf -S --wide /usr/bin/ext4kit > sections.txt
man -w ext4kit-put > man-where.txt
whatis ext4kit-put > whatis.txt
man --warnings --nh --nj -P cat ext4kit-put > man-put.txt 2> man-put.err
bash -c "$COMPLETE_SH" bash ext4kit pu > bash-subcommand.txt
bash -c "$COMPLETE_SH" bash ext4kit put --uid > bash-option.txt
fish -c "complete -C \"ext4kit pu\"" > fish-subcommand.txt
zsh -fc "autoload -Uz compinit && compinit -u -d /tmp/zcompdump && print -r -- \${_comps[ext4kit]}" > zsh-comps.txt
dpkg -r ext4kit > dpkg-remove.txt 2>&1
for f in $(cat dpkg-files.txt); do test -d "$f" || test ! -e "$f" || echo "$f"; done > left-after-remove.txt
'
"#;

#[test]
fn debian_package_installs_and_works() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test installs the .deb with dpkg in a private mount namespace over an overlay of / (root); CI runs as root"
    );
    for (tool, package) in [
        ("unshare", "util-linux"),
        ("dpkg-deb", "dpkg"),
        ("fish", "fish"),
        ("zsh", "zsh"),
        ("man", "man-db"),
        ("readelf", "binutils"),
    ] {
        need(tool, package);
    }
    let dir = tmp("deb");
    let deb = build_deb(&dir);
    let host_before = host_state();

    // The package as dpkg reads it, before installing.
    let field = |name: &str| {
        ok(Command::new("dpkg-deb").args(["-f"]).arg(&deb).arg(name))
            .trim()
            .to_string()
    };
    assert_eq!(field("Package"), "ext4kit");
    assert!(field("Depends").contains("libc6"), "Depends: {}", field("Depends"));
    assert_eq!(field("Recommends"), "fuse3");
    let listing = ok(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let mut want = vec![
        "./usr/bin/ext4kit".to_string(),
        "./usr/share/man/man1/ext4kit.1.gz".into(),
        "./usr/share/bash-completion/completions/ext4kit".into(),
        "./usr/share/zsh/vendor-completions/_ext4kit".into(),
        "./usr/share/fish/vendor_completions.d/ext4kit.fish".into(),
    ];
    want.extend(
        subcommands()
            .iter()
            .map(|s| format!("./usr/share/man/man1/ext4kit-{s}.1.gz")),
    );
    for path in &want {
        assert!(
            listing.lines().any(|l| l.ends_with(path.as_str())),
            "the .deb lacks {path}:\n{listing}"
        );
    }

    // Install it for real, in the overlay.
    let out = dir.join("out");
    let root = dir.join("mnt");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let load = r#"d=$(complete -p -D); f=${d#*-F }; f=${f%% *}; "$f" ext4kit "" ext4kit || true"#;
    let o = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", INSTALL_SH])
        .env("T", &root)
        .env("OUT", &out)
        .env("DEB", &deb)
        .env("LOAD", load)
        .env("COMPLETE_SH", COMPLETE_SH));
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    assert!(
        o.status.success(),
        "installing in the overlay failed ({}): {}{}\ndpkg -i: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        read("dpkg-install.txt")
    );
    assert_eq!(host_state(), host_before, "the install reached the host");

    assert_eq!(
        read("version.txt").trim(),
        ext4kit(&["--version"]).trim(),
        "the installed binary"
    );
    // Stripped: no DWARF shipped, whatever the profile keeps (rustc's
    // .debug_gdb_scripts is a loaded section and stays).
    let sections = read("sections.txt");
    assert!(
        sections.contains(".text") && !sections.contains(".debug_info") && !sections.contains(".debug_line"),
        "the installed binary's sections:\n{}",
        read("sections.txt")
    );
    assert_eq!(read("man-where.txt").trim(), "/usr/share/man/man1/ext4kit-put.1.gz");
    // dpkg's man-db trigger indexed the new pages (whatis reads the index).
    assert!(
        read("whatis.txt").starts_with("ext4kit-put (1)"),
        "whatis ext4kit-put: {}",
        read("whatis.txt")
    );
    let page = read("man-put.txt");
    assert!(
        read("man-put.err").trim().is_empty(),
        "man ext4kit-put: {}",
        read("man-put.err")
    );
    let about = help_paragraphs("put").remove(0);
    assert!(
        page.contains("ext4kit-put") && contains_seq(&words(&page), &words(&about)),
        "man ext4kit-put shows:\n{page}"
    );
    assert_eq!(read("bash-subcommand.txt").trim(), "put", "bash: ext4kit pu<TAB>");
    assert_eq!(
        read("bash-option.txt").trim(),
        "--uid-map",
        "bash: ext4kit put --uid<TAB>"
    );
    assert!(
        read("fish-subcommand.txt")
            .lines()
            .any(|l| l.split('\t').next() == Some("put")),
        "fish: ext4kit pu<TAB> gives {}",
        read("fish-subcommand.txt")
    );
    // compinit found _ext4kit in zsh's function path and bound it to ext4kit.
    assert_eq!(read("zsh-comps.txt").trim(), "_ext4kit", "zsh's completion for ext4kit");
    assert!(
        read("dpkg-remove.txt").contains("Removing ext4kit"),
        "{}",
        read("dpkg-remove.txt")
    );
    assert_eq!(read("left-after-remove.txt"), "", "files left after dpkg -r");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the host's dpkg and /usr say about ext4kit, to show the install
/// stayed in the overlay.
fn host_state() -> (bool, String, String) {
    let query = run(Command::new("dpkg-query").args(["-W", "ext4kit"]));
    let status = std::fs::read_to_string("/var/lib/dpkg/status").unwrap_or_default();
    let ours: String = status
        .split("\n\n")
        .filter(|p| p.starts_with("Package: ext4kit\n"))
        .collect();
    (
        Path::new("/usr/bin/ext4kit").exists(),
        String::from_utf8_lossy(&query.stdout).into_owned(),
        ours,
    )
}
