//! The remote image as a [`BlockDevice`]: reads split into blocks, the
//! blocks' requests all started before the first is waited for, and
//! sequential streams detected for readahead.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit_blockdev::BlockDevice;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;

use crate::fetch::{run_on, Fetcher, Pending, Pin, Target};
use crate::store::{io_error, open_store, SizeQuery};
use crate::{RemoteOptions, RemoteStats};

/// How many sequential streams are followed at once: a few files copied in
/// parallel each keep their readahead.
const STREAMS: usize = 8;

/// A read-only block device over an object in remote storage; see the
/// crate documentation. Cheap to share between threads: all state is
/// behind the device's own locks.
pub struct RemoteDevice {
    fetcher: Fetcher,
    url: Arc<str>,
    size: u64,
    block_size: u64,
    readahead: u32,
    /// Longest a reader waits for one block before giving up: beyond every
    /// bound the transport has (request timeout, retries), so reached only
    /// if something is wrong with the device itself.
    wait_limit: Duration,
    bytes_read: AtomicU64,
    /// Recent streams as (end offset, bytes read in a row) and a
    /// round-robin cursor: a read that starts where one ended continues it.
    streams: Mutex<([(u64, u64); STREAMS], usize)>,
}

impl std::fmt::Debug for RemoteDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDevice")
            .field("url", &self.url)
            .field("size", &self.size)
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

impl RemoteDevice {
    /// Open `url`; see [`crate::open_url`].
    pub fn open(url: &str, opts: &RemoteOptions) -> io::Result<Self> {
        if opts.block_size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "remote block size must not be 0",
            ));
        }
        let (store, path, size_query) = open_store(url, opts)?;
        // Messages name the URL without a presigned query string.
        let url = &crate::presigned::shown(url);
        // Two workers: the work is waiting on sockets, and the machine's
        // cores belong to the filesystem above.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ext4kit-remote")
            .enable_all()
            .build()?;
        let wait_limit = opts
            .retry_timeout
            .saturating_add(opts.timeout.saturating_mul(2))
            .saturating_add(opts.connect_timeout.saturating_mul(2))
            .saturating_add(Duration::from_secs(10));
        let head = {
            let store = store.clone();
            let path = path.clone();
            run_on(&runtime, wait_limit, async move {
                match size_query {
                    SizeQuery::Head => store.head(&path).await,
                    SizeQuery::RangedGet => {
                        let first = GetOptions::new().with_range(Some(0..1));
                        store.get_opts(&path, first).await.map(|r| r.meta)
                    }
                }
            })
        };
        let meta = match head {
            Some(Ok(meta)) => meta,
            Some(Err(e)) => return Err(io_error(url, "cannot open", &e)),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{url}: cannot open: no answer within {wait_limit:?}"),
                ))
            }
        };
        let pin = Pin {
            version: meta.version.clone(),
            etag: meta.e_tag.clone().filter(|t| !t.starts_with("W/")),
        };
        let url: Arc<str> = Arc::from(url.as_str());
        let target = Target {
            store,
            path,
            url: url.clone(),
            size: meta.size,
            pin,
        };
        Ok(RemoteDevice {
            fetcher: Fetcher::new(runtime, target, opts),
            url,
            size: meta.size,
            block_size: opts.block_size,
            // Readahead only fills the cache: without one it would fetch
            // blocks just to drop them.
            readahead: if opts.cache_bytes >= opts.block_size {
                opts.readahead
            } else {
                0
            },
            wait_limit,
            bytes_read: AtomicU64::new(0),
            streams: Mutex::new(([(u64::MAX, 0); STREAMS], 0)),
        })
    }

    /// What this device has cost so far: requests, bytes fetched against
    /// bytes read, cache use. Callers report it per workload (a directory
    /// walk, one file's copy) by taking it before and after.
    pub fn stats(&self) -> RemoteStats {
        let mut s = self.fetcher.stats();
        s.bytes_read = self.bytes_read.load(Ordering::Relaxed);
        s
    }

    /// The URL the device was opened with, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many blocks to read ahead of a read at `off..end`: none unless
    /// it continues a recent read, then one per block the stream has read
    /// in a row, up to `readahead`. Ramping up keeps the filesystem's open
    /// (superblock, then group descriptors: two reads in a row) and
    /// metadata walks from fetching megabytes nobody reads, while a file
    /// copy soon has the whole window in flight.
    fn readahead_window(&self, off: u64, end: u64) -> u64 {
        let mut guard = self.streams.lock();
        let (streams, next) = &mut *guard;
        // Continuing means starting at the previous end or a little past
        // it (less than one block): a filesystem's reads of one file skip
        // over nothing larger when its extents are contiguous.
        if let Some((e, run)) = streams
            .iter_mut()
            .find(|(e, _)| *e <= off && off - *e < self.block_size)
        {
            *e = end;
            *run += end - off;
            return (*run / self.block_size).min(u64::from(self.readahead));
        }
        streams[*next] = (end, end - off);
        *next = (*next + 1) % STREAMS;
        0
    }
}

impl BlockDevice for RemoteDevice {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len() as u64;
        let end = off.checked_add(len).filter(|&e| e <= self.size).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {len} bytes at offset {off} past the end of the image ({} bytes)",
                    self.url, self.size
                ),
            )
        })?;
        if len == 0 {
            return Ok(());
        }
        self.bytes_read.fetch_add(len, Ordering::Relaxed);
        let first = off / self.block_size;
        let last = (end - 1) / self.block_size;
        // Every block's request is under way before any is waited for, so
        // a read spanning blocks costs one round trip, not one per block.
        let pending: Vec<(u64, Pending)> = (first..=last).map(|i| (i, self.fetcher.get(i))).collect();
        if self.readahead > 0 {
            for i in 1..=self.readahead_window(off, end) {
                self.fetcher.prefetch(last + i);
            }
        }
        let deadline = Instant::now() + self.wait_limit;
        for (index, p) in pending {
            let data = match p {
                Pending::Ready(d) => d,
                Pending::Wait(slot) => slot.wait(deadline, &self.url, index)?,
            };
            let range = self.fetcher.block_range(index);
            // The overlap of this block with the read, in both frames.
            let from = off.max(range.start);
            let to = end.min(range.end);
            let src = &data[(from - range.start) as usize..(to - range.start) as usize];
            buf[(from - off) as usize..(to - off) as usize].copy_from_slice(src);
        }
        Ok(())
    }

    fn write_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: remote images are read-only", self.url),
        ))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        true
    }
}
