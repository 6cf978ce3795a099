//! Answers for the whole fleet: this instance's answer merged with every peer's
//! `scope=local` answer, by the same merge that joins partitions, so a fleet answer is
//! the answer one instance owning every partition gives.
//!
//! What each part may say, and what the merge makes of it:
//! - an answer: merged, its coverage joined;
//! - "not here" (`unknown_tenant`, `unknown_region`, `owner_unavailable`, with the
//!   partitions that were asked): nothing to merge, but those partitions are covered;
//! - anything else from a peer (unreachable, timeout, 5xx, a body that is not the
//!   answer): the peer is named in `coverage.missing_peers`, never silently left out.
//!   Its partitions are then not covered, unless they have moved to the others (a dead
//!   instance's do, within the group's session timeout); the answer is complete when
//!   every partition is covered exactly once.
//!
//! A bad request is refused by this instance before any peer is asked.

use axum::http::{StatusCode, Uri};
use serde::de::DeserializeOwned;

use super::{ApiError, AppState};
use crate::fleet::{
    Coverage, EdgesResponse, HeatmapResponse, KeyResponse, ModelResponse, PeerAnswer, PeerFailure,
    PeerUrl, PredictionsResponse, RatesResponse, SILENCE_BEFORE_WARNING, Scope, TenantsResponse,
};
use crate::metrics::{Metrics, PeerLabel};

/// An API answer that says which partitions it covers.
pub(super) trait Covered: DeserializeOwned + Send + 'static {
    fn coverage_mut(&mut self) -> &mut Coverage;
}

macro_rules! covered {
    ($($t:ty),*) => {$(
        impl Covered for $t {
            fn coverage_mut(&mut self) -> &mut Coverage {
                &mut self.coverage
            }
        }
    )*};
}
covered!(
    TenantsResponse,
    HeatmapResponse,
    RatesResponse,
    EdgesResponse,
    PredictionsResponse,
    ModelResponse,
    KeyResponse
);

/// Refusals that mean "these partitions have nothing for it", not "something broke".
fn not_here(code: &str) -> bool {
    matches!(
        code,
        "unknown_tenant" | "unknown_region" | "owner_unavailable"
    )
}

/// Counts one peer's part of a fleet answer, by outcome, and its time.
fn count<T>(metrics: &Metrics, answer: &PeerAnswer<T>) {
    let outcome = match &answer.result {
        Ok(_) => "ok",
        Err(failure) => failure.as_str(),
    };
    metrics
        .peer_answers
        .get_or_create(&PeerLabel {
            peer: answer.peer.to_string(),
            outcome,
        })
        .inc();
    metrics.peer_seconds.observe(answer.elapsed.as_secs_f64());
}

/// `local`, merged with the peers' answers to the same request when `scope` is the
/// fleet (the default) and there are peers.
pub(super) async fn answer<T: Covered>(
    state: &AppState,
    scope: Option<Scope>,
    uri: &Uri,
    local: Result<T, ApiError>,
    merge: impl FnOnce(Vec<T>) -> Option<T>,
) -> Result<T, ApiError> {
    answer_from(state, scope, uri, local, merge, None).await
}

/// [`answer`], asking only the peers `only` when given (a key's owners).
pub(super) async fn answer_from<T: Covered>(
    state: &AppState,
    scope: Option<Scope>,
    uri: &Uri,
    local: Result<T, ApiError>,
    merge: impl FnOnce(Vec<T>) -> Option<T>,
    only: Option<std::sync::Arc<[PeerUrl]>>,
) -> Result<T, ApiError> {
    let peers = match &state.peers {
        Some(peers)
            if scope != Some(Scope::Local)
                && !peers.is_empty()
                && only.as_ref().is_none_or(|o| !o.is_empty()) =>
        {
            peers
        }
        _ => return local,
    };
    let mut parts = Vec::new();
    let mut covered = Vec::new();
    let mut refusal = None;
    match local {
        Ok(part) => parts.push(part),
        Err(e) if not_here(e.code) => {
            covered.extend(e.coverage.as_deref().cloned());
            refusal = Some(e);
        }
        Err(e) => return Err(e),
    }
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let mut missing = Vec::new();
    let gathered = match only {
        Some(only) => peers.gather_from::<T>(only, path).await,
        None => peers.gather::<T>(path).await,
    };
    for peer in gathered {
        count(&state.metrics, &peer);
        match peer.result {
            Ok(part) => {
                peers.silent_for(&peer.peer, true);
                parts.push(part)
            }
            Err(PeerFailure::Status {
                error: Some(body), ..
            }) if not_here(&body.error) => {
                peers.silent_for(&peer.peer, true);
                covered.extend(body.coverage)
            }
            Err(failure) => {
                // A peer that left the group (its port closed) is dropped by
                // discovery before this warns; one unreachable for longer, or any
                // other failure, is a fault.
                let silent = peers.silent_for(&peer.peer, false);
                let gone = matches!(failure, PeerFailure::Unreachable(_));
                if !gone || silent >= SILENCE_BEFORE_WARNING {
                    tracing::warn!(peer = %peer.peer, failure = failure.as_str(), "peer left out of a fleet answer");
                } else {
                    tracing::debug!(peer = %peer.peer, failure = failure.as_str(), "peer left out of a fleet answer (not answering for less than the warning's delay)");
                }
                missing.push(peer.peer.to_string());
            }
        }
    }
    covered.extend(parts.iter_mut().map(|p| p.coverage_mut().clone()));
    covered.push(Coverage {
        missing_peers: missing,
        ..Coverage::default()
    });
    let coverage = Coverage::merge(&covered);
    state.metrics.fleet_answers.inc();
    if !coverage.complete {
        state.metrics.fleet_answers_incomplete.inc();
    }
    match merge(parts) {
        Some(mut merged) => {
            *merged.coverage_mut() = coverage;
            Ok(merged)
        }
        // Nobody had it: the refusal, now for every partition that was asked.
        None => match refusal {
            Some(e) if coverage.complete => Err(e.covering(coverage)),
            _ => Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "incomplete",
                message: format!(
                    "no answer, and not every partition was asked; peers not answering: {}",
                    coverage.missing_peers.join(", ")
                ),
                coverage: Some(Box::new(coverage)),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use models::{AccessEvent, CacheKey, NodeId, Outcome, RegionId, TenantId};
    use serde_json::Value;

    use super::super::tests::get;
    use crate::api::{AppState, app};
    use crate::fleet::{Partitioner, PeersConfig, partition_for_key};

    use crate::Peers;
    use crate::metrics::Metrics;
    use crate::partition::{Partitions, SharedPartitions};

    const T0: u64 = 1_764_470_000_000;
    const PARTITIONS: i32 = 4;

    /// Events of two tenants over many keys and regions, seeded.
    fn events() -> Vec<AccessEvent> {
        (0..2_000u64)
            .map(|i| {
                let tenant = ["acme", "globex"][(i % 7 == 0) as usize];
                let key = format!("/k/{}", (i * 2_654_435_761) % 37);
                let region = ["eu-west", "us-east", "ap-south"][(i % 3) as usize];
                AccessEvent::new(
                    T0 + i * 5,
                    TenantId::new(tenant).unwrap(),
                    CacheKey::new(key).unwrap(),
                    RegionId::new(region).unwrap(),
                    NodeId::new(format!("edge-{}", i % 5)).unwrap(),
                    if i % 3 == 0 {
                        Outcome::Miss
                    } else {
                        Outcome::Hit
                    },
                )
            })
            .collect()
    }

    /// The partitions of `owned`, each holding the events the producers'
    /// partitioner sends it.
    fn owning(owned: &[i32]) -> SharedPartitions {
        let mut partitions = Partitions::heat_only(PARTITIONS);
        for &p in owned {
            partitions.assign(p, None, 0, 0);
        }
        for e in events() {
            let p = partition_for_key(e.partition_key().as_bytes(), PARTITIONS);
            if let Some(state) = partitions.states_mut().get_mut(&p) {
                state.heat.apply(&e).unwrap();
                partitions.observe_key(e.partition_key().as_bytes(), p);
            }
        }
        partitions.shared()
    }

    /// The partitions of `owned`, with the events of producers using two
    /// partitioners at once: every other event by librdkafka's default, the others by
    /// the Java client's.
    fn owning_mixed(owned: &[i32]) -> SharedPartitions {
        let mut partitions = Partitions::heat_only(PARTITIONS);
        for &p in owned {
            partitions.assign(p, None, 0, 0);
        }
        for (i, e) in events().into_iter().enumerate() {
            let by = [Partitioner::ConsistentRandom, Partitioner::Murmur2Random][i % 2];
            let key = e.partition_key();
            let p = by.partition(key.as_bytes(), PARTITIONS);
            if let Some(state) = partitions.states_mut().get_mut(&p) {
                state.heat.apply(&e).unwrap();
                partitions.observe_key(key.as_bytes(), p);
            }
        }
        partitions.shared()
    }

    fn state(owned: &[i32], peers: &[String]) -> AppState {
        AppState {
            partitions: owning(owned),
            metrics: Arc::new(Metrics::new()),
            peers: (!peers.is_empty()).then(|| Peers::new(peers, PeersConfig::default()).unwrap()),
            warm: None,
        }
    }

    /// Serves `router` on a free port of 127.0.0.1; the URL.
    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    }

    /// A port nothing listens on.
    async fn closed_port() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        url
    }

    const QUESTIONS: [&str; 7] = [
        "/api/tenants",
        "/api/heatmap?tenant=acme&window=60s&n=50&now_ms=1764470010000",
        "/api/heatmap?tenant=globex&region=us-east&window=10s&now_ms=1764470010000",
        "/api/rates?tenant=acme&now_ms=1764470010000",
        "/api/edges",
        "/api/keys/acme/k/3?now_ms=1764470010000",
        "/api/warmset?region=eu-west&tenant=acme&tenant=globex&limit=50&now_ms=1764470010000",
    ];

    /// Two instances owning half the partitions each answer every question exactly as
    /// one instance owning them all, from either side, and say the answer is complete.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_answer_is_the_single_instance_answer() {
        let single = app(state(&[0, 1, 2, 3], &[]));
        let b_url = serve(app(state(&[2, 3], &[]))).await;
        let a = app(state(&[0, 1], &[b_url]));
        for question in QUESTIONS {
            let (status, alone) = get(&single, question).await;
            assert_eq!(status, 200, "{question}: {alone}");
            let (status, merged) = get(&a, question).await;
            assert_eq!(status, 200, "{question}: {merged}");
            assert_eq!(merged["coverage"]["complete"], true, "{question}: {merged}");
            assert_eq!(merged, alone, "{question}");
        }
        // The key is routed by the partitioner that placed every event: whichever
        // side owns it, the answer names that partition.
        let (_, warmset) = get(&a, QUESTIONS[6]).await;
        assert!(!warmset["keys"].as_array().unwrap().is_empty(), "{warmset}");
        let (_, key) = get(&a, QUESTIONS[5]).await;
        let owner = partition_for_key(b"acme/k/3", PARTITIONS);
        assert_eq!(key["ownership"]["partitions"], serde_json::json!([owner]));
        assert_eq!(key["ownership"]["partitioner"], "consistent_random");
    }

    /// Producers with two partitioners at once: no partitioner fits, a key's counts
    /// are on two partitions, and the fleet answer adds every partition's estimate (at
    /// least the truth, at most the stated bound above it); the heat map has one row
    /// per key. Either instance gives the same answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mixed_partitioners_are_looked_up_everywhere_and_merged_per_key() {
        let mixed = |owned: &[i32], peers: &[String]| AppState {
            partitions: owning_mixed(owned),
            metrics: Arc::new(Metrics::new()),
            peers: (!peers.is_empty()).then(|| Peers::new(peers, PeersConfig::default()).unwrap()),
            warm: None,
        };
        let b_url = serve(app(mixed(&[2, 3], &[]))).await;
        let a_url = serve(app(mixed(&[0, 1], &[]))).await;
        let a = app(mixed(&[0, 1], &[b_url]));
        let b = app(mixed(&[2, 3], &[a_url]));
        let now = "now_ms=1764470010000";
        for i in 0..37u64 {
            let key = format!("/k/{i}");
            let truth = events()
                .iter()
                .filter(|e| e.tenant.as_str() == "acme" && e.key.as_str() == key)
                .count() as u64;
            let (status, body) = get(&a, &format!("/api/keys/acme{key}?{now}")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["ownership"]["partitioner"], Value::Null, "{body}");
            assert_eq!(
                body["ownership"]["partitions"],
                serde_json::json!([0, 1, 2, 3])
            );
            assert_eq!(body["coverage"]["complete"], true, "{body}");
            let counted = body["windows"][3]["total"].as_u64().unwrap();
            let bound = body["ownership"]["error_bound_events_60s"]
                .as_u64()
                .unwrap();
            assert!(
                counted >= truth && counted <= truth + bound,
                "{key}: {counted} for {truth} (bound {bound})"
            );
            let (_, other) = get(&b, &format!("/api/keys/acme{key}?{now}")).await;
            assert_eq!(other, body, "{key}: both instances give the same answer");
        }
        let question = format!("/api/heatmap?tenant=acme&window=60s&n=100&{now}");
        let (status, heat) = get(&a, &question).await;
        assert_eq!(status, 200, "{heat}");
        let rows: Vec<&str> = heat["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["key"].as_str().unwrap())
            .collect();
        let mut distinct = rows.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(rows.len(), distinct.len(), "one row per key: {rows:?}");
        assert!(heat["split_keys"].as_u64().unwrap() > 0, "{heat}");
        let (_, other) = get(&b, &question).await;
        assert_eq!(other, heat);
    }

    /// A peer that does not answer is named and the answer is marked incomplete, never
    /// passed off as whole; `scope=local` answers for this instance's partitions only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_peer_is_named_and_the_answer_is_incomplete() {
        let gone = closed_port().await;
        let a = app(state(&[0, 1], std::slice::from_ref(&gone)));
        let (status, body) = get(&a, "/api/tenants").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["coverage"]["complete"], false, "{body}");
        assert_eq!(body["coverage"]["partitions"], serde_json::json!([0, 1]));
        assert_eq!(body["coverage"]["missing_peers"], serde_json::json!([gone]));
        let (_, local) = get(&a, "/api/tenants?scope=local").await;
        assert_eq!(local["coverage"]["missing_peers"], serde_json::json!([]));
        assert_eq!(local["coverage"]["complete"], false);
        // A key owned by the missing side cannot be answered: 503 saying so.
        let key = (0..100)
            .map(|i| format!("/k/{i}"))
            .find(|k| partition_for_key(models::message_key("acme", k).as_bytes(), PARTITIONS) >= 2)
            .unwrap();
        let (status, body) = get(&a, &format!("/api/keys/acme{key}")).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["coverage"]["missing_peers"], serde_json::json!([gone]));
        // A key owned here (the partitioner is known) is answered here alone, whole:
        // the dead peer is not asked.
        let key = (0..100)
            .map(|i| format!("/k/{i}"))
            .find(|k| partition_for_key(models::message_key("acme", k).as_bytes(), PARTITIONS) < 2)
            .unwrap();
        let (status, body) = get(&a, &format!("/api/keys/acme{key}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["coverage"]["complete"], true, "{body}");
        assert_eq!(body["coverage"]["missing_peers"], serde_json::json!([]));
    }

    /// Every answer gathered for the fleet is counted, and one that misses a peer also
    /// as incomplete (the alert's ratio); a local answer is neither.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fleet_answers_are_counted_and_incomplete_ones_apart() {
        let b_url = serve(app(state(&[2, 3], &[]))).await;
        let gone = closed_port().await;
        let whole = state(&[0, 1], &[b_url]);
        let partial = state(&[0, 1], &[gone]);
        let (whole_counts, partial_counts) = (whole.metrics.clone(), partial.metrics.clone());
        let (whole, partial) = (app(whole), app(partial));
        get(&whole, "/api/tenants").await;
        get(&partial, "/api/tenants").await;
        get(&partial, "/api/tenants?scope=local").await;
        let counts = |m: &Metrics| (m.fleet_answers.get(), m.fleet_answers_incomplete.get());
        assert_eq!(counts(&whole_counts), (1, 0));
        assert_eq!(counts(&partial_counts), (1, 1));
    }

    /// With the producers' partitioner known and the group saying which peer owns
    /// which partition, a key lookup asks only the key's owner: a peer that is down
    /// but owns nothing of the key leaves the answer whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_routed_key_asks_only_its_owner() {
        let b_url = serve(app(state(&[2, 3], &[]))).await;
        let gone = closed_port().await;
        let a = state(&[0, 1], &[b_url.clone(), gone.clone()]);
        let peers = a.peers.clone().unwrap();
        let a = app(a);
        let owned_by = |lo: i32| {
            (0..100)
                .map(|i| format!("/k/{i}"))
                .find(|k| {
                    let p =
                        partition_for_key(models::message_key("acme", k).as_bytes(), PARTITIONS);
                    (lo..lo + 2).contains(&p)
                })
                .unwrap()
        };
        let (theirs, mine) = (owned_by(2), owned_by(0));
        // Owners unknown: every peer is asked, the dead one too.
        let (status, body) = get(&a, &format!("/api/keys/acme{theirs}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["coverage"]["missing_peers"], serde_json::json!([gone]));
        let b = crate::fleet::PeerUrl::parse(&b_url).unwrap();
        peers.set_owners([(2, b.clone()), (3, b)].into_iter().collect());
        for key in [theirs, mine] {
            let (status, body) = get(&a, &format!("/api/keys/acme{key}")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["coverage"]["complete"], true, "{key}: {body}");
            assert_eq!(body["coverage"]["missing_peers"], serde_json::json!([]));
            let owner = partition_for_key(models::message_key("acme", &key).as_bytes(), PARTITIONS);
            assert_eq!(body["ownership"]["partitions"], serde_json::json!([owner]));
        }
    }

    /// The group's description said which peer owns a key's partition, and the
    /// partition has moved since (or that peer is gone): the owners asked do not make
    /// the answer whole, so every other peer is asked, and the answer is whole and
    /// right, the gone peer still named.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_whose_owner_moved_since_the_last_description_is_whole() {
        let moved_from = serve(app(state(&[], &[]))).await;
        let owner = serve(app(state(&[2, 3], &[]))).await;
        let gone = closed_port().await;
        let a = state(&[0, 1], &[moved_from.clone(), owner]);
        let peers = a.peers.clone().unwrap();
        let a = app(a);
        let single = app(state(&[0, 1, 2, 3], &[]));
        let key = (0..100)
            .map(|i| format!("/k/{i}"))
            .find(|k| partition_for_key(models::message_key("acme", k).as_bytes(), PARTITIONS) >= 2)
            .unwrap();
        let question = format!("/api/keys/acme{key}?now_ms=1764470010000");
        let (_, alone) = get(&single, &question).await;
        for (stale, missing) in [
            (&moved_from, serde_json::json!([])),
            (&gone, serde_json::json!([gone])),
        ] {
            let stale = crate::fleet::PeerUrl::parse(stale).unwrap();
            peers.set_owners([(2, stale.clone()), (3, stale)].into_iter().collect());
            let (status, body) = get(&a, &question).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["coverage"]["complete"], true, "{body}");
            assert_eq!(body["coverage"]["missing_peers"], missing, "{body}");
            assert_eq!(body["windows"], alone["windows"], "{body}");
        }
    }

    /// A topic grown from 4 to 6 partitions, half the events written before: a key's
    /// route is its partition under each count, and when those are on two instances
    /// each peer reports only the partition it counted, so the answer is whole and
    /// right from either side.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_that_moved_with_a_growth_is_whole_across_instances() {
        const GROWN: i32 = 6;
        let grown = |owned: &[i32]| {
            let mut partitions = Partitions::heat_only(PARTITIONS);
            partitions.set_partition_count(GROWN);
            for &p in owned {
                partitions.assign(p, None, 0, 0);
            }
            for (i, e) in events().into_iter().enumerate() {
                let count = if i < 1_000 { PARTITIONS } else { GROWN };
                let key = e.partition_key();
                let p = partition_for_key(key.as_bytes(), count);
                if let Some(state) = partitions.states_mut().get_mut(&p) {
                    state.heat.apply(&e).unwrap();
                }
                partitions.observe_key(key.as_bytes(), p);
            }
            partitions.shared()
        };
        let (low, high) = ([0, 1, 2], [3, 4, 5]);
        let node = |owned: &[i32], peers: &[String]| AppState {
            partitions: grown(owned),
            metrics: Arc::new(Metrics::new()),
            peers: (!peers.is_empty()).then(|| Peers::new(peers, PeersConfig::default()).unwrap()),
            warm: None,
        };
        let (a_url, b_url) = (
            serve(app(node(&low, &[]))).await,
            serve(app(node(&high, &[]))).await,
        );
        let a = node(&low, std::slice::from_ref(&b_url));
        let b = node(&high, std::slice::from_ref(&a_url));
        let owners = |url: &str, of: &[i32]| {
            let url = crate::fleet::PeerUrl::parse(url).unwrap();
            of.iter().map(|&p| (p, url.clone())).collect()
        };
        a.peers.as_ref().unwrap().set_owners(owners(&b_url, &high));
        b.peers.as_ref().unwrap().set_owners(owners(&a_url, &low));
        let (a, b) = (app(a), app(b));
        let mut across = 0;
        for i in 0..37u64 {
            let key = format!("/k/{i}");
            let message_key = models::message_key("acme", &key);
            let route: Vec<i32> = {
                let mut r = vec![
                    partition_for_key(message_key.as_bytes(), PARTITIONS),
                    partition_for_key(message_key.as_bytes(), GROWN),
                ];
                r.sort_unstable();
                r.dedup();
                r
            };
            across += usize::from(route.len() == 2 && route[0] < 3 && route[1] >= 3);
            let truth = events()
                .iter()
                .filter(|e| e.tenant.as_str() == "acme" && e.key.as_str() == key)
                .count() as u64;
            for (name, instance) in [("a", &a), ("b", &b)] {
                let (status, body) = get(
                    instance,
                    &format!("/api/keys/acme{key}?now_ms=1764470010000"),
                )
                .await;
                assert_eq!(status, 200, "{name} {key}: {body}");
                assert_eq!(body["coverage"]["complete"], true, "{name} {key}: {body}");
                assert_eq!(body["ownership"]["partitions"], serde_json::json!(route));
                assert_eq!(body["windows"][3]["total"], truth, "{name} {key}: {body}");
            }
            // A peer asked for both partitions counts, and names, only its own.
            let (_, part) = get(
                &a,
                &format!(
                    "/api/keys/acme{key}?scope=local&partitions={}",
                    route
                        .iter()
                        .map(i32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            )
            .await;
            let mine: Vec<i32> = route.iter().copied().filter(|p| low.contains(p)).collect();
            if !mine.is_empty() {
                assert_eq!(
                    part["ownership"]["partitions"],
                    serde_json::json!(mine),
                    "{part}"
                );
            }
        }
        assert!(across > 0, "some key has its partitions on both instances");
    }

    /// A tenant nobody knows is a 404 that covers every partition, not an outage.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_unknown_everywhere_is_a_complete_404() {
        let b_url = serve(app(state(&[2, 3], &[]))).await;
        let a = app(state(&[0, 1], &[b_url]));
        let (status, body) = get(&a, "/api/heatmap?tenant=initech").await;
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"], "unknown_tenant");
        assert_eq!(body["coverage"]["complete"], true, "{body}");
        // A bad request is refused here, before any peer is asked.
        let (status, body) = get(&a, "/api/heatmap?tenant=acme&window=5m").await;
        assert_eq!(status, 400, "{body}");
        let _: Value = body;
    }
}
