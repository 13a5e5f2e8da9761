//! LVM2 volumes made by the real LVM tools (Debian's lvm2), for the tests
//! that read and write them through ext4kit.
//!
//! A [`Lab`] is a disk image file attached with `losetup -P`, whose
//! partitions the test makes PVs, a VG and LVs on with the real tools.
//! The host's kernel is not asked to activate anything (this build
//! machine's has no device-mapper), so LVM runs with `global/activation
//! = 0`: [`Layout`] is LVM's own report of where an LV's extents are
//! (`lvs -o seg_pe_ranges`, `pvs -o pe_start`), and data is placed and
//! read there by dm-linear's and dm-stripe's rules. The real activation
//! happens in a VM ([`Lab::boot_vm`]): Debian's kernel with
//! device-mapper gets the detached disk image as `/dev/vda`, and a
//! script there runs `vgchange -ay`, e2fsck and mounts on `/dev/VG/LV`.
//! Every LVM command sees only the lab's loop partitions (a `devices`
//! filter, no devices file) and keeps no backup; the VG name is unique;
//! dropping the lab undoes everything, also when the test fails.

#![allow(missing_docs)]

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::vm::{self, VmRequest, VmRun};

pub fn require_environment() {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.ok().as_deref() != Some("0") {
        panic!("lvm_real needs root (pvcreate, losetup); CI runs it as root");
    }
    for tool in ["lvm", "losetup", "partx", "sgdisk", "mkfs.ext4", "e2fsck"] {
        let found = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .chain(["/sbin".into(), "/usr/sbin".into()])
            .any(|d| d.join(tool).exists());
        if !found {
            panic!("lvm_real needs {tool} (Debian packages lvm2, gdisk, util-linux, e2fsprogs)");
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        panic!("lvm_real needs loop devices (/dev/loop-control is missing)");
    }
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd} {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// lvm.conf in the VM: only the virtio disk's partitions, no udev (the
/// VM runs none: libdevmapper makes the /dev/mapper nodes and /dev/VG
/// links itself), no dmeventd, no backups.
pub const VM_LVM_CONF: &str = r#"devices {
    filter = [ "a|^/dev/vd[a-z][0-9]+$|", "r|.*|" ]
    use_devicesfile = 0
    obtain_device_list_from_udev = 0
}
activation {
    udev_sync = 0
    udev_rules = 0
    monitoring = 0
}
backup {
    backup = 0
    archive = 0
}
"#;

/// `lvcreate` options for an LV that is not activated (and so neither
/// zeroed nor wiped) on the host.
pub const CREATE_INACTIVE: [&str; 4] = ["-an", "-Zn", "-Wn", "-y"];

/// The disk image, its loop device, its VG; all undone on drop.
pub struct Lab {
    pub dir: PathBuf,
    pub image: PathBuf,
    pub vg: String,
    pub loopdev: Option<String>,
}

impl Lab {
    /// `tag` tells apart the tests of one process (they run at once).
    pub fn new(tag: &str) -> Lab {
        require_environment();
        let dir = std::env::temp_dir().join(format!("ext4kit-lvm-real-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("disk.img");
        Lab {
            image,
            dir,
            vg: format!("ext4kit_test_{}_{tag}", std::process::id()),
            loopdev: None,
        }
    }

    pub fn attach(&mut self) {
        let img = self.image.to_str().unwrap().to_string();
        let dev = run("losetup", &["-P", "-f", "--show", &img]).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        self.loopdev = Some(dev);
        // A kernel without partition parsers scans nothing at -P; partx
        // adds the partitions through BLKPG.
        let wait = |p: &str, limit: Duration| {
            let t = Instant::now();
            while !Path::new(p).exists() {
                if t.elapsed() > limit {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        };
        let (p1, p2) = (self.part(1), self.part(2));
        if !wait(&p1, Duration::from_millis(500)) || !wait(&p2, Duration::from_millis(100)) {
            let _ = run("partx", &["-a", self.loopdev.as_deref().unwrap()]);
            assert!(
                wait(&p1, Duration::from_secs(10)) && wait(&p2, Duration::from_secs(10)),
                "{p1} or {p2} did not appear"
            );
        }
    }

    pub fn detach(&mut self) {
        if let Some(dev) = self.loopdev.take() {
            let _ = Command::new("partx").args(["-d", &dev]).output();
            run("losetup", &["-d", &dev]);
        }
    }

    pub fn part(&self, n: u32) -> String {
        format!("{}p{n}", self.loopdev.as_deref().expect("attached"))
    }

    /// The `--config` every LVM command gets: only our partitions, no
    /// devices file, no backups, no activation.
    pub fn config(&self) -> String {
        let dev = self.loopdev.as_deref().expect("attached");
        format!(
            "devices {{ filter = [ \"a|^{dev}p[12]$|\", \"r|.*|\" ] use_devicesfile = 0 }} \
             backup {{ backup = 0 archive = 0 }} \
             activation {{ udev_sync = 0 udev_rules = 0 }} \
             global {{ activation = 0 }}"
        )
    }

    /// Detaches the disk image and boots the VM (ext4kit_testkit::vm)
    /// with it as `/dev/vda`, then `extra_disks` as `/dev/vdb`, ...;
    /// `script` runs there with lvm (lvm.conf [`VM_LVM_CONF`]), e2fsck,
    /// getfattr, setfattr and device-mapper. Panics with the VM's error
    /// (what to install, or its console).
    pub fn boot_vm(&mut self, extra_disks: &[&Path], script: &str) -> VmRun {
        self.detach();
        let mut disks = vec![self.image.as_path()];
        disks.extend_from_slice(extra_disks);
        let run = vm::boot(&VmRequest {
            work_dir: &self.dir,
            disks: &disks,
            programs: &["lvm", "e2fsck", "getfattr", "setfattr"],
            modules: &["dm_mod"],
            files: &[("etc/lvm/lvm.conf", VM_LVM_CONF)],
            script,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "VM boot and script: {:.1} s ({:?})",
            run.elapsed().as_secs_f64(),
            run.accel()
        );
        assert_eq!(run.status(), 0, "the VM script failed:\n{}", run.output());
        run
    }

    pub fn lvm(&self, args: &[&str]) -> String {
        let cfg = self.config();
        let mut a = vec![args[0], "--config", &cfg];
        a.extend_from_slice(&args[1..]);
        run("lvm", &a)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.loopdev.is_some() {
            let cfg = self.config();
            let lvm = |args: &[&str]| {
                let _ = Command::new("lvm")
                    .arg(args[0])
                    .arg("--config")
                    .arg(&cfg)
                    .args(&args[1..])
                    .env("LVM_SUPPRESS_FD_WARNINGS", "1")
                    .output();
            };
            lvm(&["vgremove", "-ff", "-y", &self.vg]);
            self.detach();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One segment of an LV as `lvs` reports it.
#[derive(Debug)]
pub struct Seg {
    pub start: u64,
    pub size: u64,
    pub stripe_size: u64,
    /// (partition number, first extent) per stripe.
    pub ranges: Vec<(u32, u64)>,
}

/// LVM's own account of where an LV is: extent size, each PV's pe_start
/// (by partition number) and the LV's segments.
pub struct Layout {
    pub extent: u64,
    pub pe_start: [u64; 3],
    pub segs: Vec<Seg>,
}

impl Layout {
    pub fn of(lab: &Lab, lv: &str) -> Layout {
        let extent: u64 = lab
            .lvm(&[
                "vgs",
                "--noheadings",
                "--nosuffix",
                "--units",
                "b",
                "-o",
                "vg_extent_size",
                &lab.vg,
            ])
            .trim()
            .parse()
            .unwrap();
        let mut pe_start = [0u64; 3];
        for line in lab
            .lvm(&[
                "pvs",
                "--noheadings",
                "--nosuffix",
                "--units",
                "b",
                "--separator",
                ";",
                "-o",
                "pv_name,pe_start",
            ])
            .lines()
        {
            let (name, start) = line.trim().split_once(';').unwrap();
            let n = if name == lab.part(1) {
                1
            } else if name == lab.part(2) {
                2
            } else {
                panic!("pvs listed {name}")
            };
            pe_start[n] = start.parse().unwrap();
        }
        let full = format!("{}/{lv}", lab.vg);
        let out = lab.lvm(&[
            "lvs",
            "--noheadings",
            "--nosuffix",
            "--units",
            "b",
            "--separator",
            ";",
            "-o",
            "seg_start,seg_size,stripe_size,seg_pe_ranges",
            &full,
        ]);
        let mut segs = Vec::new();
        for line in out.lines() {
            let f: Vec<&str> = line.trim().split(';').collect();
            let ranges = f[3]
                .split_whitespace()
                .map(|r| {
                    let (dev, pes) = r.rsplit_once(':').unwrap();
                    let n = if dev == lab.part(1) { 1 } else { 2 };
                    (n, pes.split('-').next().unwrap().parse().unwrap())
                })
                .collect();
            segs.push(Seg {
                start: f[0].parse().unwrap(),
                size: f[1].parse().unwrap(),
                stripe_size: f[2].parse().unwrap(),
                ranges,
            });
        }
        Layout { extent, pe_start, segs }
    }

    /// Each piece of the LV: (LV offset, partition, byte in the partition,
    /// length), by dm-linear's and dm-stripe's rules.
    pub fn pieces(&self) -> Vec<(u64, u32, u64, u64)> {
        let mut out = Vec::new();
        for s in &self.segs {
            let n = s.ranges.len() as u64;
            let chunk = if n == 1 { s.size } else { s.stripe_size };
            for k in 0..s.size / chunk {
                let (part, pe) = s.ranges[(k % n) as usize];
                let at = self.pe_start[part as usize] + pe * self.extent + (k / n) * chunk;
                out.push((s.start + k * chunk, part, at, chunk));
            }
        }
        out
    }

    pub fn put(&self, lab: &Lab, data: &[u8]) {
        let files: Vec<_> = (1..=2)
            .map(|n| OpenOptions::new().write(true).open(lab.part(n)).unwrap())
            .collect();
        for (off, part, at, len) in self.pieces() {
            files[part as usize - 1]
                .write_all_at(&data[off as usize..(off + len) as usize], at)
                .unwrap();
        }
        for f in files {
            f.sync_all().unwrap();
        }
    }

    pub fn get(&self, lab: &Lab, size: u64) -> Vec<u8> {
        let files: Vec<_> = (1..=2).map(|n| std::fs::File::open(lab.part(n)).unwrap()).collect();
        let mut data = vec![0u8; size as usize];
        for (off, part, at, len) in self.pieces() {
            files[part as usize - 1]
                .read_exact_at(&mut data[off as usize..(off + len) as usize], at)
                .unwrap();
        }
        data
    }
}

/// An ext4 of `fs_size` bytes made by mkfs.ext4 -d, padded with a pattern
/// to `lv_size`: the LV's expected bytes.
pub fn filesystem(lab: &Lab, name: &str, fs_size: u64, lv_size: u64) -> Vec<u8> {
    let src = lab.dir.join(format!("{name}-src"));
    std::fs::create_dir_all(src.join("etc")).unwrap();
    std::fs::write(src.join("etc/hostname"), format!("{name}\n")).unwrap();
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(src.join("blob"), big).unwrap();
    let img = lab.dir.join(format!("{name}.ext4"));
    std::fs::File::create(&img).unwrap().set_len(fs_size).unwrap();
    run(
        "mkfs.ext4",
        &["-q", "-F", "-d", src.to_str().unwrap(), img.to_str().unwrap()],
    );
    let mut data = std::fs::read(&img).unwrap();
    data.extend((fs_size..lv_size).map(|i| (i % 251) as u8));
    data
}

pub fn e2fsck_clean(lab: &Lab, name: &str, bytes: &[u8]) {
    let img = lab.dir.join(format!("{name}.check"));
    std::fs::File::create(&img).unwrap().write_all(bytes).unwrap();
    let out = Command::new("e2fsck")
        .args(["-fn", img.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn of {name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
