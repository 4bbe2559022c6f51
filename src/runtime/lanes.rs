//! The queues a controller's workers take keys from: the controller's queue and, with a
//! requeue lane ([`super::Controller::requeue_lane`]), a second queue for timed requeues with
//! workers of its own; and the claims that keep one key out of both lanes at once.
//!
//! Beyond client-go and controller-runtime, which serve both kinds of work from one queue.
//! Invariant: a key is in [`BusyKeys`] iff a worker of either lane is reconciling it, and a
//! [`Claim`] is the only way in or out (released on drop, even if the reconcile panics).

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::key::ObjectKey;
use super::queue::ControllerQueue;

/// Which queue a worker takes keys from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The controller's queue.
    Main,
    /// The requeue lane's queue: timed requeues, served by workers of their own.
    Requeue,
}

/// The keys in reconcile in either lane, so that no key is reconciled twice at once.
#[derive(Default)]
pub(crate) struct BusyKeys {
    keys: Mutex<HashSet<ObjectKey>>,
    released: Notify,
}

/// A key claimed for one reconcile; released on drop.
pub(crate) struct Claim {
    busy: Arc<BusyKeys>,
    key: ObjectKey,
}

impl BusyKeys {
    /// Claims `key` if no worker of either lane holds it.
    pub(crate) fn try_claim(self: &Arc<Self>, key: &ObjectKey) -> Option<Claim> {
        self.keys.lock().insert(key.clone()).then(|| Claim {
            busy: Arc::clone(self),
            key: key.clone(),
        })
    }

    /// Claims `key`, waiting until the worker that holds it lets it go.
    pub(crate) async fn claim(self: &Arc<Self>, key: &ObjectKey) -> Claim {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(claim) = self.try_claim(key) {
                return claim;
            }
            released.await;
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.busy.keys.lock().remove(&self.key);
        self.busy.released.notify_waiters();
    }
}

/// The controller's queue and, with a requeue lane, the lane's queue: shut down together.
#[derive(Clone)]
pub(crate) struct Queues {
    pub main: ControllerQueue,
    pub requeue: Option<ControllerQueue>,
}

impl Queues {
    pub(crate) fn len(&self) -> usize {
        self.main.len() + self.requeue.as_ref().map_or(0, |q| q.len())
    }

    pub(crate) fn shutdown(&self) {
        self.main.shutdown();
        if let Some(q) = &self.requeue {
            q.shutdown();
        }
    }

    pub(crate) async fn shutdown_with_drain(&self) {
        match &self.requeue {
            Some(q) => {
                futures::join!(self.main.shutdown_with_drain(), q.shutdown_with_drain());
            }
            None => self.main.shutdown_with_drain().await,
        }
    }
}
