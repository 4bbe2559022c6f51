//! Perturbation testing: controllers tested the way they fail, on the real apiserver.
//!
//! Controllers break where their view of the cluster differs from the cluster: a crash
//! between two writes, a reconcile on a lagging cache, a state the informer never delivered. Sieve (Sun et al., OSDI 2022) found 46
//! bugs in ten controllers by perturbing that view from outside client-go; here the harness
//! owns the client every informer and reconcile of the controller uses, so it needs nothing
//! from outside. A [`Campaign`]:
//!
//! 1. runs a [`Workload`] (a short script of user actions) once unperturbed: the reference.
//!    The [`Hook`] records the controller's writes and the watch events its informers got; the
//!    runtime's trace ([`kubeloop::trace`]) records its reconciles of the workload's keys; after
//!    each step the compared objects, once settled, are a checkpoint;
//! 2. generates test plans from that record, one [`Perturbation`] each, pruned to the points
//!    where it can change what the controller does (`plan.rs` says how);
//! 3. runs each plan in a fresh namespace with a fresh controller, and judges it: after each
//!    step the compared objects must come to equal the reference's checkpoint, field by field
//!    minus what differs from run to run (`oracle.rs`), within a bound, and no panic may
//!    happen. A finding prints with the plan and [`Campaign::replay_command`].
//!
//! | file | what |
//! |---|---|
//! | `hook.rs` | [`Hook`]: the controller's client, recording and perturbing |
//! | `log.rs` | [`RunLog`] and its records, [`Reconcile`]s from the trace |
//! | `plan.rs` | [`Perturbation`]: a crash after a write, a view held back, an object's events coalesced; generation and pruning |
//! | `oracle.rs` | [`Snapshot`]s and their field-by-field [`diff`]; [`lagging`] `observedGeneration`s |
//! | `campaign.rs` | [`Campaign`], [`Workload`], [`Action`]: the runs and the verdicts |
//! | `state.rs` | [`StateCampaign`]: spec changes generated from a CRD's schema (Acto: bounds, fields added and removed) and [`Misoperation`]s, with the oracles reaches-the-implied-state, idempotence, must-refuse and returns-after-revert |
//! | `workloads.rs` | the controllers' workloads (`sample`, `vm` on the fake engine or podman; `sample_state`, `vm_state`) and how a campaign runs each controller |
//!
//! Limits: the hook reads watch events as JSON (it asks for JSON where an informer asked for
//! protobuf), so the controller's wire differs from its default in a perturbed run; a
//! reconcile is placed by time among the traced reconciles of the workload's primary keys.

mod campaign;
mod hook;
mod log;
mod oracle;
mod plan;
mod state;
mod workloads;

pub use campaign::{
    Action, Audit, Campaign, CampaignError, Checked, ControllerFn, Outcome, Reference, Settings,
    Verdict, Workload,
};
pub use hook::Hook;
pub use log::{Delivery, Fired, Reconcile, RunLog, Write};
pub use oracle::{BEHIND, CAUGHT_UP, Snapshot, diff, lagging, normalize};
pub use plan::{Perturbation, PlanError};
pub use state::{
    Implied, Misoperation, Refuses, SpecChange, StateCampaign, StateReport, StateWorkload,
    spec_changes,
};
pub use workloads::{VmEngine, vm};
pub use workloads::{sample, sample_state, vm_state};
