//! `hack/demo`, the README's main job, run for real: its own mini-cluster (controller-manager,
//! scheduler, kwok), podman serving the Docker API (hack/setup-podman), both controllers, the
//! VM controller as two replicas under leader election.
//!
//! The tests read what a person would see and check that it shows every step docs/demo.md
//! "The two commands" describes (Deployment available and scaled, VM Creating -> Active with CPU and MEMORY, deletion
//! through Terminating, a failover to the other replica), then that nothing is left behind:
//! no controller, no control-plane component, no VM container, after `--once` and after
//! Ctrl-C alike. The two tests share the podman engine and the demo's namespace, so they take
//! turns.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use kubeloop::testing::eventually_blocking;

static ONE_DEMO_AT_A_TIME: Mutex<()> = Mutex::new(());

fn demo_command(args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/demo"));
    command
        .args(args)
        .env("KUBELOOP_BIN", kubeloop_testenv::kubeloop_binary())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SIGINT as a terminal leaves it, even when the tests themselves run with it ignored (a
    // runner started in the background): bash cannot trap a signal ignored on entry, and the
    // Ctrl-C test would wait for ever.
    // SAFETY: signal(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    command
}

fn squeeze(text: &str) -> String {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn alive(pid: u32) -> bool {
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

/// Every pid the demo announced: the cluster's components and the controllers.
fn announced_pids(output: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in output.lines() {
        if let Some(rest) = line.trim().strip_prefix("up; component pids ") {
            pids.extend(rest.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
        }
        if let Some((_, rest)) = line
            .split_once(": pid ")
            .or_else(|| line.trim().strip_prefix("pid ").map(|r| ("", r)))
        {
            let pid = rest.split(|c: char| !c.is_ascii_digit()).next().unwrap();
            pids.push(pid.parse().unwrap());
        }
    }
    pids
}

/// The demo's VM container, if podman still has it.
fn vm_container_exists() -> bool {
    let socket = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/run/kubeloop/podman.sock".into());
    let out = Command::new("curl")
        .args([
            "-sf",
            "--unix-socket",
            &socket,
            "http://d/containers/kubeloop-vm_kubeloop-demo_test-vm/json",
        ])
        .output()
        .unwrap();
    out.status.success()
}

fn assert_nothing_left(output: &str) {
    let pids = announced_pids(output);
    // 5 components, the sample controller, two VM controller replicas.
    assert!(
        pids.len() >= 8,
        "the demo should announce 5 component and 3 controller pids, got {pids:?}\n{output}"
    );
    eventually_blocking(
        "every process hack/demo announced to be gone",
        Duration::from_secs(10),
        || {
            let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("processes left behind by hack/demo: {left:?}"))
            }
        },
    );
    assert!(
        !vm_container_exists(),
        "hack/demo left the VM's container in podman"
    );
}

/// Each needle appears after the previous one, or a panic names the missing one. Runs of
/// spaces count as one (kubectl pads columns per line in watch output).
fn assert_in_order(output: &str, needles: &[&str]) {
    let output = squeeze(output);
    let output = output.as_str();
    let mut from = 0;
    for needle in needles {
        match output[from..].find(needle) {
            Some(i) => from += i + needle.len(),
            None => panic!("hack/demo's output lacks {needle:?} (after byte {from}):\n{output}"),
        }
    }
}

#[test]
fn the_demo_shows_every_step_once_and_leaves_nothing_behind() {
    let _turn = ONE_DEMO_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = demo_command(&["--once"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "hack/demo --once failed ({}):\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );

    assert_in_order(
        &stdout,
        &[
            "Starting the mini-cluster",
            "kwok-node-0",
            "leader: vm-controller-",
            "deployment \"example-foo\" successfully rolled out",
            "example-foo 3/3",
            "Foo status: {\"availableReplicas\":3}",
            "Normal Synced Foo/example-foo Foo synced successfully",
            "the same journey drawn, live, in a browser: http://127.0.0.1:",
            "test-vm Creating",
            "test-vm Active",
            "kubeloop-vm_kubeloop-demo_test-vm running",
            "VirtualMachine/test-vm",
            "the Foo's and test-vm's journeys (the sample controller and both VM replicas) on one page, live in a browser: http://127.0.0.1:",
            "Lease holder vm-controller-",
            "became the leader",
            "LeaderElection Lease/controller101 vm-controller-",
            "test-vm Terminating",
            "test-vm (gone)",
            "no container left for test-vm",
            "workqueue_adds_total{name=\"Foos\"}",
            "/healthz: ok /readyz: ok",
            "Demo passed (--once)",
            "Stopping the mini-cluster",
        ],
    );
    // Active with both usage columns filled: `test-vm   Active   <cpu>   <memory>   <age>`.
    let active = stdout
        .lines()
        .rfind(|l| squeeze(l).contains("test-vm Active"))
        .unwrap();
    let columns: Vec<&str> = active.split_whitespace().collect();
    assert_eq!(
        columns.len(),
        6,
        "time, name, phase, CPU, MEMORY, AGE: {active:?}"
    );
    assert!(
        columns[3].parse::<f64>().is_ok() && columns[4].parse::<f64>().is_ok(),
        "CPU and MEMORY are numbers: {active:?}"
    );
    // The failover names two different replicas.
    let failover = stdout
        .lines()
        .find(|l| l.contains("Lease holder vm-controller-"))
        .unwrap();
    let holders: Vec<&str> = failover
        .split_whitespace()
        .filter(|w| w.starts_with("vm-controller-"))
        .collect();
    assert_eq!(holders.len(), 2, "{failover}");
    assert_ne!(
        holders[0], holders[1],
        "the Lease moved to the other replica: {failover}"
    );

    assert_nothing_left(&stdout);
}

#[test]
fn ctrl_c_stops_a_running_demo_and_leaves_nothing_behind() {
    let _turn = ONE_DEMO_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = demo_command(&[]).stderr(Stdio::inherit()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let mut reached = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("Ctrl-C stops everything") {
            reached = true;
            break;
        }
    }
    if !reached {
        let _ = child.kill();
        let _ = child.wait();
        panic!("hack/demo ended before its pass was done:\n{seen}");
    }
    // The restarted standby is the fourth controller pid; wait for its announcement.
    std::thread::sleep(Duration::from_secs(2));
    // Ctrl-C: SIGINT to the script, as a terminal sends it.
    // SAFETY: kill(2) of our own child, not yet waited for, so its pid is still its own.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    for line in lines {
        seen.push_str(&line.unwrap());
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "Ctrl-C ends the demo with 130:\n{seen}"
    );
    assert!(seen.contains("Stopping the mini-cluster"), "{seen}");
    assert_nothing_left(&seen);
}
