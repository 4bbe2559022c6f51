//! An in-memory apiserver for one type, for unit tests (kubeloop's and its users'): client-go
//! `tools/cache/testing/fake_controller_source.go` (`FakeControllerSource`). Re-exported as
//! [`crate::testing::FakeControllerSource`].
//!
//! Every change bumps a resourceVersion and is kept in a history, so a watch from any
//! version replays what came after it, then follows live changes. Tests can break every
//! open watch, make the next watch fail with 410, or change objects behind the watches' back
//! (as if the events were lost) to force the reflector through a relist.

use std::sync::Arc;

use futures::StreamExt;
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use tokio::sync::mpsc;

use super::list_watch::{
    CacheObject, ListOptions, ListPage, ListWatchError, ListerWatcher, WatchOptions, WatchStream,
};
use super::store::meta_namespace_key;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Resource;

/// A fake source of one type's objects (ConfigMaps unless said otherwise): every change
/// bumps the resourceVersion and reaches the open watches, unless made "silently".
#[derive(Clone)]
pub struct FakeControllerSource<K = ConfigMap> {
    inner: Arc<Mutex<Inner<K>>>,
    type_description: String,
}

struct Inner<K> {
    rv: u64,
    items: BTreeMap<String, K>,
    /// (rv, event) for every change.
    history: Vec<(u64, WatchEvent<K>)>,
    watchers: Vec<mpsc::UnboundedSender<Result<WatchEvent<K>, ListWatchError>>>,
    /// Watches from before this version answer with a 410 ERROR event.
    compacted_rv: u64,
    lists: usize,
    /// Every LIST fails with this message (client-go's `ListError`).
    list_error: Option<String>,
}

impl<K: CacheObject + Resource<DynamicType = ()>> Default for FakeControllerSource<K> {
    fn default() -> Self {
        Self::new()
    }
}

fn clone_event<K: Clone>(e: &WatchEvent<K>) -> WatchEvent<K> {
    match e {
        WatchEvent::Added(o) => WatchEvent::Added(o.clone()),
        WatchEvent::Modified(o) => WatchEvent::Modified(o.clone()),
        WatchEvent::Deleted(o) => WatchEvent::Deleted(o.clone()),
        WatchEvent::Bookmark(b) => WatchEvent::Bookmark(b.clone()),
        WatchEvent::Error(s) => WatchEvent::Error(s.clone()),
    }
}

impl<K: CacheObject + Resource<DynamicType = ()>> FakeControllerSource<K> {
    /// An empty source at resourceVersion 0.
    pub fn new() -> Self {
        FakeControllerSource {
            inner: Arc::new(Mutex::new(Inner {
                rv: 0,
                items: BTreeMap::new(),
                history: Vec::new(),
                watchers: Vec::new(),
                compacted_rv: 0,
                lists: 0,
                list_error: None,
            })),
            type_description: format!("{}/{}", K::api_version(&()), K::plural(&())),
        }
    }
}

impl<K: CacheObject> FakeControllerSource<K> {
    fn change(&self, mut obj: K, kind: &str, silently: bool) {
        let mut inner = self.inner.lock();
        inner.rv += 1;
        let rv = inner.rv;
        obj.meta_mut().resource_version = Some(rv.to_string());
        let key = meta_namespace_key(&obj).expect("test object needs a name");
        let event = match kind {
            "add" => {
                inner.items.insert(key, obj.clone());
                WatchEvent::Added(obj)
            }
            "modify" => {
                inner.items.insert(key, obj.clone());
                WatchEvent::Modified(obj)
            }
            _ => {
                inner.items.remove(&key);
                WatchEvent::Deleted(obj)
            }
        };
        if silently {
            return;
        }
        inner
            .watchers
            .retain(|w| w.send(Ok(clone_event(&event))).is_ok());
        inner.history.push((rv, event));
    }

    /// Stores `obj` at the next resourceVersion and sends ADDED to every open watch.
    pub fn add(&self, obj: K) {
        self.change(obj, "add", false)
    }
    /// Replaces `obj` at the next resourceVersion and sends MODIFIED to every open watch.
    pub fn modify(&self, obj: K) {
        self.change(obj, "modify", false)
    }
    /// Removes `obj` at the next resourceVersion and sends DELETED to every open watch.
    pub fn delete(&self, obj: K) {
        self.change(obj, "delete", false)
    }
    /// A deletion no watch will ever report (lost while disconnected).
    pub fn delete_silently(&self, obj: K) {
        self.change(obj, "delete", true)
    }
    /// Ends every open watch cleanly.
    pub fn break_watches(&self) {
        self.inner.lock().watchers.clear();
    }
    /// Ends every open watch with 410 Gone and forgets the history (a compaction): a watch
    /// from an older version gets 410 from now on.
    pub fn compact(&self) {
        let mut inner = self.inner.lock();
        inner.history.clear();
        inner.compacted_rv = inner.rv;
        for w in inner.watchers.drain(..) {
            let _ = w.send(Err(gone()));
        }
    }
    /// A change no watch will ever report (lost while disconnected).
    pub fn add_silently(&self, obj: K) {
        self.change(obj, "add", true)
    }
    /// A change no watch will ever report.
    pub fn modify_silently(&self, obj: K) {
        self.change(obj, "modify", true)
    }
    /// key -> resourceVersion of every object.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.inner
            .lock()
            .items
            .iter()
            .map(|(k, o)| {
                (
                    k.clone(),
                    o.meta().resource_version.clone().unwrap_or_default(),
                )
            })
            .collect()
    }
    /// Names of the objects held.
    pub fn names(&self) -> Vec<String> {
        self.inner
            .lock()
            .items
            .values()
            .map(|o| o.meta().name.clone().unwrap_or_default())
            .collect()
    }
    /// Makes every LIST fail with `message` (a 403), or succeed again with `None`
    /// (client-go's `ListError`).
    pub fn set_list_error(&self, message: Option<&str>) {
        self.inner.lock().list_error = message.map(str::to_string);
    }

    /// How many LISTs were served.
    pub fn list_count(&self) -> usize {
        self.inner.lock().lists
    }
}

impl<K: CacheObject> ListerWatcher<K> for FakeControllerSource<K> {
    fn list(
        &self,
        _options: &ListOptions,
    ) -> impl std::future::Future<Output = Result<ListPage<K>, ListWatchError>> + Send {
        let mut inner = self.inner.lock();
        inner.lists += 1;
        if let Some(message) = inner.list_error.clone() {
            let err = ListWatchError::Api {
                verb: "LIST",
                url: format!("(fake {})", self.type_description),
                code: 403,
                reason: "Forbidden".into(),
                message,
                causes: vec![],
                retry_after_seconds: None,
            };
            return futures::future::Either::Left(async move { Err(err) });
        }
        let page = ListPage {
            items: inner.items.values().cloned().collect(),
            resource_version: inner.rv.to_string(),
            continue_token: None,
        };
        futures::future::Either::Right(async move { Ok(page) })
    }

    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl std::future::Future<Output = Result<WatchStream<K>, ListWatchError>> + Send {
        let from: u64 = options.resource_version.parse().unwrap_or(0);
        let mut inner = self.inner.lock();
        let (tx, rx) = mpsc::unbounded_channel();
        if from < inner.compacted_rv {
            let _ = tx.send(Err(gone()));
        } else {
            for (rv, e) in &inner.history {
                if *rv > from {
                    let _ = tx.send(Ok(clone_event(e)));
                }
            }
            inner.watchers.push(tx);
        }
        let stream = tokio_stream_from(rx);
        async move { Ok(stream) }
    }

    fn type_description(&self) -> String {
        self.type_description.clone()
    }

    /// Like client-go's fake source: no `sendInitialEvents`, so reflectors LIST it.
    fn supports_watch_list(&self) -> bool {
        false
    }
}

fn tokio_stream_from<K: CacheObject>(
    mut rx: mpsc::UnboundedReceiver<Result<WatchEvent<K>, ListWatchError>>,
) -> WatchStream<K> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

fn gone() -> ListWatchError {
    ListWatchError::Api {
        verb: "WATCH",
        url: "/fake".into(),
        code: 410,
        reason: "Expired".into(),
        message: "too old resource version".into(),
        causes: vec![],
        retry_after_seconds: None,
    }
}
