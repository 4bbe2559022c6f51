//! The binary's subcommands, one file each.

#[cfg(feature = "testenv")]
pub mod cluster;
pub mod sample_controller;
pub mod vm_controller;

/// Logs to stderr; `RUST_LOG` wins over `-v`.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
