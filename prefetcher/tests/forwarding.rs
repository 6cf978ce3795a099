//! What the node forwards to an origin, tried as an attacker would, with a recording
//! origin that shows what it received: every target checked once (no climbing out of
//! the tenant's origin prefix, whatever the method, credentials or body), fills and
//! pass-through requests without rewrite fields, underscore names or spoofed client
//! hops (fills in the hardened mode with only the fields RFC 9110 defines plus the
//! operator's), and no
//! body on a forwarded `GET` (a CL.0 desync on a pooled origin connection).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::{HOST, Rig, x_cache};
use http::{Method, StatusCode};
use prefetcher::RefusalReason;
use prefetcher::testing::{Scripted, TestNode, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The statuses a raw exchange read (`common::exchange`).
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    common::exchange(addr, bytes).await.0
}

/// A node in front of an origin behind the path prefix `/t1`.
async fn behind_a_prefix() -> Rig {
    Rig::start_with(|c| c.tenants[0].origin.push_str("/t1")).await
}

/// Item 1: a pass-through request (credentials, a body, an unsafe method) never
/// reaches the origin outside the tenant's prefix, in any spelling of `..`: each is
/// refused with 400 (`bad_target`) and the origin sees nothing; the same request on
/// a plain path goes through under the prefix.
#[tokio::test]
async fn no_forwarded_target_climbs_out_of_the_origin_prefix() {
    let rig = behind_a_prefix().await;
    let attacks = [
        "GET /../t2/x HTTP/1.1\r\nCookie: sid=1\r\n",
        "GET /%2e%2e/t2/x HTTP/1.1\r\nCookie: sid=1\r\n",
        "GET /..%2ft2/x HTTP/1.1\r\nCookie: sid=1\r\n",
        "GET /a/..;/../t2/x HTTP/1.1\r\nAuthorization: Bearer t\r\n",
        "GET /%252e%252e/t2/x HTTP/1.1\r\nCookie: sid=1\r\n",
        "POST /..%5ct2/x HTTP/1.1\r\nContent-Length: 3\r\n",
        "DELETE /.%2E/t2/x HTTP/1.1\r\n",
        "GET /..%2ft2/x HTTP/1.1\r\n",
    ];
    for (i, attack) in attacks.iter().enumerate() {
        let request = format!("{attack}Host: {HOST}\r\nConnection: close\r\n\r\nabc");
        let statuses = exchange(rig.node.addr, request.as_bytes()).await;
        assert_eq!(statuses, [400], "{attack:?}");
        let refused = rig.node.node.metrics().refusals(RefusalReason::BadTarget);
        assert_eq!(refused, i as u64 + 1, "{attack:?}");
    }
    assert_eq!(rig.origin.fills(), 0, "{:?}", rig.origin.received("/t2/x"));
    let fine = rig.get("/x", &[("cookie", "sid=1")]).await;
    assert_eq!(fine.status, StatusCode::OK);
    assert_eq!(rig.fills("/t1/x"), 1);
    assert_eq!(rig.origin.fills(), 1);
}

/// The fields of the attack: each names another host, URL, scheme, method or
/// client than the request's own.
const REWRITES: [(&str, &str); 15] = [
    ("x_forwarded_host", "evil.example"),
    ("x-forwarded-uri", "/admin"),
    ("x-original-uri", "/admin"),
    ("x-original-host", "evil.example"),
    ("x-forwarded-url", "http://evil.example/"),
    ("x-http-host-override", "evil.example"),
    ("x-forwarded-protocol", "ftp"),
    ("front-end-https", "on"),
    ("x-url-scheme", "ftp"),
    ("x-override-url", "/admin"),
    ("x-original-method", "DELETE"),
    ("x-forwarded-host", "evil.example"),
    ("x-client-ip", "10.6.6.6"),
    ("forwarded", "for=10.6.6.6;host=evil.example"),
    ("x-custom", "unkeyed"),
];

/// Spoofed client hops, which the node replaces by the peer it saw.
const HOPS: [(&str, &str); 3] = [
    ("x-forwarded-for", "10.6.6.6"),
    ("x-real-ip", "10.6.6.6"),
    ("true-client-ip", "10.6.6.6"),
];

/// An origin that reflects the attack's fields, as vulnerable applications do.
fn reflecting(rig: &Rig, path: &str) {
    rig.origin.script(path, |req, _| {
        let reflected: Vec<String> = REWRITES
            .iter()
            .chain(&HOPS)
            .filter_map(|(n, _)| req.get(*n).map(|v| format!("{n}={}", v.to_str().unwrap())))
            .filter(|r| !r.contains("=127.0.0.1"))
            .collect();
        Scripted::new(200, &[("cache-control", "max-age=600")]).with_body(reflected.join(";"))
    });
}

/// With the default settings a fill forwards the client's end-to-end fields (an
/// API version, a device class, a test harness's request id), but never a rewrite
/// field, an underscore spelling or a spoofed hop: an origin that reflects those
/// cannot poison the entry the next visitor hits.
#[tokio::test]
async fn a_fill_forwards_custom_fields_but_no_rewrite_field_nor_spoofed_hop() {
    let rig = Rig::start().await;
    reflecting(&rig, "/home");
    let mut attack: Vec<(&str, &str)> = REWRITES.iter().chain(&HOPS).copied().collect();
    attack.push(("x-api-version", "2"));
    attack.push(("if-none-match", "\"mine\""));
    let poisoned = rig.get("/home", &attack).await;
    assert_eq!(poisoned.body.as_deref().unwrap(), b"x-custom=unkeyed");
    let sent = &rig.origin.received("/home")[0].headers;
    for (name, _) in REWRITES.iter().filter(|(n, _)| *n != "x-custom") {
        assert!(sent.get(*name).is_none(), "{name} reached the origin");
    }
    for (name, _) in HOPS {
        assert_eq!(sent.get(name).unwrap(), "127.0.0.1", "{name}");
    }
    assert_eq!(sent.get("x-api-version").unwrap(), "2");
    assert_eq!(sent.get("x-custom").unwrap(), "unkeyed");
    assert!(
        sent.get("if-none-match").is_none(),
        "the client's validator"
    );
}

/// Item 4, hardened (`origin.fill_fields = "allowlist"`): a fill (stored for
/// everyone) forwards the fields RFC 9110 defines and the operator's
/// `origin.forward_headers`, nothing else, so not even an unknown field an origin
/// reflects without `Vary` shapes the entry the next visitor hits.
#[tokio::test]
async fn a_fill_forwards_only_the_standard_fields_and_the_named_ones() {
    let rig = Rig::start_with(|c| {
        c.origin.forward_headers = vec!["x-api-version".into()];
        c.origin.fill_fields = prefetcher::FillFields::Allowlist;
    })
    .await;
    reflecting(&rig, "/home");
    let mut attack: Vec<(&str, &str)> = REWRITES.iter().chain(&HOPS).copied().collect();
    attack.push(("x-api-version", "2"));
    attack.push(("accept-language", "de"));
    let poisoned = rig.get("/home", &attack).await;
    assert_eq!(poisoned.body.as_deref().unwrap(), b"");
    let victim = rig.get("/home", &[]).await;
    assert_eq!(x_cache(&victim), "HIT");
    assert_eq!(victim.body.as_deref().unwrap(), b"");
    let sent = &rig.origin.received("/home")[0].headers;
    for (name, _) in REWRITES {
        assert!(sent.get(name).is_none(), "{name} reached the origin");
    }
    for (name, _) in HOPS {
        assert_eq!(sent.get(name).unwrap(), "127.0.0.1", "{name}");
    }
    assert_eq!(sent.get("x-api-version").unwrap(), "2");
    assert_eq!(sent.get("accept-language").unwrap(), "de");
    assert_eq!(sent.get("x-forwarded-proto").unwrap(), "http");
}

/// Item 4, pass-through: a per-user request keeps its application's fields
/// (`Cookie`, `X-CSRF-Token`, its body's) but not the rewrite fields, underscore
/// names or spoofed hops: those re-route a request at the origin or lie about who
/// sent it, whoever gets the answer.
#[tokio::test]
async fn a_pass_through_request_carries_no_rewrite_field_nor_spoofed_hop() {
    let rig = Rig::start().await;
    let mut fields: Vec<(&str, &str)> = REWRITES.iter().chain(&HOPS).copied().collect();
    fields.push(("cookie", "sid=1"));
    fields.push(("x-csrf-token", "t0k3n"));
    fields.push(("content-type", "text/plain"));
    let posted = rig
        .client
        .send(Method::POST, rig.node.addr, HOST, "/form", &fields, "a=1")
        .await
        .unwrap();
    assert_eq!(x_cache(&posted), "BYPASS");
    let get = rig.get("/account", &fields).await;
    assert_eq!(x_cache(&get), "BYPASS");
    for path in ["/form", "/account"] {
        let sent = &rig.origin.received(path)[0].headers;
        for (name, _) in REWRITES.iter().filter(|(n, _)| *n != "x-custom") {
            assert!(
                sent.get(*name).is_none(),
                "{path}: {name} reached the origin"
            );
        }
        for (name, _) in HOPS {
            assert_eq!(sent.get(name).unwrap(), "127.0.0.1", "{path}: {name}");
        }
        assert_eq!(sent.get("cookie").unwrap(), "sid=1", "{path}");
        assert_eq!(sent.get("x-csrf-token").unwrap(), "t0k3n", "{path}");
        assert_eq!(sent.get("x-custom").unwrap(), "unkeyed", "{path}");
    }
}

/// Item 4: the hops of a configured trusted proxy are believed and appended to.
#[tokio::test]
async fn a_trusted_proxys_hops_are_kept_and_appended_to() {
    let rig = Rig::start_with(|c| c.server.trusted_proxies = vec!["127.0.0.0/8".into()]).await;
    rig.get(
        "/t",
        &[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-real-ip", "198.51.100.1"),
        ],
    )
    .await;
    let sent = &rig.origin.received("/t")[0].headers;
    assert_eq!(
        sent.get("x-forwarded-for").unwrap(),
        "198.51.100.1, 127.0.0.1"
    );
    assert_eq!(sent.get("x-real-ip").unwrap(), "198.51.100.1");
}

/// An origin that reads requests as a careless server does: a `GET`'s body is never
/// read, so its bytes are taken for the next request on the connection. It answers
/// `200 ok` to each and records each request head.
async fn naive_origin() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&lines);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let lines = Arc::clone(&recorded);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        buf.drain(..end + 4);
                        let line = head.lines().next().unwrap_or("").to_string();
                        if !line.starts_with("GET") && !line.starts_with("HEAD") {
                            // Other methods: the body is read by its length.
                            let length = head
                                .lines()
                                .filter_map(|l| l.split_once(':'))
                                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            buf.drain(..length.min(buf.len()));
                        }
                        lines.lock().unwrap().push(head);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, lines)
}

/// Item 5: a `GET` (or `HEAD`) with a body is refused with 400 (`get_with_body`) and
/// the connection closed: its body never reaches a pooled origin connection, where
/// an origin that ignores `GET` bodies would run it as a second request.
#[tokio::test]
async fn a_get_with_a_body_is_refused_and_never_desyncs_the_origin() {
    let (origin, lines) = naive_origin().await;
    let node = TestNode::start(common::config(&format!("http://{origin}"))).await;
    let smuggled = format!("GET /smuggled HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    for (method, framing, body) in [
        (
            "GET",
            format!("Content-Length: {}", smuggled.len()),
            smuggled.clone(),
        ),
        (
            "GET",
            "Transfer-Encoding: chunked".to_string(),
            format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len()),
        ),
        (
            "HEAD",
            format!("Content-Length: {}", smuggled.len()),
            smuggled.clone(),
        ),
    ] {
        let request = format!(
            "{method} /a HTTP/1.1\r\nHost: {HOST}\r\nCookie: sid=1\r\n{framing}\r\n\r\n{body}"
        );
        let statuses = exchange(node.addr, request.as_bytes()).await;
        assert_eq!(statuses, [400], "{method} {framing}");
    }
    let reason = RefusalReason::parse("get_with_body").expect("a refusal reason");
    assert_eq!(node.node.metrics().refusals(reason), 3);
    // A legitimate request after them reaches the origin; nothing was smuggled in.
    let after = format!(
        "GET /after HTTP/1.1\r\nHost: {HOST}\r\nCookie: sid=1\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(exchange(node.addr, after.as_bytes()).await, [200]);
    wait_until(
        || lines.lock().unwrap().iter().any(|l| l.contains("/after")),
        "/after",
    )
    .await;
    let seen = lines.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|l| !l.contains("/smuggled") && !l.contains(" /a ")),
        "the origin saw {seen:?}"
    );
}
