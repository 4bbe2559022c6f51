//! Faults in the watch itself, against the real apiserver: a re-opened watch answered with
//! 429 Too Many Requests, and an event that does not decode. The faults are injected at the
//! `ListerWatcher` seam (a wrapper around the real `ListWatch`: the harness's FaultProxy
//! passes TLS through and cannot answer HTTP itself); every LIST, WATCH and event that is not
//! the injected fault is the apiserver's own.
//!
//! - 429 on opening a watch: the reflector backs off and opens the watch again, without a new
//!   LIST (client-go: TestNoRelistOnTooManyRequests, here end to end).
//! - An undecodable event ends the watch and the reflector relists (client-go's
//!   StreamWatcher reports a decode failure as an error and stops), so the change the event
//!   carried is not lost: the cache equals the server afterwards.

mod cache_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cache_common::{Checker, assert_converges, configmap, seed_configmaps};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    BackoffConfig, CacheMetrics, InformerConfig, ListOptions, ListPage, ListWatch, ListWatchError,
    ListerWatcher, ReflectorConfig, SharedIndexInformer, WatchOptions, WatchStream,
};
use kubeloop::testenv;

/// Faults to inject, shared with the test body.
#[derive(Default)]
struct Faults {
    /// End the open watch stream (cleanly) at the event after the next one.
    close_after_next_event: AtomicUsize,
    /// Answer this many of the next watch opens with 429.
    throttle_opens: AtomicUsize,
    /// Replace the next live event with an undecodable one.
    corrupt_next_event: AtomicUsize,
    lists: AtomicUsize,
    watch_opens: AtomicUsize,
    throttled: AtomicUsize,
}

struct Faulty {
    inner: ListWatch<ConfigMap>,
    faults: Arc<Faults>,
}

fn too_many_requests() -> ListWatchError {
    ListWatchError::Api {
        verb: "WATCH",
        url: "(injected)".into(),
        code: 429,
        reason: "TooManyRequests".into(),
        message: "the server has received too many requests and has asked us to try again later"
            .into(),
        causes: vec![],
    }
}

fn undecodable() -> ListWatchError {
    let source = serde_json::from_str::<ConfigMap>(r#"{"kind":"Pod","metadata":7}"#).unwrap_err();
    ListWatchError::Decode {
        verb: "WATCH",
        url: "(injected)".into(),
        source: kube_client::Error::SerdeError(source),
    }
}

impl ListerWatcher<ConfigMap> for Faulty {
    fn list(
        &self,
        options: &ListOptions,
    ) -> impl std::future::Future<Output = Result<ListPage<ConfigMap>, ListWatchError>> + Send {
        self.faults.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl std::future::Future<Output = Result<WatchStream<ConfigMap>, ListWatchError>> + Send
    {
        let faults = self.faults.clone();
        // Only re-opened live watches are throttled, not the streaming list.
        let initial = options.send_initial_events;
        let fut = self.inner.watch(options);
        async move {
            faults.watch_opens.fetch_add(1, Ordering::SeqCst);
            let take = |a: &AtomicUsize| {
                a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            };
            if !initial && take(&faults.throttle_opens) {
                faults.throttled.fetch_add(1, Ordering::SeqCst);
                return Err(too_many_requests());
            }
            let stream = fut.await?;
            // Faults armed by the test hit the next events of whichever stream is open (the
            // streaming list's stream goes on as the live watch after its initial events).
            let faulted = stream.scan(false, move |ending, item| {
                if *ending {
                    // The previous event asked for the stream to end: end it cleanly.
                    return futures::future::ready(None);
                }
                let take = |a: &AtomicUsize| {
                    a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                };
                if take(&faults.corrupt_next_event) {
                    return futures::future::ready(Some(Err(undecodable())));
                }
                if take(&faults.close_after_next_event) {
                    *ending = true;
                }
                futures::future::ready(Some(item))
            });
            Ok(faulted.boxed())
        }
    }

    fn type_description(&self) -> String {
        self.inner.type_description()
    }
}

fn fast_backoff() -> ReflectorConfig {
    ReflectorConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
            factor: 2.0,
            jitter: 0.0,
            reset_after: Duration::from_secs(120),
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_watch_is_reopened_after_backoff_without_a_relist() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-throttle").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 20).await;

    let faults = Arc::new(Faults::default());
    let metrics = CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        Faulty {
            inner: ListWatch::namespaced(client.clone(), &ns),
            faults: faults.clone(),
        },
        InformerConfig {
            reflector: fast_backoff(),
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    let lists_at_sync = metrics.reflector("v1/configmaps").lists();

    // The live watch ends after its next event; the next three opens get 429.
    faults.close_after_next_event.store(1, Ordering::SeqCst);
    faults.throttle_opens.store(3, Ordering::SeqCst);
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("during-{i}"), &[], "x"),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        faults.throttled.load(Ordering::SeqCst),
        3,
        "three 429 answers"
    );
    assert_eq!(
        metrics.reflector("v1/configmaps").lists(),
        lists_at_sync,
        "a 429 on the watch must not cause a relist"
    );
    assert_eq!(
        faults.lists.load(Ordering::SeqCst),
        0,
        "no paged LIST either"
    );
    assert!(
        faults.watch_opens.load(Ordering::SeqCst) >= 5,
        "streaming list, throttled opens and the successful re-open"
    );
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_event_ends_the_watch_and_the_reflector_relists() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("cache-undecodable").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    seed_configmaps(&api, "pre", 20).await;

    let faults = Arc::new(Faults::default());
    let metrics = CacheMetrics::new();
    let informer = SharedIndexInformer::new(
        Faulty {
            inner: ListWatch::namespaced(client.clone(), &ns),
            faults: faults.clone(),
        },
        InformerConfig {
            reflector: fast_backoff(),
            metrics: metrics.clone(),
            ..Default::default()
        },
    );
    let checker = Checker::default();
    informer.add_event_handler(checker.clone()).unwrap();
    let errors = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    informer
        .set_watch_error_handler(move |err| e.lock().push(err.to_string()))
        .unwrap();
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    assert_eq!(metrics.reflector("v1/configmaps").lists(), 1);

    // The event for `lost` arrives as garbage: skipping it would lose the object for good.
    faults.corrupt_next_event.store(1, Ordering::SeqCst);
    api.create(&PostParams::default(), &configmap("lost", &[], "x"))
        .await
        .unwrap();
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &configmap(&format!("after-{i}"), &[], "x"),
        )
        .await
        .unwrap();
    }
    assert_converges(
        &client,
        &ns,
        &informer.indexer(),
        &checker,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        informer.lister().namespaced(&ns).get("lost").is_some(),
        "the object behind the bad event"
    );
    let m = metrics.reflector("v1/configmaps");
    assert_eq!(m.relists(), 1, "one relist after the bad event");
    assert!(
        errors.lock().iter().any(|e| e.contains("decode")),
        "{:?}",
        errors.lock()
    );
    assert!(
        checker.violations().is_empty(),
        "{:?}",
        checker.violations()
    );
    informer.shutdown().await;
}
