//! State-centric campaigns, after Acto (Gu et al., SOSP 2023): instead of perturbing the
//! controller's view, change what the user asks for. Spec changes are generated from the
//! CRD's OpenAPI schema ([`spec_changes`]: each bounded field at and beyond each bound, each
//! field of the object removed, each absent one added), and each is applied to one object on
//! the real apiserver, then reverted, with these oracles:
//!
//! - **reaches the implied state**: once the change is accepted, the workload's
//!   [`Implied`] check finds nothing wrong within the bound;
//! - **idempotence**: once converged, one more reconcile (a fresh controller, which
//!   reconciles every object it lists) writes nothing of the compared resources (counted
//!   through the [`Hook`]);
//! - **must refuse**: a change the apiserver accepts but the controller cannot honour (the
//!   workload's [`Refuses`] says which, and what the refusal must name), or a
//!   [`Misoperation`] (a child the object does not own), leaves an Event about the object or
//!   a condition on it naming the problem, and loses nothing: every other compared object
//!   stays as it was and the object's spec stays as the user set it. Idempotence is not
//!   judged after a refusal: a fresh controller may try a refused spec once more;
//! - **returns after revert**: once the change is undone, the compared objects come back
//!   to what they were before it (the oracle's [`diff`]). Each change is judged from the
//!   state the one before it left, so a finding belongs to its own change.
//!
//! A value beyond a bound (or the removal of a required field) is expected to be refused by
//! the apiserver (and to change nothing); one it accepts is a finding too. At the end the
//! object is deleted while the controller still runs, and the workload's [`Audit`] looks for
//! what it left behind. Every finding prints the command that replays its change.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube_client::Client;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use super::campaign::{Audit, CampaignError, ControllerFn, Incarnations, RUNS, Settings};
use super::hook::Hook;
use super::oracle::{Snapshot, diff, resource_name, snapshot};

/// One generated change of a spec field.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecChange {
    /// JSON pointer into the object (`/spec/replicas`).
    pub pointer: String,
    /// The value set there (`null`: the field removed).
    pub value: Value,
    /// Whether the schema allows it (at a bound, an optional field removed) or not (beyond a
    /// bound, a required field removed).
    pub allowed: bool,
    /// Which bound: `minimum 1`, `past maxLength 253`, `removed`, `minimum 1, added`.
    pub bound: String,
}

impl fmt::Display for SpecChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = match &self.value {
            Value::String(s) if s.len() > 12 => format!("<{} characters>", s.chars().count()),
            v => v.to_string(),
        };
        write!(f, "{}={value} ({})", self.pointer, self.bound)
    }
}

/// The changes `schema` (a CRD version's `openAPIV3Schema`) allows and refuses under `spec`,
/// for `object` (the object the campaign creates):
/// - for an integer (or an `x-kubernetes-int-or-string`) with `minimum`/`maximum`, each bound
///   (allowed) and one past it (refused);
/// - for a string with `minLength`/`maxLength`, strings of `a`s of each length (allowed: `a`s
///   fit the DNS-name patterns CRDs use) and one past it;
/// - for a boolean, both values;
/// - each field `object` sets, removed: allowed if it is optional, refused if `required`;
/// - a bound's change of a field `object` does not set adds it (`, added`).
///
/// Fields without bounds give no change but their removal.
pub fn spec_changes(schema: &Value, object: &Value) -> Vec<SpecChange> {
    fn walk(
        schema: &Value,
        pointer: String,
        required: bool,
        object: &Value,
        out: &mut Vec<SpecChange>,
    ) {
        let present = object.pointer(&pointer).is_some();
        let added = if present { "" } else { ", added" };
        let number = |key: &str| schema.get(key).and_then(Value::as_f64).map(|n| n as i64);
        let mut push = |value: Value, allowed: bool, bound: String| {
            out.push(SpecChange {
                pointer: pointer.clone(),
                value,
                allowed,
                bound,
            })
        };
        // The apiserver checks `minimum`/`maximum` of an int-or-string on its integers only.
        let int_or_string = schema
            .get("x-kubernetes-int-or-string")
            .and_then(Value::as_bool)
            == Some(true);
        let kind = match schema.get("type").and_then(Value::as_str) {
            None if int_or_string => Some("integer"),
            kind => kind,
        };
        match kind {
            Some("object") => {
                if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                    let required: Vec<&str> = schema
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|r| r.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    // By name: a `Map`'s order is its keys' with serde_json's default features
                    // and the schema's with `preserve_order`, which a workspace build turns on.
                    let mut properties: Vec<_> = properties.iter().collect();
                    properties.sort_by_key(|(name, _)| *name);
                    for (name, property) in properties {
                        let is_required = required.contains(&name.as_str());
                        walk(
                            property,
                            format!("{pointer}/{name}"),
                            is_required,
                            object,
                            out,
                        );
                    }
                }
            }
            Some("integer") => {
                if let Some(min) = number("minimum") {
                    push(json!(min), true, format!("minimum {min}{added}"));
                    push(json!(min - 1), false, format!("past minimum {min}"));
                }
                if let Some(max) = number("maximum") {
                    push(json!(max), true, format!("maximum {max}{added}"));
                    push(json!(max + 1), false, format!("past maximum {max}"));
                }
            }
            Some("string") => {
                if let Some(min) = number("minLength") {
                    let min = min.max(0) as usize;
                    push(
                        json!("a".repeat(min)),
                        true,
                        format!("minLength {min}{added}"),
                    );
                    if min > 0 {
                        push(
                            json!("a".repeat(min - 1)),
                            false,
                            format!("past minLength {min}"),
                        );
                    }
                }
                if let Some(max) = number("maxLength") {
                    let max = max.max(0) as usize;
                    push(
                        json!("a".repeat(max)),
                        true,
                        format!("maxLength {max}{added}"),
                    );
                    push(
                        json!("a".repeat(max + 1)),
                        false,
                        format!("past maxLength {max}"),
                    );
                }
            }
            Some("boolean") => {
                push(json!(true), true, format!("true{added}"));
                push(json!(false), true, format!("false{added}"));
            }
            _ => {}
        }
        // `spec` itself is not removed: every field under it is.
        if present && pointer != "/spec" {
            out.push(SpecChange {
                pointer,
                value: Value::Null,
                allowed: !required,
                bound: if required {
                    "removed, required"
                } else {
                    "removed"
                }
                .into(),
            });
        }
    }
    let mut out = Vec::new();
    if let Some(spec) = schema.pointer("/properties/spec") {
        walk(spec, "/spec".into(), true, object, &mut out);
    }
    out
}

/// What is wrong with the cluster for the primary object as it is now (the first argument,
/// as the apiserver returns it) given the compared objects (the second, normalized): one line
/// per problem, none once the controller reached the state the spec implies. Asynchronous, so
/// that a workload can ask what the cluster cannot show (a container engine's limits).
pub type Implied = Arc<dyn Fn(Value, Snapshot) -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// Given the primary object as the user set it, what a refusal of it must name (each word in
/// one Event's or condition's message), or `None` when the controller must honour it.
pub type Refuses = Arc<dyn Fn(&Value) -> Option<Vec<String>> + Send + Sync>;

/// A change the controller must refuse that no schema bound gives: objects set up first
/// (a Deployment of nobody's), then a merge patch of the primary object (point it at them).
#[derive(Debug, Clone)]
pub struct Misoperation {
    /// Names it in the output and the replay command.
    pub name: String,
    /// Created in the run's namespace before the patch, deleted after its revert; their
    /// resources must be among the compared ones.
    pub setup: Vec<(ApiResource, Value)>,
    /// The merge patch of the primary object.
    pub patch: Value,
    /// The words the refusal's Event or condition must contain.
    pub names: Vec<String>,
}

/// One object, the schema its changes come from, and what its spec implies.
#[derive(Clone)]
pub struct StateWorkload {
    /// Names the namespace.
    pub name: String,
    /// The `cargo test` arguments that run this workload's campaign (`--test sample_controller
    /// state_campaign_the_sample`), for the replay command; the test reads
    /// `KUBELOOP_STATE_CHANGE`.
    pub test: String,
    /// The resources the oracle compares; the first is the object's.
    pub resources: Vec<ApiResource>,
    /// JSON pointers of fields the oracle leaves out (a server's id).
    pub ignored: Vec<String>,
    /// The object as first created (its namespace is the run's).
    pub object: Value,
    /// The CRD version's `openAPIV3Schema`.
    pub schema: Value,
    /// What the spec implies.
    pub implied: Implied,
    /// Which accepted specs the controller must refuse.
    pub refuses: Refuses,
    /// The misoperations to run after the generated changes.
    pub misoperations: Vec<Misoperation>,
    /// What the oracle cannot see, once the object is gone (an engine's orphaned servers).
    pub audit: Option<Audit>,
}

/// What a state campaign found.
#[derive(Debug, Clone, Default)]
pub struct StateReport {
    /// The changes and misoperations run.
    pub cases: usize,
    /// The changes the apiserver refused, as it must.
    pub refused: usize,
    /// The changes and misoperations the controller had to refuse (judged by must-refuse).
    pub must_refuse: usize,
    /// One line per finding: the change, the oracle, the problem and the replay command.
    pub findings: Vec<String>,
    /// How long the campaign took.
    pub took: Duration,
}

impl StateReport {
    /// Cases run a minute.
    pub fn cases_per_minute(&self) -> f64 {
        self.cases as f64 * 60.0 / self.took.as_secs_f64().max(f64::EPSILON)
    }
}

/// A state-centric campaign: a [`StateWorkload`], a controller and a cluster.
pub struct StateCampaign {
    config: kube_client::Config,
    workload: StateWorkload,
    controller: ControllerFn,
    settings: Settings,
}

/// What the judging of one case left: its label, the key that replays it, what it found.
struct Case<'a> {
    label: String,
    replay: &'a str,
    found: Vec<String>,
}

impl StateCampaign {
    /// `config` reaches the cluster as an admin; the controller's client goes through a
    /// [`Hook`] that counts its writes.
    pub fn new(
        config: kube_client::Config,
        workload: StateWorkload,
        controller: ControllerFn,
        settings: Settings,
    ) -> Self {
        StateCampaign {
            config,
            workload,
            controller,
            settings,
        }
    }

    /// The changes generated from the workload's schema and object.
    pub fn changes(&self) -> Vec<SpecChange> {
        spec_changes(&self.workload.schema, &self.workload.object)
    }

    /// The generated changes and the misoperations a test runs: those whose field pointer or
    /// name is `KUBELOOP_STATE_CHANGE` when it is set (the replay command), else `only`'s,
    /// else all.
    pub fn cases(&self, only: Option<&str>) -> (Vec<SpecChange>, Vec<Misoperation>) {
        let only = std::env::var("KUBELOOP_STATE_CHANGE")
            .ok()
            .or(only.map(str::to_string));
        let kept = |key: &str| only.as_deref().is_none_or(|o| o == key);
        let changes = self
            .changes()
            .into_iter()
            .filter(|c| kept(&c.pointer))
            .collect();
        let misoperations = self
            .workload
            .misoperations
            .iter()
            .filter(|m| kept(&m.name))
            .cloned()
            .collect();
        (changes, misoperations)
    }

    /// The command that runs the case of `key` again: a change's field (every change of
    /// it) or a misoperation's name.
    pub fn replay_command(&self, key: &str) -> String {
        format!(
            "KUBELOOP_STATE_CHANGE='{key}' cargo test --all-features {} -- --nocapture",
            self.workload.test
        )
    }

    /// Creates the object, lets the controller converge, then applies each of `changes` and
    /// reverts it, then runs each of `misoperations`, judging each by the oracles; a line per
    /// case on stdout. The object is deleted before the controller stops.
    pub async fn run(
        &self,
        changes: &[SpecChange],
        misoperations: &[Misoperation],
    ) -> Result<StateReport, CampaignError> {
        let started = Instant::now();
        let admin = Client::try_from(self.config.clone())?;
        let namespace = format!(
            "state-{}-{}-{}",
            self.workload.name,
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": namespace}}))
                    .expect("a namespace"),
            )
            .await?;
        let hook = Hook::new(None);
        let controller = Incarnations::start(
            self.config.clone(),
            hook.clone(),
            namespace.clone(),
            self.controller.clone(),
        );
        let run = Run {
            campaign: self,
            api: Api::namespaced_with(admin.clone(), &namespace, &self.workload.resources[0]),
            name: self.primary_name(),
            admin,
            namespace: namespace.clone(),
            hook,
        };
        let result = run.cases_in(changes, misoperations).await;
        let gone = run.delete_primary().await;
        controller.stop().await;
        let mut report = result?;
        match gone {
            Ok(true) => {}
            Ok(false) => report.findings.push(format!(
                "the object was not gone within {:?} of its deletion",
                self.settings.converge
            )),
            Err(e) => return Err(e),
        }
        if let Some(audit) = &self.workload.audit {
            report.findings.extend(audit(&namespace).await);
        }
        let _ = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
        report.took = started.elapsed();
        println!(
            "{}: {} cases ({} refused by the apiserver, {} to be refused by the controller), \
             {} findings, {:.1} s ({:.1} cases a minute)",
            self.workload.name,
            report.cases,
            report.refused,
            report.must_refuse,
            report.findings.len(),
            report.took.as_secs_f64(),
            report.cases_per_minute()
        );
        Ok(report)
    }

    fn primary_name(&self) -> String {
        self.workload
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }
}

/// One run of a campaign: its namespace, the admin client, the hook the controller writes
/// through and the object's API; the cases are judged here.
struct Run<'c> {
    campaign: &'c StateCampaign,
    admin: Client,
    namespace: String,
    hook: Hook,
    /// The object's resource in the run's namespace.
    api: Api<DynamicObject>,
    /// The object's name.
    name: String,
}

impl Run<'_> {
    /// Deletes the object and waits (within the bound) until it is gone: true once it is.
    async fn delete_primary(&self) -> Result<bool, CampaignError> {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Err(kube_client::Error::Api(status)) if status.code == 404 => return Ok(true),
            result => {
                result?;
            }
        }
        let deadline = Instant::now() + self.campaign.settings.converge;
        while Instant::now() < deadline {
            if self.api.get_opt(&self.name).await?.is_none() {
                return Ok(true);
            }
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
        }
        Ok(false)
    }

    async fn cases_in(
        &self,
        changes: &[SpecChange],
        misoperations: &[Misoperation],
    ) -> Result<StateReport, CampaignError> {
        let object: DynamicObject = serde_json::from_value(self.campaign.workload.object.clone())
            .map_err(kube_client::Error::SerdeError)?;
        self.api.create(&PostParams::default(), &object).await?;
        let mut report = StateReport::default();
        let mut base = match self.reached().await? {
            Ok(snapshot) => snapshot,
            Err(problems) => {
                report.findings.push(format!(
                    "{}: the object as created did not reach its implied state within {:?}: {}",
                    self.campaign.workload.name,
                    self.campaign.settings.converge,
                    problems.join(", ")
                ));
                return Ok(report);
            }
        };
        for change in changes {
            report.cases += 1;
            let case = self.change(change, &base, &mut report).await?;
            self.judge(case, &mut report);
            // The next change is judged from where this one left the objects, so that a
            // finding is the change's own and not one carried over.
            if let Ok(settled) = self.reached().await? {
                base = settled;
            }
        }
        for misoperation in misoperations {
            report.cases += 1;
            report.must_refuse += 1;
            let case = self.misoperation(misoperation).await?;
            self.judge(case, &mut report);
        }
        Ok(report)
    }

    /// Applies `change`, judges it, reverts it.
    async fn change<'a>(
        &self,
        change: &'a SpecChange,
        base: &Snapshot,
        report: &mut StateReport,
    ) -> Result<Case<'a>, CampaignError> {
        let mut case = Case {
            label: change.to_string(),
            replay: &change.pointer,
            found: Vec::new(),
        };
        let patch = merge_patch(&change.pointer, change.value.clone());
        let patched = match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube_client::Error::Api(status)) if !change.allowed && status.code == 422 => {
                report.refused += 1;
                let lost = diff(base, &self.snapshot().await?);
                if !lost.is_empty() {
                    case.found.push(format!(
                        "refused, yet the state changed: {}",
                        lost.join(", ")
                    ));
                }
                case.label
                    .push_str(": refused by the apiserver, as the schema says");
                return Ok(case);
            }
            Err(e) => {
                case.found.push(format!(
                    "the apiserver refused a value the schema allows: {e}"
                ));
                return Ok(case);
            }
            Ok(patched) => serde_json::to_value(patched).unwrap_or(Value::Null),
        };
        if !change.allowed {
            case.found
                .push("the apiserver accepted a value beyond the schema's bound".into());
        }
        if let Some(names) = (self.campaign.workload.refuses)(&patched) {
            report.must_refuse += 1;
            case.found
                .extend(self.refused(&names, base, &patched).await?);
        } else {
            case.found.extend(self.honoured().await?);
        }
        // Returns after the revert.
        let before = self
            .campaign
            .workload
            .object
            .pointer(&change.pointer)
            .cloned();
        let revert = merge_patch(&change.pointer, before.unwrap_or(Value::Null));
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&revert))
            .await?;
        case.found.extend(self.returned(base).await?);
        Ok(case)
    }

    /// Reaches the implied state, then idempotence: a fresh controller reconciles the
    /// converged object and must write nothing of the compared resources.
    async fn honoured(&self) -> Result<Vec<String>, CampaignError> {
        if let Err(problems) = self.reached().await? {
            return Ok(vec![format!(
                "[reaches the implied state] not within {:?}: {}",
                self.campaign.settings.converge,
                problems.join(", ")
            )]);
        }
        let before = self.hook.log().writes.len();
        self.hook.crash_now();
        tokio::time::sleep(self.campaign.settings.quiet * 2).await;
        let compared: Vec<String> = self
            .campaign
            .workload
            .resources
            .iter()
            .map(resource_name)
            .collect();
        let mut writes: BTreeMap<String, usize> = BTreeMap::new();
        for w in &self.hook.log().writes[before..] {
            let base = w.resource.split('/').next().unwrap_or(&w.resource);
            if compared.iter().any(|c| c == base) {
                *writes
                    .entry(format!("{} {}/{}", w.verb, w.resource, w.name))
                    .or_default() += 1;
            }
        }
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let each: Vec<String> = writes.iter().map(|(w, n)| format!("{n} x {w}")).collect();
        Ok(vec![format!(
            "[idempotence] {} write(s) once converged, by one more reconcile and what \
             followed: {}",
            writes.values().sum::<usize>(),
            each.join(", ")
        )])
    }

    /// Sets up `misoperation`'s objects, applies its patch, judges it by must-refuse,
    /// reverts it and removes what it set up.
    async fn misoperation<'a>(
        &self,
        misoperation: &'a Misoperation,
    ) -> Result<Case<'a>, CampaignError> {
        let mut case = Case {
            label: format!("misoperation {}", misoperation.name),
            replay: &misoperation.name,
            found: Vec::new(),
        };
        let setup_api = |resource: &ApiResource| {
            Api::<DynamicObject>::namespaced_with(self.admin.clone(), &self.namespace, resource)
        };
        for (resource, object) in &misoperation.setup {
            let object: DynamicObject =
                serde_json::from_value(object.clone()).map_err(kube_client::Error::SerdeError)?;
            setup_api(resource)
                .create(&PostParams::default(), &object)
                .await?;
        }
        let base = match self.reached().await? {
            Ok(base) => base,
            Err(problems) => {
                case.found.push(format!(
                    "did not settle after its objects were set up: {}",
                    problems.join(", ")
                ));
                return Ok(case);
            }
        };
        let patched = self
            .api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(&misoperation.patch),
            )
            .await?;
        let patched = serde_json::to_value(patched).unwrap_or(Value::Null);
        case.found
            .extend(self.refused(&misoperation.names, &base, &patched).await?);
        let revert = revert_of(&misoperation.patch, &self.campaign.workload.object);
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&revert))
            .await?;
        case.found.extend(self.returned(&base).await?);
        for (resource, object) in &misoperation.setup {
            let setup_name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            setup_api(resource)
                .delete(setup_name, &DeleteParams::default())
                .await?;
        }
        Ok(case)
    }

    /// The must-refuse oracle for the object as `patched`: within the bound an Event about it
    /// or a condition on it names every one of `names`; then, once quiet, every other compared
    /// object is as in `base` and the object's spec is still `patched`'s.
    async fn refused(
        &self,
        names: &[String],
        base: &Snapshot,
        patched: &Value,
    ) -> Result<Vec<String>, CampaignError> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.admin.clone(), &self.namespace);
        let kind = patched.get("kind").and_then(Value::as_str).unwrap_or("");
        let names_all = |message: &str| names.iter().all(|n| message.contains(n.as_str()));
        let deadline = Instant::now() + self.campaign.settings.converge;
        let mut found = Vec::new();
        loop {
            let object =
                serde_json::to_value(self.api.get(&self.name).await?).unwrap_or(Value::Null);
            let on_a_condition = object
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|conditions| {
                    conditions.iter().any(|c| {
                        c.get("message")
                            .and_then(Value::as_str)
                            .is_some_and(names_all)
                    })
                });
            let in_an_event = || async {
                Ok::<_, kube_client::Error>(
                    events
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .any(|e| {
                            e.involved_object.name.as_deref() == Some(self.name.as_str())
                                && e.involved_object.kind.as_deref() == Some(kind)
                                && e.message.as_deref().is_some_and(names_all)
                        }),
                )
            };
            if on_a_condition || in_an_event().await? {
                break;
            }
            if Instant::now() > deadline {
                found.push(format!(
                    "[must refuse] no Event about the {kind} nor condition on it names {} \
                     within {:?}",
                    names.join(" and "),
                    self.campaign.settings.converge
                ));
                break;
            }
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
        }
        // Nothing lost: what the refusal left, once it stayed so for the quiet period.
        tokio::time::sleep(self.campaign.settings.quiet).await;
        let primary = format!(
            "{}/{}",
            resource_name(&self.campaign.workload.resources[0]),
            self.name
        );
        let others = |s: &Snapshot| {
            Snapshot(
                s.0.iter()
                    .filter(|(key, _)| **key != primary)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        };
        let changed = diff(&others(base), &others(&self.snapshot().await?));
        if !changed.is_empty() {
            found.push(format!(
                "[must refuse] lost or changed: {}",
                changed.join(", ")
            ));
        }
        match self.api.get_opt(&self.name).await? {
            None => found.push(format!("[must refuse] the {kind} itself is gone")),
            Some(now) => {
                let spec = serde_json::to_value(&now)
                    .ok()
                    .and_then(|v| v.get("spec").cloned());
                if spec.as_ref() != patched.get("spec") {
                    found.push(format!(
                        "[must refuse] the {kind}'s spec was rewritten: {} instead of {}",
                        spec.unwrap_or(Value::Null),
                        patched.get("spec").unwrap_or(&Value::Null)
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Returns after the revert: the compared objects come back to `base` within the bound.
    async fn returned(&self, base: &Snapshot) -> Result<Vec<String>, CampaignError> {
        let difference = self.back_to(base).await?;
        Ok(if difference.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "[returns after revert] not within {:?}: {}",
                self.campaign.settings.converge,
                difference.join(", ")
            )]
        })
    }

    fn judge(&self, case: Case<'_>, report: &mut StateReport) {
        if case.found.is_empty() {
            println!("{}: passed", case.label);
            return;
        }
        let line = format!(
            "{}: FOUND {}\n  replay: {}",
            case.label,
            case.found.join("; "),
            self.campaign.replay_command(case.replay)
        );
        println!("{line}");
        report.findings.push(line);
    }

    async fn snapshot(&self) -> Result<Snapshot, CampaignError> {
        Ok(snapshot(
            &self.admin,
            &self.namespace,
            &self.campaign.workload.resources,
            &self.campaign.workload.ignored,
        )
        .await?)
    }
    /// Waits until the implied state holds and the compared objects stay unchanged for the
    /// quiet period: the settled snapshot, or the last problems when the bound passed.
    async fn reached(&self) -> Result<Result<Snapshot, Vec<String>>, CampaignError> {
        let deadline = Instant::now() + self.campaign.settings.converge;
        let mut last: Option<(Snapshot, Instant)> = None;
        loop {
            let object =
                serde_json::to_value(self.api.get(&self.name).await?).unwrap_or(Value::Null);
            let now = self.snapshot().await?;
            let problems = (self.campaign.workload.implied)(object, now.clone()).await;
            if !problems.is_empty() {
                last = None;
            } else {
                match &last {
                    Some((seen, since)) if *seen == now => {
                        if since.elapsed() >= self.campaign.settings.quiet {
                            return Ok(Ok(now));
                        }
                    }
                    _ => last = Some((now, Instant::now())),
                }
            }
            if Instant::now() > deadline {
                return Ok(Err(if problems.is_empty() {
                    vec!["the objects kept changing".into()]
                } else {
                    problems
                }));
            }
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
        }
    }

    /// Waits until the compared objects equal `base` for the quiet period: empty, or the
    /// last difference when the bound passed.
    async fn back_to(&self, base: &Snapshot) -> Result<Vec<String>, CampaignError> {
        let deadline = Instant::now() + self.campaign.settings.converge;
        let mut equal_since: Option<Instant> = None;
        loop {
            let difference = diff(base, &self.snapshot().await?);
            if !difference.is_empty() {
                equal_since = None;
            } else if equal_since.get_or_insert_with(Instant::now).elapsed()
                >= self.campaign.settings.quiet
            {
                return Ok(Vec::new());
            }
            if Instant::now() > deadline {
                return Ok(difference);
            }
            tokio::time::sleep(kubeloop::testing::POLL_INTERVAL).await;
        }
    }
}

/// The JSON merge patch that sets `pointer` (`/spec/replicas`) to `value` (`null` removes it).
fn merge_patch(pointer: &str, value: Value) -> Value {
    let fields: Vec<&str> = pointer.split('/').skip(1).collect();
    fields
        .into_iter()
        .rev()
        .fold(value, |inner, field| json!({ field: inner }))
}

/// The merge patch that undoes `patch` on `object` as first created: each field `patch`
/// sets back to `object`'s value, or removed where `object` has none.
fn revert_of(patch: &Value, object: &Value) -> Value {
    match (patch, object) {
        (Value::Object(fields), Value::Object(_)) => Value::Object(
            fields
                .iter()
                .map(|(name, value)| {
                    let before = object.get(name).unwrap_or(&Value::Null);
                    (name.clone(), revert_of(value, before))
                })
                .collect(),
        ),
        (_, before) => before.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_generated_at_and_past_each_bound_of_the_spec() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 3},
                "replicas": {"type": "integer", "minimum": 1.0, "maximum": 10.0},
                "cpu": {"x-kubernetes-int-or-string": true, "minimum": 1.0},
                "paused": {"type": "boolean"},
                "free": {"type": "string"}
            }},
            "status": {"type": "object", "properties": {
                "count": {"type": "integer", "minimum": 0.0}
            }}
        }});
        let object = json!({"spec": {"name": "ab", "replicas": 2, "free": "x"}});
        let changes: Vec<String> = spec_changes(&schema, &object)
            .iter()
            .map(|c| format!("{c} {}", if c.allowed { "allowed" } else { "refused" }))
            .collect();
        assert_eq!(
            changes,
            [
                "/spec/cpu=1 (minimum 1, added) allowed",
                "/spec/cpu=0 (past minimum 1) refused",
                "/spec/free=null (removed) allowed",
                r#"/spec/name="a" (minLength 1) allowed"#,
                r#"/spec/name="" (past minLength 1) refused"#,
                r#"/spec/name="aaa" (maxLength 3) allowed"#,
                r#"/spec/name="aaaa" (past maxLength 3) refused"#,
                "/spec/name=null (removed, required) refused",
                "/spec/paused=true (true, added) allowed",
                "/spec/paused=false (false, added) allowed",
                "/spec/replicas=1 (minimum 1) allowed",
                "/spec/replicas=0 (past minimum 1) refused",
                "/spec/replicas=10 (maximum 10) allowed",
                "/spec/replicas=11 (past maximum 10) refused",
                "/spec/replicas=null (removed) allowed",
            ]
        );
    }

    #[test]
    fn a_misoperation_is_reverted_to_the_object_as_created() {
        let object = json!({"spec": {"deploymentName": "mine", "replicas": 2}});
        assert_eq!(
            revert_of(
                &json!({"spec": {"deploymentName": "theirs", "paused": true, "extra": {"a": 1}}}),
                &object
            ),
            json!({"spec": {"deploymentName": "mine", "paused": null, "extra": null}})
        );
    }

    #[test]
    fn a_merge_patch_sets_the_field_at_the_pointer() {
        assert_eq!(
            merge_patch("/spec/replicas", json!(3)),
            json!({"spec": {"replicas": 3}})
        );
        assert_eq!(
            merge_patch("/spec/name", Value::Null),
            json!({"spec": {"name": null}})
        );
    }
}
