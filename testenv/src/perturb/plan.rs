//! Test plans: one perturbation each, generated from a reference run and pruned as Sieve
//! prunes them (Sun et al., OSDI 2022, §4): only at points where the perturbation can change
//! what the controller does.
//!
//! - [`Perturbation::CrashAfterWrite`] (Sieve's intermediate-state plans): the controller's
//!   process ends right after the apiserver accepted its `nth` write of a kind, before it sees
//!   the answer, and a fresh one starts. Kept only where the reference run's reconcile sent
//!   another write of a compared kind after that one: there the crash leaves a state no
//!   complete reconcile leaves (a crash after a reconcile's last write leaves one that a
//!   reconcile leaves anyway).
//! - [`Perturbation::StaleView`] (stale-state plans): one informer's view is held back at an
//!   event (its watch stream delivers nothing more) for `hold` while the others move on. Kept
//!   only for the first event of each resource, type and object, and only where the reference
//!   run reconciled a workload key within `hold` after it: there the controller acts on the
//!   older view.
//! - [`Perturbation::Coalesce`] (unobserved-state plans): from an event of one object, that
//!   object's events are parked for `window` and only the last is handed on, so the
//!   informer never sees the states in between (others' events flow on). Kept only for the
//!   first event of each resource, type and object that the reference run saw followed by
//!   another event of the same object within the window: there a state goes unseen.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::log::{Reconcile, RunLog};

/// One perturbation; its `Display` form is what a finding prints and what `--plan` replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Perturbation {
    /// `crash:<resource>:<verb>:<nth>`.
    CrashAfterWrite {
        /// `plural.group`, `/subresource` appended.
        resource: String,
        /// `create`, `update`, `patch` or `delete`.
        verb: String,
        /// The write's ordinal among the run's accepted writes of that resource and verb.
        nth: u32,
    },
    /// `stale:<resource>:<event type>:<name>:<nth>:<hold in ms>ms`.
    StaleView {
        /// `plural.group` of the informer held back.
        resource: String,
        /// `ADDED`, `MODIFIED` or `DELETED`.
        event_type: String,
        /// The object's name (`prefix*` for a generated one).
        name: String,
        /// The event's ordinal among the run's events of that resource, type and name.
        nth: u32,
        /// How long the view stays where it was.
        hold: Duration,
    },
    /// `coalesce:<resource>:<event type>:<name>:<nth>:<window in ms>ms`.
    Coalesce {
        /// `plural.group` of the informer.
        resource: String,
        /// `ADDED`, `MODIFIED` or `DELETED`.
        event_type: String,
        /// The object's name (`prefix*` for a generated one).
        name: String,
        /// The event's ordinal among the run's events of that resource, type and name.
        nth: u32,
        /// How long the object's events are parked; the last one is handed on at its end.
        window: Duration,
    },
}

impl Perturbation {
    /// The event a stale-view or coalescing plan fires at: resource, type, name, ordinal.
    pub fn event_point(&self) -> Option<(&str, &str, &str, u32)> {
        match self {
            Self::CrashAfterWrite { .. } => None,
            Self::StaleView {
                resource,
                event_type,
                name,
                nth,
                ..
            }
            | Self::Coalesce {
                resource,
                event_type,
                name,
                nth,
                ..
            } => Some((resource, event_type, name, *nth)),
        }
    }
}

impl fmt::Display for Perturbation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CrashAfterWrite {
                resource,
                verb,
                nth,
            } => {
                write!(f, "crash:{resource}:{verb}:{nth}")
            }
            Self::StaleView {
                resource,
                event_type,
                name,
                nth,
                hold,
            } => write!(
                f,
                "stale:{resource}:{event_type}:{name}:{nth}:{}ms",
                hold.as_millis()
            ),
            Self::Coalesce {
                resource,
                event_type,
                name,
                nth,
                window,
            } => write!(
                f,
                "coalesce:{resource}:{event_type}:{name}:{nth}:{}ms",
                window.as_millis()
            ),
        }
    }
}

/// A plan that does not parse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "plan {plan:?}: {problem} (expected crash:<resource>:<verb>:<n>, or stale: or coalesce:<resource>:<ADDED|MODIFIED|DELETED>:<name>:<n>:<ms>ms)"
)]
pub struct PlanError {
    /// The text given.
    pub plan: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl FromStr for Perturbation {
    type Err = PlanError;

    fn from_str(plan: &str) -> Result<Self, PlanError> {
        let fail = |problem| PlanError {
            plan: plan.to_string(),
            problem,
        };
        let nth = |s: &str| match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(fail("the ordinal is not a number from 1")),
        };
        let parts: Vec<&str> = plan.split(':').collect();
        match parts.as_slice() {
            ["crash", resource, verb, n] if !resource.is_empty() => {
                if !matches!(*verb, "create" | "update" | "patch" | "delete") {
                    return Err(fail("the verb is not create, update, patch or delete"));
                }
                Ok(Self::CrashAfterWrite {
                    resource: resource.to_string(),
                    verb: verb.to_string(),
                    nth: nth(n)?,
                })
            }
            [
                kind @ ("stale" | "coalesce"),
                resource,
                event_type,
                name,
                n,
                lasts,
            ] if !resource.is_empty() => {
                if !matches!(*event_type, "ADDED" | "MODIFIED" | "DELETED") {
                    return Err(fail("the event type is not ADDED, MODIFIED or DELETED"));
                }
                let lasts = lasts
                    .strip_suffix("ms")
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .map(Duration::from_millis)
                    .ok_or_else(|| fail("the duration is not a number of milliseconds (6000ms)"))?;
                let (resource, event_type, name, nth) = (
                    resource.to_string(),
                    event_type.to_string(),
                    name.to_string(),
                    nth(n)?,
                );
                Ok(if *kind == "stale" {
                    Self::StaleView {
                        resource,
                        event_type,
                        name,
                        nth,
                        hold: lasts,
                    }
                } else {
                    Self::Coalesce {
                        resource,
                        event_type,
                        name,
                        nth,
                        window: lasts,
                    }
                })
            }
            _ => Err(fail("not a plan")),
        }
    }
}

/// The pruned plans of a reference run: crashes first, in write order, then stale views and
/// coalescings in event order. `compared` are the resources the oracle compares
/// (`deployments.apps`); writes and events of other resources (Events, Leases) make no plan.
pub fn generate(
    reference: &RunLog,
    reconciles: &[Reconcile],
    compared: &[String],
    hold: Duration,
    window: Duration,
) -> Vec<Perturbation> {
    let is_compared = |resource: &str| {
        let base = resource.split('/').next().unwrap_or(resource);
        compared.iter().any(|c| c == base)
    };
    let mut plans = Vec::new();
    let writes: Vec<_> = reference
        .writes
        .iter()
        .filter(|w| is_compared(&w.resource))
        .collect();
    for (i, write) in writes.iter().enumerate() {
        let within = reconciles.iter().find(|r| r.contains(write.at_micros));
        // Outside every traced reconcile (a leader task, say): kept, since nothing says it
        // was a reconcile's last write.
        let followed = match within {
            Some(r) => writes[i + 1..].iter().any(|w| r.contains(w.at_micros)),
            None => true,
        };
        if followed {
            plans.push(Perturbation::CrashAfterWrite {
                resource: write.resource.clone(),
                verb: write.verb.clone(),
                nth: write.nth,
            });
        }
    }
    let hold_micros = hold.as_micros() as u64;
    for event in &reference.deliveries {
        if event.nth != 1 || !is_compared(&event.resource) {
            continue;
        }
        let acted = reconciles.iter().any(|r| {
            r.start_micros > event.at_micros && r.start_micros <= event.at_micros + hold_micros
        });
        if acted {
            plans.push(Perturbation::StaleView {
                resource: event.resource.clone(),
                event_type: event.event_type.clone(),
                name: event.name.clone(),
                nth: 1,
                hold,
            });
        }
    }
    let window_micros = window.as_micros() as u64;
    let mut coalesced = std::collections::HashSet::new();
    for (i, event) in reference.deliveries.iter().enumerate() {
        if !is_compared(&event.resource)
            || coalesced.contains(&(&event.resource, &event.event_type, &event.name))
        {
            continue;
        }
        let hides_one = reference.deliveries[i + 1..].iter().any(|later| {
            later.resource == event.resource
                && later.name == event.name
                && later.at_micros <= event.at_micros + window_micros
        });
        if hides_one {
            coalesced.insert((&event.resource, &event.event_type, &event.name));
            plans.push(Perturbation::Coalesce {
                resource: event.resource.clone(),
                event_type: event.event_type.clone(),
                name: event.name.clone(),
                nth: event.nth,
                window,
            });
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::super::log::{Delivery, Write};
    use super::*;

    fn write(at: u64, resource: &str, verb: &str, nth: u32) -> Write {
        Write {
            at_micros: at,
            resource: resource.into(),
            verb: verb.into(),
            name: "x".into(),
            resource_version: "1".into(),
            nth,
        }
    }

    fn delivery(at: u64, resource: &str, event_type: &str, name: &str, nth: u32) -> Delivery {
        Delivery {
            at_micros: at,
            resource: resource.into(),
            event_type: event_type.into(),
            name: name.into(),
            resource_version: "1".into(),
            nth,
        }
    }

    fn reconcile(start: u64, end: u64) -> Reconcile {
        Reconcile {
            key: "ns/foo".into(),
            start_micros: start,
            end_micros: end,
        }
    }

    #[test]
    fn plans_print_and_parse_back() {
        for plan in [
            "crash:deployments.apps:create:2",
            "crash:foos.samplecontroller.k8s.io/status:update:1",
            "stale:deployments.apps:ADDED:dep-*:1:6000ms",
            "coalesce:foos.samplecontroller.k8s.io:MODIFIED:example-foo:2:3000ms",
        ] {
            let parsed: Perturbation = plan.parse().unwrap();
            assert_eq!(parsed.to_string(), plan);
        }
        for bad in [
            "crash:deployments.apps:get:1",
            "crash:deployments.apps:create:0",
            "stale:deployments.apps:BOOKMARK:x:1:10ms",
            "stale:deployments.apps:ADDED:x:1:6s",
            "coalesce:deployments.apps:MODIFIED:x:1",
            "sleep:1",
        ] {
            let err = bad.parse::<Perturbation>().unwrap_err();
            assert_eq!(err.plan, bad);
        }
    }

    #[test]
    fn a_crash_is_planned_only_between_two_writes_of_one_reconcile() {
        let log = RunLog {
            writes: vec![
                // One reconcile: a create then a status update; the next: one update.
                write(110, "deployments.apps", "create", 1),
                write(120, "foos.samplecontroller.k8s.io/status", "update", 1),
                write(210, "deployments.apps", "update", 1),
                // Not compared: no plan, and no reason to keep the update before it.
                write(220, "events.events.k8s.io", "create", 1),
            ],
            ..Default::default()
        };
        let compared = [
            "deployments.apps".to_string(),
            "foos.samplecontroller.k8s.io".into(),
        ];
        let plans = generate(
            &log,
            &[reconcile(100, 150), reconcile(200, 250)],
            &compared,
            Duration::from_secs(6),
            Duration::ZERO,
        );
        assert_eq!(
            plans,
            vec![Perturbation::CrashAfterWrite {
                resource: "deployments.apps".into(),
                verb: "create".into(),
                nth: 1,
            }]
        );
    }

    #[test]
    fn a_view_is_held_only_at_first_events_the_controller_acted_on_within_the_hold() {
        let log = RunLog {
            deliveries: vec![
                delivery(100, "deployments.apps", "ADDED", "dep", 1),
                delivery(300, "deployments.apps", "MODIFIED", "dep", 1),
                delivery(400, "deployments.apps", "MODIFIED", "dep", 2),
                delivery(500, "configmaps", "ADDED", "other", 1),
            ],
            ..Default::default()
        };
        // A reconcile 50 µs after the ADDED; none within 100 µs of the first MODIFIED; one
        // after the second MODIFIED (not a first event) and after the ConfigMap (not compared).
        let plans = generate(
            &log,
            &[
                reconcile(150, 160),
                reconcile(450, 460),
                reconcile(550, 560),
            ],
            &["deployments.apps".to_string()],
            Duration::from_micros(100),
            Duration::ZERO,
        );
        assert_eq!(
            plans.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec!["stale:deployments.apps:ADDED:dep:1:0ms"]
        );
    }

    #[test]
    fn events_are_coalesced_only_where_another_event_of_the_object_follows_within_the_window() {
        let log = RunLog {
            deliveries: vec![
                delivery(100, "deployments.apps", "MODIFIED", "dep", 1),
                delivery(150, "deployments.apps", "MODIFIED", "other", 1),
                delivery(180, "deployments.apps", "MODIFIED", "dep", 2),
                delivery(1000, "deployments.apps", "MODIFIED", "other", 2),
            ],
            ..Default::default()
        };
        let plans = generate(
            &log,
            &[],
            &["deployments.apps".to_string()],
            Duration::ZERO,
            Duration::from_micros(100),
        );
        // dep's first MODIFIED hides its second; other's two are 850 µs apart. Once per
        // resource, type and name: dep's second MODIFIED makes no second plan.
        assert_eq!(
            plans,
            vec![Perturbation::Coalesce {
                resource: "deployments.apps".into(),
                event_type: "MODIFIED".into(),
                name: "dep".into(),
                nth: 1,
                window: Duration::from_micros(100),
            }]
        );
    }
}
