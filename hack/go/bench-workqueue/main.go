// Command bench-workqueue runs the workqueue workloads of hack/bench-vs-client-go against
// client-go's util/workqueue. benches/workqueue_vs_client_go.rs runs the same workloads (same
// item counts, producers, workers and delays) against kubeloop's workqueue.
//
// Producers yield every pace adds (runtime.Gosched), as the Rust producers do (tokio's
// yield_now): tokio schedules cooperatively and Go preempts only after 10 ms, so without
// the same pacing on both sides the workers would get in at different rates and the rows
// would compare schedulers, not queues.
//
// Output: one line per workload, "RESULT <workload> <ops per second>", the median (or with
// -stat best, the best) of -runs runs.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"
	testingclock "k8s.io/utils/clock/testing"
)

var (
	runs = flag.Int("runs", 5, "repetitions per workload")
	stat = flag.String("stat", "median", "which run to report: median or best")
	only = flag.String("only", "", "run only the workloads whose name contains this")
	pq   = flag.Bool("pq", true, "also run the priority-queue workloads (pq.go)")
)

func main() {
	flag.Parse()
	report("single/add-get-done", singleAddGetDone)
	report("single/batch-1000", singleBatch)
	for _, pw := range [][2]int{{1, 1}, {2, 2}, {4, 4}, {16, 16}} {
		p, w := pw[0], pw[1]
		report(fmt.Sprintf("contended/%dx%d", p, w), func() float64 { return contended(p, w) })
	}
	reportCounted("dedup/4x4-100-keys", dedup)
	report("delaying/add-after-drain-10k", addAfterDrain)
	report("rate-limited/add-10k-default", rateLimitedAdd)
	if *pq {
		runPQ()
	}
}

// report prints the median (or best) ops/s of *runs runs of f.
func report(name string, f func() float64) {
	reportCounted(name, func() (float64, int64) { return f(), -1 })
}

// reportCounted is report for a workload that also returns how many items its workers were
// handed (or -1); the count of the reported run is printed as "HANDED_OUT <workload> <items>":
// dedup's adds/s depends on it.
func reportCounted(name string, f func() (float64, int64)) {
	if !strings.Contains(name, *only) {
		return
	}
	ops, handedOut := pick(*runs, f)
	fmt.Printf("RESULT %s %.0f\n", name, ops)
	if handedOut >= 0 {
		fmt.Printf("HANDED_OUT %s %d\n", name, handedOut)
	}
}

// pick runs f n times and returns the median (or with -stat best, the best) run.
func pick(n int, f func() (float64, int64)) (float64, int64) {
	type run struct {
		ops       float64
		handedOut int64
	}
	results := make([]run, n)
	for i := range results {
		results[i].ops, results[i].handedOut = f()
	}
	sort.Slice(results, func(i, j int) bool { return results[i].ops < results[j].ops })
	p := results[len(results)/2]
	if *stat == "best" {
		p = results[len(results)-1]
	}
	return p.ops, p.handedOut
}

// pace is how many adds a producer makes between two yields.
const pace = 128

// yieldEvery yields after every pace-th add (j counts the producer's adds from 0).
func yieldEvery(j int) {
	if (j+1)%pace == 0 {
		runtime.Gosched()
	}
}

func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("key-%d", i)
	}
	return k
}

// lcg is the delay generator both sides share: the same seed gives the same delays.
type lcg uint64

func (s *lcg) next() uint64 {
	*s = *s*6364136223846793005 + 1442695040888963407
	return uint64(*s) >> 33
}

// singleAddGetDone: one goroutine, 1M rounds of Add, Get, Done over 1000 keys (queue depth 1).
func singleAddGetDone() float64 {
	const n = 1_000_000
	k := keys(1000)
	q := workqueue.NewTyped[string]()
	start := time.Now()
	for i := 0; i < n; i++ {
		q.Add(k[i%1000])
		item, _ := q.Get()
		q.Done(item)
	}
	return n / time.Since(start).Seconds()
}

// singleBatch: one goroutine; 200 rounds of adding 1000 distinct keys, then Get+Done all.
func singleBatch() float64 {
	const rounds = 200
	k := keys(1000)
	q := workqueue.NewTyped[string]()
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for _, key := range k {
			q.Add(key)
		}
		for range k {
			item, _ := q.Get()
			q.Done(item)
		}
	}
	return rounds * 1000 / time.Since(start).Seconds()
}

// contended: p producers add 200k distinct keys between them; w workers Get and Done until
// the queue is shut down and empty. Ops are items processed per second.
func contended(p, w int) float64 {
	const n = 200_000
	k := keys(n)
	q := workqueue.NewTyped[string]()
	start := time.Now()
	var workers sync.WaitGroup
	for i := 0; i < w; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				item, shutdown := q.Get()
				if shutdown {
					return
				}
				q.Done(item)
			}
		}()
	}
	var producers sync.WaitGroup
	for i := 0; i < p; i++ {
		producers.Add(1)
		go func(i int) {
			defer producers.Done()
			for c, j := 0, i; j < n; c, j = c+1, j+p {
				q.Add(k[j])
				yieldEvery(c)
			}
		}(i)
	}
	producers.Wait()
	q.ShutDown()
	workers.Wait()
	return n / time.Since(start).Seconds()
}

// dedup: 4 producers each add 100k times, cycling over 100 keys; 4 workers process. An add
// finds its key already queued or processing unless a worker took it since, so how many items
// the workers are handed depends on when they get in. Ops are therefore queue calls per
// second, adds + Gets + Dones (400k + 2 per item handed out), the same measure on both
// sides whatever the count; the count is returned too.
func dedup() (float64, int64) {
	const producers, workers, addsEach = 4, 4, 100_000
	k := keys(100)
	q := workqueue.NewTyped[string]()
	start := time.Now()
	var handedOut atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine int64 // a local count: no shared counter to contend on
			defer func() { handedOut.Add(mine) }()
			for {
				item, shutdown := q.Get()
				if shutdown {
					return
				}
				q.Done(item)
				mine++
			}
		}()
	}
	var pg sync.WaitGroup
	for i := 0; i < producers; i++ {
		pg.Add(1)
		go func(i int) {
			defer pg.Done()
			for j := 0; j < addsEach; j++ {
				q.Add(k[(i*7+j)%100])
				yieldEvery(j)
			}
		}(i)
	}
	pg.Wait()
	q.ShutDown()
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	calls := float64(producers*addsEach) + 2*float64(handedOut.Load())
	return calls / elapsed, handedOut.Load()
}

// addAfterDrain: on a fake clock, AddAfter 10k keys with delays spread over 10 minutes,
// step the clock 11 minutes, then Get+Done all 10k. Ops are items per second.
func addAfterDrain() float64 {
	const n = 10_000
	k := keys(n)
	clock := testingclock.NewFakeClock(time.Now())
	q := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: clock})
	defer q.ShutDown()
	seed := lcg(42)
	start := time.Now()
	for i := 0; i < n; i++ {
		q.AddAfter(k[i], time.Millisecond*time.Duration(1+seed.next()%600_000))
	}
	clock.Step(11 * time.Minute)
	for i := 0; i < n; i++ {
		item, _ := q.Get()
		q.Done(item)
	}
	return n / time.Since(start).Seconds()
}

// rateLimitedAdd: AddRateLimited 10k distinct keys on a queue with the default controller
// rate limiter (the bucket soon delays each add by a further 100 ms). Ops are adds per second;
// the items are not drained (that would take the bucket 990 s).
func rateLimitedAdd() float64 {
	const n = 10_000
	k := keys(n)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	start := time.Now()
	for i := 0; i < n; i++ {
		q.AddRateLimited(k[i])
	}
	elapsed := time.Since(start)
	if q.NumRequeues(k[0]) != 1 {
		fmt.Fprintln(os.Stderr, "rate limiter did not count the add")
		os.Exit(1)
	}
	return n / elapsed.Seconds()
}
