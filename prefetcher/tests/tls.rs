//! TLS on real sockets (issue 14): the client listener (certificate and key files,
//! HTTP/1.1 and HTTP/2 by ALPN, plain HTTP still served) and `https://` origins
//! (a configured CA file, the server name from the tenant's host, a bad certificate
//! answered 502 and counted). Certificates are made at run time with rcgen; the
//! client is reqwest over rustls; the TLS origin is a second node's TLS listener in
//! front of a counting synthetic origin.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use models::TenantId;
use prefetcher::testing::SyntheticOrigin;
use prefetcher::{CacheStatus, Config, NodeHandle, StartError, TlsListenConfig, spawn_node};

/// A self-signed certificate for `names`, written as PEM files.
struct Cert {
    pem: String,
    _dir: tempfile::TempDir,
    cert_file: PathBuf,
    key_file: PathBuf,
}

fn cert(names: &[&str]) -> Cert {
    let generated =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("generate a certificate");
    let dir = tempfile::tempdir().unwrap();
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    let pem = generated.cert.pem();
    std::fs::File::create(&cert_file)
        .unwrap()
        .write_all(pem.as_bytes())
        .unwrap();
    std::fs::File::create(&key_file)
        .unwrap()
        .write_all(generated.key_pair.serialize_pem().as_bytes())
        .unwrap();
    Cert {
        pem,
        _dir: dir,
        cert_file,
        key_file,
    }
}

fn config(origin: &str) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.origin.header_timeout_ms = 20_000;
    c.flight.wait_timeout_ms = 20_000;
    c
}

fn with_tls(mut c: Config, cert: &Cert) -> Config {
    c.tls = Some(TlsListenConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: cert.cert_file.clone(),
        key_file: cert.key_file.clone(),
    });
    c
}

/// A reqwest client that trusts `cert` and reaches `name` at `addr`.
fn client(cert: &Cert, name: &str, addr: SocketAddr, http1_only: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem.as_bytes()).unwrap())
        .resolve(name, addr);
    if http1_only {
        builder = builder.http1_only();
    }
    builder.build().unwrap()
}

fn x_cache(response: &reqwest::Response) -> Option<CacheStatus> {
    CacheStatus::parse(response.headers().get("x-cache")?.to_str().ok()?)
}

/// A request that came over the TLS listener reaches the origin with
/// `X-Forwarded-Proto: https` (fills and pass-through alike, whatever the client claims),
/// one over the plain listener with `http`; both name the client in `X-Forwarded-For`.
#[tokio::test]
async fn the_origin_learns_from_x_forwarded_proto_which_listener_the_client_used() {
    let origin = SyntheticOrigin::start("origin").await;
    let cert = cert(&["edge.test"]);
    let node = spawn_node(with_tls(config(&origin.url()), &cert))
        .await
        .unwrap();
    let tls_addr = node.tls_addr().expect("a TLS listener");
    let base = format!("https://edge.test:{}", tls_addr.port());
    for http1_only in [false, true] {
        let over_tls = client(&cert, "edge.test", tls_addr, http1_only);
        let path = format!("/fill-{http1_only}");
        let fill = over_tls
            .get(format!("{base}{path}"))
            .header("x-forwarded-proto", "http")
            .send()
            .await
            .unwrap();
        assert_eq!(fill.status(), 200);
        assert_eq!(x_cache(&fill), Some(CacheStatus::Miss));
        let posted = over_tls
            .post(format!("{base}/post-{http1_only}"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(x_cache(&posted), Some(CacheStatus::Bypass));
        for path in [path, format!("/post-{http1_only}")] {
            let received = origin.received(&path);
            assert_eq!(received.len(), 1, "{path}");
            let headers = &received[0].headers;
            assert_eq!(headers.get("x-forwarded-proto").unwrap(), "https", "{path}");
            assert_eq!(
                headers.get("x-forwarded-for").unwrap(),
                "127.0.0.1",
                "{path}"
            );
        }
    }
    let plain = reqwest::Client::new()
        .get(format!("{}/plain", node.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(x_cache(&plain), Some(CacheStatus::Miss));
    let received = origin.received("/plain");
    assert_eq!(
        received[0].headers.get("x-forwarded-proto").unwrap(),
        "http"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn the_tls_listener_speaks_http2_and_http1_by_alpn_and_plain_http_stays() {
    let origin = SyntheticOrigin::start("origin").await;
    let cert = cert(&["edge.test"]);
    let node = spawn_node(with_tls(config(&origin.url()), &cert))
        .await
        .unwrap();
    let tls_addr = node.tls_addr().expect("a TLS listener");
    let expected = SyntheticOrigin::body_for("origin", "/a", 1024);

    let h2 = client(&cert, "edge.test", tls_addr, false);
    let url = format!("https://edge.test:{}/a", tls_addr.port());
    let first = h2.get(&url).send().await.unwrap();
    assert_eq!(first.version(), http::Version::HTTP_2, "h2 chosen by ALPN");
    assert_eq!(first.status(), 200);
    assert_eq!(x_cache(&first), Some(CacheStatus::Miss));
    assert_eq!(first.bytes().await.unwrap(), expected);

    let h1 = client(&cert, "edge.test", tls_addr, true);
    let second = h1.get(&url).send().await.unwrap();
    assert_eq!(second.version(), http::Version::HTTP_11);
    assert_eq!(x_cache(&second), Some(CacheStatus::Hit));
    assert_eq!(second.bytes().await.unwrap(), expected);

    // The plain listener serves the same cache, under keys of its own: the scheme is
    // in the key (the origin may answer `http` and `https` differently).
    for cached in [CacheStatus::Miss, CacheStatus::Hit] {
        let plain = reqwest::Client::new()
            .get(format!("{}/a", node.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(plain.version(), http::Version::HTTP_11);
        assert_eq!(x_cache(&plain), Some(cached));
        assert_eq!(plain.bytes().await.unwrap(), expected);
    }
    // A range over HTTP/2 and TLS, cut from the cache.
    let range = h2
        .get(&url)
        .header("range", "bytes=-24")
        .send()
        .await
        .unwrap();
    assert_eq!(range.version(), http::Version::HTTP_2);
    assert_eq!(range.status(), 206);
    assert_eq!(range.bytes().await.unwrap(), expected.slice(1000..));
    assert_eq!(origin.fills_for("/a"), 2, "one fill per scheme");

    // A client that does not trust the certificate gets no response at all.
    let untrusting = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .resolve("edge.test", tls_addr)
        .build()
        .unwrap();
    assert!(untrusting.get(&url).send().await.is_err());
    node.shutdown().await;
}

fn start_error(result: Result<NodeHandle, StartError>) -> String {
    match result {
        Ok(_) => panic!("the node started with a bad TLS file"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn bad_certificate_or_key_files_fail_the_start_naming_the_field() {
    let cert = cert(&["edge.test"]);
    let other = self::cert(&["edge.test"]);
    let base = || with_tls(config("http://127.0.0.1:9"), &cert);

    let mut c = base();
    c.tls.as_mut().unwrap().cert_file = "/nonexistent/cert.pem".into();
    let e = start_error(spawn_node(c).await);
    assert!(e.contains("tls.cert_file"), "{e}");

    let mut c = base();
    c.tls.as_mut().unwrap().key_file = cert.cert_file.clone();
    let e = start_error(spawn_node(c).await);
    assert!(e.contains("tls.key_file"), "{e}");

    let mut c = base();
    c.tls.as_mut().unwrap().key_file = other.key_file.clone();
    let e = start_error(spawn_node(c).await);
    assert!(e.contains("tls.key_file"), "{e}");

    let mut c = config("https://127.0.0.1:9");
    c.origin.ca_file = Some("/nonexistent/ca.pem".into());
    let e = start_error(spawn_node(c).await);
    assert!(e.contains("origin.ca_file"), "{e}");
}

/// A TLS origin: a second node whose TLS listener serves `cert` in front of
/// `origin`.
async fn tls_origin(origin: &SyntheticOrigin, cert: &Cert) -> NodeHandle {
    spawn_node(with_tls(config(&origin.url()), cert))
        .await
        .unwrap()
}

#[tokio::test]
async fn an_https_origin_is_verified_with_the_ca_file_for_the_tenants_host() {
    let origin = SyntheticOrigin::start("origin").await;
    // The certificate names only origin.test: the edge reaches it by IP, so the
    // handshake succeeds only when the server name comes from the tenant's host.
    let origin_cert = cert(&["origin.test"]);
    let shield = tls_origin(&origin, &origin_cert).await;
    let tls_addr = shield.tls_addr().unwrap();
    let mut c = config(&format!("https://{tls_addr}"));
    c.tenants[0].host_header = Some("origin.test".into());
    c.origin.ca_file = Some(origin_cert.cert_file.clone());
    let edge = spawn_node(c).await.unwrap();

    let client = reqwest::Client::new();
    let url = format!("{}/tls/a", edge.url());
    let first = client.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(x_cache(&first), Some(CacheStatus::Miss));
    assert_eq!(
        first.bytes().await.unwrap(),
        SyntheticOrigin::body_for("origin", "/tls/a", 1024)
    );
    let second = client.get(&url).send().await.unwrap();
    assert_eq!(x_cache(&second), Some(CacheStatus::Hit));
    assert_eq!(origin.fills_for("/tls/a"), 1);
    // Pass-through requests reach the TLS origin too.
    let post = client.post(&url).body("x").send().await.unwrap();
    assert_eq!(x_cache(&post), Some(CacheStatus::Bypass));
    assert_eq!(post.status(), 200);
    assert_eq!(edge.node().metrics().origin_tls_failures.get(), 0);
    edge.shutdown().await;
    shield.shutdown().await;
}

#[tokio::test]
async fn an_untrusted_or_misnamed_origin_certificate_is_a_counted_502() {
    let origin = SyntheticOrigin::start("origin").await;
    let origin_cert = cert(&["origin.test"]);
    let shield = tls_origin(&origin, &origin_cert).await;
    let tls_addr = shield.tls_addr().unwrap();
    let client = reqwest::Client::new();

    // Not trusted: the system's roots do not hold a self-signed certificate.
    let mut c = config(&format!("https://{tls_addr}"));
    c.tenants[0].host_header = Some("origin.test".into());
    let edge = spawn_node(c).await.unwrap();
    let response = client
        .get(format!("{}/untrusted", edge.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(x_cache(&response), Some(CacheStatus::Miss));
    let message = response.text().await.unwrap();
    assert!(
        message.contains("origin TLS failed") && message.contains("certificate"),
        "{message}"
    );
    let metrics = edge.node().metrics();
    assert_eq!(metrics.origin_tls_failures.get(), 1);
    assert!(
        metrics
            .encode()
            .contains(r#"prefetcher_fill_failures_total{reason="tls"} 1"#),
        "{}",
        metrics.encode()
    );
    // Errors are not cached: the next request tries again (and fails again).
    let again = client
        .get(format!("{}/untrusted", edge.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 502);
    assert_eq!(metrics.origin_tls_failures.get(), 2);

    // Trusted CA, wrong name: the certificate is not for the tenant's host.
    let mut c = config(&format!("https://{tls_addr}"));
    c.tenants[0].host_header = Some("elsewhere.test".into());
    c.origin.ca_file = Some(origin_cert.cert_file.clone());
    let edge = spawn_node(c).await.unwrap();
    let response = client
        .get(format!("{}/misnamed", edge.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let message = response.text().await.unwrap();
    assert!(message.contains("origin TLS failed"), "{message}");
    assert_eq!(edge.node().metrics().origin_tls_failures.get(), 1);
    assert_eq!(origin.fills(), 0, "no request reached the origin");
    shield.shutdown().await;
}
