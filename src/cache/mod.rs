//! The informer machinery: client-go's `tools/cache`.
//!
//! | kubeloop                     | client-go                                   |
//! |------------------------------|---------------------------------------------|
//! | [`store`]                    | `store.go` (keys), the reflector's `Store`  |
//! | [`index`]                    | `index.go`                                  |
//! | [`thread_safe_store`]        | `thread_safe_store.go`                      |
//! | [`labels`]                   | apimachinery `pkg/labels`                   |
//! | [`lister`]                   | `listers.go`                                |
//! | [`delta_fifo`]               | `delta_fifo.go`                             |

pub mod backoff;
pub mod delta_fifo;
pub mod factory;
#[cfg(test)]
mod fake_source;
pub mod index;
pub mod labels;
pub mod list_watch;
pub mod lister;
pub mod metrics;
pub mod processor;
pub mod reflector;
pub mod shared_informer;
pub mod store;
pub mod thread_safe_store;

pub use backoff::BackoffConfig;
pub use delta_fifo::{
    DeletedFinalStateUnknown, DeletedObject, Delta, DeltaFIFO, DeltaType, Deltas, FifoClosed,
    KnownObjects, TransformFunc,
};
pub use factory::{FactoryOptions, SharedInformerFactory};
pub use index::{IndexError, IndexFunc, Indexers, NAMESPACE_INDEX, namespace_index_func};
pub use labels::{LabelSelector, LabelSelectorError, Requirement};
pub use list_watch::{
    CacheObject, ListOptions, ListPage, ListWatch, ListWatchError, ListerWatcher, WatchOptions,
    WatchStream,
};
pub use lister::{Lister, NamespaceLister};
pub use metrics::{CacheMetrics, ReflectorMetrics};
pub use processor::{Notification, ResourceEventHandler, ResourceEventHandlerFuncs};
pub use reflector::{
    Reflector, ReflectorConfig, ReflectorError, ShouldResync, WatchErrorHandler,
    default_watch_error_handler,
};
pub use shared_informer::{
    HandlerOptions, HandlerRegistration, InformerConfig, InformerError, SharedIndexInformer,
};
pub use store::{
    KeyError, KeyFunc, ReflectorStore, StoreError, default_key_func, meta_namespace_key,
    split_meta_namespace_key,
};
pub use thread_safe_store::{Indexer, ThreadSafeStore};
