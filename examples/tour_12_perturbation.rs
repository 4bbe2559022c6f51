//! Tour, chapter 12 (docs/12-perturbation.md): a controller tested the way it fails. A toy
//! controller keeps a Secret beside each ConfigMap labelled `tour-12=source`, holding the same
//! data. Its first version creates the Secret under a generated name whenever its cache shows
//! none; its second under a fixed name. A campaign (`kubeloop_testenv::perturb`) runs a short workload
//! on each: the reference run, the plans generated from it, and the plan that holds the
//! Secrets' informer back at the Secret's creation while the ConfigMap changes. The first
//! version makes a second Secret; the second is refused the duplicate and converges.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::api::{Api, ApiResource, ObjectMeta, Patch, PatchParams, PostParams};
use kube_client::{Client, Config, ResourceExt};
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::runtime::{
    Action as Next, Controller, ObjectKey, ReconcileContext, default_error_policy,
};
use kubeloop_testenv::perturb::{Action, Campaign, ControllerFn, Perturbation, Settings, Workload};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let config = Config::infer().await?;
    // The two versions' campaigns run side by side (each in namespaces of its own); their
    // reports print one after the other.
    let (first, second) = tokio::join!(
        campaign(config.clone(), "first version (a generated name)", true),
        campaign(config, "second version (a fixed name)", false),
    );
    print!("{}{}", first?, second?);
    Ok(())
}

/// One version's campaign: its reference run, its plans, and the plan that holds the
/// Secrets' informer back at the Secret's creation; what a learner reads, as text.
async fn campaign(config: Config, version: &str, generated: bool) -> Result<String, Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    writeln!(out, "== the controller's {version} ==")?;
    let campaign = Campaign::new(
        config,
        workload(),
        controller(generated),
        // A finding waits out the bound before it is reported: 20 s here (45 s by default).
        Settings {
            converge: std::time::Duration::from_secs(20),
            ..Settings::default()
        },
    );
    let reference = campaign.reference().await?;
    writeln!(
        out,
        "reference run: {} writes, {} watch events, {} reconciles, {} checkpoints",
        reference.log.writes.len(),
        reference.log.deliveries.len(),
        reference.reconciles.len(),
        reference.checkpoints.len()
    )?;
    for write in &reference.log.writes {
        writeln!(
            out,
            "  write  {} {}/{} -> rv {}",
            write.verb, write.resource, write.name, write.resource_version
        )?;
    }
    writeln!(out, "plans generated: {}", reference.plans.len())?;
    for plan in &reference.plans {
        writeln!(out, "  {plan}")?;
    }
    let plan = reference
        .plans
        .iter()
        .find(|p| matches!(p, Perturbation::StaleView { resource, event_type, .. } if resource == "secrets" && event_type == "ADDED"))
        .ok_or("no plan holds the Secrets back at the Secret's creation")?;
    writeln!(out, "running {plan}")?;
    let outcome = campaign.run_plan(&reference, plan).await?;
    for fired in &outcome.fired {
        writeln!(
            out,
            "  fired at {} (rv {})",
            fired.object, fired.resource_version
        )?;
    }
    writeln!(
        out,
        "  reconciles that started on the held view: {}",
        outcome.hit.len()
    )?;
    if outcome.findings.is_empty() {
        writeln!(out, "  verdict: passed")?;
    }
    for finding in &outcome.findings {
        writeln!(out, "  verdict: FOUND {finding}")?;
    }
    Ok(out)
}

/// Create the source, change its data twice.
fn workload() -> Workload {
    let configmaps = ApiResource::erase::<ConfigMap>(&());
    let source = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "source", "labels": {"tour-12": "source"}},
        "data": {"greeting": "hello"}
    });
    Workload {
        name: "tour-12".into(),
        resources: vec![configmaps.clone(), ApiResource::erase::<Secret>(&())],
        steps: vec![
            Action::Create(configmaps.clone(), source),
            Action::Patch(
                configmaps.clone(),
                "source".into(),
                json!({"data": {"greeting": "hi"}}),
            ),
            Action::Patch(
                configmaps,
                "source".into(),
                json!({"data": {"greeting": "hey"}}),
            ),
        ],
        ignored: Vec::new(),
        audit: None,
    }
}

/// The toy controller: `generated` picks the first version.
fn controller(generated: bool) -> ControllerFn {
    Arc::new(move |client: Client, namespace: String, shutdown| {
        Box::pin(async move {
            let factory = SharedInformerFactory::new(
                client.clone(),
                FactoryOptions {
                    namespace: Some(namespace),
                    label_selector: None,
                    ..Default::default()
                },
            );
            let (sources, copies) = (
                factory.informer::<ConfigMap>(),
                factory.informer::<Secret>(),
            );
            let (source_cache, copy_cache) = (sources.lister(), copies.lister());
            let reconcile = move |key: ObjectKey, ctx: ReconcileContext| {
                let (client, source_cache, copy_cache) =
                    (client.clone(), source_cache.clone(), copy_cache.clone());
                async move {
                    let ns = key.namespace().unwrap_or_default().to_string();
                    let Some(source) = source_cache.get(&ns, key.name()) else {
                        return Ok(Next::Done);
                    };
                    if source.labels().get("tour-12").map(String::as_str) != Some("source") {
                        return Ok(Next::Done);
                    }
                    let data = source.data.clone().unwrap_or_default();
                    let secrets: Api<Secret> = Api::namespaced(client, &ns);
                    // The copy this source controls, as the cache sees it.
                    let copy = copy_cache
                        .namespaced(&ns)
                        .list(&Default::default())
                        .into_iter()
                        .find(|s| {
                            s.owner_references()
                                .iter()
                                .any(|o| Some(&o.uid) == source.metadata.uid.as_ref())
                        });
                    match copy {
                        None => {
                            let owner = OwnerReference {
                                api_version: "v1".into(),
                                kind: "ConfigMap".into(),
                                name: source.name_any(),
                                uid: source.uid().unwrap_or_default(),
                                controller: Some(true),
                                ..Default::default()
                            };
                            let (name, generate_name) = if generated {
                                (None, Some(format!("{}-copy-", key.name())))
                            } else {
                                (Some(format!("{}-copy", key.name())), None)
                            };
                            let secret = Secret {
                                metadata: ObjectMeta {
                                    name,
                                    generate_name,
                                    owner_references: Some(vec![owner]),
                                    ..Default::default()
                                },
                                string_data: Some(data),
                                ..Default::default()
                            };
                            ctx.check()?;
                            let created = secrets.create(&PostParams::default(), &secret).await?;
                            ctx.wrote(&created);
                        }
                        Some(copy) => {
                            let patch = json!({"stringData": data});
                            ctx.check()?;
                            let patched = secrets
                                .patch(
                                    &copy.name_any(),
                                    &PatchParams::default(),
                                    &Patch::Merge(&patch),
                                )
                                .await?;
                            ctx.wrote(&patched);
                        }
                    }
                    Ok::<_, Error>(Next::Done)
                }
            };
            let _ = Controller::new("tour-12", sources)
                .owns(copies)
                .run(reconcile, default_error_policy, shutdown)
                .await;
        })
    })
}
