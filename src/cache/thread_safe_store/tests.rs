// The store's tests, run once per store kind (`thread_safe_store.rs` includes this file
// into `tests::typed` and `tests::compact`): both kinds keep the same contents and indexes.

use super::super::super::index::{NAMESPACE_INDEX, namespace_indexers};
use super::super::*;
use k8s_openapi::api::core::v1::Pod;
use kube_client::api::ObjectMeta;
use std::collections::BTreeMap;

fn pod(ns: &str, name: &str, users: &[&str]) -> Arc<Pod> {
    let mut ann = BTreeMap::new();
    ann.insert("users".to_string(), users.join(","));
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(ann),
            ..Default::default()
        },
        ..Default::default()
    })
}

fn users_index() -> super::super::super::index::IndexFunc<Pod> {
    Arc::new(|p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("users"))
            .map(|u| {
                u.split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    })
}

fn store_with_users() -> ThreadSafeStore<Pod> {
    let mut ix = namespace_indexers::<Pod>();
    ix.insert("byUser".into(), users_index());
    ThreadSafeStore::of_kind(KIND, ix)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn names(v: Vec<Arc<Pod>>) -> Vec<String> {
    sorted(v.iter().map(|p| p.metadata.name.clone().unwrap()).collect())
}

// client-go: TestThreadSafeStoreDeleteRemovesEmptySetsFromIndex
#[test]
fn delete_removes_empty_sets_from_index() {
    let s = store_with_users();
    s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
    s.delete("ns/a");
    let r = s.reader();
    assert!(r.list_index_func_values("byUser").unwrap().is_empty());
    assert!(
        r.list_index_func_values(NAMESPACE_INDEX)
            .unwrap()
            .is_empty()
    );
}

// client-go: TestThreadSafeStoreAddKeepsNonEmptySetPostDeleteFromIndex
#[test]
fn add_keeps_non_empty_set_after_delete() {
    let s = store_with_users();
    s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
    s.add("ns/b".into(), pod("ns", "b", &["ernie"]));
    s.delete("ns/a");
    let r = s.reader();
    assert_eq!(r.index_keys("byUser", "ernie").unwrap(), vec!["ns/b"]);
}

// client-go: TestThreadSafeStoreIndexingFunctionsWithMultipleValues
#[test]
fn indexing_functions_with_multiple_values() {
    let s = store_with_users();
    let r = s.reader();
    s.add("ns/a".into(), pod("ns", "a", &["ernie", "bert"]));
    s.add("ns/b".into(), pod("ns", "b", &["ernie"]));
    assert_eq!(
        sorted(r.index_keys("byUser", "ernie").unwrap()),
        vec!["ns/a", "ns/b"]
    );
    assert_eq!(r.index_keys("byUser", "bert").unwrap(), vec!["ns/a"]);
    // The update moves a out of "bert" only.
    s.update("ns/a".into(), pod("ns", "a", &["ernie", "elmo"]));
    assert!(r.index_keys("byUser", "bert").unwrap().is_empty());
    assert_eq!(r.index_keys("byUser", "elmo").unwrap(), vec!["ns/a"]);
    assert_eq!(
        sorted(r.list_index_func_values("byUser").unwrap()),
        vec!["elmo", "ernie"]
    );
    // Index() with a multi-valued object is the union of its values' keys.
    let probe = pod("x", "probe", &["elmo", "ernie"]);
    assert_eq!(names(r.index("byUser", &probe).unwrap()), vec!["a", "b"]);
}

// client-go: TestMultiIndexKeys (index_test.go)
#[test]
fn multi_index_keys() {
    let s = store_with_users();
    let r = s.reader();
    s.add("ns/one".into(), pod("ns", "one", &["ernie", "bert"]));
    s.add("ns/two".into(), pod("ns", "two", &["bert", "oscar"]));
    s.add("ns/tre".into(), pod("ns", "tre", &["ernie", "elmo"]));
    let by = |user: &str| names(r.by_index("byUser", user).unwrap());
    assert_eq!(by("ernie"), ["one", "tre"]);
    assert_eq!(by("bert"), ["one", "two"]);
    assert_eq!(by("elmo"), ["tre"]);
    assert_eq!(by("oscar"), ["two"]);
    assert!(by("elmo1").is_empty());
    s.delete("ns/tre");
    assert_eq!(by("ernie"), ["one"]);
    assert!(by("elmo").is_empty());
    s.update("ns/two".into(), pod("ns", "two", &["oscar"]));
    assert_eq!(by("bert"), ["one"]);
}

// client-go: TestGetIndexFuncValues (index_test.go)
#[test]
fn get_index_func_values() {
    let s = store_with_users();
    s.add("ns/one".into(), pod("ns", "one", &["bar"]));
    s.add("ns/two".into(), pod("ns", "two", &["bar"]));
    s.add("ns/tre".into(), pod("ns", "tre", &["biz"]));
    let values = sorted(s.reader().list_index_func_values("byUser").unwrap());
    assert_eq!(values, ["bar", "biz"]);
}

// kubeloop's own: by_index on a known and an unknown index.
#[test]
fn by_index_and_unknown_index() {
    let s = store_with_users();
    let r = s.reader();
    s.add("one/a".into(), pod("one", "a", &[]));
    s.add("one/b".into(), pod("one", "b", &[]));
    s.add("two/c".into(), pod("two", "c", &[]));
    assert_eq!(
        names(r.by_index(NAMESPACE_INDEX, "one").unwrap()),
        vec!["a", "b"]
    );
    assert!(r.by_index(NAMESPACE_INDEX, "three").unwrap().is_empty());
    let err = r.by_index("nope", "one").unwrap_err();
    assert_eq!(
        err,
        IndexError::UnknownIndex {
            name: "nope".into()
        }
    );
    assert!(err.to_string().contains("nope"));
}

// kubeloop's own (indexers added after objects are backfilled)
#[test]
fn add_indexers_backfills_and_rejects_clashes() {
    let s = ThreadSafeStore::of_kind(KIND, namespace_indexers::<Pod>());
    s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
    s.add("ns/b".into(), pod("ns", "b", &["bert"]));
    let r = s.reader();
    let mut more = Indexers::new();
    more.insert("byUser".to_string(), users_index());
    r.add_indexers(more).unwrap();
    assert_eq!(r.index_keys("byUser", "ernie").unwrap(), vec!["ns/a"]);
    // New writes keep the new index current.
    s.add("ns/c".into(), pod("ns", "c", &["ernie"]));
    assert_eq!(
        sorted(r.index_keys("byUser", "ernie").unwrap()),
        vec!["ns/a", "ns/c"]
    );
    let mut clash = Indexers::new();
    clash.insert(NAMESPACE_INDEX.to_string(), users_index());
    assert_eq!(
        r.add_indexers(clash).unwrap_err(),
        IndexError::Conflict {
            name: NAMESPACE_INDEX.into()
        }
    );
}

// kubeloop's own: replace rebuilds indices
#[test]
fn replace_rebuilds_indices() {
    let s = store_with_users();
    s.add("ns/a".into(), pod("ns", "a", &["ernie"]));
    let mut next = HashMap::new();
    next.insert("other/b".to_string(), pod("other", "b", &["bert"]));
    s.replace(next, "7");
    let r = s.reader();
    assert_eq!(r.list_keys(), vec!["other/b"]);
    assert_eq!(r.last_store_sync_resource_version(), "7");
    assert!(r.index_keys("byUser", "ernie").unwrap().is_empty());
    assert_eq!(r.index_keys("byUser", "bert").unwrap(), vec!["other/b"]);
    assert_eq!(
        r.list_index_func_values(NAMESPACE_INDEX).unwrap(),
        vec!["other"]
    );
}

// kubeloop's own: writers and index readers at once
#[test]
fn concurrent_writers_keep_indices_consistent() {
    let s = store_with_users();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let r = s.reader();
                for i in 0..500 {
                    let key = format!("ns{t}/p{}", i % 50);
                    let user = if i % 2 == 0 { "even" } else { "odd" };
                    s.update(
                        key.clone(),
                        pod(&format!("ns{t}"), &format!("p{}", i % 50), &[user]),
                    );
                    if i % 7 == 0 {
                        s.delete(&key);
                    }
                    let _ = r.by_index("byUser", "even").unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every index entry points at a stored object whose function gives that value, and
    // every stored object is indexed.
    let r = s.reader();
    let mut indexed = 0;
    for value in r.list_index_func_values("byUser").unwrap() {
        for key in r.index_keys("byUser", &value).unwrap() {
            let obj = r.get_by_key(&key).expect("indexed key is stored");
            assert!(users_index()(&obj).contains(&value));
            indexed += 1;
        }
    }
    assert_eq!(indexed, r.len());
}

// client-go: TestCache / testStoreKeyFunc basics (store_test.go)
#[test]
fn add_get_update_delete_list() {
    let s = store_with_users();
    let r = s.reader();
    s.add("ns/a".into(), pod("ns", "a", &[]));
    s.add("ns/b".into(), pod("ns", "b", &[]));
    assert_eq!(r.len(), 2);
    let a = r.get_by_key("ns/a").unwrap();
    assert_eq!(a, pod("ns", "a", &[]));
    // A typed store hands out the stored Arc, not a copy; a compact one decodes a new one.
    assert_eq!(
        Arc::ptr_eq(&a, &s.get("ns/a").unwrap()),
        KIND == StoreKind::Typed
    );
    s.update("ns/a".into(), pod("ns", "a", &["x"]));
    assert!(!Arc::ptr_eq(&a, &r.get_by_key("ns/a").unwrap()));
    assert!(s.delete("ns/a").is_some());
    assert!(s.delete("ns/a").is_none());
    assert_eq!(names(r.list()), vec!["b"]);
}

// kubeloop's own: a list big enough to train the compact store's dictionary comes back
// whole, object for object, through every read, and what it replaced is handed back.
#[test]
fn a_big_replace_keeps_every_object_and_returns_the_old_ones() {
    let s = store_with_users();
    s.add("old/x".into(), pod("old", "x", &["bert"]));
    let pods: HashMap<String, Arc<Pod>> = (0..200)
        .map(|i| {
            let ns = format!("ns{}", i % 3);
            (format!("{ns}/p{i}"), pod(&ns, &format!("p{i}"), &["ernie"]))
        })
        .collect();
    let replaced = s.replace(pods.clone(), "9");
    let old: Vec<(String, Arc<Pod>)> = replaced.into_objects().collect();
    assert_eq!(old, vec![("old/x".to_string(), pod("old", "x", &["bert"]))]);
    let r = s.reader();
    for (key, p) in &pods {
        assert_eq!(r.get_by_key(key).as_deref(), Some(&**p), "{key}");
    }
    assert_eq!(r.list().len(), 200);
    assert_eq!(r.by_index("byUser", "ernie").unwrap().len(), 200);
    assert_eq!(r.by_index(NAMESPACE_INDEX, "ns1").unwrap().len(), 67);
    // Writes after the dictionary exist decode too.
    s.update("ns1/p1".into(), pod("ns1", "p1", &["elmo"]));
    assert_eq!(r.get_by_key("ns1/p1").unwrap(), pod("ns1", "p1", &["elmo"]));
    assert_eq!(r.index_keys("byUser", "elmo").unwrap(), vec!["ns1/p1"]);
}
