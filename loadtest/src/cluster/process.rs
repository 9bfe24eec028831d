//! OS processes: the `fencegate` binary, free ports, a cluster's directory, spawning nodes
//! and the demo store, signals, and a process's memory and CPU time.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Reserves `n` distinct free loopback ports (bound together, then released).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .context("reserve a free port")?;
    Ok(listeners
        .iter()
        .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
        .collect())
}

/// The `fencegate` binary: the explicit path, else next to this executable, else the
/// workspace's target/release or target/debug, else `fencegate` on PATH.
pub fn find_fencegate_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--fencegate-bin {} does not exist", p.display());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("fencegate"));
        }
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(ws.join("target/release/fencegate"));
    candidates.push(ws.join("target/debug/fencegate"));
    if let Some(paths) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&paths).map(|d| d.join("fencegate")));
    }
    match candidates.into_iter().find(|c| c.is_file()) {
        Some(c) => Ok(c),
        None => bail!(
            "no `fencegate` binary found: build it with `cargo build --release -p proxy --bin fencegate` \
             or pass --fencegate-bin"
        ),
    }
}

/// The directory a cluster's nodes keep their data and logs in: `dir` (created if missing), or a
/// fresh temp dir named `prefix…` that is removed when the returned guard is dropped.
pub fn cluster_dir(
    dir: Option<PathBuf>,
    prefix: &str,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
            Ok((d, None))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .context("create a temp dir")?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// Starts `fencegate node --config CONFIG`, appending its output to `log`. The node's log
/// filter comes from the environment variable `log_env` (default `warn`).
pub fn spawn_node(bin: &Path, config: &Path, log: &Path, log_env: &str) -> anyhow::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.arg("node")
        .arg("--config")
        .arg(config)
        .env(
            "RUST_LOG",
            std::env::var(log_env).unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    spawn_tied(cmd).with_context(|| format!("start {} node", bin.display()))
}

/// Starts `fencegate demo-store --listen ADDR`, its output in `log`.
pub fn spawn_demo_store(bin: &Path, addr: &str, log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.args(["demo-store", "--listen", addr])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    spawn_tied(cmd).with_context(|| format!("start {} demo-store", bin.display()))
}

/// Starts `cmd` tied to the harness: in a process group of its own, so that a Ctrl-C in the
/// terminal reaches only the harness, which then stops its processes in order (a paused node
/// is continued first); and on Linux with `PR_SET_PDEATHSIG` = SIGKILL, so that it dies with
/// the harness even when the harness is SIGKILLed and can clean up nothing.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child ends, not
/// the process; tokio's threads come and go (a blocking-pool thread ends after 10 s idle, a
/// worker that ran `block_in_place` may become one), so every child is forked by one thread
/// that lives as long as the harness ([`spawner`]).
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let harness = std::process::id();
        // SAFETY: the hook runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, getppid); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The harness may have ended between the fork and the prctl.
                if libc::getppid() as u32 != harness {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    match spawner() {
        Some(tx) => {
            let (reply, answer) = mpsc::sync_channel(1);
            if tx.send((cmd, reply)).is_err() {
                return Err(std::io::Error::other("the process spawner thread is gone"));
            }
            answer.recv().unwrap_or_else(|_| {
                Err(std::io::Error::other("the process spawner thread is gone"))
            })
        }
        None => cmd.spawn(),
    }
}

type SpawnRequest = (Command, mpsc::SyncSender<std::io::Result<Child>>);

/// The thread that forks every child of the harness (see [`spawn_tied`]); `None` if it could
/// not be started, and children are then forked by the calling thread.
fn spawner() -> Option<&'static mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("child-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: `child` is our own, not yet reaped child (we hold its `Child`), so the pid
    // cannot have been reused.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// SIGKILL: nothing flushes, nothing is said goodbye to.
pub fn kill(mut child: Child) {
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
}

/// SIGTERM, then SIGKILL if it has not exited after 5 s. A stopped (SIGSTOPped) process
/// stays stopped under SIGTERM, so it is continued first.
pub fn stop(mut child: Child) {
    signal(&child, libc::SIGCONT);
    signal(&child, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kill(child);
}

/// VmRSS and VmHWM (peak) of a process in MiB, from /proc.
pub fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Bytes process `pid` has caused to be written to storage so far (`write_bytes` in
/// /proc/PID/io: counted when pages are dirtied, so it includes what writeback sends later).
pub fn write_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let line = s.lines().find(|l| l.starts_with("write_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The machine's block-device counters summed over its disks (/proc/diskstats, without loop,
/// ram and zram devices), cumulative since boot.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct DiskCounters {
    pub writes: u64,
    pub sectors_written: u64,
    /// Milliseconds write requests spent queued and in service, summed over requests.
    pub write_ms: u64,
    /// Discards (freed blocks handed back, on a filesystem mounted with `discard`) and their
    /// summed time.
    pub discards: u64,
    pub discard_ms: u64,
    /// Cache flushes (what an fsync turns into) and their summed time.
    pub flushes: u64,
    pub flush_ms: u64,
}

pub fn disk_counters() -> Option<DiskCounters> {
    // /sys/block lists whole disks only; /proc/diskstats also has their partitions, which
    // repeat the disk's counts.
    let disks: Vec<String> = std::fs::read_dir("/sys/block")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            !["loop", "ram", "zram", "dm-"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    let s = std::fs::read_to_string("/proc/diskstats").ok()?;
    let mut total = DiskCounters::default();
    for line in s.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if !f.get(2).is_some_and(|name| disks.iter().any(|d| d == name)) {
            continue;
        }
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        total.writes += n(7);
        total.sectors_written += n(9);
        total.write_ms += n(10);
        total.discards += n(14);
        total.discard_ms += n(17);
        total.flushes += n(18);
        total.flush_ms += n(19);
    }
    Some(total)
}

/// The machine's CPU time since boot, in clock ticks, from the first line of /proc/stat: all
/// of it, and the part in which a hypervisor ran something else on this guest's CPUs
/// ("steal"). Guest time is already counted in user time, so it is left out of the total.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CpuCounters {
    pub total: u64,
    pub steal: u64,
}

pub fn cpu_counters() -> Option<CpuCounters> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(s.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal [guest guest_nice]`.
fn parse_cpu_line(line: &str) -> Option<CpuCounters> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some(CpuCounters {
        total: ticks.iter().sum(),
        steal: *ticks.get(7)?,
    })
}

/// User + system CPU seconds of this process so far.
pub fn process_cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// User + system CPU seconds process `pid` has used so far (from /proc/PID/stat).
pub fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields count from after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let utime: f64 = f.nth(11)?.parse().ok()?;
    let stime: f64 = f.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) / ticks as f64)
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_line;

    #[test]
    fn cpu_line_sums_the_eight_counters_and_keeps_steal() {
        let c = parse_cpu_line("cpu  100 5 50 800 20 1 4 20 7 0").expect("a cpu line");
        assert_eq!((c.total, c.steal), (1000, 20));
        // A kernel too old to count steal, or a per-CPU line, is not read as one.
        assert!(parse_cpu_line("cpu  100 5 50 800 20 1 4").is_none());
        assert!(parse_cpu_line("cpu0 100 5 50 800 20 1 4 20").is_none());
    }
}
