//! The report's scaling notes: these machines have 2 vCPUs, so for each
//! curve we write down which shared state is still on its path in ext4kit
//! and how the curve should continue on a 64-core machine — what a reader
//! with a big machine should look for first. Written from the code as it
//! stands; refine them as the code changes.

/// One note.
pub struct Note {
    /// The workload it belongs to.
    pub workload: &'static str,
    /// Which curve.
    pub curve: &'static str,
    /// Shared state that remains on the path.
    pub shared: &'static str,
    /// How it should continue on 64 cores, and what to try.
    pub at_64: &'static str,
}

/// Every note, in report order.
pub const NOTES: &[Note] = &[
    Note {
        workload: "lseek",
        curve: "lseek, seeks/s against threads",
        shared: "nothing written: SEEK_SET/SEEK_CUR store the open file's own atomic position; \
                 SEEK_END reads the inode's size atomically (a shared line, read-only). The \
                 i_mutex baseline shows what one lock per inode costs.",
        at_64: "linear in threads. If it is not, look for false sharing between File objects \
                allocated next to each other (pad the position to a cache line) and at the \
                Arc<Fs> the call takes (it must not be cloned per call).",
    },
    Note {
        workload: "storm",
        curve: "storm, open/read/close of the same files against threads",
        shared: "on the library, nothing when a thread opens a file it opened before: the walk \
                 borrows dentries under an epoch guard, the open counts itself on the thread's \
                 own pin (vfs::pin) and then checks by reading that the walk's dentry is still \
                 cached, a read from cached pages takes no reference, the close drops the pin's \
                 own count. A thread's first open of a file makes a pin (the inode's lock, its \
                 open count, the pin registry: shared writes), as does every open of a thread \
                 cycling through more than 8 files. Through a mount, the kernel's own dentry \
                 and inode references (lockref) and the FUSE round trip are on the path.",
        at_64: "the library's curve should follow lib:shared-nothing's (the lseek workload's \
                seeks run beside it in the same rounds; the report prints the storm's scaling as a \
                percentage of theirs, target 90%, and the counted shared writes per open). If it \
                does not, look for a shared line the count misses (perf c2c where counters \
                exist) before anything else.",
    },
    Note {
        workload: "dpath",
        curve: "dpath, d_path against threads with one renamer",
        shared: "the rename sequence count (read by every d_path, written by every rename) and the \
                 names of the dentries on the path; a d_path that retries too often falls back to \
                 the rename lock shared (FsStats::d_path_fallbacks counts it).",
        at_64: "readers scale while renames are rare; with one renamer the retry rate grows with \
                the chain length, not the reader count. Watch the fallback count: if it rises \
                with threads, the shared fallback lock is the next bottleneck.",
    },
    Note {
        workload: "dd",
        curve: "dd, one-byte writes",
        shared: "an unshared descriptor table takes no atomic per call; a shared one reads the \
                 table lock-free and takes a reference only when the file must outlive the call. \
                 Each write then takes the inode's write lock and dirties the same page. Through \
                 a mount every write is a FUSE round trip (the default mount is write-through).",
        at_64: "single-threaded by nature; on many cores the shared-table cost should stay a \
                constant few ns. Through the mount the figure is the round trip, which io_uring \
                queues and a writeback cache change, not core count.",
    },
    Note {
        workload: "fsync",
        curve: "fsync, fsync time against file size",
        shared: "each inode's dirty set (so the cost is O(dirty), not O(cached)); then the one \
                 journal: a commit writes the log and waits for two device flushes.",
        at_64: "one file, one thread: flat against file size regardless of cores. Many files \
                fsync'd at once share commits (see fsmall); the device flush is the floor.",
    },
    Note {
        workload: "create",
        curve: "create, creates/s against directory size",
        shared: "the directory's lock (one writer per directory, as i_rwsem), the inode and block \
                 allocators' per-group locks, the journal's running transaction, and the inode \
                 and dentry cache maps, whose eviction runs on a background worker (freed \
                 entries are reclaimed in batches with membarrier(2), which interrupts every CPU \
                 running one of our threads).",
        at_64: "one directory is one writer on any machine: the curve should stay flat with \
                size, not rise with cores. Watch the membarrier cost: it grows with the number \
                of CPUs our threads run on, so reclamation batches may need to grow with it.",
    },
    Note {
        workload: "lookup",
        curve: "lookup, lookup time against directory size",
        shared: "the cached directory blocks (read-only once cached and checked) and the dentry \
                 cache's map, into which every miss inserts a new dentry.",
        at_64: "lookups of different names from many threads should scale: the htree descent \
                reads shared blocks without writing them; the dentry-map insert is the one \
                shared write, spread over the map's buckets.",
    },
    Note {
        workload: "seq",
        curve: "sequential write and cold read",
        shared: "one file: its inode lock and page map; the block allocator's group lock; one \
                 FUSE connection for the mount (request size bounded by max_write).",
        at_64: "bound by the device and memory bandwidth, not cores; through the mount by the \
                request size and the number of server threads that can copy in parallel.",
    },
    Note {
        workload: "fio",
        curve: "random 4 KiB reads and writes, 2 jobs",
        shared: "both jobs share one file: reads look pages up lock-free, writes take the inode's \
                 write lock and dirty-set entries; the journal for block allocation on first write.",
        at_64: "with numjobs=64 on one file, reads should scale and writes serialise on the inode \
                lock (as the kernel's i_rwsem); a job per file should scale both.",
    },
    Note {
        workload: "tree",
        curve: "untar, find, rm -rf",
        shared: "every request of the mount goes through one FUSE connection, served by \
                 --threads server threads; untar sends about eleven requests per file.",
        at_64: "one tar is one thread; parallel untars need more server threads and FUSE \
                parallel directory operations; io_uring's per-CPU queues remove the shared \
                /dev/fuse queue.",
    },
    Note {
        workload: "pcreate",
        curve: "parallel creates in separate directories against threads",
        shared: "no directory lock in common, but the inode allocator (groups chosen per parent \
                 directory), the journal's running transaction (handle start/stop), the cache \
                 maps and the global cache-budget counters.",
        at_64: "should scale until handle accounting on the running transaction or the budget \
                counters become the hot lines: per-CPU credits (as jbd2's) and sharded counters \
                are the next step.",
    },
    Note {
        workload: "fsmall",
        curve: "fsync-heavy small files against threads",
        shared: "the journal: concurrent fsyncs join one commit (group commit), so commits per \
                 fsync fall below one as threads grow; each commit waits for device flushes.",
        at_64: "files/s should grow with threads as commits batch more fsyncs, until the commit \
                thread's log writing or the device saturates; the batching window is the knob.",
    },
];
