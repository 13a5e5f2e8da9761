//! Labels and Android metadata at build time: `mkfs -d --file-contexts`
//! gives every file the `security.selinux` label libselinux's
//! `matchpathcon -f` gives its path and type (exact paths before regular
//! expressions, the last matching line winning, type fields, `<<none>>`),
//! read back through the kernel; `--fs-config` sets owners, modes and
//! file capabilities of the paths it lists.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod building;
use building::{mkfs_and_mount, need_kernel, need_tool, run, s};

fn workdir(tag: &str) -> PathBuf {
    building::workdir("buildlabels", tag)
}

const FILE_CONTEXTS: &str = r#"
# An exact path early in the file still beats every regex after it.
/usr/bin/su          --   system_u:object_r:su_exec_t:s0
/.*                       system_u:object_r:default_t:s0
/usr(/.*)?                system_u:object_r:usr_t:s0
/usr/bin(/.*)?            system_u:object_r:bin_t:s0
/usr/bin             -d   system_u:object_r:bin_dir_t:s0
/usr/lib(64)?/.*\.so(\.[^/]*)*   --   system_u:object_r:lib_t:s0
/usr/lib(64)?/[^/]*\.conf    system_u:object_r:etc_t:s0
/usr/share/.*        -l   system_u:object_r:share_link_t:s0
/dev/null            -c   system_u:object_r:null_device_t:s0
/dev/.*              -c   system_u:object_r:device_t:s0
/run/[a-z]+          -p   system_u:object_r:fifo_t:s0
/tmp(/.*)?                <<none>>
/etc/(passwd|group|shadow)   --   system_u:object_r:passwd_file_t:s0
/etc/skel/\..*            system_u:object_r:skel_t:s0
/usr/local/.*             system_u:object_r:local_t:s0
/usr/local/bin/.*    --   system_u:object_r:local_bin_t:s0
"#;

fn make_tree(src: &Path) {
    for d in [
        "usr/bin",
        "usr/lib",
        "usr/lib64",
        "usr/share/doc",
        "usr/local/bin",
        "etc/skel",
        "dev",
        "run",
        "tmp/sub",
    ] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "usr/bin/su",
        "usr/bin/ls",
        "usr/lib/libc.so.6",
        "usr/lib64/libm.so",
        "usr/lib/x.conf",
        "usr/lib/sub.d/y.conf",
        "usr/lib/notalib.sox",
        "etc/passwd",
        "etc/group",
        "etc/hosts",
        "etc/skel/.bashrc",
        "usr/local/bin/tool",
        "usr/local/README",
        "tmp/sub/scratch",
    ] {
        let p = src.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, f).unwrap();
    }
    std::os::unix::fs::symlink("../../bin/ls", src.join("usr/share/doc/link")).unwrap();
    std::os::unix::fs::symlink("ls", src.join("usr/bin/dir")).unwrap();
    run(Command::new("mknod").args([s(&src.join("dev/null")), "c", "1", "3"]));
    run(Command::new("mknod").args([s(&src.join("dev/zero")), "c", "1", "5"]));
    run(Command::new("mknod").args([s(&src.join("dev/loop0")), "b", "7", "0"]));
    run(Command::new("mkfifo").arg(src.join("run/initctl")));
}

/// Every path below `root`, relative, with the `-m` type matchpathcon
/// takes for it.
fn walk(root: &Path) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let rel = format!("/{}", p.strip_prefix(root).unwrap().display());
        let ft = md.file_type();
        use std::os::unix::fs::FileTypeExt;
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "lnk_file"
        } else if ft.is_char_device() {
            "chr_file"
        } else if ft.is_block_device() {
            "blk_file"
        } else if ft.is_fifo() {
            // matchpathcon's -m goes by the first letter: "fifo_file"
            // reads as a regular file ('f'); "pipe" is a fifo ('p'). A real
            // fifo on the host, looked up without -m, gets the -p line
            // as here.
            "pipe"
        } else if ft.is_socket() {
            "sock_file"
        } else {
            "file"
        };
        if rel != "/lost+found" {
            out.push((rel, kind));
        }
        if ft.is_dir() && !p.ends_with("lost+found") {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out.sort();
    out
}

fn label_of(p: &Path) -> Option<String> {
    let mut buf = vec![0u8; 512];
    match rustix::fs::lgetxattr(p, "security.selinux", &mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).trim_end_matches('\0').to_string()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("{}: {e}", p.display()),
    }
}

#[test]
fn file_contexts_labels_are_what_matchpathcon_says() {
    need_kernel();
    need_tool("matchpathcon", "selinux-utils");
    let work = workdir("fc");
    let src = work.join("src");
    make_tree(&src);
    let fc = work.join("file_contexts");
    std::fs::write(&fc, FILE_CONTEXTS).unwrap();
    let img = work.join("out.img");
    let m = mkfs_and_mount(
        &work,
        &["-q", "-d", s(&src), "--file-contexts", s(&fc), s(&img), "32M"],
        &img,
    );
    let paths = walk(m.path());
    assert!(paths.len() > 30, "{paths:?}");
    let mut wrong = Vec::new();
    for (rel, kind) in &paths {
        let out = Command::new("matchpathcon")
            .args(["-f", s(&fc), "-m", kind, rel])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        let want = said
            .split('\t')
            .nth(1)
            .map(|l| l.trim().to_string())
            .filter(|l| out.status.success() && l != "<<none>>");
        let got = label_of(&m.path().join(rel.trim_start_matches('/')));
        if got != want {
            wrong.push(format!("{rel} ({kind}): image {got:?}, matchpathcon {want:?}"));
        }
    }
    m.unmount().unwrap();
    assert!(
        wrong.is_empty(),
        "labels differ from matchpathcon's:\n{}",
        wrong.join("\n")
    );
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn fs_config_sets_owners_modes_and_capabilities() {
    need_kernel();
    let work = workdir("fsconfig");
    let src = work.join("src");
    std::fs::create_dir_all(src.join("system/bin")).unwrap();
    std::fs::write(src.join("system/bin/ping"), b"ping").unwrap();
    std::fs::write(src.join("system/bin/sh"), b"sh").unwrap();
    let conf = work.join("fs_config");
    std::fs::write(
        &conf,
        "system 0 0 0755\nsystem/bin 0 2000 0751\nsystem/bin/ping 0 2000 0750 capabilities=0x2000\n",
    )
    .unwrap();
    let img = work.join("out.img");
    let args = [
        "-q",
        "-d",
        s(&src),
        "--uid-map",
        "1000:0:1",
        "--gid-map",
        "1000:0:1",
        "--fs-config",
        s(&conf),
        s(&img),
        "32M",
    ];
    let m = mkfs_and_mount(&work, &args, &img);
    let st = |p: &str| std::fs::symlink_metadata(m.path().join(p)).unwrap();
    assert_eq!(
        (
            st("system/bin").uid(),
            st("system/bin").gid(),
            st("system/bin").mode() & 0o7777
        ),
        (0, 2000, 0o751)
    );
    let ping = st("system/bin/ping");
    assert_eq!((ping.uid(), ping.gid(), ping.mode() & 0o7777), (0, 2000, 0o750));
    let out = run(Command::new("getfattr").args([
        "-n",
        "security.capability",
        "-e",
        "hex",
        s(&m.path().join("system/bin/ping")),
    ]));
    assert!(out.contains("0x0100000200200000000000000000000000000000"), "{out}");
    // A path the file does not list keeps the owner rule's owner.
    let sh = st("system/bin/sh");
    assert_eq!((sh.uid(), sh.gid()), (1000, 1000));
    m.unmount().unwrap();
    std::fs::remove_dir_all(&work).unwrap();
}
