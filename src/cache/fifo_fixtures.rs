//! Test fixtures both FIFOs' tests share (`delta_fifo/tests.rs`, `real_fifo/tests.rs`):
//! client-go's `mkFifoObj` objects, deltas flattened for comparison, and the known-objects
//! store (client-go's `literalListerGetter`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;

use super::delta::{Delta, DeltaType};
use super::thread_safe_store::ThreadSafeStore;

/// client-go's `mkFifoObj(name, val)`.
pub(crate) fn obj(name: &str, val: i32) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([("val".to_string(), val.to_string())].into()),
        ..Default::default()
    }
}

/// The `val` an [`obj`] was made with.
pub(crate) fn val(o: &ConfigMap) -> i32 {
    o.data.as_ref().unwrap()["val"].parse().unwrap()
}

/// A delta as (type, name, val, is_tombstone), easy to compare.
pub(crate) type Flat = (DeltaType, String, i32, bool);

/// One delta, flattened.
pub(crate) fn flat(d: &Delta<ConfigMap>) -> Flat {
    let o = d.object();
    (
        d.delta_type(),
        o.metadata.name.clone().unwrap(),
        val(o),
        d.is_tombstone(),
    )
}

/// The flat form of a delta that is not a tombstone.
pub(crate) fn f(t: DeltaType, name: &str, v: i32) -> Flat {
    (t, name.to_string(), v, false)
}

/// The flat form of a tombstone's deletion.
pub(crate) fn tomb(name: &str, v: i32) -> Flat {
    (DeltaType::Deleted, name.to_string(), v, true)
}

/// client-go's `literalListerGetter`: a store holding `objs`, for a FIFO's known objects.
pub(crate) fn known_store(objs: &[ConfigMap]) -> ThreadSafeStore<ConfigMap> {
    let store = ThreadSafeStore::new(Default::default());
    for o in objs {
        store.add(o.metadata.name.clone().unwrap(), Arc::new(o.clone()));
    }
    store
}
