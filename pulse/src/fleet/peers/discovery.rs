//! Peers found through the consumer group: each instance's consumer carries its API
//! URL in its client id (`--advertise-url`), and the others read it in the group's
//! description (DescribeGroups), so an autoscaled group needs no `--peers`.
//!
//! Invariants: only members whose client id is [`client_id`]'s form are peers; this
//! instance is never its own peer; a description that cannot be had leaves the peers
//! as they were (an instance that is gone stays named, and missing, until the group
//! drops it at its session timeout).

use std::collections::BTreeMap;
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

/// The partitions of `topic` in a member's assignment (Kafka's consumer protocol: a
/// version, then per topic its name and its partitions, then user data); what cannot
/// be read gives nothing.
fn assigned(bytes: &[u8], topic: &str) -> Vec<i32> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let mut out = Vec::new();
    let mut read = || -> Option<()> {
        take(2)?;
        let topics = i32::from_be_bytes(take(4)?.try_into().ok()?);
        for _ in 0..topics.max(0) {
            let len = i16::from_be_bytes(take(2)?.try_into().ok()?);
            let name = take(len.max(0) as usize)?.to_vec();
            let n = i32::from_be_bytes(take(4)?.try_into().ok()?);
            for _ in 0..n.max(0) {
                let p = i32::from_be_bytes(take(4)?.try_into().ok()?);
                if name == topic.as_bytes() {
                    out.push(p);
                }
            }
        }
        Some(())
    };
    if read().is_none() {
        out.clear();
    }
    out
}

/// What the group's members say: the URLs they advertise, but `me`, and which of
/// them each partition of `topic` is assigned to.
type Found = (Vec<PeerUrl>, BTreeMap<i32, PeerUrl>);

/// The URLs the members of `group` advertise, but `me`, and their partitions; `None`
/// when the group could not be described.
fn describe(client: &BaseConsumer, group: &str, topic: &str, me: &PeerUrl) -> Option<Found> {
    let list = match client.fetch_group_list(Some(group), Duration::from_secs(5)) {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, group, "describing the consumer group failed; peers kept");
            return None;
        }
    };
    let group = list.groups().iter().find(|g| g.name() == group)?;
    let mut urls = Vec::new();
    let mut owners = BTreeMap::new();
    for member in group.members() {
        let Some(url) = advertised(member.client_id()).filter(|url| url != me) else {
            continue;
        };
        for p in assigned(member.assignment().unwrap_or_default(), topic) {
            owners.insert(p, url.clone());
        }
        urls.push(url);
    }
    Some((urls, owners))
}

/// Describes `group` every [`DISCOVERY_INTERVAL`] on a thread of its own and puts
/// what its members advertise in `peers`, until `stop` says so.
pub(crate) fn discover(
    config: ClientConfig,
    group: String,
    topic: String,
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
                if let Some((found, owners)) = describe(&client, &group, &topic, &me) {
                    peers.set_owners(owners);
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

    /// A consumer-protocol assignment: the partitions of the events topic, none of
    /// another, nothing from a truncated one.
    #[test]
    fn an_assignment_gives_the_partitions_of_the_topic() {
        let mut bytes = vec![0, 1];
        bytes.extend(2i32.to_be_bytes());
        for (topic, partitions) in [("events", &[3i32, 5][..]), ("other", &[1i32][..])] {
            bytes.extend((topic.len() as i16).to_be_bytes());
            bytes.extend(topic.as_bytes());
            bytes.extend((partitions.len() as i32).to_be_bytes());
            for p in partitions {
                bytes.extend(p.to_be_bytes());
            }
        }
        bytes.extend((-1i32).to_be_bytes());
        assert_eq!(assigned(&bytes, "events"), [3, 5]);
        assert_eq!(assigned(&bytes, "other"), [1]);
        assert!(assigned(&bytes[..bytes.len() - 9], "events").is_empty());
        assert!(assigned(&[], "events").is_empty());
    }
}
