use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::cache::delta::DeltaType;
use crate::cache::fifo_fixtures::{
    BASIC, Flat, LINE_JUMPERS, apply, deltas, f, flat, known_store, obj, val,
};
use crate::cache::keys::default_key_func;
use crate::cache::thread_safe_store::ThreadSafeStore;

/// A queue whose known objects are `objs`.
fn fifo_with_known(objs: &[ConfigMap]) -> RealFIFO<ConfigMap> {
    RealFIFO::new(default_key_func(), Arc::new(known_store(objs)))
}

fn fifo() -> RealFIFO<ConfigMap> {
    fifo_with_known(&[])
}

/// The one event a popped or queued item carries.
fn one(p: &Popped<ConfigMap>) -> &Delta<ConfigMap> {
    match p {
        Popped::Deltas(d) => {
            assert_eq!(d.len(), 1, "a RealFIFO pops one delta at a time");
            &d[0]
        }
        other => panic!("expected one event, got {other:?}"),
    }
}

fn items(q: &RealFIFO<ConfigMap>) -> Vec<Flat> {
    q.items().iter().map(|p| flat(one(p))).collect()
}

/// Pops one item: (its flat form, is_in_initial_list).
async fn pop1(q: &RealFIFO<ConfigMap>) -> (Flat, bool) {
    q.pop(|p, initial| (flat(one(&p)), initial))
        .await
        .expect("queue closed")
}

async fn pop_all(q: &RealFIFO<ConfigMap>) -> Vec<Flat> {
    let mut out = Vec::new();
    while !q.is_empty() {
        out.push(pop1(q).await.0);
    }
    out
}

// client-go: TestRealFIFO_basic
#[tokio::test(start_paused = true)]
async fn basic_adds_and_updates_pop_one_at_a_time_in_order() {
    let q = fifo();
    apply(&q, BASIC);
    let mut want = Vec::new();
    for i in 0..5 {
        want.push(f(DeltaType::Added, &format!("a{i}"), i));
    }
    for i in 0..5 {
        want.push(f(DeltaType::Updated, &format!("a{i}"), i + 10));
    }
    assert_eq!(pop_all(&q).await, want);
}

// client-go: TestRealFIFO_replaceWithDeleteDeltaIn
#[tokio::test(start_paused = true)]
async fn replace_with_delete_delta_in() {
    let q = fifo_with_known(&[obj("foo", 1)]);
    q.delete(obj("foo", 1)).unwrap();
    q.replace(vec![obj("foo", 2)], "").unwrap();
    assert_eq!(items(&q), deltas("Deleted foo 1, Replaced foo 2"));
}

// client-go: TestRealFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue
#[tokio::test(start_paused = true)]
async fn replace_makes_deletions_for_objects_only_in_queue() {
    type Ops = fn(&RealFIFO<ConfigMap>);
    let cases: Vec<(&str, Ops, Vec<Flat>)> = vec![
        (
            "Added object should be deleted on Replace",
            |q| {
                apply(q, "add foo 2; replace");
            },
            deltas("Added foo 2, tomb foo 2"),
        ),
        (
            "Deleted object should have only a single Delete",
            |q| {
                apply(q, "add foo 2; delete foo 2; replace");
            },
            deltas("Added foo 2, Deleted foo 2"),
        ),
        (
            "Synced objects should have a single delete",
            |q| {
                apply(q, "add foo 2; replace foo 2; replace foo 2; replace");
            },
            deltas("Added foo 2, Replaced foo 2, Replaced foo 2, tomb foo 2"),
        ),
        (
            "Added objects should have a single delete on multiple Replaces",
            |q| {
                apply(q, "add foo 2; replace");
                q.replace(vec![], "1").unwrap();
            },
            deltas("Added foo 2, tomb foo 2"),
        ),
        (
            "Added and deleted and added object should be deleted",
            |q| {
                apply(q, "add foo 2; delete foo 2; add foo 3; replace");
            },
            deltas("Added foo 2, Deleted foo 2, Added foo 3, tomb foo 3"),
        ),
    ];
    for (name, ops, want) in cases {
        let q = fifo();
        ops(&q);
        assert_eq!(pop_all(&q).await, want, "{name}");
        assert!(q.is_empty(), "{name}: extra items left");
    }
}

// client-go: TestRealFIFO_addUpdate
#[tokio::test(start_paused = true)]
async fn add_update_delete_of_one_key_are_three_items() {
    let q = fifo();
    apply(&q, "add foo 10; update foo 12; delete foo 15");
    let want = deltas("Added foo 10, Updated foo 12, Deleted foo 15");
    assert_eq!(items(&q), want);
    assert_eq!(pop_all(&q).await, want);
    // Nothing else arrives.
    let more = tokio::time::timeout(Duration::from_millis(50), pop1(&q)).await;
    assert!(more.is_err(), "unexpected item {more:?}");
}

// client-go: TestRealFIFO_transformer
#[tokio::test(start_paused = true)]
async fn transform_runs_once_on_events_and_not_on_tombstones() {
    // The transform bumps "xfrm"; every queued object must show exactly one run.
    let q = fifo();
    q.set_transform(Some(Arc::new(|mut o: ConfigMap| {
        let data = o.data.get_or_insert_with(Default::default);
        let n: i32 = data.get("xfrm").map_or(0, |v| v.parse().unwrap());
        data.insert("xfrm".into(), (n + 1).to_string());
        o
    })));
    apply(&q, "add foo 10; add bar 11; update foo 12; delete foo 15");
    q.replace(vec![], "").unwrap();
    q.add(obj("bar", 16)).unwrap();
    q.replace(vec![], "").unwrap();
    let all = q.items();
    assert_eq!(
        all.iter().map(|p| flat(one(p))).collect::<Vec<_>>(),
        deltas(
            "Added foo 10, Added bar 11, Updated foo 12, Deleted foo 15, tomb bar 11, Added bar 16, tomb bar 16"
        )
    );
    for d in all.iter().map(one) {
        assert_eq!(d.object().data.as_ref().unwrap()["xfrm"], "1", "{d:?}");
    }
}

// client-go: TestRealFIFO_enqueueingNoLister
#[tokio::test(start_paused = true)]
async fn every_event_is_queued_without_known_objects() {
    let q = fifo();
    apply(
        &q,
        "add foo 10; update bar 15; add qux 17; delete qux 18; delete baz 20",
    );
    let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
    assert_eq!(vals, vec![10, 15, 17, 18, 20]);
}

// client-go: TestRealFIFO_enqueueingWithLister
#[tokio::test(start_paused = true)]
async fn every_event_is_queued_with_known_objects() {
    let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    apply(&q, "add foo 10; update bar 15; delete baz 20");
    let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
    assert_eq!(vals, vec![10, 15, 20]);
}

// client-go: TestRealFIFO_addReplace
#[tokio::test(start_paused = true)]
async fn add_then_replace_delivers_both() {
    let q = fifo();
    apply(&q, "add foo 10; replace foo 15");
    assert_eq!(pop_all(&q).await, deltas("Added foo 10, Replaced foo 15"));
}

// client-go: TestRealFIFO_ResyncNonExisting
#[tokio::test(start_paused = true)]
async fn resync_skips_a_key_with_a_queued_item() {
    let q = fifo_with_known(&[obj("foo", 5)]);
    apply(&q, "delete foo 10; resync");
    assert_eq!(items(&q), deltas("Deleted foo 10"));
}

// client-go: TestRealFIFO_Resync
#[tokio::test(start_paused = true)]
async fn resync_queues_sync_for_known_objects() {
    let q = fifo_with_known(&[obj("foo", 5)]);
    q.resync().unwrap();
    assert_eq!(items(&q), deltas("Sync foo 5"));
}

// client-go: TestRealFIFO_DeleteExistingNonPropagated
#[tokio::test(start_paused = true)]
async fn delete_after_add_is_its_own_item() {
    let q = fifo();
    apply(&q, "add foo 5; delete foo 6");
    assert_eq!(items(&q), deltas("Added foo 5, Deleted foo 6"));
}

// client-go: TestRealFIFO_ReplaceMakesDeletions
#[tokio::test(start_paused = true)]
async fn replace_makes_deletions_before_the_replaced_items() {
    let known = [obj("foo", 5), obj("bar", 6), obj("baz", 7)];
    // With a pre-existing Delete.
    let q = fifo_with_known(&known);
    apply(&q, "delete baz 10; replace foo 5");
    assert_eq!(
        pop_all(&q).await,
        deltas("Deleted baz 10, tomb bar 6, Replaced foo 5")
    );
    // Starting with an Add instead of a Delete.
    let q = fifo_with_known(&known);
    apply(&q, "add baz 10; replace foo 5");
    assert_eq!(
        pop_all(&q).await,
        deltas("Added baz 10, tomb baz 10, tomb bar 6, Replaced foo 5")
    );
    // Deleting and recreating the object in the queue, then a Replace without it.
    let q = fifo_with_known(&known);
    apply(&q, "delete bar 6; add bar 100; replace foo 5");
    assert_eq!(
        pop_all(&q).await,
        deltas("Deleted bar 6, Added bar 100, tomb bar 100, tomb baz 7, Replaced foo 5")
    );
    // Two replaces: the second's tombstone carries the first's (queued) object.
    let q = fifo_with_known(&known);
    q.replace(vec![obj("bar", 100), obj("foo", 5)], "0")
        .unwrap();
    q.replace(vec![obj("foo", 5)], "0").unwrap();
    assert_eq!(
        pop_all(&q).await,
        deltas("tomb baz 7, Replaced bar 100, Replaced foo 5, tomb bar 100, Replaced foo 5")
    );
    // No known objects.
    let q = fifo();
    apply(&q, "add baz 10; replace foo 5");
    assert_eq!(
        pop_all(&q).await,
        deltas("Added baz 10, tomb baz 10, Replaced foo 5")
    );
}

// client-go: TestRealFIFO_ReplaceMakesDeletionsReplaced
#[tokio::test(start_paused = true)]
async fn replace_emits_replaced_for_listed_objects() {
    let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    apply(&q, "delete baz 10; replace foo 6");
    assert_eq!(
        pop_all(&q).await,
        deltas("Deleted baz 10, tomb bar 6, Replaced foo 6")
    );
}

// client-go: TestRealFIFO_UpdateResyncRace
#[tokio::test(start_paused = true)]
async fn update_resync_race() {
    let q = fifo_with_known(&[obj("foo", 5)]);
    apply(&q, "update foo 6; resync");
    assert_eq!(pop_all(&q).await, deltas("Updated foo 6"));
}

// client-go: TestRealFIFO_HasSyncedCorrectOnDeletion
#[tokio::test(start_paused = true)]
async fn has_synced_counts_the_replace_tombstones() {
    let q = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    q.replace(vec![obj("foo", 5)], "0").unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        assert!(
            !q.has_synced(),
            "synced before the initial items were popped"
        );
        let (item, initial) = pop1(&q).await;
        assert!(initial, "{item:?} should be part of the initial list");
        got.push(item);
    }
    // Known keys come in the store's key order; client-go's test lister lists bar, baz.
    got[..2].sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, deltas("tomb bar 6, tomb baz 7, Replaced foo 5"));
    assert!(q.has_synced());
}

// client-go: TestRealFIFO_detectLineJumpers
#[tokio::test(start_paused = true)]
async fn detect_line_jumpers() {
    let q = fifo();
    apply(&q, LINE_JUMPERS);
    assert_eq!(pop1(&q).await.0.2, 10);
    q.add(obj("foo", 14)).unwrap(); // foo must not jump back in line
    let vals: Vec<i32> = pop_all(&q).await.into_iter().map(|f| f.2).collect();
    assert_eq!(vals, vec![1, 11, 13, 30, 14]);
}

// client-go: TestRealFIFO_KeyOf
#[test]
fn key_of_objects_and_tombstones() {
    let q = fifo();
    let a = Delta::Added(Arc::new(obj("A", 0)));
    assert_eq!(q.key_of_delta(&a).unwrap(), "A");
    let b = Delta::tombstone("B".to_string(), Arc::new(obj("not-b", 0)));
    assert_eq!(q.key_of_delta(&b).unwrap(), "B");
    let mut nameless = obj("x", 0);
    nameless.metadata.name = None;
    let err = q.add(nameless).unwrap_err();
    assert!(err.to_string().contains("name"), "{err}");
    assert!(q.is_empty(), "a refused object must not be queued");
}

// client-go: TestRealFIFO_HasSynced
#[tokio::test(start_paused = true)]
async fn has_synced_table() {
    type Step = fn(&RealFIFO<ConfigMap>) -> bool; // true: pop one
    let add_a: Step = |q| {
        q.add(obj("a", 1)).unwrap();
        false
    };
    let replace_empty: Step = |q| {
        q.replace(vec![], "0").unwrap();
        false
    };
    let replace_ab: Step = |q| {
        q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap();
        false
    };
    let replace_aa: Step = |q| {
        q.replace(vec![obj("a", 1), obj("a", 2)], "0").unwrap();
        false
    };
    let pop: Step = |_| true;
    let cases: Vec<(Vec<Step>, bool)> = vec![
        (vec![], false),
        (vec![add_a], true),
        (vec![replace_empty], true),
        (vec![replace_ab], false),
        (vec![replace_ab, pop], false),
        (vec![replace_ab, pop, pop], true),
        // Duplicate keys (a broken server): every item must be popped.
        (vec![replace_aa, pop, pop], true),
    ];
    for (i, (steps, want)) in cases.into_iter().enumerate() {
        let q = fifo();
        for step in steps {
            if step(&q) {
                pop1(&q).await;
            }
        }
        assert_eq!(q.has_synced(), want, "case {i}");
    }
}

// client-go: TestRealFIFO_PopShouldUnblockWhenClosed
#[tokio::test(start_paused = true)]
async fn pop_unblocks_when_closed() {
    let q = fifo();
    let waiter = {
        let q = q.clone();
        tokio::spawn(async move { q.pop(|_, _| ()).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    q.close();
    assert_eq!(waiter.await.unwrap(), Err(FifoClosed));
    assert!(q.is_closed());
}

// kubeloop's own: what is queued before close is still delivered.
#[tokio::test(start_paused = true)]
async fn close_drains_queued_items_first() {
    let q = fifo();
    q.add(obj("a", 1)).unwrap();
    q.close();
    assert_eq!(pop1(&q).await.0, f(DeltaType::Added, "a", 1));
    assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
}

/// A per-object queue handing out batches of up to `batch_size` events.
fn batching_fifo(known: &[ConfigMap], batch_size: usize) -> RealFIFO<ConfigMap> {
    let store = ThreadSafeStore::new(Default::default());
    for o in known {
        store.add(o.metadata.name.clone().unwrap(), Arc::new(o.clone()));
    }
    let options = RealFifoOptions {
        batch_size,
        ..RealFifoOptions::non_atomic()
    };
    RealFIFO::with_options(default_key_func(), Some(Arc::new(store)), options).unwrap()
}

/// An atomic queue (client-go 1.36's informer default).
fn atomic_fifo() -> RealFIFO<ConfigMap> {
    RealFIFO::with_options(default_key_func(), None, RealFifoOptions::default()).unwrap()
}

/// Pops batches until the queue is empty: each batch flat, with its is_in_initial_list.
async fn pop_batches(q: &RealFIFO<ConfigMap>) -> Vec<(Vec<Flat>, bool)> {
    let mut out = Vec::new();
    while !q.is_empty() {
        let batch = q
            .pop_batch(|p, initial| match p {
                Popped::Batch(ds) => {
                    assert!(ds.len() > 1, "a batch of one is handed out as one event");
                    (ds.iter().map(flat).collect(), initial)
                }
                Popped::Deltas(ds) => (ds.iter().map(flat).collect(), initial),
                other => panic!("expected events, got {other:?}"),
            })
            .await
            .unwrap();
        out.push(batch);
    }
    out
}

// client-go: TestRealFIFO_PopMultipleDeltaInBatch
#[tokio::test(start_paused = true)]
async fn pop_batch_splits_at_duplicates_initial_list_and_batch_size() {
    use DeltaType::{Replaced as R, Updated as U};
    const UNLIMITED: usize = 999_999;
    let o = |i: usize| obj(&format!("foo{i}"), 5);
    let b = |items: &[(DeltaType, usize)]| -> Vec<Flat> {
        items
            .iter()
            .map(|&(t, i)| f(t, &format!("foo{i}"), 5))
            .collect()
    };
    type Case = (&'static str, Vec<usize>, Vec<usize>, usize, Vec<Vec<Flat>>);
    let cases: Vec<Case> = vec![
        (
            "non-split: pop unique items should work",
            vec![1, 2, 3],
            vec![],
            UNLIMITED,
            vec![b(&[(R, 1), (R, 2), (R, 3)])],
        ),
        (
            "split due to initial list: initial 2 items with 2 updates should have 2 batches",
            vec![1, 2],
            vec![3, 4],
            2,
            vec![b(&[(R, 1), (R, 2)]), b(&[(U, 3), (U, 4)])],
        ),
        (
            "split due to non-unique#1: update single item for multiple items should have separate batch",
            vec![1],
            vec![1, 1],
            UNLIMITED,
            vec![b(&[(R, 1)]), b(&[(U, 1)]), b(&[(U, 1)])],
        ),
        (
            "split due to non-unique#2: update 3 item for with non-unique item at the end should have separate batch",
            vec![1, 2],
            vec![2, 3],
            UNLIMITED,
            vec![b(&[(R, 1), (R, 2)]), b(&[(U, 2), (U, 3)])],
        ),
        (
            "split due to non-unique#3: update 3 item for with non-unique item in the mid should have separate batch",
            vec![1, 2, 3],
            vec![2],
            UNLIMITED,
            vec![b(&[(R, 1), (R, 2), (R, 3)]), b(&[(U, 2)])],
        ),
        (
            "split due to batch size#1: batching initial list should work",
            vec![1, 2, 3],
            vec![],
            2,
            vec![b(&[(R, 1), (R, 2)]), b(&[(R, 3)])],
        ),
        (
            "split due to batch size#2: batching incoming non-initial deltas should work",
            vec![],
            vec![1, 2, 3],
            2,
            vec![b(&[(U, 1), (U, 2)]), b(&[(U, 3)])],
        ),
        (
            "split due to batch size#3: pop 4 mixed initial & non-initial items with 2 batch size should have 3 batch",
            vec![1, 2, 3],
            vec![4],
            2,
            vec![b(&[(R, 1), (R, 2)]), b(&[(R, 3)]), b(&[(U, 4)])],
        ),
    ];
    for (name, initial, updates, batch_size, want) in cases {
        let initial: Vec<ConfigMap> = initial.into_iter().map(o).collect();
        let q = batching_fifo(&initial, batch_size);
        q.replace(initial.clone(), "123").unwrap();
        for i in updates {
            q.update(o(i)).unwrap();
        }
        let got = pop_batches(&q).await;
        let batches: Vec<Vec<Flat>> = got.iter().map(|(b, _)| b.clone()).collect();
        assert_eq!(batches, want, "{name}");
        // Exactly the initial items were handed out as part of the initial list.
        let initial_names: Vec<String> = got
            .iter()
            .filter(|(_, init)| *init)
            .flat_map(|(b, _)| b.iter().map(|x| x.1.clone()))
            .collect();
        let want_names: Vec<String> = initial
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(initial_names, want_names, "{name}");
    }
}

// client-go: TestRealFIFO_PopBrokenItemsInBatch
#[tokio::test(start_paused = true)]
async fn pop_batch_ends_a_batch_after_an_item_whose_key_fails() {
    use DeltaType::Added as A;
    let b = |names: &[&str]| -> Vec<Flat> { names.iter().map(|n| f(A, n, 5)).collect() };
    type Case = (&'static str, Vec<&'static str>, Vec<Vec<Flat>>);
    let cases: Vec<Case> = vec![
        ("1st item is broken", vec!["foo3"], vec![b(&["foo3"])]),
        (
            "nth item is broken",
            vec!["foo1", "foo2", "foo3"],
            vec![b(&["foo1", "foo2", "foo3"])],
        ),
        (
            "multiple nth items are broken",
            vec!["foo1", "foo2", "foo3", "foo4"],
            vec![b(&["foo1", "foo2", "foo3"]), b(&["foo4"])],
        ),
        (
            "mixed 1st and nth items are broken",
            vec!["foo3", "foo1", "foo4"],
            vec![b(&["foo3"]), b(&["foo1", "foo4"])],
        ),
    ];
    for (name, incoming, want) in cases {
        let broken: KeyFunc<ConfigMap> = Arc::new(|o: &ConfigMap| {
            let name = o.metadata.name.clone().unwrap();
            if name == "foo3" || name == "foo4" {
                return Err(KeyError::MissingName {
                    kind: "test key func error".into(),
                });
            }
            Ok(name)
        });
        let store: Arc<dyn KnownObjects<ConfigMap>> =
            Arc::new(ThreadSafeStore::<ConfigMap>::new(Default::default()));
        let options = RealFifoOptions {
            batch_size: 999_999,
            ..RealFifoOptions::non_atomic()
        };
        let q = RealFIFO::with_options(broken, Some(store), options).unwrap();
        for n in incoming {
            q.push_unchecked(Delta::Added(Arc::new(obj(n, 5))));
        }
        let batches: Vec<Vec<Flat>> = pop_batches(&q).await.into_iter().map(|(b, _)| b).collect();
        assert_eq!(batches, want, "{name}");
    }
}

/// A queued or popped item in a comparable form: events flat, whole-list items by
/// their contents.
#[derive(Debug, PartialEq)]
enum Shown {
    Event(Flat),
    ReplacedAll(String, Vec<(String, i32)>),
    SyncAll,
    Bookmark(String),
    DeletedUndecodable(String),
    Released(String),
}

fn show(p: Popped<ConfigMap>) -> Shown {
    match p {
        Popped::Deltas(_) => Shown::Event(flat(one(&p))),
        Popped::ReplacedAll(info) => Shown::ReplacedAll(
            info.resource_version,
            info.objects
                .into_decoded()
                .iter()
                .map(|o| (o.metadata.name.clone().unwrap(), val(o)))
                .collect(),
        ),
        Popped::SyncAll => Shown::SyncAll,
        Popped::Bookmark(rv) => Shown::Bookmark(rv),
        Popped::DeletedUndecodable(key) => Shown::DeletedUndecodable(key),
        Popped::Released(selector) => Shown::Released(selector.to_string()),
        Popped::Batch(b) => panic!("pop hands out one item, got a batch of {}", b.len()),
    }
}

async fn pop_shown(q: &RealFIFO<ConfigMap>) -> Vec<Shown> {
    let mut out = Vec::new();
    while !q.is_empty() {
        out.push(q.pop(|p, _| show(p)).await.unwrap());
    }
    out
}

// client-go: TestRealFIFO_ReplaceAtomic
#[tokio::test(start_paused = true)]
async fn replace_atomic_queues_one_replaced_all_item_in_order() {
    let added = || Shown::Event(f(DeltaType::Added, "foo", 2));
    let all = |rv: &str, objs: &[(&str, i32)]| {
        Shown::ReplacedAll(
            rv.into(),
            objs.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        )
    };
    type Ops = fn(&RealFIFO<ConfigMap>);
    let cases: Vec<(&str, Ops, Vec<Shown>)> = vec![
        (
            "Base replace",
            |q| q.replace(vec![], "123").unwrap(),
            vec![all("123", &[])],
        ),
        (
            "Added object exists in deltas on Atomic Replace",
            |q| {
                q.add(obj("foo", 2)).unwrap();
                q.replace(vec![], "123").unwrap();
            },
            vec![added(), all("123", &[])],
        ),
        (
            "Multiple replaces run in order",
            |q| {
                q.add(obj("foo", 2)).unwrap();
                q.replace(vec![obj("foo", 2)], "10").unwrap();
                q.replace(vec![obj("foo", 2)], "20").unwrap();
                q.replace(vec![], "56").unwrap();
            },
            vec![
                added(),
                all("10", &[("foo", 2)]),
                all("20", &[("foo", 2)]),
                all("56", &[]),
            ],
        ),
        (
            "Bookmark object should not be included in Replace",
            |q| {
                q.bookmark("123").unwrap();
                q.replace(vec![], "1234").unwrap();
            },
            vec![Shown::Bookmark("123".into()), all("1234", &[])],
        ),
    ];
    for (name, ops, want) in cases {
        let q = atomic_fifo();
        ops(&q);
        assert_eq!(pop_shown(&q).await, want, "{name}");
        assert!(q.is_empty(), "{name}: expected no extra items");
    }
}

// client-go: TestRealFIFO_ReplaceAtomicPop
#[tokio::test(start_paused = true)]
async fn replace_atomic_pops_the_add_then_the_whole_list() {
    let q = atomic_fifo();
    q.add(obj("foo", 10)).unwrap();
    q.replace(vec![obj("foo", 15)], "20").unwrap();
    assert_eq!(
        q.pop(|p, _| show(p)).await.unwrap(),
        Shown::Event(f(DeltaType::Added, "foo", 10))
    );
    assert_eq!(
        q.pop(|p, _| show(p)).await.unwrap(),
        Shown::ReplacedAll("20".into(), vec![("foo".into(), 15)])
    );
    let more = tokio::time::timeout(Duration::from_millis(50), q.pop(|p, _| show(p))).await;
    assert!(more.is_err(), "got a second value: {more:?}");
    assert!(q.is_empty(), "item did not get removed");
}

// client-go: TestRealFIFO_ResyncAtomic
#[tokio::test(start_paused = true)]
async fn resync_atomic_queues_one_sync_all_item() {
    let q = atomic_fifo();
    q.resync().unwrap();
    assert_eq!(pop_shown(&q).await, vec![Shown::SyncAll], "Base resync");
    assert!(q.is_empty());

    let q = atomic_fifo();
    apply(&q, "add foo 2; resync");
    assert_eq!(
        pop_shown(&q).await,
        vec![Shown::Event(f(DeltaType::Added, "foo", 2)), Shown::SyncAll],
        "Added object exists in deltas on Atomic Resync"
    );
    assert!(q.is_empty());
}

// kubeloop's own: client-go `NewRealFIFOWithOptions` panics on these ("coding error").
#[test]
fn contradicting_options_are_refused() {
    let known = || -> Arc<dyn KnownObjects<ConfigMap>> {
        Arc::new(ThreadSafeStore::<ConfigMap>::new(Default::default()))
    };
    let atomic = RealFifoOptions::default();
    let flat = RealFifoOptions::non_atomic();
    let refused = [
        (Some(known()), atomic),
        (None, flat),
        (
            Some(known()),
            RealFifoOptions {
                unlock_while_processing: true,
                ..flat
            },
        ),
        (
            Some(known()),
            RealFifoOptions {
                emit_bookmarks: true,
                ..flat
            },
        ),
    ];
    for (known, options) in refused {
        let e = RealFIFO::with_options(default_key_func::<ConfigMap>(), known, options);
        assert!(e.is_err(), "{options:?} accepted");
    }
    assert!(RealFIFO::with_options(default_key_func::<ConfigMap>(), None, atomic).is_ok());
    assert!(RealFIFO::with_options(default_key_func::<ConfigMap>(), Some(known()), flat).is_ok());
}

// kubeloop's own: with `unlock_while_processing` the queue's lock is free while the
// consumer processes (so the reflector can queue meanwhile), unless two full batches are
// already waiting; a per-object queue keeps it held. `has_synced` turns true only after
// the last initial item has been processed.
#[tokio::test(start_paused = true)]
async fn unlock_while_processing_frees_the_lock_unless_two_batches_wait() {
    let q = atomic_fifo();
    q.replace(vec![obj("a", 1)], "1").unwrap();
    let (free, synced) = q
        .pop(|_, _| {
            let free = q.shared.inner.try_lock().is_some();
            (free, q.has_synced())
        })
        .await
        .unwrap();
    assert!(free, "the lock was held while processing");
    assert!(!synced, "synced while the initial list was being processed");
    assert!(q.has_synced());

    let options = RealFifoOptions {
        batch_size: 2,
        ..RealFifoOptions::default()
    };
    let q = RealFIFO::with_options(default_key_func(), None, options).unwrap();
    for i in 0..6 {
        q.add(obj(&format!("k{i}"), i)).unwrap();
    }
    // Two events out, four left: two full batches wait, so the lock stays held.
    let free = q
        .pop_batch(|_, _| q.shared.inner.try_lock().is_some())
        .await;
    assert_eq!(free, Ok(false));
    // Two more out, two left: fewer than two batches, unlocked.
    let free = q
        .pop_batch(|_, _| q.shared.inner.try_lock().is_some())
        .await;
    assert_eq!(free, Ok(true));

    let q = fifo();
    q.add(obj("a", 1)).unwrap();
    let free = q.pop(|_, _| q.shared.inner.try_lock().is_some()).await;
    assert_eq!(
        free,
        Ok(false),
        "a per-object queue unlocked while processing"
    );
}

// kubeloop's own: only a queue that emits bookmarks queues them.
#[tokio::test(start_paused = true)]
async fn bookmarks_are_queued_only_when_emitted() {
    let q = fifo();
    q.bookmark("7").unwrap();
    assert!(q.is_empty());
    let q = atomic_fifo();
    q.bookmark("7").unwrap();
    assert_eq!(pop_shown(&q).await, vec![Shown::Bookmark("7".into())]);
}

// kubeloop's own (see undecodable.rs): per object, a deletion whose final state did not
// decode is a tombstone carrying the key's last queued object, else the known one, and
// nothing if nobody holds the key; a relist keeps the keys that did not decode (no tombstone
// for them). An atomic queue passes both on to the informer, which holds the store.
#[tokio::test(start_paused = true)]
async fn undecodable_deletions_and_relists_keep_what_is_held() {
    let q = fifo_with_known(&[obj("known", 1), obj("kept", 2)]);
    apply(&q, "add queued 5; update queued 6");
    for key in ["queued", "known", "nobody"] {
        q.delete_undecodable(key).unwrap();
    }
    assert_eq!(
        items(&q),
        deltas("Added queued 5, Updated queued 6, tomb queued 6, tomb known 1")
    );
    pop_all(&q).await;
    q.replace_listed(Vec::new().into(), vec!["kept".into()], "9")
        .unwrap();
    assert_eq!(items(&q), deltas("tomb known 1"));

    let atomic =
        RealFIFO::with_options(default_key_func(), None, RealFifoOptions::default()).unwrap();
    atomic.delete_undecodable("gone").unwrap();
    atomic
        .replace_listed(vec![Arc::new(obj("a", 1))].into(), vec!["kept".into()], "9")
        .unwrap();
    match &atomic.items()[..] {
        [Popped::DeletedUndecodable(gone), Popped::ReplacedAll(info)] => {
            assert_eq!(gone, "gone");
            assert_eq!(info.undecodable, ["kept"]);
            assert_eq!(info.objects.len(), 1);
        }
        other => panic!("{other:?}"),
    }
}
