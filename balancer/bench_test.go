package balancer

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func benchSnapshot(n int) *snapshot {
	eps := make([]endpoint.Endpoint, n)
	for i := range eps {
		eps[i] = ep(fmt.Sprintf("10.0.%d.%d:80", i/256, i%256))
	}
	return newSnapshot(endpoint.Update{Set: &endpoint.Set{Exists: true, Endpoints: eps}}, &snapshot{}, float64(DefaultRTT), 1, false, "")
}

// A pick allocates nothing.
func TestPickAllocs(t *testing.T) {
	s := benchSnapshot(10)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { s.pick(2, float64(DefaultDecay)) }))
	s.health = true // picks that check each endpoint's health
	s.eps[3].load.health.tripped, s.eps[3].load.health.until = true, 1<<62
	assert.Zero(t, testing.AllocsPerRun(1000, func() { s.pick(2, float64(DefaultDecay)) }))
	sp := NewSplit([]endpoint.WeightedDst{{Authority: "a.ns:80", Weight: 1}, {Authority: "b.ns:80", Weight: 3}})
	assert.Zero(t, testing.AllocsPerRun(1000, func() { sp.Pick() }))
}

// A Pool's pick and its result, classified for failure accrual, allocate
// nothing.
func TestPoolDoneAllocs(t *testing.T) {
	var clock fakeClock
	p := NewPool(nil, withClock(clock.read), WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{}}))
	p.Update([]endpoint.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:1")}, {Addr: netip.MustParseAddrPort("127.0.0.1:2")}})
	for _, r := range []Result{{GRPCStatus: 0}, {GRPCStatus: 5}, {GRPCStatus: -1, HTTPStatus: 200}} {
		assert.Zero(t, testing.AllocsPerRun(1000, func() {
			k, _ := p.Pick()
			k.Done(r)
		}), "%+v", r)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{2, 100} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := benchSnapshot(n)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					s.pick(2, float64(DefaultDecay))
				}
			})
		})
	}
}

// Finding a known authority's state on the request path allocates nothing.
func TestLookupAllocs(t *testing.T) {
	b := New(staticSource(t, nil), WithLogger(quietLogger))
	defer b.Close()
	require.NotNil(t, lookup(b, "books.ns:7000"))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { b.table.lookup("books.ns:7000") }))
}

// BenchmarkRoundTrip measures a request through the Balancer to one of
// ten live endpoints, over a base that answers at once: the Balancer's
// own cost per request, serially and from many goroutines. With
// removals=true it counts the requests to each address, as mesh.NewClient
// has it do.
func BenchmarkRoundTrip(b *testing.B) {
	eps := make([]endpoint.Endpoint, 10)
	for i := range eps {
		eps[i] = ep(fmt.Sprintf("10.0.0.%d:80", i+1))
	}
	for _, removals := range []bool{false, true} {
		opts := []Option{WithLogger(quietLogger)}
		if removals {
			opts = append(opts, WithEndpointRemoved(func(netip.AddrPort) {}))
		}
		src, err := NewStaticSource(map[string][]endpoint.Endpoint{"books.ns:80": eps})
		if err != nil {
			b.Fatal(err)
		}
		bal := New(src, opts...)
		rt := bal.Transport(roundTrip(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
		}))
		get := func() {
			req, _ := http.NewRequest("GET", "http://books.ns/", nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		get() // the first answer
		b.Run(fmt.Sprintf("removals=%t/serial", removals), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				get()
			}
		})
		b.Run(fmt.Sprintf("removals=%t/parallel", removals), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get()
				}
			})
		})
		bal.Close()
	}
}

// BenchmarkBytesPerName reports the live heap that the Balancer keeps for
// each of many Services with one endpoint each (bytes/name), after one
// request to each: its authority, snapshot, endpoint labels and series,
// as a client holds them for each of thousands of watched names.
func BenchmarkBytesPerName(b *testing.B) {
	const names = 2000
	sets := make(map[string][]endpoint.Endpoint, names)
	for i := range names {
		sets[fmt.Sprintf("svc-%d.table.svc.cluster.local:80", i)] = []endpoint.Endpoint{ep("10.0.0.1:80")}
	}
	src, err := NewStaticSource(sets)
	if err != nil {
		b.Fatal(err)
	}
	base := roundTrip(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	})
	for b.Loop() {
		b.StopTimer()
		// A provider of its own each time: the series of an earlier
		// round would otherwise be found, not made.
		m := testutil.NewMetrics(b)
		before := liveHeap()
		bal := New(src, WithLogger(quietLogger), WithMeterProvider(m.Provider), WithMaxAuthorities(names))
		rt := bal.Transport(base)
		b.StartTimer()
		for i := range names {
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://svc-%d.table.svc.cluster.local/", i), nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
		b.StopTimer()
		b.ReportMetric(float64(int64(liveHeap())-int64(before))/names, "bytes/name")
		bal.Close()
		b.StartTimer()
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
