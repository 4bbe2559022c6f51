//! The lock the workqueue's state sits behind, imported from one place. `shared.rs` takes its
//! `Mutex` from here; `tests/local/workqueue_loom.rs` compiles `shared.rs` next to a module of the
//! same shape that hands out loom's `Mutex` instead, so loom explores every interleaving of
//! the queue's transitions (the tokio pattern: sync primitives through one shim).
//!
//! The shape both sides provide: `Mutex::new(value)` and `mutex.lock()`, returning a guard
//! that derefs to the value (parking_lot's, which does not poison); the atomics and fence of
//! the plain queue's lock-free duplicate add (`state.rs`), and the cells it reads without the
//! lock: `Cell::empty()`, `cell.load()` (something that derefs to `Option<Arc<T>>`) and
//! `cell.store(Option<Arc<T>>)`, arc-swap's here (a read keeps the entry it read alive
//! while it is compared), a `Mutex` of loom's in the model.

pub(super) use parking_lot::Mutex;
pub(super) use std::sync::atomic::{AtomicBool, fence};

/// See the module docs.
pub(super) type Cell<T> = arc_swap::ArcSwapOption<T>;

/// How many cells the plain queue's duplicate-add filter has (a power of two).
pub(super) const DEDUP_CELLS: usize = 1024;
