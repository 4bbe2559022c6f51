//! Backoff and jitter, written once: apimachinery's `pkg/util/wait` (`backoff.go`: `Backoff`,
//! `Backoff.Step`, `Backoff.DelayWithReset`; `jitter.go`: `Jitter`).
//!
//! Every wait between attempts in the library comes from here: the runtime's conflict retries
//! (`runtime/retry.rs`, client-go's `util/retry`), the reflector's backoff after a failed LIST or
//! watch and its randomised watch timeout (`cache/backoff.rs`, `cache/reflector.rs`), the
//! elector's jittered retry period (`leaderelection/elector.rs`) and the ops server's accept
//! backoff (`ops/limits.rs`). It is a leaf: it imports nothing of the crate, so every layer can
//! use it.
//!
//! The rules, as apimachinery has them:
//! - [`Backoff::step`] returns the current `duration` (plus jitter) and moves `duration` on by
//!   `factor`, while `steps` last. When the next duration would pass `cap`, it becomes the cap
//!   and `steps` drops to 0: from then on every step returns the cap (plus jitter). Jitter is
//!   added *after* capping, so capped waits spread over `[cap, cap x (1 + jitter))` and clients
//!   that failed together do not retry in lockstep.
//! - [`jitter`] lengthens a wait by a random fraction of itself, up to `max_factor`.
//! - [`DelayWithReset`] starts a [`Backoff`] again from its first value when more than the
//!   reset interval has passed since it last did (whatever happened in between), or on every
//!   step when the interval is zero.
//!
//! Differs on purpose: `cap` is an `Option` (apimachinery's zero `Cap` is `None`), and a
//! `factor` of zero or below leaves the duration as it is (a Rust `Duration` cannot be
//! negative; apimachinery only tests `factor != 0`). Time comes from tokio, so tests run on
//! paused time.

use std::time::Duration;

use tokio::time::Instant;

/// The waits between attempts: the first is `duration`, each next one `factor` times the one
/// before, at most `cap`, each lengthened by up to `jitter` of itself. apimachinery:
/// `wait.Backoff`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The next wait, before jitter.
    pub duration: Duration,
    /// Each wait is the previous one times this; 0 (or less) keeps them all at `duration`.
    pub factor: f64,
    /// Each wait is lengthened by a random fraction of itself in `[0, jitter)`; 0 (or less)
    /// adds none.
    pub jitter: f64,
    /// How many more times `duration` moves on by `factor`; at 0, every step returns
    /// `duration`. Callers that count attempts (the retries) stop at `steps` attempts.
    pub steps: u32,
    /// The largest wait before jitter: when `duration` would pass it, it becomes the cap and
    /// `steps` drops to 0. `None`: no cap.
    pub cap: Option<Duration>,
}

impl Backoff {
    /// The wait for this step, and the backoff moved on to the next. apimachinery:
    /// `Backoff.Step`.
    pub fn step(&mut self) -> Duration {
        if self.steps < 1 {
            return self.jittered(self.duration);
        }
        self.steps -= 1;
        let duration = self.duration;
        if self.factor > 0.0 {
            self.duration = duration.mul_f64(self.factor);
            if let Some(cap) = self.cap
                && self.duration > cap
            {
                self.duration = cap;
                self.steps = 0;
            }
        }
        self.jittered(duration)
    }

    /// `duration` plus this backoff's jitter, if it has any.
    fn jittered(&self, duration: Duration) -> Duration {
        if self.jitter > 0.0 {
            jitter(duration, self.jitter)
        } else {
            duration
        }
    }
}

/// `duration` lengthened by a random fraction of itself in `[0, max_factor)`; a `max_factor`
/// of 0 or below means 1.0. apimachinery: `wait.Jitter`.
pub fn jitter(duration: Duration, max_factor: f64) -> Duration {
    let max_factor = if max_factor <= 0.0 { 1.0 } else { max_factor };
    duration + duration.mul_f64(rand::random::<f64>() * max_factor)
}

/// A [`Backoff`] that starts again from its first value `reset_interval` after it last did.
/// apimachinery: `Backoff.DelayWithReset` (its `backoffManager`), as client-go's reflector uses
/// it.
#[derive(Debug)]
pub struct DelayWithReset {
    /// The backoff as it was made, restored on each reset.
    initial: Backoff,
    /// The running backoff.
    backoff: Backoff,
    /// Zero: reset on every step.
    reset_interval: Duration,
    /// When the backoff was last reset (or made).
    last_start: Instant,
}

impl DelayWithReset {
    /// A backoff whose reset clock starts now.
    pub fn new(backoff: Backoff, reset_interval: Duration) -> Self {
        Self {
            initial: backoff,
            backoff,
            reset_interval,
            last_start: Instant::now(),
        }
    }

    /// The wait for a failure now. apimachinery: `backoffManager.Step`.
    pub fn step(&mut self) -> Duration {
        let now = Instant::now();
        if self.reset_interval.is_zero() {
            self.backoff = self.initial;
        } else if now.duration_since(self.last_start) > self.reset_interval {
            self.backoff = self.initial;
            self.last_start = now;
        }
        self.backoff.step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn exponential() -> Backoff {
        Backoff {
            duration: secs(1),
            factor: 2.0,
            jitter: 0.0,
            steps: 10,
            cap: Some(secs(10)),
        }
    }

    // apimachinery wait: TestBackoff_Step
    #[test]
    fn steps_grow_by_the_factor_up_to_the_cap_and_stay_there() {
        let mut b = exponential();
        let waits: Vec<u64> = (0..7).map(|_| b.step().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10]);
        assert_eq!(b.steps, 0, "reaching the cap ends the steps");
    }

    #[test]
    fn without_steps_every_wait_is_the_duration() {
        let mut b = Backoff {
            steps: 0,
            ..exponential()
        };
        let waits: Vec<u64> = (0..3).map(|_| b.step().as_secs()).collect();
        assert_eq!(waits, [1, 1, 1]);

        let mut b = Backoff {
            steps: 2,
            cap: None,
            ..exponential()
        };
        let waits: Vec<u64> = (0..4).map(|_| b.step().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 4], "the steps run out before any cap");
    }

    #[test]
    fn a_factor_of_zero_or_below_keeps_the_duration() {
        for factor in [0.0, -1.0] {
            let mut b = Backoff {
                factor,
                ..exponential()
            };
            let waits: Vec<u64> = (0..3).map(|_| b.step().as_secs()).collect();
            assert_eq!(waits, [1, 1, 1], "factor {factor}");
        }
    }

    #[test]
    fn jitter_comes_after_the_cap() {
        let mut b = Backoff {
            jitter: 1.0,
            ..exponential()
        };
        for _ in 0..4 {
            b.step();
        }
        let capped: Vec<Duration> = (0..20).map(|_| b.step()).collect();
        assert!(
            capped.iter().all(|d| *d >= secs(10) && *d < secs(20)),
            "{capped:?}"
        );
        assert!(
            capped.iter().any(|d| *d > secs(10)),
            "no jitter above the cap: {capped:?}"
        );
    }

    // apimachinery wait: TestJitter
    #[test]
    fn jitter_lengthens_by_up_to_the_factor_and_a_factor_of_zero_means_one() {
        for _ in 0..1000 {
            let d = jitter(secs(1), 0.5);
            assert!(d >= secs(1) && d < Duration::from_millis(1500), "{d:?}");
            let d = jitter(secs(1), 0.0);
            assert!(d >= secs(1) && d < secs(2), "{d:?}");
        }
        assert!(
            (0..100).any(|_| jitter(secs(1), 0.0) >= Duration::from_millis(1500)),
            "a factor of 0 jitters as 1.0"
        );
    }

    // apimachinery wait: TestBackoffDelayWithResetExponential
    #[tokio::test(start_paused = true)]
    async fn delay_with_reset_starts_again_after_the_interval() {
        let mut b = DelayWithReset::new(exponential(), secs(10));
        let waits: Vec<u64> = (0..7).map(|_| b.step().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10]);
        tokio::time::advance(secs(11)).await;
        assert_eq!(b.step(), secs(1), "reset after 11 s");
        assert_eq!(b.step(), secs(2), "and grows again");
    }

    // apimachinery wait: TestBackoffDelayWithResetEmpty
    #[tokio::test(start_paused = true)]
    async fn delay_with_a_zero_reset_interval_resets_on_every_step() {
        let mut b = DelayWithReset::new(exponential(), Duration::ZERO);
        let waits: Vec<u64> = (0..7).map(|_| b.step().as_secs()).collect();
        assert_eq!(waits, [1, 1, 1, 1, 1, 1, 1]);
    }
}
