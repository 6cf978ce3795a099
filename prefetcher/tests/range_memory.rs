//! Multi-range answers from a cached object hold no copy of it: clients that ask for
//! two ranges of a cached 8 MiB object and read none of the answer leave the node's
//! memory where single-range clients leave it. (Its own test binary: the resident
//! set is the process's, so no other test may run beside it.)

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{HOST, Rig, x_cache};
use prefetcher::CacheStatus;
use prefetcher::testing::Scripted;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SIZE: usize = 8 << 20;
const CLIENTS: usize = 12;

/// The process's resident set, in bytes (Linux).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// `CLIENTS` connections that each send `range` and never read.
async fn unread(rig: &Rig, range: &str) -> Vec<TcpStream> {
    let hits = rig.node.node.metrics().requests(CacheStatus::Hit);
    let mut held = Vec::new();
    for _ in 0..CLIENTS {
        let mut stream = TcpStream::connect(rig.node.addr).await.unwrap();
        let request = format!("GET /big HTTP/1.1\r\nHost: {HOST}\r\nRange: {range}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        held.push(stream);
    }
    // Let the node answer each as far as the sockets take; a correctness wait only.
    prefetcher::testing::wait_until(
        || rig.node.node.metrics().requests(CacheStatus::Hit) >= hits + CLIENTS as u64,
        "the answers to start",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_two_range_answers_hold_no_copy_of_the_cached_object() {
    let rig = Rig::start().await;
    let body = Bytes::from(vec![b'x'; SIZE]);
    rig.origin.script("/big", move |_, _| {
        Scripted::new(200, &[("cache-control", "max-age=600")]).with_body(body.clone())
    });
    let first = rig.get("/big", &[]).await;
    assert_eq!(first.body.unwrap().len(), SIZE);
    // The fill is stored (and its flight gone) a moment after the first answer's last
    // byte: on a busy machine the next request may still join it.
    let mut read = rig.get("/big", &[("range", "bytes=0-9,100-109")]).await;
    for _ in 0..250 {
        if x_cache(&read) != "COLLAPSED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = rig.get("/big", &[("range", "bytes=0-9,100-109")]).await;
    }
    assert_eq!(read.status.as_u16(), 206);
    assert_eq!(x_cache(&read), "HIT");

    let before = resident_bytes();
    let half = SIZE / 2;
    let two = format!("bytes=0-{},{}-{}", half - 1, half, SIZE - 1);
    let held = unread(&rig, &two).await;
    let grown = resident_bytes().saturating_sub(before);
    drop(held);
    // A copy per answer is 12 x 8 MiB = 96 MiB; slices of the stored body are a few
    // part heads. The bound leaves room for buffers and allocator noise.
    assert!(
        grown < 32 << 20,
        "{CLIENTS} unread two-range answers grew the resident set by {} MiB",
        grown >> 20
    );
}
