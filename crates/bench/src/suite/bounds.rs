//! What bounds the mount: for each of the mount's performance targets
//! (a speed ratio to the kernel's ext4 per workload), how many
//! FUSE requests one operation costs (counted by the kernel's own
//! tracepoint, [`super::fusetrace`]) and how long one round trip takes on
//! this machine, so the report can say, measured, whether the round trips
//! alone keep a target out of reach or the time goes elsewhere.
//!
//! A FUSE operation cannot finish sooner than its synchronous requests'
//! round trips: requests per operation × the round-trip time is a floor
//! under the mount's time per operation, and the kernel's time per
//! operation (the ratios' base, from the timed rounds) over that floor is
//! the best ratio the mount can reach while it sends that many requests.
//! Where requests overlap (readahead, background writeback, fio's two
//! jobs) the floor is divided by how many are in flight.
//!
//! The pass runs once after the timed rounds, on a fresh image of its own,
//! at small fixed sizes (requests per operation do not depend on the
//! size), with its own mini workloads that issue the same system calls as
//! the timed ones; nothing timed runs while events are traced.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::fusetrace::{FuseTrace, Requests};
use super::live::{Live, Target};
use super::work::{self, Workload};
use super::{PeerId, Sizes};
use crate::peers::PeerConfig;
use crate::srctree::{tarball, TreeShape};

/// How a timed figure turns into microseconds per operation.
#[derive(Debug, Clone, Copy)]
pub enum PerOp {
    /// The figure is seconds for this many operations.
    Secs(u64),
    /// The figure is operations per second.
    Rate,
}

/// One of the mount's performance targets, with the requests its
/// operation costs.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The target's name ("dd bs=1").
    pub target: &'static str,
    /// The speed ratio to the kernel the target asks for.
    pub goal: f64,
    /// The timed workload and figure it is judged on.
    pub workload: &'static str,
    /// The figure's metric; the smallest x when the figure is a curve.
    pub metric: String,
    /// How the figure converts to µs per operation.
    pub per_op: PerOp,
    /// What one operation is ("write", "MiB", "file").
    pub op: &'static str,
    /// Operations of the counted mini workload.
    pub ops: u64,
    /// Requests in flight at once (fio's two jobs; readahead).
    pub in_flight: f64,
    /// The requests the kernel sent for them.
    pub requests: Requests,
}

impl Bound {
    /// Requests per operation.
    pub fn per_op_requests(&self) -> f64 {
        self.requests.total() as f64 / self.ops.max(1) as f64
    }

    /// The round trips' floor under one operation, µs.
    pub fn floor_us(&self, rtt_us: f64) -> f64 {
        self.per_op_requests() * rtt_us / self.in_flight.max(1.0)
    }
}

/// The whole pass: the round trip and every target's requests.
#[derive(Debug, Clone)]
pub struct MountBounds {
    /// Median µs of one minimal round trip (a LOOKUP of a missing name).
    pub rtt_us: f64,
    /// Smallest and largest batch median.
    pub rtt_range: (f64, f64),
    /// Requests the kernel counted per stat of a missing name (1.00 means
    /// the round trip is measured alone).
    pub rtt_requests: f64,
    /// Which transport the mount used (the `enable_uring` parameter).
    pub transport: String,
    /// One per target whose workload ran.
    pub items: Vec<Bound>,
}

impl MountBounds {
    /// The round trip the floors use: the fastest batch's. A floor must
    /// not overstate; over io_uring the batches spread 16–37 µs on an
    /// idle 2-CPU VM (which CPU's ring thread the caller lands on), and a
    /// median floor came out above the mount's measured time per write.
    pub fn floor_rtt(&self) -> f64 {
        self.rtt_range.0
    }
}

/// Why the pass cannot run here, if it cannot.
pub fn unavailable(mount_ran: bool, kernel_ran: bool) -> Option<String> {
    if !mount_ran {
        return Some("the ext4kit mount did not run".into());
    }
    if !kernel_ran {
        return Some("the kernel's ext4 did not run (the ratios' base)".into());
    }
    FuseTrace::unavailable()
}

/// Which transport a default mount uses here: io_uring when the `fuse`
/// module offers it (ext4kit's `-o transport=auto`), /dev/fuse otherwise.
pub fn transport() -> String {
    let p = "/sys/module/fuse/parameters/enable_uring";
    match std::fs::read_to_string(p).map(|s| s.trim().to_string()) {
        Ok(v) if v == "Y" => "io_uring (enable_uring=Y)".into(),
        Ok(v) => format!("/dev/fuse (enable_uring={v})"),
        Err(_) => "/dev/fuse (this kernel has no FUSE over io_uring)".into(),
    }
}

fn io<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("bounds: {what}: {e}")
}

fn dir_of<'a>(l: &'a Live) -> Result<&'a Path, String> {
    match l.target()? {
        Target::Dir(d) => Ok(d),
        Target::Lib(_) => Err("bounds: the mount peer gave no directory".into()),
    }
}

/// Median µs per stat of a missing name over `batches` × `n`, and the
/// requests one such stat costs.
fn round_trip(t: &FuseTrace, l: &Live) -> Result<(f64, (f64, f64), f64), String> {
    let dir = dir_of(l)?;
    let (n, batches) = (5_000u64, 5);
    let mut meds = Vec::new();
    // A fresh name each time: the kernel caches no negative entry for a
    // missing name the server answers ENOENT to, but a name is never
    // asked twice all the same.
    let stat_missing = |b: usize| -> Result<f64, String> {
        let s = Instant::now();
        for i in 0..n {
            match std::fs::symlink_metadata(dir.join(format!("rtt-{b}-{i}"))) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("bounds: stat of a missing name: {e}")),
                Ok(_) => return Err("bounds: a missing name exists".into()),
            }
        }
        Ok(s.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    for b in 0..batches {
        meds.push(stat_missing(b)?);
    }
    let (_, counted) = t.count(dir, || stat_missing(batches))?;
    meds.sort_by(f64::total_cmp);
    let med = meds[meds.len() / 2];
    Ok((med, (meds[0], meds[meds.len() - 1]), counted.total() as f64 / n as f64))
}

/// Measure the requests of every target whose workload is in `selected`.
pub fn measure(
    cfg: &PeerConfig,
    work_dir: &Path,
    sizes: &Sizes,
    selected: &[&Workload],
) -> Result<MountBounds, String> {
    let has = |w: &str| selected.iter().any(|x| x.name == w);
    let t = FuseTrace::new()?;
    let dir = work_dir.join("bounds");
    std::fs::create_dir_all(&dir).map_err(io("mkdir"))?;
    let img = dir.join("bounds.img");
    crate::run(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&img)
            .arg("512M"),
    )?;
    let mut l = Live::start(PeerId::Mount, cfg, &img, &dir.join("mnt"))?;
    let (rtt_us, rtt_range, rtt_requests) = round_trip(&t, &l)?;
    let mut items = Vec::new();

    if has("dd") {
        let n = 20_000u64;
        let d = dir_of(&l)?.to_path_buf();
        let (_, req) = t.count(&d, || {
            let mut f = std::fs::File::create(d.join("dd")).map_err(io("create"))?;
            for _ in 0..n {
                f.write_all(&[0]).map_err(io("write"))?;
            }
            Ok(())
        })?;
        items.push(Bound {
            target: "dd bs=1",
            goal: 0.5,
            workload: "dd",
            metric: work::dd_metric(sizes.dd_count),
            per_op: PerOp::Secs(sizes.dd_count),
            op: "write",
            ops: n,
            in_flight: 1.0,
            requests: req,
        });
    }
    if has("fio") {
        let (mib, n) = (64u64, 4_000u64);
        let d = dir_of(&l)?.to_path_buf();
        // Written as the timed fio workload writes its file.
        work::write_file(&d.join("fio.dat"), mib, &mut vec![0x5au8; 1 << 20])?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join("fio.dat"))
            .map_err(io("open"))?;
        let mut r = SmallRng::seed_from_u64(0xB0);
        let (_, req) = t.count(&d, || {
            let buf = [0x33u8; 4096];
            for _ in 0..n {
                let off = r.random_range(0..(mib << 20) / 4096) * 4096;
                f.write_all_at(&buf, off).map_err(io("pwrite"))?;
            }
            Ok(())
        })?;
        items.push(Bound {
            target: "fio randwrite 4k",
            goal: 0.5,
            workload: "fio",
            metric: work::fio_metric("randwrite", sizes.fio_secs),
            per_op: PerOp::Rate,
            op: "write",
            ops: n,
            // fio runs two jobs: two round trips can be in flight.
            in_flight: 2.0,
            requests: req,
        });
    }
    if has("seq") {
        let mib = 64u64;
        let d = dir_of(&l)?.to_path_buf();
        // The timed seq workload's own writer: 1 MiB writes, then fsync.
        let mut chunk = vec![0xa5u8; 1 << 20];
        let (_, req) = t.count(&d, || work::write_file(&d.join("seq"), mib, &mut chunk))?;
        items.push(Bound {
            target: "seq write",
            goal: 0.8,
            workload: "seq",
            metric: work::seq_write_metric(sizes.seq_mib),
            per_op: PerOp::Rate,
            op: "MiB",
            ops: mib,
            in_flight: 1.0,
            requests: req,
        });
        l.cold()?;
        let d = dir_of(&l)?.to_path_buf();
        let (_, req) = t.count(&d, || {
            let mut f = std::fs::File::open(d.join("seq")).map_err(io("open"))?;
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let k = f.read(&mut buf).map_err(io("read"))?;
                if k == 0 {
                    break;
                }
                total += k as u64;
            }
            if total != mib << 20 {
                return Err(format!("bounds: read {total} bytes of {}", mib << 20));
            }
            Ok(())
        })?;
        items.push(Bound {
            target: "cold read",
            goal: 0.8,
            workload: "seq",
            metric: work::seq_read_metric(sizes.seq_mib),
            per_op: PerOp::Rate,
            op: "MiB",
            ops: mib,
            // Readahead: the kernel's FUSE client sends READs of the
            // window asynchronously, up to max_background at once; one
            // in flight is the conservative floor.
            in_flight: 1.0,
            requests: req,
        });
    }
    if has("tree") {
        let shape = TreeShape {
            dirs: 40,
            files: 1_500,
            seed: 0x7472_6565,
        };
        let (tar, _) = tarball(work_dir, &shape)?;
        let d = dir_of(&l)?.to_path_buf();
        let (_, req) = t.count(&d, || {
            crate::run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&d))
        })?;
        items.push(Bound {
            target: "untar",
            goal: 0.3,
            workload: "tree",
            metric: work::untar_metric(sizes.tree_files),
            per_op: PerOp::Secs(sizes.tree_files as u64),
            op: "file",
            ops: shape.files as u64,
            in_flight: 1.0,
            requests: req,
        });
        // As the timed workload: rm -rf after the tree was walked.
        l.cold()?;
        let d = dir_of(&l)?.to_path_buf();
        crate::run(Command::new("find").arg(d.join("tree")).stdout(Stdio::null()))?;
        let (_, req) = t.count(&d, || crate::run(Command::new("rm").arg("-rf").arg(d.join("tree"))))?;
        items.push(Bound {
            target: "rm -rf",
            goal: 0.5,
            workload: "tree",
            metric: work::RM_METRIC.into(),
            per_op: PerOp::Secs(sizes.tree_files as u64),
            op: "file",
            ops: shape.files as u64,
            in_flight: 1.0,
            requests: req,
        });
    }
    if has("create") {
        let n = 5_000u64;
        let d = dir_of(&l)?.join("c");
        std::fs::create_dir(&d).map_err(io("mkdir"))?;
        let (_, req) = t.count(&d, || {
            for i in 0..n {
                std::fs::File::create(d.join(format!("f{i:07}"))).map_err(io("create"))?;
            }
            Ok(())
        })?;
        items.push(Bound {
            target: "creates",
            goal: 0.35,
            workload: "create",
            metric: work::CREATE_METRIC.into(),
            per_op: PerOp::Rate,
            op: "file",
            ops: n,
            in_flight: 1.0,
            requests: req,
        });
    }
    l.finish()?;
    let (clean, verdict) = crate::peers::fsck_verdict(&img);
    if !clean {
        return Err(format!("bounds: e2fsck -fn {}: {verdict} (image kept)", img.display()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(MountBounds {
        rtt_us,
        rtt_range,
        rtt_requests,
        transport: transport(),
        items,
    })
}
