//! The edge caching proxy: an L1 cache in front of an origin, with single-flight
//! request collapsing, pre-warm fills and access-event publishing.
