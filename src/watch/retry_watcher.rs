//! One watch that survives cuts: client-go `tools/watch/retrywatcher.go` (`RetryWatcher`).
//!
//! It watches from a resourceVersion the caller got (from a list, say) and, whenever the
//! watch closes or breaks, watches again from the version of the last event it passed on, so
//! the caller sees every change once, in order, across cuts. The rules are client-go's:
//! - the initial version may not be `""` or `"0"` (those would make the apiserver replay
//!   synthetic adds, not resume);
//! - every watch asks for bookmarks; a bookmark moves the version on and is not passed on;
//! - a watch that closes, or whose connection breaks, is opened again at once; restarts are
//!   at least [`DEFAULT_MIN_RESTART_DELAY`] apart (client-go's `minRestartDelay`), and an
//!   ERROR event's `retryAfterSeconds` is waited first;
//! - 410 Gone (the version was compacted away) is final: it ends the stream with
//!   [`RetryWatchError::Gone`], since no retry can resume there (list again, or use an
//!   informer);
//! - 401 and 403 opening the watch are final ([`RetryWatchError::Refused`]); other failures
//!   are retried for ever (bound the wait yourself, as client-go leaves to its caller);
//! - an event whose object has no resourceVersion ends the stream: resuming after it could
//!   skip events.
//!
//! Differs on purpose: a 410 answer to the watch request itself is final too (client-go
//! retries it, which cannot succeed); an object that does not decode into `K` is skipped with
//! a warning and its version still moves the watcher on (kubeloop's informers do the same;
//! client-go's watch fails on it).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::cache::{ListWatchError, ListerWatcher, WatchOptions, WatchStream, resource_version};

/// Watches are opened at least this far apart (client-go: `NewRetryWatcherWithContext`'s 1 s).
pub const DEFAULT_MIN_RESTART_DELAY: Duration = Duration::from_secs(1);

/// Why a [`RetryWatcher`] ended (it never ends otherwise, but when dropped).
#[derive(Debug, thiserror::Error)]
pub enum RetryWatchError {
    /// The initial resourceVersion cannot be resumed from.
    #[error(
        "{type_name}: initial resourceVersion {resource_version:?} is not supported: a RetryWatcher resumes after a version a list or an object gave"
    )]
    InitialResourceVersion {
        /// The resource type.
        type_name: String,
        /// The version given.
        resource_version: String,
    },
    /// 410 Gone: the version to resume from was compacted away.
    #[error("{type_name}: cannot resume the watch at resourceVersion {resource_version}: {source}")]
    Gone {
        /// The resource type.
        type_name: String,
        /// The version the watch was to resume after.
        resource_version: String,
        /// The apiserver's answer.
        #[source]
        source: Box<ListWatchError>,
    },
    /// 401 or 403: the client may not watch the resource.
    #[error(
        "{type_name}: watch refused (check the client's credentials and its RBAC for watch): {source}"
    )]
    Refused {
        /// The resource type.
        type_name: String,
        /// The apiserver's answer.
        #[source]
        source: Box<ListWatchError>,
    },
    /// An event's object has no resourceVersion to resume after.
    #[error("{type_name}: a {event} event's object has no resourceVersion: cannot resume after it")]
    NoResourceVersion {
        /// The resource type.
        type_name: String,
        /// The event type.
        event: &'static str,
    },
}

/// A watch of `K` through `L` that resumes after cuts; a [`Stream`] of `Added`, `Modified` and
/// `Deleted` events (never a bookmark or an error event), ending after its one error. Needs a
/// tokio runtime. Dropping it stops the watch.
pub struct RetryWatcher<K> {
    events: BoxStream<'static, Result<WatchEvent<K>, RetryWatchError>>,
    last_resource_version: Arc<Mutex<String>>,
}

impl<K> std::fmt::Debug for RetryWatcher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryWatcher")
            .field("last_resource_version", &*self.last_resource_version.lock())
            .finish()
    }
}

impl<K: Clone + Send + kube_client::Resource + 'static> RetryWatcher<K> {
    /// Watches from `initial_resource_version` (client-go `NewRetryWatcherWithContext`).
    ///
    /// # Errors
    /// [`RetryWatchError::InitialResourceVersion`] for `""` or `"0"`.
    pub fn new<L: ListerWatcher<K>>(
        lw: L,
        initial_resource_version: &str,
    ) -> Result<Self, RetryWatchError> {
        Self::with_min_restart_delay(lw, initial_resource_version, DEFAULT_MIN_RESTART_DELAY)
    }

    /// [`new`](Self::new) with restarts at least `min_restart_delay` apart.
    pub fn with_min_restart_delay<L: ListerWatcher<K>>(
        lw: L,
        initial_resource_version: &str,
        min_restart_delay: Duration,
    ) -> Result<Self, RetryWatchError> {
        if matches!(initial_resource_version, "" | "0") {
            return Err(RetryWatchError::InitialResourceVersion {
                type_name: lw.type_description(),
                resource_version: initial_resource_version.to_string(),
            });
        }
        let last_resource_version = Arc::new(Mutex::new(initial_resource_version.to_string()));
        let state = State {
            type_name: lw.type_description(),
            lw,
            last: last_resource_version.clone(),
            watch: None,
            started: None,
            delay: Duration::ZERO,
            min_restart_delay,
            done: false,
        };
        let events = futures::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        })
        .boxed();
        Ok(RetryWatcher {
            events,
            last_resource_version,
        })
    }
}

impl<K> RetryWatcher<K> {
    /// The version the next watch resumes after: the last event's or bookmark's.
    pub fn last_resource_version(&self) -> String {
        self.last_resource_version.lock().clone()
    }
}

impl<K> Stream for RetryWatcher<K> {
    type Item = Result<WatchEvent<K>, RetryWatchError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_next_unpin(cx)
    }
}

struct State<K, L> {
    type_name: String,
    lw: L,
    last: Arc<Mutex<String>>,
    /// The open watch, if any.
    watch: Option<WatchStream<K>>,
    /// When the last watch was opened.
    started: Option<Instant>,
    /// Waited before the next watch opens (an ERROR event's `retryAfterSeconds`).
    delay: Duration,
    min_restart_delay: Duration,
    done: bool,
}

/// What one event of the open watch asks for.
enum Step<K> {
    Pass(WatchEvent<K>),
    Continue,
    Reopen,
    End(RetryWatchError),
}

impl<K: Clone + Send + kube_client::Resource + 'static, L: ListerWatcher<K>> State<K, L> {
    async fn next(&mut self) -> Option<Result<WatchEvent<K>, RetryWatchError>> {
        loop {
            if self.done {
                return None;
            }
            let Some(watch) = self.watch.as_mut() else {
                if let Err(e) = self.open().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            };
            let step = match watch.next().await {
                None => {
                    tracing::debug!(type_name = %self.type_name, resource_version = %self.last.lock(), "watch closed: resuming");
                    Step::Reopen
                }
                Some(Ok(event)) => self.event(event),
                Some(Err(ListWatchError::Undecodable { object, .. })) => {
                    tracing::warn!(type_name = %self.type_name, "skipping an object that does not decode: {object}");
                    if !object.resource_version.is_empty() {
                        *self.last.lock() = object.resource_version.clone();
                    }
                    Step::Continue
                }
                Some(Err(e)) => self.failed(e),
            };
            match step {
                Step::Pass(event) => return Some(Ok(event)),
                Step::Continue => {}
                Step::Reopen => self.watch = None,
                Step::End(e) => {
                    self.watch = None;
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// Opens the next watch after the restart delays; retries what may succeed later.
    async fn open(&mut self) -> Result<(), RetryWatchError> {
        loop {
            let earliest = self.started.map(|s| s + self.min_restart_delay);
            let wait = Instant::now() + std::mem::take(&mut self.delay);
            tokio::time::sleep_until(earliest.map_or(wait, |e| e.max(wait))).await;
            self.started = Some(Instant::now());
            let options = WatchOptions {
                resource_version: self.last.lock().clone(),
                allow_watch_bookmarks: true,
                ..Default::default()
            };
            match self.lw.watch(&options).await {
                Ok(stream) => {
                    self.watch = Some(stream);
                    return Ok(());
                }
                Err(e) => match self.failed(e) {
                    Step::End(e) => return Err(e),
                    _ => continue,
                },
            }
        }
    }

    fn event(&mut self, event: WatchEvent<K>) -> Step<K> {
        let (name, version) = match &event {
            WatchEvent::Added(o) => ("ADDED", resource_version(o).to_string()),
            WatchEvent::Modified(o) => ("MODIFIED", resource_version(o).to_string()),
            WatchEvent::Deleted(o) => ("DELETED", resource_version(o).to_string()),
            WatchEvent::Bookmark(b) => ("BOOKMARK", b.metadata.resource_version.clone()),
            WatchEvent::Error(status) => {
                let e = ListWatchError::from_status(
                    "WATCH",
                    &format!("({} watch stream)", self.type_name),
                    status,
                );
                return self.failed(e);
            }
        };
        if version.is_empty() {
            return Step::End(RetryWatchError::NoResourceVersion {
                type_name: self.type_name.clone(),
                event: name,
            });
        }
        *self.last.lock() = version;
        match event {
            WatchEvent::Bookmark(_) => Step::Continue,
            event => Step::Pass(event),
        }
    }

    /// A failure opening the watch or on it: final for 410, 401 and 403, retried otherwise.
    fn failed(&mut self, e: ListWatchError) -> Step<K> {
        if e.is_expired() {
            return Step::End(RetryWatchError::Gone {
                type_name: self.type_name.clone(),
                resource_version: self.last.lock().clone(),
                source: Box::new(e),
            });
        }
        if matches!(e.code(), Some(401 | 403)) {
            return Step::End(RetryWatchError::Refused {
                type_name: self.type_name.clone(),
                source: Box::new(e),
            });
        }
        if let Some(delay) = e.retry_after() {
            self.delay = delay;
        }
        tracing::debug!(type_name = %self.type_name, resource_version = %self.last.lock(), "watch failed, resuming: {e}");
        Step::Reopen
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::core::ObjectMeta;

    use super::*;
    use crate::testing::FakeControllerSource;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(events: &[WatchEvent<ConfigMap>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.clone().unwrap()),
                WatchEvent::Modified(o) => {
                    format!("MODIFIED {}", o.metadata.name.clone().unwrap())
                }
                WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.clone().unwrap()),
                other => format!("{other:?}"),
            })
            .collect()
    }

    async fn take(watcher: &mut RetryWatcher<ConfigMap>, n: usize) -> Vec<WatchEvent<ConfigMap>> {
        let mut events = Vec::new();
        for _ in 0..n {
            events.push(watcher.next().await.unwrap().unwrap());
        }
        events
    }

    // client-go: TestRetryWatcher_ConstructorValidation (empty and "0" rejected).
    #[test]
    fn empty_and_zero_initial_versions_are_refused() {
        for rv in ["", "0"] {
            let err = RetryWatcher::new(FakeControllerSource::<ConfigMap>::new(), rv).unwrap_err();
            assert!(
                matches!(err, RetryWatchError::InitialResourceVersion { .. }),
                "{rv:?}"
            );
        }
    }

    // client-go: TestRetryWatcher ("works with a broken watch", "resumes from the last RV").
    #[tokio::test(start_paused = true)]
    async fn a_broken_watch_resumes_after_the_last_event_with_nothing_lost_or_repeated() {
        let source = FakeControllerSource::<ConfigMap>::new();
        source.add(cm("before")); // rv 1: not watched
        let mut watcher = RetryWatcher::new(source.clone(), "1").unwrap();
        source.add(cm("a"));
        source.add(cm("b"));
        assert_eq!(names(&take(&mut watcher, 2).await), ["ADDED a", "ADDED b"]);
        assert_eq!(watcher.last_resource_version(), "3");
        source.break_watches();
        source.modify(cm("a"));
        source.delete(cm("b"));
        let resumed = take(&mut watcher, 2).await;
        assert_eq!(names(&resumed), ["MODIFIED a", "DELETED b"]);
        assert_eq!(watcher.last_resource_version(), "5");
    }

    // client-go: TestRetryWatcher ("fails on 410 Gone").
    #[tokio::test(start_paused = true)]
    async fn a_compacted_version_ends_the_stream_with_gone() {
        let source = FakeControllerSource::<ConfigMap>::new();
        source.add(cm("a"));
        let mut watcher = RetryWatcher::new(source.clone(), "1").unwrap();
        source.break_watches();
        source.add(cm("b"));
        source.compact();
        let err = watcher.next().await.unwrap().unwrap_err();
        assert!(
            matches!(err, RetryWatchError::Gone { ref resource_version, .. } if resource_version == "1"),
            "{err}"
        );
        assert!(
            watcher.next().await.is_none(),
            "the stream ends after its error"
        );
    }
}
