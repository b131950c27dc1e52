package balancer

import (
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pick that excludes the endpoints its request tried never returns one
// of them, and none at all when every endpoint was tried; a pick that
// does not exclude records its choice.
func TestPickExcluding(t *testing.T) {
	p := NewPool(nil)
	var eps []endpoint.Endpoint
	for _, a := range []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"} {
		eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(a), Weight: endpoint.DefaultWeight})
	}
	p.Update(eps)
	for _, tc := range []struct {
		name  string
		tried []int
		ok    bool
	}{
		{"none tried", nil, true},
		{"one tried", []int{0}, true},
		{"two tried", []int{0, 2}, true},
		{"all tried", []int{0, 1, 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 200 {
				tr := new(Tried)
				for _, i := range tc.tried {
					tr.Add(eps[i].Addr)
				}
				k, ok := p.PickExcluding(tr, true)
				require.Equal(t, tc.ok, ok)
				if !ok {
					continue
				}
				for _, i := range tc.tried {
					assert.NotEqual(t, eps[i].Addr, k.Endpoint().Addr)
				}
				assert.True(t, tr.Has(k.Endpoint().Addr), "the choice is recorded")
				k.Done(Result{GRPCStatus: -1, HTTPStatus: 200})
			}
		})
	}
	tr := new(Tried)
	k, ok := p.PickExcluding(tr, false)
	require.True(t, ok)
	assert.Equal(t, 1, tr.Len())
	k.Done(Result{GRPCStatus: -1, HTTPStatus: 200})
}
