//! Remote images as read-only block devices.
//!
//! Users keep disk images in object storage (S3 and S3-compatible servers,
//! Google Cloud Storage, Azure Blob Storage) or behind a plain web server.
//! Copying a many-gigabyte image down to list a directory or pull one file
//! out of it wastes time and bandwidth, so this crate reads the image in
//! place: [`open_url`] returns a [`RemoteDevice`], a [`BlockDevice`] that
//! turns reads into HTTP range requests of whole aligned blocks, keeps a
//! bounded LRU cache of them, reads ahead on sequential access, fetches the
//! blocks one read needs in parallel and lets concurrent readers of one
//! missing block share one request.
//!
//! The transport is Apache Arrow's `object_store`: one well-kept client that
//! knows every store's URL forms, credentials (the standard AWS, Google and
//! Azure environment variables; the AWS shared files' profile is read
//! here, `aws_profile.rs`) and request signing, and that retries
//! transient failures with backoff under a bound. It is async; the device
//! owns a small tokio runtime to drive it, so callers stay synchronous.
//!
//! Every image is read-only: writes are refused with `PermissionDenied`.
//! The engine's read-only open (a copy-on-write overlay for journal replay)
//! sits on top unchanged.
//!
//! [`BlockDevice`]: ext4kit_blockdev::BlockDevice

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod aws_profile;
mod cache;
mod device;
mod fetch;
mod presigned;
mod store;

use std::time::Duration;

pub use device::RemoteDevice;

/// How a remote image is read: the trade-offs between requests, bandwidth
/// and local memory are the caller's to make, since they differ between a
/// directory walk (many small scattered reads) and a bulk copy (long runs).
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Upper bound on the bytes of fetched blocks kept in memory. Blocks
    /// being handed to a reader are not counted; everything kept for reuse
    /// is. Zero disables caching (every read goes to the network).
    pub cache_bytes: u64,
    /// The fetch unit: every request asks for one whole block aligned to
    /// this size (the last block of the image may be shorter). Larger blocks
    /// mean fewer requests but more bytes fetched that nobody reads.
    pub block_size: u64,
    /// Blocks fetched beyond the end of a sequential read before they are
    /// asked for, so a streaming copy does not wait for each request.
    pub readahead: u32,
    /// Requests in flight at once for this device, readahead included.
    pub parallel: usize,
    /// Longest one request may take, body included, before it is abandoned
    /// (and retried): a stalled server must not hang a reader.
    pub timeout: Duration,
    /// Longest connection set-up may take.
    pub connect_timeout: Duration,
    /// Retries of a request that failed transiently (connection errors,
    /// timeouts, 5xx, throttling); errors such as 404 or 403 are not retried.
    pub retries: usize,
    /// Bound on the time spent retrying one request, whatever `retries`.
    pub retry_timeout: Duration,
    /// Extra store settings as `(key, value)` pairs, in `object_store`'s
    /// spelling (`aws_endpoint`, `aws_allow_http`, `aws_region`,
    /// `google_service_account`, `azure_storage_account_name`, ...). They
    /// override the environment, which overrides the defaults; an unknown
    /// key is an error rather than silently ignored.
    pub store_options: Vec<(String, String)>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            cache_bytes: 64 << 20,
            block_size: 1 << 20,
            readahead: 4,
            parallel: 8,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retries: 3,
            retry_timeout: Duration::from_secs(30),
            store_options: Vec::new(),
        }
    }
}

/// Counters of one device, for reporting what a workload cost on the wire
/// (bytes fetched against bytes the caller needed, and requests made).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Range requests sent (one per block fetched; retries inside one
    /// request are not counted separately). The size query at open is not
    /// counted either.
    pub requests: u64,
    /// Bytes received in range responses.
    pub bytes_fetched: u64,
    /// Bytes the caller asked for through `read_at`.
    pub bytes_read: u64,
    /// Block lookups served from the cache.
    pub cache_hits: u64,
    /// Block lookups that had to wait for the network (their own request or
    /// another reader's).
    pub cache_misses: u64,
    /// Misses that joined a request already in flight for the same block
    /// instead of sending another.
    pub coalesced: u64,
    /// Requests sent for readahead rather than for a waiting reader.
    pub readahead_requests: u64,
    /// Requests that ended in an error (after the transport's retries).
    pub errors: u64,
    /// Bytes of blocks held in the cache now.
    pub cached_bytes: u64,
    /// The most bytes the cache ever held: never above `cache_bytes`.
    pub cached_bytes_peak: u64,
}

/// Whether `s` names a remote image rather than a local path, so a CLI can
/// take either in the same argument. True for the schemes this crate opens:
/// `http://`, `https://`, `s3://`, `s3a://`, `gs://`, and Azure's `az://`,
/// `azure://`, `abfs://`, `abfss://`, `adl://`.
pub fn is_url(s: &str) -> bool {
    store::scheme_of(s).is_some()
}

/// Open the image at `url` read-only.
///
/// One request learns the image's size (a HEAD, or the store's
/// equivalent; for a presigned URL a GET of the first byte), so a missing
/// object is `NotFound` and a refused one `PermissionDenied` here, at
/// open, rather than at the first read. Credentials and endpoints come
/// from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_*`,
/// `AZURE_*`), for S3 also from the AWS shared files' profile
/// (`~/.aws/credentials`, `~/.aws/config`, `AWS_PROFILE`; the environment
/// wins), and from [`RemoteOptions::store_options`]. An http(s) URL with
/// a query string (a presigned URL) needs none: the query string goes
/// with every request.
pub fn open_url(url: &str, opts: &RemoteOptions) -> std::io::Result<RemoteDevice> {
    RemoteDevice::open(url, opts)
}
