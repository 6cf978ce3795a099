//! Peers found through the consumer group: each instance's consumer carries its API
//! URL in its client id (`--advertise-url`), and the others read it in the group's
//! description (DescribeGroups), so an autoscaled group needs no `--peers`.
//!
//! Invariants: only members whose client id is [`client_id`]'s form are peers; this
//! instance is never its own peer; a description that cannot be had leaves the peers
//! as they were (an instance that is gone stays named, and missing, until the group
//! drops it at its session timeout).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{PeerUrl, Peers};

/// What precedes the URL in a pulse consumer's client id.
const PREFIX: &str = "pulse@";

/// How often the group is described.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(2);

/// The client id that advertises `url` to the group.
pub(crate) fn client_id(url: &PeerUrl) -> String {
    format!("{PREFIX}{}", url.as_str())
}

/// The URL a member's client id advertises, if it is a pulse's.
fn advertised(client_id: &str) -> Option<PeerUrl> {
    PeerUrl::parse(client_id.strip_prefix(PREFIX)?).ok()
}

/// The URLs the members of `group` advertise, but `me`; `None` when the group could
/// not be described.
fn describe(client: &BaseConsumer, group: &str, me: &PeerUrl) -> Option<Vec<PeerUrl>> {
    let list = match client.fetch_group_list(Some(group), Duration::from_secs(5)) {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, group, "describing the consumer group failed; peers kept");
            return None;
        }
    };
    let group = list.groups().iter().find(|g| g.name() == group)?;
    Some(
        group
            .members()
            .iter()
            .filter_map(|m| advertised(m.client_id()))
            .filter(|url| url != me)
            .collect(),
    )
}

/// Describes `group` every [`DISCOVERY_INTERVAL`] on a thread of its own and puts
/// what its members advertise in `peers`, until `stop` says so.
pub(crate) fn discover(
    config: ClientConfig,
    group: String,
    me: PeerUrl,
    peers: Peers,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pulse-peers".into())
        .spawn(move || {
            let client: BaseConsumer = match config.create() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "peer discovery off: no Kafka client");
                    return;
                }
            };
            while !*stop.borrow() {
                if let Some(found) = describe(&client, &group, &me) {
                    if peers.set_urls(found) {
                        let urls: Vec<String> =
                            peers.urls().iter().map(|u| u.as_str().to_owned()).collect();
                        tracing::info!(peers = ?urls, "peers found in the consumer group");
                    }
                }
                std::thread::sleep(DISCOVERY_INTERVAL);
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pulse's client id carries its URL and gives it back; other members' (and
    /// malformed ones) are no peers.
    #[test]
    fn a_client_id_advertises_the_url() {
        let url = PeerUrl::parse("http://10.0.0.2:8080").unwrap();
        assert_eq!(advertised(&client_id(&url)), Some(url));
        assert_eq!(advertised("rdkafka"), None);
        assert_eq!(advertised("pulse@not a url"), None);
    }
}
