//! Turning a stream of events into writes: client-go `tools/record/events_cache.go`
//! (`EventCorrelator`, its `eventLogger` and `EventSourceObjectSpamFilter`).
//!
//! - Repeats: an event equal to an earlier one in everything but its timestamps (same source,
//!   involved object, type, reason and message) becomes a [`Write::Patch`] of the earlier
//!   Event's name with `count + 1` and a new `lastTimestamp`, keeping its `firstTimestamp`.
//!   client-go: `eventLogger.eventObserve`.
//! - Spam: each source + involved object has a token bucket (burst 25, one token per 5 minutes);
//!   an event arriving with the bucket empty is dropped. client-go:
//!   `EventSourceObjectSpamFilter` with its defaults.
//!
//! Differs on purpose: client-go's `EventAggregator` (folding ten events that differ only in
//! message into one "(combined from similar events)" Event) is not implemented; every distinct
//! message is its own Event.
//!
//! Invariants: `seen` holds at most `cache_size` entries (least recently used evicted first,
//! like client-go's LRU of 4096); `tick` grows on every use, so the smallest `used` is the
//! least recently used entry.

use std::collections::HashMap;
use std::time::Duration;

use super::spam::{SpamFilter, evict_oldest};
use k8s_openapi::api::core::v1::Event;
use tokio::time::Instant;

/// Limits of an [`EventCorrelator`]; the defaults are client-go's.
#[derive(Debug, Clone)]
pub struct CorrelatorConfig {
    /// How many distinct events are remembered for counting repeats (client-go
    /// `maxLruCacheEntries` = 4096).
    pub cache_size: usize,
    /// Events a source may emit about one object in a burst (client-go
    /// `defaultSpamBurst` = 25).
    pub spam_burst: u32,
    /// One more event is allowed per this period once the burst is spent (client-go
    /// `defaultSpamQPS` = 1/300, one per 5 minutes).
    pub spam_refill: Duration,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        CorrelatorConfig {
            cache_size: 4096,
            spam_burst: 25,
            spam_refill: Duration::from_secs(300),
        }
    }
}

/// What to send to the apiserver for one recorded event.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A new Event (count 1).
    Create(Event),
    /// A repeat: patch `count`, `lastTimestamp` and `message` of the existing Event named in
    /// the metadata; if it is gone, create this Event instead.
    Patch(Event),
}

impl Write {
    /// The Event to write.
    pub fn event(&self) -> &Event {
        match self {
            Write::Create(e) | Write::Patch(e) => e,
        }
    }
}

/// Remembers recent events to count repeats and drop spam. Single-threaded: the broadcaster's
/// writer task owns it.
#[derive(Debug)]
pub struct EventCorrelator {
    config: CorrelatorConfig,
    seen: HashMap<String, Seen>,
    spam: SpamFilter,
    tick: u64,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    first_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    used: u64,
}

impl EventCorrelator {
    /// An empty correlator.
    pub fn new(config: CorrelatorConfig) -> Self {
        EventCorrelator {
            spam: SpamFilter::new(config.spam_burst, config.spam_refill, config.cache_size),
            config,
            seen: HashMap::new(),
            tick: 0,
        }
    }

    /// Decides what to write for `event` observed at `now`; `None` if the spam filter drops it.
    /// client-go: `EventCorrelator.EventCorrelate`.
    pub fn correlate(&mut self, mut event: Event, now: Instant) -> Option<Write> {
        self.tick += 1;
        let tick = self.tick;
        if !self.spam.allow(spam_key(&event), now) {
            return None;
        }
        let key = event_key(&event);
        match self.seen.get_mut(&key) {
            Some(seen) => {
                seen.count += 1;
                seen.used = tick;
                event.metadata.name = Some(seen.name.clone());
                event.count = Some(seen.count);
                event.first_timestamp = seen.first_timestamp.clone();
                Some(Write::Patch(event))
            }
            None => {
                let seen = Seen {
                    name: event.metadata.name.clone().unwrap_or_default(),
                    count: event.count.unwrap_or(1),
                    first_timestamp: event.first_timestamp.clone(),
                    used: tick,
                };
                self.insert_seen(key, seen);
                Some(Write::Create(event))
            }
        }
    }

    /// Records what the apiserver holds after a write (its name and count), so the next repeat
    /// patches the right Event. client-go: `EventCorrelator.UpdateState`.
    pub fn update_state(&mut self, written: &Event) {
        self.tick += 1;
        let tick = self.tick;
        let key = event_key(written);
        let seen = Seen {
            name: written.metadata.name.clone().unwrap_or_default(),
            count: written.count.unwrap_or(1),
            first_timestamp: written.first_timestamp.clone(),
            used: tick,
        };
        self.insert_seen(key, seen);
    }

    /// How many distinct events are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn insert_seen(&mut self, key: String, seen: Seen) {
        if !self.seen.contains_key(&key) && self.seen.len() >= self.config.cache_size.max(1) {
            evict_oldest(&mut self.seen, |s| s.used);
        }
        self.seen.insert(key, seen);
    }
}

/// Everything that makes two events "the same" apart from time. client-go: `getEventKey`
/// (joined with a separator that cannot appear in names, where client-go joins with "").
fn event_key(event: &Event) -> String {
    let source = event.source.clone().unwrap_or_default();
    let obj = &event.involved_object;
    [
        source.component.as_deref().unwrap_or(""),
        source.host.as_deref().unwrap_or(""),
        obj.kind.as_deref().unwrap_or(""),
        obj.namespace.as_deref().unwrap_or(""),
        obj.name.as_deref().unwrap_or(""),
        obj.field_path.as_deref().unwrap_or(""),
        obj.uid.as_deref().unwrap_or(""),
        obj.api_version.as_deref().unwrap_or(""),
        event.type_.as_deref().unwrap_or(""),
        event.reason.as_deref().unwrap_or(""),
        event.message.as_deref().unwrap_or(""),
    ]
    .join("\u{0}")
}

/// Source and involved object: the spam filter's unit. client-go: `getSpamKey`.
fn spam_key(event: &Event) -> String {
    let source = event.source.clone().unwrap_or_default();
    let obj = &event.involved_object;
    [
        source.component.as_deref().unwrap_or(""),
        source.host.as_deref().unwrap_or(""),
        obj.kind.as_deref().unwrap_or(""),
        obj.namespace.as_deref().unwrap_or(""),
        obj.name.as_deref().unwrap_or(""),
        obj.uid.as_deref().unwrap_or(""),
        obj.api_version.as_deref().unwrap_or(""),
    ]
    .join("\u{0}")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube_client::core::ObjectMeta;

    use super::*;

    fn event(obj: &str, reason: &str, message: &str, name: &str, at_secs: i64) -> Event {
        let t = Time(Timestamp::from_second(1_700_000_000 + at_secs).unwrap());
        Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Foo".into()),
                namespace: Some("ns".into()),
                name: Some(obj.into()),
                uid: Some(format!("uid-{obj}")),
                api_version: Some("samplecontroller.k8s.io/v1alpha1".into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            source: Some(EventSource {
                component: Some("sample-controller".into()),
                host: None,
            }),
            first_timestamp: Some(t.clone()),
            last_timestamp: Some(t),
            count: Some(1),
            ..Default::default()
        }
    }

    // client-go: TestEventCorrelator ("the-same-event-should-just-count")
    #[test]
    fn a_repeated_event_patches_the_first_one_with_a_higher_count() {
        let mut c = EventCorrelator::new(CorrelatorConfig::default());
        let now = Instant::now();
        let first = c
            .correlate(event("a", "Synced", "ok", "a.1", 0), now)
            .unwrap();
        assert!(matches!(first, Write::Create(_)));
        let second = c
            .correlate(event("a", "Synced", "ok", "a.2", 5), now)
            .unwrap();
        let Write::Patch(e) = second else {
            panic!("want a patch, got {second:?}")
        };
        assert_eq!(
            e.metadata.name.as_deref(),
            Some("a.1"),
            "patches the Event created first"
        );
        assert_eq!(e.count, Some(2));
        assert_eq!(
            e.first_timestamp,
            first.event().first_timestamp,
            "first timestamp kept"
        );
        assert_eq!(
            e.last_timestamp,
            event("a", "Synced", "ok", "x", 5).last_timestamp,
            "last timestamp moves"
        );
        let third = c
            .correlate(event("a", "Synced", "ok", "a.3", 9), now)
            .unwrap();
        assert_eq!(third.event().count, Some(3));
    }

    // client-go: TestEventCorrelator ("the-same-reason-different-message")
    #[test]
    fn events_that_differ_in_reason_message_or_object_are_separate() {
        let mut c = EventCorrelator::new(CorrelatorConfig::default());
        let now = Instant::now();
        for (obj, reason, message) in [
            ("a", "Synced", "ok"),
            ("a", "Synced", "other"),
            ("a", "Failed", "ok"),
            ("b", "Synced", "ok"),
        ] {
            let w = c
                .correlate(
                    event(
                        obj,
                        reason,
                        message,
                        &format!("{obj}.{reason}.{message}"),
                        0,
                    ),
                    now,
                )
                .unwrap();
            assert!(
                matches!(w, Write::Create(_)),
                "{obj} {reason} {message} is new"
            );
        }
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn update_state_makes_the_next_repeat_patch_the_written_event() {
        let mut c = EventCorrelator::new(CorrelatorConfig::default());
        let now = Instant::now();
        c.correlate(event("a", "Synced", "ok", "a.1", 0), now)
            .unwrap();
        // The first Event was gone, so the writer created it again as "a.9" with count 1.
        let mut recreated = event("a", "Synced", "ok", "a.9", 3);
        recreated.count = Some(1);
        c.update_state(&recreated);
        let w = c
            .correlate(event("a", "Synced", "ok", "a.10", 4), now)
            .unwrap();
        assert_eq!(w.event().metadata.name.as_deref(), Some("a.9"));
        assert_eq!(w.event().count, Some(2));
    }

    // client-go: TestSpamFilter / TestEventCorrelator ("events-from-the-same-source-are-rate-limited")
    #[test]
    fn a_source_spamming_one_object_is_cut_off_after_the_burst_and_refilled_over_time() {
        let mut c = EventCorrelator::new(CorrelatorConfig {
            spam_burst: 3,
            spam_refill: Duration::from_secs(10),
            ..Default::default()
        });
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(
                c.correlate(event("a", "R", &format!("m{i}"), "n", 0), t0)
                    .is_some(),
                "event {i} within the burst"
            );
        }
        assert!(
            c.correlate(event("a", "R", "m3", "n", 0), t0).is_none(),
            "burst spent"
        );
        assert!(
            c.correlate(event("b", "R", "m0", "n", 0), t0).is_some(),
            "another object has its own bucket"
        );
        assert!(
            c.correlate(event("a", "R", "m4", "n", 0), t0 + Duration::from_secs(9))
                .is_none()
        );
        assert!(
            c.correlate(event("a", "R", "m5", "n", 0), t0 + Duration::from_secs(11))
                .is_some(),
            "one token back after 10 s"
        );
    }

    #[test]
    fn the_cache_forgets_the_least_recently_used_event_when_full() {
        let mut c = EventCorrelator::new(CorrelatorConfig {
            cache_size: 2,
            ..Default::default()
        });
        let now = Instant::now();
        c.correlate(event("a", "R", "m", "a.1", 0), now);
        c.correlate(event("b", "R", "m", "b.1", 0), now);
        c.correlate(event("a", "R", "m", "a.2", 0), now); // a is now the most recent
        c.correlate(event("c", "R", "m", "c.1", 0), now); // evicts b
        assert_eq!(c.len(), 2);
        assert!(matches!(
            c.correlate(event("a", "R", "m", "a.3", 0), now),
            Some(Write::Patch(_))
        ));
        assert!(
            matches!(
                c.correlate(event("b", "R", "m", "b.2", 0), now),
                Some(Write::Create(_))
            ),
            "b was forgotten"
        );
    }
}
