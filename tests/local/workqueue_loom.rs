//! Model-checks the workqueue's hand-off protocol with loom (kubeloop's own tests).
//!
//! `src/workqueue/shared.rs`, the core both queues share, takes its lock from a one-item shim
//! (`super::sync::Mutex`). This test target compiles that very file, and the two queues'
//! states over it (`state.rs`, `priority_state.rs`), next to a shim of the same shape that
//! hands out loom's `Mutex`, so loom runs every interleaving of the queue's transitions, its
//! parked-`get` list
//! and its wake-ups (at most three preemptions per execution, loom's usual bound). No
//! `--cfg loom` is needed: `cargo test --test local workqueue_loom` (and so `hack/test` and
//! `cargo test --all-targets`) runs the models.
//!
//! What must hold in every interleaving:
//! - an item added while a `get` parks is handed to a `get` (no lost wake-up);
//! - an add that returns without the lock because its key is dirty (`state.rs`'s filter) is
//!   seen by the `get` it merged into: a worker that does not see what the adder wrote before
//!   the add finds the item back in line at `done`;
//! - an item is never handed to two workers at once, and one added while processing comes
//!   back after `done`;
//! - a `get` that is woken and then cancelled passes the wake-up on;
//! - `shutdown` wakes every parked `get`;
//! - the queue ends with nothing tracked and nothing parked.
//!
//! The priority queue's state (`priority_state.rs`) is checked for the same promises, plus: a
//! higher priority added concurrently is never lost. With fairness keys (`fair.rs`, compiled
//! here too): two workers and two producers of two keys, one key's item re-added while a
//! worker has it; every item is handed out once per add, never to two workers at once, first
//! in first out within a key, and the lines end empty.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

/// The loom side of `src/workqueue/sync.rs`: same shape, loom's lock.
mod sync {
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().expect("the queue's lock is never poisoned")
        }
    }

    pub(crate) use loom::sync::atomic::{AtomicBool, fence};

    /// Two cells: enough for one key and a neighbour.
    pub(crate) const DEDUP_CELLS: usize = 2;

    /// A cell of the duplicate-add filter as loom sees it: a loom lock around the entry
    /// (crossbeam-epoch is not modelled), so loom interleaves each read of a cell with its writes.
    pub(crate) struct Cell<T>(loom::sync::Mutex<Option<std::sync::Arc<T>>>);

    impl<T> Cell<T> {
        pub(crate) fn empty() -> Self {
            Cell(loom::sync::Mutex::new(None))
        }

        pub(crate) fn read<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
            let entry = self.0.lock().expect("never poisoned").clone();
            f(entry.as_deref())
        }

        pub(crate) fn store(&self, value: Option<std::sync::Arc<T>>) {
            *self.0.lock().expect("never poisoned") = value;
        }
    }
}

#[path = "../../src/workqueue/parked.rs"]
#[allow(dead_code)]
mod parked;

#[path = "../../src/workqueue/shared.rs"]
#[allow(dead_code)]
mod shared;

#[path = "../../src/workqueue/state.rs"]
#[allow(dead_code)]
mod state;

#[path = "../../src/workqueue/fair.rs"]
#[allow(dead_code)]
mod fair;

#[path = "../../src/workqueue/priority_state.rs"]
#[allow(dead_code)]
mod priority_state;

use priority_state::{Add, PriorityState};
use shared::{Discipline, Shared};
use state::State;

fn queue() -> Arc<Shared<State<u32>>> {
    Arc::new(Shared::new(State::new(), None))
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Every item and every parked `get` is gone.
fn assert_empty(q: &Shared<State<u32>>) {
    q.inspect(|s| {
        assert_eq!(s.core().tracked(), 0, "items left tracked");
        assert_eq!(s.core().parked(), 0, "gets left parked");
        assert_eq!(s.core().processing(), 0);
    });
}

#[test]
fn an_add_reaches_a_parked_get() {
    model(|| {
        let q = queue();
        let getter = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get(None)))
        };
        q.add(7);
        let got = getter.join().unwrap();
        assert_eq!(got, Some(7));
        q.done(&7);
        assert_empty(&q);
    });
}

#[test]
fn two_workers_never_hold_one_item_and_a_readd_comes_back() {
    model(|| {
        let q = queue();
        q.add(1);
        let busy = Arc::new(AtomicBool::new(false));
        // Each worker handles one item; the first to get 1 adds it again while processing,
        // so 1 is handed out exactly twice, never to both at once.
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (q, busy) = (q.clone(), busy.clone());
                thread::spawn(move || {
                    let item = loom::future::block_on(q.get(None)).expect("not shut down");
                    assert!(
                        !busy.swap(true, Ordering::SeqCst),
                        "item handed to two workers at once"
                    );
                    q.add(item); // dirty while processing: comes back after done
                    busy.store(false, Ordering::SeqCst);
                    q.done(&item);
                    item
                })
            })
            .collect();
        let handled: Vec<u32> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        assert_eq!(handled, vec![1, 1]);
        // The second worker's own re-add left 1 in line once more.
        q.inspect(|s| assert_eq!((s.line_len(), s.core().tracked()), (1, 1)));
        q.shutdown(false);
        let last = loom::future::block_on(q.get(None));
        assert_eq!(last, Some(1));
        q.done(&1);
        assert_eq!(loom::future::block_on(q.get(None)), None);
        assert_empty(&q);
    });
}

#[test]
fn a_duplicate_add_without_the_lock_is_seen_by_the_get_it_merges_into() {
    model(|| {
        let q = queue();
        q.add(1);
        q.add(1); // a duplicate under the lock: publishes 1 in the filter
        let written = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let producer = {
            let (q, written) = (q.clone(), written.clone());
            thread::spawn(move || {
                written.store(1, Ordering::Relaxed);
                q.add(1);
            })
        };
        let worker = {
            let (q, written) = (q.clone(), written.clone());
            thread::spawn(move || {
                let item = loom::future::block_on(q.get(None)).expect("not shut down");
                let seen = written.load(Ordering::Relaxed);
                q.done(&item);
                seen
            })
        };
        producer.join().unwrap();
        let seen = worker.join().unwrap();
        if seen == 0 {
            q.inspect(|s| {
                assert_eq!(
                    s.line_len(),
                    1,
                    "the worker missed the adder's write and the add was merged away"
                )
            });
        }
        q.shutdown(false);
        while let Some(item) = loom::future::block_on(q.get(None)) {
            q.done(&item);
        }
        assert_empty(&q);
    });
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    Pin::new(fut).poll(&mut cx)
}

#[test]
fn a_cancelled_get_passes_its_wake_up_on() {
    model(|| {
        let q = queue();
        // This get parks (or takes the item), then is dropped without being polled again.
        let canceller = {
            let q = q.clone();
            thread::spawn(move || {
                let mut get = q.get(None);
                if let Poll::Ready(Some(item)) = poll_once(&mut get) {
                    // It got the item after all: hand it back as a worker would.
                    q.done(&item);
                    q.add(item);
                }
                drop(get);
            })
        };
        let getter = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get(None)))
        };
        q.add(3);
        canceller.join().unwrap();
        assert_eq!(
            getter.join().unwrap(),
            Some(3),
            "the item reached the live get"
        );
        q.done(&3);
        assert_empty(&q);
    });
}

#[test]
fn shutdown_wakes_every_parked_get() {
    model(|| {
        let q = queue();
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || loom::future::block_on(q.get(None)))
            })
            .collect();
        q.shutdown(false);
        for g in getters {
            assert_eq!(g.join().unwrap(), None);
        }
        q.add(1);
        assert_empty(&q);
    });
}

#[test]
fn done_requeues_for_a_parked_get() {
    model(|| {
        let q = queue();
        q.add(5);
        let first = loom::future::block_on(q.get(None));
        assert_eq!(first, Some(5));
        q.add(5); // dirty while processing
        let getter = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get(None)))
        };
        q.done(&5);
        assert_eq!(getter.join().unwrap(), Some(5));
        q.done(&5);
        assert_empty(&q);
    });
}

fn priority_queue() -> Arc<Shared<PriorityState<u32>>> {
    Arc::new(Shared::new(PriorityState::new(None, false), None))
}

/// The priority queue's timer hook: no delays in these models, so nothing to start.
fn no_timer(_: &Arc<Shared<PriorityState<u32>>>, _: &mut PriorityState<u32>) {}

fn padd(q: &Arc<Shared<PriorityState<u32>>>, item: u32, priority: i32) {
    let add = Add {
        item,
        priority,
        after: std::time::Duration::ZERO,
    };
    q.add_all([(q.hash(&item), add)], no_timer);
}

fn assert_priority_empty(q: &Shared<PriorityState<u32>>) {
    q.inspect(|s| {
        assert_eq!(s.core().tracked(), 0, "items left tracked");
        assert_eq!(s.core().parked(), 0, "gets left parked");
        assert_eq!(s.core().processing(), 0);
    });
}

#[test]
fn priority_queue_an_add_reaches_a_parked_get() {
    model(|| {
        let q = priority_queue();
        let getter = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get(None)))
        };
        padd(&q, 7, -100);
        assert_eq!(getter.join().unwrap(), Some((7, -100)));
        q.done(&7);
        assert_priority_empty(&q);
    });
}

#[test]
fn priority_queue_two_workers_never_hold_one_item_and_a_readd_comes_back() {
    model(|| {
        let q = priority_queue();
        padd(&q, 1, 0);
        let busy = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (q, busy) = (q.clone(), busy.clone());
                thread::spawn(move || {
                    let (item, _) = loom::future::block_on(q.get(None)).expect("not shut down");
                    assert!(
                        !busy.swap(true, Ordering::SeqCst),
                        "item handed to two workers at once"
                    );
                    padd(&q, item, 5); // ready while processing: comes back after done
                    busy.store(false, Ordering::SeqCst);
                    q.done(&item);
                    item
                })
            })
            .collect();
        let handled: Vec<u32> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        assert_eq!(handled, vec![1, 1]);
        let last = loom::future::block_on(q.get(None));
        assert_eq!(last, Some((1, 5)), "the re-add kept its priority");
        q.done(&1);
        assert_priority_empty(&q);
    });
}

#[test]
fn priority_queue_a_cancelled_get_passes_its_wake_up_on() {
    model(|| {
        let q = priority_queue();
        let canceller = {
            let q = q.clone();
            thread::spawn(move || {
                let mut get = q.get(None);
                if let Poll::Ready(Some((item, priority))) = poll_once(&mut get) {
                    q.done(&item);
                    padd(&q, item, priority);
                }
                drop(get);
            })
        };
        let getter = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get(None)))
        };
        padd(&q, 3, 2);
        canceller.join().unwrap();
        assert_eq!(getter.join().unwrap(), Some((3, 2)));
        q.done(&3);
        assert_priority_empty(&q);
    });
}

#[test]
fn priority_queue_concurrent_adds_keep_the_highest_priority() {
    model(|| {
        let q = priority_queue();
        let low = {
            let q = q.clone();
            thread::spawn(move || padd(&q, 9, -100))
        };
        padd(&q, 9, 10);
        low.join().unwrap();
        q.inspect(|s| assert_eq!(s.core().tracked(), 1, "one item"));
        assert_eq!(loom::future::block_on(q.get(None)), Some((9, 10)));
        q.done(&9);
        q.shutdown(false);
        assert_eq!(loom::future::block_on(q.get(None)), None);
        assert_priority_empty(&q);
    });
}

/// Even items under one fairness key, odd ones under another.
fn parity(item: &u32) -> fair::FairnessKeys<'_> {
    fair::FairnessKeys::one(["even", "odd"][(*item % 2) as usize])
}

#[test]
fn priority_queue_with_fairness_keys_hands_each_add_out_once_and_in_order_within_a_key() {
    model(|| {
        let q = Arc::new(Shared::new(
            PriorityState::new(Some(Arc::new(parity)), false),
            None,
        ));
        // Item 1 (odd) is handed out first and re-added while its worker has it.
        padd(&q, 1, 0);
        let (first, _) = loom::future::block_on(q.get(None)).expect("ready");
        assert_eq!(first, 1);
        let producers: Vec<_> = [[2, 4], [3, 5]]
            .into_iter()
            .map(|items| {
                let q = q.clone();
                thread::spawn(move || items.into_iter().for_each(|i| padd(&q, i, 0)))
            })
            .collect();
        let busy: Arc<Vec<AtomicBool>> = Arc::new((0..6).map(|_| AtomicBool::new(false)).collect());
        let handed = Arc::new(loom::sync::Mutex::new(Vec::new()));
        let worker = {
            let (q, busy, handed) = (q.clone(), busy.clone(), handed.clone());
            thread::spawn(move || {
                for _ in 0..2 {
                    let (item, _) = loom::future::block_on(q.get(None)).expect("not shut down");
                    assert!(
                        !busy[item as usize].swap(true, Ordering::SeqCst),
                        "{item} twice"
                    );
                    handed.lock().unwrap().push(item);
                    busy[item as usize].store(false, Ordering::SeqCst);
                    q.done(&item);
                }
            })
        };
        padd(&q, 1, 0);
        q.done(&1);
        for p in producers {
            p.join().unwrap();
        }
        worker.join().unwrap();
        let mut handed = handed.lock().unwrap().clone();
        while q.len() > 0 {
            let (item, _) = loom::future::block_on(q.get(None)).expect("ready");
            handed.push(item);
            q.done(&item);
        }
        let mut sorted = handed.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            [1, 2, 3, 4, 5],
            "each add handed out once: {handed:?}"
        );
        let place = |i: u32| handed.iter().position(|&h| h == i).unwrap();
        assert!(
            place(2) < place(4) && place(3) < place(5),
            "first in, first out within a key: {handed:?}"
        );
        assert_priority_empty(&q);
    });
}
