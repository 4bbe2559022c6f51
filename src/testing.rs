//! What a user of kubeloop needs to unit-test their own controller without an apiserver: the
//! in-memory stand-ins kubeloop's own tests use, and helpers for tokio's paused clock.
//!
//! | here                       | client-go                                                   |
//! |----------------------------|-------------------------------------------------------------|
//! | [`FakeControllerSource`]   | `tools/cache/testing` `FakeControllerSource`                |
//! | [`FakeLockStore`], [`FakeLock`] | the fake clientset with reactors, for a Lease lock     |
//! | [`settle`]                 | (none: Go tests sleep or poll)                               |
//!
//! Claims about real apiserver behaviour are never tested with these; `kubeloop::testenv` runs
//! a real control plane for that.
//!
//! # Example: a controller under paused time
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kubeloop::cache::{InformerConfig, SharedIndexInformer};
//! use kubeloop::controller::{Action, Controller, ReconcileContext, default_error_policy};
//! use kubeloop::testing::{FakeControllerSource, settle};
//! use tokio_util::sync::CancellationToken;
//!
//! let source = FakeControllerSource::<ConfigMap>::new();
//! let mut cm = ConfigMap::default();
//! cm.metadata.namespace = Some("default".into());
//! cm.metadata.name = Some("web".into());
//! source.add(cm);
//! let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
//! let s = seen.clone();
//! let shutdown = CancellationToken::new();
//! let run = tokio::spawn(
//!     Controller::new("test", SharedIndexInformer::new(source.clone(), InformerConfig::default()))
//!         .run(
//!             move |key: String, _ctx: ReconcileContext| {
//!                 s.lock().push(key);
//!                 async { Ok::<_, String>(Action::Done) }
//!             },
//!             default_error_policy,
//!             shutdown.clone(),
//!         ),
//! );
//! settle().await;
//! assert_eq!(*seen.lock(), ["default/web"]);
//! shutdown.cancel();
//! run.await.unwrap().unwrap();
//! # }
//! ```

use std::time::Duration;

pub use crate::cache::fake_source::FakeControllerSource;
pub use crate::leaderelection::fake_lock::{FakeLock, FakeLockStore, Reach};

/// Lets every task that can run, run: under paused time, sleeping only completes once every
/// other task is idle, and 250 ms covers the 100 ms poll of `wait_for_cache_sync` twice.
/// Under real time it is a plain 250 ms sleep.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(250)).await;
}

/// Polls `condition` every 10 ms until it holds or `within` has passed (on tokio's clock, so
/// paused time advances through it); returns whether it held.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
