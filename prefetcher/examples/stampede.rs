//! A stampede: N clients, each on its own HTTP/1.1 connection, all connected first,
//! then released at once to GET one URL. Prints `ok errors p50_ms p99_ms max_ms`.
//!
//! `stampede --addr 127.0.0.1:18081 --host h --path /cold --n 1000`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::sync::Barrier;

fn main() {
    let mut addr: Option<SocketAddr> = None;
    let mut host = "localhost".to_string();
    let mut path = "/".to_string();
    let mut n = 1000usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().expect("flag value");
        match arg.as_str() {
            "--addr" => addr = Some(value.parse().expect("--addr HOST:PORT")),
            "--host" => host = value,
            "--path" => path = value,
            "--n" => n = value.parse().expect("--n N"),
            other => panic!("unknown argument {other}"),
        }
    }
    let addr = addr.expect("--addr is required");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(addr, host, path, n));
}

async fn run(addr: SocketAddr, host: String, path: String, n: usize) {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (barrier, host, path) = (barrier.clone(), host.clone(), path.clone());
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await;
            let sender = match stream {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                        Ok((sender, conn)) => {
                            tokio::spawn(conn);
                            Some(sender)
                        }
                        Err(_) => None,
                    }
                }
                Err(_) => None,
            };
            barrier.wait().await;
            let mut sender = sender?;
            let started = Instant::now();
            let request = http::Request::builder()
                .uri(path.as_str())
                .header(http::header::HOST, host.as_str())
                .body(Empty::<Bytes>::new())
                .ok()?;
            let response = tokio::time::timeout(Duration::from_secs(30), async {
                let response = sender.send_request(request).await.ok()?;
                let ok = response.status().is_success();
                let body = response.into_body().collect().await.ok()?;
                (ok && !body.to_bytes().is_empty()).then_some(())
            })
            .await
            .ok()
            .flatten();
            response.map(|()| started.elapsed())
        }));
    }
    let mut latencies = Vec::with_capacity(n);
    let mut errors = 0;
    for task in tasks {
        match task.await {
            Ok(Some(d)) => latencies.push(d),
            _ => errors += 1,
        }
    }
    latencies.sort();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    println!(
        "ok={} errors={} p50_ms={:.1} p99_ms={:.1} max_ms={:.1}",
        latencies.len(),
        errors,
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
}
