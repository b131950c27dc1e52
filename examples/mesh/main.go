// Command mesh runs the whole of inmesh in one process on loopback: an
// embedded control plane serving the books ServiceProfile and the authors
// HTTPRoutes shipped beside this file (Destination and OutboundPolicies
// APIs), the application behind the inbound stack of one peer, and the
// outbound stack of another peer sending both services a load of requests
// over one HTTP/2 connection (orig-proto). It then prints the per-route
// tables of both models, like `linkerd viz routes` for the profile's
// routes and `linkerd viz stat-outbound` for the HTTPRoutes, and exits.
//
//	go run ./examples/mesh                 # a few seconds of load, then the table
//	go run ./examples/mesh -serve          # keep running: /metrics, /dashboard/ and /tap on -metrics
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

	"github.com/inmesh/inmesh/dashboard"
	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/controlplane"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/examples/internal/telemetry"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
)

//go:embed books.yaml
var booksProfile []byte

//go:embed authors.yaml
var authorsRoutes []byte

const (
	authority = "books.default.svc.cluster.local:7000"
	authors   = "authors.default.svc.cluster.local:7001"
)

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
	manifests, err := manifest.Parse(authorsRoutes)
	if err != nil {
		return fmt.Errorf("authors.yaml: %w", err)
	}
	store := controlplane.NewStore()
	store.SetServiceProfiles(sps)
	store.SetManifests(manifests)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(log)).Register(grpcSrv)
	go grpcSrv.Serve(lis)
	defer grpcSrv.Stop()
	dst, err := destination.Dial(lis.Addr().String(), destination.WithBackoff(policy), destination.WithLogger(log))
	if err != nil {
		return err
	}
	defer dst.Close()
	// Both peers publish their requests to one tap, which the dashboard
	// of -serve shows.
	hub := tap.NewHub()
	opts := []mesh.Option{mesh.WithDestination(dst), mesh.WithMeterProvider(provider), mesh.WithLogger(log), mesh.WithTap(hub)}

	// The identity plane: each peer gets its certificate over Linkerd's
	// Identity API from the embedded issuer, and the peers talk mTLS.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ids, err := startIdentities()
	if err != nil {
		return err
	}
	defer ids.Stop()
	booksLocal, err := ids.Certify(ctx, booksID, "books-token")
	if err != nil {
		return err
	}
	webLocal, err := ids.Certify(ctx, webID, "web-token")
	if err != nil {
		return err
	}

	// The server peer: the books app behind the inbound stack, on one port
	// for HTTP/1, h2c and meshed mTLS. It notes the client identities the
	// app is told of.
	var seen sync.Map
	app := booksapp.Handler(500 * time.Millisecond)
	inbound := mesh.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("L5d-Client-Id"), true)
		app.ServeHTTP(w, r)
	}), append(mesh.ServerOptions(opts...), mesh.WithIdentity(booksLocal))...)
	defer inbound.Close()
	var peerConns atomic.Int32
	peer := httptest.NewUnstartedServer(nil)
	peer.Config = origproto.NewServer(inbound)
	peer.Config.ErrorLog = proxylog.New(log, "inbound").ErrorLog()
	peer.Listener = inbound.Listener(peer.Listener)
	peer.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			peerConns.Add(1)
		}
	}
	peer.Start()
	defer peer.Close()
	peerAddr := netip.MustParseAddrPort(strings.TrimPrefix(peer.URL, "http://"))
	booksEndpoint := endpoint.Endpoint{Addr: peerAddr, H2: true, Labels: map[string]string{"pod": "books-0"}, Identity: booksID}
	store.PutEndpoints(authority, []endpoint.Endpoint{booksEndpoint})
	store.PutEndpoints(authors, []endpoint.Endpoint{booksEndpoint})
	adminAddr, stopAdmin, err := startAdmin(booksLocal, provider, log)
	if err != nil {
		return err
	}
	defer stopAdmin()
	store.PutEndpoints(adminAuthority, []endpoint.Endpoint{{Addr: adminAddr, H2: true, Identity: booksID}})
	fmt.Fprintf(out, "control plane on %s, identity on %s, books peer on %s\n", lis.Addr(), ids.Addr(), peer.Listener.Addr())

	// The client peer.
	client := mesh.NewClient(append(mesh.ClientOptions(opts...), mesh.WithIdentity(webLocal))...)
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}
	if err := waitForRoutes(hc, client.Router()); err != nil {
		return err
	}

	fmt.Fprintf(out, "load: %d clients for %v\n", o.workers, o.duration)
	sent := load(hc, o, out)
	if isTerminal(out) {
		fmt.Fprint(out, "\r") // over the progress line
	}
	fmt.Fprintf(out, "%d requests sent; %d connection(s) between the peers\n", sent, peerConns.Load())
	fmt.Fprintf(out, "mTLS: the client %s reached the server %s; the app saw l5d-client-id %s\n\n",
		webLocal.Name(), booksLocal.Name(), seenIDs(&seen))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return err
	}
	printRoutes(out, rm, o.duration)
	fmt.Fprintln(out)
	printPolicyRoutes(out, rm, o.duration)
	fmt.Fprintln(out)

	// The admin port's inbound policy: web is allowed (then limited past
	// its rate), a client with another identity is denied.
	reviewsLocal, err := ids.Certify(ctx, reviewsID, "reviews-token")
	if err != nil {
		return err
	}
	reviews := mesh.NewClient(append(mesh.ClientOptions(opts...), mesh.WithIdentity(reviewsLocal))...)
	defer reviews.Close()
	printAdmin(out, tryAdmin(hc, 20), tryAdmin(&http.Client{Transport: reviews, Timeout: 10 * time.Second}, 3))

	if o.serve {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler)
		dash := dashboard.New(hub, dashboard.WithBalancer(client.Balancer()), dashboard.WithIdentity(webLocal),
			dashboard.WithDestination(dst, lis.Addr().String()), dashboard.WithName("demo: web calling books"))
		defer dash.Close()
		mux.Handle("/dashboard/", http.StripPrefix("/dashboard", dash))
		mux.Handle("/tap", dash)
		srv := &http.Server{Addr: o.metricsAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			srv.Shutdown(context.Background())
		}()
		fmt.Fprintf(out, "\nserving /metrics, /dashboard/ and /tap on %s; Ctrl-C to stop\n", o.metricsAddr)
		go load(hc, options{duration: math.MaxInt64, workers: 2}, io.Discard)
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	return nil
}

// seenIDs lists the client identities the app was told of.
func seenIDs(seen *sync.Map) string {
	var ids []string
	seen.Range(func(k, _ any) bool {
		id := k.(string)
		if id == "" {
			id = "(none)"
		}
		ids = append(ids, id)
		return true
	})
	sort.Strings(ids)
	return strings.Join(ids, ", ")
}

// waitForRoutes sends requests until the router routes books by its
// profile and authors by its HTTPRoutes.
func waitForRoutes(hc *http.Client, r *router.Router) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, a := range []string{authority, authors} {
			if resp, err := hc.Get("http://" + a + "/"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		if r.Explain(httptest.NewRequest("GET", "http://"+authority+"/books", nil)).Model == router.ModelProfile &&
			r.Explain(httptest.NewRequest("GET", "http://"+authors+"/authors", nil)).Model == router.ModelPolicy {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the profile or the HTTPRoutes never arrived")
}

var requests = []struct{ authority, method, path string }{
	{authority, "GET", "/books"}, {authority, "GET", "/books/1"}, {authority, "GET", "/books/2"}, {authority, "POST", "/books"},
	{authority, "GET", "/flaky"}, {authority, "GET", "/slow"}, {authority, "GET", "/books/3"}, {authority, "GET", "/books"},
	{authors, "GET", "/authors"}, {authors, "GET", "/authors/herbert"}, {authors, "GET", "/flaky"},
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
				req, _ := http.NewRequest(r.method, "http://"+r.authority+r.path, strings.NewReader(`{"title":"dune"}`))
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
	// On a terminal one progress line is rewritten in place; elsewhere (a
	// file, a pipe, a test's buffer) each is a plain line, less often, so
	// that captured output stays readable line by line.
	terminal, every := isTerminal(out), time.Second
	if terminal {
		every = 500 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return sent.Load()
		case <-tick.C:
			if terminal {
				fmt.Fprintf(out, "\r  %d requests, %s left   ", sent.Load(), remaining(time.Until(stop)))
			} else {
				fmt.Fprintf(out, "  %d requests, %s left\n", sent.Load(), remaining(time.Until(stop)))
			}
		}
	}
}

// isTerminal reports whether w is a character device such as a terminal,
// where a progress line can be rewritten with a carriage return.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// remaining is the countdown shown while the load runs: whole seconds, never
// below zero (the last requests finish after the deadline).
func remaining(d time.Duration) time.Duration {
	return max(d, 0).Round(time.Second)
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
	fmt.Fprintf(out, "books (ServiceProfile routes)\n")
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

// printPolicyRoutes prints the outbound_http_route_* series as `linkerd
// viz stat-outbound` does: per route, the success rate (no error and no
// 5xx), the request rate, the retries and latency percentiles. The
// family's buckets are Linkerd's, coarse (50ms, 500ms, 1s, 10s): a
// percentile is shown as the bound of its bucket.
func printPolicyRoutes(out io.Writer, rm metricdata.ResourceMetrics, d time.Duration) {
	stats := map[string]*routeStats{}
	retries := map[string]float64{}
	get := func(attrs attribute.Set) *routeStats {
		v, _ := attrs.Value("route_name")
		if stats[v.AsString()] == nil {
			stats[v.AsString()] = &routeStats{}
		}
		return stats[v.AsString()]
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					switch m.Name {
					case "outbound_http_route_request_statuses_total":
						s := get(p.Attributes)
						s.total += float64(p.Value)
						errv, _ := p.Attributes.Value("error")
						status, _ := p.Attributes.Value("http_status")
						if errv.AsString() == "" && !strings.HasPrefix(status.AsString(), "5") {
							s.success += float64(p.Value)
						}
					case "outbound_http_route_retry_requests_total":
						v, _ := p.Attributes.Value("route_name")
						retries[v.AsString()] += float64(p.Value)
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name != "outbound_http_route_request_duration_seconds" {
					continue
				}
				for _, p := range data.DataPoints {
					s := get(p.Attributes)
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
	fmt.Fprintf(out, "authors (HTTPRoutes)\n")
	fmt.Fprintf(out, "%-18s %8s %8s %8s %10s %10s %10s\n", "ROUTE", "SUCCESS", "RPS", "RETRIES", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99")
	for _, n := range names {
		s := stats[n]
		if s.total == 0 {
			continue
		}
		fmt.Fprintf(out, "%-18s %7.2f%% %6.1frps %8.0f %11s %11s %11s\n", n,
			100*s.success/s.total, s.total/d.Seconds(), retries[n],
			bucketBound(0.5, s), bucketBound(0.95, s), bucketBound(0.99, s))
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

// bucketBound returns the upper bound of the bucket holding quantile q, in
// milliseconds, as "<=50ms".
func bucketBound(q float64, s *routeStats) string {
	var total uint64
	for _, c := range s.buckets {
		total += c
	}
	rank := q * float64(total)
	var seen uint64
	for i, c := range s.buckets {
		seen += c
		if float64(seen) >= rank && c > 0 {
			if i == len(s.bounds) {
				return fmt.Sprintf(">%gms", 1000*s.bounds[i-1])
			}
			return fmt.Sprintf("<=%gms", 1000*s.bounds[i])
		}
	}
	return "-"
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
