//! Remote images over plain HTTP, served by a real nginx on 127.0.0.1.

mod common;

use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{check_random_reads, image_bytes, Nginx};
use ext4kit_blockdev::BlockDevice;
use ext4kit_remote::{is_url, open_url, RemoteOptions};

/// Range requests nginx answered with 206, from its access log.
fn ranged(nginx: &Nginx, name: &str) -> usize {
    nginx
        .access_log()
        .iter()
        .filter(|l| l.contains(&format!("GET /{name} ")) || l.contains(&format!("/{name} HTTP")))
        .filter(|l| l.contains("\" 206 "))
        .count()
}

#[test]
fn random_reads_from_threads_match_the_file() {
    let nginx = Nginx::start();
    // Not a multiple of the block size: the last block is short.
    let data = image_bytes(10 * 1024 * 1024 + 12345, 1);
    nginx.put("disk.img", &data);
    let opts = RemoteOptions {
        block_size: 64 * 1024,
        cache_bytes: 1024 * 1024,
        readahead: 2,
        parallel: 4,
        ..RemoteOptions::default()
    };
    let url = nginx.url("/disk.img");
    assert!(is_url(&url));
    let dev = open_url(&url, &opts).expect("open");
    assert_eq!(dev.size(), data.len() as u64);
    assert!(dev.read_only());

    let read = check_random_reads(&dev, &data, 4, 150, 200 * 1024, 7);
    let s = dev.stats();
    eprintln!("random reads: {s:?}");
    assert_eq!(s.bytes_read, read);
    assert!(s.cached_bytes_peak <= opts.cache_bytes, "cache over its bound: {s:?}");
    assert!(s.cached_bytes <= opts.cache_bytes);
    assert!(s.cache_hits > 0, "{s:?}");
    assert_eq!(s.errors, 0);
    // Every request is one whole block, answered 206 by nginx.
    assert_eq!(ranged(&nginx, "disk.img") as u64, s.requests, "requests vs access log");
    assert!(s.bytes_fetched <= s.requests * opts.block_size);

    // The ends of the image.
    let mut tail = vec![0u8; 100];
    dev.read_at(data.len() as u64 - 100, &mut tail).expect("last bytes");
    assert_eq!(tail, data[data.len() - 100..]);
    let e = dev
        .read_at(data.len() as u64 - 99, &mut tail)
        .expect_err("past the end");
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    let e = dev.read_at(u64::MAX - 10, &mut tail).expect_err("overflow");
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    dev.read_at(data.len() as u64, &mut []).expect("empty read at the end");
    let e = dev.write_at(0, b"x").expect_err("write");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
}

#[test]
fn sequential_read_fetches_each_block_once_with_readahead() {
    let nginx = Nginx::start();
    let data = image_bytes(8 * 1024 * 1024, 2);
    nginx.put("seq.img", &data);
    let opts = RemoteOptions {
        block_size: 256 * 1024,
        cache_bytes: 4 * 1024 * 1024,
        readahead: 4,
        ..RemoteOptions::default()
    };
    let dev = open_url(&nginx.url("/seq.img"), &opts).expect("open");
    let mut buf = vec![0u8; 128 * 1024];
    let mut off = 0;
    while off < data.len() {
        dev.read_at(off as u64, &mut buf).expect("read");
        assert!(buf == data[off..off + buf.len()]);
        off += buf.len();
    }
    let s = dev.stats();
    eprintln!("sequential 8 MiB in 128 KiB reads, 256 KiB blocks: {s:?}");
    assert_eq!(s.requests, 32, "each block once: {s:?}");
    assert_eq!(s.bytes_fetched, data.len() as u64);
    assert!(s.readahead_requests >= 20, "readahead did the fetching: {s:?}");
    assert!(s.cached_bytes_peak <= opts.cache_bytes);
}

#[test]
fn concurrent_misses_of_one_block_share_one_request() {
    let nginx = Nginx::start();
    let data = image_bytes(1024 * 1024, 3);
    nginx.put("one.img", &data);
    let opts = RemoteOptions {
        block_size: 1024 * 1024,
        readahead: 0,
        ..RemoteOptions::default()
    };
    // Through /slow/ the one request takes about two seconds: all readers
    // arrive while it is in flight.
    let dev = open_url(&nginx.url("/slow/one.img"), &opts).expect("open");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let dev = &dev;
            let data = &data;
            s.spawn(move || {
                let off = t * 4096;
                let mut buf = vec![0u8; 4096];
                dev.read_at(off, &mut buf).expect("read");
                assert!(buf == data[off as usize..off as usize + 4096]);
            });
        }
    });
    let s = dev.stats();
    eprintln!("8 readers of one block: {s:?}");
    assert_eq!(s.requests, 1, "{s:?}");
    assert_eq!(s.coalesced + s.cache_hits, 7, "{s:?}");
    assert_eq!(ranged(&nginx, "slow/one.img"), 1);
}

#[test]
fn no_cache_still_reads_correctly() {
    let nginx = Nginx::start();
    let data = image_bytes(3 * 1024 * 1024 + 1, 4);
    nginx.put("nocache.img", &data);
    let opts = RemoteOptions {
        block_size: 128 * 1024,
        cache_bytes: 0,
        ..RemoteOptions::default()
    };
    let dev = open_url(&nginx.url("/nocache.img"), &opts).expect("open");
    check_random_reads(&dev, &data, 3, 30, 300 * 1024, 9);
    let s = dev.stats();
    assert_eq!(s.cached_bytes_peak, 0);
    assert_eq!(s.cache_hits, 0);
    assert_eq!(s.readahead_requests, 0);
}

#[test]
fn missing_image_is_not_found_and_names_the_url() {
    let nginx = Nginx::start();
    let url = nginx.url("/no-such.img");
    let e = open_url(&url, &RemoteOptions::default()).expect_err("missing");
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&url), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn forbidden_image_is_permission_denied_with_the_status() {
    let nginx = Nginx::start();
    nginx.put("secret.img", b"x");
    let url = nginx.url("/forbidden/secret.img");
    let e = open_url(&url, &RemoteOptions::default()).expect_err("forbidden");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&url) && msg.contains("403"), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn nothing_listening_is_an_error_in_bounded_time() {
    let port = common::free_port();
    let opts = RemoteOptions {
        retries: 2,
        retry_timeout: Duration::from_secs(3),
        ..RemoteOptions::default()
    };
    let start = Instant::now();
    let e = open_url(&format!("http://127.0.0.1:{port}/x.img"), &opts).expect_err("refused");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    eprintln!("{:?}: {e}", e.kind());
}

#[test]
fn transient_503s_are_retried() {
    let nginx = Nginx::start();
    // 16 blocks, 4 at once, against 20 requests a second: most first
    // tries of a burst are refused, and the retries (object_store's
    // jittered backoff) get through. More blocks at once made the last
    // retries of a loaded machine run out (10 in 2.6 s) now and then.
    let data = image_bytes(1024 * 1024, 5);
    nginx.put("busy.img", &data);
    let opts = RemoteOptions {
        block_size: 64 * 1024,
        readahead: 0,
        parallel: 4,
        retries: 10,
        retry_timeout: Duration::from_secs(30),
        ..RemoteOptions::default()
    };
    let dev = open_url(&nginx.url("/limited/busy.img"), &opts).expect("open");
    let mut buf = vec![0u8; data.len()];
    dev.read_at(0, &mut buf).expect("read through 503s");
    assert!(buf == data);
    let refused = nginx.access_log().iter().filter(|l| l.contains("\" 503 ")).count();
    let s = dev.stats();
    eprintln!("503 answers retried: {refused}; {s:?}");
    assert!(refused > 0, "the rate limit never triggered: the test proves nothing");
    assert_eq!(s.requests, 16);
    assert_eq!(s.errors, 0);
}

#[test]
fn server_dying_mid_read_is_an_error_not_a_hang() {
    let mut nginx = Nginx::start();
    let data = image_bytes(16 * 1024 * 1024, 6);
    nginx.put("dying.img", &data);
    let opts = RemoteOptions {
        block_size: 1024 * 1024,
        timeout: Duration::from_secs(5),
        retries: 2,
        retry_timeout: Duration::from_secs(3),
        ..RemoteOptions::default()
    };
    // At 512 KiB/s a 1 MiB block takes two seconds: the kill lands while
    // bodies are streaming.
    let dev = open_url(&nginx.url("/slow/dying.img"), &opts).expect("open");
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let dev = &dev;
            let tx = tx.clone();
            s.spawn(move || {
                let mut buf = vec![0u8; 3 * 1024 * 1024];
                let r = dev.read_at(t * 4 * 1024 * 1024, &mut buf);
                let _ = tx.send(r.map(|_| ()));
            });
        }
        std::thread::sleep(Duration::from_millis(700));
        nginx.kill();
        let killed = Instant::now();
        let mut errors = Vec::new();
        for _ in 0..4 {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Err(e)) => errors.push(e),
                Ok(Ok(())) => {}
                Err(_) => panic!("a read hung after the server died"),
            }
        }
        eprintln!("errors {:?} after the kill", killed.elapsed());
        assert!(!errors.is_empty(), "no read failed although the server died mid-read");
        for e in &errors {
            eprintln!("{:?}: {e}", e.kind());
            assert!(e.to_string().contains("dying.img"), "{e}");
        }
    });
}

#[test]
fn a_presigned_urls_query_string_goes_with_every_request() {
    let nginx = Nginx::start();
    let data = image_bytes(3 * 1024 * 1024 + 321, 8);
    nginx.put("signed.img", &data);
    let opts = RemoteOptions {
        block_size: 256 * 1024,
        cache_bytes: 1024 * 1024,
        ..RemoteOptions::default()
    };
    // An S3 presigned URL's shape; /signed/ checks the signature argument
    // and the method.
    let query = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=testing%2F20260101%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        Nginx::SIGNATURE
    );
    let url = nginx.url(&format!("/signed/signed.img?{query}"));
    let dev = open_url(&url, &opts).expect("open a presigned URL");
    assert_eq!(dev.size(), data.len() as u64);
    check_random_reads(&dev, &data, 3, 60, 400 * 1024, 9);
    // Messages name the object, not the credential.
    assert!(!dev.url().contains(Nginx::SIGNATURE), "{}", dev.url());
    assert!(dev.url().contains("/signed/signed.img"), "{}", dev.url());
    // Every request nginx saw was a GET with the whole query string,
    // answered 206: the size at open included (a HEAD would be refused).
    // nginx logs a request when it ends: read-ahead still in flight when
    // the reads return is logged later, so the device is dropped first
    // (a fetch it cuts short is logged 499, "client closed") and the log
    // is read once it holds every request.
    let sent = dev.stats().requests + 1;
    drop(dev);
    let signed = || -> Vec<String> {
        nginx
            .access_log()
            .into_iter()
            .filter(|l| l.contains("/signed/"))
            .collect()
    };
    let t = std::time::Instant::now();
    let mut log = signed();
    while (log.len() as u64) < sent && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        log = signed();
    }
    assert_eq!(log.len() as u64, sent, "{log:#?}");
    for l in &log {
        let get = format!("\"GET /signed/signed.img?{query} HTTP/1.1\" ");
        assert!(
            l.contains(&format!("{get}206 ")) || l.contains(&format!("{get}499 ")),
            "{l}"
        );
    }
    // A wrong or missing signature is refused at open, by status, and the
    // message does not repeat the query string.
    for bad in ["/signed/signed.img?X-Amz-Signature=wrong", "/signed/signed.img"] {
        let e = open_url(&nginx.url(bad), &opts).expect_err("unsigned");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("/signed/signed.img") && msg.contains("403"), "{msg}");
        assert!(!msg.contains("wrong"), "{msg}");
    }
}
