package faults

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/regtest"
	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// sumWhere sums the data points of the counter name read from r whose
// attribute key is value (every point when key is "").
func sumWhere(t *testing.T, r *sdkmetric.ManualReader, name, key, value string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	var sum int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != name {
				continue
			}
			for _, p := range d.DataPoints {
				if v, ok := p.Attributes.Value(attribute.Key(key)); key == "" || ok && v.AsString() == value {
					sum += p.Value
				}
			}
		}
	}
	return sum
}

const (
	hmWeb    = "web.default.svc.cluster.local:7101"
	hmShadow = "shadow.default.svc.cluster.local:7102"
	// hmShare is the route's share of extra load for hedges.
	hmShare = 0.1
)

// hmManifests: web's HTTPRoute hedges after 30 ms, within 10% extra load,
// and mirrors every request to shadow.
var hmManifests = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {ports: [{name: http, port: 7101}]}
---
apiVersion: v1
kind: Service
metadata: {name: shadow, namespace: default}
spec: {ports: [{name: http, port: 7102}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: web
  namespace: default
  annotations: {hedge.inmesh.io/delay: 30ms, hedge.inmesh.io/max-extra-load: "` + strconv.Itoa(int(hmShare*100)) + `%"}
spec:
  parentRefs: [{group: core, kind: Service, name: web, port: 7101}]
  rules:
  - filters:
    - type: RequestMirror
      requestMirror:
        backendRef: {name: shadow, port: 7102}
    backendRefs: [{name: web, port: 7101}]
`

// arrivals records which endpoint saw which request (by its x-id).
type arrivals struct {
	mu sync.Mutex
	by map[string][]string
}

func (a *arrivals) add(id, endpoint string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.by[id] = append(a.by[id], endpoint)
}

// resetter accepts connections and resets them at once: a backend that is
// there but dead.
func resetter(t *testing.T) *net.TCPListener {
	t.Helper()
	lis, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	go func() {
		for {
			c, err := lis.AcceptTCP()
			if err != nil {
				return
			}
			_ = c.SetLinger(0)
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close() })
	return lis
}

// Hedging and mirroring on one route (regtest's control plane serves the
// HTTPRoute: hedge after 30 ms within 10% extra load, mirror every request
// to shadow) while web's backends misbehave: of its three endpoints one
// answers at once, one after 100 ms (so that requests are hedged), and one
// fails one request in eight with a 503 and resets the connection of
// another; shadow resets every connection, then is gone (nothing
// listens). Requests go from 4 workers. The caller gets one answer for
// each request and no failure the flaky endpoint did not make itself (the
// dead mirror costs the primaries nothing); the route's request counter
// counts each request once, the mirror's counter each copy once, none a
// success; no endpoint sees a request twice, and the requests seen by two
// endpoints are no more than the hedges sent, which are within the route's
// share (10% of the requests, plus the burst of 10 it may have saved); afterwards the process's
// goroutines are back at their baseline.
func TestHedgesAndMirrorsWithFailingBackends(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	cp := regtest.Start(t, hmManifests)

	seen := &arrivals{by: map[string][]string{}}
	var flakyFailed, flakyN atomic.Int64
	backend := func(name string, h func(w http.ResponseWriter, r *http.Request)) endpoint.Endpoint {
		addr := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen.add(r.Header.Get("X-Id"), name)
			h(w, r)
		}), nil)
		return endpoint.Endpoint{Addr: netip.MustParseAddrPort(addr), Labels: map[string]string{"pod": name}}
	}
	fast := backend("fast", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fast") })
	slow := backend("slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(100 * time.Millisecond):
			io.WriteString(w, "slow")
		case <-r.Context().Done(): // the hedge won
		}
	})
	flaky := backend("flaky", func(w http.ResponseWriter, r *http.Request) {
		switch flakyN.Add(1) % 8 {
		case 0:
			flakyFailed.Add(1)
			http.Error(w, "flaky", http.StatusServiceUnavailable)
		case 4:
			flakyFailed.Add(1)
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		default:
			io.WriteString(w, "flaky")
		}
	})
	shadow := resetter(t)
	cp.Store.PutEndpoints(hmWeb, []endpoint.Endpoint{fast, slow, flaky})
	cp.Store.PutEndpoints(hmShadow, []endpoint.Endpoint{{Addr: netip.MustParseAddrPort(shadow.Addr().String())}})

	// The baseline is taken before the caller exists, and the caller is
	// closed (its pools, its watches) before the check.
	base := measure()
	t.Logf("baseline: %v", base)
	dst, err := destination.Dial(cp.Addr, destination.WithLogger(quiet))
	require.NoError(t, err)
	client := inmesh.NewClient(inmesh.WithDestination(dst), inmesh.WithLogger(quiet), inmesh.WithMeterProvider(mp),
		inmesh.WithBalancerOptions(balancer.WithFallback(false)))
	closeClient := sync.OnceFunc(func() {
		client.Close()
		dst.Close()
	})
	t.Cleanup(closeClient)
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}

	type outcome struct {
		code int
		err  error
	}
	var mu sync.Mutex
	outcomes := map[string]outcome{}
	var ids atomic.Int64
	send := func() {
		id := strconv.FormatInt(ids.Add(1), 10)
		req, _ := http.NewRequest("GET", "http://"+hmWeb+"/", nil)
		req.Header.Set("X-Id", id)
		o := outcome{}
		resp, err := hc.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			o.code = resp.StatusCode
		}
		o.err = err
		mu.Lock()
		outcomes[id] = o
		mu.Unlock()
	}
	// The route is in force once its mirror is: the first copies reach
	// shadow's resets.
	require.Eventually(t, func() bool {
		send()
		return sumWhere(t, reader, "outbound_http_route_mirror_requests_total", "", "") > 0
	}, timeout, 20*time.Millisecond, "the route's mirror never came into force")
	// The first requests' copies are counted once they ended: two
	// readings alike, a tenth of a second apart.
	mirrorSum := func() int64 { return sumWhere(t, reader, "outbound_http_route_mirror_requests_total", "", "") }
	last := int64(-1)
	require.Eventually(t, func() bool {
		now := mirrorSum()
		settled := now == last
		last = now
		return settled
	}, timeout, 100*time.Millisecond)
	sent0, mirrored0 := ids.Load(), last
	hedges0 := sumWhere(t, reader, "outbound_http_route_hedge_requests_total", "", "")
	wins0 := sumWhere(t, reader, "outbound_http_route_hedge_wins_total", "", "")
	statuses0 := sumWhere(t, reader, "outbound_http_route_request_statuses_total", "", "")
	mu.Lock()
	clear(outcomes)
	mu.Unlock()
	seen.mu.Lock()
	clear(seen.by)
	seen.mu.Unlock()
	flakyFailed.Store(0)

	n := size(20000, 800)
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				send()
			}
		}()
	}
	for i := range n {
		if i == n/2 {
			shadow.Close() // shadow goes away: its port refuses
		}
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	total := int(ids.Load() - sent0)

	mu.Lock()
	codes := map[string]int{}
	var failed int
	for _, o := range outcomes {
		k := strconv.Itoa(o.code)
		if o.err != nil {
			k = "error"
		}
		codes[k]++
		if o.err != nil || o.code != 200 {
			failed++
		}
	}
	mu.Unlock()
	seen.mu.Lock()
	// Go's http.Transport sends a GET again, once, to the same address
	// when a reused connection ends before any answer: the flaky
	// endpoint's resets. Those are told apart; any other endpoint seeing
	// a request twice would be the mesh's doing.
	twice, atOneTwice, flakyAgain := 0, 0, 0
	for _, eps := range seen.by {
		distinct := map[string]bool{}
		for _, e := range eps {
			switch {
			case !distinct[e]:
				distinct[e] = true
			case e == "flaky":
				flakyAgain++
			default:
				atOneTwice++
			}
		}
		if len(distinct) > 1 {
			twice++
		}
	}
	seen.mu.Unlock()
	hedges := sumWhere(t, reader, "outbound_http_route_hedge_requests_total", "", "") - hedges0
	wins := sumWhere(t, reader, "outbound_http_route_hedge_wins_total", "", "") - wins0
	perEndpoint := map[string]int{}
	seen.mu.Lock()
	for _, eps := range seen.by {
		for _, e := range eps {
			perEndpoint[e]++
		}
	}
	seen.mu.Unlock()
	statuses := sumWhere(t, reader, "outbound_http_route_request_statuses_total", "", "") - statuses0
	var mirrored, mirrorOK int64
	require.Eventually(t, func() bool {
		mirrored = mirrorSum() - mirrored0
		return mirrored >= int64(total)
	}, timeout, 20*time.Millisecond, "copies still to be counted")
	mirrorOK = sumWhere(t, reader, "outbound_http_route_mirror_requests_total", "result", "success")
	share := int64(math.Ceil(hmShare*float64(total))) + hedge.Burst
	t.Logf("%d requests: %v; flaky endpoint failed %d (sent again by http.Transport after a reset: %d); hedges sent %d (won %d, share allows %d); arrivals by endpoint %v; requests seen by two endpoints %d; route statuses counted %d; mirror copies counted %d (%d success)",
		total, codes, flakyFailed.Load(), flakyAgain, hedges, wins, share, perEndpoint, twice, statuses, mirrored, mirrorOK)

	assert.Equal(t, total, len(outcomes), "one answer for each request")
	assert.LessOrEqual(t, int64(failed), flakyFailed.Load(), "failures the flaky endpoint did not make (the dead mirror's?)")
	assert.Positive(t, codes["200"], "no request succeeded")
	assert.Positive(t, perEndpoint["flaky"], "the flaky endpoint got no request")
	assert.Equal(t, int64(total), statuses, "the route counts each request once")
	assert.Equal(t, int64(total), mirrored, "the mirror counts each copy once")
	assert.Zero(t, mirrorOK, "a dead mirror answered")
	assert.Zero(t, atOneTwice, "an endpoint saw a request twice")
	assert.Positive(t, hedges, "no hedge was sent (the slow endpoint takes 100 ms, the delay is 30 ms)")
	assert.LessOrEqual(t, int64(twice), hedges, "requests seen twice beyond the hedges sent")
	assert.LessOrEqual(t, hedges, share, "hedges beyond the route's share")

	closeClient()
	backToBaseline(t, base, 10, 16, nil)
}
