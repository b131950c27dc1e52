package manifest

import (
	"testing"
	"time"

	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hedge.inmesh.io annotations of an HTTPRoute or GRPCRoute become the
// hedging of each of its rules; invalid values fail the file, naming the
// annotation.
func TestHedgeAnnotations(t *testing.T) {
	route := func(kind, annotations string) string {
		api := "gateway.networking.k8s.io/v1"
		return "apiVersion: " + api + "\nkind: " + kind + "\nmetadata:\n  name: r\n  namespace: default\n  annotations: {" + annotations +
			"}\nspec:\n  parentRefs: [{kind: Service, group: core, name: authors, port: 7001}]\n  rules:\n  - {}\n  - {}\n"
	}
	for _, tc := range []struct {
		name, kind, annotations string
		want                    *hedge.Policy
		err                     string
	}{
		{name: "fixed delay", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: 20ms`,
			want: &hedge.Policy{Delay: 20 * time.Millisecond}},
		{name: "bare milliseconds", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: "15"`,
			want: &hedge.Policy{Delay: 15 * time.Millisecond}},
		{name: "percentile with share and idempotent", kind: "HTTPRoute",
			annotations: `hedge.inmesh.io/delay: p95, hedge.inmesh.io/max-extra-load: "2%", hedge.inmesh.io/idempotent: "true"`,
			want:        &hedge.Policy{Percentile: 95, MaxExtraLoad: 0.02, Idempotent: true}},
		{name: "fractional percentile and share", kind: "GRPCRoute",
			annotations: `hedge.inmesh.io/delay: P99.9, hedge.inmesh.io/max-extra-load: "0.1"`,
			want:        &hedge.Policy{Percentile: 99.9, MaxExtraLoad: 0.1}},
		{name: "none", kind: "HTTPRoute", annotations: `retry.linkerd.io/limit: "1"`},
		{name: "bad delay", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: soon`,
			err: `metadata.annotations.hedge.inmesh.io/delay: "soon" is not a duration like 20ms or a percentile like p95`},
		{name: "zero delay", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: 0s`,
			err: `metadata.annotations.hedge.inmesh.io/delay: "0s" is not above 0`},
		{name: "p100", kind: "GRPCRoute", annotations: `hedge.inmesh.io/delay: p100`,
			err: `metadata.annotations.hedge.inmesh.io/delay: "p100" is not a percentile`},
		{name: "share past 100%", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: 5ms, hedge.inmesh.io/max-extra-load: "150%"`,
			err: `metadata.annotations.hedge.inmesh.io/max-extra-load: "150%" is not a share`},
		{name: "share without delay", kind: "HTTPRoute", annotations: `hedge.inmesh.io/max-extra-load: "5%"`,
			err: `metadata.annotations.hedge.inmesh.io/max-extra-load: needs hedge.inmesh.io/delay`},
		{name: "bad idempotent", kind: "HTTPRoute", annotations: `hedge.inmesh.io/delay: 5ms, hedge.inmesh.io/idempotent: "sure"`,
			err: `metadata.annotations.hedge.inmesh.io/idempotent: "sure" is not true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(authorsService + "---\n" + route(tc.kind, tc.annotations)))
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "document 2 ("+tc.kind+" default/r)")
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			p := r.Policy("default", "authors", 7001)
			require.NotNil(t, p)
			compiles(t, p)
			if tc.kind == "GRPCRoute" {
				for _, rule := range p.GRPC.Routes[0].Rules {
					assert.Equal(t, tc.want, rule.Hedge)
				}
				return
			}
			for _, rule := range p.HTTP1.Routes[0].Rules {
				assert.Equal(t, tc.want, rule.Hedge)
			}
		})
	}
}

// A ServiceProfile's hedge.inmesh.io annotations hedge every route of the
// profile, or the routes hedge.inmesh.io/routes names; invalid values fail
// the file, naming the file, the document and the annotation.
func TestServiceProfileHedgeAnnotations(t *testing.T) {
	profile := func(annotations string) string {
		return `apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
  namespace: default
  annotations: {` + annotations + `}
spec:
  routes:
  - name: GET /books
    condition: {method: GET, pathRegex: /books}
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/\d+'}
    isRetryable: true
  - name: POST /books
    condition: {method: POST, pathRegex: /books}
`
	}
	p20 := &hedge.Policy{Delay: 20 * time.Millisecond}
	for _, tc := range []struct {
		name, annotations string
		want              []*hedge.Policy // by route
		err               string
	}{
		{name: "every route", annotations: `hedge.inmesh.io/delay: 20ms`, want: []*hedge.Policy{p20, p20, p20}},
		{name: "the routes named", annotations: `hedge.inmesh.io/delay: p95, hedge.inmesh.io/max-extra-load: "2%", hedge.inmesh.io/routes: "GET /books, GET /books/{id}"`,
			want: []*hedge.Policy{{Percentile: 95, MaxExtraLoad: 0.02}, {Percentile: 95, MaxExtraLoad: 0.02}, nil}},
		{name: "names on lines", annotations: "hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/idempotent: \"true\", hedge.inmesh.io/routes: \"POST /books\\n\"",
			want: []*hedge.Policy{nil, nil, {Delay: 20 * time.Millisecond, Idempotent: true}}},
		{name: "none", annotations: `linkerd.io/created-by: linkerd`, want: []*hedge.Policy{nil, nil, nil}},
		{name: "bad delay", annotations: `hedge.inmesh.io/delay: soon`,
			err: `metadata.annotations.hedge.inmesh.io/delay: "soon" is not a duration like 20ms or a percentile like p95`},
		{name: "share without delay", annotations: `hedge.inmesh.io/max-extra-load: "5%"`,
			err: `metadata.annotations.hedge.inmesh.io/max-extra-load: needs hedge.inmesh.io/delay`},
		{name: "routes without delay", annotations: `hedge.inmesh.io/routes: GET /books`,
			err: `metadata.annotations.hedge.inmesh.io/routes: needs hedge.inmesh.io/delay`},
		{name: "unknown route", annotations: `hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/routes: "GET /book"`,
			err: `metadata.annotations.hedge.inmesh.io/routes: "GET /book" is not the name of a route of spec.routes ("GET /books", "GET /books/{id}", "POST /books")`},
		{name: "no route named", annotations: `hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/routes: " , "`,
			err: `metadata.annotations.hedge.inmesh.io/routes: names no route`},
		{name: "a route named twice", annotations: `hedge.inmesh.io/delay: 20ms, hedge.inmesh.io/routes: "GET /books,GET /books"`,
			err: `metadata.annotations.hedge.inmesh.io/routes: route "GET /books" is named twice`},
		{name: "annotation not a string", annotations: `hedge.inmesh.io/delay: [20ms]`,
			err: `metadata.annotations.hedge.inmesh.io/delay`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := LoadFiles(File{Name: "books.yaml", Data: []byte(authorsService + "---\n" + profile(tc.annotations))})
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "books.yaml: document 2 (ServiceProfile ")
				assert.Contains(t, err.Error(), tc.err)
				// The profile file source reads the same annotations.
				_, perr := profiles.ParseServiceProfiles([]byte(profile(tc.annotations)))
				require.Error(t, perr)
				assert.Contains(t, perr.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, r.ServiceProfiles, 1)
			p := r.ServiceProfiles[0].ProfileFor(7001)
			require.Len(t, p.Routes, len(tc.want))
			for i, want := range tc.want {
				assert.Equal(t, want, p.Routes[i].Hedge, "route %d", i)
			}
			_, err = profiles.Compile(p, profiles.Options{})
			require.NoError(t, err)
		})
	}
}
