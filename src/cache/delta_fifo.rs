//! The per-key delta queue between a reflector and an informer: client-go
//! `tools/cache/delta_fifo.go`.
//!
//! Each key has a list of [`Delta`]s, oldest first; the queue holds each key at most once, in
//! the order keys first got a pending delta. `pop` hands a key's whole list to a callback.
//!
//! Invariants (on `Inner`):
//! - a key is in `queue` iff it is in `items`, and `items[k]` is never empty;
//! - `initial_population_count > 0` only while `populated` and the first `replace` has not
//!   been fully popped; `has_synced` is `populated && initial_population_count == 0`.
//!
//! Differs on purpose from client-go:
//! - A tombstone is [`DeletedObject::Unknown`], a variant handlers match on, not a value to
//!   type-assert.
//! - `replace` always emits `Replaced` (client-go's `EmitDeltaTypeReplaced: true`, which every
//!   informer sets).
//! - No `ErrRequeue` / `AddIfNotPresent` requeue path (deprecated in client-go).
//! - `pop` is async and runs the callback under the queue's lock, like client-go, so a resync
//!   never queues a `Sync` for a key whose deltas are being processed.
//! - The transform runs here, before keys are computed (as client-go's `TransformFunc` on the
//!   DeltaFIFO does), on everything except `Sync` deltas and tombstones.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::store::{KeyError, KeyFunc, ReflectorStore, StoreError};
use super::thread_safe_store::{Indexer, ThreadSafeStore};

/// One change to one object.
#[derive(Debug)]
pub enum Delta<K> {
    /// Created (watch ADDED).
    Added(Arc<K>),
    /// Changed (watch MODIFIED).
    Updated(Arc<K>),
    /// Gone; possibly a tombstone when the deletion itself was missed.
    Deleted(DeletedObject<K>),
    /// Present in a (re)list.
    Replaced(Arc<K>),
    /// A periodic resync of an object the cache already holds.
    Sync(Arc<K>),
}

/// What a deletion carries.
#[derive(Debug)]
pub enum DeletedObject<K> {
    /// The deleted object as the watch reported it.
    Object(Arc<K>),
    /// The object vanished between two lists, its deletion was never seen: this is the last
    /// state the cache knew, possibly stale (client-go `DeletedFinalStateUnknown`).
    Unknown(DeletedFinalStateUnknown<K>),
}

/// A tombstone: the key and last known state of an object whose deletion was missed.
#[derive(Debug)]
pub struct DeletedFinalStateUnknown<K> {
    /// The object's cache key.
    pub key: String,
    /// The last state the cache knew.
    pub obj: Arc<K>,
}

/// The kind of a [`Delta`], for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeltaType {
    /// [`Delta::Added`]
    Added,
    /// [`Delta::Updated`]
    Updated,
    /// [`Delta::Deleted`]
    Deleted,
    /// [`Delta::Replaced`]
    Replaced,
    /// [`Delta::Sync`]
    Sync,
}

/// A key's pending deltas, oldest first; never empty when handed out.
pub type Deltas<K> = Vec<Delta<K>>;

/// Transforms an object before it is queued (e.g. drops managedFields).
pub type TransformFunc<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// `obj` through `transform`, if there is one.
pub(crate) fn apply_transform<K>(transform: Option<&TransformFunc<K>>, obj: K) -> K {
    match transform {
        Some(t) => t(obj),
        None => obj,
    }
}

/// A listed batch through `transform`, each object shared once (what a FIFO's `replace` queues).
pub(crate) fn transformed_list<K>(
    transform: Option<&TransformFunc<K>>,
    list: Vec<K>,
) -> Vec<Arc<K>> {
    list.into_iter()
        .map(|o| Arc::new(apply_transform(transform, o)))
        .collect()
}

/// The objects the consumer already holds (client-go `KeyListerGetter`), used to detect
/// deletions on `replace`, to decide whether a delete matters, and for `resync`.
pub trait KnownObjects<K>: Send + Sync + 'static {
    /// Every key held.
    fn list_keys(&self) -> Vec<String>;
    /// The object at `key`.
    fn get_by_key(&self, key: &str) -> Option<Arc<K>>;
}

impl<K: Send + Sync + 'static> KnownObjects<K> for Indexer<K> {
    fn list_keys(&self) -> Vec<String> {
        Indexer::list_keys(self)
    }
    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        Indexer::get_by_key(self, key)
    }
}

impl<K: Send + Sync + 'static> KnownObjects<K> for ThreadSafeStore<K> {
    fn list_keys(&self) -> Vec<String> {
        ThreadSafeStore::list_keys(self)
    }
    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.get(key)
    }
}

/// `pop` on a closed, drained queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DeltaFIFO: manipulating with closed queue")]
pub struct FifoClosed;

/// The queue. Cloning shares it (the reflector writes, the informer pops).
pub struct DeltaFIFO<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    inner: Mutex<Inner<K>>,
    /// Woken whenever a key is queued or the queue is closed.
    ready: Notify,
    key_func: KeyFunc<K>,
    known: Option<Arc<dyn KnownObjects<K>>>,
}

struct Inner<K> {
    /// key -> pending deltas (never empty).
    items: HashMap<String, Deltas<K>>,
    /// Keys in FIFO order; a key is here iff it is in `items`.
    queue: VecDeque<String>,
    /// Set by the first replace or by any add/update/delete.
    populated: bool,
    /// Items of the first replace not yet popped.
    initial_population_count: usize,
    closed: bool,
    transform: Option<TransformFunc<K>>,
}

impl<K> Clone for DeltaFIFO<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Delta<K> {
    /// The kind of this delta.
    pub fn delta_type(&self) -> DeltaType {
        match self {
            Delta::Added(_) => DeltaType::Added,
            Delta::Updated(_) => DeltaType::Updated,
            Delta::Deleted(_) => DeltaType::Deleted,
            Delta::Replaced(_) => DeltaType::Replaced,
            Delta::Sync(_) => DeltaType::Sync,
        }
    }

    /// The object carried (for a tombstone, the last known state).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Delta::Added(o) | Delta::Updated(o) | Delta::Replaced(o) | Delta::Sync(o) => o,
            Delta::Deleted(d) => d.object(),
        }
    }

    fn is_tombstone(&self) -> bool {
        matches!(self, Delta::Deleted(DeletedObject::Unknown(_)))
    }
}

impl<K> Clone for Delta<K> {
    fn clone(&self) -> Self {
        match self {
            Delta::Added(o) => Delta::Added(o.clone()),
            Delta::Updated(o) => Delta::Updated(o.clone()),
            Delta::Deleted(d) => Delta::Deleted(d.clone()),
            Delta::Replaced(o) => Delta::Replaced(o.clone()),
            Delta::Sync(o) => Delta::Sync(o.clone()),
        }
    }
}

impl<K> DeletedObject<K> {
    /// The deleted object, or the tombstone's last known state.
    pub fn object(&self) -> &Arc<K> {
        match self {
            DeletedObject::Object(o) => o,
            DeletedObject::Unknown(t) => &t.obj,
        }
    }

    /// Whether this is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        matches!(self, DeletedObject::Unknown(_))
    }
}

impl<K> Clone for DeletedObject<K> {
    fn clone(&self) -> Self {
        match self {
            DeletedObject::Object(o) => DeletedObject::Object(o.clone()),
            DeletedObject::Unknown(t) => DeletedObject::Unknown(DeletedFinalStateUnknown {
                key: t.key.clone(),
                obj: t.obj.clone(),
            }),
        }
    }
}

impl<K: Send + Sync + 'static> DeltaFIFO<K> {
    /// A queue keyed by `key_func`; `known` is the consumer's store (the informer's indexer),
    /// or `None` for a standalone queue.
    pub fn new(key_func: KeyFunc<K>, known: Option<Arc<dyn KnownObjects<K>>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    items: HashMap::new(),
                    queue: VecDeque::new(),
                    populated: false,
                    initial_population_count: 0,
                    closed: false,
                    transform: None,
                }),
                ready: Notify::new(),
                key_func,
                known,
            }),
        }
    }

    /// Sets the transform applied to objects before they are queued.
    pub fn set_transform(&self, transform: Option<TransformFunc<K>>) {
        self.shared.inner.lock().transform = transform;
    }

    /// The key of an object (client-go `KeyOf`).
    pub fn key_of(&self, obj: &K) -> Result<String, KeyError> {
        (self.shared.key_func)(obj)
    }

    /// Queues an `Added` delta.
    pub fn add(&self, obj: K) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = inner.transformed(obj);
        self.queue_action(&mut inner, Delta::Added(Arc::new(obj)))
    }

    /// Queues an `Updated` delta.
    pub fn update(&self, obj: K) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = inner.transformed(obj);
        self.queue_action(&mut inner, Delta::Updated(Arc::new(obj)))
    }

    /// Queues a `Deleted` delta, unless the key is neither known nor queued.
    pub fn delete(&self, obj: K) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = inner.transformed(obj);
        let key = self.key_of(&obj)?;
        let queued = inner.items.contains_key(&key);
        let known = match &self.shared.known {
            Some(k) => k.get_by_key(&key).is_some(),
            None => false,
        };
        if !queued && !known {
            // Nothing anybody holds: a delete of an object we never saw is dropped.
            return Ok(());
        }
        self.queue_action(
            &mut inner,
            Delta::Deleted(DeletedObject::Object(Arc::new(obj))),
        )
    }

    /// Queues a `Replaced` delta for every item, then tombstones for keys that disappeared:
    /// queued keys absent from `list`, and known keys absent from `list` with nothing queued.
    pub fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError> {
        let transform = self.shared.inner.lock().transform.clone();
        self.replace_listed(transformed_list(transform.as_ref(), list), resource_version)
    }

    /// `replace` for objects already transformed and shared (what the reflector hands over).
    pub fn replace_listed(
        &self,
        list: Vec<Arc<K>>,
        _resource_version: &str,
    ) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        let mut keys = HashSet::with_capacity(list.len());
        for obj in list {
            let key = self.key_of(&obj)?;
            keys.insert(key);
            self.queue_action(&mut inner, Delta::Replaced(obj))?;
        }

        let mut queued_deletions = 0;
        // Deletion detection against what is queued.
        let vanished_queued: Vec<(String, Arc<K>)> = inner
            .items
            .iter()
            .filter(|(k, _)| !keys.contains(*k))
            .filter_map(|(k, d)| d.last().map(|d| (k.clone(), d.object().clone())))
            .collect();
        for (key, obj) in vanished_queued {
            queued_deletions += 1;
            self.queue_action(&mut inner, tombstone(key, obj))?;
        }
        // Deletion detection against what the consumer holds.
        if let Some(known) = &self.shared.known {
            for key in known.list_keys() {
                if keys.contains(&key) || inner.items.contains_key(&key) {
                    continue;
                }
                let Some(obj) = known.get_by_key(&key) else {
                    continue;
                };
                queued_deletions += 1;
                self.queue_action(&mut inner, tombstone(key, obj))?;
            }
        }

        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = keys.len() + queued_deletions;
        }
        Ok(())
    }

    /// Queues a `Sync` delta for every known key that has nothing queued.
    pub fn resync(&self) -> Result<(), StoreError> {
        let Some(known) = &self.shared.known else {
            return Ok(());
        };
        let mut inner = self.shared.inner.lock();
        for key in known.list_keys() {
            let Some(obj) = known.get_by_key(&key) else {
                continue;
            };
            // An object with queued deltas is about to be delivered anyway.
            if inner.items.contains_key(&key) {
                continue;
            }
            self.queue_action(&mut inner, Delta::Sync(obj))?;
        }
        Ok(())
    }

    /// Waits for a key, removes it and runs `process(deltas, is_in_initial_list)` under the
    /// queue's lock. After `close`, drains what is queued, then returns [`FifoClosed`].
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is removed until the future completes.
    pub async fn pop<R>(
        &self,
        process: impl FnOnce(Deltas<K>, bool) -> R,
    ) -> Result<R, FifoClosed> {
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.shared.inner.lock();
                if let Some(key) = inner.queue.pop_front() {
                    let is_in_initial_list = !inner.has_synced();
                    if inner.initial_population_count > 0 {
                        inner.initial_population_count -= 1;
                    }
                    let Some(deltas) = inner.items.remove(&key) else {
                        // Cannot happen (queue/items invariant); skip the key.
                        continue;
                    };
                    return Ok(process(deltas, is_in_initial_list));
                }
                if inner.closed {
                    return Err(FifoClosed);
                }
            }
            notified.await;
        }
    }

    /// Stops the queue: pending keys can still be popped, then `pop` reports closed.
    pub fn close(&self) {
        self.shared.inner.lock().closed = true;
        self.shared.ready.notify_waiters();
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.shared.inner.lock().closed
    }

    /// True once the first `replace` has been fully popped, or at once if an
    /// add/update/delete came first.
    pub fn has_synced(&self) -> bool {
        self.shared.inner.lock().has_synced()
    }

    /// Keys with pending deltas, in queue order.
    pub fn list_keys(&self) -> Vec<String> {
        self.shared.inner.lock().queue.iter().cloned().collect()
    }

    /// The pending deltas of `key` (a copy).
    pub fn get_by_key(&self, key: &str) -> Option<Deltas<K>> {
        self.shared.inner.lock().items.get(key).cloned()
    }

    /// Number of queued keys.
    pub fn len(&self) -> usize {
        self.shared.inner.lock().queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `delta` to its key's list, deduplicates, and queues the key if new.
    fn queue_action(&self, inner: &mut Inner<K>, delta: Delta<K>) -> Result<(), StoreError> {
        let key = match &delta {
            Delta::Deleted(DeletedObject::Unknown(t)) => t.key.clone(),
            d => self.key_of(d.object())?,
        };
        let is_new = !inner.items.contains_key(&key);
        let delta_type = delta.delta_type();
        let deltas = inner.items.entry(key.clone()).or_default();
        deltas.push(delta);
        dedup_deltas(deltas);
        if crate::trace::on() {
            let kind = crate::trace::short_type_name::<K>();
            let merged = deltas.len();
            crate::trace::record(&key, crate::trace::Stage::FifoQueued, kind, || {
                if is_new {
                    format!("{delta_type:?} (DeltaFIFO, new key)")
                } else {
                    format!("{delta_type:?} (DeltaFIFO, merged: {merged} deltas for the key)")
                }
            });
        }
        if is_new {
            inner.queue.push_back(key);
            self.shared.ready.notify_waiters();
        }
        Ok(())
    }
}

fn tombstone<K>(key: String, obj: Arc<K>) -> Delta<K> {
    Delta::Deleted(DeletedObject::Unknown(DeletedFinalStateUnknown {
        key,
        obj,
    }))
}

impl<K> Inner<K> {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }

    fn transformed(&self, obj: K) -> K {
        apply_transform(self.transform.as_ref(), obj)
    }
}

/// client-go `dedupDeltas`: only two consecutive deletions collapse; the older one is kept
/// unless it is a tombstone (a real deletion carries more accurate state).
fn dedup_deltas<K>(deltas: &mut Deltas<K>) {
    let n = deltas.len();
    if n < 2 {
        return;
    }
    let (older, newer) = (&deltas[n - 2], &deltas[n - 1]);
    if older.delta_type() != DeltaType::Deleted || newer.delta_type() != DeltaType::Deleted {
        return;
    }
    if older.is_tombstone() {
        // Keep the newer one: drop the older tombstone.
        deltas.remove(n - 2);
    } else {
        deltas.pop();
    }
}

impl<K: Send + Sync + 'static> ReflectorStore<K> for DeltaFIFO<K> {
    fn add(&self, obj: K) -> Result<(), StoreError> {
        DeltaFIFO::add(self, obj)
    }
    fn update(&self, obj: K) -> Result<(), StoreError> {
        DeltaFIFO::update(self, obj)
    }
    fn delete(&self, obj: K) -> Result<(), StoreError> {
        DeltaFIFO::delete(self, obj)
    }
    fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError> {
        DeltaFIFO::replace(self, list, resource_version)
    }
    fn resync(&self) -> Result<(), StoreError> {
        DeltaFIFO::resync(self)
    }
    fn transformer(&self) -> Option<TransformFunc<K>> {
        self.shared.inner.lock().transform.clone()
    }
    fn replace_listed(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        DeltaFIFO::replace_listed(self, list, resource_version)
    }
}

impl<K: Send + Sync + 'static> super::queue::InformerQueue<K> for DeltaFIFO<K> {
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(super::queue::Popped<K>, bool) + Send),
    ) -> futures::future::BoxFuture<'a, Result<(), FifoClosed>> {
        use futures::FutureExt;
        self.pop(|deltas, initial| process(super::queue::Popped::Deltas(deltas), initial))
            .boxed()
    }
    fn queue_has_synced(&self) -> bool {
        self.has_synced()
    }
    fn set_queue_transform(&self, transform: Option<TransformFunc<K>>) {
        self.set_transform(transform)
    }
    fn close_queue(&self) {
        self.close()
    }
    fn queued(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::default_key_func;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    /// client-go's `mkFifoObj(name, val)`.
    fn obj(name: &str, val: i32) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("val".to_string(), val.to_string())].into()),
            ..Default::default()
        }
    }

    fn val(o: &ConfigMap) -> i32 {
        o.data.as_ref().unwrap()["val"].parse().unwrap()
    }

    /// A delta as (type, name, val, is_tombstone), easy to compare.
    type Flat = (DeltaType, String, i32, bool);

    fn flat(d: &Deltas<ConfigMap>) -> Vec<Flat> {
        d.iter()
            .map(|d| {
                let o = d.object();
                (
                    d.delta_type(),
                    o.metadata.name.clone().unwrap(),
                    val(o),
                    d.is_tombstone(),
                )
            })
            .collect()
    }

    fn f(t: DeltaType, name: &str, v: i32) -> Flat {
        (t, name.to_string(), v, false)
    }

    fn tomb(name: &str, v: i32) -> Flat {
        (DeltaType::Deleted, name.to_string(), v, true)
    }

    fn fifo() -> DeltaFIFO<ConfigMap> {
        DeltaFIFO::new(default_key_func(), None)
    }

    fn fifo_with_known(objs: &[ConfigMap]) -> (DeltaFIFO<ConfigMap>, ThreadSafeStore<ConfigMap>) {
        let store = ThreadSafeStore::new(Default::default());
        for o in objs {
            store.add(o.metadata.name.clone().unwrap(), Arc::new(o.clone()));
        }
        let known: Arc<dyn KnownObjects<ConfigMap>> = Arc::new(store.clone());
        (DeltaFIFO::new(default_key_func(), Some(known)), store)
    }

    async fn pop_flat(q: &DeltaFIFO<ConfigMap>) -> Vec<Flat> {
        q.pop(|d, _| flat(&d)).await.expect("queue closed")
    }

    // client-go: TestDeltaFIFO_basic
    #[tokio::test(start_paused = true)]
    async fn basic_adds_and_updates_pop_in_order() {
        let q = fifo();
        for i in 0..5 {
            q.add(obj(&format!("a{i}"), i)).unwrap();
        }
        for i in 0..5 {
            q.update(obj(&format!("a{i}"), i + 10)).unwrap();
        }
        for i in 0..5 {
            let name = format!("a{i}");
            assert_eq!(
                pop_flat(&q).await,
                vec![
                    f(DeltaType::Added, &name, i),
                    f(DeltaType::Updated, &name, i + 10)
                ]
            );
        }
        assert!(q.is_empty());
    }

    // client-go: TestDeltaFIFO_replaceWithDeleteDeltaIn
    #[tokio::test(start_paused = true)]
    async fn replace_with_delete_delta_in() {
        let (q, _) = fifo_with_known(&[obj("foo", 5)]);
        q.delete(obj("foo", 10)).unwrap();
        q.replace(vec![obj("foo", 6)], "0").unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![
                f(DeltaType::Deleted, "foo", 10),
                f(DeltaType::Replaced, "foo", 6)
            ]
        );
    }

    // client-go: TestDeltaFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue
    #[tokio::test(start_paused = true)]
    async fn replace_makes_deletions_for_objects_only_in_queue() {
        let (q, _) = fifo_with_known(&[]);
        q.add(obj("foo", 2)).unwrap();
        q.replace(vec![obj("bar", 1)], "0").unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![f(DeltaType::Added, "foo", 2), tomb("foo", 2)]
        );
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Replaced, "bar", 1)]);
    }

    // client-go: TestDeltaFIFO_addUpdate
    #[tokio::test(start_paused = true)]
    async fn add_update_delete_accumulate_on_one_key() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.update(obj("foo", 12)).unwrap();
        q.delete(obj("foo", 15)).unwrap();
        assert_eq!(q.list_keys(), vec!["foo"]);
        assert_eq!(
            pop_flat(&q).await,
            vec![
                f(DeltaType::Added, "foo", 10),
                f(DeltaType::Updated, "foo", 12),
                f(DeltaType::Deleted, "foo", 15)
            ]
        );
        assert!(q.get_by_key("foo").is_none());
    }

    // client-go: TestDeltaFIFO_enqueueingNoLister
    #[tokio::test(start_paused = true)]
    async fn delete_of_unknown_unqueued_key_is_ignored_without_lister() {
        let q = fifo();
        q.delete(obj("ghost", 1)).unwrap();
        assert!(q.is_empty());
        // But a delete of a queued key is kept.
        q.add(obj("foo", 1)).unwrap();
        q.delete(obj("foo", 2)).unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![
                f(DeltaType::Added, "foo", 1),
                f(DeltaType::Deleted, "foo", 2)
            ]
        );
    }

    // client-go: TestDeltaFIFO_enqueueingWithLister
    #[tokio::test(start_paused = true)]
    async fn delete_of_known_key_is_queued_with_lister() {
        let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.delete(obj("baz", 10)).unwrap();
        q.delete(obj("ghost", 1)).unwrap();
        assert_eq!(q.list_keys(), vec!["baz"]);
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Deleted, "baz", 10)]);
    }

    // client-go: TestDeltaFIFO_addReplace
    #[tokio::test(start_paused = true)]
    async fn add_then_replace() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.replace(vec![obj("foo", 15)], "0").unwrap();
        let popper = {
            let q = q.clone();
            tokio::spawn(async move { pop_flat(&q).await })
        };
        assert_eq!(
            popper.await.unwrap(),
            vec![
                f(DeltaType::Added, "foo", 10),
                f(DeltaType::Replaced, "foo", 15)
            ]
        );
        q.close();
        assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
    }

    // client-go: TestDeltaFIFO_ResyncNonExisting
    #[tokio::test(start_paused = true)]
    async fn resync_skips_keys_with_queued_deltas() {
        let (q, _) = fifo_with_known(&[obj("foo", 5)]);
        q.delete(obj("foo", 10)).unwrap();
        q.resync().unwrap();
        assert_eq!(
            flat(&q.get_by_key("foo").unwrap()),
            vec![f(DeltaType::Deleted, "foo", 10)]
        );
    }

    // client-go: TestDeltaFIFO_Resync
    #[tokio::test(start_paused = true)]
    async fn resync_queues_sync_for_known_objects() {
        let (q, _) = fifo_with_known(&[obj("foo", 5)]);
        q.resync().unwrap();
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Sync, "foo", 5)]);
    }

    // client-go: TestDeltaFIFO_UpdateResyncRace
    #[tokio::test(start_paused = true)]
    async fn update_resync_race() {
        let (q, _) = fifo_with_known(&[obj("foo", 5)]);
        q.update(obj("foo", 6)).unwrap();
        q.resync().unwrap();
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Updated, "foo", 6)]);
        assert!(q.is_empty());
    }

    // client-go: TestDeltaFIFO_DeleteExistingNonPropagated
    #[tokio::test(start_paused = true)]
    async fn delete_existing_non_propagated() {
        let (q, _) = fifo_with_known(&[]);
        q.add(obj("foo", 5)).unwrap();
        q.delete(obj("foo", 6)).unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![
                f(DeltaType::Added, "foo", 5),
                f(DeltaType::Deleted, "foo", 6)
            ]
        );
    }

    // client-go: TestDeltaFIFO_ReplaceMakesDeletions
    #[tokio::test(start_paused = true)]
    async fn replace_makes_deletions() {
        // A known object deleted before the relist keeps its real deletion; a known object
        // missing from the relist gets a tombstone with the last known state.
        let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.delete(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Deleted, "baz", 10)]);
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Replaced, "foo", 5)]);
        assert_eq!(pop_flat(&q).await, vec![tomb("bar", 6)]);
        assert!(q.is_empty());

        // Now with an object only in the queue, which the replace removes.
        let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.add(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![f(DeltaType::Added, "baz", 10), tomb("baz", 10)]
        );
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Replaced, "foo", 5)]);
        assert_eq!(pop_flat(&q).await, vec![tomb("bar", 6)]);

        // Without known objects only queued keys can be detected.
        let q = fifo();
        q.add(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_flat(&q).await,
            vec![f(DeltaType::Added, "baz", 10), tomb("baz", 10)]
        );
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Replaced, "foo", 5)]);
        assert!(q.is_empty());
    }

    // client-go: TestDeltaFIFO_HasSynced (table)
    #[tokio::test(start_paused = true)]
    async fn has_synced_table() {
        type Action = fn(&DeltaFIFO<ConfigMap>);
        let cases: Vec<(&str, Vec<Action>, usize, bool)> = vec![
            ("nothing", vec![], 0, false),
            ("add", vec![|q| q.add(obj("a", 1)).unwrap()], 0, true),
            (
                "empty replace",
                vec![|q| q.replace(vec![], "0").unwrap()],
                0,
                true,
            ),
            (
                "replace of two, nothing popped",
                vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
                0,
                false,
            ),
            (
                "replace of two, one popped",
                vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
                1,
                false,
            ),
            (
                "replace of two, both popped",
                vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
                2,
                true,
            ),
            (
                "add before replace",
                vec![|q| q.add(obj("a", 1)).unwrap(), |q| {
                    q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()
                }],
                0,
                true,
            ),
        ];
        for (name, actions, pops, want) in cases {
            let q = fifo();
            for a in actions {
                a(&q);
            }
            for _ in 0..pops {
                q.pop(|_, _| ()).await.unwrap();
            }
            assert_eq!(q.has_synced(), want, "case {name}");
        }
    }

    // client-go: TestDeltaFIFO_HasSyncedCorrectOnDeletion
    #[tokio::test(start_paused = true)]
    async fn has_synced_counts_queued_deletions() {
        let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        for _ in 0..3 {
            assert!(!q.has_synced());
            q.pop(|_, _| ()).await.unwrap();
        }
        assert!(q.has_synced());
    }

    // client-go: TestDeltaFIFO_PopShouldUnblockWhenClosed
    #[tokio::test(start_paused = true)]
    async fn pop_unblocks_when_closed() {
        let q = fifo();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.pop(|_, _| ()).await })
            })
            .collect();
        tokio::task::yield_now().await;
        q.close();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Err(FifoClosed));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn close_drains_queued_keys_first() {
        let q = fifo();
        q.add(obj("a", 1)).unwrap();
        q.close();
        assert!(q.is_closed());
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Added, "a", 1)]);
        assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
    }

    // client-go: TestDeltaFIFO_detectLineJumpers
    #[tokio::test(start_paused = true)]
    async fn detect_line_jumpers() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.add(obj("bar", 1)).unwrap();
        q.add(obj("foo", 11)).unwrap();
        q.add(obj("foo", 13)).unwrap();
        q.add(obj("zab", 30)).unwrap();
        let newest = |d: Deltas<ConfigMap>| val(d.last().unwrap().object());
        assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 13);
        q.add(obj("foo", 14)).unwrap(); // re-queued at the back
        assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 1);
        assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 30);
        assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 14);
    }

    // kubeloop's own: pop reports is_in_initial_list
    #[tokio::test(start_paused = true)]
    async fn pop_reports_is_in_initial_list() {
        let q = fifo();
        q.replace(vec![obj("a", 1), obj("b", 1)], "1").unwrap();
        q.add(obj("c", 1)).unwrap();
        let initial = |q: &DeltaFIFO<ConfigMap>| {
            let q = q.clone();
            async move { q.pop(|_, initial| initial).await.unwrap() }
        };
        assert!(initial(&q).await);
        assert!(initial(&q).await);
        assert!(!initial(&q).await);
    }

    // kubeloop's own, on client-go's dedupDeltas / isDeletionDup rule
    #[test]
    fn only_consecutive_deletions_collapse() {
        let a = || Arc::new(obj("a", 1));
        let del = |v| Delta::Deleted(DeletedObject::Object(Arc::new(obj("a", v))));
        let tombstone_of = |v| tombstone("a".to_string(), Arc::new(obj("a", v)));

        let mut d = vec![Delta::Added(a()), Delta::Added(a())];
        dedup_deltas(&mut d);
        assert_eq!(d.len(), 2, "adds never collapse");

        let mut d = vec![del(1), del(2)];
        dedup_deltas(&mut d);
        assert_eq!(flat(&d), vec![f(DeltaType::Deleted, "a", 1)], "older kept");

        let mut d = vec![tombstone_of(1), del(2)];
        dedup_deltas(&mut d);
        assert_eq!(
            flat(&d),
            vec![f(DeltaType::Deleted, "a", 2)],
            "older tombstone dropped"
        );

        let mut d = vec![del(1), tombstone_of(2)];
        dedup_deltas(&mut d);
        assert_eq!(
            flat(&d),
            vec![f(DeltaType::Deleted, "a", 1)],
            "real deletion kept"
        );

        let mut d = vec![Delta::Updated(a()), del(2)];
        dedup_deltas(&mut d);
        assert_eq!(d.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn transform_runs_before_queueing_but_not_on_sync() {
        let (q, store) = fifo_with_known(&[obj("known", 1)]);
        q.set_transform(Some(Arc::new(|mut o: ConfigMap| {
            let v = val(&o);
            o.data = Some([("val".to_string(), (v * 100).to_string())].into());
            o
        })));
        q.add(obj("a", 2)).unwrap();
        q.resync().unwrap();
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Added, "a", 200)]);
        // The Sync delta carries the cached (already transformed) object untouched.
        assert_eq!(pop_flat(&q).await, vec![f(DeltaType::Sync, "known", 1)]);
        assert_eq!(store.len(), 1);
    }

    // client-go: TestDeltaFIFO_KeyOf (a tombstone is keyed by its own key)
    #[tokio::test(start_paused = true)]
    async fn tombstones_are_keyed_by_their_stored_key() {
        let store = ThreadSafeStore::new(Default::default());
        // Known under a key that the object itself would not produce.
        store.add("legacy/key".to_string(), Arc::new(obj("foo", 1)));
        let known: Arc<dyn KnownObjects<ConfigMap>> = Arc::new(store);
        let q = DeltaFIFO::new(default_key_func(), Some(known));
        q.replace(vec![], "5").unwrap();
        assert_eq!(q.list_keys(), vec!["legacy/key"]);
        let popped = q
            .pop(|d, _| match &d[0] {
                Delta::Deleted(DeletedObject::Unknown(t)) => t.key.clone(),
                other => panic!("expected a tombstone, got {other:?}"),
            })
            .await
            .unwrap();
        assert_eq!(popped, "legacy/key");
    }

    #[test]
    fn objects_without_a_name_are_rejected_with_a_clear_error() {
        let q = fifo();
        let err = q.add(ConfigMap::default()).unwrap_err();
        assert!(err.to_string().contains("ConfigMap"), "{err}");
        assert!(q.is_empty());
    }
}
