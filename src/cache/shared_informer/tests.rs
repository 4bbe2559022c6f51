use super::*;
use crate::cache::fake_source::FakeControllerSource;
use crate::cache::processor::ResourceEventHandlerFuncs;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn cm_data(name: &str, v: &str) -> ConfigMap {
    let mut c = cm(name);
    c.data = Some([("v".to_string(), v.to_string())].into());
    c
}

/// Writes what a handler sees as short strings.
#[derive(Clone, Default)]
struct Recorder {
    events: Arc<Mutex<Vec<String>>>,
}

fn name(o: &ConfigMap) -> String {
    o.metadata.name.clone().unwrap()
}

impl ResourceEventHandler<ConfigMap> for Recorder {
    fn on_add(&self, obj: &Arc<ConfigMap>, initial: bool) {
        let tag = if initial { " initial" } else { "" };
        self.events.lock().push(format!("add {}{tag}", name(obj)));
    }
    fn on_update(&self, old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
        let e = if resource_version(&**old) == resource_version(&**new) {
            format!("sync {}", name(new))
        } else {
            format!("update {}", name(new))
        };
        self.events.lock().push(e);
    }
    fn on_delete(&self, obj: &DeletedObject<ConfigMap>) {
        let e = match obj {
            DeletedObject::Object(o) => format!("delete {}", name(o)),
            DeletedObject::Unknown(t) => format!("tombstone {}", t.key),
        };
        self.events.lock().push(e);
    }
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock())
    }
    fn count(&self, prefix: &str) -> usize {
        self.events
            .lock()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }
}

fn informer(source: &FakeControllerSource, resync: Duration) -> SharedIndexInformer<ConfigMap> {
    let config = InformerConfig {
        resync_period: resync,
        reflector: ReflectorConfig {
            backoff: crate::cache::BackoffConfig {
                jitter: 0.0,
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    SharedIndexInformer::new(source.clone(), config)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Starts `inf` with a recording handler and waits until its initial list was handed out;
/// the recorder is then empty.
async fn synced_with_recorder(inf: &SharedIndexInformer<ConfigMap>) -> Recorder {
    let rec = Recorder::default();
    inf.add_event_handler(rec.clone()).unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    settle().await;
    rec.take();
    rec
}

// client-go: TestSharedInformerInitializationRace / the basic informer flow
#[tokio::test(start_paused = true)]
async fn handlers_see_initial_list_then_live_changes_in_order() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    source.add(cm("b"));
    let inf = informer(&source, Duration::ZERO);
    let rec = Recorder::default();
    let reg = inf.add_event_handler(rec.clone()).unwrap();
    assert!(!inf.has_synced());
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    assert!(reg.wait_for_sync().await);
    let mut initial = rec.take();
    initial.sort();
    assert_eq!(initial, ["add a initial", "add b initial"]);

    source.modify(cm_data("a", "1"));
    source.delete(cm("b"));
    source.add(cm("c"));
    settle().await;
    assert_eq!(rec.take(), ["update a", "delete b", "add c"]);
    assert_eq!(inf.last_sync_resource_version(), "5");
    let mut keys = inf.indexer().list_keys();
    keys.sort();
    assert_eq!(keys, ["ns/a", "ns/c"]);
    assert_eq!(
        inf.lister().get("ns", "a").unwrap().data.as_ref().unwrap()["v"],
        "1"
    );
    inf.shutdown().await;
}

fn informer_with(
    source: &FakeControllerSource,
    queue: QueueKind,
    real_fifo: RealFifoOptions,
    store: StoreKind,
) -> SharedIndexInformer<ConfigMap> {
    let mut config = informer(source, Duration::ZERO)
        .shared
        .inner
        .lock()
        .reflector_config
        .clone();
    config.resync_period = Duration::ZERO;
    SharedIndexInformer::new(
        source.clone(),
        InformerConfig {
            reflector: config,
            queue,
            real_fifo,
            store,
            ..Default::default()
        },
    )
}

// kubeloop's own: the three queue settings (client-go 1.36's atomic RealFIFO, the
// per-object RealFIFO of 1.33-1.35, the DeltaFIFO), each with a typed and a compact store,
// give a handler the same events and a lister the same objects through a list, watch
// events, and a relist after a 410 that finds a deletion, a change and an addition it never
// saw; the atomic queue tells the deletion first, as client-go's `processReplacedAllInfo`
// does.
#[tokio::test(start_paused = true)]
async fn every_queue_setting_gives_handlers_the_same_events() {
    let settings = [
        (
            "atomic RealFIFO",
            QueueKind::RealFifo,
            RealFifoOptions::default(),
        ),
        (
            "per-object RealFIFO",
            QueueKind::RealFifo,
            RealFifoOptions::non_atomic(),
        ),
        (
            "DeltaFIFO",
            QueueKind::DeltaFifo,
            RealFifoOptions::default(),
        ),
    ];
    let settings = settings
        .into_iter()
        .flat_map(|s| store_kinds().map(move |store| (s, store)));
    for ((setting, queue, real_fifo), store) in settings {
        let name = format!("{setting}, {store:?} store");
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        source.add(cm("b"));
        let inf = informer_with(&source, queue, real_fifo, store);
        let rec = Recorder::default();
        let reg = inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        assert!(reg.wait_for_sync().await, "{name}");
        let mut initial = rec.take();
        initial.sort();
        assert_eq!(initial, ["add a initial", "add b initial"], "{name}");

        source.modify(cm_data("a", "1"));
        source.delete(cm("b"));
        source.add(cm("c"));
        settle().await;
        assert_eq!(rec.take(), ["update a", "delete b", "add c"], "{name}");

        // Lost while "disconnected"; the relist after the compaction finds them.
        source.delete_silently(cm("c"));
        source.modify_silently(cm_data("a", "2"));
        source.add_silently(cm("d"));
        source.compact();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let relist = rec.take();
        if real_fifo.atomic_events && queue == QueueKind::RealFifo {
            assert_eq!(relist.first().map(String::as_str), Some("tombstone ns/c"));
        }
        let mut relist = relist;
        relist.sort();
        assert_eq!(relist, ["add d", "tombstone ns/c", "update a"], "{name}");
        let mut keys = inf.indexer().list_keys();
        keys.sort();
        assert_eq!(keys, ["ns/a", "ns/d"], "{name}");
        assert_eq!(
            inf.lister().get("ns", "a").unwrap().data.as_ref().unwrap()["v"],
            "2",
            "{name}"
        );
        inf.shutdown().await;
    }
}

// kubeloop's own (client-go `threadSafeMap.rv`, kept with the `AtomicFIFO` gate on): an
// informer with an atomic queue knows the resourceVersion its store is current to, the
// list's and then each applied event's; with a per-object queue it reports "".
#[tokio::test(start_paused = true)]
async fn the_store_knows_its_resource_version_with_an_atomic_queue() {
    for (real_fifo, tracked) in [
        (RealFifoOptions::default(), true),
        (RealFifoOptions::non_atomic(), false),
    ] {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        source.add(cm("b"));
        let inf = informer_with(&source, QueueKind::RealFifo, real_fifo, StoreKind::Typed);
        let indexer = inf.indexer();
        assert_eq!(indexer.last_store_sync_resource_version(), "");
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        let want = |rv: &str| {
            if tracked {
                rv.to_string()
            } else {
                String::new()
            }
        };
        assert_eq!(indexer.last_store_sync_resource_version(), want("2"));
        source.add(cm("c"));
        source.modify(cm_data("a", "1"));
        settle().await;
        assert_eq!(indexer.last_store_sync_resource_version(), want("4"));
        inf.shutdown().await;
    }
}

// client-go: TestAddWhileActive / TestSharedInformerMultipleRegistration
#[tokio::test(start_paused = true)]
async fn a_handler_added_after_start_gets_the_cache_replayed() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    let inf = informer(&source, Duration::ZERO);
    let first = Recorder::default();
    inf.add_event_handler(first.clone()).unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    source.add(cm("b"));
    settle().await;

    let late = Recorder::default();
    let reg = inf.add_event_handler(late.clone()).unwrap();
    assert!(reg.wait_for_sync().await);
    assert!(reg.has_synced());
    let mut replayed = late.take();
    replayed.sort();
    assert_eq!(replayed, ["add a initial", "add b initial"]);
    source.add(cm("c"));
    settle().await;
    assert_eq!(late.take(), ["add c"]);
    assert_eq!(first.take(), ["add a initial", "add b", "add c"]);
    inf.shutdown().await;
}

// client-go: TestSharedInformerWatchDisruption (deletions missed during the disruption
// reach handlers as tombstones; nothing is added twice)
#[tokio::test(start_paused = true)]
async fn deletions_missed_across_a_relist_arrive_as_tombstones() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    source.add(cm("b"));
    let inf = informer(&source, Duration::ZERO);
    let rec = synced_with_recorder(&inf).await;

    // The events of these changes are lost; then the history is compacted (410).
    source.delete_silently(cm("a"));
    source.compact();
    source.add(cm("c"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut seen = rec.take();
    seen.sort();
    // b is unchanged: its Replaced delta with the same resourceVersion is not delivered.
    assert_eq!(seen, ["add c", "tombstone ns/a"]);
    let mut keys = inf.indexer().list_keys();
    keys.sort();
    assert_eq!(keys, ["ns/b", "ns/c"]);
    assert_eq!(source.list_count(), 2);
    inf.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_clean_watch_close_resumes_without_a_relist() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    let inf = informer(&source, Duration::ZERO);
    let rec = Recorder::default();
    inf.add_event_handler(rec.clone()).unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    source.break_watches();
    source.modify(cm_data("a", "2"));
    source.add(cm("b"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rec.take(), ["add a initial", "update a", "add b"]);
    assert_eq!(source.list_count(), 1);
    inf.shutdown().await;
}

// client-go: TestListenerResyncPeriods
#[tokio::test(start_paused = true)]
async fn each_listener_resyncs_on_its_own_period() {
    listener_resync_periods(Duration::ZERO).await;
}

// client-go: TestListenerResyncPeriodsDelayed (the handlers start a second after the
// first notifications were distributed; their buffers hold them, nothing deadlocks)
#[tokio::test(start_paused = true)]
async fn listener_resync_periods_delayed() {
    crate::cache::processor::LISTENER_START_DELAY.with(|d| d.set(Duration::from_secs(1)));
    listener_resync_periods(Duration::from_secs(1)).await;
    crate::cache::processor::LISTENER_START_DELAY.with(|d| d.set(Duration::ZERO));
}

async fn listener_resync_periods(startup_delay: Duration) {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    let inf = informer(&source, Duration::from_secs(1));
    let (r1, r2, r3) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    inf.add_event_handler_with_resync_period(r1.clone(), Duration::from_secs(1))
        .unwrap();
    inf.add_event_handler_with_resync_period(r2.clone(), Duration::from_secs(2))
        .unwrap();
    inf.add_event_handler_with_resync_period(r3.clone(), Duration::ZERO)
        .unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    if !startup_delay.is_zero() {
        assert_eq!(r1.count("add a"), 0, "the handlers have not started yet");
    }
    tokio::time::sleep(Duration::from_millis(4500)).await;
    for r in [&r1, &r2, &r3] {
        assert_eq!(r.count("add a"), 1, "startup delay {startup_delay:?}");
    }
    assert_eq!(r1.count("sync a"), 4, "startup delay {startup_delay:?}");
    assert_eq!(r2.count("sync a"), 2, "startup delay {startup_delay:?}");
    assert_eq!(r3.count("sync a"), 0, "startup delay {startup_delay:?}");
    inf.shutdown().await;
}

// client-go: TestResyncCheckPeriod
#[tokio::test(start_paused = true)]
async fn resync_check_period_follows_handlers_before_start_only() {
    let source = FakeControllerSource::new();
    let inf = informer(&source, Duration::from_secs(60));
    let check = |inf: &SharedIndexInformer<ConfigMap>| inf.shared.inner.lock().resync_check_period;
    let periods = |inf: &SharedIndexInformer<ConfigMap>| {
        inf.shared
            .inner
            .lock()
            .listeners
            .iter()
            .map(|l| l.resync_period)
            .collect::<Vec<_>>()
    };
    inf.add_event_handler(Recorder::default()).unwrap();
    assert_eq!(check(&inf), Duration::from_secs(60));
    inf.add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(check(&inf), Duration::from_secs(10));
    // Below the minimum: raised to 1 s, which becomes the check period.
    inf.add_event_handler_with_resync_period(Recorder::default(), Duration::from_millis(10))
        .unwrap();
    assert_eq!(check(&inf), Duration::from_secs(1));
    assert_eq!(
        periods(&inf),
        [
            Duration::from_secs(60),
            Duration::from_secs(10),
            Duration::from_secs(1)
        ]
    );
    inf.start();
    // After start, the check period no longer moves; nothing below it.
    let inf2 = informer(&source, Duration::from_secs(5));
    inf2.start();
    inf2.add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(2))
        .unwrap();
    assert_eq!(check(&inf2), Duration::from_secs(5));
    assert_eq!(periods(&inf2), [Duration::from_secs(5)]);
    inf.shutdown().await;
    inf2.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_handler_resync_turns_the_check_on_when_the_informer_default_is_zero() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    let inf = informer(&source, Duration::ZERO);
    let rec = Recorder::default();
    inf.add_event_handler_with_resync_period(rec.clone(), Duration::from_secs(2))
        .unwrap();
    inf.start();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(rec.count("sync a"), 2);
    inf.shutdown().await;
}

// client-go: TestAddOnStoppedSharedInformer
#[tokio::test(start_paused = true)]
async fn adding_to_a_stopped_informer_is_an_error() {
    let source = FakeControllerSource::new();
    let inf = informer(&source, Duration::ZERO);
    inf.start();
    inf.shutdown().await;
    let err = inf.add_event_handler(Recorder::default()).unwrap_err();
    assert!(matches!(err, InformerError::Stopped { .. }));
    assert!(err.to_string().contains("v1/configmaps"));
    assert!(!inf.wait_for_cache_sync().await || inf.has_synced());
}

// client-go: TestSharedInformerTransformer
#[tokio::test(start_paused = true)]
async fn transform_runs_before_the_store_and_only_before_start() {
    let source = FakeControllerSource::new();
    let mut with_fields = cm("a");
    with_fields.metadata.managed_fields = Some(vec![Default::default()]);
    source.add(with_fields);
    let inf = informer(&source, Duration::ZERO);
    inf.set_transform(|mut o: ConfigMap| {
        o.metadata.managed_fields = None;
        o
    })
    .unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    assert!(
        inf.lister()
            .get("ns", "a")
            .unwrap()
            .metadata
            .managed_fields
            .is_none()
    );
    let err = inf.set_transform(|o| o).unwrap_err();
    assert!(matches!(err, InformerError::AlreadyStarted { .. }), "{err}");
    inf.shutdown().await;
}

// kubeloop's own: the reflector runs the transform on each listed object as it arrives
// (client-go's TransformingStore) and the queue does not run it again, for both queues;
// watch events are transformed once by the queue.
#[tokio::test(start_paused = true)]
async fn listed_and_watched_objects_are_transformed_exactly_once() {
    for queue in [QueueKind::RealFifo, QueueKind::DeltaFifo] {
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        let inf = SharedIndexInformer::new(
            source.clone(),
            InformerConfig {
                queue,
                ..Default::default()
            },
        );
        inf.set_transform(|mut o: ConfigMap| {
            let data = o.data.get_or_insert_with(Default::default);
            let n: u32 = data.get("runs").map_or(0, |v| v.parse().unwrap());
            data.insert("runs".into(), (n + 1).to_string());
            o
        })
        .unwrap();
        inf.start();
        assert!(inf.wait_for_cache_sync().await);
        source.add(cm("b"));
        settle().await;
        for name in ["a", "b"] {
            let o = inf.lister().get("ns", name).expect(name);
            assert_eq!(o.data.as_ref().unwrap()["runs"], "1", "{queue:?} {name}");
        }
        inf.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn start_is_idempotent_and_shutdown_waits_for_tasks() {
    let source = FakeControllerSource::new();
    source.add(cm("a"));
    let inf = informer(&source, Duration::ZERO);
    let rec = Recorder::default();
    let reg = inf.add_event_handler(rec.clone()).unwrap();
    inf.start();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    settle().await;
    assert_eq!(source.list_count(), 1);
    inf.shutdown().await;
    inf.shutdown().await;
    assert!(inf.is_stopped());
    // After shutdown nothing is delivered any more.
    source.add(cm("late"));
    settle().await;
    assert_eq!(rec.take(), ["add a initial"]);
    assert_eq!(reg.backlog(), 0);
    // And removing a handler drops it.
    inf.remove_event_handler(&reg);
}

// client-go: TestSharedInformerErrorHandling
#[tokio::test(start_paused = true)]
async fn shared_informer_error_handling() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    source.set_list_error(Some("Access Denied"));
    let inf = informer(&source, Duration::from_secs(1));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    inf.set_watch_error_handler(move |e| {
        let _ = tx.send(e.to_string());
    })
    .unwrap();
    inf.start();
    let err = tokio::time::timeout(Duration::from_secs(1), rx.recv())
        .await
        .expect("no error reported within a second")
        .unwrap();
    assert!(err.contains("Access Denied"), "{err}");
    assert!(!inf.has_synced());
    inf.shutdown().await;
}

// client-go: TestSharedInformerRemoveHandler
#[tokio::test(start_paused = true)]
async fn shared_informer_remove_handler() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    let inf = informer(&source, Duration::from_secs(1));
    let h1 = inf.add_event_handler(Recorder::default()).unwrap();
    let h2 = inf.add_event_handler(Recorder::default()).unwrap();
    assert_eq!(inf.handler_count(), 2);
    inf.remove_event_handler(&h2);
    assert_eq!(inf.handler_count(), 1);
    inf.remove_event_handler(&h1);
    assert_eq!(inf.handler_count(), 0);
}

// client-go: TestSharedInformerRemoveForeignHandler
#[tokio::test(start_paused = true)]
async fn shared_informer_remove_foreign_handler() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    let inf = informer(&source, Duration::from_secs(1));
    let source2 = FakeControllerSource::new();
    source2.add(cm("pod1"));
    let inf2 = informer(&source2, Duration::from_secs(1));
    let h1 = inf.add_event_handler(Recorder::default()).unwrap();
    let h2 = inf.add_event_handler(Recorder::default()).unwrap();
    // The other informer's first handler has the same id as `h1` would there.
    let foreign = inf2.add_event_handler(Recorder::default()).unwrap();
    assert_eq!((inf.handler_count(), inf2.handler_count()), (2, 1));
    assert!(!inf2.is_registered(&h1) && !inf2.is_registered(&h2));
    inf2.remove_event_handler(&h1);
    inf2.remove_event_handler(&h2);
    assert_eq!((inf.handler_count(), inf2.handler_count()), (2, 1));
    assert!(
        inf2.is_registered(&foreign),
        "a foreign removal took a handler of ours"
    );
    inf.remove_event_handler(&h1);
    inf.remove_event_handler(&h2);
    assert_eq!((inf.handler_count(), inf2.handler_count()), (0, 1));
}

// client-go: TestSharedInformerMultipleRegistration
#[tokio::test(start_paused = true)]
async fn shared_informer_multiple_registration() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    let inf = informer(&source, Duration::from_secs(1));
    let handler = Recorder::default();
    let reg1 = inf.add_event_handler(handler.clone()).unwrap();
    let reg2 = inf.add_event_handler(handler.clone()).unwrap();
    assert!(inf.is_registered(&reg1) && inf.is_registered(&reg2));
    assert_eq!(inf.handler_count(), 2);
    inf.remove_event_handler(&reg1);
    assert!(!inf.is_registered(&reg1));
    assert!(inf.is_registered(&reg2));
    assert_eq!(inf.handler_count(), 1);
    inf.remove_event_handler(&reg2);
    assert!(!inf.is_registered(&reg2));
    assert_eq!(inf.handler_count(), 0);
}

// client-go: TestRemovingRemovedSharedInformer
#[tokio::test(start_paused = true)]
async fn removing_removed_shared_informer() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    let inf = informer(&source, Duration::from_secs(1));
    let reg = inf.add_event_handler(Recorder::default()).unwrap();
    inf.remove_event_handler(&reg);
    assert!(!inf.is_registered(&reg));
    inf.remove_event_handler(&reg);
    assert!(!inf.is_registered(&reg));
    assert_eq!(inf.handler_count(), 0);
}

// client-go: TestRemoveOnStoppedSharedInformer
#[tokio::test(start_paused = true)]
async fn remove_on_stopped_shared_informer() {
    let source = FakeControllerSource::new();
    source.add(cm("pod1"));
    let inf = informer(&source, Duration::ZERO);
    let reg = inf.add_event_handler(Recorder::default()).unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    inf.shutdown().await;
    assert!(inf.is_stopped());
    inf.remove_event_handler(&reg);
    assert!(!inf.is_registered(&reg));
}

// client-go: TestRemoveWhileActive
#[tokio::test(start_paused = true)]
async fn remove_while_active() {
    let source = FakeControllerSource::new();
    let inf = informer(&source, Duration::ZERO);
    let rec = Recorder::default();
    let reg = inf.add_event_handler(rec.clone()).unwrap();
    inf.start();
    assert!(inf.wait_for_cache_sync().await);
    source.add(cm("pod1"));
    settle().await;
    assert_eq!(rec.take(), ["add pod1"]);
    inf.remove_event_handler(&reg);
    assert!(!inf.is_registered(&reg));
    source.add(cm("pod2"));
    settle().await;
    assert!(rec.take().is_empty(), "a removed handler got events");
    assert!(
        inf.lister().get("ns", "pod2").is_some(),
        "the cache still follows"
    );
    inf.shutdown().await;
}

/// Checks the per-key event rules as events arrive and keeps the handler's view.
#[derive(Clone, Default)]
struct Invariants {
    present: Arc<Mutex<std::collections::BTreeMap<String, String>>>,
    violations: Arc<Mutex<Vec<String>>>,
}

impl ResourceEventHandler<ConfigMap> for Invariants {
    fn on_add(&self, obj: &Arc<ConfigMap>, _: bool) {
        let key = format!("ns/{}", name(obj));
        let rv = resource_version(&**obj).to_string();
        if self.present.lock().insert(key.clone(), rv).is_some() {
            self.violations.lock().push(format!("{key} added twice"));
        }
    }
    fn on_update(&self, _old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
        let key = format!("ns/{}", name(new));
        let rv = resource_version(&**new).to_string();
        if self.present.lock().insert(key.clone(), rv).is_none() {
            self.violations
                .lock()
                .push(format!("{key} updated, never added"));
        }
    }
    fn on_delete(&self, obj: &DeletedObject<ConfigMap>) {
        let key = format!("ns/{}", name(obj.object()));
        if self.present.lock().remove(&key).is_none() {
            self.violations
                .lock()
                .push(format!("{key} deleted, not present"));
        }
    }
}

// A randomized version of client-go's TestSharedInformerWatchDisruption: live changes,
// outages that lose changes followed by compaction (410), clean watch breaks, late
// handlers and resyncs, in random order. Afterwards the cache and every handler's view
// equal the source, and no handler ever saw an impossible sequence.
#[tokio::test(start_paused = true)]
async fn random_changes_outages_and_compactions_always_converge() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    for seed in 0..25u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let source = FakeControllerSource::new();
        for i in 0..5 {
            source.add(cm(&format!("o{i}")));
        }
        let resync = if rng.random_bool(0.5) {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        let inf = informer(&source, resync);
        let mut handlers = vec![Invariants::default()];
        inf.add_event_handler(handlers[0].clone()).unwrap();
        inf.start();
        let mut next = 5;
        for step in 0..150 {
            let names = source.names();
            let pick = |rng: &mut StdRng| names[rng.random_range(0..names.len())].clone();
            match rng.random_range(0..10) {
                0..=2 => {
                    source.add(cm(&format!("o{next}")));
                    next += 1;
                }
                3 | 4 if !names.is_empty() => {
                    source.modify(cm_data(&pick(&mut rng), &step.to_string()))
                }
                5 if !names.is_empty() => source.delete(cm(&pick(&mut rng))),
                6 => {
                    for _ in 0..rng.random_range(1..4) {
                        let names = source.names();
                        match rng.random_range(0..3) {
                            0 => {
                                source.add_silently(cm(&format!("o{next}")));
                                next += 1;
                            }
                            1 if !names.is_empty() => {
                                let n = names[rng.random_range(0..names.len())].clone();
                                source.modify_silently(cm_data(&n, "lost"));
                            }
                            _ if !names.is_empty() => {
                                let n = names[rng.random_range(0..names.len())].clone();
                                source.delete_silently(cm(&n));
                            }
                            _ => {}
                        }
                    }
                    source.compact();
                }
                7 => source.break_watches(),
                8 if handlers.len() < 3 => {
                    let h = Invariants::default();
                    inf.add_event_handler(h.clone()).unwrap();
                    handlers.push(h);
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
        }
        // Longer than the largest backoff.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let want = source.snapshot();
        let cache: std::collections::BTreeMap<String, String> = inf
            .indexer()
            .list()
            .iter()
            .map(|o| {
                (
                    format!("ns/{}", name(o)),
                    resource_version(&**o).to_string(),
                )
            })
            .collect();
        assert_eq!(cache, want, "seed {seed}: cache");
        for (i, h) in handlers.iter().enumerate() {
            assert!(
                h.violations.lock().is_empty(),
                "seed {seed} handler {i}: {:?}",
                h.violations.lock()
            );
            assert_eq!(*h.present.lock(), want, "seed {seed}: handler {i}'s view");
        }
        inf.shutdown().await;
    }
}

// The gate is a std mutex held across awaits on purpose: it is what makes the handler slow.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_does_not_block_the_others_and_shows_a_backlog() {
    let source = FakeControllerSource::new();
    let inf = informer(&source, Duration::ZERO);
    let gate = Arc::new(std::sync::Mutex::new(()));
    let held = gate.lock().unwrap();
    let g = gate.clone();
    let slow = inf
        .add_event_handler_with_options(
            ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
                drop(g.lock().unwrap());
            }),
            HandlerOptions {
                name: "slow".into(),
                resync_period: None,
            },
        )
        .unwrap();
    let fast = Recorder::default();
    inf.add_event_handler(fast.clone()).unwrap();
    inf.start();
    for i in 0..50 {
        source.add(cm(&format!("o{i}")));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fast.count("add") < 50 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fast.count("add"), 50);
    // The slow handler is stuck on its first notification; the rest wait in its buffer.
    assert_eq!(slow.backlog(), 50);
    let metrics = inf.shared.metrics.handler_backlog("v1/configmaps", "slow");
    assert_eq!(metrics.get(), 50);
    drop(held);
    while slow.backlog() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(slow.backlog(), 0);
    inf.shutdown().await;
}

// kubeloop's own (client-go fails the list for ever on such an object): with every queue
// setting, an object that does not decode is skipped and counted; the others are served;
// it is served (an add) once a version decodes; a version that stops decoding leaves the
// last one that decoded in the cache, through the watch and through a relist alike; the
// deletion of an object whose final state does not decode removes what the cache held (a
// tombstone), and is nothing to handlers if the cache held nothing.
#[tokio::test(start_paused = true)]
async fn objects_that_do_not_decode_never_stall_the_informer() {
    let settings = [
        (
            "atomic RealFIFO",
            QueueKind::RealFifo,
            RealFifoOptions::default(),
        ),
        (
            "per-object RealFIFO",
            QueueKind::RealFifo,
            RealFifoOptions::non_atomic(),
        ),
        (
            "DeltaFIFO",
            QueueKind::DeltaFifo,
            RealFifoOptions::default(),
        ),
    ];
    let settings = settings
        .into_iter()
        .flat_map(|s| store_kinds().map(move |store| (s, store)));
    for ((queue_name, queue, real_fifo), store) in settings {
        let setting = format!("{queue_name}, {store:?} store");
        let source = FakeControllerSource::new();
        source.add(cm("a"));
        source.add_undecodable(cm("x"));
        let metrics = CacheMetrics::new();
        let reflector = informer_with(&source, queue, real_fifo, store)
            .shared
            .inner
            .lock()
            .reflector_config
            .clone();
        let inf = SharedIndexInformer::new(
            source.clone(),
            InformerConfig {
                reflector,
                queue,
                real_fifo,
                store,
                metrics: metrics.clone(),
                ..Default::default()
            },
        );
        let counted = metrics.reflector("v1/configmaps");
        let rec = Recorder::default();
        let reg = inf.add_event_handler(rec.clone()).unwrap();
        inf.start();
        assert!(reg.wait_for_sync().await, "{setting}");
        assert_eq!(rec.take(), ["add a initial"], "{setting}");
        assert_eq!(counted.undecodable_objects(), 1, "{setting}");

        // A version of `a` that does not decode: the cache keeps the one that did.
        source.modify_undecodable(cm_data("a", "bad"));
        // `x` decodes at last: an add, since the cache never held it.
        source.modify(cm_data("x", "1"));
        // `b` is added, stops decoding, and is deleted in that state.
        source.add(cm("b"));
        source.modify_undecodable(cm_data("b", "bad"));
        source.delete(cm("b"));
        // `y` never decodes and is deleted: nothing for the handlers.
        source.add_undecodable(cm("y"));
        source.delete(cm("y"));
        settle().await;
        assert_eq!(
            rec.take(),
            ["add x", "add b", "tombstone ns/b"],
            "{setting}"
        );
        assert_eq!(counted.undecodable_objects(), 6, "{setting}");
        assert_eq!(inf.lister().get("ns", "a").unwrap().data, None, "{setting}");
        let mut keys = inf.indexer().list_keys();
        keys.sort();
        assert_eq!(keys, ["ns/a", "ns/x"], "{setting}");

        // A relist finds `a` still undecodable: kept, no event.
        source.compact();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(rec.take(), Vec::<String>::new(), "{setting}");
        assert_eq!(counted.undecodable_objects(), 7, "{setting}");
        assert!(counted.relists() >= 1, "{setting}");
        assert_eq!(inf.lister().get("ns", "a").unwrap().data, None, "{setting}");
        // ... until a version decodes.
        source.modify(cm_data("a", "2"));
        settle().await;
        assert_eq!(rec.take(), ["update a"], "{setting}");
        assert_eq!(
            inf.lister().get("ns", "a").unwrap().data.as_ref().unwrap()["v"],
            "2",
            "{setting}"
        );
        inf.shutdown().await;

        // A fresh informer (a restart) has no good version of an undecodable object to keep.
        source.modify_undecodable(cm_data("x", "bad"));
        let inf = informer_with(&source, queue, real_fifo, store);
        inf.start();
        assert!(inf.wait_for_cache_sync().await, "{setting}");
        assert_eq!(inf.indexer().list_keys(), ["ns/a"], "{setting}");
        inf.shutdown().await;
    }
}

/// Every store kind this build has.
fn store_kinds() -> impl Iterator<Item = StoreKind> {
    [
        StoreKind::Typed,
        #[cfg(feature = "compact-store")]
        StoreKind::Compact,
    ]
    .into_iter()
}

// kubeloop's own (shard_scope.rs): a shard scope gave namespace "gone"'s shard up; through
// the atomic queue (typed and compact stores) the informer deletes exactly the objects the
// released selector matches, each handed to handlers as a tombstone, after what was queued
// before the release; the objects of the shards kept stay. A queue that is not atomic
// cannot release (the reflector lists again instead).
#[tokio::test(start_paused = true)]
async fn a_release_deletes_exactly_the_released_shards_objects() {
    let in_ns = |ns: &str, name: &str| {
        let mut c = cm(name);
        c.metadata.namespace = Some(ns.into());
        c
    };
    let hash = crate::cache::fnv1a_64(b"gone");
    let gone = crate::cache::ShardSelector::namespaces([crate::cache::HashRange::new(
        hash,
        u128::from(hash) + 1,
    )
    .unwrap()])
    .unwrap();
    for store in store_kinds() {
        let source = FakeControllerSource::new();
        source.add(in_ns("kept", "a"));
        source.add(in_ns("gone", "b"));
        let inf = informer_with(
            &source,
            QueueKind::RealFifo,
            RealFifoOptions::default(),
            store,
        );
        let rec = synced_with_recorder(&inf).await;
        source.add(in_ns("gone", "c"));
        settle().await;
        assert_eq!(rec.take(), ["add c"], "{store:?}");
        assert_eq!(inf.shared.fifo.release(&gone), Ok(true), "{store:?}");
        settle().await;
        let mut seen = rec.take();
        seen.sort();
        assert_eq!(seen, ["tombstone gone/b", "tombstone gone/c"], "{store:?}");
        assert_eq!(inf.indexer().list_keys(), ["kept/a"], "{store:?}");
        inf.shutdown().await;
    }
    let source = FakeControllerSource::<ConfigMap>::new();
    let unatomic = RealFifoOptions {
        atomic_events: false,
        ..Default::default()
    };
    let inf = informer_with(&source, QueueKind::RealFifo, unatomic, StoreKind::Typed);
    assert_eq!(inf.shared.fifo.release(&gone), Ok(false));
    let inf = informer_with(
        &source,
        QueueKind::DeltaFifo,
        RealFifoOptions::default(),
        StoreKind::Typed,
    );
    assert_eq!(inf.shared.fifo.release(&gone), Ok(false));
}
