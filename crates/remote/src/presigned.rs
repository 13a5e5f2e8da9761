//! Presigned URLs: an https URL whose query string carries the
//! credential (S3's `X-Amz-Signature`, GCS's `X-Goog-Signature`, an Azure
//! SAS token's `sig`) must be requested exactly as it was signed.
//!
//! object_store's HTTP store builds every request's URL from a base URL
//! and the object's path, so the query string is lost. Its transport is
//! pluggable ([`HttpConnector`]): ours is object_store's own reqwest
//! client with one change, every request goes to the path and query of
//! the URL as given. Everything else (retries, timeouts, the range and
//! If-Match headers, the checks of each response) stays object_store's.
//! The store built with it serves the one object the URL names; nothing
//! else is ever asked of it.
//!
//! A signature covers the HTTP method too: a URL signed for GET is refused
//! for HEAD (S3 answers 403), so the image's size is learnt from a ranged
//! GET instead (see `device.rs`).

use async_trait::async_trait;
use http::uri::PathAndQuery;
use http::Uri;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// Sends every request to one path and query (see the module doc).
#[derive(Debug)]
pub(crate) struct SignedConnector {
    target: PathAndQuery,
}

impl SignedConnector {
    /// For the object at `url` (parsed, with its query string).
    pub(crate) fn new(url: &url::Url) -> Result<SignedConnector, http::uri::InvalidUri> {
        let target = url[url::Position::BeforePath..url::Position::AfterQuery].parse()?;
        Ok(SignedConnector { target })
    }
}

impl HttpConnector for SignedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Signed {
            inner,
            target: self.target.clone(),
        }))
    }
}

#[derive(Debug)]
struct Signed {
    inner: HttpClient,
    target: PathAndQuery,
}

#[async_trait]
impl HttpService for Signed {
    async fn call(&self, mut req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = Some(self.target.clone());
        *req.uri_mut() = Uri::from_parts(parts).map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
        self.inner.execute(req).await
    }
}

/// `url` for messages: a query string is a credential, so it is shown as
/// `?…` (the path still says which object).
pub(crate) fn shown(url: &str) -> String {
    match url.split_once('?') {
        Some((before, _)) => format!("{before}?…"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_keeps_path_and_query_verbatim() {
        let u = url::Url::parse("https://h.example/b/k%20x.img?X-Amz-Credential=a%2Fb&X-Amz-Signature=00ff").unwrap();
        let c = SignedConnector::new(&u).unwrap();
        assert_eq!(
            c.target.as_str(),
            "/b/k%20x.img?X-Amz-Credential=a%2Fb&X-Amz-Signature=00ff"
        );
        assert_eq!(shown(u.as_str()), "https://h.example/b/k%20x.img?…");
        assert_eq!(shown("https://h/x.img"), "https://h/x.img");
    }
}
