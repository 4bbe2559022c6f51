//! The `kubeloop` command line as a library: the arguments ([`Cli`]), one module per
//! subcommand (`cmd`) and the metrics and probe flags every controller subcommand shares
//! ([`OpsArgs`]), which the tests start servers with. The binary (`src/main.rs`) sets the
//! allocator and calls [`main`]. The machinery itself is the `kubeloop` crate.

// No `unsafe` but the tests' environment writes (`std::env::set_var` is unsafe in edition
// 2024), which their modules allow.
#![deny(unsafe_code)]

pub mod cmd;

pub use cmd::ops_flags::{OpsArgs, OpsFlagError, Serving};

use clap::{CommandFactory, FromArgMatches, Subcommand};

/// client-go's controller machinery rebuilt in Rust: run the sample controller or the
/// VirtualMachine controller against a Kubernetes cluster, or a local control plane to try
/// them on.
#[derive(clap::Parser, Debug)]
#[command(name = "kubeloop", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    /// Logging flags (klog's spellings too).
    pub log: cmd::common::LogArgs,
    /// Threads running the program's tasks: 1 runs them all on the main thread (tokio's
    /// current-thread runtime), N on N worker threads (its multi-thread runtime). One is the
    /// default: the controllers wait on the apiserver far more than they compute, and on one
    /// thread a task woken by another never has a sleeping thread woken to run it
    /// (benches/README.md, 2026-12-01, measures both on the sample controller).
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub runtime_threads: u16,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process, so the largest variant's size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a local control plane (etcd, kube-apiserver, and with --full controller-manager,
    /// scheduler and a kwok node) until Ctrl-C; built by hack/build-control-plane.
    #[cfg(feature = "cluster")]
    Cluster(cmd::cluster::Args),
    /// Run the sample controller: each Foo (samplecontroller.k8s.io/v1alpha1) gets a
    /// Deployment of nginx Pods, its replicas kept in line and reported in the Foo's status.
    SampleController(cmd::sample_controller::Args),
    /// Run the VirtualMachine controller (controller101): VMs as containers through the Docker
    /// API, with finalizers and leader election.
    VmController(cmd::vm_controller::Args),
    /// Print one object's journey through a running controller (watch event, FIFO, indexer,
    /// handlers, workqueue, reconcile, status write) with the time of each step. The
    /// controller must run with --trace NAMESPACE/NAME and --metrics-bind-address.
    Trace(cmd::trace::Args),
    /// Print shard bounds (for --shard-bounds) that split a namespace-hash ring into shards
    /// holding equal shares of a resource's objects, counted on the cluster now.
    ShardBounds(cmd::shard_bounds::Args),
}

/// Parses the command line and runs the subcommand it names, on the runtime that
/// `--runtime-threads` asks for.
pub fn main() -> anyhow::Result<()> {
    // Go's flag spellings (`-kubeconfig=...`, `-v=3`) first become clap's (`--kubeconfig=...`).
    let command = Cli::command();
    let args = cmd::common::normalize_args(&command, std::env::args_os());
    let cli = Cli::from_arg_matches(&command.get_matches_from(args)).unwrap_or_else(|e| e.exit());
    cmd::common::init_logging(&cli.log);
    let runtime = runtime(cli.runtime_threads)?;
    runtime.block_on(async move {
        match cli.command {
            #[cfg(feature = "cluster")]
            Command::Cluster(args) => cmd::cluster::run(args).await,
            Command::SampleController(args) => cmd::sample_controller::run(args).await,
            Command::VmController(args) => cmd::vm_controller::run(args).await,
            Command::Trace(args) => cmd::trace::run(args).await,
            Command::ShardBounds(args) => cmd::shard_bounds::run(args).await,
        }
    })
}

/// The runtime of `--runtime-threads threads`: current-thread for one, multi-thread else.
fn runtime(threads: u16) -> std::io::Result<tokio::runtime::Runtime> {
    match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(usize::from(n));
            builder
        }
    }
    .enable_all()
    .build()
}

#[cfg(test)]
mod tests {
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn runtime_threads_picks_the_runtime() {
        let flavor = |threads| super::runtime(threads).unwrap().handle().runtime_flavor();
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(2), RuntimeFlavor::MultiThread);
        let metrics = super::runtime(3).unwrap().metrics();
        assert_eq!(metrics.num_workers(), 3);
    }
}
