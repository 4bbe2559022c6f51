//! The `kubeloop` binary: one subcommand per program built on the library.

#![forbid(unsafe_code)]

// The allocator kubeloop's programs ship with (Cargo feature `mimalloc`, which the hack/
// scripts and the release build turn on).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    kubeloop_cli::main()
}
