//! Tests of the events.k8s.io/v1 recorder: client-go `tools/events` v0.36.3's tests ported by
//! name where they apply (`event_recorder_test.go`, `eventseries_test.go`,
//! `event_broadcaster_test.go`), then kubeloop's own (the spam budget, the note's limit, the
//! flush at shutdown).
//!
//! client-go's fake clientset and channel sinks become [`MemorySink`], which keeps Events the
//! way the apiserver would (a patch of a missing Event is NotFound, a second create of a name
//! AlreadyExists) and logs every write; its fake clock becomes paused tokio time.
//!
//! Not ported: `TestEventSeriesWithEventSinkImplRace` (a Go race-detector test of concurrent
//! `recordToSink` goroutines; one task writes here) and `helper_test.go`'s
//! `TestGetFieldSelector` (a field-selector helper this module does not have).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube_client::core::ObjectMeta;
use parking_lot::Mutex;

use super::super::broadcaster::is_dns_subdomain;
use super::*;

/// One write the sink received.
#[derive(Debug, Clone, PartialEq)]
enum Sent {
    Create(Event),
    Patch(Event),
}

/// Events kept by (namespace, name), as an apiserver keeps them.
#[derive(Clone, Default)]
struct MemorySink {
    stored: Arc<Mutex<HashMap<(String, String), Event>>>,
    sent: Arc<Mutex<Vec<Sent>>>,
    /// Refuse every patch (client-go's `RequestConstructionError` case).
    refuse_patches: bool,
}

fn name_of(event: &Event) -> (String, String) {
    (
        event.metadata.namespace.clone().unwrap_or_default(),
        event.metadata.name.clone().unwrap_or_default(),
    )
}

fn api_error(code: u16, reason: &str) -> kube_client::Error {
    let mut status = kube_client::core::Status::failure("test", reason).with_code(code);
    status.reason = reason.to_owned();
    kube_client::Error::Api(status.boxed())
}

impl EventsV1Sink for MemorySink {
    async fn create(&self, event: &Event) -> Result<(), RecordError> {
        self.sent.lock().push(Sent::Create(event.clone()));
        let (namespace, name) = name_of(event);
        let mut stored = self.stored.lock();
        if stored.contains_key(&(namespace.clone(), name.clone())) {
            return Err(RecordError::Rejected {
                namespace,
                name,
                source: api_error(409, "AlreadyExists"),
            });
        }
        stored.insert((namespace, name), event.clone());
        Ok(())
    }

    async fn patch_series(&self, event: &Event) -> Result<(), RecordError> {
        self.sent.lock().push(Sent::Patch(event.clone()));
        let (namespace, name) = name_of(event);
        if self.refuse_patches {
            return Err(RecordError::Rejected {
                namespace,
                name,
                source: api_error(422, "Invalid"),
            });
        }
        let mut stored = self.stored.lock();
        let Some(existing) = stored.get_mut(&(namespace.clone(), name.clone())) else {
            return Err(RecordError::NotFound { namespace, name });
        };
        existing.series = event.series.clone();
        Ok(())
    }
}

impl MemorySink {
    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().clone()
    }

    fn stored(&self) -> Vec<Event> {
        self.stored.lock().values().cloned().collect()
    }
}

fn pod(name: &str, namespace: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some("12345".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn config(metrics: &EventMetrics) -> EventsV1Config {
    EventsV1Config {
        metrics: Some(metrics.clone()),
        ..EventsV1Config::default()
    }
}

/// Lets the writer task take what is queued.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// Runs `f` with a recorder ("c1", instance "i1") writing to a fresh sink, then shuts down.
async fn recorded(f: impl FnOnce(&EventsV1Recorder)) -> (MemorySink, EventMetrics) {
    let sink = MemorySink::default();
    let metrics = EventMetrics::default();
    let broadcaster = EventsV1Broadcaster::start(sink.clone(), config(&metrics));
    f(&broadcaster.new_recorder_as("c1", "i1"));
    broadcaster.shutdown().await;
    (sink, metrics)
}

// client-go: TestEventf, "normal event", "event with related object and format args".
#[tokio::test]
async fn eventf_normal_event_and_event_with_related_object() {
    let related = object_reference(&pod("bar", "ns2"));
    let (sink, _) = recorded(|r| {
        r.eventf(
            &pod("foo", "ns1"),
            None,
            EventType::Normal,
            "Started",
            "starting",
            "Pod started",
        );
        r.eventf(
            &pod("foo", "ns1"),
            Some(related.clone()),
            EventType::Normal,
            "Started",
            "starting",
            &format!("Pod started {}", 1),
        );
    })
    .await;
    let sent = sink.sent();
    let Sent::Create(first) = &sent[0] else {
        panic!("{sent:?}")
    };
    assert_eq!(first.metadata.namespace.as_deref(), Some("ns1"));
    assert!(first.metadata.name.as_deref().unwrap().starts_with("foo."));
    let regarding = first.regarding.as_ref().unwrap();
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.api_version.as_deref(),
            regarding.uid.as_deref()
        ),
        (Some("Pod"), Some("v1"), Some("12345"))
    );
    assert_eq!(first.type_.as_deref(), Some("Normal"));
    assert_eq!(first.reason.as_deref(), Some("Started"));
    assert_eq!(first.action.as_deref(), Some("starting"));
    assert_eq!(first.note.as_deref(), Some("Pod started"));
    assert_eq!(first.reporting_controller.as_deref(), Some("c1"));
    assert_eq!(first.reporting_instance.as_deref(), Some("i1"));
    assert!(first.event_time.is_some() && first.series.is_none() && first.related.is_none());
    // With a related object the two are not isomorphic: a second Event.
    let Sent::Create(second) = &sent[1] else {
        panic!("{sent:?}")
    };
    assert_eq!(second.related.as_ref(), Some(&related));
    assert_eq!(second.note.as_deref(), Some("Pod started 1"));
    assert_eq!(sent.len(), 2);
}

// client-go: TestEventf, "event with invalid Event name" and "large event name".
#[tokio::test]
async fn eventf_event_with_invalid_event_name_and_large_event_name() {
    let mut address = pod("2001:db8::123", "");
    address.metadata.namespace = None;
    let long = pod(&"x".repeat(253 * 4), "ns1");
    let (sink, _) = recorded(|r| {
        r.eventf(
            &address,
            None,
            EventType::Warning,
            "IPAddressNotAllocated",
            "IPAddressAllocation",
            "leaked",
        );
        r.eventf(
            &long,
            None,
            EventType::Normal,
            "Started",
            "starting",
            "Pod started",
        );
    })
    .await;
    let stored = sink.stored();
    assert_eq!(stored.len(), 2);
    for event in &stored {
        let name = event.metadata.name.as_deref().unwrap();
        assert!(is_dns_subdomain(name), "{name}");
        assert!(uuid::Uuid::parse_str(name).is_ok(), "a random UUID: {name}");
    }
    let namespaces: Vec<_> = stored
        .iter()
        .map(|e| e.metadata.namespace.clone().unwrap())
        .collect();
    assert!(
        namespaces.contains(&"default".to_owned()),
        "cluster-scoped goes to default"
    );
    assert!(namespaces.contains(&"ns1".to_owned()));
}

// client-go: TestEventSeriesf.
#[tokio::test]
async fn event_seriesf() {
    let foo = pod("foo", "baz");
    let (sink, _) = recorded(|r| {
        r.eventf(
            &foo,
            None,
            EventType::Normal,
            "test",
            "started",
            "some verbose message: 1",
        );
        // Isomorphic (the note is not compared): the series starts, written at once.
        r.eventf(
            &foo,
            None,
            EventType::Normal,
            "test",
            "started",
            "another note",
        );
        // Another action: not isomorphic, a new Event.
        r.eventf(
            &foo,
            None,
            EventType::Normal,
            "test",
            "stopped",
            "some verbose message: 1",
        );
    })
    .await;
    let sent = sink.sent();
    assert_eq!(sent.len(), 3, "{sent:?}");
    let (Sent::Create(first), Sent::Patch(series), Sent::Create(other)) =
        (&sent[0], &sent[1], &sent[2])
    else {
        panic!("{sent:?}")
    };
    assert_eq!(series.metadata.name, first.metadata.name);
    assert_eq!(series.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        series.note.as_deref(),
        Some("some verbose message: 1"),
        "the first note stays"
    );
    assert_eq!(other.action.as_deref(), Some("stopped"));
    assert!(other.series.is_none());
}

/// A broadcaster whose cache holds a series last observed `idle` ago (count 10) and a single
/// event of another controller observed now; returns the sink after the writer's timers ran
/// for `run`.
async fn with_cached_series(
    sink: MemorySink,
    config: EventsV1Config,
    idle: Duration,
    run: Duration,
) -> MemorySink {
    let broadcaster = EventsV1Broadcaster::start(sink.clone(), config);
    let recorder = broadcaster.new_recorder_as("eventTest", "eventTest-host");
    let other = broadcaster.new_recorder_as("nonFinished-controller", "eventTest-host");
    let foo = pod("foo", "baz");
    for _ in 0..10 {
        recorder.eventf(
            &foo,
            None,
            EventType::Normal,
            "test",
            "started",
            "some verbose message: 1",
        );
    }
    settle().await;
    tokio::time::advance(idle).await;
    other.eventf(
        &foo,
        None,
        EventType::Normal,
        "test",
        "started",
        "some verbose message: 1",
    );
    settle().await;
    tokio::time::sleep(run).await;
    settle().await;
    drop(broadcaster);
    sink
}

/// A writer on `sink` with the default config, as client-go's tests build a broadcaster
/// around a cache they fill themselves.
fn writer(sink: &MemorySink, metrics: &EventMetrics) -> Writer<MemorySink> {
    Writer {
        sink: sink.clone(),
        cache: HashMap::new(),
        spam: SpamFilter::new(25, Duration::from_secs(300), 16),
        metrics: metrics.clone(),
        config: config(metrics),
    }
}

/// client-go's `makeEvent(regarding, related, now, ..., "test", "some verbose message: 1",
/// reporting_controller, "eventTest-host", "started")`, named and with `series` of `count`
/// last observed at `observed` (wall clock) when `count` is given.
fn cached_event(reporting_controller: &str, count: Option<i32>, observed: Timestamp) -> Event {
    let mut event = Event {
        metadata: ObjectMeta {
            name: Some(format!("foo.{reporting_controller}")),
            namespace: Some("baz".into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(Timestamp::now())),
        regarding: Some(object_reference(&pod("foo", "baz"))),
        reporting_controller: Some(reporting_controller.into()),
        reporting_instance: Some("eventTest-host".into()),
        action: Some("started".into()),
        reason: Some("test".into()),
        note: Some("some verbose message: 1".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    event.series = count.map(|count| EventSeries {
        count,
        last_observed_time: MicroTime(observed),
    });
    event
}

/// Puts `event` in `writer`'s cache as last observed `ago` (tokio's clock), with its count
/// `unwritten` or not; returns its key.
fn cache(writer: &mut Writer<MemorySink>, event: Event, ago: Duration, unwritten: bool) -> String {
    let key = isomorphic_key(&event);
    let observed = Instant::now()
        .checked_sub(ago)
        .expect("tokio's clock is past `ago`");
    writer.cache.insert(
        key.clone(),
        Cached {
            event,
            observed,
            unwritten,
        },
    );
    key
}

/// Moves paused tokio time past the longest `ago` the tests use, so that `now - ago` exists.
async fn past_the_start() {
    tokio::time::advance(Duration::from_secs(3600)).await;
}

// client-go: TestFinishSeries. A series last observed 9 minutes ago (count 10) and another
// controller's single event of now: finishSeries writes the series once, with its
// LastObservedTime, and evicts it; the single event stays. Exactly one cache entry remains.
#[tokio::test(start_paused = true)]
async fn finish_series() {
    past_the_start().await;
    let sink = MemorySink::default();
    let metrics = EventMetrics::default();
    let mut writer = writer(&sink, &metrics);
    let nine_minutes_ago = Timestamp::now() - Duration::from_secs(9 * 60);
    let series = cached_event("eventTest", Some(10), nine_minutes_ago);
    sink.stored.lock().insert(name_of(&series), series.clone());
    let finished = cache(&mut writer, series, Duration::from_secs(9 * 60), true);
    let single = cache(
        &mut writer,
        cached_event("nonFinished-controller", None, Timestamp::now()),
        Duration::ZERO,
        false,
    );
    writer.finish_series(&CancellationToken::new()).await;

    assert_eq!(writer.cache.len(), 1, "the finished series evicted");
    assert!(!writer.cache.contains_key(&finished));
    assert!(writer.cache.contains_key(&single), "the single event kept");
    let sent = sink.sent();
    assert_eq!(sent.len(), 1, "exactly one write: {sent:?}");
    let Sent::Patch(written) = &sent[0] else {
        panic!("the series is patched: {sent:?}")
    };
    let written = written.series.as_ref().unwrap();
    assert_eq!(written.count, 10);
    assert_eq!(
        written.last_observed_time,
        MicroTime(nine_minutes_ago),
        "LastObservedTime kept"
    );
}

// The 6-minute boundary (client-go's `finishTime`, compared with `Before`): an entry last
// observed exactly 6 minutes ago is kept, one observed a millisecond earlier ends.
#[tokio::test(start_paused = true)]
async fn finish_series_ends_what_was_not_observed_for_more_than_six_minutes() {
    past_the_start().await;
    let sink = MemorySink::default();
    let metrics = EventMetrics::default();
    let mut writer = writer(&sink, &metrics);
    let six = Duration::from_secs(6 * 60);
    let just_over = six + Duration::from_millis(1);
    let observed = Timestamp::now() - six;
    let series_at = cache(
        &mut writer,
        cached_event("at", Some(3), observed),
        six,
        true,
    );
    let single_at = cache(
        &mut writer,
        cached_event("single-at", None, observed),
        six,
        false,
    );
    let series_over = cached_event("over", Some(4), observed);
    sink.stored
        .lock()
        .insert(name_of(&series_over), series_over.clone());
    let series_over = cache(&mut writer, series_over, just_over, true);
    let single_over = cache(
        &mut writer,
        cached_event("single-over", None, observed),
        just_over,
        false,
    );
    writer.finish_series(&CancellationToken::new()).await;

    assert!(writer.cache.contains_key(&series_at) && writer.cache.contains_key(&single_at));
    assert!(!writer.cache.contains_key(&series_over) && !writer.cache.contains_key(&single_over));
    assert_eq!(writer.cache.len(), 2);
    // Only the ended series is written (its last count); a single event ends without a write.
    let sent = sink.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        matches!(&sent[0], Sent::Patch(e) if e.reporting_controller.as_deref() == Some("over")),
        "{sent:?}"
    );
}

// Where kubeloop's finishSeries differs from client-go's (series.rs, `finish_series`): a
// series whose last count was written already ends without a write (client-go writes it
// again), and a series whose final write is refused is evicted all the same.
#[tokio::test(start_paused = true)]
async fn a_finished_series_is_written_only_with_an_unwritten_count_and_evicted_even_if_refused() {
    past_the_start().await;
    let metrics = EventMetrics::default();
    let observed = Timestamp::now() - Duration::from_secs(9 * 60);
    let old = Duration::from_secs(9 * 60);

    let sink = MemorySink::default();
    let mut written = writer(&sink, &metrics);
    cache(
        &mut written,
        cached_event("c", Some(5), observed),
        old,
        false,
    );
    written.finish_series(&CancellationToken::new()).await;
    assert!(written.cache.is_empty());
    assert_eq!(sink.sent(), [], "nothing unwritten: no write");

    let refusing = MemorySink {
        refuse_patches: true,
        ..MemorySink::default()
    };
    let mut refused = writer(&refusing, &metrics);
    cache(
        &mut refused,
        cached_event("c", Some(5), observed),
        old,
        true,
    );
    refused.finish_series(&CancellationToken::new()).await;
    assert_eq!(refusing.sent().len(), 1, "one write, refused");
    assert_eq!(metrics.dropped_for(EventDropReason::refused), 1);
    assert!(refused.cache.is_empty(), "evicted although refused");
}

// client-go: TestRefreshExistingEventSeries. A series (count 10, last observed 9 minutes
// ago) is patched once by refreshExistingEventSeries, and stays in the cache whether the
// apiserver took the patch or refused it.
#[tokio::test(start_paused = true)]
async fn refresh_existing_event_series() {
    past_the_start().await;
    for refuse_patches in [false, true] {
        let metrics = EventMetrics::default();
        let sink = MemorySink {
            refuse_patches,
            ..MemorySink::default()
        };
        let mut writer = writer(&sink, &metrics);
        let series = cached_event(
            "eventTest",
            Some(10),
            Timestamp::now() - Duration::from_secs(9 * 60),
        );
        sink.stored.lock().insert(name_of(&series), series.clone());
        let key = cache(&mut writer, series, Duration::from_secs(9 * 60), true);
        writer.refresh_series(&CancellationToken::new()).await;

        let sent = sink.sent();
        assert_eq!(
            sent.len(),
            1,
            "exactly one write (refused: {refuse_patches}): {sent:?}"
        );
        assert!(matches!(&sent[0], Sent::Patch(_)), "{sent:?}");
        assert_eq!(writer.cache.len(), 1, "refused: {refuse_patches}");
        let cached = writer
            .cache
            .get(&key)
            .expect("the series stays in the cache");
        assert_eq!(cached.event.series.as_ref().map(|s| s.count), Some(10));
        // A refused heartbeat leaves the count unwritten: it is written when the series ends.
        assert_eq!(cached.unwritten, refuse_patches);
        assert_eq!(
            metrics.dropped_for(EventDropReason::refused),
            u64::from(refuse_patches)
        );
    }
}

// The finish and refresh timers end to end: a series last observed at 0 and another
// controller's single event at 5 minutes; the check at 6 minutes ends neither, the one at
// 12 minutes both (one write: the series' final count).
#[tokio::test(start_paused = true)]
async fn the_finish_timer_ends_series_every_six_minutes() {
    let metrics = EventMetrics::default();
    let sink = with_cached_series(
        MemorySink::default(),
        config(&metrics),
        Duration::from_secs(5 * 60),
        Duration::from_secs(8 * 60),
    )
    .await;
    let sent = sink.sent();
    // create, series of 2, then (12 min) the final count; the other controller's single
    // event is created once and later forgotten without a write.
    let patches: Vec<i32> = sent
        .iter()
        .filter_map(|s| match s {
            Sent::Patch(e) => e.series.as_ref().map(|s| s.count),
            Sent::Create(_) => None,
        })
        .collect();
    assert_eq!(patches, [2, 10], "{sent:?}");
    let series = sink
        .stored()
        .into_iter()
        .find(|e| e.reporting_controller.as_deref() == Some("eventTest"))
        .unwrap();
    assert_eq!(series.series.map(|s| s.count), Some(10));
}

// The heartbeat timer end to end: a patch the apiserver takes, and one it refuses.
#[tokio::test(start_paused = true)]
async fn the_refresh_timer_writes_open_series_again() {
    for refuse_patches in [false, true] {
        let metrics = EventMetrics::default();
        let sink = MemorySink {
            refuse_patches,
            ..MemorySink::default()
        };
        let config = EventsV1Config {
            refresh_every: Duration::from_secs(60),
            finish_after: Duration::from_secs(3600),
            ..config(&metrics)
        };
        let sink = with_cached_series(sink, config, Duration::ZERO, Duration::from_secs(90)).await;
        let patches = sink
            .sent()
            .iter()
            .filter(|s| matches!(s, Sent::Patch(e) if e.reporting_controller.as_deref() == Some("eventTest")))
            .count();
        // The series' start (count 2), then the heartbeat at 60 s, refused or not.
        assert_eq!(patches, 2, "refused: {refuse_patches}");
        assert_eq!(
            metrics.dropped_for(EventDropReason::refused),
            if refuse_patches { 2 } else { 0 }
        );
    }
}

// client-go: TestRecordEventToSink, its four cases, against a sink that keeps Events.
#[tokio::test]
async fn record_event_to_sink() {
    let single = Event {
        metadata: ObjectMeta {
            name: Some("test".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut isomorphic = single.clone();
    isomorphic.series = Some(EventSeries {
        count: 2,
        last_observed_time: MicroTime(Timestamp::now()),
    });
    let cases = [
        ("record one Event", vec![single.clone()], &single),
        (
            "record one Event followed by an isomorphic one",
            vec![single.clone(), isomorphic.clone()],
            &isomorphic,
        ),
        (
            "record one isomorphic Event before the original",
            vec![isomorphic.clone(), single.clone()],
            &isomorphic,
        ),
        (
            "record one isomorphic Event without one already existing",
            vec![isomorphic.clone()],
            &isomorphic,
        ),
    ];
    for (name, events, expected) in cases {
        let sink = MemorySink::default();
        let writer = Writer {
            sink: sink.clone(),
            cache: HashMap::new(),
            spam: SpamFilter::new(25, Duration::from_secs(300), 16),
            metrics: EventMetrics::default(),
            config: EventsV1Config::default(),
        };
        for event in &events {
            let _ = writer.write(event).await;
        }
        assert_eq!(sink.stored(), std::slice::from_ref(expected), "{name}");
    }
}

/// A Foo's reconcile failing the same way 1,000 times: one Event, created, its series started
/// (2 writes), then counted in memory; shutdown writes the last count. Nothing dropped.
#[tokio::test]
async fn a_thousand_repeats_write_three_times_and_count_every_one() {
    let (sink, metrics) = recorded(|r| {
        for i in 0..1000 {
            r.eventf(
                &pod("foo", "ns"),
                None,
                EventType::Warning,
                "SyncFailed",
                "Sync",
                &format!("try {i}"),
            );
        }
    })
    .await;
    assert_eq!(
        sink.sent().len(),
        3,
        "create, series of 2, the last count at shutdown"
    );
    let stored = sink.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].series.as_ref().map(|s| s.count), Some(1000));
    assert_eq!(
        (metrics.writes_for("create"), metrics.writes_for("patch")),
        (1, 2)
    );
    assert_eq!(metrics.dropped_for(EventDropReason::spam), 0);
}

/// A loop that varies its reason starts a new Event each time: 25 about one object, then the
/// budget refills one per 5 minutes; other objects have budgets of their own.
#[tokio::test(start_paused = true)]
async fn the_spam_budget_caps_new_events_per_object_and_counts_what_it_drops() {
    let sink = MemorySink::default();
    let metrics = EventMetrics::default();
    let broadcaster = EventsV1Broadcaster::start(sink.clone(), config(&metrics));
    let recorder = broadcaster.new_recorder_as("c1", "i1");
    let burst = |object: &ConfigMap, from: usize| {
        for i in from..from + 30 {
            recorder.eventf(
                object,
                None,
                EventType::Warning,
                &format!("Reason{i}"),
                "Sync",
                "x",
            );
            recorder.eventf(
                object,
                None,
                EventType::Warning,
                &format!("Reason{i}"),
                "Sync",
                "again",
            );
        }
    };
    let cm = |name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    burst(&cm("hot"), 0);
    burst(&cm("other"), 0);
    settle().await;
    // Reasons 25 to 29 of each object, each twice (a dropped event leaves no Event for its
    // repeat to count on).
    assert_eq!(metrics.dropped_for(EventDropReason::spam), 20);
    tokio::time::advance(Duration::from_secs(300)).await;
    burst(&cm("hot"), 100);
    settle().await;
    broadcaster.shutdown().await;
    let created = |name: &str| {
        sink.stored()
            .iter()
            .filter(|e| e.regarding.as_ref().unwrap().name.as_deref() == Some(name))
            .count()
    };
    assert_eq!((created("hot"), created("other")), (26, 25));
    assert_eq!(metrics.dropped_for(EventDropReason::spam), 20 + 29 * 2);
    // Each admitted Event's repeat started its series: nothing of a repeat is dropped.
    assert!(
        sink.stored()
            .iter()
            .all(|e| e.series.as_ref().map(|s| s.count) == Some(2))
    );
}

#[test]
fn the_note_is_cut_to_the_api_limit_on_a_character_boundary() {
    assert_eq!(limit_note("short"), "short");
    let long = "é".repeat(NOTE_LENGTH_LIMIT);
    let cut = limit_note(&long);
    assert!(cut.len() <= NOTE_LENGTH_LIMIT && cut.len() >= NOTE_LENGTH_LIMIT - 1);
    assert!(long.starts_with(cut));
}

#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let sink = MemorySink::default();
    let metrics = EventMetrics::default();
    let broadcaster = EventsV1Broadcaster::start(
        sink.clone(),
        EventsV1Config {
            queue_size: 2,
            ..config(&metrics)
        },
    );
    let recorder = broadcaster.new_recorder_as("c1", "i1");
    // The writer task has not run yet: the third waits for a slot that never comes.
    for i in 0..3 {
        recorder.eventf(
            &pod(&format!("p{i}"), "ns"),
            None,
            EventType::Normal,
            "R",
            "A",
            "n",
        );
    }
    assert_eq!(metrics.dropped_for(EventDropReason::queue_full), 1);
    broadcaster.shutdown().await;
    assert_eq!(sink.stored().len(), 2);
}
