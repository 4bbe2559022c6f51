//! The dedup and delaying queue's state: client-go's `Typed[T]` (`queue.go`) and
//! `delayingType[T]` (`delaying_queue.go`) as a [`Discipline`] over the [`Core`] both queues
//! share: a line of slots, first in first out. `queue.rs`, `delaying_queue.rs` and
//! `metrics.rs` are faces over it.
//!
//! This module is a leaf like `shared.rs`: it imports only that, so
//! `tests/local/workqueue_loom.rs` compiles it against loom's `Mutex` and model-checks the
//! hand-off protocol.
//!
//! Invariant (beside the core's): every number in `line` is an occupied slot with
//! `dirty && !processing`, present once. A slot may be dirty and wait for a ready time at
//! once: client-go's delaying queue adds it again when that time comes, which changes
//! nothing if it is still dirty.
//!
//! # An add of a key already dirty takes no lock
//! client-go's `Add` of a dirty key changes nothing (not even the metrics), but still takes
//! the queue's lock; with several producers on a hot key the lock's cache line is what they
//! wait on (issue 53). Here such an add reads without the lock ([`DedupFilter`]): a key added
//! while it was dirty already (a duplicate that took the lock) is published in a cell picked
//! by its hash, as a [`Hot`] entry holding the key and a `dirty` flag; the slot is marked
//! (`Slot::extra`) and the entry kept beside the slots (`State::hot`), so a slot stays 64
//! bytes (with the entry in it, 72: the rate-limited row ran 38% slower). Under the lock the
//! flag follows the slot's: set where the slot becomes dirty (`make_dirty`), cleared where
//! `get` takes it (`pop`); so an entry that says dirty is the entry of a key that is dirty.
//! A later add finds the entry, sees the same key dirty and returns. A key whose cell holds
//! another dirty key takes the lock as before; an entry replaced in its cell, or left there
//! when its slot is freed (its flag false then, and never set again), misleads no add.
//!
//! What the lock gave that the read must keep: whoever `get`s the key after the add sees
//! what the adder wrote before it. The add fences (`SeqCst`) before it reads the flag and
//! `pop` fences after it clears it: of two such fences one comes first, so either the add
//! sees the flag cleared (and takes the lock) or the `get` that cleared it sees the adder's
//! writes (the store-buffering pattern; modelled in `tests/local/workqueue_loom.rs`).

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::task::Waker;
use std::time::Duration;

use super::shared::{Core, Discipline, FOREVER, Hooks, ItemArg, OnPark, Shared, Stamp, Wakeups};
use super::sync::{AtomicBool, Cell, DEDUP_CELLS, fence};

/// The queue's state, behind the one lock. In this order (`repr(C)`) the line, then the
/// core's index and slots, sit on the lock's cache line and the next, as they did before the
/// core was shared; with the line after the core, on a cache line of its own, the contended
/// rows ran 14-20% slower than e1b2f7e, and 2-5% in this order (A/B of 2026-11-29,
/// benches/README.md).
#[repr(C)]
pub(crate) struct State<T> {
    /// Slots ready to hand out, oldest first.
    line: VecDeque<u32>,
    /// A slot's `extra`: its key is published, its entry in `hot`.
    core: Core<T, bool>,
    /// Published entries by slot number (one left by a freed slot stays until that slot
    /// publishes again).
    hot: Vec<Option<Arc<Hot<T>>>>,
}

/// A key added again while it was dirty, published for adds that read without the lock
/// (see the module docs). `key` and `hash` never change; `dirty` is written under the lock.
pub(crate) struct Hot<T> {
    key: T,
    hash: u64,
    dirty: AtomicBool,
}

/// The cells of [`Hot`] entries, one per hash bucket, read without the lock; made at the
/// first publish, so a queue that never sees a duplicate of a dirty key has none to read,
/// fill or drop.
pub(crate) struct DedupFilter<T> {
    cells: OnceLock<Box<[Cell<Hot<T>>]>>,
}

impl<T> Default for DedupFilter<T> {
    fn default() -> Self {
        DedupFilter {
            cells: OnceLock::new(),
        }
    }
}

fn cell<T>(cells: &[Cell<Hot<T>>], hash: u64) -> &Cell<Hot<T>> {
    &cells[hash as usize & (DEDUP_CELLS - 1)]
}

impl<T: Eq + Send + Sync + 'static> DedupFilter<T> {
    /// Whether `item` is dirty, as far as its cell tells without the lock: `false` when the
    /// cell holds another key or none (the caller then takes the lock).
    #[inline]
    pub(crate) fn holds_dirty(&self, hash: u64, item: &T) -> bool {
        let Some(cells) = self.cells.get() else {
            return false;
        };
        cell(cells, hash).read(|hot| {
            let Some(hot) = hot else {
                return false;
            };
            // Pairs with the fence in `State::pop` (module docs).
            fence(Ordering::SeqCst);
            hot.hash == hash && hot.dirty.load(Ordering::SeqCst) && hot.key == *item
        })
    }

    /// Under the lock: publishes `key`, dirty, in its cell unless the cell holds another
    /// dirty key (a borrowed key is cloned only to be published); the entry, for its slot to
    /// keep.
    fn publish(&self, hash: u64, key: impl ItemArg<T>) -> Option<Arc<Hot<T>>> {
        let cells = self
            .cells
            .get_or_init(|| (0..DEDUP_CELLS).map(|_| Cell::empty()).collect());
        let cell = cell(cells, hash);
        if cell.read(|hot| hot.is_some_and(|hot| hot.dirty.load(Ordering::Relaxed))) {
            return None;
        }
        let hot = Arc::new(Hot {
            key: key.into_item(),
            hash,
            dirty: AtomicBool::new(true),
        });
        cell.store(Some(hot.clone()));
        Some(hot)
    }
}

/// Where an item is, as [`Shared::status`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ItemStatus {
    /// Not in the queue.
    Absent,
    /// In line, not handed out yet.
    Queued,
    /// Handed out by `get`, not `done` yet.
    Processing,
    /// Only in the delaying heap.
    Waiting,
}

impl<T> Discipline for State<T> {
    type Key = T;
    type Extra = bool;
    type Filter = DedupFilter<T>;
    type Hooks = dyn Hooks;
    type Out = T;
    type Gauges = ();
    // client-go's `Get` hands out what is in line until none is left, shut down or not.
    const HANDS_OUT_AFTER_SHUTDOWN: bool = true;

    fn core(&self) -> &Core<T, Self::Extra> {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core<T, Self::Extra> {
        &mut self.core
    }

    fn in_line(&self) -> bool {
        !self.line.is_empty()
    }

    fn len(&self) -> usize {
        self.line.len()
    }

    fn pop(&mut self, _hooks: Option<&dyn Hooks>) -> Option<u32> {
        let i = self.line.pop_front()?;
        if let Some(hot) = self.published(i) {
            hot.dirty.store(false, Ordering::SeqCst);
            // Pairs with the fence in `DedupFilter::holds_dirty` (module docs).
            fence(Ordering::SeqCst);
        }
        Some(i)
    }

    fn out(&self, _i: u32, key: T) -> T {
        key
    }

    fn promote(&mut self, i: u32, _now: Stamp, hooks: Option<&dyn Hooks>, wake: &mut Wakeups) {
        wake.push(self.make_dirty(i, hooks));
    }

    fn rejoin(&mut self, i: u32) {
        self.line.push_back(i);
    }

    fn gauges(&self, _now: Stamp) {}

    fn set_gauges(_hooks: &dyn Hooks, _gauges: ()) {}
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Shared<State<T>> {
    /// Marks `item` dirty and puts it in line unless it is dirty or processing already.
    /// Ignored after shutdown. client-go: `Add`.
    ///
    /// An add of a key that is dirty already returns without the lock when the key is
    /// published in the filter, and publishes it when not (see the module docs).
    pub(crate) fn add(&self, item: T) {
        self.add_item(item);
    }

    /// [`add`](Self::add) of a borrowed key, cloned only if the queue keeps it: a key it
    /// does not track yet, or one it publishes.
    pub(crate) fn add_ref(&self, item: &T) {
        self.add_item(item);
    }

    #[inline(always)]
    fn add_item(&self, item: impl ItemArg<T>) {
        let hash = self.hash(item.item());
        if self.filter.holds_dirty(hash, item.item()) {
            return;
        }
        let mut state = self.state.lock();
        if state.core.shutting_down {
            return;
        }
        let (i, mut unused) = state.core.slot_for(hash, item);
        let slot = &state.core.slots[i as usize];
        let wake = if slot.dirty {
            if !slot.extra
                && let Some(key) = unused.take()
                && let Some(hot) = self.filter.publish(hash, key)
            {
                state.keep_published(i, hot);
            }
            None
        } else {
            state.make_dirty(i, self.hooks())
        };
        drop(state);
        drop(unused);
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// Where `item` is now, for [`crate::trace`] (never on the untraced path).
    pub(crate) fn status(&self, item: &T) -> ItemStatus {
        let hash = self.hash(item);
        let state = self.state.lock();
        match state.core.find(hash, item) {
            None => ItemStatus::Absent,
            Some(slot) if slot.processing => ItemStatus::Processing,
            Some(slot) if slot.dirty => ItemStatus::Queued,
            Some(_) => ItemStatus::Waiting,
        }
    }

    /// Records that `item` should be added after `delay` unless an earlier time is set.
    /// Ignored after shutdown (returns `None`). Otherwise returns whether this is now the
    /// heap's earliest time, and runs `ensure_timer` under the lock. client-go: `AddAfter`.
    pub(crate) fn add_after(
        self: &Arc<Self>,
        item: T,
        delay: Duration,
        ensure_timer: OnPark<State<T>>,
    ) -> Option<bool> {
        let hash = self.hash(&item);
        let mut state = self.state.lock();
        if state.core.shutting_down {
            return None;
        }
        // A delay too large for the clock waits "forever" (30 years) instead of panicking.
        let ready_at = state.core.now().after(delay.min(FOREVER));
        let (i, unused) = state.core.slot_for(hash, item);
        let earlier = state.core.slots[i as usize]
            .ready_at
            .is_none_or(|(current, _)| ready_at < current);
        let earliest = earlier && state.core.wait_until(i, ready_at);
        ensure_timer(self, &mut state);
        drop(state);
        drop(unused);
        Some(earliest)
    }
}

impl<T> State<T> {
    pub(crate) fn new() -> Self {
        State {
            line: VecDeque::new(),
            core: Core::new(),
            hot: Vec::new(),
        }
    }

    /// Slot `i`'s published entry, if its key is published.
    fn published(&self, i: u32) -> Option<&Hot<T>> {
        if !self.core.slots[i as usize].extra {
            return None;
        }
        self.hot.get(i as usize)?.as_deref()
    }

    /// Marks slot `i` published with `hot`.
    fn keep_published(&mut self, i: u32, hot: Arc<Hot<T>>) {
        let i = i as usize;
        if self.hot.len() <= i {
            self.hot.resize_with(i + 1, || None);
        }
        self.hot[i] = Some(hot);
        self.core.slots[i].extra = true;
    }

    /// Items in line.
    #[cfg(test)]
    pub(crate) fn line_len(&self) -> usize {
        self.line.len()
    }

    /// Slot `i` became dirty: put it in line unless processing. Returns a `get` to wake.
    /// Inlined into the add under the lock, as `Core::slot_for`.
    #[inline(always)]
    fn make_dirty(&mut self, i: u32, hooks: Option<&dyn Hooks>) -> Option<Waker> {
        let slot = &mut self.core.slots[i as usize];
        if slot.dirty {
            return None;
        }
        slot.dirty = true;
        if let Some(h) = hooks {
            h.added(&mut slot.added_at, self.core.epoch);
        }
        let processing = slot.processing;
        if let Some(hot) = self.published(i) {
            hot.dirty.store(true, Ordering::Relaxed);
        }
        if processing {
            return None;
        }
        self.line.push_back(i);
        self.core.parked.wake_one()
    }
}

impl<T> fmt::Debug for State<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("len", &self.line.len())
            .field("processing", &self.core.processing())
            .field("waiting", &self.core.waiting_len())
            .field("shutting_down", &self.core.shutting_down)
            .finish()
    }
}
