//! One test per invariant of `flight` (the list in its module docs).

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;

fn key(path: &str) -> FlightKey {
    FlightKey::new(TenantId::new("t").unwrap(), CacheKey::new(path).unwrap())
}

#[test]
fn requests_of_different_variants_never_share_a_flight() {
    let registry = FlightRegistry::new(16);
    let url = key("/v");
    let gzip = url.with_variant(Arc::from("accept-encoding:gzip\n"));
    let br = url.with_variant(Arc::from("accept-encoding:br\n"));
    let _lead_gzip = match registry.acquire(&gzip, Priority::User) {
        Acquire::Lead(p) => p,
        _ => panic!("first gzip request leads"),
    };
    assert!(matches!(
        registry.acquire(&br, Priority::User),
        Acquire::Lead(_)
    ));
    assert!(matches!(
        registry.acquire(&url, Priority::User),
        Acquire::Lead(_)
    ));
    assert!(matches!(
        registry.acquire(&gzip, Priority::User),
        Acquire::Join(_)
    ));
    assert_eq!(gzip.primary(), url);
}

fn head() -> Head {
    Head::new(StatusCode::OK, HeaderMap::new())
}

/// A miniature of the proxy's miss path: lead and spawn a fill that "fetches" by
/// counting and sleeping, or join.
async fn get(
    registry: &FlightRegistry,
    k: &FlightKey,
    fills: Arc<AtomicUsize>,
    fetch_time: Duration,
    fail: bool,
) -> Result<Bytes, FillError> {
    let mut sub = match registry.acquire(k, Priority::User) {
        Acquire::Lead(permit) => {
            let sub = permit.subscribe();
            tokio::spawn(async move {
                fills.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(fetch_time).await;
                if fail {
                    permit.fail(FillError::Upstream(500));
                } else {
                    permit.publish_head(head());
                    permit.push_chunk(Bytes::from_static(b"hello "));
                    permit.push_chunk(Bytes::from_static(b"world"));
                    permit.complete(|| {});
                }
            });
            sub
        }
        Acquire::Join(sub) => sub,
        Acquire::Full => panic!("registry full"),
    };
    match sub.head().await {
        HeadOutcome::Head(_) => sub.collect_body().await,
        HeadOutcome::Failed(e) => Err(e),
        HeadOutcome::Bypass(_) => panic!("bypass"),
    }
}

#[tokio::test(start_paused = true)]
async fn twelve_concurrent_callers_share_one_fill() {
    let registry = FlightRegistry::new(16);
    let fills = Arc::new(AtomicUsize::new(0));
    let k = key("/a");
    let calls = (0..12).map(|_| {
        get(
            &registry,
            &k,
            fills.clone(),
            Duration::from_millis(200),
            false,
        )
    });
    let results = futures::future::join_all(calls).await;
    assert_eq!(fills.load(Ordering::SeqCst), 1);
    for r in results {
        assert_eq!(r.unwrap(), Bytes::from_static(b"hello world"));
    }
    assert!(registry.is_empty(), "the owner removed its entry");
}

#[tokio::test(start_paused = true)]
async fn errors_reach_every_waiter_and_the_next_wave_fills_afresh() {
    let registry = FlightRegistry::new(16);
    let fills = Arc::new(AtomicUsize::new(0));
    let k = key("/a");
    let wave = |fail| {
        futures::future::join_all((0..12).map(|_| {
            get(
                &registry,
                &k,
                fills.clone(),
                Duration::from_millis(50),
                fail,
            )
        }))
    };
    let results = wave(true).await;
    assert_eq!(fills.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(|r| *r == Err(FillError::Upstream(500))));
    assert!(registry.is_empty());
    let results = wave(false).await;
    assert_eq!(fills.load(Ordering::SeqCst), 2);
    assert!(results.iter().all(|r| r.is_ok()));
}

#[tokio::test(start_paused = true)]
async fn different_tenants_never_share_a_flight() {
    let registry = FlightRegistry::new(16);
    let a = FlightKey::new(TenantId::new("a").unwrap(), CacheKey::new("/x").unwrap());
    let b = FlightKey::new(TenantId::new("b").unwrap(), CacheKey::new("/x").unwrap());
    let _pa = match registry.acquire(&a, Priority::User) {
        Acquire::Lead(p) => p,
        _ => panic!("a should lead"),
    };
    assert!(matches!(
        registry.acquire(&b, Priority::User),
        Acquire::Lead(_)
    ));
    assert!(matches!(
        registry.acquire(&a, Priority::User),
        Acquire::Join(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_fill_aborts_its_waiters_and_frees_the_key() {
    let registry = FlightRegistry::new(16);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!("should lead")
    };
    let Acquire::Join(mut waiter) = registry.acquire(&k, Priority::User) else {
        panic!("should join")
    };
    let task = tokio::spawn(async move {
        let _permit = permit;
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("fill task panics");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(matches!(
        waiter.head().await,
        HeadOutcome::Failed(FillError::Aborted)
    ));
    assert!(registry.is_empty());
    assert!(matches!(
        registry.acquire(&k, Priority::User),
        Acquire::Lead(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_truncated_body_ends_in_an_error_not_a_complete_body() {
    let registry = FlightRegistry::new(16);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let Acquire::Join(mut waiter) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    permit.publish_head(head());
    permit.push_chunk(Bytes::from_static(b"half"));
    permit.fail(FillError::Truncated {
        expected: 8,
        received: 4,
    });
    assert!(matches!(waiter.head().await, HeadOutcome::Head(_)));
    assert_eq!(
        waiter.next_chunk().await.unwrap().unwrap(),
        Bytes::from_static(b"half")
    );
    assert!(matches!(
        waiter.next_chunk().await,
        Some(Err(FillError::Truncated { .. }))
    ));
}

#[tokio::test(start_paused = true)]
async fn late_joiners_replay_the_body_from_the_start() {
    let registry = FlightRegistry::new(16);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    permit.publish_head(head());
    permit.push_chunk(Bytes::from_static(b"one,"));
    let Acquire::Join(mut late) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    permit.push_chunk(Bytes::from_static(b"two"));
    permit.complete(|| {});
    assert!(matches!(late.head().await, HeadOutcome::Head(_)));
    assert_eq!(late.collect_body().await.unwrap(), "one,two");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_bounds_its_wait_on_a_hung_fill() {
    let registry = FlightRegistry::new(16);
    let k = key("/a");
    let Acquire::Lead(_permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let Acquire::Join(mut waiter) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let waited = tokio::time::timeout(Duration::from_secs(3), waiter.head()).await;
    assert!(waited.is_err(), "the hung fill never published a head");
    assert_eq!(
        registry.len(),
        1,
        "the fill itself is still bounded by its owner"
    );
}

#[tokio::test(start_paused = true)]
async fn a_user_joining_a_background_fill_promotes_it() {
    let registry = FlightRegistry::new(16);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::Background) else {
        panic!()
    };
    assert_eq!(permit.priority(), Priority::Background);
    let Acquire::Join(_) = registry.acquire(&k, Priority::Background) else {
        panic!()
    };
    assert_eq!(permit.priority(), Priority::Background);
    let promoted = tokio::spawn(async move {
        permit.promoted().await;
        permit
    });
    tokio::task::yield_now().await;
    let Acquire::Join(_) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let permit = promoted.await.unwrap();
    assert_eq!(permit.priority(), Priority::User);
    assert_eq!(permit.waiters(), 2);
}

#[tokio::test(start_paused = true)]
async fn only_the_owner_removes_its_entry_and_the_map_is_capped() {
    let registry = FlightRegistry::new(1);
    let k = key("/a");
    let Acquire::Lead(first) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    assert!(matches!(
        registry.acquire(&key("/b"), Priority::User),
        Acquire::Full
    ));
    let stale_id = first.flight.id;
    first.fail(FillError::Timeout);
    let Acquire::Lead(_second) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    registry.remove_if_owner(&k, stale_id);
    assert!(
        registry.contains(&k),
        "an old owner cannot remove a new flight"
    );
    assert!(registry.try_lead(&k, Priority::User).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_private_response_goes_to_the_leader_only() {
    let registry = FlightRegistry::new(4);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let mut leader = permit.subscribe();
    let Acquire::Join(mut waiter) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    permit.bypass(head(), Body::from("mine"));
    assert!(matches!(leader.head().await, HeadOutcome::Bypass(Some(_))));
    assert!(matches!(waiter.head().await, HeadOutcome::Bypass(None)));
    assert!(registry.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_per_user_error_reaches_its_waiters_as_the_error_only() {
    let registry = FlightRegistry::new(4);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let mut leader = permit.subscribe();
    let Acquire::Join(mut waiter) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let mut headers = HeaderMap::new();
    headers.insert(http::header::SET_COOKIE, "sid=leader".parse().unwrap());
    let head = Head::new(StatusCode::SERVICE_UNAVAILABLE, headers);
    permit.bypass_failing(head, Body::from("mine"), FillError::Upstream(503));
    let HeadOutcome::Bypass(Some((head, _))) = leader.head().await else {
        panic!("the leader gets the response")
    };
    assert!(head.headers.contains_key(http::header::SET_COOKIE));
    let HeadOutcome::Failed(error) = waiter.head().await else {
        panic!("a waiter gets the error")
    };
    assert_eq!(error, FillError::Upstream(503));
    assert_eq!(error.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(matches!(waiter.next_chunk().await, Some(Err(_))));
    assert!(registry.is_empty());
}

#[test]
fn a_varying_response_selects_only_requests_whose_fields_match_the_leaders() {
    let names: Arc<[http::HeaderName]> = Arc::from(vec![
        http::header::ACCEPT_ENCODING,
        http::header::ACCEPT_LANGUAGE,
    ]);
    let request = |lang: &str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT_LANGUAGE, lang.parse().unwrap());
        h
    };
    let en = crate::semantics::variant_of(&names, &request("en"));
    let vary = VaryMatch {
        names,
        variant: Arc::clone(&en),
    };
    // Joined under the leader's own variant, under none, or under a variant of
    // other fields (the origin's `Vary` changed meanwhile).
    assert!(
        vary.selects(Some(&en), |names| crate::semantics::variant_of(
            names,
            &request("fr")
        )),
        "same key, same fields"
    );
    assert!(vary.selects(None, |names| crate::semantics::variant_of(
        names,
        &request("en")
    )));
    assert!(!vary.selects(None, |names| crate::semantics::variant_of(
        names,
        &request("fr")
    )));
    assert!(vary.selects(Some("accept-encoding\u{1}\n"), |names| {
        crate::semantics::variant_of(names, &request("en"))
    }));
    assert!(!vary.selects(Some("accept-encoding\u{1}\n"), |names| {
        crate::semantics::variant_of(names, &request("fr"))
    }));
}

#[tokio::test(start_paused = true)]
async fn a_fill_led_for_a_client_is_abandoned_once_every_subscriber_left() {
    let registry = FlightRegistry::new(4);
    let k = key("/a");
    let Acquire::Lead(permit) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let leader = permit.subscribe();
    let Acquire::Join(waiter) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    let abandoned = permit.abandoned();
    tokio::pin!(abandoned);
    drop(leader);
    let wait = Duration::from_secs(60);
    assert!(
        tokio::time::timeout(wait, &mut abandoned).await.is_err(),
        "a waiter is left"
    );
    drop(waiter);
    tokio::time::timeout(wait, &mut abandoned)
        .await
        .expect("abandoned");
    // A request joining now sees the fill dropped before any byte: it may lead.
    let Acquire::Join(mut late) = registry.acquire(&k, Priority::User) else {
        panic!()
    };
    drop(permit);
    assert!(matches!(
        late.head().await,
        HeadOutcome::Failed(FillError::Aborted)
    ));

    // A fill no client led (a refresh, a pre-warm) is never abandoned.
    let Some(refresh) = registry.try_lead(&key("/b"), Priority::Background) else {
        panic!()
    };
    let abandoned = refresh.abandoned();
    assert!(tokio::time::timeout(wait, abandoned).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_windowed_stream_waits_for_its_slowest_reader_and_admits_no_one_once_it_drops() {
    let registry = FlightRegistry::new(16);
    let k = key("/big");
    let permit = Arc::new(match registry.acquire(&k, Priority::User) {
        Acquire::Lead(p) => p,
        _ => panic!("leads"),
    });
    let mut fast = permit.subscribe();
    let mut slow = match registry.acquire(&k, Priority::User) {
        Acquire::Join(s) => s,
        _ => panic!("joins"),
    };
    permit.publish_head(head());
    permit.share_window(8);
    let patience = Duration::from_secs(1);
    for chunk in [&b"0123"[..], b"4567"] {
        permit.send_chunk(Bytes::from_static(chunk), patience).await;
        assert_eq!(fast.next_chunk().await, Some(Ok(Bytes::from_static(chunk))));
    }
    assert!(
        matches!(registry.acquire(&k, Priority::User), Acquire::Join(_)),
        "nothing dropped yet: still joinable"
    );
    // No room until `slow` reads: the fill waits for it, and goes on when it does.
    let sending = tokio::spawn({
        let permit = Arc::clone(&permit);
        async move {
            permit
                .send_chunk(Bytes::from_static(b"89ab"), patience)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!sending.is_finished(), "waits for the slowest reader");
    assert!(matches!(slow.head().await, HeadOutcome::Head(_)));
    assert_eq!(
        slow.next_chunk().await,
        Some(Ok(Bytes::from_static(b"0123")))
    );
    sending.await.unwrap();
    assert!(
        matches!(registry.acquire(&k, Priority::User), Acquire::Lead(_)),
        "its start is gone: no one joins"
    );
    // `slow` stops reading: after the patience it is left behind (with an error
    // when it reads on), and no longer waited for.
    let started = tokio::time::Instant::now();
    permit
        .send_chunk(Bytes::from_static(b"cdef"), patience)
        .await;
    assert!(started.elapsed() >= patience);
    for chunk in [&b"89ab"[..], b"cdef"] {
        assert_eq!(fast.next_chunk().await, Some(Ok(Bytes::from_static(chunk))));
    }
    let started = tokio::time::Instant::now();
    permit
        .send_chunk(Bytes::from_static(b"ghij"), patience)
        .await;
    assert!(started.elapsed() < patience, "only `fast` is waited for");
    assert_eq!(
        fast.next_chunk().await,
        Some(Ok(Bytes::from_static(b"ghij")))
    );
    let permit = Arc::into_inner(permit).unwrap();
    permit.complete(|| {});
    assert_eq!(fast.next_chunk().await, None);
    assert_eq!(
        slow.next_chunk().await,
        Some(Err(FillError::TooLarge(8))),
        "fell behind the window: an error, never a gap"
    );
}
