//! The Rust side of `hack/bench-vs-client-go`: the workloads of
//! `hack/go/bench-workqueue/main.go` (same item counts, producers, workers, delays and key
//! strings), plus Rust translations of client-go's own `BenchmarkQueue` and
//! `BenchmarkDelayingQueue_AddAfter`.
//!
//! Keys are `Arc<str>`: like a Go `string`, an immutable shared value whose copy does not
//! allocate. (criterion's `benches/workqueue.rs` also measures `String` keys.)
//!
//! Output: one line per workload, `RESULT <workload> <ops per second>`, the median of
//! `KUBELOOP_BENCH_RUNS` runs (default 5). Run with `cargo bench --bench workqueue_vs_client_go`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeloop::workqueue::{DelayingQueue, Queue, RateLimitingQueue, default_controller_rate_limiter};

type Key = Arc<str>;

fn main() {
    let runs: usize = std::env::var("KUBELOOP_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let only: Option<String> = std::env::var("KUBELOOP_BENCH_ONLY").ok();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let report = |name: &str, f: &mut dyn FnMut() -> f64| {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            return;
        }
        let mut results: Vec<f64> = (0..runs).map(|_| f()).collect();
        results.sort_by(|a, b| a.total_cmp(b));
        println!("RESULT {name} {:.0}", results[results.len() / 2]);
    };

    report("client-go/BenchmarkQueue", &mut || client_go_benchmark_queue());
    report("client-go/BenchmarkDelayingQueue_AddAfter", &mut || client_go_benchmark_add_after(100_000));
    report("single/add-get-done", &mut || single_add_get_done());
    report("single/batch-1000", &mut || single_batch());
    for (p, w) in [(1, 1), (2, 2), (4, 4), (16, 16)] {
        report(&format!("contended/{p}x{w}"), &mut || rt.block_on(contended(p, w)));
    }
    report("dedup/4x4-100-keys", &mut || rt.block_on(dedup()));
    report("delaying/add-after-drain-10k", &mut || add_after_drain());
    report("rate-limited/add-10k-default", &mut || rate_limited_add());
}

fn keys(n: usize) -> Vec<Key> {
    (0..n).map(|i| Key::from(format!("key-{i}"))).collect()
}

/// The delay generator the Go side uses too: the same seed gives the same delays.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Runs `f` on a fresh current-thread runtime (optionally on paused time).
fn on_current_thread<F: Future>(paused: bool, f: F) -> F::Output {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all().start_paused(paused);
    b.build().unwrap().block_on(f)
}

/// client-go's BenchmarkQueue: per op, a new queue and 100 rounds of Add, Get, Done over 100
/// keys. Reported as Add+Get+Done rounds per second. (Unlike Go's, our timing includes
/// building the queue.)
fn client_go_benchmark_queue() -> f64 {
    const OPS: usize = 20_000;
    let k = keys(100);
    on_current_thread(false, async {
        let start = Instant::now();
        for _ in 0..OPS {
            let q: Queue<Key> = Queue::new();
            for key in &k {
                q.add(key.clone());
                let item = q.get().await.unwrap();
                q.done(&item);
            }
        }
        (OPS * 100) as f64 / start.elapsed().as_secs_f64()
    })
}

/// client-go's BenchmarkDelayingQueue_AddAfter at b.N = `n`: format a key, AddAfter it with a
/// random delay up to 10 minutes, then step the (paused) clock 11 minutes and Get all `n`
/// (without Done, as in Go). Reported as items per second.
fn client_go_benchmark_add_after(n: usize) -> f64 {
    on_current_thread(true, async move {
        let q: DelayingQueue<Key> = DelayingQueue::new();
        let mut rng = Lcg(7);
        let start = Instant::now();
        for i in 0..n {
            let data = Key::from(i.to_string());
            q.add_after(data, Duration::from_nanos(rng.next() % 600_000_000_000));
        }
        tokio::time::advance(Duration::from_secs(11 * 60)).await;
        for _ in 0..n {
            q.get().await.unwrap();
        }
        n as f64 / start.elapsed().as_secs_f64()
    })
}

fn single_add_get_done() -> f64 {
    const N: usize = 1_000_000;
    let k = keys(1000);
    on_current_thread(false, async {
        let q: Queue<Key> = Queue::new();
        let start = Instant::now();
        for i in 0..N {
            q.add(k[i % 1000].clone());
            let item = q.get().await.unwrap();
            q.done(&item);
        }
        N as f64 / start.elapsed().as_secs_f64()
    })
}

fn single_batch() -> f64 {
    const ROUNDS: usize = 200;
    let k = keys(1000);
    on_current_thread(false, async {
        let q: Queue<Key> = Queue::new();
        let start = Instant::now();
        for _ in 0..ROUNDS {
            for key in &k {
                q.add(key.clone());
            }
            for _ in 0..k.len() {
                let item = q.get().await.unwrap();
                q.done(&item);
            }
        }
        (ROUNDS * 1000) as f64 / start.elapsed().as_secs_f64()
    })
}

/// What a producer task does between adds. tokio schedules cooperatively: a task whose loop
/// never awaits keeps its worker thread, and a `get` it wakes waits in that thread's
/// (unstealable) LIFO slot until the loop ends, so the "concurrent" run is sequential. Go
/// preempts goroutines instead. `consume_budget` is tokio's answer: it yields once the task
/// has used its budget (128 operations), as any await on a tokio resource would.
/// `KUBELOOP_BENCH_GREEDY=1` skips it, to show the effect.
async fn cooperate() {
    if !*GREEDY {
        tokio::task::consume_budget().await;
    }
}

static GREEDY: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| std::env::var_os("KUBELOOP_BENCH_GREEDY").is_some());

/// Spawns `workers` tasks that Get and Done until the queue is shut down and empty.
fn spawn_workers(q: &Queue<Key>, workers: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                while let Some(item) = q.get().await {
                    q.done(&item);
                }
            })
        })
        .collect()
}

async fn contended(p: usize, w: usize) -> f64 {
    const N: usize = 200_000;
    let k = Arc::new(keys(N));
    let q: Queue<Key> = Queue::new();
    let start = Instant::now();
    let workers = spawn_workers(&q, w);
    let producers: Vec<_> = (0..p)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for j in (i..N).step_by(p) {
                    q.add(k[j].clone());
                    cooperate().await;
                }
            })
        })
        .collect();
    for t in producers {
        t.await.unwrap();
    }
    q.shutdown();
    for t in workers {
        t.await.unwrap();
    }
    N as f64 / start.elapsed().as_secs_f64()
}

async fn dedup() -> f64 {
    const PRODUCERS: usize = 4;
    const WORKERS: usize = 4;
    const ADDS_EACH: usize = 100_000;
    let k = Arc::new(keys(100));
    let q: Queue<Key> = Queue::new();
    let start = Instant::now();
    let workers = spawn_workers(&q, WORKERS);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for j in 0..ADDS_EACH {
                    q.add(k[(i * 7 + j) % 100].clone());
                    cooperate().await;
                }
            })
        })
        .collect();
    for t in producers {
        t.await.unwrap();
    }
    q.shutdown();
    for t in workers {
        t.await.unwrap();
    }
    (PRODUCERS * ADDS_EACH) as f64 / start.elapsed().as_secs_f64()
}

fn add_after_drain() -> f64 {
    const N: usize = 10_000;
    let k = keys(N);
    on_current_thread(true, async {
        let q: DelayingQueue<Key> = DelayingQueue::new();
        let mut rng = Lcg(42);
        let start = Instant::now();
        for key in &k {
            q.add_after(key.clone(), Duration::from_millis(1 + rng.next() % 600_000));
        }
        tokio::time::advance(Duration::from_secs(11 * 60)).await;
        for _ in 0..N {
            let item = q.get().await.unwrap();
            q.done(&item);
        }
        let ops = N as f64 / start.elapsed().as_secs_f64();
        q.shutdown();
        ops
    })
}

fn rate_limited_add() -> f64 {
    const N: usize = 10_000;
    let k = keys(N);
    on_current_thread(false, async {
        let q: RateLimitingQueue<Key> = RateLimitingQueue::new(default_controller_rate_limiter());
        let start = Instant::now();
        for key in &k {
            q.add_rate_limited(key.clone());
        }
        let elapsed = start.elapsed();
        assert_eq!(q.num_requeues(&k[0]), 1, "rate limiter did not count the add");
        q.shutdown();
        N as f64 / elapsed.as_secs_f64()
    })
}
