// Writes the protobuf encoder's Go-made fixtures: objects of the kinds kubeloop's runtime
// writes (Deployments as the sample controller creates them, Leases as the leader elector
// renews them, Events of both APIs as the recorders write them, ConfigMaps, Pods), with the
// zero values Go's Marshal writes anyway, negative numbers, byte-ordered map keys and nil
// against empty []byte, each encoded by k8s.io/apimachinery's own protobuf serializer
// (NAME.pb: k8s\0 and the runtime.Unknown envelope) and its JSON serializer (NAME.json).
// kubeloop's unit tests (src/protobuf/ser_tests.rs) decode each .pb, encode it again and
// compare the bytes.
//
//	cd hack/go/protobuf-writes && go run . ../../../src/protobuf/testdata-writes
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

func ptr[T any](v T) *T { return &v }

var (
	created = metav1.NewTime(time.Date(2026, 11, 28, 9, 30, 0, 0, time.UTC))
	// Before 1970: a negative seconds count, ten bytes on the wire.
	ancient = metav1.NewTime(time.Date(1960, 1, 2, 3, 4, 5, 0, time.UTC))
	// A MicroTime keeps microseconds and drops the rest.
	renewed = metav1.NewMicroTime(time.Date(2026, 11, 28, 9, 30, 1, 987_654_321, time.UTC))
)

// The Deployment the sample controller creates for a Foo (k8s.io/sample-controller's
// newDeployment), as kubeloop's sample controller sends it: no status, no resourceVersion.
func sampleDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": "nginx", "controller": "foo-1"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "foo-1-deployment",
			Namespace: "default",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "samplecontroller.k8s.io/v1alpha1", Kind: "Foo", Name: "foo-1",
				UID: "6c1d3a2e-0000-4000-8000-000000000001", Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:latest"}}},
			},
		},
	}
}

func fixtures() map[string]runtime.Object {
	updated := sampleDeployment()
	updated.ResourceVersion = "4242"
	updated.UID = "0f0f0f0f-1111-4222-8333-444444444444"
	updated.Generation = 2
	updated.CreationTimestamp = created
	updated.Spec.Replicas = ptr(int32(3))
	updated.Spec.RevisionHistoryLimit = ptr(int32(10))
	updated.Spec.ProgressDeadlineSeconds = ptr(int32(600))
	updated.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr(intstr.FromString("25%")), MaxUnavailable: ptr(intstr.FromInt32(0))}}
	updated.Status = appsv1.DeploymentStatus{
		ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 2, AvailableReplicas: 2, UnavailableReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse, LastUpdateTime: created, LastTransitionTime: created, Reason: "MinimumReplicasUnavailable", Message: "Deployment does not have minimum availability."}},
	}

	return map[string]runtime.Object{
		"deployment-create": sampleDeployment(),
		"deployment-status": updated,
		// As the leader elector writes it: the holder, its duration and times.
		"lease-acquire": &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "sample-controller", Namespace: "kube-system"},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr("node-a_6c1d3a2e"), LeaseDurationSeconds: ptr(int32(15)),
				AcquireTime: &renewed, RenewTime: &renewed, LeaseTransitions: ptr(int32(0)),
			},
		},
		"lease-renew": &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "sample-controller", Namespace: "kube-system", ResourceVersion: "777", UID: "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", CreationTimestamp: created},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr(""), LeaseDurationSeconds: ptr(int32(-1)),
				AcquireTime: &renewed, RenewTime: &renewed, LeaseTransitions: ptr(int32(7)),
				Strategy: ptr(coordinationv1.OldestEmulationVersion), PreferredHolder: ptr("node-b"),
			},
		},
		// As record's EventRecorder writes a core/v1 Event: the zero eventTime is written too.
		"event-core": &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "foo-1.187c1a2b3c4d5e6f", Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Foo", Namespace: "default", Name: "foo-1", UID: "6c1d3a2e-0000-4000-8000-000000000001", APIVersion: "samplecontroller.k8s.io/v1alpha1", ResourceVersion: "12"},
			Reason:         "Synced", Message: "Foo synced successfully",
			Source:         corev1.EventSource{Component: "sample-controller"},
			FirstTimestamp: created, LastTimestamp: created, Count: 1, Type: corev1.EventTypeNormal,
		},
		"event-core-series": &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "foo-1.187c1a2b3c4d5e70", Namespace: "default", ResourceVersion: "99"},
			InvolvedObject: corev1.ObjectReference{Kind: "Foo", Namespace: "default", Name: "foo-1"},
			Reason:         "Failed", Message: "boom", FirstTimestamp: ancient, LastTimestamp: created, Count: 42, Type: corev1.EventTypeWarning,
			EventTime: renewed, Series: &corev1.EventSeries{Count: 41, LastObservedTime: renewed},
			Action: "Sync", Related: &corev1.ObjectReference{Kind: "Deployment", Name: "foo-1-deployment"},
			ReportingController: "sample-controller", ReportingInstance: "sample-controller-node-a",
		},
		// As the events.k8s.io/v1 recorder writes one, and as its series update does.
		"event-events": &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: "foo-1.187c1a2b3c4d5e71", Namespace: "default"},
			EventTime:  renewed, ReportingController: "sample-controller", ReportingInstance: "sample-controller-node-a",
			Action: "Sync", Reason: "Synced", Regarding: corev1.ObjectReference{Kind: "Foo", Namespace: "default", Name: "foo-1"},
			Note: "Foo synced successfully", Type: corev1.EventTypeNormal,
		},
		"event-events-series": &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: "foo-1.187c1a2b3c4d5e72", Namespace: "default", ResourceVersion: "100"},
			EventTime:  renewed, Series: &eventsv1.EventSeries{Count: 2, LastObservedTime: renewed},
			ReportingController: "sample-controller", ReportingInstance: "sample-controller-node-a",
			Action: "Sync", Reason: "Failed", Regarding: corev1.ObjectReference{Kind: "Foo", Namespace: "default", Name: "foo-1"},
			Related: &corev1.ObjectReference{Kind: "Deployment", Name: "foo-1-deployment"},
			Note:    "boom", Type: corev1.EventTypeWarning, DeprecatedCount: 2, DeprecatedFirstTimestamp: created,
		},
		// Map keys in byte order ("Z" < "a" < "é"), an empty value, an empty and a nil []byte.
		"configmap-maps": &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "maps", Namespace: "default", Labels: map[string]string{"é": "1", "a": "", "Z": "3"}, Annotations: map[string]string{}},
			Data:       map[string]string{"b": "two", "a": "one", "": "empty key"},
			BinaryData: map[string][]byte{"blob": {0, 1, 2, 255}, "empty": {}},
			Immutable:  ptr(false),
		},
		// A Pod with little set: every non-pointer struct below is written as its zero.
		"pod-sparse": &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "web-", Namespace: "default"},
			Spec: corev1.PodSpec{
				Containers:                    []corev1.Container{{Name: "web", Image: "nginx", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}}},
				TerminationGracePeriodSeconds: ptr(int64(-5)),
				Overhead:                      corev1.ResourceList{},
				SecurityContext:               &corev1.PodSecurityContext{},
			},
		},
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "protobuf-writes: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 2 {
		fail("usage: go run . DIR")
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fail("%v", err)
	}
	pb := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	js := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{})
	for name, obj := range fixtures() {
		gvks, _, err := scheme.Scheme.ObjectKinds(obj)
		if err != nil {
			fail("%s: %v", name, err)
		}
		obj.GetObjectKind().SetGroupVersionKind(gvks[0])
		for ext, s := range map[string]runtime.Encoder{".pb": pb, ".json": js} {
			f, err := os.Create(filepath.Join(dir, name+ext))
			if err != nil {
				fail("%v", err)
			}
			if err := s.Encode(obj, f); err != nil {
				fail("%s%s: %v", name, ext, err)
			}
			f.Close()
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %d fixtures to %s\n", len(fixtures()), dir)
}
