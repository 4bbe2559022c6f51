//! The priority queue's state: controller-runtime's `priorityqueue[T]` (`pkg/controller/
//! priorityqueue/priorityqueue.go`: an items map, a `ready` and a `waiting` btree, a `locked`
//! set behind a second lock, an add buffer behind a third, and four goroutines moving items
//! between them) as a [`Discipline`] over the [`Core`] both queues share, behind its one
//! lock. `priority_queue.rs` and `metrics.rs` are faces over it.
//!
//! This module is a leaf like `shared.rs`: it imports only that and `fair.rs`'s fair lines, so
//! `tests/local/workqueue_loom.rs` compiles it against loom's `Mutex` and model-checks its
//! hand-offs.
//!
//! Layout:
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
//!
//! Invariants (beside the core's):
//! - `dirty` and `ready_at` are never both set.
//! - A slot is in a line of `ready` iff it is `dirty && !processing`, present once, in the
//!   line of its priority (under its fairness keys) at its order number.
//! - `ready_len` is the number of dirty slots (controller-runtime's `Len`: ready items,
//!   including those waiting for their worker's `done`); the depth gauge of each priority
//!   counts the dirty slots of that priority.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

use super::fair::{FairLine, FairnessDepth, FairnessExtractor, insert_by_order};
use super::shared::{Core, Discipline, FOREVER, Hooks, OnPark, Shared, Stamp, Wakeups};

/// How many priorities get a depth series of their own; the depth of any further priority
/// goes to the series labelled [`PRIORITY_LABEL_OVERFLOW`]. controller-runtime:
/// `maxRecommendedUniquePriorities`.
pub(crate) const MAX_PRIORITY_LABELS: usize = 25;

/// The `priority` label of the depth of priorities beyond [`MAX_PRIORITY_LABELS`].
/// controller-runtime: `priorityCardinalityExceededPlaceholder`.
pub(crate) const PRIORITY_LABEL_OVERFLOW: &str = "exceeded_cardinality_limit";

/// What a priority queue reports to its metrics beyond a queue's [`Hooks`]. `metrics.rs`
/// implements it for a named queue. controller-runtime: `queueMetrics[T]`.
pub(crate) trait PriorityHooks: Hooks {
    /// An add asked for a delay (controller-runtime counts every such add as a retry).
    fn retry(&self);
    /// The depth series of `priority`, or of the overflow label for `None`. Called once per
    /// label; the state keeps the gauge.
    fn depth_gauge(&self, priority: Option<i32>) -> Gauge;
    /// The fairness gauges: keys with ready items, the ready items of the deepest, and the
    /// seconds the oldest ready item has waited.
    fn fairness(&self, keys: usize, deepest: usize, longest_wait: f64);
}

/// The priority queue's state, behind the one lock.
pub(crate) struct PriorityState<T> {
    core: Core<T, Pending>,
    /// Ready items not processing, by priority.
    ready: Lines,
    /// Gives items their fairness keys; `None`: each line is first in, first out.
    fairness: Option<Arc<FairnessExtractor<T>>>,
    /// With fairness keys, since when items' ready times are stamped (`ready_since`), for
    /// the longest waits: from the start on a named queue, whose gauge reads them; on an
    /// unnamed one from its first [`fairness_depths`](Self::fairness_depths), so that a
    /// queue nobody asks reads no clock at its adds (client-go reads the clock only for a
    /// named queue). An item ready since before then waits from then.
    waits_since: Option<Stamp>,
    /// Dirty slots (see the invariants).
    ready_len: usize,
    next_order: u64,
    /// Depth series by priority (at most [`MAX_PRIORITY_LABELS`]), and the overflow series.
    depth: Vec<(i32, Gauge)>,
    depth_overflow: Option<Gauge>,
}

/// What a slot of the priority queue holds beyond the core's fields.
#[derive(Default)]
pub(crate) struct Pending {
    /// The pending item's priority and order number (meaningless while not pending).
    priority: i32,
    order: u64,
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

/// One add of [`Shared::add_all`]: the key, its priority and its delay (zero: now).
pub(crate) struct Add<T> {
    pub(crate) item: T,
    pub(crate) priority: i32,
    pub(crate) after: Duration,
}

impl<T> Discipline for PriorityState<T> {
    type Key = T;
    type Extra = Pending;
    type Filter = ();
    type Hooks = dyn PriorityHooks;
    type Out = (T, i32);
    type Gauges = Option<Vec<FairnessDepth>>;
    // controller-runtime's `GetWithPriority` returns shutdown at once.
    const HANDS_OUT_AFTER_SHUTDOWN: bool = false;

    fn core(&self) -> &Core<T, Pending> {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core<T, Pending> {
        &mut self.core
    }

    fn in_line(&self) -> bool {
        self.ready.len != 0
    }

    fn len(&self) -> usize {
        self.ready_len
    }

    fn pop(&mut self, hooks: Option<&dyn PriorityHooks>) -> Option<u32> {
        let i = self.ready.pop()?;
        self.ready_len -= 1;
        self.depth_dec(self.core.slots[i as usize].extra.priority, hooks);
        Some(i)
    }

    fn out(&self, i: u32, key: T) -> (T, i32) {
        (key, self.core.slots[i as usize].extra.priority)
    }

    fn promote(
        &mut self,
        i: u32,
        now: Stamp,
        hooks: Option<&dyn PriorityHooks>,
        wake: &mut Wakeups,
    ) {
        // Ordered by when it became ready, not when it was added (controller-runtime bumps
        // `AddedCounter` here too).
        self.core.slots[i as usize].extra.order = self.next_order();
        self.make_ready(i, &mut Some(now), hooks, wake);
    }

    fn rejoin(&mut self, i: u32) {
        let pending = &self.core.slots[i as usize].extra;
        let (priority, order) = (pending.priority, pending.order);
        self.line_up(priority, order, i);
    }

    fn gauges(&self, now: Stamp) -> Option<Vec<FairnessDepth>> {
        self.fairness.is_some().then(|| self.fairness_depths(now))
    }

    fn set_gauges(hooks: &dyn PriorityHooks, keys: Option<Vec<FairnessDepth>>) {
        let Some(keys) = keys else { return };
        let deepest = keys.iter().map(|k| k.depth).max().unwrap_or(0);
        let wait = keys
            .iter()
            .map(|k| k.longest_wait)
            .max()
            .unwrap_or_default();
        hooks.fairness(keys.len(), deepest, wait.as_secs_f64());
    }
}

impl<T: Hash + Eq + Clone> Shared<PriorityState<T>> {
    /// Adds every item of `adds` (each with its [`hash`](Shared::hash)) under one lock; the
    /// iterator must not take the lock itself. Ignored after shutdown. Returns whether a
    /// waiting item's time became the heap's earliest (the timer must re-arm); runs
    /// `ensure_timer` under the lock if any item waits. controller-runtime:
    /// `lockedAddWithOpts`.
    pub(crate) fn add_all(
        self: &Arc<Self>,
        adds: impl IntoIterator<Item = (u64, Add<T>)>,
        ensure_timer: OnPark<PriorityState<T>>,
    ) -> bool {
        let mut state = self.state.lock();
        if state.core.shutting_down {
            return false;
        }
        let hooks = self.hooks();
        let mut wake = Wakeups::default();
        // Keys the queue had already, dropped after unlocking (no allocation for the first).
        let mut unused: (Option<T>, Vec<T>) = (None, Vec::new());
        let mut earliest = false;
        let mut delayed = false;
        // The clock, read once if a fair queue or a delayed add needs it.
        let mut now = None;
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
        let hash = self.hash(item);
        let state = self.state.lock();
        match state.core.find(hash, item) {
            None => PriorityItemStatus::Absent,
            Some(slot) if slot.dirty => PriorityItemStatus::Ready(slot.extra.priority),
            Some(slot) if slot.ready_at.is_some() => {
                PriorityItemStatus::Waiting(slot.extra.priority)
            }
            Some(_) => PriorityItemStatus::Processing,
        }
    }

    /// Each fairness key with ready items that no worker has: how many and how long the
    /// oldest has waited, deepest first; empty without fairness keys.
    pub(crate) fn fairness_depths(&self) -> Vec<FairnessDepth> {
        let mut state = self.state.lock();
        let now = state.core.now();
        if state.fairness.is_some() {
            state.waits_since.get_or_insert(now);
        }
        state.fairness_depths(now)
    }

    /// The fairness keys of `item`, shown as text; `None` without fairness keys.
    pub(crate) fn fairness_of(&self, item: &T) -> Option<String> {
        let state = self.state.lock();
        state.fairness.as_ref().map(|f| f(item).to_string())
    }
}

impl<T> PriorityState<T> {
    /// A state handing out fairly across the keys `fairness` gives (`None`: first in, first
    /// out within a priority); `named`: its waits (with fairness keys) are timed from the
    /// start.
    pub(crate) fn new(fairness: Option<Arc<FairnessExtractor<T>>>, named: bool) -> Self {
        let core = Core::new();
        let waits_since = (named && fairness.is_some()).then(|| core.now());
        PriorityState {
            core,
            ready: Lines::default(),
            fairness,
            waits_since,
            ready_len: 0,
            next_order: 0,
            depth: Vec::new(),
            depth_overflow: None,
        }
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

    /// Slot `i` (pending priority and order set, not dirty, not waiting) becomes ready: counts
    /// it, and puts it in its line unless processing. The `get` to wake goes to `wake`. `now`:
    /// the clock if read already, read here if a fair queue needs it.
    fn make_ready(
        &mut self,
        i: u32,
        now: &mut Option<Stamp>,
        hooks: Option<&dyn PriorityHooks>,
        wake: &mut Wakeups,
    ) {
        let ready_since = self
            .waits_since
            .is_some()
            .then(|| *now.get_or_insert_with(|| self.core.now()));
        let core = &mut self.core;
        let slot = &mut core.slots[i as usize];
        debug_assert!(!slot.dirty && slot.ready_at.is_none());
        slot.dirty = true;
        if let Some(h) = hooks {
            h.added(&mut slot.added_at, core.epoch);
        }
        slot.extra.ready_since = ready_since;
        let (priority, order, processing) =
            (slot.extra.priority, slot.extra.order, slot.processing);
        self.ready_len += 1;
        self.depth_inc(priority, hooks);
        if !processing {
            self.line_up(priority, order, i);
            wake.push(self.core.parked.wake_one());
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
        let key = self.core.slots[i as usize]
            .key
            .as_ref()
            .expect("an occupied slot");
        let keys = self.fairness.as_ref().map(|f| f(key));
        f(&mut self.ready, keys.as_ref().map(|k| k.as_slice()));
    }

    /// See [`Shared::fairness_depths`]: each key's depth summed over the priorities.
    fn fairness_depths(&self, now: Stamp) -> Vec<FairnessDepth> {
        let waits_since = self.waits_since.unwrap_or(now);
        let mut by_keys: std::collections::HashMap<Vec<String>, FairnessDepth> =
            std::collections::HashMap::new();
        for line in &self.ready.lines {
            let LineItems::Fair(fair) = &line.items else {
                continue;
            };
            for key in fair.keys() {
                let since = self.core.slots[key.oldest as usize].extra.ready_since;
                let wait = Duration::from_secs_f64(since.unwrap_or(waits_since).secs_until(now));
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
}

impl<T: Hash + Eq> PriorityState<T> {
    /// One add under the lock; `now` is the clock read of this batch of adds, read here
    /// if it is `None` and this add needs it. Returns whether a waiting time became the
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
                now.get_or_insert_with(|| self.core.now())
                    .after(after.min(FOREVER)),
            )
        };
        let (i, unused) = self.core.slot_for(hash, item);
        let slot = &self.core.slots[i as usize];
        let (dirty, waiting) = (slot.dirty, slot.ready_at);
        if !dirty && waiting.is_none() {
            // Not pending (new, or only processing): a fresh pending item.
            let order = self.next_order();
            let pending = &mut self.core.slots[i as usize].extra;
            pending.priority = priority;
            pending.order = order;
            return match ready_at {
                None => {
                    self.make_ready(i, now, hooks, wake);
                    (false, unused)
                }
                Some(at) => (self.core.wait_until(i, at), unused),
            };
        }
        // Pending already: keep the highest priority (at the back of its new line) and the
        // earliest ready time.
        let (old_priority, old_order) = (slot.extra.priority, slot.extra.order);
        if priority > old_priority {
            let order = self.next_order();
            let slot = &mut self.core.slots[i as usize];
            slot.extra.priority = priority;
            slot.extra.order = order;
            if dirty {
                let processing = slot.processing;
                self.depth_dec(old_priority, hooks);
                self.depth_inc(priority, hooks);
                if !processing {
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
                self.core.slots[i as usize].ready_at = None;
                self.make_ready(i, now, hooks, wake);
                (false, unused)
            }
            Some(at) if at < current => (self.core.wait_until(i, at), unused),
            Some(_) => (false, unused),
        }
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
            .field("processing", &self.core.processing())
            .field("waiting", &self.core.waiting_len())
            .field("shutting_down", &self.core.shutting_down)
            .finish()
    }
}
