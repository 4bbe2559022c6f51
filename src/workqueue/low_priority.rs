//! Low priority for events that carry no change: controller-runtime's
//! `handler.WithLowPriorityWhenUnchanged` and `handler.LowPriority` (`pkg/handler/
//! eventhandler.go`, v0.24.1), as functions an event handler calls with the facts it has,
//! so that neither the queue nor the cache depends on the controller runtime.
//!
//! controller-runtime's rule (since it reads the informer's `isInInitialList`; earlier
//! versions looked at the object's creation time instead):
//! - a create (add) event from the informer's initial list gets [`LOW_PRIORITY`]: at startup
//!   every existing object is queued, and a new object or a user's edit must not wait behind
//!   all of them;
//! - an update event whose old and new objects have the same resourceVersion (a resync, or a
//!   relist that found the object unchanged) gets [`LOW_PRIORITY`];
//! - every other event keeps the default priority (`None`, which the queue reads as 0), and
//!   delete and generic events are never lowered.
//!
//! A `None` priority leaves the queue's own rule in charge: an item already queued at a
//! higher priority keeps it.

/// The priority of adds for objects that did not change. controller-runtime:
/// `handler.LowPriority`.
pub const LOW_PRIORITY: i32 = -100;

/// The priority for a handler's add (create) event: [`LOW_PRIORITY`] for an object from the
/// informer's initial list, the default otherwise. controller-runtime: `TypedFuncs.Create`
/// under `WithLowPriorityWhenUnchanged`.
pub fn priority_on_add(is_in_initial_list: bool) -> Option<i32> {
    is_in_initial_list.then_some(LOW_PRIORITY)
}

/// The priority for a handler's update event: [`LOW_PRIORITY`] when the old and new
/// resourceVersions are equal (both absent counts as equal, as Go's empty strings do), the
/// default otherwise. controller-runtime: `TypedFuncs.Update` under
/// `WithLowPriorityWhenUnchanged`.
pub fn priority_on_update(
    old_resource_version: Option<&str>,
    new_resource_version: Option<&str>,
) -> Option<i32> {
    let unchanged = old_resource_version.unwrap_or("") == new_resource_version.unwrap_or("");
    unchanged.then_some(LOW_PRIORITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    // controller-runtime: pkg/handler/eventhandler_test.go, Describe
    // "WithLowPriorityWhenUnchanged": "should lower the priority of a create request for an
    // object that was part of the initial list", "should not lower the priority of a create
    // request for an object that was not part of the initial list", "should lower the
    // priority of an update request with unchanged RV", "should not lower the priority of an
    // update request with changed RV"
    #[test]
    fn initial_list_adds_and_unchanged_updates_get_low_priority() {
        assert_eq!(priority_on_add(true), Some(LOW_PRIORITY));
        assert_eq!(priority_on_add(false), None);
        assert_eq!(priority_on_update(Some("7"), Some("7")), Some(LOW_PRIORITY));
        assert_eq!(priority_on_update(Some("7"), Some("8")), None);
        assert_eq!(priority_on_update(None, None), Some(LOW_PRIORITY));
        assert_eq!(priority_on_update(None, Some("")), Some(LOW_PRIORITY));
        assert_eq!(priority_on_update(None, Some("1")), None);
    }
}
