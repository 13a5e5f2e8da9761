//! Boot Debian's kernel in qemu with a test's disks and a shell script,
//! and collect what the script printed.
//!
//! For what the host kernel cannot do (this build machine's has no
//! device-mapper, so LVM volumes cannot be activated): the tests hand a
//! disk image to a small VM whose kernel has it, let the VM's own tools
//! (the host's lvm2, e2fsprogs and attr, copied in with their libraries)
//! check it, and compare the VM's report with what ext4kit reads.
//!
//! What is booted is prepared by `.ci/vm-kernel` (CI runs it): Debian's
//! `linux-image-cloud-amd64` and `busybox-static`, unpacked without
//! installing them, in `EXT4KIT_VM_DIR` (default `/var/cache/ext4kit-vm`).
//! [`boot`] builds an initramfs (busybox, the programs and modules the
//! request names, an `/init`), runs qemu with the disks as virtio disks
//! (`/dev/vda`, `/dev/vdb`, ...) and waits for the script under a hard
//! timeout. The script's standard output travels on a second serial port
//! of its own, so kernel messages on the console never mix into it; the
//! console is kept for error messages. The script may use the shell
//! functions `section NAME COMMAND...` (a command's output and exit
//! status, read back with [`VmRun::section`]) and `list_tree DIR` (see
//! [`list_tree`]).
//!
//! Acceleration: KVM where the host has hardware virtualisation
//! (`kvm_intel` or `kvm_amd` loaded and `/dev/kvm` usable), else qemu's
//! TCG emulation, slower but available everywhere. A `/dev/kvm` served by
//! `kvm_pvm` (nested KVM without hardware virtualisation, as on these
//! build machines) runs only kernels built as PVM guests; Debian's stops
//! at once with a KVM internal error, so such a host uses TCG.
//! `EXT4KIT_VM_ACCEL=kvm|tcg` overrides the choice and
//! `EXT4KIT_VM_TIMEOUT=SECONDS` the timeout.

mod initramfs;
mod modules;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use initramfs::Initramfs;
pub use modules::load_order;

use crate::util::Context;

const DEFAULT_DIR: &str = "/var/cache/ext4kit-vm";
const PREPARE: &str = ".ci/vm-kernel";

/// The kernel, its modules and busybox that `.ci/vm-kernel` prepared.
#[derive(Debug, Clone)]
pub struct Kernel {
    dir: PathBuf,
    release: String,
}

impl Kernel {
    /// The prepared kernel in `EXT4KIT_VM_DIR` (default
    /// `/var/cache/ext4kit-vm`), or an error that says how to prepare it.
    pub fn find() -> io::Result<Kernel> {
        let root = std::env::var_os("EXT4KIT_VM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        let dir = root.join("current");
        let missing = |what: &str| {
            io::Error::other(format!(
                "no VM kernel: {what}. Run `{PREPARE}` as root: it installs qemu-system-x86 and unpacks \
                 Debian's linux-image-cloud-amd64 and busybox-static into {} (EXT4KIT_VM_DIR)",
                root.display()
            ))
        };
        let release = fs::read_to_string(dir.join("release"))
            .map_err(|e| missing(&format!("{}: {e}", dir.join("release").display())))?
            .trim()
            .to_string();
        let k = Kernel { dir, release };
        for p in [k.vmlinuz(), k.busybox(), k.modules_dir().join("modules.dep")] {
            if !p.is_file() {
                return Err(missing(&format!("{} is missing", p.display())));
            }
        }
        Ok(k)
    }

    /// `uname -r` of the kernel.
    pub fn release(&self) -> &str {
        &self.release
    }

    /// The kernel image qemu boots.
    pub fn vmlinuz(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }

    /// Debian's static busybox: the VM's shell and tools, and the host's
    /// for running the same [`list_tree`] as the VM.
    pub fn busybox(&self) -> PathBuf {
        self.dir.join("busybox")
    }

    /// `lib/modules/RELEASE`, with modules.dep.
    pub fn modules_dir(&self) -> PathBuf {
        self.dir.join("lib/modules").join(&self.release)
    }
}

/// How qemu runs the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// qemu's own CPU emulation.
    Tcg,
}

impl Accel {
    /// `EXT4KIT_VM_ACCEL` if set, else KVM where it runs a stock kernel
    /// (see the module's notes), else TCG.
    pub fn choose() -> io::Result<Accel> {
        match std::env::var("EXT4KIT_VM_ACCEL").ok().as_deref() {
            Some("kvm") => return Ok(Accel::Kvm),
            Some("tcg") => return Ok(Accel::Tcg),
            Some(other) if !other.is_empty() => {
                return Err(io::Error::other(format!(
                    "EXT4KIT_VM_ACCEL={other}: expected kvm or tcg"
                )))
            }
            _ => {}
        }
        let hardware = ["kvm_intel", "kvm_amd"]
            .iter()
            .any(|m| Path::new("/sys/module").join(m).exists());
        let usable = fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
        Ok(if hardware && usable { Accel::Kvm } else { Accel::Tcg })
    }

    /// What a boot and a short script may take before the VM is killed:
    /// `EXT4KIT_VM_TIMEOUT` seconds, else generous multiples of what one
    /// took on a loaded 2-core machine (docs/testing.md has the numbers).
    pub fn timeout(self) -> Duration {
        if let Some(s) = std::env::var("EXT4KIT_VM_TIMEOUT").ok().and_then(|s| s.parse().ok()) {
            return Duration::from_secs(s);
        }
        match self {
            Accel::Kvm => Duration::from_secs(120),
            Accel::Tcg => Duration::from_secs(600),
        }
    }

    fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg => &["-accel", "tcg"],
        }
    }
}

/// One VM run: what to boot with and what to run.
pub struct VmRequest<'a> {
    /// Where the initramfs and the serial logs are written (must exist).
    pub work_dir: &'a Path,
    /// Raw disk images, `/dev/vda`, `/dev/vdb`, ... in the VM; the VM's
    /// writes land in these files.
    pub disks: &'a [&'a Path],
    /// Host programs to copy in (with their libraries), at /usr/sbin.
    pub programs: &'a [&'a str],
    /// Kernel modules to load besides the virtio disk's (dependencies are
    /// found in modules.dep).
    pub modules: &'a [&'a str],
    /// Further files: (path in the VM, contents).
    pub files: &'a [(&'a str, &'a str)],
    /// The script, run by busybox sh with PATH=/usr/sbin:/bin once the
    /// disks are there; its standard output is what [`VmRun`] holds.
    pub script: &'a str,
}

/// What a VM run printed.
#[derive(Debug)]
pub struct VmRun {
    output: String,
    console: String,
    status: i32,
    elapsed: Duration,
    accel: Accel,
}

/// One `section NAME COMMAND...` of a VM script.
#[derive(Debug, Clone)]
pub struct Section {
    /// The command's standard output and error.
    pub output: String,
    /// Its exit status.
    pub status: i32,
}

impl VmRun {
    /// The script's standard output.
    pub fn output(&self) -> &str {
        &self.output
    }

    /// The serial console: the kernel's messages and the script's errors.
    pub fn console(&self) -> &str {
        &self.console
    }

    /// The script's exit status.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// From qemu's start to its exit.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// How the guest ran.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The last 40 lines of the console, for failure messages.
    pub fn console_tail(&self) -> String {
        tail(&self.console, 40)
    }

    /// The output and status of the script's `section NAME ...`.
    pub fn section(&self, name: &str) -> io::Result<Section> {
        let begin = format!("@@begin {name}\n");
        let end = format!("@@end {name} ");
        let start = self
            .output
            .find(&begin)
            .map(|i| i + begin.len())
            .ok_or_else(|| self.missing(&format!("no section {name}")))?;
        let rest = &self.output[start..];
        let stop = rest
            .find(&end)
            .ok_or_else(|| self.missing(&format!("section {name} never ended")))?;
        let status = rest[stop + end.len()..]
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.missing(&format!("section {name} has no exit status")))?;
        Ok(Section {
            output: rest[..stop].to_string(),
            status,
        })
    }

    /// [`VmRun::section`] that must have exited 0: its output.
    pub fn section_ok(&self, name: &str) -> io::Result<String> {
        let s = self.section(name)?;
        if s.status != 0 {
            return Err(self.missing(&format!("section {name} exited with {}:\n{}", s.status, s.output)));
        }
        Ok(s.output)
    }

    fn missing(&self, what: &str) -> io::Error {
        io::Error::other(format!(
            "VM script: {what}\n--- script output ---\n{}\n--- console (last lines) ---\n{}",
            self.output,
            self.console_tail()
        ))
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Shell functions every VM script (and [`list_tree`] on the host) has.
/// `$BB` is busybox: the same tool on both sides, so both print alike.
const FUNCTIONS: &str = r#"
section() {
  _name=$1; shift
  echo "@@begin $_name"
  "$@" 2>&1
  _rc=$?
  echo "@@end $_name $_rc"
}

list_tree() {
  ( cd "$1" || exit 1
    $BB find . | LC_ALL=C $BB sort | while IFS= read -r p; do
      meta=$($BB stat -c '%f %u %g %h %s %Y %Z %t:%T' "$p") || exit 1
      if [ -L "$p" ]; then what="-> $($BB readlink "$p")"
      elif [ -f "$p" ]; then what="sha256 $($BB sha256sum <"$p" | $BB cut -d' ' -f1)"
      else what=""; fi
      echo "$p $meta $what"
      getfattr -h -d -m - -e hex --absolute-names -- "$p" 2>&1 |
        while IFS= read -r x; do
          case $x in '#'*|'') ;; *) echo "$p xattr $x" ;; esac
        done
    done )
}
"#;

/// A listing of the tree at `dir` made on the host by the same busybox
/// and getfattr the VM uses, so it can be compared line for line with
/// the VM's `list_tree`: one line per path, in byte order — its mode in
/// hex (type bits included), owner, group, link count, size, mtime, ctime
/// and device number, a regular file's SHA-256 or a symlink's target —
/// and one line per extended attribute, value in hex.
pub fn list_tree(kernel: &Kernel, dir: &Path) -> io::Result<String> {
    let out = Command::new(kernel.busybox())
        .args(["sh", "-c", &format!("{FUNCTIONS}\nlist_tree \"$1\""), "sh"])
        .arg(dir)
        .env("BB", kernel.busybox())
        .stdin(Stdio::null())
        .output()
        .context(|| format!("run {}", kernel.busybox().display()))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "list_tree {}: {}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `/init` of the initramfs: mount the kernel's filesystems, load the
/// modules, wait for the disks, run the script with its output on the
/// second serial port, power off.
fn init_script(modules: &[String], disks: usize) -> String {
    let mut s = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox mount -t proc proc /proc\n\
         /bin/busybox --install -s /bin\n\
         export PATH=/usr/sbin:/bin BB=busybox\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n\
         mkdir -p /run/lock /tmp /mnt /etc\n\
         ln -s /proc/self/mounts /etc/mtab\n\
         stty -F /dev/ttyS1 raw -echo\n\
         fail() { echo \"ext4kit-vm: $*\" >&2; echo \"@@exit 255\" >/dev/ttyS1; poweroff -f; }\n",
    );
    for m in modules {
        s.push_str(&format!("insmod /{m} || fail 'insmod {m}'\n"));
    }
    for i in 0..disks {
        let dev = format!("/dev/vd{}", (b'a' + i as u8) as char);
        s.push_str(&format!(
            "n=0; while [ ! -b {dev} ]; do n=$((n+1)); [ $n -gt 600 ] && fail '{dev} did not appear'; sleep 0.05; done\n"
        ));
    }
    s.push_str(
        ". /lib/ext4kit-vm/functions.sh\n\
         ( . /lib/ext4kit-vm/script.sh ) >/dev/ttyS1\n\
         echo \"@@exit $?\" >/dev/ttyS1\n\
         sync\n\
         poweroff -f\n",
    );
    s
}

/// Boots the prepared kernel with `req` and returns once the VM powered
/// off after its script. Errors say what is missing (qemu, the kernel
/// directory) or, for a VM that failed or timed out, show the console.
pub fn boot(req: &VmRequest) -> io::Result<VmRun> {
    let kernel = Kernel::find()?;
    if Command::new("qemu-system-x86_64").arg("--version").output().is_err() {
        return Err(io::Error::other(format!(
            "qemu-system-x86_64 is not installed: run `{PREPARE}` (apt-get install qemu-system-x86)"
        )));
    }
    if req.disks.len() > 26 {
        return Err(io::Error::other("at most 26 virtio disks"));
    }
    let accel = Accel::choose()?;

    let mut names = vec!["virtio_pci", "virtio_blk"];
    names.extend_from_slice(req.modules);
    let mods = load_order(&kernel.modules_dir(), &names)?;
    let mut ir = Initramfs::new();
    ir.host_file("bin/busybox", &kernel.busybox(), 0o755);
    for d in ["proc", "sys", "run", "tmp", "mnt"] {
        ir.dir(d);
    }
    let mut in_vm = Vec::new();
    for m in &mods {
        let rel = m
            .strip_prefix(&kernel.dir)
            .map_err(|_| io::Error::other(format!("{} is outside {}", m.display(), kernel.dir.display())))?
            .to_string_lossy()
            .into_owned();
        ir.host_file(&rel, m, 0o644);
        in_vm.push(rel);
    }
    for p in req.programs {
        ir.program(p)?;
    }
    for (path, text) in req.files {
        ir.bytes(path, *text, 0o644);
    }
    ir.bytes("lib/ext4kit-vm/functions.sh", FUNCTIONS, 0o644);
    ir.bytes("lib/ext4kit-vm/script.sh", req.script, 0o644);
    ir.bytes("init", init_script(&in_vm, req.disks.len()), 0o755);
    let cpio = req.work_dir.join("initramfs.cpio");
    ir.write(&cpio)?;

    let console = req.work_dir.join("console.log");
    let results = req.work_dir.join("output.log");
    for f in [&console, &results] {
        let _ = fs::remove_file(f);
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(accel.qemu_args())
        .args(["-m", "512", "-smp", "1", "-nodefaults", "-no-user-config"])
        .args(["-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel.vmlinuz())
        .arg("-initrd")
        .arg(&cpio)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()));
    for d in req.disks {
        // qemu's option syntax doubles a comma inside a value.
        let file = d.to_string_lossy().replace(',', ",,");
        cmd.arg("-drive")
            .arg(format!("file={file},format=raw,if=virtio,cache=writeback"));
    }
    let qemu_log = req.work_dir.join("qemu.log");
    let log = fs::File::create(&qemu_log).context(|| format!("create {}", qemu_log.display()))?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);

    let limit = accel.timeout();
    let t = Instant::now();
    let mut child = cmd.spawn().context(|| "start qemu-system-x86_64".into())?;
    let exit = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = t.elapsed();
    let read = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned();
    let (output, console_text, qemu_text) = (read(&results), read(&console), read(&qemu_log));
    let status = output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("@@exit "))
        .and_then(|s| s.trim().parse::<i32>().ok());
    let Some(status) = status else {
        let how = match exit {
            None => format!(
                "was killed after {} s ({accel:?}; EXT4KIT_VM_TIMEOUT sets the limit)",
                limit.as_secs()
            ),
            Some(st) => format!("exited ({st}) after {:.1} s", elapsed.as_secs_f64()),
        };
        return Err(io::Error::other(format!(
            "the VM ({} with {}) {how} before its script finished\n--- qemu ---\n{}\n--- script output ---\n{}\n--- console (last lines) ---\n{}",
            kernel.release(),
            cpio.display(),
            qemu_text.trim(),
            tail(&output, 40),
            tail(&console_text, 40)
        )));
    };
    let output = output
        .rsplit_once("@@exit ")
        .map(|(before, _)| before.to_string())
        .unwrap_or_default();
    Ok(VmRun {
        output,
        console: console_text,
        status,
        elapsed,
        accel,
    })
}
