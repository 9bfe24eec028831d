//! The etcd cluster the comparison runs against: three members started with scripts/etcd.sh
//! (or a running one with --etcd-endpoints).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cluster::process::free_ports;
use crate::config::RunArgs;

/// A local etcd cluster started with scripts/etcd.sh (stopped on drop).
pub struct EtcdCluster {
    script: PathBuf,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub endpoints: Vec<String>,
}

impl EtcdCluster {
    pub fn start(script: PathBuf, dir: Option<PathBuf>) -> anyhow::Result<Self> {
        let (dir, tmp) = match dir {
            Some(d) => (d.join("etcd"), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("fencegate-loadtest-etcd-")
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let ports = free_ports(6)?;
        let join = |p: &[u16]| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .arg(join(&ports[0..3]))
            .arg(join(&ports[3..6]))
            .output()
            .with_context(|| format!("run {}", script.display()))?;
        let cluster = EtcdCluster {
            script,
            dir,
            _tmp: tmp,
            endpoints: ports[0..3]
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
        };
        if !out.status.success() {
            bail!(
                "etcd.sh start failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
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

pub fn etcd_script(args: &RunArgs) -> PathBuf {
    args.etcd_script
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd.sh"))
}
