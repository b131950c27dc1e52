package balancer

import (
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// removals records the addresses a Balancer reports removed.
type removals struct {
	mu    sync.Mutex
	addrs []netip.AddrPort
}

func (r *removals) add(a netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = append(r.addrs, a)
}

func (r *removals) get() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netip.AddrPort(nil), r.addrs...)
}

// openBodies answers every request at once with a body that stays open
// until its reader closes it.
var openBodies = roundTrip(func(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
})

// An address is reported removed once no authority's set holds it and no
// request sent to it is in flight, response body included: not while
// another Service still has it, not while a response from it is being
// read, not when it came back meanwhile, and a forward backend's request
// and one fallen back to the address count as in flight.
func TestEndpointRemovedOnceUnheldAndIdle(t *testing.T) {
	x := netip.MustParseAddrPort("10.0.0.1:80")
	y := netip.MustParseAddrPort("10.0.0.2:80")
	const a, b = "a.ns:80", "b.ns:80"
	src := staticSource(t, map[string][]endpoint.Endpoint{a: {{Addr: x}, {Addr: y}}, b: {{Addr: x}}})
	var got removals
	bal := New(src, WithLogger(quietLogger), WithEndpointRemoved(got.add), WithEndpointRemoved(nil))
	defer bal.Close()
	rt := bal.Transport(openBodies)
	send := func(host string, ctxEp *endpoint.Endpoint) *http.Response {
		req, err := http.NewRequest("GET", "http://"+host+"/", nil)
		require.NoError(t, err)
		if ctxEp != nil {
			req = req.WithContext(WithForward(req.Context(), ctxEp))
		}
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		return resp
	}
	set := func(authority string, n int, eps ...endpoint.Endpoint) {
		require.NoError(t, src.Set(authority, eps))
		require.Eventually(t, func() bool { return len(bal.Endpoints(authority)) == n }, testutil.Timeout, time.Millisecond)
	}
	send(a, nil).Body.Close()
	send(b, nil).Body.Close()

	set(a, 1, endpoint.Endpoint{Addr: y})
	assert.Empty(t, got.get(), "x is still b's")

	inflight := send(b, nil) // to x, its only endpoint
	set(b, 0)
	assert.Empty(t, got.get(), "a response from x is being read")
	io.ReadAll(inflight.Body)
	assert.Equal(t, []netip.AddrPort{x}, got.get(), "its body ended")
	inflight.Body.Close()
	assert.Len(t, got.get(), 1, "reported once")

	// Removed with a request in flight, back before it ends: not removed.
	inflight = send(a, nil) // to y
	set(a, 0)
	set(a, 1, endpoint.Endpoint{Addr: y})
	inflight.Body.Close()
	assert.Len(t, got.get(), 1, "y came back")
	send(a, nil).Body.Close()
	set(a, 0)
	assert.Equal(t, []netip.AddrPort{x, y}, got.get())

	// A forward backend's request to an address that leaves its last set.
	set(a, 1, endpoint.Endpoint{Addr: x})
	fwd := send(x.String(), &endpoint.Endpoint{Addr: x})
	set(a, 0)
	assert.Len(t, got.get(), 2, "a forward request to x is in flight")
	fwd.Body.Close()
	assert.Equal(t, []netip.AddrPort{x, y, x}, got.get())
	// So does a request to x's own address, which no Service names: it
	// falls back to that address, on the connections of the endpoint.
	set(a, 1, endpoint.Endpoint{Addr: x})
	fb := send(x.String(), nil)
	set(a, 0)
	assert.Len(t, got.get(), 3, "a request fallen back to x is in flight")
	fb.Body.Close()
	assert.Equal(t, []netip.AddrPort{x, y, x, x}, got.get())
	// One to an address in no set is never reported.
	send(x.String(), &endpoint.Endpoint{Addr: x}).Body.Close()
	send(x.String(), nil).Body.Close()
	assert.Len(t, got.get(), 4)
	bal.table.addrs.mu.Lock()
	assert.Empty(t, bal.table.addrs.m, "nothing counted is left")
	bal.table.addrs.mu.Unlock()
}

// A released authority's endpoints are removed with it; so are all when
// the Balancer closes.
func TestEndpointRemovedWithItsAuthority(t *testing.T) {
	x := netip.MustParseAddrPort("10.0.0.1:80")
	src := staticSource(t, map[string][]endpoint.Endpoint{"a.ns:80": {{Addr: x}}})
	var got removals
	bal := New(src, WithLogger(quietLogger), WithEndpointRemoved(got.add))
	req, err := http.NewRequest("GET", "http://a.ns/", nil)
	require.NoError(t, err)
	resp, err := bal.Transport(openBodies).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	bal.Close()
	assert.Equal(t, []netip.AddrPort{x}, got.get())
}

// Counting the requests to an address adds no allocation to a request.
func TestEndpointCountAllocs(t *testing.T) {
	src := staticSource(t, map[string][]endpoint.Endpoint{"a.ns:80": {{Addr: netip.MustParseAddrPort("10.0.0.1:80")}}})
	allocs := func(opts ...Option) float64 {
		bal := New(src, append(opts, WithLogger(quietLogger))...)
		defer bal.Close()
		rt := bal.Transport(roundTrip(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		}))
		req, err := http.NewRequest("GET", "http://a.ns/", nil)
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return testing.AllocsPerRun(1000, func() {
			resp, _ := rt.RoundTrip(req)
			resp.Body.Close()
		})
	}
	without, with := allocs(), allocs(WithEndpointRemoved(func(netip.AddrPort) {}))
	t.Logf("allocations per request: %v without counting, %v with", without, with)
	assert.Equal(t, without, with)
}

// A request that picked an endpoint from a snapshot taken just before its
// address left its last set is counted all the same, and its end reports
// the address again (it may have dialled it); if the address came back
// meanwhile, the request counts on the address's current ref.
func TestEndpointRemovedAfterAStalePick(t *testing.T) {
	var got removals
	as := newAddrs([]func(netip.AddrPort){got.add})
	x := netip.MustParseAddrPort("10.0.0.1:80")
	none := &snapshot{}
	set := func() *snapshot { return &snapshot{eps: []*member{{Endpoint: endpoint.Endpoint{Addr: x}}}} }
	s1 := set()
	as.swap(none, s1)
	stale := s1.eps[0]
	as.swap(s1, none)
	assert.Len(t, got.get(), 1, "reported at once: nothing in flight")

	r := as.begin(stale)
	assert.Len(t, got.get(), 1, "in flight")
	as.end(r)
	assert.Len(t, got.get(), 2, "the stale pick ended")

	s2 := set()
	as.swap(none, s2)
	r = as.begin(stale)
	assert.Same(t, s2.eps[0].ref, r, "counted on the current ref")
	as.swap(s2, none)
	assert.Len(t, got.get(), 2, "in flight")
	as.end(r)
	assert.Equal(t, []netip.AddrPort{x, x, x}, got.get())
	assert.Empty(t, as.m)
}
