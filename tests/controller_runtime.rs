//! The controller runtime's leadership guarantee against the real apiserver: two replicas of one
//! controller contend for a real Lease; the leader's apiserver connection is cut (through a
//! fault proxy) while its reconcile is still running. The reconcile must be cancelled, and no
//! side effect of it may land after the successor's first reconcile started.
//!
//! The "side effects" go to an outside system modelled by a shared log with timestamps (the
//! role the container engine plays for the VM controller), so the test sees exactly when each
//! replica acted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams};
use kube_client::core::ObjectMeta;
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::leaderelection::{LeaderElectionConfig, LeaderElector, LeaseLock};
use kubeloop::runtime::{
    Action, Controller, ErrorAction, NotEntitled, ObjectKey, ReconcileContext,
};
use kubeloop::testing::eventually;
use kubeloop_testenv::{self as testenv, FaultProxy};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// (replica, what, when) for every side effect and reconcile start.
type Effects = Arc<Mutex<Vec<(&'static str, &'static str, Instant)>>>;

fn election(ns: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
        recontend: false,
        name: format!("{ns}/slow"),
    }
}

/// A reconcile that acts on the outside system every 200 ms for `work`: `obedient` checks its
/// context before each act; the other never looks and relies on the runtime's fence.
fn slow_reconcile(
    replica: &'static str,
    effects: Effects,
    work: Duration,
    obedient: bool,
) -> impl Fn(
    ObjectKey,
    ReconcileContext,
) -> futures::future::BoxFuture<'static, Result<Action, NotEntitled>>
+ Send
+ Sync
+ 'static {
    move |_key, ctx| {
        let effects = effects.clone();
        Box::pin(async move {
            effects
                .lock()
                .push((replica, "reconcile started", Instant::now()));
            let until = Instant::now() + work;
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if obedient {
                    ctx.check()?;
                }
                effects
                    .lock()
                    .push((replica, "side effect", Instant::now()));
            }
            Ok(Action::Done)
        })
    }
}

async fn slow_reconcile_is_cut_off_before_the_successor(obedient: bool) {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let ns = cluster.new_namespace("rt-slow").await.unwrap();
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("obj".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    // Replica a talks to the apiserver through a proxy the test can cut.
    let proxy = FaultProxy::start(cluster.apiserver_addr()).await.unwrap();
    let client_a = kube_client::Client::try_from(cluster.client_config_via(proxy.addr())).unwrap();
    let effects: Effects = Arc::default();
    let replica = |name: &'static str, client: kube_client::Client, work: Duration| {
        let factory = SharedInformerFactory::new(
            client.clone(),
            FactoryOptions {
                namespace: Some(ns.clone()),
                ..Default::default()
            },
        );
        let elector =
            LeaderElector::new(election(&ns), LeaseLock::new(client, &ns, "slow", name)).unwrap();
        let stop = CancellationToken::new();
        let run = tokio::spawn(
            Controller::new("slow", factory.informer::<ConfigMap>())
                .leader_election(elector)
                .run(
                    slow_reconcile(name, effects.clone(), work, obedient),
                    |_: &NotEntitled, _: &ObjectKey, _: u32| ErrorAction::RateLimited,
                    stop.clone(),
                ),
        );
        (stop, run)
    };
    // a starts first and leads; its reconcile would act for a minute.
    let (stop_a, run_a) = replica("a", client_a, Duration::from_secs(60));
    eventually("replica a acting", Duration::from_secs(30), || async {
        effects
            .lock()
            .iter()
            .any(|(r, what, _)| *r == "a" && *what == "side effect")
    })
    .await;
    let (stop_b, run_b) = replica("b", client.clone(), Duration::from_millis(500));

    // Cut a off the apiserver: it cannot renew, so its term ends at the renew deadline.
    proxy.set_blocked(true);
    proxy.cut_all();
    let cut = Instant::now();
    let b_started = eventually("replica b taking over", Duration::from_secs(30), || async {
        effects
            .lock()
            .iter()
            .find(|(r, what, _)| *r == "b" && *what == "reconcile started")
            .map(|(_, _, at)| *at)
    })
    .await;
    // Give a's reconcile every chance to act late.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = effects.lock().clone();
    let last_a = log
        .iter()
        .filter(|(r, what, _)| *r == "a" && *what == "side effect")
        .map(|(_, _, at)| *at)
        .max()
        .unwrap();
    println!(
        "obedient={obedient}: a's last side effect {:?} after the cut, b's first reconcile {:?} after it",
        last_a - cut,
        b_started - cut
    );
    assert!(
        last_a < b_started,
        "a acted {:?} after b's first reconcile started",
        last_a - b_started
    );
    assert!(
        b_started - cut >= Duration::from_secs(4),
        "b took over {:?} after the cut, before a's lease could have expired",
        b_started - cut
    );
    let a_result = tokio::time::timeout(Duration::from_secs(10), run_a)
        .await
        .expect("replica a stops after losing the lease")
        .unwrap();
    assert!(a_result.is_err(), "a reports the lost lease: {a_result:?}");
    stop_a.cancel();
    stop_b.cancel();
    tokio::time::timeout(Duration::from_secs(30), run_b)
        .await
        .expect("replica b shuts down")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_checks_its_context_stops_acting_before_the_successor_starts() {
    slow_reconcile_is_cut_off_before_the_successor(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_ignores_its_context_is_dropped_at_the_fence_before_the_successor_starts()
{
    slow_reconcile_is_cut_off_before_the_successor(false).await;
}
