//! The programs in `examples/` run and print what they promise, so they
//! cannot rot: each runs once on its own demo image (no arguments), and
//! the image `build_image` writes is checked by `e2fsck -fn`, then walked,
//! listed and copied into by the others (their argument forms).
//!
//! `cargo test` builds the examples before running tests. A run that
//! selects only this test (`--test examples`) does not: here an example
//! whose binary is missing or older than its source is built first (a
//! change to the library alone is not seen that way: run `cargo test`, or
//! `cargo build --examples`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo puts this profile's example binaries in
/// (`target/<profile>/examples`, beside this test's `deps`).
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps");
    profile_dir.join("examples")
}

/// Run example `name` with `args`; its stdout, after checking it exited 0.
fn run(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let bin = examples_dir().join(name);
    if is_stale(&bin, name) {
        build_example(name);
    }
    let out = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Whether example `name`'s binary `bin` is missing or older than its
/// sources.
fn is_stale(bin: &Path, name: &str) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(bin) else { return true };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    [src.join(format!("{name}.rs")), src.join("common/mod.rs")]
        .iter()
        .any(|s| modified(s).is_some_and(|t| t > built))
}

/// `cargo build --example NAME` for this test's profile and features (so
/// it builds what `cargo test` would have, and nothing else).
fn build_example(name: &str) {
    let dir = examples_dir();
    let profile_dir = dir.parent().expect("examples dir has a parent");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(p) => p.to_string(),
        None => panic!("no profile directory in {}", dir.display()),
    };
    let target_dir = profile_dir.parent().expect("profile dir has a parent");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.args([
        "build",
        "-p",
        "ext4kit",
        "--example",
        name,
        "--profile",
        &profile,
        "--target-dir",
    ])
    .arg(target_dir);
    if cfg!(feature = "count-shared") {
        c.args(["--features", "count-shared"]);
    }
    let st = c.status().expect("running cargo build --example");
    assert!(st.success(), "cargo build --example {name} failed");
}

fn lines_with(out: &str, needle: &str) -> usize {
    out.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn walk_prints_the_demo_tree() {
    let out = run("walk", &[]);
    for want in [
        "d 0755",
        " /etc\n",
        "f 0644        5 /etc/hostname",
        "l 0777        8 /etc/name -> hostname",
        "f 0600     8000 /home/user/notes.txt",
        " /lost+found\n",
    ] {
        assert!(out.contains(want), "walk: no {want:?} in\n{out}");
    }
}

#[test]
fn copy_in_copies_and_reads_back() {
    let out = run("copy_in", &[]);
    assert!(
        out.contains("copied 300000 bytes") && out.contains("to /incoming/data.bin (fsync'd)"),
        "{out}"
    );
    assert!(out.contains("read back 300000 bytes: identical"), "{out}");
}

#[test]
fn list_journal_shows_three_commits_then_an_empty_log() {
    let out = run("list_journal", &[]);
    let (open, closed) = out.split_once("== after closing").expect("both listings");
    assert_eq!(lines_with(open, ", committed"), 3, "{out}");
    assert!(open.contains("log ends before journal block"), "{out}");
    assert_eq!(lines_with(closed, "transaction "), 0, "{out}");
    assert!(closed.contains("log empty (cleanly closed)"), "{out}");
}

#[test]
fn build_image_makes_an_image_the_others_use() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("examples");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("built.img");

    let out = run("build_image", &[image.as_os_str()]);
    for want in [
        "label: example",
        "state: clean",
        "/README -> 8000 bytes, 2 links",
        "/home/user owner: 1000:1000",
        "/etc/hostname user.comment: set by the example",
    ] {
        assert!(out.contains(want), "build_image: no {want:?} in\n{out}");
    }
    ext4kit_testkit::e2fsck_clean(&image).unwrap();

    // The argument forms of the other examples, on that image.
    let tree = run("walk", &[image.as_os_str()]);
    for want in [
        "l 0777       16 /README -> usr/share/README",
        "f 0644     8000 /usr/share/README.hardlink",
        "d 0750     1024 /home/user",
    ] {
        assert!(tree.contains(want), "walk: no {want:?} in\n{tree}");
    }
    let host = dir.join("host.txt");
    std::fs::write(&host, b"from the host\n").unwrap();
    let copied = run("copy_in", &[host.as_os_str(), image.as_os_str(), "/etc/motd".as_ref()]);
    assert!(copied.contains("read back 14 bytes: identical"), "{copied}");
    ext4kit_testkit::e2fsck_clean(&image).unwrap();
    let journal = run("list_journal", &[image.as_os_str()]);
    assert!(journal.contains("log empty (cleanly closed)"), "{journal}");
}
