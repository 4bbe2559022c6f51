//! An in-memory apiserver for one type, for unit tests (kubeloop's and its users'): client-go
//! `tools/cache/testing/fake_controller_source.go` (`FakeControllerSource`). Re-exported as
//! [`crate::testing::FakeControllerSource`].
//!
//! Every change bumps a resourceVersion and is kept in a history, so a watch from any
//! version replays what came after it, then follows live changes. Tests can break every
//! open watch, make the next watch fail with 410, or change objects behind the watches' back
//! (as if the events were lost) to force the reflector through a relist. An object can be
//! stored as one that does not decode (`add_undecodable`, `modify_undecodable`): lists
//! report it in [`ListPage::undecodable`] and watches send
//! [`ListWatchError::Undecodable`], as [`ListWatch`](super::ListWatch) does for an object
//! the type cannot decode.

use std::sync::Arc;

use futures::StreamExt;
use kube_client::core::WatchEvent;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use tokio::sync::mpsc;

use super::keys::meta_namespace_key;
use super::list_watch::{CacheObject, ListOptions, ListPage, ListerWatcher, WatchOptions};
use super::list_watch_error::{ListWatchError, WatchStream};
use super::undecodable::{UndecodableObject, UndecodableReason, WatchEventType};
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
    /// The objects whose current version decodes.
    items: BTreeMap<String, K>,
    /// The objects whose current version does not decode (never in `items` too).
    undecodable: BTreeMap<String, UndecodableObject>,
    /// (rv, event) for every change; `Err` for an event whose object does not decode.
    history: Vec<(u64, FakeEvent<K>)>,
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

/// A recorded event: `Err` names an object that does not decode.
type FakeEvent<K> = Result<WatchEvent<K>, UndecodableObject>;

fn replay<K: Clone>(e: &FakeEvent<K>) -> Result<WatchEvent<K>, ListWatchError> {
    match e {
        Ok(e) => Ok(clone_event(e)),
        Err(skip) => Err(ListWatchError::Undecodable {
            verb: "WATCH",
            url: "(fake watch)".into(),
            object: Box::new(skip.clone()),
        }),
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
                undecodable: BTreeMap::new(),
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
        let was_undecodable = inner.undecodable.remove(&key).is_some();
        let (namespace, name) = (
            obj.meta().namespace.clone().unwrap_or_default(),
            obj.meta().name.clone().unwrap_or_default(),
        );
        let undecodable = |event| UndecodableObject {
            namespace,
            name,
            resource_version: rv.to_string(),
            event: Some(event),
            reason: UndecodableReason::Decode("(fake) this version does not decode".into()),
        };
        let event: FakeEvent<K> = match kind {
            "add" => {
                inner.items.insert(key, obj.clone());
                Ok(WatchEvent::Added(obj))
            }
            "modify" => {
                inner.items.insert(key, obj.clone());
                Ok(WatchEvent::Modified(obj))
            }
            "add undecodable" | "modify undecodable" => {
                let event = if kind == "add undecodable" {
                    WatchEventType::Added
                } else {
                    WatchEventType::Modified
                };
                let skip = undecodable(event);
                inner.items.remove(&key);
                inner.undecodable.insert(key, skip.clone());
                Err(skip)
            }
            _ if was_undecodable => Err(undecodable(WatchEventType::Deleted)),
            _ => {
                inner.items.remove(&key);
                Ok(WatchEvent::Deleted(obj))
            }
        };
        if silently {
            return;
        }
        inner.watchers.retain(|w| w.send(replay(&event)).is_ok());
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
    /// Stores `obj` at the next resourceVersion as an object that does not decode: lists
    /// report it as undecodable, watches send an undecodable ADDED.
    pub fn add_undecodable(&self, obj: K) {
        self.change(obj, "add undecodable", false)
    }
    /// Replaces `obj` at the next resourceVersion with a version that does not decode
    /// (undecodable MODIFIED). A later `modify` makes it decode again; `delete` sends an
    /// undecodable DELETED.
    pub fn modify_undecodable(&self, obj: K) {
        self.change(obj, "modify undecodable", false)
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
    /// key -> resourceVersion of every object whose current version decodes.
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
            undecodable: inner
                .undecodable
                .values()
                .map(|skip| UndecodableObject {
                    event: None,
                    ..skip.clone()
                })
                .collect(),
            shard_info: None,
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
                    let _ = tx.send(replay(e));
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
