//! Sharding: replicas share VMs through shard Leases while replicas join, are SIGKILLed and
//! SIGSTOPped; with `--watch-held-shards`, each caches only the VMs of its shards.

use super::chaos::{
    CHAOS_TIMING, chaos_problem, jiff_now, reconcile_intervals, wait_until_stopped,
};
use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

const SHARD_TIMING: [&str; 16] = [
    "--vm-driver",
    "fake",
    "--fake-engine-latency",
    "50ms",
    "--shards",
    "6",
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "500ms",
    "--refresh-interval",
    "5s",
    "--threads",
    "2",
];

/// Holder of every shard Lease of the ring `controller101` in `ns` ("" for none).
async fn shard_holders(cluster: &Cluster, ns: &str, shards: u32) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client().await.unwrap(), ns);
    let mut holders = Vec::new();
    for shard in 0..shards {
        let holder = leases
            .get_opt(&format!("controller101-shard-{shard}"))
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        holders.push(holder);
    }
    holders
}

/// Creates `n` VMs named vm-0.. in one `kubectl apply`.
fn apply_vms(cluster: &Cluster, ns: &str, n: usize) {
    let vms: Vec<(&str, String)> = (0..n).map(|i| (ns, format!("vm-{i}"))).collect();
    apply_vms_at(cluster, &format!("{ns}-vms"), &vms, "100m");
}

/// Applies the VMs `(namespace, name)` asking for `cpu` in one `kubectl apply` of a manifest
/// saved as `<file>.yaml` in the cluster's directory.
fn apply_vms_at<N: AsRef<str>>(cluster: &Cluster, file: &str, vms: &[(&str, N)], cpu: &str) {
    let manifest: String = vms
        .iter()
        .map(|(ns, name)| format!(
            "---\napiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: {}, namespace: {ns}}}\nspec: {{resource: {{cpu: \"{cpu}\", memory: \"32Mi\"}}}}\n",
            name.as_ref()
        ))
        .collect();
    let path = cluster.dir().join(format!("{file}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
}

/// How many of the namespace's VMs are Active.
async fn active_vms(vms: &Api<VirtualMachine>) -> usize {
    vms.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|vm| vm.phase() == Phase::Active)
                .count()
        })
        .unwrap_or(0)
}

/// Every reconcile of every replica from its log, and the pairs of reconciles of one key by two
/// replicas that overlapped. A reconcile open when its process was stopped or killed ends there
/// (a stopped process does nothing while stopped; the one in flight is dropped at its fence
/// when it resumes). Returns (reconciles, reconciles per replica, overlapping pairs).
#[allow(clippy::type_complexity)]
fn per_key_overlaps(
    replicas: &[(String, ManagedProcess, Option<jiff_now::Stamp>)],
) -> (
    usize,
    Vec<(String, usize)>,
    Vec<(
        (String, String, jiff_now::Stamp, jiff_now::Stamp),
        (String, String, jiff_now::Stamp, jiff_now::Stamp),
    )>,
) {
    let mut intervals = Vec::new();
    let mut per_replica = Vec::new();
    for (identity, controller, frozen_at) in replicas {
        let mine = reconcile_intervals(&controller.log());
        per_replica.push((identity.clone(), mine.len()));
        for (key, start, end) in mine {
            let end = match (end, *frozen_at) {
                (Some(end), Some(frozen)) if start < frozen && end > frozen => frozen,
                (Some(end), _) => end,
                (None, Some(frozen)) if start < frozen => frozen,
                (None, _) => jiff_now::now(),
            };
            intervals.push((identity.clone(), key, start, end));
        }
    }
    intervals.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
    let mut overlaps = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if b.1 != a.1 || b.2 >= a.3 {
                break;
            }
            if a.0 != b.0 {
                overlaps.push((a.clone(), b.clone()));
            }
        }
    }
    (intervals.len(), per_replica, overlaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_share_300_vms_and_no_key_is_reconciled_by_two_at_once() {
    let cluster = testenv::shared().await;
    install_crd(cluster).await;
    let ns = cluster.new_namespace("shards").await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(cluster.client().await.unwrap(), &ns);
    let spawn = |identity: &str| {
        spawn_controller(cluster, &ns, "unix:///nonexistent", identity, &SHARD_TIMING)
    };
    let started = Instant::now();

    // Two replicas, 300 VMs: all Active, the shards split 3/3.
    let mut replicas: Vec<(String, ManagedProcess, Option<jiff_now::Stamp>)> = vec![
        ("a".into(), spawn("a"), None),
        ("b".into(), spawn("b"), None),
    ];
    apply_vms(cluster, &ns, 300);
    eventually("300 VMs Active", Duration::from_secs(180), || async {
        (active_vms(&vms).await == 300).then_some(())
    })
    .await;
    let count = |holders: &[String], who: &str| holders.iter().filter(|h| *h == who).count();
    eventually(
        "a and b hold 3 shards each",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 6).await;
            (count(&h, "a") == 3 && count(&h, "b") == 3).then_some(())
        },
    )
    .await;
    println!(
        "sharding: 300 VMs Active on 2 replicas after {:?}",
        started.elapsed()
    );

    // A third joins: two shards each.
    replicas.push(("c".into(), spawn("c"), None));
    eventually("2 shards each", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "a") == 2 && count(&h, "b") == 2 && count(&h, "c") == 2).then_some(())
    })
    .await;

    // SIGKILL a: its shards are owned again within lease duration + retry period.
    let killed = Instant::now();
    replicas[0].1.kill();
    replicas[0].2 = Some(jiff_now::now());
    let taken = eventually("a's shards taken over", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "b") == 3 && count(&h, "c") == 3).then(|| killed.elapsed())
    })
    .await;
    println!(
        "sharding: a SIGKILLed, its shards owned again after {taken:?} (lease 4 s + retry 0.5 s)"
    );
    assert!(
        taken < Duration::from_secs(8),
        "a dead replica's shards are taken once its Leases expire, not a second lease later: {taken:?}"
    );

    // SIGSTOP b past its lease, then SIGCONT: c takes everything meanwhile; b comes back and
    // gets its share again.
    replicas[1].1.signal(libc::SIGSTOP);
    wait_until_stopped(&replicas[1].1);
    replicas[1].2 = Some(jiff_now::now());
    eventually("c holds every shard", Duration::from_secs(60), || async {
        let h = shard_holders(cluster, &ns, 6).await;
        (count(&h, "c") == 6).then_some(())
    })
    .await;
    replicas[1].1.signal(libc::SIGCONT);
    replicas.push(("d".into(), spawn("d"), None));
    eventually(
        "b, c and d hold 2 shards each",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 6).await;
            (count(&h, "b") == 2 && count(&h, "c") == 2 && count(&h, "d") == 2).then_some(())
        },
    )
    .await;
    eventually("300 VMs Active again", Duration::from_secs(120), || async {
        (active_vms(&vms).await == 300).then_some(())
    })
    .await;
    // Let a few refresh rounds run on the new map.
    tokio::time::sleep(Duration::from_secs(6)).await;

    println!("sharding: {:?} in all", started.elapsed());
    assert_no_overlaps("sharding", &replicas, true);
}

/// Prints the replicas' reconciles and asserts that no key was reconciled by two of them at
/// once ([`per_key_overlaps`]) and, with `each_worked`, that each reconciled something. The
/// replicas are killed when dropped.
fn assert_no_overlaps(
    what: &str,
    replicas: &[(String, ManagedProcess, Option<jiff_now::Stamp>)],
    each_worked: bool,
) {
    let (intervals, per_replica, overlaps) = per_key_overlaps(replicas);
    println!(
        "{what}: {intervals} reconciles ({per_replica:?}), overlaps {}",
        overlaps.len()
    );
    assert!(
        overlaps.is_empty(),
        "two replicas reconciled one key at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    for (identity, count) in per_replica.iter().filter(|_| each_worked) {
        assert!(*count > 0, "{identity} reconciled nothing");
    }
}

/// Waits until [`chaos_problem`] finds nothing left to converge.
async fn converge(
    what: &str,
    vms: &Api<VirtualMachine>,
    wanted: &std::collections::BTreeMap<String, &str>,
    docker: &Docker,
    ns: &str,
) {
    eventually(what, Duration::from_secs(180), || async {
        chaos_problem(vms, wanted, docker, ns)
            .await
            .is_none()
            .then_some(())
    })
    .await
}

/// The podman run of sharding: three replicas over 24 VMs on one engine; one is SIGKILLed. Every
/// VM converges on a container of its uid, no container is left without its VM, and no key is
/// reconciled by two replicas at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_on_podman_converge_without_overlap_or_orphans() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api: vms,
        _cleanup,
    } = PodmanTest::new("shards-podman").await;
    // The chaos test's timing, sharded.
    let args: Vec<&str> = ["--shards", "4"].into_iter().chain(CHAOS_TIMING).collect();
    let mut replicas: Vec<(String, ManagedProcess, Option<jiff_now::Stamp>)> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            (
                id.to_string(),
                spawn_controller(cluster, &ns, &host, id, &args),
                None,
            )
        })
        .collect();
    let mut wanted: std::collections::BTreeMap<String, &str> = Default::default();
    for i in 0..24 {
        let name = format!("vm-{i}");
        apply_vm(cluster, &ns, &name, "100m", "32Mi");
        wanted.insert(name, "100m");
    }
    converge(
        "24 VMs Active on their containers",
        &vms,
        &wanted,
        &docker,
        &ns,
    )
    .await;
    // Kill the holder of shard 0 (the one that sweeps) while it works; resize two VMs.
    let holder = shard_holders(cluster, &ns, 4).await[0].clone();
    let victim = replicas
        .iter()
        .position(|r| r.0 == holder)
        .expect("a replica holds shard 0");
    replicas[victim].1.kill();
    replicas[victim].2 = Some(jiff_now::now());
    for name in ["vm-0", "vm-1"] {
        apply_vm(cluster, &ns, name, "200m", "32Mi");
        wanted.insert(name.to_string(), "200m");
    }
    eventually(
        "the live replicas hold every shard",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &ns, 4).await;
            h.iter()
                .all(|h| !h.is_empty() && *h != holder)
                .then_some(())
        },
    )
    .await;
    converge(
        "every VM Active again with its new CPU",
        &vms,
        &wanted,
        &docker,
        &ns,
    )
    .await;
    assert_no_overlaps("sharding on podman", &replicas, false);
}

/// A VM of the `--watch-held-shards` test and the shard its namespace hashes to.
struct ScopedVm {
    ns: String,
    name: String,
    shard: u32,
}

impl ScopedVm {
    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

/// `per_shard` namespaces in each shard of a namespace-hash ring of `shards`: `vms-0`,
/// `vms-1`, ... taken in order, each kept while its shard (the hash range of its name, as the
/// apiserver and the replicas hash it) has fewer. Returns (namespace, shard). FNV-1a barely
/// carries a name's last bytes into the top bits a range is cut on, so neighbours mostly
/// share a shard and the names kept are far apart (vms-0, vms-1, vms-500, ...).
fn namespaces_in_every_shard(shards: u32, per_shard: usize) -> Vec<(String, u32)> {
    let scope = kubeloop::cache::ShardScope::namespaces(shards).unwrap();
    let mut in_shard = vec![0; shards as usize];
    let mut picked = Vec::new();
    for i in 0..10_000 {
        if in_shard.iter().all(|n| *n == per_shard) {
            break;
        }
        let ns = format!("vms-{i}");
        let shard = scope.shard_of_namespace(&ns);
        if in_shard[shard as usize] < per_shard {
            in_shard[shard as usize] += 1;
            picked.push((ns, shard));
        }
    }
    assert!(
        in_shard.iter().all(|n| *n == per_shard),
        "no {per_shard} namespaces in every shard among vms-0..vms-9999: {in_shard:?}"
    );
    picked
}

/// The body of a plain HTTP GET of `path` at `addr` (the replicas serve their metrics
/// address with `--metrics-secure=false`).
async fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |e: std::io::Error| format!("GET {path} at {addr}: {e}");
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(failed)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(failed)?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.map_err(failed)?;
    match raw.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(format!("GET {path} at {addr}: {raw}")),
    }
}

/// The followed VMs a replica's informer holds now, from its `/debug/trace` at `metrics`
/// (`--trace` for each VM): a VM is cached if the last indexer step of its journey added or
/// updated it, not if it removed it or there is none. (A journey keeps its last 512 steps;
/// a VM makes about five per refresh, so a run of this length keeps them all.)
async fn cached_vms(metrics: SocketAddr, vms: &[ScopedVm]) -> Result<BTreeSet<String>, String> {
    use kubeloop::trace::{Stage, Step};
    let mut cached = BTreeSet::new();
    for vm in vms {
        let key = vm.key();
        let path = format!("/debug/trace?key={}&format=json", key.replace('/', "%2F"));
        let body = http_get(metrics, &path).await?;
        let steps: Vec<Step> =
            serde_json::from_str(&body).map_err(|e| format!("{path}: {e}: {body}"))?;
        let stored = steps.iter().rev().find(|s| s.stage == Stage::IndexerStored);
        if stored.is_some_and(|s| !s.detail.starts_with("removed")) {
            cached.insert(key);
        }
    }
    Ok(cached)
}

/// `Ok` if each of the `live` replicas (identity, metrics address) caches exactly the VMs of
/// `vms` that exist (not in `deleted`) in the shards the ring's Leases in `lease_ns` give it;
/// else what differs.
async fn caches_hold_only_held_shards(
    cluster: &Cluster,
    lease_ns: &str,
    live: &[(&str, SocketAddr)],
    vms: &[ScopedVm],
    deleted: &BTreeSet<String>,
) -> Result<(), String> {
    let holders = shard_holders(cluster, lease_ns, 6).await;
    for (identity, metrics) in live {
        let cached = cached_vms(*metrics, vms).await?;
        let held: Vec<usize> = (0..holders.len())
            .filter(|s| holders[*s] == *identity)
            .collect();
        let wanted: BTreeSet<String> = vms
            .iter()
            .filter(|vm| holders[vm.shard as usize] == *identity && !deleted.contains(&vm.key()))
            .map(ScopedVm::key)
            .collect();
        if cached != wanted {
            let foreign: Vec<&String> = cached.difference(&wanted).collect();
            let missing: Vec<&String> = wanted.difference(&cached).collect();
            return Err(format!(
                "replica {identity} holds shards {held:?} (holders {holders:?}) and caches {} VMs: \
                 {} of shards it does not hold or deleted {foreign:?}, {} of its shards missing \
                 {missing:?}",
                cached.len(),
                foreign.len(),
                missing.len()
            ));
        }
    }
    Ok(())
}

/// What is left before every VM of `vms` not in `deleted` is Active at its spec's generation
/// and every one in `deleted` is gone (`None`: nothing).
async fn scoped_vms_problem(
    all: &Api<VirtualMachine>,
    vms: &[ScopedVm],
    deleted: &BTreeSet<String>,
) -> Option<String> {
    let listed = match all.list(&Default::default()).await {
        Ok(listed) => listed.items,
        Err(e) => return Some(format!("listing the VMs: {e}")),
    };
    let by_key: BTreeMap<String, &VirtualMachine> = listed
        .iter()
        .map(|vm| {
            let m = &vm.metadata;
            (
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or_default(),
                    m.name.as_deref().unwrap_or_default()
                ),
                vm,
            )
        })
        .collect();
    for key in vms.iter().map(ScopedVm::key) {
        let found = by_key.get(&key);
        if deleted.contains(&key) {
            if found.is_some() {
                return Some(format!("{key}: deleted but still there"));
            }
            continue;
        }
        let Some(vm) = found else {
            return Some(format!("{key}: not found"));
        };
        let ready_at = vm
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == "True")
            .and_then(|c| c.observed_generation);
        if vm.phase() != Phase::Active || ready_at != vm.metadata.generation {
            return Some(format!(
                "{key}: phase {:?}, Ready at generation {ready_at:?}, generation {:?}",
                vm.phase(),
                vm.metadata.generation
            ));
        }
    }
    None
}

/// `--watch-held-shards` on the binary (issue 51): three replicas with `--shards 6
/// --watch-held-shards` over 48 VMs in 12 namespaces, two namespaces in each shard (a
/// namespace's VMs are all in one shard, so the namespaces are picked by their hash to cover
/// every shard). Each replica follows every VM with `--trace`, and what its informer caches is
/// read from outside on its `/debug/trace`. Every VM gets Active; each replica caches exactly
/// the VMs of the shards its Leases give it; the holder of shard 0 is SIGKILLed and at once
/// the VMs of its shards are resized or deleted: the new owners list those shards, cache their
/// VMs and reconcile them (the resize reaches Active at the new generation, the deleted are
/// finalized and gone); no key is reconciled by two replicas at once.
///
/// On a cluster of its own: the controller watches all namespaces here (it takes one
/// `--namespace` at most and has no label selector), which on the shared cluster would take
/// other tests' VMs. That apiserver runs without the `ShardedListAndWatch` gate (an alpha
/// gate's default, what a deployment meets today): it ignores the shard selector and sends
/// every VM, and each replica's informer drops those outside its shards (each says so in its
/// log, which is checked). With the gate on, the apiserver does the same selection; the
/// sample controller's sharded tests and tests/cluster/runtime_shard_watches.rs run that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_watching_only_their_shards_cache_only_their_vms_and_take_a_killed_ones_over() {
    let started = Instant::now();
    let cluster = Cluster::start(
        testenv::ClusterOptions::apiserver_only()
            .with_feature_gate(testenv::SHARDED_LIST_AND_WATCH, false),
    )
    .await
    .unwrap();
    let cluster = &cluster;
    println!(
        "watch-held-shards: a cluster of its own after {:?}",
        started.elapsed()
    );
    install_crd(cluster).await;
    let client = cluster.client().await.unwrap();
    let lease_ns = cluster.new_namespace("ring").await.unwrap();
    let namespaces = namespaces_in_every_shard(6, 2);
    let namespace_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for (ns, _) in &namespaces {
        let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}));
        namespace_api
            .create(&Default::default(), &namespace.unwrap())
            .await
            .unwrap();
    }
    let vms: Vec<ScopedVm> = namespaces
        .iter()
        .flat_map(|(ns, shard)| {
            (0..4).map(|i| ScopedVm {
                ns: ns.clone(),
                name: format!("vm-{i}"),
                shard: *shard,
            })
        })
        .collect();
    let traced: Vec<String> = vms
        .iter()
        .flat_map(|vm| ["--trace".to_string(), vm.key()])
        .collect();
    let spawn = |identity: &str| {
        let port = testenv::free_port().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let process = vm::controller(
            cluster,
            cluster.kubeconfig_path(),
            &format!("vm-controller-scoped-{identity}"),
        )
        .args([
            "--lease-lock-namespace",
            lease_ns.as_str(),
            "--holder-identity",
            identity,
        ])
        .args(SHARD_TIMING)
        .args(["--watch-held-shards", "--metrics-secure=false"])
        .arg(format!("--metrics-bind-address={metrics}"))
        .args(&traced)
        .start();
        (process, metrics)
    };
    let mut replicas: Vec<(String, ManagedProcess, Option<jiff_now::Stamp>)> = Vec::new();
    let mut metrics = Vec::new();
    for identity in ["a", "b", "c"] {
        let (process, addr) = spawn(identity);
        replicas.push((identity.to_string(), process, None));
        metrics.push((identity, addr));
    }
    let count = |holders: &[String], who: &str| holders.iter().filter(|h| *h == who).count();
    eventually(
        "a, b and c hold 2 shards each",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &lease_ns, 6).await;
            ["a", "b", "c"]
                .iter()
                .all(|who| count(&h, who) == 2)
                .then_some(())
        },
    )
    .await;
    println!(
        "watch-held-shards: 2 shards each after {:?}",
        started.elapsed()
    );

    let all: Api<VirtualMachine> = Api::all(client.clone());
    let none = BTreeSet::new();
    let created: Vec<(&str, &str)> = vms
        .iter()
        .map(|v| (v.ns.as_str(), v.name.as_str()))
        .collect();
    apply_vms_at(cluster, "scoped-vms", &created, "100m");
    eventually("48 VMs Active", Duration::from_secs(90), || async {
        match scoped_vms_problem(&all, &vms, &none).await {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    })
    .await;
    println!(
        "watch-held-shards: 48 VMs Active on 3 replicas after {:?}",
        started.elapsed()
    );
    eventually(
        "each replica caches exactly the VMs of its shards",
        Duration::from_secs(30),
        || caches_hold_only_held_shards(cluster, &lease_ns, &metrics, &vms, &none),
    )
    .await;
    for (identity, process, _) in &replicas {
        assert!(
            process
                .find_line(&["the apiserver did not filter by shardSelector"])
                .is_some(),
            "replica {identity} never said it filters the shards itself, on an apiserver \
             without the ShardedListAndWatch gate"
        );
    }

    // SIGKILL the holder of shard 0 (the sweeping one) and at once resize the VMs of its
    // shards and delete one in each of its namespaces: its shards' new owners see those
    // changes only through their lists of the ranges they take over.
    let holders = shard_holders(cluster, &lease_ns, 6).await;
    let victim = replicas
        .iter()
        .position(|r| r.0 == holders[0])
        .expect("a replica holds shard 0");
    let victim_name = replicas[victim].0.clone();
    let lost: Vec<&ScopedVm> = vms
        .iter()
        .filter(|vm| holders[vm.shard as usize] == victim_name)
        .collect();
    let killed = Instant::now();
    replicas[victim].1.kill();
    replicas[victim].2 = Some(jiff_now::now());
    let resized: Vec<(&str, &str)> = lost
        .iter()
        .filter(|vm| vm.name != "vm-0")
        .map(|vm| (vm.ns.as_str(), vm.name.as_str()))
        .collect();
    apply_vms_at(cluster, "scoped-vms-resized", &resized, "200m");
    let mut deleted = BTreeSet::new();
    for vm in lost.iter().filter(|vm| vm.name == "vm-0") {
        delete_vm(cluster, &vm.ns, &vm.name);
        deleted.insert(vm.key());
    }
    let live: Vec<(&str, SocketAddr)> = metrics
        .iter()
        .filter(|(identity, _)| *identity != victim_name)
        .copied()
        .collect();
    eventually(
        "the survivors hold every shard",
        Duration::from_secs(60),
        || async {
            let h = shard_holders(cluster, &lease_ns, 6).await;
            h.iter()
                .all(|h| !h.is_empty() && *h != victim_name)
                .then_some(())
        },
    )
    .await;
    eventually(
        "the killed replica's VMs resized or gone",
        Duration::from_secs(90),
        || async {
            match scoped_vms_problem(&all, &vms, &deleted).await {
                Some(problem) => Err(problem),
                None => Ok(()),
            }
        },
    )
    .await;
    println!(
        "watch-held-shards: {victim_name} SIGKILLed; {} VMs of its shards resized and {} deleted \
         by their new owners after {:?}",
        resized.len(),
        deleted.len(),
        killed.elapsed()
    );
    eventually(
        "each survivor caches exactly the VMs of its shards",
        Duration::from_secs(30),
        || caches_hold_only_held_shards(cluster, &lease_ns, &live, &vms, &deleted),
    )
    .await;

    println!("watch-held-shards: {:?} in all", started.elapsed());
    assert_no_overlaps("watch-held-shards", &replicas, true);
}
