//! One deadline for the whole upstream send of a fenced write.
//!
//! pingora bounds each upstream write by its own fresh timeout, flushes the end of a chunked
//! body with none, and queues body chunks in a pipe between the client and the upstream
//! connection. Against an upstream that reads slowly, those bounds add up: the last bytes of a
//! request could reach the store after the write's grant ended. A fenced write therefore
//! registers its upstream connection here with its send-by instant; if the upstream has not
//! answered by then, the watchdog resets the connection. A reset discards whatever the kernel
//! still holds for the store and fails pingora's pending write at once, so the store is left
//! with an incomplete request, which an HTTP store never applies. A fenced write that ends
//! unanswered for any other reason (a read timeout, the client going away) resets its
//! connection the same way: a plain close would let the kernel go on delivering the queued
//! rest of the request, however late.
//!
//! The watchdog holds its own duplicate of the connection's descriptor from registration
//! until the request is answered or over: it can never act on a descriptor number pingora
//! has closed and the kernel has handed to another connection since.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// How often the watchdog looks for expired sends. A send is cut at the first look at or
/// after its send-by minus one tick: up to a tick early, never late (while the runtime runs).
pub const TICK: Duration = Duration::from_millis(5);
/// Shards of the deadline queue, so that registrations from different worker threads rarely
/// meet on one lock.
const SHARDS: usize = 8;

/// The deadlines of every fenced write in flight to an upstream.
pub struct SendWatchdog {
    shards: Vec<parking_lot::Mutex<BinaryHeap<Entry>>>,
    /// Wakes an idle watchdog (every shard empty) when a send is registered.
    registered: tokio::sync::Notify,
}

struct Entry {
    send_by: Reverse<Instant>,
    watch: Arc<SendWatch>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.send_by == other.send_by
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.send_by.cmp(&other.send_by)
    }
}

/// One registered send.
pub struct SendWatch {
    /// The duplicate descriptor while the send may still be cut; `None` once it was answered,
    /// finished or cut.
    fd: parking_lot::Mutex<Option<OwnedFd>>,
    cut: AtomicBool,
}

/// Held by the request until it is over; dropped unanswered, it resets the connection.
pub struct SendGuard(Arc<SendWatch>);

impl SendGuard {
    /// The upstream answered: every byte of the request reached it, nothing is left to cut.
    pub fn answered(&self) {
        self.0.disarm();
    }

    /// Whether the watchdog reset the upstream connection.
    pub fn was_cut(&self) -> bool {
        self.0.cut.load(Ordering::Acquire)
    }
}

impl Drop for SendGuard {
    fn drop(&mut self) {
        // Unanswered, pingora does not pool the connection and has closed (or is about to
        // close) its descriptor; ours keeps the socket open until the reset below.
        self.0.cut();
    }
}

impl SendWatch {
    fn disarm(&self) {
        drop(self.fd.lock().take());
    }

    /// Resets the connection unless the request was answered (or cut) before.
    ///
    /// The mark is set before the reset: the request's own task, woken by the reset on another
    /// thread, may ask `was_cut` before this call returns from the kernel.
    fn cut(&self) {
        let mut fd = self.fd.lock();
        if let Some(owned) = fd.take() {
            self.cut.store(true, Ordering::Release);
            if let Err(e) = reset(owned.as_raw_fd()) {
                self.cut.store(false, Ordering::Release);
                tracing::warn!(error = %e, "could not reset an upstream connection past its send-by");
            }
        }
    }
}

impl Default for SendWatchdog {
    fn default() -> Self {
        SendWatchdog {
            shards: (0..SHARDS)
                .map(|_| parking_lot::Mutex::new(BinaryHeap::new()))
                .collect(),
            registered: tokio::sync::Notify::new(),
        }
    }
}

impl SendWatchdog {
    /// Watches the upstream connection `fd` of a fenced write until the returned guard says it
    /// was answered or is dropped.
    pub fn watch(&self, fd: RawFd, send_by: Instant) -> std::io::Result<SendGuard> {
        // SAFETY: pingora passes the descriptor of the connection it is about to use for this
        // request, open for the duration of the call; it is only borrowed to duplicate it.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
        let watch = Arc::new(SendWatch {
            fd: parking_lot::Mutex::new(Some(dup)),
            cut: AtomicBool::new(false),
        });
        let was_empty = {
            let mut heap = self.shards[fd as usize % SHARDS].lock();
            let was_empty = heap.is_empty();
            heap.push(Entry {
                send_by: Reverse(send_by),
                watch: watch.clone(),
            });
            was_empty
        };
        if was_empty {
            self.registered.notify_one();
        }
        Ok(SendGuard(watch))
    }

    /// Cuts every watched send whose send-by falls before the next look.
    fn sweep(&self, now: Instant) {
        let horizon = now + TICK;
        for shard in &self.shards {
            loop {
                let due = {
                    let mut heap = shard.lock();
                    match heap.peek() {
                        Some(e) if e.send_by.0 <= horizon => heap.pop(),
                        _ => None,
                    }
                };
                match due {
                    Some(e) => e.watch.cut(),
                    None => break,
                }
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }

    /// Runs the watchdog until the task is dropped: a look every tick while sends are
    /// registered (an entry stays until its send-by, answered or not), none while idle.
    pub async fn run(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.is_idle() {
                // A registration after the check leaves a permit, so this cannot miss it.
                self.registered.notified().await;
                ticks.reset();
            }
            let now = ticks.tick().await;
            self.sweep(now);
        }
    }
}

/// Aborts a TCP connection: `connect(AF_UNSPEC)` disconnects the socket, which sends a reset
/// and drops the data still queued for the peer (a plain `shutdown` would deliver it first).
/// pingora's pending read or write on the connection fails with the reset.
fn reset(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: `sockaddr` is plain data; an all-zero one with family AF_UNSPEC is what the
    // disconnect form of connect(2) reads, and `fd` is our own open duplicate.
    let rc = unsafe {
        let mut addr: nix::libc::sockaddr = std::mem::zeroed();
        addr.sa_family = nix::libc::AF_UNSPEC as nix::libc::sa_family_t;
        nix::libc::connect(
            fd,
            &addr,
            std::mem::size_of::<nix::libc::sockaddr>() as nix::libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A connected client and server socket on 127.0.0.1.
    async fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// A reset connection delivers nothing more: the peer sees the connection end with the
    /// bytes written after the reset missing, and the writer's next write fails.
    #[tokio::test]
    async fn a_cut_send_resets_the_connection() {
        let (mut client, mut server) = connected_pair().await;
        let dog = SendWatchdog::default();
        let guard = dog
            .watch(
                client.as_raw_fd(),
                Instant::now() - Duration::from_millis(1),
            )
            .unwrap();
        client.write_all(b"before").await.unwrap();
        let mut buf = [0u8; 6];
        server.read_exact(&mut buf).await.unwrap();
        dog.sweep(Instant::now());
        assert!(guard.was_cut());
        assert!(client.write_all(b"after").await.is_err());
        let mut rest = Vec::new();
        let got = server.read_to_end(&mut rest).await;
        assert!(got.is_err() || rest.is_empty(), "{got:?} {rest:?}");
    }

    /// A send that ends unanswered is reset, not closed: nothing queued is delivered later.
    #[tokio::test]
    async fn an_unanswered_send_is_reset_when_it_ends() {
        let (mut client, mut server) = connected_pair().await;
        let dog = SendWatchdog::default();
        let guard = dog
            .watch(client.as_raw_fd(), Instant::now() + Duration::from_secs(60))
            .unwrap();
        client.write_all(b"head").await.unwrap();
        drop(guard);
        drop(client);
        let mut rest = Vec::new();
        let got = server.read_to_end(&mut rest).await;
        assert!(
            got.is_err(),
            "a reset, not an orderly end: {got:?} {rest:?}"
        );
    }

    /// The running watchdog, idle until then, wakes for a registration and cuts the send once
    /// its send-by has come (the peer sees the reset).
    #[tokio::test]
    async fn an_idle_watchdog_wakes_and_cuts_at_send_by() {
        let (client, mut server) = connected_pair().await;
        let dog = Arc::new(SendWatchdog::default());
        let running = tokio::spawn(dog.clone().run());
        tokio::task::yield_now().await;
        let send_by = Instant::now() + Duration::from_millis(50);
        let guard = dog.watch(client.as_raw_fd(), send_by).unwrap();
        let mut rest = Vec::new();
        let got = server.read_to_end(&mut rest).await;
        assert!(got.is_err(), "{got:?}");
        assert!(guard.was_cut());
        assert!(
            Instant::now() + TICK >= send_by,
            "cut more than a tick early"
        );
        running.abort();
    }

    /// Whoever sees the reset sees the send marked as cut: a reader blocked on the connection
    /// on another thread asks at once when its read fails, many times over.
    #[test]
    fn a_reader_woken_by_the_reset_sees_the_cut() {
        use std::io::Read;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dog = SendWatchdog::default();
        for round in 0..300 {
            let (client, _server) = rt.block_on(connected_pair());
            let mut client = client.into_std().unwrap();
            client.set_nonblocking(false).unwrap();
            let guard = Arc::new(
                dog.watch(client.as_raw_fd(), Instant::now() + Duration::from_secs(60))
                    .unwrap(),
            );
            let reader = std::thread::spawn({
                let guard = guard.clone();
                move || {
                    let mut buf = [0u8; 1];
                    let got = client.read(&mut buf);
                    (got.map_err(|e| e.kind()), guard.was_cut())
                }
            });
            // Let the reader block in its read before the reset.
            std::thread::sleep(Duration::from_micros(200));
            guard.0.cut();
            let (got, seen) = reader.join().unwrap();
            assert!(got.is_err() || got == Ok(0), "round {round}: {got:?}");
            assert!(
                seen,
                "round {round}: the reader saw the reset before the mark"
            );
        }
    }

    /// An answered send is never cut, however late the sweep.
    #[tokio::test]
    async fn an_answered_send_is_left_alone() {
        let (mut client, mut server) = connected_pair().await;
        let dog = SendWatchdog::default();
        let guard = dog.watch(client.as_raw_fd(), Instant::now()).unwrap();
        guard.answered();
        dog.sweep(Instant::now() + Duration::from_secs(1));
        assert!(!guard.was_cut());
        client.write_all(b"still open").await.unwrap();
        let mut buf = [0u8; 10];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"still open");
    }
}
