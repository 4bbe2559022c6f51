//! What bounds every ops server: how long a client may take to send its request head, how long a
//! connection may sit without moving a byte, how large a head may be, how many connections are
//! served at once, and how the accept loop waits after an accept error.
//!
//! Counterparts: Go's `net/http.Server` fields as controller-runtime's metrics server sets them
//! (`pkg/metrics/server`: `ReadHeaderTimeout` 32 s, `IdleTimeout` 90 s, `MaxHeaderBytes` 1 MiB)
//! and the retry in `net/http.(*Server).Serve` (5 ms after an accept error, doubling to 1 s).
//!
//! Differences on purpose:
//! - Go has no connection cap; here each server serves at most [`ServerLimits::max_connections`]
//!   at once and leaves further connections in the kernel's listen backlog until one ends. A few
//!   hundred stalled clients then cost a few hundred sockets, never every descriptor the
//!   process has (its apiserver connections need some too).
//! - Go's `IdleTimeout` is the wait for the next request on a kept-alive connection. hyper 1.x
//!   already bounds that wait by the header-read timeout (its timer starts when hyper waits for a
//!   head, bytes or not), so [`IdleIo`] bounds what hyper leaves open: a connection on which no
//!   byte moves either way, e.g. a client that stops reading its response.
//! - The header-read timeout covers the TLS handshake too, as Go's `tlsHandshakeTimeout` takes
//!   `ReadHeaderTimeout` when no `ReadTimeout` is set.
//!
//! Invariant: [`Activity`] only moves forward; a connection is idle iff no read or write made
//! progress for the whole idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::backoff::Backoff;

/// The bounds of one ops server. `Default` is controller-runtime's metrics server plus the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// A client must have sent its whole request head (and finished the TLS handshake) this long
    /// after the server starts waiting for it, else the connection is closed. Go's
    /// `ReadHeaderTimeout`; controller-runtime: 32 s.
    pub read_header_timeout: Duration,
    /// A connection on which no byte is read or written for this long is closed. Go's
    /// `IdleTimeout`; controller-runtime: 90 s.
    pub idle_timeout: Duration,
    /// The largest request head accepted (431 beyond it). Go's `MaxHeaderBytes`;
    /// controller-runtime: 1 MiB.
    pub max_header_bytes: usize,
    /// Connections served at once; further ones wait in the listen backlog. 256: two servers
    /// stay well under the 1024 descriptors of a default soft `RLIMIT_NOFILE`, and a scraper or a
    /// kubelet uses one or two.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            read_header_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
            max_connections: 256,
        }
    }
}

/// The accept loop's wait after an error (EMFILE, ENFILE, ENOBUFS...): 5 ms, doubling up to
/// 1 s, back to 5 ms after a successful accept; as `net/http.(*Server).Serve`. A
/// [`Backoff`] with no jitter whose steps never run out before the cap.
#[derive(Debug, Clone)]
pub struct AcceptBackoff {
    backoff: Backoff,
}

impl AcceptBackoff {
    const FIRST: Backoff = Backoff {
        duration: Duration::from_millis(5),
        factor: 2.0,
        jitter: 0.0,
        steps: u32::MAX,
        cap: Some(Duration::from_secs(1)),
    };

    /// The wait after one more consecutive error.
    pub fn next_delay(&mut self) -> Duration {
        self.backoff.step()
    }

    /// An accept succeeded: the next error starts again at 5 ms.
    pub fn reset(&mut self) {
        self.backoff = Self::FIRST;
    }
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            backoff: Self::FIRST,
        }
    }
}

/// When a connection last moved a byte, shared between its [`IdleIo`] and the task that closes
/// it when idle.
#[derive(Debug, Clone)]
pub struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last read or write that moved bytes.
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    /// Activity starting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The instant of the last read or write that moved bytes.
    pub fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once the connection has moved no byte for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// A stream that records in its [`Activity`] every read or write that moved bytes.
pub struct IdleIo<S> {
    inner: S,
    activity: Activity,
}

impl<S> IdleIo<S> {
    /// Wraps `inner`, reporting to `activity`.
    pub fn new(inner: S, activity: Activity) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    // Go: net/http.(*Server).Serve's tempDelay (5 ms, doubled, capped at 1 s).
    #[test]
    fn accept_errors_wait_5ms_doubling_to_one_second_and_success_resets() {
        let mut backoff = AcceptBackoff::default();
        let delays: Vec<u64> = (0..10)
            .map(|_| backoff.next_delay().as_millis() as u64)
            .collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(5));
    }

    #[test]
    fn the_defaults_are_controller_runtimes() {
        let limits = ServerLimits::default();
        assert_eq!(limits.read_header_timeout, Duration::from_secs(32));
        assert_eq!(limits.idle_timeout, Duration::from_secs(90));
        assert_eq!(limits.max_header_bytes, 1024 * 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_after_no_byte_moved_for_the_whole_timeout() {
        let (a, mut b) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut io = IdleIo::new(a, activity.clone());
        let idle = Duration::from_secs(90);
        let started = Instant::now();

        tokio::time::sleep(Duration::from_secs(60)).await;
        b.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        io.read_exact(&mut byte).await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        io.write_all(b"y").await.unwrap();

        activity.idle_for(idle).await;
        assert_eq!(
            Instant::now() - started,
            Duration::from_secs(120 + 90),
            "idle counts from the last write, at 120 s"
        );
    }
}
