//! Real servers for the tests, each a child process on 127.0.0.1 with a
//! free port, killed on drop: nginx (Debian's nginx-light) for plain HTTP
//! range requests, and moto's S3 server (PyPI `moto[server]`) for S3.
//!
//! A server that cannot be started fails the test with the reason and the
//! install step: a remote-read test that silently passed without a server
//! would prove nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on right now (the kernel's choice for port 0).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Wait until `port` accepts connections or `child` exits; `Err` says why.
pub fn wait_ready(child: &mut Child, port: u16, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited at start with {status}"));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("not listening on 127.0.0.1:{port} after {limit:?}"))
}

/// nginx serving a temporary directory.
pub struct Nginx {
    child: Option<Child>,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
}

impl Nginx {
    /// The signature `/signed/` requires in the query string.
    pub const SIGNATURE: &'static str = "5ec0de";

    /// Start nginx; `www` is the served directory's path (files go in with
    /// [`Nginx::put`]). Locations besides `/`: `/forbidden/` answers 403,
    /// `/slow/` serves the same files at 512 KiB/s (requests stay in flight
    /// long enough to be joined or cut), `/limited/` answers 503 to
    /// requests above 20 a second (transient errors to retry), `/signed/`
    /// serves the same files only to a GET whose query string carries
    /// `X-Amz-Signature=`[`Nginx::SIGNATURE`] and 403 to anything else (a
    /// presigned URL's rules: the credential is in the query string and
    /// covers one method).
    pub fn start() -> Nginx {
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| panic!("nginx is not installed (apt-get install nginx-light; .ci/run does)"));
        let mut last_err = String::new();
        // A free port can be taken between our probe and nginx's bind.
        for _ in 0..3 {
            let dir = TempDir::new();
            let d = dir.path();
            for sub in ["www", "tmp"] {
                std::fs::create_dir_all(d.join(sub)).expect("mkdir");
            }
            let port = free_port();
            let conf = format!(
                r#"
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    default_type application/octet-stream;
    limit_req_zone $binary_remote_addr zone=limited:1m rate=20r/s;
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
        location /forbidden/ {{ return 403; }}
        location /slow/ {{ alias {d}/www/; limit_rate 512k; }}
        location /limited/ {{ alias {d}/www/; limit_req zone=limited; limit_req_status 503; }}
        location /signed/ {{
            alias {d}/www/;
            if ($request_method != GET) {{ return 403; }}
            if ($args !~ "(^|&)X-Amz-Signature={sig}(&|$)") {{ return 403; }}
        }}
    }}
}}
"#,
                d = d.display(),
                sig = Nginx::SIGNATURE,
            );
            let conf_path = d.join("nginx.conf");
            std::fs::write(&conf_path, conf).expect("write nginx.conf");
            let mut child = Command::new(bin)
                .arg("-p")
                .arg(d)
                .arg("-e")
                .arg(d.join("error.log"))
                .arg("-c")
                .arg(&conf_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
            match wait_ready(&mut child, port, Duration::from_secs(10)) {
                Ok(()) => {
                    return Nginx {
                        child: Some(child),
                        port,
                        dir,
                    }
                }
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(d.join("error.log")).unwrap_or_default();
                    last_err = format!("{why}; error.log:\n{log}");
                }
            }
        }
        panic!("nginx did not start: {last_err}");
    }

    /// Put a file in the served directory.
    pub fn put(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.dir.path().join("www").join(name);
        std::fs::write(&p, data).expect("write served file");
        p
    }

    /// Copy the file at `from` into the served directory as `name`.
    pub fn put_file(&self, name: &str, from: &Path) -> PathBuf {
        let p = self.dir.path().join("www").join(name);
        std::fs::copy(from, &p).unwrap_or_else(|e| panic!("copying {} to serve it: {e}", from.display()));
        p
    }

    /// The URL of `path` (which starts with '/').
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The access log's lines so far (one per request answered).
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Kill the server now, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.kill();
    }
}

/// moto's S3-compatible server.
pub struct Moto {
    child: Option<Child>,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    /// The interpreter moto runs in (boto3 comes with it).
    python: String,
    _dir: TempDir,
}

impl Moto {
    /// Start `python3 -m moto.server` on a free port (`MOTO_PYTHON` names
    /// another interpreter).
    pub fn start() -> Moto {
        let python = std::env::var("MOTO_PYTHON").unwrap_or_else(|_| "python3".into());
        let probe = Command::new(&python)
            .args(["-c", "import moto.server, flask, flask_cors"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e} (moto's S3 server needs Python 3)"));
        if !probe.status.success() {
            panic!(
                "moto's S3 server is not installed for {python}: {}\ninstall it with: {python} -m pip install 'moto[server]>=5,<6' (.ci/run does)",
                String::from_utf8_lossy(&probe.stderr)
            );
        }
        let mut last_err = String::new();
        for _ in 0..3 {
            let dir = TempDir::new();
            let port = free_port();
            let log = std::fs::File::create(dir.path().join("moto.log")).expect("moto.log");
            let mut child = Command::new(&python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("dup log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {python} -m moto.server: {e}"));
            match wait_ready(&mut child, port, Duration::from_secs(60)) {
                Ok(()) => {
                    return Moto {
                        child: Some(child),
                        port,
                        python,
                        _dir: dir,
                    }
                }
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(dir.path().join("moto.log")).unwrap_or_default();
                    last_err = format!("{why}; its output:\n{log}");
                }
            }
        }
        panic!("moto's S3 server did not start: {last_err}");
    }

    /// The endpoint URL for S3 clients.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Create a bucket with a plain `PUT /bucket` (moto accepts unsigned
    /// requests; object_store has no bucket API).
    pub fn create_bucket(&self, bucket: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        write!(
            s,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("send");
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(
            reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200"),
            "create bucket: {reply}"
        );
    }

    /// Store `data` as `bucket/key` with a plain `PUT` (moto accepts
    /// unsigned requests).
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        write!(
            s,
            "PUT /{bucket}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            data.len()
        )
        .expect("send");
        s.write_all(data).expect("send body");
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(
            reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200"),
            "put {bucket}/{key}: {reply}"
        );
    }

    /// A presigned GET URL of `bucket/key`, valid for an hour, made by
    /// boto3 (the AWS SDK, which moto depends on) with SigV4 query signing
    /// for the credentials "testing"/"testing" in us-east-1: the URL a user
    /// gets from `aws s3 presign`.
    pub fn presigned_url(&self, bucket: &str, key: &str) -> String {
        let script = "import sys, boto3\n\
                      from botocore.config import Config\n\
                      s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                          aws_access_key_id='testing', aws_secret_access_key='testing',\n\
                          config=Config(signature_version='s3v4'))\n\
                      print(s3.generate_presigned_url('get_object',\n\
                          Params={'Bucket': sys.argv[2], 'Key': sys.argv[3]}, ExpiresIn=3600))\n";
        let out = Command::new(&self.python)
            .args(["-c", script, &self.endpoint(), bucket, key])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.python));
        assert!(
            out.status.success(),
            "boto3 presign: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Kill the server now, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory removed on drop (a server's files and logs).
pub struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ext4kit-server-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("server temp dir");
        TempDir(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
