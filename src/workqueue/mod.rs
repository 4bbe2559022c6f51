//! client-go's `util/workqueue`: dedup queue, delaying queue, rate limiters, rate-limiting queue.
//!
//! | kubeloop                          | client-go `util/workqueue`            |
//! |-----------------------------------|---------------------------------------|
//! | [`Queue`] (`queue.rs`)            | `Typed[T]`, `queue.go`                |
//! | [`DelayingQueue`]                 | `delayingType[T]`, `delaying_queue.go`|
//! | [`RateLimiter`] and its kinds     | `default_rate_limiters.go`            |
//! | [`RateLimitingQueue`]             | `rateLimitingType[T]`                 |
//! | [`MetricsProvider`] (`metrics.rs`)| `metrics.go` + component-base's names |
//!
//! A controller's usual loop: informer handlers `add` keys; workers `get` a key, reconcile it,
//! then `forget` it on success or `add_rate_limited` it on failure, and always `done` it.
//! An item is never handed to two workers at once, and an item added while being processed
//! is processed again afterwards, once.
//!
//! All three queue types keep their state behind one lock, including the delaying queue's
//! heap of not-yet-ready items and the parked `get` calls; nothing polls or busy-waits. That
//! state and every transition on it live in `state.rs`, a leaf module (it imports only the
//! lock shim `sync.rs`); `queue.rs`, `delaying_queue.rs` and `metrics.rs` are faces over it.

mod delaying_queue;
mod metrics;
mod queue;
mod rate_limiters;
mod rate_limiting_queue;
mod state;
mod sync;

pub use delaying_queue::DelayingQueue;
pub use metrics::{MetricsProvider, UNFINISHED_WORK_UPDATE_PERIOD};
pub use queue::{Queue, QueueConfig};
pub use rate_limiters::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, ItemFastSlowRateLimiter,
    MaxOfRateLimiter, RateLimiter, RateLimiterError, WithMaxWaitRateLimiter,
    default_controller_rate_limiter, default_item_based_rate_limiter,
    sample_controller_rate_limiter,
};
pub use rate_limiting_queue::RateLimitingQueue;
