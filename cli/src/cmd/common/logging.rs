//! Logging flags: ours (`-v`, `-vv`) and the klog ones the Go originals' command lines carry
//! (`-v=3`, `--logtostderr`), all mapped onto one tracing filter on stderr.
//!
//! klog verbosity to tracing level: 0-3 info (klog's `V(2)`/`V(3)` lines are what an operator
//! reads at info), 4-5 debug, 6 and up trace. `RUST_LOG`, when set, wins over every flag.

use clap::ArgAction;
use tracing_subscriber::EnvFilter;

/// The logging flags, global to every subcommand.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log verbosity: -v for debug, -vv for trace (RUST_LOG overrides).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
    /// klog verbosity as the Go controllers take it (-v=3, --v=3, -v 3): 0-3 info, 4-5 debug,
    /// 6 and up trace (RUST_LOG overrides).
    #[arg(long = "v", value_name = "LEVEL", global = true)]
    pub klog_verbosity: Option<u8>,
    /// Accepted for the Go controllers' command lines (klog's -logtostderr); logs always go to
    /// stderr.
    #[arg(
        long,
        global = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL",
        action = ArgAction::Set
    )]
    pub logtostderr: Option<bool>,
}

impl LogArgs {
    /// The default filter when `RUST_LOG` is not set: the more verbose of `-v`/`-vv` and `--v`.
    pub fn level(&self) -> tracing::Level {
        let from_count = match self.verbose {
            0 => tracing::Level::INFO,
            1 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        };
        let from_klog = match self.klog_verbosity.unwrap_or(0) {
            0..=3 => tracing::Level::INFO,
            4..=5 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        };
        // tracing's Level orders TRACE as the greatest: more verbose is larger.
        from_count.max(from_klog)
    }
}

/// Logs to stderr; `RUST_LOG` wins over the flags. Colours only when stderr is a terminal, so
/// log files and test captures stay plain text.
pub fn init_logging(args: &LogArgs) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(args.level().as_str().to_ascii_lowercase()));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn level(verbose: u8, klog: Option<u8>) -> Level {
        LogArgs {
            verbose,
            klog_verbosity: klog,
            logtostderr: None,
        }
        .level()
    }

    #[test]
    fn klog_levels_map_onto_tracing_levels_and_the_counter_still_counts() {
        assert_eq!(level(0, None), Level::INFO);
        for v in 0..=3 {
            assert_eq!(level(0, Some(v)), Level::INFO, "-v={v}");
        }
        assert_eq!(level(0, Some(4)), Level::DEBUG);
        assert_eq!(level(0, Some(5)), Level::DEBUG);
        assert_eq!(level(0, Some(6)), Level::TRACE);
        assert_eq!(level(0, Some(10)), Level::TRACE);
        assert_eq!(level(1, None), Level::DEBUG);
        assert_eq!(level(2, None), Level::TRACE);
        // The more verbose of the two wins.
        assert_eq!(level(1, Some(2)), Level::DEBUG);
        assert_eq!(level(2, Some(0)), Level::TRACE);
    }
}
