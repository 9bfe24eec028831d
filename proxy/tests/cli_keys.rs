//! `fencegate keys` and `--api-key` against a real three-node cluster that requires keys, run as
//! a user runs them: the built binary, its stdout, stderr and exit code.

use std::process::{Output, Stdio};

use lock_core::node::TenantPolicy;
use lock_core::testkit::{phase, TestCluster};
use lock_core::wire::{AcquireResponse, CreatedKey, KeyList, KeyRole, LockList, RevokeKeyResponse};
use tokio::process::Command;

const FENCEGATE: &str = env!("CARGO_BIN_EXE_fencegate");
const ADMIN_TOKEN: &str = "cli-keys-admin-token-0123456789";

async fn run(cluster: &TestCluster, args: &[&str]) -> Output {
    let endpoints: Vec<&str> = cluster.addrs.values().map(String::as_str).collect();
    Command::new(FENCEGATE)
        .args(args)
        .env("FENCEGATE_ENDPOINTS", endpoints.join(","))
        .env_remove("FENCEGATE_API_KEY")
        .env_remove("FENCEGATE_ADMIN_TOKEN")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run fencegate")
}

async fn json<T: serde::de::DeserializeOwned>(cluster: &TestCluster, args: &[&str]) -> T {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = run(cluster, &all).await;
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no wire type ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[track_caller]
fn assert_refused(out: &Output, code: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.starts_with(&format!("error: {code}: ")),
        "expected 'error: {code}: …', got: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_created_used_listed_and_revoked_from_the_command_line() {
    let cluster = TestCluster::start_with_auth(3, ADMIN_TOKEN, TenantPolicy::default()).await;

    phase("without a key, a lock call is refused as unauthenticated");
    let out = run(&cluster, &["lock", "acquire", "kv:cli"]).await;
    assert_refused(&out, "unauthenticated");

    phase("the admin token creates a client key; its secret is printed once");
    let created: CreatedKey = json(
        &cluster,
        &[
            "keys",
            "create",
            "--tenant",
            "acme",
            "--role",
            "client",
            "--label",
            "cli test",
            "--admin-token",
            ADMIN_TOKEN,
        ],
    )
    .await;
    assert_eq!(created.tenant, "acme");
    assert_eq!(created.role, KeyRole::Client);

    phase("the key takes a lock in its tenant's namespace");
    let lease: AcquireResponse = json(
        &cluster,
        &["lock", "acquire", "kv:cli", "--api-key", &created.key],
    )
    .await;
    assert_eq!(lease.resource, "kv:cli");
    let mine: LockList = json(&cluster, &["lock", "list", "--api-key", &created.key]).await;
    assert_eq!(mine.locks.len(), 1);
    let theirs: LockList = json(&cluster, &["lock", "list", "--admin-token", ADMIN_TOKEN]).await;
    assert!(
        theirs.locks.is_empty(),
        "the default tenant sees acme's lock"
    );

    phase("a client key cannot manage keys; the admin token lists them without secrets");
    let out = run(&cluster, &["keys", "list", "--api-key", &created.key]).await;
    assert_refused(&out, "forbidden");
    let listed = run(
        &cluster,
        &["keys", "list", "-o", "json", "--admin-token", ADMIN_TOKEN],
    )
    .await;
    let list: KeyList = serde_json::from_slice(&listed.stdout).expect("key list");
    assert_eq!(list.keys.len(), 1);
    assert_eq!(list.keys[0].id, created.id);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&created.key));

    phase("revoked, the key is refused");
    let revoked: RevokeKeyResponse = json(
        &cluster,
        &["keys", "revoke", &created.id, "--admin-token", ADMIN_TOKEN],
    )
    .await;
    assert!(revoked.revoked);
    let out = run(
        &cluster,
        &["lock", "acquire", "kv:other", "--api-key", &created.key],
    )
    .await;
    assert_refused(&out, "unauthenticated");
    cluster.shutdown().await;
}
