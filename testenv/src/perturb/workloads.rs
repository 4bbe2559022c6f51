//! The two controllers' workloads, each with the function that runs its controller in a
//! campaign.

use std::sync::Arc;

use kube_client::api::ApiResource;
use serde_json::json;

use super::campaign::{Action, Audit, ControllerFn, Workload};

/// The sample controller's workload: create a Foo, scale it, point it at another Deployment,
/// delete it leaving its Deployments (propagation `Orphan`); the oracle compares Foos and
/// Deployments. The cluster needs the Foo CRD and a controller-manager (the Deployments'
/// status and the garbage collector's orphaning are part of each checkpoint). The controller
/// is the sample controller with its defaults, watching the run's namespace only.
pub fn sample() -> (Workload, ControllerFn) {
    use k8s_openapi::api::apps::v1::Deployment;
    use kubeloop::controller::sample::{ControllerConfig, Foo, run};

    let foos = ApiResource::erase::<Foo>(&());
    let deployment = ApiResource::erase::<Deployment>(&());
    let name = "example-foo".to_string();
    let workload = Workload {
        name: "sample".into(),
        resources: vec![foos.clone(), deployment],
        steps: vec![
            Action::Create(
                foos.clone(),
                json!({
                    "apiVersion": "samplecontroller.k8s.io/v1alpha1",
                    "kind": "Foo",
                    "metadata": {"name": name},
                    "spec": {"deploymentName": "example-dep", "replicas": 1}
                }),
            ),
            Action::Patch(foos.clone(), name.clone(), json!({"spec": {"replicas": 3}})),
            Action::Patch(
                foos.clone(),
                name.clone(),
                json!({"spec": {"deploymentName": "example-dep-2"}}),
            ),
            Action::Delete {
                resource: foos,
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

/// Which engine the VM workload's controller drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmEngine {
    /// The in-memory fake engine, one per run.
    Fake,
    /// The Docker API at `$DOCKER_HOST` (podman in `hack/test`), each run's containers under a
    /// `kubeloop.dev/managed-by` label of their own (the run's namespace).
    Podman,
}

/// The VM controller's workload, with the controller that runs it on `engine`: create a VM,
/// resize it, create a second and delete it at once (while it is being created), restart the
/// controller, delete the first. The oracle compares the VirtualMachines (leaving out the
/// server's id, its usage and the status's time, which differ from run to run), and the audit
/// fails a run whose engine still holds a server of the run once every VM is gone: an orphan
/// (and removes it). The engine outlives the controller's restarts, as a real one does.
pub fn vm(engine: VmEngine) -> (Workload, ControllerFn) {
    use std::collections::HashMap;

    use kubeloop::controller::vm::{
        DockerDriver, DockerDriverConfig, Driver, FakeDriver, VirtualMachine, VmControllerConfig,
        run,
    };
    use kubeloop::leaderelection::{LeaderElector, LeaseLock};
    use parking_lot::Mutex;

    /// The run's engine: a fake kept per namespace, or a Docker driver labelled with it.
    #[derive(Clone)]
    enum Engine {
        Fake(FakeDriver),
        Docker(DockerDriver),
    }
    let fakes: Arc<Mutex<HashMap<String, FakeDriver>>> = Arc::default();
    let engine_of = move |namespace: &str| match engine {
        VmEngine::Fake => Engine::Fake(
            fakes
                .lock()
                .entry(namespace.to_string())
                .or_default()
                .clone(),
        ),
        VmEngine::Podman => Engine::Docker(DockerDriver::new(DockerDriverConfig {
            managed_by: namespace.to_string(),
            ..DockerDriverConfig::from_env()
        })),
    };
    let engine_of = Arc::new(engine_of);
    let controller: ControllerFn = {
        let engine_of = engine_of.clone();
        Arc::new(move |client, namespace, shutdown| {
            let engine = engine_of(&namespace);
            Box::pin(async move {
                let config = VmControllerConfig {
                    namespace: Some(namespace),
                    ..Default::default()
                };
                let none = None::<LeaderElector<LeaseLock>>;
                let result = match engine {
                    Engine::Fake(driver) => run(client, driver, config, shutdown, none).await,
                    Engine::Docker(driver) => run(client, driver, config, shutdown, none).await,
                };
                if let Err(e) = result {
                    tracing::error!(error = %e, "the VM controller ended with an error");
                }
            })
        })
    };
    let audit: Audit = Arc::new(move |namespace: &str| {
        let engine = engine_of(namespace);
        Box::pin(async move {
            async fn orphans<D: Driver>(driver: &D) -> Vec<String> {
                let servers = match driver.list_servers().await {
                    Ok(servers) => servers,
                    Err(e) => return vec![format!("listing the engine's servers: {e}")],
                };
                let mut found = Vec::new();
                for server in servers {
                    found.push(format!(
                        "orphaned server {} ({}) of VM {}",
                        server.id,
                        server.name,
                        server.vm_name.as_deref().unwrap_or_default()
                    ));
                    let uid = server.vm_uid.clone().unwrap_or_default();
                    let _ = driver.delete_server(&server.id, &uid).await;
                }
                found
            }
            match &engine {
                Engine::Fake(driver) => orphans(driver).await,
                Engine::Docker(driver) => orphans(driver).await,
            }
        })
    });
    let vm = ApiResource::erase::<VirtualMachine>(&());
    let object = |name: &str| {
        json!({
            "apiVersion": "cloudnative.tw/v1alpha1",
            "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"resource": {"cpu": 1, "memory": "1Gi"}}
        })
    };
    let workload = Workload {
        name: match engine {
            VmEngine::Fake => "vm-fake".into(),
            VmEngine::Podman => "vm-podman".into(),
        },
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

/// The sample controller's state-centric workload ([`super::StateCampaign`]): one Foo
/// (`example-foo`, Deployment `example-dep`, 2 replicas), its spec changed at and past each
/// bound of `schema` (the Foo CRD's `openAPIV3Schema`). What the spec implies: a Deployment
/// named `spec.deploymentName`, controlled by the Foo, with `spec.replicas` replicas (1 when
/// unset), and the Foo's `status.availableReplicas` equal to that Deployment's. The
/// controller is the sample controller, as in [`sample`].
pub fn sample_state(schema: serde_json::Value) -> (super::StateWorkload, ControllerFn) {
    use k8s_openapi::api::apps::v1::Deployment;
    use kubeloop::controller::sample::Foo;

    let (_, controller) = sample();
    let foos = ApiResource::erase::<Foo>(&());
    let deployments = ApiResource::erase::<Deployment>(&());
    let implied: super::Implied = Arc::new(|primary, snapshot| {
        let name = primary.pointer("/metadata/name").and_then(|n| n.as_str());
        let wanted = primary.pointer("/spec/replicas").and_then(|r| r.as_i64());
        let dep_name = primary
            .pointer("/spec/deploymentName")
            .and_then(|n| n.as_str())
            .unwrap_or("");
        let mut problems = Vec::new();
        let Some(deployment) = snapshot.0.get(&format!("deployments.apps/{dep_name}")) else {
            return vec![format!("no Deployment {dep_name}")];
        };
        let controlled = deployment
            .pointer("/metadata/ownerReferences")
            .and_then(|o| o.as_array())
            .is_some_and(|owners| {
                owners.iter().any(|o| {
                    o.get("kind").and_then(|k| k.as_str()) == Some("Foo")
                        && o.get("name").and_then(|n| n.as_str()) == name
                        && o.get("controller").and_then(|c| c.as_bool()) == Some(true)
                })
            });
        if !controlled {
            problems.push(format!(
                "Deployment {dep_name} is not controlled by the Foo"
            ));
        }
        let replicas = deployment
            .pointer("/spec/replicas")
            .and_then(|r| r.as_i64());
        if replicas != Some(wanted.unwrap_or(1)) {
            problems.push(format!(
                "Deployment {dep_name} has {replicas:?} replicas, the Foo asks for {}",
                wanted.unwrap_or(1)
            ));
        }
        let available = deployment
            .pointer("/status/availableReplicas")
            .and_then(|r| r.as_i64())
            .unwrap_or(0);
        let reported = primary
            .pointer("/status/availableReplicas")
            .and_then(|r| r.as_i64())
            .unwrap_or(0);
        if reported != available {
            problems.push(format!(
                "the Foo reports {reported} available replicas, its Deployment has {available}"
            ));
        }
        problems
    });
    let workload = super::StateWorkload {
        name: "sample".into(),
        resources: vec![foos, deployments],
        object: json!({
            "apiVersion": "samplecontroller.k8s.io/v1alpha1",
            "kind": "Foo",
            "metadata": {"name": "example-foo"},
            "spec": {"deploymentName": "example-dep", "replicas": 2}
        }),
        schema,
        implied,
    };
    (workload, controller)
}
