//! README.md's "Readers" table is generated from `readers::TABLE`, the
//! one statement of which reader supports which feature: this test fails
//! when the two differ. `EXT4KIT_WRITE_README=1 cargo test -p
//! ext4kit-format --test readers_readme` writes the table into README.md.

use ext4kit_format::readers::markdown_table;

const START: &str = "<!-- readers-table: generated from crates/format/src/readers.rs TABLE -->\n";
const END: &str = "<!-- readers-table end -->";

#[test]
fn readme_readers_table_is_the_code_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md at the repository's root");
    let start = readme
        .find(START)
        .unwrap_or_else(|| panic!("README.md has no line {START:?} opening the readers table"))
        + START.len();
    let end = start
        + readme[start..]
            .find(END)
            .unwrap_or_else(|| panic!("README.md has no line {END:?} closing the readers table"));
    let want = markdown_table();
    if std::env::var_os("EXT4KIT_WRITE_README").is_some() {
        let new = format!("{}{want}{}", &readme[..start], &readme[end..]);
        std::fs::write(path, new).unwrap();
        return;
    }
    assert!(
        readme[start..end] == want,
        "README.md's readers table differs from readers::TABLE; regenerate it with \
         EXT4KIT_WRITE_README=1 cargo test -p ext4kit-format --test readers_readme. The table is:\n{want}"
    );
}
