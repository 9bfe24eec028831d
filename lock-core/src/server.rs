//! The composition root: a node with its API served on a listener the caller bound.
//!
//! Like every server in fencegate it takes a bound listener (tests bind `127.0.0.1:0`) and a
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
    pub addr: SocketAddr,
    stop_tx: oneshot::Sender<()>,
    server: JoinHandle<()>,
    running: RunningNode,
}

/// Opens the node in `config.data_dir`, starts raft and serves the API on `listener` until
/// `shutdown` completes.
pub async fn start(
    config: NodeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<NodeHandle, NodeError> {
    let addr = listener.local_addr()?;
    let running = node::start(config, addr).await?;
    let node = running.node.clone();
    let (stop_tx, stop_rx) = oneshot::channel();
    let (fired_tx, mut fired_rx) = watch::channel(false);
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop_rx => {}
        }
        let _ = fired_tx.send(true);
    };
    let drain_over = async move {
        let _ = fired_rx.wait_for(|fired| *fired).await;
        tokio::time::sleep(DRAIN).await;
    };
    let api_node = node.clone();
    let server = tokio::spawn(async move {
        tokio::select! {
            served = api::serve(api_node, listener, stop) => {
                if let Err(e) = served {
                    tracing::error!(error = %e, "API server stopped");
                }
            }
            _ = drain_over => tracing::debug!("drain time over; remaining calls cut"),
        }
    });
    Ok(NodeHandle {
        node,
        addr,
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
