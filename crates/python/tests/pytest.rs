//! The Python suite (`tests/test_*.py`) in the workspace's test command.
//!
//! It runs `python3 -m pytest` on the suite against the extension module
//! this very build made (`deps/lib_ext4kit.so` of this profile, built as the
//! package's library before this test: the crate is an rlib too, so cargo
//! builds it for its integration tests), staged beside a copy of the
//! package's Python half — so `cargo test` always tests the source in the
//! tree, never an older installed wheel. Installing the package is
//! checked apart: `.ci/run` installs it with `pip install ./crates/python`
//! (the README's one command) and imports it.
//!
//! Without python3 or pytest the test fails and says how to install them
//! (`.ci/run` does); so does every Python test whose tool or privilege is
//! missing (they need root for loop mounts, as the Rust suites do).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`: this test binary is `target/<profile>/deps/pytest-HASH`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("the test binary lies in target/<profile>/deps")
}

/// A package directory importable as `ext4kit`: the Python half and the
/// extension module under the name Python looks for.
fn stage(stage: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // deps/: where cargo leaves the library it builds for the tests (the
    // copy in target/<profile>/ is refreshed by `cargo build` only).
    let lib = profile_dir().join("deps/lib_ext4kit.so");
    assert!(
        lib.is_file(),
        "{} is missing: the extension module is built as this package's library (cargo test -p ext4kit-python)",
        lib.display()
    );
    let pkg = stage.join("ext4kit");
    let _ = std::fs::remove_dir_all(stage);
    std::fs::create_dir_all(&pkg).expect("making the staging directory");
    for e in std::fs::read_dir(manifest.join("python/ext4kit")).expect("python/ext4kit") {
        let e = e.expect("listing python/ext4kit");
        if e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(e.path(), pkg.join(e.file_name())).expect("copying the Python half");
        }
    }
    // The abi3 tag is the name maturin gives it in a wheel.
    let dst = pkg.join("_ext4kit.abi3.so");
    if std::fs::hard_link(&lib, &dst).is_err() {
        std::fs::copy(&lib, &dst).expect("copying the extension module");
    }
    stage.to_path_buf()
}

#[test]
fn python_suite() {
    let probe = Command::new("python3").args(["-c", "import pytest"]).output();
    match probe {
        Err(e) => panic!("python3 cannot be run ({e}): install Python 3.11+ (.ci/run expects it)"),
        Ok(o) if !o.status.success() => panic!(
            "pytest is not installed for python3: `python3 -m pip install pytest` (.ci/run installs it)\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(_) => {}
    }
    let dir = stage(&profile_dir().join("python-stage"));
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let out = Command::new("python3")
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "console_output_style=classic",
        ])
        .arg(&tests)
        .env("PYTHONPATH", &dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&tests)
        .output()
        .expect("running python3 -m pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "the Python suite failed (pytest exit {:?}):\n{text}",
        out.status.code()
    );
    // A run that collected nothing is a failure too (pytest exits 5, but
    // check the words as well).
    assert!(text.contains(" passed"), "pytest ran no test:\n{text}");
}
