// Command mesh runs the whole of inmesh in one process on loopback: an
// embedded Destination control plane serving the books ServiceProfile
// shipped beside this file, the books application behind the inbound stack
// of one peer, and the outbound stack of another peer sending it a load of
// requests over one HTTP/2 connection (orig-proto). It then prints a
// per-route table like `linkerd viz routes` and exits.
//
//	go run ./examples/mesh                 # a few seconds of load, then the table
//	go run ./examples/mesh -serve          # keep running, /metrics on -metrics
//
// The control-plane backoff can be set with INMESH_CONTROL_EXP_BACKOFF_MIN,
// _MAX and _JITTER, or INMESH_CONTROL_BACKOFF_DELAY.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/examples/internal/telemetry"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
)

//go:embed books.yaml
var booksProfile []byte

const authority = "books.default.svc.cluster.local:7000"

type options struct {
	duration    time.Duration
	workers     int
	serve       bool
	metricsAddr string
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "how long the load runs")
	flag.IntVar(&o.workers, "workers", 8, "concurrent clients")
	flag.BoolVar(&o.serve, "serve", false, "keep running after the table, with /metrics exposed")
	flag.StringVar(&o.metricsAddr, "metrics", "127.0.0.1:4191", "metrics address with -serve")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mesh:", err)
		os.Exit(1)
	}
}

func run(o options, out io.Writer) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	policy, err := backoff.FromEnv("INMESH_CONTROL", backoff.DefaultPolicy())
	if err != nil {
		return err
	}
	reader := sdkmetric.NewManualReader()
	metrics, err := telemetry.New(0, reader)
	if err != nil {
		return err
	}
	provider := metrics.Provider
	defer provider.Shutdown(context.Background())

	// The embedded control plane.
	sps, err := profiles.ParseServiceProfiles(booksProfile)
	if err != nil {
		return fmt.Errorf("books.yaml: %w", err)
	}
	store := destination.NewStore()
	store.SetServiceProfiles(sps)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer()
	destination.NewServer(store, destination.WithLogger(log)).Register(grpcSrv)
	go grpcSrv.Serve(lis)
	defer grpcSrv.Stop()
	dst, err := destination.Dial(lis.Addr().String(), destination.WithBackoff(policy), destination.WithLogger(log))
	if err != nil {
		return err
	}
	defer dst.Close()
	opts := []mesh.Option{mesh.WithDestination(dst), mesh.WithMeterProvider(provider), mesh.WithLogger(log)}

	// The server peer: the books app behind the inbound stack, on one port
	// for HTTP/1 and h2c.
	inbound := mesh.NewServer(booksapp.Handler(500*time.Millisecond), opts...)
	defer inbound.Close()
	var peerConns atomic.Int32
	peer := httptest.NewUnstartedServer(nil)
	peer.Config = origproto.NewServer(inbound)
	peer.Config.ErrorLog = proxylog.New(log, "inbound").ErrorLog()
	peer.Listener = origproto.GuardListener(peer.Listener)
	peer.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			peerConns.Add(1)
		}
	}
	peer.Start()
	defer peer.Close()
	store.PutEndpoints(authority, []destination.Endpoint{{
		Addr: netip.MustParseAddrPort(strings.TrimPrefix(peer.URL, "http://")), H2: true,
		Labels: map[string]string{"pod": "books-0"},
	}})
	fmt.Fprintf(out, "control plane on %s, books peer on %s\n", lis.Addr(), peer.Listener.Addr())

	// The client peer.
	client := mesh.NewClient(opts...)
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}
	if err := waitForProfile(hc, client.Profiles()); err != nil {
		return err
	}

	fmt.Fprintf(out, "load: %d clients for %v\n", o.workers, o.duration)
	sent := load(hc, o, out)
	fmt.Fprintf(out, "\r%d requests sent; %d connection(s) between the peers\n\n", sent, peerConns.Load())

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return err
	}
	printRoutes(out, rm, o.duration)

	if o.serve {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler)
		srv := &http.Server{Addr: o.metricsAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			srv.Shutdown(context.Background())
		}()
		fmt.Fprintf(out, "\nserving /metrics on %s; Ctrl-C to stop\n", o.metricsAddr)
		go load(hc, options{duration: math.MaxInt64, workers: 2}, io.Discard)
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	return nil
}

// waitForProfile sends requests until the router routes by the profile.
func waitForProfile(hc *http.Client, router *profiles.Router) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := hc.Get("http://" + authority + "/books"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if t := router.Table(authority); t != nil && len(t.Routes()) > 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the profile never arrived")
}

var requests = []struct{ method, path string }{
	{"GET", "/books"}, {"GET", "/books/1"}, {"GET", "/books/2"}, {"POST", "/books"},
	{"GET", "/flaky"}, {"GET", "/slow"}, {"GET", "/books/3"}, {"GET", "/books"},
}

// load sends requests from o.workers clients for o.duration, printing a
// progress line, and returns how many it sent.
func load(hc *http.Client, o options, out io.Writer) int64 {
	var sent atomic.Int64
	stop := time.Now().Add(o.duration)
	var wg sync.WaitGroup
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(stop); i++ {
				r := requests[i%len(requests)]
				req, _ := http.NewRequest(r.method, "http://"+authority+r.path, strings.NewReader(`{"title":"dune"}`))
				if resp, err := hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				sent.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return sent.Load()
		case <-tick.C:
			fmt.Fprintf(out, "\r  %d requests, %s left   ", sent.Load(), time.Until(stop).Round(time.Second))
		}
	}
}

type routeStats struct {
	success, total, actual float64
	buckets                []uint64
	bounds                 []float64
}

// printRoutes prints the outbound route metrics as `linkerd viz routes`
// does: success rate, effective and actual request rates, latency
// percentiles.
func printRoutes(out io.Writer, rm metricdata.ResourceMetrics, d time.Duration) {
	stats := map[string]*routeStats{}
	get := func(route string) *routeStats {
		if stats[route] == nil {
			stats[route] = &routeStats{}
		}
		return stats[route]
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					route, ok := outboundRoute(p.Attributes)
					if !ok {
						continue
					}
					class, _ := p.Attributes.Value("classification")
					switch m.Name {
					case "route_response_total":
						get(route).total += float64(p.Value)
						if class.AsString() == "success" {
							get(route).success += float64(p.Value)
						}
					case "route_actual_response_total":
						get(route).actual += float64(p.Value)
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name != "route_response_latency_ms" {
					continue
				}
				for _, p := range data.DataPoints {
					route, ok := outboundRoute(p.Attributes)
					if !ok {
						continue
					}
					s := get(route)
					if s.buckets == nil {
						s.buckets, s.bounds = make([]uint64, len(p.BucketCounts)), p.Bounds
					}
					for i, c := range p.BucketCounts {
						s.buckets[i] += c
					}
				}
			}
		}
	}
	names := make([]string, 0, len(stats))
	for n := range stats {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(out, "%-18s %8s %8s %8s %10s %10s %10s\n", "ROUTE", "SUCCESS", "RPS", "ACTUAL", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99")
	for _, n := range names {
		s := stats[n]
		if s.total == 0 {
			continue
		}
		fmt.Fprintf(out, "%-18s %7.2f%% %6.1frps %6.1frps %9.0fms %9.0fms %9.0fms\n", n,
			100*s.success/s.total, s.total/d.Seconds(), s.actual/d.Seconds(),
			quantile(0.5, s), quantile(0.95, s), quantile(0.99, s))
	}
}

// outboundRoute returns the route label of an outbound series.
func outboundRoute(attrs attribute.Set) (string, bool) {
	if dir, _ := attrs.Value("direction"); dir.AsString() != "outbound" {
		return "", false
	}
	if v, ok := attrs.Value("rt_route"); ok {
		return v.AsString(), true
	}
	return "[DEFAULT]", true
}

// quantile estimates a quantile from histogram buckets by linear
// interpolation inside the bucket, as Prometheus's histogram_quantile does.
func quantile(q float64, s *routeStats) float64 {
	var total uint64
	for _, c := range s.buckets {
		total += c
	}
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	var seen uint64
	for i, c := range s.buckets {
		if float64(seen+c) >= rank {
			lo, hi := 0.0, 0.0
			if i > 0 {
				lo = s.bounds[i-1]
			}
			if i < len(s.bounds) {
				hi = s.bounds[i]
			} else {
				return lo // the +Inf bucket
			}
			if c == 0 {
				return hi
			}
			return lo + (hi-lo)*(rank-float64(seen))/float64(c)
		}
		seen += c
	}
	return s.bounds[len(s.bounds)-1]
}
