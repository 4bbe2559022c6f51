//! client-go's consistency detectors on the real apiserver: switched on, each finds a cache
//! made wrong on purpose (one object held back, one at a stale resourceVersion) by an Exact
//! LIST from etcd at the synced version; switched off, the reflector makes no LIST beyond its
//! own (none at all with a streaming list).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::ResourceExt;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kube_client::core::WatchEvent;
use kubeloop::cache::{
    ConsistencyDetectors, Inconsistency, ListOptions, ListPage, ListWatch, ListWatchError,
    ListerWatcher, Reflector, ReflectorConfig, ReflectorStore, StoreError, WatchOptions,
    WatchStream,
};
use kubeloop::testing::eventually;
use kubeloop_testenv::informer::configmap;
use kubeloop_testenv::{self as testenv};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// Passes the real apiserver's answers on, except that what the reflector lists and streams
/// for its cache (every request but an Exact LIST) leaves out `held_back` and shows `stale`
/// at `stale_rv`. Counts every LIST request, pages included.
struct Corrupting {
    inner: ListWatch<ConfigMap>,
    held_back: String,
    stale: String,
    stale_rv: String,
    lists: Arc<AtomicUsize>,
    exact_lists: Arc<AtomicUsize>,
}

impl Corrupting {
    /// The object as the wrong cache gets it; `None` to hold it back.
    fn corrupt(&self, mut obj: ConfigMap) -> Option<ConfigMap> {
        let name = obj.name_any();
        if name == self.held_back {
            return None;
        }
        if name == self.stale {
            obj.metadata.resource_version = Some(self.stale_rv.clone());
        }
        Some(obj)
    }
}

impl ListerWatcher<ConfigMap> for Corrupting {
    async fn list(&self, options: &ListOptions) -> Result<ListPage<ConfigMap>, ListWatchError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        let exact = options.resource_version_match.as_deref() == Some("Exact");
        if exact {
            self.exact_lists.fetch_add(1, Ordering::SeqCst);
        }
        let mut page = self.inner.list(options).await?;
        if !exact && options.continue_token.is_none() {
            page.items = std::mem::take(&mut page.items)
                .into_iter()
                .filter_map(|o| self.corrupt(o))
                .collect();
        }
        Ok(page)
    }

    async fn watch(
        &self,
        options: &WatchOptions,
    ) -> Result<WatchStream<ConfigMap>, ListWatchError> {
        let stream = self.inner.watch(options).await?;
        let (held_back, stale, stale_rv) = (
            self.held_back.clone(),
            self.stale.clone(),
            self.stale_rv.clone(),
        );
        let this = Corrupting {
            inner: self.inner.clone(),
            held_back,
            stale,
            stale_rv,
            lists: self.lists.clone(),
            exact_lists: self.exact_lists.clone(),
        };
        Ok(stream
            .filter_map(move |event| {
                let out = match event {
                    Ok(WatchEvent::Added(o)) => this.corrupt(o).map(WatchEvent::Added).map(Ok),
                    other => Some(other),
                };
                std::future::ready(out)
            })
            .boxed())
    }

    fn type_description(&self) -> String {
        self.inner.type_description()
    }
}

/// Keeps the names it was last given.
#[derive(Default)]
struct Names(Mutex<Vec<String>>);

impl ReflectorStore<ConfigMap> for Names {
    fn add(&self, _: ConfigMap) -> Result<(), StoreError> {
        Ok(())
    }
    fn update(&self, _: ConfigMap) -> Result<(), StoreError> {
        Ok(())
    }
    fn delete(&self, _: ConfigMap) -> Result<(), StoreError> {
        Ok(())
    }
    fn replace(&self, list: Vec<ConfigMap>, _: &str) -> Result<(), StoreError> {
        let mut names: Vec<String> = list.iter().map(|o| o.name_any()).collect();
        names.sort();
        *self.0.lock() = names;
        Ok(())
    }
    fn resync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

struct Run {
    found: Vec<Inconsistency>,
    cached: Vec<String>,
    lists: usize,
    exact_lists: usize,
}

/// Runs a reflector over `lw` until it has synced (and, with a detector on, until the detector
/// has listed), then a little longer.
async fn run(lw: Corrupting, use_watch_list: bool, detectors: ConsistencyDetectors) -> Run {
    let (lists, exact_lists) = (lw.lists.clone(), lw.exact_lists.clone());
    let store = Arc::new(Names::default());
    let found: Arc<Mutex<Vec<Inconsistency>>> = Arc::default();
    let seen = found.clone();
    let config = ReflectorConfig {
        use_watch_list,
        consistency: detectors,
        ..Default::default()
    };
    let reflector = Reflector::new(lw, store.clone(), config)
        .with_inconsistency_handler(Arc::new(move |i| seen.lock().push(i.clone())));
    let synced = reflector.last_sync_resource_version();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(reflector.run(cancel.clone()));
    let on = detectors.watch_list || detectors.list_from_cache;
    eventually(
        "the reflector synced (and its detector ran)",
        Duration::from_secs(30),
        || {
            let done = !synced.read().is_empty() && (!on || !found.lock().is_empty());
            std::future::ready(done)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    task.await.unwrap();
    let found = found.lock().clone();
    let cached = store.0.lock().clone();
    Run {
        found,
        cached,
        lists: lists.load(Ordering::SeqCst),
        exact_lists: exact_lists.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consistency_detectors_find_a_wrong_cache_and_switched_off_ask_nothing() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("consistency").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    for name in ["kept", "held-back", "stale"] {
        api.create(&pp, &configmap(name, &[], "0")).await.unwrap();
    }
    let stale_rv = api.get("stale").await.unwrap().resource_version().unwrap();
    let patch = Patch::Merge(serde_json::json!({"data": {"value": "1"}}));
    let now = api
        .patch("stale", &PatchParams::default(), &patch)
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let lw = || Corrupting {
        inner: ListWatch::namespaced(client.clone(), &ns),
        held_back: "held-back".into(),
        stale: "stale".into(),
        stale_rv: stale_rv.clone(),
        lists: Arc::default(),
        exact_lists: Arc::default(),
    };
    let wrong = ["kept".to_string(), "stale".to_string()];
    let stale_key = format!("{ns}/stale");

    // On: the streaming list, then the paged LIST, each checked by its own detector.
    for (use_watch_list, detectors) in [
        (
            true,
            ConsistencyDetectors {
                watch_list: true,
                list_from_cache: false,
            },
        ),
        (
            false,
            ConsistencyDetectors {
                watch_list: false,
                list_from_cache: true,
            },
        ),
    ] {
        let r = run(lw(), use_watch_list, detectors).await;
        assert_eq!(r.cached, wrong, "the cache was made wrong");
        assert!(r.exact_lists >= 1, "the detector listed etcd");
        let found = &r.found[0];
        assert_eq!(found.type_name, "v1/configmaps");
        assert_eq!(found.missing, [format!("{ns}/held-back")]);
        assert!(found.unexpected.is_empty(), "{found}");
        assert_eq!(
            found.stale,
            [(stale_key.clone(), stale_rv.clone(), now.clone())]
        );
    }

    // Off: a streaming list makes no LIST request at all; a paged one only its own page.
    let r = run(lw(), true, ConsistencyDetectors::default()).await;
    assert_eq!(r.cached, wrong);
    assert!(r.found.is_empty());
    assert_eq!((r.lists, r.exact_lists), (0, 0));
    let r = run(lw(), false, ConsistencyDetectors::default()).await;
    assert_eq!(r.cached, wrong);
    assert!(r.found.is_empty());
    assert_eq!((r.lists, r.exact_lists), (1, 0));
}
