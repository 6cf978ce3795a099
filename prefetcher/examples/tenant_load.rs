//! Load for the tenants benchmark, one of two kinds:
//!
//! - `--flood N`: N clients, each on its own HTTP/1.1 connection, each asking for a
//!   new unique key under `--prefix` as soon as its last answer came (after an error,
//!   a 1 s pause), for `--secs` seconds. Prints `ok errors`.
//! - `--rps R`: an open-loop steady client, R requests a second for `--secs`
//!   seconds, each on a new connection; `--miss-percent P` of them ask for a new key,
//!   the others for one of 20 keys fetched once before the run (hits). Prints
//!   `hits misses hit_ok miss_ok success hit_p99_ms miss_p99_ms` (an error or a
//!   request past 30 s counts as failed; p99 over the successful ones).
//!
//! `tenant_load --addr 127.0.0.1:18081 --host b.test --prefix /bytes/1024/b-1 --rps 200 --secs 15`

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

struct Args {
    addr: SocketAddr,
    host: String,
    prefix: String,
    flood: usize,
    rps: u64,
    miss_percent: u64,
    secs: u64,
}

fn main() {
    let mut addr = None;
    let (mut host, mut prefix) = ("localhost".to_string(), "/bytes/1024/load".to_string());
    let (mut flood, mut rps, mut miss_percent, mut secs) = (0, 0, 10, 10);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().expect("flag value");
        match arg.as_str() {
            "--addr" => addr = Some(value.parse().expect("--addr HOST:PORT")),
            "--host" => host = value,
            "--prefix" => prefix = value,
            "--flood" => flood = value.parse().expect("--flood N"),
            "--rps" => rps = value.parse().expect("--rps R"),
            "--miss-percent" => miss_percent = value.parse().expect("--miss-percent P"),
            "--secs" => secs = value.parse().expect("--secs S"),
            other => panic!("unknown argument {other}"),
        }
    }
    let args = Args {
        addr: addr.expect("--addr is required"),
        host,
        prefix,
        flood,
        rps,
        miss_percent,
        secs,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            if args.flood > 0 {
                run_flood(Arc::new(args)).await
            } else {
                run_steady(Arc::new(args)).await
            }
        });
}

/// One GET on a new connection: its time if it answered 2xx with a body in 30 s.
async fn get(addr: SocketAddr, host: &str, path: &str) -> Option<Duration> {
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        let request = http::Request::builder()
            .uri(path)
            .header(http::header::HOST, host)
            .body(Empty::<Bytes>::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let ok = response.status().is_success();
        let body = response.into_body().collect().await.ok()?;
        (ok && !body.to_bytes().is_empty()).then(|| started.elapsed())
    })
    .await
    .ok()
    .flatten()
}

async fn run_flood(args: Arc<Args>) {
    let end = Instant::now() + Duration::from_secs(args.secs);
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..args.flood)
        .map(|_| {
            let (args, next, ok, errors) = (args.clone(), next.clone(), ok.clone(), errors.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    let key = next.fetch_add(1, Ordering::Relaxed);
                    let path = format!("{}-{key}", args.prefix);
                    if get(args.addr, &args.host, &path).await.is_some() {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            })
        })
        .collect();
    for client in clients {
        let _ = client.await;
    }
    println!(
        "ok={} errors={}",
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
}

async fn run_steady(args: Arc<Args>) {
    const HOT: usize = 20;
    for k in 0..HOT {
        let path = format!("{}-hot-{k}", args.prefix);
        get(args.addr, &args.host, &path).await;
        get(args.addr, &args.host, &path).await;
    }
    let total = args.rps * args.secs;
    let every = Duration::from_secs_f64(1.0 / args.rps.max(1) as f64);
    let start = tokio::time::Instant::now();
    let mut requests = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + every * i as u32).await;
        // Spread the misses evenly: request i misses when it crosses a multiple.
        let miss = (i + 1) * args.miss_percent / 100 > i * args.miss_percent / 100;
        let path = if miss {
            format!("{}-new-{i}", args.prefix)
        } else {
            format!("{}-hot-{}", args.prefix, i as usize % HOT)
        };
        let args = args.clone();
        requests.push((
            miss,
            tokio::spawn(async move { get(args.addr, &args.host, &path).await }),
        ));
    }
    let (mut hits, mut misses) = (Vec::new(), Vec::new());
    let (mut hit_n, mut miss_n) = (0usize, 0usize);
    for (miss, request) in requests {
        let took = request.await.ok().flatten();
        if miss {
            miss_n += 1;
            misses.extend(took);
        } else {
            hit_n += 1;
            hits.extend(took);
        }
    }
    let p99 = |v: &mut Vec<Duration>| -> String {
        if v.is_empty() {
            return "-".into();
        }
        v.sort();
        let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
        format!("{:.1}", v[i].as_secs_f64() * 1000.0)
    };
    println!(
        "hits={hit_n} misses={miss_n} hit_ok={} miss_ok={} success={:.4} hit_p99_ms={} miss_p99_ms={}",
        hits.len(),
        misses.len(),
        (hits.len() + misses.len()) as f64 / (hit_n + miss_n).max(1) as f64,
        p99(&mut hits),
        p99(&mut misses)
    );
}
