//! Sharding: replicas share VMs through shard Leases while replicas join, are SIGKILLed and
//! SIGSTOPped.

use super::chaos::{
    CHAOS_TIMING, chaos_problem, jiff_now, reconcile_intervals, wait_until_stopped,
};
use super::*;

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
    let manifest: String = (0..n)
        .map(|i| format!(
            "---\napiVersion: cloudnative.tw/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: vm-{i}}}\nspec: {{resource: {{cpu: \"100m\", memory: \"32Mi\"}}}}\n"
        ))
        .collect();
    let path = cluster.dir().join(format!("{ns}-vms.yaml"));
    std::fs::write(&path, manifest).unwrap();
    let Kubectl {
        success: ok,
        stdout: out,
        stderr: err,
        ..
    } = cluster.kubectl(&["apply", "-n", ns, "-f", path.to_str().unwrap()]);
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

    // No key was reconciled by two replicas at once.
    let (intervals, per_replica, overlaps) = per_key_overlaps(&replicas);
    println!(
        "sharding: {intervals} reconciles ({per_replica:?}), overlaps {}, {:?} in all",
        overlaps.len(),
        started.elapsed()
    );
    assert!(
        overlaps.is_empty(),
        "two replicas reconciled one key at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    for (identity, count) in &per_replica {
        assert!(*count > 0, "{identity} reconciled nothing");
    }
    for (_, controller, _) in replicas.iter_mut() {
        controller.kill();
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
    let (intervals, per_replica, overlaps) = per_key_overlaps(&replicas);
    println!(
        "sharding on podman: {intervals} reconciles ({per_replica:?}), overlaps {}",
        overlaps.len()
    );
    assert!(
        overlaps.is_empty(),
        "two replicas reconciled one key at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
}
