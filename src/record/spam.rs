//! The spam filter both recorders share: a token bucket per key (a reporting source and the
//! object its events are about). client-go: `tools/record/events_cache.go`'s
//! `EventSourceObjectSpamFilter` (defaults: burst 25, one token per 5 minutes, an LRU of 4096
//! buckets); client-go's `tools/events` has none, `record/series.rs` carries it over.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Token buckets by key, at most `capacity` of them (the least recently used is forgotten,
/// which refills it).
#[derive(Debug)]
pub(super) struct SpamFilter {
    buckets: HashMap<String, Bucket>,
    burst: f64,
    refill: Duration,
    capacity: usize,
    tick: u64,
}

#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    refilled_at: Instant,
    used: u64,
}

impl SpamFilter {
    /// Buckets of `burst` tokens, each refilled one token per `refill`, at most `capacity`.
    pub(super) fn new(burst: u32, refill: Duration, capacity: usize) -> Self {
        SpamFilter {
            buckets: HashMap::new(),
            burst: f64::from(burst.max(1)),
            refill,
            capacity: capacity.max(1),
            tick: 0,
        }
    }

    /// Takes a token from `key`'s bucket at `now`; false when it is empty.
    pub(super) fn allow(&mut self, key: String, now: Instant) -> bool {
        self.tick += 1;
        let per_token = self.refill.as_secs_f64();
        if !self.buckets.contains_key(&key) && self.buckets.len() >= self.capacity {
            evict_oldest(&mut self.buckets, |b| b.used);
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            refilled_at: now,
            used: self.tick,
        });
        bucket.used = self.tick;
        if per_token > 0.0 {
            let elapsed = now
                .saturating_duration_since(bucket.refilled_at)
                .as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed / per_token).min(self.burst);
        } else {
            bucket.tokens = self.burst;
        }
        bucket.refilled_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Removes the entry of `map` with the smallest `used`.
pub(super) fn evict_oldest<V>(map: &mut HashMap<String, V>, used: impl Fn(&V) -> u64) {
    if let Some(oldest) = map
        .iter()
        .min_by_key(|(_, v)| used(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}
