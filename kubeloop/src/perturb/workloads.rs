//! The two controllers' workloads, each with the function that runs its controller in a
//! campaign.

use std::sync::Arc;

use kube_client::api::ApiResource;
use serde_json::json;

use super::campaign::{Action, ControllerFn, Workload};

/// The sample controller's workload: create a Foo, scale it, point it at another Deployment,
/// delete it leaving its Deployments (propagation `Orphan`); the oracle compares Foos and
/// Deployments. The cluster needs the Foo CRD and a controller-manager (the Deployments'
/// status and the garbage collector's orphaning are part of each checkpoint). The controller
/// is the sample controller with its defaults, watching the run's namespace only.
#[cfg(feature = "sample-controller")]
pub fn sample() -> (Workload, ControllerFn) {
    use crate::controller::sample::{ControllerConfig, Foo, run};
    use k8s_openapi::api::apps::v1::Deployment;

    let foo = ApiResource::erase::<Foo>(&());
    let deployment = ApiResource::erase::<Deployment>(&());
    let name = "example-foo".to_string();
    let workload = Workload {
        name: "sample".into(),
        resources: vec![foo.clone(), deployment],
        steps: vec![
            Action::Create(
                foo.clone(),
                json!({
                    "apiVersion": "samplecontroller.k8s.io/v1alpha1",
                    "kind": "Foo",
                    "metadata": {"name": name},
                    "spec": {"deploymentName": "example-dep", "replicas": 1}
                }),
            ),
            Action::Patch(foo.clone(), name.clone(), json!({"spec": {"replicas": 3}})),
            Action::Patch(
                foo.clone(),
                name.clone(),
                json!({"spec": {"deploymentName": "example-dep-2"}}),
            ),
            Action::Delete {
                resource: foo,
                name,
                orphan: true,
            },
        ],
        ignored: Vec::new(),
        audit: None,
    };
    let controller: ControllerFn = Arc::new(|client, namespace, shutdown| {
        Box::pin(async move {
            let config = ControllerConfig {
                namespace: Some(namespace),
                ..Default::default()
            };
            if let Err(e) = run(client, config, shutdown).await {
                tracing::error!(error = %e, "the sample controller ended with an error");
            }
        })
    });
    (workload, controller)
}

/// The VM controller's workload on its fake engine, with the controller that runs it: create a
/// VM, resize it, create a second and delete it at once (while it is being created), restart
/// the controller, delete the first. The oracle compares the VirtualMachines (leaving out the
/// server's id, its usage and the status's time, which differ from run to run), and the audit
/// fails a run whose engine still holds a server once every VM is gone: an orphan. Each run
/// has its own fake engine, which outlives the controller's restarts as a real one would.
#[cfg(feature = "vm-controller")]
pub fn vm_fake() -> (Workload, ControllerFn) {
    use std::collections::HashMap;

    use crate::controller::vm::{Driver, FakeDriver, VirtualMachine, VmControllerConfig, run};
    use crate::leaderelection::{LeaderElector, LeaseLock};
    use parking_lot::Mutex;

    let vm = ApiResource::erase::<VirtualMachine>(&());
    let object = |name: &str| {
        json!({
            "apiVersion": "cloudnative.tw/v1alpha1",
            "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"resource": {"cpu": 1, "memory": "1Gi"}}
        })
    };
    let engines: Arc<Mutex<HashMap<String, FakeDriver>>> = Arc::default();
    let engine_of = {
        let engines = engines.clone();
        move |namespace: &str| {
            engines
                .lock()
                .entry(namespace.to_string())
                .or_default()
                .clone()
        }
    };
    let controller: ControllerFn = {
        Arc::new(move |client, namespace, shutdown| {
            let engine = engine_of(&namespace);
            Box::pin(async move {
                let config = VmControllerConfig {
                    namespace: Some(namespace),
                    ..Default::default()
                };
                if let Err(e) = run(
                    client,
                    engine,
                    config,
                    shutdown,
                    None::<LeaderElector<LeaseLock>>,
                )
                .await
                {
                    tracing::error!(error = %e, "the VM controller ended with an error");
                }
            })
        })
    };
    let audit: super::campaign::Audit = Arc::new(move |namespace: &str| {
        let engine = engines.lock().remove(namespace).unwrap_or_default();
        Box::pin(async move {
            match engine.list_servers().await {
                Ok(servers) => servers
                    .into_iter()
                    .map(|s| {
                        format!(
                            "orphaned server {} ({}) of VM {}",
                            s.id,
                            s.name,
                            s.vm_name.unwrap_or_default()
                        )
                    })
                    .collect(),
                Err(e) => vec![format!("the fake engine: {e}")],
            }
        })
    });
    let workload = Workload {
        name: "vm-fake".into(),
        resources: vec![vm.clone()],
        steps: vec![
            Action::Create(vm.clone(), object("vm-a")),
            Action::Patch(
                vm.clone(),
                "vm-a".into(),
                json!({"spec": {"resource": {"cpu": 2, "memory": "2Gi"}}}),
            ),
            Action::All(vec![
                Action::Create(vm.clone(), object("vm-b")),
                Action::Delete {
                    resource: vm.clone(),
                    name: "vm-b".into(),
                    orphan: false,
                },
            ]),
            Action::RestartController,
            Action::Delete {
                resource: vm,
                name: "vm-a".into(),
                orphan: false,
            },
        ],
        ignored: vec![
            "/status/server/id".into(),
            "/status/server/usage".into(),
            "/status/lastUpdateTime".into(),
        ],
        audit: Some(audit),
    };
    (workload, controller)
}
