//! [`wall_clock_ms`]: the one place pulse reads the system time (ingest's
//! [`WallClock`](crate::WallClock), model names and training stamps, the model
//! watcher's unique id all read it here).

/// Milliseconds since the Unix epoch by the system clock (0 for a clock set before
/// 1970).
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
