//! Watching beyond the informer: client-go's `tools/watch`.
//!
//! A sibling of [`crate::cache`] (client-go's `tools/cache`), as in client-go, and built on
//! it (a [`ListerWatcher`](crate::cache::ListerWatcher) to watch through, an informer for
//! [`until_with_sync`]); nothing in `cache` imports it.
//!
//! | file                | what                                              | client-go                          |
//! |---------------------|---------------------------------------------------|------------------------------------|
//! | `retry_watcher.rs`  | [`RetryWatcher`]: one watch, resumed after a cut  | `tools/watch/retrywatcher.go`      |
//! | `until.rs`          | [`until_with_sync`]: wait for a condition on a cached object | `tools/watch/until.go` (`UntilWithSync`) |

mod retry_watcher;
mod until;

pub use retry_watcher::{DEFAULT_MIN_RESTART_DELAY, RetryWatchError, RetryWatcher};
pub use until::{CacheEvent, Precondition, UntilError, until_with_sync};
