// The priority-queue workloads of hack/bench-vs-client-go: controller-runtime's
// pkg/controller/priorityqueue (the default queue of its controllers since v0.23), at the
// version pinned in go.mod, with keys shaped as controller-runtime queues them
// (reconcile.Request: a NamespacedName; here a struct of the same shape, so the binary does
// not link controller-runtime's client). benches/workqueue_vs_client_go.rs runs the same
// workloads against kubeloop's PriorityQueue<ObjectKey>.
//
// controller-runtime's queue stops handing out items at ShutDown, even ready ones, so a
// workload that must process everything ends with a sentinel key at the lowest priority:
// it is handed out after every other ready item, and the worker that gets it shuts the queue
// down. Its adds are asynchronous (a buffer that a goroutine flushes), so workloads that only
// add end with Len(), which flushes that buffer: both sides are timed until the queue holds
// what was added.
//
// Output: "PQ_RESULT <workload> <ops per second>" and "PQ_HANDED_OUT <workload> <items>".
package main

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// request has the shape of controller-runtime's reconcile.Request.
type request struct {
	types.NamespacedName
}

// The priority of adds for unchanged objects (controller-runtime's handler.LowPriority).
const lowPriority = -100

// sentinelPriority is below every priority the workloads use.
const sentinelPriority = -1000

var sentinel = request{types.NamespacedName{Name: "sentinel"}}

func requests(n int) []request {
	r := make([]request, n)
	for i := range r {
		r[i] = request{types.NamespacedName{Name: fmt.Sprintf("key-%d", i)}}
	}
	return r
}

func newPQ() priorityqueue.PriorityQueue[request] {
	// An empty name: no metrics, as the client-go workloads' queues.
	return priorityqueue.New[request]("")
}

func runPQ() {
	pqReport("single/add-get-done", pqSingleAddGetDone)
	pqReport("single/batch-1000", pqSingleBatch)
	pqReport("priorities/batch-1000-half-low-100-raised", pqPrioritiesBatch)
	for _, pw := range [][2]int{{1, 1}, {2, 2}, {4, 4}, {16, 16}} {
		p, w := pw[0], pw[1]
		pqReport(fmt.Sprintf("contended/%dx%d", p, w), func() float64 { return pqContended(p, w) })
	}
	pqReportCounted("dedup/4x4-100-keys", pqDedup)
	pqReport("delaying/add-after-10k", pqAddAfter)
	pqReport("rate-limited/add-10k-default", pqRateLimitedAdd)
}

func pqReport(name string, f func() float64) {
	pqReportCounted(name, func() (float64, int64) { return f(), -1 })
}

func pqReportCounted(name string, f func() (float64, int64)) {
	name = "pq/" + name
	if !strings.Contains(name, *only) {
		return
	}
	ops, handedOut := pick(*runs, f)
	fmt.Printf("PQ_RESULT %s %.0f\n", name, ops)
	if handedOut >= 0 {
		fmt.Printf("PQ_HANDED_OUT %s %d\n", name, handedOut)
	}
}

// pqSingleAddGetDone: one goroutine, 1M rounds of Add, Get, Done over 1000 keys.
func pqSingleAddGetDone() float64 {
	const n = 1_000_000
	k := requests(1000)
	q := newPQ()
	defer q.ShutDown()
	start := time.Now()
	for i := 0; i < n; i++ {
		q.Add(k[i%1000])
		item, _ := q.Get()
		q.Done(item)
	}
	return n / time.Since(start).Seconds()
}

// pqSingleBatch: one goroutine; 200 rounds of adding 1000 distinct keys, then Get+Done all
// (controller-runtime's own BenchmarkAddGetDone, with request keys).
func pqSingleBatch() float64 {
	const rounds = 200
	k := requests(1000)
	q := newPQ()
	defer q.ShutDown()
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

// pqPrioritiesBatch: a startup in miniature, 200 rounds: 1000 keys added, every other one at
// low priority (the initial list), then 100 of the low ones added again at priority 0 (an
// edit), then Get+Done all 1000 (each Get checks it is not handed a lower priority than the
// one before). Ops are items per second.
func pqPrioritiesBatch() float64 {
	const rounds = 200
	k := requests(1000)
	low := priorityqueue.AddOpts{Priority: new(int)}
	*low.Priority = lowPriority
	q := newPQ()
	defer q.ShutDown()
	start := time.Now()
	for r := 0; r < rounds; r++ {
		for i, key := range k {
			if i%2 == 0 {
				q.AddWithOpts(low, key)
			} else {
				q.Add(key)
			}
		}
		for i := 0; i < 200; i += 2 {
			q.Add(k[i])
		}
		last := math.MaxInt
		for range k {
			item, priority, _ := q.GetWithPriority()
			if priority > last {
				panic("priority order broken")
			}
			last = priority
			q.Done(item)
		}
	}
	return rounds * 1000 / time.Since(start).Seconds()
}

// pqWorkers starts w workers that Get and Done until the sentinel comes out, then shut the
// queue down; each adds how many items it was handed (the sentinel not counted).
func pqWorkers(q priorityqueue.PriorityQueue[request], w int, wg *sync.WaitGroup, handedOut *atomic.Int64) {
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine int64
			defer func() { handedOut.Add(mine) }()
			for {
				item, shutdown := q.Get()
				if shutdown {
					// GetWithPriority reports a shutdown that came while it handed an
					// item over along with that item: it was handed out all the same.
					if item != (request{}) && item != sentinel {
						q.Done(item)
						mine++
					}
					return
				}
				q.Done(item)
				if item == sentinel {
					q.ShutDown()
					return
				}
				mine++
			}
		}()
	}
}

func addSentinel(q priorityqueue.PriorityQueue[request]) {
	p := sentinelPriority
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &p}, sentinel)
}

// pqContended: p producers add 200k distinct keys between them; w workers Get and Done until
// every key was handed out. Ops are items processed per second.
func pqContended(p, w int) float64 {
	const n = 200_000
	k := requests(n)
	q := newPQ()
	start := time.Now()
	var workers sync.WaitGroup
	var handedOut atomic.Int64
	pqWorkers(q, w, &workers, &handedOut)
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
	addSentinel(q)
	workers.Wait()
	if handedOut.Load() != n {
		panic(fmt.Sprintf("handed out %d of %d", handedOut.Load(), n))
	}
	return n / time.Since(start).Seconds()
}

// pqDedup: 4 producers each add 100k times, cycling over 100 keys; 4 workers process until
// the queue is empty. Ops are queue calls per second (adds + Gets + Dones), as in dedup.
func pqDedup() (float64, int64) {
	const producers, workers, addsEach = 4, 4, 100_000
	k := requests(100)
	q := newPQ()
	start := time.Now()
	var wg sync.WaitGroup
	var handedOut atomic.Int64
	pqWorkers(q, workers, &wg, &handedOut)
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
	addSentinel(q)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	calls := float64(producers*addsEach) + 2*float64(handedOut.Load())
	return calls / elapsed, handedOut.Load()
}

// pqAddAfter: AddAfter 10k keys with delays from 1 ms to 10 minutes (the delaying workload's
// delays), then Len (which flushes controller-runtime's add buffer). Ops are adds per second.
func pqAddAfter() float64 {
	const n = 10_000
	k := requests(n)
	q := newPQ()
	defer q.ShutDown()
	seed := lcg(42)
	start := time.Now()
	for i := 0; i < n; i++ {
		q.AddAfter(k[i], time.Millisecond*time.Duration(1+seed.next()%600_000))
	}
	if q.Len() != 0 {
		panic("a delayed item is ready")
	}
	return n / time.Since(start).Seconds()
}

// pqRateLimitedAdd: AddRateLimited 10k distinct keys with client-go's default controller
// rate limiter, then Len. Ops are adds per second.
func pqRateLimitedAdd() float64 {
	const n = 10_000
	k := requests(n)
	q := priorityqueue.New[request]("", func(o *priorityqueue.Opts[request]) {
		o.RateLimiter = workqueue.DefaultTypedControllerRateLimiter[request]()
	})
	defer q.ShutDown()
	start := time.Now()
	for i := 0; i < n; i++ {
		q.AddRateLimited(k[i])
	}
	q.Len()
	elapsed := time.Since(start)
	if q.NumRequeues(k[0]) != 1 {
		panic("rate limiter did not count the add")
	}
	return n / elapsed.Seconds()
}
