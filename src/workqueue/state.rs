//! A work queue's shared state and every transition made under its one lock. client-go keeps
//! this in `Typed[T]` (`queue.go`) and `delayingType[T]` (`delaying_queue.go`); here the dedup
//! queue, the delaying queue's heap, the parked `get` calls and the metric timestamps share
//! one [`State`] behind one [`Mutex`], and `queue.rs`, `delaying_queue.rs` and `metrics.rs` are
//! faces over it.
//!
//! This module is a leaf: it imports nothing from its siblings but the lock shim
//! (`sync.rs`), so `tests/local/workqueue_loom.rs` compiles this very file against loom's `Mutex`
//! and model-checks the hand-off protocol. Metrics reach it through the [`Hooks`] trait, which
//! `metrics.rs` implements; the delaying queue's timer task reaches it through
//! [`Shared::promote_ready`] and [`Shared::next_ready_at`], and starts only from the delaying
//! face (a plain queue never has one).
//!
//! Layout, chosen so that an add, get, done round hashes the key twice (client-go: seven map
//! operations) and clones it once:
//! - Every tracked item lives in a slot of `slots`, with its key and flags. `index` maps a key
//!   to its slot (a `HashTable` of slot numbers, hashed by the slot's stored hash), so `add`
//!   and `done` do one hash and one probe, computed before the lock is taken.
//! - `line` holds slot numbers, not keys: `get` pops one and clones its key without hashing.
//! - The delaying heap holds slot numbers and a sequence number; an entry is current iff its
//!   slot is occupied and the slot's `ready` carries that sequence number. Superseded entries
//!   stay in the heap and are skipped when popped (cheaper than client-go's decrease-key).
//! - Parked `get` calls wait in `parked` (ticket, waker) under the same lock: no separate
//!   `Notify` with a lock of its own, and a wake-up goes only to a parked `get`, once.
//!
//! Invariants (on [`State`]):
//! - A slot is occupied (`key` is `Some`) iff `index` holds its number; free slots are in
//!   `free`. An occupied slot has at least one of `dirty`, `processing`, `ready`.
//! - Every number in `line` is an occupied slot with `dirty && !processing`, present once.
//! - `processing` equals the number of slots with the processing flag.
//! - `parked` is non-empty only while `line` is empty or every item in `line` has a woken
//!   `get` on its way: each push onto `line` wakes one parked `get` (removing it from
//!   `parked`), and a woken `get` that is dropped before taking an item passes its wake-up on.
//!   Tickets in `parked` increase from front to back.
//! - No lock guard is ever held across an `.await`, and wakers are woken and keys dropped
//!   after the lock is released.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::parked::Parked;
use super::sync::Mutex;

/// What a queue reports to its metrics. `metrics.rs` implements it for a named queue; an
/// unnamed queue has none. client-go: `queueMetrics[T]`.
pub(crate) trait Hooks: Send + Sync {
    /// An item became dirty. Sets `added_at` (if unset) for the queue-duration histogram.
    fn added(&self, added_at: &mut Option<Stamp>, epoch: Instant);
    /// `get` handed the item out: observe its queue time, start its work time.
    fn got(&self, added_at: &mut Option<Stamp>, started_at: &mut Option<Stamp>, epoch: Instant);
    /// `done` for an item that was processing: observe its work time.
    fn finished(&self, started_at: &mut Option<Stamp>, epoch: Instant);
    /// The unfinished-work gauges: seconds of work in progress, and of the longest item.
    fn unfinished(&self, total: f64, longest: f64);
}

/// What every handle of one queue shares.
pub(crate) struct Shared<T> {
    state: Mutex<State<T>>,
    /// Hashes keys before the lock is taken; `State::index` holds these hashes.
    hasher: DefaultHashBuilder,
    hooks: Option<Box<dyn Hooks>>,
    /// `shutdown_with_drain` waits here for the last `done`.
    drained: Notify,
    /// The delaying queue's timer task waits here for an earlier ready time or shutdown. Its
    /// own `Arc` so the task can wait on it without keeping the queue alive.
    pub(crate) timer: Arc<Notify>,
}

/// The queue's state, behind the one lock.
pub(crate) struct State<T> {
    /// Slots ready to hand out, oldest first.
    line: VecDeque<u32>,
    /// Slot numbers by key.
    index: HashTable<u32>,
    slots: Vec<Slot<T>>,
    /// Unoccupied slots, reused before `slots` grows.
    free: Vec<u32>,
    /// How many slots have the processing flag.
    processing: usize,
    shutting_down: bool,
    /// `shutdown_with_drain` is waiting; `shutdown` clears it to stop that wait.
    drain: bool,
    /// Parked `get` calls.
    parked: Parked,
    /// Time zero of this queue's [`Stamp`]s.
    epoch: Instant,
    /// The delaying queue's items that are not ready yet (empty for a plain queue).
    waiting: BinaryHeap<Waiting>,
    next_seq: u64,
    /// The delaying queue's timer task, once spawned. It can end without the queue knowing
    /// when its runtime shuts down; `timer_running` then says no, and the next user spawns anew.
    timer: Option<tokio::task::JoinHandle<()>>,
}

/// One tracked item.
struct Slot<T> {
    /// `None` for a free slot.
    key: Option<T>,
    hash: u64,
    /// Needs processing: in `line`, or processing and to be re-queued at `done`.
    dirty: bool,
    /// Handed out by `get` and not `done` yet.
    processing: bool,
    /// The delaying queue adds the item at this time (the earliest asked for); the sequence
    /// number names its current heap entry.
    ready: Option<(Stamp, u64)>,
    /// When the item became dirty, for `workqueue_queue_duration_seconds`.
    added_at: Option<Stamp>,
    /// When `get` handed it out, for `workqueue_work_duration_seconds` and the gauges.
    started_at: Option<Stamp>,
}

/// A point in time as nanoseconds after the queue's epoch, plus one, so that `Option<Stamp>`
/// takes 8 bytes instead of an `Option<Instant>`'s 16. Covers 584 years.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(NonZeroU64);

/// An entry of the delaying heap (the priority queue's too).
pub(crate) struct Waiting {
    pub(crate) ready_at: Stamp,
    pub(crate) seq: u64,
    pub(crate) slot: u32,
}

/// The future of `get`. Registered in `State::parked` while it waits; dropping it (a
/// cancelled `get`) unregisters it, or passes on a wake-up it received and did not use.
pub(crate) struct Get<'a, T> {
    shared: &'a Arc<Shared<T>>,
    /// Our ticket in `parked`, or the ticket of the wake-up we received and have not answered.
    ticket: Option<u64>,
    /// Called when the `get` is about to park (the delaying face starts its timer here).
    on_park: Option<OnPark<T>>,
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

/// See [`Get::on_park`].
pub(crate) type OnPark<T> = fn(&Arc<Shared<T>>, &mut State<T>);

/// Wake-ups to send once the lock is released: at most one in the common case, without
/// allocating.
#[derive(Default)]
pub(crate) struct Wakeups {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl<T: Hash + Eq + Clone> Shared<T> {
    pub(crate) fn new(hooks: Option<Box<dyn Hooks>>) -> Self {
        Shared {
            state: Mutex::new(State {
                line: VecDeque::new(),
                index: HashTable::new(),
                slots: Vec::new(),
                free: Vec::new(),
                processing: 0,
                shutting_down: false,
                drain: false,
                parked: Parked::default(),
                epoch: Instant::now(),
                waiting: BinaryHeap::new(),
                next_seq: 0,
                timer: None,
            }),
            hasher: DefaultHashBuilder::default(),
            hooks,
            drained: Notify::new(),
            timer: Arc::new(Notify::new()),
        }
    }

    fn hooks(&self) -> Option<&dyn Hooks> {
        self.hooks.as_deref()
    }

    /// Whether the queue reports metrics (for tests).
    #[cfg(test)]
    pub(crate) fn has_hooks(&self) -> bool {
        self.hooks.is_some()
    }

    /// Marks `item` dirty and puts it in line unless it is dirty or processing already.
    /// Ignored after shutdown. client-go: `Add`.
    pub(crate) fn add(&self, item: T) {
        let hash = self.hasher.hash_one(&item);
        let mut state = self.state.lock();
        if state.shutting_down {
            return;
        }
        let (wake, _unused) = state.add(hash, item, self.hooks());
        drop(state);
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// Where `item` is now, for [`crate::trace`] (never on the untraced path).
    pub(crate) fn status(&self, item: &T) -> ItemStatus {
        let hash = self.hasher.hash_one(item);
        let state = self.state.lock();
        let slots = &state.slots;
        let Some(&i) = state
            .index
            .find(hash, |&i| slots[i as usize].key.as_ref() == Some(item))
        else {
            return ItemStatus::Absent;
        };
        let slot = &slots[i as usize];
        match (slot.processing, slot.dirty) {
            (true, _) => ItemStatus::Processing,
            (false, true) => ItemStatus::Queued,
            (false, false) => ItemStatus::Waiting,
        }
    }

    /// Waits for an item and marks it processing. `on_park` runs under the lock before the
    /// `get` parks.
    pub(crate) fn get<'a>(self: &'a Arc<Self>, on_park: Option<OnPark<T>>) -> Get<'a, T> {
        Get {
            shared: self,
            ticket: None,
            on_park,
        }
    }

    /// `item` is done processing; back in line if it was added meanwhile. Ignored for an item
    /// that is not processing. client-go: `Done`.
    pub(crate) fn done(&self, item: &T) {
        let hash = self.hasher.hash_one(item);
        let mut state = self.state.lock();
        let (wake, drained, _forgotten) = state.done(hash, item, self.hooks());
        drop(state);
        if let Some(w) = wake {
            w.wake();
        }
        if drained {
            self.drained.notify_waiters();
        }
    }

    /// Items in line, after moving delayed items whose time has come. client-go: `Len`.
    pub(crate) fn len(&self) -> usize {
        let mut state = self.state.lock();
        let mut wake = Wakeups::default();
        if !state.waiting.is_empty() {
            // A delayed item whose time has come counts, even if the timer task has not run.
            let now = state.now();
            state.promote_ready(now, self.hooks(), &mut wake);
        }
        let len = state.line.len();
        drop(state);
        wake.wake_all();
        len
    }

    /// Stops the queue; with `drain`, `shutdown_with_drain` will wait for processing items.
    /// Drops delayed items, wakes every parked `get`, the drain waiter and the timer task.
    pub(crate) fn shutdown(&self, drain: bool) {
        let mut state = self.state.lock();
        state.drain = drain;
        let (parked, dropped) = state.begin_shutdown();
        drop(state);
        drop(dropped);
        for w in parked {
            w.wake();
        }
        self.drained.notify_waiters();
        self.timer.notify_one();
    }

    /// Waits until no item is processing or the drain is called off by `shutdown`.
    pub(crate) async fn wait_drained(&self) {
        loop {
            // Created before the check, so a `notify_waiters` after the check reaches it.
            let drained = self.drained.notified();
            {
                let state = self.state.lock();
                if state.processing == 0 || !state.drain {
                    return;
                }
            }
            drained.await;
        }
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.state.lock().shutting_down
    }

    /// Records that `item` should be added after `delay` unless an earlier time is set.
    /// Ignored after shutdown (returns `None`). Otherwise returns whether this is now the
    /// heap's earliest time, and runs `ensure_timer` under the lock. client-go: `AddAfter`.
    pub(crate) fn add_after(
        self: &Arc<Self>,
        item: T,
        delay: Duration,
        ensure_timer: OnPark<T>,
    ) -> Option<bool> {
        let hash = self.hasher.hash_one(&item);
        let mut state = self.state.lock();
        if state.shutting_down {
            return None;
        }
        // A delay too large for the clock waits "forever" (30 years) instead of panicking.
        let ready_at = state.now().after(delay.min(FOREVER));
        let (earliest, unused) = state.add_waiting(hash, item, ready_at);
        ensure_timer(self, &mut state);
        drop(state);
        drop(unused);
        Some(earliest)
    }

    /// Moves delayed items whose time has come into line and returns the next ready time,
    /// or `None` once the queue is shutting down. The timer task's one step.
    pub(crate) fn promote_ready(&self) -> Option<Option<Instant>> {
        let mut state = self.state.lock();
        if state.shutting_down {
            return None;
        }
        let mut wake = Wakeups::default();
        let now = state.now();
        state.promote_ready(now, self.hooks(), &mut wake);
        let next = state.next_ready_at().map(|at| at.instant(state.epoch));
        drop(state);
        wake.wake_all();
        Some(next)
    }

    /// Entries in the delaying heap, superseded ones included.
    pub(crate) fn waiting_len(&self) -> usize {
        self.state.lock().waiting.len()
    }

    /// Sets the unfinished-work gauges from the items processing now. Returns false once the
    /// queue is shutting down (client-go stops updating then). client-go: `updateUnfinishedWork`.
    pub(crate) fn update_unfinished_work(&self) -> bool {
        let state = self.state.lock();
        if state.shutting_down {
            return false;
        }
        let (total, longest) = state.unfinished_work(state.now());
        drop(state);
        if let Some(h) = self.hooks() {
            h.unfinished(total, longest);
        }
        true
    }
}

impl<T> Shared<T> {
    /// Runs `f` on the state under the lock (for the faces' tests and `Debug`).
    pub(crate) fn inspect<R>(&self, f: impl FnOnce(&State<T>) -> R) -> R {
        f(&self.state.lock())
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // The timer task holds only a weak reference; wake it so it sees the queue is gone.
        self.timer.notify_one();
    }
}

impl<T: Hash + Eq + Clone> Future for Get<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        let shared = this.shared;
        let mut state = shared.state.lock();
        let mut wake = None;
        if !state.waiting.is_empty() {
            let now = state.now();
            let mut promoted = Wakeups::default();
            state.promote_ready(now, shared.hooks(), &mut promoted);
            wake = Some(promoted);
        }
        let outcome = if let Some(item) = state.take(shared.hooks()) {
            if let Some(ticket) = this.ticket.take() {
                state.parked.unpark(ticket);
            }
            Poll::Ready(Some(item))
        } else if state.shutting_down {
            if let Some(ticket) = this.ticket.take() {
                state.parked.unpark(ticket);
            }
            Poll::Ready(None)
        } else {
            match this.ticket {
                // Still parked (a spurious poll): keep our place, refresh the waker.
                Some(ticket) if state.parked.update_waker(ticket, cx.waker()) => {}
                // First park, or woken and the item went to someone else: park again.
                _ => {
                    this.ticket = Some(state.parked.park(cx.waker().clone()));
                    if let Some(on_park) = this.on_park {
                        on_park(shared, &mut state);
                    }
                }
            }
            Poll::Pending
        };
        drop(state);
        if let Some(wake) = wake {
            wake.wake_all();
        }
        outcome
    }
}

impl<T> Drop for Get<'_, T> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        let mut state = self.shared.state.lock();
        if state.parked.unpark(ticket) {
            return;
        }
        // We were woken for an item and never took it: pass the wake-up on.
        let wake = if state.line.is_empty() {
            None
        } else {
            state.parked.wake_one()
        };
        drop(state);
        if let Some(w) = wake {
            w.wake();
        }
    }
}

impl<T> State<T> {
    /// Items in line.
    #[cfg(test)]
    pub(crate) fn line_len(&self) -> usize {
        self.line.len()
    }

    /// Items tracked in any state (dirty, processing or waiting for a ready time).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.index.len()
    }

    /// Items processing.
    #[cfg(test)]
    pub(crate) fn processing(&self) -> usize {
        self.processing
    }

    /// Parked `get` calls.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Wake-ups sent to parked `get` calls so far.
    #[cfg(test)]
    pub(crate) fn wakeups(&self) -> usize {
        self.parked.wakeups()
    }

    /// Whether a timer task for the delaying heap is alive.
    pub(crate) fn timer_running(&self) -> bool {
        self.timer.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Whether the delaying heap has entries and no timer task is alive to move them.
    pub(crate) fn needs_timer(&self) -> bool {
        !self.waiting.is_empty() && !self.timer_running()
    }

    pub(crate) fn set_timer(&mut self, timer: tokio::task::JoinHandle<()>) {
        self.timer = Some(timer);
    }

    /// The current time as a [`Stamp`] of this queue.
    fn now(&self) -> Stamp {
        Stamp::at(self.epoch, Instant::now())
    }

    /// The earliest time in the delaying heap (possibly of a superseded entry, which only
    /// makes the timer wake early once).
    fn next_ready_at(&self) -> Option<Stamp> {
        self.waiting.peek().map(|w| w.ready_at)
    }

    /// Seconds of unfinished work and of the longest-running item, at `now`.
    fn unfinished_work(&self, now: Stamp) -> (f64, f64) {
        let mut total = 0.0;
        let mut longest: f64 = 0.0;
        for slot in &self.slots {
            if let Some(start) = slot.started_at {
                let age = start.secs_until(now);
                total += age;
                longest = longest.max(age);
            }
        }
        (total, longest)
    }

    /// The number `occupy` will use next (so it can go into `index` first).
    fn next_slot(&self) -> u32 {
        match self.free.last() {
            Some(&i) => i,
            None => u32::try_from(self.slots.len()).expect("more than 2^32 items in a queue"),
        }
    }

    /// Occupies the slot [`next_slot`](Self::next_slot) names, in a fresh state for `key`.
    fn occupy(&mut self, key: T, hash: u64) -> u32 {
        match self.free.pop() {
            Some(i) => {
                // A free slot is already clean (see `vacate`): set what differs.
                let slot = &mut self.slots[i as usize];
                slot.key = Some(key);
                slot.hash = hash;
                i
            }
            None => {
                let i = u32::try_from(self.slots.len()).expect("more than 2^32 items in a queue");
                self.slots.push(Slot {
                    key: Some(key),
                    hash,
                    dirty: false,
                    processing: false,
                    ready: None,
                    added_at: None,
                    started_at: None,
                });
                i
            }
        }
    }

    /// Frees slot `i` (its index entry must be gone already); returns its key to drop after
    /// unlocking.
    fn vacate(&mut self, i: u32) -> Option<T> {
        let slot = &mut self.slots[i as usize];
        slot.dirty = false;
        slot.processing = false;
        slot.ready = None;
        slot.started_at = None;
        slot.added_at = None;
        self.free.push(i);
        slot.key.take()
    }

    /// Slot `i` became dirty: put it in line unless processing. Returns a `get` to wake.
    fn make_dirty(&mut self, i: u32, hooks: Option<&dyn Hooks>) -> Option<Waker> {
        let slot = &mut self.slots[i as usize];
        if slot.dirty {
            return None;
        }
        slot.dirty = true;
        if let Some(h) = hooks {
            h.added(&mut slot.added_at, self.epoch);
        }
        if slot.processing {
            return None;
        }
        self.line.push_back(i);
        self.parked.wake_one()
    }
}

impl<T: Hash + Eq + Clone> State<T> {
    /// `add` under the lock: returns a `get` to wake and, if the queue had the key already,
    /// the caller's copy (to drop after unlocking).
    fn add(&mut self, hash: u64, item: T, hooks: Option<&dyn Hooks>) -> (Option<Waker>, Option<T>) {
        let next = self.next_slot();
        let slots = &self.slots;
        let entry = self.index.entry(
            hash,
            |&i| slots[i as usize].key.as_ref() == Some(&item),
            |&i| slots[i as usize].hash,
        );
        match entry {
            Entry::Occupied(e) => {
                let i = *e.get();
                (self.make_dirty(i, hooks), Some(item))
            }
            Entry::Vacant(e) => {
                e.insert(next);
                let i = self.occupy(item, hash);
                (self.make_dirty(i, hooks), None)
            }
        }
    }

    /// `get` under the lock: takes the oldest item in line and marks it processing.
    fn take(&mut self, hooks: Option<&dyn Hooks>) -> Option<T> {
        let i = self.line.pop_front()?;
        let slot = &mut self.slots[i as usize];
        slot.dirty = false;
        slot.processing = true;
        self.processing += 1;
        if let Some(h) = hooks {
            h.got(&mut slot.added_at, &mut slot.started_at, self.epoch);
        }
        Some(slot.key.clone().expect("a slot in line is occupied"))
    }

    /// `done` under the lock. Returns (a `get` to wake, whether the drain is over, the key of
    /// a forgotten item to drop after unlocking).
    fn done(
        &mut self,
        hash: u64,
        item: &T,
        hooks: Option<&dyn Hooks>,
    ) -> (Option<Waker>, bool, Option<T>) {
        let slots = &self.slots;
        let Ok(entry) = self
            .index
            .find_entry(hash, |&i| slots[i as usize].key.as_ref() == Some(item))
        else {
            return (None, false, None);
        };
        let i = *entry.get();
        let slot = &mut self.slots[i as usize];
        if !slot.processing {
            return (None, false, None);
        }
        slot.processing = false;
        self.processing -= 1;
        if let Some(h) = hooks {
            h.finished(&mut slot.started_at, self.epoch);
        }
        let mut wake = None;
        let mut forgotten = None;
        if slot.dirty {
            self.line.push_back(i);
            wake = self.parked.wake_one();
        } else if slot.ready.is_none() {
            entry.remove();
            forgotten = self.vacate(i);
        }
        (wake, self.processing == 0 && self.drain, forgotten)
    }

    /// Marks the queue shutting down and drops the delaying heap (client-go's waiting loop
    /// exits on shutdown and its pending items are never added). Returns the parked `get`
    /// calls to wake and the keys of forgotten items, both for after unlocking.
    fn begin_shutdown(&mut self) -> (Vec<Waker>, Vec<T>) {
        self.shutting_down = true;
        let mut dropped = Vec::new();
        if !self.waiting.is_empty() {
            self.waiting.clear();
            for i in 0..self.slots.len() {
                let slot = &mut self.slots[i];
                if slot.key.is_none() || slot.ready.take().is_none() {
                    continue;
                }
                if !slot.dirty && !slot.processing {
                    let hash = slot.hash;
                    let i = i as u32;
                    if let Ok(e) = self.index.find_entry(hash, |&j| j == i) {
                        e.remove();
                    }
                    dropped.extend(self.vacate(i));
                }
            }
        }
        (self.parked.take_all(), dropped)
    }

    /// Records that `item` should be added at `ready_at` unless an earlier time is set.
    /// Returns whether this became the heap's earliest time (the timer must re-arm), and the
    /// caller's copy of a key the queue had already.
    fn add_waiting(&mut self, hash: u64, item: T, ready_at: Stamp) -> (bool, Option<T>) {
        let earliest = self.next_ready_at();
        let next = self.next_slot();
        let slots = &self.slots;
        let entry = self.index.entry(
            hash,
            |&i| slots[i as usize].key.as_ref() == Some(&item),
            |&i| slots[i as usize].hash,
        );
        let (i, unused) = match entry {
            Entry::Occupied(e) => {
                let i = *e.get();
                if self.slots[i as usize]
                    .ready
                    .is_some_and(|(current, _)| current <= ready_at)
                {
                    return (false, Some(item));
                }
                (i, Some(item))
            }
            Entry::Vacant(e) => {
                e.insert(next);
                (self.occupy(item, hash), None)
            }
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots[i as usize].ready = Some((ready_at, seq));
        self.waiting.push(Waiting {
            ready_at,
            seq,
            slot: i,
        });
        (earliest.is_none_or(|e| ready_at < e), unused)
    }

    /// Adds every waiting item whose time is `now` or earlier; the `get` calls to wake go to
    /// `wake`.
    fn promote_ready(&mut self, now: Stamp, hooks: Option<&dyn Hooks>, wake: &mut Wakeups) {
        if self.shutting_down {
            return;
        }
        while self.waiting.peek().is_some_and(|w| w.ready_at <= now) {
            let w = self.waiting.pop().expect("peeked");
            let slot = &mut self.slots[w.slot as usize];
            if slot.key.is_none() || slot.ready.is_none_or(|(_, seq)| seq != w.seq) {
                continue; // superseded by an earlier add_after, or the slot moved on
            }
            slot.ready = None;
            wake.push(self.make_dirty(w.slot, hooks));
        }
    }
}

impl<T> fmt::Debug for State<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("len", &self.line.len())
            .field("processing", &self.processing)
            .field("waiting", &self.waiting.len())
            .field("shutting_down", &self.shutting_down)
            .finish()
    }
}

impl Wakeups {
    pub(crate) fn push(&mut self, waker: Option<Waker>) {
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    pub(crate) fn wake_all(self) {
        if let Some(w) = self.first {
            w.wake();
        }
        for w in self.rest {
            w.wake();
        }
    }
}

/// The longest delay `add_after` honours; longer ones are cut to this.
pub(crate) const FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

impl Stamp {
    /// `t` as a stamp of a queue whose epoch is `epoch` (saturating at both ends).
    pub(crate) fn at(epoch: Instant, t: Instant) -> Stamp {
        let nanos =
            u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX - 1);
        Stamp(NonZeroU64::MIN.saturating_add(nanos))
    }

    /// This stamp plus `d` (saturating).
    pub(crate) fn after(self, d: Duration) -> Stamp {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Stamp(self.0.saturating_add(nanos))
    }

    /// Back to an `Instant`, for `sleep_until`.
    pub(crate) fn instant(self, epoch: Instant) -> Instant {
        epoch + Duration::from_nanos(self.0.get() - 1)
    }

    /// Seconds from `self` to `later` (zero if `later` is earlier).
    pub(crate) fn secs_until(self, later: Stamp) -> f64 {
        Duration::from_nanos(later.0.get().saturating_sub(self.0.get())).as_secs_f64()
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    /// Reversed, so `BinaryHeap` (a max-heap) pops the earliest time first; equal times come
    /// out in the order they were added.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .ready_at
            .cmp(&self.ready_at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}
