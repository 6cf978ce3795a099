//! The per-connection guard of the proxy listeners, for a node that faces the open
//! internet:
//!
//! - [`HeadGuard`] reads along with hyper on an HTTP/1 connection and checks every
//!   request head on the raw bytes ([`check_request_head`]) before hyper parses it
//!   away: a `Content-Length` beside `Transfer-Encoding`, duplicate equal lengths
//!   and bare-LF line ends leave no trace in the parsed request. It follows the
//!   framing (lengths, chunks) to find each next head; the verdicts wait in the
//!   connection's [`ConnGuard`] for the service, which answers a refused head `400`.
//!   If it ever loses the thread (a head too large, a malformed chunk: hyper fails
//!   those too) it stops, and the service checks the parsed request instead.
//! - On an HTTP/2 connection it reads the frames the node writes for the error
//!   `GOAWAY` it sends ([`ConnGuard::goaway_sent`], read by `h2_abuse`).
//!
//! (A client that never opens its HTTP/2 flow-control window is the sweeper's, like
//! any client that takes none of its response: `supervise`.)
//!
//! # Invariants
//! - The guard never changes a byte: it reads what hyper reads, after hyper asked.
//! - Verdicts come out in the order of the heads; a connection's service pops one
//!   per HTTP/1 request, or `None` once the guard stopped following.
//! - A refused head is counted once: by the service that answers it, or, when hyper
//!   refused it first, when the connection ends ([`ConnGuard::unanswered_refusals`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::h2_abuse::{FrameScan, goaway_abuse};
use crate::request_head::{Framing, HeadCheck, RefusalReason, check_request_head};
use crate::status::H2Abuse;

/// The HTTP/2 connection preface: such a connection has no HTTP/1 heads to check.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the head guard found of one HTTP/1 request head: it passed, or it is to be
/// refused for this reason.
pub(crate) type Verdict = Result<(), RefusalReason>;

/// State shared by a connection's guard, its service and its task.
#[derive(Debug, Default)]
pub(crate) struct ConnGuard {
    /// Verdicts on HTTP/1 heads not yet answered, oldest first. A `std` mutex: the
    /// guard and the service of one connection run in one task, so it is never
    /// contended, and it is held for a push or a pop.
    verdicts: Mutex<VecDeque<Verdict>>,
    /// What the first error `GOAWAY` the node sent on this connection named: `h2`
    /// says which limit a client broke only in the frame's debug data.
    goaway: Mutex<Option<H2Abuse>>,
    /// The origin fills the connection leads (a proxy connection's; `None` in tests
    /// of the guard alone).
    fills: Option<super::fills::ConnFills>,
}

impl ConnGuard {
    /// The guard of a proxy connection whose fills are `fills`.
    pub(crate) fn with_fills(fills: super::fills::ConnFills) -> ConnGuard {
        ConnGuard {
            fills: Some(fills),
            ..ConnGuard::default()
        }
    }

    /// The origin fills the connection leads.
    pub(crate) fn fills(&self) -> Option<&super::fills::ConnFills> {
        self.fills.as_ref()
    }

    /// The verdict on the next HTTP/1 head, `None` when the guard does not follow
    /// the connection (HTTP/2, or it lost the thread).
    pub(crate) fn next_verdict(&self) -> Option<Verdict> {
        lock(&self.verdicts).pop_front()
    }

    fn push(&self, verdict: Verdict) {
        lock(&self.verdicts).push_back(verdict);
    }

    /// The abuse named by the first error `GOAWAY` sent on this connection.
    pub(crate) fn goaway_sent(&self) -> Option<H2Abuse> {
        *lock(&self.goaway)
    }

    /// Refusals whose heads never reached the service (hyper refused them first, or
    /// the connection ended): to be counted when the connection ends.
    pub(crate) fn unanswered_refusals(&self) -> Vec<RefusalReason> {
        lock(&self.verdicts)
            .drain(..)
            .filter_map(Result::err)
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the guard is in the request stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Nothing read yet: HTTP/2 preface or an HTTP/1 head.
    Start,
    /// Reading a head.
    Head,
    /// Skipping this many body bytes.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Not following (HTTP/2, or the thread is lost).
    Off,
}

/// The chunked-body states, as hyper's decoder has them (strict CRLF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Data(u64),
    DataCr,
    DataLf,
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

/// An HTTP/1 connection's reader that checks every request head as it passes.
#[derive(Debug)]
pub(crate) struct HeadGuard<IO> {
    io: IO,
    guard: std::sync::Arc<ConnGuard>,
    follow: Follow,
    /// A head (or the preface) split across reads.
    pending: Vec<u8>,
    /// Longest head kept in `pending`: hyper's own buffer limit.
    max_head_bytes: usize,
    chunk_size: u64,
    /// The frames the node writes, once the client spoke HTTP/2.
    frames_out: Option<FrameScan>,
}

impl<IO> HeadGuard<IO> {
    pub(crate) fn new(io: IO, guard: std::sync::Arc<ConnGuard>, max_head_bytes: usize) -> Self {
        HeadGuard {
            io,
            guard,
            follow: Follow::Start,
            pending: Vec::new(),
            max_head_bytes,
            chunk_size: 0,
            frames_out: None,
        }
    }

    /// Follows `data`, the next bytes the node wrote.
    fn wrote(&mut self, data: &[u8]) {
        if let Some(scan) = &mut self.frames_out
            && let Some((code, debug_data)) = scan.scan(data)
        {
            let mut goaway = lock(&self.guard.goaway);
            if goaway.is_none() {
                *goaway = goaway_abuse(code, &debug_data);
            }
        }
    }

    fn stop(&mut self) {
        self.follow = Follow::Off;
        self.pending = Vec::new();
    }

    /// Follows `data`, the next bytes hyper reads.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.follow {
                Follow::Off => return,
                Follow::Start => {
                    let have = self.pending.len();
                    let take = (H2_PREFACE.len() - have).min(data.len());
                    if data[..take] != H2_PREFACE[have..have + take] {
                        // HTTP/1: what was kept is the start of its first head.
                        self.follow = Follow::Head;
                        continue;
                    }
                    if have + take == H2_PREFACE.len() {
                        self.stop();
                        self.frames_out = Some(FrameScan::default());
                        return;
                    }
                    self.pending.extend_from_slice(data);
                    return;
                }
                Follow::Head => {
                    let fresh = self.pending.is_empty();
                    if !fresh {
                        self.pending.extend_from_slice(data);
                    }
                    let step = match check_request_head(if fresh { data } else { &self.pending }) {
                        HeadCheck::Partial => None,
                        HeadCheck::TooManyFields => {
                            self.stop();
                            return;
                        }
                        HeadCheck::Refused(reason) => {
                            self.guard.push(Err(reason));
                            // This connection ends with the answer to this head.
                            self.stop();
                            return;
                        }
                        HeadCheck::Accepted(head) => Some((head.len, head.framing)),
                    };
                    let Some((len, framing)) = step else {
                        if fresh {
                            self.pending.extend_from_slice(data);
                        }
                        if self.pending.len() > self.max_head_bytes {
                            self.stop();
                        }
                        return;
                    };
                    self.guard.push(Ok(()));
                    let used = len - (self.pending.len() - if fresh { 0 } else { data.len() });
                    self.pending.clear();
                    data = &data[used..];
                    self.follow = match framing {
                        Framing::Length(0) => Follow::Head,
                        Framing::Length(n) => Follow::Body(n),
                        Framing::Chunked => Follow::Chunked(Chunk::Start),
                    };
                }
                Follow::Body(left) => {
                    let skip = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    data = &data[skip..];
                    let left = left - skip as u64;
                    self.follow = if left == 0 {
                        Follow::Head
                    } else {
                        Follow::Body(left)
                    };
                }
                Follow::Chunked(Chunk::Data(left)) => {
                    let skip = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    data = &data[skip..];
                    let left = left - skip as u64;
                    self.follow = Follow::Chunked(if left == 0 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data(left)
                    });
                }
                Follow::Chunked(state) => {
                    self.follow = match self.chunk_byte(state, data[0]) {
                        Some(next) => next,
                        None => Follow::Off,
                    };
                    data = &data[1..];
                }
            }
        }
    }

    /// One byte of a chunked body outside chunk data; `None` where hyper's decoder
    /// fails too (the connection is ending).
    fn chunk_byte(&mut self, state: Chunk, b: u8) -> Option<Follow> {
        let digit = |b: u8| (b as char).to_digit(16).map(u64::from);
        let next = match (state, b) {
            (Chunk::Start, b) => {
                self.chunk_size = digit(b)?;
                Chunk::Size
            }
            (Chunk::Size, b) if digit(b).is_some() => {
                self.chunk_size = self.chunk_size.checked_mul(16)?.checked_add(digit(b)?)?;
                Chunk::Size
            }
            (Chunk::Size | Chunk::SizeLws, b'\t' | b' ') => Chunk::SizeLws,
            (Chunk::Size | Chunk::SizeLws, b';') => Chunk::Extension,
            (Chunk::Size | Chunk::SizeLws | Chunk::Extension, b'\r') => Chunk::SizeLf,
            (Chunk::Extension, b'\n') => return None,
            (Chunk::Extension, _) => Chunk::Extension,
            (Chunk::SizeLf, b'\n') if self.chunk_size == 0 => Chunk::EndCr,
            (Chunk::SizeLf, b'\n') => Chunk::Data(self.chunk_size),
            (Chunk::DataCr, b'\r') => Chunk::DataLf,
            (Chunk::DataLf, b'\n') => Chunk::Start,
            (Chunk::EndCr, b'\r') => Chunk::EndLf,
            (Chunk::Trailer, b'\r') => Chunk::TrailerLf,
            (Chunk::EndCr | Chunk::Trailer, _) => Chunk::Trailer,
            (Chunk::TrailerLf, b'\n') => Chunk::EndCr,
            (Chunk::EndLf, b'\n') => return Some(Follow::Head),
            _ => return None,
        };
        Some(Follow::Chunked(next))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for HeadGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.follow != Follow::Off && matches!(polled, Poll::Ready(Ok(()))) {
            let this = &mut *self;
            this.feed(&buf.filled()[before..]);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeadGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if self.frames_out.is_some()
            && let Poll::Ready(Ok(n)) = written
        {
            self.wrote(&buf[..n]);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if self.frames_out.is_some()
            && let Poll::Ready(Ok(mut n)) = written
        {
            for buf in bufs {
                let take = n.min(buf.len());
                self.wrote(&buf[..take]);
                n -= take;
                if n == 0 {
                    break;
                }
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn follow(chunks: &[&[u8]]) -> (Vec<Verdict>, Follow) {
        let guard = Arc::new(ConnGuard::default());
        let mut head_guard = HeadGuard::new(tokio::io::empty(), Arc::clone(&guard), 65536);
        for chunk in chunks {
            head_guard.feed(chunk);
        }
        let verdicts = lock(&guard.verdicts).iter().copied().collect();
        (verdicts, head_guard.follow)
    }

    #[test]
    fn every_head_gets_a_verdict_across_bodies_and_split_reads() {
        let stream: &[u8] = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n\
            POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
            POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            5;ext=1\r\nhello\r\n3 \r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n\
            GET /d HTTP/1.1\r\nHost: a\r\n\r\n";
        let (all_at_once, state) = follow(&[stream]);
        assert_eq!(all_at_once, vec![Ok(()); 4]);
        assert_eq!(state, Follow::Head);
        // The same bytes one at a time: the same verdicts.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(follow(&bytes), (all_at_once, Follow::Head));
    }

    #[test]
    fn a_smuggled_head_is_refused_even_behind_a_body_and_the_guard_stops() {
        let stream: &[u8] = b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi\
            POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
            GET /d HTTP/1.1\r\nHost: a\r\n\r\n";
        let (verdicts, state) = follow(&[stream]);
        assert_eq!(verdicts, vec![Ok(()), Err(RefusalReason::LengthAndChunked)]);
        assert_eq!(state, Follow::Off);
    }

    #[test]
    fn http2_and_lost_threads_turn_the_guard_off() {
        let (verdicts, state) = follow(&[&H2_PREFACE[..3], &H2_PREFACE[3..], b"more"]);
        assert_eq!((verdicts, state), (vec![], Follow::Off));
        // "PR" then not the preface: an HTTP/1 head after all.
        let (verdicts, _) = follow(&[b"PR", b"OPFIND / HTTP/1.1\r\nHost: a\r\n\r\n"]);
        assert_eq!(verdicts, vec![Ok(())]);
        // A chunk size line hyper would refuse.
        let bad = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert_eq!(follow(&[bad]), (vec![Ok(())], Follow::Off));
        // A head past the buffer limit.
        let guard = Arc::new(ConnGuard::default());
        let mut head_guard = HeadGuard::new(tokio::io::empty(), Arc::clone(&guard), 64);
        head_guard.feed(format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(100)).as_bytes());
        assert_eq!(head_guard.follow, Follow::Off);
        assert_eq!(guard.next_verdict(), None);
    }

    #[test]
    fn hyper_refused_heads_are_left_for_the_connection_to_count() {
        let guard = ConnGuard::default();
        guard.push(Ok(()));
        guard.push(Err(RefusalReason::Malformed));
        assert_eq!(guard.next_verdict(), Some(Ok(())));
        assert_eq!(guard.unanswered_refusals(), vec![RefusalReason::Malformed]);
        assert_eq!(guard.next_verdict(), None);
    }
}
