//! The report of one `ext4kit bench` run: every round's figure kept (so
//! the spread is visible, not only the median), tables on the terminal
//! and in `report.md`, and the same data as `results.json` and
//! `results.csv` for scripts and plots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bounds::{Bound, MountBounds, PerOp};
use super::work::Figure;
use super::{notes, Availability, Options, PeerId, Sizes, Workload};

/// Every round of one (workload, metric, x, peer).
#[derive(Debug, Clone)]
pub struct Row {
    /// Workload name.
    pub workload: &'static str,
    /// Metric.
    pub metric: String,
    /// Unit.
    pub unit: &'static str,
    /// Higher is better.
    pub higher_better: bool,
    /// Point on the curve.
    pub x: Option<f64>,
    /// Peer label: the peer's name, or `lib:VARIANT`.
    pub peer: String,
    /// One value per round.
    pub samples: Vec<f64>,
}

impl Row {
    /// Median (the mean of the middle two for an even count).
    pub fn median(&self) -> f64 {
        let mut v = self.samples.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// Smallest and largest round.
    pub fn min_max(&self) -> (f64, f64) {
        self.samples
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)))
    }
}

/// Everything one run found.
pub struct Report {
    command: String,
    quick: bool,
    /// The library's and the ext4kit server's cache budget, bytes.
    cache_budget: usize,
    sizes: Sizes,
    avail: Availability,
    workloads: Vec<&'static Workload>,
    /// Every (workload, metric, x, peer) measured.
    pub rows: Vec<Row>,
    /// Rounds that failed: (workload, peer, round, message).
    pub errors: Vec<(String, String, usize, String)>,
    /// e2fsck verdicts per peer: (clean, checked, first failure).
    fsck: Vec<(PeerId, usize, usize, Option<String>)>,
    secs: f64,
    date: String,
    machine: String,
    /// The requests and round trips behind the mount targets, or why they
    /// were not measured.
    bounds: Option<Result<MountBounds, String>>,
}

/// A number with a sensible number of digits.
pub fn fmt_val(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.1 || x == 0.0 {
        format!("{x:.2}")
    } else {
        // Two significant digits, however small (µs-scale seconds).
        let digits = ((-x.abs().log10()).ceil() as usize + 1).min(12);
        format!("{x:.digits$}")
    }
}

fn fmt_ratio(x: f64) -> String {
    if !x.is_finite() {
        "—".into()
    } else if x >= 10.0 {
        format!("{x:.0}×")
    } else {
        format!("{x:.2}×")
    }
}

fn fmt_x(x: Option<f64>) -> String {
    x.map_or(String::new(), |x| format!("{x:.0}"))
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

impl Report {
    /// An empty report for a run of `workloads`.
    pub fn new(opts: &Options, sizes: &Sizes, avail: &Availability, workloads: &[&'static Workload]) -> Self {
        let load = std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_default();
        let machine = format!(
            "{} CPUs ({model}), kernel {}, load average at the start {load}; FUSE requests of the ext4kit mount \
             travel over {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            sh("uname", &["-r"]),
            super::bounds::transport(),
        );
        Report {
            command: opts.command.clone(),
            quick: opts.quick,
            cache_budget: opts.cache_budget,
            sizes: sizes.clone(),
            avail: avail.clone(),
            workloads: workloads.to_vec(),
            rows: Vec::new(),
            errors: Vec::new(),
            fsck: Vec::new(),
            secs: 0.0,
            date: sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            machine,
            bounds: None,
        }
    }

    /// Record one round's figures of `workload` on `peer`.
    pub fn add(&mut self, workload: &'static str, peer: PeerId, figs: Vec<Figure>) {
        for f in figs {
            let label = match f.variant {
                Some(v) => format!("{}:{v}", peer.name()),
                None => peer.name().to_string(),
            };
            let found = self
                .rows
                .iter_mut()
                .find(|r| r.workload == workload && r.metric == f.metric && r.x == f.x && r.peer == label);
            match found {
                Some(r) => r.samples.push(f.value),
                None => self.rows.push(Row {
                    workload,
                    metric: f.metric,
                    unit: f.unit,
                    higher_better: f.higher_better,
                    x: f.x,
                    peer: label,
                    samples: vec![f.value],
                }),
            }
        }
    }

    /// Record a failed round.
    pub fn error(&mut self, workload: &str, peer: PeerId, round: usize, msg: &str) {
        self.errors.push((
            workload.to_string(),
            peer.name().to_string(),
            round + 1,
            msg.to_string(),
        ));
    }

    /// Record e2fsck's verdict on an image `peer` wrote.
    pub fn fsck(&mut self, peer: PeerId, clean: bool, image: &Path, verdict: &str) {
        let i = match self.fsck.iter().position(|f| f.0 == peer) {
            Some(i) => i,
            None => {
                self.fsck.push((peer, 0, 0, None));
                self.fsck.len() - 1
            }
        };
        let f = &mut self.fsck[i];
        f.2 += 1;
        if clean {
            f.1 += 1;
        } else if f.3.is_none() {
            f.3 = Some(format!("{}: {verdict}", image.display()));
        }
    }

    /// Record the bounds pass (or why it did not run).
    pub fn set_bounds(&mut self, b: Result<MountBounds, String>) {
        self.bounds = Some(b);
    }

    /// The bounds pass, when it ran.
    pub fn bounds(&self) -> Option<&MountBounds> {
        self.bounds.as_ref().and_then(|b| b.as_ref().ok())
    }

    /// µs per operation of `b`'s timed figure on `peer` (the median; the
    /// first point of a curve).
    pub fn per_op_us(&self, b: &Bound, peer: &str) -> Option<f64> {
        let r = self
            .rows
            .iter()
            .filter(|r| r.workload == b.workload && r.metric == b.metric && r.peer == peer)
            .min_by(|a, c| a.x.partial_cmp(&c.x).unwrap_or(std::cmp::Ordering::Equal))?;
        let m = r.median();
        let v = match b.per_op {
            PerOp::Secs(n) => m * 1e6 / n as f64,
            PerOp::Rate => 1e6 / m,
        };
        (v.is_finite() && v > 0.0).then_some(v)
    }

    /// One target's line of the bounds table: measured ratio, ceiling,
    /// and the verdict in words.
    fn bound_cells(&self, b: &Bound, rtt: f64) -> (Option<f64>, Option<f64>, String) {
        let kernel = self.per_op_us(b, PeerId::Kernel.name());
        let mount = self.per_op_us(b, PeerId::Mount.name());
        let floor = b.floor_us(rtt);
        let measured = kernel.zip(mount).map(|(k, m)| k / m);
        let ceiling = kernel.map(|k| k / floor);
        let why = match (kernel, mount, measured, ceiling) {
            (Some(_), Some(_), Some(r), _) if r >= b.goal => "met".to_string(),
            (Some(k), m, _, Some(c)) if c < b.goal => {
                let mut t = format!(
                    "the round trips: {:.2} requests per {} take {} µs alone; the goal needs ≤ {} µs",
                    b.per_op_requests(),
                    b.op,
                    fmt_val(floor),
                    fmt_val(k / b.goal)
                );
                // Say so when the round trips are not most of the time
                // (fio's writes: 34 µs against a 7.5 µs floor).
                if let Some(m) = m.filter(|&m| m > 2.0 * floor) {
                    t += &format!(
                        "; beyond them the server and the kernel's FUSE client take {} µs per {} ({:.0}% of the time)",
                        fmt_val(m - floor),
                        b.op,
                        100.0 * (m - floor) / m
                    );
                }
                t
            }
            (Some(_), Some(m), _, _) if m < floor => format!(
                "requests overlap (the mount's {} µs is below the serial floor): the server's time, not the count",
                fmt_val(m)
            ),
            (Some(_), Some(m), _, _) => format!(
                "the server and the kernel's FUSE client: {} µs per {} beyond the round trips ({:.0}% of the time)",
                fmt_val(m - floor),
                b.op,
                100.0 * (m - floor) / m
            ),
            _ => "no timed figure of the mount or the kernel".to_string(),
        };
        (measured, ceiling, why)
    }

    /// The FUSE servers' peak memory per workload, beside the ext4kit
    /// server's cache budget, and the create curve's resident size (issue
    /// 20: within `--cache-mib` plus a bounded overhead, on the
    /// 1,000,000-file directory too).
    fn memory_markdown(&self, s: &mut String) {
        let rows: Vec<&Row> = self.rows.iter().filter(|r| r.metric == super::SERVER_RSS).collect();
        if rows.is_empty() {
            return;
        }
        let budget = (self.cache_budget >> 20) as f64;
        let mount = super::PeerId::Mount.name();
        let _ = writeln!(
            s,
            "## FUSE servers' peak memory\n\nThe largest `VmHWM` of the server over the rounds, MiB. \
             The ext4kit server runs with `--cache-mib {budget}`: block and page caches share \
             three quarters of it, inodes and dentries the rest; beyond it are the journal's commit \
             buffers, the allocator's free space, the binary, thread stacks and per-open-file state.\n\n\
             | workload | peer | peak RSS, MiB | beyond the budget, MiB |\n|---|---|---:|---:|"
        );
        for r in rows {
            let (_, hi) = r.min_max();
            let beyond = if r.peer == mount {
                if hi > budget {
                    fmt_val(hi - budget)
                } else {
                    "within".into()
                }
            } else {
                "—".into()
            };
            let _ = writeln!(s, "| {} | {} | {} | {beyond} |", r.workload, r.peer, fmt_val(hi));
        }
        let _ = writeln!(s);
        self.create_rss_markdown(s, budget);
    }

    /// The servers' resident size at each size of the create curve, and
    /// whether ext4kit's levels off.
    fn create_rss_markdown(&self, s: &mut String, budget: f64) {
        let rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.metric == super::work::CREATE_RSS_METRIC)
            .collect();
        let mut peers: Vec<&str> = Vec::new();
        for r in &rows {
            if !peers.contains(&r.peer.as_str()) {
                peers.push(&r.peer);
            }
        }
        if rows.is_empty() {
            return;
        }
        let mut xs: Vec<f64> = rows.iter().filter_map(|r| r.x).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let _ = writeln!(
            s,
            "### As the directory grows (create)\n\nThe server's `VmRSS` after each interval of the \
             create curve, MiB (largest over the rounds).\n\n| files in the directory | {} |\n|---:|{}",
            peers.join(" | "),
            "---:|".repeat(peers.len())
        );
        let at = |peer: &str, x: f64| {
            rows.iter()
                .find(|r| r.peer == peer && r.x == Some(x))
                .map(|r| r.min_max().1)
        };
        for &x in &xs {
            let cells: Vec<String> = peers.iter().map(|p| at(p, x).map_or("—".into(), fmt_val)).collect();
            let _ = writeln!(s, "| {} | {} |", x as u64, cells.join(" | "));
        }
        let mount = super::PeerId::Mount.name();
        let curve: Vec<(f64, f64)> = xs.iter().filter_map(|&x| Some((x, at(mount, x)?))).collect();
        if let (Some(&(x_end, end)), true) = (curve.last(), curve.len() >= 2) {
            // The second half of the curve, by directory size: past it the
            // growth per file says whether anything grows with the tree.
            let (x_mid, mid) = curve
                .iter()
                .copied()
                .find(|&(x, _)| x >= x_end / 2.0)
                .unwrap_or(curve[0]);
            let per_file = if x_end > x_mid {
                format!(
                    "; from {} to {} files it grew {} MiB ({} bytes per file)",
                    x_mid as u64,
                    x_end as u64,
                    fmt_val(end - mid),
                    fmt_val((end - mid) * 1048576.0 / (x_end - x_mid))
                )
            } else {
                String::new()
            };
            let verdict = if end > budget {
                format!("the {budget} MiB budget + {} MiB", fmt_val(end - budget))
            } else {
                format!("within the {budget} MiB budget")
            };
            let _ = writeln!(
                s,
                "\n**ext4kit's server at {} files: {} MiB, {verdict}**{per_file}. (The caches fill \
                 up to the budget as the directory grows: the growth per file levels off once they are \
                 full.)",
                x_end as u64,
                fmt_val(end),
            );
        }
        let _ = writeln!(s);
    }

    fn bounds_markdown(&self, s: &mut String) {
        let Some(b) = &self.bounds else { return };
        let _ = writeln!(s, "## What bounds the mount (the mount's targets)\n");
        let mb = match b {
            Ok(mb) => mb,
            Err(why) => {
                let _ = writeln!(s, "Round trips {why}\n");
                return;
            }
        };
        let _ = writeln!(
            s,
            "One round trip: {} µs (median of 5 × 5,000 stats of missing names; batches {}–{} µs; \
             the kernel counted {:.2} requests per stat), transport {}. Requests per operation are \
             the kernel's own count (tracepoint `fuse:fuse_request_send`) in an untimed pass after \
             the rounds; the floor is requests × the fastest batch's round trip ÷ requests in flight \
             (a lower bound: the median batch would overstate it); the ceiling is the \
             kernel's time per operation over that floor: the best ratio the mount can reach while it \
             sends that many requests.\n",
            fmt_val(mb.rtt_us),
            fmt_val(mb.rtt_range.0),
            fmt_val(mb.rtt_range.1),
            mb.rtt_requests,
            mb.transport
        );
        let _ = writeln!(
            s,
            "| target | goal | measured | requests per op (kernel's count) | floor µs/op | mount µs/op | \
             kernel µs/op | ceiling | what bounds it |\n|---|---:|---:|---|---:|---:|---:|---:|---|"
        );
        for it in &mb.items {
            let (measured, ceiling, why) = self.bound_cells(it, mb.floor_rtt());
            let opt = |v: Option<f64>| v.map_or("—".to_string(), fmt_val);
            let _ = writeln!(
                s,
                "| {} (per {}) | {:.2}× | {} | {:.2}: {} | {} | {} | {} | {} | {why} |",
                it.target,
                it.op,
                it.goal,
                measured.map_or("—".to_string(), fmt_ratio),
                it.per_op_requests(),
                it.requests.per_op(it.ops),
                fmt_val(it.floor_us(mb.floor_rtt())),
                opt(self.per_op_us(it, PeerId::Mount.name())),
                opt(self.per_op_us(it, PeerId::Kernel.name())),
                ceiling.map_or("—".to_string(), fmt_ratio),
            );
        }
        let _ = writeln!(s);
    }

    /// The run is over after `secs`.
    pub fn finish(&mut self, secs: f64) {
        self.secs = secs;
    }

    /// Whether every round ran and every image was clean.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.fsck.iter().all(|f| f.1 == f.2)
    }

    /// The kernel's median for the same (workload, metric, x), if any.
    fn kernel_of(&self, r: &Row) -> Option<f64> {
        self.rows
            .iter()
            .find(|k| k.workload == r.workload && k.metric == r.metric && k.x == r.x && k.peer == PeerId::Kernel.name())
            .map(Row::median)
    }

    /// Speed ratio of `r` to the kernel (above 1: faster than the kernel).
    pub fn ratio_to_kernel(&self, r: &Row) -> Option<f64> {
        let k = self.kernel_of(r)?;
        let m = r.median();
        let v = if r.higher_better { m / k } else { k / m };
        v.is_finite().then_some(v)
    }

    /// The peer labels that have rows for `workload`, in table order.
    fn peers_of(&self, workload: &str) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for p in PeerId::ALL {
            for r in self.rows.iter().filter(|r| r.workload == workload) {
                let is = r.peer == p.name() || r.peer.starts_with(&format!("{}:", p.name()));
                if is && !v.contains(&r.peer) {
                    v.push(r.peer.clone());
                }
            }
        }
        v
    }

    /// The report as Markdown: header, peers, one table per workload,
    /// e2fsck verdicts, errors, the scaling notes.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# ext4kit bench{}\n", if self.quick { " --quick" } else { "" });
        let _ = writeln!(s, "- command: `{}`", self.command);
        let _ = writeln!(s, "- date: {}; total {:.0} s", self.date, self.secs);
        let _ = writeln!(s, "- machine: {}", self.machine);
        let _ = writeln!(
            s,
            "- rounds: {} (peers interleaved in each round; a round of {} s or more is not repeated)",
            self.sizes.runs, self.sizes.long_run_secs
        );
        let _ = writeln!(s, "\nPeers:\n");
        for (p, why) in &self.avail.peers {
            match why {
                None => {
                    let _ = writeln!(s, "- **{}**: {}", p.name(), p.about());
                }
                Some(r) => {
                    let _ = writeln!(s, "- **{}**: skipped — {r}", p.name());
                }
            }
        }
        if let Some(f) = &self.avail.fio {
            let _ = writeln!(s, "- fio workload through mounts: skipped — {f}");
        }
        let _ = writeln!(
            s,
            "\nCells are medians over the rounds with the min–max range; ratios are speed ratios to \
             the kernel's ext4 (a rate over the kernel's, or the kernel's time over ours): above 1 \
             is faster than the kernel.\n"
        );
        for w in &self.workloads {
            let peers = self.peers_of(w.name);
            let _ = writeln!(s, "## {} — {}\n", w.name, w.title);
            if peers.is_empty() {
                let _ = writeln!(s, "(no figures)\n");
                continue;
            }
            let has_x = !w.x_label.is_empty();
            let (mut head, mut rule) = if has_x {
                (
                    format!("| metric | unit | {} |", w.x_label),
                    String::from("|---|---|---:|"),
                )
            } else {
                (String::from("| metric | unit |"), String::from("|---|---|"))
            };
            for p in &peers {
                let _ = write!(head, " {p} |");
                rule.push_str("---:|");
            }
            // Ratio columns only when the kernel ran.
            let kernel = peers.iter().any(|p| p == PeerId::Kernel.name());
            let others: Vec<&String> = peers.iter().filter(|p| kernel && *p != PeerId::Kernel.name()).collect();
            for p in &others {
                let _ = write!(head, " {p} / kernel |");
                rule.push_str("---:|");
            }
            let _ = writeln!(s, "{head}\n{rule}");
            // Row keys in first-seen order.
            let mut keys: Vec<(String, Option<f64>)> = Vec::new();
            for r in self.rows.iter().filter(|r| r.workload == w.name) {
                let k = (r.metric.clone(), r.x);
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            for (metric, x) in keys {
                let find = |p: &str| {
                    self.rows
                        .iter()
                        .find(|r| r.workload == w.name && r.metric == metric && r.x == x && r.peer == p)
                };
                let unit = peers.iter().find_map(|p| find(p)).map_or("", |r| r.unit);
                let mut line = if has_x {
                    format!("| {metric} | {unit} | {} |", fmt_x(x))
                } else {
                    format!("| {metric} | {unit} |")
                };
                for p in &peers {
                    let cell = find(p).map_or("—".to_string(), |r| {
                        let (lo, hi) = r.min_max();
                        if r.samples.len() > 1 {
                            format!("{} ({}–{})", fmt_val(r.median()), fmt_val(lo), fmt_val(hi))
                        } else {
                            fmt_val(r.median())
                        }
                    });
                    let _ = write!(line, " {cell} |");
                }
                for p in &others {
                    let cell = find(p)
                        .and_then(|r| self.ratio_to_kernel(r))
                        .map_or("—".to_string(), fmt_ratio);
                    let _ = write!(line, " {cell} |");
                }
                let _ = writeln!(s, "{line}");
            }
            // Peers skipped everywhere are listed once at the top; here
            // only what this workload cannot run on a peer that runs.
            for p in w.peers.iter().filter(|p| self.avail.skipped(**p).is_none()) {
                if let Some(why) = w.skip_reason(*p, &self.avail) {
                    let _ = writeln!(s, "\n{} skipped: {why}", p.name());
                }
            }
            if let Some(line) = self.scaling_line(w.name) {
                let _ = writeln!(s, "\n{line}");
            }
            let _ = writeln!(s);
        }
        self.bounds_markdown(&mut s);
        self.memory_markdown(&mut s);
        let _ = writeln!(s, "## e2fsck -fn after every round\n");
        for (p, clean, total, first) in &self.fsck {
            let _ = writeln!(
                s,
                "- {}: {clean}/{total} clean{}",
                p.name(),
                first
                    .as_ref()
                    .map_or(String::new(), |f| format!(" (first failure: {f})"))
            );
        }
        if !self.errors.is_empty() {
            let _ = writeln!(s, "\n## Failed rounds\n");
            for (w, p, r, e) in &self.errors {
                let _ = writeln!(s, "- {w} on {p}, round {r}: {e}");
            }
        }
        let _ = writeln!(s, "\n## Scaling notes: what is shared on each path, and 64 cores\n");
        let _ = writeln!(
            s,
            "These machines have 2 vCPUs. For each curve: the shared state that remains on its path \
             in ext4kit, and what to try on a big machine.\n"
        );
        for n in notes::NOTES {
            if self.workloads.iter().any(|w| w.name == n.workload) {
                let _ = writeln!(s, "- **{}** — shared: {} On 64 cores: {}", n.curve, n.shared, n.at_64);
            }
        }
        s
    }

    /// For the thread curves: each peer's scaling from the first to the
    /// last thread count, and for storm the ratio to lseek's (the target:
    /// the open storm should scale as well as shared-nothing work).
    fn scaling_line(&self, workload: &str) -> Option<String> {
        if !matches!(workload, "lseek" | "storm" | "dpath" | "pcreate" | "fsmall") {
            return None;
        }
        let scaling = |w: &str, peer: &str| -> Option<(f64, f64, f64)> {
            let mut pts: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| r.workload == w && r.peer == peer && r.x.is_some() && r.higher_better)
                .collect();
            let metric = pts.first()?.metric.clone();
            pts.retain(|r| r.metric == metric);
            pts.sort_by(|a, b| a.x.partial_cmp(&b.x).unwrap_or(std::cmp::Ordering::Equal));
            let (a, b) = (pts.first()?, pts.last()?);
            (a.x != b.x).then(|| (a.x.unwrap_or(1.0), b.x.unwrap_or(1.0), b.median() / a.median()))
        };
        let mut parts = Vec::new();
        for p in self.peers_of(workload) {
            if let Some((a, b, r)) = scaling(workload, &p) {
                let mut part = format!("{p} {r:.2}× ({b:.0} vs {a:.0} threads)");
                if workload == "storm" {
                    if let Some((_, _, base)) = scaling("lseek", &p) {
                        part += &format!(", {:.0}% of its lseek scaling", 100.0 * r / base);
                    }
                }
                parts.push(part);
            }
        }
        let mut line = (!parts.is_empty()).then(|| {
            format!(
                "Scaling (total throughput, most threads / fewest): {}.",
                parts.join("; ")
            )
        })?;
        if workload == "storm" {
            if let Some(v) = self.storm_verdict() {
                line += &format!("\n\n{v}");
            }
        }
        Some(line)
    }

    /// The storm's scaling target on the library: the storm's 2-thread /
    /// 1-thread throughput beside that of the lseek workload's
    /// shared-nothing seeks measured in the same rounds (peer
    /// `lib:shared-nothing`), their quotient against the 90% target, and the
    /// counted shared-line writes per open/read/close. Ratios are taken
    /// round by round (the two ran back to back in each) and the median
    /// reported.
    fn storm_verdict(&self) -> Option<String> {
        use super::work::{STORM_SHARED, STORM_YARDSTICK};
        let row = |metric: &str, peer: &str, x: Option<f64>| {
            self.rows
                .iter()
                .find(|r| r.workload == "storm" && r.metric == metric && r.peer == peer && r.x == x)
        };
        let per_round = |metric: &str, peer: &str| -> Option<Vec<f64>> {
            let (a, b) = (row(metric, peer, Some(1.0))?, row(metric, peer, Some(2.0))?);
            if a.samples.len() == b.samples.len() {
                Some(a.samples.iter().zip(&b.samples).map(|(a, b)| b / a).collect())
            } else {
                Some(vec![b.median() / a.median()])
            }
        };
        // As `Row::median`: the mean of the middle two for an even count.
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        let storm = per_round("open/read/close, all threads", "lib")?;
        let yard = per_round(STORM_YARDSTICK, "lib:shared-nothing")?;
        let quot: Vec<f64> = storm.iter().zip(&yard).map(|(s, y)| s / y).collect();
        if quot.is_empty() {
            return None;
        }
        let q = med(quot.clone());
        let lo = quot.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = quot.iter().copied().fold(0.0, f64::max);
        let mut v = format!(
            "Scaling target (lib, 2 threads / 1 thread, same rounds): the storm {:.2}×, the \
             shared-nothing seeks {:.2}× — the storm scales {:.0}% as well ({:.0}–{:.0}% over {} \
             rounds); target ≥ 90%: {}.",
            med(storm),
            med(yard),
            100.0 * q,
            100.0 * lo,
            100.0 * hi,
            quot.len(),
            if q >= 0.9 { "met" } else { "not met" }
        );
        if let Some(w) = row(STORM_SHARED, "lib", None) {
            v += &format!(
                " Shared-line writes per open/read/close, counted: {}.",
                fmt_val(w.median())
            );
        }
        Some(v)
    }

    /// The report as JSON.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let (lo, hi) = r.min_max();
                json!({
                    "workload": r.workload,
                    "metric": r.metric,
                    "unit": r.unit,
                    "higher_is_better": r.higher_better,
                    "x": r.x,
                    "peer": r.peer,
                    "samples": r.samples,
                    "median": r.median(),
                    "min": lo,
                    "max": hi,
                    "ratio_to_kernel": self.ratio_to_kernel(r),
                })
            })
            .collect();
        let peers: Vec<_> = self
            .avail
            .peers
            .iter()
            .map(|(p, why)| {
                json!({
                    "name": p.name(),
                    "about": p.about(),
                    "ran": why.is_none(),
                    "skipped_because": why,
                })
            })
            .collect();
        let workloads: Vec<_> = self
            .workloads
            .iter()
            .map(|w| {
                let skipped: Vec<_> = w
                    .peers
                    .iter()
                    .filter_map(|p| {
                        self.avail
                            .skipped(*p)
                            .map(str::to_string)
                            .or_else(|| w.skip_reason(*p, &self.avail))
                            .map(|why| json!({"peer": p.name(), "because": why}))
                    })
                    .collect();
                json!({
                    "name": w.name,
                    "seed": w.seed,
                    "title": w.title,
                    "about": w.about,
                    "x": w.x_label,
                    "peers": w.peers.iter().map(|p| p.name()).collect::<Vec<_>>(),
                    "skipped": skipped,
                })
            })
            .collect();
        let fsck: Vec<_> = self
            .fsck
            .iter()
            .map(|(p, c, t, f)| json!({"peer": p.name(), "clean": c, "checked": t, "first_failure": f}))
            .collect();
        let errors: Vec<_> = self
            .errors
            .iter()
            .map(|(w, p, r, e)| json!({"workload": w, "peer": p, "round": r, "error": e}))
            .collect();
        let notes: Vec<_> = notes::NOTES
            .iter()
            .filter(|n| self.workloads.iter().any(|w| w.name == n.workload))
            .map(
                |n| json!({"workload": n.workload, "curve": n.curve, "shared_state": n.shared, "on_64_cores": n.at_64}),
            )
            .collect();
        let bounds = match &self.bounds {
            None => json!(null),
            Some(Err(why)) => json!({ "skipped_because": why }),
            Some(Ok(mb)) => json!({
                "round_trip_us": mb.rtt_us,
                "round_trip_range_us": [mb.rtt_range.0, mb.rtt_range.1],
                "requests_per_round_trip_probe": mb.rtt_requests,
                "transport": mb.transport,
                "targets": mb.items.iter().map(|it| {
                    let (measured, ceiling, why) = self.bound_cells(it, mb.floor_rtt());
                    json!({
                        "target": it.target,
                        "goal": it.goal,
                        "workload": it.workload,
                        "metric": it.metric,
                        "per": it.op,
                        "ops_counted": it.ops,
                        "requests": it.requests.by_op,
                        "requests_per_op": it.per_op_requests(),
                        "in_flight": it.in_flight,
                        "floor_us_per_op": it.floor_us(mb.floor_rtt()),
                        "mount_us_per_op": self.per_op_us(it, PeerId::Mount.name()),
                        "kernel_us_per_op": self.per_op_us(it, PeerId::Kernel.name()),
                        "measured_ratio": measured,
                        "ceiling_ratio": ceiling,
                        "bounded_by": why,
                    })
                }).collect::<Vec<_>>(),
            }),
        };
        json!({
            "mount_bounds": bounds,
            "command": self.command,
            "date": self.date,
            "machine": self.machine,
            "quick": self.quick,
            "seconds": self.secs,
            "sizes": self.sizes.to_json(),
            "peers": peers,
            "workloads": workloads,
            "results": rows,
            "fsck": fsck,
            "errors": errors,
            "scaling_notes": notes,
        })
    }

    /// The figures as CSV, one line per (workload, metric, x, peer).
    pub fn csv(&self) -> String {
        let mut s =
            String::from("workload,metric,unit,higher_is_better,x,peer,rounds,median,min,max,ratio_to_kernel\n");
        let q = |t: &str| {
            if t.contains([',', '"', '\n']) {
                format!("\"{}\"", t.replace('"', "\"\""))
            } else {
                t.to_string()
            }
        };
        for r in &self.rows {
            let (lo, hi) = r.min_max();
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{}",
                r.workload,
                q(&r.metric),
                q(r.unit),
                r.higher_better,
                r.x.map_or(String::new(), |x| format!("{x}")),
                r.peer,
                r.samples.len(),
                r.median(),
                lo,
                hi,
                self.ratio_to_kernel(r).map_or(String::new(), |x| format!("{x:.4}"))
            );
        }
        s
    }

    /// Write `report.md`, `results.json` and `results.csv` into `out`,
    /// and print the report on standard output (the charts are drawn
    /// from the report by `charts::draw`).
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>, String> {
        let md = self.markdown();
        println!("{md}");
        let mut written = Vec::new();
        let mut put = |name: &str, data: &[u8]| -> Result<(), String> {
            let p = out.join(name);
            std::fs::write(&p, data).map_err(|e| format!("{}: {e}", p.display()))?;
            written.push(p);
            Ok(())
        };
        put("report.md", md.as_bytes())?;
        let json = serde_json::to_string_pretty(&self.json()).map_err(|e| e.to_string())?;
        put("results.json", json.as_bytes())?;
        put("results.csv", self.csv().as_bytes())?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(samples: &[f64]) -> Row {
        Row {
            workload: "w",
            metric: "m".into(),
            unit: "s",
            higher_better: false,
            x: None,
            peer: "lib".into(),
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn median_and_range_of_rounds() {
        assert_eq!(row(&[3.0, 1.0, 2.0]).median(), 2.0);
        // Even counts: the mean of the middle two (a peer cut short after
        // two rounds is biased neither way).
        assert_eq!(row(&[4.0, 1.0]).median(), 2.5);
        assert!(row(&[]).median().is_nan());
        assert_eq!(row(&[3.0, 1.0, 2.0]).min_max(), (1.0, 3.0));
    }

    #[test]
    fn numbers_keep_two_significant_digits() {
        assert_eq!(fmt_val(123456.7), "123457");
        assert_eq!(fmt_val(12.34), "12.3");
        assert_eq!(fmt_val(1.234), "1.23");
        assert_eq!(fmt_val(0.00031), "0.00031");
        assert_eq!(fmt_val(0.0), "0.00");
        assert_eq!(fmt_val(f64::NAN), "n/a");
    }
}
