// The client-go side of hack/bench-informer: one SharedIndexInformer on ConfigMaps with
// client-go's defaults (v0.36.3, matching the control plane: streaming list on, RealFIFO),
// measured the way the Rust sides measure themselves (same output lines).
//
//	bench-informer -kubeconfig K -namespace NS -mode create -count N   # set-up: N ConfigMaps
//	bench-informer -kubeconfig K -namespace NS -mode sync [-transform strip-managed-fields]
//
// sync prints one line:
//
//	RESULT objects=N synced_ms=.. cpu_ms=.. peak_rss_kib=.. rss_after_kib=.. p50_ms=.. p99_ms=..
//
// synced_ms and cpu_ms run from just before the informer starts to HasSynced; peak_rss_kib is
// VmHWM at that point; rss_after_kib is VmRSS one second later; p50/p99 are the latencies from
// just before an update request is sent to the handler seeing it, over -updates updates sent
// every -interval.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig path")
	namespace := flag.String("namespace", "bench", "namespace")
	mode := flag.String("mode", "sync", "create or sync")
	count := flag.Int("count", 10000, "ConfigMaps to create")
	transform := flag.String("transform", "none", "none or strip-managed-fields")
	updates := flag.Int("updates", 200, "updates for the latency phase")
	interval := flag.Duration("interval", 20*time.Millisecond, "time between updates")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err)
	cfg.QPS, cfg.Burst = -1, 1000
	client, err := kubernetes.NewForConfig(cfg)
	check(err)
	ctx := context.Background()

	switch *mode {
	case "create":
		create(ctx, client, *namespace, *count)
	case "sync":
		syncAndMeasure(ctx, client, *namespace, *transform, *updates, *interval)
	default:
		check(fmt.Errorf("unknown -mode %q", *mode))
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-informer:", err)
		os.Exit(1)
	}
}

// create makes the namespace and `count` ConfigMaps of 1 KiB of data with one label.
func create(ctx context.Context, client *kubernetes.Clientset, ns string, count int) {
	_, _ = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	// A second run against the same cluster only creates what is missing.
	existing := map[string]bool{}
	opts := metav1.ListOptions{Limit: 5000}
	for {
		page, err := client.CoreV1().ConfigMaps(ns).List(ctx, opts)
		check(err)
		for _, cm := range page.Items {
			existing[cm.Name] = true
		}
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
	}
	payload := strings.Repeat("0123456789abcdef", 64)
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				cm := &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%06d", i), Labels: map[string]string{"bench": "informer"}},
					Data:       map[string]string{"payload": payload},
				}
				for attempt := 0; ; attempt++ {
					_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
					if err == nil || strings.Contains(err.Error(), "already exists") {
						break
					}
					if attempt == 10 {
						check(fmt.Errorf("creating %s: %w", cm.Name, err))
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	for i := 0; i < count; i++ {
		if !existing[fmt.Sprintf("cm-%06d", i)] {
			work <- i
		}
	}
	close(work)
	wg.Wait()
}

func syncAndMeasure(ctx context.Context, client *kubernetes.Clientset, ns, transform string, updates int, interval time.Duration) {
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "configmaps", ns, fields.Everything())
	informer := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	switch transform {
	case "none":
	case "strip-managed-fields":
		check(informer.SetTransform(func(obj interface{}) (interface{}, error) {
			if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
				m.GetObjectMeta().SetManagedFields(nil)
			}
			return obj, nil
		}))
	default:
		check(fmt.Errorf("unknown -transform %q", transform))
	}

	// The latency phase's probe: the handler records when it sees each sequence number.
	var mu sync.Mutex
	seen := map[int]time.Time{}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {},
		UpdateFunc: func(_, obj interface{}) {
			cm := obj.(*corev1.ConfigMap)
			if cm.Name != "probe" {
				return
			}
			if n, err := strconv.Atoi(cm.Data["seq"]); err == nil {
				mu.Lock()
				if _, ok := seen[n]; !ok {
					seen[n] = time.Now()
				}
				mu.Unlock()
			}
		},
	})
	check(err)
	// The probe exists before the informer starts, so it is part of the initial list.
	cms := client.CoreV1().ConfigMaps(ns)
	_ = cms.Delete(ctx, "probe", metav1.DeleteOptions{})
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"seq": "-1"}}, metav1.CreateOptions{})
	check(err)

	stop := make(chan struct{})
	cpu0 := cpuTime()
	start := time.Now()
	go informer.Run(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		check(fmt.Errorf("cache did not sync"))
	}
	synced := time.Since(start)
	cpu := cpuTime() - cpu0
	peak := procStatus("VmHWM")
	objects := len(informer.GetStore().ListKeys())
	time.Sleep(time.Second)
	after := procStatus("VmRSS")

	sent := make([]time.Time, updates)
	for i := 0; i < updates; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"seq": strconv.Itoa(i)}}
		sent[i] = time.Now()
		_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		check(err)
		time.Sleep(interval)
	}
	deadline := time.Now().Add(10 * time.Second)
	var lat []float64
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= updates {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	for i := 0; i < updates; i++ {
		if t, ok := seen[i]; ok {
			lat = append(lat, float64(t.Sub(sent[i]).Microseconds())/1000)
		}
	}
	mu.Unlock()
	if len(lat) < updates {
		check(fmt.Errorf("the handler saw %d of %d updates", len(lat), updates))
	}
	sort.Float64s(lat)
	close(stop)
	fmt.Printf("RESULT objects=%d synced_ms=%d cpu_ms=%d peak_rss_kib=%d rss_after_kib=%d p50_ms=%.2f p99_ms=%.2f\n",
		objects, synced.Milliseconds(), cpu.Milliseconds(), peak, after, pct(lat, 50), pct(lat, 99))
}

func pct(sorted []float64, p int) float64 {
	i := (len(sorted)*p+99)/100 - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procStatus reads a KiB field of /proc/self/status.
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	check(err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			f := strings.Fields(line)
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}
