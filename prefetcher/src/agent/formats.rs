//! Access-log lines of nginx and Varnish, and what each cache status means to pulse.
//!
//! Both shipped log formats (`prefetcher/deploy/nginx/edge.conf`,
//! `prefetcher/deploy/varnish/varnishncsa.format`) write one JSON object per line
//! with the same field names, every value a string:
//!
//! | field | nginx | varnishncsa |
//! |---|---|---|
//! | `ts` | `$msec` | `%{VSL:Timestamp:Resp[1]}x` (epoch seconds, µs) |
//! | `t` | — | `%{%s}t` (epoch seconds; used when `ts` is empty) |
//! | `host` | `$host` | `%{Host}i` |
//! | `uri` | `$request_uri` | `%U%q` |
//! | `method` | `$request_method` | `%m` |
//! | `status` | `$status` | `%s` |
//! | `cache` | `$upstream_cache_status` | `%{Varnish:handling}x` |
//! | `hitmiss` | — | `%{Varnish:hitmiss}x` |
//! | `referer` | `$http_referer` | `%{Referer}i` |
//! | `bytes` | `$body_bytes_sent` | `%b` |
//! | `upstream_time` | `$upstream_response_time` | `%{Varnish:time_firstbyte}x` |
//! | `prewarm` | `$http_x_edge_pulse_prewarm` | `%{X-Edge-Pulse-Prewarm}i` |
//!
//! A line is parsed into a [`LogLine`] (malformed: not JSON, a field missing or not
//! a number where one is needed) and then mapped by [`map_status`], the one table of
//! cache statuses ([`NGINX_STATUSES`], [`VARNISH_STATUSES`]) that `docs/edge-agent.md` repeats.

use std::borrow::Cow;

use models::{EdgeKind, Outcome, STRING_STOP};
use serde::Deserialize;

/// The log format the agent follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LogFormat {
    /// nginx `log_format edge_pulse escape=json` (`deploy/nginx/edge.conf`).
    NginxJson,
    /// `varnishncsa -j -f deploy/varnish/varnishncsa.format`.
    VarnishncsaJson,
}

impl LogFormat {
    /// The kind of edge that writes this format: what the agent's events say they
    /// come from.
    pub fn edge_kind(self) -> EdgeKind {
        match self {
            LogFormat::NginxJson => EdgeKind::Nginx,
            LogFormat::VarnishncsaJson => EdgeKind::Varnish,
        }
    }
}

/// What a cache status becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// An access event with this outcome.
    Event(Outcome),
    /// No event: the request was not served through the cache (pass, bypass, synth,
    /// no cache configured for the location).
    NotCached,
}

/// nginx `$upstream_cache_status` → outcome. `STALE` and `UPDATING` serve an
/// expired entry (`proxy_cache_use_stale`); `EXPIRED` and `REVALIDATED` went to the
/// origin for an expired entry, so the request found no fresh copy: a miss. nginx
/// does not say whether a request waited on `proxy_cache_lock`; such a request logs
/// `HIT` once the lock holder's response is cached, or `MISS` after the lock timeout.
pub(crate) const NGINX_STATUSES: [(&str, Mapping); 8] = [
    ("HIT", Mapping::Event(Outcome::Hit)),
    ("MISS", Mapping::Event(Outcome::Miss)),
    ("EXPIRED", Mapping::Event(Outcome::Miss)),
    ("REVALIDATED", Mapping::Event(Outcome::Miss)),
    ("STALE", Mapping::Event(Outcome::Stale)),
    ("UPDATING", Mapping::Event(Outcome::Stale)),
    ("BYPASS", Mapping::NotCached),
    ("-", Mapping::NotCached),
];

/// Varnish `%{Varnish:handling}x` → outcome. A request parked on the waiting list
/// (Varnish's request collapsing) logs `hit` once the object arrives. `hitmiss`
/// (a hit-for-miss object: fetched without collapsing, may become cacheable) is a
/// miss; `hitpass`, `pass`, `pipe` and `synth` never use the cache.
pub(crate) const VARNISH_STATUSES: [(&str, Mapping); 7] = [
    ("hit", Mapping::Event(Outcome::Hit)),
    ("miss", Mapping::Event(Outcome::Miss)),
    ("hitmiss", Mapping::Event(Outcome::Miss)),
    ("hitpass", Mapping::NotCached),
    ("pass", Mapping::NotCached),
    ("pipe", Mapping::NotCached),
    ("synth", Mapping::NotCached),
];

/// Why a well-formed line makes no event (a metric label each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Not served through the cache ([`Mapping::NotCached`]).
    NotCached,
    /// A cache status the table does not know.
    UnknownStatus,
    /// Not `GET` or `HEAD`.
    Method,
    /// The `Host` maps to no configured tenant.
    UnknownHost,
    /// The request target is not a valid cache key.
    InvalidKey,
    /// A pre-warm request served stale (a refresh, if any, is the edge's own): no
    /// fill to report. (One that found the key fresh is a `prefetch_cached` event.)
    PrewarmCached,
}

impl SkipReason {
    /// Every reason, for metrics created up front.
    pub const ALL: [SkipReason; 6] = [
        SkipReason::NotCached,
        SkipReason::UnknownStatus,
        SkipReason::Method,
        SkipReason::UnknownHost,
        SkipReason::InvalidKey,
        SkipReason::PrewarmCached,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::NotCached => "not_cached",
            SkipReason::UnknownStatus => "unknown_status",
            SkipReason::Method => "method",
            SkipReason::UnknownHost => "unknown_host",
            SkipReason::InvalidKey => "invalid_key",
            SkipReason::PrewarmCached => "prewarm_cached",
        }
    }
}

/// Why a line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedLine {
    /// Not a JSON object of the expected fields.
    #[error("not a log line of this format: {0}")]
    Json(String),
    /// Neither `ts` nor `t` holds a usable time.
    #[error("no usable timestamp")]
    Timestamp,
    /// `bytes` is not a number.
    #[error("bytes is not a number")]
    Bytes,
}

/// One parsed log line (strings borrow from the line unless JSON escapes forced a copy).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct LogLine<'a> {
    /// Epoch seconds with a fraction (nginx `$msec`, Varnish's `Resp` timestamp).
    #[serde(default, borrow)]
    pub ts: Cow<'a, str>,
    /// Epoch seconds (Varnish `%{%s}t`), the fallback for `ts`.
    #[serde(default, borrow)]
    pub t: Cow<'a, str>,
    /// The request's host.
    #[serde(borrow)]
    pub host: Cow<'a, str>,
    /// Path and query as the client sent them.
    #[serde(borrow)]
    pub uri: Cow<'a, str>,
    /// The request method.
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The cache status (nginx) or handling (Varnish).
    #[serde(borrow)]
    pub cache: Cow<'a, str>,
    /// Varnish's hit/miss; unused for nginx.
    #[serde(default, borrow)]
    pub hitmiss: Cow<'a, str>,
    /// The `Referer` header, `-` or empty when absent.
    #[serde(default, borrow)]
    pub referer: Cow<'a, str>,
    /// Body bytes sent.
    #[serde(default, borrow)]
    pub bytes: Cow<'a, str>,
    /// Seconds the upstream took (nginx: per upstream tried, comma-separated).
    #[serde(default, borrow)]
    pub upstream_time: Cow<'a, str>,
    /// The pre-warm marker header's value (`1` on the agent's own requests).
    #[serde(default, borrow)]
    pub prewarm: Cow<'a, str>,
}

/// The parts of a line an event needs, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed<'a> {
    /// The line itself.
    pub line: LogLine<'a>,
    /// When it was answered, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Body bytes sent.
    pub bytes: u64,
    /// The upstream's time in milliseconds, when it went upstream.
    pub upstream_ms: Option<u32>,
}

/// Parses one line (without its newline).
pub(crate) fn parse_line(line: &[u8]) -> Result<Parsed<'_>, MalformedLine> {
    let line: LogLine<'_> = match parse_flat(line) {
        Some(line) => line,
        None => serde_json::from_slice(line).map_err(|e| MalformedLine::Json(e.to_string()))?,
    };
    let ts_ms = seconds_to_ms(&line.ts)
        .or_else(|| seconds_to_ms(&line.t))
        .ok_or(MalformedLine::Timestamp)?;
    let bytes = match line.bytes.as_ref() {
        // Empty: nginx `escape=json` or varnishncsa `-j` for "nothing sent".
        "" | "-" | "null" => 0,
        b => b.parse().map_err(|_| MalformedLine::Bytes)?,
    };
    let upstream_ms = upstream_ms(&line.upstream_time);
    Ok(Parsed {
        line,
        ts_ms,
        bytes,
        upstream_ms,
    })
}

/// Where `parse_flat` keeps a field of [`LogLine`], by its name; `None` for a field
/// the line may have that the agent does not read (`status`).
fn field_slot(name: &str) -> Option<usize> {
    Some(match name {
        "ts" => 0,
        "t" => 1,
        "host" => 2,
        "uri" => 3,
        "method" => 4,
        "cache" => 5,
        "hitmiss" => 6,
        "referer" => 7,
        "bytes" => 8,
        "upstream_time" => 9,
        "prewarm" => 10,
        _ => return None,
    })
}

/// The shape both shipped formats write, read without serde: one flat object of
/// string values with no whitespace and no escape. serde_json was most of the agent's
/// per-line cost, for generality these lines never need. Anything else (an escape,
/// whitespace, a value that is not a string, a repeated or missing field) returns
/// `None` and the line goes to serde, which reads it or says what is wrong; so this
/// accepts only what serde accepts, with the same fields (a unit test and a property
/// test hold it to that).
fn parse_flat(line: &[u8]) -> Option<LogLine<'_>> {
    // Valid UTF-8 as a whole, so every slice between two quotes is too.
    let text = std::str::from_utf8(line).ok()?;
    let bytes = text.as_bytes();
    let mut at = 0;
    let quoted = |at: &mut usize| -> Option<&str> {
        if bytes.get(*at) != Some(&b'"') {
            return None;
        }
        let start = *at + 1;
        // Values are short: a table scan beats a vectorised search's set-up here.
        let len = bytes[start..]
            .iter()
            .position(|&b| STRING_STOP[usize::from(b)])?;
        if bytes[start + len] != b'"' {
            return None; // an escape or a control character: serde's to read or refuse
        }
        *at = start + len + 1;
        Some(&text[start..start + len])
    };
    if bytes.first() != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut values: [Option<&str>; 11] = [None; 11];
    if bytes.get(at) == Some(&b'}') {
        return None; // no fields: serde names the missing one
    }
    loop {
        let name = quoted(&mut at)?;
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at += 1;
        let value = quoted(&mut at)?;
        // Unknown fields (`status`) are skipped, as serde skips them.
        if let Some(i) = field_slot(name) {
            if values[i].replace(value).is_some() {
                return None; // serde refuses the duplicate
            }
        }
        match bytes.get(at) {
            Some(b',') => at += 1,
            Some(b'}') if at + 1 == bytes.len() => break,
            _ => return None,
        }
    }
    let [
        ts,
        t,
        host,
        uri,
        method,
        cache,
        hitmiss,
        referer,
        bytes_sent,
        upstream_time,
        prewarm,
    ] = values;
    Some(LogLine {
        ts: Cow::Borrowed(ts.unwrap_or_default()),
        t: Cow::Borrowed(t.unwrap_or_default()),
        host: Cow::Borrowed(host?),
        uri: Cow::Borrowed(uri?),
        method: Cow::Borrowed(method?),
        cache: Cow::Borrowed(cache?),
        hitmiss: Cow::Borrowed(hitmiss.unwrap_or_default()),
        referer: Cow::Borrowed(referer.unwrap_or_default()),
        bytes: Cow::Borrowed(bytes_sent.unwrap_or_default()),
        upstream_time: Cow::Borrowed(upstream_time.unwrap_or_default()),
        prewarm: Cow::Borrowed(prewarm.unwrap_or_default()),
    })
}

/// `"1700000000.123"` → 1700000000123; `None` for anything that is not a plausible
/// Unix time (2001 to 5138): a relative time (Varnish's `Resp[2]`) is not one.
fn seconds_to_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let seconds: f64 = s.parse().ok()?;
    (0.0..1e11)
        .contains(&seconds)
        .then_some((seconds * 1000.0) as u64)
}

/// The total of nginx's comma-separated upstream times (one per upstream tried; `-`
/// for none), in milliseconds.
fn upstream_ms(s: &str) -> Option<u32> {
    let mut total = 0.0;
    let mut any = false;
    for part in s.split([',', ':']) {
        if let Ok(seconds) = part.trim().parse::<f64>()
            && seconds.is_finite()
            && seconds >= 0.0
        {
            total += seconds;
            any = true;
        }
    }
    any.then(|| (total * 1000.0).round().min(u32::MAX as f64) as u32)
}

/// The mapping of `status` in `format`'s table; `None` for a status it lacks.
pub(crate) fn map_status(format: LogFormat, status: &str) -> Option<Mapping> {
    let table: &[(&str, Mapping)] = match format {
        LogFormat::NginxJson => &NGINX_STATUSES,
        LogFormat::VarnishncsaJson => &VARNISH_STATUSES,
    };
    let status = match (format, status) {
        // nginx logs an empty variable as "-"; with `escape=json`, as "".
        (LogFormat::NginxJson, "") => "-",
        (_, s) => s,
    };
    table.iter().find(|(s, _)| *s == status).map(|(_, m)| *m)
}

/// The outcome of a parsed line, or why it makes no event (before tenant and key).
/// A pre-warm request (marker `1`) that filled is a `prefetch_fill`; one that found
/// the key cached is a `prefetch_cached`, as the prefetcher publishes; one served
/// stale or joined to a fill in flight makes no event.
pub(crate) fn outcome(format: LogFormat, line: &LogLine<'_>) -> Result<Outcome, SkipReason> {
    if !matches!(line.method.as_ref(), "GET" | "HEAD") {
        return Err(SkipReason::Method);
    }
    let outcome = match map_status(format, &line.cache) {
        Some(Mapping::Event(outcome)) => outcome,
        Some(Mapping::NotCached) => return Err(SkipReason::NotCached),
        None => return Err(SkipReason::UnknownStatus),
    };
    if line.prewarm == "1" {
        return match outcome {
            Outcome::Miss => Ok(Outcome::PrefetchFill),
            Outcome::Hit => Ok(Outcome::PrefetchCached),
            _ => Err(SkipReason::PrewarmCached),
        };
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nginx(cache: &str) -> String {
        format!(
            r#"{{"ts":"1700000000.123","host":"acme.example","uri":"/a?b=1","method":"GET","status":"200","cache":"{cache}","referer":"https://news.example/x","bytes":"512","upstream_time":"0.012, 0.003","prewarm":""}}"#
        )
    }

    #[test]
    fn an_nginx_line_parses_with_its_time_bytes_and_upstream_time() {
        let text = nginx("MISS");
        let parsed = parse_line(text.as_bytes()).unwrap();
        assert_eq!(parsed.ts_ms, 1_700_000_000_123);
        assert_eq!(parsed.bytes, 512);
        assert_eq!(parsed.upstream_ms, Some(15));
        assert_eq!(parsed.line.host, "acme.example");
        assert_eq!(
            outcome(LogFormat::NginxJson, &parsed.line),
            Ok(Outcome::Miss)
        );
    }

    #[test]
    fn every_nginx_status_maps_as_the_table_says() {
        let expect = [
            ("HIT", Ok(Outcome::Hit)),
            ("MISS", Ok(Outcome::Miss)),
            ("EXPIRED", Ok(Outcome::Miss)),
            ("REVALIDATED", Ok(Outcome::Miss)),
            ("STALE", Ok(Outcome::Stale)),
            ("UPDATING", Ok(Outcome::Stale)),
            ("BYPASS", Err(SkipReason::NotCached)),
            ("-", Err(SkipReason::NotCached)),
            ("", Err(SkipReason::NotCached)),
            ("WEIRD", Err(SkipReason::UnknownStatus)),
        ];
        for (status, want) in expect {
            let text = nginx(status);
            let parsed = parse_line(text.as_bytes()).unwrap();
            assert_eq!(
                outcome(LogFormat::NginxJson, &parsed.line),
                want,
                "{status}"
            );
        }
    }

    #[test]
    fn every_varnish_handling_maps_as_the_table_says() {
        let expect = [
            ("hit", Ok(Outcome::Hit)),
            ("miss", Ok(Outcome::Miss)),
            ("hitmiss", Ok(Outcome::Miss)),
            ("hitpass", Err(SkipReason::NotCached)),
            ("pass", Err(SkipReason::NotCached)),
            ("pipe", Err(SkipReason::NotCached)),
            ("synth", Err(SkipReason::NotCached)),
            ("HIT", Err(SkipReason::UnknownStatus)),
        ];
        for (handling, want) in expect {
            let text = format!(
                r#"{{"ts":"","t":"1700000000","host":"acme.example","uri":"/a","method":"GET","status":"200","cache":"{handling}","hitmiss":"hit","referer":"","bytes":"0","upstream_time":"0.000123","prewarm":""}}"#
            );
            let parsed = parse_line(text.as_bytes()).unwrap();
            assert_eq!(parsed.ts_ms, 1_700_000_000_000, "falls back to `t`");
            assert_eq!(
                outcome(LogFormat::VarnishncsaJson, &parsed.line),
                want,
                "{handling}"
            );
        }
    }

    #[test]
    fn a_prewarm_that_filled_is_a_prefetch_fill_and_one_that_hit_is_prefetch_cached() {
        for (cache, want) in [
            ("MISS", Ok(Outcome::PrefetchFill)),
            ("EXPIRED", Ok(Outcome::PrefetchFill)),
            ("HIT", Ok(Outcome::PrefetchCached)),
        ] {
            let text = nginx(cache).replace(r#""prewarm":"""#, r#""prewarm":"1""#);
            let parsed = parse_line(text.as_bytes()).unwrap();
            assert_eq!(outcome(LogFormat::NginxJson, &parsed.line), want, "{cache}");
        }
    }

    #[test]
    fn only_get_and_head_make_events() {
        let text = nginx("MISS").replace(r#""method":"GET""#, r#""method":"POST""#);
        let parsed = parse_line(text.as_bytes()).unwrap();
        assert_eq!(
            outcome(LogFormat::NginxJson, &parsed.line),
            Err(SkipReason::Method)
        );
    }

    #[test]
    fn malformed_lines_are_refused_with_a_reason() {
        assert!(matches!(
            parse_line(b"127.0.0.1 - - [01/Dec/2026] \"GET / HTTP/1.1\""),
            Err(MalformedLine::Json(_))
        ));
        assert!(matches!(
            parse_line(br#"{"host":"a"}"#),
            Err(MalformedLine::Json(_))
        ));
        let no_time = nginx("HIT").replace("1700000000.123", "soon");
        assert_eq!(
            parse_line(no_time.as_bytes()),
            Err(MalformedLine::Timestamp)
        );
        let bad_bytes = nginx("HIT").replace(r#""bytes":"512""#, r#""bytes":"many""#);
        assert_eq!(parse_line(bad_bytes.as_bytes()), Err(MalformedLine::Bytes));
    }

    /// The shipped shape is read without serde, to the same fields.
    #[test]
    fn the_shipped_shape_takes_the_fast_reader() {
        let text = nginx("MISS");
        let fast = parse_flat(text.as_bytes()).expect("the flat shape");
        let slow: LogLine<'_> = serde_json::from_slice(text.as_bytes()).unwrap();
        assert_eq!(fast, slow);
        assert_eq!(fast.uri, "/a?b=1");
    }

    /// Each of these is read by serde (escapes, whitespace, other value types) or
    /// refused by it (duplicates, missing fields, trailing bytes): the fast reader
    /// leaves every one to serde.
    #[test]
    fn the_fast_reader_leaves_everything_else_to_serde() {
        let base = nginx("HIT");
        assert!(parse_flat(base.as_bytes()).is_some());
        for (from, to) in [
            (r#""uri":"/a?b=1""#, r#""uri":"/a\"b""#),
            (r#""uri":"/a?b=1""#, r#""uri":"\u002fa""#),
            (r#""uri":"/a?b=1""#, r#""uri": "/a""#),
            (r#""bytes":"512""#, r#""bytes":512"#),
            (r#""bytes":"512""#, r#""bytes":null"#),
            (r#""host":"acme.example","#, ""),
            (r#""method":"GET""#, r#""method":"GET","method":"GET""#),
            (r#""prewarm":"""#, r#""prewarm":"","x":{}"#),
            (r#""prewarm":""}"#, r#""prewarm":""} "#),
            (r#""prewarm":""}"#, r#""prewarm":""}x"#),
            (r#""prewarm":""}"#, r#""prewarm":"","#),
            (r#""uri":"/a?b=1""#, "\"uri\":\"/a\tb\""),
        ] {
            let line = base.replace(from, to);
            assert_ne!(line, base, "{to} replaced nothing");
            assert!(parse_flat(line.as_bytes()).is_none(), "{line}");
        }
        assert!(parse_flat(b"{}").is_none());
        assert!(parse_flat(b"").is_none());
        assert!(parse_flat(b"{\"host\":\"\xff\"}").is_none());
    }

    fn log_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            4 => "[ -~]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            1 => any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
            1 => "[a-z]{0,4}".prop_map(|s| format!("\"{s}\\\"{s}\"")),
            1 => Just("12".to_owned()),
            1 => Just("null".to_owned()),
            1 => Just(" \"x\"".to_owned()),
        ]
    }

    proptest::proptest! {
        /// Objects of the log fields (repeated, missing, unknown) with values that are
        /// plain, escaped or of another type: whatever the fast reader reads, serde
        /// reads the same.
        #[test]
        fn the_fast_reader_agrees_with_serde(
            fields in proptest::collection::vec(
                (proptest::sample::select(vec![
                    "ts", "t", "host", "uri", "method", "cache", "hitmiss", "referer",
                    "bytes", "upstream_time", "prewarm", "status", "x",
                ]), log_value()),
                0..14,
            ),
            required in proptest::bool::ANY,
        ) {
            let mut parts: Vec<String> =
                fields.iter().map(|(name, value)| format!("{name:?}:{value}")).collect();
            if required {
                for name in ["host", "uri", "method", "cache"] {
                    parts.push(format!("{name:?}:\"{name}\""));
                }
            }
            let text = format!("{{{}}}", parts.join(","));
            if let Some(fast) = parse_flat(text.as_bytes()) {
                let slow: Result<LogLine<'_>, _> = serde_json::from_slice(text.as_bytes());
                proptest::prop_assert_eq!(Some(fast), slow.ok(), "{}", text);
            }
        }
    }

    /// Each format's events name the server that writes it.
    #[test]
    fn each_format_names_its_edge_kind() {
        assert_eq!(LogFormat::NginxJson.edge_kind(), EdgeKind::Nginx);
        assert_eq!(LogFormat::VarnishncsaJson.edge_kind(), EdgeKind::Varnish);
    }

    /// The edge agent page's table of cache statuses is this module's table, row for row.
    #[test]
    fn the_readme_table_matches_the_code() {
        let readme = include_str!("../../../docs/edge-agent.md");
        for (format, table) in [
            ("nginx", &NGINX_STATUSES[..]),
            ("varnish", &VARNISH_STATUSES[..]),
        ] {
            for (status, mapping) in table {
                let to = match mapping {
                    Mapping::Event(outcome) => outcome.as_str(),
                    Mapping::NotCached => "no event",
                };
                let row = format!("| {format} | `{status}` | {to} |");
                assert!(
                    readme.contains(&row),
                    "docs/edge-agent.md lacks the row {row}"
                );
            }
        }
    }
}
