//! A small, bounded cache of authentication and authorization decisions, each kept for its own
//! time to live.
//!
//! Counterpart: k8s.io/apiserver's `pkg/authentication/token/cache` (TokenReview results) and
//! the `cache.LRUExpireCache` in `pkg/authorization/authorizerfactory`'s webhook authorizer
//! (SubjectAccessReview results), which controller-runtime's `pkg/metrics/filters` configures.
//!
//! Differences on purpose: when full, expired entries are dropped and, if none was, the new
//! decision is simply not cached (no LRU bookkeeping): a flood of distinct bogus tokens then
//! costs TokenReviews, never memory, and decisions already cached keep serving.
//!
//! Invariants: an entry is returned only before its deadline; the map never holds more than
//! `capacity` entries. Time is tokio's, so tests run on paused time.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Decisions keyed by `K`, each valid until its own deadline.
#[derive(Debug)]
pub struct DecisionCache<K, V> {
    capacity: usize,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Hash + Eq, V: Clone> DecisionCache<K, V> {
    /// An empty cache of at most `capacity` decisions.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The decision cached for `key`, unless it has expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut entries = self.entries.lock();
        match entries.get(key) {
            Some((value, deadline)) if Instant::now() < *deadline => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `ttl`. When the cache is full, expired entries make room; if none had
    /// expired, the decision is not kept.
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, deadline)| now < *deadline);
            if entries.len() >= self.capacity {
                return;
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    /// How many decisions are held, expired or not.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether no decision is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // apiserver: TestCachedTokenAuthenticator (pkg/authentication/token/cache): a result is
    // served from the cache until its TTL, then asked again.
    #[tokio::test(start_paused = true)]
    async fn a_decision_is_served_until_its_ttl_and_not_after() {
        let cache = DecisionCache::new(8);
        cache.insert("token-a", true, Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(cache.get(&"token-a"), Some(true));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&"token-a"), None, "expired at 60 s");
        assert!(cache.is_empty(), "an expired entry read is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn allowed_and_denied_decisions_keep_their_own_ttls() {
        let cache = DecisionCache::new(8);
        cache.insert(("alice", "/metrics"), true, Duration::from_secs(300));
        cache.insert(("bob", "/metrics"), false, Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(cache.get(&("bob", "/metrics")), None, "a denial lasts 30 s");
        assert_eq!(cache.get(&("alice", "/metrics")), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_expired_entries_then_refuses_new_ones() {
        let cache = DecisionCache::new(2);
        cache.insert(1, 'a', Duration::from_secs(10));
        cache.insert(2, 'b', Duration::from_secs(100));
        tokio::time::advance(Duration::from_secs(11)).await;
        cache.insert(3, 'c', Duration::from_secs(100));
        assert_eq!((cache.get(&2), cache.get(&3)), (Some('b'), Some('c')));
        assert_eq!(cache.len(), 2, "1 expired and made room");

        cache.insert(4, 'd', Duration::from_secs(100));
        assert_eq!(cache.get(&4), None, "full of live decisions: not kept");
        assert_eq!((cache.get(&2), cache.get(&3)), (Some('b'), Some('c')));
        cache.insert(2, 'B', Duration::from_secs(100));
        assert_eq!(
            cache.get(&2),
            Some('B'),
            "a held key is refreshed even when full"
        );
    }
}
