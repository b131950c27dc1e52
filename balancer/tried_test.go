package balancer

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
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

// A hedge's pick counts in the zone series as any pick does: the second
// attempt of a hedged request, sent out of the zone, shows as a request
// that left it.
func TestHedgePickCountsItsZone(t *testing.T) {
	a, b := backend(t, "a"), backend(t, "b")
	a.Labels = map[string]string{ZoneLabel: "zone-a"}
	b.Labels = map[string]string{ZoneLabel: "zone-b"}
	m := testutil.NewMetrics(t)
	_, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{books + ":80": {a, b}}),
		WithLocalZone("zone-a"), WithMeterProvider(m.Provider))
	tried := new(Tried)
	tried.Add(a.Addr)
	req, err := http.NewRequestWithContext(WithTried(context.Background(), tried, true), http.MethodGet, "http://"+books+"/", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "b ", "the hedge went to the untried endpoint")
	assert.Equal(t, "1", m.Value(t, "outbound_http_balancer_zone_requests_total", `zone_locality="remote"`))
}
