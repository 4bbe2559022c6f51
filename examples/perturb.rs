//! A perturbation campaign (kubeloop_testenv::perturb) on a local control plane started here:
//! `hack/perturb` runs it. The workload's reference run, the plans it generates, each plan
//! run and judged, and a line per plan; `--plan` replays one plan (as a finding prints it).
//!
//!   cargo run --example perturb -- --workload sample              every generated plan
//!   cargo run --example perturb -- --workload vm-fake             the VM controller's
//!   cargo run --example perturb -- --workload vm-podman           ... on podman
//!   cargo run --example perturb -- --workload sample --kind crash only the crash plans
//!   cargo run --example perturb -- --workload sample --plan 'crash:deployments.apps:create:1'
//!
//! Exits 1 when a plan found something or never fired (it checked nothing), 2 when the
//! harness itself failed.

use std::time::Instant;

use clap::{Parser, ValueEnum};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubeloop_testenv::perturb::{Campaign, Perturbation, Settings, VmEngine};
use kubeloop_testenv::{Cluster, ClusterOptions};

#[derive(Parser)]
struct Args {
    /// The workload (and the controller it drives).
    #[arg(long, value_enum)]
    workload: Workload,
    /// Run only these plans (as a finding prints them); none: every generated plan.
    #[arg(long)]
    plan: Vec<Perturbation>,
    /// Run only the generated plans of this kind.
    #[arg(long, value_enum)]
    kind: Option<Kind>,
    /// Plans run at once, each in its own namespace with its own controller.
    #[arg(long, default_value_t = 3)]
    parallel: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    /// The sample controller: create, scale, change deploymentName, delete with orphans.
    Sample,
    /// The VM controller on its fake engine: create, resize, delete while creating, restart,
    /// delete.
    VmFake,
    /// The same on podman through the Docker API (`$DOCKER_HOST`).
    VmPodman,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Kind {
    Crash,
    Stale,
    Coalesce,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kubeloop_testenv::perturb=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match campaign(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("perturb: {e}");
            std::process::exit(2);
        }
    }
}

async fn campaign(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let started = Instant::now();
    eprintln!(
        "starting a local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"
    );
    let cluster = Cluster::start(ClusterOptions::full()).await?;
    let client = cluster.client().await?;
    let (workload, controller) = match args.workload {
        Workload::Sample => {
            let crd: CustomResourceDefinition =
                serde_saphyr::from_str(include_str!("../crds/foo.yaml"))?;
            kubeloop_testenv::ensure_crd(&client, &crd).await;
            kubeloop_testenv::perturb::sample()
        }
        Workload::VmFake | Workload::VmPodman => {
            let crd: CustomResourceDefinition =
                serde_saphyr::from_str(include_str!("../crds/virtualmachine.yaml"))?;
            kubeloop_testenv::ensure_crd(&client, &crd).await;
            kubeloop_testenv::perturb::vm(if matches!(args.workload, Workload::VmFake) {
                VmEngine::Fake
            } else {
                VmEngine::Podman
            })
        }
    };
    let campaign = Campaign::new(
        cluster.client_config(),
        workload,
        controller,
        Settings::default(),
    );
    let (kind, chosen) = (args.kind, args.plan);
    let checked = campaign
        .check(
            move |reference| {
                if !chosen.is_empty() {
                    return chosen;
                }
                reference
                    .plans
                    .iter()
                    .filter(|p| match kind {
                        None => true,
                        Some(Kind::Crash) => matches!(p, Perturbation::CrashAfterWrite { .. }),
                        Some(Kind::Stale) => matches!(p, Perturbation::StaleView { .. }),
                        Some(Kind::Coalesce) => matches!(p, Perturbation::Coalesce { .. }),
                    })
                    .cloned()
                    .collect()
            },
            args.parallel,
        )
        .await?;
    for finding in &checked.findings {
        println!("{finding}");
    }
    for plan in &checked.never_fired {
        println!(
            "{plan}: never fired\n  replay: {}",
            campaign.replay_command(plan)
        );
    }
    println!(
        "{}; {:.0} s in all",
        checked.tally(),
        started.elapsed().as_secs_f64()
    );
    Ok(checked.findings.is_empty() && checked.never_fired.is_empty())
}
