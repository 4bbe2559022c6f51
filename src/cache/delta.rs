//! The cache's shared vocabulary: one change to one object ([`Delta`]), a key's pending
//! changes ([`Deltas`]), and what a deletion carries ([`DeletedObject`], the tombstone
//! [`DeletedFinalStateUnknown`]). client-go defines these in `delta_fifo.go`; here they are a
//! leaf that both FIFOs, the queue trait, the informer and the handlers import, so that no
//! user of the vocabulary has to import one of the FIFOs.

use std::sync::Arc;

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

impl<K> Delta<K> {
    /// The deletion a relist infers for `key`, carrying the last state the cache knew: what
    /// both FIFOs queue for an object a list no longer has.
    pub fn tombstone(key: String, obj: Arc<K>) -> Self {
        Delta::Deleted(DeletedObject::Unknown(DeletedFinalStateUnknown {
            key,
            obj,
        }))
    }

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

    /// Whether this is a deletion carrying a tombstone.
    pub fn is_tombstone(&self) -> bool {
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
