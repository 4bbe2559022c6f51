//! One object's journey through a running controller, stage by stage, with the time each took.
//!
//! No counterpart in client-go, controller-runtime or kube-runtime: there a learner adds print
//! statements. Here a process names the keys it wants followed ([`follow`]; the controllers'
//! `--trace ns/name` flag), and every layer records a [`Step`] for them: the reflector when a
//! watch event arrives, the FIFO when it queues and pops the object, the informer when it
//! stores it in the indexer and hands it to each handler, the workqueue when the key is added
//! (or deduplicated, delayed, rate-limited), the controller runtime when a worker takes the key
//! and when its reconcile starts and ends, and the controllers when they write a status (and
//! the VM controller when it adds or removes its finalizer). The
//! steps of one key are kept in a ring of [`RING_CAPACITY`]; [`timeline`] reads them and
//! [`render`] prints them as a table. The ops server serves them on `/debug/trace?key=ns/name`
//! and `kubeloop trace` prints them; the journey page (`/debug/journey`, `kubeloop trace
//! --serve`) draws them, polling [`steps_since`]: every step gets a process-wide number as it
//! is recorded, so a reader asks only for those it has not seen.
//!
//! Keys are `namespace/name` (or `name` for cluster-scoped objects), the informers' and the
//! workqueue's key: a Deployment owned by a Foo of the same name shows up in that Foo's trace,
//! which is the journey a controller sees.
//!
//! # Cost when nothing is traced
//! Every hook starts with [`on`], one relaxed load of a process-wide `AtomicBool` that stays
//! false until [`follow`] is called; the key is not even computed. `benches/cache.rs`
//! (`informer_watch_event_to_workqueue_1000`) and `benches/workqueue.rs` measure the paths
//! that carry hooks.
//!
//! Invariants: [`on`] is true iff at least one key is followed; only followed keys have a
//! ring; a ring never holds more than [`RING_CAPACITY`] steps (the oldest go first); step
//! numbers increase along each ring, and every number below `Rings::next` is taken.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Steps kept per followed key; older ones are dropped.
pub const RING_CAPACITY: usize = 512;

/// Where in the machinery a [`Step`] was recorded, in the order an object passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The reflector received a watch event (or a listed object) for the key.
    WatchEvent,
    /// The informer's FIFO queued a delta for the key.
    FifoQueued,
    /// The informer popped the key's delta from the FIFO.
    FifoPopped,
    /// The informer wrote the object to (or removed it from) its indexer.
    IndexerStored,
    /// A handler was called with the key's notification.
    HandlerDelivered,
    /// The key went into a workqueue's line (it was not there yet).
    QueueAdded,
    /// The key was added to a workqueue that had it queued already: merged into one item.
    QueueDeduplicated,
    /// The key was added while a worker processes it: it runs again after `done`.
    QueueWhileProcessing,
    /// The key was put in the workqueue's waiting heap for a fixed delay (`add_after`).
    QueueDelayed,
    /// The key was put back with the rate limiter's delay (`add_rate_limited`).
    QueueRateLimited,
    /// A worker took the key from the workqueue.
    WorkerTook,
    /// The worker held the key until its caches held its last writes, or gave up waiting
    /// (read-your-writes, `runtime/freshness.rs`).
    FreshnessHeld,
    /// The reconcile function was called for the key.
    ReconcileStarted,
    /// The reconcile function returned (the detail says how).
    ReconcileFinished,
    /// A controller wrote the object's status.
    StatusWritten,
    /// A controller sent a change of the object's finalizers.
    FinalizerWritten,
}

impl Stage {
    /// A short human name, as [`render`] prints it.
    pub fn label(self) -> &'static str {
        match self {
            Stage::WatchEvent => "watch event",
            Stage::FifoQueued => "fifo queued",
            Stage::FifoPopped => "fifo popped",
            Stage::IndexerStored => "indexer stored",
            Stage::HandlerDelivered => "handler called",
            Stage::QueueAdded => "workqueue add",
            Stage::QueueDeduplicated => "workqueue dedup",
            Stage::QueueWhileProcessing => "workqueue add (busy)",
            Stage::QueueDelayed => "workqueue add_after",
            Stage::QueueRateLimited => "workqueue rate-limited",
            Stage::WorkerTook => "worker took key",
            Stage::FreshnessHeld => "held for freshness",
            Stage::ReconcileStarted => "reconcile started",
            Stage::ReconcileFinished => "reconcile finished",
            Stage::StatusWritten => "status written",
            Stage::FinalizerWritten => "finalizer patch",
        }
    }
}

/// One recorded moment of a key's journey.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Microseconds since the Unix epoch (wall clock, for reading).
    pub at_unix_micros: u64,
    /// Microseconds since tracing began in this process (monotonic, for the differences).
    pub mono_micros: u64,
    /// The stage.
    pub stage: Stage,
    /// The object type (`Foo`, `Deployment`) for informer stages; empty for queue stages.
    pub kind: String,
    /// What happened, e.g. `MODIFIED rv=1234` or `success in 3.1ms`.
    pub detail: String,
}

struct Recorder {
    started: Instant,
    rings: Mutex<Rings>,
}

/// The followed keys' rings, and the number the next step recorded (of any key) gets: steps
/// are numbered in the order they were recorded, so a reader that has seen up to `n` asks
/// for the steps numbered `n` and later ([`steps_since`]).
#[derive(Default)]
struct Rings {
    by_key: HashMap<String, VecDeque<(u64, Step)>>,
    next: u64,
}

/// The steps of the followed keys recorded since a given step number ([`steps_since`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepsSince {
    /// The number the next recorded step will get: ask for the steps since this next time.
    pub next: u64,
    /// Each followed key (sorted, at most the number asked for) and its new steps, oldest
    /// first; a key with none has an empty list.
    pub keys: Vec<KeySteps>,
    /// How many followed keys were left out by the cap.
    pub more_keys: usize,
}

/// One key's steps in a [`StepsSince`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeySteps {
    /// The key, `namespace/name`.
    pub key: String,
    /// Its steps, oldest first.
    pub steps: Vec<Step>,
}

static ON: AtomicBool = AtomicBool::new(false);
static RECORDER: OnceLock<Recorder> = OnceLock::new();

/// Whether any key is followed: the check every hook makes first, one relaxed atomic load.
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// A key [`follow`] refuses.
#[derive(Debug, thiserror::Error)]
#[error("cannot trace {key:?}: {problem}")]
pub struct TraceKeyError {
    /// The key as given.
    pub key: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Starts recording the steps of `keys` (`namespace/name`, or `name` for a cluster-scoped
/// object) in this process. Keys already followed keep their steps.
pub fn follow<S: AsRef<str>>(keys: impl IntoIterator<Item = S>) -> Result<(), TraceKeyError> {
    let keys: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_string()).collect();
    for key in &keys {
        let problem = if key.is_empty() {
            Some("the key is empty; give namespace/name")
        } else if key.matches('/').count() > 1 {
            Some("a key is namespace/name (one '/') or a cluster-scoped name")
        } else if key.starts_with('/') || key.ends_with('/') {
            Some("the namespace or the name is empty")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(TraceKeyError {
                key: key.clone(),
                problem,
            });
        }
    }
    if keys.is_empty() {
        return Ok(());
    }
    let recorder = RECORDER.get_or_init(|| Recorder {
        started: Instant::now(),
        rings: Mutex::new(Rings::default()),
    });
    let mut rings = recorder.rings.lock();
    for key in keys {
        rings.by_key.entry(key).or_default();
    }
    ON.store(true, Ordering::Relaxed);
    Ok(())
}

/// The keys being followed, sorted.
pub fn followed() -> Vec<String> {
    let Some(recorder) = RECORDER.get() else {
        return vec![];
    };
    let mut keys: Vec<String> = recorder.rings.lock().by_key.keys().cloned().collect();
    keys.sort();
    keys
}

/// Whether `key` is followed (false while nothing is, without taking the lock).
pub fn is_followed(key: &str) -> bool {
    on() && RECORDER
        .get()
        .is_some_and(|r| r.rings.lock().by_key.contains_key(key))
}

/// Records a step for `key` if it is followed; `detail` runs only then. Call it behind
/// [`on`] when computing `key` costs anything.
#[inline]
pub fn record(key: &str, stage: Stage, kind: &str, detail: impl FnOnce() -> String) {
    if on() {
        record_slow(key, stage, kind, detail);
    }
}

#[cold]
fn record_slow(key: &str, stage: Stage, kind: &str, detail: impl FnOnce() -> String) {
    let Some(recorder) = RECORDER.get() else {
        return;
    };
    let mut rings = recorder.rings.lock();
    let number = rings.next;
    let Some(ring) = rings.by_key.get_mut(key) else {
        return;
    };
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    push_numbered(
        ring,
        number,
        Step {
            at_unix_micros: wall.as_micros() as u64,
            mono_micros: recorder.started.elapsed().as_micros() as u64,
            stage,
            kind: kind.to_string(),
            detail: detail(),
        },
    );
    rings.next = number + 1;
}

/// Records a status write of a followed key: `summary` of what was written, the kind, and the
/// resourceVersion it produced (an update that changed nothing gets no new version).
pub fn status_written(
    key: &str,
    kind: &str,
    before: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    after: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    summary: impl FnOnce() -> String,
) {
    if !on() {
        return;
    }
    let rv = after.resource_version.as_deref().unwrap_or("");
    let unchanged = before.resource_version.as_deref() == Some(rv);
    record(key, Stage::StatusWritten, kind, || {
        let note = if unchanged {
            " (unchanged: no new version)"
        } else {
            ""
        };
        format!("{} rv={rv}{note}", summary())
    });
}

/// Now on the clock of [`Step::mono_micros`] (`None` before the first [`follow`]): for
/// placing what another observer saw among a key's steps.
pub fn now_micros() -> Option<u64> {
    RECORDER
        .get()
        .map(|r| r.started.elapsed().as_micros() as u64)
}

/// The recorded steps of `key`, oldest first; `None` if the key is not followed.
pub fn timeline(key: &str) -> Option<Vec<Step>> {
    let recorder = RECORDER.get()?;
    let rings = recorder.rings.lock();
    rings
        .by_key
        .get(key)
        .map(|ring| ring.iter().map(|(_, step)| step.clone()).collect())
}

/// Adds step number `number` to a key's ring, dropping its oldest once it holds
/// [`RING_CAPACITY`]: how the recorder keeps each key, and how a reader that merges several
/// processes' steps (`kubeloop trace --serve`) keeps its own.
pub fn push_numbered(ring: &mut VecDeque<(u64, Step)>, number: u64, step: Step) {
    if ring.len() == RING_CAPACITY {
        ring.pop_front();
    }
    ring.push_back((number, step));
}

/// The steps of a numbered ring from number `since` on, oldest first: what [`steps_since`]
/// gives each key.
pub fn numbered_since(ring: &VecDeque<(u64, Step)>, since: u64) -> Vec<Step> {
    let skip = ring.partition_point(|(n, _)| *n < since);
    ring.iter().skip(skip).map(|(_, s)| s.clone()).collect()
}

/// The steps numbered `since` and later of the followed keys (only `key` if given; `None` if
/// that key is not followed), at most `max_keys` keys in key order: what a page that polls
/// asks for. `since` 0 is every step still in the rings.
pub fn steps_since(since: u64, key: Option<&str>, max_keys: usize) -> Option<StepsSince> {
    let Some(recorder) = RECORDER.get() else {
        return key.is_none().then(StepsSince::default);
    };
    let rings = recorder.rings.lock();
    let mut names: Vec<&String> = match key {
        Some(key) => vec![rings.by_key.get_key_value(key)?.0],
        None => rings.by_key.keys().collect(),
    };
    names.sort();
    let more_keys = names.len().saturating_sub(max_keys);
    let keys = names
        .into_iter()
        .take(max_keys)
        .map(|name| KeySteps {
            key: name.clone(),
            steps: numbered_since(&rings.by_key[name], since),
        })
        .collect();
    Some(StepsSince {
        next: rings.next,
        keys,
        more_keys,
    })
}

/// The last segment of a Rust type name: `Foo` for `kubeloop::controller::sample::Foo`.
pub fn short_type_name<K>() -> &'static str {
    let full = std::any::type_name::<K>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// `steps` as a table: wall-clock time, time since the previous step, time since the watch
/// event that began the journey, the stage, the kind and the detail. A new journey begins at
/// each watch event that follows a finished reconcile (or at the first step).
pub fn render(key: &str, steps: &[Step]) -> String {
    let mut out = String::new();
    if steps.is_empty() {
        let _ = writeln!(
            out,
            "{key}: followed, no step recorded yet (no event for it has reached this process)"
        );
        return out;
    }
    let _ = writeln!(out, "trace of {key}: {} steps", steps.len());
    let _ = writeln!(
        out,
        "{:<15} {:>10} {:>10}  {:<22} {:<16} detail",
        "time (UTC)", "+prev", "+journey", "stage", "kind"
    );
    let mut journey_start = steps[0].mono_micros;
    let mut prev = steps[0].mono_micros;
    let mut finished = false;
    for (i, step) in steps.iter().enumerate() {
        if i > 0 && step.stage == Stage::WatchEvent && finished {
            journey_start = step.mono_micros;
            finished = false;
            out.push('\n');
        }
        if step.stage == Stage::ReconcileFinished {
            finished = true;
        }
        let since_prev = if i == 0 {
            "-".to_string()
        } else {
            duration(step.mono_micros.saturating_sub(prev))
        };
        let _ = writeln!(
            out,
            "{:<15} {:>10} {:>10}  {:<22} {:<16} {}",
            clock(step.at_unix_micros),
            since_prev,
            duration(step.mono_micros.saturating_sub(journey_start)),
            step.stage.label(),
            step.kind,
            step.detail
        );
        prev = step.mono_micros;
    }
    out
}

/// `HH:MM:SS.mmmmmm` of a Unix time in microseconds (UTC).
fn clock(unix_micros: u64) -> String {
    let secs = unix_micros / 1_000_000;
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        unix_micros % 1_000_000
    )
}

/// A duration in the unit that reads best: `850µs`, `12.3ms`, `1.52s`.
fn duration(micros: u64) -> String {
    let d = Duration::from_micros(micros);
    if micros < 1000 {
        format!("{micros}µs")
    } else if micros < 1_000_000 {
        format!("{:.1}ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

/// How an item type other than a string shows itself as a key ([`key_type`]): `Some(key)`
/// for an item of that type, `None` for any other.
pub type KeyView = fn(&dyn std::any::Any) -> Option<&str>;

/// Item types registered with [`key_type`], looked at only while some key is followed.
static KEY_TYPES: Mutex<Vec<KeyView>> = Mutex::new(Vec::new());

/// Lets the workqueue trace items of a type other than a string without this module knowing
/// the type: `view` downcasts an item and hands out its key text. The runtime's `ObjectKey`
/// registers itself so; a program whose queues hold a key type of its own does the same.
/// Registering the same view again changes nothing.
///
/// # Examples
/// ```
/// use kubeloop::trace;
/// use kubeloop::workqueue::Queue;
///
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct Key(String);
///
/// trace::key_type(|any| any.downcast_ref::<Key>().map(|k| k.0.as_str()));
/// trace::follow(["default/db"]).unwrap();
/// let queue = Queue::new();
/// queue.add(Key("default/db".to_string()));
/// let steps = trace::timeline("default/db").unwrap();
/// assert_eq!(steps[0].stage, trace::Stage::QueueAdded);
/// ```
pub fn key_type(view: KeyView) {
    let mut views = KEY_TYPES.lock();
    if !views.iter().any(|v| std::ptr::fn_addr_eq(*v, view)) {
        views.push(view);
    }
}

/// The workqueue's view of an item as a key: `String`, `&'static str` and `Arc<str>` items
/// are keys, and items of a type registered with [`key_type`]; any other item type is never
/// traced.
pub(crate) fn item_key<T: 'static>(item: &T) -> Option<&str> {
    let any = item as &dyn std::any::Any;
    if let Some(s) = any.downcast_ref::<String>() {
        return Some(s);
    }
    if let Some(s) = any.downcast_ref::<&'static str>() {
        return Some(s);
    }
    if let Some(s) = any.downcast_ref::<std::sync::Arc<str>>() {
        return Some(s);
    }
    KEY_TYPES.lock().iter().find_map(|view| view(any))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Tracing is process-wide: each test follows keys of its own.

    #[test]
    fn a_followed_key_gets_steps_and_others_do_not() {
        follow(["t1/followed"]).unwrap();
        assert!(on());
        record("t1/followed", Stage::QueueAdded, "", || "first".into());
        record("t1/other", Stage::QueueAdded, "", || {
            panic!("detail of an unfollowed key must not be built")
        });
        let steps = timeline("t1/followed").unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].detail, "first");
        assert!(timeline("t1/other").is_none());
        assert!(followed().contains(&"t1/followed".to_string()));
    }

    #[test]
    fn the_ring_keeps_only_the_newest_steps() {
        follow(["t2/ring"]).unwrap();
        for i in 0..RING_CAPACITY + 5 {
            record("t2/ring", Stage::WorkerTook, "", || i.to_string());
        }
        let steps = timeline("t2/ring").unwrap();
        assert_eq!(steps.len(), RING_CAPACITY);
        assert_eq!(steps[0].detail, "5");
    }

    #[test]
    fn steps_since_hands_out_only_the_steps_recorded_after_the_number_given() {
        follow(["t6/a", "t6/b"]).unwrap();
        record("t6/a", Stage::WatchEvent, "Foo", || "a1".into());
        let first = steps_since(0, Some("t6/a"), 8).unwrap();
        assert_eq!(first.keys.len(), 1);
        assert_eq!(first.keys[0].steps.len(), 1);
        record("t6/b", Stage::WatchEvent, "Foo", || "b1".into());
        record("t6/a", Stage::FifoQueued, "Foo", || "a2".into());
        let later = steps_since(first.next, Some("t6/a"), 8).unwrap();
        let details: Vec<&str> = later.keys[0]
            .steps
            .iter()
            .map(|s| s.detail.as_str())
            .collect();
        assert_eq!(details, ["a2"]);
        assert!(later.next >= first.next + 2);
        assert!(steps_since(0, Some("t6/unfollowed"), 8).is_none());
        let capped = steps_since(first.next, None, 1).unwrap();
        assert_eq!(capped.keys.len(), 1);
        assert!(capped.more_keys >= 1, "{capped:?}");
    }

    #[test]
    fn bad_keys_are_refused_with_the_key_and_the_reason() {
        let e = follow(["a/b/c"]).unwrap_err();
        assert_eq!(e.key, "a/b/c");
        assert!(e.to_string().contains("one '/'"), "{e}");
        assert!(follow([""]).is_err());
        assert!(follow(["ns/"]).is_err());
    }

    #[test]
    fn render_shows_per_step_and_per_journey_times() {
        let step = |mono, stage, detail: &str| Step {
            at_unix_micros: 3_600_000_000 + mono,
            mono_micros: mono,
            stage,
            kind: "Foo".into(),
            detail: detail.into(),
        };
        let steps = vec![
            step(0, Stage::WatchEvent, "ADDED rv=5"),
            step(40, Stage::FifoQueued, "Added"),
            step(2_040, Stage::ReconcileFinished, "success"),
            step(3_000_000, Stage::WatchEvent, "MODIFIED rv=6"),
            step(3_000_500, Stage::FifoQueued, "Updated"),
        ];
        let text = render("default/x", &steps);
        assert!(text.contains("trace of default/x: 5 steps"), "{text}");
        assert!(text.contains("01:00:00.000040"), "{text}");
        assert!(text.contains("40µs"), "{text}");
        assert!(text.contains("2.0ms"), "{text}");
        // The second journey restarts its clock at its watch event.
        let last: Vec<&str> = text.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(
            &last[..4],
            ["01:00:03.000500", "500µs", "500µs", "fifo"],
            "{text}"
        );
    }

    #[test]
    fn item_keys_are_strings_and_registered_types() {
        assert_eq!(item_key(&"a/b".to_string()), Some("a/b"));
        assert_eq!(item_key(&"a/b"), Some("a/b"));
        assert_eq!(item_key(&std::sync::Arc::<str>::from("a/b")), Some("a/b"));
        assert_eq!(item_key(&7u32), None);
        // A registered type is seen through its view.
        struct Key(&'static str);
        key_type(|any| any.downcast_ref::<Key>().map(|k| k.0));
        assert_eq!(item_key(&Key("c/d")), Some("c/d"));
        assert_eq!(short_type_name::<crate::cache::Delta<u8>>(), "Delta");
    }
}
