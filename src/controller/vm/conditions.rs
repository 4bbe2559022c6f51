//! The VM's status conditions, in the Kubernetes convention (type, status, reason, message,
//! lastTransitionTime, observedGeneration), derived from the rest of the status each time the
//! controller writes it:
//! - `Ready`: `True` when the VM is Active on a running server; otherwise `False` with the
//!   phase as reason (`Creating`, `Failed`, `Terminating`) and the status's reason as message;
//! - `ServerRunning`: `True` when the server exists and runs; `False` with `NotRunning` (and
//!   the engine's state) or `NoServer`.
//!
//! `lastTransitionTime` moves only when a condition's status changes; `observedGeneration` is
//! the generation of the object the status was computed from. The reconcile-loop seed article
//! asks for exactly this: conditions to convey state, events to show each transition
//! ([`transition_event`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::types::{Phase, VirtualMachine, VirtualMachineStatus};
use crate::record::EventType;

/// `status.conditions[].type` of the VM being Active on a running server.
pub(crate) const READY: &str = "Ready";
/// `status.conditions[].type` of the server existing and running.
pub(crate) const SERVER_RUNNING: &str = "ServerRunning";

/// The conditions `status` implies for `vm`, keeping each transition time from `vm`'s current
/// conditions when the condition's status did not change.
pub(crate) fn conditions_for(
    vm: &VirtualMachine,
    status: &VirtualMachineStatus,
    now: &Time,
) -> Vec<Condition> {
    let running = status.server.as_ref().is_some_and(|s| s.state == "running");
    let server_text = match &status.server {
        Some(server) => server_text(server),
        None => "no server".to_string(),
    };
    let ready = if status.phase == Phase::Active && running {
        (true, "Active".to_string(), server_text.clone())
    } else {
        let reason = match status.phase {
            Phase::Active => "ServerNotRunning".to_string(),
            Phase::None | Phase::Unknown => "Pending".to_string(),
            phase => phase.as_str().to_string(),
        };
        let message = if status.reason.is_empty() {
            server_text.clone()
        } else {
            status.reason.clone()
        };
        (false, reason, message)
    };
    let server_running = match &status.server {
        Some(_) if running => (true, "Running".to_string(), server_text),
        Some(server) if server.exit_code.is_some() => (false, "Exited".to_string(), server_text),
        Some(_) => (false, "NotRunning".to_string(), server_text),
        None => (false, "NoServer".to_string(), server_text),
    };
    [(READY, ready), (SERVER_RUNNING, server_running)]
        .into_iter()
        .map(|(type_, (ok, reason, message))| {
            let status_text = if ok { "True" } else { "False" };
            let previous = vm
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
            let last_transition_time = match previous {
                Some(p) if p.status == status_text => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: type_.to_string(),
                status: status_text.to_string(),
                reason,
                message,
                last_transition_time,
                observed_generation: vm.metadata.generation,
            }
        })
        .collect()
}

/// The event for a phase change from `vm`'s phase to `status`'s: reason the new phase
/// (CamelCase), message naming the VM and the change. `None` if the phase did not change.
pub(crate) fn transition_event(
    vm: &VirtualMachine,
    status: &VirtualMachineStatus,
) -> Option<(EventType, &'static str, String)> {
    let old = vm.phase();
    let new = status.phase;
    if old.as_str() == new.as_str() {
        return None;
    }
    let (event_type, reason) = match new {
        Phase::Creating => (EventType::Normal, "Creating"),
        Phase::Active => (EventType::Normal, "Active"),
        Phase::Failed => (EventType::Warning, "Failed"),
        Phase::CrashLoopBackOff => (EventType::Warning, "CrashLoopBackOff"),
        Phase::Terminating => (EventType::Normal, "Terminating"),
        Phase::None | Phase::Unknown => return None,
    };
    let from = if old.as_str().is_empty() {
        "(new)"
    } else {
        old.as_str()
    };
    let why = if status.reason.is_empty() {
        status
            .server
            .as_ref()
            .map(|s| format!(": {}", server_text(s)))
            .unwrap_or_default()
    } else {
        format!(": {}", status.reason)
    };
    Some((
        event_type,
        reason,
        format!(
            "VirtualMachine {}: {from} -> {}{why}",
            vm.key(),
            new.as_str()
        ),
    ))
}

/// `server <short id> is <state>`, with the exit code of a stopped one.
fn server_text(server: &super::types::ServerStatus) -> String {
    let id = short_id(&server.id);
    match server.exit_code {
        Some(code) => format!("server {id} is {} (exit code {code})", server.state),
        None => format!("server {id} is {}", server.state),
    }
}

/// The first 12 characters of an engine id, as `docker ps` shows it.
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::vm::types::ServerStatus;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn status(phase: Phase, state: Option<&str>, reason: &str) -> VirtualMachineStatus {
        VirtualMachineStatus {
            phase,
            reason: reason.to_string(),
            server: state.map(|state| ServerStatus {
                id: "0123456789abcdef".into(),
                state: state.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn find<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
        conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn ready_and_server_running_follow_the_phase_and_the_server() {
        let mut vm = VirtualMachine::namespaced("ns", "vm", "1", "1Gi");
        vm.metadata.generation = Some(3);
        let t0 = time("2026-11-22T10:00:00Z");
        let creating = conditions_for(
            &vm,
            &status(Phase::Creating, None, "creating server s"),
            &t0,
        );
        let ready = find(&creating, READY);
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            ("False", "Creating", "creating server s")
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(find(&creating, SERVER_RUNNING).reason, "NoServer");

        vm.status = Some(VirtualMachineStatus {
            conditions: creating,
            ..status(Phase::Creating, None, "")
        });
        let t1 = time("2026-11-22T10:00:05Z");
        let active = conditions_for(&vm, &status(Phase::Active, Some("running"), ""), &t1);
        assert_eq!(find(&active, READY).status, "True");
        assert_eq!(
            find(&active, READY).message,
            "server 0123456789ab is running"
        );
        assert_eq!(find(&active, READY).last_transition_time, t1);

        // Unchanged statuses keep their transition time.
        vm.status = Some(VirtualMachineStatus {
            conditions: active,
            ..status(Phase::Active, Some("running"), "")
        });
        let t2 = time("2026-11-22T10:01:00Z");
        let again = conditions_for(&vm, &status(Phase::Active, Some("running"), ""), &t2);
        assert_eq!(find(&again, READY).last_transition_time, t1);
        // A server that exited: neither Ready nor running.
        let exited = conditions_for(&vm, &status(Phase::Active, Some("exited"), ""), &t2);
        assert_eq!(
            (
                find(&exited, READY).status.as_str(),
                find(&exited, READY).reason.as_str()
            ),
            ("False", "ServerNotRunning")
        );
        assert_eq!(find(&exited, SERVER_RUNNING).reason, "NotRunning");
        assert_eq!(find(&exited, SERVER_RUNNING).last_transition_time, t2);
    }

    #[test]
    fn every_phase_change_is_an_event_naming_the_vm_and_the_change() {
        let mut vm = VirtualMachine::namespaced("ns", "vm", "1", "1Gi");
        let (kind, reason, message) =
            transition_event(&vm, &status(Phase::Creating, None, "creating server s")).unwrap();
        assert_eq!((kind, reason), (EventType::Normal, "Creating"));
        assert_eq!(
            message,
            "VirtualMachine ns/vm: (new) -> Creating: creating server s"
        );
        vm.status = Some(status(Phase::Failed, None, "engine down"));
        let (kind, reason, message) =
            transition_event(&vm, &status(Phase::Active, Some("running"), "")).unwrap();
        assert_eq!((kind, reason), (EventType::Normal, "Active"));
        assert_eq!(
            message,
            "VirtualMachine ns/vm: Failed -> Active: server 0123456789ab is running"
        );
        let (kind, reason, _) =
            transition_event(&vm, &status(Phase::Terminating, None, "deleting")).unwrap();
        assert_eq!((kind, reason), (EventType::Normal, "Terminating"));
        assert!(transition_event(&vm, &status(Phase::Failed, None, "still down")).is_none());
    }
}
