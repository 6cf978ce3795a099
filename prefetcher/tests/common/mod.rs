//! Shared set-up of the RFC 9111 conformance tests: a node in front of a synthetic
//! origin whose answers each test scripts per path, and which records every request
//! it receives (headers included), so a test counts fills and sees what was sent.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, SystemTime};

use http::Method;
use models::TenantId;
use prefetcher::Config;
use prefetcher::testing::{Fetched, SyntheticOrigin, TestClient, TestNode, wait_until};

/// The client-facing host.
pub const HOST: &str = "edge.test";

/// A node, its origin and a client.
pub struct Rig {
    pub origin: SyntheticOrigin,
    pub node: TestNode,
    pub client: TestClient,
}

/// The default configuration: default TTL and grace off, as shipped.
pub fn config(origin: &str) -> Config {
    let mut c = Config::single_origin(
        "127.0.0.1:0".parse().unwrap(),
        TenantId::new("acme").unwrap(),
        origin,
    );
    c.origin.header_timeout_ms = 20_000;
    c.flight.wait_timeout_ms = 20_000;
    c.cache.jitter = 0.0;
    c
}

impl Rig {
    /// A node with the shipped defaults.
    pub async fn start() -> Rig {
        Rig::start_with(|_| {}).await
    }

    /// A node whose configuration `tune` adjusts.
    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Rig {
        let origin = SyntheticOrigin::start("origin").await;
        let mut c = config(&origin.url());
        tune(&mut c);
        let node = TestNode::start(c).await;
        Rig {
            origin,
            node,
            client: TestClient::new(),
        }
    }

    /// `GET path` with extra request headers.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Fetched {
        self.request(Method::GET, path, headers).await
    }

    /// Any body-less request.
    pub async fn request(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Fetched {
        self.client
            .request(method, self.node.addr, HOST, path, headers)
            .await
            .expect("request")
    }

    /// Requests the origin received for `path`.
    pub fn fills(&self, path: &str) -> usize {
        self.origin.fills_for(path)
    }

    /// Waits until the origin received `n` requests for `path`.
    pub async fn wait_fills(&self, path: &str, n: usize) {
        wait_until(|| self.fills(path) >= n, "origin requests").await;
    }

    /// `n` concurrent `GET path` with `headers`, each on its own task.
    pub fn spawn_gets(
        &self,
        path: &'static str,
        headers: &'static [(&'static str, &'static str)],
        n: usize,
    ) -> Vec<tokio::task::JoinHandle<Fetched>> {
        (0..n)
            .map(|_| {
                let (client, addr) = (self.client.clone(), self.node.addr);
                tokio::spawn(async move {
                    client
                        .request(Method::GET, addr, HOST, path, headers)
                        .await
                        .expect("request")
                })
            })
            .collect()
    }

    /// Waits until `n` requests joined a fill in flight.
    pub async fn wait_waiters(&self, n: u64) {
        wait_until(
            || self.node.node.metrics().waiters_joined.get() >= n,
            "waiters to join",
        )
        .await;
    }

    /// Waits until no fill is in flight (a background refresh ended).
    pub async fn settle(&self) {
        wait_until(|| self.node.node.registry().is_empty(), "fills to end").await;
    }
}

/// An HTTP date `offset_secs` from now (negative: in the past).
pub fn date(offset_secs: i64) -> String {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs(offset_secs.unsigned_abs())
    };
    httpdate::fmt_http_date(t)
}

/// The response's header `name` as a string.
pub fn header<'a>(f: &'a Fetched, name: &str) -> Option<&'a str> {
    f.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The `x-cache` value.
pub fn x_cache(f: &Fetched) -> String {
    header(f, "x-cache").unwrap_or("").to_string()
}

/// Writes `bytes` on a fresh connection and reads until the server closes it (or
/// 10 s pass): the status of every response it read, and whether the server closed
/// the connection within those 10 s.
pub async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> (Vec<u16>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything.
    let _ = stream.write_all(bytes).await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&buf);
    let statuses = text
        .match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect();
    (statuses, read.is_ok())
}
