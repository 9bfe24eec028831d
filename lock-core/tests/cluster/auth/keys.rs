//! API keys: 401 without a valid key, 403 for a client key on admin calls, revocation on every
//! node, keys through restarts and snapshot installs, never stored in plain text.

use std::time::Duration;

use lock_core::node::TenantPolicy;
use lock_core::testkit::{phase, TestCluster};
use lock_core::wire::{
    AuditTail, FaultRule, KeyList, KeyRole, OperatorRequest, RemoveMemberRequest,
};

use super::support::{counter, As, ADMIN_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_v1_call_needs_a_valid_key_and_health_stays_open() {
    let cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, TenantPolicy::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let nobody = As::nobody(&cluster);
    let forger = As::key(&cluster, "fgk_00000000deadbeef_0123456789abcdef");

    phase("no key, or a key the cluster never made: 401 unauthenticated, on every /v1 call");
    for node in [1, 2, 3] {
        nobody
            .acquire(node, "kv:a", "r1")
            .await
            .refused(401, "unauthenticated");
        forger
            .acquire(node, "kv:a", "r1")
            .await
            .refused(401, "unauthenticated");
        for path in [
            "/v1/locks/kv:a",
            "/v1/locks",
            "/v1/cluster",
            "/v1/admin/keys",
        ] {
            nobody.get(node, path).await.refused(401, "unauthenticated");
        }
    }
    let view = As::key(&cluster, ADMIN_TOKEN).view(leader, "kv:a").await;
    assert!(!view.held, "a refused acquire must not have taken the lock");

    phase("health, readiness, metrics and the page itself stay open");
    for path in ["/healthz", "/readyz", "/metrics", "/ui"] {
        assert_eq!(nobody.get(leader, path).await.status, 200, "{path}");
    }

    phase("the open metrics name no resource, also when one is hot");
    let admin = As::key(&cluster, ADMIN_TOKEN);
    for i in 0..5 {
        admin
            .acquire(leader, "payroll:run", &format!("hot-{i}"))
            .await;
    }
    let scraped = nobody.get(leader, "/metrics").await.text;
    assert!(
        !scraped.contains("payroll"),
        "/metrics names a resource with keys on"
    );

    phase("refusals are counted by reason and audited with a key id, never the key");
    assert!(counter(&cluster, leader, "auth_denied_total", "reason=\"missing\"").await >= 5);
    assert!(counter(&cluster, leader, "auth_denied_total", "reason=\"invalid\"").await >= 1);
    let audit: AuditTail = admin
        .get(leader, "/v1/admin/audit?outcome=invalid&limit=100")
        .await
        .ok();
    let line = audit
        .entries
        .iter()
        .find(|e| e.op == "denied")
        .expect("an audited refusal");
    assert_eq!(line.caller.as_deref(), Some("key:00000000deadbeef"));
    let everything = admin.get(leader, "/v1/admin/audit?limit=1000").await.text;
    assert!(
        !everything.contains("0123456789abcdef"),
        "a key's secret reached the audit log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_keys_are_refused_admin_calls_and_admin_keys_manage_keys() {
    let cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, TenantPolicy::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = cluster.followers(leader)[0];
    let bootstrap = As::key(&cluster, ADMIN_TOKEN);

    phase("the bootstrap token creates the first keys; the secret is shown once");
    let client_key = bootstrap
        .create_key(follower, "acme", KeyRole::Client)
        .await;
    let admin_key = bootstrap.create_key(leader, "ops", KeyRole::Admin).await;
    assert!(client_key.key.starts_with("fgk_"));
    assert_eq!(client_key.role, KeyRole::Client);
    let client = As::key(&cluster, &client_key.key);
    let admin = As::key(&cluster, &admin_key.key);

    phase("a client key makes lock calls...");
    client.known_everywhere().await;
    client.granted(follower, "kv:x", "r1").await;

    phase("...but every operator call answers 403 forbidden and changes nothing");
    let operator = OperatorRequest {
        operator: "mallory".into(),
    };
    client
        .get(leader, "/v1/admin/keys")
        .await
        .refused(403, "forbidden");
    client
        .post(
            leader,
            "/v1/admin/keys",
            &serde_json::json!({"tenant": "acme", "role": "admin"}),
        )
        .await
        .refused(403, "forbidden");
    client
        .post(
            leader,
            &format!("/v1/admin/keys/{}/revoke", admin_key.id),
            &(),
        )
        .await
        .refused(403, "forbidden");
    client
        .post(leader, "/v1/admin/force-release/acme%23kv:x", &operator)
        .await
        .refused(403, "forbidden");
    client
        .post(
            leader,
            "/v1/cluster/members/remove",
            &RemoveMemberRequest {
                node_id: 3,
                force: true,
            },
        )
        .await
        .refused(403, "forbidden");
    client
        .get(leader, "/v1/admin/overview")
        .await
        .refused(403, "forbidden");
    assert!(
        client.view(leader, "kv:x").await.held,
        "the forced release went through"
    );
    assert_eq!(cluster.cluster_status(leader).await.members.len(), 3);
    assert!(counter(&cluster, leader, "auth_denied_total", "reason=\"role\"").await >= 5);

    phase("an admin key lists keys without secrets and acts as an operator");
    let list: KeyList = admin.get(follower, "/v1/admin/keys").await.ok();
    let ids: Vec<&str> = list.keys.iter().map(|k| k.id.as_str()).collect();
    assert!(ids.contains(&client_key.id.as_str()) && ids.contains(&admin_key.id.as_str()));
    let text = admin.get(follower, "/v1/admin/keys").await.text;
    assert!(
        !text.contains(&client_key.key[20..]),
        "a listing shows a secret"
    );
    let forced = admin
        .post(follower, "/v1/admin/force-release/acme%23kv:x", &operator)
        .await;
    assert_eq!(forced.status, 200, "{}", forced.text);
    assert!(!client.view(leader, "kv:x").await.held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_key_is_refused_on_every_node_once_the_revoke_commits() {
    let cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, TenantPolicy::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let admin = As::key(&cluster, ADMIN_TOKEN);
    let created = admin.create_key(leader, "acme", KeyRole::Client).await;
    let client = As::key(&cluster, &created.key);

    phase("the key works on every node");
    client.known_everywhere().await;
    let lease = client.granted(leader, "kv:r", "r1").await;

    phase("a follower lags: the leader's appends reach it 80 ms late");
    // Shorter than the leader's append timeout, so the follower keeps up (and stays a
    // follower), only late: the calls below reach it before it has applied the revocation.
    // (If the machine is slow enough to let it catch up first, the calls are still refused,
    // at the door.)
    let lagging = cluster.followers(leader)[0];
    cluster.node(leader).node.faults().set_rule(
        lagging,
        FaultRule {
            delay_ms: 80,
            ..FaultRule::default()
        },
    );

    phase("revoke it; with no wait, even the lagging follower refuses writes and reads with it");
    let revoked = admin.revoke(leader, &created.id).await;
    assert!(revoked.revoked);
    // The follower still has the key in its table: the write is refused when applied, the
    // read after its barrier.
    client
        .acquire(lagging, "kv:lagging", "r3")
        .await
        .refused(401, "unauthenticated");
    client
        .get(lagging, "/v1/locks/kv:r")
        .await
        .refused(401, "unauthenticated");
    cluster.node(leader).node.faults().heal();
    for node in [1, 2, 3] {
        client
            .acquire(node, "kv:other", "r2")
            .await
            .refused(401, "unauthenticated");
        client
            .renew(node, "kv:r", &lease)
            .await
            .refused(401, "unauthenticated");
        for path in ["/v1/locks/kv:r", "/v1/locks"] {
            client.get(node, path).await.refused(401, "unauthenticated");
        }
    }
    assert!(!admin.view(leader, "kv:other").await.held);
    assert!(!admin.view(leader, "kv:lagging").await.held);

    phase("revoking again reports that nothing was there");
    let again = admin.revoke(leader, &created.id).await;
    assert!(!again.revoked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_survive_restarts_and_snapshot_installs_and_are_hashed_at_rest() {
    let mut cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, TenantPolicy::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let lagging = cluster.followers(leader)[0];
    let admin = As::key(&cluster, ADMIN_TOKEN);

    phase("a follower is down while a key is created and the log is compacted past it");
    cluster.crash(lagging).await;
    let created = admin.create_key(leader, "acme", KeyRole::Client).await;
    let doomed = admin.create_key(leader, "acme", KeyRole::Client).await;
    let _ = admin.revoke(leader, &doomed.id).await;
    cluster.snapshot_and_purge(leader).await;

    phase("it comes back and learns the keys from the snapshot alone");
    cluster.restart(lagging).await;
    cluster
        .wait_caught_up(lagging, Duration::from_secs(30))
        .await;
    let client = As::key(&cluster, &created.key);
    assert_eq!(client.get(lagging, "/v1/locks/kv:s").await.status, 200);
    As::key(&cluster, &doomed.key)
        .get(lagging, "/v1/locks/kv:s")
        .await
        .refused(401, "unauthenticated");

    phase("every node restarts; the key still works, the revoked one still does not");
    for id in [1, 2, 3] {
        cluster.crash(id).await;
    }
    for id in [1, 2, 3] {
        cluster.restart(id).await;
    }
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    for node in [1, 2, 3] {
        cluster.wait_caught_up(node, Duration::from_secs(30)).await;
        assert_eq!(client.get(node, "/v1/locks/kv:s").await.status, 200);
    }
    client.granted(leader, "kv:s", "after-restart").await;

    phase("on disk: the key ids are there, the secrets nowhere");
    for id in [1, 2, 3] {
        cluster.crash(id).await;
    }
    let mut files = 0;
    let mut id_found = false;
    for entry in walk(cluster.data_root()) {
        let bytes = std::fs::read(&entry).expect("read");
        files += 1;
        for key in [&created.key, &doomed.key] {
            let secret = key.rsplit('_').next().expect("secret part");
            assert!(
                !contains(&bytes, secret.as_bytes()),
                "the secret of a key is in {}",
                entry.display()
            );
        }
        id_found |= contains(&bytes, created.id.as_bytes());
    }
    assert!(files > 0);
    // The scan reads the stored log and snapshots as they are: the key's public id is in them,
    // so a plain-text secret would have been found too.
    assert!(
        id_found,
        "the key id is in no data file: the scan proves nothing"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
