// Command bench-workqueue runs the workqueue workloads of hack/bench-vs-client-go against
// client-go's util/workqueue (this file) and controller-runtime's priority queue (pq.go).
// benches/workqueue_vs_client_go.rs runs the same workloads (same item counts, producers,
// workers, pacing, delays and key strings) against kubeloop's queues.
//
// Every workload is a fixed amount of work: a number of adds and a number of items handed
// out to workers, the same on both sides by construction, and each run prints its wall time
// with the counts it made, so the report can check that both sides did the same work:
//
//	<label> <workload> ms=<wall time> adds=<adds made> handed_out=<items handed out>
//
// Labels: GO (client-go's queue), GO_PQ (controller-runtime's priority queue), GO_FAIR
// (controller-runtime's priority queue on the fairness workloads; it has no fairness).
//
// Producers yield every pace adds (runtime.Gosched), as the Rust producers do (tokio's
// yield_now): tokio schedules cooperatively and Go preempts only after 10 ms, so without
// the same pacing on both sides the workers would get in at different rates and the rows
// would compare schedulers, not queues.
//
// Named rows (named/...): the queue has a name, so it records client-go's workqueue metrics
// through the provider component-base registers on import
// (k8s.io/component-base/metrics/prometheus/workqueue, as kube-controller-manager imports
// it), and each run checks that the queue's workqueue_adds_total rose by the items it handed
// out (client-go counts an add that finds its item queued as no add).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics/legacyregistry"
	// Registers the Prometheus workqueue metrics provider as client-go's global provider,
	// what a client-go controller built with component-base gets.
	_ "k8s.io/component-base/metrics/prometheus/workqueue"
	testingclock "k8s.io/utils/clock/testing"
)

var (
	runs = flag.Int("runs", 1, "runs per workload (each prints its own line)")
	only = flag.String("only", "", "run only the workloads whose name contains this")
	pq   = flag.Bool("pq", true, "also run the priority-queue workloads (pq.go)")
)

// work is one run of a workload: its wall time and the work it did.
type work struct {
	elapsed   time.Duration
	adds      int64
	handedOut int64
}

func main() {
	flag.Parse()
	checkComponentBaseProvider()
	plain := func() workqueue.TypedInterface[string] { return workqueue.NewTyped[string]() }
	report("GO", "single/add-get-done", func() work { return singleAddGetDone(plain()) })
	report("GO", "single/batch-1000", singleBatch)
	for _, pw := range [][2]int{{1, 1}, {2, 2}, {4, 4}, {16, 16}} {
		p, w := pw[0], pw[1]
		report("GO", fmt.Sprintf("contended/%dx%d", p, w), func() work { return contended(plain(), p, w) })
	}
	report("GO", dedupName, func() work { return dedup(plain()) })
	report("GO", "delaying/add-after-drain-10k", addAfterDrain)
	report("GO", "rate-limited/add-10k-default", rateLimitedAdd)
	// The same workloads on named queues (metrics on).
	report("GO", "named/single/add-get-done", named("single", singleAddGetDone))
	report("GO", "named/contended/4x4", named("contended", func(q workqueue.TypedInterface[string]) work { return contended(q, 4, 4) }))
	report("GO", "named/"+dedupName, named("dedup", dedup))
	if *pq {
		runPQ()
	}
}

// dedupName: 4 producers make 100k adds each over 100 keys, then 4 workers take the 100 items.
const dedupName = "dedup/4x100k-adds-100-keys-then-4-workers"

// report runs f *runs times and prints one line per run.
func report(label, name string, f func() work) {
	if !strings.Contains(name, *only) {
		return
	}
	for i := 0; i < *runs; i++ {
		w := f()
		fmt.Printf("%s %s ms=%.3f adds=%d handed_out=%d\n", label, name,
			float64(w.elapsed.Nanoseconds())/1e6, w.adds, w.handedOut)
	}
}

// named runs f on a queue named bench-<name> and checks that the queue recorded its adds:
// every item the workloads hand out went in by one counted add.
func named(name string, f func(workqueue.TypedInterface[string]) work) func() work {
	return func() work {
		queueName := "bench-" + name
		before := componentBaseAdds(queueName)
		q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: queueName})
		w := f(q)
		q.ShutDown()
		if got := componentBaseAdds(queueName) - before; got != float64(w.handedOut) {
			fail("named queue %s: workqueue_adds_total rose by %v, %d items were handed out", queueName, got, w.handedOut)
		}
		return w
	}
}

// checkComponentBaseProvider fails unless component-base's provider is client-go's global
// one: client-go keeps the first SetProvider, and controller-runtime's metrics package sets
// its own on import too (pq.go's queues take controller-runtime's provider explicitly).
func checkComponentBaseProvider() {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "bench-provider-check"})
	defer q.ShutDown()
	q.Add("x")
	if componentBaseAdds("bench-provider-check") != 1 {
		fail("a named client-go queue does not record into component-base's legacyregistry: another package set client-go's metrics provider first")
	}
}

// componentBaseAdds reads workqueue_adds_total{name} from component-base's legacy registry.
func componentBaseAdds(name string) float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		fail("gathering component-base's metrics: %v", err)
	}
	return counterValue(families, "workqueue_adds_total", name)
}

// counterValue is the counter family's value for the series labelled name=<name> (0 if none).
func counterValue(families []*dto.MetricFamily, family, name string) float64 {
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" && l.GetValue() == name {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-workqueue: "+format+"\n", args...)
	os.Exit(1)
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
func singleAddGetDone(q workqueue.TypedInterface[string]) work {
	const n = 1_000_000
	k := keys(1000)
	var handedOut int64
	start := time.Now()
	for i := 0; i < n; i++ {
		q.Add(k[i%1000])
		item, _ := q.Get()
		q.Done(item)
		handedOut++
	}
	return work{time.Since(start), n, handedOut}
}

// singleBatch: one goroutine; 200 rounds of adding 1000 distinct keys, then Get+Done all.
func singleBatch() work {
	const rounds = 200
	k := keys(1000)
	q := workqueue.NewTyped[string]()
	var handedOut int64
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for _, key := range k {
			q.Add(key)
		}
		for range k {
			item, _ := q.Get()
			q.Done(item)
			handedOut++
		}
	}
	return work{time.Since(start), rounds * 1000, handedOut}
}

// startWorkers starts w workers that Get and Done until the queue is shut down and empty;
// each adds how many items it was handed (a local count: no shared counter to contend on).
func startWorkers(q workqueue.TypedInterface[string], w int, wg *sync.WaitGroup, handedOut *atomic.Int64) {
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine int64
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
}

// contended: p producers add 200k distinct keys between them; w workers Get and Done until
// the queue is shut down and empty: 200k adds, 200k items handed out.
func contended(q workqueue.TypedInterface[string], p, w int) work {
	const n = 200_000
	k := keys(n)
	start := time.Now()
	var workers sync.WaitGroup
	var handedOut atomic.Int64
	startWorkers(q, w, &workers, &handedOut)
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
	return work{time.Since(start), n, handedOut.Load()}
}

// dedup: 4 producers each add 100k times, cycling over 100 keys, and finish; then 4 workers
// Get and Done until the queue is shut down and empty. Every add after a key's first finds
// it queued, so the workers are handed exactly the 100 keys, on both sides: 400k adds, 100
// items handed out.
func dedup(q workqueue.TypedInterface[string]) work {
	const producers, workers, addsEach = 4, 4, 100_000
	k := keys(100)
	start := time.Now()
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
	var wg sync.WaitGroup
	var handedOut atomic.Int64
	startWorkers(q, workers, &wg, &handedOut)
	q.ShutDown()
	wg.Wait()
	return work{time.Since(start), producers * addsEach, handedOut.Load()}
}

// addAfterDrain: on a fake clock, AddAfter 10k keys with delays spread over 10 minutes,
// step the clock 11 minutes, then Get+Done all 10k.
func addAfterDrain() work {
	const n = 10_000
	k := keys(n)
	clock := testingclock.NewFakeClock(time.Now())
	q := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: clock})
	defer q.ShutDown()
	seed := lcg(42)
	var handedOut int64
	start := time.Now()
	for i := 0; i < n; i++ {
		q.AddAfter(k[i], time.Millisecond*time.Duration(1+seed.next()%600_000))
	}
	clock.Step(11 * time.Minute)
	for i := 0; i < n; i++ {
		item, _ := q.Get()
		q.Done(item)
		handedOut++
	}
	return work{time.Since(start), n, handedOut}
}

// rateLimitedAdd: AddRateLimited 10k distinct keys on a queue with the default controller
// rate limiter (the bucket soon delays each add by a further 100 ms). The items are not
// drained (that would take the bucket 990 s): 10k adds, none handed out.
func rateLimitedAdd() work {
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
		fail("rate limiter did not count the add")
	}
	return work{elapsed, n, 0}
}
