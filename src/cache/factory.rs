//! One informer per type, shared: client-go `informers/factory.go`
//! (`sharedInformerFactory`) and `dynamicinformer`'s factory in one.
//!
//! `informer::<K>()` returns the same [`SharedIndexInformer`] for the same type every time
//! (typed resources keyed by Rust type, dynamic ones by group/version/plural). `start` starts
//! every informer not yet started and can be called again after adding more; `shutdown`
//! stops them all and waits for their tasks, after which `start` does nothing.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube_client::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube_client::{Client, Resource};
use parking_lot::Mutex;

use super::list_watch::{CacheObject, ListWatch};
use super::metrics::CacheMetrics;
use super::reflector::ReflectorConfig;
use super::shared_informer::{InformerConfig, SharedIndexInformer};
use super::stored::StoreKind;

/// Settings every informer of a factory gets.
#[derive(Debug, Clone, Default)]
pub struct FactoryOptions {
    /// Watch one namespace only (`None`: all namespaces). Typed cluster-scoped resources
    /// (Nodes, Namespaces, ...) ignore it, as client-go's generated informers for them take no
    /// namespace; a dynamic informer applies it as given, since [`ApiResource`] does not say
    /// whether the resource is namespaced.
    pub namespace: Option<String>,
    /// `labelSelector` for every list and watch (client-go `WithTweakListOptions`).
    pub label_selector: Option<String>,
    /// `fieldSelector` for every list and watch.
    pub field_selector: Option<String>,
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

/// A factory of shared informers.
#[derive(Clone)]
pub struct SharedInformerFactory {
    client: Client,
    options: FactoryOptions,
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
            inner: Default::default(),
        }
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
        if let Some(l) = &self.options.label_selector {
            lw = lw.labels(l);
        }
        if let Some(f) = &self.options.field_selector {
            lw = lw.fields(f);
        }
        let informer = SharedIndexInformer::new(
            lw,
            InformerConfig {
                resync_period: self.options.resync_period,
                reflector: self.options.reflector.clone(),
                metrics: self.options.metrics.clone(),
                store: self.options.store,
                ..Default::default()
            },
        );
        inner.informers.insert(key, Box::new(informer.clone()));
        informer
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube_client::core::GroupVersionKind;

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
}
