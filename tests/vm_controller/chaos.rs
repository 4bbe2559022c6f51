//! Chaos: three replicas under leader election while VMs are created, resized and deleted and
//! the leader is SIGKILLed, SIGSTOPped past its lease, and cut off the apiserver.

use super::*;

/// One replica process of the chaos test (each incarnation has its own identity, as the
/// default identity would give it).
struct Replica {
    controller: ManagedProcess,
    identity: String,
    proxy: testenv::FaultProxy,
    /// When it was stopped or killed (a reconcile still open then ends there): stamped once
    /// the process could write no more (see [`wait_until_stopped`]), never before the signal.
    frozen_at: Option<jiff_now::Stamp>,
    /// When it was resumed after a SIGSTOP (no side effect may follow).
    resumed_at: Option<jiff_now::Stamp>,
}

pub(crate) mod jiff_now {
    pub type Stamp = k8s_openapi::jiff::Timestamp;
    pub fn now() -> Stamp {
        k8s_openapi::jiff::Timestamp::now()
    }
}

/// Waits until every thread of `controller` is stopped after a SIGSTOP, so that a stamp taken
/// afterwards is later than every line it logged before stopping. A stamp taken before the
/// signal is not: on a loaded machine the process may start a reconcile between the stamp and
/// the stop, and that reconcile, open until the process is resumed, would look as if it ran
/// through the successor's first reconciles.
pub(crate) fn wait_until_stopped(controller: &ManagedProcess) {
    let tasks = format!("/proc/{}/task", controller.pid());
    eventually_blocking(
        &format!("{} to stop on SIGSTOP", controller.name()),
        Duration::from_secs(10),
        || {
            std::fs::read_dir(&tasks)
                .unwrap_or_else(|e| panic!("{tasks}: {e}"))
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
                // The state follows the command name, which ends at the last ')'.
                .all(|stat| {
                    stat.rsplit(')')
                        .next()
                        .is_some_and(|rest| rest.trim_start().starts_with('T'))
                })
        },
    );
}

/// A kubeconfig that reaches the apiserver through `proxy`.
fn kubeconfig_via(cluster: &Cluster, proxy: &testenv::FaultProxy, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
    let via = text.replace(
        &cluster.apiserver_url(),
        &format!("https://{}", proxy.addr()),
    );
    assert_ne!(via, text, "the kubeconfig names the apiserver URL");
    let path = cluster.dir().join(format!("chaos-{name}.kubeconfig"));
    std::fs::write(&path, via).unwrap();
    path
}

pub(crate) const CHAOS_TIMING: [&str; 10] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "500ms",
    "--refresh-interval",
    "3s",
    "--threads",
    "2",
];

async fn start_replica(cluster: &Cluster, ns: &str, host: &str, identity: String) -> Replica {
    let proxy = testenv::FaultProxy::start(cluster.apiserver_addr())
        .await
        .unwrap();
    let kubeconfig = kubeconfig_via(cluster, &proxy, &identity);
    let controller = spawn_controller_as(cluster, &kubeconfig, ns, host, &identity, &CHAOS_TIMING);
    Replica {
        controller,
        identity,
        proxy,
        frozen_at: None,
        resumed_at: None,
    }
}

/// What still differs from the wanted state, `None` once every wanted VM is Active on a
/// container of its uid with its CPU and no other labelled container exists.
pub(crate) async fn chaos_problem(
    vms: &Api<VirtualMachine>,
    wanted: &std::collections::BTreeMap<String, &str>,
    docker: &Docker,
    ns: &str,
) -> Option<String> {
    for (name, cpu) in wanted {
        let Ok(Some(vm)) = vms.get_opt(name).await else {
            return Some(format!("{name}: not found"));
        };
        let phase = vm.phase();
        if phase != Phase::Active {
            let reason = vm
                .status
                .as_ref()
                .map(|s| s.reason.clone())
                .unwrap_or_default();
            return Some(format!("{name}: phase {phase:?} ({reason})"));
        }
        let Ok(inspected) = docker
            .inspect_container(&container_name(ns, name), None::<InspectContainerOptions>)
            .await
        else {
            return Some(format!("{name}: no container"));
        };
        let nano = inspected.host_config.as_ref().and_then(|h| h.nano_cpus);
        let want = cpu.trim_end_matches('m').parse::<i64>().unwrap() * 1_000_000;
        let uid = inspected
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get("kubeloop.dev/vm-uid").cloned());
        if nano != Some(want) || uid != vm.metadata.uid {
            return Some(format!(
                "{name}: container nano_cpus {nano:?} (want {want}), uid {uid:?} (want {:?})",
                vm.metadata.uid
            ));
        }
    }
    let mut containers = labelled_containers(ns);
    containers.sort();
    let mut expected: Vec<String> = wanted.keys().map(|n| container_name(ns, n)).collect();
    expected.sort();
    (containers != expected).then(|| format!("containers {containers:?}, expected {expected:?}"))
}

/// (start, end) of every reconcile in a replica's log, each end `None` if it never ended.
pub(crate) fn reconcile_intervals(
    log: &str,
) -> Vec<(String, jiff_now::Stamp, Option<jiff_now::Stamp>)> {
    let mut open: std::collections::HashMap<String, Vec<usize>> = Default::default();
    let mut out = Vec::new();
    for line in log.lines() {
        let started = line.contains("reconcile started");
        if !started && !line.contains("reconcile ended") {
            continue;
        }
        let Some(at) = line.split_whitespace().next().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Some(key) = line
            .split("key=")
            .nth(1)
            .and_then(|k| k.split_whitespace().next())
        else {
            continue;
        };
        if started {
            open.entry(key.to_string()).or_default().push(out.len());
            out.push((key.to_string(), at, None));
        } else if let Some(i) = open.get_mut(key).and_then(|v| v.pop()) {
            out[i].2 = Some(at);
        }
    }
    out
}

/// Lines of a replica's log that cause side effects.
fn side_effects(log: &str) -> Vec<(jiff_now::Stamp, String)> {
    log.lines()
        .filter(|l| {
            l.contains("writing status")
                || l.contains("server running")
                || l.contains("server deleted")
        })
        .filter_map(|l| Some((l.split_whitespace().next()?.parse().ok()?, l.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_replicas_converge_without_overlap_or_orphans() {
    let PodmanTest {
        cluster,
        host,
        docker,
        ns,
        api: vms,
        _cleanup,
    } = PodmanTest::new("chaos").await;

    let mut generation = 0;
    let mut next_identity = |slot: usize| {
        generation += 1;
        format!("r{slot}-{generation}")
    };
    let mut replicas: Vec<Replica> = Vec::new();
    for slot in 0..3 {
        replicas.push(start_replica(cluster, &ns, &host, next_identity(slot)).await);
    }
    let mut retired: Vec<Replica> = Vec::new();

    // 30 VMs; `wanted` is what should exist at the end, with its CPU.
    let mut wanted: std::collections::BTreeMap<String, &str> = Default::default();
    for i in 0..30 {
        let name = format!("vm-{i}");
        apply_vm(cluster, &ns, &name, "100m", "32Mi");
        wanted.insert(name, "100m");
    }
    let mut deleted = Vec::new();

    let started = Instant::now();
    let mut failovers = 0;
    let mut longest_without_leader = Duration::ZERO;
    let actions = [
        "kill", "stop", "cut", "kill", "stop", "cut", "kill", "stop", "cut",
    ];
    for (round, action) in actions.iter().enumerate() {
        // Churn: resize two, delete one, create one.
        let names: Vec<String> = wanted.keys().cloned().collect();
        for name in names.iter().skip(round * 3).take(2) {
            let cpu = if wanted[name] == "100m" {
                "200m"
            } else {
                "100m"
            };
            apply_vm(cluster, &ns, name, cpu, "32Mi");
            wanted.insert(name.clone(), cpu);
        }
        let victim = names[names.len() - 1 - round].clone();
        cluster.kubectl(&["delete", "vm", &victim, "-n", &ns, "--wait=false"]);
        wanted.remove(&victim);
        deleted.push(victim);
        // One new VM per round, after the 30 first ones.
        let fresh = format!("vm-{}", 30 + round);
        apply_vm(cluster, &ns, &fresh, "100m", "32Mi");
        wanted.insert(fresh, "100m");

        // The current leader, by the Lease.
        let leader = eventually("a leader", Duration::from_secs(60), || async {
            lease_holder(cluster, &ns).await
        })
        .await;
        let slot = replicas
            .iter()
            .position(|r| r.identity == leader)
            .unwrap_or_else(|| panic!("the holder {leader} is one of the live replicas"));
        let disrupted = Instant::now();
        match *action {
            // Stamped once the process is gone or stopped, not before the signal: a reconcile
            // it started in between would otherwise count as running until it was resumed
            // (or, killed, until the end).
            "kill" => {
                replicas[slot].controller.kill();
                replicas[slot].frozen_at = Some(jiff_now::now());
            }
            "stop" => {
                replicas[slot].controller.signal(libc::SIGSTOP);
                wait_until_stopped(&replicas[slot].controller);
                replicas[slot].frozen_at = Some(jiff_now::now());
            }
            _ => {
                replicas[slot].proxy.set_blocked(true);
                replicas[slot].proxy.cut_all();
            }
        }
        let new_leader = eventually("a new leader", Duration::from_secs(60), || {
            let (leader, ns) = (leader.clone(), ns.clone());
            async move { lease_holder(cluster, &ns).await.filter(|h| *h != leader) }
        })
        .await;
        let gap = disrupted.elapsed();
        longest_without_leader = longest_without_leader.max(gap);
        failovers += 1;
        println!("round {round}: {action} {leader} -> {new_leader} after {gap:?}");
        match *action {
            "stop" => {
                // Resumed well past its lease: it must act no more, step down and exit.
                tokio::time::sleep(Duration::from_secs(2)).await;
                replicas[slot].resumed_at = Some(jiff_now::now());
                replicas[slot].controller.signal(libc::SIGCONT);
            }
            "cut" => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                replicas[slot].proxy.set_blocked(false);
            }
            _ => {}
        }
        if *action != "kill" {
            let exited = eventually(
                "the deposed leader to exit",
                Duration::from_secs(30),
                || {
                    let status = replicas[slot].controller.exited();
                    async move { status }
                },
            )
            .await;
            assert_eq!(exited.code(), Some(1), "a lost lease exits 1");
        }
        let fresh = start_replica(cluster, &ns, &host, next_identity(slot)).await;
        retired.push(std::mem::replace(&mut replicas[slot], fresh));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // Convergence: every wanted VM Active on a running container with its CPU; no other
    // labelled container; every deleted VM gone.
    eventually_explained(
        "convergence",
        Duration::from_secs(240),
        || {
            replicas
                .iter()
                .map(|r| format!("{}'s log:\n{}\n", r.identity, r.controller.log_tail(40)))
                .collect()
        },
        || async {
            match chaos_problem(&vms, &wanted, &docker, &ns).await {
                Some(problem) => Err(problem),
                None => Ok(()),
            }
        },
    )
    .await;
    for name in &deleted {
        assert!(
            vms.get_opt(name).await.unwrap().is_none(),
            "{name} was deleted"
        );
    }

    // No two replicas' reconciles overlapped; a resumed replica acted no more.
    let mut all: Vec<Replica> = retired;
    all.extend(replicas);
    let mut intervals = Vec::new();
    for replica in &all {
        let log = replica.controller.log();
        for (key, start, end) in reconcile_intervals(&log) {
            let end = match (end, replica.frozen_at) {
                // A stopped process does nothing while stopped; a killed one ends there.
                (Some(end), Some(frozen)) if start < frozen && end > frozen => frozen,
                (Some(end), _) => end,
                (None, Some(frozen)) if start < frozen => frozen,
                (None, _) => jiff_now::now(),
            };
            intervals.push((replica.identity.clone(), key, start, end));
        }
        if let Some(resumed) = replica.resumed_at {
            let late: Vec<_> = side_effects(&log)
                .into_iter()
                .filter(|(at, _)| *at > resumed)
                .collect();
            assert!(
                late.is_empty(),
                "{} acted after it was resumed: {late:?}",
                replica.identity
            );
        }
    }
    intervals.sort_by_key(|(_, _, start, _)| *start);
    let mut overlaps = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if b.2 >= a.3 {
                break;
            }
            if a.0 != b.0 {
                overlaps.push((a.clone(), b.clone()));
            }
        }
    }
    let orphans = labelled_containers(&ns).len() - wanted.len();
    println!(
        "chaos: {} reconciles over {} replica processes, {failovers} failovers, longest without a \
         leader {longest_without_leader:?}, orphans {orphans}, overlaps {}, {:?} in all",
        intervals.len(),
        all.len(),
        overlaps.len(),
        started.elapsed()
    );
    assert!(
        overlaps.is_empty(),
        "reconciles of two replicas overlapped: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    assert_eq!(orphans, 0);
}
