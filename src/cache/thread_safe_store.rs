//! The indexed object map under one lock: client-go `tools/cache/thread_safe_store.go`.
//!
//! [`ThreadSafeStore`] is the writable cache (the informer's controller loop is its only
//! writer); [`Indexer`] is the cloneable read-only handle everybody else gets. Objects are
//! handed out as `Arc<K>` so nobody can change the cached copy.
//!
//! Two ways to hold them ([`StoreKind`]):
//! - typed (the default, client-go's): the decoded objects themselves; a read hands out the
//!   stored `Arc`, never a copy;
//! - compact (feature `compact-store`; no client-go counterpart, see `compact.rs`): each
//!   object as a compressed frame (of its protobuf as sent, or its JSON), about 0.6x its
//!   wire size; a read decodes a new `Arc<K>` (about 3 us for a 1.5 KB ConfigMap), outside
//!   the lock. Indexes are kept from the decoded object when it is written, so a lookup by
//!   index decodes only what it returns.
//!
//! Invariants (kept under the one lock, in `Inner`):
//! - for every index name `n` in `indexers`, `indices[n][v]` contains key `k` iff `items[k]`
//!   exists and `indexers[n](items[k])` contains `v`;
//! - empty value sets are removed from `indices`, so `list_index_func_values` never reports a
//!   value with no objects;
//! - `items` holds `Stored::Encoded` only if `codec` is set.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::index::{Index, IndexError, Indexers, index_object};
use super::stored::{Arrived, Codec, ListCodec, ListIndices, StoreKind, Stored};

/// The writable, indexed cache. Cloning shares the same map.
pub struct ThreadSafeStore<K> {
    inner: Arc<RwLock<Inner<K>>>,
}

/// A read-only handle on a [`ThreadSafeStore`]: what listers and handlers get.
pub struct Indexer<K> {
    inner: Arc<RwLock<Inner<K>>>,
}

/// What [`ThreadSafeStore::replace`] took out of the store, decoded as it is taken.
pub struct Replaced<K> {
    items: HashMap<String, Stored<K>>,
    codec: Option<Arc<Codec<K>>>,
}

struct Inner<K> {
    /// key -> object.
    items: HashMap<String, Stored<K>>,
    /// index name -> index function.
    indexers: Indexers<K>,
    /// index name -> value -> keys; see the module invariants.
    indices: HashMap<String, Index>,
    /// The resourceVersion the contents are current to, as the writer last said (client-go
    /// `threadSafeMap.rv`); empty until said.
    rv: String,
    /// Set for a compact store.
    codec: Option<Arc<Codec<K>>>,
}

/// Writes made under the store's one lock: see [`ThreadSafeStore::transaction`].
pub struct StoreTransaction<'a, K> {
    inner: &'a mut Inner<K>,
}

impl<K> StoreTransaction<'_, K> {
    /// Inserts or replaces the object at `key` (client-go `TransactionTypeAdd`/`Update`);
    /// returns what was stored there.
    pub fn put(&mut self, key: String, obj: Arc<K>) -> Option<Arc<K>> {
        self.inner.put(key, obj)
    }

    /// Removes `key` (client-go `TransactionTypeDelete`); returns what was stored there.
    pub fn delete(&mut self, key: &str) -> Option<Arc<K>> {
        self.inner.remove(key)
    }

    /// The contents are now current to `resource_version`.
    pub fn set_resource_version(&mut self, resource_version: &str) {
        self.inner.set_rv(resource_version)
    }
}

impl<K> Clone for ThreadSafeStore<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Clone for Indexer<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Replaced<K> {
    /// Takes the previous object at `key` out as the store held it (no decoding).
    pub(crate) fn take(&mut self, key: &str) -> Option<Stored<K>> {
        self.items.remove(key)
    }

    /// Number of objects left.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether none are left.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The objects left, with their keys.
    pub fn into_objects(self) -> impl Iterator<Item = (String, Arc<K>)> {
        let codec = self.codec;
        self.items.into_iter().filter_map(move |(key, stored)| {
            let obj = stored.load(codec.as_deref(), &key)?;
            Some((key, obj))
        })
    }
}

impl<K> ThreadSafeStore<K> {
    /// An empty typed store with the given indexers.
    pub fn new(indexers: Indexers<K>) -> Self {
        Self::with_codec(indexers, None)
    }

    /// An empty store of `kind` with the given indexers.
    pub fn of_kind(kind: StoreKind, indexers: Indexers<K>) -> Self
    where
        K: Serialize + DeserializeOwned + 'static,
    {
        let codec = match kind {
            StoreKind::Typed => None,
            #[cfg(feature = "compact-store")]
            StoreKind::Compact => Some(super::compact::codec::<K>()),
        };
        Self::with_codec(indexers, codec)
    }

    pub(super) fn with_codec(indexers: Indexers<K>, codec: Option<Arc<Codec<K>>>) -> Self {
        let indices = indexers.keys().map(|n| (n.clone(), Index::new())).collect();
        Self {
            inner: Arc::new(RwLock::new(Inner {
                items: HashMap::new(),
                indexers,
                indices,
                rv: String::new(),
                codec,
            })),
        }
    }

    /// The read-only handle.
    pub fn reader(&self) -> Indexer<K> {
        Indexer {
            inner: self.inner.clone(),
        }
    }

    /// How it holds its objects.
    pub fn kind(&self) -> StoreKind {
        self.reader().kind()
    }

    /// Inserts or replaces the object at `key` (client-go `Add`).
    pub fn add(&self, key: String, obj: Arc<K>) {
        self.inner.write().put(key, obj);
    }

    /// Same as [`add`](Self::add) (client-go `Update`).
    pub fn update(&self, key: String, obj: Arc<K>) {
        self.inner.write().put(key, obj);
    }

    /// Removes `key`, returning what was stored there.
    pub fn delete(&self, key: &str) -> Option<Arc<K>> {
        self.inner.write().remove(key)
    }

    /// Makes the contents exactly `items`, current to `resource_version`, rebuilding every
    /// index (client-go `Replace(items, resourceVersion)`). Returns the previous contents,
    /// for the caller to compare against and drop outside the lock. A compact store trains
    /// its dictionary on the first list big enough, and encodes outside the lock.
    pub fn replace(&self, items: HashMap<String, Arc<K>>, resource_version: &str) -> Replaced<K> {
        let codec = self.inner.read().codec.clone();
        if let Some(codec) = &codec {
            let objects: Vec<Arrived<K>> = items
                .values()
                .map(|o| Arrived {
                    object: o.clone(),
                    sent: None,
                })
                .collect();
            codec.learn(&objects);
        }
        let entries = items
            .into_iter()
            .map(|(key, obj)| {
                let stored = Stored::new(codec.as_deref(), &key, obj);
                (key, stored)
            })
            .collect();
        self.replace_entries(entries, None, Vec::new(), resource_version)
    }

    /// [`replace`](Self::replace) with objects as the store holds them (a compact store's
    /// frames, encoded by the reflector as the list arrived): `listed`, whose indexes came
    /// built with them when `indexed` is given and the store's indexers are still the ones
    /// they were built with, and `others`, indexed here. An object whose indexes are built
    /// here is decoded for it, one at a time.
    pub(crate) fn replace_entries(
        &self,
        listed: Vec<(String, Stored<K>)>,
        indexed: Option<ListIndices>,
        others: Vec<(String, Stored<K>)>,
        resource_version: &str,
    ) -> Replaced<K> {
        let mut inner = self.inner.write();
        let mut items = HashMap::with_capacity(listed.len() + others.len());
        let built = indexed.and_then(|i| i.built_with(&inner.indexers));
        let index_listed = built.is_none();
        let mut indices = built.unwrap_or_else(|| {
            inner
                .indexers
                .keys()
                .map(|n| (n.clone(), Index::new()))
                .collect()
        });
        let entries = (others.into_iter().map(|e| (e, true)))
            .chain(listed.into_iter().map(|e| (e, index_listed)));
        for ((key, stored), index) in entries {
            if index && let Some(obj) = stored.load(inner.codec.as_deref(), &key) {
                index_object(&mut indices, &inner.indexers, &key, &obj);
            }
            items.insert(key, stored);
        }
        inner.indices = indices;
        let old = std::mem::replace(&mut inner.items, items);
        inner.set_rv(resource_version);
        Replaced {
            items: old,
            codec: inner.codec.clone(),
        }
    }

    /// Every object with its key, as the store holds them (no decoding).
    pub(crate) fn entries(&self) -> Vec<(String, Stored<K>)> {
        let inner = self.inner.read();
        inner
            .items
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect()
    }

    /// A compact store's codec.
    pub(crate) fn codec(&self) -> Option<Arc<Codec<K>>> {
        self.inner.read().codec.clone()
    }

    /// The object at `key` as the store holds it (no decoding).
    pub(crate) fn stored(&self, key: &str) -> Option<Stored<K>> {
        self.inner.read().items.get(key).cloned()
    }

    /// What the reflector encodes a list with, for a compact store, and the indexers it
    /// builds the list's indexes with (the store's, as they are when a list starts).
    pub(crate) fn list_codec(&self) -> Option<ListCodec<K>>
    where
        K: Send + Sync + 'static,
    {
        let codec = self.inner.read().codec.clone()?;
        let inner = Arc::downgrade(&self.inner);
        Some(ListCodec {
            codec,
            indexers: Arc::new(move || {
                inner
                    .upgrade()
                    .map(|i| i.read().indexers.clone())
                    .unwrap_or_default()
            }),
        })
    }

    /// Runs `f`'s writes under one lock (client-go `Transaction`): readers see all of them
    /// or none.
    pub fn transaction<R>(&self, f: impl FnOnce(&mut StoreTransaction<'_, K>) -> R) -> R {
        f(&mut StoreTransaction {
            inner: &mut self.inner.write(),
        })
    }

    /// The contents are current to `resource_version` (a watch bookmark; client-go
    /// `Bookmark`).
    pub fn bookmark(&self, resource_version: &str) {
        self.inner.write().set_rv(resource_version);
    }

    /// Read side, for convenience.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.reader().get_by_key(key)
    }

    /// All keys.
    pub fn list_keys(&self) -> Vec<String> {
        self.reader().list_keys()
    }

    /// All objects.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.reader().list()
    }

    /// Registers more indexers and backfills them from the current contents.
    pub fn add_indexers(&self, new: Indexers<K>) -> Result<(), IndexError> {
        self.inner.write().add_indexers(new)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.inner.read().items.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K> Indexer<K> {
    /// The object at `key` (client-go `GetByKey`).
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        let (stored, codec) = {
            let inner = self.inner.read();
            (inner.items.get(key)?.clone(), inner.codec.clone())
        };
        stored.load(codec.as_deref(), key)
    }

    /// All objects (client-go `List`).
    pub fn list(&self) -> Vec<Arc<K>> {
        self.load_each(|inner| inner.items.keys().collect())
    }

    /// All keys (client-go `ListKeys`).
    pub fn list_keys(&self) -> Vec<String> {
        self.inner.read().items.keys().cloned().collect()
    }

    /// The bytes a compact store's frames take (`None` for a typed store): what its objects
    /// cost beside the keys and indexes.
    pub fn stored_bytes(&self) -> Option<usize> {
        let inner = self.inner.read();
        inner.codec.as_ref()?;
        Some(inner.items.values().map(Stored::encoded_len).sum())
    }

    /// How the store holds its objects.
    pub fn kind(&self) -> StoreKind {
        match self.inner.read().codec {
            #[cfg(feature = "compact-store")]
            Some(_) => StoreKind::Compact,
            _ => StoreKind::Typed,
        }
    }

    /// The resourceVersion the cache is current to (client-go
    /// `LastStoreSyncResourceVersion`): the last list's, the last applied event's or the
    /// last bookmark's. Empty until the first list has been applied, and always empty for
    /// an informer whose queue is not atomic (client-go returns "" with the `AtomicFIFO`
    /// gate off: per-object list events leave the store between versions).
    pub fn last_store_sync_resource_version(&self) -> String {
        self.inner.read().rv.clone()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.inner.read().items.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects sharing any of the values `obj` is indexed under in `index_name`
    /// (client-go `Index`).
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, IndexError> {
        let func = self.inner.read().indexer(index_name)?.clone();
        let values = func(obj);
        Ok(self.load_each(|inner| {
            let index = &inner.indices[index_name];
            let mut keys: HashSet<&String> = HashSet::new();
            for v in &values {
                if let Some(set) = index.get(v) {
                    keys.extend(set.iter());
                }
            }
            keys.into_iter().collect()
        }))
    }

    /// Keys indexed under `value` in `index_name` (client-go `IndexKeys`).
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, IndexError> {
        let inner = self.inner.read();
        inner.indexer(index_name)?;
        Ok(inner.indices[index_name]
            .get(value)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default())
    }

    /// Objects indexed under `value` in `index_name` (client-go `ByIndex`).
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, IndexError> {
        self.inner.read().indexer(index_name)?;
        Ok(self.load_each(|inner| {
            inner.indices[index_name]
                .get(value)
                .map(|s| s.iter().collect())
                .unwrap_or_default()
        }))
    }

    /// Every value that has at least one object in `index_name`
    /// (client-go `ListIndexFuncValues`).
    pub fn list_index_func_values(&self, index_name: &str) -> Result<Vec<String>, IndexError> {
        let inner = self.inner.read();
        inner.indexer(index_name)?;
        Ok(inner.indices[index_name].keys().cloned().collect())
    }

    /// The names of the registered indexers.
    pub fn indexer_names(&self) -> Vec<String> {
        self.inner.read().indexers.keys().cloned().collect()
    }

    /// Registers more indexers and backfills them (client-go `AddIndexers`); allowed at any
    /// time, an index name that already exists is an error and nothing is added.
    pub fn add_indexers(&self, new: Indexers<K>) -> Result<(), IndexError> {
        self.inner.write().add_indexers(new)
    }

    /// The objects at the keys `pick` chooses: a typed store's are cloned under the read
    /// lock; a compact store's frames are, and decoded after it, so a long list never
    /// holds the writer back for its decoding.
    fn load_each(&self, pick: impl FnOnce(&Inner<K>) -> Vec<&String>) -> Vec<Arc<K>> {
        let inner = self.inner.read();
        let keys = pick(&inner);
        let Some(codec) = inner.codec.clone() else {
            return keys
                .into_iter()
                .filter_map(|k| match inner.items.get(k) {
                    Some(Stored::Object(o)) => Some(o.clone()),
                    _ => None,
                })
                .collect();
        };
        let picked: Vec<(String, Stored<K>)> = keys
            .into_iter()
            .filter_map(|k| Some((k.clone(), inner.items.get(k)?.clone())))
            .collect();
        drop(inner);
        picked
            .iter()
            .filter_map(|(key, stored)| stored.load(Some(&*codec), key))
            .collect()
    }
}

impl<K> Inner<K> {
    fn indexer(&self, name: &str) -> Result<&super::index::IndexFunc<K>, IndexError> {
        self.indexers
            .get(name)
            .ok_or_else(|| IndexError::UnknownIndex {
                name: name.to_string(),
            })
    }

    fn put(&mut self, key: String, obj: Arc<K>) -> Option<Arc<K>> {
        let stored = Stored::new(self.codec.as_deref(), &key, obj.clone());
        let old = match self.items.insert(key.clone(), stored) {
            Some(previous) => self.load_old(&key, &previous),
            None => None,
        };
        self.update_indices(old.as_deref(), Some(&obj), &key);
        old
    }

    fn set_rv(&mut self, rv: &str) {
        self.rv.clear();
        self.rv.push_str(rv);
    }

    fn remove(&mut self, key: &str) -> Option<Arc<K>> {
        let previous = self.items.remove(key)?;
        let old = self.load_old(key, &previous);
        self.update_indices(old.as_deref(), None, key);
        old
    }

    /// The object a write replaced or removed. One that does not decode cannot say what it
    /// was indexed under, so `key` is taken out of every index instead.
    fn load_old(&mut self, key: &str, previous: &Stored<K>) -> Option<Arc<K>> {
        let old = previous.load(self.codec.as_deref(), key);
        if old.is_none() {
            for index in self.indices.values_mut() {
                index.retain(|_, keys| {
                    keys.remove(key);
                    !keys.is_empty()
                });
            }
        }
        old
    }

    /// Moves `key` from the values of `old` to the values of `new` in every index.
    fn update_indices(&mut self, old: Option<&K>, new: Option<&K>, key: &str) {
        for (name, func) in &self.indexers {
            let old_values = old.map(|o| func(o)).unwrap_or_default();
            let new_values = new.map(|n| func(n)).unwrap_or_default();
            // The common update keeps its index values: nothing to move.
            if old.is_some() && new.is_some() && old_values == new_values {
                continue;
            }
            let index = self.indices.entry(name.clone()).or_default();
            for v in &old_values {
                if let Some(set) = index.get_mut(v) {
                    set.remove(key);
                    if set.is_empty() {
                        index.remove(v);
                    }
                }
            }
            for v in new_values {
                index.entry(v).or_default().insert(key.to_string());
            }
        }
    }

    fn add_indexers(&mut self, new: Indexers<K>) -> Result<(), IndexError> {
        if let Some(name) = new.keys().find(|n| self.indexers.contains_key(*n)) {
            return Err(IndexError::Conflict { name: name.clone() });
        }
        let mut indices: HashMap<String, Index> =
            new.keys().map(|n| (n.clone(), Index::new())).collect();
        for (key, stored) in &self.items {
            // A compact store's objects are decoded once for all the new indexes.
            if let Some(obj) = stored.load(self.codec.as_deref(), key) {
                index_object(&mut indices, &new, key, &obj);
            }
        }
        self.indices.extend(indices);
        self.indexers.extend(new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    mod typed {
        const KIND: super::super::StoreKind = super::super::StoreKind::Typed;
        include!("thread_safe_store/tests.rs");
    }
    #[cfg(feature = "compact-store")]
    mod compact {
        const KIND: super::super::StoreKind = super::super::StoreKind::Compact;
        include!("thread_safe_store/tests.rs");
    }
}
