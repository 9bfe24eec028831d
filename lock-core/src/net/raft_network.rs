//! openraft's network traits over [`PeerClient`]: one HTTP POST per RPC.
//!
//! Snapshots go the way openraft sends them by default: one `install_snapshot` call per chunk
//! of `snapshot_max_chunk_size` bytes, so a snapshot of any size crosses in bounded requests.
//! Each chunk is framed with its bytes raw (see [`codec`](super::codec)).
//!
//! The receiving side is `api::raft_rpc`. Replies carry the remote `Result` so a
//! remote raft error (e.g. a higher vote) reaches openraft as a `RemoteError`, while transport
//! failures and injected drops become `Unreachable`, which openraft retries with backoff.

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{de::DeserializeOwned, Serialize};

use super::codec;
use super::peer_client::{PeerClient, PeerError};
use crate::raft::{NodeInfo, TypeConfig};

#[derive(Clone)]
pub struct NetworkFactory {
    client: PeerClient,
}

impl NetworkFactory {
    pub fn new(client: PeerClient) -> Self {
        Self { client }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerNetwork {
        PeerNetwork {
            client: self.client.clone(),
            target,
            node: node.clone(),
        }
    }
}

pub struct PeerNetwork {
    client: PeerClient,
    target: u64,
    node: NodeInfo,
}

impl PeerNetwork {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, NodeInfo, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply = self
            .client
            .post(
                self.target,
                self.node.peer_addr(),
                path,
                req,
                timeout(option),
            )
            .await;
        self.settle(reply)
    }

    /// Turns a reply into openraft's error kinds: a remote raft error stays remote, a bad
    /// status or undecodable body is a network error, anything else makes the peer unreachable.
    // The error type is the one openraft's network trait returns; boxing it here would only
    // move the unboxing into every caller.
    #[allow(clippy::result_large_err)]
    fn settle<Resp, E>(
        &self,
        reply: Result<Result<Resp, E>, PeerError>,
    ) -> Result<Resp, RPCError<u64, NodeInfo, E>>
    where
        E: std::error::Error,
    {
        match reply {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                remote,
            ))),
            Err(e @ (PeerError::Status { .. } | PeerError::Codec { .. })) => {
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }
}

/// The longest pause between replication attempts to an unreachable peer.
const MAX_BACKOFF: Duration = Duration::from_millis(800);

fn timeout(option: &RPCOption) -> Duration {
    option.hard_ttl().max(Duration::from_millis(50))
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64>>> {
        self.call("/raft/append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, NodeInfo, RaftError<u64, InstallSnapshotError>>,
    > {
        let codec_error = |source| PeerError::Codec {
            node: self.target,
            source,
        };
        let frame = codec::encode_snapshot_chunk(&rpc).map_err(codec_error);
        let reply = match frame {
            Ok(frame) => self
                .client
                .post_frame(
                    self.target,
                    self.node.peer_addr(),
                    "/raft/snapshot",
                    frame,
                    timeout(&option),
                )
                .await
                .and_then(|bytes| codec::decode(&bytes).map_err(codec_error)),
            Err(e) => Err(e),
        };
        self.settle(reply)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64>>> {
        self.call("/raft/vote", &rpc, &option).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // Starts at a heartbeat, so a node back from a short blip rejoins at once, and doubles
        // up to `MAX_BACKOFF`: a node that stays down costs a connection attempt (and an
        // openraft error line) every 800 ms instead of ten a second, and is found within
        // 800 ms of its restart.
        let first = Duration::from_millis(crate::timing::HEARTBEAT_MS);
        openraft::network::Backoff::new(std::iter::successors(Some(first), |d| {
            Some((*d * 2).min(MAX_BACKOFF))
        }))
    }
}
