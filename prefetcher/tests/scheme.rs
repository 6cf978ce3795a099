//! The scheme is part of the primary cache key (item 3): the origin learns it from
//! `X-Forwarded-Proto` and may answer each differently, so an `http` fill is never a
//! `HIT` over TLS; and a response that varies on a field the node sets is stored and
//! looked up under one secondary key (variants are computed from what the fill sent).

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use common::{Rig, x_cache};
use prefetcher::testing::{Scripted, SyntheticOrigin};
use prefetcher::{CacheStatus, TlsListenConfig, spawn_node};

/// A self-signed certificate for `edge.test`, written as PEM files.
struct Cert {
    pem: String,
    _dir: tempfile::TempDir,
    cert_file: PathBuf,
    key_file: PathBuf,
}

fn cert() -> Cert {
    let generated = rcgen::generate_simple_self_signed(vec!["edge.test".to_string()]).unwrap();
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

fn tls_client(cert: &Cert, addr: SocketAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem.as_bytes()).unwrap())
        .resolve("edge.test", addr)
        .build()
        .unwrap()
}

fn status(r: &reqwest::Response) -> Option<CacheStatus> {
    CacheStatus::parse(r.headers().get("x-cache")?.to_str().ok()?)
}

/// An origin answering with the scheme it was told, as one that builds absolute
/// links or redirects to `https` does.
fn by_proto(origin: &SyntheticOrigin, path: &str, vary: bool) {
    origin.script(path, move |req, _| {
        let proto = req
            .get("x-forwarded-proto")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let mut headers = vec![("cache-control", "max-age=600")];
        if vary {
            headers.push(("vary", "X-Forwarded-Proto"));
        }
        Scripted::new(200, &headers).with_body(format!("proto={proto}"))
    });
}

/// An `http` fill is not served over TLS, nor an `https` one over plain HTTP: each
/// scheme fills once and then hits its own entry.
#[tokio::test]
async fn an_http_fill_is_never_a_hit_over_tls() {
    let origin = SyntheticOrigin::start("origin").await;
    by_proto(&origin, "/page", false);
    let cert = cert();
    let mut config = common::config(&origin.url());
    config.tls = Some(TlsListenConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: cert.cert_file.clone(),
        key_file: cert.key_file.clone(),
    });
    let node = spawn_node(config).await.unwrap();
    let tls_addr = node.tls_addr().expect("a TLS listener");
    let plain = reqwest::Client::new();
    let tls = tls_client(&cert, tls_addr);
    let plain_url = format!("{}/page", node.url());
    let tls_url = format!("https://edge.test:{}/page", tls_addr.port());
    let first = plain.get(&plain_url).send().await.unwrap();
    assert_eq!(status(&first), Some(CacheStatus::Miss));
    assert_eq!(first.text().await.unwrap(), "proto=http");
    for (url, client, expected, cache) in [
        (&tls_url, &tls, "proto=https", CacheStatus::Miss),
        (&tls_url, &tls, "proto=https", CacheStatus::Hit),
        (&plain_url, &plain, "proto=http", CacheStatus::Hit),
    ] {
        let r = client.get(url).send().await.unwrap();
        assert_eq!(status(&r), Some(cache), "{url}");
        assert_eq!(r.text().await.unwrap(), expected, "{url}");
    }
    assert_eq!(origin.fills_for("/page"), 2);
    node.shutdown().await;
}

/// `Vary: X-Forwarded-Proto`, a field the node sets: the second plain request hits
/// the variant the first stored (it was computed from what the fill sent, not from
/// the client's absent field), and a client claiming `https` over plain HTTP selects
/// the same `http` variant.
#[tokio::test]
async fn a_variant_on_a_field_the_node_sets_is_found_where_it_was_stored() {
    let rig = Rig::start().await;
    by_proto(&rig.origin, "/v", true);
    let first = rig.get("/v", &[]).await;
    assert_eq!(x_cache(&first), "MISS");
    let second = rig.get("/v", &[]).await;
    assert_eq!(x_cache(&second), "HIT");
    let spoofed = rig.get("/v", &[("x-forwarded-proto", "https")]).await;
    assert_eq!(x_cache(&spoofed), "HIT");
    assert_eq!(spoofed.body.as_deref().unwrap(), b"proto=http");
    assert_eq!(rig.fills("/v"), 1);
}
