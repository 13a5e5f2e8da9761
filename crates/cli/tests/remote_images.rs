//! Images at URLs: a qcow2 holding a GPT disk whose partition holds ext4,
//! served by a real nginx (plain HTTP range requests) and a real
//! S3-compatible server (moto's, from PyPI), read through the URL by every
//! layer (remote object → qcow2 → GPT → ext4): `get` gives the tree it
//! gives from the local file, `info` shows the stack, the mount serves it
//! read-only, and a command that writes is refused by name. Presigned
//! URLs (the credential in the query string) read the same way.
//!
//! Needs nginx (nginx-light), moto (`pip install 'moto[server]'`),
//! qemu-img, sgdisk, root and /dev/fuse; .ci/run installs them. A server
//! that cannot start fails the test and says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ext4kit_testkit::servers::{Moto, Nginx};
use ext4kit_testkit::{build_source_tree, compare_trees, CompareOpts, TreeOpts};

mod building;
use building::{expect_ok as ok, ext4kit_env as ext4kit, need_tool};

fn run(what: &str, c: &mut Command) {
    let o = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    ok(what, o);
}

/// A qcow2 of a GPT disk whose partition 1 holds an ext4 made by
/// mke2fs -d, and that filesystem's tree as `get` gives it from the file.
fn disk(dir: &Path) -> (PathBuf, PathBuf) {
    need_tool("qemu-img", "qemu-utils");
    need_tool("sgdisk", "gdisk");
    let src = dir.join("src");
    build_source_tree(
        &src,
        &TreeOpts {
            big_dir_entries: 2000,
            huge_sparse: false,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = dir.join("fs.img");
    run(
        "mke2fs -d",
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-d"])
            .arg(&src)
            .arg(&fs)
            .arg("64M"),
    );
    let raw = dir.join("disk.raw");
    std::fs::File::create(&raw).unwrap().set_len(80 << 20).unwrap();
    run(
        "sgdisk",
        Command::new("sgdisk").args(["-n1:2048:+64M", "-t1:8300"]).arg(&raw),
    );
    run(
        "dd",
        Command::new("dd")
            .arg(format!("if={}", fs.display()))
            .arg(format!("of={}", raw.display()))
            .args(["bs=1M", "seek=1", "conv=notrunc,sparse", "status=none"]),
    );
    let q = dir.join("disk.qcow2");
    run(
        "qemu-img convert",
        Command::new("qemu-img")
            .args(["convert", "-O", "qcow2"])
            .arg(&raw)
            .arg(&q),
    );
    let tree = dir.join("tree-local");
    ok("get of the local qcow2", ext4kit(&[&"get", &q, &"/", &tree], &[]));
    (q, tree)
}

fn workdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ext4kit-remote-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `get` through `url` is the local tree; `info` names every layer.
fn check_url(url: &str, env: &[(&str, String)], local_tree: &Path, dir: &Path, tag: &str) {
    let info = ok(&format!("info {url}"), ext4kit(&[&"info", &url], env));
    assert!(info.starts_with("Container:        qcow2"), "{info}");
    assert!(
        info.contains("using partition 1") || info.contains("Partition"),
        "{info}"
    );
    let out = dir.join(format!("tree-{tag}"));
    ok(&format!("get {url}"), ext4kit(&[&"get", &url, &"/", &out], env));
    let d = compare_trees(local_tree, &out, &CompareOpts::default()).unwrap();
    assert!(d.is_empty(), "{tag}: {:?}", &d[..d.len().min(5)]);
    let refused = ext4kit(&[&"mkdir", &url, &"/nope"], env);
    assert!(!refused.status.success(), "mkdir on a URL succeeded");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("read-only"), "{why}");
}

#[test]
fn a_qcow2_gpt_disk_over_http_reads_as_the_local_file() {
    let dir = workdir("http");
    let (q, tree) = disk(&dir);
    let nginx = Nginx::start();
    nginx.put("disk.qcow2", &std::fs::read(&q).unwrap());
    let url = nginx.url("/disk.qcow2");
    check_url(&url, &[], &tree, &dir, "http");
    // The mount serves it read-only; -o rw is refused by name.
    ext4kit_testkit::require_root_and_fuse("the read-only mount of a remote image");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let rw = ext4kit(&[&"mount", &"-o", &"rw", &url, &mnt], &[]);
    assert!(!rw.status.success());
    assert!(String::from_utf8_lossy(&rw.stderr).contains("read-only"), "{rw:?}");
    ok("mount URL", ext4kit(&[&"mount", &url, &mnt], &[]));
    let copy = dir.join("tree-mount");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", mnt.display()))
        .arg(&copy)
        .output();
    let write = std::fs::write(mnt.join("nope"), b"x");
    ok("umount", ext4kit(&[&"umount", &mnt], &[]));
    ok("cp -a from the mount", cp.unwrap());
    assert!(write.is_err(), "a write to the read-only mount of a URL succeeded");
    let d = compare_trees(&tree, &copy, &CompareOpts::default()).unwrap();
    assert!(d.is_empty(), "mount: {:?}", &d[..d.len().min(5)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_qcow2_gpt_disk_in_s3_reads_as_the_local_file() {
    let dir = workdir("s3");
    let (q, tree) = disk(&dir);
    let moto = Moto::start();
    moto.create_bucket("images");
    moto.put_object("images", "vm/disk.qcow2", &std::fs::read(&q).unwrap());
    // The standard AWS variables, for the child process only.
    let env = [
        ("AWS_ENDPOINT_URL", moto.endpoint()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    check_url("s3://images/vm/disk.qcow2", &env, &tree, &dir, "s3");
    // The same from the AWS shared files' named profile (what `aws s3 ls`
    // reads) instead of the variables; only the plain-HTTP switch, which
    // has no key in those files, stays in the environment.
    let config = dir.join("aws-config");
    let credentials = dir.join("aws-credentials");
    std::fs::write(
        &config,
        format!(
            "[profile lab]\nregion = us-east-1\nendpoint_url = {}\n",
            moto.endpoint()
        ),
    )
    .unwrap();
    std::fs::write(
        &credentials,
        "[lab]\naws_access_key_id = testing\naws_secret_access_key = testing\n",
    )
    .unwrap();
    let profile_env = [
        ("AWS_PROFILE", "lab".to_string()),
        ("AWS_CONFIG_FILE", config.display().to_string()),
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.display().to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    let listed = ok(
        "ls through a profile",
        ext4kit(&[&"ls", &"s3://images/vm/disk.qcow2", &"/"], &profile_env),
    );
    assert!(listed.contains("lost+found"), "{listed}");
    let missing = ext4kit(&[&"ls", &"s3://images/vm/none.qcow2", &"/"], &env);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("none.qcow2"),
        "{missing:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn presigned_urls_read_as_the_local_file() {
    let dir = workdir("presigned");
    let (q, tree) = disk(&dir);
    let bytes = std::fs::read(&q).unwrap();
    // nginx's /signed/ answers only a GET carrying the signature argument.
    let nginx = Nginx::start();
    nginx.put("disk.qcow2", &bytes);
    let signed = nginx.url(&format!(
        "/signed/disk.qcow2?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=600&X-Amz-Signature={}",
        Nginx::SIGNATURE
    ));
    check_url(&signed, &[], &tree, &dir, "signed-http");
    let unsigned = ext4kit(&[&"ls", &nginx.url("/signed/disk.qcow2?X-Amz-Signature=0"), &"/"], &[]);
    assert!(!unsigned.status.success());
    let why = String::from_utf8_lossy(&unsigned.stderr);
    assert!(why.contains("403") && why.contains("/signed/disk.qcow2"), "{why}");
    // A real S3 presigned URL (boto3's, as `aws s3 presign` makes it),
    // read with no AWS variables at all.
    let moto = Moto::start();
    moto.create_bucket("images");
    moto.put_object("images", "vm/disk.qcow2", &bytes);
    let presigned = moto.presigned_url("images", "vm/disk.qcow2");
    assert!(presigned.contains("X-Amz-Signature="), "{presigned}");
    check_url(&presigned, &[], &tree, &dir, "presigned-s3");
    let _ = std::fs::remove_dir_all(&dir);
}
