//! `fencegate`: the node, the embedded local cluster (`dev`) and the operator CLI.

mod cert_dates;
mod cli;
mod demo;
mod dev;
mod fd_budget;
#[cfg(feature = "heap-stats")]
mod heap_stats;
mod logging;
mod node;
mod signal;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

// glibc malloc's arena locks showed up under proxy load (many small, short-lived allocations
// across worker threads); mimalloc's thread-local heaps avoid them.
#[cfg(all(feature = "mimalloc", not(feature = "heap-stats")))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(all(feature = "mimalloc", feature = "heap-stats"))]
#[global_allocator]
static ALLOC: heap_stats::Counting<mimalloc::MiMalloc> = heap_stats::Counting(mimalloc::MiMalloc);
#[cfg(all(not(feature = "mimalloc"), feature = "heap-stats"))]
#[global_allocator]
static ALLOC: heap_stats::Counting<std::alloc::System> = heap_stats::Counting(std::alloc::System);

const AFTER_HELP: &str = "\
Client commands find the cluster through --endpoints or FENCEGATE_ENDPOINTS (comma-separated
host:port or http://host:port, plain HTTP only; default: the three nodes of `fencegate dev`).

Examples:
  fencegate dev                                   # a local 3-node cluster with proxy and UI
  fencegate node --config /etc/fencegate/node1.toml
  fencegate lock run kv:report -- ./make-report.sh
  fencegate member list -e 10.0.1.10:7001
  fencegate backup save --out /backups/fencegate.backup
  fencegate completion bash > /etc/bash_completion.d/fencegate";

#[derive(Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fenced locks and an enforcing write proxy",
    after_help = AFTER_HELP,
    after_long_help = format!("{AFTER_HELP}\n\n{}", cli::EXIT_CODES_HELP),
)]
struct Args {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a complete local system: 3 raft nodes, their fencing proxies and the demo store.
    Dev(dev::DevArgs),
    /// Run one production node from a config file (examples in docs/deploy/).
    Node(node::NodeArgs),
    /// Run the bundled demo store alone (a key-value store that cannot check tokens).
    #[command(after_help = "Example:\n  fencegate demo-store --listen 127.0.0.1:9000")]
    DemoStore {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: String,
        /// Keep the store's writes in this file (appended before each answer, replayed at
        /// start); without it the store lives in memory only.
        #[arg(long)]
        journal: Option<std::path::PathBuf>,
    },
    /// Cluster status and membership changes.
    Cluster(cli::ClusterArgs),
    /// The cluster's members.
    Member(cli::MemberArgs),
    /// Run a command under a lock; acquire, renew, release, inspect and watch locks.
    Lock(cli::LockArgs),
    /// Create, list and revoke API keys (for a cluster that requires them).
    Keys(cli::KeysArgs),
    /// Save the cluster's state into a file; check one; restore a cluster that lost its data.
    Backup(cli::BackupArgs),
    /// Print fencegate's version.
    #[command(after_help = "Example:\n  fencegate version -o json")]
    Version {
        /// Output format [default: table when stdout is a terminal, json otherwise].
        #[arg(long, short = 'o', value_enum)]
        output: Option<cli::Format>,
    },
    /// Print a shell completion script.
    #[command(after_help = "\
Examples:
  fencegate completion bash > /etc/bash_completion.d/fencegate
  fencegate completion zsh > \"${fpath[1]}/_fencegate\"
  fencegate completion fish > ~/.config/fish/completions/fencegate.fish")]
    Completion {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

#[derive(serde::Serialize)]
struct Version {
    name: &'static str,
    version: &'static str,
    /// The commit the binary was built from.
    commit: &'static str,
}

/// Turns transparent huge pages off for this process (and the nodes it runs). The allocator
/// asks the kernel for huge pages on its arenas; then the first touch of fresh memory zeroes
/// 2 MiB at a time, and a huge page counts in full against the resident set as soon as any of
/// it is used. At the seed workload that zeroing was half of a follower's CPU while it installed
/// the leader's snapshot, and with huge pages off each node's resident set at the full retry
/// window was 34–36 MiB smaller (docs/benchmarks.md). The setting is the process's own
/// (`prctl`); the machine's is left alone.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::warn!("transparent huge pages stay on for this process: {e}");
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    lock_core::build_info::set_build(env!("CARGO_PKG_VERSION"), env!("FENCEGATE_COMMIT"));
    let args = Args::parse();
    let serves = matches!(args.cmd, Cmd::Dev(_) | Cmd::Node(_) | Cmd::DemoStore { .. });
    if !serves {
        die_on_closed_stdout();
    }
    if let Err(e) = logging::init(&args.log, if serves { "info" } else { "warn" }) {
        return cli::CliError::usage(e).report();
    }
    if serves {
        no_transparent_huge_pages();
        #[cfg(feature = "heap-stats")]
        heap_stats::report();
    }
    match args.cmd {
        Cmd::Dev(a) => served(dev::run(a).await),
        Cmd::Node(a) => match node::load(&a.config) {
            Err(e) => {
                eprintln!("error: {}", one_line(&e));
                ExitCode::from(cli::exit::USAGE)
            }
            Ok(loaded) if a.check => match loaded.check_data_dir() {
                Ok(()) => {
                    println!("{}: valid: {}", a.config.display(), loaded.summary());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: config {}: {}", a.config.display(), one_line(&e));
                    ExitCode::from(cli::exit::USAGE)
                }
            },
            Ok(loaded) => served(node::run(loaded).await),
        },
        Cmd::DemoStore { listen, journal } => served(demo::run(&listen, journal.as_deref()).await),
        Cmd::Cluster(a) => done(cli::cluster(a).await),
        Cmd::Member(a) => done(cli::member(a).await),
        Cmd::Keys(a) => done(cli::keys(a).await),
        Cmd::Backup(a) => done(cli::backup_cmd(a).await),
        Cmd::Lock(a) => cli::lock(a).await.unwrap_or_else(|e| e.report()),
        Cmd::Version { output } => {
            let v = Version {
                name: "fencegate",
                version: env!("CARGO_PKG_VERSION"),
                commit: env!("FENCEGATE_COMMIT"),
            };
            match cli::output_format(output) {
                cli::Format::Json => cli::json_pretty(&v),
                cli::Format::Table => println!("{} {} ({})", v.name, v.version, v.commit),
            }
            ExitCode::SUCCESS
        }
        Cmd::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Args::command(),
                "fencegate",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}

/// `fencegate lock list | head -1` should end quietly, like any Unix tool, instead of
/// panicking on the closed pipe. Rust ignores SIGPIPE by default, which servers need (a peer
/// closing a socket must not kill a node), so only the client commands restore it.
fn die_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_DFL installs no handler code, so nothing can run in signal context; setting
    // a disposition is process-wide and atomic, whatever threads exist.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn done(result: Result<(), cli::CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}

/// A server's start-up failure (port in use, unreadable config) is an operator error: one
/// line with its causes, no backtrace.
fn served(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(cli::exit::FAILURE)
        }
    }
}

/// `e` and its causes on one line, each said once: many errors also name their cause in
/// their own message (`data directory /x: Not a directory`), which the chain would repeat.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("data directory /x: {source}")]
        struct Names {
            #[source]
            source: std::io::Error,
        }
        let not_dir = || std::io::Error::from_raw_os_error(20);
        let e = anyhow::Error::new(Names { source: not_dir() }).context("start node 1");
        assert_eq!(
            one_line(&e),
            "start node 1: data directory /x: Not a directory (os error 20)"
        );
        let plain = anyhow::Error::new(not_dir()).context("bind 127.0.0.1:1");
        assert_eq!(
            one_line(&plain),
            "bind 127.0.0.1:1: Not a directory (os error 20)"
        );
    }

    /// Every command's help is complete: it explains itself, shows an example, and never
    /// points at documents users do not have.
    #[test]
    fn every_command_has_help_with_an_example_and_no_spec_reference() {
        fn walk(cmd: &mut clap::Command, path: String, seen: &mut usize) {
            let help = cmd.render_long_help().to_string();
            for forbidden in ["SPEC", "§"] {
                assert!(
                    !help.contains(forbidden),
                    "`{path} --help` cites {forbidden}"
                );
            }
            // clap's generated `help` subcommand mirrors the tree; it is not ours to describe.
            if cmd.get_name() == "help" {
                return;
            }
            {
                assert!(cmd.get_about().is_some(), "`{path}` has no description");
                assert!(help.contains("Example"), "`{path} --help` has no example");
                for arg in cmd.get_arguments() {
                    if arg.get_id() != "help" && arg.get_id() != "version" {
                        assert!(
                            arg.get_help().is_some() || arg.get_long_help().is_some(),
                            "`{path}`: --{} has no help",
                            arg.get_id()
                        );
                    }
                }
            }
            *seen += 1;
            for sub in cmd.get_subcommands_mut() {
                let sub_path = format!("{path} {}", sub.get_name());
                walk(sub, sub_path, seen);
            }
        }
        let mut cmd = Args::command();
        cmd.build();
        let mut seen = 0;
        walk(&mut cmd, "fencegate".into(), &mut seen);
        assert!(seen > 20, "only {seen} commands walked");
    }
}
