//! `ext4kit bench`: runs the benchmark suite, `ext4kit-bench`, a program
//! built on its own.
//!
//! The suite measures shared-line writes with the library's
//! `count-shared` instrumentation and drives loop mounts through the test
//! kit; linked into this binary, both would ship to every user (Cargo
//! unifies features: the mount server would count writes on its hot
//! paths). So this binary carries none of it: the command finds the
//! suite's program beside this executable (or on PATH) and hands it the
//! arguments and this binary's path, whose mount the suite measures.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The suite's program.
const PROGRAM: &str = "ext4kit-bench";

/// How to build the suite's program: in a cargo command of its own (in
/// one command with ext4kit-cli, cargo would compile the counting into
/// the `ext4kit` binary too).
const BUILD: &str = "cargo build --release -p ext4kit-bench (a cargo command of its own: \
                         built in one command with ext4kit-cli, the ext4kit binary would count too)";

/// Arguments of `ext4kit bench`: everything goes to the suite's program
/// (`--help` included, which lists the workloads and peers).
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct Args {
    /// The benchmark's options (`ext4kit bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Where the suite's program is: beside this executable (both built into
/// one target directory, or installed into one bin directory), else on
/// PATH.
fn find_program(exe: &std::path::Path) -> Option<PathBuf> {
    let beside = exe.parent().map(|d| d.join(PROGRAM)).filter(|p| p.is_file());
    beside.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(PROGRAM))
                .find(|p| p.is_file())
        })
    })
}

/// Replace this process with the suite's program; returns only on error.
/// `cache_mib` is the global `--cache-mib` when the user gave it.
pub fn run(a: &Args, cache_mib: Option<usize>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("where is this ext4kit binary: {e}"))?;
    let program = find_program(&exe).ok_or_else(|| {
        format!(
            "bench: {PROGRAM} not found beside {} nor on PATH. The benchmark suite is a program \
             of its own, so this binary carries no benchmark instrumentation; build it with: {BUILD}",
            exe.display()
        )
    })?;
    if ext4kit::vfs::shared::count().is_some() {
        eprintln!(
            "ext4kit: warning: this ext4kit binary was built with the library's count-shared \
             feature (cargo built it in one command with ext4kit-bench or the tests), so its \
             mount's figures include the counting; for the binary users run: cargo build \
             --release -p ext4kit-cli"
        );
    }
    let mut cmd = std::process::Command::new(&program);
    cmd.arg("--ext4kit").arg(&exe);
    if let Some(mib) = cache_mib {
        cmd.arg("--cache-mib").arg(mib.to_string());
    }
    let err = cmd.args(&a.args).exec();
    Err(format!("bench: {}: {err}", program.display()))
}
