//! State-centric campaigns, after Acto (Gu et al., SOSP 2023): instead of perturbing the
//! controller's view, change what the user asks for. Spec changes are generated from the
//! CRD's OpenAPI schema ([`spec_changes`]: each bounded field at and beyond each bound), and
//! each is applied to one object on the real apiserver, then reverted, with three oracles:
//!
//! - **reaches the implied state**: once the change is accepted, the workload's
//!   [`Implied`] check finds nothing wrong within the bound;
//! - **idempotence**: once converged, one more reconcile (a fresh controller, which
//!   reconciles every object it lists) writes nothing of the compared resources (counted
//!   through the [`Hook`]);
//! - **returns after revert**: once the change is undone, the compared objects come back
//!   to what they were before it (the oracle's [`diff`]). Each change is judged from the
//!   state the one before it left, so a finding belongs to its own change.
//!
//! A value beyond a bound is expected to be refused by the apiserver (and to change
//! nothing); one it accepts is a finding too. Every finding prints the command that replays
//! its change.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kube_client::Client;
use kube_client::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::campaign::{CampaignError, ControllerFn, Incarnations, RUNS, Settings};
use super::hook::Hook;
use super::oracle::{Snapshot, diff, resource_name, snapshot};

/// One generated change of a spec field.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecChange {
    /// JSON pointer into the object (`/spec/replicas`).
    pub pointer: String,
    /// The value set there.
    pub value: Value,
    /// Whether the schema allows it (at a bound) or not (beyond one).
    pub allowed: bool,
    /// Which bound: `minimum 1`, `past maxLength 253`.
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

/// The changes `schema` (a CRD version's `openAPIV3Schema`) allows and refuses under
/// `spec`: for an integer with `minimum`/`maximum`, each bound (allowed) and one past it
/// (refused); for a string with `minLength`/`maxLength`, strings of `a`s of each length
/// (allowed: `a`s fit the DNS-name patterns CRDs use) and one past it; for a boolean, both
/// values. Fields without bounds give no change.
pub fn spec_changes(schema: &Value) -> Vec<SpecChange> {
    fn walk(schema: &Value, pointer: String, out: &mut Vec<SpecChange>) {
        let number = |key: &str| schema.get(key).and_then(Value::as_f64).map(|n| n as i64);
        let mut push = |value: Value, allowed: bool, bound: String| {
            out.push(SpecChange {
                pointer: pointer.clone(),
                value,
                allowed,
                bound,
            })
        };
        match schema.get("type").and_then(Value::as_str) {
            Some("object") => {
                if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                    // By name: a `Map`'s order is its keys' with serde_json's default features
                    // and the schema's with `preserve_order`, which a workspace build turns on.
                    let mut properties: Vec<_> = properties.iter().collect();
                    properties.sort_by_key(|(name, _)| *name);
                    for (name, property) in properties {
                        walk(property, format!("{pointer}/{name}"), out);
                    }
                }
            }
            Some("integer") => {
                if let Some(min) = number("minimum") {
                    push(json!(min), true, format!("minimum {min}"));
                    push(json!(min - 1), false, format!("past minimum {min}"));
                }
                if let Some(max) = number("maximum") {
                    push(json!(max), true, format!("maximum {max}"));
                    push(json!(max + 1), false, format!("past maximum {max}"));
                }
            }
            Some("string") => {
                if let Some(min) = number("minLength") {
                    let min = min.max(0) as usize;
                    push(json!("a".repeat(min)), true, format!("minLength {min}"));
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
                    push(json!("a".repeat(max)), true, format!("maxLength {max}"));
                    push(
                        json!("a".repeat(max + 1)),
                        false,
                        format!("past maxLength {max}"),
                    );
                }
            }
            Some("boolean") => {
                push(json!(true), true, "true".into());
                push(json!(false), true, "false".into());
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(spec) = schema.pointer("/properties/spec") {
        walk(spec, "/spec".into(), &mut out);
    }
    out
}

/// What is wrong with the cluster for the primary object as it is now (`object`, as the
/// apiserver returns it) given the compared objects (`snapshot`, normalized): one line per
/// problem, none once the controller reached the state the spec implies.
pub type Implied = Arc<dyn Fn(&Value, &Snapshot) -> Vec<String> + Send + Sync>;

/// One object, the schema its changes come from, and what its spec implies.
#[derive(Clone)]
pub struct StateWorkload {
    /// Names the namespace and the replay command.
    pub name: String,
    /// The resources the oracle compares; the first is the object's.
    pub resources: Vec<kube_client::api::ApiResource>,
    /// The object as first created (its namespace is the run's).
    pub object: Value,
    /// The CRD version's `openAPIV3Schema`.
    pub schema: Value,
    /// What the spec implies.
    pub implied: Implied,
}

/// What a state campaign found.
#[derive(Debug, Clone, Default)]
pub struct StateReport {
    /// The changes run.
    pub cases: usize,
    /// The changes beyond a bound that the apiserver refused, as it must.
    pub refused: usize,
    /// One line per finding: the change, the oracle, the problem and the replay command.
    pub findings: Vec<String>,
    /// How long the campaign took.
    pub took: Duration,
}

/// A state-centric campaign: a [`StateWorkload`], a controller and a cluster.
pub struct StateCampaign {
    config: kube_client::Config,
    workload: StateWorkload,
    controller: ControllerFn,
    settings: Settings,
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

    /// The changes generated from the workload's schema.
    pub fn changes(&self) -> Vec<SpecChange> {
        spec_changes(&self.workload.schema)
    }

    /// The command that runs the changes of `change`'s field again (the workload's test,
    /// `state_campaign_<workload>`, reads `KUBELOOP_STATE_CHANGE`).
    pub fn replay_command(&self, change: &SpecChange) -> String {
        format!(
            "KUBELOOP_STATE_CHANGE='{}' cargo test --all-features --test {}_controller state_campaign -- --nocapture",
            change.pointer, self.workload.name
        )
    }

    /// Creates the object, lets the controller converge, then applies each of `changes` and
    /// reverts it, judging each by the three oracles; a line per change on stdout.
    pub async fn run(&self, changes: &[SpecChange]) -> Result<StateReport, CampaignError> {
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
        let result = self.changes_in(&admin, &namespace, &hook, changes).await;
        controller.stop().await;
        let _ = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
        let mut report = result?;
        report.took = started.elapsed();
        println!(
            "{}: {} changes ({} refused by the apiserver), {} findings, {:.1} s",
            self.workload.name,
            report.cases,
            report.refused,
            report.findings.len(),
            report.took.as_secs_f64()
        );
        Ok(report)
    }

    async fn changes_in(
        &self,
        admin: &Client,
        namespace: &str,
        hook: &Hook,
        changes: &[SpecChange],
    ) -> Result<StateReport, CampaignError> {
        let primary = &self.workload.resources[0];
        let api = Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, primary);
        let object: DynamicObject = serde_json::from_value(self.workload.object.clone())
            .map_err(kube_client::Error::SerdeError)?;
        let name = object.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &object).await?;
        let mut report = StateReport::default();
        let mut base = match self.reached(admin, namespace, &api, &name).await? {
            Ok(snapshot) => snapshot,
            Err(problems) => {
                report.findings.push(format!(
                    "{}: the object as created did not reach its implied state within {:?}: {}",
                    self.workload.name,
                    self.settings.converge,
                    problems.join(", ")
                ));
                return Ok(report);
            }
        };
        for change in changes {
            report.cases += 1;
            let mut found = Vec::new();
            let patch = merge_patch(&change.pointer, change.value.clone());
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(kube_client::Error::Api(status)) if !change.allowed && status.code == 422 => {
                    report.refused += 1;
                    let now = self.snapshot(admin, namespace).await?;
                    let lost = diff(&base, &now);
                    if !lost.is_empty() {
                        found.push(format!(
                            "refused, yet the state changed: {}",
                            lost.join(", ")
                        ));
                    }
                    println!("{change}: refused by the apiserver, as the schema says");
                    self.judge(change, found, &mut report);
                    continue;
                }
                Err(e) => {
                    found.push(format!(
                        "the apiserver refused a value the schema allows: {e}"
                    ));
                    self.judge(change, found, &mut report);
                    continue;
                }
                Ok(_) if !change.allowed => {
                    found.push("the apiserver accepted a value beyond the schema's bound".into());
                }
                Ok(_) => {}
            }
            // Reaches the state the spec implies.
            if let Err(problems) = self.reached(admin, namespace, &api, &name).await? {
                found.push(format!(
                    "[reaches the implied state] not within {:?}: {}",
                    self.settings.converge,
                    problems.join(", ")
                ));
            } else {
                // Idempotence: a fresh controller reconciles the converged object; it must
                // write nothing of the compared resources.
                let before = hook.log().writes.len();
                hook.crash_now();
                tokio::time::sleep(self.settings.quiet * 2).await;
                let compared: Vec<String> =
                    self.workload.resources.iter().map(resource_name).collect();
                let mut writes: BTreeMap<String, usize> = BTreeMap::new();
                for w in &hook.log().writes[before..] {
                    let base = w.resource.split('/').next().unwrap_or(&w.resource);
                    if compared.iter().any(|c| c == base) {
                        *writes
                            .entry(format!("{} {}/{}", w.verb, w.resource, w.name))
                            .or_default() += 1;
                    }
                }
                if !writes.is_empty() {
                    let each: Vec<String> =
                        writes.iter().map(|(w, n)| format!("{n} x {w}")).collect();
                    found.push(format!(
                        "[idempotence] {} write(s) once converged, by one more reconcile and \
                         what followed: {}",
                        writes.values().sum::<usize>(),
                        each.join(", ")
                    ));
                }
            }
            // Returns after the revert.
            let before = self.workload.object.pointer(&change.pointer).cloned();
            let revert = merge_patch(&change.pointer, before.unwrap_or(Value::Null));
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&revert))
                .await?;
            let difference = self.back_to(admin, namespace, &base).await?;
            if !difference.is_empty() {
                found.push(format!(
                    "[returns after revert] not within {:?}: {}",
                    self.settings.converge,
                    difference.join(", ")
                ));
            }
            self.judge(change, found, &mut report);
            // The next change is judged from where this one left the objects, so that a
            // finding is the change's own and not one carried over.
            if let Ok(settled) = self.reached(admin, namespace, &api, &name).await? {
                base = settled;
            }
        }
        Ok(report)
    }

    fn judge(&self, change: &SpecChange, found: Vec<String>, report: &mut StateReport) {
        if found.is_empty() {
            println!("{change}: passed");
            return;
        }
        let line = format!(
            "{change}: FOUND {}\n  replay: {}",
            found.join("; "),
            self.replay_command(change)
        );
        println!("{line}");
        report.findings.push(line);
    }

    async fn snapshot(&self, admin: &Client, namespace: &str) -> Result<Snapshot, CampaignError> {
        Ok(snapshot(admin, namespace, &self.workload.resources, &[]).await?)
    }

    /// Waits until the implied state holds and the compared objects stay unchanged for the
    /// quiet period: the settled snapshot, or the last problems when the bound passed.
    async fn reached(
        &self,
        admin: &Client,
        namespace: &str,
        api: &Api<DynamicObject>,
        name: &str,
    ) -> Result<Result<Snapshot, Vec<String>>, CampaignError> {
        let deadline = Instant::now() + self.settings.converge;
        let mut last: Option<(Snapshot, Instant)> = None;
        loop {
            let object = serde_json::to_value(api.get(name).await?).unwrap_or(Value::Null);
            let now = self.snapshot(admin, namespace).await?;
            let problems = (self.workload.implied)(&object, &now);
            if !problems.is_empty() {
                last = None;
            } else {
                match &last {
                    Some((seen, since)) if *seen == now => {
                        if since.elapsed() >= self.settings.quiet {
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
    async fn back_to(
        &self,
        admin: &Client,
        namespace: &str,
        base: &Snapshot,
    ) -> Result<Vec<String>, CampaignError> {
        let deadline = Instant::now() + self.settings.converge;
        let mut equal_since: Option<Instant> = None;
        loop {
            let difference = diff(base, &self.snapshot(admin, namespace).await?);
            if !difference.is_empty() {
                equal_since = None;
            } else if equal_since.get_or_insert_with(Instant::now).elapsed() >= self.settings.quiet
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_generated_at_and_past_each_bound_of_the_spec() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 3},
                "replicas": {"type": "integer", "minimum": 1.0, "maximum": 10.0},
                "paused": {"type": "boolean"},
                "free": {"type": "string"}
            }},
            "status": {"type": "object", "properties": {
                "count": {"type": "integer", "minimum": 0.0}
            }}
        }});
        let changes: Vec<String> = spec_changes(&schema)
            .iter()
            .map(|c| format!("{c} {}", if c.allowed { "allowed" } else { "refused" }))
            .collect();
        assert_eq!(
            changes,
            [
                r#"/spec/name="a" (minLength 1) allowed"#,
                r#"/spec/name="" (past minLength 1) refused"#,
                r#"/spec/name="aaa" (maxLength 3) allowed"#,
                r#"/spec/name="aaaa" (past maxLength 3) refused"#,
                "/spec/paused=true (true) allowed",
                "/spec/paused=false (false) allowed",
                "/spec/replicas=1 (minimum 1) allowed",
                "/spec/replicas=0 (past minimum 1) refused",
                "/spec/replicas=10 (maximum 10) allowed",
                "/spec/replicas=11 (past maximum 10) refused",
            ]
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
