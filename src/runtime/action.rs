//! What a reconcile returns, and what a failed one asks of the queue: the leaf every other
//! part of the runtime reads. controller-runtime: `pkg/reconcile` (`Result`, `RequeueAfter`);
//! kube-runtime: `controller::Action`.

use std::time::Duration;

use super::key::ObjectKey;

/// What a successful reconcile asks of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more to do until the next event for this key.
    Done,
    /// Look at this key again after this long (for example to refresh observed state that no
    /// watch event reports), at the priority it was queued with. The backoff is reset first,
    /// as for [`Action::Done`].
    RequeueAfter(Duration),
    /// [`Action::RequeueAfter`] at this priority instead (on the priority queue; higher goes
    /// first, see [`crate::workqueue::LOW_PRIORITY`]). controller-runtime:
    /// `reconcile.Result{RequeueAfter, Priority}`.
    RequeueWithPriority {
        /// How long until the key is looked at again.
        after: Duration,
        /// Its priority in the queue from then on.
        priority: i32,
    },
}

impl Action {
    /// When to look at the key again and at what priority (`None`: the one it had), or
    /// `None` for [`Action::Done`].
    pub fn requeue(&self) -> Option<(Duration, Option<i32>)> {
        match *self {
            Action::Done => None,
            Action::RequeueAfter(after) => Some((after, None)),
            Action::RequeueWithPriority { after, priority } => Some((after, Some(priority))),
        }
    }
}

/// What a failed reconcile asks of the queue; returned by the error policy. A retried key
/// keeps the priority it was queued with (controller-runtime's `reconcileHandler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Retry with the queue's rate limiter (client-go's `AddRateLimited`; the default).
    RateLimited,
    /// Retry after this long, without growing the key's backoff.
    RequeueAfter(Duration),
    /// Give up on this key until its next event (`Forget`; for errors a retry cannot fix).
    Drop,
}

/// The error policy every failed reconcile gets unless the controller says otherwise:
/// [`ErrorAction::RateLimited`].
pub fn default_error_policy<E>(_error: &E, _key: &ObjectKey, _retries: u32) -> ErrorAction {
    ErrorAction::RateLimited
}
