//! The indexed object map under one lock: client-go `tools/cache/thread_safe_store.go`.
//!
//! [`ThreadSafeStore`] is the writable cache (the informer's controller loop is its only
//! writer); [`Indexer`] is the cloneable read-only handle everybody else gets. Objects are
//! stored and handed out as `Arc<K>` so a read never copies an object and nobody can change
//! the cached copy.
//!
//! Invariants (kept under the one lock, in `Inner`):
//! - for every index name `n` in `indexers`, `indices[n][v]` contains key `k` iff `items[k]`
//!   exists and `indexers[n](items[k])` contains `v`;
//! - empty value sets are removed from `indices`, so `list_index_func_values` never reports a
//!   value with no objects.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;

use super::index::{IndexError, Indexers};

/// The writable, indexed cache. Cloning shares the same map.
pub struct ThreadSafeStore<K> {
    inner: Arc<RwLock<Inner<K>>>,
}

/// A read-only handle on a [`ThreadSafeStore`]: what listers and handlers get.
pub struct Indexer<K> {
    inner: Arc<RwLock<Inner<K>>>,
}

/// index value -> keys of the objects indexed under it.
type Index = HashMap<String, HashSet<String>>;

struct Inner<K> {
    /// key -> object.
    items: HashMap<String, Arc<K>>,
    /// index name -> index function.
    indexers: Indexers<K>,
    /// index name -> value -> keys; see the module invariants.
    indices: HashMap<String, Index>,
    /// The resourceVersion the contents are current to, as the writer last said (client-go
    /// `threadSafeMap.rv`); empty until said.
    rv: String,
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

impl<K> ThreadSafeStore<K> {
    /// An empty store with the given indexers.
    pub fn new(indexers: Indexers<K>) -> Self {
        let indices = indexers.keys().map(|n| (n.clone(), Index::new())).collect();
        Self {
            inner: Arc::new(RwLock::new(Inner {
                items: HashMap::new(),
                indexers,
                indices,
                rv: String::new(),
            })),
        }
    }

    /// The read-only handle.
    pub fn reader(&self) -> Indexer<K> {
        Indexer {
            inner: self.inner.clone(),
        }
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
    /// for the caller to compare against and drop outside the lock.
    pub fn replace(
        &self,
        items: HashMap<String, Arc<K>>,
        resource_version: &str,
    ) -> HashMap<String, Arc<K>> {
        let mut inner = self.inner.write();
        let old = std::mem::replace(&mut inner.items, items);
        inner.rebuild_indices();
        inner.set_rv(resource_version);
        old
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
        self.inner.read().items.get(key).cloned()
    }

    /// All keys.
    pub fn list_keys(&self) -> Vec<String> {
        self.inner.read().items.keys().cloned().collect()
    }

    /// All objects.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.read().items.values().cloned().collect()
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
        self.inner.read().items.get(key).cloned()
    }

    /// All objects (client-go `List`).
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.read().items.values().cloned().collect()
    }

    /// All keys (client-go `ListKeys`).
    pub fn list_keys(&self) -> Vec<String> {
        self.inner.read().items.keys().cloned().collect()
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
        let inner = self.inner.read();
        let func = inner.indexer(index_name)?;
        let values = func(obj);
        let index = &inner.indices[index_name];
        let mut keys: HashSet<&String> = HashSet::new();
        for v in &values {
            if let Some(set) = index.get(v) {
                keys.extend(set.iter());
            }
        }
        Ok(keys
            .into_iter()
            .filter_map(|k| inner.items.get(k).cloned())
            .collect())
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
        let inner = self.inner.read();
        inner.indexer(index_name)?;
        Ok(inner.indices[index_name]
            .get(value)
            .map(|s| {
                s.iter()
                    .filter_map(|k| inner.items.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default())
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
        let old = self.items.insert(key.clone(), obj.clone());
        self.update_indices(old.as_deref(), Some(&obj), &key);
        old
    }

    fn set_rv(&mut self, rv: &str) {
        self.rv.clear();
        self.rv.push_str(rv);
    }

    fn remove(&mut self, key: &str) -> Option<Arc<K>> {
        let old = self.items.remove(key)?;
        self.update_indices(Some(&old), None, key);
        Some(old)
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

    fn rebuild_indices(&mut self) {
        let mut indices: HashMap<String, Index> = HashMap::new();
        for (name, func) in &self.indexers {
            let index = indices.entry(name.clone()).or_default();
            for (key, obj) in &self.items {
                for v in func(obj) {
                    index.entry(v).or_default().insert(key.clone());
                }
            }
        }
        self.indices = indices;
    }

    fn add_indexers(&mut self, new: Indexers<K>) -> Result<(), IndexError> {
        if let Some(name) = new.keys().find(|n| self.indexers.contains_key(*n)) {
            return Err(IndexError::Conflict { name: name.clone() });
        }
        for (name, func) in new {
            let mut index = Index::new();
            for (key, obj) in &self.items {
                for v in func(obj) {
                    index.entry(v).or_default().insert(key.clone());
                }
            }
            self.indices.insert(name.clone(), index);
            self.indexers.insert(name, func);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::index::{NAMESPACE_INDEX, namespace_indexers};
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube_client::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn pod(ns: &str, name: &str, users: &[&str]) -> Arc<Pod> {
        let mut ann = BTreeMap::new();
        ann.insert("users".to_string(), users.join(","));
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                annotations: Some(ann),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn users_index() -> super::super::index::IndexFunc<Pod> {
        Arc::new(|p: &Pod| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("users"))
                .map(|u| {
                    u.split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    fn store_with_users() -> ThreadSafeStore<Pod> {
        let mut ix = namespace_indexers::<Pod>();
        ix.insert("byUser".into(), users_index());
        ThreadSafeStore::new(ix)
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    fn names(v: Vec<Arc<Pod>>) -> Vec<String> {
        sorted(v.iter().map(|p| p.metadata.name.clone().unwrap()).collect())
    }

    // client-go: TestThreadSafeStoreDeleteRemovesEmptySetsFromIndex
    #[test]
    fn delete_removes_empty_sets_from_index() {
        let s = store_with_users();
        s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
        s.delete("ns/a");
        let r = s.reader();
        assert!(r.list_index_func_values("byUser").unwrap().is_empty());
        assert!(
            r.list_index_func_values(NAMESPACE_INDEX)
                .unwrap()
                .is_empty()
        );
    }

    // client-go: TestThreadSafeStoreAddKeepsNonEmptySetPostDeleteFromIndex
    #[test]
    fn add_keeps_non_empty_set_after_delete() {
        let s = store_with_users();
        s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
        s.add("ns/b".into(), pod("ns", "b", &["ernie"]));
        s.delete("ns/a");
        let r = s.reader();
        assert_eq!(r.index_keys("byUser", "ernie").unwrap(), vec!["ns/b"]);
    }

    // client-go: TestThreadSafeStoreIndexingFunctionsWithMultipleValues
    #[test]
    fn indexing_functions_with_multiple_values() {
        let s = store_with_users();
        let r = s.reader();
        s.add("ns/a".into(), pod("ns", "a", &["ernie", "bert"]));
        s.add("ns/b".into(), pod("ns", "b", &["ernie"]));
        assert_eq!(
            sorted(r.index_keys("byUser", "ernie").unwrap()),
            vec!["ns/a", "ns/b"]
        );
        assert_eq!(r.index_keys("byUser", "bert").unwrap(), vec!["ns/a"]);
        // The update moves a out of "bert" only.
        s.update("ns/a".into(), pod("ns", "a", &["ernie", "elmo"]));
        assert!(r.index_keys("byUser", "bert").unwrap().is_empty());
        assert_eq!(r.index_keys("byUser", "elmo").unwrap(), vec!["ns/a"]);
        assert_eq!(
            sorted(r.list_index_func_values("byUser").unwrap()),
            vec!["elmo", "ernie"]
        );
        // Index() with a multi-valued object is the union of its values' keys.
        let probe = pod("x", "probe", &["elmo", "ernie"]);
        assert_eq!(names(r.index("byUser", &probe).unwrap()), vec!["a", "b"]);
    }

    // client-go: TestMultiIndexKeys (index_test.go)
    #[test]
    fn multi_index_keys() {
        let s = store_with_users();
        let r = s.reader();
        s.add("ns/one".into(), pod("ns", "one", &["ernie", "bert"]));
        s.add("ns/two".into(), pod("ns", "two", &["bert", "oscar"]));
        s.add("ns/tre".into(), pod("ns", "tre", &["ernie", "elmo"]));
        let by = |user: &str| names(r.by_index("byUser", user).unwrap());
        assert_eq!(by("ernie"), ["one", "tre"]);
        assert_eq!(by("bert"), ["one", "two"]);
        assert_eq!(by("elmo"), ["tre"]);
        assert_eq!(by("oscar"), ["two"]);
        assert!(by("elmo1").is_empty());
        s.delete("ns/tre");
        assert_eq!(by("ernie"), ["one"]);
        assert!(by("elmo").is_empty());
        s.update("ns/two".into(), pod("ns", "two", &["oscar"]));
        assert_eq!(by("bert"), ["one"]);
    }

    // client-go: TestGetIndexFuncValues (index_test.go)
    #[test]
    fn get_index_func_values() {
        let s = store_with_users();
        s.add("ns/one".into(), pod("ns", "one", &["bar"]));
        s.add("ns/two".into(), pod("ns", "two", &["bar"]));
        s.add("ns/tre".into(), pod("ns", "tre", &["biz"]));
        let values = sorted(s.reader().list_index_func_values("byUser").unwrap());
        assert_eq!(values, ["bar", "biz"]);
    }

    // kubeloop's own: by_index on a known and an unknown index.
    #[test]
    fn by_index_and_unknown_index() {
        let s = store_with_users();
        let r = s.reader();
        s.add("one/a".into(), pod("one", "a", &[]));
        s.add("one/b".into(), pod("one", "b", &[]));
        s.add("two/c".into(), pod("two", "c", &[]));
        assert_eq!(
            names(r.by_index(NAMESPACE_INDEX, "one").unwrap()),
            vec!["a", "b"]
        );
        assert!(r.by_index(NAMESPACE_INDEX, "three").unwrap().is_empty());
        let err = r.by_index("nope", "one").unwrap_err();
        assert_eq!(
            err,
            IndexError::UnknownIndex {
                name: "nope".into()
            }
        );
        assert!(err.to_string().contains("nope"));
    }

    // kubeloop's own (indexers added after objects are backfilled)
    #[test]
    fn add_indexers_backfills_and_rejects_clashes() {
        let s = ThreadSafeStore::new(namespace_indexers::<Pod>());
        s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
        s.add("ns/b".into(), pod("ns", "b", &["bert"]));
        let r = s.reader();
        let mut more = Indexers::new();
        more.insert("byUser".to_string(), users_index());
        r.add_indexers(more).unwrap();
        assert_eq!(r.index_keys("byUser", "ernie").unwrap(), vec!["ns/a"]);
        // New writes keep the new index current.
        s.add("ns/c".into(), pod("ns", "c", &["ernie"]));
        assert_eq!(
            sorted(r.index_keys("byUser", "ernie").unwrap()),
            vec!["ns/a", "ns/c"]
        );
        let mut clash = Indexers::new();
        clash.insert(NAMESPACE_INDEX.to_string(), users_index());
        assert_eq!(
            r.add_indexers(clash).unwrap_err(),
            IndexError::Conflict {
                name: NAMESPACE_INDEX.into()
            }
        );
    }

    // kubeloop's own: replace rebuilds indices
    #[test]
    fn replace_rebuilds_indices() {
        let s = store_with_users();
        s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
        let mut next = HashMap::new();
        next.insert("other/b".to_string(), pod("other", "b", &["bert"]));
        s.replace(next, "7");
        let r = s.reader();
        assert_eq!(r.list_keys(), vec!["other/b"]);
        assert_eq!(r.last_store_sync_resource_version(), "7");
        assert!(r.index_keys("byUser", "ernie").unwrap().is_empty());
        assert_eq!(r.index_keys("byUser", "bert").unwrap(), vec!["other/b"]);
        assert_eq!(
            r.list_index_func_values(NAMESPACE_INDEX).unwrap(),
            vec!["other"]
        );
    }

    // kubeloop's own: writers and index readers at once
    #[test]
    fn concurrent_writers_keep_indices_consistent() {
        let s = store_with_users();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let r = s.reader();
                    for i in 0..500 {
                        let key = format!("ns{t}/p{}", i % 50);
                        let user = if i % 2 == 0 { "even" } else { "odd" };
                        s.update(
                            key.clone(),
                            pod(&format!("ns{t}"), &format!("p{}", i % 50), &[user]),
                        );
                        if i % 7 == 0 {
                            s.delete(&key);
                        }
                        let _ = r.by_index("byUser", "even").unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Every index entry points at a stored object whose function gives that value, and
        // every stored object is indexed.
        let r = s.reader();
        let mut indexed = 0;
        for value in r.list_index_func_values("byUser").unwrap() {
            for key in r.index_keys("byUser", &value).unwrap() {
                let obj = r.get_by_key(&key).expect("indexed key is stored");
                assert!(users_index()(&obj).contains(&value));
                indexed += 1;
            }
        }
        assert_eq!(indexed, r.len());
    }

    // client-go: TestCache / testStoreKeyFunc basics (store_test.go)
    #[test]
    fn add_get_update_delete_list() {
        let s = store_with_users();
        let r = s.reader();
        s.add("ns/a".into(), pod("ns", "a", &[]));
        s.add("ns/b".into(), pod("ns", "b", &[]));
        assert_eq!(r.len(), 2);
        let a = r.get_by_key("ns/a").unwrap();
        // Handed out objects are the stored Arc, not a copy.
        assert!(Arc::ptr_eq(&a, &s.get("ns/a").unwrap()));
        s.update("ns/a".into(), pod("ns", "a", &["x"]));
        assert!(!Arc::ptr_eq(&a, &r.get_by_key("ns/a").unwrap()));
        assert!(s.delete("ns/a").is_some());
        assert!(s.delete("ns/a").is_none());
        assert_eq!(names(r.list()), vec!["b"]);
    }
}
