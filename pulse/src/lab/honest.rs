//! The honest scorer: commands judged against what the trace's regions then did.
//!
//! Rules (each has a test below):
//! 1. A targeted region is *warmed in time* when its first client request for the key
//!    after the command comes at least [`HonestOptions::min_lead_ms`] after the command
//!    was issued (a fill needs that long) and before the command expires.
//! 2. A command is *useful* when at least one region it names was warmed in time;
//!    *wasted* otherwise. Precision by command: useful / judged commands. Precision by
//!    region: warmed-in-time regions / targeted regions (every targeted region that
//!    was not warmed in time is a wasted fill), except that a region whose first
//!    request comes within `min_lead_ms` of the command *joined* it: the pre-warm and
//!    that request share one fill at the edge (single flight), so it is neither a
//!    saved miss nor a wasted fill, and counts on neither side; a command every
//!    named region of which joined it is not judged.
//! 3. A command for a cron burst (the truth says the key hits every region at once)
//!    that warmed no region in time is neither credit nor blame: it is not judged. If a
//!    region was left to warm and was warmed in time, it counts as useful like any other.
//! 4. Recall (needs the truth): of the regions a viral burst reached *after* its first
//!    region, the share that were warmed in time by some command. Lead per region: ms
//!    from the command to that region's first request.
//!
//! The scorer reads only commands, events and the truth, so the same numbers can be
//! recomputed by anyone from `pulse backtest --commands`' file and the trace.

use std::collections::HashMap;

use models::{AccessEvent, CacheKey, PrewarmCommand, RegionId, RegionTargets, TenantId};
use serde::Serialize;

use super::trace::{Burst, BurstKind};

/// Settings of the honest scorer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HonestOptions {
    /// A region's first request must come at least this long after the command for
    /// the pre-warm to have had time to fill.
    pub min_lead_ms: u64,
}

impl Default for HonestOptions {
    fn default() -> Self {
        HonestOptions { min_lead_ms: 100 }
    }
}

/// What became of one command under the honest rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CommandScore {
    /// The command's id.
    pub id: String,
    /// Regions it named.
    pub targeted: usize,
    /// Named regions that asked within `min_lead_ms` of it (one shared fill).
    pub joined: usize,
    /// Named regions warmed in time, with their lead in ms.
    pub warmed: Vec<(RegionId, u64)>,
    /// False when the command is for a cron burst with nothing left to warm: not judged.
    pub judged: bool,
}

/// The honest figures for a set of commands.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct HonestScore {
    /// Commands sent.
    pub commands: usize,
    /// Commands judged (all but cron commands with nothing left to warm).
    pub judged: usize,
    /// Judged commands that warmed at least one region in time.
    pub useful: usize,
    /// Regions named by judged commands, less the joined ones (rule 2).
    pub targeted_regions: usize,
    /// Named regions that asked within `min_lead_ms` of the command: one shared fill.
    pub joined_regions: usize,
    /// Of those, warmed in time.
    pub warmed_regions: usize,
    /// Regions viral bursts reached after their first region (needs the truth).
    pub viral_later_regions: usize,
    /// Of those, warmed in time by some command.
    pub viral_regions_warmed: usize,
    /// Lead of each viral region warmed in time, ms, sorted.
    pub viral_leads_ms: Vec<u64>,
    /// Whether a truth file was given (recall is known).
    pub has_truth: bool,
}

impl HonestScore {
    /// Useful judged commands / judged commands (1 when none was judged).
    pub(crate) fn precision(&self) -> f64 {
        ratio(self.useful, self.judged)
    }

    /// Warmed-in-time regions / regions named by judged commands.
    pub(crate) fn region_precision(&self) -> f64 {
        ratio(self.warmed_regions, self.targeted_regions)
    }

    /// Share of viral later regions warmed in time; `None` without the truth.
    pub(crate) fn recall(&self) -> Option<f64> {
        self.has_truth
            .then(|| ratio(self.viral_regions_warmed, self.viral_later_regions))
    }

    /// Median lead over viral regions warmed in time.
    pub(crate) fn median_lead_ms(&self) -> Option<u64> {
        self.viral_leads_ms
            .get(self.viral_leads_ms.len() / 2)
            .copied()
    }

    /// Share of targeted-region fills nobody asked for in time (the origin cost).
    pub(crate) fn wasted_share(&self) -> f64 {
        1.0 - self.region_precision()
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        1.0
    } else {
        part as f64 / whole as f64
    }
}

/// Client requests of one key, per region, in time order.
type Demand<'a> = HashMap<&'a str, Vec<u64>>;

fn demand_index<'a>(
    events: &'a [AccessEvent],
    wanted: &std::collections::HashSet<(&TenantId, &CacheKey)>,
) -> HashMap<(TenantId, CacheKey), Demand<'a>> {
    let mut index: HashMap<(TenantId, CacheKey), Demand<'a>> = HashMap::new();
    for e in events.iter().filter(|e| e.outcome.is_demand()) {
        if !wanted.contains(&(&e.tenant, &e.key)) {
            continue;
        }
        index
            .entry((e.tenant.clone(), e.key.clone()))
            .or_default()
            .entry(e.region.as_str())
            .or_default()
            .push(e.ts_ms);
    }
    for regions in index.values_mut() {
        for times in regions.values_mut() {
            times.sort_unstable();
        }
    }
    index
}

/// The first request at or after `from_ms`, if any.
fn first_from(times: &[u64], from_ms: u64) -> Option<u64> {
    let i = times.partition_point(|t| *t < from_ms);
    times.get(i).copied()
}

/// The regions a command names, from the fleet's regions when it names them all.
fn named<'a>(command: &'a PrewarmCommand, fleet: &'a [&'a str]) -> Vec<&'a str> {
    match &command.regions {
        RegionTargets::All => fleet.to_vec(),
        RegionTargets::Only(regions) => regions.iter().map(RegionId::as_str).collect(),
    }
}

/// Scores `commands` against `events` (the trace they were decided on) and, when given,
/// the truth about its bursts.
pub(crate) fn score_commands(
    commands: &[PrewarmCommand],
    events: &[AccessEvent],
    truth: Option<&[Burst]>,
    options: &HonestOptions,
) -> (HonestScore, Vec<CommandScore>) {
    let bursts = truth.unwrap_or_default();
    let mut wanted = std::collections::HashSet::new();
    for c in commands {
        wanted.insert((&c.tenant, &c.key));
    }
    for b in bursts {
        wanted.insert((&b.tenant, &b.key));
    }
    let index = demand_index(events, &wanted);
    let mut fleet: Vec<&str> = events.iter().map(|e| e.region.as_str()).collect();
    fleet.sort_unstable();
    fleet.dedup();

    let empty = Demand::new();
    let mut total = HonestScore {
        commands: commands.len(),
        has_truth: truth.is_some(),
        ..HonestScore::default()
    };
    let mut per_command = Vec::with_capacity(commands.len());
    for c in commands {
        let demand = index
            .get(&(c.tenant.clone(), c.key.clone()))
            .unwrap_or(&empty);
        let targets = named(c, &fleet);
        // Each named region by the lead of its first request after the command: too
        // short joined the command's fill, within the expiry warmed, else wasted.
        let mut warmed: Vec<(RegionId, u64)> = Vec::new();
        let mut joined = 0;
        for region in &targets {
            let Some(first) = demand
                .get(region)
                .and_then(|times| first_from(times, c.issued_at_ms))
            else {
                continue;
            };
            let lead = first - c.issued_at_ms;
            if lead < options.min_lead_ms {
                joined += 1;
            } else if first < c.expires_at_ms {
                let region = region.parse().expect("a region of a command or event");
                warmed.push((region, lead));
            }
        }
        let for_cron = bursts.iter().any(|b| {
            b.kind == BurstKind::Cron
                && b.tenant == c.tenant
                && b.key == c.key
                && (b.start_ms..=b.end_ms).contains(&c.issued_at_ms)
        });
        // A command every named region of which joined it changed nothing (rule 2).
        let all_joined = joined == targets.len();
        let judged = !(warmed.is_empty() && (for_cron || all_joined));
        if judged {
            total.judged += 1;
            total.useful += usize::from(!warmed.is_empty());
            total.targeted_regions += targets.len() - joined;
            total.joined_regions += joined;
            total.warmed_regions += warmed.len();
        }
        per_command.push(CommandScore {
            id: c.id.clone(),
            targeted: targets.len(),
            joined,
            warmed,
            judged,
        });
    }

    for b in bursts.iter().filter(|b| b.kind == BurstKind::Viral) {
        let mut reached = b.regions.clone();
        reached.sort_by_key(|(_, t)| *t);
        let demand = index
            .get(&(b.tenant.clone(), b.key.clone()))
            .unwrap_or(&empty);
        for (region, reached_ms) in reached.iter().skip(1) {
            // The region's first request of this burst, by the events themselves.
            let Some(first) = demand
                .get(region.as_str())
                .and_then(|times| first_from(times, *reached_ms))
            else {
                continue;
            };
            total.viral_later_regions += 1;
            let lead = commands
                .iter()
                .filter(|c| {
                    c.tenant == b.tenant
                        && c.key == b.key
                        && c.regions.includes(region)
                        && c.issued_at_ms + options.min_lead_ms <= first
                        && first < c.expires_at_ms
                })
                .map(|c| first - c.issued_at_ms)
                .max();
            if let Some(lead) = lead {
                total.viral_regions_warmed += 1;
                total.viral_leads_ms.push(lead);
            }
        }
    }
    total.viral_leads_ms.sort_unstable();
    (total, per_command)
}

#[cfg(test)]
mod tests {
    use models::{Outcome, Reason};

    use super::*;

    const EU: &str = "eu";
    const US: &str = "us";
    const AP: &str = "ap";

    fn event(ts_ms: u64, key: &str, region: &str, outcome: Outcome) -> AccessEvent {
        AccessEvent::new(
            ts_ms,
            "acme".parse().unwrap(),
            key.parse().unwrap(),
            region.parse().unwrap(),
            "n1".parse().unwrap(),
            outcome,
        )
    }

    fn ask(ts_ms: u64, key: &str, region: &str) -> AccessEvent {
        event(ts_ms, key, region, Outcome::Miss)
    }

    fn command(at_ms: u64, key: &str, regions: &[&str]) -> PrewarmCommand {
        PrewarmCommand::new(
            format!("pw-{at_ms}-{key}"),
            "acme".parse().unwrap(),
            key.parse().unwrap(),
            0.9,
            at_ms,
            at_ms + 30_000,
            RegionTargets::Only(regions.iter().map(|r| r.parse().unwrap()).collect()),
            Reason {
                model: "m".into(),
                intercept: 0.0,
                features: vec![],
            },
        )
    }

    fn burst(kind: BurstKind, key: &str, regions: &[(&str, u64)]) -> Burst {
        Burst {
            kind,
            tenant: "acme".parse().unwrap(),
            key: key.parse().unwrap(),
            start_ms: regions[0].1,
            end_ms: regions.iter().map(|r| r.1).max().unwrap() + 3_000,
            regions: regions
                .iter()
                .map(|(r, t)| (r.parse().unwrap(), *t))
                .collect(),
        }
    }

    fn score(
        commands: &[PrewarmCommand],
        events: &[AccessEvent],
        truth: Option<&[Burst]>,
    ) -> HonestScore {
        score_commands(commands, events, truth, &HonestOptions::default()).0
    }

    /// Rule 1: a region that asked before the command, or only after it expired, was
    /// not warmed by it; nor was one that asked too soon after it for a fill.
    #[test]
    fn only_requests_after_issue_and_before_expiry_count() {
        let events = [
            ask(500, "/a", EU),    // before the command
            ask(1_050, "/a", US),  // 50 ms after: too soon for a fill
            ask(40_000, "/a", AP), // after expiry
            ask(5_000, "/b", EU),  // another key
        ];
        let s = score(&[command(1_000, "/a", &[EU, US, AP])], &events, None);
        assert_eq!((s.judged, s.useful), (1, 0));
        // US joined (rule 2); EU and AP are wasted fills.
        assert_eq!((s.targeted_regions, s.warmed_regions), (2, 0));
        assert_eq!(s.joined_regions, 1);

        let events = [ask(3_000, "/a", US)];
        let s = score(&[command(1_000, "/a", &[EU, US, AP])], &events, None);
        assert_eq!((s.useful, s.warmed_regions), (1, 1));
    }

    /// Rule 2: precision by command and by targeted region differ when a useful
    /// command also names regions that never asked.
    #[test]
    fn precision_by_command_and_by_region() {
        let events = [ask(2_000, "/a", EU), ask(9_000, "/b", US)];
        let commands = [
            command(1_000, "/a", &[EU, US, AP, "sa"]), // 1 of 4 regions asks
            command(1_000, "/c", &[EU]),               // nobody asks
        ];
        let s = score(&commands, &events, None);
        assert_eq!(s.precision(), 0.5);
        assert_eq!(s.region_precision(), 0.2);
        assert!((s.wasted_share() - 0.8).abs() < 1e-12);
        assert_eq!(s.recall(), None, "no truth, no recall");
    }

    /// Rule 2: a region that asks within `min_lead_ms` of the command shares one fill
    /// with it: it is neither warmed nor wasted.
    #[test]
    fn a_region_that_asks_at_once_joined_the_fill() {
        let events = [
            ask(1_000, "/a", EU),
            ask(1_099, "/a", US),
            ask(1_100, "/a", AP),
        ];
        let (s, per_command) = score_commands(
            &[command(1_000, "/a", &[EU, US, AP, "sa"])],
            &events,
            None,
            &HonestOptions::default(),
        );
        assert_eq!(s.joined_regions, 2, "EU at the same ms, US 99 ms later");
        assert_eq!(
            (s.targeted_regions, s.warmed_regions),
            (2, 1),
            "AP warmed, sa wasted"
        );
        assert_eq!(s.region_precision(), 0.5);
        assert_eq!(per_command[0].joined, 2);

        let (s, per_command) = score_commands(
            &[command(1_000, "/a", &[EU, US])],
            &events,
            None,
            &HonestOptions::default(),
        );
        assert_eq!(
            (s.judged, s.targeted_regions),
            (0, 0),
            "all joined: not judged"
        );
        assert!(!per_command[0].judged);
    }

    /// Rule 3: a cron command with nothing left to warm is neither credit nor blame;
    /// with a region left to warm, it is judged like any other.
    #[test]
    fn crons_count_only_when_a_region_was_left_to_warm() {
        let cron = burst(BurstKind::Cron, "/cron", &[(EU, 60_000), (US, 60_020)]);
        let events = [ask(60_000, "/cron", EU), ask(60_020, "/cron", US)];
        let late = command(60_100, "/cron", &[AP]); // AP never asks
        let s = score(&[late], &events, Some(std::slice::from_ref(&cron)));
        assert_eq!((s.commands, s.judged, s.useful), (1, 0, 0));
        assert_eq!(s.precision(), 1.0);

        let events = [ask(60_000, "/cron", EU), ask(61_000, "/cron", US)];
        let early = command(60_050, "/cron", &[US]);
        let s = score(&[early], &events, Some(std::slice::from_ref(&cron)));
        assert_eq!((s.judged, s.useful), (1, 1));

        // The same late command for a key the truth does not call a cron is blamed.
        let events = [ask(60_000, "/other", EU)];
        let s = score(&[command(60_100, "/other", &[AP])], &events, Some(&[cron]));
        assert_eq!((s.judged, s.useful), (1, 0));
    }

    /// Rule 4: recall is over the regions a viral reached after its first one, each
    /// warmed in time by a command naming it; leads are per region.
    #[test]
    fn recall_counts_later_regions_warmed_in_time() {
        let viral = burst(
            BurstKind::Viral,
            "/v",
            &[(EU, 10_000), (US, 13_000), (AP, 16_000), ("sa", 50_000)],
        );
        let events = [
            ask(10_000, "/v", EU),
            ask(13_000, "/v", US),
            ask(16_000, "/v", AP),
            ask(50_000, "/v", "sa"), // after the command expired
        ];
        // Names US and SA but not AP; expires at 41 s.
        let commands = [command(11_000, "/v", &[US, "sa"])];
        let s = score(&commands, &events, Some(std::slice::from_ref(&viral)));
        assert_eq!(s.viral_later_regions, 3);
        assert_eq!(s.viral_regions_warmed, 1);
        assert_eq!(s.viral_leads_ms, vec![2_000]);
        assert!((s.recall().unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.median_lead_ms(), Some(2_000));

        // A command after every later region asked warms nothing.
        let s = score(&[command(17_000, "/v", &[US, AP])], &events, Some(&[viral]));
        assert_eq!(s.viral_regions_warmed, 0);
        assert_eq!(s.recall(), Some(0.0));
    }

    /// A pre-warm's own fill is no request: it cannot make its command useful.
    #[test]
    fn a_prefetch_fill_is_not_demand() {
        let events = [event(2_000, "/a", EU, Outcome::PrefetchFill)];
        let s = score(&[command(1_000, "/a", &[EU])], &events, None);
        assert_eq!(s.useful, 0);
    }
}
