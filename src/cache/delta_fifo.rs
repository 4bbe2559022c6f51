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

use super::delta::{DeletedObject, Delta, DeltaType, Deltas};
use super::keys::{KeyError, KeyFunc};
use super::queue::{FifoClosed, InformerQueue, KnownObjects, Popped, wait_for_item};
use super::store::{ReflectorStore, StoreError, TransformFunc, apply_transform, transformed_list};
use super::stored::ListedObjects;

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

    /// The key of an object (client-go `KeyOf`).
    pub fn key_of(&self, obj: &K) -> Result<String, KeyError> {
        (self.shared.key_func)(obj)
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
        let mut process = Some(process);
        wait_for_item(&self.shared.inner, &self.shared.ready, |inner| {
            // The queue/items invariant: every queued key has its deltas.
            while let Some(key) = inner.queue.pop_front() {
                let is_in_initial_list = !inner.has_synced();
                if inner.initial_population_count > 0 {
                    inner.initial_population_count -= 1;
                }
                if let Some(deltas) = inner.items.remove(&key) {
                    let process = process.take().expect("called until it hands out");
                    return Some(Ok(process(deltas, is_in_initial_list)));
                }
            }
            inner.closed.then_some(Err(FifoClosed))
        })
        .await
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.shared.inner.lock().closed
    }

    /// Keys with pending deltas, in queue order.
    pub fn list_keys(&self) -> Vec<String> {
        self.shared.inner.lock().queue.iter().cloned().collect()
    }

    /// The pending deltas of `key` (a copy).
    pub fn get_by_key(&self, key: &str) -> Option<Deltas<K>> {
        self.shared.inner.lock().items.get(key).cloned()
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

    /// `replace` for objects already transformed and shared (what the reflector hands over);
    /// the keys in `undecodable` get no tombstone (see `ReflectorStore::replace_listed`).
    fn queue_listed(
        &self,
        list: Vec<Arc<K>>,
        undecodable: Vec<String>,
        _resource_version: &str,
    ) -> Result<(), StoreError> {
        let undecodable: HashSet<String> = undecodable.into_iter().collect();
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
            .filter(|(k, _)| !keys.contains(*k) && !undecodable.contains(*k))
            .filter_map(|(k, d)| d.last().map(|d| (k.clone(), d.object().clone())))
            .collect();
        for (key, obj) in vanished_queued {
            queued_deletions += 1;
            self.queue_action(&mut inner, Delta::tombstone(key, obj))?;
        }
        // Deletion detection against what the consumer holds.
        if let Some(known) = &self.shared.known {
            for key in known.list_keys() {
                if keys.contains(&key)
                    || inner.items.contains_key(&key)
                    || undecodable.contains(&key)
                {
                    continue;
                }
                let Some(obj) = known.get_by_key(&key) else {
                    continue;
                };
                queued_deletions += 1;
                self.queue_action(&mut inner, Delta::tombstone(key, obj))?;
            }
        }

        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = keys.len() + queued_deletions;
        }
        Ok(())
    }
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
    /// Queues an `Added` delta.
    fn add(&self, obj: K) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = inner.transformed(obj);
        self.queue_action(&mut inner, Delta::Added(Arc::new(obj)))
    }
    /// Queues an `Updated` delta.
    fn update(&self, obj: K) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = inner.transformed(obj);
        self.queue_action(&mut inner, Delta::Updated(Arc::new(obj)))
    }
    /// Queues a `Deleted` delta, unless the key is neither known nor queued.
    fn delete(&self, obj: K) -> Result<(), StoreError> {
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
    fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError> {
        let transform = self.shared.inner.lock().transform.clone();
        self.queue_listed(
            transformed_list(transform.as_ref(), list),
            Vec::new(),
            resource_version,
        )
    }
    /// Queues a `Sync` delta for every known key that has nothing queued.
    fn resync(&self) -> Result<(), StoreError> {
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
    fn transformer(&self) -> Option<TransformFunc<K>> {
        self.shared.inner.lock().transform.clone()
    }
    fn replace_listed(
        &self,
        list: ListedObjects<K>,
        undecodable: Vec<String>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        self.queue_listed(list.into_decoded(), undecodable, resource_version)
    }
    /// Queues a tombstone carrying the key's last queued object, else the known one
    /// (nothing if neither holds it, or the last queued delta is a deletion).
    fn delete_undecodable(&self, key: &str) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        let obj = match inner.items.get(key).and_then(|d| d.last()) {
            Some(Delta::Deleted(_)) => None,
            Some(d) => Some(d.object().clone()),
            None => self
                .shared
                .known
                .as_ref()
                .and_then(|known| known.get_by_key(key)),
        };
        match obj {
            Some(obj) => self.queue_action(&mut inner, Delta::tombstone(key.to_string(), obj)),
            None => Ok(()),
        }
    }
}

impl<K: Send + Sync + 'static> InformerQueue<K> for DeltaFIFO<K> {
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(Popped<K>, bool) + Send),
    ) -> futures::future::BoxFuture<'a, Result<(), FifoClosed>> {
        use futures::FutureExt;
        self.pop(|deltas, initial| process(Popped::Deltas(deltas), initial))
            .boxed()
    }
    /// True once the first `replace` has been fully popped, or at once if an
    /// add/update/delete came first.
    fn has_synced(&self) -> bool {
        self.shared.inner.lock().has_synced()
    }
    /// Sets the transform applied to objects before they are queued.
    fn set_transform(&self, transform: Option<TransformFunc<K>>) {
        self.shared.inner.lock().transform = transform;
    }
    /// Stops the queue: pending keys can still be popped, then `pop` reports closed.
    fn close(&self) {
        self.shared.inner.lock().closed = true;
        self.shared.ready.notify_waiters();
    }
    /// Number of queued keys.
    fn len(&self) -> usize {
        self.shared.inner.lock().queue.len()
    }
}

#[cfg(test)]
mod tests;
