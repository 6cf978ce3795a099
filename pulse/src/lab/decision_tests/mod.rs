//! The online decision rules replayed on small hand-made traces (a model that is always
//! sure, and no online recalibration, so only the rules decide): a fast spread seen
//! soon enough to warm its second region, also when its events arrive late; which
//! regions a command names as the key spreads ([`regions`]); the outcome memory on a
//! key that bursts on a schedule in one region, and a burst from one node of several
//! waiting for a second region; labels over the regions a command would name; waiting
//! for the second region where the first cannot tell, and while a fresh pulse has
//! judged no first-region outcome; and the shipped model telling a crowd sent by search
//! engines from a newsletter's viral.

mod regions;

use std::sync::Arc;

use models::{AccessEvent, NodeId, Outcome, PrewarmCommand, RegionTargets};

use super::backtest::{ReplayOptions, Replayer, replay};
use crate::predict::{ScoringModel, default_model};

/// A model whose confidence is 0.99 whatever the features.
fn always_sure() -> Arc<ScoringModel> {
    let mut model = default_model();
    model.coefficients.iter_mut().for_each(|c| *c = 0.0);
    model.calibration.slope = 0.0;
    model.calibration.offset = 4.6; // sigmoid(4.6) ≈ 0.99
    model.isotonic.clear(); // the logistic calibration, then
    Arc::new(model)
}

fn event(ts_ms: u64, key: &str, region: &str) -> AccessEvent {
    AccessEvent::new(
        ts_ms,
        "acme".parse().unwrap(),
        key.parse().unwrap(),
        region.parse().unwrap(),
        format!("n-{region}").parse::<NodeId>().unwrap(),
        Outcome::Miss,
    )
}

/// Replay options under which only the rules decide: the confidence stays the model's.
fn rules_only() -> ReplayOptions {
    let mut options = ReplayOptions::default();
    options.predictor.calibrate_online = false;
    options
}

const REGIONS: [&str; 4] = ["r0", "r1", "r2", "r3"];

/// Every region asks for the tenant's background key five times a second: they are
/// the tenant's regions.
fn background(until_ms: u64) -> Vec<AccessEvent> {
    (0..until_ms)
        .step_by(200)
        .flat_map(|ms| REGIONS.map(|r| event(ms, "/background", r)))
        .collect()
}

/// `key` at 40 requests/s in `region` over [from, to).
fn demand(key: &str, region: &str, from_ms: u64, to_ms: u64) -> Vec<AccessEvent> {
    (from_ms..to_ms)
        .step_by(25)
        .map(|ms| event(ms, key, region))
        .collect()
}

fn sorted(mut events: Vec<AccessEvent>) -> Vec<AccessEvent> {
    events.sort_by_key(|e| e.ts_ms);
    events
}

/// The commands sent for `key`, in order.
fn commands_for<'a>(commands: &'a [PrewarmCommand], key: &str) -> Vec<&'a PrewarmCommand> {
    commands.iter().filter(|c| c.key.as_str() == key).collect()
}

fn names(command: &PrewarmCommand, region: &str) -> bool {
    match &command.regions {
        RegionTargets::All => true,
        RegionTargets::Only(regions) => regions.iter().any(|r| r.as_str() == region),
    }
}

/// A fast spread, 40 requests/s in r0 and r1 asking 300 ms later: the burst is seen
/// from its 8th request, 175 ms in, and its command names r1 with the honest scorer's
/// 100 ms of lead. From the 12th (275 ms), as before, r1 was too late to warm.
#[test]
fn a_fast_spread_is_commanded_before_its_second_region_asks() {
    let (r1_asks, until) = (60_300, 70_000);
    let mut events = background(80_000);
    events.extend(demand("/fast", "r0", 60_000, until));
    events.extend(demand("/fast", "r1", r1_asks, until));
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let first = run.commands.iter().find(|c| c.key.as_str() == "/fast");
    assert!(
        first.is_some_and(|c| names(c, "r1") && c.issued_at_ms + 100 <= r1_asks),
        "r1 was not warmed in time: {first:?}"
    );
}

/// `events` as an edge agent that batches and retries delivers them: each up to
/// `max_ms` late (a fixed spread of delays), in the order they arrive.
fn delivered_late(events: Vec<AccessEvent>, max_ms: u64) -> Vec<AccessEvent> {
    let delay = |i: usize| ((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) % max_ms;
    let mut arrivals: Vec<(u64, AccessEvent)> = sorted(events)
        .into_iter()
        .enumerate()
        .map(|(i, e)| (e.ts_ms + delay(i), e))
        .collect();
    arrivals.sort_by_key(|(at, _)| *at);
    arrivals.into_iter().map(|(_, e)| e).collect()
}

/// A burst of 13 requests/s in r0, r1 asking 3 s later, delivered up to 2 s late. At
/// the watermark its last second holds only the requests already delivered: it is seen
/// once r1 joins, too late to warm it. A second behind the watermark, where the
/// partition's lateness says it is nearly complete, it is seen in time.
#[test]
fn a_burst_delivered_late_is_commanded_before_its_second_region_asks() {
    let (r1_asks, until) = (63_000, 75_000);
    let mut events = background(80_000);
    let third = |region, from| demand("/late", region, from, until).into_iter().step_by(3);
    events.extend(third("r0", 60_000));
    events.extend(third("r1", r1_asks));
    let warmed_in_time = |events: &[AccessEvent]| {
        let run = replay(events, Some(always_sure()), &rules_only());
        let first = run.commands.into_iter().find(|c| c.key.as_str() == "/late");
        (
            first
                .as_ref()
                .is_some_and(|c| names(c, "r1") && c.issued_at_ms + 100 <= r1_asks),
            first,
        )
    };
    let (in_order, first) = warmed_in_time(&sorted(events.clone()));
    assert!(in_order, "in time order: {first:?}");
    let (late, first) = warmed_in_time(&delivered_late(events, 2_000));
    assert!(late, "delivered late, r1 was not warmed in time: {first:?}");
}

/// A job that runs every minute at the same second in one region: each command for it
/// is wasted (no other region ever asks). After the first, the key waits for a second
/// region, which never comes.
#[test]
fn a_key_that_bursts_on_a_schedule_in_one_region_is_commanded_at_most_once() {
    let mut events = background(11 * 60_000);
    for minute in 1..=10 {
        let from = minute * 60_000 + 5_000;
        events.extend(demand("/cron", "r0", from, from + 3_000));
    }
    let events = sorted(events);
    let run = replay(&events, Some(always_sure()), &rules_only());
    let commanded = run
        .commands
        .iter()
        .filter(|c| c.key.as_str() == "/cron")
        .count();
    assert!(commanded >= 1, "the first burst looks like any other");
    assert!(
        commanded <= 1,
        "{commanded} commands for a key whose every command was wasted"
    );
}

/// A key that bursts now and then in one region, at no fixed second: its first command
/// is wasted, so its later bursts wait for a second region.
#[test]
fn a_key_whose_last_command_was_wasted_waits_for_a_second_region() {
    let starts = [65_000, 172_000, 318_000, 441_000];
    let mut events = background(8 * 60_000);
    for from in starts {
        events.extend(demand("/now-and-then", "r0", from, from + 3_000));
    }
    // A later burst that does spread still gets its command, at its second region.
    events.extend(demand("/now-and-then", "r1", 442_000, 444_000));
    let events = sorted(events);
    let run = replay(&events, Some(always_sure()), &rules_only());
    let issued: Vec<u64> = run
        .commands
        .iter()
        .filter(|c| c.key.as_str() == "/now-and-then")
        .map(|c| c.issued_at_ms)
        .collect();
    assert_eq!(issued.len(), 2, "{issued:?}");
    assert!(issued[0] < starts[1] && issued[1] >= 442_000, "{issued:?}");
}

/// One-region crowds of five keys, each commanded at its first region and each wasted:
/// after four in a row the trust of first-region commands (`predict::trust`) brings the
/// model's 0.99 below the threshold (the traffic changed under the model), and the
/// fifth crowd waits for a second region, which never comes. The confidence is the
/// model's own here: the trust learns from commands whatever the calibration.
#[test]
fn after_four_wasted_first_region_commands_in_a_row_crowds_wait_for_a_second_region() {
    let starts = [65_000, 140_000, 215_000, 290_000, 365_000];
    let mut events = background(435_000);
    for (i, from) in starts.iter().enumerate() {
        events.extend(demand(&format!("/crowd-{i}"), "r0", *from, from + 5_000));
    }
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let commanded: Vec<bool> = (0..starts.len())
        .map(|i| !commands_for(&run.commands, &format!("/crowd-{i}")).is_empty())
        .collect();
    assert_eq!(commanded, [true, true, true, true, false]);
}

/// Five virals answered a second after their first-region commands; then a crowd's
/// first-region command no region answers: 2 s (twice the fleet's longest answer)
/// later the tenant's first regions are no evidence until its verdict is in, so a
/// second crowd waits for a second region that never asks, and a viral meanwhile is
/// commanded at its second region. Once the first crowd's command expired, first
/// regions are trusted again.
#[test]
fn a_first_region_command_unanswered_long_after_the_fleets_virals_makes_its_tenant_wait() {
    let mut events = background(260_000);
    for i in 0..5u64 {
        let (key, from) = (format!("/viral-{i}"), 60_000 + i * 10_000);
        events.extend(demand(&key, "r0", from, from + 5_000));
        events.extend(demand(&key, "r1", from + 1_000, from + 5_000));
    }
    events.extend(demand("/crowd-0", "r0", 120_000, 125_000));
    events.extend(demand("/crowd-1", "r0", 130_000, 135_000));
    events.extend(demand("/viral-late", "r0", 140_000, 145_000));
    events.extend(demand("/viral-late", "r1", 141_000, 145_000));
    events.extend(demand("/crowd-2", "r0", 200_000, 205_000));
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let commanded = |key: &str| !commands_for(&run.commands, key).is_empty();
    assert!(commanded("/crowd-0"));
    assert!(
        !commanded("/crowd-1"),
        "the tenant's first regions were no evidence"
    );
    let late = commands_for(&run.commands, "/viral-late");
    assert!(
        late.first()
            .is_some_and(|c| !names(c, "r1") && c.issued_at_ms >= 141_000),
        "the viral is commanded at its second region: {late:?}"
    );
    assert!(commanded("/crowd-2"), "the first crowd's verdict is in");
}

/// Where spreads stop at their second region, commands there are wasted: after four
/// in a row, the trust of second-region commands keeps a key that reached two regions
/// below the threshold, and one that does reach a third is commanded there (the trust
/// of commands at three regions is untouched). (Every command here waits for a second
/// region.)
#[test]
fn after_four_wasted_second_region_commands_in_a_row_spreads_wait_for_a_third() {
    let starts = [65_000, 140_000, 215_000, 290_000, 365_000, 440_000];
    let mut events = background(515_000);
    for (i, from) in starts.iter().enumerate() {
        let key = format!("/pair-{i}");
        events.extend(demand(&key, "r0", *from, from + 8_000));
        events.extend(demand(&key, "r1", from + 2_000, from + 8_000));
        if i == 5 {
            events.extend(demand(&key, "r2", from + 5_000, from + 8_000));
        }
    }
    let mut options = rules_only();
    options.predictor.policy.min_regions_reached = 2;
    let run = replay(&sorted(events), Some(always_sure()), &options);
    let first_named: Vec<Option<Vec<&str>>> = (0..starts.len())
        .map(|i| {
            commands_for(&run.commands, &format!("/pair-{i}"))
                .first()
                .map(|c| REGIONS.into_iter().filter(|r| names(c, r)).collect())
        })
        .collect();
    let at_second = Some(vec!["r2", "r3"]);
    assert_eq!(
        first_named,
        [
            at_second.clone(),
            at_second.clone(),
            at_second.clone(),
            at_second,
            None,
            Some(vec!["r3"])
        ]
    );
}

/// A tenant whose traffic arrives on a running pulse (a new tenant, a switch from
/// another CDN) brings its popular keys at once, two of them asked in two of its four
/// regions: each key's minute holds only the seconds since the tenant came, so none
/// seems to burst and none is commanded. A burst of its own 90 s later still is.
#[test]
fn a_tenant_arriving_with_its_popular_keys_is_no_burst() {
    let arrives = 120_000;
    let steady = |key: &str, region: &str| -> Vec<AccessEvent> {
        (arrives..240_000)
            .step_by(100)
            .map(|ms| event(ms, key, region))
            .collect()
    };
    let mut newco: Vec<AccessEvent> = REGIONS.iter().flat_map(|r| steady("/home", r)).collect();
    for key in ["/app.js", "/logo.png"] {
        newco.extend(steady(key, "r0"));
        newco.extend(steady(key, "r1"));
    }
    newco.extend(demand("/news", "r0", arrives + 90_000, arrives + 95_000));
    let mut events = background(240_000);
    events.extend(newco.into_iter().map(|mut e| {
        e.tenant = "newco".parse().unwrap();
        e
    }));
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    for key in ["/home", "/app.js", "/logo.png"] {
        let commands = commands_for(&run.commands, key);
        assert!(commands.is_empty(), "{key}: {commands:#?}");
    }
    assert!(!commands_for(&run.commands, "/news").is_empty());
}

/// Whether a burst of `/burst` in r0, 40 requests/s for 10 s (it never spreads), is
/// commanded, its requests coming round-robin through `nodes` of r0's, where the
/// tenant's background comes through two nodes a region.
fn one_region_burst_commanded(nodes: &[&str]) -> bool {
    let mut events: Vec<AccessEvent> = background(80_000)
        .into_iter()
        .map(|mut e| {
            e.node = format!("n-{}-{}", e.region, e.ts_ms / 200 % 2)
                .parse()
                .unwrap();
            e
        })
        .collect();
    events.extend(
        demand("/burst", "r0", 60_000, 70_000)
            .into_iter()
            .zip(nodes.iter().cycle())
            .map(|(mut e, node)| {
                e.node = node.parse().unwrap();
                e
            }),
    );
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    !commands_for(&run.commands, "/burst").is_empty()
}

/// A burst through one node of a region where the tenant's clients use several is one
/// client's (a bot, a retry loop, a hammer): it waits for a second region, which never
/// comes. Through two nodes it is commanded at its first region, as on a fleet of one
/// node a region (the other tests here) every burst is.
#[test]
fn a_burst_through_one_node_of_several_waits_for_a_second_region() {
    assert!(
        !one_region_burst_commanded(&["n-r0-0"]),
        "one node's burst was commanded"
    );
    assert!(one_region_burst_commanded(&["n-r0-0", "n-r0-1"]));
}

/// The label of a scoring moment counts a region that asks while a command sent then
/// would still be valid (as the honest scorer does), not only within 10 s: the first
/// moments of a slow spread, whose next region asks 25 s later, are viral.
#[test]
fn a_slow_spreads_first_moments_are_labelled_viral() {
    let mut events = background(210_000);
    for (region, from) in [("r0", 70_000), ("r1", 95_000)] {
        events.extend(demand("/viral", region, from, 200_000));
    }
    let run = replay(&sorted(events), None, &ReplayOptions::default());
    let first = run
        .samples
        .iter()
        .find(|s| s.key.as_str() == "/viral")
        .expect("the burst was scored");
    assert!(first.ts_ms < 75_000, "{}", first.ts_ms);
    assert!(
        first.viral,
        "a region asked 25 s later, within the command TTL"
    );
}

/// Two audiences: r0 and r1 ask for the even background keys, r2 and r3 for the odd
/// ones, each region a key a second. A viral of the first audience bursts in r0 and
/// reaches r1 5 s later, and never the other two. Its moment at r1 would name no
/// region (a command names only the regions of the audiences reached): it is no
/// sample. Were r2 and r3's silence its label, the calibration would learn that late
/// moments of a viral do not spread, and stop commanding at the second region.
#[test]
fn a_moment_is_labelled_over_the_regions_a_command_would_name() {
    let mut events: Vec<AccessEvent> = (0..200_000)
        .step_by(100)
        .flat_map(|ms| {
            let i = ms / 100;
            REGIONS
                .iter()
                .enumerate()
                .map(move |(r, region)| {
                    let taste = if r < 2 { 0 } else { 1 };
                    event(ms, &format!("/bg{}", (i % 10) * 2 + taste), region)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let (r1_asks, until) = (65_000, 120_000);
    events.extend(demand("/viral", "r0", 60_000, until));
    events.extend(demand("/viral", "r1", r1_asks, until));
    let run = replay(&sorted(events), None, &ReplayOptions::default());
    let samples: Vec<_> = run
        .samples
        .iter()
        .filter(|s| s.key.as_str() == "/viral")
        .map(|s| (s.ts_ms, s.viral))
        .collect();
    assert!(
        samples
            .first()
            .is_some_and(|&(ts, viral)| ts < r1_asks && viral),
        "the first moment, at r0, names r1, which asked: {samples:?}"
    );
    assert!(
        samples.iter().all(|&(_, viral)| viral),
        "a moment labelled by the other audience's silence: {samples:?}"
    );
}

/// Virals one every 6 s from 60 s, each bursting in r0 and reaching r1 25 s later,
/// then r2 and r3, scored by a model that is always sure. A fresh pulse has judged no
/// first-region moment: the model's confidence there is what it learnt elsewhere, so
/// the first viral waits for its second region. Once the outcomes of 20 first-region
/// moments are in (the first bursts' moments, judged a TTL later), virals are
/// commanded at their first region again.
#[test]
fn a_fresh_pulse_waits_for_the_second_region_until_first_region_outcomes_are_judged() {
    let virals = 20;
    let run = replay(
        &spreading_virals(virals),
        Some(always_sure()),
        &ReplayOptions::default(),
    );
    let first = first_command(&run.commands, 0);
    assert!(
        first.is_some_and(|t| t >= viral_start(0) + 25_000),
        "the first viral was commanded before its second region asked: {first:?}"
    );
    let last = first_command(&run.commands, virals - 1);
    assert!(
        last.is_some_and(|t| t < viral_start(virals - 1) + 25_000),
        "the last viral still waited for its second region: {last:?}"
    );
}

/// A model retrained online was calibrated on this traffic's own labelled moments: a
/// pulse that starts with one (or swaps one in) does not wait for first-region outcomes.
/// The same model under its shipped name waits.
#[test]
fn a_model_retrained_online_does_not_wait_for_first_region_outcomes() {
    let mut retrained = (*always_sure()).clone();
    retrained.name = "default-5-online-1".into();
    let first = |model: Arc<ScoringModel>| {
        let run = replay(&spreading_virals(1), Some(model), &ReplayOptions::default());
        first_command(&run.commands, 0)
    };
    let at_first_region = first(Arc::new(retrained));
    assert!(
        at_first_region.is_some_and(|t| t < viral_start(0) + 25_000),
        "the retrained model waited for the second region: {at_first_region:?}"
    );
    let shipped = first(always_sure());
    assert!(
        shipped.is_some_and(|t| t >= viral_start(0) + 25_000),
        "{shipped:?}"
    );
}

/// When the `i`th of [`spreading_virals`] starts.
fn viral_start(i: u64) -> u64 {
    60_000 + 6_000 * i
}

/// `virals` keys, one every 6 s from 60 s, each bursting in r0 and reaching r1 25 s
/// later, then r2 and r3 10 s apart; and the background.
fn spreading_virals(virals: u64) -> Vec<AccessEvent> {
    let mut events = background(viral_start(virals) + 60_000);
    for i in 0..virals {
        let (key, start) = (format!("/viral-{i}"), viral_start(i));
        for (region, after) in [("r0", 0), ("r1", 25_000), ("r2", 35_000), ("r3", 45_000)] {
            events.extend(demand(&key, region, start + after, start + 60_000));
        }
    }
    sorted(events)
}

/// When the `i`th of [`spreading_virals`] was first commanded.
fn first_command(commands: &[PrewarmCommand], i: u64) -> Option<u64> {
    let key = format!("/viral-{i}");
    commands
        .iter()
        .filter(|c| c.key.as_str() == key)
        .map(|c| c.issued_at_ms)
        .min()
}

/// A pulse restarted from its checkpoint keeps the first-region outcomes it judged
/// (the online calibration, through the checkpoint's JSON): its first viral after the
/// restart is commanded at its first region. Counts kept for another model than the
/// one in use come back only if that model comes next (the fleet's, from its topic);
/// without them the first viral waits, as on a fresh pulse.
#[test]
fn a_restarted_pulse_keeps_its_first_region_outcomes_for_the_same_model_only() {
    let options = ReplayOptions::default();
    let mut before = Replayer::new(Some(always_sure()), &options);
    for event in &spreading_virals(20) {
        before.feed(event);
    }
    let saved = before.predictor.saved_calibration().expect("counts");
    let json = serde_json::to_string(&saved).unwrap();
    let mut retrained = (*always_sure()).clone();
    retrained.trained_at_ms += 1;
    let retrained = Arc::new(retrained);
    // Restarted with `model`, then given `next` (as the model topic would).
    let after_restart = |model: &Arc<ScoringModel>, next: Option<&Arc<ScoringModel>>| {
        let mut after = Replayer::new(Some(model.clone()), &options);
        let restored = after
            .predictor
            .restore_calibration(serde_json::from_str(&json).unwrap());
        if let Some(next) = next {
            after.predictor.set_model(next.clone());
        }
        let mut commands = Vec::new();
        for event in &spreading_virals(1) {
            commands.extend(after.feed(event));
        }
        (restored, first_command(&commands, 0))
    };
    let at_first_region = |first: Option<u64>| first.is_some_and(|t| t < viral_start(0) + 25_000);

    let (restored, first) = after_restart(&always_sure(), None);
    assert!(restored, "the same model's counts were not put back");
    assert!(
        at_first_region(first),
        "the restarted pulse waited: {first:?}"
    );
    let (restored, first) = after_restart(&retrained, None);
    assert!(!restored, "another model's counts were put back");
    assert!(
        !at_first_region(first),
        "without counts the first viral waits: {first:?}"
    );
    let (_, first) = after_restart(&retrained, Some(&always_sure()));
    assert!(
        at_first_region(first),
        "the counts' model came next: {first:?}"
    );
    let (_, first) = after_restart(&always_sure(), Some(&retrained));
    assert!(
        !at_first_region(first),
        "a new model kept the old one's counts: {first:?}"
    );
}

/// Keys that burst at 40 requests/s in r0, at second `from_s` one every 6 s: every
/// other one a crowd (r0 only), the others virals that reach r1 25 s later (at 10
/// requests/s: no new burst of the key's own), then r2 and r3 10 s apart. At r0 the two
/// kinds are the same (the same rate, node and referrers): nothing there tells them
/// apart.
fn crowds_and_virals(prefix: &str, pairs: usize, from_s: u64) -> (Vec<AccessEvent>, u64) {
    let mut events = Vec::new();
    let mut start = from_s * 1_000;
    for i in 0..2 * pairs {
        let key = format!("/{prefix}-{i}");
        let end = start + 65_000;
        events.extend(demand(&key, "r0", start, end));
        if i % 2 == 1 {
            events.extend(
                (start + 25_000..end)
                    .step_by(100)
                    .map(|ms| event(ms, &key, "r1")),
            );
            events.extend(demand(&key, "r2", start + 35_000, end));
            events.extend(demand(&key, "r3", start + 45_000, end));
        }
        start += 6_000;
    }
    let end = start + 60_000;
    events.extend(background(end));
    (sorted(events), end)
}

/// Where a crowd and a viral look alike at their first region, a model fitted and
/// calibrated on such traffic gives them the share that did spread (about one half,
/// below the threshold): no key gets a command at its first region; each viral gets
/// one when its second region asks, which warms its third and fourth in time; no crowd
/// gets any.
#[test]
fn where_the_first_region_cannot_tell_a_crowd_from_a_viral_pulse_waits_for_the_second() {
    let (training, _) = crowds_and_virals("train", 30, 60);
    let model = super::training::fit_on(&training);
    let (events, _) = crowds_and_virals("test", 8, 60);
    let run = replay(&events, Some(model), &ReplayOptions::default());
    let (mut virals_warmed, mut crowd_commands) = (0, 0);
    for i in 0..16 {
        let key = format!("/test-{i}");
        let start = 60_000 + 6_000 * i as u64;
        let commands = commands_for(&run.commands, &key);
        if i % 2 == 0 {
            crowd_commands += commands.len();
            continue;
        }
        let first = commands.first();
        assert!(
            first.is_some_and(|c| c.issued_at_ms >= start + 25_000),
            "{key}: no command, or one before its second region asked: {commands:#?}"
        );
        let warmed = |region: &str, asks: u64| {
            commands
                .iter()
                .any(|c| names(c, region) && c.issued_at_ms + 100 <= asks && asks < c.expires_at_ms)
        };
        virals_warmed += usize::from(warmed("r2", start + 35_000) && warmed("r3", start + 45_000));
    }
    assert_eq!(crowd_commands, 0, "a crowd got a command");
    assert_eq!(virals_warmed, 8, "{:#?}", run.commands);
}

/// `key` at 40 requests/s in `region` over [from, to), from eight nodes, the requests
/// sent by `referrers` in turn (`None`: no referrer).
fn referred(
    key: &str,
    region: &str,
    (from_ms, to_ms): (u64, u64),
    referrers: &[Option<&str>],
) -> Vec<AccessEvent> {
    (from_ms..to_ms)
        .step_by(25)
        .enumerate()
        .map(|(i, ms)| {
            let mut e = event(ms, key, region);
            e.node = format!("n-{region}-{}", i % 8).parse().unwrap();
            e.referrer = referrers[i % referrers.len()].map(|d| d.parse().unwrap());
            e
        })
        .collect()
}

/// A crowd that search engines send (60 % of its requests, the rest without a
/// referrer, as readers look a story up where it happened) and a viral that a
/// newsletter sends (60 % from webmail), alike in everything else, `offset_ms` into
/// the trace, their keys ending in `tag`: the events, and when the viral's second
/// region asks.
fn search_crowd_and_newsletter_viral_events(tag: &str, offset_ms: u64) -> (Vec<AccessEvent>, u64) {
    let search = [
        Some("www.google.com"),
        Some("www.google.com"),
        Some("www.bing.com"),
        None,
        None,
    ];
    let mail = [
        Some("mail.google.com"),
        Some("outlook.live.com"),
        Some("newsletter.acme.example"),
        None,
        None,
    ];
    // Readers everywhere come from search engines, webmail and social networks all
    // day long: none of these domains is local to a region.
    let everyday = [
        None,
        None,
        Some("www.google.com"),
        Some("mail.google.com"),
        Some("t.co"),
    ];
    let at = |(from, to): (u64, u64)| (offset_ms + from, offset_ms + to);
    let mut events: Vec<_> = REGIONS
        .iter()
        .flat_map(|r| referred("/home", r, at((0, 260_000)), &everyday))
        .collect();
    let crowd = format!("/local-story{tag}");
    events.extend(referred(&crowd, "r0", at((70_000, 110_000)), &search));
    let viral = [
        ("r0", 150_000),
        ("r1", 156_000),
        ("r2", 162_000),
        ("r3", 168_000),
    ];
    let key = format!("/issue-12{tag}");
    for (region, from) in viral {
        events.extend(referred(&key, region, at((from, 200_000)), &mail));
    }
    (events, offset_ms + viral[1].1)
}

/// The referrer's class carries what separates these two at the first region: a
/// model fitted on traffic that shows both (other keys of the same shapes) gives the
/// crowd no command and the viral one at once, at its first region (the model's own
/// confidence: no cold-start wait for first-region outcomes). The shipped model, from
/// our families alone, has seen no crowd sent by search engines (docs/prediction.md,
/// limits): its online retrains have to learn them.
#[test]
fn a_model_that_saw_search_crowds_and_newsletter_virals_tells_them_apart_at_the_first_region() {
    let training: Vec<AccessEvent> = (0..6)
        .flat_map(|i| search_crowd_and_newsletter_viral_events(&format!("-{i}"), i * 260_000).0)
        .collect();
    let model = super::training::fit_on(&sorted(training));
    let (events, second_region_ms) = search_crowd_and_newsletter_viral_events("", 0);
    let run = replay(&sorted(events), Some(model), &rules_only());
    let of = |key: &'static str| run.commands.iter().filter(move |c| c.key.as_str() == key);
    assert_eq!(
        of("/local-story").count(),
        0,
        "the crowd sent by search engines got a command"
    );
    assert!(
        of("/issue-12").any(|c| c.issued_at_ms < second_region_ms),
        "the newsletter's viral waited for its second region"
    );
}
