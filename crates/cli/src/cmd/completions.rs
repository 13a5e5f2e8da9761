//! `ext4kit completions SHELL`: a completion script for bash, zsh, fish,
//! elvish or PowerShell on standard output, generated from the same clap
//! definitions that parse the command line, so it can never offer a
//! subcommand or option the binary does not take.
//!
//! Packages install the bash script as
//! `/usr/share/bash-completion/completions/ext4kit` (bash-completion loads
//! it the first time `ext4kit` is completed); a user without the package
//! can `source <(ext4kit completions bash)` from ~/.bashrc.

use std::io::Write;

use clap_complete::Shell;

/// Write `shell`'s completion script for `cmd` (the whole `ext4kit`
/// command) to standard output.
pub fn run(shell: Shell, mut cmd: clap::Command) -> Result<(), String> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ext4kit", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the {shell} completion script: {e}"))
}
