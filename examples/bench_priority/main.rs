//! The priority queue against the plain one when a controller starts over many objects and
//! when a resync comes: `hack/bench-priority` runs it. Starts its own local control plane
//! (`kubeloop_testenv`, apiserver only), creates N ConfigMaps, then runs ROUNDS rounds of each
//! scenario on each queue, alternating queues, and prints the p50 and max of each figure (see
//! `scenario.rs` for what a round does and measures).
//!
//! ```text
//! cargo run --release --example bench_priority -- [N] [ROUNDS]
//! ```

use std::time::Duration;

use kubeloop_testenv::{Cluster, ClusterOptions};

mod scenario;
use scenario::{Backlog, Figures};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(10_000, |a| a.parse().expect("N"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let cluster = Cluster::start(ClusterOptions::apiserver_only())
        .await
        .expect("a local control plane (run hack/build-control-plane)");
    let client = cluster.client().await.unwrap();
    let namespace = cluster.new_namespace("bench-priority").await.unwrap();
    scenario::create(&client, &namespace, n).await;
    println!(
        "{n} ConfigMaps, 2 workers, {:?} per reconcile, {rounds} rounds; latency from the request to the start of the reconcile; backlog left = ConfigMaps of the backlog not yet reconciled in this wave then",
        scenario::COST
    );
    println!(
        "| backlog | queue | new object p50 / max | edit p50 / max | backlog left at the new object p50 / min | at the edit p50 / min |"
    );
    println!("|---|---|---|---|---|---|");
    for backlog in [Backlog::Startup, Backlog::Resync] {
        let mut results: [Vec<Figures>; 2] = Default::default();
        for r in 0..rounds {
            for (i, plain) in [false, true].into_iter().enumerate() {
                let id = r * 2 + i + if backlog == Backlog::Resync { 1000 } else { 0 };
                let figures = scenario::round(&client, &namespace, n, plain, backlog, id).await;
                eprintln!("{backlog:?} {} round {r}: {figures:?}", queue(plain));
                results[i].push(figures);
            }
        }
        for (i, plain) in [false, true].into_iter().enumerate() {
            let figures = &results[i];
            let new = durations(figures.iter().map(|f| f.new_latency));
            let edit = durations(figures.iter().map(|f| f.edit_latency));
            let left_new = counts(figures.iter().map(|f| f.backlog_left_at_new));
            let left_edit = counts(figures.iter().map(|f| f.backlog_left_at_edit));
            println!(
                "| {backlog:?} | {} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {} / {} | {} / {} |",
                queue(plain),
                ms(new[new.len() / 2]),
                ms(new[new.len() - 1]),
                ms(edit[edit.len() / 2]),
                ms(edit[edit.len() - 1]),
                left_new[left_new.len() / 2],
                left_new[0],
                left_edit[left_edit.len() / 2],
                left_edit[0],
            );
        }
    }
}

fn queue(plain: bool) -> &'static str {
    if plain { "plain" } else { "priority" }
}

fn durations(it: impl Iterator<Item = Duration>) -> Vec<Duration> {
    let mut v: Vec<_> = it.collect();
    v.sort();
    v
}

fn counts(it: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<_> = it.collect();
    v.sort();
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
