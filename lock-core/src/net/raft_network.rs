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
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
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
    max_append_bytes: usize,
    heartbeat: Duration,
}

impl NetworkFactory {
    /// Clients of the peers through `client`. `peer_body_limit` is the largest body a peer
    /// port accepts (this node's own, as members share their limits): appends are kept to half
    /// of it.
    pub fn new(client: PeerClient, peer_body_limit: usize, heartbeat: Duration) -> Self {
        Self {
            client,
            max_append_bytes: (peer_body_limit / 2).max(1),
            heartbeat,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerNetwork {
        PeerNetwork {
            client: self.client.clone(),
            target,
            node: node.clone(),
            max_append_bytes: self.max_append_bytes,
            heartbeat: self.heartbeat,
        }
    }
}

pub struct PeerNetwork {
    client: PeerClient,
    target: u64,
    node: NodeInfo,
    /// The largest append body sent; see [`fewer_entries`].
    max_append_bytes: usize,
    /// The cluster's heartbeat interval: the first retry after a failed call.
    heartbeat: Duration,
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

    /// POSTs an encoded body to `path` and decodes the reply.
    async fn send_frame<Resp: DeserializeOwned>(
        &self,
        path: &str,
        frame: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, PeerError> {
        let bytes = self
            .client
            .post_frame(
                self.target,
                self.node.peer_addr(),
                path,
                frame,
                timeout(option),
            )
            .await?;
        codec::decode(&bytes).map_err(|e| self.codec_error(e))
    }

    fn codec_error(&self, source: codec::CodecError) -> PeerError {
        PeerError::Codec {
            node: self.target,
            source,
        }
    }

    /// Turns a reply into openraft's error kinds: a remote raft error stays remote, a refused
    /// authentication makes the peer unreachable, another bad status or an undecodable body is
    /// a network error, anything else makes the peer unreachable.
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
            // A peer that refuses our authentication (another cluster's secret) is as good as
            // unreachable: openraft then backs off instead of retrying at once, thousands of
            // times a second.
            Err(e @ PeerError::Status { status: 401, .. }) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e @ (PeerError::Status { .. } | PeerError::Codec { .. })) => {
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&e))),
        }
    }
}

/// The longest pause between replication attempts to an unreachable peer.
const MAX_BACKOFF: Duration = Duration::from_millis(800);

/// How many entries to send instead, if an append of `entries` encoded as `body_len` bytes is
/// over `max_bytes`: openraft then sends that many for the next appends. Without it, entries
/// of full batches of long names could make an append the receiver refuses (413) every time
/// it is retried, and a follower that fell that far behind would never catch up. A single
/// entry is sent whatever its size (a batch is bounded well under the limit).
fn fewer_entries(entries: usize, body_len: usize, max_bytes: usize) -> Option<u64> {
    if body_len <= max_bytes || entries <= 1 {
        return None;
    }
    let fitting = (entries as u128 * max_bytes as u128 / body_len as u128) as u64;
    Some(fitting.clamp(1, entries as u64 / 2))
}

fn timeout(option: &RPCOption) -> Duration {
    option.hard_ttl().max(Duration::from_millis(50))
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, NodeInfo, RaftError<u64>>> {
        let body = match codec::encode(&rpc) {
            Ok(body) => body,
            Err(e) => return self.settle(Err(self.codec_error(e))),
        };
        if let Some(hint) = fewer_entries(rpc.entries.len(), body.len(), self.max_append_bytes) {
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        let sent = std::time::Instant::now();
        let reply = self.send_frame("/raft/append", body, &option).await;
        self.client.append_took(self.target, sent.elapsed());
        self.settle(reply)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, NodeInfo, RaftError<u64, InstallSnapshotError>>,
    > {
        let reply = match codec::encode_snapshot_chunk(&rpc) {
            Ok(frame) => self.send_frame("/raft/snapshot", frame, &option).await,
            Err(e) => Err(self.codec_error(e)),
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
        // up to `MAX_BACKOFF` (or the heartbeat, if that is longer): a node that stays down
        // costs a connection attempt (and an openraft error line) every 800 ms instead of ten
        // a second, and is found within 800 ms of its restart.
        let first = self.heartbeat;
        let most = MAX_BACKOFF.max(first);
        openraft::network::Backoff::new(std::iter::successors(Some(first), move |d| {
            Some((*d * 2).min(most))
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    use super::*;
    use crate::machine::{Batch, Command};
    use crate::net::auth::PeerSecret;
    use crate::net::faults::FaultLayer;

    /// An append of `n` entries, each a batch of releases of long resource names.
    fn append(n: u64) -> AppendEntriesRequest<TypeConfig> {
        let entries = (1..=n)
            .map(|i| Entry::<TypeConfig> {
                log_id: LogId::new(CommittedLeaderId::new(2, 1), i),
                payload: EntryPayload::Normal(Batch::new(
                    5,
                    7,
                    (0..8)
                        .map(|c| Command::Release {
                            resource: format!("kv:{}:{i}:{c}", "r".repeat(200)),
                            lease_id: crate::wire::LeaseId(u128::from(i)),
                        })
                        .collect(),
                )),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        }
    }

    /// A network to a peer address nothing listens on (a port just bound and released),
    /// sending appends up to `max_bytes`.
    fn network(max_bytes: usize) -> PeerNetwork {
        let secret = PeerSecret::new(&PeerSecret::generate()).expect("secret");
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .to_string();
        PeerNetwork {
            client: PeerClient::new(1, FaultLayer::new(), secret),
            target: 2,
            node: NodeInfo {
                api_addr: addr.clone(),
                peer_addr: addr,
            },
            max_append_bytes: max_bytes,
            heartbeat: Duration::from_millis(crate::timing::HEARTBEAT_MS),
        }
    }

    #[test]
    fn a_peer_refusing_our_secret_is_unreachable_so_openraft_backs_off() {
        let net = network(1 << 20);
        // Which kind of error an answer of `status` becomes.
        let kind = |status: u16| {
            let reply: Result<Result<(), RaftError<u64>>, PeerError> = Err(PeerError::Status {
                node: 2,
                status,
                body: "peer authentication tag does not match".into(),
            });
            match net.settle(reply) {
                Err(RPCError::Unreachable(_)) => "unreachable",
                Err(RPCError::Network(_)) => "network",
                _ => "other",
            }
        };
        assert_eq!(kind(401), "unreachable");
        assert_eq!(kind(500), "network");
    }

    #[test]
    fn fewer_entries_scales_to_the_bound_and_at_least_halves() {
        assert_eq!(fewer_entries(256, 1_000, 1_000), None);
        assert_eq!(fewer_entries(1, 10_000, 1_000), None);
        // Four times over: a quarter fits.
        assert_eq!(fewer_entries(256, 4_000, 1_000), Some(64));
        // Just over: still halved, so the next attempt is under the bound.
        assert_eq!(fewer_entries(256, 1_001, 1_000), Some(128));
        // Far over: one at a time rather than none.
        assert_eq!(fewer_entries(256, 1 << 40, 1_000), Some(1));
    }

    #[tokio::test]
    async fn an_append_over_the_body_bound_asks_for_fewer_entries_and_sends_nothing() {
        let req = append(64);
        let body = codec::encode(&req).expect("encode").len();
        let mut net = network(body / 3);
        let option = RPCOption::new(Duration::from_millis(500));
        match net.append_entries(req, option).await {
            Err(RPCError::PayloadTooLarge(e)) => {
                assert!(
                    (1..=21).contains(&e.entries_hint()),
                    "hint {} for a third of the bytes",
                    e.entries_hint()
                );
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        // Under the bound the same append is sent: nothing listens, so the peer is unreachable.
        let mut net = network(body);
        let option = RPCOption::new(Duration::from_millis(500));
        match net.append_entries(append(64), option).await {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }
}
