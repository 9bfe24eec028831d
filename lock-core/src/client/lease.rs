//! A lease as the server describes it: plain data, no renewal.

/// A granted lease as the server reported it (the acquire answer). This is what the
/// `fencegate lock` CLI prints and what [`LeaseGuard::detach`](super::LeaseGuard::detach)
/// hands back.
///
/// `lease_id` is a bearer capability: whoever knows it can renew and release the lease. Do
/// not log it or send it anywhere but to the lock service.
pub type Lease = crate::wire::AcquireResponse;
