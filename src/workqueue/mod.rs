//! client-go's `util/workqueue`: dedup queue, delaying queue, rate limiters, rate-limiting queue.
