//! The reflector's backoff: apimachinery's `wait.Backoff{...}.DelayWithReset(clock, 2 min)`
//! (its backoff manager, `crate::backoff::DelayWithReset`) as client-go 1.36's reflector
//! configures it: 800 ms initial, factor 2, cap 30 s, jitter 1.0, reset every 2 min.
//!
//! What that means for the reflector (the rules themselves are `crate::backoff`'s):
//! - Each delay is the current base plus jitter: a random extra in `[0, jitter x base)`.
//!   The base doubles per delay until doubling would pass the cap; from then on the base is
//!   the cap, and jitter is still added *after* capping, so capped delays spread over
//!   `[30 s, 60 s)` and a fleet of clients that failed together does not retry in lockstep.
//! - The base goes back to `initial` when more than `reset_after` has passed since the
//!   last reset (or since the backoff was made), whatever happened in between. So even a
//!   LIST that fails forever comes back to short delays every 2 minutes, as in client-go;
//!   `reset_after` of zero resets on every delay.
//! - One backoff serves LIST and WATCH failures alike (what failed does not matter).
//!
//! Time comes from tokio so tests run paused.

use std::time::Duration;

use crate::backoff::{Backoff, DelayWithReset};

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

impl BackoffConfig {
    /// The running backoff: apimachinery's `Backoff{Duration: initial, Cap: max, Factor,
    /// Jitter}.DelayWithReset(clock, reset_after)`. Its steps never run out before the cap
    /// (client-go's reflector sets `Steps` to `ceil(max / initial)` for the same end), so the
    /// delays grow until they reach the cap, however slowly they grow; its reset clock starts
    /// now.
    pub(crate) fn delay_with_reset(&self) -> DelayWithReset {
        let backoff = Backoff {
            duration: self.initial,
            factor: self.factor,
            jitter: self.jitter,
            steps: u32::MAX,
            cap: Some(self.max),
        };
        DelayWithReset::new(backoff, self.reset_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // client-go: the values NewReflectorWithOptions passes to DelayWithReset.
    #[test]
    fn defaults_are_client_go_values() {
        let c = BackoffConfig::default();
        assert_eq!(c.initial, Duration::from_millis(800));
        assert_eq!(c.max, Duration::from_secs(30));
        assert_eq!(c.factor, 2.0);
        assert_eq!(c.jitter, 1.0);
        assert_eq!(c.reset_after, Duration::from_secs(120));
    }

    fn unit(reset_after: u64) -> DelayWithReset {
        (BackoffConfig {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            factor: 2.0,
            jitter: 0.0,
            reset_after: Duration::from_secs(reset_after),
        })
        .delay_with_reset()
    }

    fn secs(b: &mut DelayWithReset, n: usize) -> Vec<u64> {
        (0..n).map(|_| b.step().as_secs()).collect()
    }

    // apimachinery wait: TestBackoffDelayWithResetExponential
    #[tokio::test(start_paused = true)]
    async fn backoff_delay_with_reset_exponential() {
        let mut b = unit(10);
        assert_eq!(secs(&mut b, 7), [1, 2, 4, 8, 10, 10, 10]);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(b.step(), Duration::from_secs(1), "reset after 11 s");
    }

    // apimachinery wait: TestBackoffDelayWithResetEmpty
    #[tokio::test(start_paused = true)]
    async fn backoff_delay_with_reset_empty() {
        let mut b = unit(0);
        assert_eq!(secs(&mut b, 7), [1, 1, 1, 1, 1, 1, 1]);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(b.step(), Duration::from_secs(1));
    }

    // apimachinery wait: TestBackoffDelayWithResetJitter
    #[tokio::test(start_paused = true)]
    async fn backoff_delay_with_reset_jitter() {
        let mut b = BackoffConfig {
            initial: Duration::from_secs(1),
            factor: 0.0,
            jitter: 1.0,
            reset_after: Duration::ZERO,
            ..Default::default()
        }
        .delay_with_reset();
        for _ in 0..5 {
            let d = b.step();
            assert!(
                d >= Duration::from_secs(1) && d < Duration::from_secs(2),
                "{d:?}"
            );
        }
        let mut fixed = BackoffConfig {
            initial: Duration::from_secs(1),
            factor: 0.0,
            jitter: -1.0,
            reset_after: Duration::ZERO,
            ..Default::default()
        }
        .delay_with_reset();
        assert_eq!(fixed.step(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn client_go_sequence_grows_to_the_cap() {
        let mut b = BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        }
        .delay_with_reset();
        let ms: Vec<u128> = (0..8).map(|_| b.step().as_millis()).collect();
        assert_eq!(ms, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
    }

    // kubeloop's own: the reset runs on a clock of its own (2 min after the last reset),
    // not on quiet periods, so a LIST failing without pause still gets short delays again.
    #[tokio::test(start_paused = true)]
    async fn failing_without_pause_resets_every_two_minutes() {
        let mut b = BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        }
        .delay_with_reset();
        let mut elapsed = Duration::ZERO;
        let mut delays = Vec::new();
        while elapsed <= Duration::from_secs(250) {
            let d = b.step();
            delays.push((elapsed.as_secs(), d.as_millis()));
            tokio::time::advance(d).await;
            elapsed += d;
        }
        // 0.8+1.6+3.2+6.4+12.8+25.6 = 50.4 s, then 30 s steps: 80.4, 110.4, 140.4 (> 120 s
        // since the start: reset), ...
        let resets: Vec<u64> = delays
            .iter()
            .skip(1)
            .filter(|(_, ms)| *ms == 800)
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(resets, [140], "{delays:?}");
    }

    // kubeloop's own: jitter comes after the cap, as apimachinery's `delay` applies it, so
    // capped delays spread over [cap, 2 x cap) instead of all being the cap.
    #[tokio::test(start_paused = true)]
    async fn jitter_is_applied_after_the_cap() {
        let mut b = BackoffConfig::default().delay_with_reset();
        let first = b.step();
        assert!(first >= Duration::from_millis(800) && first < Duration::from_millis(1600));
        for _ in 0..6 {
            b.step();
        }
        let capped: Vec<Duration> = (0..20).map(|_| b.step()).collect();
        assert!(
            capped
                .iter()
                .all(|d| *d >= Duration::from_secs(30) && *d < Duration::from_secs(60)),
            "{capped:?}"
        );
        assert!(
            capped.iter().any(|d| *d > Duration::from_secs(30)),
            "no jitter above the cap: {capped:?}"
        );
    }
}
