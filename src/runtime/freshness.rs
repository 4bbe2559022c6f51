//! Read-your-writes: a reconcile does not start on a cache older than its key's own last
//! write. No client library does this yet (controller-runtime #3320, #1464; java-operator-sdk
//! compares resourceVersions by hand); Kubernetes 1.35 made it possible (KEP-5504, stable:
//! the resourceVersions of one resource type are decimal integers that grow with every write,
//! and a client may compare them).
//!
//! How:
//! - a reconcile reports each object it wrote with
//!   [`ReconcileContext::wrote`](super::ReconcileContext::wrote) (the object
//!   the apiserver returned: a status update, a patch, a create of an owned object); the
//!   runtime keeps, per key, the highest resourceVersion written per object;
//! - before the key's next reconcile starts, the worker checks each of those objects in the
//!   cache of the informer of its type: fresh when the cache holds that version or a newer
//!   one, or, for an object the cache does not hold, when that informer has delivered an
//!   event at least as new (the object was deleted since);
//! - if not fresh, the worker waits (the key stays claimed) until it is, woken by the
//!   informers' events, at most the bound ([`super::Controller::read_your_writes`], default
//!   [`DEFAULT_FRESHNESS_WAIT`]); on expiry the reconcile runs anyway and
//!   `kubeloop_reconcile_stale_total` counts it. With the wait turned off the check still
//!   runs, so the metric says how many reconciles ran on a stale cache;
//! - a key's records go once its reconcile starts fresh (or the wait expired), and when its
//!   primary object is deleted: nothing is held for keys that are gone.
//!
//! The guarantee: a reconcile started by a worker of this controller sees, in every cache
//! of this controller, every write it reported for its key, or waited the bound for it. What
//! it does not cover:
//! - writes by anyone else (another controller, a user): their versions are unknown here, and
//!   the informer's event for them is what enqueues the key anyway;
//! - writes not reported with `wrote`, writes of types this controller has no informer for,
//!   and resourceVersions apimachinery's comparison rejects (see
//!   [`crate::cache::compare_resource_version`]: an older or another apiserver): those fall back to
//!   today's behaviour, no wait;
//! - an informer whose selector leaves the written object out never holds it: reporting such
//!   a write makes the next reconcile wait the full bound;
//! - with client-go's DeltaFIFO (not the default RealFIFO) events of different objects may
//!   be applied out of order, so "delivered an event at least as new" can run ahead for an
//!   object the cache does not hold yet.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube_client::Resource;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::key::ObjectKey;
use super::reconcile_metrics::ReconcileMetrics;
use crate::cache::{
    CacheObject, DeletedObject, Lister, ResourceEventHandlerFuncs, compare_resource_version,
    is_well_formed_resource_version, newest_resource_version, resource_version,
};
use crate::trace::Stage;

/// How long a reconcile waits at most for its informers to hold its key's last write.
pub const DEFAULT_FRESHNESS_WAIT: Duration = Duration::from_secs(5);

/// The resourceVersion a cache holds for `namespace`, `name`, if it holds the object.
type StoredVersion = Box<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;

/// One informer's side: what its cache holds and the newest event it delivered.
struct Source {
    stored: StoredVersion,
    /// The newest well-formed resourceVersion among the events delivered so far.
    delivered: Mutex<Option<String>>,
}

/// One object a key's reconcile wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    source: TypeId,
    namespace: String,
    name: String,
    /// Well formed, as [`compare_resource_version`] requires.
    version: String,
}

/// Read-your-writes for one controller: its informers' sources and each key's writes.
pub(crate) struct Freshness {
    controller: String,
    /// `None`: the check runs and counts, nothing waits.
    wait: Option<Duration>,
    sources: Mutex<HashMap<TypeId, Arc<Source>>>,
    writes: Mutex<HashMap<ObjectKey, Vec<Written>>>,
    /// Notified on every event any source delivers.
    delivered: Notify,
}

impl std::fmt::Debug for Freshness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freshness")
            .field("controller", &self.controller)
            .field("wait", &self.wait)
            .field("keys", &self.writes.lock().len())
            .finish()
    }
}

impl Freshness {
    pub(crate) fn new(controller: &str, wait: Option<Duration>) -> Arc<Self> {
        Arc::new(Freshness {
            controller: controller.to_string(),
            wait,
            sources: Mutex::default(),
            writes: Mutex::default(),
            delivered: Notify::new(),
        })
    }

    /// Tracks writes of type `C`, read from `lister`. The handler returned must be registered
    /// on the informer that feeds `lister`; with `primary`, a deletion also drops the records
    /// of the deleted object's own key.
    pub(crate) fn source<C: CacheObject>(
        self: &Arc<Self>,
        lister: Lister<C>,
        primary: bool,
    ) -> ResourceEventHandlerFuncs<C> {
        let source = Arc::new(Source {
            stored: Box::new(move |namespace, name| {
                lister
                    .get(namespace, name)
                    .map(|obj| resource_version(obj.as_ref()).to_string())
            }),
            delivered: Mutex::new(None),
        });
        self.sources
            .lock()
            .insert(TypeId::of::<C>(), Arc::clone(&source));
        let seen = {
            let (freshness, source) = (Arc::downgrade(self), source);
            move |obj: &C| {
                let version = resource_version(obj);
                let mut delivered = source.delivered.lock();
                if newest_resource_version(delivered.as_deref(), version) == Some(version) {
                    *delivered = Some(version.to_string());
                }
                drop(delivered);
                if let Some(freshness) = freshness.upgrade() {
                    freshness.delivered.notify_waiters();
                }
            }
        };
        let (on_add, on_update, on_delete) = (seen.clone(), seen.clone(), seen);
        let freshness = Arc::downgrade(self);
        ResourceEventHandlerFuncs::new()
            .on_add(move |obj: &Arc<C>, _| on_add(obj))
            .on_update(move |_: &Arc<C>, new: &Arc<C>| on_update(new))
            .on_delete(move |deleted: &DeletedObject<C>| {
                if primary
                    && let (Some(freshness), Some(key)) = (
                        freshness.upgrade(),
                        super::handlers::key_of_deleted(deleted),
                    )
                {
                    freshness.writes.lock().remove(&key);
                }
                on_delete(deleted.object())
            })
    }

    /// Records that the reconcile of `key` wrote `obj` (as the apiserver returned it).
    pub(crate) fn wrote<W: Resource + 'static>(&self, key: &ObjectKey, obj: &W) {
        let source = TypeId::of::<W>();
        let version = resource_version(obj);
        if !is_well_formed_resource_version(version) {
            return;
        }
        if !self.sources.lock().contains_key(&source) {
            return;
        }
        let meta = obj.meta();
        let written = Written {
            source,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            version: version.to_string(),
        };
        let mut writes = self.writes.lock();
        let list = writes.entry(key.clone()).or_default();
        match list.iter_mut().find(|w| {
            (w.source, &w.namespace, &w.name) == (source, &written.namespace, &written.name)
        }) {
            Some(w) => {
                if newest_resource_version(Some(&w.version), version) == Some(version) {
                    w.version = version.to_string();
                }
            }
            None => list.push(written),
        }
    }

    /// The first write of `key` its cache does not hold yet, if any.
    fn missing(&self, key: &ObjectKey) -> Option<Written> {
        let writes = self.writes.lock();
        let sources = self.sources.lock();
        writes.get(key)?.iter().find_map(|w| {
            let source = sources.get(&w.source)?;
            let fresh = match (source.stored)(&w.namespace, &w.name) {
                // A cached version that cannot be compared falls back to no wait.
                Some(stored) => !matches!(
                    compare_resource_version(&stored, &w.version),
                    Ok(std::cmp::Ordering::Less)
                ),
                None => source.delivered.lock().as_deref().is_some_and(|delivered| {
                    compare_resource_version(delivered, &w.version).is_ok_and(|o| o.is_ge())
                }),
            };
            (!fresh).then(|| w.clone())
        })
    }

    /// Before `key`'s reconcile: waits, at most the bound, until every cache holds the key's
    /// last writes, then forgets them. Returns early if `cancelled` (the reconcile's token) is
    /// cancelled. It takes the token rather than the `ReconcileContext`, which records writes
    /// here: this file stays below `context.rs`.
    pub(crate) async fn hold(&self, key: &ObjectKey, cancelled: &CancellationToken) {
        // Most reconciles have no write on record: one lookup, no clock, no waiter.
        if !self.writes.lock().contains_key(key) {
            return;
        }
        let started = Instant::now();
        let deadline = started + self.wait.unwrap_or_default();
        let mut held = false;
        let outcome = loop {
            let delivered = self.delivered.notified();
            tokio::pin!(delivered);
            delivered.as_mut().enable();
            let Some(missing) = self.missing(key) else {
                break Ok(());
            };
            if self.wait.is_none() {
                break Err(missing);
            }
            held = true;
            tokio::select! {
                _ = &mut delivered => {}
                _ = tokio::time::sleep_until(deadline) => break Err(missing),
                _ = cancelled.cancelled() => return,
            }
        };
        self.writes.lock().remove(key);
        let waited = started.elapsed();
        let metrics = ReconcileMetrics::global();
        match outcome {
            Ok(()) if !held => {}
            Ok(()) => {
                metrics.held(&self.controller, waited);
                crate::trace::record(key.as_str(), Stage::FreshnessHeld, "", || {
                    format!("held {waited:.1?} until the caches held this key's last writes")
                });
            }
            Err(missing) => {
                metrics.stale(&self.controller);
                let message = format!(
                    "started on a cache older than its last write: {}/{} at resourceVersion {} not seen after {waited:.1?}",
                    missing.namespace, missing.name, missing.version
                );
                tracing::debug!(controller = %self.controller, key = %key, "{message}");
                crate::trace::record(key.as_str(), Stage::FreshnessHeld, "", || message);
            }
        }
    }

    /// Keys with writes on record (for tests).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.writes.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::core::ObjectMeta;

    use super::*;
    use crate::cache::{DeletedFinalStateUnknown, Indexers, ResourceEventHandler, ThreadSafeStore};

    fn obj<K: Resource<DynamicType = ()> + Default>(name: &str, rv: &str) -> Arc<K> {
        let mut obj = K::default();
        *obj.meta_mut() = ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        Arc::new(obj)
    }

    /// A cache the test fills by hand, and its informer's handler as the runtime registers it.
    struct Cache<K: CacheObject> {
        store: ThreadSafeStore<K>,
        handler: ResourceEventHandlerFuncs<K>,
    }

    impl<K: CacheObject + Default + Resource<DynamicType = ()>> Cache<K> {
        fn new(freshness: &Arc<Freshness>, primary: bool) -> Self {
            let store = ThreadSafeStore::new(Indexers::new());
            let handler = freshness.source(Lister::new(store.reader()), primary);
            Cache { store, handler }
        }

        /// The informer stores `name` at `rv` and delivers the event.
        fn deliver(&self, name: &str, rv: &str) {
            let obj = obj::<K>(name, rv);
            self.store.update(format!("ns/{name}"), obj.clone());
            ResourceEventHandler::on_add(&self.handler, &obj, false);
        }

        fn delete(&self, name: &str, rv: &str) {
            self.store.delete(&format!("ns/{name}"));
            ResourceEventHandler::on_delete(
                &self.handler,
                &DeletedObject::Object(obj::<K>(name, rv)),
            );
        }
    }

    fn key() -> ObjectKey {
        ObjectKey::new("ns", "a")
    }

    #[tokio::test(start_paused = true)]
    async fn writes_compare_by_apimachinerys_rules_zero_is_ignored_and_u64_is_no_limit() {
        let freshness = Freshness::new("rules", Some(Duration::from_secs(5)));
        let cache = Cache::<ConfigMap>::new(&freshness, true);
        for ignored in ["0", "012", "12a", "-1", ""] {
            freshness.wrote(&key(), obj::<ConfigMap>("a", ignored).as_ref());
            assert_eq!(
                freshness.keys(),
                0,
                "{ignored:?} is not a comparable version"
            );
        }
        // Past u64::MAX: compared as decimal numbers, not capped.
        cache.deliver("a", "18446744073709551615");
        freshness.wrote(
            &key(),
            obj::<ConfigMap>("a", "18446744073709551616").as_ref(),
        );
        assert_eq!(
            freshness.missing(&key()).unwrap().version,
            "18446744073709551616"
        );
        cache.deliver("a", "9999999999999999999");
        assert_eq!(
            freshness.missing(&key()).unwrap().version,
            "18446744073709551616"
        );
        cache.deliver("a", "100000000000000000000");
        assert_eq!(freshness.missing(&key()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_waits_until_the_cache_holds_its_keys_last_write() {
        let freshness = Freshness::new("t", Some(Duration::from_secs(5)));
        let cache = Cache::<ConfigMap>::new(&freshness, true);
        cache.deliver("a", "10");
        freshness.wrote(&key(), obj::<ConfigMap>("a", "12").as_ref());
        let (f, c) = (freshness.clone(), CancellationToken::new());
        let held = tokio::spawn(async move { f.hold(&key(), &c).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "the cache holds 10, the write was 12");
        cache.deliver("a", "11");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "11 is still older than 12");
        cache.deliver("a", "13");
        held.await.unwrap();
        assert_eq!(
            freshness.keys(),
            0,
            "a key's records go once it starts fresh"
        );
        assert_eq!(ReconcileMetrics::global().stale_count("t"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_created_object_counts_once_delivered_and_a_deleted_one_by_the_newest_event() {
        let freshness = Freshness::new("created", Some(Duration::from_secs(5)));
        let deployments = Cache::<Deployment>::new(&freshness, false);
        freshness.wrote(&key(), obj::<Deployment>("child", "20").as_ref());
        freshness.wrote(&key(), obj::<Deployment>("gone", "21").as_ref());
        let missing = freshness.missing(&key()).unwrap();
        assert_eq!(
            (missing.name.as_str(), missing.version.as_str()),
            ("child", "20")
        );
        deployments.deliver("child", "20");
        assert_eq!(freshness.missing(&key()).unwrap().name, "gone");
        deployments.deliver("gone", "21");
        deployments.delete("gone", "21");
        assert_eq!(
            freshness.missing(&key()),
            None,
            "deleted since: the cache is newer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn on_expiry_the_reconcile_runs_and_is_counted_stale_and_without_a_wait_it_only_counts() {
        for (name, wait) in [("expiry", Some(Duration::from_secs(2))), ("off", None)] {
            let freshness = Freshness::new(name, wait);
            let _cache = Cache::<ConfigMap>::new(&freshness, true);
            freshness.wrote(&key(), obj::<ConfigMap>("a", "5").as_ref());
            let started = Instant::now();
            freshness.hold(&key(), &CancellationToken::new()).await;
            assert_eq!(started.elapsed(), wait.unwrap_or_default(), "{name}");
            assert_eq!(ReconcileMetrics::global().stale_count(name), 1, "{name}");
            assert_eq!(
                freshness.keys(),
                0,
                "{name}: forgotten after the stale start"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_cannot_be_compared_or_have_no_informer_fall_back_to_no_wait() {
        let freshness = Freshness::new("fallback", Some(Duration::from_secs(5)));
        let _cache = Cache::<ConfigMap>::new(&freshness, true);
        freshness.wrote(&key(), obj::<ConfigMap>("a", "not-a-number").as_ref());
        freshness.wrote(&key(), obj::<Deployment>("no-informer", "7").as_ref());
        assert_eq!(freshness.keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_primary_object_drops_its_keys_records_and_a_cancelled_wait_returns() {
        let freshness = Freshness::new("deleted", Some(Duration::from_secs(60)));
        let foos = Cache::<ConfigMap>::new(&freshness, true);
        freshness.wrote(&key(), obj::<ConfigMap>("a", "9").as_ref());
        let token = CancellationToken::new();
        let (f, c) = (freshness.clone(), token.clone());
        let held = tokio::spawn(async move { f.hold(&key(), &c).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
        held.await.unwrap();
        assert_eq!(freshness.keys(), 1, "a cancelled wait keeps the records");
        ResourceEventHandler::on_delete(
            &foos.handler,
            &DeletedObject::Unknown(DeletedFinalStateUnknown {
                key: "ns/a".into(),
                obj: obj::<ConfigMap>("a", "8"),
            }),
        );
        assert_eq!(freshness.keys(), 0);
    }
}
