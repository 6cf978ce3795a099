//! The scenario's clients: an open-loop load (requests leave on schedule whether or not
//! earlier ones have returned, as real users do) of a Zipf background over many keys,
//! plus a viral key that starts in one region and spreads to the others. Every answer
//! is recorded with its latency and how the edge answered it (`x-cache`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};

/// One answered (or failed) request.
#[derive(Debug, Clone)]
pub struct Answer {
    /// When it was sent, since the load started.
    pub sent: Duration,
    /// The region of the edge node it went to.
    pub region: usize,
    /// Whether it was for the viral key.
    pub viral: bool,
    /// Whether it was for one of the hot background keys.
    pub hot: bool,
    /// Time to the whole body.
    pub latency: Duration,
    /// The `x-cache` value, when there was a response.
    pub x_cache: Option<String>,
    /// Whether the status was 2xx and the body complete.
    pub ok: bool,
}

/// What the clients do.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// Random seed: the same plan and seed send the same requests.
    pub seed: u64,
    /// How long the load runs.
    pub duration: Duration,
    /// Background requests per second over the fleet.
    pub background_rps: f64,
    /// Distinct background keys.
    pub keys: usize,
    /// Zipf exponent of background key popularity.
    pub zipf_exponent: f64,
    /// Background keys ranked this high or higher count as hot.
    pub hot_ranks: usize,
    /// The viral key's path.
    pub viral_key: String,
    /// When the viral key starts in its first region.
    pub viral_at: Duration,
    /// Delay between the viral key reaching one region and the next.
    pub spread_every: Duration,
    /// The viral key's requests per second per region, from the moment it arrives.
    pub viral_rps: f64,
    /// Per region, the URLs of its edge nodes.
    pub nodes: Vec<Vec<String>>,
    /// Longest a client waits for an answer.
    pub timeout: Duration,
}

/// Runs the plan to the end and returns every answer.
pub(super) async fn run(
    plan: LoadPlan,
    progress: impl Fn(Duration) + Send + Sync + 'static,
) -> Vec<Answer> {
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build_http();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let zipf = Zipf::new(plan.keys as f64, plan.zipf_exponent).expect("valid zipf");
    let regions = plan.nodes.len();

    // The schedule is drawn up front from the seed, so every set-up sends the same
    // requests at the same offsets.
    let mut schedule: Vec<(Duration, usize, String, bool, bool)> = Vec::new();
    let gap = Exp::new(plan.background_rps).expect("positive rate");
    let mut t = 0.0;
    loop {
        t += gap.sample(&mut rng);
        if t >= plan.duration.as_secs_f64() {
            break;
        }
        let rank = zipf.sample(&mut rng) as usize;
        let region = rng.random_range(0..regions);
        schedule.push((
            Duration::from_secs_f64(t),
            region,
            format!("/assets/{rank}.js"),
            false,
            rank <= plan.hot_ranks,
        ));
    }
    for region in 0..regions {
        let start = (plan.viral_at + plan.spread_every * region as u32).as_secs_f64();
        let mut t = start;
        while t < plan.duration.as_secs_f64() {
            schedule.push((
                Duration::from_secs_f64(t),
                region,
                plan.viral_key.clone(),
                true,
                true,
            ));
            // Sudden, as when a hot asset expires or a link goes viral: full rate at once.
            t += Exp::new(plan.viral_rps)
                .expect("positive rate")
                .sample(&mut rng);
        }
    }
    schedule.sort_by_key(|s| s.0);
    let node_picks: Vec<usize> = schedule
        .iter()
        .map(|s| rng.random_range(0..plan.nodes[s.1].len()))
        .collect();

    let mut tasks = Vec::with_capacity(schedule.len());
    let mut last_progress = Duration::ZERO;
    for ((at, region, path, viral, hot), pick) in schedule.into_iter().zip(node_picks) {
        let now = started.elapsed();
        if at > now {
            tokio::time::sleep(at - now).await;
        }
        if at >= last_progress + Duration::from_secs(1) {
            last_progress = at;
            progress(at);
        }
        let url = format!("{}{}", plan.nodes[region][pick], path);
        let client = client.clone();
        let answers = answers.clone();
        let timeout = plan.timeout;
        tasks.push(tokio::spawn(async move {
            let sent = started.elapsed();
            let request = hyper::Request::get(&url)
                .header("host", "demo.example")
                .header(
                    "referer",
                    if viral {
                        "https://t.co/viral"
                    } else {
                        "https://www.google.com/"
                    },
                )
                .body(Empty::new())
                .expect("a valid request");
            let outcome = tokio::time::timeout(timeout, async {
                let response = client.request(request).await.map_err(|_| None)?;
                let x_cache = response
                    .headers()
                    .get("x-cache")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let ok = response.status().is_success();
                let complete = response.into_body().collect().await.is_ok();
                Ok::<_, Option<String>>((x_cache, ok && complete))
            })
            .await;
            let (x_cache, ok) = match outcome {
                Ok(Ok(answer)) => answer,
                _ => (None, false),
            };
            let answer = Answer {
                sent,
                region,
                viral,
                hot,
                latency: started.elapsed() - sent,
                x_cache,
                ok,
            };
            answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(answer);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    progress(plan.duration);
    let mut answers = std::mem::take(&mut *answers.lock().unwrap_or_else(|e| e.into_inner()));
    answers.sort_by_key(|a| a.sent);
    answers
}
