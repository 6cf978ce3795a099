//! RFC 9111 §5.1 and §4.2.3 (`Age`): an upstream `Age` uses up freshness, a list
//! value is read from its first member, and responses from the cache state theirs.

mod common;

use common::{Rig, header, x_cache};
use prefetcher::testing::Scripted;

/// §4.2.3: current_age includes the `Age` received; a response already older than
/// its `max-age` is stale on arrival.
#[tokio::test]
async fn s4_2_3_an_upstream_age_uses_up_the_lifetime() {
    let rig = Rig::start().await;
    rig.origin.script("/old", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=3600"), ("age", "7200")])
    });
    rig.get("/old", &[]).await;
    rig.get("/old", &[]).await;
    assert_eq!(rig.fills("/old"), 2);
    rig.origin.script("/young", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=3600"), ("age", "100")])
    });
    rig.get("/young", &[]).await;
    let hit = rig.get("/young", &[]).await;
    assert_eq!(x_cache(&hit), "HIT");
    let age: u64 = header(&hit, "age").unwrap().parse().unwrap();
    assert!(age >= 100, "the Age sent includes the upstream one: {age}");
}

/// §5.1: a list-valued `Age` is read from its first member (`7200, 0` is 7200, not 0).
#[tokio::test]
async fn s5_1_a_list_valued_age_uses_its_first_member() {
    let rig = Rig::start().await;
    rig.origin.script("/list", |_, _| {
        Scripted::new(
            200,
            &[("cache-control", "max-age=3600"), ("age", "7200, 0")],
        )
    });
    rig.get("/list", &[]).await;
    rig.get("/list", &[]).await;
    assert_eq!(rig.fills("/list"), 2, "stale on arrival");
    rig.origin.script("/lines", |_, _| {
        Scripted::new(
            200,
            &[
                ("cache-control", "max-age=3600"),
                ("age", "7200"),
                ("age", "0"),
            ],
        )
    });
    rig.get("/lines", &[]).await;
    rig.get("/lines", &[]).await;
    assert_eq!(rig.fills("/lines"), 2);
}

/// §5.1: an invalid `Age` is ignored (not read as "very old" nor as a list).
#[tokio::test]
async fn s5_1_an_invalid_age_is_ignored() {
    let rig = Rig::start().await;
    rig.origin.script("/bad", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=3600"), ("age", "soon")])
    });
    rig.get("/bad", &[]).await;
    assert_eq!(x_cache(&rig.get("/bad", &[]).await), "HIT");
}

/// §5.1: one `Age` per response from the cache, a single non-negative integer.
#[tokio::test]
async fn s5_1_a_hit_carries_exactly_one_age() {
    let rig = Rig::start().await;
    rig.origin.script("/one", |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=3600"), ("age", "5, 9")])
    });
    rig.get("/one", &[]).await;
    let hit = rig.get("/one", &[]).await;
    let ages: Vec<_> = hit.headers.get_all("age").iter().collect();
    assert_eq!(ages.len(), 1, "{ages:?}");
    let age: u64 = ages[0].to_str().unwrap().parse().unwrap();
    assert!(age >= 5);
}
