//! client-go's `util/workqueue`: dedup queue, delaying queue, rate limiters, rate-limiting
//! queue; and controller-runtime's priority queue.
//!
//! | kubeloop                               | client-go `util/workqueue` / controller-runtime     |
//! |----------------------------------------|-----------------------------------------------------|
//! | [`Queue`] (`queue.rs`)                 | `Typed[T]`, `queue.go`                              |
//! | [`DelayingQueue`]                      | `delayingType[T]`, `delaying_queue.go`              |
//! | [`RateLimiter`] and its kinds          | `default_rate_limiters.go`                          |
//! | [`RateLimitingQueue`]                  | `rateLimitingType[T]`                               |
//! | [`MetricsProvider`] (`metrics.rs`)     | `metrics.go` + component-base's names               |
//! | [`PriorityQueue`], [`AddOpts`]         | controller-runtime `pkg/controller/priorityqueue`   |
//! | [`FairnessKeys`], [`FairnessExtractor`] (`fair.rs`) | controller-runtime#3261 (unmerged): fair hand-out |
//! | [`LOW_PRIORITY`], [`priority_on_add`], [`priority_on_update`] (`low_priority.rs`) | controller-runtime `handler.LowPriority`, `WithLowPriorityWhenUnchanged` |
//!
//! A controller's usual loop: informer handlers `add` keys; workers `get` a key, reconcile it,
//! then `forget` it on success or `add_rate_limited` it on failure, and always `done` it.
//! An item is never handed to two workers at once, and an item added while being processed
//! is processed again afterwards, once. The priority queue keeps these promises and hands out
//! the highest-priority ready item first.
//!
//! Every queue type keeps its state behind one lock, including the waiting heap of
//! not-yet-ready items and the parked `get` calls; nothing polls or busy-waits. Both queues
//! stand on one core (`shared.rs`): one slot arena, one delaying heap and timer, one way to
//! park and wake a `get`, one `done` and shutdown. What differs is the state's discipline:
//! first in, first out in `state.rs` (the dedup, delaying and rate-limiting queues), by
//! priority and fairness key in `priority_state.rs`. Imports run one way, from the faces down:
//! - leaves, importing no other file here: `sync.rs` (the lock shim, so loom can model-check
//!   the states), `parked.rs` (the parked `get` calls), `fair.rs`, `low_priority.rs`,
//!   `rate_limiters.rs`;
//! - `shared.rs` imports `sync.rs` and `parked.rs`; `state.rs` imports `shared.rs`;
//!   `priority_state.rs` imports `shared.rs` and `fair.rs`;
//! - `metrics.rs` reads both states; the faces (`queue.rs`, `delaying_queue.rs`,
//!   `rate_limiting_queue.rs`, `priority_queue.rs`) import the states, the metrics and each
//!   other downwards (the rate-limiting queue over the delaying queue over the queue's config;
//!   the priority queue over the delaying queue's timer and the rate limiters).

mod delaying_queue;
mod fair;
#[cfg(test)]
mod fair_tests;
mod low_priority;
mod metrics;
mod parked;
mod priority_queue;
mod priority_state;
mod queue;
mod rate_limiters;
mod rate_limiting_queue;
mod shared;
mod state;
// crossbeam-epoch's cell: `unsafe` blocks with `// SAFETY:` comments.
#[allow(unsafe_code)]
mod sync;

pub use delaying_queue::DelayingQueue;
pub use fair::{FairnessDepth, FairnessExtractor, FairnessKeys, MAX_FAIRNESS_LEVELS};
pub use low_priority::{LOW_PRIORITY, priority_on_add, priority_on_update};
pub use metrics::{MetricsProvider, UNFINISHED_WORK_UPDATE_PERIOD, fairness_by_queue};
pub use priority_queue::{AddOpts, PriorityQueue};
pub use queue::{Queue, QueueConfig};
pub use rate_limiters::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, ItemFastSlowRateLimiter,
    MaxOfRateLimiter, RateLimiter, RateLimiterError, WithMaxWaitRateLimiter,
    default_controller_rate_limiter, default_item_based_rate_limiter,
    sample_controller_rate_limiter,
};
pub use rate_limiting_queue::RateLimitingQueue;
