//! The write contract a reflector needs: client-go `tools/cache/store.go` (its key functions
//! are in `keys.rs`).
//!
//! [`ReflectorStore`] is what client-go's reflector calls `Store`: the reflector only ever
//! adds, updates, deletes, replaces and resyncs. Reads go through the read-only
//! [`Indexer`](super::Indexer) handle instead, so there is one writer per cache.
//!
//! The transform an informer applies to every object before it is stored
//! ([`TransformFunc`], client-go `TransformFunc`) lives here too: the list decoder, the
//! reflector and both FIFOs apply it.

use std::sync::Arc;

use super::keys::KeyError;
use super::shard_selector::ShardSelector;
use super::stored::{ListCodec, ListedObjects};

/// What a store refused to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The object had no usable key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The store was closed (a DeltaFIFO after `close`).
    #[error("store is closed")]
    Closed,
}

/// The writes a reflector makes (client-go's `Store` as seen from `reflector.go`).
pub trait ReflectorStore<K>: Send + Sync + 'static {
    /// A watch `ADDED` event.
    fn add(&self, obj: K) -> Result<(), StoreError>;
    /// A watch `MODIFIED` event.
    fn update(&self, obj: K) -> Result<(), StoreError>;
    /// A watch `DELETED` event.
    fn delete(&self, obj: K) -> Result<(), StoreError>;
    /// A completed list at `resource_version`: the store's contents become exactly `list`.
    fn replace(&self, list: Vec<K>, resource_version: &str) -> Result<(), StoreError>;
    /// A periodic resync.
    fn resync(&self) -> Result<(), StoreError>;

    /// A watch bookmark at `resource_version` (client-go `ReflectorBookmarkStore`). A store
    /// that does not care ignores it.
    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        let _ = resource_version;
        Ok(())
    }

    /// The transform this store runs on incoming objects (client-go `TransformingStore`).
    /// The reflector runs it on each listed object as it arrives, so a list never holds
    /// untransformed objects (their managedFields, say) all at once, and hands the result to
    /// [`replace_listed`](Self::replace_listed).
    fn transformer(&self) -> Option<TransformFunc<K>> {
        None
    }

    /// [`replace`](Self::replace) for objects `transformer()` has already run on, each
    /// already in the `Arc` it will be shared through (so no object is moved or copied
    /// again). A store that reports a transformer must override this so it does not run
    /// twice.
    ///
    /// `undecodable` holds the keys of listed objects that were skipped because they do
    /// not decode (see `undecodable.rs`): the store keeps whatever it holds at those keys
    /// (the last version that decoded) instead of treating them as deleted. This default
    /// cannot look into the store, so it drops them like any unlisted key; the FIFOs keep
    /// them.
    ///
    /// A store that reports a [`list_codec`](Self::list_codec) gets the list encoded.
    fn replace_listed(
        &self,
        list: ListedObjects<K>,
        undecodable: Vec<String>,
        resource_version: &str,
    ) -> Result<(), StoreError>
    where
        K: Clone,
    {
        let _ = undecodable;
        let list = list
            .into_decoded()
            .into_iter()
            .map(|o| Arc::try_unwrap(o).unwrap_or_else(|shared| (*shared).clone()))
            .collect();
        self.replace(list, resource_version)
    }

    /// What the reflector should encode a list with as it arrives, so the list is never
    /// held decoded all at once: a compact cache's codec, reported by the atomic queue in
    /// front of it (see `compact.rs`). `None` (the default): lists come decoded.
    fn list_codec(&self) -> Option<ListCodec<K>> {
        None
    }

    /// A watch `DELETED` event whose object did not decode: whatever the store holds at
    /// `key` (the last version that decoded) is deleted, with that version as the final
    /// state. Nothing happens if it holds nothing there. This default does nothing (it
    /// cannot look into the store); the FIFOs implement it.
    fn delete_undecodable(&self, key: &str) -> Result<(), StoreError> {
        let _ = key;
        Ok(())
    }

    /// kubeloop: a shard scope gave shards up (`shard_scope.rs`): every object `selector`
    /// matches leaves the store, each as a deletion whose final state is unknown, as a list
    /// that no longer holds it would make. `Ok(false)`: this store cannot (this default, and
    /// a queue that is not atomic), and the reflector lists the whole selection again.
    fn release(&self, selector: &ShardSelector) -> Result<bool, StoreError> {
        let _ = selector;
        Ok(false)
    }
}

/// Transforms an object before it is queued (e.g. drops managedFields).
pub type TransformFunc<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// A transform that drops `metadata.managedFields`, the server-side-apply bookkeeping most
/// controllers never read and the largest part of a small cached object (about 2.5 KB of a
/// ConfigMap's decoded heap in benches/README.md's profile): controller-runtime's
/// `cache.TransformStripManagedFields`. Use it as
/// `informer.set_transform(strip_managed_fields)`; an object whose managedFields a handler
/// needs must not go through it.
pub fn strip_managed_fields<K: kube_client::Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

/// Gives back the spare room serde's growth leaves in the metadata of an object that is kept
/// decoded (a typed store's object, for its whole life). serde_json grows a `Vec` and a JSON
/// object's map from room for four, so a 1 KiB ConfigMap's one managedFields entry sits in
/// room for four (650 bytes spare) and each fieldsV1 map of one or two fields in room for four
/// (500 bytes spare over its four maps), of the 5.6 KB the object takes decoded (glibc's chunk
/// sizes). It costs about 1.5 us per such object (the maps are rebuilt; a third of decoding
/// it), so only an informer with a typed store runs it, as the last step of its transform
/// ([`kept_decoded`]); the compact store encodes its objects instead. The protobuf decoder
/// builds fieldsV1's maps and the `Vec`s at their length already (protobuf/made.rs), so an
/// informer whose source says so (`ListerWatcher::fields_at_length`) passes `rebuild_fields`
/// false and only the (then free) `Vec` shrinks run.
pub(crate) fn shrink_metadata<K: kube_client::Resource>(obj: &mut K, rebuild_fields: bool) {
    let meta = obj.meta_mut();
    if let Some(v) = &mut meta.managed_fields {
        v.shrink_to_fit();
        if rebuild_fields {
            for fields in v.iter_mut().filter_map(|e| e.fields_v1.as_mut()) {
                shrink_json(&mut fields.0);
            }
        }
    }
    if let Some(v) = &mut meta.owner_references {
        v.shrink_to_fit();
    }
    if let Some(v) = &mut meta.finalizers {
        v.shrink_to_fit();
    }
}

/// `value` with every map and array rebuilt at its length (a map cannot shrink in place).
fn shrink_json(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            *map = std::mem::take(map)
                .into_iter()
                .map(|(k, mut v)| {
                    shrink_json(&mut v);
                    (k, v)
                })
                .collect();
        }
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(shrink_json);
            items.shrink_to_fit();
        }
        _ => {}
    }
}

/// The transform of an informer whose store keeps its objects decoded: `transform`, then
/// [`shrink_metadata`] on what it leaves. The queue runs it on every listed object and watch
/// event, so each object is shrunk once, after a managedFields-dropping transform.
pub(crate) fn kept_decoded<K: kube_client::Resource + 'static>(
    transform: Option<TransformFunc<K>>,
    rebuild_fields: bool,
) -> TransformFunc<K> {
    Arc::new(move |obj| {
        let mut obj = apply_transform(transform.as_ref(), obj);
        shrink_metadata(&mut obj, rebuild_fields);
        obj
    })
}

/// `obj` through `transform`, if there is one.
pub(crate) fn apply_transform<K>(transform: Option<&TransformFunc<K>>, obj: K) -> K {
    match transform {
        Some(t) => t(obj),
        None => obj,
    }
}

/// A listed batch through `transform`, each object shared once (what a FIFO's `replace` queues).
pub(crate) fn transformed_list<K>(
    transform: Option<&TransformFunc<K>>,
    list: Vec<K>,
) -> Vec<Arc<K>> {
    list.into_iter()
        .map(|o| Arc::new(apply_transform(transform, o)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    #[test]
    fn shrunk_metadata_is_at_its_length_and_unchanged() {
        let json = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{
            "name":"a","namespace":"ns","finalizers":["f"],
            "ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"p","uid":"u"}],
            "managedFields":[{"manager":"m","operation":"Update","fieldsType":"FieldsV1",
              "fieldsV1":{"f:data":{".":{},"f:b":{},"f:a":{}},"f:metadata":{"f:labels":{"f:x":{}}}},
              "time":"2026-11-26T07:00:00Z"}]},"data":{"a":"1","b":"2"}}"#;
        let plain: ConfigMap = serde_json::from_slice(json).unwrap();
        // Decoded, not cloned: a clone is at its length already.
        let mut cm: ConfigMap = serde_json::from_slice(json).unwrap();
        // serde's growth, which the shrink gives back:
        assert_eq!(cm.metadata.managed_fields.as_ref().unwrap().capacity(), 4);
        shrink_metadata(&mut cm, true);
        let meta = &cm.metadata;
        assert_eq!(meta.managed_fields.as_ref().unwrap().capacity(), 1);
        assert_eq!(meta.owner_references.as_ref().unwrap().capacity(), 1);
        assert_eq!(meta.finalizers.as_ref().unwrap().capacity(), 1);
        // Rebuilt maps keep their fields in the apiserver's order.
        assert_eq!(cm, plain);
        assert!(
            serde_json::to_string(&meta.managed_fields)
                .unwrap()
                .contains(r#"{".":{},"f:b":{},"f:a":{}}"#)
        );
    }

    // controller-runtime: TransformStripManagedFields (pkg/cache/cache.go)
    #[test]
    fn strip_managed_fields_drops_them_and_nothing_else() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    operation: Some("Apply".into()),
                    ..Default::default()
                }]),
                labels: Some([("k".to_string(), "v".to_string())].into()),
                ..Default::default()
            },
            data: Some([("key".to_string(), "value".to_string())].into()),
            ..Default::default()
        };
        let stripped = strip_managed_fields(cm.clone());
        assert_eq!(stripped.metadata.managed_fields, None);
        cm.metadata.managed_fields = None;
        assert_eq!(stripped, cm, "everything else is kept");
    }
}
