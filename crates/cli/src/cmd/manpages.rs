//! `ext4kit manpages DIR` (hidden; for packagers): one man page per
//! command, generated from the clap definitions and their long help
//! texts — `ext4kit.1` for the whole command and `ext4kit-SUB.1` for each
//! visible subcommand, the git-style names that `man ext4kit-put` finds.
//!
//! The pages are written as plain roff (section 1); a package gzips them
//! into /usr/share/man/man1.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args as _;

use clap_mangen::roff::{roman, Roff};
use clap_mangen::Man;

/// The `source` field of every page's title line (the package and its
/// version, as man-pages(7) asks for section 1).
const SOURCE: &str = concat!("ext4kit ", env!("CARGO_PKG_VERSION"));

/// The subcommand's name.
pub const NAME: &str = "manpages";

/// Arguments of `ext4kit manpages`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory to write the pages into (made if missing).
    pub dir: PathBuf,
}

/// The hidden `manpages` subcommand, which main adds to the parser
/// only: it is not part of the `Cli` definition that the completion
/// scripts and the pages are generated from, so neither offers a
/// packager's tool to users (clap_complete lists hidden subcommands too).
pub fn command() -> clap::Command {
    Args::augment_args(
        clap::Command::new(NAME)
            .hide(true)
            .about("Write the man pages (ext4kit.1 and ext4kit-COMMAND.1 for each command) into DIR, for packagers."),
    )
}

/// Write the pages for `cmd` (the whole `ext4kit` command) and its visible
/// subcommands into `dir`, creating it if missing. A page that cannot be
/// written is an error naming its path.
pub fn run(dir: &Path, cmd: clap::Command) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The help subcommand is the pages themselves. Building fills in each
    // subcommand's display name (ext4kit-put) and usage name (ext4kit put)
    // and copies the global options into it.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    write_pages(dir, &cmd, None)
}

/// Write `cmd`'s page and, recursively, its visible subcommands' pages.
fn write_pages(dir: &Path, cmd: &clap::Command, parent: Option<&str>) -> Result<(), String> {
    let name = page_name(cmd);
    let children: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    render(&mut page, cmd, parent, &children)
        .and_then(|()| std::fs::write(&path, &page))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for sub in children {
        write_pages(dir, sub, Some(&name))?;
    }
    Ok(())
}

/// The page's name: `ext4kit` or `ext4kit-SUB` (clap's display name).
fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string()
}

/// One page: clap_mangen's sections, with the after-help text split into
/// sections of its own and a SEE ALSO section added.
fn render(
    w: &mut dyn Write,
    cmd: &clap::Command,
    parent: Option<&str>,
    children: &[&clap::Command],
) -> std::io::Result<()> {
    let man = Man::new(cmd.clone()).source(SOURCE).manual("ext4kit Manual");
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if !children.is_empty() {
        man.render_subcommands_section(w)?;
    }
    let mut roff = Roff::new();
    if let Some(text) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        after_help_sections(&mut roff, &text.to_string());
    }
    see_also(&mut roff, parent, children);
    roff.to_writer(w)?;
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// The after-help text (`--help`'s closing part) as man sections: each
/// unindented line ending in ":" ("EXAMPLES:", "JOURNAL:") starts a
/// section of that name, and the lines under it keep their layout
/// (no-fill mode), as the examples' aligned columns need. Text before any
/// such heading goes under NOTES.
fn after_help_sections(roff: &mut Roff, text: &str) {
    let mut open = false;
    for line in text.lines() {
        let heading = line
            .strip_suffix(':')
            .filter(|h| !h.starts_with(char::is_whitespace) && !h.is_empty());
        if let Some(h) = heading {
            if open {
                roff.control("fi", []);
            }
            roff.control("SH", [minus(h).as_str()]).control("nf", []);
            open = true;
            continue;
        }
        if !open {
            roff.control("SH", ["NOTES"]).control("nf", []);
            open = true;
        }
        roff.text([roman(line)]);
    }
    if open {
        roff.control("fi", []);
    }
}

/// A SEE ALSO section: a subcommand's page points back to its parent's,
/// the parent's to every subcommand's (so `man ext4kit` leads to all).
fn see_also(roff: &mut Roff, parent: Option<&str>, children: &[&clap::Command]) {
    let mut refs: Vec<String> = parent.map(str::to_string).into_iter().collect();
    refs.extend(children.iter().map(|c| page_name(c)));
    if refs.is_empty() {
        return;
    }
    roff.control("SH", ["SEE ALSO"]);
    let last = refs.len() - 1;
    for (i, r) in refs.iter().enumerate() {
        let sep = if i == last { "" } else { "," };
        roff.control("BR", [minus(r).as_str(), &format!("(1){sep}")]);
    }
}

/// `s` with each "-" written as roff's minus sign (\-): a bare "-" in a
/// control line's argument is typeset as a hyphen (U+2010 in a UTF-8
/// terminal), and a command name copied from the page must still run.
fn minus(s: &str) -> String {
    s.replace('-', "\\-")
}
