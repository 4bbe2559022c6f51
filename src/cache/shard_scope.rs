//! [`ShardScope`]: a shard selector that changes while informers run, for a replica of a
//! sharded controller that should cache only the shards it holds.
//!
//! A ring of `shards` shards splits the 64-bit hash space of the namespace into contiguous
//! ranges, equal ([`ShardScope::namespaces`]) or at bounds of its own
//! ([`ShardScope::with_bounds`], [`ShardBounds`]); the scope holds the set of shards this replica
//! holds now, and every [`ListWatch`](super::ListWatch) made with
//! [`ListWatch::shard_scope`](super::ListWatch::shard_scope) asks the apiserver for exactly
//! those ranges (`shardSelector`, KEP-5866), or filters them itself on a server that does not
//! (see `list_watch.rs`).
//!
//! When the held set changes ([`ShardScope::hold`], [`ShardScope::release`]) the scope's
//! generation moves on: each list-watch on it ends its watch and its reflector lists again at
//! once. When shards were only added, it lists the added ranges alone, at no older version
//! than its store's, and adds what comes back; the watch then opens on the whole selection
//! from the store's version (so the shards kept miss no change), dropping the added ranges'
//! events the list already holds. When a shard was given up, its objects leave the store
//! without a list ([`ReflectorStore::release`](super::ReflectorStore::release); a store that
//! cannot has the whole new selector listed, whose replace drops them). [`ShardScope::listed`]
//! resolves once every
//! list-watch that has listed on the scope listed at that generation or later and handed its
//! list to its store (it marks that when it opens the watch that follows the list).
//!
//! While no shard is held the selector is empty, which the apiserver cannot express (it
//! refuses an empty `shardSelector`): a list-watch then sends nothing, lists nothing and
//! waits for the scope to change.
//!
//! Nothing in client-go, controller-runtime or kube-rs corresponds: their informers' selectors
//! are fixed for the informer's life.
//!
//! What follows from hashing the namespace:
//! - every object of a namespace is in one shard, so a key and the objects it owns (same
//!   namespace) are cached by the same replica;
//! - cluster-scoped objects have the namespace "", which hashes to 0xcbf29ce484222325: all of
//!   them fall in one shard (with 4 shards, shard 3);
//! - one namespace far bigger than the rest makes its shard as big: a shard cannot be smaller
//!   than its largest namespace;
//! - equal ranges hold equal shares of the hash space, not of the objects: bounds balanced
//!   on the namespaces' objects ([`ShardBounds::of_namespaces`]) even the shards out.
//!
//! Invariants: `held` only holds shards below `shards`; `generation` changes exactly when
//! `held` does; `selector` is the ranges of `held`, adjacent shards merged, `None` when empty.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::shard_bounds::{ShardBounds, ShardBoundsError};
use super::shard_selector::{HashRange, ShardKey, ShardSelector, fnv1a_64};

/// A scope's generation, the shards it held then and their selector (`None`: none held).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Selection {
    pub(crate) generation: u64,
    pub(crate) held: BTreeSet<u32>,
    pub(crate) selector: Option<ShardSelector>,
}

/// A changing set of held shards of a namespace-hash ring, shared by the list-watches that
/// ask for it and the sharding ring that holds the shards. Cheap to clone (one shared state).
#[derive(Clone)]
pub struct ShardScope {
    inner: Arc<Inner>,
}

struct Inner {
    bounds: ShardBounds,
    state: Mutex<State>,
    /// Bumped on every change of `state` or of a list-watch's listed generation.
    changed: watch::Sender<u64>,
}

struct State {
    held: BTreeSet<u32>,
    generation: u64,
    selector: Option<ShardSelector>,
    /// One entry per list-watch (and its clones) that listed on this scope: the last
    /// generation it listed at and handed to its store.
    listers: Vec<Arc<AtomicU64>>,
}

impl fmt::Debug for ShardScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("ShardScope")
            .field("bounds", &self.inner.bounds)
            .field("held", &state.held)
            .field("generation", &state.generation)
            .finish()
    }
}

impl ShardScope {
    /// A ring of `shards` equal namespace-hash ranges ([`ShardBounds::even`]), none held yet.
    pub fn namespaces(shards: u32) -> Result<Self, ShardBoundsError> {
        Ok(Self::with_bounds(ShardBounds::even(shards)?))
    }

    /// A ring of namespace-hash ranges starting at `bounds`, none held yet.
    pub fn with_bounds(bounds: ShardBounds) -> Self {
        Self {
            inner: Arc::new(Inner {
                bounds,
                state: Mutex::new(State {
                    held: BTreeSet::new(),
                    generation: 0,
                    selector: None,
                    listers: Vec::new(),
                }),
                changed: watch::Sender::new(0),
            }),
        }
    }

    /// How many shards the ring has.
    pub fn shards(&self) -> u32 {
        self.inner.bounds.shards()
    }

    /// Where the ring's shards start.
    pub fn bounds(&self) -> &ShardBounds {
        &self.inner.bounds
    }

    /// The shard a namespace's objects are in ("" for cluster-scoped objects).
    pub fn shard_of_namespace(&self, namespace: &str) -> u32 {
        self.inner.bounds.index_of(fnv1a_64(namespace.as_bytes()))
    }

    /// The shards held now, in order.
    pub fn held(&self) -> Vec<u32> {
        self.inner.state.lock().held.iter().copied().collect()
    }

    /// The selector of the shards held now (`None`: none held).
    pub fn selector(&self) -> Option<ShardSelector> {
        self.inner.state.lock().selector.clone()
    }

    /// Adds `shard` to the held set; the generation the list-watches must reach to have it
    /// (the current one if it was held already).
    ///
    /// # Panics
    /// If `shard` is not below [`shards`](Self::shards): the ring and the scope disagree.
    pub fn hold(&self, shard: u32) -> u64 {
        self.hold_all([shard])
    }

    /// Adds `shards` to the held set in one change (so one list); the generation the
    /// list-watches must reach to have them (the current one if all were held already).
    ///
    /// # Panics
    /// As [`hold`](Self::hold).
    pub fn hold_all(&self, shards: impl IntoIterator<Item = u32>) -> u64 {
        let shards: Vec<u32> = shards.into_iter().collect();
        if let Some(shard) = shards.iter().find(|s| **s >= self.shards()) {
            panic!("shard {shard} of a scope of {}", self.shards());
        }
        self.change(|held| {
            shards
                .into_iter()
                .fold(false, |changed, shard| held.insert(shard) | changed)
        })
    }

    /// Removes `shard` from the held set (its objects leave the caches with the next list);
    /// the new generation.
    pub fn release(&self, shard: u32) -> u64 {
        self.change(|held| held.remove(&shard))
    }

    fn change(&self, edit: impl FnOnce(&mut BTreeSet<u32>) -> bool) -> u64 {
        let generation = {
            let mut state = self.inner.state.lock();
            if !edit(&mut state.held) {
                return state.generation;
            }
            state.generation += 1;
            state.selector = selector_of(&self.inner.bounds, &state.held);
            state.generation
        };
        self.inner.changed.send_modify(|n| *n += 1);
        generation
    }

    /// Resolves once every list-watch that has listed on this scope listed at `generation`
    /// or later and handed that list to its store. A list-watch made on the scope but never
    /// run is not waited for.
    pub async fn listed(&self, generation: u64) {
        let mut rx = self.changes();
        loop {
            rx.borrow_and_update();
            let done = {
                let state = self.inner.state.lock();
                state
                    .listers
                    .iter()
                    .all(|l| l.load(Ordering::Acquire) >= generation)
            };
            if done || rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The current generation, held shards and selector, read together.
    pub(crate) fn snapshot(&self) -> Selection {
        let state = self.inner.state.lock();
        Selection {
            generation: state.generation,
            held: state.held.clone(),
            selector: state.selector.clone(),
        }
    }

    /// The selector of `shards` of this ring (`None`: no shard).
    pub(crate) fn selector_of<'a>(
        &self,
        shards: impl IntoIterator<Item = &'a u32>,
    ) -> Option<ShardSelector> {
        selector_of(&self.inner.bounds, &shards.into_iter().copied().collect())
    }

    /// A receiver that sees every change of the scope: of the held shards, or of a
    /// list-watch's listed generation (its value counts them). To wait for a condition on the
    /// scope without polling: mark the receiver seen, check, then await `changed()`.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// The current generation: it moves on with each change of the held shards (what
    /// [`listed`](Self::listed) waits for).
    pub fn generation(&self) -> u64 {
        self.inner.state.lock().generation
    }

    /// A new list-watch's record of the generation it last listed at (`u64::MAX` until its
    /// first list: [`listed`](Self::listed) does not wait for a list-watch never run).
    pub(crate) fn register(&self) -> Arc<AtomicU64> {
        let listed = Arc::new(AtomicU64::new(u64::MAX));
        self.inner.state.lock().listers.push(listed.clone());
        listed
    }

    /// `listed` (from [`register`](Self::register)) listed at `generation` and its store has
    /// the list.
    pub(crate) fn mark_listed(&self, listed: &AtomicU64, generation: u64) {
        listed.store(generation, Ordering::Release);
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Resolves once the generation is no longer `generation`.
    pub(crate) fn changed_since(
        &self,
        generation: u64,
    ) -> impl Future<Output = ()> + Send + 'static {
        let scope = self.clone();
        let mut rx = self.inner.changed.subscribe();
        async move {
            loop {
                rx.borrow_and_update();
                if scope.generation() != generation || rx.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The ranges of `held`, runs of adjacent shards as one range.
fn selector_of(bounds: &ShardBounds, held: &BTreeSet<u32>) -> Option<ShardSelector> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &shard in held {
        match runs.last_mut() {
            Some((_, end)) if *end == shard => *end = shard + 1,
            _ => runs.push((shard, shard + 1)),
        }
    }
    let ranges = runs.into_iter().map(|(first, end)| {
        let start = bounds.range(first).expect("held shards are in the ring");
        let last = bounds.range(end - 1).expect("held shards are in the ring");
        HashRange::new(start.start(), last.end()).expect("a run of ring ranges is a range")
    });
    ShardSelector::new(ShardKey::Namespace, ranges).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_shards_make_merged_ranges_and_every_change_a_generation() {
        let scope = ShardScope::namespaces(4).unwrap();
        assert_eq!(scope.selector(), None);
        assert_eq!(scope.hold(1), 1);
        assert_eq!(scope.hold(1), 1, "holding again changes nothing");
        assert_eq!(scope.hold(2), 2);
        assert_eq!(scope.hold(0), 3);
        assert_eq!(
            scope.selector().unwrap().to_query(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0xc000000000000000')"
        );
        assert_eq!(scope.release(1), 4);
        assert_eq!(
            scope.release(1),
            4,
            "releasing what is not held changes nothing"
        );
        assert_eq!(
            scope.selector().unwrap().to_query(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000') || \
             shardRange(object.metadata.namespace, '0x8000000000000000', '0xc000000000000000')"
        );
        assert_eq!(scope.held(), vec![0, 2]);
        scope.release(0);
        scope.release(2);
        assert_eq!(scope.selector(), None);
    }

    #[test]
    fn a_namespace_is_in_the_shard_whose_range_holds_its_hash() {
        let scope = ShardScope::namespaces(4).unwrap();
        for ns in ["", "default", "kube-system", "a", "abc", "ns-17"] {
            let shard = scope.shard_of_namespace(ns);
            let range = HashRange::ring(4, shard).unwrap();
            assert!(
                range.contains(fnv1a_64(ns.as_bytes())),
                "{ns:?} in shard {shard}"
            );
        }
        // Fixed: cluster-scoped objects ("" hashes to 0xcbf29ce484222325) are in shard 3 of 4.
        assert_eq!(scope.shard_of_namespace(""), 3);
        assert_eq!(scope.shard_of_namespace("default"), 3);
        assert_eq!(scope.shard_of_namespace("a"), 2);
    }

    #[test]
    fn a_scope_with_bounds_selects_and_places_namespaces_by_those_bounds() {
        let bounds: ShardBounds = "0x1000000000000000,0xf000000000000000".parse().unwrap();
        let scope = ShardScope::with_bounds(bounds);
        assert_eq!(scope.shards(), 3);
        scope.hold_all([1, 2]);
        assert_eq!(
            scope.selector().unwrap().to_query(),
            "shardRange(object.metadata.namespace, '0x1000000000000000', '0x10000000000000000')"
        );
        // "a" hashes to 0xaf63dc4c8601ec8c, "" to 0xcbf29ce484222325: both in the wide middle
        // shard, which equal thirds would have split.
        assert_eq!(scope.shard_of_namespace("a"), 1);
        assert_eq!(scope.shard_of_namespace(""), 1);
        assert_eq!(ShardScope::namespaces(3).unwrap().shard_of_namespace(""), 2);
    }

    #[tokio::test]
    async fn listed_waits_for_every_list_watch_that_listed_but_not_one_never_run() {
        let scope = ShardScope::namespaces(2).unwrap();
        let (a, b, never_run) = (scope.register(), scope.register(), scope.register());
        scope.mark_listed(&a, 0);
        scope.mark_listed(&b, 0);
        let generation = scope.hold(0);
        scope.mark_listed(&a, generation);
        let waiting = tokio::spawn({
            let scope = scope.clone();
            async move { scope.listed(generation).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "b has not listed yet");
        scope.mark_listed(&b, generation);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("listed resolves once both listed")
            .unwrap();
        drop(never_run);
    }

    #[test]
    fn changes_sees_each_change_of_the_held_shards_and_none_without_one() {
        let scope = ShardScope::namespaces(2).unwrap();
        let mut changes = scope.changes();
        assert!(!changes.has_changed().unwrap());
        scope.hold(0);
        assert!(changes.has_changed().unwrap(), "a shard taken");
        changes.borrow_and_update();
        scope.hold(0);
        assert!(!changes.has_changed().unwrap(), "held already: no change");
        scope.release(0);
        assert!(changes.has_changed().unwrap(), "a shard given up");
    }
}
