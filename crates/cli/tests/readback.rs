//! The compatibility oracle on the read side: every image of the fixture
//! matrix (mke2fs -d over ext2/ext3/ext4 layouts and hash variants) and an
//! image written by the kernel read back through `ext4kit get IMAGE / DEST`
//! exactly as the source tree: names, types, modes, owners (as root),
//! sizes, contents, symlink targets, hard-link identity, xattrs, mtimes.
//!
//! CI uses the small tree (a 2,000-entry big directory; `mke2fs -d` is
//! quadratic in directory size). The full matrix with the 50,000-entry
//! directory is `scripts/check-images.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

use ext4kit_testkit::{
    build_source_tree, compare_trees, image_matrix, is_kernel_unavailable, make_image, make_kernel_image, ImageSpec,
    TreeOpts,
};

fn get(img: &Path, dest: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .arg("get")
        .arg(img)
        .arg("/")
        .arg(dest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ext4kit get {} failed:\n{}",
        img.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn check(spec_name: &str, img: &Path, src: &Path, work: &Path, opts: &ext4kit_testkit::CompareOpts) -> Vec<String> {
    let dest = work.join(format!("out-{spec_name}"));
    let _ = std::fs::remove_dir_all(&dest);
    get(img, &dest);
    let diffs = compare_trees(src, &dest, opts).unwrap();
    let _ = std::fs::remove_dir_all(&dest);
    diffs.iter().map(|d| format!("{spec_name}: {d}")).collect()
}

fn workdir(tag: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-readback-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

#[test]
fn every_matrix_image_reads_back_exactly() {
    let work = workdir("matrix");
    let src = work.join("src");
    let opts = TreeOpts {
        huge_sparse: true,
        ..TreeOpts::small()
    };
    build_source_tree(&src, &opts).unwrap();
    let specs: Vec<ImageSpec> = image_matrix();
    assert!(specs.len() >= 9, "matrix shrank: {}", specs.len());
    // Two at a time: the machines have two cores.
    let mut failures = Vec::new();
    for pair in specs.chunks(2) {
        let results: Vec<Vec<String>> = std::thread::scope(|s| {
            let hs: Vec<_> = pair
                .iter()
                .map(|spec| {
                    let (src, work) = (&src, &work);
                    s.spawn(move || {
                        let img = work.join(format!("{}.img", spec.name));
                        make_image(spec, src, &img).unwrap_or_else(|e| panic!("making {}: {e}", spec.name));
                        let r = check(spec.name, &img, src, work, &spec.compare_opts());
                        let _ = std::fs::remove_file(&img);
                        eprintln!(
                            "{:<24} {}",
                            spec.name,
                            if r.is_empty() { "identical" } else { "DIFFERENT" }
                        );
                        r
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        failures.extend(results.into_iter().flatten());
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn kernel_written_image_reads_back_exactly() {
    let work = workdir("kernel");
    let src = work.join("src");
    build_source_tree(&src, &TreeOpts::small()).unwrap();
    let mut failures = Vec::new();
    for (name, args) in [
        ("kernel-ext4", &["-t", "ext4"][..]),
        ("kernel-ext4-1k", &["-t", "ext4", "-b", "1024"][..]),
        ("kernel-ext3", &["-t", "ext3"][..]),
        ("kernel-ext2", &["-t", "ext2"][..]),
    ] {
        let img = work.join(format!("{name}.img"));
        if let Err(e) = make_kernel_image(&src, &img, args) {
            if let Some(k) = is_kernel_unavailable(&e) {
                panic!(
                    "cannot test kernel-written images here: {} (CI runs as root with loop devices)",
                    k.reason
                );
            }
            panic!("making {name}: {e}");
        }
        let opts = ext4kit_testkit::CompareOpts {
            ignore_lost_found: true,
            ..Default::default()
        };
        let r = check(name, &img, &src, &work, &opts);
        eprintln!("{name:<24} {}", if r.is_empty() { "identical" } else { "DIFFERENT" });
        failures.extend(r);
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
