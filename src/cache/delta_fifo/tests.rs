use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::cache::delta::DeltaType;
use crate::cache::fifo_fixtures::{
    BASIC, Flat, LINE_JUMPERS, apply, deltas, f, flat, known_store, obj, val,
};
use crate::cache::keys::default_key_func;
use crate::cache::thread_safe_store::ThreadSafeStore;

fn flat_all(d: &Deltas<ConfigMap>) -> Vec<Flat> {
    d.iter().map(flat).collect()
}

fn fifo() -> DeltaFIFO<ConfigMap> {
    DeltaFIFO::new(default_key_func(), None)
}

fn fifo_with_known(objs: &[ConfigMap]) -> (DeltaFIFO<ConfigMap>, ThreadSafeStore<ConfigMap>) {
    let store = known_store(objs);
    let known: Arc<dyn KnownObjects<ConfigMap>> = Arc::new(store.clone());
    (DeltaFIFO::new(default_key_func(), Some(known)), store)
}

async fn pop_flat(q: &DeltaFIFO<ConfigMap>) -> Vec<Flat> {
    q.pop(|d, _| flat_all(&d)).await.expect("queue closed")
}

// client-go: TestDeltaFIFO_basic
#[tokio::test(start_paused = true)]
async fn basic_adds_and_updates_pop_in_order() {
    let q = fifo();
    apply(&q, BASIC);
    for i in 0..5 {
        let name = format!("a{i}");
        assert_eq!(
            pop_flat(&q).await,
            vec![
                f(DeltaType::Added, &name, i),
                f(DeltaType::Updated, &name, i + 10)
            ]
        );
    }
    assert!(q.is_empty());
}

// client-go: TestDeltaFIFO_replaceWithDeleteDeltaIn
#[tokio::test(start_paused = true)]
async fn replace_with_delete_delta_in() {
    let (q, _) = fifo_with_known(&[obj("foo", 5)]);
    apply(&q, "delete foo 10; replace foo 6");
    assert_eq!(pop_flat(&q).await, deltas("Deleted foo 10, Replaced foo 6"));
}

// client-go: TestDeltaFIFOW_ReplaceMakesDeletionsForObjectsOnlyInQueue
#[tokio::test(start_paused = true)]
async fn replace_makes_deletions_for_objects_only_in_queue() {
    let (q, _) = fifo_with_known(&[]);
    apply(&q, "add foo 2; replace bar 1");
    assert_eq!(pop_flat(&q).await, deltas("Added foo 2, tomb foo 2"));
    assert_eq!(pop_flat(&q).await, deltas("Replaced bar 1"));
}

// client-go: TestDeltaFIFO_addUpdate
#[tokio::test(start_paused = true)]
async fn add_update_delete_accumulate_on_one_key() {
    let q = fifo();
    apply(&q, "add foo 10; update foo 12; delete foo 15");
    assert_eq!(q.list_keys(), vec!["foo"]);
    assert_eq!(
        pop_flat(&q).await,
        deltas("Added foo 10, Updated foo 12, Deleted foo 15")
    );
    assert!(q.get_by_key("foo").is_none());
}

// client-go: TestDeltaFIFO_enqueueingNoLister
#[tokio::test(start_paused = true)]
async fn delete_of_unknown_unqueued_key_is_ignored_without_lister() {
    let q = fifo();
    q.delete(obj("ghost", 1)).unwrap();
    assert!(q.is_empty());
    // But a delete of a queued key is kept.
    apply(&q, "add foo 1; delete foo 2");
    assert_eq!(pop_flat(&q).await, deltas("Added foo 1, Deleted foo 2"));
}

// client-go: TestDeltaFIFO_enqueueingWithLister
#[tokio::test(start_paused = true)]
async fn delete_of_known_key_is_queued_with_lister() {
    let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    apply(&q, "delete baz 10; delete ghost 1");
    assert_eq!(q.list_keys(), vec!["baz"]);
    assert_eq!(pop_flat(&q).await, deltas("Deleted baz 10"));
}

// client-go: TestDeltaFIFO_addReplace
#[tokio::test(start_paused = true)]
async fn add_then_replace() {
    let q = fifo();
    apply(&q, "add foo 10; replace foo 15");
    let popper = {
        let q = q.clone();
        tokio::spawn(async move { pop_flat(&q).await })
    };
    assert_eq!(
        popper.await.unwrap(),
        deltas("Added foo 10, Replaced foo 15")
    );
    q.close();
    assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
}

// client-go: TestDeltaFIFO_ResyncNonExisting
#[tokio::test(start_paused = true)]
async fn resync_skips_keys_with_queued_deltas() {
    let (q, _) = fifo_with_known(&[obj("foo", 5)]);
    apply(&q, "delete foo 10; resync");
    assert_eq!(
        flat_all(&q.get_by_key("foo").unwrap()),
        deltas("Deleted foo 10")
    );
}

// client-go: TestDeltaFIFO_Resync
#[tokio::test(start_paused = true)]
async fn resync_queues_sync_for_known_objects() {
    let (q, _) = fifo_with_known(&[obj("foo", 5)]);
    q.resync().unwrap();
    assert_eq!(pop_flat(&q).await, deltas("Sync foo 5"));
}

// client-go: TestDeltaFIFO_UpdateResyncRace
#[tokio::test(start_paused = true)]
async fn update_resync_race() {
    let (q, _) = fifo_with_known(&[obj("foo", 5)]);
    apply(&q, "update foo 6; resync");
    assert_eq!(pop_flat(&q).await, deltas("Updated foo 6"));
    assert!(q.is_empty());
}

// client-go: TestDeltaFIFO_DeleteExistingNonPropagated
#[tokio::test(start_paused = true)]
async fn delete_existing_non_propagated() {
    let (q, _) = fifo_with_known(&[]);
    apply(&q, "add foo 5; delete foo 6");
    assert_eq!(pop_flat(&q).await, deltas("Added foo 5, Deleted foo 6"));
}

// client-go: TestDeltaFIFO_ReplaceMakesDeletions
#[tokio::test(start_paused = true)]
async fn replace_makes_deletions() {
    // A known object deleted before the relist keeps its real deletion; a known object
    // missing from the relist gets a tombstone with the last known state.
    let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    apply(&q, "delete baz 10; replace foo 5");
    assert_eq!(pop_flat(&q).await, deltas("Deleted baz 10"));
    assert_eq!(pop_flat(&q).await, deltas("Replaced foo 5"));
    assert_eq!(pop_flat(&q).await, deltas("tomb bar 6"));
    assert!(q.is_empty());

    // Now with an object only in the queue, which the replace removes.
    let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    apply(&q, "add baz 10; replace foo 5");
    assert_eq!(pop_flat(&q).await, deltas("Added baz 10, tomb baz 10"));
    assert_eq!(pop_flat(&q).await, deltas("Replaced foo 5"));
    assert_eq!(pop_flat(&q).await, deltas("tomb bar 6"));

    // Without known objects only queued keys can be detected.
    let q = fifo();
    apply(&q, "add baz 10; replace foo 5");
    assert_eq!(pop_flat(&q).await, deltas("Added baz 10, tomb baz 10"));
    assert_eq!(pop_flat(&q).await, deltas("Replaced foo 5"));
    assert!(q.is_empty());
}

// client-go: TestDeltaFIFO_HasSynced (table)
#[tokio::test(start_paused = true)]
async fn has_synced_table() {
    type Action = fn(&DeltaFIFO<ConfigMap>);
    let cases: Vec<(&str, Vec<Action>, usize, bool)> = vec![
        ("nothing", vec![], 0, false),
        ("add", vec![|q| q.add(obj("a", 1)).unwrap()], 0, true),
        (
            "empty replace",
            vec![|q| q.replace(vec![], "0").unwrap()],
            0,
            true,
        ),
        (
            "replace of two, nothing popped",
            vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
            0,
            false,
        ),
        (
            "replace of two, one popped",
            vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
            1,
            false,
        ),
        (
            "replace of two, both popped",
            vec![|q| q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()],
            2,
            true,
        ),
        (
            "add before replace",
            vec![|q| q.add(obj("a", 1)).unwrap(), |q| {
                q.replace(vec![obj("a", 1), obj("b", 2)], "0").unwrap()
            }],
            0,
            true,
        ),
    ];
    for (name, actions, pops, want) in cases {
        let q = fifo();
        for a in actions {
            a(&q);
        }
        for _ in 0..pops {
            q.pop(|_, _| ()).await.unwrap();
        }
        assert_eq!(q.has_synced(), want, "case {name}");
    }
}

// client-go: TestDeltaFIFO_HasSyncedCorrectOnDeletion
#[tokio::test(start_paused = true)]
async fn has_synced_counts_queued_deletions() {
    let (q, _) = fifo_with_known(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
    q.replace(vec![obj("foo", 5)], "0").unwrap();
    for _ in 0..3 {
        assert!(!q.has_synced());
        q.pop(|_, _| ()).await.unwrap();
    }
    assert!(q.has_synced());
}

// client-go: TestDeltaFIFO_PopShouldUnblockWhenClosed
#[tokio::test(start_paused = true)]
async fn pop_unblocks_when_closed() {
    let q = fifo();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.pop(|_, _| ()).await })
        })
        .collect();
    tokio::task::yield_now().await;
    q.close();
    for w in waiters {
        assert_eq!(w.await.unwrap(), Err(FifoClosed));
    }
}

#[tokio::test(start_paused = true)]
async fn close_drains_queued_keys_first() {
    let q = fifo();
    q.add(obj("a", 1)).unwrap();
    q.close();
    assert!(q.is_closed());
    assert_eq!(pop_flat(&q).await, deltas("Added a 1"));
    assert_eq!(q.pop(|_, _| ()).await, Err(FifoClosed));
}

// client-go: TestDeltaFIFO_detectLineJumpers
#[tokio::test(start_paused = true)]
async fn detect_line_jumpers() {
    let q = fifo();
    apply(&q, LINE_JUMPERS);
    let newest = |d: Deltas<ConfigMap>| val(d.last().unwrap().object());
    assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 13);
    q.add(obj("foo", 14)).unwrap(); // re-queued at the back
    assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 1);
    assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 30);
    assert_eq!(q.pop(|d, _| newest(d)).await.unwrap(), 14);
}

// kubeloop's own: pop reports is_in_initial_list
#[tokio::test(start_paused = true)]
async fn pop_reports_is_in_initial_list() {
    let q = fifo();
    q.replace(vec![obj("a", 1), obj("b", 1)], "1").unwrap();
    q.add(obj("c", 1)).unwrap();
    let initial = |q: &DeltaFIFO<ConfigMap>| {
        let q = q.clone();
        async move { q.pop(|_, initial| initial).await.unwrap() }
    };
    assert!(initial(&q).await);
    assert!(initial(&q).await);
    assert!(!initial(&q).await);
}

// kubeloop's own, on client-go's dedupDeltas / isDeletionDup rule
#[test]
fn only_consecutive_deletions_collapse() {
    let a = || Arc::new(obj("a", 1));
    let del = |v| Delta::Deleted(DeletedObject::Object(Arc::new(obj("a", v))));
    let tombstone_of = |v| Delta::tombstone("a".to_string(), Arc::new(obj("a", v)));

    let mut d = vec![Delta::Added(a()), Delta::Added(a())];
    dedup_deltas(&mut d);
    assert_eq!(d.len(), 2, "adds never collapse");

    let mut d = vec![del(1), del(2)];
    dedup_deltas(&mut d);
    assert_eq!(flat_all(&d), deltas("Deleted a 1"), "older kept");

    let mut d = vec![tombstone_of(1), del(2)];
    dedup_deltas(&mut d);
    assert_eq!(
        flat_all(&d),
        deltas("Deleted a 2"),
        "older tombstone dropped"
    );

    let mut d = vec![del(1), tombstone_of(2)];
    dedup_deltas(&mut d);
    assert_eq!(flat_all(&d), deltas("Deleted a 1"), "real deletion kept");

    let mut d = vec![Delta::Updated(a()), del(2)];
    dedup_deltas(&mut d);
    assert_eq!(d.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn transform_runs_before_queueing_but_not_on_sync() {
    let (q, store) = fifo_with_known(&[obj("known", 1)]);
    q.set_transform(Some(Arc::new(|mut o: ConfigMap| {
        let v = val(&o);
        o.data = Some([("val".to_string(), (v * 100).to_string())].into());
        o
    })));
    apply(&q, "add a 2; resync");
    assert_eq!(pop_flat(&q).await, deltas("Added a 200"));
    // The Sync delta carries the cached (already transformed) object untouched.
    assert_eq!(pop_flat(&q).await, deltas("Sync known 1"));
    assert_eq!(store.len(), 1);
}

// client-go: TestDeltaFIFO_KeyOf (a tombstone is keyed by its own key)
#[tokio::test(start_paused = true)]
async fn tombstones_are_keyed_by_their_stored_key() {
    let store = ThreadSafeStore::new(Default::default());
    // Known under a key that the object itself would not produce.
    store.add("legacy/key".to_string(), Arc::new(obj("foo", 1)));
    let known: Arc<dyn KnownObjects<ConfigMap>> = Arc::new(store);
    let q = DeltaFIFO::new(default_key_func(), Some(known));
    q.replace(vec![], "5").unwrap();
    assert_eq!(q.list_keys(), vec!["legacy/key"]);
    let popped = q
        .pop(|d, _| match &d[0] {
            Delta::Deleted(DeletedObject::Unknown(t)) => t.key.clone(),
            other => panic!("expected a tombstone, got {other:?}"),
        })
        .await
        .unwrap();
    assert_eq!(popped, "legacy/key");
}

#[test]
fn objects_without_a_name_are_rejected_with_a_clear_error() {
    let q = fifo();
    let err = q.add(ConfigMap::default()).unwrap_err();
    assert!(err.to_string().contains("ConfigMap"), "{err}");
    assert!(q.is_empty());
}

// kubeloop's own (see undecodable.rs): a deletion whose final state did not decode is a
// tombstone carrying the key's last queued object, else the known one, and nothing if
// nobody holds the key; a relist keeps the keys that did not decode (no tombstone for them).
#[tokio::test(start_paused = true)]
async fn undecodable_deletions_and_relists_keep_what_is_held() {
    let (q, _) = fifo_with_known(&[obj("known", 1), obj("kept", 2)]);
    apply(&q, "add queued 5");
    for key in ["queued", "known", "nobody"] {
        q.delete_undecodable(key).unwrap();
    }
    assert_eq!(pop_flat(&q).await, deltas("Added queued 5, tomb queued 5"));
    assert_eq!(pop_flat(&q).await, deltas("tomb known 1"));
    assert!(q.is_empty());
    q.replace_listed(Vec::new().into(), vec!["kept".into()], "9")
        .unwrap();
    assert_eq!(pop_flat(&q).await, deltas("tomb known 1"));
    assert!(q.is_empty(), "no tombstone for the kept key");
}
