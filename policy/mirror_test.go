package policy

import (
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompileMirrors checks that a rule's mirrors reach its compiled route
// and that bad ones are refused with the field named.
func TestCompileMirrors(t *testing.T) {
	backend := Distribution{Kind: DistributionFirstAvailable, Backends: []RouteBackend{{Backend: Backend{Balancer: &Balancer{Authority: "web:80"}}}}}
	fwd := &endpoint.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.1:80")}
	for _, tc := range []struct {
		name    string
		mirrors []Mirror
		want    string
	}{
		{"authority", []Mirror{{Authority: "shadow:80", Ratio: Ratio{Numerator: 1, Denominator: 2}}}, ""},
		{"forward, every request", []Mirror{{Forward: fwd}}, ""},
		{"none", []Mirror{{Ratio: Ratio{Numerator: 0, Denominator: 100}}}, "http1.routes[0].rules[0].mirrors[0]: one of authority and forward is required"},
		{"both", []Mirror{{Authority: "a:1", Forward: fwd}}, "mirrors[0]: both authority and forward set"},
		{"bad forward", []Mirror{{Forward: &endpoint.Endpoint{}}}, "mirrors[0].forward: not an address"},
		{"over one", []Mirror{{Authority: "a:1", Ratio: Ratio{Numerator: 3, Denominator: 2}}}, "mirrors[0].ratio: 3/2 is not a share between 0 and 1"},
		{"no denominator", []Mirror{{Authority: "a:1", Ratio: Ratio{Numerator: 3}}}, "mirrors[0].ratio: 3/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Policy{Protocol: ProtocolHTTP1, HTTP1: HTTPProtocol{Routes: []HTTPRoute{{Rules: []HTTPRule{{Backends: backend, Mirrors: tc.mirrors}}}}}}
			table, err := Compile(p, Options{})
			if tc.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.mirrors, table.For(nil).Routes()[0].Mirrors)
		})
	}
}
