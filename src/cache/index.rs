//! Index functions and the index map: client-go `tools/cache/index.go`.
//!
//! An index function maps an object to the values it is indexed under; an [`Indexers`] map
//! names them. The derived index (`indices` in client-go) lives inside the
//! [`ThreadSafeStore`](super::ThreadSafeStore), which keeps it consistent under its lock.
//!
//! Differs on purpose: index functions cannot fail. client-go's may return an error and then
//! panic inside the store; a function that has nothing to say returns an empty `Vec`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube_client::Resource;

/// The name of the namespace index every informer's indexer has (client-go:
/// `NamespaceIndex`).
pub const NAMESPACE_INDEX: &str = "namespace";

/// Maps an object to the index values it is stored under.
pub type IndexFunc<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// Index name -> index function.
pub type Indexers<K> = HashMap<String, IndexFunc<K>>;

/// client-go: `MetaNamespaceIndexFunc`: the object's namespace ("" for cluster-scoped).
pub fn namespace_index_func<K: Resource>() -> IndexFunc<K> {
    Arc::new(|obj: &K| vec![obj.meta().namespace.clone().unwrap_or_default()])
}

/// Indexers holding only the namespace index.
pub fn namespace_indexers<K: Resource + 'static>() -> Indexers<K> {
    let mut m = Indexers::new();
    m.insert(NAMESPACE_INDEX.to_string(), namespace_index_func::<K>());
    m
}

/// index value -> keys of the objects indexed under it.
pub(crate) type Index = HashMap<String, HashSet<String>>;

/// Adds `key` under every value `indexers` give `obj`.
pub(crate) fn index_object<K>(
    indices: &mut HashMap<String, Index>,
    indexers: &Indexers<K>,
    key: &str,
    obj: &K,
) {
    for (name, func) in indexers {
        let values = func(obj);
        if values.is_empty() {
            continue;
        }
        if !indices.contains_key(name) {
            indices.insert(name.clone(), Index::new());
        }
        let index = indices.get_mut(name).expect("inserted above");
        for v in values {
            index.entry(v).or_default().insert(key.to_string());
        }
    }
}

/// Why an index query or change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The index name is not registered.
    #[error("index with name {name:?} does not exist")]
    UnknownIndex {
        /// The name asked for.
        name: String,
    },
    /// `add_indexers` with a name that is already taken.
    #[error("indexer conflict: an index named {name:?} already exists")]
    Conflict {
        /// The clashing name.
        name: String,
    },
}
