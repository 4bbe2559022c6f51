//! The `kubeloop` binary. Subcommands run the controllers built on the library.

use clap::Parser;

/// client-go's controller machinery rebuilt in Rust: run the sample controller or the
/// VirtualMachine controller against a Kubernetes cluster.
#[derive(Parser, Debug)]
#[command(name = "kubeloop", version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
