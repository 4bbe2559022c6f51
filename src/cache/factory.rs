//! One informer per type, shared: client-go `informers/factory.go`
//! (`sharedInformerFactory`) and `dynamicinformer`'s factory in one.
//!
//! `informer::<K>()` returns the same [`SharedIndexInformer`] for the same type every time
//! (typed resources keyed by Rust type, dynamic ones by group/version/plural). `start` starts
//! every informer not yet started and can be called again after adding more; `shutdown`
//! stops them all and waits for their tasks, after which `start` does nothing.
//!
//! client-go's factory options: `WithNamespace` and `defaultResync` are [`FactoryOptions`];
//! `WithTweakListOptions` is [`SharedInformerFactory::with_tweak_list_options`] (the selectors
//! of every informer's list and watch); `WithTransform` is
//! [`SharedInformerFactory::with_transform`] (every informer's objects' metadata) and
//! [`SharedInformerFactory::with_transform_for`] (one type's objects), each run before the
//! object is stored. They apply to informers created after they are set.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube_client::core::{ApiResource, DynamicObject, ObjectMeta, PartialObjectMeta};
use kube_client::{Client, Resource};
use parking_lot::Mutex;

use super::identity::InformerName;
use super::list_watch::{CacheObject, ListWatch};
use super::metrics::CacheMetrics;
use super::reflector::ReflectorConfig;
use super::shard_scope::ShardScope;
use super::shard_selector::ShardSelector;
use super::shared_informer::{InformerConfig, SharedIndexInformer};
use super::store::TransformFunc;
use super::stored::StoreKind;

/// Settings every informer of a factory gets.
#[derive(Debug, Clone, Default)]
pub struct FactoryOptions {
    /// Watch one namespace only (`None`: all namespaces). Typed cluster-scoped resources
    /// (Nodes, Namespaces, ...) ignore it, as client-go's generated informers for them take no
    /// namespace; a dynamic informer applies it as given, since [`ApiResource`] does not say
    /// whether the resource is namespaced.
    pub namespace: Option<String>,
    /// `labelSelector` for every list and watch (what a tweak starts from:
    /// [`SharedInformerFactory::with_tweak_list_options`]).
    pub label_selector: Option<String>,
    /// `fieldSelector` for every list and watch.
    pub field_selector: Option<String>,
    /// `shardSelector` for every list and watch (KEP-5866): only the objects whose namespace
    /// (or uid) hashes into its ranges reach the caches, filtered by the apiserver when it
    /// has the `ShardedListAndWatch` gate, and by the informer otherwise
    /// ([`ListWatch::shards`]).
    pub shard_selector: Option<ShardSelector>,
    /// The shards a replica of a sharded controller holds, changing while the informers run
    /// ([`ListWatch::shard_scope`]); when set, it replaces the shard selector of every
    /// informer (the tweak's included). The runtime's ring keeps it
    /// ([`crate::runtime::ShardRing::watch_held_shards`]).
    pub shard_scope: Option<ShardScope>,
    /// Default handler resync period (client-go `defaultResync`; zero = none).
    pub resync_period: Duration,
    /// Reflector settings.
    pub reflector: ReflectorConfig,
    /// Where every informer reports.
    pub metrics: CacheMetrics,
    /// How every informer's cache holds its objects (typed, client-go's; or compact). An
    /// informer built directly takes it in [`InformerConfig::store`].
    pub store: StoreKind,
}

/// The selectors of every list and watch of a factory's informers, as a
/// [`TweakListOptions`] may change them (client-go's tweak gets the whole `ListOptions`; the
/// rest of them the reflector owns here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSelectors {
    /// `labelSelector` (`None` or empty: every object).
    pub label_selector: Option<String>,
    /// `fieldSelector` (`None` or empty: every object).
    pub field_selector: Option<String>,
    /// `shardSelector` (`None`: every object; see [`FactoryOptions::shard_selector`]).
    pub shard_selector: Option<ShardSelector>,
}

/// client-go's `TweakListOptionsFunc`: run once per informer the factory creates, on the
/// selectors [`FactoryOptions`] gives, and applied to that informer's every list and watch.
pub type TweakListOptions = Arc<dyn Fn(&mut ListSelectors) + Send + Sync>;

/// A transform of every object's metadata, whatever its type (client-go `WithTransform`).
pub type MetadataTransform = Arc<dyn Fn(&mut ObjectMeta) + Send + Sync>;

/// A factory of shared informers.
#[derive(Clone)]
pub struct SharedInformerFactory {
    client: Client,
    options: FactoryOptions,
    tweak: Option<TweakListOptions>,
    transform: Option<MetadataTransform>,
    /// Per type: a `TransformFunc<K>` for the `K` of the key.
    type_transforms: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    informer_name: Option<InformerName>,
    inner: Arc<Mutex<FactoryInner>>,
}

#[derive(Default)]
struct FactoryInner {
    informers: HashMap<InformerKey, Box<dyn ErasedInformer>>,
    shutting_down: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum InformerKey {
    Typed(TypeId),
    Dynamic {
        group: String,
        version: String,
        plural: String,
        metadata_only: bool,
    },
}

impl InformerKey {
    fn dynamic(resource: &ApiResource, metadata_only: bool) -> Self {
        Self::Dynamic {
            group: resource.group.clone(),
            version: resource.version.clone(),
            plural: resource.plural.clone(),
            metadata_only,
        }
    }
}

/// What the factory needs from an informer of any type. (The controller runtime keeps a view
/// of its own, `runtime/builder.rs`'s `RunInformer`.)
trait ErasedInformer: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn start(&self);
    fn type_name(&self) -> String;
    fn wait_for_cache_sync(&self) -> BoxFuture<'static, bool>;
    fn shutdown(&self) -> BoxFuture<'static, ()>;
}

impl<K: CacheObject> ErasedInformer for SharedIndexInformer<K> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn start(&self) {
        SharedIndexInformer::start(self)
    }
    fn type_name(&self) -> String {
        SharedIndexInformer::type_name(self).to_string()
    }
    fn wait_for_cache_sync(&self) -> BoxFuture<'static, bool> {
        let me = self.clone();
        async move { me.wait_for_cache_sync().await }.boxed()
    }
    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let me = self.clone();
        async move { me.shutdown().await }.boxed()
    }
}

impl SharedInformerFactory {
    /// A factory over `client`.
    pub fn new(client: Client, options: FactoryOptions) -> Self {
        Self {
            client,
            options,
            tweak: None,
            transform: None,
            type_transforms: HashMap::new(),
            informer_name: None,
            inner: Default::default(),
        }
    }

    /// client-go `WithTweakListOptions`: `tweak` sets the label, field and shard selectors of every
    /// list and watch of the informers created from now on (it starts from
    /// [`FactoryOptions::label_selector`], [`FactoryOptions::field_selector`] and
    /// [`FactoryOptions::shard_selector`]). Objects
    /// the selectors leave out never reach the caches.
    ///
    /// # Examples
    /// ```
    /// # use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
    /// # fn f(client: kube_client::Client) {
    /// let factory = SharedInformerFactory::new(client, FactoryOptions::default())
    ///     .with_tweak_list_options(|selectors| {
    ///         selectors.label_selector = Some("app.kubernetes.io/managed-by=me".into());
    ///     });
    /// # }
    /// ```
    pub fn with_tweak_list_options(
        mut self,
        tweak: impl Fn(&mut ListSelectors) + Send + Sync + 'static,
    ) -> Self {
        self.tweak = Some(Arc::new(tweak));
        self
    }

    /// client-go `WithInformerName`: each informer created from now on registers its
    /// resource under `name` and publishes client-go's `informer_*` series into
    /// [`FactoryOptions::metrics`] with that name (the first informer of a resource only).
    /// [`shutdown`](Self::shutdown) releases the name, as client-go's does.
    pub fn with_informer_name(mut self, name: InformerName) -> Self {
        self.informer_name = Some(name);
        self
    }

    /// client-go `WithTransform`: `transform` runs on the metadata of every object of every
    /// informer created from now on, before the object is stored (e.g. drop annotations or
    /// managedFields a controller never reads). Runs before a transform of the object's type
    /// ([`with_transform_for`](Self::with_transform_for)).
    pub fn with_transform(
        mut self,
        transform: impl Fn(&mut ObjectMeta) + Send + Sync + 'static,
    ) -> Self {
        self.transform = Some(Arc::new(transform));
        self
    }

    /// A transform of the objects of type `K` only (the informer's `set_transform`, set by
    /// the factory), run before they are stored. For `DynamicObject` it applies to every
    /// dynamic informer.
    pub fn with_transform_for<K: CacheObject>(
        mut self,
        transform: impl Fn(K) -> K + Send + Sync + 'static,
    ) -> Self {
        let transform: TransformFunc<K> = Arc::new(transform);
        self.type_transforms
            .insert(TypeId::of::<K>(), Arc::new(transform));
        self
    }

    /// The informer of a typed resource (created on first use).
    pub fn informer<K>(&self) -> SharedIndexInformer<K>
    where
        K: CacheObject + Resource<DynamicType = ()>,
    {
        let cluster_scoped =
            TypeId::of::<K::Scope>() == TypeId::of::<k8s_openapi::ClusterResourceScope>();
        let namespace = if cluster_scoped {
            None
        } else {
            self.options.namespace.as_deref()
        };
        self.get_or_create(InformerKey::Typed(TypeId::of::<K>()), &(), namespace)
    }

    /// The metadata-only informer of a typed resource (client-go's `metadatainformer`,
    /// controller-runtime's `OnlyMetadata`): its objects are `PartialObjectMeta<K>`, each
    /// object's metadata as the apiserver sends it for `PartialObjectMetadata`, on the same
    /// reflector, lists and watches. A separate informer from `informer::<K>()`.
    pub fn metadata_informer<K>(&self) -> SharedIndexInformer<PartialObjectMeta<K>>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        self.informer::<PartialObjectMeta<K>>()
    }

    /// The informer of a dynamic resource (created on first use).
    pub fn dynamic_informer(&self, resource: &ApiResource) -> SharedIndexInformer<DynamicObject> {
        let key = InformerKey::dynamic(resource, false);
        self.get_or_create(key, resource, self.options.namespace.as_deref())
    }

    /// The metadata-only informer of a dynamic resource (client-go's
    /// `metadatainformer.NewFilteredMetadataInformer` with a GVR).
    pub fn dynamic_metadata_informer(
        &self,
        resource: &ApiResource,
    ) -> SharedIndexInformer<PartialObjectMeta<DynamicObject>> {
        let key = InformerKey::dynamic(resource, true);
        self.get_or_create(key, resource, self.options.namespace.as_deref())
    }

    fn get_or_create<K: CacheObject>(
        &self,
        key: InformerKey,
        dyntype: &K::DynamicType,
        namespace: Option<&str>,
    ) -> SharedIndexInformer<K> {
        let mut inner = self.inner.lock();
        if let Some(existing) = inner.informers.get(&key)
            && let Some(inf) = existing.as_any().downcast_ref::<SharedIndexInformer<K>>()
        {
            return inf.clone();
        }
        let mut lw = ListWatch::<K>::new(self.client.clone(), dyntype, namespace);
        let mut selectors = ListSelectors {
            label_selector: self.options.label_selector.clone(),
            field_selector: self.options.field_selector.clone(),
            shard_selector: self.options.shard_selector.clone(),
        };
        if let Some(tweak) = &self.tweak {
            tweak(&mut selectors);
        }
        if let Some(l) = &selectors.label_selector {
            lw = lw.labels(l);
        }
        if let Some(f) = &selectors.field_selector {
            lw = lw.fields(f);
        }
        if let Some(s) = selectors.shard_selector {
            lw = lw.shards(s);
        }
        if let Some(scope) = &self.options.shard_scope {
            lw = lw.shard_scope(scope.clone());
        }
        let informer = SharedIndexInformer::new(
            lw,
            InformerConfig {
                resync_period: self.options.resync_period,
                reflector: self.options.reflector.clone(),
                metrics: self.options.metrics.clone(),
                store: self.options.store,
                identity: self
                    .informer_name
                    .as_ref()
                    .map_or_else(Default::default, |name| {
                        name.with_resource(
                            &K::group(dyntype),
                            &K::version(dyntype),
                            &K::plural(dyntype),
                        )
                    }),
                ..Default::default()
            },
        );
        if let Some(transform) = self.transform_of::<K>() {
            informer
                .set_transform(move |obj| transform(obj))
                .expect("a new informer has not started");
        }
        inner.informers.insert(key, Box::new(informer.clone()));
        informer
    }

    /// The metadata transform, then `K`'s own, as one.
    fn transform_of<K: CacheObject>(&self) -> Option<TransformFunc<K>> {
        let of_type = self
            .type_transforms
            .get(&TypeId::of::<K>())
            .and_then(|t| t.downcast_ref::<TransformFunc<K>>())
            .cloned();
        match (self.transform.clone(), of_type) {
            (None, of_type) => of_type,
            (Some(meta), None) => Some(Arc::new(move |mut obj: K| {
                meta(obj.meta_mut());
                obj
            })),
            (Some(meta), Some(of_type)) => Some(Arc::new(move |mut obj: K| {
                meta(obj.meta_mut());
                of_type(obj)
            })),
        }
    }

    /// Starts every informer not yet started. Idempotent; a no-op after `shutdown`.
    pub fn start(&self) {
        let inner = self.inner.lock();
        if inner.shutting_down {
            return;
        }
        for inf in inner.informers.values() {
            inf.start();
        }
    }

    /// Waits until every informer has synced; maps type names to whether they did (false if
    /// an informer was shut down first).
    pub async fn wait_for_cache_sync(&self) -> BTreeMap<String, bool> {
        let waits: Vec<(String, BoxFuture<'static, bool>)> = {
            let inner = self.inner.lock();
            inner
                .informers
                .values()
                .map(|i| (i.type_name(), i.wait_for_cache_sync()))
                .collect()
        };
        let mut out = BTreeMap::new();
        for (name, wait) in waits {
            out.insert(name, wait.await);
        }
        out
    }

    /// Stops every informer and waits for their tasks to end.
    pub async fn shutdown(&self) {
        let stops: Vec<BoxFuture<'static, ()>> = {
            let mut inner = self.inner.lock();
            inner.shutting_down = true;
            inner.informers.values().map(|i| i.shutdown()).collect()
        };
        futures::future::join_all(stops).await;
        if let Some(name) = &self.informer_name {
            name.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube_client::core::GroupVersionKind;
    use kube_client::core::ObjectMeta;

    fn client() -> Client {
        let cfg = kube_client::Config::new("http://127.0.0.1:1".parse().unwrap());
        Client::try_from(cfg).unwrap()
    }

    // kubeloop's own: one informer per type
    #[tokio::test(start_paused = true)]
    async fn one_informer_per_type_and_shutdown_makes_start_a_no_op() {
        let f = SharedInformerFactory::new(client(), FactoryOptions::default());
        let a = f.informer::<ConfigMap>();
        let b = f.informer::<ConfigMap>();
        assert!(a.ptr_eq(&b));
        let s = f.informer::<Secret>();
        assert_eq!(s.type_name(), "v1/secrets");
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("test.kubeloop.dev", "v1", "Widget"),
            "widgets",
        );
        let d1 = f.dynamic_informer(&ar);
        let d2 = f.dynamic_informer(&ar);
        assert!(d1.ptr_eq(&d2));
        assert_eq!(d1.type_name(), "test.kubeloop.dev/v1/widgets");
        f.shutdown().await;
        f.start();
        assert!(a.is_stopped() && s.is_stopped() && d1.is_stopped());
        let synced = f.wait_for_cache_sync().await;
        assert_eq!(synced.len(), 3);
        assert!(synced.values().all(|v| !v));
    }

    fn labelled(name: &str, app: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some("7".into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// `%XX` escapes of a query value undone (`+` is a space).
    fn unescape(value: &str) -> String {
        let mut out = Vec::new();
        let mut bytes = value.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'%' => {
                    let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                    out.push(u8::from_str_radix(&hex, 16).unwrap());
                }
                b'+' => out.push(b' '),
                b => out.push(b),
            }
        }
        String::from_utf8(out).unwrap()
    }

    /// A fake apiserver over `objects` on a local port, as the factory's clients see one: a
    /// LIST gets the objects its `labelSelector` matches (as JSON), a WATCH stays open with
    /// no events. Each request's target is recorded in `requests`.
    async fn fake_apiserver(
        objects: Vec<ConfigMap>,
        requests: Arc<Mutex<Vec<String>>>,
    ) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let (objects, requests) = (objects.clone(), requests.clone());
                tokio::spawn(async move {
                    let mut buffered = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buffered.extend_from_slice(&chunk[..n]);
                        let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buffered[..end]).to_string();
                        buffered.drain(..end + 4);
                        let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                        requests.lock().push(target.clone());
                        let query = target.split_once('?').map_or("", |(_, q)| q);
                        let param = |name: &str| {
                            query.split('&').find_map(|kv| {
                                kv.strip_prefix(name)?.strip_prefix('=').map(unescape)
                            })
                        };
                        if param("watch").is_some() {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                            let _ = conn.write_all(head.as_bytes()).await;
                            std::future::pending::<()>().await;
                        }
                        let selector = crate::cache::LabelSelector::parse(
                            &param("labelSelector").unwrap_or_default(),
                        )
                        .unwrap();
                        let items: Vec<&ConfigMap> = objects
                            .iter()
                            .filter(|o| selector.matches(o.metadata.labels.as_ref()))
                            .collect();
                        let body = serde_json::json!({
                            "kind": "ConfigMapList", "apiVersion": "v1",
                            "metadata": {"resourceVersion": "7"}, "items": items,
                        })
                        .to_string();
                        let response = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    // client-go: informers/factory.go `WithTweakListOptions`, `WithTransform`.
    #[tokio::test]
    async fn a_tweaked_selector_keeps_other_objects_out_and_transforms_run_before_the_store() {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let objects = vec![
            labelled("mine-1", "mine"),
            labelled("mine-2", "mine"),
            labelled("theirs", "theirs"),
        ];
        let addr = fake_apiserver(objects, requests.clone()).await;
        let client = Client::try_from(kube_client::Config::new(
            format!("http://{addr}").parse().unwrap(),
        ))
        .unwrap();
        let options = FactoryOptions {
            reflector: ReflectorConfig {
                use_watch_list: false,
                ..Default::default()
            },
            ..Default::default()
        };
        let factory = SharedInformerFactory::new(client, options)
            .with_tweak_list_options(|selectors| {
                selectors.label_selector = Some("app=mine".into());
            })
            .with_transform(|meta| {
                meta.annotations = Some([("seen".to_string(), "meta".to_string())].into())
            })
            .with_transform_for::<ConfigMap>(|mut cm| {
                let seen = cm.metadata.annotations.clone().unwrap_or_default();
                cm.data = Some([("after".to_string(), seen["seen"].clone())].into());
                cm
            });
        let informer = factory.informer::<ConfigMap>();
        factory.start();
        assert!(informer.wait_for_cache_sync().await);

        let mut cached = informer.indexer().list_keys();
        cached.sort();
        assert_eq!(cached, ["ns/mine-1", "ns/mine-2"]);
        let mine = informer.lister().get("ns", "mine-1").unwrap();
        assert_eq!(
            mine.data.as_ref().unwrap()["after"],
            "meta",
            "the metadata transform, then the type's, before the store"
        );
        crate::testing::eventually("the watch to open", Duration::from_secs(10), || async {
            (requests.lock().len() >= 2).then_some(())
        })
        .await;
        let requests = requests.lock().clone();
        assert!(
            requests
                .iter()
                .all(|r| r.contains("labelSelector=app%3Dmine")),
            "the tweak is on every list and watch: {requests:?}"
        );
        assert!(
            requests.iter().any(|r| r.contains("watch=true")),
            "{requests:?}"
        );
        factory.shutdown().await;
    }

    // kubeloop's own (KEP-5866): the factory's shard selector goes out on every request, and
    // from a server that ignores it (as one without the ShardedListAndWatch gate does) the
    // informer keeps the shard only, saying once that it filtered.
    #[tokio::test]
    async fn a_shard_selector_the_server_ignores_is_applied_by_the_informer() {
        use crate::cache::{HashRange, ShardSelector};
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let writer = capture.clone();
        let _logs = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );

        let in_namespace = |namespace: &str| {
            let mut cm = labelled("cm", "any");
            cm.metadata.namespace = Some(namespace.into());
            cm
        };
        // "a" hashes to 0xaf63dc4c8601ec8c (shard 2 of 4), "abc" to 0xe71fa2190541574b (3).
        let objects = vec![in_namespace("a"), in_namespace("abc")];
        let requests = Arc::new(Mutex::new(Vec::new()));
        let addr = fake_apiserver(objects, requests.clone()).await;
        let client = Client::try_from(kube_client::Config::new(
            format!("http://{addr}").parse().unwrap(),
        ))
        .unwrap();
        let options = FactoryOptions {
            shard_selector: Some(
                ShardSelector::namespaces([HashRange::ring(4, 3).unwrap()]).unwrap(),
            ),
            reflector: ReflectorConfig {
                use_watch_list: false,
                ..Default::default()
            },
            ..Default::default()
        };
        let factory = SharedInformerFactory::new(client, options);
        let informer = factory.informer::<ConfigMap>();
        factory.start();
        assert!(informer.wait_for_cache_sync().await);
        assert_eq!(informer.indexer().list_keys(), ["abc/cm"]);
        crate::testing::eventually("the watch to open", Duration::from_secs(10), || async {
            (requests.lock().len() >= 2).then_some(())
        })
        .await;
        let requests = requests.lock().clone();
        assert!(
            requests.iter().all(|r| r.contains(
                "shardSelector=shardRange%28object.metadata.namespace%2C%20%270xc000000000000000%27"
            )),
            "{requests:?}"
        );
        factory.shutdown().await;
        let logs = String::from_utf8_lossy(&capture.0.lock()).to_string();
        assert_eq!(
            logs.matches("the apiserver did not filter by shardSelector")
                .count(),
            1,
            "{logs}"
        );
    }
}
