//! Which regions a command names as a key spreads: follow-ups for a slow spread's later
//! regions, never one its burst passed through, the ones its pace (timed from when a
//! late-noticed ramp's demand began, not from a trickle before it) will likely reach in
//! time, and none that stopped asking.

use models::{AccessEvent, PrewarmCommand};

use super::{
    always_sure, background, commands_for, demand, event, names, replay, rules_only, sorted,
};

/// A slow spread's regions and when each first asks: 25–45 s apart.
const SLOW_ARRIVALS: [(&str, u64); 4] = [
    ("r0", 70_000),
    ("r1", 95_000),
    ("r2", 140_000),
    ("r3", 170_000),
];

/// A viral that reaches a region every 25–45 s: its first command expires before the
/// third and fourth regions ask, and follow-ups, each when the key has spread to
/// another region, warm them in time.
#[test]
fn a_slow_spread_gets_follow_ups_for_the_regions_it_reaches_after_the_first_command_expired() {
    let arrivals = SLOW_ARRIVALS;
    let mut events = background(210_000);
    for (region, from) in arrivals {
        events.extend(demand("/viral", region, from, 200_000));
    }
    let events = sorted(events);
    let run = replay(&events, Some(always_sure()), &rules_only());
    let commands = commands_for(&run.commands, "/viral");
    let first = commands.first().expect("the viral got a command");
    assert!(first.expires_at_ms < 140_000, "{first:?}");
    for (region, asks) in &arrivals[2..] {
        // Warmed in time, as the honest scorer counts it: a command naming the
        // region at least 100 ms before its first request, not expired by then.
        assert!(
            commands.iter().any(|c| names(c, region)
                && c.issued_at_ms + 100 <= *asks
                && *asks < c.expires_at_ms),
            "{region}, first asking at {asks} ms, was not warmed in time: {commands:#?}"
        );
    }
    let ids: std::collections::HashSet<_> = commands.iter().map(|c| &c.id).collect();
    assert_eq!(
        ids.len(),
        commands.len(),
        "each follow-up has an id of its own"
    );
    // One command, and at most one follow-up per region the key spread to.
    assert!(commands.len() <= arrivals.len(), "{commands:#?}");
}

/// r3 stops sending anything at 40 s (drained, failed, or the tenant steered away); a
/// viral at 90 s, in r0 then r1, names r2 but not r3: a fill there would wait in a
/// cache nobody reads.
#[test]
fn a_region_that_stopped_asking_is_not_named() {
    let mut events: Vec<AccessEvent> = background(120_000)
        .into_iter()
        .filter(|e| e.region.as_str() != "r3" || e.ts_ms < 40_000)
        .collect();
    events.extend(demand("/viral", "r0", 90_000, 100_000));
    events.extend(demand("/viral", "r1", 90_300, 100_000));
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let first = run.commands.iter().find(|c| c.key.as_str() == "/viral");
    assert!(
        first.is_some_and(|c| names(c, "r2") && !names(c, "r3")),
        "{first:?}"
    );
}

/// A slow spread whose demand passes: each region asks for 30 s, then goes quiet. A
/// follow-up names the regions the burst has not reached yet, never one whose clients
/// asked in this burst (warming it again after its demand passed is a wasted fill).
#[test]
fn a_follow_up_never_names_a_region_the_burst_already_passed_through() {
    let arrivals = SLOW_ARRIVALS;
    let mut events = background(230_000);
    for (region, from) in arrivals {
        events.extend(demand("/wave", region, from, from + 30_000));
    }
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let commands = commands_for(&run.commands, "/wave");
    assert!(
        commands.len() >= 2,
        "a first command and a follow-up: {commands:#?}"
    );
    for command in &commands {
        for (region, asks) in arrivals {
            assert!(
                !(names(command, region) && asks < command.issued_at_ms),
                "{region} asked at {asks} ms, before this command: {command:#?}"
            );
        }
    }
    assert!(
        commands.iter().any(|c| names(c, "r3")
            && c.issued_at_ms + 100 <= 170_000
            && 170_000 < c.expires_at_ms),
        "the last region is still warmed in time: {commands:#?}"
    );
}

const SIX_REGIONS: [&str; 6] = ["r0", "r1", "r2", "r3", "r4", "r5"];

/// The tenant's background key in six regions: five where its audience lives (5
/// requests a second each) and r5, where little of it does (one every 5 s).
fn audience_but_in_r5(until_ms: u64) -> Vec<AccessEvent> {
    (0..until_ms)
        .step_by(200)
        .flat_map(|ms| {
            SIX_REGIONS
                .iter()
                .filter(move |r| **r != "r5" || ms % 5_000 == 0)
                .map(move |r| event(ms, "/background", r))
        })
        .collect()
}

/// Six regions, five where the tenant's audience lives (5 background requests a second
/// each) and r5, where little of it does (one every 5 s). A viral bursts in r0 and
/// reaches r1 30 s later: at that pace two more regions ask within a follow-up's TTL,
/// most likely busy ones, and r5's fill would more likely be wasted than used. The
/// first command, before any spread, names every region; the follow-up at r1 names
/// the busy ones still unreached, not r5.
#[test]
fn a_slow_spreads_follow_up_names_the_regions_it_will_likely_reach_in_time() {
    let mut events = audience_but_in_r5(150_000);
    events.extend(demand("/slow", "r0", 70_000, 140_000));
    events.extend(demand("/slow", "r1", 100_000, 140_000));
    let run = replay(&sorted(events), Some(always_sure()), &rules_only());
    let commands = commands_for(&run.commands, "/slow");
    let [first, follow_up, ..] = commands.as_slice() else {
        panic!("a first command and a follow-up: {commands:#?}");
    };
    assert!(
        SIX_REGIONS[1..].iter().all(|r| names(first, r)),
        "{first:#?}"
    );
    assert!(follow_up.issued_at_ms >= 100_000, "{follow_up:#?}");
    assert!(
        ["r2", "r3", "r4"].iter().all(|r| names(follow_up, r)),
        "{follow_up:#?}"
    );
    assert!(!names(follow_up, "r5"), "{follow_up:#?}");
}

/// The first command for `/new` when it asks in r0 from `lead_in` (`(from, every_ms)`:
/// below the burst rate), bursts there at 95 s and reaches r1 at `second_region_ms`,
/// decided at its second region.
fn command_at_second_region(lead_in: (u64, usize), second_region_ms: u64) -> PrewarmCommand {
    let mut events = audience_but_in_r5(150_000);
    let (from, every_ms) = lead_in;
    events.extend(
        (from..95_000)
            .step_by(every_ms)
            .map(|ms| event(ms, "/new", "r0")),
    );
    events.extend(demand("/new", "r0", 95_000, 140_000));
    // r1's first clients come together: by the first tick it has asked enough to count.
    events.extend((0..5).map(|_| event(second_region_ms, "/new", "r1")));
    events.extend(demand("/new", "r1", second_region_ms, 140_000));
    let mut options = rules_only();
    options.predictor.policy.min_regions_reached = 2;
    let run = replay(&sorted(events), Some(always_sure()), &options);
    let first = run.commands.iter().find(|c| c.key.as_str() == "/new");
    let first = first.expect("a command at the second region").clone();
    assert!(first.issued_at_ms >= second_region_ms, "{first:#?}");
    first
}

/// A ramp noticed late: a new key asks in r0 about 7 times a second from 70 s and
/// bursts there only at 95 s; r1 asks at 105 s. Its spread took 35 s from when its
/// demand began (10 s from the notice): at that pace about two more regions ask within
/// a TTL, most likely busy ones. The command names the busy ones still unreached, not
/// r5; timed from the notice, every region would look in reach.
#[test]
fn a_ramp_noticed_late_is_timed_from_when_its_demand_began() {
    let first = command_at_second_region((70_000, 150), 105_000);
    assert!(
        ["r2", "r3", "r4"].iter().any(|r| names(&first, r)),
        "{first:#?}"
    );
    assert!(!names(&first, "r5"), "{first:#?}");
}

/// A trickle before a fast spread: a new key asks in r0 once every 2 s from 50 s,
/// bursts there at 95 s and reaches r1 3 s later. Its demand began at the burst, not
/// at the trickle's first request: at a region every 3 s all the others ask within a
/// TTL, and the command names them all, r5 too.
#[test]
fn a_trickle_before_a_fast_spread_does_not_slow_it() {
    let first = command_at_second_region((50_000, 2_000), 98_000);
    for region in ["r2", "r3", "r4", "r5"] {
        assert!(names(&first, region), "{region}: {first:#?}");
    }
}
