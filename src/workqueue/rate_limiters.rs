//! How long an item should wait before it is retried. client-go counterpart:
//! `util/workqueue/default_rate_limiters.go`.
//!
//! Behaviour kept from client-go:
//! - [`ItemExponentialFailureRateLimiter`]: `base * 2^failures`, capped at `max` (and at `max`
//!   when the product would overflow); `forget` resets the item.
//! - [`BucketRateLimiter`]: one token bucket for all items; a request that finds the bucket
//!   empty still reserves the next token and is told how long until it is due, like
//!   `rate.Limiter.Reserve().Delay()`. The bucket starts full.
//! - [`ItemFastSlowRateLimiter`]: `fast` for the first `max_fast_attempts` tries, then `slow`.
//! - [`MaxOfRateLimiter`]: asks every limiter (each one counts the try) and returns the
//!   longest wait; `num_requeues` is the largest count; `forget` forgets everywhere.
//! - [`WithMaxWaitRateLimiter`]: caps another limiter's answer.
//! - [`default_controller_rate_limiter`]: max(exponential 5 ms..1000 s, bucket 10 qps burst
//!   100); [`sample_controller_rate_limiter`]: the same with a 50 qps burst 300 bucket.
//!
//! What differs on purpose:
//! - The token bucket is governor's GCRA. governor has no "reserve into debt" call, so the
//!   bucket runs on a clock we set: at `now`, or, when the bucket is empty, at the earliest time
//!   governor names, which consumes that future token exactly as a Go reservation would.
//! - Times come from `tokio::time::Instant`, so limiters run on paused time in tests.
//!
//! Invariant: every per-item limiter keeps an entry for an item from its first `when` until
//! `forget`; callers must `forget` finished items (as in client-go) or the map grows.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::Quota;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use hashbrown::HashMap;
use parking_lot::Mutex;
use tokio::time::Instant;

/// Decides how long an item waits before it is added again. client-go: `TypedRateLimiter`.
pub trait RateLimiter<T>: Send + Sync {
    /// How long `item` should wait now; counts one more try for per-item limiters.
    fn when(&self, item: &T) -> Duration;
    /// Stops tracking `item` (it succeeded, or was given up on).
    fn forget(&self, item: &T);
    /// How many times `item` has been asked about since it was last forgotten.
    fn num_requeues(&self, item: &T) -> u32;
}

/// A rate limiter was configured with numbers it cannot work with.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RateLimiterError {
    /// The bucket's refill rate is not a positive, finite number of tokens per second.
    #[error("bucket rate limiter: qps must be a positive finite number, got {qps}")]
    InvalidQps {
        /// The rate given.
        qps: f64,
    },
    /// The bucket must hold at least one token.
    #[error("bucket rate limiter: burst must be at least 1, got 0")]
    ZeroBurst,
    /// One token per interval shorter than a nanosecond cannot be represented.
    #[error("bucket rate limiter: qps {qps} is above one token per nanosecond")]
    QpsTooHigh {
        /// The rate given.
        qps: f64,
    },
}

/// `base * 2^failures`, capped at `max`. client-go: `TypedItemExponentialFailureRateLimiter`.
#[derive(Debug)]
pub struct ItemExponentialFailureRateLimiter<T> {
    failures: Mutex<HashMap<T, u32>>,
    base: Duration,
    max: Duration,
}

/// A token bucket shared by all items. client-go: `TypedBucketRateLimiter` over
/// `golang.org/x/time/rate`.
pub struct BucketRateLimiter {
    bucket: Mutex<Bucket>,
}

struct Bucket {
    limiter: governor::RateLimiter<NotKeyed, InMemoryState, SetClock, NoOpMiddleware<Duration>>,
    clock: SetClock,
    /// The instant `clock` reads as zero.
    origin: Instant,
}

/// A governor clock that reads whatever it was last set to (time since the bucket's origin).
#[derive(Clone, Debug, Default)]
struct SetClock(Arc<AtomicU64>);

/// `fast` for the first `max_fast_attempts` tries of an item, `slow` after.
/// client-go: `TypedItemFastSlowRateLimiter`.
#[derive(Debug)]
pub struct ItemFastSlowRateLimiter<T> {
    failures: Mutex<HashMap<T, u32>>,
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
}

/// The longest wait any of its limiters asks for. client-go: `TypedMaxOfRateLimiter`.
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

/// Another limiter's answer, capped at `max`. client-go: `TypedWithMaxWaitRateLimiter`.
#[derive(Debug)]
pub struct WithMaxWaitRateLimiter<L> {
    limiter: L,
    max: Duration,
}

/// client-go's `DefaultTypedControllerRateLimiter`: per item 5 ms doubling up to 1000 s, and
/// overall 10 retries per second with bursts of 100.
pub fn default_controller_rate_limiter<T: Hash + Eq + Clone + Send + 'static>()
-> MaxOfRateLimiter<T> {
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(BucketRateLimiter::with_quota(
            Quota::per_second(nonzero(10)).allow_burst(nonzero(100)),
        )),
    ])
}

/// sample-controller's limiter: per item 5 ms doubling up to 1000 s, and overall 50 retries per
/// second with bursts of 300.
pub fn sample_controller_rate_limiter<T: Hash + Eq + Clone + Send + 'static>() -> MaxOfRateLimiter<T>
{
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(BucketRateLimiter::with_quota(
            Quota::per_second(nonzero(50)).allow_burst(nonzero(300)),
        )),
    ])
}

/// client-go's `DefaultTypedItemBasedRateLimiter`: per item 1 ms doubling up to 1000 s.
pub fn default_item_based_rate_limiter<T: Hash + Eq + Clone + Send>()
-> ItemExponentialFailureRateLimiter<T> {
    ItemExponentialFailureRateLimiter::new(Duration::from_millis(1), Duration::from_secs(1000))
}

const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("zero"),
    }
}

impl<T: Hash + Eq + Clone + Send> ItemExponentialFailureRateLimiter<T> {
    /// Waits `base * 2^(failures - 1)`, at most `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemExponentialFailureRateLimiter {
            failures: Mutex::new(HashMap::new()),
            base,
            max,
        }
    }
}

impl<T: Hash + Eq + Clone + Send> RateLimiter<T> for ItemExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let exp = count_failure(&self.failures, item) - 1;
        // base * 2^exp in u128 nanoseconds cannot overflow for exp < 64; beyond that (or past
        // `max`) the answer is `max`, as client-go's float overflow check gives.
        if exp >= 64 {
            return self.max;
        }
        let backoff = self.base.as_nanos() << exp;
        if backoff > self.max.as_nanos() {
            return self.max;
        }
        Duration::from_nanos(backoff as u64)
    }

    fn forget(&self, item: &T) {
        self.failures.lock().remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.lock().get(item).copied().unwrap_or(0)
    }
}

/// Counts one more failure of `item` and returns the new count.
fn count_failure<T: Hash + Eq + Clone>(failures: &Mutex<HashMap<T, u32>>, item: &T) -> u32 {
    let mut failures = failures.lock();
    if let Some(n) = failures.get_mut(item) {
        *n = n.saturating_add(1);
        return *n;
    }
    failures.insert(item.clone(), 1);
    1
}

impl BucketRateLimiter {
    /// A bucket refilled at `qps` tokens per second holding at most `burst` (and starting
    /// full). client-go: `&TypedBucketRateLimiter{Limiter: rate.NewLimiter(qps, burst)}`.
    pub fn new(qps: f64, burst: u32) -> Result<Self, RateLimiterError> {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(RateLimiterError::InvalidQps { qps });
        }
        let burst = NonZeroU32::new(burst).ok_or(RateLimiterError::ZeroBurst)?;
        let period = Duration::try_from_secs_f64(1.0 / qps)
            .map_err(|_| RateLimiterError::InvalidQps { qps })?;
        let quota = Quota::with_period(period).ok_or(RateLimiterError::QpsTooHigh { qps })?;
        Ok(BucketRateLimiter::with_quota(quota.allow_burst(burst)))
    }

    fn with_quota(quota: Quota) -> Self {
        let clock = SetClock::default();
        let limiter = governor::RateLimiter::direct_with_clock(quota, clock.clone());
        BucketRateLimiter {
            bucket: Mutex::new(Bucket {
                limiter,
                clock,
                origin: Instant::now(),
            }),
        }
    }

    /// Takes a token now, or reserves the next free one; returns the wait until it is due.
    fn reserve(&self) -> Duration {
        let bucket = self.bucket.lock();
        let now = Instant::now().saturating_duration_since(bucket.origin);
        bucket.clock.set(now);
        match bucket.limiter.check() {
            Ok(()) => Duration::ZERO,
            Err(not_until) => {
                // Take the token at the time governor says it frees up: that books it, and the
                // next caller queues behind it.
                let due = not_until.earliest_possible();
                bucket.clock.set(due);
                let booked = bucket.limiter.check();
                debug_assert!(booked.is_ok(), "governor refused at its own earliest time");
                due.saturating_sub(now)
            }
        }
    }
}

impl std::fmt::Debug for BucketRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketRateLimiter").finish_non_exhaustive()
    }
}

impl<T> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        self.reserve()
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

impl SetClock {
    fn set(&self, since_origin: Duration) {
        self.0.store(
            u64::try_from(since_origin.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

impl Clock for SetClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

impl<T: Hash + Eq + Clone + Send> ItemFastSlowRateLimiter<T> {
    /// Waits `fast` for the first `max_fast_attempts` failures of an item, then `slow`.
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        ItemFastSlowRateLimiter {
            failures: Mutex::new(HashMap::new()),
            fast,
            slow,
            max_fast_attempts,
        }
    }
}

impl<T: Hash + Eq + Clone + Send> RateLimiter<T> for ItemFastSlowRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        if count_failure(&self.failures, item) <= self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, item: &T) {
        self.failures.lock().remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.lock().get(item).copied().unwrap_or(0)
    }
}

impl<T> MaxOfRateLimiter<T> {
    /// Waits the longest of what `limiters` say.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        MaxOfRateLimiter { limiters }
    }
}

impl<T> std::fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        // Every limiter is asked (each counts the try), not just until one says "long".
        self.limiters
            .iter()
            .map(|l| l.when(item))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, item: &T) {
        for l in &self.limiters {
            l.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

impl<L> WithMaxWaitRateLimiter<L> {
    /// Waits what `limiter` says, at most `max`.
    pub fn new(limiter: L, max: Duration) -> Self {
        WithMaxWaitRateLimiter { limiter, max }
    }
}

impl<T, L: RateLimiter<T>> RateLimiter<T> for WithMaxWaitRateLimiter<L> {
    fn when(&self, item: &T) -> Duration {
        self.limiter.when(item).min(self.max)
    }

    fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item)
    }

    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Arc<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item)
    }

    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // client-go: TestItemExponentialFailureRateLimiter
    #[test]
    fn exponential_doubles_per_item_and_forget_resets() {
        let l = ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1));
        for want in [1, 2, 4, 8, 16] {
            assert_eq!(l.when(&"one"), ms(want));
        }
        assert_eq!(l.num_requeues(&"one"), 5);
        assert_eq!(l.when(&"two"), ms(1));
        assert_eq!(l.when(&"two"), ms(2));
        assert_eq!(l.num_requeues(&"two"), 2);
        l.forget(&"one");
        assert_eq!(l.num_requeues(&"one"), 0);
        assert_eq!(l.when(&"one"), ms(1));
    }

    // client-go: TestItemExponentialFailureRateLimiterOverFlow
    #[test]
    fn exponential_caps_at_max_without_overflowing() {
        let l = ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1000));
        for _ in 0..5 {
            l.when(&"one");
        }
        assert_eq!(l.when(&"one"), ms(32));
        for _ in 0..1000 {
            l.when(&"overflow1");
        }
        assert_eq!(l.when(&"overflow1"), Duration::from_secs(1000));

        let l = ItemExponentialFailureRateLimiter::new(
            Duration::from_secs(60),
            Duration::from_secs(1000 * 3600),
        );
        for _ in 0..2 {
            l.when(&"two");
        }
        assert_eq!(l.when(&"two"), Duration::from_secs(4 * 60));
        for _ in 0..1000 {
            l.when(&"overflow2");
        }
        assert_eq!(l.when(&"overflow2"), Duration::from_secs(1000 * 3600));
    }

    // client-go: TestItemFastSlowRateLimiter
    #[test]
    fn fast_slow_switches_after_max_fast_attempts() {
        let l = ItemFastSlowRateLimiter::new(ms(5), Duration::from_secs(10), 3);
        for want in [
            ms(5),
            ms(5),
            ms(5),
            Duration::from_secs(10),
            Duration::from_secs(10),
        ] {
            assert_eq!(l.when(&"one"), want);
        }
        assert_eq!(l.num_requeues(&"one"), 5);
        assert_eq!(l.when(&"two"), ms(5));
        assert_eq!(l.when(&"two"), ms(5));
        assert_eq!(l.num_requeues(&"two"), 2);
        l.forget(&"one");
        assert_eq!(l.num_requeues(&"one"), 0);
        assert_eq!(l.when(&"one"), ms(5));
    }

    // client-go: TestMaxOfRateLimiter
    #[test]
    fn max_of_returns_the_longest_wait() {
        let l: MaxOfRateLimiter<&str> = MaxOfRateLimiter::new(vec![
            Box::new(ItemFastSlowRateLimiter::new(
                ms(5),
                Duration::from_secs(3),
                3,
            )),
            Box::new(ItemExponentialFailureRateLimiter::new(
                ms(1),
                Duration::from_secs(1),
            )),
        ]);
        for want in [
            ms(5),
            ms(5),
            ms(5),
            Duration::from_secs(3),
            Duration::from_secs(3),
        ] {
            assert_eq!(l.when(&"one"), want);
        }
        assert_eq!(l.num_requeues(&"one"), 5);
        assert_eq!(l.when(&"two"), ms(5));
        assert_eq!(l.when(&"two"), ms(5));
        assert_eq!(l.num_requeues(&"two"), 2);
        l.forget(&"one");
        assert_eq!(l.num_requeues(&"one"), 0);
        assert_eq!(l.when(&"one"), ms(5));
    }

    /// client-go's test helper `StepRateLimiter`: `base` for the first `threshold` calls
    /// overall, then `max`.
    struct StepRateLimiter {
        count: Mutex<u32>,
        threshold: u32,
        base: Duration,
        max: Duration,
    }

    impl RateLimiter<u32> for StepRateLimiter {
        fn when(&self, _: &u32) -> Duration {
            let mut count = self.count.lock();
            *count += 1;
            if *count <= self.threshold {
                self.base
            } else {
                self.max
            }
        }
        fn forget(&self, _: &u32) {}
        fn num_requeues(&self, _: &u32) -> u32 {
            0
        }
    }

    // client-go: TestWithMaxWaitRateLimiter
    #[test]
    fn with_max_wait_caps_the_inner_limiter() {
        let step = StepRateLimiter {
            count: Mutex::new(0),
            threshold: 100,
            base: ms(5),
            max: Duration::from_secs(1000),
        };
        let l = WithMaxWaitRateLimiter::new(step, Duration::from_secs(500));
        for i in 0..100 {
            assert_eq!(l.when(&i), ms(5));
        }
        for i in 100..200 {
            assert_eq!(l.when(&i), Duration::from_secs(500));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_lets_a_burst_through_then_reserves_future_tokens() {
        let l = BucketRateLimiter::new(10.0, 100).unwrap();
        for i in 0..100 {
            assert_eq!(
                RateLimiter::<()>::when(&l, &()),
                Duration::ZERO,
                "burst token {i}"
            );
        }
        // An empty bucket still books the next token: waits grow by 1/qps per request.
        assert_eq!(RateLimiter::<()>::when(&l, &()), ms(100));
        assert_eq!(RateLimiter::<()>::when(&l, &()), ms(200));
        assert_eq!(RateLimiter::<()>::when(&l, &()), ms(300));
        // Time passing pays the debt down.
        tokio::time::advance(ms(250)).await;
        assert_eq!(RateLimiter::<()>::when(&l, &()), ms(150));
        tokio::time::advance(Duration::from_secs(60)).await;
        // A minute refills the bucket completely (and no further).
        for _ in 0..100 {
            assert_eq!(RateLimiter::<()>::when(&l, &()), Duration::ZERO);
        }
        assert_eq!(RateLimiter::<()>::when(&l, &()), ms(100));
    }

    #[tokio::test(start_paused = true)]
    async fn default_controller_limiter_has_client_go_numbers() {
        let l = default_controller_rate_limiter::<String>();
        // Per item: 5 ms doubling.
        let key = "default/web".to_string();
        for want in [5, 10, 20, 40, 80] {
            assert_eq!(l.when(&key), ms(want));
        }
        assert_eq!(l.num_requeues(&key), 5);
        l.forget(&key);
        assert_eq!(l.num_requeues(&key), 0);
        // Overall: 100 - 5 tokens left of the burst, then 10 per second.
        for i in 0..95 {
            assert_eq!(l.when(&format!("k{i}")), ms(5));
        }
        assert_eq!(l.when(&"next".to_string()), ms(100));
        assert_eq!(l.when(&"after".to_string()), ms(200));
        // The per-item cap: 5 ms * 2^n stops at 1000 s.
        let hot = "hot".to_string();
        let mut last = Duration::ZERO;
        for _ in 0..40 {
            last = l.when(&hot);
        }
        assert_eq!(last, Duration::from_secs(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn sample_controller_limiter_has_its_numbers() {
        let l = sample_controller_rate_limiter::<u32>();
        for i in 0..300 {
            assert_eq!(l.when(&i), ms(5));
        }
        assert_eq!(l.when(&1000), ms(20));
        assert_eq!(l.when(&1001), ms(40));
        // Item 0's second try: 10 ms per item, but the bucket now books 60 ms out.
        assert_eq!(l.when(&0), ms(60));
        assert_eq!(l.num_requeues(&0), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn default_item_based_limiter_starts_at_one_millisecond() {
        let l = default_item_based_rate_limiter::<u8>();
        assert_eq!(l.when(&1), ms(1));
        assert_eq!(l.when(&1), ms(2));
    }

    #[test]
    fn bucket_rejects_bad_numbers_with_a_clear_error() {
        assert_eq!(
            BucketRateLimiter::new(0.0, 10).unwrap_err(),
            RateLimiterError::InvalidQps { qps: 0.0 }
        );
        assert!(matches!(
            BucketRateLimiter::new(f64::NAN, 10),
            Err(RateLimiterError::InvalidQps { .. })
        ));
        assert_eq!(
            BucketRateLimiter::new(-1.0, 10).unwrap_err(),
            RateLimiterError::InvalidQps { qps: -1.0 }
        );
        assert_eq!(
            BucketRateLimiter::new(5.0, 0).unwrap_err(),
            RateLimiterError::ZeroBurst
        );
        assert_eq!(
            BucketRateLimiter::new(1e12, 1).unwrap_err(),
            RateLimiterError::QpsTooHigh { qps: 1e12 }
        );
        let err = BucketRateLimiter::new(0.0, 10).unwrap_err().to_string();
        assert!(err.contains("qps") && err.contains('0'), "{err}");
    }
}
