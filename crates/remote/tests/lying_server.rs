//! A web server that lies about what it sends: a range body shorter than
//! its headers promise, a connection closed mid-body, a body that stalls,
//! a size at HEAD larger than the object. Each read must fail with an
//! error naming the URL and the range, in bounded time — never return a
//! block padded with zeros, never hang.
//!
//! The server is a few lines over `std::net::TcpListener` on 127.0.0.1
//! (no real server misbehaves on demand); it answers at most a bounded
//! number of connections and stops by itself after 60 s.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit_blockdev::BlockDevice;
use ext4kit_remote::{open_url, RemoteOptions};

const SIZE: u64 = 1 << 20;
const BLOCK: u64 = 64 * 1024;

/// How the server lies about ranges.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// 206 with the Content-Range asked for, but half the body (its
    /// Content-Length says half, the connection is closed after it).
    ShortBody,
    /// The promised Content-Length, half the body, then the connection
    /// closes.
    ClosedMidBody,
    /// The promised Content-Length, half the body, then nothing for 20 s.
    StalledBody,
    /// HEAD says the object is twice its size; ranges are answered
    /// honestly for the real object (shortened, or 416 past its end).
    HeadTooLarge,
}

/// The object's bytes: every position differs from its neighbours'.
fn byte(at: u64) -> u8 {
    (at ^ (at >> 8) ^ (at >> 16)) as u8
}

/// A lying server on 127.0.0.1; stops when dropped or after 60 s.
struct Liar {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Liar {
    fn start(lie: Lie) -> Liar {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(60);
            let mut served = 0;
            while !flag.load(Ordering::Relaxed) && Instant::now() < until && served < 200 {
                match listener.accept() {
                    Ok((conn, _)) => {
                        served += 1;
                        std::thread::spawn(move || {
                            let _ = answer(conn, lie);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Liar { port, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/disk.img", self.port)
    }
}

impl Drop for Liar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answer one request on `conn` (one per connection: `Connection: close`).
fn answer(conn: TcpStream, lie: Lie) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
            let (a, b) = v.trim().split_once('-').unwrap_or(("0", ""));
            range = Some((a.parse::<u64>().unwrap_or(0), b.parse::<u64>().unwrap_or(SIZE - 1)));
        }
    }
    let mut out = conn;
    let head = |status: &str, headers: String| format!("HTTP/1.1 {status}\r\n{headers}Connection: close\r\n\r\n");
    if request.starts_with("HEAD") {
        let size = if matches!(lie, Lie::HeadTooLarge) {
            2 * SIZE
        } else {
            SIZE
        };
        out.write_all(head("200 OK", format!("Content-Length: {size}\r\nAccept-Ranges: bytes\r\n")).as_bytes())?;
        return Ok(());
    }
    let (a, b) = range.unwrap_or((0, SIZE - 1));
    if a >= SIZE {
        out.write_all(
            head(
                "416 Range Not Satisfiable",
                format!("Content-Range: bytes */{SIZE}\r\nContent-Length: 0\r\n"),
            )
            .as_bytes(),
        )?;
        return Ok(());
    }
    let b = b.min(SIZE - 1);
    let body: Vec<u8> = (a..=b).map(byte).collect();
    let half = &body[..body.len() / 2];
    let content_range = format!("Content-Range: bytes {a}-{b}/{SIZE}\r\n");
    match lie {
        Lie::ShortBody => {
            out.write_all(
                head(
                    "206 Partial Content",
                    format!("{content_range}Content-Length: {}\r\n", half.len()),
                )
                .as_bytes(),
            )?;
            out.write_all(half)?;
        }
        Lie::ClosedMidBody | Lie::StalledBody => {
            out.write_all(
                head(
                    "206 Partial Content",
                    format!("{content_range}Content-Length: {}\r\n", body.len()),
                )
                .as_bytes(),
            )?;
            out.write_all(half)?;
            out.flush()?;
            if matches!(lie, Lie::StalledBody) {
                std::thread::sleep(Duration::from_secs(20));
            }
        }
        Lie::HeadTooLarge => {
            out.write_all(
                head(
                    "206 Partial Content",
                    format!("{content_range}Content-Length: {}\r\n", body.len()),
                )
                .as_bytes(),
            )?;
            out.write_all(&body)?;
        }
    }
    Ok(())
}

fn opts() -> RemoteOptions {
    RemoteOptions {
        block_size: BLOCK,
        readahead: 0,
        timeout: Duration::from_secs(2),
        retries: 1,
        retry_timeout: Duration::from_secs(3),
        ..RemoteOptions::default()
    }
}

/// A read of `len` bytes at `off` fails within 30 s, naming the URL and
/// the block's byte range; returns the message.
fn read_fails(url: &str, dev: &dyn BlockDevice, off: u64, len: usize) -> String {
    let start = Instant::now();
    let mut buf = vec![0u8; len];
    let e = dev
        .read_at(off, &mut buf)
        .expect_err("a lying server's block was accepted");
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
    let msg = e.to_string();
    let block = off / BLOCK * BLOCK;
    assert!(msg.contains(url), "{msg}");
    assert!(msg.contains(&format!("bytes {block}..")), "{msg}");
    msg
}

#[test]
fn a_range_body_shorter_than_asked_is_an_error() {
    let liar = Liar::start(Lie::ShortBody);
    let dev = open_url(&liar.url(), &opts()).expect("open");
    assert_eq!(dev.size(), SIZE);
    let msg = read_fails(&liar.url(), &dev, 3 * BLOCK + 100, 4096);
    assert!(msg.contains(&format!("sent {} bytes, not {BLOCK}", BLOCK / 2)), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn a_connection_closed_mid_body_is_an_error() {
    let liar = Liar::start(Lie::ClosedMidBody);
    let dev = open_url(&liar.url(), &opts()).expect("open");
    eprintln!("{}", read_fails(&liar.url(), &dev, 5 * BLOCK, 4096));
}

#[test]
fn a_body_that_stalls_is_an_error_in_bounded_time() {
    let liar = Liar::start(Lie::StalledBody);
    let dev = open_url(&liar.url(), &opts()).expect("open");
    eprintln!("{}", read_fails(&liar.url(), &dev, 0, 4096));
}

#[test]
fn a_size_at_head_larger_than_the_object_is_an_error_past_its_end() {
    let liar = Liar::start(Lie::HeadTooLarge);
    let dev = open_url(&liar.url(), &opts()).expect("open");
    assert_eq!(dev.size(), 2 * SIZE, "the HEAD's size is taken at open");
    // What the object has reads as it is.
    let mut buf = vec![0u8; 8192];
    dev.read_at(SIZE - 8192, &mut buf).expect("inside the object");
    assert!(buf.iter().enumerate().all(|(i, &v)| v == byte(SIZE - 8192 + i as u64)));
    // Past it: an error, not zeros. The block just past the end is a 416;
    // one block asked across the end comes back shortened.
    let msg = read_fails(&liar.url(), &dev, SIZE + 10, 100);
    assert!(msg.contains("416"), "{msg}");
    eprintln!("{msg}");
    let across = RemoteOptions {
        block_size: 3 * BLOCK,
        ..opts()
    };
    let dev = open_url(&liar.url(), &across).expect("open");
    let mut buf = vec![0u8; 100];
    let e = dev
        .read_at(SIZE - 50, &mut buf)
        .expect_err("a block across the real end");
    let msg = e.to_string();
    assert!(msg.contains(&liar.url()), "{msg}");
    let block = (SIZE - 50) / (3 * BLOCK) * (3 * BLOCK);
    assert!(
        msg.contains(&format!("bytes {block}..{}", block + 3 * BLOCK))
            && msg.contains(&format!("size as {SIZE} bytes")),
        "{msg}"
    );
    eprintln!("{msg}");
}
