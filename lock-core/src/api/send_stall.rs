//! A connection whose client stops reading its answers is closed after a while.
//!
//! hyper bounds how long a client may take to send a request, not how long it may leave an
//! answer unread: a client that pipelines requests and never reads kept its connection (and
//! one of the listener's `max_connections` slots) for as long as it liked, the server's send
//! buffer full. [`SendStall`] fails a write that has made no progress for the listener's
//! `send_timeout_ms`; each byte the client takes starts the time again, so a slow reader of a
//! large answer (a backup) is not cut off while it reads.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub struct SendStall<S> {
    inner: S,
    timeout: Duration,
    /// Running while a write waits for the client to make room.
    stalled: Pin<Box<Sleep>>,
    waiting: bool,
}

impl<S> SendStall<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        SendStall {
            inner,
            timeout,
            stalled: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
        }
    }

    /// Judges a write's (or flush's) outcome: progress ends the wait, a pending write starts or
    /// continues it, and a wait past the timeout is an error that closes the connection.
    fn judge<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.waiting = false;
            return polled;
        }
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + self.timeout;
            self.stalled.as_mut().reset(deadline);
        }
        match self.stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendStall<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.judge(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.judge(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.judge(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A peer that reads nothing: the write stalls once the buffers are full, and fails after
    /// the timeout. A peer that reads slowly, but within the timeout each time, is served.
    #[tokio::test]
    async fn a_write_the_peer_never_takes_fails_after_the_timeout() {
        let timeout = Duration::from_millis(300);
        let (ours, _theirs) = tokio::io::duplex(1024);
        let mut conn = SendStall::new(ours, timeout);
        let chunk = [7u8; 512];
        let failed = async {
            loop {
                if let Err(e) = conn.write_all(&chunk).await {
                    return e;
                }
            }
        };
        let e = tokio::time::timeout(Duration::from_secs(10), failed)
            .await
            .expect("the stalled write failed");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);

        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut conn = SendStall::new(ours, timeout);
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 256];
            while got < 8 * 1024 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                got += theirs.read(&mut buf).await.expect("read");
            }
        });
        for _ in 0..16 {
            conn.write_all(&chunk)
                .await
                .expect("a slow reader is served");
        }
        reader.await.expect("reader");
    }
}
