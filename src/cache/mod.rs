//! The informer machinery: client-go's `tools/cache`, on raw watch streams.
//!
//! Data flows apiserver -> [`Reflector`] -> [`RealFIFO`] (or [`DeltaFIFO`]) -> [`SharedIndexInformer`] ->
//! ([`ThreadSafeStore`] and every handler's buffer). Readers get an [`Indexer`] or a
//! [`Lister`] handing out `Arc<K>`; only the informer writes the cache.
//!
//! | kubeloop                | client-go                                               |
//! |-------------------------|---------------------------------------------------------|
//! | [`list_watch`]          | `listwatch.go` + the typed clients' List/Watch           |
//! | [`list_decoder`]        | none: a LIST body decoded item by item as it arrives     |
//! | [`reflector`]           | `reflector.go`                                          |
//! | [`backoff`]             | apimachinery `wait` backoff manager as the reflector uses it |
//! | [`queue`]               | `fifo.go` (`Queue`): what the informer pops              |
//! | [`real_fifo`]           | `the_real_fifo.go` (the informer default: atomic, batched, as 1.36) |
//! | [`delta_fifo`]          | `delta_fifo.go`                                         |
//! | [`store`]               | `store.go` (keys) and the reflector's `Store`           |
//! | [`index`]               | `index.go`                                              |
//! | [`thread_safe_store`]   | `thread_safe_store.go`                                  |
//! | [`labels`]              | apimachinery `pkg/labels`                               |
//! | [`lister`]              | `listers.go`                                            |
//! | [`processor`]           | `sharedProcessor` / `processorListener`, `ResourceEventHandler` |
//! | [`shared_informer`]     | `shared_informer.go`, `controller.go` (`processDeltas`, `processDeltasInBatch`, `processReplacedAllInfo`) |
//! | [`factory`]             | `informers/factory.go`, `dynamicinformer`               |
//! | [`metrics`]             | reflector metrics, plus a handler backlog gauge         |
//!
//! Objects may be any [`CacheObject`]: k8s-openapi types, your own CRD types, or
//! `kube_client::core::DynamicObject` with an `ApiResource`.
//!
//! # Examples
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kubeloop::cache::{FactoryOptions, LabelSelector, ResourceEventHandlerFuncs, SharedInformerFactory};
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let factory = SharedInformerFactory::new(client, FactoryOptions::default());
//! let informer = factory.informer::<ConfigMap>();
//! informer.add_event_handler(
//!     ResourceEventHandlerFuncs::new()
//!         .on_add(|cm: &std::sync::Arc<ConfigMap>, _initial| println!("added {:?}", cm.metadata.name))
//!         .on_delete(|gone| println!("deleted {:?} (tombstone: {})", gone.object().metadata.name, gone.is_tombstone())),
//! )?;
//! factory.start();
//! factory.wait_for_cache_sync().await;
//! let web = informer.lister().namespaced("default").list(&LabelSelector::parse("app=web")?);
//! println!("{} web ConfigMaps", web.len());
//! factory.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! An informer runs until [`SharedIndexInformer::shutdown`] (or the factory's `shutdown`);
//! dropping the handles does not stop its tasks, as in client-go without a stop channel.

pub mod backoff;
pub mod delta_fifo;
pub mod factory;
pub mod fake_source;
pub mod index;
pub mod labels;
pub mod list_decoder;
pub mod list_watch;
pub mod lister;
pub mod metrics;
pub mod processor;
pub mod queue;
pub mod real_fifo;
pub mod reflector;
pub mod shared_informer;
pub mod store;
pub mod thread_safe_store;

pub use backoff::BackoffConfig;
pub use delta_fifo::{
    DeletedFinalStateUnknown, DeletedObject, Delta, DeltaFIFO, DeltaType, Deltas, FifoClosed,
    KnownObjects, TransformFunc,
};
pub(crate) use factory::ErasedInformer;
pub use factory::{FactoryOptions, SharedInformerFactory};
pub use fake_source::FakeControllerSource;
pub use index::{IndexError, IndexFunc, Indexers, NAMESPACE_INDEX, namespace_index_func};
pub use labels::{LabelSelector, LabelSelectorError, Requirement};
pub use list_watch::{
    CacheObject, ListOptions, ListPage, ListWatch, ListWatchError, ListerWatcher, WatchOptions,
    WatchStream,
};
pub use lister::{Lister, NamespaceLister};
pub use metrics::{CacheMetrics, ReflectorMetrics};
pub use processor::{Notification, ResourceEventHandler, ResourceEventHandlerFuncs};
pub use queue::{InformerQueue, Popped, QueueKind, ReplacedAllInfo};
pub use real_fifo::{DEFAULT_BATCH_SIZE, RealFIFO, RealFifoOptions, RealFifoOptionsError};
pub use reflector::{
    Reflector, ReflectorConfig, ReflectorError, ShouldResync, WatchErrorHandler,
    default_watch_error_handler,
};
pub use shared_informer::{
    HandlerOptions, HandlerRegistration, InformerConfig, InformerError, SharedIndexInformer,
};
pub use store::{
    KeyError, KeyFunc, ReflectorStore, StoreError, default_key_func, meta_namespace_key,
    resource_version, split_meta_namespace_key,
};
pub use thread_safe_store::{Indexer, StoreTransaction, ThreadSafeStore};
