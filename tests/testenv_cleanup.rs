//! No control-plane process outlives its parent, even when the parent is SIGKILLed.
//!
//! `kubeloop cluster --full` (the harness as a process) prints its components' pids; the test
//! SIGKILLs it (no destructor, no signal handler runs) and checks that every component is gone.

use std::time::Duration;

use kubeloop_testenv::{Kubeloop, ManagedProcess};

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry but is gone for our purpose.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Starts `kubeloop cluster <args>` ([`ManagedProcess`]: killed however the test ends, so a
/// failed assertion cannot leak it) and reads the component pids and the cluster's working
/// directory it prints before READY.
fn start_cluster_process(args: &[&str]) -> (ManagedProcess, Vec<u32>, std::path::PathBuf) {
    let mut child = Kubeloop::new(["cluster"])
        .args(args)
        .name("kubeloop cluster")
        .start();
    child.wait_for_line_blocking(&["READY"], Duration::from_secs(180));
    let mut pids = Vec::new();
    let mut dir = std::path::PathBuf::new();
    for line in child.log().lines() {
        if let Some(logs) = line.strip_prefix("LOGS ") {
            dir = std::path::Path::new(logs.trim())
                .parent()
                .unwrap()
                .to_owned();
        }
        if let Some(pid) = line.strip_prefix("PID ") {
            pids.push(pid.trim().parse::<u32>().unwrap());
        }
        if line == "READY" {
            break;
        }
    }
    (child, pids, dir)
}

#[test]
fn components_die_with_a_sigkilled_parent() {
    let (mut child, pids, dir) = start_cluster_process(&["--full"]);
    // etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.
    assert_eq!(
        pids.len(),
        5,
        "kubeloop cluster --full should report five components: {pids:?}"
    );
    assert!(
        pids.iter().all(|&p| alive(p)),
        "every component runs before the kill"
    );

    child.kill(); // SIGKILL: no Drop, no atexit.

    kubeloop::testing::eventually_blocking(
        "every component gone after their parent died",
        Duration::from_secs(20),
        || {
            let left: Vec<_> = pids.iter().filter(|&&p| alive(p)).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still alive: {left:?}"))
            }
        },
    );
    // A SIGKILLed parent cannot remove its working directory; the test does, so that runs of
    // the suite do not pile clusters' data up in /tmp.
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
}

#[test]
fn sigterm_stops_the_cluster_and_its_components() {
    let (mut child, pids, dir) = start_cluster_process(&[]);
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver: {pids:?}");
    assert!(
        dir.join("pki/ca.crt").is_file(),
        "the cluster's directory {} holds its certificates",
        dir.display()
    );
    child.signal(libc::SIGTERM);
    let status = child.wait_blocking(Duration::from_secs(60));
    assert!(
        status.success(),
        "kubeloop cluster exits cleanly on SIGTERM: {status}"
    );
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "components are stopped before the process exits"
    );
    assert!(
        !dir.exists(),
        "the cluster's directory {} is removed",
        dir.display()
    );
}
