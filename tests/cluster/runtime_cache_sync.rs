//! The runtime's cache-sync timeout (controller-runtime's `CacheSyncTimeout`) on the real
//! apiserver: a controller whose identity may list its primary type but not a watched one
//! fails to start within the timeout, with an error naming the refused resource and the 403
//! it got, and not the resource it may list.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::Client;
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::runtime::{
    Action, Controller, ControllerError, ObjectKey, ReconcileContext, default_error_policy,
};
use kubeloop_testenv as testenv;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_refused_a_list_fails_its_start_naming_the_resource_and_the_403() {
    let cluster = testenv::shared().await;
    let ns = cluster.new_namespace("cache-sync-timeout").await.unwrap();
    let user = format!("no-secrets-{ns}");
    // The user may list and watch ConfigMaps in the namespace, and nothing else.
    cluster
        .kubectl(&[
            "create",
            "role",
            "cm-reader",
            "--verb=list,watch",
            "--resource=configmaps",
            "-n",
            &ns,
        ])
        .ok();
    cluster
        .kubectl(&[
            "create",
            "rolebinding",
            "cm-reader",
            "--role=cm-reader",
            "--user",
            &user,
            "-n",
            &ns,
        ])
        .ok();
    let client = Client::try_from(cluster.user_config(&user, &[]).unwrap()).unwrap();
    let factory = SharedInformerFactory::new(
        client,
        FactoryOptions {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
    );
    let timeout = Duration::from_secs(3);
    let controller = Controller::new("sync-timeout", factory.informer::<ConfigMap>())
        .watches(factory.informer::<Secret>(), |_: &Secret| Vec::new())
        .cache_sync_timeout(timeout);
    let ready = controller.readiness();
    let reconcile = |_: ObjectKey, _: ReconcileContext| async { Ok::<_, String>(Action::Done) };
    let run = controller.run(reconcile, default_error_policy, CancellationToken::new());
    // A bound well past the timeout, so a start that waits for ever fails the test.
    let result = tokio::time::timeout(timeout * 20, run)
        .await
        .expect("the start gave up within its cache-sync timeout");

    let err = result.expect_err("a refused informer fails the start");
    let message = err.to_string();
    let ControllerError::CacheSyncTimeout {
        controller,
        timeout: waited,
        not_synced,
    } = err
    else {
        panic!("not a cache-sync timeout: {message}");
    };
    assert_eq!((controller.as_str(), waited), ("sync-timeout", timeout));
    assert_eq!(
        not_synced
            .iter()
            .map(|n| n.resource.as_str())
            .collect::<Vec<_>>(),
        ["v1/secrets"],
        "only the refused resource is named: {message}"
    );
    let last_error = not_synced[0].last_error.as_deref().unwrap_or_default();
    assert!(
        last_error.contains("forbidden") && last_error.contains(&user),
        "the last list error is the 403: {last_error}"
    );
    assert!(
        message.contains("v1/secrets") && message.contains("forbidden"),
        "{message}"
    );
    assert!(
        !ready.load(std::sync::atomic::Ordering::SeqCst),
        "never ready"
    );
}
