//! An in-memory apiserver for one type, for unit tests: client-go
//! `tools/cache/testing/fake_controller_source.go` (`FakeControllerSource`).
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
    ListOptions, ListPage, ListWatchError, ListerWatcher, WatchOptions, WatchStream,
};
use super::store::meta_namespace_key;
use k8s_openapi::api::core::v1::ConfigMap;

/// A fake source of ConfigMaps.
#[derive(Clone, Default)]
pub(crate) struct FakeControllerSource {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    items: BTreeMap<String, ConfigMap>,
    /// (rv, event) for every change.
    history: Vec<(u64, WatchEvent<ConfigMap>)>,
    watchers: Vec<mpsc::UnboundedSender<Result<WatchEvent<ConfigMap>, ListWatchError>>>,
    /// Watches from before this version answer with a 410 ERROR event.
    compacted_rv: u64,
    pub lists: usize,
}

fn clone_event(e: &WatchEvent<ConfigMap>) -> WatchEvent<ConfigMap> {
    match e {
        WatchEvent::Added(o) => WatchEvent::Added(o.clone()),
        WatchEvent::Modified(o) => WatchEvent::Modified(o.clone()),
        WatchEvent::Deleted(o) => WatchEvent::Deleted(o.clone()),
        WatchEvent::Bookmark(b) => WatchEvent::Bookmark(b.clone()),
        WatchEvent::Error(s) => WatchEvent::Error(s.clone()),
    }
}

impl FakeControllerSource {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn change(&self, mut obj: ConfigMap, kind: &str, silently: bool) {
        let mut inner = self.inner.lock();
        inner.rv += 1;
        let rv = inner.rv;
        obj.metadata.resource_version = Some(rv.to_string());
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

    pub(crate) fn add(&self, obj: ConfigMap) {
        self.change(obj, "add", false)
    }
    pub(crate) fn modify(&self, obj: ConfigMap) {
        self.change(obj, "modify", false)
    }
    pub(crate) fn delete(&self, obj: ConfigMap) {
        self.change(obj, "delete", false)
    }
    /// A deletion no watch will ever report (lost while disconnected).
    pub(crate) fn delete_silently(&self, obj: ConfigMap) {
        self.change(obj, "delete", true)
    }
    /// Ends every open watch cleanly.
    pub(crate) fn break_watches(&self) {
        self.inner.lock().watchers.clear();
    }
    /// Ends every open watch with 410 Gone and forgets the history (a compaction): a watch
    /// from an older version gets 410 from now on.
    pub(crate) fn compact(&self) {
        let mut inner = self.inner.lock();
        inner.history.clear();
        inner.compacted_rv = inner.rv;
        for w in inner.watchers.drain(..) {
            let _ = w.send(Err(gone()));
        }
    }
    /// A change no watch will ever report (lost while disconnected).
    pub(crate) fn add_silently(&self, obj: ConfigMap) {
        self.change(obj, "add", true)
    }
    /// A change no watch will ever report.
    pub(crate) fn modify_silently(&self, obj: ConfigMap) {
        self.change(obj, "modify", true)
    }
    /// key -> resourceVersion of every object.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, String> {
        self.inner
            .lock()
            .items
            .iter()
            .map(|(k, o)| {
                (
                    k.clone(),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect()
    }
    /// Names of the objects held.
    pub(crate) fn names(&self) -> Vec<String> {
        self.inner
            .lock()
            .items
            .values()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect()
    }
    pub(crate) fn list_count(&self) -> usize {
        self.inner.lock().lists
    }
}

impl ListerWatcher<ConfigMap> for FakeControllerSource {
    fn list(
        &self,
        _options: &ListOptions,
    ) -> impl std::future::Future<Output = Result<ListPage<ConfigMap>, ListWatchError>> + Send {
        let mut inner = self.inner.lock();
        inner.lists += 1;
        let page = ListPage {
            items: inner.items.values().cloned().collect(),
            resource_version: inner.rv.to_string(),
            continue_token: None,
        };
        async move { Ok(page) }
    }

    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl std::future::Future<Output = Result<WatchStream<ConfigMap>, ListWatchError>> + Send
    {
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
        "v1/configmaps".into()
    }
}

fn tokio_stream_from(
    mut rx: mpsc::UnboundedReceiver<Result<WatchEvent<ConfigMap>, ListWatchError>>,
) -> WatchStream<ConfigMap> {
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
    }
}
