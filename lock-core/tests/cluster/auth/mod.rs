//! API keys and tenants on real clusters that require keys: who may call what, tenants kept
//! apart, revocation on every node, keys through restarts and snapshots, per-tenant bounds.

mod keys;
mod limits;
mod support;
mod tenants;
