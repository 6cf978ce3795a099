//! A slow-header attack beside an ordinary client, for `scripts/bench/prefetcher
//! slow-clients`: `--slow N` connections each send a request line, then one header
//! line every `--line-ms`, never ending the head; when the server closes one, it
//! reconnects (as an attacker would) after `--line-ms`. The slow connections come
//! from `--per-address` connections per source address, counting up from `--from`
//! (127.0.0.2, 127.0.0.3, ... on Linux loopback). After `--hold` seconds, ordinary
//! requests go out from `--ordinary-from` at `--rps` for `--secs` seconds, each on a
//! new connection (a new visitor), open-loop. With `--slow 0` it is only the ordinary
//! client; with `--secs 0` only the attacker (the bench runs the two as two processes).
//!
//! Prints progress to stderr and one line to stdout:
//! `held_at_hold=… held_at_end=… longest_s=… connects=… closed_by_server=…
//! connect_errors=… ordinary=… ok=… success=… p50_ms=… p99_ms=… max_ms=…`
//! (`held_*`: slow connections open then; `longest_s`: the longest any stayed open,
//! until the server closed it or the run ended; latency to the whole
//! response of the successful ordinary requests; a failure is a refused or reset
//! connection, a status other than 200, a short body, or no answer within 10 s).
//!
//! `slow_clients --addr 127.0.0.1:18081 --slow 10000 --from 127.0.0.2 --per-address 1000`

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;

struct Options {
    addr: SocketAddr,
    host: String,
    slow: usize,
    from: Ipv4Addr,
    per_address: usize,
    line_ms: u64,
    hold_s: u64,
    ordinary_from: Ipv4Addr,
    path: String,
    rps: u64,
    secs: u64,
    /// Ordinary requests slower than this (ms) are printed to stderr with their time.
    report_over_ms: Option<u64>,
}

#[derive(Default)]
struct Counts {
    /// When each open slow connection opened, by client number.
    opened: Mutex<HashMap<usize, Instant>>,
    /// The longest a closed slow connection had stayed open, in ms.
    longest_closed_ms: AtomicU64,
    open: AtomicI64,
    connects: AtomicU64,
    closed_by_server: AtomicU64,
    connect_errors: AtomicU64,
}

fn main() {
    let mut o = Options {
        addr: "127.0.0.1:18081".parse().unwrap(),
        host: "bench.test".into(),
        slow: 10_000,
        from: Ipv4Addr::new(127, 0, 0, 2),
        per_address: 1_000,
        line_ms: 1_000,
        hold_s: 20,
        ordinary_from: Ipv4Addr::LOCALHOST,
        path: "/bytes/1024/ordinary".into(),
        rps: 100,
        secs: 10,
        report_over_ms: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().expect("flag value");
        let number = || value.parse::<u64>().expect("a number");
        match flag.as_str() {
            "--addr" => o.addr = value.parse().expect("--addr HOST:PORT"),
            "--host" => o.host = value.clone(),
            "--slow" => o.slow = number() as usize,
            "--from" => o.from = value.parse().expect("--from IPv4"),
            "--per-address" => o.per_address = number().max(1) as usize,
            "--line-ms" => o.line_ms = number().max(1),
            "--hold" => o.hold_s = number(),
            "--ordinary-from" => o.ordinary_from = value.parse().expect("--ordinary-from IPv4"),
            "--path" => o.path = value.clone(),
            "--rps" => o.rps = number().max(1),
            "--secs" => o.secs = number(),
            "--report-over-ms" => o.report_over_ms = Some(number()),
            other => panic!("unknown flag {other}"),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(Arc::new(o)));
}

async fn run(o: Arc<Options>) {
    let counts = Arc::new(Counts::default());
    // Connect attempts in flight at once: a listen backlog is finite.
    let connecting = Arc::new(Semaphore::new(256));
    for i in 0..o.slow {
        let from = Ipv4Addr::from(u32::from(o.from) + (i / o.per_address) as u32);
        tokio::spawn(slow_client(
            Arc::clone(&o),
            i,
            from,
            Arc::clone(&counts),
            Arc::clone(&connecting),
        ));
    }
    let start = Instant::now();
    let report = {
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                eprintln!(
                    "t={:>3}s slow open={} connects={} closed_by_server={} connect_errors={}",
                    start.elapsed().as_secs(),
                    counts.open.load(Ordering::Relaxed),
                    counts.connects.load(Ordering::Relaxed),
                    counts.closed_by_server.load(Ordering::Relaxed),
                    counts.connect_errors.load(Ordering::Relaxed),
                );
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(o.hold_s)).await;
    let held_at_hold = counts.open.load(Ordering::Relaxed);

    let mut probes = Vec::new();
    let gap = Duration::from_secs(1) / o.rps as u32;
    let mut next = tokio::time::Instant::now();
    for _ in 0..o.rps * o.secs {
        tokio::time::sleep_until(next).await;
        next += gap;
        let o = Arc::clone(&o);
        probes.push(tokio::spawn(async move {
            let latency = ordinary(Arc::clone(&o)).await;
            if let Some(over) = o.report_over_ms {
                let ms = latency.map_or(f64::INFINITY, |l| l.as_secs_f64() * 1e3);
                if ms > over as f64 {
                    eprintln!(
                        "t={:.2}s ordinary took {ms:.1} ms",
                        start.elapsed().as_secs_f64()
                    );
                }
            }
            latency
        }));
    }
    let mut latencies = Vec::new();
    let total = probes.len();
    for probe in probes {
        if let Ok(Some(latency)) = probe.await {
            latencies.push(latency);
        }
    }
    let held_at_end = counts.open.load(Ordering::Relaxed);
    let oldest_open = counts
        .opened
        .lock()
        .unwrap()
        .values()
        .map(|t| t.elapsed().as_millis() as u64)
        .max()
        .unwrap_or(0);
    let longest_s =
        oldest_open.max(counts.longest_closed_ms.load(Ordering::Relaxed)) as f64 / 1000.0;
    report.abort();
    latencies.sort();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    println!(
        "held_at_hold={held_at_hold} held_at_end={held_at_end} longest_s={longest_s:.1} \
         connects={} closed_by_server={} \
         connect_errors={} ordinary={total} ok={} success={:.4} p50_ms={:.1} p99_ms={:.1} max_ms={:.1}",
        counts.connects.load(Ordering::Relaxed),
        counts.closed_by_server.load(Ordering::Relaxed),
        counts.connect_errors.load(Ordering::Relaxed),
        latencies.len(),
        latencies.len() as f64 / total.max(1) as f64,
        pct(0.50),
        pct(0.99),
        pct(1.0),
    );
}

async fn connect(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    socket.connect(to).await
}

/// One slow connection at a time, for ever: a request line, then a header line every
/// `line_ms`, watching for the server to close it.
async fn slow_client(
    o: Arc<Options>,
    i: usize,
    from: Ipv4Addr,
    counts: Arc<Counts>,
    connecting: Arc<Semaphore>,
) {
    let line = Duration::from_millis(o.line_ms);
    loop {
        let permit = connecting.acquire().await.expect("semaphore");
        let stream = tokio::time::timeout(Duration::from_secs(10), connect(from, o.addr)).await;
        drop(permit);
        let mut stream = match stream {
            Ok(Ok(stream)) => stream,
            _ => {
                counts.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(line).await;
                continue;
            }
        };
        counts.connects.fetch_add(1, Ordering::Relaxed);
        counts.open.fetch_add(1, Ordering::Relaxed);
        let opened = Instant::now();
        counts.opened.lock().unwrap().insert(i, opened);
        let start = format!("GET /slow-{i} HTTP/1.1\r\nHost: {}\r\n", o.host);
        let mut alive = stream.write_all(start.as_bytes()).await.is_ok();
        let mut n = 0u64;
        let mut buf = [0u8; 1024];
        while alive {
            tokio::select! {
                // Any answer (a 408, a 400) or a close ends this connection.
                _ = stream.read(&mut buf) => alive = false,
                () = tokio::time::sleep(line) => {
                    n += 1;
                    let header = format!("X-Slow-{n}: {n}\r\n");
                    alive = stream.write_all(header.as_bytes()).await.is_ok();
                }
            }
        }
        counts.open.fetch_sub(1, Ordering::Relaxed);
        counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
        counts.opened.lock().unwrap().remove(&i);
        let lived = opened.elapsed().as_millis() as u64;
        counts.longest_closed_ms.fetch_max(lived, Ordering::Relaxed);
        drop(stream);
        tokio::time::sleep(line).await;
    }
}

/// One ordinary request on a new connection: the time to the whole 200 response.
async fn ordinary(o: Arc<Options>) -> Option<Duration> {
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = connect(o.ordinary_from, o.addr).await.ok()?;
        let _ = stream.set_nodelay(true);
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            o.path, o.host
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(response)
    })
    .await
    .ok()
    .flatten()?;
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        return None;
    }
    let body = &answer[head_end..];
    let complete = match head.lines().find_map(|l| l.strip_prefix("content-length:")) {
        Some(length) => length.trim().parse::<usize>().ok()? == body.len(),
        None => head.contains("transfer-encoding: chunked") && body.ends_with(b"0\r\n\r\n"),
    };
    complete.then(|| started.elapsed())
}
