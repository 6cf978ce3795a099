//! A client connection's socket as the listener reads it: every read and write
//! counted into the connection's [`Activity`] ([`CountingIo`]), and the first request
//! head read into a small buffer of its own before hyper sees the connection
//! ([`read_first_head`], replayed by [`Prefixed`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;

/// A connection's socket, counting reads and writes into its [`Activity`].
pub(crate) struct CountingIo<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T> CountingIo<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Self {
        CountingIo { io, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            Activity::bump(&self.activity.reads);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> CountingIo<T> {
    fn wrote(&self, result: &Poll<io::Result<usize>>) {
        match result {
            Poll::Pending => self.activity.write_blocked.store(true, Ordering::Relaxed),
            Poll::Ready(Ok(n)) if *n > 0 => {
                Activity::bump(&self.activity.writes);
                if self.activity.write_blocked.load(Ordering::Relaxed) {
                    self.activity.write_blocked.store(false, Ordering::Relaxed);
                }
            }
            Poll::Ready(_) => {}
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Reads a connection's first request head (or the HTTP/2 preface) into a small
/// buffer of its own, before hyper sees the connection: a client that trickles its
/// head in costs this buffer and a cheap scan per read, not hyper's 8-16 KiB read
/// buffer and a re-parse per read. Returns what was read (the head, and whatever
/// followed it in the same reads) for [`Prefixed`] to replay; at EOF, at `max`
/// bytes (hyper then answers 431) or on an error, what there is.
pub(crate) async fn read_first_head<T: AsyncRead + Unpin>(io: &mut T, max: usize) -> Bytes {
    use tokio::io::AsyncReadExt;
    let mut buf = bytes::BytesMut::with_capacity(1024);
    loop {
        if buf.capacity() - buf.len() < 256 {
            buf.reserve(buf.capacity().max(1024));
        }
        let scanned = buf.len().saturating_sub(2);
        match io.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return buf.freeze(),
            Ok(_) => {}
        }
        if head_ends_in(&buf[scanned..]) || buf.len() >= max {
            return buf.freeze();
        }
    }
}

/// Whether `bytes` hold the empty line that ends a head: CRLF CRLF, or the bare LF
/// endings parsers also accept. (The HTTP/2 preface ends in one too.)
fn head_ends_in(bytes: &[u8]) -> bool {
    let mut from = 0;
    while let Some(i) = bytes[from..].iter().position(|&b| b == b'\n') {
        let at = from + i;
        match bytes.get(at + 1) {
            Some(b'\n') => return true,
            Some(b'\r') if bytes.get(at + 2) == Some(&b'\n') => return true,
            _ => from = at + 1,
        }
    }
    false
}

/// A connection's IO with bytes already read from it ([`read_first_head`]) put back
/// in front.
pub(crate) struct Prefixed<T> {
    prefix: Bytes,
    io: T,
}

impl<T> Prefixed<T> {
    pub(crate) fn new(prefix: Bytes, io: T) -> Self {
        Prefixed { prefix, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn the_first_head_is_read_whole_and_replayed_with_what_followed() {
        let (mut client, server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut server = server;
            let head = read_first_head(&mut server, 64 * 1024).await;
            (head, server)
        });
        // A head in pieces, a body after it in the last piece.
        for piece in ["GET / HTTP/1.1\r\n", "host: a\r", "\n\r", "\nbody"] {
            tokio::io::AsyncWriteExt::write_all(&mut client, piece.as_bytes())
                .await
                .unwrap();
            tokio::task::yield_now().await;
        }
        let (head, server) = reader.await.unwrap();
        assert!(head.starts_with(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"));
        tokio::io::AsyncWriteExt::write_all(&mut client, b" more")
            .await
            .unwrap();
        drop(client);
        let mut replayed = Vec::new();
        Prefixed::new(head, server)
            .read_to_end(&mut replayed)
            .await
            .unwrap();
        assert_eq!(replayed, b"GET / HTTP/1.1\r\nhost: a\r\n\r\nbody more");
    }

    #[test]
    fn a_head_ends_at_its_empty_line_whatever_the_line_endings() {
        assert!(head_ends_in(b"a\r\n\r\n"));
        assert!(head_ends_in(b"a\n\n"));
        assert!(head_ends_in(b"a\n\r\n"));
        assert!(head_ends_in(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert!(!head_ends_in(b"GET / HTTP/1.1\r\nhost: a\r\n"));
        assert!(!head_ends_in(b"\r\r"));
    }
}
