//! Generic listers: client-go `tools/cache/listers.go` (`GenericLister`,
//! `GenericNamespaceLister`, `ListAll`, `ListAllByNamespace`).
//!
//! Listers read the informer's [`Indexer`]; objects come back as shared `Arc<K>`. The
//! namespaced lister uses the built-in namespace index when it is present and falls back to
//! a full scan otherwise (as client-go does).

use std::sync::Arc;

use kube_client::Resource;

use super::index::NAMESPACE_INDEX;
use super::keys::object_key;
use super::labels::LabelSelector;
use super::thread_safe_store::Indexer;

/// Lists and gets objects of one type from a cache.
pub struct Lister<K> {
    indexer: Indexer<K>,
}

/// A [`Lister`] narrowed to one namespace.
pub struct NamespaceLister<K> {
    indexer: Indexer<K>,
    namespace: String,
}

impl<K> Clone for Lister<K> {
    fn clone(&self) -> Self {
        Self {
            indexer: self.indexer.clone(),
        }
    }
}

impl<K: Resource> Lister<K> {
    /// A lister over `indexer`.
    pub fn new(indexer: Indexer<K>) -> Self {
        Self { indexer }
    }

    /// Every object the selector matches (client-go `ListAll`).
    pub fn list(&self, selector: &LabelSelector) -> Vec<Arc<K>> {
        filter(self.indexer.list(), selector)
    }

    /// The object `namespace/name` (`namespace` "" for cluster-scoped objects).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.indexer.get_by_key(&object_key(namespace, name))
    }

    /// A lister for one namespace (client-go `ByNamespace`).
    pub fn namespaced(&self, namespace: &str) -> NamespaceLister<K> {
        NamespaceLister {
            indexer: self.indexer.clone(),
            namespace: namespace.to_string(),
        }
    }
}

impl<K: Resource> NamespaceLister<K> {
    /// Every object in the namespace the selector matches (client-go
    /// `ListAllByNamespace`).
    pub fn list(&self, selector: &LabelSelector) -> Vec<Arc<K>> {
        match self.indexer.by_index(NAMESPACE_INDEX, &self.namespace) {
            Ok(items) => filter(items, selector),
            // No namespace index: scan everything.
            Err(_) => filter(self.indexer.list(), selector)
                .into_iter()
                .filter(|o| o.meta().namespace.as_deref().unwrap_or("") == self.namespace)
                .collect(),
        }
    }

    /// The object `name` in this namespace.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.indexer.get_by_key(&object_key(&self.namespace, name))
    }
}

fn filter<K: Resource>(items: Vec<Arc<K>>, selector: &LabelSelector) -> Vec<Arc<K>> {
    if selector.is_empty() {
        return items;
    }
    items
        .into_iter()
        .filter(|o| selector.matches(o.meta().labels.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::index::namespace_indexers;
    use super::super::thread_safe_store::ThreadSafeStore;
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn cm(ns: &str, name: &str, labels: &[(&str, &str)]) -> Arc<ConfigMap> {
        let l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(l),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn names(v: Vec<Arc<ConfigMap>>) -> Vec<String> {
        let mut n: Vec<String> = v.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        n.sort();
        n
    }

    fn fixture(indexers: bool) -> Lister<ConfigMap> {
        let s = ThreadSafeStore::new(if indexers {
            namespace_indexers::<ConfigMap>()
        } else {
            Default::default()
        });
        for (ns, name, app) in [
            ("a", "one", "web"),
            ("a", "two", "db"),
            ("b", "three", "web"),
        ] {
            s.add(format!("{ns}/{name}"), cm(ns, name, &[("app", app)]));
        }
        Lister::new(s.reader())
    }

    // client-go: TestListAll (listers_test.go), and kubeloop's own by-namespace cases
    #[test]
    fn list_all_and_by_namespace_with_selectors() {
        for indexed in [true, false] {
            let l = fixture(indexed);
            let web = LabelSelector::parse("app=web").unwrap();
            assert_eq!(
                names(l.list(&LabelSelector::everything())),
                ["one", "three", "two"]
            );
            assert_eq!(names(l.list(&web)), ["one", "three"]);
            assert_eq!(
                names(l.namespaced("a").list(&LabelSelector::everything())),
                ["one", "two"]
            );
            assert_eq!(names(l.namespaced("a").list(&web)), ["one"]);
            assert!(
                l.namespaced("c")
                    .list(&LabelSelector::everything())
                    .is_empty()
            );
        }
    }

    // kubeloop's own: get by namespace and name
    #[test]
    fn get_by_namespace_and_name() {
        let l = fixture(true);
        assert_eq!(
            l.get("a", "two").unwrap().metadata.name.as_deref(),
            Some("two")
        );
        assert!(l.get("b", "two").is_none());
        assert_eq!(
            l.namespaced("b")
                .get("three")
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("three")
        );
        assert!(l.namespaced("b").get("one").is_none());
    }
}
