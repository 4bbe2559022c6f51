//! The compact store's encoding: each cached object held as a zstd frame of its JSON, with a
//! dictionary trained on the informer's first list. No client-go counterpart: client-go's
//! informers keep decoded Go objects; Kubernetes' work-in-progress "bytecache" store
//! (kubernetes#141683) and argo-cd's compressed cache (argo-cd#28600) keep bytes, as this does.
//!
//! Why this encoding: a throwaway program (not kept) encoded 10,000 ConfigMaps shaped as the
//! apiserver sends them (1 KiB of random data each, one managedFields entry; 1,516 bytes of
//! JSON) every way below, 2026-11-24, idle machine; bytes per object, then the time per object
//! to encode from the typed object and to decode back to it:
//!
//! | encoding                              | bytes | encode | decode |
//! |---------------------------------------|-------|--------|--------|
//! | JSON (minified, as sent)              | 1,516 | 3.2 us | 1.8 us |
//! | MessagePack (`rmp-serde`, named)      | 1,422 | 2.8 us | 1.3 us |
//! | CBOR (`ciborium`)                     | 1,422 | 2.8 us | 3.4 us |
//! | JSON + lz4 (`lz4_flex`)               | 1,411 | 4.7 us | 1.9 us |
//! | JSON + zstd level 1, no dictionary    | 1,126 |        |        |
//! | JSON + zstd level 1, 4 KiB dictionary |   863 | 7.5 us | 3.3 us |
//!
//! (The no-dictionary row's times came from a fresh zstd context per object, which costs more
//! than the work, so they say nothing; contexts are reused here.) On the bench's real objects
//! (`hack/bench-informer`, 1,485 bytes of JSON each) the frames are 878 bytes, 1.69x smaller;
//! a metadata-only object's 62 bytes. A read through the lister costs about 4.5 us (p99) at
//! 10k objects against client-go's 0.4 us, and a full list of 10k about 65 ms against 0.4 ms:
//! a cache of decoded objects would hold back what the store saves, and a controller that lists
//! everything often should keep the typed store.
//!
//! Random data is the hard case: binary encodings save only the punctuation, and a compressor
//! working on one object at a time finds little to share inside it. A dictionary trained on a
//! hundred of the type's objects holds what they all repeat (the keys, managedFields' field
//! sets, the manager names, the namespace), so each frame carries mostly its own data (the
//! base64 payload, entropy-coded to 6 bits a character). The dictionary is trained once, on
//! the first list with at least [`TRAIN_MIN_OBJECTS`] objects (about 12 ms), and kept for the
//! informer's life; objects encoded before it exists are frames without one, and every frame
//! says which it is (zstd writes the dictionary's id into the frame header).
//!
//! Contexts are per thread (one compression and one decompression context each, reused), so a
//! read allocates only its output; a fresh context per object costs more than the work.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use kube_client::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use zstd::zstd_safe::{self, CCtx, CDict, DCtx, DDict};

use super::store::meta_namespace_key;

/// How an informer's store holds its objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// Decoded objects, handed out as the same `Arc<K>` every time (client-go's store).
    #[default]
    Typed,
    /// Each object as a zstd frame of its JSON, decoded into a new `Arc<K>` on every read
    /// (see `compact.rs` for what that costs and saves).
    Compact,
}

/// The first list with at least this many objects trains the dictionary.
pub const TRAIN_MIN_OBJECTS: usize = 64;
/// How many of that list's objects the dictionary is trained on.
const TRAIN_SAMPLES: usize = 128;
/// The dictionary's size: 4 KiB did as well as 16 KiB in the measurement above.
const DICT_BYTES: usize = 4096;
/// zstd's fastest level: higher levels saved under 0.1% here and cost a third more time.
const LEVEL: i32 = 1;

/// An encoded object.
pub(crate) type Encoded = Arc<[u8]>;

/// A completed list on its way from the reflector to the cache, in list order: decoded
/// objects, or, for a compact store, each object's key and frame, encoded as the list
/// arrived so that a 100,000-object list is never held decoded all at once.
pub struct ListedObjects<K> {
    repr: Listed<K>,
}

pub(crate) enum Listed<K> {
    Decoded(Vec<Arc<K>>),
    Keyed(Vec<(String, Stored<K>)>, Arc<Codec<K>>),
}

/// What a compact store hands the queue in front of it, so the reflector can encode a list
/// as it arrives ([`ReflectorStore::list_codec`](super::ReflectorStore::list_codec)).
pub struct ListCodec<K>(pub(crate) Arc<Codec<K>>);

/// One object as a cache holds it.
pub(crate) enum Stored<K> {
    /// The decoded object (a typed store's; or one a compact store could not encode).
    Object(Arc<K>),
    /// Its frame (a compact store).
    Encoded(Encoded),
}

/// Builds a [`ListedObjects`] one object at a time: decoded without a codec; with one, the
/// first [`TRAIN_SAMPLES`] objects wait decoded until the dictionary is trained on them (if
/// it was not already), and every object after them is encoded as it comes.
pub(crate) struct ListBuilder<K> {
    codec: Option<Arc<Codec<K>>>,
    type_name: String,
    decoded: Vec<Arc<K>>,
    keyed: Vec<(String, Stored<K>)>,
}

/// What an encoding or decoding failed on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    /// The object would not serialize (or deserialize) as JSON.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// zstd refused the frame.
    #[error("zstd: {}", zstd_safe::get_error_name(*.0))]
    Zstd(usize),
    /// The frame was made with a dictionary this store does not have.
    #[error("frame needs dictionary {0}, which this store does not have")]
    UnknownDictionary(u32),
}

/// Encodes and decodes one type's objects.
pub(crate) struct Codec<K> {
    to_json: fn(&K) -> serde_json::Result<Vec<u8>>,
    from_json: fn(&[u8]) -> serde_json::Result<K>,
    /// Set once: `Some` when trained, `None` when training failed (never tried again).
    dictionary: OnceLock<Option<Dictionary>>,
}

struct Dictionary {
    id: u32,
    compress: CDict<'static>,
    decompress: DDict<'static>,
}

thread_local! {
    static CONTEXTS: RefCell<(CCtx<'static>, DCtx<'static>)> =
        RefCell::new((CCtx::create(), DCtx::create()));
}

impl<K: Serialize + DeserializeOwned> Codec<K> {
    pub(crate) fn new() -> Self {
        Self {
            to_json: |k| serde_json::to_vec(k),
            from_json: |b| serde_json::from_slice(b),
            dictionary: OnceLock::new(),
        }
    }
}

impl<K> Codec<K> {
    /// Trains the dictionary on `objects` if there is none yet and they are enough; a
    /// training that fails leaves frames without one (logged).
    pub(crate) fn train<'a>(&self, objects: impl ExactSizeIterator<Item = &'a K>)
    where
        K: 'a,
    {
        if self.dictionary.get().is_some() || objects.len() < TRAIN_MIN_OBJECTS {
            return;
        }
        let samples: Vec<Vec<u8>> = objects
            .take(TRAIN_SAMPLES)
            .filter_map(|o| (self.to_json)(o).ok())
            .collect();
        match zstd::dict::from_samples(&samples, DICT_BYTES) {
            Ok(bytes) => {
                let id = zstd_safe::get_dict_id(&bytes).map_or(0, |id| id.get());
                let _ = self.dictionary.set(Some(Dictionary {
                    id,
                    compress: CDict::create(&bytes, LEVEL),
                    decompress: DDict::create(&bytes),
                }));
            }
            Err(e) => {
                tracing::warn!("compact store: no dictionary trained ({e}); frames go without one");
                let _ = self.dictionary.set(None);
            }
        }
    }

    /// The object as a frame.
    pub(crate) fn encode(&self, obj: &K) -> Result<Encoded, CodecError> {
        let json = (self.to_json)(obj)?;
        let mut out = Vec::with_capacity(zstd_safe::compress_bound(json.len()));
        CONTEXTS
            .with_borrow_mut(|(cctx, _)| match self.trained() {
                Some(d) => cctx.compress_using_cdict(&mut out, &json, &d.compress),
                None => cctx.compress(&mut out, &json, LEVEL),
            })
            .map_err(CodecError::Zstd)?;
        Ok(out.into())
    }

    /// The object a frame holds.
    pub(crate) fn decode(&self, frame: &[u8]) -> Result<K, CodecError> {
        let size = zstd_safe::get_frame_content_size(frame)
            .ok()
            .flatten()
            .unwrap_or(0) as usize;
        let mut json = Vec::with_capacity(size);
        CONTEXTS.with_borrow_mut(|(_, dctx)| match zstd_safe::get_dict_id_from_frame(frame) {
            None => dctx.decompress(&mut json, frame).map_err(CodecError::Zstd),
            Some(id) => match self.trained() {
                Some(d) if d.id == id.get() => dctx
                    .decompress_using_ddict(&mut json, frame, &d.decompress)
                    .map_err(CodecError::Zstd),
                _ => Err(CodecError::UnknownDictionary(id.get())),
            },
        })?;
        Ok((self.from_json)(&json)?)
    }

    /// Whether training is over (trained, or failed for good): objects no longer wait for it.
    pub(crate) fn settled(&self) -> bool {
        self.dictionary.get().is_some()
    }

    fn trained(&self) -> Option<&Dictionary> {
        self.dictionary.get().and_then(Option::as_ref)
    }
}

impl<K> ListedObjects<K> {
    /// Number of objects.
    pub fn len(&self) -> usize {
        match &self.repr {
            Listed::Decoded(objects) => objects.len(),
            Listed::Keyed(items, _) => items.len(),
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
            Listed::Keyed(items, codec) => items
                .iter()
                .filter_map(|(key, stored)| stored.load(Some(&codec), key))
                .collect(),
        }
    }

    /// Each object's key, in list order (objects without one left out).
    pub(crate) fn keys(&self, key_func: &super::store::KeyFunc<K>) -> Vec<String> {
        match &self.repr {
            Listed::Decoded(objects) => objects.iter().filter_map(|o| key_func(o).ok()).collect(),
            Listed::Keyed(items, _) => items.iter().map(|(k, _)| k.clone()).collect(),
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
            Listed::Keyed(items, codec) => Listed::Keyed(items.clone(), codec.clone()),
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
        Self(self.0.clone())
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
        let Some(codec) = codec else {
            return Self::Object(obj);
        };
        match codec.encode(&obj) {
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
            (Self::Encoded(_), None) => unreachable!("only a compact store holds frames"),
        }
    }
}

impl<K: Resource> ListBuilder<K> {
    pub(crate) fn new(codec: Option<ListCodec<K>>, type_name: &str) -> Self {
        Self {
            codec: codec.map(|c| c.0),
            type_name: type_name.to_string(),
            decoded: Vec::new(),
            keyed: Vec::new(),
        }
    }

    /// Adds the next listed object (already transformed).
    pub(crate) fn push(&mut self, obj: K) {
        self.decoded.push(Arc::new(obj));
        if let Some(codec) = &self.codec
            && (codec.settled() || self.decoded.len() >= TRAIN_SAMPLES)
        {
            self.encode_decoded();
        }
    }

    /// Adds a page of listed objects.
    pub(crate) fn extend(&mut self, objects: Vec<K>) {
        for obj in objects {
            self.push(obj);
        }
    }

    /// Drops the object at `key` (a streaming list's deletion before its end).
    pub(crate) fn remove(&mut self, key: &str) {
        self.decoded
            .retain(|o| meta_namespace_key(&**o).is_ok_and(|k| k != key));
        self.keyed.retain(|(k, _)| k != key);
    }

    pub(crate) fn finish(mut self) -> ListedObjects<K> {
        let repr = match self.codec.clone() {
            None => {
                self.decoded.shrink_to_fit();
                Listed::Decoded(self.decoded)
            }
            Some(codec) => {
                self.encode_decoded();
                self.keyed.shrink_to_fit();
                Listed::Keyed(self.keyed, codec)
            }
        };
        ListedObjects { repr }
    }

    /// Trains the dictionary on the waiting objects if it has none yet, then encodes them.
    /// An object without a key is left out, as the typed path leaves it out of the store.
    fn encode_decoded(&mut self) {
        let Some(codec) = &self.codec else { return };
        codec.train(self.decoded.iter().map(|o| &**o));
        for obj in self.decoded.drain(..) {
            match meta_namespace_key(&*obj) {
                Ok(key) => {
                    let stored = Stored::new(Some(codec), &key, obj);
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
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    fn cm(i: usize) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                namespace: Some("ns".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                resource_version: Some(i.to_string()),
                ..Default::default()
            },
            data: Some([("k".to_string(), format!("value {i} {}", i * 7919))].into()),
            ..Default::default()
        }
    }

    // kubeloop's own: frames from before and after the dictionary both decode to the object,
    // and the dictionary makes them smaller.
    #[test]
    fn frames_round_trip_with_and_without_the_dictionary() {
        let codec = Codec::<ConfigMap>::new();
        let before = codec.encode(&cm(1)).unwrap();
        let objects: Vec<ConfigMap> = (0..TRAIN_MIN_OBJECTS * 2).map(cm).collect();
        codec.train(objects.iter().take(TRAIN_MIN_OBJECTS - 1));
        assert!(codec.trained().is_none(), "too few objects to train on");
        codec.train(objects.iter());
        assert!(codec.trained().is_some());
        let after = codec.encode(&cm(1)).unwrap();
        assert!(
            after.len() < before.len(),
            "{} >= {}",
            after.len(),
            before.len()
        );
        assert_eq!(codec.decode(&before).unwrap(), cm(1));
        assert_eq!(codec.decode(&after).unwrap(), cm(1));
    }

    // kubeloop's own: a frame made with another store's dictionary is an error naming it,
    // never a wrong object.
    #[test]
    fn a_frame_from_another_dictionary_is_refused() {
        let objects: Vec<ConfigMap> = (0..TRAIN_MIN_OBJECTS).map(cm).collect();
        let one = Codec::<ConfigMap>::new();
        one.train(objects.iter());
        let other = Codec::<ConfigMap>::new();
        let frame = one.encode(&cm(3)).unwrap();
        let err = other.decode(&frame).unwrap_err();
        assert!(matches!(err, CodecError::UnknownDictionary(_)), "{err}");
    }
}
