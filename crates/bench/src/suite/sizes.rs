//! How big each workload is: the original experiments' sizes by default,
//! and a
//! `--quick` preset that keeps every workload and peer but finishes in a
//! few minutes on a 2-core machine (for CI: that it runs, not its numbers).

/// Every size the workloads use.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Rounds: each peer runs each workload this many times, interleaved.
    pub runs: usize,
    /// A peer whose round of a workload takes at least this long is not
    /// repeated for that workload (fuse2fs needs minutes for some).
    pub long_run_secs: u64,
    /// Thread counts of the lseek and storm scaling curves.
    pub threads: Vec<usize>,
    /// lseek: seeks per thread.
    pub lseek_ops: usize,
    /// storm: open/read/close per thread.
    pub storm_ops: usize,
    /// dpath: d_path calls per thread (while one thread renames).
    pub dpath_ops: usize,
    /// dd: one-byte writes.
    pub dd_count: u64,
    /// fsync: file sizes in 2 KiB blocks.
    pub fsync_blocks: Vec<u64>,
    /// fsync: write+sync operations per file size and sync kind.
    pub fsync_ops: usize,
    /// create: files created in one directory.
    pub create_max: u64,
    /// create: the linear peers (kernel ext2, fuse2fs, whose inserts
    /// scan the directory) stop here: their creates are O(n).
    pub create_linear_max: u64,
    /// lookup: directory sizes for lookups.
    pub lookup_sizes: Vec<usize>,
    /// lookup: lookups measured per directory (htree).
    pub lookup_probes: usize,
    /// Sequential write/read, MiB.
    pub seq_mib: u64,
    /// fio: file size, MiB.
    pub fio_mib: u64,
    /// fio: seconds of each of randread and randwrite.
    pub fio_secs: u64,
    /// untar/find/rm: directories of the generated tree.
    pub tree_dirs: usize,
    /// untar/find/rm: files of the generated tree.
    pub tree_files: usize,
    /// Parallel creates: thread counts.
    pub pcreate_threads: Vec<usize>,
    /// Parallel creates: files per thread (each thread its own directory).
    pub pcreate_files: usize,
    /// fsync-heavy small files: thread counts.
    pub fsmall_threads: Vec<usize>,
    /// fsync-heavy small files: files per thread.
    pub fsmall_files: usize,
}

/// 1, 2, 4, … up to `n`, and `n` itself.
fn doubling(n: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut k = 1;
    while k < n {
        v.push(k);
        k *= 2;
    }
    v.push(n);
    v
}

/// The machine's CPUs (at least 2, so a scaling curve has two points).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

impl Sizes {
    /// The sizes as JSON, for the record in the report.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "runs": self.runs,
            "long_run_secs": self.long_run_secs,
            "threads": self.threads,
            "lseek_ops": self.lseek_ops,
            "storm_ops": self.storm_ops,
            "dpath_ops": self.dpath_ops,
            "dd_count": self.dd_count,
            "fsync_blocks": self.fsync_blocks,
            "fsync_ops": self.fsync_ops,
            "create_max": self.create_max,
            "create_linear_max": self.create_linear_max,
            "lookup_sizes": self.lookup_sizes,
            "lookup_probes": self.lookup_probes,
            "seq_mib": self.seq_mib,
            "fio_mib": self.fio_mib,
            "fio_secs": self.fio_secs,
            "tree_dirs": self.tree_dirs,
            "tree_files": self.tree_files,
            "pcreate_threads": self.pcreate_threads,
            "pcreate_files": self.pcreate_files,
            "fsmall_threads": self.fsmall_threads,
            "fsmall_files": self.fsmall_files,
        })
    }

    /// The sizes of the original kernel-patch experiments (the full run
    /// takes over an hour on a 2-core VM, most of it the 1,000,000-file
    /// directory through the mounts).
    pub fn full() -> Self {
        Sizes {
            runs: 3,
            // The 1,000,000-file directory through a mount takes minutes:
            // one such round is enough (a long run averages itself).
            long_run_secs: 300,
            threads: doubling(cpus()),
            lseek_ops: 1_000_000,
            storm_ops: 100_000,
            dpath_ops: 200_000,
            dd_count: 1 << 20,
            fsync_blocks: vec![5_000, 50_000],
            fsync_ops: 1_000,
            create_max: 1_000_000,
            create_linear_max: 30_000,
            lookup_sizes: vec![1_000, 10_000, 50_000],
            lookup_probes: 2_000,
            seq_mib: 1024,
            fio_mib: 1024,
            fio_secs: 5,
            tree_dirs: 2_000,
            tree_files: 30_000,
            pcreate_threads: doubling(cpus().max(4)),
            pcreate_files: 20_000,
            fsmall_threads: doubling(cpus().max(8)),
            fsmall_files: 200,
        }
    }

    /// Every workload and peer, small: a few minutes on a 2-core VM.
    pub fn quick() -> Self {
        Sizes {
            runs: 2,
            long_run_secs: 120,
            threads: vec![1, 2],
            lseek_ops: 100_000,
            storm_ops: 5_000,
            dpath_ops: 5_000,
            dd_count: 1 << 14,
            fsync_blocks: vec![500, 5_000],
            fsync_ops: 40,
            create_max: 10_000,
            create_linear_max: 5_000,
            lookup_sizes: vec![1_000, 5_000],
            lookup_probes: 300,
            seq_mib: 32,
            fio_mib: 32,
            fio_secs: 1,
            tree_dirs: 50,
            tree_files: 500,
            pcreate_threads: vec![1, 2],
            pcreate_files: 500,
            fsmall_threads: vec![1, 2],
            fsmall_files: 10,
        }
    }
}
