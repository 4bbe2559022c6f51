//! The sample controller against the real local control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, a kwok node): Deployments really become available,
//! the garbage collector really deletes, the apiserver really validates the CRD's schema.
//!
//! Each test runs its own controller in-process (`run` with a cancellation token), watching
//! only the test's namespace, so tests sharing the cluster do not see each other's Foos. The
//! last test runs the real `kubeloop sample-controller` binary.

// `foo` is the resource under test, not a placeholder name.
#![allow(clippy::disallowed_names)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube_client::core::GroupVersionKind;
use kubeloop::controller::sample::{ControllerConfig, ControllerError, Foo, FooSpec, run};
use kubeloop::testing::eventually;
use kubeloop_testenv::{self as testenv, Kubeloop};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const CRD_YAML: &str = include_str!("../crds/foo.yaml");
const EXAMPLE_FOO_YAML: &str = include_str!("../examples/example-foo.yaml");
const WAIT: Duration = Duration::from_secs(120);

/// A controller running in this process.
struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ControllerError>>,
}

fn start_controller(client: &Client, namespace: &str) -> Running {
    let shutdown = CancellationToken::new();
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        ..Default::default()
    };
    let task = tokio::spawn(run(client.clone(), config, shutdown.clone()));
    Running { shutdown, task }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("controller stops within 30 s");
        result
            .expect("controller task did not panic")
            .expect("controller ran without error");
    }
}

struct Apis {
    foos: Api<Foo>,
    deployments: Api<Deployment>,
    pods: Api<Pod>,
    events: Api<Event>,
}

async fn setup(prefix: &str) -> (Client, String, Apis) {
    let cluster = testenv::shared_full().await;
    let client = cluster.client().await.unwrap();
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(CRD_YAML).expect("crds/foo.yaml parses");
    testenv::ensure_crd(&client, &crd).await;
    let ns = cluster.new_namespace(prefix).await.unwrap();
    let apis = Apis {
        foos: Api::namespaced(client.clone(), &ns),
        deployments: Api::namespaced(client.clone(), &ns),
        pods: Api::namespaced(client.clone(), &ns),
        events: Api::namespaced(client.clone(), &ns),
    };
    (client, ns, apis)
}

/// A plain HTTP/1.1 GET; returns the whole response (status line, headers, body).
async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

fn foo(name: &str, deployment: &str, replicas: i32) -> Foo {
    let mut foo = Foo::namespaced(
        "",
        name,
        FooSpec {
            deployment_name: deployment.to_string(),
            replicas: Some(replicas),
        },
    );
    foo.metadata.namespace = None;
    foo
}

async fn set_replicas(foos: &Api<Foo>, name: &str, replicas: i32) {
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    foos.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits until the Deployment has `replicas` available and the Foo reports the same.
async fn wait_available(apis: &Apis, foo: &str, deployment: &str, replicas: i32) {
    eventually(
        &format!("deployment {deployment} with {replicas} available replicas"),
        WAIT,
        || async {
            let Some(d) = apis.deployments.get_opt(deployment).await.unwrap() else {
                return false;
            };
            d.spec.as_ref().and_then(|s| s.replicas) == Some(replicas)
                && d.status.as_ref().and_then(|s| s.available_replicas) == Some(replicas)
        },
    )
    .await;
    eventually(
        &format!("foo {foo} status.availableReplicas {replicas}"),
        WAIT,
        || async {
            let f = apis.foos.get(foo).await.unwrap();
            f.status.map(|s| s.available_replicas) == Some(replicas)
        },
    )
    .await;
}

/// A Deployment named `name` that no Foo owns.
fn someone_elses_deployment(name: &str) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"owner": "someone-else"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {"metadata": {"labels": {"app": "theirs"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        }
    }))
    .unwrap()
}

/// The events.k8s.io/v1 Events regarding `name` with `reason`.
async fn events_about(apis: &Apis, name: &str, reason: &str) -> Vec<Event> {
    apis.events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// How many times the Event was observed: its series' count, 1 without a series.
fn observed(event: &Event) -> i32 {
    event.series.as_ref().map_or(1, |s| s.count)
}

#[tokio::test]
async fn the_example_foo_gets_an_available_deployment_and_scaling_the_foo_scales_it() {
    let (client, ns, apis) = setup("sample-example").await;
    let controller = start_controller(&client, &ns);

    let example: Foo =
        serde_saphyr::from_str(EXAMPLE_FOO_YAML).expect("examples/example-foo.yaml parses");
    let started = std::time::Instant::now();
    apis.foos
        .create(&PostParams::default(), &example)
        .await
        .unwrap();
    wait_available(&apis, "example-foo", "example-foo", 1).await;
    println!(
        "measured: example Foo created -> Deployment 1/1 available and Foo status 1 in {:?}",
        started.elapsed()
    );

    let created = apis.foos.get("example-foo").await.unwrap();
    let d = apis.deployments.get("example-foo").await.unwrap();
    let owner = d
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .expect("an ownerReference");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Foo", "example-foo")
    );
    assert_eq!(Some(owner.uid.as_str()), created.metadata.uid.as_deref());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    let labels = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(labels.get("app").map(String::as_str), Some("nginx"));
    assert_eq!(
        labels.get("controller").map(String::as_str),
        Some("example-foo")
    );
    let container = &d
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx:latest"));

    eventually("a Normal Synced event on the Foo", WAIT, || async {
        events_about(&apis, "example-foo", "Synced")
            .await
            .iter()
            .any(|e| {
                e.type_.as_deref() == Some("Normal")
                    && e.note.as_deref() == Some("Foo synced successfully")
                    && e.action.as_deref() == Some("Sync")
                    && e.reporting_controller.as_deref() == Some("sample-controller")
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Foo")
                    && e.related
                        .as_ref()
                        .map(|r| (r.kind.as_deref(), r.name.as_deref()))
                        == Some((Some("Deployment"), Some("example-foo")))
            })
    })
    .await;

    let started = std::time::Instant::now();
    set_replicas(&apis.foos, "example-foo", 3).await;
    wait_available(&apis, "example-foo", "example-foo", 3).await;
    println!(
        "measured: Foo scaled 1 -> 3 -> Deployment 3/3 available and Foo status 3 in {:?}",
        started.elapsed()
    );
    let pods = apis
        .pods
        .list(&ListParams::default().labels("app=nginx,controller=example-foo"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 3);

    // Someone scales the Deployment by hand: the controller puts the Foo's replicas back.
    let patch = serde_json::json!({"spec": {"replicas": 5}});
    apis.deployments
        .patch(
            "example-foo",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    eventually(
        "the hand-scaled Deployment back at 3 replicas",
        WAIT,
        || async {
            let d = apis.deployments.get("example-foo").await.unwrap();
            d.spec.and_then(|s| s.replicas) == Some(3)
        },
    )
    .await;
    wait_available(&apis, "example-foo", "example-foo", 3).await;
    // The two extra Pods the hand-scaling started are scaled away again.
    eventually("3 Pods left", WAIT, || async {
        let pods = apis
            .pods
            .list(&ListParams::default().labels("app=nginx,controller=example-foo"))
            .await
            .unwrap();
        pods.items.len() == 3
    })
    .await;

    // Syncs that changed something each said so; repeats about one version of the Foo and its
    // Deployment are one Event with a series. client-go's tools/events keys an Event by the
    // whole references, resourceVersions included (`getKey`), and a write makes a new version,
    // so no two Synced Events name the same pair of versions.
    let synced = events_about(&apis, "example-foo", "Synced").await;
    let mut versions: Vec<_> = synced
        .iter()
        .map(|e| {
            [&e.regarding, &e.related].map(|r| r.as_ref().and_then(|r| r.resource_version.clone()))
        })
        .collect();
    versions.sort();
    versions.dedup();
    assert_eq!(versions.len(), synced.len(), "{synced:#?}");
    assert!(
        versions.iter().flatten().all(Option::is_some),
        "{synced:#?}"
    );

    // A user reads the events.k8s.io/v1 Event where they look: `kubectl events` and the
    // Events section of `kubectl describe`.
    for args in [
        vec!["-n", ns.as_str(), "events", "--for", "foo/example-foo"],
        vec!["-n", ns.as_str(), "describe", "foo", "example-foo"],
    ] {
        let out = testenv::shared_full().await.kubectl(&args).ok();
        assert!(
            out.contains("Synced") && out.contains("Foo synced successfully"),
            "kubectl {args:?} shows the Synced event:\n{out}"
        );
    }

    // `kubectl get foos` shows the CRD's printer columns.
    let table = testenv::shared_full()
        .await
        .kubectl(&["-n", &ns, "get", "foos"])
        .ok();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "DEPLOYMENT", "REPLICAS", "AVAILABLE", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["example-foo", "example-foo", "3", "3"],
        "{table}"
    );

    controller.stop().await;
}

#[tokio::test]
async fn a_deployment_made_by_someone_else_gets_a_warning_event_and_is_left_untouched() {
    let (client, ns, apis) = setup("sample-taken").await;
    let theirs = apis
        .deployments
        .create(&PostParams::default(), &someone_elses_deployment("taken"))
        .await
        .unwrap();
    let controller = start_controller(&client, &ns);
    apis.foos
        .create(&PostParams::default(), &foo("squatter", "taken", 1))
        .await
        .unwrap();

    let message = "Resource \"taken\" already exists and is not managed by Foo";
    eventually(
        "an ErrResourceExists Warning counted at least twice",
        WAIT,
        || async {
            let warnings = events_about(&apis, "squatter", "ErrResourceExists").await;
            warnings.len() == 1
                && warnings[0].type_.as_deref() == Some("Warning")
                && warnings[0].note.as_deref() == Some(message)
                && warnings[0].related.as_ref().and_then(|r| r.name.as_deref()) == Some("taken")
                && observed(&warnings[0]) >= 2
        },
    )
    .await;

    let after = apis.deployments.get("taken").await.unwrap();
    assert_eq!(
        after.metadata.generation, theirs.metadata.generation,
        "spec never written"
    );
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(2));
    assert!(after.metadata.owner_references.is_none());
    assert_eq!(after.metadata.labels, theirs.metadata.labels);
    let status = apis.foos.get("squatter").await.unwrap().status;
    assert!(
        status.is_none(),
        "no status written for a Foo whose Deployment is not ours: {status:?}"
    );
    assert!(events_about(&apis, "squatter", "Synced").await.is_empty());

    // What a user sees.
    let described = testenv::shared_full()
        .await
        .kubectl(&["-n", &ns, "describe", "foo", "squatter"])
        .ok();
    assert!(
        described.lines().any(|l| l.contains("Warning")
            && l.contains("ErrResourceExists")
            && l.contains(message)),
        "kubectl describe shows the warning:\n{described}"
    );

    controller.stop().await;
}

#[tokio::test]
async fn deleting_the_foo_garbage_collects_its_deployment_and_pods() {
    let (client, ns, apis) = setup("sample-gc").await;
    let controller = start_controller(&client, &ns);
    apis.foos
        .create(&PostParams::default(), &foo("doomed", "doomed-web", 2))
        .await
        .unwrap();
    wait_available(&apis, "doomed", "doomed-web", 2).await;
    let selector = ListParams::default().labels("controller=doomed");
    assert_eq!(apis.pods.list(&selector).await.unwrap().items.len(), 2);

    apis.foos
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Deployment and its Pods to be garbage-collected",
        WAIT,
        || async {
            apis.deployments
                .get_opt("doomed-web")
                .await
                .unwrap()
                .is_none()
                && apis.pods.list(&selector).await.unwrap().items.is_empty()
        },
    )
    .await;

    controller.stop().await;
}

#[tokio::test]
async fn a_controller_restarted_mid_way_converges_on_what_changed_while_it_was_down() {
    let (client, ns, apis) = setup("sample-restart").await;
    let first = start_controller(&client, &ns);
    apis.foos
        .create(&PostParams::default(), &foo("steady", "steady-web", 1))
        .await
        .unwrap();
    wait_available(&apis, "steady", "steady-web", 1).await;
    first.stop().await;

    // While no controller runs: scale one Foo, add another, and delete the first one's
    // Deployment out from under it.
    set_replicas(&apis.foos, "steady", 2).await;
    apis.foos
        .create(
            &PostParams::default(),
            &foo("latecomer", "latecomer-web", 1),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let d = apis.deployments.get("steady-web").await.unwrap();
    assert_eq!(
        d.spec.unwrap().replicas,
        Some(1),
        "nothing scales it while the controller is down"
    );
    assert!(
        apis.deployments
            .get_opt("latecomer-web")
            .await
            .unwrap()
            .is_none()
    );

    let second = start_controller(&client, &ns);
    wait_available(&apis, "steady", "steady-web", 2).await;
    wait_available(&apis, "latecomer", "latecomer-web", 1).await;

    // A Deployment deleted behind the controller's back is recreated.
    apis.deployments
        .delete("latecomer-web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("latecomer-web recreated", WAIT, || async {
        match apis.deployments.get_opt("latecomer-web").await.unwrap() {
            Some(d) => d.metadata.deletion_timestamp.is_none(),
            None => false,
        }
    })
    .await;
    wait_available(&apis, "latecomer", "latecomer-web", 1).await;
    second.stop().await;
}

#[tokio::test]
async fn invalid_foos_are_refused_by_the_apiserver_with_the_crd_validation_message() {
    let (client, ns, _apis) = setup("sample-invalid").await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("samplecontroller.k8s.io", "v1alpha1", "Foo"),
        "foos",
    );
    let foos: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    let cases = [
        (
            "zero",
            serde_json::json!({"deploymentName": "web", "replicas": 0}),
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ),
        (
            "eleven",
            serde_json::json!({"deploymentName": "web", "replicas": 11}),
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        ),
        (
            "nameless",
            serde_json::json!({"replicas": 1}),
            "spec.deploymentName: Required value",
        ),
        (
            "badname",
            serde_json::json!({"deploymentName": "Not_A_Name", "replicas": 1}),
            "spec.deploymentName in body should match",
        ),
        // 64 characters: too long for the Deployment's `controller` label value it becomes.
        (
            "a-foo-whose-name-is-longer-than-a-label-value-can-be-0123456789a",
            serde_json::json!({"deploymentName": "web", "replicas": 1}),
            "metadata.name must be at most 63 characters: it becomes the value of the Deployment's controller label",
        ),
    ];

    for (name, spec, want) in cases {
        let mut obj = DynamicObject::new(name, &resource);
        obj.data = serde_json::json!({"spec": spec});
        let err = foos
            .create(&PostParams::default(), &obj)
            .await
            .expect_err(&format!("{name} must be refused"));
        let kube_client::Error::Api(status) = err else {
            panic!("{name}: want an API error, got {err}")
        };
        assert_eq!(status.code, 422, "{name}: {status:?}");
        assert!(
            status.message.contains(want),
            "{name}: message {:?} lacks {want:?}",
            status.message
        );
    }
    let mut ok = DynamicObject::new("fine", &resource);
    ok.data = serde_json::json!({"spec": {"deploymentName": "web", "replicas": 10}});
    foos.create(&PostParams::default(), &ok)
        .await
        .expect("replicas 10 is valid");
}

#[tokio::test]
async fn the_kubeloop_binary_runs_the_controller_and_stops_on_sigterm() {
    let (_client, ns, apis) = setup("sample-binary").await;
    let cluster = testenv::shared_full().await;
    let log_path = cluster.dir().join(format!("{ns}-controller.log"));
    let ops_addr = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
    let mut child = Kubeloop::new([
        "sample-controller",
        "--namespace",
        &ns,
        "--workers",
        "3",
        "--resync",
        "10s",
        "--metrics-bind-address",
        &ops_addr,
        // Plain HTTP: the scrape below checks series, not the metrics auth.
        "--metrics-secure=false",
        "--health-probe-bind-address",
        &ops_addr,
    ])
    .kubeconfig(cluster.kubeconfig_path())
    .log_to(log_path)
    .start();

    apis.foos
        .create(&PostParams::default(), &foo("bin-foo", "bin-web", 1))
        .await
        .unwrap();
    wait_available(&apis, "bin-foo", "bin-web", 1).await;
    assert!(child.exited().is_none(), "still running");

    // Its probes and metrics: ready, and the workqueue has seen the Foo.
    let readyz = http_get(&ops_addr, "/readyz").await;
    assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
    let metrics = http_get(&ops_addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let adds = metrics
        .lines()
        .find(|l| l.starts_with("workqueue_adds_total{name=\"Foos\"}"))
        .unwrap_or_else(|| panic!("no Foos adds series in:\n{metrics}"));
    let adds: f64 = adds.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(adds >= 1.0, "{adds}");
    assert!(metrics.contains("kubeloop_reflector_lists"), "{metrics}");

    child.signal(libc::SIGTERM);
    let status = child.wait(Duration::from_secs(30)).await;
    let logs = child.log();
    assert!(
        status.success(),
        "clean exit after SIGTERM, got {status}; log:\n{logs}"
    );
    assert!(logs.contains("shutting down"), "log:\n{logs}");
    assert!(logs.contains("shut down"), "log:\n{logs}");
}

#[tokio::test]
async fn the_rbac_example_grants_everything_the_controller_needs() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
    use kube_client::core::ObjectMeta;

    let (admin, ns, apis) = setup("sample-rbac").await;
    let cluster = testenv::shared_full().await;
    let rbac_yaml = include_str!("../examples/sample-controller-rbac.yaml");
    let role_doc = rbac_yaml
        .split("\n---\n")
        .find(|doc| doc.contains("kind: ClusterRole\n"))
        .expect("a ClusterRole in the RBAC example");
    let role: ClusterRole = serde_saphyr::from_str(role_doc).expect("the ClusterRole parses");
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    match roles.create(&PostParams::default(), &role).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => panic!("creating the ClusterRole: {e}"),
    }
    // Bind it to a plain user (the manifest binds the ServiceAccount a Pod would use).
    let user = format!("{ns}-controller");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(user.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.metadata.name.clone().unwrap(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.clone(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let restricted = Client::try_from(cluster.user_config(&user, &[]).unwrap()).unwrap();
    // The role is no wider than it says: deleting Foos is refused.
    let denied = Api::<Foo>::namespaced(restricted.clone(), "kube-system")
        .delete("anything", &DeleteParams::default())
        .await
        .expect_err("the role grants no deletes");
    assert!(
        matches!(&denied, kube_client::Error::Api(s) if s.is_forbidden()),
        "{denied}"
    );

    let controller = start_controller(&restricted, &ns);
    apis.foos
        .create(&PostParams::default(), &foo("limited", "limited-web", 2))
        .await
        .unwrap();
    wait_available(&apis, "limited", "limited-web", 2).await;
    set_replicas(&apis.foos, "limited", 1).await;
    wait_available(&apis, "limited", "limited-web", 1).await;
    // A Foo whose sync keeps failing the same way: the repeat is a patch of its Event's series.
    apis.deployments
        .create(&PostParams::default(), &someone_elses_deployment("taken"))
        .await
        .unwrap();
    apis.foos
        .create(&PostParams::default(), &foo("squatter", "taken", 1))
        .await
        .unwrap();
    eventually(
        "a Synced Event and an ErrResourceExists series written as the restricted user",
        WAIT,
        || async {
            !events_about(&apis, "limited", "Synced").await.is_empty()
                && events_about(&apis, "squatter", "ErrResourceExists")
                    .await
                    .iter()
                    .any(|e| observed(e) >= 2)
        },
    )
    .await;
    controller.stop().await;
}

/// Delegates to the real client, counting status writes.
struct CountingClient {
    inner: kubeloop::controller::sample::KubeSyncClient,
    status_writes: std::sync::atomic::AtomicUsize,
}

impl kubeloop::controller::sample::SyncClient for CountingClient {
    fn foo(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Foo>> {
        self.inner.foo(namespace, name)
    }
    fn deployment(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Deployment>> {
        self.inner.deployment(namespace, name)
    }
    async fn create_deployment(&self, d: &Deployment) -> Result<Deployment, kube_client::Error> {
        self.inner.create_deployment(d).await
    }
    async fn update_deployment(&self, d: &Deployment) -> Result<Deployment, kube_client::Error> {
        self.inner.update_deployment(d).await
    }
    async fn update_foo_status(&self, foo: &Foo) -> Result<Foo, kube_client::Error> {
        self.status_writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.update_foo_status(foo).await
    }
    async fn get_foo(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Foo>, kube_client::Error> {
        self.inner.get_foo(namespace, name).await
    }
    fn record_event(
        &self,
        foo: &Foo,
        related: Option<&Deployment>,
        event_type: kubeloop::record::EventType,
        reason: &str,
        message: &str,
    ) {
        self.inner
            .record_event(foo, related, event_type, reason, message)
    }
}

#[tokio::test]
async fn a_status_write_from_a_stale_cache_gets_a_real_conflict_and_is_retried() {
    use kubeloop::cache::{Lister, ThreadSafeStore};
    use kubeloop::controller::sample::{new_deployment, sync_handler};
    use kubeloop::record::AnyEventBroadcaster;

    let (client, ns, apis) = setup("sample-conflict").await;
    let created = apis
        .foos
        .create(&PostParams::default(), &foo("stale", "stale-web", 1))
        .await
        .unwrap();
    let deployment = apis
        .deployments
        .create(&PostParams::default(), &new_deployment(&created))
        .await
        .unwrap();
    // Someone changes the Foo after our "cache" copied it: the cached resourceVersion is old.
    let patch = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
    let newer = apis
        .foos
        .patch("stale", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_ne!(
        newer.metadata.resource_version,
        created.metadata.resource_version
    );

    let foos = ThreadSafeStore::new(Default::default());
    foos.add(format!("{ns}/stale"), std::sync::Arc::new(created.clone()));
    let deployments = ThreadSafeStore::new(Default::default());
    deployments.add(format!("{ns}/stale-web"), std::sync::Arc::new(deployment));
    let (broadcaster, recorder) =
        AnyEventBroadcaster::discover(client.clone(), "conflict-test", "conflict-test-1").await;
    let sync_client = CountingClient {
        inner: kubeloop::controller::sample::KubeSyncClient::new(
            client.clone(),
            Lister::new(foos.reader()),
            Lister::new(deployments.reader()),
            recorder,
        ),
        status_writes: Default::default(),
    };

    sync_handler(
        &sync_client,
        &kubeloop::runtime::ObjectKey::new(&ns, "stale"),
        &kubeloop::runtime::ReconcileContext::detached(),
    )
    .await
    .expect("the conflict is retried, not returned");
    assert_eq!(
        sync_client
            .status_writes
            .load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one write refused with 409, one on the fresh read"
    );
    let stored = apis.foos.get("stale").await.unwrap();
    assert_eq!(stored.status.map(|s| s.available_replicas), Some(0));
    assert_eq!(
        stored
            .metadata
            .labels
            .unwrap()
            .get("touched")
            .map(String::as_str),
        Some("yes"),
        "the other writer's change survives"
    );
    broadcaster.shutdown().await;
}

#[tokio::test]
async fn without_the_crd_the_binary_says_so_and_a_sigterm_before_sync_is_an_error() {
    // The apiserver-only cluster of this test binary never gets the Foo CRD.
    let cluster = testenv::shared().await;
    let mut child = Kubeloop::new(["sample-controller"])
        .kubeconfig(cluster.kubeconfig_path())
        .start();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(child.exited().is_none(), "keeps waiting for the CRD");
    child.signal(libc::SIGTERM);
    let status = child.wait(Duration::from_secs(30)).await;
    let stderr = child.log();
    assert!(
        stderr.contains("the Foo CRD (foos.samplecontroller.k8s.io) is not installed"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "stopped before the caches synced: [\"samplecontroller.k8s.io/v1alpha1/foos\"] not synced"
        ),
        "only the Foo informer is named: {stderr}"
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
}

/// A sharded replica of the controller in this process, contending as `identity`; with
/// `watch_held_shards`, its informers list and watch only the shards it holds.
fn start_sharded(
    client: &Client,
    namespace: &str,
    identity: &str,
    watch_held_shards: bool,
) -> Running {
    let shutdown = CancellationToken::new();
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        sharding: Some(kubeloop::runtime::ShardingConfig {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(500),
            ..kubeloop::runtime::ShardingConfig::new("foos", 4, identity)
        }),
        sharding_namespace: namespace.to_string(),
        watch_held_shards,
        ..Default::default()
    };
    let task = tokio::spawn(run(client.clone(), config, shutdown.clone()));
    Running { shutdown, task }
}

/// Holders of the ring `foos`'s four shard Leases.
async fn foo_shard_holders(client: &Client, namespace: &str) -> Vec<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), namespace);
    let mut holders = Vec::new();
    for shard in 0..4 {
        holders.push(
            leases
                .get_opt(&format!("foos-shard-{shard}"))
                .await
                .unwrap()
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .unwrap_or_default(),
        );
    }
    holders
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sharded_replicas_split_the_foos_and_one_takes_all_when_the_other_stops() {
    two_sharded_replicas(false).await;
}

// The same with `--watch-held-shards`: the Foos of one namespace are all in one shard, so one
// replica caches them all and the other none until it takes that shard over.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_watching_only_their_shards_split_and_hand_over_the_foos() {
    two_sharded_replicas(true).await;
}

async fn two_sharded_replicas(watch_held_shards: bool) {
    let (client, ns, apis) = setup("sample-shards").await;
    let first = start_sharded(&client, &ns, "first", watch_held_shards);
    let second = start_sharded(&client, &ns, "second", watch_held_shards);
    eventually("two shards each", WAIT, || async {
        let h = foo_shard_holders(&client, &ns).await;
        h.iter().filter(|h| *h == "first").count() == 2
            && h.iter().filter(|h| *h == "second").count() == 2
    })
    .await;
    for i in 0..6 {
        apis.foos
            .create(
                &PostParams::default(),
                &foo(&format!("foo-{i}"), &format!("dep-{i}"), 1),
            )
            .await
            .unwrap();
    }
    for i in 0..6 {
        wait_available(&apis, &format!("foo-{i}"), &format!("dep-{i}"), 1).await;
    }

    // The first stops (SIGTERM's path): its shards are released after its reconciles ended
    // and the second takes them; a change to any Foo is then made by the second.
    first.stop().await;
    eventually("the second holds every shard", WAIT, || async {
        foo_shard_holders(&client, &ns)
            .await
            .iter()
            .all(|h| h == "second")
    })
    .await;
    for i in 0..6 {
        set_replicas(&apis.foos, &format!("foo-{i}"), 2).await;
    }
    for i in 0..6 {
        wait_available(&apis, &format!("foo-{i}"), &format!("dep-{i}"), 2).await;
    }
    second.stop().await;
    assert!(
        foo_shard_holders(&client, &ns)
            .await
            .iter()
            .all(String::is_empty),
        "a stopped replica releases its shards"
    );
}

// --- perturbation testing (kubeloop_testenv::perturb) ------------------------------------------------

/// A copy of the sample controller with one deliberate non-idempotent step: it finds its
/// Deployment by owner, and when its cache shows none it creates one under a *generated* name.
/// On a fresh view that is harmless (read-your-writes holds the next reconcile until the cache
/// has the Deployment); on a view held back past that wait, it creates a second Deployment,
/// where the real controller's fixed name makes the apiserver refuse the duplicate. It ignores
/// `deploymentName`, and its reference run says what it does instead.
fn seeded_bug_controller() -> kubeloop_testenv::perturb::ControllerFn {
    seeded_controller(SeededBug::GeneratedName)
}

/// The deliberate bugs of [`seeded_controller`].
#[derive(Clone, Copy, PartialEq)]
enum SeededBug {
    /// Creates its Deployment under a generated name ([`seeded_bug_controller`]).
    GeneratedName,
    /// Writes a status that changes on every reconcile (a `Synced` condition stamped now),
    /// with the Deployment named by `deploymentName`: not idempotent.
    RestlessStatus,
    /// Never lowers the Deployment's replicas (only scales up), with the Deployment named by
    /// `deploymentName`: a revert of a raise is ignored.
    IgnoresRevert,
    /// Takes the Deployment named by `deploymentName` whoever owns it (scales it, reports its
    /// replicas), with no event: a misoperation it must refuse is honoured.
    AdoptsForeign,
}

/// A copy of the sample controller with `bug` in it.
fn seeded_controller(bug: SeededBug) -> kubeloop_testenv::perturb::ControllerFn {
    use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
    use kubeloop::controller::sample::new_deployment;
    use kubeloop::runtime::{
        Action, Controller, ObjectKey, ReconcileContext, default_error_policy,
    };
    use std::sync::Arc;

    Arc::new(
        move |client: Client, namespace: String, shutdown: CancellationToken| {
            Box::pin(async move {
                let factory = SharedInformerFactory::new(
                    client.clone(),
                    FactoryOptions {
                        namespace: Some(namespace),
                        ..Default::default()
                    },
                );
                let (foos, deployments) =
                    (factory.informer::<Foo>(), factory.informer::<Deployment>());
                let (foo_cache, deployment_cache) = (foos.lister(), deployments.lister());
                let reconcile = move |key: ObjectKey, ctx: ReconcileContext| {
                    let (client, foo_cache, deployment_cache) =
                        (client.clone(), foo_cache.clone(), deployment_cache.clone());
                    async move {
                        let ns = key.namespace().unwrap_or_default().to_string();
                        let Some(foo) = foo_cache.get(&ns, key.name()) else {
                            return Ok(Action::Done);
                        };
                        let uid = foo.metadata.uid.clone();
                        let wanted_name = foo.spec.deployment_name.clone();
                        let owned = deployment_cache
                            .namespaced(&ns)
                            .list(&Default::default())
                            .into_iter()
                            .find(|d| {
                                let named =
                                    d.metadata.name.as_deref() == Some(wanted_name.as_str());
                                let owned = d.metadata.owner_references.iter().flatten().any(|o| {
                                    o.controller == Some(true) && Some(&o.uid) == uid.as_ref()
                                });
                                match bug {
                                    SeededBug::GeneratedName => owned,
                                    // The seeded bug: a Deployment of that name is taken as is.
                                    SeededBug::AdoptsForeign => named,
                                    _ => named && owned,
                                }
                            });
                        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
                        let deployment = match owned {
                            Some(d) => (*d).clone(),
                            None => {
                                let mut d = new_deployment(&foo);
                                if bug == SeededBug::GeneratedName {
                                    // The seeded bug.
                                    d.metadata.generate_name =
                                        d.metadata.name.take().map(|_| format!("{}-", key.name()));
                                }
                                ctx.check()?;
                                let created = api.create(&PostParams::default(), &d).await?;
                                ctx.wrote(&created);
                                created
                            }
                        };
                        let mut want = foo.spec.replicas;
                        if bug == SeededBug::IgnoresRevert {
                            // The seeded bug: only ever scale up.
                            let has = deployment.spec.as_ref().and_then(|s| s.replicas);
                            want = want.max(has);
                        }
                        let deployment =
                            if deployment.spec.as_ref().and_then(|s| s.replicas) != want {
                                let patch = serde_json::json!({"spec": {"replicas": want}});
                                let name = deployment.metadata.name.clone().unwrap_or_default();
                                ctx.check()?;
                                let patched = api
                                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                                    .await?;
                                ctx.wrote(&patched);
                                patched
                            } else {
                                deployment
                            };
                        let available = deployment
                            .status
                            .as_ref()
                            .and_then(|s| s.available_replicas)
                            .unwrap_or(0);
                        let mut status =
                            serde_json::json!({"status": {"availableReplicas": available}});
                        if bug == SeededBug::RestlessStatus {
                            // The seeded bug: a condition stamped on every reconcile.
                            status["status"]["conditions"] = serde_json::json!([{
                                "type": "Synced", "status": "True", "reason": "Synced",
                                "message": "synced",
                                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                            }]);
                        }
                        let unchanged =
                            foo.status.as_ref().map(|s| s.available_replicas) == Some(available);
                        if bug == SeededBug::IgnoresRevert && unchanged {
                            // Only the seeded bug: a status already right is not written.
                            return Ok(Action::Done);
                        }
                        let foos: Api<Foo> = Api::namespaced(client, &ns);
                        ctx.check()?;
                        let written = foos
                            .patch_status(
                                key.name(),
                                &PatchParams::default(),
                                &Patch::Merge(&status),
                            )
                            .await?;
                        ctx.wrote(&written);
                        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Action::Done)
                    }
                };
                let _ = Controller::new("seeded-bug", foos)
                    .owns(deployments)
                    .enqueue_deletes(false)
                    .run(reconcile, default_error_policy, shutdown)
                    .await;
            })
        },
    )
}

/// The sample workload's campaign, with `controller` in place of the sample controller.
async fn perturbation_campaign(
    controller: Option<kubeloop_testenv::perturb::ControllerFn>,
) -> kubeloop_testenv::perturb::Campaign {
    setup("perturb-setup").await;
    let (workload, sample_controller) = kubeloop_testenv::perturb::sample();
    kubeloop_testenv::perturb::Campaign::new(
        testenv::shared_full().await.client_config(),
        workload,
        controller.unwrap_or(sample_controller),
        Default::default(),
    )
}

/// The harness can fail (issue 38's first proof): the seeded bug passes the reference run, and
/// a stale-view plan generated from that run (the Deployments' informer held back at the
/// seeded Deployment's ADDED) catches it: a second Deployment.
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_view_plan_catches_a_seeded_non_idempotent_create_the_reference_run_misses() {
    use kubeloop_testenv::perturb::Perturbation;
    let campaign = perturbation_campaign(Some(seeded_bug_controller())).await;
    let reference = campaign
        .reference()
        .await
        .expect("the reference run passes");
    let plans: Vec<String> = reference.plans.iter().map(ToString::to_string).collect();
    eprintln!("seeded bug: {} plans: {plans:?}", plans.len());
    let stale_at_the_create: Vec<&Perturbation> = reference
        .plans
        .iter()
        .filter(|p| {
            matches!(p, Perturbation::StaleView { resource, event_type, name, .. }
            if resource == "deployments.apps" && event_type == "ADDED" && name == "example-foo-*")
        })
        .collect();
    assert_eq!(stale_at_the_create.len(), 1, "plans: {plans:?}");
    let outcome = campaign
        .run_plan(&reference, stale_at_the_create[0])
        .await
        .unwrap();
    eprintln!("{}", outcome.summary());
    eprintln!("replay: {}", campaign.replay_command(&outcome.plan));
    assert_eq!(
        outcome.fired.len(),
        1,
        "the plan fired: {}",
        outcome.summary()
    );
    assert!(
        outcome
            .findings
            .iter()
            .any(|f| f.contains("deployments.apps/example-foo-*#2: unexpected")),
        "the duplicate Deployment is found: {}",
        outcome.summary()
    );
}

/// The real sample controller passes the first generated plan of each kind: a crash between
/// two writes of a reconcile, a view held back past read-your-writes' wait, an object's events
/// coalesced. Every plan: `hack/perturb --workload sample` (a few minutes).
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_controller_passes_a_crash_a_held_view_and_a_coalescing_from_its_generated_plans()
 {
    let campaign = perturbation_campaign(None).await;
    let checked = campaign
        .check(kubeloop_testenv::perturb::Reference::first_of_each_kind, 3)
        .await
        .expect("the reference run passes and generates plans");
    assert!(
        checked.findings.is_empty(),
        "findings:\n{}",
        checked.findings.join("\n")
    );
    // Every plan must have fired: one that never did checked nothing the reference did not.
    assert_eq!(checked.passed.len(), 3, "{}", checked.tally());
    assert!(checked.never_fired.is_empty(), "{}", checked.tally());
}

// --- state-centric testing (kubeloop_testenv::perturb::StateCampaign) --------------------------

/// The Foo CRD's `openAPIV3Schema`, as committed.
fn foo_schema() -> serde_json::Value {
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(CRD_YAML).expect("crds/foo.yaml parses");
    serde_json::to_value(
        &crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema,
    )
    .unwrap()
}

/// A state campaign of the sample workload, with `controller` in place of the sample
/// controller; `only` keeps the generated changes of that field, or the misoperation of that
/// name (`KUBELOOP_STATE_CHANGE` overrides it).
async fn state_campaign(
    controller: Option<kubeloop_testenv::perturb::ControllerFn>,
    only: Option<&str>,
) -> kubeloop_testenv::perturb::StateReport {
    setup("state-setup").await;
    let (workload, sample_controller) = kubeloop_testenv::perturb::sample_state(foo_schema());
    let campaign = kubeloop_testenv::perturb::StateCampaign::new(
        testenv::shared_full().await.client_config(),
        workload,
        controller.unwrap_or(sample_controller),
        Default::default(),
    );
    let (changes, misoperations) = campaign.cases(only);
    assert!(
        !changes.is_empty() || !misoperations.is_empty(),
        "cases for {only:?}"
    );
    campaign
        .run(&changes, &misoperations)
        .await
        .expect("the campaign runs")
}

/// The sample controller under the changes generated from the Foo CRD's schema: each bound
/// of `spec.replicas` (1, 10; 0 and 11 refused by the apiserver) and of
/// `spec.deploymentName`'s length (1, 253; 0 and 254 refused), `spec.replicas` removed (the
/// Deployment keeps its replicas, as kubernetes/sample-controller does) and
/// `spec.deploymentName` removed (refused: it is required), each applied
/// and reverted; then the misoperation `foreign-deployment` (the Foo pointed at a Deployment
/// of nobody's). It reaches the implied state after each accepted change, writes nothing on
/// one more reconcile, refuses the foreign Deployment with an event naming it and leaves it
/// untouched, and comes back after each revert of `replicas`. A revert of `deploymentName`
/// leaves the Deployment made under the other name (the sample controller, like
/// kubernetes/sample-controller, never deletes a Deployment it no longer names): that is the
/// finding this asserts, and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn state_campaign_the_sample_controller_reaches_each_generated_spec_and_returns() {
    let report = state_campaign(None, None).await;
    assert_eq!(
        (report.cases, report.refused, report.must_refuse),
        (11, 5, 1),
        "{report:?}"
    );
    let (name_findings, others): (Vec<&String>, Vec<&String>) = report
        .findings
        .iter()
        .partition(|f| f.starts_with("/spec/deploymentName="));
    assert!(
        others.is_empty(),
        "findings:\n{}",
        report.findings.join("\n")
    );
    assert_eq!(name_findings.len(), 2, "{name_findings:?}");
    for finding in &name_findings {
        assert!(
            finding.contains("[returns after revert]")
                && finding.contains(": unexpected")
                && !finding.contains("[reaches the implied state]")
                && !finding.contains("[idempotence]"),
            "{finding}"
        );
    }
}

/// Seeded bugs the state oracles must find: a status stamped on every reconcile fails
/// idempotence; a controller that never scales down fails to return after the revert of a
/// raise to 10 replicas.
#[tokio::test(flavor = "multi_thread")]
async fn state_campaign_finds_a_restless_status_and_an_ignored_revert() {
    let restless = state_campaign(
        Some(seeded_controller(SeededBug::RestlessStatus)),
        Some("/spec/replicas"),
    )
    .await;
    assert!(
        restless
            .findings
            .iter()
            .any(|f| f.contains("[idempotence]")
                && f.contains("foos.samplecontroller.k8s.io/status")),
        "the restless status is found: {restless:?}"
    );
    let ignores = state_campaign(
        Some(seeded_controller(SeededBug::IgnoresRevert)),
        Some("/spec/replicas"),
    )
    .await;
    assert!(
        ignores
            .findings
            .iter()
            .any(|f| f.starts_with("/spec/replicas=10 ")
                && f.contains("[returns after revert]")
                && f.contains("deployments.apps/example-dep .spec.replicas: expected 2, got 10")),
        "the ignored revert is found: {ignores:?}"
    );
    assert!(
        !ignores.findings.iter().any(|f| f.contains("[idempotence]")),
        "{ignores:?}"
    );
}

/// The seeded bug the must-refuse oracle must find: a controller that takes the Deployment
/// the Foo names whoever owns it scales the foreign Deployment and says nothing.
#[tokio::test(flavor = "multi_thread")]
async fn state_campaign_finds_a_foreign_deployment_taken_without_a_word() {
    let adopts = state_campaign(
        Some(seeded_controller(SeededBug::AdoptsForeign)),
        Some("foreign-deployment"),
    )
    .await;
    assert_eq!((adopts.cases, adopts.must_refuse), (1, 1), "{adopts:?}");
    let [finding] = adopts.findings.as_slice() else {
        panic!("one finding: {adopts:?}");
    };
    assert!(
        finding.starts_with("misoperation foreign-deployment: FOUND")
            && finding.contains("[must refuse] no Event about the Foo nor condition on it names")
            && finding.contains(
                "[must refuse] lost or changed: deployments.apps/foreign-dep .spec.replicas: \
                 expected 1, got 2"
            )
            && finding.contains("KUBELOOP_STATE_CHANGE='foreign-deployment'"),
        "{finding}"
    );
}
