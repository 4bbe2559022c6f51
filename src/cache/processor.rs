//! Handler fan-out: client-go's `sharedProcessor` and `processorListener` (in
//! `tools/cache/shared_informer.go`) and the handler interface (`controller.go`'s
//! `ResourceEventHandler`).
//!
//! Every handler gets its own unbounded `ListenerBuffer` and its own task, so a slow handler
//! delays only itself. client-go uses a ring buffer grown from 1024 plus two goroutines per
//! listener; here a `VecDeque` under the buffer's lock and a `Notify` do the same job.
//! The backlog (queued plus in flight) is a gauge, which client-go lacks (client-go#1326).
//!
//! Invariants (on `BufferInner`):
//! - `pending` = `queue.len()` + notifications popped but not yet marked done;
//! - `initial_pending` counts queued or in-flight adds flagged `is_in_initial_list`; a
//!   registration has synced once the informer has and this is zero.
//!
//! Differs on purpose: a handler that panics is logged and the listener keeps going (client-go
//! crashes the process by default); shutdown drops what is still queued, as client-go does.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::delta::DeletedObject;
use super::keys::KeyFunc;
use super::stored::{Codec, Stored};

/// Receives the changes an informer sees (client-go `ResourceEventHandler`). Methods run on
/// the handler's own task, one at a time, in order; keep them quick (enqueue a key).
pub trait ResourceEventHandler<K>: Send + Sync + 'static {
    /// A new object, or one first seen in the initial list (`is_in_initial_list`), or replayed
    /// to a handler added after the informer started.
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        let _ = (obj, is_in_initial_list);
    }
    /// A changed object; on a resync `old` and `new` have the same resourceVersion.
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        let _ = (old, new);
    }
    /// A deleted object, or a tombstone if the deletion itself was missed.
    fn on_delete(&self, obj: &DeletedObject<K>) {
        let _ = obj;
    }
}

type AddFn<K> = Box<dyn Fn(&Arc<K>, bool) + Send + Sync>;
type UpdateFn<K> = Box<dyn Fn(&Arc<K>, &Arc<K>) + Send + Sync>;
type DeleteFn<K> = Box<dyn Fn(&DeletedObject<K>) + Send + Sync>;

/// A handler from closures (client-go `ResourceEventHandlerFuncs`); missing ones do nothing.
pub struct ResourceEventHandlerFuncs<K> {
    add: Option<AddFn<K>>,
    update: Option<UpdateFn<K>>,
    delete: Option<DeleteFn<K>>,
}

impl<K> Default for ResourceEventHandlerFuncs<K> {
    fn default() -> Self {
        Self {
            add: None,
            update: None,
            delete: None,
        }
    }
}

impl<K> ResourceEventHandlerFuncs<K> {
    /// No callbacks yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the add callback.
    pub fn on_add(mut self, f: impl Fn(&Arc<K>, bool) + Send + Sync + 'static) -> Self {
        self.add = Some(Box::new(f));
        self
    }
    /// Sets the update callback.
    pub fn on_update(mut self, f: impl Fn(&Arc<K>, &Arc<K>) + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }
    /// Sets the delete callback.
    pub fn on_delete(mut self, f: impl Fn(&DeletedObject<K>) + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }
}

impl<K: Send + Sync + 'static> ResourceEventHandler<K> for ResourceEventHandlerFuncs<K> {
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        if let Some(f) = &self.add {
            f(obj, is_in_initial_list)
        }
    }
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        if let Some(f) = &self.update {
            f(old, new)
        }
    }
    fn on_delete(&self, obj: &DeletedObject<K>) {
        if let Some(f) = &self.delete {
            f(obj)
        }
    }
}

/// One change for one handler.
#[derive(Debug)]
pub enum Notification<K> {
    /// `on_add`.
    Add {
        /// The object.
        obj: Arc<K>,
        /// Part of the initial list (or a replay to a late handler).
        is_in_initial_list: bool,
    },
    /// `on_update`.
    Update {
        /// Before.
        old: Arc<K>,
        /// After.
        new: Arc<K>,
    },
    /// `on_delete`.
    Delete(DeletedObject<K>),
}

impl<K> Clone for Notification<K> {
    fn clone(&self) -> Self {
        match self {
            Notification::Add {
                obj,
                is_in_initial_list,
            } => Notification::Add {
                obj: obj.clone(),
                is_in_initial_list: *is_in_initial_list,
            },
            Notification::Update { old, new } => Notification::Update {
                old: old.clone(),
                new: new.clone(),
            },
            Notification::Delete(d) => Notification::Delete(d.clone()),
        }
    }
}

impl<K> Notification<K> {
    fn is_initial(&self) -> bool {
        matches!(
            self,
            Notification::Add {
                is_in_initial_list: true,
                ..
            }
        )
    }
}

/// A notification as a handler's buffer holds it.
pub(crate) enum Queued<K> {
    /// Ready to hand over.
    Ready(Notification<K>),
    /// A compact cache's add or update, decoded only when the handler's turn comes, so a
    /// handler that lags behind a 100,000-object list holds frames, not decoded objects.
    /// Each handler decodes its own copy.
    Encoded(Arc<EncodedPut<K>>),
}

/// An add (no `old`) or update as a compact cache holds its objects.
pub(crate) struct EncodedPut<K> {
    pub(crate) key: String,
    pub(crate) old: Option<Stored<K>>,
    pub(crate) new: Stored<K>,
    pub(crate) is_in_initial_list: bool,
    pub(crate) codec: Arc<Codec<K>>,
}

impl<K> Clone for Queued<K> {
    fn clone(&self) -> Self {
        match self {
            Queued::Ready(n) => Queued::Ready(n.clone()),
            Queued::Encoded(p) => Queued::Encoded(p.clone()),
        }
    }
}

impl<K> From<Notification<K>> for Queued<K> {
    fn from(n: Notification<K>) -> Self {
        Queued::Ready(n)
    }
}

impl<K> Queued<K> {
    fn is_initial(&self) -> bool {
        match self {
            Queued::Ready(n) => n.is_initial(),
            Queued::Encoded(p) => p.old.is_none() && p.is_in_initial_list,
        }
    }

    /// The notification, decoded if need be (`None`: a frame that does not decode, logged).
    fn into_notification(self) -> Option<Notification<K>> {
        let p = match self {
            Queued::Ready(n) => return Some(n),
            Queued::Encoded(p) => p,
        };
        let codec = Some(&*p.codec);
        let new = p.new.load(codec, &p.key)?;
        Some(match &p.old {
            None => Notification::Add {
                obj: new,
                is_in_initial_list: p.is_in_initial_list,
            },
            Some(old) => Notification::Update {
                old: old.load(codec, &p.key)?,
                new,
            },
        })
    }
}

/// A handler's unbounded queue.
pub(crate) struct ListenerBuffer<K> {
    inner: Mutex<BufferInner<K>>,
    ready: Notify,
    backlog: Gauge,
}

struct BufferInner<K> {
    queue: VecDeque<Queued<K>>,
    /// Queued plus in flight.
    pending: usize,
    /// Initial-list adds queued or in flight.
    initial_pending: usize,
    closed: bool,
}

impl<K> ListenerBuffer<K> {
    pub(crate) fn new(backlog: Gauge) -> Self {
        Self {
            inner: Mutex::new(BufferInner {
                queue: VecDeque::new(),
                pending: 0,
                initial_pending: 0,
                closed: false,
            }),
            ready: Notify::new(),
            backlog,
        }
    }

    pub(crate) fn push(&self, n: impl Into<Queued<K>>) {
        let n = n.into();
        let mut inner = self.inner.lock();
        if inner.closed {
            return;
        }
        if n.is_initial() {
            inner.initial_pending += 1;
        }
        inner.pending += 1;
        inner.queue.push_back(n);
        self.backlog.set(inner.pending as i64);
        drop(inner);
        self.ready.notify_one();
    }

    /// The next notification, or `None` once closed.
    async fn pop(&self) -> Option<Queued<K>> {
        loop {
            {
                let mut inner = self.inner.lock();
                if inner.closed {
                    return None;
                }
                if let Some(n) = inner.queue.pop_front() {
                    return Some(n);
                }
            }
            self.ready.notified().await;
        }
    }

    fn done(&self, was_initial: bool) {
        let mut inner = self.inner.lock();
        inner.pending = inner.pending.saturating_sub(1);
        if was_initial {
            inner.initial_pending = inner.initial_pending.saturating_sub(1);
        }
        self.backlog.set(inner.pending as i64);
    }

    pub(crate) fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.queue.clear();
        inner.pending = 0;
        self.backlog.set(0);
        drop(inner);
        // notify_one stores a permit, so a listener between its check and its wait still
        // wakes up.
        self.ready.notify_one();
    }

    pub(crate) fn initial_pending(&self) -> usize {
        self.inner.lock().initial_pending
    }

    pub(crate) fn backlog(&self) -> usize {
        self.inner.lock().pending
    }
}

/// A registered handler as the processor sees it.
pub(crate) struct Listener<K> {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) handler: Arc<dyn ResourceEventHandler<K>>,
    pub(crate) buffer: Arc<ListenerBuffer<K>>,
    /// What the handler asked for (zero = none).
    pub(crate) requested_resync: Duration,
    /// What it gets (see `determine_resync_period`).
    pub(crate) resync_period: Duration,
    pub(crate) next_resync: Instant,
    /// Due for the current resync: receives updates whose resourceVersion did not change.
    pub(crate) syncing: bool,
}

/// The minimum per-handler resync period (client-go `minimumResyncPeriod`).
pub const MINIMUM_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// client-go `determineResyncPeriod`: a handler cannot resync more often than the informer
/// checks, and not at all if the informer never does.
pub(crate) fn determine_resync_period(desired: Duration, check: Duration) -> Duration {
    if desired.is_zero() {
        return desired;
    }
    if check.is_zero() {
        tracing::warn!(
            "the informer's resync check period is 0; a handler asked to resync every {desired:?} will not resync"
        );
        return Duration::ZERO;
    }
    desired.max(check)
}

/// Sends `n` to every listener, or only to those due for a resync when `sync` is set.
pub(crate) fn distribute<K>(listeners: &[Listener<K>], n: impl Into<Queued<K>>, sync: bool) {
    let n = n.into();
    for l in listeners {
        if !sync || l.syncing {
            l.buffer.push(n.clone());
        }
    }
}

/// client-go `sharedProcessor.shouldResync`: marks the listeners whose period is up.
pub(crate) fn should_resync<K>(listeners: &mut [Listener<K>]) -> bool {
    let now = Instant::now();
    let mut any = false;
    for l in listeners {
        l.syncing = false;
        if !l.resync_period.is_zero() && now >= l.next_resync {
            l.syncing = true;
            l.next_resync = now + l.resync_period;
            any = true;
        }
    }
    any
}

#[cfg(test)]
thread_local! {
    /// Delays the start of every listener task first polled on this thread (client-go's
    /// `sharedProcessorRunHook`), for tests in which handlers start after the first
    /// notifications were distributed. Paused-time tests run their tasks on their own thread.
    pub(crate) static LISTENER_START_DELAY: std::cell::Cell<std::time::Duration> =
        const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// The listener task: hands each notification to the handler, in order, until closed.
/// `key_func` names a notification's key for [`crate::trace`] (`None`: never traced).
pub(crate) async fn run_listener<K: Send + Sync + 'static>(
    name: String,
    handler: Arc<dyn ResourceEventHandler<K>>,
    buffer: Arc<ListenerBuffer<K>>,
    key_func: Option<KeyFunc<K>>,
) {
    #[cfg(test)]
    {
        let delay = LISTENER_START_DELAY.with(|d| d.get());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    while let Some(queued) = buffer.pop().await {
        let initial = queued.is_initial();
        let Some(n) = queued.into_notification() else {
            buffer.done(initial);
            continue;
        };
        if crate::trace::on() {
            trace_delivery(&name, &n, key_func.as_ref());
        }
        let result = catch_unwind(AssertUnwindSafe(|| match &n {
            Notification::Add {
                obj,
                is_in_initial_list,
            } => handler.on_add(obj, *is_in_initial_list),
            Notification::Update { old, new } => handler.on_update(old, new),
            Notification::Delete(d) => handler.on_delete(d),
        }));
        if result.is_err() {
            tracing::error!(handler = %name, "event handler panicked; continuing with the next notification");
        }
        buffer.done(initial);
        // Let other tasks run between notifications even if the buffer is long.
        tokio::task::consume_budget().await;
    }
}

/// Records that a followed key's notification is handed to the handler `name`.
fn trace_delivery<K>(name: &str, n: &Notification<K>, key_func: Option<&KeyFunc<K>>) {
    let Some(key_func) = key_func else { return };
    let (what, key) = match n {
        Notification::Add { obj, .. } => ("on_add", key_func(&**obj)),
        Notification::Update { new, .. } => ("on_update", key_func(&**new)),
        Notification::Delete(DeletedObject::Unknown(t)) => ("on_delete", Ok(t.key.clone())),
        Notification::Delete(DeletedObject::Object(o)) => ("on_delete", key_func(&**o)),
    };
    if let Ok(key) = key {
        let kind = crate::trace::short_type_name::<K>();
        crate::trace::record(&key, crate::trace::Stage::HandlerDelivered, kind, || {
            format!("{what} of handler {name:?}")
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_buffer_keeps_order_counts_backlog_and_initial_items() {
        let gauge = Gauge::default();
        let buf = Arc::new(ListenerBuffer::<u32>::new(gauge.clone()));
        for i in 0..3 {
            buf.push(Notification::Add {
                obj: Arc::new(i),
                is_in_initial_list: i < 2,
            });
        }
        assert_eq!(gauge.get(), 3);
        assert_eq!(buf.initial_pending(), 2);
        let seen = Arc::new(Mutex::new(vec![]));
        let s = seen.clone();
        let handler: Arc<dyn ResourceEventHandler<u32>> = Arc::new(
            ResourceEventHandlerFuncs::new().on_add(move |o: &Arc<u32>, initial| {
                if **o == 1 {
                    panic!("handler bug");
                }
                s.lock().push((**o, initial));
            }),
        );
        let task = tokio::spawn(run_listener("t".into(), handler, buf.clone(), None));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The panic on 1 was contained; 2 was still delivered.
        assert_eq!(*seen.lock(), vec![(0, true), (2, false)]);
        assert_eq!(gauge.get(), 0);
        assert_eq!(buf.initial_pending(), 0);
        buf.close();
        task.await.unwrap();
    }

    // kubeloop's own, on client-go's determineResyncPeriod (TestResyncCheckPeriod covers it there)
    #[test]
    fn resync_period_is_never_below_the_check_period() {
        let s = Duration::from_secs;
        assert_eq!(determine_resync_period(s(0), s(10)), s(0));
        assert_eq!(determine_resync_period(s(5), s(10)), s(10));
        assert_eq!(determine_resync_period(s(30), s(10)), s(30));
        assert_eq!(determine_resync_period(s(30), s(0)), s(0));
    }
}
