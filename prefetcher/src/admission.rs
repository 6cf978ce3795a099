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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{ConnectionLimits, IpNetwork};
use crate::metrics::ClientCounters;
use crate::status::ClientLimit;

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
    counters: ClientCounters,
    addresses: Mutex<HashMap<AddressKey, Tracked>>,
    epoch: Instant,
}

/// One client address in the table.
struct Tracked {
    connections: usize,
    bucket: Arc<Bucket>,
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
        let mut max_connections = limits.max_connections;
        if let Some(files) = open_file_limit() {
            // Origin connections, the listeners, Kafka and files need descriptors too.
            let budget = files.saturating_sub((files / 8).max(256)).max(1);
            if budget < max_connections {
                tracing::warn!(
                    configured = max_connections,
                    open_file_limit = files,
                    using = budget,
                    "server.max_connections lowered to fit the open-file limit (raise ulimit -n)"
                );
                max_connections = budget;
            }
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
                counters,
                addresses: Mutex::new(HashMap::new()),
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
        ConnectionLimiter::new(&limits, ClientCounters::default())
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

    /// Admits a new connection from `ip`, or refuses it (counted).
    pub(crate) fn admit(&self, ip: IpAddr) -> Result<ConnectionSlot, Refused> {
        let inner = &self.inner;
        if inner.counters.open.inc() >= inner.max_connections {
            inner.counters.open.dec();
            inner.counters.count(ClientLimit::MaxConnections);
            return Err(ClientLimit::MaxConnections);
        }
        let per_address = inner.limits.max_connections_per_address;
        let tracked = (per_address > 0 || inner.rate.is_some())
            && !inner.exempt.iter().any(|n| n.contains(ip));
        if !tracked {
            return Ok(ConnectionSlot {
                limiter: Arc::clone(inner),
                address: None,
            });
        }
        let key = address_key(ip);
        let now = inner.now();
        let mut table = lock(&inner.addresses);
        if !table.contains_key(&key) && table.len() >= inner.limits.max_tracked_addresses {
            make_room(&mut table, now, inner.limits.max_tracked_addresses);
        }
        let entry = table.entry(key).or_insert_with(|| Tracked {
            connections: 0,
            bucket: Arc::default(),
        });
        if per_address > 0 && entry.connections >= per_address {
            drop(table);
            inner.counters.open.dec();
            inner.counters.count(ClientLimit::AddressConnections);
            return Err(ClientLimit::AddressConnections);
        }
        entry.connections += 1;
        let bucket = Arc::clone(&entry.bucket);
        inner.counters.addresses.set(table.len() as i64);
        Ok(ConnectionSlot {
            limiter: Arc::clone(inner),
            address: Some((key, bucket)),
        })
    }
}

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
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let inner = &self.limiter;
        inner.counters.open.dec();
        let Some((key, _)) = &self.address else {
            return;
        };
        let now = inner.now();
        let mut table = lock(&inner.addresses);
        if let Some(entry) = table.get_mut(key) {
            entry.connections = entry.connections.saturating_sub(1);
            if entry.connections == 0 && entry.bucket.is_full(now) {
                table.remove(key);
            }
        }
        inner.counters.addresses.set(table.len() as i64);
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

    fn limiter(f: impl FnOnce(&mut ConnectionLimits)) -> ConnectionLimiter {
        let mut limits = ConnectionLimits::default();
        f(&mut limits);
        limits.validate().unwrap();
        ConnectionLimiter::new(&limits, ClientCounters::default())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_node_wide_count_never_passes_max_connections_and_slots_give_back() {
        let l = limiter(|l| {
            l.max_connections = 3;
            l.max_connections_per_address = 0;
        });
        let slots: Vec<_> = (0..3)
            .map(|i| l.admit(ip(&format!("10.0.0.{i}"))))
            .collect();
        assert!(slots.iter().all(Result::is_ok));
        assert_eq!(
            l.admit(ip("10.0.0.9")).err(),
            Some(ClientLimit::MaxConnections)
        );
        assert_eq!(l.open(), 3);
        drop(slots);
        assert_eq!(l.open(), 0);
        assert!(l.admit(ip("10.0.0.9")).is_ok());
        assert_eq!(l.inner.counters.get(ClientLimit::MaxConnections), 1);
    }

    #[test]
    fn an_address_count_never_passes_its_limit_exempt_and_ipv6_slash_64_alike() {
        let l = limiter(|l| {
            l.max_connections_per_address = 2;
            l.exempt = vec!["192.0.2.0/24".into()];
        });
        let a: Vec<_> = (0..2).map(|_| l.admit(ip("10.0.0.1")).unwrap()).collect();
        assert_eq!(
            l.admit(ip("10.0.0.1")).err(),
            Some(ClientLimit::AddressConnections)
        );
        // The same address mapped into IPv6 is the same client.
        assert!(l.admit(ip("::ffff:10.0.0.1")).is_err());
        assert!(l.admit(ip("10.0.0.2")).is_ok(), "another address is served");
        let exempt: Vec<_> = (0..5).map(|_| l.admit(ip("192.0.2.7"))).collect();
        assert!(
            exempt.iter().all(Result::is_ok),
            "exempt addresses are not counted"
        );
        // One /64 is one client.
        let _v6: Vec<_> = (1..=2)
            .map(|i| l.admit(ip(&format!("2001:db8::{i}"))).unwrap())
            .collect();
        assert!(l.admit(ip("2001:db8::ffff")).is_err());
        assert!(l.admit(ip("2001:db8:0:1::1")).is_ok());
        drop(a);
        assert!(l.admit(ip("10.0.0.1")).is_ok(), "given back on drop");
    }

    #[test]
    fn the_rate_allows_the_burst_then_refuses_with_a_wait_and_survives_reconnects() {
        let l = limiter(|l| {
            l.requests_per_second_per_address = 0.5;
            l.request_burst_per_address = 3;
        });
        let slot = l.admit(ip("10.0.0.1")).unwrap();
        for _ in 0..3 {
            slot.check_rate().unwrap();
        }
        let wait = slot.check_rate().unwrap_err();
        assert!(wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2));
        // A new connection from the same address finds the bucket empty.
        drop(slot);
        let again = l.admit(ip("10.0.0.1")).unwrap();
        assert!(again.check_rate().is_err());
        // Another address has its own bucket.
        assert!(l.admit(ip("10.0.0.2")).unwrap().check_rate().is_ok());
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
            .map(|i| l.admit(ip(&format!("10.0.0.{i}"))).unwrap())
            .collect();
        // Addresses that made a request and left keep their (empty) bucket ...
        for i in 10..200 {
            let slot = l.admit(ip(&format!("10.0.1.{i}"))).unwrap();
            slot.check_rate().unwrap();
            assert!(lock(&l.inner.addresses).len() <= 8);
        }
        // ... but never at the cost of an address with an open connection.
        for i in 0..4 {
            assert_eq!(
                l.admit(ip(&format!("10.0.0.{i}"))).err(),
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
