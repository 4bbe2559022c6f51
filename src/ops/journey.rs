//! The journey page on `/debug/journey`: the followed keys' steps ([`crate::trace`]) drawn in
//! the browser, one lane per stage, live; and its data on `/debug/journey?format=json`.
//!
//! No counterpart in client-go or controller-runtime (their debug pages are pprof and
//! `/metrics`). The page is one HTML file with its CSS and JavaScript (`journey/`), built into
//! the binary: no CDN, no JavaScript build step, about 18 KB. It polls its data once a second
//! with `since=N`, the number [`crate::trace::steps_since`] handed out last, so each answer
//! holds only new steps; a poll is one short request, so an open page holds no stream and no
//! task, and shutting the server down closes it like any idle connection.
//!
//! Where the data comes from is a [`JourneySource`]: this process's trace on the controllers'
//! ops server ([`LocalTrace`]), another process's ops server or a saved file in
//! `kubeloop trace --serve` (the command line's own sources). The page is the same.
//!
//! Invariants: an answer holds at most [`MAX_KEYS`] keys of at most
//! [`crate::trace::RING_CAPACITY`] steps each, and at most [`MAX_QUEUE_SERIES`] queue depths.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use http::StatusCode;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::trace::StepsSince;

/// Keys in one answer; more are counted in `more_keys` (the page asks for one with `?key=`).
pub const MAX_KEYS: usize = 16;

/// Queue depth series in one answer (by priority and by fairness key, over all queues).
pub const MAX_QUEUE_SERIES: usize = 64;

/// The page: HTML with its CSS and JavaScript inlined, a few kilobytes, no outside fetch.
pub fn page() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        include_str!("journey/page.html")
            .replacen("/*journey.css*/", include_str!("journey/journey.css"), 1)
            .replacen("/*journey.js*/", include_str!("journey/journey.js"), 1)
    })
}

/// What the page asks for: the steps since `since` (0: all kept), of `key` only if given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JourneyQuery {
    /// Only this key (`namespace/name`).
    pub key: Option<String>,
    /// The `next` of the previous answer.
    pub since: u64,
}

impl JourneyQuery {
    /// Reads `key` and `since` from a query string (other pairs are ignored).
    pub fn parse(query: &str) -> Self {
        let mut parsed = Self::default();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("key", k)) if !k.is_empty() => parsed.key = Some(percent_decode(k)),
                Some(("since", n)) => parsed.since = n.parse().unwrap_or(0),
                _ => {}
            }
        }
        parsed
    }

    /// The query string of the data request, `format=json&since=N[&key=ns%2Fname]`.
    pub fn to_query(&self) -> String {
        let mut q = format!("format=json&since={}", self.since);
        if let Some(key) = &self.key {
            q.push_str("&key=");
            for b in key.bytes() {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    q.push(b as char);
                } else {
                    q.push_str(&format!("%{b:02X}"));
                }
            }
        }
        q
    }
}

/// One answer to the page's poll.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JourneyData {
    /// Where the steps come from, shown in the page's header.
    pub source: String,
    /// Whether more steps can come (the page keeps polling); false for a saved trace.
    pub live: bool,
    /// The steps since the number asked for.
    #[serde(flatten)]
    pub steps: StepsSince,
    /// The named queues' depths now.
    pub queues: Vec<QueueDepth>,
}

/// One queue's depth for one priority or one fairness key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueDepth {
    /// The queue's name (`Foos`).
    pub queue: String,
    /// `priority` or `fairness`.
    pub by: String,
    /// The priority (`0`) or the fairness keys (`default`).
    pub label: String,
    /// Items waiting.
    pub depth: f64,
}

/// Why a source has no data to give: the HTTP status and words for the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JourneyRefusal {
    /// The status the page gets.
    pub status: StatusCode,
    /// What the page shows.
    pub words: String,
}

/// A future a [`JourneySource`] returns.
pub type JourneyFuture<'a> =
    Pin<Box<dyn Future<Output = Result<String, JourneyRefusal>> + Send + 'a>>;

/// Where the journey page's data comes from; its answer is the JSON of a [`JourneyData`].
pub trait JourneySource: Send + Sync {
    /// The answer to one poll.
    fn data(&self, query: JourneyQuery) -> JourneyFuture<'_>;
}

/// This process's trace and queues: what a controller's ops server serves.
pub struct LocalTrace {
    /// The registry whose `workqueue_depth{name, priority}` gives the depth by priority.
    pub registry: Option<Arc<Registry>>,
}

impl JourneySource for LocalTrace {
    fn data(&self, query: JourneyQuery) -> JourneyFuture<'_> {
        Box::pin(std::future::ready(self.answer(&query)))
    }
}

impl LocalTrace {
    fn answer(&self, query: &JourneyQuery) -> Result<String, JourneyRefusal> {
        let followed = crate::trace::followed();
        if followed.is_empty() {
            return Err(JourneyRefusal {
                status: StatusCode::NOT_FOUND,
                words: "no key is traced: start the controller with --trace namespace/name".into(),
            });
        }
        let Some(steps) = crate::trace::steps_since(query.since, query.key.as_deref(), MAX_KEYS)
        else {
            return Err(JourneyRefusal {
                status: StatusCode::NOT_FOUND,
                words: format!(
                    "{:?} is not traced here; traced keys: {}",
                    query.key.as_deref().unwrap_or_default(),
                    followed.join(", ")
                ),
            });
        };
        let mut queues = self
            .registry
            .as_deref()
            .map(depth_by_priority)
            .unwrap_or_default();
        for (queue, keys) in crate::workqueue::fairness_by_queue() {
            for key in keys {
                queues.push(QueueDepth {
                    queue: queue.clone(),
                    by: "fairness".into(),
                    label: match key.keys.as_slice() {
                        [] => "(none)".into(),
                        keys => keys.join(" / "),
                    },
                    depth: key.depth as f64,
                });
            }
        }
        queues.truncate(MAX_QUEUE_SERIES);
        let data = JourneyData {
            source: format!("this controller (pid {})", std::process::id()),
            live: true,
            steps,
            queues,
        };
        serde_json::to_string(&data).map_err(|e| JourneyRefusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            words: format!("encoding the journeys: {e}"),
        })
    }
}

/// The `workqueue_depth` series with a `priority` label, read from the registry's text (the
/// numbers `/metrics` serves).
fn depth_by_priority(registry: &Registry) -> Vec<QueueDepth> {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
        return vec![];
    }
    text.lines()
        .filter_map(|line| {
            let labels = line.strip_prefix("workqueue_depth{")?;
            let (labels, value) = labels.split_once("} ")?;
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                let len = labels[start..].find('"')?;
                Some(labels[start..start + len].to_string())
            };
            Some(QueueDepth {
                queue: label("name")?,
                by: "priority".into(),
                label: label("priority")?,
                depth: value.trim().parse().ok()?,
            })
        })
        .take(MAX_QUEUE_SERIES)
        .collect()
}

/// `%2F` and friends in a query value (a key's `/` may come encoded).
pub(super) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_its_css_and_script_inlined_and_fetches_nothing_from_outside() {
        let page = page();
        assert!(page.contains(".mark{"), "the CSS is inlined");
        assert!(page.contains("function renderKey"), "the script is inlined");
        assert!(!page.contains("/*journey.js*/") && !page.contains("/*journey.css*/"));
        for outside in ["http://", "https://", "src=", "<link"] {
            let hits: Vec<&str> = page
                .lines()
                .filter(|l| l.contains(outside) && !l.contains("www.w3.org/2000/svg"))
                .collect();
            assert!(hits.is_empty(), "{outside}: {hits:?}");
        }
    }

    #[test]
    fn a_query_round_trips_with_an_encoded_key() {
        let q = JourneyQuery {
            key: Some("default/example-foo".into()),
            since: 42,
        };
        assert_eq!(
            q.to_query(),
            "format=json&since=42&key=default%2Fexample-foo"
        );
        assert_eq!(JourneyQuery::parse(&q.to_query()), q);
        assert_eq!(JourneyQuery::parse("format=json"), JourneyQuery::default());
    }

    #[test]
    fn depth_by_priority_reads_the_labelled_gauge() {
        use prometheus_client::encoding::EncodeLabelSet;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct Labels {
            name: String,
            priority: String,
        }
        let mut registry = Registry::default();
        let depth = Family::<Labels, Gauge>::default();
        registry.register("workqueue_depth", "Depth", depth.clone());
        depth
            .get_or_create(&Labels {
                name: "Foos".into(),
                priority: "-100".into(),
            })
            .set(3);
        let got = depth_by_priority(&registry);
        assert_eq!(
            got,
            [QueueDepth {
                queue: "Foos".into(),
                by: "priority".into(),
                label: "-100".into(),
                depth: 3.0,
            }]
        );
    }
}
