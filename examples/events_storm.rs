//! kubeloop's side of `hack/events-write-count` (issue 37): a reconcile that fails N times in
//! D seconds, recorded on events.k8s.io/v1 through kubeloop's recorder
//! ([`EventsV1Broadcaster`] over [`KubeEventsV1Sink`], its defaults: client-go's series
//! timings and the spam budget of 25 new Events per object, then one per 5 minutes).
//! `hack/go/events-storm` is the client-go side: same flags, same output line.
//!
//! ```text
//! cargo run --example events_storm -- --kubeconfig K --namespace NS --foo NAME \
//!     [--scenario same|distinct] [--events 1000] [--seconds 10] [--settle 3]
//! RESULT side=kubeloop scenario=S recorded=N instance=I sent_create=.. sent_patch=..
//!     sent_update=0 dropped_spam=.. dropped_queue_full=.. dropped_refused=.. dropped_unreachable=..
//! ```
//!
//! Scenarios: `same` records reason `ErrResourceExists` every time (one isomorphic series);
//! `distinct` records `ErrResourceExists-<i>`, a hot loop that never repeats itself, which the
//! budget holds to 25 Events. The events are about the Foo `--foo` (read once for its uid), as
//! the reporting controller `events-storm` from the instance `events-storm-<hostname>`: the
//! client-go side cannot set its instance (`NewRecorder` takes the hostname), so this side
//! uses the same form ([`EventsV1Broadcaster::new_recorder`]).
//!
//! After the loop it waits `--settle` seconds, then shuts the broadcaster down, which writes
//! what is queued and every series' last count. `sent_*` are the writes the recorder sent, by
//! verb ([`EventMetrics`]: counted as sent, whatever the answer); `dropped_*` the events it did
//! not write, by why. The apiserver's own count is what `hack/events-write-count` reports.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::ObjectReference;
use kube_client::api::Api;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kubeloop::controller::sample::Foo;
use kubeloop::record::{
    EventDropReason, EventMetrics, EventType, EventsV1Broadcaster, EventsV1Config,
    KubeEventsV1Sink, default_reporting_instance,
};

const CONTROLLER: &str = "events-storm";
const NOTE: &str = r#"Resource "taken" already exists and is not managed by Foo"#;

/// How the loop fails: the same way each time, or a new way each time.
#[derive(Clone, Copy, ValueEnum)]
enum Scenario {
    Same,
    Distinct,
}

#[derive(Parser)]
#[command(about = "Records a reconcile's failures on events.k8s.io/v1 (hack/events-write-count)")]
struct Args {
    /// Kubeconfig file to connect with (default: $KUBECONFIG, then the usual places).
    #[arg(long)]
    kubeconfig: Option<String>,
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The Foo the events are about.
    #[arg(long)]
    foo: String,
    #[arg(long, value_enum, default_value_t = Scenario::Same)]
    scenario: Scenario,
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    events: u32,
    /// The loop's length in seconds (a fraction allowed): the events are spread evenly over it.
    #[arg(long, default_value = "10", value_parser = seconds)]
    seconds: Duration,
    /// Seconds to wait after the loop, before the broadcaster shuts down.
    #[arg(long, default_value = "3", value_parser = seconds)]
    settle: Duration,
}

fn seconds(value: &str) -> Result<Duration, String> {
    let s: f64 = value.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(s).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            let config = kube_client::Config::from_custom_kubeconfig(
                kubeconfig,
                &KubeConfigOptions::default(),
            )
            .await?;
            kube_client::Client::try_from(config)?
        }
        None => kube_client::Client::try_default().await?,
    };
    let regarded = Api::<Foo>::namespaced(client.clone(), &args.namespace)
        .get(&args.foo)
        .await
        .map_err(|e| format!("getting Foo {}/{}: {e}", args.namespace, args.foo))?;
    // The fields the client-go side puts in its ObjectReference; no resourceVersion, which
    // `eventf(&foo)` would add and client-go's `GetReference` of a reference does not.
    let regarding = ObjectReference {
        api_version: Some("samplecontroller.k8s.io/v1alpha1".into()),
        kind: Some("Foo".into()),
        namespace: Some(args.namespace.clone()),
        name: Some(args.foo.clone()),
        uid: regarded.metadata.uid.clone(),
        ..Default::default()
    };

    let metrics = EventMetrics::default();
    let broadcaster = EventsV1Broadcaster::start(
        KubeEventsV1Sink::new(client),
        EventsV1Config {
            metrics: Some(metrics.clone()),
            ..EventsV1Config::default()
        },
    );
    let recorder = broadcaster.new_recorder(CONTROLLER);

    let start = tokio::time::Instant::now();
    let interval = args.seconds / args.events;
    for i in 0..args.events {
        // Evenly spaced from the start, so a slow iteration does not stretch the run.
        tokio::time::sleep_until(start + interval * i).await;
        let reason = match args.scenario {
            Scenario::Same => "ErrResourceExists".to_owned(),
            Scenario::Distinct => format!("ErrResourceExists-{i}"),
        };
        recorder.eventf_for(
            regarding.clone(),
            None,
            EventType::Warning,
            &reason,
            "Sync",
            NOTE,
        );
    }
    tokio::time::sleep(args.settle).await;
    broadcaster.shutdown().await;

    let scenario = match args.scenario {
        Scenario::Same => "same",
        Scenario::Distinct => "distinct",
    };
    println!(
        "RESULT side=kubeloop scenario={scenario} recorded={} instance={} \
         sent_create={} sent_patch={} sent_update=0 dropped_spam={} dropped_queue_full={} \
         dropped_refused={} dropped_unreachable={}",
        args.events,
        default_reporting_instance(CONTROLLER),
        metrics.writes_for("create"),
        metrics.writes_for("patch"),
        metrics.dropped_for(EventDropReason::spam),
        metrics.dropped_for(EventDropReason::queue_full),
        metrics.dropped_for(EventDropReason::refused),
        metrics.dropped_for(EventDropReason::unreachable),
    );
    Ok(())
}
