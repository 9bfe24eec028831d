//! `fencegate backup save|inspect|restore`: a file with the cluster's whole replicated state,
//! and the data directories of a new cluster made from it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_core::client::error_chain;
use lock_core::store::backup::{self, BackupSummary, RestoreSummary};
use lock_core::wire::{classify, Failure, OperatorRequest};
use serde::Serialize;

use super::output::{json_pretty, Table};
use super::{exit, CliError, ClientArgs, Format};

/// How long one node may take to build the snapshot and send it (the seed state is tens of
/// megabytes; a snapshot of it takes seconds).
const SAVE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  fencegate backup save --out /backups/fencegate-$(date +%F).backup
  fencegate backup inspect /backups/fencegate-2026-12-07.backup
  fencegate backup prepare --backup /backups/fencegate-2026-12-07.backup \\
      --config /etc/fencegate/node1.toml --out /backups/restore.prepared     # once
  fencegate backup restore --prepared /backups/restore.prepared \\
      --config /etc/fencegate/node1.toml                                    # on every member
  fencegate backup restore --backup fencegate.backup --dev     # the nodes of `fencegate dev`")]
pub struct BackupArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    cmd: BackupCmd,
}

#[derive(clap::Subcommand)]
enum BackupCmd {
    /// Save the cluster's replicated state into a file.
    ///
    /// Locks, tokens, request ids, idempotency records, quotas and API keys. It covers every
    /// write committed before the command started; the node that answers builds a snapshot
    /// for it. Needs the admin credential. The file holds lease ids and stored responses: keep
    /// it as private as the data directories.
    #[command(after_help = "Example:\n  fencegate backup save --out /backups/fencegate.backup")]
    Save {
        /// Where to write the backup (written beside it first, then renamed: an interrupted
        /// save leaves no partial file under this name).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Your name, for the audit log.
        #[arg(long, env = "USER", default_value = "cli")]
        operator: String,
    },
    /// Read a backup whole and check it; print what it holds.
    #[command(after_help = "Example:\n  fencegate backup inspect /backups/fencegate.backup")]
    Inspect {
        /// The backup file.
        file: PathBuf,
    },
    /// Turn a backup into the state a restored cluster starts from (offline, once).
    ///
    /// For a cluster that lost its data. Every lease of the backup ends (its holders acquire
    /// again), every token the lost cluster (or an earlier restore) can have issued is stale,
    /// and the raft term and log index move past theirs. The members are the config's
    /// `initial_members`. Copy the prepared file to every member and restore each from it.
    #[command(after_help = "\
Example:
  fencegate backup prepare --backup /backups/fencegate.backup --config /etc/fencegate/node1.toml \\
      --out /backups/restore.prepared")]
    Prepare {
        /// The backup file (`backup save`).
        #[arg(long, value_name = "FILE")]
        backup: PathBuf,
        /// A member's config file: its `initial_members` are the restored cluster's members.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Where to write the prepared backup.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Make a member's data directory from a prepared backup (offline).
    ///
    /// Run it on every member, with the same prepared file, while no member runs; then start
    /// them. The data directory must be missing or empty, and the config's `initial_members`
    /// must be the ones the backup was prepared for. A member left with the lost cluster's
    /// data follows the restored ones.
    #[command(after_help = "\
Examples:
  fencegate backup restore --prepared /backups/restore.prepared --config /etc/fencegate/node1.toml
  fencegate backup restore --backup fencegate.backup --dev --data-dir ./fencegate-data")]
    Restore {
        /// The prepared backup (`backup prepare`).
        #[arg(long, value_name = "FILE", required_unless_present = "dev")]
        prepared: Option<PathBuf>,
        /// The node's config file (`fencegate node --config`): its id, data directory and
        /// `initial_members`.
        #[arg(long, value_name = "FILE", required_unless_present = "dev")]
        config: Option<PathBuf>,
        /// Restore the three nodes of `fencegate dev` from a backup (prepared and restored in
        /// one step; their data directories under --data-dir must be missing or empty; the
        /// demo store's journal is left as it is).
        #[arg(long, conflicts_with_all = ["config", "prepared"], requires = "backup")]
        dev: bool,
        /// With --dev: the backup file.
        #[arg(long, value_name = "FILE")]
        backup: Option<PathBuf>,
        #[command(flatten, next_help_heading = "With --dev")]
        layout: crate::dev::DevLayout,
    },
}

pub async fn backup_cmd(args: BackupArgs) -> Result<(), CliError> {
    let format = args.client.format();
    match args.cmd {
        BackupCmd::Save { out, operator } => {
            let summary = save(&args.client, &out, &operator).await?;
            print_backup(&out, &summary, format);
        }
        BackupCmd::Inspect { file } => {
            let summary = inspect(&file)?;
            print_backup(&file, &summary, format);
        }
        BackupCmd::Prepare {
            backup,
            config,
            out,
        } => {
            let loaded =
                crate::node::load(&config).map_err(|e| CliError::usage(format!("{e:#}")))?;
            let (held, prepared) =
                lock_core::node::prepare_backup(loaded.node_config(), &backup, &out)
                    .map_err(|e| node_failed("prepare_failed", e))?;
            print_prepared(&out, &held, &prepared, format);
        }
        BackupCmd::Restore {
            prepared,
            config,
            dev,
            backup,
            layout,
        } => {
            let failed = |e| node_failed("restore_failed", e);
            let usage = |e: anyhow::Error| CliError::usage(format!("{e:#}"));
            if dev {
                let nodes = layout.node_configs().map_err(usage)?;
                // Every directory is checked before any is written.
                for node in &nodes {
                    lock_core::node::check_restore_target(&node.data_dir).map_err(failed)?;
                }
                let backup = backup.ok_or_else(|| CliError::usage("--dev needs --backup"))?;
                std::fs::create_dir_all(&layout.data_dir)
                    .map_err(|e| io_failed(&layout.data_dir, e))?;
                let prepared = layout.data_dir.join("restore.prepared");
                let (held, summary) =
                    lock_core::node::prepare_backup(&nodes[0], &backup, &prepared)
                        .map_err(|e| node_failed("prepare_failed", e))?;
                print_prepared(&prepared, &held, &summary, format);
                for node in &nodes {
                    let restored = lock_core::node::restore_data_dir(node, &prepared, None).await;
                    match restored {
                        Ok(summary) => print_restore(node.id, &node.data_dir, &summary, format),
                        Err(e) => {
                            let _ = std::fs::remove_file(&prepared);
                            return Err(failed(e));
                        }
                    }
                }
                let _ = std::fs::remove_file(&prepared);
            } else {
                let (Some(prepared), Some(config)) = (prepared, config) else {
                    return Err(CliError::usage(
                        "restore needs --prepared and --config (or --dev)",
                    ));
                };
                let loaded = crate::node::load(&config).map_err(usage)?;
                let node = loaded.node_config();
                let advertised = loaded.advertised();
                let summary = lock_core::node::restore_data_dir(node, &prepared, Some(&advertised))
                    .await
                    .map_err(failed)?;
                print_restore(node.id, &node.data_dir, &summary, format);
            }
        }
    }
    Ok(())
}

/// A failed prepare or restore: exit 2 where the config, the data directory or the backup
/// cannot be used as given (nothing was written), 1 for anything else (I/O, a damaged file).
fn node_failed(code: &'static str, e: lock_core::node::NodeError) -> CliError {
    use lock_core::node::NodeError;
    use lock_core::store::StoreError;
    let status = match &e {
        NodeError::Config(_) | NodeError::Storage(StoreError::Refused { .. }) => exit::USAGE,
        _ => exit::FAILURE,
    };
    CliError::new(status, code, e.to_string())
}

fn inspect(file: &Path) -> Result<BackupSummary, CliError> {
    backup::inspect(file).map_err(|e| {
        CliError::new(
            exit::FAILURE,
            "bad_backup",
            format!("{}: {e}", file.display()),
        )
    })
}

/// Asks the endpoints in turn for a backup and streams the first one given into `out`.
async fn save(client: &ClientArgs, out: &Path, operator: &str) -> Result<BackupSummary, CliError> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(SAVE_TIMEOUT)
        .build()
        .map_err(|e| CliError::internal(e.to_string()))?;
    let body = OperatorRequest {
        operator: operator.to_string(),
    };
    let partial = partial_path(out);
    let mut problems = Vec::new();
    for base in &client.endpoints {
        let mut req = http.post(format!("{base}/v1/admin/backup")).json(&body);
        if let Some(token) = client.admin_token.as_ref().or(client.api_key.as_ref()) {
            req = req.bearer_auth(token);
        }
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{base}: {}", error_chain(&e)));
                continue;
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let bytes = resp.bytes().await.unwrap_or_default();
            match classify::<serde_json::Value>(status, &bytes) {
                // 503 (no quorum, a node that cannot catch up) and 409 (no snapshot in time)
                // are that node's; another may succeed.
                Err(Failure::Definite { status, body }) if status != 503 && status != 409 => {
                    return Err(CliError::from_body(status, body))
                }
                Err(Failure::Definite { body, .. }) => {
                    problems.push(format!("{base}: {}", body.message));
                }
                Err(Failure::Uncertain(why)) => problems.push(format!("{base}: {why}")),
                Ok(_) => problems.push(format!("{base}: answered {status}")),
            }
            continue;
        }
        let mut file = private_file(&partial)?;
        let mut written = 0u64;
        let copied: Result<(), String> = loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if let Err(e) = file.write_all(&chunk) {
                        break Err(format!("writing {}: {e}", partial.display()));
                    }
                    written += chunk.len() as u64;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(format!("{base}: the backup broke off: {}", error_chain(&e))),
            }
        };
        if let Err(why) = copied.and_then(|()| {
            file.sync_all()
                .map_err(|e| format!("syncing {}: {e}", partial.display()))
        }) {
            let _ = std::fs::remove_file(&partial);
            problems.push(why);
            continue;
        }
        // A backup that does not read back whole is no backup.
        let summary = match inspect(&partial) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        std::fs::rename(&partial, out)
            .and_then(|()| sync_parent(out))
            .map_err(|e| io_failed(out, e))?;
        debug_assert_eq!(summary.bytes, written);
        return Ok(summary);
    }
    Err(CliError::unavailable(format!(
        "no node gave a backup ({})",
        problems.join("; ")
    )))
}

/// `<out>.partial`, beside the backup.
fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// A new file only its owner can read (one left by an earlier attempt is replaced, not reused
/// with whatever mode it had).
fn private_file(path: &Path) -> Result<std::fs::File, CliError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_failed(path, e)),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map_err(|e| io_failed(path, e))
}

fn io_failed(path: &Path, e: std::io::Error) -> CliError {
    CliError::new(
        exit::FAILURE,
        "io_error",
        format!("{}: {e}", path.display()),
    )
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)?.sync_all()
}

#[derive(Serialize)]
struct SavedBackup<'a> {
    file: &'a Path,
    #[serde(flatten)]
    summary: &'a BackupSummary,
}

fn print_backup(file: &Path, s: &BackupSummary, format: Format) {
    match format {
        Format::Json => json_pretty(&SavedBackup { file, summary: s }),
        Format::Table => {
            let mut t = Table::new(&["file", &file.display().to_string()]);
            t.row(vec!["bytes".into(), s.bytes.to_string()])
                .row(vec![
                    "covers".into(),
                    format!("term {}, log index {}", s.term, s.index),
                ])
                .row(vec!["members".into(), join(&s.members)])
                .row(vec!["resources".into(), s.resources.to_string()])
                .row(vec!["active locks".into(), s.active_locks.to_string()])
                .row(vec!["waiters".into(), s.waiters.to_string()])
                .row(vec!["request ids".into(), s.dedup_records.to_string()])
                .row(vec![
                    "idempotency records".into(),
                    s.idempotency_records.to_string(),
                ])
                .row(vec!["last token".into(), s.last_token.to_string()]);
            t.print();
        }
    }
}

#[derive(Serialize)]
struct Restored<'a> {
    node_id: u64,
    data_dir: &'a Path,
    #[serde(flatten)]
    summary: &'a RestoreSummary,
}

fn print_restore(node_id: u64, data_dir: &Path, s: &RestoreSummary, format: Format) {
    match format {
        Format::Json => json_pretty(&Restored {
            node_id,
            data_dir,
            summary: s,
        }),
        Format::Table => println!(
            "node {node_id}: {} restored at term {}, log index {} ({} resources, {} request ids, \
             {} idempotency records); every token it issues is above {}.",
            data_dir.display(),
            s.term,
            s.index,
            s.state.resources,
            s.state.dedup_records,
            s.state.idempotency_records,
            s.token_floor
        ),
    }
}

#[derive(Serialize)]
struct Prepared<'a> {
    file: &'a Path,
    backup: &'a BackupSummary,
    #[serde(flatten)]
    restored: &'a RestoreSummary,
}

fn print_prepared(file: &Path, held: &BackupSummary, s: &RestoreSummary, format: Format) {
    match format {
        Format::Json => json_pretty(&Prepared {
            file,
            backup: held,
            restored: s,
        }),
        Format::Table => {
            println!(
                "{}: the backup of log index {} ({} resources, {} active locks ending, {} \
                 idempotency records) prepared for the members {}.",
                file.display(),
                held.index,
                held.resources,
                held.active_locks,
                held.idempotency_records,
                join(&s.state.members),
            );
            println!(
                "The restored cluster starts at term {}, log index {}; every token it issues is \
                 above {}. Restore every member from this file.",
                s.term, s.index, s.token_floor
            );
        }
    }
}

fn join(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
