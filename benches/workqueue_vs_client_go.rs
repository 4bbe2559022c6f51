//! The Rust side of `hack/bench-vs-client-go`: the workloads of
//! `hack/go/bench-workqueue/main.go` (same item counts, producers, workers, pacing, delays and
//! key strings), plus Rust translations of client-go's own `BenchmarkQueue` and
//! `BenchmarkDelayingQueue_AddAfter`.
//!
//! Every workload runs with four key types:
//! - [`ObjectKey`] (lines `RESULT_KEY`): what kubeloop's controller runtime queues
//!   (`namespace/name`, one shared allocation: a clone is a reference count). This is the
//!   headline table.
//! - `String` (lines `RESULT_STRING`): what the controllers queued before the runtime had a
//!   typed key. A clone allocates and copies; the workloads clone a key for every add, as a
//!   controller builds a key for every event.
//! - `Arc<str>` (lines `RESULT_ARC`): shared keys; every clone and drop is an atomic on the
//!   key's reference count, which Go does not pay.
//! - `&'static str` (lines `RESULT`): the exact analogue of a Go `string`, a pointer and a
//!   length whose copy neither allocates nor counts references.
//!
//! The priority-queue workloads (`pq/...`, lines `RESULT_PQ_KEY`) run kubeloop's
//! [`PriorityQueue`] with [`ObjectKey`] keys against controller-runtime's priority queue
//! (`hack/go/bench-workqueue/pq.go`, whose keys have `reconcile.Request`'s shape), with the
//! same sentinel ending and the same final `len` (see that file).
//!
//! Output: one line per workload and key type, `<label> <workload> <ops per second>`, the
//! median of `KUBELOOP_BENCH_RUNS` runs (default 5), or the best with
//! `KUBELOOP_BENCH_STAT=best`; the dedup workload adds a `HANDED_OUT...` line, and each key
//! type a `FLOOR... <ns>` line: one uncontended lock/unlock of the queue's mutex type plus one
//! lookup in the queue's hash table type, the physical limit of a locked queue. Run with
//! `cargo bench --bench workqueue_vs_client_go`; `KUBELOOP_BENCH_ONLY=<substring>` picks
//! workloads and `KUBELOOP_BENCH_KEYS=key,string,arc,static,pq` key types (`pq`: the priority-queue rows).

// The allocator kubeloop's programs ship with (Cargo feature `mimalloc`, which the hack/
// scripts and the release build turn on).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use kubeloop::runtime::ObjectKey;
use kubeloop::workqueue::{
    AddOpts, DelayingQueue, LOW_PRIORITY, PriorityQueue, Queue, QueueConfig, RateLimitingQueue,
    default_controller_rate_limiter,
};

/// A key type the workloads run with.
trait Key: Clone + Hash + Eq + Send + Sync + 'static {
    const LABEL: &'static str;
    /// The label of the "items handed out to workers" lines (dedup only).
    const HANDED_OUT_LABEL: &'static str;
    /// The label of the floor line.
    const FLOOR_LABEL: &'static str;
    fn make(s: String) -> Self;
    /// `key-0` .. `key-199999`, built once.
    fn all() -> &'static [Self];
}

impl Key for &'static str {
    const LABEL: &'static str = "RESULT";
    const HANDED_OUT_LABEL: &'static str = "HANDED_OUT";
    const FLOOR_LABEL: &'static str = "FLOOR";
    fn make(s: String) -> Self {
        Box::leak(s.into_boxed_str())
    }
    fn all() -> &'static [Self] {
        static KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(make_keys);
        &KEYS
    }
}

impl Key for Arc<str> {
    const LABEL: &'static str = "RESULT_ARC";
    const HANDED_OUT_LABEL: &'static str = "HANDED_OUT_ARC";
    const FLOOR_LABEL: &'static str = "FLOOR_ARC";
    fn make(s: String) -> Self {
        Arc::from(s)
    }
    fn all() -> &'static [Self] {
        static KEYS: LazyLock<Vec<Arc<str>>> = LazyLock::new(make_keys);
        &KEYS
    }
}

impl Key for ObjectKey {
    const LABEL: &'static str = "RESULT_KEY";
    const HANDED_OUT_LABEL: &'static str = "HANDED_OUT_KEY";
    const FLOOR_LABEL: &'static str = "FLOOR_KEY";
    fn make(s: String) -> Self {
        // The Go side's `key-N` strings: a cluster-scoped object's key, the same text.
        ObjectKey::parse(&s).expect("key-N is a valid key")
    }
    fn all() -> &'static [Self] {
        static KEYS: LazyLock<Vec<ObjectKey>> = LazyLock::new(make_keys);
        &KEYS
    }
}

impl Key for String {
    const LABEL: &'static str = "RESULT_STRING";
    const HANDED_OUT_LABEL: &'static str = "HANDED_OUT_STRING";
    const FLOOR_LABEL: &'static str = "FLOOR_STRING";
    fn make(s: String) -> Self {
        s
    }
    fn all() -> &'static [Self] {
        static KEYS: LazyLock<Vec<String>> = LazyLock::new(make_keys);
        &KEYS
    }
}

fn make_keys<K: Key>() -> Vec<K> {
    (0..200_000).map(|i| K::make(format!("key-{i}"))).collect()
}

/// The first `n` keys, as the Go side's `keys(n)`.
fn keys<K: Key>(n: usize) -> Arc<Vec<K>> {
    Arc::new(K::all()[..n].to_vec())
}

fn main() {
    // `KUBELOOP_BENCH_KEYS=key,string,arc,static,pq` picks key types (all by default), to profile
    // one.
    let picked = std::env::var("KUBELOOP_BENCH_KEYS").unwrap_or_default();
    let wants = |name: &str| picked.is_empty() || picked.split(',').any(|k| k == name);
    if wants("key") {
        run_all::<ObjectKey>();
    }
    if wants("pq") {
        run_pq();
    }
    if wants("string") {
        run_all::<String>();
    }
    if wants("arc") {
        run_all::<Arc<str>>();
    }
    if wants("static") {
        run_all::<&'static str>();
    }
}

fn run_all<K: Key>() {
    let runs: usize = std::env::var("KUBELOOP_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let only: Option<String> = std::env::var("KUBELOOP_BENCH_ONLY").ok();
    let best = std::env::var("KUBELOOP_BENCH_STAT").is_ok_and(|s| s == "best");
    // Worker threads default to the number of cores, as GOMAXPROCS does in Go.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var("KUBELOOP_BENCH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build().unwrap();
    // `counted` workloads also return how many items their workers were handed, printed for
    // the reported run: dedup's adds/s depends on it (see benches/README.md).
    let counted = |name: &str, f: &mut dyn FnMut() -> (f64, Option<u64>)| {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            return;
        }
        let mut results: Vec<(f64, Option<u64>)> = (0..runs).map(|_| f()).collect();
        results.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (ops, handed_out) = if best {
            results[results.len() - 1]
        } else {
            results[results.len() / 2]
        };
        println!("{} {name} {ops:.0}", K::LABEL);
        if let Some(handed_out) = handed_out {
            println!("{} {name} {handed_out}", K::HANDED_OUT_LABEL);
        }
    };
    let report = |name: &str, f: &mut dyn FnMut() -> f64| counted(name, &mut || (f(), None));

    if only
        .as_deref()
        .is_none_or(|o| "floor".contains(o) || "single".contains(o))
    {
        println!("{} lock+lookup {:.1}", K::FLOOR_LABEL, floor_ns::<K>());
    }
    report("client-go/BenchmarkQueue", &mut || {
        client_go_benchmark_queue::<K>()
    });
    report("client-go/BenchmarkDelayingQueue_AddAfter", &mut || {
        client_go_benchmark_add_after::<K>(100_000)
    });
    report("single/add-get-done", &mut || single_add_get_done::<K>());
    report("single/batch-1000", &mut || single_batch::<K>());
    for (p, w) in [(1, 1), (2, 2), (4, 4), (16, 16)] {
        report(&format!("contended/{p}x{w}"), &mut || {
            rt.block_on(contended::<K>(p, w))
        });
    }
    counted("dedup/4x4-100-keys", &mut || {
        let (ops, handed_out) = rt.block_on(dedup::<K>());
        (ops, Some(handed_out))
    });
    report("delaying/add-after-drain-10k", &mut || {
        add_after_drain::<K>()
    });
    report("rate-limited/add-10k-default", &mut || {
        rate_limited_add::<K>()
    });
}

/// One uncontended lock/unlock of the queue's mutex type (parking_lot) around one successful
/// lookup in the queue's hash table type (hashbrown, default hasher) with 1000 keys of type
/// `K`, in nanoseconds: the cost a locked queue pays at least once per call.
fn floor_ns<K: Key>() -> f64 {
    const N: usize = 5_000_000;
    let k = keys::<K>(1000);
    let table: parking_lot::Mutex<hashbrown::HashMap<K, u32>> =
        parking_lot::Mutex::new(k.iter().cloned().zip(0..).collect());
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        for i in 0..N {
            let guard = table.lock();
            std::hint::black_box(guard.get(std::hint::black_box(&k[i % 1000])));
            drop(guard);
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e9 / N as f64);
    }
    best
}

/// The delay generator the Go side uses too: the same seed gives the same delays.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// How many runs, and whether the best (not the median) is reported: the environment's say.
fn runs_and_stat() -> (usize, bool) {
    let runs = std::env::var("KUBELOOP_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let best = std::env::var("KUBELOOP_BENCH_STAT").is_ok_and(|s| s == "best");
    (runs, best)
}

/// The priority-queue workloads (`pq/...`), kubeloop's [`PriorityQueue<ObjectKey>`] against
/// controller-runtime's priority queue (`hack/go/bench-workqueue/pq.go`).
fn run_pq() {
    let (runs, best) = runs_and_stat();
    let only: Option<String> = std::env::var("KUBELOOP_BENCH_ONLY").ok();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var("KUBELOOP_BENCH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build().unwrap();
    let counted = |name: &str, f: &mut dyn FnMut() -> (f64, Option<u64>)| {
        let name = format!("pq/{name}");
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            return;
        }
        let mut results: Vec<(f64, Option<u64>)> = (0..runs).map(|_| f()).collect();
        results.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (ops, handed_out) = if best {
            results[results.len() - 1]
        } else {
            results[results.len() / 2]
        };
        println!("RESULT_PQ_KEY {name} {ops:.0}");
        if let Some(handed_out) = handed_out {
            println!("HANDED_OUT_PQ_KEY {name} {handed_out}");
        }
    };
    let report = |name: &str, f: &mut dyn FnMut() -> f64| counted(name, &mut || (f(), None));
    report("single/add-get-done", &mut pq_single_add_get_done);
    report("single/batch-1000", &mut pq_single_batch);
    report(
        "priorities/batch-1000-half-low-100-raised",
        &mut pq_priorities_batch,
    );
    for (p, w) in [(1, 1), (2, 2), (4, 4), (16, 16)] {
        report(&format!("contended/{p}x{w}"), &mut || {
            rt.block_on(pq_contended(p, w))
        });
    }
    counted("dedup/4x4-100-keys", &mut || {
        let (ops, handed_out) = rt.block_on(pq_dedup());
        (ops, Some(handed_out))
    });
    report("delaying/add-after-10k", &mut pq_add_after);
    report("rate-limited/add-10k-default", &mut pq_rate_limited_add);
}

/// Below every priority the workloads use: the sentinel comes out last.
const SENTINEL_PRIORITY: i32 = -1000;

static SENTINEL: LazyLock<ObjectKey> = LazyLock::new(|| ObjectKey::parse("sentinel").unwrap());

fn pq_single_add_get_done() -> f64 {
    const N: usize = 1_000_000;
    let k = keys::<ObjectKey>(1000);
    on_current_thread(false, async {
        let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
        let start = Instant::now();
        for i in 0..N {
            q.add(k[i % 1000].clone());
            let (item, _) = q.get().await.unwrap();
            q.done(&item);
        }
        N as f64 / start.elapsed().as_secs_f64()
    })
}

fn pq_single_batch() -> f64 {
    const ROUNDS: usize = 200;
    let k = keys::<ObjectKey>(1000);
    on_current_thread(false, async {
        let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
        let start = Instant::now();
        for _ in 0..ROUNDS {
            for key in k.iter() {
                q.add(key.clone());
            }
            for _ in 0..k.len() {
                let (item, _) = q.get().await.unwrap();
                q.done(&item);
            }
        }
        (ROUNDS * 1000) as f64 / start.elapsed().as_secs_f64()
    })
}

/// A startup in miniature (see pq.go's `pqPrioritiesBatch`).
fn pq_priorities_batch() -> f64 {
    const ROUNDS: usize = 200;
    let k = keys::<ObjectKey>(1000);
    let low = AddOpts {
        priority: Some(LOW_PRIORITY),
        ..AddOpts::default()
    };
    on_current_thread(false, async {
        let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
        let start = Instant::now();
        for _ in 0..ROUNDS {
            for (i, key) in k.iter().enumerate() {
                if i % 2 == 0 {
                    q.add_with_opts(low, [key.clone()]);
                } else {
                    q.add(key.clone());
                }
            }
            for i in (0..200).step_by(2) {
                q.add(k[i].clone());
            }
            let mut last = i32::MAX;
            for _ in 0..k.len() {
                let (item, priority) = q.get().await.unwrap();
                assert!(priority <= last, "priority order broken");
                last = priority;
                q.done(&item);
            }
        }
        (ROUNDS * 1000) as f64 / start.elapsed().as_secs_f64()
    })
}

/// Workers that get and done until the sentinel comes out, then shut the queue down; each
/// returns how many items it was handed (the sentinel not counted).
fn pq_workers(q: &PriorityQueue<ObjectKey>, workers: usize) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..workers)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut handed_out = 0;
                while let Some((item, _)) = q.get().await {
                    q.done(&item);
                    if item == *SENTINEL {
                        q.shutdown();
                        break;
                    }
                    handed_out += 1;
                }
                handed_out
            })
        })
        .collect()
}

fn add_sentinel(q: &PriorityQueue<ObjectKey>) {
    q.add_with_opts(
        AddOpts {
            priority: Some(SENTINEL_PRIORITY),
            ..AddOpts::default()
        },
        [SENTINEL.clone()],
    );
}

async fn pq_contended(p: usize, w: usize) -> f64 {
    const N: usize = 200_000;
    let k = keys::<ObjectKey>(N);
    let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
    let start = Instant::now();
    let workers = pq_workers(&q, w);
    let producers: Vec<_> = (0..p)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for (n, j) in (i..N).step_by(p).enumerate() {
                    q.add(k[j].clone());
                    pace(n).await;
                }
            })
        })
        .collect();
    for t in producers {
        t.await.unwrap();
    }
    add_sentinel(&q);
    let mut handed_out = 0;
    for t in workers {
        handed_out += t.await.unwrap();
    }
    assert_eq!(handed_out, N as u64, "every key handed out");
    N as f64 / start.elapsed().as_secs_f64()
}

async fn pq_dedup() -> (f64, u64) {
    const PRODUCERS: usize = 4;
    const WORKERS: usize = 4;
    const ADDS_EACH: usize = 100_000;
    let k = keys::<ObjectKey>(100);
    let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
    let start = Instant::now();
    let workers = pq_workers(&q, WORKERS);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for j in 0..ADDS_EACH {
                    q.add(k[(i * 7 + j) % 100].clone());
                    pace(j).await;
                }
            })
        })
        .collect();
    for t in producers {
        t.await.unwrap();
    }
    add_sentinel(&q);
    let mut handed_out = 0;
    for t in workers {
        handed_out += t.await.unwrap();
    }
    let calls = (PRODUCERS * ADDS_EACH) as f64 + 2.0 * handed_out as f64;
    (calls / start.elapsed().as_secs_f64(), handed_out)
}

fn pq_add_after() -> f64 {
    const N: usize = 10_000;
    let k = keys::<ObjectKey>(N);
    on_current_thread(false, async {
        let q: PriorityQueue<ObjectKey> = PriorityQueue::new();
        let mut rng = Lcg(42);
        let start = Instant::now();
        for key in k.iter() {
            q.add_after(key.clone(), Duration::from_millis(1 + rng.next() % 600_000));
        }
        assert_eq!(q.len(), 0, "a delayed item is ready");
        let ops = N as f64 / start.elapsed().as_secs_f64();
        q.shutdown();
        ops
    })
}

fn pq_rate_limited_add() -> f64 {
    const N: usize = 10_000;
    let k = keys::<ObjectKey>(N);
    on_current_thread(false, async {
        let q: PriorityQueue<ObjectKey> =
            PriorityQueue::with_config(default_controller_rate_limiter(), QueueConfig::default());
        let start = Instant::now();
        for key in k.iter() {
            q.add_rate_limited(key.clone());
        }
        q.len();
        let elapsed = start.elapsed();
        assert_eq!(
            q.num_requeues(&k[0]),
            1,
            "rate limiter did not count the add"
        );
        q.shutdown();
        N as f64 / elapsed.as_secs_f64()
    })
}

/// Runs `f` on a fresh current-thread runtime (optionally on paused time).
fn on_current_thread<F: Future>(paused: bool, f: F) -> F::Output {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all().start_paused(paused);
    b.build().unwrap().block_on(f)
}

/// client-go's BenchmarkQueue: per op, a new queue (built with the timer stopped, as Go's
/// `b.StopTimer()` does) and 100 rounds of Add, Get, Done over 100 keys. Reported as
/// Add+Get+Done rounds per second.
fn client_go_benchmark_queue<K: Key>() -> f64 {
    const OPS: usize = 20_000;
    let k = keys::<K>(100);
    on_current_thread(false, async {
        let mut timed = Duration::ZERO;
        for _ in 0..OPS {
            let q: Queue<K> = Queue::new();
            let start = Instant::now();
            for key in k.iter() {
                q.add(key.clone());
                let item = q.get().await.unwrap();
                q.done(&item);
            }
            timed += start.elapsed();
        }
        (OPS * 100) as f64 / timed.as_secs_f64()
    })
}

/// client-go's BenchmarkDelayingQueue_AddAfter at b.N = `n`: format a key, AddAfter it with a
/// random delay up to 10 minutes, then step the (paused) clock 11 minutes and Get all `n`
/// (without Done, as in Go). Reported as items per second.
fn client_go_benchmark_add_after<K: Key>(n: usize) -> f64 {
    on_current_thread(true, async move {
        let q: DelayingQueue<K> = DelayingQueue::new();
        let mut rng = Lcg(7);
        let start = Instant::now();
        for i in 0..n {
            let data = K::make(i.to_string());
            q.add_after(data, Duration::from_nanos(rng.next() % 600_000_000_000));
        }
        tokio::time::advance(Duration::from_secs(11 * 60)).await;
        for _ in 0..n {
            q.get().await.unwrap();
        }
        n as f64 / start.elapsed().as_secs_f64()
    })
}

fn single_add_get_done<K: Key>() -> f64 {
    const N: usize = 1_000_000;
    let k = keys::<K>(1000);
    on_current_thread(false, async {
        let q: Queue<K> = Queue::new();
        let start = Instant::now();
        for i in 0..N {
            q.add(k[i % 1000].clone());
            let item = q.get().await.unwrap();
            q.done(&item);
        }
        N as f64 / start.elapsed().as_secs_f64()
    })
}

fn single_batch<K: Key>() -> f64 {
    const ROUNDS: usize = 200;
    let k = keys::<K>(1000);
    on_current_thread(false, async {
        let q: Queue<K> = Queue::new();
        let start = Instant::now();
        for _ in 0..ROUNDS {
            for key in k.iter() {
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

/// How many adds a producer makes between two yields, on both sides (Go: `runtime.Gosched`).
/// tokio schedules cooperatively: a task whose loop never awaits keeps its worker thread, and
/// a `get` it wakes waits in that thread's (unstealable) LIFO slot until the loop ends. Go
/// preempts a goroutine only after 10 ms. Both sides therefore yield every `PACE` adds, so the
/// workers get in equally often and the rows compare queues, not schedulers.
const PACE: usize = 128;

/// Yields after every [`PACE`]th add (`j` counts the producer's adds from 0).
async fn pace(j: usize) {
    if (j + 1) % PACE == 0 {
        tokio::task::yield_now().await;
    }
}

/// Spawns `workers` tasks that Get and Done until the queue is shut down and empty; each
/// returns how many items it was handed (a local count: no shared counter to contend on).
fn spawn_workers<K: Key>(q: &Queue<K>, workers: usize) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..workers)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut handed_out = 0;
                while let Some(item) = q.get().await {
                    q.done(&item);
                    handed_out += 1;
                }
                handed_out
            })
        })
        .collect()
}

async fn contended<K: Key>(p: usize, w: usize) -> f64 {
    const N: usize = 200_000;
    let k = keys::<K>(N);
    let q: Queue<K> = Queue::new();
    let start = Instant::now();
    let workers = spawn_workers(&q, w);
    let producers: Vec<_> = (0..p)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for (n, j) in (i..N).step_by(p).enumerate() {
                    q.add(k[j].clone());
                    pace(n).await;
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

/// 4 producers each add 100k times, cycling over 100 keys; 4 workers process. Reports queue
/// calls per second (adds + gets + dones) and how many items the workers were handed.
async fn dedup<K: Key>() -> (f64, u64) {
    const PRODUCERS: usize = 4;
    const WORKERS: usize = 4;
    const ADDS_EACH: usize = 100_000;
    let k = keys::<K>(100);
    let q: Queue<K> = Queue::new();
    let start = Instant::now();
    let workers = spawn_workers(&q, WORKERS);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let q = q.clone();
            let k = k.clone();
            tokio::spawn(async move {
                for j in 0..ADDS_EACH {
                    q.add(k[(i * 7 + j) % 100].clone());
                    pace(j).await;
                }
            })
        })
        .collect();
    for t in producers {
        t.await.unwrap();
    }
    q.shutdown();
    let mut handed_out = 0;
    for t in workers {
        handed_out += t.await.unwrap();
    }
    // Queue calls per second, adds + gets + dones, as the Go side counts them: how many items
    // the workers are handed depends on when they get in, and each costs a get and a done.
    let calls = (PRODUCERS * ADDS_EACH) as f64 + 2.0 * handed_out as f64;
    (calls / start.elapsed().as_secs_f64(), handed_out)
}

fn add_after_drain<K: Key>() -> f64 {
    const N: usize = 10_000;
    let k = keys::<K>(N);
    on_current_thread(true, async {
        let q: DelayingQueue<K> = DelayingQueue::new();
        let mut rng = Lcg(42);
        let start = Instant::now();
        for key in k.iter() {
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

fn rate_limited_add<K: Key>() -> f64 {
    const N: usize = 10_000;
    let k = keys::<K>(N);
    on_current_thread(false, async {
        let q: RateLimitingQueue<K> = RateLimitingQueue::new(default_controller_rate_limiter());
        let start = Instant::now();
        for key in k.iter() {
            q.add_rate_limited(key.clone());
        }
        let elapsed = start.elapsed();
        assert_eq!(
            q.num_requeues(&k[0]),
            1,
            "rate limiter did not count the add"
        );
        q.shutdown();
        N as f64 / elapsed.as_secs_f64()
    })
}
