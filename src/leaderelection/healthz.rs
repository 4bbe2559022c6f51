//! Health check for liveness probes (client-go: `healthzadaptor.go`, `HealthzAdaptor`).
//!
//! Created before the elector (so it can be registered with a health server early) and wired to
//! it later with [`HealthzAdaptor::set_leader_election`]; until then it reports healthy, as
//! client-go's does. It fails when the process believes it leads but its renewal is overdue by
//! more than `timeout` (see [`LeaderElector::check`]).
//!
//! With the `ops` feature it is an `ops::Check`, for the ops server's `/healthz`; that impl is
//! in `ops/routes.rs`, so that ops depends on leader election and never the reverse.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::elector::{HealthError, LeaderElector};
use super::resource_lock::ResourceLock;

/// A named health check over one elector.
#[derive(Clone)]
pub struct HealthzAdaptor {
    timeout: Duration,
    /// Set once; the check is type-erased so the adaptor does not carry the lock type.
    check: Arc<OnceLock<ElectorCheck>>,
}

type ElectorCheck = Box<dyn Fn(Duration) -> Result<(), HealthError> + Send + Sync>;

impl HealthzAdaptor {
    /// client-go `NewLeaderHealthzAdaptor(timeout)`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            check: Arc::new(OnceLock::new()),
        }
    }

    /// Wires the elector in; later calls are ignored (client-go also sets it once).
    pub fn set_leader_election<L: ResourceLock>(&self, elector: &LeaderElector<L>) {
        let elector = elector.clone();
        let _ = self
            .check
            .set(Box::new(move |tolerance| elector.check(tolerance)));
    }

    /// client-go `Name()`.
    pub fn name(&self) -> &'static str {
        "leaderElection"
    }

    /// client-go `Check(req)`.
    pub fn check(&self) -> Result<(), HealthError> {
        match self.check.get() {
            Some(check) => check(self.timeout),
            None => Ok(()),
        }
    }
}
