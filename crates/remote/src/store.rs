//! From a URL to an `object_store` client and a path in it, and from its
//! errors to `io::Error`s that name the URL and the HTTP status.
//!
//! `object_store::parse_url_opts` does the URL half but ignores the
//! environment, and users expect the AWS variables to work; so each store's
//! builder is set up here: our timeouts and retry bounds as defaults, the
//! environment over them, the URL, then the caller's explicit options.

use std::io;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};
use url::Url;

use crate::RemoteOptions;

/// The schemes we accept, lower case. `file://` and `memory://` are left
/// out on purpose: a local path opens as a file, without a runtime.
const SCHEMES: &[&str] = &[
    "http", "https", "s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl",
];

/// The scheme of `s` if it is one we open remotely.
pub(crate) fn scheme_of(s: &str) -> Option<&'static str> {
    let (scheme, rest) = s.split_once("://")?;
    if rest.is_empty() {
        return None;
    }
    SCHEMES.iter().copied().find(|k| k.eq_ignore_ascii_case(scheme))
}

/// How the object's size and version are learnt at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizeQuery {
    /// A HEAD request (or the store's equivalent).
    Head,
    /// A GET of its first byte, whose Content-Range gives the size: a
    /// presigned URL is valid for the method it was signed for, GET.
    RangedGet,
}

/// A client for the store that holds `url`, the object's path in it, and
/// how to ask its size.
pub(crate) fn open_store(url: &str, opts: &RemoteOptions) -> io::Result<(Arc<dyn ObjectStore>, Path, SizeQuery)> {
    let shown = crate::presigned::shown(url);
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{shown}: {why}"));
    if scheme_of(url).is_none() {
        return Err(invalid("not a remote URL (http, https, s3, gs, az, abfs, adl)".into()));
    }
    let parsed = Url::parse(url).map_err(|e| invalid(format!("bad URL: {e}")))?;
    // A query string on an http(s) URL is a presigned URL's credential (S3's
    // X-Amz-*, GCS's X-Goog-*, an Azure SAS): the URL itself is what to
    // request, also on a host object_store would take for a store
    // (*.amazonaws.com, *.blob.core.windows.net) and ask for credentials.
    let presigned = matches!(parsed.scheme(), "http" | "https") && parsed.query().is_some();
    let (scheme, path) = if presigned {
        let path = Path::from_url_path(parsed.path()).map_err(|e| invalid(e.to_string()))?;
        (ObjectStoreScheme::Http, path)
    } else {
        ObjectStoreScheme::parse(&parsed).map_err(|e| invalid(e.to_string()))?
    };
    if path.as_ref().is_empty() {
        return Err(invalid("names no object (the path is empty)".into()));
    }
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: opts.retries,
        retry_timeout: opts.retry_timeout,
    };
    let mut size_query = SizeQuery::Head;
    let timeout = format!("{}ms", opts.timeout.as_millis());
    let connect_timeout = format!("{}ms", opts.connect_timeout.as_millis());
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            let mut b = AmazonS3Builder::new().with_retry(retry);
            b = b.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), &timeout);
            b = b.with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                &connect_timeout,
            );
            // The shared files' profile first, the environment over it (the
            // AWS CLI's precedence).
            for (k, v) in crate::aws_profile::profile_settings()
                .into_iter()
                .chain(env_with_prefix("AWS_"))
            {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            b = b.with_url(url);
            for (k, v) in &opts.store_options {
                let key: AmazonS3ConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_key(&shown, k))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Arc::new(s) as _)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut b = GoogleCloudStorageBuilder::new().with_retry(retry);
            b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), &timeout);
            b = b.with_config(
                GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                &connect_timeout,
            );
            // Lowest first: gcloud's moved configuration directory, then
            // what from_env reads (GOOGLE_APPLICATION_CREDENTIALS among the
            // GOOGLE_ variables overrides the former).
            if let Some(adc) = gcloud_adc_file(std::env::var_os("CLOUDSDK_CONFIG")) {
                b = b.with_config(GoogleConfigKey::ApplicationCredentials, adc.to_string_lossy());
            }
            if let Ok(path) = std::env::var("SERVICE_ACCOUNT") {
                b = b.with_service_account_path(path);
            }
            for (k, v) in env_with_prefix("GOOGLE_") {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            b = b.with_url(url);
            for (k, v) in &opts.store_options {
                let key: GoogleConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_key(&shown, k))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Arc::new(s) as _)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut b = MicrosoftAzureBuilder::new().with_retry(retry);
            b = b.with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), &timeout);
            b = b.with_config(
                AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                &connect_timeout,
            );
            for (k, v) in env_with_prefix("AZURE_") {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            // App Service and Functions' managed identity endpoint, which
            // from_env reads besides the AZURE_ variables (its secret,
            // IDENTITY_HEADER, object_store reads itself).
            if let Ok(endpoint) = std::env::var("IDENTITY_ENDPOINT") {
                b = b.with_msi_endpoint(endpoint);
            }
            b = b.with_url(url);
            for (k, v) in &opts.store_options {
                let key: AzureConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_key(&shown, k))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Arc::new(s) as _)
        }
        ObjectStoreScheme::Http => {
            let client = ClientOptions::new()
                .with_timeout(opts.timeout)
                .with_connect_timeout(opts.connect_timeout)
                // The user wrote http:// themselves: that is the consent
                // object_store otherwise asks for.
                .with_allow_http(parsed.scheme() == "http");
            let mut b = HttpBuilder::new()
                .with_url(&parsed[..url::Position::BeforePath])
                .with_client_options(client)
                .with_retry(retry);
            // The HTTP store drops a query string; a presigned URL's
            // credential lives there (presigned.rs).
            if presigned {
                let signed = crate::presigned::SignedConnector::new(&parsed)
                    .map_err(|e| invalid(format!("bad path or query string: {e}")))?;
                b = b.with_http_connector(signed);
                size_query = SizeQuery::RangedGet;
            }
            for (k, v) in &opts.store_options {
                let key: ClientConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_key(&shown, k))?;
                b = b.with_config(key, v);
            }
            b.build().map(|s| Arc::new(s) as _)
        }
        other => return Err(invalid(format!("unsupported store {other:?}"))),
    };
    let store = built.map_err(|e| io_error(&shown, "cannot set up the store client", &e))?;
    Ok((store, path, size_query))
}

fn unknown_key(url: &str, key: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{url}: unknown store option {key:?}"),
    )
}

/// gcloud's application-default credentials file in its configuration
/// directory `config` (`$CLOUDSDK_CONFIG`), if there is one. gcloud and
/// Google's own client libraries look there when the variable is set;
/// object_store only looks in `~/.config/gcloud`.
fn gcloud_adc_file(config: Option<std::ffi::OsString>) -> Option<std::path::PathBuf> {
    let file = std::path::PathBuf::from(config?).join("application_default_credentials.json");
    file.is_file().then_some(file)
}

/// The environment variables starting with `prefix`, keys lower-cased the
/// way the builders' `from_env` parse them.
fn env_with_prefix(prefix: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// Turn an `object_store` error into an `io::Error` whose kind callers can
/// act on (a missing image is `NotFound`, a refused one `PermissionDenied`)
/// and whose text names the URL, what was being done and the HTTP status.
pub(crate) fn io_error(url: &str, what: &str, e: &object_store::Error) -> io::Error {
    use io::ErrorKind as K;
    let text = error_chain(e);
    let status = http_status(&text);
    let kind = match e {
        object_store::Error::NotFound { .. } => K::NotFound,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            K::PermissionDenied
        }
        // A 412 on a pinned request: the object was replaced after open.
        object_store::Error::Precondition { .. } => {
            return io::Error::other(format!(
                "{url}: {what}: the object changed since it was opened (HTTP status 412): {text}"
            ))
        }
        _ => match status {
            Some(404 | 410) => K::NotFound,
            Some(401 | 403) => K::PermissionDenied,
            Some(_) => K::Other,
            // The text also carries "retry_timeout: ..." whatever failed,
            // so look for the cause's own words.
            None if text.contains("onnection refused") => K::ConnectionRefused,
            None if text.contains("timed out") || text.contains("operation timeout") => K::TimedOut,
            None => K::Other,
        },
    };
    let status = match status {
        Some(s) => format!(" (HTTP status {s})"),
        None => String::new(),
    };
    io::Error::new(kind, format!("{url}: {what}{status}: {text}"))
}

/// The error and its sources as one line, leaving out a source whose text
/// its parent already repeats (object_store errors often embed theirs).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

/// The HTTP status an error chain reports. object_store keeps its retry
/// error type private, so the status is read back from its text ("Server
/// returned non-2xx status code: 403 Forbidden").
fn http_status(text: &str) -> Option<u16> {
    let (_, rest) = text.split_once("status code: ")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok().filter(|s| (100..600).contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        for u in [
            "https://h/x.img",
            "HTTP://h/x",
            "s3://b/k",
            "gs://b/k",
            "az://c/k",
            "abfss://c@a.dfs.core.windows.net/k",
        ] {
            assert!(scheme_of(u).is_some(), "{u}");
        }
        for u in [
            "/tmp/x.img",
            "x.img",
            "file:///tmp/x",
            "memory:///x",
            "s3://",
            "ftp://h/x",
            "c:\\x",
        ] {
            assert!(scheme_of(u).is_none(), "{u}");
        }
    }

    #[test]
    fn status_from_text() {
        assert_eq!(
            http_status("Error performing GET http://x in 1ms - Server returned non-2xx status code: 403 Forbidden: "),
            Some(403)
        );
        assert_eq!(http_status("connection refused"), None);
    }

    #[test]
    fn presigned_urls_size_by_get() {
        let (_, path, q) = open_store(
            "https://example.invalid/b/x.img?X-Amz-Signature=1",
            &RemoteOptions::default(),
        )
        .expect("a presigned URL opens a store");
        assert_eq!((path.as_ref(), q), ("b/x.img", SizeQuery::RangedGet));
        let (_, _, q) = open_store("https://example.invalid/b/x.img", &RemoteOptions::default()).unwrap();
        assert_eq!(q, SizeQuery::Head);
        // Hosts object_store maps to S3 and Azure stay plain HTTP(S) when
        // the query string is the credential.
        for u in [
            "https://bucket.s3.eu-west-1.amazonaws.com/vm/disk.qcow2?X-Amz-Signature=1",
            "https://acct.blob.core.windows.net/c/vm/disk.qcow2?sv=2022-11-02&sig=abc",
        ] {
            let (_, path, q) = open_store(u, &RemoteOptions::default()).expect(u);
            assert_eq!(q, SizeQuery::RangedGet, "{u}");
            assert!(path.as_ref().ends_with("vm/disk.qcow2"), "{u}: {path}");
        }
    }
}
