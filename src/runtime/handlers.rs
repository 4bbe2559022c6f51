//! The event handlers a controller's informers get: each turns an informer event into the
//! [`ObjectKey`]s to reconcile. sample-controller's `enqueueFoo` and `handleObject`
//! (controller.go), controller-runtime's `handler.EnqueueRequestForObject` and
//! `handler.EnqueueRequestForOwner(.., OnlyControllerOwner())`, kube-runtime's
//! `trigger_self` / `trigger_owners`.
//!
//! - primary: the object's own key ([`enqueue_handler`], [`enqueue`]); a tombstone is keyed by
//!   the key it carries ([`key_of_deleted`]);
//! - owned: the key of the object's controller ownerReference, if it names the primary kind
//!   and group and that object is in the primary cache ([`owned_handler`]); resyncs (the same
//!   resourceVersion twice) are ignored.
//!
//! Priorities (controller-runtime v0.24.1 `handler.WithLowPriorityWhenUnchanged`, which its
//! builder puts on every handler): an add from the informer's initial list and an update whose
//! resourceVersion did not change (a resync) are queued at [`LOW_PRIORITY`]
//! ([`priority_on_add`], [`priority_on_update`]); everything else at the default. On the plain
//! queue priorities are ignored.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::Resource;
use kube_client::core::ObjectMeta;

use super::key::ObjectKey;
use super::queue::ControllerQueue;
use crate::cache::{
    CacheObject, DeletedObject, Lister, ResourceEventHandlerFuncs, resource_version,
};
#[cfg(doc)]
use crate::workqueue::LOW_PRIORITY;
use crate::workqueue::{priority_on_add, priority_on_update};

/// An update filter on the primary: `true` enqueues (controller-runtime's update predicate).
pub type UpdateFilter<K> = Arc<dyn Fn(&K, &K) -> bool + Send + Sync>;

/// The cache key (`namespace/name`) of an object, logged and `None` if it has no name.
pub fn key_of<K: Resource>(obj: &K) -> Option<ObjectKey> {
    match ObjectKey::of(obj) {
        Ok(key) => Some(key),
        Err(e) => {
            tracing::error!(error = %e, "cannot enqueue object");
            None
        }
    }
}

/// The key of a deleted object: a tombstone carries its own key (the last known object may be
/// stale), a plain deletion is keyed like any object. client-go:
/// `DeletionHandlingMetaNamespaceKeyFunc`.
pub fn key_of_deleted<K: Resource>(deleted: &DeletedObject<K>) -> Option<ObjectKey> {
    match deleted {
        DeletedObject::Unknown(tombstone) => match ObjectKey::parse(&tombstone.key) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::error!(error = %e, "cannot enqueue a tombstone");
                None
            }
        },
        DeletedObject::Object(obj) => key_of(obj.as_ref()),
    }
}

/// Adds the key of `obj` to `queue` at `priority` (`None`: the default). sample-controller:
/// `enqueueFoo`.
pub fn enqueue<K: Resource>(queue: &ControllerQueue, obj: &K, priority: Option<i32>) {
    if let Some(key) = key_of(obj) {
        queue.add_with_priority(key, priority);
    }
}

/// The priority of an update from `old` to `new`: low if its resourceVersion did not change.
pub(crate) fn update_priority<K: Resource>(old: &K, new: &K) -> Option<i32> {
    priority_on_update(Some(resource_version(old)), Some(resource_version(new)))
}

/// Event handlers that enqueue the object's own key on add, update (resyncs included) and
/// delete (tombstones included): what sample-controller registers on the Foo informer. Adds
/// from the initial list and resyncs go in at low priority.
pub fn enqueue_handler<K: Resource + Send + Sync + 'static>(
    queue: ControllerQueue,
) -> ResourceEventHandlerFuncs<K> {
    primary_handler(queue, None, true)
}

/// [`enqueue_handler`], with updates enqueued only where `filter(old, new)` says so, and
/// deletes only with `deletes`: the builder's primary handler.
pub(crate) fn primary_handler<K: Resource + Send + Sync + 'static>(
    queue: ControllerQueue,
    filter: Option<UpdateFilter<K>>,
    deletes: bool,
) -> ResourceEventHandlerFuncs<K> {
    let (q_add, q_update) = (queue.clone(), queue.clone());
    let handler = ResourceEventHandlerFuncs::new()
        .on_add(move |obj: &Arc<K>, initial: bool| {
            enqueue(&q_add, obj.as_ref(), priority_on_add(initial))
        })
        .on_update(move |old: &Arc<K>, new: &Arc<K>| {
            if filter.as_ref().is_none_or(|f| f(old, new)) {
                let priority = update_priority(old.as_ref(), new.as_ref());
                enqueue(&q_update, new.as_ref(), priority);
            }
        });
    if !deletes {
        return handler;
    }
    handler.on_delete(move |deleted: &DeletedObject<K>| {
        if let Some(key) = key_of_deleted(deleted) {
            queue.add(key);
        }
    })
}

pub(crate) fn add_all(queue: &ControllerQueue, keys: Vec<ObjectKey>, priority: Option<i32>) {
    for key in keys {
        queue.add_with_priority(key, priority);
    }
}

/// Owned object -> its controller, if that is a `K` in the primary cache.
/// sample-controller: `handleObject`.
pub(crate) fn owned_handler<K, C>(
    primary: Lister<K>,
    queue: ControllerQueue,
    controller: String,
) -> ResourceEventHandlerFuncs<C>
where
    K: CacheObject + Resource<DynamicType = ()>,
    C: CacheObject,
{
    let owner_of = Arc::new(move |meta: &ObjectMeta| -> Option<ObjectKey> {
        let owner = controller_of(meta).filter(|owner| refers_to::<K>(owner))?;
        let namespace = meta.namespace.as_deref().unwrap_or("");
        match primary.get(namespace, &owner.name) {
            Some(obj) => key_of(obj.as_ref()),
            None => {
                tracing::debug!(
                    controller = %controller,
                    object = meta.name.as_deref().unwrap_or(""),
                    owner = %owner.name,
                    "ignoring orphaned object"
                );
                None
            }
        }
    });
    let (o_add, o_update, o_delete) = (owner_of.clone(), owner_of.clone(), owner_of);
    let (q_add, q_update, q_delete) = (queue.clone(), queue.clone(), queue);
    ResourceEventHandlerFuncs::new()
        .on_add(move |obj: &Arc<C>, initial: bool| {
            if let Some(key) = o_add(obj.meta()) {
                q_add.add_with_priority(key, priority_on_add(initial));
            }
        })
        .on_update(move |old: &Arc<C>, new: &Arc<C>| {
            // Periodic resyncs send the same version twice; two different versions of one
            // object always have different resourceVersions.
            if resource_version(old.as_ref()) == resource_version(new.as_ref()) {
                return;
            }
            if let Some(key) = o_update(new.meta()) {
                q_update.add(key);
            }
        })
        .on_delete(move |deleted: &DeletedObject<C>| {
            // A tombstone's object is the last state the cache knew; its ownerReferences are
            // what is needed, and they do not change over an object's life in practice.
            if let Some(key) = o_delete(deleted.object().meta()) {
                q_delete.add(key);
            }
        })
}

/// Whether an ownerReference points at a `K` (kind and API group both match; the version may
/// differ).
pub fn refers_to<K: Resource<DynamicType = ()>>(owner: &OwnerReference) -> bool {
    let group = owner
        .api_version
        .rsplit_once('/')
        .map_or("", |(group, _)| group);
    owner.kind == K::kind(&()) && group == K::group(&())
}

/// The ownerReference marked `controller: true`, if any. client-go: `metav1.GetControllerOf`.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::time::Duration;

    use super::*;
    use crate::cache::{DeletedFinalStateUnknown, ResourceEventHandler};
    use crate::workqueue::{
        ItemExponentialFailureRateLimiter, LOW_PRIORITY, PriorityQueue, RateLimitingQueue,
    };

    fn cm(ns: &str, name: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn queue() -> ControllerQueue {
        RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(10),
        ))
        .into()
    }

    #[test]
    fn a_tombstone_is_keyed_by_its_own_key() {
        let plain = DeletedObject::Object(cm("ns", "a"));
        assert_eq!(key_of_deleted(&plain), Some(ObjectKey::new("ns", "a")));
        let tombstone = DeletedObject::Unknown(DeletedFinalStateUnknown {
            key: "ns/b".into(),
            obj: cm("ns", "stale"),
        });
        assert_eq!(key_of_deleted(&tombstone), Some(ObjectKey::new("ns", "b")));
    }

    #[test]
    fn an_object_without_a_name_is_not_enqueued() {
        let q = queue();
        enqueue(&q, &ConfigMap::default(), None);
        assert_eq!(q.len(), 0);
        enqueue(&q, cm("ns", "a").as_ref(), None);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn the_enqueue_handler_enqueues_adds_updates_and_deletes_once_each() {
        let q = queue();
        let handler = enqueue_handler::<ConfigMap>(q.clone());
        let h: &dyn ResourceEventHandler<ConfigMap> = &handler;
        h.on_add(&cm("ns", "a"), true);
        h.on_update(&cm("ns", "b"), &cm("ns", "b"));
        h.on_delete(&DeletedObject::Unknown(DeletedFinalStateUnknown {
            key: "ns/c".into(),
            obj: cm("ns", "c"),
        }));
        h.on_add(&cm("ns", "a"), false);
        assert_eq!(q.len(), 3, "ns/a, ns/b, ns/c with ns/a deduplicated");
    }

    fn with_rv(obj: Arc<ConfigMap>, rv: &str) -> Arc<ConfigMap> {
        let mut obj = obj.as_ref().clone();
        obj.metadata.resource_version = Some(rv.into());
        Arc::new(obj)
    }

    #[tokio::test]
    async fn initial_list_adds_and_resyncs_are_queued_behind_new_objects_and_edits() {
        let q = ControllerQueue::from(PriorityQueue::new());
        let handler = enqueue_handler::<ConfigMap>(q.clone());
        let h: &dyn ResourceEventHandler<ConfigMap> = &handler;
        h.on_add(&with_rv(cm("ns", "listed"), "1"), true);
        h.on_update(
            &with_rv(cm("ns", "resynced"), "2"),
            &with_rv(cm("ns", "resynced"), "2"),
        );
        h.on_add(&with_rv(cm("ns", "new"), "3"), false);
        h.on_update(
            &with_rv(cm("ns", "edited"), "2"),
            &with_rv(cm("ns", "edited"), "4"),
        );
        let mut order = Vec::new();
        while let Some((key, priority)) = futures::FutureExt::now_or_never(q.get()).flatten() {
            order.push((key.to_string(), priority));
        }
        assert_eq!(
            order,
            [
                ("ns/new".to_string(), 0),
                ("ns/edited".to_string(), 0),
                ("ns/listed".to_string(), LOW_PRIORITY),
                ("ns/resynced".to_string(), LOW_PRIORITY),
            ]
        );
    }
}
