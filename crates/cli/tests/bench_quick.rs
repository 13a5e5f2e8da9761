//! `ext4kit bench --quick`: the whole benchmark suite at small sizes, as a
//! user runs it. Numbers are not asserted (CI machines are shared and
//! noisy); what is: the command succeeds, every workload produced figures
//! on every peer that can run on this machine, every image was e2fsck-clean,
//! the JSON and CSV parse and agree, and the SVG charts exist and hold a
//! real chart.
//!
//! In CI (the `CI` variable set; .ci/run runs as root and installs fuse2fs,
//! fuse3 and fio) every peer must run: a missing one fails the test with the
//! reason. Elsewhere the peers this machine cannot run are only named.
//!
//! `ext4kit bench` runs the suite's own program, ext4kit-bench, which is
//! built on its own (the `ext4kit` binary carries no benchmark
//! instrumentation); the test builds it first, beside the binary under
//! test, with a cargo command of its own as a user does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_ext4kit");

/// Every workload the suite has; a workload added later must be added here
/// (the test checks that the report lists exactly these).
const WORKLOADS: [&str; 14] = [
    "lseek", "storm", "dpath", "dd", "fsync", "create", "lookup", "seq", "fio", "tree", "build", "formats", "pcreate",
    "fsmall",
];

fn has_program(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Which peers should run here, and why the others cannot.
fn expected_peers() -> (Vec<&'static str>, Vec<String>) {
    let root = rustix::process::geteuid().is_root();
    let loopdev = Path::new("/dev/loop-control").exists();
    let fuse = Path::new("/dev/fuse").exists();
    let mut run = vec!["lib"];
    let mut missing = Vec::new();
    if root && loopdev {
        run.extend(["kernel-ext4", "kernel-ext2"]);
    } else {
        missing.push("kernel-ext4/ext2: needs root and /dev/loop-control".to_string());
    }
    if root && fuse {
        run.push("ext4kit-mount");
        if has_program("fuse2fs") {
            run.push("fuse2fs");
        } else {
            missing.push("fuse2fs: not installed".into());
        }
    } else {
        missing.push("ext4kit-mount/fuse2fs: needs root and /dev/fuse".into());
    }
    if !has_program("fio") {
        missing.push("fio: not installed (the fio workload's mount peers)".into());
    }
    (run, missing)
}

/// Split one CSV line (quoted fields may hold commas and doubled quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Build ext4kit-bench, as the bench's help says, into the directory of
/// the `ext4kit` binary under test (same target directory and profile), so
/// the command finds it beside itself and it is never stale.
fn build_bench_program() {
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let profile = match bin_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(p) => p,
        None => panic!("no profile directory above {BIN}"),
    };
    let target_dir = bin_dir.parent().expect("the target directory");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "ext4kit-bench",
            "--bin",
            "ext4kit-bench",
            "--profile",
            profile,
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .status()
        .expect("run cargo build -p ext4kit-bench");
    assert!(status.success(), "cargo build -p ext4kit-bench failed ({status})");
    let program = bin_dir.join("ext4kit-bench");
    assert!(program.is_file(), "{} was not built", program.display());
}

fn workdir() -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-bench-quick-{}", std::process::id()));
    let _ = Command::new("umount").arg("-l").arg(w.join("work/mnt")).output();
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).expect("create the test's work directory");
    w
}

#[test]
fn bench_quick_covers_every_workload_and_peer() {
    let (peers, missing) = expected_peers();
    let ci = std::env::var_os("CI").is_some();
    assert!(
        !ci || missing.is_empty(),
        "in CI every peer must run (.ci/run runs as root and installs fuse2fs, fuse3 and fio); missing: {missing:?}"
    );
    for m in &missing {
        eprintln!("bench_quick: not checked on this machine: {m}");
    }
    build_bench_program();
    let w = workdir();
    let (out, work) = (w.join("out"), w.join("work"));
    let t = Instant::now();
    let o = Command::new(BIN)
        .args(["bench", "--quick", "--no-progress", "--out"])
        .arg(&out)
        .arg("--work")
        .arg(&work)
        .stdin(Stdio::null())
        .output()
        .expect("run ext4kit bench");
    let secs = t.elapsed().as_secs_f64();
    eprintln!("ext4kit bench --quick took {secs:.0} s");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "ext4kit bench --quick failed ({}):\n{stdout}\n{stderr}",
        o.status
    );
    assert!(
        stdout.contains("## lseek") && stdout.contains("## Scaling notes"),
        "no table on stdout:\n{stdout}"
    );

    // JSON.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json"))
            .expect("results.json parses");
    let listed: Vec<&str> = json["workloads"]
        .as_array()
        .expect("workloads")
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(listed, WORKLOADS, "the report's workloads");
    let results = json["results"].as_array().expect("results");
    let ran: Vec<&str> = json["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .filter(|p| p["ran"] == true)
        .filter_map(|p| p["name"].as_str())
        .collect();
    for p in &peers {
        assert!(
            ran.contains(p),
            "peer {p} should run here, the report skipped it: {}",
            json["peers"]
        );
    }
    let fio = has_program("fio");
    let mut repeated = 0;
    for w in json["workloads"].as_array().expect("workloads") {
        let name = w["name"].as_str().expect("name");
        for p in w["peers"].as_array().expect("peers").iter().filter_map(|p| p.as_str()) {
            if !peers.contains(&p) || (name == "fio" && p != "lib" && !fio) {
                continue;
            }
            let rows: Vec<&serde_json::Value> = results
                .iter()
                .filter(|r| {
                    r["workload"] == name
                        && r["peer"]
                            .as_str()
                            .is_some_and(|q| q == p || q.starts_with(&format!("{p}:")))
                })
                .collect();
            assert!(!rows.is_empty(), "workload {name} has no figures for peer {p}");
            for r in rows {
                let med = r["median"].as_f64();
                assert!(med.is_some_and(f64::is_finite), "{name} on {p}: median {r}");
                // Two rounds, or one if the first took over the long-run
                // limit (a very loaded machine).
                let n = r["samples"].as_array().map_or(0, Vec::len);
                assert!((1..=2).contains(&n), "{name} on {p}: {n} rounds: {r}");
                repeated += usize::from(n == 2);
            }
        }
    }
    assert!(repeated > 0, "no figure has two rounds: the rounds are not repeated");
    // The storm's shared-line writes per open are counted: the suite's
    // program builds the library with its count.
    let counted = results.iter().find(|r| {
        r["workload"] == "storm"
            && r["peer"] == "lib"
            && r["metric"]
                .as_str()
                .is_some_and(|m| m.starts_with("shared-line writes per open"))
    });
    assert!(
        counted.is_some_and(|r| r["median"].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0)),
        "the storm's counted shared-line writes per open are missing: {counted:?}"
    );
    assert_eq!(
        json["errors"].as_array().map(Vec::len),
        Some(0),
        "failed rounds: {}",
        json["errors"]
    );
    for f in json["fsck"].as_array().expect("fsck") {
        assert_eq!(f["clean"], f["checked"], "e2fsck verdicts: {f}");
    }

    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    // The mount's bounds: the kernel's request counts behind every mount
    // target, and the server's memory.
    if peers.contains(&"ext4kit-mount") && peers.contains(&"kernel-ext4") {
        let b = &json["mount_bounds"];
        let traced = std::path::Path::new("/sys/kernel/tracing/events/fuse/fuse_request_send").is_dir();
        if !traced {
            assert!(
                !ci,
                "in CI the FUSE tracepoints must exist (kernel ≥ 6.15, tracefs): {b}"
            );
            eprintln!("bench_quick: the mount's request counts not checked: no fuse tracepoints here ({b})");
        } else {
            // A stat of a missing name is exactly one LOOKUP: the probe
            // measures one round trip and nothing else.
            let probe = b["requests_per_round_trip_probe"].as_f64().unwrap_or(0.0);
            assert!((0.99..1.05).contains(&probe), "requests per probe stat: {b}");
            assert!(b["round_trip_us"].as_f64().is_some_and(|v| v > 0.0), "round trip: {b}");
            let targets = b["targets"].as_array().expect("bounds targets");
            let names: Vec<&str> = targets.iter().filter_map(|t| t["target"].as_str()).collect();
            let want = [
                "dd bs=1",
                "fio randwrite 4k",
                "seq write",
                "cold read",
                "untar",
                "rm -rf",
                "creates",
            ];
            let want: Vec<&str> = want.into_iter().filter(|t| fio || *t != "fio randwrite 4k").collect();
            assert_eq!(names, want, "bounds targets");
            for t in targets {
                // Every operation of these is at least one request (a
                // one-byte write is one WRITE: write-through).
                assert!(t["requests_per_op"].as_f64().is_some_and(|v| v >= 0.99), "{t}");
                assert!(t["kernel_us_per_op"].as_f64().is_some_and(|v| v > 0.0), "{t}");
                assert!(t["mount_us_per_op"].as_f64().is_some_and(|v| v > 0.0), "{t}");
                assert!(t["bounded_by"].as_str().is_some_and(|v| !v.is_empty()), "{t}");
            }
            assert!(
                md.contains("## What bounds the mount"),
                "report.md has no bounds section"
            );
        }
        for w in WORKLOADS {
            let mount_rows = results
                .iter()
                .any(|r| r["workload"] == *w && r["peer"] == "ext4kit-mount");
            if mount_rows {
                assert!(
                    results.iter().any(|r| r["workload"] == *w
                        && r["peer"] == "ext4kit-mount"
                        && r["metric"].as_str().is_some_and(|m| m.starts_with("server peak RSS"))
                        && r["median"].as_f64().is_some_and(|v| v > 1.0)),
                    "{w}: no server peak RSS for the mount"
                );
            }
        }
    }

    // CSV: one line per JSON result, every line the header's width.
    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    let mut lines = csv.lines();
    let header = csv_fields(lines.next().expect("CSV header"));
    assert_eq!(header[0], "workload");
    let mut n = 0;
    for l in lines {
        let f = csv_fields(l);
        assert_eq!(f.len(), header.len(), "CSV line {l:?}");
        assert!(WORKLOADS.contains(&f[0].as_str()), "CSV workload {:?}", f[0]);
        f[7].parse::<f64>()
            .unwrap_or_else(|e| panic!("CSV median {:?}: {e}", f[7]));
        n += 1;
    }
    assert_eq!(n, results.len(), "CSV lines vs JSON results");

    // Charts: SVGs with axes, text and data.
    for c in ["create", "fsync", "scaling", "mount"] {
        let p = out.join(format!("{c}.svg"));
        let svg = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(svg.starts_with("<svg"), "{c}.svg is not an SVG");
        assert!(svg.len() > 5_000, "{c}.svg is only {} bytes", svg.len());
        assert!(svg.matches("<text").count() >= 10, "{c}.svg has too little text");
        let marks = svg.matches("<polyline").count() + svg.matches("<rect").count() + svg.matches("<circle").count();
        assert!(marks >= 5, "{c}.svg draws almost nothing ({marks} marks)");
    }
    assert!(md.contains("## Scaling notes"));
    let _ = std::fs::remove_dir_all(&w);
}
