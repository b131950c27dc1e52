// Command proxy is a small sidecar-style proxy built only from inmesh's
// wrappers around httputil.ReverseProxy.
//
//	go run ./examples/proxy -destination 127.0.0.1:8086 -outbound 127.0.0.1:4140 \
//	    -inbound 127.0.0.1:4143 -app 127.0.0.1:8080 -metrics 127.0.0.1:4191
//
// Outbound (-outbound): HTTP/1 and h2c requests addressed by Host to a
// service authority are resolved through the Destination API, routed by
// their service profile (one with routes) or else their outbound policy
// (HTTPRoute, GRPCRoute; the OutboundPolicies API at -destination, or at
// -policy when another server has it), retried and timed out per route,
// sent over HTTP/2
// with orig-proto when the endpoint is a mesh peer, and forwarded.
// Inbound (-inbound): HTTP/1 and h2c, upgraded requests downgraded, inbound
// route metrics, forwarded to -app (HTTP/2 requests, gRPC among them, over
// h2c, as they came). /metrics serves Prometheus text with
// Linkerd's series names (the outbound_http_balancer_* families among them);
// /endpoints?authority=host:port the balancer's state of each endpoint as
// JSON; /routes?authority=host:port&method=GET&path=/x the JSON explanation
// of how such a request is routed (model, route, match, timeouts, retry and
// budget), and with direction=inbound&client=IP&client_id=ID how the
// inbound policy of -app would treat it (Server, route, authorization or
// denial, limits); /ready answers 200. /dashboard/ is a live page of
// the routes, endpoints, inbound decisions, identity and control plane
// (package dashboard), and /tap a live stream of the requests, one JSON
// object per line (package tap); both answer loopback clients only.
//
// With -register SERVICE:PORT (repeatable), the proxy registers -inbound as
// an endpoint of that Service port with the control plane (package
// registration), over mTLS with its identity at -identity-addr (or
// -registration-addr): peers find it by name with no endpoints file. On
// SIGTERM it deregisters first, waits a second for peers to see it, then
// drains and closes.
//
// -destination (and -policy, -identity-addr) may list several control-plane
// replicas, comma-separated: the proxy uses the first that answers and moves
// to the next live one when it dies, its watches keeping their last state.
//
// The control-plane backoff comes from INMESH_CONTROL_EXP_BACKOFF_MIN, _MAX
// and _JITTER, or the fixed INMESH_CONTROL_BACKOFF_DELAY; a bad value stops
// start-up with a message naming the variable. With a real Linkerd control
// plane, pass -context-token (the pod's LINKERD2_PROXY_DESTINATION_CONTEXT).
//
// With an identity (-identity-name, -identity-token-file,
// -identity-trust-anchors, -identity-addr, -identity-server-name, or
// Linkerd's LINKERD2_PROXY_IDENTITY_* variables), the proxy obtains and
// renews its certificate from the Identity API, reaches every endpoint that
// discovery gives an identity over mTLS verifying it, serves meshed mTLS
// beside plaintext on -inbound (the application sees the client's identity
// in l5d-client-id), and /ready answers 503 until it holds a certificate.
//
// State under hostile traffic is bounded: -max-authorities routed and
// labelled at once, -max-watches per control-plane API, authorities idle for
// -idle-timeout released, connections to -app idle for -app-idle-timeout
// (3s, as Linkerd's proxy) closed. Only names under -search-suffixes (default
// svc.cluster.local.) and addresses in -search-networks (default none) are
// looked up; other Hosts take the default route to their own address
// without a watch. On the inbound side only -local-authority names are
// routed by profile and, once one is given, labelled in the metrics; any
// other Host is labelled authority="other" (without the flag, inbound
// requests are labelled by their Host, as Linkerd's proxy labels them,
// within -max-authorities).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/dashboard"
	"github.com/inmesh/inmesh/tap"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/examples/internal/telemetry"
	"github.com/inmesh/inmesh/internal/cpaddr"
	"github.com/inmesh/inmesh/internal/transport"
	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type flags struct {
	destination, policyAddr, outbound, inbound, app, metrics string
	workload                                                 string
	defaultPolicy, clusterNetworks                           string
	trustLocalhost                                           bool
	contextToken, scheme                                     string
	idleTimeout, discoveryWait, appIdleTimeout, policyWait   time.Duration
	controlKeepalive                                         time.Duration
	maxAuthorities, maxWatches                               int
	local                                                    []string
	suffixes                                                 []string
	networks                                                 []netip.Prefix
	identity                                                 identityFlags
	registration                                             registerFlags
	zone                                                     string
	trace                                                    traceFlags
	pprof                                                    bool
}

func main() {
	var f flags
	flag.StringVar(&f.destination, "destination", "127.0.0.1:8086", "Destination API address, or several control-plane replicas comma-separated (host:port,host:port: the first live one is used, the next on its loss); also OutboundPolicies, unless -policy")
	flag.StringVar(&f.policyAddr, "policy", "", "OutboundPolicies and InboundServerPolicies API address (or comma-separated replicas), when not the -destination one (Linkerd's policy controller)")
	flag.StringVar(&f.workload, "workload", os.Getenv(destination.PolicyWorkloadEnv),
		"this proxy's workload, NS:POD or Linkerd's JSON (default $"+destination.PolicyWorkloadEnv+"): enforces the inbound policy of the -app port")
	flag.StringVar(&f.defaultPolicy, "default-inbound-policy", os.Getenv(envDefaultPolicy),
		"with -workload, the policy of the -app port while no Server selects it or its control plane has not answered within -policy-wait: all-unauthenticated (the default), all-authenticated, cluster-unauthenticated, cluster-authenticated, deny or audit (default $"+envDefaultPolicy+")")
	flag.StringVar(&f.clusterNetworks, "cluster-networks", os.Getenv(envClusterNetworks),
		"comma-separated CIDRs of the cluster-* default inbound policies (default $"+envClusterNetworks+", else Linkerd's: 10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.168.0.0/16)")
	flag.BoolVar(&f.trustLocalhost, "trust-localhost", true,
		"with -workload, admit every request from the loopback, as Linkerd's proxy does in a pod (false when callers share the machine)")
	flag.StringVar(&f.outbound, "outbound", "127.0.0.1:4140", "outbound listener (the application's requests)")
	flag.StringVar(&f.inbound, "inbound", "127.0.0.1:4143", "inbound listener (requests from peers)")
	flag.StringVar(&f.app, "app", "127.0.0.1:8080", "the application's address (HTTP/1, and h2c for requests that arrive as HTTP/2)")
	flag.StringVar(&f.metrics, "metrics", "127.0.0.1:4191", "metrics and readiness listener")
	flag.StringVar(&f.contextToken, "context-token", "", "GetDestination.context_token to send")
	flag.StringVar(&f.scheme, "scheme", "", `GetDestination.scheme to send ("k8s" for 2018 control planes)`)
	flag.DurationVar(&f.idleTimeout, "idle-timeout", 0,
		"release an authority no request used for this long: its watches, endpoints and metric targets (0: the library's defaults)")
	flag.DurationVar(&f.appIdleTimeout, "app-idle-timeout", defaultAppIdleTimeout,
		"close a connection to -app that no request used for this long (Linkerd's proxy: 3s)")
	flag.IntVar(&f.maxAuthorities, "max-authorities", 0,
		"authorities routed, balanced and labelled at once (0: the library's default, 2000)")
	flag.IntVar(&f.maxWatches, "max-watches", 0,
		"control-plane watches open at once, per API (0: the library's default, 2000)")
	flag.Func("local-authority", "one of the application's own authorities (host:port), routed by profile and labelled on the inbound side; repeatable",
		func(s string) error { f.local = append(f.local, s); return nil })
	flag.Func("search-suffixes", `comma-separated DNS suffixes looked up on the control plane ("." for every name; default svc.cluster.local.)`,
		func(s string) error { f.suffixes = append(f.suffixes, strings.Split(s, ",")...); return nil })
	flag.Func("search-networks", "comma-separated CIDRs whose IP-literal authorities are looked up (default none; against Linkerd, the cluster's pod and service networks, as $LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS)",
		func(s string) error {
			for _, c := range strings.Split(s, ",") {
				p, err := netip.ParsePrefix(strings.TrimSpace(c))
				if err != nil {
					return err
				}
				f.networks = append(f.networks, p)
			}
			return nil
		})
	flag.DurationVar(&f.policyWait, "policy-wait", 0,
		"with -workload, how long a request may wait for the app port's first inbound policy before the default policy decides it (0: the library's default, "+
			authz.DefaultPolicyWait.String()+"; negative: never wait)")
	flag.DurationVar(&f.discoveryWait, "discovery-wait", 0,
		"how long a request may wait for its authority's first profile and policy before it takes a route (0: never; the first request takes the default route); an answer that cannot come (a control plane without the API, as Linkerd's destination controller alone for OutboundPolicies, or one that cannot be reached) ends the wait at once")
	flag.StringVar(&f.zone, "zone", "",
		"the zone this proxy runs in (a node's topology.kubernetes.io/zone): requests stay with the endpoints of this zone (their zone label) while its load is healthy and spill to other zones as it rises (empty: every endpoint alike)")
	flag.DurationVar(&f.controlKeepalive, "control-keepalive", destination.DefaultKeepalive,
		"ping a silent connection to the Destination, policy and Identity APIs after this long, so that a replica lost without a reset (its host gone, a frozen process) is left for the next live one (inmesh's control plane allows 10s; a gRPC-Go server such as Linkerd's by default no less than 5m; 0: never)")
	flag.BoolVar(&f.pprof, "pprof", false,
		"serve Go's profiles (net/http/pprof) at /debug/pprof/ on the metrics listener, to loopback clients only")
	f.identity.register(flag.CommandLine)
	f.registration.register(flag.CommandLine)
	f.trace.register(flag.CommandLine)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(f, log); err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}

// The environment of a Linkerd proxy that sets the default inbound policy
// (linkerd/app/src/env.rs).
const (
	envDefaultPolicy   = "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY"
	envClusterNetworks = "LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS"
)

// defaultInbound is the Server of -default-inbound-policy, or nil for the
// handler's own default (all-unauthenticated).
func defaultInbound(f flags) (*authz.Server, error) {
	if f.defaultPolicy == "" {
		return nil, nil
	}
	mode, err := authz.ParseMode(f.defaultPolicy)
	if err != nil {
		return nil, fmt.Errorf("-default-inbound-policy (or $%s): %w", envDefaultPolicy, err)
	}
	var opts authz.DefaultOptions
	for v := range strings.SplitSeq(f.clusterNetworks, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("-cluster-networks (or $%s): %w", envClusterNetworks, err)
		}
		opts.ClusterNetworks = append(opts.ClusterNetworks, p)
	}
	return authz.DefaultServer(mode, opts)
}

func run(f flags, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, f, log)
}

// runContext runs the proxy until ctx ends.
// checkControlAddr checks the address of a control-plane flag at start: a
// host:port, a comma-separated list of them, or a gRPC target
// (dns:///name:port); a URL or an address without a port is named with
// its flag, not left to the first request's failure.
func checkControlAddr(name, v string) error {
	switch {
	case v == "":
		return nil
	case strings.HasPrefix(v, "http://"), strings.HasPrefix(v, "https://"):
		return fmt.Errorf("-%s %q: a host:port (or a gRPC target such as dns:///name:port), not a URL", name, v)
	case strings.Contains(v, ":///"):
		return nil // a gRPC target
	}
	if _, err := cpaddr.Split(v); err != nil {
		return fmt.Errorf("-%s: %w", name, err)
	}
	return nil
}

func runContext(ctx context.Context, f flags, log *slog.Logger) error {
	if err := checkControlAddr("destination", f.destination); err != nil {
		return err
	}
	if err := checkControlAddr("policy", f.policyAddr); err != nil {
		return err
	}
	var defaultServer *authz.Server
	if f.workload != "" {
		if _, _, err := destination.ParseWorkload(f.workload); err != nil {
			return fmt.Errorf("-workload (or $%s): %w", destination.PolicyWorkloadEnv, err)
		}
		var err error
		if defaultServer, err = defaultInbound(f); err != nil {
			return err
		}
	}
	policy, err := backoff.FromEnv("INMESH_CONTROL", backoff.DefaultPolicy())
	if err != nil {
		return err
	}
	appURL, err := url.Parse("http://" + f.app)
	if err != nil {
		return fmt.Errorf("-app: %w", err)
	}
	metrics, err := telemetry.New(f.maxAuthorities)
	if err != nil {
		return err
	}
	// go_goroutines and the Go runtime's other families beside Linkerd's:
	// what a leak of connections or streams shows in first.
	metrics.Registry.MustRegister(collectors.NewGoCollector())
	provider := metrics.Provider
	defer provider.Shutdown(context.Background())

	tp, stopTracing, err := startTracing(ctx, f.trace)
	if err != nil {
		return err
	}
	defer stopTracing()

	f.identity.keepalive = f.controlKeepalive
	if f.controlKeepalive <= 0 {
		f.identity.keepalive = -1 // never
	}
	local, stopIdentity, err := startIdentity(ctx, f.identity, provider, log)
	if err != nil {
		return err
	}
	defer stopIdentity()

	dstOpts := []destination.Option{destination.WithBackoff(policy), destination.WithLogger(log),
		destination.WithContextToken(f.contextToken), destination.WithScheme(f.scheme),
		destination.WithWorkload(f.workload), destination.WithMaxWatches(f.maxWatches),
		destination.WithSearchNetworks(f.networks...), destination.WithKeepalive(f.controlKeepalive, 0)}
	if f.suffixes != nil {
		dstOpts = append(dstOpts, destination.WithSearchSuffixes(f.suffixes...))
	}
	dst, err := destination.Dial(f.destination, dstOpts...)
	if err != nil {
		return err
	}
	defer dst.Close()
	// The tap of both stacks, watched by the dashboard's route table on
	// the admin port (three allocations a request) and by whoever opens
	// /tap there.
	hub := tap.NewHub()
	opts := []mesh.Option{mesh.WithDestination(dst), mesh.WithMeterProvider(provider), mesh.WithLogger(log),
		mesh.WithIdleTimeout(f.idleTimeout), mesh.WithIdentity(local), mesh.WithTap(hub), mesh.WithTracerProvider(tp)}
	if f.maxAuthorities > 0 {
		opts = append(opts, mesh.WithMaxAuthorities(f.maxAuthorities))
	}
	clientOpts := append(mesh.ClientOptions(opts...),
		mesh.WithBalancerOptions(balancer.WithMeterProvider(provider), balancer.WithLocalZone(f.zone)), mesh.WithDiscoveryWait(f.discoveryWait))
	serverOpts := append(mesh.ServerOptions(opts...), mesh.WithLocalAuthorities(f.local...))
	regOpt, regConn, err := f.registration.option(local, f.identity.resolved(), f.destination)
	if err != nil {
		return err
	}
	if regConn != nil {
		defer regConn.Close()
		serverOpts = append(serverOpts, regOpt)
	}
	pol := dst
	if f.policyAddr != "" {
		pol, err = destination.Dial(f.policyAddr, dstOpts...)
		if err != nil {
			return fmt.Errorf("-policy: %w", err)
		}
		defer pol.Close()
		clientOpts = append(clientOpts, mesh.WithPolicies(pol.Policies()))
	}
	if f.workload != "" {
		// The inbound policy of the application's port, as a proxy in
		// the pod enforces it.
		appAddr, err := netip.ParseAddrPort(f.app)
		if err != nil {
			return fmt.Errorf("-workload needs -app as an IP address and port: %w", err)
		}
		// The port's watch starts now; requests wait for its first answer
		// up to -policy-wait.
		aopts := []authz.Option{authz.WithSource(pol.InboundPolicies()), authz.WithTarget(appAddr), authz.WithPolicyWait(f.policyWait)}
		if defaultServer != nil {
			aopts = append(aopts, authz.WithDefault(defaultServer))
		}
		if !f.trustLocalhost {
			aopts = append(aopts, authz.WithoutLocalhost())
		}
		serverOpts = append(serverOpts, mesh.WithInboundPolicy(aopts...))
	}

	client := mesh.NewClient(clientOpts...)
	defer client.Close()
	outLog, inLog := proxylog.New(log, "outbound"), proxylog.New(log, "inbound")
	outbound := origproto.NewServer(fullDuplex(outboundProxy(client, outLog)))
	outbound.ErrorLog = outLog.ErrorLog()

	toApp, closeApp := appTransport(f.appIdleTimeout)
	defer closeApp()
	// The application's requests carry the inbound span's trace context.
	inboundStack := mesh.NewServer(inboundProxy(appURL, mesh.TraceTransport(toApp), inLog), serverOpts...)
	defer inboundStack.Close()
	inbound := origproto.NewServer(fullDuplex(inboundStack))
	inbound.ErrorLog = inLog.ErrorLog()

	admin := http.NewServeMux()
	admin.Handle("/metrics", metrics.Handler)
	if f.pprof {
		admin.Handle("/debug/pprof/", loopbackOnly(http.HandlerFunc(pprof.Index)))
		admin.Handle("/debug/pprof/profile", loopbackOnly(http.HandlerFunc(pprof.Profile)))
		admin.Handle("/debug/pprof/trace", loopbackOnly(http.HandlerFunc(pprof.Trace)))
	}
	// /routes explains the routing of a request through the outbound
	// stack's router (ServiceProfiles and outbound policies).
	outboundRoutes := client.Router().ExplainHandler()
	admin.Handle("/routes", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("direction") == "inbound" {
			explainInbound(w, r, inboundStack, f.app)
			return
		}
		outboundRoutes.ServeHTTP(w, r)
	}))
	if b := client.Balancer(); b != nil {
		admin.Handle("/endpoints", b.EndpointsHandler()) // ?authority=host:port: each endpoint's state as JSON
	}
	// The dashboard and the tap answer loopback clients only.
	dash := dashboard.New(hub, dashboard.WithBalancer(client.Balancer()), dashboard.WithIdentity(local),
		dashboard.WithDestination(dst, f.destination), dashboard.WithName("proxy, app "+f.app))
	defer dash.Close()
	admin.Handle("/dashboard/", http.StripPrefix("/dashboard", dash))
	admin.Handle("/tap", dash) // ?authority=&path=&method=&status=&route=&direction=: one JSON event per line
	admin.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		if local != nil && local.Certificate() == nil {
			http.Error(w, "not ready: no identity certificate yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	metricsSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}

	servers := []struct {
		name, addr string
		srv        *http.Server
	}{{"outbound", f.outbound, outbound}, {"inbound", f.inbound, inbound}, {"metrics", f.metrics, metricsSrv}}
	errs := make(chan error, len(servers))
	var wg sync.WaitGroup
	for _, s := range servers {
		lis, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("-%s: %w", s.name, err)
		}
		// Each guarded (ambiguous HTTP/1 framing is refused); the
		// proxy's two listeners count their connections (tcp_*).
		switch s.name {
		case "inbound":
			lis = inboundStack.Listener(lis) // meshed mTLS beside plaintext with an identity
		case "outbound":
			lis = client.Listener(lis)
		default:
			lis = origproto.GuardListener(lis)
		}
		log.Info("listening", "listener", s.name, "addr", lis.Addr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("%s: %w", s.name, err)
			}
		}()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-errs:
		return err
	}
	// The registered endpoints go first, so that peers stop sending
	// before the listener closes (for up to deregisterTimeout); then
	// in-flight requests drain for up to drainTimeout; then every
	// connection is closed, and a watchdog bounds the rest of the exit.
	exitBy := time.AfterFunc(deregisterTimeout+drainTimeout+time.Second, func() {
		log.Error("shutdown took too long; exiting")
		os.Exit(1)
	})
	defer exitBy.Stop()
	if regConn != nil {
		dctx, dcancel := context.WithTimeout(context.Background(), deregisterTimeout)
		if err := inboundStack.Drain(dctx); err != nil {
			log.Warn("deregistration unconfirmed at its deadline", "err", err)
		} else {
			log.Info("deregistered; draining")
		}
		dcancel()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	var drain sync.WaitGroup
	for _, s := range servers {
		drain.Add(1)
		go func() {
			defer drain.Done()
			if err := s.srv.Shutdown(shutdownCtx); err != nil {
				log.Warn("requests still in flight at the drain deadline; closing", "listener", s.name)
				_ = s.srv.Close()
			}
		}()
	}
	drain.Wait()
	wg.Wait()
	return nil
}

// drainTimeout bounds how long in-flight requests may finish after SIGTERM;
// with the watchdog's second the proxy exits within 5s (7s with -register,
// whose deregistration and drain delay come first, within deregisterTimeout).
const (
	drainTimeout      = 4 * time.Second
	deregisterTimeout = 2 * time.Second
)

// fullDuplex serves the HTTP/1 requests of h full duplex, so that a
// response (a route timeout's 504, a stream) can go out while the request
// body still arrives: Go's HTTP/1 server otherwise reads the whole body
// before it writes a response. HTTP/2 needs nothing (ErrNotSupported).
func fullDuplex(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 || r.Header.Get("Upgrade") != "" || http.NewResponseController(w).EnableFullDuplex() != nil {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
		// The response goes out, then the body is closed (which waits for
		// what is left of it): closing it before the server does keeps the
		// server from reading the next request while it still reads this
		// body (golang/go#68560).
		_ = http.NewResponseController(w).Flush()
		r.Body.Close()
	})
}

// defaultAppIdleTimeout is how long an idle connection to the application
// is kept: Linkerd's proxy closes the idle HTTP/1 connections of its
// inbound pool after 3s (DEFAULT_INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT
// in linkerd2-proxy's app/src/env.rs). A burst of concurrent requests, an
// HTTP/2 flood at -inbound among them, opens a connection to the
// application per request in flight; up to 64 of them then wait in the
// pool, two goroutines each, and the transport's 90s default would keep
// them that long.
const defaultAppIdleTimeout = 3 * time.Second

// appTransport returns the transport of the inbound proxy to the
// application, and a function that closes its idle connections: HTTP/1
// requests reach the application over HTTP/1, those that came as HTTP/2
// (gRPC among them) over HTTP/2 with prior knowledge, as they came. An
// idle connection is closed after idle (defaultAppIdleTimeout when <= 0);
// at most transport.DefaultMaxIdleConnsPerHost wait in the pool.
func appTransport(idle time.Duration) (http.RoundTripper, func()) {
	if idle <= 0 {
		idle = defaultAppIdleTimeout
	}
	l := transport.Limits{IdleConnTimeout: idle}
	h1, h2 := transport.HTTP1(l), transport.H2(l)
	return origproto.NewTransport(origproto.WithHTTP1(h1), origproto.WithH2(h2)), func() {
		h1.CloseIdleConnections()
		h2.CloseIdleConnections()
	}
}

// forwardTrailers sends the request's trailers upstream: ReverseProxy's
// outgoing request holds a copy of the trailer map taken before the body
// was read, whose values stay empty; the incoming map is filled in as the
// body ends.
func forwardTrailers(pr *httputil.ProxyRequest) { pr.Out.Trailer = pr.In.Trailer }

// loopbackOnly answers 403 to a client that is not on a loopback address.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "forbidden: loopback clients only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
