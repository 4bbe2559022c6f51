//! Retrying a write that lost a race: client-go's `util/retry` (`RetryOnConflict`, `OnError`,
//! `DefaultRetry`, `DefaultBackoff`), the one conflict loop both controllers use.
//!
//! A write carrying a resourceVersion fails with 409 Conflict when the object changed since it
//! was read; the fix is to read the object again, recompute the change and send it again, a
//! few times, with a short pause between tries. [`retry_on_conflict`] runs the attempt, and
//! runs it again while it fails with a conflict, up to the backoff's `steps` attempts;
//! any other error, or success, ends it at once. After the last attempt it returns the last
//! conflict, as client-go does.
//!
//! Differs on purpose: the attempt gets its number (0 first), so that the first attempt can
//! work from the copy the caller already has (the informer's) and only a retry reads afresh;
//! client-go's `fn` reads the object itself on every attempt.

use std::future::Future;
use std::time::Duration;

use crate::backoff::Backoff;

/// client-go `retry.DefaultRetry`: 5 attempts, 10 ms apart (plus up to 10% jitter). For
/// conflicts, which a fresh read resolves at once unless another writer is busy.
pub const DEFAULT_RETRY: Backoff = Backoff {
    steps: 5,
    duration: Duration::from_millis(10),
    factor: 1.0,
    jitter: 0.1,
    cap: None,
};

/// client-go `retry.DefaultBackoff`: 4 attempts, 10 ms then 50 ms then 250 ms apart. For errors
/// that take time to clear.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    steps: 4,
    duration: Duration::from_millis(10),
    factor: 5.0,
    jitter: 0.1,
    cap: None,
};

/// An error that may be a 409 Conflict. client-go: `errors.IsConflict`.
pub trait Conflict {
    /// Whether the write failed because the object changed since it was read.
    fn is_conflict(&self) -> bool;
}

/// The HTTP status decides, not the reason: kube-core's `is_conflict` is false for a
/// bare-text error body.
impl Conflict for kube_client::Error {
    fn is_conflict(&self) -> bool {
        matches!(self, kube_client::Error::Api(status) if status.code == 409)
    }
}

/// Runs `attempt(0)`, then `attempt(1)`, ... while it fails with an error `retriable` accepts,
/// pausing as `backoff` says (`backoff.step()` before each retry), at most `backoff.steps`
/// times (at least once); returns the first success, the first other error, or the last
/// retriable error. client-go: `retry.OnError` (`wait.ExponentialBackoff`).
pub async fn on_error<T, E, F, Fut>(
    backoff: Backoff,
    retriable: impl Fn(&E) -> bool,
    mut attempt: F,
) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pauses = backoff;
    let mut n = 0;
    loop {
        match attempt(n).await {
            Err(e) if retriable(&e) && n + 1 < backoff.steps => {}
            done => return done,
        }
        n += 1;
        tokio::time::sleep(pauses.step()).await;
    }
}

/// [`on_error`] for conflicts. client-go: `retry.RetryOnConflict`.
///
/// # Examples
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kubeloop::runtime::{DEFAULT_RETRY, retry_on_conflict};
///
/// // A write that conflicts twice, then lands: the first try works from the copy at hand,
/// // each retry would read the object afresh.
/// let written = retry_on_conflict(DEFAULT_RETRY, |attempt| async move {
///     if attempt < 2 {
///         let conflict = kube_client::core::Status::failure("modified", "Conflict").with_code(409);
///         return Err(kube_client::Error::Api(conflict.boxed()));
///     }
///     Ok(attempt)
/// })
/// .await;
/// assert_eq!(written.unwrap(), 2);
/// # });
/// ```
pub async fn retry_on_conflict<T, E, F, Fut>(backoff: Backoff, attempt: F) -> Result<T, E>
where
    E: Conflict,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    on_error(backoff, E::is_conflict, attempt).await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    #[derive(Debug, PartialEq)]
    enum Failure {
        Conflict,
        Other,
    }

    impl Conflict for Failure {
        fn is_conflict(&self) -> bool {
            *self == Failure::Conflict
        }
    }

    /// Runs `retry_on_conflict` over `outcomes` (one per attempt); returns its result and the
    /// paused-clock instants of the attempts, relative to the first.
    async fn run(
        backoff: Backoff,
        outcomes: Vec<Result<u32, Failure>>,
    ) -> (Result<u32, Failure>, Vec<Duration>) {
        let started = Instant::now();
        let at = Mutex::new(Vec::new());
        let result = retry_on_conflict(backoff, |n| {
            at.lock().unwrap().push(started.elapsed());
            let outcome = match &outcomes[n as usize] {
                Ok(v) => Ok(*v),
                Err(Failure::Conflict) => Err(Failure::Conflict),
                Err(Failure::Other) => Err(Failure::Other),
            };
            async move { outcome }
        })
        .await;
        (result, at.into_inner().unwrap())
    }

    const NO_JITTER: Backoff = Backoff {
        jitter: 0.0,
        ..DEFAULT_RETRY
    };

    // client-go: TestRetryOnConflict (util/retry/util_test.go): conflicts are retried until
    // one attempt succeeds.
    #[tokio::test(start_paused = true)]
    async fn conflicts_are_retried_until_an_attempt_succeeds() {
        let (result, at) = run(
            NO_JITTER,
            vec![Err(Failure::Conflict), Err(Failure::Conflict), Ok(7)],
        )
        .await;
        assert_eq!(result, Ok(7));
        let ms = |n| Duration::from_millis(n);
        assert_eq!(at, vec![ms(0), ms(10), ms(20)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_conflict_is_returned_after_the_last_step_with_no_pause_after_it() {
        let started = Instant::now();
        let (result, at) = run(NO_JITTER, (0..5).map(|_| Err(Failure::Conflict)).collect()).await;
        assert_eq!(result, Err(Failure::Conflict));
        assert_eq!(at.len(), 5);
        assert_eq!(started.elapsed(), Duration::from_millis(40));
    }

    #[tokio::test(start_paused = true)]
    async fn another_error_ends_the_retries_at_once() {
        let (result, at) = run(
            NO_JITTER,
            vec![Err(Failure::Conflict), Err(Failure::Other), Ok(1)],
        )
        .await;
        assert_eq!(result, Err(Failure::Other));
        assert_eq!(at.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_grow_by_the_factor_and_jitter_only_lengthens_them() {
        let backoff = Backoff {
            jitter: 0.0,
            ..DEFAULT_BACKOFF
        };
        let conflicts = (0..4).map(|_| Err(Failure::Conflict)).collect();
        let (_, at) = run(backoff, conflicts).await;
        let ms = |n| Duration::from_millis(n);
        assert_eq!(at, vec![ms(0), ms(10), ms(60), ms(310)]);

        let conflicts = (0..4).map(|_| Err(Failure::Conflict)).collect();
        let (_, at) = run(DEFAULT_BACKOFF, conflicts).await;
        // Up to 10% more, and tokio's timer rounds each sleep up to the next millisecond.
        assert!(at[1] >= ms(10) && at[1] <= ms(12), "{at:?}");
        assert!(
            at[3] - at[2] >= ms(250) && at[3] - at[2] <= ms(276),
            "{at:?}"
        );
    }

    #[test]
    fn a_409_from_the_apiserver_is_a_conflict_and_a_404_is_not() {
        let status = |code| {
            kube_client::Error::Api(
                kube_client::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(status(409).is_conflict());
        assert!(!status(404).is_conflict());
    }
}
