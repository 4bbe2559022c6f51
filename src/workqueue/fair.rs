//! Fair hand-out within one priority: the ready items of a priority queue's line, grouped by
//! their fairness keys (a namespace; or a cluster, then a namespace), handed out round-robin
//! across the keys that have a ready item, first in first out within one key, and fair at
//! each level of nested keys. No client-go counterpart; controller-runtime's is the unmerged
//! "Priorityqueue: Optionally return items fairly" (controller-runtime#3261), whose
//! description says why sorting alone cannot do it: what is fair depends on what was handed
//! out before. This keeps that history as a ring per level: the key handed out from last goes
//! to the back of its ring.
//!
//! A line holds only items that can be handed out (a ready item a worker still has waits
//! outside the line and joins it at `done`, see `priority_state.rs`), so a key whose items are
//! all being processed is not in any ring and takes no turn.
//!
//! Layout: a tree of [`Node`]s in an arena, the root holding the keyless; a node's `ring`
//! lists its children that hold ready items, next turn first, and the node itself (its own
//! items: those whose keys end there) as one more member. A node with no ready item left
//! leaves its parent's ring and stays for the key's next item (a queue that keeps draining
//! would otherwise free and make the same namespace's node for every item); once more than
//! [`IDLE_KEYS`] nodes are idle, every idle node is freed, so the tree holds the keys with
//! ready items and at most that many others. Keys are looked up by (parent, text) in one hash
//! table.
//!
//! This module is a leaf (std and hashbrown only), so `tests/local/workqueue_loom.rs` compiles it
//! with `priority_state.rs`.

use std::collections::VecDeque;
use std::fmt;
use std::hash::BuildHasher;
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;

/// How many levels of fairness keys an item can have.
pub const MAX_FAIRNESS_LEVELS: usize = 4;

/// An item's fairness keys, outermost first (for example a cluster, then a namespace); none
/// puts the item with the other keyless ones, which take their turn as one key.
///
/// # Examples
/// ```
/// use kubeloop::workqueue::FairnessKeys;
///
/// let keys = FairnessKeys::new(&["cluster-a", "team-1"]);
/// assert_eq!(keys.as_slice(), ["cluster-a", "team-1"]);
/// assert_eq!(FairnessKeys::one("default").as_slice(), ["default"]);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FairnessKeys<'a> {
    keys: [&'a str; MAX_FAIRNESS_LEVELS],
    len: usize,
}

impl<'a> FairnessKeys<'a> {
    /// The keys of `keys`, outermost first.
    ///
    /// # Panics
    /// With more than [`MAX_FAIRNESS_LEVELS`] keys.
    pub fn new(keys: &[&'a str]) -> Self {
        assert!(
            keys.len() <= MAX_FAIRNESS_LEVELS,
            "at most {MAX_FAIRNESS_LEVELS} levels of fairness keys, got {}",
            keys.len()
        );
        let mut out = FairnessKeys {
            keys: [""; MAX_FAIRNESS_LEVELS],
            len: keys.len(),
        };
        out.keys[..keys.len()].copy_from_slice(keys);
        out
    }

    /// One key.
    pub fn one(key: &'a str) -> Self {
        // Without `new`'s slice copy: an extractor runs under the queue's lock at every add.
        FairnessKeys {
            keys: [key, "", "", ""],
            len: 1,
        }
    }

    /// The keys, outermost first.
    pub fn as_slice(&self) -> &[&'a str] {
        &self.keys[..self.len]
    }
}

impl fmt::Debug for FairnessKeys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl fmt::Display for FairnessKeys<'_> {
    /// The keys joined by ` / `; `(none)` for none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            return f.write_str("(none)");
        }
        f.write_str(&self.as_slice().join(" / "))
    }
}

/// Gives each item its fairness keys: a pure function of the item (the same item always gets
/// the same keys), cheap (it runs under the queue's lock at every hand-out and return to a
/// line), for example `|key: &String| FairnessKeys::one(namespace_of(key))`.
pub type FairnessExtractor<T> = dyn for<'a> Fn(&'a T) -> FairnessKeys<'a> + Send + Sync;

/// One key's ready items that no worker has: [`PriorityQueue::fairness_depths`].
///
/// [`PriorityQueue::fairness_depths`]: super::PriorityQueue::fairness_depths
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairnessDepth {
    /// The keys, outermost first.
    pub keys: Vec<String>,
    /// How many of its items are ready, summed over the priorities.
    pub depth: usize,
    /// How long its oldest ready item has waited.
    pub longest_wait: Duration,
}

/// Puts (`order`, `slot`) into `items`, whose order numbers increase: at the back, or in its
/// place for an item that rejoins its line after its worker's `done`.
pub(crate) fn insert_by_order(items: &mut VecDeque<(u64, u32)>, order: u64, slot: u32) {
    match items.back() {
        Some(&(last, _)) if last > order => {
            let at = items.partition_point(|&(o, _)| o < order);
            items.insert(at, (order, slot));
        }
        _ => items.push_back((order, slot)),
    }
}

/// The front member of `ring` has had its turn: it goes to the back if it `stays` (it has
/// ready items left; in a ring of one that is where it is already), out of the ring if not.
fn take_turn(ring: &mut VecDeque<u32>, stays: bool) {
    if !stays {
        ring.pop_front();
    } else if ring.len() > 1 {
        let member = ring.pop_front().expect("not empty");
        ring.push_back(member);
    }
}

/// The root node: items without keys, and the first level of keys.
const ROOT: u32 = 0;

/// Idle nodes (no ready item) kept for their keys' next items; one more frees them all.
const IDLE_KEYS: usize = 256;

/// One priority's ready items, by fairness key. Entries are (order number, slot) as in the
/// priority queue's plain lines.
pub(crate) struct FairLine {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Non-root nodes, found by (parent, key).
    children: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Nodes other than the root with no ready item.
    idle: usize,
}

struct Node {
    parent: u32,
    key: Box<str>,
    hash: u64,
    /// Ready items under this node, its own and its children's.
    len: usize,
    /// Its own items (keys ending here), order numbers increasing.
    items: VecDeque<(u64, u32)>,
    /// The members with ready items, next turn first: children, and the node itself for its
    /// own items.
    ring: VecDeque<u32>,
    /// In the free list (its slot is for the next new key).
    freed: bool,
}

/// One key's ready items, for [`FairLine::keys`].
pub(crate) struct KeyDepth {
    /// The keys from the outermost, as given.
    pub(crate) keys: Vec<String>,
    /// Its ready items (its own, not its children's).
    pub(crate) depth: usize,
    /// The slot of its oldest ready item (the first in its line).
    pub(crate) oldest: u32,
}

impl Default for FairLine {
    fn default() -> Self {
        FairLine {
            nodes: vec![Node::new(ROOT, "".into(), 0)],
            free: Vec::new(),
            children: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            idle: 0,
        }
    }
}

impl Node {
    fn new(parent: u32, key: Box<str>, hash: u64) -> Self {
        Node {
            parent,
            key,
            hash,
            len: 0,
            items: VecDeque::new(),
            ring: VecDeque::new(),
            freed: false,
        }
    }
}

impl FairLine {
    /// Ready items in the line: the root's count.
    pub(crate) fn len(&self) -> usize {
        self.nodes[ROOT as usize].len
    }

    fn hash_of(&self, parent: u32, key: &str) -> u64 {
        self.hasher.hash_one((parent, key))
    }

    fn find(&self, parent: u32, key: &str) -> Option<u32> {
        self.find_hashed(self.hash_of(parent, key), parent, key)
    }

    fn find_hashed(&self, hash: u64, parent: u32, key: &str) -> Option<u32> {
        let nodes = &self.nodes;
        self.children
            .find(hash, |&n| {
                let node = &nodes[n as usize];
                node.parent == parent && &*node.key == key
            })
            .copied()
    }

    /// The child of `parent` for `key`, created (empty, idle) if missing.
    fn child(&mut self, parent: u32, key: &str) -> u32 {
        let hash = self.hash_of(parent, key);
        if let Some(child) = self.find_hashed(hash, parent, key) {
            return child;
        }
        let node = Node::new(parent, key.into(), hash);
        let child = match self.free.pop() {
            Some(free) => {
                self.nodes[free as usize] = node;
                free
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 keys")
            }
        };
        let nodes = &self.nodes;
        self.children
            .insert_unique(hash, child, |&n| nodes[n as usize].hash);
        self.idle += 1;
        child
    }

    /// The node of `keys`, if it exists.
    fn existing(&self, keys: &[&str]) -> Option<u32> {
        keys.iter().try_fold(ROOT, |at, key| self.find(at, key))
    }

    /// Puts `slot` in the line of `keys` at `order` (usually the back). A key that had no
    /// ready item joins the back of its parent's ring.
    pub(crate) fn insert(&mut self, keys: &[&str], order: u64, slot: u32) {
        // Down the path in one pass, counting the item at each node.
        self.nodes[ROOT as usize].len += 1;
        let mut at = ROOT;
        for key in keys {
            let child = self.child(at, key);
            let node = &mut self.nodes[child as usize];
            node.len += 1;
            if node.len == 1 {
                self.idle -= 1;
                self.nodes[at as usize].ring.push_back(child);
            }
            at = child;
        }
        let node = &mut self.nodes[at as usize];
        if node.items.is_empty() {
            node.ring.push_back(at);
        }
        insert_by_order(&mut node.items, order, slot);
    }

    /// Removes the entry at `order` from the line of `keys`; whether it was there.
    pub(crate) fn remove(&mut self, keys: &[&str], order: u64) -> bool {
        let Some(leaf) = self.existing(keys) else {
            return false;
        };
        let node = &mut self.nodes[leaf as usize];
        let Ok(at) = node.items.binary_search_by_key(&order, |&(o, _)| o) else {
            return false;
        };
        node.items.remove(at);
        if node.items.is_empty() {
            let own = node
                .ring
                .iter()
                .position(|&m| m == leaf)
                .expect("in its ring");
            node.ring.remove(own);
        }
        self.uncount(leaf);
        true
    }

    /// Takes the next item: at each level, from the member whose turn it is, which then goes
    /// to the back of its ring if it still has ready items and leaves the ring if not.
    pub(crate) fn pop(&mut self) -> Option<u32> {
        if self.len() == 0 {
            return None;
        }
        // Down the path in one pass, counting the item out at each node.
        let mut at = ROOT;
        let slot = loop {
            let node = &mut self.nodes[at as usize];
            node.len -= 1;
            let member = *node
                .ring
                .front()
                .expect("a node with ready items has a turn");
            if member == at {
                let (_, slot) = node.items.pop_front().expect("its own turn: it has items");
                take_turn(&mut node.ring, !node.items.is_empty());
                break slot;
            }
            // The member's count still holds the item being taken.
            let stays = self.nodes[member as usize].len > 1;
            take_turn(&mut self.nodes[at as usize].ring, stays);
            if !stays {
                self.idle += 1;
            }
            at = member;
        };
        self.free_idle_beyond_bound();
        Some(slot)
    }

    /// One item less under `leaf` (already out of its items, for `remove`): counts it up the
    /// path, taking the nodes left without ready items out of their parents' rings (idle).
    fn uncount(&mut self, leaf: u32) {
        let mut at = leaf;
        loop {
            let node = &mut self.nodes[at as usize];
            node.len -= 1;
            if at == ROOT {
                break;
            }
            let parent = node.parent;
            if node.len == 0 {
                debug_assert!(node.ring.is_empty() && node.items.is_empty());
                self.idle += 1;
                let ring = &mut self.nodes[parent as usize].ring;
                let place = ring
                    .iter()
                    .position(|&m| m == at)
                    .expect("in its parent's ring");
                ring.remove(place);
            }
            at = parent;
        }
        self.free_idle_beyond_bound();
    }

    /// Frees every idle node once there are more than [`IDLE_KEYS`].
    fn free_idle_beyond_bound(&mut self) {
        if self.idle > IDLE_KEYS {
            self.free_idle();
        }
    }

    /// Frees every idle node (an idle node's children are idle too).
    fn free_idle(&mut self) {
        let nodes = &self.nodes;
        self.children.retain(|n| nodes[*n as usize].len > 0);
        for (at, node) in self.nodes.iter_mut().enumerate().skip(1) {
            if node.len == 0 && !node.freed {
                node.freed = true;
                node.key = "".into();
                self.free.push(at as u32);
            }
        }
        self.idle = 0;
    }

    /// Every key with ready items of its own, with how many and its oldest.
    pub(crate) fn keys(&self) -> Vec<KeyDepth> {
        let mut out = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(at) = stack.pop() {
            let node = &self.nodes[at as usize];
            if let Some(&(_, oldest)) = node.items.front() {
                out.push(KeyDepth {
                    keys: self.path(at),
                    depth: node.items.len(),
                    oldest,
                });
            }
            stack.extend(node.ring.iter().copied().filter(|&m| m != at));
        }
        out
    }

    /// The keys from the root to `at`.
    fn path(&self, mut at: u32) -> Vec<String> {
        let mut keys = Vec::new();
        while at != ROOT {
            let node = &self.nodes[at as usize];
            keys.push(node.key.to_string());
            at = node.parent;
        }
        keys.reverse();
        keys
    }

    /// Nodes held (the root included), for tests: freed nodes are not.
    #[cfg(test)]
    pub(crate) fn nodes_held(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Nodes held for their keys' next items, without a ready item.
    #[cfg(test)]
    pub(crate) fn idle_nodes(&self) -> usize {
        self.idle
    }
}
