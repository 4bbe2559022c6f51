//! No control-plane process outlives its parent, even when the parent is SIGKILLed.
//!
//! `kubeloop cluster --full` (the harness as a process) prints its components' pids; the test
//! SIGKILLs it (no destructor, no signal handler runs) and checks that every component is gone.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

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

/// Kills the child however the test ends, so a failed assertion cannot leak it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kubeloop cluster <args>` and reads the component pids and the cluster's working
/// directory it prints before READY.
fn start_cluster_process(args: &[&str]) -> (KillOnDrop, Vec<u32>, std::path::PathBuf) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubeloop"))
        .arg("cluster")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = KillOnDrop(child);
    let mut pids = Vec::new();
    let mut dir = std::path::PathBuf::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
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
    let (mut child, pids, _) = start_cluster_process(&["--full"]);
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

    child.0.kill().unwrap(); // SIGKILL: no Drop, no atexit.
    child.0.wait().unwrap();

    kubeloop::testenv::eventually_blocking(
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
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.0.wait().unwrap();
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
