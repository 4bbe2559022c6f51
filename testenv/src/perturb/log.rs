//! What one run of a workload recorded: the controller's writes, the watch events delivered to
//! it and the perturbations that fired, each stamped on the trace's clock
//! ([`kubeloop::trace::now_micros`]) so that they can be placed among the reconciles the runtime
//! recorded for the workload's keys.

/// A write the controller sent that the apiserver accepted (a 2xx answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// When the answer came back (trace clock, microseconds).
    pub at_micros: u64,
    /// `plural.group` (`deployments.apps`, `configmaps`), `/subresource` appended.
    pub resource: String,
    /// `create`, `update`, `patch` or `delete`.
    pub verb: String,
    /// The object written, from the answer (a generated name is masked: `foo-*`).
    pub name: String,
    /// The resourceVersion the write produced.
    pub resource_version: String,
    /// This write is the `nth` accepted one of its resource and verb in the run (from 1).
    pub nth: u32,
}

/// A watch event that reached the controller's informers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// When it was handed to the informer (trace clock, microseconds).
    pub at_micros: u64,
    /// `plural.group`.
    pub resource: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub event_type: String,
    /// The object's name (a generated name is masked: `foo-*`).
    pub name: String,
    /// The object's resourceVersion in the event.
    pub resource_version: String,
    /// This is the `nth` event of this resource, type and name in the run (from 1).
    pub nth: u32,
}

/// A perturbation that fired: what it did, to which object at which version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    /// When it fired (trace clock, microseconds).
    pub at_micros: u64,
    /// The plan, as [`super::Perturbation`] prints it.
    pub plan: String,
    /// `resource/name` of the object written or held back.
    pub object: String,
    /// The object's resourceVersion written or held back at.
    pub resource_version: String,
    /// How long it lasted (a held view; zero for a crash).
    pub lasted_micros: u64,
}

/// Everything one run recorded, in the order it happened.
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    /// The accepted writes.
    pub writes: Vec<Write>,
    /// The watch events handed to the informers.
    pub deliveries: Vec<Delivery>,
    /// The perturbations that fired.
    pub fired: Vec<Fired>,
    /// Controller restarts: the crash a plan caused and the ones the workload asked for.
    pub restarts: u32,
}

/// One reconcile of a workload's key, as the runtime traced it (`ReconcileStarted` to
/// `ReconcileFinished`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    /// The key reconciled.
    pub key: String,
    /// When it started (trace clock, microseconds).
    pub start_micros: u64,
    /// `u64::MAX` for a reconcile that never finished (its process crashed).
    pub end_micros: u64,
}

impl Reconcile {
    /// Whether the reconcile was under way at `at_micros`.
    pub fn contains(&self, at_micros: u64) -> bool {
        self.start_micros <= at_micros && at_micros <= self.end_micros
    }
}

/// The reconciles of `keys` in the runtime's trace, oldest first.
pub fn reconciles(keys: &[String]) -> Vec<Reconcile> {
    use kubeloop::trace::Stage;
    let mut all = Vec::new();
    for key in keys {
        let mut open: Option<u64> = None;
        for step in kubeloop::trace::timeline(key).unwrap_or_default() {
            match step.stage {
                Stage::ReconcileStarted => {
                    if let Some(start) = open.replace(step.mono_micros) {
                        all.push(Reconcile {
                            key: key.clone(),
                            start_micros: start,
                            end_micros: u64::MAX,
                        });
                    }
                }
                Stage::ReconcileFinished => {
                    if let Some(start) = open.take() {
                        all.push(Reconcile {
                            key: key.clone(),
                            start_micros: start,
                            end_micros: step.mono_micros,
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(start) = open {
            all.push(Reconcile {
                key: key.clone(),
                start_micros: start,
                end_micros: u64::MAX,
            });
        }
    }
    all.sort_by_key(|r| r.start_micros);
    all
}

/// A name as plans and the oracle know it: `generateName*` when the apiserver generated it,
/// since a generated name differs from run to run.
pub fn stable_name(name: &str, generate_name: Option<&str>) -> String {
    match generate_name {
        Some(prefix) if !prefix.is_empty() && name.starts_with(prefix) => format!("{prefix}*"),
        _ => name.to_string(),
    }
}
