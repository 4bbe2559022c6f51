//! Criterion benchmarks of `kubeloop::workqueue`. Sample sizes and measurement
//! times are small on purpose: the whole run takes a couple of minutes on 2 cores.
//!
//! - `queue/add_get_done/<key>`: one task, a fresh queue, 100 rounds of add, get, done
//!   (client-go's BenchmarkQueue), with `&'static str`, `Arc<str>`, `String` and `u64` keys.
//! - `contended/<P>x<W>`: P producer tasks add 20k distinct keys, W worker tasks get and done
//!   until shutdown, on a multi-thread runtime with one worker thread per core.
//! - `delaying/add_after_drain_10k`: add_after 10k keys with delays over 10 minutes on paused
//!   time, advance 11 minutes, get and done all of them.
//! - `rate_limited/add_default_limiter_10k`: add_rate_limited of 10k keys under
//!   `default_controller_rate_limiter` (the adds only; draining takes the bucket 990 s).
//! - `dedup/4x4_100_keys`: 4 producers add 40k times over 100 keys, 4 workers process.

// The allocator the `kubeloop` binary ships with (`kubeloop-cli`'s default feature `mimalloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hash::Hash;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kubeloop::workqueue::{
    DelayingQueue, Queue, RateLimitingQueue, default_controller_rate_limiter,
};

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn current_thread(paused: bool) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all().start_paused(paused);
    b.build().unwrap()
}

fn static_keys(n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|i| &*Box::leak(format!("key-{i}").into_boxed_str()))
        .collect()
}

/// client-go's BenchmarkQueue body: a new queue, then add, get, done for each key.
async fn add_get_done_round<K: Hash + Eq + Clone + Send + Sync + 'static>(keys: &[K]) {
    let q: Queue<K> = Queue::new();
    for k in keys {
        q.add(k.clone());
        let item = q.get().await.unwrap();
        q.done(black_box(&item));
    }
}

fn bench_add_get_done<K: Hash + Eq + Clone + Send + Sync + 'static>(
    c: &mut Criterion,
    label: &str,
    keys: Vec<K>,
) {
    let rt = current_thread(false);
    let mut g = c.benchmark_group("queue/add_get_done");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function(label, |b| {
        b.to_async(&rt).iter(|| add_get_done_round(&keys))
    });
    g.finish();
}

fn single_threaded(c: &mut Criterion) {
    bench_add_get_done(c, "static_str", static_keys(100));
    bench_add_get_done(
        c,
        "arc_str",
        (0..100)
            .map(|i| Arc::<str>::from(format!("key-{i}")))
            .collect(),
    );
    bench_add_get_done(c, "string", (0..100).map(|i| format!("key-{i}")).collect());
    bench_add_get_done(c, "u64", (0..100u64).collect());
}

/// P producers each add `keys.len() / P` of `keys` (yielding to tokio's budget as any await
/// would; see `cooperate` in `workqueue_vs_client_go.rs`), W workers get and done until
/// shutdown.
async fn produce_and_work(keys: Arc<Vec<&'static str>>, producers: usize, workers: usize) {
    let q: Queue<&'static str> = Queue::new();
    let worker_tasks: Vec<_> = (0..workers)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                while let Some(item) = q.get().await {
                    q.done(&item);
                }
            })
        })
        .collect();
    let producer_tasks: Vec<_> = (0..producers)
        .map(|p| {
            let q = q.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                for j in 0..keys.len() / producers {
                    q.add(keys[(p * 7 + j) % keys.len()]);
                    tokio::task::consume_budget().await;
                }
            })
        })
        .collect();
    for t in producer_tasks {
        t.await.unwrap();
    }
    q.shutdown();
    for t in worker_tasks {
        t.await.unwrap();
    }
}

fn contended(c: &mut Criterion) {
    const N: usize = 20_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = Arc::new(static_keys(N));
    let mut g = c.benchmark_group("contended");
    g.throughput(Throughput::Elements(N as u64));
    for (p, w) in [(1, 1), (2, 2), (4, 4), (16, 16)] {
        g.bench_function(BenchmarkId::from_parameter(format!("{p}x{w}")), |b| {
            // Producer p adds keys p*7, p*7+P, ...: distinct keys, N in all.
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    rt.block_on(produce_and_work_distinct(keys.clone(), p, w));
                }
                start.elapsed()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("dedup");
    let few = Arc::new(static_keys(100));
    const ADDS: usize = 40_000;
    g.throughput(Throughput::Elements(ADDS as u64));
    g.bench_function("4x4_100_keys", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                rt.block_on(produce_and_work(repeat_to(&few, ADDS), 4, 4));
            }
            start.elapsed()
        })
    });
    g.finish();
}

/// `keys` repeated until there are `n` (the dedup workload's stream of adds).
fn repeat_to(keys: &Arc<Vec<&'static str>>, n: usize) -> Arc<Vec<&'static str>> {
    Arc::new(keys.iter().copied().cycle().take(n).collect())
}

async fn produce_and_work_distinct(keys: Arc<Vec<&'static str>>, producers: usize, workers: usize) {
    let q: Queue<&'static str> = Queue::new();
    let worker_tasks: Vec<_> = (0..workers)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                while let Some(item) = q.get().await {
                    q.done(&item);
                }
            })
        })
        .collect();
    let producer_tasks: Vec<_> = (0..producers)
        .map(|p| {
            let q = q.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                for j in (p..keys.len()).step_by(producers) {
                    q.add(keys[j]);
                    tokio::task::consume_budget().await;
                }
            })
        })
        .collect();
    for t in producer_tasks {
        t.await.unwrap();
    }
    q.shutdown();
    for t in worker_tasks {
        t.await.unwrap();
    }
}

fn delaying(c: &mut Criterion) {
    const N: usize = 10_000;
    let keys = static_keys(N);
    let mut g = c.benchmark_group("delaying");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("add_after_drain_10k", |b| {
        b.iter_custom(|iters| {
            let rt = current_thread(true);
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let q: DelayingQueue<&'static str> = DelayingQueue::new();
                    let mut seed: u64 = 42;
                    for k in &keys {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        q.add_after(k, Duration::from_millis(1 + (seed >> 33) % 600_000));
                    }
                    tokio::time::advance(Duration::from_secs(11 * 60)).await;
                    for _ in 0..N {
                        let item = q.get().await.unwrap();
                        q.done(&item);
                    }
                    q.shutdown();
                }
                start.elapsed()
            })
        })
    });
    g.finish();

    let mut g = c.benchmark_group("rate_limited");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("add_default_limiter_10k", |b| {
        let rt = current_thread(false);
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let q: RateLimitingQueue<&'static str> =
                        RateLimitingQueue::new(default_controller_rate_limiter());
                    let start = Instant::now();
                    for k in &keys {
                        q.add_rate_limited(k);
                    }
                    total += start.elapsed();
                    q.shutdown();
                }
                total
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = single_threaded, contended, delaying
}
criterion_main!(benches);
