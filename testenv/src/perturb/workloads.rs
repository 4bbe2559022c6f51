//! The two controllers' workloads, each with the function that runs its controller in a
//! campaign.

use std::sync::Arc;

use kube_client::api::ApiResource;
use serde_json::json;

use super::campaign::{Action, Audit, ControllerFn, Workload};
use super::state::{Implied, Misoperation, Refuses, StateWorkload};

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

impl VmEngine {
    /// The name of a VM workload on this engine (it names the run's namespace).
    fn workload_name(self) -> &'static str {
        match self {
            VmEngine::Fake => "vm-fake",
            VmEngine::Podman => "vm-podman",
        }
    }
}

/// The run's engine: a fake kept per namespace, or a Docker driver labelled with it.
#[derive(Clone)]
enum Engine {
    Fake(kubeloop::controller::vm::FakeDriver),
    Docker(kubeloop::controller::vm::DockerDriver),
}

impl Engine {
    /// The engine's status of server `name`.
    async fn server(
        &self,
        name: &str,
    ) -> Result<
        Option<kubeloop::controller::vm::DriverServerStatus>,
        kubeloop::controller::vm::DriverError,
    > {
        use kubeloop::controller::vm::Driver;
        match self {
            Engine::Fake(driver) => driver.server_status(name).await,
            Engine::Docker(driver) => driver.server_status(name).await,
        }
    }

    /// One line per server the engine still holds for the run, each removed.
    async fn orphans(&self) -> Vec<String> {
        use kubeloop::controller::vm::Driver;
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
        match self {
            Engine::Fake(driver) => orphans(driver).await,
            Engine::Docker(driver) => orphans(driver).await,
        }
    }
}

/// The engine of a run, by the run's namespace.
type EngineOf = Arc<dyn Fn(&str) -> Engine + Send + Sync>;

/// The VM controller on `engine` as campaigns run it, the engine of a run (by its
/// namespace; it outlives the controller's restarts, as a real one does), and the audit that
/// fails a run whose engine still holds a server of the run once every VM is gone: an orphan
/// (and removes it).
fn vm_controller(engine: VmEngine) -> (ControllerFn, EngineOf, Audit) {
    use std::collections::HashMap;

    use kubeloop::controller::vm::{DockerDriver, DockerDriverConfig, VmControllerConfig, run};
    use kubeloop::leaderelection::{LeaderElector, LeaseLock};
    use parking_lot::Mutex;

    let fakes: Arc<Mutex<HashMap<String, kubeloop::controller::vm::FakeDriver>>> = Arc::default();
    let engine_of: EngineOf = Arc::new(move |namespace: &str| match engine {
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
    });
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
    let audit: Audit = {
        let engine_of = engine_of.clone();
        Arc::new(move |namespace: &str| {
            let engine = engine_of(namespace);
            Box::pin(async move { engine.orphans().await })
        })
    };
    (controller, engine_of, audit)
}

/// The VM controller's workload, with the controller that runs it on `engine`: create a VM,
/// resize it, create a second and delete it at once (while it is being created), restart the
/// controller, delete the first. The oracle compares the VirtualMachines (leaving out
/// [`VM_IGNORED`]), and the audit fails a run that leaves an orphaned server.
pub fn vm(engine: VmEngine) -> (Workload, ControllerFn) {
    use kubeloop::controller::vm::VirtualMachine;

    let (controller, _, audit) = vm_controller(engine);
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
        name: engine.workload_name().into(),
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
        ignored: VM_IGNORED.iter().map(|p| p.to_string()).collect(),
        audit: Some(audit),
    };
    (workload, controller)
}

/// What the oracle leaves out of a VirtualMachine: the server's id, its usage and the
/// status's time, which differ from run to run.
const VM_IGNORED: [&str; 3] = [
    "/status/server/id",
    "/status/server/usage",
    "/status/lastUpdateTime",
];

/// The sample controller's state-centric workload ([`super::StateCampaign`]): one Foo
/// (`example-foo`, Deployment `example-dep`, 2 replicas), its spec changed at and past each
/// bound of `schema` (the Foo CRD's `openAPIV3Schema`) and each optional field removed. What
/// the spec implies: a Deployment named `spec.deploymentName`, controlled by the Foo, with
/// `spec.replicas` replicas (when unset, the replicas the Deployment has: like
/// kubernetes/sample-controller, the controller scales only to a `spec.replicas` that is set,
/// and a Deployment it creates without one gets the apiserver's default of 1), and the Foo's
/// `status.availableReplicas` equal to that Deployment's. Every spec the schema allows can be honoured; the misoperation
/// `foreign-deployment` points the Foo at a Deployment of nobody's, which the controller must
/// refuse (sample-controller's `ErrResourceExists` event) and leave untouched. The controller
/// is the sample controller, as in [`sample`].
pub fn sample_state(schema: serde_json::Value) -> (StateWorkload, ControllerFn) {
    use k8s_openapi::api::apps::v1::Deployment;
    use kubeloop::controller::sample::Foo;

    let (_, controller) = sample();
    let foos = ApiResource::erase::<Foo>(&());
    let deployments = ApiResource::erase::<Deployment>(&());
    let implied: Implied =
        Arc::new(|primary, snapshot| Box::pin(async move { foo_implied(&primary, &snapshot) }));
    let foreign = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "foreign-dep"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "foreign"}},
            "template": {
                "metadata": {"labels": {"app": "foreign"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:latest"}]}
            }
        }
    });
    let workload = StateWorkload {
        name: "sample".into(),
        test: "--test sample_controller state_campaign_the_sample_controller".into(),
        resources: vec![foos, deployments.clone()],
        ignored: Vec::new(),
        object: json!({
            "apiVersion": "samplecontroller.k8s.io/v1alpha1",
            "kind": "Foo",
            "metadata": {"name": "example-foo"},
            "spec": {"deploymentName": "example-dep", "replicas": 2}
        }),
        schema,
        implied,
        refuses: Arc::new(|_| None),
        misoperations: vec![Misoperation {
            name: "foreign-deployment".into(),
            setup: vec![(deployments, foreign)],
            patch: json!({"spec": {"deploymentName": "foreign-dep"}}),
            names: vec![
                "\"foreign-dep\"".into(),
                "already exists and is not managed by Foo".into(),
            ],
        }],
        audit: None,
    };
    (workload, controller)
}

/// What is wrong for Foo `primary` given `snapshot` ([`sample_state`]'s implied state).
fn foo_implied(primary: &serde_json::Value, snapshot: &super::Snapshot) -> Vec<String> {
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
    if wanted.is_some() && replicas != wanted {
        problems.push(format!(
            "Deployment {dep_name} has {replicas:?} replicas, the Foo asks for {wanted:?}"
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
}

/// The VM controller's state-centric workload on `engine`: one VM (`vm-state`, 1 CPU,
/// 64Mi), its spec changed at and past each bound of `schema` (the VirtualMachine CRD's
/// `openAPIV3Schema`; its fields are all required, so no removal is allowed). What the spec
/// implies: phase `Active`, a `Ready` condition `True` for the VM's generation, and on the
/// engine a running server with the spec's CPU and memory. What podman must refuse: a memory
/// limit below what the container already uses (below 4 MiB, the runtime's own refusal
/// names the memory limit) and a CPU quota the kernel's CFS cannot hold (over 2^44 µs a
/// 100 ms period: more than about 1.76e8 CPUs); the fake engine refuses nothing. No
/// misoperation: a server of another owner is set up on the engine, not the apiserver
/// (`tests/vm_controller/bad_input.rs` covers it).
pub fn vm_state(engine: VmEngine, schema: serde_json::Value) -> (StateWorkload, ControllerFn) {
    use kubeloop::controller::vm::VirtualMachine;

    let (controller, engine_of, audit) = vm_controller(engine);
    let implied: Implied = Arc::new(move |vm, _| {
        let namespace = vm
            .pointer("/metadata/namespace")
            .and_then(|n| n.as_str())
            .unwrap_or_default();
        let engine = engine_of(namespace);
        Box::pin(async move { vm_implied(&vm, &engine).await })
    });
    let refuses: Refuses = Arc::new(move |vm| match engine {
        VmEngine::Fake => None,
        VmEngine::Podman => podman_refuses(vm),
    });
    let workload = StateWorkload {
        name: engine.workload_name().into(),
        test: "--test vm_controller state_campaign_the_vm_controller".into(),
        resources: vec![ApiResource::erase::<VirtualMachine>(&())],
        ignored: VM_IGNORED.iter().map(|p| p.to_string()).collect(),
        object: json!({
            "apiVersion": "cloudnative.tw/v1alpha1",
            "kind": "VirtualMachine",
            "metadata": {"name": "vm-state"},
            "spec": {"resource": {"cpu": 1, "memory": "64Mi"}}
        }),
        schema,
        implied,
        refuses,
        misoperations: Vec::new(),
        audit: Some(audit),
    };
    (workload, controller)
}

/// What is wrong for VM `vm` on `engine` ([`vm_state`]'s implied state).
async fn vm_implied(vm: &serde_json::Value, engine: &Engine) -> Vec<String> {
    let text = |pointer: &str| vm.pointer(pointer).and_then(|v| v.as_str()).unwrap_or("");
    let mut problems = Vec::new();
    let phase = text("/status/phase");
    if phase != "Active" {
        problems.push(format!("phase {phase:?}, not Active"));
    }
    let generation = vm.pointer("/metadata/generation").and_then(|g| g.as_i64());
    let ready = vm
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("type").and_then(|t| t.as_str()) == Some("Ready"))
        });
    match ready {
        None => problems.push("no Ready condition".into()),
        Some(ready) => {
            let status = ready.get("status").and_then(|s| s.as_str());
            let observed = ready.get("observedGeneration").and_then(|g| g.as_i64());
            if status != Some("True") || observed != generation {
                problems.push(format!(
                    "Ready is {status:?} for generation {observed:?}, the VM's is {generation:?}"
                ));
            }
        }
    }
    let server =
        kubeloop::controller::vm::server_name(text("/metadata/namespace"), text("/metadata/name"));
    let cpu = vm
        .pointer("/spec/resource/cpu")
        .and_then(|q| quantity(q, 1000.0));
    let memory = vm
        .pointer("/spec/resource/memory")
        .and_then(|q| quantity(q, 1.0));
    match engine.server(&server).await {
        Err(e) => problems.push(format!("asking the engine: {e}")),
        Ok(None) => problems.push(format!("no server {server} on the engine")),
        Ok(Some(status)) => {
            if status.state != "running" {
                problems.push(format!("server {server} is {}", status.state));
            }
            if Some(status.cpu_millis) != cpu || Some(status.memory_bytes) != memory {
                problems.push(format!(
                    "server {server} has {} CPU millis and {} bytes, the spec asks for \
                     {cpu:?} and {memory:?}",
                    status.cpu_millis, status.memory_bytes
                ));
            }
        }
    }
    problems
}

/// What podman must refuse of VM `vm` ([`vm_state`]), as the words its refusal names.
fn podman_refuses(vm: &serde_json::Value) -> Option<Vec<String>> {
    /// The kernel's CFS quota bound (`max_cfs_runtime`, 2^44 µs) over podman's 100 ms period.
    const MOST_CPUS: u64 = (1 << 44) / 100_000;
    let memory = quantity(vm.pointer("/spec/resource/memory")?, 1.0)?;
    let cpu_millis = quantity(vm.pointer("/spec/resource/cpu")?, 1000.0)?;
    if memory < 4 << 20 {
        Some(vec!["memory limit".into()])
    } else if cpu_millis / 1000 > MOST_CPUS {
        Some(vec!["cpu".into()])
    } else {
        None
    }
}

/// A Kubernetes quantity as the VM's spec holds one (a JSON integer, or `2`, `500m`, `1Gi`,
/// `4G`) times `unit` (1000 for CPU millis, 1 for bytes), read here apart from the
/// controller's own parser so that the oracle does not share its bugs; `None` if it is not
/// one. Through `f64`: exact below 2^53, which the campaign's values are.
fn quantity(value: &serde_json::Value, unit: f64) -> Option<u64> {
    let text = match value {
        serde_json::Value::Number(n) => return n.as_f64().map(|n| (n * unit).round() as u64),
        serde_json::Value::String(s) => s.as_str(),
        _ => return None,
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        binary => {
            let power = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                .iter()
                .position(|s| *s == binary)?;
            1024f64.powi(power as i32 + 1)
        }
    };
    Some((number * factor * unit).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_the_apiserver_reads_them() {
        let q = |v: serde_json::Value, unit| quantity(&v, unit);
        assert_eq!(q(json!(2), 1000.0), Some(2000));
        assert_eq!(q(json!("500m"), 1000.0), Some(500));
        assert_eq!(q(json!("1.5"), 1000.0), Some(1500));
        assert_eq!(q(json!("64Mi"), 1.0), Some(64 << 20));
        assert_eq!(q(json!("4G"), 1.0), Some(4_000_000_000));
        assert_eq!(q(json!(9223372036u64), 1000.0), Some(9_223_372_036_000));
        assert_eq!(q(json!("4X"), 1.0), None);
    }

    #[test]
    fn podman_must_refuse_a_memory_limit_under_its_use_and_a_quota_cfs_cannot_hold() {
        let vm = |cpu: serde_json::Value, memory: serde_json::Value| {
            podman_refuses(&json!({"spec": {"resource": {"cpu": cpu, "memory": memory}}}))
        };
        assert_eq!(vm(json!(1), json!("64Mi")), None);
        assert_eq!(vm(json!(1), json!(1)), Some(vec!["memory limit".into()]));
        assert_eq!(
            vm(json!(9223372036u64), json!("64Mi")),
            Some(vec!["cpu".into()])
        );
        assert_eq!(vm(json!(175_921_860), json!("64Mi")), None);
    }
}
