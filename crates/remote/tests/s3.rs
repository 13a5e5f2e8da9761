//! Remote images in S3, served by moto's S3 server (a real HTTP server,
//! PyPI `moto[server]`) on 127.0.0.1, reached through `s3://` URLs with
//! the endpoint and credentials in the standard AWS environment variables.

mod common;

use std::io;
use std::sync::{mpsc, Once};
use std::time::{Duration, Instant};

use common::{check_random_reads, image_bytes, Moto};
use ext4kit_blockdev::BlockDevice;
use ext4kit_remote::{is_url, open_url, RemoteOptions};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::ObjectStoreExt;

/// Point the AWS variables at `moto`, once per process: the environment is
/// process-wide, and it is set before any test reads it.
fn aws_env(moto: &Moto) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
        std::env::set_var("AWS_ALLOW_HTTP", "true");
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_REGION", "us-east-1");
    });
}

/// Upload `data` as `bucket/key` with the S3 API (object_store's put).
fn upload(moto: &Moto, bucket: &str, key: &str, data: Vec<u8>) {
    let store = AmazonS3Builder::new()
        .with_endpoint(moto.endpoint())
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .expect("S3 client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(store.put(&Path::from(key), data.into())).expect("upload");
}

#[test]
fn s3_image_reads_match_and_errors_are_clear() {
    let mut moto = Moto::start();
    moto.create_bucket("images");
    let data = image_bytes(6 * 1024 * 1024 + 777, 11);
    upload(&moto, "images", "disks/disk.img", data.clone());
    aws_env(&moto);

    let url = "s3://images/disks/disk.img";
    assert!(is_url(url));
    let opts = RemoteOptions {
        block_size: 256 * 1024,
        cache_bytes: 2 * 1024 * 1024,
        readahead: 2,
        parallel: 4,
        ..RemoteOptions::default()
    };
    let dev = open_url(url, &opts).expect("open s3 image");
    assert_eq!(dev.size(), data.len() as u64);
    let read = check_random_reads(&dev, &data, 4, 60, 600 * 1024, 21);
    let s = dev.stats();
    eprintln!("s3 random reads: {s:?}");
    assert_eq!(s.bytes_read, read);
    assert!(s.cached_bytes_peak <= opts.cache_bytes, "{s:?}");
    assert!(s.cache_hits > 0);
    assert_eq!(s.errors, 0);

    // A missing key, and a missing bucket.
    let e = open_url("s3://images/disks/nope.img", &opts).expect_err("missing key");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("s3://images/disks/nope.img"), "{e}");
    eprintln!("{e}");
    let e = open_url("s3://no-bucket/disk.img", &opts).expect_err("missing bucket");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

    // The server dies while readers wait on fresh blocks: errors, no hang.
    let opts = RemoteOptions {
        block_size: 64 * 1024,
        cache_bytes: 0,
        timeout: Duration::from_secs(5),
        retries: 2,
        retry_timeout: Duration::from_secs(3),
        ..RemoteOptions::default()
    };
    let dev = open_url(url, &opts).expect("open again");
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let dev = &dev;
            let tx = tx.clone();
            let len = data.len() as u64;
            s.spawn(move || {
                // Keep reading until the server is gone.
                let mut buf = vec![0u8; 100 * 1024];
                let start = Instant::now();
                let mut off = t * 1024 * 1024;
                let r = loop {
                    if let Err(e) = dev.read_at(off, &mut buf) {
                        break Err(e);
                    }
                    if start.elapsed() > Duration::from_secs(30) {
                        break Ok(());
                    }
                    off = (off + 333 * 1024) % (len - buf.len() as u64);
                };
                let _ = tx.send(r);
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        moto.kill();
        let killed = Instant::now();
        for _ in 0..3 {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Err(e)) => {
                    eprintln!("after {:?}: {:?}: {e}", killed.elapsed(), e.kind());
                    assert!(e.to_string().contains(url), "{e}");
                }
                Ok(Ok(())) => panic!("reads went on succeeding after the server died"),
                Err(_) => panic!("a read hung after the server died"),
            }
        }
    });
}

#[test]
fn a_presigned_s3_url_reads_as_the_object_without_credentials() {
    let moto = Moto::start();
    moto.create_bucket("shared");
    let data = image_bytes(2 * 1024 * 1024 + 99, 13);
    upload(&moto, "shared", "vm/disk.img", data.clone());
    // What `aws s3 presign` prints: a plain http(s) URL whose query string
    // is the SigV4 credential.
    let url = moto.presigned_url("shared", "vm/disk.img");
    assert!(
        url.starts_with(&moto.endpoint()) && url.contains("X-Amz-Signature="),
        "{url}"
    );
    let opts = RemoteOptions {
        block_size: 128 * 1024,
        ..RemoteOptions::default()
    };
    let dev = open_url(&url, &opts).expect("open the presigned URL");
    assert_eq!(dev.size(), data.len() as u64);
    check_random_reads(&dev, &data, 2, 40, 300 * 1024, 4);
    assert_eq!(dev.stats().errors, 0);
}
