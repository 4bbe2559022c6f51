//! The priority queue (the runtime's default) against the real control plane: a controller
//! started over 10,000 existing ConfigMaps, and one whose resync re-queues them all, each
//! reconciles a new object and a user's edit before the backlog has drained. Asserts an order,
//! never a time; `hack/bench-priority` reports the times over several rounds, beside the plain
//! queue (which serves them after the backlog). The scenario is
//! `examples/bench_priority/scenario.rs`.

#[path = "../examples/bench_priority/scenario.rs"]
mod scenario;

use kubeloop_testenv as testenv;
use scenario::Backlog;

const N: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_object_and_an_edit_are_reconciled_before_the_startup_and_resync_backlogs() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let namespace = cluster.new_namespace("priority").await.unwrap();
    scenario::create(&client, &namespace, N).await;
    for (round, backlog) in [Backlog::Startup, Backlog::Resync].into_iter().enumerate() {
        let priority = scenario::round(&client, &namespace, N, false, backlog, round).await;
        println!(
            "{backlog:?}, {N} objects, priority queue: the new object after {:?} with {} of the \
             backlog left, the edit after {:?} with {} left",
            priority.new_latency,
            priority.backlog_left_at_new,
            priority.edit_latency,
            priority.backlog_left_at_edit
        );
        assert!(
            priority.backlog_left_at_new > 0 && priority.backlog_left_at_edit > 0,
            "{backlog:?}: with the priority queue the new object and the edit go before the \
             backlog has drained: {priority:?}"
        );
    }
}
