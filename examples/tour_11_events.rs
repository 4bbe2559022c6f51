//! Tour, chapter 11 (docs/11-events.md): Events on events.k8s.io/v1. A reconcile that fails
//! the same way five times becomes one Event whose `series` counts five, in three writes; the
//! same Event read through core/v1, as `kubectl describe` reads it; and the spam budget: a loop
//! that never repeats itself writes 25 Events about one object, and the rest are counted as
//! dropped.

use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
use k8s_openapi::api::events::v1::Event;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, PostParams};
use kubeloop::record::{
    EventDropReason, EventMetrics, EventType, EventsV1Broadcaster, EventsV1Config, KubeEventsV1Sink,
};

const NAME: &str = "tour-11";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let _ = configmaps.delete(NAME, &DeleteParams::default()).await;
    delete_events_about(&events).await?;
    let regarded = configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NAME}}))?,
        )
        .await?;

    println!("-- the same failure, five times --");
    let metrics = EventMetrics::default();
    let broadcaster = start(&client, &metrics);
    let recorder = broadcaster.new_recorder("tour-controller");
    for _ in 0..5 {
        recorder.eventf(
            &regarded,
            None,
            EventType::Warning,
            "SyncFailed",
            "Sync",
            "ConfigMap default/tour-11: data.greeting is missing",
        );
    }
    broadcaster.shutdown().await;
    println!(
        "5 events recorded -> writes: {} create, {} patches (the series' start and, at shutdown, its last count)",
        metrics.writes_for("create"),
        metrics.writes_for("patch")
    );
    let stored = events_about(&events).await?;
    println!("{} Event about {NAME}", stored.len());
    for event in &stored {
        let regarding = event.regarding.clone().unwrap_or_default();
        println!("events.k8s.io/v1:");
        println!(
            "  regarding:           {} {}/{}",
            regarding.kind.unwrap_or_default(),
            regarding.namespace.unwrap_or_default(),
            regarding.name.unwrap_or_default()
        );
        println!(
            "  type / reason:       {} / {}",
            text(&event.type_),
            text(&event.reason)
        );
        println!("  action:              {}", text(&event.action));
        println!(
            "  reportingController: {}",
            text(&event.reporting_controller)
        );
        println!("  note:                {}", text(&event.note));
        println!(
            "  series.count:        {}",
            event.series.as_ref().map_or(0, |s| s.count)
        );
        let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
        let name = event.metadata.name.as_deref().unwrap_or_default();
        let old = core.get(name).await?;
        println!("the same Event through core/v1 (what `kubectl describe` reads):");
        println!(
            "  involvedObject:      {} {}",
            old.involved_object.kind.unwrap_or_default(),
            old.involved_object.name.unwrap_or_default()
        );
        println!("  message:             {}", text(&old.message));
        println!(
            "  count:               {}",
            old.count.map_or("(none)".to_owned(), |c| c.to_string())
        );
        println!(
            "  series.count:        {}",
            old.series.and_then(|s| s.count).unwrap_or(0)
        );
    }

    println!("-- a loop that never repeats itself: 30 different reasons --");
    delete_events_about(&events).await?;
    let metrics = EventMetrics::default();
    let broadcaster = start(&client, &metrics);
    let recorder = broadcaster.new_recorder("tour-controller");
    for attempt in 1..=30 {
        recorder.eventf(
            &regarded,
            None,
            EventType::Warning,
            &format!("SyncFailedAttempt{attempt}"),
            "Sync",
            "ConfigMap default/tour-11: data.greeting is missing",
        );
    }
    broadcaster.shutdown().await;
    println!(
        "30 events recorded -> {} Events written, {} dropped by the spam budget (kubeloop_events_dropped_total{{reason=\"spam\"}})",
        events_about(&events).await?.len(),
        metrics.dropped_for(EventDropReason::spam)
    );

    delete_events_about(&events).await?;
    configmaps.delete(NAME, &DeleteParams::default()).await?;
    Ok(())
}

/// A broadcaster with client-go's defaults (and `tools/record`'s budget), counting into
/// `metrics`.
fn start(client: &Client, metrics: &EventMetrics) -> EventsV1Broadcaster {
    EventsV1Broadcaster::start(
        KubeEventsV1Sink::new(client.clone()),
        EventsV1Config {
            metrics: Some(metrics.clone()),
            ..EventsV1Config::default()
        },
    )
}

async fn events_about(events: &Api<Event>) -> Result<Vec<Event>, kube_client::Error> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("ConfigMap") && r.name.as_deref() == Some(NAME)
            })
        })
        .collect())
}

async fn delete_events_about(events: &Api<Event>) -> Result<(), kube_client::Error> {
    for event in events_about(events).await? {
        if let Some(name) = event.metadata.name {
            events.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

fn text(field: &Option<String>) -> &str {
    field.as_deref().unwrap_or("")
}
