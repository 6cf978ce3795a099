//! The process's own log lines, as the `prefetcher` and `edge-agent` binaries write
//! them ([`init_logging`]): to stderr, filtered by `RUST_LOG`, as text or as JSON
//! lines ([`LogEncoding`], `--log-format` / `EDGE_PULSE_LOG_FORMAT`).
//!
//! Text is coloured only when stderr is a terminal (and `NO_COLOR` is unset), so a
//! log written to a file or a pipe carries no escape codes. JSON is one object per
//! line with the fields the text shows: `timestamp`, `level`, `target`, `message`,
//! the event's own fields beside them, and the spans it happened in.
//!
//! Pulse has its own copy of this small function (the crates do not depend on each
//! other, and `models` carries no logging): the two must stay alike.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable every binary of the project reads its log format from (the
/// `--log-format` flag wins over it).
pub const LOG_FORMAT_ENV: &str = "EDGE_PULSE_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogEncoding {
    /// Human-readable lines, coloured on a terminal only.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields.
    Json,
}

/// Installs the global subscriber: `encoding` to stderr, `RUST_LOG` as the filter
/// (else `default_filter`). Call once, first thing in `main`.
pub fn init_logging(encoding: LogEncoding, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match encoding {
        LogEncoding::Text => builder.with_ansi(colour()).init(),
        LogEncoding::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// Colour only for a person at a terminal who has not asked for none.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
