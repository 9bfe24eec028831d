//! The Rust client: safe acquire, automatic renewal, and quiescence when the lease is
//! uncertain (guide in `docs/client.md`).
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::client::{AcquireOptions, Client};
//!
//! # async fn run() -> Result<(), lock_core::client::Error> {
//! let client = Client::new([
//!     "http://127.0.0.1:7001",
//!     "http://127.0.0.1:7002",
//!     "http://127.0.0.1:7003",
//! ])?;
//! let guard = client
//!     .acquire(
//!         "kv:report",
//!         AcquireOptions::new(Duration::from_secs(30))
//!             .wait_timeout(Duration::from_secs(10))
//!             .holder("worker-1"),
//!     )
//!     .await?;
//!
//! // Writes go through the fencing proxy with the token; once the guard is invalid they are
//! // refused locally with Error::LeaseInvalid.
//! let http = reqwest::Client::new();
//! for step in 0..10 {
//!     guard.check()?; // stop work as soon as the lease can no longer be proven
//!     let resp = guard
//!         .fenced_request(&http, reqwest::Method::PUT, "http://127.0.0.1:8001/kv/report")
//!         .body(format!("step {step}"))
//!         .send()
//!         .await?;
//!     println!("step {step}: token {} -> {}", guard.token(), resp.status());
//! }
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # How the pieces fit
//!
//! - [`Client`] holds the node URLs and moves to the next node after a connection error,
//!   timeout or `503`. [`Client::acquire`] uses one random request id for the whole logical
//!   acquire and retries with it, so a lost answer never creates a second lease.
//! - [`LeaseGuard`] renews in the background every `ttl/3` ± 20 % ([`renew_delay`]). Its
//!   local [`deadline`](LeaseGuard::deadline) is *send time of the last successful acquire or
//!   renewal + ttl − safety margin*, on the local monotonic clock. At that instant, or when
//!   the server says `lease_lost`, the guard turns invalid for good and
//!   [`lost`](LeaseGuard::lost) fires — before the server can grant the lock to anyone else.
//! - [`FencedRequest`] refuses to send once the guard is invalid; the fencing proxy rejects
//!   whatever slips through anyway. The proxy is the last line of defence, not the first.
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod acquire;
mod error;
mod fenced;
mod guard;
mod lease;
mod lock_client;
mod options;
mod route;
mod schedule;
mod state;
mod transport;

pub use crate::wire::{FENCE_RESOURCE_HEADER, FENCE_TOKEN_HEADER};
pub use error::{error_chain, Error, LostReason};
pub use fenced::FencedRequest;
pub use guard::LeaseGuard;
pub use lease::Lease;
pub use lock_client::Client;
pub use options::{AcquireOptions, ClientOptions};
pub use route::NodeRoute;
pub use schedule::{backoff_delay, new_request_id, renew_delay, RENEW_JITTER};
