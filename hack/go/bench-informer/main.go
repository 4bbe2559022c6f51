// The client-go side of hack/bench-informer: the ConfigMap informer of client-go's informer
// factory, built and run the way client-go's users do (informers.NewSharedInformerFactoryWithOptions,
// Start, WaitForCacheSync) with its defaults (v0.36.3, matching the control plane: streaming
// list on, RealFIFO; the clientset's default rate limits), measured the way the Rust sides
// measure themselves (same output lines).
//
//	bench-informer -kubeconfig K -namespace NS -mode create -count N [-payload random]   # set-up
//	bench-informer -kubeconfig K -namespace NS -mode sync [-transform strip-managed-fields] [-store typed]
//
// -store compact runs the same default informer: client-go has no compact store, and the
// kubeloop compact store's targets are against this one. -store metadata (and
// metadata-compact, the same) runs the metadata-only informer of client-go's metadatainformer
// factory (metadatainformer.NewFilteredSharedInformerFactory over metadata.NewForConfig,
// ForResource), as its users build one, with its defaults, and waits for its sync as the typed
// factory's WaitForCacheSync does (on the informer's HasSyncedChecker, without a poll).
//
// An earlier version built the informer from a hand-made cache.NewListWatchFromClient over
// the clientset's RESTClient, and took four to five times as long (and as much CPU) to sync:
// both stream the initial list in one WATCH, but that request asks for JSON, while the typed
// clients the factory uses ask for protobuf for built-in types (client-go 0.36's gentype,
// UseProtobufAsDefaultIfPreferred). kubeloop asks for JSON; this side now runs as users run it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
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
	store := flag.String("store", "typed", "typed, or compact (the same: client-go has no compact store)")
	payload := flag.String("payload", "random", "create: random (base64 of random bytes, as hard to compress as real data) or repeated (one short string repeated)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err)
	// The informer's clientset has client-go's defaults. The test's own writes (the set-up's
	// creates, the probe's updates every 20 ms) go through a second one without client-side
	// rate limits, as the Rust sides' writes do: at the default 5 QPS the probe's updates
	// would queue in the client and the latency would measure that queue.
	client, err := kubernetes.NewForConfig(cfg)
	check(err)
	unlimited := *cfg
	unlimited.QPS, unlimited.Burst = -1, 1000
	writer, err := kubernetes.NewForConfig(&unlimited)
	check(err)
	ctx := context.Background()

	switch *mode {
	case "create":
		create(ctx, writer, *namespace, *count, *payload)
	case "sync":
		switch *store {
		case "typed", "compact":
			syncAndMeasure(ctx, typedInformer(client, *namespace), writer, *namespace, *transform, *updates, *interval)
		case "metadata", "metadata-compact":
			syncAndMeasure(ctx, metadataInformer(cfg, *namespace), writer, *namespace, *transform, *updates, *interval)
		default:
			check(fmt.Errorf("unknown -store %q", *store))
		}
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
func create(ctx context.Context, client *kubernetes.Clientset, ns string, count int, payloadKind string) {
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
	payload := func() string {
		if payloadKind == "repeated" {
			return strings.Repeat("0123456789abcdef", 64)
		}
		b := make([]byte, 768)
		_, err := rand.Read(b)
		check(err)
		return base64.StdEncoding.EncodeToString(b) // 1024 characters
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				cm := &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%06d", i), Labels: map[string]string{"bench": "informer"}},
					Data:       map[string]string{"payload": payload()},
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

// An informer as a factory hands it out, with the factory's Start and WaitForCacheSync and
// the lister's Get and List.
type built struct {
	informer cache.SharedIndexInformer
	start    func(stop <-chan struct{})
	wait     func(stop <-chan struct{}) bool
	get      func(name string) error
	list     func() (int, error)
}

func typedInformer(client *kubernetes.Clientset, ns string) built {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	cms := factory.Core().V1().ConfigMaps()
	lister := cms.Lister().ConfigMaps(ns)
	return built{
		informer: cms.Informer(),
		start:    factory.Start,
		wait:     func(stop <-chan struct{}) bool { return allSynced(factory.WaitForCacheSync(stop)) },
		get:      func(name string) error { _, err := lister.Get(name); return err },
		list:     func() (int, error) { all, err := lister.List(labels.Everything()); return len(all), err },
	}
}

func metadataInformer(cfg *rest.Config, ns string) built {
	factory := metadatainformer.NewFilteredSharedInformerFactory(metadata.NewForConfigOrDie(cfg), 0, ns, nil)
	cms := factory.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"})
	lister := cms.Lister().ByNamespace(ns)
	informer := cms.Informer()
	return built{
		informer: informer,
		start:    factory.Start,
		// Not the metadata factory's WaitForCacheSync: in v0.36.3 it still waits through
		// cache.WaitForCacheSync, which polls HasSynced every 100 ms and so adds up to 100 ms
		// to the time measured. The typed factory's WaitForCacheSync waits without polling,
		// on the informer's HasSyncedChecker (cache.WaitFor); this side waits the same way.
		wait: func(stop <-chan struct{}) bool {
			return cache.WaitFor(wait.ContextForChannel(stop), "", informer.HasSyncedChecker()) && informer.HasSynced()
		},
		get:  func(name string) error { _, err := lister.Get(name); return err },
		list: func() (int, error) { all, err := lister.List(labels.Everything()); return len(all), err },
	}
}

func allSynced[K comparable](synced map[K]bool) bool {
	for _, ok := range synced {
		if !ok {
			return false
		}
	}
	return true
}

func syncAndMeasure(ctx context.Context, b built, writer *kubernetes.Clientset, ns, transform string, updates int, interval time.Duration) {
	informer := b.informer
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
			// In an annotation, which a metadata-only informer sees too.
			m, err := meta.Accessor(obj)
			if err != nil || m.GetName() != "probe" {
				return
			}
			if n, err := strconv.Atoi(m.GetAnnotations()["seq"]); err == nil {
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
	cms := writer.CoreV1().ConfigMaps(ns)
	_ = cms.Delete(ctx, "probe", metav1.DeleteOptions{})
	_, err = cms.Create(ctx, probe(-1), metav1.CreateOptions{})
	check(err)

	stop := make(chan struct{})
	cpu0 := cpuTime()
	start := time.Now()
	b.start(stop)
	if !b.wait(stop) {
		check(fmt.Errorf("the cache did not sync"))
	}
	synced := time.Since(start)
	cpu := cpuTime() - cpu0
	peak := procStatus("VmHWM")
	objects := len(informer.GetStore().ListKeys())
	time.Sleep(time.Second)
	after := procStatus("VmRSS")

	sent := make([]time.Time, updates)
	for i := 0; i < updates; i++ {
		sent[i] = time.Now()
		_, err := cms.Update(ctx, probe(i), metav1.UpdateOptions{})
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

	// Read cost, through the lister users read with: a get of every (objects/10000)th
	// object, and the median of three full lists.
	keys := informer.GetStore().ListKeys()
	sort.Strings(keys)
	step := max(1, len(keys)/10000)
	var gets []float64
	for i := 0; i < len(keys); i += step {
		_, name, err := cache.SplitMetaNamespaceKey(keys[i])
		check(err)
		t := time.Now()
		err = b.get(name)
		gets = append(gets, float64(time.Since(t).Nanoseconds())/1000)
		check(err)
	}
	sort.Float64s(gets)
	var lists []float64
	for i := 0; i < 3; i++ {
		t := time.Now()
		n, err := b.list()
		check(err)
		lists = append(lists, float64(time.Since(t).Microseconds())/1000)
		if n != objects {
			check(fmt.Errorf("listed %d of %d objects", n, objects))
		}
	}
	sort.Float64s(lists)
	close(stop)
	fmt.Printf("RESULT objects=%d synced_ms=%d cpu_ms=%d peak_rss_kib=%d rss_after_kib=%d p50_ms=%.2f p99_ms=%.2f get_p99_us=%.2f list_ms=%.1f\n",
		objects, synced.Milliseconds(), cpu.Milliseconds(), peak, after, pct(lat, 50), pct(lat, 99), pct(gets, 99), lists[1])
}

// The latency probe: its sequence number in data and in an annotation.
func probe(seq int) *corev1.ConfigMap {
	s := strconv.Itoa(seq)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Annotations: map[string]string{"seq": s}},
		Data:       map[string]string{"seq": s},
	}
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
