//! The etcd cluster the comparison runs against: three members started with scripts/etcd.sh
//! (or a running one with --etcd-endpoints).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cluster::process::{self, free_ports, spawn_tied};
use crate::config::RunArgs;

/// A local etcd cluster started with scripts/etcd.sh (stopped on drop).
pub struct EtcdCluster {
    script: PathBuf,
    dir: PathBuf,
    /// Removed on drop, after `Drop` has stopped the members.
    _tmp: Option<tempfile::TempDir>,
    pub endpoints: Vec<String>,
}

/// The members' data directories in the cluster's directory.
const MEMBER_DIRS: [&str; 3] = ["m1", "m2", "m3"];

impl EtcdCluster {
    /// What [`EtcdCluster::start`] would fail on, found before anything runs: a missing
    /// script, or a directory with an earlier run's members (etcd would try to rejoin their
    /// cluster on ports that are gone, and the run fail only when etcd.sh's health check
    /// gives up).
    pub fn check(script: &Path, dir: Option<&Path>) -> anyhow::Result<()> {
        if !script.is_file() {
            bail!(
                "the etcd script {} does not exist: its path is compiled into the harness from \
                 the source tree; pass --etcd-script (or --etcd-endpoints for a running etcd)",
                script.display()
            );
        }
        if let Some(d) = dir {
            if let Some(m) = MEMBER_DIRS.iter().find(|m| d.join(m).exists()) {
                bail!(
                    "--data-dir {} already holds an etcd cluster ({m}/); give an empty or new \
                     directory",
                    d.display()
                );
            }
        }
        Ok(())
    }

    /// Starts three members in `dir` (or a temp dir) and waits until they are healthy.
    pub async fn start(script: PathBuf, dir: Option<PathBuf>) -> anyhow::Result<Self> {
        Self::check(&script, dir.as_deref())?;
        let (dir, tmp) = match dir {
            Some(d) => (d, None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("fencegate-loadtest-etcd-")
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let ports = free_ports(6)?;
        let join = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        // Made before the script runs: if the harness is interrupted while it waits, the drop
        // stops the members the script has started so far (it writes their pid files first).
        let cluster = EtcdCluster {
            endpoints: ports[0..3]
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            script,
            dir,
            _tmp: tmp,
        };
        std::fs::create_dir_all(&cluster.dir)
            .with_context(|| format!("create {}", cluster.dir.display()))?;
        let log = cluster.dir.join("etcd-start.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(&cluster.script)
            .arg("start")
            .arg(&cluster.dir)
            .arg(join(&ports[0..3]))
            .arg(join(&ports[3..6]))
            // The members outlive the script; this lets them end with the harness even when
            // it is killed outright and no `Drop` runs.
            .env("ETCD_SH_OWNER_PID", std::process::id().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let mut script =
            Script(Some(spawn_tied(cmd).with_context(|| {
                format!("run {}", cluster.script.display())
            })?));
        // Polled, not waited for: the wait must end when the run is interrupted (the future
        // dropped), and the script with it.
        let status = loop {
            if let Some(status) = script.try_wait()? {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if !status.success() {
            bail!(
                "etcd.sh start failed ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        Ok(cluster)
    }

    pub fn pids(&self) -> BTreeMap<usize, u32> {
        (0..3)
            .filter_map(|i| {
                let s = std::fs::read_to_string(self.dir.join(format!("m{}.pid", i + 1))).ok()?;
                Some((i, s.trim().parse().ok()?))
            })
            .collect()
    }

    pub fn stop_member(&self, n: usize) {
        let _ = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop-member")
            .arg(&self.dir)
            .arg(n.to_string())
            .status();
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// The running `etcd.sh start`, killed if dropped before it ends.
struct Script(Option<std::process::Child>);

impl Script {
    fn try_wait(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.0.as_mut() else {
            bail!("etcd.sh is no longer running");
        };
        let status = child.try_wait().context("wait for etcd.sh")?;
        if status.is_some() {
            self.0 = None;
        }
        Ok(status)
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        if let Some(child) = self.0.take() {
            process::kill(child);
        }
    }
}

pub fn etcd_script(args: &RunArgs) -> PathBuf {
    args.etcd_script
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd.sh"))
}
