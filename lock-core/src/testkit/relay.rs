//! A TCP relay between one client and one node, for faults on the client's side of the network.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP relay standing in for the network between one client and one node. It can stall all
/// traffic (a partitioned client: requests hang, nothing is refused) and throw away the
/// answers on the next N connections (a lost response). Like a load balancer, it never passes
/// a client's hang-up on to the node: the node only learns a caller left if the caller says
/// so (e.g. with `cancel`).
pub struct TcpRelay {
    pub addr: String,
    stalled: watch::Sender<bool>,
    drop_answers: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TcpRelay {
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stalled, _) = watch::channel(false);
        let drop_answers = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let target = target.to_string();
            let stalled = stalled.clone();
            let drop_answers = drop_answers.clone();
            let connections = connections.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let discard = drop_answers
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    tokio::spawn(relay_connection(
                        client,
                        target.clone(),
                        stalled.subscribe(),
                        discard,
                    ));
                }
            }
        });
        TcpRelay {
            addr,
            stalled,
            drop_answers,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds every byte in both directions (on open and new connections) while `on`.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// The next `n` connections reach the node, but the node's answers on them are dropped.
    pub fn drop_answers_on_next(&self, n: usize) {
        self.drop_answers.store(n, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_connection(
    client: TcpStream,
    target: String,
    stalled: watch::Receiver<bool>,
    discard_answers: bool,
) {
    let Ok(server) = TcpStream::connect(&target).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        relay_pump(&mut client_read, &mut server_write, stalled.clone(), false).await;
        // Client hung up: keep the node's side open (see `TcpRelay`).
        std::future::pending::<()>().await;
    };
    let downstream = relay_pump(
        &mut server_read,
        &mut client_write,
        stalled.clone(),
        discard_answers,
    );
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

async fn relay_pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    mut stalled: watch::Receiver<bool>,
    discard: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if discard {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
