//! Waiting for a condition on cached objects: client-go `tools/watch/until.go`
//! (`UntilWithSync`), what `kubectl wait`-style code is built on.
//!
//! An informer over the [`ListerWatcher`] fills a cache; once it has synced, the optional
//! precondition looks at the cache (true: done at once, no event). Then the condition sees
//! every event in order, starting with an `Added` for each object of the initial list, so a
//! condition the cache already meets is satisfied at once, and one met later by the first
//! event that meets it. The whole wait, sync included, is bounded by `timeout`.
//!
//! Differs on purpose: one condition, not client-go's list of conditions run one after the
//! other (a condition can keep its own state); the timeout is a `Duration`, not a context.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::cache::{
    CacheObject, DeletedObject, Indexer, InformerConfig, ListerWatcher, ResourceEventHandlerFuncs,
    SharedIndexInformer,
};

/// An event as [`until_with_sync`]'s condition sees it (client-go's `watch.Event` from the
/// informer: a deletion carries the last known state).
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEvent<K> {
    /// The object was added (or listed at the start).
    Added(Arc<K>),
    /// The object changed.
    Modified(Arc<K>),
    /// The object was deleted.
    Deleted(Arc<K>),
}

impl<K> CacheEvent<K> {
    /// The object the event is about.
    pub fn object(&self) -> &Arc<K> {
        match self {
            CacheEvent::Added(o) | CacheEvent::Modified(o) | CacheEvent::Deleted(o) => o,
        }
    }
}

/// Why [`until_with_sync`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum UntilError<E> {
    /// The timeout passed first (client-go `ErrWaitTimeout`).
    #[error("{type_name}: timed out after {timeout:?} waiting for the condition{}", if *synced { "" } else { " (the cache never synced)" })]
    Timeout {
        /// The resource type.
        type_name: String,
        /// The bound.
        timeout: Duration,
        /// Whether the cache had synced.
        synced: bool,
    },
    /// The precondition or the condition failed.
    #[error("{type_name}: {source}")]
    Condition {
        /// The resource type.
        type_name: String,
        /// The condition's error.
        #[source]
        source: E,
    },
}

/// [`until_with_sync`]'s precondition (client-go `PreconditionFunc`): looks at the synced
/// cache once; true ends the wait with no event.
pub type Precondition<K, E> = Box<dyn FnOnce(&Indexer<K>) -> Result<bool, E> + Send>;

/// Waits, at most `timeout`, until `condition` holds for an event of `lw`'s objects, and
/// returns that event; `Ok(None)` when `precondition` held for the synced cache first
/// (client-go `UntilWithSync`).
///
/// # Errors
/// [`UntilError::Timeout`] when the timeout passes first; [`UntilError::Condition`] with the
/// first error the precondition or the condition returns.
///
/// # Examples
/// ```no_run
/// # use std::time::Duration;
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kubeloop::cache::ListWatch;
/// # use kubeloop::watch::{CacheEvent, until_with_sync};
/// # async fn f(client: kube_client::Client) {
/// // Wait until ConfigMap `ns/ready` has data `ready: "true"`.
/// let lw = ListWatch::<ConfigMap>::namespaced(client, "ns");
/// let ready = until_with_sync(lw, Duration::from_secs(30), None, |event| {
///     let cm = event.object();
///     Ok::<_, std::convert::Infallible>(
///         cm.metadata.name.as_deref() == Some("ready")
///             && !matches!(event, CacheEvent::Deleted(_))
///             && cm.data.as_ref().and_then(|d| d.get("ready")).is_some_and(|v| v == "true"),
///     )
/// })
/// .await;
/// # }
/// ```
pub async fn until_with_sync<K, L, E, C>(
    lw: L,
    timeout: Duration,
    precondition: Option<Precondition<K, E>>,
    mut condition: C,
) -> Result<Option<CacheEvent<K>>, UntilError<E>>
where
    K: CacheObject,
    L: ListerWatcher<K>,
    C: FnMut(&CacheEvent<K>) -> Result<bool, E>,
{
    let type_name = lw.type_description();
    let informer = SharedIndexInformer::new(lw, InformerConfig::default());
    let (tx, mut events) = mpsc::unbounded_channel();
    let (on_add, on_update, on_delete) = (tx.clone(), tx.clone(), tx);
    informer
        .add_event_handler(
            ResourceEventHandlerFuncs::new()
                .on_add(move |obj: &Arc<K>, _| {
                    let _ = on_add.send(CacheEvent::Added(obj.clone()));
                })
                .on_update(move |_: &Arc<K>, new: &Arc<K>| {
                    let _ = on_update.send(CacheEvent::Modified(new.clone()));
                })
                .on_delete(move |deleted: &DeletedObject<K>| {
                    let _ = on_delete.send(CacheEvent::Deleted(deleted.object().clone()));
                }),
        )
        .expect("a new informer takes handlers");
    informer.start();
    let wait = async {
        if !informer.wait_for_cache_sync().await {
            // Only a shutdown ends the wait unsynced; nothing shuts this informer down early.
            std::future::pending::<()>().await;
        }
        if let Some(precondition) = precondition
            && precondition(&informer.indexer())?
        {
            return Ok(None);
        }
        while let Some(event) = events.recv().await {
            if condition(&event)? {
                return Ok(Some(event));
            }
        }
        unreachable!("the informer holds the handler's sender until it is shut down");
    };
    let result = match tokio::time::timeout(timeout, wait).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(source)) => Err(UntilError::Condition { type_name, source }),
        Err(_) => Err(UntilError::Timeout {
            type_name,
            timeout,
            synced: informer.has_synced(),
        }),
    };
    informer.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::core::ObjectMeta;

    use super::*;
    use crate::testing::FakeControllerSource;

    fn cm(name: &str, ready: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("ready".to_string(), ready.to_string())].into()),
            ..Default::default()
        }
    }

    fn ready(name: &'static str) -> impl FnMut(&CacheEvent<ConfigMap>) -> Result<bool, Infallible> {
        move |event| {
            let cm = event.object();
            Ok(!matches!(event, CacheEvent::Deleted(_))
                && cm.metadata.name.as_deref() == Some(name)
                && cm.data.as_ref().is_some_and(|d| d["ready"] == "true"))
        }
    }

    // client-go: TestUntilWithSync ("precondition satisfied" / "conditions satisfied").
    #[tokio::test(start_paused = true)]
    async fn a_cache_that_already_meets_the_condition_satisfies_it_at_once() {
        let source = FakeControllerSource::<ConfigMap>::new();
        source.add(cm("a", "true"));
        let found = until_with_sync(source.clone(), Duration::from_secs(5), None, ready("a"))
            .await
            .unwrap();
        assert!(matches!(found, Some(CacheEvent::Added(_))), "{found:?}");
        let precondition: Precondition<ConfigMap, Infallible> =
            Box::new(|cache| Ok(cache.get_by_key("ns/a").is_some()));
        let found = until_with_sync(source, Duration::from_secs(5), Some(precondition), |_| {
            Ok::<_, Infallible>(false)
        })
        .await
        .unwrap();
        assert_eq!(found, None, "the precondition held: no event");
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_event_satisfies_it_and_a_condition_never_met_times_out() {
        let source = FakeControllerSource::<ConfigMap>::new();
        source.add(cm("a", "false"));
        let later = source.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            later.modify(cm("a", "true"));
        });
        let found = until_with_sync(source.clone(), Duration::from_secs(5), None, ready("a"))
            .await
            .unwrap();
        assert!(matches!(found, Some(CacheEvent::Modified(_))), "{found:?}");

        let started = tokio::time::Instant::now();
        let err = until_with_sync(source, Duration::from_secs(3), None, ready("b"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, UntilError::Timeout { synced: true, .. }),
            "{err}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
