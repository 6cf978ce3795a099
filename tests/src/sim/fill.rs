//! One fill in flight at one tier, the requests waiting on it, and its limiter slot.

use std::future::Future;
use std::pin::Pin;

use models::TenantId;
use prefetcher::{FillError, FillLimiter, FillPermit, FillSlot, TrafficClass};

/// A group of identical client requests (same node, key and tick).
#[derive(Debug, Clone, Copy)]
pub(super) struct Client {
    /// Requests in the group.
    pub count: f64,
    /// When the group's first attempt arrived (latency counts from there).
    pub first_ms: u64,
    /// Attempts so far after the first.
    pub attempt: u8,
    /// Node and key, set when the request reaches its node.
    pub target: Option<(u32, u32)>,
}

impl Client {
    pub(super) fn new(count: f64, now: u64) -> Client {
        Client {
            count,
            first_ms: now,
            attempt: 0,
            target: None,
        }
    }
}

/// Who waits on a fill: clients at an edge node, or a node's fill at its shield.
pub(super) enum Requester {
    Client(Client),
    Fill(usize),
}

type SlotFuture = Pin<Box<dyn Future<Output = Result<FillSlot, FillError>>>>;

/// Where a fill stands with its tier's limiter.
pub(super) enum Slot {
    /// Waiting in the production limiter's queue (polled every tick).
    Waiting(SlotFuture),
    /// Holding a slot since the given virtual ms.
    Held(FillSlot, u64),
    /// No slot (refused, or released).
    Free,
}

impl Slot {
    /// A request for a user slot in `tenant`'s share, or a prefetch slot from spare
    /// capacity.
    /// Each is polled outside tokio's cooperative budget: the engine polls every
    /// waiting slot of the fleet in one task, and a budget of 128 per task poll would
    /// leave the rest pending (a granted slot untaken, a queue deadline unseen) until
    /// a later tick.
    pub(super) fn waiting(limiter: FillLimiter, prefetch: bool, tenant: TenantId) -> Slot {
        Slot::Waiting(if prefetch {
            Box::pin(tokio::task::unconstrained(async move {
                limiter.acquire_prefetch(Some(&tenant)).await
            }))
        } else {
            Box::pin(tokio::task::unconstrained(async move {
                limiter.acquire_user(&tenant, TrafficClass::Static).await
            }))
        })
    }
}

/// A fill led at one tier.
pub(super) struct Fill {
    pub tier: usize,
    pub key: u32,
    /// The production registry's leadership; taken when the fill ends.
    pub permit: Option<FillPermit>,
    pub slot: Slot,
    /// A pre-warm fill (background class).
    pub prefetch: bool,
    /// A pre-warm caused it (here or at a node below): its origin bytes are pre-warm bytes.
    pub prefetch_cause: bool,
    /// Requests it stands for at the origin (sampled tail keys stand for several).
    pub weight: f64,
    pub clients: Vec<Client>,
    pub downstream: Vec<usize>,
}

impl Fill {
    pub(super) fn new(
        tier: usize,
        key: u32,
        permit: FillPermit,
        prefetch: bool,
        prefetch_cause: bool,
        weight: f64,
    ) -> Fill {
        Fill {
            tier,
            key,
            permit: Some(permit),
            slot: Slot::Free,
            prefetch,
            prefetch_cause: prefetch_cause || prefetch,
            weight,
            clients: Vec::new(),
            downstream: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, who: Requester) {
        match who {
            Requester::Client(c) => self.clients.push(c),
            Requester::Fill(id) => self.downstream.push(id),
        }
    }
}
