//! SIGINT / SIGTERM: the first starts a graceful shutdown, a second exits at once.
//!
//! Counterpart: client-go's (and controller-runtime's) `SetupSignalHandler`: the first signal
//! closes the stop channel, a second calls `os.Exit(1)`. Here the stop channel is a
//! [`CancellationToken`].
//!
//! Invariant: the handlers are installed before [`shutdown_on_signals`] returns, so a signal
//! that arrives during start-up (before the first `.await` of the caller) is not lost and does
//! not kill the process with the default action.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Installs the handlers and returns the token the first signal cancels. Call it first thing
/// inside the runtime.
pub fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    let signals = Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(handle(signals, shutdown.clone()));
    Ok(shutdown)
}

struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

async fn handle(mut signals: Signals, shutdown: CancellationToken) {
    let first = signals.next().await;
    tracing::info!(
        signal = first,
        "shutting down: finishing queued work (send another signal to exit at once)"
    );
    shutdown.cancel();
    let second = signals.next().await;
    // Not through tracing: the line must reach stderr even if the subscriber buffers.
    eprintln!("received {second} again, exiting at once");
    std::process::exit(1);
}
