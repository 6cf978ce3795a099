//! The fill limiter's rules, one test each, on a paused clock.

use super::*;
use crate::config::RouteConfig;

fn id(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

fn tenant(name: &str, weight: f64) -> TenantConfig {
    TenantConfig {
        id: id(name),
        hosts: Vec::new(),
        origin: format!("http://{name}.example"),
        host_header: None,
        weight,
        peak_fills: None,
        routes: Vec::new(),
        origin_hints: None,
    }
}

fn flight(max_fills: usize, reserved: usize, max_queued: usize) -> FlightConfig {
    FlightConfig {
        max_fills,
        reserved_for_user: reserved,
        max_queued_fills: max_queued,
        queue_timeout_ms: 1_000,
        ..FlightConfig::default()
    }
}

fn limiter(max_fills: usize, reserved: usize, prefetch_max: usize) -> FillLimiter {
    let prefetch = PrefetchConfig {
        max_fills: prefetch_max,
        min_fills: 1,
        max_queued: 2,
        queue_timeout_ms: 1_000,
        ..PrefetchConfig::default()
    };
    FillLimiter::new(&flight(max_fills, reserved, 2), &prefetch)
}

fn shared(max_fills: usize, max_queued: usize, tenants: &[TenantConfig]) -> FillLimiter {
    let l = FillLimiter::new(
        &flight(max_fills, 0, max_queued),
        &PrefetchConfig::default(),
    );
    l.set_tenants(tenants);
    l
}

const STATIC: TrafficClass = TrafficClass::Static;

async fn user(l: &FillLimiter, name: &str) -> Result<FillSlot, FillError> {
    l.acquire_user(&id(name), STATIC).await
}

/// A user fill that waits in the background.
fn waiting(l: &FillLimiter, name: &str) -> tokio::task::JoinHandle<Result<FillSlot, FillError>> {
    let l = l.clone();
    let name = name.to_owned();
    tokio::spawn(async move { l.acquire_user(&id(&name), STATIC).await })
}

fn fills(l: &FillLimiter, name: &str) -> (usize, usize) {
    let t = l
        .tenants()
        .into_iter()
        .find(|t| t.tenant == id(name))
        .unwrap();
    (t.active, t.queued)
}

#[tokio::test(start_paused = true)]
async fn prefetches_use_spare_capacity_only_and_time_out_when_shed() {
    let l = limiter(4, 1, 8);
    assert_eq!(l.prefetch_limit(), 3, "capped at max_fills - reserved");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(l.acquire_prefetch(None).await.unwrap());
    }
    assert_eq!(l.free_slots(), 1, "the user reserve stays free");
    let started = Instant::now();
    assert_eq!(
        l.acquire_prefetch(None).await.unwrap_err(),
        FillError::NoCapacity
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "waited the queue timeout"
    );
    let u = user(&l, "a").await.unwrap();
    assert_eq!(u.class(), FillClass::User);
    let waiter = tokio::spawn({
        let l = l.clone();
        async move { l.acquire_prefetch(None).await.map(|s| s.class()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(l.prefetch_queued(), 1);
    drop(u);
    tokio::task::yield_now().await;
    assert_eq!(l.prefetch_queued(), 1, "the freed slot is the user reserve");
    // A released prefetch slot wakes the queued prefetch.
    drop(held.pop());
    assert_eq!(waiter.await.unwrap(), Ok(FillClass::Prefetch));
    assert_eq!(l.prefetch_queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_user_sheds_queued_prefetches_and_the_user_queue_is_bounded() {
    let l = limiter(2, 1, 1);
    let p = l.acquire_prefetch(None).await.unwrap();
    let u = user(&l, "a").await.unwrap();
    let queued = tokio::spawn({
        let l = l.clone();
        async move { l.acquire_prefetch(None).await.map(|s| s.class()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(l.prefetch_queued(), 1);
    let users: Vec<_> = (0..2).map(|_| waiting(&l, "a")).collect();
    tokio::task::yield_now().await;
    assert_eq!(queued.await.unwrap(), Err(FillError::NoCapacity));
    assert_eq!(l.user_queued(), 2);
    match user(&l, "a").await.unwrap_err() {
        FillError::Overloaded { retry_after_s } => assert!(retry_after_s >= 1),
        other => panic!("{other:?}"),
    }
    drop(u);
    drop(p);
    for u in users {
        assert_eq!(u.await.unwrap().unwrap().class(), FillClass::User);
    }
}

/// Share: while both tenants are active, a tenant holds its committed share and
/// waits past it, and the other's share stays free for it.
#[tokio::test(start_paused = true)]
async fn an_active_tenant_keeps_its_share_free() {
    let l = shared(4, 8, &[tenant("a", 1.0), tenant("b", 1.0)]);
    drop(user(&l, "b").await.unwrap());
    let held_a = [user(&l, "a").await.unwrap(), user(&l, "a").await.unwrap()];
    let third_a = waiting(&l, "a");
    tokio::task::yield_now().await;
    assert_eq!(fills(&l, "a"), (2, 1), "a waits past its share of 2");
    let held_b = [user(&l, "b").await.unwrap(), user(&l, "b").await.unwrap()];
    assert_eq!(fills(&l, "b"), (2, 0), "b's share was free");
    drop(held_a);
    assert!(third_a.await.unwrap().is_ok());
    drop(held_b);
}

/// Borrow: an idle tenant's share is lent; a tenant that wakes up gets the next
/// released slot ahead of the borrower's queued fills.
#[tokio::test(start_paused = true)]
async fn idle_shares_are_borrowed_and_given_back_first() {
    let l = shared(4, 8, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let mut held_a = Vec::new();
    for _ in 0..4 {
        held_a.push(user(&l, "a").await.unwrap());
    }
    assert_eq!(fills(&l, "a"), (4, 0), "b is idle: a borrows its share");
    let queued_a = waiting(&l, "a");
    tokio::task::yield_now().await;
    let b = waiting(&l, "b");
    tokio::task::yield_now().await;
    drop(held_a.pop());
    let b = b.await.unwrap().unwrap();
    assert_eq!(fills(&l, "a"), (3, 1), "the released slot went to b");
    drop(held_a.pop());
    tokio::task::yield_now().await;
    // a's borrowing now stops short of b's unused share.
    assert_eq!(fills(&l, "a"), (2, 1));
    drop(b);
    drop(held_a);
    assert!(queued_a.await.unwrap().is_ok());
}

/// Fair order across tenants: with weights 1 and 2 and both backlogged, released
/// slots go one to `a` for two to `b`, though `a` queued all its fills first.
#[tokio::test(start_paused = true)]
async fn released_slots_go_to_queued_tenants_in_weighted_fair_order() {
    let l = shared(3, 30, &[tenant("a", 1.0), tenant("b", 2.0)]);
    // Pre-warm fills hold every slot, so both tenants are within their shares.
    let mut prewarm = Vec::new();
    for _ in 0..3 {
        prewarm.push(l.acquire_prefetch(None).await.unwrap());
    }
    let mut queued = Vec::new();
    for name in ["a", "a", "a", "b", "b", "b", "b"] {
        queued.push((name, waiting(&l, name)));
        tokio::task::yield_now().await;
    }
    // One slot goes round: each grant is released at once, which grants the next.
    drop(prewarm.pop());
    let mut got = String::new();
    for _ in 0..6 {
        tokio::task::yield_now().await;
        let done: Vec<_> = queued.iter().map(|(_, h)| h.is_finished()).collect();
        assert_eq!(
            done.iter().filter(|d| **d).count(),
            1,
            "one slot, one grant"
        );
        let (name, handle) = queued.remove(done.iter().position(|d| *d).unwrap());
        got.push_str(name);
        drop(handle.await.unwrap().unwrap());
    }
    assert_eq!(got, "abbabb");
}

/// Per-tenant queue bound: a flooding tenant's queue fills up and its fills are
/// refused, while the other tenant still queues.
#[tokio::test(start_paused = true)]
async fn each_tenant_has_its_own_queue_bound() {
    let l = shared(2, 4, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let _held = [user(&l, "a").await.unwrap(), user(&l, "b").await.unwrap()];
    let _a: Vec<_> = (0..2).map(|_| waiting(&l, "a")).collect();
    tokio::task::yield_now().await;
    assert!(matches!(
        user(&l, "a").await,
        Err(FillError::Overloaded { .. })
    ));
    let b = waiting(&l, "b");
    tokio::task::yield_now().await;
    assert_eq!(fills(&l, "b"), (1, 1), "b's queue places are its own");
    b.abort();
}

/// Deadline: a queued user fill waits `flight.queue_timeout_ms`, then is refused
/// with a `Retry-After`; the queue is left clean.
#[tokio::test(start_paused = true)]
async fn a_queued_user_fill_has_a_deadline() {
    let l = shared(1, 4, &[tenant("a", 1.0)]);
    let _held = user(&l, "a").await.unwrap();
    let started = Instant::now();
    match user(&l, "a").await {
        Err(FillError::Overloaded { retry_after_s }) => assert!(retry_after_s >= 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(l.user_queued(), 0);
    assert_eq!(fills(&l, "a"), (1, 0));
}

/// Retry-After grows with the refused tenant's recent refusals, is jittered, and
/// does not grow for another tenant.
#[tokio::test(start_paused = true)]
async fn retry_after_grows_with_the_tenants_refusals() {
    let l = shared(2, 2, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let _held = [user(&l, "a").await.unwrap(), user(&l, "b").await.unwrap()];
    let _queued = [waiting(&l, "a"), waiting(&l, "b")];
    tokio::task::yield_now().await;
    let refused = |l: &FillLimiter, name: &str| {
        let l = l.clone();
        let name = name.to_owned();
        async move {
            match l.acquire_user(&id(&name), STATIC).await {
                Err(FillError::Overloaded { retry_after_s }) => retry_after_s,
                other => panic!("{other:?}"),
            }
        }
    };
    let first_a = refused(&l, "a").await;
    let mut later_a = 0;
    for _ in 0..20 {
        later_a = refused(&l, "a").await;
    }
    let first_b = refused(&l, "b").await;
    assert!(first_a <= 3 && first_b <= 3, "{first_a} {first_b}");
    assert!(later_a > first_a + 5, "{first_a} → {later_a}");
}

/// The origin's adaptive limit holds user fills: once latency rises, fills past
/// the shrunk limit wait, and healthy fills give the limit back.
#[tokio::test(start_paused = true)]
async fn a_slowing_origin_gets_fewer_user_fills_and_a_recovered_one_more() {
    let l = shared(16, 32, &[tenant("a", 1.0)]);
    let probe = user(&l, "a").await.unwrap();
    for _ in 0..30 {
        probe.record(Some(Duration::from_millis(20)));
    }
    for _ in 0..8 {
        tokio::time::advance(adaptive::DECREASE_EVERY).await;
        probe.record(Some(Duration::from_millis(500)));
    }
    let shrunk = l.tenants()[0].origin_limit;
    assert!(shrunk < 8, "limit {shrunk}");
    let mut held = vec![probe];
    while held.len() < shrunk {
        held.push(user(&l, "a").await.unwrap());
    }
    let past = waiting(&l, "a");
    tokio::task::yield_now().await;
    assert_eq!(
        fills(&l, "a"),
        (shrunk, 1),
        "free slots, but the origin is slow"
    );
    // Reported by the last fill, sent under the full limit.
    for _ in 0..20 {
        held[shrunk - 1].record(Some(Duration::from_millis(20)));
    }
    assert!(
        past.await.unwrap().is_ok(),
        "the limit's growth lets it start"
    );
    let back = l.tenants()[0].origin_limit;
    assert!(
        back > shrunk,
        "healthy fills raise it back while it is used: {back}"
    );
}

/// Only a fill sent while its origin's limit was at least half used raises it: the
/// fills a node ran before a herd came say nothing of the herd.
#[tokio::test(start_paused = true)]
async fn only_a_fill_sent_under_a_used_limit_raises_it() {
    let l = shared(64, 32, &[tenant("a", 1.0)]);
    let limit = l.tenants()[0].origin_limit;
    let early = user(&l, "a").await.unwrap();
    let mut held = Vec::new();
    while held.len() + 1 < limit {
        held.push(user(&l, "a").await.unwrap());
    }
    early.record(Some(Duration::from_millis(20)));
    assert_eq!(
        l.tenants()[0].origin_limit,
        limit,
        "sent while one fill ran"
    );
    held.last().unwrap().record(Some(Duration::from_millis(20)));
    assert_eq!(
        l.tenants()[0].origin_limit,
        limit + 1,
        "sent under the full limit: slow start"
    );
}

/// Class order: a full queue pushes out its lowest class for a higher one, and the
/// higher class is served first.
#[tokio::test(start_paused = true)]
async fn higher_classes_are_served_first_and_refused_last() {
    let mut a = tenant("a", 1.0);
    a.routes = vec![RouteConfig {
        prefix: "/api/".into(),
        methods: Vec::new(),
        class: TrafficClass::Api,
    }];
    let l = shared(1, 2, &[a]);
    assert_eq!(l.class_of(&id("a"), "GET", "/api/1"), TrafficClass::Api);
    let held = user(&l, "a").await.unwrap();
    let spawn = |class| {
        let l = l.clone();
        tokio::spawn(async move { l.acquire_user(&id("a"), class).await })
    };
    let background = spawn(TrafficClass::Background);
    let first_static = spawn(STATIC);
    tokio::task::yield_now().await;
    let api = spawn(TrafficClass::Api);
    tokio::task::yield_now().await;
    assert!(matches!(
        background.await.unwrap(),
        Err(FillError::Overloaded { .. })
    ));
    drop(held);
    let api = api.await.unwrap().unwrap();
    assert!(!first_static.is_finished(), "api went first");
    drop(api);
    assert!(first_static.await.unwrap().is_ok());
}

#[test]
fn retry_after_grows_with_the_error_and_is_jittered_and_capped() {
    assert_eq!(retry_after_secs(0.01, 0.0, 0.0, 30), 1);
    assert_eq!(retry_after_secs(1.0, 3.0, 0.0, 30), 4);
    assert_eq!(retry_after_secs(1.0, 3.0, 0.99, 30), 6);
    assert_eq!(retry_after_secs(2.0, 100.0, 0.5, 30), 30);
    let low: u32 = (0..10)
        .map(|i| retry_after_secs(1.0, 0.5, i as f64 / 10.0, 60))
        .sum();
    let high: u32 = (0..10)
        .map(|i| retry_after_secs(1.0, 8.0, i as f64 / 10.0, 60))
        .sum();
    assert!(high > low);
}

/// A pre-warm fill is its tenant's lowest class: it never borrows another tenant's
/// share (a user fill does), and an origin at its adaptive limit gets none while
/// slots are free.
#[tokio::test(start_paused = true)]
async fn a_prewarm_is_refused_first_under_pressure() {
    let l = shared(4, 8, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let a = Some(id("a"));
    let held = [
        l.acquire_prefetch(a.as_ref()).await.unwrap(),
        l.acquire_prefetch(a.as_ref()).await.unwrap(),
    ];
    assert_eq!(
        l.acquire_prefetch(a.as_ref()).await.unwrap_err(),
        FillError::NoCapacity,
        "b's share is not a's to pre-warm with"
    );
    let borrowed = user(&l, "a")
        .await
        .expect("a user fill borrows idle b's share");
    assert!(l.acquire_prefetch(Some(&id("b"))).await.is_ok());
    drop((held, borrowed));

    // A slow origin: its limit shrinks below the free slots.
    let flight = FlightConfig {
        origin_min_fills: 1,
        ..flight(16, 0, 8)
    };
    let l = FillLimiter::new(&flight, &PrefetchConfig::default());
    l.set_tenants(&[tenant("a", 1.0)]);
    let probe = user(&l, "a").await.unwrap();
    probe.record(Some(Duration::from_millis(20)));
    for _ in 0..8 {
        tokio::time::advance(adaptive::DECREASE_EVERY).await;
        probe.record(Some(Duration::from_millis(500)));
    }
    let limit = l.tenants()[0].origin_limit;
    let mut users = vec![probe];
    while users.len() < limit {
        users.push(user(&l, "a").await.unwrap());
    }
    assert!(l.free_slots() > 8, "slots are free");
    assert_eq!(
        l.acquire_prefetch(a.as_ref()).await.unwrap_err(),
        FillError::NoCapacity,
        "an origin at its limit gets no pre-warm"
    );
    drop(users.pop());
    assert!(l.acquire_prefetch(a.as_ref()).await.is_ok());
}

/// A tenant's pre-warm fill counts in its fills and at its origin (a user fill
/// then waits for the origin's limit), but is no sign of demand: the tenant's
/// unused share stays lendable.
#[tokio::test(start_paused = true)]
async fn a_prewarm_counts_in_its_tenants_fills_and_at_its_origin() {
    let l = shared(20, 8, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let prewarm = l.acquire_prefetch(Some(&id("a"))).await.unwrap();
    assert_eq!(fills(&l, "a"), (1, 0));
    let limit = l.tenants()[0].origin_limit;
    assert_eq!(limit, 10, "a new origin's slow start");
    let mut users = Vec::new();
    while users.len() + 1 < limit {
        users.push(user(&l, "a").await.unwrap());
    }
    let next = waiting(&l, "a");
    tokio::task::yield_now().await;
    assert_eq!(
        fills(&l, "a"),
        (limit, 1),
        "the pre-warm holds its origin's room"
    );
    drop(prewarm);
    let _next = next
        .await
        .unwrap()
        .expect("the pre-warm's room is free again");
    assert_eq!(fills(&l, "a"), (limit, 0));

    let l = shared(4, 8, &[tenant("a", 1.0), tenant("b", 1.0)]);
    let _b_prewarm = l.acquire_prefetch(Some(&id("b"))).await.unwrap();
    let mut a_users = Vec::new();
    for _ in 0..3 {
        a_users.push(
            user(&l, "a")
                .await
                .expect("b only pre-warms: its share is lent"),
        );
    }
    assert_eq!(fills(&l, "b"), (1, 0));
}
