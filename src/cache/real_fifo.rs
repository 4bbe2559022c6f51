//! The in-order event queue between a reflector and an informer: client-go
//! `tools/cache/the_real_fifo.go` (`RealFIFO`), the queue client-go 1.36 informers use.
//!
//! Every event is its own item, in the order the reflector delivered it: no per-key merging,
//! so a handler sees exactly the watch's sequence. `pop` hands out one item; `pop_batch`
//! hands out up to [`RealFifoOptions::batch_size`] events of distinct keys at once, which the
//! informer applies to its store under one lock (client-go `PopBatch`).
//!
//! Two ways to queue a list or a resync, as in client-go:
//! - **atomic** ([`RealFifoOptions::atomic_events`], client-go's `AtomicFIFO` gate, on by
//!   default in 1.36): a list is one [`Popped::ReplacedAll`] item, a resync one
//!   [`Popped::SyncAll`], a watch bookmark one [`Popped::Bookmark`]; the informer works out
//!   deletions against its store when it pops them, so the queue needs no view of the store
//!   and may be unlocked while the informer processes (client-go `UnlockWhileProcessing`);
//! - **per object** ([`RealFifoOptions::non_atomic`]): a list queues a tombstone for every
//!   key that is queued or known but not listed, then one `Replaced` event per object
//!   (client-go `reconcileReplacement`), and a resync queues a `Sync` event per known key with
//!   nothing queued. This needs the informer's store as [`KnownObjects`].
//!
//! Invariants (on `Inner`):
//! - `initial_population_count` counts the items the first `replace` left queued; each pop
//!   lowers it (by the number of items popped) once processing has finished, so `has_synced`
//!   never turns true while the last initial item is still being processed;
//! - `synced` latches: once `populated && initial_population_count == 0` it stays true
//!   (client-go closes its `synced` channel once);
//! - a batch never spans the end of the initial population, never holds two events of one
//!   key, and never holds a whole-list item.
//!
//! Memory: one item (an `Arc` and a tag) per queued event; no key strings are kept (keys are
//! computed only when a batch is formed, or `replace` or `resync` look for deletions).
//!
//! Differs on purpose from client-go:
//! - Bad options are an error from [`RealFIFO::with_options`], not a panic.
//! - A tombstone for a known key whose object vanished from the store is skipped rather than
//!   queued with a nil object.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use super::delta::{DeletedObject, Delta};
use super::keys::{KeyError, KeyFunc};
use super::queue::{
    FifoClosed, InformerQueue, KnownObjects, Popped, ReplacedAllInfo, wait_for_item,
};
use super::shard_selector::ShardSelector;
use super::store::{ReflectorStore, StoreError, TransformFunc, apply_transform, transformed_list};
use super::stored::{ListCodec, ListedObjects};

/// client-go's `defaultBatchSize`: the most events one `pop_batch` hands out.
pub const DEFAULT_BATCH_SIZE: usize = 1000;

/// How a [`RealFIFO`] queues lists and resyncs and how it hands items out. `Default` is what
/// a client-go 1.36 informer builds (`newQueueFIFO` with the `AtomicFIFO`,
/// `UnlockWhileProcessingFIFO` and `InOrderInformersBatchProcess` gates at their 1.36
/// defaults, all on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealFifoOptions {
    /// A list is one `ReplacedAll` item and a resync one `SyncAll` item (client-go
    /// `AtomicEvents`). Needs no known-objects store, and refuses one.
    pub atomic_events: bool,
    /// Release the queue's lock while the consumer processes an item, so the reflector is
    /// not held up by the informer (client-go `UnlockWhileProcessing`), unless two full
    /// batches are already queued. Needs `atomic_events`.
    pub unlock_while_processing: bool,
    /// Queue watch bookmarks as `Bookmark` items, so the store learns the resourceVersion
    /// it is current to (client-go `EmitDeltaTypeBookmark`). Needs `atomic_events`.
    pub emit_bookmarks: bool,
    /// The most events one `pop_batch` hands out (client-go `batchSize`); 1 pops one at a
    /// time (client-go `Pop`, the `InOrderInformersBatchProcess` gate off).
    pub batch_size: usize,
}

impl Default for RealFifoOptions {
    fn default() -> Self {
        Self {
            atomic_events: true,
            unlock_while_processing: true,
            emit_bookmarks: true,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

impl RealFifoOptions {
    /// The per-object queue of client-go 1.33-1.35 (the `AtomicFIFO` gate off): lists and
    /// resyncs queued one event per object, deletions found against the known objects.
    pub fn non_atomic() -> Self {
        Self {
            atomic_events: false,
            unlock_while_processing: false,
            emit_bookmarks: false,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

/// Options that contradict each other (client-go panics with "coding error").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("RealFIFO options refused: {0}")]
pub struct RealFifoOptionsError(&'static str);

/// client-go `RealFIFO`. Cloning shares the queue.
pub struct RealFIFO<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    inner: Mutex<Inner<K>>,
    /// Woken when an item is queued or the queue closes.
    ready: Notify,
    key_func: KeyFunc<K>,
    /// The informer's store, for deletion detection and resync; `None` in atomic mode.
    known: Option<Arc<dyn KnownObjects<K>>>,
    options: RealFifoOptions,
}

/// One queued item.
enum Item<K> {
    Delta(Delta<K>),
    ReplacedAll(ReplacedAllInfo<K>),
    SyncAll,
    Bookmark(String),
    /// An atomic queue's deletion of an object whose final state did not decode.
    DeletedUndecodable(String),
    /// An atomic queue's deletion of every object a shard selector matches.
    Released(ShardSelector),
}

struct Inner<K> {
    items: VecDeque<Item<K>>,
    populated: bool,
    initial_population_count: usize,
    synced: bool,
    closed: bool,
    transform: Option<TransformFunc<K>>,
    /// A compact cache's codec: the reflector encodes lists with it (atomic mode only).
    list_codec: Option<ListCodec<K>>,
}

impl<K> Clone for RealFIFO<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Item<K> {
    fn to_popped(&self) -> Popped<K> {
        match self {
            Item::Delta(d) => Popped::Deltas(vec![d.clone()]),
            Item::ReplacedAll(info) => Popped::ReplacedAll(info.clone()),
            Item::SyncAll => Popped::SyncAll,
            Item::Bookmark(rv) => Popped::Bookmark(rv.clone()),
            Item::DeletedUndecodable(key) => Popped::DeletedUndecodable(key.clone()),
            Item::Released(selector) => Popped::Released(selector.clone()),
        }
    }

    fn into_popped(self) -> Popped<K> {
        match self {
            Item::Delta(d) => Popped::Deltas(vec![d]),
            Item::ReplacedAll(info) => Popped::ReplacedAll(info),
            Item::SyncAll => Popped::SyncAll,
            Item::Bookmark(rv) => Popped::Bookmark(rv),
            Item::DeletedUndecodable(key) => Popped::DeletedUndecodable(key),
            Item::Released(selector) => Popped::Released(selector),
        }
    }
}

impl<K: Send + Sync + 'static> RealFIFO<K> {
    /// A per-object queue ([`RealFifoOptions::non_atomic`]) keyed by `key_func` whose
    /// deletion detection consults `known` (the informer's store).
    pub fn new(key_func: KeyFunc<K>, known: Arc<dyn KnownObjects<K>>) -> Self {
        Self::build(key_func, Some(known), RealFifoOptions::non_atomic())
    }

    /// A queue with `options`: atomic queues take no `known`, per-object queues need it
    /// (client-go `NewRealFIFOWithOptions`).
    pub fn with_options(
        key_func: KeyFunc<K>,
        known: Option<Arc<dyn KnownObjects<K>>>,
        options: RealFifoOptions,
    ) -> Result<Self, RealFifoOptionsError> {
        if options.atomic_events {
            if known.is_some() {
                return Err(RealFifoOptionsError(
                    "an atomic queue works out deletions in the informer and takes no known objects",
                ));
            }
        } else {
            if options.unlock_while_processing {
                return Err(RealFifoOptionsError(
                    "unlock_while_processing needs atomic_events",
                ));
            }
            if options.emit_bookmarks {
                return Err(RealFifoOptionsError("emit_bookmarks needs atomic_events"));
            }
            if known.is_none() {
                return Err(RealFifoOptionsError(
                    "a per-object queue needs the known objects to find deletions",
                ));
            }
        }
        Ok(Self::build(key_func, known, options))
    }

    fn build(
        key_func: KeyFunc<K>,
        known: Option<Arc<dyn KnownObjects<K>>>,
        mut options: RealFifoOptions,
    ) -> Self {
        options.batch_size = options.batch_size.max(1);
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    items: VecDeque::new(),
                    populated: false,
                    initial_population_count: 0,
                    synced: false,
                    closed: false,
                    transform: None,
                    list_codec: None,
                }),
                ready: Notify::new(),
                key_func,
                known,
                options,
            }),
        }
    }

    /// Has the reflector encode lists with a compact cache's codec (see `compact.rs`), so a
    /// list is queued encoded. Only an atomic queue hands lists to the cache whole; a
    /// per-object one ignores it.
    pub(crate) fn set_list_codec(&self, codec: ListCodec<K>) {
        if self.shared.options.atomic_events {
            self.shared.inner.lock().list_codec = Some(codec);
        }
    }

    /// The options this queue was built with.
    pub fn options(&self) -> RealFifoOptions {
        self.shared.options
    }

    /// The key of an object (client-go `KeyOf`); a tombstone's key is its own.
    pub fn key_of_delta(&self, delta: &Delta<K>) -> Result<String, KeyError> {
        match delta {
            Delta::Deleted(DeletedObject::Unknown(t)) => Ok(t.key.clone()),
            d => (self.shared.key_func)(d.object()),
        }
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
        inner.items.push_back(Item::Delta(delta));
        drop(inner);
        self.shared.ready.notify_waiters();
        Ok(())
    }

    /// client-go `addReplaceToItemsLocked`.
    fn replace_atomic(
        &self,
        list: ListedObjects<K>,
        undecodable: Vec<String>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        if crate::trace::on() {
            let kind = crate::trace::short_type_name::<K>();
            for key in list.keys(&self.shared.key_func) {
                crate::trace::record(&key, crate::trace::Stage::FifoQueued, kind, || {
                    "ReplacedAll (RealFIFO, from a LIST)".into()
                });
            }
        }
        let mut inner = self.shared.inner.lock();
        inner.items.push_back(Item::ReplacedAll(ReplacedAllInfo {
            resource_version: resource_version.to_string(),
            objects: list,
            undecodable,
        }));
        self.after_replace(inner);
        Ok(())
    }

    /// The first replace fixes how many items make the initial population.
    fn after_replace(&self, mut inner: MutexGuard<'_, Inner<K>>) {
        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = inner.items.len();
            inner.check_synced();
        }
        drop(inner);
        self.shared.ready.notify_waiters();
    }

    /// Waits for the oldest item, removes it and runs `process(item, is_in_initial_list)`
    /// (client-go `Pop`). After `close`, drains what is queued, then [`FifoClosed`].
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is removed until the future completes.
    pub async fn pop<R>(
        &self,
        process: impl FnOnce(Popped<K>, bool) -> R,
    ) -> Result<R, FifoClosed> {
        self.pop_up_to(1, process).await
    }

    /// client-go `PopBatch`: waits for items and hands out as many as
    /// [`RealFifoOptions::batch_size`] events as one [`Popped::Batch`], oldest first. The
    /// batch ends before a second event of a key already in it, before a whole-list item,
    /// at the end of the initial population, and after an event whose key cannot be
    /// computed. A batch of one is handed out as [`pop`](Self::pop) would.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is removed until the future completes.
    pub async fn pop_batch<R>(
        &self,
        process: impl FnOnce(Popped<K>, bool) -> R,
    ) -> Result<R, FifoClosed> {
        self.pop_up_to(self.shared.options.batch_size, process)
            .await
    }

    async fn pop_up_to<R>(
        &self,
        limit: usize,
        process: impl FnOnce(Popped<K>, bool) -> R,
    ) -> Result<R, FifoClosed> {
        let mut process = Some(process);
        wait_for_item(&self.shared.inner, &self.shared.ready, |inner| {
            if inner.items.is_empty() {
                return inner.closed.then_some(Err(FifoClosed));
            }
            let process = process.take().expect("called until it hands out");
            let is_in_initial_list = !inner.synced;
            let (popped, n) = self.take(inner, limit);
            // client-go unlocks only while fewer than two full batches are queued, so a slow
            // consumer holds the producer back instead of letting it run away.
            let unlock = self.shared.options.unlock_while_processing
                && inner.items.len() < self.shared.options.batch_size * 2;
            let result = if unlock {
                MutexGuard::unlocked(inner, || process(popped, is_in_initial_list))
            } else {
                process(popped, is_in_initial_list)
            };
            // Only now, so `has_synced` is not true while the last initial item is still
            // being processed.
            if inner.initial_population_count > 0 {
                inner.initial_population_count = inner.initial_population_count.saturating_sub(n);
                inner.check_synced();
            }
            Some(Ok(result))
        })
        .await
    }

    /// Removes up to `limit` items from the front as one pop (see `pop_batch`); returns them
    /// and how many there were.
    fn take(&self, inner: &mut Inner<K>, limit: usize) -> (Popped<K>, usize) {
        let mut limit = limit.min(inner.items.len());
        if inner.initial_population_count > 0 {
            limit = limit.min(inner.initial_population_count);
        }
        let first_is_event = matches!(inner.items.front(), Some(Item::Delta(_)));
        if limit <= 1 || !first_is_event {
            let item = inner.items.pop_front().expect("checked non-empty");
            return (item.into_popped(), 1);
        }
        let mut keys = HashSet::with_capacity(limit);
        let mut n = 0;
        for item in inner.items.iter().take(limit) {
            let Item::Delta(delta) = item else {
                break;
            };
            match self.key_of_delta(delta) {
                Ok(key) => {
                    if !keys.insert(key) {
                        break;
                    }
                    n += 1;
                }
                Err(_) => {
                    // client-go takes an event whose key fails into the batch and ends it
                    // there; the informer reports the key error when it applies the event.
                    n += 1;
                    break;
                }
            }
        }
        let batch: Vec<Delta<K>> = inner
            .items
            .drain(..n)
            .map(|item| match item {
                Item::Delta(d) => d,
                _ => unreachable!("a batch holds events only"),
            })
            .collect();
        if batch.len() == 1 {
            (Popped::Deltas(batch), 1)
        } else {
            (Popped::Batch(batch), n)
        }
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.shared.inner.lock().closed
    }

    /// The queued items, oldest first, each as `pop` would hand it out (a copy, for tests
    /// and debugging).
    pub fn items(&self) -> Vec<Popped<K>> {
        self.shared
            .inner
            .lock()
            .items
            .iter()
            .map(Item::to_popped)
            .collect()
    }

    /// Queues `delta` as is, without computing its key (tests of key failures).
    #[cfg(test)]
    fn push_unchecked(&self, delta: Delta<K>) {
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        inner.check_synced();
        inner.items.push_back(Item::Delta(delta));
    }

    /// `replace` for objects already transformed and shared (what the reflector hands over);
    /// the keys in `undecodable` get no tombstone (see `ReflectorStore::replace_listed`).
    fn queue_listed(
        &self,
        list: ListedObjects<K>,
        undecodable: Vec<String>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        if self.shared.options.atomic_events {
            return self.replace_atomic(list, undecodable, resource_version);
        }
        let list = list.into_decoded();
        let undecodable: HashSet<String> = undecodable.into_iter().collect();
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
            let Item::Delta(item) = item else { continue };
            let key = self.key_of_delta(item)?;
            if last_queued.insert(key.clone(), item.clone()).is_none() {
                queued_order.push(key);
            }
        }
        let mut tombstones = Vec::new();
        for key in queued_order {
            if new_keys.contains(&key) || undecodable.contains(&key) {
                continue;
            }
            let last = &last_queued[&key];
            if matches!(last, Delta::Deleted(_)) {
                continue;
            }
            let obj = last.object().clone();
            tombstones.push(Delta::tombstone(key, obj));
        }
        if let Some(known) = &self.shared.known {
            for key in known.list_keys() {
                if new_keys.contains(&key)
                    || last_queued.contains_key(&key)
                    || undecodable.contains(&key)
                {
                    continue;
                }
                if let Some(obj) = known.get_by_key(&key) {
                    tombstones.push(Delta::tombstone(key, obj));
                }
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
        inner.items.extend(tombstones.into_iter().map(Item::Delta));
        inner
            .items
            .extend(list.into_iter().map(|o| Item::Delta(Delta::Replaced(o))));
        self.after_replace(inner);
        Ok(())
    }
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
    /// Queues an `Added` item.
    fn add(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, Delta::Added)
    }
    /// Queues an `Updated` item.
    fn update(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, Delta::Updated)
    }
    /// Queues a `Deleted` item (always: client-go's RealFIFO does not filter deletions of
    /// keys nobody holds).
    fn delete(&self, obj: K) -> Result<(), StoreError> {
        self.push_event(obj, |o| Delta::Deleted(DeletedObject::Object(o)))
    }
    /// client-go `Replace`. Atomic: one `ReplacedAll` item holding the whole list. Per
    /// object (`reconcileReplacement`): first a tombstone for every key that is queued or
    /// known but not in `list` (a queued key whose last item is a deletion needs none), then
    /// a `Replaced` item per object, in list order.
    fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError> {
        let transform = self.shared.inner.lock().transform.clone();
        self.queue_listed(
            transformed_list(transform.as_ref(), list).into(),
            Vec::new(),
            resource_version,
        )
    }
    /// client-go `Resync`. Atomic: one `SyncAll` item. Per object: a `Sync` item for every
    /// known key with nothing queued.
    fn resync(&self) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        if self.shared.options.atomic_events {
            inner.items.push_back(Item::SyncAll);
            drop(inner);
            self.shared.ready.notify_waiters();
            return Ok(());
        }
        let Some(known) = &self.shared.known else {
            return Ok(());
        };
        let mut queued = HashSet::with_capacity(inner.items.len());
        for item in &inner.items {
            if let Item::Delta(d) = item {
                queued.insert(self.key_of_delta(d)?);
            }
        }
        let mut added = false;
        for key in known.list_keys() {
            if queued.contains(&key) {
                continue;
            }
            if let Some(obj) = known.get_by_key(&key) {
                inner.items.push_back(Item::Delta(Delta::Sync(obj)));
                added = true;
            }
        }
        drop(inner);
        if added {
            self.shared.ready.notify_waiters();
        }
        Ok(())
    }
    /// client-go `Bookmark`: queues a `Bookmark` item if the queue emits them, else nothing.
    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        if !self.shared.options.emit_bookmarks {
            return Ok(());
        }
        self.shared
            .inner
            .lock()
            .items
            .push_back(Item::Bookmark(resource_version.to_string()));
        self.shared.ready.notify_waiters();
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
        self.queue_listed(list, undecodable, resource_version)
    }
    fn list_codec(&self) -> Option<ListCodec<K>> {
        self.shared.inner.lock().list_codec.clone()
    }
    /// Atomic: a `DeletedUndecodable` item; the informer deletes what it holds when it pops
    /// it. Per object: a tombstone carrying the last queued object of the key, else the
    /// known one (nothing if neither holds it, or the last queued item is a deletion).
    fn delete_undecodable(&self, key: &str) -> Result<(), StoreError> {
        let mut inner = self.shared.inner.lock();
        let item = if self.shared.options.atomic_events {
            Item::DeletedUndecodable(key.to_string())
        } else {
            let mut last = None;
            for item in inner.items.iter().rev() {
                if let Item::Delta(d) = item
                    && self.key_of_delta(d).is_ok_and(|k| k == key)
                {
                    last = Some(d);
                    break;
                }
            }
            let obj = match last {
                Some(Delta::Deleted(_)) => None,
                Some(d) => Some(d.object().clone()),
                None => self
                    .shared
                    .known
                    .as_ref()
                    .and_then(|known| known.get_by_key(key)),
            };
            let Some(obj) = obj else {
                return Ok(());
            };
            Item::Delta(Delta::tombstone(key.to_string(), obj))
        };
        inner.populated = true;
        inner.check_synced();
        inner.items.push_back(item);
        drop(inner);
        self.shared.ready.notify_waiters();
        Ok(())
    }
    /// Atomic: a `Released` item; the informer deletes what the selector matches when it
    /// pops it, after everything queued before it. Not atomic: `false` (the queue would
    /// have to find the keys among its items and the known objects; the reflector lists
    /// again instead).
    fn release(&self, selector: &ShardSelector) -> Result<bool, StoreError> {
        if !self.shared.options.atomic_events {
            return Ok(false);
        }
        let mut inner = self.shared.inner.lock();
        inner.populated = true;
        inner.check_synced();
        inner.items.push_back(Item::Released(selector.clone()));
        drop(inner);
        self.shared.ready.notify_waiters();
        Ok(true)
    }
}

impl<K: Send + Sync + 'static> InformerQueue<K> for RealFIFO<K> {
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(Popped<K>, bool) + Send),
    ) -> BoxFuture<'a, Result<(), FifoClosed>> {
        self.pop_batch(process).boxed()
    }
    /// True once the first `replace`'s items have all been popped, or at once if an
    /// add/update/delete came first.
    fn has_synced(&self) -> bool {
        self.shared.inner.lock().synced
    }
    /// Sets the transform applied to objects before they are queued (not to tombstones or
    /// `Sync` items, whose objects come from the store already transformed).
    fn set_transform(&self, transform: Option<TransformFunc<K>>) {
        self.shared.inner.lock().transform = transform;
    }
    /// Stops the queue: pending items can still be popped, then `pop` reports closed.
    fn close(&self) {
        self.shared.inner.lock().closed = true;
        self.shared.ready.notify_waiters();
    }
    /// Number of queued items.
    fn len(&self) -> usize {
        self.shared.inner.lock().items.len()
    }
}

#[cfg(test)]
mod tests;
