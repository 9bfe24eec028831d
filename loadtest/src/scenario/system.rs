//! The system under test: a fencegate cluster the harness starts ([`LocalCluster`]) or one
//! already running (`--target`), or etcd (started with scripts/etcd.sh, or
//! `--etcd-endpoints`); and the client the workload drives it with.

use lock_core::client::NodeRoute;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;

use super::etcd::{etcd_script, EtcdCluster};
use crate::backend::{Backend, EtcdClient, FencegateClient};
use crate::cluster::process::find_fencegate_bin;
use crate::cluster::status;
use crate::cluster::{ClusterSpec, LocalCluster, ProxySpec};
use crate::config::{check_loopback, ClientOpts, RunArgs, Scenario, System};
use crate::poller::Pids;

pub struct SystemUnderTest {
    pub system: System,
    /// API base URLs (fencegate) or client endpoints (etcd), by node index.
    pub bases: Vec<String>,
    /// Fencing proxy URLs (fencegate only).
    pub proxies: Vec<String>,
    /// What it is, for the summary.
    pub desc: String,
    /// The fencegate cluster the harness started, if it did.
    pub local: Option<Arc<Mutex<LocalCluster>>>,
    /// The etcd cluster the harness started, if it did.
    pub etcd: Option<EtcdCluster>,
    /// Pids of server processes the harness started, by node index (kept current across
    /// restarts, for the poller's memory samples).
    pub pids: Pids,
}

impl SystemUnderTest {
    /// `with_proxies`: a local fencegate cluster gets its fencing proxies too.
    pub async fn start(
        args: &RunArgs,
        system: System,
        with_proxies: bool,
        http: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        match system {
            System::Fencegate if !args.target.is_empty() => Self::target(args, http).await,
            System::Fencegate => Self::local(args, with_proxies).await,
            System::Etcd => Self::etcd(args).await,
        }
    }

    /// What [`SystemUnderTest::start`] would refuse, found before anything runs: `compare`
    /// checks both systems before its first half.
    pub fn check(args: &RunArgs, system: System) -> anyhow::Result<()> {
        let scenario = args.scenario;
        match system {
            System::Fencegate if !args.target.is_empty() => {
                loopback(&args.target)?;
                loopback(&args.proxy_target)?;
                if matches!(scenario, Scenario::ReplicaDown | Scenario::LeaderKill) {
                    bail!(
                        "--scenario {} stops nodes: it needs a cluster the harness starts (no \
                         --target)",
                        super::value_name(scenario)
                    );
                }
            }
            System::Fencegate => {
                find_fencegate_bin(args.fencegate_bin.as_deref())?;
                if let Some(d) = &args.data_dir {
                    LocalCluster::check_data_dir(d)?;
                }
            }
            System::Etcd => {
                if !ETCD_SCENARIOS.contains(&scenario) {
                    bail!(
                        "the etcd driver runs the steady, replica-down, ramp and cycles scenarios, \
                         not {}",
                        super::value_name(scenario)
                    );
                }
                if args.etcd_endpoints.is_empty() {
                    EtcdCluster::check(&etcd_script(args), args.data_dir.as_deref())?;
                } else {
                    loopback(&args.etcd_endpoints)?;
                }
            }
        }
        Ok(())
    }

    fn new(system: System, bases: Vec<String>, proxies: Vec<String>, desc: String) -> Self {
        SystemUnderTest {
            system,
            bases,
            proxies,
            desc,
            local: None,
            etcd: None,
            pids: Pids::default(),
        }
    }

    /// A running fencegate cluster.
    async fn target(args: &RunArgs, http: &reqwest::Client) -> anyhow::Result<Self> {
        let bases = loopback(&args.target)?;
        let proxies = loopback(&args.proxy_target)?;
        let scenario = args.scenario;
        if matches!(scenario, Scenario::ReplicaDown | Scenario::LeaderKill) {
            bail!("--scenario {scenario:?} stops nodes: it needs a cluster the harness starts (no --target)");
        }
        status::wait_ready(http, &bases, Duration::from_secs(10)).await?;
        let desc = format!("target {}", args.target.join(","));
        Ok(Self::new(System::Fencegate, bases, proxies, desc))
    }

    /// Three `fencegate node` processes, with proxies when the workload writes.
    async fn local(args: &RunArgs, with_proxies: bool) -> anyhow::Result<Self> {
        let bin = find_fencegate_bin(args.fencegate_bin.as_deref())?;
        let spec = ClusterSpec {
            tmp_prefix: "fencegate-loadtest-",
            log_env: "FENCEGATE_LOADTEST_NODE_LOG",
            proxies: with_proxies.then_some(ProxySpec::LOAD),
            fault_injection: false,
        };
        let (c, _) = LocalCluster::start_ready(
            bin.clone(),
            args.data_dir.clone(),
            spec,
            Duration::from_secs(30),
        )
        .await?;
        let desc = format!("local 3 nodes ({})", bin.display());
        let mut sut = Self::new(System::Fencegate, c.api_urls(), c.proxy_urls(), desc);
        sut.pids.replace(c.pids());
        sut.local = Some(Arc::new(Mutex::new(c)));
        Ok(sut)
    }

    async fn etcd(args: &RunArgs) -> anyhow::Result<Self> {
        if !ETCD_SCENARIOS.contains(&args.scenario) {
            bail!("the etcd driver runs the steady, replica-down, ramp and cycles scenarios");
        }
        if !args.etcd_endpoints.is_empty() {
            let endpoints = loopback(&args.etcd_endpoints)?;
            return Ok(Self::new(
                System::Etcd,
                endpoints,
                Vec::new(),
                "etcd target".into(),
            ));
        }
        let c = EtcdCluster::start(etcd_script(args), args.data_dir.clone()).await?;
        let mut sut = Self::new(
            System::Etcd,
            c.endpoints.clone(),
            Vec::new(),
            "etcd local 3 members".into(),
        );
        sut.pids.replace(c.pids());
        sut.etcd = Some(c);
        Ok(sut)
    }

    /// The client the workload runs through, talking to `bases`. With `leader_only` a
    /// fencegate client sends everything to the leader, found here first and then followed
    /// through the leader every answer names.
    pub async fn client(
        &self,
        w: &ClientOpts,
        http: &reqwest::Client,
        bases: &[String],
    ) -> anyhow::Result<Backend> {
        Ok(match self.system {
            System::Fencegate => {
                let route = match w.leader_only {
                    true => {
                        let route = NodeRoute::new(bases.len());
                        if let Some((_, idx)) = status::find_leader(http, bases).await {
                            route.point_at(idx);
                        }
                        Some(Arc::new(route))
                    }
                    false => None,
                };
                Backend::Fencegate(FencegateClient::new(
                    bases,
                    &self.proxies,
                    w.connections,
                    w.timeout,
                    w.retries,
                    route,
                )?)
            }
            System::Etcd => {
                Backend::Etcd(EtcdClient::connect(bases, w.connections, w.timeout).await?)
            }
        })
    }

    /// Nodes that exited on their own during the run.
    pub fn crashed(&self) -> Vec<String> {
        match &self.local {
            Some(c) => c.lock().map(|mut c| c.crashed()).unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// The highest token counter any fencegate node reports now.
    pub async fn last_token(&self, http: &reqwest::Client) -> Option<u64> {
        if self.system != System::Fencegate {
            return None;
        }
        let statuses = status::fetch_all(http, &self.bases).await;
        statuses.iter().map(|(_, s)| s.locks.last_token).max()
    }

    /// Stops whatever the harness started.
    pub fn stop(self) {
        if let Some(c) = self.local {
            if let Ok(mut c) = c.lock() {
                c.stop_all();
            }
        }
        drop(self.etcd);
    }
}

/// The scenarios the etcd driver runs.
const ETCD_SCENARIOS: [Scenario; 4] = [
    Scenario::Steady,
    Scenario::Ramp,
    Scenario::ReplicaDown,
    Scenario::Cycles,
];

/// Only loopback addresses are ever load targets.
fn loopback(urls: &[String]) -> anyhow::Result<Vec<String>> {
    urls.iter().map(|u| check_loopback(u)).collect()
}
