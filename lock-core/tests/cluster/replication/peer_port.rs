//! Peer traffic lives on its own authenticated port: the public API does not serve it, and a
//! caller without the cluster secret is refused there before anything it sends takes effect.

use std::time::Duration;

use lock_core::machine::{Command, Proposal};
use lock_core::net::{codec, PeerSecret, AUTH_HEADER, FROM_HEADER};
use lock_core::raft::TypeConfig;
use lock_core::testkit::{phase, TestCluster};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
use serde_json::Value;

const PEER_PATHS: [&str; 7] = [
    "/raft/append",
    "/raft/vote",
    "/raft/snapshot",
    "/internal/propose",
    "/internal/forward",
    "/internal/propose_batch",
    "/internal/read_index",
];

async fn post_peer(
    http: &reqwest::Client,
    addr: &str,
    path: &str,
    body: Vec<u8>,
    tag: Option<String>,
) -> (u16, Value) {
    let mut req = http
        .post(format!("http://{addr}{path}"))
        .header(FROM_HEADER, "1")
        .body(body);
    if let Some(tag) = tag {
        req = req.header(AUTH_HEADER, tag);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_public_port_serves_no_peer_path() {
    let c = TestCluster::start(3).await;
    let http = reqwest::Client::new();
    for id in c.running() {
        for path in PEER_PATHS {
            let (status, body) = post_peer(&http, &c.addrs[&id], path, b"{}".to_vec(), None).await;
            assert_eq!(
                status, 404,
                "POST {path} on node {id}'s public port: {body}"
            );
            assert_eq!(body["error"], "not_found", "{body}");
        }
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_peer_calls_without_the_secret_change_nothing() {
    let c = TestCluster::start(3).await;
    let http = reqwest::Client::new();
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    let target = &c.peer_addrs[&follower];

    phase("a lease exists before the forgeries");
    let (s, grant) = c.acquire(leader, "peer:held", "peer-r1", 60_000).await;
    assert_eq!(s, 200, "{grant}");
    c.wait_caught_up(follower, Duration::from_secs(10)).await;
    let before = c.cluster_status(follower).await;

    phase("the peer port refuses callers with no tag or a tag from another secret");
    let wrong = PeerSecret::new("not-the-cluster-secret").expect("secret");
    for path in PEER_PATHS {
        let (status, body) = post_peer(&http, target, path, vec![], None).await;
        assert_eq!(status, 401, "{path} without a tag: {body}");
        assert_eq!(body["error"], "peer_unauthenticated", "{body}");
        let tag = wrong.sign("1", path, &[]);
        let (status, body) = post_peer(&http, target, path, vec![], Some(tag)).await;
        assert_eq!(status, 401, "{path} with a wrong-secret tag: {body}");
    }

    phase("a forged vote at a much higher term and a forged append are refused");
    let term = before.term;
    let vote = VoteRequest::<u64>::new(Vote::new(term + 100, 1), None);
    let body = codec::encode(&vote).expect("encode");
    let tag = wrong.sign("1", "/raft/vote", &body);
    let (status, _) = post_peer(&http, target, "/raft/vote", body, Some(tag)).await;
    assert_eq!(status, 401);

    let leader_id = CommittedLeaderId::new(term + 100, 1);
    let next = before.last_log_index.expect("index") + 1;
    let forged = Proposal {
        now_ms: u64::MAX / 2,
        failover_grace_ms: 0,
        cmd: Command::Release {
            resource: "peer:held".to_string(),
            lease_id: grant["lease_id"]
                .as_str()
                .expect("lease")
                .parse()
                .expect("lease id"),
        },
    };
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term + 100, 1),
        prev_log_id: None,
        entries: vec![Entry {
            log_id: LogId::new(leader_id, next),
            payload: EntryPayload::Normal(forged.into()),
        }],
        leader_commit: Some(LogId::new(leader_id, next)),
    };
    let body = codec::encode(&append).expect("encode");
    let (status, _) = post_peer(&http, target, "/raft/append", body.clone(), None).await;
    assert_eq!(status, 401);
    let tag = wrong.sign("1", "/raft/append", &body);
    let (status, _) = post_peer(&http, target, "/raft/append", body, Some(tag)).await;
    assert_eq!(status, 401);

    phase("term, log and leases are as they were");
    let after = c.cluster_status(follower).await;
    assert_eq!(after.term, before.term, "{after:?}");
    assert_eq!(after.leader_id, before.leader_id, "{after:?}");
    assert_eq!(after.last_log_index, before.last_log_index, "{after:?}");
    let (s, lock) = c.get(follower, "/v1/locks/peer:held").await;
    assert_eq!(s, 200, "{lock}");
    assert_eq!(lock["held"], true, "{lock}");
    assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");

    phase("control: the same port answers a call tagged with the cluster secret");
    let body = codec::encode(&()).expect("encode");
    let tag = c.secret.sign("1", "/internal/read_index", &body);
    let (status, _) = post_peer(
        &http,
        &c.peer_addrs[&leader],
        "/internal/read_index",
        body,
        Some(tag),
    )
    .await;
    assert_eq!(status, 200);

    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_framed_connection_without_the_secret_is_refused_and_its_frames_change_nothing() {
    use lock_core::net::frames::{FrameError, FramedConn, PREFACE, VERSION};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let c = TestCluster::start(3).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = c.followers(leader)[0];
    let target = &c.peer_addrs[&follower];
    let (s, grant) = c.acquire(leader, "peer:framed", "peer-f1", 60_000).await;
    assert_eq!(s, 200, "{grant}");
    c.wait_caught_up(follower, Duration::from_secs(10)).await;
    let before = c.cluster_status(follower).await;

    phase("the handshake with another secret is refused, saying why");
    let wrong = PeerSecret::new("not-the-cluster-secret").expect("secret");
    match FramedConn::open(target, 1, &wrong, 1 << 20).await {
        Err(FrameError::Refused(message)) => assert!(message.contains("secret"), "{message}"),
        other => panic!("expected a refusal, got {:?}", other.err()),
    }

    phase("a forged hello followed at once by a forged vote: closed, nothing read");
    let term = before.term;
    let vote = VoteRequest::<u64>::new(Vote::new(term + 100, 1), None);
    let body = codec::encode(&vote).expect("encode");
    let mut stream = tokio::net::TcpStream::connect(target)
        .await
        .expect("connect");
    let mut bytes = PREFACE.to_vec();
    bytes.push(VERSION);
    bytes.extend_from_slice(&1u64.to_be_bytes());
    bytes.extend_from_slice(&0u64.to_be_bytes());
    bytes.extend_from_slice(&[0u8; 16 + 32]);
    let path = b"/raft/vote";
    bytes.extend_from_slice(&((1 + path.len() + body.len()) as u32).to_be_bytes());
    bytes.push(path.len() as u8);
    bytes.extend_from_slice(path);
    bytes.extend_from_slice(&body);
    bytes.extend_from_slice(&[0u8; 16]);
    stream.write_all(&bytes).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the node closes the connection");
    // A refusal, or a reset if the close came first; never an acceptance.
    assert!(
        answer.is_empty() || answer[0] == 1,
        "the hello was accepted: {answer:?}"
    );

    phase("term, log and leases are as they were");
    let after = c.cluster_status(follower).await;
    assert_eq!(after.term, before.term, "{after:?}");
    assert_eq!(after.last_log_index, before.last_log_index, "{after:?}");
    let (s, lock) = c.get(follower, "/v1/locks/peer:framed").await;
    assert_eq!(s, 200, "{lock}");
    assert_eq!(lock["fencing_token"], grant["fencing_token"], "{lock}");

    phase("control: a framed call with the cluster secret is answered");
    let mut conn = FramedConn::open(&c.peer_addrs[&leader], 1, &c.secret, 1 << 20)
        .await
        .expect("open with the cluster secret");
    let body = codec::encode(&()).expect("encode");
    let (status, _) = conn
        .call("/internal/read_index", &body)
        .await
        .expect("call");
    assert_eq!(status, 200);

    c.shutdown().await;
}
