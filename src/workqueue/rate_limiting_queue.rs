//! A delaying queue that asks a rate limiter how long to wait. client-go counterpart:
//! `util/workqueue/rate_limiting_queue.go` (`rateLimitingType[T]`).
//!
//! Behaviour kept from client-go: `add_rate_limited` is `add_after(item, limiter.when(item))`;
//! `forget` and `num_requeues` go to the limiter only (the caller still calls `done`).
//!
//! Invariant: the limiter is shared by every handle of the queue, so requeue counts are per
//! item, not per handle.

use std::hash::Hash;
use std::ops::Deref;
use std::sync::Arc;

use super::delaying_queue::DelayingQueue;
use super::queue::QueueConfig;
use super::rate_limiters::RateLimiter;

/// A [`DelayingQueue`] with a rate limiter for retries. Derefs to the [`DelayingQueue`].
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kubeloop::workqueue::{default_controller_rate_limiter, RateLimitingQueue};
/// let queue = RateLimitingQueue::new(default_controller_rate_limiter());
/// queue.add("default/web".to_string());
/// let key = queue.get().await.unwrap();
/// // Reconcile failed: retry in 5 ms, then 10 ms, 20 ms, ...
/// queue.add_rate_limited(key.clone());
/// assert_eq!(queue.num_requeues(&key), 1);
/// queue.done(&key);
/// // Reconcile succeeded later: stop tracking it.
/// queue.forget(&key);
/// assert_eq!(queue.num_requeues(&key), 0);
/// # });
/// ```
pub struct RateLimitingQueue<T> {
    queue: DelayingQueue<T>,
    limiter: Arc<dyn RateLimiter<T>>,
}

impl<T> Clone for RateLimitingQueue<T> {
    fn clone(&self) -> Self {
        RateLimitingQueue {
            queue: self.queue.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<T> std::fmt::Debug for RateLimitingQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RateLimitingQueue")
            .field(&self.queue)
            .finish()
    }
}

impl<T> Deref for RateLimitingQueue<T> {
    type Target = DelayingQueue<T>;

    fn deref(&self) -> &DelayingQueue<T> {
        &self.queue
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> RateLimitingQueue<T> {
    /// An unnamed queue (no metrics). client-go: `NewTypedRateLimitingQueue`.
    pub fn new(limiter: impl RateLimiter<T> + 'static) -> Self {
        RateLimitingQueue::with_config(limiter, QueueConfig::default())
    }

    /// client-go: `NewTypedRateLimitingQueueWithConfig`.
    pub fn with_config(limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        RateLimitingQueue {
            queue: DelayingQueue::with_config(config),
            limiter: Arc::new(limiter),
        }
    }

    /// Adds `item` after the wait the rate limiter decides. client-go: `AddRateLimited`.
    pub fn add_rate_limited(&self, item: T) {
        let delay = self.limiter.when(&item);
        if crate::trace::on() {
            if let Some(key) = crate::trace::item_key(&item) {
                let requeues = self.limiter.num_requeues(&item);
                crate::trace::record(key, crate::trace::Stage::QueueRateLimited, "", || {
                    format!("the rate limiter says wait {delay:?} (requeue {requeues})")
                });
            }
        }
        self.queue.add_after_untraced(item, delay);
    }

    /// Tells the limiter to stop tracking `item`; `done` is still needed. client-go: `Forget`.
    pub fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    /// How many times `item` was rate-limited since it was last forgotten.
    /// client-go: `NumRequeues`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::workqueue::default_controller_rate_limiter;
    use crate::workqueue::rate_limiters::ItemExponentialFailureRateLimiter;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Waits for the next item and returns it with how long that took (paused clock).
    async fn next(q: &RateLimitingQueue<&'static str>) -> (&'static str, Duration) {
        let start = Instant::now();
        let item = q.get().await.unwrap();
        q.done(&item);
        (item, start.elapsed())
    }

    // client-go: TestRateLimitingQueue
    #[tokio::test(start_paused = true)]
    async fn add_rate_limited_waits_what_the_limiter_says() {
        let q = RateLimitingQueue::new(ItemExponentialFailureRateLimiter::new(
            ms(1),
            Duration::from_secs(1),
        ));
        q.add_rate_limited("one");
        assert_eq!(q.waiting_len(), 1);
        assert_eq!(next(&q).await, ("one", ms(1)));
        q.add_rate_limited("one");
        assert_eq!(next(&q).await, ("one", ms(2)));
        assert_eq!(q.num_requeues(&"one"), 2);

        q.add_rate_limited("two");
        assert_eq!(next(&q).await, ("two", ms(1)));
        q.add_rate_limited("two");
        assert_eq!(next(&q).await, ("two", ms(2)));

        q.forget(&"one");
        assert_eq!(q.num_requeues(&"one"), 0);
        q.add_rate_limited("one");
        assert_eq!(next(&q).await, ("one", ms(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn default_limiter_spaces_a_retry_storm_at_ten_per_second() {
        let q = RateLimitingQueue::new(default_controller_rate_limiter());
        let keys: Vec<String> = (0..110).map(|i| format!("ns/item-{i}")).collect();
        let start = Instant::now();
        for k in &keys {
            q.add_rate_limited(k.clone());
        }
        // The burst of 100 comes after the 5 ms per-item wait; the rest at 100 ms steps.
        let mut arrivals = Vec::new();
        for _ in 0..110 {
            let k = q.get().await.unwrap();
            arrivals.push(start.elapsed());
            q.done(&k);
        }
        assert!(
            arrivals[..100].iter().all(|&t| t == ms(5)),
            "{:?}",
            &arrivals[..100]
        );
        let rest: Vec<Duration> = arrivals[100..].to_vec();
        let want: Vec<Duration> = (1..=10).map(|i| ms(100 * i)).collect();
        assert_eq!(rest, want);
    }
}
