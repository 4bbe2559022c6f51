//! The key a reconcile gets: an object's `namespace/name`, typed, parsed once, cheap to clone
//! and hash. Also the stable hash that assigns a key to a shard.
//!
//! Counterparts: controller-runtime's `reconcile.Request` (a `types.NamespacedName`),
//! kube-runtime's `ObjectRef`. client-go's sample-controller queues the `namespace/name`
//! string itself and splits it again in every `syncHandler` (`cache.SplitMetaNamespaceKey`);
//! here the runtime builds the key once, from the object, and a reconcile reads
//! [`ObjectKey::namespace`] and [`ObjectKey::name`].
//!
//! An [`ObjectKey`] is one shared allocation holding the same text as client-go's key
//! (`namespace/name`, or `name` for a cluster-scoped object), so a clone is a reference count
//! and its hash is the hash of that text, as cheap to hand around as a Go string.
//! The text is what logs, `kubeloop trace` and [`shard_of`] see.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Once};

use kube_client::Resource;

use crate::cache::{KeyError, meta_namespace_key, split_meta_namespace_key};

/// An object's `namespace/name` (or `name` when cluster-scoped), as the runtime queues it.
///
/// Invariant: the text is a valid client-go key: at most one `/`, with a non-empty name
/// after it (the constructors check it).
///
/// # Examples
/// ```
/// use kubeloop::runtime::ObjectKey;
///
/// let key = ObjectKey::new("default", "web");
/// assert_eq!(key.namespace(), Some("default"));
/// assert_eq!(key.name(), "web");
/// assert_eq!(key.to_string(), "default/web");
/// assert_eq!(ObjectKey::parse("default/web").unwrap(), key);
/// assert_eq!(ObjectKey::parse("node-1").unwrap().namespace(), None);
/// assert!(ObjectKey::parse("a/b/c").is_err());
/// ```
#[derive(Clone, Eq, PartialOrd, Ord)]
pub struct ObjectKey(Arc<str>);

/// Equal texts; copies of one key (what a queue hands out and gets back in `done`) are equal
/// without comparing their bytes. std's `Arc` takes that shortcut only for sized types, not
/// for `Arc<str>`; Go's string compare takes it too.
impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

/// The text's hash, as a `str`'s (`Borrow<str>` lookups rely on it).
impl Hash for ObjectKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl ObjectKey {
    /// Every key is made here: the first one tells the trace how to read keys, so the
    /// workqueue records the steps of followed `ObjectKey`s as it does for string keys.
    fn from_text(text: Arc<str>) -> Self {
        static TRACEABLE: Once = Once::new();
        TRACEABLE.call_once(|| {
            crate::trace::key_type(|any| any.downcast_ref::<ObjectKey>().map(ObjectKey::as_str))
        });
        ObjectKey(text)
    }

    /// The key of `name` in `namespace` (`""`: a cluster-scoped object).
    ///
    /// # Panics
    /// If `name` is empty or either part holds a `/` (no Kubernetes object has such a name);
    /// use [`ObjectKey::parse`] for text from outside.
    pub fn new(namespace: &str, name: &str) -> Self {
        assert!(
            !name.is_empty() && !name.contains('/') && !namespace.contains('/'),
            "not an object's namespace and name: {namespace:?} {name:?}"
        );
        if namespace.is_empty() {
            Self::from_text(Arc::from(name))
        } else {
            Self::from_text(Arc::from(format!("{namespace}/{name}")))
        }
    }

    /// Parses a client-go key (`namespace/name` or `name`). client-go:
    /// `cache.SplitMetaNamespaceKey`, plus a refusal of an empty name or namespace (`ns/`,
    /// `/name`), which no object's key has.
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        let (namespace, name) = split_meta_namespace_key(key)?;
        if name.is_empty() || (namespace.is_empty() && key.contains('/')) {
            return Err(KeyError::UnexpectedKeyFormat {
                key: key.to_string(),
            });
        }
        Ok(Self::from_text(Arc::from(key)))
    }

    /// The key of `obj`. client-go: `cache.MetaNamespaceKeyFunc`.
    pub fn of<K: Resource>(obj: &K) -> Result<Self, KeyError> {
        meta_namespace_key(obj).map(|key| Self::from_text(Arc::from(key)))
    }

    /// The namespace; `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        self.slash().map(|at| &self.0[..at])
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.slash().map_or(&self.0, |at| &self.0[at + 1..])
    }

    /// Where the `/` is. A plain byte scan: keys are short, and a fair queue asks for the
    /// namespace under its lock at every add (`split_once`'s searcher cost 3% there).
    fn slash(&self) -> Option<usize> {
        self.0.bytes().position(|b| b == b'/')
    }

    /// The client-go key text: `namespace/name`, or `name`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A key's hash is its text's, so maps keyed by [`ObjectKey`] can be looked up by `&str`.
impl Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ObjectKey {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ObjectKey {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// The shard of `key`: FNV-1a (64 bit) of the key's text, modulo `shards`. Stable across
/// processes, platforms and versions (std's `DefaultHasher` promises none of that).
pub fn shard_of(key: &str, shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    (fnv1a(key.as_bytes()) % u64::from(shards)) as u32
}

/// FNV-1a, 64 bit.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube_client::core::ObjectMeta;

    use super::*;

    #[test]
    fn a_key_reads_as_client_go_s_key_and_splits_into_its_parts() {
        let key = ObjectKey::new("ns", "web");
        assert_eq!(key.as_str(), "ns/web");
        assert_eq!(format!("{key} {key:?}"), "ns/web \"ns/web\"");
        assert_eq!((key.namespace(), key.name()), (Some("ns"), "web"));
        let cluster = ObjectKey::new("", "node-1");
        assert_eq!((cluster.as_str(), cluster.namespace()), ("node-1", None));
        assert_eq!(cluster.name(), "node-1");
    }

    #[test]
    fn parsing_accepts_what_client_go_accepts_and_refuses_the_rest() {
        assert_eq!(
            ObjectKey::parse("ns/web").unwrap(),
            ObjectKey::new("ns", "web")
        );
        assert_eq!(ObjectKey::parse("web").unwrap(), ObjectKey::new("", "web"));
        for bad in ["a/b/c", "ns/", "/web", ""] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_key_of_an_object_is_its_cache_key() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("web".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ObjectKey::of(&cm).unwrap(), "ns/web");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ObjectKey::of(&ns).unwrap(), "ns");
        assert!(ObjectKey::of(&ConfigMap::default()).is_err());
    }

    #[test]
    fn a_set_of_keys_is_looked_up_by_text_and_clones_share_one_allocation() {
        let key = ObjectKey::new("ns", "web");
        let copy = key.clone();
        assert!(std::ptr::eq(key.as_str(), copy.as_str()));
        let set: HashSet<ObjectKey> = [key].into();
        assert!(set.contains("ns/web"));
        assert!(!set.contains("ns/other"));
    }

    #[test]
    fn the_workqueue_traces_a_followed_object_key_as_it_traces_a_string_key() {
        // Follow adds to the process-wide followed set; this key is this test's own.
        crate::trace::follow(["key-test/traced"]).unwrap();
        let queue = crate::workqueue::Queue::new();
        queue.add(ObjectKey::new("key-test", "traced"));
        let steps = crate::trace::timeline("key-test/traced").expect("followed");
        assert!(
            steps
                .iter()
                .any(|s| s.stage == crate::trace::Stage::QueueAdded),
            "{steps:?}"
        );
    }

    #[test]
    #[should_panic(expected = "not an object's namespace and name")]
    fn new_refuses_a_name_with_a_slash() {
        ObjectKey::new("ns", "a/b");
    }

    #[test]
    fn shard_of_is_stable_and_spreads_keys() {
        // Fixed values: the hash must never change between versions, or replicas of two
        // versions would disagree about which keys a shard holds.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shard_of("anything", 1), 0);
        let mut per_shard = [0usize; 8];
        for i in 0..8000 {
            per_shard[shard_of(&format!("default/vm-{i}"), 8) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (800..1200).contains(n)),
            "{per_shard:?}"
        );
    }
}
