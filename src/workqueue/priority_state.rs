//! The priority queue's shared state and every transition made under its one lock.
//! controller-runtime keeps this in `priorityqueue[T]` (`pkg/controller/priorityqueue/
//! priorityqueue.go`): an items map, a `ready` and a `waiting` btree, a `locked` set behind a
//! second lock, an add buffer behind a third, and four goroutines moving items between them.
//! Here one [`PriorityState`] behind one [`Mutex`] holds it all, as `state.rs` does for the
//! dedup queue, and `priority_queue.rs` and `metrics.rs` are faces over it.
//!
//! This module is a leaf like `state.rs`: it imports only the lock shim (`sync.rs`),
//! `state.rs`'s time stamps, heap entries and wake-up list, and `fair.rs`'s fair lines, so
//! `tests/local/workqueue_loom.rs` compiles it against loom's `Mutex` next to those and
//! model-checks its hand-offs.
//!
//! Layout:
//! - Every tracked item lives in a slot of `slots`; `index` maps a key to its slot, hashed
//!   before the lock is taken (as in `state.rs`).
//! - An item is *pending* from an add until `get` hands it out: either *ready* (`dirty`) or
//!   *waiting* for its ready time (`ready_at`), never both. A pending item has one priority
//!   (the highest any add asked for since it became pending) and one order number (its place
//!   among items of that priority: given when it became pending, and anew when its priority
//!   rose or its ready time came, as controller-runtime's `AddedCounter`).
//! - `ready` holds the ready items that are not processing, in one line per priority, each
//!   line sorted by order number; with an extractor, a priority's line is a [`FairLine`]:
//!   one such line per fairness key, the keys taking turns. A ready item that is also
//!   processing (re-added while a worker has it) waits outside the lines and joins its line
//!   at `done`, in its order. The extractor is asked for an item's keys each time it joins
//!   or leaves a line (it must give the same keys each time).
//! - The waiting items are `state.rs`'s delaying heap: an entry is current iff its slot's
//!   `ready_at` carries its sequence number; superseded entries are skipped when popped.
//! - Parked `get` calls wait in `parked`, as in `state.rs`.
//!
//! Invariants (on [`PriorityState`]):
//! - A slot is occupied iff `index` holds its number; an occupied slot is pending or
//!   processing (or both).
//! - `dirty` and `ready_at` are never both set.
//! - A slot is in a line of `ready` iff it is `dirty && !processing`, present once, in the
//!   line of its priority (under its fairness keys) at its order number.
//! - `ready_len` is the number of dirty slots (controller-runtime's `Len`: ready items,
//!   including those waiting for their worker's `done`); the depth gauge of each priority
//!   counts the dirty slots of that priority.
//! - `parked` is non-empty only while `ready` is empty or every item in it has a woken `get`
//!   on its way.
//! - No lock guard is held across an `.await`; wakers are woken and keys dropped after the
//!   lock is released.

use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::fair::{FairLine, FairnessDepth, FairnessExtractor, insert_by_order};
use super::parked::Parked;
use super::state::{FOREVER, Stamp, Waiting, Wakeups};
use super::sync::Mutex;

/// How many priorities get a depth series of their own; the depth of any further priority
/// goes to the series labelled [`PRIORITY_LABEL_OVERFLOW`]. controller-runtime:
/// `maxRecommendedUniquePriorities`.
pub(crate) const MAX_PRIORITY_LABELS: usize = 25;

/// The `priority` label of the depth of priorities beyond [`MAX_PRIORITY_LABELS`].
/// controller-runtime: `priorityCardinalityExceededPlaceholder`.
pub(crate) const PRIORITY_LABEL_OVERFLOW: &str = "exceeded_cardinality_limit";

/// What a priority queue reports to its metrics. `metrics.rs` implements it for a named
/// queue. controller-runtime: `queueMetrics[T]`.
pub(crate) trait PriorityHooks: Send + Sync {
    /// An item became ready: count the add, set `added_at` (if unset).
    fn added(&self, added_at: &mut Option<Stamp>, epoch: Instant);
    /// `get` handed the item out: observe its queue time, start its work time.
    fn got(&self, added_at: &mut Option<Stamp>, started_at: &mut Option<Stamp>, epoch: Instant);
    /// `done` for an item that was processing: observe its work time.
    fn finished(&self, started_at: &mut Option<Stamp>, epoch: Instant);
    /// The unfinished-work gauges: seconds of work in progress, and of the longest item.
    fn unfinished(&self, total: f64, longest: f64);
    /// An add asked for a delay (controller-runtime counts every such add as a retry).
    fn retry(&self);
    /// The depth series of `priority`, or of the overflow label for `None`. Called once per
    /// label; the state keeps the gauge.
    fn depth_gauge(&self, priority: Option<i32>) -> Gauge;
    /// The fairness gauges: keys with ready items, the ready items of the deepest, and the
    /// seconds the oldest ready item has waited.
    fn fairness(&self, keys: usize, deepest: usize, longest_wait: f64);
}

/// What every handle of one priority queue shares.
pub(crate) struct PriorityShared<T> {
    state: Mutex<PriorityState<T>>,
    hasher: DefaultHashBuilder,
    hooks: Option<Box<dyn PriorityHooks>>,
    /// The state's epoch and whether it has an extractor, copied out of the lock: an add
    /// to a fair queue reads the clock (each ready item's `ready_since`) before locking.
    epoch: Instant,
    fair: bool,
    /// `shutdown_with_drain` waits here for the last `done`.
    drained: Notify,
    /// The timer task waits here for an earlier ready time or shutdown.
    pub(crate) timer: Arc<Notify>,
}

/// The priority queue's state, behind the one lock.
pub(crate) struct PriorityState<T> {
    index: HashTable<u32>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// Ready items not processing, by priority.
    ready: Lines,
    /// Gives items their fairness keys; `None`: each line is first in, first out.
    fairness: Option<Arc<FairnessExtractor<T>>>,
    /// Dirty slots (see the invariants).
    ready_len: usize,
    processing: usize,
    shutting_down: bool,
    drain: bool,
    /// Parked `get` calls.
    parked: Parked,
    epoch: Instant,
    waiting: BinaryHeap<Waiting>,
    next_seq: u64,
    next_order: u64,
    timer: Option<tokio::task::JoinHandle<()>>,
    /// Depth series by priority (at most [`MAX_PRIORITY_LABELS`]), and the overflow series.
    depth: Vec<(i32, Gauge)>,
    depth_overflow: Option<Gauge>,
}

/// One tracked item.
struct Slot<T> {
    key: Option<T>,
    hash: u64,
    /// Ready: in its line, or processing and to join its line at `done`.
    dirty: bool,
    processing: bool,
    /// Waiting for this time; the sequence number names its current heap entry.
    ready_at: Option<(Stamp, u64)>,
    /// The pending item's priority and order number (meaningless while not pending).
    priority: i32,
    order: u64,
    added_at: Option<Stamp>,
    started_at: Option<Stamp>,
    /// When it last became ready (kept only with fairness keys, for the longest wait).
    ready_since: Option<Stamp>,
}

/// The ready lines, highest priority first. Empty lines stay (an add-get cycle at one
/// priority would otherwise free and allocate its line every time) until there are more than
/// [`KEPT_LINES`].
#[derive(Default)]
struct Lines {
    lines: Vec<Line>,
    len: usize,
}

/// The ready items of one priority.
struct Line {
    priority: i32,
    items: LineItems,
}

/// A line's items, (order number, slot), first in first out by order number: all in one
/// line, or one line per fairness key taking turns (`fair.rs`).
enum LineItems {
    Fifo(VecDeque<(u64, u32)>),
    Fair(Box<FairLine>),
}

/// Empty lines beyond this many are dropped when a new priority comes.
const KEPT_LINES: usize = 8;

/// Where an item is, for tests and [`crate::trace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PriorityItemStatus {
    Absent,
    /// Ready, at this priority (perhaps waiting for its worker's `done` too).
    Ready(i32),
    /// Handed out and not pending.
    Processing,
    /// Waiting for its ready time, at this priority.
    Waiting(i32),
}

/// The future of `get`. See `state.rs`'s `Get`: the same parking protocol.
pub(crate) struct PriorityGet<'a, T> {
    shared: &'a Arc<PriorityShared<T>>,
    ticket: Option<u64>,
    on_park: Option<OnPriorityPark<T>>,
}

/// Called under the lock when a `get` parks (the face starts its timer here).
pub(crate) type OnPriorityPark<T> = fn(&Arc<PriorityShared<T>>, &mut PriorityState<T>);

/// One add of [`PriorityShared::add`]: the key, its priority and its delay (zero: now).
pub(crate) struct Add<T> {
    pub(crate) item: T,
    pub(crate) priority: i32,
    pub(crate) after: Duration,
}

impl<T: Hash + Eq + Clone> PriorityShared<T> {
    /// A queue reporting to `hooks`, handing out fairly across the keys `fairness` gives
    /// (`None`: first in, first out within a priority).
    pub(crate) fn new(
        hooks: Option<Box<dyn PriorityHooks>>,
        fairness: Option<Arc<FairnessExtractor<T>>>,
    ) -> Self {
        let epoch = Instant::now();
        PriorityShared {
            epoch,
            fair: fairness.is_some(),
            state: Mutex::new(PriorityState {
                index: HashTable::new(),
                slots: Vec::new(),
                free: Vec::new(),
                ready: Lines::default(),
                fairness,
                ready_len: 0,
                processing: 0,
                shutting_down: false,
                drain: false,
                parked: Parked::default(),
                epoch,
                waiting: BinaryHeap::new(),
                next_seq: 0,
                next_order: 0,
                timer: None,
                depth: Vec::new(),
                depth_overflow: None,
            }),
            hasher: DefaultHashBuilder::default(),
            hooks,
            drained: Notify::new(),
            timer: Arc::new(Notify::new()),
        }
    }

    fn hooks(&self) -> Option<&dyn PriorityHooks> {
        self.hooks.as_deref()
    }

    /// The hash `add` wants with each item (computed before the lock is taken).
    pub(crate) fn hash(&self, item: &T) -> u64 {
        self.hasher.hash_one(item)
    }

    /// Adds every item of `adds` (each with its [`hash`](Self::hash)) under one lock; the
    /// iterator must not take the lock itself. Ignored after shutdown. Returns whether a
    /// waiting item's time became the heap's earliest (the timer must re-arm); runs
    /// `ensure_timer` under the lock if any item waits. controller-runtime:
    /// `lockedAddWithOpts`.
    pub(crate) fn add(
        self: &Arc<Self>,
        adds: impl IntoIterator<Item = (u64, Add<T>)>,
        ensure_timer: OnPriorityPark<T>,
    ) -> bool {
        // The one clock read of a fair queue's add, taken before the lock.
        let stamp = self.fair.then(|| Stamp::at(self.epoch, Instant::now()));
        let mut state = self.state.lock();
        if state.shutting_down {
            return false;
        }
        let hooks = self.hooks();
        let mut wake = Wakeups::default();
        // Keys the queue had already, dropped after unlocking (no allocation for the first).
        let mut unused: (Option<T>, Vec<T>) = (None, Vec::new());
        let mut earliest = false;
        let mut delayed = false;
        // Read the clock only for a fair queue or a delayed add, once.
        let mut now = stamp;
        for (hash, add) in adds {
            delayed |= !add.after.is_zero();
            let (e, u) = state.add(hash, add, &mut now, hooks, &mut wake);
            earliest |= e;
            if let Some(u) = u {
                if unused.0.is_none() {
                    unused.0 = Some(u);
                } else {
                    unused.1.push(u);
                }
            }
        }
        if delayed {
            ensure_timer(self, &mut state);
        }
        drop(state);
        drop(unused);
        wake.wake_all();
        earliest
    }

    /// Where `item` is now.
    pub(crate) fn status(&self, item: &T) -> PriorityItemStatus {
        let hash = self.hasher.hash_one(item);
        let state = self.state.lock();
        let slots = &state.slots;
        let Some(&i) = state
            .index
            .find(hash, |&i| slots[i as usize].key.as_ref() == Some(item))
        else {
            return PriorityItemStatus::Absent;
        };
        let slot = &slots[i as usize];
        if slot.dirty {
            PriorityItemStatus::Ready(slot.priority)
        } else if slot.ready_at.is_some() {
            PriorityItemStatus::Waiting(slot.priority)
        } else {
            PriorityItemStatus::Processing
        }
    }

    /// Waits for the highest-priority ready item and marks it processing.
    pub(crate) fn get<'a>(
        self: &'a Arc<Self>,
        on_park: Option<OnPriorityPark<T>>,
    ) -> PriorityGet<'a, T> {
        PriorityGet {
            shared: self,
            ticket: None,
            on_park,
        }
    }

    /// `item` is done processing; it joins its line if it was added meanwhile. Ignored for an
    /// item that is not processing.
    pub(crate) fn done(&self, item: &T) {
        let hash = self.hasher.hash_one(item);
        let mut state = self.state.lock();
        let (wake, drained, forgotten) = state.done(hash, item, self.hooks());
        drop(state);
        drop(forgotten);
        if let Some(w) = wake {
            w.wake();
        }
        if drained {
            self.drained.notify_waiters();
        }
    }

    /// Ready items, including those waiting for their worker's `done`, after moving waiting
    /// items whose time has come. controller-runtime: `Len`.
    pub(crate) fn len(&self) -> usize {
        let mut state = self.state.lock();
        let mut wake = Wakeups::default();
        if !state.waiting.is_empty() {
            let now = state.now();
            state.promote_ready(now, self.hooks(), &mut wake);
        }
        let len = state.ready_len;
        drop(state);
        wake.wake_all();
        len
    }

    /// Stops the queue: drops waiting items, wakes every parked `get`, the drain waiter and
    /// the timer task.
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

    /// Moves waiting items whose time has come into their lines and returns the next ready
    /// time, or `None` once the queue is shutting down. The timer task's one step.
    pub(crate) fn promote_ready(&self) -> Option<Option<Instant>> {
        let mut state = self.state.lock();
        if state.shutting_down {
            return None;
        }
        let mut wake = Wakeups::default();
        let now = state.now();
        state.promote_ready(now, self.hooks(), &mut wake);
        let next = state
            .waiting
            .peek()
            .map(|w| w.ready_at.instant(state.epoch));
        drop(state);
        wake.wake_all();
        Some(next)
    }

    /// Sets the unfinished-work gauges; false once shutting down.
    pub(crate) fn update_unfinished_work(&self) -> bool {
        let state = self.state.lock();
        if state.shutting_down {
            return false;
        }
        let now = state.now();
        let mut total = 0.0;
        let mut longest: f64 = 0.0;
        for slot in &state.slots {
            if let Some(start) = slot.started_at {
                let age = start.secs_until(now);
                total += age;
                longest = longest.max(age);
            }
        }
        let fairness = state.fairness.is_some().then(|| state.fairness_depths(now));
        drop(state);
        if let Some(h) = self.hooks() {
            h.unfinished(total, longest);
            if let Some(keys) = fairness {
                let deepest = keys.iter().map(|k| k.depth).max().unwrap_or(0);
                let wait = keys
                    .iter()
                    .map(|k| k.longest_wait)
                    .max()
                    .unwrap_or_default();
                h.fairness(keys.len(), deepest, wait.as_secs_f64());
            }
        }
        true
    }

    /// Each fairness key with ready items that no worker has: how many and how long the
    /// oldest has waited, deepest first; empty without fairness keys.
    pub(crate) fn fairness_depths(&self) -> Vec<FairnessDepth> {
        let state = self.state.lock();
        let now = state.now();
        state.fairness_depths(now)
    }

    /// The fairness keys of `item`, shown as text; `None` without fairness keys.
    pub(crate) fn fairness_of(&self, item: &T) -> Option<String> {
        let state = self.state.lock();
        state.fairness.as_ref().map(|f| f(item).to_string())
    }
}

impl<T> PriorityShared<T> {
    /// Runs `f` on the state under the lock (for tests and `Debug`).
    pub(crate) fn inspect<R>(&self, f: impl FnOnce(&PriorityState<T>) -> R) -> R {
        f(&self.state.lock())
    }
}

impl<T> Drop for PriorityShared<T> {
    fn drop(&mut self) {
        self.timer.notify_one();
    }
}

impl<T: Hash + Eq + Clone> Future for PriorityGet<'_, T> {
    type Output = Option<(T, i32)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<(T, i32)>> {
        let this = self.get_mut();
        let shared = this.shared;
        let mut state = shared.state.lock();
        let mut wake = Wakeups::default();
        // After `shutdown` nothing more is handed out, even what is ready (controller-runtime:
        // `GetWithPriority` returns shutdown at once); after `shutdown_with_drain` what is
        // ready is handed out until none is left (client-go's `ShutDownWithDrain`).
        let outcome = if state.shutting_down && !state.drain {
            if let Some(ticket) = this.ticket.take() {
                state.parked.unpark(ticket);
            }
            Poll::Ready(None)
        } else {
            if !state.waiting.is_empty() {
                let now = state.now();
                state.promote_ready(now, shared.hooks(), &mut wake);
            }
            if let Some(item) = state.take(shared.hooks()) {
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
                    Some(ticket) if state.parked.update_waker(ticket, cx.waker()) => {}
                    _ => {
                        this.ticket = Some(state.parked.park(cx.waker().clone()));
                        if let Some(on_park) = this.on_park {
                            on_park(shared, &mut state);
                        }
                    }
                }
                Poll::Pending
            }
        };
        drop(state);
        wake.wake_all();
        outcome
    }
}

impl<T> Drop for PriorityGet<'_, T> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        let mut state = self.shared.state.lock();
        if state.parked.unpark(ticket) {
            return;
        }
        // Woken for an item and never took it: pass the wake-up on.
        let wake = if state.ready.len == 0 {
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

impl<T> PriorityState<T> {
    /// Items tracked in any state.
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

    /// Entries in the delaying heap, superseded ones included.
    pub(crate) fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether the delaying heap has entries and no timer task is alive to move them.
    pub(crate) fn needs_timer(&self) -> bool {
        !self.waiting.is_empty() && self.timer.as_ref().is_none_or(|t| t.is_finished())
    }

    pub(crate) fn set_timer(&mut self, timer: tokio::task::JoinHandle<()>) {
        self.timer = Some(timer);
    }

    fn now(&self) -> Stamp {
        Stamp::at(self.epoch, Instant::now())
    }

    fn next_order(&mut self) -> u64 {
        let order = self.next_order;
        self.next_order += 1;
        order
    }

    /// The depth series of `priority`, created on first use; beyond
    /// [`MAX_PRIORITY_LABELS`] priorities, the overflow series. A priority keeps the series
    /// it first got, so every increment of a series is matched by a decrement of the same.
    fn depth_gauge(&mut self, priority: i32, hooks: &dyn PriorityHooks) -> &Gauge {
        // Linear: a queue sees a handful of priorities (controller-runtime's handlers: two).
        if let Some(i) = self.depth.iter().position(|(p, _)| *p == priority) {
            return &self.depth[i].1;
        }
        if self.depth.len() < MAX_PRIORITY_LABELS {
            self.depth
                .push((priority, hooks.depth_gauge(Some(priority))));
            return &self.depth.last().expect("just pushed").1;
        }
        self.depth_overflow
            .get_or_insert_with(|| hooks.depth_gauge(None))
    }

    fn depth_inc(&mut self, priority: i32, hooks: Option<&dyn PriorityHooks>) {
        if let Some(h) = hooks {
            self.depth_gauge(priority, h).inc();
        }
    }

    fn depth_dec(&mut self, priority: i32, hooks: Option<&dyn PriorityHooks>) {
        if let Some(h) = hooks {
            self.depth_gauge(priority, h).dec();
        }
    }

    fn next_slot(&self) -> u32 {
        match self.free.last() {
            Some(&i) => i,
            None => u32::try_from(self.slots.len()).expect("more than 2^32 items in a queue"),
        }
    }

    fn occupy(&mut self, key: T, hash: u64) -> u32 {
        match self.free.pop() {
            Some(i) => {
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
                    ready_at: None,
                    priority: 0,
                    order: 0,
                    added_at: None,
                    started_at: None,
                    ready_since: None,
                });
                i
            }
        }
    }

    fn vacate(&mut self, i: u32) -> Option<T> {
        let slot = &mut self.slots[i as usize];
        slot.dirty = false;
        slot.processing = false;
        slot.ready_at = None;
        slot.started_at = None;
        slot.added_at = None;
        slot.ready_since = None;
        self.free.push(i);
        slot.key.take()
    }

    /// Slot `i` (pending priority and order set, not dirty, not waiting) becomes ready: counts
    /// it, and puts it in its line unless processing. The `get` to wake goes to `wake`. `now`:
    /// the clock if read already (a fair queue's add reads it before the lock).
    fn make_ready(
        &mut self,
        i: u32,
        now: Option<Stamp>,
        hooks: Option<&dyn PriorityHooks>,
        wake: &mut Wakeups,
    ) {
        let slot = &mut self.slots[i as usize];
        debug_assert!(!slot.dirty && slot.ready_at.is_none());
        slot.dirty = true;
        let (priority, order, processing) = (slot.priority, slot.order, slot.processing);
        if let Some(h) = hooks {
            h.added(&mut slot.added_at, self.epoch);
        }
        self.ready_len += 1;
        self.depth_inc(priority, hooks);
        if self.fairness.is_some() {
            self.slots[i as usize].ready_since = Some(now.unwrap_or_else(|| self.now()));
        }
        if !processing {
            self.line_up(priority, order, i);
            wake.push(self.parked.wake_one());
        }
    }

    /// Puts slot `i` into the line of `priority` at `order`, under its fairness keys.
    fn line_up(&mut self, priority: i32, order: u64, i: u32) {
        self.in_lines(i, |lines, keys| lines.insert(priority, order, i, keys));
    }

    /// Takes slot `i` out of the line of `priority`, where it is at `order`.
    fn leave_line(&mut self, priority: i32, order: u64, i: u32) {
        self.in_lines(i, |lines, keys| lines.remove(priority, order, keys));
    }

    /// Runs `f` on the lines with slot `i`'s fairness keys (`None` without an extractor).
    fn in_lines(&mut self, i: u32, f: impl FnOnce(&mut Lines, Option<&[&str]>)) {
        let key = self.slots[i as usize]
            .key
            .as_ref()
            .expect("an occupied slot");
        let keys = self.fairness.as_ref().map(|f| f(key));
        f(&mut self.ready, keys.as_ref().map(|k| k.as_slice()));
    }

    /// See [`PriorityShared::fairness_depths`]: each key's depth summed over the priorities.
    fn fairness_depths(&self, now: Stamp) -> Vec<FairnessDepth> {
        let mut by_keys: std::collections::HashMap<Vec<String>, FairnessDepth> =
            std::collections::HashMap::new();
        for line in &self.ready.lines {
            let LineItems::Fair(fair) = &line.items else {
                continue;
            };
            for key in fair.keys() {
                let since = self.slots[key.oldest as usize].ready_since;
                let wait = since.map_or(Duration::ZERO, |s| {
                    Duration::from_secs_f64(s.secs_until(now))
                });
                let entry = by_keys
                    .entry(key.keys)
                    .or_insert_with_key(|keys| FairnessDepth {
                        keys: keys.clone(),
                        depth: 0,
                        longest_wait: Duration::ZERO,
                    });
                entry.depth += key.depth;
                entry.longest_wait = entry.longest_wait.max(wait);
            }
        }
        let mut out: Vec<FairnessDepth> = by_keys.into_values().collect();
        out.sort_by(|a, b| b.depth.cmp(&a.depth).then_with(|| a.keys.cmp(&b.keys)));
        out
    }

    /// Slot `i` waits until `at`. Returns whether that is now the heap's earliest time.
    fn wait_until(&mut self, i: u32, at: Stamp) -> bool {
        let earliest = self.waiting.peek().is_none_or(|w| at < w.ready_at);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots[i as usize].ready_at = Some((at, seq));
        self.waiting.push(Waiting {
            ready_at: at,
            seq,
            slot: i,
        });
        earliest
    }

    /// Adds every waiting item whose time is `now` or earlier.
    fn promote_ready(&mut self, now: Stamp, hooks: Option<&dyn PriorityHooks>, wake: &mut Wakeups) {
        if self.shutting_down {
            return;
        }
        while self.waiting.peek().is_some_and(|w| w.ready_at <= now) {
            let w = self.waiting.pop().expect("peeked");
            let slot = &mut self.slots[w.slot as usize];
            if slot.key.is_none() || slot.ready_at.is_none_or(|(_, seq)| seq != w.seq) {
                continue; // superseded
            }
            slot.ready_at = None;
            // Ordered by when it became ready, not when it was added (controller-runtime
            // bumps `AddedCounter` here too).
            let order = self.next_order();
            self.slots[w.slot as usize].order = order;
            self.make_ready(w.slot, Some(now), hooks, wake);
        }
    }

    /// Marks the queue shutting down and drops the waiting items. Returns the parked `get`
    /// calls to wake and the keys of forgotten items, both for after unlocking.
    fn begin_shutdown(&mut self) -> (Vec<Waker>, Vec<T>) {
        self.shutting_down = true;
        let mut dropped = Vec::new();
        if !self.waiting.is_empty() {
            self.waiting.clear();
            for i in 0..self.slots.len() {
                let slot = &mut self.slots[i];
                if slot.key.is_none() || slot.ready_at.take().is_none() {
                    continue;
                }
                if !slot.processing {
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
}

impl<T: Hash + Eq + Clone> PriorityState<T> {
    /// One add under the lock; `now` is the clock read of this batch of adds, read here
    /// if a delayed add needs it and it is `None`. Returns whether a waiting time became the
    /// heap's earliest, and the caller's copy of a key the queue had already.
    /// controller-runtime: the loop body of `lockedAddWithOpts`.
    fn add(
        &mut self,
        hash: u64,
        add: Add<T>,
        now: &mut Option<Stamp>,
        hooks: Option<&dyn PriorityHooks>,
        wake: &mut Wakeups,
    ) -> (bool, Option<T>) {
        let Add {
            item,
            priority,
            after,
        } = add;
        let ready_at = if after.is_zero() {
            None
        } else {
            if let Some(h) = hooks {
                h.retry();
            }
            Some(
                now.get_or_insert_with(|| self.now())
                    .after(after.min(FOREVER)),
            )
        };
        let now = *now;
        let next = self.next_slot();
        let slots = &self.slots;
        let entry = self.index.entry(
            hash,
            |&i| slots[i as usize].key.as_ref() == Some(&item),
            |&i| slots[i as usize].hash,
        );
        let (i, unused) = match entry {
            Entry::Occupied(e) => (*e.get(), Some(item)),
            Entry::Vacant(e) => {
                e.insert(next);
                (self.occupy(item, hash), None)
            }
        };
        let slot = &self.slots[i as usize];
        let (dirty, waiting) = (slot.dirty, slot.ready_at);
        if !dirty && waiting.is_none() {
            // Not pending (new, or only processing): a fresh pending item.
            let order = self.next_order();
            let slot = &mut self.slots[i as usize];
            slot.priority = priority;
            slot.order = order;
            return match ready_at {
                None => {
                    self.make_ready(i, now, hooks, wake);
                    (false, unused)
                }
                Some(at) => (self.wait_until(i, at), unused),
            };
        }
        // Pending already: keep the highest priority (at the back of its new line) and the
        // earliest ready time.
        let (old_priority, old_order) = (slot.priority, slot.order);
        if priority > old_priority {
            let order = self.next_order();
            let slot = &mut self.slots[i as usize];
            slot.priority = priority;
            slot.order = order;
            if dirty {
                self.depth_dec(old_priority, hooks);
                self.depth_inc(priority, hooks);
                if !self.slots[i as usize].processing {
                    self.leave_line(old_priority, old_order, i);
                    self.line_up(priority, order, i);
                }
            }
        }
        if dirty {
            return (false, unused);
        }
        let (current, _) = waiting.expect("pending and not dirty: waiting");
        match ready_at {
            None => {
                // Ready now: the waiting heap entry is superseded.
                self.slots[i as usize].ready_at = None;
                self.make_ready(i, now, hooks, wake);
                (false, unused)
            }
            Some(at) if at < current => (self.wait_until(i, at), unused),
            Some(_) => (false, unused),
        }
    }

    /// `get` under the lock: takes the first item of the highest-priority line.
    fn take(&mut self, hooks: Option<&dyn PriorityHooks>) -> Option<(T, i32)> {
        let i = self.ready.pop()?;
        let slot = &mut self.slots[i as usize];
        slot.dirty = false;
        slot.processing = true;
        let priority = slot.priority;
        if let Some(h) = hooks {
            h.got(&mut slot.added_at, &mut slot.started_at, self.epoch);
        }
        let key = slot.key.clone().expect("a slot in line is occupied");
        self.processing += 1;
        self.ready_len -= 1;
        self.depth_dec(priority, hooks);
        Some((key, priority))
    }

    /// `done` under the lock. Returns (a `get` to wake, whether the drain is over, the key of
    /// a forgotten item).
    fn done(
        &mut self,
        hash: u64,
        item: &T,
        hooks: Option<&dyn PriorityHooks>,
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
        if let Some(h) = hooks {
            h.finished(&mut slot.started_at, self.epoch);
        }
        let mut wake = None;
        let mut forgotten = None;
        if slot.dirty {
            let (priority, order) = (slot.priority, slot.order);
            self.line_up(priority, order, i);
            wake = self.parked.wake_one();
        } else if slot.ready_at.is_none() {
            entry.remove();
            forgotten = self.vacate(i);
        }
        self.processing -= 1;
        (wake, self.processing == 0 && self.drain, forgotten)
    }
}

impl Lines {
    /// The line of `priority`, created if missing: fair when the queue gives fairness keys.
    fn line(&mut self, priority: i32, fair: bool) -> &mut LineItems {
        let found = self.lines.binary_search_by(|l| priority.cmp(&l.priority));
        let at = match found {
            Ok(at) => at,
            Err(mut at) => {
                if self.lines.len() >= KEPT_LINES {
                    self.lines.retain(|l| !l.items.is_empty());
                    at = self
                        .lines
                        .binary_search_by(|l| priority.cmp(&l.priority))
                        .expect_err("not there before");
                }
                let items = if fair {
                    LineItems::Fair(Box::default())
                } else {
                    LineItems::Fifo(VecDeque::new())
                };
                self.lines.insert(at, Line { priority, items });
                at
            }
        };
        &mut self.lines[at].items
    }

    /// Puts slot `slot` into its line at `order` (usually the back), under its fairness
    /// `keys` if the queue gives them.
    fn insert(&mut self, priority: i32, order: u64, slot: u32, keys: Option<&[&str]>) {
        match self.line(priority, keys.is_some()) {
            LineItems::Fifo(items) => insert_by_order(items, order, slot),
            LineItems::Fair(fair) => fair.insert(keys.unwrap_or_default(), order, slot),
        }
        self.len += 1;
    }

    /// Removes the entry at `order` from the line of `priority` (under `keys`).
    fn remove(&mut self, priority: i32, order: u64, keys: Option<&[&str]>) {
        let removed = match self.line(priority, keys.is_some()) {
            LineItems::Fifo(items) => items
                .binary_search_by_key(&order, |&(o, _)| o)
                .map(|at| items.remove(at))
                .is_ok(),
            LineItems::Fair(fair) => fair.remove(keys.unwrap_or_default(), order),
        };
        if removed {
            self.len -= 1;
        }
    }

    /// Takes the next item of the highest-priority non-empty line.
    fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        for line in &mut self.lines {
            let slot = match &mut line.items {
                LineItems::Fifo(items) => items.pop_front().map(|(_, slot)| slot),
                LineItems::Fair(fair) => fair.pop(),
            };
            if slot.is_some() {
                self.len -= 1;
                return slot;
            }
        }
        None
    }
}

impl LineItems {
    fn is_empty(&self) -> bool {
        match self {
            LineItems::Fifo(items) => items.is_empty(),
            LineItems::Fair(fair) => fair.len() == 0,
        }
    }
}

impl<T> fmt::Debug for PriorityState<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityQueue")
            .field("len", &self.ready_len)
            .field("processing", &self.processing)
            .field("waiting", &self.waiting.len())
            .field("shutting_down", &self.shutting_down)
            .finish()
    }
}
