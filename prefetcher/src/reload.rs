//! Checking a configuration as the node would start with it ([`check_config`], what
//! `prefetcher --check-config` runs), and putting a new one in force in a running
//! node ([`NodeHandle::reload`](crate::NodeHandle::reload), what SIGHUP runs).
//!
//! A reload applies to new requests only: a request reads the configuration once
//! (`proxy::Live`), and it and the fill it starts finish on the one they read. What a
//! reload can change:
//! - `tenants`: hosts, origins, `host_header` (the TLS server names of new origin
//!   connections with them), `weight`, `peak_fills` and `routes` (the shares of the
//!   fill slots; fills running or queued keep their place);
//! - `[limits]`: the request size limits;
//! - `tls.cert_file` and `tls.key_file`: read again on every reload, so a renewed
//!   certificate at the same path is put in force; new handshakes present it,
//!   connections already up keep theirs.
//!
//! Every other setting (listen addresses, `node`, `region`, `[kafka]`, `[cache]`,
//! `[flight]`, `[prefetch]`, `[server]`, `[http2]`, `[origin]`, `[warmup]`, `[purge]`) needs a
//! restart: a reload that changes one logs it as such and keeps it as it runs. A configuration
//! that fails [`check_config`] is refused whole, and the running one stays.

use crate::changes::{Reloaded, differences, log_reloaded, refused};
use crate::config::{Config, ConfigError};
use crate::origin::OriginClient;
use crate::proxy::{Live, Node};
use crate::publisher::check_kafka_properties;
use crate::tls::{ListenerCert, listener_key};

/// Checks `config` as [`spawn_node`](crate::spawn_node) would before it binds: every
/// field ([`Config::validate`]), the TLS listener's certificate and key, the origin
/// CA file, every tenant's origin, and the librdkafka properties. Binds no port and
/// connects to nothing. The error names the field.
pub fn check_config(config: &Config) -> Result<(), ConfigError> {
    config.validate()?;
    if let Some(tls) = &config.tls {
        listener_key(tls)?;
    }
    OriginClient::from_config(config)?;
    Live::new(config.clone())?;
    if config.kafka.enabled() {
        check_kafka_properties(&config.kafka)?;
    }
    if let Some(warmup) = &config.warmup {
        warmup.token()?;
    }
    config.purge.token()?;
    Ok(())
}

/// What `--check-config` prints for the configuration called `name`: one line on
/// stdout when `checked` is good, else one on stderr naming the bad field; the exit
/// status to end with (0 or 1), as `nginx -t` does.
pub fn report_check<T>(binary: &str, name: &str, checked: &Result<T, ConfigError>) -> i32 {
    match checked {
        Ok(_) => {
            println!("{binary}: configuration {name} is OK");
            0
        }
        Err(error) => {
            eprintln!("{binary}: configuration {name} is invalid: {error}");
            1
        }
    }
}

/// Waits for SIGINT or SIGTERM (`shutdown_signal`), calling
/// `on_hangup` at each SIGHUP meanwhile (the binaries reload there).
pub async fn until_shutdown(mut on_hangup: impl FnMut()) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup())?;
    let shutdown = crate::listener::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            _ = hangups.recv() => {
                tracing::info!("SIGHUP: reading the configuration again");
                on_hangup();
            }
        }
    }
}

/// Puts `wanted` in force in `node` (and its TLS listener's certificate in `cert`),
/// or refuses it, keeping the running configuration. Counted and logged.
pub(crate) fn reload_node(
    node: &Node,
    cert: Option<&ListenerCert>,
    wanted: Config,
) -> Result<Reloaded, ConfigError> {
    match try_reload(node, cert, wanted) {
        Ok(reloaded) => {
            node.metrics().config_reloads_ok.inc();
            log_reloaded(&reloaded);
            Ok(reloaded)
        }
        Err(error) => Err(refuse_reload(node, error)),
    }
}

/// Counts and logs a refused reload; returns `error`.
pub(crate) fn refuse_reload(node: &Node, error: ConfigError) -> ConfigError {
    refused(node.metrics(), error)
}

fn try_reload(
    node: &Node,
    cert: Option<&ListenerCert>,
    wanted: Config,
) -> Result<Reloaded, ConfigError> {
    check_config(&wanted)?;
    let running = node.config();
    let mut next = (*running).clone();
    let mut needs_restart = Vec::new();
    let needs_roots = !node.origin().verifies_https()
        && wanted
            .tenants
            .iter()
            .any(|t| t.origin.starts_with("https://"));
    if needs_roots {
        // The system's CA certificates are read at start only when some origin is
        // https://: without them (or `origin.ca_file`) the new origin would fail.
        needs_restart.push(
            "tenants (a first https:// origin: the CA certificates are read at start)".to_owned(),
        );
    } else {
        next.tenants = wanted.tenants.clone();
    }
    next.limits = wanted.limits.clone();
    if let (Some(next_tls), Some(wanted_tls)) = (&mut next.tls, &wanted.tls) {
        next_tls.cert_file = wanted_tls.cert_file.clone();
        next_tls.key_file = wanted_tls.key_file.clone();
    }
    needs_restart.extend(
        differences(&next, &wanted)
            .into_iter()
            .filter(|field| !(needs_roots && field == "tenants")),
    );
    next.validate()?;
    // Everything that can fail comes before anything is put in force.
    let key = match (&next.tls, cert) {
        (Some(tls), Some(_)) => Some(listener_key(tls)?),
        _ => None,
    };
    let mut applied = differences(&*running, &next);
    let live = Live::new(next)?;
    if let (Some(key), Some(cert)) = (key, cert) {
        cert.replace(key);
        applied.push("tls certificate (read again)".to_owned());
    }
    node.origin().set_tenants(&live.config.tenants);
    node.replace_live(live);
    Ok(Reloaded {
        applied,
        needs_restart,
    })
}

#[cfg(test)]
mod tests {
    use models::TenantId;

    use super::*;

    fn config(origin: &str) -> Config {
        Config::single_origin(
            "127.0.0.1:0".parse().unwrap(),
            TenantId::new("acme").unwrap(),
            origin,
        )
    }

    /// Tenants and limits are put in force; a restart-only setting is reported and
    /// kept; a bad config changes nothing; every outcome is counted.
    #[test]
    fn a_reload_applies_what_it_can_and_reports_the_rest() {
        let node = Node::new(config("http://127.0.0.1:1")).unwrap();
        let mut wanted = config("http://127.0.0.1:2");
        wanted.limits.max_body_bytes = 1024;
        wanted.listen = "127.0.0.1:9".parse().unwrap();
        let reloaded = reload_node(&node, None, wanted).unwrap();
        assert_eq!(reloaded.applied, ["limits.max_body_bytes", "tenants"]);
        assert_eq!(reloaded.needs_restart, ["listen"]);
        let running = node.config();
        assert_eq!(running.tenants[0].origin, "http://127.0.0.1:2");
        assert_eq!(running.limits.max_body_bytes, 1024);
        assert_eq!(running.listen, "127.0.0.1:0".parse().unwrap());

        let error = reload_node(&node, None, config("ftp://x")).unwrap_err();
        assert!(error.to_string().contains("tenants[0].origin"), "{error}");
        assert_eq!(node.config().tenants[0].origin, "http://127.0.0.1:2");
        assert_eq!(node.metrics().config_reloads_ok.get(), 1);
        assert_eq!(node.metrics().config_reloads_refused.get(), 1);
    }

    /// Tenants' weights and routes are put in force in the fill limiter.
    #[test]
    fn a_reload_changes_the_fill_shares() {
        let node = Node::new(config("http://127.0.0.1:1")).unwrap();
        let limiter = node.origin().limiter().clone();
        assert_eq!(limiter.tenants()[0].committed, limiter.max_fills());
        let mut wanted = config("http://127.0.0.1:1");
        let mut other = wanted.tenants[0].clone();
        other.id = TenantId::new("globex").unwrap();
        other.hosts = vec!["globex.example".into()];
        other.weight = 3.0;
        wanted.tenants.push(other);
        wanted.tenants[0].routes = vec![crate::config::RouteConfig {
            prefix: "/health".into(),
            methods: Vec::new(),
            class: crate::config::TrafficClass::Critical,
        }];
        reload_node(&node, None, wanted).unwrap();
        let shares = limiter.tenants();
        assert_eq!(shares[1].committed, limiter.max_fills() * 3 / 4);
        let acme = TenantId::new("acme").unwrap();
        assert_eq!(
            limiter.class_of(&acme, "GET", "/healthz"),
            crate::config::TrafficClass::Critical
        );
    }

    /// A node that started without an https origin has no roots to verify one: the
    /// first one waits for a restart, and the running tenants stay.
    #[test]
    fn a_first_https_origin_needs_a_restart() {
        let node = Node::new(config("http://127.0.0.1:1")).unwrap();
        let reloaded = reload_node(&node, None, config("https://127.0.0.1:2")).unwrap();
        assert!(reloaded.applied.is_empty(), "{reloaded:?}");
        assert_eq!(reloaded.needs_restart.len(), 1, "{reloaded:?}");
        assert!(reloaded.needs_restart[0].starts_with("tenants"));
        assert_eq!(node.config().tenants[0].origin, "http://127.0.0.1:1");
    }
}
