//! The queue between a reflector and an informer's processing loop: client-go's `Queue`
//! interface (`fifo.go`), which both [`DeltaFIFO`](super::DeltaFIFO) and
//! [`RealFIFO`](super::RealFIFO) implement.
//!
//! The informer only pops, asks whether the first list has been delivered, sets a
//! transform and closes; the reflector writes through [`ReflectorStore`].

use futures::future::BoxFuture;

use super::delta_fifo::{Deltas, FifoClosed, TransformFunc};
use super::store::ReflectorStore;

/// Which queue an informer uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QueueKind {
    /// [`RealFIFO`](super::RealFIFO): every event in watch order, no per-key merging.
    /// client-go 1.36's informers always use it (the `InOrderInformers` gate is GA).
    #[default]
    RealFifo,
    /// [`DeltaFIFO`](super::DeltaFIFO): a key's pending deltas are handed out together.
    DeltaFifo,
}

/// A queue an informer pops (client-go `Queue`).
pub trait InformerQueue<K>: ReflectorStore<K> {
    /// Waits for the next item and runs `process(deltas, is_in_initial_list)` on it under
    /// the queue's lock; [`FifoClosed`] once closed and drained.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is removed until the future completes.
    fn pop_with<'a>(
        &'a self,
        process: &'a mut (dyn FnMut(Deltas<K>, bool) + Send),
    ) -> BoxFuture<'a, Result<(), FifoClosed>>;

    /// True once everything the first `replace` queued has been popped (or at once if an
    /// add/update/delete came first).
    fn queue_has_synced(&self) -> bool;

    /// Sets the transform applied to objects before they are queued.
    fn set_queue_transform(&self, transform: Option<TransformFunc<K>>);

    /// Stops the queue: what is queued can still be popped.
    fn close_queue(&self);

    /// Items waiting to be popped.
    fn queued(&self) -> usize;
}
