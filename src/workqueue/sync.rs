//! The lock the workqueue's state sits behind, imported from one place. `shared.rs` takes its
//! `Mutex` from here; `tests/local/workqueue_loom.rs` compiles `shared.rs` next to a module of the
//! same shape that hands out loom's `Mutex` instead, so loom explores every interleaving of
//! the queue's transitions (the tokio pattern: sync primitives through one shim).
//!
//! The shape both sides provide: `Mutex::new(value)` and `mutex.lock()`, returning a guard
//! that derefs to the value (parking_lot's, which does not poison).

pub(super) use parking_lot::Mutex;
