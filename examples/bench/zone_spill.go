package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/mesh"
	"go.opentelemetry.io/otel/metric/noop"
)

// zoneSpill: two zones of three loopback endpoints each, every endpoint
// answering with its zone after its zone's delay (10 ms), through
// mesh.NewClient with a static endpoint source whose endpoints carry
// Labels["zone"] and mesh.WithZone("zone-a"). Each round measures the
// route's requests one after the other in normal load, then with zone-a's
// endpoints slowed tenfold (after the requests that teach the balancer,
// until a window of ten has all left the zone), then after zone-a
// recovers (until a window of 50 is back in it). The figure is the p99
// while zone-a is slow over the p99 in normal load (goal: at most twice);
// the share of requests leaving the zone in normal load (goal: at most
// 5%) and the share back in zone after recovery are extra figures.
func zoneSpill(o options) (*result, error) {
	const normal = 10 * time.Millisecond
	var delayA atomic.Int64
	delayA.Store(int64(normal))
	var eps []endpoint.Endpoint
	for _, zone := range []string{"zone-a", "zone-b"} {
		for range 3 {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				d := normal
				if zone == "zone-a" {
					d = time.Duration(delayA.Load())
				}
				time.Sleep(d)
				_, _ = io.WriteString(w, zone)
			}))
			defer srv.Close()
			eps = append(eps, endpoint.Endpoint{Addr: netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")),
				Weight: endpoint.DefaultWeight, Labels: map[string]string{balancer.ZoneLabel: zone}})
		}
	}
	const authority = "web.bench:80"
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{authority: eps})
	if err != nil {
		return nil, err
	}
	// A peak-EWMA decay of 3 s (default 10 s) lets traffic return to the
	// recovered zone within seconds, so that a round stays short.
	client := mesh.NewClient(mesh.WithEndpoints(src), mesh.WithoutPolicies(), mesh.WithZone("zone-a"),
		mesh.WithMeterProvider(noop.NewMeterProvider()),
		mesh.WithBalancerOptions(balancer.WithPeakEWMA(0, 3*time.Second), balancer.WithFallback(false)))
	defer client.Close()

	// run sends n requests one after the other: their figures and how many
	// were answered from outside zone-a.
	run := func(n int) (figures, int, error) {
		lat := make([]time.Duration, n)
		out := 0
		start := time.Now()
		for i := range n {
			t0 := time.Now()
			resp, err := client.RoundTrip(get("http://"+authority+"/", ""))
			if err != nil {
				return figures{}, 0, err
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return figures{}, 0, err
			}
			if resp.StatusCode != http.StatusOK {
				return figures{}, 0, fmt.Errorf("zone_spill: status %d: %s", resp.StatusCode, b)
			}
			lat[i] = time.Since(t0)
			if string(b) != "zone-a" {
				out++
			}
		}
		f := figures{NsPerOp: float64(time.Since(start).Nanoseconds()) / float64(n), Requests: float64(n)}
		f.P50, f.P99 = percentiles(lat)
		return f, out, nil
	}
	// until sends windows of n requests until ok says one is as wanted
	// (at most 60 s); it returns the last window's count out of zone-a.
	until := func(n int, ok func(out int) bool, what string) (int, error) {
		end := time.Now().Add(60 * time.Second)
		for {
			_, out, err := run(n)
			if err != nil || ok(out) {
				return out, err
			}
			if time.Now().After(end) {
				return out, fmt.Errorf("zone_spill: %s not within 60 s (last window: %d of %d out of zone-a)", what, out, n)
			}
		}
	}

	size := o.scale(300, 200)
	if _, _, err := run(20); err != nil { // connections up
		return nil, err
	}
	var rs rounds
	var outNormal, backIn, returnSecs []float64
	for range o.roundsAtMost(3) {
		delayA.Store(int64(normal))
		fn, out, err := run(size)
		if err != nil {
			return nil, err
		}
		outNormal = append(outNormal, float64(out)/float64(size))

		delayA.Store(int64(10 * normal))
		if _, err := until(10, func(out int) bool { return out == 10 }, "spill"); err != nil {
			return nil, err
		}
		fs, _, err := run(size)
		if err != nil {
			return nil, err
		}

		delayA.Store(int64(normal))
		t0 := time.Now()
		last, err := until(50, func(out int) bool { return out <= 50*5/100 }, "return")
		if err != nil {
			return nil, err
		}
		returnSecs = append(returnSecs, time.Since(t0).Seconds())
		backIn = append(backIn, 1-float64(last)/50)
		rs = append(rs, []figures{fs, fn})
	}
	if len(rs) == 0 {
		return nil, errors.New("zone_spill: no rounds")
	}
	share := func(name string, g goal, v []float64) ratio {
		return ratio{Name: name, Ratio: median(v), Goal: g, Spread: spread{slices.Min(v), slices.Max(v)}}
	}
	r := &result{
		ratio:     rs.ratio("", atMost(2.0), func(f []figures) float64 { return f[0].P99 / f[1].P99 }),
		Candidate: rs.median(0), Baseline: rs.median(1),
		Extra: []ratio{
			share("share of requests leaving zone-a in normal load", atMost(0.05), outNormal),
			share("share back in zone-a after recovery (window of 50)", atLeast(0.95), backIn),
		},
	}
	r.Note = fmt.Sprintf("ratio = p99 with zone-a slowed tenfold (100 ms) / p99 in normal load (10 ms everywhere); 3+3 endpoints, mesh.NewClient with WithZone; traffic back in zone-a within %.1f s of recovery (median)", median(returnSecs))
	return r, nil
}
