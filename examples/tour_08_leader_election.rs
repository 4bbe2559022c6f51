//! Tour, chapter 8 (docs/08-leader-election.md): two candidates, one Lease. Candidate A takes
//! the Lease and leads; candidate B waits, retrying every retry period; A shuts down and
//! releases the Lease, and B takes it within a retry period instead of a lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams};
use kubeloop::leaderelection::{LeaderCallbacks, LeaderElectionConfig, LeaderElector, LeaseLock};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "tour-08";

fn candidate(
    client: &Client,
    identity: &'static str,
    started: Instant,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Box<dyn std::error::Error>> {
    let config = LeaderElectionConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
        name: LEASE.into(),
        ..Default::default()
    };
    let lock = LeaseLock::new(client.clone(), "default", LEASE, identity);
    let elector = LeaderElector::new(config, lock)?;
    let at = move || format!("[{:>4.1}s]", started.elapsed().as_secs_f64());
    let callbacks = LeaderCallbacks::new(
        move |ctx| async move {
            println!(
                "{} {identity}: started leading (fencing token {})",
                at(),
                ctx.fencing_token()
            );
            ctx.cancelled().await;
        },
        move || println!("{} {identity}: stopped leading", at()),
    )
    .on_new_leader(move |leader| {
        let leader = if leader.is_empty() {
            "(none: released)"
        } else {
            leader
        };
        println!("{} {identity}: sees leader {leader}", at());
    });
    Ok(tokio::spawn(async move {
        elector.run(callbacks, shutdown).await;
    }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let _ = leases.delete(LEASE, &DeleteParams::default()).await;
    let started = Instant::now();

    let stop_a = CancellationToken::new();
    let a = candidate(&client, "candidate-a", started, stop_a.clone())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stop_b = CancellationToken::new();
    let b = candidate(&client, "candidate-b", started, stop_b.clone())?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "[{:>4.1}s] Lease holder: {}",
        started.elapsed().as_secs_f64(),
        holder(&leases).await?
    );

    println!(
        "[{:>4.1}s] shutting candidate-a down (it releases the Lease)",
        started.elapsed().as_secs_f64()
    );
    stop_a.cancel();
    a.await?;
    let handover = Instant::now();
    while holder(&leases).await? != "candidate-b" {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "[{:>4.1}s] Lease holder: candidate-b, {:.1}s after the release (retry period 0.5s, jittered up to 2.2x)",
        started.elapsed().as_secs_f64(),
        handover.elapsed().as_secs_f64()
    );
    stop_b.cancel();
    b.await?;
    Ok(())
}

async fn holder(leases: &Api<Lease>) -> Result<String, kube_client::Error> {
    let lease = leases.get_opt(LEASE).await?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}
