//! The reflector's backoff: apimachinery `wait.NewExponentialBackoffManager` as client-go's
//! reflector configures it (800 ms initial, factor 2, cap 30 s, jitter 1.0, reset after 2 min).
//!
//! The delay grows with every consecutive failure, whatever failed (LIST or WATCH), and only
//! resets when `reset_after` has passed since the previous backoff. That is the difference
//! from kube-rs's watcher, whose backoff resets on every `Init` event so a LIST that keeps
//! failing retries every 0.8 s forever.
//!
//! Differs on purpose: the jittered delay never exceeds `max` (client-go's can reach 2 x cap
//! because jitter is applied after capping). Time comes from tokio so tests run paused.

use std::time::Duration;

use tokio::time::Instant;

/// Backoff parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffConfig {
    /// First delay. client-go: 800 ms.
    pub initial: Duration,
    /// Upper bound of any delay. client-go: 30 s.
    pub max: Duration,
    /// Growth per consecutive failure. client-go: 2.0.
    pub factor: f64,
    /// Random extra of up to `jitter * delay`. client-go: 1.0.
    pub jitter: f64,
    /// A backoff this long after the previous one starts again at `initial`. client-go: 2 min.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 1.0,
            reset_after: Duration::from_secs(120),
        }
    }
}

/// The running state of an exponential backoff.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    /// The un-jittered delay the next failure gets.
    next: Duration,
    /// When the previous delay was handed out.
    last: Option<Instant>,
}

impl Backoff {
    /// A fresh backoff.
    pub fn new(config: BackoffConfig) -> Self {
        let next = config.initial;
        Self {
            config,
            next,
            last: None,
        }
    }

    /// The delay for a failure now; grows the next one.
    pub fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if let Some(last) = self.last
            && now.duration_since(last) >= self.config.reset_after
        {
            self.next = self.config.initial;
        }
        self.last = Some(now);
        let base = self.next.min(self.config.max);
        self.next = base
            .mul_f64(self.config.factor.max(1.0))
            .min(self.config.max);
        let extra = if self.config.jitter > 0.0 {
            base.mul_f64(self.config.jitter * rand::random::<f64>())
        } else {
            Duration::ZERO
        };
        (base + extra).min(self.config.max)
    }

    /// Forgets past failures.
    pub fn reset(&mut self) {
        self.next = self.config.initial;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // client-go: the values NewReflectorWithOptions passes to NewExponentialBackoffManager.
    #[test]
    fn defaults_are_client_go_values() {
        let c = BackoffConfig::default();
        assert_eq!(c.initial, Duration::from_millis(800));
        assert_eq!(c.max, Duration::from_secs(30));
        assert_eq!(c.factor, 2.0);
        assert_eq!(c.jitter, 1.0);
        assert_eq!(c.reset_after, Duration::from_secs(120));
    }

    #[tokio::test(start_paused = true)]
    async fn grows_to_the_cap_and_resets_after_a_quiet_period() {
        let mut b = Backoff::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let ms: Vec<u128> = (0..8)
            .map(|_| {
                let d = b.next_delay();
                d.as_millis()
            })
            .collect();
        assert_eq!(ms, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        tokio::time::advance(Duration::from_secs(119)).await;
        assert_eq!(
            b.next_delay(),
            Duration::from_secs(30),
            "not quiet long enough"
        );
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(b.next_delay(), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_base_and_cap() {
        let mut b = Backoff::new(BackoffConfig::default());
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(800) && first <= Duration::from_millis(1600));
        for _ in 0..20 {
            assert!(b.next_delay() <= Duration::from_secs(30));
        }
    }
}
