//! The synthetic origin as a process, for the benchmark: counts fills per path
//! (`GET /__origin/fills?path=/p`), fixed latency, `/bytes/N/...` bodies of N bytes.
//!
//! `synthetic_origin --listen 127.0.0.1:18080 --latency-ms 200`

use std::time::Duration;

use prefetcher::testing::SyntheticOrigin;

fn main() {
    let mut listen = "127.0.0.1:18080".to_string();
    let mut latency_ms = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().expect("--listen ADDR"),
            "--latency-ms" => {
                latency_ms = args
                    .next()
                    .expect("--latency-ms N")
                    .parse()
                    .expect("a number")
            }
            other => panic!("unknown argument {other}; use --listen ADDR --latency-ms N"),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(&listen).await.expect("bind");
            let origin = SyntheticOrigin::serve_on(listener, "origin");
            origin.set_latency(Duration::from_millis(latency_ms));
            println!("synthetic origin on {}", origin.url());
            std::future::pending::<()>().await;
        });
}
