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
//! Progress: the edges report `prefetch_fill` for a key a command made them fill and
//! `prefetch_cached` for one they held already; ingest hands those events to the
//! desk (the [`Credit`] observer), which credits each (key, region) once to every
//! warm-up of the tenant that names the key and the region and began before the
//! event. A warm-up sees the events of the partitions this instance owns: with
//! several instances, the others' share is not counted (see docs/warming.md).
//!
//! - `request`: the request body and its checks.
//! - `progress`: what the job has sent and what the edges said of its keys.
//! - `credit`: the ingest observer that credits the edges' reports.
//! - `cli`: `pulse warm`, the same through the API of a running pulse.

mod cli;
mod credit;
mod progress;
mod request;

pub use cli::{WarmArgs, warm_command};
pub(crate) use credit::Credit;

pub(crate) use progress::{Phase, Progress, RegionProgress};
use request::check_duration;
pub(crate) use request::{Checked, KeySource, Refusal, WarmRequest, regions};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use models::{
    AccessEventRef, CacheKey, CommandClass, PrewarmCommand, Reason, RegionTargets, TenantId,
};
use tokio::sync::watch;

use crate::clock::wall_clock_ms;
use crate::metrics::Metrics;
use crate::prewarm::PrewarmPublisher;

/// Most keys one warm-up may name; a prefix is expanded from one heat-map question,
/// which answers at most as many rows (`api::MAX_HEATMAP_ROWS`).
pub(crate) const MAX_KEYS: usize = 1_000;
/// Most warm-ups held by one instance, running or finished.
pub(crate) const MAX_JOBS: usize = 64;
/// Most regions one warm-up names, or reports progress for.
pub(crate) const MAX_REGIONS: usize = 64;
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
    /// Each key's index in `keys`.
    index: HashMap<String, usize>,
    /// Per region, a bit per key credited already: each (key, region) once.
    credited: Mutex<HashMap<String, Vec<u64>>>,
}

impl Job {
    fn new(checked: Checked, keys: Vec<CacheKey>, now_ms: u64) -> Self {
        Job {
            id: format!("warm-{now_ms}-{:08x}", rand::random::<u32>()),
            tenant: checked.tenant,
            regions: checked.regions,
            not_before_ms: checked.not_before_ms,
            pace: checked.pace,
            created_ms: now_ms,
            progress: Mutex::new(Progress::new(keys.len())),
            index: keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.as_str().to_owned(), i))
                .collect(),
            credited: Mutex::new(HashMap::new()),
            keys,
        }
    }

    /// Its progress now.
    pub(crate) fn progress(&self) -> Progress {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Credits an edge's report on one of its keys, once per (key, region).
    fn credit(&self, event: &AccessEventRef<'_>) {
        if event.ts_ms < self.created_ms || !self.regions.includes(event.region.as_str()) {
            return;
        }
        let Some(&i) = self.index.get(event.key.as_str()) else {
            return;
        };
        let region = event.region.as_str();
        let mut credited = self.credited.lock().unwrap_or_else(|e| e.into_inner());
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if credited
            .get(region)
            .is_some_and(|bits| bits[word] & bit != 0)
        {
            return;
        }
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if progress.credit(region, event.outcome) {
            let words = self.keys.len().div_ceil(64);
            credited
                .entry(region.to_owned())
                .or_insert_with(|| vec![0; words])[word] |= bit;
        }
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
    /// How many jobs are held: ingest asks it per batch, without the lock.
    held: AtomicUsize,
    proposals: Arc<PrewarmPublisher>,
    /// Signed, to the pre-warm topic itself: purges pass no gate (`POST /api/purge`).
    purges: Option<PrewarmPublisher>,
    rules: WarmRules,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
}

impl WarmDesk {
    /// Sends purges with `publisher` (signed as the gate's commands are).
    pub(crate) fn with_purges(mut self, publisher: PrewarmPublisher) -> Self {
        self.purges = Some(publisher);
        self
    }

    /// Sends one purge command to the fleet; counted in `pulse_purges_total`.
    pub(crate) fn purge(&self, command: &models::PurgeCommand) -> Result<(), String> {
        let Some(publisher) = &self.purges else {
            return Err("purges are off in this pulse".into());
        };
        publisher.send_purge(command).map_err(|e| e.to_string())?;
        publisher.flush(std::time::Duration::from_secs(5));
        self.metrics.purges_sent.inc();
        Ok(())
    }

    /// The command lifetime (`--command-ttl-ms`).
    pub(crate) fn command_ttl_ms(&self) -> u64 {
        self.rules.command_ttl_ms
    }

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
            held: AtomicUsize::new(0),
            proposals: Arc::new(proposals),
            purges: None,
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
        check_duration(keys.len(), checked.pace)?;
        let job = Arc::new(Job::new(checked, keys, wall_clock_ms()));
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
            self.held.store(jobs.len(), Ordering::Relaxed);
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

    /// Whether any warm-up is held (ingest credits nothing otherwise).
    pub(crate) fn watching(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// Credits an edge's `prefetch_fill` or `prefetch_cached` event to the warm-ups
    /// of its tenant that name its key.
    pub(crate) fn credit(&self, event: &AccessEventRef<'_>) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        for job in jobs
            .iter()
            .filter(|j| j.tenant.as_str() == event.tenant.as_str())
        {
            job.credit(event);
        }
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
        let due_ms = job
            .not_before_ms
            .saturating_add((index as f64 * interval_ms) as u64);
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

#[cfg(test)]
mod tests {
    use models::{AccessEvent, NodeId, Outcome, RegionId};

    use super::*;

    const T0: u64 = 1_764_470_000_000;

    fn job(regions: RegionTargets) -> Job {
        let checked = Checked {
            tenant: "acme".parse().unwrap(),
            keys: KeySource::Prefix("/".into()),
            regions,
            not_before_ms: T0,
            pace: 1.0,
        };
        let keys = vec!["/a".parse().unwrap(), "/b".parse().unwrap()];
        Job::new(checked, keys, T0)
    }

    fn report(ts: u64, key: &str, region: &str, outcome: Outcome) -> AccessEvent {
        AccessEvent::new(
            ts,
            "acme".parse().unwrap(),
            key.parse().unwrap(),
            RegionId::new(region).unwrap(),
            NodeId::new("edge-1").unwrap(),
            outcome,
        )
    }

    /// Each (key, region) is credited once, whatever the number of nodes that report
    /// it; reports from before the job, on other keys or from other regions are not.
    #[test]
    fn each_key_is_credited_once_per_region_it_targets() {
        let job = job(RegionTargets::Only(vec![
            "eu".parse().unwrap(),
            "us".parse().unwrap(),
        ]));
        for event in [
            report(T0 + 1, "/a", "eu", Outcome::PrefetchFill),
            report(T0 + 2, "/a", "eu", Outcome::PrefetchFill), // a second node
            report(T0 + 2, "/a", "eu", Outcome::PrefetchCached),
            report(T0 + 3, "/b", "eu", Outcome::PrefetchCached),
            report(T0 + 3, "/a", "us", Outcome::PrefetchFill),
            report(T0 + 3, "/a", "ap", Outcome::PrefetchFill), // not targeted
            report(T0 + 3, "/c", "eu", Outcome::PrefetchFill), // not its key
            report(T0 - 1, "/b", "us", Outcome::PrefetchFill), // before it began
        ] {
            job.credit(&event.borrowed());
        }
        let regions = job.progress().regions;
        assert_eq!(regions.len(), 2, "{regions:?}");
        assert_eq!(
            regions["eu"],
            RegionProgress {
                filled: 1,
                cached: 1
            }
        );
        assert_eq!(
            regions["us"],
            RegionProgress {
                filled: 1,
                cached: 0
            }
        );
    }

    /// With every region targeted, the regions kept are bounded.
    #[test]
    fn the_regions_reported_are_bounded() {
        let job = job(RegionTargets::All);
        for r in 0..MAX_REGIONS + 10 {
            job.credit(&report(T0, "/a", &format!("r{r}"), Outcome::PrefetchFill).borrowed());
        }
        assert_eq!(job.progress().regions.len(), MAX_REGIONS);
    }
}
