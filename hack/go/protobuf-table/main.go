// Writes kubeloop's protobuf field table (src/protobuf/generated.rs) from the Go API types
// at the pinned Kubernetes version, so that the Rust decoder knows, for every message the
// apiserver sends, each field's tag, its JSON name, whether Go omits it when empty, whether it
// is a pointer, whether its JSON is inlined into the parent, and what it holds.
//
//	go run . > ../../../src/protobuf/generated.rs   (hack/generate-protobuf-table does this)
//	go run . -fixtures ../../../src/protobuf/testdata  (the decoder's test corpus: fixtures.go)
//
// The roots are every kind client-go's scheme registers (the built-in API groups), the
// apiextensions.k8s.io/v1 kinds, and meta/v1's PartialObjectMetadata(List), Status and
// WatchEvent; every struct reachable from them through protobuf-tagged fields becomes a
// message. Types whose JSON is not their fields' (a json.Marshaler) are one of the special
// kinds the Rust side knows by name; an unknown one stops the generator, naming it, rather
// than producing a table that decodes it wrongly.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// special maps a Go type with its own JSON form to the Rust table's Kind for it.
var special = map[string]string{
	"k8s.io/apimachinery/pkg/apis/meta/v1.Time":                                             "Time",
	"k8s.io/apimachinery/pkg/apis/meta/v1.MicroTime":                                        "MicroTime",
	"k8s.io/apimachinery/pkg/apis/meta/v1.Duration":                                         "Duration",
	"k8s.io/apimachinery/pkg/apis/meta/v1.FieldsV1":                                         "RawJson",
	"k8s.io/apimachinery/pkg/api/resource.Quantity":                                         "Quantity",
	"k8s.io/apimachinery/pkg/util/intstr.IntOrString":                                       "IntOrString",
	"k8s.io/apimachinery/pkg/runtime.RawExtension":                                          "RawJson",
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSON":                         "RawJson",
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaPropsOrArray":       "SchemaOrArray",
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaPropsOrBool":        "SchemaOrBool",
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaPropsOrStringArray": "SchemaOrStringArray",
}

const schemaProps = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaProps"

var marshaler = reflect.TypeOf((*json.Marshaler)(nil)).Elem()

type field struct {
	tag       int
	json      string
	kind      string
	omitEmpty bool
	omitZero  bool
	pointer   bool
	inline    bool
	repeated  bool
}

type message struct {
	name   string
	fields []field
}

type generator struct {
	index    map[string]int // Go type name -> message index
	messages []*message
	queue    []reflect.Type
}

func goName(t reflect.Type) string { return t.PkgPath() + "." + t.Name() }

// messageIndex returns t's message, queueing its fields for a later walk.
func (g *generator) messageIndex(t reflect.Type) int {
	name := goName(t)
	if i, ok := g.index[name]; ok {
		return i
	}
	i := len(g.messages)
	g.index[name] = i
	g.messages = append(g.messages, &message{name: name})
	g.queue = append(g.queue, t)
	return i
}

// scalar is the Kind of a non-struct Go type as protobuf carries it.
func scalar(t reflect.Type) (string, bool) {
	switch t.Kind() {
	case reflect.String:
		return "Str", true
	case reflect.Bool:
		return "Bool", true
	case reflect.Int32:
		return "I32", true
	case reflect.Int64, reflect.Int:
		return "I64", true
	case reflect.Float64:
		return "F64", true // a double (fixed64) on the wire, whatever the struct tag says
	}
	return "", false
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "protobuf-table: "+format+"\n", args...)
	os.Exit(1)
}

// kind is the Rust Kind expression for a value of type t (not a slice's or pointer's).
func (g *generator) kind(t reflect.Type, where string) string {
	if t.Name() != "" && t.PkgPath() != "" {
		if k, ok := special[goName(t)]; ok {
			if strings.HasPrefix(k, "Schema") {
				return fmt.Sprintf("%s(%d)", k, g.messageIndex(schemaPropsType))
			}
			return k
		}
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
		return "Bytes"
	}
	if k, ok := scalar(t); ok {
		return k
	}
	if t.Kind() == reflect.Struct {
		if t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
			fail("%s (%s) has its own JSON form and no special kind", goName(t), where)
		}
		return fmt.Sprintf("Msg(%d)", g.messageIndex(t))
	}
	// A named []string carried as a message of its own (authentication's ExtraValue), shown
	// as a JSON array.
	if t.Kind() == reflect.Slice && t.Name() != "" && t.Elem().Kind() == reflect.String {
		return "StringList"
	}
	fail("%s: unsupported type %s", where, t)
	return ""
}

var schemaPropsType = reflect.TypeOf(apiextensionsv1.JSONSchemaProps{})

func (g *generator) walk(t reflect.Type) {
	m := g.messages[g.index[goName(t)]]
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		ptag := sf.Tag.Get("protobuf")
		if ptag == "" {
			continue // TypeMeta: the envelope carries it
		}
		parts := strings.Split(ptag, ",")
		tag, err := strconv.Atoi(parts[1])
		if err != nil {
			fail("%s.%s: protobuf tag %q", m.name, sf.Name, ptag)
		}
		f := field{tag: tag} // repeated when a slice: the tag's "opt"/"rep" is wrong on some fields
		jtag := strings.Split(sf.Tag.Get("json"), ",")
		f.json = jtag[0]
		for _, opt := range jtag[1:] {
			switch opt {
			case "omitempty":
				f.omitEmpty = true
			case "omitzero":
				f.omitZero = true
			case "inline":
				f.inline = true
			}
		}
		if f.json == "" && !f.inline {
			f.json = sf.Name // no json tag: encoding/json uses the Go name
		}
		where := m.name + "." + sf.Name
		ft := sf.Type
		if ft.Kind() == reflect.Pointer {
			f.pointer = true
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Map:
			if ft.Key().Kind() != reflect.String {
				fail("%s: map key %s", where, ft.Key())
			}
			f.kind = fmt.Sprintf("Map(&%s)", g.kind(ft.Elem(), where))
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.Uint8:
			et := ft.Elem()
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			f.kind = g.kind(et, where)
			f.repeated = true // whatever the tag says ("opt" on some slices): a slice is repeated
		default:
			f.kind = g.kind(ft, where)
		}
		m.fields = append(m.fields, f)
	}
	sort.Slice(m.fields, func(a, b int) bool { return m.fields[a].tag < m.fields[b].tag })
	if len(m.fields) > 128 {
		fail("%s has %d fields: the decoder tracks at most 128", m.name, len(m.fields))
	}
}

type root struct {
	apiVersion, kind string
	message          int
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-fixtures" {
		writeFixtures(os.Args[2])
		return
	}
	g := &generator{index: map[string]int{}}
	var roots []root
	add := func(gvk schema.GroupVersionKind, t reflect.Type) {
		if _, hasProto := reflect.PointerTo(t).MethodByName("Unmarshal"); t.Kind() != reflect.Struct || !hasProto {
			return // no protobuf form
		}
		roots = append(roots, root{gvk.GroupVersion().String(), gvk.Kind, g.messageIndex(t)})
	}
	// In a fixed order, so that a fresh generation numbers the messages as the committed one.
	known := scheme.Scheme.AllKnownTypes()
	var gvks []schema.GroupVersionKind
	for gvk := range known {
		if gvk.Version != runtime.APIVersionInternal {
			gvks = append(gvks, gvk)
		}
	}
	sort.Slice(gvks, func(a, b int) bool { return gvks[a].String() < gvks[b].String() })
	for _, gvk := range gvks {
		add(gvk, known[gvk])
	}
	for _, obj := range []runtime.Object{&apiextensionsv1.CustomResourceDefinition{}, &apiextensionsv1.CustomResourceDefinitionList{}} {
		t := reflect.TypeOf(obj).Elem()
		add(apiextensionsv1.SchemeGroupVersion.WithKind(t.Name()), t)
	}
	for _, obj := range []any{metav1.PartialObjectMetadata{}, metav1.PartialObjectMetadataList{}, metav1.Status{}, metav1.WatchEvent{}} {
		t := reflect.TypeOf(obj)
		roots = append(roots, root{"meta.k8s.io/v1", t.Name(), g.messageIndex(t)})
	}
	for len(g.queue) > 0 {
		t := g.queue[0]
		g.queue = g.queue[1:]
		g.walk(t)
	}
	// One entry per (apiVersion, kind), sorted for binary search; Status and the like are
	// registered in many groups, where they are the same type.
	sort.Slice(roots, func(a, b int) bool {
		if roots[a].apiVersion != roots[b].apiVersion {
			return roots[a].apiVersion < roots[b].apiVersion
		}
		return roots[a].kind < roots[b].kind
	})
	out := &strings.Builder{}
	fmt.Fprintf(out, "// @generated by hack/go/protobuf-table from the Go API types of its go.mod's modules\n")
	fmt.Fprintf(out, "// (hack/generate-protobuf-table). Do not edit: hack/test fails when this file differs from\n// a fresh generation.\n\n")
	fmt.Fprintf(out, "use super::table::Kind::*;\n")
	fmt.Fprintf(out, "use super::table::{E, Field as F, I, L, Message as M, P, Root as R, Z};\n\n")
	fmt.Fprintf(out, "/// Every message, by index.\n#[rustfmt::skip]\npub(super) static MESSAGES: [M; %d] = [\n", len(g.messages))
	for i, m := range g.messages {
		fmt.Fprintf(out, "    // %d\n    M::new(%q, &[\n", i, m.name)
		for _, f := range m.fields {
			var flags []string
			for _, fl := range []struct {
				on   bool
				name string
			}{{f.omitEmpty, "E"}, {f.omitZero, "Z"}, {f.pointer, "P"}, {f.inline, "I"}, {f.repeated, "L"}} {
				if fl.on {
					flags = append(flags, fl.name)
				}
			}
			fs := "0"
			if len(flags) > 0 {
				fs = strings.Join(flags, " | ")
			}
			fmt.Fprintf(out, "        F::new(%d, %q, %s, %s),\n", f.tag, f.json, f.kind, fs)
		}
		fmt.Fprintf(out, "    ]),\n")
	}
	fmt.Fprintf(out, "];\n\n/// The top-level kinds, by apiVersion then kind.\n#[rustfmt::skip]\npub(super) static ROOTS: [R; %d] = [\n", len(roots))
	for _, r := range roots {
		fmt.Fprintf(out, "    R::new(%q, %q, %d),\n", r.apiVersion, r.kind, r.message)
	}
	fmt.Fprintf(out, "];\n")
	os.Stdout.WriteString(out.String())
}
