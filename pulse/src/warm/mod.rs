//! Operators' warm-ups: `POST /api/warm` (and `pulse warm`) asks the fleet to fetch a
//! tenant's keys before traffic comes, from an instant on and at a pace.
//!
//! A warm-up is a [`Job`] held by the [`WarmDesk`] of the instance that took the
//! request. Its task proposes one command per key to the fleet's gate (`crate::gate`),
//! exactly as the predictor's commands go: on the decisions topic, keyed by tenant, and
//! sent on signed by the gate if admitted. Its commands are of [`CommandClass::Warm`]:
//! the gate charges them to the tenant's warm bucket (`--warm-rate`, `--warm-burst`),
//! never to the predictions' bucket, and applies the same cooldown and dedupe.
//!
//! Bounds (memory stays bounded whatever clients send): at most [`MAX_KEYS`] keys a
//! warm-up, at most [`MAX_JOBS`] warm-ups held (finished ones are forgotten oldest
//! first; with every slot taken by an unfinished one, a new one is refused), a start at
//! most [`MAX_DELAY_MS`] ahead.
//!
//! - `request`: the request body and its checks.
//! - `progress`: what the job has sent and what the edges said of its keys.

mod progress;
mod request;

pub(crate) use progress::{Phase, Progress, RegionProgress};
pub(crate) use request::{Checked, KeySource, Refusal, WarmRequest};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use models::{CacheKey, CommandClass, PrewarmCommand, Reason, RegionTargets, TenantId};
use tokio::sync::watch;

use crate::clock::wall_clock_ms;
use crate::metrics::Metrics;
use crate::prewarm::PrewarmPublisher;

/// Most keys one warm-up may name; a prefix is expanded from one heat-map question,
/// which answers at most as many rows (`api::MAX_HEATMAP_ROWS`).
pub(crate) const MAX_KEYS: usize = 1_000;
/// Most warm-ups held by one instance, running or finished.
pub(crate) const MAX_JOBS: usize = 64;
/// Furthest ahead a warm-up may start.
pub(crate) const MAX_DELAY_MS: u64 = 24 * 3600 * 1000;
/// The model name a warm-up's commands carry in their reason (no model scored them).
const REASON: &str = "operator-warm";

/// The rules the desk applies, from pulse's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WarmRules {
    /// The tenant's warm budget: a pace above it is refused.
    pub rate_per_s: f64,
    /// How long a command stays valid at the edges.
    pub command_ttl_ms: u64,
}

/// One warm-up.
pub(crate) struct Job {
    pub id: String,
    pub tenant: TenantId,
    pub keys: Vec<CacheKey>,
    pub regions: RegionTargets,
    pub not_before_ms: u64,
    pub pace: f64,
    pub created_ms: u64,
    progress: Mutex<Progress>,
}

impl Job {
    /// Its progress now.
    pub(crate) fn progress(&self) -> Progress {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Command `index` of the job (its id: the job's id and the index).
    fn command(&self, index: usize, now_ms: u64, ttl_ms: u64) -> PrewarmCommand {
        PrewarmCommand {
            class: CommandClass::Warm,
            ..PrewarmCommand::new(
                format!("{}-{index}", self.id),
                self.tenant.clone(),
                self.keys[index].clone(),
                1.0,
                now_ms,
                now_ms + ttl_ms,
                self.regions.clone(),
                Reason {
                    model: REASON.into(),
                    intercept: 0.0,
                    features: Vec::new(),
                },
            )
        }
    }
}

/// The warm-ups of this instance and the proposals' producer they share.
pub(crate) struct WarmDesk {
    jobs: Mutex<VecDeque<Arc<Job>>>,
    proposals: Arc<PrewarmPublisher>,
    rules: WarmRules,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
}

impl WarmDesk {
    /// A desk proposing to the gate with `proposals`; its jobs stop when `shutdown`
    /// turns true.
    pub(crate) fn new(
        proposals: PrewarmPublisher,
        rules: WarmRules,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        WarmDesk {
            jobs: Mutex::new(VecDeque::new()),
            proposals: Arc::new(proposals),
            rules,
            metrics,
            shutdown,
        }
    }

    pub(crate) fn rules(&self) -> WarmRules {
        self.rules
    }

    /// Takes a checked request whose keys are known, and starts its task.
    pub(crate) fn submit(
        &self,
        checked: Checked,
        keys: Vec<CacheKey>,
    ) -> Result<Arc<Job>, Refusal> {
        let now_ms = wall_clock_ms();
        let job = Arc::new(Job {
            id: format!("warm-{now_ms}-{:08x}", rand::random::<u32>()),
            tenant: checked.tenant,
            regions: checked.regions,
            not_before_ms: checked.not_before_ms,
            pace: checked.pace,
            created_ms: now_ms,
            progress: Mutex::new(Progress::new(keys.len())),
            keys,
        });
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if jobs.len() >= MAX_JOBS {
                let finished = jobs.iter().position(|j| j.progress().is_finished());
                match finished {
                    Some(i) => {
                        jobs.remove(i);
                    }
                    None => {
                        return Err(Refusal {
                            code: "too_many_jobs",
                            message: format!(
                                "jobs: {MAX_JOBS} warm-ups are unfinished on this instance; wait for one to end"
                            ),
                        });
                    }
                }
            }
            jobs.push_back(job.clone());
        }
        tokio::spawn(run(
            job.clone(),
            self.proposals.clone(),
            self.rules,
            self.metrics.clone(),
            self.shutdown.clone(),
        ));
        tracing::info!(
            id = %job.id,
            tenant = %job.tenant,
            keys = job.keys.len(),
            not_before_ms = job.not_before_ms,
            pace = job.pace,
            "warm-up accepted"
        );
        Ok(job)
    }

    /// The job `id`, if held.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().find(|j| j.id == id).cloned()
    }

    /// Every job held, newest first.
    pub(crate) fn list(&self) -> Vec<Arc<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().rev().cloned().collect()
    }
}

/// The job's task: waits for `not_before`, then proposes one key every `1 / pace`
/// seconds (on the schedule, not after each send: a slow send does not slow the pace).
async fn run(
    job: Arc<Job>,
    proposals: Arc<PrewarmPublisher>,
    rules: WarmRules,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let interval_ms = 1000.0 / job.pace;
    for index in 0..job.keys.len() {
        let due_ms = job.not_before_ms + (index as f64 * interval_ms) as u64;
        let wait = Duration::from_millis(due_ms.saturating_sub(wall_clock_ms()));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|stop| *stop) => {
                job.update(|p| p.stop(wall_clock_ms()));
                return;
            }
        }
        let now_ms = wall_clock_ms();
        let command = job.command(index, now_ms, rules.command_ttl_ms);
        match proposals.send(&command) {
            Ok(()) => {
                metrics.warm_proposed.inc();
                job.update(|p| p.sent(now_ms));
            }
            Err(e) => {
                metrics.prewarm_send_failed.inc();
                tracing::warn!(error = %e, id = %command.id, key = %command.key, "warm-up command not proposed");
                job.update(|p| p.failed(now_ms));
            }
        }
        proposals.serve();
    }
    job.update(|p| p.sending_done(wall_clock_ms()));
    tracing::info!(id = %job.id, "warm-up sent");
    let flushing = proposals.clone();
    let _ = tokio::task::spawn_blocking(move || flushing.flush(Duration::from_secs(10))).await;
}
