//! The lock the workqueue's state sits behind, imported from one place. `shared.rs` takes its
//! `Mutex` from here; `tests/local/workqueue_loom.rs` compiles `shared.rs` next to a module of the
//! same shape that hands out loom's `Mutex` instead, so loom explores every interleaving of
//! the queue's transitions (the tokio pattern: sync primitives through one shim).
//!
//! The shape both sides provide: `Mutex::new(value)` and `mutex.lock()`, returning a guard
//! that derefs to the value (parking_lot's, which does not poison); the atomics and fence of
//! the plain queue's lock-free duplicate add (`state.rs`), and the cells it reads without the
//! lock: `Cell::empty()`, `cell.read(|entry: Option<&T>| ..)` and
//! `cell.store(Option<Arc<T>>)`, on crossbeam-epoch here (a read keeps the entry it read
//! alive while it is compared), a `Mutex` of loom's in the model.

use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

pub(super) use parking_lot::Mutex;
pub(super) use std::sync::atomic::{AtomicBool, fence};

/// An `Option<Arc<T>>` read without a lock. A read pins crossbeam-epoch's default collector
/// for as long as it looks at the entry; a store hands the entry it replaces to the
/// collector, which drops it once no pinned read can hold it.
///
/// arc-swap did this before (2026-11-30): a read there took three locked instructions
/// (its debt slot's store and release, and the filter's fence after it), here two (the pin
/// and the fence); they were about a quarter of the dedup row's samples (benches/README.md).
pub(super) struct Cell<T> {
    /// `Arc::into_raw` of the entry, or null.
    entry: AtomicPtr<T>,
    /// The cell owns an `Arc<T>`: it is `Send` and `Sync` only when that is.
    _owns: PhantomData<Arc<T>>,
}

impl<T> Cell<T> {
    pub(super) fn empty() -> Self {
        Cell {
            entry: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// `f` of the entry, which stays alive until `f` returns.
    #[inline]
    pub(super) fn read<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        let _pinned = crossbeam_epoch::pin();
        // SAFETY: a non-null pointer is an `Arc::into_raw` that `store` hands to the
        // collector only after taking it out of the cell, so while pinned it is not dropped.
        f(unsafe { self.entry.load(Ordering::Acquire).as_ref() })
    }
}

impl<T: Send + Sync + 'static> Cell<T> {
    pub(super) fn store(&self, value: Option<Arc<T>>) {
        let new = value.map_or(ptr::null_mut(), |v| Arc::into_raw(v).cast_mut());
        let old = self.entry.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            let pinned = crossbeam_epoch::pin();
            // SAFETY: `old` came from `Arc::into_raw` and left the cell above, so reads that
            // begin now cannot find it; the collector runs this once every read pinned before
            // has ended. `T: Send + Sync + 'static`, so it may drop on any thread, later.
            unsafe { pinned.defer_unchecked(move || drop(Arc::from_raw(old))) };
        }
    }
}

impl<T> Drop for Cell<T> {
    fn drop(&mut self) {
        let entry = *self.entry.get_mut();
        if !entry.is_null() {
            // SAFETY: from `Arc::into_raw`; no read borrows a cell being dropped.
            drop(unsafe { Arc::from_raw(entry) });
        }
    }
}

/// How many cells the plain queue's duplicate-add filter has (a power of two).
pub(super) const DEDUP_CELLS: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its drops.
    struct Entry(Arc<AtomicUsize>);

    impl Drop for Entry {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_replaced_entry_lives_while_a_read_holds_it_and_is_dropped_after() {
        let drops = Arc::new(AtomicUsize::new(0));
        let cell = Cell::empty();
        cell.store(Some(Arc::new(Entry(drops.clone()))));
        cell.read(|held| {
            let held = held.expect("the entry stored");
            // Replaced (and the cell's reference given up) while this read holds it.
            cell.store(Some(Arc::new(Entry(drops.clone()))));
            for _ in 0..1_000 {
                crossbeam_epoch::pin().flush();
            }
            assert_eq!(drops.load(Ordering::SeqCst), 0, "dropped under a read");
            assert!(Arc::ptr_eq(&held.0, &drops));
        });
        // Unpinned now: the collector drops it within a few epochs.
        for _ in 0..1_000 {
            if drops.load(Ordering::SeqCst) == 1 {
                break;
            }
            crossbeam_epoch::pin().flush();
        }
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the replaced entry was never dropped"
        );
        drop(cell);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "the cell's entry outlived the cell"
        );
    }
}
