//! The queue between a reflector and an informer's processing loop: client-go's `Queue`
//! interface (`fifo.go`), which both [`DeltaFIFO`](super::DeltaFIFO) and
//! [`RealFIFO`](super::RealFIFO) implement.
//!
//! The informer only pops, asks whether the first list has been delivered, sets a
//! transform and closes; the reflector writes through [`ReflectorStore`]. What both FIFOs
//! take and give besides their items lives here too: the consumer's objects they consult
//! ([`KnownObjects`], client-go `KeyListerGetter`) and the error of a closed queue
//! ([`FifoClosed`], client-go `ErrFIFOClosed`).

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use super::delta::{Delta, Deltas};
use super::shard_selector::ShardSelector;
use super::store::{ReflectorStore, TransformFunc};
use super::stored::ListedObjects;
use super::thread_safe_store::{Indexer, ThreadSafeStore};

/// What one pop hands to the informer's processing loop.
///
/// client-go passes `Deltas` to `Pop`'s process function and `[]Delta` to `PopBatch`'s, and
/// carries the atomic RealFIFO's whole-list items as deltas of type `ReplacedAll`, `SyncAll`
/// and `Bookmark` whose `Object` is an info struct; here those are variants of their own, so
/// a [`Delta`] always carries an object.
#[derive(Debug)]
pub enum Popped<K> {
    /// One key's deltas, oldest first ([`DeltaFIFO`](super::DeltaFIFO)), or one event
    /// ([`RealFIFO`](super::RealFIFO)).
    Deltas(Deltas<K>),
    /// Events of distinct keys in watch order, applied to the store in one lock
    /// (client-go `PopBatch` and `processDeltasInBatch`).
    Batch(Vec<Delta<K>>),
    /// An atomic RealFIFO's list: the store becomes exactly these objects (client-go
    /// `ReplacedAll` with `ReplacedAllInfo`).
    ReplacedAll(ReplacedAllInfo<K>),
    /// An atomic RealFIFO's resync: every cached object is offered to the handlers due one
    /// (client-go `SyncAll`).
    SyncAll,
    /// The reflector saw a watch bookmark at this resourceVersion (client-go `Bookmark`
    /// with `BookmarkInfo`).
    Bookmark(String),
    /// An atomic RealFIFO's deletion of an object whose final state did not decode (no
    /// client-go counterpart; see `undecodable.rs`): the informer deletes what it holds at
    /// this key and hands handlers a tombstone of it, or does nothing if it holds nothing.
    DeletedUndecodable(String),
    /// An atomic RealFIFO's narrowing of a shard scope (no client-go counterpart; see
    /// `shard_scope.rs`): the informer deletes every object it holds that this selector
    /// matches (the shards given up) and hands handlers a tombstone of each, as a list that
    /// no longer holds them would.
    Released(ShardSelector),
}

/// A completed list, queued whole by an atomic RealFIFO (client-go `ReplacedAllInfo`).
#[derive(Debug)]
pub struct ReplacedAllInfo<K> {
    /// The list's resourceVersion.
    pub resource_version: String,
    /// The listed objects, transformed, in list order (a compact cache's encoded).
    pub objects: ListedObjects<K>,
    /// Keys of listed objects that did not decode: the store keeps what it holds at them
    /// (their last version that decoded) rather than deleting them.
    pub undecodable: Vec<String>,
}

impl<K> Clone for ReplacedAllInfo<K> {
    fn clone(&self) -> Self {
        Self {
            resource_version: self.resource_version.clone(),
            objects: self.objects.clone(),
            undecodable: self.undecodable.clone(),
        }
    }
}

impl<K> Clone for Popped<K> {
    fn clone(&self) -> Self {
        match self {
            Popped::Deltas(d) => Popped::Deltas(d.clone()),
            Popped::Batch(d) => Popped::Batch(d.clone()),
            Popped::ReplacedAll(info) => Popped::ReplacedAll(info.clone()),
            Popped::SyncAll => Popped::SyncAll,
            Popped::Bookmark(rv) => Popped::Bookmark(rv.clone()),
            Popped::DeletedUndecodable(key) => Popped::DeletedUndecodable(key.clone()),
            Popped::Released(selector) => Popped::Released(selector.clone()),
        }
    }
}

/// Which queue an informer uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QueueKind {
    /// [`RealFIFO`](super::RealFIFO): every event in watch order, no per-key merging.
    /// client-go 1.36's informers always use it (the `InOrderInformers` gate is GA).
    #[default]
    RealFifo,
    /// [`DeltaFIFO`](super::DeltaFIFO): a key's pending deltas are handed out together.
    DeltaFifo,
}

/// A queue an informer pops (client-go `Queue`).
pub trait InformerQueue<K>: ReflectorStore<K> {
    /// Waits for the next item (or batch) and runs `process(popped, is_in_initial_list)` on
    /// it, under the queue's lock unless the queue unlocks while processing;
    /// [`FifoClosed`] once closed and drained. The informer is the one consumer.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is removed until the future completes.
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(Popped<K>, bool) + Send),
    ) -> BoxFuture<'a, Result<(), FifoClosed>>;

    /// True once everything the first `replace` queued has been popped (or at once if an
    /// add/update/delete came first).
    fn has_synced(&self) -> bool;

    /// Sets the transform applied to objects before they are queued.
    fn set_transform(&self, transform: Option<TransformFunc<K>>);

    /// Stops the queue: what is queued can still be popped.
    fn close(&self);

    /// Items waiting to be popped.
    fn len(&self) -> usize;

    /// True if nothing waits to be popped.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `pop` on a closed, drained queue (client-go `ErrFIFOClosed`, message and all, shared by
/// both FIFOs as in client-go).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DeltaFIFO: manipulating with closed queue")]
pub struct FifoClosed;

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

/// How both FIFOs' pops wait: runs `step` under `lock` until it hands out a result (an item,
/// or [`FifoClosed`] once the queue is closed and drained), and in between sleeps until
/// `ready` is notified. The notification is armed before the lock is taken, so a push between
/// `step`'s look and the sleep is never missed.
///
/// # Cancel safety
/// Cancel-safe as long as `step` removes items only when it returns `Some`.
pub(crate) async fn wait_for_item<S, R>(
    lock: &Mutex<S>,
    ready: &Notify,
    mut step: impl FnMut(&mut MutexGuard<'_, S>) -> Option<R>,
) -> R {
    loop {
        let notified = ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(result) = step(&mut lock.lock()) {
            return result;
        }
        notified.await;
    }
}
