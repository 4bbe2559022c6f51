//! Checking an informer against the real apiserver (kubeloop's cache tests use these): a
//! handler that checks the event sequence per key ([`Checker`]), convergence of the cache to
//! the server's own LIST ([`assert_converges`]), a lister-watcher that records every request
//! and its answer ([`Recording`]), a workload that creates, changes and deletes ConfigMaps
//! while faults happen ([`churn`]), and a small CRD ([`ensure_widget_crd`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{Api, ListParams, PostParams};
use kube_client::{Client, Resource};
use kubeloop::cache::{DeletedObject, Indexer, ResourceEventHandler, meta_namespace_key};
use parking_lot::Mutex;

use kubeloop::testing::eventually;

/// What a handler saw, checked as it arrives: no add of a key already present, no update
/// or delete of a key not present.
#[derive(Default, Clone)]
pub struct Seen {
    /// key -> resourceVersion as the handler knows it.
    pub present: BTreeMap<String, String>,
    /// Broken rules, in order.
    pub violations: Vec<String>,
    /// Every event as "add ns/a" (" initial" appended for initial-list adds), "update ns/a", "delete ns/a", "tombstone ns/a".
    pub log: Vec<String>,
    /// Keys whose deletion came as a tombstone.
    pub tombstones: HashSet<String>,
    /// Keys whose deletion came as a real DELETED event.
    pub deletes: HashSet<String>,
}

/// A handler recording into [`Seen`].
#[derive(Clone, Default)]
pub struct Checker {
    pub seen: Arc<Mutex<Seen>>,
}

fn key_rv<K: Resource>(o: &K) -> (String, String) {
    (
        meta_namespace_key(o).unwrap(),
        o.meta().resource_version.clone().unwrap_or_default(),
    )
}

impl<K: Resource + Send + Sync + 'static> ResourceEventHandler<K> for Checker {
    fn on_add(&self, obj: &Arc<K>, initial: bool) {
        let (key, rv) = key_rv(&**obj);
        let mut s = self.seen.lock();
        s.log.push(format!(
            "add {key}{}",
            if initial { " initial" } else { "" }
        ));
        if s.present.insert(key.clone(), rv).is_some() {
            s.violations
                .push(format!("{key} added twice without a delete between"));
        }
    }
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        let (key, rv) = key_rv(&**new);
        let (old_key, _) = key_rv(&**old);
        let mut s = self.seen.lock();
        s.log.push(format!("update {key}"));
        if old_key != key {
            s.violations
                .push(format!("update with old {old_key} and new {key}"));
        }
        if s.present.insert(key.clone(), rv).is_none() {
            s.violations.push(format!("{key} updated but never added"));
        }
    }
    fn on_delete(&self, obj: &DeletedObject<K>) {
        let mut s = self.seen.lock();
        let key = match obj {
            DeletedObject::Object(o) => {
                let key = meta_namespace_key(&**o).unwrap();
                s.deletes.insert(key.clone());
                s.log.push(format!("delete {key}"));
                key
            }
            DeletedObject::Unknown(t) => {
                s.tombstones.insert(t.key.clone());
                s.log.push(format!("tombstone {}", t.key));
                t.key.clone()
            }
        };
        if s.present.remove(&key).is_none() {
            s.violations.push(format!("{key} deleted but not present"));
        }
    }
}

impl Checker {
    /// A copy of everything seen so far.
    pub fn snapshot(&self) -> Seen {
        self.seen.lock().clone()
    }
    pub fn violations(&self) -> Vec<String> {
        self.seen.lock().violations.clone()
    }
    pub fn present(&self) -> BTreeMap<String, String> {
        self.seen.lock().present.clone()
    }
}

/// key -> resourceVersion of every object in an indexer.
pub fn cache_state<K: Resource>(indexer: &Indexer<K>) -> BTreeMap<String, String> {
    indexer.list().iter().map(|o| key_rv(&**o)).collect()
}

/// key -> resourceVersion of every ConfigMap in `ns`, as the server lists them now.
pub async fn server_configmaps(
    client: &Client,
    ns: &str,
) -> Result<BTreeMap<String, String>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items.iter().map(key_rv).collect())
}

/// Waits until the cache and the handler's view both equal the server's list.
pub async fn assert_converges<K: Resource>(
    client: &Client,
    ns: &str,
    indexer: &Indexer<K>,
    checker: &Checker,
    timeout: Duration,
) {
    eventually("the cache to converge to the server", timeout, || async {
        let server = server_configmaps(client, ns).await?;
        let cache = cache_state(indexer);
        if cache != server {
            return Err(format!(
                "cache has {} objects, server {}; first difference: {:?}",
                cache.len(),
                server.len(),
                first_difference(&cache, &server)
            ));
        }
        let handler = checker.present();
        if handler != server {
            return Err(format!(
                "handler view differs: {:?}",
                first_difference(&handler, &server)
            ));
        }
        Ok(())
    })
    .await;
}

fn first_difference(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Option<String> {
    for (k, v) in a {
        match b.get(k) {
            None => return Some(format!("{k} only in cache")),
            Some(w) if w != v => return Some(format!("{k}: {v} vs {w}")),
            _ => {}
        }
    }
    b.keys()
        .find(|k| !a.contains_key(*k))
        .map(|k| format!("{k} only on server"))
}

/// A ConfigMap with a name, labels and one data entry.
pub fn configmap(name: &str, labels: &[(&str, &str)], value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        },
        "data": {"value": value},
    }))
    .unwrap()
}

/// Creates `widgets.test.kubeloop.dev` (v1, namespaced, spec.size integer) if missing and
/// waits until it is Established.
pub async fn ensure_widget_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "widgets.test.kubeloop.dev"},
        "spec": {
            "group": "test.kubeloop.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}
                }}}
            }]
        }
    }))
    .unwrap();
    crate::ensure_crd(client, &crd).await;
}

/// The process's peak resident set size in KiB (VmHWM).
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// One request a [`Recording`] lister-watcher saw.
#[derive(Debug, Clone)]
pub struct Request {
    /// "LIST" or "WATCH".
    pub verb: &'static str,
    /// The resourceVersion asked for ("" if none).
    pub resource_version: String,
    /// Whether the request carried a `limit`.
    pub paginated: bool,
    /// The HTTP code of a failed answer, or of a watch ERROR event; 200 otherwise.
    pub code: u16,
    /// When the answer came.
    pub at: std::time::Instant,
}

/// Wraps a real [`ListerWatcher`] and records each request and its outcome, including
/// ERROR events that arrive inside a watch stream.
pub struct Recording<L> {
    pub inner: L,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl<K, L> kubeloop::cache::ListerWatcher<K> for Recording<L>
where
    K: Send + 'static,
    L: kubeloop::cache::ListerWatcher<K>,
{
    fn list(
        &self,
        options: &kubeloop::cache::ListOptions,
    ) -> impl std::future::Future<
        Output = Result<kubeloop::cache::ListPage<K>, kubeloop::cache::ListWatchError>,
    > + Send {
        let fut = self.inner.list(options);
        let requests = self.requests.clone();
        let rv = options.resource_version.clone().unwrap_or_default();
        let paginated = options.limit.is_some();
        let first_page = options.continue_token.is_none();
        async move {
            let r = fut.await;
            if first_page {
                let code = match &r {
                    Ok(_) => 200,
                    Err(e) => e.code().unwrap_or(0),
                };
                requests.lock().push(Request {
                    verb: "LIST",
                    resource_version: rv,
                    paginated,
                    code,
                    at: std::time::Instant::now(),
                });
            }
            r
        }
    }

    fn watch(
        &self,
        options: &kubeloop::cache::WatchOptions,
    ) -> impl std::future::Future<
        Output = Result<kubeloop::cache::WatchStream<K>, kubeloop::cache::ListWatchError>,
    > + Send {
        use futures::StreamExt;
        let fut = self.inner.watch(options);
        let requests = self.requests.clone();
        let rv = options.resource_version.clone();
        async move {
            match fut.await {
                Ok(stream) => {
                    requests.lock().push(Request {
                        verb: "WATCH",
                        resource_version: rv.clone(),
                        paginated: false,
                        code: 200,
                        at: std::time::Instant::now(),
                    });
                    let stream = stream.inspect(move |item| {
                        let code = match item {
                            Ok(kube_client::core::WatchEvent::Error(s)) => s.code,
                            Err(e) => e.code().unwrap_or(0),
                            _ => return,
                        };
                        if code != 0 {
                            requests.lock().push(Request {
                                verb: "WATCH-ERROR",
                                resource_version: rv.clone(),
                                paginated: false,
                                code,
                                at: std::time::Instant::now(),
                            });
                        }
                    });
                    Ok(stream.boxed())
                }
                Err(e) => {
                    requests.lock().push(Request {
                        verb: "WATCH",
                        resource_version: rv,
                        paginated: false,
                        code: e.code().unwrap_or(0),
                        at: std::time::Instant::now(),
                    });
                    Err(e)
                }
            }
        }
    }

    fn type_description(&self) -> String {
        self.inner.type_description()
    }

    fn fields_at_length(&self) -> bool {
        self.inner.fields_at_length()
    }
}

/// Creates, changes and deletes ConfigMaps named `<prefix>-<n>` in `ns` for `duration`,
/// also deleting the `victims` (pre-existing names). Failed requests (apiserver down) are
/// ignored. Returns the names whose deletion the server confirmed.
pub async fn churn(
    api: Api<ConfigMap>,
    prefix: &str,
    duration: Duration,
    victims: Vec<String>,
) -> std::collections::BTreeSet<String> {
    use kube_client::api::{DeleteParams, Patch, PatchParams};
    let deadline = tokio::time::Instant::now() + duration;
    let mut victims = victims;
    let mut live: Vec<String> = Vec::new();
    let mut deleted = std::collections::BTreeSet::new();
    let mut i = 0usize;
    while tokio::time::Instant::now() < deadline {
        let name = format!("{prefix}-{i}");
        if api
            .create(
                &PostParams::default(),
                &configmap(&name, &[("churn", prefix)], "0"),
            )
            .await
            .is_ok()
        {
            live.push(name);
        }
        if i % 2 == 0
            && let Some(target) = live.first().cloned()
        {
            let _ = api
                .patch(
                    &target,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"data": {"value": i.to_string()}})),
                )
                .await;
        }
        if i % 3 == 0 {
            let target = victims.pop().or_else(|| {
                if live.len() > 2 {
                    Some(live.remove(0))
                } else {
                    None
                }
            });
            if let Some(target) = target
                && api.delete(&target, &DeleteParams::default()).await.is_ok()
            {
                deleted.insert(target);
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    deleted
}

/// Creates `<prefix>-0` .. `<prefix>-<n-1>`, each with data value "x": the objects a fault
/// test starts from.
pub async fn seed_configmaps(api: &Api<ConfigMap>, prefix: &str, n: usize) {
    for i in 0..n {
        api.create(
            &PostParams::default(),
            &configmap(&format!("{prefix}-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
}
