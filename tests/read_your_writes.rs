//! Read-your-writes against the real control plane (issue 26): the sample controller under a
//! burst of spec edits, with its informers' watch events slowed by a fault proxy, once with
//! read-your-writes off and once on (the default), same run.
//!
//! Two figures per run: the 409 Conflicts the apiserver answered on the controller's writes
//! (its own `apiserver_request_total{code="409"}`, Foos and Deployments), and the syncs that
//! started on a cache older than their Foo's last write (the runtime's
//! `kubeloop_reconcile_stale_total`). With it on, no sync starts stale; with it off, some do.
//! Neither figure is a time. The apiserver-only cluster runs no kube-controller-manager, so
//! every write to these Foos and Deployments is the controller's or the test's.

// `foo` is the resource under test, not a placeholder name.
#![allow(clippy::disallowed_names)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kubeloop::controller::sample::{CONTROLLER_NAME, ControllerConfig, Foo, FooSpec, run};
use kubeloop::runtime::{DEFAULT_FRESHNESS_WAIT, ReconcileMetrics};
use kubeloop::testenv::{self, HttpFaultProxy, eventually};
use tokio_util::sync::CancellationToken;

const CRD_YAML: &str = include_str!("../crds/foo.yaml");
const FOOS: usize = 50;
/// Edits per Foo in the burst: 200 in all.
const EDITS: i32 = 4;
/// How late the controller's informers see each watch event.
const WATCH_DELAY: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(180);

async fn ensure_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(CRD_YAML).expect("crds/foo.yaml parses");
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(status)) if status.is_already_exists() => {}
        Err(e) => panic!("creating the Foo CRD: {e}"),
    }
    eventually("the Foo CRD to be Established", WAIT, || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("foos.samplecontroller.k8s.io").await.unwrap();
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        }
    })
    .await;
}

/// The apiserver's 409 answers on Foos and Deployments so far.
async fn conflicts(admin: &Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin
        .request_text(request)
        .await
        .expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(r#"code="409""#))
        .filter(|l| l.contains(r#"resource="foos""#) || l.contains(r#"resource="deployments""#))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Every Foo's Deployment asks for `replicas`, and every Foo has a status.
async fn converged(foos: &Api<Foo>, deployments: &Api<Deployment>, replicas: i32) {
    eventually(
        &format!("every Deployment at {replicas} replicas and every Foo with a status"),
        WAIT,
        || async move {
            let listed = deployments.list(&Default::default()).await.unwrap().items;
            let at = listed
                .iter()
                .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) == Some(replicas))
                .count();
            let with_status = foos
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|f| f.status.is_some())
                .count();
            at == FOOS && with_status == FOOS
        },
    )
    .await;
}

/// One run: `FOOS` Foos synced, then `EDITS` edits of each, interleaved, as fast as the
/// apiserver takes them. Returns (409s, stale syncs) of the burst.
async fn burst(
    cluster: &testenv::Cluster,
    via_proxy: &Client,
    wait: Option<Duration>,
) -> (u64, u64) {
    let admin = cluster.client().await.unwrap();
    let phase = if wait.is_some() { "on" } else { "off" };
    let ns = cluster
        .new_namespace(&format!("ryw-{phase}"))
        .await
        .unwrap();
    let foos: Api<Foo> = Api::namespaced(admin.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    for i in 0..FOOS {
        let foo = Foo::new(
            &ns,
            &format!("foo-{i}"),
            FooSpec {
                deployment_name: format!("foo-{i}"),
                replicas: Some(1),
            },
        );
        foos.create(&PostParams::default(), &foo).await.unwrap();
    }
    let shutdown = CancellationToken::new();
    let config = ControllerConfig {
        namespace: Some(ns.clone()),
        queue_name: String::new(),
        freshness_wait: wait,
        ..Default::default()
    };
    let controller = tokio::spawn(run(via_proxy.clone(), config, shutdown.clone()));
    converged(&foos, &deployments, 1).await;

    let (conflicts_before, stale_before) = (
        conflicts(&admin).await,
        ReconcileMetrics::global().stale_count(CONTROLLER_NAME),
    );
    for replicas in 2..2 + EDITS {
        for i in 0..FOOS {
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            foos.patch(
                &format!("foo-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
        }
    }
    converged(&foos, &deployments, 1 + EDITS).await;
    // The syncs the last events started, and their writes' own events, end.
    tokio::time::sleep(WATCH_DELAY * 4).await;
    let figures = (
        conflicts(&admin).await - conflicts_before,
        ReconcileMetrics::global().stale_count(CONTROLLER_NAME) - stale_before,
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), controller)
        .await
        .expect("the controller stops")
        .unwrap()
        .expect("the controller ran without error");
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sync_starts_on_a_cache_older_than_its_own_writes_with_read_your_writes_on() {
    let cluster = testenv::shared().await;
    ensure_crd(&cluster.client().await.unwrap()).await;
    let proxy = HttpFaultProxy::start(cluster).await.unwrap();
    proxy.delay_watches(WATCH_DELAY);
    let via_proxy = Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();

    let (off_conflicts, off_stale) = burst(cluster, &via_proxy, None).await;
    let (on_conflicts, on_stale) = burst(cluster, &via_proxy, Some(DEFAULT_FRESHNESS_WAIT)).await;
    println!(
        "sample controller, {FOOS} Foos, {} edits, watch events {WATCH_DELAY:?} late:\n  \
         read-your-writes off: {off_conflicts} conflicts (409), {off_stale} stale syncs\n  \
         read-your-writes on:  {on_conflicts} conflicts (409), {on_stale} stale syncs",
        FOOS as i32 * EDITS
    );
    assert!(
        off_stale > 0,
        "with read-your-writes off some syncs should start stale: the burst did not exercise it"
    );
    assert_eq!(on_stale, 0, "with read-your-writes on no sync starts stale");
}
