//! What a user of kubeloop needs to unit-test their own controller without an apiserver: the
//! in-memory stand-ins kubeloop's own tests use, and helpers for tokio's paused clock.
//!
//! | here                       | client-go                                                   |
//! |----------------------------|-------------------------------------------------------------|
//! | [`FakeControllerSource`]   | `tools/cache/testing` `FakeControllerSource`                |
//! | [`FakeLockStore`], [`FakeLock`] | the fake clientset with reactors, for a Lease lock     |
//! | [`settle`]                 | (none: Go tests sleep or poll)                               |
//! | [`eventually`], [`eventually_blocking`], [`eventually_explained`] | `wait.PollUntilContextTimeout`, gomega's `Eventually` |
//!
//! [`eventually`] is also the waiting helper of the real-cluster tests: one poll loop that
//! fails naming what it waited for and why it was not there yet. [`eventually_explained`] is
//! the same loop with more to say on failure; the harness (`kubeloop_testenv`) builds on it to
//! add the last lines of a program's log (`ManagedProcess::eventually`).
//!
//! A sharded controller's Leases in memory are the runtime's own (`kubeloop::runtime::FakeRing`,
//! feature `runtime`): this module is below the runtime and never names it.
//!
//! Claims about real apiserver behaviour are never tested with these; `kubeloop_testenv` runs
//! a real control plane for that.
//!
//! # Example: a controller under paused time
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kubeloop::cache::{InformerConfig, SharedIndexInformer};
//! use kubeloop::runtime::{Action, Controller, ObjectKey, ReconcileContext, default_error_policy};
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
//!             move |key: ObjectKey, _ctx: ReconcileContext| {
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

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

pub use crate::cache::fake_source::FakeControllerSource;
pub use crate::leaderelection::fake_lock::{FakeLock, FakeLockStore, Reach};

/// Lets every task that can run, run: under paused time, sleeping only completes once every
/// other task is idle, and 250 ms covers the 100 ms poll of `wait_for_cache_sync` twice.
/// Under real time it is a plain 250 ms sleep.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(250)).await;
}

/// How often [`eventually`] and [`eventually_blocking`] ask again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What a check passed to [`eventually`] may answer: `bool`, `Option<T>` (the value once
/// ready) or `Result<T, E>` (the error says why it is not ready; it ends up in the panic).
pub trait Ready {
    /// What `eventually` returns once ready.
    type Output;
    /// `Ok(value)` when ready, else why not.
    fn ready(self) -> Result<Self::Output, String>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the condition was still false".into())
        }
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(|| "still nothing".into())
    }
}

impl<T, E: Display> Ready for Result<T, E> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Runs `check` every [`POLL_INTERVAL`] until it is ready and returns its value; panics after
/// `timeout` with `what` and the last reason it gave. Time is tokio's, so paused-clock tests
/// advance through it.
pub async fn eventually<R, F, Fut>(what: &str, timeout: Duration, check: F) -> R::Output
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    eventually_explained(what, timeout, String::new, check).await
}

/// [`eventually`] whose failure message also holds what `explain` returns (a log's last lines,
/// the state of what was waited on), asked for only on failure.
pub async fn eventually_explained<R, F, Fut>(
    what: &str,
    timeout: Duration,
    explain: impl FnOnce() -> String,
    mut check: F,
) -> R::Output
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await.ready() {
            Ok(value) => return value,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                timed_out(what, timeout, &why, explain())
            }
            Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

/// [`eventually`] for code outside an async context (it sleeps the thread).
pub fn eventually_blocking<R: Ready>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> R,
) -> R::Output {
    eventually_explained_blocking(what, timeout, String::new, check)
}

/// [`eventually_explained`] for code outside an async context (it sleeps the thread).
pub fn eventually_explained_blocking<R: Ready>(
    what: &str,
    timeout: Duration,
    explain: impl FnOnce() -> String,
    mut check: impl FnMut() -> R,
) -> R::Output {
    let deadline = Instant::now() + timeout;
    loop {
        match check().ready() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => timed_out(what, timeout, &why, explain()),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// The failure of every `eventually`: what, how long, the last reason, and the explanation
/// if there is one.
fn timed_out(what: &str, timeout: Duration, why: &str, explanation: String) -> ! {
    if explanation.is_empty() {
        panic!("timed out after {timeout:?} waiting for {what}: {why}")
    }
    panic!("timed out after {timeout:?} waiting for {what}: {why}\n{explanation}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn eventually_returns_the_value_once_ready() {
        let mut n = 0;
        let got = eventually("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let ready = (n >= 3).then_some(n);
            async move { ready }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for the impossible: not yet: 7")]
    async fn eventually_panics_with_what_and_the_last_reason() {
        eventually("the impossible", Duration::from_secs(1), || async {
            Err::<(), _>("not yet: 7")
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for the impossible: not yet\nthe log says why")]
    async fn eventually_explained_adds_the_explanation_on_failure() {
        eventually_explained(
            "the impossible",
            Duration::from_secs(1),
            || "the log says why".to_string(),
            || async { false.then_some(()).ok_or("not yet") },
        )
        .await;
    }

    #[test]
    fn eventually_blocking_accepts_bools() {
        let mut calls = 0;
        eventually_blocking("the second call", Duration::from_secs(5), || {
            calls += 1;
            calls == 2
        });
        assert_eq!(calls, 2);
    }
}
