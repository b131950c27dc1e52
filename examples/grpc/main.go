// Command grpc runs a grpc-go client and server in the mesh, in one process
// on loopback: an embedded control plane (Destination, OutboundPolicies,
// InboundServerPolicies and the Identity issuer) serving the interop
// Service, GRPCRoutes and inbound policy shipped beside this file; two
// instances of grpc-go's interop TestService behind meshgrpc.ServerOptions
// (mTLS with certificates from the issuer, and the policy that admits only
// the client's identity, from the InboundServerPolicies API); and a client
// channel made with meshgrpc.DialOptions sending them unary calls (some
// failing once with UNAVAILABLE, retried by the route), slow calls the
// route's 200ms timeout ends, and bidirectional streams. It then prints the
// gRPC routes' table as `linkerd viz stat-outbound` does, and what each
// server saw of its callers, checks that the mesh behaved as the routes
// say, and exits non-zero naming what did not.
//
//	go run ./examples/grpc              # 300 unary calls
//	go run ./examples/grpc -calls 2000 -quiet
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/authz"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/meshgrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

//go:embed interop.yaml
var interopManifests []byte

// authority is the interop Service's name and port, which the client dials
// as inmesh:///authority.
const authority = "interop.default.svc.cluster.local:10000"

type options struct {
	calls int  // unary calls
	quiet bool // only the table, the server view and the verdict
	// manifests replaces interop.yaml when not nil.
	manifests []byte
}

func main() {
	var o options
	flag.IntVar(&o.calls, "calls", 300, "unary calls to send (every fifth fails once and is retried)")
	flag.BoolVar(&o.quiet, "quiet", false, "print only the tables and the verdict")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
}

// The shape of the load besides the unary calls.
const (
	slowCalls   = 8 // calls of the slow method, all at once
	streams     = 4 // bidirectional streams
	streamMsgs  = 5 // messages each way on each stream
	workers     = 4 // concurrent unary callers
	flakyEvery  = 5 // every fifth unary call fails once
	callTimeout = 10 * time.Second
)

func run(o options, out io.Writer) (err error) {
	if o.calls < 1 {
		return fmt.Errorf("-calls %d: must be at least 1", o.calls)
	}
	info := out
	if o.quiet {
		info = io.Discard
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	// The control plane: the Service, GRPCRoutes and inbound policy of
	// interop.yaml (and the instances' Pods) on the Destination,
	// OutboundPolicies and InboundServerPolicies APIs.
	store := controlplane.NewStore()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	cp := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(log)).Register(cp)
	cpDone := make(chan struct{})
	go func() { defer close(cpDone); _ = cp.Serve(lis) }()
	defer func() { cp.Stop(); <-cpDone }()

	// The identity plane: each workload gets its certificate from the
	// embedded issuer over Linkerd's Identity API, with its token.
	ids, err := startIdentities(log)
	if err != nil {
		return err
	}
	defer ids.Stop()
	ctx := context.Background()
	serverLocal, err := ids.Certify(ctx, serverID, "interop-token")
	if err != nil {
		return err
	}
	clientLocal, err := ids.Certify(ctx, clientID, "web-token")
	if err != nil {
		return err
	}

	// Two instances of the interop service, meshed: each terminates mTLS
	// with its identity and enforces the inbound policy of its Pod's port
	// from the InboundServerPolicies API.
	f := &flaky{failed: make(map[string]bool)}
	var instances []*instance
	var eps []endpoint.Endpoint
	manifests := interopManifests
	if o.manifests != nil {
		manifests = o.manifests
	}
	manifests = append(append([]byte(nil), manifests...), '\n')
	for i := range 2 {
		name := "interop-" + strconv.Itoa(i)
		policies, err := destination.Dial(lis.Addr().String(), destination.WithLogger(log), destination.WithWorkload("default:"+name))
		if err != nil {
			return err
		}
		defer policies.Close()
		s, stop, err := startInstance(name, f, meshgrpc.WithIdentity(serverLocal), meshgrpc.WithLogger(log),
			meshgrpc.WithInboundPolicy(authz.WithSource(policies.InboundPolicies()), authz.WithoutLocalhost()))
		if err != nil {
			return err
		}
		defer stop()
		instances = append(instances, s)
		eps = append(eps, endpoint.Endpoint{Addr: s.addr, Identity: serverID, Labels: map[string]string{"pod": name}})
		manifests = fmt.Appendf(manifests, podManifest, name, s.addr.Port())
	}
	resources, err := manifest.Parse(manifests)
	if err != nil {
		return fmt.Errorf("interop.yaml: %w", err)
	}
	store.SetManifests(resources)
	store.PutEndpoints(authority, eps)
	fmt.Fprintf(info, "control plane on %s, identity on %s, interop instances on %s and %s\n",
		lis.Addr(), ids.Addr(), instances[0].addr, instances[1].addr)
	for _, s := range instances {
		if err := refusesPlaintext(s.addr); err != nil {
			return err
		}
	}
	fmt.Fprintf(info, "inbound policy in force: a plaintext call to either instance is refused PERMISSION_DENIED\n")

	// The client.
	dst, err := destination.Dial(lis.Addr().String(), destination.WithLogger(log))
	if err != nil {
		return err
	}
	defer dst.Close()
	cc, err := grpc.NewClient("inmesh:///"+authority,
		meshgrpc.DialOptions(dst, meshgrpc.WithIdentity(clientLocal), meshgrpc.WithMeterProvider(mp), meshgrpc.WithLogger(log))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	c := testgrpc.NewTestServiceClient(cc)
	if err := waitForRoutes(c, reader); err != nil {
		return err
	}

	start := time.Now()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results = map[string]map[codes.Code]int{}
		slowest time.Duration
		fastest = callTimeout
	)
	note := func(method string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if results[method] == nil {
			results[method] = map[codes.Code]int{}
		}
		results[method][status.Code(err)]++
	}
	// The slow calls, all at once: the route's timeout ends each after
	// 200ms with DEADLINE_EXCEEDED, long before the caller's own deadline.
	for range slowCalls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			began := time.Now()
			s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{
				ResponseParameters: []*testgrpc.ResponseParameters{{Size: 10}}})
			if err == nil {
				_, err = s.Recv()
			}
			if ctx.Err() != nil {
				err = fmt.Errorf("the caller's own deadline ended it: %w", err)
			}
			note("StreamingOutputCall", err)
			mu.Lock()
			slowest, fastest = max(slowest, time.Since(began)), min(fastest, time.Since(began))
			mu.Unlock()
		})
	}
	// The streams: messages echoed both ways.
	for range streams {
		wg.Go(func() { note("FullDuplexCall", stream(c)) })
	}
	// The unary calls.
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				if i%flakyEvery == 0 {
					ctx = metadata.AppendToOutgoingContext(ctx, flakyKey, strconv.Itoa(i))
				}
				_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: 64})
				cancel()
				note("UnaryCall", err)
			}
		})
	}
	for i := range o.calls {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return err
	}
	routes := outbound(rm)
	fmt.Fprintf(info, "%d unary calls, %d slow calls, %d streams in %v; the slow calls ended after %v to %v\n",
		o.calls, slowCalls, streams, elapsed.Round(time.Millisecond), fastest.Round(time.Millisecond), slowest.Round(time.Millisecond))
	fmt.Fprintf(info, "(latencies are interpolated in the families' buckets, as histogram_quantile does: the route's are Linkerd's 50ms, 500ms, 1s, 10s)\n\n")
	fmt.Fprintf(out, "outbound gRPC routes of %s (client %s)\n", authority, clientLocal.Name())
	printOutbound(out, routes, elapsed)
	fmt.Fprintf(out, "\nserver view (callers by the identity their mTLS certificate proves)\n")
	fmt.Fprintf(out, "%-10s %-21s %6s %12s  %s\n", "INSTANCE", "ADDRESS", "CALLS", "UNAVAILABLE", "CALLERS")
	for _, s := range instances {
		callers, calls, failed := s.view()
		fmt.Fprintf(out, "%-10s %-21s %6d %12d  %s\n", s.name, s.addr, calls, failed, strings.Join(callers, ", "))
	}

	if err := check(o, results, routes, instances); err != nil {
		fmt.Fprintln(out, "\nFAILED:", err)
		return err
	}
	fmt.Fprintf(out, "\nOK: every unary call succeeded (%d retried once), every slow call ended DEADLINE_EXCEEDED by the route's timeout, every stream echoed its messages, all over mTLS, and the servers refused plaintext\n",
		(o.calls+flakyEvery-1)/flakyEvery)
	return nil
}

// podManifest is the Pod of an instance (name, port), which the Server of
// interop.yaml selects.
const podManifest = `---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, labels: {app: interop}}
spec:
  containers:
  - name: interop
    ports: [{name: grpc, containerPort: %d}]
`

// refusesPlaintext calls addr in plaintext (StreamingInputCall, which the
// instances do not count) until the inbound policy refuses it.
func refusesPlaintext(addr netip.AddrPort) error {
	cc, err := grpc.NewClient("passthrough:///"+addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := testgrpc.NewTestServiceClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.StreamingInputCall(ctx)
		if err == nil {
			_, err = s.CloseAndRecv()
		}
		cancel()
		if status.Code(err) == codes.PermissionDenied {
			return nil
		}
		last = err
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s: the inbound policy of interop.yaml never refused a plaintext call (last: %v)", addr, last)
}

// stream sends streamMsgs messages on a bidirectional stream and checks
// that each comes back.
func stream(c testgrpc.TestServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	s, err := c.FullDuplexCall(ctx)
	if err != nil {
		return err
	}
	for i := range streamMsgs {
		if err := s.Send(&testgrpc.StreamingOutputCallRequest{
			ResponseParameters: []*testgrpc.ResponseParameters{{Size: int32(i + 1)}}}); err != nil {
			return err
		}
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		if got := len(resp.GetPayload().GetBody()); got != i+1 {
			return status.Errorf(codes.DataLoss, "message %d: %d bytes back, want %d", i, got, i+1)
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); err != io.EOF {
		return fmt.Errorf("the stream did not end cleanly: %w", err)
	}
	return nil
}

// waitForRoutes calls EmptyCall until the client routes it by the
// interop-unary GRPCRoute (its series appear).
func waitForRoutes(c testgrpc.TestServiceClient, reader sdkmetric.Reader) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = c.EmptyCall(ctx, &testgrpc.Empty{})
		cancel()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			return err
		}
		if r := outbound(rm)["interop-unary"]; r != nil && r.requests > 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the client never routed by the GRPCRoutes of interop.yaml")
}

// check says what did not behave as the routes and the mesh promise.
func check(o options, results map[string]map[codes.Code]int, routes map[string]*routeStats, instances []*instance) error {
	var problems []string
	expect := func(method string, code codes.Code, n int) {
		if got := results[method][code]; got != n {
			problems = append(problems, fmt.Sprintf("%s: %d of %d calls ended %v, want all (results %v)", method, got, n, code, results[method]))
		}
	}
	expect("UnaryCall", codes.OK, o.calls)
	expect("StreamingOutputCall", codes.DeadlineExceeded, slowCalls)
	expect("FullDuplexCall", codes.OK, streams)
	flakies := float64((o.calls + flakyEvery - 1) / flakyEvery)
	if r := routes["interop-unary"]; r == nil || r.retries != flakies {
		problems = append(problems, fmt.Sprintf("interop-unary: want %v retries (one per flaky call), the series say %v", flakies, describe(r)))
	}
	if r := routes["interop-slow"]; r == nil || r.timeouts != slowCalls {
		problems = append(problems, fmt.Sprintf("interop-slow: want %d timeouts, the series say %v", slowCalls, describe(r)))
	}
	if r := routes["interop-stream"]; r == nil || r.success != streams {
		problems = append(problems, fmt.Sprintf("interop-stream: want %d successful streams, the series say %v", streams, describe(r)))
	}
	for _, s := range instances {
		if !s.onlyCaller(clientID) {
			callers, _, _ := s.view()
			problems = append(problems, fmt.Sprintf("%s: want calls from %s only, over mTLS; saw %v", s.name, clientID, callers))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// describe tells what the series say of a route.
func describe(r *routeStats) string {
	if r == nil {
		return "no calls on the route"
	}
	return fmt.Sprintf("%v calls, %v successful, %v timed out, %v retries", r.requests, r.success, r.timeouts, r.retries)
}
