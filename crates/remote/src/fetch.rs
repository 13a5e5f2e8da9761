//! Fetching blocks: range requests on the device's runtime, at most
//! `parallel` at once, one request per block however many readers want it.
//!
//! Readers are synchronous threads (FUSE workers, the CLI). A block is
//! looked up under one lock that covers both the cache and the table of
//! blocks in flight, so a reader either finds the block, joins the request
//! already out for it, or sends the request itself; never two requests for
//! one block at once. Requests run as tasks on a runtime the device owns and
//! hand their result to a slot the readers wait on with a condition
//! variable, so no reader calls `block_on` (which would panic if the caller
//! itself runs inside a tokio runtime).

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore};
use parking_lot::{Condvar, Mutex};
use tokio::sync::Semaphore;

use crate::cache::BlockCache;
use crate::store::io_error;
use crate::{RemoteOptions, RemoteStats};

/// What a finished request left for its waiters: the block, or an error
/// kept as kind and text so every waiter gets its own `io::Error`.
type Outcome = Result<Bytes, (io::ErrorKind, String)>;

/// One block in flight; its waiters block on `cv` until `outcome` is set.
pub(crate) struct Slot {
    outcome: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Slot {
    fn new() -> Arc<Self> {
        Arc::new(Slot {
            outcome: Mutex::new(None),
            cv: Condvar::new(),
        })
    }

    fn complete(&self, outcome: Outcome) {
        *self.outcome.lock() = Some(outcome);
        self.cv.notify_all();
    }

    /// The block, once its request has finished, or `TimedOut` at
    /// `deadline`: the transport's own timeouts and retry bounds end every
    /// request well before, so this only guards against a bug leaving a
    /// reader blocked forever.
    pub(crate) fn wait(&self, deadline: Instant, url: &str, index: u64) -> io::Result<Bytes> {
        let mut guard = self.outcome.lock();
        loop {
            if let Some(outcome) = guard.as_ref() {
                return outcome.clone().map_err(|(kind, msg)| io::Error::new(kind, msg));
            }
            if self.cv.wait_until(&mut guard, deadline).timed_out() && guard.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{url}: block {index}: no answer in time"),
                ));
            }
        }
    }
}

/// A block a reader asked for: at hand, or on its way.
pub(crate) enum Pending {
    Ready(Bytes),
    Wait(Arc<Slot>),
}

struct State {
    cache: BlockCache,
    inflight: HashMap<u64, Arc<Slot>>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes_fetched: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    coalesced: AtomicU64,
    readahead_requests: AtomicU64,
    errors: AtomicU64,
}

/// Everything the request tasks share with the readers.
struct Shared {
    state: Mutex<State>,
    counters: Counters,
}

/// Which version of the object every request must read, so that an image
/// replaced while mounted is an error rather than a silent mix of old and
/// new blocks.
#[derive(Clone, Default)]
pub(crate) struct Pin {
    /// The store's object version (S3 versioned buckets), preferred.
    pub(crate) version: Option<String>,
    /// A strong ETag, sent as `If-Match`. Weak ones (`W/"..."`) never
    /// match under If-Match's strong comparison, so they are not used.
    pub(crate) etag: Option<String>,
}

/// The object a fetcher reads, as found at open.
pub(crate) struct Target {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: Path,
    pub(crate) url: Arc<str>,
    pub(crate) size: u64,
    pub(crate) pin: Pin,
}

/// The block fetcher of one remote image.
pub(crate) struct Fetcher {
    /// Kept first so it is dropped first: its tasks hold the store.
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    path: Path,
    url: Arc<str>,
    size: u64,
    block_size: u64,
    pin: Pin,
    permits: Arc<Semaphore>,
    shared: Arc<Shared>,
}

impl Fetcher {
    pub(crate) fn new(runtime: tokio::runtime::Runtime, target: Target, opts: &RemoteOptions) -> Self {
        Fetcher {
            runtime,
            store: target.store,
            path: target.path,
            url: target.url,
            size: target.size,
            block_size: opts.block_size,
            pin: target.pin,
            permits: Arc::new(Semaphore::new(opts.parallel.max(1))),
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    cache: BlockCache::new(opts.cache_bytes),
                    inflight: HashMap::new(),
                }),
                counters: Counters::default(),
            }),
        }
    }

    /// Block `index` from the cache, or the slot of the request fetching it
    /// (joining one in flight, or sending a new one).
    pub(crate) fn get(&self, index: u64) -> Pending {
        let c = &self.shared.counters;
        let mut st = self.shared.state.lock();
        if let Some(data) = st.cache.get(index) {
            c.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Pending::Ready(data);
        }
        c.cache_misses.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = st.inflight.get(&index) {
            c.coalesced.fetch_add(1, Ordering::Relaxed);
            return Pending::Wait(slot.clone());
        }
        let slot = Slot::new();
        st.inflight.insert(index, slot.clone());
        drop(st);
        self.spawn(index, slot.clone());
        Pending::Wait(slot)
    }

    /// Start fetching block `index` into the cache unless it is there or on
    /// its way; nobody waits for it.
    pub(crate) fn prefetch(&self, index: u64) {
        if index.saturating_mul(self.block_size) >= self.size {
            return;
        }
        let mut st = self.shared.state.lock();
        if st.cache.contains(index) || st.inflight.contains_key(&index) {
            return;
        }
        let slot = Slot::new();
        st.inflight.insert(index, slot.clone());
        drop(st);
        self.shared.counters.readahead_requests.fetch_add(1, Ordering::Relaxed);
        self.spawn(index, slot);
    }

    /// The byte range of block `index`; the last block ends with the image.
    pub(crate) fn block_range(&self, index: u64) -> Range<u64> {
        let start = index * self.block_size;
        start..(start + self.block_size).min(self.size)
    }

    fn spawn(&self, index: u64, slot: Arc<Slot>) {
        let range = self.block_range(index);
        let store = self.store.clone();
        let path = self.path.clone();
        let url = self.url.clone();
        let pin = self.pin.clone();
        let size = self.size;
        let permits = self.permits.clone();
        let shared = self.shared.clone();
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.runtime.spawn(async move {
            // The semaphore is never closed, so acquiring only waits.
            let _permit = permits.acquire_owned().await;
            let outcome = fetch_range(&*store, &path, &url, &pin, range, size).await;
            let mut st = shared.state.lock();
            match &outcome {
                Ok(data) => {
                    shared
                        .counters
                        .bytes_fetched
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    // Cached before leaving the in-flight table, both under
                    // the lock, so no reader can miss it in between.
                    st.cache.insert(index, data.clone());
                }
                Err(_) => {
                    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            st.inflight.remove(&index);
            drop(st);
            slot.complete(outcome);
        });
    }

    pub(crate) fn stats(&self) -> RemoteStats {
        let c = &self.shared.counters;
        let (cached_bytes, cached_bytes_peak) = {
            let st = self.shared.state.lock();
            (st.cache.used(), st.cache.peak())
        };
        RemoteStats {
            requests: c.requests.load(Ordering::Relaxed),
            bytes_fetched: c.bytes_fetched.load(Ordering::Relaxed),
            bytes_read: 0,
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            cache_misses: c.cache_misses.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
            readahead_requests: c.readahead_requests.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            cached_bytes,
            cached_bytes_peak,
        }
    }
}

/// Run `fut` on `runtime` and wait for it from a plain thread, at most
/// `limit`; `None` if it did not finish in time.
pub(crate) fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    limit: Duration,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        // The receiver may have given up; nothing to do then.
        let _ = tx.send(fut.await);
    });
    rx.recv_timeout(limit).ok()
}

/// One range request, checked to have returned exactly the bytes asked
/// for: a server that sends fewer (a body cut short, an object smaller
/// than its size at open said) is an error naming the URL and the range,
/// never a block padded with zeros.
async fn fetch_range(
    store: &dyn ObjectStore,
    path: &Path,
    url: &str,
    pin: &Pin,
    range: Range<u64>,
    size: u64,
) -> Outcome {
    let what = format!("reading bytes {}..{}", range.start, range.end);
    let fail = |e: &object_store::Error| {
        let e = io_error(url, &what, e);
        (e.kind(), e.to_string())
    };
    let mut opts = GetOptions::new().with_range(Some(range.clone()));
    if pin.version.is_some() {
        opts = opts.with_version(pin.version.clone());
    } else {
        opts = opts.with_if_match(pin.etag.clone());
    }
    let result = store.get_opts(path, opts).await.map_err(|e| fail(&e))?;
    // The object's size by this response's Content-Range.
    let now = result.meta.size;
    let data = result.bytes().await.map_err(|e| fail(&e))?;
    let want = range.end - range.start;
    if data.len() as u64 != want {
        let why = if now != size {
            format!(" (this response gives the object's size as {now} bytes; at open it was {size})")
        } else {
            String::new()
        };
        return Err((
            io::ErrorKind::InvalidData,
            format!("{url}: {what}: the server sent {} bytes, not {want}{why}", data.len()),
        ));
    }
    Ok(data)
}
