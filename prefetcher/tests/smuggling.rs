//! Request smuggling and ambiguous heads, as raw bytes on real sockets: every row is
//! refused with `400` (by the proxy, or by hyper, which then closes the connection)
//! before the cache, a flight or the origin sees it, counted under its reason in
//! `prefetcher_requests_refused_total`; the origin sees no request; a legitimate
//! request on a new connection is served afterwards.
//!
//! What hyper refuses by itself (and the proxy counts when the connection ends):
//! differing duplicate `Content-Length`s, a `Content-Length` list, a final coding
//! other than `chunked`, `Transfer-Encoding` on HTTP/1.0, obs-fold, bare CR and
//! control characters. What hyper lets through and the proxy refuses: `Content-Length`
//! beside `Transfer-Encoding` (hyper drops the length), equal duplicate lengths
//! (hyper merges them), `chunked` twice or after another coding, bare-LF line ends,
//! `Host` missing, doubled or invalid, an absolute-form target naming another host,
//! `CONNECT` and the asterisk form.

mod common;

use std::net::SocketAddr;

use http::StatusCode;
use models::TenantId;
use prefetcher::testing::{SyntheticOrigin, TestClient, TestNode, wait_until};
use prefetcher::{Config, RefusalReason};

const HOST: &str = "edge.test";

fn config(origin: &str) -> Config {
    Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    )
}

/// Writes `bytes` on a fresh connection and reads until the server closes it
/// (`common::exchange`): every status line it answered with.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    let (statuses, closed) = common::exchange(addr, bytes).await;
    assert!(closed, "the connection was not closed within 10 s");
    statuses
}

/// Sends one row and checks everything the module promises of it.
async fn refused(head: &str, reason: RefusalReason) {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let statuses = exchange(node.addr, head.as_bytes()).await;
    assert!(
        statuses.is_empty() || statuses == [400],
        "{head:?}: answered {statuses:?}, not a lone 400 or a close"
    );
    let metrics = node.node.metrics();
    wait_until(|| metrics.refusals(reason) == 1, reason.as_str()).await;
    assert_eq!(origin.fills(), 0, "{head:?} reached the origin");
    let r = TestClient::new()
        .get(node.addr, HOST, "/after")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "the node serves the next client");
    assert_eq!(origin.fills(), 1);
    let total: u64 = RefusalReason::ALL
        .iter()
        .map(|r| metrics.refusals(*r))
        .sum();
    assert_eq!(total, 1, "{head:?} counted once, under {reason}");
}

macro_rules! rows {
    ($($name:ident: $head:expr => $reason:ident;)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                refused(($head).as_ref(), RefusalReason::$reason).await;
            }
        )*
    };
}

fn post(fields: &str, body: &str) -> String {
    format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\n{fields}\r\n\r\n{body}")
}

fn get(fields: &str) -> String {
    format!("GET /page HTTP/1.1\r\nHost: {HOST}\r\n{fields}\r\n\r\n")
}

rows! {
    // Framing: two ways to read the body.
    content_length_then_chunked:
        post("Content-Length: 5\r\nTransfer-Encoding: chunked", "0\r\n\r\n") => LengthAndChunked;
    chunked_then_content_length:
        post("Transfer-Encoding: chunked\r\nContent-Length: 5", "0\r\n\r\n") => LengthAndChunked;
    duplicate_content_length_same_value:
        post("Content-Length: 5\r\nContent-Length: 5", "hello") => DuplicateLength;
    duplicate_content_length_different_values:
        post("Content-Length: 5\r\nContent-Length: 6", "hello!") => DuplicateLength;
    content_length_list:
        post("Content-Length: 5, 5", "hello") => InvalidLength;
    content_length_with_a_sign:
        post("Content-Length: +5", "hello") => InvalidLength;
    chunked_then_identity:
        post("Transfer-Encoding: chunked, identity", "0\r\n\r\n") => TransferEncoding;
    xchunked:
        post("Transfer-Encoding: xchunked", "0\r\n\r\n") => TransferEncoding;
    chunked_on_two_lines:
        post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", "0\r\n\r\n") => TransferEncoding;
    chunked_twice_in_one_line:
        post("Transfer-Encoding: chunked, chunked", "0\r\n\r\n") => TransferEncoding;
    gzip_then_chunked:
        post("Transfer-Encoding: gzip, chunked", "0\r\n\r\n") => TransferEncoding;
    chunked_on_http_1_0:
        format!("POST /upload HTTP/1.0\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            => TransferEncoding;
    // Line ends and characters.
    obs_fold: get("X-Folded: a\r\n b") => Malformed;
    bare_cr_in_a_value: get("X-A: a\rb") => Malformed;
    bare_lf_line_ends:
        format!("GET /page HTTP/1.1\nHost: {HOST}\nX-A: 1\n\n") => BareLf;
    one_bare_lf_among_crlf: get("X-A: 1\nX-B: 2") => BareLf;
    nul_in_a_value: get("X-A: a\0b") => Malformed;
    control_character_in_a_value: get("X-A: a\x01b") => Malformed;
    del_in_a_value: get("X-A: a\x7fb") => Malformed;
    space_before_the_colon: get("Content-Length : 0") => Malformed;
    // The authority.
    absolute_form_naming_another_host:
        format!("GET http://other.example/page HTTP/1.1\r\nHost: {HOST}\r\n\r\n") => HostMismatch;
    absolute_form_with_user_info:
        format!("GET http://user@{HOST}/page HTTP/1.1\r\nHost: {HOST}\r\n\r\n") => BadTarget;
    missing_host: "GET /page HTTP/1.1\r\nAccept: */*\r\n\r\n" => MissingHost;
    host_twice_same_value: get(&format!("Host: {HOST}")) => DuplicateHost;
    host_twice_different_values: get("Host: other.example") => DuplicateHost;
    host_with_user_info:
        "GET /page HTTP/1.1\r\nHost: edge.test@evil.example\r\n\r\n" => InvalidHost;
    host_with_a_space: "GET /page HTTP/1.1\r\nHost: edge test\r\n\r\n" => InvalidHost;
    empty_host: "GET /page HTTP/1.1\r\nHost:\r\n\r\n" => InvalidHost;
    host_with_a_bad_port: "GET /page HTTP/1.1\r\nHost: edge.test:80x\r\n\r\n" => InvalidHost;
    // Targets the node has no use for.
    connect: format!("CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n") => Connect;
    asterisk_form: format!("OPTIONS * HTTP/1.1\r\nHost: {HOST}\r\n\r\n") => BadTarget;
}

#[tokio::test]
async fn a_smuggled_request_behind_a_legitimate_one_is_refused_on_the_same_connection() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    // A legitimate request with a body, then, pipelined, the classic CL.TE pair whose
    // "body" is another request the origin must never see.
    let smuggled = format!("GET /admin HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    let bytes = format!(
        "{}{}",
        post("Content-Length: 5", "hello"),
        post(
            &format!(
                "Content-Length: {}\r\nTransfer-Encoding: chunked",
                5 + smuggled.len()
            ),
            &format!("0\r\n\r\n{smuggled}")
        )
    );
    let statuses = exchange(node.addr, bytes.as_bytes()).await;
    assert_eq!(statuses, [200, 400]);
    assert_eq!(origin.fills_for("/upload"), 1, "only the first request");
    assert_eq!(origin.fills_for("/admin"), 0, "the smuggled request");
    assert_eq!(
        node.node
            .metrics()
            .refusals(RefusalReason::LengthAndChunked),
        1
    );
}

#[tokio::test]
async fn keep_alive_requests_with_bodies_and_chunks_are_followed_and_served() {
    // The guard follows lengths and chunks to find every next head: none of these
    // legitimate requests is refused.
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let bytes = format!(
        "{}{}{}",
        post("Content-Length: 5", "hello"),
        post(
            "Transfer-Encoding: chunked",
            "5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n"
        ),
        get("Connection: close"),
    );
    let statuses = exchange(node.addr, bytes.as_bytes()).await;
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(origin.fills(), 3);
    let refused: u64 = RefusalReason::ALL
        .iter()
        .map(|r| node.node.metrics().refusals(*r))
        .sum();
    assert_eq!(refused, 0);
}

#[tokio::test]
async fn what_goes_upstream_has_one_framing_and_no_hop_by_hop_fields() {
    let origin = SyntheticOrigin::start("origin").await;
    let node = TestNode::start(config(&origin.url())).await;
    let bytes = format!(
        "{}{}",
        post(
            "Transfer-Encoding: chunked\r\nConnection: close, x-secret\r\nX-Secret: 1\r\n\
             Keep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive",
            "5\r\nhello\r\n0\r\n\r\n"
        ),
        ""
    );
    assert_eq!(exchange(node.addr, bytes.as_bytes()).await, [200]);
    let received = origin.received("/upload");
    assert_eq!(received.len(), 1);
    let headers = &received[0].headers;
    let framing = headers.get_all("content-length").iter().count()
        + headers.get_all("transfer-encoding").iter().count();
    assert_eq!(
        framing, 1,
        "exactly one framing field upstream: {headers:?}"
    );
    for name in [
        "connection",
        "x-secret",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
    ] {
        assert!(!headers.contains_key(name), "{name} leaked upstream");
    }
    assert_eq!(headers.get_all("host").iter().count(), 1);
}
