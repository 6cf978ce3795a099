//! `pulse warm`: a warm-up asked of a running pulse through its API (`POST /api/warm`),
//! its id printed, and with `--follow` its progress until the edges have it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::clock::wall_clock_ms;

/// Biggest answer read from pulse.
const MAX_ANSWER: usize = 1 << 20;

/// `pulse warm`: warm a tenant's keys on its edges before traffic comes.
#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:
  pulse warm --tenant acme --prefix /launch/ --in 600 --pace 20
  pulse warm --tenant acme --key /app.js --key /app.css --region eu-west --follow
  pulse warm --tenant acme --keys-file keys.txt --not-before 1796716800000

The keys go through the fleet's gate on the tenant's warm budget (--warm-rate of
`pulse serve`), never on the predictions'; a pace above it is refused.")]
pub struct WarmArgs {
    /// The running pulse's API, as `pulse serve --listen` serves it.
    #[arg(long, env = "PULSE_API", default_value = "http://127.0.0.1:8080")]
    pub api: String,
    /// Its API token (`pulse serve --api-token`). Prefer the variable: flags show in `ps`.
    #[arg(long, env = "PULSE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The tenant whose keys to warm.
    #[arg(long)]
    pub tenant: String,
    /// A key to warm (repeat the flag).
    #[arg(long = "key", conflicts_with = "prefix")]
    pub keys: Vec<String>,
    /// A file of keys, one a line (blank lines and `#` comments skipped).
    #[arg(long, conflicts_with = "prefix")]
    pub keys_file: Option<PathBuf>,
    /// Warm every key of the tenant the heat map knows (its top 1000 of the last 60 s,
    /// fleet-wide) that starts with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// A region to warm in (repeat the flag); default: every region.
    #[arg(long = "region")]
    pub regions: Vec<String>,
    /// Start at this instant, in milliseconds since the Unix epoch.
    #[arg(long, conflicts_with = "in_secs")]
    pub not_before: Option<u64>,
    /// Start this many seconds from now.
    #[arg(long = "in", value_name = "SECS")]
    pub in_secs: Option<u64>,
    /// Keys per second (default: the tenant's whole warm budget).
    #[arg(long)]
    pub pace: Option<f64>,
    /// Print the progress every second until every key is filled or found cached in
    /// every region named (or, with every region, until the commands are sent and
    /// the reports stop growing), then exit 0; exit 1 if `--wait-secs` pass first.
    #[arg(long)]
    pub follow: bool,
    /// How long `--follow` waits after the last key is sent.
    #[arg(long, default_value_t = 60)]
    pub wait_secs: u64,
}

/// Runs `pulse warm`.
pub async fn warm_command(args: WarmArgs) -> anyhow::Result<()> {
    let body = request_body(&args)?;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let base = args.api.trim_end_matches('/');
    let (status, answer) = call(
        &client,
        &args,
        Method::POST,
        &format!("{base}/api/warm"),
        Some(body),
    )
    .await?;
    if status != 202 {
        bail!(
            "pulse refused the warm-up ({status}): {}",
            answer["message"].as_str().unwrap_or(&answer.to_string())
        );
    }
    let id = answer["id"]
        .as_str()
        .context("pulse's answer has no id")?
        .to_owned();
    println!("{id}");
    if !args.follow {
        return Ok(());
    }
    let url = format!("{base}/api/warm/{id}");
    let mut last_line = String::new();
    let mut settled_at: Option<Instant> = None;
    loop {
        let (status, answer) = call(&client, &args, Method::GET, &url, None).await?;
        if status != 200 {
            bail!("asking for the progress ({status}): {answer}");
        }
        let p = &answer["progress"];
        let line = progress_line(p);
        if line != last_line {
            eprintln!("{line}");
            settled_at = None;
            last_line = line;
        }
        let sent = matches!(p["phase"].as_str(), Some("sent" | "stopped"));
        if sent && complete(p, &args.regions) {
            return Ok(());
        }
        if sent {
            let since = *settled_at.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            // Every region, no end to know: the reports have stopped growing.
            if args.regions.is_empty() && waited >= Duration::from_secs(5) && has_reports(p) {
                return Ok(());
            }
            if waited >= Duration::from_secs(args.wait_secs) {
                bail!("gave up after {} s: {last_line}", args.wait_secs);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The JSON body of `POST /api/warm` the flags ask for.
fn request_body(args: &WarmArgs) -> anyhow::Result<Value> {
    let mut keys = args.keys.clone();
    if let Some(path) = &args.keys_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--keys-file {}", path.display()))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    let mut body = json!({ "tenant": args.tenant });
    match (&args.prefix, keys.is_empty()) {
        (Some(prefix), _) => body["prefix"] = json!(prefix),
        (None, false) => body["keys"] = json!(keys),
        (None, true) => bail!("give the keys: --key, --keys-file or --prefix"),
    }
    if !args.regions.is_empty() {
        body["regions"] = json!(args.regions);
    }
    let not_before = args
        .not_before
        .or_else(|| args.in_secs.map(|s| wall_clock_ms() + s * 1000));
    if let Some(at) = not_before {
        body["not_before"] = json!(at);
    }
    if let Some(pace) = args.pace {
        body["pace"] = json!(pace);
    }
    Ok(body)
}

async fn call(
    client: &Client<HttpConnector, Full<Bytes>>,
    args: &WarmArgs,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> anyhow::Result<(u16, Value)> {
    let mut request = Request::builder()
        .method(method)
        .uri(url)
        .header(header::ACCEPT, "application/json");
    if let Some(token) = &args.api_token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = match body {
        Some(v) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(v.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let request = request
        .body(body)
        .with_context(|| format!("--api {}: not a usable URL", args.api))?;
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .with_context(|| format!("{url}: no answer in 30 s"))?
        .with_context(|| format!("{url}: is pulse running there?"))?;
    let status = response.status().as_u16();
    let bytes = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("{url}: reading the answer: {e}"))?
        .to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    if status == 401 {
        bail!("{url}: 401, the API needs its token (--api-token or PULSE_API_TOKEN)");
    }
    Ok((status, value))
}

/// One line of progress: `sending: sent 3/10, failed 0; eu-west filled 2 cached 1`.
fn progress_line(p: &Value) -> String {
    let mut line = format!(
        "{}: sent {}/{}, failed {}",
        p["phase"].as_str().unwrap_or("?"),
        p["sent"],
        p["keys"],
        p["failed"]
    );
    if let Some(regions) = p["regions"].as_object() {
        for (region, r) in regions {
            line.push_str(&format!(
                "; {region} filled {} cached {}",
                r["filled"], r["cached"]
            ));
        }
    }
    line
}

/// Every named region has every sent key filled or found cached.
fn complete(p: &Value, regions: &[String]) -> bool {
    let sent = p["sent"].as_u64().unwrap_or(0);
    !regions.is_empty()
        && regions.iter().all(|region| {
            let r = &p["regions"][region];
            r["filled"].as_u64().unwrap_or(0) + r["cached"].as_u64().unwrap_or(0) >= sent
        })
}

fn has_reports(p: &Value) -> bool {
    p["regions"].as_object().is_some_and(|r| !r.is_empty())
}
