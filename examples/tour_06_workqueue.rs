//! Tour, chapter 6 (docs/06-workqueue.md): the workqueue's three promises, shown in memory.
//! 1. Dedup: a key added while it waits is one item, however often it is added.
//! 2. The processing set: a key is never handed to two workers at once; added while a worker
//!    has it, it comes back once, after `done`.
//! 3. Rate limiting: a failing key waits longer each time (5 ms doubling, per key), until it
//!    is forgotten.
//!
//! It also follows one key with `kubeloop::trace`, as `--trace` does in the controllers.

use kubeloop::workqueue::{Queue, RateLimitingQueue, default_controller_rate_limiter};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kubeloop::trace::follow(["default/a"])?;

    println!("1. dedup");
    let queue: Queue<String> = Queue::new();
    for _ in 0..3 {
        queue.add("default/a".into());
    }
    queue.add("default/b".into());
    println!(
        "   added default/a three times and default/b once: len = {}",
        queue.len()
    );

    println!("2. the processing set");
    let a = queue.get().await.expect("open queue");
    println!("   a worker took {a}; len = {}", queue.len());
    queue.add("default/a".into());
    println!(
        "   added {a} again while it is processed: len = {} (not handed out twice)",
        queue.len()
    );
    let b = queue.get().await.expect("open queue");
    println!("   the next get gives {b}, not {a}");
    queue.done(&b);
    queue.done(&a);
    println!("   done({a}): it is back in line, len = {}", queue.len());
    let again = queue.get().await.expect("open queue");
    queue.done(&again);
    println!("   get gives {again} once more; len = {}", queue.len());

    println!("3. rate limiting (client-go's DefaultControllerRateLimiter)");
    let limited = RateLimitingQueue::new(default_controller_rate_limiter());
    let key = "default/a".to_string();
    for attempt in 1..=5 {
        let start = Instant::now();
        limited.add_rate_limited(key.clone());
        let got = limited.get().await.expect("open queue");
        let waited = start.elapsed();
        println!(
            "   failure {attempt}: add_rate_limited -> back after {:>3} ms (requeues: {})",
            waited.as_millis(),
            limited.num_requeues(&got)
        );
        limited.done(&got);
    }
    limited.forget(&key);
    println!(
        "   forget({key}): requeues = {}",
        limited.num_requeues(&key)
    );

    let steps = kubeloop::trace::timeline("default/a").unwrap_or_default();
    println!("\nwhat kubeloop::trace recorded for default/a:");
    print!("{}", kubeloop::trace::render("default/a", &steps));
    Ok(())
}
