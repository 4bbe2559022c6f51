//! The queue a controller's workers take keys from: controller-runtime's priority queue (the
//! default, as in controller-runtime since v0.23) or client-go's rate-limiting queue
//! ([`super::Controller::plain_queue`]). One face over both, so that handlers, workers and
//! terms need not care which it is.
//!
//! On the plain queue every priority is ignored and every key is handed out at priority 0.
//!
//! The priority queue hands out fairly across namespaces by default ([`QueueFairness`]):
//! within one priority, round-robin over the namespaces with a ready key (cluster-scoped
//! objects share one turn), so one namespace's flood does not hold back another's edit.
//! Neither client-go nor controller-runtime (v0.24.1) does this; controller-runtime#3261
//! proposes it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::key::ObjectKey;
use crate::workqueue::{
    AddOpts, FairnessExtractor, FairnessKeys, PriorityQueue, QueueConfig, RateLimiter,
    RateLimitingQueue,
};

/// How the runtime's priority queue shares out the keys of one priority
/// ([`super::Controller::fairness`]). The plain queue ignores it.
#[derive(Clone, Default)]
pub enum QueueFairness {
    /// Round-robin across namespaces; cluster-scoped objects share one turn. The default.
    #[default]
    Namespace,
    /// First in, first out within a priority, as controller-runtime's queue.
    Off,
    /// Round-robin across the keys this extractor gives (say a tenant, then the namespace);
    /// [`QueueFairness::custom`] makes one from a closure.
    Custom(Arc<FairnessExtractor<ObjectKey>>),
}

impl QueueFairness {
    /// [`QueueFairness::Custom`] with `extractor`.
    pub fn custom(
        extractor: impl for<'a> Fn(&'a ObjectKey) -> FairnessKeys<'a> + Send + Sync + 'static,
    ) -> Self {
        QueueFairness::Custom(Arc::new(extractor))
    }
}

impl fmt::Debug for QueueFairness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueFairness::Namespace => "Namespace",
            QueueFairness::Off => "Off",
            QueueFairness::Custom(_) => "Custom",
        })
    }
}

/// The namespace of a key as its one fairness key (`""` for a cluster-scoped object).
fn namespace_of(key: &ObjectKey) -> FairnessKeys<'_> {
    FairnessKeys::one(key.namespace().unwrap_or(""))
}

/// A controller's queue of keys. Cloning gives another handle to the same queue.
#[derive(Clone, Debug)]
pub enum ControllerQueue {
    /// controller-runtime's priority queue: the highest priority ready key first.
    Priority(PriorityQueue<ObjectKey>),
    /// client-go's rate-limiting queue: first in, first out.
    Plain(RateLimitingQueue<ObjectKey>),
}

impl From<PriorityQueue<ObjectKey>> for ControllerQueue {
    fn from(queue: PriorityQueue<ObjectKey>) -> Self {
        ControllerQueue::Priority(queue)
    }
}

impl From<RateLimitingQueue<ObjectKey>> for ControllerQueue {
    fn from(queue: RateLimitingQueue<ObjectKey>) -> Self {
        ControllerQueue::Plain(queue)
    }
}

impl ControllerQueue {
    /// client-go's queue with `plain`, else the priority queue sharing out by `fairness`,
    /// with `limiter` and `config`.
    pub fn new(
        plain: bool,
        fairness: QueueFairness,
        limiter: impl RateLimiter<ObjectKey> + 'static,
        config: QueueConfig,
    ) -> Self {
        if plain {
            return RateLimitingQueue::with_config(limiter, config).into();
        }
        match fairness {
            QueueFairness::Namespace => PriorityQueue::with_fairness(limiter, config, namespace_of),
            QueueFairness::Off => PriorityQueue::with_config(limiter, config),
            QueueFairness::Custom(extractor) => {
                PriorityQueue::with_fairness(limiter, config, move |key: &ObjectKey| extractor(key))
            }
        }
        .into()
    }

    /// The fairness keys `key` is handed out under, as text; `None` on a queue without them.
    pub fn fairness_of(&self, key: &ObjectKey) -> Option<String> {
        match self {
            ControllerQueue::Priority(q) => q.fairness_of(key),
            ControllerQueue::Plain(_) => None,
        }
    }

    /// Adds `key` now at the default priority.
    pub fn add(&self, key: ObjectKey) {
        self.add_with_priority(key, None);
    }

    /// Adds `key` now at `priority` (`None`: the default, 0; a key already queued keeps the
    /// higher of its priorities).
    pub fn add_with_priority(&self, key: ObjectKey, priority: Option<i32>) {
        self.add_with_opts(
            AddOpts {
                priority,
                ..AddOpts::default()
            },
            key,
        );
    }

    /// Adds `key` once `after` has passed, at `priority`.
    pub fn add_after(&self, key: ObjectKey, after: Duration, priority: Option<i32>) {
        self.add_with_opts(
            AddOpts {
                after: Some(after),
                priority,
                ..AddOpts::default()
            },
            key,
        );
    }

    /// Adds `key` after the wait its rate limiter decides, at `priority`.
    pub fn add_rate_limited(&self, key: ObjectKey, priority: Option<i32>) {
        self.add_with_opts(
            AddOpts {
                rate_limited: true,
                priority,
                ..AddOpts::default()
            },
            key,
        );
    }

    fn add_with_opts(&self, opts: AddOpts, key: ObjectKey) {
        match self {
            ControllerQueue::Priority(q) => q.add_with_opts(opts, [key]),
            ControllerQueue::Plain(q) if opts.rate_limited => q.add_rate_limited(key),
            ControllerQueue::Plain(q) => match opts.after {
                Some(after) => q.add_after(key, after),
                None => q.add(key),
            },
        }
    }

    /// Waits for the next key and returns it with its priority; `None` once the queue is shut
    /// down (and, after [`Self::shutdown_with_drain`], empty).
    pub async fn get(&self) -> Option<(ObjectKey, i32)> {
        match self {
            ControllerQueue::Priority(q) => q.get().await,
            ControllerQueue::Plain(q) => q.get().await.map(|key| (key, 0)),
        }
    }

    /// `key` is done processing (see the queues' own `done`).
    pub fn done(&self, key: &ObjectKey) {
        match self {
            ControllerQueue::Priority(q) => q.done(key),
            ControllerQueue::Plain(q) => q.done(key),
        }
    }

    /// Resets `key`'s backoff.
    pub fn forget(&self, key: &ObjectKey) {
        match self {
            ControllerQueue::Priority(q) => q.forget(key),
            ControllerQueue::Plain(q) => q.forget(key),
        }
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, key: &ObjectKey) -> u32 {
        match self {
            ControllerQueue::Priority(q) => q.num_requeues(key),
            ControllerQueue::Plain(q) => q.num_requeues(key),
        }
    }

    /// Keys ready to be handed out.
    pub fn len(&self) -> usize {
        match self {
            ControllerQueue::Priority(q) => q.len(),
            ControllerQueue::Plain(q) => q.len(),
        }
    }

    /// Whether no key is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the queue: adds are ignored and `get` returns `None`.
    pub fn shutdown(&self) {
        match self {
            ControllerQueue::Priority(q) => q.shutdown(),
            ControllerQueue::Plain(q) => q.shutdown(),
        }
    }

    /// Stops taking adds, hands out what is queued, and waits until every key handed out is
    /// done.
    pub async fn shutdown_with_drain(&self) {
        match self {
            ControllerQueue::Priority(q) => q.shutdown_with_drain().await,
            ControllerQueue::Plain(q) => q.shutdown_with_drain().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workqueue::{LOW_PRIORITY, default_controller_rate_limiter};

    #[tokio::test]
    async fn the_priority_queue_hands_out_by_priority_and_the_plain_one_in_order() {
        let (a, b) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"));
        let priority = ControllerQueue::from(PriorityQueue::new());
        let plain =
            ControllerQueue::from(RateLimitingQueue::new(default_controller_rate_limiter()));
        for q in [&priority, &plain] {
            q.add_with_priority(a.clone(), Some(LOW_PRIORITY));
            q.add(b.clone());
        }
        assert_eq!(priority.get().await, Some((b.clone(), 0)));
        assert_eq!(priority.get().await, Some((a.clone(), LOW_PRIORITY)));
        assert_eq!(plain.get().await, Some((a, 0)));
        assert_eq!(plain.get().await, Some((b, 0)));
    }
}
