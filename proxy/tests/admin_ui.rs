//! The admin UI in a real browser: Debian's chromium, driven over WebDriver (chromedriver,
//! started here on a free port), against a real 3-node cluster (real raft, real fjall, real
//! HTTP) with a fencing proxy per node in front of the bundled demo store.
//!
//! Each test reads as phases. With `FENCEGATE_SCREENSHOTS=<dir>` set, the tests save what
//! the browser showed as `admin-ui-*.png` there (the docs' screenshots come from this run:
//! `FENCEGATE_SCREENSHOTS=$PWD/docs/img cargo test -p proxy --test admin_ui`).
//!
//! Needs `chromium` and `chromedriver` (Debian packages `chromium`, `chromium-driver`;
//! `scripts/install-build-deps.sh --tests` installs them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use fencegate_proxy::config::ProxyConfig;
use lock_core::net::PeerSecret;
use lock_core::node::{AuthMode, MemberAddrs, NodeConfig};
use lock_core::server::{self, NodeHandle};
use lock_core::testkit::{eventually, phase};
use lock_core::wire::{
    AcquireRequest, AcquireResponse, ClusterOverview, CreateKeyRequest, CreatedKey, ErrorBody,
    KeyRole, LockView, OperatorRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";
/// How long a test waits for something it can observe (an election, a poll of the page).
const EVENT: Duration = Duration::from_secs(20);

// ---- the cluster ---------------------------------------------------------------------------

struct Proxy {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Three nodes with the admin token configured, a proxy per node, the demo store.
struct Cluster {
    _dir: TempDir,
    addrs: BTreeMap<u64, String>,
    nodes: BTreeMap<u64, Option<NodeHandle>>,
    proxies: BTreeMap<u64, (String, Proxy)>,
    /// The demo store's address.
    store: String,
    http: reqwest::Client,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(AuthMode::Off).await
    }

    /// With `AuthMode::On` (API keys) every `/v1` call needs a key: the harness's own calls
    /// send the admin token (the bootstrap admin key); the browser sends what is typed in.
    async fn start_with(auth: AuthMode) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut listeners = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        let mut members = BTreeMap::new();
        for id in 1..=3u64 {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let p = TcpListener::bind("127.0.0.1:0").await.expect("bind peer");
            let api = l.local_addr().expect("addr").to_string();
            let peer = p.local_addr().expect("addr").to_string();
            addrs.insert(id, api.clone());
            members.insert(id, MemberAddrs { api, peer });
            listeners.insert(id, (l, p));
        }
        let secret = PeerSecret::new(&PeerSecret::generate()).expect("secret");
        let store = TcpListener::bind("127.0.0.1:0").await.expect("bind store");
        let store_addr = store.local_addr().expect("addr").to_string();
        tokio::spawn(fencegate_proxy::demo_store::serve(
            store,
            std::future::pending(),
        ));
        let proxy_config = ProxyConfig::dev(String::new(), store_addr.clone());
        let mut nodes = BTreeMap::new();
        let mut proxies = BTreeMap::new();
        for (id, (l, p)) in listeners {
            let mut config = NodeConfig::new(
                id,
                dir.path().join(format!("node{id}")),
                members.clone(),
                secret.clone(),
            );
            config.admin_token = Some(ADMIN_TOKEN.to_string());
            config.auth = auth;
            let handle = server::start(config, l, p, std::future::pending())
                .await
                .expect("start node");
            let pl = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
            let paddr = pl.local_addr().expect("addr").to_string();
            let (stop, stop_rx) = oneshot::channel();
            let task = fencegate_proxy::server::start(
                handle.node.clone(),
                &proxy_config,
                pl,
                async move {
                    let _ = stop_rx.await;
                },
            )
            .expect("start proxy");
            proxies.insert(id, (paddr, Proxy { stop, task }));
            nodes.insert(id, Some(handle));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if auth == AuthMode::On {
            let bearer = format!("Bearer {ADMIN_TOKEN}");
            headers.insert(
                reqwest::header::AUTHORIZATION,
                bearer.parse().expect("header value"),
            );
        }
        let c = Cluster {
            _dir: dir,
            addrs,
            nodes,
            proxies,
            store: store_addr,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .default_headers(headers)
                .build()
                .expect("client"),
        };
        c.wait_leader(None).await;
        c
    }

    fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{}", self.addrs[&id], path)
    }

    async fn get<T: DeserializeOwned>(&self, id: u64, path: &str) -> T {
        let r = self.http.get(self.url(id, path)).send().await.expect("get");
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.expect("json")
    }

    /// POSTs a typed body; returns the status and the raw body for the caller to decode.
    async fn post<B: Serialize>(
        &self,
        id: u64,
        path: &str,
        body: &B,
        token: Option<&str>,
    ) -> (u16, String) {
        let mut req = self.http.post(self.url(id, path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("post");
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    async fn acquire(&self, id: u64, resource: &str, holder: &str) -> AcquireResponse {
        let req = AcquireRequest {
            request_id: format!("{resource}-{holder}"),
            holder: Some(holder.to_string()),
            // Long enough to outlast the test's phases; the page counts it down.
            ttl_ms: Some(120_000),
            ..Default::default()
        };
        let (status, body) = self
            .post(id, &format!("/v1/locks/{resource}/acquire"), &req, None)
            .await;
        assert_eq!(status, 200, "acquire {resource}: {body}");
        serde_json::from_str(&body).expect("acquire response")
    }

    /// The leader every running node agrees on (other than `not`).
    async fn wait_leader(&self, not: Option<u64>) -> u64 {
        let mut leader = 0;
        eventually(
            EVENT,
            "one leader named by every running node",
            async || {
                let mut seen = Vec::new();
                for (id, h) in &self.nodes {
                    if h.is_some() {
                        seen.push(
                            self.get::<ClusterOverview>(*id, "/v1/admin/overview")
                                .await
                                .status
                                .leader_id,
                        );
                    }
                }
                match seen.first() {
                    Some(Some(l)) if seen.iter().all(|s| *s == Some(*l)) && Some(*l) != not => {
                        leader = *l;
                        true
                    }
                    _ => false,
                }
            },
        )
        .await;
        leader
    }

    async fn crash(&mut self, id: u64) {
        if let Some((_, p)) = self.proxies.remove(&id) {
            let _ = p.stop.send(());
            let _ = p.task.await;
        }
        if let Some(h) = self.nodes.get_mut(&id).and_then(Option::take) {
            h.crash().await;
        }
    }

    /// A write through node `id`'s proxy: `PUT /kv/{key}` with `Fence-Token`.
    async fn put(&self, id: u64, key: &str, token: u64, value: &str) -> (u16, Option<ErrorBody>) {
        let r = self
            .http
            .put(format!("http://{}/kv/{key}", self.proxies[&id].0))
            .header("fence-token", token.to_string())
            .body(value.to_string())
            .send()
            .await
            .expect("proxy put");
        let status = r.status().as_u16();
        (status, r.json().await.ok())
    }
}

// ---- the browser ---------------------------------------------------------------------------

struct Browser {
    client: Client,
    driver: Child,
    shots: Option<PathBuf>,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless chromium session through it.
    async fn start() -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let driver = Command::new(std::env::var("CHROMEDRIVER").unwrap_or("chromedriver".into()))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver is not installed: run scripts/install-build-deps.sh --tests (Debian \
                 packages chromium and chromium-driver)",
            );
        let profile = tempfile::tempdir().expect("profile dir");
        let binary = std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        let caps: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(serde_json::json!({
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": binary,
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--window-size=1280,800",
                        format!("--user-data-dir={}", profile.path().display()),
                    ]
                }
            }))
            .expect("capabilities");
        let url = format!("http://127.0.0.1:{port}");
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let mut client = None;
        // chromedriver takes a moment to listen; its session endpoint is the event we await.
        eventually(
            EVENT,
            "chromedriver to accept a session",
            async || match ClientBuilder::new(connector.clone())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => {
                    client = Some(c);
                    true
                }
                Err(_) => false,
            },
        )
        .await;
        let client = client.expect("session");
        client
            .set_window_size(1280, 800)
            .await
            .expect("window size");
        // The profile must outlive the browser; it is removed with the temp dir at exit.
        std::mem::forget(profile);
        Browser {
            client,
            driver,
            shots: std::env::var_os("FENCEGATE_SCREENSHOTS").map(PathBuf::from),
        }
    }

    async fn open(&self, base: &str, view: &str) {
        self.client
            .goto(&format!("{base}/ui#{view}"))
            .await
            .expect("goto");
    }

    async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Runs a script that returns JSON and decodes it.
    async fn eval<T: DeserializeOwned>(&self, script: &str) -> T {
        let v = self.client.execute(script, vec![]).await.expect("script");
        serde_json::from_value(v).expect("script result")
    }

    async fn wait_text(&self, css: &str, what: &str, want: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        eventually(EVENT, what, async || {
            last = self.text(css).await;
            want(&last)
        })
        .await;
        last
    }

    async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    async fn fill(&self, css: &str, value: &str) {
        let e = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"));
        e.clear().await.expect("clear");
        e.send_keys(value).await.expect("type");
    }

    /// Rows of the locks table as (resource, token); not the row saying that none match.
    async fn lock_rows(&self) -> Vec<(String, String)> {
        self.eval(
            "return [...document.querySelectorAll('#locks-table tbody tr[data-resource]')]
                .map(r => [r.dataset.resource, r.querySelector('.token').textContent]);",
        )
        .await
    }

    /// Whether the element `css` matches is rendered (neither it nor an ancestor hidden).
    async fn shown(&self, css: &str) -> bool {
        self.eval(&format!(
            "const e = document.querySelector({css:?}); return !!e && e.getClientRects().length > 0;"
        ))
        .await
    }

    /// Moves the keyboard focus to the element `css` matches (as tabbing to it would) and
    /// remembers that element for `still_focused`.
    async fn focus(&self, css: &str) {
        let focused: bool = self
            .eval(&format!(
                "const e = document.querySelector({css:?});
                 if (!e) return false;
                 e.focus();
                 window.fgFocused = e;
                 return document.activeElement === e;"
            ))
            .await;
        assert!(focused, "focus {css}");
    }

    /// Whether the element `focus` focused still has the focus (the very element, not a copy).
    async fn still_focused(&self) -> bool {
        self.eval("return document.activeElement === window.fgFocused;")
            .await
    }

    /// Waits for the page's next `n` answers to requests whose URL contains `path`: with
    /// n = 3, at least two polls of it have been answered and rendered since the call.
    async fn wait_polls(&self, path: &str, n: usize) {
        let _: Option<()> = self
            .eval("performance.clearResourceTimings(); return null;")
            .await;
        let count = format!(
            "return performance.getEntriesByType('resource')
                .filter(e => e.name.includes({path:?})).length;"
        );
        eventually(EVENT, &format!("{n} polls of {path}"), async || {
            self.eval::<usize>(&count).await >= n
        })
        .await;
    }

    async fn screenshot(&self, name: &str) {
        let Some(dir) = &self.shots else { return };
        std::fs::create_dir_all(dir).expect("screenshot dir");
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(dir.join(format!("admin-ui-{name}.png")), png).expect("write screenshot");
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A test that fails before `close` must not leave its chromedriver running.
impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

// ---- the tests -----------------------------------------------------------------------------

/// The page names the leader; a lock taken through the API shows up with its token without a
/// reload; prefix search and server-side paging over 1,000 resources; a forced release from
/// the page fences the old token at the proxy (412) and is in the audit tail with the
/// operator's name; without the credential an action is refused and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_see_locks_page_through_them_and_force_a_release() {
    let cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    let page_node = 1;
    let base = format!("http://{}", cluster.addrs[&page_node]);
    let browser = Browser::start().await;

    phase("the page loads and names the leader");
    browser.open(&base, "cluster").await;
    browser
        .wait_text("#leader", "the leader in the header", |t| {
            t == format!("node {leader}")
        })
        .await;
    let members: Vec<(String, String)> = browser
        .eval(
            "return [...document.querySelectorAll('#members tbody tr')]
                .map(r => [r.dataset.node, r.querySelector('.health').textContent]);",
        )
        .await;
    assert_eq!(members.len(), 3, "{members:?}");

    phase("a lock acquired through the API appears with its token, without a reload");
    browser.open(&base, "locks").await;
    browser
        .wait_text("#page-info", "the locks view", |t| t.starts_with("page 1"))
        .await;
    let lease = cluster.acquire(2, "kv:order-42", "billing-worker").await;
    let shown_at = Instant::now();
    eventually(EVENT, "kv:order-42 in the locks table", async || {
        browser
            .lock_rows()
            .await
            .contains(&("kv:order-42".to_string(), lease.fencing_token.to_string()))
    })
    .await;
    eprintln!(
        "shown {} ms after the acquire answered",
        shown_at.elapsed().as_millis()
    );
    // The countdown runs: a 120 s lease shows minutes and seconds left.
    let left = browser
        .wait_text(
            "#locks-table tr[data-resource='kv:order-42'] .left",
            "time left",
            |t| t.ends_with(" s"),
        )
        .await;
    assert!(left.contains("min"), "{left}");

    phase("prefix search finds it and only it");
    cluster.acquire(1, "other:1", "someone").await;
    browser.fill("#prefix", "kv:order").await;
    browser.click("#search").await;
    eventually(EVENT, "only kv:order* listed", async || {
        let rows = browser.lock_rows().await;
        rows.len() == 1 && rows[0].0 == "kv:order-42"
    })
    .await;
    browser.screenshot("locks").await;

    phase("1,000 resources page through on the server, 500 at a time");
    let mut tasks = tokio::task::JoinSet::new();
    let cluster = std::sync::Arc::new(cluster);
    for chunk in 0..20 {
        let c = cluster.clone();
        tasks.spawn(async move {
            for i in (chunk * 50)..(chunk * 50 + 50) {
                c.acquire(1 + (i % 3) as u64, &format!("page:{i:04}"), "pager")
                    .await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("acquire task");
    }
    browser.fill("#prefix", "page:").await;
    browser
        .client
        .find(Locator::Css("#page-size"))
        .await
        .expect("page size")
        .select_by_value("500")
        .await
        .expect("select");
    browser.click("#search").await;
    let first_and_last = async || {
        let rows = browser.lock_rows().await;
        (
            rows.len(),
            rows.first().map(|r| r.0.clone()).unwrap_or_default(),
            rows.last().map(|r| r.0.clone()).unwrap_or_default(),
        )
    };
    eventually(EVENT, "page 1: page:0000 … page:0499", async || {
        first_and_last().await == (500, "page:0000".into(), "page:0499".into())
    })
    .await;
    browser.click("#next-page").await;
    eventually(EVENT, "page 2: page:0500 … page:0999", async || {
        first_and_last().await == (500, "page:0500".into(), "page:0999".into())
    })
    .await;
    let next_disabled: bool = browser
        .eval("return document.querySelector('#next-page').disabled;")
        .await;
    assert!(next_disabled, "the last page has no next page");
    browser.click("#prev-page").await;
    eventually(EVENT, "back on page 1", async || {
        first_and_last().await.1 == "page:0000"
    })
    .await;

    phase("the resource page shows the lease; hot resources and charts render");
    browser.open(&base, "resource/kv:order-42").await;
    browser
        .wait_text("#resource-facts", "the resource's facts", |t| {
            t.contains("billing-worker") && t.contains(&lease.fencing_token.to_string())
        })
        .await;
    browser.screenshot("resource").await;
    browser.open(&base, "hot").await;
    browser
        .wait_text("#hot-lists", "hot resources", |t| {
            t.contains("page:") || t.contains("kv:order-42")
        })
        .await;
    browser.screenshot("hot").await;
    browser.open(&base, "charts").await;
    eventually(EVENT, "six charts with data", async || {
        let n: usize = browser
            .eval("return document.querySelectorAll('#charts-grid svg polyline').length;")
            .await;
        n >= 3
    })
    .await;
    browser.screenshot("charts").await;

    phase("without the credential a forced release is refused and nothing changes");
    browser.open(&base, "actions").await;
    browser.fill("#operator", "mallory").await;
    browser.fill("#admin-token", "").await;
    browser.fill("#fr-resource", "kv:order-42").await;
    browser.click("#fr-submit").await;
    browser.click("#confirm-yes").await;
    let refused = browser
        .wait_text("#action-result", "the refusal", |t| {
            t.starts_with("Refused")
        })
        .await;
    assert!(
        refused.contains("401") && refused.contains("unauthorized"),
        "{refused}"
    );
    browser.fill("#admin-token", "wrong-token").await;
    browser.click("#fr-submit").await;
    browser.click("#confirm-yes").await;
    let refused = browser
        .wait_text("#action-result", "the refusal", |t| t.contains("403"))
        .await;
    assert!(refused.contains("forbidden"), "{refused}");
    let view: LockView = cluster.get(3, "/v1/locks/kv:order-42").await;
    assert!(view.held, "a refused action changed nothing");
    assert_eq!(view.fencing_token, Some(lease.fencing_token));
    // The other actions refuse too, over plain HTTP.
    let op = OperatorRequest {
        operator: "mallory".into(),
    };
    for path in [
        "/v1/admin/drain",
        "/v1/admin/snapshot",
        "/v1/admin/force-release/kv:order-42",
    ] {
        let (status, body) = cluster.post(2, path, &op, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        let body: ErrorBody = serde_json::from_str(&body).expect("error body");
        assert_eq!(body.error.as_str(), "unauthorized");
        let (status, _) = cluster.post(2, path, &op, Some("nope")).await;
        assert_eq!(status, 403, "{path}");
    }
    let (status, _) = cluster
        .post(
            2,
            "/v1/cluster/members/remove",
            &lock_core::wire::RemoveMemberRequest {
                node_id: 3,
                force: false,
            },
            None,
        )
        .await;
    assert_eq!(status, 401, "membership needs the credential too");
    let overview: ClusterOverview = cluster.get(1, "/v1/admin/overview").await;
    assert_eq!(overview.status.members.len(), 3, "membership unchanged");
    assert_eq!(
        overview.status.leader_id,
        Some(leader),
        "leadership unchanged"
    );
    let view: LockView = cluster.get(1, "/v1/locks/kv:order-42").await;
    assert!(view.held && view.fencing_token == Some(lease.fencing_token));

    phase("the holder writes through the proxy with its token");
    let (status, body) = cluster
        .put(1, "order-42", lease.fencing_token, "paid")
        .await;
    assert_eq!(status, 200, "{body:?}");

    phase("forced release from the page, with confirmation");
    browser.fill("#operator", "alice").await;
    browser.fill("#admin-token", ADMIN_TOKEN).await;
    browser.click("#fr-submit").await;
    // Cancelling the confirmation does nothing.
    browser.click("#confirm-no").await;
    browser
        .wait_text("#action-result", "cancelled", |t| {
            t.starts_with("Cancelled")
        })
        .await;
    assert!(
        cluster
            .get::<LockView>(1, "/v1/locks/kv:order-42")
            .await
            .held
    );
    browser.click("#fr-submit").await;
    browser.screenshot("confirm").await;
    browser.click("#confirm-yes").await;
    let done = browser
        .wait_text("#action-result", "the forced release", |t| {
            t.starts_with("Done")
        })
        .await;
    assert!(
        done.contains(&format!("\"fencing_token\":{}", lease.fencing_token)),
        "{done}"
    );
    browser.screenshot("actions").await;
    let view: LockView = cluster.get(2, "/v1/locks/kv:order-42").await;
    assert!(!view.held, "the lease is gone on every node");

    phase("a backup downloaded from the page covers the forced release");
    let applied = cluster
        .get::<lock_core::wire::ClusterStatus>(1, "/v1/cluster")
        .await
        .last_applied;
    browser.click("#backup-submit").await;
    browser.click("#confirm-yes").await;
    // The force release's "Done" may still be shown when the wait begins.
    let done = browser
        .wait_text("#action-result", "the backup", |t| {
            t.starts_with("Done") && t.contains("backup of log index")
        })
        .await;
    let index: u64 = done
        .split("log index ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no log index in {done:?}"));
    assert!(
        index >= applied,
        "the backup ends before the forced release: {done}"
    );
    assert!(done.contains(" bytes, saved as fencegate-"), "{done}");

    phase("the old token's write through every proxy is refused (412)");
    // Proxy 1 admitted the token before the release; like a holder's release, the forced one
    // answered only after the token was revoked at every proxy holding a grant.
    for id in 1..=3 {
        let (status, body) = cluster
            .put(id, "order-42", lease.fencing_token, "zombie")
            .await;
        assert_eq!(status, 412, "proxy {id}: {body:?}");
        assert_eq!(
            body.expect("error body").error.as_str(),
            "stale_fencing_token"
        );
    }

    phase("the audit tail shows the operator's action, filtered by caller");
    browser.open(&base, "audit").await;
    browser.fill("#audit-caller", "operator:alice").await;
    browser.click("#audit-apply").await;
    let rows: Vec<(String, String, String)> = {
        let mut rows: Vec<(String, String, String)> = Vec::new();
        eventually(
            EVENT,
            "alice's forced release and backup in the audit tail",
            async || {
                rows = browser
                    .eval(
                        "return [...document.querySelectorAll('#audit-table tbody tr')]
                        .map(r => [r.dataset.op, r.querySelector('.caller').textContent,
                                   r.querySelector('.outcome').textContent]);",
                    )
                    .await;
                // Once the filter applies, alice's lines are all that is left.
                rows.iter().all(|r| r.1 == "operator:alice")
                    && rows
                        .iter()
                        .any(|r| r.0 == "force_release" && r.2 == "released")
                    && rows.iter().any(|r| r.0 == "backup" && r.2 == "done")
            },
        )
        .await;
        rows
    };
    assert_eq!(rows.len(), 2, "{rows:?}");
    browser.fill("#audit-caller", "").await;
    browser.click("#audit-apply").await;
    browser
        .wait_text(
            "#audit-table tbody",
            "denied attempts are audited too, the name they claim as unverified",
            |t| {
                t.contains("unverified")
                    && t.contains("claimed operator: mallory")
                    && t.contains("unauthorized")
                    && !t.contains("operator:mallory")
            },
        )
        .await;
    browser.screenshot("audit").await;
    browser.open(&base, "cluster").await;
    browser
        .wait_text("#leader", "the leader", |t| t.starts_with("node "))
        .await;
    browser.screenshot("cluster").await;
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("phone size");
    browser.open(&base, "locks").await;
    browser
        .wait_text("#page-info", "the locks view on a phone", |t| {
            t.starts_with("page 1")
        })
        .await;
    browser.screenshot("phone").await;
    browser.close().await;
}

/// A stopped node shows as down, and after the leader is killed the page names the new leader
/// and lists the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_shows_as_down_and_the_election_appears() {
    let mut cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    // The page is served by a node that survives.
    let page_node = (1..=3).find(|id| *id != leader).expect("a follower");
    let base = format!("http://{}", cluster.addrs[&page_node]);
    let browser = Browser::start().await;
    browser.open(&base, "cluster").await;
    browser
        .wait_text("#leader", "the leader", |t| t == format!("node {leader}"))
        .await;
    let before: usize = browser
        .eval("return document.querySelectorAll('#elections li').length;")
        .await;

    phase("kill the leader");
    cluster.crash(leader).await;
    let new_leader = cluster.wait_leader(Some(leader)).await;

    phase("the page shows it down, names the new leader and lists the election");
    let health = format!("#members tr[data-node='{leader}'] .health");
    browser
        .wait_text(&health, "the old leader shown as down", |t| {
            t.starts_with("down")
        })
        .await;
    browser
        .wait_text("#leader", "the new leader", |t| {
            t == format!("node {new_leader}")
        })
        .await;
    browser
        .wait_text("#elections", "the election in the list", |t| {
            t.lines()
                .next()
                .is_some_and(|l| l.contains(&format!("node {new_leader} leads")))
        })
        .await;
    let after: usize = browser
        .eval("return document.querySelectorAll('#elections li').length;")
        .await;
    assert!(after > before, "{before} -> {after}");
    assert!(browser
        .text("#last-election")
        .await
        .contains(&format!("node {new_leader} won")));
    browser.screenshot("election").await;
    browser.open(&base, "charts").await;
    eventually(EVENT, "the election marked on a chart", async || {
        let n: usize = browser
            .eval("return document.querySelectorAll('#charts-grid line.election').length;")
            .await;
        n > 0
    })
    .await;
    browser.screenshot("charts-election").await;

    phase("the page's own node stops answering: what the page shows is marked stale");
    browser.open(&base, "cluster").await;
    browser
        .wait_text("#leader", "the leader", |t| {
            t == format!("node {new_leader}")
        })
        .await;
    cluster.crash(page_node).await;
    let banner = browser
        .wait_text("#error", "the failed refresh in the banner", |t| {
            t.starts_with("Could not reach this node's API")
        })
        .await;
    assert!(banner.contains("What is shown is as of"), "{banner}");
    let stale: bool = browser
        .eval("return document.body.classList.contains('stale');")
        .await;
    assert!(stale, "the members table still looks current");
    browser.close().await;
}

/// The other operator actions over HTTP (the page calls the same endpoints): a drain asked of
/// a follower is relayed to the leader, which steps aside until another voter leads; a
/// snapshot is built on the node asked; a member is removed; each is audited with the
/// operator's name on the node that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_snapshot_and_membership_actions_work_and_are_audited() {
    use lock_core::wire::{
        AdminRemoveMember, AuditTail, DrainResponse, MembershipResponse, SnapshotResponse,
    };
    let cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let op = OperatorRequest {
        operator: "bob".into(),
    };

    phase("drain, asked of a follower: another voter takes over");
    let (status, body) = cluster
        .post(follower, "/v1/admin/drain", &op, Some(ADMIN_TOKEN))
        .await;
    assert_eq!(status, 200, "{body}");
    let drained: DrainResponse = serde_json::from_str(&body).expect("drain response");
    assert_eq!(drained.old_leader, leader);
    assert_ne!(drained.new_leader, leader);
    // Another voter leads now. Usually the one the drain saw take over, but on a busy machine
    // the third voter's own election can follow at once (openraft 0.9 has no leader transfer,
    // so both followers' leader leases run out together).
    let now = cluster.wait_leader(Some(leader)).await;
    let tail: AuditTail = cluster
        .get(leader, "/v1/admin/audit?caller=operator:bob")
        .await;
    assert!(
        tail.entries
            .iter()
            .any(|e| e.op == "drain" && e.outcome == "done"),
        "{tail:?}"
    );

    phase("writes go on under the new leader");
    cluster.acquire(leader, "kv:after-drain", "w").await;

    phase("snapshot on one node");
    let (status, body) = cluster
        .post(follower, "/v1/admin/snapshot", &op, Some(ADMIN_TOKEN))
        .await;
    assert_eq!(status, 200, "{body}");
    let snap: SnapshotResponse = serde_json::from_str(&body).expect("snapshot response");
    assert_eq!(snap.node_id, follower);
    let overview: ClusterOverview = cluster.get(follower, "/v1/admin/overview").await;
    assert!(overview.status.snapshot_index.is_some());
    assert!(overview.status.snapshot_index >= snap.snapshot_index);

    phase("remove a member through the admin endpoint");
    let gone = (1..=3)
        .find(|id| *id != now && *id != follower)
        .unwrap_or(leader);
    let (status, body) = cluster
        .post(
            follower,
            "/v1/admin/members/remove",
            &AdminRemoveMember {
                operator: "bob".into(),
                node_id: gone,
            },
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let voters: MembershipResponse = serde_json::from_str(&body).expect("membership");
    assert!(!voters.voters.contains(&gone), "{voters:?}");
    let tail: AuditTail = cluster
        .get(follower, "/v1/admin/audit?caller=operator:bob")
        .await;
    let ops: Vec<&str> = tail.entries.iter().map(|e| e.op.as_str()).collect();
    assert!(
        ops.contains(&"snapshot") && ops.contains(&"remove_member"),
        "{ops:?}"
    );
}

/// Lock calls are audited on the node that answered, in memory for the tail and as JSON lines
/// in `<data_dir>/audit/audit.log`, with a lease digest and never the lease id; the admin reads
/// refuse bad input with a clear 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_calls_are_audited_on_disk_without_lease_ids_and_bad_reads_are_400() {
    use lock_core::wire::{AuditEntry, AuditTail, LeaseRequest};
    let cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    // A follower answers: it forwards both calls and audits them itself, though it may not
    // have applied the grant yet when the release arrives.
    let f = (1..=3).find(|id| *id != leader).expect("a follower");
    let other = (1..=3).find(|id| *id != f).expect("another node");

    phase("acquire and release through a follower");
    let lease = cluster.acquire(f, "kv:audited", "auditor").await;
    let (status, body) = cluster
        .post(
            f,
            "/v1/locks/kv:audited/release",
            &LeaseRequest {
                lease_id: Some(lease.lease_id),
            },
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");

    phase("the tail and the file hold both calls, with the digest, never the id");
    let tail: AuditTail = cluster.get(f, "/v1/admin/audit?resource=kv:audited").await;
    let ops: Vec<(&str, &str)> = tail
        .entries
        .iter()
        .map(|e| (e.op.as_str(), e.outcome.as_str()))
        .collect();
    assert_eq!(ops, [("acquire", "granted"), ("release", "released")]);
    for e in &tail.entries {
        assert_eq!(e.lease_digest, Some(lease.lease_id.digest()));
        assert_eq!(e.token, Some(lease.fencing_token));
        // Keys are off: nobody is authenticated, the holder is the name the acquire gave.
        assert_eq!(e.caller, None);
        assert_eq!(e.holder.as_deref(), Some("auditor"));
        assert_eq!(e.node_id, f);
    }
    let file = cluster._dir.path().join(format!("node{f}/audit/audit.log"));
    let text = std::fs::read_to_string(&file).expect("audit file");
    assert!(
        !text.contains(&lease.lease_id.to_string()),
        "lease id in the audit log"
    );
    let on_disk: Vec<AuditEntry> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON entry per line"))
        .filter(|e: &AuditEntry| e.resource.as_deref() == Some("kv:audited"))
        .collect();
    assert_eq!(on_disk, tail.entries);
    // Another node answered none of these calls.
    let tail: AuditTail = cluster
        .get(other, "/v1/admin/audit?resource=kv:audited")
        .await;
    assert!(tail.entries.is_empty(), "{tail:?}");

    phase("bad reads are 400 with the usual error body");
    for path in [
        "/v1/admin/hot?limit=0",
        "/v1/admin/hot?limit=100000",
        "/v1/admin/audit?limit=ten",
        "/v1/admin/series?since=yesterday",
        "/v1/admin/resources/bad%20name",
        "/v1/locks?limit=0",
    ] {
        let r = cluster
            .http
            .get(cluster.url(1, path))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status().as_u16(), 400, "{path}");
        let body: ErrorBody = r.json().await.expect("error body");
        assert_eq!(body.error.as_str(), "invalid_request", "{path}");
    }
}

/// `POST /orders` through node `id`'s proxy with an `Idempotency-Key`: the status, whether it
/// was a replay, who resolved it (if an operator did) and the body.
async fn post_order(
    cluster: &Cluster,
    id: u64,
    key: &str,
    body: &str,
) -> (u16, bool, Option<String>, String) {
    let r = cluster
        .http
        .post(format!("http://{}/orders", cluster.proxies[&id].0))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_string())
        .send()
        .await
        .expect("POST /orders");
    let header = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let resolved_by = header("idempotent-resolved-by");
    let status = r.status().as_u16();
    (status, replayed, resolved_by, r.text().await.expect("body"))
}

/// Operators settle idempotency keys whose outcome is unknown (the proxy lost the upstream's
/// answer and refuses to run the request again): the page lists them behind the admin
/// credential; "It ran" makes retries replay a fixed answer naming the operator, never a second
/// effect; "It never ran" frees the key for exactly one new attempt; a resolution naming an
/// attempt that is not the unknown one is refused; every resolution and refusal is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_idempotency_outcomes_are_listed_and_resolved_from_the_page() {
    use fencegate_proxy::idempotency::contract::fingerprint;
    use lock_core::machine::{Command, IdemCommand, IdemOutcome, IdemScope, Response};
    use lock_core::wire::{
        AuditTail, IdemResolution, IdemResolveRequest, IdemResolvedAnswer, IdemUnknownPage,
        StoreLogEntry,
    };
    let cluster = Cluster::start().await;
    cluster.wait_leader(None).await;
    let body = r#"{"item":"lamp"}"#;

    phase("two create-order claims whose proxies went silent before the upstream answered");
    for (key, attempt) in [("ui-ran", 7u64), ("ui-never", 8)] {
        let claim = IdemCommand::Claim {
            scope: IdemScope {
                tenant: "demo".into(),
                route: "/orders".into(),
                key: key.into(),
            },
            fingerprint: fingerprint(
                "POST",
                "/orders",
                Some("application/json"),
                body.as_bytes(),
                std::iter::empty(),
            ),
            owner: 1,
            attempt,
            lease_ms: 300,
            retain_ms: 3_600_000,
            tombstone_ms: 3_600_000,
        };
        let node = &cluster.nodes[&1].as_ref().expect("node 1").node;
        let answer = node.propose(Command::Idem(claim)).await.expect("claim");
        assert_eq!(answer, Response::Idem(IdemOutcome::Claimed { attempt }));
    }

    phase("the list needs the credential; with it, both keys once their claims have ended");
    let list = "/v1/admin/idempotency/unknown?limit=10";
    let r = cluster
        .http
        .get(cluster.url(2, list))
        .send()
        .await
        .expect("list");
    assert_eq!(r.status().as_u16(), 401);
    let mut page: Option<IdemUnknownPage> = None;
    eventually(EVENT, "both keys listed as unknown", async || {
        let r = cluster
            .http
            .get(cluster.url(2, list))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("list");
        page = r.json().await.ok();
        page.as_ref().is_some_and(|p| p.records.len() == 2)
    })
    .await;
    let page = page.expect("a page");
    let mut keys: Vec<(&str, &str)> = page
        .records
        .iter()
        .map(|r| (r.key.as_str(), r.attempt.as_str()))
        .collect();
    keys.sort();
    assert_eq!(keys, [("ui-never", "8"), ("ui-ran", "7")]);
    assert_eq!(page.next, None);

    phase("pages of one: each cursor leads to the next record, then to the end");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..3 {
        let mut url = "/v1/admin/idempotency/unknown?limit=1".to_string();
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page: IdemUnknownPage = cluster
            .http
            .get(cluster.url(3, &url))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("page")
            .json()
            .await
            .expect("page body");
        seen.extend(page.records.into_iter().map(|r| r.key));
        after = page.next;
        if after.is_none() {
            break;
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        ["ui-never", "ui-ran"],
        "every record once, across pages"
    );
    assert_eq!(after, None, "the pages end");

    // (A retry through a proxy now would reconcile: the dev route asks the store's lookup,
    // which would prove "never ran". Keys without a lookup stay unknown until resolved.)
    phase("a resolution naming another attempt is refused");
    let wrong = IdemResolveRequest {
        operator: "carol".into(),
        tenant: "demo".into(),
        route: "/orders".into(),
        key: "ui-ran".into(),
        attempt: "999".into(),
        resolution: IdemResolution::NeverRan,
    };
    let path = "/v1/admin/idempotency/resolve";
    let (status, text) = cluster.post(2, path, &wrong, None).await;
    assert_eq!(status, 401, "{text}");
    let (status, text) = cluster.post(2, path, &wrong, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 409, "{text}");
    let refusal: ErrorBody = serde_json::from_str(&text).expect("error body");
    assert_eq!(refusal.error.as_str(), "idempotency_not_unknown");

    phase("on the page: 'It ran' on one key, 'It never ran' on the other");
    let browser = Browser::start().await;
    let base = format!("http://{}", cluster.addrs[&2]);
    browser.open(&base, "idempotency").await;
    browser
        .wait_text("#idem-note", "the page asks for the credential", |t| {
            t.contains("admin token")
        })
        .await;
    browser.fill("#operator", "carol").await;
    browser.fill("#admin-token", ADMIN_TOKEN).await;
    browser
        .wait_text("#idem-table tbody", "both keys on the page", |t| {
            t.contains("ui-ran") && t.contains("ui-never")
        })
        .await;
    browser.screenshot("idempotency").await;
    // A keyboard user tabs to a button and keeps it across the page's polls.
    browser
        .focus(r#"#idem-table tr[data-key="ui-ran"] .resolve-succeeded"#)
        .await;
    browser.wait_polls("/v1/admin/idempotency/unknown", 3).await;
    assert!(
        browser.still_focused().await,
        "the focus left 'It ran…' when the page polled"
    );
    browser
        .click(r#"#idem-table tr[data-key="ui-ran"] .resolve-succeeded"#)
        .await;
    browser.click("#confirm-yes").await;
    let done = browser
        .wait_text("#idem-result", "the first resolution", |t| {
            t.starts_with("Done") || t.starts_with("Refused")
        })
        .await;
    assert!(done.starts_with("Done (200)"), "{done}");
    browser
        .wait_text(
            "#idem-table tbody",
            "the resolved key leaves the list",
            |t| !t.contains("ui-ran") && t.contains("ui-never"),
        )
        .await;
    browser
        .click(r#"#idem-table tr[data-key="ui-never"] .resolve-never_ran"#)
        .await;
    browser.click("#confirm-yes").await;
    browser
        .wait_text("#idem-note", "no key left unknown", |t| {
            t.contains("No key has an unknown outcome")
        })
        .await;
    let done = browser.text("#idem-result").await;
    assert!(done.starts_with("Done (200)"), "{done}");

    phase("retries: the key that ran replays the operator's answer; the freed key runs once");
    let (status, replayed, resolved_by, text) = post_order(&cluster, 1, "ui-ran", body).await;
    assert_eq!(
        (status, replayed, resolved_by.as_deref()),
        (200, true, Some("carol")),
        "{text}"
    );
    let answer: IdemResolvedAnswer = serde_json::from_str(&text).expect("resolved answer");
    assert_eq!(answer.resolved_by, "carol");
    let (status, replayed, _, first) = post_order(&cluster, 2, "ui-never", body).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, _, again) = post_order(&cluster, 3, "ui-never", body).await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again, first);
    let log: Vec<StoreLogEntry> = cluster
        .http
        .get(format!("http://{}/log", cluster.store))
        .send()
        .await
        .expect("store log")
        .json()
        .await
        .expect("log JSON");
    let orders = |key: &str| {
        log.iter()
            .filter(|e| e.idempotency_key.as_deref() == Some(key))
            .count()
    };
    assert_eq!((orders("ui-ran"), orders("ui-never")), (0, 1), "{log:?}");

    phase("the audit panel shows both resolutions and the refusal");
    let tail: AuditTail = cluster
        .get(2, "/v1/admin/audit?caller=operator:carol")
        .await;
    let outcomes: Vec<&str> = tail
        .entries
        .iter()
        .filter(|e| e.op == "idempotency_resolve")
        .map(|e| e.outcome.as_str())
        .collect();
    for want in ["succeeded", "never_ran", "idempotency_not_unknown"] {
        assert!(outcomes.contains(&want), "{want} in {outcomes:?}");
    }
    let r = cluster
        .http
        .get(cluster.url(2, "/metrics"))
        .send()
        .await
        .expect("metrics");
    let metrics = r.text().await.expect("metrics text");
    for resolution in ["succeeded", "never_ran"] {
        let counted = metrics.lines().any(|l| {
            l.starts_with("fencegate_idempotency_operator_resolutions_total{")
                && l.contains(&format!("resolution=\"{resolution}\""))
                && l.ends_with(" 1")
        });
        assert!(counted, "{resolution} counted once in\n{metrics}");
    }
    browser.open(&base, "audit").await;
    browser
        .wait_text(
            "#audit-table tbody",
            "resolutions in the audit panel",
            |t| {
                t.contains("idempotency_resolve") && t.contains("never_ran") && t.contains("ui-ran")
            },
        )
        .await;
    browser.close().await;
}

/// The quota panel shows the `fencegate dev` quota with the tenant that used it and the
/// shares leased to the proxies; an operator changes the quota at run time with the admin
/// credential (refused without it, and with bad input), the change is a committed command
/// every node shows, and it is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quota_panel_shows_the_dev_quota_and_a_run_time_change() {
    use fencegate_proxy::config::DEV_QUOTA;
    use lock_core::wire::{AuditTail, QuotaList, SetQuotaRequest};
    let cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    phase("tenant acme uses the rate-limited route until proxy 1 holds a share");
    let proxy = cluster.proxies[&1].0.clone();
    eventually(EVENT, "a request of acme admitted by proxy 1", async || {
        cluster
            .http
            .get(format!("http://{proxy}/limited/k"))
            .header("X-Tenant", "acme")
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    // A burst over the quota's burst (200), so some of acme's requests are refused.
    let mut refused = 0;
    for _ in 0..400 {
        let r = cluster
            .http
            .get(format!("http://{proxy}/limited/k"))
            .header("X-Tenant", "acme")
            .send()
            .await;
        if r.is_ok_and(|r| r.status().as_u16() == 429) {
            refused += 1;
        }
        if refused >= 5 {
            break;
        }
    }
    assert!(
        refused > 0,
        "400 requests at once stayed within acme's quota"
    );

    // Keep acme busy: a tenant quiet for two lease durations gives its shares back.
    let busy = {
        let (http, url) = (cluster.http.clone(), format!("http://{proxy}/limited/k"));
        tokio::spawn(async move {
            loop {
                let _ = http.get(&url).header("X-Tenant", "acme").send().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    phase("node 1's metrics show acme's decisions, shares and utilisation");
    let metric = |text: &str, name: &str, labels: &[&str]| {
        text.lines().any(|l| {
            l.starts_with(&format!("fencegate_{name}{{"))
                && labels.iter().all(|want| l.contains(want))
        })
    };
    eventually(EVENT, "the quota metrics of acme", async || {
        let Ok(r) = cluster.http.get(cluster.url(1, "/metrics")).send().await else {
            return false;
        };
        let text = r.text().await.unwrap_or_default();
        let acme = "tenant=\"acme\"";
        metric(
            &text,
            "proxy_quota_requests_total",
            &[acme, "outcome=\"admitted\""],
        ) && metric(
            &text,
            "proxy_quota_requests_total",
            &[acme, "outcome=\"rejected\""],
        ) && metric(&text, "proxy_quota_rate_share", &[acme])
            && metric(&text, "proxy_quota_burst_share", &[acme])
            && metric(&text, "proxy_quota_rate_target", &[acme])
            && metric(&text, "proxy_quota_utilisation", &[acme])
    })
    .await;

    phase("the panel shows the dev quota, its tenant and proxy 1's share");
    let browser = Browser::start().await;
    browser.open(&cluster.url(follower, ""), "quotas").await;
    let panel = browser
        .wait_text("#quota-list", "the dev quota with acme's share", |t| {
            t.contains(DEV_QUOTA)
                && t.contains("R = 100/s")
                && t.contains("acme")
                && t.contains("node 1")
        })
        .await;
    assert!(panel.contains("from the proxies' config"), "{panel}");
    browser.screenshot("quotas").await;
    // On a phone the tables scroll sideways in their boxes; the page itself does not.
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("phone size");
    let (page_width, window_width): (u32, u32) = browser
        .eval(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
        )
        .await;
    assert!(
        page_width <= window_width,
        "the quota panel is {page_width} px wide in a {window_width} px window"
    );
    browser
        .client
        .set_window_size(1280, 800)
        .await
        .expect("desktop size");

    phase("a change needs the admin credential and sane numbers");
    let change = SetQuotaRequest {
        operator: "carol".into(),
        rate_per_s: 50,
        burst: 80,
        lease_ms: 2_000,
        policy: None,
        allowance: None,
    };
    let put = |body: &SetQuotaRequest, token: Option<&str>| {
        let mut req = cluster
            .http
            .put(cluster.url(follower, &format!("/v1/admin/quotas/{DEV_QUOTA}")))
            .json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.expect("put");
            (r.status().as_u16(), r.text().await.expect("body"))
        }
    };
    let (status, body) = put(&change, None).await;
    assert_eq!(status, 401, "{body}");
    let bad = SetQuotaRequest {
        rate_per_s: 0,
        ..change.clone()
    };
    let (status, body) = put(&bad, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 400, "{body}");
    let emergency_without_allowance = SetQuotaRequest {
        policy: Some("emergency".into()),
        ..change.clone()
    };
    let (status, body) = put(&emergency_without_allowance, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 400, "{body}");

    phase("the change commits; every node shows it; the page follows");
    let (status, body) = put(&change, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    for id in 1..=3 {
        eventually(EVENT, "the node applied the change", async || {
            let l: QuotaList = cluster.get(id, "/v1/admin/quotas").await;
            l.quotas.iter().any(|q| {
                q.definition.name == DEV_QUOTA
                    && q.definition.rate_per_s == 50
                    && q.definition.burst == 80
                    && q.definition.set_at_run_time
            })
        })
        .await;
    }
    browser
        .wait_text("#quota-list", "the new definition on the page", |t| {
            t.contains("R = 50/s") && t.contains("B = 80") && t.contains("set at run time")
        })
        .await;

    phase("the change and the refusal are audited");
    let tail: AuditTail = cluster
        .get(follower, "/v1/admin/audit?caller=operator:carol")
        .await;
    let outcomes: Vec<&str> = tail
        .entries
        .iter()
        .filter(|e| e.op == "set_quota")
        .map(|e| e.outcome.as_str())
        .collect();
    assert!(outcomes.contains(&"done"), "{tail:?}");
    assert!(outcomes.contains(&"invalid_request"), "{tail:?}");
    busy.abort();
    browser.close().await;
}

/// The page polls every second, but a poll re-renders a table only when what it shows changed;
/// when it did, the keyboard focus moves to the same link in the new rows, and a table with
/// text selected in it waits until the selection is gone. (Before, every poll replaced every
/// table: the focus fell to `<body>` within a second and a selection vanished.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyboard_focus_and_a_text_selection_survive_the_refresh() {
    let cluster = Cluster::start().await;
    let base = cluster.url(1, "");
    cluster.acquire(1, "kv:focus-a", "keyboard").await;
    let browser = Browser::start().await;

    phase("focus on a link of the locks table stays on it while nothing changes");
    browser.open(&base, "locks").await;
    eventually(EVENT, "kv:focus-a in the locks table", async || {
        browser
            .lock_rows()
            .await
            .iter()
            .any(|r| r.0 == "kv:focus-a")
    })
    .await;
    browser
        .focus("#locks-table tr[data-resource='kv:focus-a'] a")
        .await;
    browser.wait_polls("/v1/admin/locks?", 3).await;
    assert!(
        browser.still_focused().await,
        "the focus left the link when the page polled"
    );

    phase("a new row re-renders the table; the focus moves to the same link in it");
    cluster.acquire(1, "kv:focus-b", "keyboard").await;
    eventually(EVENT, "kv:focus-b in the locks table", async || {
        browser
            .lock_rows()
            .await
            .iter()
            .any(|r| r.0 == "kv:focus-b")
    })
    .await;
    browser.wait_polls("/v1/admin/locks?", 3).await;
    let focused: (String, String) = browser
        .eval(
            "const e = document.activeElement, row = e.closest('tr');
             return [e.tagName, row ? row.dataset.resource : ''];",
        )
        .await;
    assert_eq!(focused, ("A".to_string(), "kv:focus-a".to_string()));

    phase("text selected in the audit table stays selected while new lines arrive");
    browser.open(&base, "audit").await;
    browser
        .wait_text(
            "#audit-table tbody",
            "the acquires in the audit tail",
            |t| t.contains("kv:focus-b"),
        )
        .await;
    let selected: String = browser
        .eval(
            "const cell = [...document.querySelectorAll('#audit-table tbody td')]
                 .find(td => td.textContent === 'kv:focus-a');
             const range = document.createRange();
             range.selectNodeContents(cell);
             getSelection().removeAllRanges();
             getSelection().addRange(range);
             return getSelection().toString();",
        )
        .await;
    assert_eq!(selected, "kv:focus-a");
    cluster.acquire(1, "kv:focus-c", "keyboard").await;
    browser.wait_polls("/v1/admin/audit?", 3).await;
    let selected: String = browser.eval("return getSelection().toString();").await;
    assert_eq!(
        selected, "kv:focus-a",
        "the selection was cleared by a poll"
    );

    phase("once the selection is gone the table catches up");
    let _: Option<()> = browser
        .eval("getSelection().removeAllRanges(); return null;")
        .await;
    browser
        .wait_text("#audit-table tbody", "the newest acquire", |t| {
            t.contains("kv:focus-c")
        })
        .await;
    browser.close().await;
}

/// Keyboard navigation and the credential box: the skip link moves the focus to the main
/// content and keeps the view (its `#main` was routed like a view's address, which jumped to
/// Cluster); with the node's reads open, the credential box shows on the views that act and
/// nowhere else (a fieldset's `display: grid` overrode its `hidden`, so it showed everywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_skip_link_keeps_the_view_and_the_credential_box_shows_only_where_needed() {
    let cluster = Cluster::start().await;
    let leader = cluster.wait_leader(None).await;
    let base = cluster.url(1, "");
    let browser = Browser::start().await;

    phase("no credential box on the Cluster view while the node's reads are open");
    browser.open(&base, "cluster").await;
    browser
        .wait_text("#leader", "the leader", |t| t == format!("node {leader}"))
        .await;
    assert!(!browser.shown("#credential").await, "credential on Cluster");

    phase("it shows on Actions and Unknown outcomes, and only there");
    for (view, wanted) in [
        ("locks", false),
        ("actions", true),
        ("audit", false),
        ("idempotency", true),
        ("cluster", false),
    ] {
        browser.click(&format!("nav a[href='#{view}']")).await;
        let section = format!("#view-{view}");
        eventually(EVENT, &format!("the {view} view"), async || {
            browser.shown(&section).await
        })
        .await;
        assert_eq!(
            browser.shown("#credential").await,
            wanted,
            "credential box on the {view} view"
        );
    }

    phase("the skip link focuses the main content of the Locks view and stays on it");
    browser.click("nav a[href='#locks']").await;
    eventually(EVENT, "the locks view", async || {
        browser.shown("#view-locks").await
    })
    .await;
    // The link is off screen until it has the focus, as for a keyboard user tabbing to it.
    browser.focus(".skip").await;
    browser.click(".skip").await;
    let (hash, focused): (String, String) = browser
        .eval("return [location.hash, document.activeElement.id];")
        .await;
    assert_eq!((hash.as_str(), focused.as_str()), ("#locks", "main"));
    browser.wait_polls("/v1/admin/locks?", 2).await;
    assert!(browser.shown("#view-locks").await, "the Locks view left");
    assert!(
        !browser.shown("#view-cluster").await,
        "the Cluster view came"
    );
    browser.close().await;
}

/// A lock search the node refuses (a prefix no resource name can start with) shows the
/// node's answer, not "could not reach", and leaves none of the previous rows under it; a
/// search that matches nothing says so in the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_search_shows_the_answer_and_clears_the_table() {
    let cluster = Cluster::start().await;
    let base = cluster.url(1, "");
    cluster.acquire(1, "kv:search-1", "searcher").await;
    let browser = Browser::start().await;

    phase("the lock is listed");
    browser.open(&base, "locks").await;
    eventually(EVENT, "kv:search-1 in the locks table", async || {
        browser
            .lock_rows()
            .await
            .iter()
            .any(|r| r.0 == "kv:search-1")
    })
    .await;

    phase("a prefix with a space: the node's 400 in the banner, no rows");
    browser.fill("#prefix", "kv search").await;
    browser.click("#search").await;
    let banner = browser
        .wait_text("#error", "the refusal in the banner", |t| {
            t.starts_with("This node answered 400 invalid_request: prefix")
        })
        .await;
    assert!(!banner.contains("Could not reach"), "{banner}");
    assert_eq!(browser.lock_rows().await, [], "rows of the previous search");

    phase("a prefix that matches nothing: the table says so, the banner goes");
    browser.fill("#prefix", "nomatch:").await;
    browser.click("#search").await;
    browser
        .wait_text("#locks-table tbody", "the no-match row", |t| {
            t.contains("No held or waited-on resource starts with “nomatch:”")
        })
        .await;
    assert!(!browser.shown("#error").await, "the banner stayed");
    browser.close().await;
}

/// With API keys on, a tab without a valid admin key is refused each read and each refusal is
/// an audit line: the page shows the node's answer and the credential box on every view and
/// stops asking (it asked every second: 86,400 audit lines a day per tab) until the key
/// changes; with a key typed in it reads again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_admin_key_the_page_backs_off_instead_of_filling_the_audit_log() {
    use lock_core::wire::AuditTail;
    let cluster = Cluster::start_with(AuthMode::On).await;
    let leader = cluster.wait_leader(None).await;
    let base = cluster.url(1, "");
    let refusals = async || {
        let tail: AuditTail = cluster
            .get(1, "/v1/admin/audit?outcome=missing&limit=1000")
            .await;
        tail.entries
            .iter()
            .filter(|e| e.detail.as_deref() == Some("GET /v1/admin/overview"))
            .count()
    };
    let browser = Browser::start().await;

    phase("without a key: the node's 401 in the banner, the credential box on Cluster");
    browser.open(&base, "cluster").await;
    let banner = browser
        .wait_text("#error", "the refusal in the banner", |t| {
            t.starts_with("This node answered 401")
        })
        .await;
    assert!(banner.contains("Enter an admin key"), "{banner}");
    assert!(browser.shown("#credential").await, "no credential box");
    let refused = refusals().await;
    assert!(refused >= 1, "the refusal is audited");

    phase("it does not ask again each second");
    // What is checked is that nothing happens for a while: a sleep is the measurement here.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(refusals().await, refused, "the page kept polling");

    phase("with the admin key typed in, the page reads again, on every view");
    browser.fill("#admin-token", ADMIN_TOKEN).await;
    browser
        .wait_text("#leader", "the leader", |t| t == format!("node {leader}"))
        .await;
    assert!(!browser.shown("#error").await, "the banner stayed");
    assert_eq!(refusals().await, refused, "a partly typed key was tried");
    browser.open(&base, "locks").await;
    browser
        .wait_text("#page-info", "the locks view", |t| t.starts_with("page 1"))
        .await;
    assert!(browser.shown("#credential").await, "no credential box");

    phase("another tenant's lock shows under its stored name and opens its own record");
    let (status, body) = cluster
        .post(
            1,
            "/v1/admin/keys",
            &CreateKeyRequest {
                tenant: "acme".into(),
                role: KeyRole::Client,
                label: None,
            },
            None,
        )
        .await;
    assert_eq!(status, 200, "create key: {body}");
    let acme: CreatedKey = serde_json::from_str(&body).expect("created key");
    let req = AcquireRequest {
        request_id: "acme-1".into(),
        holder: Some("acme-worker".into()),
        ttl_ms: Some(120_000),
        ..Default::default()
    };
    let (status, body) = cluster
        .post(2, "/v1/locks/kv:shared/acquire", &req, Some(&acme.key))
        .await;
    assert_eq!(status, 200, "acquire as acme: {body}");
    let lease: AcquireResponse = serde_json::from_str(&body).expect("acquire response");
    let row = (
        "acme#kv:shared".to_string(),
        lease.fencing_token.to_string(),
    );
    eventually(EVENT, "acme#kv:shared in the locks table", async || {
        browser.lock_rows().await.contains(&row)
    })
    .await;
    browser
        .click("#locks-table tr[data-resource='acme#kv:shared'] a")
        .await;
    browser
        .wait_text("#resource-facts", "acme's lease on its page", |t| {
            t.contains("acme-worker") && t.contains(&lease.fencing_token.to_string())
        })
        .await;
    browser.close().await;
}
