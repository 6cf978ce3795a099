//! The scenario's origin: a backend whose fill latency grows with the number of fills
//! it is serving at once, like a real one under load, and that counts requests per
//! second so the report can show the origin's peak against its baseline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::watch;

/// How the origin answers.
#[derive(Debug, Clone)]
pub struct OriginProfile {
    /// Latency of a fill when it is the only one.
    pub base_latency: Duration,
    /// Extra latency per fill already in progress.
    pub latency_per_fill: Duration,
    /// Latency never grows past this.
    pub max_latency: Duration,
    /// Body size.
    pub object_bytes: usize,
    /// `Cache-Control: max-age` the origin sends.
    pub max_age: Duration,
}

struct Shared {
    profile: OriginProfile,
    started: Instant,
    in_flight: AtomicUsize,
    per_second: Mutex<Vec<u64>>,
    body: Bytes,
}

/// A running origin. Stops when dropped.
pub struct LoadedOrigin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: watch::Sender<()>,
}

impl LoadedOrigin {
    /// Starts on a loopback port.
    pub async fn start(profile: OriginProfile) -> std::io::Result<LoadedOrigin> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            body: Bytes::from(vec![b'x'; profile.object_bytes]),
            profile,
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            per_second: Mutex::new(Vec::new()),
        });
        let (stop_tx, mut stop_rx) = watch::channel(());
        let app = Router::new().fallback(answer).with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.changed().await;
                })
                .await;
        });
        Ok(LoadedOrigin {
            addr,
            shared,
            _stop: stop_tx,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// When it started: second 0 of [`LoadedOrigin::per_second`].
    pub fn started(&self) -> Instant {
        self.shared.started
    }

    /// Requests received in each second since start.
    pub fn per_second(&self) -> Vec<u64> {
        self.shared
            .per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

async fn answer(State(shared): State<Arc<Shared>>) -> Response {
    let second = shared.started.elapsed().as_secs() as usize;
    {
        // A short critical section on a plain mutex: no await inside.
        let mut counts = shared.per_second.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() <= second {
            counts.resize(second + 1, 0);
        }
        counts[second] += 1;
    }
    let others = shared.in_flight.fetch_add(1, Ordering::Relaxed);
    // Counted out even when the caller goes away mid-fill.
    let _in_flight = InFlight(&shared.in_flight);
    let p = &shared.profile;
    let latency = (p.base_latency + p.latency_per_fill * others as u32).min(p.max_latency);
    tokio::time::sleep(latency).await;
    let mut response = shared.body.clone().into_response();
    let cache_control = format!("public, max-age={}", p.max_age.as_secs());
    if let Ok(value) = HeaderValue::from_str(&cache_control) {
        response.headers_mut().insert(header::CACHE_CONTROL, value);
    }
    response
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
