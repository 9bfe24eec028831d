//! `fencegate lock …`: acquire, renew, release, cancel, status, list, watch and run.

use std::time::Duration;

use lock_core::client::{AcquireOptions, Lease};
use lock_core::wire::{self, CancelResponse, LeaseId, LockList, LockView, ReleaseResponse};

use super::api::Api;
use super::output::{expires_in, json_line, json_pretty, opt, Table};
use super::run::{self, RunArgs};
use super::{parse_duration, CliError, ClientArgs, Format};

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  fencegate lock run kv:report --ttl 30s -- ./make-report.sh
  fencegate lock acquire kv:demo --ttl 1m
  fencegate lock list --prefix kv:
  FENCEGATE_ENDPOINTS=10.0.1.10:7001,10.0.2.10:7001 fencegate lock status kv:demo")]
pub struct LockArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    cmd: LockCmd,
}

#[derive(clap::Subcommand)]
enum LockCmd {
    /// Hold a lock while a command runs: acquire, run CMD with FENCE_TOKEN and FENCE_RESOURCE
    /// in its environment, renew while it runs, stop it if the lease is lost, release at the
    /// end.
    Run(RunArgs),
    /// Take a lock once and print the lease (lease id, fencing token, expiry). Nothing renews
    /// it: renew with `lock renew` before it expires, end it with `lock release`.
    #[command(after_help = "\
Examples:
  fencegate lock acquire kv:demo
  fencegate lock acquire kv:demo --ttl 2m --wait 10s --holder backup-job -o json")]
    Acquire {
        /// Resource name: 1-256 bytes of letters, digits and . _ : / -
        resource: String,
        /// Lease length, e.g. 30s or 2m [default: the cluster's policy default, 30s unless
        /// configured].
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
        /// Wait in the resource's FIFO queue up to this long if the lock is held; 0s fails at
        /// once (exit code 3).
        #[arg(long, value_parser = parse_duration, default_value = "0s")]
        wait: Duration,
        /// A name shown to others in `lock status` and the admin UI.
        #[arg(long)]
        holder: Option<String>,
        /// Idempotency key of this acquire: repeating the command with the same id returns
        /// the same lease instead of a second one [default: a fresh random id].
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Extend a lease by its TTL, by lease id. Exit code 4 if the lease is already gone.
    #[command(after_help = "Example:\n  fencegate lock renew kv:demo --lease-id 5f0c…")]
    Renew {
        /// Resource the lease is on.
        resource: String,
        /// The lease id printed by `lock acquire` (a secret: whoever has it can end the lease).
        #[arg(long)]
        lease_id: LeaseId,
    },
    /// End a lease by lease id. Prints released=false if it had already ended; a stale id
    /// never touches a newer holder's lease.
    #[command(after_help = "Example:\n  fencegate lock release kv:demo --lease-id 5f0c…")]
    Release {
        /// Resource the lease is on.
        resource: String,
        /// The lease id printed by `lock acquire`.
        #[arg(long)]
        lease_id: LeaseId,
    },
    /// Withdraw a waiting acquire by its request id (also releases a grant its caller never
    /// saw).
    #[command(after_help = "Example:\n  fencegate lock cancel kv:demo job-42")]
    Cancel {
        /// Resource the acquire waits for.
        resource: String,
        /// The request id the acquire was made with (`lock acquire --request-id`).
        request_id: String,
    },
    /// Show one resource: held or not, holder, latest fencing token, expiry, waiters. A
    /// linearizable read, never stale.
    #[command(after_help = "Example:\n  fencegate lock status kv:demo -o json")]
    Status {
        /// Resource to show.
        resource: String,
    },
    /// List held or waited-on resources in name order, one page at a time (or all of them
    /// with --all).
    #[command(
        after_help = "When more follow a page, the table is followed by a line on stderr \
naming the --after for the next page; JSON output has it as next_after.

Examples:
  fencegate lock list --prefix kv: --limit 20
  fencegate lock list --prefix kv: --limit 20 --after kv:orders-17
  fencegate lock list --all -o json"
    )]
    List {
        /// Only resources whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Most entries to print, 1-1000 (with --all: per request).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this name: the next_after of the previous page.
        #[arg(long, value_name = "NAME")]
        after: Option<String>,
        /// Every matching resource, read page by page (each page is current when read; a
        /// resource that changes meanwhile may show on the page it had then).
        #[arg(long)]
        all: bool,
    },
    /// Print a resource's state, then every change, until Ctrl-C. JSON output is one object
    /// per line.
    #[command(after_help = "Example:\n  fencegate lock watch kv:demo --interval 500ms")]
    Watch {
        /// Resource to watch.
        resource: String,
        /// How often to read the resource.
        #[arg(long, value_parser = parse_duration, default_value = "1s")]
        interval: Duration,
    },
}

pub async fn lock(args: LockArgs) -> Result<std::process::ExitCode, CliError> {
    let format = args.client.format();
    match args.cmd {
        LockCmd::Run(run_args) => return run::run(&args.client, run_args).await,
        LockCmd::Acquire {
            resource,
            ttl,
            wait,
            holder,
            request_id,
        } => {
            let mut opts = AcquireOptions::default().wait_timeout(wait);
            opts.ttl = ttl;
            opts.holder = holder;
            opts.request_id = request_id;
            let guard = args.client.client()?.acquire(&resource, opts).await?;
            // The process exits right away: keep the lease (no renewal, no release) so `lock
            // renew` and `lock release` can use its id.
            print_lease(&guard.detach(), format);
        }
        LockCmd::Renew { resource, lease_id } => {
            let lease = args.client.client()?.renew(&resource, lease_id).await?;
            print_lease(&lease, format);
        }
        LockCmd::Release { resource, lease_id } => {
            let released = args.client.client()?.release(&resource, lease_id).await?;
            match format {
                Format::Json => json_pretty(&ReleaseResponse { released }),
                Format::Table => println!("released: {released}"),
            }
        }
        LockCmd::Cancel {
            resource,
            request_id,
        } => {
            wire::validate_id(&request_id, "request_id").map_err(CliError::usage)?;
            let cancelled = args.client.client()?.cancel(&resource, &request_id).await?;
            match format {
                Format::Json => json_pretty(&CancelResponse { cancelled }),
                Format::Table => println!("cancelled: {cancelled}"),
            }
        }
        LockCmd::Status { resource } => {
            let api = Api::new(&args.client)?;
            let view = read_one(&api, &resource).await?;
            match format {
                Format::Json => json_pretty(&view),
                Format::Table => {
                    let now = server_now_for(&api, &view).await?;
                    views_table(std::slice::from_ref(&view), now).print()
                }
            }
        }
        LockCmd::List {
            prefix,
            limit,
            after,
            all,
        } => {
            if limit == 0 || limit > wire::MAX_LIST_LIMIT {
                return Err(CliError::usage(format!(
                    "--limit must be 1-{}",
                    wire::MAX_LIST_LIMIT
                )));
            }
            let api = Api::new(&args.client)?;
            let mut list = list_page(&api, &prefix, limit, after).await?;
            while all && list.next_after.is_some() {
                let next = list_page(&api, &prefix, limit, list.next_after.take()).await?;
                list.locks.extend(next.locks);
                list.next_after = next.next_after;
            }
            match format {
                Format::Json => json_pretty(&list),
                Format::Table => {
                    views_table(&list.locks, Some(list.now_ms)).print();
                    if let Some(next) = &list.next_after {
                        eprintln!("more follow: --after '{next}' for the next page, or --all");
                    }
                }
            }
        }
        LockCmd::Watch { resource, interval } => {
            watch(&Api::new(&args.client)?, &resource, interval, format).await?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn list_page(
    api: &Api,
    prefix: &str,
    limit: usize,
    after: Option<String>,
) -> Result<LockList, CliError> {
    let mut query = vec![("prefix", prefix.to_string()), ("limit", limit.to_string())];
    query.extend(after.map(|a| ("after", a)));
    api.get("/v1/locks", &query).await
}

async fn read_one(api: &Api, resource: &str) -> Result<LockView, CliError> {
    let segment = wire::validate_resource(resource)
        .and_then(|()| wire::resource_in_path(resource))
        .map_err(|why| CliError::usage(format!("resource '{resource}': {why}")))?;
    api.get(&format!("/v1/locks/{segment}"), &[]).await
}

/// The server's log time, for the countdown of a held lock: the view (`GET /v1/locks/{r}`)
/// does not carry it, so it comes from a list read (also linearizable) made right after, which
/// can only understate the time left. `None` when the lock is not held (no countdown shown).
async fn server_now_for(api: &Api, view: &LockView) -> Result<Option<u64>, CliError> {
    if !view.held {
        return Ok(None);
    }
    let list: LockList = api
        .get(
            "/v1/locks",
            &[("prefix", view.resource.clone()), ("limit", "1".into())],
        )
        .await?;
    Ok(Some(list.now_ms))
}

/// Polls the linearizable read and prints each state that differs from the last one printed.
/// A failed read after the first is reported and polling goes on: a watch should outlive a
/// leader election.
async fn watch(
    api: &Api,
    resource: &str,
    interval: Duration,
    format: Format,
) -> Result<(), CliError> {
    if interval.is_zero() {
        return Err(CliError::usage("--interval must be positive"));
    }
    let mut last: Option<LockView> = None;
    let stop = crate::signal::shutdown_signal_now()
        .map_err(|e| CliError::internal(format!("cannot install signal handlers: {e}")))?;
    tokio::pin!(stop);
    loop {
        match read_one(api, resource).await {
            Ok(view) if last.as_ref() != Some(&view) => {
                match format {
                    Format::Json => json_line(&view),
                    Format::Table => {
                        // A failed clock read only costs the countdown of this row.
                        let now = server_now_for(api, &view).await.ok().flatten();
                        let table = views_table(std::slice::from_ref(&view), now).render();
                        // The header once, then one row per change.
                        let skip = usize::from(last.is_some());
                        for line in table.lines().skip(skip) {
                            println!("{line}");
                        }
                    }
                }
                last = Some(view);
            }
            Ok(_) => {}
            Err(e) if last.is_none() => return Err(e),
            Err(e) => eprintln!("error: {}: {} (still watching)", e.code, e.message),
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

fn print_lease(lease: &Lease, format: Format) {
    match format {
        Format::Json => json_pretty(lease),
        Format::Table => {
            // A lease just granted or renewed runs for its TTL from the leader's stamp; no
            // countdown against the local clock (see `expires_in`).
            let mut t = Table::new(&["RESOURCE", "TOKEN", "TTL", "LEASE ID"]);
            t.row(vec![
                lease.resource.clone(),
                lease.fencing_token.to_string(),
                format!("{}ms", lease.ttl_ms),
                lease.lease_id.to_string(),
            ]);
            t.print();
        }
    }
}

/// `now_ms`: the server's log time the views were read at (see `expires_in`).
fn views_table(views: &[LockView], now_ms: Option<u64>) -> Table {
    let mut t = Table::new(&[
        "RESOURCE",
        "HELD",
        "HOLDER",
        "TOKEN",
        "EXPIRES IN",
        "WAITERS",
    ]);
    for v in views {
        t.row(vec![
            v.resource.clone(),
            v.held.to_string(),
            opt(v.holder.as_deref()),
            opt(v.fencing_token),
            if v.held {
                expires_in(v.expires_at_ms, now_ms)
            } else {
                "-".into()
            },
            v.waiters.to_string(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_lease_is_not_shown_expired_when_the_server_clock_lags_ours() {
        // After an outage the leader's log time can trail the wall clock by minutes.
        let server_now = 1_000_000;
        let view = LockView {
            resource: "kv:a".into(),
            held: true,
            holder: None,
            fencing_token: Some(7),
            expires_at_ms: Some(server_now + 20_000),
            waiters: 0,
        };
        let table = views_table(&[view], Some(server_now)).render();
        assert!(table.contains("20.0s"), "{table}");
        assert!(!table.contains("expired"), "{table}");
    }
}
