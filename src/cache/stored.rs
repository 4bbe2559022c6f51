//! How a cache holds one object, and a list on its way from the reflector to the cache: the
//! seam between the informer's machinery and the store's representation. No client-go
//! counterpart (client-go's informers keep decoded Go objects only).
//!
//! A store holds each object as a [`Stored`]: the decoded object (a typed store, client-go's)
//! or an encoded frame (a compact store). The machinery moves `Stored` values and lists of
//! them ([`ListedObjects`], built by [`ListBuilder`] as a list arrives) without knowing how a
//! frame is made: that is an [`ObjectCodec`]'s business, and the one codec, the compact
//! store's zstd frames (`compact.rs`, feature `compact-store`), is named only where a store is
//! created (`thread_safe_store.rs`). A second representation would be a second codec.
//!
//! Invariant: a `Stored::Encoded` frame is only ever decoded by the codec that made it (the
//! store's own, passed along with the frames in [`ListedObjects`] and handler notifications).

use std::collections::HashMap;
use std::sync::Arc;

use kube_client::Resource;

use super::index::{Index, Indexers, index_object};
use super::keys::{KeyFunc, meta_namespace_key};

/// How an informer's store holds its objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// Decoded objects, handed out as the same `Arc<K>` every time (client-go's store).
    #[default]
    Typed,
    /// Each object as a zstd frame, decoded into a new `Arc<K>` on every read (see
    /// `compact.rs` for what that costs and saves). Needs the `compact-store` feature.
    #[cfg(feature = "compact-store")]
    Compact,
}

/// An encoded object.
pub(crate) type Encoded = Arc<[u8]>;

/// What an encoding or decoding failed on (the codec's own error, boxed).
pub(crate) type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// The bytes the apiserver sent for an object, where the wire hands them out (a protobuf
/// LIST's items, a protobuf streaming list's initial events): its `apiVersion`, `kind` and
/// protobuf message. A store that holds
/// frames may keep these instead of encoding the decoded object again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentBytes {
    /// The object's `apiVersion`, as its envelope names it.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// Its protobuf message, without the envelope.
    pub message: Vec<u8>,
}

/// An object of a list as it arrived: decoded (and transformed), with the bytes it was sent
/// as when the wire kept them and no transform changed it.
pub(crate) struct Arrived<K> {
    pub(crate) object: Arc<K>,
    /// Boxed: a typed store's lists, which never have them, stay two words an object.
    pub(crate) sent: Option<Box<SentBytes>>,
}

/// Encodes and decodes one type's objects for a store that holds frames.
pub(crate) trait ObjectCodec<K>: Send + Sync {
    /// Whether objects may be encoded now, given the ones of a list still waiting decoded: a
    /// codec that learns from the first objects it sees (a compression dictionary) learns
    /// from these when they are enough, and says yes once it has, or will never.
    fn ready(&self, waiting: &[Arrived<K>]) -> bool;

    /// Learns from `objects` if it still can and they are enough (the end of a list whose
    /// objects waited for [`ready`](Self::ready)); after this call, objects are encoded.
    fn learn(&self, objects: &[Arrived<K>]);

    /// The object as a frame: from `sent`, the bytes it arrived as, when given (they decode to
    /// `obj`); else from `obj`.
    fn encode(&self, obj: &K, sent: Option<&SentBytes>) -> Result<Encoded, CodecError>;

    /// The object a frame holds.
    fn decode(&self, frame: &[u8]) -> Result<K, CodecError>;
}

/// A store's codec.
pub(crate) type Codec<K> = dyn ObjectCodec<K>;

/// A completed list on its way from the reflector to the cache, in list order: decoded
/// objects, or, for a store that holds frames, each object's key and frame, encoded as the
/// list arrived so that a 100,000-object list is never held decoded all at once.
pub struct ListedObjects<K> {
    repr: Listed<K>,
}

pub(crate) enum Listed<K> {
    Decoded(Vec<Arc<K>>),
    Keyed(Vec<(String, Stored<K>)>, Arc<Codec<K>>, ListIndices),
}

/// What a store that holds frames hands the queue in front of it, so the reflector can
/// encode a list as it arrives ([`ReflectorStore::list_codec`](super::ReflectorStore::list_codec)),
/// and index it then, from the decoded objects, so the store need not decode every frame
/// again to index it.
pub struct ListCodec<K> {
    pub(crate) codec: Arc<Codec<K>>,
    /// The store's indexers as they are now.
    pub(crate) indexers: Arc<dyn Fn() -> Indexers<K> + Send + Sync>,
}

/// The indexes of an encoded list's objects, built as it arrived, and the names of the
/// indexers they were built with: a store whose indexers changed meanwhile builds its own.
#[derive(Clone, Default)]
pub(crate) struct ListIndices {
    names: Vec<String>,
    indices: HashMap<String, Index>,
}

impl ListIndices {
    fn new<K>(indexers: &Indexers<K>) -> Self {
        let mut names: Vec<String> = indexers.keys().cloned().collect();
        names.sort();
        // Every index is there, if empty, as in a store (a query names one that must be).
        let indices = names.iter().map(|n| (n.clone(), Index::new())).collect();
        Self { names, indices }
    }

    /// The indexes, if they were built with `indexers`.
    pub(crate) fn built_with<K>(self, indexers: &Indexers<K>) -> Option<HashMap<String, Index>> {
        let same = self.names.len() == indexers.len()
            && self.names.iter().all(|n| indexers.contains_key(n));
        same.then_some(self.indices)
    }

    /// Takes `key` out of every index.
    fn remove(&mut self, key: &str) {
        for index in self.indices.values_mut() {
            index.retain(|_, keys| {
                keys.remove(key);
                !keys.is_empty()
            });
        }
    }
}

/// One object as a cache holds it.
pub(crate) enum Stored<K> {
    /// The decoded object (a typed store's; or one a codec could not encode).
    Object(Arc<K>),
    /// Its frame.
    Encoded(Encoded),
}

/// Builds a [`ListedObjects`] one object at a time: decoded without a codec; with one,
/// objects wait decoded until the codec is [`ready`](ObjectCodec::ready), and every object
/// after that is keyed, indexed and encoded as it comes.
pub(crate) struct ListBuilder<K> {
    codec: Option<Arc<Codec<K>>>,
    type_name: String,
    /// Objects waiting for the codec to be ready (all of them, without a codec).
    decoded: Vec<Arrived<K>>,
    indexers: Indexers<K>,
    indices: ListIndices,
    keyed: Vec<(String, Stored<K>)>,
}

impl<K> ListedObjects<K> {
    /// Number of objects.
    pub fn len(&self) -> usize {
        match &self.repr {
            Listed::Decoded(objects) => objects.len(),
            Listed::Keyed(items, ..) => items.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects, decoded, in list order.
    pub fn into_decoded(self) -> Vec<Arc<K>> {
        match self.repr {
            Listed::Decoded(objects) => objects,
            Listed::Keyed(items, codec, _) => items
                .iter()
                .filter_map(|(key, stored)| stored.load(Some(&*codec), key))
                .collect(),
        }
    }

    /// Each object's key, in list order (objects without one left out).
    pub(crate) fn keys(&self, key_func: &KeyFunc<K>) -> Vec<String> {
        match &self.repr {
            Listed::Decoded(objects) => objects.iter().filter_map(|o| key_func(o).ok()).collect(),
            Listed::Keyed(items, ..) => items.iter().map(|(k, _)| k.clone()).collect(),
        }
    }

    pub(crate) fn into_repr(self) -> Listed<K> {
        self.repr
    }
}

impl<K> From<Vec<Arc<K>>> for ListedObjects<K> {
    fn from(objects: Vec<Arc<K>>) -> Self {
        Self {
            repr: Listed::Decoded(objects),
        }
    }
}

impl<K> Clone for ListedObjects<K> {
    fn clone(&self) -> Self {
        let repr = match &self.repr {
            Listed::Decoded(objects) => Listed::Decoded(objects.clone()),
            Listed::Keyed(items, codec, indices) => {
                Listed::Keyed(items.clone(), codec.clone(), indices.clone())
            }
        };
        Self { repr }
    }
}

impl<K> std::fmt::Debug for ListedObjects<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.repr {
            Listed::Decoded(_) => "decoded",
            Listed::Keyed(..) => "encoded",
        };
        write!(f, "ListedObjects({} {kind})", self.len())
    }
}

impl<K> Clone for ListCodec<K> {
    fn clone(&self) -> Self {
        Self {
            codec: self.codec.clone(),
            indexers: self.indexers.clone(),
        }
    }
}

impl<K> Clone for Stored<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Object(o) => Self::Object(o.clone()),
            Self::Encoded(e) => Self::Encoded(e.clone()),
        }
    }
}

impl<K> Stored<K> {
    /// How `obj` is stored: with a codec its frame, else the object itself. An object that
    /// will not encode is logged with its key and kept decoded, so nothing is lost.
    pub(crate) fn new(codec: Option<&Codec<K>>, key: &str, obj: Arc<K>) -> Self {
        Self::arrived(
            codec,
            key,
            Arrived {
                object: obj,
                sent: None,
            },
        )
    }

    /// [`new`](Self::new) for an object that may come with the bytes it was sent as.
    pub(crate) fn arrived(codec: Option<&Codec<K>>, key: &str, arrived: Arrived<K>) -> Self {
        let Arrived { object: obj, sent } = arrived;
        let Some(codec) = codec else {
            return Self::Object(obj);
        };
        match codec.encode(&obj, sent.as_deref()) {
            Ok(frame) => Self::Encoded(frame),
            Err(e) => {
                tracing::warn!(%key, "compact store: cannot encode the object, keeping it decoded: {e}");
                Self::Object(obj)
            }
        }
    }

    /// A frame's length (0 for a decoded object).
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            Self::Object(_) => 0,
            Self::Encoded(frame) => frame.len(),
        }
    }

    /// The object. A frame that does not decode (a bug: the store wrote it) is logged with
    /// its key and gives `None`.
    pub(crate) fn load(&self, codec: Option<&Codec<K>>, key: &str) -> Option<Arc<K>> {
        match (self, codec) {
            (Self::Object(obj), _) => Some(obj.clone()),
            (Self::Encoded(frame), Some(codec)) => match codec.decode(frame) {
                Ok(obj) => Some(Arc::new(obj)),
                Err(e) => {
                    tracing::error!(%key, "compact store: cannot decode the cached object: {e}");
                    None
                }
            },
            (Self::Encoded(_), None) => unreachable!("only a store with a codec holds frames"),
        }
    }
}

impl<K: Resource> ListBuilder<K> {
    pub(crate) fn new(codec: Option<ListCodec<K>>, type_name: &str) -> Self {
        let indexers = codec.as_ref().map(|c| (c.indexers)()).unwrap_or_default();
        Self {
            codec: codec.map(|c| c.codec),
            type_name: type_name.to_string(),
            decoded: Vec::new(),
            indices: ListIndices::new(&indexers),
            indexers,
            keyed: Vec::new(),
        }
    }

    /// Adds the next listed object (already transformed).
    pub(crate) fn push(&mut self, obj: K) {
        self.push_sent(obj, None);
    }

    /// Adds the next listed object with the bytes it was sent as, when they are its own (no
    /// transform changed it).
    pub(crate) fn push_sent(&mut self, obj: K, sent: Option<Box<SentBytes>>) {
        let sent = sent.filter(|_| self.codec.is_some());
        self.decoded.push(Arrived {
            object: Arc::new(obj),
            sent,
        });
        if let Some(codec) = &self.codec
            && codec.ready(&self.decoded)
        {
            self.encode_decoded();
        }
    }

    /// Adds a page of listed objects, with the bytes each was sent as (in order), or none.
    pub(crate) fn extend_sent(&mut self, objects: Vec<K>, sent: Vec<SentBytes>) {
        if sent.len() == objects.len() {
            for (obj, sent) in objects.into_iter().zip(sent) {
                self.push_sent(obj, Some(Box::new(sent)));
            }
        } else {
            for obj in objects {
                self.push(obj);
            }
        }
    }

    /// Drops the object at `key` (a streaming list's deletion before its end).
    pub(crate) fn remove(&mut self, key: &str) {
        self.decoded
            .retain(|o| meta_namespace_key(&*o.object).is_ok_and(|k| k != key));
        let listed = self.keyed.len();
        self.keyed.retain(|(k, _)| k != key);
        if self.keyed.len() < listed {
            self.indices.remove(key);
        }
    }

    pub(crate) fn finish(mut self) -> ListedObjects<K> {
        let repr = match self.codec.clone() {
            None => Listed::Decoded(self.decoded.into_iter().map(|a| a.object).collect()),
            Some(codec) => {
                codec.learn(&self.decoded);
                self.encode_decoded();
                self.keyed.shrink_to_fit();
                Listed::Keyed(self.keyed, codec, self.indices)
            }
        };
        ListedObjects { repr }
    }

    /// Keys, indexes and encodes the waiting objects. An object without a key is left out,
    /// as the typed path leaves it out of the store.
    fn encode_decoded(&mut self) {
        let Some(codec) = &self.codec else { return };
        for arrived in self.decoded.drain(..) {
            match meta_namespace_key(&*arrived.object) {
                Ok(key) => {
                    let indices = &mut self.indices.indices;
                    index_object(indices, &self.indexers, &key, &*arrived.object);
                    let stored = Stored::arrived(Some(&**codec), &key, arrived);
                    self.keyed.push((key, stored));
                }
                Err(e) => {
                    tracing::warn!(type_name = %self.type_name, "cannot store a listed object: {e}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::cache::index::{IndexFunc, NAMESPACE_INDEX, namespace_indexers};
    use crate::cache::thread_safe_store::ThreadSafeStore;

    /// Frames of JSON, counting how many are decoded.
    #[derive(Default)]
    struct CountingCodec {
        decoded: AtomicUsize,
    }

    impl ObjectCodec<ConfigMap> for CountingCodec {
        fn ready(&self, _: &[Arrived<ConfigMap>]) -> bool {
            true
        }
        fn learn(&self, _: &[Arrived<ConfigMap>]) {}
        fn encode(&self, obj: &ConfigMap, _: Option<&SentBytes>) -> Result<Encoded, CodecError> {
            Ok(serde_json::to_vec(obj)?.into())
        }
        fn decode(&self, frame: &[u8]) -> Result<ConfigMap, CodecError> {
            self.decoded.fetch_add(1, SeqCst);
            Ok(serde_json::from_slice(frame)?)
        }
    }

    /// A store of frames with the namespace index and one that no object is under, and its
    /// codec.
    fn store() -> (ThreadSafeStore<ConfigMap>, Arc<CountingCodec>) {
        let codec = Arc::new(CountingCodec::default());
        let mut indexers = namespace_indexers();
        indexers.insert("unused".into(), Arc::new(|_: &ConfigMap| Vec::new()));
        let store = ThreadSafeStore::with_codec(indexers, Some(codec.clone()));
        (store, codec)
    }

    /// `a/1`, `a/2` and `b/1` listed, and `b/gone` listed and deleted before the list ends.
    fn list(store: &ThreadSafeStore<ConfigMap>) -> (Vec<(String, Stored<ConfigMap>)>, ListIndices) {
        let mut builder = ListBuilder::new(store.list_codec(), "ConfigMap");
        for (ns, name) in [("a", "1"), ("b", "gone"), ("a", "2"), ("b", "1")] {
            builder.push(ConfigMap {
                metadata: ObjectMeta {
                    namespace: Some(ns.into()),
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            });
        }
        builder.remove("b/gone");
        let Listed::Keyed(items, _, indices) = builder.finish().into_repr() else {
            panic!("a store with a codec gets its list keyed");
        };
        (items, indices)
    }

    fn keys(store: &ThreadSafeStore<ConfigMap>, index: &str, value: &str) -> Vec<String> {
        let mut keys = store.reader().index_keys(index, value).unwrap();
        keys.sort();
        keys
    }

    #[test]
    fn a_list_is_indexed_as_it_arrives_and_not_decoded_again_to_be_stored() {
        let (store, codec) = store();
        let (items, indices) = list(&store);
        store.replace_entries(items, Some(indices), Vec::new(), "7");
        assert_eq!(
            codec.decoded.load(SeqCst),
            0,
            "frames decoded to index them"
        );
        assert_eq!(keys(&store, NAMESPACE_INDEX, "a"), ["a/1", "a/2"]);
        assert_eq!(keys(&store, NAMESPACE_INDEX, "b"), ["b/1"]);
        assert!(keys(&store, "unused", "x").is_empty());
        assert_eq!(store.list_keys().len(), 3);
    }

    #[test]
    fn a_list_indexed_before_the_store_gained_an_indexer_is_indexed_again() {
        let (store, codec) = store();
        let (items, indices) = list(&store);
        let by_name: IndexFunc<ConfigMap> =
            Arc::new(|cm: &ConfigMap| cm.metadata.name.clone().into_iter().collect());
        store
            .add_indexers([("name".to_string(), by_name)].into())
            .unwrap();
        store.replace_entries(items, Some(indices), Vec::new(), "7");
        assert_eq!(
            codec.decoded.load(SeqCst),
            3,
            "each frame decoded once to index it"
        );
        assert_eq!(keys(&store, "name", "1"), ["a/1", "b/1"]);
        assert_eq!(keys(&store, NAMESPACE_INDEX, "a"), ["a/1", "a/2"]);
        assert_eq!(keys(&store, NAMESPACE_INDEX, "b"), ["b/1"]);
    }
}
