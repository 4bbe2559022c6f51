//! Test fixtures both FIFOs' tests share (`delta_fifo/tests.rs`, `real_fifo/tests.rs`):
//! client-go's `mkFifoObj` objects, deltas flattened for comparison and written compactly,
//! scripts of reflector writes, and the known-objects store (client-go's
//! `literalListerGetter`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;

use super::delta::{Delta, DeltaType};
use super::store::ReflectorStore;
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

/// Flat deltas from a compact list, as client-go's tables write them: `"Added foo 10,
/// Replaced foo 15, tomb bar 6"` (a kind of [`DeltaType`] or `tomb`, a name, a `val`).
pub(crate) fn deltas(spec: &str) -> Vec<Flat> {
    spec.split(',')
        .map(|one| {
            let words: Vec<&str> = one.split_whitespace().collect();
            let [kind, name, v] = words[..] else {
                panic!("{one:?}: want `<kind> <name> <val>`")
            };
            let v: i32 = v.parse().expect("a number");
            let kind = match kind {
                "tomb" => return tomb(name, v),
                "Added" => DeltaType::Added,
                "Updated" => DeltaType::Updated,
                "Deleted" => DeltaType::Deleted,
                "Replaced" => DeltaType::Replaced,
                "Sync" => DeltaType::Sync,
                other => panic!("{other:?} is not a delta type"),
            };
            f(kind, name, v)
        })
        .collect()
}

/// client-go's `Test*FIFO_basic` writes: adds of `a0`..`a4` (vals 0..4), then an update of
/// each (vals 10..14).
pub(crate) const BASIC: &str = "add a0 0; add a1 1; add a2 2; add a3 3; add a4 4; \
    update a0 10; update a1 11; update a2 12; update a3 13; update a4 14";

/// client-go's `Test*FIFO_detectLineJumpers` writes: `foo` three times around `bar`, then
/// `zab`.
pub(crate) const LINE_JUMPERS: &str = "add foo 10; add bar 1; add foo 11; add foo 13; add zab 30";

/// Runs a script of reflector writes on a FIFO, `;`-separated: `add foo 10`, `update foo 12`,
/// `delete foo 15`, `replace foo 6 bar 1` (a list of name-val pairs, possibly empty), `resync`.
pub(crate) fn apply(q: &impl ReflectorStore<ConfigMap>, script: &str) {
    for step in script.split(';') {
        let words: Vec<&str> = step.split_whitespace().collect();
        let pairs = |rest: &[&str]| -> Vec<ConfigMap> {
            rest.chunks(2)
                .map(|p| obj(p[0], p[1].parse().expect("a number")))
                .collect()
        };
        match words[..] {
            ["add", name, v] => q.add(obj(name, v.parse().unwrap())),
            ["update", name, v] => q.update(obj(name, v.parse().unwrap())),
            ["delete", name, v] => q.delete(obj(name, v.parse().unwrap())),
            ["replace", ref rest @ ..] => q.replace(pairs(rest), "0"),
            ["resync"] => q.resync(),
            _ => panic!("{step:?} is not a step"),
        }
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    }
}
