//! The `pulse` binary's log lines ([`init_logging`]): to stderr, filtered by
//! `RUST_LOG`, as text (coloured only when stderr is a terminal and `NO_COLOR` is
//! unset) or as JSON lines with the fields the text shows (`timestamp`, `level`,
//! `target`, `message`, the event's fields, its spans). `--log-format` /
//! `EDGE_PULSE_LOG_FORMAT`, as on the prefetcher's binaries, whose own small copy of
//! this lives in their crate (neither crate depends on the other).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable every binary of the project reads its log format from.
pub const LOG_FORMAT_ENV: &str = "EDGE_PULSE_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal only.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber (`RUST_LOG`, else `default_filter`). Call once.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if format == LogFormat::Json {
        fmt.json().flatten_event(true).with_span_list(true).init();
    } else {
        let tty = std::io::stderr().is_terminal();
        fmt.with_ansi(tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
            .init();
    }
}
