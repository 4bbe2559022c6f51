//! The tour in docs/ kept honest: every chapter's example (examples/tour_*.rs) and every
//! `kubeloop` command a chapter runs is run here against a real control plane, and its output
//! is checked for what the chapter says it shows. kubeloop's own tests.
//!
//! The examples read `$KUBECONFIG`, as a reader runs them against `kubeloop cluster`; here
//! `KUBECONFIG` is the harness cluster's. The test builds the examples first (`cargo build
//! --all-features --examples`, a no-op when `cargo test` already did), so a run of this target alone works.

use std::process::Command;
use std::time::Duration;

use kubeloop::testing::eventually;
use kubeloop_testenv::{self as testenv, Cluster, ClusterOptions, Kubeloop};

const WAIT: Duration = Duration::from_secs(60);

/// Runs one example against `cluster`; returns its stdout, panics with its stderr on failure.
fn run_example(cluster: &Cluster, name: &str) -> String {
    let path = testenv::example(name);
    assert!(path.exists(), "{} was not built", path.display());
    let out = Command::new(path)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("running example {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    stdout
}

fn assert_has(output: &str, needles: &[&str]) {
    for needle in needles {
        assert!(output.contains(needle), "expected {needle:?} in:\n{output}");
    }
}

#[tokio::test]
async fn chapter_10_the_same_object_in_json_and_protobuf_and_a_watch_in_frames() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_10_wire");
    assert_has(
        &out,
        &[
            "as application/json: ",
            "as application/vnd.kubernetes.protobuf: ",
            r"bytes: k8s\x00",
            r#"then apiVersion="v1" kind="ConfigMap""#,
            "the same ConfigMap as from JSON: true",
            "answered application/vnd.kubernetes.protobuf;stream=watch",
            "a DELETED of v1 ConfigMap",
            "decoded: tour-10 deleted",
            "an informer of ConfigMaps asks for: application/vnd.kubernetes.protobuf,application/json",
            "a metadata-only informer asks for:  application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList",
            "told to read JSON (Wire::Json):      application/json",
        ],
    );
}

#[tokio::test]
async fn chapter_01_the_raw_watch_stream_shows_added_modified_deleted() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_01_watch");
    assert_has(
        &out,
        &[
            "LIST says the collection is at resourceVersion",
            "event ADDED    default/tour-01",
            "event MODIFIED default/tour-01",
            "\"hello again\"",
            "event DELETED  default/tour-01",
            r#"the raw line: {"type":"ADDED","object":{"kind":"ConfigMap""#,
            "3 events",
        ],
    );
}

#[tokio::test]
async fn chapter_02_list_watch_bookmark_and_410() {
    // The cluster chapter 2 asks for: watches served by etcd (without the watch cache a young
    // apiserver still holds every version in memory) and compacted (what the apiserver does
    // every --etcd-compaction-interval; done at once here instead of waiting for it).
    let cluster = Cluster::start(ClusterOptions {
        apiserver_args: vec![
            "--watch-cache=false".into(),
            "--etcd-compaction-interval=5s".into(),
        ],
        ..ClusterOptions::apiserver_only()
    })
    .await
    .expect("starting a cluster without the watch cache");
    cluster.compact_etcd().await.expect("compacting etcd");
    let out = run_example(&cluster, "tour_02_list_watch");
    assert_has(
        &out,
        &[
            "1. LIST:",
            "2. WATCH from",
            "ADDED tour-02-a",
            "then BOOKMARK at resourceVersion",
            "k8s.io/initial-events-end=true",
            "4. WATCH from resourceVersion 1: 410 Expired",
            "so LIST again",
        ],
    );
}

#[tokio::test]
async fn chapter_03_the_delta_fifo_merges_per_key_and_the_real_fifo_does_not() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_03_fifo");
    assert_has(
        &out,
        &[
            "DeltaFIFO holds 1 item(s); RealFIFO holds 4 item(s)",
            "DeltaFIFO pop -> default/tour-03: [Added rv=",
            "Updated rv=",
            "Deleted rv=",
            "RealFIFO  pop -> default/tour-03: [Added rv=",
        ],
    );
    let real_pops = out
        .lines()
        .filter(|l| l.starts_with("RealFIFO  pop"))
        .count();
    assert_eq!(real_pops, 4, "{out}");
}

#[tokio::test]
async fn chapter_04_the_indexer_and_listers_answer_from_the_cache() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_04_indexer");
    assert_has(
        &out,
        &[
            r#"keys in the cache: ["default/tour-04-db", "default/tour-04-web-1", "default/tour-04-web-2"]"#,
            r#"index by-app, value web -> ["default/tour-04-web-1", "default/tour-04-web-2"]"#,
            r#"lister.get(default, tour-04-db) -> Some("tour-04-db")"#,
            r#"list(app in (web)) -> ["tour-04-web-1", "tour-04-web-2"]"#,
        ],
    );
}

#[tokio::test]
async fn chapter_05_both_handlers_of_one_informer_see_every_change() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_05_informer");
    assert_has(&out, &["the same informer? true; handlers on it: 2"]);
    for handler in ["handler A", "handler B"] {
        assert_has(
            &out,
            &[
                &format!("{handler}: on_add (in initial list: false)"),
                &format!("{handler}: on_update rv "),
                &format!("{handler}: on_delete (tombstone: false)"),
            ],
        );
    }
}

#[tokio::test]
async fn chapter_06_the_workqueue_dedups_holds_processing_keys_and_backs_off() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_06_workqueue");
    assert_has(
        &out,
        &[
            "added default/a three times and default/b once: len = 2",
            "added default/a again while it is processed: len = 1",
            "the next get gives default/b, not default/a",
            "done(default/a): it is back in line, len = 1",
            "forget(default/a): requeues = 0",
            "workqueue dedup",
            "workqueue add (busy)",
            "workqueue rate-limited",
            "the rate limiter says wait 80ms (requeue 5)",
        ],
    );
    // Failure n waits at least 5 ms * 2^(n-1) (the timer only ever fires late).
    for n in 1..=5u32 {
        let prefix = format!("failure {n}: add_rate_limited -> back after ");
        let line = out
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no line for failure {n} in:\n{out}"));
        let ms: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            ms >= 5 << (n - 1),
            "failure {n} came back after {ms} ms:\n{out}"
        );
        assert!(line.contains(&format!("(requeues: {n})")), "{line}");
    }
}

#[tokio::test]
async fn chapter_11_repeats_are_one_event_with_a_series_and_the_budget_caps_new_ones() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_11_events");
    assert_has(
        &out,
        &[
            "5 events recorded -> writes: 1 create, 2 patches",
            "1 Event about tour-11",
            "  regarding:           ConfigMap default/tour-11",
            "  action:              Sync",
            "  reportingController: tour-controller",
            "  series.count:        5\nthe same Event through core/v1",
            "  message:             ConfigMap default/tour-11: data.greeting is missing",
            "  count:               (none)\n  series.count:        5",
            "30 events recorded -> 25 Events written, 5 dropped by the spam budget",
        ],
    );
}

#[tokio::test]
async fn chapter_12_a_held_view_catches_the_generated_name_and_not_the_fixed_one() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_12_perturbation");
    assert_has(
        &out,
        &[
            "== the controller's first version (a generated name) ==",
            "running stale:secrets:ADDED:source-copy-*:1:7000ms",
            "  fired at secrets/source-copy-*",
            "  verdict: FOUND after step",
            "secrets/source-copy-*#2: unexpected",
            "== the controller's second version (a fixed name) ==",
            "running stale:secrets:ADDED:source-copy:1:7000ms",
            "  verdict: passed",
        ],
    );
}

#[tokio::test]
async fn chapter_08_the_second_candidate_takes_the_released_lease() {
    let cluster = testenv::shared().await;
    let out = run_example(cluster, "tour_08_leader_election");
    assert_has(
        &out,
        &[
            "candidate-a: started leading",
            "candidate-b: sees leader candidate-a",
            "Lease holder: candidate-a",
            "candidate-a: stopped leading",
            "candidate-b: started leading",
            "Lease holder: candidate-b",
        ],
    );
    let a_stopped = out.find("candidate-a: stopped leading").unwrap();
    let b_started = out.find("candidate-b: started leading").unwrap();
    assert!(a_stopped < b_started, "never two leaders at once:\n{out}");
}

/// `kubeloop trace KEY --ops-address ADDR` until its table has every one of `stages`.
async fn trace_until(key: &str, ops: &str, stages: &[&str]) -> String {
    eventually(
        &format!("a trace of {key} with {stages:?}"),
        WAIT,
        || async {
            let out = Kubeloop::new(["trace", key, "--ops-address", ops]).output();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            match stages.iter().find(|s| !text.contains(**s)) {
                None if out.status.success() => Ok(text),
                None => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
                Some(missing) => Err(format!("no {missing:?} yet in:\n{text}")),
            }
        },
    )
    .await
}

const JOURNEY: [&str; 10] = [
    "watch event",
    "fifo queued",
    "fifo popped",
    "indexer stored",
    "handler called",
    "workqueue add",
    "worker took key",
    "reconcile started",
    "reconcile finished",
    "status written",
];

#[tokio::test]
async fn chapter_07_the_sample_controller_reconciles_a_foo_and_trace_shows_its_journey() {
    let cluster = testenv::shared().await;
    cluster.kubectl(&["apply", "-f", "crds/foo.yaml"]).ok();
    cluster
        .kubectl(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/foos.samplecontroller.k8s.io",
        ])
        .ok();
    let ops = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
    let kubeconfig = cluster.kubeconfig_path().to_str().unwrap().to_string();
    let _controller = Kubeloop::new([
        "sample-controller",
        "--kubeconfig",
        &kubeconfig,
        "--metrics-bind-address",
        &ops,
        // Plain HTTP keeps the tour's `kubeloop trace` short (the secure path is
        // tests/ops_secure_serving.rs).
        "--metrics-secure=false",
        "--trace",
        "default/example-foo",
    ])
    .start();
    cluster
        .kubectl(&["apply", "-f", "examples/example-foo.yaml"])
        .ok();
    eventually("the Deployment example-foo", WAIT, || async {
        cluster
            .kubectl(&["get", "deployment", "example-foo"])
            .result()
    })
    .await;
    let trace = trace_until("default/example-foo", &ops, &JOURNEY).await;
    println!("{trace}");
    assert_has(&trace, &["ADDED rv=", "Foo", "Deployment", "success in"]);
    cluster
        .kubectl(&["delete", "foo", "example-foo", "--wait=false"])
        .ok();
}

#[tokio::test]
async fn chapter_09_the_vm_controller_adds_and_removes_its_finalizer() {
    let cluster = testenv::shared().await;
    cluster
        .kubectl(&["apply", "-f", "crds/virtualmachine.yaml"])
        .ok();
    cluster
        .kubectl(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/virtualmachines.cloudnative.tw",
        ])
        .ok();
    let ops = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
    let kubeconfig = cluster.kubeconfig_path().to_str().unwrap().to_string();
    let _controller = Kubeloop::new([
        "vm-controller",
        "--kubeconfig",
        &kubeconfig,
        "--vm-driver",
        "fake",
        "--leader-elect=false",
        "--metrics-bind-address",
        &ops,
        // Plain HTTP keeps the tour's `kubeloop trace` short (the secure path is
        // tests/ops_secure_serving.rs).
        "--metrics-secure=false",
        "--trace",
        "default/test-vm",
    ])
    .start();
    cluster
        .kubectl(&["apply", "-f", "examples/test-vm.yaml"])
        .ok();
    let jsonpath = "-o=jsonpath={.status.phase} {.metadata.finalizers}";
    let active = eventually("test-vm Active with its finalizer", WAIT, || async {
        let out = cluster
            .kubectl(&["get", "vm", "test-vm", jsonpath])
            .result()?;
        if out.starts_with("Active") && out.contains("finalizer") {
            Ok(out)
        } else {
            Err(format!("test-vm is {out:?}"))
        }
    })
    .await;
    println!("test-vm: {active}");
    cluster
        .kubectl(&["delete", "vm", "test-vm", "--wait=false"])
        .ok();
    eventually("test-vm gone", WAIT, || async {
        let out = cluster.kubectl(&["get", "vm", "test-vm", "--ignore-not-found"]);
        out.success && out.stdout.trim().is_empty()
    })
    .await;
    let trace = trace_until("default/test-vm", &ops, &["DELETED rv=", "status written"]).await;
    println!("{trace}");
    assert_has(&trace, &JOURNEY);
    assert_has(
        &trace,
        &[
            "finalizer patch        VirtualMachine   adding finalizer.cloudnative.tw",
            "phase Active",
            "phase Terminating",
            "finalizer patch        VirtualMachine   removing finalizer.cloudnative.tw",
        ],
    );
    let removed = trace.find("removing finalizer").unwrap();
    let deleted = trace.find("DELETED rv=").unwrap();
    assert!(
        removed < deleted,
        "the object goes only once the finalizer is off:\n{trace}"
    );
}
