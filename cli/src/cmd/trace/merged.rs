//! `kubeloop trace --serve` with several `--ops-address`: one journey page over several
//! controllers (the sample controller and each VM replica, say). Each controller is read
//! through in the background once a second from where its last answer ended; its steps are
//! numbered again here, in the order they arrived, so the page polls this server as it polls
//! one controller. A key is shown as `namespace/name @ address`: each process numbers its own
//! monotonic clock, so two processes' steps of one key are two journeys.
//!
//! Invariants: a key keeps at most [`RING_CAPACITY`] steps and an answer holds at most
//! [`MAX_KEYS`] keys; a controller that cannot be read keeps the steps it gave, and its
//! problem is said in the page's header; a controller whose numbering went back (it
//! restarted) is read again from its start.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kubeloop::ops::{
    JourneyData, JourneyFuture, JourneyQuery, JourneyRefusal, JourneySource, MAX_KEYS,
    MAX_QUEUE_SERIES, QueueDepth,
};
use kubeloop::trace::{KeySteps, Step, StepsSince, numbered_since, push_numbered};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// How often each controller is read.
const POLL: Duration = Duration::from_secs(1);

/// The controllers' journeys, merged.
pub(super) struct Merged {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The number the next step merged here gets.
    next: u64,
    /// Each `key @ address` and its steps, numbered here.
    keys: BTreeMap<String, VecDeque<(u64, Step)>>,
    /// Each controller (in the order given): its name, newest queue depths and problem.
    sources: Vec<Source>,
}

#[derive(Default)]
struct Source {
    name: String,
    queues: Vec<QueueDepth>,
    problem: Option<String>,
}

impl Merged {
    /// Starts reading each of `sources` (a name, as `--ops-address` gave it, and the source)
    /// until `stop`.
    pub(super) fn start(
        sources: Vec<(String, Arc<dyn JourneySource>)>,
        stop: CancellationToken,
    ) -> Self {
        let state = Arc::new(Mutex::new(State {
            sources: sources
                .iter()
                .map(|(name, _)| Source {
                    name: name.clone(),
                    problem: Some("not read yet".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }));
        for (i, (_, source)) in sources.into_iter().enumerate() {
            let (state, stop) = (state.clone(), stop.clone());
            tokio::spawn(async move {
                let mut since = 0;
                loop {
                    since = read_once(&state, i, source.as_ref(), since).await;
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(POLL) => {}
                    }
                }
            });
        }
        Self { state }
    }

    fn answer(&self, query: &JourneyQuery) -> Result<String, JourneyRefusal> {
        let state = self.state.lock();
        let problems: Vec<String> = state
            .sources
            .iter()
            .filter_map(|s| Some(format!("{}: {}", s.name, s.problem.as_deref()?)))
            .collect();
        if state.keys.is_empty() && problems.len() == state.sources.len() {
            return Err(JourneyRefusal {
                status: http::StatusCode::BAD_GATEWAY,
                words: format!("no controller gave a journey: {}", problems.join("; ")),
            });
        }
        let wanted = |name: &str| match &query.key {
            None => true,
            Some(key) => name == key || name.split(" @ ").next() == Some(key.as_str()),
        };
        let names: Vec<&String> = state.keys.keys().filter(|n| wanted(n)).collect();
        if names.is_empty() && query.key.is_some() {
            return Err(JourneyRefusal {
                status: http::StatusCode::NOT_FOUND,
                words: format!(
                    "{:?} is not traced by these controllers; traced keys: {}",
                    query.key.as_deref().unwrap_or_default(),
                    state.keys.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        let keys = names
            .iter()
            .take(MAX_KEYS)
            .map(|&name| KeySteps {
                key: name.clone(),
                steps: numbered_since(&state.keys[name], query.since),
            })
            .collect();
        let mut source = format!(
            "{} controllers: {}",
            state.sources.len(),
            state
                .sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !problems.is_empty() {
            source.push_str(&format!(" (not read now: {})", problems.join("; ")));
        }
        let data = JourneyData {
            source,
            live: true,
            steps: StepsSince {
                next: state.next,
                keys,
                more_keys: names.len().saturating_sub(MAX_KEYS),
            },
            queues: state
                .sources
                .iter()
                .flat_map(|s| s.queues.iter().cloned())
                .take(MAX_QUEUE_SERIES)
                .collect(),
        };
        serde_json::to_string(&data).map_err(|e| JourneyRefusal {
            status: http::StatusCode::INTERNAL_SERVER_ERROR,
            words: format!("encoding the journeys: {e}"),
        })
    }
}

impl JourneySource for Merged {
    fn data(&self, query: JourneyQuery) -> JourneyFuture<'_> {
        Box::pin(std::future::ready(self.answer(&query)))
    }
}

/// Reads source `i` from `since` once and merges what it gave; the `since` to read from next.
async fn read_once(state: &Mutex<State>, i: usize, source: &dyn JourneySource, since: u64) -> u64 {
    let query = JourneyQuery { key: None, since };
    let data = match source.data(query).await {
        Ok(json) => serde_json::from_str::<JourneyData>(&json)
            .map_err(|e| format!("journey data that does not parse: {e}")),
        Err(refusal) => Err(refusal.words),
    };
    let mut state = state.lock();
    let data = match data {
        Ok(data) => data,
        Err(problem) => {
            state.sources[i].problem = Some(problem);
            return since;
        }
    };
    if data.steps.next < since {
        // Its numbering went back: a new process at that address. Read it from its start.
        state.sources[i].problem = Some("restarted; reading it again".into());
        return 0;
    }
    let State {
        next,
        keys,
        sources,
    } = &mut *state;
    let source = &mut sources[i];
    for KeySteps { key, steps } in data.steps.keys {
        let ring = keys.entry(format!("{key} @ {}", source.name)).or_default();
        for step in steps {
            push_numbered(ring, *next, step);
            *next += 1;
        }
    }
    source.queues = data
        .queues
        .into_iter()
        .map(|q| QueueDepth {
            queue: format!("{} @ {}", q.queue, source.name),
            ..q
        })
        .collect();
    source.problem = None;
    data.steps.next
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeloop::trace::{RING_CAPACITY, Stage};

    /// A controller that answers from a script, one answer a read.
    struct Scripted(Mutex<VecDeque<Result<JourneyData, JourneyRefusal>>>);

    impl JourneySource for Scripted {
        fn data(&self, _: JourneyQuery) -> JourneyFuture<'_> {
            let answer = self
                .0
                .lock()
                .pop_front()
                .expect("scripted")
                .map(|d| serde_json::to_string(&d).unwrap());
            Box::pin(std::future::ready(answer))
        }
    }

    fn step(detail: &str) -> Step {
        Step {
            at_unix_micros: 0,
            mono_micros: 0,
            stage: Stage::WatchEvent,
            kind: "Foo".into(),
            detail: detail.into(),
        }
    }

    /// A controller's answer: `key` with steps `details`, its numbering at `next`.
    fn gave(next: u64, key: &str, details: &[&str]) -> Result<JourneyData, JourneyRefusal> {
        Ok(JourneyData {
            source: "a controller".into(),
            live: true,
            steps: StepsSince {
                next,
                keys: vec![KeySteps {
                    key: key.into(),
                    steps: details.iter().map(|d| step(d)).collect(),
                }],
                more_keys: 0,
            },
            queues: vec![QueueDepth {
                queue: "Foos".into(),
                by: "priority".into(),
                label: "0".into(),
                depth: 1.0,
            }],
        })
    }

    fn refused(words: &str) -> Result<JourneyData, JourneyRefusal> {
        Err(JourneyRefusal {
            status: http::StatusCode::NOT_FOUND,
            words: words.into(),
        })
    }

    /// The merged answer to `since` (and `key`), parsed.
    fn read(merged: &Merged, since: u64, key: Option<&str>) -> Result<JourneyData, JourneyRefusal> {
        let query = JourneyQuery {
            key: key.map(Into::into),
            since,
        };
        merged
            .answer(&query)
            .map(|json| serde_json::from_str(&json).unwrap())
    }

    fn details(data: &JourneyData) -> Vec<(String, Vec<String>)> {
        data.steps
            .keys
            .iter()
            .map(|k| {
                (
                    k.key.clone(),
                    k.steps.iter().map(|s| s.detail.clone()).collect(),
                )
            })
            .collect()
    }

    fn merged_of(n: usize) -> Merged {
        // No source to spawn: the tests read each with `read_once` themselves.
        let merged = Merged::start(vec![], CancellationToken::new());
        merged.state.lock().sources = (0..n)
            .map(|i| Source {
                name: format!("c{i}"),
                problem: Some("not read yet".into()),
                ..Default::default()
            })
            .collect();
        merged
    }

    #[tokio::test]
    async fn two_controllers_journeys_are_one_page_numbered_here() {
        let merged = merged_of(2);
        let a = Scripted(Mutex::new(VecDeque::from([
            gave(7, "ns/foo", &["ADDED rv=1", "MODIFIED rv=2"]),
            gave(9, "ns/foo", &["MODIFIED rv=3"]),
        ])));
        let b = Scripted(Mutex::new(VecDeque::from([gave(
            40,
            "ns/vm",
            &["ADDED rv=5"],
        )])));
        assert_eq!(read_once(&merged.state, 0, &a, 0).await, 7);
        assert_eq!(read_once(&merged.state, 1, &b, 0).await, 40);
        let all = read(&merged, 0, None).unwrap();
        assert_eq!(
            details(&all),
            [
                (
                    "ns/foo @ c0".into(),
                    vec!["ADDED rv=1".into(), "MODIFIED rv=2".into()]
                ),
                ("ns/vm @ c1".into(), vec!["ADDED rv=5".into()]),
            ]
        );
        assert_eq!(all.steps.next, 3);
        assert_eq!(all.source, "2 controllers: c0, c1");
        let queues: Vec<&str> = all.queues.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!(queues, ["Foos @ c0", "Foos @ c1"]);
        // Read from where it ended: only what came since.
        assert_eq!(read_once(&merged.state, 0, &a, 7).await, 9);
        let newer = read(&merged, all.steps.next, None).unwrap();
        assert_eq!(
            details(&newer),
            [
                ("ns/foo @ c0".into(), vec!["MODIFIED rv=3".into()]),
                ("ns/vm @ c1".into(), vec![]),
            ]
        );
        // A bare key picks it in every controller; an unknown one gets words.
        let foo = read(&merged, 0, Some("ns/foo")).unwrap();
        assert_eq!(foo.steps.keys.len(), 1);
        let words = read(&merged, 0, Some("ns/nope")).unwrap_err().words;
        assert!(
            words.contains("\"ns/nope\" is not traced by these controllers"),
            "{words}"
        );
        assert!(words.contains("ns/foo @ c0, ns/vm @ c1"), "{words}");
    }

    #[tokio::test]
    async fn a_controller_that_cannot_be_read_is_named_and_the_others_are_served() {
        let merged = merged_of(2);
        let words = read(&merged, 0, None).unwrap_err().words;
        assert!(
            words.starts_with("no controller gave a journey: c0: not read yet"),
            "{words}"
        );
        let a = Scripted(Mutex::new(VecDeque::from([gave(
            1,
            "ns/foo",
            &["ADDED rv=1"],
        )])));
        let b = Scripted(Mutex::new(VecDeque::from([refused("no key is traced")])));
        read_once(&merged.state, 0, &a, 0).await;
        assert_eq!(
            read_once(&merged.state, 1, &b, 5).await,
            5,
            "read again from there"
        );
        let data = read(&merged, 0, None).unwrap();
        assert_eq!(data.steps.keys.len(), 1);
        assert_eq!(
            data.source,
            "2 controllers: c0, c1 (not read now: c1: no key is traced)"
        );
    }

    #[tokio::test]
    async fn a_restarted_controller_is_read_again_from_its_start() {
        let merged = merged_of(1);
        let a = Scripted(Mutex::new(VecDeque::from([gave(2, "ns/foo", &[])])));
        assert_eq!(read_once(&merged.state, 0, &a, 50).await, 0);
        assert!(read(&merged, 0, None).is_err(), "restarted: not read yet");
    }

    #[tokio::test]
    async fn a_key_keeps_the_newest_ring_of_steps() {
        let merged = merged_of(1);
        let many: Vec<String> = (0..RING_CAPACITY + 3)
            .map(|i| format!("MODIFIED rv={i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let a = Scripted(Mutex::new(VecDeque::from([gave(1000, "ns/foo", &many)])));
        read_once(&merged.state, 0, &a, 0).await;
        let data = read(&merged, 0, None).unwrap();
        let steps = &data.steps.keys[0].steps;
        assert_eq!(steps.len(), RING_CAPACITY);
        assert_eq!(steps[0].detail, "MODIFIED rv=3");
    }
}
