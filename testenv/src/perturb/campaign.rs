//! A campaign: a workload's reference run, the plans generated from it, and each plan run in a
//! fresh namespace and judged by the oracle.
//!
//! Each run goes the same way: a new namespace; the controller started through a [`Hook`] on
//! a runtime of its own (a crash drops that runtime with every task on it, as a killed
//! process loses its memory, and a fresh one starts); then the workload's steps, one by one.
//! After each step the reference run waits until the compared objects stop changing and keeps
//! what they are (a checkpoint); a plan's run waits until they equal that checkpoint and stay
//! so for the quiet period, or the bound passes (a finding: it did not converge, with the
//! difference). While a view is held back the user does not wait: the next step goes ahead
//! at once (once per run), and the step after it is judged, once the hold is over. A panic on the controller's threads is a finding
//! too. Then the controller is stopped and the namespace deleted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube_client::Client;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams,
    PropagationPolicy,
};
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::hook::Hook;
use super::log::{Fired, Reconcile, RunLog, reconciles};
use super::oracle::{Snapshot, diff, lagging, resource_name, snapshot};
use super::plan::{Perturbation, generate};

/// Runs the controller under test: given a client (through the hook), the namespace to watch
/// and a shutdown token, it runs until the token is cancelled.
pub type ControllerFn =
    Arc<dyn Fn(Client, String, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;

/// One user action of a workload.
#[derive(Debug, Clone)]
pub enum Action {
    /// Create the object (its namespace is the run's).
    Create(ApiResource, Value),
    /// A JSON merge patch of `name`.
    Patch(ApiResource, String, Value),
    /// Delete `name` and wait until it is gone, as `kubectl delete` does; `orphan` leaves its
    /// dependents (propagation `Orphan`).
    Delete {
        /// Its resource.
        resource: ApiResource,
        /// Its name.
        name: String,
        /// Leave its dependents (propagation `Orphan`).
        orphan: bool,
    },
    /// Kill the controller and start a fresh one (not a perturbation: the reference does it
    /// too).
    RestartController,
    /// These actions one after the other, with no settling between them (a delete while the
    /// controller is still creating, say).
    All(Vec<Action>),
}

/// Checks what the oracle cannot see (a container engine's servers), once the run's
/// controller has stopped: given the run's namespace, one line per problem.
pub type Audit = Arc<dyn Fn(&str) -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// A short script of user actions against one controller.
#[derive(Clone)]
pub struct Workload {
    /// Names the namespaces and the replay command.
    pub name: String,
    /// The resources the oracle compares; the first is the controller's primary, whose
    /// objects' keys are traced to place writes and events among reconciles.
    pub resources: Vec<ApiResource>,
    /// The actions, in order.
    pub steps: Vec<Action>,
    /// Fields the oracle leaves out besides the usual ones, as JSON pointers into each object
    /// (`/status/lastUpdateTime`).
    pub ignored: Vec<String>,
    /// What the run leaves outside the cluster, checked after the controller stopped (orphaned
    /// servers); `None`: nothing.
    pub audit: Option<Audit>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload")
            .field("name", &self.name)
            .field("resources", &self.resources)
            .field("steps", &self.steps)
            .field("ignored", &self.ignored)
            .field("audit", &self.audit.is_some())
            .finish()
    }
}

/// Timings of a campaign.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long the compared objects must stay unchanged (reference) or equal to the
    /// checkpoint (plans) to count as settled.
    pub quiet: Duration,
    /// How long a step may take to settle: past it, a plan's run did not converge.
    pub converge: Duration,
    /// How long a stale-view plan holds its view back: longer than the runtime's
    /// read-your-writes wait (5 s), so that a reconcile does start on the older view.
    pub hold: Duration,
    /// How long a coalescing plan parks an object's events.
    pub window: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            quiet: Duration::from_secs(3),
            converge: Duration::from_secs(45),
            hold: Duration::from_secs(7),
            window: Duration::from_secs(3),
        }
    }
}

/// The reference run: what it recorded, its checkpoints and the plans they give.
#[derive(Debug, Clone)]
pub struct Reference {
    /// What the hook recorded.
    pub log: RunLog,
    /// The traced reconciles of the workload's keys.
    pub reconciles: Vec<Reconcile>,
    /// The compared objects after each step.
    pub checkpoints: Vec<Snapshot>,
    /// The pruned plans.
    pub plans: Vec<Perturbation>,
    /// How long the reference run took.
    pub took: Duration,
}

impl Reference {
    /// The first plan of each kind (a crash, a held view, a coalescing): a campaign of a
    /// minute, where every plan takes several.
    pub fn first_of_each_kind(&self) -> Vec<Perturbation> {
        let mut kinds = Vec::new();
        self.plans
            .iter()
            .filter(|plan| {
                let kind = std::mem::discriminant(*plan);
                let first = !kinds.contains(&kind);
                if first {
                    kinds.push(kind);
                }
                first
            })
            .cloned()
            .collect()
    }
}

/// What one plan's run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The plan run.
    pub plan: Perturbation,
    /// The perturbations that fired (none: the plan's point never came).
    pub fired: Vec<Fired>,
    /// The reconciles each fired perturbation hit: the one the crash ended, or those that
    /// started while the view was held.
    pub hit: Vec<Reconcile>,
    /// What the oracle found, one line each (empty: passed).
    pub findings: Vec<String>,
    /// How long the plan's run took.
    pub took: Duration,
}

/// The verdict on one plan's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The perturbation fired and the oracle found nothing.
    Passed,
    /// The oracle found something (whether or not the perturbation fired).
    Found,
    /// The oracle found nothing, but the perturbation never fired: the plan's point never
    /// came (or the hook no longer fires), so the run checked only the unperturbed workload.
    /// Not a pass.
    NeverFired,
}

impl Outcome {
    /// What the run says of the plan.
    pub fn verdict(&self) -> Verdict {
        if !self.findings.is_empty() {
            Verdict::Found
        } else if self.fired.is_empty() {
            Verdict::NeverFired
        } else {
            Verdict::Passed
        }
    }

    /// `plan: passed`, `plan: FOUND ...` or `plan: NEVER FIRED`, with what fired and what it
    /// hit.
    pub fn summary(&self) -> String {
        let fired = match self.fired.first() {
            None => "checked nothing the reference run did not".to_string(),
            Some(f) => {
                let mut keys: Vec<&str> = self.hit.iter().map(|r| r.key.as_str()).collect();
                keys.dedup();
                format!(
                    "fired at {} rv={}, hit {} reconcile(s) of {}",
                    f.object,
                    f.resource_version,
                    self.hit.len(),
                    if keys.is_empty() {
                        "-".to_string()
                    } else {
                        keys.join(", ")
                    }
                )
            }
        };
        let verdict = match self.verdict() {
            Verdict::Passed => "passed".to_string(),
            Verdict::Found => format!("FOUND {}", self.findings.join("; ")),
            Verdict::NeverFired => "NEVER FIRED".into(),
        };
        format!(
            "{}: {verdict} ({fired}; {:.1} s)",
            self.plan,
            self.took.as_secs_f64()
        )
    }
}

/// The verdicts of a campaign's plans ([`Campaign::check`]).
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// The plans that fired and passed.
    pub passed: Vec<Perturbation>,
    /// The plans the oracle found something under: a line each, with its replay command.
    pub findings: Vec<String>,
    /// The plans that never fired and found nothing: their point never came, so they checked
    /// nothing the reference run did not.
    pub never_fired: Vec<Perturbation>,
}

impl Checked {
    /// How many plans ran.
    pub fn ran(&self) -> usize {
        self.passed.len() + self.findings.len() + self.never_fired.len()
    }

    /// `N plans: P fired and passed, F found something, U never fired (plans...)`.
    pub fn tally(&self) -> String {
        let mut line = format!(
            "{} plans: {} fired and passed, {} found something, {} never fired",
            self.ran(),
            self.passed.len(),
            self.findings.len(),
            self.never_fired.len()
        );
        if !self.never_fired.is_empty() {
            let plans: Vec<String> = self.never_fired.iter().map(ToString::to_string).collect();
            line.push_str(&format!(" ({})", plans.join(", ")));
        }
        line
    }
}

/// What went wrong with the harness itself (not a finding about the controller).
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    /// A request of the harness's own failed.
    #[error("the apiserver: {0}")]
    Api(#[from] kube_client::Error),
    /// The reference run's objects kept changing after a step.
    #[error("the reference run did not settle after step {step} within {within:?}")]
    ReferenceUnsettled {
        /// The step, from 1.
        step: usize,
        /// The bound.
        within: Duration,
    },
    /// The reference run settled with an `observedGeneration` behind its object's
    /// `generation`: the controller never caught up with a spec (or never said so).
    #[error(
        "the reference run settled after step {step} with observedGeneration behind generation: {fields}"
    )]
    ReferenceLagging {
        /// The step, from 1.
        step: usize,
        /// `resource/name .status...observedGeneration`, comma-separated.
        fields: String,
    },
    /// The unperturbed run already failed (a panic).
    #[error("the reference run found problems itself: {0}")]
    ReferenceFailed(String),
    /// A campaign was to check no plan at all (none generated, or none of those chosen).
    #[error("no plan to run: the reference run generated {generated}, none of them chosen")]
    NoPlans {
        /// How many plans the reference run generated.
        generated: usize,
    },
}

/// A workload, a controller and a cluster.
pub struct Campaign {
    config: kube_client::Config,
    workload: Workload,
    controller: ControllerFn,
    settings: Settings,
}

static PANICS: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
/// Runs started in this process, numbering their namespaces.
pub(super) static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics per thread name from here on (the controller's runtimes name their
/// threads after their run's namespace), then calls the hook that was there.
fn count_panics() -> &'static Mutex<HashMap<String, usize>> {
    PANICS.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(name) = std::thread::current().name()
                && let Some(panics) = PANICS.get()
            {
                *panics.lock().entry(name.to_string()).or_default() += 1;
            }
            previous(info);
        }));
        Mutex::new(HashMap::new())
    })
}

impl Campaign {
    /// `config` reaches the cluster as an admin (the workload's actions and the oracle use it;
    /// the controller gets a client through the hook built from it).
    pub fn new(
        config: kube_client::Config,
        workload: Workload,
        controller: ControllerFn,
        settings: Settings,
    ) -> Self {
        Campaign {
            config,
            workload,
            controller,
            settings,
        }
    }

    /// The command that runs `plan` alone again.
    pub fn replay_command(&self, plan: &Perturbation) -> String {
        format!(
            "hack/perturb --workload {} --plan '{plan}'",
            self.workload.name
        )
    }

    /// Runs the workload unperturbed, keeps its checkpoints and generates the pruned plans.
    pub async fn reference(&self) -> Result<Reference, CampaignError> {
        let started = Instant::now();
        let run = self.run(None, None).await?;
        if !run.findings.is_empty() {
            return Err(CampaignError::ReferenceFailed(run.findings.join("; ")));
        }
        let compared: Vec<String> = self.workload.resources.iter().map(resource_name).collect();
        let plans = generate(
            &run.log,
            &run.reconciles,
            &compared,
            self.settings.hold,
            self.settings.window,
        );
        Ok(Reference {
            log: run.log,
            reconciles: run.reconciles,
            checkpoints: run.checkpoints,
            plans,
            took: started.elapsed(),
        })
    }

    /// Runs the workload under `plan` and judges it against `reference`.
    pub async fn run_plan(
        &self,
        reference: &Reference,
        plan: &Perturbation,
    ) -> Result<Outcome, CampaignError> {
        let started = Instant::now();
        let run = self.run(Some(plan.clone()), Some(reference)).await?;
        let hit = run
            .log
            .fired
            .iter()
            .flat_map(|f| {
                run.reconciles.iter().filter(move |r| {
                    if f.lasted_micros == 0 {
                        r.contains(f.at_micros)
                    } else {
                        r.start_micros >= f.at_micros
                            && r.start_micros <= f.at_micros + f.lasted_micros
                    }
                })
            })
            .cloned()
            .collect();
        Ok(Outcome {
            plan: plan.clone(),
            fired: run.log.fired,
            hit,
            findings: run.findings,
            took: started.elapsed(),
        })
    }

    /// Runs `plans`, up to `parallel` at once (each has its own namespace, controller and
    /// hook), and returns their outcomes in the order given.
    pub async fn run_plans(
        &self,
        reference: &Reference,
        plans: &[Perturbation],
        parallel: usize,
    ) -> Result<Vec<Outcome>, CampaignError> {
        use futures::StreamExt;
        futures::stream::iter(plans)
            .map(|plan| self.run_plan(reference, plan))
            .buffered(parallel.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// A whole campaign: the reference run, then the plans `select` picks from it, `parallel`
    /// at once, a line each on stdout (the reference's, then each outcome's summary). Returns
    /// each plan's verdict ([`Checked`]): a plan passed only if it fired and the oracle found
    /// nothing. A selection of no plan is an error ([`CampaignError::NoPlans`]): such a
    /// campaign checks nothing.
    pub async fn check(
        &self,
        select: impl FnOnce(&Reference) -> Vec<Perturbation>,
        parallel: usize,
    ) -> Result<Checked, CampaignError> {
        let reference = self.reference().await?;
        let plans = select(&reference);
        if plans.is_empty() {
            return Err(CampaignError::NoPlans {
                generated: reference.plans.len(),
            });
        }
        println!(
            "{}: reference run {:.1} s, {} writes, {} watch events, {} reconciles -> {} plans, {} to run",
            self.workload.name,
            reference.took.as_secs_f64(),
            reference.log.writes.len(),
            reference.log.deliveries.len(),
            reference.reconciles.len(),
            reference.plans.len(),
            plans.len()
        );
        let mut checked = Checked::default();
        for outcome in self.run_plans(&reference, &plans, parallel).await? {
            println!("{}", outcome.summary());
            let line = format!(
                "{}\n  replay: {}",
                outcome.summary(),
                self.replay_command(&outcome.plan)
            );
            match outcome.verdict() {
                Verdict::Passed => checked.passed.push(outcome.plan),
                Verdict::Found => checked.findings.push(line),
                Verdict::NeverFired => checked.never_fired.push(outcome.plan),
            }
        }
        println!("{}: {}", self.workload.name, checked.tally());
        Ok(checked)
    }

    async fn run(
        &self,
        plan: Option<Perturbation>,
        reference: Option<&Reference>,
    ) -> Result<Run, CampaignError> {
        let panics = count_panics();
        let admin = Client::try_from(self.config.clone())?;
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let namespace = format!(
            "perturb-{}-{}-{}",
            self.workload.name,
            std::process::id(),
            n
        );
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))
                    .expect("a namespace"),
            )
            .await?;
        let keys = self.primary_keys(&namespace);
        kubeloop::trace::follow(&keys).expect("namespace/name keys");

        let hook = Hook::new(plan);
        let controller = Incarnations::start(
            self.config.clone(),
            hook.clone(),
            namespace.clone(),
            self.controller.clone(),
        );
        let mut findings = Vec::new();
        let mut checkpoints = Vec::new();
        let mut moved_on = false;
        for (step, action) in self.workload.steps.iter().enumerate() {
            self.act(&admin, &namespace, &hook, action).await?;
            let settled = match reference {
                None => self.quiesce(&admin, &namespace, step).await?,
                Some(reference) => {
                    let expected = &reference.checkpoints[step];
                    // The user goes ahead of a held view once; the step after is judged.
                    let go_ahead = !moved_on && step + 1 < self.workload.steps.len();
                    match self
                        .converge(&admin, &namespace, &hook, expected, go_ahead)
                        .await?
                    {
                        Converged::Equal(snapshot) => snapshot,
                        Converged::MovedOn => {
                            moved_on = true;
                            tracing::info!(
                                step = step + 1,
                                "a view is held: the next step goes ahead"
                            );
                            expected.clone()
                        }
                        Converged::Diverged(difference) => {
                            findings.push(format!(
                                "after step {} ({}) not converged within {:?}: {}",
                                step + 1,
                                describe(action),
                                self.settings.converge,
                                difference.join(", ")
                            ));
                            break;
                        }
                    }
                }
            };
            checkpoints.push(settled);
        }
        controller.stop().await;
        if let Some(audit) = &self.workload.audit {
            findings.extend(audit(&namespace).await);
        }
        let thread = format!("perturb-{namespace}");
        if let Some(count) = panics.lock().remove(&thread) {
            findings.push(format!("{count} panic(s) on the controller's threads"));
        }
        let _ = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
        Ok(Run {
            log: hook.log(),
            reconciles: reconciles(&keys),
            checkpoints,
            findings,
        })
    }

    /// `namespace/name` of each primary object the workload creates.
    fn primary_keys(&self, namespace: &str) -> Vec<String> {
        fn walk(
            actions: &[Action],
            primary: &ApiResource,
            namespace: &str,
            keys: &mut Vec<String>,
        ) {
            for action in actions {
                match action {
                    Action::Create(resource, object) if resource == primary => {
                        if let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str)
                        {
                            keys.push(format!("{namespace}/{name}"));
                        }
                    }
                    Action::All(actions) => walk(actions, primary, namespace, keys),
                    _ => {}
                }
            }
        }
        let mut keys = Vec::new();
        walk(
            &self.workload.steps,
            &self.workload.resources[0],
            namespace,
            &mut keys,
        );
        keys
    }

    async fn act(
        &self,
        admin: &Client,
        namespace: &str,
        hook: &Hook,
        action: &Action,
    ) -> Result<(), CampaignError> {
        let api = |resource: &ApiResource| {
            Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, resource)
        };
        match action {
            Action::Create(resource, object) => {
                let object: DynamicObject = serde_json::from_value(object.clone())
                    .map_err(kube_client::Error::SerdeError)?;
                api(resource)
                    .create(&PostParams::default(), &object)
                    .await?;
            }
            Action::Patch(resource, name, patch) => {
                api(resource)
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
            }
            Action::Delete {
                resource,
                name,
                orphan,
            } => {
                let params = if *orphan {
                    DeleteParams {
                        propagation_policy: Some(PropagationPolicy::Orphan),
                        ..Default::default()
                    }
                } else {
                    DeleteParams::default()
                };
                let api = api(resource);
                api.delete(name, &params).await?;
                // As `kubectl delete` does: wait until it is gone (its finalizers done, the
                // garbage collector's orphaning included), within the bound.
                let deadline = Instant::now() + self.settings.converge;
                while api.get_opt(name).await?.is_some() && Instant::now() < deadline {
                    tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
                }
            }
            Action::RestartController => hook.crash_now(),
            Action::All(actions) => {
                for action in actions {
                    Box::pin(self.act(admin, namespace, hook, action)).await?;
                }
            }
        }
        Ok(())
    }

    /// Waits until the compared objects stop changing for the quiet period with every
    /// `observedGeneration` caught up with its `generation`.
    async fn quiesce(
        &self,
        admin: &Client,
        namespace: &str,
        step: usize,
    ) -> Result<Snapshot, CampaignError> {
        let deadline = Instant::now() + self.settings.converge;
        let mut last = snapshot(
            admin,
            namespace,
            &self.workload.resources,
            &self.workload.ignored,
        )
        .await?;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
            let now = snapshot(
                admin,
                namespace,
                &self.workload.resources,
                &self.workload.ignored,
            )
            .await?;
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= self.settings.quiet && lagging(&last).is_empty() {
                return Ok(last);
            }
            if Instant::now() > deadline {
                let behind = lagging(&last);
                if since.elapsed() >= self.settings.quiet && !behind.is_empty() {
                    return Err(CampaignError::ReferenceLagging {
                        step: step + 1,
                        fields: behind.join(", "),
                    });
                }
                return Err(CampaignError::ReferenceUnsettled {
                    step: step + 1,
                    within: self.settings.converge,
                });
            }
        }
    }

    /// Waits until the compared objects equal `expected` for the quiet period with no view
    /// held back. While a view is held and `go_ahead` allows, the user does not wait for the
    /// controller: the next step goes ahead at once (the others move on while one informer
    /// lags), and this step's checkpoint is not judged.
    async fn converge(
        &self,
        admin: &Client,
        namespace: &str,
        hook: &Hook,
        expected: &Snapshot,
        go_ahead: bool,
    ) -> Result<Converged, CampaignError> {
        let deadline = Instant::now() + self.settings.converge;
        let mut equal_since: Option<Instant> = None;
        loop {
            if go_ahead && hook.holding() {
                return Ok(Converged::MovedOn);
            }
            let now = snapshot(
                admin,
                namespace,
                &self.workload.resources,
                &self.workload.ignored,
            )
            .await?;
            let difference = diff(expected, &now);
            if !difference.is_empty() || hook.holding() {
                equal_since = None;
            } else if equal_since.get_or_insert_with(Instant::now).elapsed() >= self.settings.quiet
            {
                return Ok(Converged::Equal(now));
            }
            if Instant::now() > deadline {
                return Ok(Converged::Diverged(difference));
            }
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
        }
    }
}

/// How a step of a plan's run ended.
enum Converged {
    /// Equal to the reference's checkpoint for the quiet period.
    Equal(Snapshot),
    /// A view was held: the next step went ahead without waiting.
    MovedOn,
    /// Still different when the bound passed: the last difference.
    Diverged(Vec<String>),
}

struct Run {
    log: RunLog,
    reconciles: Vec<Reconcile>,
    checkpoints: Vec<Snapshot>,
    findings: Vec<String>,
}

fn describe(action: &Action) -> String {
    match action {
        Action::Create(r, o) => format!(
            "create {}/{}",
            resource_name(r),
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?")
        ),
        Action::Patch(r, name, patch) => format!("patch {}/{name} {patch}", resource_name(r)),
        Action::Delete {
            resource,
            name,
            orphan,
        } => format!(
            "delete {}/{name}{}",
            resource_name(resource),
            if *orphan { " (orphan)" } else { "" }
        ),
        Action::RestartController => "restart the controller".into(),
        Action::All(actions) => actions
            .iter()
            .map(describe)
            .collect::<Vec<_>>()
            .join(", then "),
    }
}

/// The controller's successive processes in one run: each on a runtime of its own, on a
/// thread of its own; a crash drops that runtime where it stands and starts the next.
pub(super) struct Incarnations {
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

impl Incarnations {
    pub(super) fn start(
        config: kube_client::Config,
        hook: Hook,
        namespace: String,
        controller: ControllerFn,
    ) -> Self {
        let stop = CancellationToken::new();
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("perturb-{namespace}"))
            .spawn(move || {
                let mut crashes = hook.crashes();
                loop {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .thread_name(format!("perturb-{namespace}"))
                        .enable_all()
                        .build()
                        .expect("a runtime for the controller");
                    let crashed = runtime.block_on(async {
                        let client = match hook.client(config.clone()) {
                            Ok(client) => client,
                            Err(e) => {
                                tracing::error!(error = %e, "perturbation harness: no client");
                                return false;
                            }
                        };
                        let shutdown = CancellationToken::new();
                        crashes.borrow_and_update();
                        let mut run =
                            tokio::spawn(controller(client, namespace.clone(), shutdown.clone()));
                        tokio::select! {
                            _ = thread_stop.cancelled() => {
                                shutdown.cancel();
                                let _ = tokio::time::timeout(Duration::from_secs(30), &mut run).await;
                                false
                            }
                            _ = crashes.changed() => true,
                            _ = &mut run => {
                                thread_stop.cancelled().await;
                                false
                            }
                        }
                    });
                    // A crash: every task of this process is dropped where it stands.
                    runtime.shutdown_background();
                    if !crashed {
                        return;
                    }
                }
            })
            .expect("a thread for the controller");
        Incarnations { stop, thread }
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_plan_of_each_kind_is_kept_in_order() {
        let plans: Vec<Perturbation> = [
            "crash:deployments.apps:create:1",
            "crash:deployments.apps:create:2",
            "stale:deployments.apps:ADDED:d:1:7000ms",
            "coalesce:deployments.apps:ADDED:d:1:3000ms",
            "stale:deployments.apps:MODIFIED:d:1:7000ms",
        ]
        .iter()
        .map(|p| p.parse().unwrap())
        .collect();
        let reference = Reference {
            log: RunLog::default(),
            reconciles: Vec::new(),
            checkpoints: Vec::new(),
            plans: plans.clone(),
            took: Duration::ZERO,
        };
        assert_eq!(
            reference.first_of_each_kind(),
            vec![plans[0].clone(), plans[2].clone(), plans[3].clone()]
        );
    }

    #[test]
    fn a_plan_that_never_fired_did_not_pass() {
        let plan: Perturbation = "crash:deployments.apps:create:1".parse().unwrap();
        let fired = Fired {
            at_micros: 1,
            plan: plan.to_string(),
            object: "deployments.apps/d".into(),
            resource_version: "7".into(),
            lasted_micros: 0,
        };
        let outcome = |fired: Vec<Fired>, findings: Vec<String>| Outcome {
            plan: plan.clone(),
            fired,
            hit: Vec::new(),
            findings,
            took: Duration::ZERO,
        };
        let never = outcome(Vec::new(), Vec::new());
        assert_eq!(never.verdict(), Verdict::NeverFired);
        assert!(
            never.summary().contains("NEVER FIRED"),
            "{}",
            never.summary()
        );
        assert_eq!(
            outcome(vec![fired.clone()], Vec::new()).verdict(),
            Verdict::Passed
        );
        // A finding stands whether or not the plan fired (a run that did not converge).
        assert_eq!(
            outcome(Vec::new(), vec!["after step 1 ...".into()]).verdict(),
            Verdict::Found
        );
        let checked = Checked {
            passed: vec![plan.clone()],
            findings: Vec::new(),
            never_fired: vec![plan.clone()],
        };
        assert_eq!(checked.ran(), 2);
        assert_eq!(
            checked.tally(),
            "2 plans: 1 fired and passed, 0 found something, 1 never fired \
             (crash:deployments.apps:create:1)"
        );
    }
}
