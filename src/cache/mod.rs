//! The informer machinery: client-go's `tools/cache`.
//!
//! Filled in by the cache issue: Reflector (ListAndWatch), DeltaFIFO, ThreadSafeStore and
//! Indexer, Listers, SharedIndexInformer and its factory.
