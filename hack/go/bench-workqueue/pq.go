// The priority-queue workloads of hack/bench-vs-client-go: controller-runtime's
// pkg/controller/priorityqueue (the default queue of its controllers since v0.23), at the
// version pinned in go.mod, with keys shaped as controller-runtime queues them
// (reconcile.Request: a NamespacedName; here a struct of the same shape, so the binary does
// not link controller-runtime's client). benches/workqueue_vs_client_go.rs runs the same
// workloads against kubeloop's PriorityQueue<ObjectKey>.
//
// controller-runtime's queue stops handing out items at ShutDown, even ready ones, so a
// workload whose workers run beside its producers ends with a sentinel key at the lowest
// priority: it is handed out after every other ready item, and the worker that gets it shuts
// the queue down (the sentinel is counted in neither adds nor handed_out). Its adds are
// asynchronous (a buffer that a goroutine flushes), so workloads that only add end with
// Len(), which flushes that buffer: both sides are timed until the queue holds what was
// added.
//
// Named rows (pq/named/...): priorityqueue.New with a name and no options, so the queue
// records into controller-runtime's metrics registry through the provider New defaults to
// (pkg/internal/metrics, registered on import), as every controller-runtime controller's
// queue does; each run checks that workqueue_adds_total rose by the items handed out.
//
// The fairness workloads (GO_FAIR lines, fair/...) run controller-runtime's queue as it is:
// v0.24.1 has no fairness (controller-runtime#3261 is unmerged). Keys are spread over 100
// namespaces; kubeloop runs them with and without its namespace fairness.
package main

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
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

// namespacedRequests: key-i in namespace ns-(i mod 100).
func namespacedRequests(n int) []request {
	r := make([]request, n)
	for i := range r {
		r[i] = request{types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%100), Name: fmt.Sprintf("key-%d", i)}}
	}
	return r
}

type pqueue = priorityqueue.PriorityQueue[request]

// newPQ: an empty name, no metrics, as the unnamed client-go workloads' queues.
func newPQ() pqueue {
	return priorityqueue.New[request]("")
}

func runPQ() {
	report("GO_PQ", "pq/single/add-get-done", func() work { return pqSingleAddGetDone(newPQ()) })
	report("GO_PQ", "pq/single/batch-1000", pqSingleBatch)
	report("GO_PQ", "pq/priorities/batch-1000-half-low-100-raised", pqPrioritiesBatch)
	for _, pw := range [][2]int{{1, 1}, {2, 2}, {4, 4}, {16, 16}} {
		p, w := pw[0], pw[1]
		report("GO_PQ", fmt.Sprintf("pq/contended/%dx%d", p, w), func() work { return pqContended(newPQ(), requests(200_000), p, w) })
	}
	report("GO_PQ", "pq/"+dedupName, func() work { return pqDedup(newPQ()) })
	report("GO_PQ", "pq/delaying/add-after-10k", pqAddAfter)
	report("GO_PQ", "pq/rate-limited/add-10k-default", pqRateLimitedAdd)
	report("GO_PQ", "pq/named/single/add-get-done", pqNamed("single", 0, pqSingleAddGetDone))
	report("GO_PQ", "pq/named/contended/4x4", pqNamed("contended", 1, func(q pqueue) work { return pqContended(q, requests(200_000), 4, 4) }))
	report("GO_PQ", "pq/named/"+dedupName, pqNamed("dedup", 0, pqDedup))
	report("GO_FAIR", "fair/4x4-200k-keys-100-namespaces", func() work {
		return pqContended(newPQ(), namespacedRequests(200_000), 4, 4)
	})
	report("GO_FAIR", "fair/200k-keys-100-namespaces-queued-then-4-workers", func() work {
		return pqQueuedThenWorkers(newPQ(), namespacedRequests(200_000), 4)
	})
}

// pqNamed runs f on a queue named bench-pq-<name> and checks that it recorded its adds: one
// for each item handed out, and sentinels more for the sentinel f adds (0 or 1).
func pqNamed(name string, sentinels int64, f func(pqueue) work) func() work {
	return func() work {
		queueName := "bench-pq-" + name
		before := controllerRuntimeAdds(queueName)
		// f shuts the queue down (a second ShutDown would panic).
		w := f(priorityqueue.New[request](queueName))
		if got := controllerRuntimeAdds(queueName) - before; got != float64(w.handedOut+sentinels) {
			fail("named priority queue %s: workqueue_adds_total rose by %v, %d items were handed out", queueName, got, w.handedOut)
		}
		return w
	}
}

// controllerRuntimeAdds reads workqueue_adds_total{name} from controller-runtime's registry.
func controllerRuntimeAdds(name string) float64 {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		fail("gathering controller-runtime's metrics: %v", err)
	}
	return counterValue(families, "workqueue_adds_total", name)
}

// pqSingleAddGetDone: one goroutine, 1M rounds of Add, Get, Done over 1000 keys.
func pqSingleAddGetDone(q pqueue) work {
	const n = 1_000_000
	k := requests(1000)
	defer q.ShutDown()
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

// pqSingleBatch: one goroutine; 200 rounds of adding 1000 distinct keys, then Get+Done all
// (controller-runtime's own BenchmarkAddGetDone, with request keys).
func pqSingleBatch() work {
	const rounds = 200
	k := requests(1000)
	q := newPQ()
	defer q.ShutDown()
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

// pqPrioritiesBatch: a startup in miniature, 200 rounds: 1000 keys added, every other one at
// low priority (the initial list), then 100 of the low ones added again at priority 0 (an
// edit), then Get+Done all 1000 (each Get checks it is not handed a lower priority than the
// one before): 220k adds, 200k items handed out.
func pqPrioritiesBatch() work {
	const rounds = 200
	k := requests(1000)
	low := priorityqueue.AddOpts{Priority: new(int)}
	*low.Priority = lowPriority
	q := newPQ()
	defer q.ShutDown()
	var handedOut int64
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
				fail("priority order broken")
			}
			last = priority
			q.Done(item)
			handedOut++
		}
	}
	return work{time.Since(start), rounds * 1100, handedOut}
}

// pqWorkers starts w workers that Get and Done until the sentinel comes out, then shut the
// queue down; each adds how many items it was handed (the sentinel not counted).
func pqWorkers(q pqueue, w int, wg *sync.WaitGroup, handedOut *atomic.Int64) {
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

func addSentinel(q pqueue) {
	p := sentinelPriority
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &p}, sentinel)
}

// pqContended: p producers add the distinct keys k between them; w workers Get and Done
// until every key was handed out.
func pqContended(q pqueue, k []request, p, w int) work {
	n := len(k)
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
	elapsed := time.Since(start)
	if handedOut.Load() != int64(n) {
		fail("handed out %d of %d", handedOut.Load(), n)
	}
	return work{elapsed, int64(n), handedOut.Load()}
}

// pqQueuedThenWorkers: one goroutine adds the distinct keys k; then w workers Get and Done
// until every key was handed out.
func pqQueuedThenWorkers(q pqueue, k []request, w int) work {
	start := time.Now()
	for j, key := range k {
		q.Add(key)
		yieldEvery(j)
	}
	addSentinel(q)
	var workers sync.WaitGroup
	var handedOut atomic.Int64
	pqWorkers(q, w, &workers, &handedOut)
	workers.Wait()
	elapsed := time.Since(start)
	if handedOut.Load() != int64(len(k)) {
		fail("handed out %d of %d", handedOut.Load(), len(k))
	}
	return work{elapsed, int64(len(k)), handedOut.Load()}
}

// pqDedup: as dedup: 4 producers make 100k adds each over 100 keys and finish; then 4
// workers take 25 items each (Get and Done), which are the 100 keys: the queue holds
// nothing else. 400k adds, 100 items handed out.
func pqDedup(q pqueue) work {
	const producers, workers, addsEach = 4, 4, 100_000
	k := requests(100)
	defer q.ShutDown()
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
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100/workers; j++ {
				item, _ := q.Get()
				q.Done(item)
			}
			handedOut.Add(100 / workers)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if q.Len() != 0 {
		fail("dedup: %d items left", q.Len())
	}
	return work{elapsed, producers * addsEach, handedOut.Load()}
}

// pqAddAfter: AddAfter 10k keys with delays from 1 ms to 10 minutes (the delaying workload's
// delays), then Len (which flushes controller-runtime's add buffer): 10k adds, none handed out.
func pqAddAfter() work {
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
		fail("a delayed item is ready")
	}
	return work{time.Since(start), n, 0}
}

// pqRateLimitedAdd: AddRateLimited 10k distinct keys with client-go's default controller
// rate limiter, then Len: 10k adds, none handed out.
func pqRateLimitedAdd() work {
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
		fail("rate limiter did not count the add")
	}
	return work{elapsed, n, 0}
}
