//! Admission of client connections and requests: how many connections the node holds
//! (every proxy listener together), how many one client address holds, and how fast
//! one address may send requests.
//!
//! Invariants:
//! - A [`ConnectionSlot`] exists for every admitted connection and gives back what it
//!   took (the node-wide count, its address's count) when dropped, whatever ends the
//!   connection.
//! - The node-wide count never passes `max_connections`; an address's count never
//!   passes `max_connections_per_address` (exempt addresses are not counted).
//! - The address table holds at most `max_tracked_addresses` entries, and an entry
//!   with open connections is never evicted (`max_tracked_addresses >=
//!   max_connections`, checked by the configuration).
//! - The request rate of an address is a GCRA token bucket in one atomic: a request
//!   takes no lock, and reconnecting does not refill the bucket (an entry without
//!   connections stays until its bucket is full again, unless the table needs room).
//!
//! The table's `Mutex` is taken once when a connection opens and once when it
//! closes, never per request; a `std` mutex, as the critical sections never await.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::activity::{ABORT, Activity};
use crate::config::{ConnectionLimits, IpNetwork};
use crate::metrics::ClientCounters;
use crate::status::ClientLimit;

/// A connection that had not sent a complete request head when it was admitted, in
/// admission order: the candidates for eviction.
struct Unproven {
    accepted: Instant,
    activity: Weak<Activity>,
}

/// Connections admitted, oldest first, that may still be unproven. Entries that
/// are proven, closing or gone are dropped from the front as new ones arrive, so the
/// queue holds about the connections of the last header timeout.
#[derive(Default)]
struct UnprovenQueue(VecDeque<Unproven>);

impl UnprovenQueue {
    fn push(&mut self, accepted: Instant, activity: &Arc<Activity>) {
        self.prune();
        self.0.push_back(Unproven {
            accepted,
            activity: Arc::downgrade(activity),
        });
    }

    fn prune(&mut self) {
        while self
            .0
            .front()
            .is_some_and(|u| u.activity.upgrade().is_none_or(|a| a.proven_or_closing()))
        {
            self.0.pop_front();
        }
    }

    /// The oldest unproven connection, if it was admitted at least `after` before
    /// `now`.
    fn oldest(&mut self, now: Instant, after: Duration) -> Option<Arc<Activity>> {
        self.prune();
        let front = self.0.front()?;
        if now.saturating_duration_since(front.accepted) < after {
            return None;
        }
        front.activity.upgrade()
    }
}

/// Node-wide and per-address admission of client connections. Cheap to clone.
#[derive(Clone)]
pub struct ConnectionLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ConnectionLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionLimiter")
            .field("max_connections", &self.inner.max_connections)
            .field("open", &self.inner.counters.open.get())
            .finish_non_exhaustive()
    }
}

struct Inner {
    limits: ConnectionLimits,
    /// `limits.max_connections`, lowered to what the open-file limit allows.
    max_connections: i64,
    /// GCRA emission interval and tolerance in nanoseconds, when a rate is set.
    rate: Option<Gcra>,
    exempt: Vec<IpNetwork>,
    /// How long a connection must have been unproven before it may be evicted.
    evictable_after: Duration,
    counters: ClientCounters,
    table: Mutex<Table>,
    epoch: Instant,
}

/// What admission keeps, behind one lock taken per connection open and close.
#[derive(Default)]
struct Table {
    addresses: HashMap<AddressKey, Tracked>,
    /// Every admitted connection that may be unproven.
    unproven: UnprovenQueue,
}

/// One client address in the table.
struct Tracked {
    connections: usize,
    bucket: Arc<Bucket>,
    /// The fills its connections lead (`fills`).
    fills: Arc<AtomicUsize>,
    /// The address's connections that may be unproven.
    unproven: UnprovenQueue,
}

/// A client address as the limits see it: an IPv4 address, or an IPv6 /64 (one
/// subscriber's usual allocation, so rotating addresses inside it does not help).
type AddressKey = u128;

fn address_key(ip: IpAddr) -> AddressKey {
    match ip {
        IpAddr::V4(v4) => 0xffff_0000_0000 | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => address_key(IpAddr::V4(v4)),
            None => u128::from(v6) & !u128::from(u64::MAX),
        },
    }
}

#[derive(Debug, Clone, Copy)]
struct Gcra {
    /// Nanoseconds between two requests at the sustained rate.
    interval: u64,
    /// How far ahead of now the theoretical arrival time may run: the burst.
    tolerance: u64,
}

/// One address's request bucket: the GCRA theoretical arrival time, in nanoseconds
/// since the limiter's epoch.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    tat: AtomicU64,
}

impl Bucket {
    /// Takes one request at `now`, or says how long until one would be allowed.
    fn take(&self, now: u64, gcra: Gcra) -> Result<(), Duration> {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            if start - now > gcra.tolerance {
                return Err(Duration::from_nanos(start - now - gcra.tolerance));
            }
            match self.tat.compare_exchange_weak(
                tat,
                start + gcra.interval,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }

    /// Whether the bucket is full again at `now` (forgetting it loses nothing).
    fn is_full(&self, now: u64) -> bool {
        self.tat.load(Ordering::Relaxed) <= now
    }
}

/// Why a connection was refused: the limit, already counted.
pub(crate) type Refused = ClientLimit;

impl ConnectionLimiter {
    /// A limiter for `limits` (already validated), counting into `counters`.
    pub(crate) fn new(limits: &ConnectionLimits, counters: ClientCounters) -> ConnectionLimiter {
        Self::fitted(limits, counters, true)
    }

    /// [`Self::new`]; `configured` says whether `limits.max_connections` is the
    /// operator's (lowering it is then worth a warning) or a stand-in for "none".
    fn fitted(
        limits: &ConnectionLimits,
        counters: ClientCounters,
        configured: bool,
    ) -> ConnectionLimiter {
        let mut max_connections = limits.max_connections;
        if let Some(files) = open_file_limit() {
            // Origin connections, the listeners, Kafka and files need descriptors too.
            let budget = files.saturating_sub((files / 8).max(256)).max(1);
            if budget < max_connections && configured {
                tracing::warn!(
                    configured = max_connections,
                    open_file_limit = files,
                    using = budget,
                    "server.max_connections lowered to fit the open-file limit (raise ulimit -n)"
                );
            }
            max_connections = max_connections.min(budget);
        }
        let rate = (limits.requests_per_second_per_address > 0.0).then(|| {
            let interval = (1e9 / limits.requests_per_second_per_address).max(1.0) as u64;
            Gcra {
                interval,
                tolerance: interval
                    .saturating_mul(u64::from(limits.request_burst_per_address.max(1)) - 1),
            }
        });
        ConnectionLimiter {
            inner: Arc::new(Inner {
                max_connections: i64::try_from(max_connections).unwrap_or(i64::MAX),
                rate,
                exempt: limits
                    .exempt
                    .iter()
                    .filter_map(|n| IpNetwork::parse(n).ok())
                    .collect(),
                evictable_after: EVICTABLE_AFTER
                    .min(Duration::from_millis(limits.header_timeout_ms) / 2),
                counters,
                table: Mutex::new(Table::default()),
                epoch: Instant::now(),
                limits: limits.clone(),
            }),
        }
    }

    /// A limiter with the default timeouts and no connection or rate limits, for
    /// listeners that are not the proxy's (the admin listener, test origins).
    pub(crate) fn unlimited() -> ConnectionLimiter {
        let limits = ConnectionLimits {
            max_connections: 10_000_000,
            max_connections_per_address: 0,
            requests_per_second_per_address: 0.0,
            max_tracked_addresses: 10_000_000,
            ..ConnectionLimits::default()
        };
        // Nobody configured these: fitting them to the open-file limit is no news.
        ConnectionLimiter::fitted(&limits, ClientCounters::default(), false)
    }

    /// The limits in force (as configured; see [`Self::max_connections`]).
    pub(crate) fn limits(&self) -> &ConnectionLimits {
        &self.inner.limits
    }

    /// The node-wide connection limit in force.
    pub fn max_connections(&self) -> usize {
        usize::try_from(self.inner.max_connections).unwrap_or(usize::MAX)
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        usize::try_from(self.inner.counters.open.get()).unwrap_or(0)
    }

    /// The counters limits are counted in.
    pub(crate) fn counters(&self) -> ClientCounters {
        self.inner.counters.clone()
    }

    /// Counts one limit that acted.
    pub(crate) fn count(&self, limit: ClientLimit) {
        self.inner.counters.count(limit);
    }

    /// Admits a new connection from `ip` whose activity is `activity`, or refuses it
    /// (counted). At a limit, the oldest connection (of the node, or of the address)
    /// that has been *unproven* (no complete request head) for a while is told to
    /// drop instead, and the new one is admitted: a slow-header client gives way to
    /// one that sends its request. Until the evicted connection is gone, the count
    /// may pass its limit by the connections so told.
    pub(crate) fn admit(
        &self,
        ip: IpAddr,
        activity: &Arc<Activity>,
    ) -> Result<ConnectionSlot, Refused> {
        self.admit_at(ip, activity, Instant::now())
    }

    fn admit_at(
        &self,
        ip: IpAddr,
        activity: &Arc<Activity>,
        now: Instant,
    ) -> Result<ConnectionSlot, Refused> {
        let inner = &self.inner;
        let per_address = inner.limits.max_connections_per_address;
        let tracked =
            (per_address > 0 || inner.rate.is_some() || inner.limits.max_fills_per_address > 0)
                && !inner.exempt.iter().any(|n| n.contains(ip));
        let key = address_key(ip);
        let mut table = lock(&inner.table);
        let table = &mut *table;
        if tracked
            && !table.addresses.contains_key(&key)
            && table.addresses.len() >= inner.limits.max_tracked_addresses
        {
            make_room(
                &mut table.addresses,
                inner.now(),
                inner.limits.max_tracked_addresses,
            );
        }
        let mut entry = tracked.then(|| {
            table.addresses.entry(key).or_insert_with(|| Tracked {
                connections: 0,
                bucket: Arc::default(),
                fills: Arc::default(),
                unproven: UnprovenQueue::default(),
            })
        });
        // Decide first, evict after: a refusal evicts nothing.
        let mut victim = None;
        if let Some(entry) = &mut entry
            && per_address > 0
            && entry.connections >= per_address
        {
            match entry.unproven.oldest(now, inner.evictable_after) {
                Some(v) => victim = Some(v),
                None => {
                    inner.counters.count(ClientLimit::AddressConnections);
                    return Err(ClientLimit::AddressConnections);
                }
            }
        }
        // An address's victim frees a node-wide slot too.
        if victim.is_none() && inner.counters.open.get() >= inner.max_connections {
            match table.unproven.oldest(now, inner.evictable_after) {
                Some(v) => victim = Some(v),
                None => {
                    inner.counters.count(ClientLimit::MaxConnections);
                    return Err(ClientLimit::MaxConnections);
                }
            }
        }
        if let Some(victim) = victim {
            victim.tell(ABORT);
            inner.counters.count(ClientLimit::Evicted);
        }
        inner.counters.open.inc();
        table.unproven.push(now, activity);
        let mut fills = None;
        let address = entry.map(|entry| {
            entry.connections += 1;
            entry.unproven.push(now, activity);
            fills = Some(Arc::clone(&entry.fills));
            (key, Arc::clone(&entry.bucket))
        });
        inner.counters.addresses.set(table.addresses.len() as i64);
        Ok(ConnectionSlot {
            limiter: Arc::clone(inner),
            address,
            fills,
        })
    }
}

/// How long a connection must have been unproven before a newcomer may evict it (or
/// half the header timeout, if shorter): a client on a slow link gets this long to
/// send its request head before it can lose its place.
const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

impl Inner {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Frees table entries for a new address: first those without connections whose
/// bucket is full again (forgetting them loses nothing), then, if that is not enough,
/// an eighth of the table's entries without connections (their rate state is lost;
/// rare, and it batches the work). Entries with connections always stay.
fn make_room(table: &mut HashMap<AddressKey, Tracked>, now: u64, max: usize) {
    table.retain(|_, t| t.connections > 0 || !t.bucket.is_full(now));
    if table.len() < max {
        return;
    }
    let mut evict = (max / 8).max(1);
    table.retain(|_, t| {
        if evict > 0 && t.connections == 0 {
            evict -= 1;
            false
        } else {
            true
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An admitted connection: what it holds of the limits, given back on drop.
pub(crate) struct ConnectionSlot {
    limiter: Arc<Inner>,
    /// The address's table key and bucket; `None` when the address is exempt or no
    /// per-address limit is on.
    address: Option<(AddressKey, Arc<Bucket>)>,
    /// The fills the address's connections lead (`None` as for `address`).
    fills: Option<Arc<AtomicUsize>>,
}

impl ConnectionSlot {
    /// Takes one request from the address's rate; `Err` (counted) with how long until
    /// the next would be allowed. Lock-free; reads the clock only with a rate on.
    pub(crate) fn check_rate(&self) -> Result<(), Duration> {
        let inner = &self.limiter;
        let (Some(gcra), Some((_, bucket))) = (inner.rate, &self.address) else {
            return Ok(());
        };
        bucket.take(inner.now(), gcra).inspect_err(|_| {
            inner.counters.count(ClientLimit::AddressRate);
        })
    }

    /// The node-wide counters.
    pub(crate) fn counters(&self) -> &ClientCounters {
        &self.limiter.counters
    }

    /// The fills the connections of this address lead, shared by them (`None` when
    /// the address is exempt).
    pub(crate) fn address_fills(&self) -> Option<Arc<AtomicUsize>> {
        self.fills.clone()
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let inner = &self.limiter;
        inner.counters.open.dec();
        let Some((key, _)) = &self.address else {
            return;
        };
        let now = inner.now();
        let mut table = lock(&inner.table);
        if let Some(entry) = table.addresses.get_mut(key) {
            entry.connections = entry.connections.saturating_sub(1);
            if entry.connections == 0 && entry.bucket.is_full(now) {
                table.addresses.remove(key);
            }
        }
        inner.counters.addresses.set(table.addresses.len() as i64);
    }
}

/// The soft limit on open files, where the platform tells (Linux: /proc).
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&limits)
}

fn parse_open_file_limit(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::activity::RUN;

    fn limiter(f: impl FnOnce(&mut ConnectionLimits)) -> ConnectionLimiter {
        let mut limits = ConnectionLimits::default();
        f(&mut limits);
        limits.validate().unwrap();
        ConnectionLimiter::new(&limits, ClientCounters::default())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A connection as the listener admits it: its slot and its activity.
    struct Conn {
        slot: ConnectionSlot,
        activity: Arc<Activity>,
    }

    impl Conn {
        fn prove(&self) {
            Activity::bump(&self.activity.started);
        }

        fn told(&self) -> u8 {
            self.activity.signal.load(Ordering::Acquire)
        }
    }

    fn admit(l: &ConnectionLimiter, from: &str) -> Result<Conn, ClientLimit> {
        admit_at(l, from, Instant::now())
    }

    fn admit_at(l: &ConnectionLimiter, from: &str, now: Instant) -> Result<Conn, ClientLimit> {
        let activity = Arc::new(Activity::default());
        let slot = l.admit_at(ip(from), &activity, now)?;
        Ok(Conn { slot, activity })
    }

    #[test]
    fn the_node_wide_count_never_passes_max_connections_and_slots_give_back() {
        let l = limiter(|l| {
            l.max_connections = 3;
            l.max_connections_per_address = 0;
        });
        let conns: Vec<_> = (0..3)
            .map(|i| admit(&l, &format!("10.0.0.{i}")).unwrap())
            .collect();
        assert_eq!(
            admit(&l, "10.0.0.9").err(),
            Some(ClientLimit::MaxConnections)
        );
        assert_eq!(l.open(), 3);
        drop(conns);
        assert_eq!(l.open(), 0);
        assert!(admit(&l, "10.0.0.9").is_ok());
        assert_eq!(l.inner.counters.get(ClientLimit::MaxConnections), 1);
    }

    #[test]
    fn an_address_count_never_passes_its_limit_exempt_and_ipv6_slash_64_alike() {
        let l = limiter(|l| {
            l.max_connections_per_address = 2;
            l.exempt = vec!["192.0.2.0/24".into()];
        });
        let a: Vec<_> = (0..2).map(|_| admit(&l, "10.0.0.1").unwrap()).collect();
        assert_eq!(
            admit(&l, "10.0.0.1").err(),
            Some(ClientLimit::AddressConnections)
        );
        // The same address mapped into IPv6 is the same client.
        assert!(admit(&l, "::ffff:10.0.0.1").is_err());
        assert!(admit(&l, "10.0.0.2").is_ok(), "another address is served");
        let exempt: Vec<_> = (0..5).map(|_| admit(&l, "192.0.2.7")).collect();
        assert!(
            exempt.iter().all(Result::is_ok),
            "exempt addresses are not counted"
        );
        // One /64 is one client.
        let _v6: Vec<_> = (1..=2)
            .map(|i| admit(&l, &format!("2001:db8::{i}")).unwrap())
            .collect();
        assert!(admit(&l, "2001:db8::ffff").is_err());
        assert!(admit(&l, "2001:db8:0:1::1").is_ok());
        drop(a);
        assert!(admit(&l, "10.0.0.1").is_ok(), "given back on drop");
    }

    #[test]
    fn at_a_limit_the_oldest_unproven_connection_gives_way_and_a_proven_one_never() {
        let l = limiter(|l| {
            l.max_connections = 4;
            l.max_connections_per_address = 2;
        });
        let t0 = Instant::now();
        let half = t0 + EVICTABLE_AFTER / 2;
        // An address at its limit with two unproven connections, the older first.
        let old = admit_at(&l, "10.0.0.1", t0).unwrap();
        let young = admit_at(&l, "10.0.0.1", half).unwrap();
        // Not unproven for long enough to give way: refused.
        assert_eq!(
            admit_at(&l, "10.0.0.1", half).err(),
            Some(ClientLimit::AddressConnections)
        );
        assert_eq!((old.told(), young.told()), (RUN, RUN));
        // Long enough: the oldest is told to drop, the newcomer admitted.
        let newcomer = admit_at(&l, "10.0.0.1", t0 + EVICTABLE_AFTER).unwrap();
        assert_eq!((old.told(), young.told()), (ABORT, RUN));
        assert_eq!(l.inner.counters.get(ClientLimit::Evicted), 1);
        // Proven connections never give way.
        young.prove();
        newcomer.prove();
        drop(old);
        assert_eq!(
            admit_at(&l, "10.0.0.1", t0 + 10 * EVICTABLE_AFTER).err(),
            Some(ClientLimit::AddressConnections)
        );
        // The node-wide limit evicts the same way, across addresses.
        let other = admit_at(&l, "10.0.0.2", t0).unwrap();
        let _third = admit_at(&l, "10.0.0.3", t0).unwrap();
        let late = t0 + 10 * EVICTABLE_AFTER;
        let _fourth = admit_at(&l, "10.0.0.4", late).unwrap();
        assert_eq!(other.told(), ABORT, "the node's oldest unproven connection");
        assert_eq!(l.inner.counters.get(ClientLimit::Evicted), 2);
        drop(other);
        let _ = &newcomer.slot;
    }

    #[test]
    fn the_unproven_queue_forgets_proven_and_closed_connections() {
        let l = limiter(|l| l.max_connections_per_address = 0);
        let mut kept = Vec::new();
        for i in 0..1000 {
            let conn = admit(&l, "10.0.0.1").unwrap();
            conn.prove();
            if i % 2 == 0 {
                kept.push(conn);
            }
        }
        assert!(
            lock(&l.inner.table).unproven.0.len() <= 1,
            "pruned as they come"
        );
    }

    #[test]
    fn the_rate_allows_the_burst_then_refuses_with_a_wait_and_survives_reconnects() {
        let l = limiter(|l| {
            l.requests_per_second_per_address = 0.5;
            l.request_burst_per_address = 3;
        });
        let conn = admit(&l, "10.0.0.1").unwrap();
        for _ in 0..3 {
            conn.slot.check_rate().unwrap();
        }
        let wait = conn.slot.check_rate().unwrap_err();
        assert!(wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2));
        // A new connection from the same address finds the bucket empty.
        drop(conn);
        let again = admit(&l, "10.0.0.1").unwrap();
        assert!(again.slot.check_rate().is_err());
        // Another address has its own bucket.
        assert!(admit(&l, "10.0.0.2").unwrap().slot.check_rate().is_ok());
        assert_eq!(l.inner.counters.get(ClientLimit::AddressRate), 2);
    }

    #[test]
    fn gcra_refills_at_the_rate() {
        let gcra = Gcra {
            interval: 100,
            tolerance: 100,
        };
        let b = Bucket::default();
        assert!(b.take(1_000, gcra).is_ok());
        assert!(b.take(1_000, gcra).is_ok());
        assert_eq!(b.take(1_000, gcra), Err(Duration::from_nanos(100)));
        assert!(b.take(1_100, gcra).is_ok());
        assert!(b.is_full(1_300) && !b.is_full(1_299));
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_entries_with_connections() {
        let l = limiter(|l| {
            l.max_connections = 8;
            l.max_connections_per_address = 1;
            l.max_tracked_addresses = 8;
            l.requests_per_second_per_address = 0.001;
            l.request_burst_per_address = 1;
        });
        let held: Vec<_> = (0..4)
            .map(|i| {
                let conn = admit(&l, &format!("10.0.0.{i}")).unwrap();
                conn.prove();
                conn
            })
            .collect();
        // Addresses that made a request and left keep their (empty) bucket ...
        for i in 10..200 {
            let conn = admit(&l, &format!("10.0.1.{i}")).unwrap();
            conn.slot.check_rate().unwrap();
            assert!(lock(&l.inner.table).addresses.len() <= 8);
        }
        // ... but never at the cost of an address with an open connection.
        for i in 0..4 {
            assert_eq!(
                admit(&l, &format!("10.0.0.{i}")).err(),
                Some(ClientLimit::AddressConnections)
            );
        }
        drop(held);
    }

    #[test]
    fn the_open_file_limit_is_read_from_proc() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max open files            20000                40000                files\n";
        assert_eq!(parse_open_file_limit(text), Some(20000));
        assert_eq!(parse_open_file_limit("nothing"), None);
    }
}
