//! client-go's `tools/leaderelection` on coordination.k8s.io/v1 Lease.
//!
//! | kubeloop                  | client-go                                             |
//! |---------------------------|-------------------------------------------------------|
//! | [`LeaderElector`]         | `leaderelection.go` `LeaderElector`                   |
//! | [`LeaderElectionConfig`]  | `LeaderElectionConfig` + `NewLeaderElector` validation |
//! | [`LeaseLock`]             | `resourcelock/leaselock.go`                           |
//! | [`ResourceLock`]          | `resourcelock/interface.go` `Interface`               |
//! | [`HealthzAdaptor`]        | `healthzadaptor.go`                                   |
//! | [`LeaderMetricsProvider`] | `metrics.go` (+ component-base's metric names)        |
//! | [`Clock`]                 | `k8s.io/utils/clock` (wall clock for the record only) |
//! | [`FakeLock`](crate::testing::FakeLock) | the fake clientset + reactors of client-go's tests |
//!
//! Better than client-go on purpose: the elector can contend again after losing
//! ([`LeaderElectionConfig::recontend`]); `on_stopped_leading` only runs after leading; the
//! leader's work gets a [`LeaderContext`] and is awaited (bounded) before the lease is released
//! and before `on_stopped_leading`, so it stops before the lease can pass to another holder
//! (the argument is at the top of `config.rs`); on a shutdown the lease is released *before*
//! `on_stopped_leading`, so a program that exits there has given it back; a 409 is a typed lost
//! race ([`LockError::Conflict`]); [`LeaderContext::still_leading`] lets work check its
//! entitlement before each step, [`LeaderContext::lease_valid_until`] tells it when a successor
//! could start, and [`LeaderContext::fencing_token`] hands it the Lease's transition count as a
//! fencing token; `on_new_leader` runs on a task of its own, in order, so a slow callback never
//! delays a renewal.
//!
//! Two processes with one identity never both lead (client-go lets both renew, each reading a
//! record that names "itself"): a record naming our identity counts as ours only if this
//! process wrote it. A leader that sees the Lease rewritten under its identity steps down with
//! [`StopReason::DuplicateIdentity`] and logs an error naming the identity; a candidate treats
//! such a record like any other holder's, taking it only after it stayed unchanged for its lease
//! duration, so a restarted process also waits for its dead predecessor's lease to expire.
//! [`default_identity`] gives each process its own identity (hostname + "_" + UUID).
//!
//! An in-memory lock for unit tests of code built on the elector is in [`crate::testing`]
//! ([`FakeLockStore`](crate::testing::FakeLockStore)).
//!
//! ```no_run
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use kubeloop::leaderelection::{LeaderCallbacks, LeaderElectionConfig, LeaderElector, LeaseLock};
//! use tokio_util::sync::CancellationToken;
//!
//! let lock = LeaseLock::new(client, "kube-system", "my-controller", "pod-a");
//! let elector = LeaderElector::new(LeaderElectionConfig { recontend: true, ..Default::default() }, lock)?;
//! let callbacks = LeaderCallbacks::new(
//!     |ctx| async move {
//!         while ctx.still_leading() {
//!             // one step of leader-only work, then:
//!             tokio::select! { _ = ctx.cancelled() => break, _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {} }
//!         }
//!     },
//!     || println!("stopped leading"),
//! )
//! .on_new_leader(|id| println!("leader is now {id:?}"));
//! let shutdown = CancellationToken::new();
//! elector.run(callbacks, shutdown).await;
//! # Ok(()) }
//! ```

mod clock;
// `pub(crate)` for the runtime's sharding config, which validates identities as the elector does.
pub(crate) mod config;
mod elector;
// `pub(crate)` for `crate::testing`, which re-exports the fake lock: its one public path.
pub(crate) mod fake_lock;
mod healthz;
mod lease_lock;
mod metrics;
mod resource_lock;

pub use clock::{Clock, SkewedClock, SystemClock};
pub use config::{
    ConfigError, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
    JITTER_FACTOR, LeaderElectionConfig, default_identity,
};
pub use elector::{HealthError, LeaderCallbacks, LeaderContext, LeaderElector, StopReason};
pub use healthz::HealthzAdaptor;
pub use lease_lock::LeaseLock;
pub use metrics::LeaderMetricsProvider;
pub use resource_lock::{
    LeaderElectionRecord, LockError, ResourceLock, lease_spec_to_record, record_to_lease_spec,
};
