//! One leader-election candidate as its own OS process, for the multi-process tests in
//! tests/leaderelection_processes.rs (and for trying elections by hand).
//!
//! It contends for a Lease with [`kubeloop::leaderelection::LeaderElector`] and appends what
//! happens to `--log`, one line per event: `<CLOCK_MONOTONIC ns> <event> [detail]`.
//! CLOCK_MONOTONIC is system-wide on Linux, so lines from several processes on one host can be
//! compared. The leader's work is a loop of ticks; each tick reads the clock *first* and logs
//! the reading only if [`LeaderContext::still_leading`] holds afterwards, so every logged tick
//! time is earlier than the moment this process stopped being entitled to lead, even if the
//! process is frozen (SIGSTOP) between the two steps.
//!
//! SIGTERM / SIGINT stop the elector gracefully (the work ends, the lease is released unless
//! `--no-release`), then the process exits 0.

// The allocator the `kubeloop` binary ships with (`kubeloop-cli`'s default feature `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kubeloop::leaderelection::{
    Clock, LeaderCallbacks, LeaderContext, LeaderElectionConfig, LeaderElector, LeaseLock,
    SkewedClock, SystemClock,
};
use parking_lot::Mutex;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(about = "A leader-election candidate that logs when its leader work runs")]
struct Args {
    /// Kubeconfig file to connect with.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Override the kubeconfig's server URL (e.g. a fault proxy in front of the apiserver).
    #[arg(long)]
    server: Option<String>,
    #[arg(long)]
    namespace: String,
    /// Lease name.
    #[arg(long)]
    name: String,
    #[arg(long)]
    identity: String,
    #[arg(long, default_value_t = 15_000)]
    lease_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    renew_ms: u64,
    #[arg(long, default_value_t = 2_000)]
    retry_ms: u64,
    /// Contend again after losing the lease.
    #[arg(long)]
    recontend: bool,
    /// Do not release the lease on a graceful stop.
    #[arg(long)]
    no_release: bool,
    /// Shift the wall clock written into the Lease (acquireTime/renewTime) by this many seconds.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    clock_skew_secs: i64,
    /// Interval between two ticks of leader work.
    #[arg(long, default_value_t = 50)]
    tick_ms: u64,
    /// File the events are appended to.
    #[arg(long)]
    log: PathBuf,
}

/// Appends timestamped lines; each line is written with one `write` call and flushed.
#[derive(Clone)]
struct EventLog(Arc<Mutex<std::fs::File>>);

impl EventLog {
    fn line(&self, at_ns: u64, event: &str, detail: &str) {
        let text = format!("{at_ns} {event} {detail}\n");
        let mut file = self.0.lock();
        // A failed log write would make the test's analysis wrong; dying loudly is better.
        if let Err(e) = file.write_all(text.as_bytes()).and_then(|_| file.flush()) {
            eprintln!("le_candidate: cannot write the event log: {e}");
            std::process::exit(3);
        }
    }

    fn now(&self, event: &str, detail: &str) {
        self.line(monotonic_ns(), event, detail);
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Die with the test process that started us, so no candidate outlives a failed test.
fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() == 1 {
            libc::_exit(4);
        }
    }
}

async fn leader_work(ctx: LeaderContext, log: EventLog, term: u64, tick: Duration) {
    /// Logs `work-end <term> aborted` if the elector aborts the work (drops this future).
    struct AbortGuard(Option<(EventLog, u64)>);
    impl Drop for AbortGuard {
        fn drop(&mut self) {
            if let Some((log, term)) = self.0.take() {
                log.now("work-end", &format!("{term} aborted"));
            }
        }
    }
    let mut guard = AbortGuard(Some((log.clone(), term)));
    log.now(
        "work-start",
        &format!("{term} fencing={}", ctx.fencing_token()),
    );
    loop {
        let at = monotonic_ns();
        if !ctx.still_leading() {
            break;
        }
        log.line(at, "tick", &term.to_string());
        tokio::select! {
            _ = ctx.cancelled() => break,
            _ = tokio::time::sleep(tick) => {}
        }
    }
    guard.0 = None;
    log.now("work-end", &term.to_string());
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    die_with_parent();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .with_context(|| format!("opening event log {}", args.log.display()))?;
    let log = EventLog(Arc::new(Mutex::new(file)));

    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", args.kubeconfig.display()))?;
    let mut config =
        kube_client::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading kubeconfig {}", args.kubeconfig.display()))?;
    if let Some(server) = &args.server {
        config.cluster_url = server
            .parse()
            .with_context(|| format!("--server {server:?} is not a URL"))?;
    }
    let client = kube_client::Client::try_from(config).context("building the client")?;

    let clock: Arc<dyn Clock> = match args.clock_skew_secs {
        0 => Arc::new(SystemClock),
        s if s > 0 => Arc::new(SkewedClock {
            ahead: Duration::from_secs(s as u64),
            behind: Duration::ZERO,
        }),
        s => Arc::new(SkewedClock {
            ahead: Duration::ZERO,
            behind: Duration::from_secs(s.unsigned_abs()),
        }),
    };
    let election = LeaderElectionConfig {
        lease_duration: Duration::from_millis(args.lease_ms),
        renew_deadline: Duration::from_millis(args.renew_ms),
        retry_period: Duration::from_millis(args.retry_ms),
        release_on_cancel: !args.no_release,
        recontend: args.recontend,
        name: format!("{}/{}", args.namespace, args.name),
    };
    let lock = LeaseLock::new(client, &args.namespace, &args.name, &args.identity);
    let elector = LeaderElector::with_clock(election, lock, clock)
        .context("invalid leader election settings")?;

    let tick = Duration::from_millis(args.tick_ms);
    let terms = Arc::new(Mutex::new(0u64));
    let (work_log, stop_log, leader_log) = (log.clone(), log.clone(), log.clone());
    let callbacks = LeaderCallbacks::new(
        move |ctx| {
            let term = {
                let mut t = terms.lock();
                *t += 1;
                *t
            };
            leader_work(ctx, work_log.clone(), term, tick)
        },
        move || stop_log.now("stopped-leading", ""),
    )
    .on_new_leader(move |holder| leader_log.now("new-leader", holder));

    let shutdown = CancellationToken::new();
    let mut term_signal =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int_signal =
        signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let stopper = shutdown.clone();
    let signal_log = log.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term_signal.recv() => signal_log.now("signal", "TERM"),
            _ = int_signal.recv() => signal_log.now("signal", "INT"),
        }
        stopper.cancel();
    });

    log.now("ready", &args.identity);
    let reason = elector.run(callbacks, shutdown).await;
    log.now("exit", &format!("{reason:?}").replace(' ', "_"));
    Ok(())
}
