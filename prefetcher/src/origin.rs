//! The origin client: one keep-alive pool for every tenant's origin (`http://` and
//! `https://`, TLS by `crate::tls`), timeouts that turn a hung origin into an
//! error, and the fill limits ([`FillLimiter`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, header};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use models::{CacheKey, TenantId};

use prometheus_client::metrics::counter::Counter;

use crate::cache_key::check_target;
use crate::config::{
    Config, ConfigError, FlightConfig, OriginConfig, PrefetchConfig, TenantConfig, parse_origin,
    tls_server_name,
};
use crate::flight::FillError;
use crate::forward::{ForwardFields, Peer};
use crate::limits::FillLimiter;
use crate::tls::{ServerNames, origin_client_config, tls_failure};

/// A tenant as the node resolved it from trusted configuration.
#[derive(Debug)]
pub struct Tenant {
    /// The tenant id.
    pub id: TenantId,
    base: String,
    prefix: String,
    host: HeaderValue,
    /// The `Host` a peer node selects this tenant by: its first host name (none for
    /// a fallback-only tenant, which any name selects).
    client_host: Option<HeaderValue>,
}

impl Tenant {
    /// Builds the tenant from a validated [`TenantConfig`].
    pub fn from_config(config: &TenantConfig) -> Result<Tenant, String> {
        let (base, prefix) = parse_origin(&config.origin)?;
        let host = match &config.host_header {
            Some(h) => h.clone(),
            None => base
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .to_string(),
        };
        let client_host = match config.hosts.iter().find(|h| *h != "*") {
            Some(h) => Some(HeaderValue::from_str(h).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Tenant {
            id: config.id.clone(),
            base,
            prefix,
            host: HeaderValue::from_str(&host).map_err(|e| e.to_string())?,
            client_host,
        })
    }

    /// The origin URL of `path_and_query` (a cache key or a raw pass-through path):
    /// never one that climbs out of the prefix ([`check_target`], which the request
    /// paths run first and answer with `400`; here it guards every other way in).
    fn uri(&self, path_and_query: &str) -> Result<Uri, FillError> {
        target_uri(&format!("{}{}", self.base, self.prefix), path_and_query)
    }
}

/// `base` followed by `path_and_query`, a target that never climbs out of it
/// ([`check_target`]): a tenant's origin, or a peer node asked for its copy.
fn target_uri(base: &str, path_and_query: &str) -> Result<Uri, FillError> {
    let path = path_and_query.split('?').next().unwrap_or("");
    check_target(path).map_err(|e| FillError::Connect(format!("refused target: {e}")))?;
    format!("{base}{path_and_query}")
        .parse()
        .map_err(|e| FillError::Connect(format!("bad upstream URL: {e}")))
}

pub(crate) use crate::semantics::strip_hop_by_hop;

pub(crate) use crate::forward::ClientAddr;

/// The origin client and the fill limits.
#[derive(Clone)]
pub struct OriginClient {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    /// For the one retry of a request whose pooled connection failed.
    fresh: Client<HttpsConnector<HttpConnector>, Body>,
    limiter: FillLimiter,
    fields: ForwardFields,
    header_timeout: Duration,
    body_idle_timeout: Duration,
    tls_failures: Counter,
    /// Shared with the connector: a reload replaces the names in place.
    server_names: ServerNames,
    verifies_https: bool,
}

/// `(authority, server name)` of every `https://` origin of `tenants`.
fn server_name_pairs(tenants: &[TenantConfig]) -> Vec<(String, String)> {
    tenants
        .iter()
        .filter_map(|t| {
            let (base, _) = parse_origin(&t.origin).ok()?;
            let authority = base.strip_prefix("https://")?;
            Some((
                authority.to_string(),
                tls_server_name(authority, t.host_header.as_deref()),
            ))
        })
        .collect()
}

impl OriginClient {
    /// A client whose fills are limited by `flight` (both classes) and `prefetch`
    /// (the adaptive prefetch class); `https://` origins are verified against the
    /// system's roots or `config.ca_file` (read now: a bad file is an error naming
    /// `origin.ca_file`), for each origin's server name: the host of its tenant's
    /// `host_header`, else of its URL.
    pub fn new(
        config: &OriginConfig,
        flight: &FlightConfig,
        prefetch: &PrefetchConfig,
        tenants: &[TenantConfig],
    ) -> Result<Self, ConfigError> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        // The TLS layer above decides by scheme; this one only connects.
        connector.enforce_http(false);
        let server_names = ServerNames::new(server_name_pairs(tenants));
        let tls = Arc::unwrap_or_clone(origin_client_config(
            config.ca_file.as_deref(),
            !server_names.is_empty(),
        )?);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .with_server_name_resolver(server_names.clone())
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(config.pool_max_idle)
            .build(connector.clone());
        // Keeps no connection: each request on it connects afresh.
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        let limiter = FillLimiter::new(flight, prefetch);
        limiter.set_tenants(tenants);
        Ok(OriginClient {
            client,
            fresh,
            limiter,
            fields: ForwardFields::new(&config.forward_headers, config.fill_fields),
            header_timeout: Duration::from_millis(config.header_timeout_ms),
            body_idle_timeout: Duration::from_millis(config.body_idle_timeout_ms),
            tls_failures: Counter::default(),
            verifies_https: config.ca_file.is_some() || !server_names.is_empty(),
            server_names,
        })
    }

    /// Puts the TLS server names of `tenants`' origins in force for the connections
    /// made from now on (a reload that changed the tenants).
    pub(crate) fn set_tenants(&self, tenants: &[TenantConfig]) {
        self.server_names.replace(server_name_pairs(tenants));
        self.limiter.set_tenants(tenants);
    }

    /// Whether the client has roots to verify `https://` origins against: the CA
    /// file, or the system's, read at start only when some origin was `https://`.
    pub(crate) fn verifies_https(&self) -> bool {
        self.verifies_https
    }

    /// The client for `config`'s origins ([`OriginClient::new`]).
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        OriginClient::new(
            &config.origin,
            &config.flight,
            &config.prefetch,
            &config.tenants,
        )
    }

    /// Counts every origin request that failed in TLS (certificate or handshake)
    /// in `counter` as well.
    pub fn count_tls_failures_in(mut self, counter: Counter) -> Self {
        self.tls_failures = counter;
        self
    }

    /// Longest gap allowed between two body chunks.
    pub fn body_idle_timeout(&self) -> Duration {
        self.body_idle_timeout
    }

    /// The fill limiter (user and prefetch classes).
    pub fn limiter(&self) -> &FillLimiter {
        &self.limiter
    }

    /// Which request fields are forwarded (`origin.forward_headers`, `fill_fields`).
    pub fn fields(&self) -> &ForwardFields {
        &self.fields
    }

    /// A fill request: `GET` of the key with `headers` (from
    /// [`ForwardFields::fill_headers`] or [`prewarm_headers`](crate::prewarm_headers),
    /// plus validators for a revalidation) and the tenant's `Host`. The origin's
    /// status, 5xx included, is the caller's to judge.
    pub async fn get(
        &self,
        tenant: &Tenant,
        key: &CacheKey,
        mut headers: HeaderMap,
    ) -> Result<Response<Incoming>, FillError> {
        headers.insert(header::HOST, tenant.host.clone());
        self.send_get(tenant.uri(key.as_str())?, headers).await
    }

    /// A bodiless `GET` of `uri` with exactly `headers`.
    async fn send_get(
        &self,
        uri: Uri,
        headers: HeaderMap,
    ) -> Result<Response<Incoming>, FillError> {
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .body(Body::empty())
            .map_err(|e| FillError::Connect(e.to_string()))?;
        *request.headers_mut() = headers;
        self.send(request).await
    }

    /// `GET` of `key` from `peer`'s cache alone (`Cache-Control: only-if-cached`):
    /// a node of the same region answers from its cache or `504`, never from its
    /// origin. `peer` is `http://host[:port]`; the tenant is selected by its host.
    pub async fn get_cached(
        &self,
        peer: &Uri,
        tenant: &Tenant,
        key: &CacheKey,
        mut headers: HeaderMap,
    ) -> Result<Response<Incoming>, FillError> {
        let uri = target_uri(peer.to_string().trim_end_matches('/'), key.as_str())?;
        let host = match (&tenant.client_host, peer.authority()) {
            (Some(host), _) => host.clone(),
            (None, Some(authority)) => HeaderValue::from_str(authority.as_str())
                .map_err(|e| FillError::Connect(e.to_string()))?,
            (None, None) => return Err(FillError::Connect("peer without a host".into())),
        };
        headers.insert(header::HOST, host);
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("only-if-cached"),
        );
        self.send_get(uri, headers).await
    }

    /// A pass-through request (other methods, credentials, ranges): the client's
    /// request with [`ForwardFields::pass_through_headers`] and the tenant's `Host`,
    /// and its body, except on `GET`, `HEAD` and `TRACE`: those go without one (and
    /// without `Content-Length`), so an origin that ignores such a body can never
    /// read it as the next request on a pooled connection.
    pub async fn forward(
        &self,
        tenant: &Tenant,
        request: Request<Body>,
        peer: &Peer,
    ) -> Result<Response<Incoming>, FillError> {
        let (mut parts, mut body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = tenant.uri(path)?;
        parts.headers = self
            .fields
            .pass_through_headers(&parts.headers, parts.version, peer);
        if matches!(parts.method, Method::GET | Method::HEAD | Method::TRACE) {
            parts.headers.remove(header::CONTENT_LENGTH);
            body = Body::empty();
        }
        parts.headers.insert(header::HOST, tenant.host.clone());
        parts.version = http::Version::HTTP_11;
        self.send(Request::from_parts(parts, body)).await
    }

    /// Sends `request` within the header timeout. A body-less `GET` or `HEAD` (every
    /// fill, and pass-through reads) whose connection closed or reset before any
    /// response byte is sent once more on a fresh connection, within the same
    /// timeout: a pooled connection the origin has just closed is a race of the
    /// keep-alive, not an answer (nginx and Varnish retry such requests too).
    async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, FillError> {
        let deadline = tokio::time::Instant::now() + self.header_timeout;
        let again = matches!(*request.method(), Method::GET | Method::HEAD)
            && http_body::Body::is_end_stream(request.body())
            && !request.headers().contains_key(header::CONTENT_LENGTH);
        let again = again.then(|| {
            let mut copy = Request::new(Body::empty());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.version_mut() = request.version();
            *copy.headers_mut() = request.headers().clone();
            copy
        });
        let first = tokio::time::timeout_at(deadline, self.client.request(request)).await;
        let sent = match (first, again) {
            (Ok(Err(e)), Some(copy)) if closed_before_answer(&e) => {
                tracing::debug!(error = %error_chain(&e), "origin connection closed before answering; sent again on a fresh one");
                tokio::time::timeout_at(deadline, self.fresh.request(copy)).await
            }
            (first, _) => first,
        };
        match sent {
            Err(_) => Err(FillError::Timeout),
            Ok(Err(e)) => match tls_failure(&e) {
                Some(reason) => {
                    self.tls_failures.inc();
                    Err(FillError::Tls(reason))
                }
                None => Err(FillError::Connect(error_chain(&e))),
            },
            Ok(Ok(response)) => checked_framing(response),
        }
    }
}

/// The origin's response if its framing is unambiguous (RFC 9112 §6), as nginx
/// judges it: `Transfer-Encoding` other than a lone `chunked`, or beside
/// `Content-Length`, differing lengths and an unsolicited `101` (no request asks
/// for an upgrade: `Upgrade` is hop-by-hop) are refused, a list of one length
/// repeated (`5, 5`) becomes that length.
fn checked_framing(mut response: Response<Incoming>) -> Result<Response<Incoming>, FillError> {
    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(FillError::Malformed("unsolicited 101 Switching Protocols"));
    }
    let headers = response.headers_mut();
    if headers.contains_key(header::TRANSFER_ENCODING) {
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty());
        let chunked_only = codings
            .next()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
            && codings.next().is_none();
        if !chunked_only {
            return Err(FillError::Malformed("transfer coding other than chunked"));
        }
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Err(FillError::Malformed(
                "Content-Length beside Transfer-Encoding",
            ));
        }
        return Ok(response);
    }
    let lengths: Vec<&[u8]> = headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .collect();
    if lengths.len() > 1 {
        if lengths.iter().any(|l| *l != lengths[0]) {
            return Err(FillError::Malformed("differing Content-Length values"));
        }
        let one = HeaderValue::from_bytes(lengths[0])
            .map_err(|_| FillError::Malformed("invalid Content-Length"))?;
        headers.insert(header::CONTENT_LENGTH, one);
    }
    Ok(response)
}

/// Whether the origin closed or reset the connection before any byte of its
/// answer: not a connect failure (that reached no origin), and no response head.
fn closed_before_answer(e: &hyper_util::client::legacy::Error) -> bool {
    if e.is_connect() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        } else if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}
