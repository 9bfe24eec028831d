//! The composition root: a node with its public API and its peer API served on listeners the
//! caller bound.
//!
//! Like every server in fencegate it takes bound listeners (tests bind `127.0.0.1:0`) and a
//! shutdown future.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::api;
use crate::node::{self, Node, NodeConfig, NodeError, RunningNode};

/// How long in-flight calls (long-polls) may run on after shutdown before they are cut.
const DRAIN: Duration = Duration::from_secs(2);

/// A node serving its API. It stops when the shutdown future given to [`start`] completes,
/// or when [`NodeHandle::shutdown`] is called.
pub struct NodeHandle {
    pub node: Arc<Node>,
    /// The public API's address.
    pub addr: SocketAddr,
    /// The peer listener's address.
    pub peer_addr: SocketAddr,
    stop_tx: oneshot::Sender<()>,
    server: JoinHandle<()>,
    running: RunningNode,
}

/// Opens the node in `config.data_dir`, starts raft, serves the public API on `listener` and
/// the peer API on `peer_listener` until `shutdown` completes.
pub async fn start(
    config: NodeConfig,
    listener: TcpListener,
    peer_listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<NodeHandle, NodeError> {
    let addr = listener.local_addr()?;
    let peer_addr = peer_listener.local_addr()?;
    let secret = config.require_peer_secret()?;
    // A certificate that cannot be loaded stops the start, before anything is opened.
    let tls = config
        .tls
        .as_ref()
        .map(api::listen::tls_acceptor)
        .transpose()?;
    let running = node::start(config, addr, peer_addr).await?;
    let node = running.node.clone();
    let (stop_tx, stop_rx) = oneshot::channel();
    let (fired_tx, mut fired_rx) = watch::channel(false);
    let mut peer_fired = fired_rx.clone();
    let stopping = node.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop_rx => {}
        }
        stopping.begin_stopping();
        let _ = fired_tx.send(true);
    };
    let peer_stop = async move {
        let _ = peer_fired.wait_for(|fired| *fired).await;
    };
    let drain_over = async move {
        let _ = fired_rx.wait_for(|fired| *fired).await;
        tokio::time::sleep(DRAIN).await;
    };
    let api_node = node.clone();
    let server = tokio::spawn(async move {
        let served = async {
            let (public, peers) = tokio::join!(
                api::serve(api_node.clone(), listener, tls, stop),
                api::serve_peers(api_node, secret, peer_listener, peer_stop),
            );
            for (what, served) in [("API", public), ("peer", peers)] {
                if let Err(e) = served {
                    tracing::error!(error = %e, "{what} server stopped");
                }
            }
        };
        tokio::select! {
            _ = served => {}
            _ = drain_over => tracing::debug!("drain time over; remaining calls cut"),
        }
    });
    Ok(NodeHandle {
        node,
        addr,
        peer_addr,
        stop_tx,
        server,
        running,
    })
}

impl NodeHandle {
    /// Stops serving (in-flight calls get a moment to finish), then stops raft.
    pub async fn shutdown(self) {
        let NodeHandle {
            stop_tx,
            server,
            running,
            ..
        } = self;
        let _ = stop_tx.send(());
        finish(server, running).await;
    }

    /// Waits until the node has stopped, after its shutdown future completed.
    pub async fn stopped(self) {
        finish(self.server, self.running).await;
    }

    /// Simulates a crash: everything stops at once, nothing is flushed beyond what was
    /// already acknowledged as durable.
    pub async fn crash(self) {
        self.server.abort();
        self.running.stop().await;
    }
}

/// The server task ends once its shutdown future completed and in-flight calls finished, or
/// the drain time is over; raft stops after it.
async fn finish(server: JoinHandle<()>, running: RunningNode) {
    let _ = server.await;
    running.stop().await;
}
