//! The in-order event queue between a reflector and an informer: client-go
//! `tools/cache/the_real_fifo.go` (`RealFIFO`), the queue client-go 1.36 informers use.
//!
//! Every event is its own item, in the order the reflector delivered it: no per-key merging,
//! so a handler sees exactly the watch's sequence. `pop` hands out one [`Delta`] at a time
//! (as a one-element [`Deltas`], the shape [`DeltaFIFO`](super::DeltaFIFO) pops).
//!
//! Invariants (on `Inner`):
//! - `initial_population_count` counts the items the first `replace` left queued; each pop
//!   lowers it while it is above zero;
//! - `synced` latches: once `populated && initial_population_count == 0` it stays true
//!   (client-go closes its `synced` channel once).
//!
//! Memory: one `Delta` (an `Arc` and a tag, 16 bytes) per queued event; no key strings are
//! kept (keys are computed only when `replace` or `resync` look for deletions).
//!
//! Differs on purpose from client-go:
//! - The known-objects store is required (client-go panics without it outside atomic mode).
//! - Atomic events (`ReplacedAll` / `SyncAll` / `Bookmark` items), batch pops and
//!   `UnlockWhileProcessing` are not implemented: they are off by default in client-go 1.36
//!   (`AtomicFIFO` and `InOrderInformersBatchProcess` gates).
//! - A tombstone for a known key whose object vanished from the store is skipped rather than
//!   queued with a nil object.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::delta_fifo::{
    DeletedFinalStateUnknown, DeletedObject, Delta, Deltas, FifoClosed, KnownObjects,
    TransformFunc, apply_transform, transformed_list,
};
use super::queue::InformerQueue;
use super::store::{KeyError, KeyFunc, ReflectorStore, StoreError};

/// client-go `RealFIFO`. Cloning shares the queue.
pub struct RealFIFO<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    inner: Mutex<Inner<K>>,
    /// Woken when an item is queued or the queue closes.
    ready: Notify,
    key_func: KeyFunc<K>,
    known: Arc<dyn KnownObjects<K>>,
}

struct Inner<K> {
    items: VecDeque<Delta<K>>,
    populated: bool,
    initial_population_count: usize,
    synced: bool,
    closed: bool,
    transform: Option<TransformFunc<K>>,
}

impl<K> Clone for RealFIFO<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Send + Sync + 'static> RealFIFO<K> {
    /// A queue keyed by `key_func` whose deletion detection consults `known` (the informer's
    /// store).
    pub fn new(key_func: KeyFunc<K>, known: Arc<dyn KnownObjects<K>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    items: VecDeque::new(),
                    populated: false,
                    initial_population_count: 0,
                    synced: false,
                    closed: false,
                    transform: None,
                }),
                ready: Notify::new(),
                key_func,
                known,
            }),
        }
    }

    /// Sets the transform applied to objects before they are queued (not to tombstones or
    /// `Sync` items, whose objects come from the store already transformed).
    pub fn set_transform(&self, transform: Option<TransformFunc<K>>) {
        self.shared.inner.lock().transform = transform;
    }

    /// The key of an object (client-go `KeyOf`); a tombstone's key is its own.
    pub fn key_of_delta(&self, delta: &Delta<K>) -> Result<String, KeyError> {
        match delta {
            Delta::Deleted(DeletedObject::Unknown(t)) => Ok(t.key.clone()),
            d => (self.shared.key_func)(d.object()),
        }
    }

    /// Queues an `Added` item.
    pub fn add(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, Delta::Added)
    }

    /// Queues an `Updated` item.
    pub fn update(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, Delta::Updated)
    }

    /// Queues a `Deleted` item (always: client-go's RealFIFO does not filter deletions of
    /// keys nobody holds).
    pub fn delete(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, |o| Delta::Deleted(DeletedObject::Object(o)))
    }

    fn push_event(&self, obj: K, make: impl FnOnce(Arc<K>) -> Delta<K>) -> Result<(), StoreError> {
        let key = (self.shared.key_func)(&obj)?;
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        inner.check_synced();
        let obj = inner.transformed(obj);
        let delta = make(Arc::new(obj));
        if crate::trace::on() {
            let (delta_type, ahead) = (delta.delta_type(), inner.items.len());
            let kind = crate::trace::short_type_name::<K>();
            crate::trace::record(&key, crate::trace::Stage::FifoQueued, kind, || {
                format!("{delta_type:?} (RealFIFO, {ahead} items ahead)")
            });
        }
        inner.items.push_back(delta);
        drop(inner);
        self.shared.ready.notify_waiters();
        Ok(())
    }

    /// client-go `Replace` (non-atomic, `reconcileReplacement`): first a tombstone for every
    /// key that is queued or known but not in `list` (a queued key whose last item is a
    /// deletion needs none), then a `Replaced` item per object, in list order.
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
        // Keys first, so a bad object leaves the queue untouched.
        let mut new_keys = HashSet::with_capacity(list.len());
        for obj in &list {
            new_keys.insert((self.shared.key_func)(&**obj)?);
        }
        let mut inner = self.shared.inner.lock();

        // The last queued item per key, in first-queued order.
        let mut queued_order: Vec<String> = Vec::new();
        let mut last_queued: HashMap<String, Delta<K>> = HashMap::new();
        for item in &inner.items {
            let key = self.key_of_delta(item)?;
            if last_queued.insert(key.clone(), item.clone()).is_none() {
                queued_order.push(key);
            }
        }
        let mut tombstones = Vec::new();
        for key in queued_order {
            if new_keys.contains(&key) {
                continue;
            }
            let last = &last_queued[&key];
            if matches!(last, Delta::Deleted(_)) {
                continue;
            }
            let obj = last.object().clone();
            tombstones.push(tombstone(key, obj));
        }
        for key in self.shared.known.list_keys() {
            if new_keys.contains(&key) || last_queued.contains_key(&key) {
                continue;
            }
            if let Some(obj) = self.shared.known.get_by_key(&key) {
                tombstones.push(tombstone(key, obj));
            }
        }
        if crate::trace::on() {
            let kind = crate::trace::short_type_name::<K>();
            for key in &new_keys {
                crate::trace::record(key, crate::trace::Stage::FifoQueued, kind, || {
                    "Replaced (RealFIFO, from a LIST)".into()
                });
            }
        }
        drop(new_keys);
        drop(last_queued);
        inner.items.extend(tombstones);
        inner.items.extend(list.into_iter().map(Delta::Replaced));
        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = inner.items.len();
            inner.check_synced();
        }
        drop(inner);
        self.shared.ready.notify_waiters();
        Ok(())
    }

    /// client-go `Resync` (non-atomic): a `Sync` item for every known key with nothing queued.
    pub fn resync(&self) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        let mut queued = HashSet::with_capacity(inner.items.len());
        for item in &inner.items {
            queued.insert(self.key_of_delta(item)?);
        }
        let mut added = false;
        for key in self.shared.known.list_keys() {
            if queued.contains(&key) {
                continue;
            }
            if let Some(obj) = self.shared.known.get_by_key(&key) {
                inner.items.push_back(Delta::Sync(obj));
                added = true;
            }
        }
        drop(inner);
        if added {
            self.shared.ready.notify_waiters();
        }
        Ok(())
    }

    /// Waits for the oldest item, removes it and runs `process(deltas, is_in_initial_list)`
    /// under the queue's lock. After `close`, drains what is queued, then [`FifoClosed`].
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
                if let Some(item) = inner.items.pop_front() {
                    let is_in_initial_list = !inner.synced;
                    let result = process(vec![item], is_in_initial_list);
                    if inner.initial_population_count > 0 {
                        inner.initial_population_count -= 1;
                        inner.check_synced();
                    }
                    return Ok(result);
                }
                if inner.closed {
                    return Err(FifoClosed);
                }
            }
            notified.await;
        }
    }

    /// Stops the queue: pending items can still be popped, then `pop` reports closed.
    pub fn close(&self) {
        self.shared.inner.lock().closed = true;
        self.shared.ready.notify_waiters();
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.shared.inner.lock().closed
    }

    /// True once the first `replace`'s items have all been popped, or at once if an
    /// add/update/delete came first.
    pub fn has_synced(&self) -> bool {
        self.shared.inner.lock().synced
    }

    /// The queued items, oldest first (a copy, for tests and debugging).
    pub fn items(&self) -> Vec<Delta<K>> {
        self.shared.inner.lock().items.iter().cloned().collect()
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.shared.inner.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn tombstone<K>(key: String, obj: Arc<K>) -> Delta<K> {
    Delta::Deleted(DeletedObject::Unknown(DeletedFinalStateUnknown {
        key,
        obj,
    }))
}

impl<K> Inner<K> {
    fn check_synced(&mut self) {
        if self.populated && self.initial_population_count == 0 {
            self.synced = true;
        }
    }

    fn transformed(&self, obj: K) -> K {
        apply_transform(self.transform.as_ref(), obj)
    }
}

impl<K: Send + Sync + 'static> ReflectorStore<K> for RealFIFO<K> {
    fn add(&self, obj: K) -> Result<(), StoreError> {
        RealFIFO::add(self, obj)
    }
    fn update(&self, obj: K) -> Result<(), StoreError> {
        RealFIFO::update(self, obj)
    }
    fn delete(&self, obj: K) -> Result<(), StoreError> {
        RealFIFO::delete(self, obj)
    }
    fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError> {
        RealFIFO::replace(self, list, resource_version)
    }
    fn resync(&self) -> Result<(), StoreError> {
        RealFIFO::resync(self)
    }
    fn transformer(&self) -> Option<TransformFunc<K>> {
        self.shared.inner.lock().transform.clone()
    }
    fn replace_listed(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        RealFIFO::replace_listed(self, list, resource_version)
    }
}

impl<K: Send + Sync + 'static> InformerQueue<K> for RealFIFO<K> {
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(Deltas<K>, bool) + Send),
    ) -> BoxFuture<'a, Result<(), FifoClosed>> {
        self.pop(process).boxed()
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
    use crate::cache::delta_fifo::DeltaType;
    use crate::cache::store::default_key_func;
    use crate::cache::thread_safe_store::ThreadSafeStore;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;
    use std::time::Duration;

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

    /// A delta as (type, name, val, is_tombstone).
    type Flat = (DeltaType, String, i32, bool);

    fn flat1(d: &Delta<ConfigMap>) -> Flat {
        let o = d.object();
        let tombstone = matches!(d, Delta::Deleted(DeletedObject::Unknown(_)));
        (
            d.delta_type(),
            o.metadata.name.clone().unwrap(),
            val(o),
            tombstone,
        )
    }

    fn f(t: DeltaType, name: &str, v: i32) -> Flat {
        (t, name.to_string(), v, false)
    }

    fn tomb(name: &str, v: i32) -> Flat {
        (DeltaType::Deleted, name.to_string(), v, true)
    }

    /// client-go's `literalListerGetter`: a known-objects store holding `objs`.
    fn fifo_with_known(objs: &[ConfigMap]) -> RealFIFO<ConfigMap> {
        let store = ThreadSafeStore::new(Default::default());
        for o in objs {
            store.add(o.metadata.name.clone().unwrap(), Arc::new(o.clone()));
        }
        RealFIFO::new(default_key_func(), Arc::new(store))
    }

    fn fifo() -> RealFIFO<ConfigMap> {
        fifo_with_known(&[])
    }

    fn items(q: &RealFIFO<ConfigMap>) -> Vec<Flat> {
        q.items().iter().map(flat1).collect()
    }

    /// Pops one item: (its flat form, is_in_initial_list).
    async fn pop1(q: &RealFIFO<ConfigMap>) -> (Flat, bool) {
        q.pop(|d, initial| {
            assert_eq!(d.len(), 1, "a RealFIFO pops one delta at a time");
            (flat1(&d[0]), initial)
        })
        .await
        .expect("queue closed")
    }

    async fn pop_all(q: &RealFIFO<ConfigMap>) -> Vec<Flat> {
        let mut out = Vec::new();
        while !q.is_empty() {
            out.push(pop1(q).await.0);
        }
        out
    }

    // client-go: TestRealFIFO_basic
    #[tokio::test(start_paused = true)]
    async fn basic_adds_and_updates_pop_one_at_a_time_in_order() {
        let q = fifo();
        for i in 0..5 {
            q.add(obj(&format!("a{i}"), i)).unwrap();
        }
        for i in 0..5 {
            q.update(obj(&format!("a{i}"), i + 10)).unwrap();
        }
        let mut want = Vec::new();
        for i in 0..5 {
            want.push(f(DeltaType::Added, &format!("a{i}"), i));
        }
        for i in 0..5 {
            want.push(f(DeltaType::Updated, &format!("a{i}"), i + 10));
        }
        assert_eq!(pop_all(&q).await, want);
    }

    // client-go: TestRealFIFO_replaceWithDeleteDeltaIn
    #[tokio::test(start_paused = true)]
    async fn replace_with_delete_delta_in() {
        let q = fifo_with_known(&[obj("foo", 1)]);
        q.delete(obj("foo", 1)).unwrap();
        q.replace(vec![obj("foo", 2)], "").unwrap();
        assert_eq!(
            items(&q),
            vec![
                f(DeltaType::Deleted, "foo", 1),
                f(DeltaType::Replaced, "foo", 2)
            ]
        );
    }

    // client-go: TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue
    #[tokio::test(start_paused = true)]
    async fn replace_makes_deletions_for_objects_only_in_queue() {
        type Ops = fn(&RealFIFO<ConfigMap>);
        let cases: Vec<(&str, Ops, Vec<Flat>)> = vec![
            (
                "Added object should be deleted on Replace",
                |q| {
                    q.add(obj("foo", 2)).unwrap();
                    q.replace(vec![], "0").unwrap();
                },
                vec![f(DeltaType::Added, "foo", 2), tomb("foo", 2)],
            ),
            (
                "Deleted object should have only a single Delete",
                |q| {
                    q.add(obj("foo", 2)).unwrap();
                    q.delete(obj("foo", 2)).unwrap();
                    q.replace(vec![], "0").unwrap();
                },
                vec![
                    f(DeltaType::Added, "foo", 2),
                    f(DeltaType::Deleted, "foo", 2),
                ],
            ),
            (
                "Synced objects should have a single delete",
                |q| {
                    q.add(obj("foo", 2)).unwrap();
                    q.replace(vec![obj("foo", 2)], "0").unwrap();
                    q.replace(vec![obj("foo", 2)], "0").unwrap();
                    q.replace(vec![], "0").unwrap();
                },
                vec![
                    f(DeltaType::Added, "foo", 2),
                    f(DeltaType::Replaced, "foo", 2),
                    f(DeltaType::Replaced, "foo", 2),
                    tomb("foo", 2),
                ],
            ),
            (
                "Added objects should have a single delete on multiple Replaces",
                |q| {
                    q.add(obj("foo", 2)).unwrap();
                    q.replace(vec![], "0").unwrap();
                    q.replace(vec![], "1").unwrap();
                },
                vec![f(DeltaType::Added, "foo", 2), tomb("foo", 2)],
            ),
            (
                "Added and deleted and added object should be deleted",
                |q| {
                    q.add(obj("foo", 2)).unwrap();
                    q.delete(obj("foo", 2)).unwrap();
                    q.add(obj("foo", 3)).unwrap();
                    q.replace(vec![], "0").unwrap();
                },
                vec![
                    f(DeltaType::Added, "foo", 2),
                    f(DeltaType::Deleted, "foo", 2),
                    f(DeltaType::Added, "foo", 3),
                    tomb("foo", 3),
                ],
            ),
        ];
        for (name, ops, want) in cases {
            let q = fifo();
            ops(&q);
            assert_eq!(pop_all(&q).await, want, "{name}");
            assert!(q.is_empty(), "{name}: extra items left");
        }
    }

    // client-go: TestRealFIFO_addUpdate
    #[tokio::test(start_paused = true)]
    async fn add_update_delete_of_one_key_are_three_items() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.update(obj("foo", 12)).unwrap();
        q.delete(obj("foo", 15)).unwrap();
        let want = vec![
            f(DeltaType::Added, "foo", 10),
            f(DeltaType::Updated, "foo", 12),
            f(DeltaType::Deleted, "foo", 15),
        ];
        assert_eq!(items(&q), want);
        assert_eq!(pop_all(&q).await, want);
        // Nothing else arrives.
        let more = tokio::time::timeout(Duration::from_millis(50), pop1(&q)).await;
        assert!(more.is_err(), "unexpected item {more:?}");
    }

    // client-go: TestRealFIFO_transformer
    #[tokio::test(start_paused = true)]
    async fn transform_runs_once_on_events_and_not_on_tombstones() {
        // The transform bumps "xfrm"; every queued object must show exactly one run.
        let q = fifo();
        q.set_transform(Some(Arc::new(|mut o: ConfigMap| {
            let data = o.data.get_or_insert_with(Default::default);
            let n: i32 = data.get("xfrm").map_or(0, |v| v.parse().unwrap());
            data.insert("xfrm".into(), (n + 1).to_string());
            o
        })));
        q.add(obj("foo", 10)).unwrap();
        q.add(obj("bar", 11)).unwrap();
        q.update(obj("foo", 12)).unwrap();
        q.delete(obj("foo", 15)).unwrap();
        q.replace(vec![], "").unwrap();
        q.add(obj("bar", 16)).unwrap();
        q.replace(vec![], "").unwrap();
        let all = q.items();
        assert_eq!(
            all.iter().map(flat1).collect::<Vec<_>>(),
            vec![
                f(DeltaType::Added, "foo", 10),
                f(DeltaType::Added, "bar", 11),
                f(DeltaType::Updated, "foo", 12),
                f(DeltaType::Deleted, "foo", 15),
                tomb("bar", 11),
                f(DeltaType::Added, "bar", 16),
                tomb("bar", 16),
            ]
        );
        for d in &all {
            assert_eq!(d.object().data.as_ref().unwrap()["xfrm"], "1", "{d:?}");
        }
    }

    // client-go: TestRealFIFO_enqueueingNoLister
    #[tokio::test(start_paused = true)]
    async fn every_event_is_queued_without_known_objects() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.update(obj("bar", 15)).unwrap();
        q.add(obj("qux", 17)).unwrap();
        q.delete(obj("qux", 18)).unwrap();
        q.delete(obj("baz", 20)).unwrap();
        let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
        assert_eq!(vals, vec![10, 15, 17, 18, 20]);
    }

    // client-go: TestRealFIFO_enqueueingWithLister
    #[tokio::test(start_paused = true)]
    async fn every_event_is_queued_with_known_objects() {
        let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.add(obj("foo", 10)).unwrap();
        q.update(obj("bar", 15)).unwrap();
        q.delete(obj("baz", 20)).unwrap();
        let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
        assert_eq!(vals, vec![10, 15, 20]);
    }

    // client-go: TestRealFIFO_addReplace
    #[tokio::test(start_paused = true)]
    async fn add_then_replace_delivers_both() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.replace(vec![obj("foo", 15)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Added, "foo", 10),
                f(DeltaType::Replaced, "foo", 15)
            ]
        );
    }

    // client-go: TestRealFIFO_ResyncNonExisting
    #[tokio::test(start_paused = true)]
    async fn resync_skips_a_key_with_a_queued_item() {
        let q = fifo_with_known(&[obj("foo", 5)]);
        q.delete(obj("foo", 10)).unwrap();
        q.resync().unwrap();
        assert_eq!(items(&q), vec![f(DeltaType::Deleted, "foo", 10)]);
    }

    // client-go: TestRealFIFO_Resync
    #[tokio::test(start_paused = true)]
    async fn resync_queues_sync_for_known_objects() {
        let q = fifo_with_known(&[obj("foo", 5)]);
        q.resync().unwrap();
        assert_eq!(items(&q), vec![f(DeltaType::Sync, "foo", 5)]);
    }

    // client-go: TestRealFIFO_DeleteExistingNonPropagated
    #[tokio::test(start_paused = true)]
    async fn delete_after_add_is_its_own_item() {
        let q = fifo();
        q.add(obj("foo", 5)).unwrap();
        q.delete(obj("foo", 6)).unwrap();
        assert_eq!(
            items(&q),
            vec![
                f(DeltaType::Added, "foo", 5),
                f(DeltaType::Deleted, "foo", 6)
            ]
        );
    }

    // client-go: TestRealFIFO_ReplaceMakesDeletions
    #[tokio::test(start_paused = true)]
    async fn replace_makes_deletions_before_the_replaced_items() {
        let known = [obj("foo", 5), obj("bar", 6), obj("baz", 7)];
        // With a pre-existing Delete.
        let q = fifo_with_known(&known);
        q.delete(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Deleted, "baz", 10),
                tomb("bar", 6),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
        // Starting with an Add instead of a Delete.
        let q = fifo_with_known(&known);
        q.add(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Added, "baz", 10),
                tomb("baz", 10),
                tomb("bar", 6),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
        // Deleting and recreating the object in the queue, then a Replace without it.
        let q = fifo_with_known(&known);
        q.delete(obj("bar", 6)).unwrap();
        q.add(obj("bar", 100)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Deleted, "bar", 6),
                f(DeltaType::Added, "bar", 100),
                tomb("bar", 100),
                tomb("baz", 7),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
        // Two replaces: the second's tombstone carries the first's (queued) object.
        let q = fifo_with_known(&known);
        q.replace(vec![obj("bar", 100), obj("foo", 5)], "0")
            .unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                tomb("baz", 7),
                f(DeltaType::Replaced, "bar", 100),
                f(DeltaType::Replaced, "foo", 5),
                tomb("bar", 100),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
        // No known objects.
        let q = fifo();
        q.add(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Added, "baz", 10),
                tomb("baz", 10),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
    }

    // client-go: TestRealFIFO_ReplaceMakesDeletionsReplaced
    #[tokio::test(start_paused = true)]
    async fn replace_emits_replaced_for_listed_objects() {
        let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.delete(obj("baz", 10)).unwrap();
        q.replace(vec![obj("foo", 6)], "0").unwrap();
        assert_eq!(
            pop_all(&q).await,
            vec![
                f(DeltaType::Deleted, "baz", 10),
                tomb("bar", 6),
                f(DeltaType::Replaced, "foo", 6)
            ]
        );
    }

    // client-go: TestRealFIFO_UpdateResyncRace
    #[tokio::test(start_paused = true)]
    async fn update_resync_race() {
        let q = fifo_with_known(&[obj("foo", 5)]);
        q.update(obj("foo", 6)).unwrap();
        q.resync().unwrap();
        assert_eq!(pop_all(&q).await, vec![f(DeltaType::Updated, "foo", 6)]);
    }

    // client-go: TestRealFIFO_HasSyncedCorrectOnDeletion
    #[tokio::test(start_paused = true)]
    async fn has_synced_counts_the_replace_tombstones() {
        let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        q.replace(vec![obj("foo", 5)], "0").unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            assert!(
                !q.has_synced(),
                "synced before the initial items were popped"
            );
            let (item, initial) = pop1(&q).await;
            assert!(initial, "{item:?} should be part of the initial list");
            got.push(item);
        }
        // Known keys come in the store's key order; client-go's test lister lists bar, baz.
        got[..2].sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got,
            vec![
                tomb("bar", 6),
                tomb("baz", 7),
                f(DeltaType::Replaced, "foo", 5)
            ]
        );
        assert!(q.has_synced());
    }

    // client-go: TestRealFIFO_detectLineJumpers
    #[tokio::test(start_paused = true)]
    async fn detect_line_jumpers() {
        let q = fifo();
        q.add(obj("foo", 10)).unwrap();
        q.add(obj("bar", 1)).unwrap();
        q.add(obj("foo", 11)).unwrap();
        q.add(obj("foo", 13)).unwrap();
        q.add(obj("zab", 30)).unwrap();
        assert_eq!(pop1(&q).await.0.2, 10);
        q.add(obj("foo", 14)).unwrap(); // foo must not jump back in line
        let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
        assert_eq!(vals, vec![1, 11, 13, 30, 14]);
    }

    // client-go: TestRealFIFO_KeyOf
    #[test]
    fn key_of_objects_and_tombstones() {
        let q = fifo();
        let a = Delta::Added(Arc::new(obj("A", 0)));
        assert_eq!(q.key_of_delta(&a).unwrap(), "A");
        let b = tombstone("B".to_string(), Arc::new(obj("not-b", 0)));
        assert_eq!(q.key_of_delta(&b).unwrap(), "B");
        let mut nameless = obj("x", 0);
        nameless.metadata.name = None;
        let err = q.add(nameless).unwrap_err();
        assert!(err.to_string().contains("name"), "{err}");
        assert!(q.is_empty(), "a refused object must not be queued");
    }

    // client-go: TestRealFIFO_HasSynced
    #[tokio::test(start_paused = true)]
    async fn has_synced_table() {
        type Step = fn(&RealFIFO<ConfigMap>) -> bool; // true: pop one
        let add_a: Step = |q| {
            q.add(obj("a", 1)).unwrap();
            false
        };
        let replace_empty: Step = |q| {
            q.replace(vec![], "0").unwrap();
            false
        };
        let replace_ab: Step = |q| {
            q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap();
            false
        };
        let replace_aa: Step = |q| {
            q.replace(vec![obj("a", 1), obj("a", 2)], "0").unwrap();
            false
        };
        let pop: Step = |_| true;
        let cases: Vec<(Vec<Step>, bool)> = vec![
            (vec![], false),
            (vec![add_a], true),
            (vec![replace_empty], true),
            (vec![replace_ab], false),
            (vec![replace_ab, pop], false),
            (vec![replace_ab, pop, pop], true),
            // Duplicate keys (a broken server): every item must be popped.
            (vec![replace_aa, pop, pop], true),
        ];
        for (i, (steps, want)) in cases.into_iter().enumerate() {
            let q = fifo();
            for step in steps {
                if step(&q) {
                    pop1(&q).await;
                }
            }
            assert_eq!(q.has_synced(), want, "case {i}");
        }
    }

    // client-go: TestRealFIFO_PopShouldUnblockWhenClosed
    #[tokio::test(start_paused = true)]
    async fn pop_unblocks_when_closed() {
        let q = fifo();
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.pop(|_, _| ()).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.close();
        assert_eq!(waiter.await.unwrap(), Err(FifoClosed));
        assert!(q.is_closed());
    }

    // kubeloop's own: what is queued before close is still delivered.
    #[tokio::test(start_paused = true)]
    async fn close_drains_queued_items_first() {
        let q = fifo();
        q.add(obj("a", 1)).unwrap();
        q.close();
        assert_eq!(pop1(&q).await.0, f(DeltaType::Added, "a", 1));
        assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
    }
}
