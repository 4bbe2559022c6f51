//! The informer machinery: client-go's `tools/cache`, on raw watch streams.
//!
//! Data flows apiserver -> [`Reflector`] -> [`RealFIFO`] (or [`DeltaFIFO`]) -> [`SharedIndexInformer`] ->
//! ([`ThreadSafeStore`] and every handler's buffer). Readers get an [`Indexer`] or a
//! [`Lister`] handing out `Arc<K>`; only the informer writes the cache.
//!
//! The table runs from the top layer (the factory) down; imports only run downwards.
//! `delta.rs` (the vocabulary), `keys.rs`, `store.rs` (the writer's contract and the
//! transform), `stored.rs` (how a cache holds an object) and `queue.rs` (what the informer
//! pops) are what both FIFOs build on; neither FIFO imports the other. Two choices are
//! independent, each behind its own seam: how objects arrive (`wire/`: JSON or protobuf) and
//! how the store keeps them (`stored.rs`'s codec: typed, or `compact.rs`'s frames, which only
//! `thread_safe_store.rs` names). `tests/local/layering.rs` checks that no two files import each
//! other.
//!
//! | file                   | what                                                      | client-go                                          |
//! |------------------------|-----------------------------------------------------------|----------------------------------------------------|
//! | `factory.rs`           | [`SharedInformerFactory`]                                 | `informers/factory.go`, `dynamicinformer`          |
//! | `shared_informer.rs`   | [`SharedIndexInformer`], [`InformerConfig`]               | `shared_informer.go`, `controller.go` (`processDeltas`, `processDeltasInBatch`, `processReplacedAllInfo`) |
//! | `processor.rs`         | [`ResourceEventHandler`], [`ResourceEventHandlerFuncs`]   | `sharedProcessor` / `processorListener`            |
//! | `reflector.rs`         | [`Reflector`]                                             | `reflector.go`                                     |
//! | `backoff.rs`           | [`BackoffConfig`]                                         | apimachinery `wait` backoff manager as the reflector uses it |
//! | `list_watch.rs`        | [`ListWatch`], [`ListerWatcher`]: the requests             | `listwatch.go` + the typed clients' List/Watch     |
//! | `wire/`                | LIST and watch bodies, JSON or protobuf ([`Wire`]), decoded as they arrive | the rest client's negotiated serializers, apimachinery `StreamWatcher` |
//! | `list_watch_error.rs`  | [`ListWatchError`], [`WatchStream`]                       | apimachinery `api/errors`                          |
//! | `json_scan.rs`         | where a JSON value ends, scanned once however it is cut   | apimachinery `util/framer` (JSON framing)          |
//! | `undecodable.rs`       | [`UndecodableObject`], [`MAX_OBJECT_BYTES`]: objects skipped, never fatal | `serializer/streaming` (`maxBytes`); client-go fails the list instead |
//! | `real_fifo.rs`         | [`RealFIFO`] (the informer default: atomic, batched, as 1.36) | `the_real_fifo.go`                             |
//! | `delta_fifo.rs`        | [`DeltaFIFO`]                                             | `delta_fifo.go`                                    |
//! | `queue.rs`             | [`InformerQueue`], [`Popped`], [`KnownObjects`], [`FifoClosed`] | `fifo.go` (`Queue`, `ErrFIFOClosed`), `KeyListerGetter` |
//! | `delta.rs`             | [`Delta`], [`Deltas`], [`DeletedObject`], [`DeletedFinalStateUnknown`] | the types of `delta_fifo.go`          |
//! | `lister.rs`            | [`Lister`], [`NamespaceLister`]                           | `listers.go`                                       |
//! | `thread_safe_store.rs` | [`ThreadSafeStore`], [`Indexer`]: typed or compact        | `thread_safe_store.go`                             |
//! | `stored.rs`            | [`StoreKind`]; an object as a cache holds it (decoded, or a codec's frame), a list on its way to the cache | none (client-go keeps decoded objects only) |
//! | `compact.rs`           | the compact store's codec (zstd frames of the sent protobuf or of JSON, trained dictionaries; feature `compact-store`) | none (kubernetes#141683's "bytecache" is the nearest) |
//! | `index.rs`             | [`Indexers`], [`IndexFunc`]                               | `index.go`                                         |
//! | `labels.rs`            | [`LabelSelector`]                                         | apimachinery `pkg/labels`                          |
//! | `shard_bounds.rs`      | [`ShardBounds`]: where each shard of a namespace-hash ring starts, even or balanced on the objects | none (Vitess's key ranges) |
//! | `shard_scope.rs`       | [`ShardScope`]: the shard selector of the shards a replica holds, changing as they move | none |
//! | `shard_selector.rs`    | [`ShardSelector`], [`HashRange`]: KEP-5866's `shardSelector`, and the same test here | apimachinery `pkg/sharding`, apiserver `pkg/sharding` (none in client-go) |
//! | `store.rs`             | [`ReflectorStore`], [`TransformFunc`], [`strip_managed_fields`] | the reflector's `Store` (`store.go`); controller-runtime's `TransformStripManagedFields` |
//! | `keys.rs`              | [`meta_namespace_key`], [`KeyFunc`], [`split_meta_namespace_key`] | `store.go` (keys)                              |
//! | `resourceversion.rs`   | [`compare_resource_version`]: which of two resourceVersions is newer | apimachinery `util/resourceversion` (KEP-5504) |
//! | `identity.rs`          | [`InformerName`], [`InformerIdentity`]: named informers for metrics | `identity.go` |
//! | `metrics.rs`           | [`CacheMetrics`]                                          | reflector metrics, plus a handler backlog gauge    |
//!
//! Objects may be any [`CacheObject`]: k8s-openapi types, your own CRD types,
//! `kube_client::core::DynamicObject` with an `ApiResource`, or metadata only,
//! `kube_client::core::PartialObjectMeta<K>` ([`SharedInformerFactory::metadata_informer`]:
//! the apiserver sends `PartialObjectMetadata`, see `list_watch.rs`).
//!
//! How a cache holds its objects is [`StoreKind`]: typed (client-go's, the default) or
//! compact (feature `compact-store`: each object a zstd frame of the protobuf the apiserver
//! sent, or of its JSON, about 0.6x its wire size; decoded on every read; see `compact.rs`),
//! per factory ([`FactoryOptions::store`]) or informer
//! ([`InformerConfig::store`]). Handlers, listers and indexers see the same `Arc<K>`s either
//! way, and a metadata-only informer can be compact too.
//!
//! An object that does not decode into the informer's type (a field the Rust type requires
//! and the CRD does not, say), or is over [`MAX_OBJECT_BYTES`], never stalls the informer,
//! unlike client-go, whose list fails on it for ever: it is skipped with a warning naming it
//! ([`UndecodableObject`]), counted in `kubeloop_reflector_undecodable_objects_total`, and
//! every other object is served. A version that decodes later is served as an add (or an
//! update); a version that stops decoding leaves the last one that decoded in the cache
//! (stale, and logged) until a version decodes again or the object is deleted. See
//! `undecodable.rs`.
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

mod backoff;
#[cfg(feature = "compact-store")]
mod compact;
mod consistency;
mod delta;
mod delta_fifo;
mod factory;
pub(crate) mod fake_source;
#[cfg(test)]
mod fifo_fixtures;
mod identity;
mod index;
mod json_scan;
mod keys;
mod labels;
mod list_watch;
mod list_watch_error;
mod lister;
mod metrics;
mod processor;
mod queue;
mod real_fifo;
mod reflector;
mod resourceversion;
mod shard_bounds;
mod shard_scope;
mod shard_selector;
mod shared_informer;
mod store;
mod stored;
mod thread_safe_store;
mod undecodable;
mod wire;

pub use backoff::BackoffConfig;
pub use consistency::{
    ConsistencyDetectors, Inconsistency, InconsistencyHandler, LIST_FROM_CACHE_DETECTOR_ENV,
    WATCH_LIST_DETECTOR_ENV, panic_on_inconsistency,
};
pub use delta::{DeletedFinalStateUnknown, DeletedObject, Delta, DeltaType, Deltas};
pub use delta_fifo::DeltaFIFO;
pub use factory::{
    FactoryOptions, ListSelectors, MetadataTransform, SharedInformerFactory, TweakListOptions,
};
pub use identity::{InformerIdentity, InformerName, InformerNameError};
pub use index::{
    IndexError, IndexFunc, Indexers, NAMESPACE_INDEX, namespace_index_func, namespace_indexers,
};
pub use keys::{
    KeyError, KeyFunc, default_key_func, meta_namespace_key, object_key, resource_version,
    split_meta_namespace_key,
};
pub use labels::{LabelSelector, LabelSelectorError, Requirement};
pub use list_watch::{
    CacheObject, ListOptions, ListPage, ListWatch, ListerWatcher, METADATA_LIST_ACCEPT,
    METADATA_WATCH_ACCEPT, SelectionChange, WatchOptions,
};
pub use list_watch_error::{ListWatchError, SentWatchStream, WatchStream};
// A failed answer's Status in either encoding, which `client`'s writes read too.
pub(crate) use list_watch_error::decode_status;
pub use lister::{Lister, NamespaceLister};
pub use metrics::{CacheMetrics, PROCESSING_LATENCY_BUCKETS, ReflectorMetrics};
pub use processor::{
    MINIMUM_RESYNC_PERIOD, Notification, ResourceEventHandler, ResourceEventHandlerFuncs,
};
pub use queue::{FifoClosed, InformerQueue, KnownObjects, Popped, QueueKind, ReplacedAllInfo};
pub use real_fifo::{DEFAULT_BATCH_SIZE, RealFIFO, RealFifoOptions, RealFifoOptionsError};
pub use reflector::{
    Reflector, ReflectorConfig, ReflectorError, ShouldResync, WatchErrorHandler,
    default_watch_error_handler,
};
pub use resourceversion::{
    InvalidResourceVersion, compare_resource_version, is_well_formed_resource_version,
    newest_resource_version,
};
pub use shard_bounds::{ShardBounds, ShardBoundsError};
pub use shard_scope::ShardScope;
pub use shard_selector::{HashRange, ShardKey, ShardSelector, ShardSelectorError, fnv1a_64};
pub use shared_informer::{
    HandlerOptions, HandlerRegistration, InformerConfig, InformerError, SharedIndexInformer,
};
pub use store::{ReflectorStore, StoreError, TransformFunc, strip_managed_fields};
pub use stored::{SentBytes, StoreKind};
pub use thread_safe_store::{Indexer, Replaced, StoreTransaction, ThreadSafeStore};
pub use undecodable::{MAX_OBJECT_BYTES, UndecodableObject, UndecodableReason, WatchEventType};
// An answer's encoding by its Content-Type, which `client`'s writes read too.
pub(crate) use wire::Encoding;
pub use wire::{INITIAL_EVENTS_END_ANNOTATION, ListDecodeError, Wire};
/// The fuzz targets' bodies for the LIST and watch readers (`fuzz/`; `--cfg fuzzing` only).
#[cfg(fuzzing)]
#[doc(hidden)]
pub use wire::{fuzz_json_list, fuzz_json_watch, fuzz_protobuf_list, fuzz_protobuf_watch};
