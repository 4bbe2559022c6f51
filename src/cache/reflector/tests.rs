use super::*;
use crate::cache::list_watch::ListPage;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;
use kube_client::core::watch::{Bookmark, BookmarkMeta};
use kube_client::core::{Status, TypeMeta};
use parking_lot::Mutex;
use std::collections::VecDeque;

use crate::cache::{HashRange, ShardSelector};

fn cm(name: &str, rv: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn api_err(code: u16, reason: &str) -> ListWatchError {
    ListWatchError::Api {
        verb: "LIST",
        url: "/fake".into(),
        code,
        reason: reason.into(),
        message: format!("fake {code}"),
        causes: vec![],
        retry_after_seconds: None,
    }
}

fn bookmark(rv: &str, end: bool) -> WatchEvent<ConfigMap> {
    let mut annotations = std::collections::BTreeMap::new();
    if end {
        annotations.insert(
            INITIAL_EVENTS_END_ANNOTATION.to_string(),
            "true".to_string(),
        );
    }
    WatchEvent::Bookmark(Bookmark {
        types: TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        },
        metadata: BookmarkMeta {
            resource_version: rv.into(),
            annotations,
        },
    })
}

fn status_event(code: u16, reason: &str) -> WatchEvent<ConfigMap> {
    let mut s = Status::failure("fake", reason);
    s.code = code;
    WatchEvent::Error(Box::new(s))
}

/// A scripted watch: its events, then either the end of the stream or silence.
struct ScriptedWatch {
    events: Vec<Result<WatchEvent<ConfigMap>, ListWatchError>>,
    then_hang: bool,
    /// Delay before each event.
    pace: Duration,
}

#[derive(Default)]
struct Script {
    lists: VecDeque<Result<ListPage<ConfigMap>, ListWatchError>>,
    watches: VecDeque<Result<ScriptedWatch, ListWatchError>>,
    /// What was asked, with the (paused) time since the start.
    calls: Vec<(Duration, String)>,
    /// `timeoutSeconds` of every watch opened.
    watch_timeouts: Vec<Option<u32>>,
    /// `resourceVersionMatch` of every list asked.
    list_matches: Vec<Option<String>>,
    /// Answers to `selection_changed` (a shard scope's change), one per call; none left:
    /// unchanged.
    changed: VecDeque<bool>,
    /// Answers to `prepare_selection_change`, one per call; none left: `None`.
    prepared: VecDeque<SelectionChange>,
}

#[derive(Clone)]
struct FakeLw {
    script: Arc<Mutex<Script>>,
    start: Instant,
}

impl FakeLw {
    fn new() -> Self {
        Self {
            script: Default::default(),
            start: Instant::now(),
        }
    }
    fn list_ok(&self, items: Vec<ConfigMap>, rv: &str, cont: Option<&str>) -> &Self {
        self.script.lock().lists.push_back(Ok(ListPage {
            items,
            resource_version: rv.into(),
            continue_token: cont.map(String::from),
            undecodable: vec![],
            shard_info: None,
        }));
        self
    }
    fn list_with_undecodable(
        &self,
        items: Vec<ConfigMap>,
        undecodable: Vec<UndecodableObject>,
        rv: &str,
    ) -> &Self {
        self.script.lock().lists.push_back(Ok(ListPage {
            items,
            resource_version: rv.into(),
            continue_token: None,
            undecodable,
            shard_info: None,
        }));
        self
    }
    fn list_err(&self, e: ListWatchError) -> &Self {
        self.script.lock().lists.push_back(Err(e));
        self
    }
    fn watch(&self, events: Vec<WatchEvent<ConfigMap>>, then_hang: bool) -> &Self {
        self.script.lock().watches.push_back(Ok(ScriptedWatch {
            events: events.into_iter().map(Ok).collect(),
            then_hang,
            pace: Duration::from_millis(10),
        }));
        self
    }
    fn watch_raw(&self, w: Result<ScriptedWatch, ListWatchError>) -> &Self {
        self.script.lock().watches.push_back(w);
        self
    }
    /// Before the first watch, the selection is unchanged; when it ends, it changed, and
    /// the store can follow with `change`.
    fn selection_changes(&self, change: SelectionChange) -> &Self {
        let mut s = self.script.lock();
        s.changed.extend([false, true]);
        s.prepared.push_back(change);
        drop(s);
        self
    }
    fn calls(&self) -> Vec<(Duration, String)> {
        self.script.lock().calls.clone()
    }
    fn call_names(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.1).collect()
    }
}

impl ListerWatcher<ConfigMap> for FakeLw {
    fn list(
        &self,
        o: &ListOptions,
    ) -> impl std::future::Future<Output = Result<ListPage<ConfigMap>, ListWatchError>> + Send {
        let mut s = self.script.lock();
        let desc = format!(
            "list rv={:?} limit={:?} continue={:?}",
            o.resource_version, o.limit, o.continue_token
        );
        s.calls.push((self.start.elapsed(), desc));
        s.list_matches.push(o.resource_version_match.clone());
        // An exhausted script fails, which the reflector retries after backoff.
        let r = s
            .lists
            .pop_front()
            .unwrap_or_else(|| Err(api_err(500, "Script")));
        async move { r }
    }

    fn watch(
        &self,
        o: &WatchOptions,
    ) -> impl std::future::Future<Output = Result<WatchStream<ConfigMap>, ListWatchError>> + Send
    {
        let mut s = self.script.lock();
        let desc = format!(
            "watch rv={:?} bookmarks={} initial={} timeout_ok={}",
            o.resource_version,
            o.allow_watch_bookmarks,
            o.send_initial_events,
            o.timeout_seconds.is_some_and(|t| (300..600).contains(&t))
        );
        s.calls.push((self.start.elapsed(), desc));
        s.watch_timeouts.push(o.timeout_seconds);
        let w = s.watches.pop_front().unwrap_or(Ok(ScriptedWatch {
            events: vec![],
            then_hang: true,
            pace: Duration::ZERO,
        }));
        async move {
            let w = w?;
            let pace = w.pace;
            let events = futures::stream::iter(w.events).then(move |e| async move {
                tokio::time::sleep(pace).await;
                e
            });
            let stream: WatchStream<ConfigMap> = if w.then_hang {
                events.chain(futures::stream::pending()).boxed()
            } else {
                events.boxed()
            };
            Ok(stream)
        }
    }

    fn type_description(&self) -> String {
        "v1/configmaps".into()
    }

    fn selection_changed(&self) -> bool {
        self.script.lock().changed.pop_front().unwrap_or(false)
    }

    fn prepare_selection_change(&self) -> Option<SelectionChange> {
        self.script.lock().prepared.pop_front()
    }
}

/// Records what the reflector wrote.
#[derive(Default)]
struct RecStore {
    ops: Mutex<Vec<String>>,
    /// `release` answers false (a queue that is not atomic).
    cannot_release: bool,
}

impl ReflectorStore<ConfigMap> for RecStore {
    fn add(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.ops
            .lock()
            .push(format!("add {}", o.metadata.name.unwrap()));
        Ok(())
    }
    fn update(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.ops
            .lock()
            .push(format!("update {}", o.metadata.name.unwrap()));
        Ok(())
    }
    fn delete(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.ops
            .lock()
            .push(format!("delete {}", o.metadata.name.unwrap()));
        Ok(())
    }
    fn replace(&self, list: Vec<ConfigMap>, rv: &str) -> Result<(), StoreError> {
        let mut names: Vec<String> = list.into_iter().map(|o| o.metadata.name.unwrap()).collect();
        names.sort();
        self.ops
            .lock()
            .push(format!("replace [{}] @{rv}", names.join(",")));
        Ok(())
    }
    fn replace_listed(
        &self,
        list: ListedObjects<ConfigMap>,
        undecodable: Vec<String>,
        rv: &str,
    ) -> Result<(), StoreError> {
        let list = list
            .into_decoded()
            .into_iter()
            .map(|o| (*o).clone())
            .collect();
        if undecodable.is_empty() {
            return self.replace(list, rv);
        }
        self.replace(list, &format!("{rv} keeping [{}]", undecodable.join(",")))
    }
    fn delete_undecodable(&self, key: &str) -> Result<(), StoreError> {
        self.ops.lock().push(format!("delete undecodable {key}"));
        Ok(())
    }
    fn release(&self, selector: &ShardSelector) -> Result<bool, StoreError> {
        self.ops.lock().push(format!("release {selector}"));
        Ok(!self.cannot_release)
    }
    fn resync(&self) -> Result<(), StoreError> {
        self.ops.lock().push("resync".into());
        Ok(())
    }
}

/// The paged-LIST reflector most tests here script (streaming list tests turn it on).
fn no_jitter() -> ReflectorConfig {
    ReflectorConfig {
        backoff: BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        },
        use_watch_list: false,
        ..Default::default()
    }
}

/// Runs a reflector for `secs` of paused time and returns what the store saw.
async fn run_for(
    lw: &FakeLw,
    config: ReflectorConfig,
    secs: u64,
    errors: Option<Arc<Mutex<Vec<String>>>>,
) -> (Vec<String>, ReflectorMetrics) {
    run_into(RecStore::default(), lw, config, secs, errors).await
}

/// [`run_for`] into `store`.
async fn run_into(
    store: RecStore,
    lw: &FakeLw,
    config: ReflectorConfig,
    secs: u64,
    errors: Option<Arc<Mutex<Vec<String>>>>,
) -> (Vec<String>, ReflectorMetrics) {
    let store = Arc::new(store);
    let mut r = Reflector::new(lw.clone(), store.clone(), config);
    if let Some(errs) = errors {
        r = r.with_watch_error_handler(Arc::new(move |e: &ReflectorError| {
            errs.lock().push(e.to_string())
        }));
    }
    let metrics = r.metrics();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    cancel.cancel();
    task.await.unwrap();
    let ops = store.ops.lock().clone();
    (ops, metrics)
}

// client-go: TestReflectorListAndWatch (list at "0", then watch from the list's RV)
#[tokio::test(start_paused = true)]
async fn lists_all_pages_then_watches_from_the_list_version() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5"), cm("b", "6")], "10", Some("tok1"))
        .list_ok(vec![cm("c", "7")], "10", None)
        .watch(
            vec![
                WatchEvent::Added(cm("d", "11")),
                WatchEvent::Modified(cm("a", "12")),
                WatchEvent::Deleted(cm("b", "13")),
                bookmark("20", false),
            ],
            false,
        );
    let (ops, m) = run_for(&lw, no_jitter(), 5, None).await;
    assert_eq!(
        &ops[..4],
        ["replace [a,b,c] @10", "add d", "update a", "delete b"]
    );
    let calls = lw.call_names();
    assert_eq!(
        calls[0],
        r#"list rv=Some("0") limit=Some(500) continue=None"#
    );
    assert_eq!(
        calls[1],
        r#"list rv=None limit=Some(500) continue=Some("tok1")"#
    );
    assert_eq!(
        calls[2],
        r#"watch rv="10" bookmarks=true initial=false timeout_ok=true"#
    );
    // The clean close re-watches from the bookmark's version, without a relist.
    assert_eq!(
        calls[3],
        r#"watch rv="20" bookmarks=true initial=false timeout_ok=true"#
    );
    assert_eq!(m.lists(), 1);
    assert_eq!(m.relists(), 0);
    assert_eq!(m.watch_events(), 4);
    assert_eq!(m.last_resource_version(), 20);
}

// client-go: TestReflectorListAndWatchWithErrors / "410 on list -> RV \"\""
#[tokio::test(start_paused = true)]
async fn list_gone_retries_at_once_with_empty_resource_version() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![status_event(410, "Expired")], true)
        // Relist at the last seen version: gone too.
        .list_err(api_err(410, "Expired"))
        .list_ok(vec![cm("b", "30")], "30", None)
        .watch(vec![], true);
    let errs = Arc::new(Mutex::new(vec![]));
    let (ops, m) = run_for(&lw, no_jitter(), 10, Some(errs.clone())).await;
    assert_eq!(ops, ["replace [a] @10", "replace [b] @30"]);
    let calls = lw.calls();
    let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        names[1],
        r#"watch rv="10" bookmarks=true initial=false timeout_ok=true"#
    );
    // Relist after the watch's 410 is at the last seen version, not "" ...
    assert_eq!(names[2], r#"list rv=Some("10") limit=None continue=None"#);
    // ... and its 410 is retried at once as a quorum read.
    assert_eq!(names[3], r#"list rv=None limit=Some(500) continue=None"#);
    assert_eq!(calls[3].0, calls[2].0, "retried without waiting");
    assert_eq!(
        names[4],
        r#"watch rv="30" bookmarks=true initial=false timeout_ok=true"#
    );
    // The relist after a watch failure waited for the backoff.
    assert!(calls[2].0 - calls[1].0 >= Duration::from_millis(800));
    assert_eq!(m.relists(), 1);
    assert!(errs.lock()[0].contains("410"), "{:?}", errs.lock());
}

// The kube-rs bug this reflector must not have: a LIST that keeps failing backs off more
// and more, up to the cap.
#[tokio::test(start_paused = true)]
async fn failing_list_backs_off_up_to_the_cap() {
    let lw = FakeLw::new();
    for _ in 0..12 {
        lw.list_err(api_err(403, "Forbidden"));
    }
    let (_, m) = run_for(&lw, no_jitter(), 200, None).await;
    let times: Vec<Duration> = lw.calls().iter().map(|c| c.0).collect();
    let gaps: Vec<u128> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(
        &gaps[..8],
        [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
    );
    assert_eq!(m.list_errors() as usize, times.len());
}

// kubeloop's own: a clean watch close re-watches
#[tokio::test(start_paused = true)]
async fn short_watch_relists_but_a_normal_close_rewatches() {
    let lw = FakeLw::new();
    lw.list_ok(vec![], "10", None)
        // Closes at once with nothing: very short watch -> relist.
        .watch(vec![], false)
        .list_ok(vec![cm("a", "11")], "11", None)
        // Delivers an event, then closes: re-watch from its version.
        .watch(vec![WatchEvent::Added(cm("b", "12"))], false)
        .watch(vec![], true);
    let errs = Arc::new(Mutex::new(vec![]));
    let (ops, _) = run_for(&lw, no_jitter(), 10, Some(errs.clone())).await;
    assert_eq!(ops, ["replace [] @10", "replace [a] @11", "add b"]);
    let names = lw.call_names();
    assert!(names[2].starts_with(r#"list rv=Some("10")"#), "{names:?}");
    assert!(names[4].starts_with(r#"watch rv="12""#), "{names:?}");
    assert_eq!(names.len(), 5);
    assert!(errs.lock()[0].contains("very short watch"));
}

#[tokio::test(start_paused = true)]
async fn watch_open_refused_or_429_backs_off_and_rewatches_without_relisting() {
    let lw = FakeLw::new();
    let refused = ListWatchError::Transport {
        verb: "WATCH",
        url: "/fake".into(),
        source: kube_client::Error::ReadEvents(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )),
    };
    assert!(refused.is_connection_refused());
    lw.list_ok(vec![], "10", None)
        .watch_raw(Err(refused))
        .watch_raw(Err(api_err(429, "TooManyRequests")))
        .watch(vec![], true);
    let (_, m) = run_for(&lw, no_jitter(), 10, None).await;
    let calls = lw.calls();
    let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[1..].iter().all(|n| n.starts_with(r#"watch rv="10""#)));
    assert_eq!((calls[2].0 - calls[1].0).as_millis(), 800);
    assert_eq!((calls[3].0 - calls[2].0).as_millis(), 1600);
    assert_eq!(m.lists(), 1);
    assert_eq!(m.watches(), 3);
}

fn throttled(retry_after_secs: u32) -> ListWatchError {
    ListWatchError::Api {
        verb: "WATCH",
        url: "/fake".into(),
        code: 429,
        reason: "TooManyRequests".into(),
        message: "Too many requests, please try again later.".into(),
        causes: vec![],
        retry_after_seconds: Some(retry_after_secs),
    }
}

// client-go honours Retry-After in its rest client (rest/with_retry.go); here the
// reflector's own backoff waits max(backoff, Retry-After), see `Core::back_off`.
#[tokio::test(start_paused = true)]
async fn a_watch_answered_429_with_retry_after_waits_at_least_that_long() {
    let lw = FakeLw::new();
    lw.list_ok(vec![], "10", None)
        // Asks for 5 s: more than the 800 ms backoff, so 5 s it is.
        .watch_raw(Err(throttled(5)))
        // Asks for 1 s: less than the 1.6 s backoff, so the backoff wins.
        .watch_raw(Err(throttled(1)))
        .watch(vec![], true);
    let (_, m) = run_for(&lw, no_jitter(), 20, None).await;
    let calls = lw.calls();
    let names: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[1..].iter().all(|n| n.starts_with(r#"watch rv="10""#)));
    assert_eq!((calls[2].0 - calls[1].0).as_millis(), 5000);
    assert_eq!((calls[3].0 - calls[2].0).as_millis(), 1600);
    assert_eq!((m.lists(), m.relists()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_list_answered_429_with_retry_after_waits_at_least_that_long() {
    let lw = FakeLw::new();
    let mut err = throttled(3);
    if let ListWatchError::Api { verb, .. } = &mut err {
        *verb = "LIST";
    }
    lw.list_err(err)
        .list_ok(vec![cm("a", "1")], "10", None)
        .watch(vec![], true);
    let (ops, _) = run_for(&lw, no_jitter(), 10, None).await;
    assert_eq!(ops, ["replace [a] @10"]);
    let calls = lw.calls();
    assert!(calls[1].1.starts_with("list"), "{calls:?}");
    assert_eq!((calls[1].0 - calls[0].0).as_millis(), 3000);
}

// client-go: TestReflectorListExtract's paginatedResult rule ("relists at a version are
// paginated only if the server paginated the list at \"0\"")
#[tokio::test(start_paused = true)]
async fn relists_stay_paginated_when_the_server_paginated_the_first_list() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "1")], "10", Some("tok"))
        .list_ok(vec![cm("b", "2")], "10", None)
        .watch(vec![status_event(410, "Expired")], true)
        .list_ok(vec![cm("a", "1")], "11", None)
        .watch(vec![], true);
    let store = Arc::new(RecStore::default());
    let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
    let rv = r.last_sync_resource_version();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*rv.read(), "11");
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(
        lw.call_names()[3],
        r#"list rv=Some("10") limit=Some(500) continue=None"#
    );
}

// client-go: TestReflectorFullListIfTooLarge
#[tokio::test(start_paused = true)]
async fn too_large_resource_version_on_list_retries_with_empty_version() {
    let lw = FakeLw::new();
    lw.list_err(ListWatchError::Api {
        verb: "LIST",
        url: "/fake".into(),
        code: 504,
        reason: "Timeout".into(),
        message: "Too large resource version: 20, current: 10".into(),
        causes: vec!["ResourceVersionTooLarge".into()],
        retry_after_seconds: None,
    })
    .list_ok(vec![cm("a", "1")], "10", None)
    .watch(vec![], true);
    let (ops, _) = run_for(&lw, no_jitter(), 2, None).await;
    assert_eq!(ops, ["replace [a] @10"]);
    let names = lw.call_names();
    assert_eq!(
        names[0],
        r#"list rv=Some("0") limit=Some(500) continue=None"#
    );
    assert_eq!(names[1], r#"list rv=None limit=Some(500) continue=None"#);
}

#[tokio::test(start_paused = true)]
async fn continue_token_expired_restarts_as_one_full_list() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "1")], "10", Some("tok"))
        .list_err(api_err(410, "Expired"))
        .list_ok(vec![cm("a", "1"), cm("b", "2")], "15", None)
        .watch(vec![], true);
    let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
    assert_eq!(ops, ["replace [a,b] @15"]);
    assert_eq!(
        lw.call_names()[2],
        r#"list rv=Some("0") limit=None continue=None"#
    );
}

// kubeloop's own, after client-go's streamwatcher.go: a watch line that is not an event (a
// broken stream, unlike an event whose object does not decode) ends the watch, and the
// reflector relists instead of silently missing a change.
#[tokio::test(start_paused = true)]
async fn a_line_that_is_not_an_event_ends_the_watch_and_relists() {
    let lw = FakeLw::new();
    let bad = serde_json::from_str::<ConfigMap>("{\"kind\":\"Pod\"}").unwrap_err();
    lw.list_ok(vec![], "10", None).watch_raw(Ok(ScriptedWatch {
        events: vec![
            Err(ListWatchError::Decode {
                verb: "WATCH",
                url: "/fake".into(),
                source: bad.into(),
            }),
            Ok(WatchEvent::Added(cm("a", "11"))),
        ],
        then_hang: true,
        pace: Duration::from_millis(1),
    }));
    lw.list_ok(vec![cm("a", "11")], "12", None)
        .watch(vec![], true);
    let errs = Arc::new(Mutex::new(vec![]));
    let (ops, m) = run_for(&lw, no_jitter(), 5, Some(errs.clone())).await;
    assert_eq!(ops, ["replace [] @10", "replace [a] @12"]);
    let calls = lw.call_names();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(calls[2].starts_with(r#"list rv=Some("10")"#), "{calls:?}");
    assert_eq!(m.relists(), 1);
    assert!(errs.lock()[0].contains("decode"), "{:?}", errs.lock());
}

#[tokio::test(start_paused = true)]
async fn resync_runs_every_period_when_allowed() {
    let lw = FakeLw::new();
    lw.list_ok(vec![], "1", None).watch(vec![], true);
    let store = Arc::new(RecStore::default());
    let allowed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let a = allowed.clone();
    let r = Reflector::new(
        lw.clone(),
        store.clone(),
        ReflectorConfig {
            resync_period: Duration::from_secs(10),
            ..no_jitter()
        },
    )
    .with_should_resync(Arc::new(move || {
        a.load(std::sync::atomic::Ordering::SeqCst)
    }));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(25)).await;
    allowed.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    cancel.cancel();
    task.await.unwrap();
    let resyncs = store.ops.lock().iter().filter(|o| *o == "resync").count();
    assert_eq!(resyncs, 2);
}

#[tokio::test(start_paused = true)]
async fn watch_list_collects_until_the_end_bookmark_then_keeps_watching() {
    let lw = FakeLw::new();
    lw.watch(
        vec![
            WatchEvent::Added(cm("a", "5")),
            WatchEvent::Added(cm("b", "6")),
            bookmark("8", false),
            WatchEvent::Deleted(cm("b", "7")),
            bookmark("9", true),
            WatchEvent::Added(cm("c", "10")),
        ],
        true,
    );
    let config = ReflectorConfig {
        use_watch_list: true,
        ..no_jitter()
    };
    let (ops, m) = run_for(&lw, config, 5, None).await;
    assert_eq!(ops, ["replace [a] @9", "add c"]);
    assert_eq!(
        lw.call_names(),
        [r#"watch rv="" bookmarks=true initial=true timeout_ok=true"#]
    );
    assert_eq!(m.last_resource_version(), 10);
}

#[tokio::test(start_paused = true)]
async fn watch_list_that_stalls_falls_back_to_a_paged_list() {
    let lw = FakeLw::new();
    // Initial events, but never the end bookmark (kubernetes#140890).
    lw.watch(vec![WatchEvent::Added(cm("a", "5"))], true)
        .list_ok(vec![cm("a", "5")], "7", None)
        .watch(vec![], true);
    let config = ReflectorConfig {
        use_watch_list: true,
        watch_list_timeout: Duration::from_secs(3),
        ..no_jitter()
    };
    let errs = Arc::new(Mutex::new(vec![]));
    let (ops, m) = run_for(&lw, config, 10, Some(errs.clone())).await;
    assert_eq!(ops, ["replace [a] @7"]);
    assert_eq!(m.lists(), 1, "the fallback is part of the same list round");
    let calls = lw.calls();
    assert!(
        calls[1]
            .1
            .starts_with(r#"list rv=Some("0") limit=Some(500)"#)
    );
    // The bound runs from the last event (at 10 ms), not from the start.
    assert_eq!(calls[1].0, Duration::from_millis(3010));
    assert!(errs.lock()[0].contains("falling back"), "{:?}", errs.lock());
}

// kubeloop's own: the bound is on lack of progress, so a slow but steady stream (an
// event every 2 s for 20 s, bound 3 s) is read to its end bookmark without a fallback.
#[tokio::test(start_paused = true)]
async fn watch_list_that_keeps_delivering_is_not_cut_off() {
    let lw = FakeLw::new();
    let mut events: Vec<_> = (0..10)
        .map(|i| {
            Ok(WatchEvent::Added(cm(
                &format!("o{i}"),
                &(i + 1).to_string(),
            )))
        })
        .collect();
    events.push(Ok(bookmark("20", true)));
    lw.watch_raw(Ok(ScriptedWatch {
        events,
        then_hang: true,
        pace: Duration::from_secs(2),
    }));
    let config = ReflectorConfig {
        use_watch_list: true,
        watch_list_timeout: Duration::from_secs(3),
        ..no_jitter()
    };
    let errs = Arc::new(Mutex::new(vec![]));
    let (ops, m) = run_for(&lw, config, 30, Some(errs.clone())).await;
    assert_eq!(ops, ["replace [o0,o1,o2,o3,o4,o5,o6,o7,o8,o9] @20"]);
    assert_eq!(lw.call_names().len(), 1, "no fallback LIST");
    assert!(errs.lock().is_empty(), "{:?}", errs.lock());
    assert_eq!(m.lists(), 1);
}

fn pods(n: usize) -> Vec<ConfigMap> {
    (0..n)
        .map(|i| cm(&format!("pod-{i}"), &i.to_string()))
        .collect()
}

fn list_rvs(lw: &FakeLw) -> Vec<String> {
    lw.call_names()
        .into_iter()
        .filter_map(|c| {
            let rv = c.strip_prefix("list rv=")?.split(' ').next()?.to_string();
            Some(rv)
        })
        .collect()
}

// client-go: TestReflectorResyncWithResourceVersion
#[tokio::test(start_paused = true)]
async fn reflector_resync_with_resource_version() {
    let lw = FakeLw::new();
    // The watch fails, so the reflector lists again, at the version it synced.
    lw.list_ok(pods(4), "10", None)
        .watch(vec![status_event(500, "InternalError")], true)
        .list_ok(pods(8), "11", None)
        .watch(vec![], true);
    let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
    assert_eq!(
        ops,
        [
            "replace [pod-0,pod-1,pod-2,pod-3] @10",
            "replace [pod-0,pod-1,pod-2,pod-3,pod-4,pod-5,pod-6,pod-7] @11"
        ]
    );
    assert_eq!(list_rvs(&lw), [r#"Some("0")"#, r#"Some("10")"#]);
}

// client-go: TestReflectorExpiredExactResourceVersion
#[tokio::test(start_paused = true)]
async fn reflector_expired_exact_resource_version() {
    let lw = FakeLw::new();
    lw.list_ok(pods(4), "10", None)
        .watch(vec![status_event(500, "InternalError")], true)
        .list_err(api_err(410, "Expired"))
        .list_ok(pods(8), "11", None)
        .watch(vec![], true);
    let (ops, _) = run_for(&lw, no_jitter(), 3, None).await;
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(ops[1].ends_with("@11"), "{ops:?}");
    assert_eq!(list_rvs(&lw), [r#"Some("0")"#, r#"Some("10")"#, "None"]);
}

// client-go: TestWatchTimeout
#[tokio::test(start_paused = true)]
async fn watch_timeout() {
    let cases = [
        (
            "no timeout",
            ReflectorConfig::default().min_watch_timeout,
            300,
        ),
        ("small timeout not honored", Duration::from_secs(1), 300),
        ("30m timeout", Duration::from_secs(30 * 60), 30 * 60),
    ];
    for (name, min_watch_timeout, want_min) in cases {
        let lw = FakeLw::new();
        lw.list_ok(vec![], "10", None).watch(vec![], true);
        let config = ReflectorConfig {
            min_watch_timeout,
            ..no_jitter()
        };
        run_for(&lw, config, 1, None).await;
        let got = lw.script.lock().watch_timeouts.clone();
        let t = got[0].expect("timeoutSeconds set");
        assert!(
            (want_min..=2 * want_min).contains(&t),
            "{name}: {t} not in [{want_min}, {}]",
            2 * want_min
        );
    }
}

// client-go: TestRetryInternalError ("retries off", client-go's default: kubeloop has
// no MaxInternalErrorRetryDuration): an internal error on the watch ends it and the
// reflector lists again instead of re-opening the watch.
#[tokio::test(start_paused = true)]
async fn retry_internal_error() {
    let lw = FakeLw::new();
    lw.list_ok(vec![], "1", None)
        .watch(vec![status_event(500, "InternalError")], true)
        .list_ok(vec![], "1", None)
        .watch(vec![], true);
    let (_, m) = run_for(&lw, no_jitter(), 3, None).await;
    let calls = lw.call_names();
    assert!(calls[0].starts_with("list") && calls[1].starts_with("watch"));
    assert!(calls[2].starts_with("list"), "{calls:?}");
    assert_eq!(m.relists(), 1);
}

// client-go: TestReflectorWatchHandler (the wrong-kind event is left out: a typed
// kubeloop watch cannot decode one, and an undecodable event ends the watch).
#[tokio::test(start_paused = true)]
async fn reflector_watch_handler() {
    let store = Arc::new(ThreadSafeStoreAsReflectorStore::default());
    store.seed(&[cm("foo", ""), cm("bar", "")]);
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("foo", ""), cm("bar", "")], "1", None)
        .watch(
            vec![
                WatchEvent::Deleted(cm("foo", "")),
                WatchEvent::Modified(cm("bar", "55")),
                WatchEvent::Added(cm("baz", "32")),
            ],
            true,
        );
    let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
    let rv = r.last_sync_resource_version();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    task.await.unwrap();
    let state = store.state();
    assert_eq!(state.get("ns/foo"), None);
    assert_eq!(state.get("ns/bar").map(String::as_str), Some("55"));
    assert_eq!(state.get("ns/baz").map(String::as_str), Some("32"));
    assert_eq!(
        *rv.read(),
        "32",
        "the last event's version is the last synced one"
    );
}

// client-go: TestReflectorStopWatch
#[tokio::test(start_paused = true)]
async fn reflector_stop_watch() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "1")], "1", None)
        .watch(vec![], true);
    let store = Arc::new(RecStore::default());
    let r = Reflector::new(lw.clone(), store.clone(), no_jitter());
    let cancel = CancellationToken::new();
    cancel.cancel();
    r.run(cancel).await;
    assert!(store.ops.lock().is_empty(), "a stopped reflector wrote");
    assert!(
        lw.call_names().is_empty(),
        "a stopped reflector called the server"
    );
}

// client-go: TestNoRelistOnTooManyRequests
#[tokio::test(start_paused = true)]
async fn no_relist_on_too_many_requests() {
    let lw = FakeLw::new();
    lw.list_ok(vec![], "1", None);
    for _ in 0..4 {
        lw.watch_raw(Err(api_err(429, "TooManyRequests")));
    }
    lw.watch(vec![], true);
    let (_, m) = run_for(&lw, no_jitter(), 60, None).await;
    let calls = lw.call_names();
    let lists = calls.iter().filter(|c| c.starts_with("list")).count();
    let watches = calls.iter().filter(|c| c.starts_with("watch")).count();
    assert_eq!((lists, watches), (1, 5), "{calls:?}");
    assert_eq!(m.relists(), 0);
}

/// A key -> resourceVersion store, to check what watch events did (client-go's tests use
/// a plain `Store`).
#[derive(Default)]
struct ThreadSafeStoreAsReflectorStore {
    items: Mutex<std::collections::BTreeMap<String, String>>,
}

impl ThreadSafeStoreAsReflectorStore {
    fn seed(&self, objs: &[ConfigMap]) {
        for o in objs {
            self.put(o);
        }
    }
    fn put(&self, o: &ConfigMap) {
        self.items.lock().insert(
            meta_namespace_key(o).unwrap(),
            o.metadata.resource_version.clone().unwrap_or_default(),
        );
    }
    fn state(&self) -> std::collections::BTreeMap<String, String> {
        self.items.lock().clone()
    }
}

impl ReflectorStore<ConfigMap> for ThreadSafeStoreAsReflectorStore {
    fn add(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.put(&o);
        Ok(())
    }
    fn update(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.put(&o);
        Ok(())
    }
    fn delete(&self, o: ConfigMap) -> Result<(), StoreError> {
        self.items.lock().remove(&meta_namespace_key(&o).unwrap());
        Ok(())
    }
    fn replace(&self, list: Vec<ConfigMap>, _: &str) -> Result<(), StoreError> {
        self.items.lock().clear();
        self.seed(&list);
        Ok(())
    }
    fn resync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[test]
fn default_config_is_client_go() {
    let c = ReflectorConfig::default();
    assert_eq!(c.page_size, 500);
    assert_eq!(c.min_watch_timeout, Duration::from_secs(300));
    assert_eq!(c.backoff, BackoffConfig::default());
    assert_eq!(c.resync_period, Duration::ZERO);
    assert!(c.use_watch_list);
}

fn undecodable(name: &str, rv: &str, event: Option<WatchEventType>) -> UndecodableObject {
    UndecodableObject {
        namespace: "ns".into(),
        name: name.into(),
        resource_version: rv.into(),
        event,
        reason: crate::cache::UndecodableReason::Decode("missing field `phase`".into()),
    }
}

fn skipped(
    name: &str,
    rv: &str,
    event: WatchEventType,
) -> Result<WatchEvent<ConfigMap>, ListWatchError> {
    Err(ListWatchError::Undecodable {
        verb: "WATCH",
        url: "/fake".into(),
        object: Box::new(undecodable(name, rv, Some(event))),
    })
}

// kubeloop's own (client-go fails the list and ends the watch instead): objects that do not
// decode are skipped and counted, in the list and in the watch, which goes on; the store
// is told to keep what it holds for a listed key that was skipped, and to drop what it
// holds for a skipped deletion; a later version that decodes reaches the store as usual.
#[tokio::test(start_paused = true)]
async fn objects_that_do_not_decode_are_skipped_and_counted_never_fatal() {
    let lw = FakeLw::new();
    lw.list_with_undecodable(vec![cm("a", "5")], vec![undecodable("x", "6", None)], "10")
        .watch_raw(Ok(ScriptedWatch {
            events: vec![
                skipped("a", "11", WatchEventType::Modified),
                skipped("x", "12", WatchEventType::Modified),
                Ok(WatchEvent::Modified(cm("x", "13"))),
                skipped("y", "14", WatchEventType::Added),
                skipped("y", "15", WatchEventType::Deleted),
            ],
            then_hang: true,
            pace: Duration::from_millis(10),
        }));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (ops, m) = run_for(&lw, no_jitter(), 5, Some(errors.clone())).await;
    assert_eq!(
        ops,
        [
            "replace [a] @10 keeping [ns/x]",
            "update x",
            "delete undecodable ns/y"
        ]
    );
    assert_eq!(m.undecodable_objects(), 5);
    assert_eq!((m.lists(), m.relists(), m.list_errors()), (1, 0, 0));
    assert_eq!(
        m.watches(),
        1,
        "the watch is never ended by an undecodable object"
    );
    assert_eq!(m.watch_events(), 5);
    assert_eq!(m.last_resource_version(), 15);
    assert!(errors.lock().is_empty(), "{:?}", errors.lock());
}

// kubeloop's own: the streaming list skips an object that does not decode the same way, and
// a skipped object whose later initial event decodes is listed.
#[tokio::test(start_paused = true)]
async fn a_streaming_list_skips_objects_that_do_not_decode() {
    let lw = FakeLw::new();
    lw.watch_raw(Ok(ScriptedWatch {
        events: vec![
            Ok(WatchEvent::Added(cm("a", "5"))),
            skipped("x", "6", WatchEventType::Added),
            skipped("b", "7", WatchEventType::Added),
            Ok(WatchEvent::Modified(cm("b", "8"))),
            Ok(bookmark("9", true)),
        ],
        then_hang: true,
        pace: Duration::from_millis(10),
    }));
    let config = ReflectorConfig {
        use_watch_list: true,
        ..no_jitter()
    };
    let (ops, m) = run_for(&lw, config, 5, None).await;
    assert_eq!(ops, ["replace [a,b] @9 keeping [ns/x]"]);
    assert_eq!((m.lists(), m.list_errors()), (1, 0));
    assert_eq!(m.undecodable_objects(), 2);
}

/// A reflector whose consistency detectors are `detectors`, telling `found` of differences.
async fn run_detecting(
    lw: &FakeLw,
    detectors: ConsistencyDetectors,
    use_watch_list: bool,
) -> (Vec<String>, Vec<crate::cache::Inconsistency>) {
    let store = Arc::new(RecStore::default());
    let config = ReflectorConfig {
        use_watch_list,
        consistency: detectors,
        ..no_jitter()
    };
    let found: Arc<Mutex<Vec<crate::cache::Inconsistency>>> = Arc::default();
    let seen = found.clone();
    let r = Reflector::new(lw.clone(), store.clone(), config)
        .with_inconsistency_handler(Arc::new(move |i| seen.lock().push(i.clone())));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    cancel.cancel();
    task.await.unwrap();
    let ops = store.ops.lock().clone();
    (ops, found.lock().clone())
}

// client-go: TestCheckDataConsistency / TestWatchListConsistency (a cache made wrong on
// purpose: one object missing, one at a stale resourceVersion).
#[tokio::test(start_paused = true)]
async fn the_watch_list_detector_lists_etcd_at_the_synced_version_and_names_the_differences() {
    let lw = FakeLw::new();
    lw.watch(
        vec![
            WatchEvent::Added(cm("a", "5")),
            WatchEvent::Added(cm("b", "6")),
            bookmark("9", true),
        ],
        true,
    );
    // etcd at 9, in two pages: b is at 7, and c is there.
    lw.list_ok(vec![cm("a", "5"), cm("b", "7")], "9", Some("tok"))
        .list_ok(vec![cm("c", "8")], "9", None);
    let on = ConsistencyDetectors {
        watch_list: true,
        list_from_cache: false,
    };
    let (ops, found) = run_detecting(&lw, on, true).await;
    assert_eq!(ops, ["replace [a,b] @9"]);
    assert_eq!(
        lw.call_names()[1..],
        [
            r#"list rv=Some("9") limit=Some(500) continue=None"#,
            r#"list rv=None limit=Some(500) continue=Some("tok")"#,
        ]
    );
    assert_eq!(
        lw.script.lock().list_matches,
        [Some("Exact".to_string()), None]
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].resource_version, "9");
    assert_eq!(found[0].missing, ["ns/c"]);
    assert!(found[0].unexpected.is_empty());
    assert_eq!(found[0].stale, [("ns/b".into(), "6".into(), "7".into())]);
}

#[tokio::test(start_paused = true)]
async fn the_list_detector_finds_nothing_in_an_agreeing_cache_and_off_asks_nothing() {
    let agreeing = || {
        let lw = FakeLw::new();
        lw.list_ok(vec![cm("a", "5"), cm("b", "6")], "9", None)
            .watch(vec![], true);
        lw
    };
    let lw = agreeing();
    lw.list_ok(vec![cm("b", "6"), cm("a", "5")], "9", None);
    let on = ConsistencyDetectors {
        watch_list: false,
        list_from_cache: true,
    };
    let (_, found) = run_detecting(&lw, on, false).await;
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(lw.script.lock().list_matches, [None, Some("Exact".into())]);

    let lw = agreeing();
    let (ops, found) = run_detecting(&lw, ConsistencyDetectors::default(), false).await;
    assert_eq!(ops, ["replace [a,b] @9"]);
    assert!(found.is_empty());
    assert_eq!(
        lw.call_names(),
        [
            r#"list rv=Some("0") limit=Some(500) continue=None"#,
            r#"watch rv="9" bookmarks=true initial=false timeout_ok=true"#,
        ]
    );
}

// kubeloop's own (shard_scope.rs): the selection grew while the store held the list at "10"
// and the watch's event at "11": only the added part is listed, in one request at no older
// than "11" (answered at "14"), each of its objects added; the watch resumes from "11" (the
// list-watch drops what it replays of the added part up to "14"), with no replace.
#[tokio::test(start_paused = true)]
async fn a_selection_that_only_grew_lists_the_added_part_and_watches_from_the_store_version() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![WatchEvent::Added(cm("b", "11"))], false)
        .selection_changes(gained(None))
        .list_ok(vec![cm("c", "3"), cm("d", "13")], "14", None);
    let (ops, m) = run_for(&lw, no_jitter(), 5, None).await;
    assert_eq!(ops, ["replace [a] @10", "add b", "add c", "add d"]);
    let calls = lw.call_names();
    assert_eq!(
        calls[2..],
        [
            r#"list rv=Some("11") limit=None continue=None"#,
            r#"watch rv="11" bookmarks=true initial=false timeout_ok=true"#,
        ]
    );
    assert_eq!(lw.script.lock().list_matches, [None, None]);
    assert_eq!((m.lists(), m.relists(), m.listed_objects()), (2, 1, 3));
}

// kubeloop's own: when the list of the added part fails (its version compacted, say), the
// whole selection is listed and replaces the store, from the reflector's usual version.
#[tokio::test(start_paused = true)]
async fn a_failed_list_of_the_added_part_lists_the_whole_selection() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![bookmark("12", false)], false)
        .selection_changes(gained(None))
        .list_err(api_err(410, "Expired"))
        .list_ok(vec![cm("a", "5"), cm("c", "3")], "14", None);
    let (ops, _) = run_for(&lw, no_jitter(), 5, None).await;
    assert_eq!(ops, ["replace [a] @10", "replace [a,c] @14"]);
    let calls = lw.call_names();
    assert_eq!(
        calls[2..],
        [
            r#"list rv=Some("12") limit=None continue=None"#,
            r#"list rv=Some("12") limit=None continue=None"#,
            r#"watch rv="14" bookmarks=true initial=false timeout_ok=true"#,
        ]
    );
}

/// A change that took shards (listed alone) and gave up `released`.
fn gained(released: Option<ShardSelector>) -> SelectionChange {
    SelectionChange {
        gained: true,
        released,
    }
}

/// The selector of the namespace `ns` alone.
fn namespace(ns: &str) -> ShardSelector {
    let hash = crate::cache::fnv1a_64(ns.as_bytes());
    ShardSelector::namespaces([HashRange::new(hash, u128::from(hash) + 1).unwrap()]).unwrap()
}

// kubeloop's own (shard_scope.rs): the selection lost shards while the store held the list
// at "10" and the watch's event at "11": no list; the store releases what the shards given
// up hold and the watch resumes from "11" on the narrower selection.
#[tokio::test(start_paused = true)]
async fn a_selection_that_only_shrank_releases_and_watches_from_the_store_version() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![WatchEvent::Added(cm("b", "11"))], false)
        .selection_changes(SelectionChange {
            gained: false,
            released: Some(namespace("gone")),
        });
    let (ops, m) = run_for(&lw, no_jitter(), 5, None).await;
    assert_eq!(
        ops,
        [
            "replace [a] @10",
            "add b",
            &format!("release {}", namespace("gone"))
        ]
    );
    assert_eq!(
        lw.call_names()[2..],
        [r#"watch rv="11" bookmarks=true initial=false timeout_ok=true"#]
    );
    assert_eq!((m.lists(), m.relists()), (1, 0));
}

// kubeloop's own: shards taken and given up at once: the taken ones listed alone and added,
// then the given-up ones released, then the watch from the store's version.
#[tokio::test(start_paused = true)]
async fn a_selection_that_moved_lists_the_added_part_then_releases_the_rest() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![bookmark("12", false)], false)
        .selection_changes(gained(Some(namespace("gone"))))
        .list_ok(vec![cm("c", "3")], "14", None);
    let (ops, _) = run_for(&lw, no_jitter(), 5, None).await;
    assert_eq!(
        ops,
        [
            "replace [a] @10",
            "add c",
            &format!("release {}", namespace("gone"))
        ]
    );
    assert_eq!(
        lw.call_names()[2..],
        [
            r#"list rv=Some("12") limit=None continue=None"#,
            r#"watch rv="12" bookmarks=true initial=false timeout_ok=true"#,
        ]
    );
}

// kubeloop's own: a store that cannot release (a queue that is not atomic) gets the whole
// selection listed instead.
#[tokio::test(start_paused = true)]
async fn a_store_that_cannot_release_gets_the_whole_selection_listed() {
    let lw = FakeLw::new();
    lw.list_ok(vec![cm("a", "5")], "10", None)
        .watch(vec![bookmark("12", false)], false)
        .selection_changes(SelectionChange {
            gained: false,
            released: Some(namespace("gone")),
        })
        .list_ok(vec![cm("a", "5")], "14", None);
    let store = RecStore {
        cannot_release: true,
        ..Default::default()
    };
    let (ops, m) = run_into(store, &lw, no_jitter(), 5, None).await;
    assert_eq!(
        ops,
        [
            "replace [a] @10",
            &format!("release {}", namespace("gone")),
            "replace [a] @14"
        ]
    );
    assert_eq!(
        lw.call_names()[2..],
        [
            r#"list rv=Some("12") limit=None continue=None"#,
            r#"watch rv="14" bookmarks=true initial=false timeout_ok=true"#,
        ]
    );
    assert_eq!((m.lists(), m.relists()), (2, 1));
}
