//! `kubeloop cluster`: the test harness's control plane as a long-running process, for the
//! demo and for trying the controllers by hand.

use std::path::PathBuf;

use anyhow::Context;
use kubeloop_testenv::{Cluster, ClusterOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also run kube-controller-manager, kube-scheduler and a kwok node (Pods run).
    #[arg(long)]
    full: bool,
    /// Instead of kwok, make this machine a real kubelet Node: containerd, kubelet and
    /// kube-proxy, the apiserver on the pods' bridge (needs root and hack/setup-node).
    #[arg(long, conflicts_with = "full")]
    node: bool,
    /// Copy the admin kubeconfig here (it stays valid while this process runs).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// An extra kube-apiserver flag, e.g. --apiserver-arg=--watch-cache=false (repeatable).
    #[arg(
        long = "apiserver-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    apiserver_args: Vec<String>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM that arrives right after READY must stop us cleanly, not kill us.
    let stop = stop_signal()?;
    let mut options = if args.node {
        ClusterOptions::node()
    } else if args.full {
        ClusterOptions::full()
    } else {
        ClusterOptions::apiserver_only()
    };
    options
        .apiserver_args
        .extend(args.apiserver_args.iter().cloned());
    let cluster = Cluster::start(options)
        .await
        .context("starting the local control plane")?;
    let kubeconfig = match &args.kubeconfig_out {
        Some(out) => {
            std::fs::copy(cluster.kubeconfig_path(), out)
                .with_context(|| format!("writing the kubeconfig to {}", out.display()))?;
            out.clone()
        }
        None => cluster.kubeconfig_path().to_owned(),
    };
    // Machine-readable lines first (the demo and tests read them), then the human summary.
    for pid in cluster.component_pids() {
        println!("PID {pid}");
    }
    println!("KUBECONFIG {}", kubeconfig.display());
    println!("LOGS {}", cluster.dir().join("logs").display());
    println!("READY");
    eprintln!(
        "local control plane up at {}; try: {}/kubectl --kubeconfig {} get nodes,pods -A\nCtrl-C stops it.",
        cluster.apiserver_url(),
        cluster.bin_dir().display(),
        kubeconfig.display()
    );
    stop.await?;
    eprintln!("stopping the local control plane");
    drop(cluster);
    if let Some(out) = &args.kubeconfig_out {
        let _ = std::fs::remove_file(out);
    }
    Ok(())
}

/// Registers SIGINT and SIGTERM handlers now; the returned future resolves on either.
fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        Ok(())
    })
}
