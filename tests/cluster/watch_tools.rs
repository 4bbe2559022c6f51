//! tools/watch on the real apiserver: a [`RetryWatcher`] whose connection is cut again and
//! again, and kept off through an outage in which objects change, passes on every change once,
//! in order; [`until_with_sync`] is satisfied at once by a cache that already meets its
//! condition, later by the change that meets it, and times out when nothing does. (The 410
//! case compacts etcd, so it has a binary and an apiserver of its own: `watch_tools_gone.rs`.)

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_client::core::WatchEvent;
use kube_client::{Client, ResourceExt};
use kubeloop::cache::ListWatch;
use kubeloop::testing::eventually;
use kubeloop::watch::{CacheEvent, RetryWatcher, UntilError, until_with_sync};
use kubeloop_testenv::informer::{Recording, configmap};
use kubeloop_testenv::{self as testenv, FaultProxy};
use parking_lot::Mutex;

/// (event type, name, resourceVersion).
type Seen = (&'static str, String, String);

fn seen(event: &WatchEvent<ConfigMap>) -> Seen {
    let (kind, obj) = match event {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        other => panic!("a RetryWatcher passes on no {other:?}"),
    };
    (
        kind,
        obj.name_any(),
        obj.resource_version().unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_watcher_resumes_after_cuts_and_an_outage_with_no_event_lost_or_repeated() {
    use futures::StreamExt;
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("retry-watcher").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    let start = api
        .create(&pp, &configmap("start", &[], "x"))
        .await
        .unwrap();

    let proxy = FaultProxy::start(cluster.apiserver_addr()).await.unwrap();
    let proxied = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let lw = Recording {
        inner: ListWatch::<ConfigMap>::namespaced(proxied, &ns),
        requests: requests.clone(),
    };
    let mut watcher = RetryWatcher::new(lw, &start.resource_version().unwrap()).unwrap();
    let events: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let collected = events.clone();
    let collector = tokio::spawn(async move {
        while let Some(event) = watcher.next().await {
            collected.lock().push(seen(&event.expect("no final error")));
        }
    });

    // Every write, in the order the apiserver took them: (type, name).
    let mut written: Vec<(&'static str, String)> = Vec::new();
    let write = async |i: usize, written: &mut Vec<(&'static str, String)>| {
        let name = format!("cm-{i}");
        api.create(&pp, &configmap(&name, &[], "0")).await.unwrap();
        written.push(("ADDED", name.clone()));
        let data = Patch::Merge(serde_json::json!({"data": {"value": "1"}}));
        api.patch(&name, &PatchParams::default(), &data)
            .await
            .unwrap();
        written.push(("MODIFIED", name.clone()));
        if i % 3 == 0 {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
            written.push(("DELETED", name));
        }
    };
    // Cuts while objects change.
    for round in 0..4 {
        for i in 0..5 {
            write(round * 5 + i, &mut written).await;
        }
        proxy.cut_all();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // An outage: the watch is cut and cannot come back while objects change.
    proxy.set_blocked(true);
    proxy.cut_all();
    for i in 20..30 {
        write(i, &mut written).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_blocked(false);
    for i in 30..33 {
        write(i, &mut written).await;
    }

    eventually(
        "the watcher to pass on every write",
        Duration::from_secs(60),
        || async { (events.lock().len() >= written.len()).then_some(()) },
    )
    .await;
    // A moment more, so a repeat after the last write would show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    collector.abort();
    let events = events.lock().clone();
    let got: Vec<(&'static str, String)> = events.iter().map(|(t, n, _)| (*t, n.clone())).collect();
    assert_eq!(got, written, "every write once, in order");
    let versions: Vec<u64> = events
        .iter()
        .map(|(_, _, rv)| rv.parse().unwrap())
        .collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "resourceVersions only grow: {versions:?}"
    );
    let watches = requests.lock().iter().filter(|r| r.verb == "WATCH").count();
    assert!(
        watches >= 5,
        "the watch was opened again after each cut: {watches}"
    );
}

fn ready(name: &'static str) -> impl FnMut(&CacheEvent<ConfigMap>) -> Result<bool, String> {
    move |event| {
        let cm = event.object();
        Ok(!matches!(event, CacheEvent::Deleted(_))
            && cm.metadata.name.as_deref() == Some(name)
            && cm
                .data
                .as_ref()
                .and_then(|d| d.get("value"))
                .is_some_and(|v| v == "ready"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn until_with_sync_is_met_at_once_by_the_cache_later_by_a_change_or_times_out() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("until-sync").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    api.create(&pp, &configmap("already", &[], "ready"))
        .await
        .unwrap();
    api.create(&pp, &configmap("later", &[], "not yet"))
        .await
        .unwrap();
    let lw = || ListWatch::<ConfigMap>::namespaced(client.clone(), &ns);

    // Already met: the initial list's Added event meets it, no change needed.
    let found = until_with_sync(lw(), Duration::from_secs(30), None, ready("already"))
        .await
        .unwrap();
    assert!(
        matches!(&found, Some(CacheEvent::Added(cm)) if cm.name_any() == "already"),
        "{found:?}"
    );

    // Met later, by the change that makes it true.
    let patcher = api.clone();
    let change = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let data = Patch::Merge(serde_json::json!({"data": {"value": "ready"}}));
        patcher
            .patch("later", &PatchParams::default(), &data)
            .await
            .unwrap()
    });
    let found = until_with_sync(lw(), Duration::from_secs(30), None, ready("later"))
        .await
        .unwrap();
    let patched = change.await.unwrap();
    assert!(
        matches!(&found, Some(CacheEvent::Modified(cm)) if cm.resource_version() == patched.resource_version()),
        "{found:?}"
    );

    // Never met: a timeout error, after the cache synced.
    let err = until_with_sync(lw(), Duration::from_secs(2), None, ready("absent"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, UntilError::Timeout { synced: true, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");
}
