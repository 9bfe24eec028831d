//! `fencegate cluster status|add|remove|drain` and `fencegate member list`.

use lock_core::wire::{
    AddMemberRequest, ClusterStatus, DrainRequest, DrainResponse, Member, MembershipResponse,
    RemoveMemberRequest, Role,
};

use std::time::Duration;

use super::api::Api;
use super::output::{json_pretty, opt, Table};
use super::{parse_duration, CliError, ClientArgs, Format};

/// Time a membership change needs beyond catching up: joint consensus takes two commits.
const MEMBERSHIP_SLACK: Duration = Duration::from_secs(10);

/// A drain answers within 10 s (then the old leader leads on), plus a relay to the leader.
const DRAIN_WAIT: Duration = Duration::from_secs(20);

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  fencegate cluster status
  fencegate cluster status -e 10.0.1.10:7001 -o json
  fencegate cluster add --id 4 --addr 10.0.4.10:7001 --peer-addr 10.0.4.10:7101
  fencegate cluster remove --id 3")]
pub struct ClusterArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    cmd: ClusterCmd,
}

#[derive(clap::Subcommand)]
enum ClusterCmd {
    /// Show the answering node's view: its role, the leader, term, members, log positions and
    /// lock counts.
    #[command(after_help = "Example:\n  fencegate cluster status -e 127.0.0.1:7002")]
    Status,
    /// Add a node: it joins as a learner, catches up, then becomes a voter. Start the new node
    /// first (with `initial_members` listing the current members).
    #[command(
        after_help = "Example:\n  fencegate cluster add --id 4 --addr 10.0.4.10:7001 --peer-addr 10.0.4.10:7101"
    )]
    Add {
        /// Id of the new node (unique in the cluster, never reused).
        #[arg(long)]
        id: u64,
        /// `host:port` where the new node's API listens, as clients reach it.
        #[arg(long)]
        addr: String,
        /// `host:port` of the new node's peer listener (`peer_listen`), as the other nodes
        /// reach it.
        #[arg(long)]
        peer_addr: String,
        /// How long the new node may take to catch up with the leader's log before the add
        /// is refused and the learner removed again (at most 10m).
        #[arg(long, value_parser = parse_duration, default_value = "20s")]
        catch_up_timeout: Duration,
    },
    /// Move leadership away from the current leader (before stopping it for maintenance): it
    /// stops taking writes, hands over to a follower that holds its whole log, and that one
    /// wins the next election at once. Prints the old and new leader and the new term.
    #[command(
        after_help = "Examples:\n  fencegate cluster drain\n  fencegate cluster drain --to 3"
    )]
    Drain {
        /// The voter to hand leadership to (default: the follower that has lately kept up best).
        #[arg(long)]
        to: Option<u64>,
        /// Your name, for the audit log.
        #[arg(long, env = "USER", default_value = "cli")]
        operator: String,
    },
    /// Remove a voter from the cluster. Its process keeps running until you stop it.
    #[command(after_help = "Example:\n  fencegate cluster remove --id 3")]
    Remove {
        /// Id of the node to remove.
        #[arg(long)]
        id: u64,
        /// Remove it even if fewer than a quorum of the remaining voters answer (the removal
        /// is otherwise refused, because it could leave the cluster without a quorum).
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args)]
#[command(after_help = "Example:\n  fencegate member list -e 10.0.1.10:7001")]
pub struct MemberArgs {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    cmd: MemberCmd,
}

#[derive(clap::Subcommand)]
enum MemberCmd {
    /// List the cluster's members: id, API address, voter or learner, and which one leads.
    /// JSON output is the `members` array of `GET /v1/cluster`.
    #[command(after_help = "Example:\n  fencegate member list -o json | jq '.[].addr'")]
    List,
}

pub async fn cluster(args: ClusterArgs) -> Result<(), CliError> {
    let api = Api::new(&args.client)?;
    let format = args.client.format();
    match args.cmd {
        ClusterCmd::Status => {
            let status: ClusterStatus = api.admin_get("/v1/cluster").await?;
            match format {
                Format::Json => json_pretty(&status),
                Format::Table => print_status(&status),
            }
        }
        ClusterCmd::Add {
            id,
            addr,
            peer_addr,
            catch_up_timeout,
        } => {
            super::parse_endpoint(&addr).map_err(CliError::usage)?;
            super::parse_endpoint(&peer_addr).map_err(CliError::usage)?;
            let body = AddMemberRequest {
                node_id: id,
                addr,
                peer_addr,
                catch_up_timeout_ms: Some(
                    catch_up_timeout.as_millis().try_into().unwrap_or(u64::MAX),
                ),
            };
            // The answer comes once the learner caught up (or the timeout refused it).
            let wait = catch_up_timeout + MEMBERSHIP_SLACK;
            let r: MembershipResponse = api
                .admin_post("/v1/cluster/members/add", &body, wait)
                .await?;
            print_voters(&r, format);
        }
        ClusterCmd::Drain { to, operator } => {
            let body = DrainRequest { operator, to };
            let r: DrainResponse = api.admin_post("/v1/admin/drain", &body, DRAIN_WAIT).await?;
            match format {
                Format::Json => json_pretty(&r),
                Format::Table => println!(
                    "leader {} -> {} (term {})",
                    r.old_leader, r.new_leader, r.term
                ),
            }
        }
        ClusterCmd::Remove { id, force } => {
            let body = RemoveMemberRequest { node_id: id, force };
            let r: MembershipResponse = api
                .admin_post("/v1/cluster/members/remove", &body, MEMBERSHIP_SLACK)
                .await?;
            print_voters(&r, format);
        }
    }
    Ok(())
}

pub async fn member(args: MemberArgs) -> Result<(), CliError> {
    let api = Api::new(&args.client)?;
    match args.cmd {
        MemberCmd::List => {
            let status: ClusterStatus = api.admin_get("/v1/cluster").await?;
            match args.client.format() {
                Format::Json => json_pretty(&status.members),
                Format::Table => print_members(&status).print(),
            }
        }
    }
    Ok(())
}

fn print_voters(r: &MembershipResponse, format: Format) {
    match format {
        Format::Json => json_pretty(r),
        Format::Table => {
            let ids: Vec<String> = r.voters.iter().map(u64::to_string).collect();
            println!("voters: {}", ids.join(", "));
        }
    }
}

fn members_role(status: &ClusterStatus, m: &Member) -> &'static str {
    if status.leader_id == Some(m.id) {
        "leader"
    } else if m.voter {
        "voter"
    } else {
        "learner"
    }
}

fn print_members(status: &ClusterStatus) -> Table {
    let mut t = Table::new(&["ID", "ADDR", "ROLE"]);
    for m in &status.members {
        t.row(vec![
            m.id.to_string(),
            m.addr.clone(),
            members_role(status, m).into(),
        ]);
    }
    t
}

fn print_status(s: &ClusterStatus) {
    let role = match s.role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Shutdown => "shutdown",
    };
    let mut t = Table::new(&[
        "NODE",
        "ROLE",
        "LEADER",
        "TERM",
        "APPLIED",
        "LOCKS",
        "WAITERS",
        "LAST TOKEN",
    ]);
    t.row(vec![
        s.node_id.to_string(),
        role.into(),
        opt(s.leader_id),
        s.term.to_string(),
        s.last_applied.to_string(),
        s.locks.active_locks.to_string(),
        s.locks.waiters.to_string(),
        s.locks.last_token.to_string(),
    ]);
    t.print();
    println!();
    print_members(s).print();
}
