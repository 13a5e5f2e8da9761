//! The command line as a user meets it: outputs on the sample image, and
//! failures that print one line naming the image, the path and the cause.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sample(dir: &Path) -> PathBuf {
    let gz = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample.img.gz")).unwrap();
    let mut img = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut img).unwrap();
    let p = dir.join("sample.img");
    std::fs::write(&p, img).unwrap();
    p
}

fn ext4kit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ext4kit")).args(args).output().unwrap()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failure: non-zero exit, exactly one line on stderr containing every
/// `needle`, nothing on stdout, and no panic.
fn fails_with(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "should fail: {err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line please: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

#[test]
fn commands_on_the_sample_image() {
    let d = tmp("ok");
    let img = sample(&d);
    let i = img.to_str().unwrap();
    let info = stdout(&ext4kit(&["info", i]));
    for want in [
        "ext4kit-demo",
        "metadata_csum",
        "Block size:",
        "Free blocks:",
        "6b5e1f1a-4d2c-4a8e-9f3b-2c1d0e9f8a7b",
        "clean",
    ] {
        assert!(info.contains(want), "{want} missing from info:\n{info}");
    }
    let ls = stdout(&ext4kit(&["ls", i, "/"]));
    assert_eq!(
        ls.lines().collect::<Vec<_>>(),
        vec!["README.txt", "docs", "lost+found", "many", "src"]
    );
    let lsa = stdout(&ext4kit(&["ls", "-a", i, "/docs"]));
    assert!(lsa.lines().any(|l| l == ".."), "{lsa}");
    let lsl = stdout(&ext4kit(&["ls", "-l", i, "/docs"]));
    assert!(
        lsl.lines()
            .any(|l| l.starts_with("lrwxrwxrwx") && l.ends_with("readme-link -> ../README.txt")),
        "{lsl}"
    );
    assert_eq!(stdout(&ext4kit(&["ls", i, "/many"])).lines().count(), 300);
    let cat = stdout(&ext4kit(&["cat", i, "/docs/readme-link"]));
    assert!(cat.starts_with("Hello from inside an ext4 image!"), "{cat}");
    let st = stdout(&ext4kit(&["stat", i, "/docs/random.bin"]));
    assert!(
        st.contains("Size: 100000") && st.contains("extent tree") && st.contains("physical"),
        "{st}"
    );
    let demo = stdout(&ext4kit(&["demo"]));
    assert!(
        demo.contains("README.txt") && demo.contains("Hello from inside"),
        "{demo}"
    );
    // get of one file into an existing directory keeps its name.
    let out = d.join("out");
    std::fs::create_dir(&out).unwrap();
    stdout(&ext4kit(&["get", i, "/docs/principles.txt", out.to_str().unwrap()]));
    assert!(std::fs::read_to_string(out.join("principles.txt"))
        .unwrap()
        .starts_with("The five principles"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn failures_are_one_clear_line() {
    let d = tmp("err");
    let img = sample(&d);
    let i = img.to_str().unwrap();
    fails_with(&ext4kit(&["cat", i, "/nope"]), &[i, "/nope", "no such file"]);
    fails_with(&ext4kit(&["ls", i, "/README.txt/x"]), &[i, "not a directory"]);
    fails_with(&ext4kit(&["cat", i, "/docs"]), &[i, "/docs", "directory"]);
    fails_with(
        &ext4kit(&["info", "/no/such/image"]),
        &["/no/such/image", "No such file"],
    );
    // Not an ext4 image at all.
    let junk = d.join("junk.img");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    fails_with(
        &ext4kit(&["ls", junk.to_str().unwrap(), "/"]),
        &["junk.img", "superblock", "magic"],
    );
    // A truncated image.
    let bytes = std::fs::read(&img).unwrap();
    let short = d.join("short.img");
    std::fs::write(&short, &bytes[..1500]).unwrap();
    fails_with(
        &ext4kit(&["info", short.to_str().unwrap()]),
        &["short.img", "superblock"],
    );
    // get refuses a non-empty destination and an existing file.
    let full = d.join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    fails_with(
        &ext4kit(&["get", i, "/", full.to_str().unwrap()]),
        &["full", "not empty"],
    );
    fails_with(
        &ext4kit(&["get", i, "/", full.join("x").to_str().unwrap()]),
        &["exists"],
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `ext4kit demo | head -1`: the reader has closed the pipe (here before
/// the command starts, so the outcome does not depend on timing); the
/// command must end as coreutils do (killed by SIGPIPE, nothing on
/// stderr), not panic with "failed printing to stdout".
#[test]
fn a_closed_pipe_ends_a_listing_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .arg("demo")
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "demo panicked on a closed pipe: {err}");
    assert_eq!(
        o.status.signal(),
        Some(13),
        "expected death by SIGPIPE, got {:?}; stderr: {err}",
        o.status
    );
}

/// `rm -r` of a tree holding names that are not UTF-8 (ext4 names are any
/// bytes but '/' and NUL): everything goes, and e2fsck agrees. A lossy
/// conversion of the name once sent the removal to a file that is not
/// there.
#[test]
fn rm_r_removes_names_that_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let d = tmp("rm-bytes");
    let src = d.join("src");
    let odd = src.join(std::ffi::OsStr::from_bytes(b"dir-\xff"));
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::write(odd.join(std::ffi::OsStr::from_bytes(b"file-\xfe\xfd")), b"x").unwrap();
    std::fs::write(src.join(std::ffi::OsStr::from_bytes(b"\xc3")), b"y").unwrap();
    let img = d.join("t.img");
    let (img_s, src_s) = (img.to_str().unwrap(), src.to_str().unwrap());
    stdout(&ext4kit(&["mkfs", "-d", src_s, img_s, "8M"]));
    stdout(&ext4kit(&["mkdir", img_s, "/top"]));
    stdout(&ext4kit(&["put", src_s, &format!("{img_s}:/top/")]));
    stdout(&ext4kit(&["rm", "-r", img_s, "/top"]));
    let ls = stdout(&ext4kit(&["ls", "-a", img_s, "/"]));
    assert!(!ls.contains("top"), "/top survived rm -r: {ls}");
    let fsck = Command::new("e2fsck")
        .args(["-fn", img_s])
        .output()
        .expect("e2fsck (e2fsprogs) is needed");
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let _ = std::fs::remove_dir_all(&d);
}
