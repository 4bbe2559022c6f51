// The client-go side of hack/events-write-count (issue 37): a reconcile that fails N times in
// D seconds, recorded on events.k8s.io/v1 through client-go's tools/events (v0.36.3, matching
// the control plane), the way a controller wires it: events.NewBroadcaster over
// EventSinkImpl{clientset.EventsV1()}, StartRecordingToSinkWithContext, NewRecorder, Eventf;
// the clientset with client-go's default rate limits (5 QPS, burst 10) unless -qps/-burst say
// otherwise. examples/events_storm.rs is the kubeloop side: same flags, same output line.
//
//	events-storm -kubeconfig K -namespace NS -foo NAME [-scenario same|distinct] [-events 1000]
//	    [-seconds 10] [-settle 3] [-qps 0] [-burst 0]
//	RESULT side=client-go scenario=S recorded=N instance=I sent_create=.. sent_patch=..
//	    sent_update=.. failed=.. unanswered=.. unsent=..
//
// Scenarios: `same` records reason ErrResourceExists every time (one isomorphic series);
// `distinct` records ErrResourceExists-<i>, a hot loop that never repeats itself.
// After the loop it waits -settle seconds, then calls the broadcaster's Shutdown, cancels the
// recording context and exits, as a controller that stops does (client-go's Shutdown writes
// no pending series count).
//
// The sink is wrapped to count what the broadcaster asked of it, when the broadcaster has
// shut down: sent_* are the calls that returned an answer from the apiserver (any status),
// failed those of them that were errors, unanswered the calls that returned another error
// (transport), unsent the calls still waiting (in the clientset's rate limiter) then, which
// the program's exit abandons.
// The reporting instance is client-go's `<controller>-<hostname>`: NewRecorder has no way to
// set it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
)

const (
	controllerName = "events-storm"
	note           = `Resource "taken" already exists and is not managed by Foo`
)

// countingSink passes every call to the real sink and counts it.
type countingSink struct {
	inner events.EventSink
	mu    sync.Mutex
	// sent: calls answered by the apiserver, by verb; failed: those answered with an error;
	// unanswered: calls that returned another error (transport, or a cancelled context);
	// pending: calls started and not returned yet.
	sent       map[string]int
	failed     int
	unanswered int
	pending    int
}

func (s *countingSink) track(verb string) func(error) {
	s.mu.Lock()
	s.pending++
	s.mu.Unlock()
	return func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pending--
		var status apierrors.APIStatus
		if err != nil && !errors.As(err, &status) {
			s.unanswered++
			return
		}
		s.sent[verb]++
		if err != nil {
			s.failed++
		}
	}
}

func (s *countingSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	done := s.track("create")
	out, err := s.inner.Create(ctx, e)
	done(err)
	return out, err
}

func (s *countingSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	done := s.track("update")
	out, err := s.inner.Update(ctx, e)
	done(err)
	return out, err
}

func (s *countingSink) Patch(ctx context.Context, e *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	done := s.track("patch")
	out, err := s.inner.Patch(ctx, e, data)
	done(err)
	return out, err
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path (default $KUBECONFIG)")
	namespace := flag.String("namespace", "default", "namespace of the Foo")
	fooName := flag.String("foo", "", "the Foo the events are about")
	scenario := flag.String("scenario", "same", "same (one reason) or distinct (a new reason each time)")
	count := flag.Int("events", 1000, "events to record")
	seconds := flag.Float64("seconds", 10, "spread the events evenly over this many seconds")
	settle := flag.Float64("settle", 3, "seconds to wait after the loop before shutting down")
	qps := flag.Float64("qps", 0, "the clientset's QPS (0: client-go's default, 5)")
	burst := flag.Int("burst", 0, "the clientset's burst (0: client-go's default, 10)")
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *fooName, *scenario, *count, *seconds, *settle, float32(*qps), *burst); err != nil {
		fmt.Fprintln(os.Stderr, "events-storm:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, fooName, scenario string, count int, seconds, settle float64, qps float32, burst int) error {
	if fooName == "" {
		return errors.New("-foo is required")
	}
	if scenario != "same" && scenario != "distinct" {
		return fmt.Errorf("-scenario: same or distinct, not %q", scenario)
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = qps, burst
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fooGVR := schema.GroupVersionResource{Group: "samplecontroller.k8s.io", Version: "v1alpha1", Resource: "foos"}
	foo, err := dyn.Resource(fooGVR).Namespace(namespace).Get(ctx, fooName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting Foo %s/%s: %w", namespace, fooName, err)
	}
	regarding := &corev1.ObjectReference{
		APIVersion: "samplecontroller.k8s.io/v1alpha1",
		Kind:       "Foo",
		Namespace:  namespace,
		Name:       fooName,
		UID:        foo.GetUID(),
	}

	sink := &countingSink{inner: &events.EventSinkImpl{Interface: clientset.EventsV1()}, sent: map[string]int{}}
	broadcaster := events.NewBroadcaster(sink)
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return err
	}
	recorder := broadcaster.NewRecorder(scheme.Scheme, controllerName)
	hostname, _ := os.Hostname()

	start := time.Now()
	interval := time.Duration(seconds * float64(time.Second) / float64(count))
	for i := 0; i < count; i++ {
		// Evenly spaced from the start, so a slow iteration does not stretch the run.
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		reason := "ErrResourceExists"
		if scenario == "distinct" {
			reason = fmt.Sprintf("ErrResourceExists-%d", i)
		}
		recorder.Eventf(regarding, nil, corev1.EventTypeWarning, reason, "Sync", "%s", note)
	}
	time.Sleep(time.Duration(settle * float64(time.Second)))
	broadcaster.Shutdown()

	// Counted before the context is cancelled, which makes the calls waiting in the rate
	// limiter return: those are the writes the program leaves unsent.
	sink.mu.Lock()
	line := fmt.Sprintf("RESULT side=client-go scenario=%s recorded=%d instance=%s-%s sent_create=%d sent_patch=%d sent_update=%d failed=%d unanswered=%d unsent=%d",
		scenario, count, controllerName, hostname, sink.sent["create"], sink.sent["patch"], sink.sent["update"], sink.failed, sink.unanswered, sink.pending)
	sink.mu.Unlock()
	cancel()
	fmt.Println(line)
	return nil
}
