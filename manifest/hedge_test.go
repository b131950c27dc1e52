package manifest

import (
	"testing"
	"time"

	"github.com/inmesh/inmesh/hedge"
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
