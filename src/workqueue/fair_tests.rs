//! Tests of `fair.rs`'s lines (kept apart so that `tests/local/workqueue_loom.rs`, which compiles
//! `fair.rs`, does not run them again).

use super::fair::{FairLine, FairnessKeys};

/// Pops everything, as (slot) in hand-out order.
fn drain(line: &mut FairLine) -> Vec<u32> {
    std::iter::from_fn(|| line.pop()).collect()
}

#[test]
fn keys_take_turns_and_each_key_is_first_in_first_out() {
    let mut line = FairLine::default();
    // busy: slots 0..6 first, then quiet's 10 and other's 20, 21.
    for i in 0..6 {
        line.insert(&["busy"], i, i as u32);
    }
    line.insert(&["quiet"], 6, 10);
    line.insert(&["other"], 7, 20);
    line.insert(&["other"], 8, 21);
    assert_eq!(line.len(), 9);
    assert_eq!(drain(&mut line), [0, 10, 20, 1, 21, 2, 3, 4, 5]);
    assert_eq!(line.len(), 0);
    assert_eq!(
        (line.nodes_held(), line.idle_nodes()),
        (4, 3),
        "emptied keys stay, idle, for their next items"
    );
}

#[test]
fn nested_keys_are_fair_at_each_level() {
    let mut line = FairLine::default();
    // Cluster a has two namespaces, cluster b one; a's x has many items.
    let mut order = 0;
    let mut add = |line: &mut FairLine, keys: &[&str], slot: u32| {
        line.insert(keys, order, slot);
        order += 1;
    };
    for slot in 0..4 {
        add(&mut line, &["a", "x"], slot);
    }
    add(&mut line, &["a", "y"], 10);
    add(&mut line, &["b", "z"], 20);
    add(&mut line, &["b", "z"], 21);
    // Turns alternate between clusters a and b; within a, between x and y.
    assert_eq!(drain(&mut line), [0, 20, 10, 21, 1, 2, 3]);
}

#[test]
fn keyless_items_take_one_turn_among_the_keys() {
    let mut line = FairLine::default();
    line.insert(&[], 0, 0);
    line.insert(&[], 1, 1);
    line.insert(&["ns"], 2, 10);
    line.insert(&["ns"], 3, 11);
    assert_eq!(drain(&mut line), [0, 10, 1, 11]);
}

#[test]
fn a_key_that_empties_and_comes_back_goes_to_the_back_of_the_ring() {
    let mut line = FairLine::default();
    line.insert(&["a"], 0, 0);
    line.insert(&["b"], 1, 10);
    line.insert(&["b"], 2, 11);
    assert_eq!(line.pop(), Some(0), "a's turn");
    // a is empty and gone; it comes back behind b.
    line.insert(&["a"], 3, 1);
    assert_eq!(drain(&mut line), [10, 1, 11]);
}

#[test]
fn remove_takes_an_entry_out_and_frees_an_emptied_key() {
    let mut line = FairLine::default();
    line.insert(&["a", "x"], 0, 0);
    line.insert(&["b"], 1, 10);
    line.insert(&["a", "x"], 2, 1);
    assert!(line.remove(&["a", "x"], 0));
    assert!(!line.remove(&["a", "x"], 0), "already gone");
    assert!(!line.remove(&["nope"], 2), "no such key");
    assert!(line.remove(&["a", "x"], 2));
    assert_eq!(line.idle_nodes(), 2, "a and a/x are idle, b is not");
    assert_eq!(drain(&mut line), [10]);
}

#[test]
fn an_entry_rejoining_keeps_its_place_by_order() {
    let mut line = FairLine::default();
    line.insert(&["a"], 5, 5);
    line.insert(&["a"], 7, 7);
    line.insert(&["a"], 6, 6);
    assert_eq!(drain(&mut line), [5, 6, 7]);
}

#[test]
fn keys_reports_each_key_with_its_depth_and_oldest_item() {
    let mut line = FairLine::default();
    line.insert(&["a", "x"], 0, 3);
    line.insert(&["a", "x"], 1, 4);
    line.insert(&["a"], 2, 5);
    line.insert(&[], 3, 6);
    let mut keys: Vec<_> = line
        .keys()
        .into_iter()
        .map(|k| (k.keys.join("/"), k.depth, k.oldest))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [("".into(), 1, 6), ("a".into(), 1, 5), ("a/x".into(), 2, 3)]
    );
}

#[test]
fn fairness_keys_say_what_they_hold() {
    assert_eq!(FairnessKeys::new(&[]).to_string(), "(none)");
    assert_eq!(FairnessKeys::new(&["c", "ns"]).to_string(), "c / ns");
    assert_eq!(format!("{:?}", FairnessKeys::one("ns")), "[\"ns\"]");
}

#[test]
#[should_panic(expected = "at most 4 levels")]
fn more_levels_than_the_most_panic() {
    FairnessKeys::new(&["a", "b", "c", "d", "e"]);
}

#[test]
fn idle_keys_are_kept_up_to_a_bound_then_freed() {
    let mut line = FairLine::default();
    // One key's item at a time, as a queue that keeps draining sees them.
    let keys: Vec<String> = (0..1000).map(|i| format!("ns-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        line.insert(&["cluster", key], i as u64, i as u32);
        assert_eq!(line.pop(), Some(i as u32));
        assert!(
            line.idle_nodes() <= 256,
            "at most 256 idle: {}",
            line.idle_nodes()
        );
        assert!(line.nodes_held() <= 258, "{} nodes held", line.nodes_held());
    }
    // A key that comes back after its node was freed works as a new one.
    line.insert(&["cluster", "ns-0"], 5000, 7);
    line.insert(&["cluster", "ns-999"], 5001, 8);
    assert_eq!(drain(&mut line), [7, 8]);
}
