//! `fencegate keys create|list|revoke`: API keys of a cluster that requires them. Each needs an
//! admin credential (`--admin-token`, or an admin key in `--api-key`).

use std::time::Duration;

use lock_core::wire::{CreateKeyRequest, CreatedKey, KeyList, KeyRole, RevokeKeyResponse};

use super::api::Api;
use super::output::{json_pretty, Table};
use super::{CliError, ClientArgs, Format};

/// A key change is one raft commit; this leaves room for a leader election.
const KEY_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  fencegate keys create --tenant acme --role client --label 'billing workers'
  fencegate keys list -o json
  fencegate keys revoke 3f2a9c0d1e4b5a67")]
pub struct KeysArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    cmd: KeysCmd,
}

#[derive(clap::Subcommand)]
enum KeysCmd {
    /// Create a key and print it. The key is shown only now: the cluster keeps its SHA-256
    /// digest, never the key.
    #[command(after_help = "Example:\n  fencegate keys create --tenant acme --role client")]
    Create {
        /// The tenant whose namespace the key's lock calls use (a-z, 0-9, _ and -).
        #[arg(long)]
        tenant: String,
        /// `client` (lock calls) or `admin` (also keys, members and operator actions).
        #[arg(long, value_parser = parse_role, default_value = "client")]
        role: KeyRole,
        /// A note for operators: who the key is for.
        #[arg(long)]
        label: Option<String>,
    },
    /// List the cluster's keys (ids, tenants, roles; never the keys).
    #[command(after_help = "Example:\n  fencegate keys list -o json")]
    List,
    /// Revoke a key by its id: no node accepts it once this returns.
    #[command(after_help = "Example:\n  fencegate keys revoke 3f2a9c0d1e4b5a67")]
    Revoke {
        /// The key's id, as `keys list` shows it.
        id: String,
    },
}

fn parse_role(raw: &str) -> Result<KeyRole, String> {
    match raw {
        "client" => Ok(KeyRole::Client),
        "admin" => Ok(KeyRole::Admin),
        other => Err(format!("'{other}' is not a role: use client or admin")),
    }
}

pub async fn keys(args: KeysArgs) -> Result<(), CliError> {
    let api = Api::new(&args.client)?;
    let format = args.client.format();
    match args.cmd {
        KeysCmd::Create {
            tenant,
            role,
            label,
        } => {
            let body = CreateKeyRequest {
                tenant,
                role,
                label,
            };
            let created: CreatedKey = api
                .admin_post("/v1/admin/keys", &body, KEY_CHANGE_TIMEOUT)
                .await?;
            match format {
                Format::Json => json_pretty(&created),
                Format::Table => {
                    println!("key: {}", created.key);
                    println!(
                        "id: {}  tenant: {}  role: {}",
                        created.id,
                        created.tenant,
                        created.role.as_str()
                    );
                    println!("Store the key now: it is not shown again.");
                }
            }
        }
        KeysCmd::List => {
            let list: KeyList = api.admin_get("/v1/admin/keys").await?;
            match format {
                Format::Json => json_pretty(&list),
                Format::Table => {
                    let mut t = Table::new(&["ID", "TENANT", "ROLE", "LABEL"]);
                    for k in &list.keys {
                        t.row(vec![
                            k.id.clone(),
                            k.tenant.clone(),
                            k.role.as_str().into(),
                            k.label.clone().unwrap_or_default(),
                        ]);
                    }
                    t.print();
                }
            }
        }
        KeysCmd::Revoke { id } => {
            let path = format!("/v1/admin/keys/{id}/revoke");
            let r: RevokeKeyResponse = api.admin_post(&path, &(), KEY_CHANGE_TIMEOUT).await?;
            match format {
                Format::Json => json_pretty(&r),
                Format::Table if r.revoked => println!("revoked {}", r.id),
                Format::Table => println!("no key {} (already revoked?)", r.id),
            }
        }
    }
    Ok(())
}
